//! Loading a tool's object into the kernel and attaching its programs:
//! what set-up learns once per run ([`Kernel`]), how an object is loaded
//! ([`Load`]), tracepoint and kernel-function attaching, and the
//! counters and table sizes every object shares.

use std::{collections::HashMap, path::PathBuf};

use anyhow::Context as _;
use aya::{
    Ebpf,
    maps::PerCpuArray,
    programs::{BtfTracePoint, FEntry, FExit, KProbe, RawTracePoint, TracePoint},
};
use rtrace_common::{
    events::TALLIES,
    names::{CONFIG, ERRORS, STARTS},
};

use crate::kernel::{
    btf::{AttachTarget, Btf},
    features::{self, Features, Mechanism},
    objects,
};

/// How to load a tool's object: the variant, globals and map sizes.
#[derive(Debug, Default)]
pub struct Load {
    variant: &'static str,
    globals: Vec<(&'static str, Vec<u8>)>,
    sizes: Vec<(&'static str, u32)>,
    unsupported_maps: bool,
    pins: Vec<(&'static str, PathBuf)>,
    /// What to say where the kernel will not create a map, by map.
    hints: Vec<(&'static str, String)>,
}

impl Load {
    /// A load of object variant `variant` (`""` for the plain object),
    /// with no globals or sizes set yet.
    pub fn new(variant: &'static str) -> Self {
        Self {
            variant,
            ..Self::default()
        }
    }

    /// The object variant being tried (`""` for the plain object).
    pub fn variant(&self) -> &'static str {
        self.variant
    }

    /// Sets global `name` to `value` (its size must match the object's).
    pub fn global<T: aya::Pod>(&mut self, name: &'static str, value: &T) -> &mut Self {
        // SAFETY: `T` is plain old data, so its bytes may be read.
        let bytes =
            unsafe { std::slice::from_raw_parts((value as *const T).cast::<u8>(), size_of::<T>()) };
        self.globals.retain(|(n, _)| *n != name);
        self.globals.push((name, bytes.to_vec()));
        self
    }

    /// Sets the global [`CONFIG`], which every configurable object has.
    pub fn config<T: aya::Pod>(&mut self, value: &T) -> &mut Self {
        self.global(CONFIG, value)
    }

    /// Sizes map `name` to `entries`.
    pub fn size(&mut self, name: &'static str, entries: u32) -> &mut Self {
        self.sizes.retain(|(n, _)| *n != name);
        self.sizes.push((name, entries));
        self
    }

    /// Says `hint` (what sized map `name`, and the cure) where the kernel
    /// will not create it: the error alone names a map the user never
    /// sized by that name.
    pub fn hint(&mut self, name: &'static str, hint: String) -> &mut Self {
        self.hints.retain(|(n, _)| *n != name);
        self.hints.push((name, hint));
        self
    }

    /// Uses the map pinned at `path` for the object's map `name`.
    pub fn pinned(&mut self, name: &'static str, path: PathBuf) -> &mut Self {
        self.pins.retain(|(n, _)| *n != name);
        self.pins.push((name, path));
        self
    }

    /// Lets the object hold maps aya has no user-space type for, which
    /// only the programs use (such as task storage).
    pub fn allow_unsupported_maps(&mut self) -> &mut Self {
        self.unsupported_maps = true;
        self
    }

    /// Loads object `name` (with its variant's suffix) as configured.
    pub fn load(&self, name: &str) -> anyhow::Result<Ebpf> {
        let object =
            objects::get(name).with_context(|| format!("no eBPF object {name} in this build"))?;
        let mut loader = features::loader();
        if self.unsupported_maps {
            loader.allow_unsupported_maps();
        }
        for (n, bytes) in &self.globals {
            loader.override_global(n, bytes.as_slice(), true);
        }
        for (n, entries) in &self.sizes {
            loader.map_max_entries(n, *entries);
        }
        for (n, path) in &self.pins {
            loader.map_pin_path(n, path.as_path());
        }
        // Flattened: aya's error both prints its cause and names it as
        // its source, so anyhow's chain would say the cause twice.
        loader
            .load(object)
            .map_err(|e| {
                let hint = match &e {
                    aya::EbpfError::MapError(aya::maps::MapError::CreateError { name, .. }) => self
                        .hints
                        .iter()
                        .find(|(n, _)| n == name)
                        .map(|(_, h)| format!(" ({h})")),
                    _ => None,
                };
                anyhow::anyhow!("{}{}", features::chain(&e), hint.unwrap_or_default())
            })
            .with_context(|| format!("cannot load the {name} programs"))
    }
}

/// What set-up learns once per run, each only when first asked for: the
/// mechanisms the kernel offers, its BTF, the type ids aya attaches by,
/// and the symbols of the files uprobes go into. All of it is dropped once
/// the tool is attached.
#[derive(Default)]
pub struct Kernel {
    features: Features,
    btf: Option<Result<Btf, String>>,
    /// The attach-id BTF made so far, and the highest id it covers.
    attach_ids: Option<(u32, aya::Btf)>,
    symbols: HashMap<PathBuf, Option<HashMap<String, u64>>>,
    /// `/proc/kallsyms`, read once however many probes look in it.
    kallsyms: Option<String>,
}

/// A text symbol of `/proc/kallsyms` (kind t or T): its address as
/// written (all zeros where kptr_restrict hides it), its name, and whether
/// a module holds it (listed with the module after the name).
struct TextSymbol<'a> {
    addr: &'a str,
    name: &'a str,
    in_module: bool,
}

/// The text symbols of `kallsyms`, in its order.
fn text_symbols(kallsyms: &str) -> impl Iterator<Item = TextSymbol<'_>> {
    kallsyms.lines().filter_map(|l| {
        let mut f = l.split_whitespace();
        let (addr, kind, name) = (f.next()?, f.next()?, f.next()?);
        matches!(kind, "t" | "T").then(|| TextSymbol {
            addr,
            name,
            in_module: f.next().is_some(),
        })
    })
}

impl Kernel {
    /// `/proc/kallsyms`, read the first time it is asked for (empty if it
    /// cannot be read).
    fn kallsyms(&mut self) -> &str {
        self.kallsyms
            .get_or_insert_with(|| std::fs::read_to_string("/proc/kallsyms").unwrap_or_default())
    }

    /// The kernel function a probe on `func` goes to: `func` itself, or,
    /// where the kernel renamed it for allocation profiling (6.10+:
    /// `__kmalloc` became `__kmalloc_noprof`), its `_noprof` twin, so that
    /// the command lines written for older kernels keep working. Fails
    /// with a clear line when neither is in `/proc/kallsyms`.
    pub fn function(&mut self, func: &str) -> anyhow::Result<String> {
        let syms = self.kallsyms();
        let twin = format!("{func}_noprof");
        let (mut own, mut renamed) = (false, false);
        for line in syms.lines() {
            let Some(name) = line.split_whitespace().nth(2) else {
                continue;
            };
            own |= name == func;
            renamed |= name == twin;
        }
        match (own, renamed) {
            (true, _) => Ok(func.to_owned()),
            (false, true) => Ok(twin),
            // Without symbols to read (kptr_restrict), let the attach say.
            _ if syms.is_empty() => Ok(func.to_owned()),
            _ => anyhow::bail!("no kernel function '{func}' (it is not in /proc/kallsyms)"),
        }
    }

    /// The kernel's text symbols (`/proc/kallsyms`' t and T) whose names
    /// `keep` admits, sorted and each once: the functions kprobes can be
    /// asked for (the kernel refuses its blacklisted ones at attach).
    pub fn functions_where(&mut self, keep: impl Fn(&str) -> bool) -> Vec<String> {
        let syms = self.kallsyms();
        let mut out: Vec<String> = text_symbols(syms)
            .filter(|s| keep(s.name))
            .map(|s| s.name.to_owned())
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// The span of the core kernel's text from the first of the functions
    /// `names` to the end of the last (where the next symbol begins), or
    /// `None` if kallsyms names none of them (or hides addresses). A name
    /// the kernel gives to more than one function is passed over: it
    /// could widen the span to code that is not meant.
    pub fn text_span(&mut self, names: &[&str]) -> Option<(u64, u64)> {
        let syms = self.kallsyms();
        let core = || {
            text_symbols(syms)
                .filter(|s| !s.in_module)
                .filter_map(|s| Some((u64::from_str_radix(s.addr, 16).ok()?, s.name)))
        };
        // Each name's address and how many functions bear it.
        let mut found = vec![(0u64, 0u32); names.len()];
        for (addr, name) in core() {
            if let Some(i) = names.iter().position(|n| *n == name) {
                found[i] = (addr, found[i].1 + 1);
            }
        }
        let unique = || found.iter().filter(|f| f.1 == 1).map(|f| f.0);
        let (start, last) = (unique().min()?, unique().max()?);
        let end = core().map(|s| s.0).filter(|&a| a > last).min()?;
        (start != 0).then_some((start, end))
    }

    /// Whether mechanism `m` works here; the error says why not.
    pub fn check(&mut self, m: Mechanism) -> Result<(), String> {
        if m == Mechanism::TaskMemory {
            return crate::kernel::procmem::self_check();
        }
        // The probes of BTF-attached mechanisms attach to these.
        let target = match m {
            Mechanism::TpBtf => Some(AttachTarget::Tracepoint("sched_switch")),
            Mechanism::Fentry | Mechanism::Fexit => Some(AttachTarget::Function("vfs_read")),
            _ => None,
        };
        let prepared = match target {
            Some(t) if !self.features.probed(m) => {
                self.attach_ids(t).map(drop).map_err(|e| format!("{e:#}"))
            }
            _ => Ok(()),
        };
        let Self {
            features,
            attach_ids,
            ..
        } = self;
        let ids = prepared.and_then(|()| {
            attach_ids
                .as_ref()
                .map(|(_, b)| b)
                .ok_or_else(|| "kernel type ids not read".to_owned())
        });
        features.check(m, ids)
    }

    /// The running kernel's BTF, read on first use.
    pub fn btf(&mut self) -> anyhow::Result<&Btf> {
        self.btf
            .get_or_insert_with(|| Btf::from_kernel().map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|e| anyhow::anyhow!("{e}"))
    }

    /// The function symbols of `file` by file offset, read once; `None`
    /// where they cannot be read (attaching then says why).
    pub fn symbols(&mut self, file: &std::path::Path) -> Option<&HashMap<String, u64>> {
        self.symbols
            .entry(file.to_path_buf())
            .or_insert_with(|| crate::kernel::elf::symbol_offsets(file).ok())
            .as_ref()
    }

    /// The kernel's type ids in the form aya's tp_btf, fentry and fexit
    /// loads take them ([`Btf::attach_ids`]), covering `target`.
    pub fn attach_ids(&mut self, target: AttachTarget<'_>) -> anyhow::Result<&aya::Btf> {
        let btf = self.btf()?;
        let id = btf.attach_id(target).with_context(|| match target {
            // aya attaches fentry by vmlinux's type ids only.
            AttachTarget::Function(f) => format!(
                "no function {f} in the kernel's own BTF (a module's functions, \
                 whose BTF is the module's, take kprobes)"
            ),
            AttachTarget::Tracepoint(e) => format!("no tracepoint {e} in the kernel's BTF"),
        })?;
        if self.attach_ids.as_ref().is_none_or(|(upto, _)| *upto < id) {
            let btf = self.btf()?;
            let ids = btf.attach_ids(id)?;
            self.attach_ids = Some((id, ids));
        }
        Ok(&self.attach_ids.as_ref().expect("set above").1)
    }
}

/// Attaches a tool's programs to tracepoints with one mechanism of
/// [`TRACEPOINT_CHAIN`].
pub struct Hooks<'a> {
    mech: Mechanism,
    kernel: &'a mut Kernel,
}

/// The name prefix of the programs written for tracepoint mechanism
/// `mech`, by convention: `btf_`, `raw_` or `tp_` before the event's name.
pub fn hook_prefix(mech: Mechanism) -> &'static str {
    match mech {
        Mechanism::TpBtf => "btf",
        Mechanism::RawTracepoint => "raw",
        _ => "tp",
    }
}

impl<'a> Hooks<'a> {
    /// Prepares to attach with `mech`; tp_btf takes the kernel's type ids
    /// from `kernel`.
    pub fn new(mech: Mechanism, kernel: &'a mut Kernel) -> anyhow::Result<Self> {
        Ok(Self { mech, kernel })
    }

    /// The name prefix of the programs written for this mechanism, by
    /// convention: `btf_`, `raw_` or `tp_` before the event's name.
    pub fn prefix(&self) -> &'static str {
        hook_prefix(self.mech)
    }

    /// Loads program `name` of `ebpf` and attaches it to tracepoint
    /// `category:event`.
    pub fn attach(
        &mut self,
        ebpf: &mut Ebpf,
        name: &str,
        category: &str,
        event: &str,
    ) -> anyhow::Result<()> {
        let attached = (|| {
            let prog = ebpf
                .program_mut(name)
                .with_context(|| format!("program {name} missing from the object"))?;
            match self.mech {
                Mechanism::TpBtf => {
                    let btf = self.kernel.attach_ids(AttachTarget::Tracepoint(event))?;
                    let p: &mut BtfTracePoint = prog.try_into()?;
                    // It may have been loaded beside others already.
                    if p.fd().is_err() {
                        p.load(event, btf)?;
                    }
                    p.attach()?;
                }
                Mechanism::RawTracepoint => {
                    let p: &mut RawTracePoint = prog.try_into()?;
                    if p.fd().is_err() {
                        p.load()?;
                    }
                    p.attach(event)?;
                }
                Mechanism::Tracepoint => {
                    // aya finds tracefs but does not mount it.
                    crate::kernel::tracefs::root()?;
                    // One program may serve several tracepoints.
                    let p: &mut TracePoint = prog.try_into()?;
                    if p.fd().is_err() {
                        p.load()?;
                    }
                    p.attach(category, event)?;
                }
                m => anyhow::bail!("{m} cannot attach to tracepoints"),
            }
            anyhow::Ok(())
        })();
        attached.with_context(|| format!("cannot attach {name} to {category}:{event}"))
    }

    /// Attaches as [`Hooks::attach`] a tracepoint that some kernels lack:
    /// `Ok(false)` where the running kernel has no `category:event` (a
    /// renamed or merged event), an error only where one it has could not
    /// be attached, which is never passed over in silence.
    pub fn attach_if_present(
        &mut self,
        ebpf: &mut Ebpf,
        name: &str,
        category: &str,
        event: &str,
    ) -> anyhow::Result<bool> {
        if crate::kernel::tracefs::has_event(category, event) == Some(false) {
            return Ok(false);
        }
        self.attach(ebpf, name, category, event).map(|()| true)
    }

    /// Attaches the conventionally named program for `category:event`.
    pub fn attach_event(
        &mut self,
        ebpf: &mut Ebpf,
        category: &str,
        event: &str,
    ) -> anyhow::Result<()> {
        let name = format!("{}_{event}", self.prefix());
        self.attach(ebpf, &name, category, event)
    }
}

/// Loads programs `names` of `ebpf` at once, each on a thread of its own,
/// leaving them to be attached by their usual paths (which load a
/// program only if it is not loaded yet). The kernel verifies a program
/// within its load call, on the caller's CPU: a walk's hundred
/// milliseconds or more then go by beside the other programs' time,
/// rather than before or after it. A name comes with its tracepoint for
/// a tp_btf program, loaded against `btf` (the kernel's type ids,
/// [`Kernel::attach_ids`]); raw tracepoint and perf event programs need
/// none, and other kinds are not loaded here. A program that fails is
/// left unloaded, for its own path to load again and report.
pub fn load_beside(ebpf: &mut Ebpf, names: &[(String, Option<&str>)], btf: Option<&aya::Btf>) {
    use aya::programs::{PerfEvent, Program};
    let mut progs: Vec<(Option<&str>, &mut Program)> = ebpf
        .programs_mut()
        .filter(|(_, p)| p.fd().is_err())
        .filter_map(|(name, p)| {
            let (_, event) = names.iter().find(|(n, _)| n == name)?;
            Some((*event, p))
        })
        .collect();
    if progs.len() < 2 {
        // One alone goes by its own path: no thread needed.
        return;
    }
    // Failures are left to each program's own path: the results go.
    std::thread::scope(|scope| {
        for (event, prog) in &mut progs {
            let event = *event;
            scope.spawn(move || {
                let _ = match (&mut **prog, event, btf) {
                    (Program::RawTracePoint(p), None, _) => RawTracePoint::load(p),
                    (Program::PerfEvent(p), None, _) => PerfEvent::load(p),
                    (Program::BtfTracePoint(p), Some(e), Some(btf)) => p.load(e, btf),
                    _ => Ok(()),
                };
            });
        }
    });
}

/// Loads program `name` of `ebpf` and attaches it to kernel function
/// `func` with `mech` (fentry, fexit, kprobe or kretprobe). A kprobe
/// program may be attached to several functions; it is loaded once.
pub fn attach_kernel_fn(
    ebpf: &mut Ebpf,
    kernel: &mut Kernel,
    name: &str,
    mech: Mechanism,
    func: &str,
) -> anyhow::Result<()> {
    let attached = (|| {
        let prog = ebpf
            .program_mut(name)
            .with_context(|| format!("program {name} missing from the object"))?;
        match mech {
            Mechanism::Fentry => {
                let btf = kernel.attach_ids(AttachTarget::Function(func))?;
                let p: &mut FEntry = prog.try_into()?;
                p.load(func, btf)?;
                p.attach()?;
            }
            Mechanism::Fexit => {
                let btf = kernel.attach_ids(AttachTarget::Function(func))?;
                let p: &mut FExit = prog.try_into()?;
                p.load(func, btf)?;
                p.attach()?;
            }
            Mechanism::Kprobe | Mechanism::Kretprobe => {
                let p: &mut KProbe = prog.try_into()?;
                if p.fd().is_err() {
                    p.load()?;
                }
                p.attach(func, 0)?;
            }
            m => anyhow::bail!("{m} cannot attach to kernel functions"),
        }
        anyhow::Ok(())
    })();
    attached.with_context(|| format!("cannot attach {name} to {func} with {mech}"))
}

/// The object's [`ERRORS`] per-CPU counters, summed over CPUs.
pub fn read_errors(ebpf: &Ebpf, slots: usize) -> anyhow::Result<Vec<u64>> {
    per_cpu_sums(ebpf, ERRORS, slots)
}

/// Runs of each loaded program that the kernel skipped, by program: an
/// event that comes while a program runs on that CPU (an interrupt's
/// I/O completion during a completion of another request's, say) does
/// not run one that would nest, and the kernel only counts it
/// (`recursion_misses` in the program's fdinfo). The guard is the
/// program's own for raw and BTF tracepoints and fentry (counted since
/// 6.1, fentry since 5.12), but one for the whole CPU for tracepoints
/// and kprobes (counted since 6.7): any such program running there,
/// rtrace's or another tool's, or a map update from user space, skips
/// the next. Perf-event programs share that guard but their skips are
/// not counted. Programs with none are left out, as is every program
/// where the kernel keeps no count.
pub fn skipped_runs(ebpf: &Ebpf) -> Vec<(String, u64)> {
    use std::os::fd::{AsFd as _, AsRawFd as _};
    ebpf.programs()
        .filter_map(|(name, p)| {
            let fd = p.fd().ok()?.as_fd().as_raw_fd();
            let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).ok()?;
            let n: u64 = info
                .lines()
                .find_map(|l| l.strip_prefix("recursion_misses:"))?
                .trim()
                .parse()
                .ok()?;
            (n > 0).then(|| (name.to_owned(), n))
        })
        .collect()
}

/// The instructions the verifier went through for each loaded program,
/// by program (`verified_insns`, 5.16): what its load cost, the steadiest
/// measure of it, and against the verifier's limit of a million, what
/// room the program has left. Programs the kernel gives no count for are
/// left out. In the order of their names.
pub fn verified_insns(ebpf: &Ebpf) -> Vec<(String, u32)> {
    let mut out: Vec<_> = ebpf
        .programs()
        .filter_map(|(name, p)| Some((name.to_owned(), program_insns(p)?)))
        .collect();
    out.sort();
    out
}

/// The instructions the verifier went through for program `name` of
/// `ebpf` ([`verified_insns`]), if loaded and counted.
pub fn verified_insns_of(ebpf: &Ebpf, name: &str) -> Option<u32> {
    program_insns(ebpf.program(name)?)
}

/// One loaded program's verified instructions, where the kernel counts.
fn program_insns(p: &aya::programs::Program) -> Option<u32> {
    p.info().ok()?.verified_instruction_count()
}

/// An event tool's `TALLIES` as a collector, summed over the CPUs.
pub fn read_tallies(ebpf: &Ebpf, slots: u32) -> anyhow::Result<Vec<u64>> {
    per_cpu_sums(ebpf, TALLIES, slots as usize)
}

/// Map `name` of `ebpf` (a constant of `rtrace_common`), or an error that
/// names it.
pub fn map<'a>(ebpf: &'a Ebpf, name: &str) -> anyhow::Result<&'a aya::maps::Map> {
    ebpf.map(name)
        .with_context(|| format!("map {name} missing"))
}

/// Map `name` of `ebpf`, to write, or an error that names it.
pub fn map_mut<'a>(ebpf: &'a mut Ebpf, name: &str) -> anyhow::Result<&'a mut aya::maps::Map> {
    ebpf.map_mut(name)
        .with_context(|| format!("map {name} missing"))
}

/// Map `name` taken out of `ebpf`, to keep, or an error that names it.
pub fn take_map(ebpf: &mut Ebpf, name: &str) -> anyhow::Result<aya::maps::Map> {
    ebpf.take_map(name)
        .with_context(|| format!("map {name} missing"))
}

/// The first `slots` counters of the per-CPU array `map`, each summed
/// over the CPUs.
pub fn per_cpu_sums(ebpf: &Ebpf, map: &str, slots: usize) -> anyhow::Result<Vec<u64>> {
    let array: PerCpuArray<_, u64> = PerCpuArray::try_from(self::map(ebpf, map)?)?;
    (0..slots as u32)
        .map(|i| Ok(array.get(&i, 0)?.iter().sum()))
        .collect()
}

/// The object variants the loader itself tells apart: state kept in the
/// tasks themselves (5.11+), and the CFI walk (5.15+; as a global
/// function, 6.13+), which keeps operations in flight in task storage
/// too. Every variant is listed in
/// `rtrace_common::variants`, which the build reads as well.
pub use rtrace_common::variants::{CFI, CFI_GLOBAL, TASK_STORAGE, walks_cfi};

/// Sets up where an object's `in_flight!` operations are kept, for the
/// variant being loaded, and says where, for `-v`.
pub fn in_flight(load: &mut Load) -> &'static str {
    if load.variant() == TASK_STORAGE || walks_cfi(load.variant()) {
        // aya has no user-space type for task storage, which only the
        // programs use.
        load.allow_unsupported_maps();
        "task storage"
    } else {
        load.size(STARTS, thread_entries());
        "a hash by thread id"
    }
}

/// Entries for a preallocated table keyed by thread: runnable ones for
/// runqlat, ones inside a call for the latency tools, ones off the CPU for
/// offcputime.
///
/// It needs no more than the number of threads; four times today's count (at least 65536, at most `pid_max`)
/// leaves room to grow at a few megabytes, where `pid_max` entries could
/// cost hundreds. Inserts that still fail are counted and reported.
pub fn thread_entries() -> u32 {
    let threads: u32 = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().nth(3)?.split('/').nth(1)?.parse().ok())
        .unwrap_or(0);
    threads.saturating_mul(4).max(65_536).min(pid_max())
}

/// The kernel's `pid_max`: tables keyed by thread id sized to it can never
/// fill up, unlike libbpf-tools' fixed 10240 entries.
pub fn pid_max() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(4_194_304)
}

/// The possible CPUs' count (`/sys/devices/system/cpu/possible`): the
/// CPU numbers the kernel can give a program are below it.
pub fn possible_cpus() -> anyhow::Result<u32> {
    aya::util::nr_cpus()
        .map(|n| n as u32)
        .map_err(|(what, e)| anyhow::anyhow!("cannot read {what}: {e}"))
}

/// A link being detached on a thread of its own. Detaching a tracepoint
/// waits for RCU grace periods (tens of milliseconds): a tool that stops a
/// helper program before its report lets that wait overlap the report's
/// work. Dropping this joins the thread, so that nothing is left attached
/// when the tool is done.
pub struct Detaching(Option<std::thread::JoinHandle<()>>);

impl Detaching {
    /// Starts detaching `link` (aya detaches a link when it is dropped).
    pub fn start<L: Send + 'static>(link: L) -> Self {
        Self(Some(std::thread::spawn(move || drop(link))))
    }
}

impl Drop for Detaching {
    fn drop(&mut self) {
        if let Some(t) = self.0.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Kernel;

    /// The span runs from the first named function to where the symbol
    /// after the last begins; a name two functions bear, and modules'
    /// symbols, are passed over.
    #[test]
    fn text_span_covers_the_named_functions_and_no_more() {
        let mut k = Kernel {
            kallsyms: Some(
                "ffffffff81000000 T before\n\
                 ffffffff81000100 t alloc_bulk\n\
                 ffffffff81000180 t helper\n\
                 ffffffff81000200 T bpf_mem_alloc\n\
                 ffffffff81000200 T bpf_mem_alloc_alias\n\
                 ffffffff81000280 d data_after\n\
                 ffffffff81000300 T after\n\
                 ffffffff80000000 t __alloc\n\
                 ffffffff90000000 t __alloc\n\
                 ffffffffc0000000 t unit_alloc\t[some_module]\n"
                    .into(),
            ),
            ..Kernel::default()
        };
        let names = ["__alloc", "alloc_bulk", "unit_alloc", "bpf_mem_alloc"];
        assert_eq!(
            k.text_span(&names),
            Some((0xffff_ffff_8100_0100, 0xffff_ffff_8100_0300))
        );
        assert_eq!(k.text_span(&["__alloc", "missing"]), None);
        // kptr_restrict: every address reads 0.
        let mut hidden = Kernel {
            kallsyms: Some("0000000000000000 t alloc_bulk\n0000000000000000 T after\n".into()),
            ..Kernel::default()
        };
        assert_eq!(hidden.text_span(&["alloc_bulk"]), None);
    }
}

//! What the running kernel supports, learned by loading and attaching tiny
//! programs for real, and the attach fallback chains built on that.

use std::{collections::HashMap, fmt, num::NonZeroU32};

use aya::{
    Btf, Ebpf, EbpfLoader,
    maps::MapType,
    programs::{
        BtfTracePoint, FEntry, FExit, KProbe, PerfEvent, RawTracePoint, TracePoint, UProbe,
        perf_event::{HardwareEvent, PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
        uprobe::UProbeScope,
    },
};

use rtrace_common::probes;

use crate::kernel::objects;

/// A way of getting a program to run in the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mechanism {
    /// Classic tracepoints, with records described in tracefs.
    Tracepoint,
    /// Raw tracepoints (4.17+): the tracepoint's C arguments, untyped.
    RawTracepoint,
    /// BTF-typed raw tracepoints (5.5+).
    TpBtf,
    /// fentry trampolines (5.5+, x86).
    Fentry,
    /// fexit trampolines.
    Fexit,
    /// kprobes.
    Kprobe,
    /// kretprobes.
    Kretprobe,
    /// uprobes.
    Uprobe,
    /// Sampling on software perf events such as cpu-clock.
    PerfEventSoftware,
    /// Sampling on hardware perf events such as cycles.
    PerfEventHardware,
    /// BPF ring buffer maps (5.8+).
    RingBuffer,
    /// Task local storage maps (5.11+).
    TaskStorage,
    /// Reading a process's memory in the kernel, for user space that may
    /// not ptrace it: a sleepable task iterator bound to one process
    /// (6.1+), copying with `bpf_copy_from_user_task` (5.18+).
    TaskMemory,
}

impl Mechanism {
    /// Every mechanism, in the order `doctor` prints them.
    pub const ALL: [Mechanism; 13] = [
        Mechanism::Tracepoint,
        Mechanism::RawTracepoint,
        Mechanism::TpBtf,
        Mechanism::Fentry,
        Mechanism::Fexit,
        Mechanism::Kprobe,
        Mechanism::Kretprobe,
        Mechanism::Uprobe,
        Mechanism::PerfEventSoftware,
        Mechanism::PerfEventHardware,
        Mechanism::RingBuffer,
        Mechanism::TaskStorage,
        Mechanism::TaskMemory,
    ];

    /// A value parser for a tool's `--attach` that accepts, and lists in
    /// `--help`, only the mechanisms of its `chain`.
    pub fn parser(
        chain: &'static [Mechanism],
    ) -> impl clap::builder::TypedValueParser<Value = Mechanism> {
        use clap::builder::TypedValueParser as _;
        clap::builder::PossibleValuesParser::new(chain.iter().map(|m| m.name())).map(|name| {
            Mechanism::ALL
                .into_iter()
                .find(|m| m.name() == name)
                .expect("the parser offers only mechanisms' names")
        })
    }

    /// The name users see, in `doctor`, `-v` and errors.
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Tracepoint => "tracepoint",
            Mechanism::RawTracepoint => "raw_tracepoint",
            Mechanism::TpBtf => "tp_btf",
            Mechanism::Fentry => "fentry",
            Mechanism::Fexit => "fexit",
            Mechanism::Kprobe => "kprobe",
            Mechanism::Kretprobe => "kretprobe",
            Mechanism::Uprobe => "uprobe",
            Mechanism::PerfEventSoftware => "perf_event_sw",
            Mechanism::PerfEventHardware => "perf_event_hw",
            Mechanism::RingBuffer => "ringbuf",
            Mechanism::TaskStorage => "task_storage",
            Mechanism::TaskMemory => "task_memory",
        }
    }
}

impl fmt::Display for Mechanism {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The function the uprobe probe attaches to, in rtrace's own executable.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn rtrace_uprobe_probe_target() -> u64 {
    // A value of its own, so that no identical function is folded into it.
    std::hint::black_box(0x7274_7261_6365)
}

/// The file offset of `addr` in this process's own executable, from its
/// mappings: cheaper than reading the executable's symbols, which for
/// rtrace, with its embedded objects, are megabytes away.
fn own_offset(addr: usize) -> Option<u64> {
    let exe = std::fs::read_link("/proc/self/exe").ok()?;
    let addr = addr as u64;
    crate::kernel::procmaps::read(None)
        .ok()?
        .into_iter()
        .find(|m| m.contains(addr) && m.path().is_some_and(|p| std::path::Path::new(p) == exe))
        .map(|m| addr - m.start + m.offset)
}

/// Keeps the uprobe target in the symbol table: the linker drops
/// unreferenced functions.
#[used]
static UPROBE_TARGET: extern "C" fn() -> u64 = rtrace_uprobe_probe_target;

/// An `EbpfLoader` that has not read the kernel's BTF.
///
/// aya's `EbpfLoader::new` reads and parses all of
/// `/sys/kernel/btf/vmlinux` (about 20 ms here, and it was most of
/// rtrace's start-up) for CO-RE relocations, which rtrace's objects do not
/// have: their offsets come from `btf.rs`. aya has no constructor without
/// it, but treats a BTF file it cannot open as none. So for the call the
/// open is made to fail: the soft `RLIMIT_NOFILE` is lowered to the lowest
/// free descriptor and restored at once. Nothing else opens files then:
/// set-up runs on the one thread of rtrace's current-thread runtime.
pub fn loader<'a>() -> EbpfLoader<'a> {
    // SAFETY: getrlimit writes into the struct given.
    let mut limit: libc::rlimit = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return no_btf(EbpfLoader::new());
    }
    // The lowest free descriptor: the one the next open would get.
    // SAFETY: duplicating stdin's descriptor (or failing) has no effect
    // beyond the new descriptor, closed at once.
    let free = unsafe { libc::fcntl(0, libc::F_DUPFD_CLOEXEC, 0) };
    if free < 0 {
        return no_btf(EbpfLoader::new());
    }
    // SAFETY: `free` was just opened here.
    unsafe { libc::close(free) };
    let lowered = libc::rlimit {
        rlim_cur: free as libc::rlim_t,
        rlim_max: limit.rlim_max,
    };
    // SAFETY: setrlimit reads the struct given; lowering the soft limit
    // and raising it back to where it was are always allowed.
    let loader = unsafe {
        if libc::setrlimit(libc::RLIMIT_NOFILE, &lowered) != 0 {
            return no_btf(EbpfLoader::new());
        }
        let loader = EbpfLoader::new();
        libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        loader
    };
    no_btf(loader)
}

fn no_btf(mut loader: EbpfLoader<'_>) -> EbpfLoader<'_> {
    loader.btf(None);
    loader
}

/// Keeps a message readable: a verifier log is cut to its last line (the
/// reason), unless `RTRACE_VERIFIER_LOG` asks for all of it.
pub fn trim_verifier_log(msg: &str) -> String {
    let Some(at) = msg.find("Verifier output:") else {
        return msg.to_owned();
    };
    if std::env::var_os("RTRACE_VERIFIER_LOG").is_some() {
        return msg.to_owned();
    }
    let head = msg[..at].trim_end().trim_end_matches('.');
    let reason = msg[at..]
        .lines()
        .skip(1)
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with(':'))
        .take_while(|l| !l.starts_with("verification time"))
        .last();
    match reason {
        Some(r) => format!("{head}; verifier: {r} (set RTRACE_VERIFIER_LOG=1 for the whole log)"),
        None => head.to_owned(),
    }
}

/// Formats an error with its whole source chain on one line.
pub fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(e) = source {
        let s = e.to_string();
        if !out.contains(&s) {
            out.push_str(": ");
            out.push_str(&s);
        }
        source = e.source();
    }
    trim_verifier_log(&out)
}

/// Probes mechanisms on demand and remembers the answers.
#[derive(Default)]
pub struct Features {
    results: HashMap<Mechanism, Result<(), String>>,
    probes: Option<Result<Ebpf, String>>,
}

impl Features {
    /// Whether `m` has been probed already.
    pub fn probed(&self, m: Mechanism) -> bool {
        self.results.contains_key(&m)
    }

    /// Whether `m` works here; the error says why not. tp_btf, fentry and
    /// fexit are probed with `btf`, the kernel's type ids.
    pub fn check(&mut self, m: Mechanism, btf: Result<&Btf, String>) -> Result<(), String> {
        if let Some(r) = self.results.get(&m) {
            return r.clone();
        }
        let r = self.probe(m, btf);
        self.results.insert(m, r.clone());
        r
    }

    fn probe(&mut self, m: Mechanism, btf: Result<&Btf, String>) -> Result<(), String> {
        let map_check = |t: MapType| match aya::sys::is_map_supported(t) {
            Ok(true) => Ok(()),
            Ok(false) => Err("map type not supported by this kernel".to_owned()),
            Err(e) => Err(chain(&e)),
        };
        match m {
            Mechanism::RingBuffer => return map_check(MapType::RingBuf),
            Mechanism::TaskStorage => return map_check(MapType::TaskStorage),
            // Probed by `load::Kernel::check`, through the reader itself
            // (`procmem.rs`, which loads with this module's loader).
            Mechanism::TaskMemory => {
                return Err("probed through kernel::procmem, not here".to_owned());
            }
            _ => {}
        }
        let ebpf = self
            .probes
            .get_or_insert_with(|| {
                let object = objects::get("probes").ok_or("no probes object in this build")?;
                loader().load(object).map_err(|e| chain(&e))
            })
            .as_mut()
            .map_err(|e| format!("loading the probe object failed: {e}"))?;
        let need_btf = || btf.clone();
        // Attaches, makes the event happen, and checks that the program ran:
        // some kernels accept an attach that never delivers.
        macro_rules! try_attach {
            ($ty:ty, $name:expr, $slot:expr, $trigger:expr, |$p:ident| $body:expr) => {{
                let result = {
                    let $p: &mut $ty = ebpf
                        .program_mut($name)
                        .ok_or_else(|| format!("probe program {} missing", $name))?
                        .try_into()
                        .map_err(|e| chain(&e))?;
                    $body.map(drop).map_err(|e| chain(&e))
                };
                let result = result.and_then(|()| fired_after(ebpf, $slot, $trigger));
                // The probe stays attached until the prober is dropped,
                // which detaches every probe at once, off the main thread.
                result
            }};
        }
        // A context switch of this thread: any sleep blocks it.
        let switch = || std::thread::sleep(std::time::Duration::from_micros(100));
        // A read(2), which goes through vfs_read.
        let read = || drop(std::fs::read("/proc/self/stat"));
        let call = || {
            std::hint::black_box(rtrace_uprobe_probe_target());
        };
        // Enough CPU time for a 100 µs sampling period to expire many times,
        // even in an emulated guest whose timers run late.
        let spin = || {
            let start = std::time::Instant::now();
            while start.elapsed() < std::time::Duration::from_millis(25) {
                std::hint::spin_loop();
            }
        };
        match m {
            Mechanism::Tracepoint => {
                crate::kernel::tracefs::root().map_err(|e| e.to_string())?;
                try_attach!(
                    TracePoint,
                    probes::PROG_TRACEPOINT,
                    probes::TRACEPOINT,
                    switch,
                    |p| p.load().and_then(|()| p.attach("sched", "sched_switch"))
                )
            }
            Mechanism::RawTracepoint => try_attach!(
                RawTracePoint,
                probes::PROG_RAW_TRACEPOINT,
                probes::RAW_TRACEPOINT,
                switch,
                |p| p.load().and_then(|()| p.attach("sched_switch"))
            ),
            Mechanism::TpBtf => {
                let btf = need_btf()?;
                try_attach!(
                    BtfTracePoint,
                    probes::PROG_TP_BTF,
                    probes::TP_BTF,
                    switch,
                    |p| p.load("sched_switch", btf).and_then(|()| p.attach())
                )
            }
            Mechanism::Fentry => {
                let btf = need_btf()?;
                try_attach!(FEntry, probes::PROG_FENTRY, probes::FENTRY, read, |p| p
                    .load("vfs_read", btf)
                    .and_then(|()| p.attach()))
            }
            Mechanism::Fexit => {
                let btf = need_btf()?;
                try_attach!(FExit, probes::PROG_FEXIT, probes::FEXIT, read, |p| p
                    .load("vfs_read", btf)
                    .and_then(|()| p.attach()))
            }
            Mechanism::Kprobe => {
                try_attach!(KProbe, probes::PROG_KPROBE, probes::KPROBE, read, |p| p
                    .load()
                    .and_then(|()| p.attach("vfs_read", 0)))
            }
            Mechanism::Kretprobe => {
                try_attach!(
                    KProbe,
                    probes::PROG_KRETPROBE,
                    probes::KRETPROBE,
                    read,
                    |p| p.load().and_then(|()| p.attach("vfs_read", 0))
                )
            }
            Mechanism::Uprobe => {
                let exe = std::fs::read_link("/proc/self/exe").map_err(|e| e.to_string())?;
                let pid = NonZeroU32::new(std::process::id()).expect("pid is nonzero");
                let offset = own_offset(rtrace_uprobe_probe_target as *const () as usize)
                    .ok_or("the probe function is in no mapping of this executable")?;
                try_attach!(UProbe, probes::PROG_UPROBE, probes::UPROBE, call, |p| p
                    .load()
                    .and_then(|()| p.attach(offset, &exe, UProbeScope::OneProcess(pid))))
            }
            Mechanism::PerfEventSoftware | Mechanism::PerfEventHardware => {
                let config = if m == Mechanism::PerfEventSoftware {
                    // cpu-clock periods are nanoseconds.
                    PerfEventConfig::Software(SoftwareEvent::CpuClock)
                } else {
                    PerfEventConfig::Hardware(HardwareEvent::CpuCycles)
                };
                try_attach!(
                    PerfEvent,
                    probes::PROG_PERF_EVENT,
                    probes::PERF_EVENT,
                    spin,
                    // Software and hardware events share the program;
                    // the one probed second finds it loaded.
                    |p| (if p.fd().is_ok() { Ok(()) } else { p.load() }).and_then(|()| p.attach(
                        config,
                        PerfEventScope::CallingProcess { cpu: None },
                        SamplePolicy::Period(100_000),
                        false,
                    ))
                )
            }
            Mechanism::RingBuffer | Mechanism::TaskStorage | Mechanism::TaskMemory => {
                unreachable!("handled above")
            }
        }
    }
}

impl Drop for Features {
    /// Detaches the probes. Detaching a tracepoint program waits for an
    /// RCU grace period (tens of milliseconds), which start-up should not
    /// wait for, so the object is closed on a thread of its own.
    fn drop(&mut self) {
        if let Some(Ok(probes)) = self.probes.take() {
            std::thread::spawn(move || drop(probes));
        }
    }
}

/// Makes the event happen until the probe program in `slot` has run, for
/// up to a second. Once is enough on a quick machine; in a loaded emulated
/// guest a short sleep's timer can expire before the thread gets to block
/// (no context switch), and sampling timers run late, so the event is made
/// again, with a longer sleep between tries, before the attach is judged
/// not to deliver.
fn fired_after(ebpf: &Ebpf, slot: u32, trigger: impl Fn()) -> Result<(), String> {
    let hits: aya::maps::Array<_, u64> = ebpf
        .map(probes::HITS)
        .ok_or_else(|| format!("probe map {} missing", probes::HITS))?
        .try_into()
        .map_err(|e| chain(&e))?;
    let start = std::time::Instant::now();
    let mut pause = std::time::Duration::from_millis(1);
    loop {
        trigger();
        match hits.get(&slot, 0) {
            Ok(0) if start.elapsed() < std::time::Duration::from_secs(1) => {
                std::thread::sleep(pause);
                pause = (pause * 4).min(std::time::Duration::from_millis(100));
            }
            Ok(0) => {
                return Err(
                    "attached, but the program never ran when its event happened".to_owned(),
                );
            }
            Ok(_) => return Ok(()),
            Err(e) => return Err(chain(&e)),
        }
    }
}

/// The chain of tools that hook tracepoints: tp_btf reads typed arguments
/// cheapest (5.5+), raw tracepoints get them untyped (4.17+), classic
/// tracepoints only their records, everywhere.
pub const TRACEPOINT_CHAIN: [Mechanism; 3] = [
    Mechanism::TpBtf,
    Mechanism::RawTracepoint,
    Mechanism::Tracepoint,
];

/// Whether this machine has a hardware PMU (a `cpu` event source): VMs
/// mostly have none, and then every hardware event fails.
pub fn has_pmu() -> bool {
    std::fs::read_dir("/sys/bus/event_source/devices")
        .map(|d| {
            d.flatten().any(|e| {
                let n = e.file_name();
                let n = n.to_string_lossy();
                n == "cpu" || n.starts_with("cpu_") || n.starts_with("armv")
            })
        })
        .unwrap_or(false)
}

/// The lockdown mode from securityfs, if it can be read.
pub fn lockdown() -> String {
    std::fs::read_to_string("/sys/kernel/security/lockdown")
        .ok()
        .and_then(|s| {
            let start = s.find('[')? + 1;
            let end = s[start..].find(']')? + start;
            Some(s[start..end].to_owned())
        })
        .unwrap_or_else(|| "unknown (securityfs not mounted)".to_owned())
}

/// Whether the running kernel's release is `major.minor` or later
/// (false where it cannot be read).
pub fn kernel_at_least(major: u32, minor: u32) -> bool {
    release_at_least(&kernel_release(), major, minor)
}

/// Whether `release` (`6.1.0-57-cloud-amd64`) is `major.minor` or later.
fn release_at_least(release: &str, major: u32, minor: u32) -> bool {
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().ok());
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(a), Some(b)) => (a, b) >= (major, minor),
        _ => false,
    }
}

/// The kernel release, as `uname -r` prints it.
pub fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "unknown".to_owned())
}

#[cfg(test)]
mod release_tests {
    use super::release_at_least;

    #[test]
    fn releases_compare_by_major_then_minor() {
        assert!(release_at_least("6.18.44-fc-v595", 6, 13));
        assert!(release_at_least("6.13.0", 6, 13));
        assert!(!release_at_least("6.12.117+deb12-cloud-amd64", 6, 13));
        assert!(!release_at_least("6.1.0-57-cloud-amd64", 6, 13));
        assert!(release_at_least("7.0-rc1", 6, 13));
        assert!(!release_at_least("unknown", 6, 13));
    }
}

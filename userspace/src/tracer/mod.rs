//! The one lifecycle every tool runs through.
//!
//! A tool ([`Tool`]) declares what it needs: its object (named like the
//! tool), the attach mechanisms it accepts best first, the loss counters its
//! programs keep, what it traces ([`Scope`]), its configuration and map
//! sizes ([`Load`]), how to attach, and what to print. [`run`] owns the
//! order, the same for every tool:
//!
//! 1. arguments and targets checked, then privileges;
//! 2. kernel features, probed once and only for the mechanisms tried;
//! 3. the event transport, then the attach chain (loading the object for
//!    each mechanism, and each variant a tool asks for, until one attaches);
//! 4. the `-v` report: what was skipped and why, what was used;
//! 5. signals and the deadline;
//! 6. the banner on stderr, the header on stdout (text only);
//! 7. the loop: events as they come, intervals as they fall due, until a
//!    signal, the deadline or the last interval; every record goes through
//!    one [`Sink`], text or JSON;
//! 8. the report of lost work at exit.
//!
//! With `-- CMD` ([`command`]), the command is started held at a cork
//! before step 3, in a cgroup of its own that the scope then names, let go
//! after step 6, and its exit ends the loop as a signal would; rtrace exits
//! with its status.

pub mod command;
pub mod scope;

pub use crate::kernel::scope::Scope;
pub use scope::{ScopeArgs, own};

use std::{
    fs::File,
    os::fd::AsRawFd as _,
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use aya::{
    Ebpf,
    maps::{Array, CgroupArray, HashMap as BpfHashMap},
};
use rtrace_common::{
    events::{LOST_EVENT, TALLIES, TALLY_ONLY},
    targets,
};

use crate::kernel::warning::Warning;
use crate::{
    kernel::{
        features::{Mechanism, trim_verifier_log},
        load::{Kernel, Load, TASK_STORAGE, read_errors},
        privs,
        transport::{BufferArgs, DEFAULT_BUFFER, Transport},
    },
    output::{Schedule, Signals, Sink, events::EventStream, metrics::Exposition},
    tracer::command::{CommandLine, Corked},
};

/// Options every tracing tool takes; the other commands take those that
/// do something there.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct GlobalArgs {
    /// Say which attach mechanism was chosen and why others were skipped.
    #[arg(short, long)]
    pub verbose: bool,
    /// Print one JSON object per line instead of text.
    #[arg(long)]
    pub json: bool,
    /// Keep per-thread state in hash maps even where the kernel has task
    /// local storage, which is cheaper (for comparison and testing).
    #[arg(long)]
    pub no_task_storage: bool,
}

// A tool's own arguments and the ones every tool takes. No doc comment:
// clap would make it every tool's about text, which is the tool's own.
#[derive(Debug, clap::Args)]
pub(crate) struct WithGlobal<A: clap::Args> {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(flatten)]
    pub args: A,
}

/// A tool: its declarations and its part of the lifecycle.
///
/// Dispatch is static (the registry in `tools/mod.rs` names each tool's
/// type), so the trait needs no object safety.
pub trait Tool: Sized {
    /// The tool's command-line arguments.
    type Args: clap::Args + std::fmt::Debug;

    /// The subcommand, and the name of the tool's eBPF object
    /// (`ebpf-programs/src/bin/<NAME>.rs`).
    const NAME: &'static str;
    /// The eBPF object the tool loads (with its variant's suffix): its
    /// name, unless it shares another tool's programs.
    const OBJECT: &'static str = Self::NAME;
    /// The mechanisms the tool can attach with, best first; `--attach`
    /// offers these. Empty for tools that choose per probe.
    const CHAIN: &'static [Mechanism];
    /// What each slot of the object's `ERRORS` counters counts, for the
    /// report at exit. An event tool's first slot is events lost to a full
    /// buffer (`rtrace_common::events::LOST_EVENT`).
    const ERRORS: &'static [&'static str];
    /// The `ERRORS` slots that count expected, harmless fallbacks rather
    /// than missing or wrong output (a new process's first stacks walked
    /// before its tables, frame-pointer steps through JIT code): `-v`
    /// reports them with the summary; they are no warning.
    const EXPECTED: &'static [u32] = &[];

    /// Checks the arguments, before any privilege is needed.
    fn new(args: Self::Args) -> anyhow::Result<Self>;

    /// What the tool traces: its [`ScopeArgs`], and what the tool adds.
    fn scope(&self) -> Scope {
        Scope::default()
    }

    /// The scope as the run settled it, before the tool is configured:
    /// in command mode, `cgroup` is the command's own. For what the
    /// kernel-side filter cannot do, such as opening perf counters on it.
    fn scoped(&mut self, _scope: &Scope) {}

    /// The mechanism `--attach` forces, if any.
    fn forced(&self) -> Option<Mechanism> {
        None
    }

    /// The transport flags of a tool that streams events; `None` for tools
    /// that read maps only.
    fn events(&self) -> Option<&BufferArgs> {
        None
    }

    /// The event buffer's size without `--buffer-size`, in bytes.
    const EVENT_BUFFER: u32 = DEFAULT_BUFFER;

    /// Object variants to try for mechanism `m`, best first: a feature the
    /// object is also built with (`"task_storage"`), or `""` for the plain
    /// object. A variant that fails to load or attach is noted under `-v`
    /// and the next is tried.
    fn variants(&self, _m: Option<Mechanism>, _kernel: &mut Kernel) -> Vec<&'static str> {
        vec![""]
    }

    /// Sets the object's configuration and map sizes for mechanism `m`
    /// (`None` for a tool with an empty chain) and `load.variant()`.
    fn configure(
        &mut self,
        m: Option<Mechanism>,
        kernel: &mut Kernel,
        load: &mut Load,
    ) -> anyhow::Result<()>;

    /// Attaches the loaded object's programs.
    fn attach(
        &mut self,
        m: Option<Mechanism>,
        kernel: &mut Kernel,
        ebpf: &mut Ebpf,
    ) -> anyhow::Result<()>;

    /// What was attached to, for `-v` ("attached with tp_btf (...)").
    fn describe(&self) -> String;

    /// More `-v` lines, such as functions a tool skipped.
    fn notes(&self) -> Vec<String> {
        Vec::new()
    }

    /// When the tool prints ([`Schedule`]).
    fn interval(&self) -> Schedule {
        Schedule::Never
    }

    /// Seconds after which the run ends as if interrupted (`-d`).
    fn duration(&self) -> Option<u64> {
        None
    }

    /// The line on stderr that says what is being traced.
    fn banner(&self) -> String;

    /// Whether the tool's own flag asks for JSON (bcc's `-j`), beside
    /// the global `--json`.
    fn json(&self) -> bool {
        false
    }

    /// The column header printed once on stdout in text mode.
    fn header(&self) -> Option<String> {
        None
    }

    /// Runs as tracing starts, after the banner.
    fn start(&mut self) {}

    /// Handles one event record.
    fn event(&mut self, _record: &[u8], _sink: &mut Sink) -> anyhow::Result<()> {
        Ok(())
    }

    /// Whether the tool has printed all it was asked for (bcc's `-M`):
    /// the run then ends as if interrupted.
    fn done(&self) -> bool {
        false
    }

    /// Prints one interval; `last` is the final one.
    fn tick(&mut self, _ebpf: &mut Ebpf, _sink: &mut Sink, _last: bool) -> anyhow::Result<()> {
        Ok(())
    }

    /// Runs once after the loop, before losses are reported.
    fn finish(&mut self, _ebpf: &mut Ebpf, _sink: &mut Sink) -> anyhow::Result<()> {
        Ok(())
    }

    /// How many times the whole run is made (perf stat's `-r`): the
    /// command runs again each time, and the tool is opened, attached and
    /// finished again with it.
    fn repeats(&self) -> u32 {
        1
    }

    /// Runs once after every repetition's [`finish`](Self::finish), when
    /// [`repeats`](Self::repeats) asked for more than one.
    fn finish_rounds(&mut self, _sink: &mut Sink) -> anyhow::Result<()> {
        Ok(())
    }

    /// `-v` lines about the run, printed after [`finish`](Self::finish).
    fn summary(&self) -> Vec<String> {
        Vec::new()
    }

    /// What the run could not do as asked, said at exit with or without
    /// `-v`, beside the counted losses.
    fn warnings(&self) -> Vec<Warning> {
        Vec::new()
    }

    /// How the tool runs as a collector of `rtrace exporter`; `None` for
    /// tools that are none.
    const COLLECTOR: Option<Collector> = None;

    /// Switches the tool to collector mode, before it is configured
    /// (nanosecond histograms, say).
    fn collect(&mut self) {}

    /// Reads the maps into running totals: at every scrape, and every few
    /// seconds between them so that no 32-bit kernel counter wraps unseen.
    fn refresh(&mut self, _ebpf: &Ebpf) -> anyhow::Result<()> {
        Ok(())
    }

    /// Writes the collector's metrics from its running totals.
    fn metrics(&self, _out: &mut Exposition) {}
}

/// A tool as a collector of the exporter ([`Tool::COLLECTOR`]).
#[derive(Debug, Clone, Copy)]
pub struct Collector {
    /// The tool's command line as a collector (without `-c`).
    pub args: &'static [&'static str],
    /// Whether the exporter runs it when no `--collectors` are named.
    pub default: bool,
    /// Whether it takes the exporter's `-c CGROUP`.
    pub scoped: bool,
    /// `TALLIES` slots an event tool counts into instead of sending
    /// events (`rtrace_common::events::TALLY_ONLY`); 0 for tools that read
    /// maps only.
    pub tallies: u32,
}

impl<const OWN: u32> ScopeArgs<OWN> {
    /// Whether tasks are chosen by cgroup ([`Scope::by_cgroup`]).
    pub fn by_cgroup(&self) -> bool {
        self.scope().by_cgroup()
    }

    /// The one process the flags name ([`Scope::one_pid`]).
    pub fn one_pid(&self) -> Option<u32> {
        self.scope().one_pid()
    }

    /// What the flags choose, for a banner ([`Scope::whom`]).
    pub fn whom(&self) -> Option<String> {
        self.scope().whom()
    }

    /// The scope these flags ask for.
    pub fn scope(&self) -> Scope {
        Scope {
            pids: self.pids.clone(),
            tids: self.tids.clone(),
            cgroup: self.cgroup.clone(),
            cpus: self.cpus.clone(),
            command: self.command.clone(),
            user: self.user.clone(),
            all_cpus: self.all_cpus,
            output: self.output.clone(),
            ..Scope::default()
        }
    }
}

/// bcc's filters by maps the user pinned in bpffs, for the tools bcc has
/// them in.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct PinnedSets {
    /// Trace only tasks whose cgroup id is a key of this hash map pinned in
    /// bpffs (bcc's --cgroupmap; keys are 8-byte cgroup ids).
    #[arg(long = "cgroupmap", value_name = "PATH")]
    pub cgroup_map: Option<PathBuf>,
    /// Trace only tasks whose mount namespace id is a key of this hash map
    /// pinned in bpffs (bcc's --mntnsmap; keys are 8-byte namespace ids).
    #[arg(long = "mntnsmap", value_name = "PATH")]
    pub mntns_map: Option<PathBuf>,
}

/// A [`Scope`] checked against the system: its cgroup open.
struct Targets {
    global: targets::Targets,
    ids: Vec<u32>,
    cgroup: Option<File>,
    /// Maps the user pinned, each for the object's map it replaces.
    pins: Vec<(&'static str, PathBuf)>,
    /// The CPUs of `-C`, and how many CPUs the machine may have.
    cpus: (Vec<u32>, u32),
}

/// Checks that `path` is a hash map pinned in bpffs with 8-byte keys, as
/// bcc's `--cgroupmap` and `--mntnsmap` take (`flag` names which).
fn check_pinned_set(path: &std::path::Path, flag: &str) -> anyhow::Result<()> {
    let map = aya::maps::MapData::from_pin(path).map_err(|e| {
        anyhow::anyhow!(
            "{flag} {}: not a BPF map pinned in bpffs ({e}); pin one with bpftool map create PATH type hash key 8 value 8 entries N name NAME",
            path.display()
        )
    })?;
    let info = map.info().with_context(|| {
        format!(
            "{flag} {}: cannot read the map's description",
            path.display()
        )
    })?;
    let hash = matches!(
        info.map_type(),
        Ok(aya::maps::MapType::Hash | aya::maps::MapType::LruHash)
    );
    if !hash || info.key_size() != 8 {
        anyhow::bail!(
            "{flag} {}: must be a hash map with 8-byte keys (its keys are {} bytes)",
            path.display(),
            info.key_size()
        );
    }
    Ok(())
}

impl Targets {
    fn check(scope: &Scope, kernel: &mut Kernel) -> anyhow::Result<Self> {
        for &pid in &scope.pids {
            check_task(pid, "process")?;
        }
        for &tid in &scope.tids {
            check_task(tid, "thread")?;
        }
        let (by, ids) = if !scope.pids.is_empty() {
            (targets::BY_TGID, scope.pids.clone())
        } else if !scope.tids.is_empty() {
            (targets::BY_TID, scope.tids.clone())
        } else {
            (targets::BY_NONE, Vec::new())
        };
        let (cgroup, cgroup_id) = match &scope.cgroup {
            Some(path) => {
                let id = cgroup_id(path)?;
                let file = File::open(path)
                    .with_context(|| format!("cannot open cgroup {}", path.display()))?;
                (Some(file), id)
            }
            None => (None, 0),
        };
        let mut sets = 0;
        let mut pins = Vec::new();
        let mut mntns_offsets = [0; 3];
        if let Some(path) = &scope.cgroup_map {
            check_pinned_set(path, "--cgroupmap")?;
            sets |= targets::SET_CGROUPS;
            pins.push((targets::CGROUP_SET_MAP, path.clone()));
        }
        if let Some(path) = &scope.mntns_map {
            check_pinned_set(path, "--mntnsmap")?;
            let btf = kernel
                .btf()
                .context("--mntnsmap finds a task's mount namespace through the kernel's BTF")?;
            mntns_offsets = [
                btf.offset("task_struct", "nsproxy")?,
                btf.offset("nsproxy", "mnt_ns")?,
                btf.offset("mnt_namespace", "ns.inum")?,
            ];
            sets |= targets::SET_MNTNS;
            pins.push((targets::MNTNS_SET_MAP, path.clone()));
        }
        let possible = aya::util::nr_cpus()
            .map_err(|(what, e)| anyhow::anyhow!("cannot read {what}: {e}"))?
            as u32;
        if let Some(&cpu) = scope.cpus.iter().find(|&&c| c >= possible) {
            anyhow::bail!("no CPU {cpu}: this machine has CPUs 0 to {}", possible - 1);
        }
        Ok(Self {
            global: targets::Targets {
                by,
                cgroup: u32::from(cgroup.is_some()),
                cgroup_id,
                exclude_tgid: if scope.exclude_self {
                    std::process::id()
                } else {
                    0
                },
                sets,
                mntns_offsets,
                cpus: u32::from(!scope.cpus.is_empty()),
            },
            ids,
            cgroup,
            pins,
            cpus: (scope.cpus.clone(), possible),
        })
    }

    /// Fills the loaded object's id hash and cgroup array.
    fn apply(&self, ebpf: &mut Ebpf) -> anyhow::Result<()> {
        if !self.ids.is_empty() {
            let mut map: BpfHashMap<_, u32, u8> = BpfHashMap::try_from(
                ebpf.map_mut(targets::IDS_MAP)
                    .with_context(|| format!("map {} missing", targets::IDS_MAP))?,
            )?;
            for id in &self.ids {
                map.insert(id, 1, 0)
                    .context("cannot fill the target filter")?;
            }
        }
        if !self.cpus.0.is_empty() {
            let mut map: Array<_, u8> = ebpf
                .map_mut(targets::CPUS_MAP)
                .with_context(|| format!("map {} missing", targets::CPUS_MAP))?
                .try_into()?;
            for &cpu in &self.cpus.0 {
                map.set(cpu, 1, 0).context("cannot set the CPU filter")?;
            }
        }
        if let Some(cg) = &self.cgroup {
            let mut map: CgroupArray<_> = ebpf
                .map_mut(targets::CGROUP_MAP)
                .with_context(|| format!("map {} missing", targets::CGROUP_MAP))?
                .try_into()?;
            map.set(0, cg.as_raw_fd(), 0)
                .context("cannot set the cgroup filter")?;
        }
        Ok(())
    }
}

/// Fails with a clear message unless `id` names a live task (`what` says
/// which kind).
pub fn check_task(id: u32, what: &str) -> anyhow::Result<()> {
    if id == 0 || !crate::kernel::procmaps::alive(id) {
        anyhow::bail!("no such {what}: {id}");
    }
    Ok(())
}

/// The kernfs id of a cgroup v2 directory, which is its inode number.
fn cgroup_id(path: &std::path::Path) -> anyhow::Result<u64> {
    use std::os::unix::fs::MetadataExt as _;
    const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
    let meta = std::fs::metadata(path)
        .map_err(|e| anyhow::anyhow!("cannot use cgroup {}: {e}", path.display()))?;
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())?;
    // SAFETY: `c` is a valid path and `st` a valid out-pointer.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 || st.f_type as i64 != CGROUP2_SUPER_MAGIC
    {
        anyhow::bail!("{} is not a cgroup v2 directory", path.display());
    }
    Ok(meta.ino())
}

/// No mechanism of a chain worked.
#[derive(Debug, thiserror::Error)]
#[error("{tool}: no attach mechanism works on this kernel; tried {}", tried_list(.tried))]
pub struct AttachError {
    tool: &'static str,
    /// Each mechanism tried, with why it failed.
    tried: Vec<(String, String)>,
}

fn tried_list(tried: &[(String, String)]) -> String {
    tried
        .iter()
        .map(|(m, why)| format!("{m} ({why})"))
        .collect::<Vec<_>>()
        .join(", then ")
}

/// Fails unless a forced mechanism (`--attach`) is one of `chain`'s.
fn check_forced(tool: &str, forced: Option<Mechanism>, chain: &[Mechanism]) -> anyhow::Result<()> {
    if let Some(m) = forced.filter(|m| !chain.contains(m)) {
        let names: Vec<&str> = chain.iter().map(|m| m.name()).collect();
        anyhow::bail!("{tool} cannot attach with {m}; use {}", names.join(", "));
    }
    Ok(())
}

/// The object's name for a variant and transport.
fn object_name(tool: &str, variant: &str, transport: Option<Transport>) -> String {
    match (variant, transport) {
        ("", Some(Transport::Perf)) => format!("{tool}_perf"),
        ("", _) => tool.to_owned(),
        (v, _) => format!("{tool}_{v}"),
    }
}

/// The attached tool: what `-v` reports.
struct Attached {
    ebpf: Ebpf,
    mech: Option<Mechanism>,
    skipped: Vec<(String, String)>,
}

/// Walks the chain: each mechanism the kernel has, each variant the tool
/// asks for, until one loads and attaches.
fn attach_chain<T: Tool>(
    tool: &mut T,
    kernel: &mut Kernel,
    targets: &Targets,
    transport: Option<Transport>,
    global: &GlobalArgs,
    collect: bool,
) -> anyhow::Result<Attached> {
    let forced = tool.forced();
    let chain: Vec<Option<Mechanism>> = match forced {
        Some(m) => vec![Some(m)],
        None if T::CHAIN.is_empty() => vec![None],
        None => T::CHAIN.iter().copied().map(Some).collect(),
    };
    // Probing a mechanism decides between candidates; with one candidate
    // there is nothing to decide, and the tool's own attach is the probe
    // (its error names the mechanism and why).
    let choose = chain.len() > 1;
    let mut skipped = Vec::new();
    for m in chain {
        if let Some(m) = m
            && choose
            && let Err(why) = kernel.check(m)
        {
            skipped.push((m.name().to_owned(), why));
            continue;
        }
        let mut variants = tool.variants(m, kernel);
        if global.no_task_storage {
            variants.retain(|&v| v != TASK_STORAGE);
        }
        let last = variants.len().saturating_sub(1);
        for (i, variant) in variants.into_iter().enumerate() {
            let attempt = (|| {
                let mut load = Load::new(variant);
                load.global(targets::GLOBAL, &targets.global);
                load.size(targets::IDS_MAP, targets.ids.len().max(1) as u32);
                load.size(targets::CPUS_MAP, targets.cpus.1.max(1));
                for (name, path) in &targets.pins {
                    load.pinned(name, path.clone());
                }
                load.size("ERRORS", T::ERRORS.len().max(1) as u32);
                match (T::COLLECTOR, transport, tool.events()) {
                    // A tallying collector sends nothing: the object's
                    // smallest buffer will do.
                    (Some(c), _, _) if collect && c.tallies > 0 => {
                        load.global(TALLY_ONLY, &1u32);
                        load.size(TALLIES, c.tallies);
                    }
                    (_, Some(t), Some(args)) => t.size(&mut load, args.bytes(T::EVENT_BUFFER)),
                    _ => {}
                }
                tool.configure(m, kernel, &mut load)?;
                let mut ebpf = load.load(&object_name(T::OBJECT, variant, transport))?;
                targets.apply(&mut ebpf)?;
                tool.attach(m, kernel, &mut ebpf)?;
                anyhow::Ok(ebpf)
            })();
            let what = match (m, variant) {
                (Some(m), "") => m.name().to_owned(),
                (Some(m), v) => format!("{m} with {}", v.replace('_', " ")),
                (None, "") => T::NAME.to_owned(),
                (None, v) => format!("{} with {}", T::NAME, v.replace('_', " ")),
            };
            match attempt {
                Ok(ebpf) => {
                    return Ok(Attached {
                        ebpf,
                        mech: m,
                        skipped,
                    });
                }
                // A tool without a chain has nothing to fall back to after
                // its last variant: its error is the error.
                Err(e) if m.is_none() && i == last => return Err(e),
                Err(e) => skipped.push((what, trim_verifier_log(&format!("{e:#}")))),
            }
        }
    }
    Err(AttachError {
        tool: T::NAME,
        tried: skipped,
    }
    .into())
}

/// A tool attached: its object, and what `-v` says of how.
pub struct Session<T: Tool> {
    /// The tool.
    pub tool: T,
    /// Its loaded and attached object.
    pub ebpf: Ebpf,
    mech: Option<Mechanism>,
    skipped: Vec<(String, String)>,
    transport: Option<(Transport, Option<String>)>,
}

impl<T: Tool> Session<T> {
    /// Checks the tool's targets and the privileges, then walks its attach
    /// chain. `collect`: as a collector of the exporter, which reads maps
    /// and takes no events.
    pub fn open(
        mut tool: T,
        scope: &Scope,
        global: &GlobalArgs,
        collect: bool,
    ) -> anyhow::Result<Self> {
        if collect {
            tool.collect();
        }
        let mut kernel = Kernel::default();
        let targets = Targets::check(scope, &mut kernel)?;
        check_forced(T::NAME, tool.forced(), T::CHAIN)?;
        privs::check()?;

        let transport = tool
            .events()
            .map(|args| Transport::choose(&mut kernel, args));
        let Attached {
            ebpf,
            mech,
            skipped,
        } = attach_chain(
            &mut tool,
            &mut kernel,
            &targets,
            transport.as_ref().map(|t| t.0),
            global,
            collect,
        )?;
        let transport = transport.filter(|_| !collect);
        // What setup needed of the kernel (its BTF above all) is not
        // needed while tracing.
        drop(kernel);
        crate::kernel::memory::release_free();
        Ok(Self {
            tool,
            ebpf,
            mech,
            skipped,
            transport,
        })
    }

    /// Says on stderr what was skipped and why, and what was used (`-v`).
    pub fn report(&self) {
        for (what, why) in &self.skipped {
            eprintln!("rtrace: {}: skipped {what}: {why}", T::NAME);
        }
        match self.mech {
            Some(m) => eprintln!(
                "rtrace: {}: attached with {m} ({})",
                T::NAME,
                self.tool.describe()
            ),
            None => eprintln!("rtrace: {}: attached {}", T::NAME, self.tool.describe()),
        }
        for note in self.tool.notes() {
            eprintln!("rtrace: {}: {note}", T::NAME);
        }
        if let (Some((t, why)), Some(args)) = (&self.transport, self.tool.events()) {
            t.report(T::NAME, args.bytes(T::EVENT_BUFFER), why.as_deref());
        }
    }
}

/// Checks a scope with a command, starts the command held at its cork,
/// and points the scope at the command's cgroup where it traces the
/// command itself.
fn start_command(
    scope: &mut Scope,
    duration: Option<u64>,
    interval: Schedule,
) -> anyhow::Result<Option<Corked>> {
    if scope.command.is_empty() {
        return Ok(None);
    }
    if duration.is_some() {
        anyhow::bail!("a duration and -- CMD both say when to stop: give one of them");
    }
    if let Schedule::Every { count: Some(_), .. } = interval {
        anyhow::bail!("a count of intervals and -- CMD both say when to stop: give one of them");
    }
    let line = CommandLine {
        argv: scope.command.clone(),
        user: scope.user.clone(),
        own_cgroup: scope.command_cgroup(),
    };
    let corked = Corked::start(&line)?;
    if let Some(cg) = corked.cgroup() {
        scope.cgroup = Some(cg.to_owned());
        scope.own_cgroup = true;
    }
    scope.command_pid = Some(corked.pid());
    Ok(Some(corked))
}

/// Sends the output where the scope says: `-o FILE`, else stderr in
/// command mode (the command's stdout is its own), else stdout.
fn direct_output(scope: &Scope) -> anyhow::Result<()> {
    use crate::output::{Destination, direct_to};
    match &scope.output {
        Some(path) => {
            let file =
                File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
            direct_to(Destination::File(std::io::LineWriter::new(file)));
        }
        None if !scope.command.is_empty() => direct_to(Destination::Stderr),
        None => {}
    }
    Ok(())
}

/// Runs tool `T` from its arguments to the report at exit; the exit
/// status is the command's in command mode, else 0. With
/// [`Tool::repeats`], the whole run is made that many times (until a
/// signal), and the status is the last run's.
pub async fn run<T: Tool>(args: T::Args, global: &GlobalArgs) -> anyhow::Result<u8> {
    let mut tool = T::new(args)?;
    let repeats = tool.repeats().max(1);
    let mut signals = Signals::new()?;
    let mut sink = None;
    let mut status = 0;
    for round in 0..repeats {
        let (back, round_status, stopped_by) =
            run_once(tool, global, &mut signals, &mut sink, round).await?;
        tool = back;
        status = round_status;
        if stopped_by > 0 {
            break;
        }
    }
    if repeats > 1
        && let Some(sink) = &mut sink
    {
        tool.finish_rounds(sink)?;
        sink.flush()?;
    }
    Ok(status)
}

/// One run of the tool: opened, attached, traced until the end, finished;
/// returns the tool, the exit status and the signal that stopped it (0
/// for none). The sink is made on the first run.
async fn run_once<T: Tool>(
    mut tool: T,
    global: &GlobalArgs,
    signals: &mut Signals,
    sink_slot: &mut Option<Sink>,
    round: u32,
) -> anyhow::Result<(T, u8, i32)> {
    let mut scope = tool.scope();
    let mut command = start_command(&mut scope, tool.duration(), tool.interval())?;
    tool.scoped(&scope);
    if round == 0 {
        direct_output(&scope)?;
    }
    let session = Session::open(tool, &scope, global, false)?;
    if global.verbose {
        session.report();
    }
    let Session {
        mut tool,
        mut ebpf,
        transport,
        ..
    } = session;
    signals.stop_after(tool.duration());
    let open_stream = |ebpf: &mut Ebpf| match (&transport, tool.events()) {
        (Some((t, _)), Some(args)) => {
            EventStream::new(ebpf, *t, args.bytes(T::EVENT_BUFFER)).map(Some)
        }
        _ => Ok(None),
    };
    // Perf buffers must be open before anything is traced, or the events
    // find no buffer; a ring buffer keeps them from the moment it exists,
    // so mapping it (hundreds of pages, thousands with --buffer-size)
    // need not delay saying that tracing has started.
    let ring = matches!(transport, Some((Transport::Ring, _)));
    let mut stream = if ring { None } else { open_stream(&mut ebpf)? };
    let mut banner = tool.banner();
    if command.is_some() {
        // bcc's banners end in how to stop; in command mode the command's
        // exit does.
        banner = banner.replace("Hit Ctrl-C to end.", "Ends when the command exits.");
    }
    if round == 0 {
        eprintln!("{banner}");
    }
    if ring {
        stream = open_stream(&mut ebpf)?;
    }
    if sink_slot.is_none() {
        let mut sink = Sink::new(T::NAME, global.json || tool.json());
        if let Some(header) = tool.header() {
            sink.header(&header)?;
        }
        *sink_slot = Some(sink);
    }
    let sink = sink_slot.as_mut().context("no output")?;
    tool.start();
    if let Some(c) = &mut command {
        c.release()?;
    }

    let stopped_by = run_loop(
        &mut tool,
        &mut ebpf,
        stream.as_mut(),
        signals,
        sink,
        command.as_mut(),
    )
    .await?;
    tool.finish(&mut ebpf, sink)?;
    sink.flush()?;
    if global.verbose {
        for line in tool.summary() {
            eprintln!("rtrace: {}: {line}", T::NAME);
        }
    }
    for warning in tool.warnings() {
        warning.print();
    }
    report_errors::<T>(
        &ebpf,
        stream.as_ref().map_or(0, EventStream::perf_lost),
        global.verbose,
    )?;
    let status = match command.as_ref().and_then(Corked::status) {
        Some(status) => status,
        // Stopped by a second signal while the command still ran.
        None if command.is_some() && stopped_by > 0 => 128u8.wrapping_add(stopped_by as u8),
        None => 0,
    };
    Ok((tool, status, stopped_by))
}

/// Whether a SIGINT came from the terminal, which sent it to the command
/// too: rtrace and the command share the foreground process group.
fn from_terminal(sig: i32) -> bool {
    // SAFETY: no preconditions.
    sig == libc::SIGINT && unsafe { libc::tcgetpgrp(0) == libc::getpgrp() }
}

/// What woke the loop.
enum Wake {
    Events,
    Interval,
    /// A signal (its number) or the deadline (0).
    Stop(i32),
    /// The command exited.
    Exited,
}

/// The loop, until a signal, the deadline, the last interval or the
/// command's exit; returns the signal that ended it, if one did. In
/// command mode a first signal is passed on to the command (unless the
/// terminal sent it to both), whose exit then ends the loop; a second ends
/// it at once.
async fn run_loop<T: Tool>(
    tool: &mut T,
    ebpf: &mut Ebpf,
    mut stream: Option<&mut EventStream>,
    signals: &mut Signals,
    sink: &mut Sink,
    mut command: Option<&mut Corked>,
) -> anyhow::Result<i32> {
    let mut signalled = false;
    let mut first_signal = 0;
    let interval = tool.interval();
    let mut next = match interval {
        Schedule::Every { period, .. } => Some(Instant::now() + period),
        _ => None,
    };
    let mut done = 0u64;
    // A ring buffer's programs wake this loop only while it sleeps: once
    // records come, it reads the ring every few milliseconds instead (an
    // empty ring is two loads from its mapped pages), and sleeps again
    // when a read finds none. A record committed as it goes to sleep wakes
    // it too (see `EventStream::sleep`); the look every 100 ms while it
    // sleeps only bounds the harm of a wakeup lost all the same: a short
    // process's first stacks must reach user space while it lives.
    let polled_stream = stream.as_deref().is_some_and(EventStream::polled);
    let mut reading = false;
    loop {
        // A tool that has shown all it was asked for ends the run as the
        // deadline does.
        let wake = if tool.done() {
            Wake::Stop(0)
        } else {
            let polled = async {
                if !polled_stream {
                    return std::future::pending().await;
                }
                let wait = if reading {
                    Duration::from_millis(rtrace_common::events::READ_EVERY_MS)
                } else {
                    Duration::from_millis(100)
                };
                tokio::time::sleep(wait).await;
            };
            let due = async {
                match next {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            };
            let ready = async {
                match stream.as_deref_mut() {
                    Some(s) => s.ready().await,
                    None => std::future::pending().await,
                }
            };
            let exited = async {
                match command.as_deref_mut() {
                    Some(c) => c.exited().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                r = ready => { r?; Wake::Events }
                () = polled => Wake::Events,
                () = due => Wake::Interval,
                sig = signals.recv() => Wake::Stop(sig),
                () = exited => Wake::Exited,
            }
        };
        let wake = match (wake, command.as_deref()) {
            (Wake::Stop(sig), Some(c)) if !signalled && sig != 0 => {
                signalled = true;
                first_signal = sig;
                if !from_terminal(sig) {
                    c.signal(sig);
                }
                continue;
            }
            (Wake::Stop(sig), Some(c)) if sig != 0 => {
                c.signal(libc::SIGTERM);
                Wake::Stop(sig)
            }
            (w, _) => w,
        };
        match wake {
            Wake::Events => {
                if let Some(s) = stream.as_deref_mut() {
                    let mut seen = 0u64;
                    s.drain(|record| {
                        seen += 1;
                        tool.event(record, sink)
                    })?;
                    if polled_stream && (seen > 0) != reading {
                        reading = seen > 0;
                        s.sleep(!reading)?;
                        if !reading {
                            // What came between the read and the flag.
                            s.drain(|record| tool.event(record, sink))?;
                        }
                    }
                }
                sink.flush()?;
            }
            Wake::Interval => {
                // Events waiting are handled first: a tick may take long
                // (profile symbolizes there), and what they ask for (a new
                // process's unwind tables) should not wait for it.
                if let Some(s) = stream.as_deref_mut() {
                    s.drain(|record| tool.event(record, sink))?;
                }
                done += 1;
                let last = matches!(interval, Schedule::Every { count: Some(c), .. } if done >= c);
                tool.tick(ebpf, sink, last)?;
                sink.flush()?;
                if last {
                    return Ok(0);
                }
                if let (Schedule::Every { period, .. }, Some(at)) = (interval, next.as_mut()) {
                    *at += period;
                }
            }
            Wake::Stop(_) | Wake::Exited => {
                // Events already in the buffers are handled first.
                if let Some(s) = stream.as_deref_mut() {
                    s.drain_all(|record| tool.event(record, sink))?;
                }
                if interval != Schedule::Never {
                    tool.tick(ebpf, sink, true)?;
                }
                sink.flush()?;
                return Ok(match wake {
                    Wake::Stop(sig) => sig,
                    // The command ended by the signal passed on to it.
                    _ => first_signal,
                });
            }
        }
    }
}

/// Reports the object's `ERRORS` counters on stderr, each only when
/// nonzero. A perf buffer's own loss records count towards the first slot
/// of an event tool: a full perf buffer fails the helper, which the
/// programs count, and the kernel reports the same drops again, so the
/// larger of the two is taken rather than the sum. The tool's
/// [`Tool::EXPECTED`] slots are no warning: `-v` shows them. Events the
/// kernel kept from a program that was already running are reported
/// too.
fn report_errors<T: Tool>(ebpf: &Ebpf, perf_lost: u64, verbose: bool) -> anyhow::Result<()> {
    let counts = read_errors(ebpf, T::ERRORS.len())?;
    for (i, (name, mut n)) in T::ERRORS.iter().zip(counts).enumerate() {
        if i == LOST_EVENT as usize {
            n = n.max(perf_lost);
        }
        if n == 0 {
            continue;
        }
        if !T::EXPECTED.contains(&(i as u32)) {
            Warning::lost(format!("{n} {name}")).print();
        } else if verbose {
            eprintln!("rtrace: {}: {n} {name}", T::NAME);
        }
    }
    for (program, n) in crate::kernel::load::skipped_runs(ebpf) {
        Warning::lost(format!(
            "{n} events not counted: program {program} was already running on \
             their CPU, and the kernel skips a program that would nest in itself"
        ))
        .print();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_are_named_by_variant_then_transport() {
        assert_eq!(object_name("runqlat", "", None), "runqlat");
        assert_eq!(
            object_name("runqlat", "task_storage", None),
            "runqlat_task_storage"
        );
        assert_eq!(
            object_name("execsnoop", "", Some(Transport::Perf)),
            "execsnoop_perf"
        );
        assert_eq!(
            object_name("execsnoop", "", Some(Transport::Ring)),
            "execsnoop"
        );
    }

    #[test]
    fn every_object_a_tool_may_ask_for_is_built() {
        for name in [
            "runqlat",
            "runqlat_task_storage",
            "execsnoop_perf",
            "probes",
            "stat",
        ] {
            assert!(crate::kernel::objects::get(name).is_some(), "{name}");
        }
    }
}

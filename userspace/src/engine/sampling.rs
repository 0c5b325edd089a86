//! Sampling stacks: at a perf event's period or frequency (CPU time,
//! any counter), or at every event of tracepoints and probes, with
//! off-CPU time beside it if asked. The engine of `rtrace profile` and of
//! the tools built on it (`stackcount`, `top`), which describe the run
//! they want as a [`Sampling`] and delegate the lifecycle to a
//! [`Sampler`].

use std::time::Duration;

use anyhow::Context as _;
use aya::maps::{MapData, ProgramArray};
use aya::{
    Ebpf,
    programs::{
        PerfEvent,
        perf_event::{HardwareEvent, PerfEventConfig, PerfEventScope, SamplePolicy},
    },
    util::online_cpus,
};
use rtrace_common::{
    offcputime::{STATE_ANY, THREADS_USER},
    profile::{
        Config, ERR_NAMES, HEAT_SLOT_NS, PROG_PROFILE_JAVA, PROG_PROFILE_NATIVE,
        PROG_PROFILE_PYTHON, PROG_PROFILE_RUNTIMES, PROG_PROFILE_V8,
    },
    unwind::{RUNTIME_JAVA, RUNTIME_PYTHON, RUNTIME_V8, RUNTIMES_ALL, Runtimes},
};

use crate::{
    engine::{
        offcpu::{Filter, OffCpu},
        stacktool::{SampleStream, StackArgs, StackTool},
    },
    kernel::{
        btf::AttachTarget,
        features::Mechanism,
        load::{Hooks, Kernel, Load},
        scope::Scope,
        transport::BufferArgs,
        warning::Warning,
    },
    output::{
        Schedule, Sink,
        files::{self, StackOutputs, StackReports},
        stacks::{
            self, FlameOptions, Stacks, TextOptions,
            annotate::{self, AnnotateArgs},
            report::Report,
        },
    },
    probes::{
        attach::{self, Programs},
        event,
    },
    stacks::sample::Sample,
};

/// The object the sampling programs are in: profile's, which its
/// front-ends load.
pub const OBJECT: &str = "profile";

/// What each slot of the sampling object's `ERRORS` counters counts.
pub const ERRORS: &[&str] = &ERR_NAMES;
/// The slots that count expected, harmless fallbacks.
pub const EXPECTED: &[u32] = &rtrace_common::stacks::ERR_EXPECTED;

/// What `-e` samples on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Event {
    /// CPU time: hardware cycles where there is a PMU, else cpu-clock.
    #[default]
    Cpu,
    /// A perf counter, by perf's name: a sample every so many events.
    Counter(event::Counter),
    /// Every event of the tracepoints a spec names (globs allowed).
    Tracepoint {
        /// The category, or a glob.
        category: String,
        /// The event, or a glob.
        event: String,
    },
    /// Every call (or return) of the functions, or every hit of the USDT
    /// probe, a probe spec names (`p:`, `r:`, `u:`).
    Probe(event::Event),
}

/// `-e`'s value: `cpu`, or an event spec (`probes::event`).
pub fn parse_event(text: &str) -> Result<Event, String> {
    match text {
        "cpu" => return Ok(Event::Cpu),
        // rtrace's name before the event specs.
        "llc-misses" => {
            let mut c = event::Counter::named("cache-misses").ok_or("cache-misses")?;
            c.name = text.to_owned();
            return Ok(Event::Counter(c));
        }
        _ => {}
    }
    match event::parse(text).map_err(|e| e.to_string())? {
        event::Event::Counter(c) if c.user_only || c.kernel_only => Err(format!(
            "{text}: profile takes no :u or :k; -U or -K keeps one mode's stacks"
        )),
        event::Event::Counter(c) => Ok(Event::Counter(c)),
        event::Event::Tracepoint { category, event } => Ok(Event::Tracepoint { category, event }),
        probe => Ok(Event::Probe(probe)),
    }
}

impl Event {
    /// The software CPU clock, a timer that works everywhere.
    pub fn cpu_clock() -> Self {
        event::Counter::named("cpu-clock").map_or(Self::Cpu, Self::Counter)
    }

    pub fn is_cpu_clock(&self) -> bool {
        matches!(self, Self::Counter(c) if c.kind == event::TYPE_SOFTWARE && c.config == 0)
    }

    pub fn config(&self) -> PerfEventConfig {
        match self {
            Self::Counter(c) => PerfEventConfig::Pmu {
                pmu_type: c.kind,
                config: c.config,
            },
            // Tracepoints and probes are not sampled by a perf event's
            // period.
            Self::Cpu | Self::Tracepoint { .. } | Self::Probe(_) => {
                PerfEventConfig::Hardware(HardwareEvent::CpuCycles)
            }
        }
    }

    pub fn name(&self) -> String {
        match self {
            Self::Cpu => "cycles".to_owned(),
            Self::Counter(c) => c.display(),
            Self::Tracepoint { category, event } => format!("{category}:{event}"),
            Self::Probe(p) => p.to_string(),
        }
    }

    /// Whether stacks are taken at events (tracepoints, probes), every
    /// one or every `-c N`-th, rather than by a counter's period.
    pub fn at_events(&self) -> bool {
        matches!(self, Self::Tracepoint { .. } | Self::Probe(_))
    }

    pub fn is_hardware(&self) -> bool {
        match self {
            Self::Cpu => true,
            Self::Counter(c) => c.hardware(),
            Self::Tracepoint { .. } | Self::Probe(_) => false,
        }
    }
}

/// Where there is no PMU, as in most VMs, the hardware events fail; this
/// says why in words.
fn pmu_hint() -> &'static str {
    if crate::kernel::features::has_pmu() {
        ""
    } else {
        " (this machine has no hardware PMU: /sys/bus/event_source/devices has no cpu)"
    }
}

/// Reads `kernel.perf_event_max_sample_rate`, which frequencies may not exceed.
fn max_sample_rate() -> Option<u64> {
    std::fs::read_to_string("/proc/sys/kernel/perf_event_max_sample_rate")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The program that counts stacks at tracepoints (`-e CATEGORY:EVENT`).
const TRACEPOINT_PROGRAM: &str = rtrace_common::profile::PROG_TRACEPOINT;

/// Where `-e` takes stacks at events, found before anything is attached.
enum Found {
    Tracepoints(Vec<(String, String)>),
    Probe(attach::Resolved),
}

/// The programs that count stacks at probes (`-e p:`, `r:`, `u:`).
const PROBE_PROGRAMS: Programs<'static> = Programs {
    kprobe: rtrace_common::profile::PROG_KPROBE,
    kretprobe: rtrace_common::profile::PROG_KRETPROBE,
    uprobe: rtrace_common::profile::PROG_UPROBE,
    uretprobe: rtrace_common::profile::PROG_URETPROBE,
};

/// Attaches the program to `event` on every CPU in `cpus`.
fn attach(
    prog: &mut PerfEvent,
    event: &Event,
    cpus: &[u32],
    period: Option<u64>,
    freq: u64,
) -> anyhow::Result<()> {
    for &cpu in cpus {
        let policy = match period {
            Some(p) => SamplePolicy::Period(p),
            None => SamplePolicy::Frequency(freq),
        };
        prog.attach(
            event.config(),
            PerfEventScope::AllProcessesOneCpu { cpu },
            policy,
            false,
        )
        .with_context(|| format!("cannot sample {} on CPU {cpu}", event.name()))?;
    }
    Ok(())
}

/// A sampling run: the programs attached, the stacks counted and named,
/// and the outputs written at the end. Its front-ends (profile,
/// stackcount, top) implement the tool and delegate to it.
pub struct Sampler {
    cfg: Sampling,
    /// The scope as the tracer settled it.
    scope: Scope,
    cpus: Vec<u32>,
    freq: u64,
    /// The event sampled: `-e`, or cpu-clock where cycles failed.
    event: Event,
    /// Why hardware cycles were passed over, if they were.
    fallback: Option<String>,
    /// The places `-e` attached to at events (tracepoints, functions,
    /// USDT sites), and what they are; 0 where it samples a counter.
    sites: (usize, &'static str),
    /// USDT probes' perf events, which keep them attached.
    links: Vec<std::os::fd::OwnedFd>,
    /// How a probe spec was attached, for `-v`.
    probe_how: Option<String>,
    /// Ticks so far, for `--interval`.
    ticks: u64,
    /// The program counting at events, to stop before the report.
    event_program: Option<&'static str>,
    /// Processes whose tables were loaded before tracing, and how long
    /// that took (tracepoint mode, system-wide).
    preloaded: Option<(usize, Duration)>,
    /// Stacks counted in the kernel, their walk and their names.
    stacks: StackTool,
    /// The context-switch programs, with `--off-cpu`.
    off_cpu: Option<OffCpu>,
    /// The files asked for, created before anything is attached.
    reports: StackReports,
    /// Time slots the kernel counts samples in: for the heat map, and
    /// kept in a pprof file for `rtrace report --heatmap`; 0 for neither.
    heat_slots: u32,
    /// When sampling began, on `CLOCK_MONOTONIC`: the heat map's and
    /// `--range`'s time zero.
    window_start: u64,
    /// Each sample on its own, with `--firefox` or `--samples`.
    stream: Option<SampleStream>,
    /// The walk's variant the sampling program tail-calls, with the CFI
    /// walk on perf events.
    walkers: Option<Walkers>,
    /// The runtimes whose walk was loaded at the start because the
    /// command runs them, for `-v`.
    command_runtimes: Runtimes,
    /// The runtimes whose walk was loaded at the start of a run over the
    /// whole system because processes of theirs were running, for `-v`.
    running_runtimes: Runtimes,
}

/// The variants of the sampling program with the CFI walk, through
/// native frames only (`PROG_PROFILE_NATIVE`), through one runtime's
/// frames too (`PROG_PROFILE_PYTHON`, `_JAVA`, `_V8`) and through every
/// runtime's (`PROG_PROFILE_RUNTIMES`), and the one in the slot the
/// sampling program tail-calls (`WALKERS`).
///
/// A runtime's walk is most of what the verifier goes through, so a run
/// starts with the native walk unless a runtime is in scope then, and
/// loads the walk through the runtimes in scope, swapped in whole, when a
/// process of a runtime is first given to the kernel's tables: the one
/// runtime's, or every runtime's once a second one comes. The samples
/// taken in between walk that process's native frames only, as its
/// samples before user space had read it always did.
struct Walkers {
    /// The one-slot program array.
    array: ProgramArray<MapData>,
    /// The runtimes of the variant in the slot: none, one, or all.
    loaded: Option<Runtimes>,
    /// Each variant loaded after the start, for `-v`: the runtimes that
    /// asked for it, those it walks, when (since the start), how long its load took and
    /// the instructions the verifier went through.
    later: Vec<(Runtimes, Runtimes, Duration, Duration, Option<u32>)>,
    /// The runtimes in scope whose walk could not be loaded, and why: not
    /// tried again.
    failed: Option<(Runtimes, String)>,
}

impl Walkers {
    /// Takes the object's program array, if it has one (the objects that
    /// walk by CFI).
    fn take(ebpf: &mut Ebpf) -> anyhow::Result<Option<Self>> {
        let Some(map) = ebpf.take_map(rtrace_common::profile::WALKERS) else {
            return Ok(None);
        };
        Ok(Some(Self {
            array: ProgramArray::try_from(map)?,
            loaded: None,
            later: Vec::new(),
            failed: None,
        }))
    }

    /// The variant to load for `wanted` and the runtimes already walked,
    /// if it is neither in the slot nor failed already: one runtime's
    /// walk while only one is in scope, every runtime's after.
    fn pending(&self, wanted: Runtimes) -> Option<Runtimes> {
        let all = (wanted | self.loaded.unwrap_or(0)) & RUNTIMES_ALL;
        let want = if all.count_ones() > 1 {
            RUNTIMES_ALL
        } else {
            all
        };
        let done = self.loaded == Some(want) || (want != 0 && self.failed.is_some());
        (!done).then_some(want)
    }

    /// Puts the variant for `wanted` and the runtimes already walked in
    /// the slot, loading it first; a variant that cannot be loaded after
    /// the start is said once, and the one in the slot kept.
    fn settle(&mut self, ebpf: &mut Ebpf, wanted: Runtimes, at: Duration) -> anyhow::Result<()> {
        let asked = wanted & RUNTIMES_ALL & !self.loaded.unwrap_or(0);
        // Runtimes come into scope after a failed load: said with it.
        if let Some((unwalked, _)) = &mut self.failed {
            *unwalked |= asked;
        }
        let Some(want) = self.pending(wanted) else {
            return Ok(());
        };
        let name = Self::program(want);
        let started = std::time::Instant::now();
        match self.swap_in(ebpf, name) {
            Ok(()) => {}
            Err(e) if self.loaded.is_some() => {
                self.failed = Some((asked, format!("{e:#}")));
                return Ok(());
            }
            Err(e) => return Err(e),
        }
        if let Some(old) = self.loaded.replace(want) {
            let verified = crate::kernel::load::verified_insns_of(ebpf, name);
            self.later
                .push((asked, want, at, started.elapsed(), verified));
            // No sample can reach it any more; one under way keeps it
            // until it returns.
            let prog: &mut PerfEvent = ebpf
                .program_mut(Self::program(old))
                .context("walk variant missing")?
                .try_into()?;
            prog.unload().context("cannot unload the walk replaced")?;
        }
        Ok(())
    }

    /// Loads variant `name` and puts it in the slot.
    fn swap_in(&mut self, ebpf: &mut Ebpf, name: &str) -> anyhow::Result<()> {
        let prog: &mut PerfEvent = ebpf
            .program_mut(name)
            .with_context(|| format!("program {name} missing"))?
            .try_into()?;
        // Loaded at the start beside the process programs, perhaps.
        if prog.fd().is_err() {
            prog.load()
                .with_context(|| format!("cannot load the {name} program"))?;
        }
        let fd = prog.fd()?;
        self.array
            .set(0, fd, 0)
            .with_context(|| format!("cannot put {name} in the sampling program's slot"))
    }

    /// The variant that walks the frames of runtimes `rt`: the native
    /// walk for none, a runtime's own for one, the walk through every
    /// runtime's for more.
    fn program(rt: Runtimes) -> &'static str {
        match rt {
            0 => PROG_PROFILE_NATIVE,
            RUNTIME_PYTHON => PROG_PROFILE_PYTHON,
            RUNTIME_JAVA => PROG_PROFILE_JAVA,
            RUNTIME_V8 => PROG_PROFILE_V8,
            _ => PROG_PROFILE_RUNTIMES,
        }
    }

    /// The runtimes' names in `rt`, for messages ("Python and Java").
    fn named(rt: Runtimes) -> String {
        let names: Vec<&str> = [
            (RUNTIME_PYTHON, "Python"),
            (RUNTIME_JAVA, "Java"),
            (RUNTIME_V8, "JavaScript"),
        ]
        .into_iter()
        .filter(|&(bit, _)| rt & bit != 0)
        .map(|(_, name)| name)
        .collect();
        match names.as_slice() {
            [] => "native".to_owned(),
            [one] => (*one).to_owned(),
            [first @ .., last] => format!("{} and {last}", first.join(", ")),
        }
    }

    /// `-v` lines: the variants loaded after the start.
    fn summary(&self) -> Vec<String> {
        self.later
            .iter()
            .map(|&(asked, loaded, at, took, verified)| {
                let verified = verified
                    .map(|n| format!(", {n} instructions verified"))
                    .unwrap_or_default();
                format!(
                    "program {} (the walk through the runtimes' frames, for {}) loaded {:.2} s in, in {} ms{verified}",
                    Self::program(loaded),
                    Self::named(asked),
                    at.as_secs_f64(),
                    took.as_millis()
                )
            })
            .collect()
    }

    /// A variant that could not be loaded, said with or without `-v`.
    fn warnings(&self) -> Vec<Warning> {
        self.failed
            .iter()
            .map(|(rt, why)| {
                Warning::unwalked(format!(
                    "{} frames are not walked: the walk through them could not be loaded ({why})",
                    Self::named(*rt)
                ))
            })
            .collect()
    }
}

/// A runtime whose walk `--preload-runtime-walks` loads at the start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RuntimeWalk {
    /// CPython's frames.
    Python,
    /// HotSpot's Java frames.
    Java,
    /// V8's JavaScript frames.
    Javascript,
}

impl RuntimeWalk {
    /// The runtimes of `list`, every one for an empty list.
    pub fn runtimes(list: &[Self]) -> Runtimes {
        if list.is_empty() {
            return RUNTIMES_ALL;
        }
        list.iter()
            .map(|r| match r {
                Self::Python => RUNTIME_PYTHON,
                Self::Java => RUNTIME_JAVA,
                Self::Javascript => RUNTIME_V8,
            })
            .fold(0, |a, b| a | b)
    }
}

/// Most heat map slots without a duration: ten minutes.
const MAX_HEAT_SLOTS: u32 = 30_000;

/// What a sampling run does: profile's flags, typed. A front-end builds
/// it from its own flags; its defaults are profile's.
#[derive(Debug, Default)]
pub struct Sampling {
    /// What stacks are taken at.
    pub event: Event,
    /// Samples a second on each CPU (default 49), for counters.
    pub frequency: Option<u64>,
    /// A sample every this many events (for cpu-clock: nanoseconds);
    /// at events, every this many-th.
    pub period: Option<u64>,
    /// Seconds to sample for; `None` until the end of the run.
    pub duration: Option<u64>,
    /// Print the stacks counted every this many seconds and count again.
    pub interval: Option<u64>,
    /// Function names in a probe event are regular expressions.
    pub regexp: bool,
    /// CPUs to sample on; empty for every online CPU.
    pub cpus: Vec<u32>,
    /// User stacks only.
    pub user_only: bool,
    /// Kernel stacks only.
    pub kernel_only: bool,
    /// Count the idle task's stacks too.
    pub include_idle: bool,
    /// How text stacks are written.
    pub text: TextOptions,
    /// Folded stacks on the text output.
    pub folded: bool,
    /// The files and the table asked for.
    pub outputs: StackOutputs,
    /// Count only samples in this range of time after sampling began.
    pub range: Option<(Duration, Duration)>,
    /// Count time off the CPU too, by stack.
    pub off_cpu: bool,
    /// Off the CPU, count only waits of at least this many microseconds
    /// (0: every wait).
    pub off_cpu_min_us: u64,
    /// The runtimes whose walk is loaded at the start, not when a
    /// process of theirs is first met (0 for none).
    pub preload_runtime_walks: Runtimes,
    /// perf annotate's output.
    pub annotate: AnnotateArgs,
    /// The walk, the store and the names.
    pub stacks: StackArgs,
    /// The event buffer.
    pub buffer: BufferArgs,
}

impl Sampler {
    /// bcc's start-up line, on stderr so that stdout holds only stacks.
    pub fn banner(&self) -> String {
        let (cfg, event, freq) = (&self.cfg, &self.event, self.freq);
        let rate = match (event, cfg.period) {
            (e, None) if e.at_events() => format!("Sampling {} at every event", event.name()),
            (_, Some(p)) => format!("Sampling {} every {p} events", event.name()),
            (_, None) => format!("Sampling {} at {freq} Hertz", event.name()),
        };
        let whom = match self.scope.whom() {
            Some(whom) => format!("of {whom}"),
            None => "of all threads".to_owned(),
        };
        let which = if cfg.user_only {
            "user"
        } else if cfg.kernel_only {
            "kernel"
        } else {
            "user + kernel"
        };
        let cpu = match cfg.cpus.as_slice() {
            [] => String::new(),
            [c] => format!(" on CPU#{c}"),
            cs => format!(" on CPUs {cs:?}"),
        };
        let until = match cfg.duration {
            Some(s) => format!(" for {s} secs."),
            None if !self.scope.command.is_empty() => " until it exits.".to_owned(),
            None => "... Hit Ctrl-C to end.".to_owned(),
        };
        format!("{rate} {whom} by {which} stack{cpu}{until}")
    }
}

impl Sampler {
    /// Checks the configuration against the machine (CPUs online, the
    /// sampling rate's limit) and creates the files asked for.
    pub fn new(cfg: Sampling) -> anyhow::Result<Self> {
        let args = &cfg;
        let online =
            online_cpus().map_err(|(what, e)| anyhow::anyhow!("cannot read {what}: {e}"))?;
        if let Some(c) = args.cpus.iter().find(|c| !online.contains(c)) {
            anyhow::bail!("CPU {c} is not online (online: {online:?})")
        }
        // Sampling only the CPUs asked for costs the others nothing.
        let cpus = if args.cpus.is_empty() {
            online
        } else {
            args.cpus.clone()
        };
        // Off-CPU time is weighed against on-CPU samples in time, which a
        // timer's samples measure exactly.
        if args.off_cpu && !(args.event == Event::Cpu || args.event.is_cpu_clock()) {
            anyhow::bail!(
                "--off-cpu weighs samples by time: it samples cpu-clock, not {}",
                args.event.name()
            );
        }
        if args.event.at_events() && args.frequency.is_some() {
            anyhow::bail!(
                "stacks of {} are taken at every event (or every -c N-th): -F paces counters \
                 only",
                args.event.name()
            );
        }
        if args.event.at_events() && args.period.is_some_and(|n| n > u64::from(u32::MAX)) {
            anyhow::bail!("-c N on events counts at most every {}th", u32::MAX);
        }
        if args.frequency.is_some() && args.period.is_some() {
            anyhow::bail!("a frequency and a period both set the sampling rate: give one");
        }
        let freq = args.frequency.unwrap_or(49);
        if args.period.is_none()
            && let Some(max) = max_sample_rate()
            && freq > max
        {
            anyhow::bail!("-F {freq} is above kernel.perf_event_max_sample_rate ({max})");
        }
        if args.interval.is_some()
            && (args.outputs.report
                || args.outputs.svg.is_some()
                || args.outputs.pprof.is_some()
                || args.outputs.speedscope.is_some()
                || args.outputs.heatmap.is_some()
                || args.outputs.html.is_some()
                || args.off_cpu)
        {
            anyhow::bail!(
                "--interval prints stacks as it goes; --report, --off-cpu and files take them \
                 all at the end"
            );
        }
        if !args.outputs.report
            && let Some(flag) = args.outputs.report_opts.changed()
        {
            anyhow::bail!("{flag} shapes perf report's table: add --report");
        }
        if let Some(flag) = args.outputs.per_sample_flag()
            && args.interval.is_some()
        {
            anyhow::bail!("--interval prints stacks as it goes; {flag} takes them at the end");
        }
        let reports = args.outputs.create()?;
        let heat_slots = if args.outputs.heatmap.is_some()
            || args.outputs.pprof.is_some()
            || args.outputs.html.is_some()
        {
            args.duration.map_or(MAX_HEAT_SLOTS, |d| {
                u32::try_from(d.saturating_mul(1_000_000_000 / HEAT_SLOT_NS))
                    .unwrap_or(u32::MAX)
                    .saturating_add(1)
            })
        } else {
            0
        };
        Ok(Self {
            reports,
            heat_slots,
            window_start: 0,
            event: if args.off_cpu {
                Event::cpu_clock()
            } else {
                (args.event).clone()
            },
            off_cpu: args.off_cpu.then(OffCpu::default),
            scope: Scope::default(),
            cfg,
            cpus,
            freq,
            fallback: None,
            sites: (0, ""),
            links: Vec::new(),
            probe_how: None,
            ticks: 0,
            event_program: None,
            preloaded: None,
            stacks: StackTool::default(),
            stream: None,
            walkers: None,
            command_runtimes: 0,
            running_runtimes: 0,
        })
    }

    /// The object's variants, best first. The CFI walk needs helpers of
    /// 5.15; where it cannot load, `auto` keeps the kernel's
    /// frame-pointer walk, and `-v` says why.
    pub fn variants(&self) -> Vec<&'static str> {
        StackTool::variants(self.cfg.stacks.unwind, !self.cfg.kernel_only)
    }

    /// Sets the object's configuration and map sizes.
    pub fn configure(&mut self, kernel: &mut Kernel, load: &mut Load) -> anyhow::Result<()> {
        let heat_slots = self.heat_slots;
        let (range_start, range_end) = self.cfg.range.unwrap_or_default();
        let mut cfg = Config {
            include_idle: u32::from(self.cfg.include_idle),
            user: u32::from(!self.cfg.kernel_only),
            kernel: u32::from(!self.cfg.user_only),
            heat_slots,
            per_thread: u32::from(self.per_thread()),
            every: if self.event.at_events() {
                self.cfg.period.map_or(1, |n| n as u32)
            } else {
                1
            },
            range_start_ns: range_start.as_nanos() as u64,
            range_end_ns: range_end.as_nanos() as u64,
            time_keys: u32::from(self.time_keys()),
            samples: u32::from(self.cfg.outputs.per_sample()),
            ..Config::default()
        };
        load.size(rtrace_common::profile::HEAT, heat_slots.max(1));
        if self.cfg.outputs.per_sample() {
            // At events the rate is the events'; a generous guess.
            let per_second = if self.event.at_events() {
                1_000_000
            } else {
                self.freq.saturating_mul(self.cpus.len() as u64)
            };
            load.size(
                rtrace_common::profile::SAMPLES,
                SampleStream::bytes(per_second),
            );
        }
        let period_ns = self.period_ns();
        let (per_thread, time_keys) = (self.per_thread(), self.time_keys());
        if let Some(off) = &mut self.off_cpu {
            cfg.timed = 1;
            cfg.period_ns = period_ns;
            // Every wait of user threads, whatever its state (waiting to
            // run too): with the samples, their wall time. Kernel threads,
            // which sleep most of the time, would drown the rest.
            let filter = Filter {
                min_ns: self.cfg.off_cpu_min_us.saturating_mul(1000),
                max_ns: u64::MAX,
                user: !self.cfg.kernel_only,
                kernel: !self.cfg.user_only,
                threads: THREADS_USER,
                state: STATE_ANY,
                waker: false,
                sched_frames: false,
                per_thread,
                time_keys,
            };
            let m = OffCpu::mechanism(kernel)?;
            cfg.off_cpu = off.configure(filter, m, kernel, load)?;
            cfg.off_cpu.mark_switches = 1;
            if self.cfg.outputs.per_sample() {
                // The waits too, into the same files as the samples.
                OffCpu::send_each(&mut cfg.off_cpu, load);
            }
        }
        self.stacks.configure(&self.cfg.stacks, kernel, load)?;
        if self.scope.covers_self() {
            self.stacks.prepare_self();
        }
        self.stacks
            .names_later_in(self.cfg.outputs.pprof.as_deref());
        if self.exact_leaves() {
            self.stacks.exact_leaves();
        }
        load.config(&cfg);
        Ok(())
    }

    /// Attaches the sampling or counting programs (and off-CPU's).
    pub fn attach(&mut self, kernel: &mut Kernel, ebpf: &mut Ebpf) -> anyhow::Result<()> {
        // A command's libraries are mapped right after the start: its
        // tables are read at the hook's first call then.
        if self.scope.command.is_empty() && !self.event.at_events() {
            self.stacks.hook_loader_later();
        }
        if !self.event.at_events() {
            self.walkers = Walkers::take(ebpf)?;
            self.find_runtimes();
            self.load_walk_beside(kernel, ebpf)?;
        }
        self.stacks.attach(ebpf, &self.scope.pids)?;
        if self.cfg.outputs.per_sample() {
            let mut stream = SampleStream::take(ebpf)?;
            if self.off_cpu.is_some() {
                // Counted with OFF_CPU added to their keys.
                stream = stream.with_intervals(ebpf, true)?;
            }
            self.stream = Some(stream);
            self.stacks.keep_names();
        }
        if self.event.at_events() {
            // Found first: a bad spec fails before the tables are loaded.
            let pid = self.scope.one_pid();
            let found = match &self.event {
                Event::Tracepoint { category, event } => {
                    let root = crate::kernel::tracefs::root()?;
                    Found::Tracepoints(event::tracepoints(&root, category, event)?)
                }
                Event::Probe(spec) => {
                    let names = if self.cfg.regexp {
                        attach::Names::Regex
                    } else {
                        attach::Names::Glob
                    };
                    Found::Probe(attach::resolve(kernel, spec, names, pid)?)
                }
                _ => unreachable!("at_events"),
            };
            // A rare event's first in a process must not wait for the
            // process's tables: load every running process's now.
            // (A command of its own starts after this: it gets its tables
            // at its exec.)
            if !self.scope.tasks_named() {
                let started = std::time::Instant::now();
                eprintln!("rtrace: loading the unwind tables of every running process...");
                let n = self.stacks.preload_all()?;
                self.preloaded = Some((n, started.elapsed()));
            }
            self.stacks.absorb_self()?;
            self.set_window(ebpf)?;
            match found {
                Found::Tracepoints(tracepoints) => {
                    // One program, loaded once by the hooks, for them all.
                    let mut hooks = Hooks::new(Mechanism::Tracepoint, kernel)?;
                    for (c, e) in &tracepoints {
                        hooks.attach(ebpf, TRACEPOINT_PROGRAM, c, e)?;
                    }
                    self.sites = (tracepoints.len(), "tracepoint(s)");
                    self.event_program = Some(TRACEPOINT_PROGRAM);
                }
                Found::Probe(resolved) => {
                    let attached = resolved.attach(ebpf, kernel, &PROBE_PROGRAMS, pid)?;
                    self.links = attached.links;
                    self.probe_how = Some(attached.how);
                    let (kind, program) = match &resolved {
                        attach::Resolved::Kernel { ret: false, .. } => {
                            ("function(s)", PROBE_PROGRAMS.kprobe)
                        }
                        attach::Resolved::Kernel { ret: true, .. } => {
                            ("function(s)", PROBE_PROGRAMS.kretprobe)
                        }
                        attach::Resolved::User { ret: false, .. } => {
                            ("function(s)", PROBE_PROGRAMS.uprobe)
                        }
                        attach::Resolved::User { ret: true, .. } => {
                            ("function(s)", PROBE_PROGRAMS.uretprobe)
                        }
                        attach::Resolved::Usdt(..) => ("USDT site(s)", PROBE_PROGRAMS.uprobe),
                    };
                    self.sites = (attached.sites, kind);
                    self.event_program = Some(program);
                }
            }
            return Ok(());
        }
        // Before time zero: the context-switch programs take the verifier
        // a while to load, which the heat map would show as empty time.
        if let Some(off) = &mut self.off_cpu {
            let m = OffCpu::mechanism(kernel)?;
            off.attach(m, kernel, ebpf)?;
        }
        let prog: &mut PerfEvent = ebpf
            .program_mut(rtrace_common::profile::PROG_PROFILE)
            .context("program profile missing")?
            .try_into()?;
        prog.load().context("cannot load the profile program")?;
        // With the CFI walk, that program tail-calls the walk for the
        // runtimes in scope now: the processes given (`-p`) have been
        // read; the others are read at their first samples.
        let now = self.runtimes_now();
        if let Some(w) = &mut self.walkers {
            let want = w.pending(now);
            if let Err(e) = w.settle(ebpf, now, Duration::ZERO) {
                // The running processes' runtimes are a guess: the run
                // starts without them, as it would have, and says why
                // with the other walk that failed to load.
                let Some(want) = want.filter(|_| self.running_runtimes != 0) else {
                    return Err(e);
                };
                w.failed = Some((now & RUNTIMES_ALL, format!("{e:#}")));
                self.running_runtimes = 0;
                w.settle(ebpf, now & !want, Duration::ZERO)?;
            }
        }
        self.set_window(ebpf)?;
        // The walks are loaded: rtrace's own tables, compiled beside them,
        // go in before the first sample.
        self.stacks.absorb_self()?;
        let prog: &mut PerfEvent = ebpf
            .program_mut(rtrace_common::profile::PROG_PROFILE)
            .context("program profile missing")?
            .try_into()?;
        let (period, freq) = (self.cfg.period, self.freq);
        if let Err(e) = attach(prog, &self.event, &self.cpus, period, freq) {
            if self.event != Event::Cpu {
                let hint = if self.event.is_hardware() {
                    pmu_hint()
                } else {
                    ""
                };
                return Err(e.context(format!(
                    "event {} is not available{hint}",
                    self.event.name()
                )));
            }
            // cpu-clock straight away: the probe of software events (which
            // spins 25 ms to see one fire) only says why, if it fails too.
            // The sampler's event stays as asked until then: a failed
            // attach is tried again with the next object variant.
            let clock = Event::cpu_clock();
            if let Err(failed) = attach(prog, &clock, &self.cpus, period, freq) {
                if let Err(why) = kernel.check(Mechanism::PerfEventSoftware) {
                    if let Some(refused) = crate::kernel::privs::perf_events_refused() {
                        return Err(e.context(refused));
                    }
                    return Err(e.context(format!("and software perf events fail too: {why}")));
                }
                return Err(failed);
            }
            self.fallback = Some(format!("{e:#}"));
            self.event = clock;
        }
        Ok(())
    }

    /// The runtimes whose processes are in scope before any is sampled:
    /// a command's (`-- node app.js`, a script whose `#!` names python3),
    /// whose first samples are then walked whole; over the whole system,
    /// those whose programs run now, not to take their first samples
    /// while the verifier works, at the cost of a later start. Neither
    /// for a runtime turned off (`--no-javascript`): its processes are
    /// walked as native ones, by the native walk. (Named processes are
    /// read by [`StackTool::attach`]; a cgroup's, or those a bcc map
    /// chooses, are found at their first samples.)
    fn find_runtimes(&mut self) {
        if self.walkers.is_none() || self.cfg.preload_runtime_walks == RUNTIMES_ALL {
            return;
        }
        let walkable = self.stacks.walkable();
        self.command_runtimes = match self.scope.command.first() {
            Some(argv0) => {
                let path = std::env::var_os("PATH").unwrap_or_default();
                crate::stacks::runtimes::of_command(argv0, &path) & walkable
            }
            None => 0,
        };
        self.running_runtimes = if self.scope.whole_system() {
            crate::stacks::runtimes::of_running() & walkable
        } else {
            0
        };
    }

    /// The runtimes whose walk the sampling program needs now.
    fn runtimes_now(&self) -> Runtimes {
        self.cfg.preload_runtime_walks
            | self.stacks.runtimes()
            | self.command_runtimes
            | self.running_runtimes
    }

    /// Loads the walk at once with the exec, fork and exit programs, and
    /// with `--off-cpu` the context switch's (`kernel::load::load_beside`):
    /// the walk's verifier time, most of the start, then goes by beside
    /// theirs. Only where the walk is known before any process is read: a
    /// `-p` run's runtimes are known once [`StackTool::attach`] has read
    /// its processes, and its programs are loaded one by one, as before.
    fn load_walk_beside(&mut self, kernel: &mut Kernel, ebpf: &mut Ebpf) -> anyhow::Result<()> {
        let Some(w) = &self.walkers else {
            return Ok(());
        };
        if !self.scope.pids.is_empty() {
            return Ok(());
        }
        let Some(want) = w.pending(self.runtimes_now()) else {
            return Ok(());
        };
        let mut names: Vec<(String, Option<&'static str>)> =
            vec![(Walkers::program(want).to_owned(), None)];
        names.extend(
            self.stacks
                .process_programs()
                .iter()
                .map(|n| ((*n).to_owned(), None)),
        );
        let mut btf = None;
        if let Some(off) = &self.off_cpu {
            let m = OffCpu::mechanism(kernel)?;
            let programs = off.programs_with(m);
            // A tp_btf program's load takes its tracepoint and the type
            // ids, which cover every event asked for so far: the last
            // call's cover them all.
            if m == Mechanism::TpBtf {
                for (_, event) in &programs {
                    kernel.attach_ids(AttachTarget::Tracepoint(event))?;
                }
                btf = Some(kernel.attach_ids(AttachTarget::Tracepoint(programs[0].1))?);
            }
            let typed = btf.is_some();
            names.extend(programs.into_iter().map(|(n, e)| (n, typed.then_some(e))));
        }
        crate::kernel::load::load_beside(ebpf, &names, btf);
        Ok(())
    }

    /// What was attached, for `-v`.
    pub fn describe(&self) -> String {
        let off = self
            .off_cpu
            .as_ref()
            .map(|o| format!(", off-CPU time at {}", o.describe()))
            .unwrap_or_default();
        let on = if self.sites.0 > 0 {
            format!("{} {}", self.sites.0, self.sites.1)
        } else {
            format!("perf events on {} CPU(s)", self.cpus.len())
        };
        format!(
            "{on}{off}; {}; stacks named by their own 64-bit hash",
            self.stacks.describe()
        )
    }

    /// More `-v` lines: the event sampled, how probes attached.
    pub fn notes(&self) -> Vec<String> {
        let mut notes = vec![match &self.fallback {
            Some(why) => format!(
                "sampling cpu-clock, a software timer: hardware cycles failed ({why}){}",
                pmu_hint()
            ),
            None => format!("sampling {}", self.event.name()),
        }];
        notes.extend(self.probe_how.iter().map(|how| format!("attached {how}")));
        if self.command_runtimes != 0 {
            notes.push(format!(
                "the command runs {}: the walk through its frames loaded before it starts",
                Walkers::named(self.command_runtimes)
            ));
        }
        if self.running_runtimes != 0 {
            notes.push(format!(
                "{} processes are running: the walk through their frames loaded before sampling",
                Walkers::named(self.running_runtimes)
            ));
        }
        if let Some((n, took)) = self.preloaded {
            notes.push(format!(
                "the tables of {n} running processes loaded before tracing, in {:.2} s",
                took.as_secs_f64()
            ));
        }
        if self.cfg.outputs.heatmap.is_some() || self.cfg.range.is_some() || self.time_keys() {
            notes.push(format!(
                "time zero of the heat map and --range: CLOCK_MONOTONIC {} ns",
                self.window_start
            ));
        }
        notes
    }

    /// Every second the kernel's tables are moved out, so that they never
    /// fill; nothing is printed until the end.
    pub fn interval(&self) -> Schedule {
        Schedule::Every {
            period: Duration::from_secs(1),
            count: None,
        }
    }

    /// Moves the kernel's tables out; prints an `--interval`'s stacks.
    pub fn tick(&mut self, ebpf: &mut Ebpf, sink: &mut Sink, last: bool) -> anyhow::Result<()> {
        if let Some(stream) = &mut self.stream {
            stream.read();
        }
        self.stacks.tick(ebpf, last)?;
        if !last {
            // The tick may have given the kernel a process of a runtime
            // new to the run: its walk is loaded now, not at the next
            // event.
            self.after_events(ebpf)?;
        }
        if let Some(every) = self.cfg.interval
            && !last
        {
            self.ticks += 1;
            if self.ticks.is_multiple_of(every) {
                // The last interval is the report at the end.
                let samples = self.stacks.interval(ebpf)?;
                self.print_stacks(sink, &samples)?;
                sink.separate()?;
                sink.flush()?;
            }
        }
        Ok(())
    }

    /// Runs as tracing starts.
    pub fn start(&mut self) {
        self.stacks.start(!self.cfg.user_only);
    }

    /// Handles one record of the walk's process events.
    pub fn event(&mut self, record: &[u8]) -> anyhow::Result<()> {
        self.stacks.event(record)
    }

    /// After a batch of events: the loader hook, after the first; the
    /// walk through the frames of a runtime just come into scope, loaded
    /// and swapped in.
    pub fn after_events(&mut self, ebpf: &mut Ebpf) -> anyhow::Result<()> {
        self.stacks.attach_later(ebpf);
        self.stacks.look_again();
        let Some(w) = &mut self.walkers else {
            return Ok(());
        };
        if w.pending(self.stacks.runtimes()).is_some() && self.scope.covers_self() {
            // rtrace is sampled too while the verifier works, and its own
            // stacks are walked whole only from its tables.
            self.stacks.walk_self()?;
        }
        w.settle(ebpf, self.stacks.runtimes(), self.stacks.elapsed())?;
        Ok(())
    }

    /// Stops sampling and writes every output.
    pub fn finish(&mut self, ebpf: &mut Ebpf, sink: &mut Sink) -> anyhow::Result<()> {
        let elapsed = self.stacks.elapsed();
        // Stop sampling before reading, so the report is one consistent cut.
        if let Some(name) = self.event_program {
            // Every kind of program unloads alike: by its links.
            let prog = ebpf
                .program_mut(name)
                .with_context(|| format!("program {name} missing"))?;
            match prog {
                aya::programs::Program::TracePoint(p) => p.unload(),
                aya::programs::Program::KProbe(p) => p.unload(),
                aya::programs::Program::UProbe(p) => p.unload(),
                _ => Ok(()),
            }
            .context("cannot stop counting")?;
            self.links.clear();
        } else {
            let prog: &mut PerfEvent = ebpf
                .program_mut(rtrace_common::profile::PROG_PROFILE)
                .context("program profile missing")?
                .try_into()?;
            prog.unload().context("cannot stop sampling")?;
        }
        if let Some(off) = &self.off_cpu {
            off.stop(ebpf)?;
        }
        let heat = self.heat_counts(ebpf, elapsed)?;
        self.write_heatmap(heat.as_deref())?;
        if let Some(stream) = &mut self.stream {
            stream.read();
        }
        let mut exact = self.stacks.finish(ebpf)?;
        self.write_per_sample()?;
        if self.off_cpu.is_some() {
            // One measure for both: samples count the nanoseconds of CPU
            // time they stand for (`Config::timed`), and time off the CPU
            // is counted in nanoseconds.
            exact = stacks::in_micros(exact);
        }
        // `exact` keeps what pprof, annotate and a table by thread need;
        // the other outputs print each stack once.
        let samples = if self.exact_leaves() || self.per_thread() || self.time_keys() {
            stacks::merge(exact.clone(), false)
        } else {
            std::mem::take(&mut exact)
        };
        self.write_files(&samples, &exact, heat.as_deref(), elapsed)?;
        if let Some(file) = self.reports.html.take() {
            self.write_page(ebpf, file, &exact, &samples)?;
        }
        let unit = if self.off_cpu.is_some() {
            "us on and off CPU"
        } else {
            "samples"
        };
        if self.cfg.outputs.report || self.cfg.annotate.wanted() {
            if self.cfg.outputs.report {
                let u = if self.off_cpu.is_some() {
                    "us"
                } else {
                    "samples"
                };
                let counted = if self.per_thread() { &exact } else { &samples };
                sink.emit(&Report::new(
                    counted,
                    &self.cfg.outputs.report_opts,
                    &self.event.name(),
                    u,
                ))?;
            }
            if self.cfg.annotate.wanted() {
                sink.emit(&annotate::annotate(
                    &exact,
                    &self.cfg.annotate,
                    Some(&self.event.name()),
                )?)?;
            }
            self.stacks.reported(&samples, unit);
            return Ok(());
        }
        self.print_stacks(sink, &samples)?;
        self.stacks.reported(&samples, unit);
        Ok(())
    }

    /// `-v` lines about the run.
    pub fn summary(&self) -> Vec<String> {
        let mut lines = self.stacks.summary();
        lines.extend(self.walkers.iter().flat_map(Walkers::summary));
        lines
    }

    /// What the run could not do as asked.
    pub fn warnings(&self) -> Vec<Warning> {
        let mut warnings = self.stacks.warnings();
        warnings.extend(self.walkers.iter().flat_map(Walkers::warnings));
        warnings
    }

    /// The event buffer's flags.
    pub fn events(&self) -> &BufferArgs {
        &self.cfg.buffer
    }

    /// Seconds to sample for, if given.
    pub fn duration(&self) -> Option<u64> {
        self.cfg.duration
    }

    /// Takes the scope as the tracer settled it: the processes to walk,
    /// the one process probes attach to, whether running processes'
    /// tables are loaded before tracing.
    pub fn scoped(&mut self, scope: &Scope) {
        self.scope = scope.clone();
    }

    /// Prints stacks as text or folded lines (or nothing, where files are
    /// the output).
    fn print_stacks(&self, sink: &mut Sink, samples: &[Sample]) -> anyhow::Result<()> {
        let text = TextOptions {
            delimiter: self.cfg.text.delimiter,
            annotate: self.cfg.text.annotate,
        };
        let files = self.cfg.outputs.files();
        let value = if self.off_cpu.is_some() {
            "us"
        } else {
            "count"
        };
        Stacks::print(sink, samples, text, self.cfg.folded, files, value)
    }

    /// The kernel's samples by time slot, up to the end of sampling, where
    /// they were counted.
    /// The stacks counted since the last call, named: for a live view
    /// (`rtrace top`) that reads them every refresh.
    pub fn take_interval(&mut self, ebpf: &mut Ebpf) -> anyhow::Result<Vec<Sample>> {
        self.stacks.tick(ebpf, false)?;
        self.stacks.interval(ebpf)
    }

    /// Closes the files no process being named maps any more, after an
    /// interval taken ([`Sampler::take_interval`]) by a run that lasts.
    pub fn close_unused_files(&mut self) -> usize {
        self.stacks.close_unused_files()
    }

    fn heat_counts(&self, ebpf: &Ebpf, elapsed: Duration) -> anyhow::Result<Option<Vec<u64>>> {
        if self.heat_slots == 0 {
            return Ok(None);
        }
        let used = (elapsed.as_nanos() as u64)
            .div_ceil(HEAT_SLOT_NS)
            .min(u64::from(self.heat_slots)) as u32;
        let heat: aya::maps::PerCpuArray<_, u32> = aya::maps::PerCpuArray::try_from(
            crate::kernel::load::map(ebpf, rtrace_common::profile::HEAT)?,
        )?;
        let counts: Vec<u64> = (0..used)
            .map(|i| Ok(heat.get(&i, 0)?.iter().map(|&n| u64::from(n)).sum()))
            .collect::<anyhow::Result<_>>()?;
        Ok(Some(counts))
    }

    /// Writes the heat map, if asked for, from the kernel's slot counts.
    fn write_heatmap(&mut self, counts: Option<&[u64]>) -> anyhow::Result<()> {
        let (Some(file), Some(counts)) = (self.reports.heatmap.take(), counts) else {
            return Ok(());
        };
        let used = counts.len() as u32;
        let total: u64 = counts.iter().sum();
        let title = format!("rtrace profile: samples over time ({})", self.event.name());
        let what = format!(
            "{} samples in {} s",
            files::thousands(total),
            used.div_ceil(50)
        );
        let start = self.window_start;
        file.write(&what, |out| {
            crate::output::heatmap::write_svg(counts, HEAT_SLOT_NS, start, &title, out)
                .map_err(Into::into)
        })
    }

    /// Whether stacks keep their leaves at their exact sampled addresses:
    /// annotate and pprof's locations need them.
    fn exact_leaves(&self) -> bool {
        self.cfg.annotate.wanted() || self.cfg.outputs.pprof.is_some()
    }

    /// The places `-e` attached to at events (0 where it samples a
    /// counter).
    pub fn sites(&self) -> usize {
        self.sites.0
    }

    /// Sets time zero, just before the first sample can come.
    fn set_window(&mut self, ebpf: &mut Ebpf) -> anyhow::Result<()> {
        self.window_start = self.stacks.set_time_zero(ebpf, self.time_keys())?;
        Ok(())
    }

    /// Whether stacks are counted by time slot: for the page's ranges of
    /// time, and for a pprof's time labels, which `rtrace report --html`
    /// draws its heat map from.
    fn time_keys(&self) -> bool {
        self.cfg.outputs.html.is_some() || self.cfg.outputs.pprof.is_some()
    }

    /// Whether samples are counted by thread: for a report that sorts or
    /// filters by thread, and for a pprof, which keeps each sample's
    /// thread for a later one. Otherwise a process's threads share their
    /// counts, as the kernel keeps fewer of them.
    fn per_thread(&self) -> bool {
        self.cfg.outputs.report_opts.by_thread() || self.cfg.outputs.pprof.is_some()
    }

    /// The CPU time one cpu-clock sample stands for.
    fn period_ns(&self) -> u64 {
        self.cfg.period.unwrap_or(1_000_000_000 / self.freq)
    }

    /// Writes the page (`--html`) of `exact`, counted by time slot;
    /// `merged` is each stack once, as the line announcing it counts them.
    fn write_page(
        &self,
        ebpf: &Ebpf,
        file: crate::output::files::ReportFile,
        exact: &[Sample],
        merged: &[Sample],
    ) -> anyhow::Result<()> {
        let (title, unit, total) = if self.off_cpu.is_some() {
            (
                "rtrace profile: on- and off-CPU time".to_owned(),
                "us",
                "Time (us)",
            )
        } else {
            (
                format!("rtrace profile: {}", self.event.name()),
                "samples",
                "Samples",
            )
        };
        let facts = vec![
            ("Events".to_owned(), self.event.name()),
            ("Rate".to_owned(), self.rate()),
        ];
        let page = self
            .stacks
            .page(ebpf, title, unit, exact, [total, "Lost samples"], facts)?;
        file.write(&files::held(merged, unit), |out| {
            crate::output::html::write(&page, out)
        })
    }

    /// Writes `--firefox` and `--samples`, from the per-sample stream
    /// named by the counts just settled.
    fn write_per_sample(&mut self) -> anyhow::Result<()> {
        let Some(stream) = &self.stream else {
            return Ok(());
        };
        let (timed, unnamed) = self.stacks.timed(stream.records(), &mut Some);
        if unnamed > 0 {
            Warning::unsupported(format!(
                "{unnamed} samples and waits sent on their own were not counted (the count \
                 table was full; raise --hash-storage-size): --firefox and --samples leave them \
                 out"
            ))
            .print();
        }
        let waits = timed.iter().filter(|t| t.sample.off_cpu).count() as u64;
        let what = if self.off_cpu.is_some() {
            format!(
                "{} samples, {} waits",
                files::thousands(timed.len() as u64 - waits),
                files::thousands(waits)
            )
        } else {
            format!("{} samples", files::thousands(timed.len() as u64))
        };
        let meta = stacks::firefox::Meta {
            product: format!("rtrace profile: {} at {}", self.event.name(), self.rate()),
            // With --off-cpu, samples weigh the CPU time they stand for
            // and waits their time off it, in nanoseconds.
            unit: if self.off_cpu.is_some() {
                stacks::firefox::Unit::Nanoseconds
            } else {
                stacks::firefox::Unit::Samples
            },
            interval_ns: self.period_ns(),
            start_ns: self.stacks.started_nanos(),
        };
        self.reports.write_each(&timed, &meta, &what)?;
        Ok(())
    }

    /// The sampling rate as the outputs name it.
    fn rate(&self) -> String {
        match (&self.event, self.cfg.period) {
            (e, None) if e.at_events() => "every event".to_owned(),
            (_, Some(p)) => format!("every {p} events"),
            (_, None) => format!("{} Hz", self.freq),
        }
    }

    /// Writes the files asked for.
    /// `exact`: the samples with their leaves at their exact addresses,
    /// for pprof's locations.
    fn write_files(
        &mut self,
        samples: &[Sample],
        exact: &[Sample],
        heat: Option<&[u64]>,
        elapsed: Duration,
    ) -> anyhow::Result<()> {
        // The run's facts for a later page, and its samples by time.
        let mut comments: Vec<String> = crate::output::html::run_facts()
            .iter()
            .chain([&("Rate".to_owned(), self.rate())])
            .map(|(k, v)| stacks::pprof::fact_comment(k, v))
            .collect();
        // Cut-short stacks are samples too: the file says how many there
        // were, as each carries the `cut_short` label.
        comments.extend(
            self.stacks
                .cut_short_summary()
                .map(|s| stacks::pprof::fact_comment("Cut short", &s)),
        );
        comments
            .extend(heat.map(|h| stacks::pprof::heat_comment(h, HEAT_SLOT_NS, self.window_start)));
        let args = &self.cfg;
        let lines = args.stacks.lines;
        let (event, freq) = (&self.event, self.freq);
        let rate = self.rate();
        let unit = if args.off_cpu { "us" } else { "samples" };
        let what = files::held(samples, unit);
        if let Some(file) = self.reports.svg.take() {
            let (title, count_name) = if args.off_cpu {
                (
                    format!("rtrace profile: on- and off-CPU time ({rate})"),
                    "us",
                )
            } else {
                (
                    format!("rtrace profile: {} at {rate}", event.name()),
                    "samples",
                )
            };
            let opts = FlameOptions {
                title,
                icicle: args.outputs.icicle,
                count_name: count_name.to_owned(),
                palette: FlameOptions::by_kind(),
            };
            file.write(&what, |out| stacks::write_svg(samples, out, &opts))?;
        }
        if args.off_cpu
            && let Some(file) = self.reports.pprof.take()
        {
            let meta = stacks::pprof::Meta {
                types: &[("on_cpu", "microseconds"), ("off_cpu", "microseconds")],
                values: &|_, s: &Sample| {
                    if s.off_cpu {
                        vec![0, s.count]
                    } else {
                        vec![s.count, 0]
                    }
                },
                period_type: ("cpu", "nanoseconds"),
                period: self.period_ns(),
                time_nanos: self.stacks.started_nanos(),
                duration_nanos: elapsed.as_nanos() as u64,
                comments: &comments,
            };
            file.write(&what, |out| stacks::pprof::write(exact, out, &meta, lines))?;
        } else if let Some(file) = self.reports.pprof.take() {
            // A cpu-clock sample at F Hz stands for 1/F s of CPU time; other
            // events are counted in events.
            let (unit, period) = match (event.is_cpu_clock(), args.period) {
                (true, Some(p)) => ("nanoseconds", p),
                (true, None) => ("nanoseconds", 1_000_000_000 / freq),
                (false, Some(p)) => ("count", p),
                (false, _) => ("count", 1),
            };
            let name = event.name();
            let event = if event.is_cpu_clock() { "cpu" } else { &name };
            let meta = stacks::pprof::Meta {
                types: &[("samples", "count"), (event, unit)],
                values: &|_, s: &Sample| vec![s.count, s.count.saturating_mul(period)],
                period_type: (event, unit),
                period,
                time_nanos: self.stacks.started_nanos(),
                duration_nanos: elapsed.as_nanos() as u64,
                comments: &comments,
            };
            file.write(&what, |out| stacks::pprof::write(exact, out, &meta, lines))?;
        }
        if let Some(file) = self.reports.speedscope.take() {
            let unit = if args.off_cpu { "microseconds" } else { "none" };
            let name = format!("rtrace profile ({rate})");
            file.write(&what, |out| {
                stacks::write_speedscope(samples, out, &name, unit)
            })?;
        }
        Ok(())
    }
}

//! `rtrace profile`: CPU profiling by timed sampling of stacks, as bcc's
//! profile does it, with symbolized kernel, user and JIT frames, and flame
//! graph, pprof and speedscope files.

use crate::kernel::warning::Warning;
use crate::tracer::{ScopeArgs, own};
use std::{path::PathBuf, time::Duration};

use anyhow::Context as _;
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
    profile::{Config, ERR_NAMES, HEAT_SLOT_NS},
};

use crate::{
    engine::{
        offcpu::{Filter, OffCpu},
        stacktool::{StackArgs, StackTool},
    },
    kernel::{
        features::Mechanism,
        load::{Hooks, Kernel, Load},
        transport::BufferArgs,
    },
    output::{
        Schedule, Sink,
        files::{self, StackReports},
        stacks::{
            self, FlameOptions, Stacks, TextOptions,
            annotate::{self, AnnotateArgs},
            report::{Report, ReportArgs},
        },
    },
    probes::{
        attach::{self, Programs},
        event,
    },
    stacks::sample::Sample,
    tracer::{Scope, Tool},
};

/// What `-e` samples on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// CPU time: hardware cycles where there is a PMU, else cpu-clock.
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

/// `-e`'s value, boxed: the arguments of every tool are one enum, which
/// should not grow by a spec's strings.
fn parse_event_arg(text: &str) -> Result<Box<Event>, String> {
    parse_event(text).map(Box::new)
}

/// `-e`'s value: `cpu`, or an event spec (`probes::event`).
fn parse_event(text: &str) -> Result<Event, String> {
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
    fn cpu_clock() -> Self {
        event::Counter::named("cpu-clock").map_or(Self::Cpu, Self::Counter)
    }

    fn is_cpu_clock(&self) -> bool {
        matches!(self, Self::Counter(c) if c.kind == event::TYPE_SOFTWARE && c.config == 0)
    }

    fn config(&self) -> PerfEventConfig {
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

    fn name(&self) -> String {
        match self {
            Self::Cpu => "cycles".to_owned(),
            Self::Counter(c) => c.display(),
            Self::Tracepoint { category, event } => format!("{category}:{event}"),
            Self::Probe(p) => p.to_string(),
        }
    }

    /// Whether stacks are taken at events (tracepoints, probes), every
    /// one or every `-c N`-th, rather than by a counter's period.
    fn at_events(&self) -> bool {
        matches!(self, Self::Tracepoint { .. } | Self::Probe(_))
    }

    fn is_hardware(&self) -> bool {
        match self {
            Self::Cpu => true,
            Self::Counter(c) => c.hardware(),
            Self::Tracepoint { .. } | Self::Probe(_) => false,
        }
    }
}

/// Profile CPU usage by sampling stack traces at a timed interval.
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:
  rtrace profile                  # profile stacks at 49 Hertz until Ctrl-C
  rtrace profile -F 99            # profile stacks at 99 Hertz
  rtrace profile -c 1000000       # profile stacks every 1 in a million events
  rtrace profile 5                # profile at 49 Hertz for 5 seconds only
  rtrace profile -f 5             # output in folded format for flame graphs
  rtrace profile -p 185           # only profile process with PID 185
  rtrace profile -L 185           # only profile thread with TID 185
  rtrace profile -U               # only show user space stacks (no kernel)
  rtrace profile -K               # only show kernel space stacks (no user)
  rtrace profile --svg cpu.svg 10 # a flame graph of 10 seconds
  rtrace profile -e page-faults   # where page faults happen
  rtrace profile --off-cpu -p 185 --svg wall.svg 10   # on- and off-CPU time in one graph
  rtrace profile -F 99 -- ./prog  # run ./prog, profile it and what it starts until it exits
  rtrace profile --svg build.svg -- make -j2   # a flame graph of a whole build")]
pub struct Args {
    /// Profile for this many seconds; without it, until Ctrl-C (not with
    /// -- CMD, which says when to stop).
    #[arg(value_parser = crate::output::at_least_one::<u64>)]
    duration: Option<u64>,
    /// Print the stacks counted every SECS seconds and count again from
    /// zero, as bcc's stackcount -i (text and folded output).
    #[arg(long, value_name = "SECS", value_parser = crate::output::at_least_one::<u64>)]
    interval: Option<u64>,
    /// Function names in a probe -e are regular expressions, not globs
    /// (bcc stackcount's -r).
    #[arg(long, hide = true)]
    regexp: bool,
    /// Sample this many times per second on each CPU (default 49).
    #[arg(short = 'F', long, value_name = "HZ", conflicts_with = "period",
          value_parser = crate::output::at_least_one::<u64>)]
    frequency: Option<u64>,
    /// -c N samples once every N events, as bcc's profile; -c PATH profiles
    /// tasks in that cgroup v2 directory, or below it, only, as the other
    /// tools' -c.
    #[arg(short = 'c', value_name = "N|PATH", value_parser = period_or_cgroup)]
    c: Option<PeriodOrCgroup>,
    /// Sample once every PERIOD events (for cpu-clock: nanoseconds).
    #[arg(long, conflicts_with = "c", value_parser = crate::output::at_least_one::<u64>)]
    period: Option<u64>,
    #[command(flatten)]
    sets: crate::tracer::PinnedSets,
    #[command(flatten)]
    scope: ScopeArgs<{ own::A | own::C }>,
    /// Show stacks from user space only (no kernel space stacks).
    #[arg(short = 'U', long = "user-stacks-only", conflicts_with = "kernel_only")]
    user_only: bool,
    /// Show stacks from kernel space only (no user space stacks).
    #[arg(short = 'K', long = "kernel-stacks-only")]
    kernel_only: bool,
    /// Include the CPU idle stacks (pid 0).
    #[arg(short = 'I', long = "include-idle")]
    include_idle: bool,
    /// Insert a delimiter between kernel and user stacks.
    #[arg(short = 'd', long = "delimited")]
    delimited: bool,
    /// Print folded stacks (`comm;frames.. count`), as flame graph tools read them.
    #[arg(short = 'f', long)]
    folded: bool,
    /// Add `_[k]` to kernel frames, `_[j]` to JIT frames and `_[i]` to
    /// inlined ones in text output.
    #[arg(short = 'a', long = "annotations")]
    annotate: bool,
    /// The event to sample on: cpu (cycles where there is a PMU, else
    /// cpu-clock), any perf counter (cpu-clock, page-faults, cs, cycles,
    /// instructions, LLC-loads, ...: a sample every -c N events, or -F
    /// times a second), or tracepoints (sched:sched_switch,
    /// 'block:block_rq_*', bcc's t:CATEGORY:EVENT): stacks at every event.
    #[arg(short = 'e', long, value_name = "EVENT", default_value = "cpu",
          value_parser = parse_event_arg)]
    event: Box<Event>,
    /// Write a flame graph (SVG) to FILE.
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
    /// Draw the flame graph upside down, as an icicle graph.
    #[arg(long, requires = "svg")]
    icicle: bool,
    /// Write a gzipped pprof profile (profile.proto) to FILE.
    #[arg(long, value_name = "FILE")]
    pprof: Option<PathBuf>,
    /// Write a speedscope profile (JSON) to FILE.
    #[arg(long, value_name = "FILE")]
    speedscope: Option<PathBuf>,
    /// Write a sub-second heat map (SVG) to FILE, as FlameScope draws it:
    /// a column per second, a row per 20 ms, each cell coloured by its
    /// samples. Counted in the kernel, slot by slot, with no event per
    /// sample; at most the first 10 minutes without a duration.
    #[arg(long, value_name = "FILE")]
    heatmap: Option<PathBuf>,
    /// Write one self-contained page (HTML) to FILE: the heat map, where
    /// dragging over cells selects a range of time; the flame graph of
    /// the run or of that range, with zoom, search and an icicle view;
    /// perf report's table; and the run's facts. It loads nothing from
    /// the network. Stacks are counted by 20 ms slot for it.
    #[arg(long, value_name = "FILE")]
    html: Option<PathBuf>,
    /// Count only the samples from START to END seconds after sampling
    /// began (`2.5-3.1`, as the heat map's cells name them): every output
    /// is then the profile of that range alone.
    #[arg(long, value_name = "START-END", value_parser = parse_range)]
    range: Option<(Duration, Duration)>,
    /// Also count the time user threads spend off the CPU (blocked,
    /// sleeping or waiting to run), at context switches: one profile of
    /// where wall time goes, in microseconds, with on-CPU samples weighted
    /// by the CPU time they stand for (their period while the timer keeps
    /// time) and off-CPU time by its length. Stacks off the CPU
    /// have an `[off-CPU]` frame where the thread entered the kernel, and
    /// their kernel frames are blue in the flame graph; pprof files have
    /// `on_cpu` and `off_cpu` sample types.
    #[arg(long, conflicts_with = "period")]
    off_cpu: bool,
    /// Print perf report's table instead of stacks: overhead with
    /// children and self by --sort keys (comm, dso, sym), shaped by the
    /// report options (--hierarchy, -g, --percent-limit and the rest).
    #[arg(long)]
    report: bool,
    #[command(flatten)]
    report_opts: Box<ReportArgs>,
    #[command(flatten)]
    annotate_opts: AnnotateArgs,
    #[command(flatten)]
    stacks: StackArgs,
    #[command(flatten)]
    buffer: BufferArgs,
}

/// What `-c` was given: a period (bcc's profile) or a cgroup (the other
/// tools' `-c`). A number is a period; anything else is a path.
#[derive(Debug, Clone)]
enum PeriodOrCgroup {
    Period(u64),
    Cgroup(std::path::PathBuf),
}

fn period_or_cgroup(text: &str) -> Result<PeriodOrCgroup, String> {
    if text.bytes().all(|b| b.is_ascii_digit()) {
        return crate::output::at_least_one::<u64>(text).map(PeriodOrCgroup::Period);
    }
    Ok(PeriodOrCgroup::Cgroup(text.into()))
}

impl Args {
    /// The sampling period, from `--period` or `-c N`.
    fn period(&self) -> Option<u64> {
        match &self.c {
            Some(PeriodOrCgroup::Period(n)) => Some(*n),
            _ => self.period,
        }
    }

    /// The cgroup filter, from `--cgroup` or `-c PATH`.
    fn cgroup(&self) -> Option<std::path::PathBuf> {
        match &self.c {
            Some(PeriodOrCgroup::Cgroup(p)) => Some(p.clone()),
            _ => self.scope.cgroup.clone(),
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
const TRACEPOINT_PROGRAM: &str = "profile_tracepoint";

/// Where `-e` takes stacks at events, found before anything is attached.
enum Found {
    Tracepoints(Vec<(String, String)>),
    Probe(attach::Resolved),
}

/// The programs that count stacks at probes (`-e p:`, `r:`, `u:`).
const PROBE_PROGRAMS: Programs<'static> = Programs {
    kprobe: "profile_kprobe",
    kretprobe: "profile_kretprobe",
    uprobe: "profile_uprobe",
    uretprobe: "profile_uretprobe",
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

/// The tool.
pub struct Profile {
    args: Args,
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
}

/// Most heat map slots without a duration: ten minutes.
const MAX_HEAT_SLOTS: u32 = 30_000;

/// `START-END` in seconds, as `--range` takes it.
fn parse_range(s: &str) -> Result<(Duration, Duration), String> {
    let secs = |v: &str| {
        v.trim()
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite() && *v >= 0.0)
            .map(Duration::from_secs_f64)
            .ok_or_else(|| format!("expected START-END in seconds, such as 2.5-3.1; got {s:?}"))
    };
    let (a, b) = s
        .split_once('-')
        .ok_or_else(|| format!("expected START-END in seconds, such as 2.5-3.1; got {s:?}"))?;
    let (a, b) = (secs(a)?, secs(b)?);
    if b <= a {
        return Err(format!("the range ends before it starts: {s}"));
    }
    Ok((a, b))
}

/// profile's command line, parsed by its own flags: for the tools that
/// run profile underneath (stackcount, top), which build its argv.
#[derive(Debug, clap::Parser)]
#[command(name = "profile")]
struct AsProfile {
    #[command(flatten)]
    args: Args,
}

/// Parses `argv` (`profile` first) as profile's flags.
pub fn parse_args(argv: &[String]) -> Result<Args, clap::Error> {
    <AsProfile as clap::Parser>::try_parse_from(argv).map(|p| p.args)
}

/// The `Tool` methods of a tool that runs a [`Profile`] in its field
/// `profile` and adds only its own output: scope, events, variants,
/// configure, attach, describe, notes and events are profile's.
macro_rules! delegate_to_profile {
    () => {
        fn scope(&self) -> $crate::tracer::Scope {
            self.profile.scope()
        }

        fn scoped(&mut self, scope: &$crate::tracer::Scope) {
            self.profile.scoped(scope);
        }

        fn events(&self) -> Option<&$crate::kernel::transport::BufferArgs> {
            self.profile.events()
        }

        fn variants(
            &self,
            m: Option<$crate::kernel::features::Mechanism>,
            kernel: &mut $crate::kernel::load::Kernel,
        ) -> Vec<&'static str> {
            self.profile.variants(m, kernel)
        }

        fn configure(
            &mut self,
            m: Option<$crate::kernel::features::Mechanism>,
            kernel: &mut $crate::kernel::load::Kernel,
            load: &mut $crate::kernel::load::Load,
        ) -> anyhow::Result<()> {
            self.profile.configure(m, kernel, load)
        }

        fn attach(
            &mut self,
            m: Option<$crate::kernel::features::Mechanism>,
            kernel: &mut $crate::kernel::load::Kernel,
            ebpf: &mut aya::Ebpf,
        ) -> anyhow::Result<()> {
            self.profile.attach(m, kernel, ebpf)
        }

        fn describe(&self) -> String {
            self.profile.describe()
        }

        fn notes(&self) -> Vec<String> {
            self.profile.notes()
        }

        fn event(&mut self, record: &[u8], sink: &mut $crate::output::Sink) -> anyhow::Result<()> {
            self.profile.event(record, sink)
        }
    };
}
pub(crate) use delegate_to_profile;

impl Tool for Profile {
    type Args = Args;
    const NAME: &'static str = "profile";
    const CHAIN: &'static [Mechanism] = &[];
    const ERRORS: &'static [&'static str] = &ERR_NAMES;
    const EXPECTED: &'static [u32] = &rtrace_common::stacks::ERR_EXPECTED;

    fn new(args: Args) -> anyhow::Result<Self> {
        let online =
            online_cpus().map_err(|(what, e)| anyhow::anyhow!("cannot read {what}: {e}"))?;
        if let Some(c) = args.scope.cpus.iter().find(|c| !online.contains(c)) {
            anyhow::bail!("CPU {c} is not online (online: {online:?})")
        }
        // Sampling only the CPUs asked for costs the others nothing.
        let cpus = if args.scope.cpus.is_empty() {
            online
        } else {
            args.scope.cpus.clone()
        };
        // Off-CPU time is weighed against on-CPU samples in time, which a
        // timer's samples measure exactly.
        if args.off_cpu && !(*args.event == Event::Cpu || args.event.is_cpu_clock()) {
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
        if args.event.at_events() && args.period().is_some_and(|n| n > u64::from(u32::MAX)) {
            anyhow::bail!("-c N on events counts at most every {}th", u32::MAX);
        }
        if args.frequency.is_some() && args.period().is_some() {
            // A usage error, as clap's own conflicts are: exit 2.
            clap::Error::raw(
                clap::error::ErrorKind::ArgumentConflict,
                "-F and -c N both set the sampling rate: give one\n",
            )
            .exit();
        }
        let freq = args.frequency.unwrap_or(49);
        if args.period().is_none()
            && let Some(max) = max_sample_rate()
            && freq > max
        {
            anyhow::bail!("-F {freq} is above kernel.perf_event_max_sample_rate ({max})");
        }
        if args.interval.is_some()
            && (args.report
                || args.svg.is_some()
                || args.pprof.is_some()
                || args.speedscope.is_some()
                || args.heatmap.is_some()
                || args.html.is_some()
                || args.off_cpu)
        {
            anyhow::bail!(
                "--interval prints stacks as it goes; --report, --off-cpu and files take them \
                 all at the end"
            );
        }
        if !args.report
            && let Some(flag) = args.report_opts.changed()
        {
            anyhow::bail!("{flag} shapes perf report's table: add --report");
        }
        let reports = StackReports::create([
            args.svg.as_deref(),
            args.pprof.as_deref(),
            args.speedscope.as_deref(),
            args.heatmap.as_deref(),
            args.html.as_deref(),
        ])?;
        let heat_slots = if args.heatmap.is_some() || args.pprof.is_some() || args.html.is_some() {
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
                (*args.event).clone()
            },
            off_cpu: args.off_cpu.then(OffCpu::default),
            args,
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
        })
    }

    fn scope(&self) -> Scope {
        Scope {
            cgroup: self.args.cgroup(),
            cgroup_map: self.args.sets.cgroup_map.clone(),
            mntns_map: self.args.sets.mntns_map.clone(),
            // Off the CPU, rtrace's own threads would be much of what a
            // whole-system profile shows: they wait for the kernel.
            exclude_self: self.args.off_cpu,
            ..self.args.scope.scope()
        }
    }

    fn events(&self) -> Option<&BufferArgs> {
        Some(&self.args.buffer)
    }

    fn duration(&self) -> Option<u64> {
        self.args.duration
    }

    /// The CFI walk needs helpers of 5.15; where it cannot load, `auto`
    /// keeps the kernel's frame-pointer walk, and `-v` says why.
    fn variants(&self, _m: Option<Mechanism>, _kernel: &mut Kernel) -> Vec<&'static str> {
        StackTool::variants(self.args.stacks.unwind, !self.args.kernel_only)
    }

    fn configure(
        &mut self,
        _m: Option<Mechanism>,
        kernel: &mut Kernel,
        load: &mut Load,
    ) -> anyhow::Result<()> {
        let heat_slots = self.heat_slots;
        let (range_start, range_end) = self.args.range.unwrap_or_default();
        let mut cfg = Config {
            include_idle: u32::from(self.args.include_idle),
            user: u32::from(!self.args.kernel_only),
            kernel: u32::from(!self.args.user_only),
            heat_slots,
            per_thread: u32::from(self.per_thread()),
            every: if self.event.at_events() {
                self.args.period().map_or(1, |n| n as u32)
            } else {
                1
            },
            range_start_ns: range_start.as_nanos() as u64,
            range_end_ns: range_end.as_nanos() as u64,
            time_keys: u32::from(self.time_keys()),
            ..Config::default()
        };
        load.size("HEAT", heat_slots.max(1));
        let period_ns = self.period_ns();
        let (per_thread, time_keys) = (self.per_thread(), self.time_keys());
        if let Some(off) = &mut self.off_cpu {
            cfg.timed = 1;
            cfg.period_ns = period_ns;
            // Every wait of user threads, whatever its state (waiting to
            // run too): with the samples, their wall time. Kernel threads,
            // which sleep most of the time, would drown the rest.
            let filter = Filter {
                min_ns: 0,
                max_ns: u64::MAX,
                user: !self.args.kernel_only,
                kernel: !self.args.user_only,
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
        }
        self.stacks.configure(&self.args.stacks, kernel, load)?;
        if self.exact_leaves() {
            self.stacks.exact_leaves();
        }
        load.config(&cfg);
        Ok(())
    }

    fn attach(
        &mut self,
        _m: Option<Mechanism>,
        kernel: &mut Kernel,
        ebpf: &mut Ebpf,
    ) -> anyhow::Result<()> {
        self.stacks.attach(ebpf, &self.args.scope.pids)?;
        if self.event.at_events() {
            // Found first: a bad spec fails before the tables are loaded.
            let pid = self.args.scope.one_pid();
            let found = match &self.event {
                Event::Tracepoint { category, event } => {
                    let root = crate::kernel::tracefs::root()?;
                    Found::Tracepoints(event::tracepoints(&root, category, event)?)
                }
                Event::Probe(spec) => {
                    let names = if self.args.regexp {
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
            let scope = self.args.scope.scope();
            if scope.pids.is_empty() && scope.tids.is_empty() && !scope.command_cgroup() {
                let started = std::time::Instant::now();
                eprintln!("rtrace: loading the unwind tables of every running process...");
                let n = self.stacks.preload_all()?;
                self.preloaded = Some((n, started.elapsed()));
            }
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
            .program_mut("profile")
            .context("program profile missing")?
            .try_into()?;
        prog.load().context("cannot load the profile program")?;
        self.set_window(ebpf)?;
        let prog: &mut PerfEvent = ebpf
            .program_mut("profile")
            .context("program profile missing")?
            .try_into()?;
        let (period, freq) = (self.args.period(), self.freq);
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
            if let Err(why) = kernel.check(Mechanism::PerfEventSoftware) {
                if let Some(refused) = crate::kernel::privs::perf_events_refused() {
                    return Err(e.context(refused));
                }
                return Err(e.context(format!("and software perf events fail too: {why}")));
            }
            self.fallback = Some(format!("{e:#}"));
            self.event = Event::cpu_clock();
            attach(prog, &self.event, &self.cpus, period, freq)?;
        }
        Ok(())
    }

    fn describe(&self) -> String {
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

    fn notes(&self) -> Vec<String> {
        let mut notes = vec![match &self.fallback {
            Some(why) => format!(
                "sampling cpu-clock, a software timer: hardware cycles failed ({why}){}",
                pmu_hint()
            ),
            None => format!("sampling {}", self.event.name()),
        }];
        notes.extend(self.probe_how.iter().map(|how| format!("attached {how}")));
        if let Some((n, took)) = self.preloaded {
            notes.push(format!(
                "the tables of {n} running processes loaded before tracing, in {:.2} s",
                took.as_secs_f64()
            ));
        }
        if self.args.heatmap.is_some() || self.args.range.is_some() || self.time_keys() {
            notes.push(format!(
                "time zero of the heat map and --range: CLOCK_MONOTONIC {} ns",
                self.window_start
            ));
        }
        notes
    }

    fn banner(&self) -> String {
        header(&self.args, &self.event, self.freq)
    }

    /// Every second the kernel's tables are moved out, so that they never
    /// fill; nothing is printed until the end.
    fn interval(&self) -> Schedule {
        Schedule::Every {
            period: Duration::from_secs(1),
            count: None,
        }
    }

    fn tick(&mut self, ebpf: &mut Ebpf, sink: &mut Sink, last: bool) -> anyhow::Result<()> {
        self.stacks.tick(ebpf, last)?;
        if let Some(every) = self.args.interval
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

    fn start(&mut self) {
        self.stacks.start(!self.args.user_only);
    }

    fn event(&mut self, record: &[u8], _sink: &mut Sink) -> anyhow::Result<()> {
        self.stacks.event(record)
    }

    fn finish(&mut self, ebpf: &mut Ebpf, sink: &mut Sink) -> anyhow::Result<()> {
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
                .program_mut("profile")
                .context("program profile missing")?
                .try_into()?;
            prog.unload().context("cannot stop sampling")?;
        }
        if let Some(off) = &self.off_cpu {
            off.stop(ebpf)?;
        }
        let heat = self.heat_counts(ebpf, elapsed)?;
        self.write_heatmap(heat.as_deref())?;
        let mut exact = self.stacks.finish(ebpf)?;
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
        if self.args.report || self.args.annotate_opts.wanted() {
            if self.args.report {
                let u = if self.off_cpu.is_some() {
                    "us"
                } else {
                    "samples"
                };
                let counted = if self.per_thread() { &exact } else { &samples };
                sink.emit(&Report::new(
                    counted,
                    &self.args.report_opts,
                    &self.event.name(),
                    u,
                ))?;
            }
            if self.args.annotate_opts.wanted() {
                sink.emit(&annotate::annotate(
                    &exact,
                    &self.args.annotate_opts,
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

    fn summary(&self) -> Vec<String> {
        self.stacks.summary()
    }

    fn warnings(&self) -> Vec<Warning> {
        self.stacks.warnings()
    }
}

/// bcc's start-up line, on stderr so that stdout holds only stacks.
fn header(args: &Args, event: &Event, freq: u64) -> String {
    let rate = match (event, args.period()) {
        (e, None) if e.at_events() => format!("Sampling {} at every event", event.name()),
        (_, Some(p)) => format!("Sampling {} every {p} events", event.name()),
        (_, None) => format!("Sampling {} at {freq} Hertz", event.name()),
    };
    let whom = match args.scope.whom() {
        Some(whom) => format!("of {whom}"),
        None => "of all threads".to_owned(),
    };
    let which = if args.user_only {
        "user"
    } else if args.kernel_only {
        "kernel"
    } else {
        "user + kernel"
    };
    let cpu = match args.scope.cpus.as_slice() {
        [] => String::new(),
        [c] => format!(" on CPU#{c}"),
        cs => format!(" on CPUs {cs:?}"),
    };
    let until = match args.duration {
        Some(s) => format!(" for {s} secs."),
        None if args.scope.commanded() => " until it exits.".to_owned(),
        None => "... Hit Ctrl-C to end.".to_owned(),
    };
    format!("{rate} {whom} by {which} stack{cpu}{until}")
}

impl Profile {
    /// Prints stacks as text or folded lines (or nothing, where files are
    /// the output).
    fn print_stacks(&self, sink: &mut Sink, samples: &[Sample]) -> anyhow::Result<()> {
        let text = TextOptions {
            delimiter: self.args.delimited,
            annotate: self.args.annotate,
        };
        let files = self.args.svg.is_some()
            || self.args.pprof.is_some()
            || self.args.speedscope.is_some()
            || self.args.html.is_some();
        let value = if self.off_cpu.is_some() {
            "us"
        } else {
            "count"
        };
        Stacks::print(sink, samples, text, self.args.folded, files, value)
    }

    /// The kernel's samples by time slot, up to the end of sampling, where
    /// they were counted.
    /// The stacks counted since the last call, named: for a live view
    /// (`rtrace top`) that reads them every refresh.
    pub fn take_interval(&mut self, ebpf: &mut Ebpf) -> anyhow::Result<Vec<Sample>> {
        self.stacks.tick(ebpf, false)?;
        self.stacks.interval(ebpf)
    }

    fn heat_counts(&self, ebpf: &Ebpf, elapsed: Duration) -> anyhow::Result<Option<Vec<u64>>> {
        if self.heat_slots == 0 {
            return Ok(None);
        }
        let used = (elapsed.as_nanos() as u64)
            .div_ceil(HEAT_SLOT_NS)
            .min(u64::from(self.heat_slots)) as u32;
        let heat: aya::maps::PerCpuArray<_, u32> =
            aya::maps::PerCpuArray::try_from(ebpf.map("HEAT").context("map HEAT missing")?)?;
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
        self.args.annotate_opts.wanted() || self.args.pprof.is_some()
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
        self.args.html.is_some() || self.args.pprof.is_some()
    }

    /// Whether samples are counted by thread: for a report that sorts or
    /// filters by thread, and for a pprof, which keeps each sample's
    /// thread for a later one. Otherwise a process's threads share their
    /// counts, as the kernel keeps fewer of them.
    fn per_thread(&self) -> bool {
        self.args.report_opts.by_thread() || self.args.pprof.is_some()
    }

    /// The CPU time one cpu-clock sample stands for.
    fn period_ns(&self) -> u64 {
        self.args.period().unwrap_or(1_000_000_000 / self.freq)
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

    /// The sampling rate as the outputs name it.
    fn rate(&self) -> String {
        match (&self.event, self.args.period()) {
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
        comments
            .extend(heat.map(|h| stacks::pprof::heat_comment(h, HEAT_SLOT_NS, self.window_start)));
        let args = &self.args;
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
                icicle: args.icicle,
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
            let (unit, period) = match (event.is_cpu_clock(), args.period()) {
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

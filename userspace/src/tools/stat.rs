//! `rtrace stat`: perf stat's counts of a command, processes, threads, a
//! cgroup or the whole system. perf's counters are the kernel's own, in
//! counting mode; tracepoints are counted in the kernel by one program
//! (by the id each record begins with), and the syscall tracepoints by
//! syscall number from `raw_syscalls`, two attaches for hundreds of
//! tracepoints where perf opens one counter a tracepoint and CPU.

use crate::tracer::{Plan, Spec};
use std::{
    collections::{BTreeMap, HashMap},
    fmt::Write as _,
    fs::File,
    os::fd::{AsFd as _, OwnedFd},
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use aya::{Ebpf, maps::PerCpuArray, util::online_cpus};
use rtrace_common::stat::{
    BY_PROCESS, BY_TASK, BY_THREAD, KIND_PROBE, KIND_SYSCALL, KIND_TRACEPOINT, KPROBE_PROGRAMS,
    KRETPROBE_PROGRAMS, MAX_PROBES, MAX_SYSCALLS, PROBES, PROG_SYS_ENTER, PROG_SYS_EXIT,
    PROG_TRACEPOINT, SLOT_KIND_SHIFT, SYSCALLS, TASK_COUNTS, TRACEPOINTS, TaskCount, TaskKey,
    UPROBE_PROGRAMS, URETPROBE_PROGRAMS,
};

use crate::{
    kernel::{
        counters::{self, Counter, On, Reading},
        features::Mechanism,
        load::{Hooks, Kernel, Load},
        tracefs,
    },
    output::{Record, Schedule, Sink, files::thousands},
    probes::{
        attach::{self, Programs},
        event::{self, Event},
    },
    tracer::{Scope, ScopeArgs, Tool},
};

#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:
  rtrace stat -- make -j2                      # perf stat's counts of a build
  rtrace stat -a 5                             # the whole system, for 5 seconds
  rtrace stat -e 'syscalls:sys_enter_*' -p 185 # each syscall of PID 185, until Ctrl-C
  rtrace stat -e 'block:*' -a 10               # block layer events, 10 seconds
  rtrace stat -e context-switches -x, -- ls -R /   # perf's CSV
  rtrace stat -r 5 -- ./bench                  # five runs, mean and spread
  rtrace stat -e 'syscalls:sys_enter_*' --per-process -a 5   # by process
  rtrace stat -e 'u:libc:malloc,p:vfs_read' -p 185           # calls of functions")]
/// Count events as perf stat does: perf's counters and any tracepoints, of
/// a command, processes, threads, a cgroup or the whole system.
pub struct Args {
    /// Events to count, comma-separated (or -e again): perf's counters
    /// (task-clock, context-switches, page-faults, cycles, LLC-loads, ...,
    /// with :u or :k for user or kernel mode only) and tracepoints, globs
    /// allowed (sched:sched_switch, 'syscalls:sys_enter_*', 'block:*',
    /// bcc's t:CATEGORY:EVENT), and calls of functions (p:FUNCTION and
    /// r:FUNCTION in the kernel, u:FILE:FUNCTION or u:FILE:PROVIDER:NAME
    /// for USDT; globs count together). Without it, perf stat's default
    /// set.
    #[arg(short = 'e', long = "event", value_name = "EVENTS")]
    events: Vec<String>,
    /// perf's detailed counts: -d adds the L1 data cache and last-level
    /// cache loads and misses, -dd the instruction cache and TLBs, -ddd
    /// the prefetches (each `<not supported>` without a PMU).
    #[arg(short = 'd', long = "detailed", action = clap::ArgAction::Count)]
    detailed: u8,
    /// Each CPU's counts apart (perf's --no-aggr), with -a, -C or a
    /// cgroup.
    #[arg(short = 'A', long = "no-aggr")]
    no_aggr: bool,
    /// Each thread's counts apart: perf's counters of -p's or -t's
    /// threads, tracepoints and probes of any scope.
    #[arg(long, conflicts_with_all = ["no_aggr", "per_process"])]
    per_thread: bool,
    /// Each process's counts apart, its threads together: perf's
    /// counters of -p's processes, tracepoints and probes of any scope.
    #[arg(long, conflicts_with = "no_aggr")]
    per_process: bool,
    /// Run the command N times and print the mean of each count with its
    /// spread, as perf stat -r.
    #[arg(short = 'r', long = "repeat", value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..))]
    repeat: Option<u32>,
    /// Print the counts every MS milliseconds (at least 10), each line
    /// with the seconds since the start, as perf stat -I.
    #[arg(short = 'I', long = "interval-print", value_name = "MS",
          value_parser = clap::value_parser!(u64).range(10..))]
    interval_ms: Option<u64>,
    /// perf's CSV: one line an event (value, unit, event, run time,
    /// percent running, metric, metric unit), fields separated by SEP.
    #[arg(short = 'x', long = "field-separator", value_name = "SEP")]
    separator: Option<String>,
    /// Count for this many seconds; without it, until Ctrl-C (not with --
    /// CMD, whose exit ends the count).
    #[arg(value_parser = crate::output::at_least_one::<u64>)]
    duration: Option<u64>,
    #[command(flatten)]
    scope: ScopeArgs,
}

/// perf stat's default events, where no `-e` is given.
const DEFAULT: &str = "task-clock,context-switches,cpu-migrations,page-faults,\
                       cycles,instructions,branches,branch-misses";

/// What each level of `-d` adds, as perf stat's detailed levels.
const DETAILED: [&str; 3] = [
    "L1-dcache-loads,L1-dcache-load-misses,LLC-loads,LLC-load-misses",
    "L1-icache-loads,L1-icache-load-misses,dTLB-loads,dTLB-load-misses,iTLB-loads,\
     iTLB-load-misses",
    "L1-dcache-prefetches,L1-dcache-prefetch-misses",
];

/// What counts are split by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Split {
    Whole,
    /// `-A`.
    Cpu,
    /// `--per-thread`.
    Thread,
    /// `--per-process`.
    Process,
}

/// The part of a split a count belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Part {
    Whole,
    Cpu(u32),
    /// A thread or a process, by id.
    Task(u32),
}

/// What one line counts.
#[derive(Debug)]
enum Source {
    /// A perf counter, on each of its targets; empty where this machine
    /// cannot count it.
    Counter {
        counter: event::Counter,
        open: Vec<(Counter, Part)>,
    },
    /// A tracepoint, by the id its records begin with.
    Tracepoint(u32),
    /// A syscall tracepoint counted from `raw_syscalls`: its slot in
    /// `SYSCALLS` (exits from [`MAX_SYSCALLS`]).
    Syscall(u32),
    /// A probe spec, by its slot of programs.
    Probe(u32),
}

/// One line of the report: an event and how it is counted.
#[derive(Debug)]
struct Line {
    name: String,
    source: Source,
}

pub struct Stat {
    args: Args,
    specs: Vec<Event>,
    lines: Vec<Line>,
    split: Split,
    /// The CPUs counted: `-C`'s, or every online one (read once, when
    /// the counters open).
    cpus: Vec<u32>,
    /// Names of the tasks counted apart, by id.
    comms: HashMap<u32, String>,
    /// USDT probes' perf events, which keep them attached.
    links: Vec<OwnedFd>,
    /// How each probe spec was attached, for `-v`.
    notes: Vec<String>,
    /// With `-r`: each finished run's rows and elapsed time.
    rounds: Vec<(Vec<Row>, Duration)>,
    scope: Scope,
    /// The command's cgroup, held open for its counters and read for its
    /// CPU time at the end.
    cgroup: Option<(PathBuf, File)>,
    started: Option<Instant>,
    /// With `-I`: the totals at the last interval, and when it ended.
    previous: Vec<BTreeMap<Part, Reading>>,
    last_tick: Option<Instant>,
    /// perf's heading of the interval lines, until printed.
    interval_header: bool,
}

/// The `SYSCALLS` slot of syscall tracepoint `event` (`sys_enter_NAME`
/// or `sys_exit_NAME`), if the syscall has a number here.
fn syscall_slot(event: &str) -> Option<u32> {
    let (base, name) = match event.strip_prefix("sys_enter_") {
        Some(n) => (0, n),
        None => (MAX_SYSCALLS, event.strip_prefix("sys_exit_")?),
    };
    let nr = name.parse::<syscalls::Sysno>().ok()?.id();
    u32::try_from(nr)
        .ok()
        .filter(|&n| n < MAX_SYSCALLS)
        .map(|n| base + n)
}

impl Tool for Stat {
    type Args = Args;

    const SPEC: Spec = Spec::new("stat", &[], &rtrace_common::stat::ERR_NAMES);

    fn new(args: Args) -> anyhow::Result<Self> {
        let mut lists = if args.events.is_empty() {
            vec![DEFAULT.to_owned()]
        } else {
            args.events.clone()
        };
        lists.extend(
            DETAILED[..usize::from(args.detailed).min(DETAILED.len())]
                .iter()
                .map(|&l| l.to_owned()),
        );
        let mut specs = Vec::new();
        for list in &lists {
            specs.extend(event::parse_list(list).map_err(|e| anyhow::anyhow!("-e {list:?}: {e}"))?);
        }
        let probes = specs.iter().filter(|s| s.is_probe()).count();
        if probes > MAX_PROBES as usize {
            anyhow::bail!("{probes} probes: at most {MAX_PROBES} are counted at once");
        }
        if args.separator.as_deref() == Some("") {
            anyhow::bail!("-x needs a separator, as in -x,");
        }
        let scope = args.scope.scope();
        let split = match (args.no_aggr, args.per_thread, args.per_process) {
            (true, ..) => Split::Cpu,
            (_, true, _) => Split::Thread,
            (.., true) => Split::Process,
            _ => Split::Whole,
        };
        let counters = specs.iter().any(|s| matches!(s, Event::Counter(_)));
        let tasks = !scope.pids.is_empty() || !scope.tids.is_empty();
        match split {
            Split::Cpu if tasks || scope.command_cgroup() => anyhow::bail!(
                "-A splits counts by CPU: it needs -a, -C or a cgroup, not a process, thread \
                 or command of its own"
            ),
            Split::Thread | Split::Process if counters && !tasks => anyhow::bail!(
                "--per-thread and --per-process split perf's counters of -p's processes or \
                 -t's threads only; tracepoints and probes (-e) split in any scope"
            ),
            Split::Process if !scope.tids.is_empty() => {
                anyhow::bail!("--per-process splits -p's processes; -t names threads")
            }
            _ => {}
        }
        if let Some(n) = args.repeat
            && n > 1
        {
            if scope.command.is_empty() {
                anyhow::bail!("-r repeats a command: give one after --");
            }
            if args.interval_ms.is_some() || split != Split::Whole {
                anyhow::bail!("-r gives one report of every run: not with -I, -A or --per-*");
            }
        }
        Ok(Self {
            args,
            specs,
            lines: Vec::new(),
            split,
            cpus: Vec::new(),
            comms: HashMap::new(),
            links: Vec::new(),
            notes: Vec::new(),
            rounds: Vec::new(),
            scope: Scope::default(),
            cgroup: None,
            started: None,
            previous: Vec::new(),
            last_tick: None,
            interval_header: true,
        })
    }

    fn scoped(&mut self, scope: &Scope) {
        self.scope = scope.clone();
    }

    fn configure(
        &mut self,
        _m: Option<Mechanism>,
        _kernel: &mut Kernel,
        load: &mut Load,
    ) -> anyhow::Result<()> {
        let mut lines = Vec::new();
        let mut root: Option<PathBuf> = None;
        let mut most_id = 0;
        for spec in &self.specs {
            match spec {
                Event::Counter(c) => lines.push(Line {
                    name: c.display(),
                    source: Source::Counter {
                        counter: c.clone(),
                        open: Vec::new(),
                    },
                }),
                Event::Tracepoint { category, event } => {
                    if root.is_none() {
                        root = Some(tracefs::root()?);
                    }
                    let root = root.as_deref().context("tracefs")?;
                    for (cat, ev) in event::tracepoints(root, category, event)? {
                        let name = format!("{cat}:{ev}");
                        if lines.iter().any(|l: &Line| l.name == name) {
                            continue;
                        }
                        let source = match (cat.as_str(), syscall_slot(&ev)) {
                            ("syscalls", Some(slot)) => Source::Syscall(slot),
                            _ => {
                                let path = root.join("events").join(&cat).join(&ev).join("id");
                                let id: u32 = std::fs::read_to_string(&path)
                                    .ok()
                                    .and_then(|t| t.trim().parse().ok())
                                    .with_context(|| format!("cannot read {}", path.display()))?;
                                most_id = most_id.max(id);
                                Source::Tracepoint(id)
                            }
                        };
                        lines.push(Line { name, source });
                    }
                }
                probe => {
                    let slot = lines
                        .iter()
                        .filter(|l: &&Line| matches!(l.source, Source::Probe(_)))
                        .count() as u32;
                    lines.push(Line {
                        name: probe.to_string(),
                        source: Source::Probe(slot),
                    });
                }
            }
        }
        load.size(TRACEPOINTS, most_id + 1);
        let by_task = match self.split {
            Split::Thread => BY_THREAD,
            Split::Process => BY_PROCESS,
            _ => 0,
        };
        load.global(BY_TASK, &by_task);
        self.lines = lines;
        Ok(())
    }

    fn attach(
        &mut self,
        _m: Option<Mechanism>,
        kernel: &mut Kernel,
        ebpf: &mut Ebpf,
    ) -> anyhow::Result<()> {
        let syscalls = |exit: bool| {
            self.lines.iter().any(|l| match l.source {
                Source::Syscall(s) => (s >= MAX_SYSCALLS) == exit,
                _ => false,
            })
        };
        let mut raw = Hooks::new(Mechanism::RawTracepoint, kernel)?;
        for (exit, prog, hook) in [
            (false, PROG_SYS_ENTER, "sys_enter"),
            (true, PROG_SYS_EXIT, "sys_exit"),
        ] {
            if syscalls(exit) {
                raw.attach(ebpf, prog, "raw_syscalls", hook)?;
            }
        }
        // Again with each run of -r.
        self.links.clear();
        self.notes.clear();
        // One program for every tracepoint, each link with the
        // tracepoint's id as its cookie, which the program counts by.
        if self
            .lines
            .iter()
            .any(|l| matches!(l.source, Source::Tracepoint(_)))
        {
            let prog: &mut aya::programs::TracePoint = ebpf
                .program_mut(PROG_TRACEPOINT)
                .with_context(|| format!("program {PROG_TRACEPOINT} missing"))?
                .try_into()?;
            prog.load().context("cannot load the tracepoint program")?;
            let fd = prog.fd()?.as_fd();
            for line in &self.lines {
                if let Source::Tracepoint(id) = line.source {
                    let link = counters::tracepoint_link(fd, u64::from(id), u64::from(id))
                        .with_context(|| {
                            format!(
                                "cannot attach to {} (a BPF link with a cookie: Linux 5.15+)",
                                line.name
                            )
                        })?;
                    self.links.push(link);
                }
            }
        }
        let probes = self.specs.iter().filter(|s| s.is_probe());
        for (slot, spec) in probes.enumerate() {
            let names = [
                KPROBE_PROGRAMS,
                KRETPROBE_PROGRAMS,
                UPROBE_PROGRAMS,
                URETPROBE_PROGRAMS,
            ]
            .map(|k| format!("{k}_{slot}"));
            let progs = Programs {
                kprobe: &names[0],
                kretprobe: &names[1],
                uprobe: &names[2],
                uretprobe: &names[3],
            };
            let pid = self.args.scope.one_pid();
            let attached = attach::attach(ebpf, kernel, &progs, spec, attach::Names::Glob, pid)?;
            self.links.extend(attached.links);
            self.notes.push(format!("{spec}: {}", attached.how));
        }
        self.open_counters()
    }

    fn describe(&self) -> Vec<String> {
        let mut lines = vec![format!("{} events", self.lines.len())];
        lines.extend(self.notes.clone());
        lines
    }

    fn banner(&self) -> String {
        let whom = self.args.scope.whom();
        format!(
            "Counting {} events of {}... Hit Ctrl-C to end.",
            self.lines.len(),
            whom.as_deref().unwrap_or("the whole system")
        )
    }

    fn start(&mut self) {
        self.started = Some(Instant::now());
    }

    /// With `-I`: the counts of the interval that ended, as perf prints
    /// them, each line with the time since the start.
    fn tick(&mut self, ebpf: &mut Ebpf, sink: &mut Sink, _last: bool) -> anyhow::Result<()> {
        if self.args.interval_ms.is_none() {
            return Ok(());
        }
        let now = Instant::now();
        let since = self.started.map_or(Duration::ZERO, |s| now - s);
        let period = self.last_tick.map_or(since, |t| now - t);
        self.last_tick = Some(now);
        let readings = self.readings(ebpf, since)?;
        let mut rows = Vec::with_capacity(readings.len());
        for (i, (line, (parts, supported))) in self.lines.iter().zip(&readings).enumerate() {
            for (part, r) in parts {
                let before = self
                    .previous
                    .get(i)
                    .and_then(|p| p.get(part))
                    .copied()
                    .unwrap_or_default();
                let delta = Reading {
                    value: r.value.saturating_sub(before.value),
                    enabled: r.enabled.saturating_sub(before.enabled),
                    running: r.running.saturating_sub(before.running),
                };
                let mut row = Row::new(&line.name, delta, *supported, line.rated(), period);
                row.set_part(*part, &self.comms);
                rows.push(row);
            }
        }
        self.previous = readings.into_iter().map(|(p, _)| p).collect();
        sink.emit(&Interval {
            time: since.as_secs_f64(),
            rows,
            separator: self.args.separator.clone(),
            header: std::mem::take(&mut self.interval_header),
        })
    }

    fn finish(&mut self, ebpf: &mut Ebpf, sink: &mut Sink) -> anyhow::Result<()> {
        if self.args.interval_ms.is_some() {
            // The intervals said it all, the last one cut short included.
            return Ok(());
        }
        let elapsed = self.started.map_or(Duration::ZERO, |s| s.elapsed());
        let readings = self.readings(ebpf, elapsed)?;
        let mut rows = Vec::new();
        for (line, (parts, supported)) in self.lines.iter().zip(readings) {
            for (part, r) in parts {
                let mut row = Row::new(&line.name, r, supported, line.rated(), elapsed);
                row.set_part(part, &self.comms);
                rows.push(row);
            }
        }
        if self.args.repeat.is_some_and(|n| n > 1) {
            // The report comes after the last run, of them all.
            self.rounds.push((rows, elapsed));
            return Ok(());
        }
        let cpu_times = self.cgroup.as_ref().and_then(|(p, _)| cgroup_cpu_times(p));
        let report = Report {
            target: self.target(),
            rows,
            elapsed_s: elapsed.as_secs_f64(),
            elapsed_spread: None,
            runs: 1,
            user_s: cpu_times.map(|t| t.0),
            sys_s: cpu_times.map(|t| t.1),
            separator: self.args.separator.clone(),
        };
        sink.emit(&report)
    }

    /// With `-r`: each count's mean over the runs, with perf's spread
    /// (the standard error of the mean, in percent of it).
    fn finish_rounds(&mut self, sink: &mut Sink) -> anyhow::Result<()> {
        let Some((first, _)) = self.rounds.first() else {
            return Ok(());
        };
        let runs = self.rounds.len();
        let mut rows = Vec::with_capacity(first.len());
        for (i, row) in first.iter().enumerate() {
            let values: Vec<f64> = self
                .rounds
                .iter()
                .filter_map(|(rows, _)| rows.get(i)?.value)
                .collect();
            let metrics: Vec<f64> = self
                .rounds
                .iter()
                .filter_map(|(rows, _)| rows.get(i)?.metric)
                .collect();
            let mut mean_row = Row {
                value: (!values.is_empty()).then(|| mean_spread(&values).0),
                metric: (!metrics.is_empty()).then(|| mean_spread(&metrics).0),
                spread: (values.len() > 1).then(|| mean_spread(&values).1),
                ..row.clone()
            };
            if row.value.is_none() {
                mean_row.spread = None;
            }
            rows.push(mean_row);
        }
        let elapsed: Vec<f64> = self.rounds.iter().map(|(_, e)| e.as_secs_f64()).collect();
        let (elapsed_s, spread) = mean_spread(&elapsed);
        let report = Report {
            target: self.target(),
            rows,
            elapsed_s,
            elapsed_spread: Some(spread),
            runs,
            user_s: None,
            sys_s: None,
            separator: self.args.separator.clone(),
        };
        sink.emit(&report)
    }

    fn plan(&self) -> Plan {
        Plan {
            scope: Scope {
                // What rtrace does reading its counts is not the workload's.
                exclude_self: true,
                ..self.args.scope.scope()
            },
            interval: match self.args.interval_ms {
                Some(ms) => Schedule::Every {
                    period: Duration::from_millis(ms),
                    count: None,
                },
                None => Schedule::AtEnd,
            },
            duration: self.args.duration,
            repeats: self.args.repeat.unwrap_or(1),
            ..Plan::default()
        }
    }
}

/// The mean of `values`, and the standard error of that mean in percent
/// of it, as perf stat -r prints it.
fn mean_spread(values: &[f64]) -> (f64, f64) {
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    if values.len() < 2 || mean == 0.0 {
        return (mean, 0.0);
    }
    let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, 100.0 * (var / n).sqrt() / mean)
}

impl Line {
    /// Whether perf gives it a rate: software counters; hardware
    /// counters and tracepoints have none.
    fn rated(&self) -> bool {
        match &self.source {
            Source::Counter { counter, .. } => !counter.hardware(),
            _ => false,
        }
    }
}

impl Stat {
    /// Every line's counts so far by part of the split, and whether it
    /// is counted at all; the programs' counts as counters that ran for
    /// all of `elapsed`.
    #[allow(clippy::type_complexity)]
    fn readings(
        &mut self,
        ebpf: &Ebpf,
        elapsed: Duration,
    ) -> anyhow::Result<Vec<(BTreeMap<Part, Reading>, bool)>> {
        let per_cpu = |name: &str| -> anyhow::Result<Option<PerCpuArray<_, u64>>> {
            Ok(match ebpf.map(name) {
                Some(m) => Some(PerCpuArray::try_from(m)?),
                None => None,
            })
        };
        let tps = per_cpu(TRACEPOINTS)?;
        let sys = per_cpu(SYSCALLS)?;
        let probes = per_cpu(PROBES)?;
        let whole = |value| Reading {
            value,
            enabled: elapsed.as_nanos() as u64,
            running: elapsed.as_nanos() as u64,
        };
        // The CPUs a split by CPU shows: those counted.
        let cpus = self.cpus.clone();
        let split = self.split;
        // A program's counts of one slot, by part.
        let from_array = |a: &Option<PerCpuArray<&aya::maps::MapData, u64>>, i: u32| {
            let values = a.as_ref().and_then(|a| a.get(&i, 0).ok());
            let mut parts = BTreeMap::new();
            match split {
                Split::Cpu => {
                    for &c in &cpus {
                        let v = values.as_ref().and_then(|v| v.get(c as usize)).copied();
                        parts.insert(Part::Cpu(c), whole(v.unwrap_or(0)));
                    }
                }
                _ => {
                    let v = values.map_or(0, |v| v.iter().sum());
                    parts.insert(Part::Whole, whole(v));
                }
            }
            parts
        };
        // Counts by task, by the slot they were counted in.
        let mut by_task: HashMap<u32, BTreeMap<Part, Reading>> = HashMap::new();
        if matches!(split, Split::Thread | Split::Process)
            && let Some(m) = ebpf.map(TASK_COUNTS)
        {
            let map = aya::maps::HashMap::<_, TaskKey, TaskCount>::try_from(m)?;
            for entry in map.iter() {
                let Ok((k, v)) = entry else { continue };
                // A process is named by its leader where it is still
                // there; the kernel has the name of whichever thread came
                // first.
                self.comms.entry(k.id).or_insert_with(|| {
                    let leader = (split == Split::Process)
                        .then(|| crate::kernel::comm_of(k.id))
                        .flatten();
                    leader.unwrap_or_else(|| crate::kernel::c_string(&v.comm))
                });
                by_task
                    .entry(k.slot)
                    .or_default()
                    .insert(Part::Task(k.id), whole(v.count));
            }
        }
        let mut take = |kind: u32, slot: u32| {
            by_task
                .remove(&(kind << SLOT_KIND_SHIFT | slot))
                .unwrap_or_default()
        };
        let mut out = Vec::with_capacity(self.lines.len());
        for line in &mut self.lines {
            let split_tasks = matches!(split, Split::Thread | Split::Process);
            out.push(match &mut line.source {
                Source::Counter { open, .. } if open.is_empty() => {
                    (BTreeMap::from([(Part::Whole, Reading::default())]), false)
                }
                Source::Counter { open, .. } => {
                    let mut parts: BTreeMap<Part, Reading> = BTreeMap::new();
                    for (c, part) in open.iter_mut() {
                        *parts.entry(*part).or_default() +=
                            c.read().context("cannot read a counter")?;
                    }
                    (parts, true)
                }
                Source::Tracepoint(id) if split_tasks => (take(KIND_TRACEPOINT, *id), true),
                Source::Syscall(slot) if split_tasks => (take(KIND_SYSCALL, *slot), true),
                Source::Probe(slot) if split_tasks => (take(KIND_PROBE, *slot), true),
                Source::Tracepoint(id) => (from_array(&tps, *id), true),
                Source::Syscall(slot) => (from_array(&sys, *slot), true),
                Source::Probe(slot) => (from_array(&probes, *slot), true),
            });
        }
        Ok(out)
    }

    /// Where each counter counts, by the scope: the command and what it
    /// starts (its counters inherited, as perf stat's), `-c`'s cgroup on
    /// each CPU, each thread of `-p`'s processes and what they start,
    /// `-t`'s threads, or every CPU.
    fn open_counters(&mut self) -> anyhow::Result<()> {
        self.cpus = if self.scope.cpus.is_empty() {
            online_cpus().map_err(|(what, e)| anyhow::anyhow!("cannot read {what}: {e}"))?
        } else {
            self.scope.cpus.clone()
        };
        let cpus = self.cpus.clone();
        if let Some(path) = &self.scope.cgroup {
            let dir = counters::cgroup_dir(path)
                .with_context(|| format!("cannot open cgroup {}", path.display()))?;
            self.cgroup = Some((path.clone(), dir));
        }
        // The command, corked before its exec: every process it starts
        // inherits its counters. (Counting its cgroup would need the
        // perf_event controller on the cgroup v2 hierarchy, which Debian's
        // 6.1 kernel does not put there.)
        let command = self
            .scope
            .command_pid
            .filter(|_| self.args.scope.scope().command_cgroup());
        // Each task, whether what it starts is counted with it, and the
        // process it belongs to.
        let mut tasks: Vec<(u32, bool, u32)> = command.map(|p| (p, true, p)).into_iter().collect();
        for &pid in &self.scope.pids {
            let dir = format!("/proc/{pid}/task");
            let threads = std::fs::read_dir(&dir).with_context(|| format!("no process {pid}"))?;
            for t in threads.flatten() {
                if let Some(tid) = t.file_name().to_str().and_then(|s| s.parse().ok()) {
                    tasks.push((tid, true, pid));
                }
            }
        }
        tasks.extend(self.scope.tids.iter().map(|&t| (t, false, t)));
        let split = self.split;
        let comm = |id: u32| crate::kernel::comm_of(id).unwrap_or_else(|| "?".to_owned());
        for &(tid, _, pid) in &tasks {
            match split {
                Split::Thread => self.comms.insert(tid, comm(tid)),
                Split::Process => self.comms.insert(pid, comm(pid)),
                _ => None,
            };
        }
        let by_cpu = |c: u32| match split {
            Split::Cpu => Part::Cpu(c),
            _ => Part::Whole,
        };
        let targets: Vec<(On<'_>, Part)> = if let (Some((_, dir)), None) = (&self.cgroup, command) {
            cpus.iter()
                .map(|&c| (On::Cgroup(dir, c), by_cpu(c)))
                .collect()
        } else if !tasks.is_empty() {
            tasks
                .iter()
                .map(|&(tid, inherit, pid)| {
                    let part = match split {
                        Split::Thread => Part::Task(tid),
                        Split::Process => Part::Task(pid),
                        _ => Part::Whole,
                    };
                    (On::Task { tid, inherit }, part)
                })
                .collect()
        } else {
            cpus.iter().map(|&c| (On::Cpu(c), by_cpu(c))).collect()
        };
        for line in &mut self.lines {
            let Source::Counter { counter, open } = &mut line.source else {
                continue;
            };
            let spec = counters::Spec {
                kind: counter.kind,
                config: counter.config,
                exclude_user: counter.kernel_only,
                exclude_kernel: counter.user_only,
            };
            for (on, part) in &targets {
                match Counter::open(spec, *on) {
                    Ok(c) => open.push((c, *part)),
                    // perf's `<not supported>`: no PMU, or not this event.
                    Err(_) if counter.hardware() => {
                        open.clear();
                        break;
                    }
                    Err(e) => {
                        let hint = match on {
                            On::Cgroup(..) if e.kind() == std::io::ErrorKind::NotFound => {
                                "; counters on a cgroup need the perf_event controller on \
                                 the cgroup v2 hierarchy, which this kernel does not put there"
                            }
                            _ => "",
                        };
                        return Err(e).with_context(|| {
                            format!("cannot count {} on {on}{hint}", counter.display())
                        });
                    }
                }
            }
        }
        Ok(())
    }

    /// What perf's heading names: the command, the processes, the
    /// threads, the cgroup, or the whole system.
    fn target(&self) -> String {
        let s = &self.args.scope;
        let ids = |v: &[u32]| v.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
        if !s.command.is_empty() && !s.all_cpus {
            let words: Vec<String> = s
                .command
                .iter()
                .map(|w| w.to_string_lossy().into_owned())
                .collect();
            format!("'{}'", words.join(" "))
        } else if !s.pids.is_empty() {
            format!("process id '{}'", ids(&s.pids))
        } else if !s.tids.is_empty() {
            format!("thread id '{}'", ids(&s.tids))
        } else if let Some(cg) = &s.cgroup {
            format!("cgroup '{}'", cg.display())
        } else {
            "'system wide'".to_owned()
        }
    }
}

/// The cgroup's user and system CPU seconds (`cpu.stat`), which include
/// every process it held, finished or not.
fn cgroup_cpu_times(path: &std::path::Path) -> Option<(f64, f64)> {
    let text = std::fs::read_to_string(path.join("cpu.stat")).ok()?;
    let field = |name: &str| -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse::<u64>().ok())
            .map(|us| us as f64 / 1e6)
    };
    Some((field("user_usec ")?, field("system_usec ")?))
}

/// One counted event, with perf's derived figure.
#[derive(Debug, Clone, serde::Serialize)]
struct Row {
    /// With -A: the CPU.
    #[serde(skip_serializing_if = "Option::is_none")]
    cpu: Option<u32>,
    /// With --per-thread or --per-process: `comm-id`, as perf names a
    /// thread.
    #[serde(skip_serializing_if = "Option::is_none")]
    thread: Option<String>,
    event: String,
    /// The count (milliseconds for the clocks), `None` where not
    /// supported.
    #[serde(rename = "counter-value")]
    value: Option<f64>,
    unit: &'static str,
    #[serde(rename = "event-runtime")]
    runtime: u64,
    #[serde(rename = "pcnt-running")]
    running: f64,
    #[serde(rename = "metric-value")]
    metric: Option<f64>,
    #[serde(rename = "metric-unit")]
    metric_unit: &'static str,
    /// With -r: the spread of the count over the runs, in percent.
    #[serde(rename = "variance", skip_serializing_if = "Option::is_none")]
    spread: Option<f64>,
}

impl Row {
    fn new(name: &str, r: Reading, supported: bool, rated: bool, elapsed: Duration) -> Self {
        let clock = matches!(name, "task-clock" | "cpu-clock")
            || name.starts_with("task-clock:")
            || name.starts_with("cpu-clock:");
        let secs = elapsed.as_secs_f64();
        let running = if r.enabled == 0 {
            100.0
        } else {
            100.0 * r.running as f64 / r.enabled as f64
        };
        let value = r.scaled();
        let (shown, unit, metric, metric_unit) = if !supported {
            (None, "", None, "")
        } else if clock {
            // Nanoseconds of CPU time: milliseconds, and the CPUs the
            // time kept busy on average.
            let ms = value as f64 / 1e6;
            let cpus = if secs > 0.0 {
                value as f64 / 1e9 / secs
            } else {
                0.0
            };
            (Some(ms), "msec", Some(cpus), "CPUs utilized")
        } else if rated {
            let rate = if secs > 0.0 { value as f64 / secs } else { 0.0 };
            (Some(value as f64), "", Some(rate), "/sec")
        } else {
            (Some(value as f64), "", None, "")
        };
        Self {
            cpu: None,
            thread: None,
            spread: None,
            event: name.to_owned(),
            value: shown,
            unit,
            runtime: r.running,
            running,
            metric,
            metric_unit,
        }
    }
}

/// The whole count, in perf stat's layout.
#[derive(Debug, serde::Serialize)]
struct Report {
    target: String,
    rows: Vec<Row>,
    /// The runs averaged (`-r`).
    runs: usize,
    #[serde(rename = "elapsed")]
    elapsed_s: f64,
    /// With -r: the elapsed time's spread over the runs, in percent.
    #[serde(skip_serializing_if = "Option::is_none")]
    elapsed_spread: Option<f64>,
    #[serde(rename = "user", skip_serializing_if = "Option::is_none")]
    user_s: Option<f64>,
    #[serde(rename = "sys", skip_serializing_if = "Option::is_none")]
    sys_s: Option<f64>,
    #[serde(skip)]
    separator: Option<String>,
}

/// One interval's counts (`-I`), in perf stat's interval layout.
#[derive(Debug, serde::Serialize)]
struct Interval {
    /// Seconds since the start.
    #[serde(rename = "interval")]
    time: f64,
    rows: Vec<Row>,
    #[serde(skip)]
    separator: Option<String>,
    /// Whether perf's column heading comes first (the first interval).
    #[serde(skip)]
    header: bool,
}

impl Record for Interval {
    fn text(&self, out: &mut String) {
        if let Some(sep) = &self.separator {
            for r in &self.rows {
                let _ = writeln!(out, "{:.9}{sep}{}", self.time, r.csv(sep));
            }
            return;
        }
        if self.header {
            let _ = writeln!(out, "#           time             counts unit events");
        }
        for r in &self.rows {
            let _ = writeln!(out, "{:>15.9} {}", self.time, r.text());
        }
    }
}

/// A rate as perf scales it: `K/sec`, `M/sec`, `G/sec`.
fn rate(per_sec: f64) -> (f64, &'static str) {
    if per_sec >= 1e9 {
        (per_sec / 1e9, "G/sec")
    } else if per_sec >= 1e6 {
        (per_sec / 1e6, "M/sec")
    } else if per_sec >= 1e3 {
        (per_sec / 1e3, "K/sec")
    } else {
        (per_sec, "/sec")
    }
}

impl Row {
    /// perf's CSV fields: value, unit, event, run time, percent running,
    /// metric, metric unit.
    fn csv(&self, sep: &str) -> String {
        let value = match self.value {
            Some(v) if self.unit == "msec" => format!("{v:.2}"),
            Some(v) => format!("{v:.0}"),
            None => "<not supported>".to_owned(),
        };
        let metric = self.metric.map(|m| format!("{m:.2}")).unwrap_or_default();
        // perf puts the part first, and the spread after the count.
        let part = self.part().map(|p| format!("{p}{sep}")).unwrap_or_default();
        let spread = self.spread.map(|v| format!("{v:.2}%")).unwrap_or_default();
        let spread = if self.spread.is_some() {
            format!("{sep}{spread}")
        } else {
            String::new()
        };
        format!(
            "{part}{value}{sep}{}{sep}{}{spread}{sep}{}{sep}{:.2}{sep}{metric}{sep}{}",
            self.unit, self.event, self.runtime, self.running, self.metric_unit
        )
    }

    /// Sets the part of a split the row counts, named as perf names it.
    fn set_part(&mut self, part: Part, comms: &HashMap<u32, String>) {
        match part {
            Part::Whole => {}
            Part::Cpu(c) => self.cpu = Some(c),
            Part::Task(id) => {
                let comm = comms.get(&id).map_or("?", String::as_str);
                self.thread = Some(format!("{comm}-{id}"));
            }
        }
    }

    /// The part of a split it counts: `CPU3`, or `comm-tid`.
    fn part(&self) -> Option<String> {
        self.cpu
            .map(|c| format!("CPU{c}"))
            .or_else(|| self.thread.clone())
    }

    /// perf's text line: the count, its unit, the event and the metric.
    fn text(&self) -> String {
        let (value, unit) = match self.value {
            None => ("<not supported>".to_owned(), ""),
            Some(v) if self.unit == "msec" => (format!("{v:.2}"), "msec"),
            Some(v) => (thousands(v as u64), ""),
        };
        let metric = match (self.metric, self.metric_unit) {
            (Some(m), "/sec") => {
                let (m, u) = rate(m);
                format!("  #  {m:>8.3} {u}")
            }
            (Some(m), u) if !u.is_empty() => format!("  #  {m:>8.3} {u}"),
            _ => String::new(),
        };
        let spread = match self.spread {
            Some(v) => format!("  ( +- {v:>5.2}% )"),
            None => String::new(),
        };
        let metric = if spread.is_empty() || !metric.is_empty() {
            metric
        } else {
            format!("{:<20}", "")
        };
        let part = match (self.cpu, &self.thread) {
            (Some(c), _) => format!("{:<8}", format!("CPU{c}")),
            (None, Some(t)) => format!("{t:>24} "),
            _ => String::new(),
        };
        let line = format!(
            "{part}{value:>18} {unit:<4} {:<34}{metric}{spread}",
            self.event
        );
        line.trim_end().to_owned()
    }
}

impl Record for Report {
    fn text(&self, out: &mut String) {
        if let Some(sep) = &self.separator {
            for r in &self.rows {
                let _ = writeln!(out, "{}", r.csv(sep));
            }
            return;
        }
        let runs = if self.runs > 1 {
            format!(" ({} runs)", self.runs)
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "\n Performance counter stats for {}{runs}:\n",
            self.target
        );
        for r in &self.rows {
            let _ = writeln!(out, "{}", r.text());
        }
        match self.elapsed_spread {
            Some(spread) => {
                let sd = self.elapsed_s * spread / 100.0;
                let _ = writeln!(
                    out,
                    "\n{:>18.9} +- {sd:.9} seconds time elapsed  ( +- {spread:>5.2}% )",
                    self.elapsed_s
                );
            }
            None => {
                let _ = writeln!(out, "\n{:>18.9} seconds time elapsed", self.elapsed_s);
            }
        }
        if let (Some(u), Some(s)) = (self.user_s, self.sys_s) {
            let _ = writeln!(out, "\n{u:>18.9} seconds user\n{s:>18.9} seconds sys");
        }
        out.push('\n');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_printed_as_perf_prints_them() {
        assert_eq!(thousands(1234567), "1,234,567");
        assert_eq!(rate(1500.0), (1.5, "K/sec"));
    }

    #[test]
    fn syscall_tracepoints_map_to_their_numbers() {
        assert_eq!(syscall_slot("sys_enter_read"), Some(0));
        assert_eq!(syscall_slot("sys_exit_write"), Some(MAX_SYSCALLS + 1));
        assert_eq!(syscall_slot("sys_enter_no_such_call"), None);
        assert_eq!(syscall_slot("sched_switch"), None);
    }
}

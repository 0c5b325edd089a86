//! `rtrace top`: perf top's view of the hottest functions, refreshed
//! every `-d` seconds, from profile's sampling (its programs, its stack
//! walk and its symbolizer): each function's self and total (children)
//! share of the samples, with its library and the process that spends
//! most in it. Old samples decay, as perf top's do, so that the view
//! follows the workload. `-b`/`--once` print snapshots as text (or JSON)
//! for scripts.

use crate::tracer::{Outcome, Plan, Spec};
use std::{
    collections::HashMap,
    fmt::Write as _,
    io::IsTerminal as _,
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use aya::Ebpf;
use serde::Serialize;

use crate::kernel::warning::Warning;
use crate::{
    engine::sampling::{self, Event, Sampler, Sampling},
    output::{Record, Schedule, Sink, stacks::annotate::AnnotateArgs},
    stacks::{sample::Sample, symbolize::Kind},
    tracer::{
        Scope, Tool,
        scope::{parse_cpus, parse_id},
    },
};

mod live;

/// Show the functions using the most CPU, live, as perf top does.
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:
  rtrace top                      # the whole system, refreshed every second
  rtrace top -p 185               # one process's functions
  rtrace top -b -n 3 -d 2         # three snapshots as text, two seconds apart
  rtrace top --once --json        # one snapshot as JSON")]
pub struct Args {
    /// Seconds between refreshes.
    #[arg(short = 'd', long = "delay", value_name = "SECS", default_value_t = 1.0,
          value_parser = positive_secs)]
    delay: f64,
    /// Print snapshots as text instead of the live view (top's batch
    /// mode), until -n COUNT or Ctrl-C.
    #[arg(short = 'b', long = "batch")]
    batch: bool,
    /// Snapshots to print before exiting.
    #[arg(short = 'n', long = "iterations", value_name = "COUNT",
          value_parser = crate::output::at_least_one::<u64>)]
    count: Option<u64>,
    /// One snapshot, after -d seconds, then exit (-b -n 1).
    #[arg(long)]
    once: bool,
    /// Rows shown.
    #[arg(long, value_name = "N", default_value_t = 25)]
    rows: usize,
    /// Sample this many times per second on each CPU.
    #[arg(short = 'F', long = "freq", value_name = "HZ", default_value_t = 99,
          value_parser = crate::output::at_least_one::<u64>)]
    frequency: u64,
    /// Sample this event instead of CPU time (perf's names, as profile -e).
    #[arg(short = 'e', long = "event", value_name = "EVENT", value_parser = parse_event)]
    event: Option<Box<Event>>,
    /// Only these processes (comma-separated pids).
    #[arg(short = 'p', long = "pid", value_name = "PID", value_delimiter = ',',
          value_parser = parse_id)]
    pid: Vec<u32>,
    /// Only these threads (comma-separated thread ids).
    #[arg(short = 't', long = "tid", value_name = "TID", conflicts_with = "pid",
          value_delimiter = ',', value_parser = parse_id)]
    tid: Vec<u32>,
    /// Only tasks in this cgroup v2 directory, or below it.
    #[arg(short = 'c', long = "cgroup", value_name = "PATH")]
    cgroup: Option<PathBuf>,
    /// Only these CPUs (such as 0,2-3).
    #[arg(short = 'C', long = "cpu", value_name = "CPUS", value_parser = parse_cpus)]
    cpu: Option<Vec<u32>>,
    /// Kernel frames only.
    #[arg(short = 'K', long = "kernel-only", conflicts_with = "user_only")]
    kernel_only: bool,
    /// User frames only.
    #[arg(short = 'U', long = "user-only")]
    user_only: bool,
    /// Each snapshot keeps this share of the one before (perf top's 7/8):
    /// 0 shows only the last interval.
    #[arg(long, value_name = "FRACTION", default_value_t = 0.875,
          value_parser = fraction)]
    decay: f64,
}

fn positive_secs(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(s) if s > 0.0 && s.is_finite() => Ok(s),
        _ => Err(format!("{text:?} is no number of seconds above 0")),
    }
}

fn fraction(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(f) if (0.0..1.0).contains(&f) => Ok(f),
        _ => Err(format!(
            "{text:?} is no fraction from 0 up to (not including) 1"
        )),
    }
}

impl Args {
    /// The profile run this view reads: the same scope and event.
    /// Whether the view is interactive: on a terminal, without `-b` or
    /// `--once`.
    fn interactive(&self) -> bool {
        !(self.batch || self.once)
            && std::io::stdout().is_terminal()
            && std::io::stdin().is_terminal()
    }

    /// The engine's sampling this view reads.
    fn sampling(&self) -> Sampling {
        Sampling {
            // A frequency paces counters only: not with events that take
            // a stack each.
            frequency: self.event.is_none().then_some(self.frequency),
            event: self.event.as_deref().cloned().unwrap_or_default(),
            cpus: self.cpu.clone().unwrap_or_default(),
            kernel_only: self.kernel_only,
            user_only: self.user_only,
            // The leaves at their exact addresses, for the view's `a` to
            // annotate (snapshots need them by function only).
            annotate: AnnotateArgs {
                annotate_top: self.interactive().then_some(1),
                ..AnnotateArgs::default()
            },
            ..Sampling::default()
        }
    }

    /// What is traced.
    fn scope(&self) -> Scope {
        Scope {
            pids: self.pid.clone(),
            tids: self.tid.clone(),
            cgroup: self.cgroup.clone(),
            cpus: self.cpu.clone().unwrap_or_default(),
            ..Scope::default()
        }
    }
}

/// `-e`'s value, boxed, as profile's.
fn parse_event(text: &str) -> Result<Box<Event>, String> {
    sampling::parse_event(text).map(Box::new)
}

/// A function as the view lists it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Func {
    pub name: Arc<str>,
    pub module: Option<Arc<str>>,
    /// Kernel code.
    pub kernel: bool,
}

/// What the view keeps of a function: decayed sample counts.
#[derive(Debug, Default, Clone)]
pub(crate) struct Row {
    pub self_count: f64,
    pub total_count: f64,
    /// Samples by process (comm, pid), for its busiest one.
    pub by_process: HashMap<(String, u32), f64>,
    /// Samples through it by the function that called it, and by the
    /// one it called (its stacks' neighbours).
    pub callers: HashMap<Func, f64>,
    pub callees: HashMap<Func, f64>,
}

impl Row {
    /// The process that spends most in it.
    pub fn busiest(&self) -> (String, u32) {
        self.by_process
            .iter()
            .max_by(|a, b| a.1.total_cmp(b.1).then(b.0.cmp(a.0)))
            .map(|(k, _)| k.clone())
            .unwrap_or_default()
    }
}

/// How the rows are ordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sort {
    /// Self share, highest first.
    SelfShare,
    /// Total (children) share.
    Total,
    /// Command, then self share.
    Comm,
    /// Shared object, then self share.
    Dso,
}

/// The decayed samples of every function seen.
#[derive(Debug, Default)]
pub(crate) struct Model {
    pub rows: HashMap<Func, Row>,
    /// Samples the shares are of (decayed).
    pub samples: f64,
    /// Samples in the last interval.
    pub new: u64,
    /// rtrace's own CPU in the last interval, percent of one CPU.
    pub own: f64,
}

impl Model {
    /// Decays what it holds by `keep` and adds an interval's samples.
    pub fn add(&mut self, samples: &[Sample], keep: f64) {
        self.samples *= keep;
        for row in self.rows.values_mut() {
            row.self_count *= keep;
            row.total_count *= keep;
            row.by_process.values_mut().for_each(|v| *v *= keep);
            for m in [&mut row.callers, &mut row.callees] {
                m.values_mut().for_each(|v| *v *= keep);
                m.retain(|_, v| *v >= 0.01);
            }
        }
        // Rows too small to show again go.
        self.rows.retain(|_, r| r.total_count >= 0.01);
        self.new = 0;
        for s in samples {
            let n = s.count as f64;
            self.samples += n;
            self.new += s.count;
            // Kernel frames are leaf-most: the sample's own function is
            // the first of them, else the first user frame. Functions are
            // symbols, as perf top lists them: what was inlined into one
            // is its own.
            let frames: Vec<Func> = s
                .kernel
                .iter()
                .chain(s.user.iter())
                .filter(|f| f.kind != Kind::Inlined)
                .map(|f| Func {
                    name: Arc::clone(&f.name),
                    module: f.module.clone(),
                    kernel: f.kind == Kind::Kernel,
                })
                .collect();
            let mut seen: Vec<&Func> = Vec::new();
            for (i, func) in frames.iter().enumerate() {
                let row = self.rows.entry(func.clone()).or_default();
                if i > 0 {
                    *row.callees.entry(frames[i - 1].clone()).or_default() += n;
                }
                if let Some(caller) = frames.get(i + 1) {
                    *row.callers.entry(caller.clone()).or_default() += n;
                }
                // A recursive function counts once a stack in its total.
                if seen.contains(&func) {
                    continue;
                }
                row.total_count += n;
                if i == 0 {
                    row.self_count += n;
                }
                *row.by_process.entry((s.comm.clone(), s.pid)).or_default() += n;
                seen.push(func);
            }
        }
    }

    /// The rows in `sort` order, those `keep` lets through.
    pub fn sorted(&self, sort: Sort, keep: impl Fn(&Func, &Row) -> bool) -> Vec<(&Func, &Row)> {
        let mut rows: Vec<(&Func, &Row)> = self.rows.iter().filter(|(f, r)| keep(f, r)).collect();
        let by_self = |a: &(&Func, &Row), b: &(&Func, &Row)| {
            b.1.self_count
                .total_cmp(&a.1.self_count)
                .then(b.1.total_count.total_cmp(&a.1.total_count))
                .then(a.0.name.cmp(&b.0.name))
        };
        match sort {
            Sort::SelfShare => rows.sort_by(by_self),
            Sort::Total => rows.sort_by(|a, b| {
                b.1.total_count
                    .total_cmp(&a.1.total_count)
                    .then(by_self(a, b))
            }),
            Sort::Comm => {
                rows.sort_by(|a, b| a.1.busiest().0.cmp(&b.1.busiest().0).then(by_self(a, b)))
            }
            Sort::Dso => rows.sort_by(|a, b| a.0.module.cmp(&b.0.module).then(by_self(a, b))),
        }
        rows
    }
}

/// One snapshot of the view.
#[derive(Debug, Serialize)]
struct Snapshot {
    /// Samples the shares are of (decayed).
    samples: f64,
    /// Samples in the last interval.
    new_samples: u64,
    /// rtrace's own CPU use in the last interval, percent of one CPU.
    own_cpu_percent: f64,
    rows: Vec<SnapshotRow>,
    #[serde(skip)]
    text: String,
}

#[derive(Debug, Serialize)]
struct SnapshotRow {
    self_percent: f64,
    total_percent: f64,
    symbol: String,
    module: Option<String>,
    comm: String,
    pid: u32,
}

impl Record for Snapshot {
    fn text(&self, out: &mut String) {
        out.push_str(&self.text);
    }
}

/// rtrace's own CPU time so far (user and system), from `/proc/self/stat`.
fn own_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The fields after the command, which may hold spaces, in parentheses.
    let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // utime and stime are fields 14 and 15; `after` starts at field 3.
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Duration::from_secs_f64((ticks(11) + ticks(12)) as f64 / hz)
}

/// The tool.
pub struct Top {
    args: Args,
    sampler: Sampler,
    scope: Scope,
    /// The samples, in batch mode; the live view keeps its own.
    model: Model,
    /// The interactive view, on a terminal without `-b`.
    live: Option<live::Live>,
    last: (Instant, Duration),
    shown: u64,
}

impl Tool for Top {
    type Args = Args;

    const SPEC: Spec = Spec::new("top", &[], sampling::ERRORS)
        .object(sampling::OBJECT)
        .expected(sampling::EXPECTED);

    super::sampling_tool!();

    fn new(args: Args) -> anyhow::Result<Self> {
        Ok(Self {
            sampler: Sampler::new(args.sampling())?,
            scope: args.scope(),
            args,
            model: Model::default(),
            live: None,
            last: (Instant::now(), Duration::ZERO),
            shown: 0,
        })
    }

    fn banner(&self) -> String {
        format!(
            "Sampling {} Hz, refreshed every {} s... Hit Ctrl-C to end.",
            self.args.frequency, self.args.delay
        )
    }

    fn start(&mut self) {
        self.sampler.start();
        self.last = (Instant::now(), own_cpu());
        if self.args.interactive() {
            match live::Live::start(self.args.frequency, self.args.delay) {
                Ok(l) => self.live = Some(l),
                Err(e) => {
                    Warning::unsupported(format!("no interactive view ({e}): text snapshots"))
                        .print()
                }
            }
        }
    }

    fn tick(&mut self, ebpf: &mut Ebpf, sink: &mut Sink, last: bool) -> anyhow::Result<()> {
        let samples = self.sampler.take_interval(ebpf)?;
        let (then, cpu_then) = self.last;
        let cpu_now = own_cpu();
        let wall = then.elapsed().as_secs_f64().max(1e-3);
        let own = (cpu_now.saturating_sub(cpu_then)).as_secs_f64() / wall * 100.0;
        self.last = (Instant::now(), cpu_now);
        self.shown += 1;
        if let Some(live) = &self.live {
            if !last {
                live.update(&samples, self.args.decay, own);
            }
            return Ok(());
        }
        self.model.add(&samples, self.args.decay);
        self.model.own = own;
        let snap = self.snapshot();
        sink.emit(&snap)
    }

    fn finish(&mut self, _ebpf: &mut Ebpf, _sink: &mut Sink) -> anyhow::Result<()> {
        // The view is the output: no report at the end; the terminal is
        // given back as it was.
        self.live = None;
        Ok(())
    }

    fn plan(&self) -> Plan {
        Plan {
            events: Some(self.sampler.events().clone()),
            duration: self.sampler.duration(),
            scope: self.scope.clone(),
            interval: {
                let count = if self.args.once {
                    Some(1)
                } else {
                    self.args.count
                };
                Schedule::Every {
                    period: Duration::from_secs_f64(self.args.delay),
                    count,
                }
            },
            ..Plan::default()
        }
    }

    fn outcome(&self) -> Outcome {
        Outcome {
            summary: vec![format!("{} snapshots shown", self.shown)],
            warnings: self.sampler.warnings(),
        }
    }
}

impl Top {
    /// The model's rows, by self share, and their text.
    fn snapshot(&self) -> Snapshot {
        let m = &self.model;
        let total = m.samples.max(1e-9);
        let mut rows = m.sorted(Sort::SelfShare, |_, _| true);
        rows.truncate(self.args.rows);
        let out: Vec<SnapshotRow> = rows
            .iter()
            .map(|(f, r)| {
                let (comm, pid) = r.busiest();
                SnapshotRow {
                    self_percent: r.self_count / total * 100.0,
                    total_percent: r.total_count / total * 100.0,
                    symbol: f.name.to_string(),
                    module: f.module.as_deref().map(str::to_owned),
                    comm,
                    pid,
                }
            })
            .collect();
        let mut text = String::new();
        let _ = writeln!(
            text,
            "rtrace top: {} samples in {:.1} s at {} Hz, {:.0} decayed; rtrace's own CPU {:.1}%",
            m.new, self.args.delay, self.args.frequency, m.samples, m.own
        );
        let _ = writeln!(
            text,
            "{:>7} {:>8}  {:<16} {:>7}  {:<24} SYMBOL",
            "SELF", "CHILDREN", "COMM", "PID", "SHARED OBJECT"
        );
        for r in &out {
            let _ = writeln!(
                text,
                "{:>6.2}% {:>7.2}%  {:<16} {:>7}  {:<24} {}",
                r.self_percent,
                r.total_percent,
                r.comm,
                r.pid,
                short_module(r.module.as_deref()),
                r.symbol
            );
        }
        text.push('\n');
        Snapshot {
            samples: m.samples,
            new_samples: m.new,
            own_cpu_percent: m.own,
            rows: out,
            text,
        }
    }
}

/// A shared object's file name, or `[unknown]`.
pub(crate) fn short_module(module: Option<&str>) -> &str {
    module
        .map(|m| m.rsplit('/').next().unwrap_or(m))
        .unwrap_or("[unknown]")
}

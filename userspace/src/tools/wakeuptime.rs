//! `rtrace wakeuptime`: who wakes blocked threads, and how long they were
//! blocked, by the waker's stack, as bcc's wakeuptime. The stack engine's
//! context-switch programs already count each block by the blocked
//! thread's stacks and its waker's (offcputime's `--waker`); this tool
//! keeps the waker's side of those counts and prints it in bcc's layout.

use crate::tracer::{Outcome, Plan, Spec};
use std::{collections::HashMap, sync::Arc};

use aya::Ebpf;
use rtrace_common::offcputime::{ERR_NAMES, THREADS_ALL, THREADS_USER};

use crate::{
    engine::{
        offcpu::{self, BlockTimeArgs, Filter, OffCpuStacks},
        stacktool::StackArgs,
    },
    kernel::{features::Mechanism, transport::BufferArgs},
    output::{
        Record, Sink,
        files::{PerSampleOutputs, StackReports},
        stacks::{self, Stacks, Style, TextOptions, name, transform::TransformArgs},
    },
    stacks::{
        sample::{Sample, Thread},
        symbolize::{Frame, Kind},
    },
    tracer::{Scope, ScopeArgs, Tool, own},
};

/// Summarize blocked time by the stack of the thread that ended it: who
/// wakes whom, and how long the woken thread was blocked.
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:
  rtrace wakeuptime             # trace blocked time with waker stacks until Ctrl-C
  rtrace wakeuptime 5           # trace for 5 seconds only
  rtrace wakeuptime -f 5        # 5 seconds, and output in folded format
  rtrace wakeuptime -u          # don't include kernel threads (user only)
  rtrace wakeuptime -p 185      # only threads of PID 185 blocked (any waker)
  rtrace wakeuptime -K -v       # wakers' kernel stacks only, with addresses, as bcc
  rtrace wakeuptime -m 1000     # only blocks of 1 ms or more")]
pub struct Args {
    /// Trace for this many seconds; without it, until Ctrl-C (not with
    /// -- CMD, which says when to stop).
    #[arg(value_parser = crate::output::at_least_one::<u64>)]
    duration: Option<u64>,
    #[command(flatten)]
    scope: ScopeArgs<{ own::U }>,
    /// Blocked user threads only (no kernel threads).
    #[arg(short = 'u', long = "useronly", visible_alias = "user-threads-only")]
    user_threads: bool,
    /// Show the wakers' user space stacks only (no kernel stacks).
    #[arg(short = 'U', long = "user-stacks-only", conflicts_with = "kernel_only")]
    user_only: bool,
    /// Show the wakers' kernel stacks only (no user stacks), as bcc does.
    #[arg(short = 'K', long = "kernel-stacks-only")]
    kernel_only: bool,
    /// Print folded stacks (`waker;frames..;target microseconds`), as
    /// flame graph tools read them.
    #[arg(short = 'f', long)]
    folded: bool,
    #[command(flatten)]
    block_time: BlockTimeArgs,
    /// The tracepoint mechanism to attach with, instead of the best that
    /// works.
    #[arg(long, value_name = "MECHANISM", value_parser = Mechanism::parser(&offcpu::CHAIN))]
    attach: Option<Mechanism>,
    /// --firefox and --samples: each block on its own, in the woken
    /// thread, at the time it was woken, weighing the nanoseconds it was
    /// blocked, its stack the waker's under a root frame naming the waker
    /// (`waker: COMM PID`).
    #[command(flatten)]
    each: PerSampleOutputs,
    #[command(flatten)]
    stacks: StackArgs,
    #[command(flatten)]
    buffer: BufferArgs,
}

/// The tool.
pub struct Wakeuptime {
    args: Args,
    /// The context-switch programs, with the wakers' stacks, and the
    /// stacks they count.
    run: OffCpuStacks,
    /// Microseconds blocked with no waker seen (woken before tracing
    /// began), for `-v`.
    unwoken: u64,
    /// The files asked for, created before anything is attached.
    reports: StackReports,
}

impl Tool for Wakeuptime {
    type Args = Args;

    const SPEC: Spec = Spec::new("wakeuptime", &offcpu::CHAIN, &ERR_NAMES)
        .object(offcpu::OBJECT)
        .expected(&rtrace_common::stacks::ERR_EXPECTED);

    super::off_cpu_tool!();

    fn new(args: Args) -> anyhow::Result<Self> {
        args.block_time.check()?;
        let reports = StackReports::create([
            None,
            None,
            None,
            None,
            None,
            args.each.firefox.as_deref(),
            args.each.samples.as_deref(),
        ])?;
        let mut run = OffCpuStacks::default();
        if args.each.any() {
            run.send_each();
        }
        Ok(Self {
            args,
            run,
            unwoken: 0,
            reports,
        })
    }

    fn banner(&self) -> String {
        let a = &self.args;
        let whom = match a.scope.whom() {
            Some(whom) => whom,
            None if a.user_threads => "user threads".to_owned(),
            None => "all threads".to_owned(),
        };
        offcpu::banner(
            "blocked time (us)",
            &whom,
            "waker ",
            &self.filter(),
            a.duration,
        )
    }

    fn finish(&mut self, ebpf: &mut Ebpf, sink: &mut Sink) -> anyhow::Result<()> {
        let counted = self.run.finish(ebpf)?;
        let product = "rtrace wakeuptime: blocked time by waker";
        self.run
            .write_each(&mut self.reports, product, &mut by_its_waker())?;
        let (samples, unwoken) = by_waker(counted, &self.args.stacks.transforms);
        self.unwoken = unwoken.saturating_add(500) / 1000;
        sink.emit(&Wakeups(Stacks {
            samples: &samples,
            style: if self.args.folded {
                Style::Folded(TextOptions::default())
            } else {
                Style::Multiline(TextOptions::default())
            },
            value: "us",
        }))?;
        self.run.stacks.reported(&samples, "us blocked");
        Ok(())
    }

    fn plan(&self) -> Plan {
        Plan {
            // rtrace's own threads wait for the kernel all the time.
            scope: Scope {
                exclude_self: true,
                ..self.args.scope.scope()
            },
            forced: self.args.attach,
            events: Some(self.args.buffer.clone()),
            interval: crate::output::Schedule::Every {
                period: std::time::Duration::from_secs(1),
                count: None,
            },
            duration: self.args.duration,
            ..Plan::default()
        }
    }

    fn outcome(&self) -> Outcome {
        Outcome {
            summary: {
                let mut out = self.run.stacks.summary();
                out.push(format!(
                    "{} us blocked with no waker seen (woken before tracing began), not shown",
                    self.unwoken
                ));
                out
            },
            warnings: self.run.stacks.warnings(),
        }
    }
}

impl Wakeuptime {
    /// What the kernel counts, from the flags.
    fn filter(&self) -> Filter {
        let (min_ns, max_ns) = self.args.block_time.bounds_ns();
        Filter {
            min_ns,
            max_ns,
            user: !self.args.kernel_only,
            kernel: !self.args.user_only,
            threads: if self.args.user_threads {
                THREADS_USER
            } else {
                THREADS_ALL
            },
            // A preempted thread is not woken: leaving it out spares its
            // walk, and nothing is lost.
            state: offcpu::ASLEEP,
            waker: true,
            sched_frames: false,
            per_thread: false,
            time_keys: false,
        }
    }
}

/// Blocked time by the woken thread and its waker's stacks, hottest
/// first, in microseconds: the woken thread's own stacks, which the
/// engine counts by too, are let go, and `transforms` (`--hide` and the
/// like) apply to the waker's. Also the nanoseconds with no waker.
fn by_waker(counted: Vec<Sample>, transforms: &TransformArgs) -> (Vec<Sample>, u64) {
    type Key = (String, u32, String, u32, Arc<[Frame]>, Arc<[Frame]>);
    let mut sums: HashMap<Key, u64> = HashMap::new();
    let mut unwoken = 0u64;
    for s in counted {
        let Some(w) = s.waker else {
            unwoken += s.count;
            continue;
        };
        let root_first = w.user.iter().rev().map(|f| (false, f));
        let root_first = root_first.chain(w.kernel.iter().rev().map(|f| (true, f)));
        let kept = transforms.apply(root_first.collect(), |(_, f)| &f.name);
        let leaf_first = |kernel: bool| -> Arc<[Frame]> {
            let side = kept.iter().rev().filter(|(k, _)| *k == kernel);
            side.map(|(_, f)| (*f).clone()).collect()
        };
        let key = (
            s.comm,
            s.pid,
            w.comm.clone(),
            w.pid,
            leaf_first(false),
            leaf_first(true),
        );
        *sums.entry(key).or_default() += s.count;
    }
    let samples = sums
        .into_iter()
        .map(|((comm, pid, wcomm, wpid, user, kernel), count)| {
            let waker = Thread {
                comm: wcomm,
                pid: wpid,
                user,
                kernel,
            };
            Sample {
                comm,
                pid,
                started: 0,
                tid: 0,
                user: Arc::new([]),
                kernel: Arc::new([]),
                count,
                waker: Some(Arc::new(waker)),
                off_cpu: false,
                slot: 0,
                cut_short: false,
            }
        });
    (stacks::in_micros(samples.collect()), unwoken)
}

/// Each block as the per-sample files show it: in the woken thread, its
/// stacks the waker's (the woken thread's own are let go, as in the
/// counts), under a root frame `waker: COMM PID`; a block with no waker
/// seen is left out, as the counts leave it. Wakers' stacks are
/// shared, so that each distinct one is transformed and written once.
fn by_its_waker() -> impl FnMut(Sample) -> Option<Sample> {
    type Key = (usize, String, u32);
    let mut done: HashMap<Key, Arc<[Frame]>> = HashMap::new();
    move |mut s| {
        let w = s.waker.take()?;
        let key = (
            Arc::as_ptr(&w.user).cast::<u8>() as usize,
            w.comm.clone(),
            w.pid,
        );
        s.user = done
            .entry(key)
            .or_insert_with(|| {
                let root = Frame::missed(&format!("waker: {} {}", w.comm, w.pid), Kind::User);
                w.user.iter().cloned().chain([root]).collect()
            })
            .clone();
        s.kernel = Arc::clone(&w.kernel);
        // The waker's stacks were on the CPU: no `[off-CPU]` between them.
        s.off_cpu = false;
        Some(s)
    }
}

/// The report: JSON as every stack tool's (the woken thread's `comm`,
/// `pid` and `us`, no frames of its own, and its `waker` with them), text
/// in bcc wakeuptime's layout.
#[derive(serde::Serialize)]
#[serde(transparent)]
struct Wakeups<'a>(Stacks<'a>);

impl Record for Wakeups<'_> {
    fn text(&self, out: &mut String) {
        use std::fmt::Write as _;
        let samples = self.0.samples;
        let frames = |w: &Thread| -> Vec<String> {
            let leaf_first = w.kernel.iter().chain(w.user.iter());
            leaf_first.map(|f| name(f, false)).collect()
        };
        if let Style::Folded(_) = self.0.style {
            // The waker's command, its frames root first, the woken's.
            for s in samples {
                let Some(w) = &s.waker else { continue };
                let mut line = vec![w.comm.replace(' ', "_")];
                line.extend(frames(w).iter().rev().map(|n| n.replace(';', ":")));
                line.push(s.comm.replace(' ', "_"));
                let _ = writeln!(out, "{} {}", line.join(";"), s.count);
            }
            return;
        }
        // The hottest last, nearest the prompt, as bcc prints it.
        for s in samples.iter().rev() {
            let Some(w) = &s.waker else { continue };
            let _ = writeln!(out, "    {:<16} {} {}", "target:", s.comm, s.pid);
            for f in frames(w) {
                let _ = writeln!(out, "    {f}");
            }
            let _ = writeln!(out, "    {:<16} {} {}", "waker:", w.comm, w.pid);
            let _ = writeln!(out, "        {}\n", s.count);
        }
    }
}

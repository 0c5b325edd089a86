//! `rtrace offcputime`: where threads wait. At each context switch the
//! kernel takes the stacks of the thread leaving the CPU and, when it runs
//! again, adds the time it was off to those stacks, as bcc's offcputime
//! does; user stacks come from the same CFI walk as profile's, so they
//! reach through libc's blocking wrappers in code without frame pointers.

use crate::tracer::{Outcome, Plan, Spec};
use crate::tracer::{ScopeArgs, own};

use aya::Ebpf;
use inferno::flamegraph::color::{BasicPalette, Palette};
use rtrace_common::{
    offcputime::{ERR_NAMES, STATE_ANY, THREADS_ALL, THREADS_KERNEL, THREADS_USER},
    profile::HEAT_SLOT_NS,
};

use crate::{
    engine::{
        offcpu::{self, BlockTimeArgs, Filter, OffCpuStacks},
        stacktool::StackArgs,
    },
    kernel::{features::Mechanism, transport::BufferArgs},
    output::{
        Schedule, Sink,
        files::{self, StackOutputs, StackReports},
        stacks::{self, FlameOptions, Stacks, TextOptions, report::Report},
    },
    stacks::sample::Sample,
    tracer::{Scope, Tool},
};

/// Summarize off-CPU time by stack trace: where threads block, and for
/// how long.
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:
  rtrace offcputime             # trace off-CPU stack time until Ctrl-C
  rtrace offcputime 5           # trace for 5 seconds only
  rtrace offcputime -f 5        # 5 seconds, and output in folded format
  rtrace offcputime -m 1000     # trace only events that last more than 1000 usec
  rtrace offcputime -M 10000    # trace only events that last less than 10000 usec
  rtrace offcputime -p 185      # only trace threads for PID 185
  rtrace offcputime -t 188      # only trace thread 188
  rtrace offcputime -u          # only trace user threads (no kernel)
  rtrace offcputime -k          # only trace kernel threads (no user)
  rtrace offcputime -U          # only show user space stacks (no kernel)
  rtrace offcputime -K          # only show kernel space stacks (no user)
  rtrace offcputime --state D   # only threads blocked uninterruptibly (I/O)
  rtrace offcputime --waker -p 185   # and the stacks of the threads that woke them
  rtrace offcputime --svg off.svg 10   # an off-CPU flame graph of 10 seconds
  rtrace offcputime -- make -j2        # where a build and all it starts wait, until it ends
  rtrace offcputime -p 185 -- sleep 10   # PID 185 for as long as the command runs")]
pub struct Args {
    /// Trace for this many seconds; without it, until Ctrl-C (not with
    /// -- CMD, which says when to stop).
    #[arg(value_parser = crate::output::at_least_one::<u64>)]
    duration: Option<u64>,
    #[command(flatten)]
    scope: ScopeArgs<{ own::U }>,
    /// User threads only (no kernel threads).
    #[arg(
        short = 'u',
        long = "user-threads-only",
        conflicts_with = "kernel_threads"
    )]
    user_threads: bool,
    /// Kernel threads only (no user threads).
    #[arg(short = 'k', long = "kernel-threads-only")]
    kernel_threads: bool,
    /// Show stacks from user space only (no kernel space stacks).
    #[arg(short = 'U', long = "user-stacks-only", conflicts_with = "kernel_only")]
    user_only: bool,
    /// Show stacks from kernel space only (no user space stacks).
    #[arg(short = 'K', long = "kernel-stacks-only")]
    kernel_only: bool,
    /// Insert a delimiter between kernel and user stacks.
    #[arg(short = 'd', long = "delimited")]
    delimited: bool,
    /// Print folded stacks (`comm;frames.. microseconds`), as flame graph
    /// tools read them.
    #[arg(short = 'f', long)]
    folded: bool,
    #[command(flatten)]
    block_time: BlockTimeArgs,
    /// Count only threads leaving the CPU in this state: a number as in
    /// include/linux/sched.h (0 = runnable, that is preempted; otherwise a
    /// mask, e.g. 2 = TASK_UNINTERRUPTIBLE) or letters as ps shows them:
    /// R (preempted), S (sleeping), D (uninterruptible), T (stopped),
    /// t (traced), I (idle).
    #[arg(long, value_parser = parse_state)]
    state: Option<u32>,
    /// Also record the stack of the thread that woke each blocked one, as
    /// bcc's offwaketime does: shown above the blocked stack, joined at
    /// `--` (folded: after it, leaf to leaf).
    #[arg(long)]
    waker: bool,
    /// Keep the scheduler's and the lock primitives' own frames (schedule,
    /// mutex_lock, io_schedule...) at the leaf of kernel stacks, as bcc
    /// shows them: the stack is then walked as the thread leaves the CPU,
    /// which costs more per switch. Without it, it is walked from where
    /// the thread stopped, as /proc/PID/stack shows it.
    #[arg(long)]
    sched_frames: bool,
    #[command(flatten)]
    outputs: StackOutputs,
    /// The tracepoint mechanism to attach with, instead of the best that
    /// works.
    #[arg(long, value_name = "MECHANISM", value_parser = Mechanism::parser(&offcpu::CHAIN))]
    attach: Option<Mechanism>,
    #[command(flatten)]
    stacks: StackArgs,
    #[command(flatten)]
    buffer: BufferArgs,
}

/// Task states by the letters `ps` shows, as `task_struct.__state` bits.
const STATES: [(char, u32); 6] = [
    ('R', 0),
    ('S', 0x1),
    ('D', 0x2),
    ('T', 0x4),
    ('t', 0x8),
    // TASK_IDLE: uninterruptible, not counted as load.
    ('I', 0x402),
];

/// Bits a task state can have (up to TASK_RTLOCK_WAIT and TASK_FREEZABLE).
const STATE_BITS: u32 = 0xffff;

/// `--state`: a number, or `ps` letters.
fn parse_state(s: &str) -> Result<u32, String> {
    let letters = "R, S, D, T, t or I";
    if let Ok(n) = s.parse::<u32>() {
        if n & !STATE_BITS != 0 {
            return Err(format!(
                "unknown state {n:#x}: task states are bits of {STATE_BITS:#x} (or {letters})"
            ));
        }
        return Ok(n);
    }
    if s.len() > 1 && s.contains('R') {
        return Err("R (runnable, that is preempted) is 0 and cannot be combined".into());
    }
    let mut mask = 0;
    for (i, c) in s.chars().enumerate() {
        let Some(&(_, bits)) = STATES.iter().find(|(l, _)| *l == c) else {
            return Err(format!(
                "unknown state {c:?} at column {}: expected a number or {letters}",
                i + 1
            ));
        };
        mask |= bits;
    }
    Ok(mask)
}

/// The tool.
pub struct Offcputime {
    args: Args,
    /// The context-switch programs and the stacks they count.
    run: OffCpuStacks,
    /// The files asked for, created before anything is attached.
    reports: StackReports,
}

impl Tool for Offcputime {
    type Args = Args;

    const SPEC: Spec = Spec::new("offcputime", &offcpu::CHAIN, &ERR_NAMES)
        .expected(&rtrace_common::stacks::ERR_EXPECTED);

    super::off_cpu_tool!();

    fn new(args: Args) -> anyhow::Result<Self> {
        args.block_time.check()?;
        let reports = args.outputs.create()?;
        let mut run = OffCpuStacks::default();
        if args.outputs.per_sample() {
            // Each wait counted is also sent on its own, within the same
            // -m and -M bounds, so that they add up to the counts.
            run.send_each();
        }
        // JIT frames left unnamed are named later from the pprof file.
        run.stacks.names_later_in(args.outputs.pprof.as_deref());
        Ok(Self { reports, args, run })
    }

    fn banner(&self) -> String {
        let a = &self.args;
        let whom = if let Some(whom) = a.scope.whom() {
            whom
        } else if a.user_threads {
            "user threads".to_owned()
        } else if a.kernel_threads {
            "kernel threads".to_owned()
        } else {
            "all threads".to_owned()
        };
        offcpu::banner("off-CPU time (us)", &whom, "", &self.filter(), a.duration)
    }

    fn finish(&mut self, ebpf: &mut Ebpf, sink: &mut Sink) -> anyhow::Result<()> {
        let elapsed = self.run.stacks.elapsed();
        // Counted in nanoseconds; bcc shows microseconds. The pprof keeps
        // the nanoseconds too, which the waits on their own add up to.
        let exact = self.run.finish(ebpf)?;
        let counted = stacks::in_micros(exact.clone());
        let product = "rtrace offcputime: time off the CPU";
        self.run.write_each(&mut self.reports, product, &mut Some)?;
        // Counted by thread (for pprof, or a table by thread), the other
        // outputs still print each stack once.
        let merged;
        let samples: &[Sample] = if self.per_thread() || self.time_keys() {
            merged = stacks::merge(counted.clone(), false);
            &merged
        } else {
            &counted
        };
        self.write_files(samples, &exact, elapsed)?;
        if let Some(file) = self.reports.heatmap.take() {
            let counts = crate::output::heatmap::by_slot(&counted);
            let title = "rtrace offcputime: time off the CPU by when each wait ended";
            let what = format!("{} us", files::thousands(counts.iter().sum()));
            let zero = self.run.time_zero();
            file.write(&what, |out| {
                crate::output::heatmap::write_svg(&counts, HEAT_SLOT_NS, zero, title, out)
                    .map_err(Into::into)
            })?;
        }
        if let Some(file) = self.reports.html.take() {
            let page = self.run.stacks.page(
                ebpf,
                "rtrace offcputime: time off the CPU".to_owned(),
                "us",
                &counted,
                ["Off-CPU time (us)", "Lost waits"],
                vec![("Events".to_owned(), "sched:sched_switch".to_owned())],
            )?;
            file.write(&files::held(samples, "us"), |out| {
                crate::output::html::write(&page, out)
            })?;
        }
        if self.args.outputs.report {
            let report = Report::new(
                &counted,
                &self.args.outputs.report_opts,
                "offcpu-time",
                "us",
            );
            sink.emit(&report)?;
            self.run.stacks.reported(samples, "us off CPU");
            return Ok(());
        }
        let text = TextOptions {
            delimiter: self.args.delimited,
            annotate: false,
        };
        let files = self.args.outputs.files();
        Stacks::print(sink, samples, text, self.args.folded, files, "us")?;
        self.run.stacks.reported(samples, "us off CPU");
        Ok(())
    }

    fn plan(&self) -> Plan {
        Plan {
            scope: Scope {
                // rtrace's own threads wait for the kernel all the time, and
                // would be most of what a whole-system trace shows.
                exclude_self: true,
                ..self.args.scope.scope()
            },
            forced: self.args.attach,
            events: Some(self.args.buffer.clone()),
            interval: Schedule::Every {
                period: std::time::Duration::from_secs(1),
                count: None,
            },
            duration: self.args.duration,
            ..Plan::default()
        }
    }

    fn outcome(&self) -> Outcome {
        Outcome {
            summary: self.run.stacks.summary(),
            warnings: self.run.stacks.warnings(),
        }
    }
}

impl Offcputime {
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
            } else if self.args.kernel_threads {
                THREADS_KERNEL
            } else {
                THREADS_ALL
            },
            state: self.args.state.unwrap_or(STATE_ANY),
            waker: self.args.waker,
            sched_frames: self.args.sched_frames,
            per_thread: self.per_thread(),
            time_keys: self.time_keys(),
        }
    }

    /// Whether blocked time is counted by thread: for a table by thread,
    /// and for a pprof, which keeps each sample's thread.
    fn per_thread(&self) -> bool {
        self.args.outputs.report_opts.by_thread() || self.args.outputs.pprof.is_some()
    }

    /// Whether blocked time is counted by time slot: for the page's
    /// ranges, a pprof's time labels and the heat map.
    fn time_keys(&self) -> bool {
        let o = &self.args.outputs;
        o.html.is_some() || o.pprof.is_some() || o.heatmap.is_some()
    }

    /// Writes the files asked for: the flame graph from `samples` (in
    /// microseconds), the pprof from `exact` (in nanoseconds), which
    /// keeps threads apart.
    fn write_files(
        &mut self,
        samples: &[Sample],
        exact: &[Sample],
        elapsed: std::time::Duration,
    ) -> anyhow::Result<()> {
        let lines = self.args.stacks.lines;
        let what = files::held(samples, "us");
        if let Some(file) = self.reports.svg.take() {
            let opts = FlameOptions {
                title: "Off-CPU Time Flame Graph".to_owned(),
                icicle: self.args.outputs.icicle,
                count_name: "us".to_owned(),
                // Blues, as off-CPU and I/O graphs are drawn since
                // FlameGraph's `--color=io`.
                palette: Palette::Basic(BasicPalette::Io),
            };
            file.write(&what, |out| stacks::write_svg(samples, out, &opts))?;
        }
        if let Some(file) = self.reports.pprof.take() {
            let meta = stacks::pprof::Meta {
                types: &[("off_cpu", "microseconds"), ("off_cpu_time", "nanoseconds")],
                // Microseconds rounded as the other outputs round them,
                // and the nanoseconds counted.
                values: &|_, s: &Sample| vec![s.count.saturating_add(500) / 1000, s.count],
                period_type: ("off_cpu_time", "nanoseconds"),
                period: 1000,
                time_nanos: self.run.stacks.started_nanos(),
                duration_nanos: elapsed.as_nanos() as u64,
                comments: &[],
            };
            file.write(&what, |out| stacks::pprof::write(exact, out, &meta, lines))?;
        }
        if let Some(file) = self.reports.speedscope.take() {
            file.write(&what, |out| {
                stacks::write_speedscope(samples, out, "rtrace offcputime", "microseconds")
            })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::parse_state;

    #[test]
    fn states_parse_as_numbers_and_letters() {
        assert_eq!(parse_state("2"), Ok(2));
        assert_eq!(parse_state("D"), Ok(2));
        assert_eq!(parse_state("SD"), Ok(3));
        assert_eq!(parse_state("R"), Ok(0));
        assert!(parse_state("X").unwrap_err().contains("column 1"));
        assert!(parse_state("SX").unwrap_err().contains("column 2"));
        assert!(parse_state("65536").is_err());
        assert!(parse_state("RS").is_err());
    }
}

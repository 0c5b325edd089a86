//! `rtrace profile`: CPU profiling by timed sampling of stacks, as bcc's
//! profile does it, with symbolized kernel, user and JIT frames, and flame
//! graph, pprof and speedscope files. A front-end of the engine's
//! sampling ([`Sampler`]): its flags become a [`Sampling`].

use crate::tracer::Spec;
use std::time::Duration;

use crate::{
    engine::{
        sampling::{self, Event, RuntimeWalk, Sampler, Sampling},
        stacktool::StackArgs,
    },
    kernel::transport::BufferArgs,
    output::{
        files::StackOutputs,
        stacks::{TextOptions, annotate::AnnotateArgs},
    },
    tracer::{Scope, ScopeArgs, Tool, own},
};

/// `-e`'s value, boxed: the arguments of every tool are one enum, which
/// should not grow by a spec's strings.
fn parse_event_arg(text: &str) -> Result<Box<Event>, String> {
    sampling::parse_event(text).map(Box::new)
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
    #[command(flatten)]
    outputs: StackOutputs,
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
    /// Load the walk through runtimes' frames as sampling starts, rather
    /// than when a process of a runtime is first met: a slower start, but
    /// the first samples of a Python, Java or Node process started later
    /// are walked whole too. Alone, every runtime's walk; with a list
    /// (`--preload-runtime-walks=java`), the walk through those named.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        num_args = 0..,
        require_equals = true,
        value_name = "RUNTIMES"
    )]
    preload_runtime_walks: Option<Vec<RuntimeWalk>>,
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

    /// What the flags ask of the engine.
    fn sampling(self) -> Sampling {
        Sampling {
            period: self.period(),
            event: *self.event,
            frequency: self.frequency,
            duration: self.duration,
            interval: self.interval,
            regexp: self.regexp,
            cpus: self.scope.cpus,
            user_only: self.user_only,
            kernel_only: self.kernel_only,
            include_idle: self.include_idle,
            text: TextOptions {
                delimiter: self.delimited,
                annotate: self.annotate,
            },
            folded: self.folded,
            outputs: self.outputs,
            range: self.range,
            off_cpu: self.off_cpu,
            off_cpu_min_us: 0,
            preload_runtime_walks: self
                .preload_runtime_walks
                .as_deref()
                .map_or(0, RuntimeWalk::runtimes),
            annotate: self.annotate_opts,
            stacks: self.stacks,
            buffer: self.buffer,
        }
    }
}

/// The tool: the engine's sampler, and the scope its flags ask for.
pub struct Profile {
    sampler: Sampler,
    scope: Scope,
}

impl Tool for Profile {
    type Args = Args;

    const SPEC: Spec = Spec::new("profile", &[], sampling::ERRORS).expected(sampling::EXPECTED);

    super::sampling_tool!(report);

    fn new(args: Args) -> anyhow::Result<Self> {
        if args.frequency.is_some() && args.period().is_some() {
            // A usage error, as clap's own conflicts are: exit 2.
            clap::Error::raw(
                clap::error::ErrorKind::ArgumentConflict,
                "-F and -c N both set the sampling rate: give one\n",
            )
            .exit();
        }
        let scope = Scope {
            cgroup: args.cgroup(),
            cgroup_map: args.sets.cgroup_map.clone(),
            mntns_map: args.sets.mntns_map.clone(),
            // Off the CPU, rtrace's own threads would be much of what a
            // whole-system profile shows: they wait for the kernel.
            exclude_self: args.off_cpu,
            ..args.scope.scope()
        };
        Ok(Self {
            sampler: Sampler::new(args.sampling())?,
            scope,
        })
    }

    fn banner(&self) -> String {
        self.sampler.banner()
    }

    fn start(&mut self) {
        self.sampler.start();
    }

    fn tick(
        &mut self,
        ebpf: &mut aya::Ebpf,
        sink: &mut crate::output::Sink,
        last: bool,
    ) -> anyhow::Result<()> {
        self.sampler.tick(ebpf, sink, last)
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &[&str]) -> Result<Args, clap::Error> {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: Args,
        }
        let mut words = vec!["profile"];
        words.extend_from_slice(line);
        <Cli as clap::Parser>::try_parse_from(words).map(|c| c.args)
    }

    /// The engine's defaults are profile's: the tools that build a
    /// [`Sampling`] without flags (stackcount, top) sample as a bare
    /// `rtrace profile` does.
    #[test]
    fn the_engines_defaults_are_profiles() {
        let flags = parse(&[]).unwrap().sampling();
        assert_eq!(format!("{flags:?}"), format!("{:?}", Sampling::default()));
        let flags = parse(&["-c", "1000", "-e", "cs"]).unwrap().sampling();
        assert_eq!(flags.period, Some(1000));
        assert_eq!(flags.event.name(), "cs");
    }
}

//! Time off the CPU counted by stack, as offcputime, wakeuptime and
//! `profile --off-cpu` share it: the context-switch programs of
//! `rtrace_ebpf::offcpu`, their configuration from the kernel's BTF, and
//! their start and stop; [`OffCpuStacks`] joins them to the stack engine
//! for a tool that counts nothing else.

use anyhow::Context as _;
use aya::Ebpf;
use rtrace_common::offcputime::Config;

use crate::{
    engine::stacktool::{SampleStream, StackArgs, StackTool},
    kernel::{
        features::Mechanism,
        load::{Hooks, Kernel, Load, thread_entries},
        warning::Warning,
    },
    output::{
        files::{StackReports, thousands},
        stacks::firefox,
    },
    stacks::sample::Sample,
};

/// tp_btf, else the raw tracepoint: both hand over the tasks themselves.
pub const CHAIN: [Mechanism; 2] = [Mechanism::TpBtf, Mechanism::RawTracepoint];

/// The object whose programs count by `WakeKey` (the blocked thread's
/// stacks and its waker's), for a tool that has no object of its own.
pub const OBJECT: &str = "offcputime";

/// [`Filter::state`] of threads that went to sleep, whatever the sleep
/// (every task state bit up to TASK_RTLOCK_WAIT and TASK_FREEZABLE), not
/// those preempted while runnable, whom nobody wakes.
pub const ASLEEP: u32 = 0xffff;

/// bcc's bounds on the blocked time counted (`-m`, `-M`), as every
/// off-CPU tool takes them.
#[derive(Debug, Clone, clap::Args)]
pub struct BlockTimeArgs {
    /// Count only blocks of at least this many microseconds.
    #[arg(
        short = 'm',
        long = "min-block-time",
        value_name = "MIN_US",
        default_value_t = 1
    )]
    pub min_block_time: u64,
    /// Count only blocks of at most this many microseconds.
    #[arg(short = 'M', long = "max-block-time", value_name = "MAX_US")]
    pub max_block_time: Option<u64>,
}

impl BlockTimeArgs {
    /// Checks that some block could be counted.
    pub fn check(&self) -> anyhow::Result<()> {
        if let Some(max) = self.max_block_time {
            anyhow::ensure!(
                self.min_block_time <= max,
                "-m {} is above -M {max}: no block could be counted",
                self.min_block_time
            );
        }
        Ok(())
    }

    /// The bounds in nanoseconds, as [`Filter`] takes them.
    pub fn bounds_ns(&self) -> (u64, u64) {
        (
            self.min_block_time.saturating_mul(1000),
            self.max_block_time
                .map_or(u64::MAX, |m| m.saturating_mul(1000)),
        )
    }
}

/// What to count, beside the task offsets read from BTF.
#[derive(Clone, Copy, Debug)]
pub struct Filter {
    /// Shortest and longest blocked time counted, in nanoseconds.
    pub min_ns: u64,
    /// See `min_ns`.
    pub max_ns: u64,
    /// Whether user and kernel stacks are taken.
    pub user: bool,
    /// See `user`.
    pub kernel: bool,
    /// `offcputime::THREADS_*`.
    pub threads: u32,
    /// The state a thread must leave the CPU in, or `STATE_ANY`.
    pub state: u32,
    /// Whether the wakers' stacks are taken.
    pub waker: bool,
    /// Whether kernel stacks keep the scheduler's and lock primitives'
    /// frames (walked as the thread leaves the CPU).
    pub sched_frames: bool,
    /// Whether blocked time is counted by thread (a report by tid, a
    /// pprof), not only by process.
    pub per_thread: bool,
    /// Whether blocked time is counted by the heat map slot its wait
    /// ended in (`--html`, pprof).
    pub time_keys: bool,
}

/// The context-switch programs of one object.
#[derive(Default)]
pub struct OffCpu {
    /// The programs attached: sched_switch's, then sched_waking's.
    programs: Vec<String>,
    filter: Option<Filter>,
    /// Whether the programs attached read tasks by BTF type (tp_btf).
    typed: bool,
    /// Whether threads off the CPU are kept in task storage.
    in_task: bool,
}

impl OffCpu {
    /// The configuration for `filter` on this kernel, attaching with
    /// `m`; sizes the start table in `load`.
    pub fn configure(
        &mut self,
        filter: Filter,
        m: Mechanism,
        kernel: &mut Kernel,
        load: &mut Load,
    ) -> anyhow::Result<Config> {
        self.filter = Some(filter);
        // The CFI objects (5.17+, where task storage always is) keep
        // threads off the CPU in the threads themselves when the programs
        // see typed tasks; otherwise a thread is in the table from the
        // moment it leaves the CPU until it is back.
        self.in_task = m == Mechanism::TpBtf && crate::kernel::load::walks_cfi(load.variant());
        let starts = if self.in_task { 1 } else { thread_entries() };
        load.size(rtrace_common::names::STARTS, starts);
        let btf = kernel.btf()?;
        let task = |m: &[&str]| btf.member_any("task_struct", m).map(|i| i.offset);
        Ok(Config {
            min_ns: filter.min_ns,
            max_ns: filter.max_ns,
            user: u32::from(filter.user),
            kernel: u32::from(filter.kernel),
            threads: filter.threads,
            state: filter.state,
            task_pid: task(&["pid"])?,
            task_tgid: task(&["tgid"])?,
            task_state: task(&["__state", "state"])?,
            task_flags: task(&["flags"])?,
            waker: u32::from(filter.waker),
            mark_switches: 0,
            sched_frames: u32::from(filter.sched_frames),
            per_thread: u32::from(filter.per_thread),
            time_keys: u32::from(filter.time_keys),
            samples: 0,
        })
    }

    /// Sends each wait counted on its own (`--firefox`, `--samples`):
    /// sets `cfg.samples` and sizes the ring buffer of waits in `load`,
    /// for a guessed rate of context switches.
    pub fn send_each(cfg: &mut Config, load: &mut Load) {
        cfg.samples = 1;
        // A busy CPU switches some thousands of times a second; the waits
        // of a traced process are fewer, and what does not fit is counted.
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
        load.size(
            rtrace_common::offcputime::INTERVALS,
            SampleStream::interval_bytes(WAITS_PER_CPU_SECOND * cpus),
        );
    }

    /// Attaches the programs with `m`, one of [`CHAIN`].
    pub fn attach(
        &mut self,
        m: Mechanism,
        kernel: &mut Kernel,
        ebpf: &mut Ebpf,
    ) -> anyhow::Result<()> {
        let mut hooks = Hooks::new(m, kernel)?;
        self.typed = m == Mechanism::TpBtf;
        for (program, event) in self.programs_with(m) {
            hooks.attach(ebpf, &program, "sched", event)?;
            self.programs.push(program);
        }
        Ok(())
    }

    /// Its programs with mechanism `m` and the scheduler's events they
    /// attach to, also for loading beside others
    /// (`kernel::load::load_beside`).
    pub fn programs_with(&self, m: Mechanism) -> Vec<(String, &'static str)> {
        let events: &[&'static str] = if self.filter.is_some_and(|f| f.waker) {
            &["sched_switch", "sched_waking"]
        } else {
            &["sched_switch"]
        };
        let prefix = crate::kernel::load::hook_prefix(m);
        events
            .iter()
            .map(|e| (format!("{prefix}_{e}"), *e))
            .collect()
    }

    /// The first mechanism of [`CHAIN`] this kernel has, for a tool whose
    /// own chain is another's (profile's perf events).
    pub fn mechanism(kernel: &mut Kernel) -> anyhow::Result<Mechanism> {
        let mut why = Vec::new();
        for m in CHAIN {
            match kernel.check(m) {
                Ok(()) => return Ok(m),
                Err(e) => why.push(format!("{m}: {e}")),
            }
        }
        anyhow::bail!(
            "no way to trace context switches here (tried {})",
            why.join("; ")
        )
    }

    /// What is attached, and where kernel stacks are walked, for `-v`.
    pub fn describe(&self) -> String {
        let f = self.filter;
        let what = if f.is_some_and(|f| f.waker) {
            "sched_switch and sched_waking (wakers)"
        } else {
            "sched_switch"
        };
        let kernel = match f {
            Some(f) if !f.kernel => "",
            // As the eBPF side decides (`kernel_at_switch_in`).
            Some(f) if self.typed && !f.sched_frames => {
                ", kernel stacks walked from where the thread stopped (no scheduler or \
                 lock frames; --sched-frames keeps them)"
            }
            _ => ", kernel stacks walked as the thread leaves the CPU",
        };
        let kept = if self.in_task {
            "task storage"
        } else {
            "a hash by thread id"
        };
        format!("{what}{kernel}; threads off the CPU in {kept}")
    }

    /// Stops counting: the programs are unloaded, so that the report is
    /// one consistent cut.
    pub fn stop(&self, ebpf: &mut Ebpf) -> anyhow::Result<()> {
        for name in &self.programs {
            let prog = ebpf
                .program_mut(name)
                .with_context(|| format!("program {name} missing"))?;
            match prog {
                aya::programs::Program::BtfTracePoint(p) => p.unload(),
                aya::programs::Program::RawTracePoint(p) => p.unload(),
                _ => Ok(()),
            }
            .context("cannot stop tracing")?;
        }
        Ok(())
    }
}

/// The rate of waits a CPU the ring buffer of waits is sized for: four
/// seconds of them fit ([`SampleStream::interval_bytes`]).
const WAITS_PER_CPU_SECOND: u64 = 10_000;

/// Time off the CPU counted by stack and named: the context-switch
/// programs with the stack engine, as offcputime and wakeuptime run them.
/// The tool says what to count ([`Filter`]) and prints the samples.
pub struct OffCpuStacks {
    off_cpu: OffCpu,
    /// The stacks counted in the kernel, their walk and their names.
    pub stacks: StackTool,
    filter: Option<Filter>,
    time_zero: u64,
    /// Whether each wait is also sent on its own ([`OffCpuStacks::send_each`]).
    each: bool,
    /// The waits sent on their own, once attached.
    stream: Option<SampleStream>,
}

impl Default for OffCpuStacks {
    fn default() -> Self {
        Self {
            off_cpu: OffCpu::default(),
            // The kernel side counts by WakeKey, with or without wakers.
            stacks: StackTool::new(true),
            filter: None,
            time_zero: 0,
            each: false,
            stream: None,
        }
    }
}

impl OffCpuStacks {
    /// Asks the kernel for each wait counted on its own, as well as
    /// counted by stack (`--firefox`, `--samples`; see
    /// [`OffCpuStacks::timed`]). Before [`OffCpuStacks::configure`].
    pub fn send_each(&mut self) {
        self.each = true;
    }

    /// The object variants to try, best first (the CFI walk where user
    /// stacks are taken).
    pub fn variants(args: &StackArgs, user: bool) -> Vec<&'static str> {
        StackTool::variants(args.unwind, user)
    }

    /// Sets the object's configuration and the stack tables' sizes for
    /// mechanism `m` of [`CHAIN`].
    pub fn configure(
        &mut self,
        m: Option<Mechanism>,
        filter: Filter,
        args: &StackArgs,
        kernel: &mut Kernel,
        load: &mut Load,
    ) -> anyhow::Result<()> {
        let m = m.context("time off the CPU is counted through the chain's mechanisms")?;
        let mut cfg = self.off_cpu.configure(filter, m, kernel, load)?;
        if self.each {
            OffCpu::send_each(&mut cfg, load);
        }
        self.stacks.configure(args, kernel, load)?;
        load.config(&cfg);
        self.filter = Some(filter);
        Ok(())
    }

    /// Attaches the walk (its process events, for `pids` or all) and the
    /// context-switch programs, setting time zero between them.
    pub fn attach(
        &mut self,
        m: Option<Mechanism>,
        kernel: &mut Kernel,
        ebpf: &mut Ebpf,
        pids: &[u32],
    ) -> anyhow::Result<()> {
        let m = m.context("time off the CPU is counted through the chain's mechanisms")?;
        self.stacks.attach(ebpf, pids)?;
        if self.each {
            self.stream = Some(SampleStream::default().with_intervals(ebpf, false)?);
            self.stacks.keep_names();
        }
        let by_time = self.filter.is_some_and(|f| f.time_keys);
        self.time_zero = self.stacks.set_time_zero(ebpf, by_time)?;
        self.off_cpu.attach(m, kernel, ebpf)
    }

    /// What was attached, and the heat map's time zero where waits are
    /// counted by time, for `-v`.
    pub fn describe(&self) -> Vec<String> {
        let mut lines = vec![format!(
            "{}; {}; stacks named by their own 64-bit hash",
            self.off_cpu.describe(),
            self.stacks.describe()
        )];
        if self.filter.is_some_and(|f| f.time_keys) {
            lines.push(format!(
                "time zero of the page's heat map: CLOCK_MONOTONIC {} ns",
                self.time_zero
            ));
        }
        lines
    }

    /// Time zero of the waits counted by time, on `CLOCK_MONOTONIC`.
    pub fn time_zero(&self) -> u64 {
        self.time_zero
    }

    /// Runs as tracing starts.
    pub fn start(&mut self) {
        self.stacks.start(self.filter.is_none_or(|f| f.kernel));
    }

    /// Reads the waits sent on their own, then moves the kernel's tables
    /// out (the tools' one-second tick).
    pub fn tick(&mut self, ebpf: &mut Ebpf, last: bool) -> anyhow::Result<()> {
        if let Some(stream) = &mut self.stream {
            stream.read();
        }
        self.stacks.tick(ebpf, last)
    }

    /// Stops counting, so that what is read is one consistent cut, and
    /// returns the blocked time by stack, in nanoseconds, named.
    pub fn finish(&mut self, ebpf: &mut Ebpf) -> anyhow::Result<Vec<Sample>> {
        self.off_cpu.stop(ebpf)?;
        // The last waits sent, now that no more come.
        if let Some(stream) = &mut self.stream {
            stream.read();
        }
        self.stacks.finish(ebpf)
    }

    /// Writes `--firefox` and `--samples` of `reports` (after
    /// [`OffCpuStacks::finish`]): each wait sent on its own, its end's
    /// time since the Unix epoch, CPU, thread, stacks seen through `view`
    /// (see [`StackTool::timed`])
    /// and nanoseconds as its weight. Only the waits counted are sent, so
    /// that by stack they add up to the counts; those the count table
    /// had no room for are left out, with a warning.
    pub fn write_each(
        &self,
        reports: &mut StackReports,
        product: &str,
        view: &mut dyn FnMut(Sample) -> Option<Sample>,
    ) -> anyhow::Result<()> {
        let Some(stream) = &self.stream else {
            return Ok(());
        };
        let (timed, unnamed) = self.stacks.timed(stream.records(), view);
        if unnamed > 0 {
            Warning::unsupported(format!(
                "{unnamed} waits sent on their own were not counted (the count table was full; \
                 raise --hash-storage-size): --firefox and --samples leave them out"
            ))
            .print();
        }
        let ns: u64 = timed.iter().map(|t| t.sample.count).sum();
        let what = format!(
            "{} waits, {} us",
            thousands(timed.len() as u64),
            thousands(ns.saturating_add(500) / 1000)
        );
        let meta = firefox::Meta {
            product: product.to_owned(),
            unit: firefox::Unit::OffCpuNanoseconds,
            // No sampling: the profiler's unit of time per sample.
            interval_ns: 1_000_000,
            start_ns: self.stacks.started_nanos(),
        };
        reports.write_each(&timed, &meta, &what)
    }
}

/// bcc's start-up line of an off-CPU tool: "Tracing `what` of `whom`
/// by `whose`user + kernel stack for 5 secs." (`whose`: "" or "waker ").
pub fn banner(
    what: &str,
    whom: &str,
    whose: &str,
    filter: &Filter,
    duration: Option<u64>,
) -> String {
    let which = match (filter.user, filter.kernel) {
        (true, false) => "user",
        (false, true) => "kernel",
        _ => "user + kernel",
    };
    let until = match duration {
        Some(s) => format!(" for {s} secs."),
        None => "... Hit Ctrl-C to end.".to_owned(),
    };
    format!("Tracing {what} of {whom} by {whose}{which} stack{until}")
}

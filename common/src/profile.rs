//! Types of `rtrace profile`.

/// The stack tables' types, shared with offcputime, under the paths they
/// had when they were defined here.
pub use crate::stacks::{
    CUT_USER, ERR_COUNTS_FULL, ERR_CUT_SHORT, ERR_FP_FRAMES, ERR_KERNEL_STACK, ERR_NO_TABLES,
    ERR_STACKS_FULL, ERR_USER_STACK, Key, MAX_DEPTH, MISSED_KERNEL, MISSED_USER, NEW_COUNTS,
    NEW_STACKS, OFF_CPU, SEEN_EXEC, SEEN_EXIT, SEEN_FORK, SEEN_NEW_CODE, Seen, Stack, WakeKey,
};

/// Most periods one timed sample stands for: more means the timer was
/// stopped (sampling throttled or disabled), not late.
pub const MAX_PERIODS: u64 = 64;

/// The heat map's time slot (`--heatmap`): FlameScope's 20 ms, fifty to a
/// second.
pub const HEAT_SLOT_NS: u64 = 20_000_000;

/// Load-time configuration, passed as the global `CONFIG`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Config {
    /// Whether samples of the idle tasks (pid 0) count (`-I`).
    pub include_idle: u32,
    /// Whether user stacks are collected (not `-K`).
    pub user: u32,
    /// Whether kernel stacks are collected (not `-U`).
    pub kernel: u32,
    /// Whether a sample counts nanoseconds (`--off-cpu`) rather than 1:
    /// the time its CPU was busy since its last sample, which is the
    /// period while the timer keeps time. A timer that fires late skips
    /// periods, which a count of samples would lose.
    pub timed: u32,
    /// Slots of `HEAT` (`--heatmap`), each `HEAT_SLOT_NS` long from the
    /// start in `WINDOW`; 0 without a heat map.
    pub heat_slots: u32,
    /// Whether samples are counted by thread, not only by process
    /// ([`crate::stacks::Key::tid`]).
    pub per_thread: u32,
    /// With tracepoints and probes: a count every this many of the
    /// scope's events on a CPU (`-c N`, as perf's period); 0 or 1 for
    /// every event.
    pub every: u32,
    /// Whether each count's key carries its heat map slot
    /// ([`crate::stacks::Key::slot`], 1-based from the start in `WINDOW`),
    /// so that a range of time has its own stacks (`--html`, pprof).
    pub time_keys: u32,
    /// The sampling period in nanoseconds: what a timed sample counts
    /// when there is nothing to measure from, and `MAX_PERIODS` of them
    /// the most.
    pub period_ns: u64,
    /// `--range`: samples count only from this many nanoseconds after the
    /// start in `WINDOW`...
    pub range_start_ns: u64,
    /// ...until this many; 0 for no range.
    pub range_end_ns: u64,
    /// `--off-cpu`: how time off the CPU is counted beside the samples
    /// (with the context-switch programs attached).
    pub off_cpu: crate::offcputime::Config,
    /// Whether each sample is also sent on its own to [`SAMPLES`]
    /// (`--firefox`, `--samples`): a constant the verifier sees, so that
    /// the branch is dropped from the program when it is 0.
    pub samples: u32,
    /// Keeps the struct free of padding.
    pub _pad: u32,
}

crate::pod!(Config, TimedSample);

/// `ERRORS` slot: samples counted whose own record ([`TimedSample`]) did
/// not fit in [`SAMPLES`], which user space reads every second.
pub const ERR_SAMPLES_LOST: u32 = crate::stacks::ERR_NAMES.len() as u32;

/// `ERRORS` slot: with `--off-cpu`, waits counted whose own record
/// ([`crate::offcputime::Interval`]) did not fit in
/// [`crate::offcputime::INTERVALS`].
pub const ERR_INTERVALS_LOST: u32 = ERR_SAMPLES_LOST + 1;

/// What each `ERRORS` slot of profile's object counts: the stack tables'
/// and the per-sample streams'.
pub const ERR_NAMES: [&str; crate::stacks::ERR_NAMES.len() + 2] = crate::stacks::names_with_walk(
    [crate::stacks::ERR_NAMES[0], crate::stacks::ERR_NAMES[1]],
    &[
        "per-sample records lost (--firefox, --samples: their buffer was full)",
        crate::offcputime::INTERVALS_LOST_NAME,
    ],
);

/// One sample on its own, sent to [`SAMPLES`] with `Config::samples`:
/// when and where it was taken, and the key it was counted under, by
/// which user space finds its stacks among those it moved out.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct TimedSample {
    /// When it was taken: CLOCK_MONOTONIC nanoseconds.
    pub time: u64,
    /// What it added to its key's count: 1, or nanoseconds when timed.
    pub value: u64,
    /// The CPU it was taken on.
    pub cpu: u32,
    /// The sampled thread's id.
    pub tid: u32,
    /// The key it was counted under, its generation as counted.
    pub key: Key,
}

/// The ring buffer of [`TimedSample`]s; user space sizes it.
pub const SAMPLES: &str = "SAMPLES";

/// Samples per [`HEAT_SLOT_NS`] slot since the start, per CPU
/// (`--heatmap`); user space sizes it.
pub const HEAT: &str = "HEAT";

/// The program perf events (timers and counters) run. In the objects
/// that walk by CFI it only tail-calls the walk variant in
/// [`WALKERS`]: the one for the runtimes in scope
/// ([`PROG_PROFILE_NATIVE`], [`PROG_PROFILE_RUNTIMES`] or one runtime's).
pub const PROG_PROFILE: &str = "profile";
/// The programs [`PROG_PROFILE`] tail-calls in the objects that walk by
/// CFI: the same sampling with a walk through native frames only, with
/// one through a single runtime's frames too ([`PROG_PROFILE_PYTHON`],
/// [`PROG_PROFILE_JAVA`], [`PROG_PROFILE_V8`]), and with one through
/// every runtime's ([`PROG_PROFILE_RUNTIMES`]). A runtime's walk is
/// loaded, and verified, only once a process of that runtime is in
/// scope, and every runtime's once two are: each runtime's step is most
/// of what the verifier goes through (see `cfi::STEPS_APART` on the
/// kernel side).
pub const PROG_PROFILE_NATIVE: &str = "profile_native";
/// See [`PROG_PROFILE_NATIVE`].
pub const PROG_PROFILE_RUNTIMES: &str = "profile_runtimes";
/// See [`PROG_PROFILE_NATIVE`].
pub const PROG_PROFILE_PYTHON: &str = "profile_python";
/// See [`PROG_PROFILE_NATIVE`].
pub const PROG_PROFILE_JAVA: &str = "profile_java";
/// See [`PROG_PROFILE_NATIVE`].
pub const PROG_PROFILE_V8: &str = "profile_v8";
/// The program array of one slot that [`PROG_PROFILE`] tail-calls: the
/// loaded variant ([`PROG_PROFILE_NATIVE`], a runtime's, or
/// [`PROG_PROFILE_RUNTIMES`]), replaced as runtimes come into scope.
pub const WALKERS: &str = "WALKERS";
/// The program of a tracepoint event (`-e t:...`).
pub const PROG_TRACEPOINT: &str = "profile_tracepoint";
/// The program of a kprobe event.
pub const PROG_KPROBE: &str = "profile_kprobe";
/// The program of a kretprobe event.
pub const PROG_KRETPROBE: &str = "profile_kretprobe";
/// The program of a uprobe event.
pub const PROG_UPROBE: &str = "profile_uprobe";
/// The program of a uretprobe event.
pub const PROG_URETPROBE: &str = "profile_uretprobe";

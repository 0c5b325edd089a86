//! Types of `rtrace offcputime`. Blocked time is counted in the shared
//! stack tables ([`crate::stacks`], `Key` by nanoseconds), so the store,
//! the CFI walk and the symbolizer serve it as they serve profile.

use crate::stacks::WakeKey;

/// `ERRORS` slot: blocked threads not timed, as the table of threads off
/// the CPU was full (`profile --off-cpu` too). Slots 0 to 7 are the
/// stack tables' samples and stacks (`stacks::ERR_*`).
pub use crate::stacks::ERR_STARTS_FULL;

/// `Config::threads`: every thread.
pub const THREADS_ALL: u32 = 0;
/// `Config::threads`: user threads only (`-u`).
pub const THREADS_USER: u32 = 1;
/// `Config::threads`: kernel threads only (`-k`).
pub const THREADS_KERNEL: u32 = 2;

/// `Config::state`: no state filter.
pub const STATE_ANY: u32 = u32::MAX;

/// `task_struct.flags` bit of kernel threads.
pub const PF_KTHREAD: u32 = 0x0020_0000;

/// Load-time configuration, passed as the global `CONFIG`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Config {
    /// Shortest blocked time counted, in nanoseconds (`-m`).
    pub min_ns: u64,
    /// Longest blocked time counted, in nanoseconds (`-M`).
    pub max_ns: u64,
    /// Whether user stacks are taken (not `-K`).
    pub user: u32,
    /// Whether kernel stacks are taken (not `-U`).
    pub kernel: u32,
    /// `THREADS_*`.
    pub threads: u32,
    /// The state the thread must leave the CPU in (`--state`): 0 for
    /// runnable (preempted), else a mask of which one bit must be set;
    /// [`STATE_ANY`] for all.
    pub state: u32,
    /// `task_struct.pid`, from BTF.
    pub task_pid: u32,
    /// `task_struct.tgid`.
    pub task_tgid: u32,
    /// `task_struct.__state` (`state` before 5.14).
    pub task_state: u32,
    /// `task_struct.flags`.
    pub task_flags: u32,
    /// Whether the waker's stacks are taken (`--waker`).
    pub waker: u32,
    /// Whether each CPU's idle time is kept (`IDLE`), for `profile
    /// --off-cpu` to weigh its samples by.
    pub mark_switches: u32,
    /// Whether a thread's kernel stack is walked as it leaves the CPU,
    /// with the scheduler's and the lock primitives' frames
    /// (`--sched-frames`, and always on the raw tracepoint), rather than
    /// from where it stopped when it runs again, which skips them and
    /// costs less.
    pub sched_frames: u32,
    /// Whether blocked time is counted by thread, not only by process
    /// ([`crate::stacks::Key::tid`]).
    pub per_thread: u32,
    /// Whether each count's key carries the heat map slot its wait ended
    /// in ([`crate::stacks::Key::slot`], as profile's `time_keys`).
    pub time_keys: u32,
    /// Whether each wait counted is also sent on its own to the
    /// [`INTERVALS`] ring buffer (`--firefox`, `--samples`): a constant
    /// the verifier sees, so that the branch is dropped when it is 0.
    pub samples: u32,
}

/// One wait on its own, sent to [`INTERVALS`] with `Config::samples` as
/// it is counted: when the thread left the CPU, for how long, the CPU it
/// ran again on, and the key its time was added to, by which user space
/// finds its stacks among those it moved out.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Interval {
    /// When the thread left the CPU: CLOCK_MONOTONIC nanoseconds.
    pub start: u64,
    /// Nanoseconds it was off the CPU: what it added to its key's count.
    pub ns: u64,
    /// The CPU it ran again on, where the wait ended.
    pub cpu: u32,
    /// The thread's id.
    pub tid: u32,
    /// The key it was counted under, as the object's programs hold it
    /// (`profile --off-cpu` adds [`crate::stacks::OFF_CPU`] to it when
    /// counting), its generation as counted.
    pub key: WakeKey,
}

/// The ring buffer of [`Interval`]s, in the objects of the context-switch
/// programs but their `perf` variants (no ring buffer before 5.8); user
/// space sizes it.
pub const INTERVALS: &str = "INTERVALS";

/// `ERRORS` slot of offcputime's object: waits counted whose own record
/// ([`Interval`]) did not fit in [`INTERVALS`].
pub const ERR_INTERVALS_LOST: u32 = crate::stacks::ERR_NAMES.len() as u32;

/// What a lost [`Interval`] is called in the report at exit.
pub const INTERVALS_LOST_NAME: &str =
    "off-CPU intervals lost (--firefox, --samples: their buffer was full)";

/// What a thread left the CPU with: when, and the key its blocked time
/// is counted under when it runs again, its waker filled in when woken.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Start {
    /// `bpf_ktime_get_ns` at the switch.
    pub ns: u64,
    /// Process, command and stacks, and the waker's (the generation is
    /// set when counted).
    pub key: WakeKey,
}

/// What each `ERRORS` slot counts, for the report at exit: the stack
/// tables' (profile's), its first count in blocked periods.
pub const ERR_NAMES: [&str; crate::stacks::ERR_NAMES.len() + 1] = crate::stacks::names_with_walk(
    [
        crate::stacks::ERR_NAMES[0],
        "blocked periods lost (count table full; raise --hash-storage-size)",
    ],
    &[INTERVALS_LOST_NAME],
);

crate::pod!(Config, Start, Interval);

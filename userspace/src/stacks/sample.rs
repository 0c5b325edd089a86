//! Counted stacks of named frames: what the stack store hands the
//! outputs.

use std::sync::Arc;

use crate::stacks::symbolize::Frame;

/// One distinct stack with its sample count.
#[derive(Clone, Debug)]
pub struct Sample {
    /// Command of the sampled thread.
    pub comm: String,
    /// Process id.
    pub pid: u32,
    /// When the process started, in nanoseconds since the epoch (0:
    /// unknown): with the pid, which process it was, as a pid is reused.
    pub started: u64,
    /// Thread id, where samples were counted by thread (a report by
    /// thread, a pprof); else 0.
    pub tid: u32,
    /// User frames, leaf first; shared by the samples of every process
    /// with the same stack.
    pub user: Arc<[Frame]>,
    /// Kernel frames, leaf first.
    pub kernel: Arc<[Frame]>,
    /// Samples counted.
    pub count: u64,
    /// The thread that woke this one (offcputime `--waker`).
    pub waker: Option<Arc<Thread>>,
    /// Time off the CPU among on-CPU samples (`profile --off-cpu`).
    pub off_cpu: bool,
    /// The heat map slot the samples were counted in, 1-based from the
    /// start of the run (`HEAT_SLOT_NS` long), where stacks are counted
    /// by time (`--html`, pprof); 0 where they are not.
    pub slot: u32,
    /// The user stack was cut short by a stack word the walk could not
    /// read: its frames are those walked before it.
    pub cut_short: bool,
}

/// A thread named in a sample besides the sampled one: the waker.
#[derive(Clone, Debug)]
pub struct Thread {
    /// Its command.
    pub comm: String,
    /// Its process id.
    pub pid: u32,
    /// User frames, leaf first.
    pub user: Arc<[Frame]>,
    /// Kernel frames, leaf first.
    pub kernel: Arc<[Frame]>,
}

/// Placeholder frames for stacks that could not be walked or stored, as
/// bcc names them.
pub const MISSED_USER: &str = "[Missed User Stack]";
/// See [`MISSED_USER`].
pub const MISSED_KERNEL: &str = "[Missed Kernel Stack]";

/// One sample with its own time and CPU, as the per-sample stream
/// (`--firefox`, `--samples`) and perf's recordings give them.
#[derive(Clone, Debug)]
pub struct Timed {
    /// When it was taken, in nanoseconds since the Unix epoch.
    pub time: u64,
    /// The CPU it was taken on.
    pub cpu: u32,
    /// Its thread and stack; `count` is its weight: 1 for a sample,
    /// nanoseconds for time off the CPU.
    pub sample: Sample,
}

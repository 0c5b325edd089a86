//! Types of `rtrace runqlat`.

use crate::{TASK_COMM_LEN, hist::Hist, offsets::TaskOffsets};

/// How samples are grouped into histograms.
pub mod group {
    /// One histogram for everything.
    pub const NONE: u32 = 0;
    /// One per process (`-P`).
    pub const PROCESS: u32 = 1;
    /// One per thread (`-L`).
    pub const THREAD: u32 = 2;
    /// One per pid namespace (`--pidnss`).
    pub const PIDNS: u32 = 3;
}

/// Load-time configuration, passed as the global `CONFIG`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Config {
    /// One of [`group`]'s values.
    pub group: u32,
    /// Keeps the struct free of padding.
    pub _pad: u32,
    /// Nanoseconds per displayed unit (1000 for usecs, 1000000 for msecs).
    pub unit_ns: u64,
    /// Offsets for reading task structs on the BTF and raw tracepoint paths.
    pub task: TaskOffsets,
    /// Byte offsets into the classic tracepoint records (tracefs `format`).
    pub tp: TracepointOffsets,
}

/// Field offsets in the sched tracepoints' records, read from tracefs.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TracepointOffsets {
    /// `sched_wakeup.pid` (also used for `sched_wakeup_new`).
    pub wakeup_pid: u32,
    /// `sched_switch.prev_pid`.
    pub prev_pid: u32,
    /// `sched_switch.prev_state`.
    pub prev_state: u32,
    /// `sched_switch.next_pid`.
    pub next_pid: u32,
    /// `sched_switch.next_comm`.
    pub next_comm: u32,
    /// Keeps the struct free of trailing padding.
    pub _pad: u32,
}

/// A latency histogram in the configured unit, with the command of the task
/// that created it (grouped modes only).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Entry {
    /// The latencies.
    pub hist: Hist,
    /// `comm` of the first task counted.
    pub comm: [u8; TASK_COMM_LEN],
}

/// Index into the `ERRORS` per-CPU array: enqueue timestamps that could not be stored.
pub const ERR_START_UPDATE: u32 = 0;
/// Index into `ERRORS`: histogram entries that could not be created.
pub const ERR_HIST_UPDATE: u32 = 1;
/// Index into `ERRORS`: kernel memory reads that failed.
pub const ERR_READ: u32 = 2;
/// What each `ERRORS` slot counts, for the report at exit.
pub const ERR_NAMES: [&str; 3] = [
    "enqueue timestamps not stored (map full)",
    "histogram entries not created (map full)",
    "kernel memory reads failed",
];

crate::pod!(Config, TracepointOffsets, Entry);

/// The hash of enqueue times by thread id, where task storage does not
/// hold them; user space sizes it (1 where it does).
pub const START: &str = "START";
/// The histograms ([`Entry`]) by group key, for `-P`, `-L` and
/// `--pidnss`; user space sizes it (1 when nothing is grouped).
pub const HISTS: &str = "HISTS";
/// The single histogram when nothing is grouped: a per-CPU [`Entry`].
pub const TOTAL: &str = "TOTAL";
/// The hash of thread id to process id that the classic tracepoint path
/// learns at switch-out; user space sizes it (1 where it is not needed).
pub const TGIDS: &str = "TGIDS";

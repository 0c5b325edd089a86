//! Types of `rtrace stat`: what its programs count tracepoints and probes
//! into.

/// Slots of `SYSCALLS` for one direction: syscall numbers below this are
/// counted (x86-64 has under 500).
pub const MAX_SYSCALLS: u32 = 1024;

/// Probe specs (`p:`, `r:`, `u:`) one run counts, each by its own
/// programs.
pub const MAX_PROBES: u32 = 8;

/// How [`TaskKey::slot`] says what was counted: a tracepoint's id, a
/// `SYSCALLS` slot, or a probe spec's slot, each with its kind above
/// these bits.
pub const SLOT_KIND_SHIFT: u32 = 24;
/// [`TaskKey::slot`]'s kind: a tracepoint id.
pub const KIND_TRACEPOINT: u32 = 0;
/// [`TaskKey::slot`]'s kind: a `SYSCALLS` slot.
pub const KIND_SYSCALL: u32 = 1;
/// [`TaskKey::slot`]'s kind: a probe slot.
pub const KIND_PROBE: u32 = 2;

/// `BY_TASK`'s values: counts by thread, or by process.
pub const BY_THREAD: u32 = 1;
pub const BY_PROCESS: u32 = 2;

/// A count by task (`--per-thread`, `--per-process`): the thread or
/// process, and what was counted.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TaskKey {
    /// The thread id, or the process id.
    pub id: u32,
    /// The kind (above [`SLOT_KIND_SHIFT`]) and its slot.
    pub slot: u32,
}

/// What `TASK_COUNTS` holds for a [`TaskKey`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TaskCount {
    /// The events.
    pub count: u64,
    /// The task's name when it was first counted (a thread's own, a
    /// process's leader's name is not at hand in the kernel).
    pub comm: [u8; 16],
}

crate::pod!(TaskKey, TaskCount);

/// Entries of `TASK_COUNTS`: tasks times events.
pub const MAX_TASK_COUNTS: u32 = 65536;

/// `ERRORS` slot: a syscall whose number is not below [`MAX_SYSCALLS`].
pub const ERR_SYSCALL_NR: u32 = 0;
/// `ERRORS` slot: a tracepoint whose id is beyond `TRACEPOINTS`.
pub const ERR_TRACEPOINT_ID: u32 = 1;
/// `ERRORS` slot: a count by task that found `TASK_COUNTS` full.
pub const ERR_TASKS_FULL: u32 = 2;

/// What each `ERRORS` slot counts, for the report at exit.
pub const ERR_NAMES: [&str; 3] = [
    "syscalls not counted (a number beyond the table)",
    "tracepoint events not counted (an id beyond the table)",
    "events not counted by task (the table of tasks was full)",
];

/// The global that says where counts go: 0 for the per-CPU arrays,
/// [`BY_THREAD`] or [`BY_PROCESS`] for [`TASK_COUNTS`] by that id.
pub const BY_TASK: &str = "BY_TASK";
/// Counts ([`TaskCount`]) by task and event ([`TaskKey`]), with
/// [`BY_TASK`].
pub const TASK_COUNTS: &str = "TASK_COUNTS";
/// Counts by probe slot, per CPU.
pub const PROBES: &str = "PROBES";
/// Counts by tracepoint id, per CPU; user space sizes it past the largest
/// id.
pub const TRACEPOINTS: &str = "TRACEPOINTS";
/// Counts by syscall number, per CPU: entries, then exits from
/// [`MAX_SYSCALLS`].
pub const SYSCALLS: &str = "SYSCALLS";

/// The program on the raw tracepoint `sys_enter`.
pub const PROG_SYS_ENTER: &str = "stat_sys_enter";
/// The program on the raw tracepoint `sys_exit`.
pub const PROG_SYS_EXIT: &str = "stat_sys_exit";
/// The one program of every tracepoint counted, which counts by its
/// link's cookie.
pub const PROG_TRACEPOINT: &str = "stat_tracepoint";
/// Probe slot `N`'s kprobe is the program `stat_kprobe_N`, for slots
/// below [`MAX_PROBES`].
pub const KPROBE_PROGRAMS: &str = "stat_kprobe";
/// Probe slot `N`'s kretprobe: `stat_kretprobe_N`.
pub const KRETPROBE_PROGRAMS: &str = "stat_kretprobe";
/// Probe slot `N`'s uprobe: `stat_uprobe_N`.
pub const UPROBE_PROGRAMS: &str = "stat_uprobe";
/// Probe slot `N`'s uretprobe: `stat_uretprobe_N`.
pub const URETPROBE_PROGRAMS: &str = "stat_uretprobe";

//! Types of `rtrace strace`: what its programs keep of each syscall in
//! flight, send at its exit, and count for the summary.

/// Arguments a syscall has at most.
pub const MAX_ARGS: usize = 6;
/// Bytes of one captured argument (a string, a buffer, a struct) at most:
/// a whole path (strace never cuts one), or a buffer as `-s` cuts it.
pub const BLOB: usize = 4096;
/// The largest `-s`: bytes of a data buffer or a string that is no path
/// shown at most.
pub const MAX_STRING_LIMIT: usize = 512;
/// Arguments captured a syscall at most.
pub const BLOBS: usize = 2;
/// Syscall numbers below this are traced (x86-64 has under 500).
pub const MAX_SYSCALLS: u32 = 512;

/// [`Event::kind`]: a syscall, at its exit.
pub const KIND_SYSCALL: u32 = 0;
/// [`Event::kind`]: an exec's arguments, at its entry (the exit finds the
/// old program's memory gone).
pub const KIND_EXEC: u32 = 1;
/// [`Event::kind`]: a signal delivered (`args[0]` the signal, `[1]` its
/// code, `[2]` and `[3]` the sender's pid and uid, and for `SIGCHLD`
/// `[4]` the child's status and `[5]` its user and system times in clock
/// ticks, the user time in the low 32 bits).
pub const KIND_SIGNAL: u32 = 2;
/// [`Event::kind`]: a thread exited (`args[0]` its exit code as wait
/// gives it, `[1]` whether it was the last of its process).
pub const KIND_EXIT: u32 = 3;
/// [`Event::kind`]: a process forked (`args[0]` the child's process
/// id), sent with `-y` at the fork, before the child runs: the child's
/// descriptors are its parent's as they were then.
pub const KIND_FORK: u32 = 4;

/// [`Event::flags`]: the syscall's entry was not seen (it began before
/// tracing did), so its arguments are unknown.
pub const FLAG_NO_ENTRY: u32 = 1;
/// [`Event::flags`]: each captured argument starts at its slot times
/// [`BLOB`] (an exec's), not after the one before.
pub const FLAG_FIXED_SLOTS: u32 = 2;
/// [`Event::flags`]: the thread exited inside the syscall (`exit`,
/// `exit_group`), which so never returned.
pub const FLAG_NO_RETURN: u32 = 4;
/// [`Event::flags`]: an exec's record from `sched_process_exec`: the exec
/// succeeded (sent whether or not execs are shown).
pub const FLAG_EXEC_DONE: u32 = 8;

/// How one argument is captured ([`Capture::how`]).
pub const CAPTURE_NONE: u8 = 0;
/// A NUL-terminated string.
pub const CAPTURE_STR: u8 = 1;
/// Bytes whose count is another argument (`write`'s buffer).
pub const CAPTURE_LEN_ARG: u8 = 2;
/// Bytes whose count is the return value (`read`'s buffer).
pub const CAPTURE_LEN_RET: u8 = 3;
/// A fixed number of bytes ([`Capture::size`]), such as a struct.
pub const CAPTURE_FIXED: u8 = 4;
/// An argv-style array of strings: its first strings, NUL-separated.
pub const CAPTURE_ARGV: u8 = 5;
/// `getdents64`'s buffer: its count of entries (a `u32`), walked in the
/// kernel, whatever its size.
pub const CAPTURE_DIRENTS: u8 = 6;

/// Syscall number of `rt_sigreturn` on x86-64: its entry keeps, as its
/// first argument, where the signal frame's saved mask is (the stack
/// pointer plus [`SIGRETURN_MASK_OFFSET`]), for strace's `{mask=[...]}`.
pub const NR_RT_SIGRETURN: u64 = 15;
/// `ucontext.uc_sigmask`'s offset from the stack pointer at
/// `rt_sigreturn` (the frame's return address is popped): `uc_flags`,
/// `uc_link`, `uc_stack` and `uc_mcontext` before it.
pub const SIGRETURN_MASK_OFFSET: u64 = 8 + 8 + 24 + 256;

/// How to capture one argument of a syscall.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Capture {
    /// `CAPTURE_*`.
    pub how: u8,
    /// The argument (0-5) holding the pointer.
    pub arg: u8,
    /// With [`CAPTURE_LEN_ARG`]: the argument holding the count.
    pub len_arg: u8,
    /// 1 if read only when the call did not fail (an output).
    pub on_success: u8,
    /// With [`CAPTURE_FIXED`]: the bytes. With [`CAPTURE_STR`],
    /// [`CAPTURE_LEN_ARG`] and [`CAPTURE_LEN_RET`]: the bytes read at
    /// most, whatever `-s` says (a path, an array); 0 for `-s`'s.
    pub size: u32,
    /// With [`CAPTURE_LEN_ARG`] and [`CAPTURE_LEN_RET`]: the bytes of one
    /// element the count counts (`poll`'s 8); 0 for 1.
    pub scale: u32,
}

/// What is done for one syscall number (`SYSCALLS`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Syscall {
    /// 1 if its lines are shown (`-e trace=`); the summary counts every
    /// syscall of the scope regardless.
    pub shown: u32,
    /// 1 if its arguments are captured and sent at its entry
    /// ([`KIND_EXEC`]), not its exit.
    pub at_entry: u32,
    /// What to capture.
    pub captures: [Capture; BLOBS],
}

/// A syscall in flight, by thread (`INFLIGHT`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Inflight {
    pub nr: u64,
    pub args: [u64; MAX_ARGS],
    pub enter_ns: u64,
}

/// Load-time configuration, the global `CONFIG`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Config {
    /// 1: lines are sent (not `-c`).
    pub lines: u32,
    /// 1: the summary is counted (`-c`, `-C`).
    pub summary: u32,
    /// Bytes captured of each argument (`-s`, at most [`BLOB`]).
    pub string_limit: u32,
    /// 1: only failed calls are sent (`-Z`).
    pub failed_only: u32,
    /// Only calls that took at least this long are sent (`--duration`).
    pub min_ns: u64,
    /// `task_struct.exit_code`'s offset, from the kernel's BTF.
    pub exit_code: u32,
    /// `task_struct.signal`'s offset, and `signal_struct.live`'s: the
    /// threads of a process still running.
    pub signal: u32,
    pub live: u32,
    /// `task_struct.mm`, `mm_struct.arg_start` and `arg_end`, and
    /// `linux_binprm.filename`: an exec's argv as the new program has it,
    /// and its file.
    pub mm: u32,
    pub arg_start: u32,
    pub arg_end: u32,
    pub bprm_filename: u32,
    /// 1: the summary is counted by process too (`--summary-by-process`),
    /// in `SUMMARY_BY_PID`.
    pub by_process: u32,
    /// 1: processes forked by traced ones are traced too (`-f` with `-p`).
    pub follow: u32,
    /// `task_struct.tgid`'s offset, for the child a fork makes.
    pub tgid: u32,
    /// 1: each shown call's user stack is walked at its entry (`-k`).
    pub stacks: u32,
    /// 1: forks are sent ([`KIND_FORK`], for `-y`).
    pub forks: u32,
}

/// A syscall's figures for the summary (`SUMMARY`, per CPU).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Totals {
    pub calls: u64,
    pub errors: u64,
    pub ns: u64,
}

/// A process and a syscall, for the summary by process.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PidNr {
    pub pid: u32,
    pub nr: u32,
}

/// A process's figures for one syscall, and the process's name.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ProcTotals {
    pub totals: Totals,
    /// The name of the thread that made its first call.
    pub comm: [u8; 16],
}

/// Processes times syscalls the summary by process holds at most.
pub const MAX_PID_NRS: u32 = 65536;

/// `ERRORS` slot: a call the summary by process could not count (its
/// table full).
pub const ERR_BY_PID_FULL: u32 = ERR_SYSCALL_NR + 1;

/// What is sent: a syscall at its exit, an exec's arguments, a signal or
/// an exit. The captured bytes follow the header, [`Event::lens`] of
/// each, one after the other.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Event {
    pub kind: u32,
    pub flags: u32,
    pub pid: u32,
    pub tid: u32,
    pub nr: u64,
    pub enter_ns: u64,
    pub exit_ns: u64,
    pub args: [u64; MAX_ARGS],
    pub ret: i64,
    /// With `-k`: the user stack at the call's entry, by its hash in the
    /// shared stack table (`STACKS`); 0 for none.
    pub stack: u64,
    /// Bytes captured of each [`Syscall::captures`] argument.
    pub lens: [u32; BLOBS],
    pub comm: [u8; 16],
    /// The captured bytes; one more [`BLOB`] than is ever sent, where a
    /// read the verifier cannot bound more tightly may reach.
    pub data: [u8; BLOB * (BLOBS + 1)],
}

/// Bytes of [`Event`] before its captured bytes.
pub const HEADER_SIZE: usize = core::mem::offset_of!(Event, data);

crate::pod!(
    Capture, Syscall, Config, Totals, Inflight, PidNr, ProcTotals
);

/// `ERRORS` slots after the two every event tool has: a syscall whose
/// number is beyond the table.
pub const ERR_SYSCALL_NR: u32 = crate::stacks::ERR_NAMES.len() as u32;

/// What each `ERRORS` slot counts.
/// The slots from 2 to `ERR_SYSCALL_NR` are the shared stack walk's (`-k`,
/// `crate::stacks::ERR_NAMES`), which the walk counts into.
pub const ERR_NAMES: [&str; crate::stacks::ERR_NAMES.len() + 2] = crate::stacks::names_with_walk(
    [crate::events::LOST_NAMES[0], crate::events::LOST_NAMES[1]],
    &[
        "syscalls not traced (a number beyond the table)",
        "calls not in the summary by process (its table was full)",
    ],
);

/// What to do for each syscall number ([`Syscall`]); user space fills it.
pub const SYSCALLS: &str = "SYSCALLS";
/// The summary: each syscall's calls, errors and time ([`Totals`]), per
/// CPU by syscall number.
pub const SUMMARY: &str = "SUMMARY";
/// The summary by process ([`ProcTotals`] by [`PidNr`],
/// `--summary-by-process`).
pub const SUMMARY_BY_PID: &str = "SUMMARY_BY_PID";

/// The program on the raw tracepoint `sys_enter`.
pub const PROG_SYS_ENTER: &str = "strace_sys_enter";
/// The program on the raw tracepoint `sys_exit`.
pub const PROG_SYS_EXIT: &str = "strace_sys_exit";
/// The program on `sys_enter` that takes the user stack of a call
/// (`-k`).
pub const PROG_STACK: &str = "strace_stack";
/// The program on `sched_process_fork`.
pub const PROG_FORK: &str = "strace_fork";
/// The program on `sched_process_exec`.
pub const PROG_EXEC: &str = "strace_exec";
/// The program on `signal_deliver`.
pub const PROG_SIGNAL: &str = "strace_signal";
/// The program on `sched_process_exit`.
pub const PROG_EXIT: &str = "strace_exit";

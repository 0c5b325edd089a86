//! Types of `rtrace execsnoop`.

use crate::TASK_COMM_LEN;

/// Bytes kept of each argument, its NUL included.
pub const ARG_SIZE: usize = 128;
/// Most arguments `--max-args` may ask for.
pub const MAX_ARGS: u32 = 60;
/// Room for `MAX_ARGS` arguments.
pub const ARGS_SIZE: usize = ARG_SIZE * MAX_ARGS as usize;

/// `Event::flags`: more arguments than `--max-args`, or one longer than
/// `ARG_SIZE`, were cut.
pub const FLAG_TRUNCATED: u32 = 1;
/// `Event::flags`: the call was execveat(2).
pub const FLAG_EXECVEAT: u32 = 2;
/// `Event::flags`: `args` hold the file the kernel ran, then the new
/// program's whole argv (its `argv[0]` too), as the exec left them in its
/// memory; user space makes bcc's form of them (the tp_btf path).
pub const FLAG_ARGV: u32 = 4;
/// `Event::flags`, with [`FLAG_ARGV`]: the file was a script, so the
/// interpreter and its optional argument precede the file in argv.
pub const FLAG_SCRIPT: u32 = 8;

/// Byte offsets the tp_btf path reads, from BTF.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ExecOffsets {
    /// `task_struct.mm`.
    pub mm: u32,
    /// `mm_struct.arg_start`.
    pub arg_start: u32,
    /// `mm_struct.arg_end`.
    pub arg_end: u32,
    /// `linux_binprm.filename`.
    pub filename: u32,
    /// `linux_binprm.interp`.
    pub interp: u32,
    /// `linux_binprm.fdpath`, set for execveat(2) from a descriptor;
    /// `offsets::MISSING` where the kernel has none.
    pub fdpath: u32,
}

/// Byte offsets of a syscall tracepoint's fields, from tracefs.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct EnterOffsets {
    /// `filename`.
    pub filename: u32,
    /// `argv`.
    pub argv: u32,
}

/// Load-time configuration, passed as the global `CONFIG`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Config {
    /// Arguments to keep, at most [`MAX_ARGS`].
    pub max_args: u32,
    /// Only this user id, when `filter_uid` is set.
    pub uid: u32,
    /// Whether `uid` applies.
    pub filter_uid: u32,
    /// Whether failed execs are reported (`-x`).
    pub failed: u32,
    /// `task_struct.real_parent`, from BTF.
    pub real_parent: u32,
    /// `task_struct.tgid`, from BTF.
    pub tgid: u32,
    /// `sys_exit_*.ret`.
    pub exit_ret: u32,
    /// `sched_process_exec.old_pid`.
    pub old_pid: u32,
    /// Only children of this process (`-P`); 0 for all.
    pub ppid: u32,
    /// `sys_enter_execve`'s fields.
    pub execve: EnterOffsets,
    /// `sys_enter_execveat`'s fields.
    pub execveat: EnterOffsets,
    /// What the tp_btf path reads.
    pub exec: ExecOffsets,
}

/// One exec, as sent to user space. Only the first
/// `HEADER_SIZE + args_size` bytes travel through the ring buffer.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Event {
    /// Process id.
    pub pid: u32,
    /// Parent's process id.
    pub ppid: u32,
    /// Real user id.
    pub uid: u32,
    /// Return value: 0, or a negative errno.
    pub retval: i32,
    /// Arguments in `args`.
    pub args_count: u32,
    /// Bytes used in `args`.
    pub args_size: u32,
    /// `FLAG_*` bits.
    pub flags: u32,
    /// Keeps `comm` aligned.
    pub _pad: u32,
    /// Command name after a successful exec, the caller's otherwise.
    pub comm: [u8; TASK_COMM_LEN],
    /// The file name, then `argv[1..]`, each NUL-terminated.
    pub args: [u8; ARGS_SIZE],
}

/// Bytes of an [`Event`] before `args`.
pub const HEADER_SIZE: usize = core::mem::offset_of!(Event, args);

crate::pod!(Config, EnterOffsets, ExecOffsets, Event);

/// `TALLIES` slot of the exporter's collector: execs that succeeded.
pub const TALLY_EXECS: u32 = 0;
/// Slots the collector tallies.
pub const TALLY_SLOTS: u32 = 1;

//! Types of `rtrace ext4slower`.

use crate::{TASK_COMM_LEN, offsets::FdOffsets};

/// Bytes kept of a file's name (its dentry name), NUL included.
pub const NAME_LEN: usize = 32;

/// `Event::op`: a read.
pub const OP_READ: u32 = 0;
/// `Event::op`: a write.
pub const OP_WRITE: u32 = 1;
/// `Event::op`: an open.
pub const OP_OPEN: u32 = 2;
/// `Event::op`: an fsync or fdatasync.
pub const OP_FSYNC: u32 = 3;

/// `Event::bytes` of a sync of the whole file, as the kernel passes it
/// (`LLONG_MAX`).
pub const WHOLE_FILE: i64 = i64::MAX;

/// Byte offsets into the kernel's file structures, from BTF.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct FileOffsets {
    /// From a task to the file behind a descriptor.
    pub fd: FdOffsets,
    /// `file.f_inode`.
    pub f_inode: u32,
    /// `inode.i_sb`.
    pub i_sb: u32,
    /// `super_block.s_magic`.
    pub s_magic: u32,
    /// `file.f_path.dentry`.
    pub f_dentry: u32,
    /// `dentry.d_name.name`.
    pub d_name: u32,
    /// `file.f_pos`.
    pub f_pos: u32,
    /// `kiocb.ki_filp`.
    pub ki_filp: u32,
    /// `kiocb.ki_pos`.
    pub ki_pos: u32,
}

/// Load-time configuration, passed as the global `CONFIG`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Config {
    /// Operations faster than this are not sent.
    pub min_ns: u64,
    /// Offset of the first argument in a `sys_enter_*` record, from tracefs.
    pub sys_args: u32,
    /// Offset of `ret` in a `sys_exit_*` record, from tracefs.
    pub sys_ret: u32,
    /// Struct offsets, from BTF.
    pub file: FileOffsets,
    /// `super_block.s_magic` of the file system traced (the syscall
    /// tracepoint path keeps files on it only).
    pub magic: u64,
}

/// An operation in flight, kept by thread id from entry to return.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Entry {
    /// `bpf_ktime_get_ns` at entry.
    pub start_ns: u64,
    /// The `struct file`, or 0 for an open that has none yet; on the
    /// syscall tracepoint path, the descriptor.
    pub file: u64,
    /// File offset at entry, or [`POS_AFTER`].
    pub pos: i64,
    /// Bytes a sync covers; unused otherwise.
    pub span: i64,
    /// `OP_*`.
    pub op: u32,
    /// Keeps the struct free of padding.
    pub _pad: u32,
}

/// An entry's offset to be found at return, from the file's position
/// then and the bytes moved: the syscall path looks at the file only for
/// an operation slow enough to report.
pub const POS_AFTER: i64 = i64::MIN;

/// One slow operation.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Event {
    /// `bpf_ktime_get_ns` at completion.
    pub end_ns: u64,
    /// Latency in nanoseconds.
    pub delta_ns: u64,
    /// Bytes read or written, a sync's span, or 0 for an open.
    pub bytes: i64,
    /// File offset at entry, in bytes.
    pub offset: i64,
    /// Process id.
    pub pid: u32,
    /// `OP_*`.
    pub op: u32,
    /// The process's command.
    pub comm: [u8; TASK_COMM_LEN],
    /// The file's name (its last path component).
    pub name: [u8; NAME_LEN],
}

crate::pod!(FileOffsets, Config, Entry, Event);

/// The kretprobe every kprobe-attached operation returns through.
pub const PROG_KRETPROBE: &str = "kretprobe_ext4";
/// The classic tracepoint program of every `syscalls:sys_exit_*` the
/// syscall path attaches to.
pub const PROG_TP_SYS_EXIT: &str = "tp_sys_exit";

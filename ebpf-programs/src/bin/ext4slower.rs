//! ext4 reads, writes, opens and syncs slower than a threshold.
//!
//! Three ways in, one bookkeeping: an entry hook stores the operation by
//! thread (in the thread's own storage where the kernel has it, else in a
//! hash by thread id: `in_flight!`), and the return hook times it and
//! sends an event when it was slow enough.
//! - fentry/fexit and kprobe/kretprobe on `ext4_file_read_iter`,
//!   `ext4_file_write_iter`, `ext4_file_open` and `ext4_sync_file`, which
//!   only ext4 files reach;
//! - the syscall tracepoints of read, write, their positional and vector
//!   forms, openat, fsync and fdatasync, for kernels with neither: there
//!   the file behind the descriptor is looked up at return, for an
//!   operation slow enough to report, and kept only if its superblock is
//!   ext4's.
#![no_std]
#![no_main]

use aya_ebpf::{
    EbpfContext, Global,
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns,
        bpf_probe_read_kernel_str_bytes,
    },
    macros::{fentry, fexit, kprobe, kretprobe},
    programs::{FEntryContext, FExitContext, ProbeContext, RetProbeContext, TracePointContext},
};
use rtrace_common::{
    events::LOST_TABLE,
    ext4slower::{
        Config, Entry, Event, OP_FSYNC, OP_OPEN, OP_READ, OP_WRITE, POS_AFTER, WHOLE_FILE,
    },
};
use rtrace_ebpf::{count_error, events::emit, file_of_fd, global, read_kernel, read_ptr, targets};

rtrace_ebpf::event_map!();

#[unsafe(no_mangle)]
static CONFIG: Global<Config> = Global::new(unsafe { core::mem::zeroed() });

rtrace_ebpf::in_flight!(Entry, start_ns);

/// Whether the current process is traced: `-p` allows it, and it is not
/// rtrace itself (user space excludes its own process).
#[inline(always)]
fn traced() -> bool {
    targets::admits_current()
}

/// Stores an operation at entry, unless its process is not traced.
#[inline(always)]
fn enter(op: u32, file: *const u8, pos: i64, span: i64) {
    if traced() {
        store(op, file, pos, span);
    }
}

/// Stores an operation of a traced process at entry.
#[inline(always)]
fn store(op: u32, file: *const u8, pos: i64, span: i64) {
    let Some(slot) = start_slot() else {
        count_error(LOST_TABLE);
        return;
    };
    // SAFETY: `slot` is this thread's storage or this CPU's scratch value.
    unsafe {
        (*slot).file = file as u64;
        (*slot).pos = pos;
        (*slot).span = span;
        (*slot).op = op;
        // Last, as it marks the slot in use.
        (*slot).start_ns = bpf_ktime_get_ns();
    }
    if !start_commit(slot) {
        count_error(LOST_TABLE);
    }
}

/// Whether `file` lives on the file system traced (ext4 also serves ext2
/// and ext3, under the same magic).
#[inline(always)]
fn on_ext4(file: *const u8) -> bool {
    let cfg = global(&CONFIG);
    let o = &cfg.file;
    let sb = read_ptr(read_ptr(file, o.f_inode), o.i_sb);
    // s_magic is an unsigned long.
    read_kernel::<u64>(sb, o.s_magic).is_ok_and(|m| m == cfg.magic)
}

/// Times `entry`, whose operation returned `ret`, and sends it if slow
/// enough. `settle` then finds what entry did not know (the syscall
/// path's file), and may still drop it.
#[inline(always)]
fn exit<C: EbpfContext>(
    ctx: &C,
    mut entry: Entry,
    ret: i64,
    settle: impl FnOnce(&mut Entry) -> bool,
) {
    if ret < 0 {
        return;
    }
    let cfg = global(&CONFIG);
    // SAFETY: the helper has no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    let delta = now.saturating_sub(entry.start_ns);
    if delta < cfg.min_ns || !settle(&mut entry) {
        return;
    }
    let file = entry.file as *const u8;
    let mut event = Event {
        end_ns: now,
        delta_ns: delta,
        bytes: match entry.op {
            OP_READ | OP_WRITE => ret,
            OP_FSYNC => entry.span,
            _ => 0,
        },
        offset: entry.pos,
        pid: (bpf_get_current_pid_tgid() >> 32) as u32,
        op: entry.op,
        comm: bpf_get_current_comm().unwrap_or([0; 16]),
        name: [0; 32],
    };
    let o = &cfg.file;
    let name = read_ptr(read_ptr(file, o.f_dentry), o.d_name);
    if !name.is_null() {
        // SAFETY: the helper copes with any address.
        let _ = unsafe { bpf_probe_read_kernel_str_bytes(name, &mut event.name) };
    }
    emit(&EVENTS, ctx, &event);
}

/// The return of an fexit or kretprobe: `ret` as the function's type
/// gives it, open and fsync returning an int.
#[inline(always)]
fn function_exit<C: EbpfContext>(ctx: &C, ret: i64) {
    let Some(entry) = start_take() else { return };
    let ret = if matches!(entry.op, OP_OPEN | OP_FSYNC) {
        i64::from(ret as i32)
    } else {
        ret
    };
    exit(ctx, entry, ret, |_| true);
}

/// The file and position of a `struct kiocb`.
#[inline(always)]
fn kiocb(iocb: *const u8) -> (*const u8, i64) {
    let o = &global(&CONFIG).file;
    (
        read_ptr(iocb, o.ki_filp),
        read_kernel::<i64>(iocb, o.ki_pos).unwrap_or(0),
    )
}

/// The same from a BTF-typed `struct kiocb` pointer (fentry): loaded
/// directly, without a helper call. The verifier checks each load against
/// the kernel's BTF; the offsets come from read-only data, which it sees
/// as constants.
#[inline(always)]
fn kiocb_btf(iocb: *const u8) -> (*const u8, i64) {
    let o = &global(&CONFIG).file;
    // SAFETY: `iocb` is the traced function's live argument, and the
    // offsets are its members', from BTF.
    unsafe {
        (
            *(iocb.wrapping_add(o.ki_filp as usize) as *const *const u8),
            *(iocb.wrapping_add(o.ki_pos as usize) as *const i64),
        )
    }
}

/// The bytes `ext4_sync_file(file, start, end, datasync)` covers.
#[inline(always)]
fn sync_span(start: i64, end: i64) -> i64 {
    if end == WHOLE_FILE {
        WHOLE_FILE
    } else {
        end.saturating_sub(start).saturating_add(1)
    }
}

// fentry/fexit: arguments typed by the kernel's BTF; fexit gets them all
// again, then the return value.

#[fentry(function = "ext4_file_read_iter")]
pub fn fentry_read(ctx: FEntryContext) -> u32 {
    let (file, pos) = kiocb_btf(ctx.arg(0));
    enter(OP_READ, file, pos, 0);
    0
}

#[fentry(function = "ext4_file_write_iter")]
pub fn fentry_write(ctx: FEntryContext) -> u32 {
    let (file, pos) = kiocb_btf(ctx.arg(0));
    enter(OP_WRITE, file, pos, 0);
    0
}

#[fentry(function = "ext4_file_open")]
pub fn fentry_open(ctx: FEntryContext) -> u32 {
    enter(OP_OPEN, ctx.arg(1), 0, 0);
    0
}

#[fentry(function = "ext4_sync_file")]
pub fn fentry_sync(ctx: FEntryContext) -> u32 {
    let start: i64 = ctx.arg(1);
    enter(OP_FSYNC, ctx.arg(0), start, sync_span(start, ctx.arg(2)));
    0
}

#[fexit(function = "ext4_file_read_iter")]
pub fn fexit_read(ctx: FExitContext) -> u32 {
    function_exit(&ctx, ctx.arg(2));
    0
}

#[fexit(function = "ext4_file_write_iter")]
pub fn fexit_write(ctx: FExitContext) -> u32 {
    function_exit(&ctx, ctx.arg(2));
    0
}

#[fexit(function = "ext4_file_open")]
pub fn fexit_open(ctx: FExitContext) -> u32 {
    function_exit(&ctx, ctx.arg(2));
    0
}

#[fexit(function = "ext4_sync_file")]
pub fn fexit_sync(ctx: FExitContext) -> u32 {
    function_exit(&ctx, ctx.arg(4));
    0
}

// kprobes: the same, from registers.

#[kprobe]
pub fn kprobe_read(ctx: ProbeContext) -> u32 {
    let (file, pos) = kiocb(ctx.arg(0).unwrap_or(core::ptr::null()));
    enter(OP_READ, file, pos, 0);
    0
}

#[kprobe]
pub fn kprobe_write(ctx: ProbeContext) -> u32 {
    let (file, pos) = kiocb(ctx.arg(0).unwrap_or(core::ptr::null()));
    enter(OP_WRITE, file, pos, 0);
    0
}

#[kprobe]
pub fn kprobe_open(ctx: ProbeContext) -> u32 {
    enter(OP_OPEN, ctx.arg(1).unwrap_or(core::ptr::null()), 0, 0);
    0
}

#[kprobe]
pub fn kprobe_sync(ctx: ProbeContext) -> u32 {
    let start: i64 = ctx.arg(1).unwrap_or(0);
    let end: i64 = ctx.arg(2).unwrap_or(WHOLE_FILE);
    enter(
        OP_FSYNC,
        ctx.arg(0).unwrap_or(core::ptr::null()),
        start,
        sync_span(start, end),
    );
    0
}

/// One return probe serves all four functions: the entry says which.
#[kretprobe]
pub fn kretprobe_ext4(ctx: RetProbeContext) -> u32 {
    function_exit(&ctx, ctx.ret());
    0
}

// Syscall tracepoints: the descriptor's file must be looked up, and kept
// only when ext4 serves it.

/// Argument `n` of a `sys_enter_*` record.
#[inline(always)]
fn sys_arg(ctx: &TracePointContext, n: u32) -> i64 {
    rtrace_ebpf::record_field(ctx, global(&CONFIG).sys_args + n * 8).unwrap_or(-1)
}

/// A read or write of descriptor argument 0, at argument `pos_arg` or at
/// the file's own position. Every process's reads and writes come here,
/// and most are fast: which file the descriptor is, and whether ext4
/// serves it, is asked at return, of those slow enough to report.
#[inline(always)]
fn sys_enter_rw(ctx: &TracePointContext, op: u32, pos_arg: Option<u32>) {
    if !traced() {
        return;
    }
    let pos = match pos_arg {
        Some(n) => sys_arg(ctx, n),
        None => POS_AFTER,
    };
    store(op, sys_arg(ctx, 0) as u64 as *const u8, pos, 0);
}

rtrace_ebpf::tracepoint! {
    fn tp_sys_enter_read(ctx) {
        sys_enter_rw(&ctx, OP_READ, None);
    }
}

rtrace_ebpf::tracepoint! {
    fn tp_sys_enter_readv(ctx) {
        sys_enter_rw(&ctx, OP_READ, None);
    }
}

rtrace_ebpf::tracepoint! {
    fn tp_sys_enter_pread64(ctx) {
        sys_enter_rw(&ctx, OP_READ, Some(3));
    }
}

rtrace_ebpf::tracepoint! {
    fn tp_sys_enter_write(ctx) {
        sys_enter_rw(&ctx, OP_WRITE, None);
    }
}

rtrace_ebpf::tracepoint! {
    fn tp_sys_enter_writev(ctx) {
        sys_enter_rw(&ctx, OP_WRITE, None);
    }
}

rtrace_ebpf::tracepoint! {
    fn tp_sys_enter_pwrite64(ctx) {
        sys_enter_rw(&ctx, OP_WRITE, Some(3));
    }
}

rtrace_ebpf::tracepoint! {
    fn tp_sys_enter_fsync(ctx) {
        sys_enter_sync(&ctx);
    }
}

rtrace_ebpf::tracepoint! {
    fn tp_sys_enter_fdatasync(ctx) {
        sys_enter_sync(&ctx);
    }
}

/// fsync(2) and fdatasync(2) sync the whole file.
#[inline(always)]
fn sys_enter_sync(ctx: &TracePointContext) {
    if traced() {
        store(OP_FSYNC, sys_arg(ctx, 0) as u64 as *const u8, 0, WHOLE_FILE);
    }
}

rtrace_ebpf::tracepoint! {
    /// The file is not known until openat(2) returns its descriptor.
    fn tp_sys_enter_openat(_ctx) {
        enter(OP_OPEN, core::ptr::null(), 0, 0);
    }
}

rtrace_ebpf::tracepoint! {
    /// Attached to the exit of every syscall above.
    fn tp_sys_exit(ctx) {
        let ret: i64 = rtrace_ebpf::record_field(&ctx, global(&CONFIG).sys_ret).unwrap_or(-1);
        let Some(entry) = start_take() else { return };
        exit(&ctx, entry, ret, |e| settle_syscall(e, ret));
    }
}

/// Finds the file a syscall entry names by descriptor (an open's is the
/// one it returned) and keeps it if ext4 serves it; a read or write at
/// the file's position was at its position now less the bytes moved.
#[inline(always)]
fn settle_syscall(e: &mut Entry, ret: i64) -> bool {
    let o = &global(&CONFIG).file;
    let fd = if e.op == OP_OPEN { ret } else { e.file as i64 };
    let file = file_of_fd(&o.fd, fd);
    if file.is_null() || !on_ext4(file) {
        return false;
    }
    if e.pos == POS_AFTER {
        e.pos = read_kernel::<i64>(file, o.f_pos)
            .unwrap_or(0)
            .saturating_sub(ret);
    }
    e.file = file as u64;
    true
}

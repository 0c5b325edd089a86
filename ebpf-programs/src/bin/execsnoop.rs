//! exec(2) tracing: execve and execveat.
//!
//! Two paths. With tp_btf (and without `-x`), only `sched_process_exec`
//! runs: the exec has just laid the new program's argv out in its memory
//! (`mm->arg_start..arg_end`), so one read takes all of it, and the
//! program's `linux_binprm` names the file and says whether it was a
//! script. Nothing is kept between entry and exit, and nothing runs for
//! an exec that fails.
//!
//! Otherwise the syscall's entry gathers the arguments into a per-thread
//! entry; the outcome emits it to user space. Success is taken from
//! `sched_process_exec`, whose `old_pid` still names the thread that
//! entered the syscall even when a non-leader thread exec'd and took over
//! the process id; failure from the syscall's exit.
#![no_std]
#![no_main]

use aya_ebpf::{
    Global,
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_current_task,
        bpf_get_current_uid_gid, bpf_probe_read_user,
        generated::{
            bpf_probe_read_kernel_str, bpf_probe_read_user as bpf_probe_read_user_raw,
            bpf_probe_read_user_str,
        },
    },
    macros::{btf_tracepoint, map},
    maps::{HashMap, PerCpuArray},
    programs::{BtfTracePointContext, TracePointContext},
};
use rtrace_common::{
    events::LOST_TABLE,
    execsnoop::{
        ARG_SIZE, ARGS_SIZE, Config, Event, FLAG_ARGV, FLAG_EXECVEAT, FLAG_SCRIPT, FLAG_TRUNCATED,
        HEADER_SIZE, MAX_ARGS, TALLY_EXECS,
    },
    offsets::MISSING,
};
use rtrace_ebpf::{
    count_error,
    events::{emit_bytes, tally, tally_only},
    global, read_kernel, targets,
};

rtrace_ebpf::event_map!();

/// `BPF_F_NO_PREALLOC`: an entry lives only while its exec is in flight,
/// and preallocating thousands of 8 KiB entries would waste megabytes.
const NO_PREALLOC: u32 = 1;

#[unsafe(no_mangle)]
static CONFIG: Global<Config> = Global::new(unsafe { core::mem::zeroed() });

/// Execs in flight, by the thread that entered the syscall.
#[map]
static EXECS: HashMap<u32, Event> = HashMap::with_max_entries(16384, NO_PREALLOC);
/// Where an event is put together: it is far larger than the eBPF stack.
#[map]
static SCRATCH: PerCpuArray<Event> = PerCpuArray::with_max_entries(1, 0);

/// The current task's parent's process id.
#[inline(always)]
fn ppid(cfg: &Config) -> u32 {
    let task = unsafe { bpf_get_current_task() } as *const u8;
    let parent = read_kernel::<*const u8>(task, cfg.real_parent).unwrap_or(core::ptr::null());
    read_kernel::<u32>(parent, cfg.tgid).unwrap_or(0)
}

/// Copies the user string at `src` to `args` at `used`; returns its size
/// with the NUL, or `None` if nothing could be read or there is no room.
#[inline(always)]
fn push_arg(e: *mut Event, used: u32, src: *const u8) -> Option<u32> {
    // The volatile read keeps the bound check in a form the verifier sees.
    let used = unsafe { core::ptr::read_volatile(&raw const used) } as usize;
    if used > ARGS_SIZE - ARG_SIZE {
        return None;
    }
    // SAFETY: `used + ARG_SIZE` stays inside `args`, checked above.
    let dst = unsafe { (&raw mut (*e).args).cast::<u8>().add(used) };
    let n = unsafe { bpf_probe_read_user_str(dst.cast(), ARG_SIZE as u32, src.cast()) };
    (n > 0).then_some(n as u32)
}

#[inline(always)]
fn enter(ctx: &TracePointContext, flags: u32) {
    let cfg = CONFIG.load();
    let offsets = if flags & FLAG_EXECVEAT != 0 {
        cfg.execveat
    } else {
        cfg.execve
    };
    let uid = bpf_get_current_uid_gid() as u32;
    if cfg.filter_uid != 0 && uid != cfg.uid {
        return;
    }
    if cfg.ppid != 0 && ppid(&cfg) != cfg.ppid {
        return;
    }
    if !targets::admits_current() {
        return;
    }
    let Some(e) = SCRATCH.get_ptr_mut(0) else {
        return;
    };
    let id = bpf_get_current_pid_tgid();
    let Ok(filename) = (unsafe { ctx.read_at::<u64>(offsets.filename as usize) }) else {
        return;
    };
    let Ok(argv) = (unsafe { ctx.read_at::<u64>(offsets.argv as usize) }) else {
        return;
    };
    let argv = argv as *const u64;
    let mut flags = flags;
    // The file name stands first, as bcc prints it; fexecve and execveat
    // with AT_EMPTY_PATH pass an empty one, and then argv[0] does.
    let mut used = 0;
    let mut count = 0;
    let mut next = 0;
    if let Some(n) = push_arg(e, 0, filename as *const u8)
        && n > 1
    {
        used = n;
        count = 1;
        next = 1;
    }
    for i in 0..MAX_ARGS {
        if i < next {
            continue;
        }
        let Ok(ptr) = (unsafe { bpf_probe_read_user(argv.wrapping_add(i as usize)) }) else {
            break;
        };
        if ptr == 0 {
            break;
        }
        if count >= cfg.max_args {
            flags |= FLAG_TRUNCATED;
            break;
        }
        let Some(n) = push_arg(e, used, ptr as *const u8) else {
            flags |= FLAG_TRUNCATED;
            break;
        };
        if n as usize == ARG_SIZE {
            flags |= FLAG_TRUNCATED;
        }
        used += n;
        count += 1;
    }
    // SAFETY: `e` is this CPU's scratch event.
    unsafe {
        (*e).pid = (id >> 32) as u32;
        (*e).ppid = ppid(&cfg);
        (*e).uid = uid;
        (*e).retval = 0;
        (*e).args_count = count;
        (*e).args_size = used;
        (*e).flags = flags;
    }
    #[expect(
        clippy::needless_borrows_for_generic_args,
        reason = "passing by value would copy the event onto the 512-byte stack"
    )]
    if EXECS.insert(id as u32, unsafe { &*e }, 0).is_err() {
        count_error(LOST_TABLE);
    }
}

/// Sends the event of thread `tid` with `retval`, and forgets it.
#[inline(always)]
fn finish(ctx: &TracePointContext, tid: u32, retval: i32) {
    let Some(e) = EXECS.get_ptr_mut(tid) else {
        return;
    };
    if tally_only() {
        if retval == 0 {
            tally(TALLY_EXECS, 1);
        }
        let _ = EXECS.remove(tid);
        return;
    }
    // SAFETY: `e` is an EXECS value, removed only below.
    unsafe {
        (*e).retval = retval;
        (*e).comm = bpf_get_current_comm().unwrap_or([0; 16]);
        let len = HEADER_SIZE + ((*e).args_size as usize).min(ARGS_SIZE);
        emit_bytes(&EVENTS, ctx, e.cast(), len, HEADER_SIZE + ARGS_SIZE);
    }
    let _ = EXECS.remove(tid);
}

rtrace_ebpf::tracepoint! {
    fn tp_sys_enter_execve(ctx) {
        enter(&ctx, 0);
    }
}

rtrace_ebpf::tracepoint! {
    fn tp_sys_enter_execveat(ctx) {
        enter(&ctx, FLAG_EXECVEAT);
    }
}

#[inline(always)]
fn exit(ctx: &TracePointContext) {
    let cfg = CONFIG.load();
    let tid = bpf_get_current_pid_tgid() as u32;
    let ret = unsafe { ctx.read_at::<i64>(cfg.exit_ret as usize) }.unwrap_or(0);
    if ret < 0 && cfg.failed != 0 {
        finish(ctx, tid, ret as i32);
    } else {
        // A success was sent at sched_process_exec already.
        let _ = EXECS.remove(tid);
    }
}

rtrace_ebpf::tracepoint! {
    fn tp_sys_exit_execve(ctx) {
        exit(&ctx);
    }
}

rtrace_ebpf::tracepoint! {
    fn tp_sys_exit_execveat(ctx) {
        exit(&ctx);
    }
}

rtrace_ebpf::tracepoint! {
    fn tp_sched_process_exec(ctx) {
        let cfg = CONFIG.load();
        if let Ok(old) = unsafe { ctx.read_at::<u32>(cfg.old_pid as usize) } {
            finish(&ctx, old, 0);
        }
    }
}

/// Room for the argv block after the file name, which takes at most
/// `ARG_SIZE`.
const ARGV_ROOM: usize = ARGS_SIZE - ARG_SIZE;

/// The tp_btf path (see the module documentation): `sched_process_exec`
/// with the new program's `linux_binprm`.
#[btf_tracepoint(function = "sched_process_exec")]
pub fn btf_sched_process_exec(ctx: BtfTracePointContext) -> i32 {
    let _ = exec_argv(&ctx);
    0
}

#[inline(always)]
fn exec_argv(ctx: &BtfTracePointContext) -> Option<()> {
    let cfg = global(&CONFIG);
    let uid = bpf_get_current_uid_gid() as u32;
    if cfg.filter_uid != 0 && uid != cfg.uid {
        return None;
    }
    if cfg.ppid != 0 && ppid(cfg) != cfg.ppid {
        return None;
    }
    if !targets::admits_current() {
        return None;
    }
    if tally_only() {
        tally(TALLY_EXECS, 1);
        return None;
    }
    let o = &cfg.exec;
    let e = SCRATCH.get_ptr_mut(0)?;
    let task: *const u8 = ctx.arg(0);
    let bprm: *const u8 = ctx.arg(2);
    let mut flags = FLAG_ARGV;
    // The kernel names the file `/dev/fd/N[/PATH]` (in `fdpath`) for
    // execveat(2) from a descriptor.
    if o.fdpath != MISSING && read_kernel::<u64>(bprm, o.fdpath).unwrap_or(0) != 0 {
        flags |= FLAG_EXECVEAT;
    }
    let filename = read_kernel::<*const u8>(bprm, o.filename).ok()?;
    if read_kernel::<*const u8>(bprm, o.interp).ok()? != filename {
        flags |= FLAG_SCRIPT;
    }
    // SAFETY: `args` has room for `ARG_SIZE` bytes at its start.
    let args = unsafe { (&raw mut (*e).args).cast::<u8>() };
    let n = unsafe { bpf_probe_read_kernel_str(args.cast(), ARG_SIZE as u32, filename.cast()) };
    let used = if n > 0 { n as usize } else { 0 };
    let mm = read_kernel::<*const u8>(task, o.mm).ok()?;
    let start = read_kernel::<u64>(mm, o.arg_start).ok()?;
    let end = read_kernel::<u64>(mm, o.arg_end).ok()?;
    let mut len = end.saturating_sub(start) as usize;
    if len > ARGV_ROOM {
        len = ARGV_ROOM;
        flags |= FLAG_TRUNCATED;
    }
    // The volatile reads keep the bounds in a form the verifier sees.
    let used = unsafe { core::ptr::read_volatile(&raw const used) };
    let len = unsafe { core::ptr::read_volatile(&raw const len) };
    if used > ARG_SIZE || len > ARGV_ROOM {
        return None;
    }
    // SAFETY: `used + len <= ARGS_SIZE`, inside `args`; the argv was
    // written by the exec just now, so it is there to read.
    let read =
        unsafe { bpf_probe_read_user_raw(args.add(used).cast(), len as u32, start as *const _) };
    if read < 0 {
        return None;
    }
    // SAFETY: `e` is this CPU's scratch event.
    unsafe {
        (*e).pid = (bpf_get_current_pid_tgid() >> 32) as u32;
        (*e).ppid = ppid(cfg);
        (*e).uid = uid;
        (*e).retval = 0;
        (*e).args_count = 0;
        (*e).args_size = (used + len) as u32;
        (*e).flags = flags;
        (*e).comm = bpf_get_current_comm().unwrap_or([0; 16]);
        emit_bytes(
            &EVENTS,
            ctx,
            e.cast(),
            HEADER_SIZE + used + len,
            HEADER_SIZE + ARGS_SIZE,
        );
    }
    Some(())
}

//! `rtrace strace`: every syscall of the scope, from the two
//! `raw_syscalls` tracepoints. The entry keeps the arguments by thread;
//! the exit counts the call for the summary (in the kernel, so `-c` sends
//! nothing) and sends one record with the arguments, the return value and
//! the bytes of the arguments user space asked for (strings, buffers,
//! structs), read then, when an output argument is filled in. An exec's
//! arguments are read and sent at its entry instead, since its exit finds
//! the old program's memory gone. Signals delivered and threads that exit
//! are sent too, for strace's `---` and `+++` lines.
#![no_std]
#![no_main]

use aya_ebpf::{
    Global,
    bindings::BPF_NOEXIST,
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_current_task, bpf_ktime_get_ns,
        generated::{bpf_probe_read_kernel_str, bpf_probe_read_user, bpf_probe_read_user_str},
    },
    macros::{map, raw_tracepoint},
    maps::{HashMap, PerCpuArray},
    programs::RawTracePointContext,
};
use rtrace_common::{
    events::LOST_TABLE,
    strace::{
        BLOB, BLOBS, CAPTURE_ARGV, CAPTURE_DIRENTS, CAPTURE_FIXED, CAPTURE_LEN_ARG,
        CAPTURE_LEN_RET, CAPTURE_STR, Capture, Config, ERR_BY_PID_FULL, ERR_SYSCALL_NR, Event,
        FLAG_EXEC_DONE, FLAG_FIXED_SLOTS, FLAG_NO_ENTRY, FLAG_NO_RETURN, HEADER_SIZE, Inflight,
        KIND_EXEC, KIND_EXIT, KIND_FORK, KIND_SIGNAL, KIND_SYSCALL, MAX_ARGS, MAX_PID_NRS,
        MAX_SYSCALLS, NR_RT_SIGRETURN, PidNr, ProcTotals, SIGRETURN_MASK_OFFSET, Syscall, Totals,
    },
};
use rtrace_ebpf::{atomic_add, count_error, events::emit_bytes, global, read_kernel, targets};

rtrace_ebpf::event_map!();
rtrace_ebpf::cfi_programs!();

#[unsafe(no_mangle)]
static CONFIG: Global<Config> = Global::new(unsafe { core::mem::zeroed() });

/// What to do for each syscall number; user space fills it.
#[map]
static SYSCALLS: aya_ebpf::maps::Array<Syscall> =
    aya_ebpf::maps::Array::with_max_entries(MAX_SYSCALLS, 0);

/// Syscalls in flight, by thread.
#[map]
static INFLIGHT: HashMap<u32, Inflight> = HashMap::with_max_entries(16384, 0);

/// The summary: each syscall's calls, errors and time, per CPU.
#[map]
static SUMMARY: PerCpuArray<Totals> = PerCpuArray::with_max_entries(MAX_SYSCALLS, 0);

/// The summary by process (`--summary-by-process`).
#[map]
static SUMMARY_BY_PID: HashMap<PidNr, ProcTotals> = HashMap::with_max_entries(MAX_PID_NRS, 0);

/// Adds a call to the summary by process.
#[inline(always)]
fn by_process(nr: u64, failed: bool, took: u64) {
    let key = PidNr {
        pid: (bpf_get_current_pid_tgid() >> 32) as u32,
        nr: nr as u32,
    };
    let add = |t: *mut ProcTotals| {
        // SAFETY: a map value; other CPUs add to it too, atomically.
        unsafe {
            atomic_add(&raw mut (*t).totals.calls, 1);
            atomic_add(&raw mut (*t).totals.errors, u64::from(failed));
            atomic_add(&raw mut (*t).totals.ns, took);
        }
    };
    if let Some(t) = SUMMARY_BY_PID.get_ptr_mut(key) {
        add(t);
        return;
    }
    let first = ProcTotals {
        totals: Totals {
            calls: 1,
            errors: u64::from(failed),
            ns: took,
        },
        comm: bpf_get_current_comm().unwrap_or([0; 16]),
    };
    if SUMMARY_BY_PID
        .insert(key, first, u64::from(BPF_NOEXIST))
        .is_err()
    {
        // Another CPU made it meanwhile, or the table is full.
        match SUMMARY_BY_PID.get_ptr_mut(key) {
            Some(t) => add(t),
            None => count_error(ERR_BY_PID_FULL),
        }
    }
}

/// Where a record is put together: it is far larger than the stack.
#[map]
static SCRATCH: PerCpuArray<Event> = PerCpuArray::with_max_entries(1, 0);

/// `struct pt_regs` on x86-64 (the UAPI layout): where the syscall's
/// arguments and number are.
const ARG_REGS: [u32; MAX_ARGS] = [14 * 8, 13 * 8, 12 * 8, 7 * 8, 9 * 8, 8 * 8];
const ORIG_AX: u32 = 15 * 8;
/// `pt_regs.sp`.
const SP: u32 = 19 * 8;
/// Directory entries a `getdents64` line counts at most (a 32 KiB buffer
/// holds fewer than 1400).
const MAX_DIRENTS: usize = 2048;

/// Strings of an argv captured at most.
const MAX_ARGV: usize = 20;
/// Environment entries counted at most.
const MAX_ENV: usize = 128;

/// The syscall's number at exit, from the registers.
#[inline(always)]
fn orig_ax(regs: *const u8) -> Option<u64> {
    read_kernel::<i64>(regs, ORIG_AX)
        .ok()
        .filter(|&n| n >= 0)
        .map(|n| n as u64)
}

/// `sys_enter(regs, id)`.
#[raw_tracepoint(tracepoint = "sys_enter")]
pub fn strace_sys_enter(ctx: RawTracePointContext) -> i32 {
    if !targets::admits_current() {
        return 0;
    }
    let regs: *const u8 = ctx.arg(0);
    let nr: u64 = ctx.arg(1);
    let mut f = Inflight {
        nr,
        args: [0; MAX_ARGS],
        // SAFETY: the helper has no preconditions.
        enter_ns: unsafe { bpf_ktime_get_ns() },
    };
    for (i, off) in ARG_REGS.iter().enumerate() {
        f.args[i] = read_kernel::<u64>(regs, *off).unwrap_or(0);
    }
    // rt_sigreturn takes no argument: its line shows the mask the signal
    // frame on the stack restores.
    if nr == NR_RT_SIGRETURN {
        f.args[0] = read_kernel::<u64>(regs, SP).unwrap_or(0) + SIGRETURN_MASK_OFFSET;
    }
    let tid = bpf_get_current_pid_tgid() as u32;
    if INFLIGHT.insert(tid, f, 0).is_err() {
        count_error(LOST_TABLE);
    }
    let cfg = global(&CONFIG);
    if cfg.lines != 0
        && nr < u64::from(MAX_SYSCALLS)
        && let Some(s) = SYSCALLS.get(nr as u32)
        && s.shown != 0
        && s.at_entry != 0
    {
        send_exec(&ctx, &f, s, cfg);
    }
    0
}

/// User stacks of calls in flight (`-k`), by thread: the hash of each in
/// the shared stack table.
#[map]
static STACK_OF: HashMap<u32, u64> = HashMap::with_max_entries(16384, 0);

/// With `-k`: walks the user stack of a shown call at its entry (the
/// CFI walk in the `cfi` variant, else frame pointers) into the shared
/// stack table, for its line. A program of its own, so that the walk is
/// verified apart from the capture's programs.
#[raw_tracepoint(tracepoint = "sys_enter")]
pub fn strace_stack(ctx: RawTracePointContext) -> i32 {
    let cfg = global(&CONFIG);
    if cfg.stacks == 0 || !targets::admits_current() {
        return 0;
    }
    let nr: u64 = ctx.arg(1);
    if nr >= u64::from(MAX_SYSCALLS) || SYSCALLS.get(nr as u32).is_none_or(|s| s.shown == 0) {
        return 0;
    }
    let id = bpf_get_current_pid_tgid();
    let tgid = (id >> 32) as u32;
    let stack =
        rtrace_ebpf::stacks::user_stack(&ctx, &EVENTS, tgid, core::ptr::null()).unwrap_or(0);
    rtrace_ebpf::stacks::tell_first(&ctx, &EVENTS, tgid);
    let _ = STACK_OF.insert(id as u32, stack, 0);
    0
}

/// `sys_exit(regs, ret)`.
#[raw_tracepoint(tracepoint = "sys_exit")]
pub fn strace_sys_exit(ctx: RawTracePointContext) -> i32 {
    let tid = bpf_get_current_pid_tgid() as u32;
    let ret: i64 = ctx.arg(1);
    // SAFETY: the helper has no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    let (f, flags) = match INFLIGHT.get_ptr(tid) {
        // SAFETY: a map value, copied before it is removed.
        Some(p) => {
            let f = unsafe { *p };
            let _ = INFLIGHT.remove(tid);
            (f, 0)
        }
        None => {
            // Began before tracing did, or its entry found the table full.
            if !targets::admits_current() {
                return 0;
            }
            let regs: *const u8 = ctx.arg(0);
            let Some(nr) = orig_ax(regs) else { return 0 };
            let f = Inflight {
                nr,
                args: [0; MAX_ARGS],
                enter_ns: now,
            };
            (f, FLAG_NO_ENTRY)
        }
    };
    if f.nr >= u64::from(MAX_SYSCALLS) {
        count_error(ERR_SYSCALL_NR);
        return 0;
    }
    let cfg = global(&CONFIG);
    let failed = (-4095..0).contains(&ret);
    let took = now.saturating_sub(f.enter_ns);
    if cfg.summary != 0
        && let Some(t) = SUMMARY.get_ptr_mut(f.nr as u32)
    {
        // SAFETY: this CPU's slot; the program does not nest in itself.
        unsafe {
            (*t).calls += 1;
            (*t).errors += u64::from(failed);
            (*t).ns += took;
        }
    }
    if cfg.by_process != 0 {
        by_process(f.nr, failed, took);
    }
    if cfg.lines == 0 || (cfg.failed_only != 0 && !failed) || took < cfg.min_ns {
        return 0;
    }
    let Some(s) = SYSCALLS.get(f.nr as u32) else {
        return 0;
    };
    if s.shown == 0 {
        return 0;
    }
    send(&ctx, KIND_SYSCALL, flags, &f, now, ret, s, cfg);
    0
}

/// Fills the record's header.
#[inline(always)]
fn header(e: *mut Event, kind: u32, flags: u32, f: &Inflight, now: u64, ret: i64) {
    let id = bpf_get_current_pid_tgid();
    // SAFETY: this CPU's scratch record.
    unsafe {
        (*e).kind = kind;
        (*e).flags = flags;
        (*e).pid = (id >> 32) as u32;
        (*e).tid = id as u32;
        (*e).nr = f.nr;
        (*e).enter_ns = f.enter_ns;
        (*e).exit_ns = now;
        (*e).args = f.args;
        (*e).ret = ret;
        (*e).stack = 0;
        (*e).lens = [0; BLOBS];
        (*e).comm = bpf_get_current_comm().unwrap_or([0; 16]);
    }
}

/// An exec's record, at its entry: the file, the argv and the count of
/// the environment (in `ret`), each argument at its fixed slot.
#[inline(always)]
fn send_exec(ctx: &RawTracePointContext, f: &Inflight, s: &Syscall, cfg: &Config) {
    let Some(e) = SCRATCH.get_ptr_mut(0) else {
        return;
    };
    header(e, KIND_EXEC, FLAG_FIXED_SLOTS, f, f.enter_ns, 0);
    let limit = (cfg.string_limit as usize).min(BLOB);
    let file = s.captures[0];
    if file.how == CAPTURE_STR
        && let Some(&src) = f.args.get(file.arg as usize)
    {
        // The program's path whole, as strace shows a path.
        // SAFETY: the data area has room for `BLOB` bytes.
        let n = unsafe {
            bpf_probe_read_user_str((&raw mut (*e).data).cast(), BLOB as u32, src as *const _)
        };
        unsafe { (*e).lens[0] = n.max(0) as u32 };
    }
    let list = s.captures[1];
    if list.how == CAPTURE_ARGV
        && let Some(&src) = f.args.get(list.arg as usize)
    {
        // SAFETY: slot 1 starts `BLOB` into the data area.
        let dst = unsafe { (&raw mut (*e).data).cast::<u8>().add(BLOB) };
        let n = argv(dst, src as *const u64, limit);
        unsafe { (*e).lens[1] = n as u32 };
    }
    let env = env_count(f.args[2] as *const u64);
    // SAFETY: as above.
    unsafe { (*e).ret = env };
    // SAFETY: `e` holds the whole record.
    unsafe {
        emit_bytes(
            &EVENTS,
            ctx,
            e.cast(),
            HEADER_SIZE + BLOB * BLOBS,
            HEADER_SIZE + BLOB * BLOBS,
        )
    };
}

/// Puts a record together and sends it: the syscall's figures and the
/// arguments `s` captures (none at the exit of a call captured at entry).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn send(
    ctx: &RawTracePointContext,
    kind: u32,
    flags: u32,
    f: &Inflight,
    now: u64,
    ret: i64,
    s: &Syscall,
    cfg: &Config,
) {
    let Some(e) = SCRATCH.get_ptr_mut(0) else {
        return;
    };
    header(e, kind, flags, f, now, ret);
    if cfg.stacks != 0 {
        let tid = bpf_get_current_pid_tgid() as u32;
        // SAFETY: a map value, copied.
        if let Some(h) = unsafe { STACK_OF.get(tid) } {
            // SAFETY: this CPU's scratch record.
            unsafe { (*e).stack = *h };
            let _ = STACK_OF.remove(tid);
        }
    }
    let mut used = 0usize;
    if s.at_entry == 0 && flags & FLAG_NO_ENTRY == 0 {
        let limit = (cfg.string_limit as usize).min(BLOB);
        for i in 0..BLOBS {
            let n = capture(e, used, &s.captures[i], f, ret, limit);
            // SAFETY: as above.
            unsafe { (*e).lens[i] = n as u32 };
            used += n;
        }
    }
    // SAFETY: `e` holds `HEADER_SIZE + used` bytes, `used <= BLOB * BLOBS`.
    unsafe {
        emit_bytes(
            &EVENTS,
            ctx,
            e.cast(),
            HEADER_SIZE + used,
            HEADER_SIZE + BLOB * BLOBS,
        )
    };
}

/// Reads argument `c` of the call into the record's data at `used`;
/// returns the bytes read (0 for none).
#[inline(always)]
fn capture(e: *mut Event, used: usize, c: &Capture, f: &Inflight, ret: i64, limit: usize) -> usize {
    // The volatile read keeps the bound check in a form the verifier sees.
    let used = unsafe { core::ptr::read_volatile(&raw const used) };
    if used > BLOB * (BLOBS - 1) || c.arg as usize >= MAX_ARGS {
        return 0;
    }
    let src = f.args.get(c.arg as usize).copied().unwrap_or(0) as *const u8;
    if src.is_null() {
        return 0;
    }
    // SAFETY: `used + BLOB` stays inside `data`, checked above.
    let dst = unsafe { (&raw mut (*e).data).cast::<u8>().add(used) };
    let failed = (-4095..0).contains(&ret);
    if c.on_success != 0 && failed {
        return 0;
    }
    // A path or an array is read whole (as far as a slot holds); a
    // buffer as `-s` cuts it.
    let cap = if c.size != 0 {
        c.size as usize
    } else {
        limit + 1
    };
    let len = match c.how {
        CAPTURE_STR => {
            // Two more than shown: the NUL, and one to tell a string cut
            // short from one exactly as long.
            let room = (cap + 1).min(BLOB);
            // SAFETY: `dst` has room for `BLOB >= room` bytes.
            let n = unsafe { bpf_probe_read_user_str(dst.cast(), room as u32, src.cast()) };
            return if n > 0 { n as usize } else { 0 };
        }
        // One more than shown, to tell a buffer cut short.
        CAPTURE_LEN_ARG => (f.args.get(c.len_arg as usize).copied().unwrap_or(0)
            * u64::from(c.scale.max(1)))
        .min(cap as u64)
        .min(BLOB as u64),
        CAPTURE_LEN_RET if ret > 0 => (ret as u64 * u64::from(c.scale.max(1)))
            .min(cap as u64)
            .min(BLOB as u64),
        // Structs whole, whatever -s says.
        CAPTURE_FIXED => u64::from(c.size),
        CAPTURE_DIRENTS if ret >= 0 => {
            let count = dirents(src, ret as u64);
            // SAFETY: `dst` has room for `BLOB >= 4` bytes.
            unsafe { core::ptr::write_unaligned(dst.cast::<u32>(), count) };
            return 4;
        }
        _ => return 0,
    };
    let n = len as usize;
    let n = unsafe { core::ptr::read_volatile(&raw const n) };
    if n == 0 || n > BLOB {
        return 0;
    }
    // SAFETY: `dst` has room for `BLOB >= n` bytes.
    let r = unsafe { bpf_probe_read_user(dst.cast(), n as u32, src.cast()) };
    if r == 0 { n } else { 0 }
}

/// The entries of a `getdents64` buffer of `len` bytes at `buf`, each
/// `struct linux_dirent64` giving its length (`d_reclen`, at 16).
#[inline(always)]
fn dirents(buf: *const u8, len: u64) -> u32 {
    let mut at = 0u64;
    let mut count = 0u32;
    for _ in 0..MAX_DIRENTS {
        if at >= len {
            break;
        }
        let mut reclen = 0u16;
        // SAFETY: reads two bytes into a local.
        let r = unsafe {
            bpf_probe_read_user(
                (&raw mut reclen).cast(),
                2,
                buf.wrapping_add((at + 16) as usize).cast(),
            )
        };
        if r != 0 || reclen == 0 {
            break;
        }
        at += u64::from(reclen);
        count += 1;
    }
    count
}

/// Reads the strings of the argv at `ptrs` into `dst`, NUL-separated, up
/// to `limit` bytes and [`MAX_ARGV`] strings; returns the bytes used.
#[inline(always)]
fn argv(dst: *mut u8, ptrs: *const u64, limit: usize) -> usize {
    let mut used = 0usize;
    for i in 0..MAX_ARGV {
        let mut p = 0u64;
        // SAFETY: reads one pointer into a local.
        if unsafe { bpf_probe_read_user((&raw mut p).cast(), 8, ptrs.wrapping_add(i).cast()) } != 0
            || p == 0
        {
            break;
        }
        // The volatile read keeps the bound check in a form the verifier
        // sees.
        let at = unsafe { core::ptr::read_volatile(&raw const used) };
        if at >= BLOB {
            break;
        }
        // Each string as `-s` cuts it, with its NUL and one more byte to
        // tell it was cut.
        let room = (limit + 2).min(BLOB - at);
        // SAFETY: `dst + at` has `BLOB` bytes of room at least: `at <
        // BLOB` into a slot with a spare `BLOB` after it.
        let n = unsafe { bpf_probe_read_user_str(dst.add(at).cast(), room as u32, p as *const _) };
        if n <= 0 {
            break;
        }
        used = at + n as usize;
    }
    used
}

/// The entries of the environment at `envp`, up to [`MAX_ENV`].
#[inline(always)]
fn env_count(envp: *const u64) -> i64 {
    let mut env = 0i64;
    if envp.is_null() {
        return 0;
    }
    for i in 0..MAX_ENV {
        let mut p = 0u64;
        // SAFETY: reads one pointer into a local.
        if unsafe { bpf_probe_read_user((&raw mut p).cast(), 8, envp.wrapping_add(i).cast()) } != 0
            || p == 0
        {
            break;
        }
        env += 1;
    }
    env
}

/// `sched_process_exec(p, old_pid, bprm)`: an exec that succeeded. Its
/// argv is read from where the kernel has just laid it out for the new
/// program, which is in memory; the old program's strings, read at the
/// syscall's entry, may be in pages not faulted in (a forked child's
/// `.rodata`), which a BPF program cannot read.
/// With `-f` and `-p`: a child a traced process forks is traced from its
/// birth, as strace -f follows it.
#[raw_tracepoint(tracepoint = "sched_process_fork")]
pub fn strace_fork(ctx: RawTracePointContext) -> i32 {
    let cfg = global(&CONFIG);
    if (cfg.follow == 0 && cfg.forks == 0) || !targets::admits_current() {
        return 0;
    }
    // The tracepoint's second argument is the child's task.
    let child: *const u8 = ctx.arg(1);
    let Ok(tgid) = read_kernel::<u32>(child, cfg.tgid) else {
        return 0;
    };
    if cfg.follow != 0 {
        targets::adopt(tgid);
    }
    // A new process (not a thread), told before it runs, so that it
    // comes before anything the child or its parent do next.
    if cfg.forks != 0 && u64::from(tgid) != bpf_get_current_pid_tgid() >> 32 {
        let mut args = [0; MAX_ARGS];
        args[0] = u64::from(tgid);
        let f = Inflight {
            nr: 0,
            args,
            // SAFETY: the helper has no preconditions.
            enter_ns: unsafe { bpf_ktime_get_ns() },
        };
        send_plain(&ctx, KIND_FORK, &f);
    }
    0
}

#[raw_tracepoint(tracepoint = "sched_process_exec")]
pub fn strace_exec(ctx: RawTracePointContext) -> i32 {
    let cfg = global(&CONFIG);
    if cfg.lines == 0 || !targets::admits_current() {
        return 0;
    }
    let tid = bpf_get_current_pid_tgid() as u32;
    let Some(p) = INFLIGHT.get_ptr(tid) else {
        return 0;
    };
    // SAFETY: a map value, copied.
    let f = unsafe { *p };
    let Some(e) = SCRATCH.get_ptr_mut(0) else {
        return 0;
    };
    header(
        e,
        KIND_EXEC,
        FLAG_FIXED_SLOTS | FLAG_EXEC_DONE,
        &f,
        f.enter_ns,
        0,
    );
    let bprm: *const u8 = ctx.arg(2);
    if let Ok(name) = read_kernel::<*const u8>(bprm, cfg.bprm_filename) {
        // SAFETY: the data area has room for `BLOB` bytes.
        let n = unsafe {
            bpf_probe_read_kernel_str((&raw mut (*e).data).cast(), BLOB as u32, name.cast())
        };
        unsafe { (*e).lens[0] = n.max(0) as u32 };
    }
    // SAFETY: the helper has no preconditions.
    let task = unsafe { bpf_get_current_task() } as *const u8;
    let mm = read_kernel::<*const u8>(task, cfg.mm).unwrap_or(core::ptr::null());
    let start = read_kernel::<u64>(mm, cfg.arg_start).unwrap_or(0);
    let end = read_kernel::<u64>(mm, cfg.arg_end).unwrap_or(0);
    // SAFETY: slot 1 starts `BLOB` into the data area.
    let dst = unsafe { (&raw mut (*e).data).cast::<u8>().add(BLOB) };
    let n = argv_area(dst, start, end);
    // SAFETY: as above.
    unsafe {
        (*e).lens[1] = n as u32;
        // The environment's count, from the record the entry sent.
        (*e).ret = -1;
        emit_bytes(
            &EVENTS,
            &ctx,
            e.cast(),
            HEADER_SIZE + BLOB * BLOBS,
            HEADER_SIZE + BLOB * BLOBS,
        );
    }
    0
}

/// Reads the argv area `start..end` (NUL-separated strings) into `dst`
/// in one read, as much as a slot holds; user space cuts each string as
/// `-s` says. Returns the bytes read.
#[inline(always)]
fn argv_area(dst: *mut u8, start: u64, end: u64) -> usize {
    let n = end.saturating_sub(start).min(BLOB as u64) as usize;
    let n = unsafe { core::ptr::read_volatile(&raw const n) };
    if n == 0 || n > BLOB {
        return 0;
    }
    // SAFETY: `dst` has room for `BLOB >= n` bytes.
    if unsafe { bpf_probe_read_user(dst.cast(), n as u32, start as *const _) } == 0 {
        n
    } else {
        0
    }
}

/// `SIGCHLD`'s number.
const SIGCHLD: u64 = 17;

/// `signal_deliver(sig, info, ka)`: the signal, its code, and the
/// sender's pid and uid and a child's status (siginfo's ABI layout).
#[raw_tracepoint(tracepoint = "signal_deliver")]
pub fn strace_signal(ctx: RawTracePointContext) -> i32 {
    if global(&CONFIG).lines == 0 || !targets::admits_current() {
        return 0;
    }
    let sig: u64 = ctx.arg(0);
    let info: *const u8 = ctx.arg(1);
    let field = |off: u32| read_kernel::<i32>(info, off).map_or(0, |v| v as i64 as u64);
    // A child's times (`si_utime`, `si_stime`), in clock ticks.
    let times = if sig == SIGCHLD {
        let tick = |off: u32| read_kernel::<i64>(info, off).map_or(0, |v| v as u32 as u64);
        tick(32) | tick(40) << 32
    } else {
        0
    };
    let f = Inflight {
        nr: 0,
        args: [sig, field(8), field(16), field(20), field(24), times],
        // SAFETY: the helper has no preconditions.
        enter_ns: unsafe { bpf_ktime_get_ns() },
    };
    send_plain(&ctx, KIND_SIGNAL, &f);
    0
}

/// `sched_process_exit(task)`: the thread's exit code as wait gives it,
/// and whether its process has no other thread left.
#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn strace_exit(ctx: RawTracePointContext) -> i32 {
    let cfg = global(&CONFIG);
    if cfg.lines == 0 || !targets::admits_current() {
        return 0;
    }
    // SAFETY: the helper has no preconditions.
    let task = unsafe { bpf_get_current_task() } as *const u8;
    let code = read_kernel::<i32>(task, cfg.exit_code).unwrap_or(0);
    let signal = read_kernel::<*const u8>(task, cfg.signal).unwrap_or(core::ptr::null());
    let live = read_kernel::<i32>(signal, cfg.live).unwrap_or(1);
    let f = Inflight {
        nr: 0,
        args: [code as u32 as u64, u64::from(live == 0), 0, 0, 0, 0],
        // SAFETY: the helper has no preconditions.
        enter_ns: unsafe { bpf_ktime_get_ns() },
    };
    // A thread that exits inside a syscall (exit, exit_group) never
    // returns from it: strace shows it with `= ?`.
    let tid = bpf_get_current_pid_tgid() as u32;
    if let Some(p) = INFLIGHT.get_ptr(tid) {
        // SAFETY: a map value, copied before it is removed.
        let call = unsafe { *p };
        let _ = INFLIGHT.remove(tid);
        // Neither failed nor timed: -Z and --duration leave it out.
        if call.nr < u64::from(MAX_SYSCALLS)
            && cfg.failed_only == 0
            && cfg.min_ns == 0
            && let Some(s) = SYSCALLS.get(call.nr as u32)
            && s.shown != 0
        {
            send(
                &ctx,
                KIND_SYSCALL,
                FLAG_NO_RETURN,
                &call,
                f.enter_ns,
                0,
                s,
                cfg,
            );
        }
    }
    send_plain(&ctx, KIND_EXIT, &f);
    0
}

/// Sends a record of `kind` without captured bytes.
#[inline(always)]
fn send_plain(ctx: &RawTracePointContext, kind: u32, f: &Inflight) {
    let s = Syscall::default();
    send(
        ctx,
        kind,
        FLAG_NO_ENTRY,
        f,
        f.enter_ns,
        0,
        &s,
        global(&CONFIG),
    );
}

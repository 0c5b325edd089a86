//! Off-CPU time: at each context switch, the thread leaving the CPU has
//! its stacks taken and its time of leaving kept; when it runs again, the
//! time it was off is added to the count of those stacks in the shared
//! stack tables (`rtrace_ebpf::stacks`). Nothing per switch crosses to
//! user space.
//!
//! One set of programs per attach mechanism: tp_btf reads the tasks
//! through BTF-typed pointers, the raw tracepoint through the helper; both
//! with offsets from BTF. The thread leaving is the current one, so its
//! stacks are walked as for a sample: the kernel's from the tracepoint,
//! the user one from the registers it entered the kernel with.
//!
//! With `--waker`, sched_waking takes the stacks of the thread waking a
//! traced one (the current thread there) into its entry, as bcc's
//! offwaketime does, and the time is counted by both.
#![no_std]
#![no_main]

use aya_ebpf::{
    EbpfContext, Global,
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{btf_tracepoint, map, raw_tracepoint},
    maps::HashMap,
    programs::{BtfTracePointContext, RawTracePointContext},
};
use rtrace_common::{
    offcputime::{
        Config, ERR_STARTS_FULL, PF_KTHREAD, STATE_ANY, Start, THREADS_ALL, THREADS_USER,
    },
    profile::{Key, MISSED_KERNEL, MISSED_USER, WakeKey},
};
use rtrace_ebpf::{count_error, global, stacks, targets, task_u32};

rtrace_ebpf::event_map!();
rtrace_ebpf::cfi_programs!();
rtrace_ebpf::stack_counts!(rtrace_common::profile::WakeKey);

/// Set by user space before load.
#[unsafe(no_mangle)]
static CONFIG: Global<Config> = Global::new(unsafe { core::mem::zeroed() });

/// Threads off the CPU, by thread id. Preallocated: a context switch must
/// not allocate. User space sizes it to the threads the system can have.
#[map]
static STARTS: HashMap<u32, Start> = HashMap::with_max_entries(1, 0);

/// Whether the thread leaving the CPU (the current one, `prev`) is
/// traced: its ids and cgroup, its kind (`-u`, `-k`) and its state.
#[inline(always)]
fn traced<const DIRECT: bool>(cfg: &Config, prev: *const u8, tgid: u32, tid: u32) -> bool {
    if tid == 0 || !targets::admits(tgid, tid) || !targets::current_in_cgroup() {
        return false;
    }
    if cfg.threads != THREADS_ALL {
        let kthread = task_u32::<DIRECT>(prev, cfg.task_flags).unwrap_or(0) & PF_KTHREAD != 0;
        // User threads only and a kernel thread, or the other way round.
        if (cfg.threads == THREADS_USER) == kthread {
            return false;
        }
    }
    if cfg.state != STATE_ANY {
        let Some(state) = task_u32::<DIRECT>(prev, cfg.task_state) else {
            return false;
        };
        if (cfg.state == 0 && state != 0) || (cfg.state != 0 && state & cfg.state == 0) {
            return false;
        }
    }
    true
}

/// The current thread described as a key: process, command and the
/// stacks `cfg` asks for.
#[inline(always)]
fn current<C: EbpfContext>(ctx: &C, cfg: &Config, tgid: u32, key: &mut Key) {
    *key = Key::new(tgid, bpf_get_current_comm().unwrap_or([0; 16]));
    if cfg.kernel != 0 {
        match stacks::kernel_stack(ctx) {
            Some(h) => key.kernel = h,
            None => key.flags |= MISSED_KERNEL,
        }
    }
    if cfg.user != 0 {
        match stacks::user_stack(ctx, &EVENTS, tgid, core::ptr::null()) {
            Some(h) => key.user = h,
            None => key.flags |= MISSED_USER,
        }
    }
}

/// Takes the current thread's stacks and keeps them with the time.
#[inline(always)]
fn leaves<C: EbpfContext>(ctx: &C, cfg: &Config, tgid: u32, tid: u32, now: u64) {
    let zero = Key::new(0, [0; 16]);
    let mut start = Start {
        ns: now,
        key: WakeKey {
            key: zero,
            waker: zero,
        },
    };
    current(ctx, cfg, tgid, &mut start.key.key);
    if STARTS.insert(tid, start, 0).is_err() {
        count_error(ERR_STARTS_FULL);
    }
}

/// With `--waker`: the current thread wakes `wakee`; if it is a traced
/// thread off the CPU, the current thread's stacks go into its entry.
#[inline(always)]
fn wakes<C: EbpfContext, const DIRECT: bool>(ctx: &C, wakee: *const u8) {
    let cfg = global(&CONFIG);
    if cfg.waker == 0 {
        return;
    }
    let Some(tid) = task_u32::<DIRECT>(wakee, cfg.task_pid) else {
        return;
    };
    let Some(start) = STARTS.get_ptr_mut(tid) else {
        return;
    };
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    // SAFETY: a map value; a thread is woken by one thread at a time, and
    // a lost race only names the other waker.
    current(ctx, cfg, tgid, unsafe { &mut (*start).key.waker });
}

/// Adds the time `next` was off the CPU to its stacks' count.
#[inline(always)]
fn returns<C: EbpfContext, const DIRECT: bool>(ctx: &C, cfg: &Config, next: *const u8, now: u64) {
    let Some(tid) = task_u32::<DIRECT>(next, cfg.task_pid) else {
        return;
    };
    if tid == 0 {
        return;
    }
    let Some(start) = STARTS.get_ptr_mut(tid) else {
        return;
    };
    // SAFETY: a map value, counted from in place (the key is too large to
    // copy to the stack) before the entry is removed.
    unsafe {
        // A time from another CPU can be a hair ahead of ours.
        if let Some(off) = now.checked_sub((*start).ns)
            && off >= cfg.min_ns
            && off <= cfg.max_ns
        {
            (*start).key.key.generation = stacks::generation();
            stacks::add(ctx, &EVENTS, &STACK_COUNTS, &(*start).key, off);
        }
    }
    let _ = STARTS.remove(tid);
}

#[inline(always)]
fn switch<C: EbpfContext, const DIRECT: bool>(ctx: &C, prev: *const u8, next: *const u8) {
    let cfg = global(&CONFIG);
    // SAFETY: the helper has no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    let id = bpf_get_current_pid_tgid();
    let (tgid, tid) = ((id >> 32) as u32, id as u32);
    if traced::<DIRECT>(cfg, prev, tgid, tid) {
        leaves(ctx, cfg, tgid, tid, now);
    }
    returns::<C, DIRECT>(ctx, cfg, next, now);
}

#[btf_tracepoint(function = "sched_switch")]
pub fn btf_sched_switch(ctx: BtfTracePointContext) -> i32 {
    switch::<_, true>(&ctx, ctx.arg(1), ctx.arg(2));
    0
}

#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn raw_sched_switch(ctx: RawTracePointContext) -> i32 {
    switch::<_, false>(&ctx, ctx.arg(1), ctx.arg(2));
    0
}

#[btf_tracepoint(function = "sched_waking")]
pub fn btf_sched_waking(ctx: BtfTracePointContext) -> i32 {
    wakes::<_, true>(&ctx, ctx.arg(0));
    0
}

#[raw_tracepoint(tracepoint = "sched_waking")]
pub fn raw_sched_waking(ctx: RawTracePointContext) -> i32 {
    wakes::<_, false>(&ctx, ctx.arg(0));
    0
}

//! Run-queue latency: the time from a task becoming runnable (woken, or
//! preempted while still runnable) to it getting a CPU.
//!
//! Three sets of programs do the same job, one per attach mechanism; user
//! space loads only the set that the running kernel supports. The BTF and
//! raw tracepoint sets see `task_struct` pointers and read them through
//! offsets from BTF; the classic tracepoint set reads the tracepoints'
//! records through offsets from tracefs. Enqueue times are kept in a hash
//! map here; `runqlat_ts` keeps them in task storage where the kernel has
//! it.
#![no_std]
#![no_main]

#[path = "../tools/runqlat.rs"]
mod runqlat;

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{btf_tracepoint, map, raw_tracepoint, tracepoint},
    maps::HashMap,
    programs::{BtfTracePointContext, RawTracePointContext, TracePointContext},
};
use rtrace_common::{
    TASK_COMM_LEN,
    runqlat::{Config, ERR_READ, ERR_START_UPDATE, group},
};
use rtrace_ebpf::count_error;
use runqlat::{CONFIG, ERRORS, NO_PREALLOC, Starts, latency, record, switch_task, wakeup_task};

/// Enqueue timestamp by thread id. Preallocated: allocating on every
/// insert, as `BPF_F_NO_PREALLOC` does, more than doubled the cost per
/// context switch. User space sizes it to the runnable tasks the system
/// can have (`runnable_entries`).
#[map]
static START: HashMap<u32, u64> = HashMap::with_max_entries(10240, 0);
/// Thread id to process id, learned at switch-out; only the classic
/// tracepoint path needs it, since its records carry no tgid.
#[map]
static TGIDS: HashMap<u32, u32> = HashMap::with_max_entries(10240, NO_PREALLOC);

/// Enqueue times in `START`, by thread id.
struct ByPid;

impl Starts for ByPid {
    #[inline(always)]
    fn store(_task: *const u8, pid: u32, now: u64) {
        if START.insert(pid, now, 0).is_err() {
            count_error(&ERRORS, ERR_START_UPDATE);
        }
    }

    #[inline(always)]
    fn take(_task: *const u8, pid: u32) -> Option<u64> {
        // SAFETY: a START value, read before the entry is removed.
        let start = unsafe { *START.get_ptr(pid)? };
        let _ = START.remove(pid);
        Some(start)
    }
}

#[btf_tracepoint(function = "sched_wakeup")]
pub fn btf_sched_wakeup(ctx: BtfTracePointContext) -> i32 {
    wakeup_task::<ByPid, true>(ctx.arg(0));
    0
}

#[btf_tracepoint(function = "sched_wakeup_new")]
pub fn btf_sched_wakeup_new(ctx: BtfTracePointContext) -> i32 {
    wakeup_task::<ByPid, true>(ctx.arg(0));
    0
}

#[btf_tracepoint(function = "sched_switch")]
pub fn btf_sched_switch(ctx: BtfTracePointContext) -> i32 {
    switch_task::<ByPid, true>(ctx.arg(0), ctx.arg(1), ctx.arg(2));
    0
}

#[raw_tracepoint(tracepoint = "sched_wakeup")]
pub fn raw_sched_wakeup(ctx: RawTracePointContext) -> i32 {
    wakeup_task::<ByPid, false>(ctx.arg(0));
    0
}

#[raw_tracepoint(tracepoint = "sched_wakeup_new")]
pub fn raw_sched_wakeup_new(ctx: RawTracePointContext) -> i32 {
    wakeup_task::<ByPid, false>(ctx.arg(0));
    0
}

#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn raw_sched_switch(ctx: RawTracePointContext) -> i32 {
    switch_task::<ByPid, false>(ctx.arg(0), ctx.arg(1), ctx.arg(2));
    0
}

// ---- classic tracepoint path: records instead of task pointers ----

/// Whether the tgid filter or `-P` needs to know processes on this path.
#[inline(always)]
fn needs_tgid(cfg: &Config) -> bool {
    cfg.target_tgid != 0 || cfg.group == group::PROCESS
}

#[inline(always)]
fn tp_enqueue(ctx: &TracePointContext) {
    let cfg = CONFIG.load();
    let Ok(pid) = (unsafe { ctx.read_at::<u32>(cfg.tp.wakeup_pid as usize) }) else {
        count_error(&ERRORS, ERR_READ);
        return;
    };
    if pid == 0 {
        return;
    }
    if cfg.target_tgid != 0 {
        // A task that has never been switched out while traced has no known
        // process yet; it cannot belong to the target's already-running
        // threads, which all sleep through sched_switch.
        match TGIDS.get_ptr(pid) {
            Some(t) if unsafe { *t } == cfg.target_tgid => {}
            _ => return,
        }
    }
    ByPid::store(core::ptr::null(), pid, unsafe { bpf_ktime_get_ns() });
}

#[tracepoint(category = "sched", name = "sched_wakeup")]
pub fn tp_sched_wakeup(ctx: TracePointContext) -> u32 {
    tp_enqueue(&ctx);
    0
}

#[tracepoint(category = "sched", name = "sched_wakeup_new")]
pub fn tp_sched_wakeup_new(ctx: TracePointContext) -> u32 {
    tp_enqueue(&ctx);
    0
}

#[tracepoint(category = "sched", name = "sched_switch")]
pub fn tp_sched_switch(ctx: TracePointContext) -> u32 {
    let cfg = CONFIG.load();
    let now = unsafe { bpf_ktime_get_ns() };
    // The tracepoint runs on the outgoing task, so it is `current`.
    let id = bpf_get_current_pid_tgid();
    let (prev_tgid, prev_pid) = ((id >> 32) as u32, id as u32);
    if prev_pid != 0 && needs_tgid(&cfg) {
        let known = TGIDS.get_ptr(prev_pid).map(|t| unsafe { *t });
        if known != Some(prev_tgid) && TGIDS.insert(prev_pid, prev_tgid, 0).is_err() {
            count_error(&ERRORS, ERR_START_UPDATE);
        }
    }
    // The record's prev_state is 0 for a runnable task and TASK_REPORT_MAX
    // (0x100) for a preempted one; sleeping states set a bit in 0..=0x80.
    let prev_state = unsafe { ctx.read_at::<u64>(cfg.tp.prev_state as usize) }.unwrap_or(1);
    if prev_pid != 0
        && prev_state & 0xff == 0
        && (cfg.target_tgid == 0 || cfg.target_tgid == prev_tgid)
    {
        ByPid::store(core::ptr::null(), prev_pid, now);
    }
    let Ok(pid) = (unsafe { ctx.read_at::<u32>(cfg.tp.next_pid as usize) }) else {
        count_error(&ERRORS, ERR_READ);
        return 0;
    };
    if pid == 0 {
        return 0;
    }
    let Some(lat) = ByPid::take(core::ptr::null(), pid).and_then(|start| latency(&cfg, start, now))
    else {
        return 0;
    };
    let key = match cfg.group {
        group::PROCESS => TGIDS.get_ptr(pid).map_or(pid, |t| unsafe { *t }),
        group::THREAD => pid,
        _ => 0,
    };
    record(&cfg, key, lat, || {
        unsafe { ctx.read_at::<[u8; TASK_COMM_LEN]>(cfg.tp.next_comm as usize) }
            .unwrap_or([0; TASK_COMM_LEN])
    });
    0
}

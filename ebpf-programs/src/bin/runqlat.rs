//! Run-queue latency: the time from a task becoming runnable (woken, or
//! preempted while still runnable) to it getting a CPU.
//!
//! Three sets of programs do the same job, one per attach mechanism; user
//! space loads only the set that the running kernel supports. The BTF and
//! raw tracepoint sets see `task_struct` pointers and read them through
//! offsets from BTF; the classic tracepoint set reads the tracepoints'
//! records through offsets from tracefs. Enqueue times are kept in a hash
//! map by thread id.
//!
//! Built with the `task_storage` feature, the object also has a fourth
//! set, on tp_btf, that keeps enqueue times in task local storage: no
//! hashing, locking or allocation per context switch, which makes it the
//! cheapest way to trace the scheduler. It is a separate object because
//! the kernel creates a task storage map only where it supports one (5.11+).
#![no_std]
#![no_main]

use aya_ebpf::{
    Global,
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{btf_tracepoint, map, raw_tracepoint},
    maps::{HashMap, PerCpuArray},
    programs::{BtfTracePointContext, RawTracePointContext, TracePointContext},
};
use rtrace_common::{
    TASK_COMM_LEN,
    runqlat::{Config, ERR_HIST_UPDATE, ERR_READ, ERR_START_UPDATE, Entry, group},
};
use rtrace_ebpf::{
    count_error, get_or_insert, hist_record_local, hist_record_shared, read_kernel, targets,
};

/// `BPF_F_NO_PREALLOC`, for maps that are updated rarely: user space sizes
/// them to `pid_max`, and preallocating that many entries would cost
/// hundreds of megabytes.
const NO_PREALLOC: u32 = 1;
/// How far up the cgroup tree `-c` looks for the target.
const MAX_CGROUP_DEPTH: usize = 16;

/// Set by user space before load.
#[unsafe(no_mangle)]
static CONFIG: Global<Config> = Global::new(unsafe { core::mem::zeroed() });

/// Histograms by group key, for `-P`, `-L` and `--pidnss`.
#[map]
static HISTS: HashMap<u32, Entry> = HashMap::with_max_entries(10240, NO_PREALLOC);
/// The single histogram when nothing is grouped: per CPU, so no atomics.
#[map]
static TOTAL: PerCpuArray<Entry> = PerCpuArray::with_max_entries(1, 0);
/// An all-zero entry to create `HISTS` entries from; an `Entry` is far larger
/// than the 512-byte eBPF stack.
#[map]
static ZERO: PerCpuArray<Entry> = PerCpuArray::with_max_entries(1, 0);

/// Where enqueue timestamps are kept.
trait Starts {
    /// Records that `task` (thread `pid`) became runnable at `now`.
    fn store(task: *const u8, pid: u32, now: u64);
    /// Takes and clears the time `task` (thread `pid`) became runnable.
    fn take(task: *const u8, pid: u32) -> Option<u64>;
}

/// Reads a u32 member of a task; a failed read is counted and reads as 0.
#[inline(always)]
fn task_u32<const DIRECT: bool>(task: *const u8, offset: u32) -> u32 {
    rtrace_ebpf::task_u32::<DIRECT>(task, offset).unwrap_or_else(|| {
        count_error(ERR_READ);
        0
    })
}

#[inline(always)]
fn task_ptr(base: *const u8, offset: u32) -> *const u8 {
    read_kernel::<*const u8>(base, offset).unwrap_or(core::ptr::null())
}

/// Whether `task` sits in the target cgroup or below it.
#[inline(always)]
fn in_cgroup(cfg: &Config, task: *const u8, cgroup_id: u64) -> bool {
    let o = &cfg.task;
    let cgrp = task_ptr(task_ptr(task, o.cgroups), o.dfl_cgrp);
    let mut kn = task_ptr(cgrp, o.cgroup_kn);
    for _ in 0..MAX_CGROUP_DEPTH {
        if kn.is_null() {
            return false;
        }
        if read_kernel::<u64>(kn, o.kn_id) == Ok(cgroup_id) {
            return true;
        }
        kn = task_ptr(kn, o.kn_parent);
    }
    false
}

/// The latency from `start` to `now` in the configured unit.
#[inline(always)]
fn latency(cfg: &Config, start: u64, now: u64) -> Option<u64> {
    // A timestamp from another CPU can be a hair ahead of ours; a negative
    // delta would otherwise become a huge bogus sample.
    let delta = now.checked_sub(start)?;
    Some(if cfg.unit_ns > 1 {
        delta / cfg.unit_ns
    } else {
        delta
    })
}

/// Counts one sample under `key`; `comm` fills a new entry's command.
#[inline(always)]
fn record(cfg: &Config, key: u32, value: u64, comm: impl FnOnce() -> [u8; TASK_COMM_LEN]) {
    // The wait ends on this CPU: `-C` counts the waits its CPUs end.
    if !targets::on_cpu() {
        return;
    }
    if cfg.group == group::NONE {
        if let Some(e) = TOTAL.get_ptr_mut(0) {
            // SAFETY: `e` is TOTAL's per-CPU value.
            unsafe { hist_record_local(&raw mut (*e).hist, value) };
        }
        return;
    }
    let Some((entry, created)) = get_or_insert(&HISTS, &key, &ZERO) else {
        count_error(ERR_HIST_UPDATE);
        return;
    };
    if created {
        // SAFETY: `entry` is a HISTS value.
        unsafe { (*entry).comm = comm() };
    }
    // SAFETY: `entry` is a HISTS value.
    unsafe { hist_record_shared(&raw mut (*entry).hist, value) };
}

#[inline(always)]
fn enqueue_task<S: Starts, const DIRECT: bool>(cfg: &Config, task: *const u8, now: u64) {
    let pid = task_u32::<DIRECT>(task, cfg.task.pid);
    if pid == 0 {
        return;
    }
    if targets::by_ids() && !targets::admits(task_u32::<DIRECT>(task, cfg.task.tgid), pid) {
        return;
    }
    // The task is not the current one, so its cgroup is walked by id.
    let cgroup_id = targets::config().cgroup_id;
    if cgroup_id != 0 && !in_cgroup(cfg, task, cgroup_id) {
        return;
    }
    S::store(task, pid, now);
}

/// sched_wakeup and sched_wakeup_new: `task` became runnable.
#[inline(always)]
fn wakeup_task<S: Starts, const DIRECT: bool>(task: *const u8) {
    enqueue_task::<S, DIRECT>(&CONFIG.load(), task, unsafe { bpf_ktime_get_ns() });
}

/// sched_switch: `prev` leaves the CPU, possibly still runnable, and `next`
/// gets it.
#[inline(always)]
fn switch_task<S: Starts, const DIRECT: bool>(preempt: u64, prev: *const u8, next: *const u8) {
    let cfg = CONFIG.load();
    let now = unsafe { bpf_ktime_get_ns() };
    // Preempted tasks stay on the run queue whatever their state says.
    if preempt & 0xff != 0 || task_u32::<DIRECT>(prev, cfg.task.state) == 0 {
        enqueue_task::<S, DIRECT>(&cfg, prev, now);
    }
    let pid = task_u32::<DIRECT>(next, cfg.task.pid);
    if pid == 0 {
        return;
    }
    let Some(lat) = S::take(next, pid).and_then(|start| latency(&cfg, start, now)) else {
        return;
    };
    let key = match cfg.group {
        group::PROCESS => task_u32::<DIRECT>(next, cfg.task.tgid),
        group::THREAD => pid,
        group::PIDNS => {
            let ns = task_ptr(
                task_ptr(next, cfg.task.nsproxy),
                cfg.task.pid_ns_for_children,
            );
            task_u32::<false>(ns, cfg.task.pidns_inum)
        }
        _ => 0,
    };
    record(&cfg, key, lat, || {
        read_kernel::<[u8; TASK_COMM_LEN]>(next, cfg.task.comm).unwrap_or([0; TASK_COMM_LEN])
    });
}

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
            count_error(ERR_START_UPDATE);
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
    targets::by_ids() || cfg.group == group::PROCESS
}

#[inline(always)]
fn tp_enqueue(ctx: &TracePointContext) {
    let cfg = CONFIG.load();
    let Ok(pid) = (unsafe { ctx.read_at::<u32>(cfg.tp.wakeup_pid as usize) }) else {
        count_error(ERR_READ);
        return;
    };
    if pid == 0 {
        return;
    }
    if targets::by_ids() {
        // A task that has never been switched out while traced has no known
        // process yet; it cannot belong to the target's already-running
        // threads, which all sleep through sched_switch.
        match TGIDS.get_ptr(pid) {
            Some(t) if targets::admits(unsafe { *t }, pid) => {}
            _ => return,
        }
    }
    ByPid::store(core::ptr::null(), pid, unsafe { bpf_ktime_get_ns() });
}

rtrace_ebpf::tracepoint! {
    fn tp_sched_wakeup(ctx) {
        tp_enqueue(&ctx);
    }
}

rtrace_ebpf::tracepoint! {
    fn tp_sched_wakeup_new(ctx) {
        tp_enqueue(&ctx);
    }
}

rtrace_ebpf::tracepoint! {
    fn tp_sched_switch(ctx) {
        let cfg = CONFIG.load();
        let now = unsafe { bpf_ktime_get_ns() };
        // The tracepoint runs on the outgoing task, so it is `current`.
        let id = bpf_get_current_pid_tgid();
        let (prev_tgid, prev_pid) = ((id >> 32) as u32, id as u32);
        if prev_pid != 0 && needs_tgid(&cfg) {
            let known = TGIDS.get_ptr(prev_pid).map(|t| unsafe { *t });
            if known != Some(prev_tgid) && TGIDS.insert(prev_pid, prev_tgid, 0).is_err() {
                count_error(ERR_START_UPDATE);
            }
        }
        // The record's prev_state is 0 for a runnable task and TASK_REPORT_MAX
        // (0x100) for a preempted one; sleeping states set a bit in 0..=0x80.
        let prev_state = unsafe { ctx.read_at::<u64>(cfg.tp.prev_state as usize) }.unwrap_or(1);
        if prev_pid != 0 && prev_state & 0xff == 0 && targets::admits(prev_tgid, prev_pid) {
            ByPid::store(core::ptr::null(), prev_pid, now);
        }
        let Ok(pid) = (unsafe { ctx.read_at::<u32>(cfg.tp.next_pid as usize) }) else {
            count_error(ERR_READ);
            return;
        };
        if pid == 0 {
            return;
        }
        let Some(lat) = ByPid::take(core::ptr::null(), pid).and_then(|start| latency(&cfg, start, now))
        else {
            return;
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
    }
}

// ---- task storage: built only with the `task_storage` feature ----

/// Enqueue time of each task, 0 while it is not waiting.
#[cfg(feature = "task_storage")]
#[unsafe(link_section = ".maps")]
#[unsafe(no_mangle)]
static TASK_START: rtrace_ebpf::task_storage::TaskStorage<u64> =
    rtrace_ebpf::task_storage::TaskStorage::new();

#[cfg(feature = "task_storage")]
struct InTask;

#[cfg(feature = "task_storage")]
impl Starts for InTask {
    #[inline(always)]
    fn store(task: *const u8, _pid: u32, now: u64) {
        let p = TASK_START.get(task, true);
        if p.is_null() {
            // Out of memory, or (before 6.19) the storage's per-CPU busy
            // guard refusing a nested call: counted, never silent.
            count_error(ERR_START_UPDATE);
            return;
        }
        // SAFETY: `p` is this task's storage.
        unsafe { *p = now };
    }

    #[inline(always)]
    fn take(task: *const u8, _pid: u32) -> Option<u64> {
        let p = TASK_START.get(task, false);
        if p.is_null() {
            return None;
        }
        // SAFETY: `p` is this task's storage; clearing it instead of deleting
        // keeps the storage for the task's next wait.
        let start = unsafe { core::mem::replace(&mut *p, 0) };
        (start != 0).then_some(start)
    }
}

#[cfg(feature = "task_storage")]
#[btf_tracepoint(function = "sched_wakeup")]
pub fn ts_sched_wakeup(ctx: BtfTracePointContext) -> i32 {
    wakeup_task::<InTask, true>(ctx.arg(0));
    0
}

#[cfg(feature = "task_storage")]
#[btf_tracepoint(function = "sched_wakeup_new")]
pub fn ts_sched_wakeup_new(ctx: BtfTracePointContext) -> i32 {
    wakeup_task::<InTask, true>(ctx.arg(0));
    0
}

#[cfg(feature = "task_storage")]
#[btf_tracepoint(function = "sched_switch")]
pub fn ts_sched_switch(ctx: BtfTracePointContext) -> i32 {
    switch_task::<InTask, true>(ctx.arg(0), ctx.arg(1), ctx.arg(2));
    0
}

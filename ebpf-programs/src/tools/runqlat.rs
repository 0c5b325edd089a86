//! What the runqlat objects share: configuration, the histogram maps, and
//! the task_struct logic of the tp_btf and raw tracepoint programs, generic
//! over where enqueue timestamps are kept.
//!
//! There are two objects because the kernel only creates a task storage map
//! where it supports one: `runqlat_ts` keeps timestamps in task storage (the
//! cheapest way, tp_btf only), `runqlat` in a hash map, for every attach
//! mechanism. Both include this file as a module rather than taking it from
//! the library, so that its maps exist only in the objects that use them.

use aya_ebpf::{
    Global,
    helpers::bpf_ktime_get_ns,
    macros::map,
    maps::{HashMap, PerCpuArray},
};
use rtrace_common::{
    TASK_COMM_LEN,
    runqlat::{Config, ERR_COUNT, ERR_HIST_UPDATE, ERR_READ, Entry, group},
};

use rtrace_ebpf::{count_error, get_or_insert, hist_record_local, hist_record_shared, read_kernel};

/// `BPF_F_NO_PREALLOC`, for maps that are updated rarely: user space sizes
/// them to `pid_max`, and preallocating that many entries would cost
/// hundreds of megabytes.
pub const NO_PREALLOC: u32 = 1;
/// How far up the cgroup tree `-c` looks for the target.
const MAX_CGROUP_DEPTH: usize = 16;

/// Set by user space before load.
#[unsafe(no_mangle)]
pub static CONFIG: Global<Config> = Global::new(unsafe { core::mem::zeroed() });

/// Histograms by group key, for `-P`, `-L` and `--pidnss`.
#[map]
pub static HISTS: HashMap<u32, Entry> = HashMap::with_max_entries(10240, NO_PREALLOC);
/// The single histogram when nothing is grouped: per CPU, so no atomics.
#[map]
pub static TOTAL: PerCpuArray<Entry> = PerCpuArray::with_max_entries(1, 0);
/// An all-zero entry to create `HISTS` entries from; an `Entry` is far larger
/// than the 512-byte eBPF stack.
#[map]
pub static ZERO: PerCpuArray<Entry> = PerCpuArray::with_max_entries(1, 0);
/// Failures that would otherwise lose samples silently.
#[map]
pub static ERRORS: PerCpuArray<u64> = PerCpuArray::with_max_entries(ERR_COUNT, 0);

/// Where enqueue timestamps are kept.
pub trait Starts {
    /// Records that `task` (thread `pid`) became runnable at `now`.
    fn store(task: *const u8, pid: u32, now: u64);
    /// Takes and clears the time `task` (thread `pid`) became runnable.
    fn take(task: *const u8, pid: u32) -> Option<u64>;
}

/// Reads a u32 member of a task. `DIRECT` is for BTF-typed pointers
/// (tp_btf), where the verifier turns a plain load into a cheap checked one;
/// raw tracepoints pass untyped pointers and need the helper.
#[inline(always)]
pub fn task_u32<const DIRECT: bool>(task: *const u8, offset: u32) -> u32 {
    if DIRECT {
        // SAFETY: `task` is a BTF-typed task_struct pointer and `offset` a
        // member's offset from BTF; the verifier checks the access.
        return unsafe {
            core::ptr::read_volatile(task.wrapping_add(offset as usize) as *const u32)
        };
    }
    match read_kernel::<u32>(task, offset) {
        Ok(v) => v,
        Err(_) => {
            count_error(&ERRORS, ERR_READ);
            0
        }
    }
}

#[inline(always)]
fn task_ptr(base: *const u8, offset: u32) -> *const u8 {
    read_kernel::<*const u8>(base, offset).unwrap_or(core::ptr::null())
}

/// Whether `task` sits in the target cgroup or below it.
#[inline(always)]
fn in_cgroup(cfg: &Config, task: *const u8) -> bool {
    let o = &cfg.task;
    let cgrp = task_ptr(task_ptr(task, o.cgroups), o.dfl_cgrp);
    let mut kn = task_ptr(cgrp, o.cgroup_kn);
    for _ in 0..MAX_CGROUP_DEPTH {
        if kn.is_null() {
            return false;
        }
        if read_kernel::<u64>(kn, o.kn_id) == Ok(cfg.cgroup_id) {
            return true;
        }
        kn = task_ptr(kn, o.kn_parent);
    }
    false
}

/// The latency from `start` to `now` in the configured unit.
#[inline(always)]
pub fn latency(cfg: &Config, start: u64, now: u64) -> Option<u64> {
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
pub fn record(cfg: &Config, key: u32, value: u64, comm: impl FnOnce() -> [u8; TASK_COMM_LEN]) {
    if cfg.group == group::NONE {
        if let Some(e) = TOTAL.get_ptr_mut(0) {
            // SAFETY: `e` is TOTAL's per-CPU value.
            unsafe { hist_record_local(&raw mut (*e).hist, value) };
        }
        return;
    }
    let Some((entry, created)) = get_or_insert(&HISTS, &key, &ZERO) else {
        count_error(&ERRORS, ERR_HIST_UPDATE);
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
    if cfg.target_tgid != 0 && task_u32::<DIRECT>(task, cfg.task.tgid) != cfg.target_tgid {
        return;
    }
    if cfg.cgroup_id != 0 && !in_cgroup(cfg, task) {
        return;
    }
    S::store(task, pid, now);
}

/// sched_wakeup and sched_wakeup_new: `task` became runnable.
#[inline(always)]
pub fn wakeup_task<S: Starts, const DIRECT: bool>(task: *const u8) {
    enqueue_task::<S, DIRECT>(&CONFIG.load(), task, unsafe { bpf_ktime_get_ns() });
}

/// sched_switch: `prev` leaves the CPU, possibly still runnable, and `next`
/// gets it.
#[inline(always)]
pub fn switch_task<S: Starts, const DIRECT: bool>(preempt: u64, prev: *const u8, next: *const u8) {
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

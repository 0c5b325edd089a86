//! `rtrace stat`: counts of tracepoints, exact, in the kernel's per-CPU
//! arrays.
//!
//! One program serves every tracepoint asked for: each link carries the
//! tracepoint's id as its cookie, which indexes the counts, so a set such
//! as `block:*` costs one array increment an event, and one attach a
//! tracepoint rather than one a tracepoint and CPU as perf's counters.
//! The syscall tracepoints (`syscalls:sys_enter_*`, hundreds of them) are
//! counted from the two `raw_syscalls` ones instead, by syscall number:
//! two attaches for all of them. Probe specs (`p:`, `r:`, `u:`) each
//! have a slot of programs. With `--per-thread` or `--per-process`, the
//! same events are counted by task instead, in a hash.
#![no_std]
#![no_main]

use aya_ebpf::{
    EbpfContext, Global,
    bindings::BPF_NOEXIST,
    helpers::{bpf_get_attach_cookie, bpf_get_current_comm, bpf_get_current_pid_tgid},
    macros::{kprobe, kretprobe, map, raw_tracepoint, uprobe, uretprobe},
    maps::{HashMap, PerCpuArray},
    programs::{ProbeContext, RawTracePointContext, RetProbeContext},
};
use rtrace_common::stat::{
    BY_PROCESS, ERR_SYSCALL_NR, ERR_TASKS_FULL, ERR_TRACEPOINT_ID, KIND_PROBE, KIND_SYSCALL,
    KIND_TRACEPOINT, MAX_PROBES, MAX_SYSCALLS, MAX_TASK_COUNTS, SLOT_KIND_SHIFT, TaskCount,
    TaskKey,
};
use rtrace_ebpf::{atomic_add, count_error, global, read_kernel, targets};

/// 0: counts in the per-CPU arrays; `BY_THREAD` or `BY_PROCESS`: in
/// `TASK_COUNTS` by that id. Set by user space before load.
#[unsafe(no_mangle)]
static BY_TASK: Global<u32> = Global::new(0);

/// Counts by task and event, with `BY_TASK`.
#[map]
static TASK_COUNTS: HashMap<TaskKey, TaskCount> = HashMap::with_max_entries(MAX_TASK_COUNTS, 0);

/// Counts by probe slot.
#[map]
static PROBES: PerCpuArray<u64> = PerCpuArray::with_max_entries(MAX_PROBES, 0);

/// Counts by tracepoint id; user space sizes it past the largest id.
#[map]
static TRACEPOINTS: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Counts by syscall number: entries, then exits from [`MAX_SYSCALLS`].
#[map]
static SYSCALLS: PerCpuArray<u64> = PerCpuArray::with_max_entries(2 * MAX_SYSCALLS, 0);

/// `pt_regs.orig_ax` on x86-64 (the UAPI layout): the syscall number at
/// exit, where the raw tracepoint gives only the registers.
const ORIG_AX: u32 = 15 * 8;

#[inline(always)]
fn add(map: &PerCpuArray<u64>, i: u32) -> bool {
    match map.get_ptr_mut(i) {
        // SAFETY: this CPU's slot; a program does not nest in itself on
        // one CPU.
        Some(n) => {
            unsafe { *n += 1 };
            true
        }
        None => false,
    }
}

/// Counts event `slot` of `kind` for the current task, with `BY_TASK`;
/// false without.
#[inline(always)]
fn add_by_task(kind: u32, slot: u32) -> bool {
    let by = *global(&BY_TASK);
    if by == 0 {
        return false;
    }
    let id = bpf_get_current_pid_tgid();
    let key = TaskKey {
        id: if by == BY_PROCESS {
            (id >> 32) as u32
        } else {
            id as u32
        },
        slot: kind << SLOT_KIND_SHIFT | slot,
    };
    if bump(&key) {
        return true;
    }
    let first = TaskCount {
        count: 1,
        comm: bpf_get_current_comm().unwrap_or([0; 16]),
    };
    // Another CPU may have made it meanwhile: then add to theirs.
    if TASK_COUNTS
        .insert(key, first, u64::from(BPF_NOEXIST))
        .is_err()
        && !bump(&key)
    {
        count_error(ERR_TASKS_FULL);
    }
    true
}

/// Adds one to `key`'s count, if it has one.
#[inline(always)]
fn bump(key: &TaskKey) -> bool {
    match TASK_COUNTS.get_ptr_mut(key) {
        Some(v) => {
            // SAFETY: a map value; other CPUs add to it too, atomically.
            unsafe { atomic_add(&raw mut (*v).count, 1) };
            true
        }
        None => false,
    }
}

rtrace_ebpf::tracepoint! {
    fn stat_tracepoint(ctx) {
        if !targets::admits_current() {
            return;
        }
        // The tracepoint's id, which user space gave each link: the record's
        // own `common_type` is overwritten with a pointer to the registers
        // before a program sees it.
        // SAFETY: the helper takes any program's context.
        let id = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) } as u32;
        if !add_by_task(KIND_TRACEPOINT, id) && !add(&TRACEPOINTS, id) {
            count_error(ERR_TRACEPOINT_ID);
        }
    }
}

#[inline(always)]
fn syscall(nr: u64, base: u32) {
    if !targets::admits_current() {
        return;
    }
    if nr >= u64::from(MAX_SYSCALLS) {
        count_error(ERR_SYSCALL_NR);
        return;
    }
    let slot = base + nr as u32;
    if !add_by_task(KIND_SYSCALL, slot) && !add(&SYSCALLS, slot) {
        count_error(ERR_SYSCALL_NR);
    }
}

#[inline(always)]
fn probe(slot: u32) {
    if targets::admits_current() && !add_by_task(KIND_PROBE, slot) {
        add(&PROBES, slot);
    }
}

/// The four programs of probe slot `$i`: user space attaches the one its
/// spec needs, at every function it names.
macro_rules! slot {
    ($i:literal, $kp:ident, $kr:ident, $up:ident, $ur:ident) => {
        #[kprobe]
        pub fn $kp(_ctx: ProbeContext) -> u32 {
            probe($i);
            0
        }
        #[kretprobe]
        pub fn $kr(_ctx: RetProbeContext) -> u32 {
            probe($i);
            0
        }
        #[uprobe]
        pub fn $up(_ctx: ProbeContext) -> u32 {
            probe($i);
            0
        }
        #[uretprobe]
        pub fn $ur(_ctx: RetProbeContext) -> u32 {
            probe($i);
            0
        }
    };
}

slot!(
    0,
    stat_kprobe_0,
    stat_kretprobe_0,
    stat_uprobe_0,
    stat_uretprobe_0
);
slot!(
    1,
    stat_kprobe_1,
    stat_kretprobe_1,
    stat_uprobe_1,
    stat_uretprobe_1
);
slot!(
    2,
    stat_kprobe_2,
    stat_kretprobe_2,
    stat_uprobe_2,
    stat_uretprobe_2
);
slot!(
    3,
    stat_kprobe_3,
    stat_kretprobe_3,
    stat_uprobe_3,
    stat_uretprobe_3
);
slot!(
    4,
    stat_kprobe_4,
    stat_kretprobe_4,
    stat_uprobe_4,
    stat_uretprobe_4
);
slot!(
    5,
    stat_kprobe_5,
    stat_kretprobe_5,
    stat_uprobe_5,
    stat_uretprobe_5
);
slot!(
    6,
    stat_kprobe_6,
    stat_kretprobe_6,
    stat_uprobe_6,
    stat_uretprobe_6
);
slot!(
    7,
    stat_kprobe_7,
    stat_kretprobe_7,
    stat_uprobe_7,
    stat_uretprobe_7
);

/// `sys_enter(regs, id)`.
#[raw_tracepoint(tracepoint = "sys_enter")]
pub fn stat_sys_enter(ctx: RawTracePointContext) -> i32 {
    syscall(ctx.arg::<u64>(1), 0);
    0
}

/// `sys_exit(regs, ret)`.
#[raw_tracepoint(tracepoint = "sys_exit")]
pub fn stat_sys_exit(ctx: RawTracePointContext) -> i32 {
    let regs: *const u8 = ctx.arg(0);
    // A negative number (-1: no syscall, as after a seccomp kill) is none.
    if let Ok(nr) = read_kernel::<i64>(regs, ORIG_AX)
        && nr >= 0
    {
        syscall(nr as u64, MAX_SYSCALLS);
    }
    0
}

//! `rtrace stat`: counts of tracepoints, exact, in the kernel's per-CPU
//! arrays.
//!
//! One program serves every tracepoint asked for: a tracepoint's record
//! begins with its id (`common_type`), which indexes the counts, so a set
//! such as `block:*` costs one array increment an event, and one attach
//! a tracepoint rather than one a tracepoint and CPU as perf's counters.
//! The syscall tracepoints (`syscalls:sys_enter_*`, hundreds of them) are
//! counted from the two `raw_syscalls` ones instead, by syscall number:
//! two attaches for all of them.
#![no_std]
#![no_main]

use aya_ebpf::{
    macros::{map, raw_tracepoint, tracepoint},
    maps::PerCpuArray,
    programs::{RawTracePointContext, TracePointContext},
};
use rtrace_common::stat::{ERR_SYSCALL_NR, ERR_TRACEPOINT_ID, MAX_SYSCALLS};
use rtrace_ebpf::{count_error, read_kernel, targets};

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

#[tracepoint]
pub fn stat_tracepoint(ctx: TracePointContext) -> u32 {
    if !targets::admits_current() {
        return 0;
    }
    // SAFETY: every tracepoint record begins with its u16 common_type.
    let id = unsafe { ctx.read_at::<u16>(0) }.unwrap_or(0);
    if !add(&TRACEPOINTS, u32::from(id)) {
        count_error(ERR_TRACEPOINT_ID);
    }
    0
}

#[inline(always)]
fn syscall(nr: u64, base: u32) {
    if !targets::admits_current() {
        return;
    }
    if nr >= u64::from(MAX_SYSCALLS) || !add(&SYSCALLS, base + nr as u32) {
        count_error(ERR_SYSCALL_NR);
    }
}

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

//! Empty programs, one per attach mechanism: `rtrace doctor` and the tools'
//! attach chains load and attach these to learn what the running kernel
//! really supports, rather than guessing from its version.
#![no_std]
#![no_main]

use aya_ebpf::{
    macros::{
        btf_tracepoint, fentry, fexit, kprobe, kretprobe, perf_event, raw_tracepoint, tracepoint,
        uprobe,
    },
    programs::{
        BtfTracePointContext, FEntryContext, FExitContext, PerfEventContext, ProbeContext,
        RawTracePointContext, RetProbeContext, TracePointContext,
    },
};
#[allow(unused_imports)]
use rtrace_ebpf as _;

#[tracepoint(category = "sched", name = "sched_switch")]
pub fn probe_tracepoint(_ctx: TracePointContext) -> u32 {
    0
}

#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn probe_raw_tracepoint(_ctx: RawTracePointContext) -> i32 {
    0
}

#[btf_tracepoint(function = "sched_switch")]
pub fn probe_tp_btf(_ctx: BtfTracePointContext) -> i32 {
    0
}

#[fentry(function = "vfs_read")]
pub fn probe_fentry(_ctx: FEntryContext) -> u32 {
    0
}

#[fexit(function = "vfs_read")]
pub fn probe_fexit(_ctx: FExitContext) -> u32 {
    0
}

#[kprobe]
pub fn probe_kprobe(_ctx: ProbeContext) -> u32 {
    0
}

#[kretprobe]
pub fn probe_kretprobe(_ctx: RetProbeContext) -> u32 {
    0
}

#[uprobe]
pub fn probe_uprobe(_ctx: ProbeContext) -> u32 {
    0
}

#[perf_event]
pub fn probe_perf_event(_ctx: PerfEventContext) -> u32 {
    0
}

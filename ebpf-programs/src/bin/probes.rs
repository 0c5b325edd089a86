//! Tiny programs, one per attach mechanism: `rtrace doctor` and the tools'
//! attach chains load and attach these to learn what the running kernel
//! really supports, rather than guessing from its version. Each counts its
//! runs, so that user space can see it really fire.
#![no_std]
#![no_main]

use aya_ebpf::maps::Array;
use aya_ebpf::{
    macros::{
        btf_tracepoint, fentry, fexit, kprobe, kretprobe, map, perf_event, raw_tracepoint, uprobe,
    },
    programs::{
        BtfTracePointContext, FEntryContext, FExitContext, PerfEventContext, ProbeContext,
        RawTracePointContext, RetProbeContext,
    },
};
use rtrace_common::probes;
#[allow(unused_imports)]
use rtrace_ebpf as _;

/// Runs per program, by `rtrace_common::probes` slot.
#[map]
static HITS: Array<u64> = Array::with_max_entries(probes::SLOTS, 0);

#[inline(always)]
fn hit(slot: u32) {
    if let Some(p) = HITS.get_ptr_mut(slot) {
        // SAFETY: an array value; a lost increment between CPUs does not
        // matter, only whether the count is nonzero.
        unsafe { *p += 1 };
    }
}

rtrace_ebpf::tracepoint! {
    fn probe_tracepoint(_ctx) {
        hit(probes::TRACEPOINT);
    }
}

#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn probe_raw_tracepoint(_ctx: RawTracePointContext) -> i32 {
    hit(probes::RAW_TRACEPOINT);
    0
}

#[btf_tracepoint(function = "sched_switch")]
pub fn probe_tp_btf(_ctx: BtfTracePointContext) -> i32 {
    hit(probes::TP_BTF);
    0
}

#[fentry(function = "vfs_read")]
pub fn probe_fentry(_ctx: FEntryContext) -> u32 {
    hit(probes::FENTRY);
    0
}

#[fexit(function = "vfs_read")]
pub fn probe_fexit(_ctx: FExitContext) -> u32 {
    hit(probes::FEXIT);
    0
}

#[kprobe]
pub fn probe_kprobe(_ctx: ProbeContext) -> u32 {
    hit(probes::KPROBE);
    0
}

#[kretprobe]
pub fn probe_kretprobe(_ctx: RetProbeContext) -> u32 {
    hit(probes::KRETPROBE);
    0
}

#[uprobe]
pub fn probe_uprobe(_ctx: ProbeContext) -> u32 {
    hit(probes::UPROBE);
    0
}

#[perf_event]
pub fn probe_perf_event(_ctx: PerfEventContext) -> u32 {
    hit(probes::PERF_EVENT);
    0
}

//! Slots of the probe object's `HITS` array: each probe program counts its
//! runs in its own slot, so that a probe proves the mechanism delivers
//! events, not merely that the kernel accepted an attach.

/// Classic tracepoint.
pub const TRACEPOINT: u32 = 0;
/// Raw tracepoint.
pub const RAW_TRACEPOINT: u32 = 1;
/// BTF tracepoint.
pub const TP_BTF: u32 = 2;
/// fentry.
pub const FENTRY: u32 = 3;
/// fexit.
pub const FEXIT: u32 = 4;
/// kprobe.
pub const KPROBE: u32 = 5;
/// kretprobe.
pub const KRETPROBE: u32 = 6;
/// uprobe.
pub const UPROBE: u32 = 7;
/// perf event, software or hardware.
pub const PERF_EVENT: u32 = 8;
/// Number of slots.
pub const SLOTS: u32 = 9;

/// The array of each probe program's runs, by the slots above.
pub const HITS: &str = "HITS";
/// The classic tracepoint probe (on `sched:sched_switch`).
pub const PROG_TRACEPOINT: &str = "probe_tracepoint";
/// The raw tracepoint probe (on `sched_switch`).
pub const PROG_RAW_TRACEPOINT: &str = "probe_raw_tracepoint";
/// The BTF tracepoint probe (on `sched_switch`).
pub const PROG_TP_BTF: &str = "probe_tp_btf";
/// The fentry probe (on `vfs_read`).
pub const PROG_FENTRY: &str = "probe_fentry";
/// The fexit probe (on `vfs_read`).
pub const PROG_FEXIT: &str = "probe_fexit";
/// The kprobe probe (on `vfs_read`).
pub const PROG_KPROBE: &str = "probe_kprobe";
/// The kretprobe probe (on `vfs_read`).
pub const PROG_KRETPROBE: &str = "probe_kretprobe";
/// The uprobe probe (on a function of rtrace's own).
pub const PROG_UPROBE: &str = "probe_uprobe";
/// The perf event probe, software and hardware.
pub const PROG_PERF_EVENT: &str = "probe_perf_event";

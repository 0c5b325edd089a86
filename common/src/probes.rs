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

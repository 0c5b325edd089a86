//! Sending events to user space through a ring buffer, with every event
//! that cannot be sent counted rather than silently dropped.

use aya_ebpf::maps::{PerCpuArray, RingBuf};

use rtrace_common::events::LOST_EVENT;

use crate::count_error;

/// Sends the `len` bytes at `data` (at most `max`) as one record.
///
/// # Safety
/// `data` must point to at least `max` readable bytes of a map value.
#[inline(always)]
pub unsafe fn emit_bytes(
    ring: &RingBuf,
    lost: &PerCpuArray<u64>,
    data: *const u8,
    len: usize,
    max: usize,
) {
    // The volatile read keeps the bound check in a form the verifier sees.
    let len = unsafe { core::ptr::read_volatile(&raw const len) };
    if len == 0 || len > max {
        return;
    }
    // SAFETY: `len <= max` bytes are readable, per the contract.
    let bytes = unsafe { core::slice::from_raw_parts(data, len) };
    if ring.output::<[u8]>(bytes, 0).is_err() {
        count_error(lost, LOST_EVENT);
    }
}

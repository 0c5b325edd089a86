//! A log-linear histogram that both sides index the same way.
//!
//! Every power of two is split into `1 << SUB_BITS` equal sub-buckets, and
//! values below `1 << SUB_BITS` get a slot each. Sub-buckets nest exactly
//! inside power-of-two ranges, so user space can fold the slots into the
//! classic log2 histogram without error, and can also feed them to
//! HdrHistogram for percentiles with a relative error below
//! `1 / (1 << SUB_BITS)`.

/// Bits of linear resolution inside each power of two.
pub const SUB_BITS: u32 = 4;
/// Sub-buckets per power of two.
pub const SUB_BUCKETS: usize = 1 << SUB_BITS;
/// Largest exponent with its own slots; larger values land in the last slot.
pub const MAX_EXP: u32 = 39;
/// Number of slots in a histogram.
pub const SLOTS: usize = SUB_BUCKETS + (MAX_EXP - SUB_BITS + 1) as usize * SUB_BUCKETS;

/// One histogram: counts per slot plus the exact maximum and sum.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Hist {
    /// Counts per slot.
    pub slots: [u32; SLOTS],
    /// Largest value recorded.
    pub max: u64,
    /// Sum of all values recorded.
    pub sum: u64,
}

crate::pod!(Hist);

/// Returns the slot that counts `value`.
#[inline(always)]
pub fn slot(value: u64) -> usize {
    if value < SUB_BUCKETS as u64 {
        return value as usize;
    }
    let exp = 63 - value.leading_zeros();
    if exp > MAX_EXP {
        return SLOTS - 1;
    }
    let sub = (value >> (exp - SUB_BITS)) as usize & (SUB_BUCKETS - 1);
    SUB_BUCKETS + (exp - SUB_BITS) as usize * SUB_BUCKETS + sub
}

/// Returns the inclusive range `[low, high]` of values counted in `slot`.
pub fn slot_range(slot: usize) -> (u64, u64) {
    if slot < SUB_BUCKETS {
        return (slot as u64, slot as u64);
    }
    let exp = ((slot - SUB_BUCKETS) / SUB_BUCKETS) as u32 + SUB_BITS;
    let sub = ((slot - SUB_BUCKETS) % SUB_BUCKETS) as u64;
    let width = 1u64 << (exp - SUB_BITS);
    let low = (1u64 << exp) + sub * width;
    if slot == SLOTS - 1 {
        return (low, u64::MAX);
    }
    (low, low + width - 1)
}

/// The log2 bucket (libbpf-tools' `log2l`) that holds every value of `slot`.
pub fn log2_bucket(slot: usize) -> usize {
    let (low, _) = slot_range(slot);
    if low == 0 {
        0
    } else {
        (63 - low.leading_zeros()) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_cover_values_without_gaps() {
        let mut expected_low = 0;
        for s in 0..SLOTS {
            let (low, high) = slot_range(s);
            assert_eq!(low, expected_low, "slot {s}");
            assert!(high >= low);
            assert_eq!(slot(low), s);
            assert_eq!(slot(high), s);
            expected_low = high.wrapping_add(1);
        }
        assert_eq!(slot(u64::MAX), SLOTS - 1);
    }

    #[test]
    fn log2_buckets_match_libbpf_tools() {
        // libbpf-tools puts 0 and 1 in bucket 0, 2..=3 in 1, 4..=7 in 2, ...
        for (v, b) in [
            (0u64, 0usize),
            (1, 0),
            (2, 1),
            (3, 1),
            (4, 2),
            (1000, 9),
            (1 << 20, 20),
        ] {
            assert_eq!(log2_bucket(slot(v)), b, "value {v}");
        }
    }
}

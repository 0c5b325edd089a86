//! Types of `rtrace biolatency`.

use crate::hist::Hist;

/// `HistKey::flags` of a tracepoint program: the record's `rwbs` string
/// (its first 7 bytes) with this bit set, where the BTF and raw
/// tracepoint programs put `request.cmd_flags`.
pub const FLAGS_RWBS: u64 = 1 << 63;

/// Byte offsets into `struct request` and what it points to, from BTF.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct RequestOffsets {
    /// `request.q`.
    pub q: u32,
    /// `request_queue.disk` (5.15+), or [`crate::offsets::MISSING`].
    pub q_disk: u32,
    /// `request.rq_disk` (before 5.17), or [`crate::offsets::MISSING`].
    pub rq_disk: u32,
    /// `gendisk.major`.
    pub major: u32,
    /// `gendisk.first_minor`.
    pub first_minor: u32,
    /// `request.cmd_flags`.
    pub cmd_flags: u32,
    /// `request.bio`, its first bio: the submitter of that decides
    /// whether the request is in scope ([`Config::by_submitter`]).
    pub bio: u32,
    /// Keeps the struct free of padding.
    pub _pad: u32,
}

/// Byte offsets into the block tracepoints' records, from tracefs.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TracepointOffsets {
    /// `dev` in `block_rq_insert` and `block_rq_issue`.
    pub dev: u32,
    /// `sector` in `block_rq_insert` and `block_rq_issue`.
    pub sector: u32,
    /// `dev` in `block_rq_complete`.
    pub done_dev: u32,
    /// `sector` in `block_rq_complete`.
    pub done_sector: u32,
    /// `rwbs` in `block_rq_complete`.
    pub done_rwbs: u32,
    /// `dev` in `block_bio_queue`.
    pub bio_dev: u32,
    /// `sector` in `block_bio_queue`.
    pub bio_sector: u32,
    /// Keeps the struct free of padding.
    pub _pad: u32,
}

/// Load-time configuration, passed as the global `CONFIG`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Config {
    /// Nanoseconds per displayed unit (1000 for usecs, 1000000 for msecs).
    pub unit_ns: u64,
    /// Only this device (kernel `dev_t`), when `filter_dev` is set (`-d`).
    pub dev: u32,
    /// Whether `dev` applies.
    pub filter_dev: u32,
    /// Whether time in the queue counts too (`-Q`).
    pub queued: u32,
    /// A histogram per disk (`-D`).
    pub per_disk: u32,
    /// A histogram per set of I/O flags (`-F`).
    pub per_flags: u32,
    /// Whether a request is in scope by the task that submitted its first
    /// bio, noted at `block_bio_queue`, rather than by the task that
    /// inserts or issues it: a scope (`-c`, `-- CMD`) is set, and a
    /// request is often issued by another task (a kernel worker that
    /// flushes a plug or runs the queue, or another process's dispatch).
    pub by_submitter: u32,
    /// Keeps the struct free of padding.
    pub _pad: [u32; 2],
    /// Struct offsets for the BTF and raw tracepoint programs.
    pub rq: RequestOffsets,
    /// Record offsets for the tracepoint programs.
    pub tp: TracepointOffsets,
}

/// A request in flight: the request's address, or for the tracepoint
/// programs, which see no address, its device and first sector.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct StartKey {
    /// The request's address, or its first sector.
    pub id: u64,
    /// Its device, for the tracepoint programs; 0 otherwise.
    pub dev: u32,
    /// Keeps the struct free of padding.
    pub _pad: u32,
}

/// Which histogram a completion counts in.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HistKey {
    /// The disk, with `-D`; 0 otherwise.
    pub dev: u32,
    /// Keeps the struct free of padding.
    pub _pad: u32,
    /// The I/O's flags, with `-F`; 0 otherwise.
    pub flags: u64,
}

/// A histogram's value in `HISTS`.
pub type Entry = Hist;

/// Index into the `ERRORS` per-CPU array: start times not stored (map full).
pub const ERR_START_UPDATE: u32 = 0;
/// Index into `ERRORS`: histograms not created (map full).
pub const ERR_HIST_UPDATE: u32 = 1;
/// What each `ERRORS` slot counts, for the report at exit.
pub const ERR_NAMES: [&str; 2] = [
    "request start times not stored (map full)",
    "histograms not created (map full)",
];

crate::pod!(RequestOffsets, TracepointOffsets, Config, StartKey, HistKey);

/// The histograms ([`Entry`]) by [`HistKey`], when split by disk or
/// flags; user space sizes it (1 when not).
pub const HISTS: &str = "HISTS";
/// The one histogram when not split by disk or flags: a per-CPU
/// [`Entry`].
pub const TOTAL: &str = "TOTAL";

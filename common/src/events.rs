//! The loss counters every event tool keeps in a per-CPU `LOST` array.

/// `LOST` slot: the ring buffer was full when an event was to be sent.
pub const LOST_EVENT: u32 = 0;
/// `LOST` slot: a table of operations in flight was full, so the
/// operation's event could never be sent.
pub const LOST_TABLE: u32 = 1;
/// Number of `LOST` slots.
pub const LOST_SLOTS: u32 = 2;

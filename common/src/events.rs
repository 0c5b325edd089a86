//! The first two slots of every event tool's `ERRORS` counters.
//!
//! Slot [`LOST_EVENT`] is the one the `Tracer` also adds perf buffers'
//! own loss records to, so it must be first.

/// `ERRORS` slot: the event buffer was full when an event was to be sent.
pub const LOST_EVENT: u32 = 0;
/// `ERRORS` slot: a table of operations in flight was full, so the
/// operation's event could never be sent.
pub const LOST_TABLE: u32 = 1;

/// What [`LOST_EVENT`] and [`LOST_TABLE`] count, for the report at exit.
pub const LOST_NAMES: [&str; 2] = [
    "events lost (event buffer full; raise --buffer-size)",
    "events lost (in-flight table full)",
];

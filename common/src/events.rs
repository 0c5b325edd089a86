//! What every event tool shares: its event map and the names of its
//! other shared maps, when its ring buffer wakes user space, and the first
//! two slots of its `ERRORS` counters.
//!
//! Slot [`LOST_EVENT`] is the one the `Tracer` also adds perf buffers'
//! own loss records to, so it must be first.

/// Bytes waiting in a ring buffer at which the programs wake user space
/// even while it reads on its own timer.
pub const WAKE_BYTES: u64 = 64 * 1024;
/// How often user space reads a ring buffer while records keep coming;
/// once a read finds none, it sleeps until the programs wake it.
pub const READ_EVERY_MS: u64 = 10;

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

/// The event map of every event object (`event_map!`): a ring buffer, or
/// in the `perf` variant a perf event array, of the tool's records.
pub const EVENTS: &str = "EVENTS";

/// The one-slot array that says whether user space waits for a wakeup
/// (1) or reads the ring buffer on its own timer (0); every object has it.
pub const EVENTS_READER: &str = "EVENTS_READER";

/// The global that makes an event tool tally instead of send (set by the
/// exporter), and the per-CPU array of its totals.
pub const TALLY_ONLY: &str = "TALLY_ONLY";
/// The per-CPU array an event tool tallies into where [`TALLY_ONLY`] is set.
pub const TALLIES: &str = "TALLIES";

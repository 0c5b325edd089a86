//! Names user space looks objects up by in most of the eBPF objects: the
//! configuration global, the error counters and the table of operations
//! in flight. Names one tool's object alone holds are in that tool's
//! module; those of the shared parts are beside their types
//! ([`crate::events`], [`crate::stacks`], [`crate::unwind`],
//! [`crate::python`], [`crate::targets`]).
//!
//! The kernel side cannot use these constants: aya-ebpf names a map after
//! its static and a program after its function, and takes only a literal
//! in `#[map(name = ...)]`. User space's `kernel::objects` tests check
//! every name declared in this crate against the built objects.

/// The global every configurable object has: the tool's `Config` (a type
/// of the tool's module here), set at load.
pub const CONFIG: &str = "CONFIG";

/// The per-CPU array of work that could not be done, by cause: each tool
/// names its slots (`ERR_*` and `ERR_NAMES` in its module, the first two
/// [`crate::events`]' for event tools); every object has it.
pub const ERRORS: &str = "ERRORS";

/// A hash by thread id that user space sizes: of operations in flight
/// (`in_flight!`) in the objects that keep them outside task storage
/// (their plain and `perf` variants), and of threads off the CPU
/// ([`crate::offcputime::Start`], `offcpu_programs!`) in offcputime's and
/// profile's objects.
pub const STARTS: &str = "STARTS";

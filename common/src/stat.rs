//! Types of `rtrace stat`: what its programs count tracepoints into.

/// Slots of `SYSCALLS` for one direction: syscall numbers below this are
/// counted (x86-64 has under 500).
pub const MAX_SYSCALLS: u32 = 1024;

/// `ERRORS` slot: a syscall whose number is not below [`MAX_SYSCALLS`].
pub const ERR_SYSCALL_NR: u32 = 0;
/// `ERRORS` slot: a tracepoint whose id is beyond `TRACEPOINTS`.
pub const ERR_TRACEPOINT_ID: u32 = 1;

/// What each `ERRORS` slot counts, for the report at exit.
pub const ERR_NAMES: [&str; 2] = [
    "syscalls not counted (a number beyond the table)",
    "tracepoint events not counted (an id beyond the table)",
];

//! Types of `rtrace gethostlatency`.

use crate::TASK_COMM_LEN;

/// Bytes kept of the looked-up name, NUL included.
pub const HOST_LEN: usize = 80;

/// The resolver functions traced, by `Event::func`.
pub const FUNCTIONS: [&str; 3] = ["getaddrinfo", "gethostbyname", "gethostbyname2"];

/// A lookup in flight, kept by thread id from entry to return.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Start {
    /// `bpf_ktime_get_ns` at entry.
    pub start_ns: u64,
    /// Index into [`FUNCTIONS`].
    pub func: u32,
    /// Keeps `host` aligned.
    pub _pad: u32,
    /// The name looked up, as passed.
    pub host: [u8; HOST_LEN],
}

/// One finished lookup.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Event {
    /// Latency in nanoseconds.
    pub delta_ns: u64,
    /// Process id.
    pub pid: u32,
    /// Index into [`FUNCTIONS`].
    pub func: u32,
    /// The process's command.
    pub comm: [u8; TASK_COMM_LEN],
    /// The name looked up.
    pub host: [u8; HOST_LEN],
}

crate::pod!(Start, Event);

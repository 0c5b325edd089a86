//! Types of `rtrace gethostlatency`.

use crate::TASK_COMM_LEN;

/// Bytes kept of the looked-up name, NUL included.
pub const HOST_LEN: usize = 80;

/// The resolver functions traced, by `Event::func`.
pub const FUNCTIONS: [&str; 5] = [
    "getaddrinfo",
    "gethostbyname",
    "gethostbyname2",
    "gethostbyname_r",
    "gethostbyaddr",
];
/// `Event::func` of `gethostbyaddr`, whose `host` holds the address:
/// its family (`AF_INET`, `AF_INET6`) in byte 0, its length in byte 1,
/// then its bytes.
pub const FUNC_BY_ADDR: u32 = 4;

/// A lookup in flight, kept by thread id from entry to return.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Start {
    /// `bpf_ktime_get_ns` at entry.
    pub start_ns: u64,
    /// Index into [`FUNCTIONS`].
    pub func: u32,
    /// Traced calls made inside this one (glibc's `gethostbyname` calls
    /// `gethostbyname_r`'s code): the outermost call is the lookup.
    pub depth: u32,
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

/// The uretprobe every lookup function returns through.
pub const PROG_LOOKUP_RETURN: &str = "lookup_return";

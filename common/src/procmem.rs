//! Types of the kernel's reader of another process's memory: what
//! user space asks for, when `/proc/PID/mem` is closed to it.
//!
//! `/proc/PID/mem` needs ptrace rights over the process, which CAP_BPF
//! and CAP_PERFMON (how the exporter's service runs) do not give. The
//! kernel's `bpf_copy_from_user_task` needs none: a sleepable task
//! iterator, bound to one process, copies the range [`Request`] names
//! from the first of its threads that has an address space, and writes
//! it to the iterator's file, which user space reads.

/// The iterator program.
pub const PROG_PROCMEM_READ: &str = "procmem_read";

/// The request map: one [`Request`], at index 0.
pub const PROCMEM_REQUEST: &str = "PROCMEM_REQUEST";

/// Bytes one pass of the iterator copies at most (user space reads
/// longer ranges in pieces).
pub const PROCMEM_MAX: usize = 4096;

/// What to copy, set by user space before each pass.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Request {
    /// The address in the process.
    pub addr: u64,
    /// Bytes, 1 to [`PROCMEM_MAX`].
    pub len: u32,
    /// Set by the program once a thread gave the bytes: the process's
    /// other threads need not copy them again.
    pub done: u32,
}

crate::pod!(Request);

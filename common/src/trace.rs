//! Types of `rtrace trace`: bcc's trace probes, run by the same
//! interpreter as argdist's specs ([`crate::argdist`]), each run that
//! passes its filter sending one [`Event`].

use crate::{
    TASK_COMM_LEN,
    argdist::{MAX_PROBES, MAX_STRINGS, MAX_VALUES, Probe, STR_LEN},
};

/// Kernel frames an event carries at most (`-K`).
pub const MAX_FRAMES: usize = 64;

/// `ERRORS` slot: calls whose return was not sent, as the table of calls
/// in flight was full (slot 0 is the events lost to a full buffer).
pub const ERR_ENTRIES_FULL: u32 = 1;
/// `ERRORS` slot: kernel stacks the kernel could not walk. The slots
/// from 2 to it are the shared user-stack walk's
/// (`crate::stacks::ERR_NAMES`).
pub const ERR_KERNEL_STACK: u32 = crate::stacks::ERR_NAMES.len() as u32;
/// What each `ERRORS` slot counts, for the report at exit.
pub const ERR_NAMES: [&str; crate::stacks::ERR_NAMES.len() + 1] = crate::stacks::names_with_walk(
    [
        crate::events::LOST_NAMES[0],
        "return events lost: the table of calls in flight was full",
    ],
    &["kernel stacks not walked"],
);

/// Load-time configuration, passed as the global `CONFIG`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// The probes, by slot: slot `i` runs the programs ending in `_i`.
    pub probes: [Probe; MAX_PROBES],
    /// Kernel stacks wanted (`-K`).
    pub kernel_stack: u32,
    /// User stacks wanted (`-U`).
    pub user_stack: u32,
    /// Only this user's tasks (`--uid`), or `u32::MAX` for all.
    pub uid: u32,
    /// Keeps the size a multiple of 8.
    pub _pad: u32,
}

/// One probe's run, sent when its filter passes. Its kernel frames follow
/// it; a record is cut after the last.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Event {
    /// `bpf_ktime_get_ns`.
    pub ts: u64,
    /// The probe's slot.
    pub probe: u32,
    /// Process id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// CPU.
    pub cpu: u32,
    /// Kernel frames following.
    pub n_kernel: u32,
    /// Keeps `ustack` aligned.
    pub _pad: u32,
    /// With `-U`: the user stack, by its hash in the shared stack table
    /// (`STACKS`); 0 for none.
    pub ustack: u64,
    /// The command.
    pub comm: [u8; TASK_COMM_LEN],
    /// The format's numeric values, by position (0 where a string is).
    pub values: [u64; MAX_VALUES],
    /// The format's strings, by the value's string slot, NUL-padded.
    pub strings: [[u8; STR_LEN]; MAX_STRINGS],
    /// Kernel frames (`-K`).
    pub frames: [u64; MAX_FRAMES],
}

/// Bytes of an [`Event`] before its frames.
pub const HEADER_SIZE: usize = core::mem::size_of::<Event>() - MAX_FRAMES * 8;

crate::pod!(Config, Event);

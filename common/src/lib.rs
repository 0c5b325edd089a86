//! Types shared by rtrace's kernel-side programs and its user space.
//!
//! Everything here is `#[repr(C)]`, `Copy` and free of padding surprises, so
//! one definition serves both sides. The `user` feature adds `aya::Pod`
//! implementations for user space; the eBPF crate never links aya.
//!
//! The names user space looks the objects' maps, programs and globals up
//! by are here too, as `&str` constants in the module of the tool that
//! owns them, or in [`names`] and the shared modules; and the objects'
//! variants are in [`variants`].
#![no_std]

pub mod argdist;
pub mod biolatency;
pub mod btf;
pub mod events;
pub mod execsnoop;
pub mod ext4slower;
pub mod gethostlatency;
pub mod hist;
pub mod java;
pub mod memleak;
pub mod names;
#[cfg(feature = "objects")]
pub mod objects;
pub mod offcputime;
pub mod offsets;
pub mod probes;
pub mod procmem;
pub mod profile;
pub mod python;
pub mod runqlat;
pub mod stacks;
pub mod stat;
pub mod strace;
pub mod targets;
pub mod tcplife;
pub mod trace;
pub mod unwind;
pub mod v8;
pub mod variants;

/// Length of `task_struct.comm`, including the terminating NUL.
pub const TASK_COMM_LEN: usize = 16;

/// Marks a shared type as plain old data for aya's map and global APIs.
macro_rules! pod {
    ($($t:ty),* $(,)?) => {
        $(
            #[cfg(feature = "user")]
            // SAFETY: the type is `#[repr(C)]`, `Copy`, and every bit pattern is valid.
            unsafe impl aya::Pod for $t {}
        )*
    };
}
pub(crate) use pod;

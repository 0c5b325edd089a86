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
// `sign_bit`'s instruction (the eBPF side builds on nightly).
#![cfg_attr(target_arch = "bpf", feature(asm_experimental_arch))]

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

/// The sign bit of `x`, 0 or 1, hidden from the compiler, so that it
/// cannot see that it is 0 or 1. Where it can, it makes a product of it a
/// mask (`(x >> 63) * y` becomes `(x s>> 63) & y`) or a branch: the
/// verifier follows both sides of a branch, and newer verifiers split a
/// register that is 0 or -1 in two before an AND (seen on Linux 6.18 as
/// this project's hosts built it in December 2026), each side with its own
/// constants after it. A product of 0 or 1 is one range to every verifier.
#[inline(always)]
pub fn sign_bit(x: u64) -> u64 {
    #[allow(unused_mut)]
    let mut bit = x >> 63;
    // A move of the register to itself: the compiler knows nothing of
    // what comes out, and no stack is used, which the walk's programs
    // have little of.
    #[cfg(target_arch = "bpf")]
    // SAFETY: a move of a register to itself.
    unsafe {
        core::arch::asm!("{0} = {0}", inout(reg) bit, options(pure, nomem, nostack, preserves_flags));
    }
    #[cfg(not(target_arch = "bpf"))]
    {
        bit = core::hint::black_box(bit);
    }
    bit
}

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

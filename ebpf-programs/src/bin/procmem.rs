//! The kernel's reader of another process's memory, for user space
//! when `/proc/PID/mem` is closed to it (`rtrace_common::procmem`).
//!
//! A sleepable task iterator: user space binds each pass to one process
//! (the link's `task.pid`), so the iterator visits only that process's
//! threads, and sets the range in [`PROCMEM_REQUEST`]. The first thread
//! whose address space gives the bytes writes them to the iterator's
//! file; a range that cannot be read writes nothing.
#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::task_struct,
    helpers::generated::{bpf_copy_from_user_task, bpf_seq_write},
    macros::map,
    maps::{Array, PerCpuArray},
};
use rtrace_common::procmem::{PROCMEM_MAX, Request};

/// The range to copy (index 0).
#[map]
static PROCMEM_REQUEST: Array<Request> = Array::with_max_entries(1, 0);

/// Where the copy lands before it is written out.
#[map]
static PROCMEM_BUF: PerCpuArray<[u8; PROCMEM_MAX]> = PerCpuArray::with_max_entries(1, 0);

/// `struct bpf_iter__task`: the iterator's context, fixed by the ABI.
#[repr(C)]
pub struct IterTask {
    meta: *const IterMeta,
    task: *mut task_struct,
}

/// `struct bpf_iter_meta`'s head, fixed by the ABI.
#[repr(C)]
pub struct IterMeta {
    seq: *mut aya_ebpf::bindings::seq_file,
}

/// Copies the requested range from the visited thread's address space.
///
/// # Safety
/// Called by the kernel only, with a valid `bpf_iter__task`; the verifier
/// checks every load from it against the kernel's BTF.
#[unsafe(no_mangle)]
#[unsafe(link_section = "iter.s/task")]
pub unsafe extern "C" fn procmem_read(ctx: *mut IterTask) -> i32 {
    // SAFETY: as the function's contract says.
    unsafe {
        let task = (*ctx).task;
        if task.is_null() {
            return 0;
        }
        let Some(req) = PROCMEM_REQUEST.get_ptr_mut(0) else {
            return 0;
        };
        if (*req).done != 0 {
            return 0;
        }
        let len = (*req).len;
        if len == 0 || len as usize > PROCMEM_MAX {
            return 0;
        }
        // The same length, in a form the verifier bounds (1 to the
        // maximum): the compiler folds the test above into one compare of
        // `len - 1`, which bounds that and not `len`.
        let len = ((len - 1) & (PROCMEM_MAX as u32 - 1)) + 1;
        let Some(buf) = PROCMEM_BUF.get_ptr_mut(0) else {
            return 0;
        };
        let got = bpf_copy_from_user_task(buf.cast(), len, (*req).addr as *const _, task, 0);
        if got != 0 {
            return 0;
        }
        let seq = (*(*ctx).meta).seq;
        if bpf_seq_write(seq, buf.cast(), len) == 0 {
            (*req).done = 1;
        }
    }
    0
}

// Not the library's handler: linking the library would bring its maps
// (the stack tables, the expression entries), which this object, loaded
// beside a tool's, does not use.
#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // SAFETY: the verifier rejects any program that could reach this.
    unsafe { core::hint::unreachable_unchecked() }
}

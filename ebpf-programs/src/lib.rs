//! Helpers shared by rtrace's kernel-side programs.
#![no_std]
// BPF's `core` has no atomic types; the intrinsic lowers to BPF_ATOMIC_ADD.
#![feature(core_intrinsics)]
// Loads from a tracepoint's record at fixed offsets (`record_field`).
#![feature(asm_experimental_arch)]
#![allow(internal_features)]

#[cfg(feature = "cfi")]
pub mod cfi;
pub mod events;
pub mod expr;
#[cfg(feature = "cfi")]
pub mod java;
pub mod offcpu;
pub mod process;
#[cfg(feature = "cfi")]
pub mod python;
#[cfg(feature = "cfi")]
mod runtime;
pub mod scratch;
pub mod stacks;
pub mod targets;
pub mod task_storage;
#[cfg(feature = "cfi")]
pub mod v8;

/// Defines the programs that keep the CFI tables in step with the
/// processes, `cfi_exec`, `cfi_fork` and `cfi_exit` (raw tracepoints
/// `sched_process_exec`, `sched_process_fork` and `sched_process_exit`: the walk needs
/// `bpf_loop`, 5.17, so they are always there, and unlike tracepoints they
/// need no tracefs), and `cfi_loaded` (a uprobe on the dynamic loader's
/// `_dl_debug_state`), in an object that has an `EVENTS` map
/// (`event_map!`). Only with the `cfi` feature.
#[macro_export]
macro_rules! cfi_programs {
    // As `steps_apart`, with the walk through native frames only beside
    // it, for an object whose programs walk through no runtime's frames
    // until a runtime is in scope (`stacks::describe_current_walking`).
    (walk_variants) => {
        $crate::cfi_programs!(steps_apart);

        /// The CFI walk through native frames only, as
        /// `rtrace_global_user_stack` is through every runtime's.
        #[cfg(feature = "cfi_global")]
        #[unsafe(no_mangle)]
        #[inline(never)]
        pub extern "C" fn rtrace_global_user_stack_native(who: u64, regs: u64) -> u64 {
            $crate::stacks::walk_user::<0>(who, regs)
        }

        /// The CFI walk through Python's frames and native ones only:
        /// what a run with no other runtime in scope loads.
        #[cfg(feature = "cfi_global")]
        #[unsafe(no_mangle)]
        #[inline(never)]
        pub extern "C" fn rtrace_global_user_stack_python(who: u64, regs: u64) -> u64 {
            $crate::stacks::walk_user::<{ rtrace_common::unwind::RUNTIME_PYTHON }>(who, regs)
        }

        /// The CFI walk through Java's frames and native ones only.
        #[cfg(feature = "cfi_global")]
        #[unsafe(no_mangle)]
        #[inline(never)]
        pub extern "C" fn rtrace_global_user_stack_java(who: u64, regs: u64) -> u64 {
            $crate::stacks::walk_user::<
                { rtrace_common::unwind::RUNTIME_JAVA | $crate::cfi::STEPS_APART },
            >(who, regs)
        }

        /// The CFI walk through V8's frames and native ones only.
        #[cfg(feature = "cfi_global")]
        #[unsafe(no_mangle)]
        #[inline(never)]
        pub extern "C" fn rtrace_global_user_stack_v8(who: u64, regs: u64) -> u64 {
            $crate::stacks::walk_user::<
                { rtrace_common::unwind::RUNTIME_V8 | $crate::cfi::STEPS_APART },
            >(who, regs)
        }
    };
    // With the walk through every runtime's frames, Java's and V8's steps
    // apart, for an object none of whose programs' frames with the walk's
    // pass the 512 bytes the kernel holds a chain of calls to
    // (`cfi::STEPS_APART`).
    (steps_apart) => {
        $crate::cfi_programs!(
            @with { rtrace_common::unwind::RUNTIMES_ALL | $crate::cfi::STEPS_APART }
        );
        $crate::cfi_programs!(@runtime_step);
    };
    (@runtime_step) => {
        /// Java's step of the walk (`stacks::java_step`): a global
        /// function, verified once rather than for each state a walk
        /// reaches a frame in, and only by the programs that walk
        /// through Java's frames.
        #[cfg(feature = "cfi_global")]
        #[unsafe(no_mangle)]
        #[inline(never)]
        pub extern "C" fn rtrace_global_java_step(tgid: u64) -> u64 {
            $crate::stacks::java_step(tgid)
        }

        /// V8's step of the walk (`stacks::v8_step`), likewise.
        #[cfg(feature = "cfi_global")]
        #[unsafe(no_mangle)]
        #[inline(never)]
        pub extern "C" fn rtrace_global_v8_step(code: u64, tgid: u64) -> u64 {
            $crate::stacks::v8_step(code, tgid)
        }
    };
    () => {
        $crate::cfi_programs!(@with { rtrace_common::unwind::RUNTIMES_ALL });
    };
    (@with $rt:block) => {
        #[cfg(feature = "cfi")]
        #[aya_ebpf::macros::raw_tracepoint(tracepoint = "sched_process_exec")]
        pub fn cfi_exec(ctx: aya_ebpf::programs::RawTracePointContext) -> i32 {
            $crate::cfi::on_exec(&ctx, &EVENTS);
            0
        }

        #[cfg(feature = "cfi")]
        #[aya_ebpf::macros::raw_tracepoint(tracepoint = "sched_process_fork")]
        pub fn cfi_fork(ctx: aya_ebpf::programs::RawTracePointContext) -> i32 {
            $crate::cfi::on_fork(&ctx, &EVENTS);
            0
        }

        #[cfg(feature = "cfi")]
        #[aya_ebpf::macros::raw_tracepoint(tracepoint = "sched_process_exit")]
        pub fn cfi_exit(ctx: aya_ebpf::programs::RawTracePointContext) -> i32 {
            $crate::cfi::on_exit(&ctx, &EVENTS);
            0
        }

        /// The CFI walk of the current task's user stack: a global
        /// function (`rtrace_global_` names are made so by the build),
        /// verified once rather than for each way its caller goes on.
        #[cfg(feature = "cfi_global")]
        #[unsafe(no_mangle)]
        #[inline(never)]
        pub extern "C" fn rtrace_global_user_stack(who: u64, regs: u64) -> u64 {
            $crate::stacks::walk_user::<$rt>(who, regs)
        }

        /// The work after a CFI walk, on this object's `EVENTS`: a
        /// global function (`rtrace_global_` names are made so by the
        /// build), verified once rather than for each way a walk ends.
        #[cfg(feature = "cfi")]
        #[unsafe(no_mangle)]
        #[inline(never)]
        pub extern "C" fn rtrace_global_after_walk(packed: u64, who: u64) -> u64 {
            $crate::stacks::after_walk(&EVENTS, packed, who)
        }

        /// Which of V8's code holds `pc` in the walk's process
        /// (`v8::code_at`): a global function, verified once rather than
        /// for each state a walk reaches a frame in.
        #[cfg(feature = "cfi")]
        #[unsafe(no_mangle)]
        #[inline(never)]
        pub extern "C" fn rtrace_global_v8_code(pc: u64) -> u64 {
            $crate::stacks::v8_code(pc)
        }

        #[cfg(feature = "cfi")]
        #[aya_ebpf::macros::uprobe]
        pub fn cfi_loaded(ctx: aya_ebpf::programs::ProbeContext) -> u32 {
            $crate::cfi::on_loaded(&ctx, &EVENTS);
            0
        }
    };
}

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::{bpf_get_current_pid_tgid, bpf_get_current_task, bpf_probe_read_kernel},
    macros::map,
    maps::{HashMap, PerCpuArray},
    programs::TracePointContext,
};
use core::intrinsics::{AtomicOrdering, atomic_cxchg, atomic_xadd, atomic_xchg};
use rtrace_common::{
    hist::{self, Hist},
    offsets::FdOffsets,
};

/// A program on a classic tracepoint that passes every event on to the
/// tracepoint's other listeners.
///
/// The kernel runs a classic tracepoint's BPF programs before the perf
/// events that listen on it, and a 0 from any of them drops the event for
/// every perf listener of that tracepoint on that CPU: `perf stat`, `perf
/// record` and other tracers beside rtrace would count fewer events while
/// it runs. aya's `#[tracepoint]` returns 0 whatever the function returns,
/// so rtrace's tracepoint programs are made by this macro instead, and
/// always return 1. rtrace's own perf event is then one more listener: it
/// has no buffer, and the kernel finds that out per event (its cost is in
/// `docs/benchmarks.md`).
///
/// Raw tracepoints and tp_btf do not pass through perf's listeners at all,
/// and kprobes, uprobes and perf events opened through `perf_event_open`
/// are each rtrace's own instance, so their 0 hides nothing from anyone
/// else (`docs/architecture.md`, "Never hide an event").
///
/// The section is plain `tracepoint`: user space names the category and
/// event when it attaches.
#[macro_export]
macro_rules! tracepoint {
    ($(#[$attr:meta])* fn $name:ident($ctx:ident) $body:block) => {
        $(#[$attr])*
        #[unsafe(no_mangle)]
        #[unsafe(link_section = "tracepoint")]
        pub fn $name(raw: *mut ::core::ffi::c_void) -> u32 {
            #[inline(always)]
            fn program($ctx: ::aya_ebpf::programs::TracePointContext) $body
            program(::aya_ebpf::programs::TracePointContext::new(raw));
            1
        }
    };
}

/// Reads a `T` at `base + offset` in kernel memory.
///
/// Offsets come from BTF at run time, so a bad or missing member reads as an
/// error instead of faulting.
#[inline(always)]
pub fn read_kernel<T>(base: *const u8, offset: u32) -> Result<T, i64> {
    if base.is_null() {
        return Err(-14);
    }
    // SAFETY: bpf_probe_read_kernel copes with any address.
    unsafe { bpf_probe_read_kernel(base.wrapping_add(offset as usize) as *const T) }
        .map_err(i64::from)
}

/// Reads the field at `offset` of a classic tracepoint's record. The
/// verifier allows plain loads from a record only at offsets fixed in the
/// instruction, so each usual offset gets a load of its own (the
/// configuration is read-only, and the verifier drops the arms it cannot
/// take); any other offset is read through the helper, a call.
///
/// Each arm's load is written in assembly: written as Rust, LLVM may fold
/// arms that differ only in their offset into one load from the record's
/// pointer plus a computed offset, which the verifier refuses
/// ("dereference of modified ctx ptr"); it did so for `mm_page_alloc`'s
/// u32 `order`.
#[inline(always)]
pub fn record_field<T: RecordField>(ctx: &TracePointContext, offset: u32) -> Option<T> {
    let p = aya_ebpf::EbpfContext::as_ptr(ctx) as *const u8;
    macro_rules! fixed {
        ($($at:literal)*) => {
            match offset {
                $($at => {
                    let v: u64;
                    // SAFETY: the verifier allows only loads inside the
                    // record; the load reads memory and nothing else.
                    unsafe {
                        if T::WORD {
                            core::arch::asm!(
                                concat!("{v} = *(u64 *)({p} + ", stringify!($at), ")"),
                                v = lateout(reg) v, p = in(reg) p,
                                options(readonly, nostack, preserves_flags),
                            );
                        } else {
                            core::arch::asm!(
                                concat!("{v} = *(u32 *)({p} + ", stringify!($at), ")"),
                                v = lateout(reg) v, p = in(reg) p,
                                options(readonly, nostack, preserves_flags),
                            );
                        }
                    }
                    return Some(T::from_word(v));
                })*
                _ => {}
            }
        };
    }
    fixed!(8 16 24 32 40 48 56 64);
    // SAFETY: the helper copes with any address.
    unsafe { aya_ebpf::helpers::bpf_probe_read(p.add(offset as usize) as *const T) }.ok()
}

/// A type [`record_field`] reads: a u64, an i64 or a u32.
pub trait RecordField: Copy {
    /// Eight bytes (else four).
    const WORD: bool;
    /// The value from the loaded register.
    fn from_word(v: u64) -> Self;
}

impl RecordField for u64 {
    const WORD: bool = true;
    fn from_word(v: u64) -> Self {
        v
    }
}

impl RecordField for i64 {
    const WORD: bool = true;
    fn from_word(v: u64) -> Self {
        v as i64
    }
}

impl RecordField for u32 {
    const WORD: bool = false;
    fn from_word(v: u64) -> Self {
        v as u32
    }
}

/// Reads a u32 member of a task. `DIRECT` is for BTF-typed pointers
/// (tp_btf), where the verifier turns a plain load into a cheap checked
/// one; raw tracepoints pass untyped pointers and need the helper.
#[inline(always)]
pub fn task_u32<const DIRECT: bool>(task: *const u8, offset: u32) -> Option<u32> {
    if DIRECT {
        // SAFETY: `task` is a BTF-typed task_struct pointer and `offset` a
        // member's offset from BTF; the verifier checks the access.
        return Some(unsafe {
            core::ptr::read_volatile(task.wrapping_add(offset as usize) as *const u32)
        });
    }
    read_kernel::<u32>(task, offset).ok()
}

/// Reads a kernel pointer at `base + offset`, null if it cannot be read.
#[inline(always)]
pub fn read_ptr(base: *const u8, offset: u32) -> *const u8 {
    read_kernel::<*const u8>(base, offset).unwrap_or(core::ptr::null())
}

/// Reads a `T` from the current task's user memory at `addr`, `None` if
/// it cannot be read (unmapped, or paged out where faults are not allowed).
#[inline(always)]
pub fn read_user<T>(addr: u64) -> Option<T> {
    // SAFETY: the helper copes with any address.
    unsafe { aya_ebpf::helpers::bpf_probe_read_user(addr as *const T) }.ok()
}

/// The `struct file` behind descriptor `fd` of the current task, or null.
#[inline(always)]
pub fn file_of_fd(o: &FdOffsets, fd: i64) -> *const u8 {
    if fd < 0 {
        return core::ptr::null();
    }
    // SAFETY: the helper has no preconditions.
    let task = unsafe { bpf_get_current_task() } as *const u8;
    let fdt = read_ptr(read_ptr(task, o.task_files), o.files_fdt);
    let max = read_kernel::<u32>(fdt, o.fdt_max_fds).unwrap_or(0);
    if fd as u64 >= u64::from(max) {
        return core::ptr::null();
    }
    read_ptr(read_ptr(fdt, o.fdt_fd), fd as u32 * 8)
}

/// A reference to a global's load-time value, read in place.
///
/// `Global::load` copies the whole value onto the 512-byte stack, which a
/// large configuration cannot afford in every program. Laundering the
/// address through a volatile read keeps the compiler from folding the
/// fields to the object's initial zeros, as it would through a plain
/// reference to the static.
#[inline(always)]
pub fn global<T: Copy>(g: &'static aya_ebpf::Global<T>) -> &'static T {
    // `Global<T>` is `repr(transparent)` over the value.
    let p = (g as *const aya_ebpf::Global<T>).cast::<T>();
    // SAFETY: reads back a local just written; the pointer is the global's.
    unsafe { &*core::ptr::read_volatile(&raw const p) }
}

/// Copies `*src` to `*dst` in line, a load and a store a word.
///
/// A plain `*dst = *src` between two places that may be one (map values
/// both) becomes a call of `memmove`, and a struct zeroed or built with
/// many zeros one of `memset`: the eBPF target expands only `memcpy`
/// itself, and aya-ebpf's `memmove` and `memset` go byte by byte, with a
/// branch, which the verifier follows for each byte on each path (the
/// step of the CFI walk copied a region, 56 bytes, on every path out of
/// its search). A non-overlapping copy is a `memcpy`, which the target
/// expands as a load and a store for each unit of the type's alignment,
/// up to 128 of them.
///
/// # Safety
/// `dst` and `src` must be valid, aligned and not overlap.
#[inline(always)]
pub unsafe fn copy_value<T: Copy>(dst: *mut T, src: *const T) {
    const { assert!(core::mem::size_of::<T>() / core::mem::align_of::<T>() <= 128) };
    // SAFETY: per the contract.
    unsafe { core::ptr::copy_nonoverlapping(src, dst, 1) }
}

/// `-EEXIST`: the entry was there already (another CPU created it first).
pub const EEXIST: i32 = -17;

/// The current thread's value in `map` (keyed by thread id), taken out:
/// an operation in flight, stored at its entry, at its return.
#[inline(always)]
pub fn take_current<V: Copy>(map: &HashMap<u32, V>) -> Option<V> {
    let tid = bpf_get_current_pid_tgid() as u32;
    let v = map.get_ptr(tid)?;
    // SAFETY: a map value, copied before it is removed.
    let value = unsafe { *v };
    let _ = map.remove(tid);
    Some(value)
}

/// The value under `key`, created as a copy of `zero`'s first value if
/// missing, and whether it was created here; `None` if the map is full.
///
/// Large values such as histograms cannot be built on the stack, so a
/// new one is copied from a zeroed map value.
#[inline(always)]
pub fn get_or_insert<K, V>(
    map: &HashMap<K, V>,
    key: &K,
    zero: &PerCpuArray<V>,
) -> Option<(*mut V, bool)> {
    if let Some(v) = map.get_ptr_mut(key) {
        return Some((v, false));
    }
    let z = zero.get_ptr(0)?;
    // SAFETY: `z` points to a map value.
    match map.insert(key, unsafe { &*z }, u64::from(BPF_NOEXIST)) {
        Ok(()) | Err(EEXIST) => {}
        Err(_) => return None,
    }
    map.get_ptr_mut(key).map(|v| (v, true))
}

/// Adds one to the counter under `key`, creating it at one if missing:
/// `Some(true)` if this call created it, `Some(false)` if it was there,
/// `None` if the map is full.
#[inline(always)]
pub fn count_key<K>(map: &HashMap<K, u64>, key: &K) -> Option<bool> {
    if let Some(c) = map.get_ptr_mut(key) {
        // SAFETY: a map value.
        unsafe { atomic_add(c, 1) };
        return Some(false);
    }
    match map.insert(key, 1u64, u64::from(BPF_NOEXIST)) {
        Ok(()) => Some(true),
        // Another CPU created it between the lookup and the insert.
        Err(EEXIST) => {
            let c = map.get_ptr_mut(key)?;
            // SAFETY: a map value.
            unsafe { atomic_add(c, 1) };
            Some(false)
        }
        Err(_) => None,
    }
}

/// Adds one to `key`'s count in a per-CPU hash, creating it if needed:
/// this CPU's count alone is written, so no atomic operation is needed.
/// `None` if the table is full.
#[inline(always)]
pub fn count_key_local<K>(map: &aya_ebpf::maps::PerCpuHashMap<K, u64>, key: &K) -> Option<()> {
    if let Some(c) = map.get_ptr_mut(key) {
        // SAFETY: this CPU's value of the entry.
        unsafe { *c += 1 };
        return Some(());
    }
    match map.insert(key, 1u64, u64::from(BPF_NOEXIST)) {
        Ok(()) => Some(()),
        // Another CPU created it between the lookup and the insert.
        Err(EEXIST) => {
            let c = map.get_ptr_mut(key)?;
            // SAFETY: this CPU's value of the entry.
            unsafe { *c += 1 };
            Some(())
        }
        Err(_) => None,
    }
}

/// Adds `value` to a counter that several CPUs may update at once.
///
/// # Safety
/// `p` must point to an aligned `u64` in a map value.
#[inline(always)]
pub unsafe fn atomic_add(p: *mut u64, value: u64) {
    // SAFETY: per the contract.
    unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(p, value) };
}

/// Stores `new` at `p` if it holds `old`; returns what it held
/// (BPF_CMPXCHG, 5.12 and later).
///
/// # Safety
/// `p` must point to an aligned `u64` in a map value.
#[inline(always)]
pub unsafe fn compare_exchange(p: *mut u64, old: u64, new: u64) -> u64 {
    // SAFETY: per the contract.
    unsafe {
        atomic_cxchg::<u64, { AtomicOrdering::SeqCst }, { AtomicOrdering::SeqCst }>(p, old, new).0
    }
}

/// Stores `new` at `p` as one atomic operation with a full barrier
/// (BPF_XCHG, 5.12 and later); returns what it held.
///
/// # Safety
/// `p` must point to an aligned `u64` in a map value.
#[inline(always)]
pub unsafe fn exchange(p: *mut u64, new: u64) -> u64 {
    // SAFETY: per the contract.
    unsafe { atomic_xchg::<u64, { AtomicOrdering::SeqCst }>(p, new) }
}

/// Work that could not be done, by cause: each tool names its slots in
/// `common` (event tools start with `rtrace_common::events`' two), user
/// space sizes the array to them and the `Tracer` reports every nonzero
/// one at exit. It lives here, so every object has it.
#[map]
static ERRORS: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Adds one to slot `index` of [`ERRORS`].
#[inline(always)]
pub fn count_error(index: u32) {
    if let Some(p) = ERRORS.get_ptr_mut(index) {
        // SAFETY: per-CPU value, and programs do not nest on one CPU here.
        unsafe { *p += 1 };
    }
}

/// The slot for `value`, in a form the verifier can bound.
///
/// LLVM proves `hist::slot` in range and drops any bounds check, but the
/// verifier cannot follow its arithmetic; the volatile round trip hides the
/// proof from LLVM so that the check survives for the verifier.
#[inline(always)]
fn bounded_slot(value: u64) -> Option<usize> {
    let mut s = hist::slot(value);
    // SAFETY: reads back a local just written.
    s = unsafe { core::ptr::read_volatile(&raw const s) };
    (s < hist::SLOTS).then_some(s)
}

/// Records `value` in a histogram that only this CPU writes.
///
/// # Safety
/// `h` must point to a `Hist` in a per-CPU map value.
#[inline(always)]
pub unsafe fn hist_record_local(h: *mut Hist, value: u64) {
    let Some(s) = bounded_slot(value) else { return };
    // SAFETY: `h` points into a map value and `s` is in bounds.
    unsafe {
        *(*h).slots.as_mut_ptr().add(s) += 1;
        (*h).sum += value;
        if value > (*h).max {
            (*h).max = value;
        }
    }
}

/// Records `value` in a histogram that several CPUs may update at once.
///
/// # Safety
/// `h` must point to a `Hist` in a map value.
#[inline(always)]
pub unsafe fn hist_record_shared(h: *mut Hist, value: u64) {
    let Some(s) = bounded_slot(value) else { return };
    // SAFETY: `h` points into a map value and `s` is in bounds; the counters
    // are aligned for atomic access.
    unsafe {
        atomic_xadd::<u32, u32, { AtomicOrdering::Relaxed }>((*h).slots.as_mut_ptr().add(s), 1);
        atomic_add(&raw mut (*h).sum, value);
        // A lost race here can only under-report the max by one concurrent
        // sample, which is cheaper than a compare-and-swap loop.
        if value > (*h).max {
            (*h).max = value;
        }
    }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // SAFETY: the verifier rejects any program that could reach this.
    unsafe { core::hint::unreachable_unchecked() }
}

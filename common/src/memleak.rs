//! Types of `rtrace memleak`: allocations still held, by address, and the
//! running totals by stack that allocation profiles are made of.
//!
//! An allocation's weight is its inverse sampling probability in 16.16
//! fixed point ([`ONE`] when every call is traced): its estimated bytes are
//! `size * weight >> 16` and its estimated objects `weight / ONE`, so that
//! totals made of samples stay unbiased estimates of the whole.

use crate::TASK_COMM_LEN;

/// The weight of an allocation that was certain to be traced.
pub const ONE: u64 = 1 << 16;

/// Slots of the `WEIGHTS` map (weights by size, when sampling): sizes below [`DIRECT_SIZES`] have a slot
/// each; larger ones one in each of 64 steps of every power of two.
pub const WEIGHT_SLOTS: usize = DIRECT_SIZES as usize + 64 * 52;
/// Sizes with a weight slot of their own.
pub const DIRECT_SIZES: u64 = 4096;

/// The weight slot of an allocation of `size` bytes (see
/// [`WEIGHT_SLOTS`]); user space fills each slot with the weight of the
/// middle of its sizes.
#[inline(always)]
pub const fn weight_slot(size: u64) -> usize {
    if size < DIRECT_SIZES {
        return size as usize;
    }
    let log = 63 - size.leading_zeros() as u64;
    let step = (size >> (log - 6)) & 63;
    let slot = DIRECT_SIZES + (log - 12) * 64 + step;
    if slot as usize >= WEIGHT_SLOTS {
        WEIGHT_SLOTS - 1
    } else {
        slot as usize
    }
}

/// The sizes of weight slot `slot`, from and to (exclusive).
pub const fn slot_sizes(slot: usize) -> (u64, u64) {
    let s = slot as u64;
    if s < DIRECT_SIZES {
        return (s, s + 1);
    }
    let log = (s - DIRECT_SIZES) / 64 + 12;
    let step = (s - DIRECT_SIZES) % 64;
    let unit = 1u64 << (log - 6);
    ((64 + step) * unit, (65 + step) * unit)
}

/// How allocations are chosen.
pub const SAMPLE_ALL: u32 = 0;
/// Every N-th allocation on each CPU (bcc's `-s N`).
pub const SAMPLE_EVERY: u32 = 1;
/// Each byte with chance 1/B (`--sample-bytes B`), as Go's
/// `MemProfileRate` and OCaml's Memprof: the gap between sampled bytes is
/// drawn from an exponential distribution of mean B.
pub const SAMPLE_BYTES: u32 = 2;

/// Gaps drawn for [`SAMPLE_BYTES`]: the exponential distribution's
/// quantiles at the middles of this many equal slices.
pub const GAPS: usize = 1024;

/// Address spaces of [`AllocKey::space`]: user memory and kmalloc'd
/// memory by address.
pub const SPACE_ADDR: u32 = 0;
/// Pages by page frame number (`mm_page_alloc`).
pub const SPACE_PAGE: u32 = 1;
/// Per-CPU chunks by address (`percpu_alloc_percpu`).
pub const SPACE_PERCPU: u32 = 2;

/// `ERRORS` slot: allocations not recorded, the table of allocations
/// being full (slot 0 is events lost; the walk's slots follow).
pub const ERR_ALLOCS_FULL: u32 = 1;
/// `ERRORS` slot: allocations whose totals by stack were not kept, that
/// table being full.
pub const ERR_TOTALS_FULL: u32 = crate::stacks::ERR_NAMES.len() as u32;
/// `ERRORS` slot: calls whose return was not seen, the table of calls in
/// flight being full.
pub const ERR_PENDING_FULL: u32 = ERR_TOTALS_FULL + 1;
/// `ERRORS` slot: frees of addresses never seen allocated while every
/// call was traced (allocated before tracing began, or not recorded).
pub const ERR_FREE_UNSEEN: u32 = ERR_TOTALS_FULL + 2;
/// `ERRORS` slot: allocations at an address already held, whose free
/// was never seen (replaced; with `--wa-missing-free`, counted as freed).
pub const ERR_FREE_MISSED: u32 = ERR_TOTALS_FULL + 3;
/// What each `ERRORS` slot counts, for the report at exit.
pub const ERR_NAMES: [&str; crate::stacks::ERR_NAMES.len() + 4] = crate::stacks::names_with_walk(
    [
        crate::events::LOST_NAMES[0],
        "allocations not recorded: the table of allocations was full (raise --max-allocs)",
    ],
    &[
        "allocations left out of the totals by stack: that table was full",
        "allocations missed: the table of calls in flight was full",
        "frees of addresses not seen allocated (made before tracing began, or not recorded)",
        "allocations at an address already held, whose free was not seen",
    ],
);

/// Load-time configuration, passed as the global `CONFIG`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// [`SAMPLE_ALL`], [`SAMPLE_EVERY`] or [`SAMPLE_BYTES`].
    pub sample: u32,
    /// Send an event for every call (`-t`).
    pub trace: u32,
    /// With [`SAMPLE_EVERY`]: N.
    pub every: u64,
    /// Smallest size traced (`-z`).
    pub min_size: u64,
    /// Largest size traced (`-Z`).
    pub max_size: u64,
    /// `--wa-missing-free`: an allocation at an address already held
    /// frees the old one first.
    pub missing_free: u32,
    /// Record offsets in the kmem tracepoints' records, from tracefs.
    pub kmem: KmemOffsets,
    /// `[start, end)` of the kernel's BPF allocator's text
    /// (`kernel/bpf/memalloc.c`), `[0, 0]` if unknown: kernel allocations
    /// made there, or by code it called (its stack passes through it), are
    /// left out. It refills, from irq_work, the caches
    /// that the table of allocations takes its elements from, so each
    /// allocation it made and that was recorded would take another
    /// element and bring another refill, until the table was full.
    pub bpf_alloc: [u64; 2],
}

/// Where the kmem tracepoints keep their fields (from their format files,
/// which change between kernels): `[ptr, bytes_alloc, call_site]` of
/// each allocating one, `ptr` of each freeing one.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct KmemOffsets {
    /// `kmem:kmalloc`.
    pub kmalloc: [u32; 3],
    /// `kmem:kmalloc_node` (before 6.1).
    pub kmalloc_node: [u32; 3],
    /// `kmem:kmem_cache_alloc`.
    pub cache_alloc: [u32; 3],
    /// `kmem:kmem_cache_alloc_node` (before 6.1).
    pub cache_alloc_node: [u32; 3],
    /// `kmem:kfree`'s `ptr`.
    pub kfree: u32,
    /// `kmem:kmem_cache_free`'s `ptr`.
    pub cache_free: u32,
    /// `kmem:mm_page_alloc`'s `pfn`.
    pub page_pfn: u32,
    /// Its `order`.
    pub page_order: u32,
    /// `kmem:mm_page_free`'s `pfn`.
    pub page_free_pfn: u32,
    /// `percpu:percpu_alloc_percpu`: `ptr`.
    pub percpu_ptr: u32,
    /// Its `bytes_alloc` (`size` before 5.19).
    pub percpu_bytes: u32,
    /// Its `call_site` (5.19+; 0 before, and then not read).
    pub percpu_call_site: u32,
    /// `percpu:percpu_free_percpu`'s `ptr`.
    pub percpu_free_ptr: u32,
}

/// A call in flight, from an allocator's entry to its return.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Pending {
    /// The size asked for; nonzero while in flight.
    pub size: u64,
    /// `posix_memalign`'s `memptr`, where the address is written.
    pub memptr: u64,
    /// The allocation's weight ([`ONE`] if every call is traced).
    pub weight: u64,
    /// Traced calls made inside this one (`mmap` inside `malloc`,
    /// `malloc` inside `PyObject_Malloc`): the outermost is the
    /// allocation.
    pub depth: u64,
}

/// An allocation held, by [`AllocKey`].
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AllocKey {
    /// The process (0 for the kernel's own allocations).
    pub tgid: u32,
    /// [`SPACE_ADDR`], [`SPACE_PAGE`] or [`SPACE_PERCPU`].
    pub space: u32,
    /// The address, or the page frame number.
    pub addr: u64,
}

/// What is known of an allocation held.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Alloc {
    /// Bytes.
    pub size: u64,
    /// `bpf_ktime_get_ns` when it was made.
    pub ts: u64,
    /// The stack it was made from, by hash in the shared stack table (0:
    /// none was walked).
    pub stack: u64,
    /// Its weight (see the module).
    pub weight: u64,
    /// The thread that made it, for `--firefox` and `--samples`.
    pub tid: u32,
    /// The CPU it was made on.
    pub cpu: u32,
}

/// The totals of one (process, stack), by [`TotalKey`].
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct TotalKey {
    /// The process (0 for the kernel's allocations).
    pub tgid: u32,
    /// Keeps `stack` aligned.
    pub _pad: u32,
    /// The stack, by hash (0 for none).
    pub stack: u64,
}

/// Allocated and freed since tracing began, estimated where sampled.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Totals {
    /// Bytes allocated.
    pub alloc_bytes: u64,
    /// Allocations, in 16.16 fixed point.
    pub allocs: u64,
    /// Bytes freed.
    pub freed_bytes: u64,
    /// Frees, in 16.16 fixed point.
    pub frees: u64,
    /// The command that made the first allocation.
    pub comm: [u8; TASK_COMM_LEN],
}

/// One call, sent with `-t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Call {
    /// `bpf_ktime_get_ns`.
    pub ts: u64,
    /// The address allocated or freed.
    pub addr: u64,
    /// Bytes (0 for a free).
    pub size: u64,
    /// An allocation's stack, by hash (0 for a free or none).
    pub stack: u64,
    /// Process id.
    pub pid: u32,
    /// 1 for an allocation, 0 for a free.
    pub alloc: u32,
    /// The command.
    pub comm: [u8; TASK_COMM_LEN],
}

crate::pod!(
    Config,
    KmemOffsets,
    Pending,
    AllocKey,
    Alloc,
    TotalKey,
    Totals,
    Call
);

/// Allocations held ([`Alloc`] by [`AllocKey`]); user space sizes it
/// (`--max-allocs`).
pub const ALLOCS: &str = "ALLOCS";
/// [`Totals`] by (process, stack) ([`TotalKey`]); user space sizes it.
pub const TOTALS: &str = "TOTALS";
/// With `--sample-bytes`: each size's weight; user space fills it.
pub const WEIGHTS: &str = "WEIGHTS";
/// With `--sample-bytes`: gaps between sampled bytes to draw from; user
/// space fills it.
pub const SAMPLE_GAPS: &str = "SAMPLE_GAPS";

/// The uprobe on `malloc`.
pub const PROG_MALLOC: &str = "malloc_enter";
/// The uprobe on `calloc`.
pub const PROG_CALLOC: &str = "calloc_enter";
/// The uprobe on `realloc`.
pub const PROG_REALLOC: &str = "realloc_enter";
/// The uprobe on `reallocarray`.
pub const PROG_REALLOCARRAY: &str = "reallocarray_enter";
/// The uprobe on `memalign` and `aligned_alloc`, under their own names
/// and allocators' prefixed ones.
pub const PROG_MEMALIGN: &str = "memalign_enter";
/// The uprobe on `posix_memalign`.
pub const PROG_POSIX_MEMALIGN: &str = "posix_memalign_enter";
/// The uprobe on `mmap`.
pub const PROG_MMAP: &str = "mmap_enter";
/// The uprobe on `free`.
pub const PROG_FREE: &str = "free_enter";
/// The uprobe on `munmap`.
pub const PROG_MUNMAP: &str = "munmap_enter";
/// The uretprobe on every allocator that returns its allocation.
pub const PROG_ALLOC_RETURN: &str = "alloc_return";
/// The program on the tracepoint `kmem:kmalloc`; the kernel-mode
/// programs are named after their tracepoint's event.
pub const PROG_KMALLOC: &str = "kmalloc";
/// The program on `kmem:kmalloc_node`.
pub const PROG_KMALLOC_NODE: &str = "kmalloc_node";
/// The program on `kmem:kmem_cache_alloc`.
pub const PROG_KMEM_CACHE_ALLOC: &str = "kmem_cache_alloc";
/// The program on `kmem:kmem_cache_alloc_node`.
pub const PROG_KMEM_CACHE_ALLOC_NODE: &str = "kmem_cache_alloc_node";
/// The program on `kmem:kfree`.
pub const PROG_KFREE: &str = "kfree";
/// The program on `kmem:kmem_cache_free`.
pub const PROG_KMEM_CACHE_FREE: &str = "kmem_cache_free";
/// The program on `kmem:mm_page_alloc`.
pub const PROG_MM_PAGE_ALLOC: &str = "mm_page_alloc";
/// The program on `kmem:mm_page_free`.
pub const PROG_MM_PAGE_FREE: &str = "mm_page_free";
/// The program on `percpu:percpu_alloc_percpu` (`--percpu`).
pub const PROG_PERCPU_ALLOC: &str = "percpu_alloc_percpu";
/// The program on `percpu:percpu_free_percpu` (`--percpu`).
pub const PROG_PERCPU_FREE: &str = "percpu_free_percpu";

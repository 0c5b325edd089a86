//! memleak: allocations still held, by address, with the stack that made
//! each; and the totals allocated and freed by stack since tracing began.
//!
//! User allocators are traced with a uprobe at each entry point (the size
//! asked for, kept by thread) and a uretprobe at its return (the address,
//! the stack walked from the caller); a free looks the address up and
//! takes it out. The kernel's own allocations come from the kmem
//! tracepoints, where address and size are in one record.
//!
//! Sampling is decided at the entry, before any stack is walked, so that
//! what is not sampled costs the trap and little else.
#![no_std]
#![no_main]

use aya_ebpf::{
    EbpfContext, Global,
    bindings::{BPF_F_NO_PREALLOC, BPF_NOEXIST},
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_prandom_u32,
        bpf_get_smp_processor_id, bpf_ktime_get_ns,
    },
    macros::{map, uprobe, uretprobe},
    maps::{Array, HashMap, PerCpuArray},
    programs::{ProbeContext, RetProbeContext, TracePointContext},
};
use rtrace_common::memleak::{
    Alloc, AllocKey, Call, Config, ERR_ALLOCS_FULL, ERR_FREE_MISSED, ERR_FREE_UNSEEN,
    ERR_PENDING_FULL, ERR_TOTALS_FULL, GAPS, ONE, Pending, SAMPLE_ALL, SAMPLE_BYTES, SAMPLE_EVERY,
    SPACE_ADDR, SPACE_PAGE, SPACE_PERCPU, TotalKey, Totals, WEIGHT_SLOTS, weight_slot,
};
use rtrace_ebpf::{EEXIST, atomic_add, count_error, global, read_user, record_field, targets};

rtrace_ebpf::event_map!();
rtrace_ebpf::cfi_programs!();
rtrace_ebpf::in_flight!(Pending, size);

/// Set by user space before load.
#[unsafe(no_mangle)]
static CONFIG: Global<Config> = Global::new(unsafe { core::mem::zeroed() });

/// Allocations held; user space sizes it (`--max-allocs`). Allocated as
/// used: a table preallocated for a million allocations would hold
/// some 100 MiB of kernel memory from the start.
#[map]
static ALLOCS: HashMap<AllocKey, Alloc> = HashMap::with_max_entries(1, BPF_F_NO_PREALLOC);
/// Totals by (process, stack); user space sizes it.
#[map]
static TOTALS: HashMap<TotalKey, Totals> = HashMap::with_max_entries(1, 0);
/// With `--sample-bytes`: each size's weight, by [`weight_slot`].
#[map]
static WEIGHTS: Array<u64> = Array::with_max_entries(WEIGHT_SLOTS as u32, 0);
/// With `--sample-bytes`: gaps between sampled bytes to draw from.
#[map]
static SAMPLE_GAPS: Array<u64> = Array::with_max_entries(GAPS as u32, 0);
/// Each CPU's countdown: bytes to the next sampled one, or calls to the
/// next sampled call.
#[map]
static COUNTDOWN: PerCpuArray<i64> = PerCpuArray::with_max_entries(1, 0);
/// Where a totals entry is put together before it is inserted.
#[map]
static TOTALS_SCRATCH: PerCpuArray<Totals> = PerCpuArray::with_max_entries(1, 0);

/// The weight of an allocation of `size` bytes if it is traced, `None`
/// if the sampling passes it by (or its size is out of bounds).
#[inline(always)]
fn chosen(size: u64) -> Option<u64> {
    let cfg = global(&CONFIG);
    if size < cfg.min_size || size > cfg.max_size {
        return None;
    }
    match cfg.sample {
        SAMPLE_ALL => Some(ONE),
        SAMPLE_EVERY => {
            let c = COUNTDOWN.get_ptr_mut(0)?;
            // SAFETY: this CPU's value; a lost update between two tasks
            // preempted on one CPU only shifts which call is sampled.
            unsafe {
                *c += 1;
                if (*c as u64) < cfg.every {
                    return None;
                }
                *c = 0;
            }
            Some(cfg.every << 16)
        }
        SAMPLE_BYTES => {
            let c = COUNTDOWN.get_ptr_mut(0)?;
            // SAFETY: as above.
            unsafe {
                // 0: never drawn on this CPU.
                if *c == 0 {
                    *c = gap();
                }
                *c -= size as i64;
                if *c > 0 {
                    return None;
                }
                *c = gap();
            }
            WEIGHTS.get(weight_slot(size) as u32).copied()
        }
        _ => None,
    }
}

/// A gap to the next sampled byte, drawn.
#[inline(always)]
fn gap() -> i64 {
    // SAFETY: the helper has no preconditions.
    let r = unsafe { bpf_get_prandom_u32() } as usize % GAPS;
    SAMPLE_GAPS.get(r as u32).map_or(1, |&g| g.max(1) as i64)
}

/// An allocator's entry: `size` bytes asked for, the address to come
/// from the return value or, for `posix_memalign`, written to `memptr`.
#[inline(always)]
fn enter(size: u64, memptr: u64) {
    if !targets::admits_current() {
        return;
    }
    // A traced call made by a traced allocator is its own business.
    if let Some(outer) = start_peek() {
        // SAFETY: this thread's call in flight.
        unsafe { (*outer).depth += 1 };
        return;
    }
    let Some(weight) = chosen(size) else {
        return;
    };
    let Some(slot) = start_slot() else {
        count_error(ERR_PENDING_FULL);
        return;
    };
    // SAFETY: this thread's slot, or this CPU's scratch value.
    unsafe {
        (*slot).memptr = memptr;
        (*slot).weight = weight;
        (*slot).depth = 0;
        // Last: nonzero marks the slot in use.
        (*slot).size = size.max(1);
    }
    if !start_commit(slot) {
        count_error(ERR_PENDING_FULL);
    }
}

/// `(tgid, tid)` of the current task.
#[inline(always)]
fn current() -> (u32, u32) {
    let id = bpf_get_current_pid_tgid();
    ((id >> 32) as u32, id as u32)
}

/// Records an allocation held at `key` and adds it to its stack's totals.
/// Not inlined: its values would otherwise count in the stack of the
/// caller's frame, which the walk's frames add to (512 bytes in all).
#[inline(never)]
fn record<C: EbpfContext>(ctx: &C, key: &AllocKey, size: u64, weight: u64, stack: u64) {
    let cfg = global(&CONFIG);
    // SAFETY: the helper has no preconditions.
    let ts = unsafe { bpf_ktime_get_ns() };
    let alloc = Alloc {
        size,
        ts,
        stack,
        weight,
        tid: current().1,
        // SAFETY: the helper has no preconditions.
        cpu: unsafe { bpf_get_smp_processor_id() },
    };
    // An address still held: its free was missed (freed by a path not
    // traced, or made before its process was traced and freed since).
    // SAFETY: the value is copied out at once.
    if let Some(old) = unsafe { ALLOCS.get(key) }.copied() {
        count_error(ERR_FREE_MISSED);
        if cfg.missing_free != 0 {
            untotal(key.tgid, &old);
        }
    }
    if ALLOCS.insert(key, alloc, 0).is_err() {
        count_error(ERR_ALLOCS_FULL);
        return;
    }
    add_totals(key.tgid, stack, size, weight);
    if cfg.trace != 0 {
        send(ctx, key, size, stack);
    }
}

/// Adds an allocation to the totals of `(tgid, stack)`.
#[inline(always)]
fn add_totals(tgid: u32, stack: u64, size: u64, weight: u64) {
    let key = TotalKey {
        tgid,
        _pad: 0,
        stack,
    };
    let bytes = size.wrapping_mul(weight) >> 16;
    if let Some(t) = TOTALS.get_ptr_mut(key) {
        // SAFETY: a map value.
        unsafe {
            atomic_add(&raw mut (*t).alloc_bytes, bytes);
            atomic_add(&raw mut (*t).allocs, weight);
        }
        return;
    }
    let Some(t) = TOTALS_SCRATCH.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: this CPU's scratch value.
    let t = unsafe { &mut *t };
    t.alloc_bytes = bytes;
    t.allocs = weight;
    t.freed_bytes = 0;
    t.frees = 0;
    t.comm = bpf_get_current_comm().unwrap_or([0; 16]);
    match TOTALS.insert(key, t, u64::from(BPF_NOEXIST)) {
        Ok(()) => {}
        // Another CPU made it between the look-up and the insert.
        Err(EEXIST) => match TOTALS.get_ptr_mut(key) {
            // SAFETY: a map value.
            Some(t) => unsafe {
                atomic_add(&raw mut (*t).alloc_bytes, bytes);
                atomic_add(&raw mut (*t).allocs, weight);
            },
            None => count_error(ERR_TOTALS_FULL),
        },
        Err(_) => count_error(ERR_TOTALS_FULL),
    }
}

/// Counts an allocation of `tgid` as freed in its stack's totals.
#[inline(always)]
fn untotal(tgid: u32, a: &Alloc) {
    let key = TotalKey {
        tgid,
        _pad: 0,
        stack: a.stack,
    };
    if let Some(t) = TOTALS.get_ptr_mut(key) {
        // SAFETY: a map value.
        unsafe {
            atomic_add(
                &raw mut (*t).freed_bytes,
                a.size.wrapping_mul(a.weight) >> 16,
            );
            atomic_add(&raw mut (*t).frees, a.weight);
        }
    }
}

/// A free of `key`; `counted`: a free of an address never seen is
/// counted (not for `munmap`, which also unmaps what no allocator made).
#[inline(always)]
fn free<C: EbpfContext>(ctx: &C, key: &AllocKey, counted: bool) {
    // SAFETY: the value is copied out at once.
    let Some(a) = (unsafe { ALLOCS.get(key) }).copied() else {
        if counted && key.addr != 0 && global(&CONFIG).sample == SAMPLE_ALL {
            count_error(ERR_FREE_UNSEEN);
        }
        return;
    };
    // Another CPU freeing the same address at once (a double free) takes
    // it out first: counted once.
    if ALLOCS.remove(key).is_err() {
        return;
    }
    untotal(key.tgid, &a);
    if global(&CONFIG).trace != 0 {
        send(ctx, key, 0, 0);
    }
}

/// `-t`: one event a call (`size` 0 for a free).
#[inline(always)]
fn send<C: EbpfContext>(ctx: &C, key: &AllocKey, size: u64, stack: u64) {
    let call = Call {
        // SAFETY: the helper has no preconditions.
        ts: unsafe { bpf_ktime_get_ns() },
        addr: key.addr,
        size,
        stack,
        pid: current().0,
        alloc: u32::from(size != 0),
        comm: bpf_get_current_comm().unwrap_or([0; 16]),
    };
    rtrace_ebpf::events::emit(&EVENTS, ctx, &call);
}

/// A user allocator's free of `addr`.
#[inline(always)]
fn user_free<C: EbpfContext>(ctx: &C, addr: u64, counted: bool) {
    if addr == 0 || !targets::admits_current() {
        return;
    }
    // A free inside a traced allocator (realloc's own) is its business.
    if start_peek().is_some() {
        return;
    }
    let key = AllocKey {
        tgid: current().0,
        space: SPACE_ADDR,
        addr,
    };
    free(ctx, &key, counted);
}

/// `n * size` as `calloc` takes them, all ones where it would not fit
/// (calloc then fails); no 128-bit multiply, which BPF lacks.
#[inline(always)]
fn product(n: u64, size: u64) -> u64 {
    if (n | size) >> 32 != 0 {
        return u64::MAX;
    }
    n * size
}

#[uprobe]
pub fn malloc_enter(ctx: ProbeContext) -> u32 {
    enter(ctx.arg::<u64>(0).unwrap_or(0), 0);
    0
}

#[uprobe]
pub fn calloc_enter(ctx: ProbeContext) -> u32 {
    let n = ctx.arg::<u64>(0).unwrap_or(0);
    let size = ctx.arg::<u64>(1).unwrap_or(0);
    enter(product(n, size), 0);
    0
}

#[uprobe]
pub fn realloc_enter(ctx: ProbeContext) -> u32 {
    // The old block goes (a failed realloc keeps it, which is rare enough
    // to count as freed, as bcc does).
    user_free(&ctx, ctx.arg::<u64>(0).unwrap_or(0), true);
    enter(ctx.arg::<u64>(1).unwrap_or(0), 0);
    0
}

#[uprobe]
pub fn reallocarray_enter(ctx: ProbeContext) -> u32 {
    user_free(&ctx, ctx.arg::<u64>(0).unwrap_or(0), true);
    let n = ctx.arg::<u64>(1).unwrap_or(0);
    let size = ctx.arg::<u64>(2).unwrap_or(0);
    enter(product(n, size), 0);
    0
}

/// `memalign(align, size)`, `aligned_alloc(align, size)`.
#[uprobe]
pub fn memalign_enter(ctx: ProbeContext) -> u32 {
    enter(ctx.arg::<u64>(1).unwrap_or(0), 0);
    0
}

#[uprobe]
pub fn posix_memalign_enter(ctx: ProbeContext) -> u32 {
    let memptr = ctx.arg::<u64>(0).unwrap_or(0);
    if memptr != 0 {
        enter(ctx.arg::<u64>(2).unwrap_or(0), memptr);
    }
    0
}

/// `mmap(addr, length, ...)`.
#[uprobe]
pub fn mmap_enter(ctx: ProbeContext) -> u32 {
    enter(ctx.arg::<u64>(1).unwrap_or(0), 0);
    0
}

/// Every allocator's return: the address, and the stack of its caller.
#[uretprobe]
pub fn alloc_return(ctx: RetProbeContext) -> u32 {
    if let Some(outer) = start_peek() {
        // SAFETY: this thread's call in flight.
        unsafe {
            if (*outer).depth > 0 {
                (*outer).depth -= 1;
                return 0;
            }
        }
    }
    let Some(p) = start_take() else {
        return 0;
    };
    let ret: u64 = ctx.ret();
    let addr = if p.memptr != 0 {
        // posix_memalign returns 0 and writes the address.
        if ret != 0 {
            return 0;
        }
        read_user::<u64>(p.memptr).unwrap_or(0)
    } else {
        ret
    };
    // NULL, or mmap's MAP_FAILED.
    if addr == 0 || addr == u64::MAX {
        return 0;
    }
    let key = AllocKey {
        tgid: current().0,
        space: SPACE_ADDR,
        addr,
    };
    let stack = rtrace_ebpf::stacks::user_stack(&ctx, &EVENTS, key.tgid, ctx.as_ptr() as *const u8);
    rtrace_ebpf::stacks::tell_first(&ctx, &EVENTS, key.tgid);
    record(&ctx, &key, p.size, p.weight, stack.unwrap_or(0));
    0
}

#[uprobe]
pub fn free_enter(ctx: ProbeContext) -> u32 {
    user_free(&ctx, ctx.arg::<u64>(0).unwrap_or(0), true);
    0
}

#[uprobe]
pub fn munmap_enter(ctx: ProbeContext) -> u32 {
    user_free(&ctx, ctx.arg::<u64>(0).unwrap_or(0), false);
    0
}

/// A kernel allocation of `size` bytes at `addr` in `space`, made by
/// the code at `call_site`.
#[inline(always)]
fn kernel_alloc(ctx: &TracePointContext, space: u32, addr: u64, size: u64, call_site: u64) {
    // rtrace's own (its map reads allocate) stay out, and so do the BPF
    // allocator's refills of the table's element caches (see
    // `Config::bpf_alloc`), which run in whatever task irq_work finds.
    let [start, end] = global(&CONFIG).bpf_alloc;
    if addr == 0 || (call_site >= start && call_site < end) || !targets::admits_current() {
        return;
    }
    let Some(weight) = chosen(size) else {
        return;
    };
    // The call site names only the nearest caller: a refill that needs a
    // new slab allocates again from inside the slab allocator (its
    // `obj_exts`), with the BPF allocator further down the stack.
    let Ok(stack) = rtrace_ebpf::stacks::kernel_stack_outside(ctx, [start, end]) else {
        return;
    };
    let key = AllocKey {
        tgid: 0,
        space,
        addr,
    };
    record(ctx, &key, size, weight, stack.unwrap_or(0));
}

/// A kernel free of `addr` in `space`.
#[inline(always)]
fn kernel_free(ctx: &TracePointContext, space: u32, addr: u64) {
    if addr == 0 {
        return;
    }
    let key = AllocKey {
        tgid: 0,
        space,
        addr,
    };
    free(ctx, &key, true);
}

/// An allocating kmem tracepoint whose `ptr`, `bytes_alloc` and
/// `call_site` are at `at`.
#[inline(always)]
fn kmem_alloc(ctx: &TracePointContext, at: [u32; 3]) {
    let addr = record_field::<u64>(ctx, at[0]).unwrap_or(0);
    let size = record_field::<u64>(ctx, at[1]).unwrap_or(0);
    let site = record_field::<u64>(ctx, at[2]).unwrap_or(0);
    kernel_alloc(ctx, SPACE_ADDR, addr, size, site);
}

rtrace_ebpf::tracepoint! {
    fn kmalloc(ctx) {
        kmem_alloc(&ctx, global(&CONFIG).kmem.kmalloc);
    }
}

rtrace_ebpf::tracepoint! {
    fn kmalloc_node(ctx) {
        kmem_alloc(&ctx, global(&CONFIG).kmem.kmalloc_node);
    }
}

rtrace_ebpf::tracepoint! {
    fn kmem_cache_alloc(ctx) {
        kmem_alloc(&ctx, global(&CONFIG).kmem.cache_alloc);
    }
}

rtrace_ebpf::tracepoint! {
    fn kmem_cache_alloc_node(ctx) {
        kmem_alloc(&ctx, global(&CONFIG).kmem.cache_alloc_node);
    }
}

rtrace_ebpf::tracepoint! {
    fn kfree(ctx) {
        let addr = record_field::<u64>(&ctx, global(&CONFIG).kmem.kfree).unwrap_or(0);
        kernel_free(&ctx, SPACE_ADDR, addr);
    }
}

rtrace_ebpf::tracepoint! {
    fn kmem_cache_free(ctx) {
        let addr = record_field::<u64>(&ctx, global(&CONFIG).kmem.cache_free).unwrap_or(0);
        kernel_free(&ctx, SPACE_ADDR, addr);
    }
}

rtrace_ebpf::tracepoint! {
    fn mm_page_alloc(ctx) {
        let o = &global(&CONFIG).kmem;
        let pfn = record_field::<u64>(&ctx, o.page_pfn).unwrap_or(0);
        let order = record_field::<u32>(&ctx, o.page_order).unwrap_or(0) & 31;
        kernel_alloc(&ctx, SPACE_PAGE, pfn, 4096u64 << order, 0);
    }
}

rtrace_ebpf::tracepoint! {
    fn mm_page_free(ctx) {
        let pfn = record_field::<u64>(&ctx, global(&CONFIG).kmem.page_free_pfn).unwrap_or(0);
        kernel_free(&ctx, SPACE_PAGE, pfn);
    }
}

rtrace_ebpf::tracepoint! {
    fn percpu_alloc_percpu(ctx) {
        let o = &global(&CONFIG).kmem;
        let addr = record_field::<u64>(&ctx, o.percpu_ptr).unwrap_or(0);
        let size = record_field::<u64>(&ctx, o.percpu_bytes).unwrap_or(0);
        let site = match o.percpu_call_site {
            0 => 0,
            at => record_field::<u64>(&ctx, at).unwrap_or(0),
        };
        kernel_alloc(&ctx, SPACE_PERCPU, addr, size, site);
    }
}

rtrace_ebpf::tracepoint! {
    fn percpu_free_percpu(ctx) {
        let addr = record_field::<u64>(&ctx, global(&CONFIG).kmem.percpu_free_ptr).unwrap_or(0);
        kernel_free(&ctx, SPACE_PERCPU, addr);
    }
}

//! CPU profiling: a program on a sampling perf event (one per CPU) that
//! counts samples by process and stacks.
//!
//! Stacks come from `bpf_get_stack` and are named by a hash computed here,
//! not by `bpf_get_stackid`, whose bucket index drops a stack whenever two
//! share a bucket (bcc #3389). Counting happens here, so only distinct
//! stacks travel to user space, and only once, at the end. The one event
//! sent while sampling is [`Seen`], so that user space can capture a new
//! process's memory map and JIT symbols while the process still lives.
#![no_std]
#![no_main]

use aya_ebpf::{
    EbpfContext, Global,
    bindings::{BPF_F_USER_STACK, BPF_NOEXIST},
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid, generated::bpf_get_stack},
    macros::{map, perf_event},
    maps::{HashMap, PerCpuArray},
    programs::PerfEventContext,
};
use rtrace_common::profile::{
    Config, ERR_COUNTS_FULL, ERR_KERNEL_STACK, ERR_STACKS_FULL, ERR_USER_STACK, Key, MAX_DEPTH,
    MISSED_KERNEL, MISSED_USER, Seen, Stack,
};
use rtrace_ebpf::{EEXIST, count_error, count_key, events::emit, targets};

rtrace_ebpf::event_map!();

#[unsafe(no_mangle)]
static CONFIG: Global<Config> = Global::new(Config {
    include_idle: 0,
    user: 0,
    kernel: 0,
});

/// Samples by [`Key`]. Preallocated, since a perf event program may run in
/// NMI context, where the kernel cannot allocate.
#[map]
static COUNTS: HashMap<Key, u64> = HashMap::with_max_entries(40960, 0);
/// Stacks by hash; user space sizes it (`--stack-storage-size`).
#[map]
static STACKS: HashMap<u64, Stack> = HashMap::with_max_entries(16384, 0);
/// Where a stack is walked: it is larger than the eBPF stack.
#[map]
static SCRATCH: PerCpuArray<Stack> = PerCpuArray::with_max_entries(1, 0);

#[perf_event]
pub fn profile(ctx: PerfEventContext) -> u32 {
    sample(&ctx);
    0
}

#[inline(always)]
fn sample(ctx: &PerfEventContext) {
    let cfg = CONFIG.load();
    let id = bpf_get_current_pid_tgid();
    let (tid, tgid) = (id as u32, (id >> 32) as u32);
    if tid == 0 && cfg.include_idle == 0 {
        return;
    }
    if !targets::admits(tgid, tid) {
        return;
    }
    let mut key = Key {
        tgid,
        flags: 0,
        user: 0,
        kernel: 0,
        comm: bpf_get_current_comm().unwrap_or([0; 16]),
    };
    if cfg.kernel != 0 {
        match stack(ctx, 0, ERR_KERNEL_STACK) {
            Some(h) => key.kernel = h,
            None => key.flags |= MISSED_KERNEL,
        }
    }
    if cfg.user != 0 {
        match stack(ctx, u64::from(BPF_F_USER_STACK), ERR_USER_STACK) {
            Some(h) => key.user = h,
            None => key.flags |= MISSED_USER,
        }
    }
    match count_key(&COUNTS, &key) {
        Some(true) => emit(&EVENTS, ctx, &Seen { tgid, _pad: 0 }),
        Some(false) => {}
        None => count_error(ERR_COUNTS_FULL),
    }
}

/// Walks one stack, stores it in `STACKS` and returns its hash: 0 for an
/// empty stack, `None` if it could not be walked or stored.
#[inline(always)]
fn stack(ctx: &PerfEventContext, flags: u64, walk_error: u32) -> Option<u64> {
    let s = SCRATCH.get_ptr_mut(0)?;
    // SAFETY: `s` is a map value with room for `MAX_DEPTH` frames; the
    // helper zeroes what it does not fill.
    let n = unsafe {
        bpf_get_stack(
            ctx.as_ptr(),
            (&raw mut (*s).ips).cast(),
            (MAX_DEPTH * 8) as u32,
            flags,
        )
    };
    if n < 0 {
        count_error(walk_error);
        return None;
    }
    let len = n as u64 / 8;
    if len == 0 {
        return Some(0);
    }
    // FNV-1a over whole frames, then a final mix so that stacks differing
    // only in their last frame still spread over all 64 bits.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for i in 0..MAX_DEPTH {
        if i as u64 >= len {
            break;
        }
        // SAFETY: `i < MAX_DEPTH`, inside the map value.
        let ip = unsafe { (*s).ips[i] };
        h = (h ^ ip).wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h |= 1;
    // SAFETY: `s` is a map value.
    unsafe { (*s).len = len };
    // By reference: a copy would not fit on the eBPF stack.
    let walked: &Stack = unsafe { &*s };
    match STACKS.insert(h, walked, u64::from(BPF_NOEXIST)) {
        Ok(()) => Some(h),
        Err(e) if e == EEXIST => Some(h),
        Err(_) => {
            count_error(ERR_STACKS_FULL);
            None
        }
    }
}

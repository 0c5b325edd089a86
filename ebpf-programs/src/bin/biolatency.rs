//! Block I/O latency: from a request's issue to the device (or its insert
//! into the queue, with `-Q`) to its completion, as histograms.
//!
//! Three sets of programs do the same job, one per attach mechanism. The
//! BTF and raw tracepoint sets see `struct request` pointers, read through
//! offsets from BTF; before 5.11 `block_rq_insert` and `block_rq_issue`
//! passed the request queue first, so those come in two forms (`_q`):
//! a program may not even mention an argument its tracepoint lacks. The classic
//! tracepoint set keys requests by device and sector, as its records have
//! no request address.
#![no_std]
#![no_main]

#[cfg(feature = "atomics")]
use aya_ebpf::maps::Array;
use aya_ebpf::{
    EbpfContext, Global,
    bindings::{BPF_ANY, BPF_NOEXIST},
    helpers::bpf_ktime_get_ns,
    macros::{btf_tracepoint, map, raw_tracepoint},
    maps::{HashMap, LruHashMap, PerCpuArray},
    programs::{BtfTracePointContext, RawTracePointContext, TracePointContext},
};
use rtrace_common::{
    biolatency::{Config, ERR_HIST_UPDATE, ERR_START_UPDATE, Entry, FLAGS_RWBS, HistKey, StartKey},
    offsets::MISSING,
};
#[cfg(feature = "atomics")]
use rtrace_ebpf::{compare_exchange, exchange};
use rtrace_ebpf::{
    count_error, get_or_insert, global, hist_record_local, hist_record_shared, read_kernel, targets,
};

/// `-EEXIST`: with `-Q`, the insert already started the clock.
const EEXIST: i64 = -17;

#[unsafe(no_mangle)]
static CONFIG: Global<Config> = Global::new(unsafe { core::mem::zeroed() });

/// Start times of requests in flight; user space sets the size.
#[map]
static START: HashMap<StartKey, u64> = HashMap::with_max_entries(65536, 0);
/// The histograms, by disk and flags as the options ask.
#[map]
static HISTS: HashMap<HistKey, Entry> = HashMap::with_max_entries(4096, 0);
/// Bios submitted by tasks in scope, by the key their request will have
/// (the bio's address, or its device and first sector for the tracepoint
/// programs), until a request they head starts. A bio merged into
/// another's request heads none: least recently used ones go first.
#[map]
static SUBMITTED: LruHashMap<StartKey, u8> = LruHashMap::with_max_entries(65536, 0);

/// A zeroed histogram to create new ones from.
#[map]
static ZERO: PerCpuArray<Entry> = PerCpuArray::with_max_entries(1, 0);
/// The one histogram when not split by disk or flags, per CPU: no hash
/// lookup and no atomic operation on the completion path.
#[map]
static TOTAL: PerCpuArray<Entry> = PerCpuArray::with_max_entries(1, 0);

#[cfg(feature = "atomics")]
/// log2 of the number of [`SLOTS`].
const SLOT_BITS: u32 = 12;

#[cfg(feature = "atomics")]
/// A request in flight and when its clock started; `rq` is 0 when free.
#[repr(C)]
struct Slot {
    rq: u64,
    ts: u64,
}

#[cfg(feature = "atomics")]
/// Start times of requests in flight by address, in a slot chosen by
/// hashing it: an array lookup, which the verifier inlines, and one cache
/// line, where a hash map update takes a bucket lock and an element from
/// its free list and touches several lines. Both ends of an I/O were
/// mostly those cache misses. A request whose slot is taken by another in
/// flight goes to [`START`]. Claiming a slot takes a compare-and-exchange
/// (5.12); before, every request goes to `START`.
#[map]
static SLOTS: Array<Slot> = Array::with_max_entries(1 << SLOT_BITS, 0);

#[cfg(feature = "atomics")]
/// The slot `rq` hashes to (Fibonacci hashing: requests lie a few hundred
/// bytes apart, and the multiplication spreads them over every slot).
#[inline(always)]
fn slot_of(rq: u64) -> Option<*mut Slot> {
    let i = (rq.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - SLOT_BITS)) as u32;
    SLOTS.get_ptr_mut(i)
}

#[cfg(feature = "atomics")]
/// Starts `rq`'s clock in its slot, if the slot is free or already its
/// own; `false` if another request holds it.
#[inline(always)]
fn slot_start(rq: u64, now: u64) -> bool {
    let Some(s) = slot_of(rq) else { return false };
    // SAFETY: `s` is a SLOTS value; the exchange claims it against issues
    // on other CPUs. A request completes only after its issue returned, so
    // the time written after the claim is there when its completion looks.
    unsafe {
        let held = compare_exchange(&raw mut (*s).rq, 0, rq);
        if held != 0 && held != rq {
            return false;
        }
        (*s).ts = now;
    }
    true
}

#[cfg(feature = "atomics")]
/// Takes `rq`'s start time out of its slot, if it is there.
#[inline(always)]
fn slot_take(rq: u64) -> Option<u64> {
    let s = slot_of(rq)?;
    // SAFETY: `s` is a SLOTS value. Only this request's completion frees
    // the slot while it holds it.
    unsafe {
        if (*s).rq != rq {
            return None;
        }
        let then = (*s).ts;
        exchange(&raw mut (*s).rq, 0);
        Some(then)
    }
}

/// The clock starts for `key`, on the device `dev` gives; `insert` says
/// whether the request is entering the queue rather than going to the
/// device. The device is read only if `-d` needs it: every kernel read
/// is a helper call, and they were most of the programs' time. A request
/// known by its address goes to [`SLOTS`] where it can; not with `-Q`,
/// where its insert and its issue could find its slot taken and free in
/// turn, and it would be in both tables.
#[inline(always)]
fn start(
    key: StartKey,
    dev: impl FnOnce() -> u32,
    submitter: impl FnOnce() -> StartKey,
    insert: bool,
) {
    let cfg = global(&CONFIG);
    if cfg.filter_dev != 0 && dev() != cfg.dev {
        return;
    }
    if cfg.by_submitter != 0 {
        let bio = submitter();
        if SUBMITTED.get_ptr(bio).is_none() {
            return;
        }
        let _ = SUBMITTED.remove(bio);
    } else if !targets::current_in_cgroup() {
        return;
    }
    // With -Q a request that went through the queue keeps its insert time;
    // one that bypassed it starts at issue.
    let flags = if cfg.queued != 0 && !insert {
        BPF_NOEXIST
    } else {
        BPF_ANY
    };
    let now = unsafe { bpf_ktime_get_ns() };
    #[cfg(feature = "atomics")]
    if by_address(&key) && cfg.queued == 0 && slot_start(key.id, now) {
        return;
    }
    match START.insert(key, now, u64::from(flags)) {
        Ok(()) => {}
        Err(e) if i64::from(e) == EEXIST && flags == BPF_NOEXIST => {}
        Err(_) => count_error(ERR_START_UPDATE),
    }
}

/// The request `key` completed, on the device `dev` gives, with the flags
/// `flags` gives; each is read only if the histograms are split by it.
#[inline(always)]
fn done(key: StartKey, dev: impl FnOnce() -> u32, flags: impl FnOnce() -> u64) {
    #[cfg(feature = "atomics")]
    let slotted = if by_address(&key) && global(&CONFIG).queued == 0 {
        slot_take(key.id)
    } else {
        None
    };
    #[cfg(not(feature = "atomics"))]
    let slotted = None;
    let then = match slotted {
        Some(then) => then,
        None => {
            let Some(t) = START.get_ptr(key) else {
                return;
            };
            // SAFETY: `t` is a START value, read before it is removed.
            let then = unsafe { *t };
            let _ = START.remove(key);
            then
        }
    };
    let now = unsafe { bpf_ktime_get_ns() };
    if now < then {
        return;
    }
    let cfg = global(&CONFIG);
    let delta = (now - then) / if cfg.unit_ns > 1 { cfg.unit_ns } else { 1 };
    if cfg.per_disk == 0 && cfg.per_flags == 0 {
        if let Some(h) = TOTAL.get_ptr_mut(0) {
            // SAFETY: this CPU's TOTAL value; a program does not nest in
            // itself on one CPU.
            unsafe { hist_record_local(h, delta) };
        }
        return;
    }
    let hkey = HistKey {
        dev: if cfg.per_disk != 0 { dev() } else { 0 },
        _pad: 0,
        flags: if cfg.per_flags != 0 { flags() } else { 0 },
    };
    let Some((h, _)) = get_or_insert(&HISTS, &hkey, &ZERO) else {
        count_error(ERR_HIST_UPDATE);
        return;
    };
    // SAFETY: `h` is a HISTS value.
    unsafe { hist_record_shared(h, delta) };
}

/// A request's disk as a kernel `dev_t`.
#[inline(always)]
fn rq_dev(rq: *const u8) -> u32 {
    let o = &global(&CONFIG).rq;
    let disk = if o.q_disk != MISSING {
        let q = read_kernel::<*const u8>(rq, o.q).unwrap_or(core::ptr::null());
        read_kernel::<*const u8>(q, o.q_disk)
    } else {
        read_kernel::<*const u8>(rq, o.rq_disk)
    }
    .unwrap_or(core::ptr::null());
    let major = read_kernel::<u32>(disk, o.major).unwrap_or(0);
    let minor = read_kernel::<u32>(disk, o.first_minor).unwrap_or(0);
    (major << 20) | minor
}

/// Whether `key` is a request's address rather than a device and sector.
#[cfg(feature = "atomics")]
#[inline(always)]
fn by_address(key: &StartKey) -> bool {
    key.dev == 0
}

fn rq_key(rq: *const u8) -> StartKey {
    StartKey {
        id: rq as u64,
        dev: 0,
        _pad: 0,
    }
}

#[inline(always)]
fn typed_start(rq: *const u8, insert: bool) {
    let bio = || {
        let first = read_kernel::<u64>(rq, global(&CONFIG).rq.bio).unwrap_or(0);
        rq_key(first as *const u8)
    };
    start(rq_key(rq), || rq_dev(rq), bio, insert);
}

/// Notes the bio of `key` (see [`SUBMITTED`]), being submitted, if its
/// submitter is in scope.
#[inline(always)]
fn submitted(key: StartKey) {
    if targets::current_in_cgroup() {
        let _ = SUBMITTED.insert(key, 1, 0);
    }
}

#[inline(always)]
fn typed_done(rq: *const u8) {
    let flags = || u64::from(read_kernel::<u32>(rq, global(&CONFIG).rq.cmd_flags).unwrap_or(0));
    done(rq_key(rq), || rq_dev(rq), flags);
}

/// Argument `n` of a BTF tracepoint, the request. The verifier lets no
/// arithmetic touch a typed pointer, and the slot's hash needs its address
/// as a number: read from the context by a helper, it is one.
#[inline(always)]
fn btf_arg(ctx: &BtfTracePointContext, n: u32) -> *const u8 {
    #[cfg(feature = "atomics")]
    {
        read_kernel::<u64>(ctx.as_ptr() as *const u8, n * 8).unwrap_or(0) as *const u8
    }
    #[cfg(not(feature = "atomics"))]
    {
        ctx.arg(n as usize)
    }
}

/// A bio's address as a number, for a key: read from the context by a
/// helper, as a typed pointer may not be stored.
#[inline(always)]
fn btf_arg_value(ctx: &BtfTracePointContext, n: u32) -> u64 {
    read_kernel::<u64>(ctx.as_ptr() as *const u8, n * 8).unwrap_or(0)
}

#[btf_tracepoint(function = "block_bio_queue")]
pub fn btf_block_bio_queue(ctx: BtfTracePointContext) -> i32 {
    submitted(rq_key(btf_arg_value(&ctx, 0) as *const u8));
    0
}

/// Before 5.11 the request queue came first.
#[btf_tracepoint(function = "block_bio_queue")]
pub fn btf_block_bio_queue_q(ctx: BtfTracePointContext) -> i32 {
    submitted(rq_key(btf_arg_value(&ctx, 1) as *const u8));
    0
}

#[btf_tracepoint(function = "block_rq_insert")]
pub fn btf_block_rq_insert(ctx: BtfTracePointContext) -> i32 {
    typed_start(btf_arg(&ctx, 0), true);
    0
}

/// Before 5.11 the request queue came first.
#[btf_tracepoint(function = "block_rq_insert")]
pub fn btf_block_rq_insert_q(ctx: BtfTracePointContext) -> i32 {
    typed_start(btf_arg(&ctx, 1), true);
    0
}

#[btf_tracepoint(function = "block_rq_issue")]
pub fn btf_block_rq_issue(ctx: BtfTracePointContext) -> i32 {
    typed_start(btf_arg(&ctx, 0), false);
    0
}

/// Before 5.11 the request queue came first.
#[btf_tracepoint(function = "block_rq_issue")]
pub fn btf_block_rq_issue_q(ctx: BtfTracePointContext) -> i32 {
    typed_start(btf_arg(&ctx, 1), false);
    0
}

#[btf_tracepoint(function = "block_rq_complete")]
pub fn btf_block_rq_complete(ctx: BtfTracePointContext) -> i32 {
    typed_done(btf_arg(&ctx, 0));
    0
}

#[raw_tracepoint(tracepoint = "block_bio_queue")]
pub fn raw_block_bio_queue(ctx: RawTracePointContext) -> i32 {
    submitted(rq_key(ctx.arg(0)));
    0
}

/// Before 5.11 the request queue came first.
#[raw_tracepoint(tracepoint = "block_bio_queue")]
pub fn raw_block_bio_queue_q(ctx: RawTracePointContext) -> i32 {
    submitted(rq_key(ctx.arg(1)));
    0
}

#[raw_tracepoint(tracepoint = "block_rq_insert")]
pub fn raw_block_rq_insert(ctx: RawTracePointContext) -> i32 {
    typed_start(ctx.arg(0), true);
    0
}

/// Before 5.11 the request queue came first.
#[raw_tracepoint(tracepoint = "block_rq_insert")]
pub fn raw_block_rq_insert_q(ctx: RawTracePointContext) -> i32 {
    typed_start(ctx.arg(1), true);
    0
}

#[raw_tracepoint(tracepoint = "block_rq_issue")]
pub fn raw_block_rq_issue(ctx: RawTracePointContext) -> i32 {
    typed_start(ctx.arg(0), false);
    0
}

/// Before 5.11 the request queue came first.
#[raw_tracepoint(tracepoint = "block_rq_issue")]
pub fn raw_block_rq_issue_q(ctx: RawTracePointContext) -> i32 {
    typed_start(ctx.arg(1), false);
    0
}

#[raw_tracepoint(tracepoint = "block_rq_complete")]
pub fn raw_block_rq_complete(ctx: RawTracePointContext) -> i32 {
    typed_done(ctx.arg(0));
    0
}

/// Reads a record's device and sector at the given offsets.
#[inline(always)]
fn record_key<C: EbpfContext>(ctx: &C, dev: u32, sector: u32) -> Option<(StartKey, u32)> {
    let ctx = ctx.as_ptr() as *const u8;
    let dev = read_kernel::<u32>(ctx, dev).ok()?;
    let sector = read_kernel::<u64>(ctx, sector).ok()?;
    Some((
        StartKey {
            id: sector,
            dev,
            _pad: 0,
        },
        dev,
    ))
}

#[inline(always)]
fn record_start(ctx: &TracePointContext, insert: bool) {
    let tp = &global(&CONFIG).tp;
    if let Some((key, dev)) = record_key(ctx, tp.dev, tp.sector) {
        start(key, || dev, || key, insert);
    }
}

rtrace_ebpf::tracepoint! {
    /// A bio's device and first sector are its request's, where it heads one
    /// (on a whole disk: a partition's bio keeps the partition's device).
    fn tp_block_bio_queue(ctx) {
        let tp = &global(&CONFIG).tp;
        if let Some((key, _)) = record_key(&ctx, tp.bio_dev, tp.bio_sector) {
            submitted(key);
        }
    }
}

rtrace_ebpf::tracepoint! {
    fn tp_block_rq_insert(ctx) {
        record_start(&ctx, true);
    }
}

rtrace_ebpf::tracepoint! {
    fn tp_block_rq_issue(ctx) {
        record_start(&ctx, false);
    }
}

rtrace_ebpf::tracepoint! {
    fn tp_block_rq_complete(ctx) {
        let tp = &global(&CONFIG).tp;
        if let Some((key, dev)) = record_key(&ctx, tp.done_dev, tp.done_sector) {
            // The first 7 bytes of `rwbs` are enough for every flag letter.
            let flags = || {
                let rwbs = read_kernel::<u64>(ctx.as_ptr() as *const u8, tp.done_rwbs).unwrap_or(0);
                (rwbs & 0x00ff_ffff_ffff_ffff) | FLAGS_RWBS
            };
            done(key, || dev, flags);
        }
    }
}

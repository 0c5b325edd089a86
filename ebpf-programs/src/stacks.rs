//! Stacks counted in the kernel, for the tools that aggregate by stack
//! (profile, offcputime): the maps user space's stack store drains, the
//! walks, and the hash a stack is named by.
//!
//! Stacks come from `bpf_get_stack` or the CFI walk and are named by a
//! hash computed here, not by `bpf_get_stackid`, whose bucket index drops
//! a stack whenever two share a bucket (bcc #3389). Counting happens here,
//! so only distinct stacks travel to user space. The one event sent while
//! counting is [`Seen`], so that user space can capture a new process's
//! memory map and symbols while the process still lives.

use aya_ebpf::{
    EbpfContext,
    bindings::{BPF_F_USER_STACK, BPF_NOEXIST},
    helpers::{
        bpf_get_current_comm, bpf_ktime_get_ns,
        generated::{bpf_get_stack, bpf_get_task_stack, bpf_probe_read_kernel},
    },
    macros::map,
    maps::{Array, HashMap, PerCpuArray},
};
use rtrace_common::profile::HEAT_SLOT_NS;
use rtrace_common::stacks::{
    CONTINUED, ERR_COUNTS_FULL, ERR_KERNEL_STACK, ERR_STACKS_FULL, ERR_USER_STACK, Key, MAX_DEPTH,
    MAX_TIMED, NEW_COUNTS, NEW_STACKS, SEGMENT_FRAMES, SLOT_SHIFT, Seen, Stack, WakeKey,
};
use rtrace_common::unwind::RUNTIMES_ALL;

#[cfg(feature = "cfi")]
use crate::scratch::Storing;
use crate::{
    EEXIST, atomic_add, count_error,
    events::Sink,
    scratch::{HASH_SEED, Scratch, fnv},
};

/// Defines `STACK_COUNTS`, the counts by key (`Key` for profile: samples;
/// `WakeKey` for offcputime: nanoseconds), in the tool that counts: each
/// tool has its own key, and a tool that counts no stacks no such map.
/// Preallocated, since a perf event program may run in NMI context, where
/// the kernel cannot allocate; user space sizes it.
#[macro_export]
macro_rules! stack_counts {
    ($key:ty) => {
        #[aya_ebpf::macros::map]
        static STACK_COUNTS: aya_ebpf::maps::HashMap<$key, u64> =
            aya_ebpf::maps::HashMap::with_max_entries(1, 0);
    };
}

/// A key stacks are counted by: the process counted, and the waker's
/// where the key has one, each told to user space once a generation.
pub trait Counted {
    /// The process whose stacks are counted.
    fn counted(&self) -> &Key;
    /// The other process named by the key, if any.
    fn other(&self) -> Option<&Key> {
        None
    }
}

impl Counted for Key {
    fn counted(&self) -> &Key {
        self
    }
}

impl Counted for WakeKey {
    fn counted(&self) -> &Key {
        &self.key
    }
    fn other(&self) -> Option<&Key> {
        self.has_waker().then_some(&self.waker)
    }
}
/// The generation counts go to, counted up by user space when it moves the
/// last one's counts out.
#[map]
static STACK_GEN: Array<u32> = Array::with_max_entries(1, 0);
/// Stacks by hash; user space sizes it (`--stack-storage-size`) and moves
/// them out as the tool runs.
#[map]
static STACKS: HashMap<u64, Stack> = HashMap::with_max_entries(1, 0);
/// Entries created in `STACKS` and `STACK_COUNTS` (`NEW_STACKS`,
/// `NEW_COUNTS`), so that user space moves the tables out as they fill,
/// not on a clock: at a low rate a second's few new entries are not worth
/// a walk of every bucket, nor the stacks stored again after it.
#[map]
static STACK_NEW: PerCpuArray<u64> = PerCpuArray::with_max_entries(2, 0);
/// Processes whose stacks are counted by time slot ([`Key::slot`]): user
/// space puts those whose jitdumps name code by time here.
#[map]
static TIMED_JIT: HashMap<u32, u8> = HashMap::with_max_entries(MAX_TIMED, 0);
/// Where a stack is walked: it is larger than the eBPF stack.
#[map]
static STACK_SCRATCH: PerCpuArray<Scratch> = PerCpuArray::with_max_entries(1, 0);

/// Slot 0: when counting began (`CLOCK_MONOTONIC` nanoseconds), written by
/// user space just before the programs are attached: the time zero of
/// profile's heat map and `--range`, and of counts by time slot.
#[map]
pub static WINDOW: Array<u64> = Array::with_max_entries(1, 0);

/// The heat map slot of `now`, 1-based from the start in `WINDOW` (0
/// while it is not set): a key's [`Key::slot`] where counts are kept by
/// time, in place of the jitdump's coarser slot, which user space then
/// derives from it.
#[inline(always)]
pub fn time_slot(now: u64) -> u32 {
    match WINDOW.get(0) {
        Some(&start) if start != 0 => (now.saturating_sub(start) / HEAT_SLOT_NS + 1) as u32,
        _ => 0,
    }
}

/// The generation to count in now.
#[inline(always)]
pub fn generation() -> u32 {
    STACK_GEN.get(0).copied().unwrap_or(0)
}

/// Adds `value` to the count of `key` in `counts` (`STACK_COUNTS`); the
/// first count of a process in a generation tells user space ([`Seen`]). A
/// full table is counted.
#[inline(always)]
pub fn add<C: EbpfContext, S: Sink, K: Counted>(
    ctx: &C,
    events: &S,
    counts: &HashMap<K, u64>,
    key: &K,
    value: u64,
) {
    if let Some(c) = counts.get_ptr_mut(key) {
        // SAFETY: a map value.
        unsafe { atomic_add(c, value) };
        return;
    }
    match counts.insert(key, value, u64::from(BPF_NOEXIST)) {
        Ok(()) => {
            count_new(NEW_COUNTS);
            let generation = u32::from(key.counted().generation);
            for k in [Some(key.counted()), key.other()].into_iter().flatten() {
                if k.tgid != 0 && first_in_generation(k.tgid, generation) {
                    crate::events::emit(events, ctx, &Seen::new(k.tgid, k.born, 0));
                }
            }
        }
        // Another CPU created it between the lookup and the insert.
        Err(EEXIST) => match counts.get_ptr_mut(key) {
            // SAFETY: a map value.
            Some(c) => unsafe { atomic_add(c, value) },
            None => count_error(ERR_COUNTS_FULL),
        },
        Err(_) => count_error(ERR_COUNTS_FULL),
    }
}

/// Tells user space of `tgid` the first time in a generation it has a
/// stack walked, at once, so that it reads the process's mappings while
/// the process lives: for tools that send a stack an event rather than
/// count them ([`add`] tells its own). With the CFI walk only: without
/// it, every event would tell.
#[inline(always)]
pub fn tell_first<C: EbpfContext, S: Sink>(ctx: &C, events: &S, tgid: u32) {
    #[cfg(feature = "cfi")]
    if first_in_generation(tgid, generation()) {
        crate::events::emit_now(
            events,
            ctx,
            &Seen::new(tgid, crate::process::born_seldom(), 0),
        );
    }
    let _ = (ctx, events, tgid);
}

/// Counts an entry created in slot `which` of `STACK_NEW`.
#[inline(always)]
fn count_new(which: u32) {
    if let Some(p) = STACK_NEW.get_ptr_mut(which) {
        // SAFETY: per-CPU value, and programs do not nest on one CPU here.
        unsafe { *p += 1 };
    }
}

/// Whether this is the process's first new stack in this generation: user
/// space needs to hear of a process once a generation, not of each of its
/// stacks. With the CFI walk, exec and fork are told separately and code
/// new to a process too, so this is only to capture its symbols while it
/// lives; without it, every new stack tells.
#[inline(always)]
fn first_in_generation(tgid: u32, generation: u32) -> bool {
    #[cfg(feature = "cfi")]
    {
        // SAFETY: a map value.
        if crate::cfi::SEEN
            .get_ptr(tgid)
            .is_some_and(|g| unsafe { *g } == generation)
        {
            return false;
        }
        let _ = crate::cfi::SEEN.insert(tgid, generation, 0);
    }
    let _ = (tgid, generation);
    true
}

/// Describes the current thread in `key`: its process, command and the
/// stacks asked for (`sampled`: see [`user_stack`]), in generation 0.
#[inline(always)]
pub fn describe_current<C: EbpfContext, S: Sink>(
    ctx: &C,
    events: &S,
    tgid: u32,
    kernel: bool,
    user: bool,
    sampled: *const u8,
    key: &mut Key,
) {
    describe_current_walking::<C, S, RUNTIMES_ALL>(ctx, events, tgid, kernel, user, sampled, key);
}

/// [`describe_current`] with a walk that steps through the frames of
/// runtimes `RT` only (`rtrace_common::unwind::Runtimes`): the others'
/// parts are not compiled in, so the verifier does not go through them.
/// Without the `cfi` feature `RT` changes nothing.
#[inline(always)]
pub fn describe_current_walking<C: EbpfContext, S: Sink, const RT: u32>(
    ctx: &C,
    events: &S,
    tgid: u32,
    kernel: bool,
    user: bool,
    sampled: *const u8,
    key: &mut Key,
) {
    *key = Key::new(tgid, bpf_get_current_comm().unwrap_or([0; 16]));
    // Before the walk: its states branch, and the verifier would check
    // the leader's load (a pointer member, whose trust it looks up by name
    // through the kernel's BTF) again for each way the walk ends.
    key.born = crate::process::born();
    // SAFETY: the value is only tested for presence.
    if unsafe { TIMED_JIT.get(tgid) }.is_some() {
        // SAFETY: a helper without arguments.
        key.slot = (unsafe { bpf_ktime_get_ns() } >> SLOT_SHIFT) as u32;
    }
    // The user stack first: its walk is most of what the verifier
    // follows, once from here, where the kernel stack's outcomes would
    // have it followed once for each.
    if user {
        let (stack, cut) = user_stack_cut_walking::<C, S, RT>(ctx, events, tgid, sampled);
        // Here, once, not in the walk's step, which the verifier goes
        // through again for every state it reaches it in.
        #[cfg(feature = "cfi")]
        crate::cfi::count_unloaded::<RT>(tgid);
        key.set_user(stack);
        if cut {
            key.flags |= rtrace_common::stacks::CUT_USER;
        }
    }
    if kernel {
        key.set_kernel(kernel_stack(ctx));
    }
}

/// The kernel stack of the current task, stored: its hash (0 for none),
/// `None` if it could not be walked or stored.
#[inline(always)]
pub fn kernel_stack<C: EbpfContext>(ctx: &C) -> Option<u64> {
    get_stack(ctx, 0, ERR_KERNEL_STACK)
}

/// A kernel stack that passed through the text a caller leaves out.
pub struct Through;

/// The kernel stack of the current task, as [`kernel_stack`], unless one
/// of its frames lies in `text` (`[start, end)`): then nothing is stored.
/// A tool leaves out this way what a range of kernel code does however
/// deep below it, where the call site alone names only the nearest caller.
#[inline(always)]
pub fn kernel_stack_outside<C: EbpfContext>(
    ctx: &C,
    text: [u64; 2],
) -> Result<Option<u64>, Through> {
    let Some(s) = STACK_SCRATCH.get_ptr_mut(0) else {
        return Ok(None);
    };
    // SAFETY: a map value, with room for `MAX_DEPTH` frames and more.
    let ips = unsafe { &raw mut (*s).frames.ips };
    // SAFETY: `ips` has room for the size given; the helper zeroes what
    // it does not fill.
    let n = unsafe { bpf_get_stack(ctx.as_ptr(), ips.cast(), (MAX_DEPTH * 8) as u32, 0) };
    let span = text[1].wrapping_sub(text[0]);
    let mut through = false;
    for i in 0..MAX_DEPTH {
        // SAFETY: `i < MAX_DEPTH`, inside the map value.
        through |= unsafe { (*ips)[i] }.wrapping_sub(text[0]) < span;
    }
    if through {
        return Err(Through);
    }
    Ok(hash_and_store(s, n, ERR_KERNEL_STACK))
}

/// The kernel stack of `task`, which is not running (it was switched
/// out and has not run since), walked from where it stopped, stored: its
/// hash (0 for none), `None` if it could not be walked or stored. `task`
/// must be a BTF-typed pointer (tp_btf's arguments).
#[inline(always)]
pub fn task_kernel_stack(task: *const u8) -> Option<u64> {
    // SAFETY: `buf` has room for `size` bytes; the helper copes with any
    // task.
    walk_and_store(ERR_KERNEL_STACK, |buf, size| unsafe {
        bpf_get_task_stack(task as *mut _, buf, size, 0)
    })
}

/// The user stack of the current task, stored: walked from the process's
/// CFI tables where user space has loaded them (the `cfi` objects), else
/// by the kernel's frame-pointer walk. `sampled` is a perf event's
/// registers, used where the sample hit user mode; otherwise the walk
/// starts from the registers the task entered the kernel with.
#[inline(always)]
pub fn user_stack<C: EbpfContext, S: Sink>(
    ctx: &C,
    events: &S,
    tgid: u32,
    sampled: *const u8,
) -> Option<u64> {
    user_stack_cut(ctx, events, tgid, sampled).0
}

/// [`user_stack`], and whether the CFI walk was cut short by a stack word
/// it could not read (the kernel's frame-pointer walk does not tell).
#[inline(always)]
pub fn user_stack_cut<C: EbpfContext, S: Sink>(
    ctx: &C,
    events: &S,
    tgid: u32,
    sampled: *const u8,
) -> (Option<u64>, bool) {
    user_stack_cut_walking::<C, S, RUNTIMES_ALL>(ctx, events, tgid, sampled)
}

/// [`user_stack_cut`] with a walk of runtimes `RT` only (see
/// [`describe_current_walking`]).
#[inline(always)]
fn user_stack_cut_walking<C: EbpfContext, S: Sink, const RT: u32>(
    ctx: &C,
    events: &S,
    tgid: u32,
    sampled: *const u8,
) -> (Option<u64>, bool) {
    #[cfg(feature = "cfi")]
    {
        let Some(s) = STACK_SCRATCH.get_ptr_mut(0) else {
            return (None, false);
        };
        let regs = crate::cfi::stash_regs(s, sampled);
        let who = u64::from(tgid) | (u64::from(generation()) << 32);
        // SAFETY: the object defines it (`cfi_programs!`); it takes and
        // returns plain numbers.
        // (`RT` is a constant: one call is compiled.)
        #[cfg(feature = "cfi_global")]
        let walked = unsafe {
            match RT {
                0 => rtrace_global_user_stack_native(who, regs),
                rtrace_common::unwind::RUNTIME_PYTHON => rtrace_global_user_stack_python(who, regs),
                rtrace_common::unwind::RUNTIME_JAVA => rtrace_global_user_stack_java(who, regs),
                rtrace_common::unwind::RUNTIME_V8 => rtrace_global_user_stack_v8(who, regs),
                _ => rtrace_global_user_stack(who, regs),
            }
        };
        #[cfg(not(feature = "cfi_global"))]
        let walked = walk_user::<RT>(who, regs);
        if walked != NO_TABLES {
            let stack = walked & !CUT_BIT;
            return (
                (stack != NOT_STORED).then_some(stack),
                walked & CUT_BIT != 0,
            );
        }
        // A map missing: the kernel's frame-pointer walk.
    }
    let _ = (events, tgid, sampled);
    (
        get_stack(ctx, u64::from(BPF_F_USER_STACK), ERR_USER_STACK),
        false,
    )
}

#[cfg(feature = "cfi")]
unsafe extern "C" {
    /// [`walk_user`], as a function the kernel verifies once, on its own
    /// (`cfi_programs!` defines it, in the `cfi_global` variant).
    #[cfg(feature = "cfi_global")]
    fn rtrace_global_user_stack(who: u64, regs: u64) -> u64;
    /// [`walk_user`] through native frames only, likewise
    /// (`cfi_programs!(walk_variants)` defines it).
    #[cfg(feature = "cfi_global")]
    fn rtrace_global_user_stack_native(who: u64, regs: u64) -> u64;
    /// [`walk_user`] through one runtime's frames and native ones,
    /// likewise (`cfi_programs!(walk_variants)` defines them).
    #[cfg(feature = "cfi_global")]
    fn rtrace_global_user_stack_python(who: u64, regs: u64) -> u64;
    /// See `rtrace_global_user_stack_python`.
    #[cfg(feature = "cfi_global")]
    fn rtrace_global_user_stack_java(who: u64, regs: u64) -> u64;
    /// See `rtrace_global_user_stack_python`.
    #[cfg(feature = "cfi_global")]
    fn rtrace_global_user_stack_v8(who: u64, regs: u64) -> u64;
    /// [`after_walk`] on the object's `EVENTS`, likewise, in every
    /// variant that walks.
    fn rtrace_global_after_walk(packed: u64, who: u64) -> u64;
}

/// Which of V8's code holds `pc` in the process being walked
/// ([`crate::v8::code_in`]), over the CPU's scratch value of the walk:
/// the body of the global function `rtrace_global_v8_code`, which takes
/// scalars only and finds the walk's state here.
#[cfg(feature = "cfi")]
#[inline(always)]
pub fn v8_code(pc: u64) -> u64 {
    match STACK_SCRATCH.get_ptr(0) {
        // SAFETY: a per-CPU map value, which outlives the program's run;
        // only this CPU's program uses it, and this only reads it.
        Some(s) => crate::v8::code_in(unsafe { &*s }, pc),
        None => u64::from(crate::v8::NOT_V8),
    }
}

/// Java's step of the walk over the CPU's scratch value, as the walk's
/// frame callback takes it with `cfi::STEPS_APART`: the body of the
/// global function `rtrace_global_java_step`, which the kernel verifies
/// once, on its own. `tgid` is the process. Returns what the callback
/// returns (0 or 1).
#[cfg(feature = "cfi")]
#[inline(always)]
pub fn java_step(tgid: u64) -> u64 {
    match STACK_SCRATCH.get_ptr_mut(0) {
        // SAFETY: a per-CPU map value, which outlives the program's run;
        // only this CPU's program uses it.
        Some(s) => crate::java::step(unsafe { &mut *s }, tgid as u32) as u64,
        None => 1,
    }
}

/// V8's step, likewise (`rtrace_global_v8_step`), of code of kind
/// `code`: what the callback returns, or `cfi::STEP_NATIVE` where the
/// frame is left to the native walk.
#[cfg(feature = "cfi")]
#[inline(always)]
pub fn v8_step(code: u64, tgid: u64) -> u64 {
    let Some(s) = STACK_SCRATCH.get_ptr_mut(0) else {
        return 1;
    };
    // SAFETY: as in `java_step`.
    match crate::v8::step(unsafe { &mut *s }, tgid as u32, code as u32) {
        Some(end) => end as u64,
        None => crate::cfi::STEP_NATIVE,
    }
}

/// [`walk_user`]'s result for a process whose CFI maps are missing: the
/// caller walks by frame pointer.
#[cfg(feature = "cfi")]
const NO_TABLES: u64 = 4;
/// Set in [`walk_user`]'s result if the walk was cut short by a stack
/// word it could not read; keys leave it clear ([`entry_key`]).
#[cfg(feature = "cfi")]
const CUT_BIT: u64 = 1 << 63;

/// Walks the current task's user stack by CFI and stores it
/// ([`crate::cfi::walk`], then [`after_walk`]): the stack's key (0 for an
/// empty one), `NOT_STORED`, or `NO_TABLES`, with [`CUT_BIT`] if it was
/// cut short. `who` holds the process (low 32 bits) and the generation,
/// `regs` where the registers are (`cfi::REGS_*`).
///
/// In the `cfi_global` variant, called from a global function
/// (`cfi_programs!`): the kernel verifies it once, on its own, and its
/// caller's code after it once, rather than once for each way the walk's
/// loop could end. That adds the global function's frame to the chain of
/// calls down to the walk's step, whose frames kernels before 6.13 hold
/// to 512 bytes together, where the programs that walk do not fit; there
/// the `cfi` variant inlines it.
#[cfg(feature = "cfi")]
#[inline(always)]
pub fn walk_user<const RT: u32>(who: u64, regs: u64) -> u64 {
    use crate::cfi::Walked;
    let Some(s) = STACK_SCRATCH.get_ptr_mut(0) else {
        return NOT_STORED;
    };
    match crate::cfi::walk::<RT>(who as u32, regs, s, (who >> 32) as u32) {
        Some(Walked::Known(stack)) => stack,
        Some(Walked::Frames {
            depth,
            tell,
            memo,
            cut,
        }) => {
            let packed = depth.min(u64::from(u32::MAX))
                | (u64::from(tell) << TELL_BIT)
                | (u64::from(!memo.is_null()) << REMEMBER_BIT);
            // SAFETY: the object defines it (`cfi_programs!`); it takes
            // and returns plain numbers.
            let stored = unsafe { rtrace_global_after_walk(packed, who) };
            if cut { stored | CUT_BIT } else { stored }
        }
        None => NO_TABLES,
    }
}

/// [`after_walk`]'s flag, in its first argument, that user space should
/// be told of new code (`Walked::Frames::tell`).
#[cfg(feature = "cfi")]
const TELL_BIT: u32 = 32;
/// [`after_walk`]'s flag that the walk may be remembered for the thread.
#[cfg(feature = "cfi")]
const REMEMBER_BIT: u32 = 33;
/// What [`after_walk`] returns for a stack it could not store: keys are
/// odd ([`entry_key`]) and an empty stack is 0.
#[cfg(feature = "cfi")]
const NOT_STORED: u64 = 2;

/// A context for sends through a ring buffer, which takes none: a global
/// function's arguments can only be numbers. (The objects that walk by
/// CFI always send through one: no variant has both `cfi` and `perf`.)
#[cfg(feature = "cfi")]
struct NoContext;

#[cfg(feature = "cfi")]
impl EbpfContext for NoContext {
    fn as_ptr(&self) -> *mut core::ffi::c_void {
        core::ptr::null_mut()
    }
}

/// Everything the CFI walk leaves to do once its frames are in the
/// scratch value: telling user space of new code and of a found region,
/// storing the stack, remembering the walk for the thread, and sending
/// the Python code objects it queued. Returns the stack's key (0 for an
/// empty one), or `NOT_STORED`.
///
/// `packed` holds the depth (low 32 bits), `TELL_BIT` and
/// `REMEMBER_BIT`; `who` the process (low 32 bits) and the generation.
///
/// Called from a global function (`cfi_programs!`, whose BTF linkage the
/// build makes global, `ebpf_build::globalize`): the kernel verifies it
/// once, apart from its caller. Inlined after the walk, it was verified
/// again for each way the walk's loop could end: 340k of profile's 570k
/// instructions on 6.18. Its arguments are therefore numbers only, and
/// what it works on is looked up again here.
#[cfg(feature = "cfi")]
#[inline(always)]
pub fn after_walk<S: Sink>(events: &S, packed: u64, who: u64) -> u64 {
    let Some(s) = STACK_SCRATCH.get_ptr_mut(0) else {
        return NOT_STORED;
    };
    let tgid = who as u32;
    let generation = (who >> 32) as u32;
    let depth = packed & u64::from(u32::MAX);
    let ctx = NoContext;
    let tell = packed & (1 << TELL_BIT) != 0;
    // SAFETY: a map value.
    let found = unsafe { &mut (*s).walk.found };
    let found_any = found.flags != 0;
    // Read once, for both records, and only where one is sent.
    let born = if tell || found_any {
        crate::process::born_seldom()
    } else {
        0
    };
    if tell {
        crate::events::emit_now(
            events,
            &ctx,
            &Seen::new(tgid, born, rtrace_common::stacks::SEEN_NEW_CODE),
        );
    }
    if found_any {
        found.born = born;
        crate::events::emit(events, &ctx, found);
    }
    let Some(stack) = store_walked(s, depth) else {
        return NOT_STORED;
    };
    if packed & (1 << REMEMBER_BIT) != 0 {
        crate::cfi::remember_current(s, tgid, stack, generation);
    }
    crate::cfi::keep_tail(s, tgid);
    // Last, where little else is live across the call.
    // SAFETY: a map value.
    let more = crate::python::send_new(&ctx, events, unsafe { &mut *s });
    // SAFETY: a map value.
    let more = crate::java::send_new(&ctx, events, unsafe { &mut *s }) | more;
    // SAFETY: a map value.
    let more = crate::v8::send_new(&ctx, events, unsafe { &mut *s }) | more;
    if more && stack != 0 {
        let untold = rtrace_common::stacks::UntoldStack {
            tgid,
            flags: rtrace_common::stacks::SEEN_UNTOLD,
            born: crate::process::born_seldom(),
            stack,
        };
        crate::events::emit_now(events, &ctx, &untold);
    }
    stack
}

/// Walks one stack with `bpf_get_stack` and stores it.
#[inline(always)]
fn get_stack<C: EbpfContext>(ctx: &C, flags: u64, walk_error: u32) -> Option<u64> {
    // SAFETY: `buf` has room for `size` bytes; the helper zeroes what it
    // does not fill.
    walk_and_store(walk_error, |buf, size| unsafe {
        bpf_get_stack(ctx.as_ptr(), buf, size, flags)
    })
}

/// Runs a kernel stack helper, `walk(buffer, bytes)`, into the scratch
/// stack and stores what it walked; a failed walk counts `walk_error`.
/// The kernel's own walks keep one entry's frames (`MAX_DEPTH`, the
/// default of `kernel.perf_event_max_stack`).
#[inline(always)]
fn walk_and_store(
    walk_error: u32,
    walk: impl FnOnce(*mut core::ffi::c_void, u32) -> i64,
) -> Option<u64> {
    let s = STACK_SCRATCH.get_ptr_mut(0)?;
    // SAFETY: a map value, with room for `MAX_DEPTH` frames and more.
    let ips = unsafe { &raw mut (*s).frames.ips };
    let n = walk(ips.cast(), (MAX_DEPTH * 8) as u32);
    hash_and_store(s, n, walk_error)
}

/// Stores the frames a kernel stack helper put in the scratch value `s`,
/// having returned `n`; a failed walk counts `walk_error`.
#[inline(always)]
fn hash_and_store(s: *mut Scratch, n: i64, walk_error: u32) -> Option<u64> {
    // SAFETY: a map value, with room for `MAX_DEPTH` frames and more.
    let ips = unsafe { &raw mut (*s).frames.ips };
    if n < 0 {
        count_error(walk_error);
        return None;
    }
    let len = (n as u64 / 8).min(MAX_DEPTH as u64);
    if len == 0 {
        return Some(0);
    }
    // The helper zeroes what it did not fill, so every slot is hashed,
    // without a branch a slot: a loop that ended at the stack's end
    // would have the verifier follow the rest of the program from each.
    let mut h = [HASH_SEED; 2];
    for i in 0..MAX_DEPTH {
        // SAFETY: `i < MAX_DEPTH`, inside the map value.
        let ip = unsafe { (*ips)[i] };
        let c = usize::from(i >= SEGMENT_FRAMES);
        h[c] = fnv(h[c], ip);
    }
    store_entry(s, 0, len, 0, h)
}

/// The key a `STACKS` entry is stored under: of the hashes of its frames
/// (`chunk`, the first `SEGMENT_FRAMES`, and `tail`, those after), its
/// `len` field and its link, mixed so that stacks differing only in
/// their last frame still spread over all 64 bits.
#[inline(always)]
fn entry_key(chunk: u64, tail: u64, len: u64, link: u64) -> u64 {
    let mut h = fnv(fnv(fnv(chunk, tail), len), link);
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    // Odd, so that no key is 0 (an empty stack) or one of `after_walk`'s
    // answers; the top bit is `walk_user`'s.
    (h | 1) & !(1 << 63)
}

/// Stores the `len` frames the CFI walk put in the scratch value `s`,
/// whose hashes by `SEGMENT_FRAMES` it kept as it went
/// (`State::chunks`), and returns the key that names them: 0 for an
/// empty stack, `None` if they could not be stored. A stack deeper than
/// one entry holds is stored in several, root end first, each but the
/// last linked to the next ([`rtrace_common::stacks::CONTINUED`]), so
/// that the leaf-most entry's key names the whole.
#[cfg(feature = "cfi")]
#[inline(always)]
fn store_walked(s: *mut Scratch, len: u64) -> Option<u64> {
    if len <= MAX_DEPTH as u64 {
        if len == 0 {
            return Some(0);
        }
        return store_entry(s, 0, len, 0, [chunk(s, 0), chunk(s, 1)]);
    }
    let last = (len - MAX_DEPTH as u64).div_ceil(SEGMENT_FRAMES as u64);
    // SAFETY: a map value.
    unsafe {
        (*s).storing = Storing {
            len,
            last,
            next: 0,
            failed: 0,
        }
    };
    let mut ctx = s;
    // One entry a call of a `bpf_loop` callback: followed by the verifier
    // once for each way the walk ended, rather than an entry's code each
    // time for each.
    // SAFETY: `store_segment` is a callback of bpf_loop's signature and
    // `ctx` lives across the call.
    unsafe {
        aya_ebpf::helpers::generated::bpf_loop(
            (last + 1).min(rtrace_common::stacks::MAX_SEGMENTS as u64) as u32,
            store_segment as *mut core::ffi::c_void,
            (&raw mut ctx).cast(),
            0,
        )
    };
    // SAFETY: a map value.
    let c = unsafe { &(*s).storing };
    (c.failed == 0).then_some(c.next)
}

/// Stores entry `last - index` of a deep stack, the root-most first.
#[cfg(feature = "cfi")]
#[inline(never)]
extern "C" fn store_segment(index: u64, ctx: *mut core::ffi::c_void) -> i64 {
    // SAFETY: `ctx` is the caller's pointer to the scratch value, which
    // outlives the loop.
    let s = unsafe { *ctx.cast::<*mut Scratch>() };
    let c = unsafe { &mut (*s).storing };
    let Some(k) = c.last.checked_sub(index) else {
        return 1;
    };
    let k = (k as usize).min(rtrace_common::stacks::MAX_SEGMENTS - 1);
    let start = k * SEGMENT_FRAMES;
    let stored = if k as u64 == c.last {
        let n = c.len.saturating_sub(start as u64);
        store_entry(s, start, n, 0, [chunk(s, k), chunk(s, k + 1)])
    } else {
        store_entry(s, start, SEGMENT_FRAMES as u64, c.next, [chunk(s, k), 0])
    };
    match stored {
        Some(key) => {
            c.next = key;
            0
        }
        None => {
            c.failed = 1;
            1
        }
    }
}

/// The CFI walk's hash of its frames `k * SEGMENT_FRAMES` on
/// (`Scratch::chunks`).
#[cfg(feature = "cfi")]
#[inline(always)]
fn chunk(s: *const Scratch, k: usize) -> u64 {
    // SAFETY: a map value.
    unsafe { (*s).chunks.get(k).copied().unwrap_or(HASH_SEED) }
}

/// Stores `n` frames of the scratch value's walk from frame `start`, and
/// `link` if not 0 ([`Stack::len`]), as one `STACKS` entry, and returns
/// its key ([`entry_key`], of the frames' `hashes`: the first
/// `SEGMENT_FRAMES`, and those after); `None` if it could not be stored.
#[inline(always)]
fn store_entry(s: *mut Scratch, start: usize, n: u64, link: u64, hashes: [u64; 2]) -> Option<u64> {
    let field = if link != 0 {
        MAX_DEPTH as u64 | CONTINUED
    } else {
        n
    };
    let key = entry_key(hashes[0], hashes[1], field, link);
    // Most stacks are stored already: a lookup takes no lock, an insert
    // takes the bucket's even to find the key there.
    // SAFETY: a lookup; the value is not read.
    if unsafe { STACKS.get(key) }.is_some() {
        return Some(key);
    }
    // SAFETY: map values; the entry has room for `MAX_DEPTH` frames, the
    // walk holds `n` from `start`.
    let e = unsafe {
        let e = &raw mut (*s).entry;
        let from = (&raw const (*s).frames.ips)
            .cast::<u64>()
            .wrapping_add(start);
        // `n <= MAX_DEPTH`, masked so that the verifier knows it: read
        // back, or the compiler, knowing it too, drops the mask.
        let bytes = (core::ptr::read_volatile(&n) as u32 & MAX_DEPTH as u32) * 8;
        // Kernel memory (a map value): the copy cannot fail.
        let _ = bpf_probe_read_kernel((&raw mut (*e).ips).cast(), bytes, from.cast());
        if link != 0 {
            (*e).ips[SEGMENT_FRAMES] = link;
        }
        (*e).len = field;
        &*e
    };
    // By reference: a copy would not fit on the eBPF stack.
    match STACKS.insert(key, e, u64::from(BPF_NOEXIST)) {
        Ok(()) => {
            count_new(NEW_STACKS);
            Some(key)
        }
        Err(err) if err == EEXIST => Some(key),
        Err(_) => {
            count_error(ERR_STACKS_FULL);
            None
        }
    }
}

//! V8's JavaScript frames, spliced into the CFI walk: where the walk's pc
//! is in V8's code (its embedded builtins, which run interpreted frames,
//! or its JIT code), the frame's slots below its frame pointer say
//! whether it is a JavaScript frame (`rtrace_common::v8`). One is written
//! as its function's `SharedFunctionInfo` and that object's check, which
//! user space reads back (with its pc, where it ran JIT code: user space
//! finds there the functions inlined in it), and stepped by its frame
//! pointer: every frame V8 lays out keeps the rbp chain. A frame of V8's
//! own (entry, exit, stub: a type marker where a JavaScript frame has its
//! context) is left to the native walk, which names it by its builtin's
//! symbol.
//!
//! The sampled frame is taken as its frame pointer says: one stopped in
//! a function's prologue, before it set rbp up, is its caller's.

use aya_ebpf::{helpers::generated::bpf_probe_read_kernel, macros::map, maps::HashMap};
use rtrace_common::{
    stacks::{ERR_V8_BAD, SEEN_V8},
    v8::{
        MAX_V8_RANGES, NO_OFFSET, SFI_BYTES, V8_ADDR_MASK, V8_JS, V8_JS_PC, V8_NEW, V8_PROC_HEAD,
        V8Proc, V8Range, range_index, sfi_check,
    },
};

use crate::{
    count_error, read_user,
    runtime::{Told, queue_slot, read_into, stack_into, told_table, word},
    scratch::{Scratch, kept, push2},
};

/// The processes that run V8, by process id; user space fills it.
#[map]
pub(crate) static V8_PROCS: HashMap<u32, V8Proc> = HashMap::with_max_entries(1, 0);

/// JavaScript frames each CPU has told user space of, by a hash of
/// process, its salt and the frame's slots (`runtime::newly_told`).
#[map]
static V8_TOLD: Told = told_table();

/// Bytes below the frame pointer read in one copy: the slots down to
/// the bytecode offset's (−40), and the saved rbp and return address
/// above it.
const BELOW: u64 = 48;

/// Sets up the V8 part of a walk of process `tgid`, at its first step:
/// the process's record copied in, if user space gave it one and the
/// walk is one that steps through JavaScript frames (`walked`, a
/// constant).
#[inline(always)]
pub(crate) fn start(s: &mut Scratch, tgid: u32, walked: bool) {
    s.v8.on = 0;
    s.v8.nnew = 0;
    if !walked {
        return;
    }
    let Some(p) = V8_PROCS.get_ptr(tgid) else {
        return;
    };
    let dst = &raw mut s.v8.proc;
    // SAFETY: map values, of one type: the fields before the ranges are
    // copied as words (a fixed length, which the compiler lays out as
    // loads and stores), and then the ranges the process has, by a
    // helper that takes a length the verifier bounds (at most the array).
    unsafe {
        core::ptr::copy_nonoverlapping(p.cast::<u64>(), dst.cast::<u64>(), V8_PROC_HEAD / 8);
        // The count just copied (user space may rewrite the record in
        // between), so that it and the ranges copied agree.
        let n = (*dst).nranges.min(MAX_V8_RANGES as u32);
        let size = n * core::mem::size_of::<V8Range>() as u32;
        if bpf_probe_read_kernel(
            (&raw mut (*dst).ranges).cast(),
            size,
            (&raw const (*p).ranges).cast(),
        ) != 0
        {
            return;
        }
    }
    s.v8.on = 1;
}

/// Whether user space gave process `tgid`'s V8 to the walk.
#[inline(always)]
pub(crate) fn known(tgid: u32) -> bool {
    V8_PROCS.get_ptr(tgid).is_some()
}

/// A pc in none of V8's code (or in a process whose V8 the walk does not
/// read): [`code_at`]'s answer.
pub(crate) const NOT_V8: u32 = 0;
/// A pc in V8's JIT code.
pub(crate) const V8_JIT: u32 = 1;
/// A pc in a copy of V8's embedded builtins, where interpreted frames run.
pub(crate) const V8_BUILTINS: u32 = 2;

/// Which of V8's code holds the walk's pc: [`NOT_V8`], [`V8_JIT`] or
/// [`V8_BUILTINS`].
///
/// The search is a global function of the object's (defined by
/// `cfi_programs!`), verified once: inlined, it was verified again for
/// every state the walk reaches a frame in, which cost more than the
/// rest of the JavaScript walk (130k instructions on 6.18).
#[inline(always)]
pub(crate) fn code_at(s: &Scratch) -> u32 {
    if s.v8.on == 0 {
        return NOT_V8;
    }
    // SAFETY: a global function of this object, of scalars.
    match unsafe { rtrace_global_v8_code(s.walk.ip) } {
        1 => V8_JIT,
        2 => V8_BUILTINS,
        _ => NOT_V8,
    }
}

unsafe extern "C" {
    /// [`crate::stacks::v8_code`]: a global function that
    /// `cfi_programs!` defines in each object.
    fn rtrace_global_v8_code(pc: u64) -> u64;
}

/// [`code_at`]'s search, over the walk's scratch value `s`.
#[inline(always)]
pub fn code_in(s: &Scratch, pc: u64) -> u64 {
    let p = &s.v8.proc;
    let i = range_index(&p.ranges, p.nranges, pc);
    let kind = if i >= MAX_V8_RANGES as u32 {
        NOT_V8
    } else if p.builtins >> i & 1 != 0 {
        V8_BUILTINS
    } else {
        V8_JIT
    };
    u64::from(kind)
}

/// Whether tagged value `v` points at a heap object.
#[inline(always)]
fn is_object(p: &V8Proc, v: u64) -> bool {
    v & u64::from(p.heap_object_tag_mask) == u64::from(p.heap_object_tag) && v > 0xffff
}

/// The instance type of the heap object at untagged address `obj`.
#[inline(always)]
fn instance_type(p: &V8Proc, obj: u64) -> Option<u16> {
    let map = read_user::<u64>(obj.wrapping_add(u64::from(p.heap_object_map)))?;
    if !is_object(p, map) {
        return None;
    }
    let untagged = map.wrapping_sub(u64::from(p.heap_object_tag));
    read_user::<u16>(untagged.wrapping_add(u64::from(p.map_instance_type)))
}

/// The JavaScript step of the walk, at a pc in V8's code of kind `code`
/// ([`V8_JIT`] or [`V8_BUILTINS`]): `None` where the frame is no JavaScript one (the native walk
/// takes it), else what `bpf_loop`'s callback returns, the frame
/// written (two slots) and the walk's registers stepped to its caller.
#[inline(always)]
pub(crate) fn step(s: &mut Scratch, tgid: u32, code: u32) -> Option<i64> {
    let fp = s.walk.bp;
    if fp & 7 != 0 || fp < s.walk.sp || fp < BELOW {
        return None;
    }
    if !stack_into::<{ (BELOW as usize + 16) / 8 }, _>(
        &mut s.v8_buf,
        &s.chunk,
        (s.walk.chunk_base, s.walk.chunk_len),
        fp - BELOW,
    ) {
        return None;
    }
    let p: *const V8Proc = &raw const s.v8.proc;
    // SAFETY: `p` points into the scratch map value, which outlives the
    // step, and nothing writes `s.v8.proc` during it.
    let p = unsafe { &*p };
    let slot = |off: i16| (BELOW as i16).wrapping_add(off) as u16;
    let context = word(&s.v8_buf, slot(p.fp_context));
    // A type marker (a small integer's low bit clear): V8's own frame.
    if !is_object(p, context) {
        return None;
    }
    s.v8.caller_bp = word(&s.v8_buf, BELOW as u16);
    s.v8.ret = word(&s.v8_buf, BELOW as u16 + 8);
    s.v8.offset = NO_OFFSET;
    // An interpreted frame runs in the builtins: the bytecode offset,
    // a small integer, is in its slot.
    if code == V8_BUILTINS {
        let array = word(&s.v8_buf, slot(p.fp_bytecode_array));
        let off = word(&s.v8_buf, slot(p.fp_bytecode_offset));
        let shift = u64::from(p.smi_shift & 63);
        if is_object(p, array) && off & ((1u64 << shift) - 1) == 0 && (off >> shift) < 1 << 31 {
            s.v8.offset = (off >> shift) as u32;
        }
    }
    let function = word(&s.v8_buf, slot(p.fp_function));
    if function_sfi(s, function).is_none() {
        count_error(ERR_V8_BAD);
        return None;
    }
    let sfi = s.v8.sfi;
    if !read_into(&mut s.v8_buf, sfi, usize::from(p.sfi_read)) {
        count_error(ERR_V8_BAD);
        return None;
    }
    let check = sfi_check(
        word(&s.v8_buf, p.sfi_name),
        word(&s.v8_buf, p.sfi_script),
        word(&s.v8_buf, p.sfi_ints) & p.sfi_ints_mask,
    );
    // A frame in JIT code carries its pc, by which user space finds the
    // code and the functions inlined in it; an interpreted one its
    // bytecode offset.
    // (Its offset was left at `NO_OFFSET`: only the builtins set one.)
    let jit = code == V8_JIT;
    let (tag, low) = if jit {
        (V8_JS_PC, s.walk.ip & 0xffff_ffff)
    } else {
        (V8_JS, u64::from(s.v8.offset))
    };
    let first = tag | (sfi & V8_ADDR_MASK);
    let second = u64::from(check) << 32 | low;
    // JavaScript frames depend on more than the stack's words (the heap's
    // objects, which the collector moves).
    s.walk.unremembered = 1;
    s.py.native += 1;
    if !push2(s, first, second) {
        return Some(1);
    }
    tell(s, tgid, first, second);
    let ret = s.v8.ret;
    s.walk.ip = ret;
    s.walk.sp = fp + 16;
    s.walk.bp = s.v8.caller_bp;
    Some(i64::from(ret == 0 || kept(&s.walk) >= s.v8.max_depth))
}

/// The `SharedFunctionInfo` of tagged `JSFunction` `function`, type
/// checked both, into `s.v8.sfi` (untagged).
#[inline(always)]
fn function_sfi(s: &mut Scratch, function: u64) -> Option<()> {
    let p = &s.v8.proc;
    if !is_object(p, function) {
        return None;
    }
    let tag = u64::from(p.heap_object_tag);
    let f = function.wrapping_sub(tag);
    let ty = instance_type(p, f)?;
    if ty < p.first_function_type || ty > p.last_function_type {
        return None;
    }
    let shared = read_user::<u64>(f.wrapping_add(u64::from(p.function_shared)))?;
    if !is_object(p, shared) {
        return None;
    }
    let sfi = shared.wrapping_sub(tag);
    if instance_type(p, sfi)? != p.sfi_type || usize::from(p.sfi_read) > SFI_BYTES {
        return None;
    }
    s.v8.sfi = sfi;
    Some(())
}

/// Queues frame (`first`, `second`) for user space the first time this
/// CPU meets it (see [`V8_TOLD`]); a walk queues at most `V8_NEW`.
#[inline(always)]
fn tell(s: &mut Scratch, tgid: u32, first: u64, second: u64) {
    let h = (first ^ second.rotate_left(23) ^ (u64::from(tgid) << 40) ^ u64::from(s.v8.proc.salt))
        .wrapping_mul(0xff51_afd7_ed55_8ccd);
    let Some(i) = queue_slot::<V8_NEW>(&V8_TOLD, h, &mut s.v8.nnew) else {
        return;
    };
    if let Some(q) = s.v8_new.get_mut(i) {
        q.tgid = tgid;
        q.flags = SEEN_V8;
        q.first = first;
        q.second = second;
    }
}

/// The JavaScript frames a walk queued, sent, and the queue emptied.
/// Returns whether the walk met more new frames than it queued.
#[inline(always)]
pub(crate) fn send_new<C: aya_ebpf::EbpfContext, S: crate::events::Sink>(
    ctx: &C,
    events: &S,
    s: &mut Scratch,
) -> bool {
    if s.v8.nnew == 0 {
        return false;
    }
    let born = crate::process::born_seldom();
    for i in 0..V8_NEW {
        if i as u32 >= s.v8.nnew {
            break;
        }
        if let Some(q) = s.v8_new.get_mut(i) {
            q.born = born;
            crate::events::emit_now(events, ctx, q);
        }
    }
    let more = s.v8.nnew as usize > V8_NEW;
    s.v8.nnew = 0;
    more
}

/// Forgets a process's V8: it ran a new program or exited.
#[inline(always)]
pub(crate) fn forget(tgid: u32) {
    let _ = V8_PROCS.remove(tgid);
}

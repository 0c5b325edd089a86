//! HotSpot's frames, spliced into the CFI walk: where the walk's pc is in
//! a JVM's code cache, the frame is a Java one (compiled, interpreted, a
//! native method's wrapper, or a stub), stepped by HotSpot's own rules
//! rather than by CFI, which JIT code has none of.
//!
//! User space tells the kernel of each JVM ([`JavaProc`]: its code heaps
//! and the offsets of the fields the walk reads, from the JVM's own
//! `gHotSpotVMStructs` tables). Each Java frame is found from its pc by
//! the heap's segment map (HotSpot's own lookup), named by what it points
//! at (an `nmethod*` and its compile id, a `Method*` and its
//! `ConstMethod*`), which user space reads back and checks, and stepped:
//! a compiled frame by its size, an interpreted or native one by its
//! frame pointer. Everything it needs after a helper call lives in the
//! scratch value, not in registers: their spills would grow the walk's
//! step past what kernels before 6.13 allow its chain of frames.

use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap},
};
use rtrace_common::{
    java::{
        BLOB_BYTES, INTERP_WINDOW, JAVA_ADDR_MASK, JAVA_COMPILED, JAVA_INTERPRETED, JAVA_NATIVE,
        JAVA_NEW, JAVA_STUB, JavaProc, LEARNED_NATIVE, LEARNED_NMETHOD, LEARNED_STUB,
        LEARNED_VTABLE, MAX_HEAPS, method_check,
    },
    stacks::{ERR_JAVA_BAD, ERR_JAVA_BUILDING, ERR_JAVA_CHECK_KEPT, SEEN_JAVA},
    unwind::JAVA_CHECK_SLOTS,
};

use crate::{
    count_error, read_user,
    runtime::{
        Told, byte, cpu_slot, half, quarter, queue_slot, read_into, stack_into, stack_words,
        told_table, word,
    },
    scratch::{Scratch, kept, push2},
};

/// The JVM processes, by process id; user space fills it.
#[map]
pub(crate) static JAVA_PROCS: HashMap<u32, JavaProc> = HashMap::with_max_entries(1, 0);

/// Java frames each CPU has told user space of, by a hash of process,
/// its salt and the frame's code ([`tell`]: `runtime::newly_told`), as Python's
/// code objects are told.
#[map]
static JAVA_TOLD: Told = told_table();

/// Hops of a segment map's walk back to its block's start: HotSpot
/// writes at most 0xfe a byte, and a block's segments count down to
/// its start in steps that it keeps short (OpenJDK's `find_start` takes
/// few; OTel's walk takes at most 12).
const SEGMAP_HOPS: usize = 16;

/// Bytes of a segment map read at once ([`find_blob`]): one more than
/// the longest hop, and within the blob's buffer, which the blob's read
/// then overwrites.
const SEGMAP_WINDOW: u64 = 256;
const _: () = assert!(SEGMAP_WINDOW as usize <= BLOB_BYTES);

/// The first four bytes of a blob's name, as a little-endian `u32`.
const NAME_NMETHOD: u32 = u32::from_le_bytes(*b"nmet");
const NAME_NATIVE: u32 = u32::from_le_bytes(*b"nati");
const NAME_INTERPRETER: u32 = u32::from_le_bytes(*b"Inte");
const NAME_VTABLE: u32 = u32::from_le_bytes(*b"vtab");
/// The call stub, known by its return address (no name's bytes).
const KIND_CALL_STUB: u32 = u32::MAX;

/// Largest distance from an interpreted frame's sp to its frame pointer
/// taken as plausible (OTel's and async-profiler's bound): past it, the
/// register is no frame pointer of this frame.
const INTERP_SPAN: u64 = 0x1000;

/// Sets up the Java part of a walk of process `tgid`, at its first step:
/// the process's JVM copied in, if user space gave it one and the walk is
/// one that steps through Java's frames (`walked`, a constant).
#[inline(always)]
pub(crate) fn start(s: &mut Scratch, tgid: u32, walked: bool) {
    s.jv.on = 0;
    s.jv.nnew = 0;
    s.jv.epoch = 0;
    // A constant: a walk without Java's part never looks.
    if !walked {
        return;
    }
    let Some(p) = JAVA_PROCS.get_ptr(tgid) else {
        return;
    };
    // SAFETY: a map value, copied into another (`copy_value`: a plain
    // assignment would call `memmove`).
    unsafe { crate::copy_value(&mut s.jv.proc, p) };
    s.jv.on = 1;
}

/// Whether user space gave process `tgid`'s JVM to the walk.
#[inline(always)]
pub(crate) fn known(tgid: u32) -> bool {
    JAVA_PROCS.get_ptr(tgid).is_some()
}

/// Whether the walk's pc is in the JVM's code cache: a Java frame. The
/// walk then sets `s.jv.max_depth` and, for its first frame, `s.jv.r13`
/// before the [`step`].
#[inline(always)]
pub(crate) fn in_code(s: &Scratch) -> bool {
    let ip = s.walk.ip;
    s.jv.on != 0 && ip >= s.jv.proc.low_bound && ip < s.jv.proc.high_bound
}

/// The Java step of the walk, at a pc in the code cache: the frame is
/// written (one kind of Java frame, two slots) and the walk's registers
/// stepped to its caller. Returns what `bpf_loop`'s callback returns: 1
/// ends the walk. A frame that cannot be read or stepped is counted and
/// ends the walk: its caller is unknown.
#[inline(always)]
pub(crate) fn step(s: &mut Scratch, tgid: u32) -> i64 {
    // Java frames depend on more than the stack's words (the code
    // cache's contents, which change as methods are compiled and freed).
    s.walk.unremembered = 1;
    // The first frame is the sampled one: its registers are the
    // interrupted code's, and a compiled one may be in its prologue or
    // epilogue.
    s.jv.top = u32::from(s.walk.depth == 0);
    s.py.native += 1;
    let p: *const JavaProc = &raw const s.jv.proc;
    // SAFETY: `p` points into the scratch map value, which outlives the
    // step, and nothing writes `s.jv.proc` during it.
    let p = unsafe { &*p };
    // The interpreter, whose frames are most of a cold program's, is
    // known by its range: no lookup of its blob, nor a read of it.
    let kind = if s.walk.ip >= p.interp_low && s.walk.ip < p.interp_high {
        NAME_INTERPRETER
    } else if s.walk.ip == p.call_stub_ret && p.call_stub_blob != 0 {
        // Every stack's outermost Java frame returns here: the stub's
        // blob is known, and lives as long as the JVM.
        s.jv.blob = p.call_stub_blob;
        KIND_CALL_STUB
    } else {
        if !find_blob(s) || !read_into(&mut s.jv_buf, s.jv.blob, usize::from(p.blob_read)) {
            count_error(ERR_JAVA_BAD);
            return 1;
        }
        let name = word(&s.jv_buf, p.blob_name);
        match learned(p, name) {
            Some(kind) => kind,
            None => {
                let kind = read_user::<u32>(name);
                if let Some(kind) = kind {
                    learn(tgid, name, kind);
                }
                kind.unwrap_or(0)
            }
        }
    };
    let done = match kind {
        NAME_INTERPRETER => interpreted(s, tgid),
        NAME_NMETHOD | NAME_NATIVE => compiled(s, tgid, kind == NAME_NATIVE),
        KIND_CALL_STUB => call_stub(s, tgid),
        _ => stub(s, tgid, kind == NAME_VTABLE),
    };
    match done {
        Some(end) => end,
        None => {
            count_error(ERR_JAVA_BAD);
            1
        }
    }
}

/// The kind of a blob whose name (`CodeBlob::_name`) is `name`, if the
/// walk learned that name before ([`JavaProc::names`]): as the first
/// four bytes it points at, which are a literal's in libjvm, read only.
#[inline(always)]
fn learned(p: &JavaProc, name: u64) -> Option<u32> {
    let n = &p.names;
    if name == 0 {
        None
    } else if name == n[LEARNED_NMETHOD] {
        Some(NAME_NMETHOD)
    } else if name == n[LEARNED_NATIVE] {
        Some(NAME_NATIVE)
    } else if name == n[LEARNED_VTABLE] {
        Some(NAME_VTABLE)
    } else if name == n[LEARNED_STUB] {
        // Any other stub: no name the step tells apart.
        Some(0)
    } else {
        None
    }
}

/// Keeps the name `name` of a blob of `kind` (its first four bytes) in
/// process `tgid`'s record, for the next walks (a race between CPUs
/// writes the same pointer, or another of the same kind). The
/// interpreter is known by its range, or, where that is unknown, read.
#[inline(always)]
fn learn(tgid: u32, name: u64, kind: u32) {
    let slot = match kind {
        NAME_NMETHOD => LEARNED_NMETHOD,
        NAME_NATIVE => LEARNED_NATIVE,
        NAME_VTABLE => LEARNED_VTABLE,
        NAME_INTERPRETER => return,
        _ => LEARNED_STUB,
    };
    if let Some(p) = JAVA_PROCS.get_ptr_mut(tgid)
        // SAFETY: a map value; `slot` is below the array's length.
        && let Some(n) = unsafe { (*p).names.get_mut(slot) }
    {
        *n = name;
    }
}

/// Finds the blob that holds the walk's pc by its heap's segment map,
/// into `s.jv.blob`; `false` if it is in no heap or in a free block.
#[inline(always)]
fn find_blob(s: &mut Scratch) -> bool {
    let ip = s.walk.ip;
    let p = &s.jv.proc;
    let mut found = None;
    for i in 0..MAX_HEAPS {
        if i as u32 >= p.nheaps {
            break;
        }
        if let Some(h) = p.heaps.get(i)
            && h.low <= ip
            && ip < h.high
        {
            found = Some((h.low, h.segmap, h.log2_segment & 31));
            break;
        }
    }
    let Some((low, segmap, log2)) = found else {
        return false;
    };
    let mut seg = (ip - low) >> log2;
    // The map's bytes up to `seg`, from `from`, read in one copy: a hop
    // goes back at most 0xfe, so a block's start within 255 segments of
    // the pc (16 or 32 KiB of code at HotSpot's 64- or 128-byte
    // segments: most blobs whole) is found with one read, not one a hop.
    let mut from = u64::MAX;
    for _ in 0..SEGMAP_HOPS {
        if seg < from {
            from = seg.saturating_sub(SEGMAP_WINDOW - 1);
            let len = (seg - from + 1) as usize;
            if !read_into(&mut s.jv_buf, segmap.wrapping_add(from), len) {
                return false;
            }
        }
        let b = byte(&s.jv_buf, (seg - from) as u16);
        if b == 0 {
            s.jv.blob = low
                .wrapping_add(seg << log2)
                .wrapping_add(u64::from(s.jv.proc.heap_block));
            return true;
        }
        if b == 0xff || u64::from(b) > seg {
            return false;
        }
        seg -= u64::from(b);
    }
    false
}

/// Writes a Java frame's two slots, and queues it for user space if
/// this CPU has not told it yet; `false` if the stack is full.
#[inline(always)]
fn write(s: &mut Scratch, tgid: u32, tag: u64, addr: u64, second: u64) -> bool {
    let first = tag | (addr & JAVA_ADDR_MASK);
    if !push2(s, first, second) {
        return false;
    }
    tell(s, tgid, first, second);
    true
}

/// Queues frame (`first`, `second`) for user space the first time this
/// CPU meets its code (see [`JAVA_TOLD`]); a walk queues at most
/// `JAVA_NEW`. Its code is `first` and `second`'s high half (the
/// compile id, or the method's check): the low half (a pc's offset, a
/// bytecode index) is left out, as user space reads all it needs to name
/// every pc of an nmethod, and every index of a method, the first time
/// (`stacks::java`). Told a pc at a time, a hot loop's every instruction
/// was told once a CPU, each a record and a wakeup of user space from
/// inside the sample, microseconds each in a VM: half the walk's time at
/// 99 Hz for its first seconds.
#[inline(always)]
fn tell(s: &mut Scratch, tgid: u32, first: u64, second: u64) {
    let code = second >> 32;
    let h = (first ^ code.rotate_left(23) ^ (u64::from(tgid) << 40) ^ u64::from(s.jv.proc.salt))
        .wrapping_mul(0xff51_afd7_ed55_8ccd);
    let Some(i) = queue_slot::<JAVA_NEW>(&JAVA_TOLD, h, &mut s.jv.nnew) else {
        return;
    };
    if let Some(q) = s.jv_new.get_mut(i) {
        q.tgid = tgid;
        q.flags = SEEN_JAVA;
        q.first = first;
        q.second = second;
    }
}

/// The Java frames a walk queued, sent, and the queue emptied (a walk
/// recalled, not walked, sends nothing again). Returns whether the walk
/// met more new frames than it queued.
#[inline(always)]
pub(crate) fn send_new<C: aya_ebpf::EbpfContext, S: crate::events::Sink>(
    ctx: &C,
    events: &S,
    s: &mut Scratch,
) -> bool {
    if s.jv.nnew == 0 {
        return false;
    }
    let born = crate::process::born_seldom();
    for i in 0..JAVA_NEW {
        if i as u32 >= s.jv.nnew {
            break;
        }
        if let Some(q) = s.jv_new.get_mut(i) {
            q.born = born;
            crate::events::emit_now(events, ctx, q);
        }
    }
    let more = s.jv.nnew as usize > JAVA_NEW;
    s.jv.nnew = 0;
    more
}

/// Moves the walk to the caller: `ret` its pc, `sp` and `bp` its
/// registers. Returns the callback's value: 1 where the walk ends.
#[inline(always)]
fn to_caller(s: &mut Scratch, ret: u64, sp: u64, bp: u64) -> Option<i64> {
    s.walk.ip = ret;
    s.walk.sp = sp;
    s.walk.bp = bp;
    Some(i64::from(ret == 0 || kept(&s.walk) >= s.jv.max_depth))
}

/// An interpreted frame: its `Method*` and bytecode index from the
/// frame's slots, then the caller by the frame pointer (its sender sp,
/// not `fp + 16`: a compiled caller's sp is its unextended one).
#[inline(always)]
fn interpreted(s: &mut Scratch, tgid: u32) -> Option<i64> {
    let p: *const JavaProc = &raw const s.jv.proc;
    // SAFETY: as in `step`.
    let p = unsafe { &*p };
    let (sp, fp) = (s.walk.sp, s.walk.bp);
    if fp & 7 != 0 || fp < sp || fp - sp >= INTERP_SPAN {
        return None;
    }
    // Once the interpreter has pushed the frame's `Method*` (after its
    // sender sp and last sp), the stack pointer is at its slot or below.
    if s.jv.top != 0 && fp - sp < (-i64::from(p.interp_method)) as u64 {
        // The sampled frame being built: `enter` run, its sender sp pushed
        // or still in r13, its `Method*` not pushed yet (HotSpot's
        // `generate_fixed_frame`), so that the slot holds whatever an
        // earlier frame left there, another method's as likely as not.
        // Its caller is taken as the sampled frame: unnamed, never named
        // wrong.
        count_error(ERR_JAVA_BUILDING);
        let sender = if fp - sp >= 8 {
            stack::<1>(s, fp - 8)?[0]
        } else {
            s.jv.r13
        };
        let [bp, ret] = stack::<2>(s, fp)?;
        return to_caller(s, ret, sender, bp);
    }
    // The frame's slots in one copy (from the stack's top the walk
    // copied, or one read), from the lowest of them up to the saved rbp
    // and the return address: a read costs far more than the bytes it
    // copies. Into the blob's buffer (no blob is read for an
    // interpreted frame), indexed by each slot's offset, which `word`
    // masks so that the verifier bounds it.
    if !stack_into::<{ (INTERP_WINDOW + 16) / 8 }, _>(
        &mut s.jv_buf,
        &s.chunk,
        (s.walk.chunk_base, s.walk.chunk_len),
        fp.wrapping_sub(INTERP_WINDOW as u64),
    ) {
        return None;
    }
    let slot =
        |buf: &[u64; BLOB_BYTES / 8], off: i16| word(buf, (off + INTERP_WINDOW as i16) as u16);
    let method = slot(&s.jv_buf, p.interp_method);
    // The top frame's bcp is in r13: the slot is written only before
    // calls.
    let bcp = if s.jv.top != 0 {
        s.jv.r13
    } else {
        slot(&s.jv_buf, p.interp_bcp)
    };
    let cm = read_user::<u64>(method.wrapping_add(u64::from(p.method_const)))?;
    let code = cm.wrapping_add(u64::from(p.const_method_size));
    let bci = bcp.wrapping_sub(code);
    let bci = if bci < 1 << 16 { bci } else { 0xffff_ffff };
    let at = check_slot(method, tgid);
    let check = match checked(s, at, tgid, method, cm) {
        Some(check) => check,
        None => {
            // The class's name, for the check: the method's own addresses
            // are another class's once its class is unloaded.
            let cp = read_user::<u64>(cm.wrapping_add(u64::from(p.cm_constants)))?;
            let holder = read_user::<u64>(cp.wrapping_add(u64::from(p.cp_holder)))?;
            let name = read_user::<u64>(holder.wrapping_add(u64::from(p.klass_name)))?;
            let hash = read_user::<u16>(name.wrapping_add(u64::from(p.sym_hash)))?;
            let check = method_check(cm, name, hash);
            keep_check(s, at, tgid, method, cm, check);
            check
        }
    };
    if !write(
        s,
        tgid,
        JAVA_INTERPRETED,
        method,
        u64::from(check) << 32 | bci,
    ) {
        return Some(1);
    }
    // Taken from the copy only now, which nothing since wrote: held
    // across the calls above, they would be spilled to the stack.
    let sender = slot(&s.jv_buf, p.interp_sender_sp);
    let (bp, ret) = (slot(&s.jv_buf, 0), slot(&s.jv_buf, 8));
    to_caller(s, ret, sender, bp)
}

/// An interpreted frame's check ([`method_check`]) as the kernel worked
/// it out at an earlier frame of the same `Method*` and `ConstMethod*`,
/// while the JVM's count of collections stood where it stands: four reads
/// of the JVM's metadata, one after another and seldom in the CPU's
/// caches, saved at every interpreted frame but a method's first. One
/// slot a `Method*` (by a hash of it and the process), no chain: a slot
/// another method took is read again.
///
/// Sound because the check's other parts (the class and its name) change
/// under a `Method*` and `ConstMethod*` only where the class is unloaded
/// and another loaded into its memory, and a class is unloaded only by a
/// collection that counted itself (`CollectedHeap::_total_collections`)
/// at or before the start of its marking: a method running when its slot
/// was written kept its class alive through any collection already
/// started then. (A redefinition keeps the class, and its name.)
#[derive(Clone, Copy)]
#[repr(C)]
pub(crate) struct JavaCheck {
    /// The frame's `Method*`.
    method: u64,
    /// Its `ConstMethod*` then.
    const_method: u64,
    /// The process, and its salt (`JavaProc::salt`).
    tgid: u32,
    /// See [`JavaCheck::tgid`].
    salt: u32,
    /// The JVM's count of collections before the check was worked out.
    epoch: u32,
    /// The check.
    check: u32,
}

/// Each CPU's interpreted frames' checks ([`JavaCheck`]), in slots of
/// its own ([`cpu_slot`]); user space sizes it.
#[map]
static JAVA_CHECKS: Array<JavaCheck> = Array::with_max_entries(1, 0);

/// The slot of [`JAVA_CHECKS`] for `method` of process `tgid`.
#[inline(always)]
fn check_slot(method: u64, tgid: u32) -> u32 {
    (((method >> 3) ^ (u64::from(tgid) << 29)).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 54) as u32
        & (JAVA_CHECK_SLOTS - 1)
}

/// The JVM's count of collections, read once a walk, at its first
/// interpreted frame; `None` where the JVM's is unknown or unreadable.
#[inline(always)]
fn epoch(s: &mut Scratch) -> Option<u32> {
    if s.jv.epoch == 0 {
        let at = s.jv.proc.gc_count;
        s.jv.epoch = match if at == 0 { None } else { read_user::<u32>(at) } {
            Some(n) => 1 << 32 | u64::from(n),
            None => u64::MAX,
        };
    }
    (s.jv.epoch >> 32 == 1).then_some(s.jv.epoch as u32)
}

/// The check kept in `slot` ([`check_slot`]) for interpreted frame
/// `method` (with `const_method`) of process `tgid`, if it still stands
/// ([`JavaCheck`]).
#[inline(always)]
fn checked(s: &mut Scratch, slot: u32, tgid: u32, method: u64, const_method: u64) -> Option<u32> {
    let epoch = epoch(s)?;
    let c = JAVA_CHECKS.get_ptr(cpu_slot(JAVA_CHECK_SLOTS, slot))?;
    // SAFETY: this CPU's slot; a walk does not nest in another on one CPU.
    let c = unsafe { &*c };
    (c.method == method
        && c.const_method == const_method
        && c.tgid == tgid
        && c.salt == s.jv.proc.salt
        && c.epoch == epoch)
        .then(|| {
            count_error(ERR_JAVA_CHECK_KEPT);
            c.check
        })
}

/// Keeps `check`, just worked out for interpreted frame `method` (with
/// `const_method`) of process `tgid`, in `slot` under the count of
/// collections read before it ([`JavaCheck`]).
#[inline(always)]
fn keep_check(s: &Scratch, slot: u32, tgid: u32, method: u64, const_method: u64, check: u32) {
    if s.jv.epoch >> 32 != 1 {
        return;
    }
    if let Some(c) = JAVA_CHECKS.get_ptr_mut(cpu_slot(JAVA_CHECK_SLOTS, slot)) {
        // SAFETY: as in `checked`.
        unsafe {
            *c = JavaCheck {
                method,
                const_method,
                tgid,
                salt: s.jv.proc.salt,
                epoch: s.jv.epoch as u32,
                check,
            }
        };
    }
}

/// Where the code of the blob read into `s.jv_buf` starts.
#[inline(always)]
fn code_begin(s: &Scratch) -> u64 {
    let p = &s.jv.proc;
    if p.code_is_offset != 0 {
        s.jv.blob
            .wrapping_add((half(&s.jv_buf, p.blob_code) as i32) as i64 as u64)
    } else {
        word(&s.jv_buf, p.blob_code)
    }
}

/// A compiled method, or (`native`) a native method's wrapper.
#[inline(always)]
fn compiled(s: &mut Scratch, tgid: u32, native: bool) -> Option<i64> {
    let p: *const JavaProc = &raw const s.jv.proc;
    // SAFETY: as in `step`.
    let p = unsafe { &*p };
    let begin = code_begin(s);
    let id = half(&s.jv_buf, p.nm_compile_id);
    let mut pc = s.walk.ip;
    // A frame being deoptimized returns to the handler, and keeps its
    // real pc in its frame.
    if p.nm_deopt != 0 && s.jv.top == 0 {
        let handler = if p.deopt_is_offset != 0 {
            begin.wrapping_add((half(&s.jv_buf, p.nm_deopt) as i32) as i64 as u64)
        } else {
            word(&s.jv_buf, p.nm_deopt)
        };
        if pc == handler {
            let at = s
                .walk
                .sp
                .wrapping_add((half(&s.jv_buf, p.nm_orig_pc) as i32) as i64 as u64);
            let [real] = stack::<1>(s, at)?;
            pc = real;
        }
    }
    let off = pc.wrapping_sub(begin) & 0xffff_ffff;
    let tag = if native { JAVA_NATIVE } else { JAVA_COMPILED };
    if !write(s, tgid, tag, s.jv.blob, u64::from(id) << 32 | off) {
        return Some(1);
    }
    let frame = u64::from(half(&s.jv_buf, p.blob_frame_size));
    if native {
        // A method handle's intrinsic (`invokeBasic`, `linkToStatic`, ...)
        // has no frame: it jumps to its target, and is only ever the
        // sampled frame. Other wrappers build one with `enter`: the frame
        // pointer is theirs.
        if frame == 0 {
            return by_return_address(s);
        }
        if s.jv.top != 0 && pc < begin.wrapping_add(frame_complete(s)) {
            return wrapper_prologue(s, frame);
        }
        return by_frame_pointer_top(s);
    }
    if s.jv.top != 0 {
        let complete = frame_complete(s);
        return compiled_top(s, begin, complete, frame);
    }
    by_frame_size(s, frame)
}

/// The blob's `_frame_complete_offset`: where, from its code's start,
/// its frame is built.
#[inline(always)]
fn frame_complete(s: &Scratch) -> u64 {
    let p = &s.jv.proc;
    // An `int16_t` in JDK 25.
    (if p.frame_complete_short != 0 {
        i64::from(quarter(&s.jv_buf, p.blob_frame_complete) as i16)
    } else {
        i64::from(half(&s.jv_buf, p.blob_frame_complete) as i32)
    }) as u64
}

/// The sampled frame of a native method's wrapper (of `words` words) in
/// its prologue, before `_frame_complete_offset`. Between `push rbp` and
/// `mov rbp, rsp`, rbp is pushed. Past them (`sub rsp`, the entry
/// barrier), rbp is the wrapper's frame pointer: `sp` itself, or once
/// `sub rsp` ran, its frame's size less the return address and saved
/// rbp above it. Before them (the inline cache's check, the stack bang,
/// `push rbp` itself), nothing is pushed and rbp is the caller's, which
/// is neither but by a chance no caller's rbp meets. Told apart by the
/// registers rather than by finding the `push rbp` ahead, which would
/// take a loop over the bytes that older kernels' verifiers cannot
/// afford in the walk.
#[inline(always)]
fn wrapper_prologue(s: &mut Scratch, words: u64) -> Option<i64> {
    let code = read_user::<[u8; 4]>(s.walk.ip.wrapping_sub(1))?;
    let at = |i: usize| code.get(i).copied().unwrap_or(0);
    if at(0) == 0x55 && is_mov_rbp_rsp(at(1), at(2), at(3)) {
        return by_pushed_rbp(s);
    }
    let (sp, bp) = (s.walk.sp, s.walk.bp);
    if bp == sp || bp == sp.wrapping_add(words.wrapping_mul(8)).wrapping_sub(16) {
        return by_frame_pointer(s);
    }
    by_return_address(s)
}

/// Whether the three bytes are `mov rbp, rsp`: HotSpot's assembler
/// writes `48 8b ec`; a C compiler's, `48 89 e5`.
#[inline(always)]
fn is_mov_rbp_rsp(b0: u8, b1: u8, b2: u8) -> bool {
    b0 == 0x48 && ((b1 == 0x8b && b2 == 0xec) || (b1 == 0x89 && b2 == 0xe5))
}

/// `W` words of the stack at `addr` (`runtime::stack_words`): a Java
/// frame's slots are read from the copy of the stack's top where it
/// holds them.
#[inline(always)]
fn stack<const W: usize>(s: &Scratch, addr: u64) -> Option<[u64; W]> {
    stack_words::<W>(&s.chunk, (s.walk.chunk_base, s.walk.chunk_len), addr)
}

/// A frame of known size: the caller's sp is past it, its return address
/// and saved rbp just below.
#[inline(always)]
fn by_frame_size(s: &mut Scratch, words: u64) -> Option<i64> {
    let csp = s.walk.sp.wrapping_add(words.wrapping_mul(8));
    let [bp, ret] = stack::<2>(s, csp.wrapping_sub(16))?;
    to_caller(s, ret, csp, bp)
}

/// A frame built with `push rbp; mov rbp, rsp` (or `enter`).
#[inline(always)]
fn by_frame_pointer(s: &mut Scratch) -> Option<i64> {
    let fp = s.walk.bp;
    if fp & 7 != 0 || fp < s.walk.sp {
        return None;
    }
    let [bp, ret] = stack::<2>(s, fp)?;
    to_caller(s, ret, fp.wrapping_add(16), bp)
}

/// Nothing pushed yet (or all popped): the return address is at sp.
#[inline(always)]
fn by_return_address(s: &mut Scratch) -> Option<i64> {
    let sp = s.walk.sp;
    let [ret] = stack::<1>(s, sp)?;
    let bp = s.walk.bp;
    to_caller(s, ret, sp.wrapping_add(8), bp)
}

/// Only rbp pushed: it, then the return address.
#[inline(always)]
fn by_pushed_rbp(s: &mut Scratch) -> Option<i64> {
    let sp = s.walk.sp;
    let [bp, ret] = stack::<2>(s, sp)?;
    to_caller(s, ret, sp.wrapping_add(16), bp)
}

/// The sampled frame of a compiled method, which may be in its prologue
/// (before `_frame_complete_offset`) or its epilogue: the instructions
/// around the pc say how much of the frame there is (HotSpot's x86-64
/// prologues and epilogues, `jvm.md` §3).
#[inline(always)]
fn compiled_top(s: &mut Scratch, begin: u64, complete: u64, words: u64) -> Option<i64> {
    let pc = s.walk.ip;
    // Eight bytes before the pc and eight from it.
    let code = read_user::<[u8; 16]>(pc.wrapping_sub(8))?;
    let at = |i: usize| code.get(i).copied().unwrap_or(0);
    let (b0, b1, b2) = (at(8), at(9), at(10));
    if pc < begin.wrapping_add(complete) {
        // `push rbp` not yet run, or the stack bang, or the inline
        // cache's check before the verified entry: nothing pushed.
        let sub = b0 == 0x48 && (b1 == 0x83 || b1 == 0x81) && b2 == 0xec;
        if sub && at(7) == 0x55 {
            // `sub rsp` right after `push rbp`.
            return by_pushed_rbp(s);
        }
        // `mov [rsp+X], rbp` (the frame allocated, rbp not saved yet) and
        // the entry barrier (`cmp [r15+X]`; `jne`): the frame is whole.
        let mov_rbp = b0 == 0x48 && b1 == 0x89 && (b2 == 0x6c || b2 == 0xac);
        let barrier = b0 == 0x41 && (b1 == 0x81 || b1 == 0x83) && b2 == 0x7f;
        let jne = (b0 == 0x0f && b1 == 0x85) || b0 == 0x75;
        if mov_rbp {
            // The caller's rbp is still in the register.
            let csp = s.walk.sp.wrapping_add(words.wrapping_mul(8));
            let [ret] = stack::<1>(s, csp.wrapping_sub(8))?;
            let bp = s.walk.bp;
            return to_caller(s, ret, csp, bp);
        }
        if barrier || jne {
            return by_frame_size(s, words);
        }
        return by_return_address(s);
    }
    // The epilogue: `add rsp, X; pop rbp; cmp rsp, [r15+X]; ja; ret`.
    if b0 == 0x5d {
        return by_pushed_rbp(s);
    }
    // `cmp rsp, [r15+disp8]` or `[r15+disp32]` after the pop, or `ja`
    // after either, or `ret`.
    let cmp_here = b0 == 0x49 && b1 == 0x3b && (b2 == 0x67 || b2 == 0xa7);
    let ja = b0 == 0x0f && b1 == 0x87;
    let cmp8_before = at(4) == 0x49 && at(5) == 0x3b && at(6) == 0x67;
    let cmp32_before = at(1) == 0x49 && at(2) == 0x3b && at(3) == 0xa7;
    if b0 == 0xc3 || cmp_here || (ja && (cmp8_before || cmp32_before)) {
        return by_return_address(s);
    }
    by_frame_size(s, words)
}

/// Any other blob: the call stub and other `StubRoutines` build a frame
/// with rbp; runtime stubs have a size; vtable stubs (`vtable`) push
/// nothing.
#[inline(always)]
fn stub(s: &mut Scratch, tgid: u32, vtable: bool) -> Option<i64> {
    let p: *const JavaProc = &raw const s.jv.proc;
    // SAFETY: as in `step`.
    let p = unsafe { &*p };
    if !write_stub(s, tgid) {
        return Some(1);
    }
    if vtable {
        return by_return_address(s);
    }
    let words = u64::from(half(&s.jv_buf, p.blob_frame_size));
    if words != 0 && words < 1 << 16 {
        return by_frame_size(s, words);
    }
    by_frame_pointer_top(s)
}

/// A frame built with `push rbp; mov rbp, rsp` (or `enter`, undone by
/// `leave`), which the sampled frame may be at the first of, between the
/// two, or after `leave`: its frame not (or no longer) built.
#[inline(always)]
fn by_frame_pointer_top(s: &mut Scratch) -> Option<i64> {
    if s.jv.top != 0 {
        // Ten bytes before the pc (`at(10)` is the pc's), 22 from it.
        let code = read_user::<[u8; 32]>(s.walk.ip.wrapping_sub(10))?;
        let at = |i: usize| code.get(i).copied().unwrap_or(0);
        // A native wrapper's end, after its `leave`: its check for a
        // pending exception, `cmp qword [r15+8], 0` (an imm32 in JDK 17,
        // an imm8 in 21 and 25), then `jne +1; ret`; in 25 a safepoint
        // poll before it, `test byte [r15+X], 1; je`, right after the
        // `leave`. From the `cmp` on, nothing but `ret` comes before the
        // return, so the return address is at sp, whatever came before.
        let jne_ret = |i: usize| {
            at(i) == 0x0f
                && at(i + 1) == 0x85
                && at(i + 2) == 1
                && at(i + 3) | at(i + 4) | at(i + 5) == 0
                && at(i + 6) == 0xc3
        };
        let cmp = at(10) == 0x49 && at(12) == 0x7f && at(13) == 8;
        let at_cmp = cmp && ((at(11) == 0x83 && jne_ret(15)) || (at(11) == 0x81 && jne_ret(18)));
        let test_at =
            |i: usize| at(i) == 0xc9 && at(i + 1) == 0x41 && at(i + 2) == 0xf6 && at(i + 3) == 0x47;
        let at_poll = test_at(9) || (test_at(4) && at(10) == 0x74);
        // At `push rbp` or `ret`.
        if at(10) == 0x55 || at(10) == 0xc3 || at_cmp || jne_ret(10) || at_poll {
            return by_return_address(s);
        }
        if at(9) == 0x55 && is_mov_rbp_rsp(at(10), at(11), at(12)) {
            return by_pushed_rbp(s);
        }
    }
    by_frame_pointer(s)
}

/// The call stub at its return address ([`JavaProc::call_stub_ret`]):
/// written as [`stub`] writes a blob, and stepped as `stub` steps one of
/// no frame size (the stub's `BufferBlob`), by its frame pointer.
#[inline(always)]
fn call_stub(s: &mut Scratch, tgid: u32) -> Option<i64> {
    if !write_stub(s, tgid) {
        return Some(1);
    }
    by_frame_pointer(s)
}

/// Writes the stub frame of blob `s.jv.blob` at the walk's pc (its
/// offset into the blob); `false` if the stack is full.
#[inline(always)]
fn write_stub(s: &mut Scratch, tgid: u32) -> bool {
    let blob = s.jv.blob;
    let off = s.walk.ip.wrapping_sub(blob) & 0xffff_ffff;
    write(s, tgid, JAVA_STUB, blob, off)
}

/// Forgets a process's JVM: it ran a new program or exited.
#[inline(always)]
pub(crate) fn forget(tgid: u32) {
    let _ = JAVA_PROCS.remove(tgid);
}

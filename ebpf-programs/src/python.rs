//! CPython's frames, spliced into the CFI walk: where the native walk
//! meets `_PyEval_EvalFrameDefault`, that activation's Python frames are
//! written in its place, read from the thread's chain of interpreter
//! frames, one a step of the walk's loop (a nested loop would have the
//! verifier follow every frame of it through the rest of the step).
//!
//! User space tells the kernel of each Python process ([`PyProc`]: the
//! interpreter's offsets and where its thread state is); this side finds
//! the thread's state from its thread pointer, follows the chain, checks
//! every code object's type, and names each by its address and a check
//! ([`code_check`]) that user space reads back while the process lives.

use aya_ebpf::{
    helpers::{bpf_get_current_task_btf, generated},
    macros::map,
    maps::{HashMap, PerCpuArray},
};
use rtrace_common::{
    python::{
        CHAIN_310, CHAIN_311, CODE_BYTES, FRAME_BYTES, OWNED_BY_CSTACK, PY_ADDR_MASK, PY_FRAME,
        PyCode, PyProc, code_check,
    },
    stacks::{ERR_PY_BAD, ERR_PY_TSTATE, SEEN_PY_CODE},
};

use crate::{
    count_error, read_kernel, read_user,
    scratch::{PY_NEW, Scratch, push},
};

/// The Python processes, by process id; user space fills it.
#[map]
pub(crate) static PY_PROCS: HashMap<u32, PyProc> = HashMap::with_max_entries(1, 0);

/// Code objects each CPU has told user space of, by a hash of process,
/// address and check, in a table without chains: a code object whose
/// slot another took is told again, which costs user space a lookup.
#[map]
static PY_TOLD: PerCpuArray<u64> = PerCpuArray::with_max_entries(TOLD_SLOTS, 0);
/// Slots of [`PY_TOLD`], a power of two.
const TOLD_SLOTS: u32 = 4096;

/// Reads `len` bytes of user memory at `addr` into `buf`.
#[inline(always)]
fn read_into(buf: &mut [u64; 16], addr: u64, len: usize) -> bool {
    // SAFETY: `buf` has room for 128 bytes, `len` is at most that; the
    // helper copes with any address.
    unsafe {
        generated::bpf_probe_read_user(
            buf.as_mut_ptr().cast(),
            len.min(128) as u32,
            addr as *const core::ffi::c_void,
        ) == 0
    }
}

/// The word at byte `off` of `buf` (rounded down to a word).
#[inline(always)]
fn word(buf: &[u64; 16], off: u16) -> u64 {
    buf.get(usize::from(off / 8) & 15).copied().unwrap_or(0)
}

/// The `u32` at byte `off` (a multiple of 4) of `buf`.
#[inline(always)]
fn half(buf: &[u64; 16], off: u16) -> u32 {
    (word(buf, off) >> ((off & 4) * 8)) as u32
}

/// The byte at `off` of `buf`.
#[inline(always)]
fn byte(buf: &[u64; 16], off: u16) -> u8 {
    (word(buf, off) >> ((off & 7) * 8)) as u8
}

/// The current thread's newest Python frame, or 0 where it runs no
/// Python (no thread state); counted where the state could not be read.
#[inline(always)]
fn first_frame(py: &PyProc, fsbase_off: u32) -> u64 {
    // SAFETY: the helper has no preconditions.
    let task = unsafe { bpf_get_current_task_btf() } as *const u8;
    let Ok(fsbase) = read_kernel::<u64>(task, fsbase_off) else {
        count_error(ERR_PY_TSTATE);
        return 0;
    };
    // `Py_tss_t`: `int _is_initialized; pthread_key_t _key`.
    let Some(tss) = read_user::<u64>(py.tss_addr) else {
        count_error(ERR_PY_TSTATE);
        return 0;
    };
    let key = tss >> 32;
    // Not set up yet (a program starting), or a key glibc keeps out of
    // the thread's own block.
    if tss as u32 == 0 || key >= 32 {
        return 0;
    }
    let slot = fsbase
        .wrapping_add(py.key_block as u64)
        .wrapping_add(key * 16 + 8);
    let Some(tstate) = read_user::<u64>(slot) else {
        count_error(ERR_PY_TSTATE);
        return 0;
    };
    if tstate == 0 {
        return 0;
    }
    let Some(mut frame) = read_user::<u64>(tstate.wrapping_add(u64::from(py.ts_frame))) else {
        count_error(ERR_PY_TSTATE);
        return 0;
    };
    if py.chain == CHAIN_311 || py.chain == rtrace_common::python::CHAIN_312 {
        // `tstate->cframe->current_frame`.
        if frame == 0 {
            return 0;
        }
        frame = read_user::<u64>(frame.wrapping_add(u64::from(py.cframe_current))).unwrap_or(0);
    }
    frame
}

/// What the walk does with the native frame at hand after [`at_frame`].
pub(crate) enum Next {
    /// A Python frame was written (or a shim passed): the step is over.
    Done,
    /// Go on with the native frame: record it or not (it is an
    /// activation of the interpreter whose Python frames were written).
    Native { record: bool },
}

/// The Python part of one step of the walk, at native frame `ip`: at the
/// interpreter's loop, its activation's Python frames are written, one a
/// step, and the activation itself is not.
#[inline(always)]
pub(crate) fn at_frame(s: &mut Scratch, tgid: u32) -> Next {
    // The interpreter's offsets, read where they are (a map value): a copy
    // would take room on the eBPF stack.
    let py: *const PyProc = &raw const s.py.proc;
    // SAFETY: `py` points into the scratch map value, which outlives the
    // step, and nothing writes `s.py.proc` during it.
    let py = unsafe { &*py };
    if s.py.mode == 0 {
        let ip = s.walk.ip;
        let in_eval = (ip >= py.eval_start && ip < py.eval_end)
            || (ip >= py.eval2_start && ip < py.eval2_end);
        if s.py.frame == 0 || !in_eval {
            return Next::Native { record: true };
        }
        s.py.mode = 1;
        s.py.emitted = 0;
        // Python frames make a walk depend on more than the stack's words.
        s.walk.unremembered = 1;
    }
    let f = s.py.frame;
    let buf = &mut s.py_buf;
    if !read_into(buf, f, FRAME_BYTES) {
        return give_up(s);
    }
    // 3.14's `f_executable` is a tagged `_PyStackRef` (bit 0 marks an
    // immortal or borrowed reference); every version's code object is
    // aligned, so the low bits are cleared for all.
    let code = word(buf, py.frame_code) & !3;
    let back = word(buf, py.frame_back);
    let instr = if py.chain == CHAIN_310 {
        u64::from(half(buf, py.frame_instr))
    } else {
        word(buf, py.frame_instr)
    };
    let entry = byte(buf, py.frame_entry);
    s.py.frame = back;
    // 3.12+: the shim that marks where C entered the interpreter ends
    // the activation; it is not a Python function.
    if py.chain > rtrace_common::python::CHAIN_311 && entry == OWNED_BY_CSTACK {
        return end(s);
    }
    let last = back == 0 || py.chain == CHAIN_310 || (py.chain == CHAIN_311 && entry != 0);
    let buf = &mut s.py_buf;
    if code == 0 || !read_into(buf, code, CODE_BYTES) {
        return give_up(s);
    }
    // ob_type, after the reference count.
    if buf[1] != py.code_type {
        // 3.13+'s `f_executable` may hold something else than code (a
        // shim's None): skipped; in older versions, a frame half set up.
        if py.chain < rtrace_common::python::CHAIN_313 {
            return give_up(s);
        }
        return if last { end(s) } else { Next::Done };
    }
    let check = code_check(
        half(buf, py.code_firstlineno),
        word(buf, py.code_name),
        word(buf, py.code_filename),
    );
    let lasti = if py.lines == 0 {
        0
    } else if py.chain == CHAIN_310 {
        instr
    } else {
        instr.wrapping_sub(code.wrapping_add(u64::from(py.code_adaptive))) / 2
    };
    push(s, PY_FRAME | (code & PY_ADDR_MASK));
    push(s, (u64::from(check) << 32) | (lasti & 0xffff_ffff));
    s.py.emitted += 1;
    tell(s, tgid, code, check);
    if last { end(s) } else { Next::Done }
}

/// Ends an activation: its native frame is recorded only if none of its
/// Python frames were.
#[inline(always)]
fn end(s: &mut Scratch) -> Next {
    s.py.mode = 0;
    Next::Native {
        record: s.py.emitted == 0,
    }
}

/// A frame that could not be read, or failed its check: counted, and the
/// rest of the walk is native.
#[inline(always)]
fn give_up(s: &mut Scratch) -> Next {
    count_error(ERR_PY_BAD);
    s.py.frame = 0;
    end(s)
}

/// Queues the code object for user space the first time this CPU meets
/// it (see [`PY_TOLD`]); a walk queues at most `PY_NEW`, the rest are
/// told by a later one.
#[inline(always)]
fn tell(s: &mut Scratch, tgid: u32, code: u64, check: u32) {
    if s.py.nnew as usize >= PY_NEW {
        return;
    }
    // The salt tells a pid's processes apart (`PyProc::salt`).
    let h = (code
        ^ (u64::from(check) << 17)
        ^ (u64::from(tgid) << 40)
        ^ (u64::from(s.py.proc.salt) << 7))
        .wrapping_mul(0xff51_afd7_ed55_8ccd);
    let Some(told) = PY_TOLD.get_ptr_mut((h >> 40) as u32 & (TOLD_SLOTS - 1)) else {
        return;
    };
    // SAFETY: a per-CPU map value.
    unsafe {
        if *told == h {
            return;
        }
        *told = h;
    }
    if let Some(q) = s.py_new.get_mut(s.py.nnew as usize) {
        *q = PyCode {
            tgid,
            flags: SEEN_PY_CODE,
            addr: code,
            check,
            _pad: 0,
            born: 0,
        };
        s.py.nnew += 1;
    }
}

/// The code objects a walk queued, sent. A function of its own: inlined,
/// its locals would grow the frame of every program that walks.
#[inline(never)]
pub(crate) fn send_new<C: aya_ebpf::EbpfContext, S: crate::events::Sink>(
    ctx: &C,
    events: &S,
    s: &mut Scratch,
) {
    if s.py.nnew == 0 {
        return;
    }
    // Read only where there is a record to send: this runs every walk.
    let born = crate::process::born();
    for i in 0..PY_NEW {
        if i as u32 >= s.py.nnew {
            break;
        }
        if let Some(q) = s.py_new.get_mut(i) {
            q.born = born;
            crate::events::emit_now(events, ctx, q);
        }
    }
}

/// `PyWalk::mode` of a walk whose Python part is not set up yet: the
/// program that walks sets it, the first step sets the part up.
pub(crate) const NOT_STARTED: u32 = 2;

/// Sets up the Python part of a walk of process `tgid`, at its first
/// step (in the step, not in the program that walks: there its call
/// would grow a frame that with the step's must stay within 512 bytes on
/// kernels before 6.13): field by field (see `PyWalk`), with the
/// process's interpreter copied in if user space gave it one, and the
/// thread's newest frame. Inlined: a function called from the step would
/// add its own frame to that chain (on 6.1 the walk then did not load).
#[inline(always)]
pub(crate) fn start(s: &mut Scratch, tgid: u32, fsbase_off: u32) {
    s.py.frame = 0;
    s.py.on = 0;
    s.py.mode = 0;
    s.py.emitted = 0;
    s.py.nnew = 0;
    let Some(p) = PY_PROCS.get_ptr(tgid) else {
        return;
    };
    // SAFETY: a map value, copied into another.
    s.py.proc = unsafe { *p };
    s.py.on = 1;
    s.py.frame = first_frame(&s.py.proc, fsbase_off);
}

/// Forgets a process's interpreter: it ran a new program or exited.
#[inline(always)]
pub(crate) fn forget(tgid: u32) {
    let _ = PY_PROCS.remove(tgid);
}

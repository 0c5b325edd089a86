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
    maps::HashMap,
};
use rtrace_common::{
    python::{
        CHAIN_310, CHAIN_311, CODE_BYTES, FRAME_BYTES, LINES_BYTES, OWNED_BY_CSTACK, PY_ADDR_MASK,
        PY_FRAME, PY_TASK, PY_TASK_NUMBER, PyCode, PyProc, code_check, str_check,
    },
    stacks::{ERR_PY_BAD, ERR_PY_TSTATE, SEEN_PY_CODE, SEEN_PY_TASK},
};

use crate::{
    count_error, read_kernel, read_user,
    runtime::{Told, byte, half, queue_slot, read_into, told_table, word},
    scratch::{PY_NEW, Scratch, push2},
};

/// The Python processes, by process id; user space fills it.
#[map]
pub(crate) static PY_PROCS: HashMap<u32, PyProc> = HashMap::with_max_entries(1, 0);

/// Code objects each CPU has told user space of, by a hash of process,
/// address and check (`runtime::newly_told`).
#[map]
static PY_TOLD: Told = told_table();

/// A thread's state, as the walk last found it ([`PY_THREADS`]).
#[repr(C)]
struct PyThread {
    /// Its address; 0 for none kept.
    tstate: u64,
    /// The process and its salt it was found in: a thread that ran a new
    /// program keeps its storage.
    tgid: u32,
    salt: u32,
    /// Samples that took it as kept since it was last found: it is found
    /// anew every [`REFIND`].
    uses: u32,
    _pad: u32,
}

/// Each thread's state, kept so that a sample reads one thing to reach
/// the thread's newest frame where finding it takes three (the runtime's
/// key, glibc's slot of it, the state). It is checked in that one read:
/// the state's `thread_id` must still be this thread's thread pointer, so
/// that a state freed and another thread's allocated at its address is
/// not taken; and it is found anew now and then ([`REFIND`]), so that a
/// thread that swapped its state (a C thread entering Python again, or
/// another interpreter's) does not keep an old one long. Frames read
/// from a stale state are then checked as all frames are, by their code
/// objects' types and checks.
#[unsafe(link_section = ".maps")]
#[unsafe(no_mangle)]
static PY_THREADS: crate::task_storage::TaskStorage<PyThread> =
    crate::task_storage::TaskStorage::new();

/// Samples a kept thread state serves before it is found anew.
const REFIND: u32 = 64;

/// The current thread's newest Python frame, or 0 where it runs no
/// Python (no thread state); counted where the state could not be read.
/// What it needs after a helper call is kept in the scratch value, not in
/// registers: their spills would grow the walk's step past what 6.1 allows
/// the off-CPU program's chain of frames.
#[inline(always)]
fn first_frame(s: &mut Scratch, tgid: u32, fsbase_off: u32) -> u64 {
    // SAFETY: the helper has no preconditions.
    let task = unsafe { bpf_get_current_task_btf() } as *const u8;
    let Ok(fsbase) = read_kernel::<u64>(task, fsbase_off) else {
        count_error(ERR_PY_TSTATE);
        return 0;
    };
    s.py.fsbase = fsbase;
    if s.py.proc.ts_thread_id != 0
        && let Some(frame) = kept_frame(s, task, tgid)
    {
        return frame;
    }
    // `Py_tss_t`: `int _is_initialized; pthread_key_t _key`.
    let Some(tss) = read_user::<u64>(s.py.proc.tss_addr) else {
        count_error(ERR_PY_TSTATE);
        return 0;
    };
    let key = tss >> 32;
    // Not set up yet (a program starting), or a key glibc keeps out of
    // the thread's own block.
    if tss as u32 == 0 || key >= 32 {
        return 0;
    }
    let slot =
        s.py.fsbase
            .wrapping_add(s.py.proc.key_block as u64)
            .wrapping_add(key * 16 + 8);
    let Some(tstate) = read_user::<u64>(slot) else {
        count_error(ERR_PY_TSTATE);
        return 0;
    };
    if tstate == 0 {
        return 0;
    }
    s.py.tstate = tstate;
    if s.py.proc.ts_thread_id != 0 {
        return keep(s, task, tgid);
    }
    let Some(frame) = read_user::<u64>(tstate.wrapping_add(u64::from(s.py.proc.ts_frame))) else {
        count_error(ERR_PY_TSTATE);
        return 0;
    };
    current_frame(&s.py.proc, frame)
}

/// Where the one read of a thread state starts (the lower of its frame
/// field and `thread_id`), and how long it is.
#[inline(always)]
fn window(py: &PyProc) -> (u16, usize) {
    let (f, t) = (py.ts_frame, py.ts_thread_id);
    (f.min(t), usize::from(f.abs_diff(t)) + 8)
}

/// The newest frame by the state kept for the thread, if it is still the
/// thread's (its `thread_id` is the thread pointer) and not due to be
/// found anew; else the kept state is dropped.
#[inline(always)]
fn kept_frame(s: &mut Scratch, task: *const u8, tgid: u32) -> Option<u64> {
    let kept = PY_THREADS.get(task, true);
    if kept.is_null() {
        return None;
    }
    // SAFETY: this thread's storage.
    let k = unsafe { &mut *kept };
    if k.tstate != 0 && k.tgid == tgid && k.salt == s.py.proc.salt && k.uses < REFIND {
        let (lo, len) = window(&s.py.proc);
        if read_into(&mut s.py_buf, k.tstate.wrapping_add(u64::from(lo)), len) {
            let (lo, _) = window(&s.py.proc);
            if word(&s.py_buf, s.py.proc.ts_thread_id - lo) == s.py.fsbase {
                k.uses += 1;
                s.py.tstate = k.tstate;
                let frame = word(&s.py_buf, s.py.proc.ts_frame - lo);
                return Some(current_frame(&s.py.proc, frame));
            }
        }
    }
    k.tstate = 0;
    None
}

/// The newest frame of thread state `s.py.tstate`, just found, which is
/// kept for the thread if its `thread_id` is the thread pointer (else the
/// next sample would read it for nothing).
#[inline(always)]
fn keep(s: &mut Scratch, task: *const u8, tgid: u32) -> u64 {
    let (lo, len) = window(&s.py.proc);
    if !read_into(&mut s.py_buf, s.py.tstate.wrapping_add(u64::from(lo)), len) {
        count_error(ERR_PY_TSTATE);
        return 0;
    }
    if word(&s.py_buf, s.py.proc.ts_thread_id - lo) == s.py.fsbase {
        let kept = PY_THREADS.get(task, false);
        if !kept.is_null() {
            // SAFETY: this thread's storage.
            let k = unsafe { &mut *kept };
            k.tstate = s.py.tstate;
            k.tgid = tgid;
            k.salt = s.py.proc.salt;
            k.uses = 0;
        }
    }
    let (lo, _) = window(&s.py.proc);
    let frame = word(&s.py_buf, s.py.proc.ts_frame - lo);
    current_frame(&s.py.proc, frame)
}

/// The newest frame from the thread state's field `frame`: itself, or
/// (3.11, 3.12) its `_PyCFrame`'s `current_frame`.
#[inline(always)]
fn current_frame(py: &PyProc, frame: u64) -> u64 {
    if py.chain == CHAIN_311 || py.chain == rtrace_common::python::CHAIN_312 {
        if frame == 0 {
            return 0;
        }
        return read_user::<u64>(frame.wrapping_add(u64::from(py.cframe_current))).unwrap_or(0);
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
    push2(
        s,
        PY_FRAME | (code & PY_ADDR_MASK),
        (u64::from(check) << 32) | (lasti & 0xffff_ffff),
    );
    s.py.emitted += 1;
    tell(s, tgid, code, check, SEEN_PY_CODE);
    if f == s.py.task_frame {
        // The running task's coroutine: the task above it. Read where
        // they are: a copy would take room on the stack, which the walk's
        // step has none of to spare on 6.1.
        push2(s, s.py.task_slots[0], s.py.task_slots[1]);
    }
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
/// told by a later one, or with their stack (`send_new`).
#[inline(always)]
fn tell(s: &mut Scratch, tgid: u32, code: u64, check: u32, flags: u32) {
    // The salt tells a pid's processes apart (`PyProc::salt`).
    let h = (code
        ^ (u64::from(check) << 17)
        ^ (u64::from(tgid) << 40)
        ^ (u64::from(s.py.proc.salt) << 7))
        .wrapping_mul(0xff51_afd7_ed55_8ccd);
    let Some(i) = queue_slot::<PY_NEW>(&PY_TOLD, h, &mut s.py.nnew) else {
        return;
    };
    if let Some(q) = s.py_new.get_mut(i) {
        // Field by field: the record is too big to be built on the stack.
        q.tgid = tgid;
        q.flags = flags;
        q.addr = code;
        q.check = check;
    }
}

/// Copies code object `q.addr`'s qualified name, file, first line (and
/// line table under `--lines`) into `q`, if it still passes its check;
/// what could not be copied has kind 0 (the table: length `u32::MAX`).
#[inline(always)]
fn copy_names(q: &mut PyCode, py: &PyProc, buf: &mut [u64; 16]) {
    q.kinds = 0;
    q.name_len = 0;
    q.file_len = 0;
    q.lines_len = u32::MAX;
    q.firstlineno = 0;
    if q.flags & SEEN_PY_TASK != 0 {
        // A task's name, if it is still the string the walk saw.
        if str_at(py, buf, q.addr).is_some_and(|(_, _, c)| c == q.check) {
            let (len, kind) = copy_str(py, buf, q.addr, &mut q.name, false);
            q.name_len = len;
            q.kinds = u32::from(kind);
        }
        return;
    }
    if !read_into(buf, q.addr, CODE_BYTES) || buf[1] != py.code_type {
        return;
    }
    let first = half(buf, py.code_firstlineno);
    let file = word(buf, py.code_filename);
    if code_check(first, word(buf, py.code_name), file) != q.check {
        return;
    }
    q.firstlineno = first;
    // Past the head the walk reads.
    let qualname = read_user::<u64>(q.addr.wrapping_add(u64::from(py.code_qualname))).unwrap_or(0);
    let table = if py.lines != 0 {
        read_user::<u64>(q.addr.wrapping_add(u64::from(py.code_linetable))).unwrap_or(0)
    } else {
        0
    };
    let (len, kind) = copy_str(py, buf, qualname, &mut q.name, false);
    q.name_len = len;
    let (flen, fkind) = copy_str(py, buf, file, &mut q.file, true);
    q.file_len = flen;
    q.kinds = u32::from(kind) | u32::from(fkind) << 8;
    if table != 0 {
        // `PyBytesObject`: the size at 16, the bytes at 32.
        if let Some(n) = read_user::<u64>(table.wrapping_add(16)) {
            let take = if n > LINES_BYTES as u64 {
                LINES_BYTES as u64
            } else {
                n
            };
            if read_user_bytes(&mut q.lines, take as u32, table.wrapping_add(32)) {
                q.lines_len = n as u32;
            }
        }
    }
}

/// Copies the characters of the compact `str` at `addr` into `dst`, its
/// head, or its tail if `tail`: its whole length in bytes and its kind
/// (1, 2 or 4 bytes a character), or kind 0 where it is not a compact
/// string.
#[inline(always)]
fn copy_str<const N: usize>(
    py: &PyProc,
    buf: &mut [u64; 16],
    addr: u64,
    dst: &mut [u8; N],
    tail: bool,
) -> (u32, u8) {
    let Some((off, bytes, kind)) = str_head(py, buf, addr, 40) else {
        return (0, 0);
    };
    let data = addr.wrapping_add(off);
    let cap = N as u64;
    let (from, take) = if bytes <= cap {
        (data, bytes)
    } else if tail {
        (data.wrapping_add(bytes - cap), cap)
    } else {
        (data, cap)
    };
    if !read_user_bytes(dst, take as u32, from) {
        return (0, 0);
    }
    (bytes as u32, kind as u8)
}

/// Reads the first `len` bytes of the compact `str` at `addr` into `buf`:
/// where its characters are (from `addr`), how many bytes they take, and
/// their kind (1, 2 or 4 bytes each); `None` where it is not one.
#[inline(always)]
fn str_head(py: &PyProc, buf: &mut [u64; 16], addr: u64, len: usize) -> Option<(u64, u64, u32)> {
    // `PyASCIIObject`: the type at 8, the length in characters at 16, the
    // state's bits at 32 (kind at 2, compact at 5, ascii at 6).
    if addr == 0 || !read_into(buf, addr, len) || buf[1] != py.unicode_type {
        return None;
    }
    let state = half(buf, 32);
    let kind = (state >> 2) & 7;
    if (state >> 5) & 1 == 0 || !(kind == 1 || kind == 2 || kind == 4) {
        return None;
    }
    let bytes = buf[2].wrapping_mul(u64::from(kind));
    if bytes > 1 << 20 {
        return None;
    }
    let off = u64::from(if (state >> 6) & 1 == 1 {
        py.str_ascii
    } else {
        py.str_compact
    });
    Some((off, bytes, kind))
}

/// The compact `str` at `addr`, its first 128 bytes read into `buf`: where
/// its characters are, how many bytes, and its check ([`str_check`]).
#[inline(always)]
fn str_at(py: &PyProc, buf: &mut [u64; 16], addr: u64) -> Option<(u64, u64, u32)> {
    let (off, bytes, _) = str_head(py, buf, addr, 128)?;
    Some((off, bytes, str_check(buf, off, bytes)))
}

/// Finds the asyncio task the thread runs (3.14, where `_asyncio` told
/// where to look) and sets up its frame: its coroutine's frame, after
/// which the walk writes it, and its two slots; a task named by the
/// program is told to user space as code objects are.
#[inline(always)]
fn running_task(s: &mut Scratch, tgid: u32) {
    let py = &s.py.proc;
    let (coro_off, name_off) = (py.task_coro, py.task_name);
    let Some(task) = read_user::<u64>(s.py.tstate.wrapping_add(u64::from(py.ts_running_task)))
    else {
        return;
    };
    if task == 0 {
        return;
    }
    // The coroutine and the name, in one read.
    let lo = coro_off.min(name_off);
    let buf = &mut s.py_buf;
    if !read_into(
        buf,
        task.wrapping_add(u64::from(lo)),
        usize::from(coro_off.abs_diff(name_off)) + 8,
    ) {
        return;
    }
    let coro = word(buf, coro_off - lo);
    let name = word(buf, name_off - lo);
    if coro == 0 || name == 0 {
        return;
    }
    let frame = coro.wrapping_add(u64::from(py.gen_iframe));
    let long_type = py.long_type;
    // The slots are written in place, not built on the stack (see
    // `at_frame`).
    if let Some((_, _, check)) = str_at(&s.py.proc, &mut s.py_buf, name) {
        s.py.task_slots[0] = PY_TASK | (name & PY_ADDR_MASK);
        s.py.task_slots[1] = u64::from(check) << 32;
        tell(s, tgid, name, check, SEEN_PY_CODE | SEEN_PY_TASK);
    } else if s.py_buf[1] == long_type && s.py_buf[2] == 1 << 3 {
        // `PyLongObject` (3.12+): `lv_tag` (digits << 3 | sign) at 16,
        // the first 30-bit digit at 24. One digit, positive.
        s.py.task_slots[0] = PY_TASK | PY_TASK_NUMBER | u64::from(half(&s.py_buf, 24));
        s.py.task_slots[1] = 0;
    } else {
        return;
    }
    s.py.task_frame = frame;
}

/// Reads `len` (at most `N`) bytes of user memory at `addr` into `dst`.
#[inline(always)]
fn read_user_bytes<const N: usize>(dst: &mut [u8; N], len: u32, addr: u64) -> bool {
    let len = if len as usize > N { N as u32 } else { len };
    // SAFETY: `dst` has room for `N` bytes, `len` is at most that; the
    // helper copes with any address.
    unsafe {
        generated::bpf_probe_read_user(
            dst.as_mut_ptr().cast(),
            len,
            addr as *const core::ffi::c_void,
        ) == 0
    }
}

/// The code objects a walk queued, sent. A function of its own: inlined,
/// its locals would grow the frame of every program that walks. Returns
/// whether the walk met more new code objects than it queued.
#[inline(never)]
pub(crate) fn send_new<C: aya_ebpf::EbpfContext, S: crate::events::Sink>(
    ctx: &C,
    events: &S,
    s: &mut Scratch,
) -> bool {
    if s.py.nnew == 0 {
        return false;
    }
    // Read only where there is a record to send: this runs every walk.
    let born = crate::process::born_seldom();
    for i in 0..PY_NEW {
        if i as u32 >= s.py.nnew {
            break;
        }
        if let Some(q) = s.py_new.get_mut(i) {
            q.born = born;
            copy_names(q, &s.py.proc, &mut s.py_buf);
            crate::events::emit_now(events, ctx, q);
        }
    }
    s.py.nnew as usize > PY_NEW
}

/// `PyWalk::mode` of a walk whose Python part is not set up yet: the
/// program that walks sets it, the first step sets the part up.
pub(crate) const NOT_STARTED: u32 = 2;

/// Sets up the Python part of a walk of process `tgid`, at its first
/// step (in the step, not in the program that walks: there its call
/// would grow a frame that with the step's must stay within 512 bytes on
/// kernels before 6.13): field by field (see `PyWalk`), with the
/// process's interpreter copied in if user space gave it one, and the
/// thread's newest frame; nothing more unless the walk is one that
/// steps through Python's frames (`walked`, a constant). Inlined: a function called from the step would
/// add its own frame to that chain (on 6.1 the walk then did not load).
#[inline(always)]
pub(crate) fn start(s: &mut Scratch, tgid: u32, fsbase_off: u32, walked: bool) {
    // Volatile: plain stores of zeros side by side are merged into a call
    // of `memset` (see `crate::copy_value`).
    // SAFETY: fields of a map value.
    unsafe {
        core::ptr::write_volatile(&mut s.py.frame, 0);
        core::ptr::write_volatile(&mut s.py.on, 0);
        core::ptr::write_volatile(&mut s.py.mode, 0);
        core::ptr::write_volatile(&mut s.py.emitted, 0);
        core::ptr::write_volatile(&mut s.py.nnew, 0);
    }
    // A constant: a walk without Python's part never looks.
    if !walked {
        return;
    }
    let Some(p) = PY_PROCS.get_ptr(tgid) else {
        return;
    };
    // SAFETY: a map value, copied into another (`copy_value`: a plain
    // assignment would call `memmove`).
    unsafe { crate::copy_value(&mut s.py.proc, p) };
    s.py.on = 1;
    s.py.tstate = 0;
    s.py.task_frame = 0;
    s.py.frame = first_frame(s, tgid, fsbase_off);
    if s.py.frame != 0 && s.py.proc.ts_running_task != 0 {
        running_task(s, tgid);
    }
}

/// Whether user space gave process `tgid`'s interpreter to the walk.
#[inline(always)]
pub(crate) fn known(tgid: u32) -> bool {
    PY_PROCS.get_ptr(tgid).is_some()
}

/// Forgets a process's interpreter: it ran a new program or exited.
#[inline(always)]
pub(crate) fn forget(tgid: u32) {
    let _ = PY_PROCS.remove(tgid);
}

//! The per-CPU scratch value a stack is walked in, and the CFI walk's
//! state in it: below both the stack store ([`crate::stacks`], which keeps
//! the map and hands the value to the walk) and the CFI walk (`crate::cfi`,
//! which works in it).

use rtrace_common::stacks::{Frames, Stack};
#[cfg(feature = "cfi")]
use rtrace_common::unwind::Region;

/// Where a stack's hashes start.
pub(crate) const HASH_SEED: u64 = 0xcbf2_9ce4_8422_2325;

/// Adds frame `ip` to hash `h` (FNV-1a over whole frames): the store's
/// hash of what a kernel walk gave, and the CFI walk's as it goes
/// (`Scratch::chunks`).
#[inline(always)]
pub(crate) fn fnv(h: u64, ip: u64) -> u64 {
    (h ^ ip).wrapping_mul(0x0000_0100_0000_01b3)
}

/// Writes one slot of the stack and adds it to its segment's hash, as
/// every frame of the walk is written; `false` if the stack is full.
#[cfg(feature = "cfi")]
#[inline(always)]
pub(crate) fn push(s: &mut Scratch, v: u64) -> bool {
    // Read back, so that each push is bounds-checked apart: the compiler
    // would otherwise check a Python frame's first slot and derive the
    // second's index.
    // SAFETY: a plain read of a field.
    let depth = unsafe { core::ptr::read_volatile(&s.walk.depth) } as usize;
    let Some(slot) = s.frames.ips.get_mut(depth) else {
        return false;
    };
    *slot = v;
    s.walk.depth += 1;
    if let Some(h) = s
        .chunks
        .get_mut(depth / rtrace_common::stacks::SEGMENT_FRAMES)
    {
        *h = fnv(*h, v);
    }
    true
}

/// Writes a runtime's frame, `first` and `second` in two slots, counted
/// as one frame against `--max-stack`; `false` if the stack is full.
#[cfg(feature = "cfi")]
#[inline(always)]
pub(crate) fn push2(s: &mut Scratch, first: u64, second: u64) -> bool {
    if !(push(s, first) && push(s, second)) {
        return false;
    }
    s.walk.pairs += 1;
    true
}

/// The frames a walk has kept so far (a runtime's frame takes two slots
/// and counts once), which `--max-stack` bounds.
#[cfg(feature = "cfi")]
#[inline(always)]
pub(crate) fn kept(st: &State) -> u32 {
    st.depth.saturating_sub(st.pairs)
}

/// One CPU's room for the stack being walked, and the CFI walk's state.
#[repr(C)]
pub struct Scratch {
    /// The frames walked, up to `--max-stack`.
    pub(crate) frames: Frames,
    /// One `STACKS` entry of them, as it is stored.
    pub(crate) entry: Stack,
    #[cfg(feature = "cfi")]
    pub(crate) walk: State,
    /// The registers the walk starts from (ip, sp, bp, bx): a user-mode
    /// sample's, else those the task entered the kernel with
    /// (`cfi::stash_regs`).
    #[cfg(feature = "cfi")]
    pub(crate) regs: [u64; 4],
    /// The top of the user stack, read in one copy (`CHUNK_WORDS`).
    #[cfg(feature = "cfi")]
    pub(crate) chunk: [u64; CHUNK_SLOTS],
    /// Hashes of the frames the CFI walk took, by `SEGMENT_FRAMES`: the
    /// keys of the entries the stack is stored in are made of them, with
    /// no loop over the frames once walked. Apart from `walk`, which is
    /// written whole, as its written zeros are copied.
    #[cfg(feature = "cfi")]
    pub(crate) chunks: [u64; rtrace_common::stacks::MAX_SEGMENTS + 1],
    /// A deep stack being stored, entry by entry.
    #[cfg(feature = "cfi")]
    pub(crate) storing: Storing,
    /// The walk's Python part.
    #[cfg(feature = "cfi")]
    pub(crate) py: PyWalk,
    /// A Python frame or code object being read (`crate::python`).
    #[cfg(feature = "cfi")]
    pub(crate) py_buf: [u64; 16],
    /// Code objects new to this CPU, to tell user space of after the walk
    /// (`PyWalk::nnew` of them). Out of `State`, which each walk writes
    /// whole: through the eBPF stack, where they would not fit beside the
    /// rest on kernels that count the walk's callers' frames too.
    #[cfg(feature = "cfi")]
    pub(crate) py_new: [rtrace_common::python::PyCode; PY_NEW],
    /// The walk's Java part.
    #[cfg(feature = "cfi")]
    pub(crate) jv: JavaWalk,
    /// Java frames new to this CPU, to tell user space of after the walk
    /// (`JavaWalk::nnew` of them).
    #[cfg(feature = "cfi")]
    pub(crate) jv_new: [rtrace_common::java::JavaSeen; rtrace_common::java::JAVA_NEW],
    /// A code blob's head being read (`crate::java`).
    #[cfg(feature = "cfi")]
    pub(crate) jv_buf: [u64; rtrace_common::java::BLOB_BYTES / 8],
    /// The walk's V8 part.
    #[cfg(feature = "cfi")]
    pub(crate) v8: V8Walk,
    /// JavaScript frames new to this CPU, to tell user space of after the
    /// walk (`V8Walk::nnew` of them).
    #[cfg(feature = "cfi")]
    pub(crate) v8_new: [rtrace_common::v8::V8Seen; rtrace_common::v8::V8_NEW],
    /// A frame's slots, then its `SharedFunctionInfo`, being read
    /// (`crate::v8`).
    #[cfg(feature = "cfi")]
    pub(crate) v8_buf: [u64; rtrace_common::v8::SFI_BYTES / 8],
    /// The native frames under the walk's last runtime frame, followed
    /// to be kept for the thread (`cfi::keep_tail`).
    #[cfg(feature = "cfi")]
    pub(crate) tail: TailWalk,
    /// The stack a kept tail read, read again to recall it.
    #[cfg(feature = "cfi")]
    pub(crate) tail_chunk: [u64; TAIL_WORDS],
}

/// The native frames a walk takes under the last Python, Java or
/// JavaScript frame of a stack (the runtime's entry, the thread's start,
/// `main`): the same sample after sample while the thread runs in the
/// runtime, and each a search of its file's CFI. Followed from the first
/// native frame after a runtime's frame, written field by field as
/// [`PyWalk`] is, and kept for the thread if the walk ends in it
/// (`cfi::keep_tail`), to be recalled at the same registers over the same
/// words (`cfi::recall_tail`).
#[cfg(feature = "cfi")]
#[repr(C)]
pub struct TailWalk {
    /// `State::pairs` when it started; [`NO_TAIL`] where none is being
    /// followed (the next native frame after a runtime's starts one).
    pub(crate) pairs: u32,
    /// Set while what it read and did can be recalled: cleared by a
    /// frame the kernel found the mapping of, a frame walked by its frame
    /// pointer, a rule of rbx or of the sampled frame, a word read too
    /// far from its start or past [`TAIL_READS`], and a recall.
    pub(crate) ok: u32,
    /// Set where the walk ended in it at the stack's end (not cut short,
    /// and not at `--max-stack`).
    pub(crate) ended: u32,
    /// `State::depth` when it started: its first slot.
    pub(crate) depth: u32,
    /// Words it read, by index from its stack pointer, in order.
    pub(crate) nreads: u32,
    /// The bytes from its stack pointer to the end of the last word read.
    pub(crate) span: u32,
    /// The words' hash, in order (`cfi::mix`).
    pub(crate) words: u64,
    /// The registers it started from: ip, sp, bp.
    pub(crate) regs: [u64; 3],
    /// The words' indexes.
    pub(crate) reads: [u16; TAIL_READS],
}

/// `TailWalk::pairs` where no tail is being followed.
#[cfg(feature = "cfi")]
pub(crate) const NO_TAIL: u32 = u32::MAX;

/// Stack words a kept tail may have read.
#[cfg(feature = "cfi")]
pub(crate) const TAIL_READS: usize = 48;

/// Words of stack a kept tail's reads may span, from its stack pointer
/// (a power of two).
#[cfg(feature = "cfi")]
pub(crate) const TAIL_WORDS: usize = 512;

/// The V8 part of a walk (`crate::v8`), written field by field as
/// [`PyWalk`] is: what a step needs after a helper call lives here, not
/// in registers, whose spills would grow the step's stack.
#[cfg(feature = "cfi")]
#[repr(C)]
pub struct V8Walk {
    /// The frame's `SharedFunctionInfo` (untagged).
    pub(crate) sfi: u64,
    /// The frame's caller's rbp, saved at its frame pointer.
    pub(crate) caller_bp: u64,
    /// The frame's return address.
    pub(crate) ret: u64,
    /// Set where the process runs a V8 the walk reads (`proc`).
    pub(crate) on: u32,
    /// How many JavaScript frames new to this CPU the walk queued
    /// (`Scratch::v8_new`).
    pub(crate) nnew: u32,
    /// The frame's bytecode offset (`NO_OFFSET` where none).
    pub(crate) offset: u32,
    /// Most frames the walk keeps (`cfi::max_depth`).
    pub(crate) max_depth: u32,
    /// The process's V8, copied from `V8_PROCS`.
    pub(crate) proc: rtrace_common::v8::V8Proc,
}

/// The Java part of a walk (`crate::java`), written field by field as
/// [`PyWalk`] is.
#[cfg(feature = "cfi")]
#[repr(C)]
pub struct JavaWalk {
    /// The blob the frame at hand is in.
    pub(crate) blob: u64,
    /// Set where the process runs a JVM the walk reads (`proc`).
    pub(crate) on: u32,
    /// Set while the frame at hand is the walk's first (the sampled one).
    pub(crate) top: u32,
    /// How many Java frames new to this CPU the walk queued
    /// (`Scratch::jv_new`).
    pub(crate) nnew: u32,
    /// Most frames the walk keeps (`cfi::max_depth`).
    pub(crate) max_depth: u32,
    /// The sampled frame's r13 (an interpreted frame's bytecode
    /// pointer), set by the walk for a Java step of its first frame.
    pub(crate) r13: u64,
    /// The JVM's count of collections (`JavaProc::gc_count`), read at
    /// the walk's first interpreted frame: 0 before, `1 << 32` with the
    /// count in the low half once read, `u64::MAX` where it cannot be.
    pub(crate) epoch: u64,
    /// The process's JVM, copied from `JAVA_PROCS`.
    pub(crate) proc: rtrace_common::java::JavaProc,
}

/// A deep stack being stored by a `bpf_loop` callback, one entry a call
/// (`stacks::store_segment`). In the map value, not on the stack, for the
/// reason [`State`] is: kernels before 6.7 would take its first values
/// for all calls, and drop the links as dead code.
#[cfg(feature = "cfi")]
#[repr(C)]
pub struct Storing {
    /// Its frames.
    pub(crate) len: u64,
    /// Its last entry's index.
    pub(crate) last: u64,
    /// The key of the entry stored last, which the next links to.
    pub(crate) next: u64,
    /// Set when an entry could not be stored.
    pub(crate) failed: u64,
}

/// A walk in progress. It lives in the per-CPU scratch value, not on
/// the stack: kernels before 6.7 verify a `bpf_loop` callback once,
/// with the values the caller's stack held at the call, and hard-wire
/// the branches only later iterations take (a first frame has no
/// caller, an empty region cache never hits). A map value's contents
/// are unknown to the verifier.
#[cfg(feature = "cfi")]
#[repr(C)]
pub struct State {
    pub(crate) ip: u64,
    pub(crate) sp: u64,
    pub(crate) bp: u64,
    /// rbx, followed for ld.so's trampolines (`CFA_RBX`).
    pub(crate) bx: u64,
    /// Slots written.
    pub(crate) depth: u32,
    /// Frames written in two slots (a runtime's: Python's, Java's,
    /// JavaScript's): `depth - pairs` frames are kept, the count
    /// `--max-stack` bounds ([`kept`]).
    pub(crate) pairs: u32,
    /// Set when a frame's code is in no region of the process.
    pub(crate) new_code: u32,
    /// Set once the walk has asked the kernel for a mapping
    /// (`cfi::found_region`): at most once a walk.
    pub(crate) find_tried: u32,
    /// The region the last frame was in: callers are mostly in the
    /// same file, so it is tried before the search.
    pub(crate) last: Region,
    /// The user address `Scratch::chunk` was copied from.
    pub(crate) chunk_base: u64,
    /// How many bytes it holds.
    pub(crate) chunk_len: u64,
    /// The words of the chunk the walk read, by index, in order.
    pub(crate) reads: [u8; MAX_READS],
    /// How many.
    pub(crate) nreads: u32,
    /// The bytes of the chunk up to the last word read.
    pub(crate) span: u32,
    /// Their hash, in order (`cfi::mix`).
    pub(crate) words: u64,
    /// Set when the walk read the stack beyond the chunk, read more than
    /// `MAX_READS` words, or took a frame by its frame pointer: such a
    /// walk is not remembered. [`CUT`] where it ended on a word it could
    /// not read.
    pub(crate) unremembered: u32,
    /// The process's regions' version.
    pub(crate) version: u32,
    /// The registers the walk started from.
    pub(crate) start: [u64; 3],
    /// The mapping the walk found and kept for its process, to be told
    /// to user space (flags 0 where none).
    pub(crate) found: rtrace_common::stacks::Found,
}

/// `State::unremembered` of a walk cut short by a stack word it could
/// not read (never remembered either).
#[cfg(feature = "cfi")]
pub(crate) const CUT: u32 = 2;

/// The Python part of a walk (`crate::python`). Apart from [`State`],
/// which each walk writes whole, through the eBPF stack: these are
/// written field by field, so that they take no room there (the off-CPU
/// program's stack, with its calls', would pass 512 bytes on 6.1).
#[cfg(feature = "cfi")]
#[repr(C)]
pub struct PyWalk {
    /// The thread's next Python frame to write, 0 for none.
    pub(crate) frame: u64,
    /// Set where the process runs an interpreter the walk reads (`proc`).
    pub(crate) on: u32,
    /// Set while an activation of the interpreter's Python frames are
    /// being written in its place.
    pub(crate) mode: u32,
    /// How many the activation had.
    pub(crate) emitted: u32,
    /// How many code objects new to this CPU the walk queued
    /// (`Scratch::py_new`).
    pub(crate) nnew: u32,
    /// Native frames stepped so far: the first is the sampled one.
    pub(crate) native: u32,
    pub(crate) _pad: u32,
    /// The thread's state, where found.
    pub(crate) tstate: u64,
    /// The thread's pointer (`fsbase`), while the state is found.
    pub(crate) fsbase: u64,
    /// The frame of the coroutine the thread's running asyncio task runs
    /// (3.14), 0 for none: the task's frame is written after it.
    pub(crate) task_frame: u64,
    /// The task's frame, two slots (`rtrace_common::python::PY_TASK`).
    pub(crate) task_slots: [u64; 2],
    /// The process's interpreter, copied from `PY_PROCS`.
    pub(crate) proc: rtrace_common::python::PyProc,
}

/// Code objects one walk tells user space of at most.
#[cfg(feature = "cfi")]
pub(crate) const PY_NEW: usize = 4;

/// Stack words a remembered walk may have read: two a frame for 32.
#[cfg(feature = "cfi")]
pub(crate) const MAX_READS: usize = 64;

/// Words of the user stack copied at the start of a walk: one copy costs
/// about what two single reads do, and the frames near the stack pointer,
/// which most walks stay in, then cost none.
/// A power of two.
#[cfg(feature = "cfi")]
pub const CHUNK_WORDS: usize = 256;
/// The room for them, and a word more: a pair's first word is found by
/// an index masked to `CHUNK_WORDS`, which the verifier then bounds.
#[cfg(feature = "cfi")]
pub const CHUNK_SLOTS: usize = CHUNK_WORDS + 1;

/// Where `bytes` of the user stack at `addr` start in the copy of its
/// top (`Scratch::chunk`, `len` bytes from user address `base`), as an
/// index of its words, if the copy holds them all; masked, so that the
/// verifier sees the bound (the range was checked already).
#[cfg(feature = "cfi")]
#[inline(always)]
pub(crate) fn chunk_index(base: u64, len: u64, addr: u64, bytes: u64) -> Option<usize> {
    let off = addr.wrapping_sub(base);
    (off & 7 == 0 && off.saturating_add(bytes) <= len)
        .then_some((off / 8) as usize & (CHUNK_WORDS - 1))
}

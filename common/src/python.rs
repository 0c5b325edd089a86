//! Types of the CPython frame walk, spliced into the CFI walk: what user
//! space tells the kernel of each Python process ([`PyProc`]), how a
//! Python frame is written into a stack ([`PY_FRAME`]), and the record that
//! asks user space to name a code object while it lives ([`PyCode`]).

/// Python processes the kernel walks the frames of.
pub const MAX_PY_PROCS: u32 = 4096;

/// A Python frame takes two slots of a stack: the first is `PY_FRAME`
/// with the code object's address in its low 48 bits, the second the
/// code object's check ([`PyCode::check`]) in its high half and the
/// instruction's offset (in code units, 0 without `--lines`) in its low
/// half. User addresses are below `1 << 47`, so a first slot never reads
/// as native code.
pub const PY_FRAME: u64 = 0x5059_0000_0000_0000;
/// The bits that tell a Python frame's first slot.
pub const PY_FRAME_MASK: u64 = 0xffff_0000_0000_0000;

/// Whether stack slot `ip` starts a Python frame.
pub const fn is_py_frame(ip: u64) -> bool {
    ip & PY_FRAME_MASK == PY_FRAME
}

/// The bits of a Python frame's first slot that hold its code object's
/// address.
pub const PY_ADDR_MASK: u64 = !PY_FRAME_MASK;

/// [`PyProc::chain`]: 3.10: `tstate->frame` is a `PyFrameObject`, one to
/// each `_PyEval_EvalFrameDefault`.
pub const CHAIN_310: u8 = 10;
/// [`PyProc::chain`]: 3.11: `tstate->cframe->current_frame`, a
/// `_PyInterpreterFrame`; an activation's last frame has `is_entry` set.
pub const CHAIN_311: u8 = 11;
/// [`PyProc::chain`]: 3.12: as 3.11, but an activation ends at a shim
/// frame owned by the C stack.
pub const CHAIN_312: u8 = 12;
/// [`PyProc::chain`]: 3.13+: `tstate->current_frame`, activations as 3.12
/// (3.14's `f_executable` is a tagged reference, masked by the walk).
pub const CHAIN_313: u8 = 13;

/// `owner` of a 3.12+ interpreter frame that only marks where C code
/// entered the interpreter (`FRAME_OWNED_BY_CSTACK`).
pub const OWNED_BY_CSTACK: u8 = 3;

/// Bytes of an interpreter frame the walk reads: every field it needs,
/// in each version.
pub const FRAME_BYTES: usize = 104;
/// Bytes of a code object the walk reads, from its start.
pub const CODE_BYTES: usize = 128;

/// What the kernel needs to walk one process's Python frames; user space
/// fills it from the interpreter's version and its own offsets.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct PyProc {
    /// `_PyEval_EvalFrameDefault`'s addresses in the process: a native
    /// frame there is replaced by the Python frames it ran.
    pub eval_start: u64,
    /// See [`PyProc::eval_start`].
    pub eval_end: u64,
    /// A second range of the same function's code where the compiler
    /// split it (GCC's hot and cold partitions: Debian sid's 3.14 keeps
    /// the loop's body apart from the exported entry); empty if none.
    pub eval2_start: u64,
    /// See [`PyProc::eval2_start`].
    pub eval2_end: u64,
    /// The address of `PyCode_Type`: a frame's code object must have it as
    /// its type.
    pub code_type: u64,
    /// The address of the runtime's `Py_tss_t` (`autoTSSkey`), whose key's
    /// value in each thread is that thread's state.
    pub tss_addr: u64,
    /// Where glibc keeps a thread's first pthread keys
    /// (`specific_1stblock`), from the thread pointer: the value of key `k`
    /// is at `+ 16 * k + 8`.
    pub key_block: i64,
    /// `PyThreadState`'s field the chain starts at: `frame` (3.10),
    /// `cframe` (3.11, 3.12) or `current_frame` (3.13+).
    pub ts_frame: u16,
    /// `_PyCFrame.current_frame` (3.11, 3.12).
    pub cframe_current: u16,
    /// A frame's code object (`f_code`, `f_executable`).
    pub frame_code: u16,
    /// A frame's caller (`f_back`, `previous`).
    pub frame_back: u16,
    /// A frame's last instruction: `f_lasti` (an `int`, 3.10),
    /// `prev_instr` (3.11, 3.12) or `instr_ptr` (3.13+).
    pub frame_instr: u16,
    /// 3.11's `is_entry`, 3.12's `owner` (a byte).
    pub frame_entry: u16,
    /// `co_firstlineno` (an `int`).
    pub code_firstlineno: u16,
    /// `co_name`.
    pub code_name: u16,
    /// `co_filename`.
    pub code_filename: u16,
    /// Where the bytecode starts in a code object (`co_code_adaptive`,
    /// 3.11+).
    pub code_adaptive: u16,
    /// How frames chain (`CHAIN_*`).
    pub chain: u8,
    /// Whether frames carry their instruction's offset (`--lines`).
    pub lines: u8,
    /// Keeps `salt` aligned.
    pub _pad: [u8; 2],
    /// Differs between processes that had one pid (user space derives it
    /// from the process's start): the walk mixes it into what it
    /// remembers of the code objects it told of, so that a later
    /// process's code at the same addresses, with the same check (one
    /// program's twin, address randomization off), is told again.
    pub salt: u32,
}

/// Sent the first time a CPU's walk meets a code object of a process
/// (by address and check), so that user space reads its name while the
/// process lives. Laid out as `Seen` begins, with
/// [`SEEN_PY_CODE`](crate::stacks::SEEN_PY_CODE) in its flags.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PyCode {
    /// The process.
    pub tgid: u32,
    /// Always `SEEN_PY_CODE`.
    pub flags: u32,
    /// The code object's address.
    pub addr: u64,
    /// A check that changes when the address is reused by another code
    /// object: of its first line and the addresses of its name and file.
    pub check: u32,
    /// Keeps the size a multiple of 8.
    pub _pad: u32,
    /// When the process started ([`crate::stacks::Key::born`]).
    pub born: u64,
}

/// The check of a code object whose first line, name and file are
/// `firstlineno`, `name` and `file` (their addresses): both sides
/// compute it, the kernel as it walks, user space when it reads the code
/// object, to know it read the one the walk saw.
pub const fn code_check(firstlineno: u32, name: u64, file: u64) -> u32 {
    let h = (name ^ file.rotate_left(29) ^ (firstlineno as u64).wrapping_mul(0x9e37_79b9))
        .wrapping_mul(0xff51_afd7_ed55_8ccd);
    (h >> 32) as u32 | 1
}

crate::pod!(PyProc, PyCode);

/// The Python processes ([`PyProc`]), by process id; user space sizes and
/// fills it.
pub const PY_PROCS: &str = "PY_PROCS";

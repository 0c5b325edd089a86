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

/// An asyncio task's frame (3.14), written above the coroutine it runs
/// (after it, leaf first), takes two slots as a Python frame does: the
/// first is `PY_TASK` with the address of the task's name (a `str`) in its
/// low 48 bits, or with [`PY_TASK_NUMBER`] and the number of an unnamed
/// task (`Task-N`, which CPython keeps as the number until asked); the
/// second holds the name's check ([`str_check`]) in its high half.
pub const PY_TASK: u64 = 0x5054_0000_0000_0000;
/// In a task frame's first slot: the low bits are the number `N` of a
/// task named `Task-N`. User addresses are below `1 << 47`.
pub const PY_TASK_NUMBER: u64 = 1 << 47;

/// Whether stack slot `ip` starts an asyncio task's frame.
pub const fn is_py_task(ip: u64) -> bool {
    ip & PY_FRAME_MASK == PY_TASK
}

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

/// Bytes of a thread state the walk reads at most to check the state it
/// kept for the thread and find its newest frame in one read: from the
/// frame's field to `thread_id`.
pub const TSTATE_BYTES: usize = 128;

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
    /// The address of `PyUnicode_Type`: a string the kernel copies must
    /// have it as its type.
    pub unicode_type: u64,
    /// The address of `PyLong_Type`: an asyncio task's name that is a
    /// number (`Task-N`).
    pub long_type: u64,
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
    /// `co_qualname` (3.11+; `co_name` before): the name the kernel
    /// copies for user space ([`PyCode::name`]).
    pub code_qualname: u16,
    /// `co_linetable`, copied under `--lines` ([`PyCode::lines`]).
    pub code_linetable: u16,
    /// Where a compact ASCII string's characters are (`PyASCIIObject`'s
    /// size).
    pub str_ascii: u16,
    /// Where another compact string's are (`PyCompactUnicodeObject`'s
    /// size).
    pub str_compact: u16,
    /// How frames chain (`CHAIN_*`).
    pub chain: u8,
    /// Whether frames carry their instruction's offset (`--lines`).
    pub lines: u8,
    /// `PyThreadState.thread_id` (the thread's `pthread_self()`, which is
    /// its thread pointer under glibc): the walk keeps each thread's state
    /// and checks it is still the thread's by this field, read with the
    /// first frame's; 0 where it is not known (each sample then finds the
    /// state through the runtime's key).
    pub ts_thread_id: u16,
    /// Differs between processes that had one pid (user space derives it
    /// from the process's start): the walk mixes it into what it
    /// remembers of the code objects it told of, so that a later
    /// process's code at the same addresses, with the same check (one
    /// program's twin, address randomization off), is told again.
    pub salt: u32,
    /// `_PyThreadStateImpl.asyncio_running_task` (3.14, from `_asyncio`'s
    /// `.AsyncioDebug` section once the process loaded it): where a
    /// thread keeps the asyncio task it is running; 0: no task frames.
    pub ts_running_task: u16,
    /// The task object's coroutine (`task_coro`).
    pub task_coro: u16,
    /// The task object's name (`task_name`).
    pub task_name: u16,
    /// A coroutine object's own interpreter frame (`gi_iframe`): the
    /// running task's frame is written above it.
    pub gen_iframe: u16,
    /// Keeps the size a multiple of 8.
    pub _pad2: u32,
}

/// Bytes of a code object's qualified name the kernel copies (its head).
pub const NAME_BYTES: usize = 96;
/// Bytes of its file's path the kernel copies (its tail: the file's own
/// name and the directories nearest it, which name the module).
pub const FILE_BYTES: usize = 160;
/// Bytes of its line table the kernel copies under `--lines` (its head:
/// the table is read from the start, so lines past it are unknown).
pub const LINES_BYTES: usize = 256;

/// Sent the first time a CPU's walk meets a code object of a process
/// (by address and check), with its name, file and first line as the
/// kernel copied them from the process (and its line table under
/// `--lines`): names that need no right to read the process's memory,
/// which `/proc/PID/mem` would ask of user space (ptrace rights over it).
/// User space reads the whole object instead where what was copied was
/// cut short and it may. Laid out as `Seen` begins, with
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
    /// `co_firstlineno`, where the strings were copied.
    pub firstlineno: u32,
    /// When the process started ([`crate::stacks::Key::born`]).
    pub born: u64,
    /// The qualified name's whole length in bytes (of which the kernel
    /// copied at most [`NAME_BYTES`]).
    pub name_len: u32,
    /// The file's length in bytes.
    pub file_len: u32,
    /// The line table's length in bytes; `u32::MAX` where not copied.
    pub lines_len: u32,
    /// How the strings were copied: [`PyCode::name`]'s kind in the low
    /// byte and [`PyCode::file`]'s in the next (1: Latin-1, ASCII
    /// included; 2: UCS-2; 4: UCS-4; 0: not copied).
    pub kinds: u32,
    /// The head of the qualified name, as CPython stores its characters.
    pub name: [u8; NAME_BYTES],
    /// The tail of the file's path.
    pub file: [u8; FILE_BYTES],
    /// The head of the line table (`co_linetable`, `co_lnotab`'s
    /// successor).
    pub lines: [u8; LINES_BYTES],
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

/// The check of a compact `str` whose first 128 bytes are `w` (its
/// characters from byte `data`, a multiple of 8, `bytes` of them): of its
/// length, its first 24 bytes and the word its end is in, so that another
/// string at its address (a task renamed, its name freed and another
/// allocated there) is told apart unless it has the same length, head and
/// tail. Words past the end are left out, but for the last one's bytes
/// after the terminating zero, which are the object's own allocation and
/// do not change while it lives. The kernel computes it, as it walks and
/// again as it copies the string; without a comparison, which eBPF turns
/// into a branch (the verifiers before 6.13 followed each apart).
pub fn str_check(w: &[u64; 16], data: u64, bytes: u64) -> u32 {
    let base = (data / 8) as usize;
    // 1 where the characters reach past the first 8 or 16 bytes: a
    // product, not a mask, which newer verifiers split in two
    // ([`crate::sign_bit`]).
    let past8 = crate::sign_bit(8u64.wrapping_sub(bytes));
    let past16 = crate::sign_bit(16u64.wrapping_sub(bytes));
    let last = w[(data.wrapping_add(bytes) / 8) as usize & 15];
    let h = bytes
        ^ w[base & 15].rotate_left(7)
        ^ w[(base + 1) & 15].wrapping_mul(past8).rotate_left(23)
        ^ w[(base + 2) & 15].wrapping_mul(past16).rotate_left(41)
        ^ last.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (h.wrapping_mul(0xff51_afd7_ed55_8ccd) >> 32) as u32 | 1
}

crate::pod!(PyProc, PyCode);

/// The Python processes ([`PyProc`]), by process id; user space sizes and
/// fills it.
pub const PY_PROCS: &str = "PY_PROCS";

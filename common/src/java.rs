//! Types of the HotSpot (JVM) frame walk, spliced into the CFI walk:
//! what user space tells the kernel of each JVM process ([`JavaProc`],
//! read from the JVM's own `gHotSpotVMStructs` tables) and how a Java
//! frame is written into a stack (two slots, tagged by kind).

/// JVM processes the kernel walks the frames of.
pub const MAX_JAVA_PROCS: u32 = 1024;

/// The map of [`JavaProc`]s, by process id.
pub const JAVA_PROCS: &str = "JAVA_PROCS";

/// Code heaps a JVM has at most: a segmented code cache has three
/// (non-nmethods, profiled, non-profiled), an unsegmented one one.
pub const MAX_HEAPS: usize = 3;

/// Bytes of a `CodeBlob` (from its start) the walk reads in one copy at
/// most: every field it needs lies within (user space checks, and does
/// not walk a JVM whose fields lie further). JDK 17's nmethod fields end
/// 312 bytes in; a power of two, so that the verifier bounds an index
/// into the copy by a mask.
pub const BLOB_BYTES: usize = 512;

/// Slots of [`JavaProc::names`].
pub const LEARNED_NAMES: usize = 4;
/// [`JavaProc::names`]' slot for a compiled method's name (`nmethod`).
pub const LEARNED_NMETHOD: usize = 0;
/// The slot for a native method wrapper's (`native nmethod`).
pub const LEARNED_NATIVE: usize = 1;
/// The slot for vtable and itable stubs' (`vtable chunks`).
pub const LEARNED_VTABLE: usize = 2;
/// The slot for the last other stub's (the call stub's, most often).
pub const LEARNED_STUB: usize = 3;

/// Bytes below an interpreted frame's frame pointer that the walk reads
/// in one, with the saved rbp and return address above it: every slot
/// it reads (`JavaProc::interp_method`, `interp_bcp`, `interp_sender_sp`)
/// lies within them. The frame's lowest fixed slot (its initial sp,
/// -72 on x86-64) is below them, so the read stays within the frame.
pub const INTERP_WINDOW: usize = 64;

/// The bits that tell a Java frame's first slot; user addresses are
/// below `1 << 47`, so a first slot never reads as native code.
pub const JAVA_MASK: u64 = 0xffff_0000_0000_0000;
/// The bits of a Java frame's first slot that hold its address.
pub const JAVA_ADDR_MASK: u64 = !JAVA_MASK;
/// A compiled frame (an nmethod, C1 or C2): its `nmethod*`; the second
/// slot is its `_compile_id` in its high half (the name is checked
/// against it, so a freed and reused nmethod is never named as another)
/// and the pc's offset from the code's start in its low half (its
/// `PcDesc`: the methods inlined at that pc, and their lines).
pub const JAVA_COMPILED: u64 = 0x4a43_0000_0000_0000;
/// An interpreted frame: its `Method*`; the second slot is its
/// [`method_check`] in its high half and the bytecode index in its low
/// half (`u32::MAX` where unknown).
pub const JAVA_INTERPRETED: u64 = 0x4a49_0000_0000_0000;

/// The check a `Method*` is named by: its `ConstMethod*` (which a
/// redefinition replaces), and its class's name, as the `Symbol*` and
/// that symbol's hash (`Symbol::_hash_and_refcount`'s high half, drawn at
/// random when the symbol is made). A class unloaded and another of the
/// same shape loaded after it get the same `Method*` and `ConstMethod*`
/// (HotSpot hands the freed metaspace to the next class loader, and lays
/// the class out again in the same order), but not its name; a name
/// freed and another made in its place gets another hash.
pub const fn method_check(const_method: u64, class_name: u64, name_hash: u16) -> u32 {
    let x = (const_method >> 3) ^ (class_name << 21) ^ ((name_hash as u64) << 47);
    (x.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as u32
}
/// A native method's wrapper (`native nmethod`): its `nmethod*`; the
/// second slot as [`JAVA_COMPILED`]'s.
pub const JAVA_NATIVE: u64 = 0x4a4e_0000_0000_0000;
/// Any other code blob (the call stub, adapters, runtime stubs, vtable
/// chunks): its `CodeBlob*`, named by the blob's own name; the second
/// slot is the pc's offset from the blob.
pub const JAVA_STUB: u64 = 0x4a53_0000_0000_0000;

/// Whether stack slot `ip` starts a Java frame (of any kind).
pub const fn is_java_frame(ip: u64) -> bool {
    let t = ip & JAVA_MASK;
    t == JAVA_COMPILED || t == JAVA_INTERPRETED || t == JAVA_NATIVE || t == JAVA_STUB
}

/// One code heap of a JVM's code cache.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JavaHeap {
    /// Its code's range (`CodeHeap::_memory`'s reserved bounds).
    pub low: u64,
    /// See [`JavaHeap::low`].
    pub high: u64,
    /// Its segment map (`CodeHeap::_segmap`'s low bound): a byte a
    /// segment, 0 where a block starts, 0xff where free, else how many
    /// segments back to go.
    pub segmap: u64,
    /// log2 of its segment's size.
    pub log2_segment: u32,
    /// Keeps the size a multiple of 8.
    pub _pad: u32,
}

/// What the kernel needs to walk one process's Java frames; user space
/// fills it from the JVM's `gHotSpotVMStructs` tables.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JavaProc {
    /// The code heaps, `nheaps` of them.
    pub heaps: [JavaHeap; MAX_HEAPS],
    /// The whole code cache's bounds (`CodeCache::_low_bound`,
    /// `_high_bound`): a pc in neither is native code.
    pub low_bound: u64,
    /// See [`JavaProc::low_bound`].
    pub high_bound: u64,
    /// The template interpreter's code (`AbstractInterpreter::_code`'s
    /// buffer), 0 and 0 where unknown: a pc in it is an interpreted
    /// frame, with no lookup of its blob.
    pub interp_low: u64,
    /// See [`JavaProc::interp_low`].
    pub interp_high: u64,
    /// Where the JVM counts its collections (`Universe::_collectedHeap`'s
    /// `CollectedHeap::_total_collections`, an `unsigned int`), 0 where
    /// unknown. No class is unloaded, and so no `Method*` freed, in a
    /// collection that did not count itself first, so an interpreted
    /// frame's check the kernel worked out stands while the count does
    /// (the kernel keeps such checks per CPU).
    pub gc_count: u64,
    /// Where the call stub's call into Java returns
    /// (`StubRoutines::_call_stub_return_address`), and the stub's blob
    /// (`StubRoutines (1)`, made at the JVM's start and never freed); 0
    /// and 0 where unknown. Every Java stack's outermost Java frame
    /// returns there, so the kernel steps the stub's frame, by its frame
    /// pointer, with no lookup of its blob nor read of it.
    pub call_stub_ret: u64,
    /// See [`JavaProc::call_stub_ret`].
    pub call_stub_blob: u64,
    /// Blob names the kernel learned, by the kind of blob they name (see
    /// [`LEARNED_NMETHOD`] and the others): each a `CodeBlob::_name`
    /// (a `const char*` to a literal in libjvm) that it read once, so
    /// that a blob whose name is one of them needs no read of it. 0 until
    /// met; user space writes zeros.
    pub names: [u64; LEARNED_NAMES],
    /// How many of `heaps` there are.
    pub nheaps: u32,
    /// Differs between processes that had one pid (from the process's
    /// start), as `PyProc::salt`.
    pub salt: u32,
    /// `sizeof(HeapBlock)`: a blob starts this far into its block.
    pub heap_block: u16,
    /// Bytes of a blob read, from its start (at most [`BLOB_BYTES`]):
    /// every offset below lies within them.
    pub blob_read: u16,
    /// `CodeBlob::_name` (a `const char*`).
    pub blob_name: u16,
    /// `CodeBlob::_frame_size` (an `int`, in words).
    pub blob_frame_size: u16,
    /// `CodeBlob::_frame_complete_offset` (an `int`).
    pub blob_frame_complete: u16,
    /// `CodeBlob::_code_begin` (a pointer), or `_code_offset` (an `int`
    /// from the blob) where [`JavaProc::code_is_offset`].
    pub blob_code: u16,
    /// `nmethod::_compile_id` (an `int`).
    pub nm_compile_id: u16,
    /// `nmethod::_orig_pc_offset` (an `int`): where a deoptimized frame
    /// keeps its real pc, from its sp.
    pub nm_orig_pc: u16,
    /// The deoptimization handler: `_deopt_handler_begin` (a pointer), or
    /// an `int` offset from the code's start where
    /// [`JavaProc::deopt_is_offset`]; 0 where unknown.
    pub nm_deopt: u16,
    /// `Method::_constMethod`.
    pub method_const: u16,
    /// `sizeof(ConstMethod)`: the bytecodes follow it.
    pub const_method_size: u16,
    /// `ConstMethod::_constants` (the `ConstantPool*`).
    pub cm_constants: u16,
    /// `ConstantPool::_pool_holder` (the class, an `InstanceKlass*`).
    pub cp_holder: u16,
    /// `Klass::_name` (a `Symbol*`).
    pub klass_name: u16,
    /// The symbol's 16-bit hash ([`method_check`]): the high half of
    /// `Symbol::_hash_and_refcount`.
    pub sym_hash: u16,
    /// An interpreted frame's `Method*`, in bytes from its frame pointer
    /// (−24).
    pub interp_method: i16,
    /// An interpreted frame's bytecode pointer, in bytes from its frame
    /// pointer (−64 on JDK 9+).
    pub interp_bcp: i16,
    /// An interpreted frame's sender sp, in bytes from its frame pointer
    /// (`frame::interpreter_frame_sender_sp_offset`, −8).
    pub interp_sender_sp: i16,
    /// Set where `blob_code` is an offset, not a pointer (JDK 23+).
    pub code_is_offset: u8,
    /// Set where `nm_deopt` is an offset from the code, not a pointer
    /// (JDK 23+).
    pub deopt_is_offset: u8,
    /// Set where `blob_frame_complete` is an `int16_t` (JDK 25), not an
    /// `int`.
    pub frame_complete_short: u8,
    /// Keeps the size a multiple of 8.
    pub _pad: [u8; 1],
}

/// A Java frame the walk wrote, told to user space the first time a CPU
/// meets it, so that it is named while its process lives (a command's
/// JVM is gone by the time its stacks are symbolized).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct JavaSeen {
    /// The process.
    pub tgid: u32,
    /// Always `SEEN_JAVA`.
    pub flags: u32,
    /// When the process started ([`crate::stacks::Key::born`]).
    pub born: u64,
    /// The frame's first slot.
    pub first: u64,
    /// Its second slot.
    pub second: u64,
}

/// Java frames one walk tells user space of at most; the rest are told
/// by a later walk.
pub const JAVA_NEW: usize = 4;

crate::pod!(JavaProc, JavaSeen);

const _: () = assert!(core::mem::size_of::<JavaProc>().is_multiple_of(8));
const _: () = assert!(core::mem::size_of::<JavaHeap>() == 32);

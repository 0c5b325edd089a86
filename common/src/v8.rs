//! Types of the V8 (Node.js) frame walk, spliced into the CFI walk:
//! what user space tells the kernel of each process that runs V8
//! ([`V8Proc`], read from the `v8dbg_*` postmortem metadata that V8
//! builds export for debuggers) and how a JavaScript frame is written
//! into a stack (two slots, tagged).
//!
//! Every frame V8 lays out keeps an rbp chain; a JavaScript frame holds
//! its context at `fp - 8` and its `JSFunction` at `fp - 16`, where a
//! frame of V8's own (an entry, exit or stub frame) holds a type marker
//! instead (`v8.md` §2). Where the walk's pc is in V8's code (its
//! embedded builtins or its JIT code), the walk reads those slots: a
//! `JSFunction` whose `SharedFunctionInfo` checks out is a JavaScript
//! frame, written as [`V8_JS`] and stepped by its frame pointer; anything
//! else is left to the native walk.

/// Processes the kernel walks V8's frames in.
pub const MAX_V8_PROCS: u32 = 1024;

/// The map of [`V8Proc`]s, by process id.
pub const V8_PROCS: &str = "V8_PROCS";

/// Address ranges of V8's code a process has at most: the embedded
/// builtins in its file, and for each isolate (the main thread's and
/// each worker thread's) its JIT code range and the copy of the builtins
/// V8 maps right after it (`v8.md` §2, "blob remap"): the main isolate
/// and 30 workers'. The walk finds a pc's range by a binary search
/// ([`V8_RANGE_STEPS`]) and copies in only the ranges a process has, so
/// more room costs a sample nothing.
pub const MAX_V8_RANGES: usize = 64;

/// Steps of [`range_index`]'s binary search: enough to narrow
/// [`MAX_V8_RANGES`] down to one.
pub const V8_RANGE_STEPS: usize = MAX_V8_RANGES.ilog2() as usize;

/// Bytes of a `SharedFunctionInfo` (from its start) the walk reads at
/// most: every field of [`V8Proc`]'s `sfi_*` lies within.
pub const SFI_BYTES: usize = 64;

/// The bits that tell a JavaScript frame's first slot; user addresses
/// are below `1 << 47`, so a first slot never reads as native code.
pub const V8_MASK: u64 = 0xffff_0000_0000_0000;
/// The bits of a JavaScript frame's first slot that hold its address.
pub const V8_ADDR_MASK: u64 = !V8_MASK;
/// A JavaScript frame: the address of its function's
/// `SharedFunctionInfo` (untagged); the second slot holds the SFI's
/// [`sfi_check`] in its high half and, for an interpreted frame, its
/// bytecode offset in its low half (`u32::MAX` where none).
pub const V8_JS: u64 = 0x5638_0000_0000_0000;

/// A JavaScript frame that ran in JIT code (Sparkplug's, Maglev's or
/// TurboFan's): as [`V8_JS`], but the second slot's low half holds the
/// low 32 bits of the frame's pc (the sampled pc, or the return address
/// into it), by which user space finds the code, and in it the functions
/// inlined there (`v8.md` §3).
pub const V8_JS_PC: u64 = 0x5639_0000_0000_0000;

/// Whether stack slot `ip` starts a JavaScript frame.
pub const fn is_v8_frame(ip: u64) -> bool {
    ip & V8_MASK == V8_JS || ip & V8_MASK == V8_JS_PC
}

/// The check a `SharedFunctionInfo` is named by, from what a move by the
/// garbage collector keeps and another function at its address would
/// not share: its name (or scope info) and its script, as tagged
/// pointers, and the bits of its integer fields that the parse fixed
/// (`ints`, already masked: its length, parameter count and the offset
/// of its `function` token). A name or script that moves changes the
/// check, so the frame is told again and named again: never named as
/// another function.
pub const fn sfi_check(name: u64, script: u64, ints: u64) -> u32 {
    let x = (name >> 3) ^ (script << 19) ^ ints.rotate_left(37);
    (x.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as u32
}

/// No bytecode offset: the frame is not interpreted, or its offset slot
/// held no small integer.
pub const NO_OFFSET: u32 = u32::MAX;

/// An address range of V8 code.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct V8Range {
    /// Its first address.
    pub low: u64,
    /// One past its last.
    pub high: u64,
}

/// What the kernel needs to walk one process's JavaScript frames; user
/// space fills it from V8's `v8dbg_*` metadata and the process's maps.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct V8Proc {
    /// The ranges of `ranges` that hold the embedded builtins an
    /// interpreted frame runs in (the interpreter's trampoline and its
    /// bytecode handlers), a bit each (bit `i` for `ranges[i]`): those
    /// frames' bytecode offsets are read. The others are JIT code.
    pub builtins: u64,
    /// How many of `ranges` there are.
    pub nranges: u32,
    /// Differs between processes that had one pid (from the process's
    /// start), as `JavaProc::salt`.
    pub salt: u32,
    /// The frame's context, in bytes from its frame pointer
    /// (`v8dbg_off_fp_context`, −8): a tagged pointer in a JavaScript
    /// frame, a type marker (low bit clear) in V8's own.
    pub fp_context: i16,
    /// The frame's `JSFunction`, from its frame pointer
    /// (`v8dbg_off_fp_function`, −16).
    pub fp_function: i16,
    /// An interpreted frame's `BytecodeArray`, from its frame pointer
    /// (`v8dbg_off_fp_bytecode_array`, −32).
    pub fp_bytecode_array: i16,
    /// An interpreted frame's bytecode offset (a small integer), from
    /// its frame pointer (`v8dbg_off_fp_bytecode_offset`, −40).
    pub fp_bytecode_offset: i16,
    /// `HeapObject::map`'s offset (0).
    pub heap_object_map: u16,
    /// `Map::instance_type`'s offset (a `uint16_t`).
    pub map_instance_type: u16,
    /// `JSFunction::shared`'s offset.
    pub function_shared: u16,
    /// The lowest instance type of a `JSFunction` (of any kind).
    pub first_function_type: u16,
    /// The highest, inclusive.
    pub last_function_type: u16,
    /// `SHARED_FUNCTION_INFO_TYPE`.
    pub sfi_type: u16,
    /// `SharedFunctionInfo::name_or_scope_info`'s offset.
    pub sfi_name: u16,
    /// `SharedFunctionInfo::script` (`script_or_debug_info`)'s offset.
    pub sfi_script: u16,
    /// The offset of the word whose bits [`V8Proc::sfi_ints_mask`] keeps
    /// for [`sfi_check`] (that of `SharedFunctionInfo::length`).
    pub sfi_ints: u16,
    /// Bytes of the `SharedFunctionInfo` read (at most [`SFI_BYTES`]).
    pub sfi_read: u16,
    /// Unused: the padding before the next field made explicit, so that
    /// every byte the kernel is given is set.
    pub _pad_sfi: u32,
    /// The bits of the word at `sfi_ints` that the check keeps.
    pub sfi_ints_mask: u64,
    /// Bits a tagged heap object's pointer has set in its low bits
    /// (`v8dbg_HeapObjectTag`, 1) under `v8dbg_HeapObjectTagMask` (3).
    pub heap_object_tag: u8,
    /// See [`V8Proc::heap_object_tag`].
    pub heap_object_tag_mask: u8,
    /// `v8dbg_SmiShiftSize` + 1: a small integer's value is its word
    /// shifted right this far (32 without pointer compression).
    pub smi_shift: u8,
    /// Keeps the size a multiple of 8.
    pub _pad: [u8; 5],
    /// V8's code, sorted by address (they do not overlap): a pc in none
    /// of them is no JavaScript frame's. Last, so that the walk copies
    /// the fields above whole and only the first `nranges` of these.
    pub ranges: [V8Range; MAX_V8_RANGES],
}

/// The index of the range of the first `n` of `ranges` (sorted by
/// address, apart) that holds `pc`, or [`MAX_V8_RANGES`] where none does:
/// what the walk asks of every frame of a process that runs V8.
///
/// The search counts the ranges that end at or below the pc, halving
/// without a branch: each step's outcome is arithmetic (a sign bit,
/// [`crate::sign_bit`]), so
/// the verifier follows one path, where a search that branched would be
/// followed down each of its 2^steps paths with all the walk after it.
/// The ranges past `n` (stale in the walk's scratch value) count as above
/// the pc. Every address of a range is a user one, below `1 << 63`; a pc
/// at or above it is in none.
#[inline(always)]
pub fn range_index(ranges: &[V8Range; MAX_V8_RANGES], n: u32, pc: u64) -> u32 {
    let n = u64::from(n);
    let mut below = 0u64;
    let mut step = MAX_V8_RANGES as u64 / 2;
    for _ in 0..V8_RANGE_STEPS {
        let i = below + step - 1;
        let high = ranges[(i % MAX_V8_RANGES as u64) as usize].high;
        let at_or_past = 1 - crate::sign_bit(pc.wrapping_sub(high));
        let counted = crate::sign_bit(i.wrapping_sub(n));
        below += at_or_past * counted * step;
        step /= 2;
    }
    let r = &ranges[(below % MAX_V8_RANGES as u64) as usize];
    if below < n && r.low <= pc && pc < r.high {
        below as u32
    } else {
        MAX_V8_RANGES as u32
    }
}

/// The bytes of a [`V8Proc`] before its ranges.
pub const V8_PROC_HEAD: usize = core::mem::offset_of!(V8Proc, ranges);

impl Default for V8Proc {
    fn default() -> Self {
        // SAFETY: integers only, for which all zeroes is a value (the
        // standard library derives `Default` for arrays of at most 32).
        unsafe { core::mem::zeroed() }
    }
}

/// A JavaScript frame the walk wrote, told to user space the first time a
/// CPU meets it, so that it is named while its process lives and before
/// the collector moves it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct V8Seen {
    /// The process.
    pub tgid: u32,
    /// Always `SEEN_V8`.
    pub flags: u32,
    /// When the process started ([`crate::stacks::Key::born`]).
    pub born: u64,
    /// The frame's first slot.
    pub first: u64,
    /// Its second slot.
    pub second: u64,
}

/// JavaScript frames one walk tells user space of at most; the rest are
/// told by a later walk.
pub const V8_NEW: usize = 4;

crate::pod!(V8Proc, V8Seen);

const _: () = assert!(core::mem::size_of::<V8Proc>().is_multiple_of(8));
const _: () = assert!(V8_PROC_HEAD.is_multiple_of(8));
const _: () = assert!(1 << V8_RANGE_STEPS == MAX_V8_RANGES);

#[cfg(test)]
mod tests {
    use super::*;

    /// The branchless search finds what a scan of the first `n` ranges
    /// finds, for every count of ranges, with stale ranges past `n`, and
    /// for pcs at each edge, between the ranges, below and above them all,
    /// and past `1 << 63`.
    #[test]
    fn range_index_finds_what_a_scan_finds() {
        let mut ranges = [V8Range::default(); MAX_V8_RANGES];
        for n in 0..=MAX_V8_RANGES {
            for (i, r) in ranges.iter_mut().enumerate() {
                let low = 0x7f00_0000_0000 + i as u64 * 0x10_0000;
                // Past `n`: what another process left, overlapping.
                *r = if i < n {
                    V8Range {
                        low,
                        high: low + 0x8000,
                    }
                } else {
                    V8Range {
                        low: 0x1000,
                        high: u64::MAX >> 1,
                    }
                };
            }
            let edges = |r: &V8Range| {
                [
                    r.low - 1,
                    r.low,
                    r.low + 1,
                    r.high - 1,
                    r.high,
                    r.high + 0x1000,
                ]
            };
            let fixed = [0, 0x1000, 0x7eff_ffff_ffff, u64::MAX, 1 << 63];
            let pcs = ranges[..n].iter().flat_map(edges).chain(fixed);
            for pc in pcs {
                let scan = ranges[..n]
                    .iter()
                    .position(|r| r.low <= pc && pc < r.high)
                    .map_or(MAX_V8_RANGES as u32, |i| i as u32);
                assert_eq!(
                    range_index(&ranges, n as u32, pc),
                    scan,
                    "n {n}, pc {pc:#x}"
                );
            }
        }
    }
}

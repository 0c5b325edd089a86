//! Types of the in-kernel CFI unwinder (profile's `cfi` object): compiled
//! call frame information rows, one per element of an array that user
//! space writes through a shared mapping, and each process's
//! executable regions pointing into them. User space compiles
//! them (`userspace/src/stacks/cfi.rs`) and loads them
//! (`userspace/src/stacks/unwind.rs`); the BPF program searches them.

/// Executable regions kept per process; a process with more has the rest
/// walked by frame pointer.
pub const MAX_REGIONS: usize = 48;
/// How often the walk may tell user space that a process ran code in no
/// known region.
pub const NEW_CODE_EVERY_NS: u64 = 100_000_000;
/// Steps of one binary search: enough for a bucket's rows, which hold at
/// most `1 << MAX_INDEX_SHIFT` bytes of code, each row at least a byte.
pub const SEARCH_STEPS: usize = MAX_INDEX_SHIFT as usize + 1;
/// How many of a bucket's rows after its first lie at or before `want`
/// bytes past the bucket's `start`: the walk's search for the row whose
/// rules hold at a pc. The rows are sorted; `pc_at(k)` gives the 16 low
/// bits of the address of the bucket's row `k` (0 its first, `1..=n` the
/// rows searched), and the answer's row is `first + count`.
///
/// It counts by halves without a branch, as [`crate::v8::range_index`]
/// does: each step's outcome is arithmetic (a sign bit), and a step past
/// the `n` rows reads the first row again and counts nothing, so the
/// verifier follows one path through the search. A search that branched
/// on each comparison was followed down each of its paths with all the
/// walk after it: on a kernel whose verifier prunes less (Linux 6.18 as
/// built for this project's hosts in December 2026), every program with
/// the CFI walk went over the million instructions, this search and the
/// step's byte-wise copies (`rtrace_ebpf::copy_value`) the most of it.
/// `None` where `pc_at` is.
#[inline(always)]
pub fn rows_at_or_before(
    n: u64,
    start: u16,
    want: u16,
    mut pc_at: impl FnMut(u64) -> Option<u16>,
) -> Option<u64> {
    // What each step needs after its row's lookup, packed, so that with
    // `below`, `step` and `pc_at`'s own value it fits the four registers
    // a call keeps: a spill would grow the walk's stack, which has 512
    // bytes for all its calls (6.1 refused `profile --off-cpu` at 8 more).
    let bounds = (u64::from(start) << 16 | u64::from(want)) << 32 | (n & 0xffff_ffff);
    let mut below = 0u64;
    let mut step = 1u64 << (SEARCH_STEPS - 1);
    for _ in 0..SEARCH_STEPS {
        let i = below + step - 1;
        // 1 while row `i + 1` is one of the `n`.
        let counted = crate::sign_bit(i.wrapping_sub(bounds & 0xffff_ffff));
        let pc = pc_at(counted * (i + 1))?;
        let (start, want) = ((bounds >> 48) as u16, (bounds >> 32) as u16);
        let after =
            crate::sign_bit(u64::from(want).wrapping_sub(u64::from(pc.wrapping_sub(start))));
        below += (1 - after) * counted * step;
        step >>= 1;
    }
    Some(below)
}

/// A file's index has at most one bucket for this many rows, so that it
/// takes at most an eighth of the rows' memory.
pub const ROWS_PER_BUCKET: u32 = 4;

/// [`CfiRule::cfa`]: no CFI covers these addresses: walk by frame pointer.
pub const CFA_NONE: u8 = 0;
/// [`CfiRule::cfa`]: CFA = rsp + offset.
pub const CFA_RSP: u8 = 1;
/// [`CfiRule::cfa`]: CFA = rbp + offset.
pub const CFA_RBP: u8 = 2;
/// [`CfiRule::cfa`]: a PLT entry: CFA = rsp + 8, plus 8 from byte `offset`
/// of its 16 on.
pub const CFA_PLT: u8 = 3;
/// [`CfiRule::cfa`]: the outermost frame (`_start`, a thread's start): the
/// return address is undefined, and the stack ends here.
pub const CFA_END: u8 = 4;
/// [`CfiRule::cfa`]: CFA = rsp + offset, and the return address is in
/// rdi, not on the stack: glibc's `vfork` pops it there to keep it
/// across the system call, which the child returns from on the same
/// stack. Known only in the sampled frame, whose registers are live.
pub const CFA_RSP_RA_RDI: u8 = 5;
/// [`CfiRule::cfa`]: CFA = rsp + offset, in the parent only: glibc's
/// `clone` and `clone3` end their CFI at the system call, since the child
/// returns from it on another stack, and these rows carry the rule from
/// before it over the code after it up to the child's own start. A
/// sampled frame whose rax is 0 (the child's return value) ends there.
pub const CFA_RSP_IN_PARENT: u8 = 6;
/// [`CfiRule::cfa`]: CFA = rbx + offset. ld.so's lazy-binding trampoline
/// (`_dl_runtime_resolve_*`) keeps its frame in rbx while it aligns rsp
/// for `xsave`; rbx is followed through the frames above (it is
/// callee-saved: [`CfiRule::rbx_slot`]).
pub const CFA_RBX: u8 = 7;

/// A bucket of a file's index covers at most `1 << MAX_INDEX_SHIFT` bytes
/// of code, so that a row's address within its bucket fits
/// [`CfiRow::pc`]: every row a bucket's search compares lies less than
/// `1 << 16` bytes from the bucket's start.
pub const MAX_INDEX_SHIFT: u32 = 15;

/// One row of a file's table, four bytes: from `pc` up to the next row's,
/// the unwind rules are the file's rule number `rule`. Most of a file's
/// rows repeat a few hundred distinct rules, which are kept once
/// ([`CfiRule`]). The kernel's array holds rows in pairs, each element a
/// `u64` (an array map keeps its elements eight bytes apart), the first
/// row in its low half.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CfiRow {
    /// The row's first address less the file's first row's, modulo
    /// `1 << 16`: within a bucket's search, the address less the bucket's
    /// start (see [`MAX_INDEX_SHIFT`]).
    pub pc: u16,
    /// The rules, as an index into the file's rules.
    pub rule: u16,
}

/// The unwind rules of one or more rows.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CfiRule {
    /// See [`CfiRule::cfa`].
    pub cfa_offset: i32,
    /// The caller's rbp was saved at CFA + 8 * `rbp_slot`; 0: it is still
    /// in rbp. Saves are pushes or moves a few words below the return
    /// address, so a byte of words holds them all; a rule whose save does
    /// not fit is not compiled.
    pub rbp_slot: i8,
    /// The caller's rbx was saved at CFA + 8 * `rbx_slot`; 0: it is still
    /// in rbx. Followed only for [`CFA_RBX`]'s frames.
    pub rbx_slot: i8,
    /// One of the `CFA_*` values.
    pub cfa: u8,
    /// Zero: the rule is eight bytes, no padding.
    pub pad: u8,
}

/// One executable mapping of a process.
///
/// A file's rows are found through its index: the file's code, from its
/// first row's address on, is cut into buckets of `1 << index_shift`
/// bytes, and bucket `b`'s entry is the last row at or before the
/// bucket's start. The row of an address is then searched for between
/// its bucket's entry and the next one's: a few rows on one or two cache
/// lines, where a search of the whole file touched one line a step, each
/// a miss when samples are far apart.
///
/// A bucket names both ends of its rows, so that one read finds them: an
/// array map's elements are eight bytes apart anyway.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Region {
    /// First address.
    pub start: u64,
    /// One past the last.
    pub end: u64,
    /// Subtracted from an address to get the file's virtual address.
    pub bias: u64,
    /// The mapped file's rows; none where it has none (walked by frame
    /// pointer).
    pub rows: FileRows,
}

/// Where a file's rows and index are in the rows and index arrays, which
/// every mapping of the file shares.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FileRows {
    /// The file address the index's first bucket starts at: its first
    /// row's.
    pub index_base: u64,
    /// The file's first row in the rows array.
    pub row_start: u32,
    /// The file's rows; 0 where it has none.
    pub row_len: u32,
    /// The file's first entry in the index array.
    pub index_start: u32,
    /// The file's buckets; at least one where it has rows.
    pub index_len: u32,
    /// A bucket covers `1 << index_shift` bytes of code; at most
    /// [`MAX_INDEX_SHIFT`].
    pub index_shift: u32,
    /// The file's first rule in the rules array.
    pub rule_start: u32,
}

/// One bucket of a file's index: the rows that cover its code are
/// `first..end` of the file's.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bucket {
    /// The last row at or before the bucket's first address.
    pub first: u32,
    /// One past the last row at or before the next bucket's first address.
    pub end: u32,
}

/// A process's regions, sorted by address.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ProcRegions {
    /// Regions in use.
    pub n: u32,
    /// Different at each write of a process's regions, so that a walk
    /// the kernel remembers from older regions is not taken for one of
    /// these.
    pub version: u32,
    /// When the walk last told user space of new code (`bpf_ktime_get_ns`),
    /// so that it does so at most every [`NEW_CODE_EVERY_NS`].
    pub new_code_ns: u64,
    /// The regions.
    pub regions: [Region; MAX_REGIONS],
}

/// Regions a process keeps of those the kernel found itself
/// ([`FoundRegions`]).
pub const MAX_FOUND: usize = 16;

/// A loaded file, as the kernel names it: where the walk finds a
/// mapping's file's rows without user space, from the mapping alone.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FileKey {
    /// `inode.i_ino`.
    pub ino: u64,
    /// `super_block.s_dev`, the kernel's encoding (`major << 20 | minor`),
    /// not `stat`'s.
    pub dev: u32,
    /// Keeps the struct free of padding.
    pub _pad: u32,
}

/// What a [`Region`] of a mapping of a loaded file needs besides the
/// mapping's own addresses: the file's rows and index, and what turns a
/// mapping's start and file offset into the load bias. Only files with a
/// single executable segment have one, so that any executable mapping of
/// the file maps that segment.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FileRegion {
    /// The executable segment's file offset less its virtual address: a
    /// mapping at `start` of file offset `pgoff * 4096` has the bias
    /// `start - pgoff * 4096 + seg_delta`.
    pub seg_delta: u64,
    /// The file's rows.
    pub rows: FileRows,
}

/// The regions the kernel found for a process itself (`bpf_find_vma`),
/// for code user space had not given it regions for yet: a process that
/// lives a few tens of milliseconds is gone before user space reads its
/// maps. Kept until the process runs a new program or exits.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FoundRegions {
    /// The slot the next region found goes to: the oldest is replaced.
    pub next: u32,
    /// Regions in use.
    pub n: u32,
    /// The regions, in the order found.
    pub regions: [Region; MAX_FOUND],
}

/// Offsets of the kernel structures the CFI programs read, from BTF.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CfiOffsets {
    /// `pt_regs.ip`.
    pub ip: u32,
    /// `pt_regs.sp`.
    pub sp: u32,
    /// `pt_regs.bp`.
    pub bp: u32,
    /// `pt_regs.cs`, whose low two bits are 3 in user mode.
    pub cs: u32,
    /// `task_struct.pid` (the thread id).
    pub task_pid: u32,
    /// `task_struct.tgid` (the process id).
    pub task_tgid: u32,
    /// `task_struct.mm`.
    pub task_mm: u32,
    /// `mm_struct.start_code`: the program's executable segment.
    pub mm_start_code: u32,
    /// `vm_area_struct.vm_start`.
    pub vma_start: u32,
    /// `vm_area_struct.vm_end`.
    pub vma_end: u32,
    /// `vm_area_struct.vm_pgoff`: the mapping's file offset, in pages.
    pub vma_pgoff: u32,
    /// `vm_area_struct.vm_flags`.
    pub vma_flags: u32,
    /// `vm_area_struct.vm_file`.
    pub vma_file: u32,
    /// `file.f_inode`.
    pub file_inode: u32,
    /// `inode.i_ino`.
    pub inode_ino: u32,
    /// `inode.i_sb`.
    pub inode_sb: u32,
    /// `super_block.s_dev`.
    pub sb_dev: u32,
    /// `pt_regs.di`.
    pub di: u32,
    /// `pt_regs.ax`.
    pub ax: u32,
    /// `pt_regs.bx`.
    pub bx: u32,
    /// `pt_regs.r13`: an interpreted Java frame's bytecode pointer, in
    /// the sampled frame.
    pub r13: u32,
    /// `task_struct.thread.fsbase`: the thread pointer, where a Python
    /// thread's state is found from.
    pub task_fsbase: u32,
    /// Whether the walk may look up mappings itself (`bpf_find_vma`, 5.17
    /// and later): read-only, so that the verifier drops the helper's
    /// call where it is 0 and a kernel without it loads the walk.
    pub find_vma: u32,
}

crate::pod!(
    CfiRow,
    CfiRule,
    Bucket,
    Region,
    ProcRegions,
    CfiOffsets,
    FileKey,
    FileRegion,
    FoundRegions
);

/// A walk that steps through CPython's frames (a bit of [`Runtimes`]).
pub const RUNTIME_PYTHON: u32 = 1;
/// A walk that steps through the JVM's frames (a bit of [`Runtimes`]).
pub const RUNTIME_JAVA: u32 = 2;
/// A walk that steps through V8's JavaScript frames (a bit of
/// [`Runtimes`]).
pub const RUNTIME_V8: u32 = 4;
/// Every runtime's frames: what the walks of every program but
/// `profile`'s sampling one step through.
pub const RUNTIMES_ALL: u32 = RUNTIME_PYTHON | RUNTIME_JAVA | RUNTIME_V8;

/// Slots of each CPU's share of a runtime's table of the things its walk
/// told user space of (`PY_TOLD`, `JAVA_TOLD`, `V8_TOLD`), a power of
/// two.
pub const TOLD_SLOTS: u32 = 4096;

/// Slots of each CPU's share of `JAVA_CHECKS`, the checks of
/// interpreted Java frames worked out, a power of two.
pub const JAVA_CHECK_SLOTS: u32 = 1024;

/// The walks' tables of slots for each CPU, with the slots a CPU has:
/// arrays that user space sizes to that many a possible CPU, each CPU
/// using its own. An array is made in one allocation; a per-CPU array of
/// as many slots took one per-CPU allocation a slot, 2.5 ms of each
/// start for each of the 4096-slot tables.
pub const CPU_TABLES: [(&str, u32); 4] = [
    ("PY_TOLD", TOLD_SLOTS),
    ("JAVA_TOLD", TOLD_SLOTS),
    ("V8_TOLD", TOLD_SLOTS),
    ("JAVA_CHECKS", JAVA_CHECK_SLOTS),
];

/// The runtimes a variant of the walk steps through, as bits
/// ([`RUNTIME_PYTHON`], [`RUNTIME_JAVA`]). A walk without a runtime's
/// part is compiled without it, so the verifier does not go through it:
/// `profile` loads the variant of the runtimes in scope and no more.
pub type Runtimes = u32;

/// The array of every loaded file's compiled rows, written by user space
/// through a shared mapping; it sizes it.
pub const CFI_ROWS: &str = "CFI_ROWS";
/// The array of every loaded file's distinct rules ([`CfiRule`]), which
/// its rows number; shared and sized as [`CFI_ROWS`].
pub const CFI_RULES: &str = "CFI_RULES";
/// The array of every loaded file's index into its rows ([`Bucket`]);
/// shared and sized as [`CFI_ROWS`].
pub const CFI_INDEX: &str = "CFI_INDEX";
/// Each process's executable regions ([`ProcRegions`]), by process id;
/// user space sizes and fills it.
pub const CFI_PROCS: &str = "CFI_PROCS";
/// Each loaded file's rows ([`FileRegion`]), by the file as the kernel
/// names it ([`FileKey`]), for mappings the walk finds itself; user space
/// sizes and fills it.
pub const CFI_FILES: &str = "CFI_FILES";
/// The regions the walk found itself ([`FoundRegions`]), by process id;
/// user space sizes it.
pub const CFI_FOUND: &str = "CFI_FOUND";
/// The global of `struct pt_regs` and `struct task_struct` offsets
/// ([`CfiOffsets`]), from the kernel's BTF.
pub const CFI_OFFSETS: &str = "CFI_OFFSETS";
/// The global of the most frames the walk keeps of a stack
/// (`--max-stack`).
pub const MAX_STACK_DEPTH: &str = "MAX_STACK_DEPTH";

/// The program on the raw tracepoint `sched_process_exec`: the walk's
/// bookkeeping of a process that runs a new program.
pub const PROG_EXEC: &str = "cfi_exec";
/// The program on the raw tracepoint `sched_process_exit`.
pub const PROG_EXIT: &str = "cfi_exit";
/// The program on the raw tracepoint `sched_process_fork`.
pub const PROG_FORK: &str = "cfi_fork";
/// The uprobe on the dynamic loader's `_dl_debug_state`, which a process
/// calls when it has loaded or unloaded a library.
pub const PROG_LOADED: &str = "cfi_loaded";

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::{vec, vec::Vec};

    /// The branchless count is what a scan counts, for buckets of every
    /// size up to the most a search covers, rows at and between the
    /// wanted offsets, rows whose 16 bits wrap past the bucket's start,
    /// and a `pc_at` that fails.
    #[test]
    fn rows_at_or_before_counts_what_a_scan_counts() {
        let most = (1u64 << SEARCH_STEPS) - 1;
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for round in 0..400u64 {
            let n = match round {
                0..=40 => round,
                41..=50 => most - (round - 41),
                _ => next() % (most + 1),
            };
            let start = (next() & 0xffff) as u16;
            // Offsets from the start, sorted: the first row at or before
            // the start (offset 0 here), the others after it.
            let mut offsets: Vec<u16> = (0..n).map(|_| (next() % 0xffff) as u16 + 1).collect();
            offsets.sort_unstable();
            offsets.insert(0, 0);
            let pcs: Vec<u16> = offsets.iter().map(|o| start.wrapping_add(*o)).collect();
            let mut wants: Vec<u16> = vec![0, 0xffff, (next() & 0xffff) as u16];
            for k in [1usize, (n as usize) / 2, n as usize] {
                if let Some(o) = offsets.get(k) {
                    wants.extend([*o, o.wrapping_sub(1), o.saturating_add(1)]);
                }
            }
            for want in wants {
                let scan = offsets[1..].iter().filter(|o| **o <= want).count() as u64;
                let mut read_past = false;
                let got = rows_at_or_before(n, start, want, |k| {
                    read_past |= k > n;
                    pcs.get(k as usize).copied()
                });
                assert_eq!(got, Some(scan), "n {n} start {start} want {want}");
                assert!(!read_past, "a row past the bucket was read");
            }
        }
        assert_eq!(rows_at_or_before(5, 0, 9, |_| None), None);
    }
}

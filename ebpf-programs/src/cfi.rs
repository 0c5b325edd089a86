//! The CFI walk: user space loads each process's executable regions and
//! their files' compiled rows (`rtrace_common::unwind`); each frame is a
//! search for its region, a bounded binary search for its row, and one or
//! two reads of the user stack. Shared by the tools that take user stacks
//! (profile, offcputime), with the exec and fork programs that keep the
//! tables in step with the processes ([`cfi_programs`](crate::cfi_programs)).
use aya_ebpf::{
    EbpfContext, Global,
    bindings::BPF_F_MMAPABLE,
    helpers::{
        bpf_get_current_pid_tgid, bpf_ktime_get_ns,
        generated::{self, bpf_find_vma, bpf_get_current_task_btf, bpf_loop, bpf_task_pt_regs},
    },
    macros::map,
    maps::{Array, HashMap, PerCpuArray},
    programs::RawTracePointContext,
};
use rtrace_common::{
    stacks::{
        ERR_CUT_SHORT, ERR_DEEP, ERR_EXECING, ERR_EXITING, ERR_FIND_BUSY, ERR_FIND_NO_FILE,
        ERR_FOUND, ERR_FP_FRAMES, ERR_NO_TABLES, ERR_RUNTIME_UNLOADED, ERR_TAIL_RECALLED, Found,
        MAX_DEPTH, MAX_STACK, SEEN_EXEC, SEEN_EXIT, SEEN_FORK, SEEN_FOUND, SEEN_NEW_CODE, Seen,
    },
    unwind::{
        Bucket, CFA_END, CFA_PLT, CFA_RBP, CFA_RBX, CFA_RSP, CFA_RSP_IN_PARENT, CFA_RSP_RA_RDI,
        CfiOffsets, CfiRow, CfiRule, FileKey, FileRegion, FileRows, FoundRegions, MAX_FOUND,
        MAX_REGIONS, NEW_CODE_EVERY_NS, ProcRegions, RUNTIME_JAVA, RUNTIME_PYTHON, RUNTIME_V8,
        RUNTIMES_ALL, Region, rows_at_or_before,
    },
};

use crate::{
    count_error,
    events::Sink,
    global,
    process::{born_of, born_seldom},
    read_kernel, read_user,
    scratch::{
        CHUNK_SLOTS, CHUNK_WORDS, MAX_READS, NO_TAIL, Scratch, State, TAIL_READS, TAIL_WORDS,
        TailWalk, chunk_index,
    },
};

/// Offsets into `struct pt_regs` and `struct task_struct`, from BTF.
#[unsafe(no_mangle)]
static CFI_OFFSETS: Global<CfiOffsets> = Global::new(CfiOffsets {
    ip: 0,
    sp: 0,
    bp: 0,
    cs: 0,
    task_pid: 0,
    task_tgid: 0,
    task_mm: 0,
    mm_start_code: 0,
    vma_start: 0,
    vma_end: 0,
    vma_pgoff: 0,
    vma_flags: 0,
    vma_file: 0,
    file_inode: 0,
    inode_ino: 0,
    inode_sb: 0,
    sb_dev: 0,
    di: 0,
    ax: 0,
    bx: 0,
    r13: 0,
    task_fsbase: 0,
    find_vma: 0,
});

/// Every loaded file's rows; user space sizes it and writes them
/// through a shared mapping, not a syscall per row.
#[map]
static CFI_ROWS: Array<u64> = Array::with_max_entries(1, BPF_F_MMAPABLE);
/// Every loaded file's distinct unwind rules, which its rows number; user
/// space sizes it and writes them as it does the rows.
#[map]
static CFI_RULES: Array<CfiRule> = Array::with_max_entries(1, BPF_F_MMAPABLE);
/// Every loaded file's index into its rows (see [`Region`]); user space
/// sizes it and writes it as it does the rows.
#[map]
static CFI_INDEX: Array<Bucket> = Array::with_max_entries(1, BPF_F_MMAPABLE);
/// Each process's regions, by process id; user space sizes it.
#[map]
static CFI_PROCS: HashMap<u32, ProcRegions> = HashMap::with_max_entries(1, 0);

/// Each loaded file's rows, by the file as the kernel names it, for
/// mappings the walk finds itself; user space sizes it and fills it as
/// it loads files.
#[map]
static CFI_FILES: HashMap<FileKey, FileRegion> = HashMap::with_max_entries(1, 0);
/// The regions the walk found itself, by process id; user space sizes
/// it. Not LRU: entries go when their process runs a new program or
/// exits, and an LRU map's eviction could drop one still in use for one
/// long gone.
#[map]
static CFI_FOUND: HashMap<u32, FoundRegions> = HashMap::with_max_entries(1, 0);
/// A zeroed [`FoundRegions`], what a process's entry is created from:
/// too big to build on the stack.
#[map]
static CFI_FOUND_ZERO: PerCpuArray<FoundRegions> = PerCpuArray::with_max_entries(1, 0);
/// The regions of processes user space has not given any: none. The
/// walk goes on from the regions it finds itself.
#[map]
static CFI_NO_PROCS: Array<ProcRegions> = Array::with_max_entries(1, 0);

/// The generation each process last told user space of a new stack in
/// (`stacks::first_in_generation`); only with the CFI walk, whose exec
/// program clears a process's.
#[map]
pub(crate) static SEEN: aya_ebpf::maps::LruHashMap<u32, u32> =
    aya_ebpf::maps::LruHashMap::with_max_entries(8192, 0);

/// Steps of the count of a process's regions by halves: enough to count
/// them all.
const REGION_STEPS: usize = (MAX_REGIONS + 1).next_power_of_two().trailing_zeros() as usize;

/// A thread's last walk, remembered: the walk is a function of the
/// registers it starts from, the stack words it reads (whose addresses
/// follow from the registers, the words read before and the rules) and
/// the process's regions (whose rows never change once loaded), so a
/// thread that stops again with the same registers, the same words at the
/// same places and the same regions has the same stack. Threads that
/// block do so mostly at the same few places (a loop's read, a worker's
/// wait), where this saves the walk: the words are compared, not searched
/// for.
#[repr(C)]
pub struct Remembered {
    ip: u64,
    sp: u64,
    bp: u64,
    /// A hash of the words the walk read, in order.
    words: u64,
    /// The stack's hash, as stored.
    stack: u64,
    /// Its depth.
    depth: u64,
    /// The regions' version (`ProcRegions::version`).
    version: u32,
    /// The stack tables' generation it was stored in: a stack is stored
    /// again in each, as user space moves them out.
    generation: u32,
    tgid: u32,
    /// How many words it read.
    nreads: u32,
    /// The bytes of the stack up to the last of them.
    span: u32,
    _pad: u32,
    /// Their indexes in the chunk.
    reads: [u8; MAX_READS],
}

/// Each thread's last walk, for walks in task context.
#[unsafe(link_section = ".maps")]
#[unsafe(no_mangle)]
static WALKS: crate::task_storage::TaskStorage<Remembered> =
    crate::task_storage::TaskStorage::new();

/// A thread's tail, kept (`TailWalk`): the native frames its last walk
/// took under its last runtime frame, from registers `ip`, `sp` and `bp`.
/// As a remembered walk is, they are a function of those registers, the
/// words read from the stack above `sp` and the process's regions: a
/// walk that comes to the same registers, with the same words there and
/// the same regions, takes the same frames. The runtime frames above
/// them (the thread's Python frames, its interpreted Java methods) change
/// from sample to sample; the thread's start, its runtime's entry and
/// `main` below them do not.
#[repr(C)]
pub struct Tail {
    ip: u64,
    sp: u64,
    bp: u64,
    /// The hash of the words read, in order.
    words: u64,
    tgid: u32,
    /// The regions' version (`ProcRegions::version`).
    version: u32,
    /// Its frames.
    n: u32,
    nreads: u32,
    /// Bytes from `sp` to the end of the last word read.
    span: u32,
    _pad: u32,
    frames: [u64; TAIL_FRAMES],
    /// The words' indexes from `sp`.
    reads: [u16; TAIL_READS],
}

/// `TailWalk::pairs` at a frame of V8's code walked as native code: the
/// next native frame starts the tail.
const HELD_TAIL: u32 = NO_TAIL - 1;

/// Most frames a kept tail holds.
const TAIL_FRAMES: usize = 32;

/// Each thread's tail, kept.
#[unsafe(link_section = ".maps")]
#[unsafe(no_mangle)]
static TAILS: crate::task_storage::TaskStorage<Tail> = crate::task_storage::TaskStorage::new();

/// What every frame of one walk works on, handed to `bpf_loop`'s
/// callback; it does not change during the walk.
#[repr(C)]
struct Walk {
    scratch: *mut Scratch,
    procs: *const ProcRegions,
    tgid: u32,
    /// Whether `procs` are the process's own, not [`CFI_NO_PROCS`]: code in
    /// none of its own is new code, to tell user space of.
    own: u32,
}

/// How [`walk`] got its user registers, which its caller (a global
/// function's, whose arguments can only be numbers) copies to
/// `Scratch::regs` ([`stash_regs`]): in task context (a switch or a
/// wakeup, where the walk is remembered), those the task entered the
/// kernel with.
pub(crate) const REGS_TASK: u64 = 0;
/// A sample's: its registers if it hit user mode, else those the task
/// entered the kernel with.
pub(crate) const REGS_SAMPLED: u64 = 1;
/// A sample whose registers could not be read.
pub(crate) const REGS_UNREAD: u64 = 2;

/// Copies the walk's first user registers to the scratch value's `regs`:
/// `sampled`'s (a perf event's registers, or null in task context) if
/// the sample hit user mode, else those the task entered the kernel
/// with. Returns one of the `REGS_*`.
///
/// Done by the caller, all of it: the walk, a global function, then
/// loads them from one place. Loads from either place, in the walk,
/// were merged by the compiler into instructions that load from both,
/// which the verifier refuses, and a copy on its stack would grow a
/// frame that with the step's must stay within 512 bytes.
#[inline(always)]
pub(crate) fn stash_regs(scratch: *mut Scratch, sampled: *const u8) -> u64 {
    let regs = if sampled.is_null() {
        task_user_regs()
    } else {
        match sampled_user_regs(sampled) {
            Ok(Some(regs)) => Some(regs),
            Ok(None) => task_user_regs(),
            Err(()) => return REGS_UNREAD,
        }
    };
    let Some((ip, sp, bp, bx)) = regs else {
        return REGS_UNREAD;
    };
    // SAFETY: a map value.
    unsafe { (*scratch).regs = [ip, sp, bp, bx] };
    if sampled.is_null() {
        REGS_TASK
    } else {
        REGS_SAMPLED
    }
}

/// A perf event's registers (`sampled`), if the sample hit user mode;
/// `Err` if they could not be read.
#[inline(always)]
fn sampled_user_regs(sampled: *const u8) -> Result<Option<(u64, u64, u64, u64)>, ()> {
    let o = global(&CFI_OFFSETS);
    let read = |off: u32| read_kernel::<u64>(sampled, off).map_err(|_| ());
    if read(o.cs)? & 3 != 3 {
        return Ok(None);
    }
    Ok(Some((read(o.ip)?, read(o.sp)?, read(o.bp)?, read(o.bx)?)))
}

/// The registers the current task entered the kernel with.
#[inline(always)]
fn task_user_regs() -> Option<(u64, u64, u64, u64)> {
    let o = global(&CFI_OFFSETS);
    // SAFETY: the helpers have no preconditions beyond a task.
    let regs = unsafe { bpf_task_pt_regs(bpf_get_current_task_btf()) } as *const u8;
    if regs.is_null() {
        return None;
    }
    // A BTF-typed pointer: plain loads, which the verifier checks against
    // `struct pt_regs` (the offsets are read-only data, constants to it),
    // instead of a helper call each.
    // SAFETY: `regs` is the task's live register frame.
    let load = |off: u32| unsafe { *(regs.wrapping_add(off as usize) as *const u64) };
    Some((load(o.ip), load(o.sp), load(o.bp), load(o.bx)))
}

/// The current task's user register at `pt_regs` offset `off`: the
/// registers it entered the kernel with, which are also those a sample
/// taken in user mode saw (the interrupt saved them there).
#[inline(always)]
fn task_reg(off: u32) -> u64 {
    // SAFETY: the helpers have no preconditions beyond a task.
    let regs = unsafe { bpf_task_pt_regs(bpf_get_current_task_btf()) } as *const u8;
    if regs.is_null() {
        return 0;
    }
    // SAFETY: a BTF-typed pointer to the task's register frame, whose
    // loads the verifier checks against `struct pt_regs`.
    unsafe { *(regs.wrapping_add(off as usize) as *const u64) }
}

#[inline(always)]
fn row(index: u32) -> Option<CfiRow> {
    // Shifted out, not chosen by a branch or an index: either doubles
    // the states the verifier walks at each step of the search. The
    // array is little-endian: the first row is the low half, a row's
    // address its low 16 bits.
    let pair = *CFI_ROWS.get(index >> 1)?;
    let half = (pair >> ((index & 1) * 32)) as u32;
    Some(CfiRow {
        pc: half as u16,
        rule: (half >> 16) as u16,
    })
}

/// Copies the top of the user stack, from `sp`, into `chunk`, and
/// returns how many bytes it holds: as much as `CHUNK_WORDS`, or to
/// the end of `sp`'s page where the stack ends sooner; 0 if neither can
/// be read.
#[inline(always)]
fn copy_top(chunk: &mut [u64; CHUNK_SLOTS], sp: u64) -> u64 {
    let full = (CHUNK_WORDS * 8) as u32;
    let dst = chunk.as_mut_ptr().cast::<core::ffi::c_void>();
    // SAFETY: `chunk` has room for `full` bytes; the helper copes with
    // any source address.
    if unsafe { generated::bpf_probe_read_user(dst, full, sp as *const _) } == 0 {
        return u64::from(full);
    }
    let to_page_end = (4096 - (sp & 4095)) as u32;
    let len = to_page_end.min(full);
    // SAFETY: as above, and `len <= full`.
    if unsafe { generated::bpf_probe_read_user(dst, len, sp as *const _) } == 0 {
        u64::from(len)
    } else {
        0
    }
}

/// `N` words of the user stack at `addr`: from the copy of its top where
/// it holds them, else read.
#[inline(always)]
fn stack_words<const N: usize>(
    chunk: &[u64; CHUNK_SLOTS],
    st: &mut State,
    tail: &mut TailWalk,
    addr: u64,
) -> Option<[u64; N]> {
    let words = chunk_words::<N>(chunk, st, addr)?;
    if tail.ok != 0 {
        note_tail(tail, addr, &words);
    }
    Some(words)
}

/// A tail's reads, `words` at `addr`: by index from its stack pointer,
/// and hashed; past what it may hold, it can no longer be kept.
#[inline(always)]
fn note_tail<const N: usize>(tail: &mut TailWalk, addr: u64, words: &[u64; N]) {
    let off = addr.wrapping_sub(tail.regs[1]);
    let end = off.wrapping_add(8 * N as u64);
    if off & 7 != 0 || end > (TAIL_WORDS * 8) as u64 || end < off {
        tail.ok = 0;
        return;
    }
    for (k, w) in words.iter().enumerate() {
        match tail.reads.get_mut(tail.nreads as usize) {
            Some(r) => {
                *r = (off / 8) as u16 + k as u16;
                tail.nreads += 1;
                tail.words = mix(tail.words, *w);
            }
            None => {
                tail.ok = 0;
                return;
            }
        }
    }
    if end as u32 > tail.span {
        tail.span = end as u32;
    }
}

/// `N` words of the user stack at `addr`, as [`stack_words`] gives them.
#[inline(always)]
fn chunk_words<const N: usize>(
    chunk: &[u64; CHUNK_SLOTS],
    st: &mut State,
    addr: u64,
) -> Option<[u64; N]> {
    if let Some(i) = chunk_index(st.chunk_base, st.chunk_len, addr, 8 * N as u64) {
        let mut out = [0u64; N];
        for (k, w) in out.iter_mut().enumerate() {
            *w = *chunk.get(i + k)?;
            match st.reads.get_mut(st.nreads as usize) {
                Some(r) => {
                    *r = (i + k) as u8;
                    st.nreads += 1;
                    st.words = mix(st.words, *w);
                    let end = (i + k + 1) as u32 * 8;
                    if end > st.span {
                        st.span = end;
                    }
                }
                None => st.unremembered = 1,
            }
        }
        return Some(out);
    }
    st.unremembered = 1;
    read_user::<[u64; N]>(addr)
}

/// Ends a walk on a stack word it could not read: counted, and the
/// stack marked cut short for user space (`CUT_USER`), which warns only
/// where that is common in a process.
#[inline(always)]
fn cut_short(st: &mut State) {
    count_error(ERR_CUT_SHORT);
    st.unremembered = crate::scratch::CUT;
}

/// The region of `procs` that holds `ip`, into `st.last`: the last frame's
/// region first, else the last region that starts at or before `ip`
/// (user space lists them in address order), counted by halves without
/// a branch as [`rows_at_or_before`] counts rows; a search that branched
/// three ways at each step, with a copy of the region on each way out,
/// was followed down each by the verifier with the rest of the step.
#[inline(always)]
fn region(procs: &ProcRegions, st: &mut State, ip: u64) -> bool {
    if st.last.start <= ip && ip < st.last.end {
        return true;
    }
    let n = u64::from(procs.n);
    if n > MAX_REGIONS as u64 {
        return false;
    }
    let mut below = 0u64;
    let mut step = 1u64 << (REGION_STEPS - 1);
    for _ in 0..REGION_STEPS {
        let i = below + step - 1;
        // 1 while region `i` is one of the `n`; past them, the first is
        // read again and nothing counted.
        let inside = rtrace_common::sign_bit(i.wrapping_sub(n));
        let Some(r) = procs.regions.get((inside * i) as usize) else {
            return false;
        };
        // A difference's sign bit compares addresses below 1 << 63. The
        // one region above them, the last, is `[vsyscall]` (no code runs
        // there: a call into it traps and the kernel emulates it), taken
        // to lie after every pc; counted as before them, it once sent
        // every search past the region it was for.
        let after =
            rtrace_common::sign_bit(ip.wrapping_sub(r.start)) | rtrace_common::sign_bit(r.start);
        below += (1 - after) * inside * step;
        step >>= 1;
    }
    let Some(r) = procs.regions.get((below as usize).wrapping_sub(1)) else {
        return false;
    };
    if ip >= r.end {
        return false;
    }
    // SAFETY: a map value into another; a region is of words.
    unsafe { crate::copy_value(&mut st.last, r) };
    true
}

/// The rules of file `r` at file address `pc`, if any CFI covers it:
/// those of the last row at or before `pc`, found by halves among the
/// rows of its bucket of the index. A bucket's first row is at or before
/// the bucket's start; the others lie less than `1 << 16` bytes after it,
/// so that their 16 bits of address compare as offsets from the start.
#[inline(always)]
fn search_rows(r: &FileRows, pc: u64) -> Option<CfiRule> {
    let last = r.index_len.checked_sub(1)?;
    if pc < r.index_base {
        return None;
    }
    let off = pc - r.index_base;
    let b = off >> (r.index_shift & 63);
    let b = if b > u64::from(last) { last } else { b as u32 };
    let start = u64::from(b) << (r.index_shift & 63);
    // Past the last bucket every row compares below it.
    let want = off - start;
    let want = if want > 0xffff { 0xffff } else { want as u16 };
    let start = start as u16;
    let Bucket { first, end } = *CFI_INDEX.get(r.index_start + b)?;
    let hi = if end > r.row_len { r.row_len } else { end };
    // The rows searched are those after the bucket's first, up to `hi`:
    // none where the bucket is empty (a sign bit, not a branch).
    let n = (i64::from(hi) - i64::from(first) - 1) as u64;
    let n = n * (1 - rtrace_common::sign_bit(n));
    let base = r.row_start.wrapping_add(first);
    let below = rows_at_or_before(n, start, want, |k| {
        Some(row(base.wrapping_add(k as u32))?.pc)
    })?;
    let found = row(base.wrapping_add(below as u32))?;
    CFI_RULES.get(r.rule_start + u32::from(found.rule)).copied()
}

/// The mapping `bpf_find_vma` found, as [`vma_found`] reads it.
#[repr(C)]
#[derive(Default)]
struct Vma {
    start: u64,
    end: u64,
    pgoff: u64,
    flags: u64,
    ino: u64,
    dev: u32,
    _pad: u32,
}

/// `vm_flags`' bit of an executable mapping.
const VM_EXEC: u64 = 4;
/// `-EBUSY`, what `bpf_find_vma` returns where it cannot lock the memory
/// map (with interrupts off, once per CPU until its deferred unlock ran).
const EBUSY: i64 = -16;

/// `bpf_find_vma`'s callback: copies what a region needs of the mapping.
/// The mapping's own members are plain loads, which the verifier checks
/// against the BTF types (the offsets are read-only data, constants to
/// it). The chain from its file to the device is read by the helper: a
/// plain load of a pointer member has the verifier look up, at each
/// state it reaches the load in, whether the pointer is trusted, by name
/// through every type of the kernel's BTF (with `born`'s, 8 % of the
/// native walk's load on 6.18; these alone about 6 ms of its 121); the
/// helper's calls come once per lookup of a mapping, not per sample. A
/// missing file reads as zeros.
#[inline(never)]
extern "C" fn vma_found(
    _task: *mut core::ffi::c_void,
    vma: *mut core::ffi::c_void,
    ctx: *mut core::ffi::c_void,
) -> i64 {
    let o = global(&CFI_OFFSETS);
    let vma = vma as *const u8;
    // SAFETY: `ctx` is the caller's `Vma`.
    let out = unsafe { &mut *ctx.cast::<Vma>() };
    // SAFETY: `vma` is a BTF-typed kernel pointer, whose loads the
    // verifier guards.
    unsafe {
        let load =
            |p: *const u8, off: u32| core::ptr::read_volatile(p.add(off as usize).cast::<u64>());
        out.start = load(vma, o.vma_start);
        out.end = load(vma, o.vma_end);
        out.pgoff = load(vma, o.vma_pgoff);
        out.flags = load(vma, o.vma_flags);
    }
    let file = crate::read_ptr(vma, o.vma_file);
    let inode = crate::read_ptr(file, o.file_inode);
    let Ok(ino) = read_kernel::<u64>(inode, o.inode_ino) else {
        return 0;
    };
    let Ok(dev) = read_kernel::<u32>(crate::read_ptr(inode, o.inode_sb), o.sb_dev) else {
        return 0;
    };
    out.ino = ino;
    out.dev = dev;
    0
}

/// The region of the current task's mapping at `addr`, found by the
/// kernel, if it maps a file whose rows are loaded (counted either way),
/// and the record that tells user space of it (process `tgid`'s);
/// `Err(())` if the lookup could not be done (busy, counted) or found no
/// executable mapping.
#[inline(always)]
fn find_region(tgid: u32, addr: u64) -> Result<(Region, Found), ()> {
    if global(&CFI_OFFSETS).find_vma == 0 {
        return Err(());
    }
    let mut vma = Vma::default();
    // SAFETY: `vma_found` is a callback of the helper's signature and
    // `vma` lives across the call.
    let ret = unsafe {
        bpf_find_vma(
            bpf_get_current_task_btf(),
            addr,
            vma_found as *mut core::ffi::c_void,
            (&raw mut vma).cast(),
            0,
        )
    };
    if ret == EBUSY {
        count_error(ERR_FIND_BUSY);
    }
    if ret != 0 || vma.flags & VM_EXEC == 0 || vma.ino == 0 {
        return Err(());
    }
    let key = FileKey {
        ino: vma.ino,
        dev: vma.dev,
        _pad: 0,
    };
    // SAFETY: a map value, copied.
    let Some(f) = (unsafe { CFI_FILES.get(key) }).copied() else {
        count_error(ERR_FIND_NO_FILE);
        return Err(());
    };
    count_error(ERR_FOUND);
    let region = Region {
        start: vma.start,
        end: vma.end,
        bias: vma
            .start
            .wrapping_sub(vma.pgoff.wrapping_mul(4096))
            .wrapping_add(f.seg_delta),
        rows: f.rows,
    };
    let found = Found {
        tgid,
        flags: SEEN_FOUND,
        dev: vma.dev,
        _pad: 0,
        ino: vma.ino,
        start: vma.start,
        end: vma.end,
        pgoff: vma.pgoff,
        born: 0,
    };
    Ok((region, found))
}

/// Keeps region `r`, found for process `tgid`, for its later frames and
/// samples; the oldest goes when there is no room.
#[inline(always)]
fn keep_found(tgid: u32, r: &Region) {
    let Some((found, _)) = crate::get_or_insert(&CFI_FOUND, &tgid, &CFI_FOUND_ZERO) else {
        return;
    };
    // SAFETY: a map value. Two threads of one process may race here: a
    // torn region can only misname that process's frames.
    unsafe {
        let next = (*found).next as usize % MAX_FOUND;
        if let Some(slot) = (*found).regions.get_mut(next) {
            crate::copy_value(slot, r);
        }
        (*found).next = (next + 1) as u32;
        if ((*found).n as usize) < MAX_FOUND {
            (*found).n += 1;
        }
    }
}

/// The region holding `ip` among those the kernel found for process
/// `tgid`, or found now, at most once a walk (`bpf_find_vma` succeeds
/// about once per CPU with interrupts off, until its deferred unlock
/// runs), into `st.last`.
#[inline(always)]
fn found_region(tgid: u32, st: &mut State, ip: u64) -> bool {
    if let Some(found) = CFI_FOUND.get_ptr(tgid) {
        // SAFETY: a map value.
        let found = unsafe { &*found };
        for i in 0..MAX_FOUND {
            if i as u32 >= found.n {
                break;
            }
            let Some(r) = found.regions.get(i) else {
                break;
            };
            if r.start <= ip && ip < r.end && r.rows.row_len != 0 {
                // SAFETY: a map value into another; a region is of words.
                unsafe { crate::copy_value(&mut st.last, r) };
                return true;
            }
        }
    }
    if st.find_tried != 0 {
        return false;
    }
    st.find_tried = 1;
    let Ok((r, found)) = find_region(tgid, ip) else {
        return false;
    };
    keep_found(tgid, &r);
    st.last = r;
    st.found = found;
    true
}

/// Or'ed into a walk's runtimes (`RT`): Java's and V8's steps are taken
/// by the global functions `rtrace_global_java_step` and
/// `rtrace_global_v8_step` ([`crate::stacks::java_step`]), which the
/// kernel verifies once each, on their own, and only in the programs
/// whose walk takes them; inlined, each was verified again for every state the walk
/// reaches a frame in. On 6.18 that takes the walk through every
/// runtime's frames from 288k instructions to 163k. Python's step stays
/// inlined: apart, it cost more (229k for Python's walk, against 154k).
///
/// The objects that walk through every runtime's frames with it are
/// `profile`'s and `offcputime`'s (`cfi_programs!(steps_apart)`): on 6.18
/// their switch programs went from 280k instructions to 155k, and
/// `profile -e`'s from about as many to 163k. Only in the `cfi_global`
/// variant: the step's frame is one more in the chain of calls down to
/// it, which even 6.18 holds to 512 bytes together (`combined stack
/// size`). The programs of those objects fit (their frames are at most
/// 176 bytes, the walk's 80 and its step's 192, this one's 64), but for
/// `raw_sched_switch`, used only where the BTF tracepoint cannot be
/// attached; `trace`'s, `strace`'s and `memleak`'s, with larger frames,
/// keep the steps inlined.
pub const STEPS_APART: u32 = 1 << 8;

/// [`crate::stacks::v8_step`]'s result where V8's step leaves the frame to the
/// native walk (its `None`).
pub const STEP_NATIVE: u64 = 2;

#[cfg(feature = "cfi_global")]
unsafe extern "C" {
    /// [`crate::stacks::java_step`]: a global function that
    /// `cfi_programs!(steps_apart)` defines.
    fn rtrace_global_java_step(tgid: u64) -> u64;
    /// [`crate::stacks::v8_step`], likewise.
    fn rtrace_global_v8_step(code: u64, tgid: u64) -> u64;
}

/// `end`, a global function's 0 or 1, as a `bpf_loop` callback's result,
/// which the verifier asks to know is 0 or 1: masked where LLVM, which
/// sees the function's few results, cannot drop the mask.
#[cfg(feature = "cfi_global")]
#[inline(always)]
fn callback_end(mut end: u64) -> i64 {
    // SAFETY: an empty instruction sequence, which only hides the value.
    unsafe { core::arch::asm!("/* {0} */", inout(reg) end, options(pure, nomem, nostack)) };
    (end & 1) as i64
}

/// [`crate::java::step`]; with [`STEPS_APART`], through the global
/// function.
#[inline(always)]
fn java_step<const RT: u32>(scratch: &mut Scratch, tgid: u32) -> i64 {
    #[cfg(feature = "cfi_global")]
    if RT & STEPS_APART != 0 {
        // SAFETY: a global function of this object, of scalars; it works
        // on this CPU's scratch value, which the walk does not hold
        // across the call.
        let end = unsafe { rtrace_global_java_step(u64::from(tgid)) };
        return callback_end(end);
    }
    crate::java::step(scratch, tgid)
}

/// [`crate::v8::step`], likewise.
#[inline(always)]
fn v8_step<const RT: u32>(scratch: &mut Scratch, tgid: u32, code: u32) -> Option<i64> {
    #[cfg(feature = "cfi_global")]
    if RT & STEPS_APART != 0 {
        // SAFETY: as in `java_step`.
        return match unsafe { rtrace_global_v8_step(u64::from(code), u64::from(tgid)) } {
            STEP_NATIVE => None,
            end => Some(callback_end(end)),
        };
    }
    crate::v8::step(scratch, tgid, code)
}

/// One frame of the walk, run by `bpf_loop`: records the frame's pc
/// and steps to the caller; 1 ends the walk. `RT` says which runtimes'
/// frames it steps through (`rtrace_common::unwind::Runtimes`); the
/// others' parts are not compiled in, and the verifier skips them.
#[inline(never)]
extern "C" fn frame<const RT: u32>(_index: u64, ctx: *mut core::ffi::c_void) -> i64 {
    // SAFETY: `ctx` is the caller's `Walk`, whose pointers are map
    // values that outlive the walk.
    let (scratch, procs, tgid, own) = unsafe {
        let w = &*ctx.cast::<Walk>();
        (&mut *w.scratch, &*w.procs, w.tgid, w.own)
    };
    let mut record = true;
    if scratch.py.mode == crate::python::NOT_STARTED {
        crate::python::start(
            scratch,
            tgid,
            global(&CFI_OFFSETS).task_fsbase,
            RT & RUNTIME_PYTHON != 0,
        );
        crate::java::start(scratch, tgid, RT & RUNTIME_JAVA != 0);
        crate::v8::start(scratch, tgid, RT & RUNTIME_V8 != 0);
    }
    // A pc in a JVM's code cache: a Java frame, which has no CFI.
    if RT & RUNTIME_JAVA != 0 && crate::java::in_code(scratch) {
        scratch.jv.max_depth = max_depth();
        if scratch.walk.depth == 0 {
            scratch.jv.r13 = task_reg(global(&CFI_OFFSETS).r13);
        }
        scratch.tail.pairs = NO_TAIL;
        return java_step::<RT>(scratch, tgid);
    }
    // A pc in V8's code: a JavaScript frame if its slots say so, else V8's
    // own frame, walked as native code.
    if RT & RUNTIME_V8 != 0 {
        let code = crate::v8::code_at(scratch);
        if code != crate::v8::NOT_V8 {
            // V8's own frames, walked as native ones below, are no
            // tail's: the frame after them starts it.
            scratch.tail.pairs = HELD_TAIL;
            scratch.v8.max_depth = max_depth();
            if let Some(end) = v8_step::<RT>(scratch, tgid, code) {
                return end;
            }
        }
    }
    if RT & RUNTIME_PYTHON != 0 && scratch.py.on != 0 {
        match crate::python::at_frame(scratch, tgid) {
            crate::python::Next::Done => {
                return i64::from(crate::scratch::kept(&scratch.walk) >= max_depth());
            }
            crate::python::Next::Native { record: r } => record = r,
        }
        // Python frames still to write: what follows depends on them.
        if scratch.py.frame != 0 {
            scratch.tail.pairs = NO_TAIL;
        }
    }
    // The first native frame under a runtime's (not the sampled one,
    // whose pc is looked up as it is, and whose rules may read registers
    // the tail is not recalled by) starts a tail, recalled if the thread
    // kept it.
    if RT & RUNTIMES_ALL != 0
        && record
        && scratch.tail.pairs == NO_TAIL
        && scratch.walk.pairs != 0
        && scratch.py.native != 0
    {
        start_tail(scratch);
        if recall_tail(scratch, tgid) {
            return 1;
        }
    }
    if RT & RUNTIME_V8 != 0 && scratch.tail.pairs == HELD_TAIL {
        scratch.tail.pairs = NO_TAIL;
    }
    if record && !crate::scratch::push(scratch, scratch.walk.ip) {
        return 1;
    }
    let st = &mut scratch.walk;
    let chunk = &scratch.chunk;
    let tail = &mut scratch.tail;
    // The sampled frame is the walk's first native one: Python frames
    // may have been written before it.
    scratch.py.native += 1;
    // A return address is looked up at its call, one byte back.
    let back = u64::from(!sampled_frame(&scratch.py));
    let ip = st.ip;
    let known = region(procs, st, ip) || {
        if own != 0 {
            st.new_code = 1;
        }
        // Not remembered: the regions found are no part of its version.
        st.unremembered = 1;
        tail.ok = 0;
        found_region(tgid, st, ip)
    };
    let found = if known {
        let bias = st.last.bias;
        search_rows(&st.last.rows, ip.wrapping_sub(bias).wrapping_sub(back))
            .filter(|r| r.cfa != 0)
            .map(|r| (bias, r))
    } else {
        None
    };
    let Some((bias, r)) = found else {
        // No CFI here: the frame pointer, counted.
        if st.bp == 0 {
            tail.ended = 1;
            return 1;
        }
        count_error(ERR_FP_FRAMES);
        // Remembered, it would no longer be counted.
        st.unremembered = 1;
        tail.ok = 0;
        let bp = st.bp;
        let Some([bp, ret]) = stack_words::<2>(chunk, st, tail, bp) else {
            cut_short(st);
            return 1;
        };
        st.sp = st.bp + 16;
        st.bp = bp;
        st.ip = ret;
        return i64::from(ret == 0);
    };
    if r.cfa == CFA_RSP_RA_RDI {
        // rdi is known only in the sampled frame; a remembered walk is
        // recalled by ip, sp and bp, not rdi.
        if !sampled_frame(&scratch.py) {
            return 1;
        }
        st.unremembered = 1;
        tail.ok = 0;
        st.sp = st.sp.wrapping_add(r.cfa_offset as i64 as u64);
        st.ip = task_reg(global(&CFI_OFFSETS).di);
        return i64::from(st.ip == 0);
    }
    // After clone's system call: the parent's frame, or the child's
    // start on another stack (its rax, the call's value, is 0), which
    // ends the walk. No call returns here, so only a sampled frame is.
    let r = if r.cfa == CFA_RSP_IN_PARENT {
        if !sampled_frame(&scratch.py) || task_reg(global(&CFI_OFFSETS).ax) == 0 {
            return 1;
        }
        st.unremembered = 1;
        tail.ok = 0;
        CfiRule { cfa: CFA_RSP, ..r }
    } else {
        r
    };
    let cfa = match r.cfa {
        CFA_RSP => st.sp.wrapping_add(r.cfa_offset as i64 as u64),
        CFA_RBP => st.bp.wrapping_add(r.cfa_offset as i64 as u64),
        CFA_RBX => {
            // rbx is not among the registers a remembered walk is
            // recalled by.
            st.unremembered = 1;
            tail.ok = 0;
            st.bx.wrapping_add(r.cfa_offset as i64 as u64)
        }
        CFA_PLT => {
            let pc = ip.wrapping_sub(bias);
            st.sp
                + 8
                + if (pc & 15) >= r.cfa_offset as u64 {
                    8
                } else {
                    0
                }
        }
        CFA_END => {
            tail.ended = 1;
            return 1;
        }
        _ => return 1,
    };
    // The return address is at CFA - 8; rbp, where saved, is nearly
    // always just below it, and then one read fetches both.
    let ret = if r.rbp_slot == -2 {
        let Some([bp, ret]) = stack_words::<2>(chunk, st, tail, cfa.wrapping_sub(16)) else {
            cut_short(st);
            return 1;
        };
        st.bp = bp;
        ret
    } else {
        let Some([ret]) = stack_words::<1>(chunk, st, tail, cfa.wrapping_sub(8)) else {
            cut_short(st);
            return 1;
        };
        if r.rbp_slot != 0 {
            match stack_words::<1>(chunk, st, tail, saved_at(cfa, r.rbp_slot)) {
                Some([v]) => st.bp = v,
                None => {
                    cut_short(st);
                    return 1;
                }
            }
        }
        ret
    };
    // rbx is followed only as far as a frame needs it: ld.so's
    // trampolines are the only code that finds its frame from it.
    if r.rbx_slot != 0 {
        match stack_words::<1>(chunk, st, tail, saved_at(cfa, r.rbx_slot)) {
            Some([v]) => st.bx = v,
            None => {
                cut_short(st);
                return 1;
            }
        }
    }
    st.sp = cfa;
    st.ip = ret;
    if ret != 0 && crate::scratch::kept(st) >= max_depth() {
        // A caller beyond the last frame kept: the stack keeps its
        // leaf-most frames and is counted.
        count_error(ERR_DEEP);
    }
    if ret == 0 {
        tail.ended = 1;
    }
    i64::from(ret == 0)
}

/// Starts following a tail at the walk's registers.
#[inline(always)]
fn start_tail(s: &mut Scratch) {
    let t = &mut s.tail;
    t.pairs = s.walk.pairs;
    t.ok = 1;
    t.ended = 0;
    t.depth = s.walk.depth;
    t.nreads = 0;
    t.span = 0;
    t.words = WORDS_SEED;
    t.regs = [s.walk.ip, s.walk.sp, s.walk.bp];
}

/// Writes the thread's kept tail, if it is the one the walk has come to
/// (`start_tail` just started it): the same process and regions, the
/// same registers, the same words where it read them (the stack above
/// `sp` read again in one copy), and room for its frames under
/// `--max-stack`. Then the walk is done, and no longer its own to
/// remember or keep.
#[inline(always)]
fn recall_tail(s: &mut Scratch, tgid: u32) -> bool {
    let m = TAILS.get(crate::task_storage::current_task(), false);
    if m.is_null() {
        return false;
    }
    // SAFETY: the thread's value, which only its own walks write.
    let m = unsafe { &*m };
    let st = &s.walk;
    if !(m.tgid == tgid
        && m.n != 0
        && m.version == st.version
        && m.ip == st.ip
        && m.sp == st.sp
        && m.bp == st.bp
        && crate::scratch::kept(st).saturating_add(m.n) <= max_depth())
    {
        return false;
    }
    let span = m.span.min((TAIL_WORDS * 8) as u32);
    // The words are in the copy of the stack's top the walk took where
    // that holds them all (a runtime's frames above them took little of
    // it): hashed from there, with no read of the stack again.
    // Held as a flag and an index, both set on every path: an `Option`
    // left its index undefined where the copy does not hold the words,
    // which the verifier refuses to read.
    let at = chunk_index(st.chunk_base, st.chunk_len, m.sp, u64::from(span));
    let (in_chunk, first) = (at.is_some(), at.unwrap_or(0));
    if span != 0 && !in_chunk {
        let dst = s.tail_chunk.as_mut_ptr().cast::<core::ffi::c_void>();
        // SAFETY: `tail_chunk` has room for `TAIL_WORDS` words, and
        // `span` is at most that; the helper copes with any source.
        if unsafe { generated::bpf_probe_read_user(dst, span, m.sp as *const _) } != 0 {
            return false;
        }
    }
    let mut h = WORDS_SEED;
    for k in 0..TAIL_READS {
        if k as u32 >= m.nreads {
            break;
        }
        let i = usize::from(m.reads[k]);
        let w = if in_chunk {
            // Below `chunk_len` (checked above), masked for the verifier.
            s.chunk[first.wrapping_add(i) & (CHUNK_WORDS - 1)]
        } else {
            s.tail_chunk[i & (TAIL_WORDS - 1)]
        };
        h = mix(h, w);
    }
    if h != m.words {
        return false;
    }
    for k in 0..TAIL_FRAMES {
        if k as u32 >= m.n || !crate::scratch::push(s, m.frames[k]) {
            break;
        }
    }
    s.tail.ok = 0;
    // Its words are none of the remembered walk's.
    s.walk.unremembered = 1;
    count_error(ERR_TAIL_RECALLED);
    true
}

/// Keeps the walk's tail for the thread ([`TAILS`]), if the walk ended
/// in it, at the stack's end, with nothing in it that a recall would not
/// see again. Called once the stack is stored.
#[inline(always)]
pub(crate) fn keep_tail(s: *const Scratch, tgid: u32) {
    // SAFETY: a map value.
    let s = unsafe { &*s };
    let t = &s.tail;
    if t.ok == 0 || t.ended == 0 || t.pairs == NO_TAIL || t.pairs != s.walk.pairs {
        return;
    }
    let n = s.walk.depth.wrapping_sub(t.depth);
    if n == 0 || n as usize > TAIL_FRAMES {
        return;
    }
    let m = TAILS.get(crate::task_storage::current_task(), true);
    if m.is_null() {
        return;
    }
    // SAFETY: the thread's value.
    let m = unsafe { &mut *m };
    m.ip = t.regs[0];
    m.sp = t.regs[1];
    m.bp = t.regs[2];
    m.words = t.words;
    m.tgid = tgid;
    m.version = s.walk.version;
    m.nreads = t.nreads;
    m.span = t.span;
    // SAFETY: two map values' fields (a plain assignment would call
    // `memmove`).
    unsafe { crate::copy_value(&mut m.reads, &t.reads) };
    let mut kept = 0;
    for k in 0..TAIL_FRAMES {
        if k as u32 >= n {
            break;
        }
        let Some(&f) = s.frames.ips.get(t.depth as usize + k) else {
            break;
        };
        m.frames[k] = f;
        kept += 1;
    }
    m.n = kept;
}

/// Counts a sample of process `tgid` walked without its runtime's frames
/// though user space gave its runtime to the walk: the walk through them
/// (a wider `RT`) is being loaded.
#[inline(always)]
pub(crate) fn count_unloaded<const RT: u32>(tgid: u32) {
    if (RT & RUNTIME_PYTHON == 0 && crate::python::known(tgid))
        || (RT & RUNTIME_JAVA == 0 && crate::java::known(tgid))
        || (RT & RUNTIME_V8 == 0 && crate::v8::known(tgid))
    {
        count_error(ERR_RUNTIME_UNLOADED);
    }
}

/// Whether the step under way is of the sampled frame, the walk's first
/// native one. Read again where needed rather than kept: a value live
/// across the whole step takes a slot of the step's stack, which with its
/// callers' must stay within 512 bytes on kernels before 6.13.
#[inline(always)]
fn sampled_frame(py: &crate::scratch::PyWalk) -> bool {
    // SAFETY: a plain read of a field of a map value.
    unsafe { core::ptr::read_volatile(&py.native) == 1 }
}

/// Where a rule's saved register is: `slot` words from the CFA.
#[inline(always)]
fn saved_at(cfa: u64, slot: i8) -> u64 {
    cfa.wrapping_add((i64::from(slot) * 8) as u64)
}

/// A process that runs a new program has none of the regions user
/// space read before: they are dropped at once (its stacks go by frame
/// pointer, counted, until it has new ones). Without this, regions read
/// between a fork and its exec would be trusted for the new program's
/// code. User space is told to read them, for a new process too: on a
/// host where short-lived programs come and go, waiting for a first
/// stack would leave much of their short lives to the frame pointer.
#[inline(always)]
pub fn on_exec<C: EbpfContext, S: Sink>(ctx: &C, events: &S) {
    let id = bpf_get_current_pid_tgid();
    let tgid = (id >> 32) as u32;
    let _ = CFI_PROCS.remove(tgid);
    let _ = CFI_FOUND.remove(tgid);
    crate::python::forget(tgid);
    crate::java::forget(tgid);
    crate::v8::forget(tgid);
    // Its first stacks as the new program are told, for its symbols;
    // the exec before the mappings found, which it would clear.
    let _ = SEEN.remove(tgid);
    // Only in scope: in command mode (a cgroup, no ids) every exec on the
    // host would otherwise have user space read its maps and load its
    // files' tables.
    let born = born_seldom();
    if crate::targets::admits_current_anywhere() {
        crate::events::emit_now(events, ctx, &Seen::new(tgid, born, SEEN_EXEC));
    }
    // Only where its stacks are taken: every exec on the host would
    // otherwise cost two lookups and an entry.
    if crate::targets::admits_current() {
        prefill(ctx, events, tgid, born);
    }
}

/// Finds the regions of a new program's own code and of where it starts
/// (its interpreter's entry, else its own), before its first sample:
/// here, in task context, the kernel's lookup is never busy, while a
/// sample may look up one region a walk. Files user space has not loaded
/// yet are not found (its first run of a program it has not seen). The
/// records carry `born`, the process's start, read once by the caller.
#[inline(always)]
fn prefill<C: EbpfContext, S: Sink>(ctx: &C, events: &S, tgid: u32, born: u64) {
    let o = global(&CFI_OFFSETS);
    // SAFETY: the helper has no preconditions.
    let task = unsafe { bpf_get_current_task_btf() } as *const u8;
    let mm = crate::read_ptr(task, o.task_mm);
    let code = read_kernel::<u64>(mm, o.mm_start_code).unwrap_or(0);
    let mut first = Region::default();
    if code != 0
        && let Ok((r, mut found)) = find_region(tgid, code)
    {
        keep_found(tgid, &r);
        found.born = born;
        crate::events::emit(events, ctx, &found);
        first = r;
    }
    if let Some((ip, _, _, _)) = task_user_regs()
        && ip != 0
        && !(first.start <= ip && ip < first.end)
        && let Ok((r, mut found)) = find_region(tgid, ip)
    {
        keep_found(tgid, &r);
        found.born = born;
        crate::events::emit(events, ctx, &found);
    }
}

/// A new process runs its parent's code at the same addresses until it
/// runs a program of its own, so it gets a copy of its parent's regions
/// at once, and user space is told so that it forgets them when the
/// child exits. A shell's children otherwise spend their lives between
/// fork and exec without tables. New threads share their process's.
#[inline(always)]
pub fn on_fork<S: Sink>(ctx: &RawTracePointContext, events: &S) {
    let child: *const u8 = ctx.arg(1);
    let o = global(&CFI_OFFSETS);
    let (Ok(pid), Ok(tgid)) = (
        read_kernel::<u32>(child, o.task_pid),
        read_kernel::<u32>(child, o.task_tgid),
    ) else {
        return;
    };
    if pid != tgid {
        return;
    }
    let parent = (bpf_get_current_pid_tgid() >> 32) as u32;
    let Some(regions) = CFI_PROCS.get_ptr(parent) else {
        return;
    };
    // By reference: the helper copies the map value, which would not
    // fit on the eBPF stack.
    // SAFETY: a map value.
    #[allow(clippy::needless_borrows_for_generic_args)]
    let copied = CFI_PROCS.insert(tgid, unsafe { &*regions }, 0).is_ok();
    if copied {
        let seen = Seen {
            tgid,
            flags: SEEN_FORK,
            parent,
            _pad: 0,
            born: born_of(child),
            parent_born: born_seldom(),
        };
        crate::events::emit(events, ctx, &seen);
    }
}

/// A process whose stacks were taken is exiting (its main thread is): user
/// space is told at once, so that it reads what the process wrote as it
/// exited (a JIT's perf map, which Mono and the JVM write only then)
/// before its pid can be reused.
#[inline(always)]
pub fn on_exit<C: EbpfContext, S: Sink>(ctx: &C, events: &S) {
    let id = bpf_get_current_pid_tgid();
    let tgid = (id >> 32) as u32;
    if tgid != id as u32 {
        return;
    }
    let _ = CFI_FOUND.remove(tgid);
    crate::python::forget(tgid);
    crate::java::forget(tgid);
    crate::v8::forget(tgid);
    // SAFETY: only tested for presence.
    let sampled = unsafe { SEEN.get(tgid) }.is_some() || CFI_PROCS.get_ptr(tgid).is_some();
    // At once: the pid's next process may be a runtime that makes its
    // own map at that path as it starts (Mono does), and this one's must
    // be read before.
    // With the moment of its exit: a map at its path written by then is
    // not the pid's next process's, however soon that one starts.
    if sampled {
        let mut seen = Seen::new(tgid, born_seldom(), SEEN_EXIT);
        // SAFETY: a helper without arguments.
        seen.parent_born = unsafe { generated::bpf_ktime_get_boot_ns() };
        crate::events::emit_now(events, ctx, &seen);
    }
    // The pid's next process tells of its first stack in this generation
    // too, whether or not it runs a program of its own.
    let _ = SEEN.remove(tgid);
}

/// The dynamic loader has changed its list of a process's objects: at
/// a program's start, once before it maps the libraries and once after;
/// at each `dlopen` and `dlclose` (its `_dl_debug_state`, the hook
/// debuggers stop at). User space is woken at once to read the process's
/// regions, ahead of its first stacks through them: the kernel's own
/// lookup finds one mapping a sample, so a short-lived program's first
/// stack through its code, libbfd and libc would otherwise go by frame
/// pointer through one of the libraries.
#[inline(always)]
pub fn on_loaded<C: EbpfContext, S: Sink>(ctx: &C, events: &S) {
    if crate::targets::admits_current_anywhere() {
        let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
        crate::events::emit_now(events, ctx, &Seen::new(tgid, born_seldom(), SEEN_NEW_CODE));
    }
}

/// What a walk found.
pub(crate) enum Walked {
    /// The thread's remembered stack, stored in this generation: its hash.
    Known(u64),
    /// Frames walked into the scratch stack: how many, whether user space
    /// should read the process's regions again (it ran code in none of
    /// them; said at most every `NEW_CODE_EVERY_NS`), and where to
    /// remember the walk once its stack is stored, if it may be.
    Frames {
        depth: u64,
        tell: bool,
        /// Null for none: an `Option` of a raw pointer leaves the
        /// pointer undefined in `None`, which the compiler may spill and
        /// the verifier then rejects as an uninitialized register.
        memo: *mut Remembered,
        /// The walk ended on a stack word it could not read.
        cut: bool,
    },
}

/// Adds word `w` to hash `h`.
#[inline(always)]
fn mix(h: u64, w: u64) -> u64 {
    let h = (h ^ w).wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^ (h >> 32)
}

/// Where [`rehash`] works, through `bpf_loop`.
#[repr(C)]
struct Rehash {
    chunk: *const [u64; CHUNK_SLOTS],
    reads: *const [u8; MAX_READS],
    h: u64,
}

/// One word of a remembered walk, hashed again from the chunk. In a
/// `bpf_loop` callback, verified once, rather than a loop whose every
/// way out the verifier would follow through the rest of the program.
#[inline(never)]
extern "C" fn rehash(index: u64, ctx: *mut core::ffi::c_void) -> i64 {
    // SAFETY: `ctx` is the caller's `Rehash`, whose pointers are map
    // values that outlive the loop.
    let r = unsafe { &mut *ctx.cast::<Rehash>() };
    let (chunk, reads) = unsafe { (&*r.chunk, &*r.reads) };
    let Some(&i) = reads.get(index as usize) else {
        return 1;
    };
    r.h = mix(r.h, chunk.get(usize::from(i)).copied().unwrap_or(0));
    0
}

/// Whether `m` is this walk's: the same process, regions and registers,
/// the same words where it read them, its stack stored in this
/// generation.
#[inline(always)]
fn recalls(
    m: &Remembered,
    tgid: u32,
    st: &State,
    chunk: &[u64; CHUNK_SLOTS],
    generation: u32,
) -> bool {
    if !(m.tgid == tgid
        && m.depth != 0
        && m.version == st.version
        && m.generation == generation
        && m.ip == st.ip
        && m.sp == st.sp
        && m.bp == st.bp
        && u64::from(m.span) <= st.chunk_len)
    {
        return false;
    }
    let mut r = Rehash {
        chunk,
        reads: &m.reads,
        h: WORDS_SEED,
    };
    // SAFETY: `rehash` is a callback of bpf_loop's signature and `r`
    // lives across the call.
    unsafe {
        bpf_loop(
            m.nreads.min(MAX_READS as u32),
            rehash as *mut core::ffi::c_void,
            (&raw mut r).cast(),
            0,
        )
    };
    r.h == m.words
}

/// Where a walk's hash of the words it read starts.
const WORDS_SEED: u64 = 0x9e37_79b9_7f4a_7c15;

/// Remembers the walk in the scratch value, whose stack was stored as
/// `stack` in `generation`.
///
/// # Safety
/// `m` must be the current thread's [`WALKS`] value, `scratch` the
/// per-CPU scratch value the walk used.
#[inline(always)]
pub(crate) unsafe fn remember(
    m: *mut Remembered,
    scratch: *const Scratch,
    tgid: u32,
    stack: u64,
    generation: u32,
) {
    // SAFETY: per the contract.
    unsafe {
        let st = &(*scratch).walk;
        *m = Remembered {
            ip: st.start[0],
            sp: st.start[1],
            bp: st.start[2],
            words: st.words,
            stack,
            depth: u64::from(st.depth),
            version: st.version,
            generation,
            tgid,
            nreads: st.nreads,
            span: st.span,
            _pad: 0,
            reads: st.reads,
        };
    }
}

/// [`remember`] into the current thread's [`WALKS`] value, if it has
/// one: the walk was in task context, where [`walk`] created it.
#[inline(always)]
pub(crate) fn remember_current(scratch: *const Scratch, tgid: u32, stack: u64, generation: u32) {
    let m = WALKS.get(crate::task_storage::current_task(), false);
    if !m.is_null() {
        // SAFETY: `m` is the current thread's value; `scratch` the
        // per-CPU scratch value the walk used.
        unsafe { remember(m, scratch, tgid, stack, generation) };
    }
}

/// Walks the current task's user stack into the scratch value's stack
/// and returns its depth, and whether user space should read the
/// process's regions again (it ran code in none of them; said at most
/// every `NEW_CODE_EVERY_NS`). A process user space has given no
/// regions yet is walked from those the kernel finds itself. `None` only
/// if a map is missing (the caller then walks by frame pointer).
/// `regs` says where the user registers are ([`REGS_TASK`] and the
/// others).
///
/// A walk in task context ([`REGS_TASK`]: a switch or a wakeup, where
/// task storage may be created) is remembered for the thread, and its
/// next walk from the same registers over the same bytes is not done
/// again.
#[inline(always)]
pub(crate) fn walk<const RT: u32>(
    tgid: u32,
    regs: u64,
    scratch: *mut Scratch,
    generation: u32,
) -> Option<Walked> {
    let none = Walked::Frames {
        depth: 0,
        tell: false,
        memo: core::ptr::null_mut(),
        cut: false,
    };
    if regs == REGS_UNREAD {
        count_error(ERR_CUT_SHORT);
        return Some(Walked::Frames {
            depth: 0,
            tell: false,
            memo: core::ptr::null_mut(),
            cut: true,
        });
    }
    // The registers `stash_regs` left, each loaded where it is used: held
    // across the calls in between, each took a slot of this frame, which
    // with the step's must stay within 512 bytes on kernels before 6.13.
    // SAFETY: a map value.
    let reg = move |i: usize| unsafe { core::ptr::read_volatile(&(*scratch).regs[i & 3]) };
    // Kernel threads (and the idle tasks) have no user registers: no user
    // stack, no tables to miss, and no "new code" to tell user space of.
    if reg(0) == 0 {
        return Some(none);
    }
    // An exiting process's memory goes before its last samples: once
    // do_exit has let go of `task->mm`, only the registers it stopped
    // with are left, and none of its stack can be read.
    // SAFETY: the helper has no preconditions.
    let task = unsafe { bpf_get_current_task_btf() } as *const u8;
    let o = global(&CFI_OFFSETS);
    let mm = crate::read_ptr(task, o.task_mm);
    if mm.is_null() {
        count_error(ERR_EXITING);
        return Some(none);
    }
    // In `execve`, from the switch to the new memory map until the new
    // program's code is set up (`start_code`, set just before its first
    // registers; every running program has one), the registers are the
    // old program's and its stack is gone. (`fs->in_exec` is no sign:
    // this host's 6.18 clears it at that switch.)
    if read_kernel::<u64>(mm, o.mm_start_code).unwrap_or(1) == 0 {
        count_error(ERR_EXECING);
        return Some(none);
    }
    let (procs, own) = match CFI_PROCS.get_ptr_mut(tgid) {
        Some(p) => (p, 1),
        None => {
            count_error(ERR_NO_TABLES);
            (CFI_NO_PROCS.get_ptr_mut(0)?, 0)
        }
    };
    // SAFETY: map values.
    unsafe {
        // Written whole first, then the fields that are not constants,
        // each loaded just before: built whole, the struct's values were
        // held across the calls that zero its arrays, a slot each.
        (*scratch).walk = State {
            ip: 0,
            sp: 0,
            bp: 0,
            bx: 0,
            depth: 0,
            pairs: 0,
            new_code: 0,
            find_tried: 0,
            last: Region::default(),
            chunk_base: 0,
            chunk_len: 0,
            reads: [0; MAX_READS],
            nreads: 0,
            span: 0,
            words: WORDS_SEED,
            unremembered: 0,
            version: 0,
            start: [0; 3],
            found: Found::default(),
        };
        let w = &raw mut (*scratch).walk;
        (*w).chunk_len = copy_top(&mut (*scratch).chunk, reg(1));
        (*w).version = (*procs).version;
        (*w).ip = reg(0);
        (*w).sp = reg(1);
        (*w).bp = reg(2);
        (*w).bx = reg(3);
        (*w).chunk_base = reg(1);
        (*w).start = [reg(0), reg(1), reg(2)];
        for h in (*scratch).chunks.iter_mut() {
            *h = crate::scratch::HASH_SEED;
        }
    };
    let memo = if regs == REGS_TASK {
        WALKS.get(crate::task_storage::current_task(), true)
    } else {
        core::ptr::null_mut()
    };
    if !memo.is_null() {
        // SAFETY: `memo` is this thread's value; the scratch value is a
        // map value.
        unsafe {
            if recalls(
                &*memo,
                tgid,
                &(*scratch).walk,
                &(*scratch).chunk,
                generation,
            ) {
                return Some(Walked::Known((*memo).stack));
            }
        }
    }
    // The Python part starts in the first step (`frame`): a call here
    // would have its clobbered registers' values spilled, growing the
    // frame of every program that walks past what kernels before 6.13
    // allow with the step's (the off-CPU program's is at the bound).
    // SAFETY: a map value.
    unsafe {
        (*scratch).py.native = 0;
        (*scratch).py.mode = crate::python::NOT_STARTED;
        (*scratch).tail.pairs = NO_TAIL;
        (*scratch).tail.ok = 0;
    }
    let mut w = Walk {
        scratch,
        procs,
        tgid,
        own,
    };
    // SAFETY: `frame` is a callback of bpf_loop's signature and `w`
    // lives across the call.
    unsafe {
        bpf_loop(
            max_depth(),
            frame::<RT> as *mut core::ffi::c_void,
            (&raw mut w).cast(),
            0,
        )
    };
    // SAFETY: a map value.
    let st = unsafe { &(*scratch).walk };
    let memo = if st.unremembered == 0 && st.new_code == 0 && st.depth > 0 {
        memo
    } else {
        core::ptr::null_mut()
    };
    let mut tell = false;
    if st.new_code != 0 {
        // SAFETY: the helper has no preconditions; `procs` is a map
        // value (a lost race only tells user space twice).
        unsafe {
            let now = bpf_ktime_get_ns();
            if now.wrapping_sub((*procs).new_code_ns) > NEW_CODE_EVERY_NS {
                (*procs).new_code_ns = now;
                tell = true;
            }
        }
    }
    Some(Walked::Frames {
        depth: u64::from(st.depth),
        tell,
        memo,
        // A process user space has not given its tables yet is walked by
        // frame pointer, or by what the kernel found itself, and is often
        // cut short for that alone: counted (`ERR_NO_TABLES`), but no sign
        // of code the walk cannot follow, which is what the mark warns of.
        // (`w.own`, read from the frame it is in anyway: a local held
        // across the loop would take a slot more of it.)
        // SAFETY: `w` lives here; the loop has returned.
        cut: st.unremembered == crate::scratch::CUT
            && unsafe { core::ptr::read_volatile(&raw const w.own) } != 0,
    })
}

/// Most frames the CFI walk keeps of a stack (`--max-stack`), at most
/// `MAX_STACK`; read only, so the verifier knows it.
#[unsafe(no_mangle)]
static MAX_STACK_DEPTH: Global<u32> = Global::new(MAX_DEPTH as u32);

/// Most frames the CFI walk keeps of a stack: `--max-stack`, bounded
/// for the verifier.
#[inline(always)]
pub(crate) fn max_depth() -> u32 {
    (*global(&MAX_STACK_DEPTH)).min(MAX_STACK as u32)
}

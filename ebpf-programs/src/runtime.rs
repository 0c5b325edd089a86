//! What the runtimes' frame walks (`crate::python`, `crate::java`) share:
//! reading a runtime's structures from user memory into a buffer of
//! words, the fields of such a copy, and the per-CPU tables that say
//! whether a thing the walk met was told to user space already.

use aya_ebpf::{helpers::generated, maps::Array};
use rtrace_common::unwind::TOLD_SLOTS;

use crate::scratch::{CHUNK_SLOTS, chunk_index};

/// Reads `len` bytes (at most the buffer's) of the current task's user
/// memory at `addr` into `buf`.
#[inline(always)]
pub(crate) fn read_into<const N: usize>(buf: &mut [u64; N], addr: u64, len: usize) -> bool {
    let len = if len > N * 8 { N * 8 } else { len };
    // SAFETY: `buf` has room for `N * 8` bytes, `len` is at most that;
    // the helper copes with any address.
    unsafe {
        generated::bpf_probe_read_user(
            buf.as_mut_ptr().cast(),
            len as u32,
            addr as *const core::ffi::c_void,
        ) == 0
    }
}

/// The word at byte `off` of `buf` (rounded down to a word); `N` is a
/// power of two, so that the index is masked and the verifier bounds it.
#[inline(always)]
pub(crate) fn word<const N: usize>(buf: &[u64; N], off: u16) -> u64 {
    buf.get(usize::from(off / 8) % N).copied().unwrap_or(0)
}

/// Copies `W` words of the current task's user stack at `addr` into the
/// start of `buf`: from the copy of the stack's top the walk took at its
/// start (`Scratch::chunk`, `len` bytes from user address `base`) where
/// that holds them, else read. The task is stopped in its sample or its
/// switch, so the copy is its stack now; a copy between map values costs
/// a fraction of a read of user memory, which the frames near the top,
/// a runtime's most of all, would each take.
#[inline(always)]
pub(crate) fn stack_into<const W: usize, const N: usize>(
    buf: &mut [u64; N],
    chunk: &[u64; CHUNK_SLOTS],
    (base, len): (u64, u64),
    addr: u64,
) -> bool {
    if let Some(i) = chunk_index(base, len, addr, 8 * W as u64) {
        for k in 0..W {
            match (chunk.get(i + k), buf.get_mut(k)) {
                (Some(c), Some(b)) => *b = *c,
                _ => return false,
            }
        }
        return true;
    }
    read_into(buf, addr, W * 8)
}

/// `W` words of the current task's user stack at `addr`, as
/// [`stack_into`] gives them.
#[inline(always)]
pub(crate) fn stack_words<const W: usize>(
    chunk: &[u64; CHUNK_SLOTS],
    (base, len): (u64, u64),
    addr: u64,
) -> Option<[u64; W]> {
    if let Some(i) = chunk_index(base, len, addr, 8 * W as u64) {
        let mut out = [0u64; W];
        for (k, w) in out.iter_mut().enumerate() {
            *w = *chunk.get(i + k)?;
        }
        return Some(out);
    }
    crate::read_user::<[u64; W]>(addr)
}

/// The `u32` at byte `off` (a multiple of 4) of `buf`.
#[inline(always)]
pub(crate) fn half<const N: usize>(buf: &[u64; N], off: u16) -> u32 {
    (word(buf, off) >> ((off & 4) * 8)) as u32
}

/// The `u16` at byte `off` (a multiple of 2) of `buf`.
#[inline(always)]
pub(crate) fn quarter<const N: usize>(buf: &[u64; N], off: u16) -> u16 {
    (word(buf, off) >> ((off & 6) * 8)) as u16
}

/// The byte at `off` of `buf`.
#[inline(always)]
pub(crate) fn byte<const N: usize>(buf: &[u64; N], off: u16) -> u8 {
    (word(buf, off) >> ((off & 7) * 8)) as u8
}

/// A table of things told: [`TOLD_SLOTS`] slots for each CPU, in
/// one array that user space sizes (`rtrace_common::unwind::CPU_TABLES`).
pub(crate) type Told = Array<u64>;

/// A [`Told`] table, sized by user space.
pub(crate) const fn told_table() -> Told {
    Array::with_max_entries(1, 0)
}

/// The index of this CPU's slot `i` (masked to `slots`, a power of two)
/// of a table of `slots` for each CPU (`rtrace_common::unwind::CPU_TABLES`):
/// each CPU reads and writes its own alone, as it would a per-CPU map's.
#[inline(always)]
pub(crate) fn cpu_slot(slots: u32, i: u32) -> u32 {
    // SAFETY: a helper without arguments.
    let cpu = unsafe { generated::bpf_get_smp_processor_id() };
    cpu.wrapping_mul(slots) | (i & (slots - 1))
}

/// Whether the thing hashed to `h` is not in this CPU's slot of `table`:
/// [`newly_told`] without taking the slot.
#[inline(always)]
pub(crate) fn untold(table: &Told, h: u64) -> bool {
    table
        .get(cpu_slot(TOLD_SLOTS, (h >> 40) as u32))
        .is_some_and(|told| *told != h)
}

/// Whether the thing hashed to `h` is new to this CPU's slots of
/// `table` (without chains), which then hold it: one whose slot another
/// took is told again, which costs user space a lookup. Each CPU has
/// slots of its own, so that a thing is told on the CPU whose samples
/// name it, before them. (User space sizes every such table; one not
/// sized tells nothing.)
#[inline(always)]
pub(crate) fn newly_told(table: &Told, h: u64) -> bool {
    let Some(told) = table.get_ptr_mut(cpu_slot(TOLD_SLOTS, (h >> 40) as u32)) else {
        return false;
    };
    // SAFETY: a map value, written by this CPU alone.
    unsafe {
        if *told == h {
            return false;
        }
        *told = h;
    }
    true
}

/// The slot of a walk's queue of things to tell user space of (`CAP`
/// slots, `nnew` of them taken) for the thing hashed to `h`, if it is
/// new to this CPU ([`newly_told`]) and the queue has room; the slot is
/// then counted taken. The first new thing past a full queue sets
/// `nnew` to `CAP + 1`, which has the walk tell of its stack whole
/// (`UntoldStack`); it is looked at without taking its slot
/// ([`untold`]), so that a later walk tells it.
#[inline(always)]
pub(crate) fn queue_slot<const CAP: usize>(table: &Told, h: u64, nnew: &mut u32) -> Option<usize> {
    if *nnew as usize >= CAP {
        if *nnew as usize == CAP && untold(table, h) {
            *nnew += 1;
        }
        return None;
    }
    if !newly_told(table, h) {
        return None;
    }
    // Read back and masked, so that the verifier bounds the index however
    // the compiler checked it (6.1's lost the bound of a reloaded one).
    // SAFETY: a plain read of a value the caller holds.
    let i = unsafe { core::ptr::read_volatile(nnew) } as usize & (CAP - 1);
    *nnew += 1;
    Some(i)
}

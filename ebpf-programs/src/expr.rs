//! The interpreter of parsed probe specs, shared by the objects that run
//! them (argdist counts what they compute, trace sends it): an
//! expression's instructions run on a small stack, strings read into
//! buffers, filters tested, and the entries of return probes kept.
//! Nothing is compiled at run time; user space parses the specs into
//! `rtrace_common::argdist::Probe`s.

use aya_ebpf::{
    EbpfContext,
    helpers::{
        bpf_get_current_comm, bpf_get_current_task, bpf_get_current_uid_gid,
        bpf_get_smp_processor_id, bpf_ktime_get_ns, bpf_probe_read_kernel_str_bytes,
        bpf_probe_read_user, bpf_probe_read_user_str_bytes,
    },
    macros::map,
    maps::{HashMap, PerCpuArray},
    programs::ProbeContext,
};
use rtrace_common::argdist::{
    ARG_REGS, CMP_NE, Entry, I_BINARY, I_CAST, I_LOAD, I_PUSH, I_UNARY, INSN_SIGNED, INSN_USER,
    Insn, MAX_ARGS, MAX_INSNS, MAX_PROBES, MAX_STRINGS, MAX_VALUES, Probe, SRC_ARG, SRC_COMM,
    SRC_CONST, SRC_CPU, SRC_DATA_LOC, SRC_ENTRY_ARG, SRC_FIELD, SRC_GID, SRC_LATENCY, SRC_PID,
    SRC_REG, SRC_RET, SRC_TASK, SRC_TID, SRC_UID, STACK_DEPTH, STR_LEN, UN_NEG, UN_NOT, USER_TOP,
    VAL_SIGNED, VAL_STRING, VAL_USER, Value, binary, cut,
};

use crate::{count_error, read_kernel};

/// Entry times and arguments of calls in flight, by (slot << 32 | tid);
/// the tools that use it size it (argdist, trace). The objects of the
/// others link it unused: made with one entry, not 65536 allocated and
/// cleared at each start (1.5 ms).
#[map]
static ENTRIES: HashMap<u64, Entry> = HashMap::with_max_entries(1, 0);
/// Where a filter's string is read.
#[map]
static TEXT: PerCpuArray<[u8; STR_LEN]> = PerCpuArray::with_max_entries(1, 0);

/// Slot `slot`'s probe of `probes`, unless the current task is filtered
/// out (the scope's targets).
#[inline(always)]
pub fn admitted(probes: &'static [Probe; MAX_PROBES], slot: usize) -> Option<&'static Probe> {
    if !crate::targets::admits_current() {
        return None;
    }
    probes.get(slot)
}

/// Where values come from in one run of a program: pointers, not
/// copies, as the programs and the expression function share 512 bytes
/// of stack, and 6.1's verifier counts every frame.
pub struct Sources {
    /// The return value (return probes).
    pub ret: u64,
    /// The call's entry in `ENTRIES` (a return probe's), or null.
    pub entry: *const Entry,
    /// The tracepoint record, or null.
    pub record: *const u8,
    /// The saved registers of a probe (`struct pt_regs`), or null.
    pub regs: *const u8,
    /// `bpf_get_current_pid_tgid`.
    pub id: u64,
}

/// Reads `size` bytes at `p` as an unsigned number: from user memory if
/// `user` or if the address is a user one, else from kernel memory.
#[inline(always)]
fn read_sized(p: *const u8, size: u32, user: bool) -> u64 {
    if user || (p as u64) < USER_TOP {
        // SAFETY: the helper copes with any address.
        return unsafe {
            match size {
                1 => bpf_probe_read_user(p).map(|x: u8| u64::from(x)),
                2 => bpf_probe_read_user(p as *const u16).map(u64::from),
                4 => bpf_probe_read_user(p as *const u32).map(u64::from),
                _ => bpf_probe_read_user(p as *const u64),
            }
        }
        .unwrap_or(0);
    }
    match size {
        1 => read_kernel::<u8>(p, 0).map(u64::from),
        2 => read_kernel::<u16>(p, 0).map(u64::from),
        4 => read_kernel::<u32>(p, 0).map(u64::from),
        _ => read_kernel::<u64>(p, 0),
    }
    .unwrap_or(0)
}

/// What an `I_PUSH` pushes.
#[inline(always)]
fn source(i: &Insn, s: &Sources) -> u64 {
    // SAFETY: an ENTRIES value, removed only after the run.
    let entry = unsafe { s.entry.as_ref() };
    match i.source {
        SRC_CONST => i.imm,
        SRC_ARG => ARG_REGS
            .get(i.index as usize)
            .and_then(|&off| read_kernel::<u64>(s.regs, off).ok())
            .unwrap_or(0),
        SRC_RET => s.ret,
        SRC_ENTRY_ARG => entry.map_or(0, |e| e.args.get(i.index as usize).copied().unwrap_or(0)),
        SRC_LATENCY => entry.map_or(0, |e| {
            // SAFETY: the helper has no preconditions.
            unsafe { bpf_ktime_get_ns() }.saturating_sub(e.start_ns)
        }),
        SRC_REG => read_kernel::<u64>(s.regs, i.index).unwrap_or(0),
        SRC_PID => s.id >> 32,
        SRC_TID => s.id & 0xffff_ffff,
        SRC_FIELD => cut(
            field(s.record, i.index, i.size),
            i.size,
            i.flags & INSN_SIGNED != 0,
        ),
        SRC_UID => bpf_get_current_uid_gid() & 0xffff_ffff,
        SRC_GID => bpf_get_current_uid_gid() >> 32,
        // SAFETY: the helpers have no preconditions.
        SRC_CPU => u64::from(unsafe { bpf_get_smp_processor_id() }),
        SRC_TASK => unsafe { bpf_get_current_task() },
        _ => 0,
    }
}

/// A tracepoint record's field. The verifier allows plain loads from the
/// record only at offsets fixed in the instruction, so the usual offsets
/// and sizes get a load of their own (the configuration is read-only, and
/// the verifier follows only the arm it names); the rest go through the
/// helper, a call that costs several times a load.
#[inline(always)]
fn field(record: *const u8, offset: u32, size: u32) -> u64 {
    macro_rules! fixed {
        ($($at:literal)*) => {
            match (offset, size) {
                // SAFETY: the verifier allows only loads inside the record.
                $(($at, 8) => return unsafe { core::ptr::read_volatile(record.add($at) as *const u64) },
                  ($at, 4) => return u64::from(unsafe { core::ptr::read_volatile(record.add($at) as *const u32) }),)*
                _ => {}
            }
        };
    }
    fixed!(8 16 24 32 40 48 56 64);
    read_sized(record.wrapping_add(offset as usize), size, false)
}

/// Runs a value's expression on a stack of `STACK_DEPTH`; user space
/// checks the depth, and the masks keep the verifier sure of it. Not
/// inlined: one copy serves every value of a program.
#[inline(never)]
pub fn eval(v: &Value, s: &Sources) -> u64 {
    const MASK: usize = STACK_DEPTH - 1;
    let mut stack = [0u64; STACK_DEPTH];
    let mut sp: usize = 0;
    for n in 0..MAX_INSNS {
        if n as u32 >= v.n_insns {
            break;
        }
        let i = &v.insns[n];
        let signed = i.flags & INSN_SIGNED != 0;
        match i.code {
            I_PUSH => {
                stack[sp & MASK] = source(i, s);
                sp += 1;
            }
            I_BINARY if sp >= 2 => {
                let y = stack[(sp - 1) & MASK];
                let x = stack[(sp - 2) & MASK];
                stack[(sp - 2) & MASK] = binary(i.op, signed, x, y);
                sp -= 1;
            }
            I_UNARY if sp >= 1 => {
                let x = stack[(sp - 1) & MASK];
                stack[(sp - 1) & MASK] = match i.op {
                    UN_NEG => x.wrapping_neg(),
                    UN_NOT => !x,
                    _ => u64::from(x == 0),
                };
            }
            I_LOAD if sp >= 1 => {
                let at = stack[(sp - 1) & MASK].wrapping_add(i.imm) as *const u8;
                let x = read_sized(at, i.size, i.flags & INSN_USER != 0);
                stack[(sp - 1) & MASK] = cut(x, i.size, signed);
            }
            I_CAST if sp >= 1 => {
                stack[(sp - 1) & MASK] = cut(stack[(sp - 1) & MASK], i.size, signed);
            }
            _ => return 0,
        }
    }
    if sp == 0 { 0 } else { stack[(sp - 1) & MASK] }
}

/// A numeric value, cut to its type's size.
#[inline(always)]
pub fn number(v: &Value, s: &Sources) -> u64 {
    cut(eval(v, s), v.size, v.flags & VAL_SIGNED != 0)
}

/// A string value into `buf`, NUL-padded, cut to `len` bytes with its NUL.
#[inline(always)]
pub fn string(v: &Value, s: &Sources, len: u32, buf: &mut [u8; STR_LEN]) {
    *buf = [0; STR_LEN];
    match v.source {
        SRC_COMM => {
            let comm = bpf_get_current_comm().unwrap_or([0; 16]);
            buf[..16].copy_from_slice(&comm);
        }
        src => {
            let p = if src == SRC_DATA_LOC {
                let loc = read_sized(s.record.wrapping_add(v.index as usize), 4, false);
                s.record.wrapping_add((loc & 0xffff) as usize)
            } else {
                eval(v, s) as *const u8
            };
            if !p.is_null() {
                // SAFETY: the helpers cope with any address.
                let _ = if v.flags & VAL_USER != 0 || (p as u64) < USER_TOP {
                    unsafe { bpf_probe_read_user_str_bytes(p, buf) }
                } else {
                    unsafe { bpf_probe_read_kernel_str_bytes(p, buf) }
                };
            }
        }
    }
    // `len` bytes hold `len - 1` characters and the NUL, as in bcc.
    for (i, b) in buf.iter_mut().enumerate() {
        if i as u32 + 1 >= len {
            *b = 0;
        }
    }
}

/// The probe's values into `values` by position and its strings into
/// `strings` by their slots (a string's position in `values` is 0).
#[inline(always)]
pub fn values(
    p: &Probe,
    s: &Sources,
    values: &mut [u64; MAX_VALUES],
    strings: &mut [[u8; STR_LEN]; MAX_STRINGS],
) {
    for (i, v) in p.values.iter().enumerate() {
        if i >= MAX_VALUES || i as u32 >= p.n_values {
            break;
        }
        if v.flags & VAL_STRING != 0 {
            values[i] = 0;
            let buf = if v.str_slot == 0 {
                &mut strings[0]
            } else {
                &mut strings[1]
            };
            string(v, s, p.str_len, buf);
        } else {
            values[i] = number(v, s);
        }
    }
}

/// Whether the probe's filter lets this run through: comparisons joined
/// by `&&`, groups of them by `||`.
#[inline(always)]
pub fn passes(p: &Probe, s: &Sources) -> bool {
    if p.n_conds == 0 {
        return true;
    }
    let mut any = false;
    let mut group = true;
    for (i, c) in p.conds.iter().enumerate() {
        if i as u32 >= p.n_conds {
            break;
        }
        let ok = if c.value.flags & VAL_STRING != 0 {
            let Some(t) = TEXT.get_ptr_mut(0) else {
                return false;
            };
            // SAFETY: this CPU's scratch buffer.
            let t = unsafe { &mut *t };
            string(&c.value, s, p.str_len, t);
            let same = t.iter().zip(c.text.iter()).all(|(a, b)| a == b);
            if c.cmp == CMP_NE { !same } else { same }
        } else {
            number(&c.value, s) != 0
        };
        group &= ok;
        if c.or_next != 0 || i as u32 + 1 >= p.n_conds {
            any |= group;
            group = true;
        }
    }
    any
}

/// The register arguments of a probe context.
#[inline(always)]
fn args(ctx: &ProbeContext) -> [u64; MAX_ARGS] {
    let mut a = [0; MAX_ARGS];
    for (i, slot) in a.iter_mut().enumerate() {
        *slot = ctx.arg(i).unwrap_or(0);
    }
    a
}

/// The key of slot `slot`'s call in flight on the current thread.
#[inline(always)]
fn entry_key(slot: usize, id: u64) -> u64 {
    (slot as u64) << 32 | (id & 0xffff_ffff)
}

/// Keeps the entry time and arguments of slot `slot`'s call, for its
/// return probe; a full table counts `full_error`.
#[inline(always)]
pub fn enter(ctx: &ProbeContext, slot: usize, id: u64, full_error: u32) {
    let entry = Entry {
        // SAFETY: the helper has no preconditions.
        start_ns: unsafe { bpf_ktime_get_ns() },
        args: args(ctx),
    };
    if ENTRIES.insert(entry_key(slot, id), entry, 0).is_err() {
        count_error(full_error);
    }
}

/// The sources of a probe's entry run.
#[inline(always)]
pub fn at_entry<C: EbpfContext>(ctx: &C, id: u64) -> Sources {
    Sources {
        ret: 0,
        entry: core::ptr::null(),
        record: core::ptr::null(),
        regs: ctx.as_ptr() as *const u8,
        id,
    }
}

/// The sources of a tracepoint's run.
#[inline(always)]
pub fn at_tracepoint<C: EbpfContext>(ctx: &C, id: u64) -> Sources {
    Sources {
        ret: 0,
        entry: core::ptr::null(),
        record: ctx.as_ptr() as *const u8,
        regs: core::ptr::null(),
        id,
    }
}

/// The sources of a return probe's run of slot `slot`, with its entry
/// when the probe needs it; `None` for a call that began before tracing
/// did, which has none (skipped rather than given a made-up latency).
#[inline(always)]
pub fn at_return<C: EbpfContext>(
    ctx: &C,
    ret: u64,
    p: &Probe,
    slot: usize,
    id: u64,
) -> Option<Sources> {
    let entry = if p.need_entry != 0 {
        ENTRIES.get_ptr(entry_key(slot, id))?
    } else {
        core::ptr::null()
    };
    Some(Sources {
        ret,
        entry,
        record: core::ptr::null(),
        regs: ctx.as_ptr() as *const u8,
        id,
    })
}

/// Forgets the entry of a return probe's run, once it is done with.
#[inline(always)]
pub fn leave(s: &Sources, slot: usize) {
    if !s.entry.is_null() {
        let _ = ENTRIES.remove(entry_key(slot, s.id));
    }
}

/// Defines the five programs of each of the `MAX_PROBES` slots, named
/// `kprobe_N`, `kretprobe_N`, `uprobe_N`, `uretprobe_N` and
/// `tracepoint_N`, calling the object's `on_entry(&ProbeContext, slot)`,
/// `on_return(&RetProbeContext, slot)` and `on_tracepoint(&TracePointContext,
/// slot)`. User space attaches the ones a spec needs (a return spec with
/// `$entry` or `$latency` uses both of a pair).
#[macro_export]
macro_rules! spec_programs {
    () => {
        $crate::spec_programs!(@slot 0 kprobe_0 kretprobe_0 uprobe_0 uretprobe_0 tracepoint_0);
        $crate::spec_programs!(@slot 1 kprobe_1 kretprobe_1 uprobe_1 uretprobe_1 tracepoint_1);
        $crate::spec_programs!(@slot 2 kprobe_2 kretprobe_2 uprobe_2 uretprobe_2 tracepoint_2);
        $crate::spec_programs!(@slot 3 kprobe_3 kretprobe_3 uprobe_3 uretprobe_3 tracepoint_3);
        $crate::spec_programs!(@slot 4 kprobe_4 kretprobe_4 uprobe_4 uretprobe_4 tracepoint_4);
        $crate::spec_programs!(@slot 5 kprobe_5 kretprobe_5 uprobe_5 uretprobe_5 tracepoint_5);
        $crate::spec_programs!(@slot 6 kprobe_6 kretprobe_6 uprobe_6 uretprobe_6 tracepoint_6);
        $crate::spec_programs!(@slot 7 kprobe_7 kretprobe_7 uprobe_7 uretprobe_7 tracepoint_7);
    };
    (@slot $i:literal $kp:ident $kr:ident $up:ident $ur:ident $tp:ident) => {
        #[aya_ebpf::macros::kprobe]
        pub fn $kp(ctx: aya_ebpf::programs::ProbeContext) -> u32 {
            on_entry(&ctx, $i);
            0
        }
        #[aya_ebpf::macros::kretprobe]
        pub fn $kr(ctx: aya_ebpf::programs::RetProbeContext) -> u32 {
            on_return(&ctx, $i);
            0
        }
        #[aya_ebpf::macros::uprobe]
        pub fn $up(ctx: aya_ebpf::programs::ProbeContext) -> u32 {
            on_entry(&ctx, $i);
            0
        }
        #[aya_ebpf::macros::uretprobe]
        pub fn $ur(ctx: aya_ebpf::programs::RetProbeContext) -> u32 {
            on_return(&ctx, $i);
            0
        }
        $crate::tracepoint! {
            fn $tp(ctx) {
                on_tracepoint(&ctx, $i);
            }
        }
    };
}

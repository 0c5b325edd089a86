//! Types of `rtrace argdist`: the parsed probe specs, as the one generic
//! program reads them. Nothing is compiled at run time; user space turns
//! each spec into a [`Probe`] and the program interprets it.

/// Probes one run may have (`-H` and `-C` together).
pub const MAX_PROBES: usize = 8;
/// Values one probe's key may have (`-C`); `-H` has one.
pub const MAX_VALUES: usize = 4;
/// String values one key may have.
pub const MAX_STRINGS: usize = 2;
/// Comparisons one filter may have.
pub const MAX_CONDS: usize = 4;
/// Bytes kept of a string, NUL included: `-z`'s limit (bcc's examples
/// use 120).
pub const STR_LEN: usize = 128;
/// Register arguments kept at entry for `$entry(param)`.
pub const MAX_ARGS: usize = 6;

/// Offsets of x86-64's registers in the saved `struct pt_regs`, which
/// probes read arguments from: USDT notes name any of them.
pub mod regs {
    /// r15.
    pub const R15: u32 = 0;
    /// r14.
    pub const R14: u32 = 8;
    /// r13.
    pub const R13: u32 = 16;
    /// r12.
    pub const R12: u32 = 24;
    /// rbp.
    pub const BP: u32 = 32;
    /// rbx.
    pub const BX: u32 = 40;
    /// r11.
    pub const R11: u32 = 48;
    /// r10.
    pub const R10: u32 = 56;
    /// r9.
    pub const R9: u32 = 64;
    /// r8.
    pub const R8: u32 = 72;
    /// rax.
    pub const AX: u32 = 80;
    /// rcx.
    pub const CX: u32 = 88;
    /// rdx.
    pub const DX: u32 = 96;
    /// rsi.
    pub const SI: u32 = 104;
    /// rdi.
    pub const DI: u32 = 112;
    /// rip.
    pub const IP: u32 = 128;
    /// rsp.
    pub const SP: u32 = 152;
}

/// Where the x86-64 calling convention passes the first six arguments.
pub const ARG_REGS: [u32; MAX_ARGS] = [regs::DI, regs::SI, regs::DX, regs::CX, regs::R8, regs::R9];

/// `Probe::kind`: runs at function entry.
pub const KIND_ENTRY: u32 = 0;
/// `Probe::kind`: runs at return; the entry program only records the
/// arguments and the time for `$entry` and `$latency`.
pub const KIND_RETURN: u32 = 1;
/// `Probe::kind`: a tracepoint.
pub const KIND_TRACEPOINT: u32 = 2;
/// `Probe::kind`: a USDT probe, run as a uprobe at each of its sites.
pub const KIND_USDT: u32 = 3;

/// `Probe::mode`: a log2 histogram of one value.
pub const MODE_HIST: u32 = 0;
/// `Probe::mode`: counts per distinct key.
pub const MODE_COUNT: u32 = 1;

/// Instructions one value's expression may have.
pub const MAX_INSNS: usize = 12;
/// Values the evaluation stack holds (a power of two: indices are masked).
pub const STACK_DEPTH: usize = 4;

/// `Insn::source` and `Value::source`: the constant in `imm`.
pub const SRC_CONST: u8 = 0;
/// `Insn::source`: register argument `index`.
pub const SRC_ARG: u8 = 1;
/// `Insn::source`: the return value.
pub const SRC_RET: u8 = 2;
/// `Insn::source`: register argument `index` as it was at entry.
pub const SRC_ENTRY_ARG: u8 = 3;
/// `Insn::source`: nanoseconds since entry.
pub const SRC_LATENCY: u8 = 4;
/// `Insn::source`: the process id.
pub const SRC_PID: u8 = 5;
/// `Insn::source`: the thread id.
pub const SRC_TID: u8 = 6;
/// `Value::source`: the command (a string).
pub const SRC_COMM: u8 = 7;
/// `Insn::source`: the tracepoint record's field at offset `index`, of
/// `size` bytes.
pub const SRC_FIELD: u8 = 8;
/// `Value::source`: the string a `__data_loc` field at offset `index`
/// points to inside the record.
pub const SRC_DATA_LOC: u8 = 9;
/// `Value::source`: the value of the expression in `insns` (a number, or
/// the address of a string).
pub const SRC_EXPR: u8 = 10;

/// `Insn::source`: the saved user register at offset `index` of
/// `struct pt_regs` (a USDT argument).
pub const SRC_REG: u8 = 11;
/// `Insn::source`: the user id (bcc trace's `$uid`).
pub const SRC_UID: u8 = 12;
/// `Insn::source`: the group id (`$gid`).
pub const SRC_GID: u8 = 13;
/// `Insn::source`: the CPU (`$cpu`).
pub const SRC_CPU: u8 = 14;
/// `Insn::source`: the current `task_struct`'s address (`$task`).
pub const SRC_TASK: u8 = 15;

/// Addresses below this are user memory on x86-64 (the canonical lower
/// half): a read through a pointer picks its helper by the address, so a
/// kernel function's `const char __user *` reads as a string without
/// being marked.
pub const USER_TOP: u64 = 1 << 47;

/// `Insn::code`: pushes source `source`.
pub const I_PUSH: u8 = 0;
/// `Insn::code`: replaces the two topmost values by `op` of them.
pub const I_BINARY: u8 = 1;
/// `Insn::code`: replaces the topmost value by `op` of it (`UN_*`).
pub const I_UNARY: u8 = 2;
/// `Insn::code`: replaces the topmost value, an address, by the `size`
/// bytes at it plus `imm` (kernel memory, or user memory with
/// `INSN_USER`).
pub const I_LOAD: u8 = 3;
/// `Insn::code`: cuts the topmost value to `size` bytes, sign-extending
/// with `INSN_SIGNED`.
pub const I_CAST: u8 = 4;

/// `Insn::flags`: signed division, remainder, shift right and comparison;
/// sign extension for `I_CAST` and `I_LOAD`.
pub const INSN_SIGNED: u8 = 1;
/// `Insn::flags`: `I_LOAD` reads user memory.
pub const INSN_USER: u8 = 2;

/// `Insn::op` of `I_BINARY`: add.
pub const OP_ADD: u8 = 1;
/// `Insn::op`: subtract.
pub const OP_SUB: u8 = 2;
/// `Insn::op`: multiply.
pub const OP_MUL: u8 = 3;
/// `Insn::op`: divide (by zero gives zero, as in BPF).
pub const OP_DIV: u8 = 4;
/// `Insn::op`: shift right (arithmetic with `INSN_SIGNED`).
pub const OP_SHR: u8 = 5;
/// `Insn::op`: shift left.
pub const OP_SHL: u8 = 6;
/// `Insn::op`: bitwise and.
pub const OP_AND: u8 = 7;
/// `Insn::op`: bitwise or.
pub const OP_OR: u8 = 8;
/// `Insn::op`: bitwise exclusive or.
pub const OP_XOR: u8 = 9;
/// `Insn::op`: remainder (by zero gives the dividend, as in BPF).
pub const OP_MOD: u8 = 10;
/// `Insn::op`: 1 if equal, else 0.
pub const OP_EQ: u8 = 11;
/// `Insn::op`: 1 if not equal.
pub const OP_NE: u8 = 12;
/// `Insn::op`: 1 if less.
pub const OP_LT: u8 = 13;
/// `Insn::op`: 1 if less or equal.
pub const OP_LE: u8 = 14;
/// `Insn::op`: 1 if greater.
pub const OP_GT: u8 = 15;
/// `Insn::op`: 1 if greater or equal.
pub const OP_GE: u8 = 16;
/// `Insn::op`: 1 if both are nonzero.
pub const OP_LAND: u8 = 17;
/// `Insn::op`: 1 if either is nonzero.
pub const OP_LOR: u8 = 18;

/// `Insn::op` of `I_UNARY`: negate.
pub const UN_NEG: u8 = 0;
/// `Insn::op`: bitwise not.
pub const UN_NOT: u8 = 1;
/// `Insn::op`: 1 if zero, else 0.
pub const UN_LNOT: u8 = 2;

/// `Value::flags`: sign-extend from `size` bytes.
pub const VAL_SIGNED: u32 = 1;
/// `Value::flags`: the value is a string, kept in the key's string slot
/// `str_slot`.
pub const VAL_STRING: u32 = 2;
/// `Value::flags`: the string is in user memory.
pub const VAL_USER: u32 = 4;

/// `Cond::cmp`: the string equals the text.
pub const CMP_EQ: u32 = 0;
/// `Cond::cmp`: the string differs from the text.
pub const CMP_NE: u32 = 1;

/// `ERRORS` slot: the count table was full.
pub const ERR_COUNTS_FULL: u32 = 0;
/// `ERRORS` slot: the table of calls in flight was full, so a return had
/// no entry to match.
pub const ERR_ENTRIES_FULL: u32 = 1;
/// What each `ERRORS` slot counts, for the report at exit.
pub const ERR_NAMES: [&str; 2] = [
    "events lost: the count table was full (raise --table-size)",
    "returns uncounted: the table of calls in flight was full",
];

/// One step of an expression, run on a small stack.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Insn {
    /// `I_*`.
    pub code: u8,
    /// `SRC_*` for `I_PUSH`.
    pub source: u8,
    /// `OP_*` or `UN_*`.
    pub op: u8,
    /// `INSN_*` bits.
    pub flags: u8,
    /// Bytes read or kept (1, 2, 4 or 8).
    pub size: u32,
    /// Argument number, or record offset.
    pub index: u32,
    /// Keeps `imm` aligned.
    pub _pad: u32,
    /// The constant, or the offset `I_LOAD` adds to its address.
    pub imm: u64,
}

/// How to compute one value.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Value {
    /// `SRC_EXPR`, `SRC_COMM` or `SRC_DATA_LOC`.
    pub source: u8,
    /// Keeps the rest aligned.
    pub _pad: [u8; 3],
    /// The `__data_loc` field's record offset.
    pub index: u32,
    /// Bytes the type has (1, 2, 4 or 8): the value is cut to them.
    pub size: u32,
    /// `VAL_*` bits.
    pub flags: u32,
    /// The key's string slot, for strings.
    pub str_slot: u32,
    /// Instructions in `insns`.
    pub n_insns: u32,
    /// The expression.
    pub insns: [Insn; MAX_INSNS],
}

/// One term of a filter: a number that must be nonzero, or a string
/// compared with a text.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Cond {
    /// The value: a truth value, or a string.
    pub value: Value,
    /// `CMP_*`, for strings.
    pub cmp: u32,
    /// Whether the next term is joined by `||` (else `&&`, which binds
    /// tighter).
    pub or_next: u32,
    /// The text a string compares with, NUL-padded.
    pub text: [u8; STR_LEN],
}

/// One parsed spec.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Probe {
    /// `KIND_*`.
    pub kind: u32,
    /// `MODE_*`.
    pub mode: u32,
    /// Values in `values`.
    pub n_values: u32,
    /// Comparisons in `conds`.
    pub n_conds: u32,
    /// Whether a return probe needs its entry (`$entry`, `$latency`).
    pub need_entry: u32,
    /// Bytes kept of strings (`-z`), at most `STR_LEN`.
    pub str_len: u32,
    /// String values in `values`: without any, keys go to the smaller
    /// `COUNTS_NUM`, which hashes a fifth of the bytes.
    pub n_strings: u32,
    /// Keeps `values` aligned.
    pub _pad: u32,
    /// The key's values.
    pub values: [Value; MAX_VALUES],
    /// The filter.
    pub conds: [Cond; MAX_CONDS],
}

/// Load-time configuration, passed as the global `CONFIG`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// The probes, by slot: slot `i` runs the programs ending in `_i`.
    pub probes: [Probe; MAX_PROBES],
}

/// A count table key: the probe's slot and its values.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    /// The probe's slot.
    pub probe: u32,
    /// Keeps `values` aligned.
    pub _pad: u32,
    /// Numeric values, or 0 where the value is a string.
    pub values: [u64; MAX_VALUES],
    /// String values, NUL-padded.
    pub strings: [[u8; STR_LEN]; MAX_STRINGS],
}

/// A count table key of a probe with no string values (`COUNTS_NUM`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NumKey {
    /// The probe's slot.
    pub probe: u32,
    /// Keeps `values` aligned.
    pub _pad: u32,
    /// The values.
    pub values: [u64; MAX_VALUES],
}

/// What the entry program keeps for a return probe.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Entry {
    /// `bpf_ktime_get_ns` at entry.
    pub start_ns: u64,
    /// The register arguments.
    pub args: [u64; MAX_ARGS],
}

/// `x` cut to `size` bytes, sign-extended if `signed`, as the program's
/// casts and loads do; user space folds constant casts with it too.
#[inline(always)]
pub fn cut(x: u64, size: u32, signed: bool) -> u64 {
    let shift = 64u32.saturating_sub(size * 8);
    if shift == 0 || shift >= 64 {
        return x;
    }
    if signed {
        (((x << shift) as i64) >> shift) as u64
    } else {
        (x << shift) >> shift
    }
}

/// `x op y` as the program computes it; user space folds constants with
/// it too. Division and remainder by zero give what BPF gives.
#[inline(always)]
pub fn binary(op: u8, signed: bool, x: u64, y: u64) -> u64 {
    let (a, b) = (x as i64, y as i64);
    match op {
        OP_ADD => x.wrapping_add(y),
        OP_SUB => x.wrapping_sub(y),
        OP_MUL => x.wrapping_mul(y),
        OP_DIV | OP_MOD => {
            if y == 0 {
                return if op == OP_DIV { 0 } else { x };
            }
            if signed {
                // BPF has no signed division before v4 of the ISA.
                let (ua, ub) = (a.unsigned_abs(), b.unsigned_abs());
                if op == OP_DIV {
                    let q = ua / ub;
                    if (a < 0) != (b < 0) {
                        q.wrapping_neg()
                    } else {
                        q
                    }
                } else {
                    let r = ua % ub;
                    if a < 0 { r.wrapping_neg() } else { r }
                }
            } else if op == OP_DIV {
                x / y
            } else {
                x % y
            }
        }
        OP_SHR => {
            if signed {
                (a >> (y & 63)) as u64
            } else {
                x >> (y & 63)
            }
        }
        OP_SHL => x << (y & 63),
        OP_AND => x & y,
        OP_OR => x | y,
        OP_XOR => x ^ y,
        OP_EQ => u64::from(x == y),
        OP_NE => u64::from(x != y),
        OP_LT => u64::from(if signed { a < b } else { x < y }),
        OP_LE => u64::from(if signed { a <= b } else { x <= y }),
        OP_GT => u64::from(if signed { a > b } else { x > y }),
        OP_GE => u64::from(if signed { a >= b } else { x >= y }),
        OP_LAND => u64::from(x != 0 && y != 0),
        OP_LOR => u64::from(x != 0 || y != 0),
        _ => 0,
    }
}

crate::pod!(Insn, Value, Cond, Probe, Config, Key, NumKey, Entry);

/// Frequency counts by [`Key`]; user space sizes it.
pub const COUNTS: &str = "COUNTS";
/// Frequency counts of probes with no string values, per CPU by their
/// smaller [`NumKey`]; user space sizes it.
pub const COUNTS_NUM: &str = "COUNTS_NUM";
/// Histograms by probe slot, per CPU.
pub const HISTS: &str = "HISTS";
/// Entry times and arguments ([`Entry`]) of calls in flight, by
/// `slot << 32 | tid`, in argdist's object and trace's; user space sizes
/// it.
pub const ENTRIES: &str = "ENTRIES";

/// Probe slot `N`'s kprobe is the program `kprobe_N`, in argdist's object
/// and trace's (`spec_programs!`), for slots below [`MAX_PROBES`].
pub const KPROBE_PROGRAMS: &str = "kprobe";
/// Probe slot `N`'s kretprobe: `kretprobe_N`.
pub const KRETPROBE_PROGRAMS: &str = "kretprobe";
/// Probe slot `N`'s uprobe (also its USDT probe): `uprobe_N`.
pub const UPROBE_PROGRAMS: &str = "uprobe";
/// Probe slot `N`'s uretprobe: `uretprobe_N`.
pub const URETPROBE_PROGRAMS: &str = "uretprobe";
/// Probe slot `N`'s tracepoint program: `tracepoint_N`.
pub const TRACEPOINT_PROGRAMS: &str = "tracepoint";

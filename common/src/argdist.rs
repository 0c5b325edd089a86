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
/// Bytes kept of a string, NUL included: `-z`'s limit.
pub const STR_LEN: usize = 80;
/// Register arguments kept at entry for `$entry(param)`.
pub const MAX_ARGS: usize = 6;

/// `Probe::kind`: runs at function entry.
pub const KIND_ENTRY: u32 = 0;
/// `Probe::kind`: runs at return; the entry program only records the
/// arguments and the time for `$entry` and `$latency`.
pub const KIND_RETURN: u32 = 1;
/// `Probe::kind`: a tracepoint.
pub const KIND_TRACEPOINT: u32 = 2;

/// `Probe::mode`: a log2 histogram of one value.
pub const MODE_HIST: u32 = 0;
/// `Probe::mode`: counts per distinct key.
pub const MODE_COUNT: u32 = 1;

/// `Value::source`: the constant in `imm`.
pub const SRC_CONST: u32 = 0;
/// `Value::source`: register argument `index`.
pub const SRC_ARG: u32 = 1;
/// `Value::source`: the return value.
pub const SRC_RET: u32 = 2;
/// `Value::source`: register argument `index` as it was at entry.
pub const SRC_ENTRY_ARG: u32 = 3;
/// `Value::source`: nanoseconds since entry.
pub const SRC_LATENCY: u32 = 4;
/// `Value::source`: the process id.
pub const SRC_PID: u32 = 5;
/// `Value::source`: the thread id.
pub const SRC_TID: u32 = 6;
/// `Value::source`: the command (a string).
pub const SRC_COMM: u32 = 7;
/// `Value::source`: the tracepoint record's field at offset `index`, of
/// `size` bytes.
pub const SRC_FIELD: u32 = 8;
/// `Value::source`: the string a `__data_loc` field at offset `index`
/// points to inside the record.
pub const SRC_DATA_LOC: u32 = 9;

/// `Value::flags`: sign-extend from `size` bytes.
pub const VAL_SIGNED: u32 = 1;
/// `Value::flags`: the value is a pointer to a string, kept in the key's
/// string slot `str_slot`.
pub const VAL_STRING: u32 = 2;
/// `Value::flags`: the string is in user memory.
pub const VAL_USER: u32 = 4;

/// `Value::op`: none.
pub const OP_NONE: u32 = 0;
/// `Value::op`: add `imm`.
pub const OP_ADD: u32 = 1;
/// `Value::op`: subtract `imm`.
pub const OP_SUB: u32 = 2;
/// `Value::op`: multiply by `imm`.
pub const OP_MUL: u32 = 3;
/// `Value::op`: divide by `imm` (nonzero).
pub const OP_DIV: u32 = 4;
/// `Value::op`: shift right by `imm`.
pub const OP_SHR: u32 = 5;
/// `Value::op`: shift left by `imm`.
pub const OP_SHL: u32 = 6;
/// `Value::op`: bitwise and with `imm`.
pub const OP_AND: u32 = 7;

/// `Cond::cmp`: equal.
pub const CMP_EQ: u32 = 0;
/// `Cond::cmp`: not equal.
pub const CMP_NE: u32 = 1;
/// `Cond::cmp`: less than.
pub const CMP_LT: u32 = 2;
/// `Cond::cmp`: less than or equal.
pub const CMP_LE: u32 = 3;
/// `Cond::cmp`: greater than.
pub const CMP_GT: u32 = 4;
/// `Cond::cmp`: greater than or equal.
pub const CMP_GE: u32 = 5;

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

/// How to compute one value.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Value {
    /// `SRC_*`.
    pub source: u32,
    /// Argument number, or record offset.
    pub index: u32,
    /// Bytes the type has (1, 2, 4 or 8): the value is cut to them.
    pub size: u32,
    /// `VAL_*` bits.
    pub flags: u32,
    /// `OP_*`, applied with `imm` to a numeric value.
    pub op: u32,
    /// The key's string slot, for strings.
    pub str_slot: u32,
    /// The constant, or the operand of `op`.
    pub imm: u64,
}

/// One comparison of a filter.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Cond {
    /// The left side.
    pub value: Value,
    /// `CMP_*`.
    pub cmp: u32,
    /// Whether the next comparison is joined by `||` (else `&&`, which
    /// binds tighter).
    pub or_next: u32,
    /// The right side, for numbers.
    pub imm: u64,
    /// The right side, for strings, NUL-padded.
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

/// What the entry program keeps for a return probe.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Entry {
    /// `bpf_ktime_get_ns` at entry.
    pub start_ns: u64,
    /// The register arguments.
    pub args: [u64; MAX_ARGS],
}

crate::pod!(Value, Cond, Probe, Config, Key, Entry);

//! Call frame information compiled into compact rows, for unwinding user
//! stacks of code built without frame pointers: the compiler, from a
//! file's `.eh_frame` (or `.debug_frame`) to the rows and index the
//! kernel's walk searches. [`unwind`](super::unwind) gives processes their
//! files' tables; [`cficache`](super::cficache) keeps compiled tables on
//! disk.

use gimli::{
    BaseAddresses, CfaRule, CieOrFde, DebugFrame, EhFrame, EndianSlice, LittleEndian, RegisterRule,
    UnwindContext, UnwindSection, X86_64,
};
use object::{Object as _, ObjectSection as _, ObjectSegment as _};
use rtrace_common::unwind::{Bucket, CfiRow, CfiRule, MAX_INDEX_SHIFT, ROWS_PER_BUCKET};

use crate::kernel::memory::Slab;

mod gaps;

pub use rtrace_common::unwind::{
    CFA_END, CFA_NONE, CFA_PLT, CFA_RBP, CFA_RBX, CFA_RSP, CFA_RSP_IN_PARENT, CFA_RSP_RA_RDI,
};

/// The rules from one address up to the next row's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Row {
    /// The first address (the file's virtual address) the rules hold for.
    pub pc: u64,
    /// One of the `CFA_*` values.
    pub cfa: u8,
    /// See [`Row::cfa`].
    pub cfa_offset: i32,
    /// See [`CfiRule::rbp_slot`].
    pub rbp_slot: i8,
    /// See [`CfiRule::rbx_slot`].
    pub rbx_slot: i8,
}

impl Row {
    /// The row's rules as the kernel's tables hold them.
    pub fn rule(&self) -> CfiRule {
        CfiRule {
            cfa_offset: self.cfa_offset,
            rbp_slot: self.rbp_slot,
            rbx_slot: self.rbx_slot,
            cfa: self.cfa,
            pad: 0,
        }
    }

    fn same_rules(&self, other: &Row) -> bool {
        self.rule() == other.rule()
    }

    pub fn none(pc: u64) -> Self {
        Self {
            pc,
            cfa: CFA_NONE,
            cfa_offset: 0,
            rbp_slot: 0,
            rbx_slot: 0,
        }
    }
}

/// The slot (in words from the CFA) a register was saved at, if it was
/// saved (`Some(None)` where it was not): `None` where the save is not a
/// whole word or lies beyond what a rule holds.
fn saved_slot(rule: Option<RegisterRule<usize>>) -> Option<Option<i8>> {
    match rule {
        Some(RegisterRule::Offset(off)) if off % 8 == 0 => {
            i8::try_from(off / 8).ok().filter(|&s| s != 0).map(Some)
        }
        Some(RegisterRule::Offset(_)) => None,
        _ => Some(None),
    }
}

/// Errors from compiling a file's call frame information.
#[derive(Debug, thiserror::Error)]
pub enum CfiError {
    /// The file is not an ELF file object can read.
    #[error("not an ELF file: {0}")]
    Elf(#[from] object::Error),
    /// The file has neither `.eh_frame` nor `.debug_frame`.
    #[error("no .eh_frame or .debug_frame section")]
    NoCfi,
    /// The call frame information does not parse.
    #[error("malformed call frame information: {0}")]
    Malformed(#[from] gimli::Error),
    /// More distinct unwind rules than a row can number (`1 << 16`).
    #[error("more than 65536 distinct unwind rules")]
    TooManyRules,
}

/// What compiling one file found.
#[derive(Debug, Default)]
pub struct Table {
    /// Rows sorted by address, neighbours with the same rules merged, as
    /// the kernel holds them: each address as an offset from `base`
    /// modulo `1 << 16`, each rule as an index into `rules`.
    pub rows: Slab<CfiRow>,
    /// The file's distinct rules.
    pub rules: Slab<CfiRule>,
    /// The first row's address (a file virtual address).
    pub base: u64,
    /// Rows whose rules the unwinder cannot follow (such as a CFA given by
    /// an expression other than the PLT's), kept as [`CFA_NONE`].
    pub unsupported: usize,
    /// For each bucket of `1 << index_shift` bytes of code from `base`,
    /// the rows that cover it; see [`rtrace_common::unwind::Region`].
    pub index: Slab<Bucket>,
    /// See [`Table::index`]; at most [`MAX_INDEX_SHIFT`].
    pub index_shift: u32,
}

impl Table {
    /// The table of `rows`, sorted by address: the rows made four bytes
    /// each, the distinct rules kept once, and the index built. Fails
    /// where the file has more distinct rules than a row can number.
    fn of(rows: &[Row], unsupported: usize) -> Result<Self, CfiError> {
        let mut table = Table {
            unsupported,
            base: rows.first().map_or(0, |r| r.pc),
            ..Table::default()
        };
        let mut numbered: std::collections::HashMap<CfiRule, u16> = Default::default();
        let mut rules = Vec::new();
        let mut dense = Vec::with_capacity(rows.len());
        for r in rows {
            let rule = r.rule();
            let n = match numbered.get(&rule) {
                Some(&n) => n,
                None => {
                    let n = u16::try_from(rules.len()).map_err(|_| CfiError::TooManyRules)?;
                    rules.push(rule);
                    numbered.insert(rule, n);
                    n
                }
            };
            dense.push(CfiRow {
                pc: r.pc.wrapping_sub(table.base) as u16,
                rule: n,
            });
        }
        table.rows = Slab::Owned(dense);
        table.rules = Slab::Owned(rules);
        table.build_index(rows);
        Ok(table)
    }

    /// Builds the index of `rows` (the table's, with their addresses
    /// whole): buckets of 16 bytes of code up to `1 << MAX_INDEX_SHIFT`,
    /// and no more than one for every [`ROWS_PER_BUCKET`] rows where that
    /// bound allows.
    fn build_index(&mut self, rows: &[Row]) {
        let (Some(first), Some(last)) = (rows.first(), rows.last()) else {
            return;
        };
        let span = last.pc - first.pc;
        let most = (rows.len() as u64 / u64::from(ROWS_PER_BUCKET)).max(1);
        let mut shift = 4;
        while shift < MAX_INDEX_SHIFT && (span >> shift) + 1 > most {
            shift += 1;
        }
        let buckets = (span >> shift) + 1;
        // The last row at or before each bucket's start.
        let mut starts = Vec::with_capacity(buckets as usize);
        let mut i = 0;
        for b in 0..buckets {
            let at = first.pc + (b << shift);
            while rows.get(i + 1).is_some_and(|r| r.pc <= at) {
                i += 1;
            }
            starts.push(i as u32);
        }
        let len = rows.len() as u32;
        self.index = Slab::Owned(
            (0..starts.len())
                .map(|b| Bucket {
                    first: starts[b],
                    end: starts.get(b + 1).map_or(len, |&next| next + 1),
                })
                .collect(),
        );
        self.index_shift = shift;
    }

    /// The rules that hold at file address `pc`, found as the kernel's
    /// walk finds them: its bucket of the index, then a search by halves
    /// between that bucket's first row, which is at or before the bucket's
    /// start, and the next bucket's, comparing addresses less the bucket's
    /// start in 16 bits. The tests hold the kernel's walk to it, and
    /// perf's DWARF-mode stacks are walked with it.
    pub fn lookup(&self, pc: u64) -> Option<CfiRule> {
        let last = self.index.len().checked_sub(1)?;
        let off = pc.checked_sub(self.base)?;
        let b = usize::try_from(off >> self.index_shift)
            .unwrap_or(usize::MAX)
            .min(last);
        let start = (b as u64) << self.index_shift;
        // Past the last bucket every row compares below it.
        let want = (off - start).min(u64::from(u16::MAX)) as u16;
        let Bucket { first, end } = self.index[b];
        let (lo, hi) = (first as usize + 1, (end as usize).min(self.rows.len()));
        let within = |r: &CfiRow| r.pc.wrapping_sub(start as u16) <= want;
        let i = lo.min(hi) + self.rows.get(lo.min(hi)..hi)?.partition_point(within);
        let row = self.rows.get(i.checked_sub(1)?)?;
        self.rules.get(usize::from(row.rule)).copied()
    }
}

/// The PLT's CFA expression as GCC and binutils write it:
/// `rsp + 8 + ((rip & 15) >= N) << 3`, with N at byte 6 (`DW_OP_lit10` or
/// `DW_OP_lit11`).
const PLT_EXPRESSION: [u8; 11] = [
    0x77, 0x08, // DW_OP_breg7 (rsp) 8
    0x80, 0x00, // DW_OP_breg16 (rip) 0
    0x3f, // DW_OP_lit15
    0x1a, // DW_OP_and
    0x3b, // DW_OP_lit11 (or 0x3a, lit10)
    0x2a, // DW_OP_ge
    0x33, // DW_OP_lit3
    0x24, // DW_OP_shl
    0x22, // DW_OP_plus
];

/// The threshold N of a PLT expression, if `expr` is one.
fn plt_threshold(expr: &[u8]) -> Option<i32> {
    if expr.len() != PLT_EXPRESSION.len() {
        return None;
    }
    let lit = expr[6];
    let same = expr
        .iter()
        .zip(PLT_EXPRESSION)
        .enumerate()
        .all(|(i, (a, b))| i == 6 || *a == b);
    (same && (0x30..=0x4f).contains(&lit)).then(|| i32::from(lit - 0x30))
}

/// Appends the rows of every FDE in `section` (`.eh_frame` or
/// `.debug_frame`) to `rows`, and each function's first address and the
/// range of its rows in `rows` to `functions`.
fn add_rows<'d, S>(
    section: &S,
    bases: &BaseAddresses,
    rows: &mut Vec<Row>,
    functions: &mut Vec<Function>,
    unsupported: &mut usize,
) -> Result<(), gimli::Error>
where
    S: UnwindSection<EndianSlice<'d, LittleEndian>>,
{
    let mut ctx = UnwindContext::new();
    let mut entries = section.entries(bases);
    while let Some(entry) = entries.next()? {
        let CieOrFde::Fde(partial) = entry else {
            continue;
        };
        let fde = partial.parse(S::cie_from_offset)?;
        let first = rows.len();
        let mut fde_rows = fde.rows(section, bases, &mut ctx)?;
        while let Some(r) = fde_rows.next_row()? {
            let mut row = Row::none(r.start_address());
            let ra = r.register(X86_64::RA);
            let ra_ok = matches!(ra, Some(RegisterRule::Offset(-8)));
            match r.cfa() {
                CfaRule::RegisterAndOffset {
                    register: X86_64::RSP,
                    offset,
                } if ra == Some(RegisterRule::Register(X86_64::RDI)) => {
                    if let Ok(off) = i32::try_from(*offset) {
                        row.cfa = CFA_RSP_RA_RDI;
                        row.cfa_offset = off;
                    }
                }
                CfaRule::RegisterAndOffset { register, offset } if ra_ok => {
                    let reg = match *register {
                        X86_64::RSP => Some(CFA_RSP),
                        X86_64::RBP => Some(CFA_RBP),
                        X86_64::RBX => Some(CFA_RBX),
                        _ => None,
                    };
                    if let (Some(reg), Ok(off)) = (reg, i32::try_from(*offset)) {
                        row.cfa = reg;
                        row.cfa_offset = off;
                    }
                }
                CfaRule::Expression(e) if ra_ok => {
                    let expr = e.get(section)?;
                    if let Some(n) = plt_threshold(expr.0.slice()) {
                        row.cfa = CFA_PLT;
                        row.cfa_offset = n;
                    }
                }
                _ => {}
            }
            // A save the rule cannot hold leaves the row to the frame
            // pointer: a caller's register taken as unchanged would be wrong.
            match (
                saved_slot(r.register(X86_64::RBP)),
                saved_slot(r.register(X86_64::RBX)),
            ) {
                (Some(bp), Some(bx)) => {
                    row.rbp_slot = bp.unwrap_or(0);
                    row.rbx_slot = bx.unwrap_or(0);
                }
                _ => row.cfa = CFA_NONE,
            }
            // The outermost frame (`_start`, a thread's start) marks its
            // return address undefined: the stack ends there.
            if matches!(ra, Some(RegisterRule::Undefined)) {
                row.cfa = CFA_END;
            }
            if row.cfa == CFA_NONE {
                *unsupported += 1;
            }
            rows.push(row);
        }
        functions.push(Function {
            start: fde.initial_address(),
            end: fde.initial_address() + fde.len(),
            rows: first as u32..rows.len() as u32,
        });
    }
    Ok(())
}

/// One FDE's address range and where its rows are.
struct Function {
    start: u64,
    end: u64,
    rows: std::ops::Range<u32>,
}

/// Puts the functions' rows in address order, each function followed by a
/// row that ends it unless the next one starts right there, and merges
/// neighbours with the same rules. Functions are sorted, not rows: there
/// are a twentieth as many, and each one's rows are in order already.
fn assemble(
    rows: &[Row],
    mut functions: Vec<Function>,
    syscall_at: impl Fn(u64) -> bool,
) -> Vec<Row> {
    functions.sort_unstable_by_key(|f| f.start);
    let mut out: Vec<Row> = Vec::with_capacity(rows.len() + functions.len());
    let push = |r: Row, out: &mut Vec<Row>| {
        if let Some(last) = out.last_mut() {
            if last.pc == r.pc {
                // A function's end marker and the next function's first
                // row share an address: the function's row wins, since it
                // is the one that covers it.
                if r.cfa != CFA_NONE || last.cfa == CFA_NONE {
                    *last = r;
                }
                if out.len() >= 2 && out[out.len() - 2].same_rules(&out[out.len() - 1]) {
                    out.pop();
                }
                return;
            }
            if last.same_rules(&r) {
                return;
            }
        }
        out.push(r);
    };
    let mut sorted = true;
    for (i, f) in functions.iter().enumerate() {
        for &r in &rows[f.rows.start as usize..f.rows.end as usize] {
            sorted &= out.last().is_none_or(|l| l.pc <= r.pc);
            push(r, &mut out);
        }
        if functions.get(i + 1).is_none_or(|next| next.start > f.end) {
            // glibc's clone and clone3 end their CFI at the system call,
            // as the child returns from it on another stack; their parent
            // goes on under the last rule up to the child's own start.
            let last = rows[f.rows.start as usize..f.rows.end as usize].last();
            let end = match last {
                Some(l) if l.cfa == CFA_RSP && syscall_at(f.end) => Row {
                    pc: f.end,
                    cfa: CFA_RSP_IN_PARENT,
                    ..*l
                },
                _ => Row::none(f.end),
            };
            push(end, &mut out);
        }
    }
    if !sorted {
        // Overlapping FDEs (broken, but seen): order the rows themselves.
        let mut all: Vec<Row> = Vec::with_capacity(rows.len() + functions.len());
        for f in &functions {
            all.extend_from_slice(&rows[f.rows.start as usize..f.rows.end as usize]);
            all.push(Row::none(f.end));
        }
        all.sort_by_key(|r| (r.pc, r.cfa == CFA_NONE));
        all.dedup_by_key(|r| r.pc);
        out.clear();
        for r in all {
            push(r, &mut out);
        }
    }
    out
}

/// Compiles the call frame information of the ELF file in `data`: its
/// `.eh_frame`, and its `.debug_frame` where it has one (code built without
/// unwind tables keeps its CFI there, beside the C runtime's `.eh_frame`).
pub fn compile(data: &[u8]) -> Result<Table, CfiError> {
    let (rows, unsupported) = rows_of(data)?;
    Table::of(&rows, unsupported)
}

/// An FDE's code: its range, and whether it begins as a function does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FdeRange {
    /// Its first address.
    pub start: u64,
    /// The address after its last.
    pub end: u64,
    /// Whether its first row's CFA is `rsp + 8` (the return address just
    /// pushed): a function's entry. A part the compiler split from a
    /// function begins inside that function's frame, otherwise.
    pub entry: bool,
}

/// The FDEs of ELF file `file`'s `.eh_frame` that hold one of `addrs`:
/// only their first rows are worked out.
pub fn fdes_holding(file: &object::File, addrs: &[u64]) -> Result<Vec<FdeRange>, CfiError> {
    let section = file.section_by_name(".eh_frame").ok_or(CfiError::NoCfi)?;
    let eh_data = section.uncompressed_data()?;
    let bases = bases_of(file).set_eh_frame(section.address());
    let eh_frame = EhFrame::new(&eh_data, LittleEndian);
    let mut ctx = UnwindContext::new();
    let mut entries = eh_frame.entries(&bases);
    let mut out = Vec::new();
    while let Some(entry) = entries.next()? {
        let CieOrFde::Fde(partial) = entry else {
            continue;
        };
        let fde = partial.parse(EhFrame::cie_from_offset)?;
        let (start, end) = (fde.initial_address(), fde.end_address());
        if !addrs.iter().any(|a| (start..end).contains(a)) {
            continue;
        }
        let mut rows = fde.rows(&eh_frame, &bases, &mut ctx)?;
        let entry = rows.next_row()?.is_some_and(|r| {
            matches!(
                r.cfa(),
                CfaRule::RegisterAndOffset {
                    register: X86_64::RSP,
                    offset: 8
                }
            )
        });
        out.push(FdeRange { start, end, entry });
    }
    Ok(out)
}

/// The base addresses CFI's pointer encodings are relative to: the
/// file's `.text` and `.got` (each table adds its own section's).
fn bases_of(file: &object::File) -> BaseAddresses {
    let mut bases = BaseAddresses::default();
    if let Some(text) = file.section_by_name(".text") {
        bases = bases.set_text(text.address());
    }
    if let Some(got) = file.section_by_name(".got") {
        bases = bases.set_got(got.address());
    }
    bases
}

/// Adds the rows and functions of ELF file `file`'s `.eh_frame`, if it
/// has one ([`add_rows`]); returns whether it has.
fn add_eh_frame_rows(
    file: &object::File,
    rows: &mut Vec<Row>,
    functions: &mut Vec<Function>,
    unsupported: &mut usize,
) -> Result<bool, CfiError> {
    let Some(section) = file.section_by_name(".eh_frame") else {
        return Ok(false);
    };
    let eh_data = section.uncompressed_data()?;
    // Code runs about one row to two or three bytes of CFI.
    rows.reserve(eh_data.len() / 2);
    let bases = bases_of(file).set_eh_frame(section.address());
    let eh_frame = EhFrame::new(&eh_data, LittleEndian);
    add_rows(&eh_frame, &bases, rows, functions, unsupported)?;
    Ok(true)
}

/// The rows of the ELF file in `data`, sorted by address, with their
/// addresses whole, and how many have rules the unwinder cannot follow.
fn rows_of(data: &[u8]) -> Result<(Vec<Row>, usize), CfiError> {
    let file = object::File::parse(data)?;
    let bases = bases_of(&file);
    let mut unsupported = 0;
    let mut rows: Vec<Row> = Vec::new();
    let mut functions = Vec::new();
    let mut found = add_eh_frame_rows(&file, &mut rows, &mut functions, &mut unsupported)?;
    if let Some(section) = file.section_by_name(".debug_frame") {
        let debug_data = section.uncompressed_data()?;
        let mut debug_frame = DebugFrame::new(&debug_data, LittleEndian);
        debug_frame.set_address_size(8);
        add_rows(
            &debug_frame,
            &bases,
            &mut rows,
            &mut functions,
            &mut unsupported,
        )?;
        found = true;
    }
    if !found {
        return Err(CfiError::NoCfi);
    }
    // Asked at nearly every function's end: the code sections are
    // found once.
    let code: Vec<_> = file
        .sections()
        .filter(|s| s.kind() == object::SectionKind::Text)
        .collect();
    let syscall_at = |addr: u64| {
        code.iter().any(|s| {
            s.data_range(addr, 2)
                .is_ok_and(|d| d == Some(&[0x0f, 0x05][..]))
        })
    };
    let builtins = super::v8::builtins_in(&file, data).flatten();
    add_gap_rows(
        &code,
        file.entry(),
        builtins,
        &mut rows,
        &mut functions,
        syscall_at,
    );
    Ok((assemble(&rows, functions, syscall_at), unsupported))
}

/// Adds rows worked out from the code ([`gaps`]) for the stretches of
/// the code sections `code` that no FDE covers, each stretch as one
/// function of `functions`. A stretch from a system call on is glibc's
/// `clone` after its CFI ends, which [`assemble`] gives the parent's
/// rule. The function at `entry`, the file's entry point, ends the stack.
///
/// V8's embedded builtins (`builtins`, where [`super::v8::builtins_in`]
/// places them) get no rows: V8's generated code tail-calls with
/// arguments it pushed, moving the return address down
/// (`AdaptorWithBuiltinExitFrame` pushes a copy of it and jumps to
/// `CEntry`), so a height carried along a jump is wrong there. Every
/// frame V8 builds keeps rbp, which the walk follows where a stretch has
/// no rows.
fn add_gap_rows(
    code: &[object::Section],
    entry: u64,
    builtins: Option<(u64, u64)>,
    rows: &mut Vec<Row>,
    functions: &mut Vec<Function>,
    syscall_at: impl Fn(u64) -> bool,
) {
    let mut covered: Vec<(u64, u64)> = functions.iter().map(|f| (f.start, f.end)).collect();
    covered.sort_unstable();
    let in_builtins = |s: u64, e: u64| builtins.is_some_and(|(low, high)| s < high && low < e);
    for section in code {
        let Ok(data) = section.data() else {
            continue;
        };
        let (start, end) = (section.address(), section.address() + data.len() as u64);
        // The FDEs that overlap the section, in order; the stretches
        // between them are the gaps.
        let first = covered.partition_point(|&(_, e)| e <= start);
        let mut at = start;
        let mut gaps = Vec::new();
        for &(s, e) in covered[first..].iter().take_while(|&&(s, _)| s < end) {
            if s > at {
                gaps.push((at, s));
            }
            at = at.max(e);
        }
        if at < end {
            gaps.push((at, end));
        }
        let worked_out = gaps
            .into_iter()
            .filter(|&(s, e)| !syscall_at(s) && !in_builtins(s, e));
        for (s, e) in worked_out {
            let bytes = &data[(s - start) as usize..(e - start) as usize];
            let mut found = gaps::rows(bytes, s);
            if (s..e).contains(&entry) {
                gaps::outermost(&mut found, entry);
            }
            if found.iter().all(|r| r.cfa == CFA_NONE) {
                continue;
            }
            let first = rows.len() as u32;
            rows.extend(found);
            functions.push(Function {
                start: s,
                end: e,
                rows: first..rows.len() as u32,
            });
        }
    }
}

/// A file's loadable segments.
#[derive(Debug, Default)]
pub struct Segments {
    /// Each as (file offset, size, virtual address), to turn a mapping's
    /// file offset into the virtual addresses rows are keyed by.
    pub ranges: Vec<(u64, u64, u64)>,
    /// What a mapping of the file's one executable segment needs for its
    /// load bias besides its own start and offset: the segment's file
    /// offset less its virtual address; `None` where the file has several
    /// executable segments (or none), as a mapping alone then does not
    /// tell which it holds.
    pub exec_delta: Option<u64>,
}

/// The loadable segments of the ELF file `data`; none if it is no ELF
/// file.
pub fn segments(data: &[u8]) -> Segments {
    const PF_X: u32 = 1;
    let Ok(file) = object::File::parse(data) else {
        return Segments::default();
    };
    let mut out = Segments::default();
    let mut execs = 0;
    for s in file.segments() {
        let (off, size) = s.file_range();
        out.ranges.push((off, size, s.address()));
        if matches!(s.flags(), object::SegmentFlags::Elf { p_flags } if p_flags & PF_X != 0) {
            execs += 1;
            out.exec_delta = Some(off.wrapping_sub(s.address()));
        }
    }
    if execs != 1 {
        out.exec_delta = None;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plt_expression_is_recognized() {
        assert_eq!(plt_threshold(&PLT_EXPRESSION), Some(11));
        let mut ten = PLT_EXPRESSION;
        ten[6] = 0x3a;
        assert_eq!(plt_threshold(&ten), Some(10));
        assert_eq!(plt_threshold(&PLT_EXPRESSION[..10]), None);
        let mut other = PLT_EXPRESSION;
        other[0] = 0x76;
        assert_eq!(plt_threshold(&other), None);
    }

    #[test]
    fn libc_compiles_to_sorted_covering_rows() {
        let data = std::fs::read("/lib/x86_64-linux-gnu/libc.so.6").unwrap();
        let (rows, unsupported) = rows_of(&data).unwrap();
        assert!(rows.len() > 10_000, "{} rows", rows.len());
        assert!(rows.windows(2).all(|w| w[0].pc < w[1].pc));
        assert!(rows.iter().any(|r| r.cfa == CFA_PLT));
        // Nearly every rule libc's CFI gives is one the unwinder follows
        // (the rows without CFI are mostly the gaps between functions).
        assert!(
            unsupported * 100 < rows.len(),
            "{unsupported} of {} rows unsupported",
            rows.len()
        );
        // Functions start at rsp + 8 (the return address just pushed), and
        // rsp-based CFAs move in whole words.
        let entries = rows
            .iter()
            .filter(|r| r.cfa == CFA_RSP && r.cfa_offset == 8)
            .count();
        assert!(entries > 1000, "{entries} rows at rsp + 8");
        assert!(
            rows.iter()
                .filter(|r| r.cfa == CFA_RSP)
                .all(|r| r.cfa_offset >= 8 && r.cfa_offset.rem_euclid(8) == 0)
        );
        // Kept four bytes a row: a few hundred distinct rules serve them.
        let table = compile(&data).unwrap();
        assert_eq!(table.rows.len(), rows.len());
        assert!(
            table.rules.len() * 20 < rows.len(),
            "{} rules for {} rows",
            table.rules.len(),
            rows.len()
        );
    }

    /// This machine's libc's compiled table, and the address of function
    /// `name`, which it exports.
    fn libc_table_at(name: &str) -> (Table, u64) {
        use object::{Object as _, ObjectSymbol as _};
        let data = std::fs::read("/lib/x86_64-linux-gnu/libc.so.6").unwrap();
        let at = object::File::parse(&*data)
            .unwrap()
            .dynamic_symbols()
            .find(|s| s.name() == Ok(name))
            .unwrap_or_else(|| panic!("libc exports no {name}"))
            .address();
        (compile(&data).unwrap(), at)
    }

    /// glibc's `vfork` pops its return address into rdi before the system
    /// call and pushes it back after: the rows between say so, and the
    /// CFA is rsp itself there.
    #[test]
    fn vforks_return_address_is_kept_in_rdi() {
        let (table, vfork) = libc_table_at("vfork");
        let at_entry = table.lookup(vfork).unwrap();
        assert_eq!((at_entry.cfa, at_entry.cfa_offset), (CFA_RSP, 8));
        // The pop is one byte (`pop %rdi`), maybe after an endbr64.
        let popped = (1..=8)
            .filter_map(|d| table.lookup(vfork + d))
            .find(|r| r.cfa == CFA_RSP_RA_RDI)
            .expect("a row with the return address in rdi");
        assert_eq!(popped.cfa_offset, 0);
    }

    /// ld.so's lazy-binding trampolines push rbx and keep their frame in
    /// it (`mov %rsp, %rbx`) while rsp is aligned for `xsave`: their CFA
    /// is rbx-based, and the caller's rbx lies at rbx itself, so the
    /// slot is as far below the CFA as rbx is.
    #[test]
    fn ld_sos_trampoline_finds_its_frame_from_rbx() {
        let data = std::fs::read("/lib64/ld-linux-x86-64.so.2").unwrap();
        let table = compile(&data).unwrap();
        let from_rbx: Vec<_> = table.rules.iter().filter(|r| r.cfa == CFA_RBX).collect();
        assert!(!from_rbx.is_empty(), "no rbx-based rule in ld.so");
        for r in from_rbx {
            assert_eq!(i32::from(r.rbx_slot) * 8, -r.cfa_offset, "{r:?}");
        }
        // Other functions save rbx for their callers, as pushes below the
        // return address.
        assert!(
            table
                .rules
                .iter()
                .any(|r| r.cfa == CFA_RSP && r.rbx_slot < -1)
        );
    }

    /// glibc's `clone` ends its CFI at its system call; the code after it
    /// (the parent's return) gets the rule from before it, marked as the
    /// parent's, up to the child's start, whose return address is
    /// undefined.
    #[test]
    fn clones_parent_keeps_its_rule_past_the_system_call() {
        let (table, clone) = libc_table_at("clone");
        let after = (clone..clone + 0x80)
            .filter_map(|pc| table.lookup(pc).map(|r| (pc, r)))
            .find(|(_, r)| r.cfa == CFA_RSP_IN_PARENT)
            .expect("a parent's row after clone's system call");
        assert_eq!(after.1.cfa_offset, 8);
        assert!(
            (after.0..after.0 + 0x40)
                .filter_map(|pc| table.lookup(pc))
                .any(|r| r.cfa == CFA_END),
            "the child's start follows"
        );
    }

    /// Checks that `table`'s lookup finds, for every row's first address,
    /// the byte before it and the one after, every bucket's start, and
    /// past both ends, the rules a search of all of `rows` finds.
    fn agrees(what: &str, rows: &[Row], table: &Table) {
        let plain = |pc: u64| {
            let i = rows.partition_point(|r| r.pc <= pc);
            rows.get(i.checked_sub(1)?).map(Row::rule)
        };
        let first = rows[0].pc;
        let buckets = (0..table.index.len() as u64).map(|b| first + (b << table.index_shift));
        let pcs = rows
            .iter()
            .flat_map(|r| [r.pc.wrapping_sub(1), r.pc, r.pc + 1])
            .chain(buckets)
            .chain([0, u64::MAX, rows.last().unwrap().pc + 4096]);
        for pc in pcs {
            assert_eq!(table.lookup(pc), plain(pc), "{what}: pc {pc:#x}");
        }
    }

    #[test]
    fn the_index_finds_the_row_a_search_of_all_rows_finds() {
        for path in ["/lib/x86_64-linux-gnu/libc.so.6", "/usr/bin/python3"] {
            let data = std::fs::read(path).unwrap();
            let (rows, unsupported) = rows_of(&data).unwrap();
            let table = Table::of(&rows, unsupported).unwrap();
            let span = rows.last().unwrap().pc - rows[0].pc;
            let most = (rows.len() as u64 / u64::from(ROWS_PER_BUCKET) + 1)
                .max((span >> MAX_INDEX_SHIFT) + 1);
            assert!(
                (table.index.len() as u64) <= most,
                "{path}: {} buckets for {} rows",
                table.index.len(),
                rows.len()
            );
            agrees(path, &rows, &table);
        }
    }

    #[test]
    fn rows_far_apart_are_found_though_their_addresses_are_kept_in_16_bits() {
        // Few rows over megabytes of code: the buckets stay at 32 KiB, and
        // rows 64 KiB and more apart share their 16 bits.
        let rule = |cfa_offset: i32| Row {
            cfa: CFA_RSP,
            cfa_offset,
            ..Row::none(0)
        };
        let pcs = [
            0x1000, 0x1010, 0x11000, 0x21000, 0x21008, 0x9000f, 0x98000, 0x98001, 0x400000,
            0x410000, 0x418000,
        ];
        let rows: Vec<Row> = pcs
            .iter()
            .enumerate()
            .map(|(i, &pc)| Row {
                pc,
                ..if i % 3 == 2 {
                    Row::none(0)
                } else {
                    rule(8 * (i as i32 + 1))
                }
            })
            .collect();
        let table = Table::of(&rows, 0).unwrap();
        assert_eq!(table.index_shift, MAX_INDEX_SHIFT);
        agrees("sparse", &rows, &table);
    }
    /// The rows worked out from the code ([`gaps`]) for functions that
    /// have CFI, against the compiler's: at every instruction of every
    /// function, they agree, or say nothing, nearly everywhere.
    #[test]
    fn synthesized_rows_agree_with_the_compilers_cfi() {
        use iced_x86::{Decoder, DecoderOptions};
        let me = std::env::current_exe().unwrap();
        for path in [
            std::path::Path::new("/lib/x86_64-linux-gnu/libc.so.6"),
            std::path::Path::new("/usr/bin/python3"),
            &me,
        ] {
            let data = std::fs::read(path).unwrap();
            let file = object::File::parse(&*data).unwrap();
            let (mut rows, mut functions, mut unsupported) = (Vec::new(), Vec::new(), 0);
            assert!(
                add_eh_frame_rows(&file, &mut rows, &mut functions, &mut unsupported).unwrap(),
                "{} has no .eh_frame",
                path.display()
            );
            let text = file.section_by_name(".text").unwrap();
            let (mut agree, mut silent, mut wrong) = (0u64, 0u64, Vec::new());
            for f in &functions {
                let real = &rows[f.rows.start as usize..f.rows.end as usize];
                let entry = real
                    .first()
                    .is_some_and(|r| r.cfa == CFA_RSP && r.cfa_offset == 8);
                let Ok(Some(code)) = text.data_range(f.start, f.end - f.start) else {
                    continue;
                };
                if !entry {
                    continue;
                }
                let made = gaps::rows(code, f.start);
                let at = |rows: &[Row], pc: u64| rows.iter().rev().find(|r| r.pc <= pc).copied();
                let mut decoder = Decoder::with_ip(64, code, f.start, DecoderOptions::NONE);
                for ins in &mut decoder {
                    let (Some(r), m) = (at(real, ins.ip()), at(&made, ins.ip())) else {
                        continue;
                    };
                    if !matches!(r.cfa, CFA_RSP | CFA_RBP) {
                        continue;
                    }
                    match m {
                        Some(m) if m.cfa != CFA_NONE => {
                            if (m.cfa, m.cfa_offset) == (r.cfa, r.cfa_offset) {
                                agree += 1;
                            } else {
                                wrong.push((ins.ip(), r, m));
                            }
                        }
                        _ => silent += 1,
                    }
                }
            }
            let all = agree + silent + wrong.len() as u64;
            eprintln!(
                "{}: {all} instructions, {agree} agree, {silent} without rows, {} differ; first: {:x?}",
                path.display(),
                wrong.len(),
                &wrong[..wrong.len().min(5)]
            );
            assert!(all > 10_000, "{}: {all} instructions", path.display());
            assert!(
                wrong.len() as u64 * 40 < all,
                "{}: {} of {all} differ",
                path.display(),
                wrong.len()
            );
            assert!(
                silent * 20 < all,
                "{}: {silent} of {all} without rows",
                path.display()
            );
        }
    }
}

//! Call frame information compiled into compact rows, for unwinding user
//! stacks of code built without frame pointers (issue 13).
//!
//! Each executable mapping's `.eh_frame` is reduced, address range by
//! address range, to the few rules x86-64 code needs: where the canonical
//! frame address (CFA) is (`rsp + n`, `rbp + n`, or the PLT's expression),
//! and where the caller's `rbp` was saved. The return address is always at
//! CFA - 8 on x86-64. Rows are sorted by address, so one frame is one
//! binary search and two reads. Addresses no FDE covers get a row that says
//! so, and the walk falls back to the frame pointer there (JIT code, hand-
//! written assembly), which the caller counts.
//!
//! This module has the compiler and a reference walk over the rows; the
//! walk the kernel does (in BPF, over the same rows in maps) must agree
//! with it.

use gimli::{
    BaseAddresses, CfaRule, CieOrFde, EhFrame, LittleEndian, RegisterRule, UnwindContext,
    UnwindSection as _, X86_64,
};
use object::{Object as _, ObjectSection as _, ObjectSegment as _};

/// [`Row::cfa`]: no call frame information covers these addresses.
pub const CFA_NONE: u8 = 0;
/// [`Row::cfa`]: CFA = rsp + [`Row::cfa_offset`].
pub const CFA_RSP: u8 = 1;
/// [`Row::cfa`]: CFA = rbp + [`Row::cfa_offset`].
pub const CFA_RBP: u8 = 2;
/// [`Row::cfa`]: a PLT entry: CFA = rsp + 8, plus 8 once the entry has
/// pushed its argument, which is at byte [`Row::cfa_offset`] of its 16.
pub const CFA_PLT: u8 = 3;

/// [`Row::rbp`]: the caller's rbp is still in rbp.
pub const RBP_SAME: u8 = 0;
/// [`Row::rbp`]: the caller's rbp was saved at CFA + [`Row::rbp_offset`].
pub const RBP_SAVED: u8 = 1;

/// The rules from one address up to the next row's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Row {
    /// The first address (the file's virtual address) the rules hold for.
    pub pc: u64,
    /// One of the `CFA_*` values.
    pub cfa: u8,
    /// One of the `RBP_*` values.
    pub rbp: u8,
    /// See [`Row::cfa`].
    pub cfa_offset: i32,
    /// See [`Row::rbp`].
    pub rbp_offset: i32,
}

impl Row {
    fn same_rules(&self, other: &Row) -> bool {
        (self.cfa, self.rbp, self.cfa_offset, self.rbp_offset)
            == (other.cfa, other.rbp, other.cfa_offset, other.rbp_offset)
    }

    fn none(pc: u64) -> Self {
        Self {
            pc,
            cfa: CFA_NONE,
            rbp: RBP_SAME,
            cfa_offset: 0,
            rbp_offset: 0,
        }
    }
}

/// Errors from compiling a file's call frame information.
#[derive(Debug, thiserror::Error)]
pub enum CfiError {
    /// The file is not an ELF file object can read.
    #[error("not an ELF file: {0}")]
    Elf(#[from] object::Error),
    /// The file has no `.eh_frame`.
    #[error("no .eh_frame section")]
    NoEhFrame,
    /// The call frame information does not parse.
    #[error("malformed .eh_frame: {0}")]
    Malformed(#[from] gimli::Error),
}

/// What compiling one file found.
#[derive(Debug, Default)]
pub struct Table {
    /// Rows sorted by address, neighbours with the same rules merged.
    pub rows: Vec<Row>,
    /// Rows whose rules the unwinder cannot follow (such as a CFA given by
    /// an expression other than the PLT's), kept as [`CFA_NONE`].
    pub unsupported: usize,
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

/// Compiles the call frame information of the ELF file in `data`.
pub fn compile(data: &[u8]) -> Result<Table, CfiError> {
    let file = object::File::parse(data)?;
    let section = file
        .section_by_name(".eh_frame")
        .ok_or(CfiError::NoEhFrame)?;
    let eh_data = section.uncompressed_data()?;
    let mut bases = BaseAddresses::default().set_eh_frame(section.address());
    if let Some(text) = file.section_by_name(".text") {
        bases = bases.set_text(text.address());
    }
    if let Some(got) = file.section_by_name(".got") {
        bases = bases.set_got(got.address());
    }
    let eh_frame = EhFrame::new(&eh_data, LittleEndian);
    let mut ctx = UnwindContext::new();
    let mut table = Table::default();
    let mut rows: Vec<Row> = Vec::new();
    let mut entries = eh_frame.entries(&bases);
    while let Some(entry) = entries.next()? {
        let CieOrFde::Fde(partial) = entry else {
            continue;
        };
        let fde = partial.parse(EhFrame::cie_from_offset)?;
        let mut fde_rows = fde.rows(&eh_frame, &bases, &mut ctx)?;
        while let Some(r) = fde_rows.next_row()? {
            let mut row = Row::none(r.start_address());
            let ra_ok = matches!(r.register(X86_64::RA), Some(RegisterRule::Offset(-8)));
            match r.cfa() {
                CfaRule::RegisterAndOffset { register, offset } if ra_ok => {
                    let reg = match *register {
                        X86_64::RSP => Some(CFA_RSP),
                        X86_64::RBP => Some(CFA_RBP),
                        _ => None,
                    };
                    if let (Some(reg), Ok(off)) = (reg, i32::try_from(*offset)) {
                        row.cfa = reg;
                        row.cfa_offset = off;
                    }
                }
                CfaRule::Expression(e) if ra_ok => {
                    let expr = e.get(&eh_frame)?;
                    if let Some(n) = plt_threshold(expr.0.slice()) {
                        row.cfa = CFA_PLT;
                        row.cfa_offset = n;
                    }
                }
                _ => {}
            }
            if let Some(RegisterRule::Offset(off)) = r.register(X86_64::RBP)
                && let Ok(off) = i32::try_from(off)
            {
                row.rbp = RBP_SAVED;
                row.rbp_offset = off;
            }
            if row.cfa == CFA_NONE {
                table.unsupported += 1;
            }
            rows.push(row);
        }
        // Past the function, nothing is known until the next FDE says so.
        rows.push(Row::none(fde.initial_address() + fde.len()));
    }
    // A function's end marker and the next function's first row share an
    // address: the function's row wins, since it is the one that covers it.
    rows.sort_by_key(|r| (r.pc, r.cfa == CFA_NONE));
    rows.dedup_by_key(|r| r.pc);
    for r in rows {
        if table.rows.last().is_none_or(|last| !last.same_rules(&r)) {
            table.rows.push(r);
        }
    }
    Ok(table)
}

/// Where the loaded segments of an ELF file sit, to turn a file offset
/// (what a mapping gives) into the virtual address rows are keyed by.
pub fn file_offset_to_vaddr(data: &[u8], offset: u64) -> Option<u64> {
    let file = object::File::parse(data).ok()?;
    file.segments().find_map(|seg| {
        let (start, size) = seg.file_range();
        (start <= offset && offset < start + size).then(|| offset - start + seg.address())
    })
}

impl Table {
    /// The row whose rules hold at `pc`.
    pub fn lookup(&self, pc: u64) -> Option<&Row> {
        let i = self.rows.partition_point(|r| r.pc <= pc);
        self.rows.get(i.checked_sub(1)?)
    }
}

/// The registers a walk follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Regs {
    /// The instruction pointer (for callers, the return address).
    pub pc: u64,
    /// The stack pointer.
    pub sp: u64,
    /// The frame pointer.
    pub bp: u64,
}

/// How one frame was unwound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// By its call frame information.
    Cfi(Regs),
    /// By the frame pointer, where no CFI covers the address.
    FramePointer(Regs),
}

/// Unwinds one frame: from the registers of a frame whose code is at file
/// address `file_pc`, the caller's registers. `read` reads a stack word.
/// The innermost frame is at its own pc; callers are at a return address,
/// whose call instruction ends there, so their rules are looked up one
/// byte back (`callee` false for the innermost frame).
pub fn step(
    table: &Table,
    file_pc: u64,
    regs: Regs,
    callee: bool,
    read: impl Fn(u64) -> Option<u64>,
) -> Option<Step> {
    let lookup_pc = if callee { file_pc - 1 } else { file_pc };
    let row = table.lookup(lookup_pc).copied().unwrap_or(Row::none(0));
    let cfa = match row.cfa {
        CFA_RSP => regs.sp.checked_add_signed(i64::from(row.cfa_offset))?,
        CFA_RBP => regs.bp.checked_add_signed(i64::from(row.cfa_offset))?,
        CFA_PLT => {
            let pushed = (file_pc & 15) >= row.cfa_offset as u64;
            regs.sp + 8 + if pushed { 8 } else { 0 }
        }
        _ => {
            // The frame pointer walk: [bp] is the caller's bp, [bp + 8]
            // the return address.
            if regs.bp == 0 {
                return None;
            }
            return Some(Step::FramePointer(Regs {
                pc: read(regs.bp + 8)?,
                sp: regs.bp + 16,
                bp: read(regs.bp)?,
            }));
        }
    };
    let bp = match row.rbp {
        RBP_SAVED => read(cfa.checked_add_signed(i64::from(row.rbp_offset))?)?,
        _ => regs.bp,
    };
    Some(Step::Cfi(Regs {
        pc: read(cfa - 8)?,
        sp: cfa,
        bp,
    }))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// An executable mapping of this process.
    struct Map {
        start: u64,
        end: u64,
        offset: u64,
        path: String,
    }

    fn maps() -> Vec<Map> {
        std::fs::read_to_string("/proc/self/maps")
            .unwrap()
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                if f.len() < 6 || !f[1].contains('x') || !f[5].starts_with('/') {
                    return None;
                }
                let (s, e) = f[0].split_once('-')?;
                Some(Map {
                    start: u64::from_str_radix(s, 16).ok()?,
                    end: u64::from_str_radix(e, 16).ok()?,
                    offset: u64::from_str_radix(f[2], 16).ok()?,
                    path: f[5].to_owned(),
                })
            })
            .collect()
    }

    /// Walks this thread's own stack from `regs` with compiled CFI, as the
    /// kernel will walk a sampled one; returns the pcs and how many frames
    /// needed the frame pointer.
    fn walk(mut regs: Regs) -> (Vec<u64>, usize) {
        let maps = maps();
        let mut files: HashMap<String, (Vec<u8>, Table)> = HashMap::new();
        let mut pcs = vec![regs.pc];
        let mut fp_frames = 0;
        // SAFETY: the walk reads this thread's own stack, which is live
        // below the frame that started it.
        let read = |a: u64| a.is_multiple_of(8).then(|| unsafe { *(a as *const u64) });
        for depth in 0..128 {
            let Some(m) = maps.iter().find(|m| m.start <= regs.pc && regs.pc < m.end) else {
                break;
            };
            let (data, table) = files.entry(m.path.clone()).or_insert_with(|| {
                let data = std::fs::read(&m.path).unwrap();
                let table = compile(&data).unwrap_or_default();
                (data, table)
            });
            let file_pc = file_offset_to_vaddr(data, regs.pc - m.start + m.offset).unwrap();
            match step(table, file_pc, regs, depth > 0, read) {
                Some(Step::Cfi(next)) => regs = next,
                Some(Step::FramePointer(next)) => {
                    fp_frames += 1;
                    regs = next;
                }
                None => break,
            }
            if regs.pc == 0 {
                break;
            }
            pcs.push(regs.pc);
        }
        (pcs, fp_frames)
    }

    #[inline(never)]
    fn here() -> Regs {
        let (pc, sp, bp): (u64, u64, u64);
        // SAFETY: reads three registers, touching no memory.
        unsafe {
            std::arch::asm!(
                "lea {pc}, [rip]",
                "mov {sp}, rsp",
                "mov {bp}, rbp",
                pc = out(reg) pc,
                sp = out(reg) sp,
                bp = out(reg) bp,
            );
        }
        Regs { pc, sp, bp }
    }

    #[inline(never)]
    fn leaf_of_three() -> (Vec<u64>, usize) {
        let (pcs, fp) = walk(std::hint::black_box(here()));
        std::hint::black_box(pcs.len());
        (pcs, fp)
    }

    #[inline(never)]
    fn middle_of_three() -> (Vec<u64>, usize) {
        let r = leaf_of_three();
        std::hint::black_box(&r);
        r
    }

    #[inline(never)]
    fn top_of_three() -> (Vec<u64>, usize) {
        let r = middle_of_three();
        std::hint::black_box(&r);
        r
    }

    fn names(pcs: &[u64]) -> Vec<String> {
        use blazesym::symbolize::{Input, Symbolizer, source::Process, source::Source};
        let src = Source::Process(Process::new(blazesym::Pid::Slf));
        let sym = Symbolizer::new();
        // Return addresses name the call site one byte back.
        let addrs: Vec<u64> = pcs
            .iter()
            .enumerate()
            .map(|(i, &p)| if i == 0 { p } else { p - 1 })
            .collect();
        sym.symbolize(&src, Input::AbsAddr(&addrs))
            .unwrap()
            .into_iter()
            .map(|s| s.as_sym().map(|s| s.name.to_string()).unwrap_or_default())
            .collect()
    }

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
        let table = compile(&data).unwrap();
        assert!(table.rows.len() > 10_000, "{} rows", table.rows.len());
        assert!(table.rows.windows(2).all(|w| w[0].pc < w[1].pc));
        assert!(table.rows.iter().any(|r| r.cfa == CFA_PLT));
        // Nearly every rule libc's CFI gives is one the unwinder follows
        // (the rows without CFI are mostly the gaps between functions).
        assert!(
            table.unsupported * 100 < table.rows.len(),
            "{} of {} rows unsupported",
            table.unsupported,
            table.rows.len()
        );
        // Functions start at rsp + 8 (the return address just pushed), and
        // rsp-based CFAs move in whole words.
        let entries = table
            .rows
            .iter()
            .filter(|r| r.cfa == CFA_RSP && r.cfa_offset == 8)
            .count();
        assert!(entries > 1000, "{entries} rows at rsp + 8");
        assert!(
            table
                .rows
                .iter()
                .filter(|r| r.cfa == CFA_RSP)
                .all(|r| r.cfa_offset >= 8 && r.cfa_offset.rem_euclid(8) == 0)
        );
    }

    /// This test binary is built without frame pointers (release Rust), and
    /// libtest runs it on a thread libc started, so a whole walk crosses
    /// Rust code and libc without frame pointers, and must end where the
    /// thread began.
    #[test]
    fn own_stack_unwinds_through_code_without_frame_pointers() {
        let (pcs, fp_frames) = top_of_three();
        let names = names(&pcs);
        let pos = |n: &str| {
            names
                .iter()
                .position(|s| s.contains(n))
                .unwrap_or_else(|| panic!("no {n} in {names:?}"))
        };
        let (leaf, middle, top) = (
            pos("leaf_of_three"),
            pos("middle_of_three"),
            pos("top_of_three"),
        );
        assert!(leaf < middle && middle < top, "{names:?}");
        // The thread's start: libc's start_thread, then clone3.
        let start = pos("start_thread");
        assert!(start > top, "{names:?}");
        assert!(
            names[start..].iter().any(|n| n.contains("clone")),
            "{names:?}"
        );
        assert_eq!(fp_frames, 0, "frames walked by frame pointer: {names:?}");
    }
}

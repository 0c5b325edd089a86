//! Unwind rows for code a file's CFI leaves out, worked out from the
//! instructions themselves.
//!
//! Compilers leave a few functions without CFI: the `main` that rustc
//! writes around a Rust program's own (every Rust program's main thread
//! passes through it), some hand-written assembly, and code built without
//! unwind tables. A walk that meets one falls back on the frame pointer.
//! In code built without frame pointers, rbp holds some other value, so
//! the walk reads garbage and the stack is cut short there.
//!
//! For such a gap, this module decodes the code from its start and tracks
//! the stack's height through it:
//! - pushes and pops, `sub`/`add`/`lea` on rsp;
//! - a frame pointer set from rsp, and rsp set back from it;
//! - `leave`.
//!
//! The height gives the CFA at each instruction, as the compiler's CFI
//! would have. The analysis stays within what it can be sure of:
//! - Code after a return or a jump is reached only by a branch. It gets
//!   the height a branch seen anywhere in the stretch carries (over a
//!   few passes, so that loops count). Failing that, it gets the height
//!   at the function's jump through a table (its cases), else the height
//!   before its last epilogue, as compilers lay out the code after one;
//!   past padding (int3, nops), a new function's.
//! - Anything else that writes rsp leaves the rest of that stretch
//!   without rows, to the frame pointer as before.
//!
//! The test `synthesized_rows_agree_with_the_compilers_cfi` runs this over
//! functions that do have CFI and holds it to the compiler's rows.

use std::collections::HashMap;

use iced_x86::{Decoder, DecoderOptions, FlowControl, Instruction, Mnemonic, OpKind, Register};

use super::{CFA_END, CFA_NONE, CFA_RBP, CFA_RSP, Row};

/// What is known of the stack at one instruction, before it runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Frame {
    /// CFA = rsp + `rsp`, where known.
    rsp: Option<i32>,
    /// CFA = rbp + `rbp`, once rbp was set from rsp (a frame pointer).
    rbp: Option<i32>,
    /// The caller's rbp saved at CFA + 8 * `rbp_slot`; 0: still in rbp.
    rbp_slot: i8,
    /// The caller's rbx, likewise (see `CfiRule::rbx_slot`).
    rbx_slot: i8,
}

impl Frame {
    /// A function's entry: the return address just pushed.
    const ENTRY: Frame = Frame {
        rsp: Some(8),
        rbp: None,
        rbp_slot: 0,
        rbx_slot: 0,
    };

    /// The row at `pc` for this frame: by the frame pointer where there
    /// is one (rsp may since have moved in ways not followed), else by
    /// rsp, else none.
    fn row(&self, pc: u64) -> Row {
        let (cfa, off) = match (self.rbp, self.rsp) {
            (Some(off), _) => (CFA_RBP, off),
            (None, Some(off)) => (CFA_RSP, off),
            _ => return Row::none(pc),
        };
        Row {
            pc,
            cfa,
            cfa_offset: off,
            rbp_slot: self.rbp_slot,
            rbx_slot: self.rbx_slot,
        }
    }

    /// Whether the frame says where the CFA is.
    fn known(&self) -> bool {
        self.rsp.is_some() || self.rbp.is_some()
    }
}

/// Where the analysis stands between instructions.
#[derive(Clone, Copy, Debug)]
enum State {
    /// Between functions: padding, or the start of the gap.
    Between,
    /// Inside a function.
    In(Frame),
    /// After a return or an unconditional jump: `frame` is the one the
    /// function had before its last epilogue; `padded` once padding
    /// followed, which ends a function unless a branch leads past it.
    After { frame: Frame, padded: bool },
}

/// Instructions that fill the space between functions.
fn padding(ins: &Instruction) -> bool {
    matches!(ins.mnemonic(), Mnemonic::Int3 | Mnemonic::Nop)
}

/// Whether `ins` writes register `reg` (or a part of it) as its first
/// operand, as an instruction that is neither a compare nor a push.
fn writes(ins: &Instruction, reg: Register) -> bool {
    ins.op_count() > 0
        && ins.op0_kind() == OpKind::Register
        && ins.op0_register().full_register() == reg
        && !matches!(
            ins.mnemonic(),
            Mnemonic::Cmp | Mnemonic::Test | Mnemonic::Push | Mnemonic::Bt
        )
}

/// The immediate of `ins`'s second operand, sign-extended, if it has one
/// that fits a CFA offset.
fn immediate(ins: &Instruction) -> Option<i32> {
    match ins.op1_kind() {
        OpKind::Immediate8to64 | OpKind::Immediate32to64 | OpKind::Immediate32 => {
            i32::try_from(ins.immediate(1) as i64).ok()
        }
        _ => None,
    }
}

/// Follows a push (`push`) or pop of a callee-saved register the rules
/// keep (`CfiRule::rbp_slot`, `rbx_slot`) at stack height `rsp` before
/// it: the first push is where the caller's value is saved; a pop from
/// that slot restores it.
fn save_or_restore(slot: &mut i8, rsp: Option<i32>, push: bool) {
    let Some(d) = rsp else {
        return;
    };
    if push {
        // The push stores at CFA - (d + 8).
        if *slot == 0
            && let Ok(s) = i8::try_from(-(d + 8) / 8)
        {
            *slot = s;
        }
    } else if *slot != 0 && i32::from(*slot) == -(d / 8) {
        *slot = 0;
    }
}

/// The frame after `ins` runs in frame `f`: its rsp `None` where the
/// instruction moves rsp in a way not followed.
fn step(ins: &Instruction, f: Frame) -> Frame {
    let mut f = f;
    let add = |v: Option<i32>, by: i32| v.and_then(|v| v.checked_add(by));
    match ins.mnemonic() {
        // The stack is as it was once the callee returns.
        Mnemonic::Call => return f,
        Mnemonic::Push | Mnemonic::Pop if ins.op0_kind() == OpKind::Register => {
            let push = ins.mnemonic() == Mnemonic::Push;
            let slot = match ins.op0_register() {
                // The first push of rbp saves the caller's, unless rbp is
                // this frame's pointer already.
                Register::RBP if !push || f.rbp.is_none() => Some(&mut f.rbp_slot),
                Register::RBX => Some(&mut f.rbx_slot),
                _ => None,
            };
            let rsp = f.rsp;
            if let Some(slot) = slot {
                save_or_restore(slot, rsp, push);
            }
            if !push && ins.op0_register() == Register::RBP {
                // rbp popped is no frame pointer any more.
                f.rbp = None;
            }
            f.rsp = add(f.rsp, if push { 8 } else { -8 });
            return f;
        }
        Mnemonic::Leave => {
            // rsp = rbp, then pop rbp.
            f.rsp = f.rbp.and_then(|off| off.checked_sub(8));
            f.rbp = None;
            f.rbp_slot = 0;
            return f;
        }
        Mnemonic::Enter => {
            return Frame {
                rsp: None,
                rbp: None,
                ..f
            };
        }
        _ => {}
    }
    let sp = ins.stack_pointer_increment();
    if sp != 0 {
        // Pushes and pops of anything else, pushf and popf.
        f.rsp = add(f.rsp, -sp);
    } else if writes(ins, Register::RSP) {
        f.rsp = match (ins.mnemonic(), ins.op1_kind()) {
            (Mnemonic::Sub, _) => immediate(ins).and_then(|n| add(f.rsp, n)),
            (Mnemonic::Add, _) => immediate(ins).and_then(|n| add(f.rsp, n.checked_neg()?)),
            (Mnemonic::Mov, OpKind::Register) if ins.op1_register() == Register::RBP => f.rbp,
            (Mnemonic::Lea, OpKind::Memory) if ins.memory_index() == Register::None => {
                let disp = i32::try_from(ins.memory_displacement64() as i64).ok();
                match ins.memory_base() {
                    Register::RSP => disp.and_then(|d| add(f.rsp, d.checked_neg()?)),
                    Register::RBP => disp.and_then(|d| add(f.rbp, d.checked_neg()?)),
                    _ => None,
                }
            }
            _ => None,
        };
    }
    if writes(ins, Register::RBP) {
        let from_rsp = ins.mnemonic() == Mnemonic::Mov
            && ins.op0_register() == Register::RBP
            && ins.op1_kind() == OpKind::Register
            && ins.op1_register() == Register::RSP;
        // A frame pointer is set right after the caller's rbp is pushed;
        // rsp copied to rbp elsewhere is a value like any other.
        let prologue = f.rbp_slot != 0 && f.rsp == Some(-8 * i32::from(f.rbp_slot));
        f.rbp = if from_rsp && prologue { f.rsp } else { None };
    }
    f
}

/// Whether `ins` lowers the stack as an epilogue does, before a return
/// or a tail call.
fn epilogue(ins: &Instruction) -> bool {
    match ins.mnemonic() {
        Mnemonic::Pop | Mnemonic::Leave => true,
        Mnemonic::Add | Mnemonic::Lea | Mnemonic::Mov => writes(ins, Register::RSP),
        _ => false,
    }
}

/// The rows for the code at file address `addr`, `code` long, which has
/// no CFI: rows where the frame is known, [`CFA_NONE`] rows elsewhere.
pub(super) fn rows(code: &[u8], addr: u64) -> Vec<Row> {
    // The frame each branch carries to its target. A loop's branch back
    // comes after its target, so the code is gone through again with
    // the targets the last pass found, until they are all known.
    let mut targets: HashMap<u64, (Frame, bool)> = HashMap::new();
    for _ in 0..PASSES {
        let before = targets.clone();
        pass(code, addr, &mut targets, None);
        if targets == before {
            break;
        }
    }
    let mut out = Vec::new();
    pass(code, addr, &mut targets, Some(&mut out));
    out
}

/// Marks the function at `entry`, a file's entry point, as the outermost
/// frame up to the padding after it: ld.so's `_start`, which has no CFI,
/// runs on the stack the kernel set up, whose first word is `argc`, not
/// a return address.
pub(super) fn outermost(rows: &mut Vec<Row>, entry: u64) {
    let first = rows.partition_point(|r| r.pc < entry);
    let end = rows[first..]
        .iter()
        .position(|r| r.pc > entry && r.cfa == CFA_NONE)
        .map_or(rows.len(), |k| first + k);
    let mut end_row = Row::none(entry);
    end_row.cfa = CFA_END;
    rows.splice(first..end, [end_row]);
}

/// The passes that gather branch targets before the one that writes the
/// rows, at most: one for forward branches, more for loops within loops
/// and code reached from them.
const PASSES: usize = 8;

/// One pass over the code: the frame at each instruction, from the
/// frames `targets` holds for branch targets, which it adds to; written
/// to `out` as rows where given.
fn pass(
    code: &[u8],
    addr: u64,
    targets: &mut HashMap<u64, (Frame, bool)>,
    mut out: Option<&mut Vec<Row>>,
) {
    let mut emit = |row: Row| {
        if let Some(out) = out.as_deref_mut()
            && out.last().is_none_or(|l| !l.same_rules(&row))
        {
            out.push(row);
        }
    };
    let end = addr + code.len() as u64;
    let mut state = State::Between;
    // Whether the frame followed from one known (the gap's start, a
    // branch's), not from a guess after a return or padding. A branch
    // target's frame from a guess gives way to one from a known frame.
    let mut sure = true;
    // The frame before the current run of epilogue instructions.
    let mut before_epilogue = Frame::ENTRY;
    // The frame at the function's last jump through a table: the code
    // after it, padded or not, is its cases until a function starts.
    let mut switch: Option<Frame> = None;
    let mut after_call = false;
    let mut decoder = Decoder::with_ip(64, code, addr, DecoderOptions::NONE);
    let mut ins = Instruction::default();
    while decoder.can_decode() {
        decoder.decode_out(&mut ins);
        let pc = ins.ip();
        if ins.is_invalid() {
            state = State::Between;
            emit(Row::none(pc));
            continue;
        }
        let known = targets.get(&pc).copied();
        let (frame, from_known) = match (state, known) {
            (State::Between | State::After { .. }, _) if padding(&ins) => {
                if let State::After { frame, .. } = state {
                    state = State::After {
                        frame,
                        padded: true,
                    };
                }
                emit(Row::none(pc));
                continue;
            }
            // A call's fallthrough is dead code where the callee never
            // returns: a branch here says what the frame is.
            (State::In(f), Some((t, true))) if !sure || !f.known() || after_call => (t, true),
            (State::In(f), _) => (f, sure),
            (_, Some(t)) => t,
            (State::Between, None) => {
                switch = None;
                (Frame::ENTRY, true)
            }
            // Code no branch seen leads to: a case of the function's
            // jump table, else the function's code after an epilogue, or
            // past padding a function of its own.
            (State::After { frame, padded }, None) => match switch {
                Some(f) => (f, false),
                None if padded => (Frame::ENTRY, false),
                None => (frame, false),
            },
        };
        sure = from_known;
        emit(frame.row(pc));
        let ends = matches!(
            ins.flow_control(),
            FlowControl::Return
                | FlowControl::UnconditionalBranch
                | FlowControl::IndirectBranch
                | FlowControl::Exception
                | FlowControl::Interrupt
        );
        if !epilogue(&ins) && !ends {
            before_epilogue = frame;
        }
        let next = step(&ins, frame);
        after_call = ins.mnemonic() == Mnemonic::Call;
        let target = ins.near_branch_target();
        if matches!(
            ins.flow_control(),
            FlowControl::ConditionalBranch | FlowControl::UnconditionalBranch
        ) && (addr..end).contains(&target)
            && next.known()
        {
            let slot = targets.entry(target).or_insert((next, sure));
            if sure && !slot.1 {
                *slot = (next, true);
            }
        }
        if ins.flow_control() == FlowControl::IndirectBranch && before_epilogue == frame {
            switch = Some(frame);
        }
        state = if ends {
            State::After {
                frame: before_epilogue,
                padded: false,
            }
        } else {
            State::In(next)
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rustc's `main` around a Rust program's own: no CFI, one push.
    #[test]
    fn rusts_main_shim_is_one_push_deep() {
        let code = [
            0x50, // push rax
            0x48, 0x89, 0xf1, // mov rcx, rsi
            0x48, 0x63, 0xd7, // movsxd rdx, edi
            0xff, 0x15, 0x00, 0x00, 0x00, 0x00, // call [rip]
            0x59, // pop rcx
            0xc3, // ret
            0xcc, 0xcc, // padding
        ];
        let rows = rows(&code, 0x1000);
        let at = |pc: u64| rows.iter().rev().find(|r| r.pc <= pc).copied().unwrap();
        assert_eq!((at(0x1000).cfa, at(0x1000).cfa_offset), (CFA_RSP, 8));
        // The call and the return address after it: rsp + 16.
        assert_eq!((at(0x1007).cfa, at(0x1007).cfa_offset), (CFA_RSP, 16));
        assert_eq!((at(0x100d).cfa, at(0x100d).cfa_offset), (CFA_RSP, 16));
        assert_eq!((at(0x100e).cfa, at(0x100e).cfa_offset), (CFA_RSP, 8));
        assert_eq!(at(0x100f).cfa, CFA_NONE);
    }

    /// ld.so's `_start`, the entry point, has no CFI: it is the outermost
    /// frame up to its padding, and the function after it is not.
    #[test]
    fn the_entry_point_ends_the_stack() {
        let code = [
            0x48, 0x89, 0xe7, // mov rdi, rsp
            0xe8, 0x00, 0x00, 0x00, 0x00, // call
            0x49, 0x89, 0xc4, // mov r12, rax
            0x41, 0xff, 0xe4, // jmp r12
            0xcc, 0xcc, // padding
            0x53, // push rbx
            0x5b, // pop rbx
            0xc3, // ret
        ];
        let mut rows = rows(&code, 0x1000);
        outermost(&mut rows, 0x1000);
        let at = |pc: u64| rows.iter().rev().find(|r| r.pc <= pc).copied().unwrap();
        assert_eq!(at(0x1000).cfa, CFA_END);
        assert_eq!(at(0x100b).cfa, CFA_END);
        assert_eq!(at(0x100e).cfa, CFA_NONE);
        assert_eq!((at(0x1010).cfa, at(0x1010).cfa_offset), (CFA_RSP, 8));
        assert_eq!((at(0x1011).cfa, at(0x1011).cfa_offset), (CFA_RSP, 16));
    }

    /// A frame-pointer prologue: the CFA follows rbp once it is set, and
    /// the saved rbp is found; code after the return gets the body's frame.
    #[test]
    fn a_frame_pointer_is_followed_and_the_code_after_a_return_keeps_the_body() {
        let code = [
            0x55, // push rbp
            0x48, 0x89, 0xe5, // mov rbp, rsp
            0x48, 0x83, 0xe4, 0xe0, // and rsp, -32
            0x85, 0xff, // test edi, edi
            0x74, 0x02, // je +2 (to 0x100e)
            0xc9, // leave
            0xc3, // ret
            0x31, 0xc0, // xor eax, eax
            0xc9, // leave
            0xc3, // ret
        ];
        let rows = rows(&code, 0x1000);
        let at = |pc: u64| rows.iter().rev().find(|r| r.pc <= pc).copied().unwrap();
        assert_eq!(
            (at(0x1001).cfa, at(0x1001).cfa_offset, at(0x1001).rbp_slot),
            (CFA_RSP, 16, -2)
        );
        assert_eq!(
            (at(0x1004).cfa, at(0x1004).cfa_offset, at(0x1004).rbp_slot),
            (CFA_RBP, 16, -2)
        );
        assert_eq!(
            (at(0x100d).cfa, at(0x100d).cfa_offset, at(0x100d).rbp_slot),
            (CFA_RSP, 8, 0)
        );
        assert_eq!((at(0x100e).cfa, at(0x100e).cfa_offset), (CFA_RBP, 16));
        assert_eq!((at(0x1011).cfa, at(0x1011).cfa_offset), (CFA_RSP, 8));
    }
}

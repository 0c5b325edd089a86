//! The C expressions of probe specs, compiled to the generic program's
//! instructions as they are parsed: C's operators (constants folded),
//! casts, `*p`, `p->member` through the kernel's BTF, parameters,
//! tracepoint fields, USDT arguments, `$retval` and the other specials,
//! kernel enums and macros. Filters, which join such expressions with
//! string comparisons, are in `filter`. Errors name their column.

mod filter;

use rtrace_common::argdist::{
    I_BINARY, I_CAST, I_LOAD, I_PUSH, I_UNARY, INSN_SIGNED, INSN_USER, Insn, KIND_ENTRY,
    KIND_RETURN, KIND_TRACEPOINT, MAX_INSNS, MAX_STRINGS, OP_ADD, OP_AND, OP_DIV, OP_EQ, OP_GE,
    OP_GT, OP_LAND, OP_LE, OP_LOR, OP_LT, OP_MOD, OP_MUL, OP_NE, OP_OR, OP_SHL, OP_SHR, OP_SUB,
    OP_XOR, SRC_ARG, SRC_COMM, SRC_CONST, SRC_CPU, SRC_DATA_LOC, SRC_ENTRY_ARG, SRC_EXPR,
    SRC_FIELD, SRC_GID, SRC_LATENCY, SRC_PID, SRC_REG, SRC_RET, SRC_TASK, SRC_TID, SRC_UID,
    STACK_DEPTH, UN_LNOT, UN_NEG, UN_NOT, VAL_SIGNED, VAL_STRING, VAL_USER, Value,
};

use super::ctype::{CType, Pointee, Ty, looks_like_type, parse_type};
use crate::{
    kernel::{
        btf::{Btf, Shape},
        tracefs::{Field, Format},
    },
    probes::usdt,
};

/// A spec that does not parse: what is wrong, and at which column
/// (1-based) of the spec.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("column {column}: {message}")]
pub struct SpecError {
    /// Where, counting from 1.
    pub column: usize,
    /// What.
    pub message: String,
}

/// `Err` at `column`, counted from 0 here and shown from 1.
pub(super) fn err<T>(column: usize, message: impl Into<String>) -> Result<T, SpecError> {
    Err(SpecError {
        column: column + 1,
        message: message.into(),
    })
}

/// Looks the C expression of a kernel macro up by name (`GFP_ATOMIC`):
/// BTF carries enums, not macros.
pub type MacroLookup<'a> = &'a dyn Fn(&str) -> Option<String>;

/// A parameter of the signature.
pub(super) struct Param {
    pub(super) name: String,
    pub(super) ty: Ty,
}

/// What names in expressions refer to.
pub(super) struct Scope<'a> {
    pub(super) kind: u32,
    pub(super) params: Vec<Param>,
    pub(super) format: Option<&'a Format>,
    /// Memory read through pointers is user memory (uprobes, syscalls).
    pub(super) user: bool,
    pub(super) btf: Option<&'a Btf>,
    /// A USDT probe's arguments, `arg1` first.
    pub(super) usdt_args: Option<&'a [usdt::Arg]>,
    /// The C expression of a macro the kernel lists (`GFP_ATOMIC`).
    pub(super) macros: MacroLookup<'a>,
    /// bcc trace's names: `arg1`..`arg6`, `retval`, `$pid` (the thread),
    /// `$tgid`, `$uid`, `$gid`, `$cpu`, `$task`.
    pub(super) bcc_names: bool,
}

/// The program's value of an expression of declared type `ty`: a string
/// in the next string slot of `strings`, or a number. `t_at` and `e_at`
/// are the columns of the type and of the expression.
pub(super) fn compile_value(
    expr: &Expr,
    ty: CType,
    scope: &Scope<'_>,
    (t_at, e_at): (usize, usize),
    strings: &mut u32,
) -> Result<Value, SpecError> {
    let value = if ty.string {
        if !(expr.ty.c.string || expr.ty.c.size == 8 || expr.special.is_some()) {
            return err(e_at, "char* needs a pointer or a string");
        }
        let mut value = expr.value(e_at)?;
        value.flags = VAL_STRING
            | if expr.ty.c.user || scope.user {
                VAL_USER
            } else {
                0
            };
        value.str_slot = *strings;
        *strings += 1;
        if *strings as usize > MAX_STRINGS {
            return err(e_at, format!("at most {MAX_STRINGS} string values"));
        }
        value
    } else {
        if expr.special.is_some() {
            return err(t_at, "this value is a string: declare it char*");
        }
        let mut value = expr.value(e_at)?;
        value.flags = if ty.signed { VAL_SIGNED } else { 0 };
        value
    };
    Ok(value)
}

/// An expression compiled so far: its instructions, its type, and the
/// stack it needs.
#[derive(Debug, Clone)]
pub(super) struct Expr {
    insns: Vec<Insn>,
    ty: Ty,
    /// Values on the stack at its deepest.
    depth: usize,
    /// A string source that is a whole value, not a number: `$COMM`, or a
    /// `__data_loc` field at this record offset.
    special: Option<(u8, u32)>,
    /// Its value, when known without running it.
    constant: Option<u64>,
}

impl Expr {
    fn push(source: u8, ty: Ty) -> Self {
        Self {
            insns: vec![Insn {
                code: I_PUSH,
                source,
                ..Insn::default()
            }],
            ty,
            depth: 1,
            special: None,
            constant: None,
        }
    }

    fn constant(x: u64, ty: Ty) -> Self {
        let mut e = Self::push(SRC_CONST, ty);
        e.insns[0].imm = x;
        e.constant = Some(x);
        e
    }

    pub(super) fn needs_entry(&self) -> bool {
        self.insns
            .iter()
            .any(|i| i.code == I_PUSH && matches!(i.source, SRC_LATENCY | SRC_ENTRY_ARG))
    }

    /// Appends an instruction that works on the topmost value.
    fn then(mut self, insn: Insn) -> Self {
        self.insns.push(insn);
        self.constant = None;
        self
    }

    /// The program's value of this expression, at column `at`.
    fn value(&self, at: usize) -> Result<Value, SpecError> {
        let mut v = Value::default();
        if let Some((source, index)) = self.special {
            v.source = source;
            v.index = index;
            return Ok(v);
        }
        if self.insns.len() > MAX_INSNS {
            return err(
                at,
                format!(
                    "expression too long: {} steps, at most {MAX_INSNS}",
                    self.insns.len()
                ),
            );
        }
        if self.depth > STACK_DEPTH {
            return err(
                at,
                format!("expression nested too deeply: at most {STACK_DEPTH} values at once"),
            );
        }
        v.source = SRC_EXPR;
        v.n_insns = self.insns.len() as u32;
        v.insns[..self.insns.len()].copy_from_slice(&self.insns);
        Ok(v)
    }
}

/// Binary operators by precedence, loosest first, as in C.
const LEVELS: &[&[(&str, u8)]] = &[
    &[("||", OP_LOR)],
    &[("&&", OP_LAND)],
    &[("|", OP_OR)],
    &[("^", OP_XOR)],
    &[("&", OP_AND)],
    &[("==", OP_EQ), ("!=", OP_NE)],
    &[("<=", OP_LE), (">=", OP_GE), ("<", OP_LT), (">", OP_GT)],
    &[("<<", OP_SHL), (">>", OP_SHR)],
    &[("+", OP_ADD), ("-", OP_SUB)],
    &[("*", OP_MUL), ("/", OP_DIV), ("%", OP_MOD)],
];

/// A place in memory named by `->` and `.`: an address computed on the
/// stack, a constant offset from it, and its BTF type.
struct Place {
    base: Expr,
    offset: u64,
    ty: u32,
}

/// A recursive-descent parser over one expression or filter, compiling as
/// it goes.
pub(super) struct ExprParser<'a> {
    text: &'a str,
    at: usize,
    pos: usize,
    scope: &'a Scope<'a>,
}

impl<'a> ExprParser<'a> {
    pub(super) fn new(text: &'a str, at: usize, scope: &'a Scope<'a>) -> Self {
        Self {
            text,
            at,
            pos: 0,
            scope,
        }
    }

    fn col(&self) -> usize {
        self.at + self.pos
    }

    fn rest(&self) -> &'a str {
        &self.text[self.pos..]
    }

    fn skip_ws(&mut self) {
        while self.rest().starts_with(char::is_whitespace) {
            self.pos += 1;
        }
    }

    fn eat(&mut self, s: &str) -> bool {
        self.skip_ws();
        if self.rest().starts_with(s) {
            self.pos += s.len();
            true
        } else {
            false
        }
    }

    pub(super) fn end(&mut self) -> Result<(), SpecError> {
        self.skip_ws();
        if self.rest().is_empty() {
            Ok(())
        } else {
            err(self.col(), format!("unexpected {:?}", self.rest()))
        }
    }

    fn ident(&mut self) -> Option<&'a str> {
        self.skip_ws();
        let len = self
            .rest()
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(self.rest().len());
        if len == 0 || self.rest().starts_with(|c: char| c.is_ascii_digit()) {
            return None;
        }
        let id = &self.rest()[..len];
        self.pos += len;
        Some(id)
    }

    fn number(&mut self) -> Result<u64, SpecError> {
        self.skip_ws();
        let at = self.col();
        let rest = self.rest();
        let (radix, skip) = if rest.starts_with("0x") || rest.starts_with("0X") {
            (16, 2)
        } else {
            (10, 0)
        };
        let len = rest[skip..]
            .find(|c: char| !c.is_ascii_alphanumeric())
            .unwrap_or(rest.len() - skip);
        let digits = &rest[skip..skip + len];
        // C's suffixes (10UL) say nothing here: every value is 64 bits.
        let digits = digits.trim_end_matches(['u', 'U', 'l', 'L']);
        let Ok(n) = u64::from_str_radix(digits, radix) else {
            return err(at, "expected a number");
        };
        self.pos += skip + len;
        Ok(n)
    }

    /// A whole expression: `binary(0)`.
    pub(super) fn expr(&mut self) -> Result<Expr, SpecError> {
        self.binary(0)
    }

    /// Operators of precedence `level` and tighter, left to right.
    fn binary(&mut self, level: usize) -> Result<Expr, SpecError> {
        if level == LEVELS.len() {
            return self.unary();
        }
        let mut lhs = self.binary(level + 1)?;
        loop {
            self.skip_ws();
            let rest = self.rest();
            let Some(&(s, op)) = LEVELS[level].iter().find(|(s, _)| {
                rest.starts_with(s)
                    // `&` is not `&&`, `|` not `||`, `<` not `<<`.
                    && !(s.len() == 1 && rest[1..].starts_with(*s))
                    && !(matches!(*s, "<" | ">") && rest[1..].starts_with('='))
            }) else {
                return Ok(lhs);
            };
            // `x == "text"` is a filter's string comparison, not arithmetic.
            if matches!(op, OP_EQ | OP_NE) && rest[2..].trim_start().starts_with('"') {
                return Ok(lhs);
            }
            let op_at = self.col();
            self.pos += s.len();
            let rhs = self.binary(level + 1)?;
            lhs = self.combine(op_at, op, lhs, rhs)?;
        }
    }

    fn combine(&self, at: usize, op: u8, lhs: Expr, rhs: Expr) -> Result<Expr, SpecError> {
        for e in [&lhs, &rhs] {
            if e.special.is_some() || e.ty.c.string && !matches!(op, OP_EQ | OP_NE) {
                return err(at, "strings take no arithmetic: compare them with \"text\"");
            }
        }
        if matches!(op, OP_SHL | OP_SHR)
            && let Some(n) = rhs.constant
            && n > 63
        {
            return err(at, format!("shift by {n}: at most 63"));
        }
        if matches!(op, OP_DIV | OP_MOD) && rhs.constant == Some(0) {
            return err(at, "division by zero");
        }
        let signed = lhs.ty.c.signed && rhs.ty.c.signed;
        let comparison = matches!(
            op,
            OP_EQ | OP_NE | OP_LT | OP_LE | OP_GT | OP_GE | OP_LAND | OP_LOR
        );
        let ty = if comparison {
            Ty::of(CType::int(4, true))
        } else if lhs.ty.pointee != Pointee::Nothing && matches!(op, OP_ADD | OP_SUB) {
            lhs.ty
        } else {
            Ty::of(CType::int(8, signed))
        };
        let insn = Insn {
            code: I_BINARY,
            op,
            flags: if signed { INSN_SIGNED } else { 0 },
            ..Insn::default()
        };
        if let (Some(x), Some(y)) = (lhs.constant, rhs.constant) {
            return Ok(Expr::constant(
                rtrace_common::argdist::binary(op, signed, x, y),
                ty,
            ));
        }
        let depth = lhs.depth.max(rhs.depth + 1);
        let mut insns = lhs.insns;
        insns.extend(rhs.insns);
        insns.push(insn);
        Ok(Expr {
            insns,
            ty,
            depth,
            special: None,
            constant: None,
        })
    }

    /// `-x`, `~x`, `!x`, `*p`, `(type)x`, or a postfix expression.
    fn unary(&mut self) -> Result<Expr, SpecError> {
        self.skip_ws();
        let at = self.col();
        let un = |op| Insn {
            code: I_UNARY,
            op,
            ..Insn::default()
        };
        if self.rest().starts_with('-') && !self.rest().starts_with("->") {
            self.pos += 1;
            let x = self.numeric(at)?;
            return Ok(match x.constant {
                Some(c) => Expr::constant(c.wrapping_neg(), Ty::of(CType::int(8, true))),
                None => {
                    let mut e = x.then(un(UN_NEG));
                    e.ty = Ty::of(CType::int(8, true));
                    e
                }
            });
        }
        if self.eat("~") {
            let x = self.numeric(at)?;
            return Ok(match x.constant {
                Some(c) => Expr::constant(!c, x.ty),
                None => x.then(un(UN_NOT)),
            });
        }
        if self.rest().starts_with('!') && !self.rest().starts_with("!=") {
            self.pos += 1;
            let x = self.numeric(at)?;
            return Ok(match x.constant {
                Some(c) => Expr::constant(u64::from(c == 0), Ty::of(CType::int(4, true))),
                None => {
                    let mut e = x.then(un(UN_LNOT));
                    e.ty = Ty::of(CType::int(4, true));
                    e
                }
            });
        }
        if self.rest().starts_with('*') {
            self.pos += 1;
            let p = self.unary()?;
            return self.deref(at, p);
        }
        if self.rest().starts_with('(') {
            // A cast if what the parentheses hold is a type.
            let inner = &self.rest()[1..];
            if let Some(close) = inner.find(')') {
                let text = &inner[..close];
                if looks_like_type(text) {
                    let ty = parse_type(text, self.scope.btf).or_else(|m| err(at + 1, m))?;
                    self.pos += close + 2;
                    let x = self.unary()?;
                    return self.cast(at, x, ty);
                }
            }
        }
        self.postfix()
    }

    /// A unary operator's operand, which must be a number.
    fn numeric(&mut self, at: usize) -> Result<Expr, SpecError> {
        let x = self.unary()?;
        if x.special.is_some() || x.ty.c.string {
            return err(at, "strings take no arithmetic");
        }
        Ok(x)
    }

    /// `(ty)x`: cut to the type's size, or the same bits seen as a
    /// pointer.
    fn cast(&self, at: usize, x: Expr, ty: Ty) -> Result<Expr, SpecError> {
        if x.special.is_some() {
            return err(at, "a string cannot be cast");
        }
        if ty.c.size == 8 {
            let mut x = x;
            x.ty = ty;
            return Ok(x);
        }
        let insn = Insn {
            code: I_CAST,
            size: ty.c.size,
            flags: if ty.c.signed { INSN_SIGNED } else { 0 },
            ..Insn::default()
        };
        if let Some(c) = x.constant {
            let v = rtrace_common::argdist::cut(c, ty.c.size, ty.c.signed);
            return Ok(Expr::constant(v, ty));
        }
        let mut e = x.then(insn);
        e.ty = ty;
        Ok(e)
    }

    /// `*p`.
    fn deref(&self, at: usize, p: Expr) -> Result<Expr, SpecError> {
        match p.ty.pointee {
            Pointee::Basic(c) if !c.string => Ok(self.load(p, 0, Ty::of(c))),
            Pointee::Btf(id) => self.materialize(
                at,
                Place {
                    base: p,
                    offset: 0,
                    ty: id,
                },
            ),
            _ => err(
                at,
                "* needs a pointer to a known type: cast it first, as in *(u32 *)p",
            ),
        }
    }

    /// Reads the value of type `ty` at `offset` from the address `base`
    /// computes.
    fn load(&self, base: Expr, offset: u64, ty: Ty) -> Expr {
        let mut flags = if ty.c.signed { INSN_SIGNED } else { 0 };
        if self.scope.user || base.ty.c.user {
            flags |= INSN_USER;
        }
        let mut e = base.then(Insn {
            code: I_LOAD,
            size: ty.c.size,
            flags,
            imm: offset,
            ..Insn::default()
        });
        e.ty = ty;
        e
    }

    /// The value at a place: its number, or for an array its address.
    fn materialize(&self, at: usize, place: Place) -> Result<Expr, SpecError> {
        let btf = self.scope.btf.expect("BTF types come from BTF");
        match btf.shape(place.ty) {
            Shape::Int { size, signed } if [1, 2, 4, 8].contains(&size) => {
                Ok(self.load(place.base, place.offset, Ty::of(CType::int(size, signed))))
            }
            Shape::Pointer(to) => {
                let pointee = match btf.shape(to) {
                    Shape::Struct { .. } => Pointee::Btf(to),
                    Shape::Int { size, signed } => Pointee::Basic(CType::int(size, signed)),
                    _ => Pointee::Nothing,
                };
                let string = matches!(btf.shape(to), Shape::Int { size: 1, .. });
                let mut c = CType::int(8, false);
                c.string = string;
                Ok(self.load(place.base, place.offset, Ty { c, pointee }))
            }
            Shape::Array(elem) => {
                // An array is its address, as in C: `task->comm` is a string.
                let string = matches!(btf.shape(elem), Shape::Int { size: 1, .. });
                let mut c = CType::int(8, false);
                c.string = string;
                let ty = Ty {
                    c,
                    pointee: Pointee::Btf(elem),
                };
                let offset = Expr::constant(place.offset, Ty::of(CType::U64));
                let mut e = self.combine(at, OP_ADD, place.base, offset)?;
                e.ty = ty;
                Ok(e)
            }
            Shape::Struct { name, .. } => err(
                at,
                format!("struct {name} is no number: name one of its members"),
            ),
            other => err(at, format!("cannot read a value of this type ({other:?})")),
        }
    }

    /// A primary expression followed by `->member` and `.member`.
    fn postfix(&mut self) -> Result<Expr, SpecError> {
        let at = self.col();
        let e = self.primary()?;
        let mut place: Option<Place> = None;
        loop {
            self.skip_ws();
            let arrow = self.rest().starts_with("->");
            let dot = !arrow && self.rest().starts_with('.');
            if !arrow && !dot {
                break;
            }
            let op_at = self.col();
            self.pos += if arrow { 2 } else { 1 };
            let m_at = self.col();
            let Some(member) = self.ident() else {
                return err(m_at, "expected a member name");
            };
            let (base, offset, strukt) = match (arrow, place.take()) {
                // `p->m`: p is a pointer to a struct.
                (true, prior) => {
                    let p = match prior {
                        Some(pl) => self.materialize(op_at, pl)?,
                        None => e.clone(),
                    };
                    let Pointee::Btf(id) = p.ty.pointee else {
                        return err(
                            op_at,
                            "-> needs a pointer to a struct: declare it as struct NAME * in the signature, or cast it",
                        );
                    };
                    (p, 0, id)
                }
                // `s.m`: s is a struct reached by `->`.
                (false, Some(pl)) => (pl.base, pl.offset, pl.ty),
                (false, None) => {
                    return err(op_at, ". needs a struct reached through ->, as in p->a.b");
                }
            };
            let btf = self.scope.btf.expect("struct pointers come from BTF");
            let Shape::Struct { id, name } = btf.shape(strukt) else {
                return err(op_at, "this is no struct or union");
            };
            let Some((off, ty)) = btf
                .member_of(id, member)
                .or_else(|| common_member(btf, id, member))
            else {
                let names = btf.member_names(id);
                let shown: Vec<&str> = names.iter().take(12).map(String::as_str).collect();
                return err(
                    m_at,
                    format!(
                        "struct {name} has no member {member:?} (members: {}{})",
                        shown.join(", "),
                        if names.len() > shown.len() {
                            ", ..."
                        } else {
                            ""
                        }
                    ),
                );
            };
            place = Some(Place {
                base,
                offset: offset + u64::from(off),
                ty,
            });
        }
        match place {
            Some(pl) => self.materialize(at, pl),
            None => Ok(e),
        }
    }

    /// A number, `(expr)`, a `$variable`, a parameter, a tracepoint field,
    /// or a named constant of the kernel's enums.
    fn primary(&mut self) -> Result<Expr, SpecError> {
        self.skip_ws();
        let at = self.col();
        if self.rest().starts_with(|c: char| c.is_ascii_digit()) {
            let n = self.number()?;
            return Ok(Expr::constant(n, Ty::of(CType::int(8, true))));
        }
        if self.eat("(") {
            let e = self.expr()?;
            if !self.eat(")") {
                return err(self.col(), "expected )");
            }
            return Ok(e);
        }
        if self.eat("$") {
            return self.special(at);
        }
        // `args->field` names a tracepoint field, as in bcc.
        let args = self.rest().starts_with("args->");
        if args {
            self.pos += "args->".len();
        }
        let name_at = self.col();
        let Some(name) = self.ident() else {
            return err(at, "expected a parameter, field, number or $variable");
        };
        if let Some(f) = self.scope.format {
            if let Ok(field) = f.field(name) {
                return self.field(name_at, name, field);
            }
            if args {
                return err(name_at, self.unknown(name));
            }
        } else if args {
            return err(at, "args-> names tracepoint fields; this is no tracepoint");
        }
        if let Some(args) = self.scope.usdt_args {
            return self.usdt_arg(name_at, name, args);
        }
        if let Some((i, p)) = self.param(name) {
            if self.scope.kind == KIND_RETURN {
                return err(
                    name_at,
                    format!("parameters are gone at return: use $entry({name})"),
                );
            }
            let mut e = Expr::push(SRC_ARG, p.ty);
            e.insns[0].index = i as u32;
            return Ok(e);
        }
        if self.scope.bcc_names
            && let Some(e) = self.bcc_name(name_at, name)?
        {
            return Ok(e);
        }
        if let Some(v) = self.scope.btf.and_then(|b| b.enum_value(name)) {
            return Ok(Expr::constant(v as u64, Ty::of(CType::int(8, true))));
        }
        if let Some(text) = (self.scope.macros)(name) {
            return self.macro_value(name_at, name, &text);
        }
        if name == "NULL" {
            return Ok(Expr::constant(0, Ty::of(CType::U64)));
        }
        err(name_at, self.unknown(name))
    }

    /// A macro's value from the C expression the kernel gives for it,
    /// which must be a constant.
    fn macro_value(&self, at: usize, name: &str, text: &str) -> Result<Expr, SpecError> {
        let scope = Scope {
            kind: KIND_ENTRY,
            params: Vec::new(),
            format: None,
            user: false,
            btf: None,
            usdt_args: None,
            macros: &|_| None,
            bcc_names: false,
        };
        let mut p = ExprParser::new(text, 0, &scope);
        let value = p.expr().and_then(|e| p.end().map(|()| e.constant));
        match value {
            Ok(Some(v)) => Ok(Expr::constant(v, Ty::of(CType::U64))),
            _ => err(
                at,
                format!("{name} is {text:?} in the kernel's tables, which is no constant"),
            ),
        }
    }

    /// `argN` of a USDT probe, read where its note says.
    fn usdt_arg(&self, at: usize, name: &str, args: &[usdt::Arg]) -> Result<Expr, SpecError> {
        let n: usize = match name.strip_prefix("arg").and_then(|n| n.parse().ok()) {
            Some(n) if n >= 1 => n,
            _ => {
                return err(
                    at,
                    format!(
                        "unknown name {name:?}: a USDT probe's values are arg1..arg{}",
                        args.len()
                    ),
                );
            }
        };
        let Some(arg) = args.get(n - 1) else {
            return err(
                at,
                format!("the probe has {} arguments, not {n}", args.len()),
            );
        };
        let ty = Ty::of(CType::int(arg.size, arg.signed));
        let reg = |off: u32| {
            let mut e = Expr::push(SRC_REG, Ty::of(CType::U64));
            e.insns[0].index = off;
            e
        };
        Ok(match arg.location {
            usdt::Location::Constant(c) => Expr::constant(c as u64, ty),
            usdt::Location::Register(off) if arg.size == 8 => {
                let mut e = reg(off);
                e.ty = ty;
                e
            }
            usdt::Location::Register(off) => {
                let mut e = reg(off).then(Insn {
                    code: I_CAST,
                    size: arg.size,
                    flags: if arg.signed { INSN_SIGNED } else { 0 },
                    ..Insn::default()
                });
                e.ty = ty;
                e
            }
            usdt::Location::Memory(off, disp) => self.load(reg(off), disp as u64, ty),
        })
    }

    /// A tracepoint field.
    fn field(&self, at: usize, name: &str, field: &Field) -> Result<Expr, SpecError> {
        if field.c_type.starts_with("__data_loc") {
            let mut e = Expr::push(SRC_CONST, Ty::of(CType::U64));
            e.ty.c.string = true;
            e.special = Some((SRC_DATA_LOC, field.offset));
            return Ok(e);
        }
        if ![1, 2, 4, 8].contains(&field.size) {
            return err(
                at,
                format!(
                    "field {name} is {} bytes: only 1, 2, 4 and 8 can be read",
                    field.size
                ),
            );
        }
        let mut ty = Ty::of(CType::int(field.size, field.signed));
        if field.size == 8
            && field.c_type.contains('*')
            && let Ok(t) = parse_type(&field.c_type, self.scope.btf)
        {
            ty = t;
        }
        let mut e = Expr::push(SRC_FIELD, ty);
        e.insns[0].index = field.offset;
        e.insns[0].size = field.size;
        e.insns[0].flags = if field.signed { INSN_SIGNED } else { 0 };
        Ok(e)
    }

    /// `$retval`, `$latency`, `$entry(param)`, `$PID`, `$TID`, `$COMM`.
    fn special(&mut self, at: usize) -> Result<Expr, SpecError> {
        let Some(name) = self.ident() else {
            return err(at, "expected a special variable after $");
        };
        let ret_only = |what: &str| -> Result<(), SpecError> {
            if self.scope.kind == KIND_RETURN {
                Ok(())
            } else {
                err(at, format!("{what} is only known in return probes (r:)"))
            }
        };
        Ok(match name {
            "retval" => {
                ret_only("$retval")?;
                Expr::push(SRC_RET, Ty::of(CType::int(8, true)))
            }
            "latency" => {
                ret_only("$latency")?;
                Expr::push(SRC_LATENCY, Ty::of(CType::U64))
            }
            "entry" => {
                ret_only("$entry")?;
                if !self.eat("(") {
                    return err(self.col(), "expected ( after $entry");
                }
                let p_at = self.col();
                let pname = self.ident().unwrap_or("");
                let Some((i, p)) = self.param(pname) else {
                    return err(p_at, self.unknown(pname));
                };
                if !self.eat(")") {
                    return err(self.col(), "expected ) after the parameter");
                }
                let mut e = Expr::push(SRC_ENTRY_ARG, p.ty);
                e.insns[0].index = i as u32;
                e
            }
            "pid" if self.scope.bcc_names => Expr::push(SRC_TID, Ty::of(CType::int(4, false))),
            "tgid" if self.scope.bcc_names => Expr::push(SRC_PID, Ty::of(CType::int(4, false))),
            "uid" if self.scope.bcc_names => Expr::push(SRC_UID, Ty::of(CType::int(4, false))),
            "gid" if self.scope.bcc_names => Expr::push(SRC_GID, Ty::of(CType::int(4, false))),
            "cpu" if self.scope.bcc_names => Expr::push(SRC_CPU, Ty::of(CType::int(4, false))),
            "task" if self.scope.bcc_names => {
                let ty =
                    parse_type("struct task_struct *", self.scope.btf).or_else(|m| err(at, m))?;
                Expr::push(SRC_TASK, ty)
            }
            "PID" => Expr::push(SRC_PID, Ty::of(CType::int(4, false))),
            "TID" => Expr::push(SRC_TID, Ty::of(CType::int(4, false))),
            "COMM" => {
                let mut e = Expr::push(SRC_CONST, Ty::of(CType::U64));
                e.ty.c.string = true;
                e.special = Some((SRC_COMM, 0));
                e
            }
            other => {
                return err(
                    at,
                    format!(
                        "unknown special variable ${other}: use $retval, $latency, \
                         $entry(param), $PID, $TID or $COMM"
                    ),
                );
            }
        })
    }

    /// bcc trace's `argN` (a register argument, at a return the one the
    /// entry had; `@user` after it is taken and needs nothing, as reads
    /// pick user or kernel memory by the address) and `retval`; `None`
    /// for other names.
    fn bcc_name(&mut self, at: usize, name: &str) -> Result<Option<Expr>, SpecError> {
        if name == "retval" {
            if self.scope.kind != KIND_RETURN {
                return err(at, "retval is only known in return probes (r:)");
            }
            return Ok(Some(Expr::push(SRC_RET, Ty::of(CType::U64))));
        }
        let Some(n) = name
            .strip_prefix("arg")
            .and_then(|n| n.parse::<u32>().ok())
            .filter(|n| (1..=6).contains(n))
        else {
            return Ok(None);
        };
        if self.scope.kind == KIND_TRACEPOINT {
            return err(at, "a tracepoint's values are its fields: args->NAME");
        }
        let _ = self.eat("@user");
        let source = if self.scope.kind == KIND_RETURN {
            SRC_ENTRY_ARG
        } else {
            SRC_ARG
        };
        let mut ty = Ty::of(CType::U64);
        ty.c.user = self.scope.user;
        let mut e = Expr::push(source, ty);
        e.insns[0].index = n - 1;
        Ok(Some(e))
    }

    fn param(&self, name: &str) -> Option<(usize, &'a Param)> {
        self.scope
            .params
            .iter()
            .enumerate()
            .find(|(_, p)| p.name == name)
    }

    fn unknown(&self, name: &str) -> String {
        let known: Vec<&str> = match self.scope.format {
            Some(f) => f.names(),
            None => self.scope.params.iter().map(|p| p.name.as_str()).collect(),
        };
        let what = if self.scope.format.is_some() {
            "fields"
        } else {
            "parameters"
        };
        if self.scope.bcc_names && self.scope.format.is_none() {
            let params = if known.is_empty() {
                String::new()
            } else {
                format!(", {}", known.join(", "))
            };
            return format!(
                "unknown name {name:?} (arg1..arg6, retval, $pid, $tgid, $uid, $cpu, $task{params}), \
                 and no kernel enum constant has that name"
            );
        }
        if known.is_empty() {
            format!(
                "unknown name {name:?}: the signature declares no parameters, and no kernel enum constant has that name"
            )
        } else {
            format!(
                "unknown name {name:?} ({what}: {}), and no kernel enum constant has that name",
                known.join(", ")
            )
        }
    }
}

/// `struct sock`'s members that are C macros over its common part
/// (`sk_dport` for `__sk_common.skc_dport`), which BTF cannot know of but
/// bcc's examples use: the offset and type of the common part's member.
fn common_member(btf: &Btf, id: u32, member: &str) -> Option<(u32, u32)> {
    let rest = member.strip_prefix("sk_")?;
    let (common_off, common_ty) = btf.member_of(id, "__sk_common")?;
    let Shape::Struct { id: common, .. } = btf.shape(common_ty) else {
        return None;
    };
    let (off, ty) = btf.member_of(common, &format!("skc_{rest}"))?;
    Some((common_off + off, ty))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probes::spec::{
        Env, parse,
        tests::{column, insns, no_tp, parse4},
    };

    #[test]
    fn operators_bind_as_in_c_and_constants_fold() {
        let s = parse4(
            "r:c:read(int fd, char *buf, size_t n):u64:($retval & 0xff) | 1 << 4:$retval * 2 > $entry(n) / 4 + 1 || !$retval",
            false,
            no_tp,
            None,
        )
        .unwrap();
        assert_eq!(
            insns(&s.values[0].value),
            [
                (I_PUSH, SRC_RET, 0, 0),
                (I_PUSH, SRC_CONST, 0, 0xff),
                (I_BINARY, OP_AND, 0, 0),
                (I_PUSH, SRC_CONST, 0, 16),
                (I_BINARY, OP_OR, 0, 0)
            ]
        );
        assert_eq!(s.conds.len(), 1);
        let ops: Vec<u8> = s.conds[0].value.insns[..s.conds[0].value.n_insns as usize]
            .iter()
            .filter(|i| i.code != I_PUSH)
            .map(|i| i.op)
            .collect();
        // ((r*2) > ((e/4)+1)) || !r
        assert_eq!(ops, [OP_MUL, OP_DIV, OP_ADD, OP_GT, UN_LNOT, OP_LOR]);
        assert!(s.need_entry);
    }

    #[test]
    fn casts_and_labels() {
        let s = parse4(
            "r:c:getenv():char*:(char*)$retval;names",
            false,
            no_tp,
            None,
        )
        .unwrap();
        assert_eq!(s.label.as_deref(), Some("names"));
        assert_eq!(s.values[0].value.flags, VAL_STRING | VAL_USER);
        let s = parse4("p:c:f(long x):int:(u8)x", false, no_tp, None).unwrap();
        assert_eq!(
            insns(&s.values[0].value),
            [(I_PUSH, SRC_ARG, 0, 0), (I_CAST, 0, 0, 0)]
        );
        assert_eq!(s.values[0].value.insns[1].size, 1);
        // A parameter in parentheses is no cast.
        let s = parse4("p:c:f(long size):int:(size) * 2", false, no_tp, None).unwrap();
        assert_eq!(s.values[0].value.n_insns, 3);
    }

    #[test]
    fn struct_members_and_enum_constants_from_kernel_btf() {
        let Ok(b) = Btf::from_kernel() else {
            panic!(
                "this test reads /sys/kernel/btf/vmlinux, which every kernel rtrace runs on has"
            );
        };
        let btf = Some(&b);
        let s = parse4(
            "p::do_nanosleep(struct hrtimer_sleeper *t):u64:t->timer.state",
            false,
            no_tp,
            btf,
        )
        .unwrap();
        let sleeper = b.struct_id("hrtimer_sleeper").unwrap();
        let (timer, _) = b.member_of(sleeper, "timer").unwrap();
        let hrtimer = b.struct_id("hrtimer").unwrap();
        let (state, _) = b.member_of(hrtimer, "state").unwrap();
        let v = &s.values[0].value;
        assert_eq!(v.n_insns, 2);
        assert_eq!(
            (v.insns[1].code, v.insns[1].imm),
            (I_LOAD, u64::from(timer + state))
        );
        assert_eq!(v.insns[1].flags & INSN_USER, 0);
        // A user structure by its kernel twin, read from user memory.
        let s = parse4(
            "p:c:nanosleep(struct timespec *req):long:req->tv_nsec",
            false,
            no_tp,
            btf,
        )
        .unwrap();
        let v = &s.values[0].value;
        assert_eq!(
            (v.insns[1].code, v.insns[1].imm, v.insns[1].size),
            (I_LOAD, 8, 8)
        );
        assert_ne!(v.insns[1].flags & INSN_USER, 0);
        // Named constants fold into the expression.
        let atomic = b.enum_value("BPF_ANY").unwrap() as u64;
        let s = parse4("p::f(u64 flags):u64:flags & BPF_ANY", false, no_tp, btf).unwrap();
        assert_eq!(s.values[0].value.insns[1].imm, atomic);
        let spec = "p::do_nanosleep(struct hrtimer_sleeper *t):u64:t->nonesuch";
        let e = parse4(spec, false, no_tp, btf).unwrap_err();
        assert_eq!(e.column, spec.find("nonesuch").unwrap() + 1);
        assert!(e.message.contains("timer"), "{}", e.message);
        let e = parse4("p::f(struct no_such_struct_x *p):u64:p", false, no_tp, btf).unwrap_err();
        assert!(
            e.message.contains("no struct no_such_struct_x"),
            "{}",
            e.message
        );
    }

    #[test]
    fn usdt_arguments_compile_to_register_and_memory_reads() {
        let usdt = |_: &str, _: &str| -> Result<usdt::Probe, String> {
            Ok(usdt::Probe {
                file: "/fix".into(),
                sites: Vec::new(),
                args: ["-8@%rdi", "8@%rsi", "-4@-4(%rsp)", "4@$7"]
                    .iter()
                    .map(|a| usdt::parse_arg(a))
                    .collect::<Result<_, _>>()?,
            })
        };
        let env = Env {
            format: &no_tp,
            usdt: &usdt,
            btf: None,
            macros: &|_| None,
        };
        let s = parse(
            "u:fix:tick():s64,char*,s32,u32:arg1,arg2,arg3,arg4:arg3 < 0",
            false,
            &env,
        )
        .unwrap();
        assert_eq!(insns(&s.values[0].value), [(I_PUSH, SRC_REG, 112, 0)]);
        assert_eq!(s.values[1].value.flags, VAL_STRING | VAL_USER);
        let v = &s.values[2].value;
        assert_eq!(
            insns(v),
            [(I_PUSH, SRC_REG, 152, 0), (I_LOAD, 0, 0, (-4i64) as u64)]
        );
        assert_eq!(
            (v.insns[1].size, v.insns[1].flags),
            (4, INSN_SIGNED | INSN_USER)
        );
        assert_eq!(insns(&s.values[3].value), [(I_PUSH, SRC_CONST, 0, 7)]);
        let e = parse("u:fix:tick():u64:arg5", false, &env).unwrap_err();
        assert!(e.message.contains("4 arguments"), "{}", e.message);
        let e = parse("u:fix:tick(int x):u64:arg1", false, &env).unwrap_err();
        assert!(e.message.contains("no signature"), "{}", e.message);
    }

    #[test]
    fn kernel_macros_from_the_tracepoints_tables() {
        // The expression is kmem:kmalloc's own, from a 6.18 kernel.
        let s = parse4(
            "p::__kmalloc(size_t size, gfp_t flags):size_t:size:flags&GFP_ATOMIC",
            false,
            no_tp,
            None,
        )
        .unwrap();
        assert_eq!(s.conds[0].value.insns[1].imm, (1 << 5) | (1 << 11));
        let (c, m) = column("p::f(u64 flags):u64:flags & GFP_NONESUCH", false);
        assert_eq!(c, "p::f(u64 flags):u64:flags & ".len() + 1);
        assert!(m.contains("GFP_NONESUCH"), "{m}");
    }
}

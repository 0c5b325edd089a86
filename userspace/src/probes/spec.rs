//! bcc's argdist probe specifier, parsed into the generic program's
//! configuration, with errors that point at the column they are about:
//!
//! `{p|r|t|u}:{[library]|category}:function(signature)[:type[,type...]:expr[,expr...][:filter]][#label]`

use rtrace_common::argdist::{
    CMP_EQ, CMP_NE, Cond, I_BINARY, I_CAST, I_LOAD, I_PUSH, I_UNARY, INSN_SIGNED, INSN_USER, Insn,
    KIND_ENTRY, KIND_RETURN, KIND_TRACEPOINT, KIND_USDT, MAX_CONDS, MAX_INSNS, MAX_STRINGS,
    MAX_VALUES, OP_ADD, OP_AND, OP_DIV, OP_EQ, OP_GE, OP_GT, OP_LAND, OP_LE, OP_LOR, OP_LT, OP_MOD,
    OP_MUL, OP_NE, OP_OR, OP_SHL, OP_SHR, OP_SUB, OP_XOR, SRC_ARG, SRC_COMM, SRC_CONST, SRC_CPU,
    SRC_DATA_LOC, SRC_ENTRY_ARG, SRC_EXPR, SRC_FIELD, SRC_GID, SRC_LATENCY, SRC_PID, SRC_REG,
    SRC_RET, SRC_TASK, SRC_TID, SRC_UID, STACK_DEPTH, STR_LEN, UN_LNOT, UN_NEG, UN_NOT, VAL_SIGNED,
    VAL_STRING, VAL_USER, Value,
};

pub mod trace;

use crate::{
    kernel::{
        btf::{Btf, Shape},
        tracefs::Format,
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

fn err<T>(column: usize, message: impl Into<String>) -> Result<T, SpecError> {
    Err(SpecError {
        column: column + 1,
        message: message.into(),
    })
}

/// A C type as far as argdist cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CType {
    /// Bytes.
    pub size: u32,
    /// Signed integer.
    pub signed: bool,
    /// `char *`: a string.
    pub string: bool,
    /// Marked `__user`: a pointer into user memory.
    pub user: bool,
}

impl CType {
    const U64: CType = CType::int(8, false);

    const fn int(size: u32, signed: bool) -> Self {
        Self {
            size,
            signed,
            string: false,
            user: false,
        }
    }
}

/// Parses a C type's text; `None` if it is unknown.
fn c_type(text: &str) -> Option<CType> {
    let user = text.contains("__user");
    let pointers = text.matches('*').count();
    let words: Vec<&str> = text
        .split(|c: char| c.is_whitespace() || c == '*')
        .filter(|w| {
            !w.is_empty() && !matches!(*w, "const" | "volatile" | "__user" | "struct" | "enum")
        })
        .collect();
    let base = words.join(" ");
    if pointers > 0 {
        return Some(CType {
            size: 8,
            signed: false,
            string: pointers == 1 && (base == "char" || base == "unsigned char"),
            user,
        });
    }
    let (size, signed) = match base.as_str() {
        "char" | "s8" | "i8" | "int8_t" | "__s8" | "signed char" => (1, true),
        "unsigned char" | "u8" | "uint8_t" | "__u8" | "bool" | "_Bool" => (1, false),
        "short" | "short int" | "s16" | "i16" | "int16_t" | "__s16" => (2, true),
        "unsigned short" | "unsigned short int" | "u16" | "uint16_t" | "__u16" | "umode_t" => {
            (2, false)
        }
        "int" | "signed" | "signed int" | "s32" | "i32" | "int32_t" | "__s32" | "pid_t" => {
            (4, true)
        }
        "unsigned" | "unsigned int" | "u32" | "uint32_t" | "__u32" | "uid_t" | "gid_t"
        | "gfp_t" | "fmode_t" | "dev_t" => (4, false),
        "long" | "long int" | "long long" | "long long int" | "s64" | "i64" | "int64_t"
        | "__s64" | "ssize_t" | "loff_t" | "off_t" | "time_t" | "ktime_t" => (8, true),
        "unsigned long" | "unsigned long int" | "unsigned long long" | "u64" | "uint64_t"
        | "__u64" | "size_t" | "uintptr_t" | "sector_t" | "void" => (8, false),
        _ => return None,
    };
    Some(CType::int(size, signed))
}

const KNOWN_TYPES: &str = "char*, u8..u64, s8..s64, int, unsigned int, long, \
                           unsigned long, size_t, ssize_t, pid_t and the like, or any pointer";

/// Where a spec's probe goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A kernel function: kprobe or kretprobe.
    Kernel {
        /// Its name.
        function: String,
    },
    /// A function in an executable or library: uprobe or uretprobe.
    User {
        /// The library or executable, as written.
        library: String,
        /// Its name.
        function: String,
    },
    /// A USDT probe: a uprobe at each of its sites.
    Usdt {
        /// `NAME` or `PROVIDER.NAME`, as written.
        probe: String,
        /// The probe, found in the library or executable named.
        found: usdt::Probe,
    },
    /// A tracepoint.
    Tracepoint {
        /// `category`.
        category: String,
        /// `event`.
        event: String,
    },
}

/// One key value of a spec.
#[derive(Debug, Clone)]
pub struct KeyValue {
    /// The expression, as written: the output's name for it.
    pub text: String,
    /// Its declared type.
    pub ty: CType,
    /// How the program computes it.
    pub value: Value,
}

/// A parsed spec.
#[derive(Debug, Clone)]
pub struct Spec {
    /// The spec as given.
    pub raw: String,
    /// `#label`.
    pub label: Option<String>,
    /// `KIND_*`.
    pub kind: u32,
    /// Where it attaches.
    pub target: Target,
    /// The key's values.
    pub values: Vec<KeyValue>,
    /// The filter's comparisons.
    pub conds: Vec<Cond>,
    /// Whether the return probe needs the entry's time or arguments.
    pub need_entry: bool,
    /// No expression was given: each call counts once (`total calls`).
    pub default_expr: bool,
}

impl Spec {
    /// The name output uses: the label, or the spec.
    pub fn name(&self) -> &str {
        self.label.as_deref().unwrap_or(&self.raw)
    }
}

/// What a pointer points to, for `*p`, `p->member` and casts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pointee {
    /// Nothing known (`void *`, `long`).
    Nothing,
    /// A plain C type.
    Basic(CType),
    /// A type of the kernel's BTF.
    Btf(u32),
}

/// An expression's type while it is parsed.
#[derive(Debug, Clone, Copy)]
struct Ty {
    c: CType,
    pointee: Pointee,
}

impl Ty {
    fn of(c: CType) -> Self {
        Self {
            c,
            pointee: Pointee::Nothing,
        }
    }
}

/// A parameter of the signature.
struct Param {
    name: String,
    ty: Ty,
}

/// What names in expressions refer to.
struct Scope<'a> {
    kind: u32,
    params: Vec<Param>,
    format: Option<&'a Format>,
    /// Memory read through pointers is user memory (uprobes, syscalls).
    user: bool,
    btf: Option<&'a Btf>,
    /// A USDT probe's arguments, `arg1` first.
    usdt_args: Option<&'a [usdt::Arg]>,
    /// The C expression of a macro the kernel lists (`GFP_ATOMIC`).
    macros: MacroLookup<'a>,
    /// bcc trace's names: `arg1`..`arg6`, `retval`, `$pid` (the thread),
    /// `$tgid`, `$uid`, `$gid`, `$cpu`, `$task`.
    bcc_names: bool,
}

/// A C type's text as a [`Ty`]: the plain types of [`c_type`], and
/// pointers to structs and unions, found in the kernel's BTF (a user
/// structure by its kernel twin, `__kernel_NAME`, if it has no entry of
/// its own).
fn parse_type(text: &str, btf: Option<&Btf>) -> Result<Ty, String> {
    let pointers = text.matches('*').count();
    let base = text.replace('*', " ");
    let words: Vec<&str> = base
        .split_whitespace()
        .filter(|w| !matches!(*w, "const" | "volatile" | "__user"))
        .collect();
    if let [kind @ ("struct" | "union"), name] = words[..] {
        if pointers != 1 {
            return Err(format!(
                "{kind} {name} is used through one pointer: write {kind} {name} *"
            ));
        }
        let btf = btf.ok_or_else(|| {
            format!("{kind} {name} needs the kernel's BTF, which is not readable")
        })?;
        let id = btf
            .struct_id(name)
            .or_else(|| btf.struct_id(&format!("__kernel_{name}")))
            .ok_or_else(|| format!("the kernel's BTF has no {kind} {name}"))?;
        return Ok(Ty {
            c: CType {
                size: 8,
                signed: false,
                string: false,
                user: text.contains("__user"),
            },
            pointee: Pointee::Btf(id),
        });
    }
    let c =
        c_type(text).ok_or_else(|| format!("unknown type {:?}: use {KNOWN_TYPES}", text.trim()))?;
    let pointee = if pointers == 1 {
        c_type(&text.replacen('*', " ", 1)).map_or(Pointee::Nothing, Pointee::Basic)
    } else {
        Pointee::Nothing
    };
    Ok(Ty { c, pointee })
}

/// Looks a tracepoint's format file up, by category and event.
pub type FormatLookup<'a> = &'a dyn Fn(&str, &str) -> Result<Format, String>;
/// Finds a USDT probe, by library and probe name.
pub type UsdtLookup<'a> = &'a dyn Fn(&str, &str) -> Result<usdt::Probe, String>;

/// Looks the C expression of a kernel macro up by name (`GFP_ATOMIC`):
/// BTF carries enums, not macros.
pub type MacroLookup<'a> = &'a dyn Fn(&str) -> Option<String>;

/// What parsing a spec looks up in the system.
pub struct Env<'a> {
    /// Kernel macros.
    pub macros: MacroLookup<'a>,
    /// A tracepoint's format file.
    pub format: FormatLookup<'a>,
    /// A USDT probe's arguments.
    pub usdt: UsdtLookup<'a>,
    /// The kernel's BTF, for structs and named constants.
    pub btf: Option<&'a Btf>,
}

/// Runs `f` with the look-ups of this system: tracepoint formats from
/// tracefs, USDT probes in files (`pid`'s own mappings first), the
/// kernel's BTF if readable (a kernel without it still takes specs that
/// need no struct or named constant), and GFP macros from `kmem:kmalloc`'s
/// print format (BTF has no macros; read when first needed).
pub fn with_system<R>(pid: Option<u32>, f: impl FnOnce(&Env<'_>) -> R) -> R {
    let format = |cat: &str, event: &str| Format::read(cat, event).map_err(|e| format!("{e}"));
    let usdt = |library: &str, probe: &str| {
        let file = crate::probes::uprobes::resolve(library, pid).map_err(|e| e.to_string())?;
        usdt::find(&file, probe)
    };
    let btf = Btf::from_kernel().ok();
    let symbols = std::cell::OnceCell::new();
    let macros = |name: &str| {
        symbols
            .get_or_init(|| Format::print_symbols("kmem", "kmalloc").unwrap_or_default())
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, e)| e.clone())
    };
    f(&Env {
        format: &format,
        usdt: &usdt,
        btf: btf.as_ref(),
        macros: &macros,
    })
}

/// Parses `spec` for `-H` (`hist`) or `-C`.
pub fn parse(spec: &str, hist: bool, env: &Env<'_>) -> Result<Spec, SpecError> {
    let btf = env.btf;
    // bcc's `#label`, or `;label`; neither inside a string.
    let mut quoted = false;
    let cut = spec.char_indices().find_map(|(i, c)| {
        if c == '"' {
            quoted = !quoted;
        }
        (!quoted && (c == '#' || c == ';')).then_some(i)
    });
    let (body, label) = match cut {
        Some(i) => (&spec[..i], Some(spec[i + 1..].to_owned())),
        None => (spec, None),
    };
    // Parts with their starting columns.
    let mut parts = Vec::new();
    let mut start = 0;
    for (i, c) in body.char_indices() {
        if c == ':' {
            parts.push((start, &body[start..i]));
            start = i + 1;
        }
    }
    parts.push((start, &body[start..]));
    if parts.len() < 3 {
        return err(
            body.len(),
            "expected TYPE:LIBRARY:FUNCTION(SIGNATURE)[:TYPES:EXPRS[:FILTER]], with TYPE p, r or t",
        );
    }
    if parts.len() == 4 {
        return err(
            parts[3].0 + parts[3].1.len(),
            "types need expressions: add :EXPR after the types",
        );
    }
    if parts.len() > 6 {
        return err(
            parts[6].0.saturating_sub(1),
            "too many ':' (a filter cannot contain ':')",
        );
    }
    let kind = match parts[0].1 {
        "p" => KIND_ENTRY,
        "r" => KIND_RETURN,
        "t" => KIND_TRACEPOINT,
        "u" => KIND_USDT,
        other => return err(0, format!("unknown probe type {other:?}: use p, r or t")),
    };
    let (lib_at, library) = parts[1];
    let (func_at, func_part) = parts[2];
    let (function, signature, sig_at) = match func_part.find('(') {
        Some(open) => {
            let Some(close) = func_part.rfind(')') else {
                return err(func_at + func_part.len(), "missing ')' after the signature");
            };
            if close + 1 != func_part.len() {
                return err(func_at + close + 1, "unexpected text after ')'");
            }
            (
                &func_part[..open],
                &func_part[open + 1..close],
                func_at + open + 1,
            )
        }
        None => (func_part, "", func_at + func_part.len()),
    };
    if function.is_empty()
        || !function
            .chars()
            .all(|c| c.is_alphanumeric() || c == '_' || c == '.')
    {
        return err(func_at, format!("bad function name {function:?}"));
    }
    let (target, format) = locate(kind, (lib_at, library), function, (sig_at, signature), env)?;
    let usdt_args = match &target {
        Target::Usdt { found, .. } => Some(found.args.as_slice()),
        _ => None,
    };
    let user = reads_user(&target);
    let scope = Scope {
        kind,
        params: signature_params(signature, sig_at, btf)?,
        format: format.as_ref(),
        user,
        btf,
        usdt_args,
        macros: env.macros,
        bcc_names: false,
    };

    let (types, exprs, default_expr) = if parts.len() >= 5 {
        (parts[3], parts[4], false)
    } else if kind == KIND_RETURN {
        ((0, "int"), (0, "$retval"), false)
    } else {
        ((0, "u64"), (0, "1"), true)
    };
    if default_expr && hist {
        return err(
            body.len(),
            "a histogram needs an expression: add :TYPE:EXPR",
        );
    }
    let type_list = split_list(types);
    let expr_list = split_list(exprs);
    if type_list.len() != expr_list.len() {
        return err(
            exprs.0,
            format!(
                "{} types but {} expressions: give one type per expression",
                type_list.len(),
                expr_list.len()
            ),
        );
    }
    if hist && expr_list.len() != 1 {
        return err(exprs.0, "a histogram takes exactly one expression");
    }
    if expr_list.len() > MAX_VALUES {
        return err(exprs.0, format!("at most {MAX_VALUES} expressions"));
    }
    let mut values = Vec::new();
    let mut need_entry = false;
    let mut strings = 0;
    for ((t_at, t), (e_at, e)) in type_list.into_iter().zip(expr_list) {
        let Some(mut ty) = c_type(t) else {
            return err(
                t_at,
                format!("unknown type {:?}: use {KNOWN_TYPES}", t.trim()),
            );
        };
        // bcc shows $COMM as a string whatever type it is given (its own
        // examples declare it u32).
        if e.trim() == "$COMM" && !hist {
            ty = CType {
                string: true,
                ..CType::U64
            };
        }
        if hist && ty.string {
            return err(t_at, "a histogram needs an integer type, not a string");
        }
        let mut p = ExprParser::new(e, e_at, &scope);
        let expr = p.expr()?;
        p.end()?;
        need_entry |= expr.needs_entry();
        let mut value = compile_value(&expr, ty, &scope, (t_at, e_at), &mut strings)?;
        value.size = ty.size;
        values.push(KeyValue {
            text: e.trim().to_owned(),
            ty,
            value,
        });
    }
    let conds = match parts.get(5) {
        Some(&(at, text)) => {
            let mut p = ExprParser::new(text, at, &scope);
            let (conds, entry) = p.filter()?;
            need_entry |= entry;
            conds
        }
        None => Vec::new(),
    };
    Ok(Spec {
        raw: spec.to_owned(),
        label,
        kind,
        target,
        values,
        conds,
        need_entry,
        default_expr,
    })
}

/// The program's value of an expression of declared type `ty`: a string
/// in the next string slot of `strings`, or a number. `t_at` and `e_at`
/// are the columns of the type and of the expression.
fn compile_value(
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

/// Where a probe of `kind` on `library` (or category) and `function`
/// goes, and the tracepoint's format if it is one; `signature` must be
/// empty for tracepoints and USDT probes. Columns are the parts' own.
fn locate(
    kind: u32,
    (lib_at, library): (usize, &str),
    function: &str,
    (sig_at, signature): (usize, &str),
    env: &Env<'_>,
) -> Result<(Target, Option<Format>), SpecError> {
    let target = match kind {
        KIND_TRACEPOINT => {
            if library.is_empty() {
                return err(
                    lib_at,
                    "a tracepoint needs its category, as in t:sched:sched_switch",
                );
            }
            if !signature.trim().is_empty() {
                return err(
                    sig_at,
                    "tracepoints take no signature: name fields as args->FIELD",
                );
            }
            Target::Tracepoint {
                category: library.to_owned(),
                event: function.to_owned(),
            }
        }
        KIND_USDT => {
            if library.is_empty() {
                return err(
                    lib_at,
                    "a USDT probe needs its library or executable, as in u:pthread:pthread_start",
                );
            }
            if !signature.trim().is_empty() {
                return err(
                    sig_at,
                    "USDT probes take no signature: name arguments arg1..argN",
                );
            }
            // Looked up once: the arguments compile against what is
            // attached.
            let found = (env.usdt)(library, function).map_err(|m| SpecError {
                column: lib_at + 1,
                message: m,
            })?;
            Target::Usdt {
                probe: function.to_owned(),
                found,
            }
        }
        _ if library.is_empty() => Target::Kernel {
            function: function.to_owned(),
        },
        _ => Target::User {
            library: library.to_owned(),
            function: function.to_owned(),
        },
    };
    let format = match &target {
        Target::Tracepoint { category, event } => {
            Some((env.format)(category, event).map_err(|m| SpecError {
                column: lib_at + 1,
                message: m,
            })?)
        }
        _ => None,
    };
    Ok((target, format))
}

/// Whether memory read through a probe's pointers is user memory:
/// uprobes', USDT probes' and syscall tracepoints'.
fn reads_user(target: &Target) -> bool {
    match target {
        Target::User { .. } | Target::Usdt { .. } => true,
        Target::Tracepoint { category, .. } => category == "syscalls",
        Target::Kernel { .. } => false,
    }
}

/// Splits a comma-separated list, keeping each item's column.
fn split_list((at, text): (usize, &str)) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut depth = 0i32;
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push((at + start, &text[start..i]));
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push((at + start, &text[start..]));
    out
}

fn signature_params(sig: &str, at: usize, btf: Option<&Btf>) -> Result<Vec<Param>, SpecError> {
    let mut params = Vec::new();
    if sig.trim().is_empty() || sig.trim() == "void" {
        return Ok(params);
    }
    for (p_at, p) in split_list((at, sig)) {
        let p = p.trim();
        let name_start = p
            .rfind(|c: char| !(c.is_alphanumeric() || c == '_'))
            .map_or(0, |i| i + 1);
        let (ty, name) = (&p[..name_start], &p[name_start..]);
        if name.is_empty() || ty.trim().is_empty() {
            return err(
                p_at,
                format!("parameter {p:?} needs a type and a name, as in size_t size"),
            );
        }
        let ty = parse_type(ty, btf).or_else(|m| err(p_at, m))?;
        params.push(Param {
            name: name.to_owned(),
            ty,
        });
    }
    if params.len() > 6 {
        return err(at, "only the first six parameters are in registers");
    }
    Ok(params)
}

/// An expression compiled so far: its instructions, its type, and the
/// stack it needs.
#[derive(Debug, Clone)]
struct Expr {
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

    fn needs_entry(&self) -> bool {
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
struct ExprParser<'a> {
    text: &'a str,
    at: usize,
    pos: usize,
    scope: &'a Scope<'a>,
}

impl<'a> ExprParser<'a> {
    fn new(text: &'a str, at: usize, scope: &'a Scope<'a>) -> Self {
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

    fn end(&mut self) -> Result<(), SpecError> {
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
    fn expr(&mut self) -> Result<Expr, SpecError> {
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
    fn field(
        &self,
        at: usize,
        name: &str,
        field: &crate::kernel::tracefs::Field,
    ) -> Result<Expr, SpecError> {
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

    /// Terms joined by `&&` and `||` at the top level: each a string
    /// comparison or a number that must be nonzero. A filter with no
    /// string in it is one expression. Returns whether it needs the
    /// entry of a return probe.
    fn filter(&mut self) -> Result<(Vec<Cond>, bool), SpecError> {
        let start = self.pos;
        if !self.text.contains('"') {
            let e = self.expr()?;
            self.end()?;
            let at = self.at + start;
            let entry = e.needs_entry();
            if e.special.is_some() || e.ty.c.string {
                return err(at, "a string compares with a \"string\"");
            }
            let mut value = e.value(at)?;
            value.size = 8;
            return Ok((
                vec![Cond {
                    value,
                    cmp: CMP_NE,
                    or_next: 0,
                    text: [0; STR_LEN],
                }],
                entry,
            ));
        }
        let mut conds = Vec::new();
        let mut entry = false;
        loop {
            if conds.len() == MAX_CONDS {
                return err(
                    self.col(),
                    format!("at most {MAX_CONDS} terms with strings in them"),
                );
            }
            let (c, e) = self.cond()?;
            entry |= e;
            conds.push(c);
            if self.eat("||") {
                conds.last_mut().expect("just pushed").or_next = 1;
            } else if !self.eat("&&") {
                break;
            }
        }
        self.end()?;
        Ok((conds, entry))
    }

    /// One term of a filter with strings: `expr == "text"`, `expr !=
    /// "text"`, bcc's `STRCMP("text", expr)`, or a number above `&&`.
    fn cond(&mut self) -> Result<(Cond, bool), SpecError> {
        self.skip_ws();
        let at = self.col();
        if self.eat("STRCMP(") {
            let text = self.string()?;
            if !self.eat(",") {
                return err(self.col(), "expected , after the string");
            }
            let e = self.binary(2)?;
            if !self.eat(")") {
                return err(self.col(), "expected )");
            }
            return self.string_cond(at, e, CMP_EQ, &text);
        }
        // Above `&&`, so that the loop sees the joins.
        let e = self.binary(2)?;
        self.skip_ws();
        let save = self.pos;
        let cmp = if self.eat("==") {
            Some(CMP_EQ)
        } else if self.eat("!=") {
            Some(CMP_NE)
        } else {
            None
        };
        if let Some(cmp) = cmp {
            self.skip_ws();
            if self.rest().starts_with('"') {
                let text = self.string()?;
                return self.string_cond(at, e, cmp, &text);
            }
            self.pos = save;
        }
        if e.special.is_some() {
            return err(self.col(), "a string compares with a \"string\"");
        }
        let entry = e.needs_entry();
        let mut value = e.value(at)?;
        value.size = 8;
        Ok((
            Cond {
                value,
                cmp: CMP_NE,
                or_next: 0,
                text: [0; STR_LEN],
            },
            entry,
        ))
    }

    fn string_cond(
        &self,
        at: usize,
        e: Expr,
        cmp: u32,
        text: &str,
    ) -> Result<(Cond, bool), SpecError> {
        if !(e.ty.c.string || e.ty.c.size == 8 || e.special.is_some()) {
            return err(
                at,
                "only a string (char*, $COMM) compares with a \"string\"",
            );
        }
        if text.len() >= STR_LEN {
            return err(at, format!("strings are kept to {} bytes", STR_LEN - 1));
        }
        let entry = e.needs_entry();
        let mut value = e.value(at)?;
        value.flags = VAL_STRING
            | if e.ty.c.user || self.scope.user {
                VAL_USER
            } else {
                0
            };
        let mut buf = [0; STR_LEN];
        buf[..text.len()].copy_from_slice(text.as_bytes());
        Ok((
            Cond {
                value,
                cmp,
                or_next: 0,
                text: buf,
            },
            entry,
        ))
    }

    fn string(&mut self) -> Result<String, SpecError> {
        self.skip_ws();
        let at = self.col();
        if !self.eat("\"") {
            return err(at, "expected a \"string\"");
        }
        let Some(end) = self.rest().find('"') else {
            return err(at, "unterminated string");
        };
        let s = self.rest()[..end].to_owned();
        self.pos += end + 1;
        Ok(s)
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

/// Whether the text inside parentheses names a type, making them a cast:
/// a pointer, `struct`/`union`, or a known plain type.
fn looks_like_type(text: &str) -> bool {
    let t = text.trim();
    // `(size * 2)` is no pointer type: what the stars leave must be one.
    t.starts_with("struct ") || t.starts_with("union ") || c_type(&t.replace('*', " ")).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_usdt(_: &str, _: &str) -> Result<usdt::Probe, String> {
        Err("no USDT probes in this test".into())
    }

    /// [`parse`] with these look-ups.
    fn parse4(
        spec: &str,
        hist: bool,
        format: fn(&str, &str) -> Result<Format, String>,
        btf: Option<&Btf>,
    ) -> Result<Spec, SpecError> {
        parse(
            spec,
            hist,
            &Env {
                format: &format,
                usdt: &no_usdt,
                btf,
                macros: &|name| {
                    (name == "GFP_ATOMIC")
                        .then(|| "( unsigned long)((( gfp_t)((((1UL))) << (5)))|(( gfp_t)((((1UL))) << (11))))".to_owned())
                },
            },
        )
    }

    fn no_tp(_: &str, _: &str) -> Result<Format, String> {
        Err("no tracepoints in this test".into())
    }

    fn write_tp(_: &str, _: &str) -> Result<Format, String> {
        Ok(Format::parse(
            "syscalls:sys_enter_write",
            "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
             \tfield:int __syscall_nr;\toffset:8;\tsize:4;\tsigned:1;\n\
             \tfield:unsigned int fd;\toffset:16;\tsize:8;\tsigned:0;\n\
             \tfield:const char * buf;\toffset:24;\tsize:8;\tsigned:0;\n\
             \tfield:size_t count;\toffset:32;\tsize:8;\tsigned:0;\n",
        ))
    }

    /// (code, source or op, index, constant) of each instruction.
    fn insns(v: &Value) -> Vec<(u8, u8, u32, u64)> {
        v.insns[..v.n_insns as usize]
            .iter()
            .map(|i| {
                let what = if i.code == I_PUSH { i.source } else { i.op };
                (i.code, what, i.index, i.imm)
            })
            .collect()
    }

    fn column(spec: &str, hist: bool) -> (usize, String) {
        let e = parse4(spec, hist, write_tp, None).unwrap_err();
        (e.column, e.message)
    }

    #[test]
    fn entry_probe_with_two_values_and_a_filter() {
        let s = parse4(
            "p:c:malloc(size_t size, char *name):size_t,char*:size,name:size>16 && name==\"x\"#allocs",
            false,
            no_tp,
            None,
        )
        .unwrap();
        assert_eq!(s.label.as_deref(), Some("allocs"));
        assert_eq!(
            s.target,
            Target::User {
                library: "c".into(),
                function: "malloc".into()
            }
        );
        assert_eq!(s.values.len(), 2);
        assert_eq!(insns(&s.values[0].value), [(I_PUSH, SRC_ARG, 0, 0)]);
        assert_eq!(s.values[1].value.flags, VAL_STRING | VAL_USER);
        assert_eq!(s.conds.len(), 2);
        assert_eq!(
            insns(&s.conds[0].value),
            [
                (I_PUSH, SRC_ARG, 0, 0),
                (I_PUSH, SRC_CONST, 0, 16),
                (I_BINARY, OP_GT, 0, 0)
            ]
        );
        assert_eq!(&s.conds[1].text[..2], b"x\0");
    }

    #[test]
    fn return_probe_specials() {
        let s = parse4(
            "r::vfs_read(void *f, void *b, size_t n):u64,u64:$latency/1000,$entry(n)",
            false,
            no_tp,
            None,
        )
        .unwrap();
        assert!(s.need_entry);
        assert_eq!(
            insns(&s.values[0].value),
            [
                (I_PUSH, SRC_LATENCY, 0, 0),
                (I_PUSH, SRC_CONST, 0, 1000),
                (I_BINARY, OP_DIV, 0, 0)
            ]
        );
        assert_eq!(insns(&s.values[1].value), [(I_PUSH, SRC_ENTRY_ARG, 2, 0)]);
        let d = parse4("r::vfs_read()", false, no_tp, None).unwrap();
        assert_eq!(insns(&d.values[0].value), [(I_PUSH, SRC_RET, 0, 0)]);
        assert!(
            parse4("p::vfs_read()", false, no_tp, None)
                .unwrap()
                .default_expr
        );
    }

    #[test]
    fn tracepoint_fields() {
        let s = parse4(
            "t:syscalls:sys_enter_write():u64:args->count:fd==1",
            true,
            write_tp,
            None,
        )
        .unwrap();
        assert_eq!(insns(&s.values[0].value), [(I_PUSH, SRC_FIELD, 32, 0)]);
        assert_eq!(s.conds[0].value.insns[0].index, 16);
    }

    #[test]
    fn errors_point_at_their_column() {
        // 1-based columns of the offending text.
        let spec = "p:c:malloc(size_t size):size_t:sz";
        assert_eq!(column(spec, false).0, spec.find(":sz").unwrap() + 2);
        assert!(column(spec, false).1.contains("parameters: size"));
        let spec = "t:syscalls:sys_enter_write():u64:args->cnt";
        assert_eq!(column(spec, false).0, spec.find("cnt").unwrap() + 1);
        assert!(column(spec, false).1.contains("count"));
        let spec = "p:c:malloc(size_t size):size_t:size:size >> ";
        let (c, m) = column(spec, false);
        assert!(m.contains("number"), "{m}");
        assert_eq!(c, spec.len() + 1);
        assert_eq!(column("x:c:malloc()", false).0, 1);
        let spec = "p:c:malloc(size_t size):floaty:size";
        assert_eq!(column(spec, false).0, spec.find("floaty").unwrap() + 1);
        let spec = "p:c:malloc(size_t size):u64:size:size ~ 3";
        assert_eq!(column(spec, false).0, spec.find('~').unwrap() + 1);
        let spec = "p:c:malloc(size_t size):u64:size<<70";
        let (c, m) = column(spec, false);
        assert_eq!(
            (c, m.as_str()),
            (spec.find("<<").unwrap() + 1, "shift by 70: at most 63")
        );
        let spec = "p:c:malloc(size_t size):u64:size/(2-2)";
        assert_eq!(column(spec, false).1, "division by zero");
        let spec = "p:c:malloc(size_t size):u64:size->x";
        assert_eq!(column(spec, false).0, spec.find("->").unwrap() + 1);
        let spec = "p:c:malloc(size_t size):u64:((((size+1)*2+3)*4+5)*6)+(1+(2+(3+(4+size))))";
        assert!(
            column(spec, false).1.contains("too"),
            "{}",
            column(spec, false).1
        );
        let spec = "p:c:malloc(size_t size):u64:$latency";
        assert_eq!(column(spec, false).0, spec.find('$').unwrap() + 1);
        assert!(
            column("p:c:malloc()", true)
                .1
                .contains("needs an expression")
        );
        let spec = "p:c:malloc(size_t size):u64,u64:size";
        assert!(column(spec, false).1.contains("2 types but 1 expressions"));
    }

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

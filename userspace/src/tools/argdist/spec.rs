//! bcc's argdist probe specifier, parsed into the generic program's
//! configuration, with errors that point at the column they are about:
//!
//! `{p|r|t}:{[library]|category}:function(signature)[:type[,type...]:expr[,expr...][:filter]][#label]`

use rtrace_common::argdist::{
    CMP_EQ, CMP_GE, CMP_GT, CMP_LE, CMP_LT, CMP_NE, Cond, KIND_ENTRY, KIND_RETURN, KIND_TRACEPOINT,
    MAX_CONDS, MAX_STRINGS, MAX_VALUES, OP_ADD, OP_AND, OP_DIV, OP_MUL, OP_NONE, OP_SHL, OP_SHR,
    OP_SUB, SRC_ARG, SRC_COMM, SRC_CONST, SRC_DATA_LOC, SRC_ENTRY_ARG, SRC_FIELD, SRC_LATENCY,
    SRC_PID, SRC_RET, SRC_TID, STR_LEN, VAL_SIGNED, VAL_STRING, VAL_USER, Value,
};

use crate::tracefs::Format;

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

/// A parameter of the signature.
struct Param {
    name: String,
    ty: CType,
}

/// What names in expressions refer to.
struct Scope<'a> {
    kind: u32,
    params: Vec<Param>,
    format: Option<&'a Format>,
    /// Strings read through pointers are user memory (uprobes, syscalls).
    user: bool,
}

/// Parses `spec` for `-H` (`hist`) or `-C`. `format` reads a tracepoint's
/// format file, given its category and event.
pub fn parse(
    spec: &str,
    hist: bool,
    format: impl Fn(&str, &str) -> Result<Format, String>,
) -> Result<Spec, SpecError> {
    let (body, label) = match spec.find('#') {
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
        "u" => {
            return err(
                0,
                "USDT probes (u:) are not supported; use p:LIBRARY:FUNCTION for a uprobe",
            );
        }
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
            Some(format(category, event).map_err(|m| SpecError {
                column: lib_at + 1,
                message: m,
            })?)
        }
        _ => None,
    };
    let user = match &target {
        Target::User { .. } => true,
        Target::Tracepoint { category, .. } => category == "syscalls",
        Target::Kernel { .. } => false,
    };
    let scope = Scope {
        kind,
        params: signature_params(signature, sig_at)?,
        format: format.as_ref(),
        user,
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
        let Some(ty) = c_type(t) else {
            return err(
                t_at,
                format!("unknown type {:?}: use {KNOWN_TYPES}", t.trim()),
            );
        };
        if hist && ty.string {
            return err(t_at, "a histogram needs an integer type, not a string");
        }
        let mut p = ExprParser::new(e, e_at, &scope);
        let (mut value, natural) = p.expr()?;
        p.end()?;
        need_entry |= matches!(value.source, SRC_LATENCY | SRC_ENTRY_ARG);
        if ty.string {
            if !(natural.string || natural.size == 8 || value.source == SRC_DATA_LOC) {
                return err(e_at, "char* needs a pointer or a string");
            }
            if value.op != OP_NONE {
                return err(e_at, "a string takes no arithmetic");
            }
            value.flags = VAL_STRING
                | if natural.user || scope.user {
                    VAL_USER
                } else {
                    0
                };
            value.str_slot = strings;
            strings += 1;
            if strings as usize > MAX_STRINGS {
                return err(e_at, format!("at most {MAX_STRINGS} string values"));
            }
        } else {
            if matches!(value.source, SRC_COMM | SRC_DATA_LOC) {
                return err(t_at, "this value is a string: declare it char*");
            }
            value.size = ty.size;
            value.flags = if ty.signed { VAL_SIGNED } else { 0 };
        }
        values.push(KeyValue {
            text: e.trim().to_owned(),
            ty,
            value,
        });
    }
    let conds = match parts.get(5) {
        Some(&(at, text)) => {
            let mut p = ExprParser::new(text, at, &scope);
            let conds = p.filter()?;
            need_entry |= conds
                .iter()
                .any(|c| matches!(c.value.source, SRC_LATENCY | SRC_ENTRY_ARG));
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

/// Splits a comma-separated list, keeping each item's column.
fn split_list((at, text): (usize, &str)) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut start = 0;
    for (i, c) in text.char_indices() {
        if c == ',' {
            out.push((at + start, &text[start..i]));
            start = i + 1;
        }
    }
    out.push((at + start, &text[start..]));
    out
}

fn signature_params(sig: &str, at: usize) -> Result<Vec<Param>, SpecError> {
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
        let Some(ty) = c_type(ty) else {
            return err(
                p_at,
                format!("unknown type {:?}: use {KNOWN_TYPES}", ty.trim()),
            );
        };
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

/// A recursive-descent parser over one expression or filter.
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
        let neg = self.eat("-");
        let rest = self.rest();
        let (radix, skip) = if rest.starts_with("0x") || rest.starts_with("0X") {
            (16, 2)
        } else {
            (10, 0)
        };
        let len = rest[skip..]
            .find(|c: char| !c.is_ascii_hexdigit())
            .unwrap_or(rest.len() - skip);
        let digits = &rest[skip..skip + len];
        let Ok(n) = u64::from_str_radix(digits, radix) else {
            return err(at, "expected a number");
        };
        self.pos += skip + len;
        Ok(if neg { n.wrapping_neg() } else { n })
    }

    /// `term [op number]`; returns the value and the term's own type.
    fn expr(&mut self) -> Result<(Value, CType), SpecError> {
        let (mut v, ty) = self.term()?;
        self.skip_ws();
        let ops = [
            (">>", OP_SHR),
            ("<<", OP_SHL),
            ("+", OP_ADD),
            ("-", OP_SUB),
            ("*", OP_MUL),
            ("/", OP_DIV),
            ("&", OP_AND),
        ];
        for (s, op) in ops {
            // `&&` joins comparisons; it is no operator here.
            if self.rest().starts_with(s) && !self.rest().starts_with("&&") {
                if v.source == SRC_CONST || ty.string {
                    return err(self.col(), "arithmetic needs a numeric value on its left");
                }
                self.pos += s.len();
                let at = self.col();
                v.op = op;
                v.imm = self.number()?;
                if op == OP_DIV && v.imm == 0 {
                    return err(at, "division by zero");
                }
                break;
            }
        }
        Ok((v, ty))
    }

    fn term(&mut self) -> Result<(Value, CType), SpecError> {
        self.skip_ws();
        let at = self.col();
        let mut v = Value {
            size: 8,
            ..Value::default()
        };
        if self
            .rest()
            .starts_with(|c: char| c.is_ascii_digit() || c == '-')
        {
            v.source = SRC_CONST;
            v.imm = self.number()?;
            return Ok((v, CType::U64));
        }
        if self.eat("$") {
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
            let ty = match name {
                "retval" => {
                    ret_only("$retval")?;
                    v.source = SRC_RET;
                    CType::int(8, true)
                }
                "latency" => {
                    ret_only("$latency")?;
                    v.source = SRC_LATENCY;
                    CType::U64
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
                    v.source = SRC_ENTRY_ARG;
                    v.index = i as u32;
                    p.ty
                }
                "PID" => {
                    v.source = SRC_PID;
                    CType::int(4, false)
                }
                "TID" => {
                    v.source = SRC_TID;
                    CType::int(4, false)
                }
                "COMM" => {
                    v.source = SRC_COMM;
                    CType {
                        string: true,
                        ..CType::int(8, false)
                    }
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
            };
            return Ok((v, ty));
        }
        // `args->field` names a tracepoint field, as in bcc.
        let arrow = self.eat("args->");
        let name_at = self.col();
        let Some(name) = self.ident() else {
            return err(at, "expected a parameter, field, number or $variable");
        };
        if let Some(f) = self.scope.format {
            let Ok(field) = f.field(name) else {
                return err(name_at, self.unknown(name));
            };
            v.index = field.offset;
            v.size = field.size;
            let string_ty = field.c_type.contains("char") && field.c_type.contains('*');
            if field.c_type.starts_with("__data_loc") {
                v.source = SRC_DATA_LOC;
                return Ok((
                    v,
                    CType {
                        string: true,
                        ..CType::U64
                    },
                ));
            }
            if ![1, 2, 4, 8].contains(&field.size) {
                return err(
                    name_at,
                    format!(
                        "field {name} is {} bytes: only 1, 2, 4 and 8 can be read",
                        field.size
                    ),
                );
            }
            v.source = SRC_FIELD;
            let mut ty = CType::int(field.size, field.signed);
            ty.string = string_ty;
            return Ok((v, ty));
        }
        if arrow {
            return err(at, "args-> names tracepoint fields; this is no tracepoint");
        }
        if self.scope.kind == KIND_RETURN {
            return err(
                name_at,
                format!("parameters are gone at return: use $entry({name})"),
            );
        }
        let Some((i, p)) = self.param(name) else {
            return err(name_at, self.unknown(name));
        };
        v.source = SRC_ARG;
        v.index = i as u32;
        Ok((v, p.ty))
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
        if known.is_empty() {
            format!("unknown name {name:?}: the signature declares no parameters")
        } else {
            format!("unknown name {name:?} ({what}: {})", known.join(", "))
        }
    }

    /// `cond (('&&' | '||') cond)*`.
    fn filter(&mut self) -> Result<Vec<Cond>, SpecError> {
        let mut conds = Vec::new();
        loop {
            if conds.len() == MAX_CONDS {
                return err(self.col(), format!("at most {MAX_CONDS} comparisons"));
            }
            conds.push(self.cond()?);
            if self.eat("||") {
                conds.last_mut().unwrap().or_next = 1;
            } else if !self.eat("&&") {
                break;
            }
        }
        self.end()?;
        Ok(conds)
    }

    /// `expr CMP (number | "string")`, or bcc's `STRCMP("string", expr)`.
    fn cond(&mut self) -> Result<Cond, SpecError> {
        self.skip_ws();
        let at = self.col();
        if self.eat("STRCMP(") {
            let text = self.string()?;
            if !self.eat(",") {
                return err(self.col(), "expected , after the string");
            }
            let (value, ty) = self.expr()?;
            if !self.eat(")") {
                return err(self.col(), "expected )");
            }
            return self.string_cond(at, value, ty, CMP_EQ, &text);
        }
        let (value, ty) = self.expr()?;
        self.skip_ws();
        let cmp_at = self.col();
        let cmps = [
            ("==", CMP_EQ),
            ("!=", CMP_NE),
            ("<=", CMP_LE),
            (">=", CMP_GE),
            ("<", CMP_LT),
            (">", CMP_GT),
        ];
        let Some(&(s, cmp)) = cmps.iter().find(|(s, _)| self.rest().starts_with(s)) else {
            return err(cmp_at, "expected a comparison: ==, !=, <, <=, > or >=");
        };
        self.pos += s.len();
        self.skip_ws();
        if self.rest().starts_with('"') {
            let text = self.string()?;
            if cmp != CMP_EQ && cmp != CMP_NE {
                return err(cmp_at, "strings compare only with == and !=");
            }
            return self.string_cond(at, value, ty, cmp, &text);
        }
        if matches!(value.source, SRC_COMM | SRC_DATA_LOC) {
            return err(self.col(), "a string compares with a \"string\"");
        }
        let imm = self.number()?;
        let mut value = value;
        value.size = ty.size;
        value.flags = if ty.signed { VAL_SIGNED } else { 0 };
        Ok(Cond {
            value,
            cmp,
            or_next: 0,
            imm,
            text: [0; STR_LEN],
        })
    }

    fn string_cond(
        &self,
        at: usize,
        mut value: Value,
        ty: CType,
        cmp: u32,
        text: &str,
    ) -> Result<Cond, SpecError> {
        if !(ty.string || ty.size == 8 || value.source == SRC_DATA_LOC) || value.op != OP_NONE {
            return err(
                at,
                "only a string (char*, $COMM) compares with a \"string\"",
            );
        }
        if text.len() >= STR_LEN {
            return err(at, format!("strings are kept to {} bytes", STR_LEN - 1));
        }
        value.flags = VAL_STRING
            | if ty.user || self.scope.user {
                VAL_USER
            } else {
                0
            };
        let mut buf = [0; STR_LEN];
        buf[..text.len()].copy_from_slice(text.as_bytes());
        Ok(Cond {
            value,
            cmp,
            or_next: 0,
            imm: 0,
            text: buf,
        })
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

#[cfg(test)]
mod tests {
    use super::*;

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

    fn column(spec: &str, hist: bool) -> (usize, String) {
        let e = parse(spec, hist, write_tp).unwrap_err();
        (e.column, e.message)
    }

    #[test]
    fn entry_probe_with_two_values_and_a_filter() {
        let s = parse(
            "p:c:malloc(size_t size, char *name):size_t,char*:size,name:size>16 && name==\"x\"#allocs",
            false,
            no_tp,
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
        assert_eq!(
            (s.values[0].value.source, s.values[0].value.index),
            (SRC_ARG, 0)
        );
        assert_eq!(s.values[1].value.flags, VAL_STRING | VAL_USER);
        assert_eq!(s.conds.len(), 2);
        assert_eq!((s.conds[0].cmp, s.conds[0].imm), (CMP_GT, 16));
        assert_eq!(&s.conds[1].text[..2], b"x\0");
    }

    #[test]
    fn return_probe_specials() {
        let s = parse(
            "r::vfs_read(void *f, void *b, size_t n):u64,u64:$latency/1000,$entry(n)",
            false,
            no_tp,
        )
        .unwrap();
        assert!(s.need_entry);
        assert_eq!(s.values[0].value.source, SRC_LATENCY);
        assert_eq!(
            (s.values[0].value.op, s.values[0].value.imm),
            (OP_DIV, 1000)
        );
        assert_eq!(
            (s.values[1].value.source, s.values[1].value.index),
            (SRC_ENTRY_ARG, 2)
        );
        let d = parse("r::vfs_read()", false, no_tp).unwrap();
        assert_eq!(d.values[0].value.source, SRC_RET);
        assert!(parse("p::vfs_read()", false, no_tp).unwrap().default_expr);
    }

    #[test]
    fn tracepoint_fields() {
        let s = parse(
            "t:syscalls:sys_enter_write():u64:args->count:fd==1",
            true,
            write_tp,
        )
        .unwrap();
        assert_eq!(
            (s.values[0].value.source, s.values[0].value.index),
            (SRC_FIELD, 32)
        );
        assert_eq!(s.conds[0].value.index, 16);
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
}

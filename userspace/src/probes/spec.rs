//! bcc's argdist probe specifier, parsed into the generic program's
//! configuration, with errors that point at the column they are about:
//!
//! `{p|r|t|u}:{[library]|category}:function(signature)[:type[,type...]:expr[,expr...][:filter]][#label]`
//!
//! This is the grammar of the spec's parts. The C types values are
//! declared with are in `ctype`, the compiler of expressions and filters
//! in `expr`, and bcc trace's specifier, which shares both, in [`trace`].

use rtrace_common::argdist::{
    Cond, KIND_ENTRY, KIND_RETURN, KIND_TRACEPOINT, KIND_USDT, MAX_VALUES, Value,
};

mod ctype;
mod expr;
pub mod trace;

pub use self::{
    ctype::CType,
    expr::{MacroLookup, SpecError},
};
use self::{
    ctype::{KNOWN_TYPES, c_type, parse_type},
    expr::{ExprParser, Param, Scope, compile_value, err},
};
use crate::{
    kernel::{btf::Btf, tracefs::Format},
    probes::usdt,
};

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

/// Looks a tracepoint's format file up, by category and event.
pub type FormatLookup<'a> = &'a dyn Fn(&str, &str) -> Result<Format, String>;
/// Finds a USDT probe, by library and probe name.
pub type UsdtLookup<'a> = &'a dyn Fn(&str, &str) -> Result<usdt::Probe, String>;

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

#[cfg(test)]
mod tests {
    use super::*;
    use rtrace_common::argdist::{
        I_BINARY, I_PUSH, OP_DIV, OP_GT, SRC_ARG, SRC_CONST, SRC_ENTRY_ARG, SRC_FIELD, SRC_LATENCY,
        SRC_RET, VAL_STRING, VAL_USER,
    };

    fn no_usdt(_: &str, _: &str) -> Result<usdt::Probe, String> {
        Err("no USDT probes in this test".into())
    }

    /// [`parse`] with these look-ups (the expression compiler's tests
    /// use it too).
    pub(super) fn parse4(
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

    pub(super) fn no_tp(_: &str, _: &str) -> Result<Format, String> {
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
    pub(super) fn insns(v: &Value) -> Vec<(u8, u8, u32, u64)> {
        v.insns[..v.n_insns as usize]
            .iter()
            .map(|i| {
                let what = if i.code == I_PUSH { i.source } else { i.op };
                (i.code, what, i.index, i.imm)
            })
            .collect()
    }

    pub(super) fn column(spec: &str, hist: bool) -> (usize, String) {
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
}

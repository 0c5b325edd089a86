//! bcc trace's probe specifier, parsed with argdist's expression compiler:
//!
//! `[{p|r}]:[library]:function[(signature)] [(filter)] ["format"[, value...]]`,
//! `t:category:event [(filter)] ["format"[, value...]]`,
//! `u:library:[provider:]probe [(filter)] ["format"[, value...]]`.
//!
//! `function` alone is `p::function`, `library:function` is
//! `p:library:function`. Values and filters are argdist's C expressions,
//! with bcc trace's names: `arg1`..`arg6`, `retval`, `args->field`,
//! `$pid`, `$tgid`, `$uid`, `$gid`, `$cpu`, `$task`.

use rtrace_common::argdist::{
    Cond, KIND_ENTRY, KIND_RETURN, KIND_TRACEPOINT, KIND_USDT, MAX_STRINGS, MAX_VALUES, Value,
};

use super::{
    Env, Target,
    ctype::CType,
    expr::{ExprParser, Scope, SpecError, compile_value, err},
    locate, reads_user, signature_params, split_list,
};

/// How one conversion of the format shows its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Conv {
    /// `%d`, `%i`: a signed number.
    Signed,
    /// `%u`: an unsigned number.
    Unsigned,
    /// `%x`, `%X` (upper case): hexadecimal.
    Hex {
        /// `%X`.
        upper: bool,
    },
    /// `%o`: octal.
    Octal,
    /// `%c`: one character.
    Char,
    /// `%s`: a string read where the value points.
    Str,
    /// `%p`: an address, `0x` and hexadecimal.
    Pointer,
    /// `%K`: a kernel address, named.
    KernelSym,
    /// `%U`: a user address of the process, named.
    UserSym,
}

/// One piece of the format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// Text printed as it is.
    Text(String),
    /// A conversion, of the value at this position.
    Conv {
        /// How.
        conv: Conv,
        /// printf's `-` flag: left-aligned.
        left: bool,
        /// printf's `0` flag: padded with zeroes.
        zero: bool,
        /// The least width.
        width: usize,
        /// The value's index.
        value: usize,
    },
}

/// A parsed trace spec.
#[derive(Debug, Clone)]
pub struct TraceSpec {
    /// The spec as given.
    pub raw: String,
    /// `KIND_*`.
    pub kind: u32,
    /// Where it attaches.
    pub target: Target,
    /// What the FUNC column shows: the function, event or USDT probe.
    pub display: String,
    /// The format, empty when the spec gives none.
    pub format: Vec<Piece>,
    /// The values, by position.
    pub values: Vec<Value>,
    /// The filter's terms.
    pub conds: Vec<Cond>,
    /// Whether a return probe needs its entry (`argN` at a return).
    pub need_entry: bool,
}

/// The `(…)` at the start of `text` with its parentheses balanced: its
/// length with them, or `None`.
fn balanced(text: &str) -> Option<usize> {
    let mut depth = 0usize;
    let mut quoted = false;
    for (i, c) in text.char_indices() {
        match c {
            '"' => quoted = !quoted,
            '(' if !quoted => depth += 1,
            ')' if !quoted => {
                depth -= 1;
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            _ => {}
        }
    }
    None
}

/// Parses a format's text (between its quotes, which start at column
/// `at`): its pieces, and the type each conversion gives its value.
fn parse_format(text: &str, at: usize) -> Result<(Vec<Piece>, Vec<CType>), SpecError> {
    let mut pieces = Vec::new();
    let mut types = Vec::new();
    let mut literal = String::new();
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if c != '%' {
            literal.push(c);
            continue;
        }
        if chars.next_if(|&(_, c)| c == '%').is_some() {
            literal.push('%');
            continue;
        }
        let (mut left, mut zero) = (false, false);
        while let Some((_, f)) = chars.next_if(|&(_, c)| matches!(c, '-' | '0' | '#' | ' ' | '+')) {
            left |= f == '-';
            zero |= f == '0';
        }
        let mut width = 0usize;
        while let Some((_, d)) = chars.next_if(|&(_, c)| c.is_ascii_digit()) {
            width = width * 10 + d.to_digit(10).unwrap_or(0) as usize;
        }
        let mut length = String::new();
        while let Some((_, l)) = chars.next_if(|&(_, c)| matches!(c, 'h' | 'l' | 'z' | 'j' | 't')) {
            length.push(l);
        }
        let size = match length.as_str() {
            "" => 4,
            "hh" => 1,
            "h" => 2,
            "l" | "ll" | "z" | "j" | "t" => 8,
            other => return err(at + i, format!("unknown length {other:?} in the format")),
        };
        let Some((_, conv)) = chars.next() else {
            return err(at + i, "the format ends inside a conversion");
        };
        let (conv, ty) = match conv {
            'd' | 'i' => (Conv::Signed, CType::int(size, true)),
            'u' => (Conv::Unsigned, CType::int(size, false)),
            'x' | 'X' => (Conv::Hex { upper: conv == 'X' }, CType::int(size, false)),
            'o' => (Conv::Octal, CType::int(size, false)),
            'c' => (Conv::Char, CType::int(1, false)),
            's' => (
                Conv::Str,
                CType {
                    string: true,
                    ..CType::U64
                },
            ),
            'p' => (Conv::Pointer, CType::U64),
            'K' => (Conv::KernelSym, CType::U64),
            'U' => (Conv::UserSym, CType::U64),
            other => {
                return err(
                    at + i,
                    format!(
                        "unknown conversion %{other}: use %d %i %u %x %X %o %c %s %p %K %U, \
                         with h, hh, l, ll or z"
                    ),
                );
            }
        };
        if !literal.is_empty() {
            pieces.push(Piece::Text(std::mem::take(&mut literal)));
        }
        pieces.push(Piece::Conv {
            conv,
            left,
            zero,
            width,
            value: types.len(),
        });
        types.push(ty);
    }
    if !literal.is_empty() {
        pieces.push(Piece::Text(literal));
    }
    Ok((pieces, types))
}

/// Parses one bcc trace spec.
pub fn parse(spec: &str, env: &Env<'_>) -> Result<TraceSpec, SpecError> {
    let text = spec.trim_end();
    let lead = text.len() - text.trim_start().len();
    // The probe ends at a space or at the signature's parenthesis.
    let end = text[lead..]
        .find([' ', '\t', '('])
        .map_or(text.len(), |i| lead + i);
    let probe = &text[lead..end];
    if probe.is_empty() {
        return err(
            lead,
            "expected a probe, as in p:c:malloc or t:sched:sched_switch",
        );
    }
    let mut parts: Vec<(usize, &str)> = Vec::new();
    let mut start = lead;
    for (i, c) in probe.char_indices() {
        if c == ':' {
            parts.push((start, &text[start..lead + i]));
            start = lead + i + 1;
        }
    }
    parts.push((start, &text[start..end]));
    // `func` is `p::func`, `lib:func` is `p:lib:func`.
    let (type_at, ty) = match parts.len() {
        1 | 2 => (lead, "p"),
        _ => parts.remove(0),
    };
    if parts.len() == 1 {
        parts.insert(0, (lead, ""));
    }
    let kind = match ty {
        "" | "p" => KIND_ENTRY,
        "r" => KIND_RETURN,
        "t" => KIND_TRACEPOINT,
        "u" => KIND_USDT,
        other => {
            return err(
                type_at,
                format!("unknown probe type {other:?}: use p, r, t or u (or none, for p)"),
            );
        }
    };
    // `u:lib:provider:probe` names the provider too; the library may hold
    // a ':' for p and r (bcc joins what is between).
    let (func_at, function) = parts.pop().expect("two parts at least");
    let function = if kind == KIND_USDT && parts.len() == 2 {
        let (_, provider) = parts.pop().expect("checked");
        &text[func_at - provider.len() - 1..end]
    } else {
        function
    };
    let (lib_at, library) = match parts.as_slice() {
        [(at, lib)] => (*at, *lib),
        [(at, _), .., (last_at, last)] => (*at, &text[*at..last_at + last.len()]),
        [] => (func_at, ""),
    };
    if function.contains('+') {
        return err(
            func_at + function.find('+').unwrap_or(0),
            "offsets into a function (func+0x12) are not taken: probe the function",
        );
    }
    if function.is_empty() {
        return err(func_at, "expected a function, event or probe name");
    }
    let usdt_name = function.replace(':', ".");
    let function = if kind == KIND_USDT {
        usdt_name.as_str()
    } else {
        function
    };

    let mut rest_at = end;
    let mut signature = (end, "");
    if text[end..].starts_with('(') && matches!(kind, KIND_ENTRY | KIND_RETURN) {
        let Some(len) = balanced(&text[end..]) else {
            return err(end, "missing ')' after the signature");
        };
        // As in bcc: parentheses right after the name, with none inside,
        // are the signature; a filter follows a space, or the signature.
        let inner = &text[end + 1..end + len - 1];
        if !inner.contains('(') {
            signature = (end + 1, inner);
            rest_at = end + len;
        }
    }
    // bcc's `u:LIB:NAME` is a USDT probe; rtrace's event grammar has
    // `u:FILE:FUNCTION` a function's uprobe. A name with no USDT probe is
    // taken as a function, so both read as their users mean them.
    let (kind, (target, format)) = match locate(kind, (lib_at, library), function, signature, env) {
        Err(_) if kind == KIND_USDT && !function.contains('.') => (
            KIND_ENTRY,
            locate(KIND_ENTRY, (lib_at, library), function, signature, env)?,
        ),
        other => (kind, other?),
    };
    let scope = Scope {
        kind,
        params: signature_params(signature.1, signature.0, env.btf)?,
        format: format.as_ref(),
        user: reads_user(&target),
        btf: env.btf,
        usdt_args: match &target {
            Target::Usdt { found, .. } => Some(found.args.as_slice()),
            _ => None,
        },
        macros: env.macros,
        bcc_names: true,
    };

    let mut at = rest_at + (text[rest_at..].len() - text[rest_at..].trim_start().len());
    let mut conds = Vec::new();
    let mut need_entry = false;
    if text[at..].starts_with('(') {
        let Some(len) = balanced(&text[at..]) else {
            return err(at, "the filter's '(' is never closed");
        };
        let mut p = ExprParser::new(&text[at + 1..at + len - 1], at + 1, &scope);
        let (c, entry) = p.filter()?;
        conds = c;
        need_entry |= entry;
        at += len;
        at += text[at..].len() - text[at..].trim_start().len();
    }
    let mut pieces = Vec::new();
    let mut values = Vec::new();
    if at < text.len() {
        if !text[at..].starts_with('"') {
            return err(
                at,
                "expected a \"format\" (and its values), or a (filter) before it",
            );
        }
        let Some(close) = text[at + 1..].find('"') else {
            return err(at, "the format's '\"' is never closed");
        };
        let (ps, types) = parse_format(&text[at + 1..at + 1 + close], at + 1)?;
        pieces = ps;
        let after = at + close + 2;
        let list = text[after..].trim_start();
        let list_at = text.len() - list.len();
        let exprs: Vec<(usize, &str)> = match list.strip_prefix(',') {
            Some(l) => split_list((list_at + 1, l)),
            None if list.is_empty() => Vec::new(),
            None => return err(list_at, "expected ',' and the format's values"),
        };
        if exprs.len() != types.len() {
            return err(
                after,
                format!(
                    "the format has {} conversion(s) but {} value(s) follow it",
                    types.len(),
                    exprs.len()
                ),
            );
        }
        if exprs.len() > MAX_VALUES {
            return err(list_at, format!("at most {MAX_VALUES} values a probe"));
        }
        let mut strings = 0;
        for ((e_at, e), ty) in exprs.into_iter().zip(types) {
            let mut p = ExprParser::new(e, e_at, &scope);
            let expr = p.expr()?;
            p.end()?;
            need_entry |= expr.needs_entry();
            if ty.string && strings as usize >= MAX_STRINGS {
                return err(e_at, format!("at most {MAX_STRINGS} %s values a probe"));
            }
            let mut value = compile_value(&expr, ty, &scope, (e_at, e_at), &mut strings)?;
            value.size = ty.size;
            values.push(value);
        }
    }
    let display = match &target {
        Target::Kernel { function } | Target::User { function, .. } => function.clone(),
        Target::Tracepoint { event, .. } => event.clone(),
        Target::Usdt { probe, .. } => probe.clone(),
    };
    Ok(TraceSpec {
        raw: spec.to_owned(),
        kind,
        target,
        display,
        format: pieces,
        values,
        conds,
        need_entry,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{kernel::tracefs::Format, probes::usdt};
    use rtrace_common::argdist::{SRC_ARG, SRC_ENTRY_ARG, SRC_RET};

    fn env_parse(spec: &str) -> Result<TraceSpec, SpecError> {
        let format = |_: &str, _: &str| -> Result<Format, String> {
            Ok(Format::parse(
                "syscalls:sys_enter_openat",
                "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
                 \tfield:const char * filename;\toffset:24;\tsize:8;\tsigned:0;\n\
                 \tfield:int flags;\toffset:32;\tsize:8;\tsigned:0;\n",
            ))
        };
        let usdt = |_: &str, name: &str| -> Result<usdt::Probe, String> {
            Err(format!("no USDT probe {name}"))
        };
        parse(
            spec,
            &Env {
                format: &format,
                usdt: &usdt,
                btf: None,
                macros: &|_| None,
            },
        )
    }

    #[test]
    fn bcc_shorthands_name_the_probe() {
        let s = env_parse("do_sys_open").unwrap();
        assert_eq!(s.kind, KIND_ENTRY);
        assert_eq!(
            s.target,
            Target::Kernel {
                function: "do_sys_open".into()
            }
        );
        let s = env_parse("c:malloc \"size = %d\", arg1").unwrap();
        assert_eq!(
            s.target,
            Target::User {
                library: "c".into(),
                function: "malloc".into()
            }
        );
        assert_eq!(s.values[0].insns[0].source, SRC_ARG);
        // A USDT name the library lacks is its function (rtrace's u:).
        let s = env_parse("u:/lib/libc.so.6:malloc \"%d\", arg1").unwrap();
        assert_eq!(s.kind, KIND_ENTRY);
        assert_eq!(s.display, "malloc");
    }

    #[test]
    fn signature_filter_and_format() {
        // Parentheses right after the name are the signature; after a
        // space, the filter.
        let s = env_parse("p:c:open(char *filename) \"opening %s\", filename").unwrap();
        assert!(s.conds.is_empty());
        assert_eq!(s.values.len(), 1);
        let s =
            env_parse("r:c:read ((int)retval < 0) \"read failed: %d %lu\", retval, arg2").unwrap();
        assert_eq!(s.conds.len(), 1);
        assert_eq!(s.values[0].insns[0].source, SRC_RET);
        assert_eq!(s.values[0].size, 4);
        // A return's argN is the entry's.
        assert_eq!(s.values[1].insns[0].source, SRC_ENTRY_ARG);
        assert_eq!(s.values[1].size, 8);
        assert!(s.need_entry);
        assert_eq!(
            s.format,
            vec![
                Piece::Text("read failed: ".into()),
                Piece::Conv {
                    conv: Conv::Signed,
                    left: false,
                    zero: false,
                    width: 0,
                    value: 0
                },
                Piece::Text(" ".into()),
                Piece::Conv {
                    conv: Conv::Unsigned,
                    left: false,
                    zero: false,
                    width: 0,
                    value: 1
                },
            ]
        );
        let s =
            env_parse("t:syscalls:sys_enter_openat \"%-8s|%05x%%\", args->filename, args->flags")
                .unwrap();
        assert_eq!(
            s.format[0],
            Piece::Conv {
                conv: Conv::Str,
                left: true,
                zero: false,
                width: 8,
                value: 0
            }
        );
        assert_eq!(s.format.last(), Some(&Piece::Text("%".into())));
    }

    #[test]
    fn errors_point_at_their_column() {
        for (spec, column, want) in [
            ("c:write \"%d %d\", arg1", 16, "2 conversion(s) but 1"),
            ("c:write \"%y\", arg1", 10, "unknown conversion %y"),
            ("c:write (arg1 == ) \"x\"", 18, "expected"),
            ("c:write \"%d\", retval", 15, "return probes"),
            ("c:write \"%d\", arg7", 15, "arg1..arg6"),
            ("t:syscalls:sys_enter_openat \"%d\", arg1", 35, "args->NAME"),
            ("c:write+0x10", 8, "offsets"),
            ("c:write \"x\" junk", 13, "expected ','"),
        ] {
            let e = env_parse(spec).unwrap_err();
            assert_eq!(e.column, column, "{spec}: {e}");
            assert!(e.message.contains(want), "{spec}: {e}");
        }
    }
}

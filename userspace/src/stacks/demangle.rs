//! Names as perf prints them, for the languages blazesym leaves raw. Rust
//! (legacy and v0) and C++ are demangled by blazesym (rustc-demangle,
//! cpp_demangle); OCaml's native code is demangled here, as perf's
//! `demangle-ocaml` does: `camlHot__tower_91` is `Hot.tower_91`.
//!
//! No crate on crates.io demangles OCaml, and the Linux schemes are small:
//! `caml`, the module path and the function with its stamp, any byte
//! other than a letter, digit or `_` escaped as `$xx` (two hex digits):
//! - up to OCaml 5.0, `__` between path components:
//!   `camlStdlib__List__map_281`, `camlHot__$2b$2b_12` (`++`);
//! - from OCaml 5.1, `.` between them: `camlHot.tower_91`.
//!
//! (OCaml 5.4 uses `$` between components on macOS and Windows, where
//! rtrace does not run.)

/// The name a frame carries for the linker's name `sym`, as the
/// symbolizer demangles it (Rust with blazesym's `{:#}`, without the hash;
/// C++; OCaml), or `None` when `sym` is no mangled name.
pub fn linker_name(sym: &str) -> Option<String> {
    if let Some(name) = ocaml(sym) {
        return Some(name);
    }
    if let Ok(d) = rustc_demangle::try_demangle(sym) {
        return Some(format!("{d:#}"));
    }
    cpp_demangle::Symbol::new(sym).ok()?.demangle().ok()
}

/// The readable name of OCaml symbol `sym`, or `None` when it is not one:
/// an OCaml symbol is `caml` and then a capitalized module name
/// (`caml_alloc`, the runtime's C, is no such symbol).
pub fn ocaml(sym: &str) -> Option<String> {
    let rest = sym.strip_prefix("caml")?;
    if !rest.starts_with(|c: char| c.is_ascii_uppercase()) {
        return None;
    }
    let b = rest.as_bytes();
    let hex = |i: usize| -> Option<u8> {
        let pair = b.get(i..i + 2)?;
        if !pair.iter().all(u8::is_ascii_hexdigit) {
            return None;
        }
        u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()
    };
    let mut out: Vec<u8> = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'_' && b.get(i + 1) == Some(&b'_') {
            out.push(b'.');
            i += 2;
        } else if b[i] == b'$'
            && let Some(c) = hex(i + 1)
        {
            out.push(c);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ocaml_schemes_read_as_perf_prints_them() {
        // OCaml 4 and 5.0: `__` separators.
        assert_eq!(ocaml("camlHot__tower_91").as_deref(), Some("Hot.tower_91"));
        assert_eq!(
            ocaml("camlStdlib__List__map_281").as_deref(),
            Some("Stdlib.List.map_281")
        );
        assert_eq!(ocaml("camlHot__$2b$2b_12").as_deref(), Some("Hot.++_12"));
        // OCaml 5.1 and later: `.` separators, `$xx` escapes.
        assert_eq!(ocaml("camlHot.tower_91").as_deref(), Some("Hot.tower_91"));
        assert_eq!(ocaml("camlHot.$3e$3e=_7").as_deref(), Some("Hot.>>=_7"));
        // Not an escape: `$` and no two hex digits, or a sign.
        assert_eq!(ocaml("camlHot.$+1_3").as_deref(), Some("Hot.$+1_3"));
        // A module's own symbols, with no function.
        assert_eq!(ocaml("camlHot").as_deref(), Some("Hot"));
        assert_eq!(
            ocaml("camlHot__code_begin").as_deref(),
            Some("Hot.code_begin")
        );
    }

    #[test]
    fn other_names_are_left_alone() {
        for name in [
            "caml_alloc",
            "caml_main",
            "main",
            "camlot",
            "_ZN4core3fmt5write17h0E",
            "",
        ] {
            assert_eq!(ocaml(name), None, "{name}");
        }
    }
}

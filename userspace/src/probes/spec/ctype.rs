//! C types as probe specs write them: the plain types that values are
//! declared with ([`CType`]), and the types expressions carry while they
//! compile ([`Ty`]), which may point to a struct of the kernel's BTF.

use crate::kernel::btf::Btf;

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
    pub(super) const U64: CType = CType::int(8, false);

    pub(super) const fn int(size: u32, signed: bool) -> Self {
        Self {
            size,
            signed,
            string: false,
            user: false,
        }
    }
}

/// Parses a C type's text; `None` if it is unknown.
pub(super) fn c_type(text: &str) -> Option<CType> {
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

pub(super) const KNOWN_TYPES: &str = "char*, u8..u64, s8..s64, int, unsigned int, long, \
                           unsigned long, size_t, ssize_t, pid_t and the like, or any pointer";

/// What a pointer points to, for `*p`, `p->member` and casts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Pointee {
    /// Nothing known (`void *`, `long`).
    Nothing,
    /// A plain C type.
    Basic(CType),
    /// A type of the kernel's BTF.
    Btf(u32),
}

/// An expression's type while it is parsed.
#[derive(Debug, Clone, Copy)]
pub(super) struct Ty {
    pub(super) c: CType,
    pub(super) pointee: Pointee,
}

impl Ty {
    pub(super) fn of(c: CType) -> Self {
        Self {
            c,
            pointee: Pointee::Nothing,
        }
    }
}

/// A C type's text as a [`Ty`]: the plain types of [`c_type`], and
/// pointers to structs and unions, found in the kernel's BTF (a user
/// structure by its kernel twin, `__kernel_NAME`, if it has no entry of
/// its own).
pub(super) fn parse_type(text: &str, btf: Option<&Btf>) -> Result<Ty, String> {
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

/// Whether the text inside parentheses names a type, making them a cast:
/// a pointer, `struct`/`union`, or a known plain type.
pub(super) fn looks_like_type(text: &str) -> bool {
    let t = text.trim();
    // `(size * 2)` is no pointer type: what the stars leave must be one.
    t.starts_with("struct ") || t.starts_with("union ") || c_type(&t.replace('*', " ")).is_some()
}

//! The layout of BTF's type section, as the kernel's `btf.h` gives it:
//! what user space reads the kernel's BTF by (`kernel::btf`) and what
//! the build walks the objects' BTF by (`ebpf_build::globalize`).

/// BTF's magic number, the section's first two bytes (little-endian).
pub const MAGIC: u16 = 0xeb9f;
/// Bytes of every type's header: its name, its info word, and its size
/// or referenced type.
pub const TYPE_HEADER_BYTES: usize = 12;

/// `BTF_KIND_INT`.
pub const KIND_INT: u32 = 1;
/// `BTF_KIND_PTR`.
pub const KIND_PTR: u32 = 2;
/// `BTF_KIND_ARRAY`.
pub const KIND_ARRAY: u32 = 3;
/// `BTF_KIND_STRUCT`.
pub const KIND_STRUCT: u32 = 4;
/// `BTF_KIND_UNION`.
pub const KIND_UNION: u32 = 5;
/// `BTF_KIND_ENUM`.
pub const KIND_ENUM: u32 = 6;
/// `BTF_KIND_FWD`.
pub const KIND_FWD: u32 = 7;
/// `BTF_KIND_TYPEDEF`.
pub const KIND_TYPEDEF: u32 = 8;
/// `BTF_KIND_VOLATILE`.
pub const KIND_VOLATILE: u32 = 9;
/// `BTF_KIND_CONST`.
pub const KIND_CONST: u32 = 10;
/// `BTF_KIND_RESTRICT`.
pub const KIND_RESTRICT: u32 = 11;
/// `BTF_KIND_FUNC`.
pub const KIND_FUNC: u32 = 12;
/// `BTF_KIND_FUNC_PROTO`.
pub const KIND_FUNC_PROTO: u32 = 13;
/// `BTF_KIND_VAR`.
pub const KIND_VAR: u32 = 14;
/// `BTF_KIND_DATASEC`.
pub const KIND_DATASEC: u32 = 15;
/// `BTF_KIND_FLOAT`.
pub const KIND_FLOAT: u32 = 16;
/// `BTF_KIND_DECL_TAG`.
pub const KIND_DECL_TAG: u32 = 17;
/// `BTF_KIND_TYPE_TAG`.
pub const KIND_TYPE_TAG: u32 = 18;
/// `BTF_KIND_ENUM64`.
pub const KIND_ENUM64: u32 = 19;
/// The last kind there is.
pub const KIND_MAX: u32 = KIND_ENUM64;

/// The header of BTF (version 1, no flags) whose `types_len` bytes of
/// types follow it, then `strings_len` bytes of strings.
pub fn header(types_len: u32, strings_len: u32) -> [u8; HEADER_BYTES] {
    let mut h = [0; HEADER_BYTES];
    h[..2].copy_from_slice(&MAGIC.to_le_bytes());
    h[2] = 1;
    let words = [HEADER_BYTES as u32, 0, types_len, types_len, strings_len];
    for (i, w) in words.iter().enumerate() {
        h[4 + 4 * i..8 + 4 * i].copy_from_slice(&w.to_le_bytes());
    }
    h
}

/// Bytes of BTF's header ([`header`]).
pub const HEADER_BYTES: usize = 24;

/// A function's linkage, in its info word's vlen bits: global functions
/// are verified once, on their own.
pub const FUNC_GLOBAL: u32 = 1;

/// How many bytes of extra data follow the header of a type of `kind`
/// with `vlen` members.
pub fn extra_len(kind: u32, vlen: usize) -> usize {
    match kind {
        KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
        KIND_ARRAY => 12,
        KIND_STRUCT | KIND_UNION | KIND_ENUM64 | KIND_DATASEC => vlen * 12,
        KIND_ENUM | KIND_FUNC_PROTO => vlen * 8,
        _ => 0,
    }
}

//! A small reader of the kernel's BTF, enough to resolve struct member
//! offsets by name.
//!
//! rustc emits no CO-RE relocations, so the programs cannot be relocated by
//! the loader; instead user space looks members up here and passes their
//! offsets in as globals. Lookups see through anonymous structs and unions,
//! and accept several candidate names for members renamed across kernels.

use rtrace_common::offsets::FdOffsets;
use std::{collections::HashMap, path::Path};

/// Where the running kernel exposes its own BTF.
pub const VMLINUX: &str = "/sys/kernel/btf/vmlinux";

const MAGIC: u16 = 0xeb9f;
const KIND_INT: u32 = 1;
const KIND_PTR: u32 = 2;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_FLOAT: u32 = 16;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;

/// Errors from reading BTF or resolving a member.
#[derive(Debug, thiserror::Error)]
pub enum BtfError {
    /// The BTF file could not be read.
    #[error("cannot read BTF from {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The data is not BTF or is cut short.
    #[error("malformed BTF: {0}")]
    Malformed(&'static str),
    /// No struct of that name.
    #[error("kernel BTF has no struct {0}")]
    NoStruct(String),
    /// None of the candidate member paths exist.
    #[error("kernel BTF has no member {candidates} in struct {strukt}")]
    NoMember {
        /// The struct searched.
        strukt: String,
        /// The paths tried, joined with " or ".
        candidates: String,
    },
}

#[derive(Debug, Clone)]
struct Member {
    name: u32,
    ty: u32,
    bit_offset: u32,
}

#[derive(Debug, Clone)]
struct Type {
    kind: u32,
    name: u32,
    /// Size for sized kinds, referenced type for the others.
    size_or_type: u32,
    members: Vec<Member>,
    /// Element type and count, for arrays.
    array: Option<(u32, u32)>,
    /// Parameters, for function prototypes.
    params: u32,
    /// Enumerators as (name, value), for enums.
    values: Vec<(u32, i64)>,
}

/// A parsed BTF blob.
#[derive(Debug)]
pub struct Btf {
    types: Vec<Type>,
    strings: Vec<u8>,
    structs_by_name: HashMap<String, u32>,
}

/// A resolved member: where it is and how big it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemberInfo {
    /// Byte offset from the start of the outermost struct.
    pub offset: u32,
    /// Size in bytes.
    pub size: u32,
}

fn u16_at(b: &[u8], at: usize) -> Result<u16, BtfError> {
    b.get(at..at + 2)
        .map(|s| u16::from_le_bytes([s[0], s[1]]))
        .ok_or(BtfError::Malformed("truncated"))
}

fn u32_at(b: &[u8], at: usize) -> Result<u32, BtfError> {
    b.get(at..at + 4)
        .map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
        .ok_or(BtfError::Malformed("truncated"))
}

impl Btf {
    /// Reads the running kernel's BTF.
    pub fn from_kernel() -> Result<Self, BtfError> {
        Self::from_file(VMLINUX)
    }

    /// Reads BTF from a file.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, BtfError> {
        let path = path.as_ref();
        let data = std::fs::read(path).map_err(|source| BtfError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&data)
    }

    /// Parses a little-endian BTF blob.
    pub fn parse(data: &[u8]) -> Result<Self, BtfError> {
        if u16_at(data, 0)? != MAGIC {
            return Err(BtfError::Malformed("bad magic (not little-endian BTF)"));
        }
        let hdr_len = u32_at(data, 4)? as usize;
        let type_off = hdr_len + u32_at(data, 8)? as usize;
        let type_len = u32_at(data, 12)? as usize;
        let str_off = hdr_len + u32_at(data, 16)? as usize;
        let str_len = u32_at(data, 20)? as usize;
        let type_data = data
            .get(type_off..type_off + type_len)
            .ok_or(BtfError::Malformed("type section out of bounds"))?;
        let strings = data
            .get(str_off..str_off + str_len)
            .ok_or(BtfError::Malformed("string section out of bounds"))?
            .to_vec();

        // Type id 0 is void.
        let mut types = vec![Type {
            kind: 0,
            name: 0,
            size_or_type: 0,
            members: Vec::new(),
            array: None,
            params: 0,
            values: Vec::new(),
        }];
        let mut at = 0;
        while at < type_data.len() {
            let name = u32_at(type_data, at)?;
            let info = u32_at(type_data, at + 4)?;
            let size_or_type = u32_at(type_data, at + 8)?;
            at += 12;
            let vlen = (info & 0xffff) as usize;
            let kind = (info >> 24) & 0x1f;
            let kind_flag = info >> 31 == 1;
            let mut t = Type {
                kind,
                name,
                size_or_type,
                members: Vec::new(),
                array: None,
                params: 0,
                values: Vec::new(),
            };
            at += match kind {
                KIND_INT | 14 | 17 => 4, // int encoding, var linkage, decl_tag index
                KIND_ARRAY => {
                    t.array = Some((u32_at(type_data, at)?, u32_at(type_data, at + 8)?));
                    12
                }
                KIND_STRUCT | KIND_UNION => {
                    for i in 0..vlen {
                        let m = at + i * 12;
                        let raw = u32_at(type_data, m + 8)?;
                        t.members.push(Member {
                            name: u32_at(type_data, m)?,
                            ty: u32_at(type_data, m + 4)?,
                            // With kind_flag the top byte is a bitfield size.
                            bit_offset: if kind_flag { raw & 0xff_ffff } else { raw },
                        });
                    }
                    vlen * 12
                }
                KIND_ENUM => {
                    for i in 0..vlen {
                        let v = at + i * 8;
                        let value = u32_at(type_data, v + 4)?;
                        // Signed enums (kind_flag) sign-extend.
                        let value = if kind_flag {
                            i64::from(value as i32)
                        } else {
                            i64::from(value)
                        };
                        t.values.push((u32_at(type_data, v)?, value));
                    }
                    vlen * 8
                }
                KIND_FUNC_PROTO => {
                    t.params = vlen as u32;
                    vlen * 8
                }
                KIND_ENUM64 => {
                    for i in 0..vlen {
                        let v = at + i * 12;
                        let lo = u64::from(u32_at(type_data, v + 4)?);
                        let hi = u64::from(u32_at(type_data, v + 8)?);
                        t.values
                            .push((u32_at(type_data, v)?, ((hi << 32) | lo) as i64));
                    }
                    vlen * 12
                }
                15 => vlen * 12, // datasec vars
                _ => 0,
            };
            types.push(t);
        }

        let mut btf = Self {
            types,
            strings,
            structs_by_name: HashMap::new(),
        };
        for (id, t) in btf.types.iter().enumerate() {
            if t.kind == KIND_STRUCT && t.name != 0 {
                let name = btf.str(t.name).to_owned();
                // Keep the first complete definition of a name.
                btf.structs_by_name.entry(name).or_insert(id as u32);
            }
        }
        Ok(btf)
    }

    fn str(&self, off: u32) -> &str {
        let rest = self.strings.get(off as usize..).unwrap_or_default();
        let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
        std::str::from_utf8(&rest[..end]).unwrap_or("")
    }

    /// Follows typedefs and qualifiers to the underlying type.
    fn skip_mods(&self, mut id: u32) -> u32 {
        for _ in 0..32 {
            match self.types.get(id as usize) {
                Some(t)
                    if matches!(
                        t.kind,
                        KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG
                    ) =>
                {
                    id = t.size_or_type
                }
                _ => break,
            }
        }
        id
    }

    fn size_of(&self, id: u32) -> u32 {
        let id = self.skip_mods(id);
        let Some(t) = self.types.get(id as usize) else {
            return 0;
        };
        match t.kind {
            KIND_PTR => 8,
            KIND_ARRAY => t
                .array
                .map_or(0, |(elem, n)| self.size_of(elem).saturating_mul(n)),
            KIND_INT | KIND_STRUCT | KIND_UNION | KIND_ENUM | KIND_ENUM64 | KIND_FLOAT => {
                t.size_or_type
            }
            _ => 0,
        }
    }

    /// Finds `name` among `id`'s members, looking inside anonymous members.
    /// Returns the member's bit offset from the start of `id` and its type.
    fn find_member(&self, id: u32, name: &str, depth: u32) -> Option<(u32, u32)> {
        let t = self.types.get(self.skip_mods(id) as usize)?;
        if !matches!(t.kind, KIND_STRUCT | KIND_UNION) || depth > 8 {
            return None;
        }
        for m in &t.members {
            if m.name != 0 && self.str(m.name) == name {
                return Some((m.bit_offset, m.ty));
            }
        }
        for m in t.members.iter().filter(|m| m.name == 0) {
            if let Some((off, ty)) = self.find_member(m.ty, name, depth + 1) {
                return Some((m.bit_offset + off, ty));
            }
        }
        None
    }

    /// The number of C arguments tracepoint `event` passes to tp_btf and
    /// raw tracepoint programs, from its `btf_trace_<event>` typedef (whose
    /// prototype has a leading context pointer besides).
    pub fn tracepoint_args(&self, event: &str) -> Option<u32> {
        let name = format!("btf_trace_{event}");
        let def = self
            .types
            .iter()
            .find(|t| t.kind == KIND_TYPEDEF && self.str(t.name) == name)?;
        let ptr = self.types.get(def.size_or_type as usize)?;
        let proto = self.types.get(ptr.size_or_type as usize)?;
        (ptr.kind == KIND_PTR && proto.kind == KIND_FUNC_PROTO)
            .then(|| proto.params.saturating_sub(1))
    }

    /// The value of enumerator `name`, in whichever enum defines it.
    pub fn enum_value(&self, name: &str) -> Option<i64> {
        self.types
            .iter()
            .filter(|t| matches!(t.kind, KIND_ENUM | KIND_ENUM64))
            .flat_map(|t| &t.values)
            .find(|(n, _)| self.str(*n) == name)
            .map(|&(_, v)| v)
    }

    /// Resolves the first of several candidate member paths that exists,
    /// each dotted (`ns.inum`), for members renamed across kernels
    /// (`__state` was `state`).
    pub fn member_any(&self, strukt: &str, candidates: &[&str]) -> Result<MemberInfo, BtfError> {
        let &root = self
            .structs_by_name
            .get(strukt)
            .ok_or_else(|| BtfError::NoStruct(strukt.to_owned()))?;
        candidates
            .iter()
            .find_map(|path| {
                let mut ty = root;
                let mut bits = 0;
                for part in path.split('.') {
                    let (off, next) = self.find_member(ty, part, 0)?;
                    bits += off;
                    ty = next;
                }
                Some(MemberInfo {
                    offset: bits / 8,
                    size: self.size_of(ty),
                })
            })
            .ok_or_else(|| BtfError::NoMember {
                strukt: strukt.to_owned(),
                candidates: candidates.join(" or "),
            })
    }

    /// The offset of one member path, for members no kernel renamed.
    pub fn offset(&self, strukt: &str, path: &str) -> Result<u32, BtfError> {
        self.member_any(strukt, &[path]).map(|m| m.offset)
    }

    /// The way from a task to the file behind one of its descriptors.
    pub fn fd_offsets(&self) -> Result<FdOffsets, BtfError> {
        Ok(FdOffsets {
            task_files: self.offset("task_struct", "files")?,
            files_fdt: self.offset("files_struct", "fdt")?,
            fdt_max_fds: self.offset("fdtable", "max_fds")?,
            fdt_fd: self.offset("fdtable", "fd")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    fn kernel() -> Btf {
        Btf::from_kernel().expect("these tests need /sys/kernel/btf/vmlinux")
    }

    impl Btf {
        fn member(&self, strukt: &str, path: &str) -> Result<MemberInfo, BtfError> {
            self.member_any(strukt, &[path])
        }
    }

    /// Offsets as pahole reads them from the same BTF: an independent parser.
    fn pahole(strukt: &str, member: &str) -> Option<(u32, u32)> {
        let out = Command::new("pahole")
            .args(["-C", strukt, VMLINUX])
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout);
        text.lines().find_map(|line| {
            let (decl, comment) = line.split_once("/*")?;
            let name = decl.trim().trim_end_matches(';');
            let name = name.rsplit([' ', '*']).next()?;
            let name = name.split('[').next()?;
            if name != member {
                return None;
            }
            let mut nums = comment.split_whitespace().filter_map(|w| w.parse().ok());
            Some((nums.next()?, nums.next()?))
        })
    }

    #[test]
    fn task_struct_members_match_pahole() {
        let btf = kernel();
        let have_pahole = Command::new("pahole").arg("--version").output().is_ok();
        if !have_pahole {
            assert!(
                std::env::var_os("CI").is_none(),
                "pahole (Debian dwarves) is missing; `cargo xtask setup` installs it"
            );
            eprintln!("pahole missing: checking layout invariants only");
        }
        for member in ["pid", "tgid", "comm", "nsproxy", "cgroups"] {
            let got = btf.member("task_struct", member).unwrap();
            if have_pahole {
                let (off, size) = pahole("task_struct", member).expect(member);
                assert_eq!((got.offset, got.size), (off, size), "task_struct.{member}");
            }
        }
        let pid = btf.member("task_struct", "pid").unwrap();
        let tgid = btf.member("task_struct", "tgid").unwrap();
        assert_eq!((pid.size, tgid.size, tgid.offset), (4, 4, pid.offset + 4));
        assert_eq!(btf.member("task_struct", "comm").unwrap().size, 16);
    }

    #[test]
    fn renamed_members_resolve_through_candidates() {
        let btf = kernel();
        let state = btf
            .member_any("task_struct", &["__state", "state"])
            .unwrap();
        assert!(state.size == 4 || state.size == 8);
        let err = btf.member("task_struct", "no_such_member").unwrap_err();
        assert!(err.to_string().contains("no_such_member"), "{err}");
        assert!(matches!(
            btf.member("no_such_struct", "x"),
            Err(BtfError::NoStruct(_))
        ));
    }

    #[test]
    fn tracepoint_arguments_and_enum_values_resolve() {
        let btf = kernel();
        // sched_switch(bool preempt, prev, next, unsigned int prev_state)
        // since 5.18.
        assert_eq!(btf.tracepoint_args("sched_switch"), Some(4));
        assert_eq!(btf.tracepoint_args("block_rq_issue"), Some(1));
        assert_eq!(btf.tracepoint_args("no_such_event"), None);
        assert_eq!(btf.enum_value("REQ_OP_READ"), Some(0));
        assert_eq!(btf.enum_value("REQ_OP_WRITE"), Some(1));
        assert_eq!(btf.enum_value("no_such_enumerator"), None);
    }

    #[test]
    fn nested_and_anonymous_members_resolve() {
        let btf = kernel();
        // skc_daddr sits in an anonymous union inside an anonymous struct.
        let direct = btf.member("sock_common", "skc_daddr").unwrap();
        let nested = btf.member("sock", "__sk_common.skc_daddr").unwrap();
        let base = btf.member("sock", "__sk_common").unwrap();
        assert_eq!(direct.size, 4);
        assert_eq!(nested.offset, base.offset + direct.offset);
        let inum = btf.member("pid_namespace", "ns.inum").unwrap();
        assert_eq!(inum.size, 4);
    }
}

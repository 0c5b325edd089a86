//! rtrace's one reader of the kernel's BTF: struct member offsets, enum
//! values and tracepoint prototypes by name, and the type ids aya needs to
//! attach tp_btf and fentry programs.
//!
//! rustc emits no CO-RE relocations, so the programs cannot be relocated by
//! the loader; instead user space looks members up here and passes their
//! offsets in as globals. Lookups see through anonymous structs and unions,
//! and accept several candidate names for members renamed across kernels.
//!
//! The blob is kept as read, with only an index of where each type starts
//! and of the structs by name: types are decoded when looked up, so a run
//! holds a few megabytes during set-up instead of a parsed vmlinux, and
//! nothing once set-up is over (the tracer drops it).

use rtrace_common::offsets::FdOffsets;
use std::{collections::HashMap, path::Path};

/// Where the running kernel exposes its own BTF.
pub const VMLINUX: &str = "/sys/kernel/btf/vmlinux";

use rtrace_common::btf::{
    KIND_ARRAY, KIND_CONST, KIND_ENUM, KIND_ENUM64, KIND_FLOAT, KIND_FUNC, KIND_FUNC_PROTO,
    KIND_INT, KIND_PTR, KIND_RESTRICT, KIND_STRUCT, KIND_TYPE_TAG, KIND_TYPEDEF, KIND_UNION,
    KIND_VOLATILE, MAGIC, TYPE_HEADER_BYTES, extra_len,
};

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
    /// aya would not take the attach-id BTF made for it.
    #[error("cannot hand kernel type ids to the loader: {0}")]
    Stub(String),
}

/// What a type is, as far as expressions on it care.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Shape {
    /// `void`, or an id out of range.
    Void,
    /// An integer or enum.
    Int {
        /// Bytes.
        size: u32,
        /// Signed.
        signed: bool,
    },
    /// A pointer to type id.
    Pointer(u32),
    /// A struct or union.
    Struct {
        /// Its type id.
        id: u32,
        /// Its name (empty if anonymous).
        name: String,
    },
    /// An array of type id.
    Array(u32),
    /// Anything else (functions, floats).
    Other,
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

/// One type's header, decoded on demand.
#[derive(Debug, Clone, Copy)]
struct Head {
    name: u32,
    kind: u32,
    vlen: usize,
    kind_flag: bool,
    /// Size for sized kinds, referenced type for the others.
    size_or_type: u32,
    /// Where the kind's extra data starts in the type section.
    extra: usize,
}

/// A BTF blob, indexed for lookups by name.
#[derive(Debug)]
pub struct Btf {
    data: crate::kernel::memory::Mapped,
    /// The type section's range in `data`.
    types: std::ops::Range<usize>,
    /// The string section's range in `data`.
    strings: std::ops::Range<usize>,
    /// Where each type id's header starts in the type section (id 0, void,
    /// has none and points past the end).
    starts: Vec<u32>,
    structs_by_name: HashMap<Box<str>, u32>,
}

impl Btf {
    /// Reads the running kernel's BTF.
    pub fn from_kernel() -> Result<Self, BtfError> {
        Self::from_file(VMLINUX)
    }

    /// Reads BTF from a file.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, BtfError> {
        let path = path.as_ref();
        let data = crate::kernel::memory::Mapped::open(path).map_err(|source| BtfError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::index(data)
    }

    /// Indexes a little-endian BTF blob.
    fn index(data: crate::kernel::memory::Mapped) -> Result<Self, BtfError> {
        if u16_at(&data, 0)? != MAGIC {
            return Err(BtfError::Malformed("bad magic (not little-endian BTF)"));
        }
        let hdr_len = u32_at(&data, 4)? as usize;
        let type_off = hdr_len + u32_at(&data, 8)? as usize;
        let type_len = u32_at(&data, 12)? as usize;
        let str_off = hdr_len + u32_at(&data, 16)? as usize;
        let str_len = u32_at(&data, 20)? as usize;
        if data.get(type_off..type_off + type_len).is_none() {
            return Err(BtfError::Malformed("type section out of bounds"));
        }
        if data.get(str_off..str_off + str_len).is_none() {
            return Err(BtfError::Malformed("string section out of bounds"));
        }
        let mut btf = Self {
            types: type_off..type_off + type_len,
            strings: str_off..str_off + str_len,
            starts: vec![type_len as u32],
            structs_by_name: HashMap::new(),
            data,
        };
        let mut at = 0;
        while at < type_len {
            btf.starts.push(at as u32);
            let h = btf
                .head_at(at)
                .ok_or(BtfError::Malformed("type cut short"))?;
            if h.kind == KIND_STRUCT && h.name != 0 {
                let id = btf.starts.len() as u32 - 1;
                let name: Box<str> = btf.str(h.name).into();
                // Keep the first complete definition of a name.
                btf.structs_by_name.entry(name).or_insert(id);
            }
            at = h.extra + extra_len(h.kind, h.vlen);
        }
        btf.structs_by_name.shrink_to_fit();
        Ok(btf)
    }

    fn type_data(&self) -> &[u8] {
        &self.data[self.types.clone()]
    }

    /// The header at byte `at` of the type section; `None` past its end.
    fn head_at(&self, at: usize) -> Option<Head> {
        let t = self.type_data().get(at..at + TYPE_HEADER_BYTES)?;
        let word = |i: usize| u32::from_le_bytes([t[i], t[i + 1], t[i + 2], t[i + 3]]);
        let info = word(4);
        Some(Head {
            name: word(0),
            kind: (info >> 24) & 0x1f,
            vlen: (info & 0xffff) as usize,
            kind_flag: info >> 31 == 1,
            size_or_type: word(8),
            extra: at + TYPE_HEADER_BYTES,
        })
    }

    /// Type `id`'s header; `None` for void and ids out of range.
    fn head(&self, id: u32) -> Option<Head> {
        if id == 0 {
            return None;
        }
        self.head_at(*self.starts.get(id as usize)? as usize)
    }

    /// Every type id with its header.
    fn all(&self) -> impl Iterator<Item = (u32, Head)> + '_ {
        (1..self.starts.len() as u32).filter_map(|id| Some((id, self.head(id)?)))
    }

    fn u32_in(&self, at: usize) -> u32 {
        u32_at(self.type_data(), at).unwrap_or(0)
    }

    fn str(&self, off: u32) -> &str {
        let strings = &self.data[self.strings.clone()];
        let rest = strings.get(off as usize..).unwrap_or_default();
        let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
        std::str::from_utf8(&rest[..end]).unwrap_or("")
    }

    /// Follows typedefs and qualifiers to the underlying type.
    fn skip_mods(&self, mut id: u32) -> u32 {
        for _ in 0..32 {
            match self.head(id) {
                Some(h)
                    if matches!(
                        h.kind,
                        KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG
                    ) =>
                {
                    id = h.size_or_type
                }
                _ => break,
            }
        }
        id
    }

    fn size_of(&self, id: u32) -> u32 {
        let id = self.skip_mods(id);
        let Some(h) = self.head(id) else {
            return 0;
        };
        match h.kind {
            KIND_PTR => 8,
            KIND_ARRAY => {
                let (elem, n) = (self.u32_in(h.extra), self.u32_in(h.extra + 8));
                self.size_of(elem).saturating_mul(n)
            }
            KIND_INT | KIND_STRUCT | KIND_UNION | KIND_ENUM | KIND_ENUM64 | KIND_FLOAT => {
                h.size_or_type
            }
            _ => 0,
        }
    }

    /// Type `id`'s members as (name, type, bit offset), if it is a struct
    /// or union.
    fn members(&self, id: u32) -> impl Iterator<Item = (u32, u32, u32)> + '_ {
        let h = self
            .head(self.skip_mods(id))
            .filter(|h| matches!(h.kind, KIND_STRUCT | KIND_UNION));
        let (extra, vlen, kind_flag) = h.map_or((0, 0, false), |h| (h.extra, h.vlen, h.kind_flag));
        (0..vlen).map(move |i| {
            let m = extra + i * 12;
            let raw = self.u32_in(m + 8);
            // With kind_flag the top byte is a bitfield size.
            let bits = if kind_flag { raw & 0xff_ffff } else { raw };
            (self.u32_in(m), self.u32_in(m + 4), bits)
        })
    }

    /// Finds `name` among `id`'s members, looking inside anonymous members.
    /// Returns the member's bit offset from the start of `id` and its type.
    fn find_member(&self, id: u32, name: &str, depth: u32) -> Option<(u32, u32)> {
        if depth > 8 {
            return None;
        }
        if let Some((_, ty, bits)) = self
            .members(id)
            .find(|&(n, _, _)| n != 0 && self.str(n) == name)
        {
            return Some((bits, ty));
        }
        self.members(id)
            .filter(|&(n, _, _)| n == 0)
            .find_map(|(_, ty, bits)| {
                let (off, found) = self.find_member(ty, name, depth + 1)?;
                Some((bits + off, found))
            })
    }

    /// The id of struct or union `name`.
    pub fn struct_id(&self, name: &str) -> Option<u32> {
        self.structs_by_name
            .get(name)
            .copied()
            .or_else(|| self.find(KIND_UNION, name).map(|(id, _)| id))
    }

    /// What type `id` is, past typedefs and qualifiers.
    pub fn shape(&self, id: u32) -> Shape {
        let id = self.skip_mods(id);
        let Some(h) = self.head(id) else {
            return Shape::Void;
        };
        match h.kind {
            KIND_INT => Shape::Int {
                size: h.size_or_type,
                // BTF_INT_SIGNED is bit 0 of the encoding, in bits 24..28.
                signed: (self.u32_in(h.extra) >> 24) & 1 == 1,
            },
            KIND_ENUM | KIND_ENUM64 => Shape::Int {
                size: h.size_or_type,
                signed: h.kind_flag,
            },
            KIND_PTR => Shape::Pointer(h.size_or_type),
            KIND_STRUCT | KIND_UNION => Shape::Struct {
                id,
                name: self.str(h.name).to_owned(),
            },
            KIND_ARRAY => Shape::Array(self.u32_in(h.extra)),
            _ => Shape::Other,
        }
    }

    /// The byte offset and type of member `name` of struct or union `id`,
    /// looking inside anonymous members.
    pub fn member_of(&self, id: u32, name: &str) -> Option<(u32, u32)> {
        self.find_member(id, name, 0)
            .map(|(bits, ty)| (bits / 8, ty))
    }

    /// The names of the members of struct or union `id`, for errors.
    pub fn member_names(&self, id: u32) -> Vec<String> {
        self.members(id)
            .filter(|&(n, _, _)| n != 0)
            .map(|(n, _, _)| self.str(n).to_owned())
            .collect()
    }

    /// The id of the first type of `kind` named `name`.
    fn find(&self, kind: u32, name: &str) -> Option<(u32, Head)> {
        self.all()
            .find(|(_, h)| h.kind == kind && h.name != 0 && self.str(h.name) == name)
    }

    /// The number of C arguments tracepoint `event` passes to tp_btf and
    /// raw tracepoint programs, from its `btf_trace_<event>` typedef (whose
    /// prototype has a leading context pointer besides).
    pub fn tracepoint_args(&self, event: &str) -> Option<u32> {
        let (_, def) = self.find(KIND_TYPEDEF, &format!("btf_trace_{event}"))?;
        let ptr = self.head(def.size_or_type)?;
        let proto = self.head(ptr.size_or_type)?;
        (ptr.kind == KIND_PTR && proto.kind == KIND_FUNC_PROTO)
            .then(|| (proto.vlen as u32).saturating_sub(1))
    }

    /// The value of enumerator `name`, in whichever enum defines it.
    pub fn enum_value(&self, name: &str) -> Option<i64> {
        self.all().find_map(|(_, h)| match h.kind {
            KIND_ENUM => (0..h.vlen).find_map(|i| {
                let v = h.extra + i * 8;
                (self.str(self.u32_in(v)) == name).then(|| {
                    let value = self.u32_in(v + 4);
                    // Signed enums (kind_flag) sign-extend.
                    if h.kind_flag {
                        i64::from(value as i32)
                    } else {
                        i64::from(value)
                    }
                })
            }),
            KIND_ENUM64 => (0..h.vlen).find_map(|i| {
                let v = h.extra + i * 12;
                (self.str(self.u32_in(v)) == name).then(|| {
                    let (lo, hi) = (self.u32_in(v + 4), self.u32_in(v + 8));
                    ((u64::from(hi) << 32) | u64::from(lo)) as i64
                })
            }),
            _ => None,
        })
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

    /// The type id of attach target `name`: a function for fentry and
    /// fexit, or for tp_btf the `btf_trace_<event>` typedef.
    pub fn attach_id(&self, target: AttachTarget<'_>) -> Option<u32> {
        match target {
            AttachTarget::Function(f) => self.find(KIND_FUNC, f),
            AttachTarget::Tracepoint(e) => self.find(KIND_TYPEDEF, &format!("btf_trace_{e}")),
        }
        .map(|(id, _)| id)
    }

    /// The BTF that aya's tp_btf, fentry and fexit loads look attach
    /// targets up in, covering type ids up to `upto`.
    ///
    /// aya takes a whole `aya::Btf` only to find one type id by name, so
    /// instead of a second parse of vmlinux it gets a blob with the same
    /// type ids in which every type is an empty pointer but the functions
    /// and the `btf_trace_*` typedefs, with their names. It stops at
    /// `upto`: the tracepoints' typedefs come early among vmlinux's types,
    /// so most tools need a small part of it.
    pub fn attach_ids(&self, upto: u32) -> Result<aya::Btf, BtfError> {
        let mut strings: Vec<u8> = vec![0];
        let count = (upto as usize).min(self.starts.len());
        let mut types: Vec<u8> = Vec::with_capacity(count * TYPE_HEADER_BYTES);
        for (_, h) in self.all().take_while(|&(id, _)| id <= upto) {
            let named = match h.kind {
                KIND_FUNC => true,
                KIND_TYPEDEF => self.str(h.name).starts_with("btf_trace_"),
                _ => false,
            };
            let (name, info) = if named {
                let at = strings.len() as u32;
                strings.extend_from_slice(self.str(h.name).as_bytes());
                strings.push(0);
                (at, h.kind << 24)
            } else {
                (0, KIND_PTR << 24)
            };
            for word in [name, info, 0] {
                types.extend_from_slice(&word.to_le_bytes());
            }
        }
        let mut blob =
            Vec::with_capacity(rtrace_common::btf::HEADER_BYTES + types.len() + strings.len());
        blob.extend_from_slice(&rtrace_common::btf::header(
            types.len() as u32,
            strings.len() as u32,
        ));
        blob.extend_from_slice(&types);
        blob.extend_from_slice(&strings);
        aya::Btf::parse(&blob, aya::Endianness::Little).map_err(|e| BtfError::Stub(e.to_string()))
    }
}

/// What a BTF-attached program attaches to.
#[derive(Debug, Clone, Copy)]
pub enum AttachTarget<'a> {
    /// A kernel function, for fentry and fexit.
    Function(&'a str),
    /// A tracepoint event, for tp_btf.
    Tracepoint(&'a str),
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
    fn attach_ids_are_the_kernels_type_ids() {
        use aya_obj::btf::BtfKind;
        let btf = kernel();
        let full = aya::Btf::from_sys_fs().unwrap();
        let targets = [
            (
                "btf_trace_sched_switch",
                BtfKind::Typedef,
                AttachTarget::Tracepoint("sched_switch"),
            ),
            (
                "btf_trace_block_rq_complete",
                BtfKind::Typedef,
                AttachTarget::Tracepoint("block_rq_complete"),
            ),
            (
                "vfs_read",
                BtfKind::Func,
                AttachTarget::Function("vfs_read"),
            ),
            (
                "ext4_file_read_iter",
                BtfKind::Func,
                AttachTarget::Function("ext4_file_read_iter"),
            ),
        ];
        for (name, kind, target) in targets {
            let want = full.id_by_type_name_kind(name, kind).unwrap();
            let id = btf.attach_id(target).unwrap();
            assert_eq!(id, want, "{name}");
            // A stub that reaches the id finds it; one that stops short does
            // not.
            let stub = btf.attach_ids(id).unwrap();
            assert_eq!(stub.id_by_type_name_kind(name, kind).unwrap(), want);
            let short = btf.attach_ids(id - 1).unwrap();
            assert!(short.id_by_type_name_kind(name, kind).is_err(), "{name}");
        }
        let missing = AttachTarget::Tracepoint("no_such_event");
        assert!(btf.attach_id(missing).is_none());
        let whole = btf.attach_ids(u32::MAX).unwrap();
        assert!(
            whole
                .id_by_type_name_kind("task_struct", BtfKind::Struct)
                .is_err()
        );
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

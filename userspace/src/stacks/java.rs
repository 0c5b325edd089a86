//! HotSpot (OpenJDK) JVM processes, for the kernel walk's Java frames
//! (`ebpf-programs/src/java.rs`): finding `libjvm.so` in a process, the
//! layout of the JVM's own types from its `gHotSpotVMStructs` tables (the
//! serviceability agent's, read from the live process: no attaching, no
//! agent, nothing the JVM notices), its code heaps for the kernel's
//! `CodeBlob` lookup, and the names of the frames the walk writes: the
//! methods of compiled code (with the methods inlined at its pc, from the
//! nmethod's debug information), of interpreted frames, and the names of
//! stubs. Facts and their sources: `docs` of the JVM walk (`jvm.md`).

use std::{
    collections::{BTreeMap, HashMap},
    fs::File,
    sync::Arc,
};

use rtrace_common::java::{
    BLOB_BYTES, INTERP_WINDOW, JAVA_ADDR_MASK, JAVA_COMPILED, JAVA_INTERPRETED, JAVA_MASK,
    JAVA_NATIVE, JAVA_STUB, JavaHeap, JavaProc, MAX_HEAPS, method_check,
};

use crate::kernel::procmaps::{MapsOnce, Proc};
use crate::kernel::procmem::{Mem, open_mem_in};
use crate::kernel::warning::Warning;

/// What kind of code a [`JavaFrame`] ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum JavaKind {
    /// Run by the template interpreter.
    Interpreted,
    /// A method compiled by C1 or C2 (an nmethod), the physical frame.
    Compiled,
    /// A method inlined into a compiled one at the frame's pc.
    Inlined,
    /// A native method's wrapper (a `native nmethod`).
    Native,
    /// Any other code blob: the interpreter, stubs, adapters.
    Stub,
    /// A frame that could not be named: its code was freed or reused
    /// (the check in its slot failed), or could not be read.
    Unknown,
}

/// A named Java frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JavaFrame {
    /// As Java users read it: `java.util.HashMap.get` (the class's name
    /// with `/` made `.`, then the method's; no signature). Stubs: the
    /// blob's own name in brackets (`[StubRoutines (1)]`,
    /// `[Interpreter]`); frames that could not be named `[java: gone]`.
    pub name: Arc<str>,
    /// What kind of code it ran.
    pub kind: JavaKind,
    /// The source file (`Hot.java`), where the class says.
    pub file: Option<Arc<str>>,
    /// The line, only if configured with lines and the method has a line
    /// table.
    pub line: Option<u32>,
}

/// The name of a frame whose code was freed or reused since the walk.
const GONE: &str = "[java: gone]";

/// Hops of the segment map a lookup takes at most (a hop goes back at
/// most 254 segments; 4096 of them span far more than any blob).
const MAX_HOPS: usize = 4096;

/// Scopes of one pc at most (HotSpot's inlining depth is 15 by default).
const MAX_SCOPES: usize = 64;

/// Bytes of an nmethod's PcDescs or scopes read at most.
const MAX_DEBUG_BYTES: u64 = 4 << 20;

/// Where a field of a HotSpot type is, as the tables say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    /// An instance field, at this offset in the object.
    Offset(u64),
    /// A static field, at this address of the file (the load bias taken
    /// off, so the tables serve every process of a build).
    Static(u64),
}

/// A libjvm build's `gHotSpotVMStructs`, `gHotSpotVMTypes` and
/// `gHotSpotVMIntConstants`.
#[derive(Debug, Default)]
struct Tables {
    /// By type and field: where it is, and its C++ type.
    fields: HashMap<(String, String), (Place, String)>,
    /// By type: its size.
    sizes: HashMap<String, u64>,
    /// By name.
    ints: HashMap<String, i64>,
}

impl Tables {
    fn field(&self, ty: &str, field: &str) -> Option<&(Place, String)> {
        self.fields.get(&(ty.to_owned(), field.to_owned()))
    }

    /// Offset of instance field `field` of the first of `types` that has it
    /// (fields moved from `CompiledMethod` to `nmethod` in JDK 23).
    fn off(&self, types: &[&str], field: &str) -> Option<u64> {
        types.iter().find_map(|t| match self.field(t, field) {
            Some((Place::Offset(o), _)) => Some(*o),
            _ => None,
        })
    }

    /// Bytes of instance field `field` of the first of `types` that has it,
    /// from its C++ type (pointers 8; 4 if unknown).
    fn width(&self, types: &[&str], field: &str) -> u64 {
        let ty = types
            .iter()
            .find_map(|t| self.field(t, field).map(|f| f.1.as_str()));
        match ty {
            Some(t) if t.ends_with('*') || t == "address" || t.contains("64") => 8,
            Some("u2" | "int16_t" | "uint16_t" | "jshort" | "short") => 2,
            Some("u1" | "bool" | "int8_t" | "uint8_t" | "CodeBlobKind" | "jbyte") => 1,
            _ => 4,
        }
    }

    /// File address of static field `field` of `ty`.
    fn stat(&self, ty: &str, field: &str) -> Option<u64> {
        match self.field(ty, field) {
            Some((Place::Static(a), _)) => Some(*a),
            _ => None,
        }
    }

    fn size(&self, ty: &str) -> Option<u64> {
        self.sizes.get(ty).copied()
    }
}

/// Where an nmethod keeps its debug information, which moved twice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DebugInfo {
    /// JDK 9–22: PcDescs from `nm+_scopes_pcs_offset` to
    /// `nm+_dependencies_offset`; scopes at `_scopes_data_begin` (a
    /// pointer); metadata from `nm+_metadata_offset` to the scopes.
    InBlob {
        pcs: u64,
        pcs_end: u64,
        scopes_begin: u64,
        metadata: u64,
    },
    /// JDK 23–24: PcDescs and scopes in `_immutable_data`; metadata at
    /// the data section's `_metadata_offset` (a `u16`).
    Immutable {
        immutable: u64,
        pcs: u64,
        scopes: u64,
        data: u64,
        metadata: u64,
    },
    /// JDK 25+: as 23's, but metadata after the relocations in
    /// `_mutable_data`.
    Mutable {
        immutable: u64,
        pcs: u64,
        scopes: u64,
        mutable: u64,
        mutable_size: u64,
        relocation_size: u64,
    },
}

/// What one libjvm build's tables give: the offsets the kernel and the
/// names need.
#[derive(Debug)]
struct Layout {
    tables: Tables,
    /// Static addresses (file addresses) of the code cache's heaps and
    /// bounds, and of the version.
    heaps: u64,
    low_bound: u64,
    high_bound: u64,
    vm_major: Option<u64>,
    jdk_current: Option<u64>,
    vm_release: Option<u64>,
    ga_len: u64,
    ga_data: u64,
    heap_memory: u64,
    heap_segmap: u64,
    heap_log2: u64,
    vs_low: u64,
    vs_high: u64,
    /// `HeapBlock::Header::_used`, if told.
    block_used: Option<u64>,
    blob_name: u64,
    nm_size: u64,
    nm_method: u64,
    nm_compile_id: u64,
    debug: DebugInfo,
    method_const: u64,
    cm_size: u64,
    cm_constants: u64,
    cm_method_size: u64,
    cm_flags: u64,
    cm_flags_width: u64,
    cm_code_size: u64,
    cm_name_index: u64,
    cp_size: u64,
    cp_holder: u64,
    cp_length: Option<u64>,
    /// `ConstantPool::_source_file_name_index` (15+), else
    /// `InstanceKlass`'s (its holder's).
    source_in_cp: bool,
    source_index: Option<u64>,
    klass_name: u64,
    /// `Symbol`'s 16-bit hash (`JavaProc::sym_hash`).
    sym_hash: u64,
    /// `AbstractInterpreter::_code` (static), `StubQueue::_stub_buffer`,
    /// `_buffer_limit` and `_queue_end`: the interpreter's code
    /// ([`interpreter`]), where the tables have all four.
    interp: Option<(u64, u64, u64, u64)>,
    /// `Universe::_collectedHeap` (static) and
    /// `CollectedHeap::_total_collections`: where the kernel reads the
    /// JVM's count of collections ([`gc_count`]), where the tables have
    /// both.
    gc_count: Option<(u64, u64)>,
    /// `StubRoutines::_call_stub_return_address` (static), where the
    /// tables have it (`JavaProc::call_stub_ret`).
    call_stub: Option<u64>,
    sym_length: u64,
    sym_body: u64,
    /// The kernel's record, without the process's heaps and salt.
    record: JavaProc,
    /// Why the kernel is not given this build's record, if it is not.
    refused: Option<String>,
}

impl Layout {
    /// The offsets from `t`, or which is missing.
    fn new(t: Tables) -> Result<Self, String> {
        let need = |ty: &[&str], f: &str| {
            t.off(ty, f)
                .ok_or_else(|| format!("its tables have no {}::{f}", ty.join("/")))
        };
        let stat = |ty: &str, f: &str| {
            t.stat(ty, f)
                .ok_or_else(|| format!("its tables have no static {ty}::{f}"))
        };
        let size = |ty: &str| {
            t.size(ty)
                .ok_or_else(|| format!("its tables have no size of {ty}"))
        };
        const BLOB: &[&str] = &["CodeBlob"];
        const NM: &[&str] = &["nmethod", "CompiledMethod"];
        let (code_is_offset, blob_code) = match t.off(BLOB, "_code_begin") {
            Some(o) => (false, o),
            None => (true, need(BLOB, "_code_offset")?),
        };
        let (deopt_is_offset, nm_deopt) = match t.off(NM, "_deopt_handler_begin") {
            Some(o) => (false, o),
            None => match t
                .off(NM, "_deopt_handler_entry_offset")
                .or_else(|| t.off(NM, "_deopt_handler_offset"))
            {
                Some(o) => (true, o),
                // The kernel then does without deoptimized frames' pcs.
                None => (false, 0),
            },
        };
        let debug = if let Some(immutable) = t.off(NM, "_immutable_data") {
            let pcs = need(NM, "_scopes_pcs_offset")?;
            let scopes = need(NM, "_scopes_data_offset")?;
            match t.off(BLOB, "_mutable_data") {
                Some(mutable) => DebugInfo::Mutable {
                    immutable,
                    pcs,
                    scopes,
                    mutable,
                    mutable_size: need(BLOB, "_mutable_data_size")?,
                    relocation_size: need(BLOB, "_relocation_size")?,
                },
                None => DebugInfo::Immutable {
                    immutable,
                    pcs,
                    scopes,
                    data: need(BLOB, "_data_offset")?,
                    metadata: need(NM, "_metadata_offset")?,
                },
            }
        } else {
            DebugInfo::InBlob {
                pcs: need(NM, "_scopes_pcs_offset")?,
                pcs_end: need(NM, "_dependencies_offset")?,
                scopes_begin: need(NM, "_scopes_data_begin")?,
                metadata: need(NM, "_metadata_offset")?,
            }
        };
        let (sym_length, sym_body) = match t.off(&["Symbol"], "_length") {
            Some(o) => (o, need(&["Symbol"], "_body")?),
            None => (
                need(&["Symbol"], "_length_and_refcount")? + 2,
                need(&["Symbol"], "_body")?,
            ),
        };
        let (cm_flags, cm_flags_width) = match t.off(&["ConstMethod"], "_flags._flags") {
            Some(o) => (o, t.width(&["ConstMethod"], "_flags._flags")),
            None => (
                need(&["ConstMethod"], "_flags")?,
                t.width(&["ConstMethod"], "_flags"),
            ),
        };
        let source_cp = t.off(&["ConstantPool"], "_source_file_name_index");
        let source_index =
            source_cp.or_else(|| t.off(&["InstanceKlass"], "_source_file_name_index"));
        let ga = &["GrowableArrayBase", "GenericGrowableArray"];
        let heap_block = size("HeapBlock")?;
        let blob_name = need(BLOB, "_name")?;
        let frame_size = need(BLOB, "_frame_size")?;
        let frame_complete = need(BLOB, "_frame_complete_offset")?;
        let compile_id = need(NM, "_compile_id")?;
        let orig_pc = need(NM, "_orig_pc_offset")?;
        // Everything the kernel reads of a blob, in its one copy.
        let ends = [
            blob_name + 8,
            frame_size + t.width(BLOB, "_frame_size"),
            frame_complete + t.width(BLOB, "_frame_complete_offset"),
            blob_code + if code_is_offset { 4 } else { 8 },
            compile_id + 4,
            orig_pc + 4,
            if nm_deopt == 0 {
                0
            } else {
                nm_deopt + if deopt_is_offset { 4 } else { 8 }
            },
        ];
        let blob_read = ends.iter().max().copied().unwrap_or(0).next_multiple_of(8);
        let refused = (blob_read > BLOB_BYTES as u64).then(|| {
            format!(
                "its nmethod's fields lie {blob_read} bytes into it, past the \
                 {BLOB_BYTES} the kernel reads"
            )
        });
        let sender_sp = t
            .ints
            .get("frame::interpreter_frame_sender_sp_offset")
            .map_or(-8, |w| w * 8);
        // The kernel reads an interpreted frame's slots in one read of
        // `INTERP_WINDOW` bytes below its frame pointer.
        let refused = refused.or_else(|| {
            let window = -(INTERP_WINDOW as i64)..0;
            (!window.contains(&sender_sp) || sender_sp % 8 != 0).then(|| {
                format!(
                    "its interpreted frames keep their sender's sp at {sender_sp}, \
                     outside the {INTERP_WINDOW} bytes below the frame pointer the kernel reads"
                )
            })
        });
        let method_const = need(&["Method"], "_constMethod")?;
        let cm_size = size("ConstMethod")?;
        let cm_constants = need(&["ConstMethod"], "_constants")?;
        let cp_holder = need(&["ConstantPool"], "_pool_holder")?;
        let klass_name = need(&["Klass"], "_name")?;
        // The hash is `_hash_and_refcount`'s high half (JDK 12+), or
        // `_identity_hash` (JDK 9-11; random too).
        let sym_hash = match t.off(&["Symbol"], "_hash_and_refcount") {
            Some(o) => o + 2,
            None => need(&["Symbol"], "_identity_hash")?,
        };
        let record = JavaProc {
            heap_block: heap_block as u16,
            blob_read: blob_read as u16,
            blob_name: blob_name as u16,
            blob_frame_size: frame_size as u16,
            blob_frame_complete: frame_complete as u16,
            blob_code: blob_code as u16,
            nm_compile_id: compile_id as u16,
            nm_orig_pc: orig_pc as u16,
            nm_deopt: nm_deopt as u16,
            method_const: method_const as u16,
            const_method_size: cm_size as u16,
            cm_constants: cm_constants as u16,
            cp_holder: cp_holder as u16,
            klass_name: klass_name as u16,
            sym_hash: sym_hash as u16,
            // Not in the tables: HotSpot's x86-64 interpreter frame (JDK
            // 9+, after the mirror slot was added).
            interp_method: -24,
            interp_bcp: -64,
            interp_sender_sp: sender_sp as i16,
            code_is_offset: u8::from(code_is_offset),
            deopt_is_offset: u8::from(deopt_is_offset),
            frame_complete_short: u8::from(t.width(BLOB, "_frame_complete_offset") == 2),
            ..JavaProc::default()
        };
        Ok(Self {
            heaps: stat("CodeCache", "_heaps")?,
            low_bound: stat("CodeCache", "_low_bound")?,
            high_bound: stat("CodeCache", "_high_bound")?,
            vm_major: t.stat("Abstract_VM_Version", "_vm_major_version"),
            jdk_current: t.stat("JDK_Version", "_current"),
            vm_release: t.stat("Abstract_VM_Version", "_s_vm_release"),
            ga_len: need(ga, "_len")?,
            ga_data: need(&["GrowableArray<int>"], "_data")?,
            heap_memory: need(&["CodeHeap"], "_memory")?,
            heap_segmap: need(&["CodeHeap"], "_segmap")?,
            heap_log2: need(&["CodeHeap"], "_log2_segment_size")?,
            vs_low: need(&["VirtualSpace"], "_low_boundary")?,
            vs_high: need(&["VirtualSpace"], "_high_boundary")?,
            block_used: t.off(&["HeapBlock::Header"], "_used"),
            blob_name,
            nm_size: size("nmethod")?,
            nm_method: need(NM, "_method")?,
            nm_compile_id: compile_id,
            debug,
            method_const,
            cm_size,
            cm_constants,
            cm_method_size: need(&["ConstMethod"], "_constMethod_size")?,
            cm_flags,
            cm_flags_width,
            cm_code_size: need(&["ConstMethod"], "_code_size")?,
            cm_name_index: need(&["ConstMethod"], "_name_index")?,
            cp_size: size("ConstantPool")?,
            cp_holder,
            cp_length: t.off(&["ConstantPool"], "_length"),
            source_in_cp: source_cp.is_some(),
            source_index,
            klass_name,
            sym_hash,
            interp: (|| {
                let q = &["StubQueue"];
                Some((
                    t.stat("AbstractInterpreter", "_code")?,
                    t.off(q, "_stub_buffer")?,
                    t.off(q, "_buffer_limit")?,
                    t.off(q, "_queue_end")?,
                ))
            })(),
            gc_count: t
                .stat("Universe", "_collectedHeap")
                .zip(t.off(&["CollectedHeap"], "_total_collections")),
            call_stub: t.stat("StubRoutines", "_call_stub_return_address"),
            sym_length,
            sym_body,
            record,
            refused,
            tables: t,
        })
    }
}

/// What one libjvm file says, by file: where its tables' pointers and
/// layout variables are.
#[derive(Debug)]
struct JvmFile {
    /// File addresses of the `gHotSpot*` symbols.
    syms: HashMap<String, u64>,
    /// The page of the virtual address its file offset 0 is loaded at.
    base: u64,
}

/// Reads a libjvm's `.dynsym`: `None` if it has no `gHotSpotVMStructs`.
fn read_file(f: &File) -> Option<JvmFile> {
    use object::{Object as _, ObjectSymbol as _};
    let data = crate::kernel::memory::Mapped::of(f).ok()?;
    let elf = object::File::parse(&*data).ok()?;
    let syms: HashMap<String, u64> = elf
        .dynamic_symbols()
        .filter(|s| !s.is_undefined())
        .filter_map(|s| {
            let n = s.name().ok()?;
            // Versioned names (`@@SUNWprivate_1.1`) are not in `name()`.
            n.starts_with("gHotSpot")
                .then(|| (n.to_owned(), s.address()))
        })
        .collect();
    if !syms.contains_key("gHotSpotVMStructs") {
        return None;
    }
    let base = crate::kernel::elf::offset_to_vaddr(&elf, 0)? & !0xfff;
    Some(JvmFile { syms, base })
}

/// Reads a build's tables from a live process whose libjvm has load bias
/// `bias`. `Ok(None)`: not yet set up (the layout variables are set by a
/// dynamic initializer).
fn read_tables(mem: &Mem, file: &JvmFile, bias: u64) -> Result<Option<Tables>, String> {
    let var = |name: &str| -> Result<u64, String> {
        let a = file
            .syms
            .get(name)
            .ok_or_else(|| format!("libjvm.so does not export {name}"))?;
        mem.u64(a.wrapping_add(bias))
            .ok_or_else(|| format!("cannot read its {name}"))
    };
    let structs = var("gHotSpotVMStructs")?;
    let types = var("gHotSpotVMTypes")?;
    let stride = var("gHotSpotVMStructEntryArrayStride")?;
    if structs == 0 || types == 0 || stride == 0 {
        return Ok(None);
    }
    let (s_type, s_field, s_string) = (
        var("gHotSpotVMStructEntryTypeNameOffset")?,
        var("gHotSpotVMStructEntryFieldNameOffset")?,
        var("gHotSpotVMStructEntryTypeStringOffset")?,
    );
    let (s_static, s_offset, s_address) = (
        var("gHotSpotVMStructEntryIsStaticOffset")?,
        var("gHotSpotVMStructEntryOffsetOffset")?,
        var("gHotSpotVMStructEntryAddressOffset")?,
    );
    let t_stride = var("gHotSpotVMTypeEntryArrayStride")?;
    let (t_name, t_size) = (
        var("gHotSpotVMTypeEntryTypeNameOffset")?,
        var("gHotSpotVMTypeEntrySizeOffset")?,
    );
    let fits = |off: u64, len: u64, stride: u64| off + len <= stride && stride <= 256;
    if !fits(s_type, 8, stride)
        || !fits(s_field, 8, stride)
        || !fits(s_string, 8, stride)
        || !fits(s_static, 4, stride)
        || !fits(s_offset, 8, stride)
        || !fits(s_address, 8, stride)
        || !fits(t_name, 8, t_stride)
        || !fits(t_size, 8, t_stride)
    {
        return Err("its gHotSpotVMStructs layout variables make no sense".to_owned());
    }
    let mut names: HashMap<u64, Option<String>> = HashMap::new();
    let mut name = |a: u64| names.entry(a).or_insert_with(|| mem.cstr(a)).clone();
    let word = |e: &[u8], off: u64| {
        let o = off as usize;
        e.get(o..o + 8)
            .and_then(|b| b.try_into().ok())
            .map_or(0, u64::from_le_bytes)
    };
    let mut t = Tables::default();
    // Entries until one with no type name; a few thousand at most.
    'structs: for chunk in 0..64u64 {
        let block =
            read_entries(mem, structs, chunk, stride).ok_or("cannot read its gHotSpotVMStructs")?;
        for e in block.chunks_exact(stride as usize) {
            let ty = word(e, s_type);
            if ty == 0 {
                break 'structs;
            }
            let (Some(ty), Some(field)) = (name(ty), name(word(e, s_field))) else {
                continue;
            };
            let string = name(word(e, s_string)).unwrap_or_default();
            let place = if word(e, s_static) as u32 != 0 {
                Place::Static(word(e, s_address).wrapping_sub(bias))
            } else {
                Place::Offset(word(e, s_offset))
            };
            t.fields.insert((ty, field), (place, string));
        }
    }
    'types: for chunk in 0..64u64 {
        let block =
            read_entries(mem, types, chunk, t_stride).ok_or("cannot read its gHotSpotVMTypes")?;
        for e in block.chunks_exact(t_stride as usize) {
            let ty = word(e, t_name);
            if ty == 0 {
                break 'types;
            }
            if let Some(ty) = name(ty) {
                t.sizes.insert(ty, word(e, t_size));
            }
        }
    }
    // Only the interpreter frame's sender sp is wanted; absent, the
    // usual −1 word is taken.
    if let (Ok(ints), Ok(stride), Ok(n_off), Ok(v_off)) = (
        var("gHotSpotVMIntConstants"),
        var("gHotSpotVMIntConstantEntryArrayStride"),
        var("gHotSpotVMIntConstantEntryNameOffset"),
        var("gHotSpotVMIntConstantEntryValueOffset"),
    ) && ints != 0
        && fits(n_off, 8, stride)
        && fits(v_off, 4, stride)
    {
        'ints: for chunk in 0..64u64 {
            let Some(block) = read_entries(mem, ints, chunk, stride) else {
                break;
            };
            for e in block.chunks_exact(stride as usize) {
                let n = word(e, n_off);
                if n == 0 {
                    break 'ints;
                }
                if let Some(n) = name(n).filter(|n| n.starts_with("frame::")) {
                    let v = word(e, v_off) as u32 as i32;
                    t.ints.insert(n, i64::from(v));
                }
            }
        }
    }
    Ok(Some(t))
}

/// Block `chunk` of 64 entries of `stride` bytes of the table at `base`;
/// near the end of its mapping, the entries that can be read (at least
/// one).
fn read_entries(mem: &Mem, base: u64, chunk: u64, stride: u64) -> Option<Vec<u8>> {
    let at = base + chunk * 64 * stride;
    mem.read(at, (64 * stride) as usize).or_else(|| {
        let mut out = Vec::new();
        while let Some(e) = mem.read(at + out.len() as u64, stride as usize) {
            out.extend_from_slice(&e);
            if out.len() as u64 == 64 * stride {
                break;
            }
        }
        (!out.is_empty()).then_some(out)
    })
}

/// A process found to run a JVM.
struct Jvm {
    layout: Arc<Layout>,
    /// The load bias of its libjvm.
    bias: u64,
    mem: Mem,
    record: JavaProc,
    /// The feature version (17, 21, 25).
    major: u32,
    comm: String,
}

impl Jvm {
    /// UNSIGNED5's excluded byte count: 1 from JDK 20 (JDK-8298471).
    fn x(&self) -> u32 {
        u32::from(self.major >= 20)
    }

    /// The `CodeBlob*` holding `pc`, by its heap's segment map, as the
    /// kernel finds it.
    fn blob_at(&self, pc: u64) -> Option<u64> {
        let r = &self.record;
        let heap = r.heaps[..(r.nheaps as usize).min(MAX_HEAPS)]
            .iter()
            .find(|h| h.low <= pc && pc < h.high)?;
        let mut i = (pc - heap.low) >> heap.log2_segment;
        for _ in 0..MAX_HOPS {
            let b = *self.mem.read(heap.segmap + i, 1)?.first()?;
            match b {
                0xff => return None,
                0 => {
                    let block = heap.low + (i << heap.log2_segment);
                    if let Some(used) = self.layout.block_used
                        && self.mem.read(block + used, 1)?.first() == Some(&0)
                    {
                        return None;
                    }
                    return Some(block + u64::from(r.heap_block));
                }
                b => i = i.checked_sub(u64::from(b))?,
            }
        }
        None
    }
}

/// Reads the code heaps of a JVM whose libjvm has bias `bias`: `Ok(None)`
/// while it is starting (`CodeCache::_heaps` not yet set up).
fn read_heaps(mem: &Mem, l: &Layout, bias: u64) -> Result<Option<Vec<JavaHeap>>, String> {
    let heaps = mem
        .u64(l.heaps + bias)
        .ok_or("cannot read CodeCache::_heaps")?;
    if heaps == 0 {
        return Ok(None);
    }
    let len = mem
        .i32(heaps + l.ga_len)
        .ok_or("cannot read its code heaps")?;
    let data = mem
        .u64(heaps + l.ga_data)
        .ok_or("cannot read its code heaps")?;
    if len <= 0 || data == 0 {
        return Ok(None);
    }
    if len as usize > MAX_HEAPS {
        return Err(format!(
            "its code cache has {len} heaps, more than the {MAX_HEAPS} the walk takes"
        ));
    }
    let mut out = Vec::new();
    for i in 0..len as u64 {
        let h = mem.u64(data + 8 * i).ok_or("cannot read its code heaps")?;
        let low = mem.u64(h + l.heap_memory + l.vs_low);
        let high = mem.u64(h + l.heap_memory + l.vs_high);
        let segmap = mem.u64(h + l.heap_segmap + l.vs_low);
        let log2 = mem.i32(h + l.heap_log2);
        let (Some(low), Some(high), Some(segmap), Some(log2)) = (low, high, segmap, log2) else {
            return Err("cannot read its code heaps".to_owned());
        };
        if low == 0 || high <= low || segmap == 0 {
            return Ok(None);
        }
        if !(0..=16).contains(&log2) {
            return Err(format!("a code heap's segment is 2^{log2} bytes"));
        }
        out.push(JavaHeap {
            low,
            high,
            segmap,
            log2_segment: log2 as u32,
            _pad: 0,
        });
    }
    Ok(Some(out))
}

/// The process's command name.
fn comm(pid: u32) -> String {
    crate::kernel::comm_of(pid).unwrap_or_default()
}

/// What looking at a process found.
enum Look {
    /// No libjvm (or none with tables).
    NotJvm,
    /// A JVM still starting: looked at again next time.
    Starting,
    Jvm(Box<Jvm>),
}

/// A method, named, and its lines.
#[derive(Debug)]
struct Method {
    name: Arc<str>,
    file: Option<Arc<str>>,
    /// (bci, line) in the table's order; empty without `--lines`.
    lines: Vec<(u32, u32)>,
}

impl Method {
    /// The line of bytecode `bci`: the entry with the largest bci at most
    /// it.
    fn line(&self, bci: i64) -> Option<u32> {
        let bci = u32::try_from(bci).ok()?;
        self.lines
            .iter()
            .filter(|(b, _)| *b <= bci)
            .max_by_key(|(b, _)| *b)
            .map(|&(_, l)| l)
    }
}

/// The JVM processes, and the names of their frames.
#[derive(Default)]
pub struct Java {
    /// Off with `--no-java`.
    disabled: bool,
    /// Frames carry lines (`--lines`).
    lines: bool,
    /// By libjvm file (device, inode).
    files: HashMap<(u64, u64), Option<Arc<JvmFile>>>,
    /// By libjvm file: its tables, read once from one of its processes.
    layouts: HashMap<(u64, u64), Arc<Layout>>,
    /// By process, not pid: a later process of the pid is looked at anew.
    procs: HashMap<Proc, Jvm>,
    /// Processes whose JVM was found still starting (its code not set up
    /// yet): looked at again every 100 ms (`StackTool::look_again`), as a
    /// thread blocked from its start may run no new code that would have
    /// it looked at again.
    starting: std::collections::HashSet<Proc>,
    /// Processes found to run no JVM the walk can read, and why (`None`:
    /// none at all).
    not: HashMap<Proc, Option<String>>,
    /// Named frames, by process and slots.
    frames: HashMap<(Proc, u64, u64), Arc<[JavaFrame]>>,
    /// Methods, by process, `Method*` and its `method_check`.
    methods: HashMap<(Proc, u64, u32), Option<Arc<Method>>>,
    /// Compiled methods read, by process, nmethod and compile id (`None`:
    /// not that nmethod, or unreadable).
    nmethods: HashMap<(Proc, u64, u32), Option<Nm>>,
    /// What `-v` says of the JVMs found.
    found: BTreeMap<Proc, String>,
    /// JVMs that cannot be walked, and why.
    failed: BTreeMap<u32, String>,
    /// Frames that could not be named.
    unnamed: u64,
}

impl Java {
    /// Turns the walk off (`--no-java`), and sets whether frames carry
    /// lines (`--lines`).
    pub fn configure(&mut self, enabled: bool, lines: bool) {
        self.disabled = !enabled;
        self.lines = lines;
    }

    /// Looks at process `who` (again if `fresh`: it ran a new program or
    /// mapped new code) and returns the record for the kernel if it maps a
    /// libjvm.so whose tables can be read and whose code cache is set up,
    /// and the kernel has not been given it yet. A JVM still starting is
    /// looked at again on the next call; a process without libjvm is
    /// remembered as not a JVM until `fresh`.
    pub fn examine(&mut self, maps: &MapsOnce, fresh: bool) -> Option<JavaProc> {
        let who = maps.who();
        let pid = who.pid;
        if self.disabled || pid == 0 {
            return None;
        }
        let known = self.procs.contains_key(&who);
        if fresh {
            self.not.remove(&who);
        } else if known || self.not.contains_key(&who) {
            return None;
        }
        self.starting.remove(&who);
        match self.find(maps) {
            // A JVM already read, looked at again for its new code, whose
            // mappings are gone (it is exiting: a zombie's maps are empty)
            // or cannot be read now keeps what was read and `-v`'s line:
            // both stay true of it until its exit record. (A new program
            // is forgotten before it is looked at, so it is never `known`
            // here.)
            Ok(Look::NotJvm | Look::Starting) | Err(_) if known => None,
            Ok(Look::NotJvm) => {
                self.not.insert(who, None);
                None
            }
            Ok(Look::Starting) => {
                self.starting.insert(who);
                None
            }
            Ok(Look::Jvm(j)) => {
                let refused = j.layout.refused.clone();
                let record = j.record;
                let heaps: Vec<String> = record.heaps[..record.nheaps as usize]
                    .iter()
                    .map(|h| format!("{:#x}-{:#x}", h.low, h.high))
                    .collect();
                let release = j
                    .layout
                    .vm_release
                    .and_then(|a| j.mem.u64(a + j.bias))
                    .and_then(|a| j.mem.cstr(a))
                    .unwrap_or_default();
                let line = format!(
                    "PID {pid} ({}): Java {} (JDK {}), {} code heaps ({}){}",
                    j.comm,
                    if release.is_empty() { "?" } else { &release },
                    j.major,
                    record.nheaps,
                    heaps.join(", "),
                    j.mem.how()
                );
                // Kept for naming even where refused: `blob_at` and the
                // names do not need the kernel.
                self.procs.insert(who, *j);
                match refused {
                    Some(why) => {
                        // Told once, not at each look again.
                        if !known {
                            self.warn(who, why);
                        }
                        None
                    }
                    None => {
                        self.found.insert(who, line);
                        Some(record)
                    }
                }
            }
            Err(why) => {
                self.warn(who, why.clone());
                self.not.insert(who, Some(why));
                None
            }
        }
    }

    /// Whether the walk was given process `who`'s JVM in this run (it may
    /// have exited since).
    pub fn walked(&self, who: Proc) -> bool {
        self.found.contains_key(&who)
    }

    fn warn(&mut self, who: Proc, why: String) {
        let pid = who.pid;
        eprintln!(
            "rtrace: PID {pid} ({}): no Java frames: {why}; native frames only",
            comm(pid)
        );
        self.failed.insert(pid, why);
    }

    /// The processes whose JVM was found still starting, to be looked
    /// at again ([`Self::examine`]).
    pub fn starting(&self) -> Vec<Proc> {
        self.starting.iter().copied().collect()
    }

    /// Forgets process `who`, which ran a new program: its methods and
    /// compiled methods too ([`Java::exited`] keeps them). The names of
    /// its frames stay, for its samples not named yet.
    pub fn forget(&mut self, who: Proc) {
        self.exited(who);
        self.methods.retain(|k, _| k.0 != who);
        self.nmethods.retain(|k, _| k.0 != who);
    }

    /// Forgets process `who`, which exited, but for what names its frames:
    /// its compiled methods' and its methods' names serve its samples not
    /// named yet, whose pcs and indexes the kernel told only the first of.
    /// (A new program in the process, [`Java::forget`], is not the same
    /// code at the same addresses.)
    pub fn exited(&mut self, who: Proc) {
        self.procs.remove(&who);
        self.not.remove(&who);
        self.starting.remove(&who);
    }

    /// Finds libjvm in `who`'s mappings and reads its tables and heaps.
    fn find(&mut self, maps: &MapsOnce) -> Result<Look, String> {
        let who = maps.who();
        let pid = who.pid;
        let (Some(proc_dir), Some(maps)) = (maps.dir(), maps.get()) else {
            return Ok(Look::NotJvm);
        };
        let Some(m) = maps
            .iter()
            .find(|m| m.offset == 0 && m.path().is_some_and(|p| p.ends_with("/libjvm.so")))
        else {
            return Ok(Look::NotJvm);
        };
        let key = m.file_key();
        let file = match self.files.get(&key) {
            Some(f) => f.clone(),
            None => {
                let f = m
                    .open(proc_dir)
                    .ok()
                    .and_then(|f| read_file(&f))
                    .map(Arc::new);
                self.files.insert(key, f.clone());
                f
            }
        };
        let Some(file) = file else {
            return Err("its libjvm.so has no gHotSpotVMStructs (not HotSpot?)".to_owned());
        };
        let bias = m.start.wrapping_sub(file.base);
        let mem = open_mem_in(who, proc_dir);
        if let Mem::Denied(why) = &mem {
            return Err(format!("its memory cannot be read: {why}"));
        }
        let layout = match self.layouts.get(&key) {
            Some(l) => Arc::clone(l),
            None => {
                let Some(t) = read_tables(&mem, &file, bias)? else {
                    return Ok(Look::Starting);
                };
                let l = Arc::new(Layout::new(t)?);
                self.layouts.insert(key, Arc::clone(&l));
                l
            }
        };
        let Some(heaps) = read_heaps(&mem, &layout, bias)? else {
            return Ok(Look::Starting);
        };
        let low_bound = mem.u64(layout.low_bound + bias).unwrap_or(0);
        let high_bound = mem.u64(layout.high_bound + bias).unwrap_or(0);
        if low_bound == 0 || high_bound <= low_bound {
            return Ok(Look::Starting);
        }
        let major = layout
            .vm_major
            .and_then(|a| mem.i32(a + bias))
            .filter(|&v| v > 0)
            .or_else(|| {
                let a = layout.jdk_current? + bias;
                let off = layout.tables.off(&["JDK_Version"], "_major").unwrap_or(0);
                mem.read(a + off, 1).map(|b| i32::from(b[0]))
            })
            .unwrap_or(0) as u32;
        if major < 9 {
            return Err(format!(
                "JDK {major} is not supported (JDK 9 and later are)"
            ));
        }
        let mut record = layout.record;
        for (slot, h) in record.heaps.iter_mut().zip(&heaps) {
            *slot = *h;
        }
        record.nheaps = heaps.len() as u32;
        record.low_bound = low_bound;
        record.high_bound = high_bound;
        // Found once its interpreter is made (no Java frame is before).
        let knows = layout.interp.is_some();
        match interpreter(&mem, &layout, bias) {
            Some((low, high)) => (record.interp_low, record.interp_high) = (low, high),
            None if knows => return Ok(Look::Starting),
            None => {}
        }
        record.gc_count = gc_count(&mem, &layout, bias).unwrap_or(0);
        record.salt = who.salt();
        let mut jvm = Jvm {
            layout,
            bias,
            mem,
            record,
            major,
            comm: comm(pid),
        };
        // Made with the first stubs, before the interpreter: there now.
        if let Some(ret) = jvm.layout.call_stub.and_then(|a| jvm.mem.u64(a + bias))
            && let Some(blob) = jvm.blob_at(ret)
        {
            (jvm.record.call_stub_ret, jvm.record.call_stub_blob) = (ret, blob);
        }
        Ok(Look::Jvm(Box::new(jvm)))
    }

    #[cfg(test)]
    /// The `CodeBlob*` of process `who`'s code cache holding `pc`, found
    /// by its heap's segment map as the kernel finds it.
    pub(crate) fn blob_at(&self, who: Proc, pc: u64) -> Option<u64> {
        self.procs.get(&who)?.blob_at(pc)
    }

    /// Names a Java frame from its two stack slots (`first` carries one
    /// of the `JAVA_*` tags), innermost first: a compiled frame gives one
    /// frame per method inlined at its pc, innermost first, then the
    /// compiled method itself. A frame whose code no longer passes its
    /// slot's check is `[java: gone]`, never another method's name.
    pub fn frames(&mut self, who: Proc, first: u64, second: u64) -> Vec<JavaFrame> {
        // A stub is named by its blob alone, whatever its pc (which the
        // kernel tells only the first of).
        let second = if first & JAVA_MASK == JAVA_STUB {
            0
        } else {
            second
        };
        if let Some(f) = self.frames.get(&(who, first, second)) {
            return f.to_vec();
        }
        let addr = first & JAVA_ADDR_MASK;
        let named = match first & JAVA_MASK {
            JAVA_COMPILED => self.compiled(who, addr, second, false),
            JAVA_NATIVE => self.compiled(who, addr, second, true),
            JAVA_INTERPRETED => self.interpreted(who, addr, second),
            JAVA_STUB => self.stub(who, addr),
            _ => None,
        };
        let frames: Arc<[JavaFrame]> = match named {
            Some(f) if !f.is_empty() => f.into(),
            _ => {
                self.unnamed += 1;
                Arc::new([JavaFrame {
                    name: Arc::from(GONE),
                    kind: JavaKind::Unknown,
                    file: None,
                    line: None,
                }])
            }
        };
        self.frames
            .insert((who, first, second), Arc::clone(&frames));
        frames.to_vec()
    }

    /// A stub's frame: its blob's name.
    fn stub(&self, who: Proc, blob: u64) -> Option<Vec<JavaFrame>> {
        let j = self.procs.get(&who)?;
        let name = j.mem.cstr(j.mem.u64(blob + j.layout.blob_name)?)?;
        if name.is_empty() || name.len() > 200 {
            return None;
        }
        Some(vec![JavaFrame {
            name: format!("[{name}]").into(),
            kind: JavaKind::Stub,
            file: None,
            line: None,
        }])
    }

    /// An interpreted frame: `Method*` `method`, whose `ConstMethod*`
    /// must match the check in `second`'s high half.
    fn interpreted(&mut self, who: Proc, method: u64, second: u64) -> Option<Vec<JavaFrame>> {
        let check = (second >> 32) as u32;
        let bci = second as u32;
        // Named before with this check, which the kernel took from the
        // method as it was sampled: the same `ConstMethod`, so the same
        // method, whatever the process has done since (exited, even). The
        // kernel tells of a method once, not of each of its indexes.
        if !self.methods.contains_key(&(who, method, check))
            && check_of(self.procs.get(&who)?, method)? != check
        {
            return None;
        }
        let m = self.checked_method(who, method, check)?;
        Some(vec![JavaFrame {
            name: Arc::clone(&m.name),
            kind: JavaKind::Interpreted,
            file: m.file.clone(),
            line: if bci == u32::MAX {
                None
            } else {
                m.line(i64::from(bci))
            },
        }])
    }

    /// A compiled frame (or a native method's wrapper): nmethod `nm`,
    /// whose live `_compile_id` must be `second`'s high half.
    fn compiled(
        &mut self,
        who: Proc,
        nm: u64,
        second: u64,
        native: bool,
    ) -> Option<Vec<JavaFrame>> {
        let key = (who, nm, (second >> 32) as u32);
        let mut n = match self.nmethods.remove(&key) {
            Some(n) => n,
            None => {
                let mut n = Nm::read(self.procs.get(&who)?, nm, key.2, native);
                if let Some(n) = &mut n {
                    n.complete(self, who);
                }
                n
            }
        };
        let named = n
            .as_mut()
            .and_then(|n| self.named(who, n, second as u32, native));
        self.nmethods.insert(key, n);
        named
    }

    /// The frames of compiled method `n` of process `who` at pc offset
    /// `offset`: the methods inlined there, innermost first, then its
    /// own.
    fn named(
        &mut self,
        who: Proc,
        n: &mut Nm,
        offset: u32,
        native: bool,
    ) -> Option<Vec<JavaFrame>> {
        let own = n.own;
        if native {
            let m = n.method(self, who, own)?;
            return Some(vec![JavaFrame {
                name: Arc::clone(&m.name),
                kind: JavaKind::Native,
                file: m.file.clone(),
                line: None,
            }]);
        }
        let scopes = n
            .scopes(self.procs.get(&who), offset)
            .filter(|s| s.last().is_some_and(|&(m, _)| m == own))
            .unwrap_or_else(|| vec![(own, -1)]);
        let named: Option<Vec<(Arc<Method>, i64)>> = scopes
            .iter()
            .map(|&(method, bci)| Some((n.method(self, who, method)?, bci)))
            .collect();
        // An inlined method that cannot be named: the compiled one alone,
        // which the check vouches for.
        let named = match named {
            Some(n) => n,
            None => vec![(n.method(self, who, own)?, -1)],
        };
        let count = named.len();
        Some(
            named
                .into_iter()
                .enumerate()
                .map(|(i, (m, bci))| JavaFrame {
                    name: Arc::clone(&m.name),
                    kind: if i + 1 == count {
                        JavaKind::Compiled
                    } else {
                        JavaKind::Inlined
                    },
                    file: m.file.clone(),
                    line: m.line(bci),
                })
                .collect(),
        )
    }

    /// `Method*` `method` of process `who`, named (cached by its
    /// [`method_check`], which a redefinition changes, and the loading
    /// of another class where its class was).
    fn method(&mut self, who: Proc, method: u64) -> Option<Arc<Method>> {
        let check = check_of(self.procs.get(&who)?, method)?;
        self.checked_method(who, method, check)
    }

    /// [`Java::method`], given the method's check as just read (or as
    /// the kernel read it); one named before with that check is named
    /// from what was read then, without the process.
    fn checked_method(&mut self, who: Proc, method: u64, check: u32) -> Option<Arc<Method>> {
        if let Some(m) = self.methods.get(&(who, method, check)) {
            return m.clone();
        }
        let j = self.procs.get(&who)?;
        let cm = j.mem.u64(method + j.layout.method_const)?;
        let m = read_method(j, cm, self.lines).map(Arc::new);
        self.methods.insert((who, method, check), m.clone());
        m
    }

    /// What `-v` says: each JVM found.
    pub fn summary(&self) -> Vec<String> {
        self.found.values().cloned().collect()
    }

    /// JVMs that could not be walked, and frames left unnamed.
    pub fn warnings(&self) -> Vec<Warning> {
        let mut out: Vec<Warning> = self
            .failed
            .iter()
            .take(5)
            .map(|(pid, why)| Warning::unwalked(format!("PID {pid}: no Java frames: {why}")))
            .collect();
        if self.unnamed > 0 {
            out.push(Warning::unnamed(format!(
                "{} Java frames are {GONE}: their code was freed or reused (or the process \
                 exited) before it could be read",
                self.unnamed
            )));
        }
        out
    }
}

/// A mapped file's key: its device and inode.
/// The template interpreter's code, `[low, high)`: the buffer of
/// `AbstractInterpreter::_code` (a `StubQueue`), inside the code cache.
/// `None` until the JVM has made it, or where the tables do not say (the
/// kernel then finds the interpreter's blob by its name).
///
/// Made means generated and trimmed: the JVM makes the queue with room
/// to spare, generates the interpreter into it, then gives the unused
/// tail back to the code cache (`deallocate_unused_tail`), where other
/// blobs then go, and only then is the queue's limit its end. A range
/// read before would take their code for the interpreter's.
fn interpreter(mem: &Mem, l: &Layout, bias: u64) -> Option<(u64, u64)> {
    let (code, buffer, limit, end) = l.interp?;
    let q = mem.u64(code + bias).filter(|&q| q != 0)?;
    let low = mem.u64(q + buffer)?;
    let len = mem.i32(q + limit)?;
    if mem.i32(q + end)? != len {
        return None;
    }
    let len = u64::try_from(len).ok()?;
    (low != 0 && len > 0).then_some((low, low + len))
}

/// Where the JVM counts its collections (`JavaProc::gc_count`): its
/// heap, made before the interpreter, is there for the JVM's life.
fn gc_count(mem: &Mem, l: &Layout, bias: u64) -> Option<u64> {
    let (heap, count) = l.gc_count?;
    let heap = mem.u64(heap + bias).filter(|&h| h != 0)?;
    Some(heap + count)
}

/// `Method*` `method`'s [`method_check`], as it is now: what the kernel
/// wrote for an interpreted frame of it, while it is still that method.
fn check_of(j: &Jvm, method: u64) -> Option<u32> {
    let l = &j.layout;
    let cm = j.mem.u64(method + l.method_const)?;
    let cp = j.mem.u64(cm + l.cm_constants)?;
    let name = j.mem.u64(j.mem.u64(cp + l.cp_holder)? + l.klass_name)?;
    let hash = u16_at(&j.mem.read(name + l.sym_hash, 2)?, 0)?;
    Some(method_check(cm, name, hash))
}

fn int_at(b: &[u8], off: u64) -> Option<i32> {
    let o = usize::try_from(off).ok()?;
    Some(i32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?))
}

fn u16_at(b: &[u8], off: u64) -> Option<u16> {
    let o = usize::try_from(off).ok()?;
    Some(u16::from_le_bytes(b.get(o..o + 2)?.try_into().ok()?))
}

fn u64_at(b: &[u8], off: u64) -> Option<u64> {
    let o = usize::try_from(off).ok()?;
    Some(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?))
}

/// Reads a `Symbol`'s text.
fn symbol(j: &Jvm, sym: u64) -> Option<String> {
    let l = &j.layout;
    if sym == 0 {
        return None;
    }
    let len = j.mem.u16(sym + l.sym_length)?;
    let body = j.mem.read(sym + l.sym_body, usize::from(len))?;
    Some(String::from_utf8_lossy(&body).into_owned())
}

/// Constant pool `cp`'s symbol at index `i`.
fn cp_symbol(j: &Jvm, cp: u64, i: u16) -> Option<String> {
    let l = &j.layout;
    if i == 0 {
        return None;
    }
    if let Some(len) = l.cp_length
        && j.mem.i32(cp + len).is_none_or(|n| i32::from(i) >= n)
    {
        return None;
    }
    let sym = j.mem.u64(cp + l.cp_size + 8 * u64::from(i))? & !1;
    symbol(j, sym)
}

/// Names the method of `ConstMethod*` `cm`, and reads its lines if
/// `lines`.
fn read_method(j: &Jvm, cm: u64, lines: bool) -> Option<Method> {
    let l = &j.layout;
    if cm == 0 {
        return None;
    }
    let cp = j.mem.u64(cm + l.cm_constants)?;
    let holder = j.mem.u64(cp + l.cp_holder)?;
    let class = symbol(j, j.mem.u64(holder + l.klass_name)?)?;
    let name = cp_symbol(j, cp, j.mem.u16(cm + l.cm_name_index)?)?;
    let file = l
        .source_index
        .and_then(|off| {
            let at = if l.source_in_cp { cp } else { holder };
            cp_symbol(j, cp, j.mem.u16(at + off)?)
        })
        .map(Arc::from);
    let mut table = Vec::new();
    if lines {
        table = line_table(j, cm).unwrap_or_default();
    }
    Some(Method {
        name: format!("{}.{name}", class_name(&class)).into(),
        file,
        lines: table,
    })
}

/// A class's name as Java users read it, from its internal one: `.` for
/// `/`, and a hidden class (a lambda's, a method handle's `LambdaForm`)
/// without the address HotSpot appends to its name (`+0x…`, `/0x…` on
/// older JDKs) and, for a lambda's, without JDK 17's counter
/// (`$$Lambda$14`). Both differ from run to run and JVM to JVM, and would
/// split one lambda into as many frames as there are JVMs in a flame
/// graph; which lambda it is, the method it calls says
/// (`Hot.lambda$main$0`), which keeps its name.
fn class_name(internal: &str) -> String {
    let mut c = internal;
    if let Some(at) = c.rfind("+0x").or_else(|| c.rfind("/0x"))
        && c.len() > at + 3
        && c[at + 3..].bytes().all(|b| b.is_ascii_hexdigit())
    {
        c = &c[..at];
    }
    if let Some(at) = c.rfind("$$Lambda$")
        && c.len() > at + 9
        && c[at + 9..].bytes().all(|b| b.is_ascii_digit())
    {
        c = &c[..at + 8];
    }
    c.replace('/', ".")
}

/// The (bci, line) pairs of `ConstMethod*` `cm`'s compressed line number
/// table, which follows its bytecodes where its flags' bit 0 says.
fn line_table(j: &Jvm, cm: u64) -> Option<Vec<(u32, u32)>> {
    let l = &j.layout;
    let flags = match l.cm_flags_width {
        2 => u32::from(j.mem.u16(cm + l.cm_flags)?),
        _ => j.mem.i32(cm + l.cm_flags)? as u32,
    };
    if flags & 1 == 0 {
        return None;
    }
    let code_size = u64::from(j.mem.u16(cm + l.cm_code_size)?);
    let start = l.cm_size + code_size;
    // The ConstMethod's size (in words) bounds the table.
    let total = u64::try_from(j.mem.i32(cm + l.cm_method_size)?).ok()? * 8;
    let len = total.checked_sub(start)?.min(1 << 16);
    let t = j.mem.read(cm + start, len as usize)?;
    let x = j.x();
    let (mut i, mut bci, mut line) = (0usize, 0u32, 0u32);
    let mut out = Vec::new();
    while let Some(&b) = t.get(i) {
        i += 1;
        match b {
            0 => return Some(out),
            0xff => {
                let db = zigzag(unsigned5(&t, &mut i, x)?);
                let dl = zigzag(unsigned5(&t, &mut i, x)?);
                bci = bci.wrapping_add_signed(db);
                line = line.wrapping_add_signed(dl);
            }
            b => {
                bci += u32::from(b >> 3);
                line += u32::from(b & 7);
            }
        }
        out.push((bci, line));
    }
    // No end mark within the ConstMethod: not a table.
    None
}

fn zigzag(v: u32) -> i32 {
    ((v >> 1) as i32) ^ -((v & 1) as i32)
}

/// One UNSIGNED5 value of `t` at `*i` (HotSpot's `CompressedStream`):
/// bytes below 192 (plus `x`) end it; each adds `(b − x) << 6k`.
fn unsigned5(t: &[u8], i: &mut usize, x: u32) -> Option<u32> {
    let mut sum = 0u32;
    for k in 0..5 {
        let b = u32::from(*t.get(*i)?);
        *i += 1;
        sum = sum.wrapping_add(b.checked_sub(x)? << (6 * k));
        if b < 192 + x || k == 4 {
            return Some(sum);
        }
    }
    None
}

/// A compiled method as its frames are named from, read once: a compile
/// id names one nmethod for the JVM's life, and what names its frames
/// (its PcDescs, scopes and metadata) is fixed when it is installed, so
/// a pc new to a known nmethod reads nothing more of the process. Its
/// frames were each read anew before: about 13 reads of `/proc/PID/mem`
/// for three scopes, and each pc of a hot loop is a frame of its own.
struct Nm {
    /// Its own `Method*`.
    own: u64,
    /// Where its debug information is; `None` if it could not be read
    /// (its frames are then its own method's).
    debug: Option<NmDebug>,
    /// Scopes decoded, by decode offset: `Method*`, bci and the sender's
    /// decode offset (0: none); `None` if unreadable.
    decoded: HashMap<u64, Option<(u64, i64, u64)>>,
    /// The methods it names, checked once (an nmethod keeps the methods
    /// it inlined, so they stay what they were while it lives).
    methods: HashMap<u64, Option<Arc<Method>>>,
}

/// An nmethod's PcDescs (pc offset, scope decode offset) and where its
/// scopes and metadata are.
struct NmDebug {
    descs: Vec<(i32, i32)>,
    scopes: u64,
    meta: u64,
    meta_end: u64,
}

impl Nm {
    /// Nmethod `nm` of JVM `j`, if it is still the one with compile id
    /// `id`; a native wrapper's debug information is not read.
    fn read(j: &Jvm, nm: u64, id: u32, native: bool) -> Option<Self> {
        let l = &j.layout;
        let head = j.mem.read(nm, l.nm_size as usize)?;
        if int_at(&head, l.nm_compile_id)? as u32 != id {
            return None;
        }
        Some(Self {
            own: u64_at(&head, l.nm_method)?,
            debug: if native {
                None
            } else {
                NmDebug::read(j, nm, &head)
            },
            decoded: HashMap::new(),
            methods: HashMap::new(),
        })
    }

    /// Decodes the scopes of each of its PcDescs now, from one read of
    /// its scopes and one of its metadata, and names the methods they
    /// name: every pc of it is then named from what is kept here, without
    /// the process, which may have freed the nmethod, or exited, by the
    /// time a stack through another pc of it is named. The kernel tells
    /// user space of an nmethod once, at the first of its pcs it meets,
    /// not of each pc (a hot loop's every instruction). A scope left out
    /// (past what one read took) is decoded from the process when named.
    fn complete(&mut self, java: &mut Java, who: Proc) {
        // Its own, a native wrapper's whole name, first.
        self.method(java, who, self.own);
        let (Some(d), Some(j)) = (self.debug.as_ref(), java.procs.get(&who)) else {
            return;
        };
        let Some(last) = d
            .descs
            .iter()
            .filter_map(|&(_, decode)| u64::try_from(decode).ok())
            .max()
            .filter(|&m| m > 0)
        else {
            return;
        };
        // A scope is at most 15 bytes (three UNSIGNED5 values), and a
        // sender lies before the scopes it sends (HotSpot writes it
        // first); near the end of its mapping, up to the last one's
        // first byte.
        let Some(bytes) = [last + 15, last + 1]
            .into_iter()
            .filter(|&n| n <= MAX_DEBUG_BYTES)
            .find_map(|n| j.mem.read(d.scopes, n as usize))
        else {
            return;
        };
        let x = j.x();
        let mut parsed: HashMap<u64, (u64, u32, i64)> = HashMap::new();
        for &(_, decode) in &d.descs {
            let mut decode = u64::try_from(decode).unwrap_or(0);
            for _ in 0..MAX_SCOPES {
                if decode == 0 || parsed.contains_key(&decode) {
                    break;
                }
                let Some(scope) = bytes.get(decode as usize..).and_then(|b| parse_scope(b, x))
                else {
                    break;
                };
                parsed.insert(decode, scope);
                decode = scope.0;
            }
        }
        let most = parsed
            .values()
            .map(|&(_, index, _)| index)
            .max()
            .unwrap_or(0);
        let meta = match u64::from(most) * 8 {
            0 => Vec::new(),
            n if d.meta + n <= d.meta_end && n <= MAX_DEBUG_BYTES => {
                j.mem.read(d.meta, n as usize).unwrap_or_default()
            }
            _ => Vec::new(),
        };
        for (decode, (sender, index, bci)) in parsed {
            let method = if index == 0 {
                Some(self.own)
            } else {
                u64_at(&meta, 8 * u64::from(index - 1))
            };
            if let Some(method) = method {
                self.decoded.insert(decode, Some((method, bci, sender)));
            }
        }
        let methods: std::collections::BTreeSet<u64> = self
            .decoded
            .values()
            .flatten()
            .map(|&(m, _, _)| m)
            .collect();
        for m in methods {
            self.method(java, who, m);
        }
    }

    /// `Method*` `method`, named, as [`Java::method`] names it, once.
    fn method(&mut self, java: &mut Java, who: Proc, method: u64) -> Option<Arc<Method>> {
        self.methods
            .entry(method)
            .or_insert_with(|| java.method(who, method))
            .clone()
    }

    /// The (`Method*`, bci) of each scope at pc offset `offset`,
    /// innermost first: from the PcDesc at exactly `offset` (a return
    /// pc), else the first after it (HotSpot's rule for any other pc).
    fn scopes(&mut self, j: Option<&Jvm>, offset: u32) -> Option<Vec<(u64, i64)>> {
        let d = self.debug.as_ref()?;
        let offset = i64::from(offset);
        let desc = d
            .descs
            .iter()
            .find(|d| i64::from(d.0) == offset)
            .or_else(|| d.descs.iter().find(|d| i64::from(d.0) >= offset))?;
        let mut decode = u64::try_from(desc.1).ok().filter(|&d| d != 0)?;
        let own = self.own;
        let mut out = Vec::new();
        for _ in 0..MAX_SCOPES {
            let (method, bci, sender) = match self.decoded.get(&decode) {
                Some(known) => (*known)?,
                // Not decoded when it was read: from the process, if it
                // is still there.
                None => {
                    let scope = d.scope(j?, own, decode);
                    self.decoded.insert(decode, scope);
                    scope?
                }
            };
            out.push((method, bci));
            if sender == 0 {
                return Some(out);
            }
            decode = sender;
        }
        None
    }
}

impl NmDebug {
    /// Where nmethod `nm`'s (whose first bytes are `head`) debug
    /// information is, and its PcDescs, read.
    fn read(j: &Jvm, nm: u64, head: &[u8]) -> Option<Self> {
        let l = &j.layout;
        let at = |off: u64| int_at(head, off).and_then(|v| u64::try_from(v).ok());
        // PcDescs, scopes and metadata (bounded).
        let (pcs, pcs_end, scopes, meta, meta_end) = match l.debug {
            DebugInfo::InBlob {
                pcs,
                pcs_end,
                scopes_begin,
                metadata,
            } => {
                let scopes = u64_at(head, scopes_begin)?;
                let pcs = nm + at(pcs)?;
                (pcs, nm + at(pcs_end)?, scopes, nm + at(metadata)?, scopes)
            }
            DebugInfo::Immutable {
                immutable,
                pcs,
                scopes,
                data,
                metadata,
            } => {
                let im = u64_at(head, immutable)?;
                let scopes = im + at(scopes)?;
                let meta = nm + at(data)? + u64::from(u16_at(head, metadata)?);
                // Its end is not told: indexes are bounded by reads.
                (im + at(pcs)?, scopes, scopes, meta, meta + (1 << 16))
            }
            DebugInfo::Mutable {
                immutable,
                pcs,
                scopes,
                mutable,
                mutable_size,
                relocation_size,
            } => {
                let im = u64_at(head, immutable)?;
                let scopes = im + at(scopes)?;
                let m = u64_at(head, mutable)?;
                let meta = m + at(relocation_size)?;
                (im + at(pcs)?, scopes, scopes, meta, m + at(mutable_size)?)
            }
        };
        let len = pcs_end.checked_sub(pcs)?;
        if len > MAX_DEBUG_BYTES || !len.is_multiple_of(16) {
            return None;
        }
        let descs = j.mem.read(pcs, len as usize)?;
        let descs = descs
            .chunks_exact(16)
            .filter_map(|d| Some((int_at(d, 0)?, int_at(d, 4)?)))
            .collect();
        Some(Self {
            descs,
            scopes,
            meta,
            meta_end,
        })
    }

    /// The scope at decode offset `decode`: its `Method*` (index 0 is
    /// the nmethod's own, `own`), bci, and the sender's decode offset.
    /// Scopes are read one at a time: their end is not always told.
    fn scope(&self, j: &Jvm, own: u64, decode: u64) -> Option<(u64, i64, u64)> {
        let b = j.mem.read(self.scopes + decode, 15).or_else(|| {
            // Near the end of its mapping: what there is.
            (1..15)
                .rev()
                .find_map(|n| j.mem.read(self.scopes + decode, n))
        })?;
        let (sender, index, bci) = parse_scope(&b, j.x())?;
        let method = if index == 0 {
            own
        } else {
            let a = self.meta + 8 * u64::from(index - 1);
            if a + 8 > self.meta_end {
                return None;
            }
            j.mem.u64(a)?
        };
        Some((method, bci, sender))
    }
}

/// A scope's sender (its decode offset, 0 for none), index of its method
/// in the metadata (0: the nmethod's own) and bci, from its bytes `b`.
fn parse_scope(b: &[u8], x: u32) -> Option<(u64, u32, i64)> {
    let mut i = 0;
    let sender = unsigned5(b, &mut i, x)?;
    let index = unsigned5(b, &mut i, x)?;
    let bci = i64::from(unsigned5(b, &mut i, x)?) - 1;
    Some((u64::from(sender), index, bci))
}

#[cfg(test)]
mod tests {
    use std::{
        path::{Path, PathBuf},
        process::{Child, Command, Stdio},
        time::{Duration, Instant},
    };

    use super::*;

    #[test]
    fn hidden_classes_are_named_without_their_address_and_lambdas_without_their_counter() {
        for (internal, name) in [
            ("java/util/HashMap", "java.util.HashMap"),
            ("Hot$S1", "Hot$S1"),
            (
                "java/lang/VirtualThread$$Lambda+0x00007fda0c0469a0",
                "java.lang.VirtualThread$$Lambda",
            ),
            ("Hot$$Lambda$14/0x0000000800c03000", "Hot$$Lambda"),
            (
                "java/lang/invoke/LambdaForm$MH+0x00007f0a4c00d000",
                "java.lang.invoke.LambdaForm$MH",
            ),
            ("Hot$$Lambda$14", "Hot$$Lambda"),
            // Not an address, nor a counter: kept.
            ("a/b+0xyz", "a.b+0xyz"),
            ("Hot$$Lambda$", "Hot$$Lambda$"),
        ] {
            assert_eq!(class_name(internal), name, "{internal}");
        }
    }

    #[test]
    fn unsigned5_decodes_both_encodings() {
        let mut i = 0;
        assert_eq!(unsigned5(&[5], &mut i, 0), Some(5));
        // 200 + 3·64 (x = 0) and (201 − 1) + (4 − 1)·64 (x = 1).
        i = 0;
        assert_eq!(unsigned5(&[200, 3], &mut i, 0), Some(200 + 3 * 64));
        assert_eq!(i, 2);
        i = 0;
        assert_eq!(unsigned5(&[201, 4], &mut i, 1), Some(200 + 3 * 64));
        assert_eq!(zigzag(3), -2);
        assert_eq!(zigzag(4), 2);
    }

    /// The program the JVM tests run: `main` → `outer` → `inl` → `work`,
    /// `work` kept out of line (`dontinline`) so that C2 inlines `inl`
    /// and `outer` into `main` and calls `work`.
    const GRAPH: &str = "public class Graph {
  static int inl(int x) { return work(x) + 1; }
  static int work(int n) { int s = 0;
    for (int i = 0; i < 2000; i++) { s += (i*n) ^ (s>>>7); if ((s & 0xfff) == 7) s ^= n; }
    return s; }
  static int outer(int n) { return inl(n) + inl(n + 1); }
  public static void main(String[] a) { long t = 0, end = System.nanoTime() + Long.parseLong(a[0])*1_000_000L;
    while (System.nanoTime() < end) t += outer((int) t); }
}
";

    /// A JVM, killed when dropped.
    struct Running(Child);

    impl Drop for Running {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    /// The JDK's `bin` of the `java` on the path (the build's setup
    /// installs openjdk-17-jdk-headless).
    fn path_jdk() -> PathBuf {
        let java = std::env::var_os("PATH")
            .and_then(|p| {
                std::env::split_paths(&p)
                    .map(|d| d.join("java"))
                    .find(|j| j.is_file())
            })
            .expect("no `java` on PATH: install openjdk-17-jdk-headless to run the Java tests");
        let real = std::fs::canonicalize(java).expect("java's real path");
        real.parent().expect("java's directory").to_path_buf()
    }

    /// A JDK to run Graph on: the host's, or one of the Debian root that
    /// `cargo xtask` makes (sid's OpenJDK 21 and 25), run as in a
    /// container: in a mount namespace of its own with its /proc, chrooted.
    struct Jdk {
        /// The root, for a JDK inside one.
        root: Option<PathBuf>,
        /// Its `bin`, as its JVM sees it.
        bin: PathBuf,
    }

    impl Jdk {
        fn host() -> Self {
            Self {
                root: None,
                bin: path_jdk(),
            }
        }

        /// OpenJDK `major` in the root xtask passes (`RTRACE_JDK_ROOT`),
        /// else where it keeps it.
        fn in_root(major: u32) -> Self {
            let root = std::env::var_os("RTRACE_JDK_ROOT")
                .map(PathBuf::from)
                .unwrap_or_else(|| {
                    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
                    PathBuf::from(home).join(".cache/rtrace/sid-jdk-root-2")
                });
            let bin = PathBuf::from(format!("/usr/lib/jvm/java-{major}-openjdk-amd64/bin"));
            assert!(
                root.join(bin.strip_prefix("/").unwrap())
                    .join("java")
                    .is_file(),
                "no OpenJDK {major} in {} (`cargo xtask test` makes that root)",
                root.display()
            );
            Self {
                root: Some(root),
                bin,
            }
        }

        /// `program` of its `bin`, run where the JDK lives.
        fn command(&self, program: &str) -> Command {
            let path = self.bin.join(program);
            let Some(root) = &self.root else {
                return Command::new(path);
            };
            // unshare and sh exec: the JVM keeps the child's pid.
            let mut c = Command::new("unshare");
            c.args([
                "--mount",
                "sh",
                "-c",
                r#"mount -t proc proc "$0/proc" && exec chroot "$0" "$@""#,
            ])
            .arg(root)
            .arg(path);
            c
        }

        /// A temporary directory the JVM can read, and its path as the
        /// JVM sees it.
        fn scratch(&self) -> (tempfile::TempDir, PathBuf) {
            let Some(root) = &self.root else {
                let dir = tempfile::tempdir().expect("a temporary directory");
                let seen = dir.path().to_path_buf();
                return (dir, seen);
            };
            let dir = tempfile::tempdir_in(root.join("tmp")).expect("a directory in the root");
            let seen = Path::new("/").join(dir.path().strip_prefix(root).unwrap());
            (dir, seen)
        }
    }

    /// Compiles Graph.java with the host's javac into `dir`.
    fn compile_into(dir: &Path) {
        let bin = path_jdk();
        std::fs::write(dir.join("Graph.java"), GRAPH).expect("Graph.java");
        let ok = Command::new(bin.join("javac"))
            .arg("Graph.java")
            .current_dir(dir)
            .status()
            .expect("javac runs");
        assert!(ok.success(), "javac failed");
    }

    /// One line of `jcmd PID Compiler.codelist`: `id level state
    /// method [CodeBlob*, code_begin - code_end]`.
    #[derive(Debug)]
    struct Listed {
        id: u32,
        level: u32,
        state: u32,
        method: String,
        blob: u64,
        begin: u64,
        end: u64,
    }

    /// Whether a wait on the JVM `pid` since `started` has lasted past
    /// `cpu` seconds of the JVM's own CPU time (or ten minutes): the
    /// unit tests run at idle priority beside the suite, where a JVM may
    /// get little of the CPU, and a wall-clock limit failed them on a
    /// busy machine.
    fn waited_out(pid: u32, started: Instant, cpu: f64) -> bool {
        use crate::kernel::procmaps::{stat_fields, tick_ns};
        let used = stat_fields(pid, [14, 15])
            .map(|[user, system]| ((user + system) * tick_ns()) as f64 / 1e9);
        used.is_some_and(|u| u > cpu) || started.elapsed() > Duration::from_secs(600)
    }

    fn codelist(jdk: &Jdk, pid: u32) -> Vec<Listed> {
        let out = jdk
            .command("jcmd")
            .args([pid.to_string().as_str(), "Compiler.codelist"])
            .stderr(Stdio::null())
            .output()
            .expect("jcmd runs");
        let hex = |s: &str| u64::from_str_radix(s.trim().trim_start_matches("0x"), 16).ok();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|line| {
                let (head, addrs) = line.split_once(" [")?;
                let mut f = head.split_whitespace();
                let (id, level, state) = (f.next()?, f.next()?, f.next()?);
                let method = f.next()?;
                let (blob, range) = addrs.trim_end_matches(']').split_once(", ")?;
                let (begin, end) = range.split_once(" - ")?;
                Some(Listed {
                    id: id.parse().ok()?,
                    level: level.parse().ok()?,
                    state: state.parse().ok()?,
                    method: method.split('(').next()?.to_owned(),
                    blob: hex(blob)?,
                    begin: hex(begin)?,
                    end: hex(end)?,
                })
            })
            .collect()
    }

    fn names(f: &[JavaFrame]) -> Vec<&str> {
        f.iter().map(|f| &*f.name).collect()
    }

    /// Runs Graph on `jdk` and checks the record, the blob
    /// lookup and the names against `jcmd`.
    fn check_jdk(jdk: &Jdk, major: u32) {
        let (dir, seen) = jdk.scratch();
        compile_into(dir.path());
        let child = jdk
            .command("java")
            .args([
                "-XX:CompileCommand=quiet",
                "-XX:CompileCommand=dontinline,Graph::work",
                "-cp",
            ])
            .arg(&seen)
            .args(["Graph", "60000"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("java starts");
        let jvm = Running(child);
        let pid = jvm.0.id();
        let who = Proc::now(pid);
        let mut java = Java::default();
        java.configure(true, true);

        // Looked at while starting (not a JVM yet, or heaps not set up),
        // then until found.
        let started = Instant::now();
        let mut given = None;
        while !java.procs.contains_key(&who) {
            assert!(
                !waited_out(pid, started, 15.0),
                "PID {pid} never found to be a JVM: {:?}",
                java.not.get(&who)
            );
            java.not.remove(&who);
            given = java.examine(&MapsOnce::new(who), false);
            std::thread::sleep(Duration::from_millis(50));
        }
        let (r, l, bias) = {
            let j = &java.procs[&who];
            assert_eq!(j.major, major);
            (j.record, Arc::clone(&j.layout), j.bias)
        };
        // The test's own reads.
        let mem = open_mem_in(who, &crate::kernel::procmaps::proc_dir(who.pid));
        eprintln!("JDK {major} (PID {pid}): {r:#x?}");
        if usize::from(r.blob_read) <= BLOB_BYTES {
            assert_eq!(given, Some(r), "the kernel is given the record");
            assert_eq!(java.examine(&MapsOnce::new(who), false), None, "given once");
        } else {
            eprintln!(
                "JDK {major}: blob_read {} > BLOB_BYTES {BLOB_BYTES}: refused",
                r.blob_read
            );
            assert_eq!(given, None);
            assert!(!java.warnings().is_empty(), "a refused JVM is warned of");
        }
        assert!((1..=MAX_HEAPS as u32).contains(&r.nheaps), "{r:?}");
        for h in &r.heaps[..r.nheaps as usize] {
            assert!(r.low_bound <= h.low && h.low < h.high && h.high <= r.high_bound);
            assert!((4..=10).contains(&h.log2_segment), "{h:?}");
            assert!(h.segmap != 0);
        }
        assert!([8, 16].contains(&r.heap_block));
        for off in [
            r.blob_name,
            r.blob_frame_size,
            r.blob_frame_complete,
            r.blob_code,
            r.nm_compile_id,
            r.nm_orig_pc,
            r.nm_deopt,
        ] {
            assert!(off < r.blob_read, "{off} past blob_read in {r:?}");
        }
        assert_eq!(r.method_const, 8);
        assert!((40..=64).contains(&r.const_method_size));
        assert_eq!(r.interp_sender_sp, -8);
        assert_eq!(r.code_is_offset, u8::from(major >= 23));
        assert_eq!(r.deopt_is_offset, u8::from(major >= 23));
        assert_eq!(r.salt, who.salt());

        // The stub the first Java frame returns to.
        let ret = l
            .tables
            .stat("StubRoutines", "_call_stub_return_address")
            .and_then(|a| mem.u64(a + bias))
            .expect("StubRoutines::_call_stub_return_address");
        let stub = java.blob_at(who, ret).expect("the call stub's blob");
        // The kernel steps the stub's frame by these, with no lookup.
        assert_eq!((r.call_stub_ret, r.call_stub_blob), (ret, stub));
        let f = java.frames(who, JAVA_STUB | stub, 0);
        assert!(f[0].name.starts_with("[StubRoutines"), "{f:?}");
        assert_eq!(f[0].kind, JavaKind::Stub);

        // The interpreter's range is the code of the blob named so, from
        // its first byte to its last.
        assert!(r.interp_low != 0 && r.interp_low < r.interp_high, "{r:?}");
        let first = java
            .blob_at(who, r.interp_low)
            .expect("the interpreter's blob");
        assert_eq!(java.blob_at(who, r.interp_high - 1), Some(first));
        assert_eq!(
            names(&java.frames(who, JAVA_STUB | first, 0)),
            ["[Interpreter]"]
        );

        // The count of collections the kernel reads (its checks of
        // interpreted frames stand while it does): one more after each
        // collection, here one the test asks for.
        assert!(r.gc_count != 0, "{r:?}");
        let collections = || mem.i32(r.gc_count).expect("the count of collections") as u32;
        let before = collections();
        let out = jdk
            .command("jcmd")
            .args([pid.to_string().as_str(), "GC.run"])
            .output()
            .expect("jcmd runs");
        assert!(out.status.success(), "jcmd GC.run: {out:?}");
        assert!(
            collections() > before,
            "JDK {major}: the count at {:#x} stayed at {before} over a collection",
            r.gc_count
        );

        // Until C2 has compiled work and main.
        let mut listed;
        loop {
            listed = codelist(jdk, pid);
            let c2 = |m: &str| {
                listed
                    .iter()
                    .any(|l| l.method == m && l.level == 4 && l.state == 0)
            };
            if c2("Graph.work") && c2("Graph.main") {
                break;
            }
            assert!(
                !waited_out(pid, started, 30.0),
                "Graph not compiled by C2: {listed:?}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        let mut inlined = false;
        let mut work = None;
        for n in listed
            .iter()
            .filter(|l| l.method.starts_with("Graph.") && l.state == 0)
        {
            let mid = n.begin + (n.end - n.begin) / 2;
            assert_eq!(java.blob_at(who, mid), Some(n.blob), "{n:?}");
            assert_eq!(java.blob_at(who, n.begin), Some(n.blob), "{n:?}");
            let first = JAVA_COMPILED | n.blob;
            let second = u64::from(n.id) << 32 | (mid - n.begin);
            let f = java.frames(who, first, second);
            let last = f.last().expect("a frame");
            assert_eq!(*last.name, n.method, "{n:?}: {f:?}");
            assert_eq!(last.kind, JavaKind::Compiled);
            assert_eq!(last.file.as_deref(), Some("Graph.java"));
            assert!(f.iter().all(|f| f.name.starts_with("Graph.")), "{f:?}");
            let wrong = java.frames(who, first, second + (1000 << 32));
            assert_eq!(names(&wrong), [GONE]);
            assert_eq!(wrong[0].kind, JavaKind::Unknown);

            if n.method == "Graph.work" && n.level == 4 {
                // Its method, as an interpreted frame at bci 0 (line 3).
                let method = mem.u64(n.blob + l.nm_method).expect("the nmethod's method");
                // The check as the kernel makes it, by the record's
                // offsets: the class's name is `Graph`'s symbol.
                let at = |a: u64, off: u16| mem.u64(a + u64::from(off)).expect("a field");
                let cm = at(method, r.method_const);
                let name = at(at(at(cm, r.cm_constants), r.cp_holder), r.klass_name);
                let body = mem.read(name + l.sym_body, 5).expect("the name");
                assert_eq!(body, b"Graph");
                let hash = mem.read(name + u64::from(r.sym_hash), 2).expect("its hash");
                let hash = u16::from_le_bytes([hash[0], hash[1]]);
                let check = u64::from(method_check(cm, name, hash)) << 32;
                let f = java.frames(who, JAVA_INTERPRETED | method, check);
                assert_eq!(names(&f), ["Graph.work"]);
                assert_eq!(f[0].kind, JavaKind::Interpreted);
                assert_eq!(f[0].line, Some(3));
                let f = java.frames(who, JAVA_INTERPRETED | method, check | u64::from(u32::MAX));
                assert_eq!((names(&f), f[0].line), (vec!["Graph.work"], None));
                let f = java.frames(who, JAVA_INTERPRETED | method, check ^ (1 << 40));
                assert_eq!(names(&f), [GONE]);
                work = Some((method, check));
            }
            if n.method == "Graph.main" && n.level == 4 {
                // Some pc (the call of work) has inl in outer in main.
                for off in 0..(n.end - n.begin) {
                    let f = java.frames(who, first, u64::from(n.id) << 32 | off);
                    if names(&f) == ["Graph.inl", "Graph.outer", "Graph.main"] {
                        let kinds: Vec<JavaKind> = f.iter().map(|f| f.kind).collect();
                        assert_eq!(
                            kinds,
                            [JavaKind::Inlined, JavaKind::Inlined, JavaKind::Compiled]
                        );
                        let lines: Vec<Option<u32>> = f.iter().map(|f| f.line).collect();
                        assert_eq!(lines, [Some(2), Some(6), Some(8)], "{f:?}");
                        inlined = true;
                        break;
                    }
                }
            }
        }
        assert!(inlined, "no pc of main's C2 code has inl in outer in main");
        assert_eq!(java.summary().len(), usize::from(given.is_some()));
        eprintln!("{:?}", java.summary());

        // The kernel tells of an nmethod at the first of its pcs it meets,
        // and of a method at the first of its bytecode indexes: each other
        // pc and index is named from what that read, once the JVM has
        // exited too, as it is named while the JVM runs.
        let main = listed
            .iter()
            .find(|l| l.method == "Graph.main" && l.level == 4 && l.state == 0)
            .expect("main's C2 code");
        let (work, check) = work.expect("work's C2 code");
        let mut told = Java::default();
        told.configure(true, true);
        assert_eq!(told.examine(&MapsOnce::new(who), false), given);
        let first = JAVA_COMPILED | main.blob;
        let id = u64::from(main.id) << 32;
        let interpreted = JAVA_INTERPRETED | work;
        told.frames(who, first, id);
        told.frames(who, interpreted, check);
        told.frames(who, JAVA_STUB | stub, 0);
        let pcs: Vec<Vec<JavaFrame>> = (0..main.end - main.begin)
            .map(|off| java.frames(who, first, id | off))
            .collect();
        let bcis = [1, 4, u64::from(u32::MAX)];
        let indexes: Vec<Vec<JavaFrame>> = bcis
            .iter()
            .map(|&bci| java.frames(who, interpreted, check | bci))
            .collect();
        drop(jvm);
        assert_eq!(mem.u64(main.blob), None, "the JVM is gone");
        told.exited(who);
        for (off, live) in pcs.iter().enumerate() {
            let f = told.frames(who, first, id | off as u64);
            assert_eq!(&f, live, "main's pc {off:#x} named once the JVM exited");
        }
        for (bci, live) in bcis.iter().zip(&indexes) {
            let f = told.frames(who, interpreted, check | bci);
            assert_eq!(&f, live, "work's bci {bci} named once the JVM exited");
        }
        let f = told.frames(who, JAVA_STUB | stub, 8);
        assert!(f[0].name.starts_with("[StubRoutines"), "{f:?}");
    }

    #[test]
    fn a_jdk_17_jvm_is_found_and_its_frames_named() {
        let jdk = Jdk::host();
        let out = jdk
            .command("java")
            .arg("-version")
            .output()
            .expect("java -version");
        let version = String::from_utf8_lossy(&out.stderr).into_owned();
        let major = version
            .split('"')
            .nth(1)
            .and_then(|v| v.split('.').next()?.parse().ok())
            .expect("java's version");
        check_jdk(&jdk, major);
    }

    #[test]
    fn a_jdk_21_jvm_in_a_container_is_found_and_its_frames_named() {
        check_jdk(&Jdk::in_root(21), 21);
    }

    #[test]
    fn a_jdk_25_jvm_in_a_container_is_found_and_its_frames_named() {
        check_jdk(&Jdk::in_root(25), 25);
    }

    #[test]
    fn a_process_without_libjvm_is_not_a_jvm() {
        let mut java = Java::default();
        java.configure(true, false);
        let me = Proc::now(std::process::id());
        assert_eq!(java.examine(&MapsOnce::new(me), false), None);
        assert_eq!(java.not.get(&me), Some(&None));
        let f = java.frames(me, JAVA_COMPILED | 0x1000, 1 << 32);
        assert_eq!(names(&f), [GONE]);
    }
}

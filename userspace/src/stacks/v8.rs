//! V8 (Node.js) processes, for the kernel walk's JavaScript frames
//! (`rtrace_common::v8`): finding V8 in a process by the `v8dbg_*`
//! postmortem metadata its build exports (`node`, or Debian's
//! `libnode.so.N`), the layout of its heap objects from that metadata, the
//! address ranges of its code (the embedded builtins, mapped once or
//! twice, and the JIT code range), and the names of the frames the walk
//! writes: a function's name as V8 reports it, its script and its first
//! line (under `--lines`, a compiled frame's own line), and the functions
//! compiled code inlined at a frame's pc, from that code's tables, read
//! from the process's memory while it lives. Facts and their sources:
//! `v8.md`.

use std::{
    collections::{BTreeMap, HashMap},
    fs::File,
    sync::Arc,
};

use rtrace_common::v8::{
    MAX_V8_RANGES, NO_OFFSET, SFI_BYTES, V8_ADDR_MASK, V8_JS_PC, V8_MASK, V8Proc, V8Range,
    sfi_check,
};

use crate::kernel::procmaps::{Mapping, MapsOnce, Proc};
use crate::kernel::procmem::{Mem, open_mem_in};
use crate::kernel::warning::Warning;

/// Which kind of code a JavaScript frame ran in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum V8Kind {
    /// Run by Ignition, V8's interpreter: the walk read its bytecode
    /// offset.
    Interpreted,
    /// Run as machine code (Sparkplug, Maglev or TurboFan's), or at least
    /// not known to be interpreted.
    Compiled,
    /// A function Maglev or TurboFan inlined into the compiled frame
    /// below it, found from that code's inlining table.
    Inlined,
    /// A frame that could not be named: its `SharedFunctionInfo` moved or
    /// was freed since the walk (its check failed), or could not be read.
    Unknown,
}

/// A named JavaScript frame.
#[derive(Clone, Debug)]
pub struct V8Frame {
    /// As Chrome DevTools and `node --prof` show it: the function's name,
    /// else the name V8 inferred for it (`obj.method`), else
    /// `(anonymous)`; `[js: gone]` for a frame that could not be named.
    pub name: Arc<str>,
    /// The script's name: `/abs/path/x.js`, `file:///…` for an ES module,
    /// `node:internal/…` for Node's own; `None` where it has none.
    pub file: Option<Arc<str>>,
    /// The 1-based line the function starts on (where its parameters
    /// start, as V8's own profiles give it), where it could be read.
    pub line: Option<u32>,
    /// The code it ran.
    pub kind: V8Kind,
}

/// The name of a frame whose function could not be read or checked.
const GONE: &str = "[js: gone]";

/// The name of a function that has none, not even an inferred one (what
/// Chrome DevTools shows).
const ANONYMOUS: &str = "(anonymous)";

/// Depth of cons and sliced strings followed at most: V8 flattens deep
/// ones, and a cycle (memory read mid-change) must end.
const MAX_STRING_DEPTH: u32 = 32;

/// Characters of a name read at most.
const MAX_NAME: usize = 1024;

/// Bytes of a script's source read at most to count its lines.
const MAX_SOURCE: usize = 64 << 20;

/// Entries of a script's `line_ends` read at most.
const MAX_LINE_ENDS: usize = 4 << 20;

/// Local names a `ScopeInfo` keeps inline, below which (V8 9.8 and
/// later) it keeps a hash table instead (`kScopeInfoMaxInlinedLocalNamesSize`).
const MAX_INLINED_LOCAL_NAMES: i64 = 75;

/// The bit of a string's instance type that marks an external string
/// whose data pointer is not cached in the object (`kUncachedExternalStringMask`).
const UNCACHED_EXTERNAL: u16 = 0x10;

/// The V8 build's version symbols (`v8::internal::Version::major_` …).
const VERSION_SYMBOLS: [&str; 4] = [
    "_ZN2v88internal7Version6major_E",
    "_ZN2v88internal7Version6minor_E",
    "_ZN2v88internal7Version6build_E",
    "_ZN2v88internal7Version6patch_E",
];

/// The start of V8's embedded builtins' code, and (a `uint32_t`) its size.
const BLOB_SYMBOL: &str = "v8_Default_embedded_blob_code_";
/// What every name of [`VERSION_SYMBOLS`] begins with.
const VERSION_PREFIX: &str = "_ZN2v88internal7Version";
const BLOB_SIZE_SYMBOL: &str = "v8_Default_embedded_blob_code_size_";
/// A symbol of V8's postmortem metadata that every version exports.
const HEAP_OBJECT_TAG: &str = "v8dbg_HeapObjectTag";

/// What one file holding V8 says, read once per file: its `v8dbg_*`
/// values, its version, and where its embedded builtins are.
#[derive(Debug)]
struct V8File {
    /// `v8dbg_*` values by name, the prefix taken off (`class_Map__…`).
    dbg: HashMap<String, i64>,
    /// major, minor, build, patch; zeros where not exported.
    version: [i64; 4],
    /// The embedded builtins' code, as file offsets `[low, high)`.
    blob: Option<(u64, u64)>,
}

impl V8File {
    fn get(&self, name: &str) -> Option<i64> {
        self.dbg.get(name).copied()
    }

    /// `v8dbg_class_<class>__<field>__<any type>`: the field's offset,
    /// whatever C++ type this version names it by.
    fn field(&self, class: &str, field: &str) -> Option<i64> {
        let exact = format!("class_{class}__{field}");
        let prefix = format!("{exact}__");
        self.dbg
            .iter()
            .find(|(k, _)| **k == exact || k.starts_with(&prefix))
            .map(|(_, &v)| v)
    }

    /// The first of `fields` of `class` the metadata has.
    fn field_of(&self, class: &str, fields: &[&str]) -> Option<i64> {
        fields.iter().find_map(|f| self.field(class, f))
    }

    /// `v8dbg_type_<class>__<TYPE>`: an instance type, by its name.
    fn ty(&self, ty: &str) -> Option<i64> {
        let suffix = format!("__{ty}");
        self.dbg
            .iter()
            .find(|(k, _)| k.starts_with("type_") && k.ends_with(&suffix))
            .map(|(_, &v)| v)
    }

    /// Whether the version is at least `v` (an unknown version is taken
    /// to be the newest).
    fn at_least(&self, v: [i64; 3]) -> bool {
        self.version[0] == 0 || self.version[..3] >= v[..]
    }
}

/// Reads ELF file `f`'s `v8dbg_*` values (from `.dynsym` and `.symtab`),
/// version and embedded builtins: `None` if it has no `v8dbg_*`.
fn read_file(f: &File) -> Option<V8File> {
    let data = crate::kernel::memory::Mapped::of(f).ok()?;
    let elf = object::File::parse(&*data).ok()?;
    // Only the symbols named so are read: node has 185 thousand.
    let symbols =
        crate::kernel::elf::symbols_with_prefixes(&elf, &["v8dbg_", VERSION_PREFIX, BLOB_SYMBOL])?;
    let mut dbg = HashMap::new();
    let mut version = [0; 4];
    let (mut blob_at, mut blob_size_at) = (None, None);
    for (name, address) in symbols {
        if let Some(rest) = name.strip_prefix("v8dbg_") {
            if !dbg.contains_key(rest)
                && let Some(v) = int_of(&elf, &data, address)
            {
                dbg.insert(rest.to_owned(), i64::from(v));
            }
        } else if let Some(i) = VERSION_SYMBOLS.iter().position(|&v| v == name) {
            version[i] = int_of(&elf, &data, address).map_or(0, i64::from);
        } else if name == BLOB_SYMBOL {
            blob_at = Some(address);
        } else if name == BLOB_SIZE_SYMBOL {
            blob_size_at = Some(address);
        }
    }
    if dbg.is_empty() {
        return None;
    }
    let blob = builtins_range(&elf, &data, blob_at, blob_size_at).and_then(|(low, high)| {
        let at = crate::kernel::elf::vaddr_to_offset(&elf, low)?;
        Some((at, at + (high - low)))
    });
    Some(V8File { dbg, version, blob })
}

/// The C `int` at virtual address `addr` of the file: its bytes in the
/// file, or 0 where a segment holds it beyond its file's bytes (`.bss`:
/// the metadata's zeros are put there).
fn int_of(elf: &object::File, data: &[u8], addr: u64) -> Option<i32> {
    use object::{Object as _, ObjectSegment as _};
    let seg = elf
        .segments()
        .find(|s| s.address() <= addr && addr + 4 <= s.address() + s.size())?;
    let (start, size) = seg.file_range();
    let rel = addr - seg.address();
    if rel + 4 > size {
        return (rel >= size).then_some(0);
    }
    let at = usize::try_from(start + rel).ok()?;
    Some(i32::from_le_bytes(data.get(at..at + 4)?.try_into().ok()?))
}

/// Whether ELF file `elf` (its bytes `data`) holds V8, by the postmortem
/// metadata it exports: `None` if not; else where its embedded builtins
/// are, as virtual addresses: where its symbols say, else (Debian's
/// stripped `libnode.so`) the largest stretch of its `.text` without CFI
/// ([`largest_fde_gap`]), or `Some(None)` if it has none. The CFI
/// compiler leaves the builtins to the frame pointer ([`super::cfi`]).
pub(crate) fn builtins_in(elf: &object::File, data: &[u8]) -> Option<Option<(u64, u64)>> {
    // Most files are no V8: their string table says so at once.
    if !crate::kernel::elf::dynstr_holds(elf, HEAP_OBJECT_TAG) {
        return None;
    }
    // One of the metadata's symbols says it is V8, not all 500 read.
    let symbols = crate::kernel::elf::symbols_with_prefixes(elf, &[HEAP_OBJECT_TAG, BLOB_SYMBOL])?;
    if !symbols.iter().any(|(n, _)| *n == HEAP_OBJECT_TAG) {
        return None;
    }
    let at = |name: &str| symbols.iter().find(|(n, _)| *n == name).map(|&(_, a)| a);
    Some(builtins_range(
        elf,
        data,
        at(BLOB_SYMBOL),
        at(BLOB_SIZE_SYMBOL),
    ))
}

/// Where the embedded builtins of V8 file `elf` (its bytes `data`) are,
/// as virtual addresses: from `code`, the address of [`BLOB_SYMBOL`], for
/// the size held at `size_at`, that of [`BLOB_SIZE_SYMBOL`]; else, where
/// the symbols are not there, the largest stretch of `.text` without
/// CFI ([`largest_fde_gap`]).
fn builtins_range(
    elf: &object::File,
    data: &[u8],
    code: Option<u64>,
    size_at: Option<u64>,
) -> Option<(u64, u64)> {
    let size = size_at
        .and_then(|a| int_of(elf, data, a))
        .map(|v| u64::from(v as u32));
    match (code, size) {
        (Some(low), Some(size)) if size > 0 => Some((low, low + size)),
        _ => largest_fde_gap(elf),
    }
}

/// The embedded builtins of a file whose symbols do not say where they
/// are (Debian's stripped `libnode.so`): the largest stretch of `.text`
/// no `.eh_frame` FDE covers (the builtins have no CFI; compiled code
/// does), as virtual addresses.
fn largest_fde_gap(elf: &object::File) -> Option<(u64, u64)> {
    use gimli::UnwindSection as _;
    use object::{Object as _, ObjectSection as _};
    let text = elf.section_by_name(".text")?;
    let eh = elf.section_by_name(".eh_frame")?;
    let eh_data = eh.uncompressed_data().ok()?;
    let bases = gimli::BaseAddresses::default()
        .set_eh_frame(eh.address())
        .set_text(text.address());
    let frame = gimli::EhFrame::new(&eh_data, gimli::LittleEndian);
    let mut covered = Vec::new();
    let mut entries = frame.entries(&bases);
    while let Ok(Some(entry)) = entries.next() {
        if let gimli::CieOrFde::Fde(partial) = entry
            && let Ok(fde) = partial.parse(gimli::EhFrame::cie_from_offset)
        {
            covered.push((fde.initial_address(), fde.end_address()));
        }
    }
    covered.sort_unstable();
    let (low, high) = (text.address(), text.address() + text.size());
    let mut best = (0, 0);
    let mut at = low;
    for (s, e) in covered.into_iter().chain([(high, high)]) {
        let s = s.clamp(low, high);
        if s > at && s - at > best.1 - best.0 {
            best = (at, s);
        }
        at = at.max(e.min(high));
    }
    (best.1 > best.0).then_some(best)
}

/// Where a `ScopeInfo` keeps the function's position.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Positions {
    /// After the inferred name, for function, script, eval, module (and
    /// non-empty class) scopes; scope types class 0, eval 1, function 2,
    /// module 3, script 4 (V8 9.8 to 12.8).
    Trailing,
    /// At fixed slots 3 and 4, right after the local count (V8 12.8.44
    /// and later); scope types script 0, repl 1, class 2, eval 3,
    /// function 4, module 5.
    Fixed,
}

/// What one V8 build's metadata gives: the kernel's record (its offsets)
/// and what the names need.
#[derive(Debug)]
struct Layout {
    /// The offsets and types for the kernel; ranges and salt not set.
    record: V8Proc,
    /// `11.3.244.8`.
    version: String,
    string_length: u64,
    seq_chars: u64,
    cons_first: u64,
    cons_second: u64,
    thin_actual: u64,
    sliced_parent: u64,
    sliced_offset: u64,
    external_resource: u64,
    first_nonstring: u16,
    repr_mask: u16,
    encoding_mask: u16,
    one_byte_tag: u16,
    seq_tag: u16,
    cons_tag: u16,
    external_tag: u16,
    sliced_tag: u16,
    thin_tag: u16,
    scope_info_type: u16,
    /// The `UncompiledData*` types: a function not compiled (or whose
    /// bytecode was flushed) keeps its position and inferred name there.
    uncompiled_types: Vec<u16>,
    sfi_function_data: u64,
    uncompiled_inferred: u64,
    uncompiled_start: u64,
    script_type: u16,
    script_name: u64,
    script_source: u64,
    script_line_ends: u64,
    array_length: u64,
    array_data: u64,
    /// `ScopeInfo`'s layouts to try, the likeliest first.
    positions: Vec<Positions>,
    /// Whether a `ScopeInfo` with many locals keeps them in a hash
    /// table (V8 9.8 and later).
    names_table: bool,
    /// Where its compiled code keeps the functions inlined in it, or why
    /// they cannot be read.
    code: Result<CodeLayout, String>,
}

/// Where one V8 build keeps what expanding the functions inlined in
/// compiled code reads, from its metadata and, where it lacks a field,
/// from the build's version as measured (`%DebugPrint` of a TurboFan
/// function's code, and its words read from the process). A piece of
/// compiled code is, up to V8 10 (node 18), one `Code` object in the code
/// range, its header (with its tables) right before its instructions;
/// from V8 11.3 (node 20 and 24), an `InstructionStream` there, its
/// header pointing at its `Code` beside the other objects, which holds
/// the tables. The tables: the source positions (by pc offset, each with
/// the inlining it is in) and the deoptimization data (the inlined
/// functions and where each was called). Every guess is checked against
/// the code found (the stream and its `Code` point at each other, the
/// instructions hold the pc, the code is the frame's function's), so a
/// wrong one finds nothing rather than something wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
struct CodeLayout {
    /// How the instructions are kept.
    stream: Stream,
    /// The instance type of the object right before the instructions (an
    /// `InstructionStream`, or up to V8 10 the `Code` itself).
    head_type: u16,
    /// How far before the instructions that object starts.
    head_size: u64,
    code_deopt: u64,
    code_positions: u64,
    code_flags: u64,
    code_size: u64,
    kind_mask: u32,
    kind_shift: u32,
    /// Code of a kind above this is optimized (Maglev, TurboFan).
    kind_baseline: u32,
    /// Indices in `DeoptimizationData`.
    deopt_literals: u64,
    deopt_sfi: u64,
    deopt_inlining: u64,
    /// Where the compiled function is kept in a `SharedFunctionInfoWrapper`
    /// at `deopt_sfi` (V8 12.9 and later), or `None`: there itself.
    sfi_wrapped: Option<u64>,
}

/// How a build keeps compiled code's instructions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stream {
    /// In its `Code` (V8 10 and before).
    InCode,
    /// In an `InstructionStream` apart from its `Code`: the stream's
    /// pointer to it, and the `Code`'s to the stream and to its first
    /// instruction.
    Apart {
        code: u64,
        code_type: u16,
        code_istream: u64,
        code_start: u64,
    },
}

impl CodeLayout {
    fn new(f: &V8File) -> Result<Self, String> {
        let lacks = |what: &str| format!("its v8dbg metadata lacks {what}");
        let off =
            |class: &str, field: &str| f.field(class, field).and_then(|v| u64::try_from(v).ok());
        let get = |name: &str| f.get(name).and_then(|v| u64::try_from(v).ok());
        let code_type = f
            .ty("CODE_TYPE")
            .and_then(|v| u16::try_from(v).ok())
            .ok_or_else(|| lacks("CODE_TYPE"))?;
        let size = off("Code", "instruction_size");
        let flags = off("Code", "flags");
        let wrapper = off("Code", "wrapper");
        let positions = off("Code", "source_position_table");
        let deopt = off("Code", "deoptimization_data");
        let (stream, head_type, head_size, code_positions, code_deopt, code_flags, code_size) =
            match f
                .ty("INSTRUCTION_STREAM_TYPE")
                .and_then(|v| u16::try_from(v).ok())
            {
                Some(ty) => {
                    // 11.3 exports the tables' offsets and not the rest,
                    // which follow them [measured, node 20.20.2]; 13.6
                    // the rest and not the tables, which come before its
                    // wrapper [measured, node 24.22.2].
                    let (positions, deopt) = match (positions, deopt, wrapper) {
                        (Some(p), Some(d), _) => (p, d),
                        (_, _, Some(w)) if w >= 16 => (w - 8, w - 16),
                        _ => return Err(lacks("Code::source_position_table")),
                    };
                    let stream = Stream::Apart {
                        code: 8,
                        code_type,
                        code_istream: off("Code", "instruction_stream").unwrap_or(positions + 8),
                        code_start: off("Code", "instruction_start").unwrap_or(positions + 16),
                    };
                    let head = off("InstructionStream", "instruction_start")
                        .ok_or_else(|| lacks("InstructionStream::instruction_start"))?;
                    let flags = flags.unwrap_or(positions + 24);
                    let size = size.unwrap_or(positions + 32);
                    (stream, ty, head, positions, deopt, flags, size)
                }
                None => {
                    // One object: its tables right before its instruction
                    // count, its header's size its instructions' offset
                    // [measured, node 18.20.4].
                    let size = size.ok_or_else(|| lacks("Code::instruction_size"))?;
                    let head = off("Code", "instruction_start")
                        .ok_or_else(|| lacks("Code::instruction_start"))?;
                    let positions = positions.unwrap_or(size.saturating_sub(16));
                    let deopt = deopt.unwrap_or(size.saturating_sub(24));
                    let flags = flags.ok_or_else(|| lacks("Code::flags"))?;
                    (
                        Stream::InCode,
                        code_type,
                        head,
                        positions,
                        deopt,
                        flags,
                        size,
                    )
                }
            };
        // Their indices in V8 10 to 12.8, where the metadata lacks them
        // (node 18) [measured, node 18.20.4 and 20.20.2].
        let (deopt_sfi, sfi_wrapped) = match get("DeoptimizationDataWrappedSharedFunctionInfoIndex")
        {
            Some(i) => (
                i,
                Some(
                    off("SharedFunctionInfoWrapper", "shared_info")
                        .ok_or_else(|| lacks("SharedFunctionInfoWrapper::shared_info"))?,
                ),
            ),
            None => (
                get("DeoptimizationDataSharedFunctionInfoIndex").unwrap_or(6),
                None,
            ),
        };
        Ok(Self {
            stream,
            head_type,
            head_size,
            code_deopt,
            code_positions,
            code_flags,
            code_size,
            kind_mask: get("CodeKindFieldMask").ok_or_else(|| lacks("CodeKindFieldMask"))? as u32,
            kind_shift: get("CodeKindFieldShift").unwrap_or(0) as u32,
            kind_baseline: get("CodeKindBaseline").ok_or_else(|| lacks("CodeKindBaseline"))? as u32,
            deopt_literals: get("DeoptimizationDataLiteralArrayIndex").unwrap_or(2),
            deopt_sfi,
            deopt_inlining: get("DeoptimizationDataInliningPositionsIndex").unwrap_or(7),
            sfi_wrapped,
        })
    }
}

impl Layout {
    /// Reads a build's layout from its metadata; `Err`: why the walk
    /// cannot use it.
    fn new(f: &V8File) -> Result<Self, String> {
        let need = |v: Option<i64>, what: &str| -> Result<i64, String> {
            v.ok_or_else(|| format!("its v8dbg metadata lacks {what}"))
        };
        let version = format!(
            "{}.{}.{}.{}",
            f.version[0], f.version[1], f.version[2], f.version[3]
        );
        let shift = need(f.get("SmiShiftSize"), "SmiShiftSize")?;
        if shift == 0 || f.get("TaggedSize").is_some_and(|t| t != 8) {
            return Err("pointer compression is on".to_owned());
        }
        if shift != 31 {
            return Err(format!("small integers are shifted by {shift}, not 31"));
        }
        let off16 = |v: i64, what: &str| -> Result<u16, String> {
            u16::try_from(v).map_err(|_| format!("its {what} ({v}) is out of range"))
        };
        let fp16 = |name: &str| -> Result<i16, String> {
            let v = need(f.get(&format!("off_fp_{name}")), &format!("off_fp_{name}"))?;
            i16::try_from(v).map_err(|_| format!("its off_fp_{name} ({v}) is out of range"))
        };
        let fp_context = fp16("context")?;
        let fp_function = fp16("function")?;
        // As OTel: derived from the function's slot where not told.
        let fp_bytecode_array = fp16("bytecode_array").unwrap_or(fp_function - 16);
        let fp_bytecode_offset = fp16("bytecode_offset").unwrap_or(fp_function - 24);
        let sfi_name = need(
            f.field("SharedFunctionInfo", "name_or_scope_info"),
            "SharedFunctionInfo::name_or_scope_info",
        )?;
        let sfi_script = need(
            f.field_of("SharedFunctionInfo", &["script_or_debug_info", "script"]),
            "SharedFunctionInfo::script",
        )?;
        let length = need(
            f.field("SharedFunctionInfo", "length"),
            "SharedFunctionInfo::length",
        )?;
        // The 16-bit fields the parse fixed, where they share length's word.
        let mut mask = 0u64;
        for field in [
            "length",
            "internal_formal_parameter_count",
            "raw_function_token_offset",
        ] {
            if let Some(o) = f.field("SharedFunctionInfo", field)
                && o >= length
                && o + 2 <= length + 8
            {
                mask |= 0xffff << ((o - length) * 8);
            }
        }
        let sfi_read = sfi_name.max(sfi_script).max(length) + 8;
        if sfi_read as usize > SFI_BYTES || sfi_name < 0 || sfi_script < 0 || length < 0 {
            return Err(format!(
                "its SharedFunctionInfo fields lie beyond {SFI_BYTES} bytes"
            ));
        }
        let function_type = need(f.ty("JS_FUNCTION_TYPE"), "JS_FUNCTION_TYPE")?;
        // 11.3 (no First/Last in its metadata) has 16 function types, the
        // class constructors last: JS_FUNCTION_TYPE..=+15 [measured].
        let first_function_type = f.get("FirstJSFunctionType").unwrap_or(function_type);
        let last_function_type = f.get("LastJSFunctionType").unwrap_or(function_type + 15);
        let tag = need(f.get("HeapObjectTag"), "HeapObjectTag")?;
        let tag_mask = need(f.get("HeapObjectTagMask"), "HeapObjectTagMask")?;
        let record = V8Proc {
            fp_context,
            fp_function,
            fp_bytecode_array,
            fp_bytecode_offset,
            heap_object_map: off16(
                need(f.field("HeapObject", "map"), "HeapObject::map")?,
                "HeapObject::map",
            )?,
            map_instance_type: off16(
                need(f.field("Map", "instance_type"), "Map::instance_type")?,
                "Map::instance_type",
            )?,
            function_shared: off16(
                need(f.field("JSFunction", "shared"), "JSFunction::shared")?,
                "JSFunction::shared",
            )?,
            first_function_type: off16(first_function_type, "FirstJSFunctionType")?,
            last_function_type: off16(last_function_type, "LastJSFunctionType")?,
            sfi_type: off16(
                need(
                    f.ty("SHARED_FUNCTION_INFO_TYPE"),
                    "SHARED_FUNCTION_INFO_TYPE",
                )?,
                "SHARED_FUNCTION_INFO_TYPE",
            )?,
            sfi_name: sfi_name as u16,
            sfi_script: sfi_script as u16,
            sfi_ints: length as u16,
            sfi_read: sfi_read as u16,
            sfi_ints_mask: mask,
            heap_object_tag: tag as u8,
            heap_object_tag_mask: tag_mask as u8,
            smi_shift: (shift + 1) as u8,
            ..V8Proc::default()
        };
        let u = |v: Option<i64>, d: u64| v.and_then(|v| u64::try_from(v).ok()).unwrap_or(d);
        let t = |v: Option<i64>, d: u16| v.and_then(|v| u16::try_from(v).ok()).unwrap_or(d);
        let uncompiled_types = [
            "UNCOMPILED_DATA_WITHOUT_PREPARSE_DATA_TYPE",
            "UNCOMPILED_DATA_WITH_PREPARSE_DATA_TYPE",
            "UNCOMPILED_DATA_WITHOUT_PREPARSE_DATA_WITH_JOB_TYPE",
            "UNCOMPILED_DATA_WITH_PREPARSE_DATA_AND_JOB_TYPE",
        ]
        .iter()
        .filter_map(|n| f.ty(n).and_then(|v| u16::try_from(v).ok()))
        .collect();
        let positions = if f.version[0] == 0 {
            vec![Positions::Fixed, Positions::Trailing]
        } else if f.at_least([12, 8, 44]) {
            vec![Positions::Fixed]
        } else {
            vec![Positions::Trailing]
        };
        Ok(Self {
            record,
            version,
            string_length: u(f.field("String", "length"), 12),
            seq_chars: u(f.field("SeqOneByteString", "chars"), 16),
            cons_first: u(f.field("ConsString", "first"), 16),
            cons_second: u(f.field("ConsString", "second"), 24),
            thin_actual: u(f.field("ThinString", "actual"), 16),
            sliced_parent: u(f.field("SlicedString", "parent"), 16),
            sliced_offset: u(f.field("SlicedString", "offset"), 24),
            external_resource: u(f.field("ExternalString", "resource"), 16),
            first_nonstring: t(f.get("FirstNonstringType"), 128),
            repr_mask: t(f.get("StringRepresentationMask"), 7),
            encoding_mask: t(f.get("StringEncodingMask"), 8),
            one_byte_tag: t(f.get("OneByteStringTag"), 8),
            seq_tag: t(f.get("SeqStringTag"), 0),
            cons_tag: t(f.get("ConsStringTag"), 1),
            external_tag: t(f.get("ExternalStringTag"), 2),
            sliced_tag: t(f.get("SlicedStringTag"), 3),
            thin_tag: t(f.get("ThinStringTag"), 5),
            scope_info_type: t(f.ty("SCOPE_INFO_TYPE"), u16::MAX),
            uncompiled_types,
            sfi_function_data: u(f.field("SharedFunctionInfo", "function_data"), 8),
            uncompiled_inferred: u(f.field("UncompiledData", "inferred_name"), 8),
            uncompiled_start: u(f.field("UncompiledData", "start_position"), 16),
            script_type: t(f.ty("SCRIPT_TYPE"), u16::MAX),
            script_name: u(f.field("Script", "name"), 16),
            script_source: u(f.field("Script", "source"), 8),
            script_line_ends: u(f.field("Script", "line_ends"), 56),
            array_length: u(f.field("FixedArrayBase", "length"), 8),
            array_data: u(f.field("FixedArray", "data"), 16),
            positions,
            names_table: f.at_least([9, 8, 0]),
            code: CodeLayout::new(f),
        })
    }
}

/// A process found to run V8.
struct V8Process {
    layout: Arc<Layout>,
    mem: Mem,
    /// Its JIT code ranges the kernel was given: a compiled frame's pc
    /// (its low 32 bits, as the walk writes it) is in one of them
    /// ([`pcs_in`]).
    jit: Vec<V8Range>,
    /// The map of the objects right before compiled code's instructions
    /// (`CodeLayout::head_type`) found last.
    head_map: std::cell::Cell<u64>,
}

/// The pcs whose low 32 bits are `low` in JIT ranges `jit`: each range is
/// smaller than 4 GiB, so at most one address of a range has them, but
/// with several isolates (a range each, about 512 MiB apart) more than one
/// range may, and the code there tells which.
fn pcs_in(jit: &[V8Range], low: u32) -> Vec<u64> {
    jit.iter()
        .filter_map(|r| {
            let at = (r.low & !0xffff_ffff) | u64::from(low);
            [at, at + (1 << 32)]
                .into_iter()
                .find(|&pc| r.low <= pc && pc < r.high)
        })
        .collect()
}

/// One piece of compiled code's tables, as expanding its inlined
/// functions reads them.
#[derive(Debug, Default)]
struct CodeInfo {
    /// Where its instructions start, and how many bytes they take.
    start: u64,
    size: u64,
    /// The function compiled (untagged), from its deoptimization data;
    /// 0 for code without it (Sparkplug's), which inlines nothing.
    sfi: u64,
    /// (pc offset, source position), in pc order: a source position's
    /// bit 0 marks an external one, bits 1 to 30 hold the script offset
    /// plus one, bits 31 to 46 the inlining (an index in `inlining`) plus
    /// one, 0 where none (`SourcePosition`).
    positions: Vec<(u32, u64)>,
    /// Per inlining: the source position of its call (in the inlining
    /// that called it), and its function's index in `literals`.
    inlining: Vec<(u64, i32)>,
    /// The deoptimization data's literals (tagged; 0 where cleared).
    literals: Vec<u64>,
}

/// Inlined functions expanded at one pc at most: more is a table read
/// wrong.
const MAX_INLINED: usize = 64;

/// Bytes of code searched back from a pc for the start of its
/// `InstructionStream`: TurboFan's largest functions take some hundred
/// kilobytes.
const MAX_CODE_SCAN: u64 = 1 << 20;

/// Bytes of a code table read at most.
const MAX_TABLE: usize = 4 << 20;

/// x86-64 instructions start at a multiple of this (`kCodeAlignment`).
const CODE_ALIGNMENT: u64 = 64;

impl CodeInfo {
    /// The functions at pc offset `off` (of a return address or a
    /// sampled pc: the call, or the instruction, is the byte before), the
    /// innermost first: each as its `SharedFunctionInfo` (tagged; 0 for
    /// the function compiled) and its script offset, where known. Only
    /// the compiled function where the tables do not hold together.
    fn at(&self, off: u64) -> Vec<(u64, Option<i64>)> {
        let look = off.saturating_sub(1);
        let i = self
            .positions
            .partition_point(|&(o, _)| u64::from(o) <= look);
        let Some(&(_, mut pos)) = i.checked_sub(1).and_then(|i| self.positions.get(i)) else {
            return vec![(0, None)];
        };
        let mut out = Vec::new();
        for _ in 0..MAX_INLINED {
            let script = (pos & 1 == 0).then(|| ((pos >> 1) & ((1 << 30) - 1)) as i64 - 1);
            let script = script.filter(|&o| o >= 0);
            let id = ((pos >> 31) & 0xffff) as i64 - 1;
            if id < 0 {
                out.push((0, script));
                return out;
            }
            let Some(&(call, lit)) = self.inlining.get(id as usize) else {
                break;
            };
            let Some(&sfi) = usize::try_from(lit).ok().and_then(|l| self.literals.get(l)) else {
                break;
            };
            if sfi == 0 {
                break;
            }
            out.push((sfi, script));
            pos = call;
        }
        vec![(0, None)]
    }
}

/// Decodes a source position table (`SourcePositionTableIterator`):
/// pairs of zigzag variable-length deltas, the pc offset's (negative for
/// an expression position: −offset − 1) and the position's.
fn decode_positions(b: &[u8]) -> Option<Vec<(u32, u64)>> {
    fn int(b: &[u8], i: &mut usize) -> Option<i64> {
        let (mut v, mut shift) = (0u64, 0u32);
        loop {
            let byte = *b.get(*i)?;
            *i += 1;
            v |= u64::from(byte & 0x7f).checked_shl(shift)?;
            shift += 7;
            if byte & 0x80 == 0 {
                break;
            }
            if shift > 63 {
                return None;
            }
        }
        Some((v >> 1) as i64 ^ -((v & 1) as i64))
    }
    let (mut i, mut off, mut pos) = (0, 0i64, 0i64);
    let mut out = Vec::new();
    while i < b.len() {
        let d = int(b, &mut i)?;
        off += if d >= 0 { d } else { -(d + 1) };
        pos = pos.wrapping_add(int(b, &mut i)?);
        out.push((u32::try_from(off).ok()?, pos as u64));
    }
    Some(out)
}

/// What looking at a process found.
enum Look {
    /// No file with `v8dbg_*` metadata.
    NotV8,
    /// V8, but no JIT code range yet: looked at again next time.
    Starting,
    /// V8, with the kernel's record of it (boxed: it holds 64 ranges)
    /// and the `-v` line.
    V8(Box<V8Process>, Box<V8Proc>, String),
}

/// A script of a process, by its address and its source's (address,
/// length).
type ScriptKey = (Proc, u64, u64, u64);

/// A function, named: what its frames share.
#[derive(Debug)]
struct Named {
    name: Arc<str>,
    file: Option<Arc<str>>,
    line: Option<u32>,
    /// Where its script's lines end, for the line of a place in it.
    ends: Option<Arc<[u32]>>,
}

impl Named {
    /// A frame of this function, at `line`, run as `kind`.
    fn frame(&self, line: Option<u32>, kind: V8Kind) -> V8Frame {
        V8Frame {
            name: Arc::clone(&self.name),
            file: self.file.clone(),
            line,
            kind,
        }
    }
}

/// The V8 processes, and the names of their JavaScript frames.
#[derive(Default)]
pub struct V8 {
    /// Off with `--no-v8`.
    disabled: bool,
    /// Frames carry lines (`--lines`); the function's first line is given
    /// either way (it tells functions of one name apart).
    lines: bool,
    /// By file (device, inode): what it says, `None` if no V8's.
    files: HashMap<(u64, u64), Option<Arc<V8File>>>,
    /// By file: its layout, or why it cannot be walked.
    layouts: HashMap<(u64, u64), Result<Arc<Layout>, String>>,
    /// By process, not pid: a later process of the pid is looked at anew.
    procs: HashMap<Proc, V8Process>,
    /// Processes whose V8 was found still starting (its code not set up
    /// yet): looked at again every 100 ms (`StackTool::look_again`), as a
    /// thread blocked from its start may run no new code that would have
    /// it looked at again.
    starting: std::collections::HashSet<Proc>,
    /// Processes found to run no V8 the walk can read, and why (`None`:
    /// none at all).
    not: HashMap<Proc, Option<String>>,
    /// Named frames, by process and slots.
    frames: HashMap<(Proc, u64, u64), Arc<[V8Frame]>>,
    /// Functions, by process, `SharedFunctionInfo` and its check.
    functions: HashMap<(Proc, u64, u32), Option<Arc<Named>>>,
    /// Line starts of scripts, by process, script and its source (its
    /// address and length): a script's source does not change.
    scripts: HashMap<ScriptKey, Option<Arc<[u32]>>>,
    /// Compiled code, by process and where its instructions start; a pc
    /// is looked up by the code before it, and checked to be in it.
    codes: BTreeMap<(Proc, u64), Arc<CodeInfo>>,
    /// What `-v` says of the V8s found.
    found: BTreeMap<Proc, String>,
    /// Every process whose V8 the kernel's walk was given in the run,
    /// kept through its exit and its being looked at again.
    given: std::collections::HashSet<Proc>,
    /// V8s that cannot be walked, and why.
    failed: BTreeMap<u32, String>,
    /// Frames that could not be named.
    unnamed: u64,
}

impl V8 {
    /// Turns the walk off (`--no-v8`) and sets whether frames carry lines
    /// (`--lines`).
    pub fn configure(&mut self, enabled: bool, lines: bool) {
        self.disabled = !enabled;
        self.lines = lines;
    }

    /// Looks at process `who` (again if `fresh`: it ran a new program or
    /// mapped new code) and returns the record for the kernel if it runs a
    /// V8 whose metadata can be read and whose JIT code range is set up,
    /// and the kernel has not been given it yet. A V8 still starting (no
    /// anonymous executable mapping yet) is looked at again on the next
    /// call; a process without V8 is remembered as not V8 until `fresh`.
    /// A V8 that cannot be walked (no metadata, pointer compression on)
    /// is told on stderr, once.
    pub fn examine(&mut self, maps: &MapsOnce, fresh: bool) -> Option<V8Proc> {
        let who = maps.who();
        let pid = who.pid;
        if self.disabled || pid == 0 {
            return None;
        }
        let known = self.procs.contains_key(&who);
        if fresh {
            self.not.remove(&who);
            self.codes.retain(|k, _| k.0 != who);
        } else if known || self.not.contains_key(&who) {
            return None;
        }
        self.starting.remove(&who);
        match self.find(maps) {
            // A V8 being walked, looked at again for its new code, whose
            // mappings are gone (it is exiting: a zombie's maps are empty)
            // or cannot be read now keeps its walk and `-v`'s line: both
            // stay true of it until its exit record, and the kernel's
            // table holds it until then. (A new program is forgotten
            // before it is looked at, so it is never `known` here.)
            Ok(Look::NotV8 | Look::Starting) | Err(_) if known => None,
            Ok(Look::NotV8) => {
                self.not.insert(who, None);
                None
            }
            Ok(Look::Starting) => {
                self.starting.insert(who);
                None
            }
            Ok(Look::V8(p, record, line)) => {
                self.procs.insert(who, *p);
                self.found.insert(who, line);
                self.given.insert(who);
                Some(*record)
            }
            Err(why) => {
                self.warn(who, why.clone());
                self.not.insert(who, Some(why));
                None
            }
        }
    }

    fn warn(&mut self, who: Proc, why: String) {
        let pid = who.pid;
        eprintln!(
            "rtrace: PID {pid} ({}): no JavaScript frames: {why}; native frames only",
            comm(pid)
        );
        self.failed.insert(pid, why);
    }

    /// Whether the walk was given process `who`'s V8 in this run (it may
    /// have exited since).
    pub fn walked(&self, who: Proc) -> bool {
        self.given.contains(&who)
    }

    /// The processes whose V8 was found still starting, to be looked
    /// at again ([`Self::examine`]).
    pub fn starting(&self) -> Vec<Proc> {
        self.starting.iter().copied().collect()
    }

    /// Forgets process `who` (it exited or ran a new program). The names
    /// of its frames stay, for its samples not named yet.
    pub fn forget(&mut self, who: Proc) {
        self.procs.remove(&who);
        self.not.remove(&who);
        self.starting.remove(&who);
        self.functions.retain(|k, _| k.0 != who);
        self.scripts.retain(|k, _| k.0 != who);
        self.codes.retain(|k, _| k.0 != who);
    }

    /// Finds the file with V8's metadata in `who`'s mappings, its layout,
    /// and the ranges of its code.
    fn find(&mut self, maps: &MapsOnce) -> Result<Look, String> {
        let who = maps.who();
        let pid = who.pid;
        let (Some(proc_dir), Some(maps)) = (maps.dir(), maps.get()) else {
            return Ok(Look::NotV8);
        };
        let exe = std::fs::read_link(format!("{proc_dir}/exe")).ok();
        let mut found = None;
        let mut looked = Vec::new();
        // A Node.js without the metadata (built without postmortem
        // support): told, not taken for a process without V8.
        let mut bare = None;
        for m in maps {
            let Some(path) = m.path() else {
                continue;
            };
            let base = path.rsplit('/').next().unwrap_or(path);
            if bare.is_none()
                && (base == "node" || base == "nodejs" || base.starts_with("libnode.so"))
            {
                bare = Some(path);
            }
            let key = m.file_key();
            if looked.contains(&key) || !may_hold_v8(maps, path, exe.as_deref()) {
                continue;
            }
            looked.push(key);
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
            if let Some(file) = file {
                found = Some((key, file));
                break;
            }
        }
        let Some((key, file)) = found else {
            return match bare {
                Some(path) if !jit_ranges(maps).is_empty() => Err(format!(
                    "its {path} has no v8dbg metadata (V8 built without postmortem support)"
                )),
                // Looked at again once it runs JavaScript.
                Some(_) => Ok(Look::Starting),
                None => Ok(Look::NotV8),
            };
        };
        let layout = self
            .layouts
            .entry(key)
            .or_insert_with(|| Layout::new(&file).map(Arc::new))
            .clone()?;
        let mut record = layout.record;
        let Some(plan) = plan_ranges(maps, key, file.blob) else {
            return Ok(Look::Starting);
        };
        let ranges = &plan.ranges;
        record.ranges[..ranges.len()].copy_from_slice(ranges);
        record.nranges = ranges.len() as u32;
        record.builtins = plan.builtins;
        record.salt = who.salt();
        let mem = open_mem_in(who, proc_dir);
        if let Mem::Denied(why) = &mem {
            return Err(format!("its memory cannot be read: {why}"));
        }
        let show = |i: u32| {
            ranges
                .get(i as usize)
                .map(|r| format!("{:#x}-{:#x}", r.low, r.high))
        };
        let of_kind = |builtins: bool| -> Vec<String> {
            (0..ranges.len() as u32)
                .filter(|&i| (plan.builtins >> i & 1 != 0) == builtins)
                .filter_map(show)
                .collect()
        };
        let (builtins, jits) = (of_kind(true), of_kind(false));
        let mut line = format!(
            "PID {pid} ({}): V8 {}, JIT code {}, builtins {}",
            comm(pid),
            layout.version,
            jits.join(", "),
            if builtins.is_empty() {
                "?".to_owned()
            } else {
                builtins.join(", ")
            }
        );
        if plan.left_out > 0 {
            line.push_str(&format!(
                " ({} more ranges of its worker threads' isolates not walked)",
                plan.left_out
            ));
        }
        match &layout.code {
            Ok(_) => line.push_str(", inlined functions expanded"),
            Err(why) => line.push_str(&format!(", inlined functions not expanded: {why}")),
        }
        line.push_str(mem.how());
        let jit = (0..ranges.len())
            .filter(|&i| plan.builtins >> i & 1 == 0)
            .map(|i| ranges[i])
            .collect();
        Ok(Look::V8(
            Box::new(V8Process {
                layout,
                mem,
                jit,
                head_map: std::cell::Cell::new(0),
            }),
            Box::new(record),
            line,
        ))
    }

    /// Names a JavaScript frame from its two slots (`first`: [`V8_JS`],
    /// or [`V8_JS_PC`] for one in JIT code, and the untagged address of
    /// its `SharedFunctionInfo`; `second`: the SFI's [`sfi_check`] and the
    /// bytecode offset or [`NO_OFFSET`], or the low half of its pc): its
    /// function, after the functions inlined at its pc, innermost first.
    /// Cached by (who, first, second). A frame whose `SharedFunctionInfo`
    /// no longer passes its check is `[js: gone]` (kind Unknown), never
    /// another function's name.
    ///
    /// [`V8_JS`]: rtrace_common::v8::V8_JS
    pub fn frames(&mut self, who: Proc, first: u64, second: u64) -> Vec<V8Frame> {
        if let Some(f) = self.frames.get(&(who, first, second)) {
            return f.to_vec();
        }
        let addr = first & V8_ADDR_MASK;
        let check = (second >> 32) as u32;
        let low = second as u32;
        let jit = first & V8_MASK == V8_JS_PC;
        let frames: Arc<[V8Frame]> = match self.function(who, addr, check) {
            Some(n) => match jit.then(|| self.expand(who, addr, low, &n)).flatten() {
                Some(f) => f.into(),
                None => Arc::new([n.frame(
                    n.line,
                    if jit || low == NO_OFFSET {
                        V8Kind::Compiled
                    } else {
                        V8Kind::Interpreted
                    },
                )]),
            },
            None => {
                self.unnamed += 1;
                Arc::new([V8Frame {
                    name: Arc::from(GONE),
                    file: None,
                    line: None,
                    kind: V8Kind::Unknown,
                }])
            }
        };
        self.frames
            .insert((who, first, second), Arc::clone(&frames));
        frames.to_vec()
    }

    /// The check of `SharedFunctionInfo` `addr` (untagged) of process
    /// `who` as it is now, as the kernel computes it; `None` if it is not
    /// one.
    #[cfg(test)]
    pub(crate) fn check_of(&self, who: Proc, addr: u64) -> Option<u32> {
        let p = self.procs.get(&who)?;
        Reader::of(p).check(addr).map(|(c, _)| c)
    }

    /// Function `addr` of `who`, named, if its check is still `check`.
    fn function(&mut self, who: Proc, addr: u64, check: u32) -> Option<Arc<Named>> {
        let p = self.procs.get(&who)?;
        let r = Reader::of(p);
        let (now, sfi) = r.check(addr)?;
        if now != check {
            return None;
        }
        if let Some(n) = self.functions.get(&(who, addr, check)) {
            return n.clone();
        }
        let named = r.describe(&sfi).map(|d| {
            let ends = d.script.and_then(|key| {
                self.scripts
                    .entry((who, key.0, key.1, key.2))
                    .or_insert_with(|| r.line_ends(key.0).map(Arc::from))
                    .clone()
            });
            let line = match (d.position, &ends) {
                (Some(pos), Some(ends)) => Some(line_of(ends, pos)),
                _ => None,
            };
            Arc::new(Named {
                name: d.name,
                file: d.file,
                line,
                ends,
            })
        });
        self.functions.insert((who, addr, check), named.clone());
        named
    }

    /// The frames of compiled function `sfi` (untagged, named `outer`)
    /// of process `who` at the pc whose low 32 bits are `low`: the
    /// functions inlined there, innermost first, then `sfi`'s own, each
    /// at its line under `--lines`. `None` where the code or its tables
    /// cannot be read, or one of those functions named: the frame is then
    /// `sfi`'s alone, never one named wrong.
    fn expand(
        &mut self,
        who: Proc,
        sfi: u64,
        low: u32,
        outer: &Arc<Named>,
    ) -> Option<Vec<V8Frame>> {
        // Of the isolates' ranges that have an address with these low
        // bits, the one whose code there is this function's; code that
        // names no function (Sparkplug's) only where there is no choice.
        let pcs = pcs_in(&self.procs.get(&who)?.jit, low);
        let (pc, code) = pcs.iter().find_map(|&pc| {
            let c = self.code_for(who, pc, sfi)?;
            (c.sfi == sfi || pcs.len() == 1).then_some((pc, c))
        })?;
        let mut out = Vec::new();
        for (f, script) in code.at(pc - code.start) {
            let (named, kind) = if f == 0 {
                (Arc::clone(outer), V8Kind::Compiled)
            } else {
                let r = Reader::of(self.procs.get(&who)?);
                if !r.is_heap(f) {
                    return None;
                }
                // Reads it as the kernel would, its type checked too.
                let addr = r.untag(f);
                let (check, _) = r.check(addr)?;
                (self.function(who, addr, check)?, V8Kind::Inlined)
            };
            let line = match (self.lines, script, &named.ends) {
                (true, Some(at), Some(ends)) => Some(line_of(ends, at)),
                _ => named.line,
            };
            out.push(named.frame(line, kind));
        }
        Some(out)
    }

    /// The compiled code of process `who` that holds `pc`, if it is
    /// function `sfi`'s (or code without tables): from what was found
    /// before, else searched for.
    fn code_for(&mut self, who: Proc, pc: u64, sfi: u64) -> Option<Arc<CodeInfo>> {
        let fits =
            |c: &CodeInfo| c.start <= pc && pc < c.start + c.size && (c.sfi == sfi || c.sfi == 0);
        if let Some((&(w, _), c)) = self.codes.range(..=(who, pc)).next_back()
            && w == who
            && fits(c)
        {
            return Some(Arc::clone(c));
        }
        let p = self.procs.get(&who)?;
        let floor = p.jit.iter().find(|r| r.low <= pc && pc < r.high)?.low;
        let c = Arc::new(Reader::of(p).find_code(pc, floor)?);
        // What lay where this code is now was moved or freed.
        let (lo, hi) = (c.start, c.start + c.size);
        self.codes
            .retain(|&(w, s), o| w != who || s + o.size <= lo || s >= hi);
        self.codes.insert((who, c.start), Arc::clone(&c));
        fits(&c).then_some(c)
    }

    /// What `-v` says: one line per V8 found.
    pub fn summary(&self) -> Vec<String> {
        self.found.values().cloned().collect()
    }

    /// V8s that could not be walked, and frames left unnamed.
    pub fn warnings(&self) -> Vec<Warning> {
        let mut out: Vec<Warning> = self
            .failed
            .iter()
            .take(5)
            .map(|(pid, why)| Warning::unwalked(format!("PID {pid}: no JavaScript frames: {why}")))
            .collect();
        if self.unnamed > 0 {
            out.push(Warning::unnamed(format!(
                "{} JavaScript frames are {GONE}: their function moved or was freed (or the \
                 process exited) before it could be read",
                self.unnamed
            )));
        }
        out
    }
}

/// What naming a function found, before its line is worked out.
struct Described {
    name: Arc<str>,
    file: Option<Arc<str>>,
    /// The function's start, as a character offset in its script.
    position: Option<i64>,
    /// Its script, and the script's source (address, length): the key of
    /// the script's line ends.
    script: Option<(u64, u64, u64)>,
}

/// What a function's `ScopeInfo` says of it, as tagged words.
#[derive(Debug, PartialEq, Eq)]
struct Scope {
    /// The function variable's name (a String, or Smi 0 where none).
    name: Option<u64>,
    /// The name V8 inferred (a String, or undefined).
    inferred: Option<u64>,
    /// The start position.
    start: Option<i64>,
}

/// Reads one V8 process's heap objects.
struct Reader<'a> {
    mem: &'a Mem,
    l: &'a Layout,
    head_map: &'a std::cell::Cell<u64>,
}

impl<'a> Reader<'a> {
    fn of(p: &'a V8Process) -> Self {
        Self {
            mem: &p.mem,
            l: &p.layout,
            head_map: &p.head_map,
        }
    }

    /// The compiled code whose instructions hold `pc`: searched back from
    /// it, no lower than `floor`, for the object right before its
    /// instructions (which start aligned), a word that is that object's
    /// map; then checked.
    fn find_code(&self, pc: u64, floor: u64) -> Option<CodeInfo> {
        let c = self.l.code.as_ref().ok()?;
        let align = CODE_ALIGNMENT;
        let floor = floor.max(pc.saturating_sub(MAX_CODE_SCAN)) & !(align - 1);
        // Starts below `hi` are looked at, 4 KiB of them a read.
        let mut hi = (pc & !(align - 1)) + align;
        while hi > floor {
            let lo = hi.saturating_sub(4096).max(floor);
            let b = self
                .mem
                .read(lo.checked_sub(c.head_size)?, (hi - lo) as usize)?;
            let mut start = hi;
            while start > lo {
                start -= align;
                let i = (start - lo) as usize;
                let map = u64::from_le_bytes(b.get(i..i + 8)?.try_into().ok()?);
                if self.is_head_map(map, c)
                    && let Some(found) = self.code_at(start, pc, c)
                {
                    return found;
                }
            }
            hi = lo;
        }
        None
    }

    /// Whether `map` is a map of the objects right before instructions:
    /// the one found last (each isolate may have its own), or another of
    /// their type.
    fn is_head_map(&self, map: u64, c: &CodeLayout) -> bool {
        let known = self.head_map.get();
        if known != 0 && map == known {
            return true;
        }
        let is = self.map_type(map) == Some(c.head_type);
        if is {
            self.head_map.set(map);
        }
        is
    }

    /// Whether instructions start at `start` (their object checked: its
    /// `Code` and stream point at each other; `None` if not, a word of
    /// code that looked like a map), and then their code if they hold
    /// `pc`, with its tables if it is optimized.
    fn code_at(&self, start: u64, pc: u64, c: &CodeLayout) -> Option<Option<CodeInfo>> {
        let tag = u64::from(self.l.record.heap_object_tag);
        let head = start - c.head_size;
        let code = match c.stream {
            Stream::InCode => head + tag,
            Stream::Apart {
                code, code_type, ..
            } => {
                let code = self.mem.u64(head + code)?;
                if self.itype(code)? != code_type {
                    return None;
                }
                code
            }
        };
        let end = [c.code_flags, c.code_size, c.code_deopt, c.code_positions]
            .into_iter()
            .chain(match c.stream {
                Stream::InCode => None,
                Stream::Apart {
                    code_istream,
                    code_start,
                    ..
                } => Some(code_istream.max(code_start)),
            })
            .max()?;
        let words = self.mem.read(self.untag(code), end as usize + 8)?;
        let at = |o: u64| -> Option<u64> {
            Some(u64::from_le_bytes(
                words.get(o as usize..o as usize + 8)?.try_into().ok()?,
            ))
        };
        if let Stream::Apart {
            code_istream,
            code_start,
            ..
        } = c.stream
            && (at(code_istream)? != head + tag || at(code_start)? != start)
        {
            return None;
        }
        let size = u64::from(at(c.code_size)? as u32);
        Some(
            (pc < start + size)
                .then(|| self.tables(start, size, &at, c))
                .flatten(),
        )
    }

    /// The code whose instructions are `size` bytes at `start` and whose
    /// `Code`'s words `at` reads, with its tables if it is optimized.
    fn tables(
        &self,
        start: u64,
        size: u64,
        at: &dyn Fn(u64) -> Option<u64>,
        c: &CodeLayout,
    ) -> Option<CodeInfo> {
        let mut info = CodeInfo {
            start,
            size,
            ..CodeInfo::default()
        };
        let kind = (at(c.code_flags)? as u32 >> c.kind_shift) & c.kind_mask;
        if kind <= c.kind_baseline {
            return Some(info);
        }
        let elements = self.words(at(c.code_deopt)?, MAX_TABLE / 8)?;
        let elem = |i: u64| elements.get(usize::try_from(i).ok()?).copied();
        let mut sfi = elem(c.deopt_sfi)?;
        if let Some(shared) = c.sfi_wrapped {
            sfi = self.word(sfi, shared)?;
        }
        info.sfi = self.untag(sfi);
        info.literals = self
            .words(elem(c.deopt_literals)?, MAX_TABLE / 8)?
            .into_iter()
            // A weak reference has bit 1 set too; a cleared one is 3.
            .map(|w| if w & 0xffff_ffff == 3 { 0 } else { w & !2 })
            .collect();
        info.inlining = self
            .bytes(elem(c.deopt_inlining)?)?
            .chunks_exact(16)
            .map(|e| {
                let pos = u64::from_le_bytes(e[..8].try_into().unwrap_or_default());
                let id = i32::from_le_bytes(e[8..12].try_into().unwrap_or_default());
                (pos, id)
            })
            .collect();
        info.positions = decode_positions(&self.bytes(at(c.code_positions)?)?)?;
        Some(info)
    }

    /// The elements of `FixedArray` (or `WeakFixedArray`) `a`, tagged;
    /// `None` if it has more than `max`.
    fn words(&self, a: u64, max: usize) -> Option<Vec<u64>> {
        let b = self.array(a, 8, max)?;
        Some(
            b.chunks_exact(8)
                .map(|w| u64::from_le_bytes(w.try_into().unwrap_or_default()))
                .collect(),
        )
    }

    /// The bytes of `ByteArray` `a`.
    fn bytes(&self, a: u64) -> Option<Vec<u8>> {
        self.array(a, 1, MAX_TABLE)
    }

    /// The data of array `a`, whose length counts elements of `each`
    /// bytes; `None` if it has more than `max`.
    fn array(&self, a: u64, each: usize, max: usize) -> Option<Vec<u8>> {
        if !self.is_heap(a) {
            return None;
        }
        let n = self
            .word(a, self.l.array_length)
            .and_then(|w| self.smi(w))
            .and_then(|n| usize::try_from(n).ok())
            .filter(|&n| n <= max)?;
        self.mem.read(self.untag(a) + self.l.array_data, n * each)
    }

    fn is_heap(&self, w: u64) -> bool {
        let r = &self.l.record;
        w & u64::from(r.heap_object_tag_mask) == u64::from(r.heap_object_tag)
    }

    fn untag(&self, w: u64) -> u64 {
        w & !u64::from(self.l.record.heap_object_tag_mask)
    }

    /// A small integer's value.
    fn smi(&self, w: u64) -> Option<i64> {
        (w & 1 == 0).then(|| (w as i64) >> self.l.record.smi_shift)
    }

    /// The word at `off` of heap object `obj` (tagged).
    fn word(&self, obj: u64, off: u64) -> Option<u64> {
        self.mem.u64(self.untag(obj) + off)
    }

    /// Heap object `obj`'s instance type, by its map.
    fn itype(&self, obj: u64) -> Option<u16> {
        if !self.is_heap(obj) {
            return None;
        }
        self.map_type(self.word(obj, u64::from(self.l.record.heap_object_map))?)
    }

    /// The instance type map `map` (tagged) describes.
    fn map_type(&self, map: u64) -> Option<u16> {
        if !self.is_heap(map) {
            return None;
        }
        self.mem
            .u16(self.untag(map) + u64::from(self.l.record.map_instance_type))
    }

    fn is_string(&self, obj: u64) -> bool {
        self.itype(obj).is_some_and(|t| t < self.l.first_nonstring)
    }

    /// `SharedFunctionInfo` `addr` (untagged)'s check as the kernel
    /// computes it, and the bytes it read; `None` if it is not one.
    fn check(&self, addr: u64) -> Option<(u32, Vec<u8>)> {
        let r = &self.l.record;
        let b = self.mem.read(addr, usize::from(r.sfi_read))?;
        if self.map_type(u64_at(&b, r.heap_object_map)?)? != r.sfi_type {
            return None;
        }
        let check = sfi_check(
            u64_at(&b, r.sfi_name)?,
            u64_at(&b, r.sfi_script)?,
            u64_at(&b, r.sfi_ints)? & r.sfi_ints_mask,
        );
        Some((check, b))
    }

    /// Names the function of `SharedFunctionInfo` bytes `sfi` as
    /// `SharedFunctionInfo::DebugName` does: its own name (a String in
    /// `name_or_scope_info` while not compiled, the function variable of
    /// its `ScopeInfo` once it is), else the name inferred from where it
    /// was defined (in the `ScopeInfo`, or the `UncompiledData`), else
    /// `(anonymous)`.
    fn describe(&self, sfi: &[u8]) -> Option<Described> {
        let l = self.l;
        let r = &l.record;
        let nsi = u64_at(sfi, r.sfi_name)?;
        let script = u64_at(sfi, r.sfi_script)?;
        let (mut name, mut inferred, mut start) = (None, None, None);
        if self.itype(nsi) == Some(l.scope_info_type) {
            let s = self.scope(nsi)?;
            (name, inferred, start) = (s.name, s.inferred, s.start);
        } else {
            if self.is_string(nsi) {
                name = Some(nsi);
            }
            // Not compiled (or flushed): `function_data` is its
            // `UncompiledData`, with its position and inferred name.
            let data = u16::try_from(l.sfi_function_data)
                .ok()
                .and_then(|o| u64_at(sfi, o))
                .filter(|&d| {
                    self.itype(d)
                        .is_some_and(|t| l.uncompiled_types.contains(&t))
                });
            if let Some(d) = data {
                inferred = self.word(d, l.uncompiled_inferred);
                start = self
                    .mem
                    .i32(self.untag(d) + l.uncompiled_start)
                    .map(i64::from)
                    .filter(|&s| s >= 0);
            }
        }
        let text = |w: Option<u64>| {
            w.filter(|&w| self.is_string(w))
                .and_then(|w| self.string(w, MAX_NAME))
                .filter(|s| !s.is_empty())
        };
        let name = text(name)
            .or_else(|| text(inferred))
            .unwrap_or_else(|| ANONYMOUS.to_owned());
        let (file, key) = if self.itype(script) == Some(l.script_type) {
            let file = self
                .word(script, l.script_name)
                .filter(|&n| self.is_string(n))
                .and_then(|n| self.string(n, MAX_NAME))
                .filter(|s| !s.is_empty())
                .map(Arc::from);
            let key = self.word(script, l.script_source).and_then(|s| {
                let len = self.mem.i32(self.untag(s) + l.string_length)?;
                Some((script, s, len as u64))
            });
            (file, key)
        } else {
            (None, None)
        };
        Some(Described {
            name: name.into(),
            file,
            position: start,
            script: key,
        })
    }

    /// Reads `ScopeInfo` `si`: the layouts this version may have, the
    /// first whose slots hold what they should.
    fn scope(&self, si: u64) -> Option<Scope> {
        // Enough slots for the header, the inline names and infos of a
        // few locals, and the optional fields after them.
        let head = self.mem.read(self.untag(si), 8 * 8)?;
        let slot0 = u64_at(&head, 8)?;
        // The flags: a small integer (up to 12.x), or a raw uint32 and
        // padding.
        let flags = if slot0 as u32 == 0 {
            slot0 >> 32
        } else {
            slot0 & 0xffff_ffff
        };
        let locals = self.smi(u64_at(&head, 24)?)?;
        if !(0..1 << 20).contains(&locals) {
            return None;
        }
        self.l
            .positions
            .iter()
            .find_map(|&p| self.scope_as(si, flags, locals, p))
    }

    /// [`Reader::scope`] in layout `p`, checked: the function name a
    /// String or zero, the inferred name a String or an oddball, the
    /// positions small integers in order.
    fn scope_as(&self, si: u64, flags: u64, locals: i64, p: Positions) -> Option<Scope> {
        let l = self.l;
        // ScopeFlags, the same bits from 9.x to 13.x.
        let scope_type = flags & 0xf;
        let saved_class_variable = flags >> 10 & 1 == 1;
        let function_variable = flags >> 12 & 3;
        let has_inferred = flags >> 14 & 1 == 1;
        let is_empty_bit = match p {
            // `is_empty`: after has_locals_block_list (9.8–12.x) …
            Positions::Trailing => 29,
            // … after is_hidden (13.x).
            Positions::Fixed => 28,
        };
        let is_empty = flags >> is_empty_bit & 1 == 1;
        let (class, eval, function, module, script) = match p {
            Positions::Trailing => (0, 1, 2, 3, 4),
            Positions::Fixed => (2, 3, 4, 5, 0),
        };
        let slot = |i: i64| self.word(si, 8 + 8 * u64::try_from(i).ok()?);
        // Slots after the map: flags, parameter count, local count.
        let mut i = 3;
        let mut start = None;
        if p == Positions::Fixed {
            start = Some((slot(3)?, slot(4)?));
            i = 5;
        }
        if scope_type == module {
            i += 1;
        }
        i += if l.names_table && locals >= MAX_INLINED_LOCAL_NAMES {
            1
        } else {
            locals
        };
        i += locals;
        if saved_class_variable {
            i += 1;
        }
        let mut name = None;
        if function_variable != 0 {
            name = Some(slot(i)?);
            i += 2;
        }
        let mut inferred = None;
        if has_inferred {
            inferred = Some(slot(i)?);
            i += 1;
        }
        if p == Positions::Trailing
            && (scope_type == function
                || scope_type == script
                || scope_type == eval
                || scope_type == module
                || (scope_type == class && !is_empty))
        {
            start = Some((slot(i)?, slot(i + 1)?));
        }
        if let Some(n) = name
            && n != 0
            && !self.is_string(n)
        {
            return None;
        }
        if let Some(n) = inferred
            && !self.is_string(n)
            && self.itype(n).is_none_or(|t| t < l.first_nonstring)
        {
            return None;
        }
        let start = match start {
            Some((s, e)) => {
                let (s, e) = (self.smi(s)?, self.smi(e)?);
                if !(0..=e).contains(&s) {
                    return None;
                }
                Some(s)
            }
            None => None,
        };
        Some(Scope {
            name,
            inferred,
            start,
        })
    }

    /// String `s`'s text, if it has at most `max` characters.
    fn string(&self, s: u64, max: usize) -> Option<String> {
        let len = self.length(s)?;
        if len > max {
            return None;
        }
        let mut out = Vec::with_capacity(len);
        self.chars(s, 0, len, 0, &mut out)?;
        Some(String::from_utf16_lossy(&out))
    }

    /// String `s`'s length.
    fn length(&self, s: u64) -> Option<usize> {
        let len = self.mem.i32(self.untag(s) + self.l.string_length)?;
        usize::try_from(len).ok()
    }

    /// Appends characters `[from, to)` of string `s` to `out`, as UTF-16:
    /// sequential, cons, thin, sliced and (cached) external strings.
    fn chars(&self, s: u64, from: usize, to: usize, depth: u32, out: &mut Vec<u16>) -> Option<()> {
        let l = self.l;
        if depth > MAX_STRING_DEPTH || from > to {
            return None;
        }
        let ty = self.itype(s).filter(|&t| t < l.first_nonstring)?;
        if to > self.length(s)? {
            return None;
        }
        if from == to {
            return Some(());
        }
        let one_byte = ty & l.encoding_mask == l.one_byte_tag;
        let repr = ty & l.repr_mask;
        if repr == l.seq_tag {
            self.raw_chars(self.untag(s) + l.seq_chars, one_byte, from, to, out)
        } else if repr == l.cons_tag {
            let first = self.word(s, l.cons_first)?;
            let second = self.word(s, l.cons_second)?;
            let split = self.length(first)?;
            if from < split {
                self.chars(first, from, to.min(split), depth + 1, out)?;
            }
            if to > split {
                self.chars(second, from.max(split) - split, to - split, depth + 1, out)?;
            }
            Some(())
        } else if repr == l.thin_tag {
            self.chars(self.word(s, l.thin_actual)?, from, to, depth + 1, out)
        } else if repr == l.sliced_tag {
            let parent = self.word(s, l.sliced_parent)?;
            let off = usize::try_from(self.smi(self.word(s, l.sliced_offset)?)?).ok()?;
            self.chars(parent, from + off, to + off, depth + 1, out)
        } else if repr == l.external_tag && ty & UNCACHED_EXTERNAL == 0 {
            // The resource's data, cached after the resource pointer.
            let data = self.word(s, l.external_resource + 8)?;
            if data == 0 {
                return None;
            }
            self.raw_chars(data, one_byte, from, to, out)
        } else {
            None
        }
    }

    /// Appends characters `[from, to)` of the one- or two-byte characters
    /// at `at`.
    fn raw_chars(
        &self,
        at: u64,
        one_byte: bool,
        from: usize,
        to: usize,
        out: &mut Vec<u16>,
    ) -> Option<()> {
        let n = to - from;
        if one_byte {
            let b = self.mem.read(at + from as u64, n)?;
            out.extend(b.iter().map(|&c| u16::from(c)));
        } else {
            let b = self.mem.read(at + 2 * from as u64, 2 * n)?;
            out.extend(b.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])));
        }
        Some(())
    }

    /// Where the lines of `script` end (the offsets of its `\n`s): its
    /// `line_ends` where V8 has worked them out (for a stack trace, a
    /// debugger), else from its source.
    fn line_ends(&self, script: u64) -> Option<Vec<u32>> {
        self.line_ends_array(script)
            .or_else(|| self.source_line_ends(script))
    }

    /// `script`'s `line_ends`, a FixedArray of small integers, if set.
    fn line_ends_array(&self, script: u64) -> Option<Vec<u32>> {
        let ends = self.word(script, self.l.script_line_ends)?;
        let words = self.words(ends, MAX_LINE_ENDS)?;
        if words.is_empty() {
            return None;
        }
        words
            .into_iter()
            .map(|w| u32::try_from(self.smi(w)?).ok())
            .collect()
    }

    /// Where the lines of `script`'s source end, as V8 works them out
    /// (`String::CalculateLineEnds`): at each line terminator (`\n`, a
    /// `\r` not before a `\n`, U+2028, U+2029), and one past its end.
    fn source_line_ends(&self, script: u64) -> Option<Vec<u32>> {
        let source = self.word(script, self.l.script_source)?;
        if !self.is_string(source) {
            return None;
        }
        let len = self.length(source)?;
        if len > MAX_SOURCE {
            return None;
        }
        let mut text = Vec::with_capacity(len);
        self.chars(source, 0, len, 0, &mut text)?;
        let (lf, cr) = (u16::from(b'\n'), u16::from(b'\r'));
        let mut ends: Vec<u32> = (0..len)
            .filter(|&i| match text[i] {
                c if c == lf || c == 0x2028 || c == 0x2029 => true,
                c if c == cr => text.get(i + 1) != Some(&lf),
                _ => false,
            })
            .map(|i| i as u32)
            .collect();
        ends.push(len as u32);
        Some(ends)
    }
}

/// The 1-based line of character offset `pos`, given where lines end.
fn line_of(ends: &[u32], pos: i64) -> u32 {
    ends.partition_point(|&e| i64::from(e) < pos) as u32 + 1
}

/// The ranges of V8 code the kernel is told of, and which of them hold
/// the embedded builtins.
#[derive(Debug, PartialEq, Eq)]
struct Plan {
    ranges: Vec<V8Range>,
    /// Bit `i`: `ranges[i]` holds the builtins ([`V8Proc::builtins`]).
    builtins: u64,
    /// Ranges found that did not fit.
    left_out: usize,
}

/// Plans the ranges of a process with `maps`, whose V8 is file `key`
/// with its builtins at file offsets `blob`; `None` while it has no JIT
/// code range yet.
///
/// Each isolate (the main thread's, and each worker thread's) reserves
/// a JIT code range and, with short builtin calls, maps the builtins a
/// second time right after it [measured, node 20 with two workers: three
/// code ranges, each followed by its copy]. Where more are found than
/// fit ([`MAX_V8_RANGES`]): the file's own copy first, then each isolate's
/// code range and its copy, highest first (mappings are placed top-down,
/// and the main isolate is made first), then any other copy. Those kept
/// are given sorted by address, as the kernel's binary search needs.
fn plan_ranges(maps: &[Mapping], key: (u64, u64), blob: Option<(u64, u64)>) -> Option<Plan> {
    let mut jits = jit_ranges(maps);
    if jits.is_empty() {
        return None;
    }
    jits.sort_unstable_by_key(|r| std::cmp::Reverse(r.low));
    let mut copies = Vec::new();
    if let Some((low, high)) = blob {
        for m in maps.iter().filter(|m| m.exec && m.file_key() == key) {
            let (from, to) = (low.max(m.offset), high.min(m.offset + (m.end - m.start)));
            if from < to {
                copies.push(V8Range {
                    low: m.start + (from - m.offset),
                    high: m.start + (to - m.offset),
                });
            }
        }
    }
    let found = jits.len() + copies.len();
    // Chosen in order of priority, each marked whether it holds the
    // builtins; given sorted by address.
    let mut kept: Vec<(V8Range, bool)> = Vec::new();
    let add = |kept: &mut Vec<(V8Range, bool)>, r: V8Range, builtins: bool| {
        if kept.len() < MAX_V8_RANGES && !kept.iter().any(|(k, _)| *k == r) {
            kept.push((r, builtins));
        }
    };
    let is_remap = |c: &V8Range| jits.iter().any(|j| j.high == c.low);
    if let Some(own) = copies.iter().find(|c| !is_remap(c)).or(copies.first()) {
        add(&mut kept, *own, true);
    }
    for j in &jits {
        // An isolate's code without its builtins would leave its
        // interpreted frames unnamed: both, or neither.
        let copy = copies.iter().find(|c| c.low == j.high);
        if kept.len() + 1 + usize::from(copy.is_some()) > MAX_V8_RANGES {
            break;
        }
        add(&mut kept, *j, false);
        if let Some(c) = copy {
            add(&mut kept, *c, true);
        }
    }
    for c in &copies {
        add(&mut kept, *c, true);
    }
    kept.sort_unstable_by_key(|(r, _)| r.low);
    Some(Plan {
        ranges: kept.iter().map(|(r, _)| *r).collect(),
        builtins: (kept.iter().enumerate())
            .filter(|(_, (_, builtins))| *builtins)
            .fold(0, |bits, (i, _)| bits | 1 << i),
        left_out: found - kept.len(),
    })
}

/// V8's JIT code: each anonymous executable mapping, with the anonymous
/// mappings right next to it (V8 reserves its code range whole and
/// commits pages within it, so its parts differ in permissions).
fn jit_ranges(maps: &[Mapping]) -> Vec<V8Range> {
    let anon = |m: &Mapping| m.inode == 0 && (m.name.is_empty() || m.name.starts_with("[anon"));
    let mut out: Vec<V8Range> = Vec::new();
    for (i, m) in maps.iter().enumerate() {
        if !anon(m) || !m.exec || out.iter().any(|r| r.low <= m.start && m.end <= r.high) {
            continue;
        }
        let (mut lo, mut hi) = (i, i);
        while lo > 0 && anon(&maps[lo - 1]) && maps[lo - 1].end == maps[lo].start {
            lo -= 1;
        }
        while hi + 1 < maps.len() && anon(&maps[hi + 1]) && maps[hi + 1].start == maps[hi].end {
            hi += 1;
        }
        out.push(V8Range {
            low: maps[lo].start,
            high: maps[hi].end,
        });
    }
    out
}

/// Whether mapped file `path` may hold V8, before its symbols are read:
/// a `node`, a `libnode.so`, a `libv8.so`, or a main program with more
/// than 16 MiB of code (V8 alone has more), so that not every program's
/// symbols are read.
fn may_hold_v8(maps: &[Mapping], path: &str, exe: Option<&std::path::Path>) -> bool {
    let base = path.rsplit('/').next().unwrap_or(path);
    if base.contains("node") || base.contains("libv8") {
        return true;
    }
    if exe.is_none_or(|e| e.as_os_str() != path) {
        return false;
    }
    let code: u64 = maps
        .iter()
        .filter(|m| m.exec && m.path() == Some(path))
        .map(|m| m.end - m.start)
        .sum();
    code > 16 << 20
}

/// The process's command name.
fn comm(pid: u32) -> String {
    crate::kernel::comm_of(pid).unwrap_or_default()
}

fn u64_at(b: &[u8], off: u16) -> Option<u64> {
    let o = usize::from(off);
    Some(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead as _, BufReader};
    use std::process::{Child, Command, Stdio};

    use rtrace_common::v8::V8_JS;

    use super::*;

    /// The fixture: each function's line is what its frame must say.
    const FIXTURE: &str = "'use strict';
function namedWork(n) {
  let s = 0;
  for (let i = 0; i < n; i++) s += i;
  return s;
}
class Greeter {
  greet(x) {
    const suffix = '!';
    return [x].map((y) => 'hi ' + y + suffix)[0];
  }
}
const arrowFn = (a) => a * 2;
const holder = [];
holder.push(function (b) { return b + 1; });
function lazyNever() { return 0; }
const fe = function inner() { return 1; };
function 漢字(x) { return x + 1; }
function many() {
  LETS
  return () => SUM;
}
for (let i = 0; i < 3000; i++) { namedWork(10); new Greeter().greet(i); arrowFn(i); holder[0](i); fe(); 漢字(i); many()(); }
void new Error().stack;
for (const f of [namedWork, Greeter.prototype.greet, arrowFn, holder[0], lazyNever, Greeter, fe, 漢字, many]) %DebugPrint(f);
process.stdout.write('READY\\n');
process.stdin.resume();
";

    /// Name and line of each function `%DebugPrint`ed, in order (the
    /// class's default constructor has no line of its own to check).
    const EXPECTED: [(&str, Option<u32>); 9] = [
        ("namedWork", Some(2)),
        ("greet", Some(8)),
        ("arrowFn", Some(13)),
        (ANONYMOUS, Some(15)),
        ("lazyNever", Some(16)),
        ("Greeter", None),
        ("inner", Some(17)),
        ("漢字", Some(18)),
        ("many", Some(19)),
    ];

    /// Locals of `many`, all captured: more than a `ScopeInfo` keeps
    /// inline, so they are in a hash table.
    const MANY: usize = 80;

    /// A child process, killed when dropped.
    struct Running(Child);

    impl Drop for Running {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    /// The `node` to run: `RTRACE_NODE` (another build: a wrapper that
    /// runs Debian's), else the one on the path.
    fn node() -> String {
        std::env::var("RTRACE_NODE").unwrap_or_else(|_| "node".to_owned())
    }

    fn has_node() -> bool {
        Command::new(node())
            .arg("--version")
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// Runs the fixture; returns the process and, per function, its
    /// `JSFunction` and `SharedFunctionInfo` (tagged), as `%DebugPrint`
    /// printed them.
    fn run_fixture(dir: &std::path::Path) -> (Running, Vec<(u64, u64)>) {
        let script = dir.join("fixture.js");
        let lets: Vec<String> = (0..MANY).map(|i| format!("v{i} = {i}")).collect();
        let sum: Vec<String> = (0..MANY).map(|i| format!("v{i}")).collect();
        let text = FIXTURE
            .replace("LETS", &format!("let {};", lets.join(", ")))
            .replace("SUM", &sum.join(" + "));
        std::fs::write(&script, text).unwrap();
        let mut child = Command::new(node())
            .arg("--allow-natives-syntax")
            .arg(&script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("node runs");
        let out = child.stdout.take().unwrap();
        let running = Running(child);
        let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap();
        let mut found: Vec<(u64, u64)> = Vec::new();
        let mut function = None;
        for line in BufReader::new(out).lines() {
            let line = line.unwrap();
            if line == "READY" {
                break;
            }
            if let Some(rest) = line.strip_prefix("DebugPrint: ") {
                function = rest.split(':').next().map(hex);
            } else if let Some(rest) = line.strip_prefix(" - shared_info: ")
                && let Some(f) = function.take()
            {
                found.push((f, hex(rest.split(' ').next().unwrap())));
            }
        }
        assert_eq!(
            found.len(),
            EXPECTED.len(),
            "the fixture's %DebugPrint output"
        );
        (running, found)
    }

    #[test]
    fn a_node_process_is_found_and_its_functions_named() {
        if !has_node() {
            eprintln!("skipped: no `node` on PATH (install nodejs to run the V8 tests)");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let (running, found) = run_fixture(dir.path());
        let pid = running.0.id();
        let who = Proc::now(pid);
        let mut v8 = V8::default();
        v8.configure(true, false);
        let record = v8.examine(&MapsOnce::new(who), false).expect("node is V8");
        // Given once.
        assert_eq!(v8.examine(&MapsOnce::new(who), false), None);
        eprintln!("{record:?}\n{:?}", v8.summary());
        assert_eq!(v8.summary().len(), 1);
        assert_eq!(
            (record.fp_context, record.fp_function),
            (-8, -16),
            "the frame's slots"
        );
        assert_eq!(
            (record.fp_bytecode_array, record.fp_bytecode_offset),
            (-32, -40)
        );
        assert_eq!(record.smi_shift, 32);
        assert_eq!(
            (record.heap_object_tag, record.heap_object_tag_mask),
            (1, 3)
        );
        assert!(usize::from(record.sfi_read) <= SFI_BYTES);
        assert_ne!(record.sfi_ints_mask, 0);
        assert_eq!(record.salt, who.salt());

        // The ranges: the builtins where the node file is mapped, the JIT
        // code over the rwx mapping.
        let maps = crate::kernel::procmaps::read(Some(pid)).unwrap();
        let n = record.nranges as usize;
        assert!((2..=MAX_V8_RANGES).contains(&n));
        let ranges = &record.ranges[..n];
        assert!(
            ranges.windows(2).all(|w| w[0].high <= w[1].low),
            "sorted, apart (the kernel's binary search): {ranges:x?}"
        );
        // The file's own builtins: the copy not right after a JIT code
        // range.
        let (own, blob) = (0..n)
            .filter(|&i| record.builtins >> i & 1 != 0)
            .map(|i| (i, ranges[i]))
            .find(|(_, r)| !ranges.iter().any(|j| j.high == r.low))
            .expect("the file's builtins are a range");
        let node = maps
            .iter()
            .find(|m| m.exec && m.start <= blob.low && blob.high <= m.end)
            .expect("the builtins lie in a mapping");
        assert!(node.path().is_some(), "the builtins are the file's");
        let remap = maps
            .iter()
            .filter(|m| m.exec && m.file_key() == node.file_key())
            .count();
        for (i, b2) in ranges.iter().enumerate().filter(|(i, _)| *i != own) {
            if record.builtins >> i & 1 != 0 {
                assert_eq!(b2.high - b2.low, blob.high - blob.low, "both copies whole");
                assert!(remap >= 2);
            }
        }
        for m in maps
            .iter()
            .filter(|m| m.exec && m.inode == 0 && m.name.is_empty())
        {
            assert!(
                ranges.iter().any(|r| r.low <= m.start && m.end <= r.high),
                "the JIT mapping {:x}-{:x} is in a range",
                m.start,
                m.end
            );
        }

        let p = v8.procs.get(&who).unwrap();
        let r = Reader::of(p);
        for &(function, sfi) in &found {
            let t = r.itype(function).unwrap();
            assert!(
                (record.first_function_type..=record.last_function_type).contains(&t),
                "function type {t} in the record's range"
            );
            assert_eq!(r.itype(sfi), Some(record.sfi_type));
        }

        let path = dir.path().join("fixture.js");
        let path = path.to_str().unwrap();
        for (&(_, sfi), &(name, line)) in found.iter().zip(&EXPECTED) {
            let addr = sfi - 1;
            let check = v8.check_of(who, addr).expect("a SharedFunctionInfo");
            let f = v8.frames(
                who,
                V8_JS | addr,
                u64::from(check) << 32 | u64::from(NO_OFFSET),
            );
            assert_eq!(f.len(), 1);
            eprintln!("{:?}", f[0]);
            assert_eq!(&*f[0].name, name);
            assert_eq!(f[0].file.as_deref(), Some(path));
            if line.is_some() {
                assert_eq!(f[0].line, line, "{name}'s line");
            } else {
                assert!(f[0].line.is_some(), "{name} has a line");
            }
            assert_eq!(f[0].kind, V8Kind::Compiled);
            let f = v8.frames(who, V8_JS | addr, u64::from(check) << 32 | 7);
            assert_eq!(f[0].kind, V8Kind::Interpreted);
            assert_eq!(&*f[0].name, name);
            // Another check: another function's, or this one moved.
            let f = v8.frames(who, V8_JS | addr, u64::from(check ^ 1) << 32 | 7);
            assert_eq!(&*f[0].name, GONE);
            assert_eq!(f[0].kind, V8Kind::Unknown);
        }
        // The script's line ends as V8 worked them out (for the stack
        // trace the fixture made) are those its source gives.
        let sfi = p_sfi(&v8, who, found[0].1);
        let script = r_script(&v8, who, sfi);
        let p = v8.procs.get(&who).unwrap();
        let r = Reader::of(p);
        let array = r.line_ends_array(script).expect("line_ends set");
        assert_eq!(Some(array), r.source_line_ends(script));

        // Not a SharedFunctionInfo at all.
        let f = v8.frames(who, V8_JS | (found[0].0 - 1), 0);
        assert_eq!(&*f[0].name, GONE);
        assert!(!v8.warnings().is_empty(), "frames left unnamed are told");

        // Looked at again for new code as it exits (a zombie, its
        // mappings gone, not yet reaped): still walked, still told.
        // SAFETY: a signal to our own child, which `running` reaps.
        assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
        let stat = format!("/proc/{pid}/stat");
        let task = format!("/proc/{pid}/task");
        // The leader shows `Z` as soon as it has exited, while node's other
        // threads may not have yet: `procmaps::proc_dir` then reads a live
        // one's mappings, as it should. The process has ended once its
        // other threads are gone from `task` too.
        let zombie = || {
            std::fs::read_to_string(&stat)
                .is_ok_and(|s| s.rsplit(") ").next().is_some_and(|r| r.starts_with('Z')))
                && std::fs::read_dir(&task).is_ok_and(|d| d.count() == 1)
        };
        let began = std::time::Instant::now();
        while !zombie() {
            assert!(began.elapsed().as_secs() < 10, "node did not exit");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(
            matches!(v8.find(&MapsOnce::new(who)), Ok(Look::NotV8)),
            "a zombie's mappings are gone"
        );
        assert_eq!(v8.examine(&MapsOnce::new(who), true), None);
        assert_eq!(v8.summary().len(), 1, "-v still tells of it");
        assert!(v8.procs.contains_key(&who), "its walk is kept");

        v8.forget(who);
        assert!(v8.procs.is_empty());
    }

    /// `sfi` (tagged), checked to be one.
    fn p_sfi(v8: &V8, who: Proc, sfi: u64) -> u64 {
        assert!(v8.check_of(who, sfi - 1).is_some());
        sfi
    }

    /// The script of `sfi` (tagged).
    fn r_script(v8: &V8, who: Proc, sfi: u64) -> u64 {
        let p = v8.procs.get(&who).unwrap();
        let r = Reader::of(p);
        r.word(sfi, u64::from(p.layout.record.sfi_script)).unwrap()
    }

    #[test]
    fn a_process_without_node_is_not_v8() {
        let child = Command::new("sleep").arg("30").spawn().expect("sleep runs");
        let running = Running(child);
        let who = Proc::now(running.0.id());
        let mut v8 = V8::default();
        v8.configure(true, false);
        assert_eq!(v8.examine(&MapsOnce::new(who), false), None);
        assert_eq!(v8.not.get(&who), Some(&None));
        let f = v8.frames(who, V8_JS | 0x1000, 1 << 32);
        assert_eq!(&*f[0].name, GONE);
        // Nor is any process when turned off.
        v8.configure(false, false);
        assert_eq!(v8.examine(&MapsOnce::new(who), true), None);
    }

    #[test]
    fn ranges_are_planned_main_isolate_first_and_given_sorted() {
        // node 20 with two worker threads [measured], sizes shortened.
        let maps: Vec<Mapping> = [
            "00b72000-025fe000 r-xp 00772000 08:01 100 /usr/bin/node",
            "0c92c000-0cc0c000 rw-p 00000000 00:00 0 [heap]",
            "7f8714000000-7f8714003000 rw-p 00000000 00:00 0 ",
            "7f8714003000-7f871403f000 rwxp 00000000 00:00 0 ",
            "7f871403f000-7f8733e40000 ---p 00000000 00:00 0 ",
            "7f8733e40000-7f8733fd2000 r-xp 014c4000 08:01 100 /usr/bin/node",
            "7f873c000000-7f873c003000 rw-p 00000000 00:00 0 ",
            "7f873c003000-7f873c03f000 rwxp 00000000 00:00 0 ",
            "7f873c03f000-7f875be40000 ---p 00000000 00:00 0 ",
            "7f875be40000-7f875bfd2000 r-xp 014c4000 08:01 100 /usr/bin/node",
            "7f8762fc0000-7f8762fc3000 rw-p 00000000 00:00 0 ",
            "7f8762fc3000-7f8762fff000 rwxp 00000000 00:00 0 ",
            "7f8762fff000-7f8782e00000 ---p 00000000 00:00 0 ",
            "7f8782e00000-7f8782f92000 r-xp 014c4000 08:01 100 /usr/bin/node",
            "7f8789eec000-7f8789eee000 r-xp 00000000 00:00 0 [vdso]",
        ]
        .iter()
        .map(|l| Mapping::parse(l).unwrap())
        .collect();
        let key = maps[0].file_key();
        let blob = Some((0x14c4000, 0x14c4000 + 0x191ac0));
        let r = |low, high| V8Range { low, high };
        assert_eq!(
            plan_ranges(&maps, key, blob),
            Some(Plan {
                ranges: vec![
                    r(0x18c4000, 0x18c4000 + 0x191ac0),
                    r(0x7f8714000000, 0x7f8733e40000),
                    r(0x7f8733e40000, 0x7f8733e40000 + 0x191ac0),
                    r(0x7f873c000000, 0x7f875be40000),
                    r(0x7f875be40000, 0x7f875be40000 + 0x191ac0),
                    r(0x7f8762fc0000, 0x7f8782e00000),
                    r(0x7f8782e00000, 0x7f8782e00000 + 0x191ac0),
                ],
                builtins: 0b101_0101,
                left_out: 0,
            })
        );
        // Of more isolates than fit, the highest.
        let isolates = MAX_V8_RANGES as u64 / 2 + 8;
        let base = |i: u64| 0x7f00_0000_0000 + i * 0x1000_0000;
        let mut many: Vec<Mapping> = (0..isolates)
            .flat_map(|i| {
                [
                    format!(
                        "{:x}-{:x} rwxp 00000000 00:00 0 ",
                        base(i),
                        base(i) + 0x3000
                    ),
                    format!(
                        "{:x}-{:x} r-xp 014c4000 08:01 100 /usr/bin/node",
                        base(i) + 0x3000,
                        base(i) + 0x3000 + 0x191ac0
                    ),
                ]
            })
            .chain(["00b72000-025fe000 r-xp 00772000 08:01 100 /usr/bin/node".to_owned()])
            .map(|l| Mapping::parse(&l).unwrap())
            .collect();
        many.sort_by_key(|m| m.start);
        let plan = plan_ranges(&many, key, blob).unwrap();
        assert_eq!(plan.ranges.len(), MAX_V8_RANGES, "{plan:?}");
        assert_eq!(plan.left_out, 2 * isolates as usize + 1 - MAX_V8_RANGES);
        assert!(
            plan.ranges.windows(2).all(|w| w[0].high <= w[1].low),
            "sorted, apart: {plan:?}"
        );
        // The file's, then (one slot being left after the isolates that
        // fit both their code and its builtins) the first copy left out,
        // then the highest isolates, each with its builtins.
        let kept = (MAX_V8_RANGES as u64 - 1) / 2;
        assert_eq!(plan.ranges[0], r(0x18c4000, 0x18c4000 + 0x191ac0));
        assert_eq!(plan.ranges[1].low, base(0) + 0x3000);
        assert_eq!(
            plan.ranges[2].low,
            base(isolates - kept),
            "the highest isolates kept"
        );
        // The builtins: the file's, each isolate's, and that one more
        // copy (an isolate's code with no room left for its builtins is
        // not taken; the builtins alone still name its interpreted frames).
        assert_eq!(plan.builtins.count_ones() as u64, kept + 2, "{plan:?}");
        assert_eq!(plan.builtins & 0b111, 0b011, "{plan:?}");
        // No JIT code range yet: still starting.
        assert_eq!(plan_ranges(&maps[..2], key, blob), None);
    }

    /// The `node` that `PATH` finds, if any.
    fn node_on_path() -> Option<std::path::PathBuf> {
        std::env::var_os("PATH").and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("node"))
                .find(|n| n.is_file())
        })
    }

    #[test]
    fn the_embedded_builtins_get_no_rows_worked_out_from_their_code() {
        // V8's generated code moves its return addresses as compilers
        // never do: `AdaptorWithBuiltinExitFrame` pushes the call's
        // arguments and a copy of its return address, then jumps to
        // `CEntry`. Rows worked out from the code carried the pushes'
        // height along that jump, and the walk took an argument slot for
        // `CEntry`'s caller: the JavaScript function that called a C++
        // builtin was lost. The builtins keep rbp frames; the walk follows
        // them where no row is.
        let Some(path) = node_on_path() else {
            eprintln!("skipped: no `node` on PATH");
            return;
        };
        let data = std::fs::read(&path).unwrap();
        let elf = object::File::parse(&*data).unwrap();
        let Some(found) = builtins_in(&elf, &data) else {
            eprintln!("skipped: {} has no v8dbg metadata", path.display());
            return;
        };
        let table = super::super::cfi::compile(&data).unwrap();
        // Where the symbols say, or, in a stripped build, where the FDEs
        // leave the largest gap.
        let (low, high) = found.unwrap();
        assert!(high - low > 0x10000, "{low:#x}-{high:#x}");
        let ruled: Vec<u64> = (low..high)
            .step_by(61)
            .filter(|&pc| {
                table
                    .lookup(pc)
                    .is_some_and(|r| r.cfa != rtrace_common::unwind::CFA_NONE)
            })
            .collect();
        assert!(
            ruled.is_empty(),
            "{} of the builtins' addresses have rows, the first {:#x?}",
            ruled.len(),
            &ruled[..ruled.len().min(4)]
        );
        // The compiled code elsewhere keeps its rows.
        let text = {
            use object::{Object as _, ObjectSection as _};
            let t = elf.section_by_name(".text").unwrap();
            t.address()..t.address() + t.size()
        };
        let outside: Vec<u64> = text
            .step_by(4093)
            .filter(|pc| !(low..high).contains(pc))
            .collect();
        let with_rows = outside
            .iter()
            .filter(|&&pc| {
                table
                    .lookup(pc)
                    .is_some_and(|r| r.cfa != rtrace_common::unwind::CFA_NONE)
            })
            .count();
        assert!(
            with_rows * 2 > outside.len(),
            "{with_rows} of {} addresses of the compiled code have rows",
            outside.len()
        );
    }

    #[test]
    fn the_builtins_are_the_largest_stretch_of_code_without_cfi() {
        // The fallback for stripped builds, checked against the symbols
        // of a node that has them.
        let Some(path) = node_on_path() else {
            eprintln!("skipped: no `node` on PATH");
            return;
        };
        let f = File::open(&path).unwrap();
        let Some(v8) = read_file(&f) else {
            eprintln!("skipped: {} has no v8dbg metadata", path.display());
            return;
        };
        let data = crate::kernel::memory::Mapped::of(&f).unwrap();
        let elf = object::File::parse(&*data).unwrap();
        let (low, high) = largest_fde_gap(&elf).unwrap();
        let at = crate::kernel::elf::vaddr_to_offset(&elf, low).unwrap();
        let (low, high) = (at, at + (high - low));
        let (blob_low, blob_high) = v8.blob.unwrap();
        eprintln!("symbols {blob_low:#x}-{blob_high:#x}, gap {low:#x}-{high:#x}");
        assert!(low <= blob_low && blob_high <= high);
        assert!(high - low < (blob_high - blob_low) + 0x10000, "little more");
    }

    /// Encodes a source position table as V8's builder does (each entry a
    /// zigzag variable-length delta of its pc offset, negative for an
    /// expression position, then of its position).
    fn encode_positions(entries: &[(u32, u64, bool)]) -> Vec<u8> {
        fn int(out: &mut Vec<u8>, v: i64) {
            let mut z = ((v << 1) ^ (v >> 63)) as u64;
            loop {
                let more = z > 0x7f;
                out.push((z & 0x7f) as u8 | if more { 0x80 } else { 0 });
                z >>= 7;
                if !more {
                    break;
                }
            }
        }
        let (mut out, mut off, mut pos) = (Vec::new(), 0i64, 0i64);
        for &(o, p, statement) in entries {
            let d = i64::from(o) - off;
            int(&mut out, if statement { d } else { -d - 1 });
            int(&mut out, p as i64 - pos);
            (off, pos) = (i64::from(o), p as i64);
        }
        out
    }

    /// A TurboFan code's tables as read from node 20 (a loop in `f` that
    /// calls `leaf`, inlined): pc offsets 143 to 164 are `leaf`'s, at
    /// script offsets 26 and 28, called from script offset 82 of `f`.
    #[test]
    fn inlined_functions_are_expanded_innermost_first() {
        let measured = [
            (1, 0x5a, false),
            (40, 0x90, false),
            (100, 0x90, true),
            (143, 0x8000_0036, false),
            (155, 0x8000_003a, false),
            (165, 0xa6, false),
        ];
        let positions = decode_positions(&encode_positions(&measured)).unwrap();
        assert_eq!(
            positions,
            measured.iter().map(|&(o, p, _)| (o, p)).collect::<Vec<_>>()
        );
        let leaf = 0x2e82_cb1e_2ba1;
        let code = CodeInfo {
            start: 0x7f06_4c00_5b80,
            size: 384,
            sfi: 0x2e82_cb1e_2bf0,
            positions,
            inlining: vec![(0xa6, 0)],
            literals: vec![leaf, 0],
        };
        // A return address right after a call at 150: the call is leaf's.
        assert_eq!(code.at(151), [(leaf, Some(26)), (0, Some(82))]);
        assert_eq!(code.at(160), [(leaf, Some(28)), (0, Some(82))]);
        // f's own code.
        assert_eq!(code.at(120), [(0, Some(71))]);
        assert_eq!(code.at(170), [(0, Some(82))]);
        // Before the first entry: f, at no known place.
        assert_eq!(code.at(1), [(0, None)]);
        // An inlining that is not in the table, or a literal cleared: f
        // alone, never a wrong name.
        let broken = CodeInfo {
            inlining: vec![],
            ..code
        };
        assert_eq!(broken.at(151), [(0, None)]);
        let cleared = CodeInfo {
            inlining: vec![(0xa6, 1)],
            ..broken
        };
        assert_eq!(cleared.at(151), [(0, None)]);
    }

    /// A compiled frame's pc, of which the walk writes the low 32 bits,
    /// is found again in the JIT range that holds it.
    #[test]
    fn a_pc_is_found_from_its_low_half_in_its_range() {
        let jit = [
            V8Range {
                low: 0x7ff3_667c_0000,
                high: 0x7ff3_8660_0000,
            },
            V8Range {
                low: 0x7ff2_fff0_0000,
                high: 0x7ff3_0010_0000,
            },
        ];
        assert_eq!(pcs_in(&jit, 0x7000_1234), [0x7ff3_7000_1234]);
        // A range across a 4 GiB boundary.
        assert_eq!(pcs_in(&jit, 0x0000_0040), [0x7ff3_0000_0040]);
        assert_eq!(pcs_in(&jit, 0xfff8_0000), [0x7ff2_fff8_0000]);
        assert_eq!(pcs_in(&jit, 0x1000_0000), [0u64; 0]);
        // Two isolates' ranges 640 MiB apart, in one 4 GiB stretch: a low
        // half is in one of them alone; ranges 4 GiB apart share it.
        let two = [
            V8Range {
                low: 0x7f87_1400_0000,
                high: 0x7f87_33e4_0000,
            },
            V8Range {
                low: 0x7f87_3c00_0000,
                high: 0x7f87_5be4_0000,
            },
        ];
        assert_eq!(pcs_in(&two, 0x2000_0000), [0x7f87_2000_0000]);
        assert_eq!(
            pcs_in(&two, 0x4000_0000),
            [0x7f87_4000_0000],
            "in the second alone"
        );
        let wide = [
            two[0],
            V8Range {
                low: 0x7f88_1000_0000,
                high: 0x7f88_2fe4_0000,
            },
        ];
        assert_eq!(
            pcs_in(&wide, 0x2000_0000),
            [0x7f87_2000_0000, 0x7f88_2000_0000]
        );
    }

    #[test]
    fn lines_are_counted_from_their_ends() {
        let ends = [5, 10, 20];
        assert_eq!(line_of(&ends, 0), 1);
        assert_eq!(line_of(&ends, 5), 1);
        assert_eq!(line_of(&ends, 6), 2);
        assert_eq!(line_of(&ends, 21), 4);
    }
}

//! How rtrace's kernel side is built, in one place for `userspace/build.rs`
//! (which embeds the objects) and `xtask` (which lints them and installs
//! the toolchain).
//!
//! The eBPF crate needs a nightly compiler (`-Z build-std=core` for
//! `bpfel-unknown-none`) while everything else builds on stable, so it is
//! built by a separate cargo run through rustup. Three things must agree
//! between the two callers, and live here:
//!
//! - **The toolchain**, pinned by date in `ebpf-programs/rust-toolchain.toml`
//!   and read from there ([`channel`]).
//! - **The environment**: the variables a running cargo sets would pin the
//!   nested one to stable and the host target ([`cargo`]).
//! - **The variants**: every object is built once with default features,
//!   and once more for each feature `rtrace_common::variants::VARIANTS`
//!   lists for its bin, `cfg(feature = "F")` giving an object named
//!   `<bin>_F`. User space's loader reads the same table ([`build`]).
//!
//! The objects are embedded without their DWARF ([`strip_debug`]).

use std::{
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    process::Command,
};

/// The eBPF crate's directory under the workspace root.
pub const CRATE_DIR: &str = "ebpf-programs";

/// The pinned nightly toolchain, as `ebpf-programs/rust-toolchain.toml`
/// names it.
pub fn channel(root: &Path) -> Result<String, String> {
    let path = root.join(CRATE_DIR).join("rust-toolchain.toml");
    let text = fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    parse_channel(&text).ok_or_else(|| format!("{}: no channel = \"...\" line", path.display()))
}

fn parse_channel(toml: &str) -> Option<String> {
    toml.lines().find_map(|l| {
        let v = l.trim().strip_prefix("channel")?.trim().strip_prefix('=')?;
        Some(v.trim().trim_matches('"').to_owned())
    })
}

/// Whether an environment variable of the outer build must not reach the
/// nested cargo.
fn scrubbed(key: &str) -> bool {
    // Where cargo keeps its registry and binaries is the same for both.
    (key.starts_with("CARGO") && key != "CARGO_HOME")
        || key.starts_with("RUSTC")
        || key.starts_with("RUSTUP_TOOLCHAIN")
        || matches!(
            key,
            "RUSTFLAGS" | "RUSTDOCFLAGS" | "DEBUG" | "OPT_LEVEL" | "PROFILE" | "TARGET" | "HOST"
        )
}

/// The installed toolchain that provides the pinned `channel`: the
/// toolchain of that name, or else a floating `nightly` whose compiler
/// reports the pinned date (rustup refuses to link a local toolchain under
/// an official dated name, so a machine that cannot download the dated one
/// uses its `nightly` only when it is that very build).
pub fn toolchain(channel: &str) -> Result<String, String> {
    let list = Command::new("rustup")
        .args(["toolchain", "list"])
        .output()
        .map_err(|e| format!("cannot run rustup: {e}"))?;
    let list = String::from_utf8_lossy(&list.stdout);
    let names: Vec<&str> = list
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    let host_suffix = |n: &str| {
        n.strip_prefix(channel)
            .is_some_and(|r| r.is_empty() || r.starts_with('-'))
    };
    if let Some(n) = names.iter().find(|n| host_suffix(n)) {
        return Ok((*n).to_owned());
    }
    let date = channel.strip_prefix("nightly-").unwrap_or("");
    for n in names.iter().filter(|n| n.starts_with("nightly")) {
        let version = Command::new("rustup")
            .args(["run", n, "rustc", "-V"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        if !date.is_empty() && version.contains(date) {
            return Ok((*n).to_owned());
        }
    }
    Err(format!(
        "the pinned toolchain {channel} is not installed; `cargo xtask setup` installs it"
    ))
}

/// Cargo of the pinned toolchain, in the eBPF crate, with the outer
/// build's variables removed.
pub fn cargo(root: &Path) -> Result<Command, String> {
    let toolchain = toolchain(&channel(root)?)?;
    let mut cmd = Command::new("rustup");
    cmd.args(["run", &toolchain, "cargo"])
        .current_dir(root.join(CRATE_DIR));
    for (key, _) in std::env::vars_os() {
        if scrubbed(&key.to_string_lossy()) {
            cmd.env_remove(&key);
        }
    }
    Ok(cmd)
}

/// One built object: its name (`<bin>` or `<bin>_<feature>`) and where
/// its bytes are in its group ([`group_of`], [`GROUP_ORDER`]).
#[derive(Debug, Clone)]
pub struct Object {
    /// The name user space looks it up by.
    pub name: String,
    /// The file in the output directory holding its group, compressed.
    pub path: PathBuf,
    /// Its first byte in the group's decompressed bytes (a multiple of 8).
    pub offset: usize,
    /// Its length in bytes.
    pub len: usize,
}

/// The order of a bin's objects in its group, by variant (`""` for the
/// plain object), the CFI walk's variants aside ([`group_of`]): taking an
/// object out decompresses its group up to the object's end, so what the
/// loaders try first on current kernels comes first (task storage,
/// atomics; then the plain object, which `trace` and `strace`, with
/// neither, load unless asked for stacks), and the per-CPU buffers of
/// kernels before 5.8 last.
pub const GROUP_ORDER: [&str; 4] = [
    rtrace_common::variants::TASK_STORAGE,
    rtrace_common::variants::ATOMICS,
    "",
    rtrace_common::variants::PERF,
];

/// The group a bin's variant is compressed in: each variant that walks by
/// CFI alone (`<bin>_<variant>`), the rest together under the bin's name.
/// The CFI variants are the largest (up to 1.5 MB) and a kernel loads one
/// of the two, the same one every run: in one group, the second would
/// cost every run the first's decoding (5 to 10 ms), for 0.2 MB of binary.
pub fn group_of(bin: &str, variant: &str) -> String {
    if rtrace_common::variants::walks_cfi(variant) {
        format!("{bin}_{variant}")
    } else {
        bin.to_owned()
    }
}

/// An object without its DWARF: the `.debug*` sections, the relocation
/// sections that apply to them, and the symbols they define go; every
/// other section (the programs and their relocations, maps, `.rodata`,
/// `.BTF` and `.BTF.ext` and their relocations) keeps its bytes, type and
/// flags. The symbol table loses the deleted sections' symbols and is
/// renumbered, relocations following; section names, which bpf-linker
/// keeps in `.strtab`, move to a `.shstrtab`. The kernel and aya read BTF,
/// never DWARF, which was four fifths of the objects' bytes.
///
/// A kept relocation that refers to a symbol of a deleted section is an
/// error rather than silently dropped.
///
/// Two changes are made besides: the functions named `rtrace_global_*`
/// are made global in `.BTF` ([`globalize`]), and one that cannot be is
/// an error; and unless `keep_lines`, `.BTF.ext` loses its lines
/// ([`drop_line_info`]) and `.rel.BTF.ext` goes.
pub fn strip_debug(data: &[u8], keep_lines: bool) -> Result<Vec<u8>, String> {
    use object::build::elf::{Builder, SectionData};

    let mut builder = Builder::read(data).map_err(|e| format!("not an ELF object: {e}"))?;
    for section in &mut builder.sections {
        if section.name.starts_with(b".debug") {
            section.delete = true;
        }
    }
    // Relocation sections that apply to a deleted section (`.rel.debug_*`).
    // The table's iterators skip deleted items, so the targets are looked
    // up by id.
    let applying: Vec<_> = builder
        .sections
        .iter()
        .filter(|s| matches!(s.data, SectionData::Relocation(_)))
        .filter(|s| {
            s.sh_info_section
                .is_some_and(|t| builder.sections.get(t).delete)
        })
        .map(|s| s.id())
        .collect();
    for id in applying {
        builder.sections.get_mut(id).delete = true;
    }
    // Symbols defined in deleted sections (their section symbols) go too;
    // nothing kept may refer to them. The symbol table is renumbered, which
    // sections that hold symbol indices as bytes would not follow.
    const SHT_LLVM_ADDRSIG: u32 = 0x6fff_4c03;
    if let Some(s) = builder
        .sections
        .iter()
        .find(|s| matches!(s.sh_type, object::elf::SHT_GROUP | SHT_LLVM_ADDRSIG))
    {
        return Err(format!(
            "{} holds symbol indices, which stripping would leave wrong",
            String::from_utf8_lossy(&s.name)
        ));
    }
    // The line information goes from `.BTF.ext`, and the relocations of
    // its records' instruction offsets (`.rel.BTF.ext`, which aya does not
    // read: the offsets are the sections' own) with it.
    if let Some(ext) = builder
        .sections
        .iter_mut()
        .find(|s| &*s.name == b".BTF.ext")
        .filter(|_| !keep_lines)
    {
        let SectionData::Data(bytes) = &mut ext.data else {
            return Err(".BTF.ext holds no bytes".into());
        };
        *bytes = drop_line_info(bytes)?.into();
        let ext = ext.id();
        let applying: Vec<_> = builder
            .sections
            .iter()
            .filter(|s| {
                matches!(s.data, SectionData::Relocation(_)) && s.sh_info_section == Some(ext)
            })
            .map(|s| s.id())
            .collect();
        for id in applying {
            builder.sections.get_mut(id).delete = true;
        }
    }
    builder.delete_orphan_symbols();
    let defined: Vec<String> = builder
        .symbols
        .iter()
        .filter(|s| s.st_type() == object::elf::STT_FUNC && s.name.starts_with(GLOBAL_PREFIX))
        .map(|s| String::from_utf8_lossy(&s.name).into_owned())
        .collect();
    if let Some(first) = defined.first() {
        let Some(SectionData::Data(bytes)) = builder
            .sections
            .iter_mut()
            .find(|s| &*s.name == b".BTF")
            .map(|s| &mut s.data)
        else {
            return Err(format!(
                "{first}: the object has no .BTF to make it global in"
            ));
        };
        let made = globalize(bytes.to_mut())?;
        if let Some(missed) = defined.iter().find(|d| !made.contains(d)) {
            return Err(format!(
                "{missed}: no BTF function of that name to make global"
            ));
        }
    }
    for section in &builder.sections {
        if let SectionData::Relocation(relocations) = &section.data {
            let orphan = relocations
                .iter()
                .filter_map(|r| r.symbol)
                .find(|&s| builder.symbols.get(s).delete);
            if let Some(symbol) = orphan {
                return Err(format!(
                    "{} relocates against {}, defined in a debug section",
                    String::from_utf8_lossy(&section.name),
                    String::from_utf8_lossy(&builder.symbols.get(symbol).name)
                ));
            }
        }
    }
    // bpf-linker names sections from `.strtab`, which the builder writes as
    // the symbols' table only: the section names get a table of their own.
    if !builder
        .sections
        .iter()
        .any(|s| matches!(s.data, SectionData::SectionString))
    {
        let shstrtab = builder.sections.add();
        shstrtab.name = b".shstrtab"[..].into();
        shstrtab.sh_type = object::elf::SHT_STRTAB;
        shstrtab.sh_addralign = 1;
        shstrtab.data = SectionData::SectionString;
    }
    let mut out = Vec::with_capacity(data.len());
    builder
        .write(&mut out)
        .map_err(|e| format!("cannot write the stripped object: {e}"))?;
    Ok(out)
}

/// `.BTF.ext`'s bytes `ext` without their line information: the
/// functions' records (which the kernel needs for the BTF of each
/// function) and any CO-RE relocations are kept, the lines' records go,
/// and the header says so.
///
/// The lines are half of an object's bytes with their relocations: each
/// instruction's source line, which the kernel checks and keeps, aya
/// parses, and the start decodes from the object's group at every run.
/// They serve the verifier's log alone, where they name the source line
/// of each instruction; a build with [`KEEP_LINES`] set keeps them.
pub fn drop_line_info(ext: &[u8]) -> Result<Vec<u8>, String> {
    let word = |at: usize| -> Result<u32, String> {
        le_u32(ext, at).ok_or_else(|| format!(".BTF.ext ends inside its header, at {at}"))
    };
    if ext.get(..2) != Some(&rtrace_common::btf::MAGIC.to_le_bytes()[..]) {
        return Err(".BTF.ext is not little-endian BTF".into());
    }
    let header = word(4)? as usize;
    if header < 24 {
        return Err(format!(
            ".BTF.ext's header is {header} bytes, fewer than 24"
        ));
    }
    let part = |off_at: usize| -> Result<&[u8], String> {
        if off_at + 8 > header {
            return Ok(&[]);
        }
        let (off, len) = (word(off_at)? as usize, word(off_at + 4)? as usize);
        ext.get(header + off..header + off + len)
            .ok_or_else(|| format!(".BTF.ext's part at {off} of {len} bytes runs past its end"))
    };
    // The header's pairs of offset and length: functions, lines, CO-RE.
    let (funcs, lines, relos) = (part(8)?, part(16)?, part(24)?);
    if lines.is_empty() {
        return Ok(ext.to_vec());
    }
    let mut out = ext[..header].to_vec();
    let mut set = |at: usize, value: usize| {
        if at + 4 <= header {
            out[at..at + 4].copy_from_slice(&(value as u32).to_le_bytes());
        }
    };
    set(8, 0);
    set(12, funcs.len());
    set(16, funcs.len());
    set(20, 0);
    set(24, funcs.len());
    set(28, relos.len());
    out.extend_from_slice(funcs);
    out.extend_from_slice(relos);
    Ok(out)
}

/// The little-endian `u32` at byte `at` of `bytes`, if they hold it.
fn le_u32(bytes: &[u8], at: usize) -> Option<u32> {
    bytes
        .get(at..at.checked_add(4)?)
        .map(|w| u32::from_le_bytes(w.try_into().expect("four bytes")))
}

/// The variable whose presence at the build keeps the objects' lines
/// ([`drop_line_info`]), for verifier logs with source lines.
pub const KEEP_LINES: &str = "RTRACE_EBPF_LINES";

/// The prefix of the functions [`globalize`] makes global.
pub const GLOBAL_PREFIX: &[u8] = b"rtrace_global_";

/// Gives the BTF functions whose names start with [`GLOBAL_PREFIX`]
/// global linkage, in the `.BTF` section's bytes `btf`, and returns
/// their names.
///
/// bpf-linker gives every function but the programs static linkage, and
/// the kernel verifies a static function again at each call, in the
/// state the caller reached it in: a call after a loop whose callback can
/// end several ways is verified once for each. A global function is
/// verified once, on its own, with its arguments as unknown numbers; the
/// work after the CFI walk, made one, took profile's verification from
/// 570k instructions to a fraction (`docs/benchmarks.md`).
pub fn globalize(btf: &mut [u8]) -> Result<Vec<String>, String> {
    use rtrace_common::btf::{
        FUNC_GLOBAL, KIND_FUNC, KIND_MAX, MAGIC, TYPE_HEADER_BYTES, extra_len,
    };
    let word = |b: &[u8], at: usize| -> Result<u32, String> {
        le_u32(b, at).ok_or_else(|| format!(".BTF ends inside its header or types, at {at}"))
    };
    if btf.get(..2) != Some(&MAGIC.to_le_bytes()[..]) {
        return Err(".BTF is not little-endian BTF".into());
    }
    let header = word(btf, 4)? as usize;
    let (types, types_len) = (header + word(btf, 8)? as usize, word(btf, 12)? as usize);
    let strings = header + word(btf, 16)? as usize;
    let strings_len = word(btf, 20)? as usize;
    let name = |b: &[u8], off: u32| -> Vec<u8> {
        let from = strings + off as usize;
        let end = (strings + strings_len).min(b.len());
        let rest = b.get(from..end).unwrap_or_default();
        rest[..rest.iter().position(|&c| c == 0).unwrap_or(rest.len())].to_vec()
    };
    let mut made = Vec::new();
    let mut at = types;
    while at < types + types_len {
        let info = word(btf, at + 4)?;
        let (kind, vlen) = ((info >> 24) & 0x1f, info & 0xffff);
        if kind == 0 || kind > KIND_MAX {
            return Err(format!(".BTF has a type of unknown kind {kind} at {at}"));
        }
        if kind == KIND_FUNC {
            let n = name(btf, word(btf, at)?);
            if n.starts_with(GLOBAL_PREFIX) {
                made.push(String::from_utf8_lossy(&n).into_owned());
                // The linkage is the vlen field, the info word's low 16 bits.
                let global = (info & !0xffff) | FUNC_GLOBAL;
                btf[at + 4..at + 8].copy_from_slice(&global.to_le_bytes());
            }
        }
        at += TYPE_HEADER_BYTES + extra_len(kind, vlen as usize);
    }
    Ok(made)
}

/// A group's objects ([`group_of`]), each at an 8-aligned offset,
/// compressed as one zstd frame at level 19. The variants of one program
/// share most of their code, which a frame this large (its window holds
/// the whole group) sees once; each object alone, deflated, was 1.9 MB of
/// the binary in all, and so grouped it is 1.1. Returns the frame and
/// each object's offset.
pub fn compress_group(objects: &[&[u8]]) -> Result<(Vec<u8>, Vec<usize>), String> {
    let offsets = group_offsets(objects);
    let mut whole = Vec::new();
    for (o, at) in objects.iter().zip(&offsets) {
        whole.resize(*at, 0);
        whole.extend_from_slice(o);
    }
    let frame = zstd::bulk::compress(&whole, GROUP_LEVEL)
        .map_err(|e| format!("cannot compress the objects: {e}"))?;
    Ok((frame, offsets))
}

/// The zstd level of [`compress_group`].
const GROUP_LEVEL: i32 = 19;

/// Where each object starts in its group: one after another, each at the
/// next multiple of 8.
fn group_offsets(objects: &[&[u8]]) -> Vec<usize> {
    let mut end: usize = 0;
    objects
        .iter()
        .map(|o| {
            let at = end.next_multiple_of(8);
            end = at + o.len();
            at
        })
        .collect()
}

/// [`compress_group`], kept in `dir` by a hash of the objects: lints,
/// build, tests and the static build each run the build script, and
/// compressing every group takes about five seconds; an unchanged group is
/// read back instead. An older frame of the same group kept there goes.
fn compress_group_kept(
    dir: &Path,
    group: &str,
    objects: &[&[u8]],
) -> Result<(Vec<u8>, Vec<usize>), String> {
    use std::hash::{Hash as _, Hasher as _};
    let mut hasher = std::hash::DefaultHasher::new();
    // The layout too: a frame kept by an older build of this file must
    // not be read back with offsets this one computes differently.
    GROUP_LEVEL.hash(&mut hasher);
    group_offsets(objects).hash(&mut hasher);
    objects.hash(&mut hasher);
    let name = format!("{group}-{:016x}.zst", hasher.finish());
    let kept = dir.join(&name);
    if let Ok(frame) = fs::read(&kept) {
        return Ok((frame, group_offsets(objects)));
    }
    let (frame, offsets) = compress_group(objects)?;
    // Keeping is only a saving: a directory that cannot be written to
    // leaves the build as it was.
    if fs::create_dir_all(dir).is_ok() {
        for old in fs::read_dir(dir).into_iter().flatten().flatten() {
            let n = old.file_name().to_string_lossy().into_owned();
            if n.strip_prefix(group)
                .and_then(|r| r.strip_prefix('-'))
                .is_some_and(|r| r.len() == 20 && r.ends_with(".zst"))
            {
                let _ = fs::remove_file(old.path());
            }
        }
        // Written whole then renamed: a build killed mid-write leaves no
        // cut frame to be read back.
        let part = dir.join(format!("{name}.part{}", std::process::id()));
        if fs::write(&part, &frame).is_ok() && fs::rename(&part, &kept).is_err() {
            let _ = fs::remove_file(&part);
        }
    }
    Ok((frame, offsets))
}

/// Builds every object and its variants into `target_dir`, and writes to
/// `out_dir` the objects without their DWARF ([`strip_debug`]), each
/// group ([`group_of`]) compressed together ([`compress_group`]) as
/// `<group>.zst`, and `out_dir/objects.rs`: the tables `GROUPS` of
/// `(group, compressed bytes)` and `OBJECTS` of `(name, group's index,
/// offset, length)`, for `include!`.
pub fn build(root: &Path, target_dir: &Path, out_dir: &Path) -> Result<Vec<Object>, String> {
    let bins_dir = root.join(CRATE_DIR).join("src").join("bin");
    let mut bins: Vec<(String, Vec<String>)> = Vec::new();
    let entries = fs::read_dir(&bins_dir).map_err(|e| format!("{}: {e}", bins_dir.display()))?;
    for entry in entries {
        let path = entry.map_err(|e| e.to_string())?.path();
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let name = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let features = rtrace_common::variants::of(&name)
            .iter()
            .map(|f| (*f).to_owned())
            .collect();
        bins.push((name, features));
    }
    bins.sort();
    if let Some((bin, _)) = rtrace_common::variants::VARIANTS
        .iter()
        .find(|(b, _)| !bins.iter().any(|(n, _)| n == b))
    {
        return Err(format!(
            "rtrace_common::variants::VARIANTS lists {bin}, which is not in {}",
            bins_dir.display()
        ));
    }

    // One target directory for every pass: the core library is built once,
    // and each pass only relinks the objects its feature changes.
    let built = target_dir.join("bpfel-unknown-none").join("release");
    let mut passes: Vec<(Option<String>, Vec<&str>)> = vec![(None, Vec::new())];
    for (bin, features) in &bins {
        for f in features {
            match passes.iter_mut().find(|(pf, _)| pf.as_deref() == Some(f)) {
                Some((_, list)) => list.push(bin),
                None => passes.push((Some(f.clone()), vec![bin])),
            }
        }
    }
    // Source lines in the verifier's logs, for whoever debugs a refusal
    // (`userspace/build.rs` rebuilds when it changes).
    let keep_lines = std::env::var_os(KEEP_LINES).is_some();
    // (bin, variant, bytes): each pass relinks into the same directory.
    let mut stripped: Vec<(String, String, Vec<u8>)> = Vec::new();
    for (feature, only) in &passes {
        let mut cmd = cargo(root)?;
        cmd.args(["build", "--release", "--target-dir"])
            .arg(target_dir);
        if let Some(f) = feature {
            cmd.args(["--features", f]);
            for bin in only {
                cmd.args(["--bin", bin]);
            }
        } else {
            cmd.arg("--bins");
        }
        let status = cmd
            .status()
            .map_err(|e| format!("cannot run rustup to build the eBPF programs: {e}"))?;
        if !status.success() {
            return Err(format!(
                "building the eBPF programs{} failed",
                feature
                    .as_ref()
                    .map(|f| format!(" with feature {f}"))
                    .unwrap_or_default()
            ));
        }
        let names: Vec<&str> = match feature {
            Some(_) => only.clone(),
            None => bins.iter().map(|(b, _)| b.as_str()).collect(),
        };
        for bin in names {
            let from = built.join(bin);
            let data = fs::read(&from)
                .map_err(|e| format!("eBPF object {bin} missing after the build: {e}"))?;
            let bytes =
                strip_debug(&data, keep_lines).map_err(|e| format!("{}: {e}", from.display()))?;
            stripped.push((bin.to_owned(), feature.clone().unwrap_or_default(), bytes));
        }
    }
    let rank = |variant: &str| {
        (rtrace_common::variants::walks_cfi(variant))
            .then_some(0)
            .or_else(|| GROUP_ORDER.iter().position(|v| *v == variant))
    };
    if let Some((bin, variant, _)) = stripped.iter().find(|(_, v, _)| rank(v).is_none()) {
        return Err(format!(
            "variant {variant} of {bin} has no place in ebpf_build::GROUP_ORDER"
        ));
    }
    stripped.sort_by_key(|(bin, variant, _)| (group_of(bin, variant), rank(variant)));
    let mut groups = String::from(
        "/// Each group of objects (`ebpf_build::group_of`), by name, compressed\n\
         /// together as one zstd frame (`ebpf_build::compress_group`).\n\
         pub static GROUPS: &[(&str, &[u8])] = &[\n",
    );
    let mut objects = Vec::new();
    let chunks = stripped.chunk_by(|a, b| group_of(&a.0, &a.1) == group_of(&b.0, &b.1));
    for (i, group) in chunks.enumerate() {
        let bin = &group[0].0;
        let name = group_of(bin, &group[0].1);
        let bytes: Vec<&[u8]> = group.iter().map(|(_, _, b)| b.as_slice()).collect();
        let (frame, offsets) = compress_group_kept(&target_dir.join("compressed"), &name, &bytes)?;
        let path = out_dir.join(format!("{name}.zst"));
        fs::write(&path, frame).map_err(|e| format!("{}: {e}", path.display()))?;
        let _ = writeln!(
            groups,
            "    ({name:?}, include_bytes!({:?})),",
            path.display().to_string()
        );
        for ((_, variant, b), offset) in group.iter().zip(offsets) {
            objects.push((
                i,
                Object {
                    name: if variant.is_empty() {
                        bin.clone()
                    } else {
                        format!("{bin}_{variant}")
                    },
                    path: path.clone(),
                    offset,
                    len: b.len(),
                },
            ));
        }
    }
    groups.push_str("];\n");
    objects.sort_by(|a, b| a.1.name.cmp(&b.1.name));
    let mut table = groups;
    table.push_str(
        "/// Every eBPF object, by name (`<bin>`, or `<bin>_<feature>` for a\n\
         /// variant): its group's index in `GROUPS`, and its offset and length\n\
         /// in the group's decompressed bytes.\n\
         pub static OBJECTS: &[(&str, usize, usize, usize)] = &[\n",
    );
    for (group, o) in &objects {
        let _ = writeln!(
            table,
            "    ({:?}, {group}, {}, {}),",
            o.name, o.offset, o.len
        );
    }
    table.push_str("];\n");
    fs::write(out_dir.join("objects.rs"), table).map_err(|e| format!("objects.rs: {e}"))?;
    Ok(objects.into_iter().map(|(_, o)| o).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The features whose code a bin's source takes in, as far as its text
    /// tells: `cfg(feature = "F")` in the bin itself, and the library's
    /// macros that hold a feature's code.
    fn features_in(source: &str) -> Vec<&str> {
        let mut out: Vec<&str> = source
            .split("feature = \"")
            .skip(1)
            .filter_map(|rest| rest.split('"').next())
            .collect();
        for (call, feature) in [
            ("event_map!(", rtrace_common::variants::PERF),
            ("cfi_programs!(", rtrace_common::variants::CFI),
            ("cfi_programs!(", rtrace_common::variants::CFI_GLOBAL),
            ("in_flight!(", rtrace_common::variants::TASK_STORAGE),
        ] {
            if source.contains(call) {
                out.push(feature);
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }

    /// The table, not the sources, decides what is built; this catches a
    /// bin that took in a feature's code without its row being updated
    /// (its variant would never be built, and the loader would find no
    /// object), or a row left behind.
    #[test]
    fn the_variants_table_matches_the_features_the_sources_test() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let bins = root.join(CRATE_DIR).join("src").join("bin");
        let manifest = fs::read_to_string(root.join(CRATE_DIR).join("Cargo.toml")).unwrap();
        let mut seen = 0;
        for entry in fs::read_dir(&bins).unwrap() {
            let path = entry.unwrap().path();
            let bin = path.file_stem().unwrap().to_string_lossy().into_owned();
            let source = fs::read_to_string(&path).unwrap();
            let mut listed = rtrace_common::variants::of(&bin).to_vec();
            listed.sort_unstable();
            assert_eq!(listed, features_in(&source), "{bin}");
            seen += usize::from(!listed.is_empty());
        }
        assert_eq!(seen, rtrace_common::variants::VARIANTS.len());
        for (_, features) in rtrace_common::variants::VARIANTS {
            for f in *features {
                assert!(manifest.contains(&format!("\n{f} = [")), "feature {f}");
            }
        }
        assert!(features_in("fn main() {}").is_empty());
    }

    #[test]
    fn channel_is_read_from_the_toolchain_file() {
        let toml = "[toolchain]\nchannel = \"nightly-2026-05-19\"\ncomponents = [\"rust-src\"]\n";
        assert_eq!(parse_channel(toml).as_deref(), Some("nightly-2026-05-19"));
        assert_eq!(parse_channel("[toolchain]\n"), None);
    }

    /// A group gives back each object whole at its offset, every offset
    /// 8-aligned whatever the lengths before it, and repeated objects
    /// cost little more than one.
    #[test]
    fn a_group_holds_each_object_at_an_aligned_offset() {
        let a: Vec<u8> = (0..5000u32).map(|i| (i * 7 % 251) as u8).collect();
        let b = vec![9u8; 13];
        let objects: [&[u8]; 4] = [&a, &b, &a, &[]];
        let (frame, offsets) = compress_group(&objects).unwrap();
        let whole = zstd::bulk::decompress(&frame, 1 << 20).unwrap();
        assert_eq!(offsets, [0, 5000, 5016, 10016]);
        for (o, at) in objects.iter().zip(&offsets) {
            assert_eq!(at % 8, 0);
            assert_eq!(&whole[*at..at + o.len()], *o);
        }
        let alone = compress_group(&[&a]).unwrap().0;
        assert!(
            frame.len() < alone.len() + 100,
            "{} against {}",
            frame.len(),
            alone.len()
        );
    }

    /// A group kept is read back as it was made, and a changed group of
    /// the same bin takes the place of the old one, beside other bins'.
    #[test]
    fn a_kept_group_is_reused_until_it_changes() {
        let dir = std::env::temp_dir().join(format!("rtrace-kept-{}", std::process::id()));
        let (a, b) = (vec![1u8; 100], vec![2u8; 50]);
        let made = compress_group_kept(&dir, "tr", &[&a, &b]).unwrap();
        compress_group_kept(&dir, "trace", &[&a]).unwrap();
        assert_eq!(compress_group_kept(&dir, "tr", &[&a, &b]).unwrap(), made);
        let files = || {
            let mut n: Vec<String> = fs::read_dir(&dir)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            n.sort();
            n
        };
        let before = files();
        assert_eq!(before.len(), 2);
        let changed = compress_group_kept(&dir, "tr", &[&b, &a]).unwrap();
        assert_eq!(changed.1, [0, 56]);
        let after = files();
        assert_eq!(after.len(), 2);
        assert_ne!(after, before);
        assert!(after.iter().any(|n| n.starts_with("trace-")));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn outer_cargo_variables_are_scrubbed() {
        for k in [
            "CARGO_TARGET_DIR",
            "RUSTC_WRAPPER",
            "RUSTUP_TOOLCHAIN",
            "TARGET",
            "RUSTFLAGS",
        ] {
            assert!(scrubbed(k), "{k}");
        }
        for k in ["PATH", "HOME", "RUSTUP_HOME", "CARGO_HOME"] {
            assert!(!scrubbed(k), "{k}");
        }
    }

    /// A BPF object as bpf-linker leaves one, in small: code with a
    /// relocation, DWARF with relocations into the code and a symbol of
    /// its own, and BTF.
    fn object_with_dwarf(code_relocates_against_dwarf: bool) -> Vec<u8> {
        use object::write::{Object, Relocation, Symbol, SymbolSection};
        use object::{
            Architecture, BinaryFormat, Endianness, RelocationFlags, SectionKind, SymbolFlags,
            SymbolKind, SymbolScope, elf::R_BPF_64_64,
        };

        let mut obj = Object::new(BinaryFormat::Elf, Architecture::Bpf, Endianness::Little);
        let symbol = |name: &str, section, kind| Symbol {
            name: name.as_bytes().to_vec(),
            value: 0,
            size: 8,
            kind,
            scope: SymbolScope::Compilation,
            weak: false,
            section: SymbolSection::Section(section),
            flags: SymbolFlags::None,
        };
        let reloc = |offset, symbol| Relocation {
            offset,
            symbol,
            addend: 0,
            flags: RelocationFlags::Elf {
                r_type: R_BPF_64_64,
            },
        };
        let text = obj.add_section(Vec::new(), b".text".to_vec(), SectionKind::Text);
        obj.append_section_data(text, &[0x95; 16], 8);
        let func = obj.add_symbol(symbol("func", text, SymbolKind::Text));
        let rodata = obj.add_section(Vec::new(), b".rodata".to_vec(), SectionKind::ReadOnlyData);
        obj.append_section_data(rodata, b"constant", 8);
        let constant = obj.add_symbol(symbol("constant", rodata, SymbolKind::Data));
        let info = obj.add_section(Vec::new(), b".debug_info".to_vec(), SectionKind::Debug);
        obj.append_section_data(info, &[0; 32], 1);
        let label = obj.add_symbol(symbol("debug_label", info, SymbolKind::Data));
        obj.add_relocation(info, reloc(0, func)).unwrap();
        obj.add_relocation(info, reloc(8, label)).unwrap();
        let btf = obj.add_section(Vec::new(), b".BTF".to_vec(), SectionKind::Metadata);
        obj.append_section_data(btf, b"\x9f\xeb\x01\x00btf", 4);
        let ext = obj.add_section(Vec::new(), b".BTF.ext".to_vec(), SectionKind::Metadata);
        obj.append_section_data(ext, &btf_ext(), 4);
        obj.add_relocation(ext, reloc(32 + 8, func)).unwrap();
        obj.add_relocation(ext, reloc(32 + 12 + 8, func)).unwrap();
        let target = if code_relocates_against_dwarf {
            label
        } else {
            constant
        };
        obj.add_relocation(text, reloc(0, target)).unwrap();
        obj.write().unwrap()
    }

    #[test]
    fn dwarf_is_stripped_and_the_rest_kept() {
        use object::{Object as _, ObjectSection as _, ObjectSymbol as _};

        let data = object_with_dwarf(false);
        let before = object::File::parse(&*data).unwrap();
        assert!(before.section_by_name(".debug_info").is_some());
        assert!(before.sections().any(|s| {
            s.name()
                .is_ok_and(|n| n.starts_with(".rel") && n.contains("debug"))
        }));

        let stripped = strip_debug(&data, false).unwrap();
        let after = object::File::parse(&*stripped).unwrap();
        let names: Vec<&str> = after.sections().filter_map(|s| s.name().ok()).collect();
        assert!(
            !names
                .iter()
                .any(|n| n.starts_with(".debug") || (n.starts_with(".rel") && n.contains(".debug"))),
            "{names:?}"
        );
        assert!(
            !names
                .iter()
                .any(|n| n.starts_with(".rel") && n.contains("BTF")),
            "{names:?}"
        );
        let ext = after.section_by_name(".BTF.ext").unwrap();
        assert_eq!(ext.data().unwrap(), drop_line_info(&btf_ext()).unwrap());
        for kept in [".text", ".rodata", ".BTF"] {
            let was = before.section_by_name(kept).unwrap();
            let is = after.section_by_name(kept).unwrap();
            assert_eq!(is.data().unwrap(), was.data().unwrap(), "{kept}");
            assert_eq!(is.kind(), was.kind(), "{kept}");
        }
        // The code's relocation still names its symbol.
        let text = after.section_by_name(".text").unwrap();
        let relocations: Vec<_> = text.relocations().collect();
        assert_eq!(relocations.len(), 1);
        let object::RelocationTarget::Symbol(id) = relocations[0].1.target() else {
            panic!("{relocations:?}");
        };
        assert_eq!(after.symbol_by_index(id).unwrap().name(), Ok("constant"));
        let symbols: Vec<&str> = after.symbols().filter_map(|s| s.name().ok()).collect();
        assert!(symbols.contains(&"func"), "{symbols:?}");
        assert!(!symbols.contains(&"debug_label"), "{symbols:?}");
        assert!(stripped.len() < data.len());
    }

    /// A `.BTF.ext` of a 32-byte header, then 12 bytes of functions'
    /// records, 20 of lines' and 8 of CO-RE relocations', each byte its
    /// part's number.
    fn btf_ext() -> Vec<u8> {
        let mut ext = rtrace_common::btf::MAGIC.to_le_bytes().to_vec();
        ext.extend([1, 0]);
        for w in [32u32, 0, 12, 12, 20, 32, 8] {
            ext.extend(w.to_le_bytes());
        }
        ext.extend([1; 12]);
        ext.extend([2; 20]);
        ext.extend([3; 8]);
        ext
    }

    #[test]
    fn line_information_goes_and_the_functions_and_relocations_stay() {
        let ext = btf_ext();
        let out = drop_line_info(&ext).unwrap();
        let word = |at: usize| u32::from_le_bytes(out[at..at + 4].try_into().unwrap());
        assert_eq!(out[..8], ext[..8]);
        // Functions at 0 (12 bytes), no lines, CO-RE after the functions.
        assert_eq!(
            [word(8), word(12), word(16), word(20), word(24), word(28)],
            [0, 12, 12, 0, 12, 8]
        );
        assert_eq!(out[32..], [[1u8; 12].as_slice(), &[3; 8]].concat());
        // A header of 24 bytes (no CO-RE) and an older one's parts.
        let mut short = ext[..24].to_vec();
        short[4..8].copy_from_slice(&24u32.to_le_bytes());
        short.extend([1; 12]);
        short.extend([2; 20]);
        let out = drop_line_info(&short).unwrap();
        assert_eq!(out.len(), 24 + 12);
        assert_eq!(u32::from_le_bytes(out[20..24].try_into().unwrap()), 0);
        // A part past the end, and no BTF, are errors.
        let mut long = ext.clone();
        long[20..24].copy_from_slice(&200u32.to_le_bytes());
        assert!(drop_line_info(&long).is_err());
        assert!(drop_line_info(b"\0\0\0\0").is_err());
    }

    /// BTF of a `u64`, a prototype taking one, and `funcs` of that
    /// prototype, all static.
    fn btf_with(funcs: &[&str]) -> Vec<u8> {
        let mut strings = b"\0u64\0a\0".to_vec();
        let mut types = Vec::new();
        let mut ty = |name: u32, kind: u32, vlen: u32, size_or_type: u32, extra: &[u32]| {
            for w in [name, (kind << 24) | vlen, size_or_type]
                .iter()
                .chain(extra)
            {
                types.extend_from_slice(&w.to_le_bytes());
            }
        };
        ty(1, 1, 0, 8, &[64]); // INT u64, 64 bits
        ty(0, 13, 1, 1, &[5, 1]); // FUNC_PROTO u64 (a: u64)
        for f in funcs {
            let name = strings.len() as u32;
            strings.extend_from_slice(f.as_bytes());
            strings.push(0);
            ty(name, 12, 0, 2, &[]);
        }
        let mut btf = rtrace_common::btf::header(types.len() as u32, strings.len() as u32).to_vec();
        btf.extend(types);
        btf.extend(strings);
        btf
    }

    /// The linkage of each FUNC in `btf_with`'s types, in order.
    fn linkages(btf: &[u8]) -> Vec<u32> {
        // Two types of 16 and 20 bytes, then the functions' 12 each.
        let funcs = 24 + 16 + 20;
        let types_end = 24 + u32::from_le_bytes(btf[12..16].try_into().unwrap()) as usize;
        (funcs..types_end)
            .step_by(12)
            .map(|at| u32::from_le_bytes(btf[at + 4..at + 8].try_into().unwrap()) & 0xffff)
            .collect()
    }

    #[test]
    fn only_functions_named_rtrace_global_become_global() {
        let mut btf = btf_with(&["store_segment", "rtrace_global_walk", "frame"]);
        let before = btf.clone();
        assert_eq!(linkages(&btf), [0, 0, 0]);
        let made = globalize(&mut btf).unwrap();
        assert_eq!(made, ["rtrace_global_walk"]);
        assert_eq!(linkages(&btf), [0, 1, 0]);
        // Nothing else moved.
        let changed: Vec<usize> = (0..btf.len()).filter(|&i| btf[i] != before[i]).collect();
        assert_eq!(changed.len(), 1, "{changed:?}");
        assert!(globalize(&mut btf_with(&["frame"])).unwrap().is_empty());
    }

    #[test]
    fn btf_that_cannot_be_walked_is_an_error() {
        let mut btf = btf_with(&["rtrace_global_walk"]);
        // The prototype's kind, made one the kernel does not have.
        btf[24 + 16 + 7] = 30;
        let err = globalize(&mut btf).unwrap_err();
        assert!(err.contains("unknown kind 30"), "{err}");
        let mut short = btf_with(&["rtrace_global_walk"]);
        short.truncate(30);
        assert!(globalize(&mut short).is_err());
        assert!(globalize(&mut [0u8; 4]).is_err());
    }

    #[test]
    fn code_that_refers_to_dwarf_is_not_silently_changed() {
        let err = strip_debug(&object_with_dwarf(true), false).unwrap_err();
        assert!(err.contains("debug_label"), "{err}");
        assert!(strip_debug(b"not an object", false).is_err());
    }
}

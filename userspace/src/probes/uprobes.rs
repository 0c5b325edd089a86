//! Finding the file a uprobe goes into, and attaching uprobes: shared by
//! gethostlatency and argdist.
//!
//! A uprobe sits on a file's inode, so the file must be the one the traced
//! processes really map. With a pid, it is looked up in that process's own
//! mappings and mount namespace (`/proc/PID/root`), which finds a
//! container's libc rather than the host's.

use std::{
    collections::HashMap,
    num::NonZeroU32,
    path::{Path, PathBuf},
};

use anyhow::Context as _;
use aya::{
    Ebpf,
    programs::{UProbe, uprobe::UProbeScope},
};

/// Directories searched for a library by name, in the loader's order.
const LIB_DIRS: [&str; 7] = [
    "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
    "/lib64",
    "/usr/lib64",
    "/lib",
    "/usr/lib",
    "/usr/local/lib",
];

/// A uprobe target that names no file.
#[derive(Debug, thiserror::Error)]
#[error("{looked}")]
pub struct NotFound {
    target: String,
    looked: String,
}

/// The file that `target` names, as bcc's argdist and trace take it: a
/// path; a library, bare (`c`) or with its prefix (`libc`); or an
/// executable on `PATH`. With `pid`, in that process's view.
pub fn resolve(target: &str, pid: Option<u32>) -> Result<PathBuf, NotFound> {
    // One look for the process's directory, for its root and its maps.
    let dir = pid.map(crate::kernel::procmaps::proc_dir);
    let root = match &dir {
        // The file's path outlives the look: the kernel opens it when
        // the probe is attached.
        Some(d) => PathBuf::from(format!("{}/root", d.numbered())),
        None => PathBuf::from("/"),
    };
    let not_found = |looked: String| NotFound {
        target: target.to_owned(),
        looked,
    };
    if target.contains('/') {
        let path = root.join(target.trim_start_matches('/'));
        return match std::fs::metadata(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Err(not_found(format!("no such file: {}", path.display())))
            }
            Err(e) => Err(not_found(format!("cannot read {}: {e}", path.display()))),
            Ok(m) if m.is_dir() => Err(not_found(format!("{} is a directory", path.display()))),
            Ok(_) if is_elf(&path) => Ok(path),
            Ok(_) => Err(not_found(format!("{} is not an ELF file", path.display()))),
        };
    }
    let lib = if target.starts_with("lib") {
        target.to_owned()
    } else {
        format!("lib{target}")
    };
    if let Some(d) = &dir {
        let maps = crate::kernel::procmaps::read_in(d)
            .map_err(|e| not_found(format!("cannot read {}/maps: {e}", d.numbered())))?;
        if let Some(path) = maps
            .iter()
            .filter_map(crate::kernel::procmaps::Mapping::path)
            .find(|path| names_library(path, &lib) || file_name(path) == target)
        {
            return Ok(root.join(path.trim_start_matches('/')));
        }
    }
    for dir in LIB_DIRS {
        let dir = root.join(dir.trim_start_matches('/'));
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        // `libc.so.6` beats `libc.so`, which may be a linker script.
        let mut found: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| names_library(&p.to_string_lossy(), &lib) && is_elf(p))
            .collect();
        found.sort_by_key(|p| std::cmp::Reverse(p.to_string_lossy().len()));
        if let Some(p) = found.into_iter().next() {
            return Ok(p);
        }
    }
    let path_var = std::env::var("PATH").unwrap_or_default();
    for dir in path_var.split(':').filter(|d| !d.is_empty()) {
        let path = root.join(dir.trim_start_matches('/')).join(target);
        if is_elf(&path) {
            return Ok(path);
        }
    }
    Err(not_found(format!(
        "no {lib}.so* in the library directories{}, and no {target} on PATH",
        pid.map(|p| format!(" or the mappings of process {p}"))
            .unwrap_or_default()
    )))
}

fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// Whether `path`'s file name is library `lib`'s: `libc.so.6`,
/// `libc-2.31.so`, `libc.so`.
fn names_library(path: &str, lib: &str) -> bool {
    file_name(path)
        .strip_prefix(lib)
        .is_some_and(|rest| rest.starts_with(".so") || rest.starts_with('-'))
}

fn is_elf(path: &Path) -> bool {
    use std::io::Read as _;
    let mut magic = [0; 4];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok_and(|()| magic == *b"\x7fELF")
}

/// A uprobe program the kernel would not load: the same for every
/// function it would be attached to, so a caller going through several
/// skips those that need it (each try runs the verifier again).
#[derive(Debug, thiserror::Error)]
#[error("cannot load program {prog}: {why}")]
pub struct NotLoaded {
    prog: String,
    why: String,
}

impl NotLoaded {
    /// The program's name.
    pub fn prog(&self) -> &str {
        &self.prog
    }
}

/// Uprobe program `prog` of `ebpf`, loaded (once). A failed load is a
/// [`NotLoaded`] in the error's chain.
pub fn loaded<'a>(ebpf: &'a mut Ebpf, prog: &str) -> anyhow::Result<&'a mut UProbe> {
    let p: &mut UProbe = ebpf
        .program_mut(prog)
        .with_context(|| format!("program {prog} missing from the object"))?
        .try_into()?;
    if p.fd().is_err() {
        p.load().map_err(|e| NotLoaded {
            prog: prog.to_owned(),
            why: crate::kernel::features::chain(&e),
        })?;
    }
    Ok(p)
}

/// Loads uprobe program `prog` (once) and attaches it at file offset
/// `offset` of `file` (in function `func`, for errors), for process `pid`
/// only or for every process.
pub fn attach_at(
    ebpf: &mut Ebpf,
    prog: &str,
    func: &str,
    offset: u64,
    file: &Path,
    pid: Option<u32>,
) -> anyhow::Result<()> {
    let p = loaded(ebpf, prog)?;
    p.attach(offset, file, scope_of(pid))
        .map(drop)
        .map_err(|e| cannot_attach(func, file, &e))
}

/// The processes a uprobe fires in: `pid` only, or all.
fn scope_of(pid: Option<u32>) -> UProbeScope {
    match pid.and_then(NonZeroU32::new) {
        Some(p) => UProbeScope::OneProcess(p),
        None => UProbeScope::AllProcesses,
    }
}

/// The error of a uprobe on `func` in `file` that would not attach.
fn cannot_attach(func: &str, file: &Path, e: &aya::programs::ProgramError) -> anyhow::Error {
    anyhow::anyhow!(
        "cannot attach to {func} in {}: {}",
        file.display(),
        crate::kernel::features::chain(e)
    )
}

/// Loads uprobe program `prog` (once) and attaches it to `func` in
/// `file`, for process `pid` only or for every process. The function is
/// found in `symbols` (from [`symbol_offsets`]); one missing there is left
/// to aya, which also looks in separate debug files.
pub fn attach(
    ebpf: &mut Ebpf,
    prog: &str,
    func: &str,
    file: &Path,
    symbols: Option<&HashMap<String, u64>>,
    pid: Option<u32>,
) -> anyhow::Result<()> {
    let p = loaded(ebpf, prog)?;
    let scope = scope_of(pid);
    let attached = match symbols.and_then(|s| s.get(func)) {
        Some(&offset) => p.attach(offset, file, scope),
        None => p.attach(func, file, scope),
    };
    attached.map(drop).map_err(|e| match symbols {
        // aya's own look-up failed too, in the debug file it names or none:
        // the function is simply not there.
        Some(s) if !s.contains_key(func) => {
            anyhow::anyhow!("no function '{func}' in {}", file.display())
        }
        _ => cannot_attach(func, file, &e),
    })
}

/// Where an entry-only uprobe on the function at file offset `entry` of
/// `file` traps cheaply: the kernel emulates a `push` of a register in
/// the trap (6.11 and later), but must step most other instructions
/// out of line, which costs a second trap (glibc's `free` begins with
/// `test %rdi,%rdi`, and a uprobe there costs some five times one on
/// `malloc`'s `push %r12`). The probe moves to the function's first
/// `push` when nothing before it can change what an entry probe reads
/// (instructions that write only the flags, `endbr64`, and conditional
/// branches whose target is a `ret`: calls that do nothing, such as
/// `free(NULL)`, may then go unseen). Otherwise, `entry` itself. Not for
/// return probes, which must trap before the stack moves.
pub fn cheap_entry(file: &Path, entry: u64) -> u64 {
    use iced_x86::{Decoder, DecoderOptions, Mnemonic};
    let Ok(data) = crate::kernel::memory::Mapped::open(file) else {
        return entry;
    };
    let Some(code) = usize::try_from(entry)
        .ok()
        .and_then(|e| data.get(e..(e + 64).min(data.len())))
    else {
        return entry;
    };
    let is_ret = |target: u64| {
        usize::try_from(target)
            .ok()
            .and_then(|t| data.get(t..(t + 16).min(data.len())))
            .is_some_and(|b| {
                Decoder::with_ip(64, b, target, DecoderOptions::NONE)
                    .decode()
                    .mnemonic()
                    == Mnemonic::Ret
            })
    };
    let mut dec = Decoder::with_ip(64, code, entry, DecoderOptions::NONE);
    for _ in 0..4 {
        if !dec.can_decode() {
            break;
        }
        let ins = dec.decode();
        match ins.mnemonic() {
            Mnemonic::Push if ins.op0_kind() == iced_x86::OpKind::Register => {
                return ins.ip();
            }
            Mnemonic::Test | Mnemonic::Cmp | Mnemonic::Endbr64 => {}
            // A conditional jump (Jcc: J-anything but Jmp) to a `ret`.
            m if ins.op0_kind() == iced_x86::OpKind::NearBranch64
                && m != Mnemonic::Jmp
                && format!("{m:?}").starts_with('J')
                && is_ret(ins.near_branch_target()) => {}
            _ => break,
        }
    }
    entry
}

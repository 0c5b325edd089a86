//! Names from files: ELF symbols and DWARF through blazesym (demangled,
//! with inlined functions and source lines), the GNU build ids pprof
//! shows, and the mapped files themselves, held open from when a process
//! is captured so that they are read after it has gone.

use std::{collections::HashMap, fs::File, os::unix::fs::MetadataExt as _, sync::Arc};

use blazesym::symbolize::{Symbolized, Symbolizer as Blaze};

use super::frame::{Frame, Kind, Places};
use crate::stacks::demangle;

/// Identifies an open file: device and inode.
pub(super) type FileId = (u64, u64);

/// An open file, with the name frames show for it.
pub(super) struct OpenFile {
    pub(super) file: File,
    /// Its path in the process that mapped it.
    pub(super) path: String,
    /// Its file name, which frames show.
    pub(super) module: String,
    /// Its GNU build id, in hex.
    pub(super) build_id: Option<String>,
    /// The root directory of the process it was opened for, held open,
    /// where that is not this process's own: a container's, whose debug
    /// files (`/usr/lib/debug`) are the ones for its files.
    pub(super) root: Option<File>,
}

impl OpenFile {
    /// Where its debug files are looked up, where its process has a root
    /// of its own (`None`: blazesym's own directories, this root's).
    pub(super) fn debug_dirs(&self) -> Option<[std::path::PathBuf; 2]> {
        use std::os::fd::AsRawFd as _;
        let root = format!("/proc/self/fd/{}", self.root.as_ref()?.as_raw_fd());
        Some([
            format!("{root}/usr/lib/debug").into(),
            format!("{root}/lib/debug").into(),
        ])
    }
}

/// The root directory of the process in `dir` (its
/// [`proc_dir`](crate::kernel::procmaps::proc_dir)), opened, if it is
/// not this process's.
fn foreign_root(dir: &str) -> Option<File> {
    let root = format!("{dir}/root");
    let theirs = std::fs::metadata(&root).ok()?;
    let ours = std::fs::metadata("/").ok()?;
    if (theirs.dev(), theirs.ino()) == (ours.dev(), ours.ino()) {
        return None;
    }
    File::open(root).ok()
}

/// Opens the file at `path` into `files` ahead of any process that maps
/// it (see [`Symbolizer::know_file`](super::Symbolizer::know_file)).
pub(super) fn know(files: &mut HashMap<FileId, OpenFile>, path: &std::path::Path) {
    let Ok(file) = std::fs::File::open(path) else {
        return;
    };
    let Ok(meta) = file.metadata() else {
        return;
    };
    let path = path.to_string_lossy().into_owned();
    files
        .entry((meta.dev(), meta.ino()))
        .or_insert_with(|| OpenFile {
            build_id: build_id(&file),
            file,
            module: path.rsplit('/').next().unwrap_or(&path).to_owned(),
            path,
            root: None,
        });
}

/// Takes into `files` a file opened by the caller (a file a recording
/// names, found at its path or in perf's build-id cache), shown as
/// `path`; its id.
pub(super) fn adopt(
    files: &mut HashMap<FileId, OpenFile>,
    file: File,
    path: &str,
) -> std::io::Result<FileId> {
    let meta = file.metadata()?;
    let id = (meta.dev(), meta.ino());
    files.entry(id).or_insert_with(|| OpenFile {
        build_id: build_id(&file),
        file,
        path: path.to_owned(),
        module: path.rsplit('/').next().unwrap_or(path).to_owned(),
        root: None,
    });
    Ok(id)
}

/// Opens into `files` a file the process in `dir` (its
/// [`proc_dir`](crate::kernel::procmaps::proc_dir)) maps (`m`, at `path`) through
/// the process's own view of it, or by its path where that is the same
/// file ([`crate::kernel::procmaps::Mapping::open`]), once per file
/// across all processes.
pub(super) fn open(
    files: &mut HashMap<FileId, OpenFile>,
    dir: &str,
    m: &crate::kernel::procmaps::Mapping,
    path: &str,
) -> Result<FileId, String> {
    match m.open(dir) {
        Ok(file) => {
            let id = adopt(files, file, path).map_err(|e| format!("cannot open it: {e}"))?;
            if let Some(open) = files.get_mut(&id)
                && open.root.is_none()
            {
                open.root = foreign_root(dir);
            }
            Ok(id)
        }
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => Err(format!(
            "cannot open it: {e}; the file at its path here is not the one mapped, \
             and CAP_SYS_PTRACE would open the process's own"
        )),
        Err(e) => Err(format!("cannot open it: {e}")),
    }
}

/// blazesym's symbolizer as rtrace uses it: inlined functions and source
/// lines on, demangling as asked.
pub(super) fn blaze(demangle: bool) -> Blaze {
    Blaze::builder()
        .enable_demangling(demangle)
        .enable_inlined_fns(true)
        .enable_code_info(true)
        .build()
}

/// The GNU build id of an ELF file, in hex.
pub(crate) fn build_id(file: &File) -> Option<String> {
    use object::Object as _;
    let data = crate::kernel::memory::Mapped::of(file).ok()?;
    let elf = object::File::parse(&*data).ok()?;
    let id = elf.build_id().ok()??;
    Some(hex(id))
}

/// Bytes in hex, as build ids are shown.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `file:line` of a symbol or an inlined function, where known.
fn source_line(info: Option<&blazesym::symbolize::CodeInfo<'_>>) -> Option<Arc<str>> {
    let info = info?;
    let line = info.line?;
    Some(Arc::from(format!("{}:{line}", info.file.to_string_lossy())))
}

/// The frames one blazesym result stands for: the inlined functions,
/// innermost first, then the function itself; each with its own line
/// where `lines` (blazesym gives each inlined function the line inside
/// it, and the function the line of its call to the first).
pub(super) fn frames(
    sym: Option<&Symbolized<'_>>,
    kind: Kind,
    module: &str,
    lines: bool,
    demangle: bool,
    places: Places,
) -> Vec<Frame> {
    let named = |name: &str| {
        demangle
            .then(|| demangle::ocaml(name))
            .flatten()
            .unwrap_or_else(|| name.to_owned())
    };
    match sym {
        Some(Symbolized::Sym(s)) => {
            let mut out: Vec<Frame> = s
                .inlined
                .iter()
                .rev()
                .map(|f| {
                    let mut frame = Frame::new(named(&f.name), Kind::Inlined, Some(module));
                    if lines {
                        frame.line = source_line(f.code_info.as_ref());
                    }
                    frame
                })
                .collect();
            let name = if places.offsets {
                format!("{}+{:#x}", named(&s.name), s.offset)
            } else {
                named(&s.name)
            };
            let mut frame = Frame::new(name, kind, Some(module));
            if lines {
                frame.line = source_line(s.code_info.as_deref());
            }
            out.push(frame);
            out
        }
        _ => vec![Frame::unknown(kind, Some(module))],
    }
}

/// Raises the soft limit on open files to the hard one: every distinct
/// mapped file of every sampled process stays open until the report.
pub(super) fn raise_fd_limit() {
    // SAFETY: getrlimit/setrlimit only read and write the struct given.
    unsafe {
        let mut lim: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

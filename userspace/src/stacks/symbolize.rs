//! Turning instruction pointers into function names: kernel frames from
//! kallsyms, user frames from ELF symbols and DWARF (demangled, with inlined
//! functions), and JIT frames from jitdumps (`jit-PID.dump`) and
//! `/tmp/perf-PID.map`.
//!
//! What a process's addresses mean is captured while it lives
//! ([`Symbolizer::capture`]): its executable mappings, each with its file
//! held open, and its perf map. A process that has exited, deleted its
//! perf map, or lives in another mount namespace still resolves, because
//! the files are read through the descriptors opened at capture time (from
//! `/proc/PID/map_files`, which works across mount namespaces and for
//! deleted files) rather than by path when the report is made.

use std::{
    collections::{HashMap, HashSet},
    fs::File,
    os::{fd::AsRawFd as _, unix::fs::MetadataExt as _},
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use blazesym::{
    MaybeDefault,
    symbolize::{
        Input, Symbolized, Symbolizer as Blaze,
        source::{Elf, Kernel, Source},
    },
};

use crate::kernel::warning::Warning;
use crate::stacks::{
    demangle,
    jitdump::{self, JitDump},
    python::Python,
};

/// What kind of code a frame is in; flame graphs color by it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// The kernel (or a kernel module, or a BPF program).
    Kernel,
    /// A user-space ELF file.
    User,
    /// JIT-compiled code named by a perf map.
    Jit,
    /// A function of an interpreted language, named by its runtime's perf
    /// map (Python's `py::` trampolines, V8's `~` functions, the JVM's
    /// `Interpreter`).
    Interpreted,
    /// A function inlined into the frame below it.
    Inlined,
}

impl Kind {
    /// The suffix flame graphs colour by: FlameGraph's and inferno's
    /// `java` palette know `_[k]`, `_[j]` and `_[i]`; rtrace's mixed
    /// palette adds `_[p]` for interpreted code.
    pub fn annotation(self) -> &'static str {
        match self {
            Self::Kernel => "_[k]",
            Self::User => "",
            Self::Jit => "_[j]",
            Self::Interpreted => "_[p]",
            Self::Inlined => "_[i]",
        }
    }
}

/// One frame of a symbolized stack. Frames are alike (`Eq`, `Hash`) by
/// what they show: name, kind, module and line, not by address, so that
/// samples of one function merge whatever instruction they hit.
#[derive(Clone, Debug)]
pub struct Frame {
    /// The function's name, demangled, or `[unknown]`; shared, as stacks
    /// repeat it.
    pub name: Arc<str>,
    /// What kind of code it is.
    pub kind: Kind,
    /// The file the code is in (`[kernel]` and `[jit]` for those), if known.
    pub module: Option<Arc<str>>,
    /// The source file and line of the frame's own code (`main.c:12`),
    /// where lines are asked for and the debug information has them.
    pub line: Option<Arc<str>>,
    /// An address in the frame's code, as the process saw it (the call
    /// itself for callers), and the mapping it is in; 0 and `None` where
    /// unknown. One of the addresses of frames that are alike.
    pub addr: u64,
    /// See [`Frame::addr`].
    pub mapping: Option<Arc<CodeMapping>>,
}

impl PartialEq for Frame {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
            && self.kind == other.kind
            && self.module == other.module
            && self.line == other.line
    }
}

impl Eq for Frame {}

impl std::hash::Hash for Frame {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.name.hash(h);
        self.kind.hash(h);
        self.module.hash(h);
        self.line.hash(h);
    }
}

/// A mapping of code, as pprof describes it.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct CodeMapping {
    /// Its first address in the process, and the one after its last.
    pub start: u64,
    /// See [`CodeMapping::start`].
    pub limit: u64,
    /// The file offset of `start`.
    pub offset: u64,
    /// The file's path (`[kernel.kallsyms]` for the kernel).
    pub file: String,
    /// The file's GNU build id, in hex, where it has one.
    pub build_id: Option<String>,
}

impl Frame {
    /// A frame of `kind` named `name`, in `module`, with no line or
    /// address.
    pub fn new(name: impl Into<Arc<str>>, kind: Kind, module: Option<&str>) -> Self {
        Self {
            name: name.into(),
            kind,
            module: module.map(Arc::from),
            line: None,
            addr: 0,
            mapping: None,
        }
    }

    /// The file name and line number of [`Frame::line`].
    pub fn file_line(&self) -> Option<(&str, u32)> {
        let (file, line) = self.line.as_deref()?.rsplit_once(':')?;
        Some((file, line.parse().ok()?))
    }

    /// A placeholder for a stack that could not be walked or stored.
    pub fn missed(name: &str, kind: Kind) -> Self {
        Self::new(name, kind, None)
    }

    fn unknown(kind: Kind, module: Option<&str>) -> Self {
        Self::new("[unknown]", kind, module)
    }
}

/// Identifies an open file: device and inode.
type FileId = (u64, u64);

/// An executable mapping of a process.
#[derive(Clone)]
struct Mapping {
    start: u64,
    end: u64,
    /// File offset of `start`.
    offset: u64,
    /// The file, if it is file-backed and could be opened.
    file: Option<FileId>,
    /// What `/proc/PID/maps` calls it (a path, `[vdso]`, or empty).
    name: String,
    /// As pprof describes it, for file-backed mappings.
    code: Option<Arc<CodeMapping>>,
    /// Why a file-backed mapping's file could not be opened.
    unopened: Option<Arc<str>>,
    /// A mapping of the program the process ran before its last exec:
    /// it names what was sampled between its fork and that exec, at
    /// addresses no mapping of the new program holds.
    before_exec: bool,
}

/// A symbol of a perf map.
#[derive(Clone)]
struct JitSymbol {
    start: u64,
    end: u64,
    name: String,
}

/// What was captured of one process.
#[derive(Default, Clone)]
struct Process {
    /// Every mapping ever seen, newest last: mappings that have since gone
    /// may still have samples.
    maps: Vec<Mapping>,
    /// The perf map's symbols, sorted by start; later lines win, as perf
    /// has it, so a range rewritten by the JIT gets its newest name.
    jit: Vec<JitSymbol>,
    /// Size of the perf map when last read.
    jit_len: u64,
    /// Where the perf map is, found once while the process lives: it is
    /// looked at on every new stack of the process, and read once more
    /// when the process exits or the run ends.
    jit_path: Option<JitPath>,
    /// The process's command, for warnings.
    comm: Option<Arc<str>>,
    /// When the mappings were last read.
    captured: Option<Instant>,
    /// Known only from mappings the kernel found ([`Symbolizer::found`]):
    /// nothing was read of it yet.
    found_only: bool,
}

/// Where a process's perf map is: `/tmp/perf-PID.map` as the process
/// sees it, by its pid in its own namespace. A process with a root of its
/// own (a container) has it reached through that root, held open, so
/// that it is still found after the process has exited.
#[derive(Clone)]
struct JitPath {
    /// The path to read.
    path: String,
    /// The path as the process names it, for warnings.
    shown: String,
    /// The process's root directory, when it is not rtrace's.
    _root: Option<Arc<File>>,
}

/// A process's jitdump file ([`jitdump`](super::jitdump)), held open from
/// when its mapping is first seen: it is read again as the runtime appends
/// to it, after the process has exited and after the runtime deleted it.
struct Dump {
    file: File,
    /// Its path in the process, for warnings.
    shown: String,
    dump: JitDump,
    /// Why reading stopped, if it did.
    error: Option<String>,
}

impl Dump {
    /// What was read, for `-v`.
    fn summary(&self, pid: u32) -> String {
        let held = if self.dump.is_empty() {
            "no code".to_owned()
        } else {
            format!("{} code placements", self.dump.len())
        };
        format!(
            "jitdump of PID {pid} ({}): {held}, {} malformed records skipped{}",
            self.shown,
            self.dump.malformed(),
            if self.dump.closed() { ", closed" } else { "" }
        )
    }

    /// Why names from it may be wrong or missing, if they may.
    fn warning(&self, pid: u32) -> Option<Warning> {
        if let Some(e) = &self.error {
            return Some(Warning::unnamed(format!(
                "PID {pid}: {} was read only up to byte {}: {e}",
                self.shown,
                self.dump.offset()
            )));
        }
        (self.dump.header().is_some() && !self.dump.timed()).then(|| {
            Warning::unnamed(format!(
                "PID {pid}: {} has the CPU's own timestamps, not CLOCK_MONOTONIC: \
                 code the JIT replaced at one address takes the newest name",
                self.shown
            ))
        })
    }

    /// Reads what the runtime appended since the last read.
    fn read_more(&mut self) {
        if self.error.is_some() {
            return;
        }
        if let Err(e) = self.dump.read_more(&mut self.file) {
            self.error = Some(e.to_string());
        }
    }
}

/// One frame located: where, its address, and its file's mapping.
type Place = (Loc, u64, Option<Arc<CodeMapping>>);

/// JIT frames left unnamed in one process, for the warning that says why.
struct Unnamed {
    comm: Option<Arc<str>>,
    frames: u64,
    /// Why: the perf map was missing, empty, or did not name them.
    map: &'static str,
    shown: String,
}

/// `file:line` of a symbol or an inlined function, where known.
fn source_line(info: Option<&blazesym::symbolize::CodeInfo<'_>>) -> Option<Arc<str>> {
    let info = info?;
    let line = info.line?;
    Some(Arc::from(format!("{}:{line}", info.file.to_string_lossy())))
}

/// Where an address is, before any symbol lookup.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Loc {
    Kernel(u64),
    File(FileId, u64),
    Jit(u32, u64),
    Named(u32, usize),
    /// A Python frame: the process, the code object's address and check,
    /// and the instruction's code unit.
    Python(u32, u64, u32, u32),
    /// In a mapping whose file could not be opened.
    Unopened(u32, usize),
    Unknown,
}

/// An open file, with the name frames show for it.
struct OpenFile {
    file: File,
    /// Its path in the process that mapped it.
    path: String,
    module: String,
    /// Its GNU build id, in hex.
    build_id: Option<String>,
}

/// Resolves kernel and user stacks; see the module documentation.
pub struct Symbolizer {
    blaze: Blaze,
    files: HashMap<FileId, OpenFile>,
    procs: HashMap<u32, Process>,
    /// See [`Symbolizer::recapture_every`].
    recapture: Duration,
    /// See [`Symbolizer::with_lines`].
    lines: bool,
    /// See [`Symbolizer::with_demangling`].
    demangle: bool,
    /// See [`Symbolizer::with_places`].
    places: Places,
    /// See [`Symbolizer::kallsyms`].
    kallsyms: Option<File>,
    /// What kallsyms' changes looked like when the copy began.
    kallsyms_state: Option<KernelState>,
    /// A copy being made on another thread (see
    /// [`Symbolizer::prefetch_kernel`]).
    prefetch: Option<std::thread::JoinHandle<std::io::Result<File>>>,
    /// Files whose frames could not be resolved, and why: their frames
    /// show as `[unknown]`, which the user is told of.
    failures: std::collections::BTreeMap<String, String>,
    /// Processes with JIT frames that their perf map did not name.
    unnamed: std::collections::BTreeMap<u32, Unnamed>,
    /// Jitdump files by the pid of the process that maps them.
    dumps: HashMap<u32, Dump>,
    /// The CLOCK_MONOTONIC time JIT code is looked up at in jitdumps (see
    /// [`Symbolizer::jit_time`]); `None` takes the newest code.
    jit_time: Option<u64>,
    /// What the dumps of processes forgotten held, and their warnings.
    gone_dumps: Vec<(String, Option<Warning>)>,
    /// The Python processes and the names of their code.
    python: Python,
}

/// What changes kallsyms between two looks: modules loaded or unloaded,
/// and BPF programs loaded.
struct KernelState {
    modules: String,
    programs: Vec<u32>,
}

impl KernelState {
    fn now() -> Self {
        let programs = aya::programs::loaded_programs()
            .filter_map(Result::ok)
            .map(|p| p.id())
            .collect();
        Self {
            modules: std::fs::read_to_string("/proc/modules").unwrap_or_default(),
            programs,
        }
    }

    /// Whether a copy of kallsyms begun at `self` still names everything
    /// it would at `now`. Programs unloaded since (this tool's own, once
    /// detached) are still named by the older copy, which is better.
    fn covers(&self, now: &Self) -> bool {
        self.modules == now.modules && now.programs.iter().all(|p| self.programs.contains(p))
    }
}

/// How often one process's mappings are read again while it gets new
/// stacks, when nothing says when it maps new code: often enough to see
/// new JIT code and libraries, seldom enough to cost nothing next to
/// sampling.
const RECAPTURE: Duration = Duration::from_millis(250);

impl Default for Symbolizer {
    fn default() -> Self {
        Self::new()
    }
}

/// blazesym's symbolizer as rtrace uses it: inlined functions and source
/// lines on, demangling as asked.
fn blaze(demangle: bool) -> Blaze {
    Blaze::builder()
        .enable_demangling(demangle)
        .enable_inlined_fns(true)
        .enable_code_info(true)
        .build()
}

impl Symbolizer {
    /// A symbolizer with demangling, line info and inlined functions on.
    pub fn new() -> Self {
        raise_fd_limit();
        Self {
            blaze: blaze(true),
            files: HashMap::new(),
            procs: HashMap::new(),
            recapture: RECAPTURE,
            lines: false,
            demangle: true,
            places: Places::default(),
            kallsyms: None,
            kallsyms_state: None,
            prefetch: None,
            failures: std::collections::BTreeMap::new(),
            unnamed: std::collections::BTreeMap::new(),
            dumps: HashMap::new(),
            jit_time: None,
            gone_dumps: Vec::new(),
            python: Python::default(),
        }
    }

    /// What `-v` says of the Python processes found.
    pub fn python_summary(&self) -> Vec<String> {
        self.python.summary()
    }

    /// The Python processes, whose frames the kernel walks, and the names
    /// of their code.
    pub fn python(&mut self) -> &mut Python {
        &mut self.python
    }

    /// The files whose code could not be symbolized, one line each, for
    /// the report's warnings.
    pub fn warnings(&self) -> Vec<Warning> {
        const SHOWN: usize = 5;
        let mut out: Vec<Warning> = self
            .failures
            .iter()
            .take(SHOWN)
            .map(|(file, why)| Warning::unnamed(format!("frames in {file} are [unknown]: {why}")))
            .collect();
        if self.failures.len() > SHOWN {
            out.push(Warning::unnamed(format!(
                "and frames in {} other files are [unknown]",
                self.failures.len() - SHOWN
            )));
        }
        for (pid, u) in self.unnamed.iter().take(SHOWN) {
            let comm = u
                .comm
                .as_deref()
                .map(|c| format!(" ({c})"))
                .unwrap_or_default();
            let why = match u.map {
                "missing" => format!(
                    "it wrote no {} and mapped no jit-PID.dump; a JIT runtime writes one \
                     when asked (node --perf-basic-prof or --perf-prof, mono --jitmap, \
                     the JVM's perf-map-agent)",
                    u.shown
                ),
                "dump" => format!("its {} did not name them", u.shown),
                "empty" => format!(
                    "its {} was empty; Mono and the JVM write it at exit: \
                     run the program under `rtrace profile -- CMD`",
                    u.shown
                ),
                _ => format!(
                    "its {} did not name them (it may be written at exit: \
                     run the program under `rtrace profile -- CMD`)",
                    u.shown
                ),
            };
            out.push(Warning::unnamed(format!(
                "PID {pid}{comm}: {} JIT frames unnamed: {why}",
                u.frames
            )));
        }
        out.extend(self.python.warnings());
        out.extend(self.gone_dumps.iter().filter_map(|(_, w)| w.clone()));
        out.extend(self.dumps.iter().filter_map(|(&pid, d)| d.warning(pid)));
        if self.unnamed.len() > SHOWN {
            out.push(Warning::unnamed(format!(
                "and JIT frames of {} other processes are unnamed",
                self.unnamed.len() - SHOWN
            )));
        }
        out
    }

    /// Reads process `pid`'s perf map again if it changed: at its exit,
    /// when a runtime that writes the map then (Mono, the JVM) has just
    /// written it.
    pub fn read_jit(&mut self, pid: u32) {
        if let Some(proc) = self.procs.get_mut(&pid) {
            read_perf_map(pid, proc);
        }
        if let Some(d) = self.dumps.get_mut(&pid) {
            d.read_more();
        }
    }

    /// Reads every known process's perf map again if it changed, at the
    /// end of a run.
    pub fn read_all_jit(&mut self) {
        for (&pid, proc) in &mut self.procs {
            read_perf_map(pid, proc);
        }
        self.read_dumps();
    }

    /// Reads what runtimes appended to their jitdumps since the last read.
    pub fn read_dumps(&mut self) {
        for d in self.dumps.values_mut() {
            d.read_more();
        }
    }

    /// The processes with a jitdump whose times are comparable with
    /// sample times: their stacks are worth naming at the time they were
    /// counted ([`Symbolizer::jit_time`]).
    pub fn timed_dumps(&self) -> HashSet<u32> {
        self.dumps
            .iter()
            .filter(|(_, d)| d.dump.timed())
            .map(|(&pid, _)| pid)
            .collect()
    }

    /// What each jitdump read holds, for `-v`.
    pub fn dump_summary(&self) -> Vec<String> {
        let mut pids: Vec<&u32> = self.dumps.keys().collect();
        pids.sort_unstable();
        let live = pids.into_iter().map(|&pid| self.dumps[&pid].summary(pid));
        self.gone_dumps
            .iter()
            .map(|(s, _)| s.clone())
            .chain(live)
            .collect()
    }

    /// Sets the CLOCK_MONOTONIC time at which JIT frames are looked up in
    /// jitdumps until the next call: a JIT reuses the addresses of code it
    /// threw away, and the code at an address when the stack was counted
    /// is what ran. `None` takes the newest code at each address, as a
    /// perf map has it.
    pub fn jit_time(&mut self, at: Option<u64>) {
        self.jit_time = at;
    }

    /// Gives frames their source file and line (`--lines`).
    pub fn with_lines(&mut self, lines: bool) {
        self.lines = lines;
    }

    /// Names each frame with its offset in its function (`func+0x1a`), or
    /// its address before the name, as bcc's stackcount `-s` and `-v`:
    /// frames at different places in one function stay apart.
    pub fn with_places(&mut self, places: Places) {
        self.places = places;
    }

    /// Demangles names as perf does (the default), or keeps the linker's
    /// (`--no-demangle`): Rust and C++ by blazesym, OCaml by
    /// [`demangle::ocaml`].
    pub fn with_demangling(&mut self, on: bool) {
        if on != self.demangle {
            self.demangle = on;
            self.blaze = blaze(on);
        }
    }

    /// Sets how long a process's mappings are trusted before its next new
    /// stack reads them again. A caller that is told when a process maps
    /// new code (the CFI walk is) and captures then with `force` needs
    /// the timer only as a safety net.
    pub fn recapture_every(&mut self, every: Duration) {
        self.recapture = every;
    }

    /// Captures process `pid`'s executable mappings and perf map, or
    /// refreshes them: the perf map whenever it has grown, which costs a
    /// `stat`, and the mappings if they were read more than a moment ago
    /// (or `force`). A process that is gone is left as last captured.
    pub fn capture(&mut self, pid: u32, force: bool) {
        if pid == 0 {
            return;
        }
        if let Some(proc) = self.procs.get_mut(&pid) {
            proc.found_only = false;
        }
        if !force
            && let Some(proc) = self.procs.get_mut(&pid)
            && proc.captured.is_some_and(|t| t.elapsed() < self.recapture)
        {
            // A JIT names new code in its map before running it, so the
            // first sample of that code is the moment to read the map,
            // however recently the mappings were read.
            read_perf_map(pid, proc);
            return;
        }
        let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else {
            // Gone before it was ever read: its perf map, named by its pid,
            // may still name its JIT code (written at exit, or as it ran).
            read_perf_map(pid, self.procs.entry(pid).or_default());
            return;
        };
        let mut found = Vec::new();
        for line in maps.lines() {
            if let Some(m) = self.parse_mapping(pid, line) {
                found.push(m);
            }
        }
        self.find_dump(pid, &found);
        let proc = self.procs.entry(pid).or_default();
        for m in found {
            // A file that could not be opened this time (the process was
            // exiting, or the mapping just changed) must not hide the one
            // opened before.
            let known = proc.maps.iter().any(|o| {
                o.start == m.start
                    && o.end == m.end
                    && o.offset == m.offset
                    && o.name == m.name
                    && (o.file == m.file || m.file.is_none())
            });
            if !known {
                proc.maps.push(m);
            }
        }
        proc.captured = Some(Instant::now());
        read_perf_map(pid, proc);
    }

    /// Notes that process `pid` ran a new program: what was captured of
    /// the old one (inherited at fork, or read before) no longer says what
    /// its addresses mean, so its mappings are read again at once and its
    /// JIT files looked for afresh.
    pub fn exec(&mut self, pid: u32) {
        if let Some(p) = self.procs.get_mut(&pid) {
            // The samples before the exec (a shell's or a build's child
            // between fork and exec) are named by the old program's
            // mappings, one program back, where the new one's hold
            // nothing.
            p.maps.retain(|m| !m.before_exec);
            for m in &mut p.maps {
                m.before_exec = true;
            }
            p.captured = None;
            p.jit.clear();
            p.jit_len = 0;
            p.jit_path = None;
        }
        self.close_dump(pid);
        self.capture(pid, true);
    }

    /// Notes a mapping of process `pid` that the kernel found itself
    /// (from `start` to `end`, of file offset `offset`, of the file the
    /// kernel names `dev` (its `s_dev`) and `ino`): the frames in it are
    /// named from it if the process is gone before its maps are read. The
    /// file is known by what any process mapped of it; until then its
    /// frames have no name.
    pub fn found(&mut self, pid: u32, start: u64, end: u64, offset: u64, dev: u32, ino: u64) {
        let id = (libc::makedev(dev >> 20, dev & 0xf_ffff), ino);
        let proc = self.procs.entry(pid).or_insert_with(|| Process {
            found_only: true,
            ..Process::default()
        });
        let known = proc
            .maps
            .iter()
            .any(|m| m.start <= start && end <= m.end && m.file == Some(id) && m.offset <= offset);
        if known {
            return;
        }
        let open = self.files.get(&id);
        let name = open.map(|f| f.path.clone()).unwrap_or_default();
        let code = open.map(|f| {
            Arc::new(CodeMapping {
                start,
                limit: end,
                offset,
                file: f.path.clone(),
                build_id: f.build_id.clone(),
            })
        });
        proc.maps.push(Mapping {
            start,
            end,
            offset,
            file: Some(id),
            name,
            code,
            unopened: None,
            before_exec: false,
        });
    }

    /// Whether anything was captured of process `pid`.
    pub fn knows(&self, pid: u32) -> bool {
        self.procs.get(&pid).is_some_and(|p| !p.found_only)
    }

    /// Gives process `child`, just forked from `parent`, what was captured
    /// of its parent: it runs the same code at the same addresses until it
    /// runs a program of its own, and may be gone before its own maps
    /// could be read. Without a capture of the parent, the child's own is
    /// read.
    pub fn inherit(&mut self, child: u32, parent: u32) {
        match self.procs.get(&parent) {
            Some(p) => {
                let mut p = p.clone();
                p.jit_path = perf_map_path(child);
                p.jit_len = 0;
                p.jit.clear();
                self.procs.insert(child, p);
            }
            None => self.capture(child, false),
        }
    }

    /// A copy of `/proc/kallsyms`, made once: blazesym keeps a parsed file
    /// until its modification time changes, which for a proc file is
    /// every time it is looked at, so symbolizing every second would parse
    /// its 2 MB every second.
    fn kallsyms(&mut self) -> MaybeDefault<PathBuf> {
        if let Some(copying) = self.prefetch.take() {
            self.kallsyms = copying.join().ok().and_then(Result::ok);
        }
        if self.kallsyms.is_none() {
            self.kallsyms_state = Some(KernelState::now());
            self.kallsyms = snapshot_kallsyms().ok();
        }
        match &self.kallsyms {
            Some(f) => {
                MaybeDefault::Some(PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd())))
            }
            None => MaybeDefault::Default,
        }
    }

    /// Starts copying `/proc/kallsyms` on another thread. Reading it takes
    /// the kernel about 50 ms, which the report would otherwise wait for;
    /// a tool calls this once its own programs are loaded, as their names
    /// are in it.
    pub fn prefetch_kernel(&mut self) {
        self.kallsyms_state = Some(KernelState::now());
        self.prefetch = Some(std::thread::spawn(snapshot_kallsyms));
    }

    /// Takes a new copy of `/proc/kallsyms` at the next kernel lookup if
    /// modules were loaded or unloaded, or BPF programs loaded, since the
    /// last copy began.
    pub fn refresh_kernel(&mut self) {
        if let Some(then) = &self.kallsyms_state
            && then.covers(&KernelState::now())
        {
            return;
        }
        if let Some(copying) = self.prefetch.take() {
            let _ = copying.join();
        }
        self.kallsyms = None;
    }

    /// Drops what was captured of process `pid`, once its stacks are
    /// symbolized and it is gone.
    pub fn forget(&mut self, pid: u32) {
        self.procs.remove(&pid);
        self.close_dump(pid);
    }

    /// Closes process `pid`'s jitdump, keeping what `-v` and the warnings
    /// say of it.
    fn close_dump(&mut self, pid: u32) {
        if let Some(d) = self.dumps.remove(&pid) {
            self.gone_dumps.push((d.summary(pid), d.warning(pid)));
        }
    }

    /// Opens and reads the jitdump among a process's executable mappings,
    /// if it maps one and it is not open yet: a runtime maps its dump's
    /// first page executable for perf to find it. The file was opened
    /// with the mapping, through `map_files`, so a dump deleted since is
    /// still read.
    fn find_dump(&mut self, pid: u32, found: &[Mapping]) {
        if self.dumps.contains_key(&pid) {
            return;
        }
        let Some((id, name)) = found.iter().find_map(|m| {
            let path = m.name.strip_suffix(" (deleted)").unwrap_or(&m.name);
            jitdump::dump_pid(path)?;
            Some((m.file?, path))
        }) else {
            return;
        };
        let Some(file) = self.files.get(&id).and_then(|f| f.file.try_clone().ok()) else {
            return;
        };
        let mut dump = Dump {
            file,
            shown: name.to_owned(),
            dump: JitDump::new(),
            error: None,
        };
        dump.read_more();
        self.dumps.insert(pid, dump);
    }

    /// Parses one line of `/proc/PID/maps`, keeping executable mappings and
    /// opening their files.
    fn parse_mapping(&mut self, pid: u32, line: &str) -> Option<Mapping> {
        let m = crate::kernel::procmaps::Mapping::parse(line)?;
        if !m.exec {
            return None;
        }
        let (file, unopened) = match m.path().map(|path| self.open_file(pid, &m, path)) {
            Some(Ok(id)) => (Some(id), None),
            Some(Err(why)) => (None, Some(Arc::from(why))),
            None => (None, None),
        };
        let code = file.map(|id| {
            Arc::new(CodeMapping {
                start: m.start,
                limit: m.end,
                offset: m.offset,
                file: m.name.clone(),
                build_id: self.files.get(&id).and_then(|f| f.build_id.clone()),
            })
        });
        Some(Mapping {
            start: m.start,
            end: m.end,
            offset: m.offset,
            file,
            name: m.name,
            code,
            unopened,
            before_exec: false,
        })
    }

    /// Opens the file at `path` ahead of any process that maps it, so that
    /// the regions the kernel finds of it ([`Symbolizer::found`]) are
    /// named even when their process is gone before its maps are read.
    pub fn know_file(&mut self, path: &std::path::Path) {
        let Ok(file) = std::fs::File::open(path) else {
            return;
        };
        let Ok(meta) = file.metadata() else {
            return;
        };
        let path = path.to_string_lossy().into_owned();
        self.files
            .entry((meta.dev(), meta.ino()))
            .or_insert_with(|| OpenFile {
                build_id: build_id(&file),
                file,
                module: path.rsplit('/').next().unwrap_or(&path).to_owned(),
                path,
            });
    }

    /// Opens a mapped file through the process's own view of it, or by
    /// its path where that is the same file
    /// ([`crate::kernel::procmaps::Mapping::open`]),
    /// once per file across all processes.
    fn open_file(
        &mut self,
        pid: u32,
        m: &crate::kernel::procmaps::Mapping,
        path: &str,
    ) -> Result<FileId, String> {
        let opened = m
            .open(&format!("/proc/{pid}"))
            .and_then(|file| Ok((file.metadata()?, file)));
        let (meta, file) = match opened {
            Ok(opened) => opened,
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                return Err(format!(
                    "cannot open it: {e}; the file at its path here is not the one mapped, \
                     and CAP_SYS_PTRACE would open the process's own"
                ));
            }
            Err(e) => return Err(format!("cannot open it: {e}")),
        };
        let id = (meta.dev(), meta.ino());
        self.files.entry(id).or_insert_with(|| OpenFile {
            build_id: build_id(&file),
            file,
            path: path.to_owned(),
            module: path.rsplit('/').next().unwrap_or(path).to_owned(),
        });
        Ok(id)
    }

    /// Symbolizes stacks, each leaf first, with `pid` `None` for kernel
    /// stacks. Every address is looked up once, with one lookup per file.
    ///
    /// Frames come back leaf first, inlined functions before the function
    /// they were inlined into.
    pub fn symbolize(&mut self, stacks: &[(Option<u32>, &[u64])]) -> Vec<Vec<Frame>> {
        // Each address where it is (its call site: `call_site`), with its
        // mapping, for pprof.
        let places: Vec<Vec<Place>> = stacks
            .iter()
            .map(|(pid, ips)| {
                let mut out = Vec::with_capacity(ips.len());
                let mut i = 0;
                while i < ips.len() {
                    let ip = ips[i];
                    // A Python frame: two slots (`rtrace_common::python`).
                    if let Some(pid) = pid
                        && rtrace_common::python::is_py_frame(ip)
                        && let Some(&more) = ips.get(i + 1)
                    {
                        let addr = ip & rtrace_common::python::PY_ADDR_MASK;
                        let loc = Loc::Python(*pid, addr, (more >> 32) as u32, more as u32);
                        out.push((loc, addr, None));
                        i += 2;
                        continue;
                    }
                    let ip = call_site(i, ip);
                    let (loc, mapping) = match pid {
                        None => (Loc::Kernel(ip), Some(kernel_mapping())),
                        Some(pid) => self.locate(*pid, ip),
                    };
                    out.push((loc, ip, mapping));
                    i += 1;
                }
                out
            })
            .collect();

        let mut kernel: Vec<u64> = Vec::new();
        let mut by_file: HashMap<FileId, Vec<u64>> = HashMap::new();
        for (loc, _, _) in places.iter().flatten() {
            match *loc {
                Loc::Kernel(a) => kernel.push(a),
                Loc::File(f, off) => by_file.entry(f).or_default().push(off),
                Loc::Unopened(pid, i) => {
                    let m = &self.procs[&pid].maps[i];
                    if let Some(why) = &m.unopened {
                        self.failures.insert(m.name.clone(), why.to_string());
                    }
                }
                _ => {}
            }
        }
        let mut resolved: HashMap<Loc, Vec<Frame>> = HashMap::new();
        kernel.sort_unstable();
        kernel.dedup();
        // Without kernel addresses (`-U`), kallsyms is not read at all.
        let syms = if kernel.is_empty() {
            Ok(Vec::new())
        } else {
            let src = Source::Kernel(Kernel {
                // A vmlinux image would be searched for in several places on
                // every run and is rarely installed; kallsyms has every
                // function.
                vmlinux: MaybeDefault::None,
                kallsyms: self.kallsyms(),
                debug_syms: false,
                ..Kernel::default()
            });
            self.blaze.symbolize(&src, Input::AbsAddr(&kernel))
        };
        for (i, a) in kernel.iter().enumerate() {
            let sym = syms.as_ref().ok().and_then(|s| s.get(i));
            resolved.insert(
                Loc::Kernel(*a),
                frames(
                    sym,
                    Kind::Kernel,
                    "[kernel]",
                    self.lines,
                    false,
                    self.places,
                ),
            );
        }
        for (id, mut offsets) in by_file {
            offsets.sort_unstable();
            offsets.dedup();
            let Some(open) = self.files.get(&id) else {
                continue;
            };
            let path = PathBuf::from(format!("/proc/self/fd/{}", open.file.as_raw_fd()));
            let src = Source::Elf(Elf::new(path));
            let syms = self.blaze.symbolize(&src, Input::FileOffset(&offsets));
            if let Err(e) = &syms {
                self.failures
                    .insert(open.path.clone(), format!("cannot read its symbols: {e:#}"));
            }
            for (i, off) in offsets.iter().enumerate() {
                let sym = syms.as_ref().ok().and_then(|s| s.get(i));
                resolved.insert(
                    Loc::File(id, *off),
                    frames(
                        sym,
                        Kind::User,
                        &open.module,
                        self.lines,
                        self.demangle,
                        self.places,
                    ),
                );
            }
        }

        self.note_unnamed(&places);
        places
            .iter()
            .map(|stack| {
                stack
                    .iter()
                    .flat_map(|(loc, addr, mapping)| {
                        let mut frames = match *loc {
                            Loc::Kernel(_) | Loc::File(..) => resolved
                                .get(loc)
                                .cloned()
                                .unwrap_or_else(|| vec![Frame::unknown(Kind::User, None)]),
                            Loc::Jit(pid, a) => vec![self.jit_frame(pid, a)],
                            Loc::Python(pid, a, check, lasti) => {
                                vec![self.python_frame(pid, a, check, lasti)]
                            }
                            Loc::Named(pid, i) => {
                                let name = &self.procs[&pid].maps[i].name;
                                vec![Frame::new(name.clone(), Kind::User, Some(name))]
                            }
                            Loc::Unopened(pid, i) => {
                                let name = &self.procs[&pid].maps[i].name;
                                let module = name.rsplit('/').next().unwrap_or(name);
                                vec![Frame::unknown(Kind::User, Some(module))]
                            }
                            Loc::Unknown => vec![Frame::unknown(Kind::User, None)],
                        };
                        for f in &mut frames {
                            f.addr = *addr;
                            f.mapping.clone_from(mapping);
                            if self.places.addresses && f.kind != Kind::Inlined {
                                f.name = Arc::from(format!("{addr:#x} {}", f.name));
                            }
                        }
                        frames
                    })
                    .collect()
            })
            .collect()
    }

    /// Where user address `ip` of `pid` is, and the file-backed mapping
    /// that holds it, if any.
    fn locate(&self, pid: u32, ip: u64) -> (Loc, Option<Arc<CodeMapping>>) {
        let Some(proc) = self.procs.get(&pid) else {
            return (Loc::Unknown, None);
        };
        let holding = |old: bool| {
            proc.maps
                .iter()
                .enumerate()
                .rev()
                .find(|(_, m)| m.before_exec == old && (m.start..m.end).contains(&ip))
        };
        let Some((i, m)) = holding(false).or_else(|| holding(true)) else {
            // Code in no mapping seen may still be in the perf map.
            return (Loc::Jit(pid, ip), None);
        };
        let loc = match m.file {
            Some(f) => Loc::File(f, ip - m.start + m.offset),
            None if m.unopened.is_some() => Loc::Unopened(pid, i),
            None if m.name.starts_with('[') => Loc::Named(pid, i),
            None => Loc::Jit(pid, ip),
        };
        (loc, m.code.clone())
    }

    /// The perf-map symbol at `ip` of `pid`.
    fn jit_symbol(&self, pid: u32, ip: u64) -> Option<&JitSymbol> {
        let jit = &self.procs.get(&pid)?.jit;
        let i = jit.partition_point(|s| s.start <= ip);
        i.checked_sub(1).map(|i| &jit[i]).filter(|s| ip < s.end)
    }

    /// Whether every frame of user stack `ips` of `pid` (leaf first) that
    /// is in JIT code is named, by the jitdump or the perf map.
    pub fn names_all_jit(&self, pid: u32, ips: &[u64]) -> bool {
        ips.iter().enumerate().all(|(i, &ip)| {
            let ip = call_site(i, ip);
            !self.in_jit_code(pid, ip)
                || self.dump_symbol(pid, ip).is_some()
                || self.jit_symbol(pid, ip).is_some()
        })
    }

    /// Whether `ip` of `pid` is in anonymous executable memory, JIT code.
    /// Addresses in no mapping at all are a walk gone astray.
    fn in_jit_code(&self, pid: u32, ip: u64) -> bool {
        self.procs.get(&pid).is_some_and(|p| {
            p.maps
                .iter()
                .any(|m| m.name.is_empty() && (m.start..m.end).contains(&ip))
        })
    }

    /// The code at `ip` of `pid` by its jitdump, at the time set by
    /// [`Symbolizer::jit_time`].
    fn dump_symbol(&self, pid: u32, ip: u64) -> Option<jitdump::JitSymbol<'_>> {
        let dump = &self.dumps.get(&pid)?.dump;
        match self.jit_time {
            Some(t) => dump.lookup(ip, t),
            None => dump.lookup_latest(ip),
        }
    }

    /// The JIT code at `ip` of `pid` by its jitdump, else its perf map, or
    /// `[unknown]`.
    fn jit_frame(&self, pid: u32, ip: u64) -> Frame {
        if let Some(s) = self.dump_symbol(pid, ip) {
            let mut frame = jit_named(s.name);
            if self.lines {
                frame.line = s
                    .source
                    .map(|l| Arc::from(format!("{}:{}", l.file, l.line)));
            }
            return frame;
        }
        match self.jit_symbol(pid, ip) {
            Some(s) => jit_named(&s.name),
            None => Frame::unknown(Kind::User, None),
        }
    }

    /// A Python frame: `module.qualname`, in its file, with its line
    /// under `--lines`; `[python]` if its code object could not be read.
    fn python_frame(&mut self, pid: u32, addr: u64, check: u32, lasti: u32) -> Frame {
        let Some(n) = self.python.name(pid, addr, check) else {
            return Frame::new("[python]", Kind::Interpreted, None);
        };
        let mut frame = Frame::new(Arc::clone(&n.name), Kind::Interpreted, None);
        frame.module = Some(Arc::clone(&n.file));
        if self.lines {
            frame.line = n.line(lasti).map(|l| Arc::from(format!("{}:{l}", n.file)));
        }
        frame
    }

    /// Counts, per process, the frames in anonymous executable memory
    /// (JIT code) that its perf map does not name, with why, for the
    /// warning at exit. Addresses in no mapping at all are a walk gone
    /// astray, not JIT code, and are not counted.
    fn note_unnamed(&mut self, places: &[Vec<Place>]) {
        let mut found: HashMap<u32, u64> = HashMap::new();
        for (loc, _, _) in places.iter().flatten() {
            let Loc::Jit(pid, ip) = *loc else { continue };
            if self.in_jit_code(pid, ip)
                && self.jit_symbol(pid, ip).is_none()
                && self.dump_symbol(pid, ip).is_none()
            {
                *found.entry(pid).or_default() += 1;
            }
        }
        for (pid, frames) in found {
            let proc = &self.procs[&pid];
            let (map, shown) = match (&proc.jit_path, self.dumps.get(&pid)) {
                (_, Some(d)) => ("dump", d.shown.clone()),
                (None, None) => ("missing", format!("/tmp/perf-{pid}.map")),
                (Some(j), None) if std::fs::metadata(&j.path).is_err() => {
                    ("missing", j.shown.clone())
                }
                (Some(j), None) if proc.jit_len == 0 => ("empty", j.shown.clone()),
                (Some(j), None) => ("partial", j.shown.clone()),
            };
            let entry = self.unnamed.entry(pid).or_insert_with(|| Unnamed {
                comm: proc.comm.clone(),
                frames: 0,
                map,
                shown,
            });
            entry.frames += frames;
            entry.map = map;
        }
    }
}

/// A frame of JIT code named `name` by a jitdump or a perf map.
fn jit_named(name: &str) -> Frame {
    let kind = if interpreted(name) {
        Kind::Interpreted
    } else {
        Kind::Jit
    };
    Frame::new(name.to_owned(), kind, Some("[jit]"))
}

/// The address looked up for frame `i` of a stack, leaf first: a return
/// address points after its call, and the call itself, one byte back, is
/// in the right function and line even when it is a function's last
/// instruction.
fn call_site(i: usize, ip: u64) -> u64 {
    if i == 0 { ip } else { ip.saturating_sub(1) }
}

/// Whether a perf map's name is an interpreted function's: Python's
/// trampolines (`py::f:file.py`), V8's functions not yet optimized
/// (`JS:~f`, `LazyCompile:~f`) and the JVM's interpreter.
fn interpreted(name: &str) -> bool {
    name.starts_with("py::")
        || name
            .split_once(':')
            .is_some_and(|(_, f)| f.starts_with('~'))
        || name.starts_with("Interpreter")
}

/// The GNU build id of an ELF file, in hex.
fn build_id(file: &File) -> Option<String> {
    use object::Object as _;
    let data = crate::kernel::memory::Mapped::of(file).ok()?;
    let elf = object::File::parse(&*data).ok()?;
    let id = elf.build_id().ok()??;
    Some(id.iter().map(|b| format!("{b:02x}")).collect())
}

/// The kernel's code, as pprof describes it (perf's name for it).
fn kernel_mapping() -> Arc<CodeMapping> {
    static KERNEL: std::sync::OnceLock<Arc<CodeMapping>> = std::sync::OnceLock::new();
    KERNEL
        .get_or_init(|| {
            Arc::new(CodeMapping {
                start: 0xffff_8000_0000_0000,
                limit: u64::MAX,
                offset: 0,
                file: "[kernel.kallsyms]".to_owned(),
                build_id: None,
            })
        })
        .clone()
}

/// `/proc/kallsyms` copied into an anonymous memory file.
fn snapshot_kallsyms() -> std::io::Result<File> {
    // SAFETY: a constant C string; the flags are valid.
    let fd = unsafe { libc::memfd_create(c"rtrace-kallsyms".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor just created and owned by nothing else.
    let mut copy = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    std::io::copy(&mut File::open("/proc/kallsyms")?, &mut copy)?;
    Ok(copy)
}

/// How frames name their places in their code, beside their functions.
#[derive(Debug, Clone, Copy, Default)]
pub struct Places {
    /// `func+0x1a`.
    pub offsets: bool,
    /// `0xffffffff8110a5c1 func`.
    pub addresses: bool,
}

/// The frames one blazesym result stands for: the inlined functions,
/// innermost first, then the function itself; each with its own line
/// where `lines` (blazesym gives each inlined function the line inside
/// it, and the function the line of its call to the first).
fn frames(
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

/// Reads process `pid`'s perf map if it changed since last read. A map
/// that is gone leaves the symbols read before.
fn read_perf_map(pid: u32, proc: &mut Process) {
    if proc.jit_path.is_none() {
        proc.jit_path = perf_map_path(pid);
        proc.comm = std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .ok()
            .map(|c| Arc::from(c.trim_end()));
    }
    let Some(jit) = &proc.jit_path else {
        return;
    };
    let Ok(meta) = std::fs::metadata(&jit.path) else {
        return;
    };
    if meta.len() == proc.jit_len {
        return;
    }
    let Ok(text) = std::fs::read_to_string(&jit.path) else {
        return;
    };
    proc.jit_len = meta.len();
    let mut syms: Vec<JitSymbol> = Vec::new();
    for line in text.lines() {
        let mut f = line.splitn(3, ' ');
        let hex = |s: Option<&str>| {
            let s = s?.trim();
            u64::from_str_radix(s.strip_prefix("0x").unwrap_or(s), 16).ok()
        };
        let (Some(start), Some(size), Some(name)) = (hex(f.next()), hex(f.next()), f.next()) else {
            continue;
        };
        syms.push(JitSymbol {
            start,
            end: start.saturating_add(size),
            name: name.trim_end().to_owned(),
        });
    }
    // A stable sort keeps later lines after earlier ones at the same
    // start; dedup then keeps the later.
    syms.sort_by_key(|s| s.start);
    let mut kept: Vec<JitSymbol> = Vec::with_capacity(syms.len());
    for s in syms {
        match kept.last_mut() {
            Some(last) if last.start == s.start => *last = s,
            _ => kept.push(s),
        }
    }
    proc.jit = kept;
}

/// Where process `pid`'s perf map is: a process in a container names its
/// map by its own pid, in its own /tmp. A process gone before it could be
/// looked at is taken to be in rtrace's /tmp, as perf takes every
/// process; `None` if its root cannot be opened.
fn perf_map_path(pid: u32) -> Option<JitPath> {
    use std::os::unix::fs::MetadataExt as _;
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        let shown = format!("/tmp/perf-{pid}.map");
        return Some(JitPath {
            path: shown.clone(),
            shown,
            _root: None,
        });
    };
    let nspid = status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .and_then(|l| l.split_whitespace().last()?.parse::<u32>().ok())
        .unwrap_or(pid);
    let shown = format!("/tmp/perf-{nspid}.map");
    let root = File::open(format!("/proc/{pid}/root")).ok()?;
    let ours = std::fs::metadata("/").ok()?;
    let theirs = root.metadata().ok()?;
    if (theirs.dev(), theirs.ino()) == (ours.dev(), ours.ino()) {
        return Some(JitPath {
            path: shown.clone(),
            shown,
            _root: None,
        });
    }
    Some(JitPath {
        path: format!("/proc/self/fd/{}/tmp/perf-{nspid}.map", root.as_raw_fd()),
        shown,
        _root: Some(Arc::new(root)),
    })
}

/// Raises the soft limit on open files to the hard one: every distinct
/// mapped file of every sampled process stays open until the report.
fn raise_fd_limit() {
    // SAFETY: getrlimit/setrlimit only read and write the struct given.
    unsafe {
        let mut lim: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    fn marker_function_for_symbolizer_test() -> u64 {
        std::hint::black_box(42)
    }

    #[test]
    fn resolves_own_function_and_kernel_symbol() {
        let mut s = Symbolizer::new();
        let pid = std::process::id();
        s.capture(pid, true);
        let ip = marker_function_for_symbolizer_test as *const () as u64;
        let out = s.symbolize(&[(Some(pid), &[ip])]);
        assert!(
            out[0]
                .iter()
                .any(|f| f.name.contains("marker_function_for_symbolizer_test")),
            "{:?}",
            out[0]
        );
    }

    #[test]
    fn perf_map_later_lines_win() {
        let mut p = Process::default();
        let pid = std::process::id();
        let path = format!("/tmp/perf-{pid}.map");
        std::fs::write(&path, "1000 10 old\n0x2000 0x20 other\n1000 10 new name\n").unwrap();
        read_perf_map(pid, &mut p);
        std::fs::remove_file(&path).unwrap();
        let names: Vec<_> = p
            .jit
            .iter()
            .map(|s| (s.start, s.end, s.name.as_str()))
            .collect();
        assert_eq!(
            names,
            [(0x1000, 0x1010, "new name"), (0x2000, 0x2020, "other")]
        );
    }
}

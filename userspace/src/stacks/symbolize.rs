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
//!
//! This is the front door; the names come from its children by source:
//! `elf` (files), `jit` (jitdumps and perf maps) and `kallsyms` (the
//! kernel), with the frames they make in `frame`. Python frames are
//! named by [`Python`].

use std::{
    collections::{HashMap, HashSet},
    os::fd::AsRawFd as _,
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use blazesym::symbolize::{
    Input, Symbolizer as Blaze,
    source::{Elf, Source},
};

mod elf;
mod frame;
mod jit;
mod kallsyms;
pub mod later;

pub use self::frame::{CodeMapping, Frame, Kind, Places};
use self::{
    elf::{FileId, OpenFile, blaze, frames, raise_fd_limit},
    jit::{Dump, JitSymbol, PerfMap, Unnamed, jit_named},
    kallsyms::{Kallsyms, kernel_mapping},
};
use crate::{
    kernel::{procmaps::Proc, warning::Warning},
    stacks::{java::Java, jitdump, python::Python, v8::V8},
};

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

/// What was captured of one process.
#[derive(Default, Clone)]
struct Process {
    /// Every mapping ever seen, newest last: mappings that have since gone
    /// may still have samples.
    maps: Vec<Mapping>,
    /// What was read of its perf map.
    perf_map: PerfMap,
    /// When the mappings were last read.
    captured: Option<Instant>,
    /// Known only from mappings the kernel found ([`Symbolizer::found`]):
    /// nothing was read of it yet.
    found_only: bool,
}

/// One frame located: where, its address, and its file's mapping.
type Place = (Loc, u64, Option<Arc<CodeMapping>>);

/// Where an address is, before any symbol lookup.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Loc {
    Kernel(u64),
    File(FileId, u64),
    Jit(Proc, u64),
    Named(Proc, usize),
    /// A Python frame: the process, the code object's address and check,
    /// and the instruction's code unit.
    Python(Proc, u64, u32, u32),
    /// An asyncio task's frame: the process, the task's name's address or
    /// its number (`rtrace_common::python::PY_TASK_NUMBER`), and the
    /// name's check.
    PyTask(Proc, u64, u32),
    /// A Java frame: the process and its two slots
    /// (`rtrace_common::java`).
    Java(Proc, u64, u64),
    /// A JavaScript frame: the process and its two slots
    /// (`rtrace_common::v8`).
    V8(Proc, u64, u64),
    /// In a mapping whose file could not be opened.
    Unopened(Proc, usize),
    Unknown,
}

pub(crate) use self::elf::hex;

/// The GNU build id of ELF file `file`, in hex.
pub fn build_id_of(file: &std::fs::File) -> Option<String> {
    elf::build_id(file)
}

/// When the last earlier process of `p`'s pid seen to exit did, of
/// `exits` ([`Symbolizer::ended`]), or 0.
fn earlier_exit(exits: &HashMap<u32, u64>, p: Proc) -> u64 {
    exits
        .get(&p.pid)
        .copied()
        .filter(|&t| p.born != 0 && t < p.born)
        .unwrap_or(0)
}

/// Resolves kernel and user stacks; see the module documentation.
pub struct Symbolizer {
    blaze: Blaze,
    files: HashMap<FileId, OpenFile>,
    /// Files of containers whose resolver, with the container's debug
    /// directories, `blaze` was given.
    rooted: std::collections::HashSet<FileId>,
    /// What was captured of each process: a pid's later process is
    /// another entry, never what an earlier one left.
    procs: HashMap<Proc, Process>,
    /// See [`Symbolizer::recapture_every`].
    recapture: Duration,
    /// See [`Symbolizer::with_lines`].
    lines: bool,
    /// See [`Symbolizer::with_demangling`].
    demangle: bool,
    /// See [`Symbolizer::with_places`].
    places: Places,
    /// The copy of kallsyms kernel frames are named from.
    kallsyms: Kallsyms,
    /// Files whose frames could not be resolved, and why: their frames
    /// show as `[unknown]`, which the user is told of.
    failures: std::collections::BTreeMap<String, String>,
    /// Processes with JIT frames that their perf map did not name.
    unnamed: std::collections::BTreeMap<Proc, Unnamed>,
    /// Jitdump files by the process that maps them.
    dumps: HashMap<Proc, Dump>,
    /// The CLOCK_MONOTONIC time JIT code is looked up at in jitdumps (see
    /// [`Symbolizer::jit_time`]); `None` takes the newest code.
    jit_time: Option<u64>,
    /// What the dumps of processes forgotten held, and their warnings.
    gone_dumps: Vec<(String, Option<Warning>)>,
    /// The Python processes and the names of their code.
    python: Python,
    /// The JVM processes and the names of their methods.
    java: Java,
    v8: V8,
    /// The pprof file the run writes, which `rtrace report` names JIT
    /// frames from once their maps are written.
    pprof: Option<String>,
    /// When the last process of each pid seen to exit did (boot-time
    /// nanoseconds): a map at the pid's path written by then is not the
    /// next process's ([`Symbolizer::ended`]).
    exits: HashMap<u32, u64>,
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

impl Symbolizer {
    /// A symbolizer with demangling, line info and inlined functions on.
    pub fn new() -> Self {
        raise_fd_limit();
        Self {
            blaze: blaze(true),
            files: HashMap::new(),
            rooted: Default::default(),
            procs: HashMap::new(),
            recapture: RECAPTURE,
            lines: false,
            demangle: true,
            places: Places::default(),
            kallsyms: Kallsyms::default(),
            failures: std::collections::BTreeMap::new(),
            exits: HashMap::new(),
            unnamed: std::collections::BTreeMap::new(),
            dumps: HashMap::new(),
            jit_time: None,
            gone_dumps: Vec::new(),
            python: Python::default(),
            java: Java::default(),
            v8: V8::default(),
            pprof: None,
        }
    }

    /// What `-v` says of the Python processes found.
    pub fn python_summary(&self) -> Vec<String> {
        self.python.summary()
    }

    /// What `-v` says of the JVM processes found.
    pub fn java_summary(&self) -> Vec<String> {
        self.java.summary()
    }

    /// `-v` lines: the V8s found.
    pub fn v8_summary(&self) -> Vec<String> {
        self.v8.summary()
    }

    /// The processes that run V8, whose JavaScript frames the kernel
    /// walks, and the names of their functions.
    pub fn v8(&mut self) -> &mut V8 {
        &mut self.v8
    }

    /// The JVM processes, whose frames the kernel walks, and the names of
    /// their methods.
    pub fn java(&mut self) -> &mut Java {
        &mut self.java
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
        for (p, u) in self.unnamed.iter().take(SHOWN) {
            // A process whose JavaScript or Java frames the walk named
            // needs no perf map: what is left is the runtime's code that is
            // no frame of its language, or samples from before the walk
            // was loaded or given the process.
            let runtime = if self.v8.walked(*p) {
                Some((
                    "V8's JIT code",
                    "code that is no JavaScript function's (regular expressions, stubs) or a \
                     function in its prologue, or samples taken before the walk through \
                     JavaScript frames was loaded",
                ))
            } else if self.java.walked(*p) {
                Some((
                    "the JVM's code cache",
                    "samples taken before the walk through Java frames was loaded or had \
                     read this JVM (its later samples name them)",
                ))
            } else {
                None
            };
            if let Some((code, why)) = runtime {
                let comm = u
                    .comm
                    .as_deref()
                    .map(|c| format!(" ({c})"))
                    .unwrap_or_default();
                out.push(Warning::unnamed(format!(
                    "PID {}{comm}: {} frames in {code} unnamed: {why}",
                    p.pid, u.frames
                )));
                continue;
            }
            out.push(u.warning(*p, self.pprof.as_deref()));
        }
        out.extend(self.python.warnings());
        out.extend(self.java.warnings());
        out.extend(self.v8.warnings());
        out.extend(self.gone_dumps.iter().filter_map(|(_, w)| w.clone()));
        out.extend(self.dumps.iter().filter_map(|(p, d)| d.warning(p.pid)));
        if self.unnamed.len() > SHOWN {
            out.push(Warning::unnamed(format!(
                "and JIT frames of {} other processes are unnamed",
                self.unnamed.len() - SHOWN
            )));
        }
        out
    }

    /// Reads process `p`'s perf map for the last time, as it has exited
    /// (or was found gone): it wrote it as it exited, and what is at its
    /// path from now on is a later process's of its pid.
    pub fn exited(&mut self, p: Proc) {
        self.exited_at(p, 0);
    }

    /// [`Symbolizer::exited`], with the moment of the exit where the
    /// kernel told it (boot-time nanoseconds; 0: not known).
    fn exited_at(&mut self, p: Proc, at: u64) {
        if let Some(proc) = self.procs.get_mut(&p) {
            proc.perf_map.close(p, at);
        }
        if let Some(d) = self.dumps.get_mut(&p) {
            d.read_more();
        }
    }

    /// Process `p` exited at `at` (boot-time nanoseconds, the kernel's
    /// precise clock): its perf map is read for the last time, and a map
    /// at its path last written by then is not its pid's next process's,
    /// however close that one's start (file times lag by a tick or two).
    pub fn ended(&mut self, p: Proc, at: u64) {
        self.exited_at(p, at);
        if at == 0 {
            return;
        }
        self.exits.insert(p.pid, at);
        // Only an exit a moment before a process's start can tell its map
        // apart (older maps are told by their time): a long build's
        // exits are not all kept.
        if self.exits.len() > 4096 {
            self.exits.retain(|_, t| *t + 1_000_000_000 > at);
        }
    }

    /// Reads every known process's perf map again if it changed, at the
    /// end of a run.
    pub fn read_all_jit(&mut self) {
        for (&p, proc) in &mut self.procs {
            proc.perf_map.read(p, earlier_exit(&self.exits, p));
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
    pub fn timed_dumps(&self) -> HashSet<Proc> {
        self.dumps
            .iter()
            .filter(|(_, d)| d.dump.timed())
            .map(|(&p, _)| p)
            .collect()
    }

    /// What each jitdump read holds, for `-v`.
    pub fn dump_summary(&self) -> Vec<String> {
        let mut procs: Vec<&Proc> = self.dumps.keys().collect();
        procs.sort_unstable();
        let live = procs.into_iter().map(|p| self.dumps[p].summary(p.pid));
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

    /// Notes the pprof file the run writes (`--pprof`): the warning of
    /// JIT frames whose map is written at exit says it names them later.
    pub fn names_later_in(&mut self, pprof: Option<String>) {
        self.pprof = pprof;
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
    /// [`demangle::ocaml`](crate::stacks::demangle::ocaml).
    pub fn with_demangling(&mut self, on: bool) {
        if on != self.demangle {
            self.demangle = on;
            self.blaze = blaze(on);
            self.rooted.clear();
        }
    }

    /// Sets how long a process's mappings are trusted before its next new
    /// stack reads them again. A caller that is told when a process maps
    /// new code (the CFI walk is) and captures then with `force` needs
    /// the timer only as a safety net.
    pub fn recapture_every(&mut self, every: Duration) {
        self.recapture = every;
    }

    /// Captures process `p`'s executable mappings and perf map, or
    /// refreshes them: the perf map whenever it has grown, which costs a
    /// `stat`, and the mappings if they were read more than a moment ago
    /// (or `force`). A process that is gone, or whose pid another process
    /// has now, is left as last captured.
    pub fn capture(&mut self, p: Proc, force: bool) {
        let pid = p.pid;
        if pid == 0 {
            return;
        }
        if let Some(proc) = self.procs.get_mut(&p) {
            proc.found_only = false;
        }
        let exit = earlier_exit(&self.exits, p);
        if !force
            && let Some(proc) = self.procs.get_mut(&p)
            && proc.captured.is_some_and(|t| t.elapsed() < self.recapture)
        {
            // A JIT names new code in its map before running it, so the
            // first sample of that code is the moment to read the map,
            // however recently the mappings were read.
            proc.perf_map.read(p, exit);
            return;
        }
        // Once for the maps and every file they name: a look at a
        // thread's state for each would add up in a JVM's hundreds.
        let dir = crate::kernel::procmaps::proc_dir(pid);
        let maps = std::fs::read_to_string(format!("{dir}/maps"));
        // Read before the check: a process that took the pid after the
        // check would otherwise lend its mappings.
        let Some(maps) = maps.ok().filter(|_| p.alive()) else {
            // Gone before it was ever read: its perf map, named by its pid,
            // may still name its JIT code (written at exit, or as it ran),
            // if it is not older than the process.
            self.procs.entry(p).or_default().perf_map.read(p, exit);
            return;
        };
        let mut found = Vec::new();
        for line in maps.lines() {
            if let Some(m) = self.parse_mapping(&dir, line) {
                found.push(m);
            }
        }
        self.find_dump(p, &found);
        let proc = self.procs.entry(p).or_default();
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
        proc.perf_map.read(p, exit);
    }

    /// Notes that process `who` ran a new program: what was captured of
    /// the old one (inherited at fork, or read before) no longer says what
    /// its addresses mean, so its mappings are read again at once and its
    /// JIT files looked for afresh.
    pub fn exec(&mut self, who: Proc) {
        if let Some(p) = self.procs.get_mut(&who) {
            // The samples before the exec (a shell's or a build's child
            // between fork and exec) are named by the old program's
            // mappings, one program back, where the new one's hold
            // nothing.
            p.maps.retain(|m| !m.before_exec);
            for m in &mut p.maps {
                m.before_exec = true;
            }
            p.captured = None;
            p.perf_map.clear();
        }
        self.close_dump(who);
        self.capture(who, true);
    }

    /// Notes a mapping of process `p` that the kernel found itself
    /// (from `start` to `end`, of file offset `offset`, of the file the
    /// kernel names `dev` (its `s_dev`) and `ino`): the frames in it are
    /// named from it if the process is gone before its maps are read. The
    /// file is known by what any process mapped of it; until then its
    /// frames have no name.
    pub fn found(&mut self, p: Proc, start: u64, end: u64, offset: u64, dev: u32, ino: u64) {
        let id = (libc::makedev(dev >> 20, dev & 0xf_ffff), ino);
        let proc = self.procs.entry(p).or_insert_with(|| Process {
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

    /// Notes a mapping of process `p` that a recording (perf.data) holds:
    /// from `start` to `end`, of file offset `offset`, of the file the
    /// recording names `name`, opened by the caller (checked against the
    /// recorded build id) or the reason it was not. Nothing is read of
    /// the process's own `/proc`: it is another time, maybe another host.
    pub fn recorded_map(
        &mut self,
        p: Proc,
        (start, end, offset): (u64, u64, u64),
        name: &str,
        file: Result<std::fs::File, String>,
    ) {
        // perf names anonymous memory (JIT code) `//anon`; /proc leaves
        // it nameless, which is how JIT code is told here.
        let name = if name.starts_with("//anon") || name.starts_with("[anon") {
            ""
        } else {
            name
        };
        // A JIT's dump, mapped executable for perf to find: its records
        // name the process's JIT code, as perf inject --jit would.
        // Under the owner rule: a dump last written before the process
        // started is an earlier process's of the same pid.
        if jitdump::dump_pid(name).is_some() {
            if let Ok(f) = file
                && !self.dumps.contains_key(&p)
                && f.metadata()
                    .ok()
                    .and_then(|m| jit::mtime_ns(&m))
                    .is_none_or(|at| jit::written_after(at, p.born_wall_ns()))
            {
                self.dumps.insert(p, Dump::open(f, name));
            }
            return;
        }
        let (file, unopened) = match file {
            Ok(f) => match elf::adopt(&mut self.files, f, name) {
                Ok(id) => (Some(id), None),
                Err(e) => (None, Some(Arc::from(format!("cannot read it: {e}")))),
            },
            Err(why) if name.starts_with('[') || name.is_empty() => {
                let _ = why;
                (None, None)
            }
            Err(why) => (None, Some(Arc::from(why))),
        };
        let code = file.map(|id| {
            Arc::new(CodeMapping {
                start,
                limit: end,
                offset,
                file: name.to_owned(),
                build_id: self.files.get(&id).and_then(|f| f.build_id.clone()),
            })
        });
        let proc = self.procs.entry(p).or_default();
        proc.captured = Some(Instant::now());
        proc.maps.push(Mapping {
            start,
            end,
            offset,
            file,
            name: name.to_owned(),
            code,
            unopened,
            before_exec: false,
        });
    }

    /// Notes that recorded process `child` was forked from `parent`: it
    /// starts with its parent's mappings, and its own perf map.
    pub fn recorded_fork(&mut self, child: Proc, parent: Proc) {
        let mut p = self.procs.get(&parent).cloned().unwrap_or_default();
        p.perf_map = p.perf_map.for_child(child);
        p.captured = Some(Instant::now());
        self.procs.insert(child, p);
    }

    /// Notes that recorded process `p` ran a new program: its earlier
    /// mappings name only what no new mapping holds.
    pub fn recorded_exec(&mut self, p: Proc) {
        if let Some(proc) = self.procs.get_mut(&p) {
            proc.maps.retain(|m| !m.before_exec);
            for m in &mut proc.maps {
                m.before_exec = true;
            }
            proc.perf_map.clear();
        }
    }

    /// Reads recorded process `p`'s perf map, under the owner rule: not
    /// older than the process, and, where a later process of the same pid
    /// started at `successor` (nanoseconds since the epoch), not written
    /// after that (it is the later one's).
    pub fn recorded_perf_map(&mut self, p: Proc, successor: Option<u64>) {
        self.procs
            .entry(p)
            .or_default()
            .perf_map
            .read_recorded(p, successor);
    }

    /// Whether anything was captured of process `p`.
    pub fn knows(&self, p: Proc) -> bool {
        self.procs.get(&p).is_some_and(|p| !p.found_only)
    }

    /// Gives process `child`, just forked from `parent`, what was captured
    /// of its parent: it runs the same code at the same addresses until it
    /// runs a program of its own, and may be gone before its own maps
    /// could be read. Without a capture of the parent, the child's own is
    /// read.
    pub fn inherit(&mut self, child: Proc, parent: Proc) {
        match self.procs.get(&parent) {
            Some(p) => {
                let mut p = p.clone();
                p.perf_map = p.perf_map.for_child(child);
                self.procs.insert(child, p);
            }
            None => self.capture(child, false),
        }
    }

    /// Starts copying `/proc/kallsyms` on another thread. Reading it takes
    /// the kernel about 50 ms, which the report would otherwise wait for;
    /// a tool calls this once its own programs are loaded, as their names
    /// are in it.
    pub fn prefetch_kernel(&mut self) {
        self.kallsyms.prefetch();
    }

    /// Takes a new copy of `/proc/kallsyms` at the next kernel lookup if
    /// modules were loaded or unloaded, or BPF programs loaded, since the
    /// last copy began.
    pub fn refresh_kernel(&mut self) {
        self.kallsyms.refresh();
    }

    /// Closes the files no known process maps any more, and drops what
    /// blazesym parsed of them: for a symbolizer that runs for days (the
    /// exporter's profile) beside processes that come and go, each with
    /// files of its own (a build's compilers, its test binaries), so that
    /// what it holds follows the files in use, not every file ever seen.
    /// Returns how many were closed.
    pub fn close_unused_files(&mut self) -> usize {
        let used: std::collections::HashSet<FileId> = self
            .procs
            .values()
            .flat_map(|p| p.maps.iter().filter_map(|m| m.file))
            .collect();
        let unused: Vec<FileId> = self
            .files
            .keys()
            .filter(|id| !used.contains(id))
            .copied()
            .collect();
        for id in &unused {
            self.rooted.remove(id);
            if let Some(open) = self.files.remove(id) {
                let path = PathBuf::from(format!("/proc/self/fd/{}", open.file.as_raw_fd()));
                let evict = blazesym::symbolize::evict::Evict::Elf(
                    blazesym::symbolize::evict::Elf::new(path),
                );
                let _ = self.blaze.evict(&evict);
            }
        }
        unused.len()
    }

    /// Drops what was captured of process `p`, once its stacks are
    /// symbolized and it is gone.
    pub fn forget(&mut self, p: Proc) {
        self.procs.remove(&p);
        self.close_dump(p);
    }

    /// Closes process `p`'s jitdump, keeping what `-v` and the warnings
    /// say of it.
    fn close_dump(&mut self, p: Proc) {
        if let Some(d) = self.dumps.remove(&p) {
            self.gone_dumps.push((d.summary(p.pid), d.warning(p.pid)));
        }
    }

    /// Opens and reads the jitdump among a process's executable mappings,
    /// if it maps one and it is not open yet: a runtime maps its dump's
    /// first page executable for perf to find it. The file was opened
    /// with the mapping, through `map_files`, so a dump deleted since is
    /// still read.
    fn find_dump(&mut self, p: Proc, found: &[Mapping]) {
        if self.dumps.contains_key(&p) {
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
        self.dumps.insert(p, Dump::open(file, name));
    }

    /// Parses one line of the `maps` in `dir` (a process's
    /// [`proc_dir`](crate::kernel::procmaps::proc_dir)), keeping executable
    /// mappings and opening their files.
    fn parse_mapping(&mut self, dir: &str, line: &str) -> Option<Mapping> {
        let m = crate::kernel::procmaps::Mapping::parse(line)?;
        if !m.exec {
            return None;
        }
        let (file, unopened) = match m
            .path()
            .map(|path| elf::open(&mut self.files, dir, &m, path))
        {
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
        elf::know(&mut self.files, path);
    }

    /// Symbolizes stacks, each leaf first, with `pid` `None` for kernel
    /// stacks. Every address is looked up once, with one lookup per file.
    ///
    /// Frames come back leaf first, inlined functions before the function
    /// they were inlined into.
    pub fn symbolize(&mut self, stacks: &[(Option<Proc>, &[u64])]) -> Vec<Vec<Frame>> {
        // Each address where it is (its call site: `call_site`), with its
        // mapping, for pprof.
        let places: Vec<Vec<Place>> = stacks
            .iter()
            .map(|(pid, ips)| {
                let mut out = Vec::with_capacity(ips.len());
                let mut i = 0;
                while i < ips.len() {
                    let ip = ips[i];
                    if let Some(pid) = pid
                        && let Some((loc, addr)) = runtime_frame(*pid, ips, i)
                    {
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
            self.kallsyms.symbolize(&self.blaze, &kernel)
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
            // A container's file: its debug files are in its root. One
            // symbolized before its root was known (for a host process
            // too) has blazesym's default resolver cached: it goes first.
            if let Some(dirs) = open.debug_dirs()
                && self.rooted.insert(id)
                && let Ok(r) = blazesym::helper::ElfResolver::open_with_debug_dirs(&path, dirs)
            {
                let evict = blazesym::symbolize::evict::Evict::Elf(
                    blazesym::symbolize::evict::Elf::new(path.clone()),
                );
                let _ = self.blaze.evict(&evict);
                let _ = self.blaze.register_elf_resolver(&path, std::rc::Rc::new(r));
            }
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
                            Loc::PyTask(pid, v, check) => vec![self.task_frame(pid, v, check)],
                            Loc::Java(pid, first, second) => self.java_frames(pid, first, second),
                            Loc::V8(pid, first, second) => self.v8_frames(pid, first, second),
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
    fn locate(&self, pid: Proc, ip: u64) -> (Loc, Option<Arc<CodeMapping>>) {
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
    fn jit_symbol(&self, pid: Proc, ip: u64) -> Option<&JitSymbol> {
        self.procs.get(&pid)?.perf_map.symbol(ip)
    }

    /// Whether every frame of user stack `ips` of `pid` (leaf first) that
    /// is in JIT code is named, by the jitdump or the perf map.
    pub fn names_all_jit(&self, pid: Proc, ips: &[u64]) -> bool {
        ips.iter().enumerate().all(|(i, &ip)| {
            let ip = call_site(i, ip);
            !self.in_jit_code(pid, ip)
                || self.dump_symbol(pid, ip).is_some()
                || self.jit_symbol(pid, ip).is_some()
        })
    }

    /// Whether `ip` of `pid` is in anonymous executable memory, JIT code.
    /// Addresses in no mapping at all are a walk gone astray.
    fn in_jit_code(&self, pid: Proc, ip: u64) -> bool {
        self.procs.get(&pid).is_some_and(|p| {
            p.maps
                .iter()
                .any(|m| m.name.is_empty() && (m.start..m.end).contains(&ip))
        })
    }

    /// The code at `ip` of `pid` by its jitdump, at the time set by
    /// [`Symbolizer::jit_time`].
    fn dump_symbol(&self, pid: Proc, ip: u64) -> Option<jitdump::JitSymbol<'_>> {
        let dump = &self.dumps.get(&pid)?.dump;
        match self.jit_time {
            Some(t) => dump.lookup(ip, t),
            None => dump.lookup_latest(ip),
        }
    }

    /// The JIT code at `ip` of `pid` by its jitdump, else its perf map, or
    /// `[unknown]`.
    fn jit_frame(&self, pid: Proc, ip: u64) -> Frame {
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
            // Its module is the file that would name it, as perf has it:
            // `rtrace report` names it from there once it is written.
            None if self.in_jit_code(pid, ip) => {
                Frame::unknown(Kind::User, Some(&self.jit_file(pid)))
            }
            None => Frame::unknown(Kind::User, None),
        }
    }

    /// The file that names process `p`'s JIT code, as the process names
    /// it: its jitdump, else its perf map.
    fn jit_file(&self, p: Proc) -> String {
        match (self.dumps.get(&p), self.procs.get(&p)) {
            (Some(d), _) => d.shown.clone(),
            (None, Some(proc)) => proc.perf_map.why_unnamed(p.pid).1,
            (None, None) => format!("/tmp/perf-{}.map", p.pid),
        }
    }

    /// A Python frame: `module.qualname`, in its file, with its line
    /// under `--lines`; `[python]` if its code object could not be read.
    fn python_frame(&mut self, pid: Proc, addr: u64, check: u32, lasti: u32) -> Frame {
        let Some(n) = self.python.name(pid, addr, check) else {
            return Frame::new("[python]", Kind::Interpreted, None);
        };
        let mut frame = Frame::new(Arc::clone(&n.name), Kind::Interpreted, None);
        frame.module = Some(Arc::clone(&n.file));
        if self.lines {
            frame.line = self
                .python
                .line(&n, lasti)
                .map(|l| Arc::from(format!("{}:{l}", n.file)));
        }
        frame
    }

    /// Names now the Python, Java and JavaScript frames of user stack
    /// `ips` of process `who`, while it lives and their code is where its
    /// walk found it: the names are kept for its stacks, symbolized later.
    /// (A Python code object is read by user space, which needs the right
    /// to read the process's memory; the kernel copies those it tells of.)
    pub fn name_runtime_frames(&mut self, who: Proc, ips: &[u64]) {
        let mut i = 0;
        while i < ips.len() {
            match runtime_frame(who, ips, i) {
                Some((Loc::Java(p, first, second), _)) => {
                    self.java.frames(p, first, second);
                }
                Some((Loc::V8(p, first, second), _)) => {
                    self.v8.frames(p, first, second);
                }
                Some((Loc::Python(p, addr, check, _), _)) => {
                    self.python.read_now(p, addr, check);
                }
                Some(_) => {}
                None => {
                    i += 1;
                    continue;
                }
            }
            i += 2;
        }
    }

    /// A Java frame: its method (and those inlined at its pc, first),
    /// named as Java users read them, in its source file, with its line
    /// under `--lines`.
    fn java_frames(&mut self, pid: Proc, first: u64, second: u64) -> Vec<Frame> {
        use super::java::JavaKind;
        self.java
            .frames(pid, first, second)
            .into_iter()
            .map(|j| {
                let kind = match j.kind {
                    JavaKind::Interpreted => Kind::Interpreted,
                    JavaKind::Inlined => Kind::Inlined,
                    JavaKind::Compiled | JavaKind::Native | JavaKind::Stub | JavaKind::Unknown => {
                        Kind::Jit
                    }
                };
                let mut frame = Frame::new(j.name, kind, None);
                frame.module = j.file.clone();
                if let (Some(file), Some(line)) = (&j.file, j.line) {
                    frame.line = Some(Arc::from(format!("{file}:{line}")));
                }
                frame
            })
            .collect()
    }

    /// A JavaScript frame: its function (and those inlined at its pc,
    /// first), named as Node's profiler and Chrome's DevTools show it
    /// (`name (file:line)`, the line being the function's first, or
    /// where the frame was under `--lines`), in its script, interpreted,
    /// compiled or inlined.
    fn v8_frames(&mut self, pid: Proc, first: u64, second: u64) -> Vec<Frame> {
        use super::v8::V8Kind;
        self.v8
            .frames(pid, first, second)
            .into_iter()
            .map(|j| {
                let kind = match j.kind {
                    V8Kind::Interpreted => Kind::Interpreted,
                    V8Kind::Inlined => Kind::Inlined,
                    V8Kind::Compiled | V8Kind::Unknown => Kind::Jit,
                };
                let mut frame = Frame::new(j.name, kind, None);
                frame.module = j.file.clone();
                // Always, not only under `--lines`: where a function is
                // tells apart the many that share a name (`(anonymous)`).
                frame.line = match (&j.file, j.line) {
                    (Some(file), Some(line)) => Some(Arc::from(format!("{file}:{line}"))),
                    (Some(file), None) => Some(Arc::clone(file)),
                    _ => None,
                };
                frame
            })
            .collect()
    }

    /// An asyncio task's frame: `[task: NAME]`, `[task: Task-N]` for a
    /// task the program did not name, `[task]` if its name could not be
    /// read.
    fn task_frame(&mut self, pid: Proc, v: u64, check: u32) -> Frame {
        use rtrace_common::python::PY_TASK_NUMBER;
        let name = if v & PY_TASK_NUMBER != 0 {
            Some(Arc::from(format!("Task-{}", v & !PY_TASK_NUMBER)))
        } else {
            self.python.task_name(pid, v, check)
        };
        let name = match name {
            Some(n) => format!("[task: {n}]"),
            None => "[task]".to_owned(),
        };
        Frame::new(name, Kind::Interpreted, None)
    }

    /// Counts, per process, the frames in anonymous executable memory
    /// (JIT code) that its perf map does not name, with why, for the
    /// warning at exit. Addresses in no mapping at all are a walk gone
    /// astray, not JIT code, and are not counted.
    fn note_unnamed(&mut self, places: &[Vec<Place>]) {
        let mut found: HashMap<Proc, u64> = HashMap::new();
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
            let (map, shown) = match self.dumps.get(&pid) {
                Some(d) => ("dump", d.shown.clone()),
                None => proc.perf_map.why_unnamed(pid.pid),
            };
            let entry = self.unnamed.entry(pid).or_insert_with(|| Unnamed {
                comm: proc.perf_map.comm.clone(),
                frames: 0,
                map,
                shown,
            });
            entry.frames += frames;
            entry.map = map;
        }
    }
}

/// The address looked up for frame `i` of a stack, leaf first: a return
/// address points after its call, and the call itself, one byte back, is
/// in the right function and line even when it is a function's last
/// instruction.
fn call_site(i: usize, ip: u64) -> u64 {
    if i == 0 { ip } else { ip.saturating_sub(1) }
}

/// The frame of a runtime (Python, Java, JavaScript, an asyncio task)
/// that starts at `ips[i]` of a user stack of process `pid`, which takes
/// two slots, and the address it is at; `None` for a native frame.
fn runtime_frame(pid: Proc, ips: &[u64], i: usize) -> Option<(Loc, u64)> {
    let ip = *ips.get(i)?;
    let more = *ips.get(i + 1)?;
    if rtrace_common::python::is_py_frame(ip) {
        let addr = ip & rtrace_common::python::PY_ADDR_MASK;
        return Some((
            Loc::Python(pid, addr, (more >> 32) as u32, more as u32),
            addr,
        ));
    }
    if rtrace_common::java::is_java_frame(ip) {
        return Some((
            Loc::Java(pid, ip, more),
            ip & rtrace_common::java::JAVA_ADDR_MASK,
        ));
    }
    if rtrace_common::v8::is_v8_frame(ip) {
        return Some((Loc::V8(pid, ip, more), ip & rtrace_common::v8::V8_ADDR_MASK));
    }
    if rtrace_common::python::is_py_task(ip) {
        let v = ip & rtrace_common::python::PY_ADDR_MASK;
        return Some((Loc::PyTask(pid, v, (more >> 32) as u32), 0));
    }
    None
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
        let pid = Proc::now(std::process::id());
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

    /// A process's files stay open while it is known, and are closed once
    /// it is forgotten; naming it again opens them again.
    #[test]
    fn files_no_process_maps_are_closed() {
        let mut s = Symbolizer::new();
        let pid = Proc::now(std::process::id());
        s.capture(pid, true);
        let ip = marker_function_for_symbolizer_test as *const () as u64;
        let named = |s: &mut Symbolizer| {
            s.symbolize(&[(Some(pid), &[ip])])[0]
                .iter()
                .any(|f| f.name.contains("marker_function_for_symbolizer_test"))
        };
        assert!(named(&mut s));
        assert_eq!(s.close_unused_files(), 0, "files of a known process");
        s.forget(pid);
        assert!(s.close_unused_files() > 0, "no file closed");
        assert!(s.files.is_empty());
        s.capture(pid, true);
        assert!(named(&mut s));
    }
}

//! Names of JIT code: from the runtime's jitdump (`jit-PID.dump`, read
//! by [`jitdump`](crate::stacks::jitdump)) and from its perf map
//! (`/tmp/perf-PID.map`), which also names interpreted functions; and why
//! JIT frames were left unnamed.

use std::{
    fs::File,
    os::{fd::AsRawFd as _, unix::fs::MetadataExt as _},
    sync::Arc,
};

use super::frame::{Frame, Kind};
use crate::{
    kernel::{procmaps::Proc, warning::Warning},
    stacks::jitdump::JitDump,
};

/// A symbol of a perf map.
#[derive(Clone)]
pub(super) struct JitSymbol {
    start: u64,
    end: u64,
    pub(super) name: String,
}

/// What was read of a process's perf map.
#[derive(Default, Clone)]
pub(super) struct PerfMap {
    /// Its symbols, sorted by start; later lines win, as perf has it, so
    /// a range rewritten by the JIT gets its newest name.
    syms: Vec<JitSymbol>,
    /// Its size when last read.
    len: u64,
    /// Where it is, found once while the process lives: it is looked at
    /// on every new stack of the process, and read once more when the
    /// process exits or the run ends.
    path: Option<JitPath>,
    /// The process's command, for warnings.
    pub(super) comm: Option<Arc<str>>,
    /// Read for the last time, as its process exited: what is at its
    /// path later is another process's.
    closed: bool,
    /// At its process's exit, the map had already been rewritten by the
    /// pid's next process: what it wrote as it exited was lost.
    rewritten: bool,
}

impl PerfMap {
    /// Reads process `p`'s perf map if it changed since last read. A map
    /// that is gone leaves the symbols read before; one older than the
    /// process is an earlier process's of the same pid, and is not read,
    /// nor is one last written by `earlier_exit` (boot-time nanoseconds,
    /// 0: none seen), when an earlier process of the pid was seen to exit.
    pub(super) fn read(&mut self, p: Proc, earlier_exit: u64) {
        self.read_until(p, earlier_exit, 0);
    }

    /// [`PerfMap::read`], for process `p` that exited at `exit`
    /// (boot-time nanoseconds; 0: not known, or still running).
    fn read_until(&mut self, p: Proc, earlier_exit: u64, exit: u64) {
        if self.path.is_none() {
            let pid = p.pid;
            let alive = p.alive();
            self.path = perf_map_path(pid, alive);
            if alive {
                self.comm = crate::kernel::comm_of(pid).map(Arc::from);
            }
        }
        let Some(jit) = &self.path else {
            return;
        };
        if self.closed {
            return;
        }
        let Ok(meta) = std::fs::metadata(&jit.path) else {
            return;
        };
        if meta.len() == self.len || !written_by(&meta, p, earlier_exit) {
            return;
        }
        if !p.alive() && written_since_gone(&meta, p, exit) {
            self.rewritten = true;
            return;
        }
        let Ok(text) = std::fs::read_to_string(&jit.path) else {
            return;
        };
        self.len = meta.len();
        self.syms = parse_perf_map(&text);
    }

    /// Reads the map of recorded process `p` once: at `/tmp/perf-PID.map`
    /// as perf looks for it, if written since the process started and,
    /// where a later process of its pid started at `successor`
    /// (nanoseconds since the epoch), not since then.
    pub(super) fn read_recorded(&mut self, p: Proc, successor: Option<u64>) {
        if self.closed {
            return;
        }
        self.closed = true;
        let path = format!("/tmp/perf-{}.map", p.pid);
        let Ok(meta) = std::fs::metadata(&path) else {
            return;
        };
        let later = successor
            .zip(mtime_ns(&meta))
            .is_some_and(|(next, at)| at > next + crate::kernel::procmaps::mtime_slack_ns());
        if !written_by(&meta, p, 0) || later {
            return;
        }
        if let Ok(text) = std::fs::read_to_string(&path) {
            self.len = meta.len();
            self.syms = parse_perf_map(&text);
        }
        self.path = Some(JitPath::in_our_tmp(path));
    }

    /// The symbol at `ip`.
    pub(super) fn symbol(&self, ip: u64) -> Option<&JitSymbol> {
        symbol_at(&self.syms, ip)
    }

    /// Reads the map one last time, as its process has exited (at `exit`,
    /// boot-time nanoseconds, or found gone: 0): a later process given
    /// the pid writes its own there.
    pub(super) fn close(&mut self, p: Proc, exit: u64) {
        self.read_until(p, 0, exit);
        self.closed = true;
    }

    /// What a child just forked from this process starts with: its own
    /// map's path, nothing read of it yet.
    pub(super) fn for_child(&self, child: Proc) -> Self {
        Self {
            syms: Vec::new(),
            len: 0,
            path: perf_map_path(child.pid, child.alive()),
            comm: self.comm.clone(),
            closed: false,
            rewritten: false,
        }
    }

    /// Forgets the map of a program the process no longer runs: the next
    /// read looks for it afresh.
    pub(super) fn clear(&mut self) {
        self.syms.clear();
        self.len = 0;
        self.path = None;
        self.closed = false;
        self.rewritten = false;
    }

    /// Why JIT frames of process `pid` that it did not name are unnamed
    /// (`missing`, `empty`, `rewritten` or `partial`), and the
    /// map's path as the process names it.
    pub(super) fn why_unnamed(&self, pid: u32) -> (&'static str, String) {
        match &self.path {
            None => ("missing", format!("/tmp/perf-{pid}.map")),
            Some(j) if self.rewritten => ("rewritten", j.shown.clone()),
            Some(j) if std::fs::metadata(&j.path).is_err() => ("missing", j.shown.clone()),
            Some(j) if self.len == 0 => ("empty", j.shown.clone()),
            Some(j) => ("partial", j.shown.clone()),
        }
    }
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

impl JitPath {
    /// `path` in rtrace's own root, where it is also shown.
    fn in_our_tmp(path: String) -> Self {
        Self {
            shown: path.clone(),
            path,
            _root: None,
        }
    }
}

/// The symbols of a perf map's text (`START SIZE name` lines, in hex),
/// sorted by start; later lines win, as perf has it, so a range
/// rewritten by the JIT gets its newest name.
pub(super) fn parse_perf_map(text: &str) -> Vec<JitSymbol> {
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
    kept
}

/// The symbol of `syms` (sorted by start) at `ip`.
pub(super) fn symbol_at(syms: &[JitSymbol], ip: u64) -> Option<&JitSymbol> {
    let i = syms.partition_point(|s| s.start <= ip);
    i.checked_sub(1).map(|i| &syms[i]).filter(|s| ip < s.end)
}

/// Whether the file of `meta` (a perf map) may be process `p`'s: it was
/// last written after the process started (to the coarse clock's tick
/// that stamps files), and after `earlier_exit`, the exit of an earlier
/// process of the pid where one was seen (boot-time nanoseconds, 0:
/// none; [`written_after_exit`]). One written before is an earlier
/// process's that had the pid, and names none of this one's code. A
/// process of unknown start is given any.
fn written_by(meta: &std::fs::Metadata, p: Proc, earlier_exit: u64) -> bool {
    mtime_ns(meta).is_none_or(|at| {
        written_after(at, p.born_wall_ns()) && written_after_exit(at, earlier_exit)
    })
}

/// When the file of `meta` was last written, in nanoseconds since the
/// epoch.
pub(super) fn mtime_ns(meta: &std::fs::Metadata) -> Option<u64> {
    let t = meta.modified().ok()?;
    Some(t.duration_since(std::time::UNIX_EPOCH).ok()?.as_nanos() as u64)
}

/// Whether a file last written at `at` (nanoseconds since the epoch) was
/// written after a process that started at `started` (0: unknown, then
/// it may be) started, to the coarse clock's tick that stamps files.
pub(super) fn written_after(at: u64, started: u64) -> bool {
    started == 0 || at + crate::kernel::procmaps::mtime_slack_ns() >= started
}

/// Whether a file last written at `at` (nanoseconds since the epoch) was
/// written after an earlier process of the pid exited at `exit`
/// (boot-time nanoseconds, 0: none seen). File times lag their writes by
/// up to a tick or two ([`mtime_slack_ns`](crate::kernel::procmaps::mtime_slack_ns)),
/// which cannot tell a map the earlier process wrote just before its exit
/// from one the next wrote as it started; the exit, taken by the kernel's
/// precise clock, can: what the earlier one wrote bears a time no later
/// than its exit. A map the next process writes within a tick of the
/// earlier one's exit is taken for the earlier one's.
fn written_after_exit(at: u64, exit: u64) -> bool {
    exit == 0 || at > crate::kernel::procmaps::boot_wall_ns() + exit
}

/// Whether the file of `meta` (a perf map) was written after process `p`
/// was gone, so by another: after its exit at `exit` (boot-time
/// nanoseconds) where that is known, or else by the process that has its
/// pid now. The exit, from the kernel's precise clock, decides alone
/// where it is known: a process that wrote its map as it exited and was
/// reaped at once may be followed on its pid by one that started less than
/// the file times' slack after that write, which the starts alone would
/// take for the writer (Mono's map, read as the earlier process's exit was
/// handled, was once refused so, its names lost).
fn written_since_gone(meta: &std::fs::Metadata, p: Proc, exit: u64) -> bool {
    if exit != 0 {
        return mtime_ns(meta).is_some_and(|at| written_after_exit(at, exit));
    }
    successor_wrote(meta, p)
}

/// Whether the file of `meta` (a perf map) was written by the process
/// that has `p`'s pid now, which `p` is not: written since it started.
fn successor_wrote(meta: &std::fs::Metadata, p: Proc) -> bool {
    let now = Proc::now(p.pid);
    now.born != 0 && now != p && written_by(meta, now, 0)
}

/// Where process `pid`'s perf map is: a process in a container names its
/// map by its own pid, in its own /tmp. A process gone (not `alive`)
/// before it could be looked at is taken to be in rtrace's /tmp, as perf
/// takes every process; `None` if its root cannot be opened.
fn perf_map_path(pid: u32, alive: bool) -> Option<JitPath> {
    let status = alive
        .then(|| std::fs::read_to_string(format!("/proc/{pid}/status")).ok())
        .flatten();
    let Some(status) = status else {
        return Some(JitPath::in_our_tmp(format!("/tmp/perf-{pid}.map")));
    };
    let nspid = status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .and_then(|l| l.split_whitespace().last()?.parse::<u32>().ok())
        .unwrap_or(pid);
    let shown = format!("/tmp/perf-{nspid}.map");
    let root = match File::open(format!("{}/root", crate::kernel::procmaps::proc_dir(pid))) {
        Ok(root) => root,
        // Another user's process, and rtrace without ptrace rights (as the
        // exporter's unit runs it, with CAP_BPF and CAP_PERFMON only): its
        // root is not rtrace's to open. A process at rtrace's own depth of
        // pid namespaces, with the pid rtrace sees, is taken to share
        // rtrace's /tmp, where perf itself looks for every process; one in
        // a container cannot be reached.
        Err(_) if nspid == pid && pid_depth(&status) == own_pid_depth() => {
            return Some(JitPath::in_our_tmp(shown));
        }
        Err(_) => return None,
    };
    let ours = std::fs::metadata("/").ok()?;
    let theirs = root.metadata().ok()?;
    if (theirs.dev(), theirs.ino()) == (ours.dev(), ours.ino()) {
        return Some(JitPath::in_our_tmp(shown));
    }
    Some(JitPath {
        path: format!("/proc/self/fd/{}/tmp/perf-{nspid}.map", root.as_raw_fd()),
        shown,
        _root: Some(Arc::new(root)),
    })
}

/// How many pid namespaces deep a process is, from its `/proc/PID/status`
/// (its `NSpid` line's pids, one a namespace).
fn pid_depth(status: &str) -> usize {
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .map_or(1, |l| l.split_whitespace().count())
}

/// rtrace's own [`pid_depth`], read once.
fn own_pid_depth() -> usize {
    static DEPTH: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *DEPTH.get_or_init(|| std::fs::read_to_string("/proc/self/status").map_or(1, |s| pid_depth(&s)))
}

/// A process's jitdump file ([`jitdump`](crate::stacks::jitdump)), held open from
/// when its mapping is first seen: it is read again as the runtime appends
/// to it, after the process has exited and after the runtime deleted it.
pub(super) struct Dump {
    file: File,
    /// Its path in the process, for warnings.
    pub(super) shown: String,
    pub(super) dump: JitDump,
    /// Why reading stopped, if it did.
    error: Option<String>,
}

impl Dump {
    /// The jitdump `file`, which the process maps at `shown`, read as far
    /// as it is written.
    pub(super) fn open(file: File, shown: &str) -> Self {
        let mut dump = Self {
            file,
            shown: shown.to_owned(),
            dump: JitDump::new(),
            error: None,
        };
        dump.read_more();
        dump
    }

    /// What was read, for `-v`.
    pub(super) fn summary(&self, pid: u32) -> String {
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
    pub(super) fn warning(&self, pid: u32) -> Option<Warning> {
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
    pub(super) fn read_more(&mut self) {
        if self.error.is_some() {
            return;
        }
        if let Err(e) = self.dump.read_more(&mut self.file) {
            self.error = Some(e.to_string());
        }
    }
}

/// JIT frames left unnamed in one process, for the warning that says why.
pub(super) struct Unnamed {
    pub(super) comm: Option<Arc<str>>,
    pub(super) frames: u64,
    /// Why: the perf map was missing, empty, rewritten by the pid's next
    /// process before it was read at the exit, or did not name them, or
    /// the jitdump did not (`dump`).
    pub(super) map: &'static str,
    /// The perf map's or jitdump's path, as the process names it.
    pub(super) shown: String,
}

impl Unnamed {
    /// The warning that says how many of process `p`'s JIT frames are
    /// unnamed, and why; `pprof` is the file the run writes, which `rtrace
    /// report` names them from once the process has written its map.
    pub(super) fn warning(&self, p: Proc, pprof: Option<&str>) -> Warning {
        let pid = p.pid;
        let comm = self
            .comm
            .as_deref()
            .map(|c| format!(" ({c})"))
            .unwrap_or_default();
        // A runtime that writes its map at exit (Mono, the JVM) and has
        // not exited yet: the names come later.
        let later = match self.map {
            "missing" => Some("did not exist"),
            "empty" => Some("was empty"),
            _ => None,
        }
        .filter(|_| p.alive());
        if let Some(state) = later {
            let then = match pprof {
                Some(file) => format!(
                    "rtrace report {file} names them once the process has written it \
                     (it was run with --pprof {file})"
                ),
                None => "Mono and the JVM write it at exit: add --wait-exit SECONDS to wait \
                         for the process, or --pprof FILE to name them later with `rtrace \
                         report FILE`, or run the program under `rtrace profile -- CMD`"
                    .to_owned(),
            };
            return Warning::unnamed(format!(
                "PID {pid}{comm}: {} JIT frames unnamed; its {} {state} when the run \
                 ended: {then}",
                self.frames, self.shown
            ));
        }
        let why = match self.map {
            "missing" => format!(
                "it wrote no {} and mapped no jit-PID.dump; a JIT runtime writes one \
                 when asked (node --perf-basic-prof or --perf-prof, mono --jitmap, \
                 the JVM's perf-map-agent)",
                self.shown
            ),
            "dump" => format!("its {} did not name them", self.shown),
            "rewritten" => format!(
                "the next process given its pid had rewritten its {} before rtrace, told of \
                 its exit, could read what it wrote as it exited",
                self.shown
            ),
            "empty" => format!(
                "its {} was empty; Mono and the JVM write it at exit: \
                 run the program under `rtrace profile -- CMD`",
                self.shown
            ),
            _ => format!(
                "its {} did not name them (it may be written at exit: \
                 run the program under `rtrace profile -- CMD`)",
                self.shown
            ),
        };
        Warning::unnamed(format!(
            "PID {pid}{comm}: {} JIT frames unnamed: {why}",
            self.frames
        ))
    }
}

/// A frame of JIT code named `name` by a jitdump or a perf map.
pub(super) fn jit_named(name: &str) -> Frame {
    let kind = if interpreted(name) {
        Kind::Interpreted
    } else {
        Kind::Jit
    };
    Frame::new(name.to_owned(), kind, Some("[jit]"))
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The tests that write this process's own `/tmp/perf-PID.map` share
    /// one file, and the harness runs tests in parallel threads.
    static OUR_MAP: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// A map last written by an earlier process's exit is that one's,
    /// even where its time is within the file clock's slack of the next
    /// process's start; with no exit seen, the slack decides alone.
    #[test]
    fn a_map_written_by_an_earlier_exit_is_not_the_next_ones() {
        let me = Proc::now(std::process::id());
        let boot = crate::kernel::procmaps::boot_wall_ns();
        let start = me.born_wall_ns();
        let exit = me.born - 1_000_000;
        let written = boot + exit - 500_000;
        assert!(written_after(written, start), "within the slack");
        assert!(!written_after_exit(written, exit));
        assert!(!written_after_exit(boot + exit, exit));
        assert!(written_after_exit(boot + exit + 1, exit));
        assert!(written_after_exit(written, 0));
        // A map the process rewrites once it runs is its own.
        let _ours = OUR_MAP.lock().unwrap_or_else(|e| e.into_inner());
        let mut map = PerfMap::default();
        let path = format!("/tmp/perf-{}.map", me.pid);
        std::fs::write(&path, "1000 10 mine\n").unwrap();
        let now = mtime_ns(&std::fs::metadata(&path).unwrap()).unwrap();
        map.read(me, now - boot);
        assert!(map.symbol(0x1000).is_none(), "taken as the earlier one's");
        map.read(me, now - boot - 1);
        std::fs::remove_file(&path).unwrap();
        assert_eq!(map.symbol(0x1000).map(|s| s.name.as_str()), Some("mine"));
    }

    /// The map of a process that exited is its own if last written by its
    /// exit, though the process now on its pid started before that time
    /// (within the file clock's slack): the exit, where the kernel told
    /// it, decides; without it, the successor's start does.
    #[test]
    fn a_map_written_by_its_exit_is_the_exited_ones_whoever_has_the_pid_now() {
        let me = Proc::now(std::process::id());
        let boot = crate::kernel::procmaps::boot_wall_ns();
        // An earlier process of this test's pid, which this one followed.
        let gone = Proc::new(me.pid, me.born - 1_000_000);
        let _ours = OUR_MAP.lock().unwrap_or_else(|e| e.into_inner());
        let path = format!("/tmp/perf-{}.map", me.pid);
        std::fs::write(&path, "2000 10 theirs\n").unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        let written = mtime_ns(&meta).unwrap() - boot;
        assert!(
            successor_wrote(&meta, gone),
            "this process wrote it, by its start"
        );
        assert!(!written_since_gone(&meta, gone, written));
        assert!(written_since_gone(&meta, gone, written - 1));
        assert!(written_since_gone(&meta, gone, 0), "no exit known");
        let mut map = PerfMap::default();
        map.close(gone, written);
        // Told of the exit only after the next process rewrote the map:
        // nothing of it is taken, and the warning says why.
        let mut late = PerfMap::default();
        late.close(gone, written - 1);
        std::fs::remove_file(&path).unwrap();
        assert_eq!(map.symbol(0x2000).map(|s| s.name.as_str()), Some("theirs"));
        assert!(late.symbol(0x2000).is_none());
        let (why, shown) = late.why_unnamed(gone.pid);
        assert_eq!((why, shown.as_str()), ("rewritten", path.as_str()));
        let unnamed = Unnamed {
            comm: None,
            frames: 3,
            map: why,
            shown,
        };
        let text = unnamed.warning(gone, None).to_string();
        assert!(
            text.contains("next process given its pid had rewritten"),
            "{text}"
        );
    }

    #[test]
    fn perf_map_later_lines_win() {
        let _ours = OUR_MAP.lock().unwrap_or_else(|e| e.into_inner());
        let mut p = PerfMap::default();
        let pid = std::process::id();
        let path = format!("/tmp/perf-{pid}.map");
        std::fs::write(&path, "1000 10 old\n0x2000 0x20 other\n1000 10 new name\n").unwrap();
        p.read(Proc::now(pid), 0);
        std::fs::remove_file(&path).unwrap();
        let names: Vec<_> = p
            .syms
            .iter()
            .map(|s| (s.start, s.end, s.name.as_str()))
            .collect();
        assert_eq!(
            names,
            [(0x1000, 0x1010, "new name"), (0x2000, 0x2020, "other")]
        );
    }
}

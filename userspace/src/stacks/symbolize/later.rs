//! JIT frames named after the run (`rtrace report FILE`), as `perf
//! report` names them from the perf maps it finds on disk, but only from
//! a file that can be their process's.
//!
//! A run keeps each JIT frame its process's map did not name yet as
//! `[unknown]`, with its address and, as its module, the perf map or
//! jitdump that would name it (a runtime that writes its map at exit had
//! not exited when the run ended); each sample keeps its process's pid
//! and start. Later, the file may exist. It is used for a process only if:
//! - no later process of the same pid was recorded (the file would be
//!   that one's);
//! - it was written after the process started (an older one is an
//!   earlier process's);
//! - no process that has the pid now started before it was written
//!   (then it is that process's).
//!
//! A file written after the recording ended whose writer is gone could
//! only have been written by the recorded process if it outlived the
//! recording: it is used, and the report says in one line that its owner
//! could not be checked (perf cannot check it either; `--wait-exit` is
//! the way to be sure).

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
};

use super::{
    frame::{Frame, Kind},
    jit::{self, JitSymbol},
};
use crate::{
    kernel::procmaps::{self, Proc},
    stacks::{jitdump::JitDump, sample::Sample},
};

/// What names one process's JIT code.
enum Names {
    Map(Vec<JitSymbol>),
    Dump(Box<JitDump>),
}

impl Names {
    /// The name of the code at `addr`.
    fn at(&self, addr: u64) -> Option<&str> {
        match self {
            Self::Map(syms) => jit::symbol_at(syms, addr).map(|s| s.name.as_str()),
            Self::Dump(d) => d.lookup_latest(addr).map(|s| s.name),
        }
    }
}

/// Whether `module` is a file that names JIT code (`perf-PID.map`,
/// `jit-PID.dump`): the module of a JIT frame left unnamed.
fn names_jit(module: &str) -> bool {
    let base = module.rsplit('/').next().unwrap_or(module);
    let numbered = |prefix: &str, suffix: &str| {
        base.strip_prefix(prefix)
            .and_then(|b| b.strip_suffix(suffix))
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|c| c.is_ascii_digit()))
    };
    numbered("perf-", ".map") || numbered("jit-", ".dump")
}

/// Whether `f` is a JIT frame left unnamed, with the file that would name
/// it.
fn unnamed_jit(f: &Frame) -> Option<&str> {
    let module = f.module.as_deref()?;
    (f.kind == Kind::User && f.name.as_ref() == "[unknown]" && names_jit(module)).then_some(module)
}

/// Why a file is not used for a process, or that it is used unchecked.
enum Verdict {
    Use,
    Unchecked,
    Skip(&'static str),
}

/// Whether the file at `path`, last written at `at`, may be process
/// `pid`'s, which started at `started` (nanoseconds since the epoch, 0:
/// unknown), in a recording that ended at `until` and saw a process of
/// the pid start as late as `latest`.
fn verdict(pid: u32, started: u64, latest: u64, at: u64, until: u64) -> Verdict {
    if started < latest {
        return Verdict::Skip("a later process of the pid was recorded, whose file it is");
    }
    if !jit::written_after(at, started) {
        return Verdict::Skip("it is older than the process");
    }
    let boot = procmaps::boot_wall_ns();
    let now = Proc::now(pid);
    if now.born != 0 {
        // The recorded process is still running: the file is its own.
        if started > boot && Proc::new(pid, started - boot) == now {
            return Verdict::Use;
        }
        if jit::written_after(at, now.born_wall_ns()) {
            return Verdict::Skip("the process that has the pid now wrote it");
        }
    }
    if until != 0 && at > until {
        return Verdict::Unchecked;
    }
    Verdict::Use
}

/// Names the JIT frames of `samples` (read from a pprof file rtrace
/// wrote) that their run left unnamed, from the perf maps and jitdumps
/// on disk now, where they can be their processes' (see the module
/// documentation). `until`: when the recording ended, in nanoseconds
/// since the epoch (0: unknown). Returns what to tell the user: how many
/// were named, and a line for each process whose file's owner could not
/// be checked or whose file was not used.
pub fn name_jit_frames(samples: &mut [Sample], until: u64) -> Vec<String> {
    let mut latest: HashMap<u32, u64> = HashMap::new();
    for s in samples.iter() {
        let l = latest.entry(s.pid).or_default();
        *l = (*l).max(s.started);
    }
    // Each process's file, read once: its names and what was decided.
    type Decided = (Option<Names>, Option<String>);
    let mut files: BTreeMap<(u32, u64, String), Decided> = BTreeMap::new();
    let (mut named, mut left) = (0u64, 0u64);
    for s in samples.iter_mut() {
        if !s.user.iter().any(|f| unnamed_jit(f).is_some()) {
            continue;
        }
        let mut all = true;
        let mut user: Vec<Frame> = s.user.to_vec();
        for f in &mut user {
            let Some(path) = unnamed_jit(f) else { continue };
            let key = (s.pid, s.started, path.to_owned());
            let (names, _) = files
                .entry(key)
                .or_insert_with(|| decide(s.pid, s.started, latest[&s.pid], path, until));
            match names.as_ref().and_then(|n| n.at(f.addr)) {
                Some(name) => {
                    let addr = f.addr;
                    *f = jit::jit_named(name);
                    f.addr = addr;
                }
                None => all = false,
            }
        }
        if all {
            named += s.count;
        } else {
            left += s.count;
        }
        s.user = Arc::from(user);
    }
    let mut out: Vec<String> = files
        .into_iter()
        .filter_map(|((pid, _, path), (_, note))| Some(format!("PID {pid}: {path}: {}", note?)))
        .collect();
    if named + left > 0 {
        out.insert(
            0,
            format!(
                "JIT frames the run left unnamed were named from the perf maps and \
                 jitdumps their processes wrote since: {named} of {} samples now have \
                 all their JIT frames named",
                named + left
            ),
        );
    }
    out
}

/// The names in `path` for process `pid` started at `started`, and what
/// to say of the file, if anything.
fn decide(
    pid: u32,
    started: u64,
    latest: u64,
    path: &str,
    until: u64,
) -> (Option<Names>, Option<String>) {
    let Some(at) = std::fs::metadata(path).ok().and_then(|m| jit::mtime_ns(&m)) else {
        return (
            None,
            Some("does not exist: its frames stay unnamed".to_owned()),
        );
    };
    let note = match verdict(pid, started, latest, at, until) {
        Verdict::Skip(why) => return (None, Some(format!("not used: {why}"))),
        Verdict::Unchecked => Some(
            "written after the recording ended by a process that is gone: \
             its owner could not be checked (--wait-exit makes sure)"
                .to_owned(),
        ),
        Verdict::Use => None,
    };
    let names = if path.ends_with(".dump") {
        std::fs::read(path)
            .ok()
            .and_then(|b| JitDump::from_bytes(&b).ok())
            .map(|d| Names::Dump(Box::new(d)))
    } else {
        std::fs::read_to_string(path)
            .ok()
            .map(|t| Names::Map(jit::parse_perf_map(&t)))
    };
    (names, note)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_numbered_maps_and_dumps_name_jit_code() {
        assert!(names_jit("/tmp/perf-4201.map"));
        assert!(names_jit("/home/u/.debug/jit/x/jit-77.dump"));
        assert!(!names_jit("/tmp/perf-.map"));
        assert!(!names_jit("/usr/lib/libc.so.6"));
        assert!(!names_jit("perf-12a.map"));
    }

    #[test]
    fn a_file_is_used_only_where_it_can_be_the_processes() {
        // Nanoseconds since the epoch; a second apart.
        const S: u64 = 1_000_000_000;
        let until = 20 * S;
        // A later process of the pid was recorded.
        assert!(matches!(
            verdict(u32::MAX, S, 5 * S, 10 * S, until),
            Verdict::Skip(_)
        ));
        // Older than the process.
        assert!(matches!(
            verdict(u32::MAX, 15 * S, 15 * S, 10 * S, until),
            Verdict::Skip(_)
        ));
        // Written in the process's first moment: the file's coarse time
        // may be a tick before the process's start.
        assert!(matches!(
            verdict(u32::MAX, 10 * S + 1_000, 10 * S + 1_000, 10 * S, until),
            Verdict::Use
        ));
        // Written during the recording, by it.
        assert!(matches!(
            verdict(u32::MAX, S, S, 10 * S, until),
            Verdict::Use
        ));
        // Written after, its writer gone (no process has pid u32::MAX).
        assert!(matches!(
            verdict(u32::MAX, S, S, 30 * S, until),
            Verdict::Unchecked
        ));
    }
}

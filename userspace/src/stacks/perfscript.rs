//! `perf script` text read into rtrace's samples: the input FlameScope,
//! speedscope and stackcollapse-perf take. Each sample is a header line
//! (`comm  pid[/tid] [cpu] secs.usecs: [period] event:`) and its frames,
//! one indented line each (`addr name+0xoff (dso)`), leaf first, then a
//! blank line; without `-g` the one frame ends the header line.
//!
//! The frames are named as perf named them when it wrote the text: this
//! reads names, it does not look anything up.

use std::sync::Arc;

use crate::stacks::{
    sample::{Sample, Timed},
    symbolize::{Frame, Kind},
};

/// What cannot be read of the text, in one line.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A header line that does not parse.
    #[error("line {line}: not a perf script sample header ({why}): {text}")]
    Header {
        /// 1-based line number.
        line: usize,
        /// What is missing.
        why: &'static str,
        /// The line.
        text: String,
    },
    /// The event asked for is not in the text.
    #[error("no event {0} in the text; it holds {1}")]
    NoEvent(String, String),
}

/// The samples of one event, and every event's name and count.
pub struct Script {
    /// The samples of the event reported, in the text's order; each
    /// weighs 1.
    pub samples: Vec<Timed>,
    /// The event reported.
    pub event: String,
    /// Every event, with its samples.
    pub events: Vec<(String, u64)>,
    /// The first sample's time and the span to the last, in nanoseconds
    /// (times since the epoch, taking the text's clock to count from this
    /// machine's boot, as perf's does).
    pub start: u64,
    /// See [`Script::start`].
    pub duration_ns: u64,
    /// The median time between two samples of one thread, in
    /// nanoseconds: the text does not say what perf was set to.
    pub interval_ns: u64,
}

/// Whether `text` looks like `perf script` output: its first sample
/// header parses.
pub fn looks_like(text: &str) -> bool {
    text.lines()
        .find(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .is_some_and(|l| !l.starts_with(char::is_whitespace) && header(l).is_ok())
}

/// A sample's header: comm, pid, tid, cpu, time in ns, event, and the
/// rest of the line (a frame, without `-g`).
struct Header<'a> {
    comm: String,
    pid: u32,
    tid: u32,
    cpu: u32,
    time: u64,
    event: String,
    rest: &'a str,
}

/// Parses a header line.
fn header(line: &str) -> Result<Header<'_>, &'static str> {
    // The time (`12345.678901:`) is the one field sure to be there; the
    // comm before it may hold spaces and digits, so the pid is the last
    // number before the time (and the cpu, in brackets).
    let tokens: Vec<(usize, &str)> = split_with_offsets(line);
    let t = tokens
        .iter()
        .position(|(_, tok)| {
            tok.strip_suffix(':').is_some_and(|v| {
                v.split_once('.').is_some_and(|(a, b)| {
                    !a.is_empty()
                        && a.bytes().all(|c| c.is_ascii_digit())
                        && b.bytes().all(|c| c.is_ascii_digit())
                })
            })
        })
        .ok_or("no time")?;
    let (secs, frac) = tokens[t]
        .1
        .trim_end_matches(':')
        .split_once('.')
        .ok_or("no time")?;
    let ns = format!("{frac:0<9}");
    let time = secs.parse::<u64>().map_err(|_| "bad time")? * 1_000_000_000
        + ns[..9].parse::<u64>().map_err(|_| "bad time")?;
    let mut i = t;
    let mut cpu = 0;
    if i > 0
        && let Some(c) = tokens[i - 1]
            .1
            .strip_prefix('[')
            .and_then(|c| c.strip_suffix(']'))
    {
        cpu = c.parse().map_err(|_| "bad cpu")?;
        i -= 1;
    }
    if i < 2 {
        return Err("no comm and pid");
    }
    let ids = tokens[i - 1].1;
    let (pid, tid) = match ids.split_once('/') {
        Some((p, t)) => (p.parse().ok(), t.parse().ok()),
        None => (ids.parse().ok(), ids.parse().ok()),
    };
    let (Some(pid), Some(tid)) = (pid, tid) else {
        return Err("no pid");
    };
    let comm = line[..tokens[i - 1].0].trim().to_owned();
    // After the time: an optional period, then `event:`.
    let mut j = t + 1;
    if tokens
        .get(j)
        .is_some_and(|(_, v)| v.bytes().all(|c| c.is_ascii_digit()))
    {
        j += 1;
    }
    let &(at, ev) = tokens.get(j).ok_or("no event")?;
    let event = ev.strip_suffix(':').ok_or("no event")?.to_owned();
    let rest = line[at + ev.len()..].trim();
    Ok(Header {
        comm,
        pid,
        tid,
        cpu,
        time,
        event,
        rest,
    })
}

/// The whitespace-separated tokens of `line`, with their byte offsets.
fn split_with_offsets(line: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, c) in line.char_indices() {
        match (c.is_whitespace(), start) {
            (true, Some(s)) => {
                out.push((s, &line[s..i]));
                start = None;
            }
            (false, None) => start = Some(i),
            _ => {}
        }
    }
    if let Some(s) = start {
        out.push((s, &line[s..]));
    }
    out
}

/// One frame line (`addr name+0xoff (dso)`): the frame, and whether it
/// is the kernel's.
fn frame(line: &str) -> Option<Frame> {
    let line = line.trim();
    let (addr, rest) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
    let addr = u64::from_str_radix(addr, 16).ok()?;
    let rest = rest.trim();
    let (name, dso) = match rest.rfind(" (") {
        Some(k) if rest.ends_with(')') => (&rest[..k], &rest[k + 2..rest.len() - 1]),
        _ => (rest, ""),
    };
    // `name+0x1a`: the offset is the instruction's, not the function's.
    let name = match name.rsplit_once("+0x") {
        Some((n, off)) if !n.is_empty() && u64::from_str_radix(off, 16).is_ok() => n,
        _ => name,
    };
    let name = if name.is_empty() { "[unknown]" } else { name };
    // perf script's DWARF-mode stacks list inlined functions as frames
    // of their own, `(inlined)` in place of the file.
    let kind = if dso == "inlined" {
        Kind::Inlined
    } else if dso.starts_with("[kernel") || dso.ends_with(".ko") || dso == "[bpf_prog]" {
        Kind::Kernel
    } else if dso.contains("/perf-") && dso.ends_with(".map") || dso.starts_with("[JIT]") {
        Kind::Jit
    } else {
        Kind::User
    };
    let module = match kind {
        Kind::Kernel => "[kernel]",
        Kind::Jit => "[jit]",
        Kind::Inlined => "",
        _ => dso.rsplit('/').next().unwrap_or(dso),
    };
    let module = (!module.is_empty() && module != "[unknown]").then_some(module);
    let mut f = Frame::new(name, kind, module);
    f.addr = addr;
    Some(f)
}

/// Reads `text`, reporting event `event` (the first event if `None`).
pub fn read(text: &str, event: Option<&str>) -> Result<Script, Error> {
    let boot = crate::kernel::procmaps::boot_wall_ns();
    let mut events: Vec<(String, u64)> = Vec::new();
    let mut samples = Vec::new();
    let mut chosen: Option<String> = event.map(str::to_owned);
    let mut lines = text.lines().enumerate().peekable();
    while let Some((n, line)) = lines.next() {
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        if line.starts_with(char::is_whitespace) {
            // A frame line with no header: a sample's frames beyond what
            // was kept, skipped as stackcollapse skips them.
            continue;
        }
        let h = header(line).map_err(|why| Error::Header {
            line: n + 1,
            why,
            text: line.to_owned(),
        })?;
        let mut frames: Vec<Frame> = Vec::new();
        if !h.rest.is_empty()
            && let Some(f) = frame(h.rest)
        {
            frames.push(f);
        }
        while let Some((_, l)) = lines.peek() {
            if l.trim().is_empty() || !l.starts_with(char::is_whitespace) {
                break;
            }
            if let Some(f) = frame(l) {
                frames.push(f);
            }
            lines.next();
        }
        match events.iter_mut().find(|(e, _)| *e == h.event) {
            Some((_, c)) => *c += 1,
            None => events.push((h.event.clone(), 1)),
        }
        let wanted = chosen.get_or_insert_with(|| h.event.clone());
        if *wanted != h.event && wanted.split(':').next() != Some(&h.event) {
            continue;
        }
        // An inlined function is in the file of the function it was
        // inlined into, the next frame out.
        for i in (0..frames.len()).rev() {
            if frames[i].kind == Kind::Inlined
                && let Some(outer) = frames.get(i + 1).map(|f| f.module.clone())
            {
                frames[i].module = outer;
            }
        }
        let (kernel, user): (Vec<Frame>, Vec<Frame>) =
            frames.into_iter().partition(|f| f.kind == Kind::Kernel);
        samples.push(Timed {
            time: boot + h.time,
            cpu: h.cpu,
            sample: Sample {
                comm: h.comm,
                pid: h.pid,
                started: 0,
                tid: h.tid,
                user: Arc::from(user),
                kernel: Arc::from(kernel),
                count: 1,
                waker: None,
                off_cpu: false,
                slot: 0,
                cut_short: false,
            },
        });
    }
    let event = chosen.unwrap_or_default();
    if samples.is_empty() && !events.is_empty() {
        let all: Vec<&str> = events.iter().map(|(e, _)| e.as_str()).collect();
        return Err(Error::NoEvent(event, all.join(", ")));
    }
    let mut gaps: Vec<u64> = {
        let mut last: std::collections::HashMap<u32, u64> = std::collections::HashMap::new();
        samples
            .iter()
            .filter_map(|s| {
                let prev = last.insert(s.sample.tid, s.time)?;
                Some(s.time.saturating_sub(prev))
            })
            .collect()
    };
    gaps.sort_unstable();
    let interval_ns = gaps.get(gaps.len() / 2).copied().unwrap_or(0);
    let start = samples.iter().map(|s| s.time).min().unwrap_or(0);
    let end = samples.iter().map(|s| s.time).max().unwrap_or(0);
    Ok(Script {
        samples,
        event,
        events,
        start,
        duration_ns: end - start,
        interval_ns,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// perf script's own layouts: with `-g`, without it, with a comm of
    /// several words, a pid/tid pair and a period.
    #[test]
    fn headers_and_frames_parse() {
        let text = "\
hotfuncs 4242 [001] 12345.678901:   1001001 cpu-clock:ppp: 
\t    55d5c0a1b2c3 hotfuncs::hot_alpha+0x23 (/tmp/hotfuncs)
\t    55d5c0a1b400 main (/tmp/hotfuncs)
\tffffffff8110a5c1 do_syscall_64+0x51 ([kernel.kallsyms])

Web Content 7/9 [000] 1.5: cycles: 7f00 foo (/usr/lib/libxul.so)
";
        let s = read(text, None).unwrap();
        assert_eq!(s.event, "cpu-clock:ppp");
        assert_eq!(s.samples.len(), 1);
        let first = &s.samples[0].sample;
        assert_eq!(
            (first.comm.as_str(), first.pid, s.samples[0].cpu),
            ("hotfuncs", 4242, 1)
        );
        let names: Vec<&str> = first.user.iter().map(|f| &*f.name).collect();
        assert_eq!(names, ["hotfuncs::hot_alpha", "main"]);
        assert_eq!(&*first.kernel[0].name, "do_syscall_64");
        let s = read(text, Some("cycles")).unwrap();
        let only = &s.samples[0].sample;
        assert_eq!(
            (only.comm.as_str(), only.pid, only.tid),
            ("Web Content", 7, 9)
        );
        assert_eq!(&*only.user[0].name, "foo");
        assert_eq!(s.events.len(), 2);
        assert!(looks_like(text));
        assert!(!looks_like("main;foo 3\n"));
    }
}

//! Output shared by every tool: the interval loop with its signals,
//! timestamps, JSON lines and the report of lost work at exit.
//!
//! Rust's stdout is line-buffered whatever it points at, so each line
//! reaches a pipe or file as soon as it is printed; the loop flushes after
//! each interval as well.

pub mod events;
pub mod hist;
pub mod stacks;

use std::{io::Write, time::Duration};

use anyhow::Context as _;
use tokio::signal::unix::{SignalKind, signal};

/// `[interval] [count]` and `-T`, as bcc's histogram tools take them.
#[derive(Debug, Clone, clap::Args)]
pub struct IntervalArgs {
    /// Seconds between outputs; without it, print once at Ctrl-C.
    #[arg(value_parser = clap::value_parser!(u64).range(1..))]
    pub interval: Option<u64>,
    /// Number of outputs before exiting; without it, run until interrupted.
    #[arg(value_parser = clap::value_parser!(u64).range(1..))]
    pub count: Option<u64>,
    /// Print a timestamp (HH:MM:SS) before each output.
    #[arg(short = 'T', long)]
    pub timestamp: bool,
}

/// What ends a wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tick {
    /// The interval elapsed.
    Interval,
    /// SIGINT, SIGTERM or SIGHUP arrived: print what there is, then exit 0.
    Signal,
}

/// Waits for SIGINT, SIGTERM and SIGHUP. Create it before announcing that
/// tracing has started, so that no signal can arrive unhandled.
pub struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
    deadline: Option<tokio::time::Instant>,
}

impl Signals {
    /// Installs the handlers.
    pub fn new() -> anyhow::Result<Self> {
        let mk = |k| signal(k).context("cannot install signal handlers");
        Ok(Self {
            int: mk(SignalKind::interrupt())?,
            term: mk(SignalKind::terminate())?,
            hup: mk(SignalKind::hangup())?,
            deadline: None,
        })
    }

    /// Ends the run after `secs` seconds (`-d`), as a signal would.
    pub fn stop_after(&mut self, secs: Option<u64>) {
        self.deadline = secs.map(|s| tokio::time::Instant::now() + Duration::from_secs(s));
    }

    /// Resolves when any of the three signals arrives, or the deadline
    /// passes.
    pub async fn recv(&mut self) {
        let until = self.deadline;
        let deadline = async {
            match until {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = self.int.recv() => {}
            _ = self.term.recv() => {}
            _ = self.hup.recv() => {}
            () = deadline => {}
        }
    }
}

/// Runs `emit` once per interval, or once at the end without an interval.
///
/// `emit` gets whether this output is the last. A signal ends the loop
/// after one final output of the partial interval.
pub async fn run_intervals(
    args: &IntervalArgs,
    signals: &mut Signals,
    mut emit: impl FnMut(Tick, bool) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let mut done = 0u64;
    loop {
        let tick = match args.interval {
            Some(secs) => tokio::select! {
                () = tokio::time::sleep(Duration::from_secs(secs)) => Tick::Interval,
                () = signals.recv() => Tick::Signal,
            },
            None => {
                signals.recv().await;
                Tick::Signal
            }
        };
        done += 1;
        let last = tick == Tick::Signal || args.count.is_some_and(|c| done >= c);
        emit(tick, last)?;
        std::io::stdout()
            .flush()
            .context("cannot write to stdout")?;
        if last {
            return Ok(());
        }
    }
}

/// The local time as `HH:MM:SS`.
pub fn hms() -> String {
    // SAFETY: time and localtime_r write only into the locals given.
    unsafe {
        let t = libc::time(std::ptr::null_mut());
        let mut tm: libc::tm = std::mem::zeroed();
        libc::localtime_r(&t, &mut tm);
        format!("{:02}:{:02}:{:02}", tm.tm_hour, tm.tm_min, tm.tm_sec)
    }
}

/// Seconds since the Unix epoch, for JSON.
pub fn epoch_secs() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// A NUL-terminated kernel string (`comm`, a file name) as text.
pub fn c_string(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// The leading time columns of an event tool's lines: `-T` (HH:MM:SS)
/// and `-t` (seconds since tracing started, in a column of `width`).
pub struct TimeColumns {
    time: bool,
    timestamp: bool,
    width: usize,
    start: std::time::Instant,
}

impl TimeColumns {
    /// Columns as the flags ask; seconds count from now.
    pub fn new(time: bool, timestamp: bool, width: usize) -> Self {
        Self {
            time,
            timestamp,
            width,
            start: std::time::Instant::now(),
        }
    }

    /// Their headings, each followed by a space.
    pub fn header(&self) -> String {
        let mut out = String::new();
        if self.time {
            out.push_str(&format!("{:<8} ", "TIME"));
        }
        if self.timestamp {
            out.push_str(&format!("{:<w$} ", "TIME(s)", w = self.width));
        }
        out
    }

    /// Appends their values for an event seen now.
    pub fn push(&self, out: &mut String) {
        if self.time {
            out.push_str(&format!("{:<8} ", hms()));
        }
        if self.timestamp {
            let secs = self.start.elapsed().as_secs_f64();
            out.push_str(&format!("{secs:<w$.3} ", w = self.width));
        }
    }
}

/// Prints one JSON object as one line.
pub fn json_line(value: &impl serde::Serialize) -> anyhow::Result<()> {
    let line = serde_json::to_string(value).context("cannot encode JSON")?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").context("cannot write to stdout")
}

/// The `ERRORS` per-CPU counters of a histogram tool's object, summed over
/// CPUs, one per name.
pub fn read_errors(ebpf: &aya::Ebpf, names: &[&str]) -> anyhow::Result<Vec<u64>> {
    let map: aya::maps::PerCpuArray<_, u64> =
        aya::maps::PerCpuArray::try_from(ebpf.map("ERRORS").context("map ERRORS missing")?)?;
    (0..names.len() as u32)
        .map(|i| Ok(map.get(&i, 0)?.iter().sum()))
        .collect()
}

/// The counters of [`read_errors`] as a JSON object keyed by their names.
pub fn errors_json(names: &[&str], counts: &[u64]) -> serde_json::Value {
    names
        .iter()
        .zip(counts)
        .map(|(n, c)| ((*n).to_owned(), (*c).into()))
        .collect::<serde_json::Map<String, serde_json::Value>>()
        .into()
}

/// Writes an interval's text to stdout in one piece.
pub fn write_text(text: &str) -> anyhow::Result<()> {
    std::io::stdout()
        .lock()
        .write_all(text.as_bytes())
        .context("cannot write to stdout")
}

/// Reports counters of lost work on stderr, each only when nonzero.
pub fn report_errors(names: &[&str], counts: &[u64]) {
    for (name, &n) in names.iter().zip(counts) {
        if n > 0 {
            eprintln!("rtrace: warning: {n} {name}");
        }
    }
}

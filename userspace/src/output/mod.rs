//! Output shared by every tool: the one [`Sink`] every record goes through
//! (text in bcc's layout, or JSON lines), signals, timestamps and columns.
//!
//! Rust's stdout is line-buffered whatever it points at, so each line
//! reaches a pipe or file as soon as it is printed; the loop flushes after
//! each interval as well.
//!
//! Imported by the tracer and tools; imports the kernel layer, and from
//! `stacks` the named frames it renders.

pub mod events;
pub mod files;
pub mod heatmap;
pub mod hist;
pub mod html;
pub mod manpages;
pub mod metrics;
pub mod otlp;
pub mod stacks;

use std::io::{LineWriter, Write};

use anyhow::Context as _;

/// When a tool prints (the tracer runs it; `hist::Interval` is a
/// histogram interval's output).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Schedule {
    /// Only from events, or in `Tool::finish`.
    #[default]
    Never,
    /// Once, when the run ends.
    AtEnd,
    /// Every `period`, `count` times if given, and once more for a
    /// partial interval cut short by a signal.
    Every {
        /// Time between outputs.
        period: std::time::Duration,
        /// Outputs before exiting.
        count: Option<u64>,
    },
}

/// Where the tools' output goes: stdout, or stderr in command mode (the
/// command's own stdout stays its own), or the file of `-o`.
#[derive(Debug)]
pub enum Destination {
    /// Standard output, the default.
    Stdout,
    /// Standard error.
    Stderr,
    /// A file, written a line at a time.
    File(LineWriter<std::fs::File>),
}

impl Destination {
    /// Runs `f` on this writer, a line-buffered one whatever it is.
    fn with<R>(
        &mut self,
        f: impl FnOnce(&mut dyn Write) -> std::io::Result<R>,
    ) -> anyhow::Result<R> {
        let (r, what) = match self {
            Self::Stdout => (f(&mut std::io::stdout().lock()), "stdout"),
            Self::Stderr => (f(&mut std::io::stderr().lock()), "stderr"),
            Self::File(w) => (f(w), "the output file"),
        };
        r.with_context(|| format!("cannot write to {what}"))
    }
}

/// Parses a whole number of 1 or more, for intervals, counts and sizes;
/// clap's own range check would name the range as 1..18446744073709551615.
pub fn at_least_one<T: std::str::FromStr + PartialOrd + From<u8>>(s: &str) -> Result<T, String> {
    match s.trim().parse::<T>() {
        Ok(n) if n >= T::from(1) => Ok(n),
        _ => Err(format!("expected a whole number of 1 or more, got {s:?}")),
    }
}

/// `[interval] [count]` and `-T`, as bcc's histogram tools take them.
#[derive(Debug, Clone, clap::Args, Default)]
pub struct IntervalArgs {
    /// Seconds between outputs; without it, print once at Ctrl-C.
    #[arg(value_parser = at_least_one::<u64>)]
    pub interval: Option<u64>,
    /// Number of outputs before exiting; without it, run until interrupted.
    #[arg(value_parser = at_least_one::<u64>)]
    pub count: Option<u64>,
    /// Print a timestamp (HH:MM:SS) before each output.
    #[arg(short = 'T', long)]
    pub timestamp: bool,
}

impl IntervalArgs {
    /// When a histogram tool with these arguments prints.
    pub fn schedule(&self) -> Schedule {
        match self.interval {
            Some(secs) => Schedule::Every {
                period: std::time::Duration::from_secs(secs),
                count: self.count,
            },
            None => Schedule::AtEnd,
        }
    }
}

/// The local time now, broken down.
fn local_now() -> libc::tm {
    // SAFETY: time writes nothing with a null pointer.
    local_tm(unsafe { libc::time(std::ptr::null_mut()) } as i64)
}

fn local_tm(secs: i64) -> libc::tm {
    // Inferred, not named: musl's `time_t` alias is deprecated.
    let t = secs as _;
    // SAFETY: localtime_r writes only into the local given.
    unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        libc::localtime_r(&t, &mut tm);
        tm
    }
}

/// `ns` since the epoch as ISO 8601 in UTC, to the millisecond
/// (`2026-11-29T21:28:43.123Z`), as OTLP's time attributes have it.
pub fn utc_iso8601(ns: u64) -> String {
    // Inferred, not named: musl's `time_t` alias is deprecated.
    let t = (ns / 1_000_000_000) as _;
    // SAFETY: gmtime_r writes only into the local given.
    let tm = unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        libc::gmtime_r(&t, &mut tm);
        tm
    };
    format!(
        "{:04}-{:02}-{:02}T{}.{:03}Z",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        hms_of(&tm),
        ns / 1_000_000 % 1000
    )
}

/// The local time of `secs` since the epoch as `HH:MM:SS`.
pub fn local_time_of(secs: i64) -> String {
    hms_of(&local_tm(secs))
}

/// The local time as `HH:MM:SS`.
pub fn hms() -> String {
    hms_of(&local_now())
}

fn hms_of(tm: &libc::tm) -> String {
    format!("{:02}:{:02}:{:02}", tm.tm_hour, tm.tm_min, tm.tm_sec)
}

/// The local date and time as `YYYY-MM-DD HH:MM:SS`, as bcc's `-j`
/// prints it.
pub fn local_datetime() -> String {
    let tm = local_now();
    format!(
        "{:04}-{:02}-{:02} {}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        hms_of(&tm)
    )
}

/// Seconds since the Unix epoch, for JSON.
pub fn epoch_secs() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// An address the kernel gives as a family (`AF_INET`, `AF_INET6`) and
/// 16 bytes, IPv4 in the first four; `None` for other families.
pub fn ip_addr(family: u16, bytes: &[u8; 16]) -> Option<std::net::IpAddr> {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    match i32::from(family) {
        libc::AF_INET6 => Some(IpAddr::V6(Ipv6Addr::from(*bytes))),
        libc::AF_INET => Some(IpAddr::V4(Ipv4Addr::new(
            bytes[0], bytes[1], bytes[2], bytes[3],
        ))),
        _ => None,
    }
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

    /// Their headings as CSV fields, each followed by a comma.
    pub fn csv_header(&self) -> String {
        let mut out = String::new();
        if self.time {
            out.push_str("TIME,");
        }
        if self.timestamp {
            out.push_str("TIME(s),");
        }
        out
    }

    /// Appends their values as CSV fields, each followed by a comma.
    pub fn push_csv(&self, out: &mut String) {
        if self.time {
            out.push_str(&format!("{},", hms()));
        }
        if self.timestamp {
            out.push_str(&format!("{:.6},", self.start.elapsed().as_secs_f64()));
        }
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

/// Loss counters (`crate::kernel::load::read_errors`) as a JSON object keyed by their names.
pub fn errors_json(names: &[&str], counts: &[u64]) -> serde_json::Value {
    names
        .iter()
        .zip(counts)
        .map(|(n, c)| ((*n).to_owned(), (*c).into()))
        .collect::<serde_json::Map<String, serde_json::Value>>()
        .into()
}

/// One thing a tool prints: an event, an interval's histograms, a
/// profile's stacks. Its text is bcc's layout; its JSON is its `Serialize`
/// form, one line (one per element of a list), to which the sink adds
/// `tool`, `time` and `timestamp`.
pub trait Record: serde::Serialize {
    /// Appends the text form, with its line ends.
    fn text(&self, out: &mut String);
}

/// Where every record goes: text or JSON lines on the output, which the
/// sink owns (stdout unless [`to`](Self::to) says otherwise).
pub struct Sink {
    tool: &'static str,
    json: bool,
    text: bool,
    line: String,
    out: Destination,
}

impl Sink {
    /// A sink for `tool`'s records on stdout, as JSON lines if `json`.
    pub fn new(tool: &'static str, json: bool) -> Self {
        Self {
            tool,
            json,
            text: true,
            line: String::new(),
            out: Destination::Stdout,
        }
    }

    /// The same sink writing to `out` instead.
    pub fn to(self, out: Destination) -> Self {
        Self { out, ..self }
    }

    /// Prints one JSON value as one line.
    pub fn json_line(&mut self, value: &impl serde::Serialize) -> anyhow::Result<()> {
        let line = serde_json::to_string(value).context("cannot encode JSON")?;
        self.out.with(|out| writeln!(out, "{line}"))
    }

    /// Prints nothing in text mode from now on, as when a tool writes its
    /// results to files instead; JSON is still printed.
    pub fn quiet_text(&mut self) {
        self.text = false;
    }

    /// Prints a column header, in text mode only.
    pub fn header(&mut self, header: &str) -> anyhow::Result<()> {
        if self.json || !self.text {
            return Ok(());
        }
        self.out.with(|out| writeln!(out, "{header}"))
    }

    /// Prints one record.
    /// Prints `line` as it is, with none of rtrace's own fields: a peer's
    /// layout (bcc's `biolatency -j`).
    pub fn emit_raw(&mut self, line: &str) -> anyhow::Result<()> {
        self.out.with(|out| {
            writeln!(out, "{line}")?;
            out.flush()
        })
    }

    pub fn emit(&mut self, record: &impl Record) -> anyhow::Result<()> {
        if self.json {
            // A record that is a list, such as a profile's stacks, is one
            // line per element.
            let lines = match serde_json::to_value(record).context("cannot encode JSON")? {
                serde_json::Value::Array(items) => items,
                one => vec![one],
            };
            for mut value in lines {
                if let serde_json::Value::Object(map) = &mut value {
                    map.entry("tool").or_insert_with(|| self.tool.into());
                    map.entry("time").or_insert_with(|| hms().into());
                    map.entry("timestamp")
                        .or_insert_with(|| epoch_secs().into());
                }
                self.json_line(&value)?;
            }
            return Ok(());
        }
        if !self.text {
            return Ok(());
        }
        self.line.clear();
        record.text(&mut self.line);
        let line = &self.line;
        self.out.with(|out| out.write_all(line.as_bytes()))
    }

    /// Ends a block of text with an empty line (an interval's stacks);
    /// nothing in JSON, whose lines carry their times.
    pub fn separate(&mut self) -> anyhow::Result<()> {
        if self.json || !self.text {
            return Ok(());
        }
        self.emit_raw("")
    }

    /// Pushes what was printed out to a pipe or file.
    pub fn flush(&mut self) -> anyhow::Result<()> {
        self.out.with(|out| out.flush())
    }
}

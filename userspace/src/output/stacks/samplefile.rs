//! `--samples FILE`: one row per sample, for notebooks (pandas'
//! `read_json(lines=True)` or `read_csv`), by the file's extension:
//!
//! - `.jsonl`: a JSON object a line, its `stack` a list of frame names,
//!   root first;
//! - `.csv`: a header and a row a sample, its `stack` one column of the
//!   frame names joined by `;`, root first, as folded stacks are (a `;`
//!   in a name becomes `:`).
//!
//! Each row has `time` (nanoseconds since the Unix epoch), `cpu`, `pid`,
//! `tid`, `process` (the thread's command), `weight` (1 for a sample,
//! nanoseconds for time off the CPU) and `stack`; rows are in time order.

use std::{io::Write, path::Path};

use anyhow::Context as _;

use crate::stacks::sample::Timed;

/// The formats `--samples` writes, by extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `.jsonl`: JSON lines.
    JsonLines,
    /// `.csv`: comma-separated values with a header.
    Csv,
}

impl Format {
    /// The format of `path` by its extension; any other is an error that
    /// names the two.
    pub fn of(path: &Path) -> anyhow::Result<Self> {
        match path.extension().and_then(|e| e.to_str()) {
            Some(e) if e.eq_ignore_ascii_case("jsonl") => Ok(Self::JsonLines),
            Some(e) if e.eq_ignore_ascii_case("csv") => Ok(Self::Csv),
            _ => anyhow::bail!(
                "--samples {}: the file's extension picks its format: .jsonl (JSON lines) or \
                 .csv",
                path.display()
            ),
        }
    }
}

/// The frame names of a sample, root first, as the folded stacks name
/// them (with `[off-CPU]` between the user and kernel frames of time off
/// the CPU).
fn stack(t: &Timed) -> Vec<String> {
    t.sample
        .root_first(false)
        .iter()
        .map(|f| crate::output::stacks::name(f, false))
        .collect()
}

/// A JSON line, its fields in the CSV's column order.
#[derive(serde::Serialize)]
struct Row<'a> {
    time: u64,
    cpu: u32,
    pid: u32,
    tid: u32,
    process: &'a str,
    weight: u64,
    stack: Vec<String>,
}

/// Writes `samples` in time order to `out` as `format`.
pub fn write(samples: &[Timed], format: Format, out: &mut dyn Write) -> anyhow::Result<()> {
    let mut order: Vec<&Timed> = samples.iter().collect();
    order.sort_by_key(|t| (t.time, t.cpu));
    if format == Format::Csv {
        writeln!(out, "time,cpu,pid,tid,process,weight,stack")?;
    }
    for t in order {
        let s = &t.sample;
        match format {
            Format::JsonLines => {
                let row = Row {
                    time: t.time,
                    cpu: t.cpu,
                    pid: s.pid,
                    tid: s.tid,
                    process: &s.comm,
                    weight: s.count,
                    stack: stack(t),
                };
                serde_json::to_writer(&mut *out, &row).context("cannot write a sample")?;
                writeln!(out)?;
            }
            Format::Csv => {
                let joined: Vec<String> = stack(t).iter().map(|n| n.replace(';', ":")).collect();
                writeln!(
                    out,
                    "{},{},{},{},{},{},{}",
                    t.time,
                    t.cpu,
                    s.pid,
                    s.tid,
                    csv_field(&s.comm),
                    s.count,
                    csv_field(&joined.join(";"))
                )?;
            }
        }
    }
    Ok(())
}

/// `text` as one CSV field: quoted, its quotes doubled, where it holds a
/// comma, a quote or a line break (RFC 4180).
fn csv_field(text: &str) -> String {
    if text.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use std::{path::Path, sync::Arc};

    use super::{Format, csv_field, write};
    use crate::stacks::{
        sample::{Sample, Timed},
        symbolize::{Frame, Kind},
    };

    fn timed(time: u64, user: &[&str]) -> Timed {
        let user: Arc<[Frame]> = user.iter().map(|n| Frame::missed(n, Kind::User)).collect();
        Timed {
            time,
            cpu: 1,
            sample: Sample {
                comm: "a,b".to_owned(),
                pid: 7,
                started: 0,
                tid: 8,
                user,
                kernel: Arc::from([]),
                count: 1,
                waker: None,
                off_cpu: false,
                slot: 0,
                cut_short: false,
            },
        }
    }

    #[test]
    fn the_extension_picks_the_format() {
        assert_eq!(Format::of(Path::new("x.jsonl")).unwrap(), Format::JsonLines);
        assert_eq!(Format::of(Path::new("x.CSV")).unwrap(), Format::Csv);
        let e = Format::of(Path::new("x.json")).unwrap_err().to_string();
        assert!(e.contains(".jsonl") && e.contains(".csv"), "{e}");
    }

    #[test]
    fn rows_are_in_time_order_with_the_root_first() {
        // Leaf first, as samples hold them.
        let samples = [timed(20, &["leaf", "main"]), timed(10, &["f;g", "main"])];
        let mut out = Vec::new();
        write(&samples, Format::Csv, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "time,cpu,pid,tid,process,weight,stack");
        assert_eq!(lines[1], "10,1,7,8,\"a,b\",1,main;f:g");
        assert_eq!(lines[2], "20,1,7,8,\"a,b\",1,main;leaf");
        let mut out = Vec::new();
        write(&samples, Format::JsonLines, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let line = text.lines().next().unwrap();
        assert!(
            line.starts_with("{\"time\":10,\"cpu\":1,\"pid\":7,"),
            "{line}"
        );
        let first: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(first["stack"], serde_json::json!(["main", "f;g"]));
        assert_eq!(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
    }
}

//! `cargo xtask bench trace`: what tracing every syscall of a command
//! costs it, `rtrace strace` against `strace -f` and `perf trace`, each
//! printing to a file, and each one's summary mode (`strace -c`, `perf
//! trace -s`, `rtrace strace -c`). The workload (`sysloop`, a fixture)
//! makes small reads and writes and stats in a loop and times itself; the
//! added time a syscall is its time under a tracer less its time bare,
//! and the calls each tracer lost are its workload's reads it did not
//! print.

use std::process::{Command, Stdio};

use anyhow::Context as _;

use super::{measured_on, median, spread};

/// Rounds of read, write and stat a run makes.
const LOOPS: u64 = 100_000;
/// Interleaved rounds.
const ROUNDS: usize = 3;

/// One configuration: a name, and the command line before the workload's
/// (empty for bare); `lines` where it prints a line a call.
struct Setup {
    name: &'static str,
    argv: Vec<String>,
    lines: bool,
}

/// One run: nanoseconds a call, as the workload measured it, and the
/// reads of `/dev/zero` the tracer printed (where it prints lines).
fn once(setup: &Setup, workload: &str, out: &std::path::Path) -> anyhow::Result<(f64, u64)> {
    let _ = std::fs::remove_file(out);
    let mut words: Vec<String> = setup
        .argv
        .iter()
        .map(|w| w.replace("OUT", &out.to_string_lossy()))
        .collect();
    words.push(workload.to_owned());
    words.push(LOOPS.to_string());
    let result = Command::new(&words[0])
        .args(&words[1..])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .with_context(|| format!("cannot run {}", words[0]))?;
    let stderr = String::from_utf8_lossy(&result.stderr);
    let ns = stderr
        .lines()
        .find_map(|l| {
            l.strip_prefix("calls ")?
                .split_whitespace()
                .nth(2)?
                .parse()
                .ok()
        })
        .with_context(|| format!("{}: no timing from the workload: {stderr}", setup.name))?;
    let printed = if setup.lines {
        let text = std::fs::read_to_string(out).unwrap_or_default();
        // strace's and rtrace's `read(3, "\0", 1)`, perf's `read(fd: 3,
        // ..., count: 1)`: the workload's one-byte reads.
        text.lines()
            .filter(|l| {
                let l = l.split_once("read(").map_or("", |(_, r)| r);
                !l.is_empty() && (l.contains(", 1)") || l.contains("count: 1)"))
            })
            .count() as u64
    } else {
        0
    };
    Ok((ns, printed))
}

/// Runs the benchmark; the table for `docs/benchmarks.md`.
pub fn run() -> anyhow::Result<String> {
    let rtrace = crate::build()?;
    let rtrace = rtrace.to_string_lossy().into_owned();
    let workload = crate::root()
        .join("target/release/sysloop")
        .to_string_lossy()
        .into_owned();
    let dir = crate::root().join("target/bench");
    std::fs::create_dir_all(&dir)?;
    let out = dir.join("trace.out");
    let words = |w: &[&str]| w.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    let setups = [
        Setup {
            name: "bare",
            argv: Vec::new(),
            lines: false,
        },
        Setup {
            name: "strace -f",
            argv: words(&["strace", "-f", "-o", "OUT"]),
            lines: true,
        },
        Setup {
            name: "perf trace",
            argv: words(&["perf", "trace", "-o", "OUT", "--"]),
            lines: true,
        },
        Setup {
            name: "rtrace strace",
            argv: words(&[&rtrace, "strace", "-o", "OUT", "--"]),
            lines: true,
        },
        Setup {
            name: "strace -c",
            argv: words(&["strace", "-f", "-c", "-o", "OUT"]),
            lines: false,
        },
        Setup {
            name: "perf trace -s",
            argv: words(&["perf", "trace", "-s", "-o", "OUT", "--"]),
            lines: false,
        },
        Setup {
            name: "rtrace strace -c",
            argv: words(&[&rtrace, "strace", "-c", "-o", "OUT", "--"]),
            lines: false,
        },
    ];
    eprintln!(
        "bench trace: {} syscalls a run (sysloop: read, write, stat), {ROUNDS} interleaved \
         rounds of {} setups",
        3 * LOOPS,
        setups.len()
    );
    let mut ns: Vec<Vec<f64>> = vec![Vec::new(); setups.len()];
    let mut printed: Vec<Vec<u64>> = vec![Vec::new(); setups.len()];
    for round in 1..=ROUNDS {
        for (i, s) in setups.iter().enumerate() {
            let (t, p) = once(s, &workload, &out)?;
            eprintln!(
                "  round {round}: {:<18} {t:8.1} ns a call, {p} reads printed",
                s.name
            );
            ns[i].push(t);
            printed[i].push(p);
        }
    }
    let _ = std::fs::remove_file(&out);
    let bare = median(ns[0].clone());
    let added = |i: usize| -> Vec<f64> { ns[i].iter().map(|t| t - bare).collect() };
    let cell = |v: &[f64]| {
        let (lo, hi) = spread(v);
        format!("{:.0} ns ({lo:.0}-{hi:.0})", median(v.to_vec()))
    };
    let mut table = format!(
        "{} ({} syscalls a run: {LOOPS} rounds of a 1-byte read of /dev/zero, a 1-byte write \
         to /dev/null and a stat, timed by the workload itself; medians of {ROUNDS} \
         interleaved rounds, ranges in parentheses; the bare workload {bare:.0} ns a \
         call):\n\n",
        measured_on("trace"),
        3 * LOOPS
    );
    table.push_str("| tracer | added time a syscall | vs perf trace | reads lost (of each run's ");
    table.push_str(&format!("{LOOPS}) |\n| --- | --- | --- | --- |\n"));
    let perf_lines = median(added(2));
    let perf_summary = median(added(5));
    for (i, s) in setups.iter().enumerate().skip(1) {
        let a = added(i);
        let against = if s.lines { perf_lines } else { perf_summary };
        let lost = if s.lines {
            format!(
                "{:?}",
                printed[i]
                    .iter()
                    .map(|&p| LOOPS.saturating_sub(p))
                    .collect::<Vec<_>>()
            )
        } else {
            "-".to_owned()
        };
        table.push_str(&format!(
            "| `{}` | {} | {:.2}x | {lost} |\n",
            s.name,
            cell(&a),
            median(a.clone()) / against
        ));
    }
    println!("\n{table}");
    Ok(table)
}

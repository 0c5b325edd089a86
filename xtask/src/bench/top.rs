//! `cargo xtask bench top`: `rtrace top` against `perf top` at the same
//! rate on a machine kept busy (a `hotfuncs` fixture on every CPU), each
//! printing snapshots to a pipe: the tool's own CPU time (user and
//! system, from `/proc/PID/stat`, so what it costs the machine beside
//! what it shows) and how long until the fixture's hot function first
//! shows. Interleaved rounds, medians and ranges.

use std::{
    io::{BufRead as _, BufReader},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::Context as _;

use super::{measured_on, median, spread};

/// Interleaved rounds.
const ROUNDS: usize = 3;
/// Seconds each tool runs a round.
const RUN_SECS: u64 = 20;
/// Seconds counted as its start: every process's first samples load its
/// unwind tables and symbols (both tools read every process's maps).
const START_SECS: u64 = 8;
/// Samples a second on each CPU, for both.
const HZ: u64 = 99;

/// A process's user and system CPU time so far, in seconds.
fn cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    (ticks(11) + ticks(12)) as f64 / hz
}

/// Keeps every CPU busy with a `hotfuncs` fixture until dropped.
struct Busy(Vec<Child>);

impl Busy {
    fn start(fixture: &str, secs: u64) -> anyhow::Result<Self> {
        let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
        let mut kids = Vec::new();
        for _ in 0..cpus {
            let mut c = Command::new(fixture)
                .args(["cpu", &secs.to_string()])
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .spawn()
                .with_context(|| format!("cannot run {fixture}"))?;
            use std::io::Write as _;
            writeln!(c.stdin.as_mut().context("stdin")?, "go")?;
            kids.push(c);
        }
        Ok(Self(kids))
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// One run of `argv` (its stdin held open: perf top reads keys from it):
/// its CPU seconds over its start and over the rest of the run, and
/// seconds until `hot` first showed.
fn once(argv: &[String], hot: &str) -> anyhow::Result<(f64, f64, Option<f64>)> {
    let started = Instant::now();
    let mut child = Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("cannot run {}", argv[0]))?;
    let pid = child.id();
    let stdout = child.stdout.take().context("stdout")?;
    let (tx, rx) = mpsc::channel();
    let hot = hot.to_owned();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if line.contains(&hot) {
                let _ = tx.send(started.elapsed().as_secs_f64());
            }
        }
    });
    std::thread::sleep(Duration::from_secs(START_SECS));
    let start = cpu_secs(pid);
    std::thread::sleep(Duration::from_secs(RUN_SECS - START_SECS));
    let cpu = cpu_secs(pid);
    // SAFETY: signalling a child of this process.
    unsafe { libc::kill(pid as i32, libc::SIGINT) };
    let _ = child.wait();
    Ok((start, cpu - start, rx.try_recv().ok()))
}

/// Runs the benchmark; the table for `docs/benchmarks.md`.
pub fn run() -> anyhow::Result<String> {
    let rtrace = crate::build()?.to_string_lossy().into_owned();
    let fixture = crate::root()
        .join("target/release/hotfuncs")
        .to_string_lossy()
        .into_owned();
    let hz = HZ.to_string();
    let tools: [(&str, Vec<String>); 2] = [
        (
            "perf top",
            ["perf", "top", "--stdio", "-F", &hz, "-d", "1"]
                .map(str::to_owned)
                .to_vec(),
        ),
        (
            "rtrace top",
            [rtrace.as_str(), "top", "-b", "-F", &hz, "-d", "1"]
                .map(str::to_owned)
                .to_vec(),
        ),
    ];
    eprintln!(
        "bench top: {ROUNDS} interleaved rounds of {RUN_SECS} s each, {HZ} Hz, every CPU busy"
    );
    let mut starts: Vec<Vec<f64>> = vec![Vec::new(); tools.len()];
    let mut steady: Vec<Vec<f64>> = vec![Vec::new(); tools.len()];
    let mut first: Vec<Vec<f64>> = vec![Vec::new(); tools.len()];
    let steady_secs = (RUN_SECS - START_SECS) as f64;
    for round in 1..=ROUNDS {
        for (i, (name, argv)) in tools.iter().enumerate() {
            let _busy = Busy::start(&fixture, RUN_SECS + 5)?;
            let (s, c, f) = once(argv, "hot_alpha")?;
            eprintln!(
                "  round {round}: {name:<11} {s:.2} s CPU over its first {START_SECS} s, then \
                 {:.1}% of a CPU; hot_alpha after {}",
                c / steady_secs * 100.0,
                f.map_or("never".to_owned(), |f| format!("{f:.1} s"))
            );
            starts[i].push(s);
            steady[i].push(c / steady_secs * 100.0);
            first[i].extend(f);
        }
    }
    let cell = |v: &[f64], unit: &str| {
        if v.is_empty() {
            return "never".to_owned();
        }
        let (lo, hi) = spread(v);
        format!("{:.2}{unit} ({lo:.2}-{hi:.2})", median(v.to_vec()))
    };
    let ratio = |v: &[Vec<f64>], i: usize| median(v[i].clone()) / median(v[0].clone()).max(1e-9);
    let mut table = format!(
        "{} (every CPU running a `hotfuncs` fixture; each tool sampling the whole system at \
         {HZ} Hz, refreshing every second, printing to a pipe, for {RUN_SECS} s: its CPU time \
         over its first {START_SECS} s, when it reads every process's maps and symbols, then \
         its share of a CPU after; medians of {ROUNDS} interleaved rounds, ranges in \
         parentheses):\n\n",
        measured_on("top")
    );
    table.push_str(
        "| tool | CPU over the start | vs perf top | CPU after (% of one CPU) | vs perf top | \
         hot function shown after |\n",
    );
    table.push_str("| --- | --- | --- | --- | --- | --- |\n");
    for (i, (name, _)) in tools.iter().enumerate() {
        table.push_str(&format!(
            "| `{name}` | {} | {:.2}x | {} | {:.2}x | {} |\n",
            cell(&starts[i], " s"),
            ratio(&starts, i),
            cell(&steady[i], "%"),
            ratio(&steady, i),
            cell(&first[i], " s")
        ));
    }
    println!("\n{table}");
    Ok(table)
}

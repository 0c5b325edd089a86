//! `cargo xtask bench memleak`: what tracing allocations costs a program
//! that allocates. The fixture (`tests/fixtures/memfix.c`, built without
//! frame pointers) allocates and frees a 64-byte block in a loop and
//! times the loop itself, bare and under each tracer attached to it:
//! rtrace memleak tracing every call, the same with `--sample-bytes
//! 65536`, bpftrace counting `malloc`'s user stacks, and heaptrack
//! (preloaded). Reported: the time each adds per allocation (with its
//! free), and the BPF time per allocation from the kernel's statistics.
//! Interleaved trials, medians and ranges.

use std::{
    io::{BufRead as _, BufReader, Write as _},
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{Context as _, bail};

use super::{Ready, Tracer, bpf_run_ns, measured_on, median, spread};

/// Allocations (each freed) per trial.
const LOOPS: u64 = 200_000;
/// Interleaved trials per configuration.
const TRIALS: usize = 5;
/// bpftrace's count of malloc's callers, as the issue names it.
const BPFTRACE: &str = "uprobe:libc:malloc { @[ustack] = count(); }";

/// A configuration.
#[derive(Clone, Copy, PartialEq)]
enum Tool {
    Bare,
    All,
    Sampled,
    Bpftrace,
    Heaptrack,
}

impl Tool {
    fn label(self) -> &'static str {
        match self {
            Self::Bare => "bare",
            Self::All => "rtrace memleak -p (every call)",
            Self::Sampled => "rtrace memleak -p --sample-bytes 65536",
            Self::Bpftrace => "bpftrace uprobe:libc:malloc @[ustack]",
            Self::Heaptrack => "heaptrack (preloaded)",
        }
    }
}

/// Waits until process `pid` holds a perf event (a uprobe attached).
fn attached(pid: u32) -> anyhow::Result<()> {
    for _ in 0..600 {
        let holds = std::fs::read_dir(format!("/proc/{pid}/fd"))?
            .flatten()
            .filter_map(|e| std::fs::read_link(e.path()).ok())
            .any(|l| l.to_string_lossy().contains("perf_event"));
        if holds {
            std::thread::sleep(Duration::from_millis(200));
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!("bpftrace never attached")
}

/// One trial of `tool`: nanoseconds per allocation, and BPF nanoseconds
/// per allocation.
fn trial(tool: Tool, rtrace: &str, fixture: &str) -> anyhow::Result<(f64, f64)> {
    let args = ["keep", "0", "64", &LOOPS.to_string()].map(String::from);
    let mut cmd = if tool == Tool::Heaptrack {
        let mut c = Command::new("heaptrack");
        c.arg("-o")
            .arg(std::env::temp_dir().join("rtrace-bench-heaptrack"));
        c.arg(fixture);
        c
    } else {
        Command::new(fixture)
    };
    let mut kid = cmd
        .args(&args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("cannot start the fixture")?;
    let mut out = BufReader::new(kid.stdout.take().context("stdout")?);
    let mut line = String::new();
    // heaptrack says what it does first.
    while !line.starts_with("ready") {
        line.clear();
        if out.read_line(&mut line)? == 0 {
            bail!("the fixture ended before it was ready");
        }
    }
    let pid = kid.id().to_string();
    let tracer = match tool {
        Tool::All | Tool::Sampled => {
            let mut c = Command::new(rtrace);
            c.args(["memleak", "-p", &pid, "3600"]);
            if tool == Tool::Sampled {
                c.args(["--sample-bytes", "65536"]);
            }
            Some(Tracer::start(c, Ready::Stderr("Attaching"), None)?)
        }
        Tool::Bpftrace => {
            let mut c = Command::new("bpftrace");
            c.args(["-p", &pid, "-e", BPFTRACE]);
            // Its "Attaching" line does not come through a pipe before it
            // exits: attached is when it holds its uprobe's perf event.
            let t = Tracer::start(c, Ready::After(Duration::ZERO), None)?;
            attached(t.child.id())?;
            Some(t)
        }
        Tool::Bare | Tool::Heaptrack => None,
    };
    let before = bpf_run_ns();
    writeln!(kid.stdin.as_mut().context("stdin")?, "go")?;
    line.clear();
    out.read_line(&mut line)?;
    let bpf = bpf_run_ns().saturating_sub(before) as f64;
    let ns: f64 = line
        .split_whitespace()
        .nth(3)
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("the fixture said {line:?}"))?;
    if let Some(t) = tracer {
        t.stop()?;
    }
    drop(kid.stdin.take());
    kid.wait()?;
    Ok((ns / LOOPS as f64, bpf / LOOPS as f64))
}

/// Runs the benchmark; the table for `docs/benchmarks.md`.
pub fn run() -> anyhow::Result<String> {
    let rtrace = crate::build()?.to_string_lossy().into_owned();
    let fixture = crate::root().join("target/release/memfix_nofp");
    let fixture = fixture.to_string_lossy().into_owned();
    let _stats = aya::sys::enable_stats(aya::sys::Stats::RunTime)
        .context("cannot turn on BPF run-time statistics")?;
    let tools = [
        Tool::Bare,
        Tool::All,
        Tool::Sampled,
        Tool::Bpftrace,
        Tool::Heaptrack,
    ];
    eprintln!("bench memleak: {LOOPS} allocations and frees, {TRIALS} interleaved trials");
    let mut got: Vec<Vec<(f64, f64)>> = tools.iter().map(|_| Vec::new()).collect();
    for n in 1..=TRIALS {
        for (i, &tool) in tools.iter().enumerate() {
            let t = trial(tool, &rtrace, &fixture)?;
            eprintln!(
                "  trial {n}: {:<42} {:>8.0} ns/alloc {:>8.0} bpf ns/alloc",
                tool.label(),
                t.0,
                t.1
            );
            got[i].push(t);
        }
    }
    let bare = median(got[0].iter().map(|t| t.0).collect());
    let added: Vec<Vec<f64>> = got
        .iter()
        .map(|ts| ts.iter().map(|t| t.0 - bare).collect())
        .collect();
    let mut table = format!(
        "{} (the fixture `memfix_nofp`, without frame pointers, allocates and frees a 64-byte \
         block {LOOPS} times and times the loop itself; each tracer is attached to it alone; \
         added time per allocation (with its free) over bare {bare:.0} ns, BPF time per \
         allocation from the kernel's statistics; medians of {TRIALS} interleaved trials, \
         ranges in parentheses):\n\n",
        measured_on("memleak")
    );
    table.push_str("| tracer | added per allocation | BPF per allocation |\n| --- | --- | --- |\n");
    for (i, &tool) in tools.iter().enumerate().skip(1) {
        let (lo, hi) = spread(&added[i]);
        let bpf: Vec<f64> = got[i].iter().map(|t| t.1).collect();
        let bpf_cell = if matches!(tool, Tool::Heaptrack) {
            "-".to_owned()
        } else {
            let (l, h) = spread(&bpf);
            format!("{:.0} ns ({l:.0} to {h:.0})", median(bpf.clone()))
        };
        table.push_str(&format!(
            "| {} | {:.0} ns ({lo:.0} to {hi:.0}) | {bpf_cell} |\n",
            tool.label(),
            median(added[i].clone()),
        ));
    }
    let m = |i: usize| median(added[i].clone()).max(1e-9);
    table.push('\n');
    table.push_str(&format!(
        "- tracing every call, rtrace adds {:.2}x what bpftrace adds per allocation (goal: at \
         most 0.7x; rtrace traps three times an allocation and its free, at malloc's entry and \
         return and at free, bpftrace once);\n- with `--sample-bytes 65536`, rtrace adds {:.2}x \
         what heaptrack adds (goal: at most 0.2x).\n",
        m(1) / m(3),
        m(2) / m(4)
    ));
    println!("\n{table}");
    Ok(table)
}

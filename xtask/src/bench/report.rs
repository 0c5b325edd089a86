//! `cargo xtask bench report`: perf report's tables from one 30 s
//! system-wide profile at 999 Hz, recorded once by rtrace (`--pprof`) and
//! by perf (`perf record -g -a`) side by side over the same workload (the
//! C build of `bench profile`, `make -j2` from clean again and again:
//! hundreds of short-lived processes, thousands of distinct stacks); then, interleaved, the time `rtrace report FILE` takes against
//! `perf report --stdio` on its perf.data, with and without call chains,
//! and `rtrace report` of perf's own perf.data (issue 58: rtrace names
//! perf's recording's frames itself);
//! and the time from Ctrl-C to the table of a live `rtrace profile
//! --report` over the same 30 s.

use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use super::{Ready, Tracer, measured_on, median, spread};

/// How long the profile records.
const SECONDS: u64 = 30;
/// Reports timed per tool, interleaved.
const ROUNDS: usize = 5;

/// The time `args` take to run to the end, their output thrown away.
fn timed(program: &str, args: &[&str]) -> anyhow::Result<f64> {
    let t = Instant::now();
    let out = Command::new(program)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .with_context(|| format!("cannot run {program}"))?;
    if !out.status.success() {
        bail!(
            "{program} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(t.elapsed().as_secs_f64())
}

/// Runs the benchmark; the table for `docs/benchmarks.md`.
pub fn run() -> anyhow::Result<String> {
    let rtrace = crate::build()?;
    let rtrace = rtrace.to_str().context("non-UTF-8 path")?.to_owned();
    let dir = crate::root().join("target/bench");
    std::fs::create_dir_all(&dir)?;
    let pprof = dir.join("report.pb.gz");
    let data = dir.join("report-perf.data");
    let (pprof_s, data_s) = (
        pprof.to_str().context("non-UTF-8 path")?.to_owned(),
        data.to_str().context("non-UTF-8 path")?.to_owned(),
    );
    eprintln!(
        "bench report: recording {SECONDS} s system-wide at 999 Hz with rtrace (--pprof, and a \
         live --report) and perf record -g, side by side"
    );
    let mut cmd = Command::new(&rtrace);
    cmd.args(["profile", "-F", "999", "--pprof", &pprof_s]);
    let recorder = Tracer::start(cmd, Ready::Stderr("Sampling"), None)?;
    let mut cmd = Command::new(&rtrace);
    cmd.args(["profile", "-F", "999", "--report", "-g"]);
    let live = Tracer::start(cmd, Ready::Stderr("Sampling"), None)?;
    let mut cmd = Command::new("perf");
    cmd.args(["record", "-q", "-g", "-a", "-F", "999", "-o", &data_s]);
    let perf = Tracer::start(cmd, Ready::After(Duration::from_secs(1)), None)?;
    super::c_project::builds_for(SECONDS)?;
    let live = live.stop()?;
    let recorded = recorder.stop()?;
    perf.stop()?;
    if !recorded.stderr.contains("wrote") {
        bail!("rtrace wrote no pprof: {}", recorded.stderr);
    }
    let cases: [(&str, &str, Vec<&str>); 6] = [
        // perf's default prints each row's call graph: so does -g.
        (
            "rtrace report FILE -g",
            &rtrace,
            vec!["report", &pprof_s, "-g"],
        ),
        (
            "perf report --stdio",
            "perf",
            vec!["report", "--stdio", "-i", &data_s],
        ),
        (
            "rtrace report FILE --no-children",
            &rtrace,
            vec!["report", &pprof_s, "--no-children"],
        ),
        (
            "perf report --stdio --no-children -g none",
            "perf",
            vec![
                "report",
                "--stdio",
                "--no-children",
                "-g",
                "none",
                "-i",
                &data_s,
            ],
        ),
        (
            "rtrace report perf.data -g",
            &rtrace,
            vec!["report", &data_s, "-g"],
        ),
        (
            "rtrace report perf.data --no-children",
            &rtrace,
            vec!["report", &data_s, "--no-children"],
        ),
    ];
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    for round in 0..ROUNDS {
        for (i, (label, program, args)) in cases.iter().enumerate() {
            let t = timed(program, args)?;
            eprintln!("  round {}: {label:<44} {:.3} s", round + 1, t);
            times[i].push(t);
        }
    }
    let size = |p: &std::path::Path| std::fs::metadata(p).map_or(0, |m| m.len());
    let mut out = format!(
        "{} ({SECONDS} s system-wide at 999 Hz over C builds, `make -j2` of 120 generated \
         files from clean again and again; medians of {ROUNDS} interleaved runs, ranges in \
         parentheses):\n\n",
        measured_on("report")
    );
    out.push_str("| report | time | vs perf |\n| --- | --- | --- |\n");
    for rows in [
        [(0, Some(1)), (4, Some(1)), (1, None)],
        [(2, Some(3)), (5, Some(3)), (3, None)],
    ] {
        for (i, peer) in rows {
            let (lo, hi) = spread(&times[i]);
            let m = median(times[i].clone());
            let ratio = peer.map_or("-".to_owned(), |p| {
                format!("{:.2}x", m / median(times[p].clone()))
            });
            out.push_str(&format!(
                "| `{}` | {m:.3} s ({lo:.3}-{hi:.3}) | {ratio} |\n",
                cases[i].0
            ));
        }
    }
    out.push_str(&format!(
        "\nLive, `rtrace profile -F 999 --report -g` over the same {SECONDS} s: Ctrl-C to the \
         printed table {:.3} s. Files: rtrace's pprof {} KB, perf.data {} KB.\n",
        live.report.as_secs_f64(),
        size(&pprof) / 1024,
        size(&data) / 1024,
    ));
    println!("\n{out}");
    Ok(out)
}

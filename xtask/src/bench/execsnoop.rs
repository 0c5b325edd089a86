//! execsnoop against libbpf-tools' on an exec storm: every exec an event.

use std::{path::Path, process::Command};

use anyhow::Context as _;

use super::{Ready, Row, Setup, TRIALS, helpers::timed, print_costs, report_events, trials};

/// Execs per worker per trial of the exec storm.
const EXECS: u64 = 1_500;
/// Exec storm workers: one per core of these machines.
const EXEC_WORKERS: u64 = 2;

/// Runs the exec storm; returns microseconds per exec.
fn exec_storm(workload: &Path, program: &Path) -> anyhow::Result<(f64, u64)> {
    let ns = timed(
        Command::new(workload)
            .arg(EXECS.to_string())
            .arg(EXEC_WORKERS.to_string())
            .arg(program),
    )?;
    Ok((
        ns / 1000.0 / (EXECS * EXEC_WORKERS) as f64,
        EXECS * EXEC_WORKERS,
    ))
}

/// execsnoop's benchmark: libbpf-tools' execsnoop, then rtrace's in text
/// and in JSON, each counting the storm's execs it saw.
pub fn run() -> anyhow::Result<Row> {
    let rtrace = crate::build()?;
    let workload = crate::root().join("target/release/execstorm");
    // A copy of `true` under a name nothing else runs, to count events by.
    let dir = crate::root().join("target/bench");
    std::fs::create_dir_all(&dir)?;
    let program = dir.join("rtrace_storm");
    std::fs::copy("/bin/true", &program).context("cannot copy /bin/true")?;
    // The workers' argument: in text and in JSON alike, and absent from the
    // storm's own command line, which names the program too.
    let needle = "storm-";
    let setups = vec![
        Setup::bare(),
        Setup::libbpf_tools("execsnoop", Ready::Stdout("PCOMM"), Some(needle))?,
        Setup::traced(
            "rtrace execsnoop",
            &rtrace,
            &["execsnoop"],
            Ready::Stderr("Tracing"),
            Some(needle),
        ),
        Setup::traced(
            "rtrace execsnoop --json",
            &rtrace,
            &["execsnoop", "--json"],
            Ready::Stderr("Tracing"),
            Some(needle),
        ),
    ];
    let expected = EXECS * EXEC_WORKERS;
    eprintln!(
        "bench execsnoop: {EXEC_WORKERS} workers each exec {EXECS} times as fast as they can, \
         median of {TRIALS} interleaved trials"
    );
    let results = trials(&setups, "us/exec", || exec_storm(&workload, &program))?;
    let (ratio, bpf_ratio) = print_costs(&setups, &results, "us/exec");
    report_events(
        &setups,
        &results,
        expected,
        "events seen (fewer means lost)",
    );
    let rtrace_lost = results[2]
        .stops
        .iter()
        .chain(&results[3].stops)
        .any(|t| t.events != expected);
    println!();
    println!(
        "rtrace adds {ratio:.2}x what libbpf-tools adds per exec (BPF time {bpf_ratio:.2}x); \
         events lost: {}",
        if rtrace_lost { "SOME" } else { "none" }
    );
    Ok(Row::new(
        "execsnoop",
        format!("exec storm, {expected} execs by {EXEC_WORKERS} workers"),
        "us/exec",
        (&setups, &results),
        (2, 1),
        Some(expected),
    ))
}

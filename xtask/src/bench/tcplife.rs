//! tcplife against libbpf-tools' on a storm of loopback TCP sessions.

use std::process::Command;

use super::{Ready, Row, Setup, TRIALS, helpers::timed, print_costs, report_events, trials};

/// TCP sessions per trial of the connect storm.
const SESSIONS: u64 = 2_000;

/// tcplife's benchmark: libbpf-tools' tcplife, then rtrace's in text and
/// in JSON, each counting the sessions' server ends it saw.
pub fn run() -> anyhow::Result<Row> {
    let rtrace = crate::build()?;
    let workload = crate::root().join("target/release/tcpsessions");
    // The server end of every session belongs to the workload's server,
    // which names itself so: one line per session should carry its name,
    // whatever context the kernel closed the socket in.
    let needle = "tcpserver";
    let setups = vec![
        Setup::bare(),
        Setup::libbpf_tools("tcplife", Ready::Stdout("PID"), Some(needle))?,
        Setup::traced(
            "rtrace tcplife",
            &rtrace,
            &["tcplife"],
            Ready::Stderr("Tracing"),
            Some(needle),
        ),
        Setup::traced(
            "rtrace tcplife --json",
            &rtrace,
            &["tcplife", "--json"],
            Ready::Stderr("Tracing"),
            Some(needle),
        ),
    ];
    eprintln!(
        "bench tcplife: {SESSIONS} loopback TCP sessions one after another (connect, 100 bytes \
         each way, close) between two processes pinned to CPU 0, median of {TRIALS} \
         interleaved trials"
    );
    let results = trials(&setups, "us/session", || {
        // Both ends on one CPU: each hand-off is then a context switch,
        // not a cross-CPU wakeup of an idle vCPU, whose cost swings with
        // whatever else runs and drowned the tracers' cost.
        let ns = timed(
            Command::new("taskset")
                .args(["-c", "0"])
                .arg(&workload)
                .args(["4", &SESSIONS.to_string(), "100", "100"]),
        )?;
        Ok((ns / 1000.0 / SESSIONS as f64, SESSIONS))
    })?;
    let (ratio, bpf_ratio) = print_costs(&setups, &results, "us/session");
    report_events(
        &setups,
        &results,
        SESSIONS,
        "server ends attributed to the server process",
    );
    println!();
    println!(
        "rtrace adds {ratio:.2}x what libbpf-tools adds per TCP session (BPF time {bpf_ratio:.2}x)"
    );
    Ok(Row::new(
        "tcplife",
        format!("{SESSIONS} loopback TCP sessions"),
        "us/session",
        (&setups, &results),
        (2, 1),
        Some(SESSIONS),
    ))
}

//! Stacks at every event of a tracepoint: rtrace profile -e against
//! perf record -e, on direct writes to a loop device.

use std::{process::Command, time::Duration};

use anyhow::Context as _;

use super::{
    Outcome, Ready, Row, Setup, TRIALS,
    helpers::{IO_WRITES, Loop, timed},
    print_costs, trials,
};

/// Stacks at every event of a tracepoint: `rtrace profile -e
/// block:block_rq_insert` against `perf record -e block:block_rq_insert
/// -ag`, over direct writes to a loop device with an I/O scheduler (so that
/// each request is inserted). The cost per event is the time the tracer
/// adds to each write and its own CPU time; perf runs no BPF.
pub fn run() -> anyhow::Result<Row> {
    let rtrace = crate::build()?;
    let workload = crate::root().join("target/release/directio");
    let dev = Loop::new()?;
    let name = dev.0.trim_start_matches("/dev/");
    std::fs::write(format!("/sys/block/{name}/queue/scheduler"), "mq-deadline")
        .context("cannot give the loop device mq-deadline")?;
    let data = crate::root().join("target/bench/tracepoint-perf.data");
    let data = data.to_str().context("non-UTF-8 path")?.to_owned();
    let setups = vec![
        Setup::bare(),
        Setup::traced(
            "perf record -e block:block_rq_insert -ag",
            "perf",
            &[
                "record",
                "-q",
                "-e",
                "block:block_rq_insert",
                "-a",
                "-g",
                "-o",
                &data,
            ],
            Ready::After(Duration::from_secs(1)),
            None,
        ),
        Setup::traced(
            "rtrace profile -e block:block_rq_insert",
            &rtrace,
            &["profile", "-e", "block:block_rq_insert", "-f"],
            Ready::Stderr("Sampling"),
            None,
        ),
    ];
    eprintln!(
        "bench tracepoint: {IO_WRITES} writes of 4 KiB with O_DIRECT on {} (mq-deadline), one at \
         a time, median of {TRIALS} interleaved trials",
        dev.0
    );
    let results = trials(&setups, "ns/io", || {
        let ns = timed(Command::new(&workload).args([&dev.0, "0", &IO_WRITES.to_string()]))?;
        Ok((ns / IO_WRITES as f64, IO_WRITES))
    })?;
    let (ratio, _) = print_costs(&setups, &results, "ns/io");
    // The whole cost of an event: what the workload waited, and the
    // tracer's own CPU time.
    let whole = |r: &Outcome| r.cost - results[0].cost + r.tracer_ns;
    let cost_ratio = whole(&results[2]) / whole(&results[1]);
    println!();
    println!(
        "rtrace adds {ratio:.2}x perf's time to each insert; with each tracer's own CPU time, \
         {cost_ratio:.2}x perf's cost per event (goal: at most 0.7x)"
    );
    let _ = std::fs::remove_file(&data);
    Ok(Row::new(
        "tracepoint",
        format!("{IO_WRITES} direct 4 KiB writes on a loop device with mq-deadline"),
        "ns/io",
        (&setups, &results),
        (2, 1),
        None,
    ))
}

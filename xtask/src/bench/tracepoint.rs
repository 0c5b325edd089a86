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
    passed_on(&rtrace)?;
    Ok(Row::new(
        "tracepoint",
        format!("{IO_WRITES} direct 4 KiB writes on a loop device with mq-deadline"),
        "ns/io",
        (&setups, &results),
        (2, 1),
        None,
    ))
}

/// getppid calls per trial of [`passed_on`]: `perf bench syscall basic`'s
/// loop, a classic tracepoint event each.
const SYSCALLS: u64 = 2_000_000;

/// What passing a classic tracepoint's events on to perf's listeners
/// costs (the programs return 1, `rtrace_ebpf::tracepoint!`): the kernel
/// then walks the tracepoint's perf events, rtrace's own among them,
/// which has no buffer. `rtrace trace` on `sys_enter_getppid` with a
/// filter that never passes, so that the program itself is as cheap as a
/// program gets, against `perf bench syscall basic` bare; with
/// `RTRACE_BENCH_BASELINE` (a build whose programs returned 0), that build
/// too, in the same interleaved trials: the difference is the price.
fn passed_on(rtrace: &std::path::Path) -> anyhow::Result<()> {
    const SPEC: &str = "t:syscalls:sys_enter_getppid (args->__syscall_nr == 99999)";
    let mut setups = vec![Setup::bare()];
    let baseline = std::env::var_os("RTRACE_BENCH_BASELINE").map(std::path::PathBuf::from);
    if let Some(old) = &baseline {
        setups.push(Setup::traced(
            "baseline rtrace trace (returns 0)",
            old,
            &["trace", SPEC],
            Ready::Stderr("Tracing"),
            None,
        ));
    }
    setups.push(Setup::traced(
        "rtrace trace (passes events on)",
        rtrace,
        &["trace", SPEC],
        Ready::Stderr("Tracing"),
        None,
    ));
    eprintln!(
        "bench tracepoint: {SYSCALLS} getppid calls (perf bench syscall basic), a classic \
         tracepoint event each, median of {TRIALS} interleaved trials"
    );
    let results = trials(&setups, "ns/call", || {
        let out = Command::new("perf")
            .args(["bench", "syscall", "basic", "-l", &SYSCALLS.to_string()])
            .output()
            .context("cannot run perf bench (linux-perf)")?;
        let text = String::from_utf8_lossy(&out.stdout);
        let usecs: f64 = text
            .lines()
            .find(|l| l.contains("usecs/op"))
            .and_then(|l| l.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .with_context(|| format!("no usecs/op in perf bench's output: {text}"))?;
        Ok((usecs * 1000.0, SYSCALLS))
    })?;
    println!();
    let bare = results[0].cost;
    for (s, r) in setups.iter().zip(&results).skip(1) {
        println!(
            "{:<36} {:>6.0} ns/call ({:.0}-{:.0}), {:>+5.0} ns a call over bare, of which the \
             program {:.0} ns",
            s.label,
            r.cost,
            r.cost_spread.0,
            r.cost_spread.1,
            r.cost - bare,
            r.bpf_ns
        );
    }
    if baseline.is_some() {
        let (old, new) = (&results[1], &results[2]);
        println!(
            "passing each event on costs {:+.0} ns a call against the baseline (medians; the \
             spreads above are the noise)",
            (new.cost - new.bpf_ns) - (old.cost - old.bpf_ns)
        );
    }
    Ok(())
}

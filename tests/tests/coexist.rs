//! rtrace never hides events from the system's other observers: with
//! rtrace attached to a tracepoint system-wide, `perf stat` of a workload
//! still counts the workload's own known number of events.
//!
//! A BPF program on a classic tracepoint that returns 0 drops the event
//! for every perf listener of that tracepoint on that CPU; perf stat then
//! counted 0 of 100 inserts beside `rtrace profile -e`. Direct writes to
//! a loop device with an I/O scheduler issue one `block_rq_insert` each
//! from the writer's own context, so `perf stat -- directio` knows what it
//! must count.

use std::process::Command;

use rtrace_integration_tests::{LoopDevice, Rtrace, SIGINT, in_guest, workload_bin};

const WRITES: u64 = 60;

/// `perf stat`'s count of `event` in the direct writes to `dev`.
fn perf_stat_count(dev: &LoopDevice, event: &str) -> u64 {
    let out = Command::new("perf")
        .args(["stat", "-x,", "-e", event, "--"])
        .arg(workload_bin("directio"))
        .args([&dev.path, "0", &WRITES.to_string()])
        .output()
        .expect("perf runs (cargo xtask installs linux-perf)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "perf stat failed: {stderr}");
    // CSV: "COUNT,UNIT,EVENT,..."
    stderr
        .lines()
        .find(|l| l.contains(event))
        .and_then(|l| l.split(',').next())
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no count of {event} in perf stat's output: {stderr}"))
}

#[test]
fn perf_stat_counts_every_event_beside_rtrace() {
    if in_guest() {
        // The guests have no perf; the programs' return value is the same
        // on every kernel, and the host runs this test.
        eprintln!("skipped: the VM guests have no perf to count beside rtrace");
        return;
    }
    const EVENT: &str = "block:block_rq_insert";
    let dev = LoopDevice::new("coexist");
    // Without a scheduler the requests are issued directly, and none is
    // inserted: a new loop device has none (the test once got one).
    if dev.insert_requests().is_none() {
        eprintln!("skipped: this kernel offers no I/O scheduler, so nothing is inserted");
        return;
    }
    // Alone first: the writes' own inserts, at least one each.
    let alone = perf_stat_count(&dev, EVENT);
    assert!(
        alone >= WRITES,
        "perf alone counted {alone} of {WRITES} writes"
    );
    let beside: [&[&str]; 4] = [
        &["profile", "-e", EVENT, "-a"],
        &["stackcount", "t:block:block_rq_insert"],
        &["trace", "t:block:block_rq_insert"],
        &["stat", "-e", EVENT, "-a"],
    ];
    let mut failed = Vec::new();
    for args in beside {
        let rtrace = Rtrace::start_until(args, "Hit Ctrl-C");
        let counted = perf_stat_count(&dev, EVENT);
        let (code, stdout, stderr) = rtrace.stop(SIGINT);
        assert_eq!(code, 0, "rtrace {args:?}: {stderr}");
        // rtrace saw them too: the check is not passed by a tracer that
        // was not attached.
        assert!(
            !stdout.trim().is_empty(),
            "rtrace {args:?} printed nothing: {stderr}"
        );
        eprintln!("beside rtrace {args:?}: perf stat counted {counted} (alone {alone})");
        if counted < WRITES {
            failed.push(format!("{args:?}: {counted} of {WRITES}"));
        }
    }
    assert!(
        failed.is_empty(),
        "perf stat counted fewer of the writes' inserts beside rtrace: {failed:?}"
    );
}

//! `rtrace profile -e` on tracepoints: stacks taken at every event,
//! counted against what the workload did (a loop device's own completed
//! writes, a client's connects), and on counters by perf's names.

use rtrace_integration_tests::{
    LoopDevice, Rtrace, SIGINT, assert_one_line_error, parse_folded, run, run_workload,
};

/// The device's completed writes, from its own stat file.
fn writes_done(dev: &LoopDevice) -> u64 {
    let stat = std::fs::read_to_string(format!("/sys/block/{}/stat", dev.name)).unwrap();
    stat.split_whitespace().nth(4).unwrap().parse().unwrap()
}

/// `-e block:block_rq_insert` over direct writes to a loop device with an
/// I/O scheduler (so that requests are inserted): the writer's stacks hold
/// one count for each write the device completed, each through the
/// writer's own function and the kernel's insert; a request the driver
/// sent back (busy) is inserted again, so `rtrace stat` counts the
/// requeues beside it, and only those may add to the count.
#[test]
fn block_rq_insert_stacks_count_every_request_of_the_writer() {
    const WRITES: u64 = 200;
    let dev = LoopDevice::new("pe");
    std::fs::write(
        format!("/sys/block/{}/queue/scheduler", dev.name),
        "mq-deadline",
    )
    .expect("the loop device takes mq-deadline");
    let requeues =
        Rtrace::start_until(&["stat", "-e", "block:block_rq_requeue", "-x,"], "Counting");
    let rtrace = Rtrace::start_until(
        &["profile", "-e", "block:block_rq_insert", "-f"],
        "Sampling",
    );
    dev.settle();
    let before = writes_done(&dev);
    run_workload(
        "directio",
        &[dev.path.clone(), "0".to_owned(), WRITES.to_string()],
    );
    dev.settle();
    let done = writes_done(&dev) - before;
    let (code, stdout, stderr) = rtrace.stop(SIGINT);
    assert_eq!(code, 0, "{stderr}");
    let (code, counted, stderr) = requeues.stop(SIGINT);
    assert_eq!(code, 0, "{stderr}");
    let requeued: u64 = counted
        .split(',')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{counted}"));
    assert_eq!(done, WRITES, "the writes cannot merge");
    let mine: Vec<(Vec<String>, u64)> = parse_folded(&stdout)
        .into_iter()
        .filter(|(f, _)| f.first().is_some_and(|c| c == "directio"))
        .collect();
    let total: u64 = mine.iter().map(|(_, n)| n).sum();
    assert!(
        (done..=done + requeued).contains(&total),
        "{total} inserts for {done} writes, {requeued} requeued on the machine: {stdout}"
    );
    // Every one of them through the writer's main and the kernel's insert.
    let through = |name: &str| -> u64 {
        mine.iter()
            .filter(|(f, _)| f.iter().any(|x| x.contains(name)))
            .map(|(_, n)| n)
            .sum()
    };
    assert_eq!(through("directio::main"), total, "{stdout}");
    assert_eq!(through("insert"), total, "{stdout}");
}

/// `-e syscalls:sys_enter_connect`: one count for each connect the client
/// made, with its stack up to its own code.
#[test]
fn connect_stacks_are_one_a_connect() {
    const SESSIONS: u64 = 25;
    let rtrace = Rtrace::start_until(
        &["profile", "-e", "syscalls:sys_enter_connect", "-f"],
        "Sampling",
    );
    run_workload(
        "tcpsessions",
        &["4", &SESSIONS.to_string(), "1", "1"].map(str::to_owned),
    );
    let (code, stdout, stderr) = rtrace.stop(SIGINT);
    assert_eq!(code, 0, "{stderr}");
    let mine: Vec<(Vec<String>, u64)> = parse_folded(&stdout)
        .into_iter()
        .filter(|(f, _)| f.first().is_some_and(|c| c == "tcpsessions"))
        .collect();
    let total: u64 = mine.iter().map(|(_, n)| n).sum();
    assert_eq!(total, SESSIONS, "{stdout}");
    let named: u64 = mine
        .iter()
        .filter(|(f, _)| {
            f.iter()
                .any(|x| x.contains("TcpStream") && x.contains("connect"))
        })
        .map(|(_, n)| n)
        .sum();
    assert_eq!(named, SESSIONS, "{stdout}");
}

/// Counters by perf's names sample as before; a hardware one says why it
/// cannot where there is no PMU; bad specs are one line.
#[test]
fn events_are_perfs_names_and_bad_ones_one_line() {
    let (code, stdout, stderr) = run(&["profile", "-e", "cs", "-c", "1", "-f", "1"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("Sampling cs every 1 events"), "{stderr}");
    assert!(!stdout.is_empty(), "a second has context switches");
    if !std::path::Path::new("/sys/bus/event_source/devices/cpu").exists() {
        assert_one_line_error(&["profile", "-e", "LLC-loads", "1"], "no hardware PMU");
    }
    assert_one_line_error(
        &["profile", "-e", "sched:nope_*", "1"],
        "no tracepoint matches",
    );
    assert_one_line_error(
        &["profile", "-e", "sched:sched_switch", "-F", "99", "1"],
        "every event",
    );
    // A value -e cannot take is a usage error, as clap reports them.
    for (spec, why) in [
        ("bogus", "column 1: unknown event"),
        ("cycles:u", "-U or -K"),
    ] {
        let (code, _, stderr) = run(&["profile", "-e", spec]);
        assert_eq!(code, 2, "{stderr}");
        assert!(stderr.contains(why), "{stderr}");
    }
}

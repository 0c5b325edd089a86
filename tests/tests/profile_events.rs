//! `rtrace profile -e` on tracepoints: stacks taken at every event,
//! counted against what the workload did (a loop device's own completed
//! writes, a client's connects), and on counters by perf's names.

use rtrace_integration_tests::{
    LoopDevice, Rtrace, SIGINT, Workload, assert_one_line_error, parse_folded, run,
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
    // An I/O scheduler, so that requests are inserted: mq-deadline, or
    // another the kernel offers.
    let path = format!("/sys/block/{}/queue/scheduler", dev.name);
    let offered = std::fs::read_to_string(&path).unwrap();
    let Some(sched) = ["mq-deadline", "kyber", "bfq"].into_iter().find(|s| {
        offered
            .split_whitespace()
            .any(|o| o.trim_matches(['[', ']']) == *s)
    }) else {
        eprintln!(
            "skipped: this kernel offers no I/O scheduler ({offered:?}), so nothing is inserted"
        );
        return;
    };
    std::fs::write(&path, sched).unwrap_or_else(|e| panic!("{sched} on {path}: {e}"));
    // The writer exists, waiting, before rtrace starts: its tables are
    // loaded with every process's, and its first request is walked whole.
    let (mut w, line) = Workload::start(
        "directio",
        &[
            dev.path.clone(),
            "0".to_owned(),
            WRITES.to_string(),
            "wait".to_owned(),
        ],
    );
    assert_eq!(line.trim(), "ready");
    let requeues =
        Rtrace::start_until(&["stat", "-e", "block:block_rq_requeue", "-x,"], "Counting");
    let rtrace = Rtrace::start_until(
        &["profile", "-e", "block:block_rq_insert", "-f"],
        "Sampling",
    );
    dev.settle();
    let before = writes_done(&dev);
    w.go();
    assert!(w.wait().success());
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
    let through = |name: &str| -> u64 {
        mine.iter()
            .filter(|(f, _)| f.iter().any(|x| x.contains(name)))
            .map(|(_, n)| n)
            .sum()
    };
    // The writer's requests to the device: its writes through the block
    // device's write path (its other inserts are reads of its own pages
    // from the machine's disk).
    let writes = through("blkdev_write_iter");
    assert!(
        (done..=done + requeued).contains(&writes),
        "{writes} inserts for {done} writes, {requeued} requeued on the machine: {stdout}"
    );
    // Each through the writer's own function and the kernel's insert.
    let named: u64 = mine
        .iter()
        .filter(|(f, _)| {
            ["blkdev_write_iter", "directio::main", "insert"]
                .iter()
                .all(|n| f.iter().any(|x| x.contains(n)))
        })
        .map(|(_, n)| n)
        .sum();
    assert_eq!(named, writes, "{stdout}");
}

/// `-e syscalls:sys_enter_connect`: one count for each connect the client
/// made, with its stack up to its own code. (On the 6.1 guest, with
/// Debian 12's libc, the walk from libc's `connect` lands in `each_addr`,
/// one frame up, and stops there: a defect of the walk through that
/// libc's wrapper, open; the host's walks whole.)
#[test]
fn connect_stacks_are_one_a_connect() {
    const SESSIONS: u64 = 25;
    // The client waits, so that it runs before rtrace starts, which then
    // loads its tables (every running process's) before tracing: its
    // first connect is walked whole, system-wide too.
    let (mut w, line) = Workload::start(
        "tcpsessions",
        &["4", &SESSIONS.to_string(), "1", "1", "wait"].map(str::to_owned),
    );
    assert_eq!(line.trim(), "ready");
    let rtrace = Rtrace::start_until(
        &["profile", "-e", "syscalls:sys_enter_connect", "-f"],
        "Sampling",
    );
    w.go();
    assert!(w.wait().success());
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
        .filter(|(f, _)| f.iter().any(|x| x.contains("connection::each_addr")))
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

/// bcc's `stackcount t:sched:sched_switch -K` of a process that sleeps N
/// times: kernel stacks through the scheduler, as many as the kernel's
/// own account of the fixture's switches (getrusage; and the one as it
/// blocks for its last line), most of them through `do_nanosleep` (a
/// microsecond's sleep may end before it blocks, or block twice when woken
/// early).
#[test]
fn stackcount_gives_kernel_stacks_through_schedule() {
    const N: u64 = 500;
    let (mut w, line) = Workload::start("statfix", &[N.to_string()]);
    assert_eq!(line.trim(), "ready");
    let pid = w.pid().to_string();
    let rtrace = Rtrace::start_until(
        &["stackcount", "t:sched:sched_switch", "-K", "-f", "-p", &pid],
        "Tracing 1 functions",
    );
    let done = w.go();
    let switches: u64 = done.split_whitespace().next().unwrap().parse().unwrap();
    let (code, stdout, stderr) = rtrace.stop(SIGINT);
    assert_eq!(code, 0, "{stderr}");
    assert!(w.wait().success());
    let stacks = parse_folded(&stdout);
    let total: u64 = stacks.values().sum();
    assert!(
        (switches..=switches + 2).contains(&total),
        "{total} switches counted, {switches} by the kernel's account: {stdout}"
    );
    assert!(!stacks.is_empty(), "{stderr}");
    for frames in stacks.keys() {
        assert!(frames.iter().any(|f| f == "__schedule"), "{frames:?}");
        // Kernel frames only.
        assert!(!frames.iter().any(|f| f == "main"), "{frames:?}");
    }
    let slept: u64 = stacks
        .iter()
        .filter(|(f, _)| f.iter().any(|x| x == "do_nanosleep"))
        .map(|(_, n)| n)
        .sum();
    assert!(
        (N * 9 / 10..=N + N / 100).contains(&slept),
        "{slept} for {N} sleeps: {stdout}"
    );
}

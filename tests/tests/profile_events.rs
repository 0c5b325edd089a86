//! `rtrace profile -e` on tracepoints and probes: stacks taken at every
//! event (or every N-th), counted against what the workload did (a loop
//! device's own completed writes, a client's connects, a fixture's calls),
//! and on counters by perf's names (every page fault, every context
//! switch); and bcc's stackcount over the same.

use rtrace_integration_tests::{
    LoopDevice, PingPong, Rtrace, SIGHUP, SIGINT, Workload, assert_one_line_error, mechanism_works,
    parse_folded,
    profile::{READY, count_with, run_fixture, start_fixture},
    run, workload_bin,
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
    if dev.insert_requests().is_none() {
        eprintln!("skipped: this kernel offers no I/O scheduler, so nothing is inserted");
        return;
    }
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
/// own account of the fixture's switches (getrusage), most of them
/// through `do_nanosleep` (a microsecond's sleep may end before it blocks,
/// or block twice when woken early). Its reads of its stdin, for its
/// lines, lie outside that account and are counted apart.
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
    // Its block for the last line is counted only if rtrace stops after
    // it: under load the fixture may not have reached its read yet.
    w.wait_in_read();
    let (code, stdout, stderr) = rtrace.stop(SIGINT);
    assert_eq!(code, 0, "{stderr}");
    assert!(w.wait().success());
    let stacks = parse_folded(&stdout);
    let sum = |pick: &dyn Fn(&Vec<String>) -> bool| -> u64 {
        stacks.iter().filter(|(f, _)| pick(f)).map(|(_, n)| n).sum()
    };
    // The fixture waits in a pipe's read for its lines only: once as it
    // blocks for its last line (which the test waits for), and maybe once
    // more where the wait goes round (one run of 6.18 counted two there).
    // Neither is in the kernel's account, which starts after the first
    // line and ends before the last.
    let reading = |f: &Vec<String>| f.iter().any(|x| x.contains("pipe_read"));
    let read = sum(&reading);
    assert!(
        (1..=2).contains(&read),
        "{read} blocks reading a line: {stdout}"
    );
    let counted = sum(&|f| !reading(f));
    // Beyond the kernel's account: the preemptions on the way back to user
    // space before its first count and after its last (the stacks through
    // `exit_to_user_mode`), which a starved guest makes more of.
    let preempted = sum(&|f| f.iter().any(|x| x.contains("exit_to_user_mode")));
    assert!(
        (switches..=switches + preempted).contains(&counted),
        "{counted} switches counted outside reads, {switches} by the kernel's account \
         and {preempted} preemptions: {stdout}"
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

/// The fixture's calls of `statfix_call`, each a uprobe hit.
const CALLS: u64 = 3000;

/// The statfix fixture, ready, and the uprobe spec of its function.
fn statfix() -> (Workload, String) {
    let (w, line) = Workload::start("statfix", &[CALLS.to_string()]);
    assert_eq!(line.trim(), "ready");
    let probe = format!("u:{}:statfix_call", workload_bin("statfix").display());
    (w, probe)
}

/// `-e u:FILE:FUNCTION`: a stack at every call of the fixture's function,
/// the function at the leaf under its caller `main` (the walk from the
/// uprobe's registers); with `-c 7`, every seventh call on each CPU.
#[test]
fn uprobe_stacks_count_every_call_or_every_nth() {
    let (mut w, probe) = statfix();
    let pid = w.pid().to_string();
    let every = Rtrace::start_until(
        &["profile", "-e", &probe, "-U", "-f", "-p", &pid],
        "Sampling",
    );
    let nth = Rtrace::start_until(
        &["profile", "-e", &probe, "-c", "7", "-U", "-f", "-p", &pid],
        "Sampling",
    );
    w.go();
    let (code, stdout, stderr) = every.stop(SIGINT);
    assert_eq!(code, 0, "{stderr}");
    let (code, nth_out, nth_err) = nth.stop(SIGINT);
    assert_eq!(code, 0, "{nth_err}");
    assert!(w.wait().success());
    let stacks = parse_folded(&stdout);
    let total: u64 = stacks.values().sum();
    assert_eq!(total, CALLS, "{stdout}\n{stderr}");
    let whole: u64 = stacks
        .iter()
        .filter(|(f, _)| {
            let leaf = f.iter().position(|x| x == "statfix_call");
            let main = f.iter().position(|x| x == "main");
            matches!((main, leaf), (Some(m), Some(l)) if m < l && l == f.len() - 1)
        })
        .map(|(_, n)| n)
        .sum();
    assert_eq!(whole, CALLS, "main;...;statfix_call: {stdout}");
    // Each CPU counts its own calls: a thread that moved leaves at most a
    // remainder of six on each.
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
    let nth_total: u64 = parse_folded(&nth_out).values().sum();
    assert!(
        ((CALLS / 7).saturating_sub(cpus)..=CALLS / 7).contains(&nth_total),
        "{nth_total} stacks of every 7th of {CALLS} calls: {nth_out}"
    );
}

/// bcc's `stackcount LIBRARY:FUNCTION` with `-i`: the counts printed each
/// interval and started again add up to every call of two runs of the
/// fixture a few seconds apart, in separate intervals; `-s` names frames
/// with offsets and `-v` with addresses.
#[test]
fn stackcount_counts_user_functions_by_interval_with_offsets_and_addresses() {
    let bin = workload_bin("statfix");
    let pattern = format!("{}:statfix_call", bin.display());
    let rtrace = Rtrace::start_until(
        &["stackcount", "-U", "-f", "-i", "1", "-s", &pattern],
        "Tracing 1 functions",
    );
    let addresses = Rtrace::start_until(
        &["stackcount", "-U", "-f", "-v", &pattern],
        "Tracing 1 functions",
    );
    for round in 0..2 {
        if round > 0 {
            std::thread::sleep(std::time::Duration::from_millis(2500));
        }
        let (mut w, _) = statfix();
        w.go();
        assert!(w.wait().success());
    }
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let (code, stdout, stderr) = rtrace.stop(SIGINT);
    assert_eq!(code, 0, "{stderr}");
    let (code, with_addresses, stderr) = addresses.stop(SIGINT);
    assert_eq!(code, 0, "{stderr}");
    // Intervals print a blank line after their stacks.
    let intervals: Vec<u64> = stdout
        .split("\n\n")
        .map(|chunk| parse_folded(chunk).values().sum())
        .collect();
    let total: u64 = intervals.iter().sum();
    assert_eq!(total, 2 * CALLS, "{stdout}");
    assert!(
        intervals.iter().filter(|&&n| n > 0).count() >= 2,
        "two runs 2.5 s apart in separate intervals: {intervals:?}\n{stdout}"
    );
    for frames in parse_folded(&stdout.replace("\n\n", "\n")).keys() {
        let leaf = frames.last().unwrap();
        assert!(leaf.starts_with("statfix_call+0x"), "{frames:?}");
    }
    let stacks = parse_folded(&with_addresses);
    assert_eq!(stacks.values().sum::<u64>(), 2 * CALLS, "{with_addresses}");
    for frames in stacks.keys() {
        let leaf = frames.last().unwrap();
        let (addr, name) = leaf.split_once(' ').unwrap_or_else(|| panic!("{leaf}"));
        assert!(addr.starts_with("0x") && name == "statfix_call", "{leaf}");
    }
}

/// bcc's `stackcount FUNCTION` on kernel functions (kprobes), by glob and
/// by `-r` regular expression: every getppid the fixture made, through
/// the fixture's `statfix_call`. The host has no kprobes: this runs in the
/// VM matrix.
#[test]
fn stackcount_counts_kernel_functions_by_glob_and_regex() {
    if !mechanism_works("kprobe") {
        eprintln!("skipped: no kprobes on this kernel (the VM matrix runs this test)");
        return;
    }
    let (mut w, _) = statfix();
    let pid = w.pid().to_string();
    let glob = Rtrace::start_until(
        &["stackcount", "-f", "-p", &pid, "__x64_sys_getpp?d"],
        "Tracing 1 functions",
    );
    let regex = Rtrace::start_until(
        &["stackcount", "-f", "-r", "-p", &pid, "^__x64_sys_getppid$"],
        "Tracing 1 functions",
    );
    w.go();
    for rtrace in [glob, regex] {
        let (code, stdout, stderr) = rtrace.stop(SIGINT);
        assert_eq!(code, 0, "{stderr}");
        let stacks = parse_folded(&stdout);
        assert_eq!(stacks.values().sum::<u64>(), CALLS, "{stdout}");
        let through: u64 = stacks
            .iter()
            .filter(|(f, _)| {
                // The wrapper and the function it calls may share an
                // address, named by either.
                f.iter().any(|x| x == "statfix_call")
                    && f.last().is_some_and(|l| l.ends_with("sys_getppid"))
            })
            .map(|(_, n)| n)
            .sum();
        assert_eq!(through, CALLS, "{stdout}");
    }
    assert!(w.wait().success());
}

#[test]
fn page_faults_event_counts_every_fault() {
    let pages = 3000;
    let fixture = start_fixture("hotfuncs", &["faults", &pages.to_string()]);
    let pid = fixture.pid().to_string();
    let rtrace = Rtrace::start_until(
        &[
            "profile",
            "-e",
            "page-faults",
            "-c",
            "1",
            "-U",
            "-f",
            "-p",
            &pid,
        ],
        READY,
    );
    run_fixture(fixture);
    let (code, stdout, stderr) = rtrace.stop(SIGINT);
    assert_eq!(code, 0, "{stderr}");
    let faults = count_with(&parse_folded(&stdout), "hotfuncs::touch_pages");
    assert!(
        faults.abs_diff(pages) <= pages / 20,
        "{faults} page faults in touch_pages; it touched {pages} fresh pages"
    );
}

#[test]
fn context_switches_event_counts_every_switch() {
    let mut pp = PingPong::start(2000);
    let pid = pp.pid().to_string();
    let rtrace = Rtrace::start_until(
        &[
            "profile",
            "-e",
            "context-switches",
            "-c",
            "1",
            "-f",
            "-p",
            &pid,
        ],
        READY,
    );
    let before = pp.context_switches();
    pp.play();
    let switches = pp.context_switches() - before;
    let (code, stdout, stderr) = rtrace.stop(SIGHUP);
    assert_eq!(code, 0, "{stderr}");
    let samples: u64 = parse_folded(&stdout).values().sum();
    assert!(
        samples.abs_diff(switches) <= switches / 10 + 5,
        "{samples} context-switch samples; the threads switched {switches} times"
    );
}

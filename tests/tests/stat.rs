//! `rtrace stat` against a fixture that makes known numbers of syscalls,
//! sleeps and page faults, and against `perf stat` counting the same
//! process at the same time.

use std::{
    collections::BTreeMap,
    io::{BufRead as _, BufReader},
    path::PathBuf,
    process::{Command, Stdio},
};

use rtrace_integration_tests::{
    Rtrace, SIGINT, Workload, assert_one_line_error, in_guest, json_lines, mechanism_works, run,
    workload_bin,
};

const N: u64 = 2000;
const EVENTS: &str = "syscalls:sys_enter_*,page-faults,context-switches,sched:sched_switch,cycles";

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("rtrace-stat-{}-{name}", std::process::id()))
}

/// perf's CSV lines (rtrace's `-x,` and perf's own) by event: the value
/// field as written, and the run time.
fn csv(text: &str) -> BTreeMap<String, (String, u64)> {
    text.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            assert!(f.len() >= 5, "not perf's CSV: {l:?}");
            (
                f[2].to_owned(),
                (f[0].to_owned(), f[3].parse().unwrap_or(0)),
            )
        })
        .collect()
}

/// perf stat beside rtrace, started disabled and enabled through its
/// control fifo, which acknowledges: counting has begun when it answers.
struct PerfStat {
    child: std::process::Child,
    out: PathBuf,
    fifos: [PathBuf; 2],
}

impl PerfStat {
    fn start(pid: u32) -> Self {
        let fifos = [temp("ctl"), temp("ack")];
        for f in &fifos {
            let _ = std::fs::remove_file(f);
            let c = std::ffi::CString::new(f.to_str().unwrap()).unwrap();
            // SAFETY: a valid path.
            assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        }
        let out = temp("perf.csv");
        let control = format!("fifo:{},{}", fifos[0].display(), fifos[1].display());
        let child = Command::new("perf")
            .args(["stat", "-D", "-1", "--control", &control, "-x,", "-o"])
            .arg(&out)
            .args(["-e", EVENTS, "-p", &pid.to_string()])
            .stderr(Stdio::inherit())
            .spawn()
            .expect("perf (cargo xtask setup installs it)");
        std::fs::write(&fifos[0], "enable\n").unwrap();
        let mut ack = String::new();
        BufReader::new(std::fs::File::open(&fifos[1]).unwrap())
            .read_line(&mut ack)
            .unwrap();
        assert_eq!(ack.trim(), "ack", "perf stat's control answer");
        Self { child, out, fifos }
    }

    fn stop(mut self) -> String {
        // SAFETY: signalling a child of ours.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        self.child.wait().unwrap();
        let text = std::fs::read_to_string(&self.out).unwrap();
        for f in self.fifos.iter().chain([&self.out]) {
            let _ = std::fs::remove_file(f);
        }
        text
    }
}

/// Counting one process: each syscall exactly as often as the fixture
/// made it, and (on the host, which has perf) every count equal to perf
/// stat's over the same stretch: the syscall tracepoints, which rtrace
/// counts from raw_syscalls by number and perf one tracepoint at a time,
/// and the software counters both take from the kernel. `cycles` is
/// `<not supported>` without a PMU, as perf prints it.
#[test]
fn a_processs_counts_are_the_fixtures_and_perf_stats() {
    let (mut w, line) = Workload::start("statfix", &[N.to_string()]);
    assert_eq!(line.trim(), "ready");
    let pid = w.pid().to_string();
    let rtrace = Rtrace::start_until(&["stat", "-e", EVENTS, "-p", &pid, "-x,"], "Counting");
    let perf = (!in_guest()).then(|| PerfStat::start(w.pid()));
    let done = w.go();
    let kernel: Vec<u64> = done
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    let (switches, faults_seen) = (kernel[0], kernel[1]);
    // Both stop once the fixture waits in read(2) for its last line: a
    // read it has not yet entered when rtrace stops, but has when perf
    // (stopped after) does, differed by one under load.
    w.wait_in_read();
    let (code, stdout, stderr) = rtrace.stop(SIGINT);
    assert_eq!(code, 0, "{stderr}");
    let theirs = perf.map(PerfStat::stop);
    assert!(w.wait().success());
    let ours = csv(&stdout);
    let value = |e: &str| -> u64 {
        ours.get(e)
            .unwrap_or_else(|| panic!("no {e} line:\n{stdout}"))
            .0
            .parse()
            .unwrap_or_else(|_| panic!("{e}: {stdout}"))
    };
    assert_eq!(value("syscalls:sys_enter_getppid"), N, "{stdout}");
    assert_eq!(value("syscalls:sys_enter_clock_nanosleep"), N, "{stdout}");
    assert_eq!(value("syscalls:sys_enter_mmap"), 1, "{stdout}");
    // What the kernel counted for the fixture over its work (getrusage),
    // and after it: the faults of printing `done`, and the switch as it
    // blocks for its last line.
    let faults = value("page-faults");
    assert!(faults_seen >= N, "{faults_seen} faults for {N} pages");
    assert!(
        (faults_seen..=faults_seen + 4).contains(&faults),
        "{faults} page faults counted, {faults_seen} by the kernel's own account"
    );
    // After its last getrusage the fixture prints and blocks for its next
    // line (one switch), and on a busy machine may be preempted a few
    // times meanwhile.
    let cs = value("context-switches");
    assert!(
        (switches..=switches + 4).contains(&cs),
        "{cs} context switches counted, {switches} by the kernel's own account"
    );
    // The tracepoint is where the kernel counts a switch.
    let tp = value("sched:sched_switch");
    assert!(
        (switches..=switches + 4).contains(&tp),
        "{tp} sched_switch events, {switches} switches by the kernel's own account"
    );
    let (cycles, _) = &ours["cycles"];
    let pmu = std::path::Path::new("/sys/bus/event_source/devices/cpu").exists();
    assert_eq!(cycles == "<not supported>", !pmu, "{stdout}");
    let Some(theirs) = theirs else {
        eprintln!("perf stat not compared: the VM guests have no perf");
        return;
    };
    let theirs = csv(&theirs);
    let values = |m: &BTreeMap<String, (String, u64)>| -> BTreeMap<String, String> {
        m.iter()
            // perf stat -p counts sched:sched_switch as 0 (its counter on
            // the task is not running where the tracepoint fires); rtrace's
            // count is checked against the kernel's own account above.
            .filter(|(e, _)| e.starts_with("syscalls:") || *e == "page-faults")
            .map(|(e, (v, _))| (e.clone(), v.clone()))
            .collect()
    };
    assert_eq!(values(&ours), values(&theirs), "rtrace:\n{stdout}");
    assert_eq!(ours["cycles"].0, theirs["cycles"].0);
}

/// A command: its counts, the elapsed, user and system seconds, and its
/// exit status as rtrace's.
#[test]
fn a_command_is_counted_with_its_times_and_exit_status() {
    let (code, stdout, stderr) = run(&[
        "stat",
        "-e",
        "syscalls:sys_enter_exit_group,task-clock",
        "--",
        "sh",
        "-c",
        "for i in 1 2 3; do /bin/true; done; exit 3",
    ]);
    assert_eq!(code, 3, "{stderr}");
    // perf stat's report goes to stderr, as the command's stdout is its own.
    assert!(stdout.is_empty(), "{stdout}");
    assert!(
        stderr.contains("Performance counter stats for 'sh -c for i in 1 2 3"),
        "{stderr}"
    );
    let exits = stderr
        .lines()
        .find(|l| l.contains("syscalls:sys_enter_exit_group"))
        .and_then(|l| l.split_whitespace().next()?.parse::<u64>().ok());
    assert_eq!(exits, Some(4), "the shell and three /bin/true: {stderr}");
    for what in [
        "seconds time elapsed",
        "seconds user",
        "seconds sys",
        "msec task-clock",
    ] {
        assert!(stderr.contains(what), "{what}: {stderr}");
    }
}

/// `--json`: one object a count, with perf stat's keys.
#[test]
fn json_rows_carry_perfs_keys() {
    // To a file: in command mode the report goes to stderr without -o.
    let out = temp("json");
    let (code, _, stderr) = run(&[
        "stat",
        "--json",
        "-e",
        "page-faults,cycles",
        "-o",
        out.to_str().unwrap(),
        "--",
        "/bin/true",
    ]);
    assert_eq!(code, 0, "{stderr}");
    let stdout = std::fs::read_to_string(&out).unwrap();
    let _ = std::fs::remove_file(&out);
    let lines = json_lines(&stdout);
    let rows = lines[0]["rows"]
        .as_array()
        .unwrap_or_else(|| panic!("{stdout}"));
    let faults = rows.iter().find(|r| r["event"] == "page-faults").unwrap();
    assert!(faults["counter-value"].as_f64().unwrap() >= 1.0, "{stdout}");
    assert_eq!(faults["metric-unit"], "/sec");
    assert!(lines[0]["elapsed"].as_f64().unwrap() > 0.0);
}

#[test]
fn bad_input_is_one_clear_line() {
    assert_one_line_error(
        &["stat", "-e", "cycles,bogus", "1"],
        "column 8: unknown event",
    );
    assert_one_line_error(
        &["stat", "-e", "cycles:x", "1"],
        "column 8: unknown modifier",
    );
    assert_one_line_error(
        &["stat", "-e", "nosuch:*", "1"],
        "no tracepoint matches nosuch:*",
    );
    assert_one_line_error(&["stat", "-A", "-p", "1", "1"], "-A splits counts by CPU");
    assert_one_line_error(
        &["stat", "--per-thread", "-a", "1"],
        "--per-thread and --per-process split perf's counters",
    );
    assert_one_line_error(&["stat", "-r", "3", "1"], "-r repeats a command");
    assert_one_line_error(
        &["stat", "-e", "u:/bin/true:no_such_function_here", "1"],
        "no_such_function_here",
    );
    assert_one_line_error(&["stat", "-p", "999999999", "1"], "999999999");
    let (code, _, stderr) = run(&["stat", "--bogus"]);
    assert_eq!(code, 2, "{stderr}");
}

/// `-I MS`: perf's interval lines, times rising, whose counts add up to
/// the fixture's calls.
#[test]
fn intervals_add_up_to_the_whole() {
    let (mut w, line) = Workload::start("statfix", &[N.to_string()]);
    assert_eq!(line.trim(), "ready");
    let pid = w.pid().to_string();
    let rtrace = Rtrace::start_until(
        &[
            "stat",
            "-I",
            "100",
            "-x,",
            "-e",
            "syscalls:sys_enter_getppid",
            "-p",
            &pid,
        ],
        "Counting",
    );
    std::thread::sleep(std::time::Duration::from_millis(250));
    w.go();
    std::thread::sleep(std::time::Duration::from_millis(250));
    let (code, stdout, stderr) = rtrace.stop(SIGINT);
    assert_eq!(code, 0, "{stderr}");
    assert!(w.wait().success());
    let mut last = 0.0;
    let mut total = 0;
    let mut lines = 0;
    for l in stdout.lines() {
        let f: Vec<&str> = l.split(',').collect();
        assert_eq!(f[3], "syscalls:sys_enter_getppid", "{l}");
        let time: f64 = f[0].parse().unwrap();
        assert!(time > last, "{stdout}");
        last = time;
        total += f[1].parse::<u64>().unwrap();
        lines += 1;
    }
    assert!(
        lines >= 4,
        "intervals of 100 ms over half a second: {stdout}"
    );
    assert_eq!(total, N, "{stdout}");
}

/// The fixture's `done` line with threads: its own counts, then each
/// thread's id and calls.
fn thread_calls(done: &str) -> Vec<(u32, u64)> {
    done.split_whitespace()
        .skip(2)
        .map(|t| {
            let (tid, calls) = t.split_once(':').unwrap();
            (tid.parse().unwrap(), calls.parse().unwrap())
        })
        .collect()
}

/// perf's CSV rows with a part first (`-A`, `--per-thread`): by part and
/// event, the value.
fn csv_parts(text: &str) -> BTreeMap<(String, String), String> {
    text.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            assert!(f.len() >= 6, "not perf's CSV with a part: {l:?}");
            ((f[0].to_owned(), f[3].to_owned()), f[1].to_owned())
        })
        .collect()
}

/// `--per-thread` of a process: each thread's syscalls and calls of a
/// function (a uprobe) exactly as that thread made them; and
/// `--per-process` of the whole system: the fixture's row with all of
/// them.
#[test]
fn threads_and_processes_are_counted_apart() {
    const THREADS: u64 = 2;
    let probe = format!("u:{}:statfix_call", workload_bin("statfix").display());
    let events = format!("syscalls:sys_enter_getppid,{probe}");
    let (mut w, line) = Workload::start("statfix", &[N.to_string(), THREADS.to_string()]);
    assert_eq!(line.trim(), "ready");
    let pid = w.pid();
    let pid_s = pid.to_string();
    let threads = Rtrace::start_until(
        &["stat", "--per-thread", "-x,", "-e", &events, "-p", &pid_s],
        "Counting",
    );
    let processes = Rtrace::start_until(
        &["stat", "--per-process", "-x,", "-e", &events, "-a"],
        "Counting",
    );
    let done = w.go();
    let workers = thread_calls(&done);
    assert_eq!(workers.len(), THREADS as usize, "{done}");
    let (code, stdout, stderr) = threads.stop(SIGINT);
    assert_eq!(code, 0, "{stderr}");
    let (code, all, stderr) = processes.stop(SIGINT);
    assert_eq!(code, 0, "{stderr}");
    assert!(w.wait().success());
    let rows = csv_parts(&stdout);
    let mut want = vec![(pid, N)];
    want.extend(workers.iter().copied());
    for (tid, calls) in &want {
        let part = rows
            .keys()
            .map(|(p, _)| p)
            .find(|p| p.ends_with(&format!("-{tid}")))
            .unwrap_or_else(|| panic!("no row of thread {tid}:\n{stdout}"))
            .clone();
        for event in ["syscalls:sys_enter_getppid", probe.as_str()] {
            let value = &rows[&(part.clone(), event.to_owned())];
            assert_eq!(value, &calls.to_string(), "{event} of {part}:\n{stdout}");
        }
    }
    let total: u64 = want.iter().map(|(_, n)| n).sum();
    let rows = csv_parts(&all);
    let part = format!("statfix-{pid}");
    for event in ["syscalls:sys_enter_getppid", probe.as_str()] {
        let value = rows
            .get(&(part.clone(), event.to_owned()))
            .unwrap_or_else(|| panic!("no {event} row of {part}:\n{all}"));
        assert_eq!(value, &total.to_string(), "{event}:\n{all}");
    }
}

/// `-A` over the whole system, the fixture held on one CPU: that CPU's
/// row has every call of its function (a uprobe on its own binary, which
/// nothing else runs), the other CPU's none, and at least as many getppid
/// calls as it made.
#[test]
fn no_aggr_gives_each_cpus_counts() {
    let online = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap();
    if online.trim() == "0" {
        eprintln!("skipped: one CPU online, nothing to split");
        return;
    }
    let probe = format!("u:{}:statfix_call", workload_bin("statfix").display());
    let events = format!("syscalls:sys_enter_getppid,{probe}");
    let (mut w, line) = Workload::start("statfix", &[N.to_string()]);
    assert_eq!(line.trim(), "ready");
    // SAFETY: a cpu_set_t of our own, for the fixture, a child of ours.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(1, &mut set);
        assert_eq!(
            libc::sched_setaffinity(w.pid() as i32, std::mem::size_of_val(&set), &set),
            0
        );
    }
    let rtrace = Rtrace::start_until(&["stat", "-A", "-a", "-x,", "-e", &events], "Counting");
    w.go();
    let (code, stdout, stderr) = rtrace.stop(SIGINT);
    assert_eq!(code, 0, "{stderr}");
    assert!(w.wait().success());
    let rows = csv_parts(&stdout);
    let value = |cpu: &str, event: &str| -> u64 {
        rows.get(&(cpu.to_owned(), event.to_owned()))
            .unwrap_or_else(|| panic!("no {event} row of {cpu}:\n{stdout}"))
            .parse()
            .unwrap()
    };
    assert_eq!(value("CPU1", &probe), N, "{stdout}");
    assert_eq!(value("CPU0", &probe), 0, "{stdout}");
    assert!(value("CPU1", "syscalls:sys_enter_getppid") >= N, "{stdout}");
}

/// `-r 3`: the command runs three times, and each count is the mean of
/// the runs with perf's spread, which for an exact count that does not
/// change is 0.
#[test]
fn repeats_give_the_mean_and_its_spread() {
    let (code, _, stderr) = run(&[
        "stat",
        "-r",
        "3",
        "-e",
        "syscalls:sys_enter_exit_group,task-clock",
        "--",
        "sh",
        "-c",
        "/bin/true; /bin/true; echo ran >&2",
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stderr.matches("ran\n").count(), 3, "{stderr}");
    assert_eq!(
        stderr.matches("Performance counter stats").count(),
        1,
        "{stderr}"
    );
    assert!(stderr.contains("(3 runs):"), "{stderr}");
    let exits = stderr
        .lines()
        .find(|l| l.contains("syscalls:sys_enter_exit_group"))
        .unwrap_or_else(|| panic!("{stderr}"));
    let f: Vec<&str> = exits.split_whitespace().collect();
    assert_eq!(f[0], "3", "the shell and two /bin/true, each run: {stderr}");
    assert!(exits.ends_with("( +-  0.00% )"), "{exits}");
    assert!(
        stderr
            .lines()
            .any(|l| l.contains(" +- ") && l.contains("seconds time elapsed")),
        "{stderr}"
    );
}

/// `-d`, `-dd`, `-ddd`: perf's detailed events in perf's order, `<not
/// supported>` where there is no PMU.
#[test]
fn detailed_levels_add_perfs_cache_events() {
    let out = temp("ddd");
    let path = out.to_str().unwrap();
    let (code, _, stderr) = run(&["stat", "-ddd", "-x,", "-o", path, "--", "/bin/true"]);
    assert_eq!(code, 0, "{stderr}");
    let text = std::fs::read_to_string(&out).unwrap();
    let rows = csv(&text);
    let pmu = std::path::Path::new("/sys/bus/event_source/devices/cpu").exists();
    for event in [
        "L1-dcache-loads",
        "L1-dcache-load-misses",
        "LLC-loads",
        "LLC-load-misses",
        "L1-icache-loads",
        "L1-icache-load-misses",
        "dTLB-loads",
        "dTLB-load-misses",
        "iTLB-loads",
        "iTLB-load-misses",
        "L1-dcache-prefetches",
        "L1-dcache-prefetch-misses",
    ] {
        let (value, _) = rows
            .get(event)
            .unwrap_or_else(|| panic!("no {event}:\n{text}"));
        if !pmu {
            assert_eq!(value, "<not supported>", "{event}");
        }
    }
    let (code, _, stderr) = run(&["stat", "-d", "-x,", "-o", path, "--", "/bin/true"]);
    assert_eq!(code, 0, "{stderr}");
    let text = std::fs::read_to_string(&out).unwrap();
    let _ = std::fs::remove_file(&out);
    let rows = csv(&text);
    assert!(
        rows.contains_key("LLC-load-misses") && !rows.contains_key("dTLB-loads"),
        "{text}"
    );
}

/// Kernel functions counted with kprobes, exactly as often as the
/// fixture's syscalls entered them; a glob counts its functions together.
/// The host has no kprobes: this runs in the VM matrix.
#[test]
fn kernel_functions_are_counted_with_kprobes() {
    if !mechanism_works("kprobe") {
        eprintln!("skipped: no kprobes on this kernel (the VM matrix runs this test)");
        return;
    }
    let (mut w, line) = Workload::start("statfix", &[N.to_string()]);
    assert_eq!(line.trim(), "ready");
    let pid = w.pid().to_string();
    let rtrace = Rtrace::start_until(
        &[
            "stat",
            "-x,",
            "-e",
            "p:__x64_sys_getppid,p:__x64_sys_getpp?d,r:__x64_sys_getppid",
            "-p",
            &pid,
        ],
        "Counting",
    );
    w.go();
    let (code, stdout, stderr) = rtrace.stop(SIGINT);
    assert_eq!(code, 0, "{stderr}");
    assert!(w.wait().success());
    let rows = csv(&stdout);
    for event in [
        "p:__x64_sys_getppid",
        "p:__x64_sys_getpp?d",
        "r:__x64_sys_getppid",
    ] {
        assert_eq!(
            rows.get(event).map(|r| r.0.as_str()),
            Some(N.to_string().as_str()),
            "{event}:\n{stdout}"
        );
    }
}

//! `rtrace runqlat` against real context switches.

use rtrace_integration_tests::{
    PingPong, Rtrace, SIGHUP, SIGINT, SIGTERM, TestCgroup, json_lines, run, text_hist_total,
};

const ROUNDS: u64 = 5_000;
/// Slack between switch-ins counted by runqlat and switch-outs counted by
/// /proc: a thread's wakeup just before tracing starts, and its final sleep
/// with no switch-in after it, each shift one count.
const SLACK: i64 = 6;

/// Traces one ping-pong run with `extra` options and returns (runqlat's
/// total, the workload's context switches during the run, the JSON).
fn traced_run(extra: &[&str]) -> (u64, u64, serde_json::Value) {
    let mut work = PingPong::start(ROUNDS);
    let pid = work.pid().to_string();
    let mut args = vec!["runqlat", "--json", "-p", &pid];
    args.extend_from_slice(extra);
    let rtrace = Rtrace::start(&args);
    let before = work.context_switches();
    work.play();
    let switches = work.context_switches() - before;
    let (code, stdout, stderr) = rtrace.stop(SIGINT);
    assert_eq!(code, 0, "stderr: {stderr}");
    let lines = json_lines(&stdout);
    assert_eq!(lines.len(), 1, "one object at Ctrl-C: {stdout}");
    let obj = lines.into_iter().next().unwrap();
    let total = obj["histograms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["count"].as_u64().unwrap())
        .sum();
    (total, switches, obj)
}

fn assert_agrees(total: u64, switches: u64, what: &str) {
    assert!(
        switches >= ROUNDS,
        "{what}: the workload switched only {switches} times"
    );
    assert!(
        (total as i64 - switches as i64).abs() <= SLACK,
        "{what}: runqlat counted {total} but the threads switched {switches} times"
    );
}

fn counts_agree_when_attached_with(mech: &str) {
    let (total, switches, obj) = traced_run(&["--attach", mech]);
    assert_eq!(obj["attach"], mech);
    assert_agrees(total, switches, mech);
}

#[test]
fn attach_tp_btf_counts_every_context_switch() {
    counts_agree_when_attached_with("tp_btf");
}

#[test]
fn attach_raw_tracepoint_counts_every_context_switch() {
    counts_agree_when_attached_with("raw_tracepoint");
}

#[test]
fn attach_tracepoint_counts_every_context_switch() {
    counts_agree_when_attached_with("tracepoint");
}

#[test]
fn tp_btf_counts_agree_with_task_storage_and_with_the_hash_map() {
    let (total, switches, obj) = traced_run(&["--attach", "tp_btf"]);
    assert_eq!(obj["start_store"], "task_storage");
    assert_agrees(total, switches, "task storage");
    let (total, switches, obj) = traced_run(&["--attach", "tp_btf", "--no-task-storage"]);
    assert_eq!(obj["start_store"], "hash");
    assert_agrees(total, switches, "hash map");
}

#[test]
fn json_has_buckets_and_percentiles() {
    let (total, switches, obj) = traced_run(&[]);
    assert_agrees(total, switches, "default");
    let h = &obj["histograms"][0];
    assert_eq!(h["unit"], "usecs");
    let buckets = h["buckets"].as_array().unwrap();
    let sum: u64 = buckets.iter().map(|b| b["count"].as_u64().unwrap()).sum();
    assert_eq!(sum, total);
    assert_eq!(buckets[0]["low"], 0);
    assert_eq!(buckets[0]["high"], 1);
    let p = &h["percentiles"];
    let (p50, p99, max) = (
        p["p50"].as_u64().unwrap(),
        p["p99"].as_u64().unwrap(),
        h["max"].as_u64().unwrap(),
    );
    assert!(p50 <= p99 && p99 <= max, "{h}");
    assert!(
        obj["errors"].as_object().unwrap().values().all(|v| v == 0),
        "{obj}"
    );
}

#[test]
fn per_process_splits_by_pid() {
    let mut a = PingPong::start(ROUNDS);
    let mut b = PingPong::start(ROUNDS / 2);
    let rtrace = Rtrace::start(&["runqlat", "-P", "--json"]);
    let (a0, b0) = (a.context_switches(), b.context_switches());
    a.play();
    b.play();
    let (da, db) = (a.context_switches() - a0, b.context_switches() - b0);
    let (code, stdout, stderr) = rtrace.stop(SIGINT);
    assert_eq!(code, 0, "{stderr}");
    let obj = json_lines(&stdout).pop().unwrap();
    let hists = obj["histograms"].as_array().unwrap();
    for (pid, switches) in [(a.pid(), da), (b.pid(), db)] {
        let h = hists
            .iter()
            .find(|h| h["pid"] == pid)
            .unwrap_or_else(|| panic!("no histogram for pid {pid}: {obj}"));
        assert_eq!(h["comm"], "pingpong");
        assert_agrees(h["count"].as_u64().unwrap(), switches, "-P");
    }
}

#[test]
fn per_thread_splits_by_tid() {
    let mut work = PingPong::start(ROUNDS);
    let pid = work.pid().to_string();
    let rtrace = Rtrace::start(&["runqlat", "-L", "--json", "-p", &pid]);
    work.play();
    let (_, stdout, _) = rtrace.stop(SIGINT);
    let obj = json_lines(&stdout).pop().unwrap();
    let tids: Vec<u64> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().parse().unwrap())
        .collect();
    let hists = obj["histograms"].as_array().unwrap();
    assert!(
        hists
            .iter()
            .all(|h| tids.contains(&h["tid"].as_u64().unwrap())),
        "{obj}"
    );
    // Each of the two players is woken once per round.
    let busy = hists
        .iter()
        .filter(|h| h["count"].as_u64().unwrap() >= ROUNDS - 2)
        .count();
    assert_eq!(busy, 2, "two busy threads: {obj}");
}

#[test]
fn per_pidns_keys_by_namespace_inode() {
    use std::os::unix::fs::MetadataExt as _;
    let mut work = PingPong::start(ROUNDS);
    let pid = work.pid().to_string();
    let ns = std::fs::metadata(format!("/proc/{pid}/ns/pid"))
        .unwrap()
        .ino();
    let rtrace = Rtrace::start(&["runqlat", "--pidnss", "--json", "-p", &pid]);
    work.play();
    let (_, stdout, _) = rtrace.stop(SIGINT);
    let obj = json_lines(&stdout).pop().unwrap();
    let hists = obj["histograms"].as_array().unwrap();
    assert_eq!(hists.len(), 1, "{obj}");
    assert_eq!(hists[0]["pidns"].as_u64().unwrap(), ns, "{obj}");
    assert!(
        hists[0]["count"].as_u64().unwrap() >= 2 * ROUNDS - 2,
        "{obj}"
    );
}

#[test]
fn cgroup_filter_keeps_only_members() {
    let cgroup = TestCgroup::new("runqlat");
    let mut inside = PingPong::start(ROUNDS);
    let mut outside = PingPong::start(ROUNDS);
    cgroup.add(inside.pid());
    let rtrace = Rtrace::start(&["runqlat", "-P", "--json", "-c", &cgroup.path]);
    let before = inside.context_switches();
    inside.play();
    outside.play();
    let switches = inside.context_switches() - before;
    let (code, stdout, stderr) = rtrace.stop(SIGINT);
    let inside_pid = inside.pid();
    drop(inside);
    drop(cgroup);
    assert_eq!(code, 0, "{stderr}");
    let obj = json_lines(&stdout).pop().unwrap();
    let hists = obj["histograms"].as_array().unwrap();
    assert!(
        hists.iter().all(|h| h["pid"] != outside.pid()),
        "outsider traced: {obj}"
    );
    let h = hists
        .iter()
        .find(|h| h["pid"] == inside_pid)
        .expect("member missing");
    assert_agrees(h["count"].as_u64().unwrap(), switches, "-c");
}

#[test]
fn sigterm_with_stdout_in_a_file_keeps_the_histogram() {
    let dir = std::env::temp_dir().join(format!("rtrace-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("out.txt");
    for signal in [SIGTERM, SIGHUP] {
        let mut work = PingPong::start(ROUNDS);
        let pid = work.pid().to_string();
        let out = std::fs::File::create(&file).unwrap();
        let mut child = std::process::Command::new(rtrace_integration_tests::rtrace_bin())
            .args(["runqlat", "-p", &pid])
            .stdout(out)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        std::io::BufRead::read_line(&mut err, &mut line).unwrap();
        assert!(line.starts_with("Tracing run queue latency"), "{line}");
        let before = work.context_switches();
        work.play();
        let switches = work.context_switches() - before;
        // SAFETY: signalling our own child.
        unsafe { libc::kill(child.id() as i32, signal) };
        assert!(child.wait().unwrap().success(), "exit 0 on signal {signal}");
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(
            text.contains("usecs               : count    distribution"),
            "{text}"
        );
        assert_agrees(text_hist_total(&text), switches, "text in a file");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn interval_and_count_print_that_many_and_exit() {
    let rtrace = Rtrace::start(&["runqlat", "-mT", "1", "2"]);
    let (code, stdout, _) = rtrace.wait();
    assert_eq!(code, 0);
    assert_eq!(
        stdout.matches("msecs               : count").count(),
        2,
        "{stdout}"
    );
    let stamps = stdout
        .lines()
        .filter(|l| l.len() == 8 && l.as_bytes()[2] == b':' && l.as_bytes()[5] == b':')
        .count();
    assert_eq!(stamps, 2, "{stdout}");
}

#[test]
fn bad_input_gets_one_line_and_nonzero_exit() {
    let (code, stdout, stderr) = run(&["runqlat", "-p", "999999999"]);
    assert_eq!((code, stdout.as_str()), (1, ""));
    assert_eq!(stderr.trim(), "rtrace: error: no such process: 999999999");

    let (code, _, stderr) = run(&["runqlat", "--no-such-flag"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("Usage: rtrace runqlat"), "{stderr}");

    let (code, _, stderr) = run(&["runqlat", "-P", "-L"]);
    assert_eq!(code, 2, "{stderr}");

    // A zero interval is named in words, not as clap's range of u64.
    let (code, _, stderr) = run(&["runqlat", "0", "1"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("expected a whole number of 1 or more, got \"0\"")
            && !stderr.contains("18446744073709551615"),
        "{stderr}"
    );

    let (code, _, stderr) = run(&["runqlat", "-c", "/tmp"]);
    assert_eq!(code, 1);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("not a cgroup v2 directory"), "{stderr}");

    // --attach offers only the tool's own chain, so clap refuses the rest
    // as it refuses any bad value, naming the ones there are.
    let (code, _, stderr) = run(&["runqlat", "--attach", "kprobe"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("possible values: tp_btf, raw_tracepoint, tracepoint"),
        "{stderr}"
    );
}

/// `-v` names the mechanism attached with, and the instructions the
/// verifier went through for each program loaded: at least one (a
/// program's own), at most the verifier's limit of a million.
#[test]
fn verbose_names_the_mechanism() {
    let rtrace = Rtrace::start(&["runqlat", "-v"]);
    let (code, _, stderr) = rtrace.stop(SIGINT);
    assert_eq!(code, 0);
    assert!(stderr.contains("runqlat: attached with "), "{stderr}");
    let verified: Vec<u64> = stderr
        .lines()
        .filter_map(|l| l.strip_prefix("rtrace: runqlat: program "))
        .map(|l| {
            let n = l
                .split(": ")
                .nth(1)
                .and_then(|r| r.strip_suffix(" instructions verified"));
            n.and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("{l}"))
        })
        .collect();
    assert!(!verified.is_empty(), "no program's count:\n{stderr}");
    assert!(
        verified.iter().all(|n| (1..=1_000_000).contains(n)),
        "{verified:?}"
    );
}

#[test]
fn without_capabilities_it_names_them() {
    // Drop every capability in a child via setpriv (util-linux).
    let out = std::process::Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
        ])
        .arg(rtrace_integration_tests::rtrace_bin())
        .args(["runqlat", "1", "1"])
        .output()
        .expect("setpriv (util-linux) is needed");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("missing CAP_BPF and CAP_PERFMON"),
        "{stderr}"
    );
}

/// rtrace's text layout is libbpf-tools': both run side by side with
/// timestamps, and their lines must have the same shapes in the same
/// order.
#[test]
fn text_layout_matches_libbpf_tools() {
    if rtrace_integration_tests::in_guest() {
        eprintln!("skipped: the guests have no libbpf-tools; the host runs this test");
        return;
    }
    let mut pingpong = rtrace_integration_tests::PingPong::start(200_000);
    let peer = std::process::Command::new("stdbuf")
        .args(["-oL", "/usr/sbin/runqlat", "-T", "1", "2"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("libbpf-tools' runqlat (Debian package libbpf-tools)");
    let ours = std::thread::spawn(|| rtrace_integration_tests::run(&["runqlat", "-T", "1", "2"]));
    pingpong.play();
    let (code, stdout, stderr) = ours.join().unwrap();
    assert_eq!(code, 0, "{stderr}");
    let theirs = String::from_utf8(peer.wait_with_output().unwrap().stdout).unwrap();
    let layout = rtrace_integration_tests::text_layout;
    assert_eq!(
        layout(&stdout),
        layout(&theirs),
        "rtrace:\n{stdout}\nlibbpf-tools:\n{theirs}"
    );
    assert!(
        layout(&stdout).iter().filter(|l| *l == "rows").count() == 2,
        "{stdout}"
    );
}

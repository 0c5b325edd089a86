//! What `rtrace profile` tells its user beside the stacks: bad input in
//! one clear line, warnings only of output missing or wrong, and stacks
//! that found no room in the stack table counted, not lost. The rest of
//! profile's tests are by what they test: `unwind.rs`, `symbols.rs`,
//! `outputs.rs`, `filters.rs`, `profile_events.rs`, `heatmap.rs`,
//! `python.rs`.

use std::process::{Command, Stdio};

use rtrace_integration_tests::{
    Rtrace, SIGINT, json_lines, parse_folded,
    profile::{READY, count_with, run_fixture, start_fixture},
    run, warnings, workload_bin,
};

#[test]
fn bad_input_is_one_clear_line() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["profile", "-p", "999999999"],
            "no such process: 999999999",
        ),
        (&["profile", "-L", "999999999"], "no such thread: 999999999"),
        (&["profile", "-C", "4096"], "CPU 4096 is not online"),
        (&["profile", "-F", "10000000"], "perf_event_max_sample_rate"),
        (
            &[
                "flamegraph",
                "diff",
                "/nonexistent/a",
                "/nonexistent/b",
                "--svg",
                "/tmp/x.svg",
            ],
            "cannot open /nonexistent/a",
        ),
    ];
    for (args, message) in cases {
        let (code, stdout, stderr) = run(args);
        assert_eq!(code, 1, "{args:?}: {stderr}");
        assert!(stdout.is_empty());
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(
            stderr.starts_with("rtrace: error: ") && stderr.contains(message),
            "{args:?}: {stderr}"
        );
    }
    for args in [
        &["profile", "-F", "0"][..],
        &["profile", "-U", "-K"],
        &["profile", "-F", "99", "-c", "1000"],
        &["profile", "--bogus"],
    ] {
        let (code, _, stderr) = run(args);
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert!(stderr.starts_with("error: "), "{args:?}: {stderr}");
    }
    // Hardware events need a PMU; without one the error says so.
    let has_pmu = std::path::Path::new("/sys/bus/event_source/devices/cpu").exists();
    let (code, _, stderr) = run(&["profile", "-e", "cycles", "1"]);
    if has_pmu {
        assert_eq!(code, 0, "{stderr}");
    } else {
        assert_eq!(code, 1);
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.contains("event cycles is not available") && stderr.contains("no hardware PMU"),
            "{stderr}"
        );
    }
}

#[test]
fn stacks_beyond_the_stack_table_are_counted_not_lost() {
    let (stdout, alpha, beta, stderr) = {
        let fixture = start_fixture("hotfuncs", &["cpu", "2"]);
        let pid = fixture.pid().to_string();
        let rtrace = Rtrace::start_until(
            &[
                "profile",
                "-F",
                "199",
                "-p",
                &pid,
                "-f",
                // Room for one stack: alpha's and beta's, which the
                // fixture takes turns in many times a second, cannot both
                // fit between two moves of the table. With room for two,
                // a run whose samples each fell on one pc of each loop
                // (CI had one) missed none.
                "--stack-storage-size",
                "1",
            ],
            READY,
        );
        let done = run_fixture(fixture);
        let (code, stdout, stderr) = rtrace.stop(SIGINT);
        assert_eq!(code, 0, "{stderr}");
        (stdout, done[0], done[1], stderr)
    };
    let folded = parse_folded(&stdout);
    let total: u64 = folded.values().sum();
    let missed = count_with(&folded, "[Missed User Stack]");
    // Every sample is still counted, under a placeholder when its stack
    // found no room, and the loss is reported. A busy machine gives the
    // fixture less CPU than its 2 s: judged by the CPU time it measured.
    let due = (alpha + beta) as f64 / 1e9 * 199.0;
    assert!(
        total >= 50 && total as f64 >= 0.5 * due,
        "too few samples: {total} for {due:.0} due"
    );
    assert!(missed > 0, "no missed stacks with room for one:\n{stdout}");
    let lost_line = stderr
        .lines()
        .find(|l| l.contains("stacks lost (stack table full"))
        .unwrap_or_else(|| panic!("loss not reported: {stderr}"));
    let lost: u64 = lost_line
        .split_whitespace()
        .nth(2)
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        lost >= missed,
        "{lost} reported, {missed} samples with a missed stack"
    );
}

/// A normal system-wide run, beside a JIT fixture and a process started
/// while it runs, warns only where output is missing or may be wrong:
/// frame-pointer steps through JIT code and a new process's first stacks
/// before its tables are expected, and only `-v` counts them.
#[test]
fn normal_runs_warn_only_of_missing_or_wrong_output() {
    // What a warning may be of: lost or unwalked work, unnamed frames
    // (other processes on the machine may exit before their frames are
    // named; a slow machine may see the JIT fixture delete its map before
    // rtrace reads it). The kind is rtrace's own, given where the warning
    // is made, so a new warning of missing output needs no new word here.
    const OF_OUTPUT: [&str; 3] = ["lost", "unwalked", "unnamed"];
    for (tool, ready) in [("profile", READY), ("offcputime", "Tracing off-CPU time")] {
        for verbose in [false, true] {
            let mut args = vec![tool, "-f"];
            if verbose {
                args.push("-v");
            }
            let rtrace = Rtrace::start_until(&args, ready);
            let jit = Command::new(workload_bin("jit"))
                .args(["1.5", "--delete"])
                .stdout(Stdio::null())
                .spawn()
                .unwrap();
            let fresh = start_fixture("hotfuncs_nofp", &["cpu", "1"]);
            run_fixture(fresh);
            assert!(jit.wait_with_output().unwrap().status.success());
            let (code, stdout, stderr) = rtrace.stop(SIGINT);
            assert_eq!(code, 0, "{stderr}");
            assert!(!stdout.is_empty(), "{tool}: no stacks");
            assert_eq!(
                warnings(&stderr).len(),
                stderr.matches("rtrace: warning").count(),
                "{tool}: a warning without its kind:\n{stderr}"
            );
            for (kind, w) in warnings(&stderr) {
                assert!(
                    OF_OUTPUT.contains(&kind),
                    "{tool}: a warning of no harm: [{kind}] {w}"
                );
            }
            for line in stderr.lines() {
                assert!(
                    !line.starts_with("rtrace: warning")
                        || !line.contains("frame pointer, as their")
                            && !line.contains("where no CFI covers"),
                    "{tool}: an expected fallback warned: {line}"
                );
            }
            if !verbose {
                assert!(
                    !stderr.contains("walked by frame pointer, as their process")
                        && !stderr.contains("where no CFI covers the code"),
                    "{tool}: expected fallbacks shown without -v:\n{stderr}"
                );
            } else if tool == "profile" && stderr.contains("walked in the kernel from CFI") {
                // The JIT fixture's code has no CFI: -v counts its frames.
                assert!(
                    stderr.lines().any(|l| l.starts_with("rtrace: profile: ")
                        && l.ends_with("user frames walked by frame pointer, where no CFI covers the code (JIT, assembly)")),
                    "-v does not count the JIT frames walked by frame pointer:\n{stderr}"
                );
            }
        }
    }
}

/// The instructions the verifier went through for each `profile_*`
/// program `-v` names (the sampling program's walk variants).
fn walks_verified(stderr: &str) -> Vec<(String, u64)> {
    stderr
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("rtrace: profile: program profile_")?;
            let (name, n) = rest.split_once(": ")?;
            let n = n.strip_suffix(" instructions verified")?.parse().ok()?;
            Some((format!("profile_{name}"), n))
        })
        .collect()
}

/// A run with no Python, Java or Node process in scope loads the sampling
/// program's native walk alone, `--preload-runtime-walks` the walk
/// through every runtime's frames, and `--preload-runtime-walks=java`
/// (or `python`, `javascript`) that runtime's walk alone: each loads on
/// every kernel the VM matrix runs (6.1's verifier is the strictest)
/// under the verifier's limit, and a runtime's alone takes it through
/// fewer instructions than every runtime's. (They are loaded after the
/// start by the Python, Java and JavaScript tests, on the host.) Over
/// the whole system, a runtime's
/// process running then is in scope: the run's `-v` names those
/// runtimes, and the walk through the runtimes' frames is loaded
/// (another test's node may run beside this one on the host: then the
/// `--no-python` run loads it for node, and says so).
#[test]
fn the_native_walk_alone_then_every_runtimes_walk_on_demand() {
    let (code, _, stderr) = run(&["profile", "-v", "-F", "99", "1"]);
    assert_eq!(code, 0, "{stderr}");
    // Every kernel here and in the VM matrix has the CFI walk (5.17+).
    let walks = walks_verified(&stderr);
    let names: Vec<&str> = walks.iter().map(|(n, _)| n.as_str()).collect();
    let running = stderr
        .lines()
        .find(|l| l.contains(" processes are running: "));
    match running {
        None => assert_eq!(names, ["profile_native"], "{stderr}"),
        Some(l) => assert!(
            names.len() == 1 && names[0] != "profile_native",
            "{l}: {names:?}\n{stderr}"
        ),
    }
    let (code, _, stderr) = run(&["profile", "-v", "--preload-runtime-walks", "-F", "99", "1"]);
    assert_eq!(code, 0, "{stderr}");
    let walks = walks_verified(&stderr);
    let all = match walks.as_slice() {
        [(name, n)] if name == "profile_runtimes" && *n > 0 && *n < 1_000_000 => *n,
        _ => panic!("{walks:?}:\n{stderr}"),
    };
    eprintln!("every runtime's walk: {walks:?}");
    for (runtime, program) in [
        ("python", "profile_python"),
        ("java", "profile_java"),
        ("javascript", "profile_v8"),
    ] {
        let flag = format!("--preload-runtime-walks={runtime}");
        let (code, _, stderr) = run(&["profile", "-v", &flag, "-F", "99", "1"]);
        assert_eq!(code, 0, "{stderr}");
        let walks = walks_verified(&stderr);
        assert!(
            matches!(walks.as_slice(), [(name, n)] if name == program && *n > 0 && *n < all),
            "{flag}: {walks:?} (every runtime's: {all}):\n{stderr}"
        );
        eprintln!("{runtime}'s walk: {walks:?}");
    }
}

/// Over the whole system, a Python process started after the run began
/// has Python's walk alone loaded for it, and a node started after that
/// has the walk through every runtime's frames swapped in for both: each
/// process's samples name its own function, the Python one's through the
/// swap too.
#[test]
fn a_second_runtime_swaps_one_runtimes_walk_for_every_runtimes() {
    if rtrace_integration_tests::in_guest() {
        eprintln!("skipped: the guests carry no Python or Node.js (the host runs this test)");
        return;
    }
    let dir = std::env::temp_dir().join(format!("rtrace-two-runtimes-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let rows = dir.join("samples.jsonl");
    let script = dir.join("spin.js");
    std::fs::write(
        &script,
        "function spinHere() {\n  const t = Date.now();\n  while (Date.now() - t < 3000) {}\n}\nspinHere();\n",
    )
    .unwrap();
    let rtrace = Rtrace::start_until(
        &[
            "profile",
            "-v",
            "-F",
            "199",
            "--samples",
            rows.to_str().unwrap(),
            "10",
        ],
        "Sampling",
    );
    let mut python = Command::new("python3")
        .args([
            "-c",
            "import time\ndef spin_here():\n    t = time.time()\n    while time.time() - t < 5: pass\nspin_here()",
        ])
        .spawn()
        .expect("python3 (cargo xtask setup installs it)");
    // `-v` says what was loaded when at the end: the Python process has
    // been read (in a tenth of a second) well before node starts.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let mut node = Command::new("node")
        .arg(&script)
        .stdin(Stdio::null())
        .spawn()
        .expect("node (cargo xtask setup installs it)");
    let _ = node.wait();
    let _ = python.wait();
    let (code, _, stderr) = rtrace.stop(SIGINT);
    let text = std::fs::read_to_string(&rows).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(code, 0, "{stderr}");
    let loaded: Vec<&str> = stderr
        .lines()
        .filter_map(|l| l.strip_prefix("rtrace: profile: program "))
        .filter(|l| l.contains(" (the walk through the runtimes' frames, for "))
        .filter_map(|l| l.split(' ').next())
        .collect();
    // Another test's runtime process running at the start has its
    // runtime's walk loaded then: the Python one's comes with every
    // runtime's.
    let running = stderr.contains(" processes are running: ");
    let want: &[&str] = if running {
        &["profile_runtimes"]
    } else {
        &["profile_python", "profile_runtimes"]
    };
    assert_eq!(
        loaded, want,
        "Python's walk, then every runtime's:\n{stderr}"
    );
    for (pid, function) in [(python.id(), "spin_here"), (node.id(), "spinHere")] {
        let stacks: Vec<String> = json_lines(&text)
            .into_iter()
            .filter(|v| v["pid"].as_u64() == Some(u64::from(pid)))
            .map(|v| v["stack"].to_string())
            .collect();
        let named = stacks.iter().filter(|s| s.contains(function)).count();
        // Those taken before the process was read, and while its walk
        // loaded, have native frames only: a tenth of a second or so.
        assert!(
            stacks.len() >= 200 && named * 10 >= stacks.len() * 8,
            "PID {pid}: {named} of {} samples with {function}:\n{stderr}",
            stacks.len()
        );
    }
}

/// Over the whole system, a Python process running when the run starts
/// has the walk through Python's frames loaded before the first sample:
/// its samples have their Python frames, none taken while the verifier
/// works. Under `--no-python` it is not loaded.
#[test]
fn a_runtime_running_at_the_start_of_a_system_wide_run_is_walked_from_its_first_sample() {
    if rtrace_integration_tests::in_guest() {
        eprintln!("skipped: the guests carry no Python (the host runs this test)");
        return;
    }
    // Started, and said so, before rtrace starts: `python3` may be a
    // launcher's shim that runs the interpreter only later.
    let mut busy = Command::new("python3")
        .args([
            "-c",
            "import time\ndef spin_here():\n    t = time.time()\n    while time.time() - t < 20: pass\nprint('ready', flush=True)\nspin_here()",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 (cargo xtask setup installs it)");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(busy.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "ready");
    let pid = busy.id();
    let rows = std::env::temp_dir().join(format!("rtrace-running-{pid}.jsonl"));
    let rows_arg = rows.to_str().unwrap();
    let (code, _, stderr) = run(&["profile", "-v", "-F", "199", "--samples", rows_arg, "2"]);
    // With Python's frames turned off, its walk is not loaded for it:
    // the verifier's time (and a walk that would only step over its
    // frames) spent for nothing.
    let (off_code, _, off_stderr) = run(&["profile", "-v", "--no-python", "-F", "99", "1"]);
    let _ = busy.kill();
    let _ = busy.wait();
    let text = std::fs::read_to_string(&rows).unwrap_or_default();
    let _ = std::fs::remove_file(&rows);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.lines().any(|l| l.contains("Python")
            && l.contains(
                " processes are running: the walk through their frames loaded before sampling"
            )),
        "{stderr}"
    );
    let walks = walks_verified(&stderr);
    // Python's walk alone, or every runtime's if another runtime's
    // processes run too (the line names them all).
    let running = stderr
        .lines()
        .find(|l| l.contains(" processes are running: "))
        .unwrap_or_default();
    let others = ["Java", "JavaScript"].iter().any(|r| running.contains(r));
    let want = if others {
        "profile_runtimes"
    } else {
        "profile_python"
    };
    assert!(
        walks.len() == 1 && walks[0].0 == want,
        "{walks:?}\n{stderr}"
    );
    assert_eq!(off_code, 0, "{off_stderr}");
    let off_walks = walks_verified(&off_stderr);
    // A line without Python: another runtime's processes, in scope still.
    let others_running = off_stderr
        .lines()
        .any(|l| l.contains(" processes are running: "));
    assert!(
        !off_stderr
            .lines()
            .any(|l| l.contains("Python") && l.contains(" processes are running: "))
            && off_walks.len() == 1
            && (off_walks[0].0 == "profile_native"
                || (others_running && off_walks[0].0 != "profile_python")),
        "--no-python loaded the walk through Python's frames: {off_walks:?}\n{off_stderr}"
    );
    // Its samples, by its pid: each with its Python function.
    let mine: Vec<Vec<String>> = json_lines(&text)
        .into_iter()
        .filter(|v| v["pid"].as_u64() == Some(u64::from(pid)))
        .map(|v| {
            v["stack"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|f| f.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default()
        })
        .collect();
    let all = mine.len();
    let named = mine
        .iter()
        .filter(|s| s.iter().any(|f| f.contains("spin_here")))
        .count();
    assert!(all >= 100, "{all} samples of PID {pid}:\n{stderr}");
    // Not every one: a sample in the vDSO, say, is cut short above its
    // Python frames. Those taken while the walk loaded would be a
    // twentieth (it loads in about a tenth of a second).
    assert!(
        named * 100 >= all * 97,
        "PID {pid}: {named} of {all} samples with spin_here:\n{stderr}"
    );
}

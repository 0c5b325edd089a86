//! `stackcount --samples` and `--firefox`: each event on its own, from the
//! shared per-sample stream, against what the workload did.

use std::process::Command;

use rtrace_integration_tests::{Rtrace, SIGINT};

/// A program run a known number of times under a name of its own while
/// `stackcount t:sched:sched_process_exec` writes each exec on its own:
/// exactly that many rows of it in the CSV, in time order, each with the
/// kernel's exec path in its stack; as many of its samples in the Firefox
/// file, in one thread per exec (each its own process).
#[test]
fn stackcount_writes_each_event_on_its_own() {
    let name = format!("sc{}", std::process::id());
    let bin = std::env::temp_dir().join(&name);
    std::fs::copy("/bin/true", &bin).unwrap();
    let dir = std::env::temp_dir();
    let csv = dir.join(format!("rtrace-stackcount-{}.csv", std::process::id()));
    let json = dir.join(format!("rtrace-stackcount-{}.json", std::process::id()));
    let rtrace = Rtrace::start_until(
        &[
            "stackcount",
            "t:sched:sched_process_exec",
            "--samples",
            csv.to_str().unwrap(),
            "--firefox",
            json.to_str().unwrap(),
        ],
        "Tracing",
    );
    const RUNS: usize = 20;
    for _ in 0..RUNS {
        assert!(Command::new(&bin).status().unwrap().success());
    }
    let (code, _, stderr) = rtrace.stop(SIGINT);
    assert_eq!(code, 0, "{stderr}");
    let text = std::fs::read_to_string(&csv).unwrap();
    let mut last = 0u64;
    let mut ours = 0;
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.splitn(7, ',').collect();
        let t: u64 = f[0].parse().unwrap();
        assert!(t >= last, "out of time order: {line}");
        last = t;
        if f[4] == name {
            ours += 1;
            assert_eq!(f[5], "1", "{line}");
            assert!(f[6].contains("execve"), "{line}");
        }
    }
    assert_eq!(ours, RUNS, "{text}");
    let profile: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let in_firefox: u64 = profile["threads"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["name"] == name.as_str() && t["processName"] != "CPUs")
        .map(|t| t["samples"]["length"].as_u64().unwrap())
        .sum();
    assert_eq!(in_firefox, RUNS as u64);
    for f in [&csv, &json, &bin] {
        let _ = std::fs::remove_file(f);
    }
}

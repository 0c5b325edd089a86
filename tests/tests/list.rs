//! `rtrace list` against what the kernel and the files themselves say:
//! tracefs' `available_events` and `format` files, the PMU's presence,
//! `available_filter_functions`, and the USDT probes a fixture's source
//! declares.

use std::collections::BTreeSet;

use rtrace_integration_tests::{Workload, assert_one_line_error, json_lines, run, workload_bin};

/// `rtrace list ARGS --json`'s entries.
fn list(args: &[&str]) -> Vec<serde_json::Value> {
    let mut all = vec!["list"];
    all.extend_from_slice(args);
    all.push("--json");
    let (code, stdout, stderr) = run(&all);
    assert_eq!(code, 0, "{all:?}: {stderr}");
    json_lines(&stdout)
}

fn names(entries: &[serde_json::Value]) -> BTreeSet<String> {
    entries
        .iter()
        .map(|e| e["name"].as_str().unwrap().to_owned())
        .collect()
}

/// tracefs, where rtrace mounted it (or found it).
fn tracefs() -> std::path::PathBuf {
    ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"]
        .iter()
        .map(std::path::PathBuf::from)
        .find(|p| p.join("available_events").is_file())
        .expect("tracefs is mounted once rtrace has listed")
}

/// `list 'sched:*'` names every scheduler tracepoint the kernel has, and
/// nothing else.
#[test]
fn a_glob_lists_the_kernels_tracepoints() {
    let listed = list(&["sched:*"]);
    let text = std::fs::read_to_string(tracefs().join("available_events")).unwrap();
    let want: BTreeSet<String> = text
        .lines()
        .filter(|l| l.starts_with("sched:"))
        .map(str::to_owned)
        .collect();
    assert!(want.contains("sched:sched_switch"));
    assert_eq!(names(&listed), want);
    assert!(listed.iter().all(|e| e["kind"] == "tracepoint"));
    // bcc's spelling keeps tracepoints only.
    assert_eq!(
        names(&list(&["t:sched:sched_switch"])),
        ["sched:sched_switch".to_owned()].into()
    );
}

/// `-v`: a tracepoint's fields, as its format file declares them, the
/// common ones left out.
#[test]
fn verbose_gives_a_tracepoints_fields_as_its_format_file() {
    let listed = list(&["-v", "sched:sched_switch"]);
    assert_eq!(listed.len(), 1);
    let format =
        std::fs::read_to_string(tracefs().join("events/sched/sched_switch/format")).unwrap();
    let want: Vec<String> = format
        .lines()
        .filter_map(|l| l.trim().strip_prefix("field:"))
        .map(|l| l.split(';').next().unwrap().trim().to_owned())
        .filter(|d| !d.contains("common_"))
        .collect();
    let got: Vec<String> = listed[0]["fields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["decl"].as_str().unwrap().to_owned())
        .collect();
    assert!(want.iter().any(|d| d.contains("prev_pid")), "{want:?}");
    assert_eq!(got, want);
    let (code, text, stderr) = run(&["list", "-v", "sched:sched_switch"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(text.contains("      pid_t next_pid;"), "{text}");
}

/// Hardware events are listed either way, marked as missing where the
/// machine has no PMU (as no machine here has).
#[test]
fn hardware_events_say_whether_this_machine_has_a_pmu() {
    let pmu = std::fs::read_dir("/sys/bus/event_source/devices")
        .unwrap()
        .flatten()
        .any(|e| e.file_name() == "cpu" || e.file_name().to_string_lossy().starts_with("cpu_"));
    let listed = list(&["cycles"]);
    assert_eq!(names(&listed), ["cpu-cycles OR cycles".to_owned()].into());
    assert_eq!(listed[0]["available"], pmu);
    if !pmu {
        assert!(
            listed[0]["why"]
                .as_str()
                .unwrap()
                .contains("no hardware PMU"),
            "{listed:?}"
        );
    }
    let soft = list(&["*-faults"]);
    assert!(
        soft.iter()
            .all(|e| e["kind"] == "software" && e["available"] == true)
    );
    assert!(names(&soft).contains("page-faults OR faults"), "{soft:?}");
}

/// Kernel functions: listed with `p:GLOB` where the kernel lets tracefs
/// say which can be probed, and otherwise named as what cannot be
/// listed, with the file that refused.
#[test]
fn kernel_functions_are_listed_or_the_refusal_is_named() {
    let file = "/sys/kernel/tracing/available_filter_functions";
    let (code, stdout, stderr) = run(&["list", "p:vfs_rea?"]);
    assert_eq!(code, 0, "{stderr}");
    match std::fs::read_to_string(file) {
        Ok(text) => {
            let want: BTreeSet<String> = text
                .lines()
                .filter_map(|l| l.split_whitespace().next())
                .filter(|n| n.len() == 8 && n.starts_with("vfs_rea"))
                .map(|n| format!("p:{n}"))
                .collect();
            assert!(want.contains("p:vfs_read"), "{want:?}");
            assert_eq!(names(&list(&["p:vfs_rea?"])), want);
        }
        Err(_) => assert!(
            stdout.contains("kernel functions (p:NAME, r:NAME) cannot be listed")
                && stdout.contains(file),
            "{stdout}"
        ),
    }
}

/// `-l BINARY` and `-p PID`: the fixture's USDT probes, as its source
/// declares them (`DTRACE_PROBEn(provider, name, ...)`), and its functions.
#[test]
fn a_binarys_usdt_probes_and_functions_are_listed() {
    let source = include_str!("../fixtures/usdtfix.c");
    let want: BTreeSet<String> = source
        .lines()
        .filter_map(|l| l.trim().strip_prefix("DTRACE_PROBE"))
        .filter_map(|l| {
            let args = l.split_once('(')?.1;
            let mut parts = args.split(',').map(str::trim);
            Some(format!(
                "{}:{}",
                parts.next()?,
                parts.next()?.trim_end_matches(')')
            ))
        })
        .collect();
    assert!(want.len() >= 2, "{want:?}");
    let bin = workload_bin("usdtfix");
    let bin = bin.to_str().unwrap();
    let listed = list(&["-l", bin]);
    let probes: BTreeSet<String> = listed
        .iter()
        .filter(|e| e["kind"] == "usdt")
        .map(|e| {
            e["name"]
                .as_str()
                .unwrap()
                .strip_prefix(&format!("u:{bin}:"))
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(probes, want);
    assert!(
        names(&listed).contains(&format!("u:{bin}:main")),
        "{listed:?}"
    );
    // Of a running process: the functions of the files it maps, by the
    // paths it maps them at (the fixture waits for its go, with libc
    // mapped; the guests' own tools are static).
    // Run from a directory whose name has a space, which the mapping's
    // path keeps.
    let dir = std::env::temp_dir().join(format!("rtrace list {}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // As the process maps it, through any link in the temporary path.
    let dir = std::fs::canonicalize(&dir).unwrap();
    let copy = dir.join("hotfuncs_nofp");
    std::fs::copy(workload_bin("hotfuncs_nofp"), &copy).unwrap();
    let mut cmd = std::process::Command::new(&copy);
    cmd.args(["cpu", "0"]);
    let (mut w, line) = Workload::start_command(cmd);
    assert!(line.starts_with("ready"), "{line}");
    let pid = w.pid().to_string();
    let mapped = list(&["-p", &pid, "u:*:clock_gettime"]);
    let own = list(&["-p", &pid, "u:*:main"]);
    w.go();
    assert!(w.wait().success());
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        mapped.iter().any(|e| e["kind"] == "user-function"
            && e["name"].as_str().unwrap().starts_with("u:/")
            && e["name"].as_str().unwrap().contains("libc")),
        "{mapped:?}"
    );
    let want = format!("u:{}:main", copy.display());
    assert!(names(&own).contains(&want), "no {want:?} in {own:?}");
}

#[test]
fn bad_input_is_one_clear_line() {
    assert_one_line_error(
        &["list", "-l", "/nonexistent/binary"],
        "cannot open /nonexistent/binary",
    );
    assert_one_line_error(&["list", "-p", "999999999"], "process 999999999");
}

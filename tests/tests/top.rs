//! `rtrace top`'s snapshots (`-b`, `--once`, `--json`) against a fixture
//! whose two hot functions split its CPU time about three to one, by its
//! own measure: the hot functions have their rows, with the fixture's
//! split.

use rtrace_integration_tests::{Rtrace, SIGINT, Workload, assert_one_line_error, json_lines};

/// Runs `hotfuncs cpu 3` under `rtrace top ARGS -p PID`, stopped after the
/// work; returns rtrace's stdout and the fixture's CPU nanoseconds in
/// `hot_alpha` and `hot_beta`.
fn top_of_hotfuncs(args: &[&str]) -> (String, f64, f64) {
    let (mut work, ready) = Workload::start("hotfuncs", &["cpu".into(), "3".into()]);
    assert_eq!(ready.trim(), "ready");
    let pid = work.pid().to_string();
    let mut full = vec!["top", "-p", &pid, "-F", "499"];
    full.extend_from_slice(args);
    let rtrace = Rtrace::start_until(&full, "Sampling");
    let done = work.go();
    work.wait();
    let (code, stdout, stderr) = rtrace.stop(SIGINT);
    assert_eq!(code, 0, "{stderr}");
    let ns: Vec<f64> = done
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    (stdout, ns[0], ns[1])
}

/// About 1,500 samples: a split's binomial spread is about a point, and
/// the 10 points fail only on a real error.
const TOLERANCE: f64 = 10.0;

#[test]
fn json_snapshots_name_the_hot_functions_in_their_split() {
    let (stdout, alpha, beta) = top_of_hotfuncs(&["-b", "--json", "-d", "1"]);
    let snaps = json_lines(&stdout);
    let last = snaps
        .last()
        .unwrap_or_else(|| panic!("no snapshot: {stdout}"));
    assert_eq!(last["tool"], "top");
    let share = |name: &str| -> f64 {
        last["rows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["symbol"].as_str().unwrap().ends_with(name))
            .unwrap_or_else(|| panic!("no row of {name}: {last}"))["total_percent"]
            .as_f64()
            .unwrap()
    };
    let (a, b) = (share("hot_alpha"), share("hot_beta"));
    // The two functions' split of what they both took, against the
    // fixture's own CPU times.
    let want = alpha / (alpha + beta) * 100.0;
    let got = a / (a + b) * 100.0;
    assert!(
        (got - want).abs() <= TOLERANCE,
        "hot_alpha {got:.1}% of the two, the fixture measured {want:.1}%: {last}"
    );
    for r in last["rows"].as_array().unwrap() {
        assert_eq!(r["comm"], "hotfuncs", "{r}");
        let (s, t) = (
            r["self_percent"].as_f64().unwrap(),
            r["total_percent"].as_f64().unwrap(),
        );
        assert!(s <= t + 1e-6 && t <= 100.0 + 1e-6, "{r}");
    }
}

#[test]
fn text_snapshots_parse() {
    let (stdout, _, _) = top_of_hotfuncs(&["-b", "-d", "1", "--rows", "8"]);
    let snapshot = stdout
        .split("rtrace top: ")
        .filter(|s| !s.trim().is_empty())
        .last()
        .unwrap_or_else(|| panic!("no snapshot: {stdout}"));
    let mut lines = snapshot.lines().skip(1);
    let head: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(
        head,
        [
            "SELF", "CHILDREN", "COMM", "PID", "SHARED", "OBJECT", "SYMBOL"
        ]
    );
    let rows: Vec<Vec<&str>> = lines
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert!(rows.len() <= 8, "{snapshot}");
    let names: Vec<&str> = rows.iter().map(|r| *r.last().unwrap()).collect();
    assert!(
        names.contains(&"hotfuncs::hot_alpha") && names.contains(&"hotfuncs::hot_beta"),
        "{snapshot}"
    );
    for r in &rows {
        for pct in &r[..2] {
            let v: f64 = pct.trim_end_matches('%').parse().unwrap();
            assert!((0.0..=100.0).contains(&v), "{snapshot}");
        }
    }
    // Rows go by self share, highest first.
    let selfs: Vec<f64> = rows
        .iter()
        .map(|r| r[0].trim_end_matches('%').parse().unwrap())
        .collect();
    assert!(selfs.windows(2).all(|w| w[0] >= w[1]), "{snapshot}");
}

/// `--once` prints one snapshot after -d seconds and exits by itself.
#[test]
fn once_prints_one_snapshot_and_exits() {
    let (code, stdout, stderr) = rtrace_integration_tests::run(&["top", "--once", "-d", "1"]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stdout.matches("rtrace top: ").count(), 1, "{stdout}");
}

#[test]
fn bad_input_is_one_clear_line() {
    assert_one_line_error(&["top", "-p", "999999999"], "999999999");
    let (code, _, stderr) = rtrace_integration_tests::run(&["top", "-d", "0"]);
    assert_eq!(code, 2, "{stderr}");
    let (code, _, stderr) = rtrace_integration_tests::run(&["top", "--decay", "1.5"]);
    assert_eq!(code, 2, "{stderr}");
}

//! JavaScript frames walked in the kernel, with no flag: Node.js (this
//! machine's node 20) profiled as it is started, its functions named
//! `name (file:line)` from V8's own objects, in whole chains down to
//! node's C++ start, and split as the fixture measured itself.
//!
//! The guests have no Node.js; these run on the host.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use rtrace_integration_tests::{
    Rtrace, SIGINT, in_guest, parse_folded, pidreuse::assert_share_within, rtrace_bin,
};

/// The fixture: `main` calls `hot` (70 % of its time) and `warm` (30 %),
/// as it measures itself (`split hot=NS warm=NS`).
fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/hot.js")
}

/// The 1-based line of the fixture's line that starts with `start`: where
/// V8 says function `start` begins.
fn line_of(script: &Path, start: &str) -> usize {
    std::fs::read_to_string(script)
        .unwrap()
        .lines()
        .position(|l| l.starts_with(start))
        .unwrap_or_else(|| panic!("no line starts with {start:?}"))
        + 1
}

/// The value of `key=` in the fixture's `split` line.
fn measured(stdout: &str, key: &str) -> f64 {
    stdout
        .lines()
        .filter(|l| l.starts_with("split "))
        .flat_map(|l| l.split_whitespace())
        .find_map(|kv| kv.strip_prefix(key))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no split {key} in {stdout:?}"))
}

/// What a profile of node running the fixture says: samples whose
/// innermost JavaScript frame is `hot` and `warm`, and of those the ones
/// whose stack is whole (`main` right below, and node's C++ start at the
/// root).
#[derive(Debug, Default)]
struct Split {
    hot: u64,
    warm: u64,
    whole: u64,
}

fn split(folded: &str, script: &Path) -> Split {
    let path = script.display();
    let hot = format!("hot ({path}:{})", line_of(script, "function hot("));
    let warm = format!("warm ({path}:{})", line_of(script, "function warm("));
    let main = format!("main ({path}:{})", line_of(script, "function main("));
    let mut out = Split::default();
    for (stack, n) in parse_folded(folded) {
        if stack.first().is_none_or(|c| c != "node") {
            continue;
        }
        let Some(leaf) = stack.iter().rposition(|f| f.contains(".js:")) else {
            continue;
        };
        if stack[leaf] == hot {
            out.hot += n;
        } else if stack[leaf] == warm {
            out.warm += n;
        } else {
            continue;
        }
        let whole = leaf > 0
            && stack[leaf - 1] == main
            && stack.iter().any(|f| f.starts_with("node::Start("));
        if whole {
            out.whole += n;
        }
    }
    out
}

/// Checks a profile's split against the fixture's own clock: within 4
/// standard deviations of sampling, with at least 95 % whole chains.
fn check(what: &str, s: &Split, stdout: &str, folded: &str, stderr: &str) {
    let js = s.hot + s.warm;
    assert!(
        js >= 200,
        "{what}: {js} samples in hot and warm ({s:?})\n{folded}\n{stderr}"
    );
    let (hot_ns, warm_ns) = (measured(stdout, "hot="), measured(stdout, "warm="));
    assert_share_within(what, s.hot, s.warm, hot_ns / (hot_ns + warm_ns), 4.0);
    assert!(
        s.whole as f64 >= 0.95 * js as f64,
        "{what}: {} of {js} samples have the whole chain\n{folded}",
        s.whole
    );
    // No advice to restart node with a perf flag: its JIT code is
    // named without one.
    assert!(
        !stderr.contains("--perf-basic-prof"),
        "{what}: a warning of JIT frames without a perf map: {stderr}"
    );
}

/// `profile -- node hot.js`, with no perf flag: `hot` and `warm` named
/// with their script and line, split as the fixture measured, whole to
/// node's start.
#[test]
fn node_functions_are_named_with_no_flag_and_split_as_measured() {
    if in_guest() {
        eprintln!("skipped: the VM guests have no Node.js; the host runs it");
        return;
    }
    let script = script();
    let folded = std::env::temp_dir().join(format!("rtrace-js-{}.folded", std::process::id()));
    let out = Command::new(rtrace_bin())
        .args(["profile", "-F", "499", "-f", "-o"])
        .arg(&folded)
        .args(["--", "node"])
        .arg(&script)
        .arg("3")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let text = std::fs::read_to_string(&folded).unwrap();
    let _ = std::fs::remove_file(&folded);
    let s = split(&text, &script);
    check("profile -- node", &s, &stdout, &text, &stderr);
}

/// `profile -p PID` of a node started before rtrace: its V8 is found
/// from its maps as they are, and its functions named the same.
#[test]
fn a_node_started_before_rtrace_is_named_too() {
    if in_guest() {
        eprintln!("skipped: the VM guests have no Node.js; the host runs it");
        return;
    }
    let script = script();
    let node = Command::new("node")
        .arg(&script)
        .arg("4")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // Past its start: V8's code range is mapped and main's loop runs.
    std::thread::sleep(std::time::Duration::from_millis(700));
    let pid = node.id().to_string();
    let rtrace = Rtrace::start_until(&["profile", "-F", "499", "-f", "-p", &pid], "Sampling");
    let out = node.wait_with_output().unwrap();
    let (code, folded, stderr) = rtrace.stop(SIGINT);
    assert_eq!(code, 0, "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let s = split(&folded, &script);
    // The fixture's split is of its whole run; rtrace saw its last three
    // seconds, which keep the same split (each call picks the function
    // behind its share).
    check("profile -p", &s, &stdout, &folded, &stderr);
}

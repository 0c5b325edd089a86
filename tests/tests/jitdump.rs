//! JIT code named by jitdumps (`jit-PID.dump`, perf's format), which say
//! which code was at an address when: a fixture that puts two functions
//! at one address one after the other, and Node's `--perf-prof`. Both run
//! under `profile -- CMD`, so the dumps are read as they grow and once
//! more at exit; the fixture deletes its dump before it exits, which
//! rtrace must read all the same.

use std::{
    path::PathBuf,
    process::{Command, Output, Stdio},
};

use rtrace_integration_tests::{assert_share, in_guest, parse_folded, rtrace_bin, workload_bin};

/// Runs `rtrace ARGS` in `dir`; the command's own output is on stdout.
fn rtrace_in(dir: Option<&std::path::Path>, args: &[&str]) -> Output {
    let mut cmd = Command::new(rtrace_bin());
    cmd.args(args).stdin(Stdio::null());
    if let Some(dir) = dir {
        cmd.current_dir(dir);
    }
    cmd.output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A file in the temporary directory, removed when dropped.
struct TempPath(PathBuf);

impl TempPath {
    fn new(name: &str) -> Self {
        Self(std::env::temp_dir().join(format!("rtrace-{name}-{}", std::process::id())))
    }
}

impl Drop for TempPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The value of `key=` in the line of `stdout` that starts with `prefix`.
fn measured(stdout: &str, prefix: &str, key: &str) -> f64 {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix(prefix))
        .and_then(|l| l.split_whitespace().find_map(|kv| kv.strip_prefix(key)))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {prefix}{key} in {stdout}"))
}

#[test]
fn code_at_one_address_is_named_by_what_was_there_when_sampled() {
    let folded = TempPath::new("jitdump.folded");
    let fixture = workload_bin("jitdump");
    let out = rtrace_in(
        None,
        &[
            "profile",
            "-F",
            "499",
            "-f",
            "-o",
            folded.0.to_str().unwrap(),
            "--",
            fixture.to_str().unwrap(),
            "2",
            "2",
            "--delete",
        ],
    );
    let stdout = text(&out.stdout);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let pid: u32 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("ready ")?.parse().ok())
        .unwrap_or_else(|| panic!("no ready PID in {stdout}"));
    assert!(
        !std::path::Path::new(&format!("/tmp/jit-{pid}.dump")).exists(),
        "the fixture did not delete its dump"
    );
    let cpu_first = measured(&stdout, "cpu ", "first=");
    let cpu_second = measured(&stdout, "cpu ", "second=");

    let (mut first, mut second, mut unnamed) = (0u64, 0u64, 0u64);
    let text = std::fs::read_to_string(&folded.0).unwrap();
    for (stack, n) in parse_folded(&text) {
        // The JIT frame is the one the fixture's main calls.
        let Some(at) = stack.iter().position(|f| f == "jitdump::main") else {
            continue;
        };
        match stack.get(at + 1).map(String::as_str) {
            Some("rtrace_jitdump_first") => first += n,
            Some("rtrace_jitdump_second") => second += n,
            Some("[unknown]") => unnamed += n,
            _ => {}
        }
    }
    let jit = first + second + unnamed;
    assert!(jit >= 300, "too few JIT samples: {jit}\n{text}\n{stderr}");
    assert!(
        (first + second) as f64 >= 0.95 * jit as f64,
        "only {} of {jit} JIT samples named\n{stderr}",
        first + second
    );
    assert_share(
        "rtrace_jitdump_first",
        first,
        second,
        cpu_first / (cpu_first + cpu_second),
    );
    assert!(
        !stderr.contains("JIT frames unnamed"),
        "a warning of unnamed frames: {stderr}"
    );
}

#[test]
fn node_perf_prof_names_its_functions_from_its_jitdump_alone() {
    if in_guest() {
        eprintln!("skipped: the VM guests have no Node.js; the host runs it");
        return;
    }
    // V8 writes its dump and a log into the working directory.
    let dir = TempPath::new("node-perf-prof");
    std::fs::create_dir_all(&dir.0).unwrap();
    let folded = dir.0.join("stacks.folded");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/hot.js");
    let out = rtrace_in(
        Some(&dir.0),
        &[
            "profile",
            "-F",
            "199",
            "-f",
            "-o",
            folded.to_str().unwrap(),
            // The dump alone: the walk through V8's frames would name them
            // first.
            "--no-javascript",
            "--",
            // A jitdump cannot tell inlined functions apart: each keeps
            // its frame.
            "env",
            "HOT_NO_INLINING=1",
            "node",
            "--perf-prof",
            script.to_str().unwrap(),
            "3",
        ],
    );
    let stdout = text(&out.stdout);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let dump = std::fs::read_dir(&dir.0)
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| n.starts_with("jit-") && n.ends_with(".dump"))
        .unwrap_or_else(|| panic!("node wrote no jitdump in {}", dir.0.display()));
    let pid = &dump["jit-".len()..dump.len() - ".dump".len()];
    // The names can come from nowhere else.
    assert!(
        !std::path::Path::new(&format!("/tmp/perf-{pid}.map")).exists(),
        "node wrote a perf map too"
    );
    let hot_ns = measured(&stdout, "split ", "hot=");
    let warm_ns = measured(&stdout, "split ", "warm=");

    let (mut hot, mut warm, mut unnamed) = (0u64, 0u64, 0u64);
    let text = std::fs::read_to_string(&folded).unwrap();
    for (stack, n) in parse_folded(&text) {
        if stack.first().is_none_or(|c| c != "node") {
            continue;
        }
        // The innermost JavaScript function, in any tier (`*` TurboFan,
        // `^` Sparkplug, `~` interpreted).
        let js = stack
            .iter()
            .rev()
            .find_map(|f| f.strip_prefix("JS:"))
            .map(|f| f.trim_start_matches(['*', '^', '~', '+']));
        match js {
            Some(f) if f.starts_with("hot ") => hot += n,
            Some(f) if f.starts_with("warm ") => warm += n,
            _ => {}
        }
        // A JIT frame left unnamed sits between named JavaScript frames
        // or V8's builtins.
        if stack.iter().any(|f| f == "[unknown]") && js.is_some() {
            unnamed += n;
        }
    }
    let js = hot + warm;
    assert!(js >= 200, "too few samples in hot and warm: {js}\n{stderr}");
    assert!(
        unnamed as f64 <= 0.05 * (js + unnamed) as f64,
        "{unnamed} of {} JavaScript samples have unnamed frames\n{stderr}",
        js + unnamed
    );
    assert_share("hot", hot, warm, hot_ns / (hot_ns + warm_ns));
    assert!(
        !stderr.contains("JIT frames unnamed"),
        "a warning of unnamed frames: {stderr}"
    );
}

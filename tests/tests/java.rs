//! Java methods in stacks: HotSpot's frames walked in the kernel from the
//! JVM's own tables, with no JVM flag, no agent and no perf map
//! (`tests/fixtures/java/Hot.java`, run by Debian's OpenJDK 17, which has
//! no frame pointers), checked against what the fixture measured itself:
//! compiled code with its inlined accessor, and the same program
//! interpreted (`-Xint`).

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
};

use rtrace_integration_tests::{
    Rtrace, SIGINT, Workload, assert_share, in_guest, parse_folded, profile::READY,
};

type Folded = BTreeMap<Vec<String>, u64>;

/// The fixture, compiled once by javac into a directory of its own.
fn classes() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/java/Hot.java");
        let dir = std::env::temp_dir().join(format!("rtrace-java-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = Command::new("javac")
            .arg("-d")
            .arg(&dir)
            .arg(&src)
            .output()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run javac (Debian package openjdk-17-jdk-headless; \
                     `cargo xtask setup` installs it): {e}"
                )
            });
        assert!(
            out.status.success(),
            "javac failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        dir
    })
}

/// Profiles the fixture's split at 999 Hz, the JVM started (and warm)
/// before rtrace, with `jvm` flags; returns the folded stacks, rtrace's
/// stderr and the fixture's hot and warm CPU times.
fn profile(jvm: &[&str], extra: &[&str]) -> (Folded, String, (f64, f64)) {
    let mut cmd = Command::new("java");
    cmd.args(jvm)
        .arg("-cp")
        .arg(classes())
        .args(["Hot", "split", "3"]);
    let (mut w, line) = Workload::start_command(cmd);
    assert!(line.starts_with("ready"), "{line:?}");
    let pid = w.pid().to_string();
    let mut args = vec!["profile", "-F", "999", "-p", &pid, "-f", "-v"];
    args.extend_from_slice(extra);
    let rtrace = Rtrace::start_until(&args, READY);
    let done = w.go();
    let (code, stdout, stderr) = rtrace.stop(SIGINT);
    assert!(w.wait().success());
    assert_eq!(code, 0, "{stderr}");
    let nums: Vec<f64> = done
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    (parse_folded(&stdout), stderr, (nums[0], nums[1]))
}

/// A frame's name without its kind's mark (`-a`: `_[j]`, `_[i]`).
fn bare(f: &str) -> &str {
    match f.rfind("_[") {
        Some(i) if f.ends_with(']') => &f[..i],
        _ => f,
    }
}

/// Samples whose stack has frame `name` (marked or not).
fn with_frame(folded: &Folded, name: &str) -> u64 {
    folded
        .iter()
        .filter(|(s, _)| s.iter().any(|f| f == name || bare(f) == name))
        .map(|(_, c)| c)
        .sum()
}

/// The heaviest stacks, for messages.
fn show(folded: &Folded) -> String {
    let mut v: Vec<(&Vec<String>, &u64)> = folded.iter().collect();
    v.sort_by(|a, b| b.1.cmp(a.1));
    v.iter()
        .take(12)
        .map(|(s, c)| format!("{} {c}", s.join(";")))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Whether stack `s` (root first) is whole: the thread's start, the JVM's
/// launcher and call stub, then exactly
/// `Hot.main;Hot.mid;Hot.pick;Hot.<leaf>`, with `Hot.step` or nothing
/// Java above the leaf.
fn whole(s: &[String], leaf: &str) -> bool {
    let s: Vec<&str> = s.iter().map(|f| bare(f)).collect();
    let java: Vec<&str> = s
        .iter()
        .copied()
        .filter(|f| f.starts_with("Hot."))
        .collect();
    let root = s.iter().position(|&f| f == "start_thread");
    let launcher = s.iter().position(|&f| f == "JavaMain");
    let first = s.iter().position(|&f| f == "Hot.main");
    let ends_right = match java.get(4) {
        None => true,
        Some(&f) => f == "Hot.step" && java.len() == 5,
    };
    root.is_some()
        && launcher > root
        && first > launcher
        && java.len() >= 4
        && java[..4] == ["Hot.main", "Hot.mid", "Hot.pick", leaf]
        && ends_right
}

/// The fixture's hot and warm methods: named, with whole chains in at
/// least 95% of their samples, and split as the fixture measured.
fn check_split(folded: &Folded, times: (f64, f64), what: &str) {
    let (hot, warm) = (
        with_frame(folded, "Hot.hot"),
        with_frame(folded, "Hot.warm"),
    );
    assert!(
        hot + warm >= 1500,
        "{what}: {hot} samples in Hot.hot and {warm} in Hot.warm:\n{}",
        show(folded)
    );
    let whole_samples: u64 = folded
        .iter()
        .filter(|(s, _)| whole(s, "Hot.hot") || whole(s, "Hot.warm"))
        .map(|(_, c)| c)
        .sum();
    assert!(
        whole_samples as f64 >= 0.95 * (hot + warm) as f64,
        "{what}: {whole_samples} of {} hot and warm samples have the whole chain:\n{}",
        hot + warm,
        show(folded)
    );
    let want = times.0 / (times.0 + times.1);
    assert_share(&format!("{what}: Hot.hot"), hot, warm, want);
}

/// The guests have no JVM: the host runs these tests (the walk's
/// programs load in the guests' kernels in every other test).
fn skip_in_guest() -> bool {
    if in_guest() {
        eprintln!("skipped: the guests carry no JVM (the host runs this test)");
        return true;
    }
    false
}

#[test]
fn compiled_java_methods_split_as_measured_with_whole_chains_and_inlined_frames() {
    if skip_in_guest() {
        return;
    }
    // `-a` marks each frame's kind.
    let (folded, stderr, times) = profile(&[], &["-a"]);
    assert!(
        stderr.contains("(java): Java 17"),
        "-v names the JVM:\n{stderr}"
    );
    check_split(&folded, times, "compiled");
    // C2 inlines the dispatcher into mid's code (compiled on stack
    // replacement, at some point of the run), or hot and warm into the
    // dispatcher's: either way a method with no frame of its own shows
    // as an inlined one (`_[i]`), from the compiled code's debug
    // information, in the whole chain of nearly every sample.
    let inlined: u64 = folded
        .iter()
        .filter(|(s, _)| {
            s.iter()
                .any(|f| f.starts_with("Hot.") && f.ends_with("_[i]"))
        })
        .map(|(_, c)| c)
        .sum();
    let (hot, warm) = (
        with_frame(&folded, "Hot.hot"),
        with_frame(&folded, "Hot.warm"),
    );
    assert!(
        inlined as f64 >= 0.9 * (hot + warm) as f64,
        "{inlined} of {} samples have an inlined frame:\n{}",
        hot + warm,
        show(&folded)
    );
    // Nothing was named from freed code, and no Java frame was left
    // unwalked.
    assert!(
        !stderr.contains("[java: gone]"),
        "frames of freed code:\n{stderr}"
    );
}

#[test]
fn interpreted_java_methods_are_named_under_xint() {
    if skip_in_guest() {
        return;
    }
    let (folded, _, times) = profile(&["-Xint"], &[]);
    check_split(&folded, times, "-Xint");
}

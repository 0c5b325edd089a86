//! Java methods in stacks: HotSpot's frames walked in the kernel from the
//! JVM's own tables, with no JVM flag, no agent and no perf map
//! (`tests/fixtures/java/Hot.java`, run by Debian's OpenJDK 17, which has
//! no frame pointers), checked against what the fixture measured itself:
//! compiled code with inlined methods, the same program interpreted
//! (`-Xint`), a JNI call into C that calls back into Java, a thread
//! blocked in `Object.wait` under offcputime; and against perf on the
//! same run, given what perf needs (`-XX:+PreserveFramePointer` and a perf
//! map).

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
};

use rtrace_integration_tests::{
    Rtrace, SIGINT, Workload, assert_share, in_guest, parse_folded,
    profile::{READY, perf_script_folded},
};

type Folded = BTreeMap<Vec<String>, u64>;

/// The JDK javac is from (`JAVA_HOME/bin/javac`), whose `include` has
/// jni.h.
fn java_home() -> PathBuf {
    let javac = std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join("javac"))
        .find(|p| p.exists())
        .expect("no javac on PATH (Debian package openjdk-17-jdk-headless)");
    let real = std::fs::canonicalize(&javac).unwrap();
    real.parent().and_then(Path::parent).unwrap().to_path_buf()
}

/// The fixture, compiled once by javac into a directory of its own, with
/// its native method's library (built without frame pointers).
fn classes() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/java");
        let src = fixtures.join("Hot.java");
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
        let home = java_home();
        let out = Command::new("cc")
            .args(["-O2", "-fomit-frame-pointer", "-shared", "-fPIC", "-o"])
            .arg(dir.join("libhotjni.so"))
            .arg(format!("-I{}", home.join("include").display()))
            .arg(format!("-I{}", home.join("include/linux").display()))
            .arg(fixtures.join("hotjni.c"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "cc failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        dir
    })
}

/// Profiles the fixture's split at 999 Hz, the JVM started (and warm)
/// before rtrace, with `jvm` flags; returns the folded stacks, rtrace's
/// stderr and the fixture's hot and warm CPU times.
fn profile(jvm: &[&str], extra: &[&str]) -> (Folded, String, (f64, f64)) {
    let mut args = vec!["profile", "-F", "999", "-f", "-v"];
    args.extend_from_slice(extra);
    let (folded, stderr, done) = trace_fixture(jvm, "split", &args, READY);
    let nums: Vec<f64> = done
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    (folded, stderr, (nums[0], nums[1]))
}

/// Runs the fixture in `mode` for 3 s under `jvm` flags, the JVM started
/// (and warm) before rtrace, which runs `args` with `-p` the JVM until
/// it prints `ready` and is stopped once the fixture is done; returns
/// the folded stacks, rtrace's stderr and the fixture's `done` line.
fn trace_fixture(jvm: &[&str], mode: &str, args: &[&str], ready: &str) -> (Folded, String, String) {
    let dir = classes();
    let mut cmd = Command::new("java");
    cmd.args(jvm)
        .arg(format!("-Djava.library.path={}", dir.display()))
        .arg("-cp")
        .arg(dir)
        .args(["Hot", mode, "3"]);
    let (mut w, line) = Workload::start_command(cmd);
    assert!(line.starts_with("ready"), "{line:?}");
    let pid = w.pid().to_string();
    let mut args = args.to_vec();
    args.extend_from_slice(&["-p", &pid]);
    let rtrace = Rtrace::start_until(&args, ready);
    let done = w.go();
    let (code, stdout, stderr) = rtrace.stop(SIGINT);
    assert!(w.wait().success());
    assert_eq!(code, 0, "{stderr}");
    (parse_folded(&stdout), stderr, done)
}

/// Checks that `whole` is at least 95% of `all`: `what` they are.
fn assert_most(whole: u64, all: u64, what: &str, folded: &Folded) {
    assert!(
        whole as f64 >= 0.95 * all as f64,
        "{whole} of {all} {what}:\n{}",
        show(folded)
    );
}

/// Of the samples (or time) whose stack has frame `leaf`, how much has,
/// root first, every frame of `chain` in order below it.
fn under_chain(folded: &Folded, leaf: &str, chain: &[&str]) -> (u64, u64) {
    let mut all = 0;
    let mut whole = 0;
    for (s, c) in folded {
        let Some(at) = s.iter().position(|f| bare(f) == leaf) else {
            continue;
        };
        all += c;
        let mut from = 0;
        let ordered =
            chain.iter().all(
                |want| match s[from..at].iter().position(|f| bare(f) == *want) {
                    Some(i) => {
                        from += i + 1;
                        true
                    }
                    None => false,
                },
            );
        if ordered {
            whole += c;
        }
    }
    (whole, all)
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

#[test]
fn a_jni_chain_goes_from_java_to_c_and_back_into_java() {
    if skip_in_guest() {
        return;
    }
    let (folded, _, done) = trace_fixture(&[], "jni", &["profile", "-F", "999", "-f"], READY);
    assert!(
        done.parse::<u64>().is_ok_and(|r| r > 0),
        "the fixture ran no rounds: {done:?}"
    );
    // The C loop, called by the native method, called by Java.
    let java_then_c = [
        "start_thread",
        "JavaMain",
        "Hot.main",
        "Hot.jniMode",
        "Hot.spin",
        "Java_Hot_spin",
    ];
    let (whole, all) = under_chain(&folded, "churn", &java_then_c);
    assert!(all >= 300, "{all} samples in churn:\n{}", show(&folded));
    assert_most(
        whole,
        all,
        "samples in churn are under Java's call",
        &folded,
    );
    // And the Java method C calls back, above the JVM's way in from C.
    let mut and_back = java_then_c.to_vec();
    and_back.extend_from_slice(&[
        "JavaCalls::call_helper(JavaValue*, methodHandle const&, JavaCallArguments*, JavaThread*)",
    ]);
    let (whole, all) = under_chain(&folded, "Hot.back", &and_back);
    assert!(all >= 300, "{all} samples in Hot.back:\n{}", show(&folded));
    assert_most(
        whole,
        all,
        "samples in Hot.back are under C's call",
        &folded,
    );
}

#[test]
fn offcputime_names_the_java_caller_of_object_wait() {
    if skip_in_guest() {
        return;
    }
    let (folded, _, done) =
        trace_fixture(&[], "wait", &["offcputime", "-f"], "Tracing off-CPU time");
    let waits: u64 = done.parse().unwrap();
    assert!(waits >= 50, "the waiter waited {waits} times");
    // The waiter's blocked time: its monitor wait, under its Java caller,
    // under the thread's start.
    let (whole, all) = under_chain(
        &folded,
        "java.lang.Object.wait",
        &["start_thread", "Hot.waiter"],
    );
    // Microseconds: it waited nearly all of its 3 s.
    assert!(
        all >= 1_500_000,
        "{all} us blocked in Object.wait:\n{}",
        show(&folded)
    );
    assert_most(
        whole,
        all,
        "us in Object.wait are under Hot.waiter",
        &folded,
    );
}

#[test]
fn shares_agree_with_perf_given_frame_pointers_and_a_perf_map_and_rtrace_names_more() {
    if skip_in_guest() {
        return;
    }
    // What perf needs to name and walk JIT code at all, and hot and warm
    // kept out of their caller so that perf, which sees only physical
    // frames, can tell them apart.
    let dir = classes();
    let mut cmd = Command::new("java");
    cmd.args([
        "-XX:+PreserveFramePointer",
        "-XX:CompileCommand=quiet",
        "-XX:CompileCommand=dontinline,Hot::hot",
        "-XX:CompileCommand=dontinline,Hot::warm",
    ])
    .arg("-cp")
    .arg(dir)
    .args(["Hot", "split", "3"]);
    let (mut w, line) = Workload::start_command(cmd);
    assert!(line.starts_with("ready"), "{line:?}");
    let pid = w.pid().to_string();
    let data = std::env::temp_dir().join(format!("rtrace-java-perf-{pid}.data"));
    let perf = Command::new("perf")
        .args(["record", "-q", "-F", "999", "-g", "-p", &pid, "-o"])
        .arg(&data)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("perf (Debian package linux-perf; cargo xtask installs it)");
    let rtrace = Rtrace::start_until(&["profile", "-F", "999", "-f", "-p", &pid], READY);
    std::thread::sleep(std::time::Duration::from_millis(300));
    w.go();
    // perf's names for JIT code, written by the JVM when asked (JDK 17+),
    // before it exits.
    let map = Command::new("jcmd")
        .args([&pid, "Compiler.perfmap"])
        .output()
        .expect("jcmd (Debian package openjdk-17-jdk-headless)");
    assert!(map.status.success(), "{map:?}");
    let (code, stdout, stderr) = rtrace.stop(SIGINT);
    assert_eq!(code, 0, "{stderr}");
    assert!(w.wait().success());
    let perf = perf.wait_with_output().unwrap();
    assert!(
        perf.status.success(),
        "perf record: {}",
        String::from_utf8_lossy(&perf.stderr)
    );
    let (script, _) = perf_script_folded(&data);
    let _ = std::fs::remove_file(&data);
    let _ = std::fs::remove_file(format!("/tmp/perf-{pid}.map"));
    // perf's samples, one a paragraph, a frame a line (`ADDR NAME+OFF
    // (FILE)`); JIT frames named from the map with their signatures
    // (`int Hot.hot(int)+0x1f6`). Counted as they are: the folded form
    // weighs a sample by its period.
    let script = String::from_utf8_lossy(&script);
    let samples: Vec<&str> = script
        .split("\n\n")
        .filter(|p| !p.trim().is_empty())
        .collect();
    let perf_has = |name: &str| -> u64 {
        let needle = format!(" {name}(");
        samples.iter().filter(|p| p.contains(&needle)).count() as u64
    };
    let ours = parse_folded(&stdout);
    let has = |folded: &Folded, name: &str| -> u64 {
        folded
            .iter()
            .filter(|(s, _)| s.iter().any(|f| f == name))
            .map(|(_, c)| c)
            .sum()
    };
    let (oh, ow) = (has(&ours, "Hot.hot"), has(&ours, "Hot.warm"));
    let (ph, pw) = (perf_has("Hot.hot"), perf_has("Hot.warm"));
    assert!(
        ph + pw >= 1000 && oh + ow >= 1000,
        "perf: {ph} hot, {pw} warm; rtrace: {oh} hot, {ow} warm; perf's first sample:\n{}",
        samples.first().unwrap_or(&"")
    );
    let (po, pp) = (oh as f64 / (oh + ow) as f64, ph as f64 / (ph + pw) as f64);
    let p = (oh + ph) as f64 / (oh + ow + ph + pw) as f64;
    let sd = (p * (1.0 - p) * (1.0 / (oh + ow) as f64 + 1.0 / (ph + pw) as f64)).sqrt();
    assert!(
        (po - pp).abs() <= 4.0 * sd,
        "hot's share: rtrace {po:.3} of {}, perf {pp:.3} of {} (4 sd = {:.3})",
        oh + ow,
        ph + pw,
        4.0 * sd
    );
    // perf shows interpreted frames as `Interpreter`: the fixture's main
    // (run once, so never compiled) is unnamed there, and named by rtrace
    // in nearly every sample.
    let (om, pm) = (has(&ours, "Hot.main"), perf_has("Hot.main"));
    assert!(
        om as f64 >= 0.95 * (oh + ow) as f64,
        "rtrace names Hot.main in {om} of {} samples",
        oh + ow
    );
    assert!(
        pm as f64 <= 0.05 * (ph + pw) as f64,
        "perf named the interpreted Hot.main in {pm} samples"
    );
}

//! Java methods in stacks: HotSpot's frames walked in the kernel from the
//! JVM's own tables, with no JVM flag, no agent and no perf map
//! (`tests/fixtures/java/Hot.java`, run by Debian's OpenJDK 17, which has
//! no frame pointers), checked against what the fixture measured itself:
//! compiled code with inlined methods, by C2 and by C1 alone, the same
//! program interpreted (`-Xint`), code deoptimized and compiled again
//! while sampled, a JNI call into C that calls back into Java, a thread
//! blocked in `Object.wait` under offcputime; against perf on the same
//! run, given what perf needs (`-XX:+PreserveFramePointer` and a perf
//! map); classes unloaded and others loaded where they were; beside
//! Debian sid's OpenJDK 21 and 25, run in a container of their own (the
//! root `cargo xtask` makes) at the same time; and virtual threads on
//! 21 and 25.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
};

use rtrace_integration_tests::{
    Rtrace, SIGINT, Workload, assert_share, in_guest, parse_folded,
    profile::{READY, perf_script_folded},
    verbose_count,
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

/// The fixture, compiled by javac into a directory of its own, with its
/// native method's library (built without frame pointers): once per
/// version of its sources, in cargo's scratch directory for tests (so
/// that runs leave nothing behind in `/tmp`), built aside and renamed
/// into place, so that test processes running at once share it.
fn classes() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        use std::hash::{Hash, Hasher};
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/java");
        let src = fixtures.join("Hot.java");
        let mut h = std::hash::DefaultHasher::new();
        for f in ["Hot.java", "hotjni.c", "redefine/Rd.java"] {
            std::fs::read(fixtures.join(f)).unwrap().hash(&mut h);
        }
        let done = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("java-{:016x}", h.finish()));
        if done.join("libhotjni.so").exists() {
            return done;
        }
        let dir = done.with_extension(format!("part-{}", std::process::id()));
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
        // `Hot redefine`'s second version of its class, and the agent
        // jar (a manifest only: the agent is `Hot`, on the class path)
        // that lets the fixture redefine it.
        let out = Command::new("javac")
            .arg("-d")
            .arg(dir.join("v2"))
            .arg(fixtures.join("redefine/Rd.java"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "javac failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::write(
            dir.join("agent.mf"),
            "Premain-Class: Hot\nCan-Redefine-Classes: true\n",
        )
        .unwrap();
        let out = Command::new("jar")
            .args(["--create", "--file", "agent.jar", "--manifest", "agent.mf"])
            .current_dir(&dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "jar failed: {}",
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
        // Another process that got there first keeps its copy.
        if std::fs::rename(&dir, &done).is_err() {
            std::fs::remove_dir_all(&dir).unwrap();
        }
        done
    })
}

/// Profiles the fixture's split at 999 Hz, the JVM started (and warm)
/// before rtrace, with `jvm` flags; returns the folded stacks, rtrace's
/// stderr and the fixture's hot and warm CPU times.
fn profile(jvm: &[&str], extra: &[&str]) -> (Folded, String, (f64, f64)) {
    profile_as(jvm, extra, false)
}

/// [`profile`], by root or (`nobody`) by user `nobody` with only
/// CAP_BPF and CAP_PERFMON, as the exporter's unit runs it: no right to
/// read another user's memory through `/proc/PID/mem`.
fn profile_as(jvm: &[&str], extra: &[&str], nobody: bool) -> (Folded, String, (f64, f64)) {
    let mut args = vec!["profile", "-F", "999", "-f", "-v"];
    args.extend_from_slice(extra);
    let (folded, stderr, done) = trace_fixture_as(jvm, "split", &args, READY, nobody);
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
    trace_fixture_as(jvm, mode, args, ready, false)
}

/// [`trace_fixture`], rtrace run by root or (`nobody`) by user `nobody`
/// with only CAP_BPF and CAP_PERFMON.
fn trace_fixture_as(
    jvm: &[&str],
    mode: &str,
    args: &[&str],
    ready: &str,
    nobody: bool,
) -> (Folded, String, String) {
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
    let (rtrace, copy) = rtrace_integration_tests::start_as(&args, ready, nobody);
    let done = w.go();
    let (code, stdout, stderr) = rtrace.stop(SIGINT);
    assert!(w.wait().success());
    if let Some(dir) = copy {
        let _ = std::fs::remove_dir_all(dir);
    }
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

/// The fixture in `mode` (one that counts its rounds) under `jvm` flags,
/// profiled at 999 Hz: its folded stacks, once it ran rounds.
fn profile_rounds(jvm: &[&str], mode: &str) -> Folded {
    let (folded, _, done) = trace_fixture(jvm, mode, &["profile", "-F", "999", "-f"], READY);
    assert!(
        done.parse::<u64>().is_ok_and(|r| r > 0),
        "the fixture ran no rounds: {done:?}"
    );
    folded
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

/// Whether stack `s` (root first) is whole: the thread's start (libc's
/// `start_thread`, named from the debug files of the JVM's own root,
/// a container's too), the JVM's launcher and call stub, then exactly
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
    let stub = s.iter().position(|&f| f.starts_with("[StubRoutines"));
    let first = s.iter().position(|&f| f == "Hot.main");
    let ends_right = match java.get(4) {
        None => true,
        Some(&f) => f == "Hot.step" && java.len() == 5,
    };
    root.is_some()
        && launcher > root
        && stub > launcher
        && first > stub
        && java.len() >= 4
        && java[..4] == ["Hot.main", "Hot.mid", "Hot.pick", leaf]
        && ends_right
}

/// The fixture's hot and warm methods: named, with whole chains in at
/// least 95% of their samples, and split as the fixture measured.
fn check_split(folded: &Folded, times: (f64, f64), what: &str) {
    check_split_of(folded, times, what, 1500);
}

/// [`check_split`], with at least `least` hot and warm samples.
fn check_split_of(folded: &Folded, times: (f64, f64), what: &str, least: u64) {
    let (hot, warm) = (
        with_frame(folded, "Hot.hot"),
        with_frame(folded, "Hot.warm"),
    );
    assert!(
        hot + warm >= least,
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
    // A JVM the walk reads needs no perf map: code-cache frames of its
    // samples from before the walk had it are said to be that, not sent
    // to perf-map advice.
    assert!(
        !stderr.contains("JIT frames unnamed"),
        "perf map advice for a walked JVM:\n{stderr}"
    );
}

/// Profiled by `nobody` with only CAP_BPF and CAP_PERFMON (as the
/// exporter's unit runs), root's JVM is named as root sees it: user
/// space may not read its memory through `/proc/PID/mem` (that needs
/// ptrace rights), so the kernel reads it for rtrace (HotSpot's tables,
/// its code heaps' methods, their names and debug information).
#[test]
fn without_ptrace_rights_java_methods_are_named() {
    if skip_in_guest() {
        return;
    }
    let (folded, stderr, times) = profile_as(&[], &[], true);
    assert!(
        stderr.contains("(java): Java 17") && stderr.contains("its memory read through the kernel"),
        "-v names the JVM, and how its memory was read:\n{stderr}"
    );
    check_split(&folded, times, "split by nobody");
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
fn c1_compiled_and_inlined_methods_split_as_measured_given_the_jvms_every_pc() {
    if skip_in_guest() {
        return;
    }
    // C1 alone (as `-client` was), whose frames and debug information
    // are laid out by its own rules. It inlines hot and warm into pick,
    // and a JVM records where inlined code is only at safepoints: a pc
    // between them takes the next one's method (HotSpot's own rule, and
    // JFR's and async-profiler's), which here gave hot 0.52 of the
    // samples where it took 0.65 of the time. With DebugNonSafepoints the
    // JVM records every pc, and the split is as measured.
    let (folded, _, times) = profile(
        &[
            "-XX:TieredStopAtLevel=1",
            "-XX:+UnlockDiagnosticVMOptions",
            "-XX:+DebugNonSafepoints",
        ],
        &[],
    );
    check_split(&folded, times, "C1 only");
}

#[test]
fn a_jni_chain_goes_from_java_to_c_and_back_into_java() {
    if skip_in_guest() {
        return;
    }
    let folded = profile_rounds(&[], "jni");
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

/// A stub far into its blob: JDK 17's MD5 stub, where the fixture's
/// digest spends its time, lies some 16 KiB into `StubRoutines (2)`;
/// with the JVM's segments at 32 bytes that is more than 500 of them
/// from the blob's start, past the 256 bytes of the segment map the
/// kernel reads at once (`find_blob`), so the lookup of its blob reads
/// the map again where a hop leaves what it read. The samples in the
/// stub are each under the whole chain of the fixture's methods.
#[test]
fn a_stub_far_into_its_blob_is_found_and_walked_past() {
    if skip_in_guest() {
        return;
    }
    let jvm = [
        "-XX:+UnlockExperimentalVMOptions",
        "-XX:CodeCacheSegmentSize=32",
    ];
    let folded = profile_rounds(&jvm, "digest");
    let chain = [
        "start_thread",
        "JavaMain",
        "[StubRoutines (1)]",
        "Hot.main",
        "Hot.digestMode",
        "Hot.digestRound",
    ];
    let (whole, all) = under_chain(&folded, "[StubRoutines (2)]", &chain);
    assert!(
        all >= 500,
        "{all} samples in the MD5 stub:\n{}",
        show(&folded)
    );
    assert_most(
        whole,
        all,
        "samples in the MD5 stub are under the fixture's chain",
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

/// The Debian root with OpenJDK 21 and 25 that xtask makes and passes
/// (`RTRACE_JDK_ROOT`).
fn jdk_root() -> PathBuf {
    std::env::var_os("RTRACE_JDK_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| "/root".into()))
                .join(".cache/rtrace/sid-jdk-root-2")
        })
}

/// A copy of the fixture's classes in the JDK root's /tmp, removed when
/// dropped.
struct InRoot(PathBuf);

impl Drop for InRoot {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `java` of OpenJDK `major` in the JDK root running the fixture with
/// `args`, as in a container: a mount namespace of its own with its own
/// /proc, chrooted, with the fixture's classes copied into the root's
/// /tmp, a copy for each call (tests run at once under `cargo test`),
/// kept while the returned guard lives (the JVM keeps the child's pid:
/// unshare and sh exec).
fn java_in_root(major: u32, args: &[&str]) -> (Command, InRoot) {
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let root = jdk_root();
    let java = format!("/usr/lib/jvm/java-{major}-openjdk-amd64/bin/java");
    assert!(
        root.join(&java[1..]).is_file(),
        "no {java} in {} (`cargo xtask test` makes that root)",
        root.display()
    );
    let inside = format!("/tmp/rtrace-java-{}-{call}", std::process::id());
    let copy = root.join(&inside[1..]);
    std::fs::create_dir_all(&copy).unwrap();
    for e in std::fs::read_dir(classes()).unwrap().flatten() {
        if e.path()
            .extension()
            .is_some_and(|x| x == "class" || x == "so")
        {
            std::fs::copy(e.path(), copy.join(e.file_name())).unwrap();
        }
    }
    let library = format!("-Djava.library.path={inside}");
    let mut c = Command::new("unshare");
    c.args([
        "--mount",
        "sh",
        "-c",
        r#"mount -t proc proc "$0/proc" && exec chroot "$0" "$@""#,
    ])
    .arg(&root)
    .args([java.as_str(), &library, "-cp", &inside, "Hot"])
    .args(args);
    (c, InRoot(copy))
}

#[test]
fn jvms_17_21_and_25_at_once_two_in_a_container_are_each_walked_and_named() {
    if skip_in_guest() {
        return;
    }
    // The host's 17, and sid's 21 and 25 with their own libc and libjvm,
    // found through the processes' own mappings and roots; all started
    // before rtrace.
    let mut host = Command::new("java");
    host.arg("-cp").arg(classes()).args(["Hot", "split", "3"]);
    let mut jvms: Vec<(u32, Workload)> = Vec::new();
    let split = ["split", "3"];
    let (in21, copy21) = java_in_root(21, &split);
    let (in25, copy25) = java_in_root(25, &split);
    let _copies = (copy21, copy25);
    for (major, cmd) in [(17, host), (21, in21), (25, in25)] {
        let (w, line) = Workload::start_command(cmd);
        assert!(line.starts_with("ready"), "JDK {major}: {line:?}");
        jvms.push((major, w));
    }
    let pids: Vec<String> = jvms.iter().map(|(_, w)| w.pid().to_string()).collect();
    let rows = std::env::temp_dir().join(format!("rtrace-java-{}.jsonl", std::process::id()));
    let rows_arg = rows.to_str().unwrap();
    let rtrace = Rtrace::start_until(
        &[
            "profile",
            "-F",
            "999",
            "-v",
            "--samples",
            rows_arg,
            "-p",
            &pids.join(","),
        ],
        READY,
    );
    // Each runs its 3 s at once.
    let done: Vec<String> = std::thread::scope(|s| {
        let go: Vec<_> = jvms
            .iter_mut()
            .map(|(_, w)| s.spawn(move || w.go()))
            .collect();
        go.into_iter().map(|g| g.join().unwrap()).collect()
    });
    let (code, _, stderr) = rtrace.stop(SIGINT);
    for (_, w) in &mut jvms {
        assert!(w.wait().success());
    }
    assert_eq!(code, 0, "{stderr}");
    let text = std::fs::read_to_string(&rows).unwrap();
    let _ = std::fs::remove_file(&rows);
    let mut by_pid: BTreeMap<String, Folded> = BTreeMap::new();
    for line in text.lines() {
        let row: serde_json::Value = serde_json::from_str(line).unwrap();
        let stack: Vec<String> = row["stack"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f.as_str().unwrap().to_owned())
            .collect();
        *by_pid
            .entry(row["pid"].to_string())
            .or_default()
            .entry(stack)
            .or_default() += row["weight"].as_u64().unwrap_or(1);
    }
    for (((major, _), pid), done) in jvms.iter().zip(&pids).zip(&done) {
        assert!(
            stderr.contains(&format!("(java): Java {major}")),
            "-v names JDK {major} (PID {pid}):\n{stderr}"
        );
        let folded = by_pid.remove(pid).unwrap_or_default();
        let times: Vec<f64> = done
            .split_whitespace()
            .map(|n| n.parse().unwrap())
            .collect();
        // Three JVMs on this machine's two CPUs: some 2000 samples each.
        check_split_of(&folded, (times[0], times[1]), &format!("JDK {major}"), 800);
    }
    let gone: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("[java: gone]"))
        .collect();
    assert!(
        gone.is_empty() && !stderr.contains("[java: gone]"),
        "frames of freed code:\n{}\n{stderr}",
        gone.join("\n")
    );
}

#[test]
fn virtual_threads_are_walked_through_their_continuation_and_lambdas_named_without_addresses() {
    if skip_in_guest() {
        return;
    }
    // The continuation's frames are on the carrier thread's stack while
    // the virtual thread runs: the walk goes from the fixture's methods
    // through the continuation's entry (`enterSpecial`, a native method's
    // wrapper of its own kind) and the carrier's fork-join loop to the
    // thread's start in libjvm.
    for major in [21, 25] {
        let (cmd, _copy) = java_in_root(major, &["vthread", "3"]);
        let (mut w, line) = Workload::start_command(cmd);
        assert!(line.starts_with("ready"), "JDK {major}: {line:?}");
        let pid = w.pid().to_string();
        let rtrace = Rtrace::start_until(&["profile", "-F", "999", "-f", "-p", &pid], READY);
        let done = w.go();
        let (code, stdout, stderr) = rtrace.stop(SIGINT);
        assert!(w.wait().success());
        assert_eq!(code, 0, "{stderr}");
        let folded = parse_folded(&stdout);
        let what = format!("JDK {major}");
        let times: Vec<f64> = done
            .split_whitespace()
            .map(|n| n.parse().unwrap())
            .collect();
        let (hot, warm) = (
            with_frame(&folded, "Hot.hot"),
            with_frame(&folded, "Hot.warm"),
        );
        assert!(
            hot + warm >= 1500,
            "{what}: {hot} samples in Hot.hot and {warm} in Hot.warm:\n{}",
            show(&folded)
        );
        assert_share(
            &format!("{what}: Hot.hot"),
            hot,
            warm,
            times[0] / (times[0] + times[1]),
        );
        let chain = [
            "start_thread",
            "thread_native_entry(Thread*)",
            "java.util.concurrent.ForkJoinWorkerThread.run",
            "jdk.internal.vm.Continuation.enterSpecial",
            "java.lang.VirtualThread.run",
            "Hot$$Lambda.run",
            "Hot.mid",
            "Hot.pick",
        ];
        for leaf in ["Hot.hot", "Hot.warm"] {
            let (whole, all) = under_chain(&folded, leaf, &chain);
            assert_most(
                whole,
                all,
                &format!("{what}: {leaf} samples have the whole chain"),
                &folded,
            );
        }
        // No class is named with the address HotSpot gives a hidden one.
        let addressed: Vec<&String> = folded
            .keys()
            .flatten()
            .filter(|f| f.contains("+0x") || f.contains("/0x"))
            .collect();
        assert!(addressed.is_empty(), "{what}: {addressed:?}");
    }
}

#[test]
fn deoptimized_and_recompiled_code_is_never_named_wrong() {
    if skip_in_guest() {
        return;
    }
    // The JVM's compilation log (diagnostic, written by the JVM itself)
    // says when churn's code was made not entrant.
    let log = std::env::temp_dir().join(format!("rtrace-java-churn-{}.log", std::process::id()));
    let log_file = format!("-XX:LogFile={}", log.display());
    let (folded, _, done) = trace_fixture(
        &[
            "-XX:+UnlockDiagnosticVMOptions",
            "-XX:+LogCompilation",
            &log_file,
        ],
        "churn",
        &["profile", "-F", "999", "-f"],
        READY,
    );
    let text = std::fs::read_to_string(&log).unwrap();
    let _ = std::fs::remove_file(&log);
    assert!(
        done.ends_with(" 8"),
        "the fixture loaded every class: {done:?}"
    );
    // Compile ids of churn's code, then those made not entrant.
    let attr = |tag: &str, name: &str| -> Option<String> {
        let at = tag.find(&format!(" {name}='"))? + name.len() + 3;
        Some(tag[at..].split('\'').next()?.to_owned())
    };
    let mut churn_ids = std::collections::HashSet::new();
    let mut unmade = 0;
    for tag in text.split('<') {
        if tag.starts_with("nmethod ")
            && attr(tag, "method").is_some_and(|m| m.starts_with("Hot churn "))
        {
            churn_ids.extend(attr(tag, "compile_id"));
        }
        if tag.starts_with("make_not_entrant ")
            && attr(tag, "compile_id").is_some_and(|id| churn_ids.contains(&id))
        {
            unmade += 1;
        }
    }
    assert!(
        unmade >= 5,
        "churn's code was made not entrant {unmade} times: the run forced too few"
    );
    // Every pair of adjacent frames of the fixture's is an edge of its
    // call graph: a frame named from code freed or replaced since would
    // be another method's, out of place.
    let edge = |caller: &str, callee: &str| -> bool {
        let area = |f: &str| f.starts_with("Hot$S") && f.ends_with(".area");
        matches!(
            (caller, callee),
            ("Hot.main", "Hot.churnMode")
                | ("Hot.churnMode", "Hot.churn" | "Hot.ready" | "Hot.done")
        ) || (caller == "Hot.churn" && area(callee))
            || (area(caller) && callee == "Hot.step")
            || (callee.starts_with("Hot$S") && callee.ends_with(".<init>"))
    };
    let mut wrong = Vec::new();
    let (mut all, mut gone) = (0, 0);
    for (s, c) in &folded {
        all += c;
        let names: Vec<&str> = s.iter().map(|f| bare(f)).collect();
        if names.contains(&"[java: gone]") {
            gone += c;
        }
        for pair in names.windows(2) {
            if pair[0].starts_with("Hot") && pair[1].starts_with("Hot") && !edge(pair[0], pair[1]) {
                wrong.push(format!("{} -> {} ({c})", pair[0], pair[1]));
            }
        }
    }
    // A stack holds one shape's area at most: the eight sum.
    let chain = [
        "start_thread",
        "JavaMain",
        "Hot.main",
        "Hot.churnMode",
        "Hot.churn",
    ];
    let (whole_areas, areas) = (0..8)
        .map(|n| under_chain(&folded, &format!("Hot$S{n}.area"), &chain))
        .fold((0, 0), |(w, a), (wn, an)| (w + wn, a + an));
    assert!(
        wrong.is_empty(),
        "frames out of the fixture's graph: {wrong:?}\n{}",
        show(&folded)
    );
    assert!(
        areas >= 1000,
        "{areas} samples in the shapes' area:\n{}",
        show(&folded)
    );
    assert_most(
        whole_areas,
        areas,
        "samples in area have the whole chain",
        &folded,
    );
    // A frame whose code went away between the sample and its naming is
    // `[java: gone]`, never another's name; here few do.
    assert!(
        gone as f64 <= 0.05 * all as f64,
        "{gone} of {all} samples have a gone frame:\n{}",
        show(&folded)
    );
}

/// A sample's thread and stack (root first), as `--samples` writes them.
type Rows = Vec<(u64, Vec<String>)>;

/// `rtrace profile -F 999 --samples` of the fixture in `mode` for three
/// seconds, run as a command: its rows in time order and rtrace's
/// stderr, once rtrace exited 0 and the fixture said it was done.
fn command_rows(mode: &str) -> (Rows, String) {
    let dir = classes();
    let library = format!("-Djava.library.path={}", dir.display());
    let classes = dir.to_str().unwrap();
    command_rows_of(
        &["java", &library, "-cp", classes, "Hot", mode, "3"],
        mode,
        &[],
    )
}

/// [`command_rows`] of the fixture in `mode` run by OpenJDK `major` in
/// the JDK root, as a container's, with rtrace's flags `flags`.
fn command_rows_in_root(major: u32, mode: &str, flags: &[&str]) -> (Rows, String) {
    let (cmd, _copy) = java_in_root(major, &[mode, "3"]);
    let argv: Vec<String> = std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_str().unwrap().to_owned())
        .collect();
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    command_rows_of(&argv, &format!("{mode}-{major}"), flags)
}

/// [`command_rows`] of command `argv`, with rtrace's flags `flags`; `tag`
/// names its rows' file.
fn command_rows_of(argv: &[&str], tag: &str, flags: &[&str]) -> (Rows, String) {
    let rows = std::env::temp_dir().join(format!("rtrace-java-{tag}-{}.jsonl", std::process::id()));
    let rows_arg = rows.to_str().unwrap();
    let mut args = vec!["profile", "-F", "999", "--samples", rows_arg];
    args.extend_from_slice(flags);
    args.push("--");
    args.extend_from_slice(argv);
    let (code, stdout, stderr) = rtrace_integration_tests::run(&args);
    let text = std::fs::read_to_string(&rows).unwrap_or_default();
    let _ = std::fs::remove_file(&rows);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("done "), "{stdout}\n{stderr}");
    // In time order, as `--samples` writes them.
    let rows = text
        .lines()
        .map(|line| {
            let row: serde_json::Value = serde_json::from_str(line).unwrap();
            let stack = row["stack"].as_array().unwrap().iter();
            let stack = stack.map(|f| f.as_str().unwrap().to_owned()).collect();
            (row["tid"].as_u64().unwrap(), stack)
        })
        .collect();
    (rows, stderr)
}

/// The stacks of the thread with the most samples in `method`: the main
/// thread, from the JVM's start on.
fn main_thread_stacks<'a>(rows: &'a Rows, method: &str) -> Vec<&'a Vec<String>> {
    let mut by_tid: BTreeMap<u64, u64> = BTreeMap::new();
    for (tid, s) in rows {
        if s.iter().any(|f| f == method) {
            *by_tid.entry(*tid).or_default() += 1;
        }
    }
    let main = by_tid.iter().max_by_key(|(_, n)| **n).map(|(t, _)| *t);
    rows.iter()
        .filter(|(t, _)| Some(*t) == main)
        .map(|(_, s)| s)
        .collect()
}

/// Checks that at most `per_mille` of the main thread's `stacks` (at
/// least 1,000) do not go down to the launcher's JavaMain.
fn assert_whole_down_to_java_main(stacks: &[&Vec<String>], per_mille: u64, stderr: &str) {
    let cut: Vec<String> = stacks
        .iter()
        .filter(|s| !s.iter().any(|f| f == "JavaMain"))
        .map(|s| s.join(";"))
        .collect();
    assert!(
        stacks.len() >= 1000,
        "{} samples of the main thread:\n{stderr}",
        stacks.len()
    );
    assert!(
        cut.len() as u64 * 1000 <= per_mille * stacks.len() as u64,
        "{} of the main thread's {} stacks cut short:\n{}",
        cut.len(),
        stacks.len(),
        cut.join("\n")
    );
}

#[test]
fn a_jvm_spinning_method_handles_from_its_start_is_named_and_walked_whole_as_a_command() {
    if skip_in_guest() {
        return;
    }
    // Most of the samples are of stacks deep in code met for the first
    // time (the JVM's start, then java.lang.invoke spinning and resolving
    // method handles), each seen once or twice: more new frames than a
    // walk tells of, which are named from the stack table at once, not at
    // the end, when this JVM has exited. And calls through the handles'
    // intrinsics, which build no frame, are stepped past.
    let (rows, stderr) = command_rows("handles");
    let gone: Vec<String> = rows
        .iter()
        .filter(|(_, s)| s.iter().any(|f| f == "[java: gone]"))
        .map(|(_, s)| s.join(";"))
        .collect();
    assert!(
        gone.is_empty() && !stderr.contains("[java: gone]"),
        "{} of {} samples with frames left unnamed:\n{}\n{stderr}",
        gone.len(),
        rows.len(),
        gone.join("\n")
    );
    // The main thread's: the one in the fixture's method. Each of its
    // stacks goes down to the launcher's JavaMain, but for those the walk
    // could not step past a frame (an adapter or a stub sampled
    // mid-prologue, a few in ten thousand). Stepped as a wrapper with a
    // frame, an intrinsic cut 1 to 2 % of them short.
    let main = main_thread_stacks(&rows, "Hot.handlesMode");
    assert_whole_down_to_java_main(&main, 5, &stderr);
}

/// A native method's wrapper sampled where its frame is not built: in
/// its prologue (the inline cache's check, the stack bang, between `push
/// rbp` and `mov rbp, rsp`) or its epilogue (after `leave`, at its check
/// for a pending exception). `Hot natives` calls a native method that
/// does next to nothing in a loop, so that many samples are in the
/// wrapper (seven in eight); stepped by its frame pointer there as
/// everywhere else in it, which is then the caller's, 6.6 % of the main
/// thread's stacks lost their callers (405 of 6,144 in two runs), where
/// now none do. (HotSpot writes `mov rbp, rsp` as `48 8b ec`, which the
/// check for it in stubs' prologues, `48 89 e5`, never matched.)
#[test]
fn a_native_methods_wrapper_sampled_in_its_prologue_or_epilogue_keeps_its_callers() {
    if skip_in_guest() {
        return;
    }
    let (rows, stderr) = command_rows("natives");
    assert_native_wrappers_walked(&rows, &stderr);
}

/// As [`a_native_methods_wrapper_sampled_in_its_prologue_or_epilogue_keeps_its_callers`],
/// on OpenJDK 21 and 25, whose wrappers end otherwise: the check for a
/// pending exception compares an imm8, not an imm32, and 25 polls for a
/// safepoint before it. Matched only as 17's, the wrapper's end cut
/// about 4 % of the main thread's stacks on each (113 of 2,994 on 21).
#[test]
fn a_native_methods_wrapper_on_jdk_21_and_25_keeps_its_callers() {
    if skip_in_guest() {
        return;
    }
    for major in [21, 25] {
        // The walk through Java frames loaded from the start: a JVM in a
        // root of its own is seen later in its start than the host's,
        // and its first 0.1 s of stacks (the VM's own start) were cut
        // while the walk was loaded (`lost`, with the count).
        let preload = ["--preload-runtime-walks=java"];
        let (rows, stderr) = command_rows_in_root(major, "natives", &preload);
        assert_native_wrappers_walked(&rows, &format!("JDK {major}:\n{stderr}"));
    }
}

/// The checks of `Hot natives`' rows: many samples in the wrapper, and
/// the main thread's stacks whole from its first in the fixture's method
/// on (before, the VM starts, and its first stacks may be cut: the walk
/// through Java frames reads a JVM once it has started).
fn assert_native_wrappers_walked(rows: &Rows, stderr: &str) {
    let main = main_thread_stacks(rows, "Hot.nativesMode");
    let first = main
        .iter()
        .position(|s| s.iter().any(|f| f == "Hot.nativesMode"))
        .unwrap_or(0);
    let main = &main[first..];
    // The wrapper is the sampled frame, named for its method.
    let in_wrapper = main
        .iter()
        .filter(|s| s.last().is_some_and(|f| f == "Hot.nudge"))
        .count();
    assert!(
        in_wrapper >= 100,
        "{in_wrapper} of {} samples of the main thread in Hot.nudge's wrapper: {stderr}",
        main.len()
    );
    assert_whole_down_to_java_main(main, 2, stderr);
}

#[test]
fn classes_unloaded_and_loaded_again_at_the_same_addresses_are_named_as_sampled() {
    if skip_in_guest() {
        return;
    }
    // Interpreted, where a frame is its `Method*` and bytecode, and
    // compiled, where it is its code, whose methods are named through
    // the same `Method*`s: eight classes in turn, each where the one
    // before was (HotSpot logs one Klass address for all eight). The
    // kernel keeps an interpreted frame's check while the JVM collects
    // nothing: under G1, whose `System.gc` unloads in its pause, and
    // under ZGC, which unloads concurrently, late in a cycle it counted
    // at its start.
    for jvm in [&["-Xint"][..], &["-Xint", "-XX:+UseZGC"], &[]] {
        let what = match jvm {
            [] => "compiled",
            [_] => "interpreted",
            _ => "interpreted, ZGC",
        };
        let (folded, stderr, done) =
            trace_fixture(jvm, "unload", &["profile", "-v", "-F", "999", "-f"], READY);
        let nums: Vec<f64> = done
            .split_whitespace()
            .map(|n| n.parse().unwrap())
            .collect();
        assert!(
            nums.len() == 9 && nums[0] >= 7.0,
            "{what}: the fixture unloaded too few of its classes: {done:?}"
        );
        let times = &nums[1..];
        let spent: f64 = times.iter().sum();
        let counts: Vec<u64> = (1..=8)
            .map(|n| with_frame(&folded, &format!("Zq{n}.applyAsLong")))
            .collect();
        let all: u64 = counts.iter().sum();
        assert!(
            all >= 1500,
            "{what}: {all} samples in the classes:\n{}",
            show(&folded)
        );
        for (i, (&c, &t)) in counts.iter().zip(times).enumerate() {
            assert_share(&format!("{what}: Zq{}", i + 1), c, all - c, t / spent);
        }
        if !jvm.is_empty() {
            // Most of the classes' frames are checked by what the kernel
            // kept: else this tests nothing of it.
            let kept = verbose_count(
                &stderr,
                "profile",
                "interpreted Java frames checked by what the CPU kept of the method, the JVM having collected nothing since",
            )
            .unwrap_or(0);
            assert!(
                kept >= all,
                "{what}: {kept} interpreted frames checked by what was kept, of {all} \
                 samples in the classes (each with three or more)\n{stderr}"
            );
        }
        // Every frame of a class is under its own class's caller: a name
        // left from the class before would pair two classes.
        for (s, c) in &folded {
            let classes: std::collections::BTreeSet<&str> = s
                .iter()
                .filter_map(|f| bare(f).strip_prefix("Zq"))
                .map(|f| &f[..1])
                .collect();
            assert!(
                classes.len() <= 1,
                "{what}: one stack ({c} samples) names classes {classes:?}: {}",
                s.join(";")
            );
        }
    }
}

/// A class redefined while it runs (`java.lang.instrument`, as agents
/// and debuggers' hot swap do): HotSpot gives the class new methods
/// (and compiles them anew), keeps the old ones while a frame runs
/// them, and frees them after; the next version's are often put where
/// they were. Each sample is named by the version it ran: `Rd.run` calls
/// `alpha` in one version and `beta` in the other, swapped every phase,
/// so a name kept from the version before would move samples from one
/// to the other, or put a frame under the wrong caller. Interpreted and
/// compiled.
#[test]
fn classes_redefined_while_they_run_are_named_as_sampled() {
    if skip_in_guest() {
        return;
    }
    let dir = classes();
    let agent = format!("-javaagent:{}", dir.join("agent.jar").display());
    let two = format!("-Drd.two={}", dir.join("v2/Rd.class").display());
    for interpreted in [true, false] {
        let what = if interpreted {
            "interpreted"
        } else {
            "compiled"
        };
        let mut jvm = vec![agent.as_str(), two.as_str()];
        if interpreted {
            jvm.push("-Xint");
        }
        let (folded, _, done) =
            trace_fixture(&jvm, "redefine", &["profile", "-F", "999", "-f"], READY);
        let nums: Vec<f64> = done
            .split_whitespace()
            .map(|n| n.parse().unwrap())
            .collect();
        assert!(
            nums.len() == 9 && nums[0] == 7.0,
            "{what}: the fixture did not redefine its class 7 times: {done:?}"
        );
        // Phases 1, 3, 5 and 7 ran alpha; 2, 4, 6 and 8 beta.
        let alpha_ns: f64 = nums[1..].iter().step_by(2).sum();
        let beta_ns: f64 = nums[2..].iter().step_by(2).sum();
        let (alpha, beta) = (
            with_frame(&folded, "Rd.alpha"),
            with_frame(&folded, "Rd.beta"),
        );
        assert!(
            alpha + beta >= 1500,
            "{what}: {alpha} samples in Rd.alpha and {beta} in Rd.beta:\n{}",
            show(&folded)
        );
        assert_share(
            &format!("{what}: Rd.alpha"),
            alpha,
            beta,
            alpha_ns / (alpha_ns + beta_ns),
        );
        for leaf in ["Rd.alpha", "Rd.beta"] {
            let (whole, all) =
                under_chain(&folded, leaf, &["Hot.main", "Hot.redefineMode", "Rd.run"]);
            assert_most(
                whole,
                all,
                &format!("{what}: {leaf} samples under Hot.main, Hot.redefineMode and Rd.run"),
                &folded,
            );
        }
        for (s, c) in &folded {
            let both = ["Rd.alpha", "Rd.beta"]
                .iter()
                .all(|m| s.iter().any(|f| bare(f) == *m));
            assert!(
                !both,
                "{what}: one stack ({c} samples) has both versions' callees: {}",
                s.join(";")
            );
        }
    }
}

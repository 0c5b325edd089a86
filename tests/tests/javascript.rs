//! JavaScript frames walked in the kernel, with no flag: Node.js (this
//! machine's node 20) profiled as it is started, its functions named
//! `name (file:line)` from V8's own objects, in whole chains down to
//! node's C++ start, and split as the fixture measured itself.
//!
//! The guests have no Node.js; these run on the host.

use std::{
    ffi::OsStr,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use rtrace_integration_tests::{
    SIGINT, in_guest, parse_folded, pidreuse::assert_share_within, rtrace_bin,
};

/// The fixture: `main` calls `hot` (70 % of its time) and `warm` (30 %),
/// as it measures itself (`split hot=NS warm=NS`).
fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/hot.js")
}

/// The 1-based line of the fixture's line that starts with `start` (after
/// its indent): where V8 says the function there begins.
fn line_of(script: &Path, start: &str) -> usize {
    std::fs::read_to_string(script)
        .unwrap()
        .lines()
        .position(|l| l.trim_start().starts_with(start))
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
    /// Of `hot` and `warm`, those inlined into `main` (`_[i]` under `-a`).
    inlined: u64,
}

/// Frame `f` without its `-a` annotation (`_[j]`, `_[i]`, …).
fn plain(f: &str) -> &str {
    match f.len().checked_sub(4).map(|i| f.split_at(i)) {
        Some((name, a)) if a.starts_with("_[") && a.ends_with(']') => name,
        _ => f,
    }
}

/// The fixture's `hot`, `warm` and `main` frames as rtrace names them:
/// `shown` is the script's path as node names it, `script` where its
/// source is read here.
fn names(shown: &str, script: &Path) -> [String; 3] {
    ["hot", "warm", "main"].map(|f| {
        format!(
            "{f} ({shown}:{})",
            line_of(script, &format!("function {f}("))
        )
    })
}

/// `shown` and `script` as in [`names`].
fn split(folded: &str, shown: &str, script: &Path) -> Split {
    let [hot, warm, main] = names(shown, script);
    let mut out = Split::default();
    for (stack, n) in parse_folded(folded) {
        // (Node 24 names its main thread `MainThread`: the process is
        // known by the fixture's functions.)
        let Some(leaf) = stack.iter().rposition(|f| f.contains(".js:")) else {
            continue;
        };
        if plain(&stack[leaf]) == hot {
            out.hot += n;
        } else if plain(&stack[leaf]) == warm {
            out.warm += n;
        } else {
            continue;
        }
        if stack[leaf].ends_with("_[i]") {
            out.inlined += n;
        }
        let whole = leaf > 0
            && plain(&stack[leaf - 1]) == main
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

/// Runs `rtrace profile -F 499 FLAGS -f -o FILE -- CMD` in `dir` (the
/// temporary directory by default), checks that it exited 0, and returns
/// the command's stdout, rtrace's stderr and the folded stacks.
fn profile_folded(flags: &[&str], cmd: &[&OsStr], dir: Option<&Path>) -> (String, String, String) {
    let folded = std::env::temp_dir().join(format!("rtrace-js-{}.folded", std::process::id()));
    let mut rtrace = Command::new(rtrace_bin());
    rtrace
        .args(["profile", "-F", "499"])
        .args(flags)
        .arg("-f")
        .arg("-o")
        .arg(&folded)
        .arg("--")
        .args(cmd)
        .stdin(Stdio::null());
    if let Some(dir) = dir {
        rtrace.current_dir(dir);
    }
    let out = rtrace.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let text = std::fs::read_to_string(&folded).unwrap();
    let _ = std::fs::remove_file(&folded);
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr,
        text,
    )
}

/// `profile -- NODE hot.js` with no perf flag, `node` being `cmd`: `hot`
/// and `warm` named with their script and line, split as the fixture
/// measured, whole to node's start. `shown` is the script's path as that
/// node is given it.
/// Returns rtrace's stderr and the split.
fn profile_split(what: &str, flags: &[&str], cmd: &[&OsStr], shown: &str) -> (String, Split) {
    let script = script();
    let cmd: Vec<&OsStr> = cmd
        .iter()
        .copied()
        .chain([shown.as_ref(), "3".as_ref()])
        .collect();
    let (stdout, stderr, text) = profile_folded(flags, &cmd, None);
    let s = split(&text, shown, &script);
    check(what, &s, &stdout, &text, &stderr);
    inlined_named_right(what, &text, shown, &script);
    (stderr, s)
}

/// Checks that every JavaScript frame marked inlined (`_[i]`, under `-a`)
/// is one the fixture's `main` inlines, `hot` or `warm`, or one of Node's
/// own (`node:`) functions it calls, and lies right above `main` or
/// another inlined frame: an expansion read wrong would name another.
fn inlined_named_right(what: &str, folded: &str, shown: &str, script: &Path) {
    let [hot, warm, main] = names(shown, script);
    for (stack, _) in parse_folded(folded) {
        for (i, f) in stack.iter().enumerate() {
            if !f.ends_with("_[i]") || !f.contains(".js:") && !f.contains("(node:") {
                continue;
            }
            let name = plain(f);
            let below = i.checked_sub(1).map(|b| stack[b].as_str());
            assert!(
                (name == hot || name == warm || name.contains("(node:"))
                    && below.is_some_and(|b| plain(b) == main || b.ends_with("_[i]")),
                "{what}: inlined frame {f} below {below:?}:\n{folded}"
            );
        }
    }
}

/// This host's node 20 (a static build with its symbols).
#[test]
fn node_functions_are_named_with_no_flag_and_split_as_measured() {
    if in_guest() {
        eprintln!("skipped: the VM guests have no Node.js; the host runs it");
        return;
    }
    let script = script();
    let (stderr, s) = profile_split(
        "profile -- node",
        &["-v", "-a"],
        &["node".as_ref()],
        &script.display().to_string(),
    );
    // TurboFan inlines hot and warm into main's loop: those samples are
    // named as the others, from main's code's own tables.
    assert!(stderr.contains("inlined functions expanded"), "{stderr}");
    assert!(s.inlined >= 20, "{s:?}");
    // The command is node's: its walk is loaded before it starts, so no
    // sample of it is taken while the verifier works.
    assert!(
        stderr.contains(
            "the command runs JavaScript: the walk through its frames loaded before it starts"
        ),
        "{stderr}"
    );
    assert!(
        !stderr.contains("taken while their runtime's walk was being loaded"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("(the walk through the runtimes' frames, for"),
        "{stderr}"
    );
}

/// `profile --lines -a -- node hot.js`: a compiled frame is at the line
/// its pc was on, from its code's source positions, and an inlined one
/// too, the frame below it (`main`) at the line of the call: checked
/// against the fixture's source. Interpreted frames keep their function's
/// first line.
#[test]
fn compiled_frames_are_at_their_lines_under_lines() {
    if in_guest() {
        eprintln!("skipped: the VM guests have no Node.js; the host runs it");
        return;
    }
    let script = script();
    let shown = script.display().to_string();
    let (_, stderr, text) = profile_folded(
        &["--lines", "-a"],
        &["node".as_ref(), shown.as_ref(), "3".as_ref()],
        None,
    );
    let at = |start: &str| line_of(&script, start);
    // Each function's body: the lines after its first, before the next.
    let bodies = [
        ("hot", at("function hot(") + 1..at("function warm(")),
        ("warm", at("function warm(") + 1..at("function main(")),
    ];
    let calls = [("hot", at("x = hot(n, x)")), ("warm", at("x = warm(n, x)"))];
    let line = |f: &str| -> Option<usize> {
        let inner = plain(f).strip_suffix(')')?;
        inner.rsplit_once(':')?.1.parse().ok()
    };
    let (mut compiled, mut in_body, mut inlined, mut at_call) = (0u64, 0u64, 0u64, 0u64);
    for (stack, n) in parse_folded(&text) {
        let Some(leaf) = stack.iter().rposition(|f| f.contains(".js:")) else {
            continue;
        };
        let f = &stack[leaf];
        let Some((name, body)) = bodies
            .iter()
            .find(|(name, _)| f.starts_with(&format!("{name} ({shown}:")))
        else {
            continue;
        };
        if !f.ends_with("_[j]") && !f.ends_with("_[i]") {
            continue;
        }
        compiled += n;
        if line(f).is_some_and(|l| body.contains(&l)) {
            in_body += n;
        }
        if f.ends_with("_[i]") {
            inlined += n;
            let call = calls.iter().find(|(c, _)| c == name).map(|c| c.1);
            let below = leaf.checked_sub(1).and_then(|b| line(&stack[b]));
            if below.is_some() && below == call {
                at_call += n;
            }
        }
    }
    assert!(
        compiled >= 200,
        "{compiled} compiled samples\n{text}\n{stderr}"
    );
    assert!(
        in_body as f64 >= 0.95 * compiled as f64,
        "{in_body} of {compiled} compiled samples of hot and warm at a line of their body \
         ({bodies:?})\n{text}"
    );
    assert!(
        inlined >= 20 && at_call as f64 >= 0.95 * inlined as f64,
        "{at_call} of {inlined} inlined samples have main at the line of the call \
         ({calls:?})\n{text}"
    );
}

/// A node in a Debian root of its own (`cargo xtask setup` makes it),
/// through `chroot`: V8 in Debian's stripped `libnode.so.N`, its builtins
/// without symbols, found from its exported metadata alone.
fn in_root(var: &str, what: &str, min_inlined: u64) {
    if in_guest() {
        eprintln!("skipped: the VM guests have no Node.js; the host runs it");
        return;
    }
    let root = PathBuf::from(std::env::var(var).unwrap_or_else(|_| panic!("{var} is unset")));
    assert!(
        root.join("usr/bin/node").exists(),
        "no node in {} (cargo xtask setup makes it)",
        root.display()
    );
    std::fs::copy(script(), root.join("tmp/hot.js")).unwrap();
    let (stderr, s) = profile_split(
        what,
        &["-v", "-a"],
        &["chroot".as_ref(), root.as_os_str(), "node".as_ref()],
        "/tmp/hot.js",
    );
    assert!(stderr.contains("inlined functions expanded"), "{stderr}");
    assert!(s.inlined >= min_inlined, "{what}: {s:?}");
}

/// Debian bookworm's node 18 (V8 10) in a root of its own.
#[test]
fn debian_bookworm_node_18_in_a_chroot_is_named() {
    // V8 10's TurboFan keeps hot and warm in frames of their own here
    // but for a moment (14 of 1400 samples inlined in one run): what it
    // inlines is checked, not how much.
    in_root("RTRACE_NODE18_ROOT", "bookworm's node 18", 0);
}

/// Debian trixie's node 20 in a root of its own.
#[test]
fn debian_trixie_node_20_in_a_chroot_is_named() {
    in_root("RTRACE_NODE20_ROOT", "trixie's node 20", 20);
}

/// Debian sid's node 24 in a root of its own: V8 13, whose functions
/// reach their code through a dispatch table (which the walk does not
/// read: it names a frame by its function's SharedFunctionInfo).
#[test]
fn debian_sid_node_24_in_a_chroot_is_named() {
    in_root("RTRACE_NODE24_ROOT", "sid's node 24", 20);
}

/// Worker threads: each is an isolate of its own, with its own JIT code
/// range and its own copy of the builtins. Twelve workers are started
/// (all isolates set up at once, each where the system put it: 27 ranges
/// of code with the main isolate's and the file's, more than the 16 the
/// kernel once held) and do the fixture's work one after the other: the
/// samples of every worker are named, whole, and split as the twelve
/// measured together.
#[test]
fn worker_threads_functions_are_named_too() {
    if in_guest() {
        eprintln!("skipped: the VM guests have no Node.js; the host runs it");
        return;
    }
    const WORKERS: usize = 12;
    let script = script();
    let shown = script.display().to_string();
    let workers = WORKERS.to_string();
    let (stdout, stderr, text) = profile_folded(
        &["-v"],
        &[
            "node".as_ref(),
            shown.as_ref(),
            "4".as_ref(),
            workers.as_ref(),
        ],
        None,
    );
    let lines: Vec<&str> = stdout.lines().filter(|l| l.starts_with("split ")).collect();
    assert_eq!(lines.len(), WORKERS, "one split line a worker: {stdout}");
    let sum = |key: &str| -> f64 { lines.iter().map(|l| measured(l, key)).sum() };
    let (hot_ns, warm_ns) = (sum("hot="), sum("warm="));
    let s = split(&text, &shown, &script);
    let js = s.hot + s.warm;
    assert_share_within("workers", s.hot, s.warm, hot_ns / (hot_ns + warm_ns), 4.0);
    // Of the workers' samples in their event loops, where their
    // JavaScript runs (not their start, which twelve at once make a tenth
    // of their samples, nor their end), those in hot or warm with main
    // below.
    let [_, _, main] = names(&shown, &script);
    let (mut in_workers, mut named) = (0, 0);
    for (stack, n) in parse_folded(&text) {
        let at = |name: &str| stack.iter().position(|f| f.starts_with(name));
        let (Some(run), Some(event_loop)) = (
            at("node::worker::Worker::Run("),
            at("node::SpinEventLoopInternal("),
        ) else {
            continue;
        };
        if event_loop < run {
            continue;
        }
        in_workers += n;
        let leaf = stack.iter().rposition(|f| f.contains(".js:"));
        if leaf.is_some_and(|l| l > 0 && stack[l - 1] == main) {
            named += n;
        }
    }
    assert!(
        in_workers >= 1000 && named as f64 >= 0.9 * in_workers as f64,
        "{named} of the workers' {in_workers} samples in their event loops are in hot or warm under main \
         ({js} in all):\n{text}\n{stderr}"
    );
}

/// `profile -p PID` of a node started before rtrace: its V8 is found
/// from its maps as they are, and its functions named the same.
#[test]
fn a_node_started_before_rtrace_is_named_too() {
    started_before("profile -p", false);
}

/// Profiled by `nobody` with only CAP_BPF and CAP_PERFMON (as the
/// exporter's unit runs), root's node is named as root sees it: user
/// space may not read its memory through `/proc/PID/mem` (that needs
/// ptrace rights), so the kernel reads it for rtrace.
#[test]
fn without_ptrace_rights_node_functions_are_named() {
    started_before("profile -p by nobody", true);
}

/// A node running `script` for 4 s (its output piped), 0.7 s into its
/// run: past its start, V8's code range is mapped and the script's loop
/// runs.
fn node_running(script: &Path) -> std::process::Child {
    let node = Command::new("node")
        .arg(script)
        .arg("4")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("node (cargo xtask setup installs it)");
    std::thread::sleep(std::time::Duration::from_millis(700));
    node
}

/// Profiles a node running the fixture from 0.7 s into its run, by root
/// or (`nobody`) by user `nobody` with only CAP_BPF and CAP_PERFMON, and
/// checks the split.
fn started_before(what: &str, nobody: bool) {
    if in_guest() {
        eprintln!("skipped: the VM guests have no Node.js; the host runs it");
        return;
    }
    let script = script();
    let node = node_running(&script);
    let pid = node.id().to_string();
    let args = ["profile", "-F", "499", "-f", "-v", "-p", &pid];
    let (rtrace, copy) = rtrace_integration_tests::start_as(&args, "Sampling", nobody);
    let out = node.wait_with_output().unwrap();
    let (code, folded, stderr) = rtrace.stop(SIGINT);
    if let Some(dir) = copy {
        let _ = std::fs::remove_dir_all(dir);
    }
    assert_eq!(code, 0, "{stderr}");
    // How the memory was read, as `-v` says of the process.
    assert_eq!(
        stderr.contains("its memory read through the kernel"),
        nobody,
        "{stderr}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let s = split(&folded, &script.display().to_string(), &script);
    // The fixture's split is of its whole run; rtrace saw its last three
    // seconds, which keep the same split (each call picks the function
    // behind its share).
    check(what, &s, &stdout, &folded, &stderr);
}

/// `profile -- node shapes.js`: an async function resumed from the
/// microtask queue, a closure, a class method (the last two inlined by
/// TurboFan into their callers), a function optimized then deoptimized
/// mid-run, and one under 300 recursive calls, each named
/// `name (file:line)` with the line it starts on; the deep one whole
/// from its leaf through every `deep` to `main` with `--max-stack 512`
/// (a JavaScript frame takes two of the stack's slots, and counts once).
#[test]
fn every_shape_of_function_is_named() {
    if in_guest() {
        eprintln!("skipped: the VM guests have no Node.js; the host runs it");
        return;
    }
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/shapes.js");
    let (stdout, stderr, text) = profile_folded(
        &["--max-stack", "512", "-a"],
        &["node".as_ref(), script.as_os_str(), "600".as_ref()],
        None,
    );
    // The fixture's own account: TurboFan ran `flip`, and the call with a
    // string threw its code away.
    let optimized: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("optimized "))
        .collect();
    assert_eq!(optimized, ["1", "0"], "{stdout}");
    let path = script.display();
    let named = |name: &str, start: &str| format!("{name} ({path}:{})", line_of(&script, start));
    let leaves = [
        named("asyncSpin", "async function asyncSpin("),
        named("closureBody", "return function closureBody("),
        named("churn", "churn(rounds, x) {"),
        named("flip", "function flip("),
        named("deepLeaf", "function deepLeaf("),
    ];
    let deep = named("deep", "function deep(");
    let main = named("main", "async function main(");
    let mut at_leaf = vec![0u64; leaves.len()];
    let (mut deep_samples, mut deep_whole, mut gone, mut js) = (0u64, 0u64, 0u64, 0u64);
    let mut inlined = 0u64;
    for (marked, n) in parse_folded(&text) {
        if marked
            .iter()
            .any(|f| f.ends_with("_[i]") && leaves.iter().any(|l| plain(f) == l))
        {
            inlined += n;
        }
        let stack: Vec<String> = marked.iter().map(|f| plain(f).to_owned()).collect();
        if stack.first().is_none_or(|c| c != "node") {
            continue;
        }
        if stack.iter().any(|f| f == "[js: gone]") {
            gone += n;
        }
        let Some(leaf) = stack.iter().rposition(|f| f.contains(".js:")) else {
            continue;
        };
        js += n;
        // The leaf-most frame of the fixture's own (V8's builtins and
        // the runtime may sit above it).
        let Some(i) = leaves.iter().position(|l| stack[..=leaf].contains(l)) else {
            continue;
        };
        at_leaf[i] += n;
        if i == leaves.len() - 1 {
            deep_samples += n;
            let at = stack.iter().position(|f| *f == leaves[i]).unwrap();
            let calls = stack[..at].iter().rev().take_while(|f| **f == deep).count();
            if calls == 301 && at >= 302 && stack[at - 302] == main {
                deep_whole += n;
            }
        }
    }
    // 600 ms each at 499 Hz is about 300 samples; a third of that is
    // far outside sampling's spread.
    for (leaf, n) in leaves.iter().zip(&at_leaf) {
        assert!(
            *n >= 100,
            "{n} samples in {leaf}: {at_leaf:?}\n{text}\n{stderr}"
        );
    }
    assert!(
        deep_whole as f64 >= 0.95 * deep_samples as f64,
        "{deep_whole} of {deep_samples} samples of deepLeaf have 301 calls of deep under it and \
         main under them\n{text}"
    );
    // TurboFan inlines the class method into the arrow function that
    // calls it, and the closure into `forCpu`: those are named as the
    // others, from the code's tables.
    assert!(
        inlined >= 20,
        "{inlined} samples in the fixture's functions inlined:\n{text}"
    );
    // The collector may move a function between a sample and its name
    // being read: rare, and never named as another.
    assert!(
        gone * 100 <= js,
        "{gone} of {js} JavaScript samples have a frame gone\n{text}"
    );
}

/// perf beside rtrace on one run of `node --perf-basic-prof hot.js`:
/// perf names the JIT code from the map the flag makes node write, rtrace
/// from the walk (its names win over the map); the two split `hot` and
/// `warm` alike, within 4 standard deviations of their two samplings.
#[test]
fn the_split_agrees_with_perf_on_the_same_run() {
    if in_guest() {
        eprintln!("skipped: the VM guests have no Node.js or perf; the host runs it");
        return;
    }
    let script = script();
    let shown = script.display().to_string();
    let dir = std::env::temp_dir().join(format!("rtrace-js-perf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let data = dir.join("perf.data");
    // rtrace runs perf, which runs node: the command's children are in
    // scope, perf's own samples are not node's.
    let mut cmd: Vec<&OsStr> = ["perf", "record", "-q", "-g", "-F", "499", "-o"]
        .map(OsStr::new)
        .to_vec();
    // perf cannot tell inlined functions apart: each keeps its frame.
    cmd.extend([
        data.as_os_str(),
        "--".as_ref(),
        "env".as_ref(),
        "HOT_NO_INLINING=1".as_ref(),
        "node".as_ref(),
    ]);
    cmd.extend([
        "--perf-basic-prof".as_ref(),
        script.as_os_str(),
        "3".as_ref(),
    ]);
    let (_, _, text) = profile_folded(&[], &cmd, Some(&dir));
    let ours = split(&text, &shown, &script);
    let report = Command::new("perf")
        .args([
            "report",
            "--no-children",
            "-g",
            "none",
            "--sort",
            "sym",
            "-n",
            "--stdio",
            "-q",
            "-i",
        ])
        .arg(&data)
        .output()
        .expect("perf (cargo xtask setup installs it)");
    let report = String::from_utf8_lossy(&report.stdout);
    // `  70.12%  1234  [.] JS:*hot /path/hot.js:21:13`, one row per tier.
    let samples = |f: &str| -> u64 {
        report
            .lines()
            .filter(|l| l.contains("JS:") && l.contains(&format!("{f} {shown}:")))
            .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            .sum()
    };
    let (hot, warm) = (samples("hot"), samples("warm"));
    let _ = std::fs::remove_dir_all(&dir);
    let n1 = (ours.hot + ours.warm) as f64;
    let n2 = (hot + warm) as f64;
    assert!(
        n1 >= 200.0 && n2 >= 200.0,
        "{ours:?}, perf {hot} and {warm}\n{report}"
    );
    let (p1, p2) = (ours.hot as f64 / n1, hot as f64 / n2);
    let p = (ours.hot + hot) as f64 / (n1 + n2);
    let sd = (p * (1.0 - p) * (1.0 / n1 + 1.0 / n2)).sqrt();
    assert!(
        (p1 - p2).abs() <= 4.0 * sd,
        "hot's share: rtrace {p1:.3} of {n1}, perf {p2:.3} of {n2}; 4 sd is {:.3}\n{report}",
        4.0 * sd
    );
}

/// Under `offcputime`, a JavaScript function blocked in a C++ builtin
/// (`Atomics.wait`, as node's bindings are C++ too) is named: the walk
/// steps past the builtin's exit frame to the function that called it
/// and on to its caller. Until 6 December rows worked out from V8's
/// builtins' code read an argument slot for the exit frame's caller, and
/// `waitHere` was `[unknown]`.
#[test]
fn a_javascript_caller_of_a_cpp_builtin_is_named_off_cpu() {
    let Some((script, folded)) = waits_fixture("waits") else {
        return;
    };
    // Started first: its threads' walks while rtrace runs are all made
    // with V8 known.
    let node = node_running(&script);
    let out = Command::new(rtrace_bin())
        .args(["offcputime", "-f", "-p", &node.id().to_string(), "-o"])
        .arg(&folded)
        .arg("2")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let node = node.wait_with_output().unwrap();
    check_waits(&script, &folded, &out, &node.stdout, 1_000_000, 0.95);
}

/// The same under `offcputime -- node`: a node whose main thread blocks
/// from its start is named too. V8 is found still starting at the exec,
/// and its interpreted frames run in builtins of node's own binary, a
/// region the walk was given then: the thread runs no new code that would
/// have V8 looked at again, and until 6 December all its waits kept
/// native frames only (`Builtins_InterpreterEntryTrampoline`, no
/// `waitHere`). Now a V8 found starting is looked at again every 100 ms:
/// only waits before that (node's start takes about as long) may be
/// unnamed, about a tenth of the 3 s at most.
#[test]
fn a_node_blocked_from_its_start_is_named_under_offcputime_command() {
    let Some((script, folded)) = waits_fixture("waits-cmd") else {
        return;
    };
    let stdout = folded.with_extension("out");
    // The command's output goes to a file of its own, apart from rtrace's.
    let out = Command::new(rtrace_bin())
        .args(["offcputime", "-f", "-o"])
        .arg(&folded)
        .args(["--", "sh", "-c", "exec node \"$0\" 3 > \"$1\""])
        .arg(&script)
        .arg(&stdout)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let printed = std::fs::read(&stdout).unwrap_or_default();
    let _ = std::fs::remove_file(&stdout);
    check_waits(&script, &folded, &out, &printed, 2_000_000, 0.85);
}

/// The off-CPU fixture `waits.js` and a file for run `tag`'s folded
/// stacks; `None`, said, in the VM guests, which have no Node.js.
fn waits_fixture(tag: &str) -> Option<(PathBuf, PathBuf)> {
    if in_guest() {
        eprintln!("skipped: the VM guests have no Node.js; the host runs it");
        return None;
    }
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/waits.js");
    let folded =
        std::env::temp_dir().join(format!("rtrace-js-{tag}-{}.folded", std::process::id()));
    Some((script, folded))
}

/// Checks an `offcputime -f` run over `waits.js` (`out`, its folded
/// stacks in `folded`; the fixture printed `printed`): at least `least`
/// microseconds blocked in `Atomics.wait`, and at least `share` of them
/// under `waitHere` under `main`, with nothing unnamed between
/// `waitHere` and the builtin.
fn check_waits(
    script: &std::path::Path,
    folded: &std::path::Path,
    out: &std::process::Output,
    printed: &[u8],
    least: u64,
    share: f64,
) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let stdout = String::from_utf8_lossy(printed);
    let waits: u64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("waits "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no waits in {stdout:?}; rtrace said {stderr}"));
    assert!(waits >= 50, "the fixture waited {waits} times");
    let text = std::fs::read_to_string(folded).unwrap();
    let _ = std::fs::remove_file(folded);
    let path = script.display();
    let wait_here = format!(
        "waitHere ({path}:{})",
        line_of(script, "function waitHere(")
    );
    let main = format!("main ({path}:{})", line_of(script, "function main("));
    // Microseconds blocked in the builtin, and of them those whose
    // nearest script frames above it are waitHere, then main, with
    // nothing unnamed between waitHere and the builtin.
    let (mut all, mut whole) = (0u64, 0u64);
    for (frames, us) in parse_folded(&text) {
        let Some(builtin) = frames
            .iter()
            .position(|f| f.starts_with("v8::internal::Builtin_AtomicsWait"))
        else {
            continue;
        };
        all += us;
        let scripts: Vec<(usize, &String)> = frames[..builtin]
            .iter()
            .enumerate()
            .filter(|(_, f)| f.contains(&format!("({path}:")))
            .collect();
        if let [.., (_, caller), (at, callee)] = scripts.as_slice()
            && **callee == wait_here
            && **caller == main
            && !frames[*at..builtin].iter().any(|f| f == "[unknown]")
        {
            whole += us;
        }
    }
    let show = || {
        text.lines()
            .filter(|l| l.contains("AtomicsWait"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    // It waited nearly all of the time traced.
    assert!(all >= least, "{all} us in Atomics.wait:\n{}", show());
    assert!(
        whole as f64 >= share * all as f64,
        "{whole} of {all} us in Atomics.wait are under {wait_here} under {main}:\n{}",
        show()
    );
}

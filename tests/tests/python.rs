//! Python functions in stacks: CPython's frames walked in the kernel and
//! spliced into the native stack (`tests/fixtures/pyfix.py`, run by
//! Debian's own interpreters: bookworm's 3.11 here, trixie's 3.13 in a
//! chroot that `cargo xtask` makes), checked against what the fixture
//! measured itself and against py-spy; and the interpreter's own native
//! frames, without frame pointers, walked from CFI to its main.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use rtrace_integration_tests::{
    Rtrace, SIGINT, Workload, assert_share, in_guest, parse_folded,
    profile::{READY, count_with},
    run, verbose_count,
};

/// Debian bookworm's interpreter: statically linked with libpython, no
/// frame pointers.
const HOST_PYTHON: &str = "/usr/bin/python3.11";

/// The fixture's source.
fn fixture_source() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/pyfix.py")
}

/// A Debian root `cargo xtask` makes (`debootstrap`), with another
/// interpreter version, run through `chroot`: in another mount namespace
/// with its own libc.
#[derive(Clone, Copy)]
enum Root {
    /// trixie's python3 (3.13).
    Trixie,
    /// sid's python3.14.
    Sid,
}

impl Root {
    /// Where it is: xtask passes its path, versioned.
    fn path(self) -> PathBuf {
        let (var, dir) = match self {
            Root::Trixie => ("RTRACE_TRIXIE_ROOT", "trixie-root-1"),
            Root::Sid => ("RTRACE_SID_ROOT", "sid-root-1"),
        };
        std::env::var_os(var).map(PathBuf::from).unwrap_or_else(|| {
            PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| "/root".into()))
                .join(".cache/rtrace")
                .join(dir)
        })
    }

    /// Its interpreter, inside it.
    fn python(self) -> &'static str {
        match self {
            Root::Trixie => "/usr/bin/python3",
            Root::Sid => "/usr/bin/python3.14",
        }
    }
}

/// How the fixture is run.
#[derive(Clone, Copy)]
enum Python {
    /// The host's python3.11.
    Host,
    /// A Debian root's interpreter, through `chroot`.
    Chroot(Root),
    /// The `pyembed` fixture: the host's libpython3.11.so, loaded by an
    /// application.
    Embedded,
    /// Another interpreter, by path (`RTRACE_EXTRA_PYTHONS`).
    Other(&'static str),
}

/// Starts the fixture in `mode` for `seconds` under `python`; it waits
/// for `go`.
fn start(python: Python, mode: &str, seconds: &str) -> Workload {
    let cmd = match python {
        Python::Host => {
            let mut c = Command::new(HOST_PYTHON);
            c.arg(fixture_source());
            c
        }
        Python::Embedded => {
            let mut c = Command::new(rtrace_integration_tests::workload_bin("pyembed_nofp"));
            c.arg(fixture_source());
            c
        }
        Python::Other(path) => {
            let mut c = Command::new(path);
            c.arg(fixture_source());
            c
        }
        Python::Chroot(r) => {
            let root = r.path();
            let python = root.join(&r.python()[1..]);
            assert!(
                python.exists(),
                "no {} at {} (cargo xtask setup makes it)",
                r.python(),
                root.display()
            );
            std::fs::copy(fixture_source(), root.join("tmp/pyfix.py")).unwrap();
            let mut c = Command::new("chroot");
            c.arg(&root).args([r.python(), "/tmp/pyfix.py"]);
            c
        }
    };
    let mut cmd = cmd;
    cmd.args([mode, seconds]);
    let (w, line) = Workload::start_command(cmd);
    assert!(line.starts_with("ready"), "{line:?}");
    w
}

/// Profiles the fixture's work at 999 Hz with `extra` flags; returns the
/// folded stacks, rtrace's stderr and the numbers of the fixture's
/// `done` line.
fn profile(
    python: Python,
    mode: &str,
    seconds: &str,
    extra: &[&str],
) -> (Folded, String, Vec<i64>) {
    profile_as(python, mode, seconds, extra, false)
}

/// [`profile`], by root or (`nobody`) by user `nobody` with only
/// CAP_BPF and CAP_PERFMON, as the exporter's unit runs it: no right to
/// read another user's memory through `/proc/PID/mem`.
fn profile_as(
    python: Python,
    mode: &str,
    seconds: &str,
    extra: &[&str],
    nobody: bool,
) -> (Folded, String, Vec<i64>) {
    let mut w = start(python, mode, seconds);
    let pid = w.pid().to_string();
    let mut args = vec!["profile", "-F", "999", "-p", &pid, "-f", "-v"];
    args.extend_from_slice(extra);
    let (rtrace, copy) = rtrace_integration_tests::start_as(&args, READY, nobody);
    let done = w.go();
    let (code, stdout, stderr) = rtrace.stop(SIGINT);
    assert!(w.wait().success());
    if let Some(dir) = copy {
        let _ = std::fs::remove_dir_all(dir);
    }
    assert_eq!(code, 0, "{stderr}");
    let nums = done
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    (parse_folded(&stdout), stderr, nums)
}

type Folded = BTreeMap<Vec<String>, u64>;

/// The Python frames of a stack, root first (names `module.function`).
fn py_frames(stack: &[String], module: &str) -> Vec<String> {
    stack
        .iter()
        .filter(|f| f.starts_with(&format!("{module}.")) || f.starts_with("threading."))
        .cloned()
        .collect()
}

/// Samples whose stack has Python frame `name`.
fn with_frame(folded: &Folded, name: &str) -> u64 {
    folded
        .iter()
        .filter(|(s, _)| s.iter().any(|f| f == name))
        .map(|(_, c)| c)
        .sum()
}

/// Checks that at least 95% of the samples have one of the whole chains
/// `chains` (each root first, and a sample's Python frames must begin
/// with one, with nothing of another module between) under
/// `Py_BytesMain`.
fn check_whole(folded: &Folded, chains: &[&[&str]], what: &str) {
    check_whole_excusing(folded, chains, what, 0);
}

/// [`check_whole`], with `excused` samples left out of the count they
/// are judged against: samples rtrace said it walked without Python's
/// walk (`ERR_RUNTIME_UNLOADED`).
fn check_whole_excusing(folded: &Folded, chains: &[&[&str]], what: &str, excused: u64) {
    let total: u64 = folded.values().sum::<u64>() - excused;
    let whole: u64 = folded
        .iter()
        .filter(|(s, _)| {
            let py = py_frames(s, "pyfix");
            let main = s.iter().position(|f| f == "Py_BytesMain");
            let first = s.iter().position(|f| f.starts_with("pyfix."));
            main.is_some()
                && first.is_some_and(|f| f > main.unwrap())
                && chains.iter().any(|c| {
                    py.len() >= c.len()
                        && py.iter().zip(c.iter()).all(|(a, b)| a == b)
                        && py.len() <= c.len() + 1
                })
        })
        .map(|(_, c)| c)
        .sum();
    assert!(total >= 500, "{what}: too few samples ({total})");
    assert!(
        whole as f64 >= 0.95 * total as f64,
        "{what}: {whole} of {total} samples have a whole Python chain:\n{}",
        show(folded)
    );
}

/// The heaviest stacks, for messages.
fn show(folded: &Folded) -> String {
    let mut v: Vec<(&Vec<String>, &u64)> = folded.iter().collect();
    v.sort_by(|a, b| b.1.cmp(a.1));
    v.iter()
        .take(24)
        .map(|(s, c)| format!("{} {c}", s.join(";")))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The split of hot and warm, and whole chains, under `python`.
fn split_under(python: Python, version: &str) {
    let (folded, stderr, done) = profile(python, "split", "3", &[]);
    assert!(
        stderr.contains(&format!("): Python {version}")),
        "-v names the interpreter:\n{stderr}"
    );
    check_split(&folded, &done, "split");
}

/// The split fixture's whole chains, and hot's share of hot and warm as
/// the fixture measured it (`done`).
fn check_split(folded: &Folded, done: &[i64], what: &str) {
    check_split_excusing(folded, done, what, 0);
}

/// [`check_split`], whole chains judged as [`check_whole_excusing`].
fn check_split_excusing(folded: &Folded, done: &[i64], what: &str, excused: u64) {
    let chain = ["pyfix.<module>", "pyfix.main", "pyfix.outer"];
    check_whole_excusing(
        folded,
        &[
            &[chain[0], chain[1], chain[2], "pyfix.hot"],
            &[chain[0], chain[1], chain[2], "pyfix.warm"],
            &chain,
        ],
        what,
        excused,
    );
    let (hot, warm) = (
        with_frame(folded, "pyfix.hot"),
        with_frame(folded, "pyfix.warm"),
    );
    let want = done[0] as f64 / (done[0] + done[1]) as f64;
    assert_share("pyfix.hot", hot, warm, want);
}

#[test]
fn python_functions_split_as_measured_with_whole_chains() {
    if skip_in_guest() {
        return;
    }
    split_under(Python::Host, "3.11");
}

#[test]
fn python_in_a_shared_libpython_is_walked_and_named() {
    if skip_in_guest() {
        return;
    }
    split_under(Python::Embedded, "3.11");
}

/// A walk keeps, per thread, the native frames under its last Python
/// frame, and takes them from there while the stack there is unchanged.
/// The `pytails` fixture enters Python from two C functions, `path_a` and
/// `path_b`, alike but for the return address the stack holds below
/// Python's frames: every sample of `spin_a` (run only under `path_a`)
/// must have `path_a` under it and never `path_b`, and the other way
/// round, though most walks took that part from the thread's last one
/// (`-v` counts them); the split is the fixture's own.
#[test]
fn native_frames_kept_under_python_are_never_another_paths() {
    if skip_in_guest() {
        return;
    }
    let bin = rtrace_integration_tests::workload_bin("pytails_nofp");
    let (mut w, line) = Workload::start_command({
        let mut c = Command::new(bin);
        c.arg("3");
        c
    });
    assert!(line.starts_with("ready"), "{line:?}");
    let pid = w.pid().to_string();
    let rtrace = Rtrace::start_until(&["profile", "-F", "999", "-p", &pid, "-f", "-v"], READY);
    let done = w.go();
    let (code, stdout, stderr) = rtrace.stop(SIGINT);
    assert!(w.wait().success());
    assert_eq!(code, 0, "{stderr}");
    let folded = parse_folded(&stdout);
    let has = |s: &[String], name: &str| {
        s.iter()
            .any(|f| f == name || f.ends_with(&format!(".{name}")))
    };
    let (mut a, mut b) = (0, 0);
    for (stack, &n) in &folded {
        let (in_a, in_b) = (has(stack, "spin_a"), has(stack, "spin_b"));
        if in_a || in_b {
            assert!(
                has(stack, "main") && has(stack, "path_a") == in_a && has(stack, "path_b") == in_b,
                "{n} samples of {} under the other path, or not whole:\n{}",
                if in_a { "spin_a" } else { "spin_b" },
                stack.join(";")
            );
        }
        a += u64::from(in_a) * n;
        b += u64::from(in_b) * n;
    }
    assert!(
        a + b >= 1000,
        "too few samples of spin_a and spin_b ({a}, {b}):\n{}",
        show(&folded)
    );
    let recalled = verbose_count(
        &stderr,
        "profile",
        "walks that took the native frames under their runtime's from the thread's last walk, the stack there unchanged",
    )
    .unwrap_or(0);
    assert!(
        recalled * 2 >= a + b,
        "{recalled} walks of {} took the kept frames: the test tests nothing\n{stderr}",
        a + b
    );
    let nums: Vec<f64> = done
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    assert_share("spin_a", a, b, nums[0] / (nums[0] + nums[1]));
}

/// Interpreters no reachable registry has (3.10 and 3.12 are in none of
/// Debian's releases), given by path in `RTRACE_EXTRA_PYTHONS` (colon-
/// separated, `VERSION=PATH`, such as `3.12=/opt/py312/bin/python3.12`).
#[test]
fn extra_interpreters_are_walked_and_named() {
    if skip_in_guest() {
        return;
    }
    let Ok(list) = std::env::var("RTRACE_EXTRA_PYTHONS") else {
        eprintln!("skipped: RTRACE_EXTRA_PYTHONS names no other interpreters");
        return;
    };
    for entry in list.split(':').filter(|e| !e.is_empty()) {
        let (version, path) = entry.split_once('=').expect("VERSION=PATH");
        eprintln!("{version}: {path}");
        split_under(
            Python::Other(Box::leak(path.to_owned().into_boxed_str())),
            version,
        );
    }
}

#[test]
fn python_313_in_a_trixie_chroot_is_walked_and_named() {
    if skip_in_guest() {
        return;
    }
    split_under(Python::Chroot(Root::Trixie), "3.13");
}

/// Debian sid's 3.14: `_Py_DebugOffsets` of 3.14's shape, tagged code
/// references, and an interpreter loop that GCC split from its exported
/// entry into a range of its own.
#[test]
fn python_314_in_a_sid_chroot_is_walked_and_named() {
    if skip_in_guest() {
        return;
    }
    split_under(Python::Chroot(Root::Sid), "3.14");
}

/// Tests of `$check`: `$host` under the host's 3.11, `$sid` under Debian
/// sid's 3.14.
macro_rules! under_both {
    ($(#[$doc:meta])* $host:ident, $sid:ident, $check:ident) => {
        $(#[$doc])*
        #[test]
        fn $host() {
            if skip_in_guest() {
                return;
            }
            $check(Python::Host);
        }

        #[test]
        fn $sid() {
            if skip_in_guest() {
                return;
            }
            $check(Python::Chroot(Root::Sid));
        }
    };
}

/// The guests carry no Python, and the walk runs the same code there; the
/// host and its chroot run these tests.
fn skip_in_guest() -> bool {
    if in_guest() {
        eprintln!("skipped: the guests carry no Python (the host runs this test)");
        return true;
    }
    false
}

under_both!(
    a_recursive_tower_keeps_every_python_frame,
    a_recursive_tower_keeps_every_python_frame_under_314,
    tower
);

/// Every frame of a 21-deep recursion of Python functions, whole.
fn tower(python: Python) {
    let (folded, _, _) = profile(python, "tower", "2", &[]);
    let mut chain = vec!["pyfix.<module>", "pyfix.main"];
    chain.extend(std::iter::repeat_n("pyfix.tower", 21));
    chain.extend(["pyfix.leaf", "pyfix.spin_until"]);
    check_whole(&folded, &[&chain], "tower");
}

under_both!(
    a_c_extension_sits_above_the_python_function_that_called_it,
    a_c_extension_sits_above_the_python_function_that_called_it_under_314,
    c_extension
);

/// zlib's C code above the Python function that called it, split as measured.
fn c_extension(python: Python) {
    let (folded, _, done) = profile(python, "zlib", "3", &[]);
    let zlib = |f: &String| f.starts_with("deflate") || f == "longest_match" || f == "compress";
    let mut above = 0;
    let mut total = 0;
    for (s, c) in &folded {
        let Some(z) = s.iter().position(zlib) else {
            continue;
        };
        total += c;
        let caller = s[..z].iter().rposition(|f| f.starts_with("pyfix."));
        if caller.is_some_and(|i| s[i] == "pyfix.compressing") {
            above += c;
        }
    }
    assert!(
        total >= 200,
        "too few samples in zlib ({total}):\n{}",
        show(&folded)
    );
    assert!(
        above as f64 >= 0.95 * total as f64,
        "{above} of {total} samples in zlib sit above pyfix.compressing:\n{}",
        show(&folded)
    );
    let (z, p) = (
        with_frame(&folded, "pyfix.compressing"),
        with_frame(&folded, "pyfix.pure"),
    );
    assert_share(
        "pyfix.compressing",
        z,
        p,
        done[0] as f64 / (done[0] + done[1]) as f64,
    );
}

under_both!(
    each_thread_has_its_own_python_stack,
    each_thread_has_its_own_python_stack_under_314,
    threads
);

/// Two threads' own chains, split as measured.
fn threads(python: Python) {
    let (folded, _, done) = profile(python, "threads", "3", &[]);
    let mut own = 0;
    let mut total = 0;
    for (s, c) in &folded {
        let py = py_frames(s, "pyfix");
        let Some(k) = py
            .iter()
            .position(|f| f == "pyfix.thread_a" || f == "pyfix.thread_b")
        else {
            continue;
        };
        total += c;
        // threading's frames below, the spin above, nothing of another
        // thread's function.
        let other = if py[k] == "pyfix.thread_a" {
            "pyfix.thread_b"
        } else {
            "pyfix.thread_a"
        };
        if py[..k].iter().all(|f| f.starts_with("threading."))
            && !py.iter().any(|f| f == other)
            && py.get(k + 1).is_some_and(|f| f == "pyfix.spin_until")
        {
            own += c;
        }
    }
    assert!(total >= 500, "too few samples in the threads ({total})");
    assert!(
        own as f64 >= 0.95 * total as f64,
        "{own} of {total} samples of the threads have their own whole chain:\n{}",
        show(&folded)
    );
    assert_share(
        "pyfix.thread_a",
        with_frame(&folded, "pyfix.thread_a"),
        with_frame(&folded, "pyfix.thread_b"),
        done[0] as f64 / (done[0] + done[1]) as f64,
    );
}

under_both!(
    offcputime_names_the_python_functions_that_blocked,
    offcputime_names_the_python_functions_that_blocked_under_314,
    blocked
);

/// offcputime's blocked time by the Python functions that blocked, split as measured.
fn blocked(python: Python) {
    let mut w = start(python, "blocked", "3");
    let pid = w.pid().to_string();
    let rtrace = Rtrace::start(&["offcputime", "-p", &pid, "-f", "-U"]);
    let done = w.go();
    let (code, stdout, stderr) = rtrace.stop(SIGINT);
    assert!(w.wait().success());
    assert_eq!(code, 0, "{stderr}");
    let folded = parse_folded(&stdout);
    let done: Vec<i64> = done
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    let (sleep, recv) = (
        with_frame(&folded, "pyfix.sleeper"),
        with_frame(&folded, "pyfix.receiver"),
    );
    assert!(sleep > 0 && recv > 0, "{}", show(&folded));
    // Blocked time, not samples: the bound is the 5 points alone.
    let got = sleep as f64 / (sleep + recv) as f64;
    let want = done[0] as f64 / (done[0] + done[1]) as f64;
    assert!(
        (got - want).abs() <= 0.05,
        "pyfix.sleeper's share of blocked time {got:.3}, the fixture measured {want:.3}:\n{}",
        show(&folded)
    );
}

under_both!(
    code_objects_freed_and_replaced_at_one_address_keep_their_own_names,
    code_objects_freed_and_replaced_at_one_address_keep_their_own_names_under_314,
    codes
);

/// Code objects freed and made again at one address keep their own names.
fn codes(python: Python) {
    let (folded, stderr, done) = profile(python, "codes", "4", &[]);
    let (rounds, reused) = (done[0], done[1]);
    assert!(
        reused > 0,
        "the fixture's code objects never took an old address ({rounds} rounds)"
    );
    let mut named = std::collections::BTreeSet::new();
    let (mut right, mut wrong) = (0, 0);
    let mut wrong_stacks = Vec::new();
    for (s, c) in &folded {
        let py = py_frames(s, "pyfix_codes");
        let Some(f) = py.iter().find(|f| f.starts_with("pyfix_codes.f_")) else {
            continue;
        };
        let k: i64 = f["pyfix_codes.f_".len()..].parse().unwrap();
        assert!(k < rounds, "{f} was never made");
        named.insert(k);
        // A function named wrong shows the other leaf under it. One with
        // no leaf under it was sampled in its own code, calling its leaf
        // or returning from it (1 of 3990 samples in a run of 3.11).
        let other = if k % 2 == 0 {
            "pyfix.leaf_odd"
        } else {
            "pyfix.leaf_even"
        };
        if s.iter().any(|x| x == other) {
            wrong += c;
            wrong_stacks.push(format!("{} {c}", s.join(";")));
        } else {
            right += c;
        }
    }
    assert_eq!(
        wrong,
        0,
        "{right} samples right; named with another function's leaf:\n{}",
        wrong_stacks.join("\n")
    );
    assert!(
        named.len() as i64 >= rounds / 2,
        "{} of {rounds} functions named:\n{stderr}",
        named.len()
    );
}

/// Profiles `sh -c` of `command`, the fixture's split run as rtrace's
/// own command with its output to a file (`> OUT` appended), at 999 Hz
/// with `-v`; returns rtrace's stderr, the fixture's `done` numbers and
/// the folded stacks of processes whose command starts with `comm`.
fn profile_command(command: &str, name: &str, comm: &str) -> (String, Vec<i64>, Folded) {
    let out = std::env::temp_dir().join(format!("rtrace-{name}-{}", std::process::id()));
    let script = format!("{command} > {}", out.display());
    let report = out.with_extension("folded");
    let (code, _, stderr) = run(&[
        "profile",
        "-F",
        "999",
        "-f",
        "-v",
        "-o",
        report.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        &script,
    ]);
    let printed = std::fs::read_to_string(&out).unwrap_or_default();
    let stacks = std::fs::read_to_string(&report).unwrap_or_default();
    let _ = std::fs::remove_file(&out);
    let _ = std::fs::remove_file(&report);
    assert_eq!(code, 0, "{stderr}");
    let done: Vec<i64> = printed
        .lines()
        .find_map(|l| l.strip_prefix("done"))
        .unwrap_or_else(|| panic!("no done line: {printed:?}"))
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    let folded: Folded = parse_folded(&stacks)
        .into_iter()
        .filter(|(s, _)| s.first().is_some_and(|c| c.starts_with(comm)))
        .collect();
    (stderr, done, folded)
}

/// Python run as rtrace's own command (`-- CMD`): no runtime is in scope
/// as sampling starts, so the sampling program walks native frames only
/// (the one walk the verifier goes through then), and the walk through
/// Python frames is loaded, and swapped in, once user space has read the
/// interpreter. The split is then named with whole chains as under `-p`:
/// the samples walked before the swap are the interpreter's start.
#[test]
fn a_command_gets_the_python_walk_loaded_once_its_interpreter_is_read() {
    if skip_in_guest() {
        return;
    }
    let (stderr, done, folded) = profile_command(
        &format!(
            "printf '\\n\\n' | {HOST_PYTHON} {} split 3",
            fixture_source().display()
        ),
        "pycmd",
        "python",
    );
    // Only the native walk was loaded with the sampling program.
    let verified: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains(" instructions verified") && l.contains("program profile_"))
        .collect();
    assert!(
        verified
            .iter()
            .any(|l| l.contains("program profile_native:"))
            && !verified
                .iter()
                .any(|l| l.contains("program profile_python:")),
        "the start loads the native walk alone:\n{stderr}"
    );
    assert!(
        stderr.contains(
            "program profile_python (the walk through the runtimes' frames, for Python) loaded"
        ),
        "-v says when the Python walk was loaded:\n{stderr}"
    );
    // The samples between the interpreter's first read and the swap are
    // counted, and said; they are not judged as whole chains. They are few
    // (the load takes a fraction of a second), and must be.
    let unloaded: u64 = stderr
        .lines()
        .find_map(|l| {
            l.strip_prefix("rtrace: warning[lost]: ")?
                .strip_suffix(
                    " samples of Python, Java or Node processes taken while their runtime's walk \
                     was being loaded (native frames only)",
                )?
                .parse()
                .ok()
        })
        .unwrap_or(0);
    let total: u64 = folded.values().sum();
    assert!(
        unloaded * 5 <= total,
        "{unloaded} of {total} samples walked before the Python walk was loaded:\n{stderr}"
    );
    check_split_excusing(&folded, &done, "split as a command", unloaded);
}

/// `perf` (Debian's links libpython3.11 for `perf script`, and `perf
/// record` never starts an interpreter) is a program that embeds Python
/// without running it: it is found and held, and the walk through
/// Python's frames, which would cost every sample of the run, is not
/// loaded for it.
#[test]
fn a_program_that_links_python_without_starting_it_loads_no_python_walk() {
    if skip_in_guest() {
        return;
    }
    let data = std::env::temp_dir().join(format!("rtrace-pyheld-{}.data", std::process::id()));
    let mut perf = Command::new("perf")
        .args(["record", "-q", "-e", "cpu-clock", "-o"])
        .arg(&data)
        .args(["--", "sleep", "4"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("perf (Debian package linux-perf; cargo xtask setup installs it)");
    // Until perf has opened its events: its libraries are mapped by then.
    std::thread::sleep(Duration::from_millis(500));
    let pid = perf.id().to_string();
    let (code, _, stderr) = run(&["profile", "-F", "99", "-f", "-v", "-p", &pid, "1"]);
    let _ = perf.wait();
    let _ = std::fs::remove_file(&data);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains(&format!("PID {pid} (perf): Python 3.11"))
            && stderr.contains("linked but not started (not walked until it starts)"),
        "-v says perf's Python is held:\n{stderr}"
    );
    assert!(
        !stderr.contains("program profile_python") && !stderr.contains("program profile_runtimes"),
        "no Python walk loaded for perf:\n{stderr}"
    );
}

/// A program that embeds Python and starts its interpreter a second
/// after it loaded libpython (`pyembed` with `PYEMBED_DELAY_MS`) is held
/// until then, and given to the kernel once it has: the walk through
/// Python's frames is loaded after the interpreter started, not when
/// libpython was mapped, and the work after names the split with whole
/// chains.
#[test]
fn an_embedded_interpreter_is_walked_once_it_starts() {
    if skip_in_guest() {
        return;
    }
    // The work waits for its two lines until the walk has had time to
    // load (the verifier takes a fraction of a second).
    let (stderr, done, folded) = profile_command(
        &format!(
            "(sleep 3; printf '\\n\\n') | PYEMBED_DELAY_MS=1000 {} {} split 3",
            rtrace_integration_tests::workload_bin("pyembed_nofp").display(),
            fixture_source().display()
        ),
        "pyembed",
        "pyembed",
    );
    assert!(
        stderr.contains("linked by the program and held until it started"),
        "-v says the interpreter was held until it started:\n{stderr}"
    );
    let loaded: f64 = stderr
        .lines()
        .find_map(|l| {
            l.split("program profile_python (the walk through the runtimes' frames, for Python) loaded ")
                .nth(1)?
                .split(" s in")
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("-v says when the Python walk was loaded:\n{stderr}"));
    assert!(
        loaded >= 0.9,
        "the Python walk was loaded {loaded} s in, before the interpreter started:\n{stderr}"
    );
    check_split(&folded, &done, "split in an embedding program");
}

#[test]
fn a_python_process_that_exits_mid_profile_keeps_its_names() {
    if skip_in_guest() {
        return;
    }
    let mut w = start(Python::Host, "split", "1");
    let pid = w.pid().to_string();
    let rtrace = Rtrace::start_until(&["profile", "-F", "999", "-p", &pid, "-f"], READY);
    w.go();
    assert!(w.wait().success());
    std::thread::sleep(std::time::Duration::from_millis(500));
    let (code, stdout, stderr) = rtrace.stop(SIGINT);
    assert_eq!(code, 0, "{stderr}");
    let folded = parse_folded(&stdout);
    let hot = with_frame(&folded, "pyfix.hot");
    let unnamed = with_frame(&folded, "[python]");
    assert!(hot >= 300, "{hot} samples in pyfix.hot:\n{}", show(&folded));
    assert!(unnamed * 20 <= hot, "{unnamed} unnamed frames:\n{stderr}");
}

#[test]
fn no_python_and_an_unknown_version_keep_native_frames() {
    if skip_in_guest() {
        return;
    }
    let (folded, _, _) = profile(Python::Host, "split", "1", &["--no-python"]);
    assert_eq!(with_frame(&folded, "pyfix.hot"), 0, "{}", show(&folded));
    assert!(with_frame(&folded, "_PyEval_EvalFrameDefault") > 0);

    // A copy of the interpreter that says it is 3.99.
    let dir = std::env::temp_dir().join(format!("rtrace-py399-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let copy = dir.join("python3.11");
    let mut data = std::fs::read(HOST_PYTHON).unwrap();
    let at = symbol_offset(&data, "Py_Version");
    data[at + 2] = 99;
    std::fs::write(&copy, &data).unwrap();
    std::fs::set_permissions(&copy, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut cmd = Command::new(&copy);
    cmd.arg(fixture_source()).args(["split", "1"]);
    let (mut w, line) = Workload::start_command(cmd);
    assert!(line.starts_with("ready"));
    let pid = w.pid().to_string();
    let rtrace = Rtrace::start_until(&["profile", "-F", "999", "-p", &pid, "-f"], READY);
    w.go();
    let (code, stdout, stderr) = rtrace.stop(SIGINT);
    assert!(w.wait().success());
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains("no Python frames: Python 3.99") && stderr.contains("native frames only"),
        "{stderr}"
    );
    let folded = parse_folded(&stdout);
    assert_eq!(with_frame(&folded, "pyfix.hot"), 0);
    assert!(with_frame(&folded, "Py_BytesMain") > 0, "{}", show(&folded));
}

/// Profiled by `nobody` with only CAP_BPF and CAP_PERFMON (as the
/// exporter's unit runs), root's Python process is named as root sees
/// it, lines included: the kernel copies each code object's name, file
/// and line table as the walk first meets it, and reads the rest for
/// user space, which may not read the process's memory
/// (`/proc/PID/mem` needs ptrace rights). The
/// host's interpreter only: the Debian roots are under root's home, whose
/// files `nobody` may not open to read their CFI (every interpreter takes
/// the kernel's copies as root too, so the roots' tests cover 3.13's and
/// 3.14's copies).
#[test]
fn without_ptrace_rights_python_functions_are_named() {
    if skip_in_guest() {
        return;
    }
    unprivileged(Python::Host);
}

/// The split, its chains and its lines, profiled by `nobody`.
fn unprivileged(python: Python) {
    let (folded, stderr, done) = profile_as(python, "split", "3", &["--lines"], true);
    // Proof that `/proc/PID/mem` was closed: the process is found, its
    // memory read through the kernel instead.
    assert!(
        stderr.contains("its memory read through the kernel, as /proc/PID/mem needs ptrace rights"),
        "{stderr}"
    );
    assert!(!stderr.contains("[python]"), "{stderr}");
    check_hot_lines(&folded);
    // Lines taken off, for the same checks as root's.
    let mut plain = Folded::new();
    for (s, c) in &folded {
        let mut stack = Vec::new();
        for f in s {
            let Some((name, at)) = f.split_once(" (") else {
                stack.push(f.clone());
                continue;
            };
            if name.starts_with("pyfix.") {
                let (file, _) = at.strip_suffix(')').unwrap().rsplit_once(':').unwrap();
                assert!(file.ends_with("pyfix.py"), "{f}");
            }
            stack.push(name.to_owned());
        }
        *plain.entry(stack).or_default() += c;
    }
    assert!(with_frame(&plain, "[python]") == 0, "{}", show(&plain));
    // Shown only if the test fails (the harness keeps a passing test's
    // output): what the split's samples were, with their lines.
    eprintln!(
        "done {done:?}; the stacks, most samples first:\n{}\n{stderr}",
        show(&folded)
    );
    check_split(&plain, &done, "split by nobody");
}

/// A free-threaded build (here sid's 3.14 with its `_Py_DebugOffsets`
/// saying so, as a 3.14t's do) is told apart by its offsets and refused
/// with one line; its native frames stay.
#[test]
fn a_free_threaded_build_is_refused_and_keeps_native_frames() {
    if skip_in_guest() {
        return;
    }
    let root = Root::Sid.path();
    let mut data = std::fs::read(root.join(&Root::Sid.python()[1..])).unwrap();
    // `_PyRuntime` begins with the table: cookie, version, free_threaded.
    let at = symbol_offset(&data, "_PyRuntime");
    assert_eq!(&data[at..at + 8], b"xdebugpy");
    data[at + 16] = 1;
    let copy = root.join("tmp/python3.14t");
    std::fs::write(&copy, &data).unwrap();
    std::fs::set_permissions(&copy, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    std::fs::copy(fixture_source(), root.join("tmp/pyfix.py")).unwrap();
    let mut cmd = Command::new("chroot");
    cmd.arg(&root)
        .args(["/tmp/python3.14t", "/tmp/pyfix.py", "split", "1"]);
    let (mut w, line) = Workload::start_command(cmd);
    assert!(line.starts_with("ready"));
    let pid = w.pid().to_string();
    let rtrace = Rtrace::start_until(&["profile", "-F", "999", "-p", &pid, "-f"], READY);
    w.go();
    let (code, stdout, stderr) = rtrace.stop(SIGINT);
    assert!(w.wait().success());
    let _ = std::fs::remove_file(&copy);
    assert_eq!(code, 0, "{stderr}");
    // One line when the process is met (the warnings at exit repeat it).
    let said = stderr
        .lines()
        .filter(|l| l.contains("free-threaded builds (3.14t) are not supported"))
        .filter(|l| l.contains("native frames only"))
        .count();
    assert_eq!(said, 1, "{stderr}");
    let folded = parse_folded(&stdout);
    assert_eq!(with_frame(&folded, "pyfix.hot"), 0);
    assert!(with_frame(&folded, "Py_BytesMain") > 0, "{}", show(&folded));
}

/// The file offset of dynamic symbol `name` in an ELF file.
fn symbol_offset(data: &[u8], name: &str) -> usize {
    use object::{Object as _, ObjectSegment as _, ObjectSymbol as _};
    let elf = object::File::parse(data).unwrap();
    let sym = elf
        .dynamic_symbols()
        .find(|s| s.name() == Ok(name))
        .unwrap_or_else(|| panic!("no {name}"));
    let a = sym.address();
    elf.segments()
        .find_map(|s| {
            let (off, size) = s.file_range();
            (s.address() <= a && a < s.address() + size).then(|| (a - s.address() + off) as usize)
        })
        .unwrap()
}

under_both!(
    lines_name_the_python_source_line,
    lines_name_the_python_source_line_under_314,
    lines
);

/// Each Python frame with its source line under --lines, as the fixture says.
fn lines(python: Python) {
    let (folded, _, _) = profile(python, "split", "2", &["--lines"]);
    check_hot_lines(&folded);
}

/// Under `--lines`, `pyfix.hot`'s frames are in the fixture's file, and
/// at least 90% of them at its loop's lines (the `for` and the `s += i *
/// i` of its body), of at least 300 samples.
fn check_hot_lines(folded: &Folded) {
    let src = std::fs::read_to_string(fixture_source()).unwrap();
    let line_of = |text: &str| src.lines().position(|l| l.trim() == text).unwrap() + 1;
    let def = src.lines().position(|l| l == "def hot(n):").unwrap() + 1;
    let body = [def + 2, def + 3];
    let mut in_hot = 0;
    let mut at_body = 0;
    for (s, c) in folded {
        for f in s {
            if let Some(rest) = f.strip_prefix("pyfix.hot (") {
                in_hot += c;
                let (file, n) = rest.strip_suffix(')').unwrap().rsplit_once(':').unwrap();
                assert!(file.ends_with("pyfix.py"), "{f}");
                let n: usize = n.parse().unwrap();
                if body.contains(&n) {
                    at_body += c;
                }
            }
        }
    }
    assert!(in_hot >= 300, "{in_hot} in pyfix.hot:\n{}", show(folded));
    assert!(
        at_body as f64 >= 0.9 * in_hot as f64,
        "{at_body} of {in_hot} at lines {body:?} (s += i * i is line {}):\n{}",
        line_of("s += i * i"),
        show(folded)
    );
}

under_both!(
    /// py-spy (from PyPI, as `cargo xtask` installs it) on the same process:
    /// the same Python leaves with shares within 5 points.
    python_leaves_match_py_spy,
    python_leaves_match_py_spy_under_314,
    beside_py_spy
);

/// rtrace's and py-spy's innermost Python functions, sampling one process at once, within 4 sd.
fn beside_py_spy(python: Python) {
    let py_spy = std::env::var_os("RTRACE_PY_SPY")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| "/root".into()))
                .join(".cache/rtrace/py-spy/bin/py-spy")
        });
    assert!(
        py_spy.exists(),
        "no py-spy at {} (cargo xtask setup installs it)",
        py_spy.display()
    );
    let mut w = start(python, "split", "4");
    let pid = w.pid().to_string();
    let raw = std::env::temp_dir().join(format!("rtrace-pyspy-{}.txt", std::process::id()));
    let rtrace = Rtrace::start_until(&["profile", "-F", "99", "-p", &pid, "-f"], READY);
    let spy = Command::new(&py_spy)
        .args([
            "record", "--native", "--format", "raw", "-r", "99", "-d", "3", "-p", &pid, "-o",
        ])
        .arg(&raw)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    w.go();
    let out = spy.wait_with_output().unwrap();
    let (code, stdout, stderr) = rtrace.stop(SIGINT);
    assert!(w.wait().success());
    assert_eq!(code, 0, "{stderr}");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let theirs = std::fs::read_to_string(&raw).unwrap();
    let _ = std::fs::remove_file(&raw);
    // py-spy's raw lines: frames `function (file.py:line)` root first.
    let mut spy_leaves: BTreeMap<String, u64> = BTreeMap::new();
    for line in theirs.lines() {
        let Some((stack, n)) = line.rsplit_once(' ') else {
            continue;
        };
        let leaf = stack
            .split(';')
            .rfind(|f| f.contains(".py:"))
            .and_then(|f| f.split(" (").next())
            .unwrap_or("");
        *spy_leaves.entry(leaf.to_owned()).or_default() += n.parse::<u64>().unwrap_or(0);
    }
    let folded = parse_folded(&stdout);
    let mut ours: BTreeMap<String, u64> = BTreeMap::new();
    for (s, c) in &folded {
        let leaf = py_frames(s, "pyfix").last().cloned().unwrap_or_default();
        let leaf = leaf.strip_prefix("pyfix.").unwrap_or(&leaf).to_owned();
        *ours.entry(leaf).or_default() += c;
    }
    let share = |m: &BTreeMap<String, u64>, k: &str| {
        let hw = m.get("hot").copied().unwrap_or(0) + m.get("warm").copied().unwrap_or(0);
        m.get(k).copied().unwrap_or(0) as f64 / hw.max(1) as f64
    };
    // Two samplings of one process over about the same seconds: their
    // shares differ by chance with the binomial's spread, each of its own
    // count; four of its standard deviations apart is no chance.
    let n = |m: &BTreeMap<String, u64>| {
        (m.get("hot").copied().unwrap_or(0) + m.get("warm").copied().unwrap_or(0)).max(1) as f64
    };
    for k in ["hot", "warm"] {
        let (a, b) = (share(&ours, k), share(&spy_leaves, k));
        let p = (a + b) / 2.0;
        let sd = (p * (1.0 - p) * (1.0 / n(&ours) + 1.0 / n(&spy_leaves))).sqrt();
        assert!(
            (a - b).abs() <= 4.0 * sd + 0.01,
            "{k}: rtrace {a:.3}, py-spy {b:.3} (4 sd: {:.3})\nrtrace {ours:?}\npy-spy {spy_leaves:?}",
            4.0 * sd
        );
    }
}

#[test]
fn annotated_python_frames_are_marked_p() {
    if skip_in_guest() {
        return;
    }
    let (folded, _, _) = profile(Python::Host, "split", "1", &["-a"]);
    assert!(
        with_frame(&folded, "pyfix.hot_[p]") > 0,
        "{}",
        show(&folded)
    );
    let (code, _, stderr) = run(&["profile", "--no-python", "--bogus"]);
    assert_eq!(code, 2, "{stderr}");
}

/// Debian's python3 has no frame pointers: its samples reach
/// `Py_BytesMain` (and `_start` above it) only through CFI.
#[test]
fn python_without_frame_pointers_reaches_its_main() {
    let python = "/usr/bin/python3";
    if !std::path::Path::new(python).exists() {
        // The VM guests carry no Python; the host runs this test.
        eprintln!("skipped: no {python} here (the host runs this test)");
        return;
    }
    let mut busy = Command::new(python)
        .args(["-c", "while True: pass"])
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let pid = busy.id().to_string();
    let (code, stdout, stderr) = run(&["profile", "-F", "199", "-U", "-p", &pid, "-f", "2"]);
    let _ = busy.kill();
    let _ = busy.wait();
    assert_eq!(code, 0, "{stderr}");
    let folded = parse_folded(&stdout);
    let total: u64 = folded.values().sum();
    let whole = count_with(&folded, "Py_BytesMain");
    assert!(total >= 200, "too few samples ({total}):\n{stdout}");
    assert!(
        whole as f64 >= 0.95 * total as f64,
        "{whole} of {total} samples reach Py_BytesMain:\n{stdout}"
    );
}

/// Three asyncio tasks (alpha, beta, gamma) under sid's 3.14, each
/// awaiting `crunch` in slices of 1, 2 and 4 units and yielding between
/// them, asyncio imported only once the work starts: each task's frame
/// sits right above its coroutine (`[task: alpha];pyfix.worker`) and on
/// no other sample (but for those taken before rtrace met `_asyncio`, at
/// most 2 %), and each task's share of the tasks' samples is within
/// 4 sd of the CPU time the fixture measured in its slices. With
/// `--no-asyncio-tasks` no task frame is shown.
#[test]
fn asyncio_tasks_are_named_above_their_coroutines_under_314() {
    if skip_in_guest() {
        return;
    }
    let names = ["alpha", "beta", "gamma"];
    let (folded, stderr, done) = profile(Python::Chroot(Root::Sid), "asyncio", "3", &[]);
    let mut by_task = [0u64; 3];
    // Samples taken before rtrace met `_asyncio`'s code (loaded as the
    // work starts) and told the kernel where tasks are: most of their
    // walks stop in that code, unknown to them yet; none has a task frame.
    let mut before = 0;
    for (stack, &n) in &folded {
        let at = |name: &str| stack.iter().position(|f| f == name);
        let task = stack.iter().position(|f| f.starts_with("[task"));
        if task.is_none() && at("pyfix.worker").is_some() {
            before += n;
            continue;
        }
        match at("pyfix.worker") {
            Some(w) => {
                let t = task.unwrap();
                assert_eq!(
                    t + 1,
                    w,
                    "the task frame is not above worker: {}",
                    stack.join(";")
                );
                let i = names
                    .iter()
                    .position(|name| stack[t] == format!("[task: {name}]"))
                    .unwrap_or_else(|| panic!("task named wrong: {}", stack.join(";")));
                by_task[i] += n;
                // Only the one task, and the coroutine chain under it.
                assert_eq!(
                    stack.iter().filter(|f| f.starts_with("[task")).count(),
                    1,
                    "{}",
                    stack.join(";")
                );
            }
            // Outside the tasks' coroutines: the loop, or asyncio.run's
            // own task (`Task-1`, unnamed) waiting on them.
            None => assert!(
                task.is_none_or(|t| stack[t] == "[task: Task-1]"),
                "a task frame on a sample out of the tasks: {}",
                stack.join(";")
            ),
        }
    }
    let total: u64 = by_task.iter().sum();
    assert!(
        total >= 1000,
        "{total} samples in tasks:\n{}\n{stderr}",
        show(&folded)
    );
    assert!(
        before * 50 <= total,
        "{before} samples in worker without a task frame, {total} with:\n{}",
        show(&folded)
    );
    let measured: i64 = done.iter().sum();
    for (i, name) in names.iter().enumerate() {
        let want = done[i] as f64 / measured as f64;
        rtrace_integration_tests::pidreuse::assert_share_within(
            name,
            by_task[i],
            total - by_task[i],
            want,
            4.0,
        );
    }
    let (folded, _, _) = profile(
        Python::Chroot(Root::Sid),
        "asyncio",
        "1",
        &["--no-asyncio-tasks"],
    );
    assert!(with_frame(&folded, "pyfix.worker") > 0, "{}", show(&folded));
    assert!(
        !folded.keys().flatten().any(|f| f.starts_with("[task")),
        "{}",
        show(&folded)
    );
}

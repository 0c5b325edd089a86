//! `rtrace offcputime` against the C fixture's `block` mode, which blocks
//! for a known split of time in two functions, through libc's nanosleep
//! and read wrappers, built without frame pointers; and its `wake` mode,
//! where one thread wakes another through a pipe.

use std::collections::BTreeMap;

use rtrace_integration_tests::{
    Rtrace, SIGINT, Workload, assert_one_line_error, json_lines, parse_folded, run,
};

/// What `rtrace offcputime` prints to stderr once tracing has begun.
const READY: &str = "Tracing off-CPU time";

/// The fixture's two blocking functions, and its callers above them.
const LEAVES: [&str; 2] = ["sleep_alpha", "wait_beta"];
const CALLERS: [&str; 2] = ["main", "mid_block"];

/// Runs the fixture in `mode` (`block` with seconds, and optionally the
/// length of a long block in microseconds; `wake` with seconds) under
/// `rtrace offcputime`
/// with `extra` arguments, and `by` (`-p` or `-t`, or nothing for the
/// whole system) followed by the fixture's pid; returns rtrace's stdout,
/// the numbers of the fixture's `done` line (nanoseconds in each
/// function, then in its long blocks), and its pid.
fn trace_blocking(
    fixture: &str,
    mode: &[&str],
    by: &str,
    extra: &[&str],
) -> (String, Vec<i64>, u32) {
    let mode: Vec<String> = mode.iter().map(|&a| a.to_owned()).collect();
    let (mut w, line) = Workload::start(fixture, &mode);
    assert!(line.starts_with("ready"), "{line}");
    let pid = w.pid().to_string();
    let mut args = vec!["offcputime"];
    if !by.is_empty() {
        args.extend([by, pid.as_str()]);
    }
    args.extend_from_slice(extra);
    let rtrace = Rtrace::start_until(&args, READY);
    let done = w.go();
    assert!(w.wait().success());
    let (code, stdout, stderr) = rtrace.stop(SIGINT);
    assert_eq!(code, 0, "{stderr}");
    let n: Vec<i64> = done
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    (stdout, n, w.pid())
}

/// Microseconds of the stacks holding `leaf`, and of those that also hold
/// `callers` right above it and a frame ending in `wrapper` below it.
fn leaf_time(folded: &BTreeMap<Vec<String>, u64>, leaf: &str, wrapper: &str) -> (u64, u64) {
    let (mut all, mut whole) = (0, 0);
    for (frames, us) in folded {
        let Some(i) = frames.iter().position(|f| f == leaf) else {
            continue;
        };
        all += us;
        let chained = i >= CALLERS.len() && frames[i - CALLERS.len()..i] == CALLERS;
        if chained && frames[i + 1..].iter().any(|f| f.ends_with(wrapper)) {
            whole += us;
        }
    }
    (all, whole)
}

/// The fixture's blocked time, split between its two functions as it
/// measured, with every stack whole from `main` through libc's wrapper
/// (no frame pointers anywhere: the CFI walk). The total is held between
/// what the fixture's sleeps must have taken (3 ms each at least) and the
/// wall time of its calls, and to at most a tenth above what its clocks
/// measured off the CPU (wall less the thread's CPU time). That measure
/// is not held as a floor: in an emulated guest offcputime once saw 12 %
/// less than it, where the thread's CPU clock is coarse and misses some
/// of the work around each wait, which makes the measure high, not low.
#[test]
fn blocked_time_splits_as_measured_through_libc_wrappers() {
    let (stdout, done, _) = trace_blocking("cfuncs_nofp", &["block", "2"], "-p", &["-f"]);
    let (alpha_ns, beta_ns) = (done[0], done[1]);
    let (alpha_wall, beta_wall, sleeps) = (done[4] / 1000, done[5] / 1000, done[6]);
    let folded = parse_folded(&stdout);
    let (alpha, alpha_whole) = leaf_time(&folded, LEAVES[0], "nanosleep");
    let (beta, beta_whole) = leaf_time(&folded, LEAVES[1], "read");
    let measured = (alpha_ns + beta_ns) as f64 / 1000.0;
    let seen = (alpha + beta) as f64;
    assert!(
        seen <= 1.1 * measured,
        "{seen} us off CPU in the two functions; the fixture blocked {measured} us:\n{stdout}"
    );
    // A microsecond a call for the two clocks' rounding.
    let slack = |n: i64| n as f64 * 1.0;
    assert!(
        alpha as f64 >= (sleeps * 3000) as f64 - slack(sleeps)
            && alpha as f64 <= alpha_wall as f64 + slack(sleeps),
        "{alpha} us off CPU in sleep_alpha: {sleeps} sleeps of 3 ms took {alpha_wall} us:\n{stdout}"
    );
    assert!(
        beta as f64 <= beta_wall as f64 + slack(sleeps),
        "{beta} us off CPU in wait_beta: its {sleeps} calls took {beta_wall} us:\n{stdout}"
    );
    let share = alpha as f64 / seen;
    let expected = alpha_ns as f64 / (alpha_ns + beta_ns) as f64;
    assert!(
        (share - expected).abs() <= 0.05,
        "sleep_alpha has {share:.3} of the blocked time; the fixture measured {expected:.3}"
    );
    assert!(
        alpha_whole as f64 >= 0.95 * alpha as f64 && beta_whole as f64 >= 0.95 * beta as f64,
        "whole chains: sleep_alpha {alpha_whole} of {alpha} us, wait_beta {beta_whole} of \
         {beta} us:\n{stdout}"
    );
    // Kernel frames come after the user ones, walked from where the
    // thread stopped: the kernel's nanosleep, without the scheduler's
    // frames (`--sched-frames` keeps them: see the multiline test).
    let kernel = |f: &Vec<String>| -> Vec<String> {
        let entry = f.iter().position(|n| n.starts_with("entry_SYSCALL"));
        f[entry.unwrap_or(f.len())..].to_vec()
    };
    let in_nanosleep: u64 = folded
        .iter()
        .filter(|(f, _)| f.iter().any(|n| n == LEAVES[0]))
        .filter(|(f, _)| kernel(f).iter().any(|n| n.contains("nanosleep")))
        .map(|(_, us)| us)
        .sum();
    assert!(
        in_nanosleep as f64 >= 0.95 * alpha as f64,
        "{in_nanosleep} of {alpha} us through the kernel's nanosleep:\n{stdout}"
    );
    assert!(
        !folded.keys().any(|f| kernel(f)
            .iter()
            .any(|n| n == "schedule" || n == "__schedule")),
        "scheduler frames without --sched-frames:\n{stdout}"
    );
}

/// `-m` and `-M` bound the blocks counted: the 3 ms sleeps only above
/// 2 ms, the 1 ms waits only below it. Above 2 ms, the waits count only as
/// much as the fixture measured of its waits that took 2 ms or more: none
/// on a quick machine, some in an emulated guest. A wait's time off the
/// CPU is within its call's wall time, so it can be no more.
#[test]
fn block_time_bounds_select_the_blocks() {
    let (stdout, done, _) = trace_blocking(
        "cfuncs",
        &["block", "1", "2000"],
        "-p",
        &["-f", "-U", "-m", "2000"],
    );
    let folded = parse_folded(&stdout);
    assert!(leaf_time(&folded, LEAVES[0], "").0 > 0, "{stdout}");
    let long_waits_us = done[3] as u64 / 1000;
    let waits = leaf_time(&folded, LEAVES[1], "").0;
    assert!(
        waits <= long_waits_us,
        "{waits} us of waits counted above 2 ms; the fixture's waits of 2 ms or more took \
         {long_waits_us} us:\n{stdout}"
    );
    // Sleeps only (`--state S`): a thread preempted on its way out of a
    // sleep is off the CPU for a moment under the sleep's stack, runnable,
    // which `-M` rightly admits; on a busy machine (tests run side by
    // side) that happens. So can a sleep of under 2 ms off the CPU: its
    // 3 ms count from when nanosleep armed the timer, and an emulated
    // guest whose CPU the host takes away in between switches out later.
    // Those are rare; without `-M`, all of the sleeps' time would count.
    let (stdout, done, _) = trace_blocking(
        "cfuncs",
        &["block", "1"],
        "-p",
        &["-f", "-U", "-M", "2000", "--state", "S"],
    );
    let folded = parse_folded(&stdout);
    let sleeps_us = done[0] as u64 / 1000;
    let short_sleeps = leaf_time(&folded, LEAVES[0], "").0;
    assert!(
        short_sleeps * 10 <= sleeps_us,
        "{short_sleeps} us of 3 ms sleeps counted below 2 ms, of {sleeps_us} us asleep:\n{stdout}"
    );
    assert!(leaf_time(&folded, LEAVES[1], "").0 > 0, "{stdout}");
}

/// `--state D` admits only uninterruptible waits, and the fixture's are
/// interruptible (`S`), which `--state S` admits.
#[test]
fn state_filter_selects_interruptible_sleeps() {
    let (stdout, ..) = trace_blocking("cfuncs", &["block", "1"], "-p", &["-f", "--state", "D"]);
    assert!(
        !stdout.contains(LEAVES[0]) && !stdout.contains(LEAVES[1]),
        "{stdout}"
    );
    let (stdout, ..) = trace_blocking("cfuncs", &["block", "1"], "-p", &["-f", "--state", "S"]);
    assert!(
        stdout.contains(LEAVES[0]) && stdout.contains(LEAVES[1]),
        "{stdout}"
    );
}

/// A thread that stops again with the same registers over the same stack
/// has its walk remembered; here the two stops differ in one return
/// address only (twin_a or twin_b, alike in frame), twice through each by
/// turns, and each twin gets its own time: the remembered walk is not
/// taken for the other's. The build with frame pointers keeps rbp the
/// same at each stop too, so walks are remembered (without, rbp holds
/// whatever the loop keeps in it).
#[test]
fn remembered_walks_tell_apart_stacks_that_differ_in_one_word() {
    let (stdout, done, _) = trace_blocking("cfuncs", &["twins", "2"], "-p", &["-f"]);
    let folded = parse_folded(&stdout);
    let under = |twin: &str| -> u64 {
        folded
            .iter()
            .filter(|(f, _)| {
                let at = |name: &str| f.iter().position(|n| n == name);
                matches!(
                    (at("mid_twins"), at(twin), at("sleep_alpha")),
                    (Some(m), Some(t), Some(s)) if m + 1 == t && t + 1 == s
                )
            })
            .map(|(_, us)| us)
            .sum()
    };
    let (a, b) = (under("twin_a"), under("twin_b"));
    for (name, seen, measured) in [("twin_a", a, done[0]), ("twin_b", b, done[1])] {
        let measured = measured as f64 / 1000.0;
        assert!(
            (seen as f64 - measured).abs() <= 0.1 * measured,
            "{name}: {seen} us off CPU; the fixture slept {measured} us there:\n{stdout}"
        );
    }
}

/// System-wide with `-k`, only kernel threads: no user stacks, and not the
/// fixture; with `-t`, only the thread asked for.
#[test]
fn thread_filters_keep_to_their_threads() {
    let (stdout, _, pid) = trace_blocking("cfuncs", &["block", "1"], "", &["--json", "-k"]);
    let stacks = json_lines(&stdout);
    assert!(!stacks.is_empty(), "no kernel thread blocked: {stdout}");
    for s in &stacks {
        assert_ne!(s["pid"], pid, "{s}");
        assert_eq!(s["user"].as_array().map(Vec::len), Some(0), "{s}");
        assert!(s["us"].as_u64().is_some_and(|n| n > 0), "{s}");
    }
    let (stdout, _, pid) = trace_blocking("cfuncs", &["block", "1"], "-t", &["-f"]);
    let folded = parse_folded(&stdout);
    assert!(!folded.is_empty());
    assert!(folded.keys().all(|f| f[0] == "cfuncs"), "{stdout} ({pid})");
}

/// bcc's layout: frames leaf first, kernel then user (with `-d` a `--`
/// between), `-  comm (pid)`, then the microseconds; with
/// `--sched-frames`, the scheduler at the kernel leaf, as bcc shows it.
#[test]
fn multiline_output_has_bcc_layout() {
    let (stdout, _, pid) =
        trace_blocking("cfuncs", &["block", "1"], "-p", &["-d", "--sched-frames"]);
    let mut blocks = 0;
    for block in stdout.split("\n\n").filter(|b| b.contains(LEAVES[0])) {
        let lines: Vec<&str> = block.lines().collect();
        let n = lines.len();
        assert_eq!(
            lines[n - 2].trim(),
            format!("-                cfuncs ({pid})")
        );
        assert!(lines[n - 1].trim().parse::<u64>().is_ok(), "{block}");
        let delim = lines.iter().position(|l| l.trim() == "--").expect(block);
        let leaf = lines.iter().position(|l| l.trim() == LEAVES[0]).unwrap();
        let caller = lines.iter().position(|l| l.trim() == "mid_block").unwrap();
        assert!(delim < leaf && leaf < caller, "{block}");
        assert!(lines[0].contains("schedule"), "{block}");
        blocks += 1;
    }
    assert!(blocks > 0, "{stdout}");
}

/// The waiter's time in wait_for_poke in folded `--waker` output, and
/// how much of it is joined to the stack of the main thread that wrote
/// to the pipe, whole from `main` through libc's `write`.
fn waited_and_woken_by_poker(folded: &BTreeMap<Vec<String>, u64>) -> (u64, u64) {
    let (mut blocked, mut by_poker) = (0, 0);
    for (frames, us) in folded {
        // The blocked thread's frames come before `--`; the waker's after
        // it may be the waiter too, interrupted by the timer that woke
        // the main thread.
        let join = frames
            .iter()
            .position(|f| f == "--")
            .unwrap_or(frames.len());
        let Some(leaf) = frames[..join].iter().position(|f| f == "wait_for_poke") else {
            continue;
        };
        assert_eq!(frames[0], "waiter", "{frames:?}");
        blocked += us;
        if join == frames.len() {
            continue;
        }
        // The waker's frames, leaf first: the wakeup in the kernel, then
        // libc's write, write_poke, its callers, and its command.
        let waker = &frames[join + 1..];
        let at = |name: &str| waker.iter().position(|f| f == name);
        if let (Some(w), Some(poke), Some(lp), Some(main)) = (
            waker.iter().position(|f| f.ends_with("write")),
            at("write_poke"),
            at("poke_loop"),
            at("main"),
        ) && leaf < join
            && w < poke
            && poke < lp
            && lp < main
            && waker.last().is_some_and(|c| c == "cfuncs_nofp")
        {
            by_poker += us;
        }
    }
    (blocked, by_poker)
}

/// `--waker`: the waiter thread's time off the CPU in wait_for_poke is
/// what it measured, and its sleeps there are joined to the stack of the
/// main thread that wrote to the pipe, whole from `main` through libc's
/// `write` (no frame pointers: the CFI walk), in folded lines (`--` then
/// the waker's frames leaf first, then its command) and in bcc's
/// offwaketime layout.
///
/// Sleeps only (`--state S`) for the waker: a thread preempted in the
/// kernel (at a `cond_resched` in pipe_read, say) is off the CPU runnable,
/// woken by nobody, and a starved emulated guest does that to the waiter
/// for a tenth of its time.
#[test]
fn waker_names_the_waking_threads_stack() {
    let (stdout, done, _) = trace_blocking("cfuncs_nofp", &["wake", "2"], "-p", &["-f", "--waker"]);
    let waited = done[1] as f64 / 1000.0;
    let (blocked, _) = waited_and_woken_by_poker(&parse_folded(&stdout));
    assert!(
        (blocked as f64 - waited).abs() <= 0.1 * waited,
        "{blocked} us blocked in wait_for_poke; the waiter measured {waited} us:\n{stdout}"
    );

    let (stdout, ..) = trace_blocking(
        "cfuncs_nofp",
        &["wake", "1"],
        "-p",
        &["-f", "--waker", "--state", "S"],
    );
    let (asleep, by_poker) = waited_and_woken_by_poker(&parse_folded(&stdout));
    assert!(asleep > 0, "{stdout}");
    assert!(
        by_poker as f64 >= 0.95 * asleep as f64,
        "{by_poker} of {asleep} us asleep woken by write_poke's whole stack:\n{stdout}"
    );

    let (stdout, _, pid) = trace_blocking("cfuncs_nofp", &["wake", "1"], "-p", &["--waker"]);
    let block = stdout
        .split("\n\n")
        .find(|b| b.contains("wait_for_poke") && b.contains("write_poke"))
        .unwrap_or_else(|| panic!("no woken stack:\n{stdout}"));
    let lines: Vec<&str> = block.lines().map(str::trim).collect();
    let n = lines.len();
    assert_eq!(
        lines[0],
        format!("waker:           cfuncs_nofp {pid}"),
        "{block}"
    );
    assert_eq!(
        lines[n - 2],
        format!("target:          waiter {pid}"),
        "{block}"
    );
    let at = |name: &str| lines.iter().position(|l| *l == name).expect(block);
    // The waker root first down to the join, the target leaf first after.
    assert!(
        at("main") < at("poke_loop")
            && at("poke_loop") < at("write_poke")
            && at("write_poke") < at("--               --")
            && at("--               --") < at("wait_for_poke"),
        "{block}"
    );
}

#[test]
fn bad_input_is_one_clear_line() {
    assert_one_line_error(
        &["offcputime", "-m", "100", "-M", "50"],
        "-m 100 is above -M 50",
    );
    // A value clap refuses: its usage error, exit 2.
    let (code, _, stderr) = run(&["offcputime", "--state", "X"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr
            .lines()
            .next()
            .is_some_and(|l| l.contains("unknown state 'X' at column 1")),
        "{stderr}"
    );
    assert_one_line_error(
        &["offcputime", "-p", "999999999"],
        "no such process: 999999999",
    );
}

/// `--report`: perf report's table of off-CPU time. The fixture's two
/// blocking functions' rows (children: every stack through them) hold
/// their blocked time within the bounds the fixture's own clocks give,
/// in the split it measured, and their self time is nil: they block in
/// libc and the kernel below them.
#[test]
fn the_report_splits_blocked_time_as_measured() {
    let (stdout, done, _) = trace_blocking(
        "cfuncs_nofp",
        &["block", "2"],
        "-p",
        &["--report", "--json", "--sort", "sym"],
    );
    let (alpha_ns, beta_ns) = (done[0], done[1]);
    let (alpha_wall, sleeps) = (done[4] / 1000, done[6]);
    let rows = json_lines(&stdout);
    let row = |name: &str| -> (u64, u64) {
        let r = rows
            .iter()
            .find(|r| r["sym"] == name)
            .unwrap_or_else(|| panic!("no row for {name}:\n{stdout}"));
        (
            r["children_samples"].as_u64().unwrap(),
            r["self_samples"].as_u64().unwrap(),
        )
    };
    let (alpha, alpha_self) = row(LEAVES[0]);
    let (beta, beta_self) = row(LEAVES[1]);
    assert_eq!((alpha_self, beta_self), (0, 0), "{stdout}");
    let slack = sleeps as f64;
    assert!(
        alpha as f64 >= (sleeps * 3000) as f64 - slack && alpha as f64 <= alpha_wall as f64 + slack,
        "{alpha} us under sleep_alpha: {sleeps} sleeps of 3 ms took {alpha_wall} us:\n{stdout}"
    );
    let share = alpha as f64 / (alpha + beta) as f64;
    let expected = alpha_ns as f64 / (alpha_ns + beta_ns) as f64;
    assert!(
        (share - expected).abs() <= 0.05,
        "sleep_alpha has {share:.3} of the blocked time; the fixture measured {expected:.3}"
    );
}

/// The stack tools' shared outputs, which offcputime takes since it has
/// the `StackOutputs` group: `--speedscope` holds the microseconds the
/// folded text holds, and `--heatmap` spreads that same time over the
/// 20 ms slots the waits ended in, no cell before tracing began; both
/// beside the text, as profile's files are.
#[test]
fn speedscope_and_heat_map_hold_the_folded_blocked_time() {
    let dir = std::env::temp_dir().join(format!("rtrace-offcpu-files-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (ss, heat) = (dir.join("off.speedscope.json"), dir.join("off.svg"));
    let (ss_arg, heat_arg) = (ss.to_str().unwrap(), heat.to_str().unwrap());
    let (stdout, done, _) = trace_blocking(
        "cfuncs_nofp",
        &["block", "2"],
        "-p",
        &["-f", "--speedscope", ss_arg, "--heatmap", heat_arg],
    );
    let folded: u64 = parse_folded(&stdout).values().sum();
    let measured_us = ((done[0] + done[1]) / 1000) as u64;
    assert!(
        folded as f64 >= 0.5 * measured_us as f64,
        "{folded} us folded of the {measured_us} us the fixture blocked:\n{stdout}"
    );
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&ss).unwrap()).unwrap();
    let weights: u64 = doc["profiles"][0]["weights"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_u64().unwrap())
        .sum();
    assert_eq!(weights, folded, "speedscope against the folded text");
    let svg = std::fs::read_to_string(&heat).unwrap();
    let cells: Vec<u64> = svg
        .split("data-samples=\"")
        .skip(1)
        .map(|rest| rest.split('"').next().unwrap().parse().unwrap())
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!cells.is_empty(), "no cells:\n{svg}");
    assert_eq!(
        cells.iter().sum::<u64>(),
        folded,
        "heat map against the folded text"
    );
}

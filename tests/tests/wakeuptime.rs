//! `rtrace wakeuptime` against the C fixture's `wake` mode: the main
//! thread (main -> poke_loop -> write_poke, libc's write) pokes a thread
//! named `waiter` through a pipe every 2 ms, and the waiter measures the
//! time it spends off the CPU in wait_for_poke (libc's read). Built
//! without frame pointers, so the wakers' user stacks come from the CFI
//! walk.

use std::collections::BTreeMap;

use rtrace_integration_tests::{Rtrace, SIGINT, Workload, assert_one_line_error, parse_folded};

/// What `rtrace wakeuptime` prints to stderr once tracing has begun.
const READY: &str = "Tracing blocked time";

/// The fixture's poking chain, root first, down to libc's write.
const POKER: [&str; 3] = ["main", "poke_loop", "write_poke"];

/// Runs the fixture's `wake` mode for `secs` under `rtrace wakeuptime -p
/// PID` with `extra` arguments; returns rtrace's stdout, the fixture's
/// measured nanoseconds off the CPU in wait_for_poke, and its pid.
fn trace_wakeups(secs: &str, extra: &[&str]) -> (String, f64, u32) {
    let (mut w, line) = Workload::start("cfuncs_nofp", &["wake".to_owned(), secs.to_owned()]);
    assert!(line.starts_with("ready"), "{line}");
    let pid = w.pid().to_string();
    let mut args = vec!["wakeuptime", "-p", pid.as_str()];
    args.extend_from_slice(extra);
    let rtrace = Rtrace::start_until(&args, READY);
    let done = w.go();
    assert!(w.wait().success());
    let (code, stdout, stderr) = rtrace.stop(SIGINT);
    assert_eq!(code, 0, "{stderr}");
    let waited: f64 = done.split_whitespace().nth(1).unwrap().parse().unwrap();
    (stdout, waited, w.pid())
}

/// Microseconds the waiter was blocked, in folded lines (`waker;frames
/// root first;target us`), and how much of it the main thread's whole
/// poking stack ended: its command, main -> poke_loop -> write_poke ->
/// libc's write, then the pipe's wakeup in the kernel.
fn waiter_blocked(folded: &BTreeMap<Vec<String>, u64>, fixture: &str) -> (u64, u64) {
    let (mut all, mut by_poker) = (0, 0);
    for (frames, us) in folded {
        if frames.last().is_none_or(|t| t != "waiter") {
            continue;
        }
        all += us;
        let at = |name: &str| frames.iter().position(|f| f == name);
        let chain: Option<Vec<usize>> = POKER.iter().map(|f| at(f)).collect();
        let Some(chain) = chain else { continue };
        let write = frames.iter().position(|f| f.ends_with("write"));
        let wakeup = frames.iter().rposition(|f| f.contains("wake"));
        if frames[0] == fixture
            && chain.windows(2).all(|w| w[0] < w[1])
            && write.is_some_and(|w| chain[2] < w)
            && wakeup.is_some_and(|k| write.is_some_and(|w| w < k))
        {
            by_poker += us;
        }
    }
    (all, by_poker)
}

/// The waiter's blocked time is what it measured, and its waker is the
/// main thread's whole poking stack, in folded lines. The time is held
/// to at most a tenth above the fixture's measure (its wall time less its
/// CPU time around each read), and to at least three quarters of it: the
/// fixture's measure also holds the moments the waiter was preempted on
/// its way into or out of the read, which nobody wakes and wakeuptime
/// does not count (a starved emulated guest does that to the waiter for
/// a tenth of its time).
#[test]
fn the_waker_stack_holds_the_blocked_time_the_fixture_measured() {
    let (stdout, waited_ns, _) = trace_wakeups("2", &["-f"]);
    let waited = waited_ns / 1000.0;
    let (blocked, by_poker) = waiter_blocked(&parse_folded(&stdout), "cfuncs_nofp");
    assert!(
        blocked as f64 <= 1.1 * waited && blocked as f64 >= 0.75 * waited,
        "{blocked} us blocked woken; the waiter measured {waited} us:\n{stdout}"
    );
    assert!(
        by_poker as f64 >= 0.95 * blocked as f64,
        "{by_poker} of {blocked} us woken by write_poke's whole stack:\n{stdout}"
    );
}

/// bcc's layout: `target:` and the woken thread, the waker's frames
/// leaf first (kernel then user), `waker:` and the waker, then the
/// microseconds; `-u` keeps the waiter, a user thread.
#[test]
fn multiline_output_has_bcc_layout() {
    let (stdout, _, pid) = trace_wakeups("1", &["-u"]);
    let block = stdout
        .split("\n\n")
        .find(|b| b.contains("target:          waiter") && b.contains("write_poke"))
        .unwrap_or_else(|| panic!("no wakeup of the waiter by write_poke:\n{stdout}"));
    let lines: Vec<&str> = block.lines().map(str::trim).collect();
    let n = lines.len();
    assert_eq!(
        lines[0],
        format!("target:          waiter {pid}"),
        "{block}"
    );
    assert_eq!(
        lines[n - 2],
        format!("waker:           cfuncs_nofp {pid}"),
        "{block}"
    );
    assert!(
        lines[n - 1].parse::<u64>().is_ok_and(|us| us > 0),
        "{block}"
    );
    let at = |name: &str| lines.iter().position(|l| *l == name).expect(block);
    let wakeup = lines.iter().position(|l| l.contains("wake")).expect(block);
    assert!(
        wakeup < at("write_poke")
            && at("write_poke") < at("poke_loop")
            && at("poke_loop") < at("main"),
        "{block}"
    );
}

#[test]
fn bad_input_is_one_clear_line() {
    assert_one_line_error(
        &["wakeuptime", "-p", "999999999"],
        "no such process: 999999999",
    );
    assert_one_line_error(
        &["wakeuptime", "-m", "100", "-M", "50"],
        "-m 100 is above -M 50",
    );
}

//! offcputime against libbpf-tools' on `perf bench sched pipe`: a context
//! switch per message.

use std::{process::Command, time::Duration};

use anyhow::{Context as _, bail};

use super::{Ready, Row, Setup, TRIALS, libbpf_tool, median, print_costs, trials};

/// Round trips of `perf bench sched pipe` in one trial: two context
/// switches each.
const PIPE_LOOPS: u64 = 200_000;

/// Plays `perf bench sched pipe` pinned to CPU 0, so that every message is
/// a context switch; returns nanoseconds per switch, and the switches.
fn sched_pipe() -> anyhow::Result<(f64, u64)> {
    let out = Command::new("taskset")
        .args(["-c", "0", "perf", "bench", "sched", "pipe", "-l"])
        .arg(PIPE_LOOPS.to_string())
        .output()
        .context("cannot run perf bench sched pipe (Debian package linux-perf)")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let usecs: f64 = text
        .lines()
        .find_map(|l| l.trim().strip_suffix("usecs/op")?.trim().parse().ok())
        .with_context(|| format!("perf bench sched pipe said {text:?}"))?;
    let switches = PIPE_LOOPS * 2;
    Ok((usecs * 1000.0 / 2.0, switches))
}

/// offcputime against libbpf-tools' on context switches: the stacks of
/// every switch are taken and timed, so the cost per switch is the whole
/// story. rtrace walks user stacks by CFI (through code without frame
/// pointers); libbpf-tools' by frame pointer only.
pub fn run() -> anyhow::Result<Row> {
    let rtrace = crate::build()?;
    // libbpf-tools' offcputime prints nothing until it ends.
    let ready = Ready::After(Duration::from_secs(2));
    let peer = libbpf_tool("offcputime")?;
    let peer = peer.to_str().context("non-UTF-8 tool path")?;
    let mut setups = vec![
        Setup::bare(),
        Setup::traced(
            "libbpf-tools offcputime",
            "stdbuf",
            &["-oL", peer],
            ready,
            None,
        ),
    ];
    // The default comes first: the target is judged on it. Each names
    // the walk it must have used (`-v`): a program the verifier refuses
    // falls back to another, which would measure the wrong thing.
    let variants: [(&str, &[&str], &str); 4] = [
        ("default: CFI walk", &[], "from CFI"),
        ("--unwind fp", &["--unwind", "fp"], "by frame pointers"),
        (
            "--sched-frames",
            &["--sched-frames"],
            "as the thread leaves",
        ),
        ("--waker", &["--waker"], "from CFI"),
    ];
    for (what, args, _) in variants {
        let mut all = vec!["offcputime", "-v"];
        all.extend_from_slice(args);
        setups.push(Setup::traced(
            format!("rtrace offcputime ({what})"),
            &rtrace,
            &all,
            Ready::Stderr("Tracing"),
            None,
        ));
    }
    eprintln!(
        "bench offcputime: perf bench sched pipe pinned to CPU 0, {PIPE_LOOPS} round trips          ({} context switches), median of {TRIALS} interleaved trials",
        PIPE_LOOPS * 2
    );
    let results = trials(&setups, "ns/switch", sched_pipe)?;
    for ((s, r), (_, _, walk)) in setups.iter().zip(&results).skip(2).zip(variants) {
        for stop in &r.stops {
            let attached = stop.stderr.lines().find(|l| l.contains("attached with"));
            if !attached.is_some_and(|l| l.contains(walk)) {
                bail!(
                    "{}: not what was to be measured ({walk}): {attached:?}",
                    s.label
                );
            }
        }
    }
    let (ratio, bpf_ratio) = print_costs(&setups, &results, "ns/switch");
    println!();
    let met = |r: f64, goal: f64| if r <= goal { "met" } else { "NOT met" };
    println!(
        "target: rtrace (default) adds no more than libbpf-tools per switch: {ratio:.2}x, {}; \
         the aim, half: {}",
        met(ratio, 1.0),
        met(ratio, 0.5)
    );
    println!(
        "its BPF programs run {bpf_ratio:.2}x as long per switch as libbpf-tools' ({})",
        met(bpf_ratio, 1.0)
    );
    for (s, r) in setups.iter().zip(&results).skip(1) {
        let report = median(
            r.stops
                .iter()
                .map(|t| t.report.as_secs_f64() * 1e3)
                .collect(),
        );
        println!("{:<44} report after Ctrl-C: {report:.0} ms", s.label);
    }
    Ok(Row::new(
        "offcputime",
        format!(
            "perf bench sched pipe on one CPU, {} switches",
            PIPE_LOOPS * 2
        ),
        "ns/switch",
        (&setups, &results),
        (2, 1),
        None,
    ))
}

//! `cargo xtask bench command`: what command mode (`rtrace TOOL -- CMD`)
//! costs the command at either end, against `perf record -- CMD` in the
//! same run. At the start, the cork: from launching the tracer to the
//! command's first instruction, while the command waits for the tracer to
//! attach. At the end: from the command's last instruction to the
//! tracer's exit, its report written.
//!
//! The command is this xtask binary, copied: a constructor (below) makes
//! it read the monotonic clock first thing, spin, read it again and exit
//! when [`WORKLOAD_ENV`] is set. The launcher reads the same clock just
//! before it spawns the tracer and just after `waitpid` returns, so both
//! intervals are differences of one clock across processes.

use std::{
    ffi::{CStr, OsStr, OsString},
    fs::File,
    os::unix::ffi::OsStrExt as _,
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use super::{measured_on, median, spread};

/// Rounds of every setup, interleaved, the order rotated each round.
const ROUNDS: usize = 9;
/// How long the command runs: long enough for profile to have about a
/// hundred samples to report at 99 Hz, which keeps the report small.
const SPIN_MS: u64 = 1_000;
/// Set in the command's environment (through the tracer, which passes it
/// on): spin this many milliseconds.
const WORKLOAD_ENV: &CStr = c"RTRACE_BENCH_COMMAND_SPIN_MS";

/// Makes an xtask process started with [`WORKLOAD_ENV`] the benchmark's
/// command. It runs from `.init_array`, before `main`, because main parses
/// its arguments and checks the toolchain (rustup and dpkg queries) before
/// any subcommand could run: that would sit between the exec and the first
/// reading of the clock, and in every setup's figure.
#[used]
#[unsafe(link_section = ".init_array")]
static WORKLOAD: extern "C" fn() = workload;

/// The command: prints the monotonic clock at its start and at its end,
/// `SPIN_MS` apart, on one line, and exits; returns at once, to go on to
/// `main`, in any process without [`WORKLOAD_ENV`].
extern "C" fn workload() {
    let first = monotonic_ns();
    // SAFETY: before main no thread can be changing the environment.
    let spin = unsafe { libc::getenv(WORKLOAD_ENV.as_ptr()) };
    if spin.is_null() {
        return;
    }
    // SAFETY: getenv returned a NUL-terminated string that outlives this.
    let ms: u64 = unsafe { CStr::from_ptr(spin) }
        .to_str()
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    // Busy, not asleep: profile and perf are to have samples to report.
    let until = first + ms * 1_000_000;
    while monotonic_ns() < until {}
    let last = monotonic_ns();
    let line = format!("{first} {last}\n");
    // SAFETY: `line` is ours; `_exit` skips exit handlers, none of which
    // this process, outside main, has a use for.
    unsafe {
        libc::write(1, line.as_ptr().cast(), line.len());
        libc::_exit(0);
    }
}

/// CLOCK_MONOTONIC in nanoseconds, as the command reads it.
fn monotonic_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is ours to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// Where in [`run`]'s setups the command runs alone: the others' added
/// time is over it.
const ALONE: usize = 0;
/// Where `perf record` runs as users run it: the peer of the ratios.
const PERF: usize = 1;
/// Where `perf record` runs without its side-band thread (BPF events),
/// which its exit waits for, up to the thread's one-second poll.
const PERF_NO_BPF: usize = 2;
/// Where rtrace's stack tool runs.
const PROFILE: usize = 3;
/// Where an rtrace tool without stacks (a histogram) runs.
const RUNQLAT: usize = 4;

/// One way of running the command.
struct Setup {
    /// As the tables show it.
    label: &'static str,
    /// The tracer and its arguments up to and with `--`; empty for the
    /// command alone.
    tracer: Vec<OsString>,
    /// What the tracer saw of the command, from its stderr (samples,
    /// events), which must be more than none for a run to count.
    saw: Option<fn(&str) -> Option<u64>>,
}

/// One run's figures, in milliseconds.
struct Run {
    /// Launch to the command's first instruction.
    cork: f64,
    /// The command's last instruction to the tracer's exit.
    exit: f64,
    /// Of `exit`, rtrace's report as its `-v` times it.
    report: Option<f64>,
}

/// `perf record`'s `(N samples)`.
fn perf_samples(stderr: &str) -> Option<u64> {
    let (_, rest) = stderr.split_once("MB")?;
    let (_, n) = rest.split_once('(')?;
    n.split_whitespace().next()?.parse().ok()
}

/// rtrace profile's `-v` line `N samples in M stacks, ...`.
fn rtrace_samples(stderr: &str) -> Option<u64> {
    stderr.lines().find_map(|l| {
        let (head, _) = l.split_once(" samples in ")?;
        head.rsplit(' ').next()?.parse().ok()
    })
}

/// rtrace profile's `-v` line `..., symbolized and written in N ms`.
fn report_ms(stderr: &str) -> Option<f64> {
    stderr.lines().find_map(|l| {
        let (_, ms) = l.split_once("symbolized and written in ")?;
        ms.strip_suffix(" ms")?.parse().ok()
    })
}

/// The sum of a histogram's counts (`lo -> hi : count |***|`).
fn histogram_count(stderr: &str) -> Option<u64> {
    Some(super::helpers::sum_after_colon(stderr, "->"))
}

/// The command's `FIRST LAST` line.
fn stamps(stdout: &str) -> Option<(u64, u64)> {
    stdout.lines().find_map(|l| {
        let (a, b) = l.split_once(' ')?;
        Some((a.parse().ok()?, b.trim().parse().ok()?))
    })
}

/// Runs `setup` once on `workload`; its output goes to files in `dir`, so
/// that no reader of a pipe is part of what is timed.
fn once(setup: &Setup, workload: &Path, dir: &Path) -> anyhow::Result<Run> {
    let (out, err) = (dir.join("command.out"), dir.join("command.err"));
    let mut cmd = match setup.tracer.split_first() {
        None => Command::new(workload),
        Some((program, args)) => {
            let mut cmd = Command::new(program);
            cmd.args(args).arg(workload);
            cmd
        }
    };
    cmd.env(
        OsStr::from_bytes(WORKLOAD_ENV.to_bytes()),
        SPIN_MS.to_string(),
    )
    .stdin(Stdio::null())
    .stdout(File::create(&out)?)
    .stderr(File::create(&err)?);
    let launch = monotonic_ns();
    let status = cmd
        .spawn()
        .with_context(|| format!("cannot start {cmd:?}"))?
        .wait()?;
    let exited = monotonic_ns();
    let stdout = std::fs::read_to_string(&out)?;
    let stderr = std::fs::read_to_string(&err)?;
    if !status.success() {
        bail!("{cmd:?} failed ({status}): {}", stderr.trim());
    }
    let (first, last) =
        stamps(&stdout).with_context(|| format!("{cmd:?}: the command said {stdout:?}"))?;
    if let Some(saw) = setup.saw
        && saw(&stderr).is_none_or(|n| n == 0)
    {
        bail!("{cmd:?} saw nothing of the command: {}", stderr.trim());
    }
    let ms = |ns: u64| ns as f64 / 1e6;
    Ok(Run {
        cork: ms(first.saturating_sub(launch)),
        exit: ms(exited.saturating_sub(last)),
        report: report_ms(&stderr),
    })
}

/// Milliseconds `perf report --stdio` takes to read `data` and print.
fn perf_report(data: &Path) -> anyhow::Result<f64> {
    let start = Instant::now();
    let status = Command::new("perf")
        .args(["report", "--stdio", "-i"])
        .arg(data)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .context("cannot run perf report")?;
    if !status.success() {
        bail!("perf report -i {} failed ({status})", data.display());
    }
    Ok(start.elapsed().as_secs_f64() * 1e3)
}

/// Milliseconds as the tables show them: the median, then the range.
fn ranged(v: &[f64]) -> String {
    let (lo, hi) = spread(v);
    format!("{:.1} ({lo:.1}–{hi:.1}) ms", median(v.to_vec()))
}

/// Runs the benchmark; returns its table for docs/benchmarks.md, with the
/// line saying where it was measured.
pub fn run() -> anyhow::Result<String> {
    let rtrace = crate::build()?;
    let dir = crate::root().join("target/bench");
    std::fs::create_dir_all(&dir)?;
    // A copy, so that a rebuild of xtask meanwhile cannot change the
    // command between rounds.
    let workload = dir.join("command-workload");
    let _ = std::fs::remove_file(&workload);
    std::fs::copy(std::env::current_exe()?, &workload)
        .context("cannot copy xtask's binary as the command")?;
    let data = dir.join("command.perf.data");
    let os = |args: &[&str]| -> Vec<OsString> { args.iter().map(OsString::from).collect() };
    let perf = |extra: &[&str]| {
        let mut args = os(&["perf", "record"]);
        args.extend(os(extra));
        args.extend(os(&["-F", "99", "-g", "-o"]));
        args.push(data.clone().into());
        args.push("--".into());
        args
    };
    let rtrace_with = |args: &[&str]| {
        let mut all = vec![rtrace.clone().into_os_string()];
        all.extend(os(args));
        all
    };
    // In the order of ALONE, PERF, PERF_NO_BPF, PROFILE and RUNQLAT.
    let setups = [
        Setup {
            label: "the command alone",
            tracer: Vec::new(),
            saw: None,
        },
        Setup {
            label: "perf record -F 99 -g",
            tracer: perf(&[]),
            saw: Some(perf_samples),
        },
        Setup {
            label: "perf record --no-bpf-event -F 99 -g",
            tracer: perf(&["--no-bpf-event"]),
            saw: Some(perf_samples),
        },
        Setup {
            label: "rtrace profile -F 99 -v",
            tracer: rtrace_with(&["profile", "-v", "-F", "99", "--"]),
            saw: Some(rtrace_samples),
        },
        Setup {
            label: "rtrace runqlat",
            tracer: rtrace_with(&["runqlat", "--"]),
            saw: Some(histogram_count),
        },
    ];
    eprintln!(
        "bench command: launch to the command's first instruction, and its last instruction \
         to the tracer's exit; the command spins {SPIN_MS} ms; median (min-max) of {ROUNDS} \
         rounds, interleaved, the order rotated each round, after one round not counted"
    );
    let mut runs: Vec<Vec<Run>> = setups.iter().map(|_| Vec::new()).collect();
    let mut perf_reports = Vec::new();
    // The first round warms what later rounds find made: page cache, CFI
    // tables cached by rtrace, build ids cached by perf.
    for round in 0..=ROUNDS {
        for k in 0..setups.len() {
            let i = (round + k) % setups.len();
            let run = once(&setups[i], &workload, &dir)?;
            // perf's exit leaves the report to `perf report`: timed apart,
            // before the next run of perf writes over its data.
            let report = (i == PERF).then(|| perf_report(&data)).transpose()?;
            if round > 0 {
                eprintln!(
                    "  round {round}: {:<40} cork {:>7.1} ms  exit {:>7.1} ms",
                    setups[i].label, run.cork, run.exit
                );
                runs[i].push(run);
                perf_reports.extend(report);
            }
            // What a tracer frees after exiting (its programs, after an
            // RCU grace period) is not to fall on the next run.
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    // perf keeps the data it writes over as `.old`.
    for file in [data.clone(), data.with_extension("data.old")] {
        let _ = std::fs::remove_file(file);
    }
    let figure = |f: fn(&Run) -> f64| -> Vec<Vec<f64>> {
        runs.iter()
            .map(|r| r.iter().map(f).collect::<Vec<f64>>())
            .collect()
    };
    let (cork, exit) = (figure(|r| r.cork), figure(|r| r.exit));
    // Added over the command alone, median against median.
    let added = |v: &[Vec<f64>], i: usize| median(v[i].clone()) - median(v[ALONE].clone());
    let ratio = |v: &[Vec<f64>], i: usize, peer: usize| {
        if i == ALONE {
            "-".to_owned()
        } else {
            // Two places lose the smallest ratios (runqlat's exit) to zero.
            let r = added(v, i) / added(v, peer);
            if r.abs() < 0.1 {
                format!("{r:.3}×")
            } else {
                format!("{r:.2}×")
            }
        }
    };
    let add = |v: &[Vec<f64>], i: usize| {
        if i == ALONE {
            "-".to_owned()
        } else {
            format!("{:.1} ms", added(v, i))
        }
    };
    println!();
    println!(
        "{:<38} {:>26} {:>9} {:>7} {:>26} {:>9} {:>7}",
        "setup", "launch to first", "added", "÷ perf", "last to exit", "added", "÷ perf"
    );
    let mut table = String::from(
        "| setup | launch to the first instruction | added | ÷ perf | the last instruction \
         to exit | added | ÷ perf |\n| --- | --- | --- | --- | --- | --- | --- |\n",
    );
    for (i, s) in setups.iter().enumerate() {
        let [a, b, c, d, e, f] = [
            ranged(&cork[i]),
            add(&cork, i),
            ratio(&cork, i, PERF),
            ranged(&exit[i]),
            add(&exit, i),
            ratio(&exit, i, PERF),
        ];
        println!(
            "{:<38} {a:>26} {b:>9} {c:>7} {d:>26} {e:>9} {f:>7}",
            s.label
        );
        let label = if i == ALONE {
            s.label.to_owned()
        } else {
            format!("`{}`", s.label)
        };
        table.push_str(&format!(
            "| {label} | {a} | {b} | {c} | {d} | {e} | {f} |\n"
        ));
    }
    let mut notes = Vec::new();
    let reports: Vec<f64> = runs[PROFILE].iter().filter_map(|r| r.report).collect();
    if !reports.is_empty() {
        notes.push(format!(
            "Of rtrace profile's last instruction to exit, its report (drained, symbolized \
             and written, as `-v` times it): {}.",
            ranged(&reports)
        ));
    }
    notes.push(format!(
        "`perf report --stdio` on perf's data, run after it (its exit does not include a \
         report): {}.",
        ranged(&perf_reports)
    ));
    notes.push(format!(
        "Against `perf record --no-bpf-event`: rtrace profile's cork {}, its exit {}; \
         runqlat's {} and {}.",
        ratio(&cork, PROFILE, PERF_NO_BPF),
        ratio(&exit, PROFILE, PERF_NO_BPF),
        ratio(&cork, RUNQLAT, PERF_NO_BPF),
        ratio(&exit, RUNQLAT, PERF_NO_BPF),
    ));
    println!();
    for n in &notes {
        println!("{n}");
    }
    Ok(format!(
        "Command mode, measured with {}; the command spins {SPIN_MS} ms; medians of {ROUNDS} \
         interleaved rounds (the order rotated each round), ranges in brackets; added: over \
         the command alone; ÷ perf: against `perf record -F 99 -g`'s added time:\n\n{table}\n{}",
        measured_on("command"),
        notes.iter().map(|n| format!("- {n}\n")).collect::<String>()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tracers_say_what_they_saw() {
        let perf = "[ perf record: Woken up 1 times to write data ]\n\
                    [ perf record: Captured and wrote 0.002 MB /tmp/x.data (19 samples) ]\n";
        assert_eq!(perf_samples(perf), Some(19));
        let profile = "rtrace: profile: 92 samples in 3 stacks, symbolized and written in \
                       36 ms\n";
        assert_eq!(rtrace_samples(profile), Some(92));
        assert_eq!(report_ms(profile), Some(36.0));
        let runqlat = "     usecs               : count    distribution\n\
                       \x20        0 -> 1          : 0        |        |\n\
                       \x20       16 -> 31         : 7        |****    |\n\
                       \x20     2048 -> 4095       : 10       |********|\n";
        assert_eq!(histogram_count(runqlat), Some(17));
        assert_eq!(stamps("12 34\n"), Some((12, 34)));
        assert_eq!(stamps("Tracing\n"), None);
    }
}

//! `cargo xtask bench python`: what Python frames cost. Two CPU-bound
//! Python processes (`tests/fixtures/pyfix.py rounds`, under Debian's
//! python3.11, trixie's 3.13 and sid's 3.14, the last two in the roots
//! setup makes) each do a fixed amount of work, bare and under each
//! profiler at 99 and 999 Hz: rtrace profiling the whole system with
//! Python frames, the same with `--no-python`, and `py-spy record
//! --native` on one of them. Reported: the time added to each round of
//! the sampled process's work, the BPF time per sample (the kernel's own
//! statistics), samples lost, and the share of samples with the whole
//! Python chain. Interleaved trials, medians and ranges.

use std::{
    io::{BufRead as _, BufReader, Write as _},
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::Duration,
};

use anyhow::{Context as _, bail};

use super::{
    bpf_run_ns,
    helpers::{bpf_cell, paired_text, rtrace_lost, us_ranged},
    measured_on, median,
};

/// Rounds of the fixture's work per process and trial: about 3 s bare.
const ROUNDS: u64 = 1000;
/// Interleaved trials per configuration (`RTRACE_BENCH_TRIALS` sets
/// another number).
fn trials() -> usize {
    super::helpers::trials_from_env(5)
}
/// An interpreter the fixtures run under: Debian's, without frame
/// pointers.
struct Interp {
    /// Its version, for the table.
    version: &'static str,
    /// The Debian root it runs in, through `chroot`; none: the host's.
    root: Option<PathBuf>,
    /// Its path (in its root).
    path: &'static str,
}

impl Interp {
    /// The interpreter of Debian root `r`.
    fn of(version: &'static str, r: &crate::setup::DebianRoot) -> Self {
        Self {
            version,
            root: Some(r.path()),
            path: r.program,
        }
    }

    /// Its command, as run (a stack's first frame): its file's name.
    fn comm(&self) -> &'static str {
        self.path.rsplit('/').next().unwrap_or(self.path)
    }
}

/// The interpreters measured: the host's 3.11, trixie's 3.13, sid's 3.14.
fn interps() -> Vec<Interp> {
    vec![
        Interp {
            version: "3.11",
            root: None,
            path: "/usr/bin/python3.11",
        },
        Interp::of("3.13", &crate::setup::TRIXIE),
        Interp::of("3.14", &crate::setup::SID),
    ]
}

/// A profiler as one configuration runs it.
#[derive(Clone, Copy, PartialEq)]
enum Tool {
    Bare,
    NoPython,
    Python,
    PySpy,
}

impl Tool {
    fn label(self) -> &'static str {
        match self {
            Self::Bare => "bare",
            Self::NoPython => "rtrace profile --no-python (system-wide)",
            Self::Python => "rtrace profile (system-wide)",
            Self::PySpy => "py-spy record --native (one process)",
        }
    }
}

/// What one trial measured.
struct Trial {
    /// Nanoseconds a round took in the sampled process.
    round_ns: f64,
    /// BPF nanoseconds per sample (rtrace only).
    bpf_per_sample: Option<f64>,
    /// Samples taken and lost.
    samples: u64,
    lost: u64,
    /// Samples of the fixtures, and those with the whole Python chain.
    fixture: u64,
    whole: u64,
    /// The profiler's own CPU time in user and system mode, in
    /// milliseconds, from when it samples to the signal to stop: it is
    /// taken from the two fixtures, which keep both CPUs busy.
    cpu_ms: Option<(f64, f64)>,
}

/// Milliseconds process `pid` (all its threads) has run in user and in
/// system mode (`/proc/PID/stat`'s `utime` and `stime`, in clock ticks).
fn user_sys_ms(pid: u32) -> Option<(f64, f64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command, which is in parentheses and may hold spaces.
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let ms = |i: usize| Some(f.get(i)?.parse::<f64>().ok()? * 1e3 / hz);
    // Fields 14 and 15 of the line; 12 and 13 after the command's.
    Some((ms(11)?, ms(12)?))
}

/// Starts the two fixtures under `py`, ready to work.
fn fixtures(py: &Interp) -> anyhow::Result<Vec<Child>> {
    let script = crate::root().join("tests/fixtures/pyfix.py");
    (0..2)
        .map(|_| {
            let mut cmd = match &py.root {
                Some(root) => {
                    std::fs::copy(&script, root.join("tmp/pyfix.py"))?;
                    let mut c = Command::new("chroot");
                    c.arg(root).args([py.path, "/tmp/pyfix.py"]);
                    c
                }
                None => {
                    let mut c = Command::new(py.path);
                    c.arg(&script);
                    c
                }
            };
            let mut c = cmd
                .args(["rounds", &ROUNDS.to_string()])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .with_context(|| format!("cannot run {}", py.path))?;
            let mut line = String::new();
            BufReader::new(c.stdout.as_mut().context("stdout")?).read_line(&mut line)?;
            if !line.starts_with("ready") {
                bail!("the fixture said {line:?}");
            }
            Ok(c)
        })
        .collect()
}

/// Lets the fixtures work; returns each one's nanoseconds per round.
fn work(kids: &mut [Child]) -> anyhow::Result<Vec<f64>> {
    for c in kids.iter_mut() {
        writeln!(c.stdin.as_mut().context("stdin")?, "go")?;
    }
    let mut out = Vec::new();
    for c in kids.iter_mut() {
        let mut line = String::new();
        BufReader::new(c.stdout.as_mut().context("stdout")?).read_line(&mut line)?;
        let ns: f64 = line
            .strip_prefix("done ")
            .and_then(|n| n.trim().parse().ok())
            .with_context(|| format!("the fixture said {line:?}"))?;
        out.push(ns / ROUNDS as f64);
    }
    for c in kids.iter_mut() {
        drop(c.stdin.take());
        c.wait()?;
    }
    Ok(out)
}

/// Starts `cmd` and waits for a stderr line containing `ready` (`None`:
/// waits a moment), keeping the rest of stderr.
fn start(
    mut cmd: Command,
    ready: Option<&str>,
) -> anyhow::Result<(Child, std::sync::mpsc::Receiver<String>)> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot start the profiler")?;
    let stderr = child.stderr.take().context("stderr")?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    match ready {
        Some(ready) => loop {
            let line = rx
                .recv_timeout(Duration::from_secs(60))
                .context("the profiler never said it was ready")?;
            if line.contains(ready) {
                break;
            }
        },
        None => std::thread::sleep(Duration::from_millis(500)),
    }
    Ok((child, rx))
}

/// One trial of `tool` at `hz` under `py`.
fn trial(py: &Interp, tool: Tool, hz: u64, rtrace: &str, py_spy: &str) -> anyhow::Result<Trial> {
    let mut kids = fixtures(py)?;
    let sampled = kids[0].id().to_string();
    let hz_s = hz.to_string();
    let profiler = match tool {
        Tool::Bare => None,
        Tool::NoPython | Tool::Python => {
            let mut c = Command::new(rtrace);
            c.args(["profile", "-F", &hz_s, "-f", "-U"]);
            if tool == Tool::NoPython {
                c.arg("--no-python");
            }
            Some(start(c, Some("Sampling"))?)
        }
        Tool::PySpy => {
            let mut c = Command::new(py_spy);
            c.args([
                "record",
                "--native",
                "--format",
                "raw",
                "-r",
                &hz_s,
                "-p",
                &sampled,
                "-o",
                "/dev/stdout",
            ]);
            Some(start(c, None)?)
        }
    };
    // From when it samples: loading its programs (the verifier's time is
    // its system time) takes nothing from the work.
    let cpu_at_start = profiler.as_ref().and_then(|(c, _)| user_sys_ms(c.id()));
    let before = bpf_run_ns();
    let rounds = work(&mut kids)?;
    let bpf = bpf_run_ns().saturating_sub(before) as f64;
    let mut t = Trial {
        round_ns: rounds[0],
        bpf_per_sample: None,
        samples: 0,
        lost: 0,
        fixture: 0,
        whole: 0,
        cpu_ms: None,
    };
    let Some((mut child, stderr)) = profiler else {
        return Ok(t);
    };
    t.cpu_ms = match (user_sys_ms(child.id()), cpu_at_start) {
        (Some((u, s)), Some((u0, s0))) => Some((u - u0, s - s0)),
        _ => None,
    };
    // SAFETY: signalling a child of this process.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let mut out = String::new();
    std::io::Read::read_to_string(child.stdout.as_mut().context("stdout")?, &mut out)?;
    child.wait()?;
    let errors: Vec<String> = stderr.try_iter().collect();
    let errors = errors.join("\n");
    for line in out.lines() {
        let Some((stack, n)) = line.rsplit_once(' ') else {
            continue;
        };
        let n: u64 = n.parse().unwrap_or(0);
        t.samples += n;
        if tool == Tool::PySpy {
            // py-spy's raw lines are the one process's, root first.
            t.fixture += n;
            if stack.contains("<module> (") && stack.contains("rounds (") {
                t.whole += n;
            }
            continue;
        }
        let frames: Vec<&str> = stack.split(';').collect();
        if frames.first() != Some(&py.comm()) {
            continue;
        }
        t.fixture += n;
        let py: Vec<&&str> = frames.iter().filter(|f| f.starts_with("pyfix.")).collect();
        if frames.contains(&"Py_BytesMain")
            && py.len() >= 3
            && *py[0] == "pyfix.<module>"
            && *py[1] == "pyfix.main"
            && *py[2] == "pyfix.rounds"
        {
            t.whole += n;
        }
    }
    if tool == Tool::PySpy {
        // "Samples: N Errors: M" at the end.
        t.lost = errors
            .split("Errors: ")
            .nth(1)
            .and_then(|e| e.split_whitespace().next()?.parse().ok())
            .unwrap_or(0);
    } else {
        t.lost = rtrace_lost(&errors);
        t.bpf_per_sample = Some(bpf / t.samples.max(1) as f64);
    }
    Ok(t)
}

/// `RTRACE_BENCH_PYTHON=3.13` or `3.13@999`: one version, or one rate of
/// it, for measuring a change to the walk; its table is not written to
/// the docs.
pub fn part() -> Option<String> {
    std::env::var("RTRACE_BENCH_PYTHON")
        .ok()
        .filter(|p| !p.is_empty())
}

/// Runs the benchmark; the table for `docs/benchmarks.md`.
pub fn run() -> anyhow::Result<String> {
    crate::setup::peers()?;
    let rtrace = crate::build()?.to_string_lossy().into_owned();
    let py_spy = crate::setup::py_spy().to_string_lossy().into_owned();
    let _stats = aya::sys::enable_stats(aya::sys::Stats::RunTime)
        .context("cannot turn on BPF run-time statistics")?;
    let tools = [Tool::Bare, Tool::NoPython, Tool::Python, Tool::PySpy];
    let mut table = format!(
        "{} (two Python processes, each doing {ROUNDS} rounds of the \
         fixture's work, about 3 s bare; rtrace samples the whole system, py-spy the first \
         process; added time per round of the first process's work over bare, BPF time per \
         sample from the kernel's statistics, samples with the whole Python chain under \
         `Py_BytesMain`; under Debian's python3.11 (bookworm, the host's), python3 3.13 (trixie) \
         and python3.14 (sid), the last two in their roots through chroot; medians of \
         {} interleaved trials, ranges in parentheses):\n\n",
        measured_on("python"),
        trials()
    );
    table.push_str(
        "| Python | rate | profiler | added per round | BPF per sample | own CPU, user / system \
         | samples (lost) | whole Python chains |\n| --- | --- | --- | --- | --- | --- | --- | --- \
         |\n",
    );
    let mut verdicts = Vec::new();
    let pythons = interps();
    let only = part().unwrap_or_default();
    let runs = pythons
        .iter()
        .flat_map(|py| [99u64, 999].map(|hz| (py, hz)))
        .filter(|(py, hz)| {
            let (v, rate) = only.split_once('@').unwrap_or((&only, ""));
            (v.is_empty() || v == py.version) && (rate.is_empty() || rate == hz.to_string())
        });
    for (py, hz) in runs {
        let v = py.version;
        eprintln!(
            "bench python: {v} at {hz} Hz, {} interleaved trials",
            trials()
        );
        let mut got: Vec<Vec<Trial>> = tools.iter().map(|_| Vec::new()).collect();
        for n in 1..=trials() {
            for (i, &tool) in tools.iter().enumerate() {
                let t = trial(py, tool, hz, &rtrace, &py_spy)?;
                eprintln!(
                    "  trial {n}: {:<42} {:>8.0} us/round, {} samples, {} lost",
                    tool.label(),
                    t.round_ns / 1e3,
                    t.samples,
                    t.lost
                );
                got[i].push(t);
            }
        }
        let bare = median(got[0].iter().map(|t| t.round_ns).collect());
        let added: Vec<Vec<f64>> = got
            .iter()
            .map(|ts| ts.iter().map(|t| t.round_ns - bare).collect())
            .collect();
        let bpf: Vec<Vec<f64>> = got
            .iter()
            .map(|ts| ts.iter().filter_map(|t| t.bpf_per_sample).collect())
            .collect();
        for (i, &tool) in tools.iter().enumerate().skip(1) {
            let bpf_cell = bpf_cell(&bpf[i]);
            let ts = &got[i];
            let cpu: Vec<(f64, f64)> = ts.iter().filter_map(|t| t.cpu_ms).collect();
            let cpu_cell = if cpu.is_empty() {
                "-".to_owned()
            } else {
                let u = median(cpu.iter().map(|c| c.0).collect());
                let s = median(cpu.iter().map(|c| c.1).collect());
                format!("{u:.0} / {s:.0} ms")
            };
            let samples: u64 = ts.iter().map(|t| t.samples).sum::<u64>() / trials() as u64;
            let lost: u64 = ts.iter().map(|t| t.lost).sum::<u64>() / trials() as u64;
            let (f, w): (u64, u64) = ts
                .iter()
                .fold((0, 0), |(f, w), t| (f + t.fixture, w + t.whole));
            table.push_str(&format!(
                "| {v} | {hz} Hz | {} | {} | {bpf_cell} | {cpu_cell} | {samples} ({lost}) | {:.1}% |\n",
                tool.label(),
                us_ranged(&added[i]),
                w as f64 * 100.0 / f.max(1) as f64,
            ));
        }
        let walk = median(bpf[2].clone()) / median(bpf[1].clone()).max(1e-9);
        let cost = median(added[2].clone()).max(0.0) / median(added[3].clone()).max(1e-9);
        let per_trial = |i: usize| got[i].iter().map(|t| t.bpf_per_sample).collect::<Vec<_>>();
        let paired = paired_text(&per_trial(2), &per_trial(1));
        verdicts.push(format!(
            "{v} at {hz} Hz: the Python walk takes {:.2}x the native walk's BPF time per sample \
             ({:.1} us against {:.1} us{paired}; goal: at most 1.30x), and rtrace's added time per \
             round is {:.2}x py-spy's (goal: at most 0.25x)",
            walk,
            median(bpf[2].clone()) / 1e3,
            median(bpf[1].clone()) / 1e3,
            cost
        ));
    }
    table.push('\n');
    for v in &verdicts {
        table.push_str(&format!("- {v}.\n"));
    }
    println!("\n{table}");
    Ok(table)
}

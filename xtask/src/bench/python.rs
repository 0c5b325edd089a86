//! `cargo xtask bench python`: what Python frames cost. Two CPU-bound
//! Python processes (`tests/fixtures/pyfix.py rounds`, under Debian's
//! python3.11, trixie's 3.13 and sid's 3.14, the last two in the roots
//! setup makes) each do a fixed amount of work, bare and under each
//! profiler at 99 and 999 Hz: rtrace profiling the whole system with
//! Python frames, the same with `--no-python`, and `py-spy record
//! --native` on one of them. Reported: what each profiler takes from
//! each round of the sampled process's work, counted from its parts
//! ([`taken`]), the time added to each round, the BPF time per sample
//! (the kernel's own statistics), the profiler's own CPU, samples lost,
//! and the share of samples with the whole Python chain. Interleaved
//! trials, medians and ranges, and bounds from resamples of the trials.

use std::{
    io::{BufRead as _, BufReader, Write as _},
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::Duration,
};

use anyhow::{Context as _, bail};

use super::{
    bpf_run_ns,
    helpers::{CpuGroup, bpf_cell, paired_text, percentile, resample, rtrace_lost, us_ranged},
    measured_on, median,
};

/// Rounds of the fixture's work per process and trial: about 1.5 s bare.
const ROUNDS: u64 = 1000;
/// The start of the work, whose profiler's CPU is told apart.
const FIRST: Duration = Duration::from_millis(300);
/// Interleaved trials per configuration (`RTRACE_BENCH_TRIALS` sets
/// another number).
fn trials() -> usize {
    super::helpers::trials_from_env(8)
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

/// The configurations of each trial, in the order of the tables: the
/// verdicts take them by index (1 the native walk, 2 the Python walk, 3
/// py-spy).
const TOOLS: [Tool; 4] = [Tool::Bare, Tool::NoPython, Tool::Python, Tool::PySpy];

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
    /// Nanoseconds a round of the sampled process was held stopped: off
    /// its CPU and not waiting for one (py-spy stops the process it
    /// reads), from its schedstat.
    stopped_ns: f64,
    /// The profiler's own time on a CPU over the work, every thread's,
    /// in nanoseconds: the fixtures keep both CPUs busy, so it is taken
    /// from them, half from each.
    own_ns: Option<f64>,
    /// Of it, the time in the work's first [`FIRST`]: rtrace meets the
    /// two processes then (their first stacks: their mappings read, their
    /// unwind tables and, with Python frames, their interpreters found),
    /// a cost of each process's, not of each round's.
    own_first_ns: Option<f64>,
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

impl Trial {
    /// Nanoseconds of BPF time its samples ran in the sampled process:
    /// the time per sample, times half the two fixtures' samples.
    fn bpf_in_sampled_ns(&self) -> f64 {
        self.bpf_per_sample.unwrap_or(0.0) * self.fixture as f64 / 2.0
    }
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

/// Task `path`'s time on a CPU and waiting for one, in nanoseconds (its
/// schedstat's first two fields).
fn run_and_wait_ns(path: &str) -> anyhow::Result<(f64, f64)> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {path}"))?;
    let mut f = text.split_whitespace().map(|n| n.parse::<f64>().ok());
    match (f.next().flatten(), f.next().flatten()) {
        (Some(run), Some(wait)) => Ok((run, wait)),
        _ => bail!("{path} says {text:?}"),
    }
}

/// Lets the fixtures work; returns each one's nanoseconds per round, and
/// of them those it was held stopped: the time the fixture measured less
/// what its schedstat gained on the CPU and waiting for it, read before
/// its go and after its done (while it waits for a line, it is neither).
fn work(kids: &mut [Child]) -> anyhow::Result<Vec<(f64, f64)>> {
    let schedstat = |c: &Child| run_and_wait_ns(&format!("/proc/{}/schedstat", c.id()));
    let before = kids
        .iter()
        .map(schedstat)
        .collect::<anyhow::Result<Vec<_>>>()?;
    for c in kids.iter_mut() {
        writeln!(c.stdin.as_mut().context("stdin")?, "go")?;
    }
    let mut out = Vec::new();
    for (c, (run0, wait0)) in kids.iter_mut().zip(before) {
        let mut line = String::new();
        BufReader::new(c.stdout.as_mut().context("stdout")?).read_line(&mut line)?;
        let elapsed: f64 = line
            .strip_prefix("done ")
            .and_then(|n| n.trim().parse().ok())
            .with_context(|| format!("the fixture said {line:?}"))?;
        let (run, wait) = schedstat(c)?;
        let stopped = (elapsed - (run - run0) - (wait - wait0)).max(0.0);
        out.push((elapsed / ROUNDS as f64, stopped / ROUNDS as f64));
    }
    for c in kids.iter_mut() {
        drop(c.stdin.take());
        c.wait()?;
    }
    Ok(out)
}

/// Starts `cmd`, waits for a stderr line containing `ready` (`None`: no
/// line), then a moment more; keeps the rest of stderr.
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
    if let Some(ready) = ready {
        loop {
            let line = rx
                .recv_timeout(Duration::from_secs(60))
                .context("the profiler never said it was ready")?;
            if line.contains(ready) {
                break;
            }
        }
    }
    // What a profiler does in its first moments is its start's cost,
    // benched apart (`bench startup`): rtrace copies kallsyms on a thread
    // as it begins to sample (about 50 ms of the kernel's time), which
    // work begun at once would share two CPUs with.
    std::thread::sleep(Duration::from_millis(500));
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
    // Dropped after the profiler has exited, at the end of the trial.
    let group = profiler
        .as_ref()
        .map(|(c, _)| CpuGroup::of_profiler(c.id()))
        .transpose()?;
    let own_at_start = group.as_ref().and_then(CpuGroup::cpu_ns);
    let before = bpf_run_ns();
    let (rounds, own_at_first) = std::thread::scope(|s| {
        let first = s.spawn(|| {
            std::thread::sleep(FIRST);
            group.as_ref().and_then(CpuGroup::cpu_ns)
        });
        let rounds = work(&mut kids);
        (rounds, first.join().ok().flatten())
    });
    let rounds = rounds?;
    let bpf = bpf_run_ns().saturating_sub(before) as f64;
    let mut t = Trial {
        round_ns: rounds[0].0,
        stopped_ns: rounds[0].1,
        own_ns: None,
        own_first_ns: own_at_first.zip(own_at_start).map(|(at, then)| at - then),
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
    t.own_ns = group
        .as_ref()
        .and_then(CpuGroup::cpu_ns)
        .zip(own_at_start)
        .map(|(now, then)| now - then);
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

/// Resamples each verdict draws (a bootstrap of the trials), and the
/// share of them a bound is taken at.
const RESAMPLES: usize = 2000;
const BOUND: f64 = 0.9;

/// What a profiler took from each round of the sampled process's work,
/// trial by trial, in nanoseconds. rtrace's: half its own time on a CPU
/// after the work's first moments (the two fixtures keep both CPUs busy,
/// so it runs in their place), and the BPF time its samples ran in the
/// process (the time per sample, times half the two fixtures' samples).
/// py-spy's: the time it held the process stopped, a
/// bound below its cost, as its own CPU runs in part on the CPU the
/// stopped process left and is not counted. rtrace stops nothing: in its
/// runs, as in bare ones, that measure is the time the host took the CPU
/// away (a tick of it, 10 ms, in one trial of four or so).
///
/// The time a round took is no measure of costs this small here: the
/// host slows a run's time on the CPU by 10 to 25 % in about a quarter
/// of the runs, bare ones too, with no time stolen on record, so rounds'
/// times spread by 100 us and more, where rtrace's whole cost at 99 Hz
/// is a microsecond or two. Nor is the fixture's time off its CPU over
/// bare's: the machine's own work (kworkers, the VM's agent) moves it by
/// 3 to 10 us a round. What is left out, the caches and TLB a profiler's
/// work disturbs, is left out for py-spy too.
fn taken(got: &[Vec<Trial>], i: usize) -> Vec<f64> {
    got[i]
        .iter()
        .map(|t| {
            if TOOLS[i] == Tool::PySpy {
                return t.stopped_ns;
            }
            // The rounds after the first moments, over which the rest of
            // its CPU time is spread.
            let elapsed = t.round_ns * ROUNDS as f64;
            let later = ROUNDS as f64 * (1.0 - FIRST.as_nanos() as f64 / elapsed).max(0.1);
            let own = t.own_ns.unwrap_or(0.0) - t.own_first_ns.unwrap_or(0.0);
            own / 2.0 / later + t.bpf_in_sampled_ns() / ROUNDS as f64
        })
        .collect()
}

/// The bound under which [`BOUND`] of the trials' resamples put `stat`
/// of two configurations' values `a` and `b`, each resampled.
fn bound(a: &[f64], b: &[f64], seed: u64, stat: impl Fn(f64, f64) -> f64) -> f64 {
    let mut state = seed;
    let drawn: Vec<f64> = (0..RESAMPLES)
        .map(|_| {
            let x = median(resample(a, &mut state));
            stat(x, median(resample(b, &mut state)))
        })
        .collect();
    percentile(&drawn, BOUND)
}

/// The verdict on what rtrace takes from the work against what py-spy
/// does (goal: at most a quarter), by the medians, with the bound under
/// which 90 % of the trials' resamples put the ratio.
fn against_py_spy(got: &[Vec<Trial>]) -> String {
    let (ours, theirs) = (taken(got, 2), taken(got, 3));
    let ratio = |r: f64, s: f64| {
        if s > 0.0 {
            r.max(0.0) / s
        } else {
            f64::INFINITY
        }
    };
    let (r, s) = (median(ours.clone()), median(theirs.clone()));
    let met = if ratio(r, s) <= 0.25 {
        "met"
    } else {
        "NOT met"
    };
    format!(
        "rtrace takes {:.1} us a round, {:.2}x py-spy's {:.1} us ({:.0} % of resamples of the \
         trials at most {:.2}x; goal: at most 0.25x, {met})",
        r / 1e3,
        ratio(r, s),
        s / 1e3,
        BOUND * 100.0,
        bound(&ours, &theirs, 0x2545_f491_4f6c_dd1d, ratio)
    )
}

/// The verdict on what Python frames take over `--no-python` (goal: at
/// most half as much again, plus the extra BPF time: what each takes
/// holds its BPF time, so that is the Python walk's at most 1.5x the
/// native walk's, plus half the native walk's BPF time).
fn against_native(got: &[Vec<Trial>]) -> String {
    let (python, native) = (taken(got, 2), taken(got, 1));
    let (p, n) = (median(python.clone()), median(native.clone()));
    let over = |p: f64, n: f64| p - 1.5 * n.max(0.0);
    let extra = extra_bpf(got);
    let met = if over(p, n) <= extra {
        "met"
    } else {
        "NOT met"
    };
    format!(
        "with Python frames rtrace takes {:.1} us a round against {:.1} us with `--no-python`: \
         {:.1} us over 1.5x of it ({:.0} % of resamples at most {:.1} us; goal: at most the \
         extra BPF time, {:.2} us, {met})",
        p / 1e3,
        n / 1e3,
        over(p, n) / 1e3,
        BOUND * 100.0,
        bound(&python, &native, 0x9e37_79b9_7f4a_7c15, over) / 1e3,
        extra / 1e3
    )
}

/// The BPF time a round of the sampled process the Python walk adds over
/// the native walk, by the medians, in nanoseconds.
fn extra_bpf(got: &[Vec<Trial>]) -> f64 {
    let per_round =
        |i: usize| median(got[i].iter().map(Trial::bpf_in_sampled_ns).collect()) / ROUNDS as f64;
    (per_round(2) - per_round(1)).max(0.0)
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
    let tools = TOOLS;
    let mut table = format!(
        "{} (two Python processes, each doing {ROUNDS} rounds of the \
         fixture's work, about 1.5 s bare; rtrace samples the whole system, py-spy the first \
         process; {} interleaved trials, each starting at another configuration, the work \
         begun half a second after the profiler's start; medians and ranges. Taken per round: \
         what the profiler took from each round of the first process's work. rtrace's: half its \
         own CPU time after the work's first {} ms (both CPUs busy with the fixtures; the \
         first moments, in which rtrace meets the processes, are a cost of each process, shown \
         in the own CPU column), and the BPF time its samples ran in it. py-spy's: the time it \
         held the process stopped (from the process's schedstat), a bound below its cost, as \
         its own CPU runs in part where the stopped process would. Added per round: \
         the time a round took over bare's, which the host's slowing of whole runs (10 to 25 \
         % in about a quarter of them, bare ones too) makes noise at these sizes. BPF time \
         per sample from the kernel's statistics; samples with the whole Python chain under \
         `Py_BytesMain`; under Debian's python3.11 (bookworm, the host's), python3 3.13 \
         (trixie) and python3.14 (sid), the last two in their roots through chroot):\n\n",
        measured_on("python"),
        trials(),
        FIRST.as_millis()
    );
    table.push_str(
        "| Python | rate | profiler | taken per round | added per round | BPF per sample | own \
         CPU (user / system, in ticks) | samples (lost) | whole Python chains |\n| --- | --- | --- | --- | \
         --- | --- | --- | --- | --- |\n",
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
            // Each trial starts at another configuration, so that none
            // takes a place in the trials' order for its own cost.
            for k in 0..tools.len() {
                let i = (k + n - 1) % tools.len();
                let tool = tools[i];
                let t = trial(py, tool, hz, &rtrace, &py_spy)?;
                eprintln!(
                    "  trial {n}: {:<42} {:>8.0} us/round ({:.1} stopped), own CPU {:.1} ms \
                     ({:.1} at first), {} samples, {} lost",
                    tool.label(),
                    t.round_ns / 1e3,
                    t.stopped_ns / 1e3,
                    t.own_ns.unwrap_or(0.0) / 1e6,
                    t.own_first_ns.unwrap_or(0.0) / 1e6,
                    t.samples,
                    t.lost
                );
                got[i].push(t);
            }
        }
        let bare = median(got[0].iter().map(|t| t.round_ns).collect());
        let bpf: Vec<Vec<f64>> = got
            .iter()
            .map(|ts| ts.iter().filter_map(|t| t.bpf_per_sample).collect())
            .collect();
        for (i, &tool) in tools.iter().enumerate().skip(1) {
            let bpf_cell = bpf_cell(&bpf[i]);
            let ts = &got[i];
            let cpu: Vec<(f64, f64)> = ts.iter().filter_map(|t| t.cpu_ms).collect();
            let own: Vec<f64> = ts.iter().filter_map(|t| t.own_ns).collect();
            let first: Vec<f64> = ts.iter().filter_map(|t| t.own_first_ns).collect();
            let cpu_cell = if cpu.is_empty() || own.is_empty() || first.is_empty() {
                "-".to_owned()
            } else {
                let u = median(cpu.iter().map(|c| c.0).collect());
                let s = median(cpu.iter().map(|c| c.1).collect());
                format!(
                    "{:.1} ms, {:.1} in the first {} ms ({u:.0} / {s:.0} ms)",
                    median(own) / 1e6,
                    median(first) / 1e6,
                    FIRST.as_millis()
                )
            };
            let samples: u64 = ts.iter().map(|t| t.samples).sum::<u64>() / trials() as u64;
            let lost: u64 = ts.iter().map(|t| t.lost).sum::<u64>() / trials() as u64;
            let (f, w): (u64, u64) = ts
                .iter()
                .fold((0, 0), |(f, w), t| (f + t.fixture, w + t.whole));
            let added: Vec<f64> = ts.iter().map(|t| t.round_ns - bare).collect();
            table.push_str(&format!(
                "| {v} | {hz} Hz | {} | {} | {} | {bpf_cell} | {cpu_cell} | {samples} ({lost}) | \
                 {:.1}% |\n",
                tool.label(),
                us_ranged(&taken(&got, i)),
                us_ranged(&added),
                w as f64 * 100.0 / f.max(1) as f64,
            ));
        }
        let walk = median(bpf[2].clone()) / median(bpf[1].clone()).max(1e-9);
        let per_trial = |i: usize| got[i].iter().map(|t| t.bpf_per_sample).collect::<Vec<_>>();
        let paired = paired_text(&per_trial(2), &per_trial(1));
        verdicts.push(format!(
            "{v} at {hz} Hz: the Python walk takes {:.2}x the native walk's BPF time per sample \
             ({:.1} us against {:.1} us{paired}; goal: at most 1.30x); {}; {}",
            walk,
            median(bpf[2].clone()) / 1e3,
            median(bpf[1].clone()) / 1e3,
            against_py_spy(&got),
            against_native(&got),
        ));
    }
    table.push('\n');
    for v in &verdicts {
        table.push_str(&format!("- {v}.\n"));
    }
    println!("\n{table}");
    Ok(table)
}

//! profile against perf record: CPU-bound fixtures with frame pointers
//! against `perf record -g`, without them (and Debian's python3) against
//! DWARF mode, then a C build ([`build`]).

use std::{
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{Context as _, bail};

use super::{
    Outcome, Ready, Row, Setup, Stopped, TRIALS, Tracer, build,
    helpers::{perf_dwarf, perf_lost, rtrace_lost, seconds},
    median, print_costs, trials,
};

/// How long each worker of the profile benchmarks runs per trial.
const PROFILE_MS: u64 = 3_000;
/// Profile workers: one per core of these machines.
const PROFILE_WORKERS: usize = 2;

/// A CPU-bound program run once per core for `PROFILE_MS`, which watches
/// the clock in a tight loop and prints `done NS GAPS`: the time taken from
/// it in gaps of 2 µs to 1 ms, and their number.
///
/// That is how a sampling profiler's cost is measured here: directly, as
/// the time its interrupts take from the sampled tasks (perf's copy of the
/// stack, rtrace's walk), plus the CPU time of its own process, read from
/// schedstat. Longer gaps are other tasks' time slices, left out: on these
/// shared machines they come and go by tens of percent. Timing a fixed
/// amount of work and subtracting the bare time measures the same thing as
/// the small difference of two large numbers that drift by ±10 % from run
/// to run; the stolen time only scales with that drift.
struct CpuLoad {
    /// Its name in reports and its `comm` in stacks.
    comm: &'static str,
    /// The program and its arguments.
    argv: Vec<String>,
    /// A frame every whole stack holds, as rtrace and perf name it.
    main: (&'static str, &'static str),
}

impl CpuLoad {
    /// The profile fixture, `hotfuncs` or `hotfuncs_nofp`.
    fn hotfuncs(name: &'static str) -> Self {
        Self {
            comm: name,
            argv: vec![
                crate::root()
                    .join("target/release")
                    .join(name)
                    .to_string_lossy()
                    .into_owned(),
                "stolen".into(),
                PROFILE_MS.to_string(),
            ],
            main: ("hotfuncs::main", "main"),
        }
    }

    /// Debian's python3, which has no frame pointers, watching the clock
    /// in its interpreter loop (an iteration takes about 100 ns).
    fn python() -> Self {
        const WATCH: &str = r#"
import sys, time
pc = time.perf_counter_ns
prev = pc()
end = prev + int(sys.argv[1]) * 1000000
stolen = gaps = 0
while prev < end:
    t = pc()
    d = t - prev
    if 2000 < d <= 1000000:
        stolen += d
        gaps += 1
    prev = t
print('done', stolen, gaps)
"#;
        Self {
            comm: "python3",
            argv: vec![
                "/usr/bin/python3".into(),
                "-c".into(),
                WATCH.into(),
                PROFILE_MS.to_string(),
            ],
            main: ("Py_BytesMain", "Py_BytesMain"),
        }
    }
}

/// Runs `load` on every core; returns the time taken from the workers in
/// nanoseconds per millisecond each ran, and those milliseconds (at 999 Hz
/// a millisecond of a busy worker is about one sample).
fn cpu_work(load: &CpuLoad) -> anyhow::Result<(f64, u64)> {
    let workers: Vec<_> = (0..PROFILE_WORKERS)
        .map(|_| {
            Command::new(&load.argv[0])
                .args(&load.argv[1..])
                .stdout(Stdio::piped())
                .spawn()
                .with_context(|| format!("cannot start {}", load.comm))
        })
        .collect::<anyhow::Result<_>>()?;
    let mut stolen = 0.0;
    for w in workers {
        let out = w.wait_with_output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        let ns: f64 = text
            .lines()
            .last()
            .and_then(|l| l.strip_prefix("done "))
            .and_then(|l| l.split(' ').next()?.parse().ok())
            .with_context(|| format!("{} said {text:?}", load.comm))?;
        stolen += ns;
    }
    let ms = PROFILE_MS * PROFILE_WORKERS as u64;
    Ok((stolen / ms as f64, ms))
}

/// The unit of the profile benchmarks' cost: nanoseconds taken from a
/// worker per millisecond it ran.
const STOLEN: &str = "stolen ns/ms";

/// `perf record` of the whole machine at `hz` with no call graphs, into
/// `data`: the cost of the sampling interrupt itself, which every sampler
/// pays, and what is left of the others' cost above it is their own.
fn perf_floor(hz: &str, data: &str) -> Setup {
    Setup::traced(
        format!("perf record -a -F {hz} (no stacks)"),
        "perf",
        &["record", "-q", "-a", "-F", hz, "-o", data],
        Ready::After(Duration::from_secs(1)),
        None,
    )
}

/// The added cost of setup `i` over bare, as a share of setup `peer`'s,
/// over bare and over the floor (setup `floor`).
///
/// A setup's cost is the time its interrupts take from the workers plus
/// its own process's CPU time, per millisecond of a worker.
fn shares(results: &[Outcome], i: usize, peer: usize, floor: usize) -> Shares {
    let cost = |j: usize| results[j].cost + results[j].tracer_ns;
    let bare = cost(0);
    let added = |j: usize| cost(j) - bare;
    let above = |j: usize| cost(j) - cost(floor);
    Shares {
        ratio: added(i) / added(peer),
        above: above(i) / above(peer),
        floor: added(floor) / added(peer),
        peer_added: added(peer),
    }
}

/// What [`shares`] returns: setup `i`'s added cost as a share of the
/// peer's, over bare and over the floor; the floor's share of the peer's;
/// and the peer's added cost itself, which may be noise.
struct Shares {
    ratio: f64,
    above: f64,
    floor: f64,
    peer_added: f64,
}

/// profile's benchmark: CPU-bound fixtures with frame pointers against
/// `perf record -g`, then without them against DWARF mode, then a C build
/// ([`build`]). `RTRACE_BENCH_ONLY=build` runs the C build alone, whose
/// row then stands for profile in `bench all`.
pub fn run() -> anyhow::Result<Row> {
    let rtrace = crate::build()?;
    if std::env::var_os("RTRACE_BENCH_ONLY").is_some_and(|v| v == "build") {
        let (lines, row) = build::run(&rtrace)?;
        println!();
        for line in lines {
            println!("{line}");
        }
        return Ok(row);
    }
    let fixture = CpuLoad::hotfuncs("hotfuncs");
    let dir = crate::root().join("target/bench");
    std::fs::create_dir_all(&dir)?;
    let data = dir.join("perf.data");
    let data_s = data.to_str().context("non-UTF-8 path")?.to_owned();
    let perf_ready = Ready::After(Duration::from_secs(1));
    // An older build to measure a change against (`RTRACE_BENCH_BASELINE`):
    // interleaved with this one, its BPF time a sample beside ours is what
    // the change costs in the kernel, the steadiest figure there is.
    let baseline = std::env::var_os("RTRACE_BENCH_BASELINE").map(std::path::PathBuf::from);
    let mut ratios = Vec::new();
    let mut against_baseline = Vec::new();
    let mut sampled_row = None;
    for hz in ["99", "999"] {
        let mut setups = vec![
            Setup::bare(),
            Setup::traced(
                format!("perf record -g -a -F {hz}"),
                "perf",
                &["record", "-q", "-g", "-a", "-F", hz, "-o", &data_s],
                perf_ready,
                None,
            ),
            Setup::traced(
                format!("rtrace profile -F {hz}"),
                &rtrace,
                &["profile", "-F", hz, "-f"],
                Ready::Stderr("Sampling"),
                None,
            ),
            perf_floor(hz, &data_s),
        ];
        if let Some(base) = &baseline {
            setups.push(Setup::traced(
                format!("baseline rtrace profile -F {hz}"),
                base,
                &["profile", "-F", hz, "-f"],
                Ready::Stderr("Sampling"),
                None,
            ));
        }
        // The per-sample stream (`--firefox`, `--samples`) beside the
        // same run without it: its BPF time a sample is the stream's cost.
        let stream = setups.len();
        let rows = dir.join("bench-samples.jsonl");
        setups.push(Setup::traced(
            format!("rtrace profile -F {hz} --samples F.jsonl"),
            &rtrace,
            &[
                "profile",
                "-F",
                hz,
                "--samples",
                rows.to_str().context("non-UTF-8 path")?,
            ],
            Ready::Stderr("Sampling"),
            None,
        ));
        eprintln!(
            "bench profile: {PROFILE_WORKERS} CPU-bound processes (frame pointers), \
             {PROFILE_MS} ms each, sampled at {hz} Hz on every CPU, \
             median of {TRIALS} interleaved trials"
        );
        let results = trials(&setups, STOLEN, || cpu_work(&fixture))?;
        print_costs(&setups, &results, STOLEN);
        ratios.push((hz, shares(&results, 2, 1, 3)));
        sampled_row = Some(Row::new(
            "profile",
            format!("2 CPU-bound processes with frame pointers, {hz} Hz"),
            STOLEN,
            (&setups, &results),
            (2, 1),
            None,
        ));
        // At F Hz a worker's millisecond holds F/1000 samples.
        let per_sample = |ns_per_ms: f64| ns_per_ms * 1000.0 / hz.parse::<f64>().unwrap_or(1.0);
        let (with, without) = (&results[stream], &results[2]);
        against_baseline.push(format!(
            "per-sample stream (--firefox, --samples) at {hz} Hz: BPF time {:.0} ns a sample \
             with it ({:.0}-{:.0}), {:.0} ({:.0}-{:.0}) without: {:.0} ns a sample",
            per_sample(with.bpf_ns),
            per_sample(with.bpf_spread.0),
            per_sample(with.bpf_spread.1),
            per_sample(without.bpf_ns),
            per_sample(without.bpf_spread.0),
            per_sample(without.bpf_spread.1),
            per_sample(with.bpf_ns - without.bpf_ns),
        ));
        // The baseline, where there is one, is setup 4.
        if let Some(base) = results.get(4).filter(|_| baseline.is_some()) {
            let ours = &results[2];
            against_baseline.push(format!(
                "at {hz} Hz rtrace's BPF time a sample is {:.3}x the baseline's: {:.0} \
                 ({:.0}-{:.0}) ns against {:.0} ({:.0}-{:.0}) ns",
                ours.bpf_ns / base.bpf_ns,
                ours.bpf_ns,
                ours.bpf_spread.0,
                ours.bpf_spread.1,
                base.bpf_ns,
                base.bpf_spread.0,
                base.bpf_spread.1
            ));
        }
    }
    if std::env::var_os("RTRACE_BENCH_ONLY").is_some_and(|v| v == "sampling") {
        println!();
        for line in &against_baseline {
            println!("{line}");
        }
        return sampled_row.context("no sampling trials");
    }

    // The report: from the signal to the last line, against perf's stop
    // plus `perf script` (folded-ready text) and `perf report`.
    eprintln!("bench profile: time from Ctrl-C to a finished report, 999 Hz, {TRIALS} trials");
    let (mut ours, mut perf_script, mut perf_report) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..TRIALS {
        let mut cmd = Command::new(&rtrace);
        cmd.args(["profile", "-F", "999", "-f"]);
        let t = Tracer::start(cmd, Ready::Stderr("Sampling"), Some(";".to_owned()))?;
        cpu_work(&fixture)?;
        let mut stacks = 0;
        ours.push(seconds(|| {
            stacks = t.stop()?.events;
            Ok(())
        })?);
        let mut cmd = Command::new("perf");
        cmd.args(["record", "-q", "-g", "-a", "-F", "999", "-o", &data_s]);
        let t = Tracer::start(cmd, perf_ready, None)?;
        cpu_work(&fixture)?;
        let stop = seconds(|| t.stop().map(drop))?;
        let quiet = |args: &[&str]| -> anyhow::Result<()> {
            let out = Command::new("perf").args(args).output()?;
            if !out.status.success() {
                bail!("perf {args:?}: {}", String::from_utf8_lossy(&out.stderr));
            }
            Ok(())
        };
        let script = seconds(|| quiet(&["script", "-i", &data_s]))?;
        let report = seconds(|| quiet(&["report", "--stdio", "-i", &data_s]))?;
        eprintln!(
            "  rtrace {:.3} s ({stacks} stacks); perf stop {stop:.3} s + script {script:.3} s, report {report:.3} s",
            ours.last().unwrap()
        );
        perf_script.push(stop + script);
        perf_report.push(stop + report);
    }
    let (ours, script, report) = (median(ours), median(perf_script), median(perf_report));
    let (mut unwinding, _) =
        profile_unwinding(&rtrace, &data_s, &CpuLoad::hotfuncs("hotfuncs_nofp"))?;
    let (python, row) = profile_unwinding(&rtrace, &data_s, &CpuLoad::python())?;
    unwinding.extend(python);
    let (cbuild, _) = build::run(&rtrace)?;
    unwinding.extend(cbuild);
    println!();
    for (
        hz,
        Shares {
            ratio,
            above,
            floor,
            peer_added,
        },
    ) in ratios
    {
        if peer_added <= 0.0 {
            println!(
                "at {hz} Hz neither tracer's cost rises above the run-to-run noise \
                 (perf's added cost {peer_added:.0} {STOLEN})"
            );
        } else {
            println!(
                "rtrace profile at {hz} Hz costs {ratio:.2}x what perf record -g costs (time \
                 taken in the sampled tasks' interrupts plus the tracer's own CPU); \
                 {above:.2}x above the sampling interrupt itself (perf with no stacks: \
                 {floor:.2}x of perf -g)"
            );
        }
    }
    println!(
        "report time: rtrace {ours:.3} s; perf record stop + perf script {script:.3} s ({:.2}x); \
         + perf report {report:.3} s ({:.2}x)",
        ours / script,
        ours / report
    );
    for line in unwinding.iter().chain(&against_baseline) {
        println!("{line}");
    }
    Ok(row)
}

/// The share of samples of `comm` in a folded profile whose stack holds a
/// frame ending in `frame`.
fn whole_share(folded: &str, comm: &str, frame: &str) -> (u64, u64) {
    let (mut whole, mut all) = (0, 0);
    for line in folded.lines() {
        let Some((stack, count)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(n) = count.parse::<u64>() else {
            continue;
        };
        let mut frames = stack.split(';');
        if frames.next() != Some(comm) {
            continue;
        }
        all += n;
        if frames.any(|f| f.ends_with(frame)) {
            whole += n;
        }
    }
    (whole, all)
}

/// The same share from `perf script` text: one block per sample, a
/// `comm pid ...` line then a frame per line.
fn perf_whole_share(script: &str, comm: &str, frame: &str) -> (u64, u64) {
    let (mut whole, mut all) = (0, 0);
    for block in script.split("\n\n") {
        let mut lines = block.lines().filter(|l| !l.trim().is_empty());
        let Some(head) = lines.next() else { continue };
        if head.split_whitespace().next() != Some(comm) {
            continue;
        }
        all += 1;
        if lines.any(|l| l.contains(frame)) {
            whole += 1;
        }
    }
    (whole, all)
}

/// A workload without frame pointers under perf's DWARF mode, perf's
/// frame-pointer mode and rtrace's CFI walk: the cost each adds (the
/// workload's slowdown, the tracer's own CPU and BPF time), samples lost,
/// the share of samples whose stacks reach main, the time from Ctrl-C to a
/// finished report, and rtrace's start-up and table memory.
/// The unwinding benchmark of `load` at 99 and 999 Hz: its report's
/// lines, and its row of `bench all` (999 Hz, against DWARF mode).
fn profile_unwinding(
    rtrace: &Path,
    data_s: &str,
    load: &CpuLoad,
) -> anyhow::Result<(Vec<String>, Row)> {
    let perf_ready = Ready::After(Duration::from_secs(1));
    let mut lines = Vec::new();
    let mut row = None;
    for hz in ["99", "999"] {
        let setups = vec![
            Setup::bare(),
            Setup::traced(
                format!("perf record --call-graph dwarf -a -F {hz}"),
                "perf",
                &perf_dwarf(hz, data_s),
                perf_ready,
                None,
            ),
            Setup::traced(
                format!("rtrace profile -F {hz} (CFI)"),
                rtrace,
                &["profile", "-F", hz, "-f"],
                Ready::Stderr("Sampling"),
                None,
            ),
            Setup::traced(
                format!("perf record -g -a -F {hz}"),
                "perf",
                &["record", "-q", "-g", "-a", "-F", hz, "-o", data_s],
                perf_ready,
                None,
            ),
            perf_floor(hz, data_s),
        ];
        eprintln!(
            "bench profile: {PROFILE_WORKERS} CPU-bound {} processes without frame pointers, \
             {PROFILE_MS} ms each, {hz} Hz on every CPU, median of {TRIALS} trials",
            load.comm
        );
        let results = trials(&setups, STOLEN, || cpu_work(load))?;
        print_costs(&setups, &results, STOLEN);
        row = Some(
            Row::new(
                "profile",
                format!(
                    "{PROFILE_WORKERS} busy {} without frame pointers, {hz} Hz, system-wide",
                    load.comm
                ),
                STOLEN,
                (&setups, &results),
                (2, 1),
                None,
            )
            .with_own_cpu(&results, (2, 1)),
        );
        let Shares {
            ratio,
            above,
            floor,
            peer_added: dwarf_added,
        } = shares(&results, 2, 1, 4);
        let (dwarf, ours) = (&results[1], &results[2]);
        lines.push(format!(
            "{}, no frame pointers, {hz} Hz: rtrace's BPF time {:.0} ns/ms (range {:.0}-{:.0}) \
             and own CPU {:.0} ns/ms; perf --call-graph dwarf's own CPU {:.0} ns/ms \
             (its copy of each sample's stack, made in the sampled task, is in the stolen time)",
            load.comm,
            ours.bpf_ns,
            ours.bpf_spread.0,
            ours.bpf_spread.1,
            ours.tracer_ns,
            dwarf.tracer_ns
        ));
        lines.push(if dwarf_added <= 0.0 {
            format!(
                "{}, {hz} Hz: perf's DWARF mode takes no time from the tasks above the noise",
                load.comm
            )
        } else {
            format!(
                "{}, {hz} Hz: rtrace (CFI in the kernel) costs {ratio:.2}x what perf record \
                 --call-graph dwarf costs (time taken in the sampled tasks' interrupts plus the \
                 tracer's own CPU; goal: at most 0.5x); above the sampling interrupt itself, \
                 which perf with no stacks already costs ({floor:.2}x of DWARF mode's), \
                 {above:.2}x",
                load.comm
            )
        });
    }
    // One run of each at 999 Hz: whole stacks, losses and report time.
    // The folded text is what the whole-stack share is read from, so this
    // run keeps its stdout.
    let mut cmd = Command::new(rtrace);
    cmd.args(["profile", "-v", "-F", "999", "-f"]);
    let t = Tracer::start_keeping(cmd, Ready::Stderr("Sampling"))?;
    cpu_work(load)?;
    let Stopped {
        stdout: folded,
        stderr,
        ready_in,
        report,
        ..
    } = t.stop()?;
    let (ours, ours_all) = whole_share(&folded, load.comm, load.main.0);
    let ours_lost = rtrace_lost(&stderr) + whole_share(&folded, load.comm, "[Missed User Stack]").0;
    let tables = stderr
        .lines()
        .find_map(|l| l.split_once("CFI tables: ").map(|(_, t)| t.to_owned()))
        .unwrap_or_else(|| "not reported".into());

    let mut cmd = Command::new("perf");
    cmd.args(perf_dwarf("999", data_s));
    let t = Tracer::start(cmd, perf_ready, None)?;
    cpu_work(load)?;
    let perf_stop = t.stop()?.report;
    let mut script = String::new();
    let script_time = seconds(|| {
        let out = Command::new("perf")
            .args(["script", "-i", data_s])
            .stderr(Stdio::null())
            .output()?;
        script = String::from_utf8_lossy(&out.stdout).into_owned();
        Ok(())
    })?;
    let (theirs, theirs_all) = perf_whole_share(&script, load.comm, load.main.1);
    let theirs_lost = perf_lost(data_s);
    let pct = |a: u64, b: u64| 100.0 * a as f64 / b.max(1) as f64;
    lines.push(format!(
        "{}, 999 Hz, whole stacks (reaching {}): rtrace {:.1}% of {ours_all}, \
         perf --call-graph dwarf {:.1}% of {theirs_all}; samples lost or without their stack: \
         rtrace {ours_lost}, perf {theirs_lost}",
        load.comm,
        load.main.0,
        pct(ours, ours_all),
        pct(theirs, theirs_all)
    ));
    let perf_total = perf_stop.as_secs_f64() + script_time;
    lines.push(format!(
        "{}, 999 Hz, Ctrl-C to finished report: rtrace {:.3} s; perf record stop + perf script \
         {perf_total:.3} s ({:.2}x; goal: at most 0.2x)",
        load.comm,
        report.as_secs_f64(),
        report.as_secs_f64() / perf_total
    ));
    lines.push(format!(
        "{}: rtrace from launch to sampling {:.0} ms (tables of processes that exist are built \
         as their first samples arrive); CFI tables {tables}",
        load.comm,
        ready_in.unwrap_or_default().as_secs_f64() * 1000.0
    ));
    Ok((lines, row.context("no rates measured")?))
}

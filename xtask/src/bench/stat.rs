//! `cargo xtask bench stat`: what counting every syscall tracepoint
//! system-wide costs, `rtrace stat -e 'syscalls:sys_enter_*' -a` against
//! `perf stat` with the same events, on a syscall-heavy workload (`perf
//! bench syscall basic`: getppid in a loop, which times itself). Bare,
//! under rtrace and under perf by turns; the time each adds a syscall,
//! each one's start-up time, and both counts of the workload's calls.

use std::{
    io::{BufRead as _, BufReader},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use super::{Ready, Tracer, measured_on, median, spread};

/// getppid calls a run makes.
const LOOPS: u64 = 5_000_000;
/// Interleaved rounds.
const ROUNDS: usize = 5;
const EVENTS: &str = "syscalls:sys_enter_*";

/// One run of the workload: nanoseconds a call.
fn workload() -> anyhow::Result<f64> {
    let out = Command::new("perf")
        .args(["bench", "syscall", "basic", "-l", &LOOPS.to_string()])
        .output()
        .context("cannot run perf bench (cargo xtask setup installs perf)")?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| {
            l.trim()
                .strip_suffix("usecs/op")?
                .trim()
                .parse::<f64>()
                .ok()
        })
        .map(|us| us * 1000.0)
        .with_context(|| format!("no usecs/op in perf bench's output: {text}"))
}

/// The getppid count in perf's CSV (rtrace's `-x,` or perf's).
fn getppid(csv: &str) -> anyhow::Result<u64> {
    csv.lines()
        .find(|l| l.contains(",syscalls:sys_enter_getppid,"))
        .and_then(|l| l.split(',').next()?.parse().ok())
        .with_context(|| format!("no getppid count in: {csv}"))
}

/// perf stat over the whole system, started disabled and enabled through
/// its control fifo: ready when it acknowledges.
fn perf_stat(dir: &std::path::Path) -> anyhow::Result<(std::process::Child, Duration, String)> {
    let (ctl, ack, out) = (dir.join("ctl"), dir.join("ack"), dir.join("perf-stat.csv"));
    for f in [&ctl, &ack] {
        let _ = std::fs::remove_file(f);
        let c = std::ffi::CString::new(f.to_str().context("non-UTF-8 path")?)?;
        // SAFETY: a valid path.
        if unsafe { libc::mkfifo(c.as_ptr(), 0o600) } != 0 {
            bail!("cannot make fifo {}", f.display());
        }
    }
    let launch = Instant::now();
    let child = Command::new("perf")
        .args(["stat", "-a", "-x,", "-D", "-1", "-e", EVENTS, "--control"])
        .arg(format!("fifo:{},{}", ctl.display(), ack.display()))
        .arg("-o")
        .arg(&out)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("cannot start perf stat")?;
    std::fs::write(&ctl, "enable\n")?;
    let mut line = String::new();
    BufReader::new(std::fs::File::open(&ack)?).read_line(&mut line)?;
    if line.trim() != "ack" {
        bail!("perf stat answered {line:?}");
    }
    Ok((child, launch.elapsed(), out.to_string_lossy().into_owned()))
}

/// Runs the benchmark; the table for `docs/benchmarks.md`.
pub fn run() -> anyhow::Result<String> {
    let rtrace = crate::build()?;
    let dir = crate::root().join("target/bench");
    std::fs::create_dir_all(&dir)?;
    eprintln!(
        "bench stat: {LOOPS} getppid calls (perf bench syscall basic), bare, under rtrace stat \
         and under perf stat -e '{EVENTS}' -a, {ROUNDS} interleaved rounds"
    );
    let (mut bare, mut ours, mut theirs) = (Vec::new(), Vec::new(), Vec::new());
    let (mut our_start, mut their_start) = (Vec::new(), Vec::new());
    let (mut our_counts, mut their_counts) = (Vec::new(), Vec::new());
    for round in 1..=ROUNDS {
        let b = workload()?;
        bare.push(b);
        let mut cmd = Command::new(&rtrace);
        cmd.args(["stat", "-a", "-x,", "-e", EVENTS]);
        let tracer = Tracer::start_keeping(cmd, Ready::Stderr("Counting"))?;
        let r = workload()?;
        let stopped = tracer.stop()?;
        ours.push(r - b);
        our_start.push(stopped.ready_in.unwrap_or_default().as_secs_f64());
        our_counts.push(getppid(&stopped.stdout)?);
        let (mut perf, ready, out) = perf_stat(&dir)?;
        let p = workload()?;
        // SAFETY: signalling our own child.
        unsafe { libc::kill(perf.id() as i32, libc::SIGINT) };
        perf.wait()?;
        theirs.push(p - b);
        their_start.push(ready.as_secs_f64());
        their_counts.push(getppid(&std::fs::read_to_string(&out)?)?);
        eprintln!(
            "  round {round}: bare {b:.1} ns/call; rtrace +{:.1} ns, perf +{:.1} ns; \
             start-up {:.3} s vs {:.3} s; getppid {} vs {}",
            r - b,
            p - b,
            our_start[round - 1],
            their_start[round - 1],
            our_counts[round - 1],
            their_counts[round - 1],
        );
    }
    let row = |label: &str, v: &[f64], unit: &str, digits: usize| {
        let (lo, hi) = spread(v);
        let m = median(v.to_vec());
        format!("{label} {m:.digits$} {unit} ({lo:.digits$}-{hi:.digits$})")
    };
    let ratio = median(ours.clone()) / median(theirs.clone());
    let start_ratio = median(our_start.clone()) / median(their_start.clone());
    let mut out = format!(
        "{} ({LOOPS} getppid calls by `perf bench syscall basic` a run; medians of {ROUNDS} \
         interleaved rounds, ranges in parentheses):\n\n",
        measured_on("stat")
    );
    out.push_str("| | rtrace stat | perf stat | rtrace / perf |\n| --- | --- | --- | --- |\n");
    out.push_str(&format!(
        "| added time a syscall | {} | {} | {ratio:.2}x |\n",
        row("", &ours, "ns", 1).trim(),
        row("", &theirs, "ns", 1).trim(),
    ));
    out.push_str(&format!(
        "| start-up (launch to counting) | {} | {} | {start_ratio:.2}x |\n",
        row("", &our_start, "s", 3).trim(),
        row("", &their_start, "s", 3).trim(),
    ));
    out.push_str(&format!(
        "\nThe bare workload: {}. getppid counted system-wide, the workload's {LOOPS} and \
         any others': rtrace {:?}, perf {:?}.\n",
        row("", &bare, "ns a call", 1).trim(),
        our_counts,
        their_counts,
    ));
    println!("\n{out}");
    Ok(out)
}

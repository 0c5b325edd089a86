//! Overhead benchmarks. Each case runs the same workload bare, under rtrace
//! and under the peer in one run, interleaved, and reports ratios: absolute
//! times on shared machines are noise, ratios measured side by side are not.

use std::{
    io::{BufRead, BufReader, Read, Write},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    thread::JoinHandle,
    time::Duration,
};

use anyhow::{Context as _, bail};

/// Ping-pong round trips per trial: about a second bare.
const ROUNDS: u64 = 200_000;
/// Execs per worker per trial of the exec storm.
const EXECS: u64 = 1_500;
/// Exec storm workers: one per core of these machines.
const EXEC_WORKERS: u64 = 2;
/// Trials per configuration; the median is reported.
const TRIALS: usize = 5;

/// Runs the named benchmark, or all.
pub fn run(name: Option<&str>) -> anyhow::Result<()> {
    match name {
        None => {
            runqlat()?;
            execsnoop()
        }
        Some("runqlat") => runqlat(),
        Some("execsnoop") => execsnoop(),
        Some(other) => bail!("unknown benchmark {other}; known: runqlat, execsnoop"),
    }
}

/// Where a tracer says it has started: a line with this prefix on stdout or
/// on stderr.
#[derive(Clone, Copy)]
enum Ready {
    Stdout(&'static str),
    Stderr(&'static str),
}

/// A tracer running while the workload plays.
struct Tracer {
    child: Child,
    /// Counts stdout lines containing the needle, until stdout closes.
    stdout: JoinHandle<u64>,
    /// Collects stderr, until it closes.
    stderr: JoinHandle<String>,
}

/// What a tracer printed, once stopped.
struct Stopped {
    /// Its stdout lines that contained the needle.
    events: u64,
    /// Its stderr.
    stderr: String,
}

/// Reads `stream` line by line in a thread: `ready` is told when a line
/// starts with `prefix`; every line goes to `each`.
fn watch<R: Read + Send + 'static, T: Send + 'static>(
    stream: R,
    ready: Option<(&'static str, mpsc::Sender<()>)>,
    mut state: T,
    mut each: impl FnMut(&mut T, &str) + Send + 'static,
) -> JoinHandle<T> {
    std::thread::spawn(move || {
        let mut ready = ready;
        for line in BufReader::new(stream).lines() {
            let Ok(line) = line else { break };
            if let Some((prefix, tx)) = &ready
                && line.starts_with(prefix)
            {
                let _ = tx.send(());
                ready = None;
            }
            each(&mut state, &line);
        }
        state
    })
}

impl Tracer {
    /// Starts `cmd`, counting stdout lines that contain `needle`, and waits
    /// until it is ready.
    fn start(mut cmd: Command, ready: Ready, needle: Option<String>) -> anyhow::Result<Self> {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .with_context(|| format!("cannot start {cmd:?}"))?;
        let (tx, rx) = mpsc::channel();
        let (on_out, on_err) = match ready {
            Ready::Stdout(p) => (Some((p, tx)), None),
            Ready::Stderr(p) => (None, Some((p, tx))),
        };
        let stdout = watch(
            child.stdout.take().unwrap(),
            on_out,
            0u64,
            move |n, line| {
                if needle.as_deref().is_some_and(|s| line.contains(s)) {
                    *n += 1;
                }
            },
        );
        let stderr = watch(
            child.stderr.take().unwrap(),
            on_err,
            String::new(),
            |s, line| {
                s.push_str(line);
                s.push('\n');
            },
        );
        if rx.recv_timeout(Duration::from_secs(60)).is_err() {
            let _ = child.kill();
            let _ = child.wait();
            let err = stderr.join().unwrap_or_default();
            bail!("{cmd:?} did not start tracing: {err}");
        }
        Ok(Self {
            child,
            stdout,
            stderr,
        })
    }

    fn stop(mut self) -> anyhow::Result<Stopped> {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        self.child.wait()?;
        Ok(Stopped {
            events: self.stdout.join().unwrap_or(0),
            stderr: self.stderr.join().unwrap_or_default(),
        })
    }
}

/// One way of running the workload: bare (`start` is `None`) or under a
/// tracer.
struct Setup {
    label: String,
    start: Option<Box<dyn Fn() -> anyhow::Result<Tracer>>>,
}

impl Setup {
    fn bare() -> Self {
        Self {
            label: "bare".into(),
            start: None,
        }
    }

    fn traced(
        label: impl Into<String>,
        program: impl AsRef<Path>,
        args: &[&str],
        ready: Ready,
        needle: Option<&str>,
    ) -> Self {
        let program = program.as_ref().to_path_buf();
        let args: Vec<String> = args.iter().map(|&a| a.to_owned()).collect();
        let needle = needle.map(str::to_owned);
        Self {
            label: label.into(),
            start: Some(Box::new(move || {
                let mut cmd = Command::new(&program);
                cmd.args(&args);
                Tracer::start(cmd, ready, needle.clone())
            })),
        }
    }

    /// libbpf-tools' `tool`, started through stdbuf: those tools never
    /// flush stdout, so their lines (the header included) would not reach
    /// the pipe.
    fn libbpf_tools(tool: &str, ready: Ready, needle: Option<&str>) -> anyhow::Result<Self> {
        let path = libbpf_tool(tool)?;
        let path = path.to_str().context("non-UTF-8 tool path")?;
        Ok(Self::traced(
            format!("libbpf-tools {tool}"),
            "stdbuf",
            &["-oL", path],
            ready,
            needle,
        ))
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Runs every setup `TRIALS` times, interleaved, timing `workload` (which
/// returns the cost of one operation); returns each setup's median and the
/// events its tracer counted in each trial.
fn trials(
    setups: &[Setup],
    unit: &str,
    workload: impl Fn() -> anyhow::Result<f64>,
) -> anyhow::Result<Vec<(f64, Vec<Stopped>)>> {
    let mut samples: Vec<(Vec<f64>, Vec<Stopped>)> =
        setups.iter().map(|_| (Vec::new(), Vec::new())).collect();
    for trial in 0..TRIALS {
        for (i, s) in setups.iter().enumerate() {
            let tracer = s.start.as_ref().map(|f| f()).transpose()?;
            // Let attach-time work settle before timing.
            std::thread::sleep(Duration::from_millis(200));
            let cost = workload()?;
            if let Some(t) = tracer {
                samples[i].1.push(t.stop()?);
            }
            eprintln!("  trial {}: {:<40} {cost:>10.0} {unit}", trial + 1, s.label);
            samples[i].0.push(cost);
        }
    }
    Ok(samples
        .into_iter()
        .map(|(costs, stops)| (median(costs), stops))
        .collect())
}

/// Prints the table of added cost per setup; setup 0 is bare and setup 1
/// the peer. Returns rtrace's default (setup 2) ratio to the peer.
fn report(setups: &[Setup], medians: &[f64], unit: &str) -> f64 {
    let bare = medians[0];
    let peer_added = medians[1] - bare;
    println!();
    println!(
        "{:<40} {:>14} {:>12} {:>14}",
        "configuration",
        unit,
        format!("added {}", unit.split('/').next().unwrap_or(unit)),
        "added vs peer"
    );
    for (s, &m) in setups.iter().zip(medians) {
        let added = m - bare;
        let ratio = if s.start.is_none() {
            String::from("-")
        } else {
            format!("{:.2}", added / peer_added)
        };
        println!("{:<40} {m:>14.0} {added:>12.0} {ratio:>14}", s.label);
    }
    (medians[2] - bare) / peer_added
}

/// The peer's binary in libbpf-tools.
fn libbpf_tool(name: &str) -> anyhow::Result<PathBuf> {
    ["/usr/sbin", "/usr/bin"]
        .into_iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| p.exists())
        .with_context(|| format!("libbpf-tools' {name} is missing (Debian package libbpf-tools)"))
}

/// Plays one ping-pong game; returns nanoseconds per round trip.
fn pingpong(workload: &Path) -> anyhow::Result<f64> {
    let mut child = Command::new(workload)
        .args([ROUNDS.to_string(), "0".into()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("cannot start pingpong")?;
    let mut stdin = child.stdin.take().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line)?;
    writeln!(stdin, "go")?;
    line.clear();
    out.read_line(&mut line)?;
    drop(stdin);
    child.wait()?;
    let ns: f64 = line
        .strip_prefix("done ")
        .and_then(|v| v.trim().parse().ok())
        .with_context(|| format!("pingpong said {line:?}"))?;
    Ok(ns / ROUNDS as f64)
}

fn runqlat() -> anyhow::Result<()> {
    let rtrace = crate::build()?;
    let workload = crate::root().join("target/release/pingpong");
    let mut setups = vec![
        Setup::bare(),
        Setup::libbpf_tools("runqlat", Ready::Stdout("Tracing"), None)?,
    ];
    // The default comes first: the target is judged on it.
    let variants: [(&str, &[&str]); 4] = [
        ("default", &[]),
        (
            "tp_btf, hash map",
            &["--attach", "tp_btf", "--no-task-storage"],
        ),
        ("raw_tracepoint", &["--attach", "raw_tracepoint"]),
        ("tracepoint", &["--attach", "tracepoint"]),
    ];
    for (what, args) in variants {
        let mut all = vec!["runqlat"];
        all.extend_from_slice(args);
        setups.push(Setup::traced(
            format!("rtrace runqlat ({what})"),
            &rtrace,
            &all,
            Ready::Stderr("Tracing"),
            None,
        ));
    }
    eprintln!(
        "bench runqlat: ping-pong of two threads pinned to CPU 0, {ROUNDS} round trips, \
         median of {TRIALS} interleaved trials"
    );
    let results = trials(&setups, "ns/round trip", || pingpong(&workload))?;
    let medians: Vec<f64> = results.iter().map(|r| r.0).collect();
    let ratio = report(&setups, &medians, "ns/round trip");
    println!();
    println!(
        "target: rtrace (default attach) adds at most 0.50x what libbpf-tools adds: {ratio:.2}x, {}",
        if ratio <= 0.5 { "met" } else { "NOT met" }
    );
    Ok(())
}

/// Runs the exec storm; returns microseconds per exec.
fn exec_storm(workload: &Path, program: &Path) -> anyhow::Result<f64> {
    let out = Command::new(workload)
        .arg(EXECS.to_string())
        .arg(EXEC_WORKERS.to_string())
        .arg(program)
        .output()
        .context("cannot start execstorm")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let ns: f64 = text
        .trim()
        .strip_prefix("done ")
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("execstorm said {text:?}"))?;
    Ok(ns / 1000.0 / (EXECS * EXEC_WORKERS) as f64)
}

fn execsnoop() -> anyhow::Result<()> {
    let rtrace = crate::build()?;
    let workload = crate::root().join("target/release/execstorm");
    // A copy of `true` under a name nothing else runs, to count events by.
    let dir = crate::root().join("target/bench");
    std::fs::create_dir_all(&dir)?;
    let program = dir.join("rtrace_storm");
    std::fs::copy("/bin/true", &program).context("cannot copy /bin/true")?;
    // The workers' argument: in text and in JSON alike, and absent from the
    // storm's own command line, which names the program too.
    let needle = "storm-";
    let setups = vec![
        Setup::bare(),
        Setup::libbpf_tools("execsnoop", Ready::Stdout("PCOMM"), Some(needle))?,
        Setup::traced(
            "rtrace execsnoop",
            &rtrace,
            &["execsnoop"],
            Ready::Stderr("Tracing"),
            Some(needle),
        ),
        Setup::traced(
            "rtrace execsnoop --json",
            &rtrace,
            &["execsnoop", "--json"],
            Ready::Stderr("Tracing"),
            Some(needle),
        ),
    ];
    let expected = EXECS * EXEC_WORKERS;
    eprintln!(
        "bench execsnoop: {EXEC_WORKERS} workers each exec {EXECS} times as fast as they can, \
         median of {TRIALS} interleaved trials"
    );
    let results = trials(&setups, "us/exec", || exec_storm(&workload, &program))?;
    let medians: Vec<f64> = results.iter().map(|r| r.0).collect();
    let ratio = report(&setups, &medians, "us/exec");
    println!();
    println!("events seen per trial (expected {expected}; fewer means lost):");
    for (s, (_, stops)) in setups.iter().zip(&results).skip(1) {
        let seen: Vec<String> = stops.iter().map(|t| t.events.to_string()).collect();
        let warned = stops.iter().any(|t| t.stderr.contains("lost"));
        println!(
            "  {:<40} {}{}",
            s.label,
            seen.join(" "),
            if warned {
                "  (reported lost events)"
            } else {
                ""
            }
        );
    }
    let rtrace_lost = results[2]
        .1
        .iter()
        .chain(&results[3].1)
        .any(|t| t.events != expected);
    println!();
    println!(
        "rtrace adds {ratio:.2}x what libbpf-tools adds per exec; events lost: {}",
        if rtrace_lost { "SOME" } else { "none" }
    );
    Ok(())
}

//! Overhead benchmarks. Each case runs the same workload bare, under rtrace
//! and under the peer in one run, interleaved, and reports ratios: absolute
//! times on shared machines are noise, ratios measured side by side are not.

use std::{
    io::{BufRead, BufReader, Write},
    process::{Child, Command, Stdio},
    time::Duration,
};

use anyhow::{Context as _, bail};

/// Round trips per trial: about a second bare.
const ROUNDS: u64 = 200_000;
/// Trials per configuration; the median is reported.
const TRIALS: usize = 5;

/// Runs the named benchmark, or all.
pub fn run(name: Option<&str>) -> anyhow::Result<()> {
    match name {
        None | Some("runqlat") => runqlat(),
        Some(other) => bail!("unknown benchmark {other}; known: runqlat"),
    }
}

/// A tracer running while the workload plays.
struct Tracer {
    child: Child,
}

impl Tracer {
    /// Starts `cmd` and waits for `ready` on the given stream.
    fn start(mut cmd: Command, ready_on_stderr: bool) -> anyhow::Result<Self> {
        cmd.stdin(Stdio::null());
        if ready_on_stderr {
            cmd.stdout(Stdio::null()).stderr(Stdio::piped());
        } else {
            cmd.stdout(Stdio::piped()).stderr(Stdio::null());
        }
        let mut child = cmd
            .spawn()
            .with_context(|| format!("cannot start {cmd:?}"))?;
        let stream: Box<dyn std::io::Read + Send> = if ready_on_stderr {
            Box::new(child.stderr.take().unwrap())
        } else {
            Box::new(child.stdout.take().unwrap())
        };
        let mut lines = BufReader::new(stream).lines();
        loop {
            match lines.next() {
                Some(Ok(l)) if l.starts_with("Tracing") => break,
                Some(_) => {}
                None => bail!("{cmd:?} exited before it started tracing"),
            }
        }
        // Keep draining so the tracer never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Ok(Self { child })
    }

    fn stop(mut self) -> anyhow::Result<()> {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        self.child.wait()?;
        Ok(())
    }
}

/// Plays one ping-pong game; returns nanoseconds per round trip.
fn pingpong(workload: &std::path::Path) -> anyhow::Result<f64> {
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

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn runqlat() -> anyhow::Result<()> {
    let rtrace = crate::build()?;
    let workload = crate::root().join("target/release/pingpong");
    let peer = ["/usr/sbin/runqlat", "/usr/bin/runqlat"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .context("libbpf-tools' runqlat is missing (Debian package libbpf-tools)")?;

    // (label, how to start the tracer; None = bare)
    type Start = Box<dyn Fn() -> anyhow::Result<Tracer>>;
    let mut configs: Vec<(String, Option<Start>)> = vec![("bare".into(), None)];
    configs.push((
        "libbpf-tools runqlat".into(),
        Some(Box::new(move || {
            // stdbuf: libbpf-tools never flushes, so its "Tracing" line
            // would not reach the pipe otherwise.
            let mut cmd = Command::new("stdbuf");
            cmd.args(["-oL", peer]);
            Tracer::start(cmd, false)
        })),
    ));
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
        let bin = rtrace.clone();
        configs.push((
            format!("rtrace runqlat ({what})"),
            Some(Box::new(move || {
                let mut cmd = Command::new(&bin);
                cmd.arg("runqlat").args(args);
                Tracer::start(cmd, true)
            })),
        ));
    }

    eprintln!(
        "bench runqlat: ping-pong of two threads pinned to CPU 0, {ROUNDS} round trips, \
         median of {TRIALS} interleaved trials"
    );
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); configs.len()];
    for trial in 0..TRIALS {
        for (i, (label, start)) in configs.iter().enumerate() {
            let tracer = start.as_ref().map(|s| s()).transpose()?;
            // Let attach-time work settle before timing.
            std::thread::sleep(Duration::from_millis(200));
            let ns = pingpong(&workload)?;
            if let Some(t) = tracer {
                t.stop()?;
            }
            eprintln!("  trial {}: {label:<32} {ns:>8.0} ns/round trip", trial + 1);
            samples[i].push(ns);
        }
    }
    let medians: Vec<f64> = samples.into_iter().map(median).collect();
    let bare = medians[0];
    let peer_added = medians[1] - bare;
    println!();
    println!(
        "{:<32} {:>14} {:>10} {:>16}",
        "configuration", "ns/round trip", "added ns", "added vs peer"
    );
    for ((label, _), &m) in configs.iter().zip(&medians) {
        let added = m - bare;
        let ratio = if label == "bare" {
            String::from("-")
        } else {
            format!("{:.2}", added / peer_added)
        };
        println!("{label:<32} {m:>14.0} {added:>10.0} {ratio:>16}");
    }
    let best = medians[2] - bare;
    let ratio = best / peer_added;
    println!();
    println!(
        "target: rtrace (default attach) adds at most 0.50x what libbpf-tools adds: {:.2}x, {}",
        ratio,
        if ratio <= 0.5 { "met" } else { "NOT met" }
    );
    Ok(())
}

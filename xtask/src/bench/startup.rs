//! `cargo xtask bench startup`: how fast each tool is tracing, how fast the
//! first event shows, and how much memory it holds once attached, against
//! libbpf-tools' tool of the same name in the same run.

use std::{
    io::{BufRead as _, BufReader},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::Context as _;

use super::{libbpf_tool, measured_on, median};

/// Rounds per tracer, interleaved.
const ROUNDS: usize = 7;
/// How long after attaching resident memory is read: long enough for a
/// tool to settle into its loop.
const SETTLE: Duration = Duration::from_secs(1);

/// One tool as both tracers run it.
struct Case {
    tool: &'static str,
    /// Arguments for both (bcc's flags).
    args: &'static [&'static str],
    /// The start of the line libbpf-tools' tool prints once it traces (on
    /// stdout), or `None` where it has no such tool or it cannot run here.
    peer: Option<&'static str>,
    /// A command that makes an event the tool prints, with a marker its
    /// line contains; `None` for tools that print per interval or at exit.
    event: Option<(&'static [&'static str], &'static str)>,
}

const CASES: [Case; 8] = [
    Case {
        tool: "runqlat",
        args: &[],
        peer: Some("Tracing"),
        event: None,
    },
    Case {
        tool: "biolatency",
        args: &[],
        peer: Some("Tracing"),
        event: None,
    },
    Case {
        tool: "execsnoop",
        args: &[],
        peer: Some("PCOMM"),
        event: Some((
            &["/bin/echo", "rtrace-startup-marker"],
            "rtrace-startup-marker",
        )),
    },
    Case {
        tool: "tcplife",
        args: &[],
        peer: Some("PID"),
        event: None,
    },
    Case {
        tool: "gethostlatency",
        args: &[],
        peer: Some("TIME"),
        event: Some((&["getent", "hosts", "localhost"], "localhost")),
    },
    // libbpf-tools' ext4slower needs fentry or kprobes, which this host
    // lacks.
    Case {
        tool: "ext4slower",
        args: &[],
        peer: None,
        event: None,
    },
    Case {
        tool: "argdist",
        args: &["-C", "t:syscalls:sys_enter_write():u64:args->count"],
        peer: None,
        event: None,
    },
    // Debian's libbpf-tools has no profile.
    Case {
        tool: "profile",
        args: &[],
        peer: None,
        event: None,
    },
];

/// What one run of a tracer showed.
struct Run {
    /// Launch to the banner, which follows attaching.
    attach_ms: f64,
    /// Launch to the first event's line, when the case has events.
    first_event_ms: Option<f64>,
    /// Resident memory once attached, without event buffer mappings.
    rss_kib: u64,
    /// Resident pages of the event buffers (ring or perf), mapped from the
    /// kernel: not the tracer's own memory, and sized by `--buffer-size`.
    buffers_kib: u64,
}

/// Resident memory of `pid` in KiB: (all but BPF and perf buffer mappings,
/// those mappings).
fn resident(pid: u32) -> anyhow::Result<(u64, u64)> {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps"))
        .with_context(|| format!("cannot read /proc/{pid}/smaps"))?;
    let (mut own, mut buffers) = (0, 0);
    let mut buffer = false;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if first.contains('-') && !first.ends_with(':') {
            buffer = line.contains("anon_inode:bpf") || line.contains("[perf_event]");
        } else if let Some(kb) = line.strip_prefix("Rss:") {
            let kb: u64 = kb.trim().trim_end_matches("kB").trim().parse().unwrap_or(0);
            if buffer {
                buffers += kb;
            } else {
                own += kb;
            }
        }
    }
    Ok((own, buffers))
}

/// Starts `cmd`, waits for a stdout or stderr line starting with `ready`
/// and, if given, one containing `event` (whose command is run until it
/// shows), then reads the tracer's memory and stops it.
fn once(
    mut cmd: Command,
    ready: &'static str,
    event: Option<(&'static [&'static str], &'static str)>,
) -> anyhow::Result<Run> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let started = Instant::now();
    let mut child: Child = cmd
        .spawn()
        .with_context(|| format!("cannot start {cmd:?}"))?;
    let (tx, rx) = mpsc::channel::<(bool, Instant)>();
    let needle = event.map(|(_, n)| n);
    for (out, stream) in [
        (
            true,
            Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
        ),
        (false, Box::new(child.stderr.take().unwrap())),
    ] {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines() {
                let Ok(line) = line else { break };
                if line.starts_with(ready) {
                    let _ = tx.send((true, Instant::now()));
                } else if out && needle.is_some_and(|n| line.contains(n)) {
                    let _ = tx.send((false, Instant::now()));
                }
            }
        });
    }
    let stop = |child: &mut Child| {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
        let _ = child.wait();
    };
    let mut attached = None;
    let mut first = None;
    let deadline = Instant::now() + Duration::from_secs(30);
    while attached.is_none() || (event.is_some() && first.is_none()) {
        if Instant::now() > deadline {
            stop(&mut child);
            anyhow::bail!("{cmd:?} did not start tracing within 30 s");
        }
        if attached.is_some()
            && let Some((argv, _)) = event
        {
            Command::new(argv[0])
                .args(&argv[1..])
                .stdout(Stdio::null())
                .status()
                .with_context(|| format!("cannot run {}", argv[0]))?;
        }
        match rx.recv_timeout(Duration::from_millis(20)) {
            Ok((true, at)) => attached = Some(at),
            Ok((false, at)) => first = Some(at),
            Err(_) => {}
        }
    }
    std::thread::sleep(SETTLE);
    let (rss_kib, buffers_kib) = resident(child.id())?;
    stop(&mut child);
    let ms = |at: Instant| at.duration_since(started).as_secs_f64() * 1e3;
    Ok(Run {
        attach_ms: ms(attached.expect("waited for")),
        first_event_ms: first.map(ms),
        rss_kib,
        buffers_kib,
    })
}

fn fmt_spread(v: &[f64]) -> String {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    format!("{:.0} ({:.0}-{:.0})", v[v.len() / 2], v[0], v[v.len() - 1])
}

/// Runs the start-up and memory benchmark; returns its table for
/// docs/benchmarks.md, with the line saying where it was measured.
pub fn run() -> anyhow::Result<String> {
    let rtrace = crate::build()?;
    eprintln!(
        "bench startup: launch to attached, to the first event, and resident memory {} s \
         after attaching; median (min-max) of {ROUNDS} interleaved rounds",
        SETTLE.as_secs()
    );
    println!(
        "{:<15} {:>18} {:>18} {:>7} {:>16} {:>16} {:>9} {:>9} {:>9}",
        "tool",
        "rtrace ms",
        "libbpf-tools ms",
        "ratio",
        "rtrace 1st ev",
        "peer 1st ev",
        "rss MiB",
        "bufs MiB",
        "peer MiB"
    );
    let mut worst_ratio: f64 = 0.0;
    let mut worst_rss: (f64, &str) = (0.0, "");
    // The same figures as a Markdown table, for docs/benchmarks.md.
    let mut table = String::from(
        "| tool | rtrace to attached | libbpf-tools | rtrace to the first event | libbpf-tools \
         | rtrace resident (buffers apart) | libbpf-tools resident |\n\
         | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    for case in CASES {
        let peer = case
            .peer
            .map(|p| libbpf_tool(case.tool).map(|t| (t, p)))
            .transpose()?;
        let mut mine: Vec<Run> = Vec::new();
        let mut theirs: Vec<Run> = Vec::new();
        for _ in 0..ROUNDS {
            let mut cmd = Command::new(&rtrace);
            cmd.arg(case.tool).args(case.args);
            mine.push(once(cmd, banner(case.tool), case.event)?);
            if let Some((path, ready)) = &peer {
                // libbpf-tools never flush stdout, so stdbuf line-buffers it.
                let mut cmd = Command::new("stdbuf");
                cmd.arg("-oL").arg(path).args(case.args);
                theirs.push(once(cmd, ready, case.event)?);
            }
        }
        let attach = |r: &[Run]| r.iter().map(|r| r.attach_ms).collect::<Vec<_>>();
        let spread = |v: Vec<f64>| {
            if v.is_empty() {
                "-".to_owned()
            } else {
                fmt_spread(&v)
            }
        };
        let first = |r: &[Run]| spread(r.iter().filter_map(|r| r.first_event_ms).collect());
        let mib = |r: &[Run], f: fn(&Run) -> u64| {
            if r.is_empty() {
                "-".to_owned()
            } else {
                format!(
                    "{:.1}",
                    median(r.iter().map(|r| f(r) as f64 / 1024.0).collect())
                )
            }
        };
        let ratio = if theirs.is_empty() {
            "-".to_owned()
        } else {
            let ratio = median(attach(&mine)) / median(attach(&theirs));
            worst_ratio = worst_ratio.max(ratio);
            format!("{ratio:.2}")
        };
        let rss = median(mine.iter().map(|r| r.rss_kib as f64 / 1024.0).collect());
        if case.tool != "profile" && rss > worst_rss.0 {
            worst_rss = (rss, case.tool);
        }
        println!(
            "{:<15} {:>18} {:>18} {:>7} {:>16} {:>16} {:>9.1} {:>9} {:>9}",
            case.tool,
            fmt_spread(&attach(&mine)),
            spread(attach(&theirs)),
            ratio,
            first(&mine),
            first(&theirs),
            rss,
            mib(&mine, |r| r.buffers_kib),
            mib(&theirs, |r| r.rss_kib + r.buffers_kib),
        );
        let ms = |s: String| if s == "-" { s } else { format!("{s} ms") };
        let bufs = median(mine.iter().map(|r| r.buffers_kib as f64 / 1024.0).collect());
        let peer_mib = mib(&theirs, |r| r.rss_kib + r.buffers_kib);
        table.push_str(&format!(
            "| {} | {} | {} | {} | {} | {rss:.1} MiB{} | {} |\n",
            case.tool,
            ms(fmt_spread(&attach(&mine))),
            ms(spread(attach(&theirs))),
            ms(first(&mine)),
            ms(first(&theirs)),
            if bufs > 0.0 {
                format!(" (+{bufs:.1} MiB buffers)")
            } else {
                String::new()
            },
            if peer_mib == "-" {
                peer_mib
            } else {
                format!("{peer_mib} MiB")
            },
        ));
    }
    println!();
    println!(
        "target: start-up no slower than libbpf-tools: worst ratio {worst_ratio:.2}, {}",
        if worst_ratio <= 1.0 { "met" } else { "NOT met" }
    );
    println!(
        "target: at most 20 MiB resident (event buffers apart) for every tool but profile: \
         largest {:.1} MiB ({}), {}",
        worst_rss.0,
        worst_rss.1,
        if worst_rss.0 <= 20.0 {
            "met"
        } else {
            "NOT met"
        }
    );
    Ok(format!(
        "Start-up and memory, measured with {}; medians of {ROUNDS} interleaved rounds, \
         ranges in brackets; - where libbpf-tools has no such tool that runs here:\n\n{table}",
        measured_on("startup")
    ))
}

/// The start of the line each tool prints once it traces (rtrace on
/// stderr, libbpf-tools on stdout), as bcc words it.
fn banner(tool: &str) -> &'static str {
    match tool {
        "profile" => "Sampling",
        _ => "Tracing",
    }
}

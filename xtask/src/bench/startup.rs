//! `cargo xtask bench startup`: how fast each tool is tracing, how fast the
//! first event shows, and how much memory it holds once attached, against
//! libbpf-tools' tool of the same name in the same run; then how large
//! rtrace's binary is beside libbpf-tools' binaries of the same tools.
//!
//! Memory is checked against the goal of at most 20 MB resident as `ps`
//! counts it (VmRSS, the event buffers' pages included) for every tool it
//! launches but profile (offcputime, fsslower and the exporter are not
//! launched here): a tool over it fails the benchmark.

use std::{
    io::{BufRead as _, BufReader},
    path::Path,
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use super::{libbpf_tool, measured_on, median};

/// Rounds per tracer, interleaved.
const ROUNDS: usize = 7;
/// How long after attaching resident memory is read: long enough for a
/// tool to settle into its loop.
const SETTLE: Duration = Duration::from_secs(1);
/// The goal: at most 20 MB (decimal, so 19.1 MiB) resident as `ps` counts
/// it, in the worst round, for every tool but [`NO_RESIDENT_GOAL`].
const RESIDENT_GOAL: u64 = 20_000_000;
/// The tool the resident goal leaves out: its CFI tables are sized to the
/// binaries it unwinds.
const NO_RESIDENT_GOAL: &str = "profile";
/// The goal for `target/release/rtrace`: at most 12 MB (decimal).
const RELEASE_GOAL: u64 = 12_000_000;
/// The goal for the static, stripped `target/dist/rtrace`: at most 11 MB.
const STATIC_GOAL: u64 = 11_000_000;
/// The most a tool may start slower than the baseline build
/// (`RTRACE_BENCH_BASELINE`), in milliseconds: the price of taking its
/// objects out, judged on the medians.
const BASELINE_SLOWER_MS: f64 = 5.0;
/// libbpf-tools' binaries of the tools rtrace has, for the size table.
const PEER_BINARIES: [&str; 7] = [
    "runqlat",
    "biolatency",
    "execsnoop",
    "tcplife",
    "gethostlatency",
    "offcputime",
    "ext4slower",
];

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

const CASES: [Case; 12] = [
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
    // The same with the walk through one runtime's frames loaded at the
    // start, as a run with that runtime alone in scope loads it, and with
    // the walk through every runtime's, as one with two or more loads it:
    // what each adds to the start.
    Case {
        tool: "profile",
        args: &["--preload-runtime-walks=python"],
        peer: None,
        event: None,
    },
    Case {
        tool: "profile",
        args: &["--preload-runtime-walks=java"],
        peer: None,
        event: None,
    },
    Case {
        tool: "profile",
        args: &["--preload-runtime-walks=javascript"],
        peer: None,
        event: None,
    },
    Case {
        tool: "profile",
        args: &["--preload-runtime-walks"],
        peer: None,
        event: None,
    },
];

impl Case {
    /// How its rows name it: the tool, and its flags if they are not
    /// bcc's own (profile's runs).
    fn label(&self) -> String {
        if self.tool == "profile" && !self.args.is_empty() {
            format!("{} {}", self.tool, self.args.join(" "))
        } else {
            self.tool.to_owned()
        }
    }
}

/// What one run of a tracer showed.
struct Run {
    /// Launch to the banner, which follows attaching.
    attach_ms: f64,
    /// Launch to the first event's line, when the case has events.
    first_event_ms: Option<f64>,
    /// Resident memory once attached as `ps` counts it (VmRSS), in bytes:
    /// the event buffers' pages included.
    rss: u64,
    /// Of `rss`, the resident pages of the event buffers (ring or perf),
    /// mapped from the kernel and sized by `--buffer-size`.
    buffers: u64,
}

/// The value of a `Name:   123 kB` line, in bytes.
fn kb_field(line: &str, name: &str) -> Option<u64> {
    let kb = line.strip_prefix(name)?.trim().strip_suffix("kB")?;
    kb.trim().parse::<u64>().ok().map(|kb| kb * 1024)
}

/// Resident memory of `pid` in bytes: (VmRSS, as `ps` shows it; of it, the
/// BPF and perf buffer mappings).
fn resident(pid: u32) -> anyhow::Result<(u64, u64)> {
    let read = |file: &str| {
        std::fs::read_to_string(format!("/proc/{pid}/{file}"))
            .with_context(|| format!("cannot read /proc/{pid}/{file}"))
    };
    let status = read("status")?;
    let rss = status
        .lines()
        .find_map(|l| kb_field(l, "VmRSS:"))
        .with_context(|| format!("no VmRSS in /proc/{pid}/status"))?;
    let mut buffers = 0;
    let mut buffer = false;
    for line in read("smaps")?.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if first.contains('-') && !first.ends_with(':') {
            buffer = line.contains("anon_inode:bpf") || line.contains("[perf_event]");
        } else if buffer && let Some(bytes) = kb_field(line, "Rss:") {
            buffers += bytes;
        }
    }
    Ok((rss, buffers))
}

/// Bytes in decimal megabytes (as the goal is stated) or kilobytes.
fn size(bytes: u64) -> String {
    if bytes >= 1_000_000 {
        format!("{:.1} MB", bytes as f64 / 1e6)
    } else {
        format!("{:.0} kB", bytes as f64 / 1e3)
    }
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
    let resident = resident(child.id());
    stop(&mut child);
    let (rss, buffers) = resident?;
    let ms = |at: Instant| at.duration_since(started).as_secs_f64() * 1e3;
    Ok(Run {
        attach_ms: ms(attached.expect("waited for")),
        first_event_ms: first.map(ms),
        rss,
        buffers,
    })
}

fn fmt_spread(v: &[f64]) -> String {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    format!("{:.0} ({:.0}-{:.0})", v[v.len() / 2], v[0], v[v.len() - 1])
}

/// Runs the start-up and memory benchmark, then the size comparison;
/// returns their tables for docs/benchmarks.md, with the line saying where
/// they were measured. Fails, once everything is printed, if a tool is over
/// the resident goal.
pub fn run() -> anyhow::Result<String> {
    let rtrace = crate::build()?;
    eprintln!(
        "bench startup: launch to attached, to the first event, and resident memory {} s \
         after attaching (VmRSS, as ps counts it); median (min-max) of {ROUNDS} interleaved \
         rounds; MB = 10^6 bytes",
        SETTLE.as_secs()
    );
    println!(
        "{:<15} {:>18} {:>18} {:>7} {:>16} {:>16} {:>8} {:>8} {:>8}",
        "tool",
        "rtrace ms",
        "libbpf-tools ms",
        "ratio",
        "rtrace 1st ev",
        "peer 1st ev",
        "rss MB",
        "bufs MB",
        "peer MB"
    );
    let mut worst_ratio: f64 = 0.0;
    // Each case's median launch to attached, in the order of `CASES`.
    let mut profile_attach: Vec<f64> = Vec::new();
    // An older build to measure a change against, in the same interleaved
    // rounds: its launch to attached beside this build's.
    let baseline = std::env::var_os("RTRACE_BENCH_BASELINE").map(std::path::PathBuf::from);
    let mut against: Vec<(&str, f64, f64, String, f64)> = Vec::new();
    // Each tool's largest resident memory, for the goal.
    let mut largest: Vec<(&str, u64)> = Vec::new();
    // The same figures as a Markdown table, for docs/benchmarks.md.
    let mut table = String::from(
        "| tool | rtrace to attached | libbpf-tools | rtrace to the first event | libbpf-tools \
         | rtrace resident (of it event buffers) | libbpf-tools resident \
         | goal: at most 20 MB resident |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    for case in CASES {
        let peer = case
            .peer
            .map(|p| libbpf_tool(case.tool).map(|t| (t, p)))
            .transpose()?;
        let mut mine: Vec<Run> = Vec::new();
        let mut theirs: Vec<Run> = Vec::new();
        let mut before: Vec<Run> = Vec::new();
        for _ in 0..ROUNDS {
            let mut cmd = Command::new(&rtrace);
            cmd.arg(case.tool).args(case.args);
            mine.push(once(cmd, banner(case.tool), case.event)?);
            if let Some(old) = &baseline {
                let mut cmd = Command::new(old);
                cmd.arg(case.tool).args(case.args);
                before.push(once(cmd, banner(case.tool), case.event)?);
            }
            if let Some((path, ready)) = &peer {
                // libbpf-tools never flush stdout, so stdbuf line-buffers it.
                let mut cmd = Command::new("stdbuf");
                cmd.arg("-oL").arg(path).args(case.args);
                theirs.push(once(cmd, ready, case.event)?);
            }
        }
        let attach = |r: &[Run]| r.iter().map(|r| r.attach_ms).collect::<Vec<_>>();
        profile_attach.push(median(attach(&mine)));
        if !before.is_empty() {
            // Half the wider of the two builds' ranges.
            let half_range = |v: Vec<f64>| {
                let (lo, hi) = v
                    .iter()
                    .fold((f64::MAX, f64::MIN), |(lo, hi), &x| (lo.min(x), hi.max(x)));
                (hi - lo) / 2.0
            };
            against.push((
                case.tool,
                median(attach(&mine)),
                median(attach(&before)),
                fmt_spread(&attach(&before)),
                half_range(attach(&mine)).max(half_range(attach(&before))),
            ));
        }
        let spread = |v: Vec<f64>| {
            if v.is_empty() {
                "-".to_owned()
            } else {
                fmt_spread(&v)
            }
        };
        let first = |r: &[Run]| spread(r.iter().filter_map(|r| r.first_event_ms).collect());
        let mb = |r: &[Run], f: fn(&Run) -> u64| {
            (!r.is_empty()).then(|| median(r.iter().map(|r| f(r) as f64 / 1e6).collect()))
        };
        let ratio = if theirs.is_empty() {
            "-".to_owned()
        } else {
            let ratio = median(attach(&mine)) / median(attach(&theirs));
            worst_ratio = worst_ratio.max(ratio);
            format!("{ratio:.2}")
        };
        let rss = mb(&mine, |r| r.rss).unwrap_or(0.0);
        let bufs = mb(&mine, |r| r.buffers).unwrap_or(0.0);
        let peer_mb = mb(&theirs, |r| r.rss);
        let goal = if case.tool == NO_RESIDENT_GOAL {
            "(none for profile)".to_owned()
        } else {
            let max = mine.iter().map(|r| r.rss).max().unwrap_or(0);
            largest.push((case.tool, max));
            format!("{} ({})", verdict(max), size(max))
        };
        println!(
            "{:<15} {:>18} {:>18} {:>7} {:>16} {:>16} {:>8.1} {:>8.1} {:>8}",
            case.label(),
            fmt_spread(&attach(&mine)),
            spread(attach(&theirs)),
            ratio,
            first(&mine),
            first(&theirs),
            rss,
            bufs,
            peer_mb.map_or_else(|| "-".to_owned(), |m| format!("{m:.1}")),
        );
        let ms = |s: String| if s == "-" { s } else { format!("{s} ms") };
        table.push_str(&format!(
            "| {} | {} | {} | {} | {} | {rss:.1} MB{} | {} | {goal} |\n",
            case.label(),
            ms(fmt_spread(&attach(&mine))),
            ms(spread(attach(&theirs))),
            ms(first(&mine)),
            ms(first(&theirs)),
            if bufs > 0.0 {
                format!(" ({bufs:.1} MB)")
            } else {
                String::new()
            },
            peer_mb.map_or_else(|| "-".to_owned(), |m| format!("{m:.1} MB")),
        ));
    }
    println!();
    println!(
        "target: start-up no slower than libbpf-tools: worst ratio {worst_ratio:.2}, {}",
        if worst_ratio <= 1.0 { "met" } else { "NOT met" }
    );
    println!(
        "resident memory as ps counts it (VmRSS, event buffers included), the largest of \
         {ROUNDS} rounds; {NO_RESIDENT_GOAL} has no goal:"
    );
    for (tool, max) in &largest {
        println!(
            "{tool:<15} goal: at most 20 MB resident: {} ({})",
            verdict(*max),
            size(*max)
        );
    }
    let mut slower = Vec::new();
    if let Some(old) = &baseline {
        println!();
        println!(
            "launch to attached against the baseline {} (medians; goal: at most {BASELINE_SLOWER_MS} \
             ms slower):",
            old.display()
        );
        for (tool, now, then, spread, noise) in &against {
            // A difference inside the rounds' own spread (profile's
            // verifier varies by a quarter second) is noise, not a cost:
            // taking the objects out, timed below, is the cost.
            let verdict = if now - then <= BASELINE_SLOWER_MS {
                "OK"
            } else if now - then <= *noise {
                "within the rounds' spread"
            } else {
                slower.push(format!("{tool} ({:+.1} ms)", now - then));
                "OVER"
            };
            println!(
                "{tool:<15} this build {now:.1} ms, baseline {then:.1} ms ({spread}): {:+.1} ms {verdict}",
                now - then
            );
        }
    }
    let profile_ms = CASES
        .iter()
        .position(|c| c.tool == NO_RESIDENT_GOAL)
        .and_then(|i| profile_attach.get(i).copied())
        .unwrap_or(f64::NAN);
    println!(
        "profile: launch to attached with no runtime in scope, goal at most {PROFILE_ATTACH_GOAL_MS} \
         ms: {} ({profile_ms:.0} ms)",
        if profile_ms <= PROFILE_ATTACH_GOAL_MS {
            "met"
        } else {
            "NOT met"
        }
    );
    // The runs with a walk through runtimes' frames: one runtime's walk,
    // judged against one runtime's goal, and every runtime's, as two or
    // more in scope load it, against three's.
    let mut runtime_verdicts = Vec::new();
    for (i, case) in CASES.iter().enumerate() {
        let Some(flag) = case.args.first().filter(|_| case.tool == NO_RESIDENT_GOAL) else {
            continue;
        };
        let (which, runtimes) = match flag.split_once('=') {
            Some((_, one)) => (format!("{one}'s walk"), 1.0),
            None => ("every runtime's walk".to_owned(), 3.0),
        };
        let ms = profile_attach.get(i).copied().unwrap_or(f64::NAN);
        let added = ms - profile_ms;
        let goal = RUNTIME_ADDED_GOAL_MS * runtimes;
        let verdict = if added <= goal { "met" } else { "NOT met" };
        println!(
            "profile: {which} (`{flag}`) adds {added:.0} ms to the start ({ms:.0} ms), goal at \
             most {goal:.0} ms: {verdict}"
        );
        runtime_verdicts.push(format!(
            "{which} (`{flag}`) adds {added:.0} ms (goal at most {goal:.0} ms, {verdict})"
        ));
    }
    let runtimes_verdict = runtime_verdicts.join("; ");
    println!();
    let verified = verifier(&rtrace)?;
    println!();
    let taking_out = take_out_times()?;
    print!("{taking_out}");
    println!();
    let (sizes_text, sizes_table, size_over) = sizes(&rtrace)?;
    print!("{sizes_text}");
    let over: Vec<String> = largest
        .iter()
        .filter(|(_, max)| *max > RESIDENT_GOAL)
        .map(|(tool, max)| format!("{tool} ({})", size(*max)))
        .collect();
    let mut failed = Vec::new();
    if !over.is_empty() {
        failed.push(format!(
            "over the goal of at most 20 MB resident: {}",
            over.join(", ")
        ));
    }
    if !size_over.is_empty() {
        failed.push(format!(
            "over the binary size goal: {}",
            size_over.join(", ")
        ));
    }
    if !slower.is_empty() {
        failed.push(format!(
            "more than {BASELINE_SLOWER_MS} ms slower to start than the baseline: {}",
            slower.join(", ")
        ));
    }
    let text = format!(
        "Start-up and memory, measured with {}; medians of {ROUNDS} interleaved rounds, \
         ranges in brackets; resident memory as `ps` counts it (VmRSS, the event buffers' \
         pages included, their share in brackets), the goal judged on the largest of the \
         rounds; MB are 10^6 bytes; - where libbpf-tools has no such tool that runs here:\n\n\
         {table}\n\
         profile's launch to attached with no runtime in scope: goal at most \
         {PROFILE_ATTACH_GOAL_MS} ms, {}. A walk through runtimes' frames, loaded at the \
         start as a run with a process of one runtime in scope loads that runtime's \
         (`profile_python`, `profile_java`, `profile_v8`), and one with two or more every \
         runtime's (`profile_runtimes`); goal at most {RUNTIME_ADDED_GOAL_MS} ms for each \
         runtime: {runtimes_verdict}.\n\n\
         {verified}\n\
         ```text\n{taking_out}```\n\n\
         Binary sizes, in the same run:\n\n{sizes_table}{}",
        measured_on("startup"),
        if profile_ms <= PROFILE_ATTACH_GOAL_MS {
            "met"
        } else {
            "NOT met"
        },
        if failed.is_empty() {
            String::new()
        } else {
            format!("\nGoals not met in this run: {}.\n", failed.join("; "))
        },
    );
    if failed.is_empty() {
        return Ok(text);
    }
    // A run that misses a goal still says what it measured: the page
    // would otherwise keep an older run's figures beside the failure.
    super::update_doc("startup", &text)?;
    bail!("{} (docs/benchmarks.md written)", failed.join("; "))
}

/// The goal for profile's launch to attached, with no runtime's program
/// in scope: at most 150 ms.
const PROFILE_ATTACH_GOAL_MS: f64 = 150.0;
/// The goal for what a runtime in scope adds to profile's launch to
/// attached: at most 100 ms.
const RUNTIME_ADDED_GOAL_MS: f64 = 100.0;
/// The verifier's limit of instructions it goes through for one program.
const VERIFIER_LIMIT: u64 = 1_000_000;
/// The goal for every program on 6.1: at most 60 % of the limit.
const VERIFIER_GOAL_PERCENT: u64 = 60;
/// The runs whose programs' verifier counts are reported: those that walk
/// stacks, the programs that cost most to load.
const VERIFIED_RUNS: [&[&str]; 7] = [
    &["profile", "-v", "-F", "99", "1"],
    &[
        "profile",
        "-v",
        "--preload-runtime-walks=python",
        "-F",
        "99",
        "1",
    ],
    &[
        "profile",
        "-v",
        "--preload-runtime-walks=java",
        "-F",
        "99",
        "1",
    ],
    &[
        "profile",
        "-v",
        "--preload-runtime-walks=javascript",
        "-F",
        "99",
        "1",
    ],
    &["profile", "-v", "--preload-runtime-walks", "-F", "99", "1"],
    &["profile", "-v", "--off-cpu", "-F", "99", "1"],
    &["offcputime", "-v", "1"],
];

/// The instructions the verifier went through for each program of
/// [`VERIFIED_RUNS`], as `-v` tells them, on this host and in each VM
/// guest; the goal judged on 6.1's. A Markdown table, also printed.
fn verifier(rtrace: &Path) -> anyhow::Result<String> {
    let mut kernels: Vec<(String, String)> = Vec::new();
    let mut host = String::new();
    for args in VERIFIED_RUNS {
        let out = Command::new(rtrace)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("cannot run rtrace {}", args.join(" ")))?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        for line in stderr.lines() {
            host.push_str(&format!("{} {line}\n", args.join("_")));
        }
    }
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    kernels.push((format!("host {}", release.trim()), host));
    let mark = "=== rtrace-vm: verified";
    let mut body = String::new();
    for args in VERIFIED_RUNS {
        body.push_str(&format!(
            "/t/rtrace {} 2>&1 >/dev/null | sed -n 's/^rtrace: /{mark} {} /p'\n",
            args.join(" "),
            args.join("_")
        ));
    }
    for (package, lines) in crate::vm::marked_lines(&body, mark)? {
        let lines: String = lines.iter().map(|l| format!("{l}\n")).collect();
        kernels.push((package, lines));
    }
    // (run, program) in order, then each kernel's count.
    let mut rows: Vec<(RunProgram, Vec<Option<u64>>)> = Vec::new();
    for (k, (_, lines)) in kernels.iter().enumerate() {
        for (run, program, n) in lines.lines().filter_map(verified_line) {
            let key = (run, program);
            let i = match rows.iter().position(|(r, _)| *r == key) {
                Some(i) => i,
                None => {
                    rows.push((key, vec![None; kernels.len()]));
                    rows.len() - 1
                }
            };
            rows[i].1[k] = Some(n);
        }
    }
    let old = kernels.iter().position(|(k, _)| k.contains("6.1.0"));
    let mut table = format!(
        "Instructions the verifier went through for each program that walks stacks, as `-v` \
         tells them, in the same run, and their share of its limit of a million; goal: at \
         most {VERIFIER_GOAL_PERCENT} % on 6.1:\n\n| run | program |"
    );
    for (k, _) in &kernels {
        table.push_str(&format!(" {k} |"));
    }
    table.push_str(" goal on 6.1 |\n| --- | --- |");
    table.push_str(&" --- |".repeat(kernels.len() + 1));
    table.push('\n');
    for ((run, program), counts) in &rows {
        let cell = |n: &Option<u64>| {
            n.map_or_else(
                || "-".to_owned(),
                |n| format!("{n} ({} %)", n * 100 / VERIFIER_LIMIT),
            )
        };
        let goal = match old.and_then(|o| counts[o]) {
            Some(n) if n * 100 <= VERIFIER_GOAL_PERCENT * VERIFIER_LIMIT => "OK",
            Some(_) => "OVER",
            None => "-",
        };
        table.push_str(&format!(
            "| `rtrace {}` | {program} |",
            run.replace('_', " ")
        ));
        for n in counts {
            table.push_str(&format!(" {} |", cell(n)));
        }
        table.push_str(&format!(" {goal} |\n"));
    }
    print!("{table}");
    Ok(table)
}

/// A run of [`VERIFIED_RUNS`] (its arguments joined by `_`) and one of
/// its programs.
type RunProgram = (String, String);

/// `(run, program, count)` of a line `RUN TOOL: program NAME: N
/// instructions verified`, the run's arguments joined by `_`.
fn verified_line(line: &str) -> Option<(String, String, u64)> {
    // The tool's name, with the host's `rtrace: ` before it or the guests'
    // without, ends at the first `: program `.
    let (run, rest) = line.split_once(' ')?;
    let (_, rest) = rest.split_once(": program ")?;
    let (program, n) = rest.split_once(": ")?;
    let n = n.strip_suffix(" instructions verified")?.parse().ok()?;
    Some((run.to_owned(), program.to_owned(), n))
}

/// What taking the embedded objects out costs a tool's start: each object
/// of the build just made, taken out by rtrace's own function
/// (`rtrace_common::objects::take_out`: its group's frame decoded up to the
/// object's end), the median of
/// [`ROUNDS`]; the slowest, and the objects' sizes.
fn take_out_times() -> anyhow::Result<String> {
    let table = std::fs::read_dir(crate::root().join("target/release/build"))?
        .flatten()
        .map(|e| e.path().join("out/objects.rs"))
        .filter(|p| p.exists())
        .max_by_key(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
        .context("no objects.rs in target/release/build: build rtrace first")?;
    let (groups, objects) = objects_in(&std::fs::read_to_string(&table)?);
    let mut frames = Vec::new();
    for path in &groups {
        frames.push(std::fs::read(path).with_context(|| path.clone())?);
    }
    let mut rows: Vec<(String, usize, f64)> = Vec::new();
    for (name, group, offset, len) in objects {
        let frame = frames
            .get(group)
            .context("objects.rs names a group it lacks")?;
        let mut times = Vec::new();
        for _ in 0..ROUNDS {
            let start = Instant::now();
            let mut out = vec![0u8; len];
            rtrace_common::objects::take_out(frame, offset, &mut out)
                .with_context(|| format!("{name}: cannot be taken out of its group"))?;
            times.push(start.elapsed().as_secs_f64() * 1e3);
        }
        rows.push((name, len, median(times)));
    }
    rows.sort_by(|a, b| b.2.total_cmp(&a.2));
    let all_out: usize = rows.iter().map(|r| r.1).sum();
    let all_in: usize = frames.iter().map(Vec::len).sum();
    let mut text = format!(
        "embedded objects: {} compressed to {} ({} objects in {} groups); taking one out \
         when a tool loads it, the slowest:\n",
        size(all_out as u64),
        size(all_in as u64),
        rows.len(),
        frames.len()
    );
    for (name, len, ms) in rows.iter().take(5) {
        text.push_str(&format!("  {name:<24} {}: {ms:.2} ms\n", size(*len as u64)));
    }
    Ok(text)
}

/// An object of `objects.rs`: its name, its group's index, and its offset
/// and length in the group.
type ObjectRow = (String, usize, usize, usize);

/// The tables of an `objects.rs`: its groups' files (`GROUPS`, rows
/// `("BIN", include_bytes!("PATH")),`) in order, and its objects
/// (`OBJECTS`, rows `("NAME", GROUP, OFFSET, LEN),`).
fn objects_in(table: &str) -> (Vec<String>, Vec<ObjectRow>) {
    let mut groups = Vec::new();
    let mut objects = Vec::new();
    for line in table.lines() {
        let Some(row) = line.trim().strip_prefix("(\"") else {
            continue;
        };
        let Some((name, rest)) = row.split_once('"') else {
            continue;
        };
        if let Some(path) = rest.strip_prefix(", include_bytes!(\"") {
            groups.push(path.split('"').next().unwrap_or_default().to_owned());
            continue;
        }
        let n: Vec<usize> = rest
            .trim_matches(|c: char| c == ',' || c == ')' || c == ' ')
            .split(", ")
            .filter_map(|f| f.trim().parse().ok())
            .collect();
        if let [group, offset, len] = n[..] {
            objects.push((name.to_owned(), group, offset, len));
        }
    }
    (groups, objects)
}

/// `OK` or `OVER` the resident goal.
fn verdict(bytes: u64) -> &'static str {
    if bytes <= RESIDENT_GOAL { "OK" } else { "OVER" }
}

/// The size of rtrace's binaries (the release build, and the static one if
/// `cargo xtask dist` built it) against their goals, beside libbpf-tools'
/// binaries of the same tools and their sum: (plain text to print, a
/// Markdown table, the binaries over their goals).
fn sizes(rtrace: &Path) -> anyhow::Result<(String, String, Vec<String>)> {
    let len = |p: &Path| -> anyhow::Result<u64> {
        Ok(std::fs::metadata(p)
            .with_context(|| format!("cannot read {}", p.display()))?
            .len())
    };
    let mut rows: Vec<(String, String)> = Vec::new();
    let mut over = Vec::new();
    let goal = |bytes: u64, goal: u64, what: &str, over: &mut Vec<String>| {
        let ok = bytes <= goal;
        if !ok {
            over.push(format!("{what} {}", size(bytes)));
        }
        format!(
            "{} (goal: at most {}: {})",
            size(bytes),
            size(goal),
            if ok { "OK" } else { "OVER" }
        )
    };
    let release = len(rtrace)?;
    rows.push((
        "rtrace, every tool (`target/release/rtrace`)".to_owned(),
        goal(release, RELEASE_GOAL, "target/release/rtrace", &mut over),
    ));
    let dist = crate::dist::static_path();
    let static_size = if dist.exists() {
        // The static binary is built only by `cargo xtask dist`: say so if
        // it is of another commit than the release binary measured here.
        let (of_release, of_static) = (commit(rtrace), commit(&dist));
        format!(
            "{}{}",
            goal(len(&dist)?, STATIC_GOAL, "target/dist/rtrace", &mut over),
            match of_static {
                Some(c) if of_release.as_ref() != Some(&c) => format!(" (built from {c})"),
                _ => String::new(),
            }
        )
    } else {
        "not built (`cargo xtask dist` builds it)".to_owned()
    };
    rows.push((
        "rtrace, static and stripped (`target/dist/rtrace`)".to_owned(),
        static_size,
    ));
    // A tool may be a link to another's binary (ext4slower to fsslower):
    // the sum counts each file once.
    let mut files: Vec<std::path::PathBuf> = Vec::new();
    let mut sum = 0;
    for tool in PEER_BINARIES {
        let path = libbpf_tool(tool)?;
        let file = std::fs::canonicalize(&path)?;
        let bytes = len(&file)?;
        let name = file.file_name().map(|n| n.to_string_lossy().into_owned());
        let alias = match name {
            Some(n) if n != tool => format!(" (a link to {n})"),
            _ => String::new(),
        };
        rows.push((
            format!("libbpf-tools {tool} (`{}`){alias}", path.display()),
            size(bytes),
        ));
        if !files.contains(&file) {
            sum += bytes;
            files.push(file);
        }
    }
    rows.push((
        format!("libbpf-tools, these {} tools together", PEER_BINARIES.len()),
        size(sum),
    ));
    let libs = shared_libraries(&files[0]);
    let width = rows.iter().map(|(n, _)| n.len()).max().unwrap_or(0);
    let mut text = String::from("binary sizes (MB = 10^6 bytes):\n");
    let mut table = String::from("| binary | size |\n| --- | --- |\n");
    for (name, size) in &rows {
        text.push_str(&format!("{name:<width$} {size}\n"));
        table.push_str(&format!("| {name} | {size} |\n"));
    }
    if !libs.is_empty() {
        let line = format!(
            "libbpf-tools' binaries also load shared libraries, not counted above: {}.\n",
            libs.join(", ")
        );
        text.push_str(&line);
        table.push('\n');
        table.push_str(&line);
    }
    Ok((text, table, over))
}

/// The `commit ...` line of an rtrace binary's `--version`.
fn commit(rtrace: &Path) -> Option<String> {
    let out = Command::new(rtrace).arg("--version").output().ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find(|l| l.starts_with("commit "))
        .map(str::to_owned)
}

/// The shared libraries `binary` loads, with their sizes, as `ldd` names
/// them; empty if `ldd` cannot tell.
fn shared_libraries(binary: &Path) -> Vec<String> {
    let Ok(out) = Command::new("ldd").arg(binary).output() else {
        return Vec::new();
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.trim().split_once(" => ")?;
            let path = rest.split_whitespace().next()?;
            let bytes = std::fs::metadata(path).ok()?.len();
            Some(format!("{name} {}", size(bytes)))
        })
        .collect()
}

/// The start of the line each tool prints once it traces (rtrace on
/// stderr, libbpf-tools on stdout), as bcc words it.
fn banner(tool: &str) -> &'static str {
    match tool {
        "profile" => "Sampling",
        _ => "Tracing",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bench reads the tables `ebpf_build::build` writes: this is one
    /// as it writes them.
    #[test]
    fn the_objects_tables_are_read_as_the_build_writes_them() {
        let dir = std::env::temp_dir().join(format!("rtrace-objects-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (a, b) = ([1u8; 20], [2u8; 3]);
        let (frame, offsets) = ebpf_build::compress_group(&[&a, &b]).unwrap();
        std::fs::write(dir.join("x.zst"), frame).unwrap();
        let path = dir.join("x.zst").display().to_string();
        let table = format!(
            "pub static GROUPS: &[(&str, &[u8])] = &[\n    (\"x\", include_bytes!({path:?})),\n];\n\
             pub static OBJECTS: &[(&str, usize, usize, usize)] = &[\n\
             \x20   (\"x\", 0, {}, 20),\n    (\"x_perf\", 0, {}, 3),\n];\n",
            offsets[0], offsets[1]
        );
        let (groups, objects) = objects_in(&table);
        assert_eq!(groups, [path]);
        assert_eq!(
            objects,
            [("x".to_owned(), 0, 0, 20), ("x_perf".to_owned(), 0, 24, 3)]
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn proc_fields_are_read_in_bytes() {
        assert_eq!(
            kb_field("VmRSS:\t   12345 kB", "VmRSS:"),
            Some(12345 * 1024)
        );
        assert_eq!(kb_field("Rss:                   4 kB", "Rss:"), Some(4096));
        assert_eq!(kb_field("VmHWM:\t   1 kB", "VmRSS:"), None);
    }

    #[test]
    fn the_goal_is_20_decimal_megabytes() {
        assert_eq!(verdict(20_000_000), "OK");
        assert_eq!(verdict(20_000_001), "OVER");
        assert_eq!(verdict(20 << 20), "OVER");
        assert_eq!(size(12_553_216), "12.6 MB");
        assert_eq!(size(380_288), "380 kB");
    }

    #[test]
    fn verified_lines_give_run_program_and_count() {
        assert_eq!(
            verified_line(
                "profile_-v_-F_99_1 rtrace: profile: program profile: 570370 instructions verified"
            ),
            Some((
                "profile_-v_-F_99_1".to_owned(),
                "profile".to_owned(),
                570_370
            ))
        );
        // As the guests' lines come, their `rtrace: ` cut by sed.
        assert_eq!(
            verified_line(
                "offcputime_-v_1 offcputime: program cfi_exec: 4781 instructions verified"
            ),
            Some(("offcputime_-v_1".to_owned(), "cfi_exec".to_owned(), 4781))
        );
        assert_eq!(
            verified_line("profile_-v_1 rtrace: profile: sampling cpu-clock"),
            None
        );
    }
}

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

mod build;
mod command;
mod exporter;
mod html;
mod memleak;
mod python;
mod report;
mod startup;
mod stat;
mod top;
mod trace;

/// Ping-pong round trips per trial: about a second bare.
const ROUNDS: u64 = 200_000;
/// Execs per worker per trial of the exec storm.
const EXECS: u64 = 1_500;
/// Exec storm workers: one per core of these machines.
const EXEC_WORKERS: u64 = 2;
/// TCP sessions per trial of the connect storm.
const SESSIONS: u64 = 2_000;
/// Direct reads and writes per trial of the block I/O case.
const IO_READS: u64 = 15_000;
const IO_WRITES: u64 = 5_000;
/// Trials per configuration; the median is reported.
const TRIALS: usize = 5;

/// Runs the named benchmark, or all.
/// A tool's benchmark, which prints its own report and returns its row.
type Bench = fn() -> anyhow::Result<Row>;

pub fn run(name: Option<&str>) -> anyhow::Result<()> {
    let benches: [(&str, Bench); 11] = [
        ("runqlat", runqlat),
        ("execsnoop", execsnoop),
        ("tcplife", tcplife),
        ("biolatency", biolatency),
        ("gethostlatency", gethostlatency),
        ("ext4slower", ext4slower),
        ("offcputime", offcputime),
        ("profile", profile),
        ("argdist", argdist),
        ("exporter", exporter::run),
        ("tracepoint", tracepoint),
    ];
    match name {
        None | Some("all") => {
            let mut rows = Vec::new();
            for (_, bench) in benches {
                rows.push(bench()?);
            }
            let table = all_table(&rows);
            println!("\n{table}");
            let path = crate::root().join("target/bench/all.md");
            std::fs::write(&path, &table)?;
            eprintln!("bench: the table is also in {}", path.display());
            // Each table is written whatever becomes of the other: a
            // start-up goal missed keeps the long run's table.
            let all = update_doc(
                "all",
                &format!(
                    "{} (the table is also written to `target/bench/all.md`):\n\n{table}",
                    measured_on("all")
                ),
            );
            let startup = startup::run().and_then(|t| update_doc("startup", &t));
            let command = command::run().and_then(|t| update_doc("command", &t));
            let report = report::run().and_then(|t| update_doc("report", &t));
            let stat = stat::run().and_then(|t| update_doc("stat", &t));
            let trace = trace::run().and_then(|t| update_doc("trace", &t));
            let top = top::run().and_then(|t| update_doc("top", &t));
            let python = python::run().and_then(|t| update_doc("python", &t));
            let memleak = memleak::run().and_then(|t| update_doc("memleak", &t));
            let html = html::run().and_then(|t| update_doc("html", &t));
            all.and(startup)
                .and(command)
                .and(report)
                .and(stat)
                .and(trace)
                .and(top)
                .and(python)
                .and(memleak)
                .and(html)
        }
        Some("startup") => update_doc("startup", &startup::run()?),
        Some("command") => update_doc("command", &command::run()?),
        Some("report") => update_doc("report", &report::run()?),
        Some("stat") => update_doc("stat", &stat::run()?),
        Some("trace") => update_doc("trace", &trace::run()?),
        Some("top") => update_doc("top", &top::run()?),
        Some("python") => update_doc("python", &python::run()?),
        Some("memleak") => update_doc("memleak", &memleak::run()?),
        Some("html") => update_doc("html", &html::run()?),
        Some(one) => match benches.iter().find(|(n, _)| *n == one) {
            Some((_, bench)) => bench().map(drop),
            None => bail!(
                "unknown benchmark {one}; known: all, {}, startup, command, report, stat, trace, top, \
                 python, memleak, html",
                benches.map(|(n, _)| n).join(", ")
            ),
        },
    }
}

/// The document the generated tables are kept in, from the workspace root.
const DOC: &str = "docs/benchmarks.md";

/// Replaces what lies between `<!-- bench:NAME:begin -->` and
/// `<!-- bench:NAME:end -->` in `doc` with `body`, keeping the markers.
fn replace_between_markers(doc: &str, name: &str, body: &str) -> anyhow::Result<String> {
    let begin = format!("<!-- bench:{name}:begin -->");
    let end = format!("<!-- bench:{name}:end -->");
    let (Some(b), Some(e)) = (doc.find(&begin), doc.find(&end)) else {
        bail!("no {begin} ... {end} markers in {DOC}: put them around the table to replace");
    };
    if e < b || doc.matches(&begin).count() > 1 || doc.matches(&end).count() > 1 {
        bail!("{DOC} must have {begin} once, followed by {end} once");
    }
    let head = &doc[..b + begin.len()];
    let tail = &doc[e..];
    // Blank lines around the body keep a table from running into a marker.
    Ok(format!("{head}\n\n{}\n\n{tail}", body.trim_matches('\n')))
}

/// Writes `body` between the `bench:NAME` markers of [`DOC`].
fn update_doc(name: &str, body: &str) -> anyhow::Result<()> {
    let path = crate::root().join(DOC);
    let doc = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    std::fs::write(&path, replace_between_markers(&doc, name, body)?)
        .with_context(|| format!("cannot write {}", path.display()))?;
    eprintln!("bench: the table replaces the {name} table in {DOC}");
    Ok(())
}

/// The line that says when and where `cargo xtask bench NAME` measured:
/// the date (UTC), host name, CPUs and kernel release.
fn measured_on(name: &str) -> String {
    let read = |p: &str| {
        std::fs::read_to_string(p).map_or_else(|_| "?".to_owned(), |s| s.trim().to_owned())
    };
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let cpus = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    format!(
        "`cargo xtask bench {name}` on `{}` ({cpus} CPUs, Linux {}), {}",
        read("/proc/sys/kernel/hostname"),
        read("/proc/sys/kernel/osrelease"),
        date(secs / 86_400),
    )
}

/// Day `days` since 1970-01-01 as `24 November 2026` (the proleptic
/// Gregorian calendar, by Howard Hinnant's `civil_from_days`).
fn date(days: u64) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    format!("{day} {} {year}", MONTHS[(month - 1) as usize])
}

/// The lowest and highest of `v`.
fn spread(v: &[f64]) -> (f64, f64) {
    (
        v.iter().copied().fold(f64::INFINITY, f64::min),
        v.iter().copied().fold(f64::NEG_INFINITY, f64::max),
    )
}

/// One tracer's figures in a [`Row`].
struct Figures {
    /// Its label in the tool's own table.
    label: String,
    /// BPF run time per operation (0 for a peer without BPF), median and
    /// range over the trials.
    bpf: (f64, (f64, f64)),
    /// Added time per operation over bare, median and range.
    added: (f64, (f64, f64)),
    /// Events missing in the worst trial, where the workload's count is
    /// known.
    lost: Option<u64>,
    /// Launch to tracing, median, in milliseconds, where the tracer says
    /// when it is ready.
    startup_ms: Option<f64>,
}

/// One tool's line of `cargo xtask bench all`: rtrace's default against
/// the best peer that runs here.
struct Row {
    tool: &'static str,
    workload: String,
    /// What an operation is, and its unit of time (`ns/read`).
    unit: &'static str,
    ours: Figures,
    peer: Figures,
}

impl Row {
    /// The row of setups `ours` and `peer` of a tool's trials; setup 0
    /// is bare. `expected`: the events each trial should print.
    fn new(
        tool: &'static str,
        workload: impl Into<String>,
        unit: &'static str,
        (setups, results): (&[Setup], &[Outcome]),
        (ours, peer): (usize, usize),
        expected: Option<u64>,
    ) -> Self {
        let bare = results[0].cost;
        let figures = |i: usize| {
            let r = &results[i];
            Figures {
                label: setups[i].label.clone(),
                bpf: (r.bpf_ns, r.bpf_spread),
                added: (
                    r.cost - bare,
                    (r.cost_spread.0 - bare, r.cost_spread.1 - bare),
                ),
                lost: expected.map(|n| {
                    r.stops
                        .iter()
                        .map(|t| n.saturating_sub(t.events))
                        .max()
                        .unwrap_or(0)
                }),
                startup_ms: {
                    let ms: Vec<f64> = r
                        .stops
                        .iter()
                        .filter_map(|t| Some(t.ready_in?.as_secs_f64() * 1e3))
                        .collect();
                    (!ms.is_empty()).then(|| median(ms))
                },
            }
        };
        Self {
            tool,
            workload: workload.into(),
            unit,
            ours: figures(ours),
            peer: figures(peer),
        }
    }
}

impl Row {
    /// The row with the tracers' own CPU time per operation added to
    /// their added time: a sampler's work in its own process is cost the
    /// sampled tasks' clock does not see.
    fn with_own_cpu(mut self, results: &[Outcome], (ours, peer): (usize, usize)) -> Self {
        for (f, i) in [(&mut self.ours, ours), (&mut self.peer, peer)] {
            let own = results[i].tracer_ns;
            f.added.0 += own;
            f.added.1.0 += own;
            f.added.1.1 += own;
        }
        self
    }
}

/// The table of every tool's row, in Markdown, as the README shows it.
fn all_table(rows: &[Row]) -> String {
    use std::fmt::Write as _;
    let ratio = |a: f64, b: f64| {
        if b > 0.0 {
            format!("**{:.2}×**", a / b)
        } else {
            "-".to_owned()
        }
    };
    let ranged = |(m, (lo, hi)): (f64, (f64, f64))| format!("{m:.0} ({lo:.0}–{hi:.0})");
    let lost = |l: Option<u64>| l.map_or("-".to_owned(), |l| l.to_string());
    let ms = |m: Option<f64>| m.map_or("-".to_owned(), |m| format!("{m:.0}"));
    let mut t = String::new();
    let _ = writeln!(
        t,
        "| tool | workload | peer | BPF time per op, rtrace | peer | rtrace ÷ peer | \
         added time per op, rtrace | peer | rtrace ÷ peer | lost, rtrace / peer | \
         start-up ms, rtrace / peer |"
    );
    let _ = writeln!(t, "|{}", " --- |".repeat(11));
    for r in rows {
        let _ = writeln!(
            t,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} / {} | {} / {} |",
            r.tool,
            r.workload,
            r.peer.label,
            ranged(r.ours.bpf),
            ranged(r.peer.bpf),
            ratio(r.ours.bpf.0, r.peer.bpf.0),
            ranged(r.ours.added),
            ranged(r.peer.added),
            // Against a peer whose added time the trials cannot tell
            // from nothing, a ratio would be noise over noise.
            if r.peer.added.1.0 > 0.0 {
                ratio(r.ours.added.0, r.peer.added.0)
            } else {
                "noise".to_owned()
            },
            lost(r.ours.lost),
            lost(r.peer.lost),
            ms(r.ours.startup_ms),
            ms(r.peer.startup_ms),
        );
    }
    let _ = writeln!(
        t,
        "\nBPF time in nanoseconds per operation; added time in each row's unit ({}); \
         medians over {TRIALS} interleaved \
         trials, ranges in brackets. BPF time is the kernel's own statistics \
         (`kernel.bpf_stats_enabled`); a peer without BPF programs (perf) has none, and its \
         row is judged by the added time. An added-time ratio is given only where the \
         peer's added time stood above zero in every trial (`noise` otherwise). Lost: events missing against what the workload \
         did, in the worst trial (tcplife: server ends not attributed to the server process). \
         Start-up: launch to the tracer's own word that it traces; - for one that says \
         nothing (perf, libbpf-tools' offcputime).",
        rows.iter()
            .map(|r| format!("{}: {}", r.tool, r.unit))
            .collect::<Vec<_>>()
            .join(", ")
    );
    t
}

/// Where a tracer says it has started: a line with this prefix on stdout or
/// on stderr.
#[derive(Clone, Copy)]
enum Ready {
    Stdout(&'static str),
    Stderr(&'static str),
    /// The tracer prints nothing when ready (perf record): give it this long.
    After(Duration),
}

/// A tracer running while the workload plays.
struct Tracer {
    child: Child,
    /// From launch to ready; `None` for a tracer that does not say
    /// ([`Ready::After`]).
    ready_in: Option<Duration>,
    /// Counts stdout lines containing the needle, and keeps the text if
    /// asked, until stdout closes.
    stdout: JoinHandle<(u64, String)>,
    /// Collects stderr, until it closes.
    stderr: JoinHandle<String>,
}

/// What a tracer printed, once stopped.
struct Stopped {
    /// Its stdout lines that contained the needle.
    events: u64,
    /// Its stdout, if kept ([`Tracer::start_keeping`]).
    stdout: String,
    /// From launch to ready, where it says.
    ready_in: Option<Duration>,
    /// Its stderr.
    stderr: String,
    /// CPU time its threads had run when told to stop.
    cpu_ns: u64,
    /// From the signal to stop to its exit (its report).
    report: Duration,
}

/// Nanoseconds the threads of process `pid` have run (schedstat's first
/// field: nanoseconds, not ticks).
fn cpu_ns(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
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
    fn start(cmd: Command, ready: Ready, needle: Option<String>) -> anyhow::Result<Self> {
        Self::start_with(cmd, ready, needle, false)
    }

    /// Starts `cmd` as [`Tracer::start`] does, keeping all its stdout.
    fn start_keeping(cmd: Command, ready: Ready) -> anyhow::Result<Self> {
        Self::start_with(cmd, ready, None, true)
    }

    fn start_with(
        mut cmd: Command,
        ready: Ready,
        needle: Option<String>,
        keep: bool,
    ) -> anyhow::Result<Self> {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let launch = std::time::Instant::now();
        let mut child = cmd
            .spawn()
            .with_context(|| format!("cannot start {cmd:?}"))?;
        let (tx, rx) = mpsc::channel();
        let (on_out, on_err) = match ready {
            Ready::Stdout(p) => (Some((p, tx)), None),
            Ready::Stderr(p) => (None, Some((p, tx))),
            Ready::After(wait) => {
                std::thread::sleep(wait);
                tx.send(()).ok();
                (None, None)
            }
        };
        let stdout = watch(
            child.stdout.take().unwrap(),
            on_out,
            (0u64, String::new()),
            move |(n, text), line| {
                if needle.as_deref().is_some_and(|s| line.contains(s)) {
                    *n += 1;
                }
                if keep {
                    text.push_str(line);
                    text.push('\n');
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
            ready_in: (!matches!(ready, Ready::After(_))).then(|| launch.elapsed()),
            stdout,
            stderr,
        })
    }

    fn stop(mut self) -> anyhow::Result<Stopped> {
        let cpu_ns = cpu_ns(self.child.id());
        let signalled = std::time::Instant::now();
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        self.child.wait()?;
        let report = signalled.elapsed();
        let (events, stdout) = self.stdout.join().unwrap_or_default();
        Ok(Stopped {
            events,
            stdout,
            ready_in: self.ready_in,
            stderr: self.stderr.join().unwrap_or_default(),
            cpu_ns,
            report,
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

/// Nanoseconds all loaded BPF programs have run so far (while run-time
/// statistics are on).
fn bpf_run_ns() -> u64 {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .map(|p| p.run_time().as_nanos() as u64)
        .sum()
}

/// One setup's results: the median cost per operation, the median time its
/// BPF programs ran per operation, and what its tracer said each trial.
struct Outcome {
    cost: f64,
    /// The lowest and highest cost per operation over the trials.
    cost_spread: (f64, f64),
    bpf_ns: f64,
    /// The lowest and highest BPF time per operation over the trials.
    bpf_spread: (f64, f64),
    /// The median CPU time of the tracer's own process per operation.
    tracer_ns: f64,
    stops: Vec<Stopped>,
}

/// Runs every setup `TRIALS` times, interleaved, timing `workload` (which
/// returns the cost of one operation and how many it did); returns each
/// setup's medians and what its tracer said in each trial.
///
/// BPF run-time statistics are on meanwhile, so the kernel also measures
/// the programs' own time: a cost that the workload's timing noise (cross-
/// CPU wakeups, a loop device's worker) cannot hide.
fn trials(
    setups: &[Setup],
    unit: &str,
    workload: impl Fn() -> anyhow::Result<(f64, u64)>,
) -> anyhow::Result<Vec<Outcome>> {
    let _stats = aya::sys::enable_stats(aya::sys::Stats::RunTime)
        .context("cannot turn on BPF run-time statistics")?;
    /// One setup's measurements, a value per trial.
    #[derive(Default)]
    struct Measured {
        costs: Vec<f64>,
        bpf: Vec<f64>,
        /// The tracer's own CPU time per operation.
        own: Vec<f64>,
        stops: Vec<Stopped>,
    }
    let mut samples: Vec<Measured> = setups.iter().map(|_| Measured::default()).collect();
    for trial in 0..TRIALS {
        for (i, s) in setups.iter().enumerate() {
            let tracer = s.start.as_ref().map(|f| f()).transpose()?;
            // Let attach-time work settle before timing.
            std::thread::sleep(Duration::from_millis(200));
            let before = bpf_run_ns();
            let cpu_before = tracer.as_ref().map_or(0, |t| cpu_ns(t.child.id()));
            let (cost, ops) = workload()?;
            let bpf = bpf_run_ns().saturating_sub(before) as f64 / ops.max(1) as f64;
            if let Some(t) = tracer {
                let stopped = t.stop()?;
                let own = stopped.cpu_ns.saturating_sub(cpu_before) as f64 / ops.max(1) as f64;
                samples[i].own.push(own);
                samples[i].stops.push(stopped);
            }
            eprintln!(
                "  trial {}: {:<40} {cost:>10.0} {unit} {bpf:>8.0} bpf ns/op",
                trial + 1,
                s.label
            );
            samples[i].costs.push(cost);
            samples[i].bpf.push(bpf);
        }
    }
    Ok(samples
        .into_iter()
        .map(
            |Measured {
                 costs,
                 bpf,
                 own,
                 stops,
             }| Outcome {
                cost_spread: spread(&costs),
                cost: median(costs),
                bpf_spread: spread(&bpf),
                bpf_ns: median(bpf),
                tracer_ns: if own.is_empty() { 0.0 } else { median(own) },
                stops,
            },
        )
        .collect())
}

/// Prints the table of added cost per setup; setup 0 is bare and setup 1
/// the peer. Returns rtrace's default (setup 2) ratios to the peer: of the
/// added cost, and of the BPF programs' time.
fn report(setups: &[Setup], results: &[Outcome], unit: &str) -> (f64, f64) {
    let bare = results[0].cost;
    let peer_added = results[1].cost - bare;
    let peer_bpf = results[1].bpf_ns;
    println!();
    let op = unit.split('/').nth(1).unwrap_or("op");
    println!(
        "{:<44} {:>12} {:>10} {:>8} {:>18} {:>8} {:>12}",
        "configuration",
        unit,
        format!("added {}", unit.split('/').next().unwrap_or(unit)),
        "vs peer",
        format!("bpf ns/{op} (range)"),
        "vs peer",
        format!("tracer ns/{op}"),
    );
    for (s, r) in setups.iter().zip(results) {
        let added = r.cost - bare;
        let (ratio, bpf_ratio) = if s.start.is_none() {
            (String::from("-"), String::from("-"))
        } else {
            (
                format!("{:.2}", added / peer_added),
                // A peer without BPF programs (perf) has no BPF time.
                if peer_bpf > 0.0 {
                    format!("{:.2}", r.bpf_ns / peer_bpf)
                } else {
                    String::from("-")
                },
            )
        };
        let bpf = format!(
            "{:.0} ({:.0}-{:.0})",
            r.bpf_ns, r.bpf_spread.0, r.bpf_spread.1
        );
        println!(
            "{:<44} {:>12.0} {added:>10.0} {ratio:>8} {bpf:>18} {bpf_ratio:>8} {:>12.0}",
            s.label, r.cost, r.tracer_ns
        );
    }
    (
        (results[2].cost - bare) / peer_added,
        results[2].bpf_ns / peer_bpf,
    )
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
fn pingpong(workload: &Path) -> anyhow::Result<(f64, u64)> {
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
    let ns = done_ns(&line).with_context(|| format!("pingpong said {line:?}"))?;
    Ok((ns / ROUNDS as f64, ROUNDS))
}

fn runqlat() -> anyhow::Result<Row> {
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
    let (ratio, bpf_ratio) = report(&setups, &results, "ns/round trip");
    println!();
    println!(
        "target: rtrace (default attach) adds at most 0.50x what libbpf-tools adds: {ratio:.2}x, {}",
        if ratio <= 0.5 { "met" } else { "NOT met" }
    );
    println!("its BPF programs run {bpf_ratio:.2}x as long per round trip as libbpf-tools'");
    Ok(Row::new(
        "runqlat",
        format!("ping-pong on one CPU, {ROUNDS} round trips"),
        "ns/round trip",
        (&setups, &results),
        (2, 1),
        None,
    ))
}

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
fn offcputime() -> anyhow::Result<Row> {
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
    let (ratio, bpf_ratio) = report(&setups, &results, "ns/switch");
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

/// Runs the exec storm; returns microseconds per exec.
fn exec_storm(workload: &Path, program: &Path) -> anyhow::Result<(f64, u64)> {
    let ns = timed(
        Command::new(workload)
            .arg(EXECS.to_string())
            .arg(EXEC_WORKERS.to_string())
            .arg(program),
    )?;
    Ok((
        ns / 1000.0 / (EXECS * EXEC_WORKERS) as f64,
        EXECS * EXEC_WORKERS,
    ))
}

fn execsnoop() -> anyhow::Result<Row> {
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
    let (ratio, bpf_ratio) = report(&setups, &results, "us/exec");
    report_events(
        &setups,
        &results,
        expected,
        "events seen (fewer means lost)",
    );
    let rtrace_lost = results[2]
        .stops
        .iter()
        .chain(&results[3].stops)
        .any(|t| t.events != expected);
    println!();
    println!(
        "rtrace adds {ratio:.2}x what libbpf-tools adds per exec (BPF time {bpf_ratio:.2}x); \
         events lost: {}",
        if rtrace_lost { "SOME" } else { "none" }
    );
    Ok(Row::new(
        "execsnoop",
        format!("exec storm, {expected} execs by {EXEC_WORKERS} workers"),
        "us/exec",
        (&setups, &results),
        (2, 1),
        Some(expected),
    ))
}

/// Runs a workload that prints `done NANOSECONDS` last; returns the
/// nanoseconds.
fn timed(cmd: &mut Command) -> anyhow::Result<f64> {
    let out = cmd
        .output()
        .with_context(|| format!("cannot start {cmd:?}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    done_ns(&text).with_context(|| format!("{cmd:?} said {text:?}"))
}

/// The time a workload reports in its last line, `done [...] NS`.
fn done_ns(text: &str) -> Option<f64> {
    text.lines()
        .last()?
        .strip_prefix("done ")?
        .split(' ')
        .next_back()?
        .trim()
        .parse()
        .ok()
}

/// Prints how many events each tracer attributed to the workload per
/// trial, against what the workload did.
fn report_events(setups: &[Setup], results: &[Outcome], expected: u64, what: &str) {
    println!();
    println!("{what} per trial (expected {expected}):");
    for (s, r) in setups.iter().zip(results).skip(1) {
        let seen: Vec<String> = r.stops.iter().map(|t| t.events.to_string()).collect();
        let warned = r.stops.iter().any(|t| t.stderr.contains("lost"));
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
}

fn tcplife() -> anyhow::Result<Row> {
    let rtrace = crate::build()?;
    let workload = crate::root().join("target/release/tcpsessions");
    // The server end of every session belongs to the workload's server,
    // which names itself so: one line per session should carry its name,
    // whatever context the kernel closed the socket in.
    let needle = "tcpserver";
    let setups = vec![
        Setup::bare(),
        Setup::libbpf_tools("tcplife", Ready::Stdout("PID"), Some(needle))?,
        Setup::traced(
            "rtrace tcplife",
            &rtrace,
            &["tcplife"],
            Ready::Stderr("Tracing"),
            Some(needle),
        ),
        Setup::traced(
            "rtrace tcplife --json",
            &rtrace,
            &["tcplife", "--json"],
            Ready::Stderr("Tracing"),
            Some(needle),
        ),
    ];
    eprintln!(
        "bench tcplife: {SESSIONS} loopback TCP sessions one after another (connect, 100 bytes \
         each way, close) between two processes pinned to CPU 0, median of {TRIALS} \
         interleaved trials"
    );
    let results = trials(&setups, "us/session", || {
        // Both ends on one CPU: each hand-off is then a context switch,
        // not a cross-CPU wakeup of an idle vCPU, whose cost swings with
        // whatever else runs and drowned the tracers' cost.
        let ns = timed(
            Command::new("taskset")
                .args(["-c", "0"])
                .arg(&workload)
                .args(["4", &SESSIONS.to_string(), "100", "100"]),
        )?;
        Ok((ns / 1000.0 / SESSIONS as f64, SESSIONS))
    })?;
    let (ratio, bpf_ratio) = report(&setups, &results, "us/session");
    report_events(
        &setups,
        &results,
        SESSIONS,
        "server ends attributed to the server process",
    );
    println!();
    println!(
        "rtrace adds {ratio:.2}x what libbpf-tools adds per TCP session (BPF time {bpf_ratio:.2}x)"
    );
    Ok(Row::new(
        "tcplife",
        format!("{SESSIONS} loopback TCP sessions"),
        "us/session",
        (&setups, &results),
        (2, 1),
        Some(SESSIONS),
    ))
}

/// getaddrinfo calls per trial of the gethostlatency benchmark.
const LOOKUPS: u64 = 2_000;

/// gethostlatency against libbpf-tools' on getaddrinfo of `localhost`
/// (from `/etc/hosts`): a uprobe and a uretprobe per lookup.
fn gethostlatency() -> anyhow::Result<Row> {
    let rtrace = crate::build()?;
    let workload = crate::root().join("target/release/lookups");
    let needle = "localhost";
    let setups = vec![
        Setup::bare(),
        Setup::libbpf_tools("gethostlatency", Ready::Stdout("TIME"), Some(needle))?,
        Setup::traced(
            "rtrace gethostlatency",
            &rtrace,
            &["gethostlatency"],
            Ready::Stderr("Tracing"),
            Some(needle),
        ),
    ];
    eprintln!(
        "bench gethostlatency: {LOOKUPS} getaddrinfo calls for localhost, one after another, \
         median of {TRIALS} interleaved trials"
    );
    let results = trials(&setups, "ns/lookup", || {
        let ns = timed(Command::new(&workload).args([needle, &LOOKUPS.to_string()]))?;
        Ok((ns / LOOKUPS as f64, LOOKUPS))
    })?;
    let (ratio, bpf_ratio) = report(&setups, &results, "ns/lookup");
    report_events(&setups, &results, LOOKUPS, "lookups of localhost seen");
    println!();
    println!(
        "rtrace adds {ratio:.2}x what libbpf-tools adds per lookup (BPF time {bpf_ratio:.2}x)"
    );
    Ok(Row::new(
        "gethostlatency",
        format!("{LOOKUPS} getaddrinfo calls"),
        "ns/lookup",
        (&setups, &results),
        (2, 1),
        Some(LOOKUPS),
    ))
}

/// Writes per trial of the argdist case.
const WRITES: u64 = 200_000;

/// bpftrace's form of argdist's count of write sizes to stdout.
const BPFTRACE_WRITES: &str =
    "tracepoint:syscalls:sys_enter_write /args->fd == 1/ { @[args->count] = count(); }";
/// bpftrace's form of argdist's histogram of write sizes to stdout.
const BPFTRACE_WRITE_HIST: &str =
    "tracepoint:syscalls:sys_enter_write /args->fd == 1/ { @ = hist(args->count); }";

/// argdist's interpreted expressions against bpftrace's compiled ones: a
/// count of write sizes to stdout, and a histogram of a longer expression.
fn argdist() -> anyhow::Result<Row> {
    let rtrace = crate::build()?;
    let setups = vec![
        Setup::bare(),
        Setup::traced(
            "bpftrace @[args->count] = count()",
            "bpftrace",
            &["-e", BPFTRACE_WRITES],
            Ready::Stdout("Attaching"),
            None,
        ),
        Setup::traced(
            "rtrace argdist -C args->count",
            &rtrace,
            &[
                "argdist",
                "-C",
                "t:syscalls:sys_enter_write():u64:args->count:args->fd == 1",
            ],
            Ready::Stderr("Tracing"),
            None,
        ),
        Setup::traced(
            "bpftrace @ = hist(args->count)",
            "bpftrace",
            &["-e", BPFTRACE_WRITE_HIST],
            Ready::Stdout("Attaching"),
            None,
        ),
        Setup::traced(
            "rtrace argdist -H args->count",
            &rtrace,
            &[
                "argdist",
                "-H",
                "t:syscalls:sys_enter_write():u64:args->count:args->fd == 1",
            ],
            Ready::Stderr("Tracing"),
            None,
        ),
        Setup::traced(
            "rtrace argdist -H of a 9-step expression",
            &rtrace,
            &[
                "argdist",
                "-H",
                "t:syscalls:sys_enter_write():u64:(args->count & 0xfff) * 2 + (args->fd << 1):args->fd == 1 && args->count > 0",
            ],
            Ready::Stderr("Tracing"),
            None,
        ),
    ];
    eprintln!(
        "bench argdist: {WRITES} writes of 64 bytes to stdout (/dev/null) by dd, median of \
         {TRIALS} interleaved trials"
    );
    let results = trials(&setups, "ns/write", || {
        // GNU dd writes `of=` through descriptor 1, which the filter asks for.
        let secs = seconds(|| {
            crate::run(Command::new("dd").args([
                "if=/dev/zero",
                "of=/dev/null",
                "bs=64",
                &format!("count={WRITES}"),
                "status=none",
            ]))
        })?;
        Ok((secs * 1e9 / WRITES as f64, WRITES))
    })?;
    let (ratio, bpf_ratio) = report(&setups, &results, "ns/write");
    let bare = results[0].cost;
    let hist_ratio = (results[4].cost - bare) / (results[3].cost - bare);
    let hist_bpf = results[4].bpf_ns / results[3].bpf_ns;
    println!();
    println!(
        "counts: rtrace argdist -C adds {ratio:.2}x what bpftrace adds per write (BPF time \
         {bpf_ratio:.2}x); histograms: -H adds {hist_ratio:.2}x (BPF time {hist_bpf:.2}x); \
         rtrace interprets what bpftrace compiles"
    );
    Ok(Row::new(
        "argdist",
        format!("{WRITES} writes of 64 bytes"),
        "ns/write",
        (&setups, &results),
        (2, 1),
        None,
    ))
}

/// A loop device over a file in `target/bench`, detached on drop.
struct Loop(String);

impl Loop {
    fn new() -> anyhow::Result<Self> {
        let dir = crate::root().join("target/bench");
        std::fs::create_dir_all(&dir)?;
        let file = dir.join("loop.img");
        std::fs::File::create(&file)?.set_len(64 << 20)?;
        let out = Command::new("losetup")
            .args(["--find", "--show"])
            .arg(&file)
            .output()
            .context("cannot run losetup (Debian package util-linux)")?;
        if !out.status.success() {
            bail!(
                "losetup failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(Self(String::from_utf8_lossy(&out.stdout).trim().to_owned()))
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.0]).status();
    }
}

/// One trial of the `directio` workload on `dev`: its cost per I/O, and
/// the I/Os it did.
fn direct_io(workload: &Path, dev: &str) -> anyhow::Result<(f64, u64)> {
    let total = IO_READS + IO_WRITES;
    let ns =
        timed(Command::new(workload).args([dev, &IO_READS.to_string(), &IO_WRITES.to_string()]))?;
    Ok((ns / total as f64, total))
}

fn biolatency() -> anyhow::Result<Row> {
    let rtrace = crate::build()?;
    let workload = crate::root().join("target/release/directio");
    let dev = Loop::new()?;
    let setups = vec![
        Setup::bare(),
        Setup::libbpf_tools("biolatency", Ready::Stdout("Tracing"), None)?,
        Setup::traced(
            "rtrace biolatency",
            &rtrace,
            &["biolatency"],
            Ready::Stderr("Tracing"),
            None,
        ),
        Setup::traced(
            "rtrace biolatency -Q -F -D",
            &rtrace,
            &["biolatency", "-Q", "-F", "-D"],
            Ready::Stderr("Tracing"),
            None,
        ),
    ];
    let total = IO_READS + IO_WRITES;
    eprintln!(
        "bench biolatency: {IO_READS} reads and {IO_WRITES} writes of 4 KiB with O_DIRECT on {}, \
         one at a time, median of {TRIALS} interleaved trials",
        dev.0
    );
    let results = trials(&setups, "ns/io", || direct_io(&workload, &dev.0))?;
    let (ratio, bpf_ratio) = report(&setups, &results, "ns/io");
    println!();
    // A loop device's I/O crosses to its worker thread, whose wakeup
    // varies by microseconds: more than the tracers add, so the BPF time is
    // the figure to judge by here.
    println!(
        "rtrace's BPF programs run {bpf_ratio:.2}x as long per direct I/O as libbpf-tools' \
         (added wall time {ratio:.2}x, within the loop device's noise)"
    );
    Ok(Row::new(
        "biolatency",
        format!("{total} direct 4 KiB I/Os on a loop device"),
        "ns/io",
        (&setups, &results),
        (2, 1),
        None,
    ))
}

/// Stacks at every event of a tracepoint: `rtrace profile -e
/// block:block_rq_insert` against `perf record -e block:block_rq_insert
/// -ag`, over direct writes to a loop device with an I/O scheduler (so that
/// each request is inserted). The cost per event is the time the tracer
/// adds to each write and its own CPU time; perf runs no BPF.
fn tracepoint() -> anyhow::Result<Row> {
    let rtrace = crate::build()?;
    let workload = crate::root().join("target/release/directio");
    let dev = Loop::new()?;
    let name = dev.0.trim_start_matches("/dev/");
    std::fs::write(format!("/sys/block/{name}/queue/scheduler"), "mq-deadline")
        .context("cannot give the loop device mq-deadline")?;
    let data = crate::root().join("target/bench/tracepoint-perf.data");
    let data = data.to_str().context("non-UTF-8 path")?.to_owned();
    let setups = vec![
        Setup::bare(),
        Setup::traced(
            "perf record -e block:block_rq_insert -ag",
            "perf",
            &[
                "record",
                "-q",
                "-e",
                "block:block_rq_insert",
                "-a",
                "-g",
                "-o",
                &data,
            ],
            Ready::After(Duration::from_secs(1)),
            None,
        ),
        Setup::traced(
            "rtrace profile -e block:block_rq_insert",
            &rtrace,
            &["profile", "-e", "block:block_rq_insert", "-f"],
            Ready::Stderr("Sampling"),
            None,
        ),
    ];
    eprintln!(
        "bench tracepoint: {IO_WRITES} writes of 4 KiB with O_DIRECT on {} (mq-deadline), one at \
         a time, median of {TRIALS} interleaved trials",
        dev.0
    );
    let results = trials(&setups, "ns/io", || {
        let ns = timed(Command::new(&workload).args([&dev.0, "0", &IO_WRITES.to_string()]))?;
        Ok((ns / IO_WRITES as f64, IO_WRITES))
    })?;
    let (ratio, _) = report(&setups, &results, "ns/io");
    // The whole cost of an event: what the workload waited, and the
    // tracer's own CPU time.
    let whole = |r: &Outcome| r.cost - results[0].cost + r.tracer_ns;
    let cost_ratio = whole(&results[2]) / whole(&results[1]);
    println!();
    println!(
        "rtrace adds {ratio:.2}x perf's time to each insert; with each tracer's own CPU time, \
         {cost_ratio:.2}x perf's cost per event (goal: at most 0.7x)"
    );
    let _ = std::fs::remove_file(&data);
    Ok(Row::new(
        "tracepoint",
        format!("{IO_WRITES} direct 4 KiB writes on a loop device with mq-deadline"),
        "ns/io",
        (&setups, &results),
        (2, 1),
        None,
    ))
}

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

/// Seconds `f` took.
fn seconds(f: impl FnOnce() -> anyhow::Result<()>) -> anyhow::Result<f64> {
    let t = std::time::Instant::now();
    f()?;
    Ok(t.elapsed().as_secs_f64())
}

/// profile's benchmark: CPU-bound fixtures with frame pointers against
/// `perf record -g`, then without them against DWARF mode, then a C build
/// ([`build`]). `RTRACE_BENCH_ONLY=build` runs the C build alone, whose
/// row then stands for profile in `bench all`.
fn profile() -> anyhow::Result<Row> {
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
    let mut ratios = Vec::new();
    for hz in ["99", "999"] {
        let setups = vec![
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
        eprintln!(
            "bench profile: {PROFILE_WORKERS} CPU-bound processes (frame pointers), \
             {PROFILE_MS} ms each, sampled at {hz} Hz on every CPU, \
             median of {TRIALS} interleaved trials"
        );
        let results = trials(&setups, STOLEN, || cpu_work(&fixture))?;
        report(&setups, &results, STOLEN);
        ratios.push((hz, shares(&results, 2, 1, 3)));
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
    for line in unwinding {
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

/// `perf record`'s arguments for DWARF call graphs of the whole machine
/// at `hz`, into `data`.
fn perf_dwarf<'a>(hz: &'a str, data: &'a str) -> [&'a str; 9] {
    [
        "record",
        "-q",
        "--call-graph",
        "dwarf",
        "-a",
        "-F",
        hz,
        "-o",
        data,
    ]
}

/// Samples perf lost, from its own statistics of `data`.
fn perf_lost(data: &str) -> u64 {
    let Ok(out) = Command::new("perf")
        .args(["report", "--stats", "-i", data])
        .stderr(Stdio::null())
        .output()
    else {
        return 0;
    };
    sum_after_colon(&String::from_utf8_lossy(&out.stdout), "LOST")
}

/// The sum of the numbers that follow the first `:` of each line of
/// `text` containing `marker` (perf's `LOST_SAMPLES events: 3`, a
/// histogram's `lo -> hi : count`).
fn sum_after_colon(text: &str, marker: &str) -> u64 {
    text.lines()
        .filter(|l| l.contains(marker))
        .filter_map(|l| {
            l.split(':')
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// Samples rtrace lost or could not give a stack: its warnings' counts of
/// stacks lost or walked by frame pointer for want of tables.
fn rtrace_lost(stderr: &str) -> u64 {
    stderr
        .lines()
        .filter(|l| l.starts_with("rtrace: warning:") && l.contains("lost"))
        .filter_map(|l| {
            l.trim_start_matches("rtrace: warning:")
                .split_whitespace()
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
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
        report(&setups, &results, STOLEN);
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

/// Cached 4 KiB preads per trial of the ext4slower benchmark.
const E4_READS: u64 = 200_000;
/// The same in the emulated guests, which run ten to fifty times slower.
const E4_GUEST_READS: u64 = 20_000;

/// An ext4 file system on a loop device, mounted under `target/bench`.
struct Ext4 {
    dir: PathBuf,
    _dev: Loop,
}

impl Ext4 {
    fn new() -> anyhow::Result<Self> {
        let dev = Loop::new()?;
        crate::run(
            Command::new("mke2fs")
                .args(["-q", "-F", "-t", "ext4", &dev.0])
                .env("MKE2FS_CONFIG", "/nonexistent"),
        )
        .context("cannot make the file system (Debian package e2fsprogs)")?;
        let dir = crate::root().join("target/bench/e4mnt");
        std::fs::create_dir_all(&dir)?;
        crate::run(Command::new("mount").args(["-t", "ext4", &dev.0]).arg(&dir))?;
        Ok(Self { dir, _dev: dev })
    }
}

impl Drop for Ext4 {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.dir).status();
    }
}

/// bpftrace timing the workload's syscall as the tracepoint path does
/// (without the file-system check), printing only slow calls: the one peer
/// that runs on a kernel without fentry and kprobes.
const BPFTRACE_SLOWER: &str = "BEGIN { printf(\"Tracing\\n\"); } \
    tracepoint:syscalls:sys_enter_pread64 { @s[tid] = nsecs; } \
    tracepoint:syscalls:sys_exit_pread64 /@s[tid]/ { $d = nsecs - @s[tid]; \
    delete(@s[tid]); if ($d > 10000000) { printf(\"%d %s %d\\n\", pid, comm, $d); } }";

/// ext4slower's cost on cached reads, on every attach path: the host's
/// (syscall tracepoints, against bpftrace; libbpf-tools' ext4slower cannot
/// attach here), then the VM guests' (fentry, kprobe and tracepoint,
/// against libbpf-tools).
fn ext4slower() -> anyhow::Result<Row> {
    let rtrace = crate::build()?;
    let workload = crate::root().join("target/release/fileops");
    let fs = Ext4::new()?;
    println!();
    match Command::new("/usr/sbin/ext4slower")
        .arg("-d")
        .arg("1")
        .output()
    {
        Ok(out) if !out.status.success() => println!(
            "libbpf-tools ext4slower cannot run on this kernel: {}",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("")
                .trim()
        ),
        Ok(_) => println!("libbpf-tools ext4slower runs here, but is measured in the guests"),
        Err(e) => println!("libbpf-tools ext4slower is missing: {e}"),
    }
    let setups = vec![
        Setup::bare(),
        Setup::traced(
            "bpftrace pread64 timing",
            "bpftrace",
            &["-e", BPFTRACE_SLOWER],
            Ready::Stdout("Tracing"),
            None,
        ),
        Setup::traced(
            "rtrace ext4slower (tracepoint)",
            &rtrace,
            &["ext4slower"],
            Ready::Stderr("Tracing"),
            None,
        ),
        Setup::traced(
            "rtrace ext4slower -m 0 (every read sent)",
            &rtrace,
            &["ext4slower", "-m", "0", "--json"],
            Ready::Stderr("Tracing"),
            None,
        ),
    ];
    eprintln!(
        "bench ext4slower: {E4_READS} cached 4 KiB preads on ext4 ({}), median of {TRIALS} \
         interleaved trials",
        fs.dir.display()
    );
    let dir = fs.dir.to_string_lossy().into_owned();
    let results = trials(&setups, "ns/read", || {
        let ns =
            timed(Command::new(&workload).args([dir.as_str(), "reads", &E4_READS.to_string()]))?;
        Ok((ns / E4_READS as f64, E4_READS))
    })?;
    let (ratio, bpf_ratio) = report(&setups, &results, "ns/read");
    println!();
    println!(
        "host (tracepoint path): rtrace adds {ratio:.2}x what bpftrace adds per cached read \
         (BPF time {bpf_ratio:.2}x), while also checking each file's file system"
    );
    guests_ext4slower()?;
    Ok(Row::new(
        "ext4slower",
        format!("{E4_READS} cached 4 KiB preads (syscall tracepoint path)"),
        "ns/read",
        (&setups, &results),
        (2, 1),
        None,
    ))
}

/// The guest part of the ext4slower benchmark: the `/init` body times the
/// workload bare and under each tracer, three rounds, and prints one
/// `{MARK} bench LABEL NS` line per run.
fn guests_ext4slower() -> anyhow::Result<()> {
    let mark = "=== rtrace-vm:";
    let body = format!(
        r#"N={E4_GUEST_READS}
dd if=/dev/zero of=/tmp/e4.img bs=1M count=32 2>/dev/null
dev=$(losetup -f)
losetup $dev /tmp/e4.img
# busybox sh runs its own applets before PATH: name the real mke2fs.
MKE2FS_CONFIG=/nonexistent /usr/sbin/mke2fs -q -F -t ext4 -E lazy_itable_init=1,lazy_journal_init=1,nodiscard $dev
mkdir -p /mnt/e4 && mount -t ext4 -o noinit_itable $dev /mnt/e4
# The kernel times every BPF program run; a tracer's programs show their
# totals in its descriptors' fdinfo.
echo 1 > /proc/sys/kernel/bpf_stats_enabled
bpf_ns() {{
    awk '/^run_time_ns:/ {{ s += $2 }} END {{ print s + 0 }}' /proc/$1/fdinfo/* 2>/dev/null
}}
one() {{
    label=$1; shift
    pid=
    before=0
    if [ $# -gt 0 ]; then
        "$@" >/tmp/out 2>/tmp/err & pid=$!
        # libbpf-tools buffers its header: give up waiting after 20 s.
        i=0
        while [ $i -lt 200 ] && ! grep -q Tracing /tmp/err /tmp/out 2>/dev/null; do
            sleep 0.1; i=$((i+1))
        done
        sleep 1
        before=$(bpf_ns $pid)
    fi
    ns=$(echo go | /t/fileops /mnt/e4 reads $N | sed -n 's/^done //p')
    bpf=0
    if [ -n "$pid" ]; then
        bpf=$(( $(bpf_ns $pid) - before ))
        kill -INT $pid; wait $pid
    fi
    echo "{mark} bench $label $ns $bpf"
}}
for round in 1 2 3 4 5; do
    one bare
    one libbpf-tools /usr/sbin/ext4slower
    one fentry /t/rtrace ext4slower --attach fentry
    one kprobe /t/rtrace ext4slower --attach kprobe
    one tracepoint /t/rtrace ext4slower --attach tracepoint
done"#
    );
    let runs = crate::vm::boot_all(
        &body,
        &["/usr/sbin/ext4slower"],
        &[],
        // The whole benchmark in each guest; a guest past this is hung.
        std::time::Duration::from_secs(2100),
    )?;
    const LABELS: [&str; 5] = ["bare", "libbpf-tools", "fentry", "kprobe", "tracepoint"];
    for run in runs {
        // Per label: wall ns per read, BPF ns per read.
        let mut ns: Vec<(Vec<f64>, Vec<f64>)> = vec![(Vec::new(), Vec::new()); LABELS.len()];
        for line in run.log.lines() {
            let Some(rest) = line.split_once(mark).map(|(_, r)| r.trim()) else {
                continue;
            };
            let f: Vec<&str> = rest.split_whitespace().collect();
            let [_, label, wall, bpf] = f[..] else {
                continue;
            };
            if f[0] != "bench" {
                continue;
            }
            let (Ok(wall), Ok(bpf)) = (wall.parse::<f64>(), bpf.parse::<f64>()) else {
                continue;
            };
            if let Some(i) = LABELS.iter().position(|l| *l == label) {
                ns[i].0.push(wall / E4_GUEST_READS as f64);
                ns[i].1.push(bpf / E4_GUEST_READS as f64);
            }
        }
        println!();
        println!(
            "guest {} ({E4_GUEST_READS} cached preads, median of 5 rounds):",
            run.package
        );
        if ns.iter().any(|(w, _)| w.is_empty()) {
            println!(
                "  incomplete run (timed out: {}); console in target/vm/{}.log",
                run.timed_out, run.package
            );
            continue;
        }
        let med: Vec<(f64, f64)> = ns
            .into_iter()
            .map(|(w, b)| (median(w), median(b)))
            .collect();
        println!(
            "  {:<32} {:>10} {:>10} {:>12} {:>12}",
            "configuration", "ns/read", "added", "bpf ns/read", "bpf vs peer"
        );
        for (i, label) in LABELS.iter().enumerate() {
            let name = match *label {
                "bare" => "bare".to_owned(),
                "libbpf-tools" => "libbpf-tools ext4slower".to_owned(),
                m => format!("rtrace ext4slower ({m})"),
            };
            let added = med[i].0 - med[0].0;
            let ratio = if i == 0 {
                "-".to_owned()
            } else {
                format!("{:.2}", med[i].1 / med[1].1)
            };
            println!(
                "  {name:<32} {:>10.0} {added:>10.0} {:>12.0} {ratio:>12}",
                med[i].0, med[i].1
            );
        }
        println!(
            "  (an emulated guest's wall time swings by tens of percent between runs; the \
             kernel's own BPF run time is the figure to judge by)"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{date, replace_between_markers};

    #[test]
    fn dates() {
        assert_eq!(date(0), "1 January 1970");
        assert_eq!(date(11_016), "29 February 2000");
        assert_eq!(date(20_416), "24 November 2025");
        assert_eq!(date(20_781), "24 November 2026");
    }

    #[test]
    fn replaces_between_markers() {
        let doc = "intro\n\n<!-- bench:all:begin -->\nold table\n<!-- bench:all:end -->\n\n\
                   <!-- bench:startup:begin -->\nkept\n<!-- bench:startup:end -->\nafter\n";
        let new = replace_between_markers(doc, "all", "| new |\n| --- |\n").unwrap();
        assert_eq!(
            new,
            "intro\n\n<!-- bench:all:begin -->\n\n| new |\n| --- |\n\n<!-- bench:all:end -->\n\n\
             <!-- bench:startup:begin -->\nkept\n<!-- bench:startup:end -->\nafter\n"
        );
        // Again with the same body: nothing changes.
        assert_eq!(
            replace_between_markers(&new, "all", "| new |\n| --- |").unwrap(),
            new
        );
    }

    #[test]
    fn missing_or_misplaced_markers_are_errors() {
        let err = replace_between_markers("no markers\n", "all", "x").unwrap_err();
        assert!(
            err.to_string()
                .contains("no <!-- bench:all:begin --> ... <!-- bench:all:end --> markers"),
            "{err}"
        );
        let only_begin = "<!-- bench:all:begin -->\nold\n";
        assert!(replace_between_markers(only_begin, "all", "x").is_err());
        let other = "<!-- bench:startup:begin -->\n<!-- bench:startup:end -->\n";
        assert!(replace_between_markers(other, "all", "x").is_err());
        let reversed = "<!-- bench:all:end -->\n<!-- bench:all:begin -->\n";
        let err = replace_between_markers(reversed, "all", "x").unwrap_err();
        assert!(err.to_string().contains("followed by"), "{err}");
    }
}

//! Overhead benchmarks. Each case runs the same workload bare, under rtrace
//! and under the peer in one run, interleaved, and reports ratios: absolute
//! times on shared machines are noise, ratios measured side by side are not.
//!
//! This file is the harness: it runs the cases, starts and stops their
//! tracers, interleaves the trials, takes medians, spreads and the BPF
//! programs' run time, prints the tables and rewrites the docs' tables.
//! Each case lives in its own file beside it; what several cases share
//! is in [`helpers`] and, for the generated C project, [`c_project`].

use std::{
    io::{BufRead, BufReader, Read},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    thread::JoinHandle,
    time::Duration,
};

use anyhow::{Context as _, bail};

mod argdist;
mod biolatency;
mod build;
mod c_project;
mod command;
mod execsnoop;
mod exporter;
mod ext4slower;
mod gethostlatency;
mod helpers;
mod html;
mod java;
mod memleak;
mod node;
mod offcputime;
mod profile;
mod python;
mod report;
mod runqlat;
mod startup;
mod stat;
mod tcplife;
mod top;
mod trace;
mod tracepoint;

/// Trials per configuration; the median is reported.
const TRIALS: usize = 5;

/// A tool's benchmark, which prints its own report and returns its row.
type Bench = fn() -> anyhow::Result<Row>;

/// Runs the named benchmark, or all.
pub fn run(name: Option<&str>) -> anyhow::Result<()> {
    let benches: [(&str, Bench); 11] = [
        ("runqlat", runqlat::run),
        ("execsnoop", execsnoop::run),
        ("tcplife", tcplife::run),
        ("biolatency", biolatency::run),
        ("gethostlatency", gethostlatency::run),
        ("ext4slower", ext4slower::run),
        ("offcputime", offcputime::run),
        ("profile", profile::run),
        ("argdist", argdist::run),
        ("exporter", exporter::run),
        ("tracepoint", tracepoint::run),
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
            let java = java::run().and_then(|t| update_doc("java", &t));
            let node = node::run().and_then(|t| update_doc("node", &t));
            let memleak = memleak::run().and_then(|t| update_doc("memleak", &t));
            let html = html::run().and_then(|t| update_doc("html", &t));
            all.and(startup)
                .and(command)
                .and(report)
                .and(stat)
                .and(trace)
                .and(top)
                .and(python)
                .and(java)
                .and(node)
                .and(memleak)
                .and(html)
        }
        Some("startup") => update_doc("startup", &startup::run()?),
        Some("command") => update_doc("command", &command::run()?),
        Some("report") => update_doc("report", &report::run()?),
        Some("stat") => update_doc("stat", &stat::run()?),
        Some("trace") => update_doc("trace", &trace::run()?),
        Some("top") => update_doc("top", &top::run()?),
        Some("python") if python::part().is_some() => {
            eprintln!(
                "bench: RTRACE_BENCH_PYTHON runs a part: docs/benchmarks.md is left as it is"
            );
            python::run().map(drop)
        }
        Some("python") => update_doc("python", &python::run()?),
        Some("java") if java::part().is_some() => {
            eprintln!("bench: RTRACE_BENCH_JAVA runs a part: docs/benchmarks.md is left as it is");
            java::run().map(drop)
        }
        Some("java") => update_doc("java", &java::run()?),
        Some("node") if node::part().is_some() => {
            eprintln!("bench: RTRACE_BENCH_NODE runs a part: docs/benchmarks.md is left as it is");
            node::run().map(drop)
        }
        Some("node") => update_doc("node", &node::run()?),
        Some("memleak") => update_doc("memleak", &memleak::run()?),
        Some("html") => update_doc("html", &html::run()?),
        Some("fleet") => update_doc("fleet", &exporter::fleet()?),
        Some(one) => match benches.iter().find(|(n, _)| *n == one) {
            Some((_, bench)) => bench().map(drop),
            None => bail!(
                "unknown benchmark {one}; known: all, {}, startup, command, report, stat, trace, top, \
                 python, java, node, memleak, html, fleet",
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
    /// Its resident memory and the anonymous part of it, in KiB, when
    /// told to stop.
    rss_kib: (u64, u64),
    /// The kernel memory of the BPF maps it holds, in KiB, when told to
    /// stop: none of it is in `rss_kib` unless mapped.
    maps_kib: u64,
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

/// The resident memory of process `pid` and its anonymous part, in KiB.
fn rss_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS"), field("RssAnon"))
}

/// The kernel memory of the BPF maps process `pid` holds, in KiB: the
/// `memlock` of each map descriptor's fdinfo.
fn maps_kib(pid: u32) -> u64 {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return 0;
    };
    let bytes: u64 = fds
        .flatten()
        .filter_map(|f| std::fs::read_to_string(f.path()).ok())
        .filter(|info| info.lines().any(|l| l.starts_with("map_type:")))
        .filter_map(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("memlock:"))
                .and_then(|v| v.trim().parse::<u64>().ok())
        })
        .sum();
    bytes / 1024
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
        let rss_kib = rss_kib(self.child.id());
        let maps_kib = maps_kib(self.child.id());
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
            rss_kib,
            maps_kib,
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

/// Runs so far of the loaded BPF programs named `name` (while run-time
/// statistics are on): for a sampling program, its samples, each counted
/// once however many programs it tail-calls.
fn bpf_runs_of(name: &str) -> u64 {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .filter(|p| p.name_as_str() == Some(name))
        .map(|p| p.run_count())
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
fn print_costs(setups: &[Setup], results: &[Outcome], unit: &str) -> (f64, f64) {
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
    tracefs_mounted()?;
    ["/usr/sbin", "/usr/bin"]
        .into_iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| p.exists())
        .with_context(|| format!("libbpf-tools' {name} is missing (Debian package libbpf-tools)"))
}

/// Mounts tracefs at `/sys/kernel/tracing` if nothing is there, as a
/// distribution's init does at boot: libbpf-tools attach classic
/// tracepoints through it and, unlike rtrace, do not mount it themselves
/// (a fresh machine without it had their execsnoop fail to attach).
fn tracefs_mounted() -> anyhow::Result<()> {
    let dir = Path::new("/sys/kernel/tracing");
    if dir.join("events").is_dir() {
        return Ok(());
    }
    let status = Command::new("mount")
        .args(["-t", "tracefs", "nodev"])
        .arg(dir)
        .status()
        .context("cannot run mount")?;
    anyhow::ensure!(
        status.success(),
        "cannot mount tracefs at {}",
        dir.display()
    );
    Ok(())
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

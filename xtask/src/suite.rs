//! The integration suite as `cargo xtask test` runs it: every test in a
//! process of its own, timed, on the host and in the VM guests; the times
//! in `target/test-times.tsv`, the slowest and the phases printed, and the
//! suite's length held to its budget.
//!
//! libtest on stable prints no test's time, and cargo stops at the first
//! test executable that fails. Running each test alone (`--exact NAME`)
//! gives both: its wall time, measured here, and a run that goes on past a
//! failure and reports every one at the end.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    fs,
    io::Read as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use crate::{cargo, root};

/// How a test ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// It passed.
    Passed,
    /// It failed, or its process died or hung.
    Failed,
    /// It passed over its whole check and said why (a line starting with
    /// `skipped:` on its output).
    Skipped,
}

impl Verdict {
    fn word(self) -> &'static str {
        match self {
            Verdict::Passed => "passed",
            Verdict::Failed => "failed",
            Verdict::Skipped => "skipped",
        }
    }

    /// A test's verdict from its process's exit and output: a test that
    /// passed but printed a line beginning `skipped:` checked nothing.
    pub fn of(success: bool, output: &str) -> Verdict {
        if !success {
            Verdict::Failed
        } else if output
            .lines()
            .any(|l| l.trim_start().starts_with("skipped:"))
        {
            Verdict::Skipped
        } else {
            Verdict::Passed
        }
    }
}

/// One test's run.
#[derive(Clone, Debug)]
pub struct Record {
    /// `suite::name`, the suite being the test file's name.
    pub test: String,
    /// Where it ran: `host`, or the guest's kernel (`6.1`, `6.12`).
    pub place: String,
    /// Its wall time.
    pub secs: f64,
    /// How it ended.
    pub verdict: Verdict,
}

/// A test of the integration crate: its executable and its name.
#[derive(Clone, Debug)]
pub struct Case {
    /// The test executable.
    pub exe: PathBuf,
    /// The test's name within it.
    pub name: String,
}

impl Case {
    /// `suite::name`.
    pub fn id(&self) -> String {
        format!("{}::{}", suite_of(&self.exe), self.name)
    }
}

/// Short name of a test executable (`…/runqlat-0123abcd` → `runqlat`).
pub fn suite_of(exe: &Path) -> String {
    let file = exe.file_name().unwrap_or_default().to_string_lossy();
    file.rsplit_once('-').map_or(&*file, |(s, _)| s).to_owned()
}

/// The longest a test may take before the budget check names it: a guest
/// emulates its CPUs, and runs twice as long.
pub fn limit(place: &str) -> f64 {
    if place == "host" { 60.0 } else { 120.0 }
}

/// A test over half again its [`limit`] fails the run, unless it is here:
/// at most ten, each with why and the time it was measured at. A test
/// merely over its limit is only named, since a loaded machine must not
/// fail the suite.
pub const ALLOWED: &[(&str, &str, &str)] = &[];

/// Tests the VM guests do not run, by `suite::` (a whole file) or
/// `suite::name`, each with why. The guests are there for what differs
/// between kernels: attach mechanisms and their fallbacks (kprobes,
/// fentry), the verifier's limits, BTF. What is the same on every kernel
/// (user space's pace, a workload's statistics, output formats, peers the
/// guests lack) the host checks alone.
pub const HOST_ONLY: &[(&str, &str)] = &[(
    "gethostlatency::",
    "needs a resolver configuration, NSS modules and Python, which the guests lack; uprobes \
     work on the host",
)];

/// The tests of `cases` that the guests run: all but [`HOST_ONLY`].
pub fn guest_cases(cases: &[Case]) -> Vec<Case> {
    cases
        .iter()
        .filter(|c| {
            let id = c.id();
            !HOST_ONLY.iter().any(|(p, _)| {
                if p.ends_with("::") {
                    id.starts_with(p)
                } else {
                    id == *p
                }
            })
        })
        .cloned()
        .collect()
}

/// Test executables of the integration crate, built by cargo.
pub fn executables() -> anyhow::Result<Vec<PathBuf>> {
    let out = crate::stdout_of(cargo().args([
        "test",
        "--release",
        "-p",
        "rtrace-integration-tests",
        "--no-run",
        "--message-format=json",
    ]))?;
    let mut exes = Vec::new();
    for line in out.lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if msg["profile"]["test"] == true
            && let Some(exe) = msg["executable"].as_str()
        {
            exes.push(PathBuf::from(exe));
        }
    }
    if exes.is_empty() {
        bail!("cargo built no integration test executables");
    }
    exes.sort_by_key(|e| suite_of(e));
    Ok(exes)
}

/// Every test of the integration crate whose `suite::name` contains
/// `filter` (all when it is empty), in file order.
pub fn cases(filter: &str) -> anyhow::Result<Vec<Case>> {
    let mut cases = Vec::new();
    for exe in executables()? {
        let list = crate::stdout_of(Command::new(&exe).args(["--list", "--format", "terse"]))?;
        for name in list.lines().filter_map(|l| l.strip_suffix(": test")) {
            let case = Case {
                exe: exe.clone(),
                name: name.to_owned(),
            };
            if case.id().contains(filter) {
                cases.push(case);
            }
        }
    }
    Ok(cases)
}

/// How long a host test may run before it counts as hung and is killed.
const HUNG: Duration = Duration::from_secs(600);

/// Runs one test on the host in a process of its own: its record, and
/// its output (stdout and stderr interleaved as it wrote them).
pub fn run_host(case: &Case, env: &[(&str, PathBuf)]) -> anyhow::Result<(Record, String)> {
    let log = root().join("target/test-output.log");
    let file = fs::File::create(&log).with_context(|| format!("cannot write {}", log.display()))?;
    let start = Instant::now();
    let mut child = Command::new(&case.exe)
        .args(["--exact", &case.name, "--test-threads=1", "--nocapture"])
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .spawn()
        .with_context(|| format!("cannot start {}", case.exe.display()))?;
    let mut hung = false;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        if start.elapsed() > HUNG {
            let _ = child.kill();
            let _ = child.wait();
            hung = true;
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let secs = start.elapsed().as_secs_f64();
    let mut output = String::new();
    fs::File::open(&log)?.read_to_string(&mut output)?;
    if hung {
        let _ = writeln!(output, "xtask: the test ran over {HUNG:?} and was killed");
    }
    let verdict = Verdict::of(status.is_some_and(|s| s.success()), &output);
    Ok((
        Record {
            test: case.id(),
            place: "host".into(),
            secs,
            verdict,
        },
        output,
    ))
}

/// Runs `cases` on the host one after another, printing a line a test and
/// the output of each that fails.
pub fn run_all_host(cases: &[Case], env: &[(&str, PathBuf)]) -> anyhow::Result<Vec<Record>> {
    let mut records = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let (record, output) = run_host(case, env)?;
        eprintln!(
            "xtask: test [{}/{}] host {} ... {} ({:.1} s)",
            i + 1,
            cases.len(),
            record.test,
            record.verdict.word(),
            record.secs
        );
        if record.verdict == Verdict::Failed {
            eprintln!(
                "---- output of {} ----\n{}---- end of {} ----",
                record.test, output, record.test
            );
        }
        records.push(record);
    }
    Ok(records)
}

/// The phases of a run and how long each took.
#[derive(Default)]
pub struct Phases(pub Vec<(String, f64)>);

impl Phases {
    /// Adds a phase's time.
    pub fn add(&mut self, name: &str, secs: f64) {
        self.0.push((name.to_owned(), secs));
    }
}

/// Writes `target/test-times.tsv`, prints the slowest tests, the phases,
/// the tests over their limits and the closing count; fails when a test
/// failed, or one took more than half again over its limit.
pub fn report(
    records: &[Record],
    phases: &Phases,
    total: f64,
    other_failures: &[String],
) -> anyhow::Result<()> {
    let failed = records.iter().any(|r| r.verdict == Verdict::Failed) || !other_failures.is_empty();
    let mut tsv = String::from("test\twhere\tsecs\tresult\n");
    for r in records {
        let _ = writeln!(
            tsv,
            "{}\t{}\t{:.1}\t{}",
            r.test,
            r.place,
            r.secs,
            r.verdict.word()
        );
    }
    let _ = writeln!(
        tsv,
        "TOTAL\tall\t{total:.0}\t{}",
        if failed { "failed" } else { "passed" }
    );
    let path = root().join("target/test-times.tsv");
    fs::write(&path, tsv).with_context(|| format!("cannot write {}", path.display()))?;

    let mut slowest: Vec<&Record> = records.iter().collect();
    slowest.sort_by(|a, b| b.secs.total_cmp(&a.secs));
    println!("\nThe 15 slowest tests (all in {}):", path.display());
    for r in slowest.iter().take(15) {
        println!(
            "  {:>7.1} s  {:<5} {} ({})",
            r.secs,
            r.place,
            r.test,
            r.verdict.word()
        );
    }
    let mut per_place: BTreeMap<&str, (usize, f64)> = BTreeMap::new();
    for r in records {
        let e = per_place.entry(&r.place).or_default();
        e.0 += 1;
        e.1 += r.secs;
    }
    let places: Vec<String> = per_place
        .iter()
        .map(|(p, (n, s))| format!("{p}: {n} tests, {s:.0} s"))
        .collect();
    println!("Tests run: {}", places.join("; "));
    let phase_line: Vec<String> = phases
        .0
        .iter()
        .map(|(n, s)| format!("{n} {s:.0} s"))
        .collect();
    println!(
        "Phases: {}; total {total:.0} s ({:.1} min)",
        phase_line.join(", "),
        total / 60.0
    );

    let over = budget(records);
    for o in &over.named {
        println!("over its limit: {o}");
    }
    for f in other_failures {
        println!("FAILED: {f}");
    }
    for r in records.iter().filter(|r| r.verdict == Verdict::Failed) {
        println!("FAILED: {} ({})", r.test, r.place);
    }
    let count = |v| records.iter().filter(|r| r.verdict == v).count();
    println!(
        "{} passed, {} failed, {} skipped",
        count(Verdict::Passed),
        count(Verdict::Failed) + other_failures.len(),
        count(Verdict::Skipped)
    );
    if !over.failing.is_empty() {
        bail!(
            "over half again their limits (60 s on the host, 120 s in a guest), and not in \
             suite::ALLOWED: {}",
            over.failing.join(", ")
        );
    }
    if failed {
        bail!("the test run failed");
    }
    Ok(())
}

/// What [`budget`] found.
#[derive(Debug, Default)]
pub struct Over {
    /// Every test over its limit, with its time.
    pub named: Vec<String>,
    /// Those over half again their limit and not allowed.
    pub failing: Vec<String>,
}

/// The tests over their limits, and those that fail the run.
pub fn budget(records: &[Record]) -> Over {
    let mut over = Over::default();
    for r in records {
        let limit = limit(&r.place);
        if r.secs <= limit {
            continue;
        }
        let line = format!(
            "{} ({}) took {:.0} s, its limit {limit:.0} s",
            r.test, r.place, r.secs
        );
        let allowed = ALLOWED.iter().any(|(t, _, _)| *t == r.test);
        if r.secs > 1.5 * limit && !allowed {
            over.failing.push(line.clone());
        }
        over.named.push(line);
    }
    over
}

/// `cargo xtask test --repeat N FILTER`: the chosen tests, N times each on
/// the host, with each run's time and the counts of passes and failures.
pub fn repeat(times: u32, filter: &str, env: &[(&str, PathBuf)]) -> anyhow::Result<()> {
    let cases = cases(filter)?;
    if cases.is_empty() {
        bail!("no test matches {filter:?}");
    }
    let mut failures = 0;
    for case in &cases {
        let mut secs = Vec::new();
        let mut counts = BTreeMap::new();
        for i in 0..times {
            let (record, output) = run_host(case, env)?;
            eprintln!(
                "xtask: repeat {}/{times} {} ... {} ({:.1} s)",
                i + 1,
                record.test,
                record.verdict.word(),
                record.secs
            );
            if record.verdict == Verdict::Failed {
                eprintln!("---- output ----\n{output}---- end ----");
            }
            *counts.entry(record.verdict.word()).or_insert(0) += 1;
            secs.push(format!("{:.1}", record.secs));
        }
        let failed = counts.get("failed").copied().unwrap_or(0);
        failures += failed;
        println!(
            "{}: {} passed, {failed} failed, {} skipped of {times}; times (s): {}",
            case.id(),
            counts.get("passed").copied().unwrap_or(0),
            counts.get("skipped").copied().unwrap_or(0),
            secs.join(" ")
        );
    }
    if failures > 0 {
        bail!("{failures} of the repeated runs failed");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(test: &str, place: &str, secs: f64) -> Record {
        Record {
            test: test.into(),
            place: place.into(),
            secs,
            verdict: Verdict::Passed,
        }
    }

    #[test]
    fn budget_names_every_test_over_its_limit_and_fails_those_half_again_over() {
        let records = [
            record("a::fast", "host", 59.0),
            record("a::slow", "host", 61.0),
            record("a::hung", "host", 91.0),
            record("a::guest", "6.1", 170.0),
            record("a::guest_hung", "6.12", 181.0),
        ];
        let over = budget(&records);
        assert_eq!(over.named.len(), 4, "{over:?}");
        assert_eq!(over.failing.len(), 2, "{over:?}");
        assert!(over.failing[0].starts_with("a::hung (host)"));
        assert!(over.failing[1].starts_with("a::guest_hung (6.12)"));
    }

    #[test]
    fn the_allow_list_is_short_and_says_why() {
        assert!(ALLOWED.len() <= 10);
        for (test, why, measured) in ALLOWED {
            assert!(test.contains("::") && !why.is_empty() && measured.ends_with(" s"));
        }
    }

    #[test]
    fn a_test_that_says_it_skipped_counts_as_skipped() {
        assert_eq!(
            Verdict::of(true, "running\nskipped: no perf here\n"),
            Verdict::Skipped
        );
        assert_eq!(Verdict::of(true, "skipped loading: x\n"), Verdict::Passed);
        assert_eq!(Verdict::of(false, "skipped: x\n"), Verdict::Failed);
        assert_eq!(Verdict::of(true, "test x ... ok\n"), Verdict::Passed);
    }

    #[test]
    fn suites_are_named_by_their_file() {
        assert_eq!(suite_of(Path::new("/t/deps/runqlat-0123abcd")), "runqlat");
        assert_eq!(suite_of(Path::new("profile_events-99")), "profile_events");
    }
}

//! Names belong to processes, not to pids (issue 52). Program A runs and
//! exits, then program B is started on A's pid (forced through
//! `ns_last_pid`): two Mono programs of one code layout and different
//! names (`Hot.exe`, `Cold.exe`), whose perf maps Mono writes at exit
//! (`--jitmap`), and two Python programs (`pyalpha.py`, and `pyomega.py`,
//! written from it with its names changed).
//! Both run without address randomisation, so that the other program's
//! names would fit each one's addresses: every output must name each
//! process by its own map or code objects, in the shares each program
//! measured itself (within 4 standard deviations). perf, run beside on the
//! same reuse, is the reference that fails: its names of A are printed.
//! And naming after the run: `profile -p PID --pprof F` on a process that
//! outlives the run says its JIT frames are unnamed and `rtrace report F`
//! names them once it has exited; `--wait-exit` names them live; and a
//! recording that saw A and B is named later each by its own map.
//!
//! The programs of A and B run under one command name of the test's own
//! (as two programs would both be `mono`), which sets them apart from
//! other processes of the machine only. Each test holds the binary's lock
//! ([`serial`]): the pids are forced, and the system-wide profiles must
//! not see another test's programs. The VM guests have no Mono: there the
//! tests say so and return.

use std::{
    collections::BTreeMap,
    os::unix::process::ExitStatusExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use rtrace_integration_tests::{
    Rtrace, SIGINT,
    browser::{Browser, browser_available},
    in_guest, json_lines, parse_folded,
    pidreuse::{
        Cleanup, Finished, Names, finish, has_exited, monotonic_secs, serial, share_within,
        spawn_on_pid,
    },
    profile::READY,
    run, workload_bin,
};

/// The sampling rate: some hundreds of samples a program.
const HZ: &str = "199";
/// How far a share may stray from what the programs measured.
const SDS: f64 = 4.0;
/// Debian's Mono, and Debian bookworm's Python (as `python.rs` runs it).
const MONO: &str = "/usr/bin/mono";
const PYTHON: &str = "/usr/bin/python3.11";

type Folded = BTreeMap<Vec<String>, u64>;

/// Whether to skip: the VM guests have no Mono (and no perf or browser).
fn skipped() -> bool {
    let guest = in_guest();
    if guest {
        eprintln!("skipped: the VM guests have no Mono; the host runs it");
    }
    guest
}

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("rtrace-pidreuse-{}-{name}", std::process::id()))
}

fn perf_map(pid: u32) -> PathBuf {
    PathBuf::from(format!("/tmp/perf-{pid}.map"))
}

/// A command name of this test process's own: `tag` and our pid.
fn comm(tag: &str) -> String {
    format!("{tag}{}", std::process::id())
}

/// Mono fixture `exe` (`Hot.exe`, `Cold.exe`) for `seconds` of work, as
/// `comm`, writing its perf map at exit.
fn mono(names: &Names, comm: &str, exe: &str, seconds: &str) -> Command {
    let mut cmd = names.command(MONO, comm);
    cmd.arg(workload_bin(exe))
        .arg(seconds)
        .env("MONO_ENV_OPTIONS", "--jitmap");
    cmd
}

/// Python script `script` for `seconds` of work, as `comm`.
fn python(names: &Names, comm: &str, script: &Path, seconds: &str) -> Command {
    let mut cmd = names.command(PYTHON, comm);
    cmd.arg(script).arg(seconds);
    cmd
}

/// Mono's Hot.exe as `mono`, with its map written at exit, for the tests
/// by pid.
fn plain_hot(seconds: &str) -> Child {
    Command::new("mono")
        .arg(workload_bin("Hot.exe"))
        .arg(seconds)
        .env("MONO_ENV_OPTIONS", "--jitmap")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cannot run mono (Debian package mono-runtime)")
}

/// How a program's frames are known by name: any frame containing
/// `marker` is the program's, and `funcs` are its two functions (the
/// first the one its split calls hot).
#[derive(Clone, Copy)]
struct Program {
    marker: &'static str,
    funcs: [&'static str; 2],
}

const HOT: Program = Program {
    marker: "HotProgram:",
    funcs: ["HotProgram:Hot", "HotProgram:Warm"],
};
const COLD: Program = Program {
    marker: "ColdProgram:",
    funcs: ["ColdProgram:Fast", "ColdProgram:Slow"],
};
const ALPHA: Program = Program {
    marker: "alpha",
    funcs: ["alpha_spin", "alpha_rest"],
};
const OMEGA: Program = Program {
    marker: "omega",
    funcs: ["omega_spin", "omega_rest"],
};

/// Samples of programs `a` and `b` by the function that names them.
#[derive(Debug, Default)]
struct Counts {
    /// A's two functions.
    a: [u64; 2],
    /// B's two functions.
    b: [u64; 2],
    /// Stacks with frames of both programs: names lent across.
    crossed: u64,
    /// Stacks of neither program whose leaf is `[unknown]`: JIT frames
    /// left unnamed.
    unnamed: u64,
}

impl Counts {
    /// From folded stacks, of command `comm` only.
    fn of_folded(folded: &Folded, comm: &str, a: Program, b: Program) -> Self {
        let mut c = Self::default();
        for (stack, &n) in folded {
            if stack.first().is_none_or(|f| f != comm) {
                continue;
            }
            let has = |p: Program| stack[1..].iter().any(|f| f.contains(p.marker));
            let (in_a, in_b) = (has(a), has(b));
            if in_a && in_b {
                c.crossed += n;
            }
            let with = |name: &str| stack[1..].iter().any(|f| f.contains(name));
            for i in 0..2 {
                if with(a.funcs[i]) {
                    c.a[i] += n;
                }
                if with(b.funcs[i]) {
                    c.b[i] += n;
                }
            }
            if !in_a && !in_b && stack.len() > 1 && stack.last().is_some_and(|l| l == "[unknown]") {
                c.unnamed += n;
            }
        }
        c
    }

    /// From a table's rows: (symbol, self samples).
    fn of_rows<'r>(rows: impl IntoIterator<Item = (&'r str, u64)>, a: Program, b: Program) -> Self {
        let mut c = Self::default();
        for (name, n) in rows {
            for i in 0..2 {
                if name.contains(a.funcs[i]) {
                    c.a[i] += n;
                }
                if name.contains(b.funcs[i]) {
                    c.b[i] += n;
                }
            }
        }
        c
    }

    fn named_a(&self) -> u64 {
        self.a[0] + self.a[1]
    }

    fn named_b(&self) -> u64 {
        self.b[0] + self.b[1]
    }
}

/// Checks `c` (of output `what`) against what the programs measured:
/// nothing crossed; each program's split within [`SDS`]; each program's
/// share of the named samples its process's share of both processes' CPU
/// time, within [`SDS`] (a name lent from one process to the other moves
/// samples from one program to the other, which this catches whichever
/// way; the CPU time, not the programs' own clocks, which for Mono's
/// count wall time, so that a machine busier while one ran than while
/// the other did moves nothing);
/// with `jit`, at least 95 % of the JIT samples named.
fn check(what: &str, c: &Counts, a: &Finished, b: &Finished, jit: bool, errors: &mut Vec<String>) {
    eprintln!("{what}: {c:?}");
    let mut push = |r: Result<(), String>| {
        if let Err(e) = r {
            errors.push(format!("{what}: {e}"));
        }
    };
    if c.crossed > 0 {
        push(Err(format!(
            "{} samples have frames of both programs",
            c.crossed
        )));
    }
    for (who, named) in [("A", c.named_a()), ("B", c.named_b())] {
        if named < 100 {
            push(Err(format!(
                "only {named} samples named by {who}'s functions"
            )));
        }
    }
    push(share_within(
        "A's first function",
        c.a[0],
        c.a[1],
        a.hot_share(),
        SDS,
    ));
    push(share_within(
        "B's first function",
        c.b[0],
        c.b[1],
        b.hot_share(),
        SDS,
    ));
    let want = a.cpu_ns / (a.cpu_ns + b.cpu_ns);
    push(share_within(
        "A's share of both programs' named samples, against its share of their CPU time",
        c.named_a(),
        c.named_b(),
        want,
        SDS,
    ));
    if jit {
        let named = c.named_a() + c.named_b();
        if (named as f64) < 0.95 * (named + c.unnamed) as f64 {
            push(Err(format!(
                "only {named} of {} JIT samples named",
                named + c.unnamed
            )));
        }
    }
}

/// One process's rows of a `--sort pid,sym --hierarchy --no-children
/// --json` report: its samples, and its symbols' rows (name, self
/// samples).
#[derive(Debug)]
struct ProcessRow {
    samples: u64,
    syms: Vec<(String, u64)>,
}

impl ProcessRow {
    fn names(&self, p: Program) -> u64 {
        self.syms
            .iter()
            .filter(|(s, _)| s.contains(p.marker))
            .map(|(_, n)| n)
            .sum()
    }
}

/// The process rows of pid `pid` in such a report, in its order. The
/// reports are asked for the programs' command only (`--comms`): a
/// process's samples between its fork and its exec, under the test
/// binary's name, would be a row of their own.
fn process_rows(json: &str, pid: u32) -> Vec<ProcessRow> {
    let mut out: Vec<ProcessRow> = Vec::new();
    let mut mine = false;
    for row in json_lines(json) {
        match row["depth"].as_u64() {
            Some(0) => {
                mine = row["pid"].as_u64() == Some(u64::from(pid));
                if mine {
                    out.push(ProcessRow {
                        samples: row["self_samples"].as_u64().unwrap_or(0),
                        syms: Vec::new(),
                    });
                }
            }
            Some(_) if mine => {
                let sym = row["sym"].as_str().unwrap_or_default().to_owned();
                let n = row["self_samples"].as_u64().unwrap_or(0);
                out.last_mut().unwrap().syms.push((sym, n));
            }
            _ => {}
        }
    }
    out
}

/// The two process rows of a pid both programs had, A's first: one names
/// only A's functions, the other only B's, and their samples split as
/// the processes' CPU time did.
fn check_process_rows(
    what: &str,
    rows: &[ProcessRow],
    a: &Finished,
    b: &Finished,
    errors: &mut Vec<String>,
) {
    eprintln!("{what}: {rows:?}");
    if rows.len() != 2 {
        errors.push(format!(
            "{what}: {} rows for pid {}, not one for each of the two processes: {rows:?}",
            rows.len(),
            a.pid
        ));
        return;
    }
    let of_a: Vec<&ProcessRow> = rows.iter().filter(|r| r.names(HOT) > 0).collect();
    let of_b: Vec<&ProcessRow> = rows.iter().filter(|r| r.names(COLD) > 0).collect();
    let (ra, rb) = match (of_a.as_slice(), of_b.as_slice()) {
        ([ra], [rb]) if !std::ptr::eq(*ra, *rb) => (*ra, *rb),
        _ => {
            errors.push(format!(
                "{what}: not one row naming HotProgram and another naming ColdProgram: {rows:?}"
            ));
            return;
        }
    };
    let want = a.cpu_ns / (a.cpu_ns + b.cpu_ns);
    if let Err(e) = share_within(
        "A's row's share of both rows' samples, against A's share of their CPU time",
        ra.samples,
        rb.samples,
        want,
        SDS,
    ) {
        errors.push(format!("{what}: {e}"));
    }
    let c = Counts::of_rows(
        ra.syms
            .iter()
            .chain(&rb.syms)
            .map(|(s, n)| (s.as_str(), *n)),
        HOT,
        COLD,
    );
    for (who, p, row) in [("A", HOT, ra), ("B", COLD, rb)] {
        let named = row.names(p);
        if named < 100 {
            errors.push(format!("{what}: {who}'s row names only {named} samples"));
        }
    }
    for (who, r, (first, second)) in [("A", a, (c.a[0], c.a[1])), ("B", b, (c.b[0], c.b[1]))] {
        if let Err(e) = share_within(
            &format!("{who}'s first function in its row"),
            first,
            second,
            r.hot_share(),
            SDS,
        ) {
            errors.push(format!("{what}: {e}"));
        }
    }
}

/// The table of an `--html` page, as a browser shows it: (command,
/// symbol, self samples) of each row.
fn html_table(page: &Path) -> Vec<(String, String, u64)> {
    let browser = Browser::start();
    browser.goto(page);
    browser.wait_for(
        "document.body && document.body.dataset.ready === '1'",
        Duration::from_secs(20),
    );
    let rows = browser.execute(
        "return Array.from(document.querySelectorAll('#report tbody tr'),
             r => [r.dataset.comm, r.dataset.name, Number(r.dataset.self)]);",
        Vec::new(),
    );
    rows.as_array()
        .unwrap_or_else(|| panic!("no table rows: {rows}"))
        .iter()
        .map(|r| {
            (
                r[0].as_str().unwrap_or_default().to_owned(),
                r[1].as_str().unwrap_or_default().to_owned(),
                r[2].as_f64().unwrap_or(0.0) as u64,
            )
        })
        .collect()
}

/// A `perf record -a`, killed if the test fails while it runs: it would
/// record until stopped.
struct Perf(Option<Child>);

impl Drop for Perf {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Whether perf is here: without it, the reference is skipped, saying so.
fn perf_available() -> bool {
    Command::new("perf")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// How perf named the samples of process `pid`'s command `comm` before
/// time `before` (CLOCK_MONOTONIC seconds): the samples of the first
/// process of the pid, A. Counts by the program the stack's frames name,
/// and the total parsed.
fn perf_names_of_a(
    data: &Path,
    comm: &str,
    pid: u32,
    before: f64,
) -> (BTreeMap<&'static str, u64>, u64) {
    let out = Command::new("perf")
        .args([
            "script",
            "-F",
            "comm,pid,time,ip,sym",
            "--comms",
            comm,
            "-i",
        ])
        .arg(data)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "perf script: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let mut names: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut parsed = 0;
    // Samples are a header line (`comm pid time:`) and frame lines,
    // leaf first, each indented, then a blank line.
    let mut in_a = false;
    let mut frames: Vec<&str> = Vec::new();
    let mut flush = |in_a: bool, frames: &mut Vec<&str>| {
        if in_a {
            let name = if frames.iter().any(|f| f.contains(HOT.marker)) {
                "HotProgram (A's own)"
            } else if frames.iter().any(|f| f.contains(COLD.marker)) {
                "ColdProgram (B's)"
            } else if frames.first().is_some_and(|f| f.ends_with("[unknown]")) {
                "[unknown] leaf"
            } else {
                "other"
            };
            *names.entry(name).or_default() += 1;
        }
        frames.clear();
    };
    for line in text.lines() {
        if line.trim().is_empty() {
            continue;
        }
        if line.starts_with(char::is_whitespace) {
            frames.push(line.trim());
            continue;
        }
        flush(in_a, &mut frames);
        let f: Vec<&str> = line.split_whitespace().collect();
        let time = f
            .iter()
            .rev()
            .find_map(|t| t.strip_suffix(':')?.parse::<f64>().ok());
        in_a = f.first() == Some(&comm)
            && f.get(1) == Some(&pid.to_string().as_str())
            && time.is_some_and(|t| t < before);
        parsed += 1;
    }
    flush(in_a, &mut frames);
    (names, parsed)
}

/// Panics with every error found, one a line.
fn report_errors(errors: &[String]) {
    assert!(
        errors.is_empty(),
        "{} checks failed:\n{}",
        errors.len(),
        errors.join("\n")
    );
}

/// Mono A (Hot.exe, 3 s) runs and exits; Mono B (Cold.exe, 2 s, the same
/// code at the same addresses) is started on A's pid. One system-wide
/// recording, with perf beside it, is read in every output: the live
/// folded stacks, the pprof file as folded stacks and as a report with a
/// row per process, and the HTML page's table. In each, A's samples are
/// named by A's map (read at its exit, before B's took its place on disk)
/// and B's by B's, in the split each program measured; the report has
/// two rows for the pid, split as the processes' CPU time. perf's naming
/// of A (it reads the map on disk, B's, at report time) is printed.
#[test]
fn mono_programs_on_one_pid_are_each_named_by_their_own_map() {
    if skipped() {
        return;
    }
    let lock = serial();
    let names = Names::new("mono");
    let comm = comm("rtm");
    let mut files = Cleanup::default();
    let pprof = files.add(temp("mono.pb.gz"));
    let page = files.add(temp("mono.html"));
    let data = files.add(temp("perf.data"));
    let perf = perf_available().then(|| {
        let child = Command::new("perf")
            .args([
                "record",
                "-q",
                "-a",
                "-g",
                "-F",
                HZ,
                "-k",
                "CLOCK_MONOTONIC",
                "-o",
            ])
            .arg(&data)
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        // perf record -a first writes every process's maps.
        std::thread::sleep(Duration::from_millis(800));
        Perf(Some(child))
    });
    if perf.is_none() {
        eprintln!("perf not found: the reference run of perf is skipped");
    }
    let rtrace = Rtrace::start_until(
        &[
            "profile",
            "-F",
            HZ,
            "-f",
            "--pprof",
            pprof.to_str().unwrap(),
            "--html",
            page.to_str().unwrap(),
        ],
        READY,
    );
    let a = finish(mono(&names, &comm, "Hot.exe", "3").spawn().unwrap());
    files.add(perf_map(a.pid));
    let b_started = monotonic_secs();
    let b = spawn_on_pid(&lock, &mut mono(&names, &comm, "Cold.exe", "2"), a.pid)
        .unwrap_or_else(|e| panic!("{e}"));
    let b = finish(b);
    // rtrace reads B's map as B exits.
    std::thread::sleep(Duration::from_secs(1));
    let (code, live, stderr) = rtrace.stop(SIGINT);
    assert_eq!(code, 0, "{stderr}");
    if let Some(mut perf) = perf.and_then(|mut p| p.0.take()) {
        // SAFETY: a signal to our own child.
        unsafe { libc::kill(perf.id() as i32, SIGINT) };
        // perf record ends by raising the signal it caught again.
        let status = perf.wait().unwrap();
        assert!(
            status.success() || status.signal() == Some(SIGINT),
            "perf record failed: {status}"
        );
    }
    eprintln!(
        "A: pid {} start {} cpu {:.2} s, {}B: pid {} start {} cpu {:.2} s, {}",
        a.pid,
        a.start_ticks,
        a.cpu_ns / 1e9,
        a.stdout,
        b.pid,
        b.start_ticks,
        b.cpu_ns / 1e9,
        b.stdout
    );

    let mut errors = Vec::new();
    let folded = parse_folded(&live);
    check(
        "live folded",
        &Counts::of_folded(&folded, &comm, HOT, COLD),
        &a,
        &b,
        true,
        &mut errors,
    );
    let (code, later, stderr) = run(&["report", pprof.to_str().unwrap(), "-f"]);
    if code == 0 {
        check(
            "report -f of the pprof",
            &Counts::of_folded(&parse_folded(&later), &comm, HOT, COLD),
            &a,
            &b,
            true,
            &mut errors,
        );
    } else {
        errors.push(format!("rtrace report -f failed: {stderr}"));
    }
    let (code, table, stderr) = run(&[
        "report",
        pprof.to_str().unwrap(),
        "--sort",
        "pid,sym",
        "--hierarchy",
        "--no-children",
        "--json",
        "--comms",
        comm.as_str(),
    ]);
    let rows = process_rows(&table, a.pid);
    if code == 0 {
        check_process_rows(
            "report --sort pid,sym --hierarchy",
            &rows,
            &a,
            &b,
            &mut errors,
        );
    } else {
        errors.push(format!("rtrace report --sort pid,sym failed: {stderr}"));
    }
    // --sort pid alone: the same two rows.
    let (code, by_pid, stderr) = run(&[
        "report",
        pprof.to_str().unwrap(),
        "--sort",
        "pid",
        "--no-children",
        "--json",
        "--comms",
        comm.as_str(),
    ]);
    if code == 0 {
        let mut flat: Vec<u64> = json_lines(&by_pid)
            .iter()
            .filter(|r| r["pid"].as_u64() == Some(u64::from(a.pid)))
            .filter_map(|r| r["self_samples"].as_u64())
            .collect();
        let mut nested: Vec<u64> = rows.iter().map(|r| r.samples).collect();
        flat.sort_unstable();
        nested.sort_unstable();
        if flat.len() != 2 || flat != nested {
            errors.push(format!(
                "report --sort pid: rows of pid {} with {flat:?} samples, not the two \
                 processes' {nested:?}",
                a.pid
            ));
        }
    } else {
        errors.push(format!("rtrace report --sort pid failed: {stderr}"));
    }
    if browser_available() {
        let table = html_table(&page);
        let rows = table
            .iter()
            .filter(|(c, _, _)| *c == comm)
            .map(|(_, s, n)| (s.as_str(), *n));
        check(
            "the page's table",
            &Counts::of_rows(rows, HOT, COLD),
            &a,
            &b,
            false,
            &mut errors,
        );
    } else {
        eprintln!("no chromium and chromedriver here: the page's table is not read");
    }

    // The reference: perf's names of A's samples, beside rtrace's.
    if perf_available() {
        let (perf_names, parsed) = perf_names_of_a(&data, &comm, a.pid, b_started);
        let of_a: u64 = perf_names.values().sum();
        eprintln!(
            "perf named A's {of_a} samples (pid {}, before B started; {parsed} samples of \
             {comm} parsed): {perf_names:?}",
            a.pid
        );
        let rtrace_a = rows
            .iter()
            .find(|r| r.names(HOT) > 0)
            .map(|r| (r.samples, r.names(HOT), r.names(COLD)));
        eprintln!(
            "rtrace named A's process (samples, by HotProgram, by ColdProgram): {rtrace_a:?}"
        );
        assert!(
            of_a > 0,
            "no sample of A's parsed from perf script ({parsed} samples of {comm})"
        );
    }
    report_errors(&errors);
}

/// Python A (pyalpha.py, 3 s) runs and exits; Python B (pyomega.py, the
/// same code under other names, 2 s) is started on A's pid, with no
/// flags: rtrace names Python frames from the code objects its
/// in-kernel walk finds, which for one layout without address
/// randomisation sit at the same addresses in both. Each program is
/// named by its own code objects, in its own split.
#[test]
fn python_programs_on_one_pid_are_each_named_by_their_own_code() {
    if skipped() {
        return;
    }
    // The twins are one layout: the second is the first renamed, written
    // here (Python names a module by its file).
    let alpha = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/pyalpha.py");
    let dir = temp("omega");
    std::fs::create_dir_all(&dir).unwrap();
    let mut files = Cleanup::default();
    let omega = files.add(dir.join("pyomega.py"));
    let text = std::fs::read_to_string(&alpha).unwrap();
    std::fs::write(&omega, text.replace("alpha", "omega")).unwrap();
    let lock = serial();
    let names = Names::new("python");
    let comm = comm("rtp");
    let rtrace = Rtrace::start_until(&["profile", "-F", HZ, "-f", "-v"], READY);
    let a = finish(python(&names, &comm, &alpha, "3").spawn().unwrap());
    let b = spawn_on_pid(&lock, &mut python(&names, &comm, &omega, "2"), a.pid)
        .unwrap_or_else(|e| panic!("{e}"));
    let b = finish(b);
    std::thread::sleep(Duration::from_millis(500));
    let (code, live, stderr) = rtrace.stop(SIGINT);
    assert_eq!(code, 0, "{stderr}");
    eprintln!("A: {}B: {}", a.stdout, b.stdout);
    // What rtrace said of the Python processes it found (`-v`).
    for l in stderr
        .lines()
        .filter(|l| l.contains("Python") || l.contains(&comm))
    {
        eprintln!("{l}");
    }
    let mut errors = Vec::new();
    check(
        "live folded",
        &Counts::of_folded(&parse_folded(&live), &comm, ALPHA, OMEGA),
        &a,
        &b,
        false,
        &mut errors,
    );
    drop(files);
    let _ = std::fs::remove_dir(&dir);
    report_errors(&errors);
}

/// The JIT frames of a process that outlives the run (its map is written
/// at exit): `profile -p PID --pprof F` names none of them and says so,
/// naming the file; once it has exited, `rtrace report F` names them in
/// the split it measured.
#[test]
fn jit_frames_of_a_process_outliving_the_run_are_named_by_report_later() {
    if skipped() {
        return;
    }
    let _lock = serial();
    let mut files = Cleanup::default();
    let pprof = files.add(temp("after.pb.gz"));
    let p = pprof.to_str().unwrap();
    // Long enough to outlive a run slowed by a busy machine: the
    // verifier's second of loading, the 3 s and the writing, with room.
    let mono = plain_hot("9");
    let pid = mono.id();
    files.add(perf_map(pid));
    std::thread::sleep(Duration::from_millis(500));
    let spid = pid.to_string();
    let rtrace = Rtrace::start_until(
        &["profile", "-F", HZ, "-f", "-p", &spid, "--pprof", p, "3"],
        READY,
    );
    let (code, live, stderr) = rtrace.wait();
    assert!(
        !has_exited(pid),
        "mono exited before the run ended: this test needs it to outlive the run"
    );
    let mono = finish(mono);
    assert_eq!(code, 0, "{stderr}");

    let mut errors = Vec::new();
    let c = Counts::of_folded(&parse_folded(&live), "mono", HOT, COLD);
    eprintln!("live: {c:?}");
    if c.named_a() > 0 || c.unnamed < 200 {
        errors.push(format!(
            "live: {} JIT samples named, {} unnamed; all of at least 200 should be unnamed",
            c.named_a(),
            c.unnamed
        ));
    }
    match stderr
        .lines()
        .find(|l| l.contains(&format!("PID {pid} (mono): ")))
    {
        Some(line) => {
            // Mono makes its map as it starts and writes it at exit: the
            // map is empty when the run ends.
            let map = format!("its /tmp/perf-{pid}.map was empty when the run ended: ");
            for want in [
                "JIT frames unnamed; ",
                &map,
                &format!("rtrace report {p} names them once the process has written it"),
            ] {
                if !line.contains(want) {
                    errors.push(format!("the warning {line:?} does not say {want:?}"));
                }
            }
        }
        None => errors.push(format!("no line on PID {pid} (mono) in: {stderr}")),
    }
    let (code, later, stderr) = run(&["report", p, "-f"]);
    if code == 0 {
        let c = Counts::of_folded(&parse_folded(&later), "mono", HOT, COLD);
        eprintln!("report -f later: {c:?}");
        let named = c.named_a();
        if named < 200 || (named as f64) < 0.95 * (named + c.unnamed) as f64 {
            errors.push(format!(
                "report -f later: {named} JIT samples named, {} unnamed",
                c.unnamed
            ));
        }
        if let Err(e) = share_within("HotProgram:Hot", c.a[0], c.a[1], mono.hot_share(), SDS) {
            errors.push(format!("report -f later: {e}"));
        }
    } else {
        errors.push(format!("rtrace report -f failed: {stderr}"));
    }
    report_errors(&errors);
}

/// `--wait-exit SECONDS`: after the run, rtrace waits for the process,
/// whose JIT frames its map (written at exit) does not yet name, to exit,
/// and names them in its live output, in the split it measured.
#[test]
fn wait_exit_names_them_live() {
    if skipped() {
        return;
    }
    let _lock = serial();
    let mono = plain_hot("5");
    let pid = mono.id();
    let _files = Cleanup(vec![perf_map(pid)]);
    std::thread::sleep(Duration::from_millis(500));
    let spid = pid.to_string();
    let rtrace = Rtrace::start_until(
        &[
            "profile",
            "-F",
            HZ,
            "-f",
            "-p",
            &spid,
            "--wait-exit",
            "20",
            "3",
        ],
        READY,
    );
    let (code, live, stderr) = rtrace.wait();
    let exited_first = has_exited(pid);
    let mono = finish(mono);
    assert_eq!(code, 0, "{stderr}");
    assert!(exited_first, "rtrace ended before mono did: {stderr}");
    let c = Counts::of_folded(&parse_folded(&live), "mono", HOT, COLD);
    eprintln!("live: {c:?}");
    let named = c.named_a();
    assert!(
        named >= 200 && named as f64 >= 0.95 * (named + c.unnamed) as f64,
        "{named} JIT samples named, {} unnamed:\n{stderr}",
        c.unnamed
    );
    if let Err(e) = share_within("HotProgram:Hot", c.a[0], c.a[1], mono.hot_share(), SDS) {
        panic!("{e}");
    }
}

/// A recording that saw both processes of one pid: A (Hot.exe) exits
/// during it, B (Cold.exe) starts on A's pid and is still running when it
/// ends. Live, A's row is named by A's map, read at its exit, and B's row
/// has none of A's names (A's map is still on disk, older than B). After
/// B exits, only B's map is left on disk; `rtrace report` of the pprof
/// names A's frames by A's map and B's by B's, never crossed.
#[test]
fn a_recording_of_both_processes_is_named_later_each_by_its_own_map() {
    if skipped() {
        return;
    }
    let lock = serial();
    let names = Names::new("later");
    let comm = comm("rtl");
    let mut files = Cleanup::default();
    let pprof = files.add(temp("both.pb.gz"));
    let p = pprof.to_str().unwrap();
    let rtrace = Rtrace::start_until(
        &[
            "profile",
            "-F",
            HZ,
            "--pprof",
            p,
            "--report",
            "--sort",
            "pid,sym",
            "--hierarchy",
            "--no-children",
            "--json",
            "--comms",
            comm.as_str(),
        ],
        READY,
    );
    let a = finish(mono(&names, &comm, "Hot.exe", "2").spawn().unwrap());
    files.add(perf_map(a.pid));
    let b = spawn_on_pid(&lock, &mut mono(&names, &comm, "Cold.exe", "4"), a.pid)
        .unwrap_or_else(|e| panic!("{e}"));
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        !has_exited(b.id()),
        "B exited before the run ended: this test needs it to outlive the run"
    );
    let (code, live, stderr) = rtrace.stop(SIGINT);
    let b = finish(b);
    assert_eq!(code, 0, "{stderr}");
    // Its warnings say why a process's JIT frames went unnamed.
    eprintln!("rtrace said: {stderr}");
    eprintln!("A: {}B: {}", a.stdout, b.stdout);

    let mut errors = Vec::new();
    let rows = process_rows(&live, a.pid);
    eprintln!("live rows: {rows:?}");
    if rows.len() != 2 {
        errors.push(format!(
            "live: {} rows for pid {}, not one for each process: {rows:?}",
            rows.len(),
            a.pid
        ));
    } else {
        let of_a: Vec<&ProcessRow> = rows.iter().filter(|r| r.names(HOT) > 0).collect();
        if of_a.len() != 1 {
            errors.push(format!(
                "live: {} rows name HotProgram (A's map, read at its exit), not A's only: {rows:?}",
                of_a.len()
            ));
        } else {
            let a_row = &of_a[0];
            let (hot, warm) = (
                a_row
                    .syms
                    .iter()
                    .filter(|(s, _)| s.contains(HOT.funcs[0]))
                    .map(|(_, n)| n)
                    .sum(),
                a_row
                    .syms
                    .iter()
                    .filter(|(s, _)| s.contains(HOT.funcs[1]))
                    .map(|(_, n)| n)
                    .sum(),
            );
            if let Err(e) = share_within("live: A's HotProgram:Hot", hot, warm, a.hot_share(), SDS)
            {
                errors.push(e);
            }
        }
    }
    let (code, later, stderr) = run(&["report", p, "-f"]);
    eprintln!("report -f later said: {stderr}");
    if code == 0 {
        let c = Counts::of_folded(&parse_folded(&later), &comm, HOT, COLD);
        eprintln!("report -f later: {c:?}");
        if c.crossed > 0 {
            errors.push(format!("report -f later: {} samples crossed", c.crossed));
        }
        let named = c.named_a() + c.named_b();
        if c.named_a() < 100
            || c.named_b() < 100
            || (named as f64) < 0.95 * (named + c.unnamed) as f64
        {
            errors.push(format!(
                "report -f later: A's {} and B's {} samples named, {} unnamed",
                c.named_a(),
                c.named_b(),
                c.unnamed
            ));
        }
        for (who, first, second, r) in [("A", c.a[0], c.a[1], &a), ("B", c.b[0], c.b[1], &b)] {
            if let Err(e) = share_within(
                &format!("{who}'s first function"),
                first,
                second,
                r.hot_share(),
                SDS,
            ) {
                errors.push(format!("report -f later: {e}"));
            }
        }
    } else {
        errors.push(format!("rtrace report -f failed: {stderr}"));
    }
    let (code, table, stderr) = run(&[
        "report",
        p,
        "--sort",
        "pid,sym",
        "--hierarchy",
        "--no-children",
        "--json",
        "--comms",
        comm.as_str(),
    ]);
    if code == 0 {
        let rows = process_rows(&table, a.pid);
        eprintln!("rows later: {rows:?}");
        let clean = rows.len() == 2
            && rows
                .iter()
                .all(|r| (r.names(HOT) > 0) != (r.names(COLD) > 0))
            && rows.iter().any(|r| r.names(HOT) > 0);
        if !clean {
            errors.push(format!(
                "report later: not two rows for pid {}, one naming HotProgram only and one \
                 ColdProgram only: {rows:?}",
                a.pid
            ));
        }
    } else {
        errors.push(format!("rtrace report --sort pid,sym failed: {stderr}"));
    }
    report_errors(&errors);
}

/// The helper the tests above stand on: a program started on the pid
/// another had, once that one is reaped, gets it, in a few attempts at
/// most while other processes fork.
#[test]
fn a_program_is_started_on_the_pid_another_had() {
    if skipped() {
        return;
    }
    let lock = serial();
    let names = Names::new("helper");
    let first = finish(
        names
            .command("/usr/bin/true", &comm("rtt"))
            .spawn()
            .unwrap(),
    );
    let again = spawn_on_pid(
        &lock,
        &mut names.command("/usr/bin/true", &comm("rtt")),
        first.pid,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let again = finish(again);
    assert_eq!(again.pid, first.pid);
    assert!(again.start_ticks >= first.start_ticks);
}

//! `profile --firefox` and `--samples`: each sample on its own, from the
//! kernel's per-sample stream. A fixture burns two threads' CPU time in
//! known shares (`tests/fixtures/twothreads.c`, which measures each
//! thread's itself); the Firefox file must parse and hold the two
//! threads with their samples in time order, as many as rtrace's own
//! pprof of the same run counts for each, split as the fixture measured;
//! the samples file must load in pandas (Debian's python3-pandas), whose
//! share of the hot function must be the pprof's.

use std::{collections::BTreeMap, path::Path, process::Command};

use rtrace_integration_tests::{
    Rtrace, SIGINT, assert_one_line_error, in_guest,
    profile::{READY, read_pprof, run_fixture, start_fixture, temp},
};
use serde_json::Value;

/// The sampling rate: some thousand samples of the hot thread.
const HZ: &str = "999";
/// The fixture's threads' CPU time, in milliseconds.
const HOT_MS: &str = "1500";
const WARM_MS: &str = "500";

/// One run's files and the fixture's own measures.
struct Run {
    firefox: Value,
    samples: std::path::PathBuf,
    pprof: std::path::PathBuf,
    /// (tid, CPU ns) of the hot and the warm thread.
    hot: (u32, f64),
    warm: (u32, f64),
}

/// Profiles the fixture with `--firefox`, `--samples` (of extension
/// `ext`) and `--pprof`, all of one run.
fn record(ext: &str) -> Run {
    let firefox = temp(&format!("ff-{ext}.json"));
    let samples = temp(&format!("samples.{ext}"));
    let pprof = temp(&format!("ff-{ext}.pb.gz"));
    let fixture = start_fixture("twothreads_nofp", &[HOT_MS, WARM_MS]);
    let pid = fixture.pid().to_string();
    let rtrace = Rtrace::start_until(
        &[
            "profile",
            "-F",
            HZ,
            "-p",
            &pid,
            "--firefox",
            firefox.to_str().unwrap(),
            "--samples",
            samples.to_str().unwrap(),
            "--pprof",
            pprof.to_str().unwrap(),
        ],
        READY,
    );
    let done = run_fixture(fixture);
    let (code, _, stderr) = rtrace.stop(SIGINT);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        !stderr.contains("per-sample records lost"),
        "records lost: {stderr}"
    );
    let firefox: Value = serde_json::from_slice(&std::fs::read(&firefox).unwrap())
        .expect("the Firefox profile is JSON");
    Run {
        firefox,
        samples,
        pprof,
        hot: (done[0] as u32, done[1] as f64),
        warm: (done[2] as u32, done[3] as f64),
    }
}

/// The pprof's samples by thread id, and its share of samples whose
/// stack has `function`.
fn pprof_counts(path: &Path, function: &str) -> (BTreeMap<u32, u64>, f64) {
    let p = read_pprof(path);
    let s = |i: i64| p.string_table[i as usize].as_str();
    let funcs: BTreeMap<u64, &str> = p
        .function
        .iter()
        .map(|f| (f.id, s(f.system_name)))
        .collect();
    let has: BTreeMap<u64, bool> = p
        .location
        .iter()
        .map(|l| {
            let named = l
                .line
                .iter()
                .any(|line| funcs[&line.function_id] == function);
            (l.id, named)
        })
        .collect();
    let (mut by_tid, mut with, mut all) = (BTreeMap::new(), 0u64, 0u64);
    for sample in &p.sample {
        let tid = sample
            .label
            .iter()
            .find(|l| s(l.key) == "tid")
            .map_or(0, |l| l.num as u32);
        let n = sample.value[0] as u64;
        *by_tid.entry(tid).or_insert(0) += n;
        all += n;
        if sample.location_id.iter().any(|id| has[id]) {
            with += n;
        }
    }
    (by_tid, with as f64 / all as f64)
}

/// The Firefox profile's thread of `tid`: its samples' count (their
/// weights' sum), having checked that they are in time order.
fn firefox_thread(profile: &Value, tid: u32) -> u64 {
    let threads = profile["threads"].as_array().expect("threads");
    let t = threads
        .iter()
        // The format gives thread ids as strings.
        .find(|t| t["tid"] == tid.to_string().as_str() && t["processName"] != "CPUs")
        .unwrap_or_else(|| panic!("no thread {tid} in the Firefox profile"));
    let samples = &t["samples"];
    let len = samples["length"].as_u64().unwrap();
    let deltas = samples["timeDeltas"].as_array().expect("timeDeltas");
    assert_eq!(deltas.len() as u64, len);
    assert!(
        deltas.iter().all(|d| d.as_f64().unwrap() >= 0.0),
        "thread {tid}'s samples are not in time order"
    );
    match samples["weight"].as_array() {
        Some(w) => w.iter().map(|v| v.as_u64().unwrap()).sum(),
        None => len,
    }
}

/// Runs Debian's pandas on the samples file; returns the share of the
/// weight whose stack has `function`, and the rows' count.
fn pandas_share(path: &Path, function: &str) -> (f64, u64) {
    let load = if path.extension().is_some_and(|e| e == "csv") {
        "df = pd.read_csv(path)\nhot = df['stack'].str.split(';').apply(lambda s: fn in s)"
    } else {
        "df = pd.read_json(path, lines=True)\nhot = df['stack'].apply(lambda s: fn in s)"
    };
    let script = format!(
        "import sys\nimport pandas as pd\npath, fn = sys.argv[1], sys.argv[2]\n{load}\n\
         assert list(df.columns) == ['time', 'cpu', 'pid', 'tid', 'process', 'weight', \
         'stack'], list(df.columns)\n\
         assert df['time'].is_monotonic_increasing\n\
         print(df.loc[hot, 'weight'].sum() / df['weight'].sum(), len(df))\n"
    );
    // Debian's interpreter, which python3-pandas is installed for.
    let out = Command::new("/usr/bin/python3")
        .args(["-c", &script, path.to_str().unwrap(), function])
        .output()
        .expect("cannot run /usr/bin/python3");
    assert!(
        out.status.success(),
        "pandas: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let mut words = text.split_whitespace();
    (
        words.next().unwrap().parse().unwrap(),
        words.next().unwrap().parse().unwrap(),
    )
}

/// The checks of one run, its samples file of extension `ext`.
fn check(ext: &str) {
    let run = record(ext);
    let (by_tid, pprof_hot) = pprof_counts(&run.pprof, "burn_hot");
    let hot = firefox_thread(&run.firefox, run.hot.0);
    let warm = firefox_thread(&run.firefox, run.warm.0);
    // As many samples as rtrace's own report of the run counts for each.
    assert_eq!(Some(&hot), by_tid.get(&run.hot.0), "hot thread: {by_tid:?}");
    assert_eq!(
        Some(&warm),
        by_tid.get(&run.warm.0),
        "warm thread: {by_tid:?}"
    );
    // Split as the fixture measured: within 4 sd of binomial sampling.
    let n = (hot + warm) as f64;
    let want = run.hot.1 / (run.hot.1 + run.warm.1);
    let got = hot as f64 / n;
    let sd = (want * (1.0 - want) / n).sqrt();
    assert!(
        (got - want).abs() <= 4.0 * sd,
        "hot thread's share {got:.4}, measured {want:.4} (sd {sd:.4}, {n} samples)"
    );
    let all: u64 = by_tid.values().sum();
    let text = std::fs::read_to_string(&run.samples).unwrap();
    let header = u64::from(ext == "csv");
    assert_eq!(
        text.lines().count() as u64,
        all + header,
        "a row per sample the report counts"
    );
    // The guests have no Python: pandas is the host's.
    if in_guest() {
        eprintln!("no pandas in the VM guests: the rows are counted only");
        return;
    }
    let (pandas_hot, rows) = pandas_share(&run.samples, "burn_hot");
    assert_eq!(rows, all, "pandas: a row per sample the report counts");
    assert!(
        (pandas_hot - pprof_hot).abs() < 1e-9,
        "pandas' share of burn_hot {pandas_hot}, the report's {pprof_hot}"
    );
}

/// JSON lines: the Firefox file and the rows against the report.
#[test]
fn firefox_and_jsonl_samples_match_the_report() {
    check("jsonl");
}

/// CSV: the same, through `read_csv`.
#[test]
fn firefox_and_csv_samples_match_the_report() {
    check("csv");
}

/// A samples file of another extension, and the tools that do not send
/// samples on their own: one line each, before anything runs.
#[test]
fn per_sample_flags_refuse_what_they_cannot_do() {
    assert_one_line_error(
        &[
            "profile",
            "--samples",
            "/tmp/rtrace-samples.txt",
            "--",
            "true",
        ],
        ".jsonl (JSON lines) or .csv",
    );
    assert_one_line_error(
        &[
            "profile",
            "--off-cpu",
            "--firefox",
            "/tmp/rtrace-ff.json",
            "--",
            "true",
        ],
        "drop --off-cpu",
    );
    assert_one_line_error(
        &["offcputime", "--firefox", "/tmp/rtrace-ff.json", "1"],
        "only profile sends",
    );
}

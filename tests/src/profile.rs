//! Helpers of the tests of `rtrace profile` and `rtrace flamegraph`
//! (`unwind.rs`, `symbols.rs`, `outputs.rs`, `filters.rs`, `profile.rs` and
//! others under `tests/tests/`): the fixtures of `tests/fixtures/` started
//! and run to their end, folded stacks counted, and readers of rtrace's
//! files independent of its own code (pprof decoded by prost, SVG parsed
//! by roxmltree, perf's stacks folded by inferno).

use std::{collections::BTreeMap, io::Read as _, path::PathBuf, process::Command};

use crate::{Rtrace, SIGINT, Workload, parse_folded, run, workload_bin};

/// What `rtrace profile` prints to stderr once sampling has begun.
pub const READY: &str = "Sampling";

/// Starts a fixture, which waits for [`run_fixture`] once ready.
pub fn start_fixture(name: &str, args: &[&str]) -> Workload {
    let args: Vec<String> = args.iter().map(|&a| a.to_owned()).collect();
    let (fixture, line) = Workload::start(name, &args);
    assert!(line.starts_with("ready"), "{line}");
    fixture
}

/// Lets a fixture work to the end; returns the numbers of its `done` line.
pub fn run_fixture(mut fixture: Workload) -> Vec<i64> {
    let done = fixture.go();
    assert!(fixture.wait().success());
    done.split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect()
}

/// Samples of stacks that contain a frame ending in `name`.
pub fn count_with(folded: &BTreeMap<Vec<String>, u64>, name: &str) -> u64 {
    folded
        .iter()
        .filter(|(f, _)| f.iter().any(|n| n.ends_with(name)))
        .map(|(_, c)| c)
        .sum()
}

/// A path in the temporary directory for file `name`, unique to this
/// test process.
pub fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("rtrace-profile-{}-{name}", std::process::id()))
}

/// Profiles the `hotfuncs` CPU fixture for its whole run with `extra`
/// arguments; returns rtrace's stdout and the fixture's CPU nanoseconds in
/// `hot_alpha` and `hot_beta`.
pub fn profile_hotfuncs(extra: &[&str]) -> (String, i64, i64) {
    profile_fixture("hotfuncs", extra)
}

/// Profiles a CPU fixture's 3 s of work at 999 Hz: about 3,000 samples, so
/// the split the tests check has a binomial spread under one point and a
/// 5-point tolerance fails on a real error, not on chance.
pub fn profile_fixture(name: &str, extra: &[&str]) -> (String, i64, i64) {
    let fixture = start_fixture(name, &["cpu", "3"]);
    let pid = fixture.pid().to_string();
    let mut args = vec!["profile", "-F", "999", "-p", &pid];
    args.extend_from_slice(extra);
    let rtrace = Rtrace::start_until(&args, READY);
    let done = run_fixture(fixture);
    let (code, stdout, stderr) = rtrace.stop(SIGINT);
    assert_eq!(code, 0, "{stderr}");
    assert!(!stderr.contains("are [unknown]"), "{stderr}");
    // A walk the verifier refuses must not pass for frame pointers' stacks.
    assert!(!stderr.contains("refused the CFI walk"), "{stderr}");
    (stdout, done[0], done[1])
}

/// Folded samples in `hotfuncs`' hot leaves, and those of them whose
/// stacks reach its `main`.
pub fn hot_reaching_main(stdout: &str) -> (u64, u64) {
    let folded = parse_folded(stdout);
    let hot = count_with(&folded, "::hot_alpha") + count_with(&folded, "::hot_beta");
    let whole = count_under(&folded, "::hot_alpha", "hotfuncs::main")
        + count_under(&folded, "::hot_beta", "hotfuncs::main");
    (hot, whole)
}

/// Samples with `inner` whose stack has `outer` somewhere above it.
pub fn count_under(folded: &BTreeMap<Vec<String>, u64>, inner: &str, outer: &str) -> u64 {
    folded
        .iter()
        .filter(|(f, _)| {
            let i = f.iter().position(|n| n.ends_with(inner));
            let o = f.iter().position(|n| n.ends_with(outer));
            matches!((i, o), (Some(i), Some(o)) if o < i)
        })
        .map(|(_, c)| c)
        .sum()
}

/// Profiles the `execkids` fixture's children (`kids`: its arguments)
/// with `scope` (the flags before `--`); returns the report and rtrace's
/// stderr.
pub fn profile_execkids(scope: &[&str], kids: &[&str]) -> (String, String) {
    let fixture = workload_bin("execkids_nofp");
    let out = temp("execkids.folded");
    let mut args = vec!["profile", "-F", "199", "-f", "-U", "-v"];
    args.extend_from_slice(scope);
    args.extend_from_slice(&["-o", out.to_str().unwrap(), "--"]);
    args.push(fixture.to_str().unwrap());
    args.extend_from_slice(kids);
    let (code, _, stderr) = run(&args);
    assert_eq!(code, 0, "{stderr}");
    let folded = std::fs::read_to_string(&out).unwrap();
    let _ = std::fs::remove_file(&out);
    (folded, stderr)
}

/// Whether to pass over a test of how quickly user space reads a new
/// process's maps: in the emulated guests user space runs some fifty
/// times slower (TCG), so children of a few tens of milliseconds, and a
/// fixture whose tables an unprivileged rtrace compiles without a cache,
/// are gone before their maps are read. The host runs these tests; the
/// guests still run the CFI walk's kernel side in every other test.
pub fn too_slow_here(what: &str) -> bool {
    let slow = crate::in_guest();
    if slow {
        eprintln!(
            "skipped: {what} needs user space at a real machine's speed; the host runs this test"
        );
    }
    slow
}

/// pprof's messages, decoded by prost independently of rtrace's encoder.
/// pprof's types, generated from rtrace's `profile.proto`.
#[allow(clippy::derive_partial_eq_without_eq)]
pub mod pprof {
    include!(concat!(env!("OUT_DIR"), "/perftools.profiles.rs"));
}

/// OTLP's profiles as the Collector writes them, decoded by prost from
/// the protocol's own `.proto` files (the version the pinned Collector
/// speaks), independently of rtrace's encoder.
#[allow(
    clippy::derive_partial_eq_without_eq,
    clippy::large_enum_variant,
    clippy::enum_variant_names
)]
pub mod otlp {
    include!(concat!(env!("OUT_DIR"), "/otlp.rs"));
}

/// A gzipped pprof file, decoded by prost.
pub fn read_pprof(path: &std::path::Path) -> pprof::Profile {
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(std::fs::File::open(path).unwrap())
        .read_to_end(&mut raw)
        .unwrap();
    <pprof::Profile as prost::Message>::decode(raw.as_slice()).unwrap()
}

/// The red, green and blue of an SVG `fill="rgb(r,g,b)"`.
pub fn rgb(fill: &str) -> [u32; 3] {
    let c: Vec<u32> = fill
        .trim_start_matches("rgb(")
        .trim_end_matches(')')
        .split(',')
        .map(|c| c.trim().parse().unwrap())
        .collect();
    [c[0], c[1], c[2]]
}

/// Parses an SVG as XML; flame graphs carry a DOCTYPE.
pub fn parse_svg(text: &str) -> Result<roxmltree::Document<'_>, roxmltree::Error> {
    let opts = roxmltree::ParsingOptions {
        allow_dtd: true,
        ..Default::default()
    };
    roxmltree::Document::parse_with_options(text, opts)
}

/// The names of a flame graph's frames, one per rectangle, from their
/// `<title>NAME (N samples, P%)</title>`.
pub fn svg_frames(text: &str) -> Vec<String> {
    let doc = parse_svg(text).expect("SVG is not well-formed");
    doc.descendants()
        .filter(|n| n.has_tag_name("title"))
        .filter_map(|n| {
            let t = n.text()?;
            let (name, rest) = t.rsplit_once(" (")?;
            rest.contains("samples").then(|| name.to_owned())
        })
        .collect()
}

/// `perf script` of perf.data file `data`, and its stacks folded as
/// FlameGraph's stackcollapse-perf folds them (inferno's port of it).
pub fn perf_script_folded(data: &std::path::Path) -> (Vec<u8>, Vec<u8>) {
    let script = Command::new("perf")
        .arg("script")
        .arg("-i")
        .arg(data)
        .output()
        .unwrap();
    assert!(script.status.success());
    let mut folded = Vec::new();
    inferno::collapse::Collapse::collapse(
        &mut inferno::collapse::perf::Folder::default(),
        script.stdout.as_slice(),
        &mut folded,
    )
    .unwrap();
    (script.stdout, folded)
}

/// The lines of `cfuncs.c` that carry `marker`.
pub fn marked_lines(marker: &str) -> Vec<u32> {
    include_str!("../fixtures/cfuncs.c")
        .lines()
        .enumerate()
        .filter(|(_, l)| l.contains(marker))
        .map(|(i, _)| i as u32 + 1)
        .collect()
}

//! `rtrace memleak`: allocations held, by stack, against what the fixture
//! (`tests/fixtures/memfix.c`) keeps and frees, against CPython's list of
//! bytearrays, against the kernel's pipes, and against heaptrack.

use std::{io::Read as _, process::Command};

use rtrace_integration_tests::{
    Rtrace, SIGINT, Workload, assert_one_line_error, in_guest, json_lines, run, workload_bin,
};

/// What memleak prints to stderr once it is attached.
const READY: &str = "Attaching";
/// The fixture keeps this many blocks of this size...
const BLOCKS: u64 = 1000;
const SIZE: u64 = 4096;
/// ...and allocates and frees a 64-byte block this many times.
const LOOPS: u64 = 20_000;

/// The reports of a `--json` run, in order (on stderr with a command,
/// as perf stat prints, so that the command's own output stays apart).
fn reports(stdout: &str) -> Vec<serde_json::Value> {
    // A command's own output shares rtrace's.
    let ours: String = stdout
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| format!("{l}\n"))
        .collect();
    json_lines(&ours)
        .into_iter()
        .filter(|r| r.get("stacks").is_some())
        .collect()
}

/// A report's stacks whose frames name `function`: (bytes, allocations,
/// frames).
fn stacks_with(report: &serde_json::Value, function: &str) -> Vec<(u64, u64, Vec<String>)> {
    report["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| {
            let frames: Vec<String> = s["stack"]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| f.as_str().unwrap().to_owned())
                .collect();
            frames
                .iter()
                .any(|f| f.split([' ', '+']).next() == Some(function))
                .then(|| {
                    (
                        s["bytes"].as_u64().unwrap(),
                        s["allocations"].as_u64().unwrap(),
                        frames,
                    )
                })
        })
        .collect()
}

/// The function names of `frames` (bcc's `func+0x1a [module]` lines).
fn functions(frames: &[String]) -> Vec<&str> {
    frames
        .iter()
        .map(|f| f.split([' ', '+']).next().unwrap())
        .collect()
}

/// Checks a report against what the fixture keeps: the kept blocks under
/// `keep_blocks`, called from `main` (a whole stack through code without
/// frame pointers), and nothing held from `churn`.
fn check_kept(report: &serde_json::Value) {
    let kept = stacks_with(report, "keep_blocks");
    assert_eq!(kept.len(), 1, "{report:#}");
    let (bytes, allocs, frames) = &kept[0];
    assert_eq!((*bytes, *allocs), (BLOCKS * SIZE, BLOCKS), "{frames:?}");
    let names = functions(frames);
    assert_eq!(names[0], "keep_blocks", "{names:?}");
    let main = names.iter().position(|f| *f == "main");
    assert_eq!(main, Some(1), "{names:?}");
    // Through libc (whose static functions are named only where its
    // debug symbols are installed) to the program's entry.
    assert!(
        names.iter().any(|f| f.starts_with("__libc_start_main")) && names.last() == Some(&"_start"),
        "the stack stops short of the program's start: {names:?}"
    );
    let churned: u64 = stacks_with(report, "churn").iter().map(|s| s.1).sum();
    assert_eq!(churned, 0, "churn's blocks were all freed: {report:#}");
}

#[test]
fn blocks_held_by_a_process_are_reported_by_the_stack_that_kept_them() {
    for fixture in ["memfix_nofp", "memfix"] {
        let args = [
            "keep",
            &BLOCKS.to_string(),
            &SIZE.to_string(),
            &LOOPS.to_string(),
        ]
        .map(String::from);
        let (mut w, line) = Workload::start(fixture, &args);
        assert_eq!(line.trim(), "ready");
        let pid = w.pid().to_string();
        let rt = Rtrace::start_until(&["memleak", "--json", "-p", &pid, "1"], READY);
        let done = w.go();
        assert!(
            done.starts_with(&format!("{} {BLOCKS} ", BLOCKS * SIZE)),
            "{done}"
        );
        // Older than -o's 500 ms, and reported at least once since.
        std::thread::sleep(std::time::Duration::from_millis(1700));
        let (code, stdout, stderr) = rt.stop(SIGINT);
        assert_eq!(code, 0, "{stderr}");
        let all = reports(&stdout);
        let last = all.last().unwrap_or_else(|| panic!("no report: {stderr}"));
        check_kept(last);
        // Nothing of other processes.
        for s in last["stacks"].as_array().unwrap() {
            assert_eq!(s["pid"].as_u64(), Some(u64::from(w.pid())), "{s}");
        }
        drop(w);
    }
}

#[test]
fn a_commands_leaks_are_reported_after_it_exits() {
    let fixture = workload_bin("memfix_nofp");
    let fixture = fixture.to_str().unwrap();
    let (blocks, size, loops) = (BLOCKS.to_string(), SIZE.to_string(), LOOPS.to_string());
    // As `-- CMD`, and as bcc spells it.
    let spelled = format!("{fixture} run {blocks} {size} {loops}");
    let runs: [Vec<&str>; 2] = [
        vec![
            "memleak", "--json", "--", fixture, "run", &blocks, &size, &loops,
        ],
        vec!["memleak", "--json", "-c", &spelled],
    ];
    for argv in runs {
        let (code, _, stderr) = run(&argv);
        assert_eq!(code, 0, "{argv:?}: {stderr}");
        let all = reports(&stderr);
        let last = all.last().unwrap_or_else(|| panic!("no report: {stderr}"));
        check_kept(last);
        // What stdio keeps for its output (allocated by printf, called
        // from main), as heaptrack also sees it.
        assert!(
            stacks_with(last, "main")
                .iter()
                .any(|s| s.1 == 1 && functions(&s.2).iter().position(|f| *f == "main") > Some(1)),
            "{last:#}"
        );
    }
}

#[test]
fn sampling_by_bytes_estimates_what_is_held_within_its_error() {
    let fixture = workload_bin("memfix_nofp");
    let blocks: u64 = 4000;
    let (b, s, l) = (blocks.to_string(), SIZE.to_string(), LOOPS.to_string());
    let argv = [
        "memleak",
        "--json",
        "--sample-bytes",
        "65536",
        "--",
        fixture.to_str().unwrap(),
        "run",
        &b,
        &s,
        &l,
    ];
    let (code, _, stderr) = run(&argv);
    assert_eq!(code, 0, "{stderr}");
    let all = reports(&stderr);
    let last = all.last().unwrap_or_else(|| panic!("no report: {stderr}"));
    let kept = stacks_with(last, "keep_blocks");
    let (bytes, allocs) = kept.iter().fold((0, 0), |(b, a), s| (b + s.0, a + s.1));
    // Each block is drawn with chance p; the estimate is the draws over p.
    let p = 1.0 - (-(SIZE as f64) / 65536.0).exp();
    let want = (blocks * SIZE) as f64;
    let sd = SIZE as f64 * (blocks as f64 * (1.0 - p) / p).sqrt();
    assert!(
        (bytes as f64 - want).abs() <= 4.0 * sd,
        "estimated {bytes} bytes held, want {want} +- {:.0} (4 sd): {last:#}\n{stderr}",
        4.0 * sd
    );
    let sd_n = (blocks as f64 * (1.0 - p) / p).sqrt();
    assert!(
        (allocs as f64 - blocks as f64).abs() <= 4.0 * sd_n + 1.0,
        "estimated {allocs} allocations, want {blocks}"
    );
    // The churn's 64-byte blocks are drawn too, and freed.
    assert_eq!(stacks_with(last, "churn").len(), 0, "{last:#}");
}

#[test]
fn a_pprof_heap_profile_has_gos_four_types_and_the_reports_totals() {
    let fixture = workload_bin("memfix_nofp");
    let dir = Scratch::new("pprof");
    let file = dir.0.join("heap.pb.gz");
    let (b, s, l) = (BLOCKS.to_string(), SIZE.to_string(), LOOPS.to_string());
    let argv = [
        "memleak",
        "--json",
        "--pprof",
        file.to_str().unwrap(),
        "--",
        fixture.to_str().unwrap(),
        "run",
        &b,
        &s,
        &l,
    ];
    let (code, _, stderr) = run(&argv);
    assert_eq!(code, 0, "{stderr}");
    let all = reports(&stderr);
    let last = all.last().unwrap();
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(std::fs::File::open(&file).unwrap())
        .read_to_end(&mut raw)
        .unwrap();
    let p = <pprof::Profile as prost::Message>::decode(raw.as_slice()).unwrap();
    let name = |i: i64| p.string_table[i as usize].as_str();
    let types: Vec<(&str, &str)> = p
        .sample_type
        .iter()
        .map(|t| (name(t.r#type), name(t.unit)))
        .collect();
    assert_eq!(
        types,
        [
            ("alloc_objects", "count"),
            ("alloc_space", "bytes"),
            ("inuse_objects", "count"),
            ("inuse_space", "bytes")
        ]
    );
    let total = |i: usize| -> u64 { p.sample.iter().map(|s| s.value[i] as u64).sum() };
    assert_eq!(total(3), last["total_bytes"].as_u64().unwrap());
    assert_eq!(total(2), last["total_allocations"].as_u64().unwrap());
    // Everything allocated, the churn's freed blocks included.
    assert!(total(0) >= BLOCKS + LOOPS, "{}", total(0));
    assert!(total(1) >= BLOCKS * SIZE + LOOPS * 64, "{}", total(1));
}

#[test]
fn cpythons_list_is_held_under_the_comprehension_and_freed_at_exit() {
    if in_guest() {
        // The guests have no Python.
        return;
    }
    let argv = [
        "memleak",
        "--json",
        "-T",
        "3",
        "1",
        "--",
        "/usr/bin/python3.11",
        "-c",
        "x=[bytearray(1000) for i in range(100000)]; import time; time.sleep(2)",
    ];
    let (code, _, stderr) = run(&argv);
    assert_eq!(code, 0, "{stderr}");
    let all = reports(&stderr);
    let held = |r: &serde_json::Value| -> (u64, u64) {
        stacks_with(r, "<string>.<listcomp>")
            .iter()
            .filter(|s| s.2.iter().any(|f| f.starts_with("PyByteArray_Resize")))
            .fold((0, 0), |(b, a), s| (b + s.0, a + s.1))
    };
    let during = all.iter().map(held).max_by_key(|h| h.1).unwrap_or_default();
    // 100,000 buffers of 1,001 bytes (the bytes and their NUL).
    assert_eq!(during, (100_100_000, 100_000), "{stderr}");
    let after = held(all.last().unwrap());
    assert!(
        after.1 < 1000,
        "freed at exit, yet held after it: {after:?}"
    );
}

/// How many events of programs `programs` rtrace said the kernel skipped:
/// a tracepoint's program is not run where another of its kind already
/// runs on the CPU (or a map update from user space), which an emulated
/// guest starved of its host's time makes common (interrupts land
/// inside the programs).
fn skipped(stderr: &str, programs: &[&str]) -> u64 {
    rtrace_integration_tests::skipped_runs(stderr, |p| programs.contains(&p))
}

#[test]
fn the_kernels_pipes_are_held_by_the_stack_that_made_them() {
    let pipes: u64 = 400;
    let (mut w, line) = Workload::start("memfix", &["pipes".into(), pipes.to_string()]);
    assert_eq!(line.trim(), "ready");
    let rt = Rtrace::start_until(&["memleak", "--json", "-T", "50", "1"], READY);
    assert_eq!(w.go(), pipes.to_string());
    // Past -o's 500 ms and a report.
    std::thread::sleep(std::time::Duration::from_millis(2500));
    let opened_at = std::time::Instant::now();
    assert_eq!(w.go(), "0");
    std::thread::sleep(std::time::Duration::from_millis(2500));
    let (code, stdout, stderr) = rt.stop(SIGINT);
    assert_eq!(code, 0, "{stderr}");
    let all = reports(&stdout);
    // What the kernel skipped, as rtrace reported it, is all the bounds
    // allow for: each skipped allocation may be one of the pipes' (held
    // less at the most, and so freed less by the end, as a free of what
    // was not recorded changes nothing), each skipped free one of their
    // frees (held after closing). On a machine with time to spare there
    // are none, and the bounds are the fixture's own counts. (The counts
    // are the whole system's, so with many skipped the bounds say little:
    // the pipes must still be seen.)
    let allocs = skipped(
        &stderr,
        &[
            "kmalloc",
            "kmalloc_node",
            "kmem_cache_alloc",
            "kmem_cache_alloc_node",
        ],
    );
    let frees = skipped(&stderr, &["kfree", "kmem_cache_free"]);
    let (page_allocs, page_frees) = (
        skipped(&stderr, &["mm_page_alloc"]),
        skipped(&stderr, &["mm_page_free"]),
    );
    // Each pipe holds its pipe_inode_info and its buffers' array, both
    // from alloc_pipe_info.
    let held = |r: &serde_json::Value| -> u64 {
        stacks_with(r, "alloc_pipe_info").iter().map(|s| s.1).sum()
    };
    let counts: Vec<u64> = all.iter().map(held).collect();
    let most = counts.iter().copied().max().unwrap_or(0);
    assert!(most > 0, "no pipe seen: {counts:?}: {stderr}");
    assert!(
        most + allocs >= 2 * pipes,
        "{counts:?} ({allocs} allocations skipped): {stderr}"
    );
    let last = *counts.last().unwrap();
    assert!(
        most - last + allocs + frees >= 2 * pipes * 9 / 10,
        "closed pipes still held: {counts:?} ({:?} after closing, {allocs} allocations \
         and {frees} frees skipped)",
        opened_at.elapsed()
    );
    // The byte written into each took a page (kmem:mm_page_alloc), held
    // under the pipe's write until the pipe was closed.
    let paged = |r: &serde_json::Value| -> u64 {
        let mut s = stacks_with(r, "pipe_write");
        s.extend(stacks_with(r, "anon_pipe_write"));
        s.iter().map(|s| s.0).sum()
    };
    let pages: Vec<u64> = all.iter().map(paged).collect();
    let most = pages.iter().copied().max().unwrap_or(0);
    assert!(most > 0, "no pipe's page seen: {pages:?}: {stderr}");
    assert!(
        most + page_allocs * 4096 >= pipes * 4096 * 9 / 10,
        "{pages:?} ({page_allocs} page allocations skipped): {stderr}"
    );
    assert!(
        most - pages.last().unwrap() + (page_allocs + page_frees) * 4096 >= pipes * 4096 * 9 / 10,
        "closed pipes' pages still held: {pages:?} ({page_allocs} page allocations and \
         {page_frees} page frees skipped)"
    );
    // The BPF allocator's refills of the table's own element caches are
    // left out: traced, each took an element and brought another refill,
    // until the table was full and nothing else was recorded.
    for r in &all {
        let own = stacks_with(r, "alloc_bulk");
        assert!(own.is_empty(), "rtrace's own map refills held: {own:?}");
    }
}

#[test]
fn heaptrack_finds_the_same_leak() {
    if in_guest() {
        // The guests have no heaptrack.
        return;
    }
    let fixture = workload_bin("memfix_nofp");
    let dir = Scratch::new("heaptrack");
    let out = dir.0.join("ht");
    let (b, s, l) = (BLOCKS.to_string(), SIZE.to_string(), LOOPS.to_string());
    let status = Command::new("heaptrack")
        .arg("-o")
        .arg(&out)
        .arg(&fixture)
        .args(["run", &b, &s, &l])
        .output()
        .expect("heaptrack missing: cargo xtask installs it");
    assert!(status.status.success(), "{status:?}");
    let folded = dir.0.join("leaked.folded");
    let printed = Command::new("heaptrack_print")
        .args(["--flamegraph-cost-type", "leaked", "-F"])
        .arg(&folded)
        .arg(dir.0.join("ht.zst"))
        .output()
        .unwrap();
    assert!(printed.status.success(), "{printed:?}");
    let text = std::fs::read_to_string(&folded).unwrap();
    // heaptrack's leaked bytes by leaf function.
    let theirs: u64 = text
        .lines()
        .filter(|l| l.contains("keep_blocks"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    let (code, _, stderr) = run(&[
        "memleak",
        "--json",
        "--",
        fixture.to_str().unwrap(),
        "run",
        &b,
        &s,
        &l,
    ]);
    assert_eq!(code, 0, "{stderr}");
    let all = reports(&stderr);
    let ours: u64 = stacks_with(all.last().unwrap(), "keep_blocks")
        .iter()
        .map(|s| s.0)
        .sum();
    assert_eq!(theirs, BLOCKS * SIZE, "{text}");
    assert_eq!(ours, theirs);
}

#[test]
fn bad_input_is_one_line() {
    assert_one_line_error(&["memleak", "-p", "999999"], "no such process: 999999");
    assert_one_line_error(&["memleak", "-z", "10", "-Z", "5"], "-z 10 is above -Z 5");
    assert_one_line_error(&["memleak", "-O", "c"], "-O names a process's allocator");
    assert_one_line_error(
        &["memleak", "-c", "true", "--", "true"],
        "both name a command",
    );
}

/// A directory of the test's own, removed after it.
struct Scratch(std::path::PathBuf);

impl Scratch {
    fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("rtrace-memleak-{}-{tag}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// pprof's messages, decoded by prost independently of rtrace's encoder.
#[allow(clippy::derive_partial_eq_without_eq)]
mod pprof {
    include!(concat!(env!("OUT_DIR"), "/perftools.profiles.rs"));
}

//! `rtrace biolatency` against direct I/O to a loop device, checked
//! against the device's own completion counters.

use rtrace_integration_tests::{
    LoopDevice, Rtrace, SIGINT, json_lines, run, run_workload, skipped_runs, text_hist_total,
    text_layout,
};

const READS: u64 = 120;
const WRITES: u64 = 40;

fn direct_io(dev: &LoopDevice, reads: u64, writes: u64) {
    run_workload(
        "directio",
        &[dev.path.clone(), reads.to_string(), writes.to_string()],
    );
}

/// A run of biolatency around the workload's I/O.
struct Traced {
    stdout: String,
    stderr: String,
    /// The device's completions meanwhile.
    done: u64,
    /// Events rtrace reported the kernel kept from its programs (a
    /// completion while the program ran on that CPU for another's): an
    /// upper bound on the device's requests it could not count, as the
    /// whole machine's I/O reaches the programs.
    skipped: u64,
    dev: LoopDevice,
}

impl Traced {
    /// Checks a count of the device's requests: all of them, but for
    /// those rtrace said the kernel kept from it.
    fn assert_counted(&self, counted: u64) {
        let Self { done, skipped, .. } = *self;
        assert!(
            counted <= done && done - counted <= skipped,
            "{counted} of {done} requests counted, {skipped} events reported skipped\n{}\nstderr: {}",
            self.stdout,
            self.stderr
        );
    }
}

/// Runs biolatency with `extra` around direct I/O to a new loop device.
fn traced(tag: &str, extra: &[&str]) -> Traced {
    let dev = LoopDevice::new(tag);
    let mut args = vec!["biolatency", "-d", &dev.name];
    args.extend_from_slice(extra);
    let rtrace = Rtrace::start(&args);
    dev.settle();
    let before = dev.completed();
    direct_io(&dev, READS, WRITES);
    dev.settle();
    let done = dev.completed() - before;
    let (code, stdout, stderr) = rtrace.stop(SIGINT);
    // No check of stderr's warnings: the whole machine's I/O reaches the
    // programs, so a warning may concern other devices; the callers judge
    // this device's histogram against its completions.
    assert_eq!(code, 0, "stderr: {stderr}");
    let skipped = skipped_runs(&stderr, |_| true);
    Traced {
        stdout,
        stderr,
        done,
        skipped,
        dev,
    }
}

/// The single JSON histogram's count.
fn json_total(stdout: &str) -> u64 {
    let lines = json_lines(stdout);
    assert_eq!(lines.len(), 1, "{stdout}");
    lines[0]["histograms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["count"].as_u64().unwrap())
        .sum()
}

fn check_total_matches_diskstats(tag: &str, extra: &[&str]) {
    let mut args = vec!["--json"];
    args.extend_from_slice(extra);
    let t = traced(tag, &args);
    // The workload's requests cannot merge, so the device saw exactly them.
    assert_eq!(t.done, READS + WRITES, "diskstats delta");
    t.assert_counted(json_total(&t.stdout));
}

#[test]
fn histogram_total_matches_diskstats() {
    check_total_matches_diskstats("bl", &[]);
}

#[test]
fn attach_raw_tracepoint_total_matches_diskstats() {
    check_total_matches_diskstats("blraw", &["--attach", "raw_tracepoint"]);
}

#[test]
fn attach_tracepoint_total_matches_diskstats() {
    check_total_matches_diskstats("bltp", &["--attach", "tracepoint"]);
}

#[test]
fn queued_time_counts_every_request_once() {
    check_total_matches_diskstats("blq", &["-Q"]);
}

#[test]
fn text_histogram_total_matches_diskstats_in_milliseconds() {
    let t = traced("bltxt", &["-m"]);
    assert!(t.stdout.contains("msecs"), "{}", t.stdout);
    t.assert_counted(text_hist_total(&t.stdout));
}

/// Counts per `flags` label, on every mechanism: BTF programs label
/// `cmd_flags` through the kernel's enums, tracepoints their `rwbs`.
#[test]
fn per_flag_histograms_split_reads_from_writes() {
    for mech in ["tp_btf", "tracepoint"] {
        let t = traced("blf", &["--json", "-F", "--attach", mech]);
        let line = &json_lines(&t.stdout)[0];
        let mut reads = 0;
        let mut writes = 0;
        for h in line["histograms"].as_array().unwrap() {
            let label = h["flags"].as_str().unwrap();
            let n = h["count"].as_u64().unwrap();
            if label.ends_with("-Read") || label == "Read" {
                reads += n;
            } else if label.ends_with("Write") {
                assert!(label.contains("Sync"), "O_DIRECT writes are sync: {label}");
                writes += n;
            } else {
                panic!("unexpected label {label} on {mech}");
            }
        }
        // A request the kernel kept from the programs is a read or a
        // write; each kind is at most the workload's.
        assert!(reads <= READS && writes <= WRITES, "{mech}: {}", t.stdout);
        t.assert_counted(reads + writes);
    }
}

#[test]
fn per_disk_histogram_is_named_after_the_disk() {
    let t = traced("bld", &["--json", "-D"]);
    let line = &json_lines(&t.stdout)[0];
    let hists = line["histograms"].as_array().unwrap();
    assert_eq!(hists.len(), 1, "{}", t.stdout);
    assert_eq!(hists[0]["disk"], t.dev.name.as_str());
    t.assert_counted(hists[0]["count"].as_u64().unwrap());
    let t = traced("bldt", &["-D"]);
    assert!(
        t.stdout.contains(&format!("disk = {}", t.dev.name)),
        "{}",
        t.stdout
    );
    t.assert_counted(text_hist_total(&t.stdout));
}

#[test]
fn bad_input_gets_one_line_and_nonzero_exit() {
    let (code, _, stderr) = run(&["biolatency", "-d", "no-such-disk"]);
    assert_ne!(code, 0);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("no such disk: no-such-disk"), "{stderr}");
    let (code, _, stderr) = run(&["biolatency", "--bogus"]);
    assert_eq!(code, 2, "{stderr}");
    let (code, _, stderr) = run(&["biolatency", "0"]);
    assert_eq!(code, 2, "{stderr}");
    // --attach offers only the tool's own chain.
    let (code, _, stderr) = run(&["biolatency", "--attach", "fentry"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("possible values: raw_tracepoint, tp_btf, tracepoint"),
        "{stderr}"
    );
}

/// rtrace's text layout is libbpf-tools': both run on the same direct I/O
/// to one disk, with timestamps, plain and split by disk and by flags, and
/// their lines must have the same shapes in the same order (blank lines,
/// times, headings with their tabs, headers, rows).
#[test]
fn text_layout_matches_libbpf_tools() {
    if rtrace_integration_tests::in_guest() {
        eprintln!("skipped: the guests have no libbpf-tools; the host runs this test");
        return;
    }
    let dev = LoopDevice::new("layout");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let io = {
        let (stop, path) = (stop.clone(), dev.path.clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                direct_io_at(&path, 200, 100);
            }
        })
    };
    for extra in [&[][..], &["-D"], &["-F"], &["-D", "-F"]] {
        let mut args = vec!["-T", "-d", &dev.name];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["1", "2"]);
        let peer = std::process::Command::new("stdbuf")
            .arg("-oL")
            .arg("/usr/sbin/biolatency")
            .args(&args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("libbpf-tools' biolatency (Debian package libbpf-tools)");
        let mut ours = vec!["biolatency"];
        ours.extend_from_slice(&args);
        let (code, stdout, stderr) = run(&ours);
        assert_eq!(code, 0, "{stderr}");
        let theirs = String::from_utf8(peer.wait_with_output().unwrap().stdout).unwrap();
        assert_eq!(
            text_layout(&stdout),
            text_layout(&theirs),
            "{extra:?}\nrtrace:\n{stdout}\nlibbpf-tools:\n{theirs}"
        );
        assert!(
            text_layout(&stdout).contains(&"rows".to_owned()),
            "{stdout}"
        );
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    io.join().unwrap();
}

fn direct_io_at(path: &str, reads: u64, writes: u64) {
    run_workload(
        "directio",
        &[path.to_owned(), reads.to_string(), writes.to_string()],
    );
}

/// `-e`: bcc's line of average, total and count after the histogram, its
/// count the device's and its average the total over it.
#[test]
fn extension_line_sums_up_the_histogram() {
    let t = traced("ble", &["-e"]);
    let text = &t.stdout;
    let line = text
        .lines()
        .find(|l| l.starts_with("avg = "))
        .unwrap_or_else(|| panic!("{text}"));
    let nums: Vec<u64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter(|w| !w.is_empty())
        .map(|w| w.parse().unwrap())
        .collect();
    assert!(line.contains(" usecs, total: "), "{line}");
    let [avg, total, count] = nums[..] else {
        panic!("{line}")
    };
    t.assert_counted(count);
    assert_eq!(count, text_hist_total(text));
    assert_eq!(avg, total / count, "{line}");
}

/// bcc's `-j` (JSON) combines with its other short flags, as in bcc's
/// `biolatency -jF`: bcc's dictionaries, one per flags value, with
/// exactly bcc's keys, contiguous log2 intervals from 0, and every I/O.
#[test]
fn bccs_json_flag_prints_bccs_dictionaries() {
    let t = traced("bljf", &["-jF"]);
    let stdout = &t.stdout;
    let dicts = json_lines(stdout);
    assert!(!dicts.is_empty(), "{stdout}");
    // bcc's key order and spacing, as Python prints a dictionary.
    for line in stdout.lines() {
        assert!(line.starts_with("{\"ts\": \""), "{line}");
        assert!(line.contains("\", \"val_type\": \"usecs\", \"data\": [{\"interval-start\": 0, \"interval-end\": 1, \"count\": "), "{line}");
        assert!(line.contains("}], \"flags\": \""), "{line}");
    }
    let mut total = 0;
    for d in &dicts {
        let mut keys: Vec<&str> = d.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(keys, ["data", "flags", "ts", "val_type"], "{d}");
        assert_eq!(d["val_type"], "usecs");
        let ts = d["ts"].as_str().unwrap();
        assert!(
            ts.len() == 19 && ts.as_bytes()[4] == b'-' && ts.as_bytes()[10] == b' ',
            "{ts}"
        );
        let mut next = 0;
        for b in d["data"].as_array().unwrap() {
            let (low, high) = (
                b["interval-start"].as_u64().unwrap(),
                b["interval-end"].as_u64().unwrap(),
            );
            assert_eq!(low, next, "{d}");
            assert!(high >= low.max(1), "{d}");
            next = high + 1;
            total += b["count"].as_u64().unwrap();
        }
    }
    t.assert_counted(total);
}

//! `rtrace report` of perf's own recordings: perf.data written by `perf
//! record -g` and `--call-graph dwarf` (unwound by rtrace), system-wide
//! with a child that exits before the report, of a Node program under
//! `--perf-basic-prof`, and the same recordings as `perf script` text;
//! each judged against `perf report --stdio` on the same file, and
//! against what the fixture measured itself. Bad files get one line.

use std::{
    collections::BTreeMap,
    io::Write as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use rtrace_integration_tests::{
    assert_one_line_error, in_guest, json_lines, parse_folded,
    profile::{count_under, count_with, perf_script_folded},
    run, workload_bin,
};

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("rtrace-perfdata-{}-{name}", std::process::id()))
}

/// Runs `perf record ARGS -o FILE -- CMD` with `go` on the command's
/// stdin (the fixtures wait for a line); the file and the command's
/// stdout.
fn record(name: &str, args: &[&str], cmd: &[&str]) -> (PathBuf, String) {
    let data = temp(name);
    let mut child = Command::new("perf")
        .args(["record", "-q"])
        .args(args)
        .arg("-o")
        .arg(&data)
        .arg("--")
        .args(cmd)
        // Node under a perf map flag writes V8's log into its working
        // directory.
        .current_dir(std::env::temp_dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("perf (cargo xtask setup installs it)");
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "perf record {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (data, String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `perf report --stdio ARGS -i FILE`.
fn perf_report(data: &Path, args: &[&str]) -> String {
    let out = Command::new("perf")
        .args(["report", "--stdio"])
        .args(args)
        .arg("-i")
        .arg(data)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `rtrace report FILE ARGS`: its stdout, with nothing on stderr but
/// what is allowed.
fn ours(data: &Path, args: &[&str]) -> String {
    let mut all = vec!["report", data.to_str().unwrap()];
    all.extend_from_slice(args);
    let (code, stdout, stderr) = run(&all);
    assert_eq!(code, 0, "{stderr}");
    assert!(!stderr.contains("error"), "{stderr}");
    stdout
}

/// The summed overhead (%) of a `perf report --stdio` table's rows whose
/// last column contains `name`, and how many rows that is; the same for
/// rtrace's table, which is laid out as perf's.
fn share(text: &str, name: &str) -> (f64, usize) {
    let mut total = 0.0;
    let mut rows = 0;
    for line in text.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let Some(bracket) = fields.iter().position(|f| *f == "[.]" || *f == "[k]") else {
            continue;
        };
        if fields[0].ends_with('%') && fields[bracket + 1..].join(" ").contains(name) {
            total += fields[0].trim_end_matches('%').parse::<f64>().unwrap();
            rows += 1;
        }
    }
    (total, rows)
}

/// Within `points` of perf's figure.
fn agrees(what: &str, ours: f64, perf: f64, points: f64, texts: (&str, &str)) {
    assert!(
        (ours - perf).abs() <= points,
        "{what}: rtrace {ours:.2} %, perf {perf:.2} %\n{}\n{}",
        texts.0,
        texts.1
    );
}

/// The share of `hot` samples (stacks with a frame ending in `hot`) whose
/// stack also reaches `outer`, in folded stacks.
fn reaching(folded: &BTreeMap<Vec<String>, u64>, hot: &str, outer: &str) -> f64 {
    let all = count_with(folded, hot);
    assert!(all > 100, "few {hot} samples: {folded:?}");
    100.0 * count_under(folded, hot, outer) as f64 / all as f64
}

/// perf's stacks folded, by inferno's stackcollapse-perf.
fn perf_folded(data: &Path) -> BTreeMap<Vec<String>, u64> {
    let (_, folded) = perf_script_folded(data);
    parse_folded(&String::from_utf8_lossy(&folded))
}

/// `perf script` text of `data`, written beside it.
fn script_of(data: &Path) -> PathBuf {
    let (text, _) = perf_script_folded(data);
    let path = data.with_extension("script");
    std::fs::write(&path, text).unwrap();
    path
}

/// A split the fixture measured (`a` of `a + b`) against the one sampled
/// (`share_a` of `share_a + share_b`, in %, of `n` samples): within four
/// binomial standard deviations.
fn split_holds(what: &str, (a, b): (f64, f64), (share_a, share_b): (f64, f64), n: f64) {
    let want = a / (a + b);
    let got = share_a / (share_a + share_b);
    let hits = n * (share_a + share_b) / 100.0;
    let sd = (want * (1.0 - want) / hits).sqrt();
    assert!(
        (got - want).abs() <= 4.0 * sd + 0.005,
        "{what}: sampled {got:.3}, measured {want:.3} (sd {sd:.4})"
    );
}

/// The `# Samples: N` line of rtrace's table.
fn samples_of(text: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix("# Samples: "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no sample count: {text}"))
}

/// `perf record -g` (frame pointers, which the fixture lacks: only the
/// leaves are sure) and `--call-graph dwarf` (rtrace unwinds the stack
/// copies itself) of the no-frame-pointer fixture: the hot/warm split is
/// perf report's within 2 points and the fixture's own within sampling
/// error; in DWARF mode, as many hot samples reach `main` as perf's own
/// unwinding finds, within 2 points. The same recordings as `perf script`
/// text give the same table.
#[test]
fn perf_records_of_the_nofp_fixture_read_as_perf_reports_them() {
    if in_guest() {
        return; // The guests have no perf; the host runs this.
    }
    let bin = workload_bin("hotfuncs_nofp");
    for (name, mode) in [
        ("fp", &["-g"][..]),
        ("dwarf", &["--call-graph", "dwarf"][..]),
    ] {
        let mut args = vec!["-F", "999"];
        args.extend_from_slice(mode);
        let (data, stdout) = record(name, &args, &[bin.to_str().unwrap(), "cpu", "2"]);
        let done: Vec<f64> = stdout
            .lines()
            .find_map(|l| l.strip_prefix("done "))
            .unwrap()
            .split_whitespace()
            .map(|n| n.parse().unwrap())
            .collect();
        let table = ["--no-children", "--sort", "comm,dso,sym"];
        let mine = ours(&data, &table);
        let theirs = perf_report(&data, &table);
        let mut shares = Vec::new();
        for f in ["hot_alpha", "hot_beta"] {
            let (a, rows) = share(&mine, f);
            let (b, _) = share(&theirs, f);
            assert_eq!(rows, 1, "{name} {f}:\n{mine}");
            agrees(&format!("{name} {f}"), a, b, 2.0, (&mine, &theirs));
            shares.push(a);
        }
        split_holds(
            name,
            (done[0], done[1]),
            (shares[0], shares[1]),
            samples_of(&mine),
        );
        // The same samples as perf script text: the same table.
        let script = script_of(&data);
        let from_text = ours(&script, &table);
        assert_eq!(samples_of(&from_text), samples_of(&mine), "{from_text}");
        for f in ["hot_alpha", "hot_beta"] {
            let a = share(&mine, f).0;
            let b = share(&from_text, f).0;
            agrees(
                &format!("{name} script {f}"),
                b,
                a,
                0.5,
                (&from_text, &mine),
            );
        }
        if name == "dwarf" {
            let folded = parse_folded(&ours(&data, &["-f"]));
            let perf = perf_folded(&data);
            for f in ["::hot_alpha", "::hot_beta"] {
                let a = reaching(&folded, f, "hotfuncs::main");
                let b = reaching(&perf, f, "hotfuncs::main");
                assert!(a > 90.0, "{f}: {a:.1} % reach main");
                agrees(&format!("{f} reaching main"), a, b, 2.0, ("", ""));
            }
        }
        for f in [&data, &script] {
            let _ = std::fs::remove_file(f);
        }
    }
}

/// Debian's python3, with no frame pointers: `pyfix.py zlib` splits its
/// time between zlib's C code and the interpreter. Recorded both ways,
/// rtrace's share of libz is perf report's within 2 points; in DWARF mode
/// as many samples reach libc's start of `main` as perf's unwinding
/// finds, within 2 points.
#[test]
fn perf_records_of_debians_python_read_as_perf_reports_them() {
    if in_guest() {
        return; // The guests have no perf; the host runs this.
    }
    let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/pyfix.py");
    for (name, mode) in [
        ("py-fp", &["-g"][..]),
        ("py-dwarf", &["--call-graph", "dwarf"][..]),
    ] {
        let mut args = vec!["-F", "999"];
        args.extend_from_slice(mode);
        let (data, _) = record(name, &args, &["/usr/bin/python3", fixture, "zlib", "2"]);
        let table = ["--no-children", "--sort", "dso"];
        let mine = ours(&data, &table);
        let theirs = perf_report(&data, &table);
        // `--sort dso` rows have no symbol column: the dso is the last.
        let dso = |text: &str, name: &str| overhead(text, |l| l.contains(name));
        let (a, b) = (dso(&mine, "libz.so"), dso(&theirs, "libz.so"));
        assert!(a > 5.0, "{name}: libz {a:.1} %\n{mine}");
        agrees(&format!("{name} libz"), a, b, 2.0, (&mine, &theirs));
        let (a, b) = (dso(&mine, "python3"), dso(&theirs, "python3"));
        agrees(&format!("{name} python3"), a, b, 2.0, (&mine, &theirs));
        if name == "py-dwarf" {
            let folded = parse_folded(&ours(&data, &["-f"]));
            let perf = perf_folded(&data);
            let whole = |f: &BTreeMap<Vec<String>, u64>| {
                let all: u64 = f.values().sum();
                100.0 * count_with(f, "__libc_start_call_main") as f64 / all as f64
            };
            let (a, b) = (whole(&folded), whole(&perf));
            assert!(a > 50.0, "{a:.1} % reach main");
            agrees("python3 reaching main", a, b, 2.0, ("", ""));
        }
        let _ = std::fs::remove_file(&data);
    }
}

/// `perf record -a -g` of the whole machine while a child runs the
/// fixture and exits before the report is made: its samples are its own,
/// by its pid, command and frames, with the split it measured.
#[test]
fn a_system_wide_record_names_a_child_that_has_exited() {
    if in_guest() {
        return; // The guests have no perf; the host runs this.
    }
    let bin = workload_bin("hotfuncs_nofp");
    let script = format!(
        "echo pid $$; exec {} cpu 1 > {}",
        bin.display(),
        temp("sw-done").display()
    );
    let (data, stdout) = record(
        "sw",
        &["-a", "-g", "-F", "999"],
        &["sh", "-c", &format!("sh -c '{script}'; sleep 0.3")],
    );
    let pid: u64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("pid "))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let done = std::fs::read_to_string(temp("sw-done")).unwrap();
    let done: Vec<f64> = done
        .lines()
        .find_map(|l| l.strip_prefix("done "))
        .unwrap()
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists()
            || std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| !c.starts_with("hotfuncs")),
        "the child still runs"
    );
    let rows = json_lines(&ours(
        &data,
        &["--no-children", "--sort", "pid,comm,sym", "--json"],
    ));
    let of = |sym: &str| -> u64 {
        rows.iter()
            .filter(|r| r["pid"].as_u64() == Some(pid))
            .filter(|r| r["sym"].as_str().is_some_and(|s| s.ends_with(sym)))
            .map(|r| {
                assert_eq!(r["comm"], "hotfuncs_nofp", "{r}");
                r["self_samples"].as_u64().unwrap()
            })
            .sum()
    };
    // Each sample weighs its period (nanoseconds of cpu-clock), as in
    // perf's overhead; the samples themselves are counted in the CSV.
    let (a, b) = (of("::hot_alpha"), of("::hot_beta"));
    let n = per_sample_files(&data, pid);
    assert!(n > 500, "{n} samples of pid {pid}: {rows:?}");
    let w = (a + b) as f64;
    split_holds(
        "system-wide",
        (done[0], done[1]),
        (100.0 * a as f64 / w, 100.0 * b as f64 / w),
        n as f64,
    );
    let _ = std::fs::remove_file(&data);
    let _ = std::fs::remove_file(temp("sw-done"));
}

/// `perf record -g node --perf-basic-prof hot.js`: V8's perf map names
/// the JavaScript functions, read after node has exited; `hot` and `warm`
/// have perf report's shares within 2 points, and the split node measured
/// within sampling error.
#[test]
fn a_node_record_names_javascript_from_its_perf_map() {
    if in_guest() {
        return; // The guests have no perf or node; the host runs this.
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/hot.js");
    let (data, stdout) = record(
        "node",
        &["-g", "-F", "999"],
        // A perf map cannot tell inlined functions apart: each keeps
        // its frame.
        &[
            "env",
            "HOT_NO_INLINING=1",
            "node",
            "--perf-basic-prof",
            script,
            "2",
        ],
    );
    let table = ["--no-children", "--sort", "sym"];
    let mine = ours(&data, &table);
    let theirs = perf_report(&data, &table);
    let (hot, warm) = (js(&mine, "hot"), js(&mine, "warm"));
    assert!(hot > 30.0, "hot {hot:.1} %:\n{mine}");
    agrees("hot", hot, js(&theirs, "hot"), 2.0, (&mine, &theirs));
    agrees("warm", warm, js(&theirs, "warm"), 2.0, (&mine, &theirs));
    split_holds(
        "node",
        (split_of(&stdout, "hot="), split_of(&stdout, "warm=")),
        (hot, warm),
        samples_of(&mine),
    );
    let _ = std::fs::remove_file(&data);
}

/// What node's fixture measured of one function (`hot=NS`), from its
/// `split hot=NS warm=NS` line.
fn split_of(stdout: &str, key: &str) -> f64 {
    stdout
        .split_whitespace()
        .find_map(|w| w.strip_prefix(key))
        .unwrap()
        .parse()
        .unwrap()
}

/// The summed overhead (%) of a table's rows of V8's JavaScript function
/// `f` (`JS:*hot /path/hot.js:21:13`, in any tier).
fn js(text: &str, f: &str) -> f64 {
    overhead(text, |l| l.contains("JS:") && l.contains(&format!("{f} /")))
}

/// The summed overhead (%) of a table's rows (lines that begin with
/// their percentage) that `keep` keeps.
fn overhead(text: &str, keep: impl Fn(&str) -> bool) -> f64 {
    text.lines()
        .filter(|l| {
            l.trim_start()
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_digit())
        })
        .filter(|l| keep(l))
        .filter_map(|l| {
            l.split_whitespace()
                .next()?
                .trim_end_matches('%')
                .parse::<f64>()
                .ok()
        })
        .sum()
}

/// A perf.data cut short, one recorded on another architecture, one whose
/// records are garbage, and a file that is none of the formats: one line
/// each, and no panic.
#[test]
fn bad_recordings_get_one_line() {
    if in_guest() {
        return; // The guests have no perf; the host runs this.
    }
    let bin = workload_bin("hotfuncs_nofp");
    let (data, _) = record(
        "bad",
        &["-g", "-F", "99"],
        &[bin.to_str().unwrap(), "cpu", "1"],
    );
    let bytes = std::fs::read(&data).unwrap();
    let write = |name: &str, b: &[u8]| {
        let p = temp(name);
        std::fs::write(&p, b).unwrap();
        p
    };
    let cut = write("cut.data", &bytes[..bytes.len() * 2 / 3]);
    assert_one_line_error(&["report", cut.to_str().unwrap()], "cut short");
    // The arch feature's string is the last `x86_64` in the file.
    let mut arm = bytes.clone();
    let at = arm
        .windows(7)
        .rposition(|w| w == b"x86_64\0")
        .expect("the arch feature");
    arm[at..at + 7].copy_from_slice(b"arm64\0\0");
    let arm = write("arm.data", &arm);
    assert_one_line_error(&["report", arm.to_str().unwrap()], "recorded on arm64");
    // Records overwritten in the middle of the file.
    let mut garbage = bytes.clone();
    let mid = garbage.len() / 3;
    garbage[mid..mid + 4096].fill(0xa5);
    let garbage = write("garbage.data", &garbage);
    let (code, _, stderr) = run(&["report", garbage.to_str().unwrap()]);
    assert_ne!(code, 0);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(!stderr.contains("panic"), "{stderr}");
    let none = write(
        "none.bin",
        &[0x7f, b'E', b'L', b'F', 0, 1, 2, 3, 0xff, 0xfe],
    );
    assert_one_line_error(&["report", none.to_str().unwrap()], "not a pprof profile");
    // Folded stacks keep no sample's time.
    let folded = write("stacks.folded", b"app;main;work 3\n");
    let json = temp("never.json");
    assert_one_line_error(
        &[
            "report",
            folded.to_str().unwrap(),
            "--firefox",
            json.to_str().unwrap(),
        ],
        "needs each sample's time",
    );
    assert!(!json.exists());
    for f in [&data, &cut, &arm, &garbage, &none, &folded] {
        let _ = std::fs::remove_file(f);
    }
}

/// `rtrace report FILE --firefox F --samples S.csv` of a system-wide
/// recording: the Firefox file parses, and the fixture's thread (`pid`,
/// one thread) has as many samples, in time order, as the CSV has rows of
/// it; the CSV's rows are in time order, their weights (perf's periods)
/// add up to the table's total, and the pid's rows with a hot function
/// in their stacks weigh what the table's children columns give those
/// functions. Returns how many such rows there are.
fn per_sample_files(data: &Path, pid: u64) -> u64 {
    let is_hot = |s: &str| s.ends_with("::hot_alpha") || s.ends_with("::hot_beta");
    let hot: u64 = json_lines(&ours(data, &["--sort", "pid,sym", "--json"]))
        .iter()
        .filter(|r| r["pid"].as_u64() == Some(pid))
        .filter(|r| r["sym"].as_str().is_some_and(is_hot))
        .filter_map(|r| r["children_samples"].as_u64())
        .sum();
    let (json, csv) = (temp("sw.json"), temp("sw.csv"));
    let table = ours(
        data,
        &[
            "--no-children",
            "--sort",
            "pid",
            "--json",
            "--firefox",
            json.to_str().unwrap(),
            "--samples",
            csv.to_str().unwrap(),
        ],
    );
    let total: u64 = json_lines(&table)
        .iter()
        .filter_map(|r| r["self_samples"].as_u64())
        .sum();
    let text = std::fs::read_to_string(&csv).unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("time,cpu,pid,tid,process,weight,stack"));
    let (mut weight, mut last, mut of_pid, mut hot_rows, mut hot_weight) = (0, 0u64, 0, 0, 0);
    for line in lines {
        let f: Vec<&str> = line.splitn(7, ',').collect();
        let t: u64 = f[0].parse().unwrap();
        assert!(t >= last, "rows out of time order: {line}");
        last = t;
        let w: u64 = f[5].parse().unwrap();
        weight += w;
        if f[2] == pid.to_string() {
            of_pid += 1;
            if f[6].split(';').any(is_hot) {
                hot_rows += 1;
                hot_weight += w;
            }
        }
    }
    assert_eq!(weight, total, "the CSV's weights against the table's total");
    assert_eq!(hot_weight, hot, "the pid's hot rows against the table's");
    let profile: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let thread = profile["threads"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["tid"] == pid.to_string().as_str() && t["processName"] != "CPUs")
        .unwrap_or_else(|| panic!("no thread {pid} in the Firefox profile"));
    let deltas = thread["samples"]["timeDeltas"].as_array().unwrap();
    assert_eq!(deltas.len() as u64, of_pid);
    assert!(deltas.iter().all(|d| d.as_f64().unwrap() >= 0.0));
    for f in [&json, &csv] {
        let _ = std::fs::remove_file(f);
    }
    hot_rows
}

/// A recording of two events (`-e cpu-clock,page-faults`): the first
/// event's table by default, the other named on stderr and reported with
/// `--event`; each with as many samples as perf report's own section of
/// it, and the fault table's top row perf's within 2 points (each sample
/// weighs its period, as perf's overhead does).
#[test]
fn a_recording_of_two_events_reports_each() {
    if in_guest() {
        return; // The guests have no perf; the host runs this.
    }
    let bin = workload_bin("hotfuncs_nofp");
    let (data, _) = record(
        "two",
        &["-e", "cpu-clock,page-faults", "-F", "499", "-g"],
        &[bin.to_str().unwrap(), "faults", "30000"],
    );
    let theirs = perf_report(&data, &["--no-children", "--sort", "sym"]);
    // perf's sections: `# Samples: 499  of event 'cpu-clock'`.
    let perf_n = |event: &str| -> f64 {
        theirs
            .lines()
            .filter_map(|l| l.strip_prefix("# Samples: "))
            .find(|l| l.trim_end().ends_with(&format!("'{event}'")))
            .and_then(|l| l.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("no {event} section:\n{theirs}"))
    };
    let mut all = vec![
        "report",
        data.to_str().unwrap(),
        "--no-children",
        "--sort",
        "sym",
    ];
    let (code, first, stderr) = run(&all);
    assert_eq!(code, 0, "{stderr}");
    assert!(first.contains("of event 'cpu-clock'"), "{first}");
    assert!(stderr.contains("page-faults"), "{stderr}");
    assert_eq!(samples_of(&first), perf_n("cpu-clock"));
    all.extend_from_slice(&["--event", "page-faults"]);
    let faults = ours(&data, &all[2..]);
    assert_eq!(samples_of(&faults), perf_n("page-faults"), "{faults}");
    let top = |text: &str| -> (f64, String) {
        text.lines()
            .find(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit()) && l.contains('%'))
            .map(|l| {
                let mut f = l.split_whitespace();
                let pct = f.next().unwrap().trim_end_matches('%').parse().unwrap();
                (pct, f.skip(1).collect::<Vec<_>>().join(" "))
            })
            .unwrap()
    };
    let (ours_top, sym) = top(&faults);
    let section = theirs
        .split("of event 'page-faults'")
        .nth(1)
        .expect("perf's page-faults section");
    let theirs_top = share(section, &sym).0;
    agrees(
        &format!("top fault row {sym}"),
        ours_top,
        theirs_top,
        2.0,
        (&faults, section),
    );
    let _ = std::fs::remove_file(&data);
}

/// `perf record -k mono -g node --perf-prof hot.js`: no perf map, only
/// the jitdump V8 writes (and maps, for perf to find). perf report names
/// none of its JavaScript without `perf inject --jit`; rtrace reads the
/// dump the recording maps and names `hot` and `warm`, split as node
/// measured within sampling error.
#[test]
fn a_node_record_names_javascript_from_its_jitdump() {
    if in_guest() {
        return; // The guests have no perf or node; the host runs this.
    }
    let dir = temp("jitdir");
    std::fs::create_dir_all(&dir).unwrap();
    let data = dir.join("perf.data");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/hot.js");
    let out = Command::new("perf")
        .args(["record", "-q", "-k", "mono", "-g", "-F", "999", "-o"])
        .arg(&data)
        .args(["--", "node", "--perf-prof", script, "2"])
        .env("HOT_NO_INLINING", "1")
        .current_dir(&dir)
        .stdin(Stdio::null())
        .output()
        .expect("perf (cargo xtask setup installs it)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let table = ["--no-children", "--sort", "sym"];
    let mine = ours(&data, &table);
    let theirs = perf_report(&data, &table);
    assert_eq!(
        js(&theirs, "hot"),
        0.0,
        "perf named it without inject:\n{theirs}"
    );
    let (hot, warm) = (js(&mine, "hot"), js(&mine, "warm"));
    assert!(hot > 30.0, "hot {hot:.1} %:\n{mine}");
    split_holds(
        "node jitdump",
        (split_of(&stdout, "hot="), split_of(&stdout, "warm=")),
        (hot, warm),
        samples_of(&mine),
    );
    let _ = std::fs::remove_dir_all(&dir);
}

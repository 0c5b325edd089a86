//! `rtrace ext4slower` against a workload of known reads, writes, opens
//! and syncs on a fresh ext4 file system, on every attach path the kernel
//! offers: the syscall tracepoints here, fentry and kprobes in the VM
//! matrix.

use rtrace_integration_tests::{
    Mount, Rtrace, SIGHUP, SIGINT, SIGTERM, Traced, assert_one_line_error, file_op, fileops_done,
    json_lines, mechanism_works, run, trace_workload,
};

/// One operation: (type, bytes, offset in bytes); -1 bytes is a sync of
/// the whole file.
type Op = (String, i64, i64);

/// Runs the `fileops ops` workload in `dir` under `rtrace ext4slower
/// ARGS`, stopped with `signal`; returns rtrace's stdout and stderr, the
/// file's name and the operations the workload says it did.
fn traced(dir: &str, args: &[&str], signal: i32) -> (String, String, String, Vec<Op>) {
    let mut full = vec!["ext4slower"];
    full.extend_from_slice(args);
    traced_as(dir, &full, signal)
}

/// [`traced`] under `rtrace TOOL_ARGS`, the tool named in them.
fn traced_as(dir: &str, full: &[&str], signal: i32) -> (String, String, String, Vec<Op>) {
    let Traced {
        stdout,
        stderr,
        done,
    } = trace_workload(
        "fileops",
        &[dir.to_owned(), "ops".to_owned()],
        full,
        std::time::Duration::from_millis(200),
        signal,
    );
    let (name, ops) = fileops_done(&done);
    (stdout, stderr, name, ops)
}

/// The operations of the text output's lines on file `name`, with the
/// offset in KiB as printed.
fn text_ops(stdout: &str, name: &str) -> Vec<Op> {
    let mut lines = stdout.lines();
    let header = lines.next().unwrap();
    assert!(
        header.starts_with("TIME     COMM             PID     T BYTES   OFF_KB   LAT(ms) FILENAME"),
        "{header}"
    );
    lines
        .filter(|l| l.ends_with(&format!(" {name}")))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(f[1], "fileops", "{l}");
            let lat: f64 = f[6].parse().unwrap();
            assert!((0.0..10_000.0).contains(&lat), "{l}");
            let bytes = if f[4] == "LL_MAX" {
                -1
            } else {
                f[4].parse().unwrap()
            };
            (f[3].to_owned(), bytes, f[5].parse().unwrap())
        })
        .collect()
}

fn in_kib(ops: &[Op]) -> Vec<Op> {
    ops.iter()
        .map(|(t, b, off)| (t.clone(), *b, off / 1024))
        .collect()
}

/// Every operation, exactly, on each attach path this kernel has, with
/// operations in flight kept in task storage and in the hash.
#[test]
fn every_operation_is_reported_with_exact_bytes_on_every_path() {
    let fs = Mount::ext4("e4all");
    let mut ran = 0;
    for mech in ["fentry", "kprobe", "tracepoint"] {
        if !mechanism_works(mech) {
            eprintln!("{mech} is not on this kernel: its run is left to the VM matrix");
            continue;
        }
        for (store, extra) in [
            ("task storage", None),
            ("a hash by thread id", Some("--no-task-storage")),
        ] {
            let mut args = vec!["-v", "-m", "0", "--attach", mech];
            args.extend(extra);
            let (stdout, stderr, name, did) = traced(&fs.path, &args, SIGINT);
            assert!(
                stderr.contains(&format!("attached with {mech}"))
                    && stderr.contains(&format!("operations in flight in {store}")),
                "{stderr}"
            );
            assert_eq!(
                text_ops(&stdout, &name),
                in_kib(&did),
                "{mech}, {store}: {stdout}"
            );
        }
        ran += 1;
    }
    assert!(ran > 0, "no attach path works");
}

/// The default chain picks the best path, and JSON carries exact offsets.
#[test]
fn json_has_exact_offsets_and_latencies() {
    let fs = Mount::ext4("e4json");
    let (stdout, _, name, did) = traced(&fs.path, &["--json", "0"], SIGTERM);
    let got: Vec<Op> = json_lines(&stdout)
        .into_iter()
        .filter(|e| e["file"] == name.as_str())
        .map(|e| {
            assert_eq!(e["tool"], "ext4slower");
            assert_eq!(e["comm"], "fileops");
            let ns = e["latency_ns"].as_u64().unwrap();
            let ms = e["latency_ms"].as_f64().unwrap();
            assert!((ns as f64 / 1e6 - ms).abs() < 1e-9, "{e}");
            file_op(&e)
        })
        .collect();
    assert_eq!(got, did, "{stdout}");
}

#[test]
fn csv_has_bcc_columns() {
    // libbpf-tools' -c, and bcc's own -j for the same.
    for flag in ["-c", "-j"] {
        csv_has_bcc_columns_with(flag);
    }
}

fn csv_has_bcc_columns_with(flag: &str) {
    let fs = Mount::ext4("e4csv");
    let (stdout, _, name, did) = traced(&fs.path, &[flag, "-m", "0"], SIGHUP);
    let mut lines = stdout.lines();
    assert_eq!(
        lines.next().unwrap(),
        "ENDTIME_ns,TASK,PID,TYPE,BYTES,OFFSET_b,LATENCY_us,FILE"
    );
    let rows: Vec<Vec<String>> = lines
        .map(|l| l.split(',').map(str::to_owned).collect())
        .filter(|f: &Vec<String>| f[7] == name)
        .collect();
    let got: Vec<Op> = rows
        .iter()
        .map(|f| {
            let bytes: i64 = f[4].parse().unwrap();
            let bytes = if bytes == i64::MAX { -1 } else { bytes };
            (f[3].clone(), bytes, f[5].parse().unwrap())
        })
        .collect();
    assert_eq!(got, did, "{stdout}");
    let ends: Vec<u64> = rows.iter().map(|f| f[0].parse().unwrap()).collect();
    assert!(ends.windows(2).all(|w| w[0] <= w[1]), "in order: {ends:?}");
}

/// Operations faster than the threshold are not sent: a default run sees
/// none of the workload's cached operations, but an fsync that goes to
/// the disk can take longer, so only reads, writes and opens are checked.
#[test]
fn threshold_drops_fast_operations() {
    let fs = Mount::ext4("e4min");
    let (stdout, stderr, name, _) = traced(&fs.path, &["-m", "5000"], SIGINT);
    assert!(
        stderr.contains("Tracing ext4 operations slower than 5000 ms"),
        "{stderr}"
    );
    assert!(text_ops(&stdout, &name).is_empty(), "{stdout}");
}

/// The tracepoint path sees every file system's reads and writes, and
/// keeps only ext4's.
#[test]
fn other_file_systems_are_ignored() {
    let tmp = Mount::tmpfs("e4tmpfs");
    let (stdout, _, name, _) = traced(&tmp.path, &["-m", "0"], SIGINT);
    assert!(text_ops(&stdout, &name).is_empty(), "{stdout}");
}

#[test]
fn duration_ends_the_run() {
    let rtrace = Rtrace::start(&["ext4slower", "-d", "1"]);
    let (code, stdout, stderr) = rtrace.wait();
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("for 1 secs."), "{stderr}");
    assert!(stdout.starts_with("TIME "), "{stdout}");
}

#[test]
fn bad_input_gets_one_line_and_nonzero_exit() {
    assert_one_line_error(&["ext4slower", "-p", "999999999"], "no such process");
    // `--` now starts a command (`-- CMD`), so a negative threshold is
    // given as --min's value.
    assert_one_line_error(&["ext4slower", "--min=-3"], "bad threshold");
    assert_one_line_error(&["ext4slower", "--", "-3"], "cannot run -3");
    let (code, _, stderr) = run(&["ext4slower", "--bogus"]);
    assert_eq!(code, 2, "{stderr}");
    // --attach offers only the tool's own chain.
    let (code, _, stderr) = run(&["ext4slower", "--attach", "tp_btf"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("possible values: fentry, kprobe, tracepoint"),
        "{stderr}"
    );
}

/// `fsslower -t xfs` and `-t btrfs` on fresh file systems: every
/// operation, exactly, on each path this kernel has; and an xfs file is
/// not ext4's.
#[test]
fn fsslower_on_xfs_and_btrfs_reports_every_operation() {
    let mut ran = 0;
    for fstype in ["xfs", "btrfs"] {
        let Some(fs) = Mount::made(&format!("fs{fstype}"), fstype) else {
            eprintln!("{fstype} is not in this kernel (the guests load no module for it)");
            continue;
        };
        // A module's functions have the module's BTF, which fentry here
        // does not use: it is refused, saying so, and the chain goes on.
        let module = std::path::Path::new(&format!("/sys/module/{fstype}/initstate")).exists();
        for mech in ["fentry", "kprobe", "tracepoint"] {
            if !mechanism_works(mech) {
                continue;
            }
            if mech == "fentry" && module {
                let (code, _, stderr) = run(&["fsslower", "-t", fstype, "--attach", "fentry"]);
                assert_ne!(code, 0);
                assert!(stderr.contains("a module's functions"), "{stderr}");
                let (_, stderr, _, _) =
                    traced_as(&fs.path, &["fsslower", "-t", fstype, "-v"], SIGINT);
                assert!(stderr.contains("attached with kprobe"), "{stderr}");
                continue;
            }
            let args = ["fsslower", "-t", fstype, "-v", "-m", "0", "--attach", mech];
            let (stdout, stderr, name, did) = traced_as(&fs.path, &args, SIGINT);
            assert!(
                stderr.contains(&format!("attached with {mech}")),
                "{stderr}"
            );
            assert!(
                stderr.contains(&format!("Tracing {fstype} operations")),
                "{stderr}"
            );
            assert_eq!(
                text_ops(&stdout, &name),
                in_kib(&did),
                "{fstype}, {mech}: {stdout}"
            );
            ran += 1;
        }
        // ext4slower sees nothing of it.
        let (stdout, _, name, _) = traced(&fs.path, &["-m", "0"], SIGINT);
        assert!(
            text_ops(&stdout, &name).is_empty(),
            "ext4slower on {fstype}: {stdout}"
        );
    }
    if ran == 0 {
        eprintln!("neither xfs nor btrfs here: nothing to run");
    }
    let (code, _, stderr) = run(&["fsslower", "-t", "zfs"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("unknown file system \"zfs\": use ext4, xfs, btrfs, nfs"),
        "{stderr}"
    );
}

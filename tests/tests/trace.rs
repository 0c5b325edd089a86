//! `rtrace trace` (bcc's trace): one line per probe hit, against what a
//! fixture says it did (uprobes, returns, filters), the files a command
//! opens (syscall tracepoints), kernel functions where the kernel has
//! kprobes (the VM matrix), bcc's own documented command lines, and the
//! syscall mode it has with no probe.

use std::{collections::BTreeMap, time::Duration};

use rtrace_integration_tests::{
    SIGINT, Traced, assert_one_line_error, json_lines, mechanism_works, run, trace_workload,
    workload_bin,
};

fn fixture() -> String {
    workload_bin("argfix").to_string_lossy().into_owned()
}

/// Runs `rtrace trace ARGS -o FILE -- CMD...`: a command's output goes to
/// stdout, so rtrace's goes to a file; (exit code, rtrace's output,
/// stderr).
fn run_command(args: &[&str], command: &[&str]) -> (i32, String, String) {
    let out = std::env::temp_dir().join(format!(
        "rtrace-trace-out-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let path = out.to_string_lossy().into_owned();
    let mut full = vec!["trace"];
    full.extend_from_slice(args);
    full.extend_from_slice(&["-o", &path, "--"]);
    full.extend_from_slice(command);
    let (code, _, stderr) = run(&full);
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    let _ = std::fs::remove_file(&out);
    (code, text, stderr)
}

/// What `argfix calls` did: (size, name, times).
fn calls(done: &str) -> Vec<(u64, String, u64)> {
    done.split(',')
        .map(|d| {
            let f: Vec<&str> = d.split(':').collect();
            (
                f[0].parse().unwrap(),
                f[1].to_owned(),
                f[2].parse().unwrap(),
            )
        })
        .collect()
}

/// A uprobe and a uretprobe with formats: one line per call, with the
/// values the fixture passed and returned; a return's `argN` is the
/// entry's; the filter leaves out what it should.
#[test]
fn uprobe_and_return_lines_carry_the_values() {
    let fix = fixture();
    let entry = format!("p:{fix}:argfix_target \"size=%d name=%s\", arg1, arg2");
    let ret = format!("r:{fix}:argfix_target ((int)retval < 0) \"ret=%d of %u\", retval, arg1");
    let Traced { stdout, done, .. } = trace_workload(
        "argfix",
        &["calls".to_owned()],
        &["trace", "--json", &entry, &ret],
        Duration::from_millis(500),
        SIGINT,
    );
    let lines = json_lines(&stdout);
    let mut seen: BTreeMap<String, u64> = BTreeMap::new();
    for l in &lines {
        assert_eq!(l["func"], "argfix_target", "{l}");
        assert_eq!(l["comm"], "argfix", "{l}");
        *seen
            .entry(l["message"].as_str().unwrap().to_owned())
            .or_default() += 1;
    }
    let mut want: BTreeMap<String, u64> = BTreeMap::new();
    for (size, name, times) in calls(&done) {
        *want.entry(format!("size={size} name={name}")).or_default() += times;
        let r = 100 - size as i64;
        if r < 0 {
            *want.entry(format!("ret={r} of {size}")).or_default() += times;
        }
    }
    assert_eq!(seen, want, "{stdout}");
}

/// bcc's text layout: the header, then PID, TID, COMM, FUNC and the
/// message in bcc's columns; `-M` stops after that many; `-T` and `-C`
/// add their columns.
#[test]
fn text_layout_max_events_and_columns() {
    let fix = fixture();
    let spec = format!("{fix}:argfix_target (arg1 == 16) \"%s\", arg2");
    let Traced { stdout, .. } = trace_workload(
        "argfix",
        &["calls".to_owned()],
        &["trace", "-M", "3", "-T", "-C", &spec],
        Duration::ZERO,
        SIGINT,
    );
    let mut lines = stdout.lines();
    assert_eq!(
        lines.next().unwrap(),
        "TIME     CPU PID     TID     COMM            FUNC             -"
    );
    let rows: Vec<&str> = lines.collect();
    assert_eq!(rows.len(), 3, "{stdout}");
    for r in rows {
        // 8 of time, 3 of CPU, 7 + 7 + 15 + 16 and a space after each.
        assert_eq!(r.as_bytes()[2], b':', "{r}");
        assert_eq!(&r[9 + 4 + 8 + 8 + 16..], "argfix_target    beta", "{r}");
        assert_eq!(&r[9 + 4 + 16..9 + 4 + 16 + 15], "argfix         ", "{r}");
    }
}

/// A syscall tracepoint's string field: the files a command opens, by
/// the command's pid, and `-n`'s and `-f`'s filters on them.
#[test]
fn tracepoint_prints_the_files_a_command_opens() {
    let dir = std::env::temp_dir();
    let names: Vec<String> = (0..3)
        .map(|i| {
            let p = dir.join(format!("rtrace-trace-{}-{i}.txt", std::process::id()));
            // Empty: cat's own output goes to the same stdout.
            std::fs::write(&p, "").unwrap();
            p.to_string_lossy().into_owned()
        })
        .collect();
    let spec = "t:syscalls:sys_enter_openat \"%s\", args->filename";
    let mut cat = vec!["cat"];
    cat.extend(names.iter().map(String::as_str));
    let (code, stdout, stderr) = run_command(&["--json", spec], &cat);
    assert_eq!(code, 0, "{stderr}");
    let lines = json_lines(&stdout);
    let opened: Vec<&str> = lines
        .iter()
        .filter(|l| l["comm"] == "cat")
        .map(|l| l["message"].as_str().unwrap())
        .filter(|m| m.contains("rtrace-trace-"))
        .collect();
    assert_eq!(opened, names, "{stdout}");
    let pids: std::collections::BTreeSet<u64> = lines
        .iter()
        .filter(|l| l["comm"] == "cat")
        .map(|l| l["pid"].as_u64().unwrap())
        .collect();
    assert_eq!(pids.len(), 1, "{stdout}");

    // -f keeps the messages holding its text; -n the processes whose
    // name holds its.
    let one = format!("{}-1.txt", std::process::id());
    let (code, stdout, stderr) = run_command(&["--json", spec, "-f", &one, "-n", "ca"], &cat);
    assert_eq!(code, 0, "{stderr}");
    let msgs: Vec<String> = json_lines(&stdout)
        .iter()
        .map(|l| l["message"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(msgs, vec![names[1].clone()], "{stdout}");
    let (code, stdout, stderr) = run_command(&["--json", spec, "-n", "nosuchcomm"], &cat);
    assert_eq!(code, 0, "{stderr}");
    assert!(json_lines(&stdout).is_empty(), "{stdout}");
    for n in names {
        let _ = std::fs::remove_file(n);
    }
}

/// Kernel functions, where the kernel has kprobes (the VM matrix): the
/// path a command opens, from a `__user` pointer, and a failed open's
/// return.
#[test]
fn kprobe_and_kretprobe_lines() {
    if !mechanism_works("kprobe") {
        eprintln!("kprobes are not in this kernel: this test runs in the VM matrix");
        assert_one_line_error(
            &["trace", "do_sys_openat2 \"%s\", arg2", "--", "true"],
            "needs kprobes",
        );
        return;
    }
    let missing = format!("/nonexistent-rtrace-{}", std::process::id());
    let (code, stdout, stderr) = run_command(
        &[
            "--json",
            "do_sys_openat2 \"%s\", arg2@user",
            "r::do_sys_openat2 ((int)retval < 0) \"failed %d\", retval",
        ],
        &["cat", "/etc/hostname", &missing],
    );
    assert_eq!(code, 1, "cat's status: {stderr}");
    let msgs: Vec<String> = json_lines(&stdout)
        .iter()
        .filter(|l| l["comm"] == "cat")
        .map(|l| l["message"].as_str().unwrap().to_owned())
        .collect();
    let at = |m: &str| msgs.iter().position(|x| x == m);
    let (Some(a), Some(b)) = (at("/etc/hostname"), at(&missing)) else {
        panic!("{stdout}");
    };
    assert!(a < b, "{msgs:?}");
    // The missing file's open fails after its entry (other failed opens,
    // the loader's, may come before).
    assert!(msgs[b..].iter().any(|m| m == "failed -2"), "{msgs:?}");
}

/// bcc's own documented command lines (tools/trace_example.txt): every
/// one is taken; those this machine can run (libc's functions, a block
/// tracepoint, and kernel functions where there are kprobes and the
/// function) run; the others fail for what the machine lacks, never for
/// their grammar.
#[test]
fn bcc_documented_lines_are_accepted() {
    let kallsyms = std::fs::read_to_string("/proc/kallsyms").unwrap_or_default();
    let has = |f: &str| {
        kallsyms
            .lines()
            .any(|l| l.split_whitespace().nth(2) == Some(f))
    };
    let kprobes = mechanism_works("kprobe");
    // (the line's arguments, the kernel function it needs if any)
    let lines: &[(&[&str], Option<&str>)] = &[
        (&["do_sys_open"], Some("do_sys_open")),
        (&["do_sys_open \"%s\", arg2@user"], Some("do_sys_open")),
        (
            &["do_sys_open \"%s\", arg2@user", "-n", "main"],
            Some("do_sys_open"),
        ),
        (
            &["do_sys_open \"%s\", arg2@user", "--uid", "1001"],
            Some("do_sys_open"),
        ),
        (
            &["do_sys_open \"%s\", arg2@user", "-f", "config"],
            Some("do_sys_open"),
        ),
        (
            &["do_sys_open \"%s\", arg2@user", "-UK", "-f", "temp"],
            Some("do_sys_open"),
        ),
        (&["sys_execve \"%s\", arg1"], Some("sys_execve")),
        (
            &["sys_read (arg3 > 20000) \"read %d bytes\", arg3"],
            Some("sys_read"),
        ),
        (&["r::do_sys_open \"%llx\", retval"], Some("do_sys_open")),
        (&["c:open (arg2 == 42) \"%s %d\", arg1, arg2"], None),
        (&["c:malloc \"size = %d\", arg1"], None),
        (
            &["p:c:write (arg1 == 1) \"writing %d bytes to STDOUT\", arg3"],
            None,
        ),
        (
            &["r::__kmalloc (retval == 0) \"kmalloc failed!\""],
            Some("__kmalloc"),
        ),
        (&["r:c:malloc (retval) \"allocated = %x\", retval"], None),
        (
            &["t:block:block_rq_complete \"sectors=%d\", args->nr_sector"],
            None,
        ),
        (
            &[
                "t:block:block_rq_complete \"sectors=%d\", args->nr_sector",
                "-T",
            ],
            None,
        ),
        (&["r:bash:readline \"%s\", retval"], Some("bash")),
        (
            &["-U", "-a", "r::sys_futex \"%d\", retval"],
            Some("sys_futex"),
        ),
        (
            &[
                "r:c:read ((int)retval < 0) \"read failed: %d\", retval",
                "r:c:write ((int)retval < 0) \"write failed: %d\", retval",
                "-T",
            ],
            None,
        ),
        (
            &[
                "p:c:open (STRCMP(\"test.txt\", arg1)) \"opening %s\", arg1",
                "-T",
            ],
            None,
        ),
        (&["p:c:open(char *filename) \"opening %s\", filename"], None),
        (
            &["p::SyS_nanosleep(struct timespec *ts) \"sleep for %lld ns\", ts->tv_nsec"],
            Some("SyS_nanosleep"),
        ),
        (&["sys_open"], Some("sys_open")),
        (
            &[
                "sys_setsockopt(int fd, int level, int optname, char* optval, int optlen)(level==0 && optname == 1 && STRCMP(\"{0x6C, 0x00, 0x00, 0x00}\", optval))",
                "-U",
                "-M",
                "1",
                "--bin_cmp",
            ],
            Some("sys_setsockopt"),
        ),
        (
            &[
                "-I",
                "linux/fs.h",
                "p::uprobe_register(struct inode *inode) \"a_ops = %llx\", inode->i_mapping->a_ops",
            ],
            Some("uprobe_register"),
        ),
        (
            &[
                "-I",
                "kernel/sched/sched.h",
                "p::__account_cfs_rq_runtime(struct cfs_rq *cfs_rq) \"%d\", cfs_rq->runtime_remaining",
            ],
            Some("__account_cfs_rq_runtime"),
        ),
        (
            &[
                "-I",
                "net/sock.h",
                "udpv6_sendmsg(struct sock *sk) (sk->sk_dport == 13568)",
            ],
            Some("udpv6_sendmsg"),
        ),
        (
            &[
                "-I",
                "linux/fs_struct.h",
                "mntns_install \"users = %d\", $task->fs->users",
            ],
            Some("mntns_install"),
        ),
        (
            &[
                "-s",
                "/lib/x86_64-linux-gnu/libc.so.6,/bin/ping",
                "p:c:inet_pton",
                "-U",
            ],
            None,
        ),
    ];
    for (line, needs) in lines {
        let mut args = vec!["trace"];
        args.extend_from_slice(line);
        args.extend_from_slice(&["--", "true"]);
        let (code, _, stderr) = run(&args);
        assert_ne!(code, 2, "{line:?} is no command line to rtrace: {stderr}");
        assert!(!stderr.contains("bad probe"), "{line:?}: {stderr}");
        // bash's readline needs bash (the VM guests have none); a kernel
        // function, kprobes and the function (the kernel may name it
        // otherwise, as `__kmalloc_noprof`, which rtrace finds).
        let runnable = match needs {
            None => true,
            Some("bash") => std::path::Path::new("/bin/bash").exists(),
            Some(f) => kprobes && has(f),
        };
        if runnable {
            assert_eq!(code, 0, "{line:?}: {stderr}");
        } else if code != 0 {
            assert_eq!(stderr.lines().count(), 1, "{line:?}: {stderr}");
            assert!(
                stderr.contains("kprobes") || stderr.contains(needs.unwrap_or("")),
                "{line:?} failed for another reason than the machine's: {stderr}"
            );
        }
    }
}

/// With no probe, trace is strace's engine: a command's syscalls as
/// strace shows them, and `--summary`'s table per process, whose counts
/// are the fixture's own.
#[test]
fn without_a_probe_it_traces_syscalls() {
    // Lines go to stderr, as strace's and perf trace's do.
    let (code, _, stderr) = run(&["trace", "--", "/bin/echo", "hi there"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains(r#"execve("/bin/echo", ["/bin/echo", "hi there"]"#),
        "{stderr}"
    );
    assert!(
        stderr.contains("write(1, \"hi there\\n\", 9) = 9"),
        "{stderr}"
    );
    let n = 2000u64;
    let sysloop = workload_bin("sysloop").to_string_lossy().into_owned();
    let (code, _, stderr) = run(&["trace", "--summary", "--", &sysloop, &n.to_string()]);
    assert_eq!(code, 0, "{stderr}");
    // The process's heading, a blank line, the table, a blank line.
    let table = stderr
        .split_once(" sysloop (")
        .and_then(|(_, t)| t.split("\n\n").nth(1))
        .unwrap_or_else(|| panic!("no table of sysloop: {stderr}"));
    // `% time seconds usecs/call calls [errors] syscall`.
    let calls = |name: &str| -> (u64, u64) {
        table
            .lines()
            .find(|l| l.split_whitespace().last() == Some(name))
            .and_then(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                let calls: u64 = f.get(3)?.parse().ok()?;
                let errors: u64 = if f.len() == 6 { f[4].parse().ok()? } else { 0 };
                Some((calls, errors))
            })
            .unwrap_or_else(|| panic!("no {name} row: {table}"))
    };
    // The loop's calls, and the loader's, locale's and stdio's few beside
    // them; the loader's failing look-ups along the library path follow
    // the environment (cargo's LD_LIBRARY_PATH, say), so failed calls are
    // allowed beyond the few.
    for (name, extra) in [("read", 8), ("write", 4), ("newfstatat", 64)] {
        let (got, errors) = calls(name);
        assert!(
            (n..=n + extra + errors).contains(&got),
            "{name}: {got} of {n}: {table}"
        );
    }
}

/// Bad input: one line on stderr, pointing at the column where it can.
#[test]
fn bad_input_is_one_clear_line() {
    let fix = fixture();
    for (spec, want) in [
        (
            format!("p:{fix}:argfix_target \"%d %d\", arg1"),
            "2 conversion(s) but 1 value(s)",
        ),
        (
            format!("p:{fix}:argfix_target \"%q\", arg1"),
            "unknown conversion %q",
        ),
        (
            format!("p:{fix}:argfix_target (arg1 == ) \"%d\", arg1"),
            "column",
        ),
        (format!("x:{fix}:argfix_target"), "unknown probe type"),
        (format!("p:{fix}:argfix_target+0x4"), "offsets"),
        (
            format!("p:{fix}:argfix_target \"%d\", retval"),
            "return probes",
        ),
        (
            "t:syscalls:sys_enter_openat \"%s\", args->nosuch".to_owned(),
            "unknown name \"nosuch\"",
        ),
        ("t:nosuch:event".to_owned(), "nosuch"),
        (format!("p:{fix}:no_such_function"), "no_such_function"),
    ] {
        assert_one_line_error(&["trace", &spec, "--", "true"], want);
    }
    assert_one_line_error(
        &["trace", "t:sched:sched_switch", "-p", "999999999"],
        "999999999",
    );
    let (code, _, stderr) = run(&["trace", "-u", "t:sched:sched_switch"]);
    assert_eq!(code, 2, "{stderr}");
    let (code, _, stderr) = run(&["trace", "-A", "t:sched:sched_switch"]);
    assert_eq!(code, 2, "{stderr}");
    let nine: Vec<String> = (0..9).map(|_| "t:sched:sched_switch".to_owned()).collect();
    let mut args = vec!["trace"];
    args.extend(nine.iter().map(String::as_str));
    assert_one_line_error(&args, "at most 8 probes");
}

/// `-A` with `-M`: the distinct events, each with its count, at the end.
#[test]
fn aggregate_counts_the_distinct_events() {
    let fix = fixture();
    let spec = format!("p:{fix}:argfix_target (arg1 == 1) \"%s\", arg2");
    let Traced { stdout, done, .. } = trace_workload(
        "argfix",
        &["calls".to_owned()],
        &["trace", "-A", "-M", "5", &spec],
        Duration::ZERO,
        SIGINT,
    );
    let times = calls(&done)
        .into_iter()
        .find(|c| c.0 == 1)
        .map(|c| c.2)
        .unwrap();
    assert_eq!(times, 5);
    let counted: Vec<&str> = stdout.lines().filter(|l| l.contains("-->COUNT")).collect();
    assert_eq!(counted.len(), 1, "{stdout}");
    assert!(counted[0].ends_with("alpha-->COUNT 5"), "{stdout}");
}

/// `-U`: the user stack of each event, walked in the kernel from the
/// fixture's CFI: the probed function, then its callers up to `main`.
#[test]
fn user_stacks_by_the_cfi_walk() {
    let fix = fixture();
    let spec = format!("p:{fix}:argfix_target (arg1 == 16) \"%s\", arg2");
    let Traced { stdout, .. } = trace_workload(
        "argfix",
        &["calls".to_owned()],
        &["trace", "--json", "-U", "-M", "1", &spec],
        Duration::from_millis(300),
        SIGINT,
    );
    let lines = json_lines(&stdout);
    assert_eq!(lines.len(), 1, "{stdout}");
    let frames: Vec<&str> = lines[0]["user_stack"]
        .as_array()
        .unwrap_or_else(|| panic!("no user stack: {stdout}"))
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect();
    assert!(frames[0].starts_with("argfix_target+0x0 "), "{frames:?}");
    assert!(
        frames.iter().any(|f| f.starts_with("argfix::main")),
        "{frames:?}"
    );
}

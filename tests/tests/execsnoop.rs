//! `rtrace execsnoop` against real execs of uniquely named programs.

use std::process::Command;

use rtrace_integration_tests::{
    PinnedMaps, Rtrace, SIGINT, TestCgroup, UniqueProgram, cgroup_id, json_lines, mount_ns_id, run,
    run_workload, workload_bin,
};

/// Runs execsnoop with `extra` around `work`; returns the JSON events whose
/// first argument mentions `needle`.
fn traced(extra: &[&str], needle: &str, work: impl FnOnce()) -> Vec<serde_json::Value> {
    let mut args = vec!["execsnoop", "--json"];
    args.extend_from_slice(extra);
    let rtrace = Rtrace::start(&args);
    work();
    let (code, stdout, stderr) = rtrace.stop(SIGINT);
    // Events lost to other processes' execs are not this test's business;
    // the callers count the needle's own events.
    assert_eq!(code, 0, "stderr: {stderr}");
    json_lines(&stdout)
        .into_iter()
        .filter(|e| {
            e["args"].as_array().is_some_and(|a| {
                a.iter()
                    .any(|s| s.as_str().is_some_and(|s| s.contains(needle)))
            })
        })
        .collect()
}

fn strings(v: &serde_json::Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn every_exec_is_reported_once_with_args_pid_ppid_and_ret() {
    every_exec_is_reported(&[], "n");
}

#[test]
fn perf_buffer_transport_reports_every_exec() {
    every_exec_is_reported(&["--perf-buffer"], "pb");
}

fn every_exec_is_reported(extra: &[&str], tag: &str) {
    const N: usize = 25;
    let prog = UniqueProgram::new("rtx", tag);
    let mut pids = Vec::new();
    let mut events = traced(extra, prog.path(), || {
        for i in 0..N {
            let mut child = Command::new(prog.path())
                .args(["first", "with space", &i.to_string()])
                .spawn()
                .unwrap();
            pids.push(child.id());
            assert!(child.wait().unwrap().success());
        }
    });
    assert_eq!(events.len(), N, "{events:#?}");
    // Perf buffers are per CPU, so only each CPU's events keep their order.
    events.sort_by_key(|e| e["args"][3].as_str().unwrap().parse::<usize>().unwrap());
    let comm: String = prog.name().chars().take(15).collect();
    for (i, e) in events.iter().enumerate() {
        assert_eq!(
            strings(&e["args"]),
            [prog.path(), "first", "with space", &i.to_string()],
            "{e}"
        );
        assert_eq!(e["pid"], pids[i], "{e}");
        assert_eq!(e["ppid"], std::process::id(), "{e}");
        assert_eq!(e["ret"], 0, "{e}");
        assert_eq!(e["comm"], comm.as_str(), "{e}");
        assert_eq!(e["syscall"], "execve", "{e}");
        assert_eq!(e["truncated"], false, "{e}");
    }
}

#[test]
fn failed_exec_shows_only_with_x() {
    let missing = std::env::temp_dir().join(format!("rtrace-missing-{}", std::process::id()));
    let spawn_missing = || {
        assert!(Command::new(&missing).arg("nope").spawn().is_err());
    };
    let needle = missing.to_str().unwrap();
    let with_x = traced(&["-x"], needle, spawn_missing);
    assert_eq!(with_x.len(), 1, "{with_x:#?}");
    assert_eq!(with_x[0]["ret"], -2, "ENOENT: {}", with_x[0]);
    assert_eq!(strings(&with_x[0]["args"]), [needle, "nope"]);
    let without = traced(&[], needle, spawn_missing);
    assert!(without.is_empty(), "{without:#?}");
}

#[test]
fn execveat_through_a_descriptor_is_reported() {
    let prog = UniqueProgram::new("rtx", "at");
    let events = traced(&[], prog.path(), || {
        let status = Command::new(workload_bin("execveat"))
            .args([prog.path(), "via-fd"])
            .status()
            .unwrap();
        assert!(status.success());
    });
    // AT_EMPTY_PATH passes no file name, so argv[0] leads.
    let ours: Vec<_> = events
        .iter()
        .filter(|e| e["syscall"] == "execveat")
        .collect();
    assert_eq!(ours.len(), 1, "{events:#?}");
    assert_eq!(strings(&ours[0]["args"]), [prog.path(), "via-fd"]);
    assert_eq!(ours[0]["ret"], 0);
}

#[test]
fn a_script_shows_as_it_was_run_not_as_its_interpreter() {
    let prog = UniqueProgram::new("rtx", "script");
    // The kernel runs `/bin/sh -e SCRIPT one two`; bcc shows the exec as
    // the caller made it.
    std::fs::write(prog.path(), "#!/bin/sh -e\ntrue\n").unwrap();
    let events = traced(&[], prog.path(), || {
        let status = Command::new(prog.path())
            .args(["one", prog.path()])
            .status()
            .unwrap();
        assert!(status.success());
    });
    assert_eq!(events.len(), 1, "{events:#?}");
    assert_eq!(
        strings(&events[0]["args"]),
        [prog.path(), "one", prog.path()]
    );
}

#[test]
fn max_args_truncates_with_a_marker() {
    let prog = UniqueProgram::new("rtx", "max");
    let long = "y".repeat(300);
    let events = traced(&["--max-args", "3"], prog.path(), || {
        Command::new(prog.path())
            .args(["a", "b", "c", "d", "e"])
            .status()
            .unwrap();
        Command::new(prog.path()).arg(&long).status().unwrap();
    });
    assert_eq!(events.len(), 2, "{events:#?}");
    assert_eq!(strings(&events[0]["args"]), [prog.path(), "a", "b"]);
    assert_eq!(events[0]["truncated"], true);
    // An argument longer than the 128 bytes kept is cut, and says so.
    let args = strings(&events[1]["args"]);
    assert_eq!(args[1], "y".repeat(127));
    assert_eq!(events[1]["truncated"], true);
}

#[test]
fn line_filter_matches_arguments_and_name_filter_matches_comm() {
    let prog = UniqueProgram::new("rtx", "l");
    let tag = format!("marker{}", std::process::id());
    let work = || {
        Command::new(prog.path()).arg(&tag).status().unwrap();
        Command::new(prog.path()).arg("other").status().unwrap();
    };
    // -l looks at the arguments, not the command name (libbpf-tools' bug).
    let events = traced(&["-l", &tag], prog.path(), work);
    assert_eq!(events.len(), 1, "{events:#?}");
    assert_eq!(strings(&events[0]["args"])[1], tag);
    let name = prog.name()[..6].to_owned();
    let events = traced(&["-n", &name], prog.path(), work);
    assert_eq!(events.len(), 2, "{events:#?}");
    let events = traced(&["-n", "no-such-command"], prog.path(), work);
    assert!(events.is_empty(), "{events:#?}");
}

#[test]
fn text_output_has_libbpf_tools_columns_and_ppid() {
    let prog = UniqueProgram::new("rtx", "txt");
    let rtrace = Rtrace::start(&["execsnoop", "-U", "-T", "-q"]);
    let child = Command::new(prog.path())
        .arg("q\"uote")
        .spawn()
        .unwrap()
        .wait_with_output();
    assert!(child.unwrap().status.success());
    let (code, stdout, stderr) = rtrace.stop(SIGINT);
    assert_eq!(code, 0, "{stderr}");
    let mut lines = stdout.lines();
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        ["TIME", "UID", "PCOMM", "PID", "PPID", "RET", "ARGS"]
    );
    let line = lines
        .find(|l| l.contains(prog.path()))
        .unwrap_or_else(|| panic!("no line for the exec: {stdout}"));
    let cols: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(cols[1], "0", "uid: {line}");
    assert_eq!(cols[4], std::process::id().to_string(), "ppid: {line}");
    assert_eq!(cols[5], "0", "ret: {line}");
    assert!(
        line.ends_with(&format!("\"{}\" \"q\\\"uote\"", prog.path())),
        "quoted args: {line}"
    );
}

#[test]
fn cgroup_filter_keeps_only_members() {
    let cgroup = TestCgroup::new("execsnoop");
    let dir = cgroup.path.clone();
    let prog = UniqueProgram::new("rtx", "cg");
    let events = traced(&["-c", &dir], prog.path(), || {
        exec_inside_and_outside(&dir, &prog)
    });
    drop(cgroup);
    assert_eq!(events.len(), 1, "{events:#?}");
    assert_eq!(strings(&events[0]["args"])[1], "inside");
}

/// Runs `prog inside` in cgroup `dir` (a shell moves itself there, then
/// execs), and `prog outside` where the tests run.
fn exec_inside_and_outside(dir: &str, prog: &UniqueProgram) {
    let script = format!(
        "echo $$ > {dir}/cgroup.procs && exec {} inside",
        prog.path()
    );
    assert!(
        Command::new("sh")
            .args(["-c", &script])
            .status()
            .unwrap()
            .success()
    );
    Command::new(prog.path()).arg("outside").status().unwrap();
}

/// bcc's `--cgroupmap` and `--mntnsmap`: maps the user pinned in bpffs,
/// whose keys are the cgroups and mount namespaces to trace.
#[test]
fn pinned_cgroup_and_mount_namespace_maps_keep_only_their_members() {
    use std::io::Write as _;
    use std::os::unix::process::CommandExt as _;
    let mut maps = PinnedMaps::new("execsnoop");
    let (cgroups, cg_index) = maps.hash("cgroups");
    let (mntns, ns_index) = maps.hash("mntns");
    let cgroup = TestCgroup::new("execsnoop-map");
    maps.insert(cg_index, cgroup_id(&cgroup.path));
    let dir = cgroup.path.clone();
    let prog = UniqueProgram::new("rtx", "map");
    let events = traced(&["--cgroupmap", &cgroups], prog.path(), || {
        exec_inside_and_outside(&dir, &prog)
    });
    drop(cgroup);
    assert_eq!(events.len(), 1, "{events:#?}");
    assert_eq!(strings(&events[0]["args"])[1], "inside");

    let events = traced(&["--mntnsmap", &mntns], prog.path(), || {
        // A shell in a mount namespace of its own waits until its
        // namespace is in the map, then execs.
        let mut inside = Command::new("sh");
        inside
            .args(["-c", &format!("read x; exec {} inside", prog.path())])
            .stdin(std::process::Stdio::piped());
        // SAFETY: unshare(2) is async-signal-safe.
        unsafe {
            inside.pre_exec(|| {
                if libc::unshare(libc::CLONE_NEWNS) == 0 {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            });
        }
        let mut inside = inside.spawn().unwrap();
        let ns = mount_ns_id(inside.id());
        assert_ne!(ns, mount_ns_id(std::process::id()));
        maps.insert(ns_index, ns);
        inside.stdin.take().unwrap().write_all(b"go\n").unwrap();
        assert!(inside.wait().unwrap().success());
        Command::new(prog.path()).arg("outside").status().unwrap();
    });
    assert_eq!(events.len(), 1, "{events:#?}");
    assert_eq!(strings(&events[0]["args"])[1], "inside");
    // Not a pinned map, or the wrong kind: one line, and why.
    let (code, _, stderr) = run(&["execsnoop", "--cgroupmap", "/tmp"]);
    assert_ne!(code, 0);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("not a BPF map pinned in bpffs"), "{stderr}");
}

#[test]
fn bad_input_gets_one_line_and_nonzero_exit() {
    let (code, _, stderr) = run(&["execsnoop", "--max-args", "0"]);
    assert_eq!(code, 2, "{stderr}");
    let (code, _, stderr) = run(&["execsnoop", "--max-args", "61"]);
    assert_eq!(code, 2, "{stderr}");
    let (code, _, stderr) = run(&["execsnoop", "--buffer-size", "0"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("holds no event"), "{stderr}");
    let (code, _, stderr) = run(&["execsnoop", "--buffer-size", "lots"]);
    assert_eq!(code, 2, "{stderr}");
    let (code, _, stderr) = run(&["execsnoop", "-c", "/tmp"]);
    assert_ne!(code, 0);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("not a cgroup v2 directory"), "{stderr}");
}

/// `-P PPID` shows the children of that process only, and `-u` takes a
/// user's name as well as a number, as bcc's execsnoop does.
#[test]
fn parent_and_user_name_filters() {
    use std::io::Write as _;
    let true_bin = ["/usr/bin/true", "/bin/true"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .unwrap();
    // A shell that waits for a line, then runs `true` twice as its children.
    let mut parent = Command::new("sh")
        .args([
            "-c",
            // `exit` last: a shell may exec its last command in its own
            // place (busybox's does), which would be no child.
            &format!("read x; {true_bin} child-a; {true_bin} child-b; exit 0"),
        ])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let ppid = parent.id().to_string();
    // Names are read from /etc/passwd, which the guests lack: there the
    // ids stand in, and the host checks the names.
    let names = std::fs::read_to_string("/etc/passwd").is_ok_and(|p| p.contains("\nnobody:"));
    let (root, nobody) = if names {
        ("root", "nobody")
    } else {
        ("0", "65534")
    };
    let by_parent = Rtrace::start(&["execsnoop", "--json", "-P", &ppid]);
    let by_name = Rtrace::start(&["execsnoop", "--json", "-u", root]);
    let by_other = Rtrace::start(&["execsnoop", "--json", "-u", nobody]);
    // An exec that is not the shell's child.
    assert!(
        Command::new(true_bin)
            .arg("stranger")
            .status()
            .unwrap()
            .success()
    );
    writeln!(parent.stdin.take().unwrap(), "go").unwrap();
    assert!(parent.wait().unwrap().success());
    std::thread::sleep(std::time::Duration::from_millis(300));
    let args_of = |stdout: &str| -> Vec<String> {
        json_lines(stdout)
            .iter()
            .map(|e| {
                e["args"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(|v| v.as_str())
                            .collect::<Vec<_>>()
                            .join(" ")
                    })
                    .unwrap_or_default()
            })
            .collect()
    };
    let (code, stdout, stderr) = by_parent.stop(SIGINT);
    assert_eq!(code, 0, "{stderr}");
    let seen = args_of(&stdout);
    assert_eq!(seen.len(), 2, "{stdout}");
    assert!(
        seen[0].ends_with("child-a") && seen[1].ends_with("child-b"),
        "{seen:?}"
    );
    for e in json_lines(&stdout) {
        assert_eq!(e["ppid"].as_u64().unwrap().to_string(), ppid, "{e}");
    }
    let (code, stdout, stderr) = by_name.stop(SIGINT);
    assert_eq!(code, 0, "{stderr}");
    let seen = args_of(&stdout);
    for want in ["stranger", "child-a", "child-b"] {
        assert!(seen.iter().any(|a| a.ends_with(want)), "{want}: {seen:?}");
    }
    let (code, stdout, stderr) = by_other.stop(SIGINT);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        !args_of(&stdout).iter().any(|a| a.ends_with("stranger")),
        "{stdout}"
    );
    // Names that are not there, and a parent that is not.
    let (code, _, stderr) = run(&["execsnoop", "-u", "no-such-user"]);
    assert_eq!(code, 2, "{stderr}");
    let want = if names {
        "no user \"no-such-user\" in /etc/passwd"
    } else {
        "cannot read /etc/passwd"
    };
    assert!(stderr.contains(want), "{stderr}");
    let (code, _, stderr) = run(&["execsnoop", "-P", "999999999"]);
    assert_eq!(code, 1);
    assert!(stderr.contains("no such process: 999999999"), "{stderr}");
}

/// Two workers exec'ing as fast as they can, 3000 execs in all, under
/// execsnoop's default settings (text, the default event buffer): every
/// exec is printed and nothing is lost.
#[test]
fn an_exec_storm_loses_nothing_with_default_settings() {
    const EACH: usize = 1500;
    let prog = UniqueProgram::new("rtx", "storm");
    let rtrace = Rtrace::start(&["execsnoop"]);
    run_workload(
        "execstorm",
        &[EACH.to_string(), "2".to_owned(), prog.path().to_owned()],
    );
    let (code, stdout, stderr) = rtrace.stop(SIGINT);
    assert_eq!(code, 0, "{stderr}");
    let name = prog.name();
    let seen = stdout
        .lines()
        .filter(|l| l.contains(&name) && l.contains(" storm-"))
        .count();
    assert_eq!(seen, 2 * EACH, "{stderr}");
}

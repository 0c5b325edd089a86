//! Command mode (`rtrace TOOL -- CMD`), against real commands: the exit
//! status, the streams, the scope (the command and what it starts, from
//! its first exec), the identity it runs as, signals, and JIT symbols
//! written at exit (Mono's `--jitmap`).

use std::{
    process::{Command, Output, Stdio},
    time::{Duration, Instant},
};

use rtrace_integration_tests::{
    SIGINT, UniqueProgram, in_guest, json_lines, parse_folded, rtrace_bin, workload_bin,
};

fn rtrace(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(rtrace_bin())
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("cannot run rtrace")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The JSON lines of stderr, which rtrace's own lines share.
fn json_only(b: &[u8]) -> String {
    text(b)
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| format!("{l}\n"))
        .collect()
}

#[test]
fn exit_status_and_streams_are_the_commands() {
    let out = rtrace(
        &["runqlat", "--", "sh", "-c", "echo from-the-command; exit 3"],
        &[],
    );
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    // The command's stdout is its own; rtrace's report goes to stderr.
    assert_eq!(text(&out.stdout), "from-the-command\n");
    assert!(text(&out.stderr).contains("usecs"), "{}", text(&out.stderr));

    // -o FILE takes the report instead.
    let file = std::env::temp_dir().join(format!("rtrace-cmd-o-{}", std::process::id()));
    let out = rtrace(
        &[
            "runqlat",
            "-o",
            file.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            "exit 0",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let report = std::fs::read_to_string(&file).unwrap();
    let _ = std::fs::remove_file(&file);
    assert!(report.contains("usecs"), "{report}");
    assert!(!text(&out.stderr).contains("usecs"));
}

#[test]
fn a_command_killed_by_a_signal_gives_128_plus_its_number() {
    let out = rtrace(&["runqlat", "--", "sh", "-c", "kill -9 $$"], &[]);
    assert_eq!(out.status.code(), Some(137), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("usecs"));
}

#[test]
fn a_command_that_does_not_exist_gives_127_and_one_line() {
    let out = rtrace(&["runqlat", "--", "rtrace-no-such-command"], &[]);
    assert_eq!(out.status.code(), Some(127));
    let err = text(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("cannot run rtrace-no-such-command: command not found"),
        "{err}"
    );
    let out = rtrace(&["profile", "5", "--", "true"], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("a duration and -- CMD"));
}

#[test]
fn the_command_runs_as_the_invoking_user() {
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: only root can run a command as another user");
        return;
    }
    // As sudo leaves it: SUDO_UID and SUDO_GID name the invoking user.
    let out = rtrace(
        &["runqlat", "--", "sh", "-c", "id -u; id -g; echo $HOME"],
        &[("SUDO_UID", "65534"), ("SUDO_GID", "65534")],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let lines: Vec<String> = text(&out.stdout).lines().map(str::to_owned).collect();
    assert_eq!(lines[..2], ["65534", "65534"], "{lines:?}");
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    if !passwd.lines().any(|l| l.starts_with("nobody:")) {
        // The VM guests' images have no user database: ids are all there is.
        return;
    }
    assert_ne!(lines[2], "/root", "HOME is the invoking user's");
    // -u chooses; no sudo variables needed.
    let out = rtrace(&["runqlat", "-u", "nobody", "--", "id", "-un"], &[]);
    assert_eq!(text(&out.stdout).trim(), "nobody", "{}", text(&out.stderr));
    let out = rtrace(&["runqlat", "-u", "rtrace-no-such-user", "--", "true"], &[]);
    assert_ne!(out.status.code(), Some(0));
    assert!(text(&out.stderr).contains("no such user"));
}

/// Everything the command execs is seen, from the command's own exec on,
/// and nothing that runs beside it.
#[test]
fn execsnoop_sees_the_command_and_its_children_only() {
    let mine = UniqueProgram::new("rtc", "mine");
    let other = UniqueProgram::new("rtc", "other");
    // Execs beside the command, from a process rtrace did not start.
    let noise_script = format!("while :; do {}; sleep 0.01; done", other.path());
    let mut noise = Command::new("sh")
        .args(["-c", &noise_script])
        .spawn()
        .unwrap();
    let script = format!("for i in 1 2 3 4 5; do {}; done", mine.path());
    let out = rtrace(&["execsnoop", "--json", "--", "sh", "-c", &script], &[]);
    let _ = noise.kill();
    let _ = noise.wait();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let events = json_lines(&json_only(&out.stderr));
    let comm = |e: &serde_json::Value| e["comm"].as_str().unwrap_or("").to_owned();
    let args = |e: &serde_json::Value| e["args"].to_string();
    // The command's own exec: its first instruction was traced.
    assert!(
        events
            .iter()
            .any(|e| comm(e) == "sh" && args(e).contains("for i in")),
        "{events:?}"
    );
    let children = events.iter().filter(|e| comm(e) == mine.name()).count();
    assert_eq!(children, 5, "{events:?}");
    let strangers = events.iter().filter(|e| comm(e) == other.name()).count();
    assert_eq!(strangers, 0, "execs beside the command were traced");
}

/// With -p, the command only says how long: the process named is traced
/// while it runs, and the command is not.
#[test]
fn pid_and_command_trace_the_pid_while_the_command_runs() {
    let mine = UniqueProgram::new("rtc", "pid");
    let flag = std::env::temp_dir().join(format!("rtrace-cmd-flag-{}", std::process::id()));
    let _ = std::fs::remove_file(&flag);
    let flag = flag.to_str().unwrap().to_owned();
    // The target execs a program of its own once the command, which runs
    // only when tracing has begun, says so.
    let script = format!(
        "while [ ! -e {flag} ]; do sleep 0.02; done; exec {}",
        mine.path()
    );
    let mut target = Command::new("sh").args(["-c", &script]).spawn().unwrap();
    let pid = target.id().to_string();
    let started = Instant::now();
    let touch = format!("touch {flag}; sleep 1");
    let out = rtrace(
        &["execsnoop", "--json", "-p", &pid, "--", "sh", "-c", &touch],
        &[],
    );
    let took = started.elapsed();
    let _ = target.wait();
    let _ = std::fs::remove_file(&flag);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(took >= Duration::from_secs(1));
    let events = json_lines(&json_only(&out.stderr));
    let comms: Vec<String> = events
        .iter()
        .map(|e| e["comm"].as_str().unwrap_or("").to_owned())
        .collect();
    assert_eq!(comms, [mine.name()], "{events:?}");
    assert_eq!(events[0]["pid"].to_string(), pid);
}

/// A signal to rtrace alone (not from the terminal) is passed to the
/// command; the report is still printed, with the command's status.
#[test]
fn a_signal_reaches_the_command_and_the_report_is_printed() {
    let child = Command::new(rtrace_bin())
        .args(["runqlat", "--", "sleep", "30"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    unsafe { libc::kill(child.id() as i32, SIGINT) };
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(128 + SIGINT),
        "{}",
        text(&out.stderr)
    );
    assert!(text(&out.stderr).contains("usecs"), "{}", text(&out.stderr));
}

/// Mono's `--jitmap` writes /tmp/perf-PID.map only as the process exits:
/// under `-- CMD` the map is read then, and the JIT samples are named in
/// the split the program measured itself.
#[test]
fn mono_jit_frames_written_at_exit_are_named() {
    if in_guest() {
        eprintln!("skipped in the VM guests, which have no Mono; the host runs it");
        return;
    }
    let exe = workload_bin("Hot.exe");
    let out = rtrace(
        &[
            "profile",
            "-F",
            "199",
            "-f",
            "--",
            "mono",
            exe.to_str().unwrap(),
            "3",
        ],
        &[("MONO_ENV_OPTIONS", "--jitmap")],
    );
    let stdout = text(&out.stdout);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let split = stdout
        .lines()
        .find_map(|l| l.strip_prefix("split "))
        .unwrap_or_else(|| panic!("no split in {stdout}"));
    let ns = |key: &str| -> f64 {
        split
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix(key))
            .and_then(|v| v.parse().ok())
            .unwrap()
    };
    let (hot_ns, warm_ns) = (ns("hot="), ns("warm="));
    let want = hot_ns / (hot_ns + warm_ns);
    let (mut hot, mut warm, mut unnamed_jit) = (0u64, 0u64, 0u64);
    // The stacks share stderr with rtrace's own lines.
    let folded: String = stderr
        .lines()
        .filter(|l| {
            l.contains(';')
                && l.rsplit_once(' ')
                    .is_some_and(|(_, n)| n.parse::<u64>().is_ok())
        })
        .map(|l| format!("{l}\n"))
        .collect();
    for (stack, n) in parse_folded(&folded) {
        let Some(leaf) = stack.last() else { continue };
        if leaf.starts_with("HotProgram:Hot") {
            hot += n;
        } else if leaf.starts_with("HotProgram:Warm") {
            warm += n;
        } else if leaf == "[unknown]" && stack.first().is_some_and(|c| c == "mono") {
            unnamed_jit += n;
        }
    }
    let jit = hot + warm + unnamed_jit;
    assert!(jit >= 200, "too few JIT samples: {jit}\n{stderr}");
    assert!(
        (hot + warm) as f64 >= 0.95 * jit as f64,
        "only {} of {jit} JIT samples named",
        hot + warm
    );
    let got = hot as f64 / (hot + warm) as f64;
    // 5 points, and three standard errors of a share of this many samples.
    let n = (hot + warm) as f64;
    let bound = 0.05 + 3.0 * (want * (1.0 - want) / n).sqrt();
    assert!(
        (got - want).abs() <= bound,
        "Hot's share {got:.3}, the program measured {want:.3} (bound {bound:.3})"
    );
}

/// The same program, profiled by pid while it runs: its map is still
/// empty, and rtrace says so, with the cure.
#[test]
fn an_empty_perf_map_is_warned_of_with_the_cure() {
    if in_guest() {
        eprintln!("skipped in the VM guests, which have no Mono; the host runs it");
        return;
    }
    let exe = workload_bin("Hot.exe");
    let mut mono = Command::new("mono")
        .args([exe.to_str().unwrap(), "8"])
        .env("MONO_ENV_OPTIONS", "--jitmap")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(1));
    let pid = mono.id().to_string();
    let out = rtrace(&["profile", "-F", "199", "-f", "-p", &pid, "2"], &[]);
    let _ = mono.kill();
    let _ = mono.wait();
    let _ = std::fs::remove_file(format!("/tmp/perf-{pid}.map"));
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let warning = stderr
        .lines()
        .find(|l| l.contains(&format!("PID {pid} (mono): ")))
        .unwrap_or_else(|| panic!("no warning for {pid}: {stderr}"));
    assert!(warning.contains("JIT frames unnamed"), "{warning}");
    assert!(
        warning.contains(&format!("its /tmp/perf-{pid}.map was empty")),
        "{warning}"
    );
    assert!(warning.contains("rtrace profile -- CMD"), "{warning}");
}

/// argdist counts the command's own syscalls, every one and no other
/// process's: three echos are three writes.
#[test]
fn argdist_counts_exactly_the_commands_writes() {
    let out = rtrace(
        &[
            "argdist",
            "-C",
            "t:syscalls:sys_enter_write()",
            "--",
            "sh",
            "-c",
            "echo a; echo b; echo c",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "a\nb\nc\n");
    let err = text(&out.stderr);
    let total: u64 = err
        .lines()
        .filter(|l| l.contains("total calls"))
        .filter_map(|l| l.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    assert_eq!(total, 3, "{err}");
}

//! Command mode (`rtrace TOOL -- CMD`), against real commands: the exit
//! status, the streams, the scope (the command and what it starts, from
//! its first exec), the identity it runs as, signals, and JIT symbols
//! written at exit (Mono's `--jitmap`, and many short processes' maps).
//! Each tool is run on a workload whose events are known, with the same
//! work done beside the command by processes it did not start: the
//! command's events are all there, and none of the others'.

use std::{
    collections::BTreeMap,
    path::PathBuf,
    process::{Command, Output, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use rtrace_integration_tests::{
    LoopDevice, Mount, PingPong, SIGINT, UniqueProgram, Workload, assert_share, file_op,
    fileops_done, in_guest, json_lines, parse_folded, rtrace_bin, run_workload, workload_bin,
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
    let out = rtrace(&["runqlat", "1", "2", "--", "true"], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("a count of intervals and -- CMD"));
}

/// rtrace fails after the command was started, held at the cork (here:
/// `-p` names no process): one line, exit 1 at once, and the command
/// never ran.
#[test]
fn a_failure_after_the_command_started_ends_both_and_runs_nothing() {
    let marker = std::env::temp_dir().join(format!("rtrace-corked-{}", std::process::id()));
    let _ = std::fs::remove_file(&marker);
    // A hang (the command waiting at the cork, rtrace waiting for it)
    // ends in timeout's 124.
    let out = Command::new("timeout")
        .arg("60")
        .arg(rtrace_bin())
        .args(["runqlat", "-p", "999999999", "--", "touch"])
        .arg(&marker)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("no such process: 999999999"), "{err}");
    assert!(!marker.exists(), "the command ran after rtrace failed");
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
        eprintln!("skipped: the VM guests have no Mono; the host runs it");
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
    assert_share("HotProgram:Hot", hot, warm, want);
}

/// The same program, profiled by pid while it runs: its map is still
/// empty, and rtrace says so, with the cure.
#[test]
fn an_empty_perf_map_is_warned_of_with_the_cure() {
    if in_guest() {
        eprintln!("skipped: the VM guests have no Mono; the host runs it");
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

/// The path of workload `name`, for a command's script.
fn bin(name: &str) -> String {
    workload_bin(name).to_str().unwrap().to_owned()
}

/// The names of a JSON stack's frames (`user` or `kernel`), leaf first.
fn frame_names(frames: &serde_json::Value) -> Vec<String> {
    frames
        .as_array()
        .map(|a| {
            a.iter()
                .map(|f| f["name"].as_str().unwrap_or("").to_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// The numbers after `prefix` on each line of the command's stdout that
/// starts with it.
fn numbers_after(stdout: &str, prefix: &str) -> Vec<Vec<u64>> {
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix(prefix))
        .map(|rest| {
            rest.split_whitespace()
                .map(|n| n.parse().unwrap_or_else(|_| panic!("{prefix}{rest}")))
                .collect()
        })
        .collect()
}

/// The same work as the command's, done over and over beside it by
/// processes the test starts (outside the command's cgroup), from before
/// rtrace starts until [`Beside::finish`]. The command's script ends with
/// [`Beside::rendezvous`], which waits until the work has run once whole
/// since: so it surely ran while the command was traced.
struct Beside {
    dir: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Vec<u32>>>,
}

impl Beside {
    /// Starts running `work`, which returns the pids of the processes it
    /// ran, over and over on a thread of its own.
    fn start(tag: &str, mut work: impl FnMut() -> Vec<u32> + Send + 'static) -> Self {
        let dir = std::env::temp_dir().join(format!("rtrace-beside-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (dir, stop) = (dir.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut pids = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let asked = dir.join("asked").exists();
                    pids.extend(work());
                    if asked {
                        std::fs::write(dir.join("answered"), "").unwrap();
                    }
                }
                pids
            })
        };
        Self {
            dir,
            stop,
            thread: Some(thread),
        }
    }

    /// Shell commands that wait (a minute at most) until the work beside
    /// has run once whole since they began.
    fn rendezvous(&self) -> String {
        let d = self.dir.display();
        format!(
            "touch {d}/asked; i=0; while [ ! -e {d}/answered ] && [ $i -lt 3000 ]; \
             do sleep 0.02; i=$((i+1)); done"
        )
    }

    /// Stops the work; returns the pids of every process it ran.
    fn finish(mut self) -> Vec<u32> {
        self.stop.store(true, Ordering::Relaxed);
        let pids = self
            .thread
            .take()
            .unwrap()
            .join()
            .expect("the work beside the command failed");
        assert!(
            self.dir.join("answered").exists(),
            "the work beside the command never ran while the command waited for it"
        );
        assert!(!pids.is_empty());
        pids
    }
}

impl Drop for Beside {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs `name ARGS` beside the command with `input` on its stdin; returns
/// its pid, and fails the test if it fails.
fn run_beside(name: &str, args: &[&str], input: &str) -> u32 {
    use std::io::Write as _;
    let mut child = Command::new(workload_bin(name))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input.as_bytes()).unwrap();
    drop(stdin);
    assert!(child.wait().unwrap().success(), "{name} beside failed");
    pid
}

/// tcplife: every session the command's client made, at both of its
/// ends (the client and the server process it started), with their
/// bytes, the first one too; none of the same program's sessions beside
/// it; and the command's exit status.
#[test]
fn tcplife_sees_every_session_of_the_command_and_none_beside() {
    const N: usize = 5;
    const UP: u64 = 1234;
    const DOWN: u64 = 70_001;
    let beside = Beside::start("tcplife", || {
        let done = run_workload("tcpsessions", &["4", "2", "100", "300"].map(String::from));
        let f = numbers_after(&done, "done ");
        vec![f[0][0] as u32, f[0][1] as u32]
    });
    let script = format!(
        "{} 4 {N} {UP} {DOWN}; {}; exit 3",
        bin("tcpsessions"),
        beside.rendezvous()
    );
    let out = rtrace(&["tcplife", "--json", "--", "sh", "-c", &script], &[]);
    let outsiders = beside.finish();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    let done = numbers_after(&text(&out.stdout), "done ");
    assert_eq!(done.len(), 1, "{}", text(&out.stdout));
    let (client, server, port) = (done[0][0], done[0][1], done[0][2]);
    let events = json_lines(&json_only(&out.stderr));
    for e in &events {
        assert!(
            !outsiders.iter().any(|&p| e["pid"] == p),
            "a session beside the command was traced: {e}"
        );
    }
    let clients: Vec<_> = events.iter().filter(|e| e["pid"] == client).collect();
    let servers: Vec<_> = events.iter().filter(|e| e["pid"] == server).collect();
    assert_eq!(clients.len(), N, "client ends: {events:#?}");
    assert_eq!(servers.len(), N, "server ends: {events:#?}");
    // Nothing else the command started made a connection.
    assert_eq!(events.len(), 2 * N, "{events:#?}");
    for e in &clients {
        assert_eq!(e["comm"], "tcpsessions", "{e}");
        assert_eq!(e["rport"], port, "{e}");
        assert_eq!(
            (e["tx_bytes"].as_u64(), e["rx_bytes"].as_u64()),
            (Some(UP), Some(DOWN)),
            "{e}"
        );
    }
    for e in &servers {
        assert_eq!(e["comm"], "tcpserver", "{e}");
        assert_eq!(e["lport"], port, "{e}");
        assert_eq!(
            (e["tx_bytes"].as_u64(), e["rx_bytes"].as_u64()),
            (Some(DOWN), Some(UP)),
            "{e}"
        );
    }
}

/// gethostlatency: every lookup the command's program made, the first
/// one too, and none of the same program's beside it.
#[test]
fn gethostlatency_sees_every_lookup_of_the_command_and_none_beside() {
    if in_guest() {
        eprintln!("skipped: the VM guests have no resolver configuration; the host runs it");
        return;
    }
    const K: usize = 7;
    let beside = Beside::start("ghl", || {
        vec![run_beside("lookups", &["localhost", "5"], "")]
    });
    let script = format!(
        "{} localhost {K}; {}; exit 3",
        bin("lookups"),
        beside.rendezvous()
    );
    let out = rtrace(
        &["gethostlatency", "--json", "--", "sh", "-c", &script],
        &[],
    );
    let outsiders = beside.finish();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert_eq!(numbers_after(&text(&out.stdout), "done ").len(), 1);
    let events = json_lines(&json_only(&out.stderr));
    for e in &events {
        assert!(
            !outsiders.iter().any(|&p| e["pid"] == p),
            "a lookup beside the command was traced: {e}"
        );
    }
    assert_eq!(events.len(), K, "{stderr}");
    let pid = &events[0]["pid"];
    for e in &events {
        assert_eq!(&e["pid"], pid, "one process looked up: {stderr}");
        assert_eq!(e["comm"], "lookups", "{e}");
        assert_eq!(e["function"], "getaddrinfo", "{e}");
        assert_eq!(e["host"], "localhost", "{e}");
        let ns = e["latency_ns"].as_u64().unwrap();
        assert!(ns > 0 && ns < 5_000_000_000, "{e}");
    }
}

/// ext4slower with no threshold: every operation of the command's
/// program on a fresh ext4, from its first (the open), with exact bytes
/// and offsets; nothing of the same program's beside it on the same file
/// system.
#[test]
fn ext4slower_sees_every_file_operation_of_the_command_and_none_beside() {
    let fs = Mount::ext4("cmde4");
    let dir = fs.path.clone();
    let beside = Beside::start("e4", move || {
        let (mut w, ready) = Workload::start("fileops", &[dir.clone(), "ops".to_owned()]);
        assert_eq!(ready.trim(), "ready");
        w.go();
        assert!(w.wait().success());
        vec![w.pid()]
    });
    let script = format!(
        "echo go | {} {} ops; {}; exit 3",
        bin("fileops"),
        fs.path,
        beside.rendezvous()
    );
    let out = rtrace(
        &["ext4slower", "--json", "-m", "0", "--", "sh", "-c", &script],
        &[],
    );
    let outsiders = beside.finish();
    let stderr = text(&out.stderr);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    let done = stdout
        .lines()
        .find_map(|l| l.strip_prefix("done "))
        .unwrap_or_else(|| panic!("{stdout}"));
    let (name, did) = fileops_done(done);
    let events = json_lines(&json_only(&out.stderr));
    let others: Vec<String> = outsiders.iter().map(|p| format!("e4-{p}.dat")).collect();
    for e in &events {
        assert!(
            !outsiders.iter().any(|&p| e["pid"] == p)
                && !others.iter().any(|f| e["file"] == f.as_str()),
            "an operation beside the command was traced: {e}"
        );
    }
    let got: Vec<(String, i64, i64)> = events
        .iter()
        .filter(|e| e["file"] == name)
        .map(|e| {
            assert_eq!(e["comm"], "fileops", "{e}");
            file_op(e)
        })
        .collect();
    assert_eq!(got, did, "{stderr}");
}

/// biolatency: exactly the command's direct I/Os on a loop device, the
/// first one too, while the same program does direct I/O to the same
/// device beside it; under each I/O scheduler the device offers, as with
/// one a request is often issued by another task than its submitter (a
/// worker, or the process beside it running the queue), and the scope
/// is the submitter's.
#[test]
fn biolatency_counts_exactly_the_commands_requests() {
    const READS: u64 = 300;
    const WRITES: u64 = 100;
    let dev = LoopDevice::new("cmdbl");
    let scheduler = format!("/sys/block/{}/queue/scheduler", dev.name);
    let offered = std::fs::read_to_string(&scheduler).unwrap_or_default();
    let schedulers: Vec<String> = offered
        .split_whitespace()
        .map(|s| s.trim_matches(['[', ']']).to_owned())
        .collect();
    assert!(!schedulers.is_empty(), "{scheduler}: {offered:?}");
    for sched in &schedulers {
        std::fs::write(&scheduler, sched).unwrap();
        let path = dev.path.clone();
        let beside = Beside::start("bl", move || {
            vec![run_beside("directio", &[&path, "200", "100"], "")]
        });
        let script = format!(
            "{} {} {READS} {WRITES}; {}; exit 3",
            bin("directio"),
            dev.path,
            beside.rendezvous()
        );
        let out = rtrace(
            &["biolatency", "--json", "-D", "--", "sh", "-c", &script],
            &[],
        );
        beside.finish();
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{sched}: {stderr}");
        let lines = json_lines(&json_only(&out.stderr));
        assert_eq!(lines.len(), 1, "one report at the command's exit: {stderr}");
        let hists = lines[0]["histograms"].as_array().unwrap();
        let counted: u64 = hists
            .iter()
            .filter(|h| h["disk"] == dev.name.as_str())
            .map(|h| h["count"].as_u64().unwrap())
            .sum();
        // The workload's requests cannot merge: each is one, submitted by
        // the command's process; the device's others beside it.
        assert_eq!(
            counted,
            READS + WRITES,
            "with the {sched} scheduler, {counted} on {} (errors {}); the command made {}",
            dev.name,
            lines[0]["errors"],
            READS + WRITES
        );
    }
}

/// offcputime: a script that runs a program three times, the last two
/// blocking for a known time in two functions: each run's blocked time,
/// and that time under its own program's whole stacks (the runs are
/// forked by a shell already seen, and run another program); the
/// shell's own wait for them, from its start; nothing of the same
/// program beside it.
///
/// A new program's first stacks are walked by frame pointer until rtrace
/// has read the CFI of its files, which in the emulated guests takes
/// nearly half a second for the first program that uses libc: the first
/// run is for that. Stacks cut short at the leaf (the fixture has no
/// frame pointers) are told by their kernel frames, and whole stacks are
/// held to 80 % of the time.
#[test]
fn offcputime_names_every_run_of_the_command_with_its_blocked_time() {
    let beside = Beside::start("offcpu", || {
        vec![run_beside("cfuncs", &["block", "0.3"], "go\n")]
    });
    let run = format!(
        "echo go | {} block 1 & echo run $!; wait $!",
        bin("cfuncs_nofp")
    );
    let script = format!(
        "echo sh $$; echo go | {} block 0.3 >/dev/null; {run}; {run}; {}; exit 3",
        bin("cfuncs_nofp"),
        beside.rendezvous()
    );
    let out = rtrace(&["offcputime", "--json", "--", "sh", "-c", &script], &[]);
    let outsiders = beside.finish();
    let stderr = text(&out.stderr);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    let sh = numbers_after(&stdout, "sh ")[0][0];
    let runs: Vec<u64> = numbers_after(&stdout, "run ")
        .iter()
        .map(|n| n[0])
        .collect();
    let done = numbers_after(&stdout, "done ");
    assert_eq!((runs.len(), done.len()), (2, 2), "{stdout}");
    let stacks = json_lines(&json_only(&out.stderr));
    for s in &stacks {
        assert!(
            !outsiders.iter().any(|&p| s["pid"] == p) && s["comm"] != "cfuncs",
            "a process beside the command was traced: {s}"
        );
    }
    // Each run's stacks, folded, for the messages.
    let folded = |pid: u64| -> String {
        stacks
            .iter()
            .filter(|s| s["pid"] == pid)
            .map(|s| {
                let mut user = frame_names(&s["user"]);
                user.reverse();
                format!("{} {}\n", user.join(";"), s["us"])
            })
            .collect()
    };
    let mut measured_all = 0;
    let mut wrong = Vec::new();
    for (n, (&pid, done)) in runs.iter().zip(&done).enumerate() {
        let measured = (done[0] + done[1]) / 1000;
        measured_all += measured;
        let (mut blocked, mut whole) = (0, 0);
        for s in stacks.iter().filter(|s| s["pid"] == pid) {
            let user = frame_names(&s["user"]);
            let at = |name: &str| user.iter().position(|f| f == name);
            let leaf = at("sleep_alpha").or_else(|| at("wait_beta"));
            // In the two functions, or asleep in nanosleep or reading the
            // timerfd under a stack cut short.
            let kernel = frame_names(&s["kernel"]);
            let asleep = kernel
                .iter()
                .any(|f| f.contains("nanosleep") || f.starts_with("timerfd_read"));
            if leaf.is_none() && !asleep {
                continue;
            }
            let us = s["us"].as_u64().unwrap();
            blocked += us;
            if let (Some(i), Some(mid), Some(main)) = (leaf, at("mid_block"), at("main"))
                && mid == i + 1
                && main == i + 2
            {
                whole += us;
            }
        }
        // Off the CPU for no longer than the calls took, and for most of
        // it: in the emulated guests the calls spend a good part of their
        // time on the CPU.
        if blocked as f64 > 1.05 * measured as f64
            || (blocked as f64) < 0.8 * measured as f64
            || (whole as f64) < 0.8 * blocked as f64
        {
            wrong.push(format!(
                "run {} (pid {pid}) blocked {measured} us; {blocked} us seen blocked, {whole} us \
                 of it under whole stacks; its stacks:\n{}",
                n + 1,
                folded(pid)
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // The command itself, from its start: the shell was off the CPU
    // while it waited for both runs (in wait4 or sigsuspend, as shells
    // wait).
    let waited: u64 = stacks
        .iter()
        .filter(|s| s["pid"] == sh)
        .map(|s| s["us"].as_u64().unwrap())
        .sum();
    assert!(
        waited as f64 >= 0.9 * measured_all as f64,
        "the shell was off the CPU {waited} us, while runs blocked {measured_all} us; its \
         stacks:\n{}",
        folded(sh)
    );
}

/// runqlat per process: every time the command's program's threads ran
/// after waiting, from the process's start (its own count of context
/// switches, read while it is parked, is the measure), and no histogram
/// of the same program beside it.
#[test]
fn runqlat_counts_every_switch_of_the_command_and_none_beside() {
    const ROUNDS: u64 = 3000;
    let beside = Beside::start("runqlat", || {
        let mut p = PingPong::start(1000);
        p.play();
        vec![p.pid()]
    });
    // The program parks once it is done, until its stdin (a FIFO the
    // script holds) closes: its counts are read then.
    let script = format!(
        "d=$(mktemp -d); mkfifo $d/in; {} {ROUNDS} 0 < $d/in > $d/out & pid=$!; \
         exec 3>$d/in; echo go >&3; \
         while ! grep -q done $d/out; do sleep 0.01; done; \
         echo pid $pid; cat /proc/$pid/task/*/status | grep ctxt_switches; \
         exec 3>&-; wait $pid; rm -r $d; {}; exit 3",
        bin("pingpong"),
        beside.rendezvous()
    );
    let out = rtrace(&["runqlat", "-P", "--json", "--", "sh", "-c", &script], &[]);
    let outsiders = beside.finish();
    let stderr = text(&out.stderr);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    let pid = numbers_after(&stdout, "pid ")[0][0];
    let switches: u64 = stdout
        .lines()
        .filter(|l| l.contains("ctxt_switches:"))
        .map(|l| {
            l.rsplit(|c: char| c.is_whitespace())
                .next()
                .unwrap()
                .parse::<u64>()
                .unwrap()
        })
        .sum();
    assert!(switches >= 2 * ROUNDS, "{stdout}");
    let lines = json_lines(&json_only(&out.stderr));
    assert_eq!(lines.len(), 1, "{stderr}");
    let hists = lines[0]["histograms"].as_array().unwrap();
    for h in hists {
        assert!(
            !outsiders.iter().any(|&p| h["pid"] == p),
            "a process beside the command was traced: {h}"
        );
    }
    let count = hists
        .iter()
        .filter(|h| h["pid"] == pid)
        .map(|h| h["count"].as_u64().unwrap())
        .sum::<u64>();
    // Every switch out was followed by a run after waiting (the parked
    // threads' last ones as the program exits), and each new thread's
    // first run is one more; the exit adds a few wakeups after the read.
    assert!(
        count >= switches && count <= switches + 30,
        "runqlat counted {count} runs of pid {pid}; its threads switched {switches} times:\n{stderr}"
    );
}

/// Twenty short processes, four at a time, each running JIT code that it
/// names in its perf map only as it exits, under a name with its own pid:
/// every process has samples, its JIT frames are named from its own map,
/// and at least 95 % of all JIT samples are named.
#[test]
fn jit_maps_written_at_exit_by_many_short_processes_are_each_named() {
    const PROCS: usize = 20;
    let jit = bin("jit");
    let script = format!(
        "for i in 1 2 3 4 5; do for j in 1 2 3 4; do {jit} 0.3 --map-at-exit & done; wait; done"
    );
    let beside = Beside::start("jit", || {
        vec![run_beside("jit", &["0.2", "--map-at-exit"], "")]
    });
    let script = format!("{script}; {}; exit 3", beside.rendezvous());
    let out = rtrace(
        &["profile", "-F", "499", "--json", "--", "sh", "-c", &script],
        &[],
    );
    let outsiders = beside.finish();
    let stderr = text(&out.stderr);
    let pids: Vec<u64> = numbers_after(&text(&out.stdout), "ready ")
        .iter()
        .map(|n| n[0])
        .collect();
    for pid in pids
        .iter()
        .copied()
        .chain(outsiders.iter().map(|&p| u64::from(p)))
    {
        let _ = std::fs::remove_file(format!("/tmp/perf-{pid}.map"));
    }
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert_eq!(pids.len(), PROCS, "{}", text(&out.stdout));
    let samples = json_lines(&json_only(&out.stderr));
    for s in &samples {
        assert!(
            !outsiders.iter().any(|&p| s["pid"] == p),
            "a process beside the command was sampled: {s}"
        );
    }
    // Per process: its samples in JIT code named, and the callers of
    // that code (its stacks below the leaf).
    let mut per_pid: BTreeMap<u64, u64> = BTreeMap::new();
    let mut callers: BTreeMap<u64, Vec<Vec<String>>> = BTreeMap::new();
    let jit_samples = samples.iter().filter(|s| s["comm"] == "jit");
    for s in jit_samples.clone() {
        let pid = s["pid"].as_u64().unwrap();
        let user = s["user"].as_array().cloned().unwrap_or_default();
        for f in user.iter().filter(|f| f["kind"] == "jit") {
            assert_eq!(
                f["name"].as_str(),
                Some(format!("rtrace_jit_fixture_hot_{pid}").as_str()),
                "pid {pid}'s JIT frame named from another map: {s}"
            );
        }
        if user.first().is_some_and(|f| f["kind"] == "jit") {
            *per_pid.entry(pid).or_default() += s["count"].as_u64().unwrap();
            callers
                .entry(pid)
                .or_default()
                .push(frame_names(&s["user"])[1..].to_vec());
        }
    }
    // Samples of JIT code left unnamed: an unnamed leaf under the callers
    // of the process's named JIT code (in user mode, for a process with
    // none named).
    let unnamed: u64 = jit_samples
        .filter(|s| {
            let user = frame_names(&s["user"]);
            let pid = s["pid"].as_u64().unwrap();
            user.first().is_some_and(|f| f == "[unknown]")
                && match callers.get(&pid) {
                    Some(c) => c.contains(&user[1..].to_vec()),
                    None => s["kernel"].as_array().is_some_and(Vec::is_empty),
                }
        })
        .map(|s| s["count"].as_u64().unwrap())
        .sum();
    let named: u64 = per_pid.values().sum();
    let total = named + unnamed;
    assert!(total >= 100, "too few JIT samples: {total}\n{stderr}");
    assert!(
        named as f64 >= 0.95 * total as f64,
        "only {named} of {total} JIT samples named:\n{stderr}"
    );
    let missing: Vec<u64> = pids
        .iter()
        .copied()
        .filter(|p| !per_pid.contains_key(p))
        .collect();
    assert!(
        missing.is_empty(),
        "processes without named JIT samples: {missing:?} ({per_pid:?})\n{stderr}"
    );
}

/// The command-mode cgroups under the cgroup v2 hierarchy named for
/// rtrace `pid`.
fn command_cgroups(pid: u32) -> Vec<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let root = info
        .lines()
        .find_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            (right.split_whitespace().next()? == "cgroup2")
                .then(|| PathBuf::from(left.split_whitespace().nth(4).unwrap()))
        })
        .expect("a cgroup v2 hierarchy (command mode needs one)");
    let name = format!("rtrace-cmd-{pid}");
    let mut found = Vec::new();
    let mut level = vec![root];
    for _ in 0..8 {
        let mut next = Vec::new();
        for dir in level {
            for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    if e.file_name().to_str() == Some(&name) {
                        found.push(e.path());
                    } else {
                        next.push(e.path());
                    }
                }
            }
        }
        level = next;
    }
    found
}

/// `kill -9` of rtrace in command mode leaves its cgroup behind, with the
/// command in it: `rtrace doctor` lists it while the command runs, and
/// the next rtrace run after the command's exit removes it, saying so
/// with `-v`.
#[test]
fn a_killed_rtraces_cgroup_is_removed_by_the_next() {
    // Killed once the command runs (its line says so), not at the cork,
    // where the command would go with it.
    // The command inherits rtrace's stderr: it is read to the line, then
    // left, as the command holds it open.
    let mut killed = Command::new(rtrace_bin())
        .args(["profile", "-F", "49", "--", "sleep", "3"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let owner = killed.id();
    // Kept open to the end: rtrace would end at its next line to a closed
    // pipe, and put the command back out of its cgroup as it went.
    let mut lines = {
        use std::io::BufRead as _;
        std::io::BufReader::new(killed.stderr.take().unwrap()).lines()
    };
    assert!(
        lines.any(|l| l.is_ok_and(|l| l.starts_with("Sampling"))),
        "rtrace never started the command"
    );
    let dir = command_cgroups(owner)
        .into_iter()
        .next()
        .expect("rtrace made no command cgroup");
    // The line comes before the command leaves the cork: killed there,
    // the command would go with rtrace. Killed once it runs `sleep`.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .any(|p| {
            std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == "sleep")
        })
    {
        assert!(Instant::now() < deadline, "the command never ran");
        std::thread::sleep(Duration::from_millis(10));
    }
    killed.kill().unwrap();
    let _ = killed.wait();
    assert!(dir.exists(), "{} gone with rtrace", dir.display());
    let sleeper: String = std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap()
        .trim()
        .to_owned();
    let doctor = rtrace(&["doctor"], &[]);
    let listed = String::from_utf8_lossy(&doctor.stdout).into_owned();
    assert!(
        listed.contains(&format!(
            "{} (rtrace {owner}): processes {sleeper}",
            dir.display()
        )),
        "doctor does not list {} with the command {sleeper}:\n{listed}",
        dir.display()
    );
    // The command exits; the cgroup is empty, and any run removes it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::read_to_string(dir.join("cgroup.procs")).is_ok_and(|p| !p.trim().is_empty()) {
        assert!(Instant::now() < deadline, "the command never exited");
        std::thread::sleep(Duration::from_millis(50));
    }
    let next = rtrace(&["runqlat", "-v", "1", "1"], &[]);
    let stderr = String::from_utf8_lossy(&next.stderr);
    assert!(next.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("rtrace: removed {}", dir.display())),
        "-v says nothing of the cgroup removed:\n{stderr}"
    );
    assert!(command_cgroups(owner).is_empty(), "{} left", dir.display());
    drop(lines);
}

//! `rtrace strace` against strace itself (Debian's, installed by `cargo
//! xtask`) on one fixture that makes a known sequence of syscalls, and
//! against a fixture's own counts for the summary and under overload.

use std::{collections::BTreeMap, path::PathBuf, process::Command};

use rtrace_integration_tests::{Rtrace, SIGINT, Workload, in_guest, run, workload_bin};

use std::fmt::Write as _;
use std::io::Write as _;

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("rtrace-strace-{}-{name}", std::process::id()))
}

/// One logical event of a trace: a syscall (an unfinished call and its
/// resumption joined), a signal or an exit, by the task it happened in.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Call {
    /// The syscall's name, or `---`/`+++` with what they say.
    what: String,
    /// The return as strace prints it, pids made `PID`.
    ret: String,
    /// The quoted strings among the arguments.
    strings: Vec<String>,
    /// Whether it was shown unfinished and resumed.
    split: bool,
}

/// The quoted strings of `text`, escapes kept.
fn strings(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if c != '"' {
            continue;
        }
        let mut end = None;
        while let Some((j, d)) = chars.next() {
            match d {
                '\\' => {
                    chars.next();
                }
                '"' => {
                    end = Some(j);
                    break;
                }
                _ => {}
            }
        }
        if let Some(j) = end {
            out.push(text[i..=j].to_owned());
        }
    }
    out
}

/// A trace's lines by task: strace's `-f -o` lines begin with the pid,
/// rtrace's with `[pid N]` but for the first process. Tasks are numbered
/// by first appearance, so the two runs' pids compare.
fn parse(text: &str, rtrace: bool) -> BTreeMap<usize, Vec<Call>> {
    let mut order: Vec<u32> = Vec::new();
    let mut out: BTreeMap<usize, Vec<Call>> = BTreeMap::new();
    let mut pending: BTreeMap<usize, Call> = BTreeMap::new();
    let pid_re = |s: &str| s.chars().all(|c| c.is_ascii_digit()) && !s.is_empty();
    for line in text.lines() {
        let (pid, rest) = if rtrace {
            match line.strip_prefix("[pid ") {
                Some(r) => {
                    let (p, rest) = r.split_once("] ").unwrap();
                    (p.trim().parse().unwrap(), rest)
                }
                None => (0, line),
            }
        } else {
            let (p, rest) = line.split_once(' ').unwrap();
            assert!(pid_re(p), "{line}");
            (p.parse().unwrap(), rest)
        };
        let task = match order.iter().position(|&p| p == pid) {
            Some(i) => i,
            None => {
                order.push(pid);
                order.len() - 1
            }
        };
        let rest = rest.trim();
        if rest.starts_with("---") || rest.starts_with("+++") {
            // `--- SIGUSR1 {si_signo=..., si_code=...` to the signal and
            // its code; exits whole.
            let what = if rest.starts_with("---") {
                let sig = rest.split_whitespace().nth(1).unwrap().to_owned();
                let code = rest
                    .split("si_code=")
                    .nth(1)
                    .and_then(|r| r.split([',', '}']).next())
                    .unwrap_or("");
                format!("--- {sig} {code}")
            } else {
                rest.to_owned()
            };
            out.entry(task).or_default().push(Call {
                what,
                ret: String::new(),
                strings: Vec::new(),
                split: false,
            });
            continue;
        }
        if let Some(r) = rest.strip_prefix("<... ") {
            let (name, tail) = r.split_once(" resumed>").unwrap();
            let mut call = pending.remove(&task).unwrap_or_else(|| Call {
                what: name.to_owned(),
                ret: String::new(),
                strings: Vec::new(),
                split: true,
            });
            let (args, ret) = split_ret(tail);
            call.strings.extend(strings(args));
            call.ret = norm_ret(&call.what, ret);
            out.entry(task).or_default().push(call);
            continue;
        }
        let Some((name, args)) = rest.split_once('(') else {
            continue;
        };
        if let Some(head) = args.strip_suffix("<unfinished ...>") {
            pending.insert(
                task,
                Call {
                    what: name.to_owned(),
                    ret: String::new(),
                    strings: strings(head),
                    split: true,
                },
            );
            continue;
        }
        let (args, ret) = split_ret(args);
        out.entry(task).or_default().push(Call {
            what: name.to_owned(),
            ret: norm_ret(name, ret.trim()),
            strings: strings(args),
            split: false,
        });
    }
    out
}

/// A call's arguments and its return, strace's padding before `=` taken
/// out.
fn split_ret(text: &str) -> (&str, &str) {
    let mut at = text.len();
    while let Some(i) = text[..at].rfind(')') {
        let rest = text[i + 1..].trim_start();
        if let Some(ret) = rest.strip_prefix("= ") {
            return (&text[..i], ret);
        }
        at = i;
    }
    (text, "?")
}

/// A return value with what differs between runs taken out: pids, the
/// time a call took (`-T`), an error's description kept.
fn norm_ret(name: &str, ret: &str) -> String {
    let ret = ret.split(" <").next().unwrap_or(ret).trim();
    match name {
        "clone" | "clone3" | "fork" | "vfork" | "wait4" | "getpid" | "gettid" => {
            if ret.starts_with('-') {
                ret.to_owned()
            } else {
                "PID".to_owned()
            }
        }
        _ => ret.to_owned(),
    }
}

/// The calls compared: what the fixture does itself, and the loader's
/// file work, each the same in any run of the fixture.
fn compared(calls: &[Call]) -> Vec<Call> {
    const NAMES: [&str; 14] = [
        "openat",
        "read",
        "write",
        "newfstatat",
        "socket",
        "connect",
        "close",
        "pipe2",
        "kill",
        "clone",
        "clone3",
        "execve",
        "exit_group",
        "exit",
    ];
    calls
        .iter()
        .filter(|c| {
            NAMES.contains(&c.what.as_str())
                || c.what.starts_with("+++")
                // SIGCHLD is ignored by default: only a ptrace stop shows
                // it, so strace's trace has it and the kernel's has not.
                || c.what.starts_with("--- SIGUSR1")
        })
        .cloned()
        .collect()
}

/// The fixture under `strace -f -s 256` and under `rtrace strace -s 256`:
/// each task (the process, its thread, its child) makes the same calls in
/// the same order, with the same returns and errors, the same paths,
/// strings, buffers and argv, the blocking read shown unfinished and
/// resumed in both, the same signal and the same exits.
#[test]
fn the_fixtures_calls_are_straces() {
    if in_guest() {
        eprintln!("strace not compared: the VM guests have no strace (the host compares)");
        return;
    }
    let fixture = workload_bin("stracefix");
    let theirs = temp("strace.txt");
    let ours = temp("rtrace.txt");
    let status = Command::new("strace")
        .args(["-f", "-s", "256", "-o"])
        .arg(&theirs)
        .arg(&fixture)
        .stdout(std::process::Stdio::null())
        .status()
        .expect("strace (cargo xtask setup installs it)");
    assert!(status.success());
    let (code, _, stderr) = run(&[
        "strace",
        "-s",
        "256",
        "-o",
        ours.to_str().unwrap(),
        "--",
        fixture.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{stderr}");
    let theirs_text = std::fs::read_to_string(&theirs).unwrap();
    let ours_text = std::fs::read_to_string(&ours).unwrap();
    let _ = std::fs::remove_file(&theirs);
    let _ = std::fs::remove_file(&ours);
    let a = parse(&theirs_text, false);
    let b = parse(&ours_text, true);
    assert_eq!(
        a.len(),
        3,
        "the process, its thread, its child:\n{theirs_text}"
    );
    assert_eq!(b.len(), a.len(), "tasks:\n{ours_text}");
    for (task, calls) in &a {
        let want = compared(calls);
        let got = compared(&b[task]);
        for (i, (w, g)) in want.iter().zip(&got).enumerate() {
            assert_eq!(
                (&w.what, &w.ret, &w.strings),
                (&g.what, &g.ret, &g.strings),
                "task {task}, call {i}:\nstrace:\n{theirs_text}\nrtrace:\n{ours_text}"
            );
        }
        assert_eq!(want.len(), got.len(), "task {task}:\n{want:#?}\n{got:#?}");
    }
    // The main thread's read of the pipe blocks until the other thread
    // writes: both show it unfinished and resumed.
    let blocked = |t: &BTreeMap<usize, Vec<Call>>| {
        t[&0]
            .iter()
            .any(|c| c.what == "read" && c.split && c.strings == ["\"ping\""])
    };
    assert!(blocked(&a), "{theirs_text}");
    assert!(blocked(&b), "{ours_text}");
}

/// `-e trace=` by names and by class, `-Z` and `--duration`, each on the
/// same fixture.
#[test]
fn filters_do_what_they_say() {
    let fixture = workload_bin("stracefix");
    let fixture = fixture.to_str().unwrap();
    let trace = |extra: &[&str]| -> Vec<String> {
        let out = temp("filter.txt");
        let mut args = vec!["strace", "-f", "-o", out.to_str().unwrap()];
        args.extend_from_slice(extra);
        args.extend(["--", fixture]);
        let (code, _, stderr) = run(&args);
        assert_eq!(code, 0, "{stderr}");
        let text = std::fs::read_to_string(&out).unwrap();
        let _ = std::fs::remove_file(&out);
        // -f -o's lines begin with the task's id, as strace's.
        text.lines()
            .map(|l| {
                l.trim_start_matches(|c: char| c.is_ascii_digit())
                    .trim_start()
                    .to_owned()
            })
            .filter(|l| !l.starts_with("---") && !l.starts_with("+++"))
            .collect()
    };
    let name = |l: &String| l.split('(').next().unwrap_or("").to_owned();
    let lines = trace(&["-e", "trace=openat,connect"]);
    assert!(
        lines
            .iter()
            .all(|l| ["openat", "connect"].contains(&name(l).as_str()))
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("\"/nonexistent/stracefix\""))
    );
    assert!(lines.iter().any(|l| l.starts_with("connect(")));
    let lines = trace(&["-e", "trace=%network"]);
    let names: Vec<String> = lines.iter().map(name).collect();
    assert_eq!(names, ["socket", "connect"], "{lines:?}");
    let lines = trace(&["-e", "trace=!%memory,%signal", "-e", "trace=%memory"]);
    assert!(
        lines
            .iter()
            .all(|l| ["mmap", "munmap", "mprotect", "brk", "madvise"].contains(&name(l).as_str())),
        "the last -e wins, as strace's: {lines:?}"
    );
    let lines = trace(&["-Z"]);
    assert!(!lines.is_empty());
    assert!(lines.iter().all(|l| l.contains(" = -1 ")), "{lines:?}");
    assert!(lines.iter().any(|l| l.contains("ECONNREFUSED")));
    assert!(
        lines
            .iter()
            .any(|l| l.contains("\"/nonexistent/stracefix\""))
    );
    // The writer sleeps 200 ms; the reader waits as long for it.
    let lines = trace(&["--duration", "100", "-T"]);
    let spent = |l: &String| -> f64 {
        l.rsplit_once(" <")
            .and_then(|(_, t)| t.strip_suffix('>')?.parse().ok())
            .unwrap_or_else(|| panic!("no time spent: {l}"))
    };
    // An unfinished call's time is on its resumed line.
    assert!(
        lines
            .iter()
            .filter(|l| !l.ends_with("<unfinished ...>"))
            .all(|l| spent(l) >= 0.1),
        "{lines:?}"
    );
    assert!(
        lines.iter().any(|l| name(l) == "clock_nanosleep"),
        "{lines:?}"
    );
    assert!(lines.iter().any(|l| l.contains("\"ping\"")), "{lines:?}");
}

/// `-c` of a process: the summary's calls of each syscall the fixture
/// makes N of are N, from the kernel's own counts; `--summary-by-process`
/// of the whole system beside it gives the fixture a table of its own
/// with its N getppid calls.
#[test]
fn the_summary_counts_each_call() {
    const N: u64 = 3000;
    let (mut w, line) = Workload::start("statfix", &[N.to_string()]);
    assert_eq!(line.trim(), "ready");
    let pid = w.pid().to_string();
    let rtrace = Rtrace::start_until(&["strace", "-c", "-p", &pid], "Tracing the syscalls");
    // Beside it, the whole system's getppid calls split by process.
    let by_process = Rtrace::start_until(
        &["strace", "--summary-by-process", "-e", "trace=getppid"],
        "Tracing the syscalls",
    );
    w.go();
    let (code, stdout, stderr) = rtrace.stop(SIGINT);
    assert_eq!(code, 0, "{stderr}");
    let (code, split, stderr) = by_process.stop(SIGINT);
    assert_eq!(code, 0, "{stderr}");
    assert!(w.wait().success());
    let heading = format!(" statfix ({pid}), {N} calls");
    let table = split
        .split_once(&heading)
        .unwrap_or_else(|| panic!("no table headed {heading:?}:\n{split}"))
        .1;
    let getppid = table
        .lines()
        .find(|l| l.split_whitespace().last() == Some("getppid"))
        .and_then(|l| l.split_whitespace().nth(3)?.parse::<u64>().ok());
    assert_eq!(getppid, Some(N), "{split}");
    let row = |name: &str| -> (u64, u64) {
        let l = stdout
            .lines()
            .find(|l| l.split_whitespace().last() == Some(name))
            .unwrap_or_else(|| panic!("no {name} row:\n{stdout}"));
        let f: Vec<&str> = l.split_whitespace().collect();
        // % time, seconds, usecs/call, calls, [errors], syscall.
        let errors = if f.len() == 6 {
            f[4].parse().unwrap()
        } else {
            0
        };
        (f[3].parse().unwrap(), errors)
    };
    assert_eq!(row("getppid"), (N, 0), "{stdout}");
    assert_eq!(row("clock_nanosleep").0, N, "{stdout}");
    assert!(stdout.starts_with("% time     seconds  usecs/call     calls    errors syscall"));
    assert!(
        stdout.lines().last().unwrap().ends_with(" total"),
        "{stdout}"
    );
}

/// Overload: a fixture making many calls into a small buffer. Every call
/// is either printed or counted lost (and the loss reported), and the
/// summary beside the lines (`-C`) is exact.
#[test]
fn nothing_is_lost_silently_under_overload() {
    const N: u64 = 200_000;
    let (mut w, line) = Workload::start("statfix", &[N.to_string()]);
    assert_eq!(line.trim(), "ready");
    let pid = w.pid().to_string();
    let out = temp("overload.txt");
    let rtrace = Rtrace::start_until(
        &[
            "strace",
            "-C",
            "-e",
            "trace=getppid",
            "--buffer-size",
            "64K",
            "-o",
            out.to_str().unwrap(),
            "-p",
            &pid,
        ],
        "Tracing the syscalls",
    );
    w.go();
    let (code, _, stderr) = rtrace.stop(SIGINT);
    assert_eq!(code, 0, "{stderr}");
    assert!(w.wait().success());
    let text = std::fs::read_to_string(&out).unwrap();
    let _ = std::fs::remove_file(&out);
    let printed = text.lines().filter(|l| l.starts_with("getppid(")).count() as u64;
    let lost: u64 = stderr
        .lines()
        .find(|l| l.contains("events lost (event buffer full"))
        .and_then(|l| {
            l.strip_prefix("rtrace: warning[lost]: ")?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or(0);
    assert_eq!(
        printed + lost,
        N,
        "printed {printed}, lost {lost}:\n{stderr}"
    );
    let calls: u64 = text
        .lines()
        .find(|l| l.split_whitespace().last() == Some("getppid"))
        .and_then(|l| l.split_whitespace().nth(3)?.parse().ok())
        .unwrap_or_else(|| panic!("no summary row:\n{text}"));
    assert_eq!(calls, N);
}

#[test]
fn bad_input_is_one_clear_line() {
    rtrace_integration_tests::assert_one_line_error(
        &["strace", "-e", "trace=openat,nosuchcall", "-p", "1"],
        "column 14: no syscall \"nosuchcall\"",
    );
    rtrace_integration_tests::assert_one_line_error(
        &["strace", "-e", "trace=%nope", "-p", "1"],
        "unknown class %nope",
    );
    rtrace_integration_tests::assert_one_line_error(&["strace", "-p", "999999999"], "999999999");
    rtrace_integration_tests::assert_one_line_error(
        &["strace", "-s", "4096", "-p", "1"],
        "-s 4096",
    );
}

/// The lines of a trace that show a descriptor with its path, as (the
/// syscall, the annotations), pipes' inode numbers left out (each run has
/// its own pipes).
fn annotated(text: &str) -> Vec<(String, Vec<String>)> {
    text.lines()
        .filter_map(|l| {
            // rtrace's `[pid N] `, strace -f -o's `N `.
            let l = l
                .strip_prefix("[pid ")
                .and_then(|r| r.split_once("] "))
                .map_or(l, |(_, rest)| rest);
            let l = l.trim_start_matches(|c: char| c.is_ascii_digit() || c == ' ');
            let name = l.split('(').next()?.to_owned();
            let mut marks = Vec::new();
            let mut rest = l;
            while let Some(i) = rest.find('<') {
                let tail = &rest[i + 1..];
                let Some(j) = tail.find('>') else { break };
                let mark = &tail[..j];
                if mark.starts_with('/') || mark.contains(":[") {
                    let mark = match mark.split_once(":[") {
                        Some((kind, _)) => format!("{kind}:[]"),
                        None => mark.to_owned(),
                    };
                    marks.push(mark);
                }
                rest = &tail[j..];
            }
            (!marks.is_empty()).then_some((name, marks))
        })
        .collect()
}

/// `-y`: descriptors with their paths, the same as strace -y shows on the
/// same command (learned from the opens, dups and closes, and for those
/// the command had before, from /proc while it waits to exec).
#[test]
fn descriptors_with_their_paths() {
    let filter = "trace=openat,read,close,newfstatat,write,dup2,fcntl";
    // A file of the test's own: the VM guests have no /etc/hostname.
    let dir = temp("y-dir");
    std::fs::create_dir_all(&dir).unwrap();
    let dir = std::fs::canonicalize(&dir).unwrap();
    let file = dir.join("hostname");
    std::fs::write(&file, "vm\n").unwrap();
    let (d, f) = (dir.to_str().unwrap(), file.to_str().unwrap());
    let script = format!("exec 7<{f}; cat {f} <&7 >/dev/null; cd {d} && cat ./hostname");
    let command = ["sh", "-c", script.as_str()];
    let out = temp("y.txt");
    let mut args = vec![
        "strace",
        "-y",
        "-e",
        filter,
        "-o",
        out.to_str().unwrap(),
        "--",
    ];
    args.extend_from_slice(&command);
    let (code, _, stderr) = run(&args);
    assert_eq!(code, 0, "{stderr}");
    let mine = std::fs::read_to_string(&out).unwrap();
    let _ = std::fs::remove_file(&out);
    let ours = annotated(&mine);
    // The file read through its descriptors (busybox's cat, in the VM
    // guests, sends it with sendfile rather than read).
    assert!(
        ours.iter()
            .any(|(n, m)| m == &[f] && (n == "read" || in_guest())),
        "{mine}"
    );
    // The relative open, resolved against the working directory.
    assert!(
        mine.contains(&format!(
            "openat(AT_FDCWD<{d}>, \"./hostname\", O_RDONLY) = 3<{f}>"
        )),
        "{mine}"
    );
    if in_guest() {
        eprintln!("no strace in the VM guests: the host compares with it");
        return;
    }
    let theirs_file = temp("y-strace.txt");
    let mut cmd = Command::new("strace");
    cmd.args([
        "-f",
        "-y",
        "-e",
        filter,
        "-o",
        theirs_file.to_str().unwrap(),
    ])
    .args(command);
    let status = cmd.output().expect("strace").status;
    assert!(status.success());
    let theirs = std::fs::read_to_string(&theirs_file).unwrap();
    let _ = std::fs::remove_file(&theirs_file);
    // strace -f shows what the shell does before its exec of the first
    // command too: compare from the first line with a path.
    let theirs_marks = annotated(&theirs);
    let first = ours
        .iter()
        .zip(&theirs_marks)
        .position(|(a, b)| a != b)
        .unwrap_or(ours.len().min(theirs_marks.len()));
    assert_eq!(
        ours.len(),
        theirs_marks.len(),
        "first difference at {first}: rtrace {:?}, strace {:?}",
        ours.get(first..first + 3),
        theirs_marks.get(first..first + 3)
    );
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(
        ours,
        theirs_marks,
        "first difference at {first}: rtrace {:?}, strace {:?}",
        ours.get(first..first + 3),
        theirs_marks.get(first..first + 3)
    );
}

/// `-y` of a process whose first thread has ended (`pthread_exit` in
/// `main`, the fixture's `orphan` mode), traced with `-p` from then on:
/// the kernel shows the ended thread's descriptors and directory empty,
/// so they are read through a live thread's. Before, the descriptors it
/// had were unknown and its `write` to its stdout had no path.
#[test]
fn descriptors_of_a_process_whose_first_thread_ended() {
    use std::io::BufRead as _;
    use std::os::fd::AsRawFd as _;
    let mut child = Command::new(workload_bin("cfuncs"))
        .args(["orphan", "3"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    // The fixture's stdout is this pipe: its other end is ours.
    let pipe = std::fs::read_link(format!("/proc/self/fd/{}", out.get_ref().as_raw_fd()))
        .unwrap()
        .to_string_lossy()
        .into_owned();
    assert!(pipe.starts_with("pipe:["), "{pipe}");
    let pid = child.id();
    writeln!(child.stdin.as_mut().unwrap(), "go").unwrap();
    // Traced only once the first thread is a zombie.
    let zombie = || {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| Some(s.rsplit_once(')')?.1.trim_start().starts_with('Z')))
            .unwrap_or(false)
    };
    for _ in 0..400 {
        if zombie() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(zombie(), "the fixture's first thread did not end");
    let file = temp("orphan-y.txt");
    let pid_arg = pid.to_string();
    let rtrace = Rtrace::start_until(
        &[
            "strace",
            "-y",
            "-e",
            "trace=write",
            "-o",
            file.to_str().unwrap(),
            "-p",
            &pid_arg,
        ],
        "Tracing the syscalls",
    );
    line.clear();
    out.read_line(&mut line).unwrap();
    assert!(line.starts_with("done "), "{line:?}");
    assert!(child.wait().unwrap().success());
    std::thread::sleep(std::time::Duration::from_millis(300));
    let (code, _, stderr) = rtrace.stop(SIGINT);
    assert_eq!(code, 0, "{stderr}");
    let text = std::fs::read_to_string(&file).unwrap();
    let _ = std::fs::remove_file(&file);
    let want = format!("write(1<{pipe}>, \"done ");
    assert!(
        text.lines().any(|l| l.contains(&want)),
        "no {want:?} in:\n{text}"
    );
}

/// `-f` with `-p`: the children the process forks after tracing began are
/// traced from their fork; without `-f`, only the process.
#[test]
fn dash_f_follows_the_children_of_dash_p() {
    for follow in [true, false] {
        let mut sh = Command::new("sh")
            .args(["-c", "read x; /bin/echo followed-child; read y"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let pid = sh.id().to_string();
        let out = temp(&format!("follow-{follow}.txt"));
        let mut args = vec![
            "strace",
            "-e",
            "trace=execve,write",
            "-o",
            out.to_str().unwrap(),
            "-p",
            &pid,
        ];
        if follow {
            args.push("-f");
        }
        let rtrace = Rtrace::start(&args);
        let mut stdin = sh.stdin.take().unwrap();
        writeln!(stdin, "go").unwrap();
        // The child has run once the shell reads again.
        std::thread::sleep(std::time::Duration::from_millis(500));
        writeln!(stdin, "end").unwrap();
        drop(stdin);
        sh.wait().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(300));
        let (code, _, stderr) = rtrace.stop(SIGINT);
        assert_eq!(code, 0, "{stderr}");
        let text = std::fs::read_to_string(&out).unwrap();
        let _ = std::fs::remove_file(&out);
        let exec = text.contains(r#"execve("/bin/echo", ["/bin/echo", "followed-child"]"#);
        // strace's padding before the return taken out.
        let write = text
            .lines()
            .any(|l| l.contains("write(1, \"followed-child\\n\", 15)") && l.ends_with(" = 15"));
        assert_eq!((exec, write), (follow, follow), "-f {follow}: {text}");
    }
}

/// The frames of the first `-k` stack after the line starting with
/// `call`: (file, offset in it), as strace -k and rtrace show them.
fn stack_after(text: &str, call: &str) -> Vec<(String, String)> {
    text.lines()
        .skip_while(|l| {
            !l.trim_start_matches(|c: char| c.is_ascii_digit() || c == ' ')
                .starts_with(call)
        })
        .skip(1)
        .take_while(|l| l.starts_with(" > "))
        .map(|l| {
            let l = &l[3..];
            let file = l.split('(').next().unwrap_or("").to_owned();
            let at = l
                .rsplit('[')
                .next()
                .unwrap_or("")
                .trim_end_matches(']')
                .to_owned();
            (file, at)
        })
        .collect()
}

/// sysloop's rounds for `-k`: enough that it lives a while after its
/// opens (a process gone before its maps are read has its frames
/// unnamed).
const LIVES: &str = "300000";

/// `-k`: each call's user stack, walked in the kernel from the
/// programs' CFI (Debian's libc has no frame pointers): the same frames,
/// file by file and offset by offset, as strace -k finds for the same
/// call, a fixture's open of /dev/zero (a C fixture: the VM guests' own
/// programs are busybox's, static and without CFI).
#[test]
fn stack_traces_are_straces() {
    let out = temp("k.txt");
    let fixture = workload_bin("sysloop");
    let fixture = fixture.to_str().unwrap();
    let (code, _, stderr) = run(&[
        "strace",
        "-k",
        "-e",
        "trace=openat",
        "-o",
        out.to_str().unwrap(),
        "--",
        fixture,
        LIVES,
    ]);
    assert_eq!(code, 0, "{stderr}");
    let mine = std::fs::read_to_string(&out).unwrap();
    let _ = std::fs::remove_file(&out);
    let call = "openat(AT_FDCWD, \"/dev/zero\"";
    let ours = stack_after(&mine, call);
    // libc's open wrapper, the fixture's main, libc's start, _start.
    assert!(ours.len() >= 4, "{mine}");
    assert!(ours[0].0.contains("libc.so"), "{mine}");
    assert!(ours.last().unwrap().0.ends_with("/sysloop"), "{mine}");
    assert!(mine.contains("(main+0x"), "{mine}");
    if in_guest() {
        eprintln!("no strace in the VM guests: the host compares with it");
        return;
    }
    let theirs_file = temp("k-strace.txt");
    let status = Command::new("strace")
        // Stopped only at the opens: the loop's other calls are not.
        .args(["-f", "--seccomp-bpf", "-k", "-e", "trace=openat", "-o"])
        .arg(&theirs_file)
        .args([fixture, LIVES])
        .output()
        .expect("strace")
        .status;
    assert!(status.success());
    let theirs = std::fs::read_to_string(&theirs_file).unwrap();
    let _ = std::fs::remove_file(&theirs_file);
    assert_eq!(
        ours,
        stack_after(&theirs, call),
        "rtrace:\n{mine}\nstrace:\n{theirs}"
    );
}

/// A trace's lines by task, in the order the tasks first appear: each
/// line as printed, an unfinished call and its resumption joined into
/// one (where a call is cut depends on the scheduling of the moment).
fn by_task(text: &str) -> Vec<(u32, Vec<String>)> {
    let mut tasks: Vec<(u32, Vec<String>)> = Vec::new();
    let mut pending: BTreeMap<u32, String> = BTreeMap::new();
    for line in text.lines() {
        let digits = line.chars().take_while(char::is_ascii_digit).count();
        let Ok(pid) = line[..digits].parse::<u32>() else {
            continue;
        };
        let i = match tasks.iter().position(|(p, _)| *p == pid) {
            Some(i) => i,
            None => {
                tasks.push((pid, Vec::new()));
                tasks.len() - 1
            }
        };
        if let Some(head) = line.strip_suffix(" <unfinished ...>") {
            pending.insert(pid, head.trim_end().to_owned());
            continue;
        }
        let rest = line[digits..].trim_start();
        let joined = match rest.strip_prefix("<... ") {
            Some(r) => {
                let tail = r.split_once(" resumed>").map_or(r, |(_, t)| t);
                match pending.remove(&pid) {
                    Some(head) if head.ends_with(',') => format!("{head} {tail}"),
                    Some(head) => format!("{head}{tail}"),
                    None => line.to_owned(),
                }
            }
            None => line.to_owned(),
        };
        tasks[i].1.push(joined);
    }
    tasks
}

/// Calls whose arguments or returns differ from one run to the next
/// whoever traces them (random bytes, the clock, free memory and blocks,
/// a DNS query's id, the tracer that is the parent): their numbers and
/// strings are masked.
const VOLATILE: [&str; 8] = [
    "getrandom",
    "sysinfo",
    "statfs",
    "fstatfs",
    "sendto",
    "recvfrom",
    "getppid",
    "clock_gettime",
];

/// A line with what differs between runs masked: the pid prefix and
/// padding, addresses, the tasks' ids, the volatile calls' values.
fn masked(line: &str, pids: &[String]) -> String {
    let rest = line
        .trim_start_matches(|c: char| c.is_ascii_digit())
        .trim_start();
    let mut out = String::new();
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        if pids.contains(word) {
            out.push_str("PID");
        } else if word.starts_with("0x") {
            out.push_str("0xX");
        } else {
            out.push_str(word);
        }
        word.clear();
    };
    for c in rest.chars() {
        if c.is_ascii_alphanumeric() || c == '_' {
            word.push(c);
        } else {
            flush(&mut word, &mut out);
            out.push(c);
        }
    }
    flush(&mut word, &mut out);
    // The padding before the return.
    let mut text = out;
    if let Some((call, ret)) = split_padded(&text) {
        text = format!("{} = {ret}", call.trim_end());
    }
    let name = text.split('(').next().unwrap_or("");
    if VOLATILE.contains(&name) {
        text = strings(&text)
            .iter()
            .fold(text.clone(), |t, s| t.replace(s.as_str(), "\"S\""));
        let mut digits = false;
        text = text
            .chars()
            .filter_map(|c| {
                let was = std::mem::replace(&mut digits, c.is_ascii_digit());
                match (c.is_ascii_digit(), was) {
                    (true, true) => None,
                    (true, false) => Some('N'),
                    _ => Some(c),
                }
            })
            .collect();
    }
    // A child's CPU times, which vary from run to run.
    if text.starts_with("--- SIGCHLD")
        && let Some((head, _)) = text.split_once(", si_utime=")
    {
        text = format!("{head}}} ---");
    }
    text
}

/// A line split before the ` = ` of its return: (the call with its
/// padding, the return).
fn split_padded(line: &str) -> Option<(&str, &str)> {
    let mut at = line.len();
    while let Some(i) = line[..at].rfind(')') {
        let after = &line[i + 1..];
        let pad = after.len() - after.trim_start_matches(' ').len();
        if pad > 0 && after[pad..].starts_with("= ") {
            return Some((&line[..i + 1 + pad], &after[pad + 2..]));
        }
        at = i;
    }
    None
}

/// The pairs of `a`'s and `b`'s indices on a longest common subsequence.
fn lcs(a: &[String], b: &[String]) -> Vec<(usize, usize)> {
    let (n, m) = (a.len(), b.len());
    let mut t = vec![0u32; (n + 1) * (m + 1)];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            t[i * (m + 1) + j] = if a[i] == b[j] {
                t[(i + 1) * (m + 1) + j + 1] + 1
            } else {
                t[(i + 1) * (m + 1) + j].max(t[i * (m + 1) + j + 1])
            };
        }
    }
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while i < n && j < m {
        if a[i] == b[j] {
            out.push((i, j));
            i += 1;
            j += 1;
        } else if t[(i + 1) * (m + 1) + j] >= t[i * (m + 1) + j + 1] {
            i += 1;
        } else {
            j += 1;
        }
    }
    out
}

/// Whether a line is laid out as strace -f -o lays it out: the task's id
/// left-aligned in 5 columns and a space; the return's `= ` in column 40,
/// or one space after a call longer than that.
fn laid_out_as_strace(line: &str) -> bool {
    let digits = line.chars().take_while(char::is_ascii_digit).count();
    let prefix = digits.max(5) + 1;
    if digits == 0 || line.len() < prefix || line[digits..prefix].trim() != "" {
        return false;
    }
    if line[prefix..].starts_with(' ') {
        return false;
    }
    match split_padded(line) {
        Some((call, _)) => {
            let head = call.trim_end().len();
            call.len() == (head + 1).max(40)
        }
        // Signals, exits, unfinished calls.
        None => true,
    }
}

/// Everyday commands (coreutils, a shell's pipeline, python, tar,
/// getent), one after the other in a shell, under Debian's strace -f -qq
/// -o and under rtrace strace -f -qq -o, each its own run: each task's
/// lines, paired by the order the tasks appear, are the same lines once
/// what differs between any two runs is masked (addresses, pids,
/// random bytes and clocks), 95 % of them at least; and unmasked, each
/// line of both is laid out alike (the pid prefix, the column of `=`).
#[test]
fn everyday_commands_read_as_straces() {
    if in_guest() {
        eprintln!("strace not compared: the VM guests have no strace (the host compares)");
        return;
    }
    let dir = temp("everyday");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("tree/sub")).unwrap();
    std::fs::write(dir.join("tree/a.txt"), "hello\n").unwrap();
    std::fs::write(dir.join("tree/sub/b.txt"), "b\na\nc\n").unwrap();
    let python3 = "/usr/bin/python3";
    let python = if std::path::Path::new(python3).exists() {
        format!("{python3} -c 'print(1)';")
    } else {
        String::new()
    };
    let script = format!(
        "cd {}; ls -la tree; cat tree/a.txt; sort tree/sub/b.txt; \
         cp -r tree tree2; find tree; echo a | wc -c; {python} tar -cf t.tar tree; \
         getent hosts localhost; true",
        dir.display()
    );
    let theirs_file = dir.join("strace.txt");
    let ours_file = dir.join("rtrace.txt");
    // Each run starts from the same tree.
    let clean = || {
        let _ = std::fs::remove_dir_all(dir.join("tree2"));
        let _ = std::fs::remove_file(dir.join("t.tar"));
    };
    let out = Command::new("strace")
        .args(["-f", "-qq", "-o"])
        .arg(&theirs_file)
        .args(["sh", "-c", &script])
        .output()
        .expect("strace (cargo xtask setup installs it)");
    assert!(out.status.success());
    clean();
    let (code, _, stderr) = run(&[
        "strace",
        "-f",
        "-qq",
        "-o",
        ours_file.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        &script,
    ]);
    assert_eq!(code, 0, "{stderr}");
    let theirs = std::fs::read_to_string(&theirs_file).unwrap();
    let ours = std::fs::read_to_string(&ours_file).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let (a, b) = (by_task(&theirs), by_task(&ours));
    let pids = |t: &[(u32, Vec<String>)]| -> Vec<String> {
        t.iter().map(|(p, _)| p.to_string()).collect()
    };
    let (pa, pb) = (pids(&a), pids(&b));
    let mut same = 0;
    let mut total = 0;
    let mut report = String::new();
    let mb_all: Vec<Vec<String>> = b
        .iter()
        .map(|(_, l)| l.iter().map(|x| masked(x, &pb)).collect())
        .collect();
    let mut paired = vec![false; b.len()];
    for (i, (_, lines_a)) in a.iter().enumerate() {
        let ma: Vec<String> = lines_a.iter().map(|l| masked(l, &pa)).collect();
        // Tasks pair by the order they appear, but for those that start
        // at the same moment (a pipeline's two children): the likeliest
        // of the few unpaired ones near.
        let best = (i.saturating_sub(2)..(i + 3).min(b.len()))
            .filter(|&j| !paired[j])
            .map(|j| (lcs(&ma, &mb_all[j]), j))
            .max_by_key(|(p, j)| (p.len(), usize::MAX - j));
        let (pairs, mb) = match best {
            Some((p, j)) => {
                paired[j] = true;
                (p, mb_all[j].clone())
            }
            None => (Vec::new(), Vec::new()),
        };
        same += pairs.len();
        total += ma.len().max(mb.len());
        let name = lines_a
            .iter()
            .find_map(|l| {
                l.split_once("execve(")
                    .map(|(_, r)| r.split(',').next().unwrap_or(""))
            })
            .unwrap_or("(a fork)");
        let _ = writeln!(
            report,
            "task {i} {name}: {}/{} lines alike",
            pairs.len(),
            ma.len().max(mb.len())
        );
        let (mut x, mut y) = (0, 0);
        for &(pi, pj) in pairs.iter().chain([(ma.len(), mb.len())].iter()) {
            for l in &ma[x..pi] {
                let _ = writeln!(report, "  strace: {l}");
            }
            for l in &mb[y..pj.min(mb.len())] {
                let _ = writeln!(report, "  rtrace: {l}");
            }
            x = pi + 1;
            y = pj + 1;
        }
    }
    // Unmasked, every line of both is laid out by strace's rule.
    let layout_bad: Vec<String> = [("strace", &theirs), ("rtrace", &ours)]
        .iter()
        .flat_map(|(who, text)| {
            text.lines()
                .filter(|l| !laid_out_as_strace(l))
                .map(move |l| format!("{who}: {l}"))
        })
        .collect();
    let share = same as f64 / total.max(1) as f64;
    eprintln!(
        "{same}/{total} lines alike ({:.1} %)\n{report}",
        share * 100.0
    );
    assert!(a.len() >= 10, "the tasks of the commands:\n{theirs}");
    assert!(
        share >= 0.95,
        "{same}/{total} lines alike ({:.1} %):\n{report}",
        share * 100.0
    );
    assert!(
        layout_bad.is_empty(),
        "lines not laid out as strace's:\n{}",
        layout_bad.join("\n")
    );
}

//! The command lines bcc documents for the tools rtrace shares with it
//! (`tests/data/bcc_commands.txt`), run as a user pasting them would:
//! each must run and exit 0 when interrupted, or be refused as its line's
//! note says (a kernel feature it lacks, named). On the host every line
//! runs; in the VM matrix the lines that need kprobes, which the host
//! kernel lacks and the guests have.

use std::{
    io::{BufRead as _, BufReader},
    process::{Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use rtrace_integration_tests::{LoopDevice, PinnedMaps, in_guest, mechanism_works, rtrace_bin};

/// What a line must do.
#[derive(Debug, Clone, PartialEq)]
enum Expect {
    Run,
    NeedsKprobes,
    Refused(String),
    /// Needs kprobes, and where there are some, is refused with this.
    NeedsKprobesThenRefused(String),
}

/// The list's lines: the command and what it must do.
fn lines() -> Vec<(String, Expect)> {
    let text = include_str!("../data/bcc_commands.txt");
    text.lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| match l.split_once("  ## ") {
            Some((cmd, "needs kprobes")) => (cmd.to_owned(), Expect::NeedsKprobes),
            Some((cmd, note)) if note.starts_with("needs kprobes, refused: ") => (
                cmd.to_owned(),
                Expect::NeedsKprobesThenRefused(
                    note["needs kprobes, refused: ".len()..].to_owned(),
                ),
            ),
            Some((cmd, note)) => {
                let why = note
                    .strip_prefix("refused: ")
                    .unwrap_or_else(|| panic!("unknown note {note:?}"));
                (cmd.to_owned(), Expect::Refused(why.to_owned()))
            }
            None => (l.to_owned(), Expect::Run),
        })
        .collect()
}

/// Splits a command line as a shell would for these lines: words, with
/// single and double quotes.
fn words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    for c in line.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                in_word = true;
            }
            (None, c) if c.is_whitespace() => {
                if in_word {
                    out.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            (None, c) => {
                word.push(c);
                in_word = true;
            }
        }
    }
    assert!(quote.is_none(), "unbalanced quotes in {line:?}");
    if in_word {
        out.push(word);
    }
    out
}

/// Runs `rtrace ARGS`: once it says it traces (or exits), it is
/// interrupted, as a user would with Ctrl-C; returns its exit code and
/// stderr. A line's duration (`profile 5`) is not waited for: its tool's
/// own tests check that a run ends by itself.
fn run_interrupted(args: &[String]) -> (i32, String) {
    let mut child = Command::new(rtrace_bin())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line.clone());
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match rx.recv_timeout(Duration::from_millis(50)) {
            // profile's header with a duration (`profile 5`) says
            // "Sampling ... for 5 secs." and no Ctrl-C: it traces then too,
            // and waiting for its end took most of the test's time.
            Ok(line)
                if line.contains("Ctrl-C")
                    || line.contains("Tracing")
                    || line.starts_with("Sampling ") =>
            {
                break;
            }
            Ok(_) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) if Instant::now() > deadline => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: kill with a valid pid and signal number.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let status = child.wait().unwrap();
    let stderr = reader.join().unwrap();
    (status.code().unwrap_or(-1), stderr)
}

// One test a tool, so that each tool's lines report, and are timed, apart.

#[test]
fn argdist() {
    documented_lines_run_or_name_what_they_need("argdist");
}

#[test]
fn biolatency() {
    documented_lines_run_or_name_what_they_need("biolatency");
}

#[test]
fn execsnoop() {
    documented_lines_run_or_name_what_they_need("execsnoop");
}

#[test]
fn ext4slower() {
    documented_lines_run_or_name_what_they_need("ext4slower");
}

#[test]
fn gethostlatency() {
    documented_lines_run_or_name_what_they_need("gethostlatency");
}

#[test]
fn profile() {
    documented_lines_run_or_name_what_they_need("profile");
}

#[test]
fn runqlat() {
    documented_lines_run_or_name_what_they_need("runqlat");
}

#[test]
fn tcplife() {
    documented_lines_run_or_name_what_they_need("tcplife");
}

#[test]
fn every_line_is_of_a_tool_with_a_test() {
    let tested = [
        "argdist",
        "biolatency",
        "execsnoop",
        "ext4slower",
        "gethostlatency",
        "profile",
        "runqlat",
        "tcplife",
    ];
    for (line, _) in lines() {
        let tool = line.split_whitespace().next().unwrap();
        assert!(
            tested.contains(&tool),
            "no test runs the lines of {tool}: {line}"
        );
    }
}

/// The lines of `tool` in the list run as a user pasting them would, or
/// name what they need.
fn documented_lines_run_or_name_what_they_need(tool: &str) {
    let kprobes = mechanism_works("kprobe");
    let guest = in_guest();
    // The placeholders' stand-ins.
    let mut sleepers: Vec<std::process::Child> = (0..2)
        .map(|_| Command::new("sleep").arg("600").spawn().unwrap())
        .collect();
    let pid = sleepers[0].id().to_string();
    let pids = format!("{},{}", sleepers[0].id(), sleepers[1].id());
    let mut maps = PinnedMaps::new("bcc-commands");
    let (map, _) = maps.hash("set");
    let mut _loop = None;
    let disk = std::fs::read_dir("/sys/block")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .find(|d| !["loop", "ram", "zram"].iter().any(|p| d.starts_with(p)))
        .unwrap_or_else(|| {
            let dev = LoopDevice::new("bcc-commands");
            let name = dev.name.clone();
            _loop = Some(dev);
            name
        });

    // The guests run what the host cannot: the lines that need kprobes.
    let todo: Vec<(String, Expect)> = lines()
        .into_iter()
        .filter(|(line, _)| line.split_whitespace().next() == Some(tool))
        .filter(|(_, e)| {
            !guest || matches!(e, Expect::NeedsKprobes | Expect::NeedsKprobesThenRefused(_))
        })
        .map(|(line, e)| {
            let line = line
                .replace("{pids}", &pids)
                .replace("{pid}", &pid)
                .replace("{map}", &map)
                .replace("{disk}", &disk)
                .replace("{user}", "root");
            (line, e)
        })
        .collect();
    let ran = todo.len();
    // A few at a time: each waits for its tracer to start.
    let failures: Vec<String> = std::thread::scope(|scope| {
        let workers: Vec<_> = todo
            .chunks(todo.len().div_ceil(4).max(1))
            .map(|chunk| {
                scope.spawn(move || {
                    let mut failed = Vec::new();
                    for (line, expect) in chunk {
                        let (code, stderr) = run_interrupted(&words(line));
                        let last = stderr.lines().last().unwrap_or("");
                        let ok = match (expect, kprobes) {
                            (Expect::Run, _) | (Expect::NeedsKprobes, true) => code == 0,
                            (Expect::NeedsKprobes | Expect::NeedsKprobesThenRefused(_), false) => {
                                code != 0 && stderr.lines().count() <= 2 && last.contains("kprobes")
                            }
                            (Expect::Refused(why), _)
                            | (Expect::NeedsKprobesThenRefused(why), true) => {
                                code != 0
                                    && stderr.trim().lines().count() == 1
                                    && stderr.contains(why.as_str())
                            }
                        };
                        if !ok {
                            failed.push(format!(
                                "rtrace {line}\n    ({expect:?}) exit {code}: {}",
                                stderr.trim()
                            ));
                        }
                    }
                    failed
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect()
    });
    for s in &mut sleepers {
        let _ = s.kill();
        let _ = s.wait();
    }
    drop(maps);
    assert!(ran > 0, "no line of {tool} in the list ran here");
    assert!(
        failures.is_empty(),
        "{} of {ran} documented command lines failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

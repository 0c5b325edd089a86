//! `rtrace top`'s snapshots (`-b`, `--once`, `--json`) against a fixture
//! whose two hot functions split its CPU time about three to one, by its
//! own measure: the hot functions have their rows, with the fixture's
//! split.

use rtrace_integration_tests::{Rtrace, SIGINT, Workload, assert_one_line_error, json_lines};

/// Runs `hotfuncs cpu 3` under `rtrace top ARGS -p PID`, stopped after the
/// work; returns rtrace's stdout and the fixture's CPU nanoseconds in
/// `hot_alpha` and `hot_beta`.
fn top_of_hotfuncs(args: &[&str]) -> (String, f64, f64) {
    let (mut work, ready) = Workload::start("hotfuncs", &["cpu".into(), "3".into()]);
    assert_eq!(ready.trim(), "ready");
    let pid = work.pid().to_string();
    let mut full = vec!["top", "-p", &pid, "-F", "499"];
    full.extend_from_slice(args);
    let rtrace = Rtrace::start_until(&full, "Sampling");
    let done = work.go();
    work.wait();
    let (code, stdout, stderr) = rtrace.stop(SIGINT);
    assert_eq!(code, 0, "{stderr}");
    let ns: Vec<f64> = done
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    (stdout, ns[0], ns[1])
}

/// About 1,500 samples: a split's binomial spread is about a point, and
/// the 10 points fail only on a real error.
const TOLERANCE: f64 = 10.0;

#[test]
fn json_snapshots_name_the_hot_functions_in_their_split() {
    let (stdout, alpha, beta) = top_of_hotfuncs(&["-b", "--json", "-d", "1"]);
    let snaps = json_lines(&stdout);
    let last = snaps
        .last()
        .unwrap_or_else(|| panic!("no snapshot: {stdout}"));
    assert_eq!(last["tool"], "top");
    let share = |name: &str| -> f64 {
        last["rows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["symbol"].as_str().unwrap().ends_with(name))
            .unwrap_or_else(|| panic!("no row of {name}: {last}"))["total_percent"]
            .as_f64()
            .unwrap()
    };
    let (a, b) = (share("hot_alpha"), share("hot_beta"));
    // The two functions' split of what they both took, against the
    // fixture's own CPU times.
    let want = alpha / (alpha + beta) * 100.0;
    let got = a / (a + b) * 100.0;
    assert!(
        (got - want).abs() <= TOLERANCE,
        "hot_alpha {got:.1}% of the two, the fixture measured {want:.1}%: {last}"
    );
    for r in last["rows"].as_array().unwrap() {
        assert_eq!(r["comm"], "hotfuncs", "{r}");
        let (s, t) = (
            r["self_percent"].as_f64().unwrap(),
            r["total_percent"].as_f64().unwrap(),
        );
        assert!(s <= t + 1e-6 && t <= 100.0 + 1e-6, "{r}");
    }
}

#[test]
fn text_snapshots_parse() {
    let (stdout, _, _) = top_of_hotfuncs(&["-b", "-d", "1", "--rows", "8"]);
    let snapshot = stdout
        .split("rtrace top: ")
        .filter(|s| !s.trim().is_empty())
        .last()
        .unwrap_or_else(|| panic!("no snapshot: {stdout}"));
    let mut lines = snapshot.lines().skip(1);
    let head: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(
        head,
        [
            "SELF", "CHILDREN", "COMM", "PID", "SHARED", "OBJECT", "SYMBOL"
        ]
    );
    let rows: Vec<Vec<&str>> = lines
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert!(rows.len() <= 8, "{snapshot}");
    let names: Vec<&str> = rows.iter().map(|r| *r.last().unwrap()).collect();
    assert!(
        names.contains(&"hotfuncs::hot_alpha") && names.contains(&"hotfuncs::hot_beta"),
        "{snapshot}"
    );
    for r in &rows {
        for pct in &r[..2] {
            let v: f64 = pct.trim_end_matches('%').parse().unwrap();
            assert!((0.0..=100.0).contains(&v), "{snapshot}");
        }
    }
    // Rows go by self share, highest first.
    let selfs: Vec<f64> = rows
        .iter()
        .map(|r| r[0].trim_end_matches('%').parse().unwrap())
        .collect();
    assert!(selfs.windows(2).all(|w| w[0] >= w[1]), "{snapshot}");
}

/// `--once` prints one snapshot after -d seconds and exits by itself.
#[test]
fn once_prints_one_snapshot_and_exits() {
    let (code, stdout, stderr) = rtrace_integration_tests::run(&["top", "--once", "-d", "1"]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stdout.matches("rtrace top: ").count(), 1, "{stdout}");
}

#[test]
fn bad_input_is_one_clear_line() {
    assert_one_line_error(&["top", "-p", "999999999"], "999999999");
    let (code, _, stderr) = rtrace_integration_tests::run(&["top", "-d", "0"]);
    assert_eq!(code, 2, "{stderr}");
    let (code, _, stderr) = rtrace_integration_tests::run(&["top", "--decay", "1.5"]);
    assert_eq!(code, 2, "{stderr}");
}

/// A tmux session running a command in a real terminal, killed on drop.
struct Tmux {
    name: String,
}

impl Tmux {
    fn start(command: &str) -> Self {
        let name = format!("rtrace-top-{}", std::process::id());
        let status = std::process::Command::new("tmux")
            .args([
                "new-session",
                "-d",
                "-s",
                &name,
                "-x",
                "200",
                "-y",
                "50",
                command,
            ])
            .status()
            .expect("tmux (cargo xtask installs it)");
        assert!(status.success());
        Self { name }
    }

    fn screen(&self) -> String {
        let out = std::process::Command::new("tmux")
            .args(["capture-pane", "-p", "-t", &self.name])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn keys(&self, keys: &[&str]) {
        for k in keys {
            let status = std::process::Command::new("tmux")
                .args(["send-keys", "-t", &self.name, k])
                .status()
                .unwrap();
            assert!(status.success());
            // One key at a time: an Escape followed at once by a letter
            // reads as Alt and the letter.
            std::thread::sleep(std::time::Duration::from_millis(300));
        }
    }

    /// Waits until the screen holds `text`; the screen then.
    fn wait_for(&self, text: &str) -> String {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let s = self.screen();
            if s.contains(text) {
                return s;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no {text:?} on the screen:\n{s}"
            );
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }

    fn alternate_screen(&self) -> bool {
        let out = std::process::Command::new("tmux")
            .args(["display", "-p", "-t", &self.name, "#{alternate_on}"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim() == "1"
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = std::process::Command::new("tmux")
            .args(["kill-session", "-t", &self.name])
            .status();
    }
}

/// The self share of each row of the view whose symbol ends as `name`.
fn self_share(screen: &str, name: &str) -> Option<f64> {
    screen.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.last()? == &name).then(|| f[0].trim_end_matches('%').parse().ok())?
    })
}

/// The live view in a real terminal (tmux): a process started after the
/// view appears with named frames, in the split its own CPU times have;
/// the keys sort, filter, show a function's callers, and `q` gives the
/// terminal back as it was.
#[test]
fn the_live_view_in_a_real_terminal() {
    if rtrace_integration_tests::in_guest() {
        eprintln!("no tmux in the VM guests: the host runs the terminal test");
        return;
    }
    let bin = rtrace_integration_tests::rtrace_bin();
    // After the view quits, the terminal's settings, then a pause.
    let tmux = Tmux::start(&format!(
        "{} top -F 299; echo QUIT; stty -a; sleep 60",
        bin.display()
    ));
    tmux.wait_for("rtrace top:");
    let (mut work, ready) = Workload::start("hotfuncs", &["cpu".into(), "3".into()]);
    assert_eq!(ready.trim(), "ready");
    let done = work.go();
    work.wait();
    let ns: Vec<f64> = done
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    // Only the fixture's functions: other work on the machine does not
    // move them.
    tmux.keys(&["/", "hotfuncs::hot", "Enter"]);
    let screen = tmux.wait_for("filter: hotfuncs::hot");
    let (a, b) = (
        self_share(&screen, "hotfuncs::hot_alpha").unwrap_or_else(|| panic!("{screen}")),
        self_share(&screen, "hotfuncs::hot_beta").unwrap_or_else(|| panic!("{screen}")),
    );
    let want = ns[0] / (ns[0] + ns[1]) * 100.0;
    let got = a / (a + b) * 100.0;
    assert!(
        (got - want).abs() <= TOLERANCE,
        "hot_alpha {got:.1}% of the two on the screen, the fixture measured {want:.1}%:\n{screen}"
    );
    // A filter that hides it.
    tmux.keys(&["/", "hot_beta", "Enter"]);
    let screen = tmux.wait_for("filter: hot_beta");
    assert!(!screen.contains("hotfuncs::hot_alpha"), "{screen}");
    assert!(screen.contains("hotfuncs::hot_beta"), "{screen}");
    // Enter on it: its caller.
    tmux.keys(&["Enter"]);
    let screen = tmux.wait_for("Callers:");
    let callers = screen.split("Callers:").nth(1).unwrap();
    let callers = callers.split("Callees:").next().unwrap();
    assert!(callers.contains("hotfuncs::work_caller"), "{screen}");
    // `a` on it: its instructions, the samples' shares beside them.
    tmux.keys(&["Escape", "a"]);
    let screen = tmux.wait_for("Disassembly of");
    assert!(screen.contains("hotfuncs::hot_beta():"), "{screen}");
    let shares: f64 = screen
        .lines()
        .filter_map(|l| l.split(" :").next()?.trim().parse::<f64>().ok())
        .sum();
    assert!(
        (99.0..=101.0).contains(&shares),
        "shares sum to {shares}:\n{screen}"
    );
    tmux.keys(&["Escape", "Escape", "t"]);
    let screen = tmux.wait_for("sort: children");
    assert!(!screen.contains("filter:"), "{screen}");
    tmux.keys(&["q"]);
    let screen = tmux.wait_for("QUIT");
    assert!(!tmux.alternate_screen(), "{screen}");
    let stty = screen.split("QUIT").nth(1).unwrap();
    let settings: Vec<&str> = stty.split_whitespace().collect();
    for on in ["echo", "icanon", "isig"] {
        assert!(
            settings.contains(&on),
            "{on} is off after the view:\n{screen}"
        );
    }
}

/// A process started after the view appears with named frames, and once
/// it exits its rows leave as their samples decay (faster here than
/// perf top's 7/8 a refresh, so that the test is short).
#[test]
fn a_process_comes_and_goes() {
    let rtrace = Rtrace::start_until(
        &[
            "top", "-b", "--json", "-d", "0.5", "--decay", "0.3", "-F", "199",
        ],
        "Sampling",
    );
    let (mut work, ready) = Workload::start("hotfuncs", &["cpu".into(), "1".into()]);
    assert_eq!(ready.trim(), "ready");
    let pid = u64::from(work.pid());
    work.go();
    work.wait();
    // 0.3 a refresh: a few hundred samples are under 0.01 in a few
    // seconds.
    std::thread::sleep(std::time::Duration::from_secs(6));
    let (code, stdout, stderr) = rtrace.stop(SIGINT);
    assert_eq!(code, 0, "{stderr}");
    let snaps = json_lines(&stdout);
    let of_fixture = |s: &serde_json::Value| -> Vec<String> {
        s["rows"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["pid"].as_u64() == Some(pid))
            .map(|r| r["symbol"].as_str().unwrap().to_owned())
            .collect()
    };
    assert!(
        snaps
            .iter()
            .any(|s| of_fixture(s).iter().any(|n| n == "hotfuncs::hot_alpha")),
        "the fixture never showed with named frames: {stdout}"
    );
    let last = snaps.last().unwrap();
    assert!(
        of_fixture(last).is_empty(),
        "still shown after it exited: {last}"
    );
}

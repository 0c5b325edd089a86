//! `rtrace gethostlatency` against real lookups by getent and Python.
//!
//! Not run in the VM matrix: uprobes work on the host, and the guests have
//! no resolver configuration, NSS modules or Python to look anything up.

use std::{
    io::{BufRead as _, BufReader, Write as _},
    process::{Command, Stdio},
};

use rtrace_integration_tests::{Rtrace, SIGINT, assert_one_line_error, json_lines, run};

/// A Python that prints its pid, waits for a line on stdin, then resolves
/// `localhost` with getaddrinfo.
struct PyLookup {
    child: std::process::Child,
    pid: u32,
}

impl PyLookup {
    fn start() -> Self {
        Self::with("socket.getaddrinfo('localhost', 80)")
    }

    /// A Python that runs `lookups` (with `socket` and `ctypes` imported)
    /// once it is told to.
    fn with(lookups: &str) -> Self {
        let script = format!(
            "import ctypes, os, sys, socket\n\
             print(os.getpid(), flush=True)\n\
             sys.stdin.readline()\n\
             {lookups}\n\
             print('done', flush=True)"
        );
        let mut child = Command::new("python3")
            .args(["-c", &script])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("cannot run python3");
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        // pyenv's shim execs the real interpreter: the pid it prints is the
        // one that makes the call.
        let pid = line.trim().parse().unwrap();
        Self { child, pid }
    }

    fn lookup(mut self) {
        writeln!(self.child.stdin.as_mut().unwrap(), "go").unwrap();
        let out = self.child.wait_with_output().unwrap();
        assert!(out.status.success());
        assert!(String::from_utf8_lossy(&out.stdout).contains("done"));
    }
}

/// Runs `getent hosts localhost`; returns its pid.
fn getent() -> u32 {
    let child = Command::new("getent")
        .args(["hosts", "localhost"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("cannot run getent");
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "getent found no localhost");
    pid
}

/// The JSON lookups of process `pid`.
fn of_pid(stdout: &str, pid: u32) -> Vec<serde_json::Value> {
    json_lines(stdout)
        .into_iter()
        .filter(|e| e["pid"] == pid)
        .collect()
}

fn plausible(e: &serde_json::Value) {
    let ns = e["latency_ns"].as_u64().unwrap();
    assert!(ns > 0 && ns < 5_000_000_000, "{e}");
    assert!((e["latency_ms"].as_f64().unwrap() - ns as f64 / 1e6).abs() < 1e-9);
}

#[test]
fn getent_and_python_lookups_are_caught() {
    let py = PyLookup::start();
    let py_pid = py.pid;
    let rtrace = Rtrace::start(&["gethostlatency", "--json"]);
    let getent_pid = getent();
    py.lookup();
    let (code, stdout, stderr) = rtrace.stop(SIGINT);
    assert_eq!(code, 0, "{stderr}");
    let g = of_pid(&stdout, getent_pid);
    assert!(!g.is_empty(), "no getent lookup: {stdout}");
    for e in &g {
        assert_eq!(e["comm"], "getent");
        assert_eq!(e["host"], "localhost");
        plausible(e);
    }
    let p = of_pid(&stdout, py_pid);
    assert_eq!(p.len(), 1, "one getaddrinfo by Python: {stdout}");
    assert_eq!(p[0]["function"], "getaddrinfo");
    assert_eq!(p[0]["host"], "localhost");
    plausible(&p[0]);
}

/// gethostbyname_r (Python's gethostbyname_ex), gethostbyname through
/// ctypes (which glibc makes of gethostbyname_r's code: one lookup, not
/// two) and gethostbyaddr, its address shown as text.
#[test]
fn reentrant_nested_and_by_address_lookups() {
    let py = PyLookup::with(
        "libc = ctypes.CDLL(None)\n\
         socket.gethostbyname_ex('localhost')\n\
         libc.gethostbyname(b'localhost')\n\
         libc.gethostbyaddr(socket.inet_aton('127.0.0.1'), 4, socket.AF_INET)",
    );
    let pid = py.pid;
    let rtrace = Rtrace::start(&["gethostlatency", "--json", "-p", &pid.to_string()]);
    py.lookup();
    let (code, stdout, stderr) = rtrace.stop(SIGINT);
    assert_eq!(code, 0, "{stderr}");
    let seen: Vec<(String, String)> = of_pid(&stdout, pid)
        .iter()
        .map(|e| {
            plausible(e);
            (
                e["function"].as_str().unwrap().to_owned(),
                e["host"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    // Python's gethostbyname_ex checks the name with getaddrinfo first.
    let want: Vec<(String, String)> = [
        ("getaddrinfo", "localhost"),
        ("gethostbyname_r", "localhost"),
        ("gethostbyname", "localhost"),
        ("gethostbyaddr", "127.0.0.1"),
    ]
    .iter()
    .map(|(f, h)| (f.to_string(), h.to_string()))
    .collect();
    assert_eq!(seen, want, "{stdout}");
}

/// With -p, the process's own libc is traced, and only its calls shown.
#[test]
fn pid_filter_keeps_one_process() {
    let py = PyLookup::start();
    let pid = py.pid.to_string();
    let rtrace = Rtrace::start(&["gethostlatency", "-v", "-p", &pid]);
    let other = getent();
    py.lookup();
    let (code, stdout, stderr) = rtrace.stop(SIGINT);
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains(&format!("/proc/{pid}/root/")), "{stderr}");
    let mut lines = stdout.lines();
    let header = lines.next().unwrap();
    assert!(header.starts_with("TIME     PID     COMM"), "{header}");
    assert!(header.ends_with("LATms HOST"), "{header}");
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(rows.len(), 1, "{stdout}");
    assert_eq!(rows[0][1], pid);
    assert_eq!(rows[0][4], "localhost");
    let ms: f64 = rows[0][3].parse().unwrap();
    assert!(ms > 0.0 && ms < 5000.0, "{stdout}");
    assert!(!stdout.contains(&format!(" {other} ")), "{stdout}");
}

/// `-l` takes the library's path; lookups are caught with their start kept
/// in task storage and, with `--no-task-storage`, in the hash.
#[test]
fn explicit_libc_path() {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let libc = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.rsplit('/').next().unwrap().starts_with("libc.so"))
        .expect("this test links libc")
        .to_owned();
    for (store, extra) in [
        ("task storage", None),
        ("a hash by thread id", Some("--no-task-storage")),
    ] {
        let mut args = vec!["gethostlatency", "-v", "--json", "-l", &libc];
        args.extend(extra);
        let rtrace = Rtrace::start(&args);
        let pid = getent();
        let (code, stdout, stderr) = rtrace.stop(SIGINT);
        assert_eq!(code, 0, "{stderr}");
        assert!(
            stderr.contains(&format!("lookups in flight in {store}")),
            "{stderr}"
        );
        let seen = of_pid(&stdout, pid);
        assert!(!seen.is_empty(), "{store}: {stdout}");
        seen.iter().for_each(plausible);
    }
}

#[test]
fn bad_input_gets_one_line_and_nonzero_exit() {
    assert_one_line_error(&["gethostlatency", "-p", "999999999"], "no such process");
    assert_one_line_error(
        &["gethostlatency", "-l", "/no/such/libc.so.6"],
        "no such file: /no/such/libc.so.6",
    );
    let (code, _, stderr) = run(&["gethostlatency", "--bogus"]);
    assert_eq!(code, 2, "{stderr}");
}

//! `rtrace exporter` scraped over real HTTP while real workloads run: the
//! counts against what the workloads did, Prometheus itself reading it,
//! least privilege, endurance, and faults.

use std::{
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::TcpStream,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use rtrace_integration_tests::{
    LoopDevice, Paranoid, Rtrace, SIGHUP, SIGTERM, TestCgroup, as_nobody, assert_one_line_error,
    in_cgroup, in_guest, json_lines, run, run_workload, unprivileged_copy, workload_bin,
};

#[path = "exporter/otlp.rs"]
mod otlp;

/// A port nothing listens on now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts the exporter on a free port with `extra` arguments.
fn exporter(extra: &[&str]) -> (Rtrace, u16) {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut args = vec!["exporter", "--listen", &listen];
    args.extend_from_slice(extra);
    (Rtrace::start_until(&args, "Serving metrics"), port)
}

/// One HTTP/1.1 connection, kept open across requests.
struct Client {
    reader: BufReader<TcpStream>,
}

/// A response: status, headers (lower-case names) and body.
struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Response {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

impl Client {
    fn connect(port: u16) -> Self {
        let stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        Self {
            reader: BufReader::new(stream),
        }
    }

    fn get(&mut self, path: &str, accept: Option<&str>) -> Response {
        let accept = accept.map_or(String::new(), |a| format!("Accept: {a}\r\n"));
        write!(
            self.reader.get_mut(),
            "GET {path} HTTP/1.1\r\nHost: localhost\r\n{accept}\r\n"
        )
        .unwrap();
        let mut line = String::new();
        self.reader.read_line(&mut line).unwrap();
        let status = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("bad status line {line:?}"));
        let mut headers = Vec::new();
        loop {
            line.clear();
            self.reader.read_line(&mut line).unwrap();
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            let (n, v) = l.split_once(':').unwrap();
            headers.push((n.to_ascii_lowercase(), v.trim().to_owned()));
        }
        let len: usize = headers
            .iter()
            .find(|(n, _)| n == "content-length")
            .map(|(_, v)| v.parse().unwrap())
            .expect("a Content-Length");
        let mut body = vec![0; len];
        self.reader.read_exact(&mut body).unwrap();
        Response {
            status,
            headers,
            body: String::from_utf8(body).unwrap(),
        }
    }

    fn metrics(&mut self) -> String {
        let r = self.get("/metrics", None);
        assert_eq!(r.status, 200, "{}", r.body);
        r.body
    }
}

/// The value of the sample written exactly as `sample` (name and labels).
fn value(body: &str, sample: &str) -> f64 {
    body.lines()
        .find_map(|l| l.strip_prefix(sample)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no sample {sample} in:\n{body}"))
        .parse()
        .unwrap()
}

/// A histogram's buckets as (le, cumulative count), checked to be complete
/// and cumulative, with `+Inf` equal to the count.
fn buckets(body: &str, name: &str, labels: &str) -> Vec<(f64, f64)> {
    let prefix = format!("{name}_bucket{{{labels}");
    let out: Vec<(f64, f64)> = body
        .lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .map(|rest| {
            let le = rest
                .split("le=\"")
                .nth(1)
                .unwrap()
                .split('"')
                .next()
                .unwrap();
            let v: f64 = rest.rsplit(' ').next().unwrap().parse().unwrap();
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().unwrap()
            };
            (le, v)
        })
        .collect();
    assert!(out.len() > 10, "{name}{{{labels}}}: {out:?}");
    assert!(
        out.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1),
        "{out:?}"
    );
    assert_eq!(out.last().unwrap().0, f64::INFINITY);
    let count_labels = labels.trim_end_matches(',');
    let count = if count_labels.is_empty() {
        value(body, &format!("{name}_count"))
    } else {
        value(body, &format!("{name}_count{{{count_labels}}}"))
    };
    assert_eq!(out.last().unwrap().1, count);
    out
}

/// A program that exits at once, as a real file (the guests' busybox
/// applets answer only to their own names).
fn true_bin() -> &'static str {
    ["/usr/bin/true", "/bin/true"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .unwrap()
}

/// Runs workload `name` with `args` in `cgroup` from its first instruction.
fn run_in(cgroup: &TestCgroup, name: &str, args: &[&str]) -> String {
    let out = in_cgroup(&cgroup.path, workload_bin(name), args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn scrapes_count_what_the_workload_did() {
    let cgroup = TestCgroup::new("exporter");
    let (rtrace, port) = exporter(&["--collectors", "execsnoop,runqlat", "-c", &cgroup.path]);
    let mut client = Client::connect(port);
    // The kernel's run time and count of each program, while it keeps them.
    let _stats = BpfStats::on();
    let before = client.metrics();
    assert_eq!(
        value(&before, "rtrace_collector_up{collector=\"execsnoop\"}"),
        1.0
    );
    assert_eq!(
        value(&before, "rtrace_collector_up{collector=\"runqlat\"}"),
        1.0
    );
    // Two threads each exec `true` 25 times, after the storm's own exec.
    run_in(&cgroup, "execstorm", &["25", "2", true_bin()]);
    let after = client.metrics();
    let execs = value(&after, "rtrace_execs_total") - value(&before, "rtrace_execs_total");
    assert_eq!(execs, 51.0, "{after}");
    // Every one of those processes waited on a run queue at least once.
    let waits = buckets(&after, "rtrace_runqueue_latency_seconds", "");
    assert!(waits.last().unwrap().1 >= 51.0, "{waits:?}");
    assert!(value(&after, "rtrace_runqueue_latency_seconds_sum") > 0.0);
    let runs = |body: &str| -> f64 {
        body.lines()
            .filter(|l| l.starts_with("rtrace_bpf_program_runs_total{collector=\"execsnoop\""))
            .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
            .sum()
    };
    assert!(runs(&after) - runs(&before) >= 51.0, "{after}");
    assert!(
        after.contains("rtrace_bpf_program_run_seconds_total{collector=\"runqlat\",program=\"")
    );
    assert_eq!(
        value(&after, "rtrace_events_lost_total{collector=\"execsnoop\"}"),
        0.0
    );
    // The same numbers in OpenMetrics, asked for by the Accept header.
    let om = client.get(
        "/metrics",
        Some("application/openmetrics-text;version=1.0.0,text/plain;q=0.5"),
    );
    assert!(
        om.header("content-type")
            .unwrap()
            .starts_with("application/openmetrics-text; version=1.0.0"),
        "{:?}",
        om.headers
    );
    assert!(
        om.body.contains("# TYPE rtrace_execs counter\n"),
        "{}",
        om.body
    );
    assert!(om.body.ends_with("# EOF\n"));
    assert_eq!(
        value(&om.body, "rtrace_execs_total"),
        value(&after, "rtrace_execs_total")
    );
    let plain = client.get("/metrics", None);
    assert!(
        plain
            .header("content-type")
            .unwrap()
            .starts_with("text/plain; version=0.0.4")
    );
    assert!(plain.body.contains("# TYPE rtrace_execs_total counter\n"));
    assert_eq!(client.get("/nothing", None).status, 404);
    let (code, _, stderr) = rtrace.stop(SIGTERM);
    assert_eq!(code, 0, "{stderr}");
}

#[test]
fn block_io_and_tcp_sessions_by_their_labels() {
    const SESSIONS: u64 = 12;
    const UP: u64 = 3000;
    const DOWN: u64 = 70_000;
    let dev = LoopDevice::new("exporter");
    let (rtrace, port) = exporter(&["--collectors", "biolatency,tcplife"]);
    let mut client = Client::connect(port);
    dev.settle();
    let before = client.metrics();
    run_workload("directio", &[dev.path.clone(), "30".into(), "20".into()]);
    run_workload(
        "tcpsessions",
        &[
            "4".into(),
            SESSIONS.to_string(),
            UP.to_string(),
            DOWN.to_string(),
        ],
    );
    dev.settle();
    // Sessions are counted as they close; the last may still be closing.
    std::thread::sleep(Duration::from_millis(300));
    let after = client.metrics();
    let delta = |sample: &str| value(&after, sample) - value(&before, sample);
    // Both ends of each loopback session close.
    assert_eq!(
        delta("rtrace_tcp_sessions_closed_total"),
        (2 * SESSIONS) as f64,
        "{after}"
    );
    let moved = (SESSIONS * (UP + DOWN)) as f64;
    assert_eq!(
        delta("rtrace_tcp_bytes_total{direction=\"received\"}"),
        moved
    );
    assert_eq!(delta("rtrace_tcp_bytes_total{direction=\"sent\"}"), moved);
    // The device is new, so all its I/O is the workload's.
    for (op, n) in [("read", 30.0), ("write", 20.0)] {
        let labels = format!("disk=\"{}\",op=\"{op}\",", dev.name);
        let b = buckets(&after, "rtrace_block_io_latency_seconds", &labels);
        assert_eq!(b.last().unwrap().1, n, "{op}: {b:?}");
        // Each bound is a power of two nanoseconds.
        for (le, _) in &b[..b.len() - 1] {
            let ns = (le * 1e9).round() as u64;
            assert!(ns.is_power_of_two(), "{le}");
        }
    }
    let (code, _, stderr) = rtrace.stop(SIGHUP);
    assert_eq!(code, 0, "{stderr}");
}

/// `kernel.bpf_stats_enabled` on for a test's span, as it was after.
struct BpfStats(String);

impl BpfStats {
    const PATH: &str = "/proc/sys/kernel/bpf_stats_enabled";

    fn on() -> Self {
        let old = std::fs::read_to_string(Self::PATH).unwrap();
        std::fs::write(Self::PATH, "1").unwrap();
        Self(old.trim().to_owned())
    }
}

impl Drop for BpfStats {
    fn drop(&mut self) {
        let _ = std::fs::write(Self::PATH, &self.0);
    }
}

/// `GET` on Prometheus' API, as JSON.
fn prometheus_query(port: u16, query: &str) -> serde_json::Value {
    let mut encoded = String::new();
    for b in query.bytes() {
        if b.is_ascii_alphanumeric() || b"_.-".contains(&b) {
            encoded.push(b as char);
        } else {
            encoded.push_str(&format!("%{b:02X}"));
        }
    }
    let r = Client::connect(port).get(&format!("/api/v1/query?query={encoded}"), None);
    assert_eq!(r.status, 200, "{}", r.body);
    serde_json::from_str(&r.body).unwrap()
}

/// The single value of an instant query, if it has one.
fn prometheus_value(port: u16, query: &str) -> Option<f64> {
    let v = prometheus_query(port, query);
    v["data"]["result"][0]["value"][1].as_str()?.parse().ok()
}

/// Waits up to 30 s for `f` to give a value.
fn eventually<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// A Prometheus server on loopback, scraping one target every second.
struct Prometheus {
    child: std::process::Child,
    port: u16,
    dir: std::path::PathBuf,
}

impl Prometheus {
    fn start(target: u16) -> Self {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("rtrace-prometheus-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n\
                 scrape_configs:\n  - job_name: rtrace\n    static_configs:\n      \
                 - targets: ['127.0.0.1:{target}']\n"
            ),
        )
        .unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus (Debian package prometheus; cargo xtask installs it)");
        let me = Self { child, port, dir };
        eventually("Prometheus to be ready", || {
            let stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
            drop(stream);
            (Client::connect(port).get("/-/ready", None).status == 200).then_some(())
        });
        me
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The power-of-two bucket holding `seconds`.
fn bucket_of(seconds: f64) -> i32 {
    (seconds * 1e9).log2().floor() as i32
}

#[test]
fn prometheus_reads_what_runqlat_and_the_workload_say() {
    if in_guest() {
        eprintln!("skipped: the guests have no Prometheus; the host runs this test");
        return;
    }
    let cgroup = TestCgroup::new("prometheus");
    let (rtrace, port) = exporter(&["--collectors", "runqlat,execsnoop", "-c", &cgroup.path]);
    let prometheus = Prometheus::start(port);
    let p = prometheus.port;
    eventually("the exporter's target to be up", || {
        (prometheus_value(p, "up{job=\"rtrace\"}")? == 1.0).then_some(())
    });
    let execs_before = eventually("a first sample of rtrace_execs_total", || {
        prometheus_value(p, "rtrace_execs_total")
    });
    // runqlat over the same cgroup and the same span: started before the
    // workload, printing after it.
    let runqlat = Rtrace::start(&[
        "runqlat",
        "--percentiles",
        "--json",
        "-c",
        &cgroup.path,
        "6",
        "1",
    ]);
    // Four shells spinning on two CPUs wait on the run queue for whole
    // time slices; then 41 execs.
    // Shell builtins only: the one exec is the shell's own.
    let spin = "for t in 1 2 3 4; do (i=0; while [ $i -lt 2000000 ]; do i=$((i+1)); done) & \
                done; wait";
    assert!(
        in_cgroup(&cgroup.path, "sh", &["-c", spin])
            .status()
            .unwrap()
            .success()
    );
    run_in(&cgroup, "execstorm", &["20", "2", true_bin()]);
    let (code, stdout, stderr) = runqlat.wait();
    assert_eq!(code, 0, "{stderr}");
    let line = &json_lines(&stdout)[0];
    let p99_us = line["histograms"][0]["percentiles"]["p99"]
        .as_f64()
        .unwrap_or_else(|| panic!("no p99: {line}"));
    let runqlat_count = line["histograms"][0]["count"].as_f64().unwrap();
    // Everything the exporter counted in the cgroup, it counted while
    // runqlat ran: wait for a scrape that has all of it.
    let total_query = "rtrace_runqueue_latency_seconds_count";
    eventually("Prometheus to have the workload's run-queue waits", || {
        (prometheus_value(p, total_query)? >= runqlat_count).then_some(())
    });
    let p99 = prometheus_value(
        p,
        "histogram_quantile(0.99, rtrace_runqueue_latency_seconds_bucket)",
    )
    .unwrap();
    eprintln!("p99: Prometheus {p99} s, runqlat {p99_us} us");
    assert!(
        (bucket_of(p99) - bucket_of(p99_us / 1e6)).abs() <= 1,
        "Prometheus p99 {p99} s, runqlat p99 {p99_us} us"
    );
    let execs = eventually("Prometheus to have the execs", || {
        let v = prometheus_value(p, "rtrace_execs_total")?;
        (v >= execs_before + 42.0).then_some(v)
    });
    // The spinning shell, the storm and its 40: no more, after two more
    // scrapes.
    std::thread::sleep(Duration::from_secs(2));
    let execs = prometheus_value(p, "rtrace_execs_total")
        .unwrap()
        .max(execs);
    assert_eq!(execs - execs_before, 42.0, "execs");
    drop(prometheus);
    let (code, _, stderr) = rtrace.stop(SIGTERM);
    assert_eq!(code, 0, "{stderr}");
}

#[test]
fn runs_with_only_cap_bpf_and_cap_perfmon() {
    let (dir, bin) = unprivileged_copy();
    let caps = ",+bpf,+perfmon";
    // Debian's kernels (the guests') default to level 3, which leaves perf
    // events to CAP_SYS_ADMIN alone: profile says so, and which setting
    // lets CAP_PERFMON do. Upstream kernels (this host's) treat 3 as 2.
    {
        let _strict = Paranoid::set("3");
        let out = as_nobody(&bin, caps)
            .args(["profile", "-F", "49", "-d", "1"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let debian = std::fs::read_to_string("/proc/version")
            .unwrap()
            .contains("Debian");
        assert_eq!(
            out.status.code(),
            Some(if debian { 1 } else { 0 }),
            "{stderr}"
        );
        if debian {
            assert_eq!(stderr.lines().count(), 1, "{stderr}");
            assert!(
                stderr.contains("kernel.perf_event_paranoid is 3")
                    && stderr.contains("sysctl kernel.perf_event_paranoid=2"),
                "{stderr}"
            );
        }
    }
    let _usual = Paranoid::set("2");
    for args in [
        &["runqlat", "1", "1"][..],
        &["biolatency", "1", "1"],
        &["profile", "-F", "49", "-d", "1"],
    ] {
        let out = as_nobody(&bin, caps).args(args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {stderr}");
        // Other users' processes may be sampled too, and their files
        // warned about ("cannot open it: Permission denied (os error 13)"):
        // only rtrace's own failure matters here.
        assert!(
            !stderr.lines().any(|l| l.starts_with("rtrace: error")),
            "{args:?}: {stderr}"
        );
    }
    // tcplife runs until interrupted.
    let mut tcplife = as_nobody(&bin, caps)
        .args(["tcplife"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    // SAFETY: kill with a child's pid.
    unsafe { libc::kill(tcplife.id() as i32, libc::SIGINT) };
    let out = tcplife.wait().unwrap();
    assert_eq!(out.code(), Some(0), "tcplife");

    // The exporter with every default collector up.
    let port = free_port();
    let mut exporter = as_nobody(&bin, caps)
        .args(["exporter", "--listen", &format!("127.0.0.1:{port}")])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let body = eventually("the unprivileged exporter to answer", || {
        let mut c = TcpStream::connect(("127.0.0.1", port)).ok().map(|s| {
            drop(s);
            Client::connect(port)
        })?;
        Some(c.metrics())
    });
    for c in ["runqlat", "biolatency", "execsnoop", "tcplife"] {
        assert_eq!(
            value(&body, &format!("rtrace_collector_up{{collector=\"{c}\"}}")),
            1.0,
            "{body}"
        );
    }
    // SAFETY: kill with a child's pid.
    unsafe { libc::kill(exporter.id() as i32, libc::SIGTERM) };
    assert_eq!(exporter.wait().unwrap().code(), Some(0));
    let mut stderr = String::new();
    exporter
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(!stderr.contains("not collecting"), "{stderr}");

    // Without the capabilities: one line naming them.
    let out = as_nobody(&bin, "")
        .args(["exporter", "--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("missing CAP_BPF and CAP_PERFMON"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// A field of `/proc/PID/status` in KiB (`VmRSS`, `RssAnon`, ...).
fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Resident memory of `pid`, in KiB, and its anonymous and file parts.
fn rss_kib(pid: u32) -> (u64, u64, u64) {
    (
        status_kib(pid, "VmRSS"),
        status_kib(pid, "RssAnon"),
        status_kib(pid, "RssFile"),
    )
}

/// The mappings of `pid` with anonymous pages, and how many KiB each.
fn anon_maps(pid: u32) -> String {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let mut out = String::new();
    let mut head = "";
    for line in smaps.lines() {
        // A mapping's own line ends in its path or its inode, not in kB.
        let anon = line.strip_prefix("Anonymous:").map(str::trim);
        if anon.is_none() && line.split_whitespace().count() >= 5 && !line.ends_with("kB") {
            head = line;
        } else if let Some(v) = anon.filter(|v| *v != "0 kB") {
            out.push_str(&format!("{head} {v}\n"));
        }
    }
    out
}

#[test]
fn two_thousand_scrapes_keep_memory_flat() {
    let (rtrace, port) = exporter(&[]);
    let pid = rtrace.pid();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Work for every collector while scrapes come.
    let load = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                run_workload("execstorm", &["5".into(), "1".into(), true_bin().into()]);
                run_workload(
                    "tcpsessions",
                    &["4".into(), "3".into(), "100".into(), "100".into()],
                );
            }
        })
    };
    let scrape_all = |n: usize| {
        // Four scrapers at once, two keeping their connection and two
        // opening one per scrape.
        std::thread::scope(|s| {
            for t in 0..4 {
                s.spawn(move || {
                    let mut kept = Client::connect(port);
                    for _ in 0..n / 4 {
                        let body = if t % 2 == 0 {
                            kept.metrics()
                        } else {
                            Client::connect(port).metrics()
                        };
                        assert!(body.contains("rtrace_build_info{"), "{body}");
                    }
                });
            }
        });
    };
    // Memory as it settles after a burst: the exporter hands free heap
    // pages back at a scrape a second or more after the last time.
    let settled = || {
        std::thread::sleep(Duration::from_millis(1200));
        Client::connect(port).metrics();
        rss_kib(pid)
    };
    // A long warm-up: under emulation the heap takes its working shape
    // slowly.
    scrape_all(1000);
    let warm = settled();
    let maps_before = anon_maps(pid);
    scrape_all(2000);
    let after = settled();
    let maps_after = anon_maps(pid);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    load.join().unwrap();
    eprintln!(
        "resident memory (all, anon, file): {warm:?} KiB after warm-up, {after:?} KiB after 2000 scrapes"
    );
    assert!(
        after.0 < warm.0 + 1024,
        "resident memory grew from {warm:?} KiB to {after:?} KiB over 2000 scrapes; \
         anonymous mappings before:\n{maps_before}\nafter:\n{maps_after}"
    );
    let (code, _, stderr) = rtrace.stop(SIGTERM);
    assert_eq!(code, 0, "{stderr}");
    // The collectors trace the whole machine: what else runs there may
    // cost them events, which they rightly warn about; this test is about
    // memory.
    assert!(
        !stderr.lines().any(|l| l.starts_with("rtrace: error")),
        "{stderr}"
    );
}

#[test]
fn stuck_scrapers_hold_nothing_up() {
    let (rtrace, port) = exporter(&["--collectors", "execsnoop"]);
    // One sends half a request and waits; others ask and never read.
    let mut half = TcpStream::connect(("127.0.0.1", port)).unwrap();
    half.write_all(b"GET /metrics HTTP/1.1\r\nHost: loc")
        .unwrap();
    let mute: Vec<TcpStream> = (0..8)
        .map(|_| {
            let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
            for _ in 0..50 {
                s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
                    .unwrap();
            }
            s
        })
        .collect();
    let mut client = Client::connect(port);
    let before = value(&client.metrics(), "rtrace_execs_total");
    run_workload("execstorm", &["3".into(), "1".into(), true_bin().into()]);
    let started = Instant::now();
    let after = value(&client.metrics(), "rtrace_execs_total");
    assert!(after >= before + 4.0, "{before} -> {after}");
    assert!(started.elapsed() < Duration::from_secs(5));
    drop((half, mute));
    let (code, _, stderr) = rtrace.stop(SIGTERM);
    assert_eq!(code, 0, "{stderr}");
}

#[test]
fn a_collector_that_cannot_attach_leaves_the_others_working() {
    // A directory that is no cgroup v2 one: the collectors that filter by
    // cgroup cannot use it; tcplife, which does not, still counts.
    let dir = std::env::temp_dir();
    let dir = dir.to_str().unwrap();
    let (rtrace, port) = exporter(&["-c", dir]);
    let body = Client::connect(port).metrics();
    for c in ["runqlat", "biolatency", "execsnoop"] {
        assert_eq!(
            value(&body, &format!("rtrace_collector_up{{collector=\"{c}\"}}")),
            0.0
        );
    }
    assert_eq!(
        value(&body, "rtrace_collector_up{collector=\"tcplife\"}"),
        1.0
    );
    assert!(body.contains("rtrace_tcp_sessions_closed_total "), "{body}");
    let (code, _, stderr) = rtrace.stop(SIGTERM);
    assert_eq!(code, 0);
    for c in ["runqlat", "biolatency", "execsnoop"] {
        assert!(
            stderr.contains(&format!("exporter: {c}: not collecting: ")),
            "{stderr}"
        );
    }
}

#[test]
fn bad_input_gets_one_line_and_nonzero_exit() {
    assert_one_line_error(
        &["exporter", "--collectors", "runqlat,nope"],
        "no collector 'nope'; the collectors are runqlat, execsnoop, tcplife, biolatency",
    );
    assert_one_line_error(
        &["exporter", "-c", "/nonexistent"],
        "cannot use cgroup /nonexistent",
    );
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    assert_one_line_error(
        &["exporter", "--listen", &addr, "--collectors", "runqlat"],
        &format!("cannot listen on {addr}"),
    );
    let (code, _, stderr) = run(&["exporter", "--listen", "nowhere"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("invalid socket address"), "{stderr}");
}

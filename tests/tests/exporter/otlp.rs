//! `rtrace exporter --profile` shipping to a real OpenTelemetry Collector
//! (0.152, built by `cargo xtask otelcol`), whose `rtracefile` exporter
//! writes every request it takes to a file: the stacks and splits of two
//! fixtures in what the Collector wrote, a receiver's gap and a frozen
//! receiver, and compression and headers as the Collector saw them. On
//! the host only: the guests have no Collector.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use prost::Message as _;
use rtrace_integration_tests::profile::otlp::opentelemetry::proto::{
    common::v1::{AnyValue, KeyValue, any_value},
    profiles::v1development::{ProfilesData, ProfilesDictionary},
};
use rtrace_integration_tests::{Rtrace, SIGTERM, TestCgroup, Workload, in_guest, workload_bin};

use super::{Client, free_port, value};

/// The Collector `cargo xtask` built.
fn otelcol() -> PathBuf {
    let path = PathBuf::from(
        std::env::var_os("RTRACE_OTELCOL").expect("RTRACE_OTELCOL (cargo xtask test sets it)"),
    );
    assert!(path.exists(), "no Collector at {}", path.display());
    path
}

/// A running Collector: an OTLP/HTTP receiver on `port`, writing to
/// `out`.
struct Collector {
    child: Option<Child>,
    port: u16,
    config: PathBuf,
    out: PathBuf,
}

impl Collector {
    /// Starts one; `require` is rtracefile's `require_metadata`.
    fn start(tag: &str, require: &[(&str, &str)]) -> Self {
        Self::start_with(tag, require, "http", None)
    }

    /// Starts one whose receiver speaks `protocol` (`http` or `grpc`),
    /// with TLS where `tls` gives its certificate and key files.
    fn start_with(
        tag: &str,
        require: &[(&str, &str)],
        protocol: &str,
        tls: Option<(&Path, &Path)>,
    ) -> Self {
        let dir = std::env::temp_dir().join(format!("rtrace-otlp-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let port = free_port();
        let out = dir.join("profiles.bin");
        let mut require_yaml = String::new();
        if !require.is_empty() {
            require_yaml.push_str("    require_metadata:\n");
            for (k, v) in require {
                require_yaml.push_str(&format!("      {k}: {v}\n"));
            }
        }
        let tls = tls.map_or(String::new(), |(cert, key)| {
            format!(
                "        tls:\n          cert_file: {}\n          key_file: {}\n",
                cert.display(),
                key.display()
            )
        });
        let config = dir.join("config.yaml");
        std::fs::write(
            &config,
            format!(
                "receivers:\n  otlp:\n    protocols:\n      {protocol}:\n        endpoint: \
                 127.0.0.1:{port}\n        include_metadata: true\n{tls}\
                 exporters:\n  rtracefile:\n    path: {}\n{require_yaml}\
                 service:\n  telemetry:\n    metrics:\n      level: none\n  pipelines:\n    \
                 profiles:\n      receivers: [otlp]\n      exporters: [rtracefile]\n",
                out.display()
            ),
        )
        .unwrap();
        let mut c = Self {
            child: None,
            port,
            config,
            out,
        };
        c.restart();
        c
    }

    /// Starts it (again), and waits until it listens.
    fn restart(&mut self) {
        let child = Command::new(otelcol())
            .arg("--config")
            .arg(&self.config)
            .arg("--feature-gates=service.profilesSupport")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.child = Some(child);
        let start = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "the Collector did not listen"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops it.
    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn signal(&self, sig: i32) {
        let pid = self.child.as_ref().unwrap().id() as i32;
        // SAFETY: a signal to our own child.
        assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Every request the Collector wrote so far.
    fn received(&self) -> Vec<ProfilesData> {
        read_requests(&self.out)
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        if let Some(c) = &self.child {
            // A frozen Collector must be thawed to be killed cleanly.
            // SAFETY: a signal to our own child.
            unsafe { libc::kill(c.id() as i32, libc::SIGCONT) };
        }
        self.stop();
        if let Some(dir) = self.out.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// rtracefile's records: a little-endian u32 length, then ProfilesData.
fn read_requests(path: &Path) -> Vec<ProfilesData> {
    let bytes = std::fs::read(path).unwrap_or_default();
    let mut out = Vec::new();
    let mut at = 0;
    while at + 4 <= bytes.len() {
        let n = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        let body = &bytes[at + 4..at + 4 + n];
        out.push(ProfilesData::decode(body).unwrap());
        at += 4 + n;
    }
    out
}

/// Starts the exporter profiling at `hz`, shipping every `period` s to
/// `endpoint`, with `extra` arguments and `env`.
fn profiling(
    endpoint: &str,
    hz: u32,
    period: u32,
    extra: &[&str],
    env: &[(&str, &str)],
) -> (Rtrace, u16) {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let (hz, period) = (hz.to_string(), period.to_string());
    let mut args = vec![
        "exporter",
        "--listen",
        &listen,
        "--collectors",
        "runqlat",
        "--profile",
        "--profile-frequency",
        &hz,
        "--profile-period",
        &period,
        "--otlp-endpoint",
        endpoint,
    ];
    args.extend_from_slice(extra);
    (
        Rtrace::start_with_env(&args, "Profiling all CPUs", env),
        port,
    )
}

/// An attribute's value as text; the Collector writes strings as
/// indices into the dictionary's `strings` where it can.
fn text(v: &Option<AnyValue>, strings: &[String]) -> String {
    match v.as_ref().and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::StringValueStrindex(i)) => strings[*i as usize].clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        other => format!("{other:?}"),
    }
}

/// Attributes by key, keys too resolved from `strings` where given so.
fn attributes(kv: &[KeyValue], strings: &[String]) -> HashMap<String, String> {
    kv.iter()
        .map(|a| {
            let key = if a.key.is_empty() {
                strings[a.key_strindex as usize].clone()
            } else {
                a.key.clone()
            };
            (key, text(&a.value, strings))
        })
        .collect()
}

/// One process's samples as the Collector wrote them: each stack's
/// function names (leaf first) with its count, the resource's
/// attributes, and for each location the mapping's file, build id,
/// start, offset and the location's address.
#[derive(Default)]
struct Process {
    stacks: Vec<(Vec<String>, i64)>,
    /// The stacks of the `off_cpu` profile, with nanoseconds.
    off: Vec<(Vec<String>, i64)>,
    resource: HashMap<String, String>,
    locations: Vec<(String, Vec<String>, String, u64, u64, u64)>,
}

/// Every process of `requests` by pid.
fn processes(requests: &[ProfilesData]) -> HashMap<u32, Process> {
    let mut out: HashMap<u32, Process> = HashMap::new();
    for r in requests {
        let d: &ProfilesDictionary = r.dictionary.as_ref().unwrap();
        let s = |i: i32| d.string_table[i as usize].clone();
        for rp in &r.resource_profiles {
            let resource = attributes(&rp.resource.as_ref().unwrap().attributes, &d.string_table);
            let pid: u32 = resource
                .get("process.pid")
                .unwrap_or_else(|| panic!("a resource without process.pid: {resource:?}"))
                .parse()
                .unwrap();
            let p = out.entry(pid).or_default();
            p.resource = resource;
            for sp in &rp.scope_profiles {
                assert_eq!(sp.scope.as_ref().unwrap().name, "rtrace");
                for prof in &sp.profiles {
                    let st = prof.sample_type.unwrap();
                    let ty = (s(st.type_strindex), s(st.unit_strindex));
                    let off = match (ty.0.as_str(), ty.1.as_str()) {
                        ("samples", "count") | ("cpu", "nanoseconds") => false,
                        ("off_cpu", "nanoseconds") => true,
                        _ => panic!("a profile of {ty:?}"),
                    };
                    for sample in &prof.samples {
                        let stack = &d.stack_table[sample.stack_index as usize];
                        let mut names = Vec::new();
                        for &l in &stack.location_indices {
                            let loc = &d.location_table[l as usize];
                            let fnames: Vec<String> = loc
                                .lines
                                .iter()
                                .map(|line| {
                                    s(d.function_table[line.function_index as usize].name_strindex)
                                })
                                .collect();
                            let m = &d.mapping_table[loc.mapping_index as usize];
                            let build_id = m
                                .attribute_indices
                                .iter()
                                .map(|&a| &d.attribute_table[a as usize])
                                .find(|a| s(a.key_strindex) == "process.executable.build_id.gnu")
                                .map(|a| text(&a.value, &d.string_table))
                                .unwrap_or_default();
                            p.locations.push((
                                s(m.filename_strindex),
                                fnames.clone(),
                                build_id,
                                m.memory_start,
                                m.file_offset,
                                loc.address,
                            ));
                            names.extend(fnames);
                        }
                        if off {
                            p.off.push((names, sample.values[0]));
                        } else {
                            p.stacks.push((names, sample.values[0]));
                        }
                    }
                }
            }
        }
    }
    out
}

/// Samples of `p` with a frame named `name`.
fn with(p: &Process, name: &str) -> i64 {
    p.stacks
        .iter()
        .filter(|(names, _)| names.iter().any(|n| n == name))
        .map(|(_, c)| c)
        .sum()
}

/// `a`'s share of `a + b` within 4 binomial sd (and a point) of `want`.
fn assert_share(what: &str, a: i64, b: i64, want: f64) {
    let n = (a + b) as f64;
    assert!(n >= 100.0, "{what}: only {n} samples");
    let got = a as f64 / n;
    let sd = (want * (1.0 - want) / n).sqrt();
    assert!(
        (got - want).abs() <= 4.0 * sd + 0.01,
        "{what}: share {got:.3} of {n} samples, the fixture measured {want:.3} (sd {sd:.3})"
    );
}

/// Checks process `pid`'s split of its two leaves against the fixture's
/// `done` line (their nanoseconds), and that a leaf's caller is
/// `caller`; gives the process.
fn split<'a>(
    procs: &'a HashMap<u32, Process>,
    pid: u32,
    done: &str,
    leaves: [&str; 2],
    caller: &str,
) -> &'a Process {
    let done: Vec<i64> = done
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    let p = procs
        .get(&pid)
        .unwrap_or_else(|| panic!("no profile of {}", leaves[0]));
    let want = done[0] as f64 / (done[0] + done[1]) as f64;
    assert_share(leaves[0], with(p, leaves[0]), with(p, leaves[1]), want);
    assert!(
        p.stacks
            .iter()
            .any(|(n, _)| n.windows(2).any(|w| w == [leaves[0], caller])),
        "no {} called by {caller}",
        leaves[0]
    );
    p
}

/// The C fixture (`cfuncs_nofp cpu`) and the Python one (`pyfix.py
/// split`), started and ready, each to work for `secs` seconds.
struct TwoFixtures {
    c: Workload,
    python: Workload,
}

impl TwoFixtures {
    fn start(secs: &str) -> Self {
        let (c, line) = Workload::start("cfuncs_nofp", &["cpu".into(), secs.into()]);
        assert!(line.starts_with("ready"), "{line}");
        let mut py = Command::new("/usr/bin/python3.11");
        py.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/pyfix.py"))
            .args(["split", secs]);
        let (python, line) = Workload::start_command(py);
        assert!(line.starts_with("ready"), "{line}");
        Self { c, python }
    }

    /// Lets both work at once to their end: their `done` lines.
    fn run(mut self) -> (String, String) {
        let (c, python) = (&mut self.c, &mut self.python);
        let done = std::thread::scope(|s| {
            let a = s.spawn(|| c.go());
            let b = s.spawn(|| python.go());
            (a.join().unwrap(), b.join().unwrap())
        });
        assert!(self.c.wait().success() && self.python.wait().success());
        done
    }
}

/// [`split`] of the Python fixture, run by Debian's python3.11.
fn python_split<'a>(procs: &'a HashMap<u32, Process>, pid: u32, done: &str) -> &'a Process {
    let p = split(procs, pid, done, ["pyfix.hot", "pyfix.warm"], "pyfix.outer");
    assert_eq!(p.resource["process.executable.name"], "python3.11");
    p
}

/// The samples in every request the Collector wrote.
fn samples_written(c: &Collector) -> i64 {
    c.received()
        .iter()
        .flat_map(|r| r.resource_profiles.iter())
        .flat_map(|rp| rp.scope_profiles[0].profiles[0].samples.iter())
        .map(|s| s.values[0])
        .sum()
}

/// A cgroup path as a container runtime makes it, under a test cgroup:
/// `parts` joined below it, removed on drop.
struct Nested {
    top: TestCgroup,
    leaf: PathBuf,
}

impl Nested {
    fn new(tag: &str, parts: &str) -> Self {
        let top = TestCgroup::new(tag);
        let leaf = Path::new(&top.path).join(parts);
        std::fs::create_dir_all(&leaf).unwrap();
        Self { top, leaf }
    }

    fn add(&self, pid: u32) {
        std::fs::write(self.leaf.join("cgroup.procs"), pid.to_string()).unwrap();
    }
}

impl Drop for Nested {
    fn drop(&mut self) {
        let mut dir = self.leaf.clone();
        while dir != Path::new(&self.top.path) {
            let _ = std::fs::remove_dir(&dir);
            dir.pop();
        }
    }
}

fn skip() -> bool {
    if in_guest() {
        eprintln!("skipped: the guests have no Collector; the host runs this test");
        return true;
    }
    false
}

/// The build id of file `path`, in hex.
fn build_id(path: &Path) -> String {
    let data = std::fs::read(path).unwrap();
    let elf = object::File::parse(&*data).unwrap();
    object::Object::build_id(&elf)
        .unwrap()
        .unwrap()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn the_collector_holds_both_fixtures_splits_with_their_resources() {
    if skip() {
        return;
    }
    let collector = Collector::start("splits", &[]);
    let container = "4f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8";
    let pod = "0b6e6a3c-1d2e-4f50-9a7b-8c9d0e1f2a3b";
    let docker = Nested::new("otlp-c", &format!("system.slice/docker-{container}.scope"));
    let python_container = "a".repeat(64);
    let kube = Nested::new(
        "otlp-py",
        &format!("kubepods/burstable/pod{pod}/{python_container}"),
    );

    let cfix = workload_bin("cfuncs_nofp");
    let fixtures = TwoFixtures::start("5");
    let (c_pid, p_pid) = (fixtures.c.pid(), fixtures.python.pid());
    docker.add(c_pid);
    kube.add(p_pid);

    let (rtrace, port) = profiling(&collector.endpoint(), 99, 2, &[], &[]);
    let both = fixtures.run();
    let metrics = Client::connect(port).metrics();
    let (code, _, stderr) = rtrace.stop(SIGTERM);
    assert_eq!(code, 0, "{stderr}");

    let requests = collector.received();
    let procs = processes(&requests);
    let total: i64 = procs
        .values()
        .flat_map(|p| p.stacks.iter().map(|s| s.1))
        .sum();
    // Everything sent by the scrape, and the last profile at the stop.
    assert!(
        total as f64 >= value(&metrics, "rtrace_otlp_samples_sent_total"),
        "{total} samples in the Collector's file:\n{metrics}"
    );

    // The C fixture: three quarters in leaf_alpha, as it measured.
    let cp = split(&procs, c_pid, &both.0, ["leaf_alpha", "leaf_beta"], "mid");
    assert_eq!(cp.resource["process.executable.name"], "cfuncs_nofp");
    assert_eq!(
        cp.resource["process.executable.path"],
        cfix.display().to_string()
    );
    assert_eq!(cp.resource["container.id"], container);
    assert!(!cp.resource.contains_key("k8s.pod.uid"));
    assert_eq!(
        cp.resource["host.name"],
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .unwrap()
            .trim()
    );
    assert!(cp.resource.contains_key("process.creation.time"));
    // Its native frames: the file, its build id, and an address that is
    // leaf_alpha's own once taken back to the file.
    let id = build_id(&cfix);
    let data = std::fs::read(&cfix).unwrap();
    let elf = object::File::parse(&*data).unwrap();
    let sym = object::Object::symbols(&elf)
        .find(|s| object::ObjectSymbol::name(s) == Ok("leaf_alpha"))
        .unwrap();
    let (start, size) = (
        object::ObjectSymbol::address(&sym),
        object::ObjectSymbol::size(&sym),
    );
    let vaddr = |offset: u64| {
        object::Object::segments(&elf).find_map(|seg| {
            let (from, len) = object::ObjectSegment::file_range(&seg);
            (from..from + len)
                .contains(&offset)
                .then(|| object::ObjectSegment::address(&seg) + (offset - from))
        })
    };
    let leaf = cp
        .locations
        .iter()
        .find(|l| l.1.last().is_some_and(|n| n == "leaf_alpha"))
        .expect("a location of leaf_alpha");
    assert!(leaf.0.ends_with("/cfuncs_nofp"), "{}", leaf.0);
    assert_eq!(leaf.2, id);
    let at = vaddr(leaf.5 - leaf.3 + leaf.4).unwrap();
    assert!(
        (start..start + size).contains(&at),
        "{at:#x} not in leaf_alpha"
    );

    // The Python fixture: hot's share of hot and warm, as it measured.
    let pp = python_split(&procs, p_pid, &both.1);
    assert_eq!(pp.resource["container.id"], python_container);
    assert_eq!(pp.resource["k8s.pod.uid"], pod);
}

/// The exporter's metric `name{reason="..."}`.
fn dropped(metrics: &str, reason: &str) -> f64 {
    value(
        metrics,
        &format!("rtrace_otlp_samples_dropped_total{{reason=\"{reason}\"}}"),
    )
}

/// Waits until `f` holds, for at most `secs`.
fn until(secs: u64, what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(
            start.elapsed() < Duration::from_secs(secs),
            "{what} within {secs} s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_receivers_gap_is_delivered_after_it_up_to_the_buffer() {
    if skip() {
        return;
    }
    // Something to sample on the whole while, the gap included (a full
    // run once saw a fixture's 9 s end within it, and the gap's profiles
    // of an idle host fit the small buffer): a shell spinning until the
    // test ends, however it ends.
    let _spin = Spinning::start();
    let mut big = Collector::start("gap", &[]);
    let mut small = Collector::start("gap-small", &[]);
    let (a, a_port) = profiling(&big.endpoint(), 49, 1, &[], &[]);
    until(10, "a first profile", || big.received().len() >= 2);
    // The other's buffer holds two or three profiles of this host, as
    // those after the first measured (the first, with every process's
    // first stacks, is the larger, and must fit).
    let bytes = || std::fs::metadata(&big.out).unwrap().len();
    let (n0, b0) = (big.received().len(), bytes());
    until(10, "two more profiles", || big.received().len() >= n0 + 2);
    let size = (bytes() - b0) / (big.received().len() - n0) as u64;
    let buffer = format!("{}", size * 5 / 2);
    let (b, b_port) = profiling(&small.endpoint(), 49, 1, &["--otlp-buffer", &buffer], &[]);
    until(10, "a first profile", || !small.received().is_empty());
    big.stop();
    small.stop();
    // The gap lasts 5 s, and then until the small buffer has dropped:
    // a host busier while the size was measured than in the gap (a full
    // run saw its five profiles fit in two and a half measured ones)
    // makes the gap's profiles smaller.
    let gap_start = now_ns();
    std::thread::sleep(Duration::from_secs(5));
    until(20, "the small buffer to drop", || {
        dropped(&Client::connect(b_port).metrics(), "buffer_full") > 0.0
    });
    let gap_end = now_ns();
    big.restart();
    small.restart();
    // The profiles of the gap arrive after it.
    until(20, "the gap's profiles", || {
        big.received().iter().any(|r| {
            r.resource_profiles.iter().any(|rp| {
                let t = rp.scope_profiles[0].profiles[0].time_unix_nano;
                t > gap_start + 1_000_000_000 && t < gap_end - 1_000_000_000
            })
        })
    });
    let ma = Client::connect(a_port).metrics();
    let mb = Client::connect(b_port).metrics();
    for (r, m) in [(a, &ma), (b, &mb)] {
        let (code, _, stderr) = r.stop(SIGTERM);
        assert_eq!(code, 0, "{stderr}");
        assert!(value(m, "rtrace_otlp_send_failures_total") >= 1.0, "{m}");
    }
    assert_eq!(dropped(&ma, "buffer_full"), 0.0, "{ma}");
    assert!(
        dropped(&mb, "buffer_full") > 0.0,
        "the small buffer dropped nothing:\n{mb}"
    );
    // What the small one sent and dropped is all it sampled: the file
    // holds what it counts as sent.
    let sent = samples_written(&small);
    assert!(
        sent as f64 >= value(&mb, "rtrace_otlp_samples_sent_total"),
        "{sent}\n{mb}"
    );
}

/// A shell spinning until dropped.
struct Spinning(Child);

impl Spinning {
    fn start() -> Self {
        Self(
            Command::new("sh")
                .args(["-c", "while :; do :; done"])
                .spawn()
                .unwrap(),
        )
    }
}

impl Drop for Spinning {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

#[test]
fn a_frozen_receiver_costs_bounded_memory_and_sending_resumes() {
    if skip() {
        return;
    }
    let (mut c, _) = Workload::start("cfuncs_nofp", &["cpu".into(), "16".into()]);
    let collector = Collector::start("frozen", &[]);
    let (r, port) = profiling(
        &collector.endpoint(),
        49,
        1,
        &[],
        &[("OTEL_EXPORTER_OTLP_TIMEOUT", "1000")],
    );
    let go = std::thread::spawn(move || {
        c.go();
        c.wait();
    });
    let sent = |m: &str| value(m, "rtrace_otlp_samples_sent_total");
    until(10, "a first profile", || {
        sent(&Client::connect(port).metrics()) > 0.0
    });
    // Two more profiles first: the files of the host's processes (the
    // Collector's own 40 MB binary among them) are read and their names
    // kept as the first profiles are named.
    std::thread::sleep(Duration::from_secs(2));
    // The receiver frozen twice, 5 s each, sending resumed after each.
    // rtrace's heap, where the queue is, may grow in a window for another
    // reason: the whole system is profiled, and a large program started
    // then (a compiler beside the tests) has its tables and names read
    // once. A queue that keeps what it should not grows in both windows;
    // the smaller growth is judged.
    let mut windows = Vec::new();
    for _ in 0..2 {
        collector.signal(libc::SIGSTOP);
        let frozen = sent(&Client::connect(port).metrics());
        // rtrace's own memory: its heap, where the queue is. (Its
        // resident total also counts the kernel's tables it maps, the
        // CFI rows above all, which do not grow with the queue.)
        let before = super::status_kib(r.pid(), "RssAnon");
        let mut peak = 0;
        for _ in 0..10 {
            std::thread::sleep(Duration::from_millis(500));
            peak = peak.max(super::status_kib(r.pid(), "RssAnon"));
        }
        let m = Client::connect(port).metrics();
        assert!(value(&m, "rtrace_otlp_send_failures_total") >= 2.0, "{m}");
        assert!(value(&m, "rtrace_otlp_queued_bytes") > 0.0, "{m}");
        let queued = value(&m, "rtrace_otlp_queued_bytes") as u64 / 1024;
        // A loose ceiling on the whole heap, which also holds the names
        // of all the host runs (65.9 MB once, a compiler beside the tests
        // on a fresh machine): the queue's own growth is judged below,
        // window by window.
        assert!(
            peak <= 96 * 1024,
            "{peak} KiB of heap while the receiver was frozen ({before} KiB before, \
             {queued} KiB queued)"
        );
        windows.push((peak.saturating_sub(before + queued), before, peak, queued));
        collector.signal(libc::SIGCONT);
        until(15, "sending to resume", || {
            sent(&Client::connect(port).metrics()) > frozen
        });
    }
    let least = windows.iter().map(|w| w.0).min().unwrap_or(0);
    assert!(
        least <= 8 * 1024,
        "the heap grew past what was queued by {least} KiB in each window while the \
         receiver was frozen (growth, before, peak, queued, in KiB): {windows:?}"
    );
    go.join().unwrap();
    let (code, _, stderr) = r.stop(SIGTERM);
    assert_eq!(code, 0, "{stderr}");
}

#[test]
fn grpc_with_gzip_and_a_header_reaches_the_collector() {
    if skip() {
        return;
    }
    // gRPC's own headers (grpc-encoding) are not metadata: the gzip is
    // shown by the Collector decoding what says it is gzipped.
    let collector = Collector::start_with("grpc", &[("x-rtrace-tenant", "fleet-1")], "grpc", None);
    let (mut c, _) = Workload::start("cfuncs_nofp", &["cpu".into(), "3".into()]);
    let env = [
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "x-rtrace-tenant=fleet-1"),
    ];
    let (r, port) = profiling(&collector.endpoint(), 99, 1, &[], &env);
    let c_pid = c.pid();
    let done = c.go();
    c.wait();
    let m = Client::connect(port).metrics();
    let (code, _, stderr) = r.stop(SIGTERM);
    assert_eq!(code, 0, "{stderr}");
    assert!(value(&m, "rtrace_otlp_samples_sent_total") > 0.0, "{m}");
    assert_eq!(dropped(&m, "rejected"), 0.0, "{m}");
    let procs = processes(&collector.received());
    split(&procs, c_pid, &done, ["leaf_alpha", "leaf_beta"], "mid");
    assert!(samples_written(&collector) as f64 >= value(&m, "rtrace_otlp_samples_sent_total"));
}

#[test]
fn gzip_and_headers_reach_the_collector() {
    if skip() {
        return;
    }
    let collector = Collector::start(
        "headers",
        &[("content-encoding", "gzip"), ("x-rtrace-tenant", "fleet-1")],
    );
    let (mut c, _) = Workload::start("cfuncs_nofp", &["cpu".into(), "3".into()]);
    let env = [
        ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "x-rtrace-tenant=fleet-1"),
    ];
    let (with_header, port) = profiling(&collector.endpoint(), 49, 1, &[], &env);
    // The same without the header: refused by the Collector, and counted.
    let (without, bad_port) = profiling(
        &collector.endpoint(),
        49,
        1,
        &[],
        &[("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")],
    );
    c.go();
    c.wait();
    let good = Client::connect(port).metrics();
    let bad = Client::connect(bad_port).metrics();
    let (code, _, stderr) = with_header.stop(SIGTERM);
    assert_eq!(code, 0, "{stderr}");
    let (code, _, bad_stderr) = without.stop(SIGTERM);
    assert_eq!(code, 0, "{bad_stderr}");
    assert!(
        value(&good, "rtrace_otlp_samples_sent_total") > 0.0,
        "{good}"
    );
    assert_eq!(dropped(&good, "rejected"), 0.0, "{good}");
    assert_eq!(value(&bad, "rtrace_otlp_samples_sent_total"), 0.0, "{bad}");
    assert!(dropped(&bad, "rejected") > 0.0, "{bad}");
    assert!(
        bad_stderr.contains("refused profiles (HTTP 500"),
        "{bad_stderr}"
    );
    // What the Collector wrote is only what came with the header.
    let written = samples_written(&collector);
    assert!(written > 0);
}

#[test]
fn as_the_units_user_the_profile_names_what_root_names() {
    if skip() {
        return;
    }
    // The unit's user: not root, CAP_BPF and CAP_PERFMON only.
    let (_dir, bin) = rtrace_integration_tests::unprivileged_copy();
    let _usual = rtrace_integration_tests::Paranoid::set("2");
    let collector = Collector::start("nobody", &[]);
    let fixtures = TwoFixtures::start("4");
    let port = free_port();
    let mut cmd = rtrace_integration_tests::as_nobody(&bin, ",+bpf,+perfmon");
    cmd.args([
        "exporter",
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--collectors",
        "none",
        "--profile",
        "--profile-frequency",
        "99",
        "--profile-period",
        "2",
        "--otlp-endpoint",
        &collector.endpoint(),
    ]);
    let rtrace = Rtrace::start_command(cmd, "Profiling all CPUs");
    let (c_pid, p_pid) = (fixtures.c.pid(), fixtures.python.pid());
    let both = fixtures.run();
    let (code, _, stderr) = rtrace.stop(SIGTERM);
    assert_eq!(code, 0, "{stderr}");
    let procs = processes(&collector.received());
    // Root's processes: their names from the kernel's comm, as their
    // executables' links are not nobody's to read; their frames as root
    // names them.
    let cp = split(&procs, c_pid, &both.0, ["leaf_alpha", "leaf_beta"], "mid");
    assert_eq!(cp.resource["process.executable.name"], "cfuncs_nofp");
    assert!(!cp.resource.contains_key("process.executable.path"));
    python_split(&procs, p_pid, &both.1);
}

/// A CA and a certificate for 127.0.0.1 it signed, made with openssl in
/// `dir`: the CA's file, and the server's certificate and key files.
fn certificates(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    std::fs::create_dir_all(dir).unwrap();
    let openssl = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("openssl (Debian package openssl; cargo xtask installs it)");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
    ];
    openssl(
        &[
            &["req", "-x509"][..],
            &ec,
            &[
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
                "-days",
                "2",
                "-subj",
                "/CN=rtrace test CA",
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign",
            ],
        ]
        .concat(),
    );
    openssl(
        &[
            &["req"][..],
            &ec,
            &[
                "-keyout",
                "server.key",
                "-out",
                "server.csr",
                "-subj",
                "/CN=127.0.0.1",
            ],
        ]
        .concat(),
    );
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    openssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "2",
        "-extfile",
        "server.ext",
    ]);
    (
        dir.join("ca.pem"),
        dir.join("server.pem"),
        dir.join("server.key"),
    )
}

#[test]
fn https_and_grpc_over_tls_reach_the_collector_that_the_ca_vouches_for() {
    if skip() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("rtrace-otlp-tls-{}", std::process::id()));
    let (ca, cert, key) = certificates(&dir);
    let tls = Some((cert.as_path(), key.as_path()));
    let http = Collector::start_with("https", &[], "http", tls);
    let grpc = Collector::start_with("grpcs", &[], "grpc", tls);
    let ca = ca.to_str().unwrap();
    let https = |c: &Collector| format!("https://127.0.0.1:{}", c.port);
    let trusted = [("OTEL_EXPORTER_OTLP_CERTIFICATE", ca)];
    let (a, a_port) = profiling(&https(&http), 99, 1, &[], &trusted);
    let (b, b_port) = profiling(
        &https(&grpc),
        99,
        1,
        &[],
        &[
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", ca),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ],
    );
    // Without the CA: the system's CAs do not vouch for this server.
    let (u, u_port) = profiling(
        &https(&http),
        99,
        1,
        &[],
        &[("OTEL_EXPORTER_OTLP_TIMEOUT", "1000")],
    );
    let sent = |port| {
        value(
            &Client::connect(port).metrics(),
            "rtrace_otlp_samples_sent_total",
        )
    };
    until(15, "profiles over https and gRPC with TLS", || {
        sent(a_port) > 0.0 && sent(b_port) > 0.0
    });
    until(15, "the untrusted server refused", || {
        let m = Client::connect(u_port).metrics();
        value(&m, "rtrace_otlp_send_failures_total") >= 1.0
    });
    let m = Client::connect(u_port).metrics();
    let mut said = String::new();
    for r in [a, b, u] {
        let (code, _, stderr) = r.stop(SIGTERM);
        assert_eq!(code, 0, "{stderr}");
        said = stderr;
    }
    // The untrusted one says why, once.
    assert_eq!(said.matches("cannot send profiles").count(), 1, "{said}");
    assert!(said.contains("certificate"), "{said}");
    assert!(samples_written(&http) > 0 && samples_written(&grpc) > 0);
    assert_eq!(value(&m, "rtrace_otlp_samples_sent_total"), 0.0, "{m}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn time_off_the_cpu_above_the_threshold_is_shipped_as_measured() {
    if skip() {
        return;
    }
    let collector = Collector::start("offcpu", &[]);
    // sleep_alpha blocks 3 ms at a time, wait_beta 1 ms: above a 2 ms
    // threshold only the sleeps count, and those of the waits that took
    // 2 ms or more (none on a quick machine).
    let (mut c, line) =
        Workload::start("cfuncs_nofp", &["block".into(), "2".into(), "2000".into()]);
    assert!(line.starts_with("ready"), "{line}");
    let (r, _) = profiling(
        &collector.endpoint(),
        99,
        1,
        &["--profile-off-cpu", "--profile-min-block", "2000"],
        &[],
    );
    let pid = c.pid();
    let done: Vec<i64> = c
        .go()
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    c.wait();
    let (code, _, stderr) = r.stop(SIGTERM);
    assert_eq!(code, 0, "{stderr}");
    let procs = processes(&collector.received());
    let p = procs.get(&pid).expect("a profile of the fixture");
    let off = |leaf: &str| -> i64 {
        p.off
            .iter()
            .filter(|(n, _)| n.iter().any(|f| f == leaf))
            .map(|(_, ns)| ns)
            .sum::<i64>()
            / 1000
    };
    let (alpha, beta) = (off("sleep_alpha"), off("wait_beta"));
    let (alpha_wall, long_waits, sleeps) = (done[4] / 1000, done[3] / 1000, done[6]);
    // A microsecond a call for the two clocks' rounding.
    assert!(
        alpha >= sleeps * 3000 - sleeps && alpha <= alpha_wall + sleeps,
        "{alpha} us off the CPU in sleep_alpha: {sleeps} sleeps of 3 ms took {alpha_wall} us"
    );
    assert!(
        beta <= long_waits + sleeps,
        "{beta} us of wait_beta above 2 ms; its waits of 2 ms or more took {long_waits} us"
    );
    assert!(
        p.off
            .iter()
            .any(|(n, _)| n.windows(2).any(|w| w == ["sleep_alpha", "mid_block"])),
        "whole chains off the CPU"
    );
}

//! `cargo xtask bench exporter`: what the exporter's collectors cost next to
//! the tools they come from, on the same workloads in the same run, and
//! what a scrape costs next to Prometheus' own node exporter.

use std::{
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::TcpStream,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use super::{
    Ready, Row, Setup, TRIALS, cpu_ns,
    helpers::{IO_READS, IO_WRITES, Loop, ROUNDS, direct_io, pingpong},
    print_costs, trials,
};

/// Scrapes timed one after another, for the CPU time per scrape.
const SCRAPES: usize = 2_000;
/// Concurrent scrapers, and scrapes each, for the latency under load.
const SCRAPERS: usize = 10;
const EACH: usize = 200;

/// An exporter setup on an ephemeral port with `args`.
fn exporter(rtrace: &std::path::Path, label: &str, args: &[&str]) -> Setup {
    let mut all = vec!["exporter", "--listen", "127.0.0.1:0"];
    all.extend_from_slice(args);
    Setup::traced(label, rtrace, &all, Ready::Stderr("Serving metrics"), None)
}

/// The collectors' cost against runqlat's and biolatency's; the scrape's
/// CPU time and latency against node_exporter's. Returns the row of the
/// run-queue comparison.
pub fn run() -> anyhow::Result<Row> {
    let rtrace = crate::build()?;
    let root = crate::root();

    let runqlat = || {
        Setup::traced(
            "rtrace runqlat",
            &rtrace,
            &["runqlat"],
            Ready::Stderr("Tracing"),
            None,
        )
    };
    let setups = vec![
        Setup::bare(),
        runqlat(),
        exporter(
            &rtrace,
            "rtrace exporter --collectors runqlat",
            &["--collectors", "runqlat"],
        ),
        exporter(&rtrace, "rtrace exporter (default collectors)", &[]),
    ];
    eprintln!(
        "bench exporter: ping-pong of two threads on CPU 0, {ROUNDS} round trips, \
         median of {TRIALS} interleaved trials"
    );
    let workload = root.join("target/release/pingpong");
    let results = trials(&setups, "ns/round trip", || pingpong(&workload))?;
    let (_, bpf_ratio) = print_costs(&setups, &results, "ns/round trip");
    println!();
    println!(
        "the runqlat collector's BPF programs run {bpf_ratio:.2}x as long per round trip as \
         runqlat's (target at most 1.0x, spread {}); all four default collectors {:.2}x \
         (only runqlat's programs run in a ping-pong)",
        spread_note(&results, 2, 1),
        results[3].bpf_ns / results[1].bpf_ns
    );
    let row = Row::new(
        "exporter",
        format!("ping-pong on one CPU, {ROUNDS} round trips (vs rtrace runqlat)"),
        "ns/round trip",
        (&setups, &results),
        (2, 1),
        None,
    );

    let dev = Loop::new()?;
    let io = vec![
        Setup::bare(),
        Setup::traced(
            "rtrace biolatency -D -F",
            &rtrace,
            &["biolatency", "-D", "-F"],
            Ready::Stderr("Tracing"),
            None,
        ),
        exporter(
            &rtrace,
            "rtrace exporter --collectors biolatency",
            &["--collectors", "biolatency"],
        ),
        exporter(&rtrace, "rtrace exporter (default collectors)", &[]),
        runqlat(),
    ];
    let total = IO_READS + IO_WRITES;
    eprintln!(
        "bench exporter: {total} direct 4 KiB I/Os on {}, median of {TRIALS} interleaved trials",
        dev.0
    );
    let directio = root.join("target/release/directio");
    let results = trials(&io, "ns/io", || direct_io(&directio, &dev.0))?;
    let (_, bpf_ratio) = print_costs(&io, &results, "ns/io");
    println!();
    // Direct I/O switches context at every request, so runqlat's programs
    // run too: the default set is judged against both tools.
    let tools = results[1].bpf_ns + results[4].bpf_ns;
    println!(
        "the biolatency collector's BPF programs run {bpf_ratio:.2}x as long per I/O as \
         biolatency -D -F's, whose histograms by disk and flags it keeps (target at most 1.0x, \
         spread {}); all four default collectors {:.2}x biolatency -D -F and runqlat together",
        spread_note(&results, 2, 1),
        results[3].bpf_ns / tools
    );

    scrapes(&rtrace)?;
    let fleet = profiling(&rtrace)?;
    super::update_doc("fleet", &fleet)?;
    Ok(row)
}

/// The fleet profiles' case alone (`cargo xtask bench fleet`): its table.
pub fn fleet() -> anyhow::Result<String> {
    profiling(&crate::build()?)
}

/// Seconds each trial of the profiling case measures, after its warm-up.
const MEASURED_SECS: u64 = 20;
/// Seconds before the measure: past the first profile shipped, so that
/// what a long-running profiler does once (reading the files of the
/// host's processes and their debug information, compiling their CFI)
/// is not counted as its steady cost.
const WARM_SECS: u64 = 12;
/// Trials of the profiling case, interleaved.
const FLEET_TRIALS: usize = 3;

/// Two busy Python processes, running until killed.
struct Busy(Vec<std::process::Child>);

impl Busy {
    fn start() -> anyhow::Result<Self> {
        let kids = (0..2)
            .map(|_| {
                Command::new("/usr/bin/python3")
                    .args(["-c", "while True: pass"])
                    .spawn()
            })
            .collect::<Result<_, _>>()
            .context("cannot start python3")?;
        Ok(Self(kids))
    }

    /// The CPU time the two have had, in nanoseconds.
    fn cpu_ns(&self) -> u64 {
        self.0.iter().map(|k| cpu_ns(k.id())).sum()
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        for k in &mut self.0 {
            let _ = k.kill();
            let _ = k.wait();
        }
    }
}

/// One setup's steady cost over a measured window.
#[derive(Default)]
struct Steady {
    /// The profiler's threads' CPU time, per wall nanosecond.
    own: Vec<f64>,
    /// Its BPF programs' run time, per wall nanosecond.
    bpf: Vec<f64>,
    /// The busy processes' CPU time, per wall nanosecond (2.0 at most).
    busy: Vec<f64>,
    /// Resident memory and its heap, KiB, at the end of the window.
    rss: Vec<(u64, u64)>,
    /// Its BPF maps' kernel memory, KiB, at the end of the window.
    maps: Vec<u64>,
}

/// `exporter --profile` at 19 Hz shipping to the real Collector beside two
/// busy processes, against `perf record -F 19 -a -g` writing a file, and
/// bare: the profiler's CPU (its threads and its BPF programs) as a share
/// of one CPU in the steady state, its resident memory, and the CPU the
/// busy processes lost. Returns the table for docs/benchmarks.md.
fn profiling(rtrace: &std::path::Path) -> anyhow::Result<String> {
    let collector = crate::otelcol::Running::start(&crate::otelcol::install()?, "bench")?;
    let endpoint = format!("http://127.0.0.1:{}", collector.port);
    let data = std::env::temp_dir().join(format!("rtrace-bench-perf-{}.data", std::process::id()));
    let data = data.to_str().context("temp path is not UTF-8")?.to_owned();
    let setups = [
        Setup::bare(),
        Setup::traced(
            "perf record -F 19 -a -g",
            "perf",
            &["record", "-F", "19", "-a", "-g", "-q", "-o", &data],
            Ready::After(Duration::from_secs(1)),
            None,
        ),
        exporter(
            rtrace,
            "rtrace exporter --profile",
            &[
                "--collectors",
                "none",
                "--profile",
                "--otlp-endpoint",
                &endpoint,
            ],
        ),
    ];
    eprintln!(
        "bench exporter: two busy Python processes, profiled at 19 Hz: {WARM_SECS} s to warm \
         up, then {MEASURED_SECS} s measured; {FLEET_TRIALS} interleaved trials"
    );
    let _stats = aya::sys::enable_stats(aya::sys::Stats::RunTime)
        .context("cannot turn on BPF run-time statistics")?;
    let mut steady: Vec<Steady> = setups.iter().map(|_| Steady::default()).collect();
    for trial in 0..FLEET_TRIALS {
        for (i, s) in setups.iter().enumerate() {
            let busy = Busy::start()?;
            let tracer = s.start.as_ref().map(|f| f()).transpose()?;
            std::thread::sleep(Duration::from_secs(WARM_SECS));
            let pid = tracer.as_ref().map(|t| t.child.id());
            let own0 = pid.map_or(0, cpu_ns);
            let (bpf0, busy0, t0) = (super::bpf_run_ns(), busy.cpu_ns(), Instant::now());
            std::thread::sleep(Duration::from_secs(MEASURED_SECS));
            let wall = t0.elapsed().as_nanos() as f64;
            let own = pid.map_or(0, cpu_ns).saturating_sub(own0) as f64 / wall;
            let bpf = super::bpf_run_ns().saturating_sub(bpf0) as f64 / wall;
            let used = busy.cpu_ns().saturating_sub(busy0) as f64 / wall;
            drop(busy);
            if let Some(t) = tracer {
                let stopped = t.stop()?;
                steady[i].rss.push(stopped.rss_kib);
                steady[i].maps.push(stopped.maps_kib);
            }
            eprintln!(
                "  trial {}: {:<32} own {:.3} %, bpf {:.3} %, busy loops {:.3} CPUs",
                trial + 1,
                s.label,
                own * 100.0,
                bpf * 100.0,
                used
            );
            steady[i].own.push(own);
            steady[i].bpf.push(bpf);
            steady[i].busy.push(used);
        }
    }
    // perf keeps the file of each run before the last as `.old`.
    let _ = std::fs::remove_file(&data);
    let _ = std::fs::remove_file(format!("{data}.old"));
    let med = |v: &[f64]| super::median(v.to_vec());
    let pct = |v: f64| v * 100.0;
    let (bare, perf, r) = (&steady[0], &steady[1], &steady[2]);
    let cpu: Vec<f64> = r.own.iter().zip(&r.bpf).map(|(a, b)| a + b).collect();
    let (lo, hi) = super::spread(&cpu);
    let rss_max = r.rss.iter().map(|x| x.0).max().unwrap_or(0);
    let anon_max = r.rss.iter().map(|x| x.1).max().unwrap_or(0);
    let maps_max = r.maps.iter().copied().max().unwrap_or(0);
    let lost = |s: &Steady| (1.0 - med(&s.busy) / med(&bare.busy)) * 100.0;
    let cpu_met = pct(med(&cpu)) <= 0.5;
    let mem_met = rss_max <= 64 * 1024;
    let table = format!(
        "{} (median of {FLEET_TRIALS} interleaved trials, each {MEASURED_SECS} s measured after \
         {WARM_SECS} s of warm-up, two busy Python processes on the two CPUs, profiles shipped \
         every 10 s to the real Collector 0.152):\n\n\
         | profiler | its CPU, % of one CPU | of it, BPF | resident memory | its BPF maps, in the kernel | busy processes' CPU against bare |\n\
         | --- | --- | --- | --- | --- | --- |\n\
         | `rtrace exporter --profile` (19 Hz) | {:.3} % ({:.3}-{:.3}) | {:.3} % | {:.1} MiB (heap {:.1} MiB) | {:.1} MiB | {:+.2} % |\n\
         | `perf record -F 19 -a -g` | {:.3} % (its own threads only) | (none) | | | {:+.2} % |\n\n\
         The goal is at most 0.5 % of one CPU and 64 MiB resident with the buffer empty: CPU \
         {}, memory {}. rtrace's CPU is its threads' run time (schedstat) and its BPF \
         programs' (the kernel's statistics) over the wall time; perf's sampling in the \
         kernel is in neither figure, so perf's row is a floor. Resident memory is the \
         highest at the end of a trial (VmRSS, the event buffers' mapped pages included). \
         The BPF maps' kernel memory (their fdinfo's `memlock`; the CFI tables above all) \
         is the host's as well, apart from the resident memory: rtrace maps the tables only \
         for the moment it writes them. The warm-up is not free: the \
         first profile names every file the host's processes map, and reads their debug \
         information (libc6-dbg's here), once.\n",
        super::measured_on("exporter"),
        pct(med(&cpu)),
        pct(lo),
        pct(hi),
        pct(med(&r.bpf)),
        rss_max as f64 / 1024.0,
        anon_max as f64 / 1024.0,
        maps_max as f64 / 1024.0,
        -lost(r),
        pct(med(&perf.own)),
        -lost(perf),
        if cpu_met { "met" } else { "missed" },
        if mem_met { "met" } else { "missed" },
    );
    println!("\n{table}");
    Ok(table)
}

/// The range of setup `a`'s BPF time over setup `b`'s median, over the
/// trials.
fn spread_note(results: &[super::Outcome], a: usize, b: usize) -> String {
    let (lo, hi) = results[a].bpf_spread;
    let m = results[b].bpf_ns;
    format!("{:.2}-{:.2}x", lo / m, hi / m)
}

/// A server of `/metrics` started for the scrape figures.
struct Server {
    child: std::process::Child,
    port: u16,
}

impl Server {
    fn rtrace(bin: &std::path::Path) -> anyhow::Result<Self> {
        let mut child = Command::new(bin)
            .args(["exporter", "--listen", "127.0.0.1:0"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        let mut line = String::new();
        BufReader::new(child.stderr.take().unwrap()).read_line(&mut line)?;
        let port = line
            .split("http://127.0.0.1:")
            .nth(1)
            .and_then(|r| r.split('/').next())
            .and_then(|p| p.parse().ok())
            .with_context(|| format!("no address in {line:?}"))?;
        Ok(Self { child, port })
    }

    fn node_exporter() -> anyhow::Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let child = Command::new("prometheus-node-exporter")
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("cannot start prometheus-node-exporter (Debian package of that name)")?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                bail!("node_exporter did not listen");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(Self { child, port })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

/// One keep-alive connection's `GET /metrics`: the body's length.
fn scrape(conn: &mut BufReader<TcpStream>) -> anyhow::Result<usize> {
    conn.get_mut()
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")?;
    let mut line = String::new();
    let mut len = None;
    let mut chunked = false;
    loop {
        line.clear();
        conn.read_line(&mut line)?;
        let l = line.trim_end().to_ascii_lowercase();
        if l.is_empty() {
            break;
        }
        if let Some(v) = l.strip_prefix("content-length:") {
            len = v.trim().parse().ok();
        }
        chunked |= l.starts_with("transfer-encoding:") && l.contains("chunked");
    }
    if let Some(n) = len {
        let mut body = vec![0; n];
        conn.read_exact(&mut body)?;
        return Ok(n);
    }
    if !chunked {
        bail!("a response with neither length nor chunks");
    }
    let mut total = 0;
    loop {
        line.clear();
        conn.read_line(&mut line)?;
        let n = usize::from_str_radix(line.trim(), 16)?;
        let mut chunk = vec![0; n + 2];
        conn.read_exact(&mut chunk)?;
        total += n;
        if n == 0 {
            return Ok(total);
        }
    }
}

fn connect(port: u16) -> anyhow::Result<BufReader<TcpStream>> {
    let s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.set_nodelay(true)?;
    Ok(BufReader::new(s))
}

/// A server's figures: CPU time per scrape, body size, and latencies
/// under concurrent scrapers (p50, p99, max).
struct ScrapeFigures {
    cpu_us: f64,
    bytes: usize,
    p50_us: f64,
    p99_us: f64,
    max_us: f64,
}

fn measure(server: &Server) -> anyhow::Result<ScrapeFigures> {
    let mut conn = connect(server.port)?;
    for _ in 0..100 {
        scrape(&mut conn)?;
    }
    let before = cpu_ns(server.child.id());
    let mut bytes = 0;
    for _ in 0..SCRAPES {
        bytes = scrape(&mut conn)?;
    }
    let cpu_us = (cpu_ns(server.child.id()) - before) as f64 / SCRAPES as f64 / 1e3;
    let mut latencies: Vec<f64> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..SCRAPERS)
            .map(|_| {
                s.spawn(move || -> anyhow::Result<Vec<f64>> {
                    let mut conn = connect(server.port)?;
                    (0..EACH)
                        .map(|_| {
                            let t = Instant::now();
                            scrape(&mut conn)?;
                            Ok(t.elapsed().as_secs_f64() * 1e6)
                        })
                        .collect()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect::<anyhow::Result<Vec<Vec<f64>>>>()
    })?
    .into_iter()
    .flatten()
    .collect();
    latencies.sort_by(f64::total_cmp);
    let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q) as usize];
    Ok(ScrapeFigures {
        cpu_us,
        bytes,
        p50_us: at(0.5),
        p99_us: at(0.99),
        max_us: at(1.0),
    })
}

/// CPU time and latency of scrapes of rtrace's default collectors and of
/// node_exporter's default collectors, each measured in turn.
fn scrapes(rtrace: &std::path::Path) -> anyhow::Result<()> {
    eprintln!(
        "bench exporter: {SCRAPES} scrapes one after another, then {SCRAPERS} scrapers of \
         {EACH} each at once"
    );
    let mut rows = Vec::new();
    for round in 0..3 {
        let ours = measure(&Server::rtrace(rtrace)?)?;
        let peer = measure(&Server::node_exporter()?)?;
        eprintln!(
            "  round {}: rtrace {:.0} us CPU, p99 {:.0} us; node_exporter {:.0} us CPU, p99 {:.0} us",
            round + 1,
            ours.cpu_us,
            ours.p99_us,
            peer.cpu_us,
            peer.p99_us
        );
        rows.push((ours, peer));
    }
    let med = |f: &dyn Fn(&(ScrapeFigures, ScrapeFigures)) -> f64| {
        let mut v: Vec<f64> = rows.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        (v[v.len() / 2], v[0], v[v.len() - 1])
    };
    println!();
    println!(
        "{:<36} {:>16} {:>10} {:>16} {:>16} {:>10}",
        "server", "CPU us/scrape", "bytes", "p50 us (10 conc)", "p99 us (10 conc)", "max us"
    );
    for (name, pick) in [
        ("rtrace exporter (default collectors)", 0usize),
        ("prometheus-node-exporter (defaults)", 1),
    ] {
        fn get(r: &(ScrapeFigures, ScrapeFigures), pick: usize) -> &ScrapeFigures {
            if pick == 0 { &r.0 } else { &r.1 }
        }
        let cpu = med(&|r| get(r, pick).cpu_us);
        let p50 = med(&|r| get(r, pick).p50_us);
        let p99 = med(&|r| get(r, pick).p99_us);
        let max = med(&|r| get(r, pick).max_us);
        println!(
            "{name:<36} {:>16} {:>10} {:>16.0} {:>16} {:>10.0}",
            format!("{:.0} ({:.0}-{:.0})", cpu.0, cpu.1, cpu.2),
            get(&rows[0], pick).bytes,
            p50.0,
            format!("{:.0} ({:.0}-{:.0})", p99.0, p99.1, p99.2),
            max.0
        );
    }
    let cpu = med(&|r| r.0.cpu_us / r.1.cpu_us);
    let p99 = med(&|r| r.0.p99_us / r.1.p99_us);
    println!(
        "a scrape of rtrace costs {:.2}x the CPU time of node_exporter's (range {:.2}-{:.2}); \
         p99 latency under {SCRAPERS} scrapers {:.2}x (range {:.2}-{:.2})",
        cpu.0, cpu.1, cpu.2, p99.0, p99.1, p99.2
    );
    Ok(())
}

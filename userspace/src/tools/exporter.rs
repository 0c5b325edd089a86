//! `rtrace exporter`: the tools' histograms and counters as Prometheus
//! metrics, for fleets.
//!
//! Each collector is a tool ([`Tool::COLLECTOR`]) attached once through
//! the same [`Session`] the tools run in. Nothing per event crosses to
//! user space: histogram tools keep their cumulative maps, and event tools
//! tally in the kernel what their events would have said. A scrape reads
//! the maps into running 64-bit totals and writes them out; so does a
//! timer between scrapes, so that the kernel's 32-bit slots never wrap
//! unseen and a stuck scraper holds nothing up. Everything runs on the
//! one thread of the runtime: a scrape's reading is a few map lookups,
//! and its writing to a slow peer waits without blocking the others.

use std::{
    cell::RefCell,
    net::SocketAddr,
    path::{Path, PathBuf},
    rc::Rc,
    time::Duration,
};

use anyhow::Context as _;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode, body::Bytes, header};

use crate::{
    kernel::load::read_errors,
    output::{
        metrics::{Exposition, Format, Kind},
        otlp::ship::{Dropped, Shipper},
    },
    tracer::{Collect, Collector, GlobalArgs, Session, Signals},
};

mod profiler;

/// Serve the tools' histograms and counters as Prometheus metrics.
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:
  rtrace exporter                                  # the default collectors on 127.0.0.1:9435
  rtrace exporter --listen 0.0.0.0:9435            # for a Prometheus on another host
  rtrace exporter --collectors runqlat,biolatency  # these only
  rtrace exporter -c /sys/fs/cgroup/system.slice/nginx.service
  rtrace exporter --profile --otlp-endpoint http://collector:4318   # and the host's CPU profile

Metrics (base units, cumulative since the exporter started):
  rtrace_runqueue_latency_seconds               histogram (runqlat)
  rtrace_block_io_latency_seconds{disk,op}      histogram (biolatency)
  rtrace_execs_total                            counter (execsnoop)
  rtrace_tcp_sessions_closed_total              counter (tcplife)
  rtrace_tcp_bytes_total{direction}             counter (tcplife)
and the exporter's own: rtrace_collector_up, rtrace_events_lost_total,
rtrace_map_update_failures_total, rtrace_bpf_program_run_seconds_total and
rtrace_bpf_program_runs_total (with sysctl kernel.bpf_stats_enabled=1),
rtrace_build_info; with --profile, rtrace_otlp_samples_sent_total,
rtrace_otlp_samples_dropped_total{reason}, rtrace_otlp_requests_sent_total,
rtrace_otlp_send_failures_total and rtrace_otlp_queued_bytes.")]
pub struct Args {
    /// Say which attach mechanism each collector chose, and why others
    /// were skipped.
    #[arg(short, long)]
    verbose: bool,
    /// Keep per-thread state in hash maps even where the kernel has task
    /// local storage, which is cheaper (for comparison and testing).
    #[arg(long)]
    no_task_storage: bool,
    /// Address and port to serve `GET /metrics` on.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9435")]
    listen: SocketAddr,
    /// Collectors to run, separated by commas (default: every collector;
    /// each costs no more than the tool it comes from); `none` for none,
    /// with --profile.
    #[arg(long, value_name = "NAMES", value_delimiter = ',')]
    collectors: Vec<String>,
    /// Count only tasks in this cgroup v2 directory, or below it (for the
    /// collectors that can tell: runqlat, biolatency and execsnoop).
    #[arg(short = 'c', long, value_name = "CGROUP")]
    cgroup: Option<PathBuf>,
    #[command(flatten)]
    profile: profiler::ProfileArgs,
}

/// How the exporter attaches one collector.
type Open = fn(Option<&Path>, &GlobalArgs) -> anyhow::Result<Box<dyn Running>>;

/// A collector the exporter can run: a tool and how to open it.
pub struct Entry {
    /// The collector's (and tool's) name.
    pub name: &'static str,
    /// How the tool runs as a collector.
    pub collector: Collector,
    open: Open,
}

impl Entry {
    /// The entry of tool `T`.
    pub fn of<T: Collect + 'static>() -> Self {
        Self {
            name: T::SPEC.name,
            collector: T::COLLECTOR,
            open: open::<T>,
        }
    }
}

/// Attaches tool `T` as a collector, built as one (its typed arguments,
/// the exporter's cgroup where it can count by it).
fn open<T: Collect + 'static>(
    cgroup: Option<&Path>,
    global: &GlobalArgs,
) -> anyhow::Result<Box<dyn Running>> {
    let tool = T::collector(cgroup.filter(|_| T::COLLECTOR.scoped))?;
    let plan = tool.plan();
    let scope = plan.scope.clone();
    let session = Session::open(tool, plan, &scope, global, Some(T::COLLECTOR.tallies))?;
    Ok(Box::new(session))
}

/// A collector attached, as the exporter uses it.
pub trait Running {
    /// Reads its maps into running totals.
    fn refresh(&mut self) -> anyhow::Result<()>;
    /// Writes its metrics.
    fn metrics(&self, out: &mut Exposition);
    /// Events lost and map updates that failed, so far.
    fn losses(&self) -> anyhow::Result<(u64, u64)>;
    /// Each program's name, run time and runs (the kernel's statistics).
    fn programs(&self) -> Vec<(String, Duration, u64)>;
    /// The `-v` report.
    fn report(&self);
}

impl<T: Collect> Running for Session<T> {
    fn refresh(&mut self) -> anyhow::Result<()> {
        self.tool.refresh(&self.ebpf)
    }

    fn metrics(&self, out: &mut Exposition) {
        self.tool.metrics(out);
    }

    fn losses(&self) -> anyhow::Result<(u64, u64)> {
        let counts = read_errors(&self.ebpf, T::SPEC.errors.len())?;
        // An event tool's first slot is events lost to a full buffer;
        // every other slot of every tool is a table that was full.
        let events = self.events.is_some();
        let lost = if events {
            counts.first().copied().unwrap_or(0)
        } else {
            0
        };
        let failed = counts.iter().skip(usize::from(events)).sum();
        Ok((lost, failed))
    }

    fn programs(&self) -> Vec<(String, Duration, u64)> {
        self.ebpf
            .programs()
            .filter_map(|(name, p)| {
                let info = p.info().ok()?;
                Some((name.to_owned(), info.run_time(), info.run_count()))
            })
            .collect()
    }

    fn report(&self) {
        Session::report(self);
    }
}

/// The collectors, as attached or as failed.
struct Collectors {
    up: Vec<(&'static str, Box<dyn Running>)>,
    down: Vec<&'static str>,
    /// When free heap pages were last handed back.
    trimmed: std::time::Instant,
    /// The profiles' queue, with `--profile`.
    shipper: Option<Shipper>,
}

impl Collectors {
    /// Reads every collector's maps; one that fails says so and keeps
    /// its last totals.
    fn refresh(&mut self) {
        for (name, c) in &mut self.up {
            if let Err(e) = c.refresh() {
                eprintln!("rtrace: exporter: {name}: cannot read its maps: {e:#}");
            }
        }
    }

    fn render(&mut self, format: Format) -> String {
        self.refresh();
        let mut out = Exposition::new(format);
        for (_, c) in &self.up {
            c.metrics(&mut out);
        }
        let mut up = out.family(
            "rtrace_collector_up",
            Kind::Gauge,
            "Whether the collector attached (1) or could not on this kernel (0).",
        );
        for (name, _) in &self.up {
            up.value(&[("collector", name)], 1.0);
        }
        for name in &self.down {
            up.value(&[("collector", name)], 0.0);
        }
        let losses: Vec<(&str, (u64, u64))> = self
            .up
            .iter()
            .filter_map(|(n, c)| Some((*n, c.losses().ok()?)))
            .collect();
        let mut lost = out.family(
            "rtrace_events_lost_total",
            Kind::Counter,
            "Events the kernel side could not send (buffer full).",
        );
        for (name, (l, _)) in &losses {
            lost.value(&[("collector", name)], *l as f64);
        }
        let mut failed = out.family(
            "rtrace_map_update_failures_total",
            Kind::Counter,
            "Map updates that failed (a table full): what they would have counted is missing.",
        );
        for (name, (_, f)) in &losses {
            failed.value(&[("collector", name)], *f as f64);
        }
        if bpf_stats_enabled() {
            let programs: Vec<(&str, String, Duration, u64)> = self
                .up
                .iter()
                .flat_map(|(n, c)| c.programs().into_iter().map(move |(p, t, r)| (*n, p, t, r)))
                .collect();
            let mut time = out.family(
                "rtrace_bpf_program_run_seconds_total",
                Kind::Counter,
                "Time the collector's BPF programs ran (kernel.bpf_stats_enabled).",
            );
            for (c, p, t, _) in &programs {
                time.value(&[("collector", c), ("program", p)], t.as_secs_f64());
            }
            let mut runs = out.family(
                "rtrace_bpf_program_runs_total",
                Kind::Counter,
                "Times the collector's BPF programs ran (kernel.bpf_stats_enabled).",
            );
            for (c, p, _, r) in &programs {
                runs.value(&[("collector", c), ("program", p)], *r as f64);
            }
        }
        if let Some(shipper) = &self.shipper {
            otlp_metrics(&mut out, shipper);
        }
        out.family(
            "rtrace_build_info",
            Kind::Gauge,
            "The rtrace build: version, git commit and aya version.",
        )
        .value(
            &[
                ("version", env!("CARGO_PKG_VERSION")),
                ("commit", env!("RTRACE_COMMIT")),
                ("aya", env!("RTRACE_AYA")),
            ],
            1.0,
        );
        let body = out.finish();
        // glibc hands out the free chunks set-up left scattered through
        // the heap, each touching a page it had given back; handing free
        // pages back once a second keeps resident memory at what scrapes
        // use (measured in the guests: 1.8 MiB more over 2000 scrapes
        // without it).
        if self.trimmed.elapsed() >= Duration::from_secs(1) {
            crate::kernel::memory::release_free();
            self.trimmed = std::time::Instant::now();
        }
        body
    }
}

/// The profiles' shipping, as metrics.
fn otlp_metrics(out: &mut Exposition, shipper: &Shipper) {
    let st = shipper.stats();
    out.family(
        "rtrace_otlp_samples_sent_total",
        Kind::Counter,
        "Profile samples the OTLP receiver took.",
    )
    .value(&[], st.samples_sent as f64);
    let mut dropped = out.family(
        "rtrace_otlp_samples_dropped_total",
        Kind::Counter,
        "Profile samples dropped: the queue full (buffer_full), refused by the receiver \
         (rejected), or still queued when the exporter stopped (shutdown).",
    );
    for (reason, n) in Dropped::ALL.iter().zip(st.samples_dropped) {
        dropped.value(&[("reason", reason.label())], n as f64);
    }
    out.family(
        "rtrace_otlp_requests_sent_total",
        Kind::Counter,
        "OTLP export requests the receiver took.",
    )
    .value(&[], st.requests_sent as f64);
    out.family(
        "rtrace_otlp_send_failures_total",
        Kind::Counter,
        "Sends that failed (receiver down, slow or busy) and were retried.",
    )
    .value(&[], st.failures as f64);
    out.family(
        "rtrace_otlp_queued_bytes",
        Kind::Gauge,
        "Bytes of profiles waiting to be sent.",
    )
    .value(&[], st.queued_bytes as f64);
}

/// Whether the kernel keeps BPF programs' run time and count.
fn bpf_stats_enabled() -> bool {
    std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled").is_ok_and(|s| s.trim() == "1")
}

/// How often the maps are read between scrapes: far within the hour a
/// 32-bit slot takes to wrap at a million events a second.
const REFRESH: Duration = Duration::from_secs(10);

/// Runs the exporter until SIGINT, SIGTERM or SIGHUP.
impl Args {
    /// The flags of the tools that the exporter takes too.
    pub fn global(&self) -> GlobalArgs {
        GlobalArgs {
            verbose: self.verbose,
            no_task_storage: self.no_task_storage,
            json: false,
        }
    }
}

pub async fn run(args: Args, global: &GlobalArgs, all: Vec<Entry>) -> anyhow::Result<()> {
    let chosen: Vec<&Entry> = if args.collectors.is_empty() {
        all.iter().filter(|e| e.collector.default).collect()
    } else if args.collectors == ["none"] {
        if !args.profile.profile {
            anyhow::bail!("--collectors none leaves nothing to export without --profile");
        }
        Vec::new()
    } else {
        let mut chosen = Vec::new();
        for name in &args.collectors {
            let entry = all.iter().find(|e| e.name == name).with_context(|| {
                let names: Vec<&str> = all.iter().map(|e| e.name).collect();
                format!(
                    "no collector '{name}'; the collectors are {}",
                    names.join(", ")
                )
            })?;
            if !chosen.iter().any(|e: &&Entry| e.name == entry.name) {
                chosen.push(entry);
            }
        }
        chosen
    };
    let chosen_none = chosen.is_empty();
    if let Some(cg) = &args.cgroup {
        // Checked once here rather than failing every collector.
        std::fs::metadata(cg).with_context(|| format!("cannot use cgroup {}", cg.display()))?;
    }
    crate::kernel::privs::check()?;
    // Its endpoint is checked before anything is attached.
    let profiler = if args.profile.profile {
        Some(<profiler::Profiler as crate::tracer::Tool>::new(
            args.profile.clone(),
        )?)
    } else {
        None
    };
    // The port first: a port in use is found before anything is attached.
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;

    let mut collectors = Collectors {
        up: Vec::new(),
        down: Vec::new(),
        trimmed: std::time::Instant::now(),
        shipper: profiler.as_ref().map(profiler::Profiler::shipper),
    };
    for entry in chosen {
        match (entry.open)(args.cgroup.as_deref(), global) {
            Ok(c) => {
                if global.verbose {
                    c.report();
                }
                collectors.up.push((entry.name, c));
            }
            Err(e) => {
                eprintln!("rtrace: exporter: {}: not collecting: {e:#}", entry.name);
                collectors.down.push(entry.name);
            }
        }
    }
    if collectors.up.is_empty() && !chosen_none {
        anyhow::bail!("no collector could attach on this kernel");
    }
    let mut names: Vec<&str> = collectors.up.iter().map(|(n, _)| *n).collect();
    if names.is_empty() {
        names.push("no collectors: the profile's counters");
    }
    let collectors = Rc::new(RefCell::new(collectors));
    let mut signals = Signals::new()?;
    eprintln!(
        "Serving metrics on http://{}/metrics ({})... Hit Ctrl-C to end.",
        listener.local_addr()?,
        names.join(", ")
    );

    let shipper = collectors.borrow().shipper.clone();
    let local = tokio::task::LocalSet::new();
    local
        .run_until(async {
            // The profiler is a run of its own on this thread: it ends
            // at the same signals, shipping its last profile.
            let mut profiling = profiler.map(|p| {
                let global = global.clone();
                tokio::task::spawn_local(async move {
                    crate::tracer::run_beside(p, &global).await.map(drop)
                })
            });
            if let Some(s) = &shipper {
                tokio::task::spawn_local(s.clone().run());
            }
            let mut refresh = tokio::time::interval(REFRESH);
            refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut ended_early = None;
            loop {
                let ended = async {
                    match profiling.as_mut() {
                        Some(p) => p.await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    accepted = listener.accept() => {
                        // A failed accept (out of descriptors, say) is the
                        // peer's trouble; the exporter goes on.
                        if let Ok((stream, _)) = accepted {
                            serve(stream, Rc::clone(&collectors));
                        }
                    }
                    _ = refresh.tick() => collectors.borrow_mut().refresh(),
                    _ = signals.recv() => break,
                    done = ended => {
                        // The profiler ends only at a signal, or failing.
                        profiling = None;
                        ended_early = Some(done);
                        break;
                    }
                }
            }
            let done = match (ended_early, profiling) {
                (Some(done), _) => Some(done),
                (None, Some(p)) => Some(p.await),
                (None, None) => None,
            };
            // What it shipped is sent however it ended.
            let outcome = match done {
                Some(Ok(r)) => r.context("exporter --profile"),
                Some(Err(e)) => Err(anyhow::anyhow!("exporter --profile: {e}")),
                None => Ok(()),
            };
            if let Some(s) = &shipper {
                let queued = s.stats().queued;
                if queued > 0 {
                    eprintln!("rtrace: exporter: sending what is still queued ({queued} requests)");
                }
                s.flush(std::time::Instant::now() + s.endpoint().timeout)
                    .await;
            }
            outcome
        })
        .await
}

/// Serves one connection's requests on a task of its own.
fn serve(stream: tokio::net::TcpStream, collectors: Rc<RefCell<Collectors>>) {
    let _ = stream.set_nodelay(true);
    let io = hyper_util::rt::TokioIo::new(stream);
    let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
        let response = respond(&req, &collectors);
        async move { Ok::<_, std::convert::Infallible>(response) }
    });
    tokio::task::spawn_local(async move {
        let conn = hyper::server::conn::http1::Builder::new()
            // A peer that sends nothing for this long is let go.
            .header_read_timeout(Duration::from_secs(30))
            .timer(hyper_util::rt::TokioTimer::new())
            .serve_connection(io, service);
        let _ = conn.await;
    });
}

/// The response to one request.
fn respond<B>(req: &Request<B>, collectors: &RefCell<Collectors>) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, kind: &'static str, body: String| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = status;
        r.headers_mut()
            .insert(header::CONTENT_TYPE, header::HeaderValue::from_static(kind));
        r
    };
    match (req.method(), req.uri().path()) {
        (&hyper::Method::GET, "/metrics") => {
            let accept = req
                .headers()
                .get(header::ACCEPT)
                .and_then(|v| v.to_str().ok());
            let format = Format::negotiate(accept);
            let body = collectors.borrow_mut().render(format);
            reply(StatusCode::OK, format.content_type(), body)
        }
        (&hyper::Method::GET, "/") => reply(
            StatusCode::OK,
            "text/html; charset=utf-8",
            "<html><head><title>rtrace exporter</title></head><body>\
             <h1>rtrace exporter</h1><p><a href=\"/metrics\">Metrics</a></p></body></html>\n"
                .to_owned(),
        ),
        (&hyper::Method::GET, _) => reply(
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "not found: the metrics are at /metrics\n".to_owned(),
        ),
        _ => reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain; charset=utf-8",
            "only GET is served\n".to_owned(),
        ),
    }
}

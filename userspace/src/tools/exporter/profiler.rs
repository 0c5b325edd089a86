//! `rtrace exporter --profile`: the whole host's CPU profile, sampled
//! at a fleet's low rate and shipped as OTLP profiles every period. A
//! front-end of the engine's sampling, whose stacks it takes every
//! period ([`Sampler::take_interval`]) and hands to the OTLP output's
//! queue ([`Shipper`]); the exporter runs it beside its serving.

use std::time::Duration;

use aya::Ebpf;

use crate::{
    engine::sampling::{self, Sampler, Sampling},
    output::{
        Sink,
        otlp::{self, HostResources, ship::Shipper},
    },
    tracer::{Outcome, Plan, Scope, Spec, Tool},
};

/// The flags of continuous profiling.
#[derive(Debug, Clone, clap::Args)]
pub struct ProfileArgs {
    /// Profile the whole host's CPU continuously and ship the stacks as
    /// OTLP profiles (to --otlp-endpoint, or where
    /// OTEL_EXPORTER_OTLP_ENDPOINT and OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT
    /// say; by default http://localhost:4318), with Python frames named
    /// as `rtrace profile` names them.
    #[arg(long)]
    pub profile: bool,
    /// Samples a second on each CPU.
    #[arg(long, value_name = "HZ", default_value_t = 19, requires = "profile",
          value_parser = crate::output::at_least_one::<u64>)]
    pub profile_frequency: u64,
    /// Ship a profile every SECS seconds.
    #[arg(long, value_name = "SECS", default_value_t = 10, requires = "profile",
          value_parser = crate::output::at_least_one::<u64>)]
    pub profile_period: u64,
    /// The OTLP receiver's base URL (http://HOST:PORT; the profiles path
    /// is added), over the OTEL_EXPORTER_OTLP_* variables. Headers,
    /// compression (gzip) and the timeout come from
    /// OTEL_EXPORTER_OTLP_HEADERS, _COMPRESSION and _TIMEOUT.
    #[arg(long, value_name = "URL", requires = "profile")]
    pub otlp_endpoint: Option<String>,
    /// Also ship the time threads spend off the CPU (blocked, sleeping or
    /// waiting to run), by stack: each process then has a `cpu` and an
    /// `off_cpu` profile in nanoseconds (on-CPU samples weighted by the
    /// CPU time they stand for), as `rtrace profile --off-cpu` counts.
    #[arg(long, requires = "profile")]
    pub profile_off_cpu: bool,
    /// With --profile-off-cpu, count only waits of at least this many
    /// microseconds: the many short waits of a busy host are most of the
    /// cost and little of the time.
    #[arg(
        long,
        value_name = "MIN_US",
        default_value_t = 1000,
        requires = "profile_off_cpu"
    )]
    pub profile_min_block: u64,
    /// Most bytes of profiles held while the receiver is down, slow or
    /// refusing (a number with K, M or G): past it the oldest are
    /// dropped, and counted in rtrace_otlp_samples_dropped_total.
    #[arg(long, value_name = "SIZE", default_value = "64M", requires = "profile",
          value_parser = parse_size)]
    pub otlp_buffer: u64,
}

/// `--otlp-buffer`'s size: bytes, or with K, M or G, as every size flag.
fn parse_size(text: &str) -> Result<u64, String> {
    match crate::kernel::transport::parse_size(text) {
        crate::kernel::transport::Size::Bytes(n) if n > 0 => Ok(n),
        _ => Err(format!(
            "expected a size such as 64M, 512K or 1048576; got {text:?}"
        )),
    }
}

/// The profiler: the sampler, and the queue it ships to.
pub struct Profiler {
    sampler: Sampler,
    shipper: Shipper,
    resources: HostResources,
    /// Seconds between profiles, and the sampler's ticks since the last.
    period: u64,
    ticks: u64,
    /// When the current profile's window began, in ns since the epoch.
    window_start: u64,
    period_ns: u64,
    frequency: u64,
    off_cpu: bool,
}

impl Profiler {
    /// The queue the profiles go to.
    pub fn shipper(&self) -> Shipper {
        self.shipper.clone()
    }

    /// Ships what was sampled since the last profile.
    fn ship(&mut self, ebpf: &mut Ebpf) -> anyhow::Result<()> {
        let samples = self.sampler.take_interval(ebpf)?;
        let now = wall_ns();
        let window = otlp::Window {
            start_ns: self.window_start,
            duration_ns: now.saturating_sub(self.window_start),
            period_ns: self.period_ns,
            off_cpu: self.off_cpu,
        };
        self.window_start = now;
        if samples.is_empty() {
            return Ok(());
        }
        let total: u64 = samples.iter().map(|s| s.count).sum();
        let request = otlp::request(&samples, &window, &mut self.resources);
        self.resources.forget_unused();
        self.shipper.push(otlp::encode(&request), total);
        // What the host ran and no longer runs (a build's compilers and
        // test binaries) is forgotten with its files: what is held
        // follows what runs. Naming a period's new files reads them whole
        // at times (a Go binary's compressed sections: 35 MB for the
        // Collector's own); what was freed goes back to the system, not
        // kept for a peak that may not come again.
        self.sampler.close_unused_files();
        crate::kernel::memory::release_free();
        Ok(())
    }
}

fn wall_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

impl Tool for Profiler {
    type Args = ProfileArgs;

    const SPEC: Spec = Spec::new("exporter-profile", &[], sampling::ERRORS)
        .object(sampling::OBJECT)
        .expected(sampling::EXPECTED);

    super::super::sampling_tool!();

    fn new(args: ProfileArgs) -> anyhow::Result<Self> {
        let endpoint = otlp::ship::Endpoint::configure(args.otlp_endpoint.as_deref(), |k| {
            std::env::var(k).ok()
        })?;
        let period = Duration::from_secs(args.profile_period);
        let sampling = Sampling {
            frequency: Some(args.profile_frequency),
            off_cpu: args.profile_off_cpu,
            off_cpu_min_us: args.profile_min_block,
            preload_runtime_walks: 0,
            ..Sampling::default()
        };
        Ok(Self {
            sampler: Sampler::new(sampling)?,
            shipper: Shipper::new(endpoint, args.otlp_buffer as usize, period),
            resources: HostResources::default(),
            period: args.profile_period,
            ticks: 0,
            window_start: wall_ns(),
            period_ns: 1_000_000_000 / args.profile_frequency,
            frequency: args.profile_frequency,
            off_cpu: args.profile_off_cpu,
        })
    }

    fn banner(&self) -> String {
        format!(
            "Profiling all CPUs at {} Hz{}, shipping OTLP profiles to {} every {} s",
            self.frequency,
            if self.off_cpu {
                " and time off the CPU"
            } else {
                ""
            },
            self.shipper.endpoint().url,
            self.period
        )
    }

    fn start(&mut self) {
        self.sampler.start();
        self.window_start = wall_ns();
    }

    fn plan(&self) -> Plan {
        Plan {
            events: Some(self.sampler.events().clone()),
            scope: Scope {
                // rtrace's own sending and symbolizing are not the
                // host's work.
                exclude_self: true,
                ..Scope::default()
            },
            interval: self.sampler.interval(),
            ..Plan::default()
        }
    }

    fn tick(&mut self, ebpf: &mut Ebpf, sink: &mut Sink, last: bool) -> anyhow::Result<()> {
        self.ticks += 1;
        // The sampler's ticks are a second apart.
        if last || self.ticks.is_multiple_of(self.period) {
            return self.ship(ebpf);
        }
        self.sampler.tick(ebpf, sink, false)
    }

    fn outcome(&self) -> Outcome {
        Outcome {
            summary: self.sampler.summary(),
            warnings: self.sampler.warnings(),
        }
    }
}

//! `rtrace profile`: CPU profiling by timed sampling of stacks, as bcc's
//! profile does it, with symbolized kernel, user and JIT frames, and flame
//! graph, pprof and speedscope files.

use std::{
    collections::HashMap,
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use aya::{
    Ebpf, EbpfLoader,
    maps::HashMap as BpfHashMap,
    programs::{
        PerfEvent,
        perf_event::{HardwareEvent, PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
    },
    util::online_cpus,
};
use rtrace_common::profile::{
    Config, ERR_NAMES, FILTER_NONE, FILTER_TGID, FILTER_TID, Key, MISSED_KERNEL, MISSED_USER, Seen,
    Stack,
};

use crate::{
    GlobalArgs,
    features::Features,
    objects,
    output::{
        self, Signals,
        events::{self, BufferArgs, EventStream, Transport, report_lost},
        stacks::{self, FlameOptions, Sample, TextOptions},
    },
    privs,
    symbolize::{Frame, Kind, Symbolizer},
};

/// The events `-e` can sample on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Event {
    /// CPU time: hardware cycles where there is a PMU, else cpu-clock.
    Cpu,
    /// The software CPU clock (a timer; works everywhere).
    CpuClock,
    /// Hardware CPU cycles (needs a PMU).
    Cycles,
    /// Hardware instructions retired (needs a PMU).
    Instructions,
    /// Hardware last-level cache misses (needs a PMU).
    #[value(alias = "cache-misses")]
    LlcMisses,
    /// Page faults (software).
    PageFaults,
    /// Context switches (software).
    #[value(alias = "cs")]
    ContextSwitches,
}

impl Event {
    fn config(self) -> PerfEventConfig {
        match self {
            Self::Cpu | Self::Cycles => PerfEventConfig::Hardware(HardwareEvent::CpuCycles),
            Self::CpuClock => PerfEventConfig::Software(SoftwareEvent::CpuClock),
            Self::Instructions => PerfEventConfig::Hardware(HardwareEvent::Instructions),
            Self::LlcMisses => PerfEventConfig::Hardware(HardwareEvent::CacheMisses),
            Self::PageFaults => PerfEventConfig::Software(SoftwareEvent::PageFaults),
            Self::ContextSwitches => PerfEventConfig::Software(SoftwareEvent::ContextSwitches),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Cpu | Self::Cycles => "cycles",
            Self::CpuClock => "cpu-clock",
            Self::Instructions => "instructions",
            Self::LlcMisses => "llc-misses",
            Self::PageFaults => "page-faults",
            Self::ContextSwitches => "context-switches",
        }
    }

    fn is_hardware(self) -> bool {
        matches!(
            self,
            Self::Cpu | Self::Cycles | Self::Instructions | Self::LlcMisses
        )
    }
}

/// Profile CPU usage by sampling stack traces at a timed interval.
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:
  rtrace profile                  # profile stacks at 49 Hertz until Ctrl-C
  rtrace profile -F 99            # profile stacks at 99 Hertz
  rtrace profile -c 1000000       # profile stacks every 1 in a million events
  rtrace profile 5                # profile at 49 Hertz for 5 seconds only
  rtrace profile -f 5             # output in folded format for flame graphs
  rtrace profile -p 185           # only profile process with PID 185
  rtrace profile -L 185           # only profile thread with TID 185
  rtrace profile -U               # only show user space stacks (no kernel)
  rtrace profile -K               # only show kernel space stacks (no user)
  rtrace profile --svg cpu.svg 10 # a flame graph of 10 seconds
  rtrace profile -e page-faults   # where page faults happen")]
pub struct Args {
    /// Profile for this many seconds; without it, until Ctrl-C.
    #[arg(value_parser = clap::value_parser!(u64).range(1..))]
    duration: Option<u64>,
    /// Sample this many times per second on each CPU (default 49).
    #[arg(short = 'F', long, value_name = "HZ", conflicts_with = "period",
          value_parser = clap::value_parser!(u64).range(1..))]
    frequency: Option<u64>,
    /// Sample once every PERIOD events (for cpu-clock: nanoseconds).
    #[arg(short = 'c', long, value_parser = clap::value_parser!(u64).range(1..))]
    period: Option<u64>,
    /// Profile these processes (all their threads) only; comma-separated.
    #[arg(short = 'p', long, value_delimiter = ',', conflicts_with = "tid")]
    pid: Vec<u32>,
    /// Profile these threads only; comma-separated.
    #[arg(short = 'L', long, value_delimiter = ',')]
    tid: Vec<u32>,
    /// Show stacks from user space only (no kernel space stacks).
    #[arg(short = 'U', long = "user-stacks-only", conflicts_with = "kernel_only")]
    user_only: bool,
    /// Show stacks from kernel space only (no user space stacks).
    #[arg(short = 'K', long = "kernel-stacks-only")]
    kernel_only: bool,
    /// Sample this CPU only.
    #[arg(short = 'C', long)]
    cpu: Option<u32>,
    /// Include the CPU idle stacks (pid 0).
    #[arg(short = 'I', long = "include-idle")]
    include_idle: bool,
    /// Insert a delimiter between kernel and user stacks.
    #[arg(short = 'd', long = "delimited")]
    delimited: bool,
    /// Print folded stacks (`comm;frames.. count`), as flame graph tools read them.
    #[arg(short = 'f', long)]
    folded: bool,
    /// Add `_[k]` to kernel frames, `_[j]` to JIT frames and `_[i]` to
    /// inlined ones in text output.
    #[arg(short = 'a', long = "annotations")]
    annotate: bool,
    /// Distinct stacks to keep; stacks beyond it are counted as missed.
    #[arg(long, value_name = "N", default_value_t = 16384,
          value_parser = clap::value_parser!(u32).range(1..))]
    stack_storage_size: u32,
    /// Distinct (process, stacks) entries to count; samples beyond it are
    /// counted as lost.
    #[arg(long, value_name = "N", default_value_t = 40960,
          value_parser = clap::value_parser!(u32).range(1..))]
    hash_storage_size: u32,
    /// The event to sample on.
    #[arg(short = 'e', long, value_enum, default_value_t = Event::Cpu)]
    event: Event,
    /// Write a flame graph (SVG) to FILE.
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
    /// Draw the flame graph upside down, as an icicle graph.
    #[arg(long, requires = "svg")]
    icicle: bool,
    /// Write a gzipped pprof profile (profile.proto) to FILE.
    #[arg(long, value_name = "FILE")]
    pprof: Option<PathBuf>,
    /// Write a speedscope profile (JSON) to FILE.
    #[arg(long, value_name = "FILE")]
    speedscope: Option<PathBuf>,
    #[command(flatten)]
    buffer: BufferArgs,
}

/// Where there is no PMU, as in most VMs, the hardware events fail; this
/// says why in words.
fn pmu_hint() -> &'static str {
    let pmus = std::fs::read_dir("/sys/bus/event_source/devices")
        .map(|d| {
            d.flatten().any(|e| {
                let n = e.file_name();
                let n = n.to_string_lossy();
                n == "cpu" || n.starts_with("cpu_") || n.starts_with("armv")
            })
        })
        .unwrap_or(false);
    if pmus {
        ""
    } else {
        " (this machine has no hardware PMU: /sys/bus/event_source/devices has no cpu)"
    }
}

/// Reads `kernel.perf_event_max_sample_rate`, which frequencies may not exceed.
fn max_sample_rate() -> Option<u64> {
    std::fs::read_to_string("/proc/sys/kernel/perf_event_max_sample_rate")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Attaches the program to `event` on every CPU in `cpus`.
fn attach(
    prog: &mut PerfEvent,
    event: Event,
    cpus: &[u32],
    period: Option<u64>,
    freq: u64,
) -> anyhow::Result<()> {
    for &cpu in cpus {
        let policy = match period {
            Some(p) => SamplePolicy::Period(p),
            None => SamplePolicy::Frequency(freq),
        };
        prog.attach(
            event.config(),
            PerfEventScope::AllProcessesOneCpu { cpu },
            policy,
            false,
        )
        .with_context(|| format!("cannot sample {} on CPU {cpu}", event.name()))?;
    }
    Ok(())
}

/// Runs the tool.
pub async fn run(args: Args, global: &GlobalArgs) -> anyhow::Result<()> {
    for &pid in &args.pid {
        super::check_pid(pid)?;
    }
    for &tid in &args.tid {
        super::check_tid(tid)?;
    }
    let online = online_cpus().map_err(|(what, e)| anyhow::anyhow!("cannot read {what}: {e}"))?;
    let cpus = match args.cpu {
        Some(c) if !online.contains(&c) => {
            anyhow::bail!("CPU {c} is not online (online: {online:?})")
        }
        Some(c) => vec![c],
        None => online,
    };
    let freq = args.frequency.unwrap_or(49);
    if args.period.is_none()
        && let Some(max) = max_sample_rate()
        && freq > max
    {
        anyhow::bail!("-F {freq} is above kernel.perf_event_max_sample_rate ({max})");
    }
    privs::check()?;

    let mut features = Features::new();
    let (transport, why) = Transport::choose(&mut features, &args.buffer);
    let targets: Vec<u32> = if args.pid.is_empty() {
        args.tid.clone()
    } else {
        args.pid.clone()
    };
    let cfg = Config {
        filter: if !args.pid.is_empty() {
            FILTER_TGID
        } else if !args.tid.is_empty() {
            FILTER_TID
        } else {
            FILTER_NONE
        },
        include_idle: u32::from(args.include_idle),
        user: u32::from(!args.kernel_only),
        kernel: u32::from(!args.user_only),
    };
    let mut loader = EbpfLoader::new();
    loader
        .override_global("CONFIG", &cfg, true)
        .map_max_entries("STACKS", args.stack_storage_size)
        .map_max_entries("COUNTS", args.hash_storage_size)
        .map_max_entries("TARGETS", targets.len().max(1) as u32);
    transport.size(&mut loader, &args.buffer);
    let mut ebpf = loader
        .load(transport.object(objects::PROFILE, objects::PROFILE_PERF))
        .context("cannot load the profile program")?;
    if !targets.is_empty() {
        let mut map: BpfHashMap<_, u32, u8> =
            BpfHashMap::try_from(ebpf.map_mut("TARGETS").context("map TARGETS missing")?)?;
        for t in &targets {
            map.insert(t, 1, 0)?;
        }
    }
    let prog: &mut PerfEvent = ebpf
        .program_mut("profile")
        .context("program profile missing")?
        .try_into()?;
    prog.load().context("cannot load the profile program")?;
    let mut event = args.event;
    let mut fallback = None;
    if let Err(e) = attach(prog, event, &cpus, args.period, freq) {
        if event != Event::Cpu {
            let hint = if event.is_hardware() { pmu_hint() } else { "" };
            return Err(e.context(format!("event {} is not available{hint}", event.name())));
        }
        fallback = Some(format!("{e:#}"));
        event = Event::CpuClock;
        attach(prog, event, &cpus, args.period, freq)?;
    }
    if global.verbose {
        match &fallback {
            Some(why) => eprintln!(
                "rtrace: profile: sampling cpu-clock, a software timer: hardware cycles failed ({why}){}",
                pmu_hint()
            ),
            None => eprintln!("rtrace: profile: sampling {}", event.name()),
        }
        eprintln!(
            "rtrace: profile: stacks by bpf_get_stack with their own 64-bit hash, on {} CPU(s)",
            cpus.len()
        );
        transport.report("profile", why.as_deref());
    }

    let mut signals = Signals::new()?;
    signals.stop_after(args.duration);
    eprintln!("{}", header(&args, event, freq));
    let started = Instant::now();
    let started_epoch = output::epoch_secs();
    let mut sym = Symbolizer::new();
    let mut stream = EventStream::new(&mut ebpf, transport, &args.buffer)?;
    stream
        .run(&mut signals, |bytes| {
            if let Some(seen) = events::record::<Seen>(bytes) {
                sym.capture(seen.tgid, false);
            }
            Ok(true)
        })
        .await?;
    let elapsed = started.elapsed();

    // Stop sampling before reading, so the report is one consistent cut.
    let prog: &mut PerfEvent = ebpf
        .program_mut("profile")
        .context("program profile missing")?
        .try_into()?;
    prog.unload().context("cannot stop sampling")?;
    let report_start = Instant::now();
    let samples = read_samples(&mut ebpf, &mut sym)?;
    write_outputs(&args, global, &samples, event, freq, started_epoch, elapsed)?;
    if global.verbose {
        let total: u64 = samples.iter().map(|s| s.count).sum();
        eprintln!(
            "rtrace: profile: {total} samples in {} stacks, symbolized and written in {} ms",
            samples.len(),
            report_start.elapsed().as_millis()
        );
    }
    output::report_errors(&ERR_NAMES, &output::read_errors(&ebpf, &ERR_NAMES)?);
    report_lost(&ebpf, &stream)
}

/// bcc's start-up line, on stderr so that stdout holds only stacks.
fn header(args: &Args, event: Event, freq: u64) -> String {
    let rate = match args.period {
        Some(p) => format!("Sampling {} every {p} events", event.name()),
        None => format!("Sampling {} at {freq} Hertz", event.name()),
    };
    let whom = if !args.pid.is_empty() {
        format!("of PID {:?}", args.pid)
    } else if !args.tid.is_empty() {
        format!("of TID {:?}", args.tid)
    } else {
        "of all threads".to_owned()
    };
    let which = if args.user_only {
        "user"
    } else if args.kernel_only {
        "kernel"
    } else {
        "user + kernel"
    };
    let cpu = args.cpu.map(|c| format!(" on CPU#{c}")).unwrap_or_default();
    let until = match args.duration {
        Some(s) => format!(" for {s} secs."),
        None => "... Hit Ctrl-C to end.".to_owned(),
    };
    format!("{rate} {whom} by {which} stack{cpu}{until}")
}

/// Reads the counts and stacks and symbolizes them, hottest first.
fn read_samples(ebpf: &mut Ebpf, sym: &mut Symbolizer) -> anyhow::Result<Vec<Sample>> {
    let counts: BpfHashMap<_, Key, u64> =
        BpfHashMap::try_from(ebpf.map("COUNTS").context("map COUNTS missing")?)?;
    let mut entries: Vec<(Key, u64)> = counts.iter().filter_map(Result::ok).collect();
    let stacks_map: BpfHashMap<_, u64, Stack> =
        BpfHashMap::try_from(ebpf.map("STACKS").context("map STACKS missing")?)?;
    let mut stacks: HashMap<u64, Vec<u64>> = HashMap::new();
    for (hash, s) in stacks_map.iter().filter_map(Result::ok) {
        let len = (s.len as usize).min(s.ips.len());
        stacks.insert(hash, s.ips[..len].to_vec());
    }
    entries.sort_by_key(|e| std::cmp::Reverse(e.1));

    // Processes still alive get their newest mappings and perf map; ones
    // gone keep what was captured at their first samples.
    let mut tgids: Vec<u32> = entries.iter().map(|(k, _)| k.tgid).collect();
    tgids.sort_unstable();
    tgids.dedup();
    for &t in &tgids {
        sym.capture(t, true);
    }

    let empty: Vec<u64> = Vec::new();
    let ips = |hash: u64| stacks.get(&hash).unwrap_or(&empty).as_slice();
    let mut requests: Vec<(Option<u32>, &[u64])> = Vec::with_capacity(entries.len() * 2);
    for (key, _) in &entries {
        requests.push((None, ips(key.kernel)));
        requests.push((Some(key.tgid), ips(key.user)));
    }
    let mut frames = sym.symbolize(&requests).into_iter();
    let missed = |name: &str, kind| vec![Frame::missed(name, kind)];
    Ok(entries
        .iter()
        .map(|(key, count)| {
            let kernel = frames.next().unwrap_or_default();
            let user = frames.next().unwrap_or_default();
            let lost = |flag: u32, hash: u64| {
                key.flags & flag != 0 || (hash != 0 && !stacks.contains_key(&hash))
            };
            Sample {
                comm: output::c_string(&key.comm),
                pid: key.tgid,
                kernel: if lost(MISSED_KERNEL, key.kernel) {
                    missed(stacks::MISSED_KERNEL, Kind::Kernel)
                } else {
                    kernel
                },
                user: if lost(MISSED_USER, key.user) {
                    missed(stacks::MISSED_USER, Kind::User)
                } else {
                    user
                },
                count: *count,
            }
        })
        .collect())
}

/// Writes the files asked for, and the text or JSON on stdout: always when
/// no file was asked for, else only with `-f` or `--json`.
fn write_outputs(
    args: &Args,
    global: &GlobalArgs,
    samples: &[Sample],
    event: Event,
    freq: u64,
    started_epoch: f64,
    elapsed: Duration,
) -> anyhow::Result<()> {
    let rate = match args.period {
        Some(p) => format!("every {p} events"),
        None => format!("{freq} Hz"),
    };
    if let Some(path) = &args.svg {
        let opts = FlameOptions {
            title: format!("rtrace profile: {} at {rate}", event.name()),
            icicle: args.icicle,
            count_name: "samples".to_owned(),
        };
        stacks::write_svg(samples, path, &opts)?;
    }
    if let Some(path) = &args.pprof {
        // A cpu-clock sample at F Hz stands for 1/F s of CPU time; other
        // events are counted in events.
        let (unit, period) = match (event, args.period) {
            (Event::CpuClock, Some(p)) => ("nanoseconds", p),
            (Event::CpuClock, None) => ("nanoseconds", 1_000_000_000 / freq),
            (_, Some(p)) => ("count", p),
            (_, None) => ("count", 1),
        };
        let meta = stacks::pprof::Meta {
            event: if event == Event::CpuClock {
                "cpu"
            } else {
                event.name()
            },
            unit,
            period,
            time_nanos: (started_epoch * 1e9) as u64,
            duration_nanos: elapsed.as_nanos() as u64,
        };
        stacks::pprof::write(samples, path, &meta)?;
    }
    if let Some(path) = &args.speedscope {
        stacks::write_speedscope(samples, path, &format!("rtrace profile ({rate})"))?;
    }
    let files = args.svg.is_some() || args.pprof.is_some() || args.speedscope.is_some();
    let text = TextOptions {
        delimiter: args.delimited,
        annotate: args.annotate,
    };
    if global.json {
        stacks::write_json(samples)
    } else if args.folded {
        stacks::write_folded(samples, text)
    } else if !files {
        stacks::write_multiline(samples, text)
    } else {
        Ok(())
    }
}

//! `rtrace runqlat`: run-queue latency histograms, as libbpf-tools' runqlat
//! prints them, with percentiles and JSON besides.

use std::path::PathBuf;

use anyhow::Context as _;
use aya::{
    Ebpf, EbpfLoader,
    maps::{HashMap as BpfHashMap, PerCpuArray},
};
use rtrace_common::{
    offsets::{MISSING, TaskOffsets},
    runqlat::{Config, ERR_NAMES, Entry, TracepointOffsets, group},
};

use crate::{
    GlobalArgs,
    btf::Btf as KernelBtf,
    features::{
        Features, Hooks, Mechanism, TRACEPOINT_CHAIN, attach_chain, check_forced, trim_verifier_log,
    },
    objects,
    output::{
        self, IntervalArgs, Signals,
        hist::{KeyedDeltas, Snapshot, push_hist},
    },
    privs, tracefs,
};

const CHAIN: [Mechanism; 3] = TRACEPOINT_CHAIN;

/// The three hooks, as (program suffix, tracepoint).
const HOOKS: [&str; 3] = ["sched_wakeup", "sched_wakeup_new", "sched_switch"];

/// Summarize run queue (scheduler) latency as a histogram.
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:
  rtrace runqlat              # summarize until Ctrl-C
  rtrace runqlat 1 10         # print 1 second summaries, 10 times
  rtrace runqlat -mT 1        # 1s summaries, milliseconds, and timestamps
  rtrace runqlat -P           # show each PID separately
  rtrace runqlat -p 185       # trace PID 185 only
  rtrace runqlat --percentiles --json 5")]
pub struct Args {
    #[command(flatten)]
    interval: IntervalArgs,
    /// Show milliseconds instead of microseconds.
    #[arg(short = 'm', long)]
    milliseconds: bool,
    /// Print a histogram per process ID.
    #[arg(short = 'P', long = "pids", group = "grouping")]
    per_process: bool,
    /// Print a histogram per thread ID.
    #[arg(short = 'L', long = "tids", group = "grouping")]
    per_thread: bool,
    /// Print a histogram per PID namespace.
    #[arg(long = "pidnss", group = "grouping")]
    per_pidns: bool,
    /// Trace this process (all its threads) only.
    #[arg(short = 'p', long)]
    pid: Option<u32>,
    /// Trace tasks in this cgroup v2 directory, or below it, only.
    #[arg(short = 'c', long, value_name = "CGROUP")]
    cgroup: Option<PathBuf>,
    /// Also print p50, p90, p99, p99.9 and the maximum.
    #[arg(long)]
    percentiles: bool,
    /// Attach with this mechanism instead of the best one that works
    /// (tp_btf, raw_tracepoint or tracepoint).
    #[arg(long, value_enum, value_name = "MECHANISM")]
    attach: Option<Mechanism>,
    /// Keep enqueue times in a hash map even where task local storage, which
    /// is cheaper, is available (for comparison and testing).
    #[arg(long)]
    no_task_storage: bool,
}

/// Resolves the task_struct members the BTF and raw tracepoint programs read.
fn task_offsets(btf: &KernelBtf) -> Result<TaskOffsets, crate::btf::BtfError> {
    let req = |s: &str, m: &[&str]| btf.member_any(s, m).map(|i| i.offset);
    let opt = |s: &str, m: &[&str]| req(s, m).unwrap_or(MISSING);
    Ok(TaskOffsets {
        pid: req("task_struct", &["pid"])?,
        tgid: req("task_struct", &["tgid"])?,
        state: req("task_struct", &["__state", "state"])?,
        comm: req("task_struct", &["comm"])?,
        nsproxy: opt("task_struct", &["nsproxy"]),
        pid_ns_for_children: opt("nsproxy", &["pid_ns_for_children"]),
        pidns_inum: opt("pid_namespace", &["ns.inum"]),
        cgroups: opt("task_struct", &["cgroups"]),
        dfl_cgrp: opt("css_set", &["dfl_cgrp"]),
        cgroup_kn: opt("cgroup", &["kn"]),
        kn_id: opt("kernfs_node", &["id"]),
        kn_parent: opt("kernfs_node", &["__parent", "parent"]),
        _pad: 0,
    })
}

fn tracepoint_offsets() -> Result<TracepointOffsets, tracefs::TracefsError> {
    let wakeup = tracefs::Format::read("sched", "sched_wakeup")?;
    let switch = tracefs::Format::read("sched", "sched_switch")?;
    Ok(TracepointOffsets {
        wakeup_pid: wakeup.offset("pid")?,
        prev_pid: switch.offset("prev_pid")?,
        prev_state: switch.offset("prev_state")?,
        next_pid: switch.offset("next_pid")?,
        next_comm: switch.offset("next_comm")?,
        _pad: 0,
    })
}

/// Map sizes, decided once before any attach attempt.
#[derive(Clone, Copy)]
struct MapSizes {
    /// The preallocated table of runnable tasks.
    start: u32,
    /// Tables keyed by thread or process id, allocated on demand.
    by_id: u32,
}

/// Where the kernel side keeps enqueue timestamps.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Store {
    /// Task local storage: the cheapest, needs tp_btf and task storage.
    Task,
    /// A preallocated hash map by thread id: works everywhere.
    Hash,
}

/// Loads the object with `cfg` and attaches the programs for `m`.
fn load_and_attach(
    m: Mechanism,
    store: Store,
    cfg: &Config,
    sizes: MapSizes,
) -> anyhow::Result<Ebpf> {
    let (object, prefix) = match (m, store) {
        (Mechanism::TpBtf, Store::Task) => (objects::RUNQLAT_TS, "ts"),
        (Mechanism::TpBtf, Store::Hash) => (objects::RUNQLAT, "btf"),
        (Mechanism::RawTracepoint, _) => (objects::RUNQLAT, "raw"),
        _ => (objects::RUNQLAT, "tp"),
    };
    let mut ebpf = EbpfLoader::new()
        // aya has no user-space type for task storage, which only the
        // programs use.
        .allow_unsupported_maps()
        .override_global("CONFIG", cfg, true)
        .map_max_entries("START", sizes.start)
        .map_max_entries("HISTS", sizes.by_id)
        .map_max_entries("TGIDS", sizes.by_id)
        .load(object)
        .context("cannot load the runqlat programs")?;
    let hooks = Hooks::new(m)?;
    for hook in HOOKS {
        hooks.attach(&mut ebpf, &format!("{prefix}_{hook}"), "sched", hook)?;
    }
    Ok(ebpf)
}

/// Reads cumulative histograms and turns them into per-interval ones.
#[derive(Default)]
struct Reader {
    total: Snapshot,
    groups: KeyedDeltas<u32>,
}

impl Reader {
    /// The single histogram's counts since the last call.
    fn total(&mut self, ebpf: &Ebpf) -> anyhow::Result<Snapshot> {
        let map: PerCpuArray<_, Entry> =
            PerCpuArray::try_from(ebpf.map("TOTAL").context("map TOTAL missing")?)?;
        let mut now = Snapshot::default();
        for e in map.get(&0, 0)?.iter() {
            now.add(&e.hist);
        }
        let delta = now.since(&self.total);
        self.total = now;
        Ok(delta)
    }

    /// Per-group counts since the last call, with each group's command.
    fn groups(&mut self, ebpf: &mut Ebpf) -> anyhow::Result<Vec<(u32, String, Snapshot)>> {
        let mut map: BpfHashMap<_, u32, Entry> =
            BpfHashMap::try_from(ebpf.map_mut("HISTS").context("map HISTS missing")?)?;
        Ok(self
            .groups
            .read(&mut map, |e| &e.hist)
            .into_iter()
            .map(|(key, entry, delta)| (key, output::c_string(&entry.comm), delta))
            .collect())
    }
}

/// Runs the tool.
pub async fn run(args: Args, global: &GlobalArgs) -> anyhow::Result<()> {
    if let Some(pid) = args.pid {
        super::check_pid(pid)?;
    }
    check_forced("runqlat", args.attach, &CHAIN)?;
    let cgroup_id = args.cgroup.as_deref().map(super::cgroup_id).transpose()?;
    privs::check()?;

    let (unit, unit_ns) = if args.milliseconds {
        ("msecs", 1_000_000)
    } else {
        ("usecs", 1_000)
    };
    let (grouping, label) = if args.per_process {
        (group::PROCESS, "pid")
    } else if args.per_thread {
        (group::THREAD, "tid")
    } else if args.per_pidns {
        (group::PIDNS, "pidns")
    } else {
        (group::NONE, "")
    };
    let base = Config {
        target_tgid: args.pid.unwrap_or(0),
        group: grouping,
        unit_ns,
        cgroup_id: cgroup_id.unwrap_or(0),
        task: TaskOffsets::default(),
        tp: TracepointOffsets::default(),
    };
    let btf = KernelBtf::from_kernel();
    let sizes = MapSizes {
        start: super::runnable_entries(),
        by_id: super::pid_max(),
    };

    let mut features = Features::new();
    // Task storage saves a hash update and delete per context switch; the
    // hash map stays as the fallback if it is missing or fails to load.
    let mut task_store = if args.no_task_storage {
        Err("disabled by --no-task-storage".to_owned())
    } else {
        features.check(Mechanism::TaskStorage)
    };
    let (mech, mut ebpf, skipped) = attach_chain(&mut features, &CHAIN, args.attach, |m| {
        let mut cfg = base;
        if m == Mechanism::Tracepoint {
            if grouping == group::PIDNS || cgroup_id.is_some() {
                anyhow::bail!("--pidnss and -c need task structs, which tracepoint records lack");
            }
            cfg.tp = tracepoint_offsets()?;
        } else {
            let btf = btf.as_ref().map_err(|e| anyhow::anyhow!("{e}"))?;
            cfg.task = task_offsets(btf)?;
            let need = |v: u32, what: &str| {
                if v == MISSING {
                    anyhow::bail!("kernel BTF lacks {what}")
                }
                Ok(())
            };
            if grouping == group::PIDNS {
                need(
                    cfg.task.pidns_inum.min(cfg.task.pid_ns_for_children),
                    "pid namespaces",
                )?;
            }
            if cgroup_id.is_some() {
                need(
                    cfg.task
                        .kn_parent
                        .min(cfg.task.kn_id)
                        .min(cfg.task.dfl_cgrp),
                    "cgroups",
                )?;
            }
        }
        if m == Mechanism::TpBtf && task_store.is_ok() {
            match load_and_attach(m, Store::Task, &cfg, sizes) {
                Ok(ebpf) => return Ok(ebpf),
                Err(e) => task_store = Err(trim_verifier_log(&format!("{e:#}"))),
            }
        }
        load_and_attach(m, Store::Hash, &cfg, sizes)
    })?;
    let store = if mech == Mechanism::TpBtf && task_store.is_ok() {
        "task_storage"
    } else {
        "hash"
    };
    if global.verbose {
        for (m, why) in &skipped {
            eprintln!("rtrace: runqlat: skipped {m}: {why}");
        }
        let why = match (&task_store, mech) {
            (Err(why), Mechanism::TpBtf) => format!(" (task storage: {why})"),
            _ => String::new(),
        };
        eprintln!("rtrace: runqlat: attached with {mech}, enqueue times in {store}{why}");
    }

    let mut signals = Signals::new()?;
    eprintln!("Tracing run queue latency... Hit Ctrl-C to end.");
    let mut reader = Reader::default();
    output::run_intervals(&args.interval, &mut signals, |_, _| {
        let groups = if grouping == group::NONE {
            vec![(0, String::new(), reader.total(&ebpf)?)]
        } else {
            reader.groups(&mut ebpf)?
        };
        if global.json {
            let hists: Vec<serde_json::Value> = groups
                .iter()
                .map(|(key, comm, s)| {
                    let mut v = serde_json::to_value(s.to_json(unit)).unwrap_or_default();
                    if grouping != group::NONE {
                        v[label] = (*key).into();
                        v["comm"] = comm.as_str().into();
                    }
                    v
                })
                .collect();
            let errors = output::errors_json(&ERR_NAMES, &output::read_errors(&ebpf, &ERR_NAMES)?);
            return output::json_line(&serde_json::json!({
                "tool": "runqlat",
                "time": output::hms(),
                "timestamp": output::epoch_secs(),
                "attach": mech.name(),
                "start_store": store,
                "histograms": hists,
                "errors": errors,
            }));
        }
        let mut text = String::from("\n");
        if args.interval.timestamp {
            text.push_str(&format!("{:<8}\n", output::hms()));
        }
        for (key, comm, s) in &groups {
            let head = (grouping != group::NONE).then(|| format!("{label} = {key} {comm}"));
            push_hist(&mut text, head.as_deref(), s, unit, args.percentiles);
        }
        output::write_text(&text)
    })
    .await?;
    output::report_errors(&ERR_NAMES, &output::read_errors(&ebpf, &ERR_NAMES)?);
    Ok(())
}

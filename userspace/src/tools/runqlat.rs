//! `rtrace runqlat`: run-queue latency histograms, as libbpf-tools' runqlat
//! prints them, with percentiles and JSON besides.

use crate::tracer::{Plan, Spec};
use crate::tracer::{ScopeArgs, own};
use std::path::Path;

use anyhow::Context as _;
use aya::{
    Ebpf,
    maps::{HashMap as BpfHashMap, PerCpuArray},
};
use rtrace_common::{
    offsets::{MISSING, TaskOffsets},
    runqlat::{Config, ERR_NAMES, Entry, HISTS, START, TGIDS, TOTAL, TracepointOffsets, group},
};

use crate::{
    kernel::{
        btf::Btf,
        features::{Mechanism, TRACEPOINT_CHAIN},
        load::{
            Hooks, Kernel, Load, TASK_STORAGE, map, map_mut, pid_max, read_errors, thread_entries,
        },
        tracefs,
    },
    output::{
        self, IntervalArgs, Sink,
        hist::{Group, Interval, KeyedDeltas, PerCpuTotal},
        metrics::{Exposition, Kind, Running},
    },
    tracer::{self, Tool},
};

const CHAIN: [Mechanism; 3] = TRACEPOINT_CHAIN;

/// The three hooks.
const HOOKS: [&str; 3] = ["sched_wakeup", "sched_wakeup_new", "sched_switch"];

/// Summarize run queue (scheduler) latency as a histogram.
#[derive(Debug, clap::Args, Default)]
#[command(after_help = "Examples:
  rtrace runqlat              # summarize until Ctrl-C
  rtrace runqlat 1 10         # print 1 second summaries, 10 times
  rtrace runqlat -mT 1        # 1s summaries, milliseconds, and timestamps
  rtrace runqlat -P           # show each PID separately
  rtrace runqlat -p 185       # trace PID 185 only
  rtrace runqlat --percentiles --json 5
  rtrace runqlat -- stress-ng --cpu 4 --timeout 5s      # the load's own tasks, until it exits
  rtrace runqlat -a -- stress-ng --cpu 4 --timeout 5s   # every task, while the load runs")]
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
    #[command(flatten)]
    scope: ScopeArgs<{ own::L }>,
    /// Also print p50, p90, p99, p99.9 and the maximum.
    #[arg(long)]
    percentiles: bool,
    /// Attach with this mechanism instead of the best one that works.
    #[arg(long, value_name = "MECHANISM", value_parser = Mechanism::parser(&CHAIN))]
    attach: Option<Mechanism>,
}

/// Resolves the task_struct members the BTF and raw tracepoint programs read.
fn task_offsets(btf: &Btf) -> Result<TaskOffsets, crate::kernel::btf::BtfError> {
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

/// The tool: its arguments and what it learned while attaching.
pub struct Runqlat {
    args: Args,
    grouping: u32,
    /// The JSON key of a group (`pid`, `tid`, `pidns`).
    label: &'static str,
    unit: &'static str,
    unit_ns: u64,
    mech: Mechanism,
    /// Where enqueue times are kept, as `-v` and JSON name it.
    store: &'static str,
    total: PerCpuTotal,
    groups: KeyedDeltas<u32>,
    /// As a collector: the histogram since the start, in nanoseconds.
    running: Running,
}

impl Tool for Runqlat {
    type Args = Args;

    const SPEC: Spec = Spec::new("runqlat", &CHAIN, &ERR_NAMES);

    fn new(args: Args) -> anyhow::Result<Self> {
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
        Ok(Self {
            args,
            grouping,
            label,
            unit,
            unit_ns,
            mech: Mechanism::TpBtf,
            store: "hash",
            total: PerCpuTotal::default(),
            groups: KeyedDeltas::default(),
            running: Running::default(),
        })
    }

    /// Task storage saves a hash update and delete per context switch; the
    /// hash map stays as the fallback if it is missing or fails to load.
    /// Loading is the probe: probing the map type apart costs the kernel an
    /// RCU grace period (tens of milliseconds) to free the probe's map.
    fn variants(&self, m: Option<Mechanism>, _kernel: &mut Kernel) -> Vec<&'static str> {
        if m == Some(Mechanism::TpBtf) {
            vec![TASK_STORAGE, ""]
        } else {
            vec![""]
        }
    }

    fn configure(
        &mut self,
        m: Option<Mechanism>,
        kernel: &mut Kernel,
        load: &mut Load,
    ) -> anyhow::Result<()> {
        let m = m.context("runqlat attaches through its chain")?;
        let mut cfg = Config {
            group: self.grouping,
            _pad: 0,
            unit_ns: self.unit_ns,
            task: TaskOffsets::default(),
            tp: TracepointOffsets::default(),
        };
        if m == Mechanism::Tracepoint {
            if self.grouping == group::PIDNS || self.args.scope.by_cgroup() {
                anyhow::bail!("--pidnss and -c need task structs, which tracepoint records lack");
            }
            cfg.tp = tracepoint_offsets()?;
        } else {
            cfg.task = task_offsets(kernel.btf()?)?;
            let need = |v: u32, what: &str| {
                if v == MISSING {
                    anyhow::bail!("kernel BTF lacks {what}")
                }
                Ok(())
            };
            if self.grouping == group::PIDNS {
                need(
                    cfg.task.pidns_inum.min(cfg.task.pid_ns_for_children),
                    "pid namespaces",
                )?;
            }
            if self.args.scope.by_cgroup() {
                need(
                    cfg.task
                        .kn_parent
                        .min(cfg.task.kn_id)
                        .min(cfg.task.dfl_cgrp),
                    "cgroups",
                )?;
            }
        }
        let in_task = load.variant() == TASK_STORAGE;
        // Tables a run does not use get one entry: a hash's buckets are
        // allocated when it is created, even without preallocated entries,
        // and pid_max of them cost the kernel tens of megabytes and start-up
        // the time to clear them.
        let grouped = self.grouping != group::NONE;
        let tgids = m == Mechanism::Tracepoint
            && (!self.args.scope.pids.is_empty() || self.grouping == group::PROCESS);
        load.config(&cfg)
            // aya has no user-space type for task storage, which only the
            // programs use.
            .allow_unsupported_maps()
            .size(START, if in_task { 1 } else { thread_entries() })
            .size(HISTS, if grouped { pid_max() } else { 1 })
            .size(TGIDS, if tgids { pid_max() } else { 1 });
        self.mech = m;
        self.store = if in_task { TASK_STORAGE } else { "hash" };
        Ok(())
    }

    fn attach(
        &mut self,
        m: Option<Mechanism>,
        kernel: &mut Kernel,
        ebpf: &mut Ebpf,
    ) -> anyhow::Result<()> {
        let m = m.context("runqlat attaches through its chain")?;
        let mut hooks = Hooks::new(m, kernel)?;
        let prefix = if self.store == TASK_STORAGE {
            "ts"
        } else {
            hooks.prefix()
        };
        for hook in HOOKS {
            hooks.attach(ebpf, &format!("{prefix}_{hook}"), "sched", hook)?;
        }
        Ok(())
    }

    fn describe(&self) -> Vec<String> {
        vec![{ format!("{}; enqueue times in {}", HOOKS.join(", "), self.store) }]
    }

    fn banner(&self) -> String {
        "Tracing run queue latency... Hit Ctrl-C to end.".to_owned()
    }

    fn tick(&mut self, ebpf: &mut Ebpf, sink: &mut Sink, _last: bool) -> anyhow::Result<()> {
        let histograms = if self.grouping == group::NONE {
            vec![Group::total(self.total.read(
                ebpf,
                TOTAL,
                |e: &Entry| &e.hist,
            )?)]
        } else {
            self.read_groups(ebpf)?
        };
        let mut extra = serde_json::Map::new();
        extra.insert("start_store".into(), self.store.into());
        sink.emit(&Interval {
            attach: self.mech.name(),
            extra,
            histograms,
            errors: output::errors_json(&ERR_NAMES, &read_errors(ebpf, ERR_NAMES.len())?),
            unit: self.unit,
            timestamp: self.args.interval.timestamp,
            percentiles: self.args.percentiles,
            extension: false,
            empty_table: false,
            break_before_table: false,
        })
    }

    fn plan(&self) -> Plan {
        Plan {
            scope: self.args.scope.scope(),
            forced: self.args.attach,
            interval: self.args.interval.schedule(),
            ..Plan::default()
        }
    }
}

impl tracer::Collect for Runqlat {
    const COLLECTOR: tracer::Collector = tracer::Collector {
        default: true,
        scoped: true,
        tallies: 0,
    };

    fn collector(cgroup: Option<&Path>) -> anyhow::Result<Self> {
        let mut tool = Self::new(Args {
            scope: ScopeArgs {
                cgroup: cgroup.map(Path::to_owned),
                ..ScopeArgs::default()
            },
            ..Args::default()
        })?;
        tool.unit_ns = 1;
        Ok(tool)
    }

    fn refresh(&mut self, ebpf: &Ebpf) -> anyhow::Result<()> {
        let array: PerCpuArray<_, Entry> =
            PerCpuArray::try_from(map(ebpf, rtrace_common::runqlat::TOTAL)?)?;
        self.running
            .update(array.get(&0, 0)?.iter().map(|e| &e.hist));
        Ok(())
    }

    fn metrics(&self, out: &mut Exposition) {
        out.family(
            "rtrace_runqueue_latency_seconds",
            Kind::Histogram,
            "Time tasks waited on a run queue, from wakeup to running.",
        )
        .histogram(&[], &self.running.seconds());
    }
}

impl Runqlat {
    /// Per-group counts since the last call, headed by each group's command.
    fn read_groups(&mut self, ebpf: &mut Ebpf) -> anyhow::Result<Vec<Group>> {
        let mut map: BpfHashMap<_, u32, Entry> = BpfHashMap::try_from(map_mut(ebpf, HISTS)?)?;
        Ok(self
            .groups
            .read(&mut map, |e| &e.hist)
            .into_iter()
            .map(|(key, entry, snapshot)| {
                let comm = crate::kernel::c_string(&entry.comm);
                let mut labels = serde_json::Map::new();
                labels.insert(self.label.into(), key.into());
                labels.insert("comm".into(), comm.clone().into());
                Group {
                    head: Some(format!("{} = {key} {comm}", self.label)),
                    labels,
                    snapshot,
                }
            })
            .collect())
    }
}

//! `rtrace biolatency`: block I/O latency histograms, as libbpf-tools'
//! biolatency prints them, with percentiles and JSON besides.

use crate::tracer::ScopeArgs;
use crate::tracer::{Plan, Spec};
use std::collections::HashMap;
use std::path::Path;

use anyhow::Context as _;
use aya::{Ebpf, maps::HashMap as BpfHashMap};
use rtrace_common::{
    biolatency::{
        Config, ERR_NAMES, Entry, FLAGS_RWBS, HISTS, HistKey, RequestOffsets, TOTAL,
        TracepointOffsets,
    },
    offsets::MISSING,
    // The object variant that claims slots with a compare-and-exchange.
    variants::ATOMICS,
};

use crate::{
    kernel::{
        btf::Btf,
        features::Mechanism,
        load::{Hooks, Kernel, Load, map, map_mut, read_errors},
        tracefs,
    },
    output::{
        self, IntervalArgs, Sink,
        hist::{Group, Interval, KeyedDeltas, PerCpuTotal},
        metrics::{Exposition, Kind, Running},
    },
    tracer::{self, Tool},
};

/// Typed and raw arguments give the request itself; classic tracepoints
/// only its device and sector. Raw tracepoints come first: the programs
/// read the request through helpers on either, and a raw tracepoint passes
/// its address as a number, which the slot table hashes, where a typed
/// pointer must first be read out of the context by a helper (measured:
/// 100–200 ns of the 400–650 an I/O costs with tp_btf).
const CHAIN: [Mechanism; 3] = [
    Mechanism::RawTracepoint,
    Mechanism::TpBtf,
    Mechanism::Tracepoint,
];

/// Summarize block device I/O latency as a histogram.
#[derive(Debug, clap::Args, Default)]
#[command(after_help = "Examples:
  rtrace biolatency             # summarize block I/O latency as a histogram
  rtrace biolatency 1 10        # print 1 second summaries, 10 times
  rtrace biolatency -mT 1       # 1s summaries, milliseconds, and timestamps
  rtrace biolatency -Q          # include OS queued time in I/O time
  rtrace biolatency -D          # show each disk device separately
  rtrace biolatency -F          # show I/O flags separately
  rtrace biolatency -d sdc      # trace sdc only
  rtrace biolatency -c CG       # trace I/O issued by cgroup v2 directory CG
  rtrace biolatency -m -- dd if=/dev/zero of=f bs=1M count=100 oflag=direct
                                # the I/O of one command, until it exits
  rtrace biolatency -D --percentiles -- dd if=f of=/dev/null bs=1M iflag=direct")]
pub struct Args {
    #[command(flatten)]
    interval: IntervalArgs,
    /// Show milliseconds instead of microseconds.
    #[arg(short = 'm', long)]
    milliseconds: bool,
    /// Include OS queued time in I/O time.
    #[arg(short = 'Q', long)]
    queued: bool,
    /// Print a histogram per disk device.
    #[arg(short = 'D', long)]
    disk: bool,
    /// Print a histogram per set of I/O flags.
    #[arg(short = 'F', long)]
    flag: bool,
    /// Trace this disk only (a name in /sys/block, such as sda).
    #[arg(short = 'd', long = "disk-name", value_name = "DISK")]
    disk_name: Option<String>,
    #[command(flatten)]
    scope: ScopeArgs,
    /// Also print p50, p90, p99, p99.9 and the maximum.
    #[arg(long)]
    percentiles: bool,
    /// After each histogram, its average, total and count (bcc's
    /// `--extension`).
    #[arg(short = 'e', long)]
    extension: bool,
    /// Print bcc's dictionaries, one line per histogram: `ts`, `val_type`,
    /// `data` (`interval-start`, `interval-end`, `count`) and `flags` or
    /// `disk` (as JSON; bcc prints Python's repr). `--json` prints
    /// rtrace's fields.
    #[arg(short = 'j')]
    bcc_json: bool,
    /// Attach with this mechanism instead of the best one that works.
    #[arg(long, value_name = "MECHANISM", value_parser = Mechanism::parser(&CHAIN))]
    attach: Option<Mechanism>,
}

/// The kernel's `dev_t` encoding: 12 bits of major, 20 of minor.
fn kernel_dev(major: u32, minor: u32) -> u32 {
    (major << 20) | minor
}

/// Whole disks, by kernel `dev_t`, from /sys/block.
fn disks() -> HashMap<u32, String> {
    let mut out = HashMap::new();
    let Ok(dir) = std::fs::read_dir("/sys/block") else {
        return out;
    };
    for entry in dir.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Ok(dev) = std::fs::read_to_string(entry.path().join("dev")) else {
            continue;
        };
        if let Some((major, minor)) = dev.trim().split_once(':')
            && let (Ok(major), Ok(minor)) = (major.parse(), minor.parse())
        {
            out.insert(kernel_dev(major, minor), name);
        }
    }
    out
}

fn disk_by_name(name: &str) -> anyhow::Result<u32> {
    disks()
        .into_iter()
        .find(|(_, n)| n == name)
        .map(|(dev, _)| dev)
        .with_context(|| format!("no such disk: {name} (disks are listed in /sys/block)"))
}

/// Offsets into `struct request` and on to its disk, from BTF.
fn request_offsets(btf: &Btf) -> Result<RequestOffsets, crate::kernel::btf::BtfError> {
    let req = |s: &str, m: &str| btf.offset(s, m);
    let opt = |s: &str, m: &str| req(s, m).unwrap_or(MISSING);
    let q_disk = opt("request_queue", "disk");
    let rq_disk = opt("request", "rq_disk");
    if q_disk == MISSING && rq_disk == MISSING {
        // Neither layout: report the newer one as missing.
        req("request_queue", "disk")?;
    }
    Ok(RequestOffsets {
        q: req("request", "q")?,
        q_disk,
        rq_disk,
        major: req("gendisk", "major")?,
        first_minor: req("gendisk", "first_minor")?,
        cmd_flags: req("request", "cmd_flags")?,
        bio: req("request", "bio")?,
        _pad: 0,
    })
}

fn tracepoint_offsets() -> Result<TracepointOffsets, tracefs::TracefsError> {
    let issue = tracefs::Format::read("block", "block_rq_issue")?;
    let done = tracefs::Format::read("block", "block_rq_complete")?;
    let bio = tracefs::Format::read("block", "block_bio_queue")?;
    Ok(TracepointOffsets {
        dev: issue.offset("dev")?,
        sector: issue.offset("sector")?,
        done_dev: done.offset("dev")?,
        done_sector: done.offset("sector")?,
        done_rwbs: done.offset("rwbs")?,
        bio_dev: bio.offset("dev")?,
        bio_sector: bio.offset("sector")?,
        _pad: 0,
    })
}

/// Whether tracepoint `name` (`block_rq_issue`, and `block_rq_insert`
/// and `block_bio_queue` with it) passes the request queue first, as they
/// did before 5.11.
fn queue_arg(btf: Option<&Btf>, name: &str) -> bool {
    if let Some(n) = btf.and_then(|b| b.tracepoint_args(name)) {
        return n == 2;
    }
    let release = crate::kernel::features::kernel_release();
    let mut v = release
        .split(['.', '-'])
        .map(|p| p.parse::<u32>().unwrap_or(0));
    (v.next().unwrap_or(0), v.next().unwrap_or(0)) < (5, 11)
}

/// Names for `request.cmd_flags`, from the kernel's own enums so that
/// renumbering across versions cannot mislabel them.
struct FlagNames {
    ops: Vec<(u64, &'static str)>,
    bits: Vec<(u64, &'static str)>,
}

impl FlagNames {
    fn new(btf: Option<&Btf>) -> Self {
        let value = |name: &str| btf.and_then(|b| b.enum_value(name)).map(|v| v as u64);
        let ops = [
            ("REQ_OP_READ", "Read"),
            ("REQ_OP_WRITE", "Write"),
            ("REQ_OP_FLUSH", "Flush"),
            ("REQ_OP_DISCARD", "Discard"),
            ("REQ_OP_SECURE_ERASE", "SecureErase"),
            ("REQ_OP_WRITE_ZEROES", "WriteZeroes"),
            ("REQ_OP_ZONE_OPEN", "ZoneOpen"),
            ("REQ_OP_ZONE_CLOSE", "ZoneClose"),
            ("REQ_OP_ZONE_FINISH", "ZoneFinish"),
            ("REQ_OP_ZONE_APPEND", "ZoneAppend"),
            ("REQ_OP_ZONE_RESET", "ZoneReset"),
            ("REQ_OP_ZONE_RESET_ALL", "ZoneResetAll"),
            ("REQ_OP_DRV_IN", "DrvIn"),
            ("REQ_OP_DRV_OUT", "DrvOut"),
        ]
        .into_iter()
        .filter_map(|(k, n)| Some((value(k)?, n)))
        .collect();
        // libbpf-tools' order, so that labels read the same.
        let bits = [
            ("__REQ_NOWAIT", "NoWait"),
            ("__REQ_BACKGROUND", "Background"),
            ("__REQ_RAHEAD", "ReadAhead"),
            ("__REQ_PREFLUSH", "PreFlush"),
            ("__REQ_FUA", "FUA"),
            ("__REQ_INTEGRITY", "Integrity"),
            ("__REQ_IDLE", "Idle"),
            ("__REQ_NOMERGE", "NoMerge"),
            ("__REQ_PRIO", "Priority"),
            ("__REQ_META", "Metadata"),
            ("__REQ_SYNC", "Sync"),
        ]
        .into_iter()
        .filter_map(|(k, n)| Some((1u64 << value(k)?, n)))
        .collect();
        Self { ops, bits }
    }

    /// A label such as `Sync-Write`.
    fn label(&self, flags: u64) -> String {
        if flags & FLAGS_RWBS != 0 {
            return rwbs_label(flags);
        }
        let mut parts: Vec<String> = Vec::new();
        for (bit, name) in &self.bits {
            if flags & bit != 0 {
                parts.push((*name).to_owned());
            }
        }
        let op = flags & 0xff;
        parts.push(
            self.ops
                .iter()
                .find(|(v, _)| *v == op)
                .map_or_else(|| format!("Op{op}"), |(_, n)| (*n).to_owned()),
        );
        parts.join("-")
    }
}

/// A label for the `rwbs` letters a tracepoint record gives, in the same
/// words as [`FlagNames::label`].
fn rwbs_label(flags: u64) -> String {
    let bytes = (flags & !FLAGS_RWBS).to_le_bytes();
    let rwbs: Vec<u8> = bytes.iter().copied().take_while(|&b| b != 0).collect();
    let mut parts = Vec::new();
    let mut op = "Unknown";
    let mut seen_op = false;
    for &c in &rwbs {
        match (c, seen_op) {
            (b'F', false) => parts.push("PreFlush"),
            (b'F', true) => parts.push("FUA"),
            (b'R', _) => (op, seen_op) = ("Read", true),
            (b'W', _) => (op, seen_op) = ("Write", true),
            (b'D', _) => (op, seen_op) = ("Discard", true),
            (b'E', true) => op = "SecureErase",
            (b'N', _) => (op, seen_op) = ("None", true),
            (b'A', _) => parts.push("ReadAhead"),
            (b'S', _) => parts.push("Sync"),
            (b'M', _) => parts.push("Metadata"),
            _ => {}
        }
    }
    // A lone F is a flush.
    if !seen_op && parts == ["PreFlush"] {
        return "Flush".to_owned();
    }
    parts.push(op);
    parts.join("-")
}

/// The operation of a flag label (`Sync-Write`) as a metric label
/// (`write`; `SecureErase` is `secure_erase`).
fn op_label(label: &str) -> String {
    let op = label.rsplit('-').next().unwrap_or(label);
    let mut out = String::new();
    for (i, c) in op.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_lowercase());
    }
    out
}

/// The tool.
pub struct Biolatency {
    args: Args,
    dev: Option<u32>,
    unit: &'static str,
    unit_ns: u64,
    mech: Mechanism,
    /// Whether `block_rq_insert` and `block_rq_issue` pass the queue first.
    queue_first: bool,
    /// Whether `block_bio_queue` does.
    bio_queue_first: bool,
    /// Where requests in flight are kept, for `-v`.
    store: &'static str,
    flag_names: Option<FlagNames>,
    disks: HashMap<u32, String>,
    deltas: KeyedDeltas<HistKey>,
    /// The one histogram, when not split.
    total: PerCpuTotal,
    /// As a collector: each key's histogram since the start, and its
    /// disk and operation.
    running: HashMap<HistKey, (Running, String, String)>,
}

impl Tool for Biolatency {
    type Args = Args;

    const SPEC: Spec = Spec::new("biolatency", &CHAIN, &ERR_NAMES);

    fn new(args: Args) -> anyhow::Result<Self> {
        let dev = args.disk_name.as_deref().map(disk_by_name).transpose()?;
        let (unit, unit_ns) = if args.milliseconds {
            ("msecs", 1_000_000)
        } else {
            ("usecs", 1_000)
        };
        Ok(Self {
            args,
            dev,
            unit,
            unit_ns,
            mech: Mechanism::TpBtf,
            queue_first: false,
            bio_queue_first: false,
            store: "",
            flag_names: None,
            disks: disks(),
            deltas: KeyedDeltas::default(),
            total: PerCpuTotal::default(),
            running: HashMap::new(),
        })
    }

    /// The programs that see request addresses keep them in a table of
    /// slots, claimed with a compare-and-exchange (5.12), rather than in a
    /// hash map; not with `-Q`, whose two starts would need both. Loading
    /// is the probe.
    fn variants(&self, m: Option<Mechanism>, _kernel: &mut Kernel) -> Vec<&'static str> {
        if m == Some(Mechanism::Tracepoint) || self.args.queued {
            vec![""]
        } else {
            vec![ATOMICS, ""]
        }
    }

    fn configure(
        &mut self,
        m: Option<Mechanism>,
        kernel: &mut Kernel,
        load: &mut Load,
    ) -> anyhow::Result<()> {
        let m = m.context("biolatency attaches through its chain")?;
        self.store = if load.variant() == ATOMICS {
            "a table of slots by address (a hash where two meet)"
        } else {
            "a hash"
        };
        let btf = kernel.btf().ok();
        // Labels and the tracepoints' form come from the kernel's own
        // BTF, read while it is at hand.
        self.queue_first = queue_arg(btf, "block_rq_issue");
        self.bio_queue_first = queue_arg(btf, "block_bio_queue");
        if self.args.flag && self.flag_names.is_none() {
            self.flag_names = Some(FlagNames::new(btf));
        }
        let mut cfg = Config {
            unit_ns: self.unit_ns,
            dev: self.dev.unwrap_or(0),
            filter_dev: u32::from(self.dev.is_some()),
            queued: u32::from(self.args.queued),
            per_disk: u32::from(self.args.disk),
            per_flags: u32::from(self.args.flag),
            by_submitter: u32::from(self.by_submitter()),
            _pad: [0; 2],
            rq: RequestOffsets::default(),
            tp: TracepointOffsets::default(),
        };
        if m == Mechanism::Tracepoint {
            cfg.tp = tracepoint_offsets()?;
        } else {
            cfg.rq = request_offsets(kernel.btf()?)?;
        }
        load.config(&cfg);
        if !self.grouped() {
            // The one histogram is the per-CPU TOTAL.
            load.size(HISTS, 1);
        }
        self.mech = m;
        Ok(())
    }

    fn attach(
        &mut self,
        m: Option<Mechanism>,
        kernel: &mut Kernel,
        ebpf: &mut Ebpf,
    ) -> anyhow::Result<()> {
        let m = m.context("biolatency attaches through its chain")?;
        let mut attacher = Hooks::new(m, kernel)?;
        let hooks: &[&str] = if self.args.queued {
            &["block_rq_insert", "block_rq_issue", "block_rq_complete"]
        } else {
            &["block_rq_issue", "block_rq_complete"]
        };
        for hook in hooks {
            let suffix =
                if self.queue_first && m != Mechanism::Tracepoint && *hook != "block_rq_complete" {
                    "_q"
                } else {
                    ""
                };
            let name = format!("{}_{hook}{suffix}", attacher.prefix());
            attacher.attach(ebpf, &name, "block", hook)?;
        }
        if self.by_submitter() {
            let suffix = if self.bio_queue_first && m != Mechanism::Tracepoint {
                "_q"
            } else {
                ""
            };
            let name = format!("{}_block_bio_queue{suffix}", attacher.prefix());
            attacher.attach(ebpf, &name, "block", "block_bio_queue")?;
        }
        Ok(())
    }

    fn describe(&self) -> Vec<String> {
        vec![{
            let args_form = if self.queue_first {
                "queue, request"
            } else {
                "request"
            };
            format!(
                "block_rq_issue({args_form}); requests in flight in {}",
                self.store
            )
        }]
    }

    fn banner(&self) -> String {
        "Tracing block device I/O... Hit Ctrl-C to end.".to_owned()
    }

    fn tick(&mut self, ebpf: &mut Ebpf, sink: &mut Sink, _last: bool) -> anyhow::Result<()> {
        let hists = if self.grouped() {
            let mut map: BpfHashMap<_, HistKey, Entry> =
                BpfHashMap::try_from(map_mut(ebpf, HISTS)?)?;
            self.deltas
                .read(&mut map, |h| h)
                .into_iter()
                .map(|(k, _, snapshot)| (k, snapshot))
                .collect()
        } else {
            let total = self.total.read(ebpf, TOTAL, |h: &Entry| h)?;
            // As the grouped tables drop idle keys, an idle interval has
            // no histogram (and prints libbpf-tools' empty table).
            (total.count() > 0)
                .then_some((HistKey::default(), total))
                .into_iter()
                .collect::<Vec<_>>()
        };
        let mut histograms = Vec::with_capacity(hists.len());
        for (k, snapshot) in hists {
            let mut head = Vec::new();
            let mut labels = serde_json::Map::new();
            if self.args.disk {
                let disk = self.disk_name(k.dev);
                // libbpf-tools starts the disk's part on a new paragraph
                // and ends it with a tab, flags or not.
                head.push(format!("\ndisk = {disk}\t"));
                labels.insert("disk".into(), disk.into());
            }
            if let (true, Some(names)) = (self.args.flag, &self.flag_names) {
                let flags = names.label(k.flags);
                head.push(format!("flags = {flags}"));
                labels.insert("flags".into(), flags.into());
            }
            histograms.push(Group {
                head: (!head.is_empty()).then(|| head.concat()),
                labels,
                snapshot,
            });
        }
        let interval = Interval {
            attach: self.mech.name(),
            extra: serde_json::Map::new(),
            histograms,
            errors: output::errors_json(&ERR_NAMES, &read_errors(ebpf, ERR_NAMES.len())?),
            unit: self.unit,
            timestamp: self.args.interval.timestamp,
            percentiles: self.args.percentiles,
            extension: self.args.extension,
            empty_table: !self.args.disk && !self.args.flag,
            break_before_table: true,
        };
        if self.args.bcc_json {
            for dict in interval.bcc_dicts() {
                sink.emit_raw(&dict)?;
            }
            return Ok(());
        }
        sink.emit(&interval)
    }

    fn plan(&self) -> Plan {
        Plan {
            scope: self.args.scope.scope(),
            forced: self.args.attach,
            interval: self.args.interval.schedule(),
            json: self.args.bcc_json,
            ..Plan::default()
        }
    }
}

impl tracer::Collect for Biolatency {
    const COLLECTOR: tracer::Collector = tracer::Collector {
        default: true,
        scoped: true,
        tallies: 0,
    };

    fn collector(cgroup: Option<&Path>) -> anyhow::Result<Self> {
        let mut tool = Self::new(Args {
            // By disk and by flags, as the metrics' labels.
            disk: true,
            flag: true,
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
        let map: BpfHashMap<_, HistKey, Entry> =
            BpfHashMap::try_from(map(ebpf, rtrace_common::biolatency::HISTS)?)?;
        for (key, hist) in map.iter().filter_map(Result::ok) {
            if !self.running.contains_key(&key) {
                let disk = self.disk_name(key.dev);
                let op = self
                    .flag_names
                    .as_ref()
                    .map_or_else(|| "unknown".to_owned(), |n| op_label(&n.label(key.flags)));
                self.running.insert(key, (Running::default(), disk, op));
            }
            if let Some((r, _, _)) = self.running.get_mut(&key) {
                r.update([&hist]);
            }
        }
        Ok(())
    }

    fn metrics(&self, out: &mut Exposition) {
        // Keys differ in flags beyond the operation: each disk and
        // operation is the sum of its keys.
        let mut by: std::collections::BTreeMap<(&str, &str), Running> = Default::default();
        for (r, disk, op) in self.running.values() {
            by.entry((disk.as_str(), op.as_str())).or_default().add(r);
        }
        let mut family = out.family(
            "rtrace_block_io_latency_seconds",
            Kind::Histogram,
            "Block I/O latency, from issue to completion, by disk and operation.",
        );
        for ((disk, op), r) in &by {
            family.histogram(&[("disk", disk), ("op", op)], &r.seconds());
        }
    }
}

impl Biolatency {
    /// Whether requests are in scope by the task that submitted them
    /// (see `Config::by_submitter`): a cgroup or a command scopes them.
    /// With neither, every request counts and no bio is followed.
    fn by_submitter(&self) -> bool {
        self.args.scope.cgroup.is_some() || self.args.scope.commanded()
    }

    /// Whether the histograms are split (by disk or flags).
    fn grouped(&self) -> bool {
        self.args.disk || self.args.flag
    }

    /// A disk's name, looked up again if it appeared since the last look.
    fn disk_name(&mut self, dev: u32) -> String {
        if !self.disks.contains_key(&dev) {
            self.disks = disks();
        }
        self.disks
            .get(&dev)
            .cloned()
            .unwrap_or_else(|| format!("{}:{}", dev >> 20, dev & 0xf_ffff))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rwbs(s: &str) -> String {
        let mut b = [0u8; 8];
        b[..s.len()].copy_from_slice(s.as_bytes());
        rwbs_label(u64::from_le_bytes(b) | FLAGS_RWBS)
    }

    #[test]
    fn operations_label_as_snake_case() {
        assert_eq!(op_label("Sync-Write"), "write");
        assert_eq!(op_label("ReadAhead-Read"), "read");
        assert_eq!(op_label("SecureErase"), "secure_erase");
    }

    #[test]
    fn rwbs_letters_read_as_flag_names() {
        assert_eq!(rwbs("R"), "Read");
        assert_eq!(rwbs("WS"), "Sync-Write");
        assert_eq!(rwbs("FWFS"), "PreFlush-FUA-Sync-Write");
        assert_eq!(rwbs("RA"), "ReadAhead-Read");
        assert_eq!(rwbs("F"), "Flush");
        assert_eq!(rwbs("DE"), "SecureErase");
    }

    #[test]
    fn cmd_flags_read_through_kernel_enums() {
        let btf = Btf::from_kernel().expect("needs kernel BTF");
        let names = FlagNames::new(Some(&btf));
        let sync = 1u64 << btf.enum_value("__REQ_SYNC").unwrap();
        let write = btf.enum_value("REQ_OP_WRITE").unwrap() as u64;
        assert_eq!(names.label(sync | write), "Sync-Write");
        assert_eq!(names.label(0), "Read");
    }
}

//! `rtrace biolatency`: block I/O latency histograms, as libbpf-tools'
//! biolatency prints them, with percentiles and JSON besides.

use std::{collections::HashMap, path::PathBuf};

use anyhow::Context as _;
use aya::{EbpfLoader, maps::HashMap as BpfHashMap};
use rtrace_common::{
    biolatency::{
        Config, ERR_NAMES, Entry, FLAGS_RWBS, HistKey, RequestOffsets, TracepointOffsets,
    },
    offsets::MISSING,
};

use crate::{
    GlobalArgs,
    btf::Btf as KernelBtf,
    features::{Features, Hooks, Mechanism, TRACEPOINT_CHAIN, attach_chain, check_forced},
    objects,
    output::{
        self, IntervalArgs, Signals,
        hist::{KeyedDeltas, Snapshot, push_hist, render_log2},
    },
    privs, tracefs,
};

/// Typed and raw arguments give the request itself; classic tracepoints
/// only its device and sector.
const CHAIN: [Mechanism; 3] = TRACEPOINT_CHAIN;

/// Summarize block device I/O latency as a histogram.
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:
  rtrace biolatency             # summarize block I/O latency as a histogram
  rtrace biolatency 1 10        # print 1 second summaries, 10 times
  rtrace biolatency -mT 1       # 1s summaries, milliseconds, and timestamps
  rtrace biolatency -Q          # include OS queued time in I/O time
  rtrace biolatency -D          # show each disk device separately
  rtrace biolatency -F          # show I/O flags separately
  rtrace biolatency -d sdc      # trace sdc only
  rtrace biolatency -c CG       # trace I/O issued by cgroup v2 directory CG")]
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
    /// Trace I/O issued by tasks in this cgroup v2 directory, or below it.
    #[arg(short = 'c', long, value_name = "CGROUP")]
    cgroup: Option<PathBuf>,
    /// Also print p50, p90, p99, p99.9 and the maximum.
    #[arg(long)]
    percentiles: bool,
    /// Attach with this mechanism instead of the best one that works
    /// (tp_btf, raw_tracepoint or tracepoint).
    #[arg(long, value_enum, value_name = "MECHANISM")]
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
fn request_offsets(btf: &KernelBtf) -> Result<RequestOffsets, crate::btf::BtfError> {
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
    })
}

fn tracepoint_offsets() -> Result<TracepointOffsets, tracefs::TracefsError> {
    let issue = tracefs::Format::read("block", "block_rq_issue")?;
    let done = tracefs::Format::read("block", "block_rq_complete")?;
    Ok(TracepointOffsets {
        dev: issue.offset("dev")?,
        sector: issue.offset("sector")?,
        done_dev: done.offset("dev")?,
        done_sector: done.offset("sector")?,
        done_rwbs: done.offset("rwbs")?,
        _pad: 0,
    })
}

/// Whether `block_rq_insert` and `block_rq_issue` pass the request queue
/// before the request, as they did before 5.11.
fn queue_arg(btf: Option<&KernelBtf>) -> bool {
    if let Some(n) = btf.and_then(|b| b.tracepoint_args("block_rq_issue")) {
        return n == 2;
    }
    let release = crate::features::kernel_release();
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
    fn new(btf: Option<&KernelBtf>) -> Self {
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

/// Runs the tool.
pub async fn run(args: Args, global: &GlobalArgs) -> anyhow::Result<()> {
    check_forced("biolatency", args.attach, &CHAIN)?;
    let dev = args.disk_name.as_deref().map(disk_by_name).transpose()?;
    let cgroup = super::open_cgroup(args.cgroup.as_deref())?;
    privs::check()?;

    let (unit, unit_ns) = if args.milliseconds {
        ("msecs", 1_000_000)
    } else {
        ("usecs", 1_000)
    };
    let btf = KernelBtf::from_kernel();
    let base = Config {
        unit_ns,
        dev: dev.unwrap_or(0),
        filter_dev: u32::from(dev.is_some()),
        queued: u32::from(args.queued),
        per_disk: u32::from(args.disk),
        per_flags: u32::from(args.flag),
        filter_cgroup: u32::from(cgroup.is_some()),
        _pad: [0; 2],
        rq: RequestOffsets::default(),
        tp: TracepointOffsets::default(),
    };

    let queue_first = queue_arg(btf.as_ref().ok());
    let mut features = Features::new();
    let (mech, ebpf, skipped) = attach_chain(&mut features, &CHAIN, args.attach, |m| {
        let mut cfg = base;
        if m == Mechanism::Tracepoint {
            cfg.tp = tracepoint_offsets()?;
        } else {
            let btf = btf.as_ref().map_err(|e| anyhow::anyhow!("{e}"))?;
            cfg.rq = request_offsets(btf)?;
        }
        let mut ebpf = EbpfLoader::new()
            .override_global("CONFIG", &cfg, true)
            .load(objects::BIOLATENCY)
            .context("cannot load the biolatency programs")?;
        if let Some(cg) = &cgroup {
            super::set_cgroup(&mut ebpf, cg)?;
        }
        let attacher = Hooks::new(m)?;
        let hooks: &[&str] = if args.queued {
            &["block_rq_insert", "block_rq_issue", "block_rq_complete"]
        } else {
            &["block_rq_issue", "block_rq_complete"]
        };
        for hook in hooks {
            let suffix =
                if queue_first && m != Mechanism::Tracepoint && *hook != "block_rq_complete" {
                    "_q"
                } else {
                    ""
                };
            let name = format!("{}_{hook}{suffix}", attacher.prefix());
            attacher.attach(&mut ebpf, &name, "block", hook)?;
        }
        Ok(ebpf)
    })?;
    let mut ebpf = ebpf;
    if global.verbose {
        for (m, why) in &skipped {
            eprintln!("rtrace: biolatency: skipped {m}: {why}");
        }
        let args_form = if queue_first {
            "queue, request"
        } else {
            "request"
        };
        eprintln!("rtrace: biolatency: attached with {mech} (block_rq_issue({args_form}))");
    }

    let flag_names = FlagNames::new(btf.as_ref().ok());
    let mut names = disks();
    let mut deltas = KeyedDeltas::<HistKey>::default();
    let mut signals = Signals::new()?;
    eprintln!("Tracing block device I/O... Hit Ctrl-C to end.");
    output::run_intervals(&args.interval, &mut signals, |_, _| {
        let mut map: BpfHashMap<_, HistKey, Entry> =
            BpfHashMap::try_from(ebpf.map_mut("HISTS").context("map HISTS missing")?)?;
        let hists: Vec<(HistKey, Snapshot)> = deltas
            .read(&mut map, |h| h)
            .into_iter()
            .map(|(k, _, s)| (k, s))
            .collect();
        let mut disk_name = |dev: u32| {
            if !names.contains_key(&dev) {
                names = disks();
            }
            names
                .get(&dev)
                .cloned()
                .unwrap_or_else(|| format!("{}:{}", dev >> 20, dev & 0xf_ffff))
        };
        if global.json {
            let mut out = Vec::new();
            for (k, s) in &hists {
                let mut v = serde_json::to_value(s.to_json(unit)).unwrap_or_default();
                if args.disk {
                    v["disk"] = disk_name(k.dev).into();
                }
                if args.flag {
                    v["flags"] = flag_names.label(k.flags).into();
                }
                out.push(v);
            }
            let errors = output::errors_json(&ERR_NAMES, &output::read_errors(&ebpf, &ERR_NAMES)?);
            return output::json_line(&serde_json::json!({
                "tool": "biolatency",
                "time": output::hms(),
                "timestamp": output::epoch_secs(),
                "attach": mech.name(),
                "histograms": out,
                "errors": errors,
            }));
        }
        let mut text = String::from("\n");
        if args.interval.timestamp {
            text.push_str(&format!("{:<8}\n", output::hms()));
        }
        if hists.is_empty() && !args.disk && !args.flag {
            text.push_str(&render_log2(&Snapshot::default().log2(), unit));
        }
        for (k, s) in &hists {
            let mut head = Vec::new();
            if args.disk {
                head.push(format!("disk = {}", disk_name(k.dev)));
            }
            if args.flag {
                head.push(format!("flags = {}", flag_names.label(k.flags)));
            }
            let head = (!head.is_empty()).then(|| head.join("\t"));
            push_hist(&mut text, head.as_deref(), s, unit, args.percentiles);
        }
        output::write_text(&text)
    })
    .await?;
    output::report_errors(&ERR_NAMES, &output::read_errors(&ebpf, &ERR_NAMES)?);
    Ok(())
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
        let btf = KernelBtf::from_kernel().expect("needs kernel BTF");
        let names = FlagNames::new(Some(&btf));
        let sync = 1u64 << btf.enum_value("__REQ_SYNC").unwrap();
        let write = btf.enum_value("REQ_OP_WRITE").unwrap() as u64;
        assert_eq!(names.label(sync | write), "Sync-Write");
        assert_eq!(names.label(0), "Read");
    }
}

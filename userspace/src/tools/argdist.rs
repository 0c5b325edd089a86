//! `rtrace argdist`: histograms and frequency counts of function
//! arguments, return values, latencies and tracepoint fields, from bcc's
//! probe specs, with no compiler at run time: one generic program
//! (`ebpf-programs/src/bin/argdist.rs`) reads the parsed specs.

use crate::tracer::{Plan, Spec as ToolSpec};
use crate::tracer::{ScopeArgs, own};
use std::{collections::HashMap, fmt::Write as _};

use anyhow::Context as _;
use aya::{
    Ebpf,
    maps::{HashMap as BpfHashMap, PerCpuArray, PerCpuHashMap},
};
use rtrace_common::{
    argdist::{
        COUNTS, COUNTS_NUM, Config, ENTRIES, ERR_NAMES, HISTS, KIND_RETURN, Key, MAX_PROBES,
        MAX_STRINGS, MODE_COUNT, MODE_HIST, NumKey, Probe, STR_LEN, VAL_STRING,
    },
    hist::Hist,
};

use crate::{
    kernel::{
        features::Mechanism,
        load::{Kernel, Load, map, map_mut, thread_entries},
    },
    output::{self, Record, Schedule, Sink, hist::Snapshot},
    probes::{
        attach::{Slot, attach_slot},
        spec::{self, Spec},
    },
    tracer::Tool,
};

/// Trace a function and display a summary of its parameter values.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Specifier: {p|r|t|u}:{[library]|category}:function(signature)\
[:type[,type...]:expr[,expr...][:filter]][#label or ;label]
  p: function entry, r: function return, t: tracepoint, u: USDT probe
  (values arg1..argN, semaphores raised); an empty library
  means a kernel function (kprobe), else a uprobe in that library or
  executable. Expressions and filters are C: parameters, tracepoint fields
  (args->f), $retval, $latency (ns), $entry(param), $PID, $TID, $COMM,
  kernel enum constants, operators, casts, and struct members through
  pointers (p->a.b), from the kernel's BTF. Strings compare with == and a
  \"text\", or STRCMP(\"text\", expr).

Examples:
  rtrace argdist -H 'p::__kmalloc(u64 size):u64:size'
        # histogram of kernel allocation sizes
  rtrace argdist -C 'p:c:malloc(size_t size):size_t:size:size==16'
        # how often malloc is called for 16 bytes
  rtrace argdist -C 'r:c:getenv():char*:$retval#environment values read'
  rtrace argdist -H 'r::__vfs_read(void *file, void *buf, size_t count):size_t:$entry(count):$latency > 1000000'
  rtrace argdist -C 't:syscalls:sys_enter_write():u64:args->count' -p 1005
        # write sizes of process 1005
  rtrace argdist -H 'r:c:read():ssize_t:$latency/1000#read latency (us)'
  rtrace argdist -C 'p:c:nanosleep(struct timespec *req):long:req->tv_nsec'
  rtrace argdist -C 'p::vfs_write(struct file *f, char *b, size_t n):char*:f->f_path.dentry->d_name.name'
  rtrace argdist -C 't:syscalls:sys_enter_write():u64:args->count' -- dd if=/dev/zero of=/dev/null bs=4k count=1000
        # write sizes of one dd, from its first instruction until it exits
  rtrace argdist -H 'p:c:malloc(size_t size):size_t:size' -- ls -lR /usr/share/doc
        # malloc sizes of one ls (outputs every -i seconds and at its exit)"
)]
pub struct Args {
    #[command(flatten)]
    scope: ScopeArgs<{ own::C | own::UPPER_C }>,
    /// Seconds between outputs.
    #[arg(short = 'i', long, default_value_t = 1,
          value_parser = crate::output::at_least_one::<u64>)]
    interval: u64,
    /// Number of outputs before exiting.
    #[arg(short = 'n', long = "number", value_name = "COUNT",
          value_parser = crate::output::at_least_one::<u64>)]
    count: Option<u64>,
    /// Total seconds to trace (not with -- CMD, which says when to stop).
    #[arg(short = 'd', long, value_name = "SECS",
          value_parser = crate::output::at_least_one::<u64>)]
    duration: Option<u64>,
    /// Keep counting across outputs instead of starting afresh each time.
    #[arg(short = 'c', long)]
    cumulative: bool,
    /// Show only the top N most frequent keys (-C).
    #[arg(short = 'T', long = "top", value_name = "N")]
    top: Option<usize>,
    /// Bytes kept of each string value (at most 128).
    #[arg(short = 'z', long = "string-size", value_name = "SIZE", default_value_t = 80,
          value_parser = clap::value_parser!(u32).range(1..=STR_LEN as i64))]
    string_size: u32,
    /// A histogram of one value for each SPEC; repeatable, and one -H may
    /// take several.
    #[arg(short = 'H', long = "histogram", value_name = "SPEC", num_args = 1..,
          action = clap::ArgAction::Append)]
    histograms: Vec<String>,
    /// Frequency counts of keys of values for each SPEC; repeatable, and
    /// one -C may take several.
    #[arg(short = 'C', long = "count", value_name = "SPEC", num_args = 1..,
          action = clap::ArgAction::Append)]
    counts: Vec<String>,
    /// Accepted for bcc's command lines and ignored: types come from the
    /// kernel's BTF, not from headers.
    #[arg(short = 'I', long = "include", value_name = "HEADER")]
    include: Vec<String>,
    /// Entries of the frequency table (all -C specs together).
    #[arg(long, value_name = "N", default_value_t = 10240)]
    table_size: u32,
}

/// A spec and its mode.
struct Parsed {
    spec: Spec,
    hist: bool,
}

fn parse_all(args: &Args) -> anyhow::Result<Vec<Parsed>> {
    let specs: Vec<(&String, bool)> = args
        .histograms
        .iter()
        .map(|s| (s, true))
        .chain(args.counts.iter().map(|s| (s, false)))
        .collect();
    if specs.is_empty() {
        anyhow::bail!("give at least one probe: -H SPEC for a histogram, -C SPEC for counts");
    }
    if specs.len() > MAX_PROBES {
        anyhow::bail!("at most {MAX_PROBES} probes may be given");
    }
    spec::with_system(args.scope.one_pid(), |env| {
        specs
            .into_iter()
            .map(|(text, hist)| {
                let spec = spec::parse(text, hist, env).map_err(|e| {
                    let flag = if hist { "-H" } else { "-C" };
                    anyhow::anyhow!("bad {flag} spec {text:?} at {e}")
                })?;
                Ok(Parsed { spec, hist })
            })
            .collect()
    })
}
/// The program's configuration of one spec.
fn probe(p: &Parsed, str_len: u32) -> Probe {
    // SAFETY: every field is an integer or an array of them.
    let mut out: Probe = unsafe { std::mem::zeroed() };
    out.kind = p.spec.kind;
    out.mode = if p.hist { MODE_HIST } else { MODE_COUNT };
    out.n_values = p.spec.values.len() as u32;
    out.n_conds = p.spec.conds.len() as u32;
    out.need_entry = u32::from(p.spec.need_entry);
    out.n_strings = p
        .spec
        .values
        .iter()
        .filter(|v| v.value.flags & VAL_STRING != 0)
        .count() as u32;
    out.str_len = str_len;
    for (slot, v) in out.values.iter_mut().zip(&p.spec.values) {
        *slot = v.value;
    }
    for (slot, c) in out.conds.iter_mut().zip(&p.spec.conds) {
        *slot = *c;
    }
    out
}

/// One key's values by expression, as JSON numbers or strings.
fn key_values(spec: &Spec, key: &Key) -> serde_json::Map<String, serde_json::Value> {
    spec.values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let val: serde_json::Value = if v.value.flags & VAL_STRING != 0 {
                crate::kernel::c_string(&key.strings[v.value.str_slot as usize]).into()
            } else if v.ty.signed {
                (key.values[i] as i64).into()
            } else {
                key.values[i].into()
            };
            (v.text.clone(), val)
        })
        .collect()
}

/// Text of one key's values, as bcc prints them: `size = 16, name = foo`.
fn key_text(spec: &Spec, values: &serde_json::Map<String, serde_json::Value>) -> String {
    if spec.default_expr {
        return "total calls".to_owned();
    }
    let parts: Vec<String> = values
        .iter()
        .map(|(name, v)| match v {
            serde_json::Value::String(s) => format!("{name} = {s}"),
            other => format!("{name} = {other}"),
        })
        .collect();
    parts.join(", ")
}

/// Counts since the last output, per key; `cumulative` keeps the totals.
struct Counts {
    prev: HashMap<Key, u64>,
    cumulative: bool,
}

impl Counts {
    /// Counts since the last read, given every key's running total: one
    /// table's entries widened to [`Key`] (a probe's keys are all in one
    /// of the two tables, so widened keys never meet). Returns them, and
    /// the keys idle for a whole interval, to be removed to make room.
    fn since<K>(&mut self, now: Vec<(K, Key, u64)>) -> (Vec<(Key, u64)>, Vec<K>) {
        let mut out = Vec::new();
        let mut idle = Vec::new();
        for (raw, key, total) in now {
            let shown = if self.cumulative {
                total
            } else {
                total - self.prev.get(&key).copied().unwrap_or(0).min(total)
            };
            if shown == 0 {
                idle.push(raw);
                self.prev.remove(&key);
                continue;
            }
            self.prev.insert(key, total);
            out.push((key, shown));
        }
        (out, idle)
    }
}

/// One interval's tables: bcc's text, and the same as JSON.
struct Report {
    text: String,
    probes: Vec<serde_json::Value>,
}

impl serde::Serialize for Report {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        serde_json::json!({ "probes": self.probes }).serialize(ser)
    }
}

impl Record for Report {
    fn text(&self, out: &mut String) {
        out.push_str(&self.text);
    }
}

/// The tool.
pub struct Argdist {
    args: Args,
    parsed: Vec<Parsed>,
    /// How each probe was attached, for `-v`.
    how: Vec<String>,
    /// The perf events of USDT probes, attached while they are held.
    links: Vec<std::os::fd::OwnedFd>,
    counts: Counts,
    prev_hists: Vec<Snapshot>,
}

impl Tool for Argdist {
    type Args = Args;

    // Each probe names its own mechanism: no chain.
    const SPEC: ToolSpec = ToolSpec::new("argdist", &[], &ERR_NAMES);

    fn new(args: Args) -> anyhow::Result<Self> {
        let parsed = parse_all(&args)?;
        let n = parsed.len();
        Ok(Self {
            counts: Counts {
                prev: HashMap::new(),
                cumulative: args.cumulative,
            },
            args,
            parsed,
            how: Vec::new(),
            links: Vec::new(),
            prev_hists: vec![Snapshot::default(); n],
        })
    }

    fn configure(
        &mut self,
        _m: Option<Mechanism>,
        _kernel: &mut Kernel,
        load: &mut Load,
    ) -> anyhow::Result<()> {
        // SAFETY: every field is an integer or an array of them.
        let mut cfg: Config = unsafe { std::mem::zeroed() };
        for (slot, p) in cfg.probes.iter_mut().zip(&self.parsed) {
            *slot = probe(p, self.args.string_size);
        }
        // Each table is as large as --table-size where a probe uses it,
        // and one entry where none does.
        let counts = |strings: bool| {
            let used = cfg.probes[..self.parsed.len()]
                .iter()
                .zip(&self.parsed)
                .any(|(p, parsed)| !parsed.hist && (p.n_strings > 0) == strings);
            if used { self.args.table_size.max(1) } else { 1 }
        };
        load.config(&cfg)
            .size(COUNTS, counts(true))
            .size(COUNTS_NUM, counts(false))
            .size(ENTRIES, thread_entries());
        Ok(())
    }

    fn attach(
        &mut self,
        _m: Option<Mechanism>,
        kernel: &mut Kernel,
        ebpf: &mut Ebpf,
    ) -> anyhow::Result<()> {
        self.how.clear();
        self.links.clear();
        for (i, p) in self.parsed.iter().enumerate() {
            let how = attach_slot(
                ebpf,
                kernel,
                &Slot {
                    index: i,
                    raw: &p.spec.raw,
                    target: &p.spec.target,
                    ret: p.spec.kind == KIND_RETURN,
                    need_entry: p.spec.need_entry,
                },
                self.args.scope.one_pid(),
                &mut self.links,
            )
            .with_context(|| format!("cannot attach {:?}", p.spec.raw))?;
            let what: Vec<String> = p.spec.values.iter().map(|v| v.text.clone()).collect();
            self.how.push(format!(
                "probe {i}: {how}: {} of {}{}{}",
                if p.hist { "histogram" } else { "counts" },
                what.join(", "),
                if p.spec.conds.is_empty() {
                    String::new()
                } else {
                    format!(", {} comparison(s) in the filter", p.spec.conds.len())
                },
                if p.spec.need_entry {
                    ", with an entry probe"
                } else {
                    ""
                },
            ));
        }
        Ok(())
    }

    fn describe(&self) -> Vec<String> {
        let mut lines = vec![format!("{} probe(s)", self.parsed.len())];
        lines.extend(self.how.clone());
        lines
    }

    fn banner(&self) -> String {
        format!(
            "Tracing {} probe(s)... Hit Ctrl-C to end.",
            self.parsed.len()
        )
    }

    fn tick(&mut self, ebpf: &mut Ebpf, sink: &mut Sink, _last: bool) -> anyhow::Result<()> {
        let report = self.read(ebpf)?;
        sink.emit(&report)
    }

    fn plan(&self) -> Plan {
        Plan {
            scope: self.args.scope.scope(),
            interval: Schedule::Every {
                period: std::time::Duration::from_secs(self.args.interval),
                count: self.args.count,
            },
            duration: self.args.duration,
            ..Plan::default()
        }
    }
}

impl Argdist {
    /// Reads one interval's tables.
    fn read(&mut self, ebpf: &mut Ebpf) -> anyhow::Result<Report> {
        let parsed = &self.parsed;
        let mut by_probe: Vec<Vec<(Key, u64)>> = vec![Vec::new(); parsed.len()];
        if parsed.iter().any(|p| !p.hist) {
            let mut map: BpfHashMap<_, Key, u64> = BpfHashMap::try_from(map_mut(ebpf, COUNTS)?)?;
            let now = map
                .iter()
                .filter_map(Result::ok)
                .map(|(k, n)| (k, k, n))
                .collect();
            let (mut read, idle) = self.counts.since(now);
            for k in idle {
                let _ = map.remove(&k);
            }
            let mut map: PerCpuHashMap<_, NumKey, u64> =
                PerCpuHashMap::try_from(map_mut(ebpf, COUNTS_NUM)?)?;
            let now = map
                .iter()
                .filter_map(Result::ok)
                .map(|(k, per_cpu)| {
                    let wide = Key {
                        probe: k.probe,
                        _pad: 0,
                        values: k.values,
                        strings: [[0; STR_LEN]; MAX_STRINGS],
                    };
                    (k, wide, per_cpu.iter().sum())
                })
                .collect();
            let (more, idle) = self.counts.since(now);
            for k in idle {
                let _ = map.remove(&k);
            }
            read.extend(more);
            for (key, n) in read {
                if let Some(v) = by_probe.get_mut(key.probe as usize) {
                    v.push((key, n));
                }
            }
        }
        let hists: PerCpuArray<_, Hist> = PerCpuArray::try_from(map(ebpf, HISTS)?)?;
        let mut text = format!("[{}]\n", output::hms());
        let mut json = Vec::new();
        for (i, p) in parsed.iter().enumerate() {
            if p.hist {
                let mut now = Snapshot::default();
                for h in hists.get(&(i as u32), 0)?.iter() {
                    now.add(h);
                }
                let shown = if self.args.cumulative {
                    now.clone()
                } else {
                    now.since(&self.prev_hists[i])
                };
                self.prev_hists[i] = now;
                let unit = p.spec.label.as_deref().unwrap_or(&p.spec.values[0].text);
                json.push(serde_json::json!({
                    "spec": p.spec.raw,
                    "label": p.spec.label,
                    "type": "histogram",
                    "histogram": shown.to_json(unit),
                }));
                let _ = writeln!(text, "{}", p.spec.name());
                text.push_str(&output::hist::render_log2(&shown.log2(), unit));
            } else {
                let mut rows = std::mem::take(&mut by_probe[i]);
                rows.sort_by(|a, b| a.1.cmp(&b.1).then(a.0.cmp(&b.0)));
                if let Some(top) = self.args.top {
                    rows.drain(..rows.len().saturating_sub(top));
                }
                let rows: Vec<(u64, serde_json::Map<String, serde_json::Value>)> = rows
                    .iter()
                    .map(|(key, n)| (*n, key_values(&p.spec, key)))
                    .collect();
                let _ = writeln!(text, "{}", p.spec.name());
                let _ = writeln!(text, "\t{:<10} EVENT", "COUNT");
                for (n, values) in &rows {
                    let _ = writeln!(text, "\t{n:<10} {}", key_text(&p.spec, values));
                }
                json.push(serde_json::json!({
                    "spec": p.spec.raw,
                    "label": p.spec.label,
                    "type": "counts",
                    "counts": rows.into_iter().map(|(n, values)| serde_json::json!({
                        "count": n,
                        "values": values,
                    })).collect::<Vec<_>>(),
                }));
            }
        }
        Ok(Report { text, probes: json })
    }
}

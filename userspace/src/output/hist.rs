//! Histogram rendering shared by every histogram tool: libbpf-tools' log2
//! layout in text, percentiles from HdrHistogram, and a JSON form.

use std::{collections::HashMap, fmt::Write as _, hash::Hash};

use aya::maps::{HashMap as BpfHashMap, MapData};
use rtrace_common::hist::{self, SLOTS};
use serde::Serialize;

/// One histogram's counts for an interval, in the kernel's log-linear slots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// Count per [`rtrace_common::hist`] slot.
    pub slots: Vec<u64>,
    /// Sum of the values.
    pub sum: u64,
    /// Largest value.
    pub max: u64,
}

impl Default for Snapshot {
    fn default() -> Self {
        Self {
            slots: vec![0; SLOTS],
            sum: 0,
            max: 0,
        }
    }
}

/// Turns a kernel hash map of cumulative histograms into per-interval ones.
pub struct KeyedDeltas<K> {
    prev: HashMap<K, Snapshot>,
}

impl<K> Default for KeyedDeltas<K> {
    fn default() -> Self {
        Self {
            prev: HashMap::new(),
        }
    }
}

impl<K: aya::Pod + Eq + Hash + Ord> KeyedDeltas<K> {
    /// Each key's value and its counts since the last call, by key.
    ///
    /// Keys idle for a whole interval are dropped from the kernel map, so
    /// that it holds only live ones; a key seen again starts afresh.
    pub fn read<V: aya::Pod>(
        &mut self,
        map: &mut BpfHashMap<&mut MapData, K, V>,
        hist: impl Fn(&V) -> &hist::Hist,
    ) -> Vec<(K, V, Snapshot)> {
        let entries: Vec<(K, V)> = map.iter().filter_map(Result::ok).collect();
        let mut out = Vec::new();
        for (key, value) in entries {
            let mut now = Snapshot::default();
            now.add(hist(&value));
            let delta = match self.prev.get(&key) {
                Some(prev) => now.since(prev),
                None => now.clone(),
            };
            if delta.count() == 0 {
                let _ = map.remove(&key);
                self.prev.remove(&key);
                continue;
            }
            self.prev.insert(key, now);
            out.push((key, value, delta));
        }
        out.sort_by_key(|(k, _, _)| *k);
        out
    }
}

/// A histogram the kernel keeps per CPU (one entry of a per-CPU array),
/// turned into per-interval counts: the ungrouped case, where the
/// programs record with no hash lookup and no atomic operation.
#[derive(Default)]
pub struct PerCpuTotal {
    last: Snapshot,
}

impl PerCpuTotal {
    /// The counts of the per-CPU array `map`'s entry 0 since the last
    /// call, summed over the CPUs.
    pub fn read<V: aya::Pod>(
        &mut self,
        ebpf: &aya::Ebpf,
        map: &str,
        hist: impl Fn(&V) -> &hist::Hist,
    ) -> anyhow::Result<Snapshot> {
        use anyhow::Context as _;
        let array: aya::maps::PerCpuArray<_, V> = aya::maps::PerCpuArray::try_from(
            ebpf.map(map)
                .with_context(|| format!("map {map} missing"))?,
        )?;
        let mut now = Snapshot::default();
        for v in array.get(&0, 0)?.iter() {
            now.add(hist(v));
        }
        let delta = now.since(&self.last);
        self.last = now;
        Ok(delta)
    }
}

/// One histogram of an interval, with what it is of: its heading in text
/// (`pid = 185 sh`) and the same as JSON fields (`"pid": 185`).
#[derive(Debug)]
pub struct Group {
    /// The heading line, if the histograms are grouped.
    pub head: Option<String>,
    /// The group's labels, added to the histogram's JSON object.
    pub labels: serde_json::Map<String, serde_json::Value>,
    /// The counts.
    pub snapshot: Snapshot,
}

impl Group {
    /// The one histogram of an ungrouped tool.
    pub fn total(snapshot: Snapshot) -> Self {
        Self {
            head: None,
            labels: serde_json::Map::new(),
            snapshot,
        }
    }
}

/// One interval of a histogram tool (runqlat, biolatency): its text is
/// libbpf-tools' layout, its JSON one object with every histogram.
#[derive(Debug)]
pub struct Interval {
    /// The mechanism attached with.
    pub attach: &'static str,
    /// Extra fields of the JSON object, such as where runqlat keeps its
    /// enqueue times.
    pub extra: serde_json::Map<String, serde_json::Value>,
    /// The histograms.
    pub histograms: Vec<Group>,
    /// The loss counters so far, by name.
    pub errors: serde_json::Value,
    /// The values' unit, e.g. `usecs`.
    pub unit: &'static str,
    /// Whether the text starts with the time (`-T`).
    pub timestamp: bool,
    /// Whether the text adds percentiles (`--percentiles`).
    pub percentiles: bool,
    /// Whether the text adds bcc's average, total and count line (`-e`).
    pub extension: bool,
    /// Whether the text shows an empty table when there are no histograms.
    pub empty_table: bool,
    /// libbpf-tools' biolatency layout: each heading printed as it is
    /// (a disk's begins with a line break, flags alone do not), then a
    /// line break, which without a heading makes a blank line; runqlat's
    /// headings each start a paragraph.
    pub break_before_table: bool,
}

impl Interval {
    /// bcc's `-j` dictionaries, one line per histogram, keys in bcc's
    /// order: `ts` (local time), `val_type` (the unit), `data` (the log2
    /// buckets from 0 up to the highest with a count, each
    /// `interval-start`, `interval-end` and `count`), then the
    /// histogram's labels (`flags`, `disk`). bcc prints Python's repr of
    /// them (single quotes); these are the same dictionaries, spaced as
    /// Python spaces them, in JSON's double quotes, which Python's `json`
    /// and `ast.literal_eval` both read.
    pub fn bcc_dicts(&self) -> Vec<String> {
        use std::fmt::Write as _;
        let quote = |s: &str| serde_json::Value::from(s).to_string();
        let ts = quote(&crate::output::local_datetime());
        self.histograms
            .iter()
            .map(|g| {
                let data: Vec<String> = g
                    .snapshot
                    .log2()
                    .iter()
                    .enumerate()
                    .map(|(i, &count)| {
                        let (low, high) = log2_range(i);
                        format!(
                            "{{\"interval-start\": {low}, \"interval-end\": {high}, \"count\": {count}}}"
                        )
                    })
                    .collect();
                let mut line = format!(
                    "{{\"ts\": {ts}, \"val_type\": {}, \"data\": [{}]",
                    quote(self.unit),
                    data.join(", ")
                );
                for (key, value) in &g.labels {
                    let _ = write!(line, ", {}: {value}", quote(key));
                }
                line.push('}');
                line
            })
            .collect()
    }
}

impl Serialize for Interval {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        let histograms: Vec<serde_json::Value> = self
            .histograms
            .iter()
            .map(|g| {
                let mut v = serde_json::to_value(g.snapshot.to_json(self.unit)).unwrap_or_default();
                if let serde_json::Value::Object(m) = &mut v {
                    m.extend(g.labels.clone());
                }
                v
            })
            .collect();
        let mut obj = self.extra.clone();
        obj.insert("attach".into(), self.attach.into());
        obj.insert("histograms".into(), histograms.into());
        obj.insert("errors".into(), self.errors.clone());
        obj.serialize(ser)
    }
}

impl super::Record for Interval {
    fn text(&self, out: &mut String) {
        out.push('\n');
        if self.timestamp {
            let _ = writeln!(out, "{:<8}", super::hms());
        }
        if self.histograms.is_empty() && self.empty_table {
            out.push_str(&render_log2(&Snapshot::default().log2(), self.unit));
        }
        for g in &self.histograms {
            if self.break_before_table {
                out.push_str(g.head.as_deref().unwrap_or(""));
                out.push('\n');
            } else if let Some(head) = &g.head {
                let _ = write!(out, "\n{head}\n");
            }
            out.push_str(&render_log2(&g.snapshot.log2(), self.unit));
            if self.percentiles && g.snapshot.count() > 0 {
                out.push_str(&render_percentiles(&g.snapshot, self.unit));
            }
            let count = g.snapshot.count();
            if self.extension && count > 0 {
                let (sum, unit) = (g.snapshot.sum, self.unit);
                let _ = write!(
                    out,
                    "\navg = {} {unit}, total: {sum} {unit}, count: {count}\n\n",
                    sum / count
                );
            }
        }
    }
}

/// Percentiles reported by `--percentiles` and in JSON.
pub const PERCENTILES: [(&str, f64); 4] =
    [("p50", 50.0), ("p90", 90.0), ("p99", 99.0), ("p99.9", 99.9)];

impl Snapshot {
    /// Adds another (per-CPU) copy of the kernel's histogram.
    pub fn add(&mut self, h: &hist::Hist) {
        for (a, &b) in self.slots.iter_mut().zip(h.slots.iter()) {
            *a += u64::from(b);
        }
        self.sum += h.sum;
        self.max = self.max.max(h.max);
    }

    /// What happened between `earlier` and `self`, both cumulative.
    ///
    /// Counts and sums subtract exactly. The kernel's maximum is cumulative:
    /// when it grew, the new one is this interval's; otherwise the
    /// interval's maximum is bounded by its highest non-empty slot.
    pub fn since(&self, earlier: &Snapshot) -> Snapshot {
        let slots: Vec<u64> = self
            .slots
            .iter()
            .zip(&earlier.slots)
            .map(|(a, b)| a.saturating_sub(*b))
            .collect();
        let max = if self.max > earlier.max {
            self.max
        } else {
            slots
                .iter()
                .rposition(|&c| c > 0)
                .map_or(0, |s| hist::slot_range(s).1.min(self.max))
        };
        Snapshot {
            slots,
            sum: self.sum.saturating_sub(earlier.sum),
            max,
        }
    }

    /// Number of values.
    pub fn count(&self) -> u64 {
        self.slots.iter().sum()
    }

    /// Counts folded into libbpf-tools' log2 buckets, up to the highest
    /// non-empty one.
    pub fn log2(&self) -> Vec<u64> {
        let used = self.slots.iter().rposition(|&c| c > 0).map_or(0, |s| s + 1);
        let mut out = Vec::new();
        for (s, &c) in self.slots.iter().enumerate().take(used) {
            let b = hist::log2_bucket(s);
            if out.len() <= b {
                out.resize(b + 1, 0);
            }
            out[b] += c;
        }
        out
    }

    /// The percentiles of [`PERCENTILES`], each within one sub-bucket
    /// (under 1/16 relative error) and never above the maximum.
    pub fn percentiles(&self) -> Vec<(&'static str, u64)> {
        // Bounds cover every slot below the last; an auto-resizing histogram
        // would silently clamp large values on record.
        let top = hist::slot_range(SLOTS - 2).1;
        let mut h = hdrhistogram::Histogram::<u64>::new_with_bounds(1, top, 2)
            .expect("bounds and precision are valid");
        for (s, &c) in self.slots.iter().enumerate() {
            if c == 0 {
                continue;
            }
            let (low, high) = hist::slot_range(s);
            let high = high.min(self.max.max(low));
            let mid = (low + (high - low) / 2).clamp(1, top);
            h.record_n(mid, c).expect("value within bounds");
        }
        PERCENTILES
            .iter()
            .map(|&(name, q)| {
                let v = if h.is_empty() {
                    0
                } else {
                    h.value_at_percentile(q)
                };
                (name, v.min(self.max))
            })
            .collect()
    }

    /// The JSON form of this histogram.
    pub fn to_json(&self, unit: &str) -> HistJson {
        let count = self.count();
        let buckets = self
            .log2()
            .iter()
            .enumerate()
            .map(|(i, &count)| {
                let (low, high) = log2_range(i);
                Bucket { low, high, count }
            })
            .collect();
        HistJson {
            unit: unit.to_owned(),
            count,
            sum: self.sum,
            avg: if count == 0 {
                0.0
            } else {
                self.sum as f64 / count as f64
            },
            max: self.max,
            percentiles: self
                .percentiles()
                .into_iter()
                .map(|(n, v)| (n.to_owned(), v))
                .collect(),
            buckets,
        }
    }
}

/// One log2 bucket in JSON.
#[derive(Debug, Serialize)]
pub struct Bucket {
    /// Lowest value counted.
    pub low: u64,
    /// Highest value counted.
    pub high: u64,
    /// How many.
    pub count: u64,
}

/// A histogram in JSON.
#[derive(Debug, Serialize)]
pub struct HistJson {
    /// The values' unit, e.g. `usecs`.
    pub unit: String,
    /// Number of values.
    pub count: u64,
    /// Their sum.
    pub sum: u64,
    /// Their mean.
    pub avg: f64,
    /// The largest.
    pub max: u64,
    /// p50, p90, p99 and p99.9.
    pub percentiles: std::collections::BTreeMap<String, u64>,
    /// Log2 buckets from `0 -> 1` up to the highest non-empty one.
    pub buckets: Vec<Bucket>,
}

/// The value range of log2 bucket `i`, as libbpf-tools prints it.
pub fn log2_range(i: usize) -> (u64, u64) {
    let high = if i >= 63 {
        u64::MAX
    } else {
        (1u64 << (i + 1)) - 1
    };
    let low = (high >> 1) + 1;
    if low == high { (0, 1) } else { (low, high) }
}

fn stars(out: &mut String, val: u64, val_max: u64, width: u64) {
    let num = (val.min(val_max) * width).checked_div(val_max).unwrap_or(0);
    for _ in 0..num {
        out.push('*');
    }
    for _ in num..width {
        out.push(' ');
    }
    if val > val_max {
        out.push('+');
    }
}

/// Renders log2 counts exactly as libbpf-tools' `print_log2_hist` does;
/// an empty histogram renders as nothing.
pub fn render_log2(vals: &[u64], unit: &str) -> String {
    let mut out = String::new();
    let Some(idx_max) = vals.iter().rposition(|&v| v > 0) else {
        return out;
    };
    let val_max = vals.iter().copied().max().unwrap_or(0);
    let wide = idx_max > 32;
    let (pad, name_w, width, nstars) = if wide {
        (15, 29, 20, 20)
    } else {
        (5, 19, 10, 40)
    };
    let _ = writeln!(out, "{:pad$}{unit:<name_w$} : count    distribution", "");
    for (i, &val) in vals.iter().enumerate().take(idx_max + 1) {
        let (low, high) = log2_range(i);
        let _ = write!(out, "{low:>width$} -> {high:<width$} : {val:<8} |");
        stars(&mut out, val, val_max, nstars);
        out.push_str("|\n");
    }
    out
}

/// Renders the `--percentiles` line.
pub fn render_percentiles(s: &Snapshot, unit: &str) -> String {
    let mut parts: Vec<String> = s
        .percentiles()
        .into_iter()
        .map(|(n, v)| format!("{n} = {v}"))
        .collect();
    parts.push(format!("max = {}", s.max));
    format!("percentiles ({unit}): {}\n", parts.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(values: &[(u64, u64)]) -> Snapshot {
        let mut s = Snapshot::default();
        for &(v, n) in values {
            s.slots[hist::slot(v)] += n;
            s.sum += v * n;
            s.max = s.max.max(v);
        }
        s
    }

    /// Captured from libbpf-tools 0.26 `runqlat 1 1` on this host.
    const GOLDEN: &str = "     usecs               : count    distribution
         0 -> 1          : 0        |                                        |
         2 -> 3          : 1        |**                                      |
         4 -> 7          : 2        |****                                    |
         8 -> 15         : 8        |****************                        |
        16 -> 31         : 20       |****************************************|
        32 -> 63         : 9        |******************                      |
        64 -> 127        : 2        |****                                    |
       128 -> 255        : 0        |                                        |
       256 -> 511        : 0        |                                        |
       512 -> 1023       : 2        |****                                    |
";

    #[test]
    fn log2_matches_libbpf_tools_layout() {
        let s = snapshot(&[
            (2, 1),
            (5, 2),
            (9, 8),
            (20, 20),
            (40, 9),
            (100, 2),
            (600, 2),
        ]);
        assert_eq!(render_log2(&s.log2(), "usecs"), GOLDEN);
    }

    #[test]
    fn empty_histogram_renders_nothing() {
        assert_eq!(render_log2(&Snapshot::default().log2(), "usecs"), "");
    }

    #[test]
    fn wide_histograms_use_20_columns() {
        let s = snapshot(&[(1 << 34, 1)]);
        let text = render_log2(&s.log2(), "nsecs");
        let first = text.lines().nth(1).unwrap();
        assert_eq!(
            first,
            format!("{:>20} -> {:<20} : {:<8} |{:20}|", 0, 1, 0, "")
        );
        assert!(text.starts_with(&format!("{:15}{:<29} : count", "", "nsecs")));
    }

    #[test]
    fn percentiles_are_within_a_sub_bucket() {
        // 1..=1000, one each: p50 = 500, p90 = 900, p99 = 990.
        let s = snapshot(&(1..=1000).map(|v| (v, 1)).collect::<Vec<_>>());
        let p: std::collections::HashMap<_, _> = s.percentiles().into_iter().collect();
        for (name, exact) in [("p50", 500.0), ("p90", 900.0), ("p99", 990.0)] {
            let got = p[name] as f64;
            assert!(
                (got - exact).abs() / exact < 1.0 / 16.0,
                "{name}: {got} vs {exact}"
            );
        }
        assert!(p["p99.9"] <= 1000);
    }

    #[test]
    fn deltas_subtract_counts_and_bound_the_max() {
        let before = snapshot(&[(5, 3), (100, 1)]);
        let mut after = before.clone();
        after.slots[hist::slot(7)] += 2;
        after.sum += 14;
        let d = after.since(&before);
        assert_eq!((d.count(), d.sum), (2, 14));
        assert_eq!(
            d.max, 7,
            "the max is bounded by the slot, not the old max of 100"
        );
    }

    #[test]
    fn tail_samples_reach_p99() {
        let mut s = Snapshot::default();
        for _ in 0..55 {
            s.slots[hist::slot(30)] += 1;
        }
        for v in [2100u64, 3000, 3926] {
            s.slots[hist::slot(v)] += 1;
        }
        s.max = 3926;
        let p: std::collections::HashMap<_, _> = s.percentiles().into_iter().collect();
        assert!(p["p99"] >= 2048, "{p:?}");
    }
}

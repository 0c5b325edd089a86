//! Metrics for Prometheus: the text exposition format (0.0.4) and
//! OpenMetrics 1.0, and cumulative histograms in seconds built from the
//! kernel's log-linear ones.
//!
//! Written here rather than with a metrics crate: the values are not
//! observed in user space but read, already bucketed, from kernel maps at
//! scrape time, and the crates' registries are built around observing.
//! What is left is a few lines of a plain text format.

use std::fmt::Write as _;

use rtrace_common::hist::{self, Hist, SLOTS};

/// Which text format a scraper asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Prometheus' text format, version 0.0.4.
    Prometheus,
    /// OpenMetrics 1.0 text.
    OpenMetrics,
}

impl Format {
    /// The format an `Accept` header asks for: OpenMetrics where it is
    /// named, Prometheus' text otherwise.
    pub fn negotiate(accept: Option<&str>) -> Self {
        match accept {
            Some(a) if a.contains("application/openmetrics-text") => Self::OpenMetrics,
            _ => Self::Prometheus,
        }
    }

    /// The `Content-Type` of a response in this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Self::Prometheus => "text/plain; version=0.0.4; charset=utf-8",
            Self::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }
}

/// A metric family's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up; the name ends in `_total`.
    Counter,
    /// Goes up and down.
    Gauge,
    /// Cumulative buckets, a sum and a count.
    Histogram,
}

/// One scrape's response being written.
pub struct Exposition {
    format: Format,
    text: String,
}

/// Label names and values of one sample.
pub type Labels<'a> = &'a [(&'a str, &'a str)];

impl Exposition {
    /// An empty response in `format`.
    pub fn new(format: Format) -> Self {
        Self {
            format,
            text: String::with_capacity(16 * 1024),
        }
    }

    /// Starts family `name` (a counter's ends in `_total`); its samples
    /// follow through the returned writer.
    pub fn family(&mut self, name: &'static str, kind: Kind, help: &str) -> Family<'_> {
        // OpenMetrics names a counter family without the suffix its
        // samples carry.
        let meta = match (self.format, kind) {
            (Format::OpenMetrics, Kind::Counter) => name.strip_suffix("_total").unwrap_or(name),
            _ => name,
        };
        let kind_name = match kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        };
        let _ = writeln!(self.text, "# HELP {meta} {}", escape(help, false));
        let _ = writeln!(self.text, "# TYPE {meta} {kind_name}");
        Family { out: self, name }
    }

    /// The response's body, ended as its format requires.
    pub fn finish(mut self) -> String {
        if self.format == Format::OpenMetrics {
            self.text.push_str("# EOF\n");
        }
        self.text
    }
}

/// Samples of one family.
pub struct Family<'a> {
    out: &'a mut Exposition,
    name: &'static str,
}

impl Family<'_> {
    /// One counter or gauge sample.
    pub fn value(&mut self, labels: Labels<'_>, value: f64) -> &mut Self {
        self.line("", labels, None, value);
        self
    }

    /// One histogram: its cumulative buckets up to `+Inf`, sum and count.
    pub fn histogram(&mut self, labels: Labels<'_>, h: &Seconds) -> &mut Self {
        let mut cumulative = 0;
        for (le, n) in h.bounds.iter().zip(&h.counts) {
            cumulative += n;
            self.line(
                "_bucket",
                labels,
                Some(&format_value(*le)),
                cumulative as f64,
            );
        }
        let count = cumulative + h.over;
        self.line("_bucket", labels, Some("+Inf"), count as f64);
        self.line("_sum", labels, None, h.sum);
        self.line("_count", labels, None, count as f64);
        self
    }

    fn line(&mut self, suffix: &str, labels: Labels<'_>, le: Option<&str>, value: f64) {
        let t = &mut self.out.text;
        t.push_str(self.name);
        t.push_str(suffix);
        if !labels.is_empty() || le.is_some() {
            t.push('{');
            let mut first = true;
            for (k, v) in labels.iter().copied().chain(le.map(|le| ("le", le))) {
                if !first {
                    t.push(',');
                }
                first = false;
                let _ = write!(t, "{k}=\"{}\"", escape(v, true));
            }
            t.push('}');
        }
        t.push(' ');
        t.push_str(&format_value(value));
        t.push('\n');
    }
}

/// A value as both formats write it.
fn format_value(v: f64) -> String {
    if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.to_owned()
    } else if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

/// Escapes a help text (backslash, newline) or a label value (also `"`).
fn escape(s: &str, quote: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '"' if quote => out.push_str("\\\""),
            c => out.push(c),
        }
    }
    out
}

/// The lowest and highest power of two (in nanoseconds) that bound a
/// bucket: 1.024 µs up to 2^39 ns (about 550 s), the last bound below
/// which the kernel's slots are exact.
const LOW_EXP: u32 = 10;
const HIGH_EXP: u32 = hist::MAX_EXP;

/// A histogram of durations in seconds, in power-of-two buckets.
///
/// The kernel counts nanoseconds in log-linear slots that nest exactly
/// inside powers of two, so each bound `2^k ns` is exact: a bucket holds
/// precisely the durations whose whole nanoseconds are below it.
#[derive(Debug, Clone, PartialEq)]
pub struct Seconds {
    /// Upper bounds, in seconds.
    pub bounds: Vec<f64>,
    /// Durations in each bucket (not cumulative), below its bound and at
    /// or above the previous one.
    pub counts: Vec<u64>,
    /// Durations above the last bound.
    pub over: u64,
    /// Sum of the durations, in seconds.
    pub sum: f64,
}

impl Seconds {
    /// The counts of `slots` (nanosecond slots of [`rtrace_common::hist`])
    /// with the sum of their values `sum_ns`.
    pub fn from_slots(slots: &[u64], sum_ns: u64) -> Self {
        let bounds: Vec<f64> = (LOW_EXP..=HIGH_EXP)
            .map(|e| (1u64 << e) as f64 / 1e9)
            .collect();
        let mut counts = vec![0; bounds.len()];
        let mut over = 0;
        for (s, &n) in slots.iter().enumerate() {
            let (_, high) = hist::slot_range(s);
            // The first bound at or above every value of the slot.
            let need = 64 - high.leading_zeros();
            match need.max(LOW_EXP) {
                e if e <= HIGH_EXP && s < SLOTS - 1 => counts[(e - LOW_EXP) as usize] += n,
                _ => over += n,
            }
        }
        Self {
            bounds,
            counts,
            over,
            sum: sum_ns as f64 / 1e9,
        }
    }
}

/// A kernel histogram's counts kept as running 64-bit totals.
///
/// The kernel's slots are 32 bits, per CPU or per key: at a million
/// events a second one wraps in about an hour. Reading more often than
/// that and adding each slot's wrapping difference keeps the totals exact
/// for as long as the exporter runs.
#[derive(Debug, Clone)]
pub struct Running {
    last: Vec<[u32; SLOTS]>,
    last_sum: Vec<u64>,
    /// Counts per slot since the start.
    pub slots: Vec<u64>,
    /// Sum of the values since the start.
    pub sum: u64,
}

impl Default for Running {
    fn default() -> Self {
        Self {
            last: Vec::new(),
            last_sum: Vec::new(),
            slots: vec![0; SLOTS],
            sum: 0,
        }
    }
}

impl Running {
    /// Adds what changed in the copies `now` (one per CPU, or one) since
    /// the last call.
    pub fn update<'a>(&mut self, now: impl IntoIterator<Item = &'a Hist>) {
        for (i, h) in now.into_iter().enumerate() {
            if self.last.len() <= i {
                self.last.push([0; SLOTS]);
                self.last_sum.push(0);
            }
            for (s, (&cur, prev)) in h.slots.iter().zip(self.last[i].iter_mut()).enumerate() {
                self.slots[s] += u64::from(cur.wrapping_sub(*prev));
                *prev = cur;
            }
            self.sum = self.sum.wrapping_add(h.sum.wrapping_sub(self.last_sum[i]));
            self.last_sum[i] = h.sum;
        }
    }

    /// Adds the totals of `other` (another key's) to these.
    pub fn add(&mut self, other: &Running) {
        for (a, b) in self.slots.iter_mut().zip(&other.slots) {
            *a += b;
        }
        self.sum = self.sum.wrapping_add(other.sum);
    }

    /// The totals as a histogram in seconds.
    pub fn seconds(&self) -> Seconds {
        Seconds::from_slots(&self.slots, self.sum)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hist_of(values: &[u64]) -> Hist {
        let mut h = Hist {
            slots: [0; SLOTS],
            max: 0,
            sum: 0,
        };
        for &v in values {
            h.slots[hist::slot(v)] += 1;
            h.sum += v;
        }
        h
    }

    #[test]
    fn buckets_hold_exactly_the_values_below_their_bound() {
        let mut r = Running::default();
        r.update([&hist_of(&[
            0,
            1023,
            1024,
            2047,
            2048,
            1 << 39,
            (1 << 39) - 1,
        ])]);
        let s = r.seconds();
        assert_eq!(s.bounds[0], 1024.0 / 1e9);
        // Below 1024 ns: 0 and 1023; below 2048: 1024 and 2047.
        assert_eq!(s.counts[0], 2);
        assert_eq!(s.counts[1], 2);
        assert_eq!(s.counts[2], 1);
        assert_eq!(*s.counts.last().unwrap(), 1);
        assert_eq!(s.over, 1);
    }

    #[test]
    fn wrapped_slots_keep_counting() {
        let mut r = Running::default();
        let mut h = hist_of(&[]);
        h.slots[3] = u32::MAX - 1;
        r.update([&h]);
        h.slots[3] = 5;
        r.update([&h]);
        assert_eq!(r.slots[3], u64::from(u32::MAX) + 6);
    }

    #[test]
    fn both_formats_write_a_histogram_and_a_counter() {
        for format in [Format::Prometheus, Format::OpenMetrics] {
            let mut e = Exposition::new(format);
            e.family("rtrace_x_total", Kind::Counter, "X \"done\".")
                .value(&[("a", "q\"\\")], 3.0);
            let mut r = Running::default();
            r.update([&hist_of(&[1500])]);
            e.family("rtrace_y_seconds", Kind::Histogram, "Y.")
                .histogram(&[], &r.seconds());
            let text = e.finish();
            let counter_meta = if format == Format::OpenMetrics {
                "# TYPE rtrace_x counter"
            } else {
                "# TYPE rtrace_x_total counter"
            };
            assert!(text.contains(counter_meta), "{text}");
            assert!(
                text.contains("rtrace_x_total{a=\"q\\\"\\\\\"} 3\n"),
                "{text}"
            );
            assert!(text.contains("rtrace_y_seconds_bucket{le=\"0.000001024\"} 0\n"));
            assert!(text.contains("rtrace_y_seconds_bucket{le=\"0.000002048\"} 1\n"));
            assert!(text.contains("rtrace_y_seconds_bucket{le=\"+Inf\"} 1\n"));
            assert!(text.contains("rtrace_y_seconds_sum 0.0000015\n"));
            assert_eq!(text.ends_with("# EOF\n"), format == Format::OpenMetrics);
        }
    }
}

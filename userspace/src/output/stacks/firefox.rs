//! `--firefox FILE`: the Firefox Profiler's processed format, written
//! with `fxprof-processed-profile` (the crate samply writes it with).
//! Open it by dragging the file into <https://profiler.firefox.com>
//! (nothing is uploaded unless asked).
//!
//! - One Firefox thread per sampled thread, in its process (named by the
//!   command of its main thread, else of its first sampled thread), its
//!   samples in time order.
//! - Frames are labels (rtrace has named them), in categories that
//!   follow the flame graph's colours: Kernel, Native, JIT, Interpreted
//!   (Python's and other runtimes'), Java, JavaScript and Inlined. Java
//!   and JavaScript code reach rtrace as JIT or interpreted frames of a
//!   perf map: they are told apart by their names only (V8's `JS:`,
//!   `LazyCompile:`, `~` and `*` prefixes; the JVM's `Interpreter` and
//!   `Lpackage/Class;` or dotted `java.`/`jdk.` names); the rest of the
//!   JIT stays JIT.
//! - The format has no CPU per sample: as samply's per-CPU threads do,
//!   each CPU also gets a thread of its own ("CPU 3"), in a process
//!   "CPUs", with every sample taken on it. Those threads are hidden at
//!   first (show them from the track menu), so that the threads' own
//!   tracks are what opens; a sample is thus in the file twice, once in
//!   its thread and once in its CPU's.
//! - Time off the CPU ([`Sample::off_cpu`], or every sample of
//!   [`Unit::OffCpuNanoseconds`]) is a sample weighted by its duration, in
//!   microseconds, at the end of the interval, and an "Off CPU" interval
//!   marker over it on the thread's track, its duration in its data.
//!   Weights in microseconds are rounded so that each thread's running
//!   total is its nanoseconds' rounded: a thread's weights add up to its
//!   time to the microsecond, however many intervals it had.
//! - Allocations held ([`Unit::Bytes`], memleak's) are samples at the time
//!   each was made, weighted by its bytes, in threads whose weights the
//!   profiler shows as bytes.
//!
//! [`Sample::off_cpu`]: crate::stacks::sample::Sample::off_cpu

use std::{collections::HashMap, io::Write, sync::Arc, time::Duration};

use anyhow::Context as _;
use fxprof_processed_profile::{
    CategoryColor, CategoryHandle, CpuDelta, Frame as FxFrame, FrameFlags, FrameInfo,
    MarkerFieldFlags, MarkerFieldFormat, MarkerTiming, ProcessHandle, Profile, ReferenceTimestamp,
    SamplingInterval, StackHandle, StaticSchemaMarker, StaticSchemaMarkerField, StringHandle,
    ThreadHandle, Timestamp, WeightType,
};

use crate::stacks::{
    sample::Timed,
    symbolize::{Frame, Kind},
};

/// What a profile's weights count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Each sample's `count` is a number of samples (usually 1).
    Samples,
    /// Each sample's `count` is nanoseconds, on the CPU or off it as
    /// [`Sample::off_cpu`] says (`profile --off-cpu`): written as
    /// microseconds, the Firefox Profiler's weights being 32-bit
    /// integers.
    ///
    /// [`Sample::off_cpu`]: crate::stacks::sample::Sample::off_cpu
    Nanoseconds,
    /// Each sample's `count` is nanoseconds off the CPU (offcputime,
    /// wakeuptime): every sample is time off the CPU.
    OffCpuNanoseconds,
    /// Each sample counts once, whatever its `count`: perf's period,
    /// which the profiler's call tree would take for a number of samples
    /// (`--samples` keeps it as the weight).
    Periods,
    /// Each sample's `count` is bytes (memleak's allocations held): the
    /// threads' weights are bytes, and no CPU time.
    Bytes,
}

/// What the file says about the run besides its samples.
#[derive(Debug, Clone)]
pub struct Meta {
    /// The product, the profile's title in the profiler
    /// (`rtrace profile: cpu-clock at 49 Hz`).
    pub product: String,
    /// What the samples' `count` is.
    pub unit: Unit,
    /// The intended time between two samples of a thread, in nanoseconds
    /// (the sampling period).
    pub interval_ns: u64,
    /// When the run began, in nanoseconds since the Unix epoch: the
    /// profile's time zero, or the earliest wait's start where it
    /// began before. 0: the earliest sample's time.
    pub start_ns: u64,
}

/// The categories, by [`Category`] index.
const CATEGORIES: [(&str, CategoryColor); 7] = [
    ("Kernel", CategoryColor::Orange),
    ("Native", CategoryColor::Red),
    ("JIT", CategoryColor::Green),
    ("Interpreted", CategoryColor::Purple),
    ("Java", CategoryColor::LightGreen),
    ("JavaScript", CategoryColor::Yellow),
    ("Inlined", CategoryColor::LightBlue),
];

/// A frame's category, an index in [`CATEGORIES`].
fn category(f: &Frame) -> usize {
    match f.kind {
        Kind::Kernel => 0,
        Kind::User => 1,
        Kind::Inlined => 6,
        Kind::Jit | Kind::Interpreted => {
            let n = f.name.as_ref();
            if is_javascript(n) {
                5
            } else if is_java(n) {
                4
            } else if f.kind == Kind::Jit {
                2
            } else {
                3
            }
        }
    }
}

/// V8's perf map names: `JS:*fn file.js:1` (Node 18+), `LazyCompile:`,
/// `Function:` (older), and the bare `~`/`*` of interpreted and optimized
/// code.
fn is_javascript(name: &str) -> bool {
    ["JS:", "LazyCompile:", "Function:", "Script:", "~", "*"]
        .iter()
        .any(|p| name.starts_with(p))
}

/// The JVM's perf map names: perf-map-agent's `Ljava/lang/Thread;::run`,
/// dotted class names, and its template interpreter.
fn is_java(name: &str) -> bool {
    (name.starts_with('L') && name.contains(";::"))
        || name.starts_with("java.")
        || name.starts_with("jdk.")
        || name.starts_with("Interpreter")
}

/// The interval marker of time off the CPU.
#[derive(Debug, Clone)]
struct OffCpu {
    /// "Off CPU".
    name: StringHandle,
    /// Its category.
    category: CategoryHandle,
    /// How long, in milliseconds.
    ms: f64,
}

impl StaticSchemaMarker for OffCpu {
    const UNIQUE_MARKER_TYPE_NAME: &'static str = "OffCpu";
    const DESCRIPTION: Option<&'static str> = Some("Time the thread spent off the CPU");
    const CHART_LABEL: Option<&'static str> = Some("{marker.name}");
    const TABLE_LABEL: Option<&'static str> = Some("{marker.name} {marker.data.duration}");
    const FIELDS: &'static [StaticSchemaMarkerField] = &[StaticSchemaMarkerField {
        key: "duration",
        label: "Off the CPU for",
        format: MarkerFieldFormat::Milliseconds,
        flags: MarkerFieldFlags::empty(),
    }];

    fn name(&self, _profile: &mut Profile) -> StringHandle {
        self.name
    }

    fn category(&self, _profile: &mut Profile) -> CategoryHandle {
        self.category
    }

    fn string_field_value(&self, _field_index: u32) -> StringHandle {
        // The schema has no string field.
        self.name
    }

    fn number_field_value(&self, _field_index: u32) -> f64 {
        self.ms
    }
}

/// Where samples go while the profile is built: its handles and the
/// stacks interned in each thread.
struct Builder {
    profile: Profile,
    categories: Vec<CategoryHandle>,
    processes: HashMap<(u32, u64), ProcessHandle>,
    threads: HashMap<(u32, u64, u32), ThreadHandle>,
    cpus: HashMap<u32, ThreadHandle>,
    cpu_process: Option<ProcessHandle>,
    /// Stacks by thread and the identity of the sample's frames (its
    /// shared user and kernel stacks, whether it is off the CPU, and its
    /// waker's shared stacks).
    stacks: HashMap<(ThreadHandle, StackId), Option<StackHandle>>,
    zero: u64,
}

/// A sample's frames by identity: its shared user and kernel stacks,
/// whether it is off the CPU, and its waker's shared stacks.
type StackId = (usize, usize, bool, usize, usize);

/// Says what new thread `th`'s sample weights are, where they are not
/// the format's default (a number of samples): bytes for memleak's.
fn weigh_as(profile: &mut Profile, th: ThreadHandle, unit: Unit) {
    if unit == Unit::Bytes {
        profile.set_thread_samples_weight_type(th, WeightType::Bytes);
    }
}

impl Builder {
    fn timestamp(&self, ns: u64) -> Timestamp {
        Timestamp::from_nanos_since_reference(ns.saturating_sub(self.zero))
    }

    fn stack(&mut self, thread: ThreadHandle, t: &Timed) -> Option<StackHandle> {
        let s = &t.sample;
        let key = (
            thread,
            (
                Arc::as_ptr(&s.user).cast::<u8>() as usize,
                Arc::as_ptr(&s.kernel).cast::<u8>() as usize,
                s.off_cpu,
                s.waker
                    .as_ref()
                    .map_or(0, |w| Arc::as_ptr(&w.user).cast::<u8>() as usize),
                s.waker
                    .as_ref()
                    .map_or(0, |w| Arc::as_ptr(&w.kernel).cast::<u8>() as usize),
            ),
        );
        if let Some(h) = self.stacks.get(&key) {
            return *h;
        }
        let frames: Vec<FrameInfo> = s
            .root_first(false)
            .iter()
            .map(|f| FrameInfo {
                frame: FxFrame::Label(
                    self.profile
                        .intern_string(&crate::output::stacks::name(f, false)),
                ),
                category_pair: self.categories[category(f)].into(),
                flags: if category(f) == 5 {
                    FrameFlags::IS_JS
                } else {
                    FrameFlags::empty()
                },
            })
            .collect();
        let h = self.profile.intern_stack_frames(thread, frames.into_iter());
        self.stacks.insert(key, h);
        h
    }
}

/// Writes `samples` to `out` as a processed Firefox profile.
pub fn write(samples: &[Timed], meta: &Meta, out: &mut dyn Write) -> anyhow::Result<()> {
    let mut order: Vec<&Timed> = samples.iter().collect();
    order.sort_by_key(|t| (t.time, t.cpu));
    let is_off = |t: &Timed| t.sample.off_cpu || meta.unit == Unit::OffCpuNanoseconds;
    // The earliest instant of the file: a wait can have begun before the
    // run's start (a thread that left the CPU as the programs were
    // attached), and its marker is drawn whole from there.
    let earliest = order
        .iter()
        .map(|t| {
            if is_off(t) {
                t.time.saturating_sub(t.sample.count)
            } else {
                t.time
            }
        })
        .min();
    let zero = match (meta.start_ns, earliest) {
        (0, Some(e)) => e,
        (z, Some(e)) => z.min(e),
        (z, None) => z,
    };
    let mut profile = Profile::new(
        &meta.product,
        ReferenceTimestamp::from_duration_since_unix_epoch(Duration::from_nanos(zero)),
        SamplingInterval::from_nanos(meta.interval_ns.max(1)),
    );
    profile.set_os_name("Linux");
    profile.set_symbolicated(true);
    let categories = CATEGORIES
        .iter()
        .map(|&(name, color)| profile.add_category(name, color))
        .collect();
    let mut b = Builder {
        profile,
        categories,
        processes: HashMap::new(),
        threads: HashMap::new(),
        cpus: HashMap::new(),
        cpu_process: None,
        stacks: HashMap::new(),
        zero,
    };
    // Each track's nanoseconds so far and microseconds written, with
    // weights in nanoseconds.
    let mut running: HashMap<ThreadHandle, (u64, u64)> = HashMap::new();
    // A process is named by its main thread's command where it was
    // sampled, else by its first sampled thread's.
    let mut names: HashMap<(u32, u64), &str> = HashMap::new();
    for t in &order {
        let s = &t.sample;
        let e = names.entry((s.pid, s.started)).or_insert(&s.comm);
        if s.tid == s.pid {
            *e = &s.comm;
        }
    }
    let off_name = b.profile.intern_string("Off CPU");
    let mut visible = Vec::new();
    for t in &order {
        let s = &t.sample;
        let at = b.timestamp(t.time);
        let proc_key = (s.pid, s.started);
        let process = match b.processes.get(&proc_key) {
            Some(&p) => p,
            None => {
                let name = names.get(&proc_key).copied().unwrap_or(&s.comm);
                let p = b.profile.add_process(name, s.pid, at);
                b.processes.insert(proc_key, p);
                p
            }
        };
        let thread = match b.threads.get(&(s.pid, s.started, s.tid)) {
            Some(&th) => th,
            None => {
                // A sample counted by process alone (tid 0) is the
                // process's main thread's.
                let tid = if s.tid == 0 { s.pid } else { s.tid };
                let th = b.profile.add_thread(process, tid, at, tid == s.pid);
                b.profile.set_thread_name(th, &s.comm);
                weigh_as(&mut b.profile, th, meta.unit);
                b.threads.insert((s.pid, s.started, s.tid), th);
                visible.push(th);
                th
            }
        };
        let cpu_thread = match b.cpus.get(&t.cpu) {
            Some(&th) => th,
            None => {
                let process = *b
                    .cpu_process
                    .get_or_insert_with(|| b.profile.add_process("CPUs", 0, at));
                let th = b.profile.add_thread(process, t.cpu, at, false);
                b.profile.set_thread_name(th, &format!("CPU {}", t.cpu));
                weigh_as(&mut b.profile, th, meta.unit);
                b.cpus.insert(t.cpu, th);
                th
            }
        };
        let off = is_off(t);
        for th in [thread, cpu_thread] {
            let (weight, delta) = match meta.unit {
                Unit::Samples => (
                    s.count,
                    CpuDelta::from_nanos(meta.interval_ns.saturating_mul(s.count)),
                ),
                Unit::Periods => (1, CpuDelta::from_nanos(meta.interval_ns)),
                Unit::Bytes => (s.count, CpuDelta::ZERO),
                Unit::Nanoseconds | Unit::OffCpuNanoseconds => {
                    // Rounded on the running total, not each on its own:
                    // a thousand waits of 1.4 us weigh 1400, not 1000.
                    let (ns, us) = running.entry(th).or_default();
                    *ns = ns.saturating_add(s.count);
                    let weight = ns.saturating_add(500) / 1000 - *us;
                    *us += weight;
                    let delta = if off {
                        CpuDelta::ZERO
                    } else {
                        CpuDelta::from_nanos(s.count)
                    };
                    (weight, delta)
                }
            };
            let weight = i32::try_from(weight).unwrap_or(i32::MAX);
            let stack = b.stack(th, t);
            b.profile.add_sample(th, at, stack, delta, weight);
        }
        if off {
            let marker = OffCpu {
                name: off_name,
                category: b.categories[0],
                ms: s.count as f64 / 1e6,
            };
            let from = b.timestamp(t.time.saturating_sub(s.count));
            b.profile
                .add_marker(thread, MarkerTiming::Interval(from, at), marker);
        }
    }
    for th in visible {
        b.profile.add_initial_visible_thread(th);
    }
    serde_json::to_writer(out, &b.profile).context("cannot write the Firefox profile")
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::{Meta, Unit, category, write};
    use crate::stacks::{
        sample::{Sample, Timed},
        symbolize::{Frame, Kind},
    };

    fn timed(time: u64, cpu: u32, tid: u32, leaf: &str) -> Timed {
        let user: Arc<[Frame]> = [leaf, "main"]
            .iter()
            .map(|n| Frame::missed(n, Kind::User))
            .collect();
        Timed {
            time,
            cpu,
            sample: Sample {
                comm: format!("t{tid}"),
                pid: 10,
                started: 0,
                tid,
                user,
                kernel: Arc::from([Frame::missed("schedule", Kind::Kernel)]),
                count: 1,
                waker: None,
                off_cpu: false,
                slot: 0,
                cut_short: false,
            },
        }
    }

    #[test]
    fn threads_hold_their_samples_in_time_order() {
        let samples = [
            timed(3_000, 0, 11, "hot"),
            timed(1_000, 1, 10, "warm"),
            timed(2_000, 0, 11, "hot"),
        ];
        let meta = Meta {
            product: "test".to_owned(),
            unit: Unit::Samples,
            interval_ns: 1000,
            start_ns: 500,
        };
        let mut out = Vec::new();
        write(&samples, &meta, &mut out).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        let threads = v["threads"].as_array().unwrap();
        let named = |n: &str| {
            threads
                .iter()
                .find(|t| t["name"] == n)
                .unwrap_or_else(|| panic!("no thread {n}"))
        };
        assert_eq!(named("t11")["samples"]["length"], 2);
        assert_eq!(named("t10")["samples"]["length"], 1);
        // The main thread names the process.
        assert_eq!(named("t11")["processName"], "t10");
        assert_eq!(named("CPU 0")["samples"]["length"], 2);
    }

    /// perf's periods count once each; bytes weigh themselves, in
    /// threads whose weights say so.
    #[test]
    fn periods_count_once_and_bytes_are_bytes() {
        let mut samples = [timed(1_000, 0, 10, "a"), timed(2_000, 0, 10, "b")];
        samples[0].sample.count = 250_000;
        samples[1].sample.count = 4096;
        let weights = |unit| {
            let meta = Meta {
                product: "test".to_owned(),
                unit,
                interval_ns: 1000,
                start_ns: 0,
            };
            let mut out = Vec::new();
            write(&samples, &meta, &mut out).unwrap();
            let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
            let t = v["threads"]
                .as_array()
                .unwrap()
                .iter()
                .find(|t| t["name"] == "t10")
                .unwrap()
                .clone();
            (
                t["samples"]["weight"].clone(),
                t["samples"]["weightType"].clone(),
            )
        };
        let (w, _) = weights(Unit::Periods);
        assert!(w.is_null() || w == serde_json::json!([1, 1]), "{w}");
        let (w, kind) = weights(Unit::Bytes);
        assert_eq!(w, serde_json::json!([250_000, 4096]));
        assert_eq!(kind, "bytes");
    }

    #[test]
    fn runtimes_are_told_apart_by_their_names() {
        let f = |n: &str, k| category(&Frame::missed(n, k));
        assert_eq!(f("JS:*fib /x.js:1", Kind::Jit), 5);
        assert_eq!(f("Ljava/lang/Thread;::run", Kind::Jit), 4);
        assert_eq!(f("py::main:/x.py", Kind::Interpreted), 3);
        assert_eq!(f("stub", Kind::Jit), 2);
        assert_eq!(f("schedule", Kind::Kernel), 0);
    }
}

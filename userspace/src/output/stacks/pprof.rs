//! pprof's `profile.proto`, gzipped, as `go tool pprof` and the pprof
//! tools of other languages read it.
//!
//! The few messages needed are encoded by hand: a protobuf code generator
//! would add a build step and a dependency for about a hundred lines.

use std::{collections::HashMap, io::Write as _};

use anyhow::Context as _;

use super::Sample;
use crate::symbolize::{Frame, Kind};

/// A protobuf message being encoded.
#[derive(Default)]
struct Msg(Vec<u8>);

impl Msg {
    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.0.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
    }

    fn key(&mut self, field: u32, wire: u8) {
        self.varint(u64::from(field) << 3 | u64::from(wire));
    }

    /// An integer field (int64, uint64 or bool), left out when zero as
    /// proto3 does.
    fn int(&mut self, field: u32, v: u64) {
        if v != 0 {
            self.key(field, 0);
            self.varint(v);
        }
    }

    fn bytes(&mut self, field: u32, b: &[u8]) {
        self.key(field, 2);
        self.varint(b.len() as u64);
        self.0.extend_from_slice(b);
    }

    fn msg(&mut self, field: u32, m: &Msg) {
        self.bytes(field, &m.0);
    }

    fn packed(&mut self, field: u32, vs: impl IntoIterator<Item = u64>) {
        let mut inner = Msg::default();
        for v in vs {
            inner.varint(v);
        }
        if !inner.0.is_empty() {
            self.bytes(field, &inner.0);
        }
    }
}

/// The string table: index 0 is the empty string, as pprof requires.
struct Strings {
    index: HashMap<String, u64>,
    list: Vec<String>,
}

impl Strings {
    fn new() -> Self {
        let mut s = Self {
            index: HashMap::new(),
            list: Vec::new(),
        };
        s.get("");
        s
    }

    fn get(&mut self, v: &str) -> u64 {
        if let Some(&i) = self.index.get(v) {
            return i;
        }
        let i = self.list.len() as u64;
        self.index.insert(v.to_owned(), i);
        self.list.push(v.to_owned());
        i
    }
}

/// What the samples measure.
pub struct Meta<'a> {
    /// The sample types, each a type and a unit: `("samples", "count")`
    /// then `("cpu", "nanoseconds")` for a CPU profile.
    pub types: &'a [(&'a str, &'a str)],
    /// A sample's values, one for each of `types`.
    pub values: &'a dyn Fn(&Sample) -> Vec<u64>,
    /// The sampled event and the unit of `period`, e.g. `("cpu",
    /// "nanoseconds")`.
    pub period_type: (&'a str, &'a str),
    /// Event units one sample stands for.
    pub period: u64,
    /// When profiling began, in nanoseconds since the epoch.
    pub time_nanos: u64,
    /// How long it lasted.
    pub duration_nanos: u64,
}

/// Writes `samples` as a gzipped pprof profile. Each sample has the values
/// `meta` gives it, and carries the command and pid (and the waker's) as
/// labels.
pub fn write(
    samples: &[Sample],
    out: &mut dyn std::io::Write,
    meta: &Meta<'_>,
) -> anyhow::Result<()> {
    let mut strings = Strings::new();
    let mut profile = Msg::default();
    let value_type = |strings: &mut Strings, ty: &str, unit: &str| {
        let mut m = Msg::default();
        m.int(1, strings.get(ty));
        m.int(2, strings.get(unit));
        m
    };
    for &(ty, unit) in meta.types {
        let m = value_type(&mut strings, ty, unit);
        profile.msg(1, &m);
    }

    // One function per distinct frame, and one location for it with the
    // same id.
    let mut functions: HashMap<(String, Option<String>), u64> = HashMap::new();
    let mut function_msgs = Vec::new();
    let mut location_msgs = Vec::new();
    let mut location_of = |f: &Frame, strings: &mut Strings| -> u64 {
        let shown = display(f);
        let next = functions.len() as u64 + 1;
        *functions
            .entry((shown.clone(), f.module.as_deref().map(str::to_owned)))
            .or_insert_with(|| {
                let mut m = Msg::default();
                m.int(1, next);
                m.int(2, strings.get(&shown));
                m.int(3, strings.get(&f.name));
                m.int(4, strings.get(f.module.as_deref().unwrap_or("")));
                function_msgs.push(m);
                let mut line = Msg::default();
                line.int(1, next);
                let mut m = Msg::default();
                m.int(1, next);
                m.msg(4, &line);
                location_msgs.push(m);
                next
            })
    };

    let comm_key = strings.get("comm");
    let pid_key = strings.get("pid");
    let waker_comm_key = strings.get("waker_comm");
    let waker_pid_key = strings.get("waker_pid");
    for s in samples {
        let ids: Vec<u64> = s
            .root_first(false)
            .iter()
            .rev()
            .map(|f| location_of(f, &mut strings))
            .collect();
        let mut m = Msg::default();
        m.packed(1, ids);
        m.packed(2, (meta.values)(s));
        // Labels: a string (field 2) or a number (field 3) under a key.
        let mut label = |key: u64, field: u32, value: u64| {
            let mut l = Msg::default();
            l.int(1, key);
            l.int(field, value);
            m.msg(3, &l);
        };
        label(comm_key, 2, strings.get(&s.comm));
        label(pid_key, 3, u64::from(s.pid));
        if let Some(w) = &s.waker {
            label(waker_comm_key, 2, strings.get(&w.comm));
            label(waker_pid_key, 3, u64::from(w.pid));
        }
        profile.msg(2, &m);
    }
    for m in &location_msgs {
        profile.msg(4, m);
    }
    for m in &function_msgs {
        profile.msg(5, m);
    }
    let period_type = value_type(&mut strings, meta.period_type.0, meta.period_type.1);
    for s in &strings.list {
        profile.bytes(6, s.as_bytes());
    }
    profile.int(9, meta.time_nanos);
    profile.int(10, meta.duration_nanos);
    profile.msg(11, &period_type);
    profile.int(12, meta.period);

    let mut gz = flate2::write::GzEncoder::new(out, flate2::Compression::default());
    gz.write_all(&profile.0)
        .and_then(|()| gz.finish().map(drop))
        .context("cannot write the pprof profile")
}

/// A frame's name as pprof shows it: inlined frames are marked, as pprof
/// has no other way to tell them apart in a location of their own.
fn display(f: &Frame) -> String {
    match f.kind {
        Kind::Inlined => format!("{} (inlined)", f.name),
        _ => f.name.to_string(),
    }
}

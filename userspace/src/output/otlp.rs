//! OTLP profiles: counted stacks as the OpenTelemetry protocol's
//! profiles signal carries them, and the client that ships them
//! ([`ship`]).
//!
//! The signal is not stable. Its messages are those of OTLP 1.10's
//! `profiles/v1development`, which the pinned `opentelemetry-proto`
//! crate (0.33.1) generates and the Collector release the tests build
//! (0.152) takes; releases before and after it changed the messages
//! incompatibly (the dictionary, the stack table, attributes by index).
//!
//! One request holds one resource a process: its attributes are the
//! semantic conventions' (`process.pid`, `process.executable.name`,
//! `container.id`, `k8s.pod.uid`, `host.name`...). Locations keep their
//! mapping (file, file offset, GNU build id as
//! `process.executable.build_id.gnu`), their address and the functions
//! rtrace named, so that a backend can name again what rtrace did not.

pub mod ship;

use std::{collections::HashMap, sync::Arc};

use opentelemetry_proto::tonic::{
    collector::profiles::v1development::ExportProfilesServiceRequest,
    common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value},
    profiles::v1development::{
        Function, KeyValueAndUnit, Line, Location, Mapping, Profile, ProfilesDictionary,
        ResourceProfiles, Sample as OtlpSample, ScopeProfiles, Stack, ValueType,
    },
    resource::v1::Resource,
};
use prost::Message as _;

use crate::{
    output::stacks::pprof::by_location,
    stacks::{
        sample::Sample,
        symbolize::{CodeMapping, Frame, Kind},
    },
};

/// An attribute's value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A string.
    Str(String),
    /// An integer.
    Int(i64),
}

/// Attributes by their semantic conventions' keys.
pub type Attributes = Vec<(&'static str, Value)>;

fn key_value(key: &str, v: &Value) -> KeyValue {
    let value = match v {
        Value::Str(s) => any_value::Value::StringValue(s.clone()),
        Value::Int(i) => any_value::Value::IntValue(*i),
    };
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue { value: Some(value) }),
        ..KeyValue::default()
    }
}

/// What one profile is: its window and its rate.
pub struct Window {
    /// When sampling of this profile began, in nanoseconds since the epoch.
    pub start_ns: u64,
    /// How long it lasted.
    pub duration_ns: u64,
    /// CPU time one sample stands for, in nanoseconds.
    pub period_ns: u64,
    /// The counts are nanoseconds on and off the CPU (the engine's
    /// off-CPU sampling), not samples: each process gets a `cpu` and an
    /// `off_cpu` profile, both in nanoseconds.
    pub off_cpu: bool,
}

/// The attributes of a process, the resource its samples are sent as.
pub trait Resources {
    /// The attributes of process `pid` started at `started` (nanoseconds
    /// since the epoch; 0 unknown): the host's and the process's.
    fn of(&mut self, pid: u32, started: u64) -> Attributes;
}

/// The resources of this host's processes, read from `/proc` once a
/// process and kept while it is sampled.
pub struct HostResources {
    host: Attributes,
    known: HashMap<(u32, u64), Attributes>,
    /// Processes looked up in the current request, so that the others
    /// can be forgotten ([`HostResources::forget_unused`]).
    used: std::collections::HashSet<(u32, u64)>,
}

impl Default for HostResources {
    fn default() -> Self {
        let mut host = vec![
            (
                "host.name",
                Value::Str(crate::kernel::host_name().unwrap_or_default()),
            ),
            ("host.arch", Value::Str(host_arch().to_owned())),
            ("os.type", Value::Str("linux".to_owned())),
        ];
        if let Ok(id) = std::fs::read_to_string("/etc/machine-id") {
            host.push(("host.id", Value::Str(id.trim().to_owned())));
        }
        Self {
            host,
            known: HashMap::new(),
            used: Default::default(),
        }
    }
}

/// The semantic conventions' name of this machine's architecture.
fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "powerpc64" => "ppc64",
        "s390x" => "s390x",
        "x86" => "x86",
        other => other,
    }
}

impl HostResources {
    /// Forgets the processes no request has asked for since the last
    /// call: what is kept is bounded by the processes of one period.
    pub fn forget_unused(&mut self) {
        let used = std::mem::take(&mut self.used);
        self.known.retain(|k, _| used.contains(k));
    }
}

impl Resources for HostResources {
    fn of(&mut self, pid: u32, started: u64) -> Attributes {
        self.used.insert((pid, started));
        let process = self.known.entry((pid, started)).or_insert_with(|| {
            let mut a = vec![("process.pid", Value::Int(i64::from(pid)))];
            if let Some(exe) = crate::kernel::exe_of(pid) {
                let name = exe.file_name().map(|n| n.to_string_lossy().into_owned());
                a.push((
                    "process.executable.path",
                    Value::Str(exe.display().to_string()),
                ));
                if let Some(name) = name {
                    a.push(("process.executable.name", Value::Str(name)));
                }
            } else if let Some(comm) = crate::kernel::comm_of(pid) {
                // Without the right to read its link (another user's
                // process, and no CAP_SYS_PTRACE): the kernel's name of
                // the program, its first 15 bytes.
                a.push(("process.executable.name", Value::Str(comm)));
            }
            if started > 0 {
                a.push((
                    "process.creation.time",
                    Value::Str(super::utc_iso8601(started)),
                ));
            }
            if let Some(cg) = crate::kernel::cgroup_of(pid) {
                let (container, pod) = container_of(&cg);
                if let Some(id) = container {
                    a.push(("container.id", Value::Str(id)));
                }
                if let Some(uid) = pod {
                    a.push(("k8s.pod.uid", Value::Str(uid)));
                }
            }
            a
        });
        self.host
            .iter()
            .cloned()
            .chain(process.iter().cloned())
            .collect()
    }
}

/// The kind of frame, as the semantic conventions' `profile.frame.type`
/// names it; `None` for JIT code named from a perf map, whose runtime
/// the frame does not say.
fn frame_type(f: &Frame) -> Option<&'static str> {
    match f.kind {
        Kind::Kernel => Some("kernel"),
        Kind::User | Kind::Inlined => Some("native"),
        // The in-kernel CPython walk names its frames with no module;
        // perf maps' interpreted frames carry `[jit]` or the map's file.
        Kind::Interpreted if f.module.is_none() => Some("cpython"),
        Kind::Interpreted | Kind::Jit => None,
    }
}

/// The dictionary being built: each entry once, each table with its zero
/// entry first, as the protocol requires.
struct Dictionary {
    d: ProfilesDictionary,
    strings: HashMap<String, i32>,
    attributes: HashMap<(String, String), i32>,
    mappings: HashMap<*const CodeMapping, i32>,
    named: HashMap<Arc<str>, i32>,
    functions: HashMap<(Arc<str>, Option<String>), i32>,
    locations: HashMap<(Vec<Frame>, u64), i32>,
    stacks: HashMap<Vec<i32>, i32>,
}

impl Dictionary {
    fn new() -> Self {
        let mut d = Self {
            d: ProfilesDictionary {
                mapping_table: vec![Mapping::default()],
                location_table: vec![Location::default()],
                function_table: vec![Function::default()],
                link_table: vec![Default::default()],
                string_table: Vec::new(),
                attribute_table: vec![KeyValueAndUnit::default()],
                stack_table: vec![Stack::default()],
            },
            strings: HashMap::new(),
            attributes: HashMap::new(),
            mappings: HashMap::new(),
            named: HashMap::new(),
            functions: HashMap::new(),
            locations: HashMap::new(),
            stacks: HashMap::new(),
        };
        d.string("");
        d
    }

    fn string(&mut self, s: &str) -> i32 {
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        let i = self.d.string_table.len() as i32;
        self.d.string_table.push(s.to_owned());
        self.strings.insert(s.to_owned(), i);
        i
    }

    /// A string attribute of the table.
    fn attribute(&mut self, key: &str, value: &str) -> i32 {
        let k = (key.to_owned(), value.to_owned());
        if let Some(&i) = self.attributes.get(&k) {
            return i;
        }
        let i = self.d.attribute_table.len() as i32;
        let key_strindex = self.string(key);
        self.d.attribute_table.push(KeyValueAndUnit {
            key_strindex,
            value: Some(AnyValue {
                value: Some(any_value::Value::StringValue(value.to_owned())),
            }),
            unit_strindex: 0,
        });
        self.attributes.insert(k, i);
        i
    }

    fn mapping(&mut self, m: &Arc<CodeMapping>) -> i32 {
        if let Some(&i) = self.mappings.get(&Arc::as_ptr(m)) {
            return i;
        }
        let i = self.d.mapping_table.len() as i32;
        let filename_strindex = self.string(&m.file);
        let attribute_indices = m
            .build_id
            .as_deref()
            .map(|id| vec![self.attribute("process.executable.build_id.gnu", id)])
            .unwrap_or_default();
        self.d.mapping_table.push(Mapping {
            memory_start: m.start,
            memory_limit: m.limit,
            file_offset: m.offset,
            filename_strindex,
            attribute_indices,
        });
        self.mappings.insert(Arc::as_ptr(m), i);
        i
    }

    /// The mapping of frames known by their module alone (`[vdso]`,
    /// `[jit]`), so that a backend names their file as rtrace did.
    fn named_mapping(&mut self, module: &Arc<str>) -> i32 {
        if let Some(&i) = self.named.get(module) {
            return i;
        }
        let i = self.d.mapping_table.len() as i32;
        let filename_strindex = self.string(module);
        self.d.mapping_table.push(Mapping {
            filename_strindex,
            ..Mapping::default()
        });
        self.named.insert(module.clone(), i);
        i
    }

    fn function(&mut self, f: &Frame) -> i32 {
        let file = f.file_line().map(|(file, _)| file.to_owned());
        let key = (f.name.clone(), file);
        if let Some(&i) = self.functions.get(&key) {
            return i;
        }
        let i = self.d.function_table.len() as i32;
        let name_strindex = self.string(&f.name);
        let filename_strindex = self.string(key.1.as_deref().unwrap_or(""));
        self.d.function_table.push(Function {
            name_strindex,
            system_name_strindex: name_strindex,
            filename_strindex,
            start_line: 0,
        });
        self.functions.insert(key, i);
        i
    }

    /// The location of one address: the frames inlined there, leaf
    /// first, and the function they were inlined into, last.
    fn location(&mut self, frames: &[Frame]) -> i32 {
        let last = &frames[frames.len() - 1];
        let key = (frames.to_vec(), last.addr);
        if let Some(&i) = self.locations.get(&key) {
            return i;
        }
        let mapping_index = match (&last.mapping, &last.module) {
            (Some(m), _) => self.mapping(m),
            (None, Some(module)) => self.named_mapping(module),
            (None, None) => 0,
        };
        let lines = frames
            .iter()
            .map(|f| Line {
                function_index: self.function(f),
                line: f.file_line().map_or(0, |(_, l)| i64::from(l)),
                column: 0,
            })
            .collect();
        let attribute_indices = frame_type(last)
            .map(|t| vec![self.attribute("profile.frame.type", t)])
            .unwrap_or_default();
        let i = self.d.location_table.len() as i32;
        self.d.location_table.push(Location {
            mapping_index,
            address: last.addr,
            lines,
            attribute_indices,
        });
        self.locations.insert(key, i);
        i
    }

    /// The stack of a sample: its user frames, then its kernel frames
    /// below them, leaf first as the protocol orders them.
    fn stack(&mut self, s: &Sample) -> i32 {
        let mut locations = Vec::new();
        for frames in [&s.kernel, &s.user] {
            for at in by_location(frames) {
                locations.push(self.location(at));
            }
        }
        // Kernel frames are nearer the leaf: a sample in a system call
        // has the kernel's frames first, then the user frames that made
        // the call.
        if let Some(&i) = self.stacks.get(&locations) {
            return i;
        }
        let i = self.d.stack_table.len() as i32;
        self.d.stack_table.push(Stack {
            location_indices: locations.clone(),
        });
        self.stacks.insert(locations, i);
        i
    }
}

/// The instrumentation scope: rtrace and its version.
fn scope() -> InstrumentationScope {
    InstrumentationScope {
        name: "rtrace".to_owned(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        ..InstrumentationScope::default()
    }
}

/// One export request of `samples`: a resource a process, each with one
/// CPU profile of samples counted (`samples`/`count`, a `cpu` period in
/// nanoseconds), or with `window.off_cpu` a `cpu` and an `off_cpu`
/// profile in nanoseconds; each sample the thread's name.
pub fn request(
    samples: &[Sample],
    window: &Window,
    resources: &mut dyn Resources,
) -> ExportProfilesServiceRequest {
    let mut dict = Dictionary::new();
    let mut value_type = |ty: &str, unit: &str| ValueType {
        type_strindex: dict.string(ty),
        unit_strindex: dict.string(unit),
    };
    // The profiles of each process, by the index of their type.
    let types = if window.off_cpu {
        vec![
            value_type("cpu", "nanoseconds"),
            value_type("off_cpu", "nanoseconds"),
        ]
    } else {
        vec![value_type("samples", "count")]
    };
    let period_type = value_type("cpu", "nanoseconds");
    // Each process (pid, start) with its samples by type.
    type ByType = Vec<Vec<OtlpSample>>;
    let mut by_process: Vec<((u32, u64), ByType)> = Vec::new();
    let mut index: HashMap<(u32, u64), usize> = HashMap::new();
    for s in samples {
        let key = (s.pid, s.started);
        let at = *index.entry(key).or_insert_with(|| {
            by_process.push((key, vec![Vec::new(); types.len()]));
            by_process.len() - 1
        });
        let (kind, value) = match (window.off_cpu, s.off_cpu) {
            (false, _) => (0, s.count),
            (true, off) => (usize::from(off), s.count),
        };
        let sample = OtlpSample {
            stack_index: dict.stack(s),
            attribute_indices: vec![dict.attribute("thread.name", &s.comm)],
            link_index: 0,
            values: vec![value as i64],
            timestamps_unix_nano: Vec::new(),
        };
        by_process[at].1[kind].push(sample);
    }
    let resource_profiles = by_process
        .into_iter()
        .map(|((pid, started), by_type)| {
            let attributes = resources
                .of(pid, started)
                .iter()
                .map(|(k, v)| key_value(k, v))
                .collect();
            let profiles = by_type
                .into_iter()
                .zip(&types)
                .enumerate()
                .filter(|(_, (samples, _))| !samples.is_empty())
                .map(|(kind, (samples, ty))| Profile {
                    sample_type: Some(*ty),
                    samples,
                    time_unix_nano: window.start_ns,
                    duration_nano: window.duration_ns,
                    period_type: Some(period_type),
                    period: window.period_ns as i64,
                    profile_id: profile_id(window.start_ns, pid, started, kind as u64),
                    ..Profile::default()
                })
                .collect();
            ResourceProfiles {
                resource: Some(Resource {
                    attributes,
                    ..Resource::default()
                }),
                scope_profiles: vec![ScopeProfiles {
                    scope: Some(scope()),
                    profiles,
                    schema_url: String::new(),
                }],
                schema_url: String::new(),
            }
        })
        .collect();
    ExportProfilesServiceRequest {
        resource_profiles,
        dictionary: Some(dict.d),
    }
}

/// A profile's 16-byte id: its window's start, the process, its kind and
/// a random word of this run, so that two hosts' profiles of one instant
/// differ.
fn profile_id(start_ns: u64, pid: u32, started: u64, kind: u64) -> Vec<u8> {
    static RUN: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let run = *RUN.get_or_init(|| {
        let mut b = [0u8; 8];
        // SAFETY: a valid buffer of its length.
        let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
        if n == 8 {
            u64::from_ne_bytes(b)
        } else {
            crate::kernel::monotonic_ns()
        }
    });
    let mut id = Vec::with_capacity(16);
    id.extend_from_slice(&(start_ns ^ run).to_le_bytes());
    id.extend_from_slice(
        &((u64::from(pid) << 32) ^ started ^ kind ^ run.rotate_left(17)).to_le_bytes(),
    );
    id
}

/// The request's encoding on the wire (OTLP/HTTP's binary protobuf).
pub fn encode(r: &ExportProfilesServiceRequest) -> Vec<u8> {
    r.encode_to_vec()
}

/// The container a cgroup path (`/proc/PID/cgroup`'s v2 line) names:
/// its id (64 hex digits, as Docker, containerd, CRI-O and Podman name
/// their scopes and directories), and the Kubernetes pod's uid where a
/// kubelet's `pod<UID>` directory holds it.
pub fn container_of(cgroup: &str) -> (Option<String>, Option<String>) {
    let mut id = None;
    let mut pod = None;
    for part in cgroup.split('/') {
        let part = part.strip_suffix(".scope").unwrap_or(part);
        let part = part.strip_suffix(".slice").unwrap_or(part);
        // `docker-ID`, `cri-containerd-ID`, `crio-ID`, `libpod-ID`, `ID`.
        let last = part.rsplit('-').next().unwrap_or(part);
        if last.len() == 64 && last.bytes().all(|b| b.is_ascii_hexdigit()) {
            id = Some(last.to_ascii_lowercase());
        }
        // `pod<UID>` (cgroupfs) or `kubepods-burstable-pod<UID_>` (systemd,
        // with the uid's dashes as underscores).
        if let Some(at) = part.rfind("pod") {
            let uid = part[at + 3..].replace('_', "-");
            let shaped = uid.len() == 36
                && uid.bytes().enumerate().all(|(i, b)| match i {
                    8 | 13 | 18 | 23 => b == b'-',
                    _ => b.is_ascii_hexdigit(),
                });
            if shaped {
                pod = Some(uid);
            }
        }
    }
    (id, pod)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_written_in_utc() {
        assert_eq!(crate::output::utc_iso8601(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            crate::output::utc_iso8601(1_795_123_723_123_000_000),
            "2026-11-19T21:28:43.123Z"
        );
        assert_eq!(
            crate::output::utc_iso8601(951_782_400_000_000_000),
            "2000-02-29T00:00:00.000Z"
        );
    }

    #[test]
    fn containers_and_pods_are_named_from_cgroup_paths() {
        let id = "4f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8";
        let pod = "0b6e6a3c-1d2e-4f50-9a7b-8c9d0e1f2a3b";
        let cases = [
            (format!("/system.slice/docker-{id}.scope"), Some(id), None),
            (format!("/docker/{id}"), Some(id), None),
            (
                format!("/kubepods/burstable/pod{pod}/{id}"),
                Some(id),
                Some(pod),
            ),
            (
                format!(
                    "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice/\
                     cri-containerd-{id}.scope",
                    pod.replace('-', "_")
                ),
                Some(id),
                Some(pod),
            ),
            (
                format!("/machine.slice/libpod-{id}.scope/container"),
                Some(id),
                None,
            ),
            (
                "/user.slice/user-0.slice/session-3.scope".to_owned(),
                None,
                None,
            ),
            ("/".to_owned(), None, None),
        ];
        for (path, want_id, want_pod) in cases {
            let (got_id, got_pod) = container_of(&path);
            assert_eq!(got_id.as_deref(), want_id, "{path}");
            assert_eq!(got_pod.as_deref(), want_pod, "{path}");
        }
    }

    #[test]
    fn tables_start_with_their_zero_entries_and_hold_each_entry_once() {
        struct Host;
        impl Resources for Host {
            fn of(&mut self, pid: u32, _: u64) -> Attributes {
                vec![("process.pid", Value::Int(i64::from(pid)))]
            }
        }
        let f = |name: &str| Frame::new(name, Kind::User, Some("/bin/x"));
        let stack: Arc<[Frame]> = vec![f("leaf"), f("main")].into();
        let sample = |pid, count| Sample {
            comm: "x".into(),
            pid,
            started: 0,
            tid: 0,
            user: stack.clone(),
            kernel: Arc::from(vec![Frame::new("do_syscall_64", Kind::Kernel, None)]),
            count,
            waker: None,
            off_cpu: false,
            slot: 0,
            cut_short: false,
        };
        let window = Window {
            start_ns: 1,
            duration_ns: 2,
            period_ns: 3,
            off_cpu: false,
        };
        let r = request(&[sample(7, 5), sample(8, 6)], &window, &mut Host);
        let d = r.dictionary.as_ref().unwrap();
        assert_eq!(d.string_table[0], "");
        assert_eq!(d.mapping_table[0], Mapping::default());
        assert_eq!(d.stack_table[0], Stack::default());
        // One stack for both processes: kernel frame, then leaf, then main.
        assert_eq!(d.stack_table.len(), 2);
        let names: Vec<&str> = d.stack_table[1]
            .location_indices
            .iter()
            .map(|&l| {
                let f = d.location_table[l as usize].lines[0].function_index;
                d.string_table[d.function_table[f as usize].name_strindex as usize].as_str()
            })
            .collect();
        assert_eq!(names, ["do_syscall_64", "leaf", "main"]);
        assert_eq!(r.resource_profiles.len(), 2);
        let values: Vec<i64> = r
            .resource_profiles
            .iter()
            .map(|rp| rp.scope_profiles[0].profiles[0].samples[0].values[0])
            .collect();
        assert_eq!(values, [5, 6]);
        // It decodes as the request it is.
        let back = ExportProfilesServiceRequest::decode(&encode(&r)[..]).unwrap();
        assert_eq!(back, r);
    }
}

//! perf's recordings (`perf.data`) read into rtrace's samples, for `rtrace
//! report`: the records in time order (linux-perf-data sorts them by
//! perf's rounds), processes followed through their `fork`, `comm`
//! (exec) and `exit` records, each sample's call chain named by rtrace's
//! own symbolizer from the `mmap` records, and `--call-graph dwarf`
//! samples (registers and a copy of the user stack) unwound here with
//! rtrace's own CFI compiler, the walk the kernel's is tested against.
//!
//! Files are found by the paths recorded, and taken only where their
//! build id is the recorded one; else perf's build-id cache (`~/.debug`)
//! is looked in, as perf report does. A process is its pid and its start
//! (its `fork` record), so the perf map of a later process of the same
//! pid never names an earlier one's frames.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
};

use linux_perf_data::{
    DsoKey, PerfFileReader, PerfFileRecord,
    linux_perf_event_reader::{CpuMode, EventRecord, RawData, SamplingPolicy},
};

use crate::{
    kernel::procmaps::Proc,
    stacks::{
        sample::{Sample, Timed},
        symbolize::{Frame, Kind, Symbolizer, build_id_of},
        unwind::{Region, Regs, Tables, walk},
    },
};

/// What cannot be read of a recording, in one line.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Not perf's format at all.
    #[error("not a perf.data file (its first bytes are not PERFILE2)")]
    NotPerfData,
    /// A recording of another machine's instructions.
    #[error(
        "recorded on {0}: rtrace reads x86_64 recordings (their stacks are unwound and named for x86_64)"
    )]
    Architecture(String),
    /// `perf record -z`.
    #[error(
        "its records are compressed (perf record -z); `perf inject -i FILE -o PLAIN` writes them plain"
    )]
    Compressed,
    /// A file whose records end before the header says.
    #[error("cut short: {0}")]
    Truncated(String),
    /// Records that do not parse: overwritten, or cut short mid-record.
    #[error("its records are damaged or cut short after the first {records}: {why}")]
    Damaged {
        /// Records read in time order before the damage.
        records: u64,
        /// What the parser said.
        why: String,
    },
    /// Anything else the parser refused.
    #[error("{0}")]
    Parse(String),
}

/// A recording read: one event's samples, and what the file says of its
/// run.
pub struct Recording {
    /// The samples of the event reported, in time order; each weighs its
    /// period (the events it stands for), as perf report weighs it, or 1
    /// where the file keeps no periods.
    pub samples: Vec<Timed>,
    /// What the samples' weights count: `events` (periods) or `samples`.
    pub unit: String,
    /// The event reported.
    pub event: String,
    /// Every event in the file, with its samples.
    pub events: Vec<(String, u64)>,
    /// When the first sample was taken, in nanoseconds since the epoch
    /// (0: unknown), and how long from it to the last.
    pub start: u64,
    /// See [`Recording::start`].
    pub duration_ns: u64,
    /// The time between two samples of a thread the event was set to
    /// (`-F`), in nanoseconds; 0 where it counts events (`-c`).
    pub interval_ns: u64,
    /// The host, kernel, command line and perf version the file keeps.
    pub facts: Vec<(String, String)>,
    /// What the user must know of how its frames were named: one line
    /// each.
    pub warnings: Vec<String>,
}

/// perf's markers in a call chain: the frames after one are of that
/// context.
const CONTEXT_KERNEL: u64 = (-128i64) as u64;
const CONTEXT_USER: u64 = (-512i64) as u64;
/// Any value from here up is a context marker.
const CONTEXT_MAX: u64 = (-4095i64) as u64;

/// perf's x86_64 user register numbers (`perf_regs.h`).
const REG_BX: u64 = 1;
const REG_BP: u64 = 6;
const REG_SP: u64 = 7;
const REG_IP: u64 = 8;

/// Most frames a DWARF-mode stack is unwound to; perf's copy of the stack
/// (8 KiB by default) rarely holds more.
const MAX_FRAMES: usize = 256;

/// A process as the recording follows it.
struct Process {
    /// Which process it is.
    proc: Proc,
    /// Its command (the main thread's).
    comm: String,
    /// Its executable regions with their CFI tables, for DWARF-mode
    /// samples.
    regions: Vec<Region>,
}

/// One sample before it is named: the stack's index among the distinct
/// stacks.
struct Raw {
    time: u64,
    cpu: u32,
    pid: u32,
    tid: u32,
    /// Index into the processes seen.
    process: usize,
    /// Indexes into the distinct kernel and user stacks.
    kernel: usize,
    user: usize,
    /// The sample's period, where the file keeps it.
    period: Option<u64>,
    /// Its event's index.
    event: usize,
}

/// How perf's clock maps onto the wall clock.
#[derive(Clone, Copy)]
struct Clock {
    /// Wall nanoseconds at perf's time 0.
    offset: i128,
}

impl Clock {
    fn wall(self, t: u64) -> u64 {
        (i128::from(t) + self.offset).max(0) as u64
    }
}

/// Whether `bytes` start as a perf.data file does (`PERFILE2`, in either
/// byte order).
pub fn is_perf_data(bytes: &[u8]) -> bool {
    bytes.starts_with(b"PERFILE2") || bytes.starts_with(b"2ELIFREP")
}

/// Reads the recording in `bytes`, reporting event `event` (by name; the
/// first event with samples if `None`), naming its frames with
/// `symbolizer`.
pub fn read(
    bytes: &[u8],
    event: Option<&str>,
    symbolizer: &mut Symbolizer,
) -> Result<Recording, Error> {
    if !is_perf_data(bytes) {
        return Err(Error::NotPerfData);
    }
    check_sections(bytes)?;
    let parsed = PerfFileReader::parse_file(std::io::Cursor::new(bytes)).map_err(|e| match e {
        linux_perf_data::Error::IoError(io) if io.kind() == std::io::ErrorKind::UnexpectedEof => {
            Error::Truncated(format!(
                "the file ends at byte {}, before the sections its header names",
                bytes.len()
            ))
        }
        e => Error::Parse(e.to_string()),
    })?;
    let PerfFileReader {
        mut perf_file,
        mut record_iter,
    } = parsed;
    let arch = perf_file.arch().ok().flatten().map(str::to_owned);
    if let Some(a) = &arch
        && a != "x86_64"
    {
        return Err(Error::Architecture(a.clone()));
    }
    if perf_file.compression_info().ok().flatten().is_some() {
        return Err(Error::Compressed);
    }
    let names: Vec<String> = perf_file
        .event_attributes()
        .iter()
        .enumerate()
        .map(|(i, a)| a.name().map_or_else(|| format!("event{i}"), str::to_owned))
        .collect();
    let mut facts = Vec::new();
    let mut fact = |k: &str, v: Option<String>| {
        if let Some(v) = v {
            facts.push((k.to_owned(), v));
        }
    };
    let host = perf_file.hostname().ok().flatten().map(str::to_owned);
    let release = perf_file.os_release().ok().flatten().map(str::to_owned);
    fact("Host", host.clone());
    fact("Kernel", release.clone());
    fact("Architecture", arch);
    fact(
        "Command",
        perf_file.cmdline().ok().flatten().map(|c| c.join(" ")),
    );
    fact(
        "perf",
        perf_file.perf_version().ok().flatten().map(str::to_owned),
    );
    let build_ids: HashMap<Vec<u8>, String> = perf_file
        .build_ids()
        .unwrap_or_default()
        .into_iter()
        .filter_map(|(key, info)| match key {
            DsoKey::User { full_path, .. } => {
                Some((full_path, crate::stacks::symbolize::hex(&info.build_id)))
            }
            _ => None,
        })
        .collect();
    let clock_data = perf_file
        .clock_data()
        .ok()
        .flatten()
        .map(|d| (d.wall_clock_ns, d.clockid_time_ns));
    let same_boot = same_host(host.as_deref(), release.as_deref());

    let mut warnings = Vec::new();
    let mut tables = Tables::default();
    let mut files = Files::new(build_ids);
    // pid → index into `procs` of the process that has it now.
    let mut by_pid: HashMap<u32, usize> = HashMap::new();
    let mut procs: Vec<Process> = Vec::new();
    let mut thread_comm: HashMap<u32, String> = HashMap::new();
    let mut kernel_stacks: HashMap<Vec<u64>, usize> = HashMap::new();
    let mut user_stacks: HashMap<(usize, Vec<u64>), usize> = HashMap::new();
    let mut raws: Vec<Raw> = Vec::new();
    let mut counts = vec![0u64; names.len()];
    let wanted = match event {
        Some(e) => Some(
            names
                .iter()
                .position(|n| n == e || n.split(':').next() == Some(e))
                .ok_or_else(|| {
                    Error::Parse(format!(
                        "no event {e} in the recording; it holds {}",
                        names.join(", ")
                    ))
                })?,
        ),
        None => None,
    };
    let mut first_time = None;
    let mut records = 0u64;
    let mut unwound = (0u64, 0u64);
    let mut lost = 0u64;
    let mut kernel_text = None;
    loop {
        let record = match record_iter.next_record(&mut perf_file) {
            Ok(Some(r)) => r,
            Ok(None) => break,
            Err(e) => {
                return Err(Error::Damaged {
                    records,
                    why: e.to_string(),
                });
            }
        };
        records += 1;
        let PerfFileRecord::EventRecord { attr_index, record } = record else {
            continue;
        };
        let Ok(parsed) = record.parse() else {
            continue;
        };
        match parsed {
            EventRecord::Comm(c) => {
                let (pid, tid) = (c.pid as u32, c.tid as u32);
                let name = String::from_utf8_lossy(&c.name.as_slice()).into_owned();
                let i = process_of(same_boot, pid, &mut procs, &mut by_pid, None);
                if c.is_execve {
                    symbolizer.recorded_exec(procs[i].proc);
                    procs[i].regions.clear();
                }
                if pid == tid {
                    procs[i].comm.clone_from(&name);
                }
                thread_comm.insert(tid, name);
            }
            EventRecord::Fork(f) if f.pid == f.tid => {
                let (pid, ppid) = (f.pid as u32, f.ppid as u32);
                let parent = process_of(same_boot, ppid, &mut procs, &mut by_pid, None);
                let child = process_of(same_boot, pid, &mut procs, &mut by_pid, Some(f.timestamp));
                let (pproc, pcomm, pregions) = {
                    let p = &procs[parent];
                    (p.proc, p.comm.clone(), p.regions.clone())
                };
                symbolizer.recorded_fork(procs[child].proc, pproc);
                procs[child].comm = pcomm.clone();
                procs[child].regions = pregions;
                thread_comm.insert(pid, pcomm);
            }
            EventRecord::Fork(f) => {
                // A new thread: named as its process until it names itself.
                if let Some(c) = thread_comm.get(&(f.ptid as u32)).cloned() {
                    thread_comm.insert(f.tid as u32, c);
                }
            }
            EventRecord::Mmap(_) | EventRecord::Mmap2(_) => {
                // perf writes the kernel's own image as an mmap of pid -1,
                // at `_text`: where this kernel must be for its names.
                if let EventRecord::Mmap(m) = &parsed
                    && m.pid == -1
                    && m.path.as_slice().starts_with(b"[kernel.kallsyms]")
                {
                    kernel_text = Some(m.page_offset);
                }
                let Some((pid, range, path)) = exec_mapping(&parsed) else {
                    continue;
                };
                let i = process_of(same_boot, pid, &mut procs, &mut by_pid, None);
                map(
                    &mut procs[i],
                    range,
                    &path,
                    &mut files,
                    &mut tables,
                    symbolizer,
                );
            }
            EventRecord::Lost(l) => lost += l.count,
            EventRecord::Sample(s) => {
                counts[attr_index] += 1;
                let (Some(pid), Some(tid)) = (s.pid, s.tid) else {
                    continue;
                };
                let (pid, tid) = (pid as u32, tid as u32);
                let time = s.timestamp.unwrap_or(0);
                first_time.get_or_insert(time);
                let i = process_of(same_boot, pid, &mut procs, &mut by_pid, None);
                let (mut kernel, mut user) = (Vec::new(), Vec::new());
                match &s.callchain {
                    Some(chain) => {
                        let mut into_user = false;
                        for n in 0..chain.len() {
                            let ip = chain.get(n).unwrap_or(0);
                            match ip {
                                CONTEXT_KERNEL => into_user = false,
                                CONTEXT_USER => into_user = true,
                                ip if ip >= CONTEXT_MAX => {}
                                ip if into_user => user.push(ip),
                                ip => kernel.push(ip),
                            }
                        }
                    }
                    None => match (s.cpu_mode, s.ip) {
                        (CpuMode::Kernel, Some(ip)) => kernel.push(ip),
                        (_, Some(ip)) => user.push(ip),
                        _ => {}
                    },
                }
                // DWARF mode: the user chain is walked from the registers
                // over the copy of the stack.
                if let (Some(regs), Some((stack, _))) = (&s.user_regs, &s.user_stack) {
                    let (Some(ip), Some(sp)) = (regs.get(REG_IP), regs.get(REG_SP)) else {
                        continue;
                    };
                    let start = Regs {
                        pc: ip,
                        sp,
                        bp: regs.get(REG_BP).unwrap_or(0),
                        bx: regs.get(REG_BX).unwrap_or(0),
                    };
                    let walked = walk(
                        &procs[i].regions,
                        start,
                        |a| read_word(stack, sp, a),
                        MAX_FRAMES,
                    );
                    unwound.0 += 1;
                    unwound.1 += u64::from(walked.pcs.len() > 1);
                    user = walked.pcs;
                }
                let k = next_index(&mut kernel_stacks, kernel);
                let u = next_index(&mut user_stacks, (i, user));
                raws.push(Raw {
                    time,
                    cpu: s.cpu.unwrap_or(0),
                    pid,
                    tid,
                    process: i,
                    kernel: k,
                    user: u,
                    period: s.period,
                    event: attr_index,
                });
            }
            _ => {}
        }
    }

    // The event asked for, else the first (in the file's order) with
    // samples, as perf report prints them in that order.
    let chosen = wanted
        .or_else(|| counts.iter().position(|&n| n > 0))
        .unwrap_or(0);
    raws.retain(|r| r.event == chosen);
    let event_name = names.get(chosen).cloned().unwrap_or_default();
    let interval_ns = match perf_file
        .event_attributes()
        .get(chosen)
        .map(|a| a.attributes().sampling_policy)
    {
        Some(SamplingPolicy::Frequency(hz)) if hz > 0 => 1_000_000_000 / hz,
        _ => 0,
    };
    // Perf maps under the owner rule: a pid's later process's map is not
    // an earlier one's.
    let mut successor: HashMap<usize, u64> = HashMap::new();
    {
        let mut last: HashMap<u32, usize> = HashMap::new();
        for (i, p) in procs.iter().enumerate() {
            if let Some(prev) = last.insert(p.proc.pid, i) {
                successor.insert(prev, p.proc.born_wall_ns());
            }
        }
    }
    for (i, p) in procs.iter().enumerate() {
        symbolizer.recorded_perf_map(p.proc, successor.get(&i).copied());
    }
    warnings.extend(files.warnings());
    if lost > 0 {
        warnings.push(format!(
            "perf lost {lost} events while recording (its LOST records)"
        ));
    }
    if unwound.0 > 0 && unwound.1 * 2 < unwound.0 {
        warnings.push(format!(
            "only {} of {} DWARF-mode samples could be unwound past their first frame",
            unwound.1, unwound.0
        ));
    }
    let kernel_named = same_boot && kernel_image_matches(kernel_text);
    if !kernel_named && !kernel_stacks.keys().all(Vec::is_empty) {
        warnings.push(
            "recorded under another kernel or boot: kernel frames are not named \
             (this kernel's symbols would name them wrongly)"
                .to_owned(),
        );
    }

    // Name every distinct stack once.
    let mut kernel_list: Vec<(Vec<u64>, usize)> = kernel_stacks.into_iter().collect();
    kernel_list.sort_by_key(|(_, i)| *i);
    let mut user_list: Vec<((usize, Vec<u64>), usize)> = user_stacks.into_iter().collect();
    user_list.sort_by_key(|(_, i)| *i);
    let kernel_frames: Vec<Arc<[Frame]>> = if kernel_named {
        let stacks: Vec<(Option<Proc>, &[u64])> =
            kernel_list.iter().map(|(s, _)| (None, &s[..])).collect();
        symbolizer
            .symbolize(&stacks)
            .into_iter()
            .map(Arc::from)
            .collect()
    } else {
        kernel_list
            .iter()
            .map(|(s, _)| {
                s.iter()
                    .map(|_| Frame::new("[unknown]", Kind::Kernel, Some("[kernel]")))
                    .collect::<Vec<_>>()
                    .into()
            })
            .collect()
    };
    let stacks: Vec<(Option<Proc>, &[u64])> = user_list
        .iter()
        .map(|((p, s), _)| (Some(procs[*p].proc), &s[..]))
        .collect();
    let user_frames: Vec<Arc<[Frame]>> = symbolizer
        .symbolize(&stacks)
        .into_iter()
        .map(Arc::from)
        .collect();

    let clock = clock_of(clock_data, same_boot, raws.last().map(|r| r.time));
    // perf report's overhead is each sample's period: with `-F` the kernel
    // varies the period to keep the rate, most of all for hardware events.
    let weighted = !raws.is_empty() && raws.iter().all(|r| r.period.is_some());
    let samples: Vec<Timed> = raws
        .iter()
        .map(|r| {
            let p = &procs[r.process];
            let comm = thread_comm
                .get(&r.tid)
                .cloned()
                .unwrap_or_else(|| p.comm.clone());
            Timed {
                time: clock.wall(r.time),
                cpu: r.cpu,
                sample: Sample {
                    comm: if comm.is_empty() {
                        format!(":{}", r.pid)
                    } else {
                        comm
                    },
                    pid: r.pid,
                    started: p.proc.born_wall_ns(),
                    tid: r.tid,
                    user: user_frames[r.user].clone(),
                    kernel: kernel_frames[r.kernel].clone(),
                    count: if weighted { r.period.unwrap_or(0) } else { 1 },
                    waker: None,
                    off_cpu: false,
                    slot: 0,
                    cut_short: false,
                },
            }
        })
        .collect();
    let first = first_time.unwrap_or(0);
    let last = raws.last().map_or(first, |r| r.time);
    Ok(Recording {
        start: if samples.is_empty() {
            0
        } else {
            clock.wall(first)
        },
        duration_ns: last.saturating_sub(first),
        samples,
        event: event_name,
        events: names.into_iter().zip(counts).collect(),
        interval_ns,
        unit: if weighted { "events" } else { "samples" }.to_owned(),
        facts,
        warnings,
    })
}

/// Checks that every section perf's header names (the attributes, the
/// records, and the feature sections listed after the records) lies
/// inside the file: the parser trusts their sizes, and a file cut short
/// or overwritten would have it allocate what a size says.
fn check_sections(bytes: &[u8]) -> Result<(), Error> {
    let word = |at: usize| -> Option<u64> {
        let b = bytes.get(at..at + 8)?;
        Some(if bytes.starts_with(b"PERFILE2") {
            u64::from_le_bytes(b.try_into().ok()?)
        } else {
            u64::from_be_bytes(b.try_into().ok()?)
        })
    };
    let len = bytes.len() as u64;
    let cut =
        |what: &str| Error::Truncated(format!("the file ends at byte {len}, before its {what}"));
    let inside = |off: u64, size: u64| off.checked_add(size).is_some_and(|end| end <= len);
    // magic, header size, attr size, then (offset, size) of the attributes,
    // the records and the event types, then the feature bits.
    let (Some(attrs), Some(attrs_size), Some(data), Some(data_size)) =
        (word(24), word(32), word(40), word(48))
    else {
        return Err(cut("header"));
    };
    if !inside(attrs, attrs_size) {
        return Err(cut("event attributes"));
    }
    if !inside(data, data_size) {
        return Err(cut("records"));
    }
    let features: u32 = (0..4)
        .map(|i| word(72 + 8 * i).map_or(0, u64::count_ones))
        .sum();
    let table = data + data_size;
    for i in 0..u64::from(features) {
        let at = (table + 16 * i) as usize;
        let (Some(off), Some(size)) = (word(at), word(at + 8)) else {
            return Err(cut("feature sections"));
        };
        if !inside(off, size) {
            return Err(cut("feature sections"));
        }
    }
    Ok(())
}

/// The index in `procs` of the process that has `pid` now; a new one if
/// it was just forked (`born`: its fork record's time). A process seen
/// first in a sample or an mmap record ran before the recording began:
/// its start is read from `/proc` if it still runs and the file is of this
/// boot.
fn process_of(
    same_boot: bool,
    pid: u32,
    procs: &mut Vec<Process>,
    by_pid: &mut HashMap<u32, usize>,
    born: Option<u64>,
) -> usize {
    if let Some(&i) = by_pid.get(&pid)
        && born.is_none()
    {
        return i;
    }
    let proc = match born {
        Some(b) => {
            let now = Proc::now(pid);
            // perf's clock and /proc's ticks differ by a tick or two.
            if same_boot && now.born.abs_diff(b) < 20_000_000 {
                now
            } else {
                Proc::new(pid, b)
            }
        }
        None if same_boot => Proc::now(pid),
        None => Proc::new(pid, 0),
    };
    procs.push(Process {
        proc,
        comm: String::new(),
        regions: Vec::new(),
    });
    by_pid.insert(pid, procs.len() - 1);
    procs.len() - 1
}

/// An executable user mapping of an `mmap` or `mmap2` record: its pid,
/// (start, end, file offset) and path; `None` for data, and for the
/// kernel's own (pid -1).
fn exec_mapping(record: &EventRecord<'_>) -> Option<(u32, (u64, u64, u64), String)> {
    const PROT_EXEC: u32 = 4;
    let (pid, mode, exec, start, len, offset, path) = match record {
        EventRecord::Mmap(m) => (
            m.pid,
            m.cpu_mode,
            m.is_executable,
            m.address,
            m.length,
            m.page_offset,
            &m.path,
        ),
        EventRecord::Mmap2(m) => (
            m.pid,
            m.cpu_mode,
            m.protection & PROT_EXEC != 0,
            m.address,
            m.length,
            m.page_offset,
            &m.path,
        ),
        _ => return None,
    };
    if pid < 0 || mode == CpuMode::Kernel || !exec {
        return None;
    }
    let path = String::from_utf8_lossy(&path.as_slice()).into_owned();
    Some((pid as u32, (start, start + len, offset), path))
}

/// The index of `key` among the keys seen, a new one if it is new.
fn next_index<K: std::hash::Hash + Eq>(seen: &mut HashMap<K, usize>, key: K) -> usize {
    let n = seen.len();
    *seen.entry(key).or_insert(n)
}

/// The stack word at `addr` of a stack copied from `sp`.
fn read_word(stack: &RawData<'_>, sp: u64, addr: u64) -> Option<u64> {
    let off = usize::try_from(addr.checked_sub(sp)?).ok()?;
    let bytes = stack.get(off..off + 8)?.as_slice();
    Some(u64::from_le_bytes(bytes[..8].try_into().ok()?))
}

/// Notes an executable mapping of `process`: for its names, and for the
/// unwinding of its DWARF-mode samples.
fn map(
    process: &mut Process,
    range: (u64, u64, u64),
    path: &str,
    files: &mut Files,
    tables: &mut Tables,
    symbolizer: &mut Symbolizer,
) {
    let file = files.open(path);
    let region = tables.recorded(range, path, file.as_ref().ok());
    process
        .regions
        .retain(|r| r.end <= range.0 || r.start >= range.1);
    process.regions.push(region);
    symbolizer.recorded_map(process.proc, range, path, file);
}

/// The files a recording names, found and checked once each.
struct Files {
    /// The build id perf recorded of each file, by path.
    build_ids: HashMap<Vec<u8>, String>,
    /// Each path's file, or why it is not used.
    found: HashMap<String, Result<std::fs::File, String>>,
    /// Files taken from perf's build-id cache, and files left unnamed.
    from_cache: u64,
    mismatched: BTreeMap<String, String>,
}

impl Files {
    fn new(build_ids: HashMap<Vec<u8>, String>) -> Self {
        Self {
            build_ids,
            found: HashMap::new(),
            from_cache: 0,
            mismatched: BTreeMap::new(),
        }
    }

    /// The file recorded at `path`: the one there if its build id is the
    /// recorded one (or none was recorded), else perf's cached copy.
    fn open(&mut self, path: &str) -> Result<std::fs::File, String> {
        if path.starts_with('[') || path.is_empty() || path.starts_with("//anon") {
            return Err(String::new());
        }
        if let Some(f) = self.found.get(path) {
            return match f {
                Ok(f) => f.try_clone().map_err(|e| e.to_string()),
                Err(e) => Err(e.clone()),
            };
        }
        let want = self.build_ids.get(path.as_bytes()).cloned();
        let here = std::fs::File::open(path);
        let made = match (here, want) {
            (Ok(f), None) => Ok(f),
            (Ok(f), Some(want)) if build_id_of(&f).is_none_or(|id| id == want) => Ok(f),
            (here, Some(want)) => match cached(path, &want) {
                Some(f) => {
                    self.from_cache += 1;
                    Ok(f)
                }
                None => {
                    let why = match here {
                        Ok(_) => format!(
                            "the file at its path is another build (the recording's is {want}), \
                             and perf's build-id cache has none"
                        ),
                        Err(e) => {
                            format!("cannot open it: {e}, and perf's build-id cache has none")
                        }
                    };
                    self.mismatched.insert(path.to_owned(), why.clone());
                    Err(why)
                }
            },
            (Err(e), None) => Err(format!("cannot open it: {e}")),
        };
        let kept = match &made {
            Ok(f) => f.try_clone().map_err(|e| e.to_string()),
            Err(e) => Err(e.clone()),
        };
        self.found.insert(path.to_owned(), kept);
        made
    }

    fn warnings(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .mismatched
            .iter()
            .take(5)
            .map(|(path, why)| format!("{path}: {why}; its frames are [unknown]"))
            .collect();
        if self.mismatched.len() > 5 {
            out.push(format!(
                "{} more files were not found as recorded",
                self.mismatched.len() - 5
            ));
        }
        out
    }
}

/// A file's copy in perf's build-id cache: `~/.debug/.build-id/ab/cdef…`
/// (a link to the copy kept under its path), or the copy itself under
/// `~/.debug/PATH/BUILDID/elf`.
fn cached(path: &str, build_id: &str) -> Option<std::fs::File> {
    let home = std::env::var_os("PERF_BUILDID_DIR")
        .map(std::path::PathBuf::from)
        .or_else(|| Some(std::path::PathBuf::from(std::env::var_os("HOME")?).join(".debug")))?;
    let (head, tail) = build_id.split_at(2.min(build_id.len()));
    let candidates = [
        home.join(".build-id").join(head).join(tail).join("elf"),
        home.join(".build-id").join(head).join(tail),
        home.join(path.trim_start_matches('/'))
            .join(build_id)
            .join("elf"),
    ];
    candidates.iter().find_map(|c| {
        let f = std::fs::File::open(c).ok()?;
        (f.metadata().ok()?.is_file() && build_id_of(&f).as_deref() == Some(build_id)).then_some(f)
    })
}

/// Whether the recording was made on this host under this kernel, this
/// boot for all that can be told: its pids, perf maps and kernel
/// addresses are then this machine's.
fn same_host(host: Option<&str>, release: Option<&str>) -> bool {
    let here = crate::kernel::host_name().unwrap_or_default();
    host.is_none_or(|h| h == here)
        && release.is_some_and(|r| r == crate::kernel::features::kernel_release())
}

/// Whether the kernel image the recording mapped at `recorded` (perf's
/// synthetic mmap of `[kernel.kallsyms]_text`) is at this kernel's
/// `_text`: the same kernel at the same KASLR offset.
fn kernel_image_matches(recorded: Option<u64>) -> bool {
    let Some(recorded) = recorded else {
        return true;
    };
    let Ok(text) = std::fs::read_to_string("/proc/kallsyms") else {
        return true;
    };
    text.lines()
        .find_map(|l| {
            let mut it = l.split_whitespace();
            let addr = it.next()?;
            let _ = it.next()?;
            (it.next()? == "_text").then(|| u64::from_str_radix(addr, 16).ok())?
        })
        // Without the rights to see addresses, kallsyms shows zeros.
        .is_none_or(|here| here == 0 || here == recorded)
}

/// How the recording's times become wall-clock times: by its clock data
/// (`perf record -k CLOCK`: `(wall, clock)` at one instant), else,
/// recorded this boot, by this machine's boot time (perf's clock counts
/// from boot), else with its last sample now.
fn clock_of(data: Option<(u64, u64)>, same_boot: bool, last: Option<u64>) -> Clock {
    if let Some((wall, at)) = data {
        return Clock {
            offset: i128::from(wall) - i128::from(at),
        };
    }
    if same_boot {
        return Clock {
            offset: i128::from(crate::kernel::procmaps::boot_wall_ns()),
        };
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128);
    Clock {
        offset: now - i128::from(last.unwrap_or(0)),
    }
}

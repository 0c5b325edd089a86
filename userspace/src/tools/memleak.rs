//! `rtrace memleak`: bcc's memleak. Allocations still held, by the stack
//! that made them, every interval; with a process or a command, through
//! uprobes on its allocator (libc's, or another's with `-O`); without,
//! the kernel's own, through the kmem tracepoints. Stacks come from the
//! shared walk (CFI, Python frames), and the totals make allocation
//! profiles: folded stacks, a flame graph of bytes held, and pprof's
//! heap profile with Go's four sample types.

use crate::tracer::{Outcome, Plan, Spec};
use std::{
    collections::HashMap,
    ffi::OsString,
    fmt::Write as _,
    path::{Path, PathBuf},
    sync::Arc,
};

use anyhow::Context as _;
use aya::{
    Ebpf,
    maps::{Array, HashMap as BpfHashMap, MapData},
};
use rtrace_common::memleak::{
    Alloc, AllocKey, Call, Config, DIRECT_SIZES, ERR_FREE_UNSEEN, ERR_NAMES, GAPS, KmemOffsets,
    ONE, SAMPLE_ALL, SAMPLE_BYTES, SAMPLE_EVERY, TotalKey, Totals, WEIGHT_SLOTS, slot_sizes,
};
use rtrace_common::profile::HEAT_SLOT_NS;
use serde::Serialize;

use crate::engine::stacktool::{StackArgs, StackTool, Unwind};
use crate::kernel::warning::Warning;
use crate::{
    kernel::{
        features::Mechanism,
        load::{Hooks, Kernel, Load, TASK_STORAGE, in_flight},
        tracefs::Format,
        transport::BufferArgs,
    },
    output::{
        Record, Schedule, Sink, events,
        files::{PerSampleOutputs, StackReports, held, thousands},
        stacks::{self, FlameOptions, TextOptions},
    },
    probes::uprobes,
    stacks::{
        sample::{MISSED_KERNEL, MISSED_USER, Sample, Timed},
        stackstore::read_all,
        symbolize::{Frame, Kind},
    },
    tracer::{self, Scope, ScopeArgs, Tool, own},
};

/// Which allocations to show first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SortKey {
    /// Bytes held.
    Size,
    /// Allocations held.
    Count,
}

/// Find memory allocated and not freed, by stack (bcc's memleak): a
/// process's or a command's through its allocator, else the kernel's.
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:
  rtrace memleak -p 185                 # PID 185's allocations held, every 5 seconds
  rtrace memleak -p 185 -a 10           # list each allocation too, every 10 seconds
  rtrace memleak -- ./server            # a command's, reported again after it exits
  rtrace memleak -c './server --port 80' # the same, spelled as bcc's
  rtrace memleak -p 185 --sample-bytes 65536 --pprof heap.pb.gz   # cheap, for a live service
  rtrace memleak -p 185 -O /usr/lib/x86_64-linux-gnu/libjemalloc.so.2   # another allocator
  rtrace memleak -p 185 -O /usr/bin/python3.11 # CPython's object allocator
  rtrace memleak                        # the kernel's allocations (kmalloc, caches, pages)
  rtrace memleak --percpu               # and its per-CPU ones")]
pub struct Args {
    /// Seconds between reports.
    #[arg(default_value_t = 5, value_parser = crate::output::at_least_one::<u64>)]
    interval: u64,
    /// Reports before exiting; without it, run until interrupted.
    #[arg(value_parser = crate::output::at_least_one::<u64>)]
    count: Option<u64>,
    /// Print every allocation and free as it happens.
    #[arg(short = 't', long)]
    trace: bool,
    /// Show each allocation held, address and size, besides the stacks.
    #[arg(short = 'a', long = "show-allocs")]
    show_allocs: bool,
    /// Leave out allocations younger than MS milliseconds (bcc's default,
    /// 500: what is freed soon is no leak).
    #[arg(short = 'o', long = "older", value_name = "MS", default_value_t = 500)]
    older: u64,
    /// Run COMMAND (split at spaces, as bcc does) and trace it: the same
    /// as `-- COMMAND`.
    #[arg(
        short = 'c',
        long = "command",
        id = "bcc_command",
        value_name = "COMMAND"
    )]
    command: Option<String>,
    /// Trace every N-th allocation on each CPU; sizes and counts shown are
    /// estimates (N times what was sampled).
    #[arg(short = 's', long = "sample-rate", value_name = "N", default_value_t = 1,
          value_parser = crate::output::at_least_one::<u64>)]
    sample_rate: u64,
    /// Trace allocations at random with a chance that grows with their
    /// size: one sampled byte in BYTES on average, as Go's MemProfileRate
    /// and OCaml's Memprof do. Large allocations are never missed, and
    /// sizes and counts shown are unbiased estimates.
    #[arg(long, value_name = "BYTES", conflicts_with = "sample_rate",
          value_parser = crate::output::at_least_one::<u64>)]
    sample_bytes: Option<u64>,
    /// Show at most this many stacks, the largest.
    #[arg(short = 'T', long = "top", value_name = "N", default_value_t = 10)]
    top: usize,
    /// Trace only allocations of at least this many bytes.
    #[arg(short = 'z', long = "min-size", value_name = "BYTES")]
    min_size: Option<u64>,
    /// Trace only allocations of at most this many bytes.
    #[arg(short = 'Z', long = "max-size", value_name = "BYTES")]
    max_size: Option<u64>,
    /// The allocator's object, instead of libc: its malloc, free and
    /// the rest by their usual names, or jemalloc's (je_), tcmalloc's
    /// (tc_), mimalloc's (mi_) and CPython's (PyObject_, PyMem_).
    #[arg(short = 'O', long = "obj", value_name = "OBJ")]
    obj: Option<String>,
    /// Show the totals kept by stack in the kernel instead of reading each
    /// allocation held: cheaper with many, but without `-o` and `-a`.
    #[arg(long)]
    combined_only: bool,
    /// An allocation at an address still held frees the old one in the
    /// totals by stack (its free was missed).
    #[arg(long)]
    wa_missing_free: bool,
    /// Order stacks by bytes (size) or allocations (count).
    #[arg(long, value_enum, default_value_t = SortKey::Size)]
    sort: SortKey,
    /// Kernel mode: trace per-CPU allocations too.
    #[arg(long)]
    percpu: bool,
    /// Allocations the kernel can hold at once; beyond it they are
    /// counted as not recorded.
    #[arg(long, value_name = "N", default_value_t = 1 << 20,
          value_parser = crate::output::at_least_one::<u32>)]
    max_allocs: u32,
    /// Print folded stacks (`comm;frames.. bytes`) of the bytes held, for
    /// flame graphs, instead of bcc's report.
    #[arg(long)]
    folded: bool,
    /// Write a flame graph of the bytes held at the end to FILE (SVG).
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
    /// Write a gzipped pprof heap profile to FILE at the end:
    /// alloc_objects, alloc_space, inuse_objects and inuse_space, as Go
    /// writes them.
    #[arg(long, value_name = "FILE")]
    pprof: Option<PathBuf>,
    /// Write one self-contained page (HTML) of the bytes held at the end
    /// to FILE: its heat map counts them by when they were allocated
    /// (drag over cells for the stacks of what a burst allocated and
    /// never freed), its flame graph and table by the stack that
    /// allocated them.
    #[arg(long, value_name = "FILE")]
    html: Option<PathBuf>,
    /// --firefox and --samples: each allocation held at the end, at the
    /// time it was made, in its thread, weighing its bytes.
    #[command(flatten)]
    each: PerSampleOutputs,
    #[command(flatten)]
    stacks: StackArgs,
    #[command(flatten)]
    buffer: BufferArgs,
    // The scope's `-- CMD` takes the last place among the positionals.
    #[command(flatten)]
    scope: ScopeArgs<{ own::T | own::A | own::C | own::O }>,
}

/// How an allocator entry point is traced: its uprobe program, and
/// whether its return is (an allocation's address).
#[derive(Debug, Clone, Copy)]
struct Role {
    prog: &'static str,
    returns: bool,
}

const MALLOC: Role = Role {
    prog: rtrace_common::memleak::PROG_MALLOC,
    returns: true,
};
const CALLOC: Role = Role {
    prog: rtrace_common::memleak::PROG_CALLOC,
    returns: true,
};
const REALLOC: Role = Role {
    prog: rtrace_common::memleak::PROG_REALLOC,
    returns: true,
};
const REALLOCARRAY: Role = Role {
    prog: rtrace_common::memleak::PROG_REALLOCARRAY,
    returns: true,
};
const MEMALIGN: Role = Role {
    prog: rtrace_common::memleak::PROG_MEMALIGN,
    returns: true,
};
const POSIX_MEMALIGN: Role = Role {
    prog: rtrace_common::memleak::PROG_POSIX_MEMALIGN,
    returns: true,
};
const MMAP: Role = Role {
    prog: rtrace_common::memleak::PROG_MMAP,
    returns: true,
};
const FREE: Role = Role {
    prog: rtrace_common::memleak::PROG_FREE,
    returns: false,
};
const MUNMAP: Role = Role {
    prog: rtrace_common::memleak::PROG_MUNMAP,
    returns: false,
};

/// The entry points of the C allocator, by the names every malloc
/// exports.
const STANDARD: &[(&str, Role)] = &[
    ("malloc", MALLOC),
    ("calloc", CALLOC),
    ("realloc", REALLOC),
    ("reallocarray", REALLOCARRAY),
    ("posix_memalign", POSIX_MEMALIGN),
    ("aligned_alloc", MEMALIGN),
    ("memalign", MEMALIGN),
    ("valloc", MALLOC),
    ("pvalloc", MALLOC),
    ("free", FREE),
    ("mmap", MMAP),
    ("munmap", MUNMAP),
];

/// Other allocators' own names, looked for in `-O`'s object.
const PREFIXED: &[(&str, Role)] = &[
    ("je_malloc", MALLOC),
    ("je_calloc", CALLOC),
    ("je_realloc", REALLOC),
    ("je_posix_memalign", POSIX_MEMALIGN),
    ("je_aligned_alloc", MEMALIGN),
    ("je_free", FREE),
    ("tc_malloc", MALLOC),
    ("tc_calloc", CALLOC),
    ("tc_realloc", REALLOC),
    ("tc_memalign", MEMALIGN),
    ("tc_posix_memalign", POSIX_MEMALIGN),
    ("tc_free", FREE),
    ("mi_malloc", MALLOC),
    ("mi_calloc", CALLOC),
    ("mi_realloc", REALLOC),
    // mi_malloc_aligned(size, alignment): the size first.
    ("mi_malloc_aligned", MALLOC),
    ("mi_posix_memalign", POSIX_MEMALIGN),
    ("mi_free", FREE),
    ("PyObject_Malloc", MALLOC),
    ("PyObject_Calloc", CALLOC),
    ("PyObject_Realloc", REALLOC),
    ("PyObject_Free", FREE),
    ("PyMem_Malloc", MALLOC),
    ("PyMem_Calloc", CALLOC),
    ("PyMem_Realloc", REALLOC),
    ("PyMem_Free", FREE),
];

/// The `ERRORS` slots that count what is expected: the walk's, and frees
/// of addresses allocated before tracing began.
const EXPECTED: [u32; rtrace_common::stacks::ERR_EXPECTED.len() + 1] = {
    let walk = rtrace_common::stacks::ERR_EXPECTED;
    let mut out = [ERR_FREE_UNSEEN; rtrace_common::stacks::ERR_EXPECTED.len() + 1];
    let mut i = 0;
    while i < walk.len() {
        out[i] = walk[i];
        i += 1;
    }
    out
};

/// Functions of the kernel's BPF allocator (`kernel/bpf/memalloc.c`,
/// 6.1+): the text from the first to the end of the last holds the code
/// whose allocations refill BPF maps' element caches, left out in kernel
/// mode (see `Config::bpf_alloc`).
const BPF_ALLOCATOR: &[&str] = &[
    "__alloc",
    "alloc_bulk",
    "unit_alloc",
    "bpf_mem_refill",
    "bpf_mem_alloc_init",
    "bpf_mem_alloc",
    "bpf_mem_cache_alloc",
];

/// The kmem tracepoints of kernel mode: the program (named as its
/// event) and the category.
const KMEM: &[(&str, &str)] = &[
    (rtrace_common::memleak::PROG_KMALLOC, "kmem"),
    (rtrace_common::memleak::PROG_KMALLOC_NODE, "kmem"),
    (rtrace_common::memleak::PROG_KMEM_CACHE_ALLOC, "kmem"),
    (rtrace_common::memleak::PROG_KMEM_CACHE_ALLOC_NODE, "kmem"),
    (rtrace_common::memleak::PROG_KFREE, "kmem"),
    (rtrace_common::memleak::PROG_KMEM_CACHE_FREE, "kmem"),
    (rtrace_common::memleak::PROG_MM_PAGE_ALLOC, "kmem"),
    (rtrace_common::memleak::PROG_MM_PAGE_FREE, "kmem"),
];
/// With `--percpu`.
const PERCPU: &[(&str, &str)] = &[
    (rtrace_common::memleak::PROG_PERCPU_ALLOC, "percpu"),
    (rtrace_common::memleak::PROG_PERCPU_FREE, "percpu"),
];

/// Bytes and allocations held (or allocated) by one (process, stack).
#[derive(Debug, Clone, Copy, Default)]
struct Amount {
    bytes: u64,
    /// Allocations, 16.16 fixed point.
    objects: u64,
}

impl Amount {
    fn add(&mut self, size: u64, weight: u64) {
        self.bytes += weighted_bytes(size, weight);
        self.objects += weight;
    }

    fn count(&self) -> u64 {
        (self.objects + ONE / 2) / ONE
    }
}

/// The bytes an allocation of `size` stands for, its weight in 16.16.
fn weighted_bytes(size: u64, weight: u64) -> u64 {
    size.wrapping_mul(weight) >> 16
}

/// A stack's frames, leaf first, and their lines as bcc prints them.
type Named = (Arc<[Frame]>, Vec<String>);

/// What one (process, stack) holds and has allocated.
type Row = (TotalKey, Amount, Amount);

/// One stack's line of the report.
#[derive(Debug, Serialize)]
struct Held {
    pid: u32,
    comm: String,
    bytes: u64,
    allocations: u64,
    stack: Vec<String>,
}

/// One allocation held, for `-a`.
#[derive(Debug, Serialize)]
struct Listed {
    pid: u32,
    addr: String,
    size: u64,
    age_ms: u64,
}

/// One report.
#[derive(Debug, Serialize)]
struct Report {
    time: String,
    /// Bytes and allocations held in all, over every stack.
    total_bytes: u64,
    total_allocations: u64,
    stacks_held: usize,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    allocations: Vec<Listed>,
    stacks: Vec<Held>,
    #[serde(skip)]
    top: usize,
    #[serde(skip)]
    user: bool,
}

impl Record for Report {
    fn text(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "[{}] Top {} stacks with outstanding allocations:",
            self.time, self.top
        );
        for a in &self.allocations {
            let _ = writeln!(out, "\taddr = {} size = {}", a.addr, a.size);
        }
        // Largest last, as bcc prints them: nearest the prompt.
        for h in self.stacks.iter().rev() {
            let whose = if self.user {
                format!(" of {} (PID {})", h.comm, h.pid)
            } else {
                String::new()
            };
            let _ = writeln!(
                out,
                "\t{} bytes in {} allocations from stack{whose}",
                h.bytes, h.allocations
            );
            for f in &h.stack {
                let _ = writeln!(out, "\t\t{f}");
            }
        }
        let _ = writeln!(
            out,
            "\t{} bytes in {} allocations held in all, from {} stacks",
            self.total_bytes, self.total_allocations, self.stacks_held
        );
    }
}

/// One call, with `-t`.
#[derive(Debug, Serialize)]
struct Traced {
    pid: u32,
    comm: String,
    call: &'static str,
    addr: String,
    size: u64,
}

impl Record for Traced {
    fn text(&self, out: &mut String) {
        let _ = if self.call == "alloc" {
            writeln!(
                out,
                "{:<16} {:<7} alloc {} bytes at {}",
                self.comm, self.pid, self.size, self.addr
            )
        } else {
            writeln!(out, "{:<16} {:<7} free {}", self.comm, self.pid, self.addr)
        };
    }
}

/// Folded lines, with `--folded`.
#[derive(Debug, Serialize)]
struct Folded {
    lines: Vec<String>,
}

impl Record for Folded {
    fn text(&self, out: &mut String) {
        for l in &self.lines {
            out.push_str(l);
            out.push('\n');
        }
    }
}

/// The tool.
pub struct Memleak {
    args: Args,
    /// Tracing a process's allocator (else the kernel's).
    user: bool,
    /// The allocator's file, in user mode.
    object: Option<PathBuf>,
    /// The functions attached, and those missing from the object.
    attached: Vec<String>,
    /// What could not be attached, for `-v`.
    skipped: Vec<String>,
    stacks: StackTool,
    /// The kernel's `ALLOCS` and `TOTALS`, taken at attach.
    allocs: Option<BpfHashMap<MapData, AllocKey, Alloc>>,
    totals: Option<BpfHashMap<MapData, TotalKey, Totals>>,
    /// Stacks named, by (process, hash).
    named: HashMap<(u32, u64), Named>,
    /// Processes' commands, read once.
    comms: HashMap<u32, String>,
    /// The commands the kernel recorded with each process's totals, for
    /// those gone before they were read.
    recorded: HashMap<u32, [u8; 16]>,
    /// The files asked for, created before anything is attached.
    reports: StackReports,
    /// The last report's holdings, for the files at the end.
    last: Vec<Row>,
    /// The bytes held at the last report by process, stack and the heat
    /// map slot they were allocated in, for the page.
    last_timed: Vec<(u32, u64, u32, u64)>,
    /// Each allocation held at the last report, for `--firefox` and
    /// `--samples` (kept only for them).
    last_each: Vec<Each>,
    /// Frees of addresses never seen allocated, read at the end.
    unseen_frees: u64,
    started_ns: u64,
}

/// An allocation held, for the per-sample files.
#[derive(Debug, Clone, Copy)]
struct Each {
    tgid: u32,
    tid: u32,
    cpu: u32,
    /// When it was made: CLOCK_MONOTONIC nanoseconds.
    ts: u64,
    stack: u64,
    /// Bytes, weighted as the report's totals are.
    bytes: u64,
}

impl Memleak {
    /// How sampling is configured: its kind, N, and the weight of
    /// `--sample-bytes` by size slot with its gaps.
    fn sampling(&self) -> (u32, u64) {
        match self.args.sample_bytes {
            Some(b) => (SAMPLE_BYTES, b),
            None if self.args.sample_rate > 1 => (SAMPLE_EVERY, self.args.sample_rate),
            None => (SAMPLE_ALL, 1),
        }
    }

    /// Fills `WEIGHTS` and `SAMPLE_GAPS` for `--sample-bytes b`.
    fn fill_sampling(ebpf: &mut Ebpf, b: u64) -> anyhow::Result<()> {
        let mean = b as f64;
        let mut weights: Array<_, u64> = Array::try_from(crate::kernel::load::map_mut(
            ebpf,
            rtrace_common::memleak::WEIGHTS,
        )?)?;
        for slot in 0..WEIGHT_SLOTS {
            let (from, to) = slot_sizes(slot);
            // The middle of the slot's sizes; a size of 0 as 1.
            let size = if (from as usize) < DIRECT_SIZES as usize {
                from.max(1) as f64
            } else {
                (from + to) as f64 / 2.0
            };
            weights.set(slot as u32, bytes_weight(size, mean), 0)?;
        }
        let mut gaps: Array<_, u64> = Array::try_from(crate::kernel::load::map_mut(
            ebpf,
            rtrace_common::memleak::SAMPLE_GAPS,
        )?)?;
        for i in 0..GAPS {
            // The exponential distribution's quantile at the middle of
            // slice i.
            let q = (i as f64 + 0.5) / GAPS as f64;
            let gap = -mean * (-q).ln_1p();
            gaps.set(i as u32, gap.round().max(1.0) as u64, 0)?;
        }
        Ok(())
    }

    /// The command of `pid`, from /proc while it lives, else the one
    /// the kernel recorded.
    fn comm(&mut self, pid: u32) -> String {
        if let Some(c) = self.comms.get(&pid) {
            return c.clone();
        }
        let c = crate::kernel::comm_of(pid)
            .or_else(|| self.recorded.get(&pid).map(|r| crate::kernel::c_string(r)))
            .unwrap_or_else(|| format!("[{pid}]"));
        self.comms.insert(pid, c.clone());
        c
    }

    /// The frames of stack `hash` of process `pid` (0: the kernel's),
    /// leaf first, and their lines as bcc prints them.
    fn name(&mut self, pid: u32, hash: u64) -> Named {
        if let Some(n) = self.named.get(&(pid, hash)) {
            return n.clone();
        }
        let missed = if self.user {
            MISSED_USER
        } else {
            MISSED_KERNEL
        };
        let kind = if self.user { Kind::User } else { Kind::Kernel };
        let frames: Arc<[Frame]> = match (hash != 0).then(|| self.stacks.walked(hash)).flatten() {
            Some(ips) => {
                let who = self.user.then_some(pid);
                let mut named = self.stacks.symbolize(&[(who, &ips[..])]);
                named.pop().unwrap_or_default().into()
            }
            None => vec![Frame::missed(missed, kind)].into(),
        };
        let address = self.args.stacks.addresses;
        let lines: Vec<String> = frames
            .iter()
            .map(|f| crate::output::stacks::frame_text(f, address))
            .collect();
        let n = (frames, lines);
        self.named.insert((pid, hash), n.clone());
        n
    }

    /// What is held now, by (process, stack), with the totals allocated:
    /// `(key, held, allocated)`; and each allocation for `-a`.
    fn snapshot(&mut self, older_ns: u64) -> anyhow::Result<(Vec<Row>, Vec<Listed>)> {
        let mut by: HashMap<(u32, u64), (Amount, Amount)> = HashMap::new();
        let mut timed: HashMap<(u32, u64, u32), Amount> = HashMap::new();
        let (by_time, zero) = (self.reports.html.is_some(), self.started_ns);
        let each = self.args.each.any();
        let mut listed = Vec::new();
        self.last_each.clear();
        let totals = match &mut self.totals {
            Some(t) => read_all(t).0,
            None => Vec::new(),
        };
        for (k, t) in &totals {
            self.recorded.entry(k.tgid).or_insert(t.comm);
            let e = by.entry((k.tgid, k.stack)).or_default();
            e.1 = Amount {
                bytes: t.alloc_bytes,
                objects: t.allocs,
            };
            if self.args.combined_only {
                e.0 = Amount {
                    bytes: t.alloc_bytes.saturating_sub(t.freed_bytes),
                    objects: t.allocs.saturating_sub(t.frees),
                };
            }
        }
        if !self.args.combined_only
            && let Some(a) = &mut self.allocs
        {
            let all = read_all(a).0;
            let now = crate::kernel::monotonic_ns();
            for (k, a) in all {
                let age = now.saturating_sub(a.ts);
                if age < older_ns {
                    continue;
                }
                // The kernel's weight is its table's, for the middle of a
                // slot of sizes; the exact one, from the size itself, keeps
                // sizes at a slot's edge (4096) from a bias of their own.
                let weight = match self.args.sample_bytes {
                    Some(b) => bytes_weight(a.size.max(1) as f64, b as f64),
                    None => a.weight,
                };
                by.entry((k.tgid, a.stack))
                    .or_default()
                    .0
                    .add(a.size, weight);
                if each {
                    self.last_each.push(Each {
                        tgid: k.tgid,
                        tid: a.tid,
                        cpu: a.cpu,
                        ts: a.ts,
                        stack: a.stack,
                        bytes: weighted_bytes(a.size, weight),
                    });
                }
                if by_time {
                    let slot = a.ts.saturating_sub(zero) / HEAT_SLOT_NS + 1;
                    timed
                        .entry((k.tgid, a.stack, slot as u32))
                        .or_default()
                        .add(a.size, weight);
                }
                if self.args.show_allocs {
                    listed.push(Listed {
                        pid: k.tgid,
                        addr: format!("{:x}", k.addr),
                        size: a.size,
                        age_ms: age / 1_000_000,
                    });
                }
            }
        }
        listed.sort_by_key(|l| (l.pid, std::cmp::Reverse(l.size)));
        self.last_timed = timed
            .into_iter()
            .map(|((tgid, stack, slot), a)| (tgid, stack, slot, a.bytes))
            .collect();
        let out = by
            .into_iter()
            .map(|((tgid, stack), (h, a))| {
                (
                    TotalKey {
                        tgid,
                        _pad: 0,
                        stack,
                    },
                    h,
                    a,
                )
            })
            .collect();
        Ok((out, listed))
    }

    /// The stacks as samples of `value` (by key, held, allocated), for
    /// folded lines and the files.
    fn samples(&mut self, rows: &[Row], value: impl Fn(&Amount, &Amount) -> u64) -> Vec<Sample> {
        let entries: Vec<_> = rows
            .iter()
            .map(|(k, h, a)| (k.tgid, k.stack, 0, value(h, a)))
            .collect();
        self.samples_of(&entries)
    }

    /// Samples of (process, stack, heat map slot, count).
    fn samples_of(&mut self, entries: &[(u32, u64, u32, u64)]) -> Vec<Sample> {
        let mut out = Vec::new();
        for &(tgid, stack, slot, count) in entries {
            let (frames, _) = self.name(tgid, stack);
            let empty: Arc<[Frame]> = Vec::new().into();
            let (user, kernel) = if self.user {
                (frames, empty)
            } else {
                (empty, frames)
            };
            let comm = if self.user {
                self.comm(tgid)
            } else {
                "kernel".to_owned()
            };
            out.push(Sample {
                comm,
                pid: tgid,
                started: 0,
                tid: 0,
                user,
                kernel,
                count,
                waker: None,
                off_cpu: false,
                slot,
                cut_short: false,
            });
        }
        out
    }

    /// Prints one report of what is held now; `last`: the run's last,
    /// which, once a command has exited, shows all it never freed, of
    /// any age.
    fn report(&mut self, sink: &mut Sink, last: bool) -> anyhow::Result<()> {
        let older = if last && self.args.scope.commanded() {
            0
        } else {
            self.args.older.saturating_mul(1_000_000)
        };
        let (rows, listed) = self.snapshot(older)?;
        let held: Vec<&Row> = rows.iter().filter(|(_, h, _)| h.objects > 0).collect();
        let total_bytes = held.iter().map(|(_, h, _)| h.bytes).sum();
        let total_allocations = held.iter().map(|(_, h, _)| h.objects).sum::<u64>() / ONE;
        let stacks_held = held.len();
        if self.args.folded {
            let rows: Vec<_> = held.iter().map(|r| **r).collect();
            let samples = self.samples(&rows, |h, _| h.bytes);
            let opts = TextOptions {
                delimiter: false,
                annotate: false,
            };
            let lines = samples
                .iter()
                .filter(|s| s.count > 0)
                .map(|s| stacks::folded_line(s, opts))
                .collect();
            sink.emit(&Folded { lines })?;
        } else {
            let mut top: Vec<&Row> = held.clone();
            match self.args.sort {
                SortKey::Size => top.sort_by_key(|(_, h, _)| std::cmp::Reverse(h.bytes)),
                SortKey::Count => top.sort_by_key(|(_, h, _)| std::cmp::Reverse(h.objects)),
            }
            top.truncate(self.args.top);
            let mut stacks_out = Vec::new();
            for (k, h, _) in top {
                let (_, lines) = self.name(k.tgid, k.stack);
                let comm = if self.user {
                    self.comm(k.tgid)
                } else {
                    String::new()
                };
                stacks_out.push(Held {
                    pid: k.tgid,
                    comm,
                    bytes: h.bytes,
                    allocations: h.count(),
                    stack: lines,
                });
            }
            sink.emit(&Report {
                time: crate::output::hms(),
                total_bytes,
                total_allocations,
                stacks_held,
                allocations: listed,
                stacks: stacks_out,
                top: self.args.top,
                user: self.user,
            })?;
        }
        self.last = rows;
        Ok(())
    }

    /// Writes the files asked for from the last report.
    fn write_files(&mut self) -> anyhow::Result<()> {
        self.write_each()?;
        let rows = std::mem::take(&mut self.last);
        // Where allocations are not kept one by one, the totals by stack,
        // without times.
        let entries = if self.args.combined_only {
            rows.iter()
                .map(|(k, h, _)| (k.tgid, k.stack, 0, h.bytes))
                .collect()
        } else {
            std::mem::take(&mut self.last_timed)
        };
        if let Some(file) = self.reports.html.take() {
            let samples: Vec<Sample> = self
                .samples_of(&entries)
                .into_iter()
                .filter(|s| s.count > 0)
                .collect();
            let elapsed = crate::kernel::monotonic_ns().saturating_sub(self.started_ns);
            let (_, period) = self.sampling();
            let sampling = match self.args.sample_bytes {
                Some(_) => format!("one byte in {period} on average"),
                None => "every allocation".to_owned(),
            };
            let held_bytes: u64 = samples.iter().map(|s| s.count).sum();
            let facts = crate::output::html::with_run_facts(vec![
                ("Events".to_owned(), "allocations and frees".to_owned()),
                ("Sampled".to_owned(), sampling),
                (
                    "Duration".to_owned(),
                    format!("{:.1} s", elapsed as f64 / 1e9),
                ),
                ("Bytes held".to_owned(), thousands(held_bytes)),
            ]);
            let started_secs =
                crate::output::epoch_secs() as i64 - (elapsed / 1_000_000_000) as i64;
            let page = crate::output::html::Page {
                title: "rtrace memleak: bytes held, by when and where they were allocated"
                    .to_owned(),
                facts,
                unit: "bytes",
                profiles: vec![("memleak".to_owned(), &samples)],
                heat: Some(crate::output::local_time_of(started_secs)),
            };
            file.write(&held(&samples, "bytes"), |out| {
                crate::output::html::write(&page, out)
            })?;
        }
        let held_samples: Vec<Sample> = self
            .samples(&rows, |h, _| h.bytes)
            .into_iter()
            .filter(|s| s.count > 0)
            .collect();
        if let Some(file) = self.reports.svg.take() {
            let samples = &held_samples;
            let opts = FlameOptions {
                title: "rtrace memleak: bytes held, by the stack that allocated them".to_owned(),
                icicle: false,
                count_name: "bytes".to_owned(),
                palette: inferno::flamegraph::color::Palette::Basic(
                    inferno::flamegraph::color::BasicPalette::Mem,
                ),
            };
            let what = held(samples, "bytes");
            file.write(&what, |out| stacks::write_svg(samples, out, &opts))?;
        }
        if let Some(file) = self.reports.pprof.take() {
            let samples = self.samples(&rows, |h, _| h.bytes);
            let values: Vec<[u64; 4]> = rows
                .iter()
                .map(|(_, h, a)| [a.count(), a.bytes, h.count(), h.bytes])
                .collect();
            let (_, period) = self.sampling();
            let elapsed = crate::kernel::monotonic_ns().saturating_sub(self.started_ns);
            let meta = stacks::pprof::Meta {
                types: &[
                    ("alloc_objects", "count"),
                    ("alloc_space", "bytes"),
                    ("inuse_objects", "count"),
                    ("inuse_space", "bytes"),
                ],
                values: &|i, _| values[i].to_vec(),
                period_type: ("space", "bytes"),
                period: if self.args.sample_bytes.is_some() {
                    period
                } else {
                    1
                },
                time_nanos: (crate::output::epoch_secs() * 1e9) as u64 - elapsed,
                duration_nanos: elapsed,
                comments: &[],
            };
            let inuse: u64 = rows.iter().map(|(_, h, _)| h.bytes).sum();
            let what = format!(
                "{} bytes held, {} stacks",
                thousands(inuse),
                thousands(rows.len() as u64)
            );
            let lines = self.args.stacks.lines;
            file.write(&what, |out| {
                stacks::pprof::write(&samples, out, &meta, lines)
            })?;
        }
        Ok(())
    }

    /// Writes `--firefox` and `--samples` from the last report: each
    /// allocation it counted, at its time, in its thread.
    fn write_each(&mut self) -> anyhow::Result<()> {
        if !self.args.each.any() {
            return Ok(());
        }
        let offset = crate::kernel::wall_minus_monotonic_ns();
        let each = std::mem::take(&mut self.last_each);
        let entries: Vec<_> = each.iter().map(|e| (e.tgid, e.stack, 0, e.bytes)).collect();
        // A sample for each entry, in order.
        let samples = self.samples_of(&entries);
        let timed: Vec<Timed> = each
            .iter()
            .zip(samples)
            .map(|(e, mut sample)| {
                sample.tid = e.tid;
                Timed {
                    time: e.ts.wrapping_add(offset),
                    cpu: e.cpu,
                    sample,
                }
            })
            .collect();
        let bytes: u64 = each.iter().map(|e| e.bytes).sum();
        let what = format!(
            "{} allocations, {} bytes",
            thousands(timed.len() as u64),
            thousands(bytes)
        );
        let meta = stacks::firefox::Meta {
            product: "rtrace memleak: bytes held, by when and where they were allocated".to_owned(),
            unit: stacks::firefox::Unit::Bytes,
            // No sampling: the profiler's unit of time per sample.
            interval_ns: 1_000_000,
            start_ns: self.started_ns.wrapping_add(offset),
        };
        self.reports.write_each(&timed, &meta, &what)
    }
}

/// The weight of an allocation of `size` bytes sampled with one byte in
/// `mean`: its inverse chance, `1 / (1 - e^(-size/mean))`, in 16.16.
fn bytes_weight(size: f64, mean: f64) -> u64 {
    let chance = -(-size / mean).exp_m1();
    ((ONE as f64) / chance).round().min(u64::MAX as f64 / 2.0) as u64
}

/// The offsets of the kmem tracepoints' fields on this kernel; those of
/// a tracepoint it does not have stay 0 (it is not attached).
fn kmem_offsets() -> anyhow::Result<KmemOffsets> {
    let mut o = KmemOffsets::default();
    let pair = |event: &str| -> Option<[u32; 3]> {
        let f = Format::read("kmem", event).ok()?;
        Some([
            f.offset("ptr").ok()?,
            f.offset("bytes_alloc").ok()?,
            f.offset("call_site").ok()?,
        ])
    };
    let one = |category: &str, event: &str, field: &str| -> Option<u32> {
        Format::read(category, event).ok()?.offset(field).ok()
    };
    o.kmalloc = pair("kmalloc").context(
        "the kernel has no kmem:kmalloc tracepoint with ptr, bytes_alloc and call_site (tried tracefs)",
    )?;
    o.kmalloc_node = pair("kmalloc_node").unwrap_or_default();
    o.cache_alloc = pair("kmem_cache_alloc").unwrap_or_default();
    o.cache_alloc_node = pair("kmem_cache_alloc_node").unwrap_or_default();
    o.kfree = one("kmem", "kfree", "ptr").unwrap_or_default();
    o.cache_free = one("kmem", "kmem_cache_free", "ptr").unwrap_or_default();
    o.page_pfn = one("kmem", "mm_page_alloc", "pfn").unwrap_or_default();
    o.page_order = one("kmem", "mm_page_alloc", "order").unwrap_or_default();
    o.page_free_pfn = one("kmem", "mm_page_free", "pfn").unwrap_or_default();
    o.percpu_ptr = one("percpu", "percpu_alloc_percpu", "ptr").unwrap_or_default();
    o.percpu_bytes = one("percpu", "percpu_alloc_percpu", "bytes_alloc")
        .or_else(|| one("percpu", "percpu_alloc_percpu", "size"))
        .unwrap_or_default();
    o.percpu_call_site = one("percpu", "percpu_alloc_percpu", "call_site").unwrap_or_default();
    o.percpu_free_ptr = one("percpu", "percpu_free_percpu", "ptr").unwrap_or_default();
    Ok(o)
}

impl Tool for Memleak {
    type Args = Args;

    // User mode attaches uprobes, kernel mode tracepoints: no chain.
    // Expected besides the walk's: frees of what was allocated before
    // tracing began, which the kernel makes all the time (this tool's own
    // warning names them for a command, which is traced from its start).
    const SPEC: Spec = Spec::new("memleak", &[], &ERR_NAMES).expected(&EXPECTED);

    fn new(mut args: Args) -> anyhow::Result<Self> {
        if let Some(c) = &args.command {
            if args.scope.commanded() {
                anyhow::bail!("-c COMMAND and -- CMD both name a command: give one");
            }
            args.scope.command = c.split_whitespace().map(OsString::from).collect();
            if args.scope.command.is_empty() {
                anyhow::bail!("-c: the command is empty");
            }
        }
        for &pid in &args.scope.pids {
            tracer::check_task(pid, "process")?;
        }
        if let (Some(lo), Some(hi)) = (args.min_size, args.max_size)
            && lo > hi
        {
            anyhow::bail!("-z {lo} is above -Z {hi}: no allocation could be traced");
        }
        if args.combined_only && args.show_allocs {
            anyhow::bail!("-a lists allocations, which --combined-only does not read");
        }
        let user =
            !args.scope.pids.is_empty() || args.scope.commanded() || args.scope.cgroup.is_some();
        if !user && args.obj.is_some() {
            anyhow::bail!("-O names a process's allocator: give -p, -c or -- CMD");
        }
        if let Some(flag) = args.each.flag()
            && args.combined_only
        {
            anyhow::bail!(
                "{flag} writes each allocation held, which --combined-only does not keep"
            );
        }
        if user && args.percpu {
            anyhow::bail!("--percpu traces the kernel's per-CPU allocations: not with a process");
        }
        let object = if user {
            let target = args.obj.as_deref().unwrap_or("c");
            Some(uprobes::resolve(target, args.scope.one_pid())?)
        } else {
            None
        };
        // memleak's own `--sort` (bytes or allocations) and `-s` (bcc's
        // sample rate) keep the stack tools' report table out: its files
        // are declared here, and written as the others' are.
        let reports = StackReports::create([
            args.svg.as_deref(),
            args.pprof.as_deref(),
            None,
            None,
            args.html.as_deref(),
            args.each.firefox.as_deref(),
            args.each.samples.as_deref(),
        ])?;
        Ok(Self {
            user,
            object,
            attached: Vec::new(),
            skipped: Vec::new(),
            stacks: StackTool::new(false),
            allocs: None,
            totals: None,
            named: HashMap::new(),
            comms: HashMap::new(),
            recorded: HashMap::new(),
            reports,
            last: Vec::new(),
            last_timed: Vec::new(),
            last_each: Vec::new(),
            unseen_frees: 0,
            started_ns: 0,
            args,
        })
    }

    fn variants(&self, _m: Option<Mechanism>, _kernel: &mut Kernel) -> Vec<&'static str> {
        if !self.user {
            return vec![""];
        }
        let mut v = StackTool::variants(self.args.stacks.unwind, true);
        // Without the CFI walk, calls in flight are best kept in task
        // storage.
        if self.args.stacks.unwind != Unwind::Cfi {
            v.insert(v.len() - 1, TASK_STORAGE);
        }
        v
    }

    fn configure(
        &mut self,
        _m: Option<Mechanism>,
        kernel: &mut Kernel,
        load: &mut Load,
    ) -> anyhow::Result<()> {
        self.stacks = StackTool::new(false);
        self.stacks.configure(&self.args.stacks, kernel, load)?;
        in_flight(load);
        let (sample, every) = self.sampling();
        let cfg = Config {
            sample,
            trace: u32::from(self.args.trace),
            every,
            min_size: self.args.min_size.unwrap_or(0),
            max_size: self.args.max_size.unwrap_or(u64::MAX),
            missing_free: u32::from(self.args.wa_missing_free),
            kmem: if self.user {
                KmemOffsets::default()
            } else {
                kmem_offsets()?
            },
            bpf_alloc: match self.user {
                true => [0, 0],
                false => kernel
                    .text_span(BPF_ALLOCATOR)
                    .map_or([0, 0], |(a, b)| [a, b]),
            },
        };
        load.config(&cfg)
            .size(rtrace_common::memleak::ALLOCS, self.args.max_allocs)
            .size(
                rtrace_common::memleak::TOTALS,
                self.args.stacks.hash_storage_size,
            );
        Ok(())
    }

    fn attach(
        &mut self,
        _m: Option<Mechanism>,
        kernel: &mut Kernel,
        ebpf: &mut Ebpf,
    ) -> anyhow::Result<()> {
        self.attached.clear();
        self.skipped.clear();
        if let Some(b) = self.args.sample_bytes {
            Self::fill_sampling(ebpf, b)?;
        }
        let pids = self.args.scope.pids.clone();
        self.stacks.attach(ebpf, &pids)?;
        self.stacks.take_stacks(ebpf)?;
        // A command allocates from its first instruction, before its maps
        // are read: its program's and its allocator's CFI go in first.
        if self.args.scope.commanded() {
            let program = self
                .args
                .scope
                .command
                .first()
                .and_then(|c| uprobes::resolve(&c.to_string_lossy(), None).ok());
            let files: Vec<&Path> = self
                .object
                .as_deref()
                .into_iter()
                .chain(program.as_deref())
                .collect();
            self.stacks.preload(&files);
        }
        self.allocs = Some(BpfHashMap::try_from(crate::kernel::load::take_map(
            ebpf,
            rtrace_common::memleak::ALLOCS,
        )?)?);
        self.totals = Some(BpfHashMap::try_from(crate::kernel::load::take_map(
            ebpf,
            rtrace_common::memleak::TOTALS,
        )?)?);
        if let Some(file) = self.object.clone() {
            self.attach_allocator(kernel, ebpf, &file)?;
        } else {
            let mut hooks = Hooks::new(Mechanism::Tracepoint, kernel)?;
            let wanted = KMEM
                .iter()
                .chain(if self.args.percpu { PERCPU } else { &[] });
            for &(event, category) in wanted {
                if hooks.attach_if_present(ebpf, event, category, event)? {
                    self.attached.push(format!("{category}:{event}"));
                } else {
                    self.skipped
                        .push(format!("no tracepoint {category}:{event} here"));
                }
            }
            if !self.attached.iter().any(|a| a == "kmem:kmalloc") {
                anyhow::bail!(
                    "cannot trace the kernel's allocations: {}",
                    self.skipped.join("; ")
                );
            }
        }
        Ok(())
    }

    fn describe(&self) -> Vec<String> {
        let mut lines = vec![{
            match &self.object {
                Some(f) => format!(
                    "uprobes on {} in {}; {}",
                    self.attached.join(", "),
                    f.display(),
                    self.stacks.describe()
                ),
                None => format!("tracepoints {}", self.attached.join(", ")),
            }
        }];
        lines.extend(self.skipped.iter().map(|s| format!("skipped: {s}")));
        lines
    }

    fn banner(&self) -> String {
        let sampled = match self.sampling() {
            (SAMPLE_BYTES, b) => format!(", sampling one byte in {b} (sizes estimated)"),
            (SAMPLE_EVERY, n) => format!(", sampling every {n}th allocation (sizes estimated)"),
            _ => String::new(),
        };
        if self.user {
            format!(
                "Attaching to allocators in {}{sampled}... Hit Ctrl-C to end.",
                self.object
                    .as_deref()
                    .map(Path::display)
                    .map(|d| d.to_string())
                    .unwrap_or_default()
            )
        } else {
            format!("Attaching to kernel allocators{sampled}... Hit Ctrl-C to end.")
        }
    }

    fn start(&mut self) {
        self.started_ns = crate::kernel::monotonic_ns();
        self.stacks.start(!self.user);
    }

    fn event(&mut self, record: &[u8], sink: &mut Sink) -> anyhow::Result<()> {
        if record.len() == size_of::<Call>() {
            if let Some(c) = events::record::<Call>(record) {
                let comm = crate::kernel::c_string(&c.comm);
                sink.emit(&Traced {
                    pid: c.pid,
                    comm,
                    call: if c.alloc != 0 { "alloc" } else { "free" },
                    addr: format!("{:#x}", c.addr),
                    size: c.size,
                })?;
            }
            return Ok(());
        }
        self.stacks.event(record)
    }

    fn after_events(&mut self, _ebpf: &mut Ebpf) -> anyhow::Result<()> {
        self.stacks.look_again();
        Ok(())
    }

    fn tick(&mut self, _ebpf: &mut Ebpf, sink: &mut Sink, last: bool) -> anyhow::Result<()> {
        self.report(sink, last)
    }

    fn finish(&mut self, ebpf: &mut Ebpf, _sink: &mut Sink) -> anyhow::Result<()> {
        if let Ok(errors) = crate::kernel::load::read_errors(ebpf, ERR_NAMES.len()) {
            self.unseen_frees = errors.get(ERR_FREE_UNSEEN as usize).copied().unwrap_or(0);
        }
        self.write_files()
    }

    fn plan(&self) -> Plan {
        Plan {
            scope: Scope {
                exclude_self: true,
                ..self.args.scope.scope()
            },
            events: Some(self.args.buffer.clone()),
            interval: Schedule::Every {
                period: std::time::Duration::from_secs(self.args.interval),
                count: self.args.count,
            },
            ..Plan::default()
        }
    }

    fn outcome(&self) -> Outcome {
        Outcome {
            summary: self.stacks.summary(),
            warnings: {
                let mut out = self.stacks.warnings();
                // The kernel frees what it allocated before tracing all the time.
                if self.user && self.unseen_frees > 0 && self.args.scope.commanded() {
                    out.push(Warning::lost(format!(
                        "{} frees of addresses not seen allocated (allocated before tracing began, \
                 or not recorded)",
                        self.unseen_frees
                    )));
                }
                out
            },
        }
    }
}

impl Memleak {
    /// Attaches the allocator's entry points found in `file`: libc's
    /// usual names, and with `-O` other allocators' own too.
    fn attach_allocator(
        &mut self,
        kernel: &mut Kernel,
        ebpf: &mut Ebpf,
        file: &Path,
    ) -> anyhow::Result<()> {
        let symbols = kernel.symbols(file).cloned();
        let pid = self.args.scope.one_pid();
        let names = STANDARD.iter().chain(if self.args.obj.is_some() {
            PREFIXED
        } else {
            &[]
        });
        // Programs the kernel would not load: each try runs the verifier
        // again (seconds for the return probe's walk), to the same end.
        let mut unloadable: Vec<String> = Vec::new();
        for &(func, role) in names {
            if let Some(s) = &symbols
                && !s.contains_key(func)
            {
                continue;
            }
            if unloadable.iter().any(|u| {
                u == role.prog || (role.returns && u == rtrace_common::memleak::PROG_ALLOC_RETURN)
            }) {
                continue;
            }
            // An entry-only probe traps where the kernel emulates the
            // instruction, if that place is as good as the entry.
            let entry = match symbols.as_ref().and_then(|s| s.get(func)) {
                Some(&at) if !role.returns => {
                    let site = uprobes::cheap_entry(file, at);
                    uprobes::attach_at(ebpf, role.prog, func, site, file, pid)
                }
                _ => uprobes::attach(ebpf, role.prog, func, file, symbols.as_ref(), pid),
            };
            let both = entry.and_then(|()| {
                if role.returns {
                    uprobes::attach(
                        ebpf,
                        rtrace_common::memleak::PROG_ALLOC_RETURN,
                        func,
                        file,
                        symbols.as_ref(),
                        pid,
                    )
                } else {
                    Ok(())
                }
            });
            match both {
                Ok(()) => self.attached.push(func.to_owned()),
                Err(e) => {
                    if let Some(n) = e.downcast_ref::<uprobes::NotLoaded>() {
                        unloadable.push(n.prog().to_owned());
                    }
                    self.skipped.push(format!("{e:#}"));
                }
            }
        }
        if !self
            .attached
            .iter()
            .any(|f| f.ends_with("alloc") || f.ends_with("Malloc"))
        {
            anyhow::bail!(
                "no allocator function could be traced in {}{}",
                file.display(),
                if self.skipped.is_empty() {
                    String::new()
                } else {
                    format!(": {}", self.skipped.join("; "))
                }
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_are_inverse_chances() {
        // Far above the mean, certain; far below, mean / size.
        assert_eq!(bytes_weight(1e9, 65536.0), ONE);
        let w = bytes_weight(64.0, 65536.0) as f64 / ONE as f64;
        assert!((w - (65536.0 / 64.0 + 0.5)).abs() < 1.0, "{w}");
        // Every size finds the slot whose sizes hold it.
        for size in [0u64, 1, 4095, 4096, 4097, 65535, 1 << 20, (1 << 40) + 12345] {
            let (from, to) = slot_sizes(rtrace_common::memleak::weight_slot(size));
            assert!(from <= size && size < to, "{size}: {from}..{to}");
        }
    }
}

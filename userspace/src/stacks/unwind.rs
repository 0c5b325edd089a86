//! Each process's executable regions with their files' CFI tables (which
//! [`cfi`](super::cfi) compiles and [`cficache`](super::cficache) keeps on
//! disk), loaded into the kernel's maps for the in-kernel walk of user
//! stacks built without frame pointers.
//!
//! Addresses no FDE covers fall back to the frame pointer (JIT code, hand-
//! written assembly), which the kernel counts. A reference walk over the
//! same rows, which the kernel's walk must agree with, is checked in the
//! tests.

use std::{collections::HashMap, path::Path, sync::Arc};

use rtrace_common::unwind::{
    Bucket, CFI_FILES, CFI_INDEX, CFI_PROCS, CFI_ROWS, CFI_RULES, CfiRow, CfiRule, FileKey,
    FileRegion, FileRows, MAX_REGIONS, ProcRegions, Region as KRegion,
};

use crate::kernel::load::take_map;
use crate::kernel::procmaps::{self, Proc};
use crate::kernel::warning::Warning;

use crate::stacks::cfi::{
    CFA_END, CFA_PLT, CFA_RBP, CFA_RBX, CFA_RSP, CFA_RSP_IN_PARENT, CFA_RSP_RA_RDI, Row,
};
use crate::stacks::cfi::{CfiError, Table, compile, segments};
use crate::stacks::jitdump::dump_pid;

/// One file's table, shared by every process that maps the file.
#[derive(Debug)]
pub struct FileTable {
    /// The compiled rows; empty where the file has no usable CFI.
    pub table: Table,
    segments: Vec<(u64, u64, u64)>,
    /// The file as the kernel names it, and its executable segment's
    /// [`FileRegion::seg_delta`]: where the kernel's walk may find the
    /// file's mappings itself. `None` for the vDSO, and files with several
    /// executable segments.
    kernel: Option<(FileKey, u64)>,
    /// The file as `stat` names it (device, inode); `None` for the vDSO.
    stat: Option<(u64, u64)>,
}

/// The kernel's name of the file `stat` says is on `dev` at `ino`: its
/// `s_dev` encodes the device as `major << 20 | minor`, `st_dev` as
/// glibc's `makedev` does.
fn file_key(dev: u64, ino: u64) -> FileKey {
    FileKey {
        ino,
        dev: (libc::major(dev) << 20) | (libc::minor(dev) & 0xf_ffff),
        _pad: 0,
    }
}

impl FileTable {
    /// The load bias of a mapping of `len` bytes of the file from `offset`:
    /// what turns its addresses into the file's virtual addresses. Mappings
    /// start and end on pages, segments need not, so a mapping can hold the
    /// tail of one segment before another: the segment is the one it holds
    /// most of.
    fn bias(&self, start: u64, offset: u64, len: u64) -> Option<u64> {
        let overlap = |&&(seg_off, size, _): &&(u64, u64, u64)| {
            (offset + len)
                .min(seg_off + size)
                .saturating_sub(offset.max(seg_off))
        };
        self.segments
            .iter()
            .filter(|s| overlap(s) > 0)
            .max_by_key(overlap)
            .map(|&(seg_off, _, vaddr)| {
                // Address of file offset x: start + (x - offset); its
                // virtual address: x - seg_off + vaddr.
                start
                    .wrapping_sub(offset)
                    .wrapping_add(seg_off)
                    .wrapping_sub(vaddr)
            })
    }
}

/// An executable mapping of a process, with its file's table.
#[derive(Debug, Clone)]
pub struct Region {
    /// First address.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// What is subtracted from an address to get the file's virtual
    /// address (the load bias).
    pub bias: u64,
    /// The file's table; `None` for anonymous code (JIT) and files without
    /// CFI, where the walk falls back to the frame pointer.
    pub table: Option<Arc<FileTable>>,
    /// What the mapping is, as `/proc/PID/maps` names it.
    #[cfg_attr(not(test), expect(dead_code, reason = "read by the tests"))]
    pub name: String,
}

/// The tables of every file the processes asked about map, one per file:
/// a library shared by many processes is compiled once.
#[derive(Debug, Default)]
pub struct Tables {
    files: HashMap<(u64, u64), Option<Arc<FileTable>>>,
    /// Files whose call frame information could not be read, and why:
    /// their code is walked by frame pointer.
    pub unreadable: Vec<(String, CfiError)>,
    vdso: Option<Option<Arc<FileTable>>>,
    /// Where compiled tables are kept between runs, if anywhere.
    pub cache: Option<crate::stacks::cficache::DiskCache>,
}

impl Tables {
    /// The executable regions of process `pid` (`None`: this process),
    /// compiling the tables of files not seen before. Files are opened as
    /// [`procmaps::Mapping::open`] does.
    pub fn process(&mut self, pid: Option<u32>) -> std::io::Result<Vec<Region>> {
        let proc_dir = match pid {
            Some(p) => procmaps::proc_dir(p),
            None => procmaps::ProcDir::this(),
        };
        let mut regions = Vec::new();
        for m in procmaps::read_in(&proc_dir)?.into_iter().filter(|m| m.exec) {
            // A jitdump is mapped executable only for profilers to find
            // it; it is data, never run, and has no CFI.
            let file = m
                .path()
                .filter(|p| dump_pid(p).is_none())
                .and_then(|_| m.open(&proc_dir).ok());
            let table = if m.name == "[vdso]" {
                self.vdso()
            } else {
                file.and_then(|f| self.of_file(&f, &m.name))
            };
            let bias = table
                .as_ref()
                .and_then(|t| t.bias(m.start, m.offset, m.end - m.start))
                .unwrap_or(0);
            regions.push(Region {
                start: m.start,
                end: m.end,
                bias,
                table,
                name: m.name,
            });
        }
        Ok(regions)
    }

    /// The region of a recorded mapping (perf.data's `mmap` records): from
    /// `start` to `end`, of `file` (already opened, and checked to be the
    /// one recorded) from `offset`; the vDSO's is this kernel's.
    pub fn recorded(
        &mut self,
        (start, end, offset): (u64, u64, u64),
        name: &str,
        file: Option<&std::fs::File>,
    ) -> Region {
        let table = if name == "[vdso]" {
            self.vdso()
        } else if dump_pid(name).is_some() {
            // A jitdump is data, never run, and has no CFI.
            None
        } else {
            file.and_then(|f| self.of_file(f, name))
        };
        let bias = table
            .as_ref()
            .and_then(|t| t.bias(start, offset, end - start))
            .unwrap_or(0);
        Region {
            start,
            end,
            bias,
            table,
            name: name.to_owned(),
        }
    }

    /// The table of the file at `path`, compiled (or read from the cache)
    /// if it was not before: for files known to be needed before any
    /// process maps them.
    pub fn file(&mut self, path: &Path) -> Option<Arc<FileTable>> {
        let f = std::fs::File::open(path).ok()?;
        self.of_file(&f, &path.to_string_lossy())
    }

    /// The table of open file `f`, named `name` in warnings, by its device
    /// and inode: compiled once.
    fn of_file(&mut self, f: &std::fs::File, name: &str) -> Option<Arc<FileTable>> {
        use std::os::unix::fs::MetadataExt as _;
        let meta = f.metadata().ok()?;
        let key = (meta.dev(), meta.ino());
        if let Some(t) = self.files.get(&key) {
            return t.clone();
        }
        let made = (|| {
            // Mapped, only the headers and the CFI are read of a file that
            // may be mostly debug information.
            let data = crate::kernel::memory::Mapped::of(f).ok()?;
            let compiled = match self.cache.as_mut() {
                Some(cache) => cache.get_or_compile(&data, compile),
                None => compile(&data),
            };
            let table = compiled.unwrap_or_else(|e| {
                self.unreadable.push((name.to_owned(), e));
                Table::default()
            });
            let segments = segments(&data);
            let kernel = segments
                .exec_delta
                .map(|d| (file_key(meta.dev(), meta.ino()), d));
            Some(Arc::new(FileTable {
                table,
                segments: segments.ranges,
                kernel,
                stat: Some(key),
            }))
        })();
        self.files.insert(key, made.clone());
        made
    }

    /// Compiles the tables of this process's own files on a thread of its
    /// own, for [`Tables::absorb`]: rtrace's program is large, its table
    /// takes a second to compile in an emulated guest, and compiled at
    /// its first sample, in the loop that builds the tables of the
    /// processes the walk asks for, it held up every other new process's
    /// (whose first second of stacks then went by frame pointer). Begun
    /// before the programs load, it is done by the time they are.
    pub fn compile_self_beside() -> Option<std::thread::JoinHandle<Tables>> {
        std::thread::Builder::new()
            .spawn(|| {
                let mut t = Tables {
                    cache: crate::stacks::cficache::DiskCache::from_env(),
                    ..Tables::default()
                };
                let _ = t.process(None);
                t
            })
            .ok()
    }

    /// Takes the tables `other` compiled that this has not.
    pub fn absorb(&mut self, other: Tables) {
        for (key, table) in other.files {
            self.files.entry(key).or_insert(table);
        }
        self.unreadable.extend(other.unreadable);
        if self.vdso.is_none() {
            self.vdso = other.vdso;
        }
        if let (Some(mine), Some(theirs)) = (self.cache.as_mut(), other.cache) {
            mine.read += theirs.read;
            mine.written += theirs.written;
            mine.write_error = mine.write_error.take().or(theirs.write_error);
        }
    }

    /// The vDSO's table. The kernel maps one image into every process, so
    /// it is compiled once, from this process's own copy.
    fn vdso(&mut self) -> Option<Arc<FileTable>> {
        self.vdso
            .get_or_insert_with(|| {
                let m = procmaps::read(None)
                    .ok()?
                    .into_iter()
                    .find(|m| m.name == "[vdso]")?;
                // SAFETY: the kernel maps the vDSO readable for the whole
                // life of this process.
                let data = unsafe {
                    std::slice::from_raw_parts(m.start as *const u8, (m.end - m.start) as usize)
                };
                Some(Arc::new(FileTable {
                    table: compile(data).ok()?,
                    segments: segments(data).ranges,
                    kernel: None,
                    stat: None,
                }))
            })
            .clone()
    }

    /// Files with tables, their rows, and the rows' size in bytes as the
    /// kernel will hold them (4 bytes a row).
    #[cfg(test)]
    pub fn stats(&self) -> (usize, usize, usize) {
        let rows: usize = self
            .files
            .values()
            .flatten()
            .map(|f| f.table.rows.len())
            .sum();
        (
            self.files.values().flatten().count(),
            rows,
            rows * size_of::<CfiRow>(),
        )
    }
}

/// Most processes [`KernelTables::short_of_budget`] remembers: a day's
/// build at a few hundred bytes each.
const SHORT_OF_BUDGET_MOST: usize = 1 << 16;

/// The kernel's copy of the tables: the rows and index arrays and each
/// process's regions, filled as processes show up and refreshed as they
/// map more (`dlopen`), each file's rows loaded once.
pub struct KernelTables {
    /// The rows array, written in place through `rows`, row by row.
    _rows_map: aya::maps::Array<aya::maps::MapData, u64>,
    rows: crate::kernel::memory::SharedArray<CfiRow>,
    /// The index array, written in place through `index`.
    _index_map: aya::maps::Array<aya::maps::MapData, Bucket>,
    index: crate::kernel::memory::SharedArray<Bucket>,
    /// The rules array, written in place through `rules`.
    _rules_map: aya::maps::Array<aya::maps::MapData, CfiRule>,
    rules: crate::kernel::memory::SharedArray<CfiRule>,
    procs: aya::maps::HashMap<aya::maps::MapData, u32, ProcRegions>,
    /// Each loaded file's rows by the file, for the mappings the walk
    /// finds itself.
    files: aya::maps::HashMap<aya::maps::MapData, FileKey, FileRegion>,
    /// Files loaded whose rows `files` did not take (full).
    files_unnamed: usize,
    tables: Tables,
    /// Each loaded file, by its table.
    loaded: HashMap<usize, Loaded>,
    /// The free places of the rows, index and rules arrays.
    free_rows: Free,
    free_buckets: Free,
    free_rules: Free,
    /// The processes whose regions were read (or copied at fork), with
    /// the files (by table) they map; by pid, as the kernel's table is,
    /// with the process that has the pid.
    captured: HashMap<u32, (Proc, Vec<usize>)>,
    /// Files whose rows did not fit, even with every file no live process
    /// maps evicted, each once (by its table), with the rows, buckets and
    /// rules it needed and when it was last tried: their code is walked by
    /// frame pointer. A process mapping one tries it again.
    files_not_loaded: HashMap<usize, (Capacity, std::time::Instant)>,
    /// Processes (by id and start tick) that mapped such a file when their
    /// regions were read, kept after they exit (a build's compilers are
    /// gone by the report), up to [`SHORT_OF_BUDGET_MOST`].
    short_of_budget: std::collections::HashSet<(u32, u64)>,
    /// What the arrays hold.
    capacity: Capacity,
    /// Files evicted to make room, and their rows.
    evicted: (usize, usize),
    /// Processes whose regions did not fit, even once exited ones were
    /// forgotten.
    pub processes_not_loaded: usize,
    /// Writes of a process's regions so far: each carries the count as
    /// its version.
    writes: u32,
}

/// How many elements the kernel's rows, index and rules arrays hold.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Capacity {
    /// Rows, four bytes each.
    pub rows: u32,
    /// Buckets of the index, eight bytes each.
    pub buckets: u32,
    /// Rules, eight bytes each.
    pub rules: u32,
}

impl Capacity {
    /// The arrays `budget` bytes hold. A row takes four bytes and a
    /// quarter of a bucket (two); files with few rows over much code take
    /// more buckets, and a file's distinct rules, some hundreds, are kept
    /// once: seven bytes a row in all.
    pub fn of_budget(budget: u64) -> Self {
        // Even: the kernel's array holds rows in pairs.
        let rows = u32::try_from(budget / 7).unwrap_or(u32::MAX) & !1;
        Self {
            rows,
            buckets: rows / 4 + rows / 16,
            rules: rows / 16,
        }
    }

    /// The bytes the arrays take.
    pub fn bytes(&self) -> u64 {
        u64::from(self.rows) * size_of::<CfiRow>() as u64
            + u64::from(self.buckets) * size_of::<Bucket>() as u64
            + u64::from(self.rules) * size_of::<CfiRule>() as u64
    }

    /// The budget in MiB, rounded up, whose arrays would hold `need`
    /// besides `self` (what is taken).
    fn budget_for(&self, need: &Capacity, of: &Capacity) -> u64 {
        let scale = |taken: u32, need: u32, cap: u32| {
            (f64::from(taken) + f64::from(need)) / f64::from(cap.max(1))
        };
        let times = scale(self.rows, need.rows, of.rows)
            .max(scale(self.buckets, need.buckets, of.buckets))
            .max(scale(self.rules, need.rules, of.rules));
        (times * of.bytes() as f64 / f64::from(1 << 20)).ceil() as u64
    }
}

/// A loaded file: where its rows are, and when a process last mapped it.
#[derive(Debug)]
struct Loaded {
    at: FileRows,
    rules: u32,
    used: std::time::Instant,
    /// The file as the kernel names it, where `CFI_FILES` has it.
    kernel: Option<FileKey>,
    /// The file as `stat` names it (device, inode).
    file: Option<(u64, u64)>,
}

/// The free places of one of the kernel's arrays, sorted, neighbours
/// merged; taken first fit.
#[derive(Debug)]
struct Free(Vec<(u32, u32)>);

impl Free {
    /// All of an array of `len` elements.
    fn new(len: u32) -> Self {
        Self(vec![(0, len)])
    }

    /// The start of `n` elements taken, if a free place holds them.
    fn take(&mut self, n: u32) -> Option<u32> {
        if n == 0 {
            return Some(0);
        }
        let i = self.0.iter().position(|&(_, len)| len >= n)?;
        let (start, len) = self.0[i];
        if len == n {
            self.0.remove(i);
        } else {
            self.0[i] = (start + n, len - n);
        }
        Some(start)
    }

    /// Gives back `n` elements from `start`.
    fn give(&mut self, start: u32, n: u32) {
        if n == 0 {
            return;
        }
        let i = self.0.partition_point(|&(s, _)| s < start);
        self.0.insert(i, (start, n));
        if i + 1 < self.0.len() && start + n == self.0[i + 1].0 {
            self.0[i].1 += self.0[i + 1].1;
            self.0.remove(i + 1);
        }
        if i > 0 && self.0[i - 1].0 + self.0[i - 1].1 == start {
            self.0[i - 1].1 += self.0[i].1;
            self.0.remove(i);
        }
    }

    /// Elements free in all.
    fn total(&self) -> u32 {
        self.0.iter().map(|&(_, n)| n).sum()
    }
}

/// The files (device and inode, as `stat` names them) that live
/// processes map, as `/proc/*/maps` shows them.
fn mapped_files() -> std::collections::HashSet<(u64, u64)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Default::default();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| procmaps::read(Some(pid)).ok())
        .flatten()
        .filter(|m| m.inode != 0)
        .map(|m| (libc::makedev(m.dev.0, m.dev.1), m.inode))
        .collect()
}

/// Maps the array `name` of `ebpf`, of `len` elements of type `M`,
/// shared and writable, as elements of type `T` (whose size divides
/// `M`'s).
fn shared_array<M: aya::Pod, T: aya::Pod>(
    ebpf: &mut aya::Ebpf,
    name: &str,
    len: u32,
) -> anyhow::Result<(
    aya::maps::Array<aya::maps::MapData, M>,
    crate::kernel::memory::SharedArray<T>,
)> {
    use anyhow::Context as _;
    use aya::maps::IterableMap as _;
    use std::os::fd::AsFd as _;
    let map: aya::maps::Array<_, M> = take_map(ebpf, name)?.try_into()?;
    let shared = crate::kernel::memory::SharedArray::of(
        map.map().fd().as_fd(),
        len as usize * size_of::<M>() / size_of::<T>(),
    )
    .with_context(|| format!("cannot map the array {name}"))?;
    Ok((map, shared))
}

impl KernelTables {
    /// Takes the `cfi` object's maps, whose arrays hold `capacity`.
    pub fn new(ebpf: &mut aya::Ebpf, capacity: Capacity) -> anyhow::Result<Self> {
        let (rows_map, rows) = shared_array::<u64, _>(ebpf, CFI_ROWS, capacity.rows / 2)?;
        let (index_map, index) = shared_array::<Bucket, _>(ebpf, CFI_INDEX, capacity.buckets)?;
        let (rules_map, rules) = shared_array::<CfiRule, _>(ebpf, CFI_RULES, capacity.rules)?;
        let procs = take_map(ebpf, CFI_PROCS)?;
        let files = take_map(ebpf, CFI_FILES)?;
        Ok(Self {
            _rows_map: rows_map,
            rows,
            _index_map: index_map,
            index,
            _rules_map: rules_map,
            rules,
            procs: procs.try_into()?,
            files: files.try_into()?,
            files_unnamed: 0,
            tables: Tables {
                cache: crate::stacks::cficache::DiskCache::from_env(),
                ..Tables::default()
            },
            loaded: HashMap::new(),
            free_rows: Free::new(capacity.rows),
            free_buckets: Free::new(capacity.buckets),
            free_rules: Free::new(capacity.rules),
            captured: HashMap::new(),
            files_not_loaded: HashMap::new(),
            short_of_budget: std::collections::HashSet::new(),
            capacity,
            evicted: (0, 0),
            processes_not_loaded: 0,
            writes: 0,
        })
    }

    /// Loads process `pid`'s regions, and the rows of files not loaded
    /// yet; again only if `force`. The walk says when a process runs code
    /// in none of its regions (a library loaded later, new JIT code), and
    /// exec and fork are seen in the kernel, so regions are never read
    /// again on a timer: a busy process brings new stacks every second,
    /// and rereading its maps for each would cost more than the walk.
    ///
    /// Returns whether the process's mappings were read: a mapping the
    /// walk then knows it will never report as new code, so whoever names
    /// the frames must read them no earlier.
    pub fn add_process(&mut self, who: Proc, force: bool) -> anyhow::Result<bool> {
        let pid = who.pid;
        // A pid's later process has regions of its own.
        if !force && self.captured.get(&pid).is_some_and(|(p, _)| *p == who) {
            return Ok(false);
        }
        self.captured.insert(pid, (who, Vec::new()));
        let Ok(regions) = self.tables.process(Some(pid)) else {
            // Gone already: its samples keep their frame-pointer walk.
            return Ok(false);
        };
        self.writes = self.writes.wrapping_add(1);
        let mut out = ProcRegions {
            n: 0,
            version: self.writes,
            new_code_ns: 0,
            regions: [KRegion::default(); MAX_REGIONS],
        };
        // Every executable region is listed, those without CFI (JIT code,
        // files whose rows did not fit) with no rows: code in none of them
        // is new code, which the walk reports.
        let mut files = Vec::new();
        for r in regions {
            let Some(slot) = out.regions.get_mut(out.n as usize) else {
                break;
            };
            let mut unloaded = false;
            let rows = r.table.filter(|t| !t.table.rows.is_empty()).and_then(|t| {
                files.push(Arc::as_ptr(&t) as usize);
                let rows = self.load_file(&t, &files);
                unloaded = rows.is_none();
                rows
            });
            if unloaded && self.short_of_budget.len() < SHORT_OF_BUDGET_MOST {
                self.short_of_budget.insert((pid, who.start_ticks()));
            }
            *slot = KRegion {
                start: r.start,
                end: r.end,
                bias: r.bias,
                rows: rows.unwrap_or_default(),
            };
            out.n += 1;
        }
        if let Some(c) = self.captured.get_mut(&pid) {
            c.1 = files;
        }
        if self.procs.insert(pid, out, 0).is_err() {
            // Full: room is made by forgetting processes that exited, and
            // the process's stacks go by frame pointer if there still is
            // none (counted in the kernel).
            self.forget_exited();
            if self.procs.insert(pid, out, 0).is_err() {
                self.processes_not_loaded += 1;
                // Tried again at its next new stack.
                self.captured.remove(&pid);
            }
        }
        Ok(true)
    }

    /// Whether process `who` mapped a file whose rows did not fit the
    /// budget: its frames there were walked by frame pointer, which the
    /// budget's warning names with its cure, so stacks it cut short need
    /// no warning of their own that blames code without frame pointers.
    pub fn short_of_budget(&self, who: &Proc) -> bool {
        self.short_of_budget.contains(&(who.pid, who.start_ticks()))
    }

    /// Takes the tables compiled on another thread
    /// ([`Tables::compile_self_beside`]).
    pub fn absorb(&mut self, other: Tables) {
        self.tables.absorb(other);
    }

    /// Loads the rows of the file at `path` before any process maps it,
    /// so that the walk's own look-up of a new process's mappings finds
    /// them at its first stack (a command's allocations in its first
    /// milliseconds, before user space has read its maps). Returns
    /// whether they are loaded.
    pub fn preload(&mut self, path: &Path) -> bool {
        match self.tables.file(path) {
            Some(t) if !t.table.rows.is_empty() => self.load_file(&t, &[]).is_some(),
            _ => false,
        }
    }

    /// Notes a process the kernel gave its parent's regions at fork, so
    /// that they are forgotten when it exits, and that its parent's files
    /// stay loaded while it lives.
    pub fn adopt(&mut self, child: Proc, parent: u32) {
        let files = self
            .captured
            .get(&parent)
            .map(|(_, f)| f.clone())
            .unwrap_or_default();
        self.captured.insert(child.pid, (child, files));
    }

    /// Removes the regions of process `pid`, which has exited: the pid's
    /// next process must not be walked by them.
    pub fn forget(&mut self, pid: u32) {
        if self.captured.remove(&pid).is_some() {
            let _ = self.procs.remove(&pid);
        }
    }

    /// Removes the regions of processes that have exited, so that a host
    /// where processes come and go never fills the table.
    pub fn forget_exited(&mut self) {
        let gone: Vec<u32> = self
            .captured
            .iter()
            .filter(|(_, (p, _))| !p.alive())
            .map(|(&pid, _)| pid)
            .collect();
        for pid in gone {
            self.captured.remove(&pid);
            let _ = self.procs.remove(&pid);
        }
    }

    /// Copies a file's rows, index and rules into the arrays, once; when
    /// they do not fit, files no live process maps are evicted, least
    /// recently mapped first, but not those in `keep` (the process's own,
    /// loaded a moment ago). `None` if they still do not fit.
    fn load_file(&mut self, file: &Arc<FileTable>, keep: &[usize]) -> Option<FileRows> {
        let key = Arc::as_ptr(file) as usize;
        if let Some(l) = self.loaded.get_mut(&key) {
            l.used = std::time::Instant::now();
            return Some(l.at);
        }
        let t = &file.table;
        let need = Capacity {
            rows: t.rows.len() as u32,
            buckets: t.index.len() as u32,
            rules: t.rules.len() as u32,
        };
        // A file that did not fit is tried again at most once a second:
        // each try may read every process's maps.
        if self
            .files_not_loaded
            .get(&key)
            .is_some_and(|(_, when)| when.elapsed() < std::time::Duration::from_secs(1))
        {
            return None;
        }
        let Some((row_start, index_start, rule_start)) = self.take(&need).or_else(|| {
            self.evict(&need, keep);
            self.take(&need)
        }) else {
            self.files_not_loaded
                .insert(key, (need, std::time::Instant::now()));
            return None;
        };
        let at = FileRows {
            index_base: t.base,
            row_start,
            row_len: need.rows,
            index_start,
            index_len: need.buckets,
            index_shift: t.index_shift,
            rule_start,
        };
        let written = self
            .rows
            .write(row_start as usize, &t.rows)
            .and_then(|()| self.index.write(index_start as usize, &t.index))
            .and_then(|()| self.rules.write(rule_start as usize, &t.rules));
        if written.is_err() {
            // Out of address space for a moment's mapping: the places are
            // given back, and the file is counted and walked as one that
            // did not fit, and tried again later.
            self.give((row_start, index_start, rule_start), &need);
            self.files_not_loaded
                .insert(key, (need, std::time::Instant::now()));
            return None;
        }
        self.files_not_loaded.remove(&key);
        let mut kernel = None;
        if let Some((name, seg_delta)) = file.kernel {
            let region = FileRegion {
                seg_delta,
                rows: at,
            };
            if self.files.insert(name, region, 0).is_err() {
                self.files_unnamed += 1;
            } else {
                kernel = Some(name);
            }
        }
        self.loaded.insert(
            key,
            Loaded {
                at,
                rules: need.rules,
                used: std::time::Instant::now(),
                kernel,
                file: file.stat,
            },
        );
        Some(at)
    }

    /// Takes room for `need` in all three arrays, or in none.
    fn take(&mut self, need: &Capacity) -> Option<(u32, u32, u32)> {
        let rows = self.free_rows.take(need.rows)?;
        let Some(buckets) = self.free_buckets.take(need.buckets) else {
            self.free_rows.give(rows, need.rows);
            return None;
        };
        let Some(rules) = self.free_rules.take(need.rules) else {
            self.free_rows.give(rows, need.rows);
            self.free_buckets.give(buckets, need.buckets);
            return None;
        };
        Some((rows, buckets, rules))
    }

    /// Gives back the places [`Self::take`] took for `need`.
    fn give(&mut self, (rows, buckets, rules): (u32, u32, u32), need: &Capacity) {
        self.free_rows.give(rows, need.rows);
        self.free_buckets.give(buckets, need.buckets);
        self.free_rules.give(rules, need.rules);
    }

    /// Evicts files that no live process maps, least recently mapped
    /// first, until `need` would fit in what is free in all (a free place
    /// holding it whole is not guaranteed), or none is left to evict.
    /// Files in `keep` stay. Processes that exited are forgotten first,
    /// and the processes user space never read (whose regions the kernel
    /// found itself) are seen in `/proc/*/maps`.
    fn evict(&mut self, need: &Capacity, keep: &[usize]) {
        self.forget_exited();
        let mut live: std::collections::HashSet<usize> = keep.iter().copied().collect();
        live.extend(self.captured.values().flat_map(|(_, f)| f).copied());
        let mapped = mapped_files();
        let mut idle: Vec<(std::time::Instant, usize)> = self
            .loaded
            .iter()
            .filter(|(k, l)| !live.contains(k) && !l.file.is_some_and(|f| mapped.contains(&f)))
            .map(|(&k, l)| (l.used, k))
            .collect();
        idle.sort_unstable();
        for (_, key) in idle {
            let fits = self.free_rows.total() >= need.rows
                && self.free_buckets.total() >= need.buckets
                && self.free_rules.total() >= need.rules
                && self
                    .take(need)
                    .map(|places| self.give(places, need))
                    .is_some();
            if fits {
                return;
            }
            let Some(l) = self.loaded.remove(&key) else {
                continue;
            };
            if let Some(name) = l.kernel {
                let _ = self.files.remove(&name);
            }
            self.free_rows.give(l.at.row_start, l.at.row_len);
            self.free_buckets.give(l.at.index_start, l.at.index_len);
            self.free_rules.give(l.at.rule_start, l.rules);
            self.evicted.0 += 1;
            self.evicted.1 += l.at.row_len as usize;
        }
    }

    /// What the arrays hold now.
    fn taken(&self) -> Capacity {
        Capacity {
            rows: self.capacity.rows - self.free_rows.total(),
            buckets: self.capacity.buckets - self.free_buckets.total(),
            rules: self.capacity.rules - self.free_rules.total(),
        }
    }

    /// Files loaded, their rows, and the bytes the kernel holds for them
    /// (rows, index and rules).
    pub fn stats(&self) -> (usize, usize, usize) {
        let taken = self.taken();
        (
            self.loaded.len(),
            taken.rows as usize,
            taken.bytes() as usize,
        )
    }

    /// Files evicted to make room, and their rows.
    pub fn evictions(&self) -> (usize, usize) {
        self.evicted
    }

    /// The arrays' size in bytes.
    pub fn budget(&self) -> u64 {
        self.capacity.bytes()
    }

    /// Where tables were kept between runs, for `-v`: how many were read
    /// from there and how many compiled and written.
    pub fn cache_summary(&self) -> String {
        match &self.tables.cache {
            None => "no table cache (RTRACE_CACHE_DIR is empty, or there is no home directory)"
                .to_owned(),
            Some(c) => {
                let mut s = format!(
                    "{} read from the cache in {}, {} compiled and written",
                    c.read,
                    c.dir().display(),
                    c.written
                );
                if let Some(e) = &c.write_error {
                    s.push_str(&format!(" (cannot write: {e})"));
                }
                s
            }
        }
    }

    /// What could not be unwound from CFI and why, one line each: files
    /// without readable CFI (not those with none at all, such as JIT
    /// code, which the frame counts report) and tables that were full.
    pub fn warnings(&self) -> Vec<Warning> {
        let mut out = Vec::new();
        let broken: Vec<_> = self
            .tables
            .unreadable
            .iter()
            .filter(|(_, e)| !matches!(e, CfiError::NoCfi))
            .collect();
        if let Some((name, why)) = broken.first() {
            out.push(Warning::unwalked(format!(
                "{} file(s) with unreadable CFI were walked by frame pointer, first {name}: {why}",
                broken.len()
            )));
        }
        if self.files_unnamed > 0 {
            out.push(Warning::unwalked(format!(
                "{} file(s) did not fit in map CFI_FILES: their mappings in processes that \
                 user space had not read yet were walked by frame pointer",
                self.files_unnamed
            )));
        }
        if !self.files_not_loaded.is_empty() {
            let need = self
                .files_not_loaded
                .values()
                .fold(Capacity::default(), |a, (n, _)| Capacity {
                    rows: a.rows + n.rows,
                    buckets: a.buckets + n.buckets,
                    rules: a.rules + n.rules,
                });
            let taken = self.taken();
            out.push(Warning::unwalked(format!(
                "{} file(s) with {} rows of CFI did not fit in the CFI tables' budget of {} MiB \
                 ({} rows, {} taken by files live processes map) and were walked by frame \
                 pointer; --cfi-budget {} would have held them",
                self.files_not_loaded.len(),
                need.rows,
                self.capacity.bytes().div_ceil(1 << 20),
                self.capacity.rows,
                taken.rows,
                taken.budget_for(&need, &self.capacity),
            )));
        }
        if self.processes_not_loaded > 0 {
            out.push(Warning::unwalked(format!(
                "{} process(es) did not fit in map CFI_PROCS and were walked by frame pointer",
                self.processes_not_loaded
            )));
        }
        out
    }
}

/// A walked stack: the reference walk the kernel's is tested against,
/// and the walk of the stack copies in perf's DWARF-mode recordings.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Walk {
    /// The pcs, innermost first: the sampled pc, then return addresses.
    pub pcs: Vec<u64>,
    /// Frames unwound by the frame pointer, where no CFI covered the pc.
    pub fp_frames: usize,
}

/// Walks a stack from `regs` over a process's `regions`, reading stack
/// words with `read`, for at most `max` frames.
pub fn walk(
    regions: &[Region],
    mut regs: Regs,
    read: impl Fn(u64) -> Option<u64>,
    max: usize,
) -> Walk {
    let empty = Table::default();
    let mut out = Walk {
        pcs: vec![regs.pc],
        fp_frames: 0,
    };
    while out.pcs.len() < max {
        let region = regions
            .iter()
            .find(|r| r.start <= regs.pc && regs.pc < r.end);
        let (table, file_pc) = match region.and_then(|r| Some((r.table.as_ref()?, r.bias))) {
            Some((t, bias)) => (&t.table, regs.pc.wrapping_sub(bias)),
            None => (&empty, regs.pc),
        };
        match step(table, file_pc, regs, out.pcs.len() > 1, &read) {
            Some(Step::Cfi(next)) => regs = next,
            Some(Step::FramePointer(next)) => {
                out.fp_frames += 1;
                regs = next;
            }
            None => break,
        }
        if regs.pc == 0 {
            break;
        }
        out.pcs.push(regs.pc);
    }
    out
}

/// The registers a walk follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Regs {
    /// The instruction pointer (for callers, the return address).
    pub pc: u64,
    /// The stack pointer.
    pub sp: u64,
    /// The frame pointer.
    pub bp: u64,
    /// rbx, which ld.so's trampolines keep their frame in.
    pub bx: u64,
}

/// How one frame was unwound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// By its call frame information.
    Cfi(Regs),
    /// By the frame pointer, where no CFI covers the address.
    FramePointer(Regs),
}

/// Unwinds one frame: from the registers of a frame whose code is at file
/// address `file_pc`, the caller's registers. `read` reads a stack word.
/// The innermost frame is at its own pc; callers are at a return address,
/// whose call instruction ends there, so their rules are looked up one
/// byte back (`callee` false for the innermost frame).
pub fn step(
    table: &Table,
    file_pc: u64,
    regs: Regs,
    callee: bool,
    read: impl Fn(u64) -> Option<u64>,
) -> Option<Step> {
    let lookup_pc = if callee { file_pc - 1 } else { file_pc };
    let row = table.lookup(lookup_pc).unwrap_or(Row::none(0).rule());
    let cfa = match row.cfa {
        CFA_RSP => regs.sp.checked_add_signed(i64::from(row.cfa_offset))?,
        CFA_RBP => regs.bp.checked_add_signed(i64::from(row.cfa_offset))?,
        CFA_RBX => regs.bx.checked_add_signed(i64::from(row.cfa_offset))?,
        CFA_PLT => {
            let pushed = (file_pc & 15) >= row.cfa_offset as u64;
            regs.sp + 8 + if pushed { 8 } else { 0 }
        }
        // The reference walk keeps no rdi (vfork's return address) and no
        // rax (which tells clone's parent from its child); its tests walk
        // neither.
        CFA_END | CFA_RSP_RA_RDI | CFA_RSP_IN_PARENT => return None,
        _ => {
            // The frame pointer walk: [bp] is the caller's bp, [bp + 8]
            // the return address.
            if regs.bp == 0 {
                return None;
            }
            return Some(Step::FramePointer(Regs {
                pc: read(regs.bp + 8)?,
                sp: regs.bp + 16,
                bp: read(regs.bp)?,
                bx: regs.bx,
            }));
        }
    };
    let saved = |slot: i8, now: u64| match slot {
        0 => Some(now),
        s => read(cfa.checked_add_signed(8 * i64::from(s))?),
    };
    Some(Step::Cfi(Regs {
        pc: read(cfa - 8)?,
        sp: cfa,
        bp: saved(row.rbp_slot, regs.bp)?,
        bx: saved(row.rbx_slot, regs.bx)?,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Walks this thread's own stack from `regs` with compiled CFI, as the
    /// kernel will walk a sampled one.
    fn walk_self(regs: Regs) -> Walk {
        let regions = Tables::default().process(None).unwrap();
        // Reads through the kernel, so that a wrong walk reads an error,
        // not a fault, as the BPF walk will.
        let read = |a: u64| {
            let mut word = 0u64;
            let local = libc::iovec {
                iov_base: (&raw mut word).cast(),
                iov_len: 8,
            };
            let remote = libc::iovec {
                iov_base: a as *mut libc::c_void,
                iov_len: 8,
            };
            // SAFETY: both vectors describe 8 bytes; the kernel checks the
            // remote address.
            let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
            (n == 8).then_some(word)
        };
        walk(&regions, regs, read, 128)
    }

    #[inline(never)]
    fn here() -> Regs {
        let (pc, sp, bp, bx): (u64, u64, u64, u64);
        // SAFETY: reads four registers, touching no memory.
        unsafe {
            std::arch::asm!(
                "lea {pc}, [rip]",
                "mov {sp}, rsp",
                "mov {bp}, rbp",
                "mov {bx}, rbx",
                pc = out(reg) pc,
                sp = out(reg) sp,
                bp = out(reg) bp,
                bx = out(reg) bx,
            );
        }
        Regs { pc, sp, bp, bx }
    }

    #[inline(never)]
    fn leaf_of_three() -> Walk {
        let w = walk_self(std::hint::black_box(here()));
        std::hint::black_box(w.pcs.len());
        w
    }

    #[inline(never)]
    fn middle_of_three() -> Walk {
        let r = leaf_of_three();
        std::hint::black_box(&r);
        r
    }

    #[inline(never)]
    fn top_of_three() -> Walk {
        let r = middle_of_three();
        std::hint::black_box(&r);
        r
    }

    fn names(pcs: &[u64]) -> Vec<String> {
        use blazesym::symbolize::{Input, Symbolizer, source::Process, source::Source};
        let src = Source::Process(Process::new(blazesym::Pid::Slf));
        let sym = Symbolizer::new();
        // Return addresses name the call site one byte back.
        let addrs: Vec<u64> = pcs
            .iter()
            .enumerate()
            .map(|(i, &p)| if i == 0 { p } else { p - 1 })
            .collect();
        sym.symbolize(&src, Input::AbsAddr(&addrs))
            .unwrap()
            .into_iter()
            .map(|s| s.as_sym().map(|s| s.name.to_string()).unwrap_or_default())
            .collect()
    }

    #[test]
    fn a_mapping_takes_the_bias_of_the_segment_it_holds_most_of() {
        // A Rust executable's layout: the text segment starts 0x190 into
        // the page that the read-only segment ends in, and one page later
        // in memory than in the file.
        let file = FileTable {
            table: Table::default(),
            segments: vec![(0, 0x90190, 0), (0x90190, 0x19d480, 0x91190)],
            kernel: None,
            stat: None,
        };
        let start = 0x55d6_488d_7000;
        let bias = file.bias(start, 0x90000, 0x19e000).unwrap();
        // The text's first byte, at file offset 0x90190, is at vaddr
        // 0x91190.
        assert_eq!(start + 0x190 - bias, 0x91190);
        assert_eq!(file.bias(start, 0x400000, 0x1000), None);
    }

    /// The kernel names a mapped file in `/proc/PID/maps` as the walk
    /// reads it (`s_dev`, `i_ino`); `stat` through the mapping must give
    /// the same name, and the executable segment the same bias as the
    /// segment a mapping holds most of.
    #[test]
    fn mapped_files_are_named_and_biased_as_the_kernel_finds_them() {
        use std::os::unix::fs::MetadataExt as _;
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let mut checked = 0;
        for line in maps.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let Some(m) = procmaps::Mapping::parse(line) else {
                continue;
            };
            if !m.exec || m.inode == 0 || !m.name.starts_with('/') {
                continue;
            }
            let (major, minor) = fields[3].split_once(':').unwrap();
            let dev = (u32::from_str_radix(major, 16).unwrap() << 20)
                | u32::from_str_radix(minor, 16).unwrap();
            let path = format!("/proc/self/map_files/{}", m.range());
            let meta = std::fs::metadata(&path).unwrap();
            let key = file_key(meta.dev(), meta.ino());
            assert_eq!((key.dev, key.ino), (dev, m.inode), "{line}");
            let data = std::fs::read(&path).unwrap();
            let segments = segments(&data);
            let Some(delta) = segments.exec_delta else {
                continue;
            };
            let file = FileTable {
                table: Table::default(),
                segments: segments.ranges,
                kernel: None,
                stat: None,
            };
            let bias = file.bias(m.start, m.offset, m.end - m.start).unwrap();
            assert_eq!(
                bias,
                m.start.wrapping_sub(m.offset).wrapping_add(delta),
                "{line}"
            );
            checked += 1;
        }
        assert!(checked >= 2, "{maps}");
    }

    #[test]
    fn free_places_are_taken_first_fit_and_merged_when_given_back() {
        let mut free = Free::new(100);
        let a = free.take(30).unwrap();
        let b = free.take(30).unwrap();
        let c = free.take(30).unwrap();
        assert_eq!((a, b, c), (0, 30, 60));
        assert_eq!(free.take(20), None);
        assert_eq!(free.take(0), Some(0));
        free.give(b, 30);
        assert_eq!(free.total(), 40);
        // The hole b left is taken before the tail.
        assert_eq!(free.take(25), Some(30));
        free.give(30, 25);
        free.give(a, 30);
        free.give(c, 30);
        // Given back, every place merged into one again.
        assert_eq!(free.0, vec![(0, 100)]);
        assert_eq!(free.take(100), Some(0));
    }

    #[test]
    fn a_budget_holds_seven_bytes_a_row_in_pairs() {
        let c = Capacity::of_budget(32 << 20);
        assert_eq!(c.rows % 2, 0);
        assert!(c.bytes() <= 32 << 20 && c.bytes() > 31 << 20, "{c:?}");
        assert!(c.buckets >= c.rows / 4 && c.rules >= 1 << 16, "{c:?}");
        // Half of a 2 MiB budget taken: another 1 MiB of rows wants 3 MiB.
        let two = Capacity::of_budget(2 << 20);
        let half = Capacity {
            rows: two.rows / 2,
            buckets: two.buckets / 2,
            rules: two.rules / 2,
        };
        assert_eq!(half.budget_for(&half, &two), 2);
        let more = Capacity {
            rows: two.rows,
            ..half
        };
        assert_eq!(half.budget_for(&more, &two), 3);
    }

    #[test]
    fn kernel_device_numbers_are_major_shifted_by_20() {
        for (major, minor) in [(8, 1), (259, 300), (0, 27), (4095, 0xfffff)] {
            let key = file_key(libc::makedev(major, minor), 1);
            assert_eq!(key.dev, (major << 20) | minor, "{major}:{minor}");
        }
    }

    #[test]
    fn the_vdso_has_one_table_for_every_process() {
        let mut tables = Tables::default();
        let vdso = |regions: Vec<Region>| {
            regions
                .into_iter()
                .find(|r| r.name == "[vdso]")
                .and_then(|r| Some((r.start, r.bias, r.table?)))
                .unwrap()
        };
        let (start, bias, mine) = vdso(tables.process(None).unwrap());
        // Its image starts at address 0, where it is mapped.
        assert_eq!(bias, start);
        assert!(
            mine.table.rules.iter().any(|r| r.cfa == CFA_RSP),
            "{:?}",
            mine.table.rules
        );
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(100));
        let (_, _, theirs) = vdso(tables.process(Some(child.id())).unwrap());
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(Arc::ptr_eq(&mine, &theirs));
    }

    #[test]
    fn a_library_shared_by_processes_has_one_table() {
        let mut tables = Tables::default();
        let mine = tables.process(None).unwrap();
        let (files, rows, bytes) = tables.stats();
        assert!(files >= 2 && rows > 10_000 && bytes == rows * 4);
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        // Until exec replaces the forked copy, the child maps this test.
        std::thread::sleep(std::time::Duration::from_millis(100));
        let theirs = tables.process(Some(child.id())).unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        let libc = |regions: &[Region]| {
            regions
                .iter()
                .find(|r| r.name.contains("/libc.so"))
                .and_then(|r| r.table.clone())
                .unwrap()
        };
        assert!(Arc::ptr_eq(&libc(&mine), &libc(&theirs)));
        assert_eq!(
            tables.stats().0,
            files + 1,
            "sleep's own file is the one new"
        );
    }

    /// This test binary is built without frame pointers (release Rust), and
    /// libtest runs it on a thread libc started, so a whole walk crosses
    /// Rust code and libc without frame pointers, and must end where the
    /// thread began.
    #[test]
    fn own_stack_unwinds_through_code_without_frame_pointers() {
        let w = top_of_three();
        let names = names(&w.pcs);
        let pos = |n: &str| {
            names
                .iter()
                .position(|s| s.contains(n))
                .unwrap_or_else(|| panic!("no {n} in {names:?}"))
        };
        let (leaf, middle, top) = (
            pos("leaf_of_three"),
            pos("middle_of_three"),
            pos("top_of_three"),
        );
        assert!(leaf < middle && middle < top, "{names:?}");
        // The thread's start: libc's start_thread, then clone3.
        let start = pos("start_thread");
        assert!(start > top, "{names:?}");
        assert!(
            names[start..].iter().any(|n| n.contains("clone")),
            "{names:?}"
        );
        assert_eq!(w.fp_frames, 0, "frames walked by frame pointer: {names:?}");
    }
}

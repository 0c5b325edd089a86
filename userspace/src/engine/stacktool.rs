//! What a tool that counts stacks in the kernel (profile, offcputime)
//! shares: the user-stack walk it loads (`--unwind`), the CFI tables and
//! the exec and fork programs that keep them in step with the processes,
//! the stack store and the symbolizer, and the events that tie them
//! together. A tool adds only its own programs and its own output.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use aya::{
    Ebpf,
    maps::{HashMap as BpfHashMap, MapData},
    programs::{
        RawTracePoint,
        raw_trace_point::RawTracePointLink,
        uprobe::{UProbeLink, UProbeScope},
    },
};
use rtrace_common::{
    offcputime::Interval,
    profile::{SEEN_EXEC, SEEN_EXIT, SEEN_FORK, SEEN_NEW_CODE, Seen, TimedSample},
    python::{MAX_PY_PROCS, PyCode, PyProc},
    stacks::{
        BORN_OFFSETS, BornOffsets, Found, SEEN_FOUND, SEEN_PY_CODE, SeenHeader, Stack, UntoldStack,
    },
    unwind::CfiOffsets,
};

use crate::kernel::{
    procmaps::{MapsOnce, Proc},
    warning::Warning,
};
use crate::{
    kernel::load::{Detaching, Kernel, Load},
    output::events,
    stacks::{
        sample::{Sample, Timed},
        stackstore::{Sent, StackStore},
        symbolize::{Frame, Symbolizer},
        unwind::{Capacity, KernelTables},
    },
};

/// `--unwind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Unwind {
    /// CFI where the kernel can load the walk (5.15+), else frame pointers.
    Auto,
    /// CFI only: fail where the kernel cannot load the walk.
    Cfi,
    /// Frame pointers only (the kernel's own walk).
    Fp,
}

/// The flags every stack-counting tool has.
#[derive(Debug, clap::Args)]
pub struct StackArgs {
    /// Distinct stacks to keep; stacks beyond it are counted as missed.
    #[arg(long, value_name = "N", default_value_t = 16384,
          value_parser = crate::output::at_least_one::<u32>)]
    pub stack_storage_size: u32,
    /// Distinct (process, stacks) entries to count; counts beyond it are
    /// counted as lost.
    #[arg(long, value_name = "N", default_value_t = 40960,
          value_parser = crate::output::at_least_one::<u32>)]
    pub hash_storage_size: u32,
    /// How user stacks are walked: `cfi` in the kernel from each file's
    /// call frame information (code without frame pointers too), `fp` by
    /// frame pointers, `auto` the first where the kernel can load it.
    /// Compiled CFI is kept in ~/.cache/rtrace/cfi, or $RTRACE_CACHE_DIR
    /// (empty: not kept).
    #[arg(long, value_enum, default_value_t = Unwind::Auto)]
    pub unwind: Unwind,
    /// Memory for the CFI walk's tables in the kernel, in MiB, allocated
    /// when the walk is loaded: 7 bytes a row of CFI (libc has some
    /// 30000 rows, rustc's driver some 500000). When a new file does not
    /// fit, files that no live process maps are evicted, least recently
    /// mapped first; a file that still does not fit is walked by frame
    /// pointer and named in a warning with the budget that would hold it.
    #[arg(long, value_name = "MB", default_value_t = 32,
          value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub cfi_budget: u32,
    /// Most frames the CFI walk keeps of a user stack, up to 1000 (perf's
    /// name; 127 by default, as the kernel's `perf_event_max_stack`). A
    /// deeper stack keeps its leaf-most frames, counted in a warning. A
    /// Python, Java or JavaScript frame counts once, though it takes two
    /// of the 1000 slots a stack has. The kernel's own walks (kernel
    /// stacks, `--unwind fp`) keep 127.
    #[arg(long, value_name = "N", default_value_t = rtrace_common::stacks::MAX_DEPTH as u32,
          value_parser = clap::value_parser!(u32).range(1..=rtrace_common::stacks::MAX_STACK as i64))]
    pub max_stack: u32,
    /// Give each frame its source file and line (`main.c:12`), from the
    /// debug information, in every output; inlined functions keep lines
    /// of their own.
    #[arg(long)]
    pub lines: bool,
    /// Keep the linker's names (`_ZN4core3fmt5write17h..E`,
    /// `camlHot__tower_91`) instead of demangling them as perf does (Rust,
    /// C++ and OCaml: `core::fmt::write`, `Hot.tower_91`).
    #[arg(long)]
    pub no_demangle: bool,
    /// Name each frame with its offset in its function (`vfs_read+0x1a`),
    /// so that calls from different places stay apart (bcc's -s).
    #[arg(long)]
    pub offsets: bool,
    /// Show each frame's address before its name (bcc's -v).
    #[arg(long)]
    pub addresses: bool,
    /// Do not walk CPython's frames: a Python process's stacks show the
    /// interpreter's C functions only. By default every process running
    /// CPython 3.10 to 3.14 has its Python functions in its stacks, in
    /// place of the interpreter's loop that ran them (with the CFI walk).
    #[arg(long)]
    pub no_python: bool,
    /// Do not walk the JVM's frames: a Java process's compiled and
    /// interpreted frames are then named only by a perf map, if it writes
    /// one. By default every process running HotSpot (OpenJDK 17 to 25)
    /// has its Java methods in its stacks, inlined ones too, read from
    /// the JVM's own tables with no flag and no agent (with the CFI walk).
    #[arg(long)]
    pub no_java: bool,
    /// Do not walk V8's frames: a Node.js process's JavaScript functions
    /// are then named only by a perf map, if it writes one
    /// (`--perf-basic-prof`). By default every process running V8 with
    /// its postmortem metadata (Node.js 18 to 24) has its JavaScript
    /// functions in its stacks, read from V8's own objects with no flag
    /// (with the CFI walk).
    #[arg(long)]
    pub no_javascript: bool,
    /// Do not show asyncio tasks: by default a Python 3.14 process that
    /// runs asyncio has the running task's name as a frame above the
    /// coroutines it runs (`[task: NAME]`), which costs its samples one
    /// more read of its memory, three while a task runs.
    #[arg(long)]
    pub no_asyncio_tasks: bool,
    /// After the run, wait up to SECONDS for the processes whose JIT
    /// frames are still unnamed to exit, and name those frames from the
    /// perf maps they write as they exit (Mono's `--jitmap`, the JVM's
    /// agents): for `-p` on a program that outlives the run, as `perf
    /// record -p` and a later `perf report` have it. Ctrl-C stops the wait.
    #[arg(long, value_name = "SECONDS")]
    pub wait_exit: Option<u64>,
    #[command(flatten)]
    pub transforms: crate::output::stacks::transform::TransformArgs,
}

impl Default for StackArgs {
    /// The flags' defaults, as the stack tools take them.
    fn default() -> Self {
        Self {
            hash_storage_size: 40960,
            offsets: false,
            ..walk_args()
        }
    }
}

/// The walk's settings for a tool that walks a stack an event (strace's
/// `-k`, trace's `-U`): the defaults of the stack tools' flags, frames
/// named with their offsets as strace and bcc name them.
pub fn walk_args() -> StackArgs {
    StackArgs {
        stack_storage_size: 16384,
        hash_storage_size: 1,
        unwind: Unwind::Auto,
        cfi_budget: 32,
        max_stack: rtrace_common::stacks::MAX_DEPTH as u32,
        lines: false,
        no_demangle: false,
        offsets: true,
        addresses: false,
        no_python: false,
        no_java: false,
        no_javascript: false,
        no_asyncio_tasks: false,
        wait_exit: None,
        transforms: Default::default(),
    }
}

/// The object variant with the CFI walk.
pub use crate::kernel::load::{CFI, CFI_GLOBAL};
/// Processes whose regions the kernel holds, and the processes whose
/// regions it found itself.
const CFI_PROCESSES: u32 = 4096;
/// Files whose mappings the kernel can find the rows of itself: more than
/// the rows array holds files of any size.
const CFI_FILES: u32 = 16384;

/// Whether the CFI walk may look up mappings itself: the kernel has
/// `bpf_find_vma` (its BTF numbers the helper), and `RTRACE_NO_FIND_VMA`
/// does not ask to do without it, as kernels before 5.17 must (the tests
/// run the walk so in every guest).
fn find_vma(btf: &crate::kernel::btf::Btf) -> bool {
    std::env::var_os("RTRACE_NO_FIND_VMA").is_none_or(|v| v.is_empty())
        && btf.enum_value("BPF_FUNC_find_vma").is_some()
}

/// See the module documentation.
#[derive(Default)]
pub struct StackTool {
    /// Names the frames.
    sym: Symbolizer,
    /// Counts and stacks moved out of the kernel so far.
    store: StackStore,
    /// The kernel's CFI tables, with the `cfi` object.
    cfi: Option<KernelTables>,
    /// Whether the `cfi` object was loaded.
    cfi_loaded: bool,
    /// Whether a variant with the CFI walk was tried in this attach
    /// chain: kept across attempts, unlike what each attempt sets up.
    cfi_tried: bool,
    /// Whether the variant in use lost the CFI walk to the kernel's
    /// refusal of one tried before it (`--unwind auto`), so that the run
    /// says so: `-v` alone would leave stacks cut short unexplained.
    cfi_lost: bool,
    /// What its tables hold (`--cfi-budget`).
    cfi_capacity: Capacity,
    /// Whether the walk looks up mappings itself ([`find_vma`]).
    cfi_find_vma: bool,
    /// The exec, fork and exit programs' links, owned so that they can be
    /// detached on a thread of their own; with the `cfi` object.
    links: Option<(RawTracePointLink, RawTracePointLink, RawTracePointLink)>,
    /// The loader hook's link, or why there is none ([`LOADER`]).
    loader: Option<Result<UProbeLink, String>>,
    /// Whether the loader hook waits for [`StackTool::attach_later`].
    loader_later: bool,
    /// When counting began, and as seconds since the epoch.
    started: Option<(Instant, f64)>,
    /// When the report began (`finish`).
    report_start: Option<Instant>,
    /// What the report took, for `-v`.
    report: Option<String>,
    /// The kernel's `TIMED_JIT`, taken at attach so that a process is
    /// put there as soon as its jitdump is found.
    timed_map: Option<BpfHashMap<MapData, u32, u8>>,
    /// Processes in the kernel's `TIMED_JIT`.
    marked: HashSet<Proc>,
    /// Processes that `TIMED_JIT` had no room for: their JIT frames are
    /// named by the newest code at each address, not by time slot.
    unmarked: HashSet<Proc>,
    /// `--hide`, `--collapse`, `--collapse-recursion`.
    transforms: crate::output::stacks::transform::TransformArgs,
    /// See [`StackArgs::wait_exit`].
    wait_exit: Option<u64>,
    /// Processes that ran a new program and have not been captured since.
    execed: HashSet<Proc>,
    /// The newest process the kernel told of at each pid, for stacks
    /// that come with a pid alone (a syscall's, a probe's).
    newest: HashMap<u32, Proc>,
    /// For stacks walked one event at a time ([`StackTool::take_stacks`]):
    /// the kernel's table of them, and those read from it by hash, as a
    /// thread's walk may name one again by its hash alone.
    walked: Option<Walked>,
    /// The kernel's table of Python processes, with the `cfi` object.
    py_map: Option<BpfHashMap<MapData, u32, PyProc>>,
    /// Python processes the table had no room for.
    py_full: u64,
    /// The kernel's table of JVM processes, with the `cfi` object.
    java_map: Option<BpfHashMap<MapData, u32, rtrace_common::java::JavaProc>>,
    /// JVM processes the table had no room for.
    java_full: u64,
    /// The kernel's table of V8 processes, with the `cfi` object.
    v8_map: Option<BpfHashMap<MapData, u32, rtrace_common::v8::V8Proc>>,
    /// V8 processes the table had no room for.
    v8_full: u64,
    /// The runtimes whose processes the kernel's tables were given
    /// (`rtrace_common::unwind::Runtimes`): the walk must step through
    /// their frames.
    runtimes: rtrace_common::unwind::Runtimes,
    /// The runtimes whose frames the run may walk: all but those turned
    /// off (`--no-python`, `--no-java`, `--no-javascript`).
    walkable: rtrace_common::unwind::Runtimes,
    /// rtrace's own tables, being compiled beside the programs' load
    /// ([`StackTool::prepare_self`]).
    self_tables: Option<std::thread::JoinHandle<crate::stacks::unwind::Tables>>,
    /// When the runtimes found starting were last looked at again
    /// ([`StackTool::look_again`]).
    looked_again: Option<Instant>,
    /// A second handle on the kernel's stack table, with the `cfi`
    /// object: the stacks whose walk met more runtime frames than it told
    /// of are read from it as they are told of ([`UntoldStack`]).
    peek: Option<BpfHashMap<MapData, u64, Stack>>,
    /// The stacks whose runtime frames were named whole, by process: a
    /// stack told of again (its frames new to another CPU) is not read
    /// again.
    untold_named: HashSet<(Proc, u64)>,
}

/// How often the runtimes found not started are looked at again: each
/// look reads the process's mappings (and a JVM's tables, or a word of
/// Python's runtime).
const LOOK_AGAIN_EVERY: Duration = Duration::from_millis(100);

/// The kernel's table of stored stacks, by hash, and the stacks read
/// from it.
type Walked = (BpfHashMap<MapData, u64, Stack>, HashMap<u64, Arc<[u64]>>);

/// The frames of the stack stored as `hash` in the kernel's table `map`,
/// its entries joined; `None` if it is not there.
fn read_stack(map: &BpfHashMap<MapData, u64, Stack>, hash: u64) -> Option<Vec<u64>> {
    let mut ips = Vec::new();
    let mut next = Some(hash);
    for _ in 0..rtrace_common::stacks::MAX_SEGMENTS {
        let Some(h) = next else { break };
        let entry = map.get(&h, 0).ok()?;
        let (frames, link) = entry.frames();
        ips.extend_from_slice(frames);
        next = link;
    }
    Some(ips)
}

/// A handle of its own on the stack table `map` (a plain hash map), which
/// stays with the object: its entries read from both. A copy of its
/// descriptor, not one got by the map's id, which takes CAP_SYS_ADMIN.
fn second_handle(map: &aya::maps::Map) -> anyhow::Result<BpfHashMap<MapData, u64, Stack>> {
    use std::os::fd::AsFd as _;
    let aya::maps::Map::HashMap(data) = map else {
        anyhow::bail!("the stack table is no hash map");
    };
    let fd = data.fd().as_fd().try_clone_to_owned()?;
    Ok(BpfHashMap::try_from(aya::maps::Map::HashMap(
        MapData::from_fd(fd)?,
    ))?)
}

impl StackTool {
    /// A tool whose kernel side counts by `WakeKey` (`wakers`), not `Key`.
    pub fn new(wakers: bool) -> Self {
        Self {
            store: StackStore::new(wakers),
            ..Self::default()
        }
    }

    /// The object variants to try for `unwind`, best first; without user
    /// stacks no walk is needed.
    ///
    /// The walk as a global function (`cfi_global`) first where the
    /// kernel is 6.13 or later: elsewhere its deeper chain of calls is
    /// refused, after the whole verification.
    pub fn variants(unwind: Unwind, user: bool) -> Vec<&'static str> {
        let walks: &[&'static str] = if crate::kernel::features::kernel_at_least(6, 13) {
            &[CFI_GLOBAL, CFI]
        } else {
            &[CFI]
        };
        match unwind {
            Unwind::Auto if user => walks.iter().copied().chain([""]).collect(),
            Unwind::Cfi => walks.to_vec(),
            _ => vec![""],
        }
    }

    /// Sizes the stack tables and, with the CFI walk, hands it the
    /// kernel's register and task offsets.
    pub fn configure(
        &mut self,
        args: &StackArgs,
        kernel: &mut Kernel,
        load: &mut Load,
    ) -> anyhow::Result<()> {
        // What an attempt with another variant attached is let go: its
        // tables' maps and its programs' links belong to an object that
        // failed to load or attach.
        self.cfi = None;
        self.links = None;
        self.loader = None;
        self.timed_map = None;
        self.marked.clear();
        self.unmarked.clear();
        self.cfi_loaded = crate::kernel::load::walks_cfi(load.variant());
        // The last attempt configured is the one in use: a CFI variant
        // refused under one mechanism and loaded under the next is no loss.
        self.cfi_tried |= self.cfi_loaded;
        self.cfi_lost = self.cfi_tried && !self.cfi_loaded;
        self.cfi_capacity = Capacity::of_budget(u64::from(args.cfi_budget) << 20);
        if self.cfi_loaded {
            let btf = kernel.btf()?;
            self.cfi_find_vma = find_vma(btf);
            let reg = |m: &str| btf.offset("pt_regs", m);
            let offsets = CfiOffsets {
                ip: reg("ip")?,
                sp: reg("sp")?,
                bp: reg("bp")?,
                di: reg("di")?,
                ax: reg("ax")?,
                bx: reg("bx")?,
                r13: reg("r13")?,
                cs: reg("cs")?,
                task_fsbase: btf.offset("task_struct", "thread")?
                    + btf.offset("thread_struct", "fsbase")?,
                task_pid: btf.offset("task_struct", "pid")?,
                task_tgid: btf.offset("task_struct", "tgid")?,
                task_mm: btf.offset("task_struct", "mm")?,
                mm_start_code: btf.offset("mm_struct", "start_code")?,
                // In anonymous unions since 6.1 and 6.3; found through them.
                vma_start: btf.offset("vm_area_struct", "vm_start")?,
                vma_end: btf.offset("vm_area_struct", "vm_end")?,
                vma_pgoff: btf.offset("vm_area_struct", "vm_pgoff")?,
                vma_flags: btf.offset("vm_area_struct", "vm_flags")?,
                vma_file: btf.offset("vm_area_struct", "vm_file")?,
                file_inode: btf.offset("file", "f_inode")?,
                inode_ino: btf.offset("inode", "i_ino")?,
                inode_sb: btf.offset("inode", "i_sb")?,
                sb_dev: btf.offset("super_block", "s_dev")?,
                find_vma: u32::from(self.cfi_find_vma),
            };
            // The walks remembered per thread are in task storage, for
            // which aya has no user-space type: only the programs use it.
            load.allow_unsupported_maps();
            let budget = format!(
                "the CFI walk's tables take --cfi-budget, {} MiB of kernel memory here: a \
                 smaller budget fits where a memory cgroup or RLIMIT_MEMLOCK allows less",
                args.cfi_budget
            );
            for table in [
                rtrace_common::unwind::CFI_ROWS,
                rtrace_common::unwind::CFI_INDEX,
                rtrace_common::unwind::CFI_RULES,
            ] {
                load.hint(table, budget.clone());
            }
            load.global(rtrace_common::unwind::CFI_OFFSETS, &offsets)
                .size(rtrace_common::unwind::CFI_ROWS, self.cfi_capacity.rows / 2)
                .size(rtrace_common::unwind::CFI_INDEX, self.cfi_capacity.buckets)
                .size(rtrace_common::unwind::CFI_RULES, self.cfi_capacity.rules)
                .size(rtrace_common::unwind::CFI_PROCS, CFI_PROCESSES)
                .size(rtrace_common::unwind::CFI_FILES, CFI_FILES)
                .size(rtrace_common::unwind::CFI_FOUND, CFI_PROCESSES)
                .size(rtrace_common::python::PY_PROCS, MAX_PY_PROCS)
                .size(
                    rtrace_common::java::JAVA_PROCS,
                    rtrace_common::java::MAX_JAVA_PROCS,
                )
                .size(rtrace_common::v8::V8_PROCS, rtrace_common::v8::MAX_V8_PROCS);
            let cpus = crate::kernel::load::possible_cpus()?;
            for (table, slots) in rtrace_common::unwind::CPU_TABLES {
                load.size(table, slots * cpus);
            }
        }
        self.walkable = [
            (args.no_python, rtrace_common::unwind::RUNTIME_PYTHON),
            (args.no_java, rtrace_common::unwind::RUNTIME_JAVA),
            (args.no_javascript, rtrace_common::unwind::RUNTIME_V8),
        ]
        .into_iter()
        .filter(|&(off, _)| !off)
        .fold(0, |all, (_, bit)| all | bit);
        self.sym
            .java()
            .configure(self.cfi_loaded && !args.no_java, args.lines);
        self.sym
            .v8()
            .configure(self.cfi_loaded && !args.no_javascript, args.lines);
        self.sym.python().configure(
            self.cfi_loaded && !args.no_python,
            args.lines,
            !args.no_asyncio_tasks,
        );
        let one_entry = rtrace_common::stacks::MAX_DEPTH as u32;
        if self.cfi_loaded {
            load.global(rtrace_common::unwind::MAX_STACK_DEPTH, &args.max_stack);
        } else if args.max_stack > one_entry {
            Warning::unsupported(format!(
                "--max-stack {} needs the CFI walk (kernel 5.17+, not --unwind fp): the \
                     kernel's frame-pointer walk keeps {one_entry} frames",
                args.max_stack
            ))
            .print();
        }
        self.transforms = args.transforms.clone();
        self.wait_exit = args.wait_exit;
        self.sym.with_lines(args.lines);
        self.sym.with_demangling(!args.no_demangle);
        self.sym.with_places(crate::stacks::symbolize::Places {
            offsets: args.offsets,
            addresses: args.addresses,
        });
        // Who each process is: its start time, read where its stacks are
        // counted. A kernel without `start_boottime` (before 5.5) has
        // every start unknown, and processes are their pids.
        let btf = kernel.btf()?;
        let born = match (
            btf.offset("task_struct", "group_leader"),
            btf.offset("task_struct", "start_boottime"),
        ) {
            (Ok(group_leader), Ok(start_boottime)) => BornOffsets {
                group_leader,
                start_boottime,
            },
            _ => BornOffsets::default(),
        };
        load.global(BORN_OFFSETS, &born)
            .size(rtrace_common::stacks::STACKS, args.stack_storage_size)
            .size(rtrace_common::stacks::STACK_COUNTS, args.hash_storage_size);
        self.store
            .size(args.stack_storage_size, args.hash_storage_size);
        Ok(())
    }

    /// Captures the mappings of the processes asked for (`pids`; others
    /// when their first stacks show up), so that one which exits soon is
    /// symbolized all the same; with the CFI walk, builds their tables and
    /// attaches the exec and fork programs.
    pub fn attach(&mut self, ebpf: &mut Ebpf, pids: &[u32]) -> anyhow::Result<()> {
        // Only objects that count stacks by time slot have it.
        if let Some(map) = ebpf.take_map(rtrace_common::stacks::TIMED_JIT) {
            self.timed_map = Some(BpfHashMap::try_from(map)?);
        }
        // The walk's regions before the symbolizer's capture, as in
        // `event`.
        if self.cfi_loaded {
            let mut tables = KernelTables::new(ebpf, self.cfi_capacity)?;
            for &pid in pids {
                tables.add_process(Proc::now(pid), true)?;
            }
            self.cfi = Some(tables);
        }
        for &pid in pids {
            self.sym.capture(Proc::now(pid), true);
        }
        self.mark_timed();
        if !self.cfi_loaded {
            return Ok(());
        }
        self.py_map = Some(BpfHashMap::try_from(crate::kernel::load::take_map(
            ebpf,
            rtrace_common::python::PY_PROCS,
        )?)?);
        self.java_map = Some(BpfHashMap::try_from(crate::kernel::load::take_map(
            ebpf,
            rtrace_common::java::JAVA_PROCS,
        )?)?);
        self.v8_map = Some(BpfHashMap::try_from(crate::kernel::load::take_map(
            ebpf,
            rtrace_common::v8::V8_PROCS,
        )?)?);
        self.peek = Some(second_handle(crate::kernel::load::map(
            ebpf,
            rtrace_common::stacks::STACKS,
        )?)?);
        for &pid in pids {
            let maps = MapsOnce::new(Proc::now(pid));
            self.examine_python(&maps, false);
            self.examine_java(&maps, false);
            self.examine_v8(&maps, false);
        }
        // The walk tells when a process runs code in no known mapping.
        self.sym.recapture_every(Duration::from_secs(5));
        self.links = Some((
            attach_raw(ebpf, rtrace_common::unwind::PROG_EXEC, "sched_process_exec")?,
            attach_raw(ebpf, rtrace_common::unwind::PROG_FORK, "sched_process_fork")?,
            attach_raw(ebpf, rtrace_common::unwind::PROG_EXIT, "sched_process_exit")?,
        ));
        if !self.loader_later {
            self.loader = Some(attach_loader(ebpf).map_err(|e| format!("{e:#}")));
        }
        Ok(())
    }

    /// The programs [`StackTool::attach`] attaches to exec, fork and exit,
    /// for loading beside others (`kernel::load::load_beside`): none
    /// without the CFI walk.
    pub fn process_programs(&self) -> &'static [&'static str] {
        if self.cfi_loaded {
            &[
                rtrace_common::unwind::PROG_EXEC,
                rtrace_common::unwind::PROG_FORK,
                rtrace_common::unwind::PROG_EXIT,
            ]
        } else {
            &[]
        }
    }

    /// Begins compiling rtrace's own tables now, on a thread of their own,
    /// for a run where rtrace is sampled too (over the whole system): they
    /// are loaded by [`StackTool::absorb_self`], so that its own first
    /// stacks neither go by frame pointer nor hold up, while its large
    /// table is compiled, the tables of the processes that start after.
    pub fn prepare_self(&mut self) {
        if !self.cfi_loaded {
            // A variant without the walk: nothing to wait for.
            self.self_tables = None;
        } else if self.self_tables.is_none() {
            self.self_tables = crate::stacks::unwind::Tables::compile_self_beside();
        }
    }

    /// Loads the tables [`StackTool::prepare_self`] compiled into the
    /// walk's, for rtrace's own process, waiting for them if need be:
    /// called once the programs are loaded (the verifier's work, which the
    /// compile ran beside) and before sampling starts.
    pub fn absorb_self(&mut self) -> anyhow::Result<()> {
        let (Some(cfi), Some(handle)) = (&mut self.cfi, self.self_tables.take()) else {
            return Ok(());
        };
        // A compile that panicked leaves rtrace's tables to its first
        // sample, as for any process.
        if let Ok(mine) = handle.join() {
            cfi.absorb(mine);
            cfi.add_process(Proc::now(std::process::id()), false)?;
        }
        Ok(())
    }

    /// Leaves the loader hook to [`StackTool::attach_later`], after the
    /// tool's own events are attached: a uprobe on ld.so is set in every
    /// process that maps it (most of them), about 13 ms here, and a run
    /// of processes already running (system-wide, `-p`) needs it only for
    /// the programs started later.
    pub fn hook_loader_later(&mut self) {
        self.loader_later = true;
    }

    /// Attaches what [`StackTool::attach`] left for later: the loader
    /// hook, once.
    pub fn attach_later(&mut self, ebpf: &mut Ebpf) {
        if self.loader_later && self.loader.is_none() && self.links.is_some() {
            self.loader = Some(attach_loader(ebpf).map_err(|e| format!("{e:#}")));
        }
    }

    /// Loads the CFI of `files` into the walk's tables before any process
    /// maps them (a command's program and its allocator, say), so that a
    /// process's first stacks, walked before user space has read its
    /// maps, are whole. Returns how many were loaded.
    pub fn preload(&mut self, files: &[&std::path::Path]) -> usize {
        for f in files {
            self.sym.know_file(f);
        }
        let Some(cfi) = &mut self.cfi else {
            return 0;
        };
        files.iter().filter(|f| cfi.preload(f)).count()
    }

    /// Loads the walk's tables and captures the symbols of every process
    /// running now, rather than at each one's first sample: for events
    /// that come rarely (a tracepoint), whose first in a process would
    /// otherwise be walked without its tables. Returns how many.
    pub fn preload_all(&mut self) -> anyhow::Result<usize> {
        let pids: Vec<u32> = std::fs::read_dir("/proc")
            .context("cannot list /proc")?
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .filter(|&p| p != std::process::id())
            .collect();
        if let Some(tables) = &mut self.cfi {
            for &pid in &pids {
                tables.add_process(Proc::now(pid), true)?;
            }
        }
        for &pid in &pids {
            let p = Proc::now(pid);
            self.sym.capture(p, true);
            self.examine_python(&MapsOnce::new(p), false);
        }
        Ok(pids.len())
    }

    /// Loads the walk's tables for rtrace's own process now, where it is
    /// in scope, before work that blocks the loop reading the kernel's
    /// requests for tables (loading a program): its stacks meanwhile
    /// would otherwise go by frame pointer through code built without
    /// them, and be cut short.
    pub fn walk_self(&mut self) -> anyhow::Result<()> {
        let me = Proc::now(std::process::id());
        if let Some(tables) = &mut self.cfi {
            tables.add_process(me, false)?;
        }
        Ok(())
    }

    /// Names the frames of stacks walked one at a time (a syscall's, a
    /// probe's), each leaf first, `None` for a kernel stack's process.
    pub fn symbolize(&mut self, stacks: &[(Option<u32>, &[u64])]) -> Vec<Vec<Frame>> {
        let stacks: Vec<(Option<Proc>, &[u64])> = stacks
            .iter()
            .map(|&(pid, ips)| (pid.map(|p| self.newest(p)), ips))
            .collect();
        for p in stacks.iter().filter_map(|(p, _)| *p) {
            self.sym.capture(p, false);
        }
        self.sym.symbolize(&stacks)
    }

    /// The newest process the kernel told of at `pid`; its start unknown
    /// if none was told of.
    fn newest(&self, pid: u32) -> Proc {
        self.newest.get(&pid).copied().unwrap_or(Proc::new(pid, 0))
    }

    /// Takes the kernel's stack table, for a tool whose events name
    /// stacks by hash one at a time (strace's `-k`, trace's `-U`) rather
    /// than counting them: they are read with [`StackTool::walked`], and
    /// never moved out.
    pub fn take_stacks(&mut self, ebpf: &mut Ebpf) -> anyhow::Result<()> {
        let map = crate::kernel::load::take_map(ebpf, rtrace_common::stacks::STACKS)?;
        self.walked = Some((BpfHashMap::try_from(map)?, HashMap::new()));
        Ok(())
    }

    /// The frames of the stack stored as `hash`, its entries joined;
    /// `None` if it is not in the table (it was full).
    pub fn walked(&mut self, hash: u64) -> Option<Arc<[u64]>> {
        let (map, cache) = self.walked.as_mut()?;
        if let Some(s) = cache.get(&hash) {
            return Some(Arc::clone(s));
        }
        let ips: Arc<[u64]> = read_stack(map, hash)?.into();
        cache.insert(hash, Arc::clone(&ips));
        Some(ips)
    }

    /// Names every Python, Java and JavaScript frame of stack `hash` of process
    /// `who` now, while it lives and its code is where the walk found it:
    /// the walk met more new ones than it told of ([`UntoldStack`]). The
    /// stack is in the kernel's table, or moved out of it already.
    fn name_untold(&mut self, who: Proc, hash: u64) {
        if !self.untold_named.insert((who, hash)) {
            return;
        }
        // The store and the symbolizer are separate fields: a held stack
        // is named where it lies.
        if let Some(ips) = self.store.held(hash) {
            self.sym.name_runtime_frames(who, ips);
        } else if let Some(ips) = self.peek.as_ref().and_then(|map| read_stack(map, hash)) {
            self.sym.name_runtime_frames(who, &ips);
        }
    }

    /// Notes the pprof file the run writes (`--pprof`), which `rtrace
    /// report` names JIT frames from once their maps are written.
    pub fn names_later_in(&mut self, pprof: Option<&std::path::Path>) {
        self.sym
            .names_later_in(pprof.map(|p| p.display().to_string()));
    }

    /// How user stacks are walked, for `-v`.
    pub fn describe(&self) -> &'static str {
        if self.cfi_loaded {
            "user stacks walked in the kernel from CFI (frame pointers where none)"
        } else {
            "user stacks by frame pointers (bpf_get_stack)"
        }
    }

    /// Handles a [`Seen`] record: a process new to a generation, or one
    /// that ran a new program, forked, or ran code in no known mapping.
    pub fn event(&mut self, record: &[u8]) -> anyhow::Result<()> {
        // Which record it is is in the flags every record starts with.
        let Some(head) = events::record::<SeenHeader>(record) else {
            return Ok(());
        };
        if head.flags & SEEN_FOUND != 0 {
            if let Some(f) = events::record::<Found>(record) {
                let offset = f.pgoff.wrapping_mul(4096);
                let p = Proc::new(f.tgid, f.born);
                self.sym.found(p, f.start, f.end, offset, f.dev, f.ino);
            }
            return Ok(());
        }
        if head.flags & SEEN_PY_CODE != 0 {
            if let Some(c) = events::record::<PyCode>(record) {
                let p = Proc::new(c.tgid, c.born);
                self.sym.python().learn(p, &c);
            }
            return Ok(());
        }
        if head.flags & rtrace_common::stacks::SEEN_UNTOLD != 0 {
            if let Some(u) = events::record::<UntoldStack>(record) {
                self.name_untold(Proc::new(u.tgid, u.born), u.stack);
            }
            return Ok(());
        }
        if head.flags & rtrace_common::stacks::SEEN_JAVA != 0 {
            if let Some(j) = events::record::<rtrace_common::java::JavaSeen>(record) {
                // Named now, while the process lives: the name is kept
                // for its stacks, symbolized later.
                let p = Proc::new(j.tgid, j.born);
                self.sym.java().frames(p, j.first, j.second);
            }
            return Ok(());
        }
        if head.flags & rtrace_common::stacks::SEEN_V8 != 0 {
            if let Some(j) = events::record::<rtrace_common::v8::V8Seen>(record) {
                // Named now, while the process lives and before the
                // collector moves the function.
                let p = Proc::new(j.tgid, j.born);
                self.sym.v8().frames(p, j.first, j.second);
            }
            return Ok(());
        }
        let Some(seen) = events::record::<Seen>(record) else {
            return Ok(());
        };
        let who = Proc::new(seen.tgid, seen.born);
        if seen.flags & SEEN_EXIT != 0 {
            // What it wrote as it exited (a JIT's perf map) is read now, and
            // is its own: the pid's next process starts with nothing of it.
            self.sym.ended(who, seen.parent_born);
            self.sym.python().forget(who);
            self.sym.java().exited(who);
            self.sym.v8().forget(who);
            self.execed.remove(&who);
            self.untold_named.retain(|(p, _)| *p != who);
            // `newest` keeps it: the stacks of a tool that names them one
            // at a time (memleak's, after the command exited) are its own
            // until a later process of the pid is told of.
            // Its walk's regions go with it, not to the pid's next process.
            if let Some(cfi) = &mut self.cfi {
                cfi.forget(seen.tgid);
            }
            return Ok(());
        }
        self.newest.insert(seen.tgid, who);
        if seen.flags & SEEN_FORK != 0 {
            let parent = Proc::new(seen.parent, seen.parent_born);
            self.sym.inherit(who, parent);
            if let Some(cfi) = &mut self.cfi {
                cfi.adopt(who, seen.parent);
            }
            if let Some(record) = self.sym.python().inherit(who, parent) {
                self.give_python(seen.tgid, &record);
            }
            return Ok(());
        }
        let exec = seen.flags & SEEN_EXEC != 0;
        let new_code = seen.flags & SEEN_NEW_CODE != 0;
        // The walk's regions first: a mapping they hold (a JIT's code
        // page, mapped between the exec and this read) is never reported
        // as new code, so the symbolizer reads the mappings after them,
        // or it would never learn of that code's jitdump.
        let read = match &mut self.cfi {
            Some(cfi) => cfi.add_process(who, exec || new_code)?,
            None => false,
        };
        // Code the walk found in no region is new to the symbolizer too,
        // and so is all of a new program's: what was read at the exec
        // (before its loader mapped its libraries) does not name it,
        // however recently it was read, so its first stacks read again.
        if exec {
            self.sym.exec(who);
            self.execed.insert(who);
        } else {
            let fresh = self.execed.remove(&who);
            self.sym.capture(who, new_code || read || fresh);
        }
        // One read of the mappings for the three runtimes' finders.
        let maps = MapsOnce::new(who);
        // A new program's runtimes are found afresh: what was read of the
        // old one's would be kept by a look again that finds none.
        if exec {
            self.sym.python().forget(who);
            self.sym.java().forget(who);
            self.sym.v8().forget(who);
        }
        self.examine_python(&maps, exec || new_code);
        self.examine_java(&maps, exec || new_code);
        self.examine_v8(&maps, exec || new_code);
        self.mark_timed();
        Ok(())
    }

    /// Looks for an interpreter in process `pid` (again if `fresh`) and
    /// gives the kernel's walk what it needs of one found.
    fn examine_python(&mut self, maps: &MapsOnce, fresh: bool) {
        if self.py_map.is_none() {
            return;
        }
        if let Some(record) = self.sym.python().examine(maps, fresh) {
            self.give_python(maps.who().pid, &record);
        }
    }

    /// Looks for a JVM in process `who` (again if `fresh`) and gives the
    /// kernel's walk what it needs of one found whose code cache is set
    /// up; one still starting is looked at again at its next new code.
    fn examine_java(&mut self, maps: &MapsOnce, fresh: bool) {
        let Some(map) = &mut self.java_map else {
            return;
        };
        if let Some(record) = self.sym.java().examine(maps, fresh) {
            let bit = rtrace_common::unwind::RUNTIME_JAVA;
            give(
                map,
                maps.who().pid,
                record,
                bit,
                &mut self.runtimes,
                &mut self.java_full,
            );
        }
    }

    /// Looks for V8 in process `who` (again if `fresh`) and gives the
    /// kernel's walk what it needs of one found whose JIT code range is
    /// set up; one still starting is looked at again at its next new
    /// code.
    fn examine_v8(&mut self, maps: &MapsOnce, fresh: bool) {
        let Some(map) = &mut self.v8_map else {
            return;
        };
        if let Some(record) = self.sym.v8().examine(maps, fresh) {
            let bit = rtrace_common::unwind::RUNTIME_V8;
            give(
                map,
                maps.who().pid,
                record,
                bit,
                &mut self.runtimes,
                &mut self.v8_full,
            );
        }
    }

    /// Puts process `pid`'s Python walk in the kernel's table; one that
    /// does not fit is counted.
    fn give_python(&mut self, pid: u32, record: &PyProc) {
        if let Some(map) = &mut self.py_map {
            let bit = rtrace_common::unwind::RUNTIME_PYTHON;
            give(
                map,
                pid,
                *record,
                bit,
                &mut self.runtimes,
                &mut self.py_full,
            );
        }
    }

    /// The runtimes whose frames the walk must step through: those of
    /// the processes given to the kernel's tables so far.
    pub fn runtimes(&self) -> rtrace_common::unwind::Runtimes {
        self.runtimes
    }

    /// The runtimes whose frames the run may walk: those not turned off
    /// by their `--no-*` flag.
    pub fn walkable(&self) -> rtrace_common::unwind::Runtimes {
        self.walkable
    }

    /// Notes that counting has begun, of kernel stacks too if `kernel`.
    pub fn start(&mut self, kernel: bool) {
        self.started = Some((Instant::now(), crate::output::epoch_secs()));
        if kernel {
            self.sym.prefetch_kernel();
        }
    }

    /// How long counting has run.
    pub fn elapsed(&self) -> Duration {
        self.started.map(|(t, _)| t.elapsed()).unwrap_or_default()
    }

    /// When counting began, in nanoseconds since the epoch.
    pub fn started_nanos(&self) -> u64 {
        self.started.map_or(0, |(_, e)| (e * 1e9) as u64)
    }

    /// Moves what the kernel counted out when its tables fill, so that
    /// they never do, settles the processes that have gone, and gives the
    /// kernel the held Python processes that have started theirs; not at
    /// the `last` tick, which is `finish`'s once counting has stopped.
    pub fn tick(&mut self, ebpf: &mut Ebpf, last: bool) -> anyhow::Result<()> {
        if last {
            return Ok(());
        }
        if let Some(cfi) = &mut self.cfi {
            cfi.forget_exited();
        }
        self.look_again();
        // Processes with a timed jitdump are counted by time slot, which
        // fills the kernel's table faster: it is moved out every tick.
        self.mark_timed();
        if self.marked.is_empty() && !self.store.due(ebpf)? {
            return Ok(());
        }
        self.store.drain(ebpf, false)?;
        self.store.settle_timed(&mut self.sym, &self.marked);
        self.store.settle_gone(&mut self.sym);
        Ok(())
    }

    /// Looks again at the runtimes found not started yet, at most every
    /// [`LOOK_AGAIN_EVERY`]: the programs that link Python held until
    /// their interpreter starts, and the JVMs and V8s found still
    /// starting. Called after each batch of events (with a ring buffer
    /// the loop wakes at least every 100 ms) and on each tick.
    ///
    /// None of them need run new code once started: a program that embeds
    /// Python may start its interpreter with none, and V8 runs an
    /// interpreted function in the builtins of its own binary, a region
    /// the walk was given at the exec. A thread that blocks from its start
    /// (a node that waits, under `offcputime -- node`) runs no new code at
    /// all, and its stacks kept no JavaScript frames to the end when a V8
    /// was looked at again only at its next new code.
    pub fn look_again(&mut self) {
        let now = Instant::now();
        if self
            .looked_again
            .is_some_and(|at| now.duration_since(at) < LOOK_AGAIN_EVERY)
        {
            return;
        }
        self.looked_again = Some(now);
        if self.py_map.is_some() {
            for (who, record) in self.sym.python().started_since() {
                self.give_python(who.pid, &record);
            }
        }
        let mut starting = self.sym.java().starting();
        starting.extend(self.sym.v8().starting());
        starting.sort_unstable_by_key(|p| (p.pid, p.start_ticks()));
        starting.dedup();
        for who in starting {
            let maps = MapsOnce::new(who);
            self.examine_java(&maps, false);
            self.examine_v8(&maps, false);
        }
    }

    /// Tells the kernel which processes' stacks to count by time slot:
    /// those with a timed jitdump, and no others, so that the table holds
    /// only live ones.
    fn mark_timed(&mut self) {
        let Some(map) = &mut self.timed_map else {
            return;
        };
        let timed = self.sym.timed_dumps();
        if timed == self.marked {
            return;
        }
        for p in self.marked.difference(&timed) {
            // Gone already is fine.
            let _ = map.remove(&p.pid);
        }
        for &p in timed.difference(&self.marked) {
            match map.insert(p.pid, 1, 0) {
                Ok(()) => self.unmarked.remove(&p),
                Err(_) => self.unmarked.insert(p),
            };
        }
        self.marked = timed;
        self.marked.retain(|p| !self.unmarked.contains(p));
    }

    /// Sets time zero (the kernel's `WINDOW`) to now, just before the
    /// first count can come, and returns it; with `by_time`, counts are
    /// kept apart by the heat map slot they came in (see
    /// [`StackStore::count_by_time`]).
    pub fn set_time_zero(&mut self, ebpf: &mut Ebpf, by_time: bool) -> anyhow::Result<u64> {
        let zero = crate::kernel::monotonic_ns();
        let mut window: aya::maps::Array<_, u64> = aya::maps::Array::try_from(
            crate::kernel::load::map_mut(ebpf, rtrace_common::stacks::WINDOW)?,
        )?;
        window
            .set(0, zero, 0)
            .context("cannot set the start of counting")?;
        if by_time {
            self.store.count_by_time(zero);
        }
        Ok(zero)
    }

    /// Samples the kernel could not count: events lost to a full buffer,
    /// and counts to a full count table.
    pub fn samples_lost(ebpf: &Ebpf) -> anyhow::Result<u64> {
        const { assert!(rtrace_common::events::LOST_EVENT == 0) };
        const { assert!(rtrace_common::stacks::ERR_COUNTS_FULL == 1) };
        Ok(
            crate::kernel::load::per_cpu_sums(ebpf, rtrace_common::names::ERRORS, 2)?
                .iter()
                .sum(),
        )
    }

    /// The page (`--html`) of `samples`, counted by time slot, with the
    /// tool's `facts` among every run's, what it counted (`total`, a
    /// fact of that name) and what was lost (`lost`, likewise).
    pub fn page<'a>(
        &self,
        ebpf: &Ebpf,
        title: String,
        unit: &'a str,
        samples: &'a [Sample],
        [total, lost]: [&str; 2],
        mut facts: Vec<(String, String)>,
    ) -> anyhow::Result<crate::output::html::Page<'a>> {
        let counted: u64 = samples.iter().map(|s| s.count).sum();
        facts.push((
            "Duration".to_owned(),
            format!("{:.1} s", self.elapsed().as_secs_f64()),
        ));
        facts.push((total.to_owned(), crate::output::files::thousands(counted)));
        facts.push((
            lost.to_owned(),
            crate::output::files::thousands(Self::samples_lost(ebpf)?),
        ));
        Ok(crate::output::html::Page {
            title,
            facts: crate::output::html::with_run_facts(facts),
            unit,
            profiles: vec![("profile".to_owned(), samples)],
            heat: Some(crate::output::local_time_of(
                (self.started_nanos() / 1_000_000_000) as i64,
            )),
        })
    }

    /// Keeps the names of every key, for the per-sample stream (see
    /// [`StackStore::keep_names`]).
    pub fn keep_names(&mut self) {
        self.store.keep_names();
    }

    /// The per-sample stream's `records` (once [`StackTool::finish`] has
    /// named every count), each with its own time since the Unix epoch,
    /// CPU, thread and weight, seen through `view` (the tool's own way of
    /// showing a sample, `None` to leave it out: wakeuptime shows its
    /// waker's stacks, and leaves out blocks with no waker seen), then
    /// transformed as the counts were (`--hide` and the like); and how
    /// many could not be named.
    pub fn timed(
        &self,
        records: &[Sent],
        view: &mut dyn FnMut(Sample) -> Option<Sample>,
    ) -> (Vec<Timed>, u64) {
        let offset = crate::kernel::wall_minus_monotonic_ns();
        let (timed, unnamed) = self.store.timed(records, |t| t.wrapping_add(offset));
        let mut timed: Vec<Timed> = timed
            .into_iter()
            .filter_map(|t| {
                Some(Timed {
                    sample: view(t.sample)?,
                    ..t
                })
            })
            .collect();
        if !self.transforms.is_empty() {
            // Each distinct stack once: samples share theirs.
            let mut done: HashMap<(usize, usize), Stacks> = HashMap::new();
            timed.retain_mut(|t| {
                let s = &mut t.sample;
                let key = (
                    Arc::as_ptr(&s.user).cast::<u8>() as usize,
                    Arc::as_ptr(&s.kernel).cast::<u8>() as usize,
                );
                let (user, kernel) = done
                    .entry(key)
                    .or_insert_with(|| {
                        let mut one = s.clone();
                        one.count = 1;
                        match self.transforms.samples(vec![one]).pop() {
                            Some(x) => (x.user, x.kernel),
                            None => (Arc::from([]), Arc::from([])),
                        }
                    })
                    .clone();
                s.user = user;
                s.kernel = kernel;
                !(s.user.is_empty() && s.kernel.is_empty())
            });
        }
        (timed, unnamed)
    }

    /// Keeps stacks' leaves at their exact addresses (see
    /// [`StackStore::exact_leaves`]).
    pub fn exact_leaves(&mut self) {
        self.store.exact_leaves();
    }

    /// Once counting has stopped: every count, symbolized and transformed
    /// (`--hide` and the like), hottest first.
    /// The exec and fork programs are detached meanwhile.
    pub fn finish(&mut self, ebpf: &mut Ebpf) -> anyhow::Result<Vec<Sample>> {
        self.report_start = Some(Instant::now());
        let _detaching = Detaching::start((self.links.take(), self.loader.take()));
        self.store.drain(ebpf, true)?;
        self.store.capture_unknown(&mut self.sym);
        if let Some(secs) = self.wait_exit {
            self.wait_for_exits(Duration::from_secs(secs));
        }
        // Perf maps and jitdumps written at exit (Mono's, the JVM's, V8's
        // buffer), by processes that exited as counting stopped or were
        // still running.
        self.sym.read_all_jit();
        let samples = self.store.samples(&mut self.sym);
        Ok(self.transforms.samples(samples))
    }

    /// Waits up to `wait` for the processes whose JIT frames are unnamed
    /// to exit (`--wait-exit`), saying so on stderr, and reads the maps
    /// they wrote as they exited. A signal ends the wait.
    fn wait_for_exits(&mut self, wait: Duration) {
        let waiting = self.store.unnamed_jit(&mut self.sym);
        if waiting.is_empty() {
            return;
        }
        let who: Vec<String> = waiting
            .iter()
            .map(|p| {
                let comm = crate::kernel::comm_of(p.pid);
                format!("PID {} ({})", p.pid, comm.as_deref().unwrap_or("?"))
            })
            .collect();
        eprintln!(
            "rtrace: waiting up to {} s for {} to exit, to name JIT frames from the maps \
             written at exit (Ctrl-C stops waiting)",
            wait.as_secs(),
            who.join(", ")
        );
        let deadline = Instant::now() + wait;
        while waiting.iter().any(Proc::alive)
            && Instant::now() < deadline
            && !crate::kernel::stop_requested()
        {
            std::thread::sleep(Duration::from_millis(50));
        }
        for &p in &waiting {
            if p.alive() {
                eprintln!(
                    "rtrace: PID {} was still running after {} s: its JIT frames stay \
                     unnamed",
                    p.pid,
                    wait.as_secs()
                );
            } else {
                self.sym.exited(p);
            }
        }
    }

    /// The samples counted since the last interval, while counting goes
    /// on (stackcount's `-i`): the older generation's counts moved out,
    /// the newer left for the next.
    pub fn interval(&mut self, ebpf: &mut Ebpf) -> anyhow::Result<Vec<Sample>> {
        self.store.drain(ebpf, false)?;
        let samples = self.store.take_samples(&mut self.sym);
        Ok(self.transforms.samples(samples))
    }

    /// Closes the files no known process maps any more (see
    /// [`Symbolizer::close_unused_files`]), between intervals of a
    /// long-running profile.
    pub fn close_unused_files(&mut self) -> usize {
        self.sym.close_unused_files()
    }

    /// Notes the report made of `samples`, whose counts are in `unit`.
    pub fn reported(&mut self, samples: &[Sample], unit: &str) {
        let total: u64 = samples.iter().map(|s| s.count).sum();
        let took = self.report_start.map(|t| t.elapsed()).unwrap_or_default();
        self.report = Some(format!(
            "{total} {unit} in {} stacks, symbolized and written in {} ms",
            samples.len(),
            took.as_millis()
        ));
    }

    /// How many user stacks were cut short, and in how many processes, for
    /// `-v` and the pprof file's facts.
    pub fn cut_short_summary(&self) -> Option<String> {
        let (mut cut, mut procs) = (0, 0);
        for (_, s) in self.store.cut_short() {
            cut += s.cut;
            procs += 1;
        }
        (cut > 0).then(|| {
            format!("user stacks cut short: {cut} (counted) in {procs} processes, kept with the frames read")
        })
    }

    /// What the report took and what the CFI tables hold, for `-v`.
    pub fn summary(&self) -> Vec<String> {
        let tables = self.cfi.as_ref().map(|c| {
            let (files, rows, bytes) = c.stats();
            let (evicted, evicted_rows) = c.evictions();
            format!(
                "CFI tables: {files} files, {rows} rows, {} KiB in the kernel of a {} KiB \
                 budget, {evicted} files ({evicted_rows} rows) evicted; {}",
                bytes / 1024,
                c.budget() / 1024,
                c.cache_summary()
            )
        });
        let lookup = (self.cfi.is_some() && !self.cfi_find_vma).then(|| {
            "CFI walk: mappings are not looked up in the kernel (no bpf_find_vma, or \
             RTRACE_NO_FIND_VMA): a process's stacks go by frame pointer until user space has \
             read its maps"
                .to_owned()
        });
        let loader = match &self.loader {
            Some(Err(e)) => Some(format!(
                "CFI walk: no hook in the dynamic loader ({e}): a new program's regions are \
                 read at its exec and at its first stack through code in none of them"
            )),
            _ => None,
        };
        self.report
            .iter()
            .cloned()
            .chain(tables)
            .chain(lookup)
            .chain(loader)
            .chain(self.cut_short_summary())
            .chain(self.sym.dump_summary())
            .chain(self.sym.python_summary())
            .chain(self.sym.java_summary())
            .chain(self.sym.v8_summary())
            .collect()
    }

    /// The processes more than [`CUT_SHORT_SHARE`] of whose user stacks
    /// were cut short (and at least [`CUT_SHORT_MIN`] distinct ones), most first,
    /// in one warning with the likely cause and the cure. A few cut short
    /// in a process are normal (a stack page not in memory): the samples
    /// keep the frames read, and `-v` counts them. A process that mapped a
    /// file whose rows did not fit the budget is left to that warning.
    fn cut_short_warning(&self) -> Option<Warning> {
        let mut many: Vec<(Proc, &crate::stacks::stackstore::CutShort)> = self
            .store
            .cut_short()
            .filter(|(p, s)| {
                s.stacks >= CUT_SHORT_MIN
                    && s.cut as f64 > CUT_SHORT_SHARE * s.all as f64
                    // Walked by frame pointer for the budget, which its own
                    // warning names with the cure.
                    && !self.cfi.as_ref().is_some_and(|c| c.short_of_budget(p))
            })
            .collect();
        if many.is_empty() {
            return None;
        }
        many.sort_by(|a, b| {
            let share = |s: &crate::stacks::stackstore::CutShort| s.cut as f64 / s.all as f64;
            share(b.1).total_cmp(&share(a.1)).then(a.0.cmp(&b.0))
        });
        let named: Vec<String> = many
            .iter()
            .take(5)
            .map(|(p, s)| {
                format!(
                    "PID {} ({}) {:.0} %",
                    p.pid,
                    s.comm(),
                    100.0 * s.cut as f64 / s.all as f64
                )
            })
            .collect();
        let more = many.len().saturating_sub(5);
        Some(Warning::unwalked(format!(
            "user stacks cut short in {}{}: the walk met a stack word it could not \
             read, most likely below code with neither frame pointers nor CFI, such as \
             a JIT's; those samples keep the frames above it. Run the JIT with frame \
             pointers (Mono: MONO_DEBUG=disable_omit_fp; the JVM: \
             -XX:+PreserveFramePointer) or build the code with -fno-omit-frame-pointer",
            named.join(", "),
            if more > 0 {
                format!(" and {more} more processes")
            } else {
                String::new()
            }
        )))
    }

    /// Processes whose tables could not be built, files whose frames
    /// could not be named, and the like.
    pub fn warnings(&self) -> Vec<Warning> {
        let mut out = self.cfi.as_ref().map(|c| c.warnings()).unwrap_or_default();
        if self.cfi_lost {
            out.push(Warning::unwalked(
                "the kernel refused the CFI walk (-v says why): user stacks were walked by \
                 frame pointers alone, and code built without them is cut short; \
                 --unwind cfi makes this an error",
            ));
        }
        out.extend(self.sym.warnings());
        if self.py_full > 0 {
            out.push(Warning::unwalked(format!(
                "{} Python processes did not fit in map PY_PROCS ({MAX_PY_PROCS} entries): \
                 their stacks have native frames only",
                self.py_full
            )));
        }
        if self.java_full > 0 {
            out.push(Warning::unwalked(format!(
                "{} JVM processes did not fit in map JAVA_PROCS ({} entries): their Java \
                 frames are unnamed",
                self.java_full,
                rtrace_common::java::MAX_JAVA_PROCS
            )));
        }
        if self.v8_full > 0 {
            out.push(Warning::unwalked(format!(
                "{} V8 processes did not fit in map V8_PROCS ({} entries): their JavaScript \
                 frames are unnamed",
                self.v8_full,
                rtrace_common::v8::MAX_V8_PROCS
            )));
        }
        out.extend(self.cut_short_warning());
        if self.store.cut() > 0 {
            out.push(Warning::unwalked(format!(
                "{} deep stacks lost their root-ward part between two moves out of the \
                 kernel, and are kept to their leaf-most frames",
                self.store.cut()
            )));
        }
        if !self.unmarked.is_empty() {
            out.push(Warning::unnamed(format!(
                "{} processes with jitdumps did not fit in map TIMED_JIT ({} entries): \
                 their JIT frames are named by the newest code at each address, \
                 not by the code there within 67 ms of the sample",
                self.unmarked.len(),
                rtrace_common::stacks::MAX_TIMED
            )));
        }
        out
    }
}

/// A sample's user and kernel frames, leaf first.
type Stacks = (Arc<[Frame]>, Arc<[Frame]>);

/// The kernel's per-sample streams (`--firefox`, `--samples`): ring
/// buffers of [`TimedSample`]s (profile's samples) and of [`Interval`]s
/// (the waits of the context-switch programs), read on the tools'
/// one-second tick, and the records read from them.
#[derive(Default)]
pub struct SampleStream {
    samples: Option<aya::maps::RingBuf<MapData>>,
    /// The waits' ring, and whether their keys are counted with
    /// [`OFF_CPU`](rtrace_common::stacks::OFF_CPU) added (`profile
    /// --off-cpu`).
    intervals: Option<(aya::maps::RingBuf<MapData>, bool)>,
    records: Vec<Sent>,
}

impl SampleStream {
    /// The ring buffer's size for `per_second` samples a second: four
    /// seconds of them, as it is read every second, in a power of two of
    /// at least 256 KiB and at most 256 MiB.
    pub fn bytes(per_second: u64) -> u32 {
        Self::bytes_of::<TimedSample>(per_second)
    }

    /// The waits' ring buffer's size for `per_second` waits a second, as
    /// [`SampleStream::bytes`].
    pub fn interval_bytes(per_second: u64) -> u32 {
        Self::bytes_of::<Interval>(per_second)
    }

    fn bytes_of<T>(per_second: u64) -> u32 {
        // A record and the ring's 8-byte header.
        let record = (size_of::<T>() + 8) as u64;
        per_second
            .saturating_mul(4 * record)
            .clamp(256 << 10, 256 << 20)
            .next_power_of_two() as u32
    }

    /// Takes the object's ring buffer of samples, after load; an object
    /// without one (the `perf` variant, for kernels before 5.8) cannot
    /// send samples on their own.
    pub fn take(ebpf: &mut Ebpf) -> anyhow::Result<Self> {
        let map = ebpf.take_map(rtrace_common::profile::SAMPLES).context(
            "--firefox and --samples need each sample on its own, through a ring buffer \
             (kernel 5.8+)",
        )?;
        Ok(Self {
            samples: Some(aya::maps::RingBuf::try_from(map)?),
            ..Self::default()
        })
    }

    /// Also takes the object's ring buffer of waits off the CPU, after
    /// load; `flagged` where the object counts them with `OFF_CPU` added
    /// to their keys (`profile --off-cpu`).
    pub fn with_intervals(mut self, ebpf: &mut Ebpf, flagged: bool) -> anyhow::Result<Self> {
        let map = ebpf
            .take_map(rtrace_common::offcputime::INTERVALS)
            .context(
                "--firefox and --samples need each wait off the CPU on its own, through a ring \
             buffer (kernel 5.8+)",
            )?;
        self.intervals = Some((aya::maps::RingBuf::try_from(map)?, flagged));
        Ok(self)
    }

    /// Reads the records waiting.
    pub fn read(&mut self) {
        if let Some(ring) = &mut self.samples {
            while let Some(item) = ring.next() {
                if let Some(r) = record::<TimedSample>(&item) {
                    self.records.push(Sent::sample(&r));
                }
            }
        }
        if let Some((ring, flagged)) = &mut self.intervals {
            while let Some(item) = ring.next() {
                if let Some(r) = record::<Interval>(&item) {
                    self.records.push(Sent::wait(&r, *flagged));
                }
            }
        }
    }

    /// The records read so far.
    pub fn records(&self) -> &[Sent] {
        &self.records
    }
}

/// A ring buffer's record as the plain-old-data `T` it holds, if whole.
fn record<T: aya::Pod>(item: &[u8]) -> Option<T> {
    // SAFETY: the record is a whole `T`, plain old data; read unaligned
    // from the ring's bytes.
    (item.len() >= size_of::<T>()).then(|| unsafe { item.as_ptr().cast::<T>().read_unaligned() })
}

/// The share of a process's user stacks cut short above which the stack
/// tools warn, naming it.
const CUT_SHORT_SHARE: f64 = 0.01;
/// The fewest distinct stacks cut short in a process that are warned of:
/// a handful, however heavy (a wait of a second off the CPU), is no sign
/// of code the walk cannot follow, which cuts short at every address of
/// it that is sampled.
const CUT_SHORT_MIN: u64 = 10;

/// The system's dynamic loader, whose `_dl_debug_state` (called when its
/// list of a process's objects changes: at a program's start, once
/// before and once after it maps the libraries, and at `dlopen`) wakes
/// user space to read the process's regions.
const LOADER: &str = "/lib64/ld-linux-x86-64.so.2";

/// Attaches the `cfi_loaded` program to [`LOADER`]'s `_dl_debug_state`,
/// for every process (the program keeps to the ones traced); not where
/// `RTRACE_NO_LOADER_HOOK` is set.
fn attach_loader(ebpf: &mut Ebpf) -> anyhow::Result<UProbeLink> {
    // What a walk without the hook gets (a loader elsewhere, as in a
    // container), for the tests.
    if std::env::var_os("RTRACE_NO_LOADER_HOOK").is_some_and(|v| !v.is_empty()) {
        anyhow::bail!("RTRACE_NO_LOADER_HOOK is set");
    }
    let prog = crate::probes::uprobes::loaded(ebpf, rtrace_common::unwind::PROG_LOADED)?;
    let id = prog
        .attach("_dl_debug_state", LOADER, UProbeScope::AllProcesses)
        .map_err(|e| {
            anyhow::anyhow!(
                "cannot attach to _dl_debug_state in {LOADER}: {}",
                crate::kernel::features::chain(&e)
            )
        })?;
    Ok(prog.take_link(id)?)
}

/// Loads program `name` and attaches it to raw tracepoint `tracepoint`,
/// returning its link.
fn attach_raw(ebpf: &mut Ebpf, name: &str, tracepoint: &str) -> anyhow::Result<RawTracePointLink> {
    let prog: &mut RawTracePoint = ebpf
        .program_mut(name)
        .with_context(|| format!("program {name} missing"))?
        .try_into()?;
    // It may have been loaded beside the walk already.
    if prog.fd().is_err() {
        prog.load()
            .with_context(|| format!("cannot load program {name}"))?;
    }
    let id = prog
        .attach(tracepoint)
        .with_context(|| format!("cannot attach to raw tracepoint {tracepoint}"))?;
    Ok(prog.take_link(id)?)
}

/// Puts process `pid`'s record in a runtime's kernel table `map`: the
/// runtime's `bit` joins `runtimes`, the walks the sampling program steps
/// through; a record that does not fit is counted in `full`.
fn give<T: aya::Pod>(
    map: &mut BpfHashMap<MapData, u32, T>,
    pid: u32,
    record: T,
    bit: rtrace_common::unwind::Runtimes,
    runtimes: &mut rtrace_common::unwind::Runtimes,
    full: &mut u64,
) {
    match map.insert(pid, record, 0) {
        Ok(()) => *runtimes |= bit,
        Err(_) => *full += 1,
    }
}

//! CPython processes, for the kernel walk's Python frames
//! (`ebpf-programs/src/python.rs`): finding the interpreter in a process
//! (the executable or a `libpython` that defines `_PyRuntime`), its
//! version and offsets (CPython's own `_Py_DebugOffsets` from 3.13, a
//! table per minor version before), where a thread's state is (glibc's
//! block of the runtime's pthread key), a check of the offsets against
//! the live interpreter before the kernel trusts them, and the names of
//! the code objects the walk meets, read from the process while it lives.

use std::{
    collections::{BTreeMap, HashMap},
    fs::File,
    sync::Arc,
};

use rtrace_common::python::{
    CHAIN_310, CHAIN_311, CHAIN_312, CHAIN_313, LINES_BYTES, PyCode, PyProc, TSTATE_BYTES,
    code_check,
};
use rtrace_common::stacks::SEEN_PY_TASK;

use crate::kernel::procmaps::{Mapping, MapsOnce, Proc};
use crate::kernel::procmem::{Mem, open_mem_in};
use crate::kernel::warning::Warning;

/// Where CPython keeps what the walk and the names need, in one version.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Layout {
    /// The minor version (`3.minor`).
    pub minor: u8,
    /// `_PyRuntimeState`: `interpreters.head`.
    rt_interp_head: u64,
    /// `_PyRuntimeState`: the `_key` of `autoTSSkey` (a `Py_tss_t`, whose
    /// `_is_initialized` is the `int` before it): the version's usual
    /// place, where the interpreter's own code does not say
    /// ([`tss_key_from_code`]).
    rt_tss: u64,
    /// `PyInterpreterState.threads.head`.
    is_threads_head: u64,
    /// `PyThreadState.next`.
    ts_next: u64,
    /// `PyThreadState.interp`.
    ts_interp: u64,
    /// `PyThreadState`'s field the chain starts at ([`PyProc::ts_frame`]).
    ts_frame: u64,
    /// `PyThreadState.thread_id` ([`PyProc::ts_thread_id`]; 0: unknown).
    ts_thread_id: u64,
    /// `_PyCFrame.current_frame` (3.11, 3.12).
    cframe_current: u64,
    /// A frame's code, caller, last instruction and entry mark.
    fr_code: u64,
    fr_back: u64,
    fr_instr: u64,
    fr_entry: u64,
    /// `PyCodeObject` fields.
    co_firstlineno: u64,
    co_filename: u64,
    co_name: u64,
    /// `co_qualname` (3.11+; `co_name` before).
    co_qualname: u64,
    /// `co_linetable` (3.10's PEP 626 table, 3.11's locations).
    co_linetable: u64,
    /// Where bytecode starts (`co_code_adaptive`, 3.11+).
    co_adaptive: u64,
    /// `PyASCIIObject`'s size: where a compact ASCII string's bytes are.
    ascii_size: u64,
    /// `PyCompactUnicodeObject`'s size: where other compact strings' are.
    compact_size: u64,
    /// A coroutine's own frame (`gi_iframe`, 3.14's debug offsets; 0
    /// before): where the walk puts an asyncio task's frame.
    gen_iframe: u64,
}

impl Layout {
    /// The offsets of 3.`minor` (3.10 to 3.12), x86-64, a release build.
    /// From CPython's headers at each version's tags; checked against the
    /// live interpreter before use ([`Python::examine`]).
    fn table(minor: u8) -> Option<Self> {
        let common = Self {
            minor,
            ascii_size: 48,
            compact_size: 72,
            ..Self::default()
        };
        Some(match minor {
            10 => Self {
                rt_interp_head: 32,
                rt_tss: 588,
                is_threads_head: 8,
                ts_next: 8,
                ts_interp: 16,
                ts_frame: 24,
                fr_code: 32,
                fr_back: 24,
                fr_instr: 96,
                co_firstlineno: 40,
                co_filename: 104,
                co_name: 112,
                co_qualname: 112,
                co_linetable: 120,
                ..common
            },
            11 => Self {
                rt_interp_head: 40,
                rt_tss: 596,
                is_threads_head: 16,
                ts_next: 8,
                ts_interp: 16,
                ts_frame: 56,
                // Measured (ctypes on Debian's 3.11.2); not known for 3.10
                // and 3.12, which no reachable registry carries.
                ts_thread_id: 152,
                cframe_current: 8,
                fr_code: 32,
                fr_back: 48,
                fr_instr: 56,
                fr_entry: 68,
                co_firstlineno: 72,
                co_filename: 112,
                co_name: 120,
                co_qualname: 128,
                co_linetable: 136,
                co_adaptive: 184,
                ..common
            },
            12 => Self {
                rt_interp_head: 40,
                rt_tss: 1548,
                is_threads_head: 72,
                ts_next: 8,
                ts_interp: 16,
                ts_frame: 56,
                cframe_current: 0,
                fr_code: 0,
                fr_back: 8,
                fr_instr: 56,
                fr_entry: 70,
                co_firstlineno: 68,
                co_filename: 112,
                co_name: 120,
                co_qualname: 128,
                co_linetable: 136,
                co_adaptive: 192,
                ascii_size: 40,
                compact_size: 56,
                ..common
            },
            _ => return None,
        })
    }

    /// The offsets of 3.13 and 3.14, from the `_Py_DebugOffsets` that
    /// begin `_PyRuntime` (`w`, its 64-bit words as the file holds them),
    /// and the runtime's `autoTSSkey`, which they do not give. The table
    /// is a flat list of words whose shape is each minor version's
    /// (`Include/internal/pycore_debug_offsets.h`): a cookie, the version,
    /// the free-threaded flag, then each struct's size and fields. 3.14
    /// inserts `threads_main` after `threads_head`, appends two
    /// generations to the interpreter's part, `stackpointer` and
    /// `tlbc_index` to the frame's and `co_tlbc` to the code object's,
    /// which shifts every later field.
    fn debug_offsets(minor: u8, w: &[u64]) -> Result<Self, String> {
        let w = |i: usize| w.get(i).copied().unwrap_or(0);
        if w(1) >> 16 != 0x0300 | u64::from(minor) {
            return Err(format!(
                "its _Py_DebugOffsets say version {:#x}, not 3.{minor}",
                w(1)
            ));
        }
        if w(2) != 0 {
            // A free-threaded build's objects have a 32-byte header and
            // its frames may run per-thread copies of the bytecode: its
            // walk would read the wrong words.
            return Err(format!(
                "free-threaded builds (3.{minor}t) are not supported"
            ));
        }
        // Where each struct's part begins: the interpreter's, the thread
        // state's, the frame's, the code object's; and the unicode
        // object's `asciiobject_size`.
        let (is, ts, fr, co, ascii) = match minor {
            13 => (6, 19, 28, 34, 70),
            14 => (6, 22, 31, 39, 80),
            _ => {
                return Err(format!(
                    "Python 3.{minor} is not supported yet (3.10 to 3.14 are)"
                ));
            }
        };
        Ok(Self {
            minor,
            rt_interp_head: w(5),
            // Checked against the live interpreter before use.
            rt_tss: debug_offsets_tss(minor),
            is_threads_head: w(is + 3),
            ts_next: w(ts + 2),
            ts_interp: w(ts + 3),
            ts_frame: w(ts + 4),
            ts_thread_id: w(ts + 5),
            cframe_current: 0,
            fr_back: w(fr + 1),
            fr_code: w(fr + 2),
            fr_instr: w(fr + 3),
            fr_entry: w(fr + 5),
            co_filename: w(co + 1),
            co_name: w(co + 2),
            co_qualname: w(co + 3),
            co_linetable: w(co + 4),
            co_firstlineno: w(co + 5),
            co_adaptive: w(co + 9),
            ascii_size: w(ascii),
            compact_size: w(ascii) + 16,
            // 3.14 appends `gen_object` (size, gi_name, gi_iframe,
            // gi_frame_state) after the unicode object's part and `gc`'s.
            gen_iframe: if minor == 14 { w(85) } else { 0 },
        })
    }

    /// The walk's record of this layout.
    fn record(
        &self,
        eval: [(u64, u64); 2],
        [code_type, unicode_type, long_type]: [u64; 3],
        tss: u64,
        key_block: i64,
        lines: bool,
    ) -> PyProc {
        let o = |v: u64| v as u16;
        PyProc {
            eval_start: eval[0].0,
            eval_end: eval[0].1,
            eval2_start: eval[1].0,
            eval2_end: eval[1].1,
            code_type,
            unicode_type,
            long_type,
            tss_addr: tss,
            key_block,
            ts_frame: o(self.ts_frame),
            cframe_current: o(self.cframe_current),
            frame_code: o(self.fr_code),
            frame_back: o(self.fr_back),
            frame_instr: o(self.fr_instr),
            frame_entry: o(self.fr_entry),
            code_firstlineno: o(self.co_firstlineno),
            code_name: o(self.co_name),
            code_filename: o(self.co_filename),
            code_adaptive: o(self.co_adaptive),
            code_qualname: o(self.co_qualname),
            code_linetable: o(self.co_linetable),
            str_ascii: o(self.ascii_size),
            str_compact: o(self.compact_size),
            chain: match self.minor {
                10 => CHAIN_310,
                11 => CHAIN_311,
                12 => CHAIN_312,
                _ => CHAIN_313,
            },
            lines: u8::from(lines),
            // Read with the frame's field, in one read of at most
            // `TSTATE_BYTES`.
            ts_thread_id: if self.ts_thread_id != 0
                && self.ts_thread_id.abs_diff(self.ts_frame) + 8 <= TSTATE_BYTES as u64
            {
                o(self.ts_thread_id)
            } else {
                0
            },
            salt: 0,
            // Set where the process has loaded `_asyncio` ([`Asyncio`]).
            ts_running_task: 0,
            task_coro: 0,
            task_name: 0,
            gen_iframe: o(self.gen_iframe),
            _pad2: 0,
        }
    }
}

/// What one ELF file holding an interpreter says, by file.
#[derive(Debug)]
struct PyFile {
    version: String,
    layout: Layout,
    /// Virtual addresses in the file of `_PyRuntime`, `PyCode_Type`,
    /// `PyUnicode_Type`, and `_PyEval_EvalFrameDefault`'s ranges: its
    /// symbol's, and the other part of its code where the compiler split
    /// it ([`split_part`]; empty if none).
    runtime: u64,
    code_type: u64,
    unicode_type: u64,
    long_type: u64,
    eval: [(u64, u64); 2],
    /// The page of the virtual address its file offset 0 is loaded at:
    /// a mapping of offset 0 at `start` has the load bias `start - this`.
    base: u64,
}

/// A process found to run CPython.
struct PyProcess {
    file: Arc<PyFile>,
    /// The load bias of the interpreter's file.
    bias: u64,
    /// Its memory, read while it lives.
    mem: Mem,
    /// Whether the offsets were checked against a live frame.
    checked: bool,
    /// What the kernel was given, or will be.
    record: PyProc,
    comm: String,
    /// Held back from the kernel: a program that links libpython without
    /// being Python's own (`perf`, an editor, a debugger) and had not
    /// started an interpreter when found. Many never do (`perf record`
    /// does not), and one given to the kernel has the walk through
    /// Python's frames loaded for every sample of the run; it is given
    /// once its interpreter is seen to start ([`Python::started_since`]).
    held: bool,
}

/// A code object, named.
#[derive(Debug)]
pub struct PyName {
    /// `module.qualname`.
    pub name: Arc<str>,
    /// The file it was compiled from.
    pub file: Arc<str>,
    firstlineno: u32,
    linetable: Vec<u8>,
    /// Set where `linetable` is only the head the kernel copied: lines
    /// past it are unknown.
    cut: bool,
    minor: u8,
}

impl PyName {
    /// The line of code unit `lasti`, if the table has it.
    pub fn line(&self, lasti: u32) -> Option<u32> {
        if self.minor == 10 {
            line_310(&self.linetable, self.firstlineno, lasti)
        } else {
            line_311(&self.linetable, self.firstlineno, lasti)
        }
    }
}

/// The Python processes, and the names of their code.
#[derive(Default)]
pub struct Python {
    /// Off with `--no-python`.
    disabled: bool,
    /// Frames carry their instruction (`--lines`).
    lines: bool,
    /// Off with `--no-asyncio-tasks`.
    no_tasks: bool,
    files: HashMap<(u64, u64), Option<Arc<PyFile>>>,
    /// What each `_asyncio` module file says of tasks, by file.
    asyncio_files: HashMap<(u64, u64), Option<Asyncio>>,
    /// Names of asyncio tasks, by their process, their name's address
    /// and its check.
    tasks: HashMap<(Proc, u64, u32), Option<Arc<str>>>,
    /// By process, not pid: a later process of the pid is looked at anew.
    procs: HashMap<Proc, PyProcess>,
    /// Processes looked at and found to run no interpreter the walk can
    /// read, and why (`None`: no Python at all).
    not: HashMap<Proc, Option<String>>,
    /// Names of code objects, by their process, address and check.
    codes: HashMap<(Proc, u64, u32), Option<Arc<PyName>>>,
    /// Where glibc keeps a thread's first pthread keys, by libc file.
    key_blocks: HashMap<(u64, u64), Option<i64>>,
    /// What `-v` says of the processes found.
    found: BTreeMap<Proc, String>,
    /// Processes whose interpreter cannot be walked, and why.
    failed: BTreeMap<u32, String>,
    /// Frames of code objects that could not be read (gone, or reused).
    unnamed: u64,
    /// Frames with no line under `--lines` because only the head of
    /// their line table could be had.
    cut_lines: u64,
    /// Frames of code objects of processes whose memory rtrace may not
    /// read, and the first such process and why.
    denied: u64,
    /// The processes whose memory rtrace may not read, and why, kept
    /// after they exit.
    denied_procs: HashMap<Proc, String>,
    denied_why: Option<String>,
}

impl Python {
    /// Turns the walk off (`--no-python`) and sets whether frames carry
    /// lines and whether asyncio tasks are shown.
    pub fn configure(&mut self, enabled: bool, lines: bool, tasks: bool) {
        self.disabled = !enabled;
        self.lines = lines;
        self.no_tasks = !tasks;
    }

    /// Looks at process `pid` (again if `fresh`: it ran a new program or
    /// mapped new code) and returns the record for the kernel if it runs
    /// an interpreter the walk can read and the kernel has not been
    /// given it yet (or its offsets were checked since).
    pub fn examine(&mut self, maps: &MapsOnce, fresh: bool) -> Option<PyProc> {
        let who = maps.who();
        let pid = who.pid;
        if self.disabled || pid == 0 {
            return None;
        }
        let known = self.procs.contains_key(&who);
        if fresh {
            self.not.remove(&who);
        } else if self.not.contains_key(&who) {
            return None;
        }
        if !fresh && let Some(p) = self.procs.get_mut(&who) {
            if p.held {
                return self.release(who);
            }
            if p.checked {
                return None;
            }
            // Not checked when first found (its interpreter not yet
            // running): checked now.
            return match check(p) {
                Ok(true) => {
                    p.checked = true;
                    None
                }
                Ok(false) => None,
                Err(why) => {
                    self.fail(who, why);
                    None
                }
            };
        }
        match self.find(maps) {
            Ok(Some(mut p)) => {
                let checked = match check(&p) {
                    Ok(c) => c,
                    Err(why) => {
                        self.fail(who, why);
                        return None;
                    }
                };
                p.checked = checked;
                // Only a program that is not Python's own is held (an
                // interpreter is started within moments of its exec, and
                // one whose program cannot be told is given at once), and
                // only where it is known not to have started: one whose
                // memory cannot be read could never be seen to.
                p.held = !checked
                    && started(&p) == Some(false)
                    && maps.dir().is_some_and(|d| embeds_python(d));
                let record = p.record;
                let line = if p.held {
                    found_line(
                        pid,
                        &p,
                        " linked but not started",
                        "not walked until it starts",
                        "",
                    )
                } else {
                    found_line(pid, &p, "", &offsets_checked(&p, "not yet started"), "")
                };
                self.found.insert(who, line);
                let held = p.held;
                self.procs.insert(who, p);
                (!held).then_some(record)
            }
            // An interpreter already read, looked at again for its new
            // code, whose mappings are gone (it is exiting: a zombie's maps
            // are empty) or cannot be read now keeps what was read and
            // `-v`'s line: both stay true of it until its exit record. (A
            // new program is forgotten before it is looked at.)
            Ok(None) | Err(_) if known => None,
            Ok(None) => {
                self.not.insert(who, None);
                None
            }
            Err(why) => {
                self.fail(who, why);
                None
            }
        }
    }

    /// The records of the held processes ([`PyProcess::held`]) whose
    /// interpreter has started since, for the kernel: looked at on every
    /// tick, as such a program may start it with no new code to tell.
    pub fn started_since(&mut self) -> Vec<(Proc, PyProc)> {
        let held: Vec<Proc> = self
            .procs
            .iter()
            .filter(|(_, p)| p.held)
            .map(|(w, _)| *w)
            .collect();
        held.into_iter()
            .filter_map(|who| Some((who, self.release(who)?)))
            .collect()
    }

    /// Gives held process `who` to the kernel if its interpreter has
    /// started: its record, its offsets checked now and `-v`'s line said
    /// so; `None` while it has not.
    fn release(&mut self, who: Proc) -> Option<PyProc> {
        let p = self.procs.get_mut(&who)?;
        if !p.held || started(p) != Some(true) {
            return None;
        }
        p.held = false;
        match check(p) {
            Ok(checked) => p.checked = checked,
            Err(why) => {
                self.fail(who, why);
                return None;
            }
        }
        let line = found_line(
            who.pid,
            p,
            "",
            &offsets_checked(p, "started"),
            "; linked by the program and held until it started",
        );
        let record = p.record;
        self.found.insert(who, line);
        Some(record)
    }

    fn fail(&mut self, who: Proc, why: String) {
        let pid = who.pid;
        self.procs.remove(&who);
        self.found.remove(&who);
        let comm = comm(pid);
        eprintln!("rtrace: PID {pid} ({comm}): no Python frames: {why}; native frames only");
        self.failed.insert(pid, why.clone());
        self.not.insert(who, Some(why));
    }

    /// Forgets a process that exited. The names of its code stay, for
    /// its samples not named yet.
    pub fn forget(&mut self, who: Proc) {
        self.procs.remove(&who);
        self.not.remove(&who);
    }

    /// A child forked from `parent` runs its interpreter too, at the same
    /// addresses.
    pub fn inherit(&mut self, child: Proc, parent: Proc) -> Option<PyProc> {
        let p = self.procs.get(&parent)?;
        let record = PyProc {
            salt: child.salt(),
            ..p.record
        };
        let file = Arc::clone(&p.file);
        let (bias, checked, held) = (p.bias, p.checked, p.held);
        let mem = self.open_mem(child, &crate::kernel::procmaps::proc_dir(child.pid));
        self.procs.insert(
            child,
            PyProcess {
                file,
                bias,
                mem,
                checked,
                record,
                comm: comm(child.pid),
                held,
            },
        );
        (!held).then_some(record)
    }

    /// Names code object `c.addr` of process `who`, which a walk met, by
    /// what the kernel copied of it if that is whole, else by reading the
    /// process's memory while it lives (where rtrace may: ptrace rights),
    /// else by what the kernel copied, cut short.
    pub fn learn(&mut self, who: Proc, c: &PyCode) {
        if c.flags & SEEN_PY_TASK != 0 {
            let name = copied_str(&c.name, c.name_len, c.kinds as u8, false);
            let entry = self.tasks.entry((who, c.addr, c.check)).or_default();
            if entry.is_none() {
                *entry = name.map(|(n, _)| Arc::from(n));
            }
            return;
        }
        if let Some(Some(_)) = self.codes.get(&(who, c.addr, c.check)) {
            return;
        }
        let minor = self.procs.get(&who).map(|p| p.file.layout.minor);
        let copied = copied_name(c, minor, self.lines);
        let name = match copied {
            Some((n, true)) => Some(n),
            copied => self
                .procs
                .get(&who)
                .and_then(|p| read_code(p, c.addr, c.check))
                .or(copied.map(|(n, _)| n)),
        };
        self.codes
            .insert((who, c.addr, c.check), name.map(Arc::new));
    }

    /// Reads code object `addr` (with `check`) of process `who` now, if
    /// it is not known yet, for [`Python::name`]: met by a walk whose
    /// record was lost or never sent (more new ones than a walk tells
    /// of). Its memory was opened while it lived: an earlier process's
    /// memory is never read for a later one of the pid.
    pub fn read_now(&mut self, who: Proc, addr: u64, check: u32) {
        if !self.codes.contains_key(&(who, addr, check)) {
            let name = self
                .procs
                .get(&who)
                .and_then(|p| read_code(p, addr, check))
                .map(Arc::new);
            self.codes.insert((who, addr, check), name);
        }
    }

    /// The name of a code object the walk met, if it could be read.
    pub fn name(&mut self, who: Proc, addr: u64, check: u32) -> Option<Arc<PyName>> {
        self.read_now(who, addr, check);
        let name = self.codes.get(&(who, addr, check)).cloned().flatten();
        if name.is_none() {
            // Asked of processes that may have exited since: what was
            // known of their memory is kept by process.
            match self.denied_procs.get(&who) {
                Some(why) => {
                    self.denied += 1;
                    self.denied_why.get_or_insert_with(|| why.clone());
                }
                None => self.unnamed += 1,
            }
        }
        name
    }

    /// The name of an asyncio task whose name (a `str` at `addr` with
    /// check `check`) a walk met, as the kernel copied it.
    pub fn task_name(&self, who: Proc, addr: u64, check: u32) -> Option<Arc<str>> {
        self.tasks.get(&(who, addr, check)).cloned().flatten()
    }

    /// The source line of code unit `lasti` of `n`, if its table has it;
    /// a line lost to a table cut short is counted for the warning.
    pub fn line(&mut self, n: &PyName, lasti: u32) -> Option<u32> {
        let line = n.line(lasti);
        if line.is_none() && n.cut {
            self.cut_lines += 1;
        }
        line
    }

    /// What `-v` says: each Python process found.
    pub fn summary(&self) -> Vec<String> {
        self.found.values().cloned().collect()
    }

    /// Processes that could not be walked, and frames left unnamed.
    pub fn warnings(&self) -> Vec<Warning> {
        let mut out: Vec<Warning> = self
            .failed
            .iter()
            .take(5)
            .map(|(pid, why)| Warning::unwalked(format!("PID {pid}: no Python frames: {why}")))
            .collect();
        if let Some(why) = &self.denied_why {
            out.push(Warning::unnamed(format!(
                "{} Python frames are [python]: their names are read from the process's \
                 memory, which rtrace may not read ({why}): run rtrace as root, as the \
                 process's user, or with CAP_SYS_PTRACE",
                self.denied
            )));
        }
        if self.cut_lines > 0 {
            out.push(Warning::unnamed(format!(
                "{} Python frames have no line: only the first {LINES_BYTES} bytes of their \
                 functions' line tables were copied by the kernel, and the rest is read from \
                 the process's memory, which rtrace may not read: run rtrace as root, as the \
                 process's user, or with CAP_SYS_PTRACE",
                self.cut_lines
            )));
        }
        if self.unnamed > 0 {
            out.push(Warning::unnamed(format!(
                "{} Python frames are [python]: their code object was gone (the process \
                 exited, or freed it) before it could be read",
                self.unnamed
            )));
        }
        out
    }

    /// Opens process `who`'s memory while it lives, through `dir` (the
    /// [`crate::kernel::procmaps::proc_dir`] its mappings were read
    /// from); a process whose memory rtrace may not read is kept, with
    /// why, for the warning.
    fn open_mem(&mut self, who: Proc, dir: &crate::kernel::procmaps::ProcDir) -> Mem {
        let mem = open_mem_in(who, dir);
        if let Mem::Denied(why) = &mem {
            let line = format!("PID {} ({}): {why}", who.pid, comm(who.pid));
            self.denied_procs.insert(who, line);
        }
        mem
    }

    /// Finds the interpreter in `pid`'s mappings.
    fn find(&mut self, maps: &MapsOnce) -> Result<Option<PyProcess>, String> {
        let who = maps.who();
        let pid = who.pid;
        let (Some(proc_dir), Some(maps)) = (maps.dir(), maps.get()) else {
            return Ok(None);
        };
        let exe = std::fs::read_link(format!("{proc_dir}/exe")).ok();
        let mut libc = None;
        let mut asyncio = None;
        let mut found = None;
        for m in maps {
            let Some(path) = m.path() else { continue };
            let name = path.rsplit('/').next().unwrap_or(path);
            if name.starts_with("libc.so") || name.starts_with("libc-") {
                libc.get_or_insert(m);
            }
            if name.starts_with("_asyncio.cpython-") && m.offset == 0 {
                asyncio.get_or_insert(m);
            }
            let candidate = m.offset == 0
                && found.is_none()
                && (name.starts_with("libpython3")
                    || exe.as_deref().is_some_and(|e| e.as_os_str() == path)
                    || name.starts_with("python3"));
            if !candidate {
                continue;
            }
            let key = (u64::from(m.dev.0) << 32 | u64::from(m.dev.1), m.inode);
            let file = match self.files.get(&key) {
                Some(f) => f.clone(),
                None => {
                    let f = m
                        .open(proc_dir)
                        .ok()
                        .and_then(|f| read_file(&f, name).transpose())
                        .transpose()?
                        .map(Arc::new);
                    self.files.insert(key, f.clone());
                    f
                }
            };
            if let Some(f) = file {
                found = Some((f, m.clone()));
            }
        }
        let Some((file, m)) = found else {
            return Ok(None);
        };
        // The candidates are mappings of offset 0.
        let bias = m.start.wrapping_sub(file.base);
        let key_block = match libc {
            Some(l) => self.key_block(l, proc_dir),
            None => None,
        }
        .or_else(own_key_block)
        .ok_or("cannot tell where glibc keeps a thread's pthread keys")?;
        let mem = self.open_mem(who, proc_dir);
        let moved = |(a, b): (u64, u64)| if a == b { (0, 0) } else { (a + bias, b + bias) };
        let mut record = file.layout.record(
            [moved(file.eval[0]), moved(file.eval[1])],
            [
                file.code_type + bias,
                file.unicode_type + bias,
                file.long_type + bias,
            ],
            file.runtime + bias + file.layout.rt_tss - 4,
            key_block,
            self.lines,
        );
        record.salt = who.salt();
        // 3.14's task frames, once the process has loaded `_asyncio`
        // (it is looked at again when it maps new code).
        if let Some(m) = asyncio
            && record.gen_iframe != 0
            && !self.no_tasks
            && let Some(a) = self.asyncio(m, proc_dir)
        {
            record.ts_running_task = a.running_task;
            record.task_coro = a.task_coro;
            record.task_name = a.task_name;
        }
        Ok(Some(PyProcess {
            file,
            bias,
            mem,
            checked: false,
            record,
            comm: comm(pid),
            held: false,
        }))
    }

    /// What the `_asyncio` module mapped at `m` says of tasks.
    fn asyncio(&mut self, m: &Mapping, proc_dir: &str) -> Option<Asyncio> {
        once_a_file(&mut self.asyncio_files, m, proc_dir, read_asyncio)
    }

    /// Where the libc mapped at `m` keeps a thread's first pthread keys,
    /// from its `pthread_getspecific`.
    fn key_block(&mut self, m: &Mapping, proc_dir: &str) -> Option<i64> {
        once_a_file(&mut self.key_blocks, m, proc_dir, libc_key_block)
    }
}

/// What `read` finds in the file mapped at `m`, read once a file (by its
/// device and inode) and kept in `cache`.
fn once_a_file<T: Copy>(
    cache: &mut HashMap<(u64, u64), Option<T>>,
    m: &Mapping,
    proc_dir: &str,
    read: fn(&File) -> Option<T>,
) -> Option<T> {
    let key = (u64::from(m.dev.0) << 32 | u64::from(m.dev.1), m.inode);
    *cache
        .entry(key)
        .or_insert_with(|| m.open(proc_dir).ok().and_then(|f| read(&f)))
}

/// Where 3.14's asyncio keeps what the walk needs for task frames, from
/// the `.AsyncioDebug` section of the `_asyncio` module (CPython's
/// `_Py_AsyncioModuleDebugOffsets`, for external tools).
#[derive(Clone, Copy, Debug)]
struct Asyncio {
    /// `_PyThreadStateImpl.asyncio_running_task`.
    running_task: u16,
    /// The task object's `task_coro` and `task_name`.
    task_coro: u16,
    task_name: u16,
}

/// Reads an `_asyncio` module's `.AsyncioDebug` section: the task
/// object's size and fields (`task_name`, `task_awaited_by`,
/// `task_is_task`, `task_awaited_by_is_set`, `task_coro`, `task_node`),
/// the interpreter's (size, `asyncio_tasks_head`), the thread state's
/// (size, `asyncio_running_loop`, `asyncio_running_task`,
/// `asyncio_tasks_head`): 13 words.
fn read_asyncio(f: &File) -> Option<Asyncio> {
    use object::{Object as _, ObjectSection as _};
    let data = crate::kernel::memory::Mapped::of(f).ok()?;
    let elf = object::File::parse(&*data).ok()?;
    let section = elf.section_by_name(".AsyncioDebug")?;
    let bytes = section.data().ok()?;
    let w: Vec<u64> = bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
        .collect();
    if w.len() < 13 {
        return None;
    }
    let (task_size, name, coro) = (w[0], w[1], w[5]);
    let (ts_size, running) = (w[9], w[11]);
    // Fields inside their structs, the task's two within one read.
    let fits = name + 8 <= task_size
        && coro + 8 <= task_size
        && running + 8 <= ts_size
        && name.abs_diff(coro) + 8 <= 128
        && ts_size < 1 << 16;
    fits.then_some(Asyncio {
        running_task: running as u16,
        task_coro: coro as u16,
        task_name: name as u16,
    })
}

/// The process's command name.
fn comm(pid: u32) -> String {
    crate::kernel::comm_of(pid).unwrap_or_default()
}

/// Reads an ELF file that may hold an interpreter (`name` is its file
/// name): `None` if it defines no `_PyRuntime`; an error if it does but
/// its version cannot be walked.
fn read_file(f: &File, name: &str) -> Result<Option<PyFile>, String> {
    use object::{Object as _, ObjectSymbol as _};
    let Ok(data) = crate::kernel::memory::Mapped::of(f) else {
        return Ok(None);
    };
    let Ok(elf) = object::File::parse(&*data) else {
        return Ok(None);
    };
    // Most files looked at are other programs' (every process's own is):
    // a search of their string table passes over those at once.
    if !crate::kernel::elf::dynstr_holds(&elf, "_PyRuntime") {
        return Ok(None);
    }
    let mut syms: HashMap<&str, (u64, u64)> = HashMap::new();
    for s in elf.dynamic_symbols() {
        if s.is_undefined() {
            continue;
        }
        if let Ok(n) = s.name()
            && matches!(
                n,
                "_PyRuntime"
                    | "PyCode_Type"
                    | "PyUnicode_Type"
                    | "PyLong_Type"
                    | "_PyEval_EvalFrameDefault"
                    | "Py_Version"
            )
        {
            syms.insert(n, (s.address(), s.size()));
        }
    }
    let Some(&(runtime, _)) = syms.get("_PyRuntime") else {
        return Ok(None);
    };
    let read = |addr: u64, len: usize| -> Option<&[u8]> {
        let off = crate::kernel::elf::vaddr_to_offset(&elf, addr)? as usize;
        data.get(off..off + len)
    };
    // 3.11+ says its version in `Py_Version`; 3.10 only in its name.
    let hex = syms
        .get("Py_Version")
        .and_then(|&(a, _)| read(a, 4))
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    let (minor, version) = match hex {
        Some(h) => (
            ((h >> 16) & 0xff) as u8,
            format!("3.{}.{}", (h >> 16) & 0xff, (h >> 8) & 0xff),
        ),
        None => {
            let minor = name
                .split("python3.")
                .nth(1)
                .and_then(|r| {
                    r.split(|c: char| !c.is_ascii_digit())
                        .next()?
                        .parse::<u8>()
                        .ok()
                })
                .ok_or("its version cannot be told (no Py_Version)")?;
            (minor, format!("3.{minor}"))
        }
    };
    if !(10..=14).contains(&minor) {
        return Err(format!(
            "Python {version} is not supported (3.10 to 3.14 are)"
        ));
    }
    let layout = if minor >= 13 {
        // 3.14's table is 95 words, 3.13's 73.
        let words = if minor == 13 { 73 } else { 95 };
        let bytes = read(runtime, 8 * words).ok_or("cannot read its _Py_DebugOffsets")?;
        if &bytes[..8] != b"xdebugpy" {
            return Err(format!(
                "Python {version}: _PyRuntime has no _Py_DebugOffsets"
            ));
        }
        let words: Vec<u64> = bytes
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
            .collect();
        Layout::debug_offsets(minor, &words).map_err(|e| format!("Python {version}: {e}"))?
    } else {
        Layout::table(minor).ok_or_else(|| format!("Python {version} is not supported"))?
    };
    // The key as this build's own code reads it, where its code says;
    // else the version's usual place (checked against the live
    // interpreter before use either way).
    let mut layout = layout;
    if let Some(key) = tss_key_from_code(&elf, &data, runtime) {
        layout.rt_tss = key;
    }
    let need = |n: &str| {
        syms.get(n)
            .copied()
            .ok_or_else(|| format!("Python {version}: {name} does not export {n}"))
    };
    let (eval, eval_size) = need("_PyEval_EvalFrameDefault")?;
    let eval = (eval, eval + eval_size.max(1));
    let code_type = need("PyCode_Type")?.0;
    let unicode_type = need("PyUnicode_Type")?.0;
    let long_type = need("PyLong_Type")?.0;
    let base = crate::kernel::elf::offset_to_vaddr(&elf, 0)
        .ok_or_else(|| format!("Python {version}: {name} has no segment at offset 0"))?
        & !0xfff;
    Ok(Some(PyFile {
        version,
        layout,
        runtime,
        code_type,
        unicode_type,
        long_type,
        eval: [eval, split_part(&elf, &data, eval).unwrap_or((0, 0))],
        base,
    }))
}

/// The other part of function `f` (its symbol's range), where the
/// compiler split it in two: GCC moves blocks it deems cold (or, in
/// Debian sid's 3.14, the interpreter loop's whole body) to a range of
/// their own, with an FDE of its own, which the function's code reaches
/// by jumps, never by calls. The part is the FDE that holds the jumps'
/// targets outside `f`, if they all fall in one that does not begin as
/// a function does (a jump to another function's entry is a tail call).
fn split_part(elf: &object::File, data: &[u8], f: (u64, u64)) -> Option<(u64, u64)> {
    let off = crate::kernel::elf::vaddr_to_offset(elf, f.0)? as usize;
    let code = data.get(off..off + (f.1 - f.0) as usize)?;
    let mut dec = iced_x86::Decoder::with_ip(64, code, f.0, iced_x86::DecoderOptions::NONE);
    let targets: Vec<u64> = dec
        .iter()
        // Jumps, conditional or not: every near branch but a call.
        .filter(|i| {
            i.op0_kind() == iced_x86::OpKind::NearBranch64
                && i.mnemonic() != iced_x86::Mnemonic::Call
        })
        .map(|i| i.near_branch_target())
        .filter(|t| !(f.0..f.1).contains(t))
        .collect();
    if targets.is_empty() {
        return None;
    }
    let fdes = crate::stacks::cfi::fdes_holding(elf, &targets).ok()?;
    let part = |t: u64| fdes.iter().find(|r| r.start <= t && t < r.end);
    let first = part(targets[0]).filter(|r| !r.entry)?;
    targets
        .iter()
        .all(|&t| part(t) == Some(first))
        .then_some((first.start, first.end))
}

/// `_PyRuntime.autoTSSkey._key`'s usual offset in 3.13 and 3.14, which
/// their `_Py_DebugOffsets` do not give: read from Debian's builds'
/// `PyGILState_GetThisThreadState` ([`tss_key_from_code`]; 3.13 inlines
/// it to a load of `_PyRuntime+0x874`, 3.14 passes `_PyRuntime+0x920`,
/// the `Py_tss_t`, whose key follows its `int` flag).
fn debug_offsets_tss(minor: u8) -> u64 {
    if minor == 13 { 2164 } else { 0x924 }
}

/// Where `_PyRuntime.autoTSSkey._key` is (its offset in `_PyRuntime`, at
/// `runtime` in the file), as the interpreter's own
/// `PyGILState_GetThisThreadState` finds it: the word it passes to
/// `pthread_getspecific` (a load of the key), or the `Py_tss_t` it passes
/// to `PyThread_tss_get` or `PyThread_tss_is_created` (an address, whose
/// key follows its `int` flag). The address is RIP-relative, an immediate
/// (a binary not built position-independent), or `_PyRuntime`'s from the
/// GOT plus a displacement (a shared libpython). A build configured
/// otherwise than the one the version's table was read from has its own
/// layout; its code says where.
fn tss_key_from_code(elf: &object::File, data: &[u8], runtime: u64) -> Option<u64> {
    use iced_x86::{Mnemonic, OpKind, Register};
    use object::{Object as _, ObjectSymbol as _, ObjectSymbolTable as _};
    let f = elf
        .dynamic_symbols()
        .find(|s| s.name() == Ok("PyGILState_GetThisThreadState") && !s.is_undefined())?;
    let off = crate::kernel::elf::vaddr_to_offset(elf, f.address())? as usize;
    let code = data.get(off..off + 96.min(data.len().saturating_sub(off)))?;
    // The GOT slots that hold `_PyRuntime`'s address.
    let symbols = elf.dynamic_symbol_table();
    let got: Vec<u64> = elf
        .dynamic_relocations()
        .into_iter()
        .flatten()
        .filter(|(_, r)| match r.target() {
            object::RelocationTarget::Symbol(i) => symbols
                .as_ref()
                .and_then(|t| t.symbol_by_index(i).ok())
                .is_some_and(|s| s.name() == Ok("_PyRuntime")),
            _ => false,
        })
        .map(|(at, _)| at)
        .collect();
    /// What the walk knows a register holds: an address, or the 32-bit
    /// word loaded from one.
    #[derive(Clone, Copy)]
    enum Held {
        Addr(u64),
        Word(u64),
    }
    let mut held: HashMap<Register, Held> = HashMap::new();
    let mut dec = iced_x86::Decoder::with_ip(64, code, f.address(), iced_x86::DecoderOptions::NONE);
    for _ in 0..24 {
        let ins = dec.decode();
        if ins.is_invalid() {
            return None;
        }
        // The address a memory operand names, where it is known.
        let place = |held: &HashMap<Register, Held>| -> Option<u64> {
            if ins.memory_index() != Register::None {
                return None;
            }
            match ins.memory_base() {
                Register::RIP | Register::None => Some(ins.memory_displacement64()),
                b => match held.get(&b) {
                    Some(Held::Addr(a)) => Some(a.wrapping_add(ins.memory_displacement64())),
                    _ => None,
                },
            }
        };
        let dst = ins.op0_register().full_register();
        match ins.mnemonic() {
            Mnemonic::Call | Mnemonic::Jmp => {
                let key = match held.get(&Register::RDI) {
                    Some(Held::Addr(a)) => a.wrapping_add(4),
                    Some(Held::Word(a)) => *a,
                    None => return None,
                };
                let k = key.wrapping_sub(runtime);
                return (k < 0x4000).then_some(k);
            }
            Mnemonic::Lea if ins.op0_kind() == OpKind::Register => match place(&held) {
                Some(a) => held.insert(dst, Held::Addr(a)),
                None => held.remove(&dst),
            },
            Mnemonic::Mov if ins.op0_kind() == OpKind::Register => {
                let v = match ins.op1_kind() {
                    OpKind::Register => held.get(&ins.op1_register().full_register()).copied(),
                    OpKind::Immediate32 | OpKind::Immediate32to64 | OpKind::Immediate64 => {
                        Some(Held::Addr(ins.immediate(1)))
                    }
                    OpKind::Memory => place(&held).and_then(|a| {
                        if got.contains(&a) {
                            Some(Held::Addr(runtime))
                        } else if ins.op0_register().size() == 4 {
                            Some(Held::Word(a))
                        } else {
                            None
                        }
                    }),
                    _ => None,
                };
                match v {
                    Some(v) => held.insert(dst, v),
                    None => held.remove(&dst),
                }
            }
            // Anything else that writes a register forgets what it held.
            _ if ins.op0_kind() == OpKind::Register
                && !matches!(
                    ins.mnemonic(),
                    Mnemonic::Cmp | Mnemonic::Test | Mnemonic::Push
                ) =>
            {
                held.remove(&dst)
            }
            _ => None,
        };
    }
    None
}

/// Where glibc keeps a thread's first 32 pthread keys, from the thread
/// pointer, as its `pthread_getspecific` reads them: `add $N, reg; shl $4,
/// reg` then a read at `fs:0x10 + reg + 8`, so the block is at `N * 16`.
fn libc_key_block(f: &File) -> Option<i64> {
    use object::{Object as _, ObjectSymbol as _};
    let data = crate::kernel::memory::Mapped::of(f).ok()?;
    let elf = object::File::parse(&*data).ok()?;
    let sym = elf
        .dynamic_symbols()
        .find(|s| s.name() == Ok("pthread_getspecific") && !s.is_undefined())?;
    let off = crate::kernel::elf::vaddr_to_offset(&elf, sym.address())? as usize;
    let code = data.get(off..off + 64)?;
    let mut dec = iced_x86::Decoder::with_ip(64, code, 0, iced_x86::DecoderOptions::NONE);
    let mut added: Option<(iced_x86::Register, i64)> = None;
    for _ in 0..12 {
        let ins = dec.decode();
        if ins.is_invalid() {
            return None;
        }
        use iced_x86::{Mnemonic, OpKind};
        match ins.mnemonic() {
            Mnemonic::Add
                if ins.op0_kind() == OpKind::Register
                    && matches!(
                        ins.op1_kind(),
                        OpKind::Immediate8to64 | OpKind::Immediate32to64 | OpKind::Immediate8
                    ) =>
            {
                added = Some((ins.op0_register(), ins.immediate(1) as i64));
            }
            Mnemonic::Shl if ins.op0_kind() == OpKind::Register => {
                if let Some((reg, n)) = added
                    && reg == ins.op0_register()
                    && ins.immediate(1) == 4
                {
                    return Some(n * 16);
                }
            }
            _ => {}
        }
    }
    None
}

/// Where this process's glibc keeps a thread's first pthread keys,
/// measured once: a thread sets a key to a mark and finds it after its
/// thread pointer. For a libc whose code does not say ([`libc_key_block`]).
fn own_key_block() -> Option<i64> {
    static MEASURED: std::sync::OnceLock<Option<i64>> = std::sync::OnceLock::new();
    *MEASURED.get_or_init(measure_key_block)
}

/// See [`own_key_block`].
fn measure_key_block() -> Option<i64> {
    std::thread::spawn(|| {
        let mut key: libc::pthread_key_t = 0;
        // SAFETY: plain libc calls on this thread's own key.
        unsafe {
            if libc::pthread_key_create(&mut key, None) != 0 {
                return None;
            }
            const MARK: usize = 0x5059_7468_6f6e_2121;
            libc::pthread_setspecific(key, MARK as *const libc::c_void);
            let mut fs: u64 = 0;
            // ARCH_GET_FS
            libc::syscall(libc::SYS_arch_prctl, 0x1003, &mut fs as *mut u64);
            let base = fs as *const u64;
            let found = (0..512).find(|&i| std::ptr::read_volatile(base.add(i)) as usize == MARK);
            libc::pthread_key_delete(key);
            let at = found? as i64 * 8;
            (key < 32).then(|| at - 8 - 16 * i64::from(key))
        }
    })
    .join()
    .ok()
    .flatten()
}

/// Reads `len` bytes of the process's memory at `addr`.
fn read_mem(p: &PyProcess, addr: u64, len: usize) -> Option<Vec<u8>> {
    p.mem.read(addr, len)
}

fn read_u64(p: &PyProcess, addr: u64) -> Option<u64> {
    let b = read_mem(p, addr, 8)?;
    Some(u64::from_le_bytes(b.try_into().ok()?))
}

/// `-v`'s line for process `pid`'s interpreter: `lead` after its version,
/// then `how` and `tail` in parentheses, around how its memory is read.
fn found_line(pid: u32, p: &PyProcess, lead: &str, how: &str, tail: &str) -> String {
    format!(
        "PID {pid} ({}): Python {}{lead} ({how}{}{tail})",
        p.comm,
        p.file.version,
        p.mem.how()
    )
}

/// How the process's offsets were checked, for [`found_line`]; `state`
/// says where the interpreter was when no live frame could check them.
fn offsets_checked(p: &PyProcess, state: &str) -> String {
    match &p.mem {
        Mem::Denied(why) => format!("offsets checked by type in the kernel; {why}"),
        _ if p.checked => "offsets checked against a live frame".to_owned(),
        _ => format!("{state}: offsets checked by type in the kernel"),
    }
}

/// Whether the process's interpreter has started (its runtime lists an
/// interpreter); `None` where its memory cannot be read.
fn started(p: &PyProcess) -> Option<bool> {
    let runtime = p.file.runtime + p.bias;
    read_u64(p, runtime + p.file.layout.rt_interp_head).map(|i| i != 0)
}

/// Whether the program of the process whose `/proc` directory is
/// `proc_dir` is some other than Python's own, which then links or loads
/// libpython to embed it; `false` where it cannot be told.
fn embeds_python(proc_dir: &str) -> bool {
    std::fs::read_link(format!("{proc_dir}/exe")).is_ok_and(|exe| {
        super::runtimes::by_name(&exe) & rtrace_common::unwind::RUNTIME_PYTHON == 0
    })
}

/// Checks the offsets against the live interpreter: a thread state whose
/// interpreter is the runtime's, and its frames' code objects of type
/// code. `Ok(false)`: not running Python yet.
fn check(p: &PyProcess) -> Result<bool, String> {
    // The process runs on while it is read: a frame pushed or popped
    // meanwhile can show a code pointer not yet (or no longer) written.
    // Offsets that do not match fail every time; a race, rarely twice.
    let mut last = Ok(false);
    for _ in 0..5 {
        last = check_once(p);
        if last.is_ok() {
            return last;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    last
}

/// One read of the chains [`check`] checks.
fn check_once(p: &PyProcess) -> Result<bool, String> {
    let l = &p.file.layout;
    let runtime = p.file.runtime + p.bias;
    let code_type = p.file.code_type + p.bias;
    let Some(interp) = read_u64(p, runtime + l.rt_interp_head) else {
        return Ok(false);
    };
    if interp == 0 {
        return Ok(false);
    }
    let mut ts = read_u64(p, interp + l.is_threads_head).unwrap_or(0);
    let mut frames = 0;
    for _ in 0..64 {
        if ts == 0 {
            break;
        }
        if read_u64(p, ts + l.ts_interp) != Some(interp) {
            return Err(format!(
                "Python {}: a thread state does not point back to its interpreter (offsets \
                 do not match this build)",
                p.file.version
            ));
        }
        let mut f = read_u64(p, ts + l.ts_frame).unwrap_or(0);
        if l.minor == 11 || l.minor == 12 {
            f = if f == 0 {
                0
            } else {
                read_u64(p, f + l.cframe_current).unwrap_or(0)
            };
        }
        for _ in 0..8 {
            if f == 0 {
                break;
            }
            // 3.14's `f_executable` is a tagged reference: its low bits
            // mark how it is counted, not where it is.
            let code = read_u64(p, f + l.fr_code).unwrap_or(0) & !3;
            let ty = read_u64(p, code + 8).unwrap_or(0);
            if ty == code_type {
                frames += 1;
            } else if l.minor < 12 {
                return Err(format!(
                    "Python {}: a frame's code is not a code object (offsets do not match \
                     this build)",
                    p.file.version
                ));
            }
            f = read_u64(p, f + l.fr_back).unwrap_or(0);
        }
        ts = read_u64(p, ts + l.ts_next).unwrap_or(0);
    }
    Ok(frames > 0)
}

/// Reads code object `addr` of `p`, if it is still the one whose check
/// the walk computed.
fn read_code(p: &PyProcess, addr: u64, check: u32) -> Option<PyName> {
    let l = &p.file.layout;
    let head = read_mem(p, addr, 256)?;
    let word = |off: u64| -> u64 {
        let o = off as usize;
        head.get(o..o + 8)
            .map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap_or_default()))
    };
    if word(8) != p.file.code_type + p.bias {
        return None;
    }
    let firstlineno = word(l.co_firstlineno) as u32;
    let (name, file) = (word(l.co_name), word(l.co_filename));
    if code_check(firstlineno, name, file) != check {
        return None;
    }
    let qualname = read_str(p, word(l.co_qualname))?;
    let filename = read_str(p, file)?;
    let linetable = read_bytes(p, word(l.co_linetable)).unwrap_or_default();
    let module = module_of(&filename);
    Some(PyName {
        name: Arc::from(format!("{module}.{qualname}")),
        file: Arc::from(filename),
        firstlineno,
        linetable,
        cut: false,
        minor: l.minor,
    })
}

/// Names a code object by what the kernel copied of it (`c`), in a
/// process of 3.`minor` (unknown: its process already gone), and says
/// whether that is whole: its name and file not cut short, and under
/// `lines` its line table too. `None` where the kernel could not copy
/// its name and file.
fn copied_name(c: &PyCode, minor: Option<u8>, lines: bool) -> Option<(PyName, bool)> {
    let (name_kind, file_kind) = (c.kinds as u8, (c.kinds >> 8) as u8);
    let (qualname, name_whole) = copied_str(&c.name, c.name_len, name_kind, false)?;
    let (file, file_whole) = copied_str(&c.file, c.file_len, file_kind, true)?;
    let table = (c.lines_len != u32::MAX).then(|| {
        let n = (c.lines_len as usize).min(LINES_BYTES);
        (c.lines[..n].to_vec(), n == c.lines_len as usize)
    });
    let (linetable, table_whole) = table.unwrap_or_default();
    let module = module_of(&file);
    let name = PyName {
        name: Arc::from(format!("{module}.{qualname}")),
        file: Arc::from(file),
        firstlineno: c.firstlineno,
        linetable,
        cut: !table_whole,
        minor: minor.unwrap_or(11),
    };
    let whole = name_whole && file_whole && (!lines || (table_whole && minor.is_some()));
    Some((name, whole))
}

/// The text of a string of `len` bytes of `kind` (1: Latin-1, 2: UCS-2,
/// 4: UCS-4) of which `buf` holds the head, or the tail if `tail`; cut
/// strings are marked with `…` where they were cut. With whether it is
/// whole.
fn copied_str(buf: &[u8], len: u32, kind: u8, tail: bool) -> Option<(String, bool)> {
    if !matches!(kind, 1 | 2 | 4) {
        return None;
    }
    let len = len as usize;
    let n = len.min(buf.len());
    let text = decode(&buf[..n], kind);
    Some(match (n == len, tail) {
        (true, _) => (text, true),
        (false, true) => (format!("…{text}"), false),
        (false, false) => (format!("{text}…"), false),
    })
}

/// Characters of a CPython string's `kind` (1, 2 or 4 bytes each), as
/// it stores them.
fn decode(b: &[u8], kind: u8) -> String {
    match kind {
        1 => b.iter().map(|&c| char::from(c)).collect(),
        2 => char::decode_utf16(b.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])))
            .map(|c| c.unwrap_or('?'))
            .collect(),
        _ => b
            .chunks_exact(4)
            .map(|c| char::from_u32(u32::from_le_bytes([c[0], c[1], c[2], c[3]])).unwrap_or('?'))
            .collect(),
    }
}

/// A `str` object's text: compact strings only (every name and file the
/// compiler makes is one).
fn read_str(p: &PyProcess, addr: u64) -> Option<String> {
    let l = &p.file.layout;
    let head = read_mem(p, addr, 40)?;
    let w = |o: usize| u64::from_le_bytes(head[o..o + 8].try_into().unwrap_or_default());
    if w(8) != p.file.unicode_type + p.bias {
        return None;
    }
    let len = w(16) as usize;
    let state = w(32) as u32;
    let (kind, compact, ascii) = ((state >> 2) & 7, (state >> 5) & 1, (state >> 6) & 1);
    if compact == 0 || len > 4096 {
        return None;
    }
    if ascii == 1 {
        let b = read_mem(p, addr + l.ascii_size, len)?;
        return String::from_utf8(b).ok();
    }
    let b = read_mem(p, addr + l.compact_size, len * kind as usize)?;
    Some(decode(&b, kind as u8))
}

/// A `bytes` object's contents.
fn read_bytes(p: &PyProcess, addr: u64) -> Option<Vec<u8>> {
    let len = read_u64(p, addr + 16)? as usize;
    if len > 1 << 20 {
        return None;
    }
    read_mem(p, addr + 32, len)
}

/// The module a file is, as Python would import it: its path after the
/// library's directory or `site-packages`, dotted, or its base name.
fn module_of(file: &str) -> String {
    if let Some(inner) = file
        .strip_prefix("<frozen ")
        .and_then(|f| f.strip_suffix('>'))
    {
        return inner.to_owned();
    }
    let parts: Vec<&str> = file.split('/').collect();
    let start = parts
        .iter()
        .rposition(|p| {
            *p == "site-packages"
                || *p == "dist-packages"
                || *p == "lib-dynload"
                || (p.starts_with("python3") && !p.ends_with(".py"))
        })
        .map_or(parts.len().saturating_sub(1), |i| i + 1);
    let mut path: Vec<&str> = parts[start.min(parts.len())..].to_vec();
    if let Some(last) = path.last_mut() {
        *last = last.strip_suffix(".py").unwrap_or(last);
    }
    if path.len() > 1 && path.last() == Some(&"__init__") {
        path.pop();
    }
    path.join(".")
}

/// Reads one varint of a 3.11+ location table (six bits a byte, bit 6
/// set in all but the last).
fn varint(t: &[u8], i: &mut usize) -> Option<u32> {
    let mut v = 0u32;
    let mut shift = 0;
    loop {
        let b = *t.get(*i)?;
        *i += 1;
        v |= u32::from(b & 63) << shift;
        if b & 64 == 0 {
            return Some(v);
        }
        shift += 6;
        if shift > 30 {
            return None;
        }
    }
}

/// The line of code unit `lasti` in a 3.11+ location table
/// (`Objects/locations.md`).
fn line_311(t: &[u8], first: u32, lasti: u32) -> Option<u32> {
    let mut line = i64::from(first);
    let mut unit = 0u32;
    let mut i = 0;
    while i < t.len() {
        let b = t[i];
        i += 1;
        let code = (b >> 3) & 15;
        let len = u32::from(b & 7) + 1;
        let delta: i64 = match code {
            15 => 0,
            14 => {
                let v = varint(t, &mut i)?;
                let d = if v & 1 != 0 {
                    -i64::from(v >> 1)
                } else {
                    i64::from(v >> 1)
                };
                for _ in 0..3 {
                    varint(t, &mut i)?;
                }
                d
            }
            13 => {
                let v = varint(t, &mut i)?;
                if v & 1 != 0 {
                    -i64::from(v >> 1)
                } else {
                    i64::from(v >> 1)
                }
            }
            10..=12 => {
                i += 2;
                i64::from(code - 10)
            }
            _ => {
                i += 1;
                0
            }
        };
        line += delta;
        if lasti < unit + len {
            return (code != 15 && line > 0).then_some(line as u32);
        }
        unit += len;
    }
    None
}

/// The line of code unit `lasti` in a 3.10 line table (PEP 626: pairs of
/// a byte-offset step and a signed line step, -128 for none).
fn line_310(t: &[u8], first: u32, lasti: u32) -> Option<u32> {
    let target = lasti * 2;
    let mut line = i64::from(first);
    let mut end = 0u32;
    for pair in t.chunks_exact(2) {
        let start = end;
        end += u32::from(pair[0]);
        let d = pair[1] as i8;
        let this = if d == -128 {
            None
        } else {
            line += i64::from(d);
            Some(line)
        };
        if start <= target && target < end {
            return this.filter(|&l| l > 0).map(|l| l as u32);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use rtrace_common::python::NAME_BYTES;

    /// A record as the kernel fills it: `name` and `file` as Latin-1 of
    /// their whole lengths, cut as the kernel cuts them.
    fn record(name: &str, file: &str, table: Option<&[u8]>) -> PyCode {
        // SAFETY: a plain record, all of whose bytes may be zero.
        let mut c: PyCode = unsafe { std::mem::zeroed() };
        let n = name.len().min(c.name.len());
        c.name[..n].copy_from_slice(&name.as_bytes()[..n]);
        let f = file.len().min(c.file.len());
        c.file[..f].copy_from_slice(&file.as_bytes()[file.len() - f..]);
        c.name_len = name.len() as u32;
        c.file_len = file.len() as u32;
        c.kinds = 1 | 1 << 8;
        c.lines_len = u32::MAX;
        if let Some(t) = table {
            let n = t.len().min(LINES_BYTES);
            c.lines[..n].copy_from_slice(&t[..n]);
            c.lines_len = t.len() as u32;
        }
        c
    }

    /// The first 128 bytes of a compact ASCII string object holding
    /// `text`, followed by `after` (the heap past its allocation).
    fn ascii_object(text: &str, after: u8) -> [u64; 16] {
        let mut b = [after; 128];
        b[16..24].copy_from_slice(&(text.len() as u64).to_le_bytes());
        b[40..40 + text.len()].copy_from_slice(text.as_bytes());
        // The terminating zero, and the allocation's slack to its word.
        let end = 40 + text.len();
        b[end..(end + 8) & !7].fill(0);
        let mut w = [0u64; 16];
        for (i, c) in b.chunks_exact(8).enumerate() {
            w[i] = u64::from_le_bytes(c.try_into().unwrap());
        }
        w
    }

    #[test]
    fn a_task_names_check_is_its_own_and_not_the_heaps_after_it() {
        use rtrace_common::python::str_check;
        let check = |t: &str, after| str_check(&ascii_object(t, after), 40, t.len() as u64);
        for name in ["alpha", "fetch-user-41", "a-name-of-thirty-two-characters!"] {
            assert_eq!(check(name, 0xaa), check(name, 0x55), "{name}");
        }
        assert_ne!(check("fetch-user-41", 0), check("fetch-user-42", 0));
        assert_ne!(check("task-1-of-a-batch", 0), check("task-2-of-a-batch", 0));
        assert_ne!(check("alpha", 0), check("alphb", 0));
    }

    #[test]
    fn names_copied_by_the_kernel_say_where_they_were_cut() {
        let file = "/usr/lib/python3.11/json/decoder.py";
        let (n, whole) =
            copied_name(&record("JSONDecoder.decode", file, None), Some(11), false).unwrap();
        assert!(whole);
        assert_eq!(&*n.name, "json.decoder.JSONDecoder.decode");
        assert_eq!(&*n.file, file);
        // Under --lines a name with no table is not whole: the memory is
        // read for it where it may be.
        assert!(
            !copied_name(&record("f", file, None), Some(11), true)
                .unwrap()
                .1
        );
        assert!(
            copied_name(&record("f", file, Some(&[1, 2])), Some(11), true)
                .unwrap()
                .1
        );
        let long = format!("/srv/{}/app/views.py", "d".repeat(300));
        let (n, whole) =
            copied_name(&record(&"x".repeat(200), &long, None), Some(13), false).unwrap();
        assert!(!whole);
        assert!(
            n.file.starts_with('…') && n.file.ends_with("/app/views.py"),
            "{}",
            n.file
        );
        assert!(
            n.name
                .ends_with(&format!("views.{}…", "x".repeat(NAME_BYTES))),
            "{}",
            n.name
        );
        let (n, _) = copied_name(&record("f", file, Some(&[0; 300])), Some(11), true).unwrap();
        assert!(n.cut);
        // Nothing copied (not a compact string): no name from the kernel.
        let mut c = record("f", file, None);
        c.kinds = 0;
        assert!(copied_name(&c, Some(11), false).is_none());
    }

    #[test]
    fn modules_are_named_as_imported() {
        assert_eq!(
            module_of("/usr/lib/python3.11/json/decoder.py"),
            "json.decoder"
        );
        assert_eq!(module_of("/tmp/x/fixture.py"), "fixture");
        assert_eq!(
            module_of("/usr/lib/python3/dist-packages/foo/__init__.py"),
            "foo"
        );
        assert_eq!(
            module_of("<frozen importlib._bootstrap>"),
            "importlib._bootstrap"
        );
        assert_eq!(module_of("<string>"), "<string>");
    }

    /// Every interpreter at hand, built as Debian builds them (the
    /// host's, and those of the trixie and sid roots) and as pyenv does
    /// (a shared libpython): the key its code reads is where the
    /// version's table says.
    #[test]
    fn the_runtimes_key_is_read_from_the_interpreters_code() {
        use object::{Object as _, ObjectSymbol as _};
        let home = std::env::var("HOME").unwrap_or_default();
        let cache = format!("{home}/.cache/rtrace");
        let mut files = vec!["/usr/bin/python3.11".to_owned()];
        files.push(format!("{cache}/trixie-root-1/usr/bin/python3.13"));
        files.push(format!("{cache}/sid-root-1/usr/bin/python3.14"));
        for v in ["3.10", "3.11", "3.12", "3.13"] {
            if let Ok(dir) = std::fs::read_dir(format!("{home}/.pyenv/versions")) {
                for d in dir.flatten() {
                    let n = d.file_name().to_string_lossy().into_owned();
                    if n.starts_with(&format!("{v}.")) {
                        files.push(format!(
                            "{home}/.pyenv/versions/{n}/lib/libpython{v}.so.1.0"
                        ));
                    }
                }
            }
        }
        let mut seen = 0;
        for path in files {
            let Ok(f) = File::open(&path) else { continue };
            let data = crate::kernel::memory::Mapped::of(&f).unwrap();
            let elf = object::File::parse(&*data).unwrap();
            let runtime = elf
                .dynamic_symbols()
                .find(|s| s.name() == Ok("_PyRuntime"))
                .unwrap()
                .address();
            let minor: u8 = path
                .rsplit("python3.")
                .next()
                .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok())
                .unwrap();
            let usual = if minor >= 13 {
                debug_offsets_tss(minor)
            } else {
                Layout::table(minor).unwrap().rt_tss
            };
            assert_eq!(
                tss_key_from_code(&elf, &data, runtime),
                Some(usual),
                "{path}"
            );
            seen += 1;
        }
        // The host's Debian python3.11 is there wherever the tests run.
        assert!(seen >= 1, "no interpreter to read");
    }

    /// This process's glibc: its code says where the keys are, and a
    /// thread setting one finds it there.
    #[test]
    fn glibc_key_block_is_read_from_its_code() {
        let measured = own_key_block().expect("measured");
        let libc = crate::kernel::procmaps::read(None)
            .unwrap()
            .into_iter()
            .find(|m| m.path().is_some_and(|p| p.contains("libc.so")))
            .expect("libc mapped");
        let f = libc.open("/proc/self").unwrap();
        assert_eq!(libc_key_block(&f), Some(measured));
    }
}

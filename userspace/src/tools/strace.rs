//! `rtrace strace`: every syscall of a process, a command or the system,
//! in strace's layout and with strace's command line, from one program on
//! each `raw_syscalls` tracepoint instead of a ptrace stop at every call.
//! Arguments are named and typed by the kernel's own syscall tracepoint
//! formats ([`decode`]); strings, buffers and the structs that matter are
//! read in the kernel. `-c` keeps its summary in the kernel.

mod decode;
mod fds;
mod table;

use crate::tracer::{Outcome, Plan, Spec};
use std::{
    collections::{BTreeMap, HashMap},
    fmt::Write as _,
    sync::Arc,
    time::Duration,
};

use anyhow::Context as _;
use aya::{
    Ebpf,
    maps::{Array, PerCpuArray},
};
use rtrace_common::strace::{
    BLOB, Config, ERR_NAMES, Event, FLAG_EXEC_DONE, FLAG_FIXED_SLOTS, FLAG_NO_ENTRY,
    FLAG_NO_RETURN, HEADER_SIZE, KIND_EXEC, KIND_EXIT, KIND_FORK, KIND_SIGNAL, KIND_SYSCALL,
    MAX_STRING_LIMIT, MAX_SYSCALLS, PROG_EXEC, PROG_EXIT, PROG_FORK, PROG_SIGNAL, PROG_STACK,
    PROG_SYS_ENTER, PROG_SYS_EXIT, PidNr, ProcTotals, SUMMARY, SUMMARY_BY_PID, SYSCALLS, Syscall,
    Totals,
};
use serde::Serialize;

use crate::engine::stacktool::{StackTool, Unwind};
use crate::{
    kernel::{
        features::Mechanism,
        load::{Hooks, Kernel, Load, map, map_mut},
        transport::BufferArgs,
    },
    output::{Record, Sink},
    tracer::{Scope, ScopeArgs, Tool, own},
};
use decode::{Decl, Table};

#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:
  rtrace strace -- ls /tmp                 # every syscall of a command and its children
  rtrace strace -p 185                     # every syscall of PID 185's threads, until Ctrl-C
  rtrace strace -c -- make                 # strace -c's summary of a build
  rtrace strace -e trace=%file -tt -T -p 185   # file syscalls, with times and durations
  rtrace strace -Z -e trace=open,openat -- app # failed opens only
  rtrace strace --duration 10 -p 185       # calls that took 10 ms or more
  rtrace strace -s 128 -o trace.txt -- curl -s example.com
  rtrace strace -y -f -p 185                # descriptors with paths; 185's children too")]
/// Trace system calls as strace does, without stopping the traced
/// processes: one line a syscall with its arguments, strings read in the
/// kernel, or strace -c's summary counted there.
pub struct Args {
    /// Follow children (strace's -f): -p's processes' children are traced
    /// from their fork; a command's always are, and -p's threads.
    #[arg(short = 'f')]
    follow: bool,
    /// The most bytes of a data buffer or a string shown (strace's -s; at
    /// most 512). Paths are shown whole, as strace shows them.
    #[arg(
        short = 's',
        long = "string-limit",
        value_name = "N",
        default_value_t = 32
    )]
    string_limit: u32,
    /// Which syscalls to show: trace=NAME,NAME,... with strace's classes
    /// (%file, %network, %process, %memory, %signal, %desc) and ! to
    /// negate.
    #[arg(short = 'e', long = "expr", value_name = "EXPR")]
    expr: Vec<String>,
    /// Print strace -c's summary (time, calls, errors a syscall) instead
    /// of lines.
    #[arg(short = 'c', long = "summary-only")]
    summary_only: bool,
    /// Print lines and the summary.
    #[arg(short = 'C', long = "summary", conflicts_with = "summary_only")]
    summary: bool,
    /// The summary split by process, as perf trace -s splits it: each
    /// process's table (alone, as -c; with -C, after the lines).
    #[arg(long)]
    summary_by_process: bool,
    /// Only calls that failed.
    #[arg(short = 'Z', long = "failed-only")]
    failed_only: bool,
    /// Only calls that took at least MS milliseconds (fractions allowed).
    #[arg(long, value_name = "MS")]
    duration: Option<f64>,
    /// Time of day on each line: -t seconds, -tt microseconds, -ttt
    /// seconds since the epoch.
    #[arg(short = 't', action = clap::ArgAction::Count)]
    times: u8,
    /// The time spent in each call, at the end of its line.
    #[arg(short = 'T')]
    spent: bool,
    /// Each descriptor with its path, as 3</etc/hostname> (strace's -y).
    #[arg(short = 'y', long = "decode-fds")]
    decode_fds: bool,
    /// The user stack of each call, walked at its entry in the kernel from
    /// the program's call frame information (strace's -k).
    #[arg(short = 'k', long = "stack-trace")]
    stack_trace: bool,
    /// Quieter, as strace's -q: -qq leaves out the `+++ exited with N +++`
    /// lines of the processes' exits (rtrace prints no attach and detach
    /// messages for -q to leave out).
    #[arg(short = 'q', action = clap::ArgAction::Count)]
    quiet: u8,
    /// strace's padding of the return to column 40: `rtrace trace`'s
    /// view (perf trace's, with this engine) keeps one space.
    #[arg(skip = true)]
    pad_return: bool,
    #[command(flatten)]
    scope: ScopeArgs<{ own::C | own::UPPER_C | own::T }>,
    #[command(flatten)]
    buffer: BufferArgs,
}

/// Processes `-f` follows beside those `-p` names, at most: the id
/// table's room.
const MAX_FOLLOWED: u32 = 16384;

/// What `rtrace trace` with no probe asks of strace's engine beside its
/// scope.
#[derive(Debug, Clone, Copy)]
pub struct TraceFlags {
    /// strace's `-t` count.
    pub times: u8,
    /// perf trace's `-s`: the summary by process, instead of lines.
    pub summary: bool,
    /// Only calls that took at least this many milliseconds.
    pub duration: Option<f64>,
}

impl Args {
    /// The arguments `rtrace trace` runs with when it is given no probe:
    /// perf trace's view with strace's engine and layout.
    pub fn for_trace(
        scope: ScopeArgs<{ own::C | own::UPPER_C | own::T }>,
        buffer: BufferArgs,
        flags: TraceFlags,
    ) -> Self {
        Self {
            // perf trace -p follows no children.
            follow: false,
            string_limit: 32,
            expr: Vec::new(),
            summary_only: flags.summary,
            summary: false,
            summary_by_process: flags.summary,
            failed_only: false,
            duration: flags.duration,
            times: flags.times,
            spent: false,
            decode_fds: false,
            stack_trace: false,
            quiet: 0,
            pad_return: false,
            scope,
            buffer,
        }
    }
}

/// The tool.
pub struct Strace {
    args: Args,
    table: Arc<Table>,
    /// Syscall numbers shown (`-e trace=`).
    shown: Vec<bool>,
    /// Exec arguments sent at entry, by thread, until the exit.
    execs: HashMap<u32, Event>,
    /// The process whose lines carry no `[pid N]` (the command, or the
    /// first `-p`), when lines go to a file without `-f`.
    first: Option<u32>,
    /// The tasks traced and when they lived, as far as the lines tell: on
    /// a terminal, strace marks every line `[pid N]` while there are more
    /// than one.
    lives: Lives,
    /// The thread and the time of the last line printed, for strace's
    /// `<unfinished ...>`.
    last: (u32, u64),
    /// CLOCK_REALTIME minus CLOCK_MONOTONIC, for time of day.
    realtime_offset: i128,
    /// Lines printed.
    printed: u64,
    /// The command, until its exec succeeds: what it does before is
    /// rtrace's own start of it, which strace does not show either.
    before_exec: Option<u32>,
    /// Descriptors' paths (`-y`).
    fds: fds::Fds,
    /// With `-k`: the shared stack walk, its tables and symbolizer.
    stacks: Option<StackTool>,
    /// The processes traced from the start, whose tables the walk loads
    /// before their first call.
    first_pids: Vec<u32>,
}

impl Tool for Strace {
    type Args = Args;

    const SPEC: Spec = Spec::new("strace", &[], &ERR_NAMES)
        .expected(&rtrace_common::stacks::ERR_EXPECTED)
        .event_buffer(8 << 20);

    fn new(args: Args) -> anyhow::Result<Self> {
        if args.string_limit as usize > MAX_STRING_LIMIT {
            anyhow::bail!(
                "-s {}: at most {MAX_STRING_LIMIT} bytes are read",
                args.string_limit
            );
        }
        let table = Table::read();
        let shown = shown(&table, &args.expr)?;
        Ok(Self {
            args,
            table: Arc::new(table),
            shown,
            execs: HashMap::new(),
            first: None,
            lives: Lives::default(),
            last: (0, 0),
            realtime_offset: 0,
            printed: 0,
            before_exec: None,
            fds: fds::Fds::default(),
            stacks: None,
            first_pids: Vec::new(),
        })
    }

    fn scoped(&mut self, scope: &Scope) {
        self.first = scope.command_pid.or(scope.pids.first().copied());
        self.before_exec = scope.command_pid;
        if self.args.decode_fds {
            for &pid in scope.command_pid.iter().chain(&scope.pids) {
                self.fds.read_all(pid);
            }
        }
        self.first_pids = scope
            .command_pid
            .iter()
            .chain(&scope.pids)
            .copied()
            .collect();
    }

    fn variants(&self, _m: Option<Mechanism>, _kernel: &mut Kernel) -> Vec<&'static str> {
        StackTool::variants(Unwind::Auto, self.args.stack_trace)
    }

    fn configure(
        &mut self,
        _m: Option<Mechanism>,
        kernel: &mut Kernel,
        load: &mut Load,
    ) -> anyhow::Result<()> {
        let btf = kernel.btf()?;
        let offset = |s: &str, m: &str| {
            btf.offset(s, m)
                .with_context(|| format!("cannot find {s}.{m} in kernel BTF"))
        };
        let cfg = Config {
            lines: u32::from(!self.summary_only()),
            summary: u32::from(self.summary_only() || self.args.summary),
            by_process: u32::from(self.args.summary_by_process),
            // Paths are read whole whatever -s says (so -y learns a
            // descriptor's path from the call that opened it).
            string_limit: self.args.string_limit,
            failed_only: u32::from(self.args.failed_only),
            min_ns: self.args.duration.map_or(0, |ms| (ms * 1e6) as u64),
            exit_code: offset("task_struct", "exit_code")?,
            signal: offset("task_struct", "signal")?,
            live: offset("signal_struct", "live")?,
            mm: offset("task_struct", "mm")?,
            arg_start: offset("mm_struct", "arg_start")?,
            arg_end: offset("mm_struct", "arg_end")?,
            bprm_filename: offset("linux_binprm", "filename")?,
            follow: u32::from(self.follows()),
            tgid: offset("task_struct", "tgid")?,
            stacks: u32::from(self.args.stack_trace),
            forks: u32::from(self.args.decode_fds),
        };
        load.config(&cfg);
        if self.args.stack_trace {
            let mut stacks = StackTool::new(false);
            stacks.configure(&crate::engine::stacktool::walk_args(), kernel, load)?;
            self.stacks = Some(stacks);
        }
        if self.follows() {
            // Room for the children followed beside the processes named.
            load.size(
                rtrace_common::targets::IDS_MAP,
                (self.args.scope.pids.len() as u32).max(1) + MAX_FOLLOWED,
            );
        }
        Ok(())
    }

    fn attach(
        &mut self,
        _m: Option<Mechanism>,
        kernel: &mut Kernel,
        ebpf: &mut Ebpf,
    ) -> anyhow::Result<()> {
        let mut syscalls: Array<_, Syscall> = Array::try_from(map_mut(ebpf, SYSCALLS)?)?;
        for (nr, decl) in self.table.iter() {
            let mut plan = decl.plan;
            // -y learns from calls it does not show.
            plan.shown = u32::from(
                self.shown[nr as usize] || self.args.decode_fds && fds::affects(&decl.name),
            );
            syscalls.set(nr, plan, 0)?;
        }
        let mut raw = Hooks::new(Mechanism::RawTracepoint, kernel)?;
        if let Some(stacks) = &mut self.stacks {
            stacks.attach(ebpf, &self.first_pids)?;
            stacks.take_stacks(ebpf)?;
            raw.attach(ebpf, PROG_STACK, "raw_syscalls", "sys_enter")?;
        }
        raw.attach(ebpf, PROG_SYS_ENTER, "raw_syscalls", "sys_enter")?;
        raw.attach(ebpf, PROG_SYS_EXIT, "raw_syscalls", "sys_exit")?;
        if self.follows() || self.args.decode_fds {
            raw.attach(ebpf, PROG_FORK, "sched", "sched_process_fork")?;
        }
        if !self.summary_only() {
            raw.attach(ebpf, PROG_SIGNAL, "signal", "signal_deliver")?;
            raw.attach(ebpf, PROG_EXIT, "sched", "sched_process_exit")?;
            raw.attach(ebpf, PROG_EXEC, "sched", "sched_process_exec")?;
        }
        Ok(())
    }

    fn describe(&self) -> Vec<String> {
        vec!["raw_syscalls:sys_enter and sys_exit, signal_deliver, sched_process_exit".to_owned()]
    }

    fn banner(&self) -> String {
        let whom = self.args.scope.whom();
        format!(
            "Tracing the syscalls of {}... Hit Ctrl-C to end.",
            whom.as_deref().unwrap_or("the whole system")
        )
    }

    fn start(&mut self) {
        let real = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos() as i128;
        self.realtime_offset = real - i128::from(crate::kernel::monotonic_ns());
    }

    fn after_events(&mut self, _ebpf: &mut Ebpf) -> anyhow::Result<()> {
        if let Some(stacks) = &mut self.stacks {
            stacks.look_again();
        }
        Ok(())
    }

    fn event(&mut self, record: &[u8], sink: &mut Sink) -> anyhow::Result<()> {
        if record.len() < HEADER_SIZE {
            // The stack walk's news of processes (exec, fork, new code).
            if let Some(stacks) = &mut self.stacks {
                stacks.event(record)?;
            }
            return Ok(());
        }
        // SAFETY: `Event` is plain data; a short record leaves zeroes.
        let mut e: Event = unsafe { std::mem::zeroed() };
        let n = record.len().min(size_of::<Event>());
        // SAFETY: copies `n <= size_of::<Event>()` bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(record.as_ptr(), (&raw mut e).cast::<u8>(), n);
        }
        if let Some(pid) = self.before_exec
            && e.pid == pid
        {
            if e.kind != KIND_EXEC {
                return Ok(());
            }
            if e.flags & FLAG_EXEC_DONE != 0 {
                self.before_exec = None;
            }
        }
        match e.kind {
            KIND_EXEC if !self.shown.get(e.nr as usize).copied().unwrap_or(false) => {}
            KIND_EXEC => {
                // The exec's own record (its argv as the new program has
                // it) comes after the entry's, and keeps its count of the
                // environment.
                if e.ret < 0
                    && let Some(entry) = self.execs.get(&e.tid)
                {
                    e.ret = entry.ret;
                }
                self.execs.insert(e.tid, e);
            }
            KIND_SYSCALL => {
                let exec = self.execs.remove(&e.tid).filter(|x| x.nr == e.nr);
                self.syscall(&e, exec.as_ref(), sink)?;
            }
            KIND_SIGNAL => self.signal(&e, sink)?,
            KIND_FORK => self.fds.fork(e.pid, e.args[0] as u32),
            KIND_EXIT => self.exit(&e, sink)?,
            _ => {}
        }
        Ok(())
    }

    fn finish(&mut self, ebpf: &mut Ebpf, sink: &mut Sink) -> anyhow::Result<()> {
        if !(self.summary_only() || self.args.summary) {
            return Ok(());
        }
        if self.args.summary_by_process {
            return self.summary_by_process(ebpf, sink);
        }
        let map: PerCpuArray<_, Totals> = PerCpuArray::try_from(map(ebpf, SUMMARY)?)?;
        let mut rows = Vec::new();
        for (nr, decl) in self.table.iter() {
            if !self.shown[nr as usize] {
                continue;
            }
            let Ok(values) = map.get(&nr, 0) else {
                continue;
            };
            let mut t = Totals::default();
            for v in values.iter() {
                t.calls += v.calls;
                t.errors += v.errors;
                t.ns += v.ns;
            }
            rows.extend(SummaryRow::of(&decl.name, t));
        }
        sink.emit(&Summary::sorted(None, rows))
    }

    fn plan(&self) -> Plan {
        Plan {
            scope: Scope {
                // rtrace's own writes would feed back.
                exclude_self: true,
                ..self.args.scope.scope()
            },
            events: (!self.summary_only()).then_some(&self.args.buffer).cloned(),
            ..Plan::default()
        }
    }

    fn outcome(&self) -> Outcome {
        Outcome {
            summary: {
                let mut out = vec![format!("{} lines printed", self.printed)];
                if let Some(s) = &self.stacks {
                    out.push(s.describe().to_owned());
                }
                out
            },
            warnings: self
                .stacks
                .as_ref()
                .map(StackTool::warnings)
                .unwrap_or_default(),
        }
    }
}

/// When each task lived, from its first line (or its parent's clone) to
/// its exit, by task id: how many were traced when a line's call began.
#[derive(Debug, Default)]
struct Lives {
    spans: HashMap<u32, (u64, Option<u64>)>,
}

/// How long an exited task is remembered, for the lines of calls that
/// began before it exited and are printed after.
const EXITED_KEPT_NS: u64 = 10_000_000_000;

impl Lives {
    /// Task `tid` was alive at `at`.
    fn seen(&mut self, tid: u32, at: u64) {
        let span = self.spans.entry(tid).or_insert((at, None));
        match span.1 {
            // The id taken again by a new task.
            Some(end) if at > end => *span = (at, None),
            _ => span.0 = span.0.min(at),
        }
    }

    /// Task `tid` exited at `at`.
    fn ended(&mut self, tid: u32, at: u64) {
        self.spans.entry(tid).or_insert((at, None)).1 = Some(at);
        self.spans
            .retain(|_, (_, end)| end.is_none_or(|x| x + EXITED_KEPT_NS > at));
    }

    /// The tasks alive at `at`.
    fn alive_at(&self, at: u64) -> usize {
        self.spans
            .values()
            .filter(|&&(start, end)| start <= at && end.is_none_or(|x| x > at))
            .count()
    }
}

/// The syscalls `-e trace=` shows, by number.
fn shown(table: &Table, exprs: &[String]) -> anyhow::Result<Vec<bool>> {
    let mut shown = vec![true; MAX_SYSCALLS as usize];
    for expr in exprs {
        let (key, value) = expr.split_once('=').unwrap_or(("trace", expr.as_str()));
        if key != "trace" {
            anyhow::bail!("-e {expr}: only trace= is taken (strace's other -e forms are not)");
        }
        let (negate, list) = match value.strip_prefix('!') {
            Some(rest) => (true, rest),
            None => (false, value),
        };
        let mut chosen = vec![false; MAX_SYSCALLS as usize];
        let mut column = key.len() + 1 + usize::from(negate);
        for word in list.split(',') {
            let word = word.trim();
            if word == "all" {
                chosen.iter_mut().for_each(|c| *c = true);
            } else if word == "none" {
            } else if let Some(class) = word.strip_prefix('%') {
                let mut known = false;
                for (nr, decl) in table.iter() {
                    if let Some(yes) = decode::in_class(class, decl) {
                        known = true;
                        chosen[nr as usize] |= yes;
                    }
                }
                if !known {
                    anyhow::bail!(
                        "-e {expr}: column {}: unknown class %{class} (%file, %network, \
                         %process, %memory, %signal, %desc)",
                        column + 1
                    );
                }
            } else {
                let nr = table.number(word).with_context(|| {
                    format!("-e {expr}: column {}: no syscall {word:?}", column + 1)
                })?;
                chosen[nr as usize] = true;
            }
            column += word.len() + 1;
        }
        for (s, c) in shown.iter_mut().zip(chosen) {
            *s = c != negate;
        }
    }
    Ok(shown)
}

impl Strace {
    /// Whether only a summary is printed: `-c`, or `--summary-by-process`
    /// without `-C`.
    /// Whether children of the processes `-p` names are traced too:
    /// strace's `-f` (a command's are, by its cgroup).
    fn follows(&self) -> bool {
        self.args.follow && !self.args.scope.pids.is_empty()
    }

    fn summary_only(&self) -> bool {
        self.args.summary_only || self.args.summary_by_process && !self.args.summary
    }

    /// A table for each process, from the kernel's counts by process and
    /// syscall, the busiest process first.
    fn summary_by_process(&mut self, ebpf: &Ebpf, sink: &mut Sink) -> anyhow::Result<()> {
        let map: aya::maps::HashMap<_, PidNr, ProcTotals> =
            aya::maps::HashMap::try_from(map(ebpf, SUMMARY_BY_PID)?)?;
        // Each (process, syscall) entry keeps the name the process had at
        // its first such call; one that execs has two, and is named by
        // the one most of its calls were made under (its new program's).
        type Names = BTreeMap<String, u64>;
        let mut by_pid: BTreeMap<u32, (Names, Vec<SummaryRow>)> = BTreeMap::new();
        for entry in map.iter() {
            let Ok((k, v)) = entry else { continue };
            if !self.shown.get(k.nr as usize).copied().unwrap_or(false) {
                continue;
            }
            let Some(decl) = self.table.get(u64::from(k.nr)) else {
                continue;
            };
            let slot = by_pid.entry(k.pid).or_default();
            *slot.0.entry(crate::kernel::c_string(&v.comm)).or_default() += v.totals.calls;
            slot.1.extend(SummaryRow::of(&decl.name, v.totals));
        }
        let mut tables: Vec<Summary> = by_pid
            .into_iter()
            .map(|(pid, (names, rows))| {
                let comm = names
                    .into_iter()
                    .max_by_key(|&(_, calls)| calls)
                    .map(|(name, _)| name)
                    .unwrap_or_default();
                Summary::sorted(Some((comm, pid)), rows)
            })
            .collect();
        tables.sort_by(|a, b| b.seconds().total_cmp(&a.seconds()));
        for t in &tables {
            sink.emit(t)?;
        }
        Ok(())
    }

    /// What strace puts before a line: with `-f` and `-o`, every line's
    /// task id, left-aligned in 5 columns; on a terminal, `[pid N] `
    /// while more than one task is traced; in a file without `-f` (where
    /// strace shows the first process alone), `[pid N] ` for the others.
    /// Then the time of day with `-t`.
    fn prefix(&self, tid: u32, at_ns: u64) -> String {
        let mut out = String::new();
        if self.args.scope.output.is_some() {
            if self.args.follow {
                let _ = write!(out, "{tid:<5} ");
            } else if self.first != Some(tid) {
                let _ = write!(out, "[pid {tid:>5}] ");
            }
        } else if self.lives.alive_at(at_ns) > 1 {
            let _ = write!(out, "[pid {tid:>5}] ");
        }
        if self.args.times > 0 {
            let ns = i128::from(at_ns) + self.realtime_offset;
            let secs = (ns / 1_000_000_000) as i64;
            let micros = ((ns % 1_000_000_000) / 1000) as u32;
            if self.args.times >= 3 {
                let _ = write!(out, "{secs}.{micros:06} ");
            } else {
                let local = crate::output::local_time_of(secs);
                if self.args.times == 2 {
                    let _ = write!(out, "{local}.{micros:06} ");
                } else {
                    let _ = write!(out, "{local} ");
                }
            }
        }
        out
    }

    fn line(&mut self, sink: &mut Sink, line: Line) -> anyhow::Result<()> {
        self.printed += 1;
        sink.emit(&line)
    }

    fn syscall(&mut self, e: &Event, exec: Option<&Event>, sink: &mut Sink) -> anyhow::Result<()> {
        // Shared, not copied: the lines below borrow `self` mutably.
        let table = Arc::clone(&self.table);
        let Some(decl) = table.get(e.nr) else {
            return Ok(());
        };
        self.lives.seen(e.tid, e.enter_ns);
        // The exec's arguments were read at its entry.
        let source = exec.unwrap_or(e);
        let mut args = args_text(decl, source, self.args.string_limit as usize);
        if self.args.decode_fds {
            self.decode_fds(decl, e, &mut args);
        }
        // Sent only for -y to learn from.
        if !self.shown.get(e.nr as usize).copied().unwrap_or(false) {
            return Ok(());
        }
        // A new task's first return, from the fork that made it: strace
        // shows none.
        if e.flags & FLAG_NO_ENTRY != 0
            && e.ret == 0
            && matches!(decl.name.as_str(), "clone" | "clone3" | "fork" | "vfork")
        {
            return Ok(());
        }
        let mut ret = if e.flags & FLAG_NO_RETURN != 0 {
            "?".to_owned()
        } else {
            ret_text(decl, e, self.args.string_limit as usize)
        };
        // A new task: strace counts it from its parent's clone on.
        if e.ret > 0 && matches!(decl.name.as_str(), "clone" | "clone3" | "fork" | "vfork") {
            self.lives.seen(e.ret as u32, e.exit_ns);
        }
        if self.args.decode_fds
            && e.ret >= 0
            && fds::Fds::returns_fd(&decl.name, &e.args)
            && let Some(path) = self.fds.path(e.pid, e.ret as i32)
        {
            ret = format!("{ret}<{path}>");
        }
        let spent = Duration::from_nanos(e.exit_ns.saturating_sub(e.enter_ns));
        let spent_text = if self.args.spent {
            format!(" <{:.6}>", spent.as_secs_f64())
        } else {
            String::new()
        };
        let resumed_only = e.flags & FLAG_NO_ENTRY != 0;
        // strace shows a call that another task's line interrupted as two
        // lines: its entry, unfinished, and its exit, resumed.
        let interrupted = !resumed_only && self.last.0 != e.tid && self.last.1 > e.enter_ns;
        let mut text = Vec::new();
        let ret = format!("{ret}{spent_text}");
        // strace's `<... NAME resumed>TAIL) = RET`.
        let resumed = |me: &Self, tail: &str| {
            let line = format!(
                "{}<... {} resumed>{tail})",
                me.prefix(e.tid, e.exit_ns),
                decl.name
            );
            me.aligned(line, &ret)
        };
        if resumed_only {
            text.push(resumed(self, ""));
        } else if interrupted {
            let split = (0..args.len())
                .find(|&i| decl.is_output(i))
                .unwrap_or(args.len());
            let head = args[..split].join(", ");
            let tail = args[split..].join(", ");
            // strace's `close(4 <unfinished ...>`, and `newfstatat(AT_FDCWD,
            // "/x",  <unfinished ...>` when arguments follow.
            let sep = if split > 0 && split < args.len() {
                ", "
            } else {
                ""
            };
            text.push(format!(
                "{}{}({head}{sep} <unfinished ...>",
                self.prefix(e.tid, e.enter_ns),
                decl.name
            ));
            text.push(resumed(self, &tail));
        } else {
            text.push(self.aligned(
                format!(
                    "{}{}({})",
                    self.prefix(e.tid, e.enter_ns),
                    decl.name,
                    args.join(", ")
                ),
                &ret,
            ));
        }
        self.last = (e.tid, e.exit_ns);
        let stack = self.stack_lines(e);
        text.extend(stack.iter().map(|f| format!(" > {f}")));
        let error = (e.flags & FLAG_NO_RETURN == 0 && (-4095..0).contains(&e.ret))
            .then(|| decode::errno(-e.ret).0);
        self.line(
            sink,
            Line {
                pid: e.pid,
                tid: e.tid,
                syscall: Some(decl.name.clone()),
                args,
                ret: Some(e.ret),
                error,
                spent_us: Some(spent.as_secs_f64() * 1e6),
                stack,
                text,
            },
        )
    }

    /// `-k`: the call's user stack as strace -k shows it, a frame a line
    /// (`/usr/lib/x86_64-linux-gnu/libc.so.6(__write+0x14) [0x7f...]`).
    fn stack_lines(&mut self, e: &Event) -> Vec<String> {
        let Some(stacks) = &mut self.stacks else {
            return Vec::new();
        };
        if e.stack == 0 {
            return Vec::new();
        }
        let Some(ips) = stacks.walked(e.stack) else {
            return vec!["(stack lost: the stack table was full)".to_owned()];
        };
        let frames = stacks.symbolize(&[(Some(e.pid), &ips[..])]);
        let Some(frames) = frames.first() else {
            return Vec::new();
        };
        let mut out: Vec<String> = Vec::new();
        let mut last_addr = None;
        for (i, f) in frames.iter().enumerate() {
            // Inlined functions share their caller's address: strace shows
            // one line an address, named by the function the code is in.
            if last_addr == Some(f.addr) {
                out.pop();
            }
            last_addr = Some(f.addr);
            // strace shows each caller's return address, and where it is
            // in its file; frames name their call sites (one before).
            let addr = if i == 0 || f.addr == 0 {
                f.addr
            } else {
                f.addr + 1
            };
            let (file, at) = match &f.mapping {
                Some(m) => (m.file.as_str(), addr - m.start + m.offset),
                None => (f.module.as_deref().unwrap_or("?"), addr),
            };
            let name = if f.name.starts_with('[') { "" } else { &f.name };
            out.push(format!("{file}({name}) [{at:#x}]"));
        }
        out
    }

    /// `-y`: the descriptors among the arguments with their paths, as
    /// they were when the call began; then what the call did to the
    /// process's descriptors is learned.
    fn decode_fds(&mut self, decl: &Decl, e: &Event, args: &mut [String]) {
        let mut shown = 0;
        for (i, a) in decl.args.iter().enumerate() {
            if left_out(decl, e, i) {
                continue;
            }
            let at = shown;
            shown += 1;
            if !fds::is_fd_arg(&a.name) || (decl.name == "mmap" && a.name == "fd") {
                continue;
            }
            if let Some(path) = self.fds.shown(e.pid, e.args[i] as i32)
                && let Some(text) = args.get_mut(at)
            {
                text.push_str(&format!("<{path}>"));
            }
        }
        let named = decl
            .args
            .iter()
            .position(|a| matches!(a.name.as_str(), "filename" | "pathname"))
            .and_then(|i| decl.slot_of(i))
            .map(|s| {
                let b = blob(e, s);
                let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
                String::from_utf8_lossy(&b[..end]).into_owned()
            });
        self.fds
            .after(e.pid, &decl.name, &e.args, named.as_deref(), e.ret);
    }

    fn signal(&mut self, e: &Event, sink: &mut Sink) -> anyhow::Result<()> {
        let sig = e.args[0];
        let name = decode::signal(sig);
        let code = e.args[1] as i64;
        let mut info = format!("si_signo={name}, si_code={}", decode::si_code(sig, code));
        if code <= 0 || sig == 17 {
            let _ = write!(info, ", si_pid={}, si_uid={}", e.args[2], e.args[3]);
        }
        if sig == 17 {
            // A child killed shows the signal, one that exited its code.
            let status = e.args[4] as i32;
            let status = if matches!(code, 2 | 3) {
                decode::signal(status as u64)
            } else {
                status.to_string()
            };
            let _ = write!(
                info,
                ", si_status={status}, si_utime={}, si_stime={}",
                ticks(e.args[5] & 0xffff_ffff),
                ticks(e.args[5] >> 32)
            );
        }
        let text = format!("--- {name} {{{info}}} ---");
        self.mark(e, text, name, sink)
    }

    /// A line that is no syscall (a signal, an exit): `text` after the
    /// prefix, `what` its one argument in JSON.
    fn mark(
        &mut self,
        e: &Event,
        text: String,
        what: String,
        sink: &mut Sink,
    ) -> anyhow::Result<()> {
        self.lives.seen(e.tid, e.enter_ns);
        let text = vec![format!("{}{text}", self.prefix(e.tid, e.enter_ns))];
        self.last = (e.tid, e.enter_ns);
        self.line(
            sink,
            Line {
                pid: e.pid,
                tid: e.tid,
                syscall: None,
                args: vec![what],
                ret: None,
                error: None,
                spent_us: None,
                stack: Vec::new(),
                text,
            },
        )
    }

    fn exit(&mut self, e: &Event, sink: &mut Sink) -> anyhow::Result<()> {
        if e.args[1] != 0 {
            self.fds.forget(e.pid);
        }
        if self.args.quiet >= 2 {
            self.lives.ended(e.tid, e.enter_ns);
            return Ok(());
        }
        let code = e.args[0] as u32;
        let what = if code & 0x7f == 0 {
            format!("exited with {}", (code >> 8) & 0xff)
        } else {
            format!("killed by {}", decode::signal(u64::from(code & 0x7f)))
        };
        let done = self.mark(e, format!("+++ {what} +++"), what, sink);
        self.lives.ended(e.tid, e.enter_ns);
        done
    }
}

/// The captured bytes of slot `slot` of `e`.
fn blob(e: &Event, slot: usize) -> &[u8] {
    let start: usize = if e.flags & FLAG_FIXED_SLOTS != 0 {
        slot * BLOB
    } else {
        e.lens[..slot].iter().map(|&l| l as usize).sum()
    };
    let len = e.lens[slot] as usize;
    e.data.get(start..start + len).unwrap_or(&[])
}

/// Whether argument `i` of `e` is one strace leaves out: open's mode,
/// where the call creates nothing.
fn left_out(decl: &Decl, e: &Event, i: usize) -> bool {
    decl.args[i].name == "mode"
        && matches!(decl.name.as_str(), "open" | "openat")
        && i.checked_sub(1)
            .is_some_and(|f| e.args[f] & 0o20100100 == 0)
}

/// What the table's decoders know of `e`'s call.
fn call_of<'a>(decl: &'a Decl, e: &'a Event, limit: usize) -> table::Call<'a> {
    let mut blobs: [Option<&[u8]>; 6] = [None; 6];
    for (i, b) in blobs.iter_mut().enumerate().take(decl.args.len()) {
        if let Some(s) = decl.slot_of(i) {
            *b = Some(blob(e, s));
        }
    }
    table::Call {
        sys: &decl.name,
        args: e.args,
        ret: e.ret,
        limit,
        blobs,
    }
}

/// Each argument as strace shows it.
fn args_text(decl: &Decl, e: &Event, limit: usize) -> Vec<String> {
    let name = decl.name.as_str();
    let call = call_of(decl, e, limit);
    let one = |i: usize| arg_text(decl, e, &call, i, limit);
    if let Some(out) = table::whole(&call, &one) {
        return out;
    }
    let mut out = Vec::with_capacity(decl.args.len());
    for i in 0..decl.args.len() {
        if left_out(decl, e, i) {
            continue;
        }
        out.push(one(i));
    }
    if name == "execve" || name == "execveat" {
        // The environment: its address and how many entries.
        if let Some(i) = decl.args.iter().position(|a| a.name == "envp")
            && let Some(t) = out.get_mut(i)
        {
            *t = format!("{} /* {} vars */", table::pointer(e.args[i]), e.ret);
        }
    }
    out
}

/// Argument `i` as strace shows it: by its row of the table, else by
/// what was read of it, else by its C type.
fn arg_text(decl: &Decl, e: &Event, call: &table::Call, i: usize, limit: usize) -> String {
    let name = decl.name.as_str();
    let a = &decl.args[i];
    let v = e.args[i];
    if let Some(show) = table::row(name, i) {
        return table::render(show, call, i);
    }
    if table::is_path(&a.name, &a.c_type) {
        return table::render(table::Show::Path, call, i);
    }
    let Some(s) = decl.slot_of(i) else {
        return scalar(name, a, v);
    };
    let c = decl.plan.captures[s];
    let b = blob(e, s);
    match c.how {
        rtrace_common::strace::CAPTURE_STR if b.is_empty() => table::pointer(v),
        rtrace_common::strace::CAPTURE_STR => decode::string(b, limit),
        rtrace_common::strace::CAPTURE_ARGV => decode::argv(b, limit),
        rtrace_common::strace::CAPTURE_LEN_ARG | rtrace_common::strace::CAPTURE_LEN_RET
            if a.c_type.contains("sockaddr") && !b.is_empty() =>
        {
            decode::sockaddr(b)
        }
        // Read one byte past what is shown, to tell a cut.
        rtrace_common::strace::CAPTURE_LEN_ARG | rtrace_common::strace::CAPTURE_LEN_RET
            if !b.is_empty() =>
        {
            decode::quote(&b[..b.len().min(limit)], b.len() > limit)
        }
        rtrace_common::strace::CAPTURE_LEN_RET if e.ret == 0 => "\"\"".to_owned(),
        rtrace_common::strace::CAPTURE_LEN_ARG if e.args[usize::from(c.len_arg)] == 0 => {
            "\"\"".to_owned()
        }
        _ if b.is_empty() => table::pointer(v),
        _ if a.c_type.contains("timespec") => decode::timespec(b),
        _ => table::pointer(v),
    }
}

/// An argument that is a number, a flag set or a pointer: the C type
/// gives the sign and width (the tracepoint formats call every argument
/// unsigned).
fn scalar(sys: &str, a: &decode::Arg, v: u64) -> String {
    match (sys, a.name.as_str()) {
        (_, "dfd" | "olddfd" | "newdfd" | "fd") if v as i32 == -100 => "AT_FDCWD".into(),
        ("open" | "openat", "flags") => decode::open_flags(v),
        ("access" | "faccessat" | "faccessat2", "mode") => decode::access_mode(v),
        (_, "mode") => format!("0{:o}", v & 0o7777),
        (_, "flag") => decode::at_flags(v),
        // Descriptors are ints to strace, whatever the kernel's type.
        (_, name) if fds::is_fd_arg(name) => (v as i32).to_string(),
        (
            "mmap" | "mprotect" | "munmap" | "mremap" | "madvise" | "brk",
            "addr" | "start" | "brk",
        ) => table::pointer(v),
        ("mmap" | "mprotect" | "pkey_mprotect", "prot") => decode::prot(v),
        ("mmap", "flags") => decode::map_flags(v),
        ("socket" | "socketpair", "family") => decode::family(v),
        ("socket" | "socketpair", "type") => decode::sock_type(v),
        ("clock_nanosleep" | "clock_gettime" | "clock_getres", "which_clock") => decode::clock(v),
        _ if a.c_type.contains('*') => table::pointer(v),
        _ => match a.c_type.as_str() {
            "int" | "pid_t" | "key_t" | "clockid_t" | "timer_t" | "mqd_t" | "s32" | "__s32" => {
                (v as i32).to_string()
            }
            "long" | "off_t" | "loff_t" | "ssize_t" | "s64" | "__s64" | "long long" => {
                (v as i64).to_string()
            }
            "unsigned int" | "u32" | "__u32" | "uid_t" | "gid_t" | "qid_t" | "umode_t" => {
                (v as u32).to_string()
            }
            _ => v.to_string(),
        },
    }
}

/// The return value as strace shows it: an error by name, an address in
/// hex, what the table adds for some calls, else a number.
fn ret_text(decl: &Decl, e: &Event, limit: usize) -> String {
    let ret = e.ret;
    if (-4095..0).contains(&ret) {
        let (name, desc) = decode::errno(-ret);
        let sign = if decode::is_restart(-ret) { "?" } else { "-1" };
        return format!("{sign} {name} ({desc})");
    }
    table::ret_text(&call_of(decl, e, limit)).unwrap_or_else(|| ret.to_string())
}

/// Clock ticks as strace shows them: `150 /* 1.50 s */` (100 a
/// second, the kernel's `USER_HZ`), 0 alone.
fn ticks(t: u64) -> String {
    if t == 0 {
        "0".to_owned()
    } else {
        format!("{t} /* {}.{:02} s */", t / 100, t % 100)
    }
}

impl Strace {
    /// A call's line with its return: strace pads the call with spaces
    /// so that `= ` begins in column 40 (after one space at least).
    fn aligned(&self, head: String, ret: &str) -> String {
        aligned(head, ret, if self.args.pad_return { 40 } else { 0 })
    }
}

/// `head`, then ` = ret` with `= ` in column `column` at least.
fn aligned(mut head: String, ret: &str, column: usize) -> String {
    head.push(' ');
    while head.len() < column {
        head.push(' ');
    }
    head.push_str("= ");
    head.push_str(ret);
    head
}

/// One line (or an unfinished call's two) as text, or as JSON.
#[derive(Debug, Serialize)]
struct Line {
    pid: u32,
    tid: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    syscall: Option<String>,
    args: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ret: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    spent_us: Option<f64>,
    /// `-k`'s frames, leaf first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    stack: Vec<String>,
    #[serde(skip)]
    text: Vec<String>,
}

impl Record for Line {
    fn text(&self, out: &mut String) {
        for l in &self.text {
            out.push_str(l);
            out.push('\n');
        }
    }
}

/// strace -c's table, of everything or of one process.
#[derive(Debug, Serialize)]
struct Summary {
    /// With `--summary-by-process`: the process's name and id.
    #[serde(skip_serializing_if = "Option::is_none")]
    process: Option<(String, u32)>,
    rows: Vec<SummaryRow>,
}

impl Summary {
    /// The rows sorted as strace sorts them: by time, then calls.
    fn sorted(process: Option<(String, u32)>, mut rows: Vec<SummaryRow>) -> Self {
        rows.sort_by(|a, b| b.seconds.total_cmp(&a.seconds).then(b.calls.cmp(&a.calls)));
        Self { process, rows }
    }

    fn seconds(&self) -> f64 {
        self.rows.iter().map(|r| r.seconds).sum()
    }
}

impl SummaryRow {
    /// A row of `name`'s figures, if it was called.
    fn of(name: &str, t: Totals) -> Option<Self> {
        (t.calls > 0).then(|| Self {
            syscall: name.to_owned(),
            calls: t.calls,
            errors: t.errors,
            seconds: t.ns as f64 / 1e9,
        })
    }
}

#[derive(Debug, Serialize)]
struct SummaryRow {
    syscall: String,
    calls: u64,
    errors: u64,
    seconds: f64,
}

impl Record for Summary {
    fn text(&self, out: &mut String) {
        let total: f64 = self.rows.iter().map(|r| r.seconds).sum();
        if let Some((comm, pid)) = &self.process {
            let calls: u64 = self.rows.iter().map(|r| r.calls).sum();
            let _ = writeln!(out, "\n {comm} ({pid}), {calls} calls\n");
        }
        let rule = "------ ----------- ----------- --------- --------- ----------------";
        let _ = writeln!(
            out,
            "% time     seconds  usecs/call     calls    errors syscall\n{rule}"
        );
        let pct = |s: f64| if total > 0.0 { 100.0 * s / total } else { 0.0 };
        let errors = |n: u64| {
            if n == 0 { String::new() } else { n.to_string() }
        };
        for r in &self.rows {
            let _ = writeln!(
                out,
                "{:>6.2} {:>11.6} {:>11} {:>9} {:>9} {}",
                pct(r.seconds),
                r.seconds,
                (r.seconds * 1e6 / r.calls as f64).round() as u64,
                r.calls,
                errors(r.errors),
                r.syscall
            );
        }
        let calls: u64 = self.rows.iter().map(|r| r.calls).sum();
        let errs: u64 = self.rows.iter().map(|r| r.errors).sum();
        let per_call = if calls > 0 {
            (total * 1e6 / calls as f64).round() as u64
        } else {
            0
        };
        let _ = writeln!(
            out,
            "{rule}\n{:>6.2} {:>11.6} {:>11} {:>9} {:>9} total",
            if total > 0.0 { 100.0 } else { 0.0 },
            total,
            per_call,
            calls,
            errors(errs)
        );
    }
}

//! `rtrace trace`: bcc's trace. Each probe spec prints a line whenever it
//! fires and its filter passes, with a printf format of its values;
//! specs, filters and values are argdist's C expressions, run by the same
//! generic programs (`ebpf-programs/src/bin/trace.rs`), nothing compiled
//! at run time. With no spec it traces syscalls as `rtrace strace` does,
//! as `perf trace` does with no events.

use crate::tracer::{Outcome, Plan, Spec};
use std::{collections::HashMap, fmt::Write as _};

use anyhow::Context as _;
use aya::Ebpf;
use rtrace_common::{
    argdist::{KIND_RETURN, MAX_PROBES, Probe, STR_LEN, VAL_STRING},
    trace::{Config, ERR_NAMES, Event, HEADER_SIZE, MAX_FRAMES},
};
use serde::Serialize;

use crate::{
    kernel::{
        features::Mechanism,
        load::{Kernel, Load, thread_entries},
        transport::{BufferArgs, BufferSize},
    },
    output::{Record, Sink, stacks::frame_text},
    probes::{
        attach::{Slot, attach_slot},
        spec::{
            self,
            trace::{Conv, Piece, TraceSpec},
        },
    },
    stacks::symbolize::{Places, Symbolizer},
    tracer::{Scope, ScopeArgs, Tool, own},
};

use crate::engine::stacktool::{StackTool, Unwind};

/// Attach to functions, tracepoints and USDT probes and print a line each
/// time one fires, with a printf format of its values (bcc's trace). With
/// no probe, trace syscalls as rtrace strace does.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Probe: [{p|r}]:[library]:function[(signature)] [(filter)] [\"format\"[, value...]]
       t:category:event [(filter)] [\"format\"[, value...]]
       u:library:[provider:]probe [(filter)] [\"format\"[, value...]]
  function alone is p::function (a kernel function), library:function a
  uprobe. Values and filters are argdist's C expressions: arg1..arg6,
  retval (r:), args->field (t:), $pid (thread), $tgid, $uid, $gid, $cpu,
  $task, casts, p->member through the kernel's BTF, STRCMP(\"text\", s).
  Formats take %d %i %u %x %X %o %c %s %p, with h, hh, l, ll or z, and
  %K / %U for a kernel or user address's function.

Examples:
  rtrace trace 'do_sys_open \"%s\", arg2@user'
  rtrace trace 'r::do_sys_open (retval < 0) \"failed %d\", retval'
  rtrace trace 't:syscalls:sys_enter_openat \"%s\", args->filename'
  rtrace trace 'u:/lib/x86_64-linux-gnu/libc.so.6:malloc \"%d\", arg1' -p 185
  rtrace trace 'r:c:malloc (retval) \"allocated = %x\", retval' -M 10
  rtrace trace 'p:c:write (arg1 == 1) \"writing %d bytes to STDOUT\", arg3' -U
  rtrace trace 't:block:block_rq_complete \"sectors=%d\", args->nr_sector' -T
  rtrace trace -p 185                # syscalls of PID 185, as rtrace strace
  rtrace trace --summary -- make     # syscall summary per process, as perf trace -s"
)]
pub struct Args {
    /// Probe specifiers (see below); none traces syscalls.
    #[arg(value_name = "PROBE")]
    specs: Vec<String>,
    #[command(flatten)]
    scope: ScopeArgs<{ own::T | own::UPPER_C | own::A | own::U }>,
    /// Pages of event buffer (bcc's -b; --buffer-size takes bytes).
    #[arg(short = 'b', long = "buffer-pages", value_name = "PAGES")]
    buffer_pages: Option<u32>,
    #[command(flatten)]
    buffer: BufferArgs,
    /// Only events of this user id.
    #[arg(long, value_name = "UID")]
    uid: Option<u32>,
    /// Bytes read of each string (at most 128).
    #[arg(short = 'Z', long = "string-size", value_name = "SIZE", default_value_t = 80,
          value_parser = clap::value_parser!(u32).range(1..=STR_LEN as i64))]
    string_size: u32,
    /// Trace rtrace itself too (its own syscalls and calls are left out
    /// otherwise).
    #[arg(short = 'S', long = "include-self")]
    include_self: bool,
    /// Stop after this many events.
    #[arg(short = 'M', long = "max-events", value_name = "N")]
    max_events: Option<u64>,
    /// A time column: seconds since tracing began.
    #[arg(short = 't', long = "timestamp")]
    timestamp: bool,
    /// With -t: seconds since the epoch instead.
    #[arg(short = 'u', long = "unix-timestamp", requires = "timestamp")]
    unix_timestamp: bool,
    /// A time column: the time of day.
    #[arg(short = 'T', long = "time")]
    time: bool,
    /// A CPU column.
    #[arg(short = 'C', long = "print_cpu")]
    print_cpu: bool,
    /// Only processes whose name contains NAME.
    #[arg(short = 'n', long = "name", value_name = "NAME")]
    name: Option<String>,
    /// Only events whose message contains TEXT.
    #[arg(short = 'f', long = "msg-filter", value_name = "TEXT")]
    msg_filter: Option<String>,
    /// Accepted for bcc's command lines: STRCMP always compares bytes, so
    /// binary values compare as they are.
    #[arg(short = 'B', long = "bin_cmp")]
    bin_cmp: bool,
    /// Accepted for bcc's command lines and ignored: a process's files are
    /// read when its event comes, so short-lived ones are named too.
    #[arg(short = 's', long = "sym_file_list", value_name = "FILES")]
    sym_file_list: Option<String>,
    /// The kernel stack of each event.
    #[arg(short = 'K', long = "kernel-stack")]
    kernel_stack: bool,
    /// The user stack of each event, walked in the kernel from the
    /// program's call frame information (frame pointers where none).
    #[arg(short = 'U', long = "user-stack")]
    user_stack: bool,
    /// Addresses in stacks, before the functions.
    #[arg(short = 'a', long = "address")]
    address: bool,
    /// Accepted for bcc's command lines and ignored: types come from the
    /// kernel's BTF, not from headers.
    #[arg(short = 'I', long = "include", value_name = "HEADER")]
    include: Vec<String>,
    /// With -M: count the distinct events and print each with its count
    /// at the end, instead of each as it comes.
    #[arg(short = 'A', long = "aggregate", requires = "max_events")]
    aggregate: bool,
    /// With no probe: per-process syscall summaries instead of lines
    /// (perf trace's -s).
    #[arg(long)]
    summary: bool,
    /// With no probe: only syscalls that took at least MS milliseconds.
    #[arg(long, value_name = "MS")]
    duration: Option<f64>,
}

impl Args {
    /// Whether the run traces syscalls (no probe given).
    pub fn syscalls(&self) -> bool {
        self.specs.is_empty()
    }

    /// What a run with no probe traces, for strace's engine to run (the
    /// registry hands it over): the same scope, output and buffer; `-T`
    /// shows the time of day as strace's `-t`, `-t` the time since the
    /// epoch as `-ttt`.
    pub fn into_syscalls(self) -> anyhow::Result<SyscallRun> {
        if self.kernel_stack || self.user_stack {
            anyhow::bail!("-K and -U take a probe: syscall lines carry no stacks yet");
        }
        let times = if self.timestamp {
            3
        } else {
            u8::from(self.time)
        };
        Ok(SyscallRun {
            scope: self.scope.into_letters(),
            buffer: self.buffer,
            times,
            summary: self.summary,
            duration: self.duration,
        })
    }
}

/// A run of `rtrace trace` with no probe, as perf trace's view of the
/// syscalls: what strace's engine needs of it.
pub struct SyscallRun {
    /// The scope, in the letters strace takes.
    pub scope: ScopeArgs<{ own::C | own::UPPER_C | own::T }>,
    /// The event buffer.
    pub buffer: BufferArgs,
    /// strace's `-t` count.
    pub times: u8,
    /// perf trace's `-s`: the summary by process, instead of lines.
    pub summary: bool,
    /// Only calls that took at least this many milliseconds.
    pub duration: Option<f64>,
}

/// One event's line, and its stack lines.
#[derive(Debug, Serialize)]
struct Line {
    #[serde(skip_serializing_if = "Option::is_none")]
    time: Option<String>,
    cpu: u32,
    pid: u32,
    tid: u32,
    comm: String,
    func: String,
    message: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    kernel_stack: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    user_stack: Vec<String>,
    #[serde(skip)]
    text: String,
}

impl Record for Line {
    fn text(&self, out: &mut String) {
        out.push_str(&self.text);
    }
}

/// `-A`'s counts, printed at the end.
#[derive(Debug, Serialize)]
struct Aggregate {
    events: Vec<(String, u64)>,
}

impl Record for Aggregate {
    fn text(&self, out: &mut String) {
        for (text, n) in &self.events {
            let _ = write!(out, "{text}-->COUNT {n}\n\n");
        }
    }
}

/// The tool.
pub struct Trace {
    args: Args,
    specs: Vec<TraceSpec>,
    /// How each probe was attached, for `-v`.
    how: Vec<String>,
    /// The perf events of USDT probes, attached while they are held.
    links: Vec<std::os::fd::OwnedFd>,
    sym: Symbolizer,
    /// With `-U`: the shared user-stack walk, its tables and symbolizer.
    stacks: Option<StackTool>,
    /// Events printed (or counted, with `-A`).
    shown: u64,
    /// `-A`'s counts, in the order first seen.
    aggregate: Vec<(String, u64)>,
    aggregate_at: HashMap<String, usize>,
    /// The monotonic time tracing began, for `-t`.
    started_ns: u64,
    /// CLOCK_REALTIME minus CLOCK_MONOTONIC, for `-t -u`.
    realtime_offset: i128,
}

impl Tool for Trace {
    type Args = Args;

    // Each probe names its own mechanism: no chain.
    const SPEC: Spec =
        Spec::new("trace", &[], &ERR_NAMES).expected(&rtrace_common::stacks::ERR_EXPECTED);

    fn new(mut args: Args) -> anyhow::Result<Self> {
        if args.specs.len() > MAX_PROBES {
            anyhow::bail!("at most {MAX_PROBES} probes may be given");
        }
        if let Some(pages) = args.buffer_pages {
            let bytes = pages
                .checked_mul(4096)
                .and_then(std::num::NonZeroU32::new)
                .context("-b: give 1 page or more, below 4 GiB in all")?;
            args.buffer.buffer_size = Some(BufferSize(bytes));
        }
        let specs = spec::with_system(args.scope.one_pid(), |env| {
            args.specs
                .iter()
                .map(|text| {
                    spec::trace::parse(text, env)
                        .map_err(|e| anyhow::anyhow!("bad probe {text:?} at {e}"))
                })
                .collect::<anyhow::Result<Vec<_>>>()
        })?;
        let mut sym = Symbolizer::new();
        sym.with_places(Places {
            offsets: true,
            addresses: false,
        });
        Ok(Self {
            args,
            specs,
            how: Vec::new(),
            links: Vec::new(),
            sym,
            stacks: None,
            shown: 0,
            aggregate: Vec::new(),
            aggregate_at: HashMap::new(),
            started_ns: 0,
            realtime_offset: 0,
        })
    }

    fn variants(&self, _m: Option<Mechanism>, _kernel: &mut Kernel) -> Vec<&'static str> {
        StackTool::variants(Unwind::Auto, self.args.user_stack)
    }

    fn configure(
        &mut self,
        _m: Option<Mechanism>,
        kernel: &mut Kernel,
        load: &mut Load,
    ) -> anyhow::Result<()> {
        self.stacks = None;
        if self.args.user_stack {
            let mut stacks = StackTool::new(false);
            stacks.configure(&crate::engine::stacktool::walk_args(), kernel, load)?;
            self.stacks = Some(stacks);
        }
        // SAFETY: every field is an integer or an array of them.
        let mut cfg: Config = unsafe { std::mem::zeroed() };
        for (slot, s) in cfg.probes.iter_mut().zip(&self.specs) {
            *slot = probe(s, self.args.string_size);
        }
        cfg.kernel_stack = u32::from(self.args.kernel_stack);
        cfg.user_stack = u32::from(self.args.user_stack);
        cfg.uid = self.args.uid.unwrap_or(u32::MAX);
        load.config(&cfg)
            .size(rtrace_common::argdist::ENTRIES, thread_entries());
        Ok(())
    }

    fn attach(
        &mut self,
        _m: Option<Mechanism>,
        kernel: &mut Kernel,
        ebpf: &mut Ebpf,
    ) -> anyhow::Result<()> {
        self.how.clear();
        self.links.clear();
        if let Some(stacks) = &mut self.stacks {
            let pids: Vec<u32> = self.args.scope.pids.clone();
            stacks.attach(ebpf, &pids)?;
            stacks.take_stacks(ebpf)?;
        }
        for (i, s) in self.specs.iter().enumerate() {
            let how = attach_slot(
                ebpf,
                kernel,
                &Slot {
                    index: i,
                    raw: &s.raw,
                    target: &s.target,
                    ret: s.kind == KIND_RETURN,
                    need_entry: s.need_entry,
                },
                self.args.scope.one_pid(),
                &mut self.links,
            )
            .with_context(|| format!("cannot attach {:?}", s.raw))?;
            self.how.push(format!(
                "probe {i}: {how}: {} value(s), {} filter term(s)",
                s.values.len(),
                s.conds.len()
            ));
        }
        Ok(())
    }

    fn describe(&self) -> Vec<String> {
        let mut lines = vec![format!("{} probe(s)", self.specs.len())];
        lines.extend(self.how.clone());
        lines
    }

    fn banner(&self) -> String {
        format!(
            "Tracing {} probe(s)... Hit Ctrl-C to end.",
            self.specs.len()
        )
    }

    fn start(&mut self) {
        self.started_ns = crate::kernel::monotonic_ns();
        let real = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos() as i128;
        self.realtime_offset = real - i128::from(self.started_ns);
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
        if self.done() {
            return Ok(());
        }
        // SAFETY: `Event` is plain data; a record cut after its frames
        // leaves zeroes.
        let mut e: Event = unsafe { std::mem::zeroed() };
        let n = record.len().min(size_of::<Event>());
        // SAFETY: copies `n <= size_of::<Event>()` bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(record.as_ptr(), (&raw mut e).cast::<u8>(), n);
        }
        if e.probe as usize >= self.specs.len() {
            return Ok(());
        }
        let comm = crate::kernel::c_string(&e.comm);
        if let Some(name) = &self.args.name
            && !comm.contains(name.as_str())
        {
            return Ok(());
        }
        let message = self.message(e.probe as usize, &e);
        if let Some(f) = &self.args.msg_filter
            && !message.contains(f.as_str())
        {
            return Ok(());
        }
        let func = self.specs[e.probe as usize].display.clone();
        let mut text = String::new();
        let time = (self.args.timestamp || self.args.time).then(|| {
            if self.args.time {
                crate::output::hms()
            } else if self.args.unix_timestamp {
                let ns = self.realtime_offset + i128::from(e.ts);
                format!("{:.6}", ns as f64 / 1e9)
            } else {
                format!("{:.6}", e.ts.saturating_sub(self.started_ns) as f64 / 1e9)
            }
        });
        if let Some(t) = &time {
            let width = if self.args.unix_timestamp { 17 } else { 8 };
            let _ = write!(text, "{t:<width$} ");
        }
        if self.args.print_cpu {
            let _ = write!(text, "{:<3} ", e.cpu);
        }
        let _ = writeln!(
            text,
            "{:<7} {:<7} {:<15} {:<16} {message}",
            e.pid, e.tid, comm, func
        );
        let (kernel_stack, user_stack) = self.stacks(&e);
        for f in kernel_stack.iter().chain(&user_stack) {
            let _ = writeln!(text, "        {f}");
        }
        if self.args.kernel_stack || self.args.user_stack {
            text.push('\n');
        }
        self.shown += 1;
        if self.args.aggregate {
            match self.aggregate_at.get(&text) {
                Some(&i) => self.aggregate[i].1 += 1,
                None => {
                    self.aggregate_at.insert(text.clone(), self.aggregate.len());
                    self.aggregate.push((text, 1));
                }
            }
            return Ok(());
        }
        sink.emit(&Line {
            time,
            cpu: e.cpu,
            pid: e.pid,
            tid: e.tid,
            comm,
            func,
            message,
            kernel_stack,
            user_stack,
            text,
        })
    }

    fn done(&self) -> bool {
        self.args.max_events.is_some_and(|m| self.shown >= m)
    }

    fn finish(&mut self, _ebpf: &mut Ebpf, sink: &mut Sink) -> anyhow::Result<()> {
        if !self.args.aggregate {
            return Ok(());
        }
        let mut events = std::mem::take(&mut self.aggregate);
        events.sort_by_key(|e| std::cmp::Reverse(e.1));
        let events = events
            .into_iter()
            .map(|(t, n)| (t.trim_end().to_owned(), n))
            .collect();
        sink.emit(&Aggregate { events })
    }

    fn plan(&self) -> Plan {
        Plan {
            scope: Scope {
                exclude_self: !self.args.include_self,
                ..self.args.scope.scope()
            },
            events: Some(self.args.buffer.clone()),
            header: {
                let mut h = String::new();
                if self.args.timestamp || self.args.time {
                    let width = if self.args.unix_timestamp { 17 } else { 8 };
                    let _ = write!(h, "{:<width$} ", "TIME");
                }
                if self.args.print_cpu {
                    let _ = write!(h, "{:<3} ", "CPU");
                }
                let trivial = self.specs.iter().all(|s| s.format.is_empty());
                let _ = write!(
                    h,
                    "{:<7} {:<7} {:<15} {:<16} {}",
                    "PID",
                    "TID",
                    "COMM",
                    "FUNC",
                    if trivial { "" } else { "-" }
                );
                Some(h)
            },
            ..Plan::default()
        }
    }

    fn outcome(&self) -> Outcome {
        Outcome {
            summary: vec![format!("{} events shown", self.shown)],
            warnings: {
                let mut out = self.sym.warnings();
                if let Some(s) = &self.stacks {
                    out.extend(s.warnings());
                }
                out
            },
        }
    }
}

/// The program's configuration of one spec.
fn probe(s: &TraceSpec, str_len: u32) -> Probe {
    // SAFETY: every field is an integer or an array of them.
    let mut out: Probe = unsafe { std::mem::zeroed() };
    out.kind = s.kind;
    out.n_values = s.values.len() as u32;
    out.n_conds = s.conds.len() as u32;
    out.need_entry = u32::from(s.need_entry);
    out.n_strings = s
        .values
        .iter()
        .filter(|v| v.flags & VAL_STRING != 0)
        .count() as u32;
    out.str_len = str_len;
    for (slot, v) in out.values.iter_mut().zip(&s.values) {
        *slot = *v;
    }
    for (slot, c) in out.conds.iter_mut().zip(&s.conds) {
        *slot = *c;
    }
    out
}

/// `x` as printf's conversion shows it, before padding.
fn convert(conv: Conv, x: u64, size: u32) -> String {
    let signed = rtrace_common::argdist::cut(x, size, true) as i64;
    let unsigned = rtrace_common::argdist::cut(x, size, false);
    match conv {
        Conv::Signed => signed.to_string(),
        Conv::Unsigned => unsigned.to_string(),
        Conv::Hex { upper: false } => format!("{unsigned:x}"),
        Conv::Hex { upper: true } => format!("{unsigned:X}"),
        Conv::Octal => format!("{unsigned:o}"),
        Conv::Char => char::from(x as u8).to_string(),
        Conv::Pointer => format!("{x:#x}"),
        Conv::Str | Conv::KernelSym | Conv::UserSym => String::new(),
    }
}

impl Trace {
    /// The event's message: its probe's format with its values.
    fn message(&mut self, probe: usize, e: &Event) -> String {
        let Self { specs, sym, .. } = self;
        let spec = &specs[probe];
        let mut out = String::new();
        for piece in &spec.format {
            match piece {
                Piece::Text(t) => out.push_str(t),
                &Piece::Conv {
                    conv,
                    left,
                    zero,
                    width,
                    value,
                } => {
                    let v = &spec.values[value];
                    let text = match conv {
                        Conv::Str => crate::kernel::c_string(
                            &e.strings[(v.str_slot as usize).min(e.strings.len() - 1)],
                        ),
                        // The function the address is in.
                        Conv::KernelSym | Conv::UserSym => {
                            let addr = e.values[value];
                            let pid = (conv == Conv::UserSym)
                                .then(|| crate::kernel::procmaps::Proc::now(e.pid));
                            if let Some(p) = pid {
                                sym.capture(p, false);
                            }
                            sym.symbolize(&[(pid, &[addr][..])])
                                .into_iter()
                                .next()
                                .and_then(|f| f.into_iter().last())
                                .map_or_else(|| format!("{addr:#x}"), |f| frame_text(&f, false))
                        }
                        _ => convert(conv, e.values[value], v.size),
                    };
                    let pad = width.saturating_sub(text.chars().count());
                    if left {
                        out.push_str(&text);
                        out.extend(std::iter::repeat_n(' ', pad));
                    } else {
                        let fill = if zero { '0' } else { ' ' };
                        out.extend(std::iter::repeat_n(fill, pad));
                        out.push_str(&text);
                    }
                }
            }
        }
        out
    }

    /// The event's kernel and user stacks as lines, leaf first.
    fn stacks(&mut self, e: &Event) -> (Vec<String>, Vec<String>) {
        let address = self.args.address;
        let lines = |f: &[crate::stacks::symbolize::Frame]| -> Vec<String> {
            f.iter().map(|f| frame_text(f, address)).collect()
        };
        let nk = (e.n_kernel as usize).min(MAX_FRAMES);
        let kernel = if nk > 0 {
            let frames = self.sym.symbolize(&[(None, &e.frames[..nk])]);
            frames.first().map(|f| lines(f)).unwrap_or_default()
        } else {
            Vec::new()
        };
        let user = match &mut self.stacks {
            Some(stacks) if e.ustack != 0 => match stacks.walked(e.ustack) {
                Some(ips) => {
                    let frames = stacks.symbolize(&[(Some(e.pid), &ips[..])]);
                    frames.first().map(|f| lines(f)).unwrap_or_default()
                }
                None => vec!["[stack lost: the stack table was full]".to_owned()],
            },
            _ => Vec::new(),
        };
        (kernel, user)
    }
}

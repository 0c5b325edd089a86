//! `rtrace execsnoop`: one line per exec, as libbpf-tools' execsnoop prints
//! it, plus a PPID column, execveat, full argv and JSON.

use std::{fmt::Write as _, io::Write as _, path::PathBuf};

use anyhow::Context as _;
use aya::EbpfLoader;
use rtrace_common::execsnoop::{
    Config, EnterOffsets, Event, FLAG_EXECVEAT, FLAG_TRUNCATED, HEADER_SIZE, MAX_ARGS,
};

use crate::{
    GlobalArgs,
    btf::Btf as KernelBtf,
    features::{Features, Hooks, Mechanism, attach_chain},
    objects,
    output::{
        self, Signals, TimeColumns,
        events::{BufferArgs, EventStream, Transport, report_lost},
    },
    privs, tracefs,
};

/// Syscall tracepoints exist wherever ftrace syscalls do; kprobes on the
/// syscall functions would see nothing they miss.
const CHAIN: [Mechanism; 1] = [Mechanism::Tracepoint];

/// The tracepoints, as (category, event); each has a `tp_<event>` program.
const HOOKS: [(&str, &str); 5] = [
    ("syscalls", "sys_enter_execve"),
    ("syscalls", "sys_enter_execveat"),
    ("syscalls", "sys_exit_execve"),
    ("syscalls", "sys_exit_execveat"),
    ("sched", "sched_process_exec"),
];

/// Trace exec() syscalls (execve and execveat).
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:
  rtrace execsnoop             # trace all exec() syscalls
  rtrace execsnoop -x          # include failed exec()s
  rtrace execsnoop -T          # include time (HH:MM:SS)
  rtrace execsnoop -U          # include UID
  rtrace execsnoop -u 1000     # only trace UID 1000
  rtrace execsnoop -t          # include timestamps
  rtrace execsnoop -q          # add \"quotemarks\" around arguments
  rtrace execsnoop -n main     # only print command lines containing \"main\"
  rtrace execsnoop -l tpkg     # only print command where arguments contain \"tpkg\"
  rtrace execsnoop -c CG       # trace processes in cgroup v2 directory CG")]
pub struct Args {
    /// Include a time column (HH:MM:SS).
    #[arg(short = 'T', long)]
    time: bool,
    /// Include a timestamp column: seconds since tracing started.
    #[arg(short = 't', long)]
    timestamp: bool,
    /// Include failed exec()s.
    #[arg(short = 'x', long)]
    fails: bool,
    /// Trace this user id only.
    #[arg(short = 'u', long, value_name = "UID")]
    uid: Option<u32>,
    /// Include a UID column.
    #[arg(short = 'U', long = "print-uid")]
    print_uid: bool,
    /// Add "quotemarks" around arguments.
    #[arg(short = 'q', long)]
    quote: bool,
    /// Only print commands whose name contains NAME.
    #[arg(short = 'n', long, value_name = "NAME")]
    name: Option<String>,
    /// Only print commands whose argument line contains LINE.
    #[arg(short = 'l', long, value_name = "LINE")]
    line: Option<String>,
    /// Most arguments to capture (1 to 60).
    #[arg(long, value_name = "N", default_value_t = 20,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_ARGS)))]
    max_args: u32,
    /// Trace processes in this cgroup v2 directory, or below it, only.
    #[arg(short = 'c', long, value_name = "CGROUP")]
    cgroup: Option<PathBuf>,
    #[command(flatten)]
    buffer: BufferArgs,
}

/// An exec as user space sees it.
struct Exec {
    pid: u32,
    ppid: u32,
    uid: u32,
    retval: i32,
    comm: String,
    args: Vec<String>,
    truncated: bool,
    execveat: bool,
}

/// Decodes a ring buffer record: the event's header, then its used bytes of
/// arguments.
fn decode(record: &[u8]) -> Option<Exec> {
    if record.len() < HEADER_SIZE {
        return None;
    }
    // SAFETY: `Event` is plain old data and the header is all there; the
    // arguments are read from the record itself below.
    let head: Event = unsafe {
        let mut e = std::mem::MaybeUninit::<Event>::zeroed();
        std::ptr::copy_nonoverlapping(record.as_ptr(), e.as_mut_ptr().cast::<u8>(), HEADER_SIZE);
        e.assume_init()
    };
    let args = &record[HEADER_SIZE..];
    let used = (head.args_size as usize).min(args.len());
    let args: Vec<String> = args[..used]
        .split(|&b| b == 0)
        .take(head.args_count as usize)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    Some(Exec {
        pid: head.pid,
        ppid: head.ppid,
        uid: head.uid,
        retval: head.retval,
        comm: output::c_string(&head.comm),
        args,
        truncated: head.flags & FLAG_TRUNCATED != 0,
        execveat: head.flags & FLAG_EXECVEAT != 0,
    })
}

fn quoted(arg: &str) -> String {
    format!("\"{}\"", arg.replace('"', "\\\""))
}

/// Offsets the programs need, from BTF and tracefs.
fn config(args: &Args) -> anyhow::Result<Config> {
    let btf = KernelBtf::from_kernel()?;
    let member = |m: &str| {
        btf.offset("task_struct", m)
            .with_context(|| format!("cannot find task_struct.{m} in kernel BTF"))
    };
    let enter = |name: &str| -> anyhow::Result<EnterOffsets> {
        let f = tracefs::Format::read("syscalls", name)?;
        Ok(EnterOffsets {
            filename: f.offset("filename")?,
            argv: f.offset("argv")?,
        })
    };
    Ok(Config {
        max_args: args.max_args,
        uid: args.uid.unwrap_or(0),
        filter_uid: u32::from(args.uid.is_some()),
        failed: u32::from(args.fails),
        filter_cgroup: u32::from(args.cgroup.is_some()),
        real_parent: member("real_parent")?,
        tgid: member("tgid")?,
        exit_ret: tracefs::Format::read("syscalls", "sys_exit_execve")?.offset("ret")?,
        old_pid: tracefs::Format::read("sched", "sched_process_exec")?.offset("old_pid")?,
        _pad: 0,
        execve: enter("sys_enter_execve")?,
        execveat: enter("sys_enter_execveat")?,
    })
}

/// Runs the tool.
pub async fn run(args: Args, global: &GlobalArgs) -> anyhow::Result<()> {
    let cgroup = super::open_cgroup(args.cgroup.as_deref())?;
    privs::check()?;

    let mut features = Features::new();
    let (transport, why) = Transport::choose(&mut features, &args.buffer);
    let (mech, mut ebpf, skipped) = attach_chain(&mut features, &CHAIN, None, |_| {
        let cfg = config(&args)?;
        let mut loader = EbpfLoader::new();
        loader.override_global("CONFIG", &cfg, true);
        let mut ebpf = transport
            .size(&mut loader, &args.buffer)
            .load(transport.object(objects::EXECSNOOP, objects::EXECSNOOP_PERF))
            .context("cannot load the execsnoop programs")?;
        if let Some(cg) = &cgroup {
            super::set_cgroup(&mut ebpf, cg)?;
        }
        let hooks = Hooks::new(Mechanism::Tracepoint)?;
        for (category, event) in HOOKS {
            hooks.attach_event(&mut ebpf, category, event)?;
        }
        Ok(ebpf)
    })?;
    if global.verbose {
        for (m, why) in &skipped {
            eprintln!("rtrace: execsnoop: skipped {m}: {why}");
        }
        eprintln!("rtrace: execsnoop: attached with {mech} (execve, execveat, sched_process_exec)");
        transport.report("execsnoop", why.as_deref());
    }
    let mut stream = EventStream::new(&mut ebpf, transport, &args.buffer)?;
    let mut signals = Signals::new()?;
    eprintln!("Tracing exec()s... Hit Ctrl-C to end.");
    let times = TimeColumns::new(args.time, args.timestamp, 8);
    if !global.json {
        let mut head = times.header();
        if args.print_uid {
            head.push_str(&format!("{:<6} ", "UID"));
        }
        writeln!(
            std::io::stdout(),
            "{head}{:<16} {:<6} {:<6} {:>3} ARGS",
            "PCOMM",
            "PID",
            "PPID",
            "RET"
        )
        .context("cannot write to stdout")?;
    }
    stream
        .run(&mut signals, |record| {
            let Some(e) = decode(record) else {
                return Ok(true);
            };
            if args.name.as_deref().is_some_and(|n| !e.comm.contains(n)) {
                return Ok(true);
            }
            let line = e.args.join(" ");
            if args.line.as_deref().is_some_and(|l| !line.contains(l)) {
                return Ok(true);
            }
            if global.json {
                output::json_line(&serde_json::json!({
                    "tool": "execsnoop",
                    "time": output::hms(),
                    "timestamp": output::epoch_secs(),
                    "pid": e.pid,
                    "ppid": e.ppid,
                    "uid": e.uid,
                    "comm": e.comm,
                    "ret": e.retval,
                    "syscall": if e.execveat { "execveat" } else { "execve" },
                    "args": e.args,
                    "truncated": e.truncated,
                }))?;
                return Ok(true);
            }
            let mut out = String::new();
            times.push(&mut out);
            if args.print_uid {
                let _ = write!(out, "{:<6} ", e.uid);
            }
            let _ = write!(
                out,
                "{:<16} {:<6} {:<6} {:>3} ",
                e.comm, e.pid, e.ppid, e.retval
            );
            if args.quote {
                let q: Vec<String> = e.args.iter().map(|a| quoted(a)).collect();
                out.push_str(&q.join(" "));
            } else {
                out.push_str(&line);
            }
            if e.truncated {
                out.push_str(" ...");
            }
            writeln!(std::io::stdout(), "{out}").context("cannot write to stdout")?;
            Ok(true)
        })
        .await?;
    report_lost(&ebpf, &stream)
}

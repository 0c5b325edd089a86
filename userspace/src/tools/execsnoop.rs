//! `rtrace execsnoop`: one line per exec, as libbpf-tools' execsnoop prints
//! it, plus a PPID column, execveat, full argv and JSON.

use std::{fmt::Write as _, path::PathBuf};

use anyhow::Context as _;
use aya::Ebpf;
use rtrace_common::{
    events::LOST_NAMES,
    execsnoop::{Config, EnterOffsets, Event, FLAG_EXECVEAT, FLAG_TRUNCATED, HEADER_SIZE, MAX_ARGS},
};
use serde::Serialize;

use crate::{
    btf::Btf,
    features::{Hooks, Mechanism},
    output::{self, Record, Sink, TimeColumns},
    tracefs,
    tracer::{Kernel, Load, Scope, Tool},
    transport::BufferArgs,
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
#[derive(Serialize)]
struct Exec<'a> {
    pid: u32,
    ppid: u32,
    uid: u32,
    comm: String,
    #[serde(rename = "ret")]
    retval: i32,
    syscall: &'static str,
    args: Vec<String>,
    truncated: bool,
    #[serde(skip)]
    text: Option<&'a TextOptions>,
}

/// How an exec's line looks.
struct TextOptions {
    times: TimeColumns,
    print_uid: bool,
    quote: bool,
}

impl Record for Exec<'_> {
    fn text(&self, out: &mut String) {
        let Some(o) = self.text else { return };
        o.times.push(out);
        if o.print_uid {
            let _ = write!(out, "{:<6} ", self.uid);
        }
        let _ = write!(
            out,
            "{:<16} {:<6} {:<6} {:>3} ",
            self.comm, self.pid, self.ppid, self.retval
        );
        if o.quote {
            let q: Vec<String> = self.args.iter().map(|a| quoted(a)).collect();
            out.push_str(&q.join(" "));
        } else {
            out.push_str(&self.args.join(" "));
        }
        if self.truncated {
            out.push_str(" ...");
        }
        out.push('\n');
    }
}

/// Decodes a ring buffer record: the event's header, then its used bytes of
/// arguments.
fn decode<'a>(record: &[u8]) -> Option<Exec<'a>> {
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
        syscall: if head.flags & FLAG_EXECVEAT != 0 {
            "execveat"
        } else {
            "execve"
        },
        args,
        truncated: head.flags & FLAG_TRUNCATED != 0,
        text: None,
    })
}

fn quoted(arg: &str) -> String {
    format!("\"{}\"", arg.replace('"', "\\\""))
}

/// Offsets the programs need, from BTF and tracefs.
fn config(args: &Args, btf: &Btf) -> anyhow::Result<Config> {
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
        real_parent: member("real_parent")?,
        tgid: member("tgid")?,
        exit_ret: tracefs::Format::read("syscalls", "sys_exit_execve")?.offset("ret")?,
        old_pid: tracefs::Format::read("sched", "sched_process_exec")?.offset("old_pid")?,
        _pad: 0,
        execve: enter("sys_enter_execve")?,
        execveat: enter("sys_enter_execveat")?,
    })
}

/// The tool.
pub struct Execsnoop {
    args: Args,
    text: TextOptions,
}

impl Tool for Execsnoop {
    type Args = Args;
    const NAME: &'static str = "execsnoop";
    const CHAIN: &'static [Mechanism] = &CHAIN;
    const ERRORS: &'static [&'static str] = &LOST_NAMES;

    fn new(args: Args) -> anyhow::Result<Self> {
        let text = TextOptions {
            times: TimeColumns::new(args.time, args.timestamp, 8),
            print_uid: args.print_uid,
            quote: args.quote,
        };
        Ok(Self { args, text })
    }

    fn scope(&self) -> Scope {
        Scope {
            cgroup: self.args.cgroup.clone(),
            ..Scope::default()
        }
    }

    fn events(&self) -> Option<&BufferArgs> {
        Some(&self.args.buffer)
    }

    fn configure(
        &mut self,
        _m: Option<Mechanism>,
        kernel: &mut Kernel,
        load: &mut Load,
    ) -> anyhow::Result<()> {
        load.config(&config(&self.args, kernel.btf()?)?);
        Ok(())
    }

    fn attach(
        &mut self,
        _m: Option<Mechanism>,
        kernel: &mut Kernel,
        ebpf: &mut Ebpf,
    ) -> anyhow::Result<()> {
        let mut hooks = Hooks::new(Mechanism::Tracepoint, kernel)?;
        for (category, event) in HOOKS {
            hooks.attach_event(ebpf, category, event)?;
        }
        Ok(())
    }

    fn describe(&self) -> String {
        "execve, execveat, sched_process_exec".to_owned()
    }

    fn banner(&self) -> String {
        "Tracing exec()s... Hit Ctrl-C to end.".to_owned()
    }

    fn header(&self) -> Option<String> {
        let mut head = self.text.times.header();
        if self.args.print_uid {
            head.push_str(&format!("{:<6} ", "UID"));
        }
        Some(format!(
            "{head}{:<16} {:<6} {:<6} {:>3} ARGS",
            "PCOMM", "PID", "PPID", "RET"
        ))
    }

    fn event(&mut self, record: &[u8], sink: &mut Sink) -> anyhow::Result<()> {
        let Some(mut e) = decode(record) else {
            return Ok(());
        };
        if self.args.name.as_deref().is_some_and(|n| !e.comm.contains(n)) {
            return Ok(());
        }
        if let Some(l) = self.args.line.as_deref()
            && !e.args.join(" ").contains(l)
        {
            return Ok(());
        }
        e.text = Some(&self.text);
        sink.emit(&e)
    }
}

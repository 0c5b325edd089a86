//! `rtrace execsnoop`: one line per exec, as libbpf-tools' execsnoop prints
//! it, plus a PPID column, execveat, full argv and JSON.

use crate::tracer::{Plan, Spec};
use crate::tracer::{ScopeArgs, own};
use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context as _;
use aya::Ebpf;
use rtrace_common::{
    events::LOST_NAMES,
    execsnoop::{
        ARG_SIZE, Config, EnterOffsets, Event, ExecOffsets, FLAG_ARGV, FLAG_EXECVEAT, FLAG_SCRIPT,
        FLAG_TRUNCATED, HEADER_SIZE, MAX_ARGS, TALLY_EXECS, TALLY_SLOTS,
    },
};
use serde::Serialize;

use crate::{
    kernel::{
        btf::Btf,
        features::Mechanism,
        load::{Hooks, Kernel, Load, read_tallies},
        tracefs,
        transport::BufferArgs,
    },
    output::{
        Record, Sink, TimeColumns,
        metrics::{Exposition, Kind},
    },
    tracer::{self, Scope, Tool},
};

/// Arguments captured without `--max-args`, as bcc.
const DEFAULT_MAX_ARGS: u32 = 20;

/// tp_btf: one program at `sched_process_exec` reads the new program's
/// argv. Else the syscall tracepoints, which exist wherever ftrace
/// syscalls do, gather the arguments at the syscalls' entries, as `-x`
/// needs for execs that fail; kprobes on the syscall functions would see
/// nothing they miss.
const CHAIN: [Mechanism; 2] = [Mechanism::TpBtf, Mechanism::Tracepoint];

/// The tracepoints, as (category, event); each has a `tp_<event>` program.
const HOOKS: [(&str, &str); 5] = [
    ("syscalls", "sys_enter_execve"),
    ("syscalls", "sys_enter_execveat"),
    ("syscalls", "sys_exit_execve"),
    ("syscalls", "sys_exit_execveat"),
    ("sched", "sched_process_exec"),
];

/// Trace exec() syscalls (execve and execveat).
#[derive(Debug, clap::Args, Default)]
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
  rtrace execsnoop -c CG       # trace processes in cgroup v2 directory CG
  rtrace execsnoop -- make     # what a build runs, and nothing else, until it ends
  rtrace execsnoop -T --user nobody -- sh -c 'id -un; ls /'
                               # run the command as nobody (-u is the UID filter)")]
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
    /// Trace this user only: a name or a user id.
    #[arg(short = 'u', long, value_name = "USER", value_parser = parse_user)]
    uid: Option<u32>,
    /// Trace the children of this process only (bcc's `--ppid`).
    #[arg(short = 'P', long, value_name = "PPID")]
    ppid: Option<u32>,
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
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_ARGS,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_ARGS)))]
    max_args: u32,
    #[command(flatten)]
    scope: ScopeArgs<{ own::T | own::U }>,
    #[command(flatten)]
    sets: crate::tracer::PinnedSets,
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
fn decode<'a>(record: &[u8], max_args: usize) -> Option<Exec<'a>> {
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
    let (args, truncated) = if head.flags & FLAG_ARGV != 0 {
        bcc_args(&args[..used], head.flags, max_args)
    } else {
        let args = args[..used]
            .split(|&b| b == 0)
            .take(head.args_count as usize)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        (args, head.flags & FLAG_TRUNCATED != 0)
    };
    Some(Exec {
        pid: head.pid,
        ppid: head.ppid,
        uid: head.uid,
        retval: head.retval,
        comm: crate::kernel::c_string(&head.comm),
        syscall: if head.flags & FLAG_EXECVEAT != 0 {
            "execveat"
        } else {
            "execve"
        },
        args,
        truncated,
        text: None,
    })
}

/// The arguments as bcc gathers them at the syscall's entry (the file
/// name, then `argv[1..]`, each cut to `ARG_SIZE - 1` bytes, at most
/// `max_args` in all), from what the tp_btf path read after the exec:
/// the file the kernel ran, then the new program's argv. A script's argv
/// starts with its interpreter (and the interpreter's argument, if any),
/// then the script's name; fexecve's file is `/dev/fd/N`, which bcc
/// shows as `argv[0]`. Returns them and whether any were cut.
fn bcc_args(block: &[u8], flags: u32, max_args: usize) -> (Vec<String>, bool) {
    let mut truncated = flags & FLAG_TRUNCATED != 0;
    let block = block.strip_suffix(&[0]).unwrap_or(block);
    let mut parts = block.split(|&b| b == 0);
    let file = parts.next().unwrap_or_default();
    let mut argv: Vec<&[u8]> = parts.collect();
    if flags & FLAG_SCRIPT != 0
        && let Some(at) = (1..argv.len().min(3)).find(|&i| argv[i] == file)
    {
        argv.drain(..at);
    }
    let fd_path = file
        .strip_prefix(b"/dev/fd/")
        .is_some_and(|n| !n.is_empty() && n.iter().all(u8::is_ascii_digit));
    let first = match argv.first() {
        Some(a0) if flags & FLAG_EXECVEAT != 0 && fd_path => *a0,
        _ => file,
    };
    let mut args = Vec::new();
    for a in std::iter::once(first).chain(argv.into_iter().skip(1)) {
        if args.len() == max_args {
            truncated = true;
            break;
        }
        let cut = &a[..a.len().min(ARG_SIZE - 1)];
        truncated |= cut.len() < a.len();
        args.push(String::from_utf8_lossy(cut).into_owned());
    }
    (args, truncated)
}

fn quoted(arg: &str) -> String {
    format!("\"{}\"", arg.replace('"', "\\\""))
}

/// A user id, or a user's name looked up in `/etc/passwd` (read directly:
/// the static build has no NSS).
fn parse_user(s: &str) -> Result<u32, String> {
    if let Ok(uid) = s.parse() {
        return Ok(uid);
    }
    let passwd = std::fs::read_to_string("/etc/passwd")
        .map_err(|e| format!("cannot read /etc/passwd to find user {s:?}: {e}"))?;
    passwd
        .lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .find(|f| f.len() > 2 && f[0] == s)
        .and_then(|f| f[2].parse().ok())
        .ok_or_else(|| format!("no user {s:?} in /etc/passwd"))
}

/// The programs' configuration for mechanism `m`: the tp_btf path's
/// offsets from BTF, the tracepoints' from tracefs.
fn config(args: &Args, btf: &Btf, m: Mechanism) -> anyhow::Result<Config> {
    let offset = |s: &str, m: &str| {
        btf.offset(s, m)
            .with_context(|| format!("cannot find {s}.{m} in kernel BTF"))
    };
    let member = |m: &str| offset("task_struct", m);
    let mut cfg = Config {
        max_args: args.max_args,
        uid: args.uid.unwrap_or(0),
        filter_uid: u32::from(args.uid.is_some()),
        ppid: args.ppid.unwrap_or(0),
        failed: u32::from(args.fails),
        real_parent: member("real_parent")?,
        tgid: member("tgid")?,
        ..Config::default()
    };
    if m == Mechanism::TpBtf {
        cfg.exec = ExecOffsets {
            mm: member("mm")?,
            arg_start: offset("mm_struct", "arg_start")?,
            arg_end: offset("mm_struct", "arg_end")?,
            filename: offset("linux_binprm", "filename")?,
            interp: offset("linux_binprm", "interp")?,
            fdpath: btf
                .offset("linux_binprm", "fdpath")
                .unwrap_or(rtrace_common::offsets::MISSING),
        };
        return Ok(cfg);
    }
    let enter = |name: &str| -> anyhow::Result<EnterOffsets> {
        let f = tracefs::Format::read("syscalls", name)?;
        Ok(EnterOffsets {
            filename: f.offset("filename")?,
            argv: f.offset("argv")?,
        })
    };
    cfg.exit_ret = tracefs::Format::read("syscalls", "sys_exit_execve")?.offset("ret")?;
    cfg.old_pid = tracefs::Format::read("sched", "sched_process_exec")?.offset("old_pid")?;
    cfg.execve = enter("sys_enter_execve")?;
    cfg.execveat = enter("sys_enter_execveat")?;
    Ok(cfg)
}

/// The tool.
pub struct Execsnoop {
    args: Args,
    text: TextOptions,
    mech: Mechanism,
    /// As a collector: execs so far.
    execs: u64,
}

impl Tool for Execsnoop {
    type Args = Args;

    const SPEC: Spec = Spec::new("execsnoop", &CHAIN, &LOST_NAMES).event_buffer(2 << 20);

    fn new(args: Args) -> anyhow::Result<Self> {
        if let Some(ppid) = args.ppid {
            tracer::check_task(ppid, "process")?;
        }
        let text = TextOptions {
            times: TimeColumns::new(args.time, args.timestamp, 8),
            print_uid: args.print_uid,
            quote: args.quote,
        };
        Ok(Self {
            args,
            text,
            mech: Mechanism::Tracepoint,
            execs: 0,
        })
    }

    fn configure(
        &mut self,
        m: Option<Mechanism>,
        kernel: &mut Kernel,
        load: &mut Load,
    ) -> anyhow::Result<()> {
        let m = m.context("execsnoop attaches through its chain")?;
        load.config(&config(&self.args, kernel.btf()?, m)?);
        self.mech = m;
        Ok(())
    }

    fn attach(
        &mut self,
        _m: Option<Mechanism>,
        kernel: &mut Kernel,
        ebpf: &mut Ebpf,
    ) -> anyhow::Result<()> {
        let mut hooks = Hooks::new(self.mech, kernel)?;
        if self.mech == Mechanism::TpBtf {
            return hooks.attach_event(ebpf, "sched", "sched_process_exec");
        }
        for (category, event) in HOOKS {
            hooks.attach_event(ebpf, category, event)?;
        }
        Ok(())
    }

    fn describe(&self) -> Vec<String> {
        vec![if self.mech == Mechanism::TpBtf {
            "sched_process_exec, argv read from the new program's memory".to_owned()
        } else {
            "execve, execveat, sched_process_exec".to_owned()
        }]
    }

    fn banner(&self) -> String {
        "Tracing exec()s... Hit Ctrl-C to end.".to_owned()
    }

    fn event(&mut self, record: &[u8], sink: &mut Sink) -> anyhow::Result<()> {
        let Some(mut e) = decode(record, self.args.max_args as usize) else {
            return Ok(());
        };
        if self
            .args
            .name
            .as_deref()
            .is_some_and(|n| !e.comm.contains(n))
        {
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

    fn plan(&self) -> Plan {
        Plan {
            scope: Scope {
            cgroup_map: self.args.sets.cgroup_map.clone(),
            mntns_map: self.args.sets.mntns_map.clone(),
            ..self.args.scope.scope()
        },
            forced: // An exec that fails leaves no new program to read argv from.
        self.args.fails.then_some(Mechanism::Tracepoint),
            events: Some(self.args.buffer.clone()),
            header: {
        let mut head = self.text.times.header();
        if self.args.print_uid {
            head.push_str(&format!("{:<6} ", "UID"));
        }
        Some(format!(
            "{head}{:<16} {:<6} {:<6} {:>3} ARGS",
            "PCOMM", "PID", "PPID", "RET"
        ))
    },
            ..Plan::default()
        }
    }
}

impl tracer::Collect for Execsnoop {
    const COLLECTOR: tracer::Collector = tracer::Collector {
        default: true,
        scoped: true,
        tallies: TALLY_SLOTS,
    };

    fn collector(cgroup: Option<&Path>) -> anyhow::Result<Self> {
        let tool = Self::new(Args {
            max_args: DEFAULT_MAX_ARGS,
            scope: ScopeArgs {
                cgroup: cgroup.map(Path::to_owned),
                ..ScopeArgs::default()
            },
            ..Args::default()
        })?;
        Ok(tool)
    }

    fn refresh(&mut self, ebpf: &Ebpf) -> anyhow::Result<()> {
        self.execs = read_tallies(ebpf, TALLY_SLOTS)?[TALLY_EXECS as usize];
        Ok(())
    }

    fn metrics(&self, out: &mut Exposition) {
        out.family(
            "rtrace_execs_total",
            Kind::Counter,
            "Programs started by exec(2) (execve and execveat that succeeded).",
        )
        .value(&[], self.execs as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tp_btf path's block: the file, then argv, NUL-terminated.
    fn block(file: &str, argv: &[&str]) -> Vec<u8> {
        let mut b = Vec::new();
        for s in std::iter::once(file).chain(argv.iter().copied()) {
            b.extend_from_slice(s.as_bytes());
            b.push(0);
        }
        b
    }

    #[test]
    fn argv_read_after_the_exec_takes_bcc_form() {
        let plain = block("/usr/bin/ls", &["ls", "-l", "/tmp"]);
        assert_eq!(
            bcc_args(&plain, FLAG_ARGV, 20),
            (
                vec!["/usr/bin/ls".into(), "-l".into(), "/tmp".into()],
                false
            )
        );
        // `/bin/echo /bin/echo` is no script: its second word stays.
        let echo = block("/bin/echo", &["/bin/echo", "/bin/echo"]);
        assert_eq!(bcc_args(&echo, FLAG_ARGV, 20).0, ["/bin/echo", "/bin/echo"]);
        // `./s.sh a` run by `#!/bin/sh -e`.
        let script = block("./s.sh", &["/bin/sh", "-e", "./s.sh", "a"]);
        assert_eq!(
            bcc_args(&script, FLAG_ARGV | FLAG_SCRIPT, 20).0,
            ["./s.sh", "a"]
        );
        let fexecve = block("/dev/fd/3", &["prog", "x"]);
        assert_eq!(
            bcc_args(&fexecve, FLAG_ARGV | FLAG_EXECVEAT, 20).0,
            ["prog", "x"]
        );
        let long = "y".repeat(ARG_SIZE + 10);
        let cut = bcc_args(&block("/bin/p", &["p", &long, "z"]), FLAG_ARGV, 2);
        assert_eq!(cut.0, ["/bin/p".to_owned(), "y".repeat(ARG_SIZE - 1)]);
        assert!(cut.1, "cut arguments are marked");
    }
}

//! `rtrace ext4slower`: ext4 reads, writes, opens and syncs slower than a
//! threshold, one line each, as bcc's ext4slower prints them.

use std::io::Write as _;

use anyhow::Context as _;
use aya::{Btf, EbpfLoader};
use rtrace_common::ext4slower::{
    Config, Event, FileOffsets, OP_FSYNC, OP_OPEN, OP_READ, OP_WRITE, WHOLE_FILE,
};

use crate::{
    GlobalArgs,
    btf::Btf as KernelBtf,
    features::{Features, Mechanism, attach_chain, attach_kernel_fn, check_forced, kernel_btf},
    objects,
    output::{
        self, Signals,
        events::{self, BufferArgs, EventStream, Transport, report_lost},
    },
    privs, tracefs,
};

/// fentry is cheapest (5.5+); kprobes work on any kernel built with them;
/// the syscall tracepoints work everywhere but see every read and write
/// on any file system, and must look the file up to filter.
const CHAIN: [Mechanism; 3] = [Mechanism::Fentry, Mechanism::Kprobe, Mechanism::Tracepoint];

/// The ext4 functions, with the suffix of their programs' names.
const FUNCTIONS: [(&str, &str); 4] = [
    ("ext4_file_read_iter", "read"),
    ("ext4_file_write_iter", "write"),
    ("ext4_file_open", "open"),
    ("ext4_sync_file", "sync"),
];

/// The syscalls of the tracepoint path; each has a `tp_sys_enter_<name>`
/// program, and `tp_sys_exit` serves all their exits.
const SYSCALLS: [&str; 9] = [
    "read",
    "write",
    "pread64",
    "pwrite64",
    "readv",
    "writev",
    "openat",
    "fsync",
    "fdatasync",
];

/// Trace common ext4 file operations slower than a threshold.
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:
  rtrace ext4slower             # trace operations slower than 10 ms (default)
  rtrace ext4slower 1           # trace operations slower than 1 ms
  rtrace ext4slower -m 0        # trace all operations (lots of output)
  rtrace ext4slower -c          # CSV output (ENDTIME_ns,...,LATENCY_us,FILE)
  rtrace ext4slower -p 185      # trace PID 185 only
  rtrace ext4slower -d 10       # trace for 10 seconds only
  rtrace ext4slower --json      # one JSON object per operation")]
pub struct Args {
    /// Trace operations slower than this many milliseconds (0: all).
    #[arg(value_name = "MIN_MS", conflicts_with = "min")]
    min_ms: Option<f64>,
    /// Trace operations slower than this many milliseconds (0: all).
    #[arg(short = 'm', long = "min", value_name = "MIN_MS")]
    min: Option<f64>,
    /// Trace this process only.
    #[arg(short = 'p', long)]
    pid: Option<u32>,
    /// Trace for this many seconds, then exit.
    #[arg(short = 'd', long, value_name = "SECS",
          value_parser = clap::value_parser!(u64).range(1..))]
    duration: Option<u64>,
    /// Comma-separated values: ENDTIME_ns,TASK,PID,TYPE,BYTES,OFFSET_b,LATENCY_us,FILE.
    #[arg(short = 'c', long, conflicts_with = "json")]
    csv: bool,
    /// Attach with this mechanism instead of the best one that works
    /// (fentry, kprobe or tracepoint).
    #[arg(long, value_enum, value_name = "MECHANISM")]
    attach: Option<Mechanism>,
    #[command(flatten)]
    buffer: BufferArgs,
}

/// Offsets into the file structures, from BTF.
fn file_offsets(btf: &KernelBtf) -> anyhow::Result<FileOffsets> {
    Ok(FileOffsets {
        fd: btf.fd_offsets()?,
        f_inode: btf.offset("file", "f_inode")?,
        i_sb: btf.offset("inode", "i_sb")?,
        s_magic: btf.offset("super_block", "s_magic")?,
        f_dentry: btf.offset("file", "f_path.dentry")?,
        d_name: btf.offset("dentry", "d_name.name")?,
        f_pos: btf.offset("file", "f_pos")?,
        ki_filp: btf.offset("kiocb", "ki_filp")?,
        ki_pos: btf.offset("kiocb", "ki_pos")?,
    })
}

/// Fills in the syscall record offsets, which only the tracepoint path
/// reads: every `sys_enter_*` record has the same layout, as has every
/// `sys_exit_*`.
fn syscall_offsets(cfg: &mut Config) -> Result<(), tracefs::TracefsError> {
    cfg.sys_args = tracefs::Format::read("syscalls", "sys_enter_read")?.offset("fd")?;
    cfg.sys_ret = tracefs::Format::read("syscalls", "sys_exit_read")?.offset("ret")?;
    Ok(())
}

/// Attaches every program of mechanism `m`.
fn attach(ebpf: &mut aya::Ebpf, m: Mechanism, btf: Option<&Btf>) -> anyhow::Result<()> {
    match m {
        Mechanism::Fentry => {
            for (func, op) in FUNCTIONS {
                attach_kernel_fn(ebpf, &format!("fentry_{op}"), Mechanism::Fentry, func, btf)?;
                attach_kernel_fn(ebpf, &format!("fexit_{op}"), Mechanism::Fexit, func, btf)?;
            }
        }
        Mechanism::Kprobe => {
            for (func, op) in FUNCTIONS {
                attach_kernel_fn(ebpf, &format!("kprobe_{op}"), Mechanism::Kprobe, func, None)?;
                attach_kernel_fn(ebpf, "kretprobe_ext4", Mechanism::Kretprobe, func, None)?;
            }
        }
        _ => {
            let hooks = crate::features::Hooks::new(Mechanism::Tracepoint)?;
            for sc in SYSCALLS {
                let enter = format!("sys_enter_{sc}");
                hooks.attach(ebpf, &format!("tp_{enter}"), "syscalls", &enter)?;
                hooks.attach(ebpf, "tp_sys_exit", "syscalls", &format!("sys_exit_{sc}"))?;
            }
        }
    }
    Ok(())
}

/// An operation as user space prints it.
struct Op {
    event: Event,
    comm: String,
    name: String,
}

impl Op {
    fn kind(&self) -> char {
        match self.event.op {
            OP_READ => 'R',
            OP_WRITE => 'W',
            OP_OPEN => 'O',
            OP_FSYNC => 'F',
            _ => '?',
        }
    }

    fn text(&self) -> String {
        let e = &self.event;
        let bytes = if e.bytes == WHOLE_FILE {
            "LL_MAX".to_owned()
        } else {
            e.bytes.to_string()
        };
        format!(
            "{:<8} {:<16.16} {:<7} {} {:<7} {:<8} {:7.2} {}",
            output::hms(),
            self.comm,
            e.pid,
            self.kind(),
            bytes,
            e.offset / 1024,
            e.delta_ns as f64 / 1e6,
            self.name,
        )
    }

    fn csv(&self) -> String {
        let e = &self.event;
        format!(
            "{},{},{},{},{},{},{},{}",
            e.end_ns,
            self.comm,
            e.pid,
            self.kind(),
            e.bytes,
            e.offset,
            e.delta_ns / 1000,
            self.name,
        )
    }

    fn json(&self) -> serde_json::Value {
        let e = &self.event;
        serde_json::json!({
            "tool": "ext4slower",
            "time": output::hms(),
            "timestamp": output::epoch_secs(),
            "comm": self.comm,
            "pid": e.pid,
            "type": self.kind().to_string(),
            "bytes": if e.bytes == WHOLE_FILE { serde_json::Value::Null } else { e.bytes.into() },
            "whole_file": e.bytes == WHOLE_FILE,
            "offset": e.offset,
            "latency_ms": e.delta_ns as f64 / 1e6,
            "latency_ns": e.delta_ns,
            "file": self.name,
        })
    }
}

/// Runs the tool.
pub async fn run(args: Args, global: &GlobalArgs) -> anyhow::Result<()> {
    let min_ms = args.min.or(args.min_ms).unwrap_or(10.0);
    if !(min_ms >= 0.0 && min_ms.is_finite()) {
        anyhow::bail!("bad threshold {min_ms}: use milliseconds, 0 or more");
    }
    if let Some(pid) = args.pid {
        super::check_pid(pid)?;
    }
    check_forced("ext4slower", args.attach, &CHAIN)?;
    privs::check()?;

    let kbtf = KernelBtf::from_kernel().context("ext4slower reads files through kernel BTF")?;
    let base = Config {
        min_ns: (min_ms * 1e6) as u64,
        pid: args.pid.unwrap_or(0),
        self_pid: std::process::id(),
        file: file_offsets(&kbtf)?,
        ..Config::default()
    };
    let mut features = Features::new();
    let (transport, why) = Transport::choose(&mut features, &args.buffer);
    let (mech, mut ebpf, skipped) = attach_chain(&mut features, &CHAIN, args.attach, |m| {
        let mut cfg = base;
        let btf = if m == Mechanism::Fentry {
            Some(kernel_btf().map_err(|e| anyhow::anyhow!("cannot read kernel BTF: {e}"))?)
        } else {
            None
        };
        if m == Mechanism::Tracepoint {
            syscall_offsets(&mut cfg)?;
        }
        let mut loader = EbpfLoader::new();
        loader
            .override_global("CONFIG", &cfg, true)
            .map_max_entries("STARTS", super::runnable_entries());
        let mut ebpf = transport
            .size(&mut loader, &args.buffer)
            .load(transport.object(objects::EXT4SLOWER, objects::EXT4SLOWER_PERF))
            .context("cannot load the ext4slower programs")?;
        attach(&mut ebpf, m, btf)?;
        Ok(ebpf)
    })?;
    if global.verbose {
        for (m, why) in &skipped {
            eprintln!("rtrace: ext4slower: skipped {m}: {why}");
        }
        let on = if mech == Mechanism::Tracepoint {
            "syscall tracepoints, keeping files on ext4"
        } else {
            "ext4_file_read_iter, ext4_file_write_iter, ext4_file_open, ext4_sync_file"
        };
        eprintln!("rtrace: ext4slower: attached with {mech} ({on})");
        transport.report("ext4slower", why.as_deref());
    }
    let mut stream = EventStream::new(&mut ebpf, transport, &args.buffer)?;
    let mut signals = Signals::new()?;
    signals.stop_after(args.duration);
    let what = if min_ms > 0.0 {
        format!("Tracing ext4 operations slower than {min_ms} ms")
    } else {
        "Tracing ext4 operations".to_owned()
    };
    match args.duration {
        Some(d) => eprintln!("{what} for {d} secs."),
        None => eprintln!("{what}... Hit Ctrl-C to end."),
    }
    if args.csv {
        println!("ENDTIME_ns,TASK,PID,TYPE,BYTES,OFFSET_b,LATENCY_us,FILE");
    } else if !global.json {
        println!(
            "{:<8} {:<16} {:<7} T {:<7} {:<8} {:>7} FILENAME",
            "TIME", "COMM", "PID", "BYTES", "OFF_KB", "LAT(ms)"
        );
    }
    stream
        .run(&mut signals, |record| {
            let Some(event) = events::record::<Event>(record) else {
                return Ok(true);
            };
            let op = Op {
                comm: output::c_string(&event.comm),
                name: output::c_string(&event.name),
                event,
            };
            if global.json {
                output::json_line(&op.json())?;
            } else {
                let line = if args.csv { op.csv() } else { op.text() };
                writeln!(std::io::stdout(), "{line}").context("cannot write to stdout")?;
            }
            Ok(true)
        })
        .await?;
    report_lost(&ebpf, &stream)
}

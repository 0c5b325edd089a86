//! File system operations slower than a threshold, one line each, as
//! bcc's ext4slower prints them: the tool that `ext4slower` (ext4) and
//! `fsslower` (`-t TYPE`) are front-ends of, each choosing the file
//! system ([`FsChoice`]). Its programs are the `ext4slower` object's.

use crate::tracer::{Plan, Spec};
use crate::tracer::{ScopeArgs, own};
use anyhow::Context as _;
use aya::Ebpf;
use rtrace_common::{
    events::LOST_NAMES,
    ext4slower::{Config, Event, FileOffsets, OP_FSYNC, OP_OPEN, OP_READ, OP_WRITE, WHOLE_FILE},
};

use crate::{
    kernel::{
        btf::Btf,
        features::Mechanism,
        load::{Hooks, Kernel, Load, TASK_STORAGE, attach_kernel_fn, in_flight},
        tracefs,
        transport::BufferArgs,
    },
    output::{self, Record, Sink, events},
    tracer::{Scope, Tool},
};

/// fentry is cheapest (5.5+); kprobes work on any kernel built with them;
/// the syscall tracepoints work everywhere but see every read and write
/// on any file system, and must look the file up to filter.
const CHAIN: [Mechanism; 3] = [Mechanism::Fentry, Mechanism::Kprobe, Mechanism::Tracepoint];

/// The suffixes of the programs' names, in the order of [`Fs::functions`].
const OPS: [&str; 4] = ["read", "write", "open", "sync"];

/// A file system the tool can trace: its name, its superblock magic
/// (`include/uapi/linux/magic.h`), and its read, write, open and sync
/// file operations, as libbpf-tools' fsslower knows them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fs {
    /// As `-t` takes it.
    pub name: &'static str,
    magic: u64,
    functions: [&'static str; 4],
}

/// The file systems `fsslower -t` takes.
pub const FILE_SYSTEMS: [Fs; 4] = [
    Fs {
        name: "ext4",
        magic: 0xEF53,
        functions: [
            "ext4_file_read_iter",
            "ext4_file_write_iter",
            "ext4_file_open",
            "ext4_sync_file",
        ],
    },
    Fs {
        name: "xfs",
        magic: 0x5846_5342,
        functions: [
            "xfs_file_read_iter",
            "xfs_file_write_iter",
            "xfs_file_open",
            "xfs_file_fsync",
        ],
    },
    Fs {
        name: "btrfs",
        magic: 0x9123_683E,
        functions: [
            "btrfs_file_read_iter",
            "btrfs_file_write_iter",
            "btrfs_file_open",
            "btrfs_sync_file",
        ],
    },
    Fs {
        name: "nfs",
        magic: 0x6969,
        functions: [
            "nfs_file_read",
            "nfs_file_write",
            "nfs_file_open",
            "nfs_file_fsync",
        ],
    },
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
  rtrace ext4slower --json      # one JSON object per operation
  rtrace ext4slower -m 0 -- tar xf src.tar   # every operation of one tar, until it exits
  rtrace ext4slower --min=1 -- dd if=/dev/zero of=f bs=1M count=32 conv=fsync")]
pub struct Args {
    /// Trace operations slower than this many milliseconds (0: all).
    #[arg(value_name = "MIN_MS", conflicts_with = "min")]
    min_ms: Option<f64>,
    /// Trace operations slower than this many milliseconds (0: all).
    #[arg(short = 'm', long = "min", value_name = "MIN_MS")]
    min: Option<f64>,
    #[command(flatten)]
    scope: ScopeArgs<{ own::C | own::T }>,
    /// Trace for this many seconds, then exit (not with -- CMD, which says
    /// when to stop).
    #[arg(short = 'd', long, value_name = "SECS",
          value_parser = crate::output::at_least_one::<u64>)]
    duration: Option<u64>,
    /// Comma-separated values: ENDTIME_ns,TASK,PID,TYPE,BYTES,OFFSET_b,LATENCY_us,FILE
    /// (libbpf-tools' `-c`; bcc's ext4slower calls it `-j`, which works too).
    #[arg(short = 'c', long, short_alias = 'j', conflicts_with = "json")]
    csv: bool,
    /// Attach with this mechanism instead of the best one that works.
    #[arg(long, value_name = "MECHANISM", value_parser = Mechanism::parser(&CHAIN))]
    attach: Option<Mechanism>,
    #[command(flatten)]
    buffer: BufferArgs,
}

/// Offsets into the file structures, from BTF.
fn file_offsets(btf: &Btf) -> anyhow::Result<FileOffsets> {
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

/// Attaches every program of mechanism `m`, for file system `fs`.
fn attach(ebpf: &mut Ebpf, kernel: &mut Kernel, m: Mechanism, fs: &Fs) -> anyhow::Result<()> {
    match m {
        Mechanism::Fentry => {
            for (func, op) in fs.functions.into_iter().zip(OPS) {
                attach_kernel_fn(
                    ebpf,
                    kernel,
                    &format!("fentry_{op}"),
                    Mechanism::Fentry,
                    func,
                )?;
                attach_kernel_fn(ebpf, kernel, &format!("fexit_{op}"), Mechanism::Fexit, func)?;
            }
        }
        Mechanism::Kprobe => {
            for (func, op) in fs.functions.into_iter().zip(OPS) {
                attach_kernel_fn(
                    ebpf,
                    kernel,
                    &format!("kprobe_{op}"),
                    Mechanism::Kprobe,
                    func,
                )?;
                attach_kernel_fn(ebpf, kernel, "kretprobe_ext4", Mechanism::Kretprobe, func)?;
            }
        }
        _ => {
            let mut hooks = Hooks::new(Mechanism::Tracepoint, kernel)?;
            for sc in SYSCALLS {
                let enter = format!("sys_enter_{sc}");
                hooks.attach(ebpf, &format!("tp_{enter}"), "syscalls", &enter)?;
                hooks.attach(
                    ebpf,
                    rtrace_common::ext4slower::PROG_TP_SYS_EXIT,
                    "syscalls",
                    &format!("sys_exit_{sc}"),
                )?;
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
    csv: bool,
}

impl Record for Op {
    fn text(&self, out: &mut String) {
        out.push_str(&if self.csv { self.csv() } else { self.line() });
        out.push('\n');
    }
}

impl serde::Serialize for Op {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        self.json().serialize(ser)
    }
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

    fn line(&self) -> String {
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

/// Which file system a [`Slower`] traces, and how its command line says
/// so: ext4slower's is fixed, fsslower's is `-t`.
pub trait FsChoice {
    /// The command line.
    type Args: clap::Args + std::fmt::Debug;
    /// The subcommand.
    const NAME: &'static str;
    /// The common arguments, and the file system chosen.
    fn split(args: Self::Args) -> (Args, &'static Fs);
}

/// The tool, on the file system `F` chooses.
pub struct Slower<F> {
    args: Args,
    /// The file system traced: ext4, or `fsslower -t`'s.
    fs: &'static Fs,
    min_ms: f64,
    mech: Option<Mechanism>,
    /// Where operations in flight are kept, for `-v`.
    store: &'static str,
    choice: std::marker::PhantomData<F>,
}

impl<F: FsChoice> Tool for Slower<F> {
    type Args = F::Args;

    // Every file system's programs are ext4slower's.
    const SPEC: Spec = Spec::new(F::NAME, &CHAIN, &LOST_NAMES).object("ext4slower");

    fn new(args: F::Args) -> anyhow::Result<Self> {
        let (args, fs) = F::split(args);
        let min_ms = args.min.or(args.min_ms).unwrap_or(10.0);
        if !(min_ms >= 0.0 && min_ms.is_finite()) {
            anyhow::bail!("bad threshold {min_ms}: use milliseconds, 0 or more");
        }
        Ok(Self {
            args,
            fs,
            min_ms,
            mech: None,
            store: "",
            choice: std::marker::PhantomData,
        })
    }

    fn configure(
        &mut self,
        m: Option<Mechanism>,
        kernel: &mut Kernel,
        load: &mut Load,
    ) -> anyhow::Result<()> {
        let btf = kernel
            .btf()
            .context("ext4slower reads files through kernel BTF")?;
        let mut cfg = Config {
            min_ns: (self.min_ms * 1e6) as u64,
            file: file_offsets(btf)?,
            magic: self.fs.magic,
            ..Config::default()
        };
        if m == Some(Mechanism::Tracepoint) {
            syscall_offsets(&mut cfg)?;
        }
        load.config(&cfg);
        self.store = in_flight(load);
        self.mech = m;
        Ok(())
    }

    fn attach(
        &mut self,
        m: Option<Mechanism>,
        kernel: &mut Kernel,
        ebpf: &mut Ebpf,
    ) -> anyhow::Result<()> {
        attach(
            ebpf,
            kernel,
            m.context("ext4slower attaches through its chain")?,
            self.fs,
        )
    }

    fn describe(&self) -> Vec<String> {
        vec![{
            let hooks = if self.mech == Some(Mechanism::Tracepoint) {
                format!("syscall tracepoints, keeping files on {}", self.fs.name)
            } else {
                self.fs.functions.join(", ")
            };
            format!("{hooks}; operations in flight in {}", self.store)
        }]
    }

    /// Task storage saves a hash insert and delete per operation; the
    /// hash stays as the fallback where the variant does not load.
    fn variants(&self, _m: Option<Mechanism>, _kernel: &mut Kernel) -> Vec<&'static str> {
        vec![TASK_STORAGE, ""]
    }

    fn banner(&self) -> String {
        let what = if self.min_ms > 0.0 {
            format!(
                "Tracing {} operations slower than {} ms",
                self.fs.name, self.min_ms
            )
        } else {
            format!("Tracing {} operations", self.fs.name)
        };
        match self.args.duration {
            Some(d) => format!("{what} for {d} secs."),
            None => format!("{what}... Hit Ctrl-C to end."),
        }
    }

    fn event(&mut self, record: &[u8], sink: &mut Sink) -> anyhow::Result<()> {
        let Some(event) = events::record::<Event>(record) else {
            return Ok(());
        };
        sink.emit(&Op {
            comm: crate::kernel::c_string(&event.comm),
            name: crate::kernel::c_string(&event.name),
            event,
            csv: self.args.csv,
        })
    }

    fn plan(&self) -> Plan {
        Plan {
            scope: Scope {
                // rtrace's own output written to a file on ext4 would
                // otherwise feed back into what it traces.
                exclude_self: true,
                ..self.args.scope.scope()
            },
            forced: self.args.attach,
            events: Some(self.args.buffer.clone()),
            duration: self.args.duration,
            header: Some(if self.args.csv {
                "ENDTIME_ns,TASK,PID,TYPE,BYTES,OFFSET_b,LATENCY_us,FILE".to_owned()
            } else {
                format!(
                    "{:<8} {:<16} {:<7} T {:<7} {:<8} {:>7} FILENAME",
                    "TIME", "COMM", "PID", "BYTES", "OFF_KB", "LAT(ms)"
                )
            }),
            ..Plan::default()
        }
    }
}

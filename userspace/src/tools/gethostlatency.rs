//! `rtrace gethostlatency`: host name lookups through libc and how long
//! each took, as bcc's gethostlatency prints them.

use crate::tracer::ScopeArgs;
use crate::tracer::{Plan, Spec};
use std::path::PathBuf;

use anyhow::Context as _;
use aya::Ebpf;
use rtrace_common::{
    events::LOST_NAMES,
    gethostlatency::{Event, FUNC_BY_ADDR, FUNCTIONS},
};
use serde::Serialize;

use crate::{
    kernel::{
        features::Mechanism,
        load::{Kernel, Load, TASK_STORAGE, in_flight},
        transport::BufferArgs,
    },
    output::{self, Record, Sink, events},
    probes::uprobes,
    tracer::{self, Tool},
};

/// Show latency for getaddrinfo/gethostbyname[2][_r]/gethostbyaddr calls.
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:
  rtrace gethostlatency            # time lookups by every process
  rtrace gethostlatency -p 181     # only trace PID 181
  rtrace gethostlatency -l /usr/lib/musl/lib/libc.so  # this libc
  rtrace gethostlatency --json     # one JSON object per lookup
  rtrace gethostlatency -- getent ahosts localhost   # the lookups of one command
  rtrace gethostlatency -p 181 -- sleep 10           # PID 181's lookups for 10 seconds")]
pub struct Args {
    /// The processes traced (with -p, each process's own libc is found
    /// through /proc/PID/root, so a container's libc is traced).
    #[command(flatten)]
    scope: ScopeArgs,
    /// The libc to trace (default: the process's with -p, else the
    /// system's).
    #[arg(short = 'l', long, value_name = "LIBC")]
    libc: Option<PathBuf>,
    #[command(flatten)]
    buffer: BufferArgs,
}

/// One lookup.
#[derive(Serialize)]
struct Lookup {
    pid: u32,
    comm: String,
    function: &'static str,
    latency_ms: f64,
    latency_ns: u64,
    host: String,
}

impl Record for Lookup {
    fn text(&self, out: &mut String) {
        out.push_str(&format!(
            "{:<8} {:<7} {:<16.16} {:>10.3} {}\n",
            output::hms(),
            self.pid,
            self.comm,
            self.latency_ms,
            self.host
        ));
    }
}

/// The tool.
pub struct Gethostlatency {
    args: Args,
    libc: PathBuf,
    attached: Vec<&'static str>,
    missing: Vec<String>,
    /// Where lookups in flight are kept, for `-v`.
    store: &'static str,
}

impl Tool for Gethostlatency {
    type Args = Args;

    const SPEC: Spec = Spec::new("gethostlatency", &[Mechanism::Uprobe], &LOST_NAMES);

    fn new(args: Args) -> anyhow::Result<Self> {
        // The process's own libc is looked up, so it must exist first.
        if let Some(pid) = args.scope.one_pid() {
            tracer::check_task(pid, "process")?;
        }
        let libc = match &args.libc {
            Some(path) => {
                let p = path.to_str().context("the libc path is not UTF-8")?;
                // An explicit path is the caller's view, not the process's.
                uprobes::resolve(p, None)?
            }
            None => uprobes::resolve("c", args.scope.one_pid())?,
        };
        Ok(Self {
            args,
            libc,
            attached: Vec::new(),
            missing: Vec::new(),
            store: "",
        })
    }

    /// Task storage saves a hash insert and delete per lookup; the hash
    /// stays as the fallback where the variant does not load (before
    /// 5.11). Loading is the probe, as for runqlat.
    fn variants(&self, _m: Option<Mechanism>, _kernel: &mut Kernel) -> Vec<&'static str> {
        vec![TASK_STORAGE, ""]
    }

    fn configure(
        &mut self,
        _m: Option<Mechanism>,
        _kernel: &mut Kernel,
        load: &mut Load,
    ) -> anyhow::Result<()> {
        self.store = in_flight(load);
        Ok(())
    }

    fn attach(
        &mut self,
        _m: Option<Mechanism>,
        kernel: &mut Kernel,
        ebpf: &mut Ebpf,
    ) -> anyhow::Result<()> {
        let symbols = kernel.symbols(&self.libc);
        self.attached.clear();
        self.missing.clear();
        for func in FUNCTIONS {
            let (libc, pid) = (&self.libc, self.args.scope.one_pid());
            let entry = uprobes::attach(ebpf, &format!("enter_{func}"), func, libc, symbols, pid);
            // Without its return probe, an entry would only fill the table.
            let both = entry.and_then(|()| {
                uprobes::attach(
                    ebpf,
                    rtrace_common::gethostlatency::PROG_LOOKUP_RETURN,
                    func,
                    libc,
                    symbols,
                    pid,
                )
            });
            match both {
                Ok(()) => self.attached.push(func),
                Err(e) => self.missing.push(format!("{e:#}")),
            }
        }
        if self.attached.is_empty() {
            anyhow::bail!(
                "no resolver function could be traced in {}: {}",
                self.libc.display(),
                self.missing.join("; ")
            );
        }
        Ok(())
    }

    fn describe(&self) -> Vec<String> {
        let mut lines = vec![{
            format!(
                "{} in {}; lookups in flight in {}",
                self.attached.join(", "),
                self.libc.display(),
                self.store
            )
        }];
        lines.extend(self.missing.iter().map(|m| format!("skipped: {m}")));
        lines
    }

    fn banner(&self) -> String {
        "Tracing getaddrinfo/gethostbyname/gethostbyaddr calls... Hit Ctrl-C to end.".to_owned()
    }

    fn event(&mut self, record: &[u8], sink: &mut Sink) -> anyhow::Result<()> {
        let Some(e) = events::record::<Event>(record) else {
            return Ok(());
        };
        sink.emit(&Lookup {
            pid: e.pid,
            comm: crate::kernel::c_string(&e.comm),
            function: FUNCTIONS.get(e.func as usize).copied().unwrap_or("?"),
            latency_ms: e.delta_ns as f64 / 1e6,
            latency_ns: e.delta_ns,
            host: if e.func == FUNC_BY_ADDR {
                address(&e.host)
            } else {
                crate::kernel::c_string(&e.host)
            },
        })
    }

    fn plan(&self) -> Plan {
        Plan {
            scope: self.args.scope.scope(),
            events: Some(self.args.buffer.clone()),
            header: Some(format!(
                "{:<8} {:<7} {:<16} {:>10} HOST",
                "TIME", "PID", "COMM", "LATms"
            )),
            ..Plan::default()
        }
    }
}

/// The address `gethostbyaddr` was given, as text: its family in byte
/// 0, its length in byte 1, its bytes after.
fn address(raw: &[u8]) -> String {
    let (family, len) = (raw[0], raw[1]);
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&raw[2..18]);
    match output::ip_addr(family.into(), &bytes) {
        Some(a) if usize::from(len) == if a.is_ipv4() { 4 } else { 16 } => a.to_string(),
        _ => format!("[address of family {family}, {len} bytes]"),
    }
}

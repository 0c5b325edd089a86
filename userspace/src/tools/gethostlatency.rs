//! `rtrace gethostlatency`: host name lookups through libc and how long
//! each took, as bcc's gethostlatency prints them.

use std::{io::Write as _, path::PathBuf};

use anyhow::Context as _;
use aya::EbpfLoader;
use rtrace_common::gethostlatency::{Event, FUNCTIONS};

use crate::{
    GlobalArgs,
    features::{Features, Mechanism},
    objects,
    output::{
        self, Signals,
        events::{self, BufferArgs, EventStream, Transport, report_lost},
    },
    privs, uprobes,
};

/// Show latency for getaddrinfo/gethostbyname[2] calls.
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:
  rtrace gethostlatency            # time lookups by every process
  rtrace gethostlatency -p 181     # only trace PID 181
  rtrace gethostlatency -l /usr/lib/musl/lib/libc.so  # this libc
  rtrace gethostlatency --json     # one JSON object per lookup")]
pub struct Args {
    /// Trace this process only; its own libc is found through
    /// /proc/PID/root, so a container's libc is traced.
    #[arg(short = 'p', long)]
    pid: Option<u32>,
    /// The libc to trace (default: the process's with -p, else the
    /// system's).
    #[arg(short = 'l', long, value_name = "LIBC")]
    libc: Option<PathBuf>,
    #[command(flatten)]
    buffer: BufferArgs,
}

/// Runs the tool.
pub async fn run(args: Args, global: &GlobalArgs) -> anyhow::Result<()> {
    if let Some(pid) = args.pid {
        super::check_pid(pid)?;
    }
    let libc = match &args.libc {
        Some(path) => {
            let p = path.to_str().context("the libc path is not UTF-8")?;
            // An explicit path is the caller's view, not the process's.
            uprobes::resolve(p, None)?
        }
        None => uprobes::resolve("c", args.pid)?,
    };
    privs::check()?;

    let mut features = Features::new();
    if let Err(why) = features.check(Mechanism::Uprobe) {
        anyhow::bail!("gethostlatency needs uprobes, which do not work here: {why}");
    }
    let (transport, why) = Transport::choose(&mut features, &args.buffer);
    let mut loader = EbpfLoader::new();
    loader.map_max_entries("STARTS", super::runnable_entries());
    let mut ebpf = transport
        .size(&mut loader, &args.buffer)
        .load(transport.object(objects::GETHOSTLATENCY, objects::GETHOSTLATENCY_PERF))
        .context("cannot load the gethostlatency programs")?;
    let mut attached = Vec::new();
    let mut missing = Vec::new();
    for func in FUNCTIONS {
        let entry = uprobes::attach(&mut ebpf, &format!("enter_{func}"), func, &libc, args.pid);
        // Without its return probe, an entry would only fill the table.
        let both =
            entry.and_then(|()| uprobes::attach(&mut ebpf, "lookup_return", func, &libc, args.pid));
        match both {
            Ok(()) => attached.push(func),
            Err(e) => missing.push(format!("{e:#}")),
        }
    }
    if attached.is_empty() {
        anyhow::bail!(
            "no resolver function could be traced in {}: {}",
            libc.display(),
            missing.join("; ")
        );
    }
    if global.verbose {
        eprintln!(
            "rtrace: gethostlatency: uprobes on {} in {}",
            attached.join(", "),
            libc.display()
        );
        for m in &missing {
            eprintln!("rtrace: gethostlatency: skipped: {m}");
        }
        transport.report("gethostlatency", why.as_deref());
    }
    let mut stream = EventStream::new(&mut ebpf, transport, &args.buffer)?;
    let mut signals = Signals::new()?;
    eprintln!("Tracing getaddrinfo/gethostbyname calls... Hit Ctrl-C to end.");
    if !global.json {
        println!(
            "{:<8} {:<7} {:<16} {:>10} HOST",
            "TIME", "PID", "COMM", "LATms"
        );
    }
    stream
        .run(&mut signals, |record| {
            let Some(e) = events::record::<Event>(record) else {
                return Ok(true);
            };
            let comm = output::c_string(&e.comm);
            let host = output::c_string(&e.host);
            let ms = e.delta_ns as f64 / 1e6;
            if global.json {
                output::json_line(&serde_json::json!({
                    "tool": "gethostlatency",
                    "time": output::hms(),
                    "timestamp": output::epoch_secs(),
                    "pid": e.pid,
                    "comm": comm,
                    "function": FUNCTIONS.get(e.func as usize).copied().unwrap_or("?"),
                    "latency_ms": ms,
                    "latency_ns": e.delta_ns,
                    "host": host,
                }))?;
            } else {
                writeln!(
                    std::io::stdout(),
                    "{:<8} {:<7} {:<16.16} {ms:>10.3} {host}",
                    output::hms(),
                    e.pid,
                    comm
                )
                .context("cannot write to stdout")?;
            }
            Ok(true)
        })
        .await?;
    report_lost(&ebpf, &stream)
}

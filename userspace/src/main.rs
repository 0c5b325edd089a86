//! rtrace: bcc's tracing tools as one self-contained binary.
//!
//! Each tool is a module under `tools/` with its kernel side in
//! `ebpf-programs/src/bin/` and its shared types in `common/`; histograms,
//! JSON, intervals and signals, attach fallback chains, BTF offsets and
//! privilege checks are shared modules here.

mod batch;
mod btf;
mod cficache;
mod doctor;
mod exporter;
mod features;
mod memory;
mod objects;
mod offcpu;
mod output;
mod privs;
mod procmaps;
mod stackstore;
mod stacktool;
mod symbolize;
mod tools;
mod tracefs;
mod tracer;
mod transport;
mod unwind;
mod uprobes;
mod usdt;

use std::process::ExitCode;

use clap::Parser;

/// The git commit rtrace was built from.
pub const BUILD_COMMIT: &str = env!("RTRACE_COMMIT");
/// The version of aya rtrace was built with.
pub const AYA_VERSION: &str = env!("RTRACE_AYA");

/// What `--version` says: the release, the commit, and the aya crates of
/// both sides.
const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    "\ncommit ",
    env!("RTRACE_COMMIT"),
    "\naya ",
    env!("RTRACE_AYA"),
    ", aya-ebpf ",
    env!("RTRACE_AYA_EBPF"),
);

/// Options every tracing tool takes; the other commands take those that
/// do something there.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct GlobalArgs {
    /// Say which attach mechanism was chosen and why others were skipped.
    #[arg(short, long)]
    pub verbose: bool,
    /// Print one JSON object per line instead of text.
    #[arg(long)]
    pub json: bool,
    /// Keep per-thread state in hash maps even where the kernel has task
    /// local storage, which is cheaper (for comparison and testing).
    #[arg(long)]
    pub no_task_storage: bool,
}

// A tool's own arguments and the ones every tool takes. No doc comment:
// clap would make it every tool's about text, which is the tool's own.
#[derive(Debug, clap::Args)]
pub(crate) struct WithGlobal<A: clap::Args> {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(flatten)]
    pub args: A,
}

/// eBPF tracing tools: bcc's tools in one binary, with no compiler,
/// headers or Python needed at run time.
#[derive(Debug, Parser)]
#[command(name = "rtrace", version, long_version = LONG_VERSION, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: tools::Command,
}

fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|e| {
        e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

fn main() -> ExitCode {
    // A bug must still be one line on stderr, not a backtrace.
    std::panic::set_hook(Box::new(|info| {
        eprintln!("rtrace: internal error: {info}");
    }));
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("rtrace: error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(tools::run(cli.command)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) if is_broken_pipe(&err) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("rtrace: error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

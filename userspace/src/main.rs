//! rtrace: bcc's tracing tools as one self-contained binary.
//!
//! Each tool is a module under `tools/` with its kernel side in
//! `ebpf-programs/src/bin/` and its shared types in `common/`. The layers
//! import downwards only: `tools` use the `tracer`, which uses `stacks`,
//! `probes` and `output`, which use `kernel`, which uses `rtrace_common`.

mod engine;
mod kernel;
mod output;
mod probes;
mod stacks;
mod tools;
mod tracer;

use std::process::ExitCode;

fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|e| {
        e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

fn main() -> ExitCode {
    // A bug must still be one line on stderr, not a backtrace; the
    // release build then aborts (`panic = "abort"`), and the next rtrace
    // removes what it left in the kernel (a command's cgroup).
    std::panic::set_hook(Box::new(|info| {
        eprintln!("rtrace: internal error: {info}");
    }));
    let cli = tools::Cli::parse_args();
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
        Ok(status) => ExitCode::from(status),
        Err(err) if is_broken_pipe(&err) => ExitCode::SUCCESS,
        // A command that could not be run exits with 127, as in a shell.
        Err(err) if err.is::<tracer::command::NotRun>() => {
            eprintln!("rtrace: error: {err:#}");
            ExitCode::from(127)
        }
        Err(err) => {
            eprintln!("rtrace: error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

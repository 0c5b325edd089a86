//! Developer chores for rtrace: `cargo xtask setup | build | run | test | bench`.
//!
//! Every command first installs what is missing (the pinned nightly with
//! rust-src, a
//! pinned bpf-linker, Debian packages the tests and benchmarks use), so a
//! fresh machine needs nothing but this repository.

mod bench;
mod dist;
#[cfg(test)]
mod house;
mod programs;
mod setup;
mod vm;

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};
use clap::Parser;

#[derive(Parser)]
#[command(name = "cargo xtask")]
enum Cli {
    /// Install whatever building and testing need (idempotent).
    Setup,
    /// Build the release `rtrace` binary, eBPF programs included.
    Build,
    /// Build, then run rtrace with the given arguments.
    Run {
        /// Arguments for rtrace, e.g. `runqlat 1 5`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Every check: fmt, clippy on both sides, unit and root integration
    /// tests on this kernel, then the integration tests on other kernels.
    Test {
        /// Skip the kernels under qemu (for quick iterations).
        #[arg(long)]
        no_vm: bool,
    },
    /// The integration tests on Debian's kernels under qemu.
    VmTest {
        /// Passed to every test executable, e.g. a test name filter.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// The static, stripped binary (musl) and a Debian package with the
    /// exporter's systemd unit, in `target/dist/`.
    Dist,
    /// Overhead benchmarks against the peers, measured in the same run.
    Bench {
        /// Which benchmark (default: all).
        name: Option<String>,
    },
}

/// The workspace root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Runs a command, failing with its description if it fails.
pub fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("cannot start {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed ({status})");
    }
    Ok(())
}

/// Runs a command and returns its standard output, failing with its
/// description and standard error if it fails.
pub fn stdout_of(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd
        .output()
        .with_context(|| format!("cannot start {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Cargo of the pinned nightly, in the eBPF crate, as the build uses it.
fn nightly_cargo() -> anyhow::Result<Command> {
    ebpf_build::cargo(&root()).map_err(anyhow::Error::msg)
}

fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(root());
    cmd
}

/// Builds rtrace and the test workloads in release mode.
pub fn build() -> anyhow::Result<PathBuf> {
    run(cargo().args([
        "build",
        "--release",
        "-p",
        "rtrace",
        "-p",
        "rtrace-integration-tests",
        "--bins",
    ]))?;
    Ok(root().join("target/release/rtrace"))
}

fn test(vm: bool) -> anyhow::Result<()> {
    run(cargo().args(["fmt", "--all", "--check"]))?;
    // The tools' modules are declared by the registry's macro, where
    // `cargo fmt` does not follow: they are checked by name.
    let mut tools: Vec<PathBuf> = std::fs::read_dir(root().join("userspace/src/tools"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .collect();
    tools.sort();
    run(Command::new("rustfmt")
        .args(["--edition", "2024", "--check"])
        .args(&tools))?;
    run(nightly_cargo()?.args(["fmt", "--check"]))?;
    run(cargo().args([
        "clippy",
        "--release",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    // Default features and all of them: each cfg branch is linted once.
    for features in [None, Some("--all-features")] {
        run(nightly_cargo()?
            .args(["clippy", "--release"])
            .args(features)
            .args(["--", "-D", "warnings"]))?;
    }
    setup::python_peers()?;
    let bin = build()?;
    let static_bin = dist::static_binary()?;
    run(cargo().args([
        "test",
        "--release",
        "-p",
        "rtrace-common",
        "-p",
        "rtrace",
        "-p",
        "ebpf-build",
        "-p",
        "xtask",
    ]))?;
    // Root tests: one at a time, since they trace the whole machine.
    run(cargo()
        .args([
            "test",
            "--release",
            "-p",
            "rtrace-integration-tests",
            "--",
            "--test-threads=1",
        ])
        .env("RTRACE_BIN", &bin)
        .env("RTRACE_STATIC_BIN", &static_bin)
        .env("RTRACE_TRIXIE_ROOT", setup::trixie_root())
        .env("RTRACE_PY_SPY", setup::py_spy()))?;
    if vm {
        vm::run_matrix(&[])?;
    }
    Ok(())
}

fn main() {
    let cli = Cli::parse();
    if let Err(e) = dispatch(cli) {
        eprintln!("xtask: error: {e:#}");
        std::process::exit(1);
    }
}

fn dispatch(cli: Cli) -> anyhow::Result<()> {
    setup::ensure()?;
    match cli {
        Cli::Setup => Ok(()),
        Cli::Build => build().map(drop),
        Cli::Run { args } => {
            let bin = build()?;
            let status = Command::new(&bin).args(&args).status()?;
            std::process::exit(status.code().unwrap_or(1));
        }
        Cli::Test { no_vm } => test(!no_vm),
        Cli::VmTest { args } => vm::run_matrix(&args),
        Cli::Dist => dist::run_dist(),
        Cli::Bench { name } => bench::run(name.as_deref()),
    }
}

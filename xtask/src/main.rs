//! Developer chores for rtrace: `cargo xtask setup | build | run | test | bench`.
//!
//! Every command first installs what is missing (the pinned nightly with
//! rust-src, a
//! pinned bpf-linker, Debian packages the tests and benchmarks use), so a
//! fresh machine needs nothing but this repository.

mod background;
mod bench;
mod dist;
#[cfg(test)]
mod house;
mod otelcol;
mod programs;
mod setup;
mod suite;
mod vm;

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
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
        /// Run the integration tests matching FILTER this many times each
        /// on the host, and report their passes, failures and times:
        /// for finding flaky tests.
        #[arg(long, value_name = "N", requires = "filter",
              value_parser = clap::value_parser!(u32).range(1..))]
        repeat: Option<u32>,
        /// With --repeat: the tests whose `suite::name` contains this.
        #[arg(requires = "repeat")]
        filter: Option<String>,
    },
    /// The integration tests on Debian's kernels under qemu: those the
    /// guests run in `cargo xtask test`, or those whose `suite::name`
    /// contains FILTER.
    VmTest {
        /// Which tests (a part of `suite::name`); all the guests' tests
        /// when absent.
        filter: Option<String>,
        /// Run each chosen test this many times in every guest: for
        /// finding tests that fail only now and then under emulation.
        #[arg(long, value_name = "N", default_value_t = 1,
              value_parser = clap::value_parser!(u32).range(1..))]
        repeat: u32,
    },
    /// Runs a shell command in every guest of the matrix (busybox sh,
    /// with the release binary as `/t/rtrace`) and prints what each
    /// printed: for looking at what the tests see there.
    VmSh {
        /// The command line.
        command: String,
    },
    /// The static, stripped binary (musl) and a Debian package with the
    /// exporter's systemd unit, in `target/dist/`.
    Dist,
    /// Build the OpenTelemetry Collector the fleet profiles are to be
    /// shipped to (from Debian sid's packaged sources, cached), check that
    /// it takes a profile, and print its path.
    Otelcol,
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
    background::redirect(cmd)?;
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

/// [`build`]'s cargo arguments.
const BUILD: [&str; 7] = [
    "build",
    "--release",
    "-p",
    "rtrace",
    "-p",
    "rtrace-integration-tests",
    "--bins",
];

/// Builds rtrace and the test workloads in release mode.
pub fn build() -> anyhow::Result<PathBuf> {
    run(cargo().args(BUILD))?;
    Ok(root().join("target/release/rtrace"))
}

/// Builds what the integration tests run: rtrace, the workloads, and the
/// tests themselves, in one cargo run, so that compiling the tests' crates
/// takes the second core while rtrace's own crate (one codegen unit) holds
/// the first.
fn build_for_tests() -> anyhow::Result<PathBuf> {
    run(&mut cargo_for_tests())?;
    Ok(root().join("target/release/rtrace"))
}

/// [`build_for_tests`]'s cargo command: [`build`]'s, with the
/// integration tests.
fn cargo_for_tests() -> Command {
    let mut cmd = cargo();
    cmd.args(BUILD).args(["--test", "*"]);
    cmd
}

/// Runs `cmd` as a step of the test run: a failure is kept for the report
/// at the end rather than stopping the run, so that every check reports.
fn step(failures: &mut Vec<String>, what: &str, cmd: &mut Command) {
    if let Err(e) = run(cmd) {
        eprintln!("xtask: {what} failed: {e:#}");
        failures.push(what.to_owned());
    }
}

/// The environment of the integration tests on the host; the Collector
/// the exporter's profiles go to is built first if it is not (minutes,
/// once: `cargo xtask otelcol`).
fn test_env(bin: PathBuf, static_bin: PathBuf) -> anyhow::Result<Vec<(&'static str, PathBuf)>> {
    Ok(vec![
        ("RTRACE_BIN", bin),
        ("RTRACE_STATIC_BIN", static_bin),
        ("RTRACE_TRIXIE_ROOT", setup::TRIXIE.path()),
        ("RTRACE_SID_ROOT", setup::SID.path()),
        ("RTRACE_JDK_ROOT", setup::JDKS.path()),
        ("RTRACE_NODE18_ROOT", setup::NODE18.path()),
        ("RTRACE_NODE20_ROOT", setup::NODE20.path()),
        ("RTRACE_NODE24_ROOT", setup::NODE24.path()),
        ("RTRACE_PY_SPY", setup::py_spy()),
        ("RTRACE_OTELCOL", otelcol::install()?),
    ])
}

fn test(vm: bool) -> anyhow::Result<()> {
    let start = Instant::now();
    let mut phases = suite::Phases::default();
    let mut failures = Vec::new();
    let phase = Instant::now();
    step(
        &mut failures,
        "cargo fmt",
        cargo().args(["fmt", "--all", "--check"]),
    );
    // The tools' modules are declared by the registry's macro, where
    // `cargo fmt` does not follow: they are checked by name.
    let mut tools: Vec<PathBuf> = std::fs::read_dir(root().join("userspace/src/tools"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .collect();
    tools.sort();
    step(
        &mut failures,
        "rustfmt of the tools",
        Command::new("rustfmt")
            .args(["--edition", "2024", "--check"])
            .args(&tools),
    );
    step(
        &mut failures,
        "cargo fmt of the eBPF programs",
        nightly_cargo()?.args(["fmt", "--check"]),
    );
    step(
        &mut failures,
        "clippy",
        cargo().args([
            "clippy",
            "--release",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ]),
    );
    // Default features and all of them: each cfg branch is linted once.
    for features in [None, Some("--all-features")] {
        step(
            &mut failures,
            "clippy of the eBPF programs",
            nightly_cargo()?
                .args(["clippy", "--release"])
                .args(features)
                .args(["--", "-D", "warnings"]),
        );
    }
    phases.add("lints", phase.elapsed().as_secs_f64());
    let phase = Instant::now();
    setup::peers()?;
    let bin = build_for_tests()?;
    let cases = suite::cases("")?;
    let env = test_env(bin.clone(), dist::static_path())?;
    let background = background::Background::start(|| {
        let mut failures = Vec::new();
        // The release profile strips rtrace's symbols; its unit tests that
        // symbolize and unwind their own test binary need them, so theirs
        // keep them (rtrace's crate alone is built once more for it).
        step(
            &mut failures,
            "unit tests",
            cargo().env("RTRACE_JDK_ROOT", setup::JDKS.path()).args([
                "test",
                "--release",
                "--config",
                "profile.release.package.rtrace.strip=\"none\"",
                "--no-fail-fast",
                "-p",
                "rtrace-common",
                "-p",
                "rtrace",
                "-p",
                "ebpf-build",
                "-p",
                "xtask",
            ]),
        );
        failures
    })?;
    phases.add("build", phase.elapsed().as_secs_f64());
    // Root tests: one at a time, since they trace the whole machine; those
    // of the static binary last, once the background has built it.
    let phase = Instant::now();
    let (of_static, others): (Vec<_>, Vec<_>) = cases
        .iter()
        .cloned()
        .partition(|c| suite::OF_THE_STATIC_BINARY.contains(&c.id().as_str()));
    let mut records = suite::run_all_host(&others, 0, cases.len(), &env)?;
    phases.add("host", phase.elapsed().as_secs_f64());
    let phase = Instant::now();
    let static_built = background.static_binary();
    phases.add(
        "waiting for the static build",
        phase.elapsed().as_secs_f64(),
    );
    if let Err(e) = &static_built {
        eprintln!("xtask: {e:#}");
        failures.push("the static build".to_owned());
    } else {
        records.extend(suite::run_all_host(
            &of_static,
            others.len(),
            cases.len(),
            &env,
        )?);
    }
    if vm && static_built.is_ok() {
        let phase = Instant::now();
        let guest = suite::guest_cases(&cases);
        // A matrix that cannot start (a kernel that cannot be downloaded)
        // is one failure; the host's results are still reported.
        match vm::run_matrix(&vm::Built(bin), &guest) {
            Ok((guest_records, times)) => {
                records.extend(guest_records);
                for (place, secs) in times {
                    phases.add(&format!("guest {place}"), secs);
                }
            }
            Err(e) => {
                eprintln!("xtask: the VM matrix failed: {e:#}");
                failures.push(format!("the VM matrix: {e:#}"));
            }
        }
        phases.add("guests", phase.elapsed().as_secs_f64());
    }
    let phase = Instant::now();
    let (background_failures, background_secs) = background.finish();
    failures.extend(background_failures);
    phases.add("waiting for the unit tests", phase.elapsed().as_secs_f64());
    // Not a phase of its own: it ran beside the host's tests.
    phases.add("(background, beside them)", background_secs);
    suite::report(&records, &phases, start.elapsed().as_secs_f64(), &failures)
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
        Cli::Otelcol => {
            let bin = otelcol::install()?;
            println!("{}", bin.display());
            Ok(())
        }
        Cli::Build => build().map(drop),
        Cli::Run { args } => {
            let bin = build()?;
            let status = Command::new(&bin).args(&args).status()?;
            std::process::exit(status.code().unwrap_or(1));
        }
        Cli::Test {
            repeat: Some(times),
            filter,
            ..
        } => {
            setup::peers()?;
            let bin = build()?;
            let static_bin = dist::static_binary()?;
            suite::repeat(
                times,
                filter.as_deref().unwrap_or(""),
                &test_env(bin, static_bin)?,
            )
        }
        Cli::Test { no_vm, .. } => test(!no_vm),
        Cli::VmTest { filter, repeat } => {
            let start = Instant::now();
            let filter = filter.unwrap_or_default();
            let cases = suite::cases(&filter)?;
            let chosen = if filter.is_empty() {
                suite::guest_cases(&cases)
            } else {
                cases
            };
            let guest: Vec<suite::Case> = chosen
                .iter()
                .flat_map(|c| std::iter::repeat_n(c.clone(), repeat as usize))
                .collect();
            let (records, times) = vm::run_matrix(&vm::Built::build()?, &guest)?;
            let mut phases = suite::Phases::default();
            for (place, secs) in times {
                phases.add(&place, secs);
            }
            suite::report(&records, &phases, start.elapsed().as_secs_f64(), &[])
        }
        Cli::VmSh { command } => {
            let mark = "=== rtrace-vm-sh:";
            let body = format!("( {command} ) 2>&1 | sed 's/^/{mark} /'\n");
            for (package, lines) in vm::marked_lines(&body, mark)? {
                println!("== {package}");
                for line in lines {
                    println!("{line}");
                }
            }
            Ok(())
        }
        Cli::Dist => dist::run_dist(),
        Cli::Bench { name } => bench::run(name.as_deref()),
    }
}

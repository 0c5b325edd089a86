//! The tools. Each is a module with a type implementing
//! [`Tool`](crate::tracer::Tool), and one line in the registry below,
//! which declares the module and generates its subcommand and dispatch.
//! The top layer: only `main` imports it; it may import every other.

pub mod doctor;
pub mod exporter;
pub mod flamegraph;
pub mod list;
pub mod report;
pub mod slower;

use crate::tracer::{self, GlobalArgs};

/// The `Tool` methods of a front-end of the engine's sampling, which
/// keeps its [`Sampler`](crate::engine::sampling::Sampler) in the field
/// `sampler`: what to attach and how, and the stacks written at the end,
/// are the sampler's. The front-end keeps its flags, its scope, its
/// banner and what it prints; with `report`, the sampler's plan, files
/// and outcome are its too.
macro_rules! sampling_tool {
    // Also the run's plan (the front-end's scope in `self.scope`), the
    // stacks written at the end and the outcome: the sampler's report.
    (report) => {
        $crate::tools::sampling_tool!();

        fn plan(&self) -> $crate::tracer::Plan {
            $crate::tracer::Plan {
                events: Some(self.sampler.events().clone()),
                duration: self.sampler.duration(),
                scope: self.scope.clone(),
                interval: self.sampler.interval(),
                ..$crate::tracer::Plan::default()
            }
        }

        fn finish(
            &mut self,
            ebpf: &mut aya::Ebpf,
            sink: &mut $crate::output::Sink,
        ) -> anyhow::Result<()> {
            self.sampler.finish(ebpf, sink)
        }

        fn outcome(&self) -> $crate::tracer::Outcome {
            $crate::tracer::Outcome {
                summary: self.sampler.summary(),
                warnings: self.sampler.warnings(),
            }
        }
    };
    () => {
        fn scoped(&mut self, scope: &$crate::tracer::Scope) {
            self.sampler.scoped(scope);
        }

        fn variants(
            &self,
            _m: Option<$crate::kernel::features::Mechanism>,
            _kernel: &mut $crate::kernel::load::Kernel,
        ) -> Vec<&'static str> {
            self.sampler.variants()
        }

        fn configure(
            &mut self,
            _m: Option<$crate::kernel::features::Mechanism>,
            kernel: &mut $crate::kernel::load::Kernel,
            load: &mut $crate::kernel::load::Load,
        ) -> anyhow::Result<()> {
            self.sampler.configure(kernel, load)
        }

        fn attach(
            &mut self,
            _m: Option<$crate::kernel::features::Mechanism>,
            kernel: &mut $crate::kernel::load::Kernel,
            ebpf: &mut aya::Ebpf,
        ) -> anyhow::Result<()> {
            self.sampler.attach(kernel, ebpf)
        }

        fn describe(&self) -> Vec<String> {
            let mut lines = vec![self.sampler.describe()];
            lines.extend(self.sampler.notes());
            lines
        }

        fn event(&mut self, record: &[u8], _sink: &mut $crate::output::Sink) -> anyhow::Result<()> {
            self.sampler.event(record)
        }

        fn after_events(&mut self, ebpf: &mut aya::Ebpf) -> anyhow::Result<()> {
            self.sampler.after_events(ebpf)
        }
    };
}
use sampling_tool;

/// The `Tool` methods of a tool that counts time off the CPU by stack
/// through the engine's [`OffCpuStacks`](crate::engine::offcpu::OffCpuStacks),
/// kept in its field `run`: the tool has `fn filter(&self) -> Filter`,
/// and its `args` carry `stacks` (the walk's flags), `kernel_only` and
/// `scope`. It keeps its banner, its plan and what it prints.
macro_rules! off_cpu_tool {
    () => {
        fn variants(
            &self,
            _m: Option<$crate::kernel::features::Mechanism>,
            _kernel: &mut $crate::kernel::load::Kernel,
        ) -> Vec<&'static str> {
            $crate::engine::offcpu::OffCpuStacks::variants(
                &self.args.stacks,
                !self.args.kernel_only,
            )
        }

        fn configure(
            &mut self,
            m: Option<$crate::kernel::features::Mechanism>,
            kernel: &mut $crate::kernel::load::Kernel,
            load: &mut $crate::kernel::load::Load,
        ) -> anyhow::Result<()> {
            let filter = self.filter();
            self.run
                .configure(m, filter, &self.args.stacks, kernel, load)
        }

        fn attach(
            &mut self,
            m: Option<$crate::kernel::features::Mechanism>,
            kernel: &mut $crate::kernel::load::Kernel,
            ebpf: &mut aya::Ebpf,
        ) -> anyhow::Result<()> {
            self.run.attach(m, kernel, ebpf, &self.args.scope.pids)
        }

        fn describe(&self) -> Vec<String> {
            self.run.describe()
        }

        fn start(&mut self) {
            self.run.start();
        }

        fn event(&mut self, record: &[u8], _sink: &mut $crate::output::Sink) -> anyhow::Result<()> {
            self.run.stacks.event(record)
        }

        fn after_events(&mut self, _ebpf: &mut aya::Ebpf) -> anyhow::Result<()> {
            self.run.stacks.look_again();
            Ok(())
        }

        fn tick(
            &mut self,
            ebpf: &mut aya::Ebpf,
            _sink: &mut $crate::output::Sink,
            last: bool,
        ) -> anyhow::Result<()> {
            self.run.tick(ebpf, last)
        }
    };
}
use off_cpu_tool;

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

/// eBPF tracing tools: bcc's tools in one binary, with no compiler,
/// headers or Python needed at run time.
#[derive(Debug, clap::Parser)]
#[command(name = "rtrace", version, long_version = LONG_VERSION, propagate_version = true)]
pub struct Cli {
    /// The command to run.
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// The command line as clap builds it, with bcc's letters where they
    /// differ from rtrace's own: stackcount's and wakeuptime's `-v` is
    /// bcc's (addresses), so rtrace's verbose output is `--verbose` there.
    pub fn command_line() -> clap::Command {
        <Self as clap::CommandFactory>::command()
            .mut_subcommand("stackcount", |s| s.mut_arg("verbose", |a| a.short(None)))
            .mut_subcommand("wakeuptime", |s| {
                s.mut_arg("verbose", |a| a.short(None))
                    .mut_arg("addresses", |a| a.short('v'))
            })
    }

    /// Parses the process's arguments; a usage error exits with 2.
    pub fn parse_args() -> Self {
        let matches = Self::command_line().get_matches();
        <Self as clap::FromArgMatches>::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
    }
}

/// Declares the tools' modules, the subcommands and their dispatch.
macro_rules! registry {
    ($($variant:ident => $module:ident :: $tool:ident),* $(,)?) => {
        $(pub mod $module;)*

        /// The subcommands.
        #[derive(Debug, clap::Subcommand)]
        pub enum Command {
            /// Show what this kernel supports and which attach mechanisms work.
            Doctor {
                /// Print the report as one JSON object.
                #[arg(long)]
                json: bool,
            },
            $(
                #[allow(missing_docs, reason = "the about text is the arguments' doc comment")]
                // Boxed: tools' arguments differ much in size.
                $variant(Box<tracer::WithGlobal<<$module::$tool as tracer::Tool>::Args>>),
            )*
            /// Draw flame graphs from folded stacks (differential: `diff`).
            Flamegraph(flamegraph::Args),
            /// List the events, tracepoints, kernel functions and USDT probes
            /// this machine offers, as perf list and tplist do.
            List(list::Args),
            /// Report on a saved profile (pprof or folded stacks) as perf
            /// report does: overhead by comm, dso and symbol, call chains,
            /// annotated instructions.
            Report(report::Args),
            /// Serve the tools' histograms and counters as Prometheus metrics.
            Exporter(exporter::Args),
            /// Print a completion script for SHELL: `rtrace completions bash
            /// > /etc/bash_completion.d/rtrace`.
            Completions {
                /// The shell: bash, zsh, fish, elvish or powershell.
                #[arg(value_enum)]
                shell: clap_complete::Shell,
            },
            /// Write a man page for rtrace and one for each command into DIR
            /// (`rtrace.1`, `rtrace-runqlat.1`, ...).
            Man {
                /// The folder to write the pages into (it is created).
                dir: std::path::PathBuf,
            },
        }


        /// Runs one subcommand; its exit status (a command's, in command
        /// mode) on success.
        pub async fn run(command: Command) -> anyhow::Result<u8> {
            match command {
                // With no probe, trace is strace's engine under perf
                // trace's name, as perf trace traces syscalls with no events.
                Command::Trace(a) if a.args.syscalls() => {
                    let a = *a;
                    let run = a.args.into_syscalls()?;
                    let flags = strace::TraceFlags {
                        times: run.times,
                        summary: run.summary,
                        duration: run.duration,
                    };
                    let args = strace::Args::for_trace(run.scope, run.buffer, flags);
                    tracer::run::<strace::Strace>(args, &a.global).await
                }
                $(Command::$variant(a) => {
                    let a = *a;
                    tracer::run::<$module::$tool>(a.args, &a.global).await
                })*
                other => run_other(other).await.map(|()| 0),
            }
        }

        async fn run_other(command: Command) -> anyhow::Result<()> {
            match command {
                Command::Doctor { json } => doctor::run(&GlobalArgs {
                    json,
                    ..GlobalArgs::default()
                }),
                $(Command::$variant(_) => unreachable!("tools run in `run`"),)*
                Command::Flamegraph(args) => flamegraph::run(args),
                Command::Report(args) => report::run(args),
                Command::List(args) => list::run(args),
                Command::Exporter(args) => {
                    let global = args.global();
                    exporter::run(args, &global, collectors()).await
                }
                Command::Completions { shell } => {
                    let mut cmd = Cli::command_line();
                    clap_complete::generate(shell, &mut cmd, "rtrace", &mut std::io::stdout());
                    Ok(())
                }
                Command::Man { dir } => crate::output::manpages::write(&dir, Cli::command_line()),
            }
        }
    };
}

/// Every tool that can be a collector of the exporter ([`tracer::Collect`]).
pub fn collectors() -> Vec<exporter::Entry> {
    vec![
        exporter::Entry::of::<runqlat::Runqlat>(),
        exporter::Entry::of::<execsnoop::Execsnoop>(),
        exporter::Entry::of::<tcplife::Tcplife>(),
        exporter::Entry::of::<biolatency::Biolatency>(),
    ]
}

registry! {
    Runqlat => runqlat::Runqlat,
    Execsnoop => execsnoop::Execsnoop,
    Tcplife => tcplife::Tcplife,
    Ext4slower => ext4slower::Ext4slower,
    Fsslower => fsslower::Fsslower,
    Gethostlatency => gethostlatency::Gethostlatency,
    Argdist => argdist::Argdist,
    Biolatency => biolatency::Biolatency,
    Profile => profile::Profile,
    Offcputime => offcputime::Offcputime,
    Stat => stat::Stat,
    Stackcount => stackcount::Stackcount,
    Strace => strace::Strace,
    Trace => trace::Trace,
    Top => top::Top,
    Memleak => memleak::Memleak,
    Wakeuptime => wakeuptime::Wakeuptime,
}

#[cfg(test)]
mod tests {

    /// clap's own checks of the whole command line: no two arguments of
    /// a subcommand share a letter or a name. clap makes them only where
    /// its crate keeps debug assertions, which `cargo test --release`
    /// does not: the duplicates that matter most are also looked for here,
    /// in every subcommand (a debug build of `rtrace fsslower --help`
    /// once panicked on two groups named `Args`, while this test passed).
    #[test]
    fn the_command_line_is_consistent() {
        super::Cli::command_line().debug_assert();
        fn check(cmd: &clap::Command, path: &str, bad: &mut Vec<String>) {
            let mut seen = std::collections::HashSet::new();
            let mut twice = |kind: &str, what: String| {
                if !seen.insert(format!("{kind} {what}")) {
                    bad.push(format!("{path}: {kind} {what} twice"));
                }
            };
            for g in cmd.get_groups() {
                twice("group", g.get_id().to_string());
            }
            for a in cmd.get_arguments() {
                twice("argument", a.get_id().to_string());
                if let Some(c) = a.get_short() {
                    twice("short", c.to_string());
                }
                if let Some(l) = a.get_long() {
                    twice("long", l.to_owned());
                }
            }
            for sub in cmd.get_subcommands() {
                check(sub, &format!("{path} {}", sub.get_name()), bad);
            }
        }
        let mut bad = Vec::new();
        let mut cli = super::Cli::command_line();
        cli.build();
        check(&cli, "rtrace", &mut bad);
        assert!(bad.is_empty(), "{bad:#?}");
    }

    /// Every collector builds as one from its typed arguments, with and
    /// without the exporter's cgroup.
    #[test]
    fn every_collector_builds() {
        for e in super::collectors() {
            assert!(!e.name.is_empty());
        }
        use crate::tracer::Collect as _;
        let cg = Some(std::path::Path::new("/sys/fs/cgroup"));
        for cgroup in [None, cg] {
            super::runqlat::Runqlat::collector(cgroup).unwrap();
            super::execsnoop::Execsnoop::collector(cgroup).unwrap();
            super::tcplife::Tcplife::collector(None).unwrap();
            super::biolatency::Biolatency::collector(cgroup).unwrap();
        }
    }

    /// Every command but the two that print rtrace's own files has a
    /// page under `docs/tools/`, linked from the README's table.
    #[test]
    fn every_command_has_a_page() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
        let cmd = <super::Cli as clap::CommandFactory>::command();
        let mut missing = Vec::new();
        for sub in cmd.get_subcommands() {
            let name = sub.get_name();
            if matches!(name, "completions" | "man" | "help") {
                continue;
            }
            let page = format!("docs/tools/{name}.md");
            if !root.join(&page).is_file() {
                missing.push(format!("{page} (no such file)"));
            } else if !readme.contains(&format!("({page})")) {
                missing.push(format!("{page} (not linked from README.md)"));
            }
        }
        assert!(missing.is_empty(), "commands without a page: {missing:?}");
    }
}

//! `rtrace stackcount`: bcc's stackcount, the stacks that lead to each
//! event of tracepoints, with bcc's flags. It is `rtrace profile -e` under
//! bcc's spelling: its flags become profile's, and profile's object,
//! walk, store and outputs do the work.

use aya::Ebpf;
use clap::Parser as _;

use super::profile::{self, Profile};
use crate::{
    kernel::{
        features::Mechanism,
        load::{Kernel, Load},
        transport::BufferArgs,
    },
    output::{Schedule, Sink},
    tracer::{Scope, Tool},
};

#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:
  rtrace stackcount t:sched:sched_switch -K    # kernel stacks of every context switch
  rtrace stackcount -p 185 t:syscalls:sys_enter_write   # who writes, in PID 185
  rtrace stackcount -f -D 10 't:block:block_rq_*'       # folded, for 10 seconds")]
/// Count the stacks that lead to events, as bcc's stackcount does: every
/// event of the tracepoints a pattern names.
pub struct Args {
    /// The events: tracepoints as bcc spells them (t:CATEGORY:EVENT) or
    /// as perf does (CATEGORY:EVENT), globs allowed.
    #[arg(value_name = "PATTERN")]
    pattern: String,
    /// Trace this process only.
    #[arg(short = 'p', long)]
    pid: Option<u32>,
    /// Trace this CPU only.
    #[arg(short = 'c', long)]
    cpu: Option<u32>,
    /// Total duration of the trace, in seconds.
    #[arg(short = 'D', long, value_parser = crate::output::at_least_one::<u64>)]
    duration: Option<u64>,
    /// Show stacks per process (rtrace always names each stack's process;
    /// taken for bcc's command lines).
    #[arg(short = 'P', long = "perpid")]
    per_pid: bool,
    /// Kernel stacks only.
    #[arg(short = 'K', long = "kernel-stacks-only", conflicts_with = "user_only")]
    kernel_only: bool,
    /// User stacks only.
    #[arg(short = 'U', long = "user-stacks-only")]
    user_only: bool,
    /// A delimiter between the kernel and the user stack.
    #[arg(short = 'd', long)]
    delimited: bool,
    /// Folded output: one line a stack, for flame graphs.
    #[arg(short = 'f', long)]
    folded: bool,
    /// bcc's summary interval: not yet (the count is printed at the end).
    #[arg(short = 'i', long, value_name = "SECONDS")]
    interval: Option<u64>,
    /// bcc's regular-expression patterns: not yet (patterns are globs).
    #[arg(short = 'r', long)]
    regexp: bool,
    /// bcc's address offsets: not yet.
    #[arg(short = 's', long)]
    offset: bool,
    /// bcc's raw addresses: not yet.
    #[arg(short = 'v', long)]
    raw_addresses: bool,
}

/// profile's arguments, parsed from the command line stackcount's flags
/// make.
#[derive(Debug, clap::Parser)]
#[command(name = "profile")]
struct AsProfile {
    #[command(flatten)]
    args: profile::Args,
}

/// The tool: profile, at every event of the pattern's tracepoints.
pub struct Stackcount {
    profile: Profile,
    pattern: String,
}

impl Args {
    /// profile's command line for these flags.
    fn profile_argv(&self) -> anyhow::Result<Vec<String>> {
        for (set, flag) in [
            (self.interval.is_some(), "-i"),
            (self.regexp, "-r"),
            (self.offset, "-s"),
            (self.raw_addresses, "-v"),
        ] {
            if set {
                anyhow::bail!("stackcount's {flag} is not supported yet");
            }
        }
        let pattern = self.pattern.strip_prefix("t:").unwrap_or(&self.pattern);
        if !pattern.contains(':') {
            anyhow::bail!(
                "{}: stackcount counts tracepoints (t:CATEGORY:EVENT); kernel and user \
                 functions are not counted yet",
                self.pattern
            );
        }
        let mut argv: Vec<String> = ["profile", "-e", pattern].map(str::to_owned).to_vec();
        let mut add = |set: bool, flag: &str| {
            if set {
                argv.push(flag.to_owned());
            }
        };
        add(self.kernel_only, "-K");
        add(self.user_only, "-U");
        add(self.delimited, "-d");
        add(self.folded, "-f");
        if let Some(pid) = self.pid {
            argv.extend(["-p".to_owned(), pid.to_string()]);
        }
        if let Some(cpu) = self.cpu {
            argv.extend(["-C".to_owned(), cpu.to_string()]);
        }
        if let Some(d) = self.duration {
            argv.push(d.to_string());
        }
        Ok(argv)
    }
}

impl Tool for Stackcount {
    type Args = Args;
    const NAME: &'static str = "stackcount";
    const OBJECT: &'static str = <Profile as Tool>::OBJECT;
    const CHAIN: &'static [Mechanism] = <Profile as Tool>::CHAIN;
    const ERRORS: &'static [&'static str] = <Profile as Tool>::ERRORS;
    const EXPECTED: &'static [u32] = <Profile as Tool>::EXPECTED;

    fn new(args: Args) -> anyhow::Result<Self> {
        let argv = args.profile_argv()?;
        let parsed = AsProfile::try_parse_from(&argv)
            .map_err(|e| anyhow::anyhow!("{}", e.render().to_string().trim()))?;
        Ok(Self {
            profile: Profile::new(parsed.args)?,
            pattern: args.pattern,
        })
    }

    fn scope(&self) -> Scope {
        self.profile.scope()
    }

    fn scoped(&mut self, scope: &Scope) {
        self.profile.scoped(scope);
    }

    fn events(&self) -> Option<&BufferArgs> {
        self.profile.events()
    }

    fn duration(&self) -> Option<u64> {
        self.profile.duration()
    }

    fn variants(&self, m: Option<Mechanism>, kernel: &mut Kernel) -> Vec<&'static str> {
        self.profile.variants(m, kernel)
    }

    fn configure(
        &mut self,
        m: Option<Mechanism>,
        kernel: &mut Kernel,
        load: &mut Load,
    ) -> anyhow::Result<()> {
        self.profile.configure(m, kernel, load)
    }

    fn attach(
        &mut self,
        m: Option<Mechanism>,
        kernel: &mut Kernel,
        ebpf: &mut Ebpf,
    ) -> anyhow::Result<()> {
        self.profile.attach(m, kernel, ebpf)
    }

    fn describe(&self) -> String {
        self.profile.describe()
    }

    fn notes(&self) -> Vec<String> {
        self.profile.notes()
    }

    fn interval(&self) -> Schedule {
        self.profile.interval()
    }

    fn banner(&self) -> String {
        // bcc's own line, so that scripts waiting for it find it.
        format!(
            "Tracing {} functions for \"{}\"... Hit Ctrl-C to end.",
            self.profile.tracepoints(),
            self.pattern
        )
    }

    fn start(&mut self) {
        self.profile.start();
    }

    fn event(&mut self, record: &[u8], sink: &mut Sink) -> anyhow::Result<()> {
        self.profile.event(record, sink)
    }

    fn tick(&mut self, ebpf: &mut Ebpf, sink: &mut Sink, last: bool) -> anyhow::Result<()> {
        self.profile.tick(ebpf, sink, last)
    }

    fn finish(&mut self, ebpf: &mut Ebpf, sink: &mut Sink) -> anyhow::Result<()> {
        self.profile.finish(ebpf, sink)
    }

    fn summary(&self) -> Vec<String> {
        self.profile.summary()
    }

    fn warnings(&self) -> Vec<String> {
        self.profile.warnings()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(line: &[&str]) -> anyhow::Result<Vec<String>> {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: Args,
        }
        let mut words = vec!["stackcount"];
        words.extend_from_slice(line);
        Cli::try_parse_from(words)?.args.profile_argv()
    }

    #[test]
    fn bccs_flags_become_profiles() {
        let got = argv(&["-p", "185", "-K", "-f", "-D", "5", "t:sched:sched_switch"]).unwrap();
        assert_eq!(
            got,
            [
                "profile",
                "-e",
                "sched:sched_switch",
                "-K",
                "-f",
                "-p",
                "185",
                "5"
            ]
        );
        assert!(argv(&["vfs_read"]).is_err());
        assert!(argv(&["-i", "1", "t:sched:sched_switch"]).is_err());
        // The flags it builds parse as profile's.
        let words = argv(&["-c", "0", "-U", "-d", "t:block:*"]).unwrap();
        assert!(AsProfile::try_parse_from(&words).is_ok(), "{words:?}");
    }
}

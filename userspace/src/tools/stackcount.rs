//! `rtrace stackcount`: bcc's stackcount, the stacks that lead to each
//! event of tracepoints, kernel and user functions and USDT probes, with
//! bcc's flags and patterns. It is `rtrace profile -e` under bcc's
//! spelling: its flags become profile's, and profile's object, walk,
//! store and outputs do the work.

use aya::Ebpf;

use super::profile::{self, Profile};
use crate::kernel::warning::Warning;
use crate::{
    kernel::features::Mechanism,
    output::{Schedule, Sink},
    tracer::Tool,
};

#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:
  rtrace stackcount t:sched:sched_switch -K    # kernel stacks of every context switch
  rtrace stackcount -p 185 t:syscalls:sys_enter_write   # who writes, in PID 185
  rtrace stackcount -f -D 10 't:block:block_rq_*'       # folded, for 10 seconds
  rtrace stackcount submit_bio                 # calls of a kernel function (kprobes)
  rtrace stackcount -r '^tcp_send.*'           # functions by regular expression
  rtrace stackcount -p 185 c:malloc            # calls of libc's malloc in PID 185
  rtrace stackcount -i 5 u:/usr/bin/python3:function__entry  # a USDT probe, every 5 s")]
/// Count the stacks that lead to events, as bcc's stackcount does: every
/// event of the tracepoints, functions or USDT probe a pattern names.
pub struct Args {
    /// The events, as bcc spells them: FUNCTION or p:FUNCTION (kernel),
    /// LIBRARY:FUNCTION or p:LIBRARY:FUNCTION (user; c:malloc is libc's),
    /// t:CATEGORY:EVENT (tracepoints; perf's CATEGORY:EVENT too where the
    /// category exists), u:LIBRARY:PROBE (USDT). Function names and
    /// tracepoints may be globs; with -r, function names are regular
    /// expressions.
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
    /// Print the counts every SECONDS and count again from zero.
    #[arg(short = 'i', long, value_name = "SECONDS",
          value_parser = crate::output::at_least_one::<u64>)]
    interval: Option<u64>,
    /// Function names in the pattern are regular expressions (matched
    /// anywhere in a name, as bcc's), not globs.
    #[arg(short = 'r', long)]
    regexp: bool,
    /// Show each frame's offset in its function (func+0x1a).
    #[arg(short = 's', long)]
    offset: bool,
    /// Show each frame's address before its name (bcc's -v; rtrace's own
    /// verbose output is --verbose here).
    #[arg(short = 'v', long = "addresses")]
    addresses: bool,
}

/// bcc's pattern as an event spec of `probes::event`, given which
/// tracepoint categories exist (for perf's `CATEGORY:EVENT`).
fn event_spec(pattern: &str, is_category: impl Fn(&str) -> bool) -> anyhow::Result<String> {
    let parts: Vec<&str> = pattern.split(':').collect();
    Ok(match parts.as_slice() {
        [function] => format!("p:{function}"),
        ["t", category, event] => format!("{category}:{event}"),
        // bcc's u: is USDT: any provider.
        ["u", library, probe] => format!("u:{library}::{probe}"),
        ["p", ..] => pattern.to_owned(),
        [category, _] if is_category(category) => pattern.to_owned(),
        // bcc's `c` is libc, as `uprobes::resolve` finds libraries.
        [library, function] => format!("p:{library}:{function}"),
        _ => anyhow::bail!(
            "{pattern}: not a stackcount pattern (FUNCTION, p:FUNCTION, LIBRARY:FUNCTION, \
             t:CATEGORY:EVENT or u:LIBRARY:PROBE)"
        ),
    })
}

/// profile's arguments, parsed from the command line stackcount's flags
/// make.
/// The tool: profile, at every event of the pattern's tracepoints.
pub struct Stackcount {
    profile: Profile,
    pattern: String,
}

impl Args {
    /// profile's command line for these flags, given which tracepoint
    /// categories exist.
    fn profile_argv(&self, is_category: impl Fn(&str) -> bool) -> anyhow::Result<Vec<String>> {
        let spec = event_spec(&self.pattern, is_category)?;
        let mut argv: Vec<String> = vec!["profile".into(), "-e".into(), spec];
        let mut add = |set: bool, flag: &str| {
            if set {
                argv.push(flag.to_owned());
            }
        };
        add(self.kernel_only, "-K");
        add(self.user_only, "-U");
        add(self.delimited, "-d");
        add(self.folded, "-f");
        add(self.regexp, "--regexp");
        add(self.offset, "--offsets");
        add(self.addresses, "--addresses");
        if let Some(i) = self.interval {
            argv.extend(["--interval".to_owned(), i.to_string()]);
        }
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

    profile::delegate_to_profile!();

    fn new(args: Args) -> anyhow::Result<Self> {
        let argv = args.profile_argv(|category| {
            crate::kernel::tracefs::root()
                .is_ok_and(|root| root.join("events").join(category).is_dir())
        })?;
        let parsed = profile::parse_args(&argv)
            .map_err(|e| anyhow::anyhow!("{}", e.render().to_string().trim()))?;
        Ok(Self {
            profile: Profile::new(parsed)?,
            pattern: args.pattern,
        })
    }

    fn duration(&self) -> Option<u64> {
        self.profile.duration()
    }

    fn interval(&self) -> Schedule {
        self.profile.interval()
    }

    fn banner(&self) -> String {
        // bcc's own line, so that scripts waiting for it find it.
        format!(
            "Tracing {} functions for \"{}\"... Hit Ctrl-C to end.",
            self.profile.sites(),
            self.pattern
        )
    }

    fn start(&mut self) {
        self.profile.start();
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

    fn warnings(&self) -> Vec<Warning> {
        self.profile.warnings()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser as _;

    fn argv(line: &[&str]) -> anyhow::Result<Vec<String>> {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: Args,
        }
        let mut words = vec!["stackcount"];
        words.extend_from_slice(line);
        Cli::try_parse_from(words)?
            .args
            .profile_argv(|c| ["sched", "block"].contains(&c))
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
        let spec = |line: &[&str]| argv(line).unwrap()[2].clone();
        assert_eq!(spec(&["vfs_read"]), "p:vfs_read");
        assert_eq!(spec(&["c:malloc"]), "p:c:malloc");
        assert_eq!(spec(&["sched:sched_switch"]), "sched:sched_switch");
        assert_eq!(
            spec(&["u:pthread:pthread_create"]),
            "u:pthread::pthread_create"
        );
        assert_eq!(spec(&["p::vfs_read"]), "p::vfs_read");
        assert!(argv(&["a:b:c:d"]).is_err());
        let words = argv(&["-i", "2", "-r", "-s", "-v", "^vfs_.*"]).unwrap();
        assert_eq!(
            words[3..],
            ["--regexp", "--offsets", "--addresses", "--interval", "2"]
        );
        // The flags it builds parse as profile's.
        for line in [
            &["-c", "0", "-U", "-d", "t:block:*"][..],
            &["-i", "2", "-r", "-s", "-v", "^vfs_.*"],
            &["u:pthread:pthread_create"],
        ] {
            let words = argv(line).unwrap();
            assert!(profile::parse_args(&words).is_ok(), "{words:?}");
        }
    }
}

//! `rtrace stackcount`: bcc's stackcount, the stacks that lead to each
//! event of tracepoints, kernel and user functions and USDT probes, with
//! bcc's flags and patterns. It is the engine's sampling at events
//! (`rtrace profile -e`) under bcc's spelling: its flags become a
//! [`Sampling`], and the sampler's object, walk, store and outputs do the
//! work.

use crate::tracer::Spec;
use aya::Ebpf;

use crate::{
    engine::{
        sampling::{self, Sampler, Sampling},
        stacktool::StackArgs,
    },
    output::{Sink, stacks::TextOptions},
    tracer::{Scope, Tool},
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
    /// --firefox and --samples: each event on its own.
    #[command(flatten)]
    each: crate::output::files::PerSampleOutputs,
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

/// The tool: the engine's sampler, at every event of the pattern's
/// tracepoints, functions or probes.
pub struct Stackcount {
    sampler: Sampler,
    scope: Scope,
    pattern: String,
}

impl Args {
    /// The engine's sampling for these flags, given which tracepoint
    /// categories exist.
    fn sampling(&self, is_category: impl Fn(&str) -> bool) -> anyhow::Result<Sampling> {
        let spec = event_spec(&self.pattern, is_category)?;
        let event = sampling::parse_event(&spec).map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok(Sampling {
            event,
            duration: self.duration,
            interval: self.interval,
            regexp: self.regexp,
            cpus: self.cpu.into_iter().collect(),
            user_only: self.user_only,
            kernel_only: self.kernel_only,
            text: TextOptions {
                delimiter: self.delimited,
                annotate: false,
            },
            folded: self.folded,
            stacks: StackArgs {
                offsets: self.offset,
                addresses: self.addresses,
                ..StackArgs::default()
            },
            outputs: crate::output::files::StackOutputs {
                each: self.each.clone(),
                ..Default::default()
            },
            ..Sampling::default()
        })
    }

    /// What is traced: `-p`'s process, `-c`'s CPU.
    fn scope(&self) -> Scope {
        Scope {
            pids: self.pid.into_iter().collect(),
            cpus: self.cpu.into_iter().collect(),
            ..Scope::default()
        }
    }
}

impl Tool for Stackcount {
    type Args = Args;

    const SPEC: Spec = Spec::new("stackcount", &[], sampling::ERRORS)
        .object(sampling::OBJECT)
        .expected(sampling::EXPECTED);

    super::sampling_tool!(report);

    fn new(args: Args) -> anyhow::Result<Self> {
        let cfg = args.sampling(|category| {
            crate::kernel::tracefs::root()
                .is_ok_and(|root| root.join("events").join(category).is_dir())
        })?;
        Ok(Self {
            sampler: Sampler::new(cfg)?,
            scope: args.scope(),
            pattern: args.pattern,
        })
    }

    fn banner(&self) -> String {
        // bcc's own line, so that scripts waiting for it find it.
        format!(
            "Tracing {} functions for \"{}\"... Hit Ctrl-C to end.",
            self.sampler.sites(),
            self.pattern
        )
    }

    fn start(&mut self) {
        self.sampler.start();
    }

    fn tick(&mut self, ebpf: &mut Ebpf, sink: &mut Sink, last: bool) -> anyhow::Result<()> {
        self.sampler.tick(ebpf, sink, last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser as _;

    fn args(line: &[&str]) -> Args {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: Args,
        }
        let mut words = vec!["stackcount"];
        words.extend_from_slice(line);
        Cli::try_parse_from(words).unwrap().args
    }

    fn sampling(line: &[&str]) -> anyhow::Result<Sampling> {
        args(line).sampling(|c| ["sched", "block"].contains(&c))
    }

    #[test]
    fn bccs_flags_become_the_engines_sampling() {
        let line = ["-p", "185", "-K", "-f", "-D", "5", "t:sched:sched_switch"];
        let got = sampling(&line).unwrap();
        assert_eq!(got.event.name(), "sched:sched_switch");
        assert!(got.event.at_events());
        assert!(got.kernel_only && !got.user_only && got.folded);
        assert_eq!(got.duration, Some(5));
        assert_eq!(args(&line).scope().pids, [185]);
        let spec = |p: &str| event_spec(p, |c| ["sched", "block"].contains(&c)).unwrap();
        assert_eq!(spec("vfs_read"), "p:vfs_read");
        assert_eq!(spec("c:malloc"), "p:c:malloc");
        assert_eq!(spec("sched:sched_switch"), "sched:sched_switch");
        assert_eq!(
            spec("u:pthread:pthread_create"),
            "u:pthread::pthread_create"
        );
        assert_eq!(spec("p::vfs_read"), "p::vfs_read");
        assert!(sampling(&["a:b:c:d"]).is_err());
        let got = sampling(&["-i", "2", "-r", "-s", "-v", "^vfs_.*"]).unwrap();
        assert!(got.regexp && got.stacks.offsets && got.stacks.addresses);
        assert_eq!(got.interval, Some(2));
        let got = sampling(&["-c", "0", "-U", "-d", "t:block:*"]).unwrap();
        assert_eq!(got.cpus, [0]);
        assert!(got.user_only && got.text.delimiter);
        // Every pattern bcc takes is an event the engine samples at.
        for line in [
            &["u:pthread:pthread_create"][..],
            &["c:malloc"],
            &["vfs_read"],
        ] {
            assert!(sampling(line).unwrap().event.at_events(), "{line:?}");
        }
    }
}

//! What a tool declares and its part of the lifecycle: the [`Tool`]
//! trait with its [`Spec`], [`Plan`] and [`Outcome`], and [`Collect`],
//! what a tool adds to be a collector of the exporter.

use aya::Ebpf;

use crate::{
    kernel::{
        features::Mechanism,
        load::{Kernel, Load},
        scope::Scope,
        transport::{BufferArgs, DEFAULT_BUFFER},
        warning::Warning,
    },
    output::{Schedule, Sink, metrics::Exposition},
};

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

/// What a tool is, fixed when it is compiled: its name, its object, the
/// mechanisms it attaches with and what its loss counters count.
#[derive(Debug, Clone, Copy)]
pub struct Spec {
    /// The subcommand, and the name of the tool's eBPF object
    /// (`ebpf-programs/src/bin/<NAME>.rs`).
    pub name: &'static str,
    /// The eBPF object the tool loads (with its variant's suffix): its
    /// name, unless it shares another tool's programs.
    pub object: &'static str,
    /// The mechanisms the tool can attach with, best first; `--attach`
    /// offers these. Empty for tools that choose per probe.
    pub chain: &'static [Mechanism],
    /// What each slot of the object's `ERRORS` counters counts, for the
    /// report at exit. An event tool's first slot is events lost to a
    /// full buffer (`rtrace_common::events::LOST_EVENT`).
    pub errors: &'static [&'static str],
    /// The `ERRORS` slots that count expected, harmless fallbacks rather
    /// than missing or wrong output (a new process's first stacks walked
    /// before its tables, frame-pointer steps through JIT code): `-v`
    /// reports them with the summary; they are no warning.
    pub expected: &'static [u32],
    /// The event buffer's size without `--buffer-size`, in bytes.
    pub event_buffer: u32,
}

impl Spec {
    /// The tool `name`, with its own object, attaching by `chain`, its
    /// counters named by `errors`.
    pub const fn new(
        name: &'static str,
        chain: &'static [Mechanism],
        errors: &'static [&'static str],
    ) -> Self {
        Self {
            name,
            object: name,
            chain,
            errors,
            expected: &[],
            event_buffer: DEFAULT_BUFFER,
        }
    }

    /// The same, loading another tool's object.
    pub const fn object(self, object: &'static str) -> Self {
        Self { object, ..self }
    }

    /// The same, with these slots of `ERRORS` expected.
    pub const fn expected(self, expected: &'static [u32]) -> Self {
        Self { expected, ..self }
    }

    /// The same, with this default event buffer.
    pub const fn event_buffer(self, event_buffer: u32) -> Self {
        Self {
            event_buffer,
            ..self
        }
    }
}

/// How a tool wants its run made, read once after the arguments are
/// checked.
#[derive(Debug, Default)]
pub struct Plan {
    /// What the tool traces: its [`ScopeArgs`](super::ScopeArgs), and
    /// what the tool adds.
    pub scope: Scope,
    /// The mechanism `--attach` forces, if any.
    pub forced: Option<Mechanism>,
    /// The transport flags of a tool that streams events; `None` for
    /// tools that read maps only.
    pub events: Option<BufferArgs>,
    /// When the tool prints ([`Schedule`]).
    pub interval: Schedule,
    /// Seconds after which the run ends as if interrupted (`-d`).
    pub duration: Option<u64>,
    /// Whether the tool's own flag asks for JSON (bcc's `-j`), beside the
    /// global `--json`.
    pub json: bool,
    /// How many times the whole run is made (perf stat's `-r`; 0 and 1
    /// are once): the command runs again each time, and the tool is
    /// opened, attached and finished again with it.
    pub repeats: u32,
    /// The column header printed once on stdout in text mode.
    pub header: Option<String>,
}

/// What a run leaves to say at exit.
#[derive(Debug, Default)]
pub struct Outcome {
    /// `-v` lines about the run, printed after [`Tool::finish`].
    pub summary: Vec<String>,
    /// What the run could not do as asked, said with or without `-v`,
    /// beside the counted losses.
    pub warnings: Vec<Warning>,
}

/// A tool: its declarations and its part of the lifecycle, called in
/// this order by [`run`](super::run): `new`, `plan`, `scoped`, then for
/// each attach candidate `variants`, `configure` and `attach`, then
/// `describe` (with `-v`), `banner`, `start`, the loop's `event`,
/// `after_events`, `tick` and `done`, and at the end `finish` and `outcome` (`finish_rounds`
/// after the last of several rounds).
///
/// Dispatch is static (the registry in `tools/mod.rs` names each tool's
/// type), so the trait needs no object safety.
pub trait Tool: Sized {
    /// The tool's command-line arguments.
    type Args: clap::Args + std::fmt::Debug;

    /// What the tool is.
    const SPEC: Spec;

    /// Checks the arguments, before any privilege is needed.
    fn new(args: Self::Args) -> anyhow::Result<Self>;

    /// How the run is made: scope, transport, schedule, duration.
    fn plan(&self) -> Plan {
        Plan::default()
    }

    /// The scope as the run settled it, before the tool is configured:
    /// in command mode, `cgroup` is the command's own. For what the
    /// kernel-side filter cannot do, such as opening perf counters on it.
    fn scoped(&mut self, _scope: &Scope) {}

    /// Object variants to try for mechanism `m`, best first: a feature the
    /// object is also built with (`"task_storage"`), or `""` for the plain
    /// object. A variant that fails to load or attach is noted under `-v`
    /// and the next is tried.
    fn variants(&self, _m: Option<Mechanism>, _kernel: &mut Kernel) -> Vec<&'static str> {
        vec![""]
    }

    /// Sets the object's configuration and map sizes for mechanism `m`
    /// (`None` for a tool with an empty chain) and `load.variant()`.
    fn configure(
        &mut self,
        m: Option<Mechanism>,
        kernel: &mut Kernel,
        load: &mut Load,
    ) -> anyhow::Result<()>;

    /// Attaches the loaded object's programs.
    fn attach(
        &mut self,
        m: Option<Mechanism>,
        kernel: &mut Kernel,
        ebpf: &mut Ebpf,
    ) -> anyhow::Result<()>;

    /// For `-v`: what was attached to ("attached with tp_btf (...)"),
    /// then notes, such as functions the tool skipped.
    fn describe(&self) -> Vec<String>;

    /// The line on stderr that says what is being traced.
    fn banner(&self) -> String;

    /// Runs as tracing starts, after the banner.
    fn start(&mut self) {}

    /// Handles one event record.
    fn event(&mut self, _record: &[u8], _sink: &mut Sink) -> anyhow::Result<()> {
        Ok(())
    }

    /// Runs after each batch of events, with the programs at hand: for
    /// what the events asked of them (a walk loaded for a runtime that
    /// came into scope).
    fn after_events(&mut self, _ebpf: &mut Ebpf) -> anyhow::Result<()> {
        Ok(())
    }

    /// Whether the tool has printed all it was asked for (bcc's `-M`):
    /// the run then ends as if interrupted.
    fn done(&self) -> bool {
        false
    }

    /// Prints one interval; `last` is the final one.
    fn tick(&mut self, _ebpf: &mut Ebpf, _sink: &mut Sink, _last: bool) -> anyhow::Result<()> {
        Ok(())
    }

    /// Runs once after the loop, before losses are reported.
    fn finish(&mut self, _ebpf: &mut Ebpf, _sink: &mut Sink) -> anyhow::Result<()> {
        Ok(())
    }

    /// Runs once after every repetition's [`finish`](Self::finish), when
    /// [`Plan::repeats`] asked for more than one.
    fn finish_rounds(&mut self, _sink: &mut Sink) -> anyhow::Result<()> {
        Ok(())
    }

    /// What is left to say at exit.
    fn outcome(&self) -> Outcome {
        Outcome::default()
    }
}

/// What the lifecycle asks of a tool once it is made, as a trait
/// object: the attach chain and the run's loop are one function each for
/// every tool, where, generic over [`Tool`] (which no trait object can
/// be: its `Args`, `SPEC` and `new`), each was a copy per tool (the run's
/// async state machine 14 copies of 26 kB). A call through a pointer per
/// event costs nothing beside the event. Each method is the [`Tool`]
/// method of its name.
pub(super) trait DynTool {
    /// [`Tool::SPEC`].
    fn spec(&self) -> Spec;
    fn variants(&self, m: Option<Mechanism>, kernel: &mut Kernel) -> Vec<&'static str>;
    fn configure(
        &mut self,
        m: Option<Mechanism>,
        kernel: &mut Kernel,
        load: &mut Load,
    ) -> anyhow::Result<()>;
    fn attach(
        &mut self,
        m: Option<Mechanism>,
        kernel: &mut Kernel,
        ebpf: &mut Ebpf,
    ) -> anyhow::Result<()>;
    fn banner(&self) -> String;
    fn start(&mut self);
    fn done(&self) -> bool;
    fn event(&mut self, record: &[u8], sink: &mut Sink) -> anyhow::Result<()>;
    fn after_events(&mut self, ebpf: &mut Ebpf) -> anyhow::Result<()>;
    fn tick(&mut self, ebpf: &mut Ebpf, sink: &mut Sink, last: bool) -> anyhow::Result<()>;
    fn finish(&mut self, ebpf: &mut Ebpf, sink: &mut Sink) -> anyhow::Result<()>;
    fn outcome(&self) -> Outcome;
}

impl<T: Tool> DynTool for T {
    fn spec(&self) -> Spec {
        T::SPEC
    }
    fn variants(&self, m: Option<Mechanism>, kernel: &mut Kernel) -> Vec<&'static str> {
        Tool::variants(self, m, kernel)
    }
    fn configure(
        &mut self,
        m: Option<Mechanism>,
        kernel: &mut Kernel,
        load: &mut Load,
    ) -> anyhow::Result<()> {
        Tool::configure(self, m, kernel, load)
    }
    fn attach(
        &mut self,
        m: Option<Mechanism>,
        kernel: &mut Kernel,
        ebpf: &mut Ebpf,
    ) -> anyhow::Result<()> {
        Tool::attach(self, m, kernel, ebpf)
    }
    fn banner(&self) -> String {
        Tool::banner(self)
    }
    fn start(&mut self) {
        Tool::start(self);
    }
    fn done(&self) -> bool {
        Tool::done(self)
    }
    fn event(&mut self, record: &[u8], sink: &mut Sink) -> anyhow::Result<()> {
        Tool::event(self, record, sink)
    }
    fn after_events(&mut self, ebpf: &mut Ebpf) -> anyhow::Result<()> {
        Tool::after_events(self, ebpf)
    }
    fn tick(&mut self, ebpf: &mut Ebpf, sink: &mut Sink, last: bool) -> anyhow::Result<()> {
        Tool::tick(self, ebpf, sink, last)
    }
    fn finish(&mut self, ebpf: &mut Ebpf, sink: &mut Sink) -> anyhow::Result<()> {
        Tool::finish(self, ebpf, sink)
    }
    fn outcome(&self) -> Outcome {
        Tool::outcome(self)
    }
}

/// A tool that can run as a collector of `rtrace exporter`.
pub trait Collect: Tool {
    /// How the exporter runs it.
    const COLLECTOR: Collector;

    /// The tool in collector mode (nanosecond histograms, say), its
    /// arguments built as such, counting tasks in `cgroup` only where
    /// [`Collector::scoped`] says it can.
    fn collector(cgroup: Option<&std::path::Path>) -> anyhow::Result<Self>;

    /// Reads the maps into running totals: at every scrape, and every few
    /// seconds between them so that no 32-bit kernel counter wraps unseen.
    fn refresh(&mut self, ebpf: &Ebpf) -> anyhow::Result<()>;

    /// Writes the collector's metrics from its running totals.
    fn metrics(&self, out: &mut Exposition);
}

/// A tool as a collector of the exporter ([`Collect`]).
#[derive(Debug, Clone, Copy)]
pub struct Collector {
    /// Whether the exporter runs it when no `--collectors` are named.
    pub default: bool,
    /// Whether it takes the exporter's `-c CGROUP`.
    pub scoped: bool,
    /// `TALLIES` slots an event tool counts into instead of sending
    /// events (`rtrace_common::events::TALLY_ONLY`); 0 for tools that read
    /// maps only.
    pub tallies: u32,
}

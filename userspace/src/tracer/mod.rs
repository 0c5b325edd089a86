//! The one lifecycle every tool runs through.
//!
//! A tool ([`Tool`]) declares what it needs: its object (named like the
//! tool), the attach mechanisms it accepts best first, the loss counters its
//! programs keep, what it traces ([`Scope`]), its configuration and map
//! sizes ([`Load`]), how to attach, and what to print. [`run`] owns the
//! order, the same for every tool:
//!
//! 1. arguments and targets checked, then privileges;
//! 2. kernel features, probed once and only for the mechanisms tried;
//! 3. the event transport, then the attach chain (loading the object for
//!    each mechanism, and each variant a tool asks for, until one attaches);
//! 4. the `-v` report: what was skipped and why, what was used;
//! 5. signals and the deadline;
//! 6. the banner on stderr, the header on stdout (text only);
//! 7. the loop: events as they come, intervals as they fall due, until a
//!    signal, the deadline or the last interval; every record goes through
//!    one [`Sink`], text or JSON;
//! 8. the report of lost work at exit.
//!
//! With `-- CMD` ([`command`]), the command is started held at a cork
//! before step 3, in a cgroup of its own that the scope then names, let go
//! after step 6, and its exit ends the loop as a signal would; rtrace exits
//! with its status.

pub mod command;
pub mod scope;
mod session;
pub mod signals;
mod targets;
pub mod tool;

pub use crate::kernel::scope::Scope;
pub use scope::{PinnedSets, ScopeArgs, own};
pub use session::Session;
pub use signals::Signals;
pub use targets::check_task;
use tool::DynTool;
pub(crate) use tool::WithGlobal;
pub use tool::{Collect, Collector, GlobalArgs, Outcome, Plan, Spec, Tool};

use std::{
    fs::File,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use aya::Ebpf;
use rtrace_common::events::LOST_EVENT;

use crate::kernel::warning::Warning;
use crate::{
    kernel::{load::read_errors, transport::Transport},
    output::{Destination, Schedule, Sink, events::EventStream},
    tracer::command::{CommandLine, Corked},
};

/// Checks a scope with a command, starts the command held at its cork,
/// and points the scope at the command's cgroup where it traces the
/// command itself.
fn start_command(
    scope: &mut Scope,
    duration: Option<u64>,
    interval: Schedule,
) -> anyhow::Result<Option<Corked>> {
    if scope.command.is_empty() {
        return Ok(None);
    }
    if duration.is_some() {
        anyhow::bail!("a duration and -- CMD both say when to stop: give one of them");
    }
    if let Schedule::Every { count: Some(_), .. } = interval {
        anyhow::bail!("a count of intervals and -- CMD both say when to stop: give one of them");
    }
    let line = CommandLine {
        argv: scope.command.clone(),
        user: scope.user.clone(),
        own_cgroup: scope.command_cgroup(),
    };
    let corked = Corked::start(&line)?;
    if let Some(cg) = corked.cgroup() {
        scope.cgroup = Some(cg.to_owned());
        scope.own_cgroup = true;
    }
    scope.command_pid = Some(corked.pid());
    Ok(Some(corked))
}

/// Where the output goes, as the scope says: `-o FILE`, else stderr in
/// command mode (the command's stdout is its own), else stdout.
fn destination(scope: &Scope) -> anyhow::Result<Destination> {
    Ok(match &scope.output {
        Some(path) => {
            let file =
                File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
            Destination::File(std::io::LineWriter::new(file))
        }
        None if !scope.command.is_empty() => Destination::Stderr,
        None => Destination::Stdout,
    })
}

/// Runs tool `T` from its arguments to the report at exit; the exit
/// status is the command's in command mode, else 0. With
/// [`Tool::repeats`], the whole run is made that many times (until a
/// signal), and the status is the last run's.
pub async fn run<T: Tool>(args: T::Args, global: &GlobalArgs) -> anyhow::Result<u8> {
    let mut tool = T::new(args)?;
    for c in command::sweep_stale_cgroups() {
        if global.verbose && c.removed {
            eprintln!(
                "rtrace: removed {}, the command cgroup of rtrace {}, which died before it \
                 could",
                c.path.display(),
                c.owner
            );
        } else if global.verbose {
            eprintln!(
                "rtrace: {} of rtrace {}, which died, still holds {} processes: it is \
                 removed once they have exited (rtrace doctor lists it)",
                c.path.display(),
                c.owner,
                c.procs.len()
            );
        }
    }
    let repeats = tool.plan().repeats.max(1);
    let mut signals = Signals::new()?;
    let mut sink = None;
    let mut status = 0;
    for round in 0..repeats {
        let (back, round_status, stopped_by) =
            run_once(tool, global, &mut signals, &mut sink, round).await?;
        tool = back;
        status = round_status;
        if stopped_by > 0 {
            break;
        }
    }
    if repeats > 1
        && let Some(sink) = &mut sink
    {
        tool.finish_rounds(sink)?;
        sink.flush()?;
    }
    Ok(status)
}

/// Runs a tool already made beside other work on this thread (the
/// exporter's profiler beside its serving): attached, traced until
/// SIGINT, SIGTERM or SIGHUP as any run, finished; the tool is given
/// back. Its sink is stdout, where a tool run so writes nothing.
pub async fn run_beside<T: Tool>(tool: T, global: &GlobalArgs) -> anyhow::Result<T> {
    let mut signals = Signals::new()?;
    let mut sink = None;
    let (tool, _, _) = run_once(tool, global, &mut signals, &mut sink, 0).await?;
    Ok(tool)
}

/// One run of the tool: opened, attached, traced until the end, finished;
/// returns the tool, the exit status and the signal that stopped it (0
/// for none). The sink is made on the first run.
async fn run_once<T: Tool>(
    mut tool: T,
    global: &GlobalArgs,
    signals: &mut Signals,
    sink_slot: &mut Option<Sink>,
    round: u32,
) -> anyhow::Result<(T, u8, i32)> {
    let plan = tool.plan();
    let (interval, duration, json) = (plan.interval, plan.duration, plan.json);
    let header = plan.header.clone();
    let mut scope = plan.scope.clone();
    let command = start_command(&mut scope, duration, interval)?;
    tool.scoped(&scope);
    // Made (a file created) on the first round only; the sink keeps it.
    let destination = if sink_slot.is_none() {
        Some(destination(&scope)?)
    } else {
        None
    };
    let session = Session::open(tool, plan, &scope, global, None)?;
    if global.verbose {
        session.report();
    }
    let Session {
        mut tool,
        ebpf,
        transport,
        events,
        ..
    } = session;
    let run = Drive {
        spec: &T::SPEC,
        ebpf,
        stream: transport
            .zip(events)
            .map(|((t, _), args)| (t, args.bytes(T::SPEC.event_buffer))),
        interval,
        duration,
        json,
        header,
        command,
        destination,
        round,
    };
    let (status, stopped_by) = run.drive(&mut tool, global, signals, sink_slot).await?;
    Ok((tool, status, stopped_by))
}

/// What a run needs once its tool is attached: [`Drive::drive`] runs it
/// to the end for every tool alike, one function where, generic, it was
/// a copy of 26 kB for each tool.
struct Drive<'a> {
    spec: &'a Spec,
    ebpf: Ebpf,
    /// The event transport and its buffers' bytes (per CPU or shared),
    /// where the tool streams events.
    stream: Option<(Transport, u32)>,
    interval: Schedule,
    duration: Option<u64>,
    json: bool,
    header: Option<String>,
    command: Option<Corked>,
    /// Where the output goes, on the first round.
    destination: Option<Destination>,
    round: u32,
}

impl Drive<'_> {
    /// The banner, the loop, the tool's finish and the report of what
    /// was lost; returns the exit status and the signal that stopped the
    /// run (0 for none).
    async fn drive(
        self,
        tool: &mut dyn DynTool,
        global: &GlobalArgs,
        signals: &mut Signals,
        sink_slot: &mut Option<Sink>,
    ) -> anyhow::Result<(u8, i32)> {
        let Drive {
            spec,
            mut ebpf,
            stream: events,
            interval,
            duration,
            json,
            header,
            mut command,
            destination,
            round,
        } = self;
        signals.stop_after(duration);
        let open_stream = |ebpf: &mut Ebpf| match events {
            Some((t, bytes)) => EventStream::new(ebpf, t, bytes).map(Some),
            None => Ok(None),
        };
        // Perf buffers must be open before anything is traced, or the
        // events find no buffer; a ring buffer keeps them from the moment
        // it exists, so mapping it (hundreds of pages, thousands with
        // --buffer-size) need not delay saying that tracing has started.
        let ring = matches!(events, Some((Transport::Ring, _)));
        let mut stream = if ring { None } else { open_stream(&mut ebpf)? };
        let mut banner = tool.banner();
        if command.is_some() {
            // bcc's banners end in how to stop; in command mode the
            // command's exit does.
            banner = banner.replace("Hit Ctrl-C to end.", "Ends when the command exits.");
        }
        if round == 0 {
            eprintln!("{banner}");
        }
        if ring {
            stream = open_stream(&mut ebpf)?;
        }
        if sink_slot.is_none() {
            let mut sink = Sink::new(spec.name, global.json || json)
                .to(destination.unwrap_or(Destination::Stdout));
            if let Some(header) = header {
                sink.header(&header)?;
            }
            *sink_slot = Some(sink);
        }
        let sink = sink_slot.as_mut().context("no output")?;
        tool.start();
        if let Some(c) = &mut command {
            c.release()?;
        }

        let stopped_by = run_loop(
            tool,
            interval,
            &mut ebpf,
            stream.as_mut(),
            signals,
            sink,
            command.as_mut(),
        )
        .await?;
        tool.finish(&mut ebpf, sink)?;
        sink.flush()?;
        let outcome = tool.outcome();
        if global.verbose {
            for line in outcome.summary {
                eprintln!("rtrace: {}: {line}", spec.name);
            }
        }
        for warning in outcome.warnings {
            warning.print();
        }
        report_errors(
            spec,
            &ebpf,
            stream.as_ref().map_or(0, EventStream::perf_lost),
            global.verbose,
        )?;
        let status = match command.as_ref().and_then(Corked::status) {
            Some(status) => status,
            // Stopped by a second signal while the command still ran.
            None if command.is_some() && stopped_by > 0 => 128u8.wrapping_add(stopped_by as u8),
            None => 0,
        };
        Ok((status, stopped_by))
    }
}

/// Whether a SIGINT came from the terminal, which sent it to the command
/// too: rtrace and the command share the foreground process group.
fn from_terminal(sig: i32) -> bool {
    // SAFETY: no preconditions.
    sig == libc::SIGINT && unsafe { libc::tcgetpgrp(0) == libc::getpgrp() }
}

/// What woke the loop.
enum Wake {
    Events,
    Interval,
    /// A signal (its number) or the deadline (0).
    Stop(i32),
    /// The command exited.
    Exited,
}

/// The loop, until a signal, the deadline, the last interval or the
/// command's exit; returns the signal that ended it, if one did. In
/// command mode a first signal is passed on to the command (unless the
/// terminal sent it to both), whose exit then ends the loop; a second ends
/// it at once.
async fn run_loop(
    tool: &mut dyn DynTool,
    interval: Schedule,
    ebpf: &mut Ebpf,
    mut stream: Option<&mut EventStream>,
    signals: &mut Signals,
    sink: &mut Sink,
    mut command: Option<&mut Corked>,
) -> anyhow::Result<i32> {
    let mut signalled = false;
    let mut first_signal = 0;
    let mut next = match interval {
        Schedule::Every { period, .. } => Some(Instant::now() + period),
        _ => None,
    };
    let mut done = 0u64;
    // A ring buffer's programs wake this loop only while it sleeps: once
    // records come, it reads the ring every few milliseconds instead (an
    // empty ring is two loads from its mapped pages), and sleeps again
    // when a read finds none. A record committed as it goes to sleep wakes
    // it too (see `EventStream::sleep`); the look every 100 ms while it
    // sleeps only bounds the harm of a wakeup lost all the same: a short
    // process's first stacks must reach user space while it lives.
    let polled_stream = stream.as_deref().is_some_and(EventStream::polled);
    let mut reading = false;
    loop {
        // A tool that has shown all it was asked for ends the run as the
        // deadline does.
        let wake = if tool.done() {
            Wake::Stop(0)
        } else {
            let polled = async {
                if !polled_stream {
                    return std::future::pending().await;
                }
                let wait = if reading {
                    Duration::from_millis(rtrace_common::events::READ_EVERY_MS)
                } else {
                    Duration::from_millis(100)
                };
                tokio::time::sleep(wait).await;
            };
            let due = async {
                match next {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            };
            let ready = async {
                match stream.as_deref_mut() {
                    Some(s) => s.ready().await,
                    None => std::future::pending().await,
                }
            };
            let exited = async {
                match command.as_deref_mut() {
                    Some(c) => c.exited().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                r = ready => { r?; Wake::Events }
                () = polled => Wake::Events,
                () = due => Wake::Interval,
                sig = signals.recv() => Wake::Stop(sig),
                () = exited => Wake::Exited,
            }
        };
        let wake = match (wake, command.as_deref()) {
            (Wake::Stop(sig), Some(c)) if !signalled && sig != 0 => {
                signalled = true;
                first_signal = sig;
                if !from_terminal(sig) {
                    c.signal(sig);
                }
                continue;
            }
            (Wake::Stop(sig), Some(c)) if sig != 0 => {
                c.signal(libc::SIGTERM);
                Wake::Stop(sig)
            }
            (w, _) => w,
        };
        match wake {
            Wake::Events => {
                if let Some(s) = stream.as_deref_mut() {
                    let mut seen = 0u64;
                    s.drain(|record| {
                        seen += 1;
                        tool.event(record, sink)
                    })?;
                    if polled_stream && (seen > 0) != reading {
                        reading = seen > 0;
                        s.sleep(!reading)?;
                        if !reading {
                            // What came between the read and the flag.
                            s.drain(|record| tool.event(record, sink))?;
                        }
                    }
                    tool.after_events(ebpf)?;
                }
                sink.flush()?;
            }
            Wake::Interval => {
                // Events waiting are handled first: a tick may take long
                // (profile symbolizes there), and what they ask for (a new
                // process's unwind tables) should not wait for it.
                if let Some(s) = stream.as_deref_mut() {
                    s.drain(|record| tool.event(record, sink))?;
                    tool.after_events(ebpf)?;
                }
                done += 1;
                let last = matches!(interval, Schedule::Every { count: Some(c), .. } if done >= c);
                tool.tick(ebpf, sink, last)?;
                sink.flush()?;
                if last {
                    return Ok(0);
                }
                if let (Schedule::Every { period, .. }, Some(at)) = (interval, next.as_mut()) {
                    *at += period;
                }
            }
            Wake::Stop(_) | Wake::Exited => {
                // Events already in the buffers are handled first.
                if let Some(s) = stream.as_deref_mut() {
                    s.drain_all(|record| tool.event(record, sink))?;
                }
                if interval != Schedule::Never {
                    tool.tick(ebpf, sink, true)?;
                }
                sink.flush()?;
                return Ok(match wake {
                    Wake::Stop(sig) => sig,
                    // The command ended by the signal passed on to it.
                    _ => first_signal,
                });
            }
        }
    }
}

/// Reports the object's `ERRORS` counters on stderr, each only when
/// nonzero. A perf buffer's own loss records count towards the first slot
/// of an event tool: a full perf buffer fails the helper, which the
/// programs count, and the kernel reports the same drops again, so the
/// larger of the two is taken rather than the sum. The tool's
/// [`Tool::EXPECTED`] slots are no warning: `-v` shows them. Events the
/// kernel kept from a program that was already running are reported
/// too.
fn report_errors(spec: &Spec, ebpf: &Ebpf, perf_lost: u64, verbose: bool) -> anyhow::Result<()> {
    let counts = read_errors(ebpf, spec.errors.len())?;
    for (i, (name, mut n)) in spec.errors.iter().zip(counts).enumerate() {
        if i == LOST_EVENT as usize {
            n = n.max(perf_lost);
        }
        if n == 0 {
            continue;
        }
        if !spec.expected.contains(&(i as u32)) {
            Warning::lost(format!("{n} {name}")).print();
        } else if verbose {
            eprintln!("rtrace: {}: {n} {name}", spec.name);
        }
    }
    for (program, n) in crate::kernel::load::skipped_runs(ebpf) {
        Warning::lost(format!(
            "{n} events not counted: program {program} was skipped, as their CPU \
             was already in BPF (a program, or a map update from user space), and the \
             kernel does not nest them"
        ))
        .print();
    }
    Ok(())
}

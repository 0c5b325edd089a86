//! The C build of `cargo xtask bench profile`: a generated project of
//! [`FILES`] small C files built with `make -j2`, bare, under
//! `rtrace profile -U -f` and under `perf record --call-graph dwarf`, both
//! sampling the whole machine, interleaved.
//!
//! A build is the case CPU-bound loops are not: hundreds of processes
//! (make, sh, the gcc driver, cc1, as, collect2, ld), most of them alive for
//! tens of milliseconds, none with frame pointers and most stripped. What it
//! measures: the time each profiler adds to the build, the time from Ctrl-C
//! to a finished profile, and per command the share of user stacks that
//! reach their root and the share with every frame named.
//!
//! `RTRACE_BENCH_TRIALS=N` sets the number of trials (default
//! [`super::TRIALS`]): each is three builds and a `perf script`.

use std::{
    collections::BTreeMap,
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{Context as _, bail};

use super::{
    Outcome, Ready, Row, Setup, Stopped, bpf_run_ns,
    c_project::{FILES, JOBS, generate, make},
    cpu_ns,
    helpers::{perf_dwarf, perf_lost, rtrace_lost, seconds},
    median, print_costs, spread,
};

/// Both profilers' rate on each CPU.
const HZ: &str = "199";
/// A command gets a row once either profiler has this many of its user
/// stacks: below that a share is a handful of samples.
const MIN_SAMPLES: u64 = 20;
/// The unit of a build's cost in the tables.
const UNIT: &str = "ms/build";
/// Setups' places, in the order [`print_costs`] expects: bare, peer, rtrace.
const PERF: usize = 1;
const RTRACE: usize = 2;

/// One build from clean; returns its wall time in milliseconds.
fn build(dir: &Path) -> anyhow::Result<f64> {
    Ok(seconds(|| make(dir, &[JOBS]))? * 1e3)
}

/// One command's user stacks: how many, how many reach their root, how
/// many have every frame named.
#[derive(Default, Clone, Copy)]
struct Counts {
    samples: u64,
    rooted: u64,
    named: u64,
}

/// [`Counts`] by command.
type ByComm = BTreeMap<String, Counts>;

/// The names `__libc_start_main` goes by: its exported name, the
/// function behind it, and the static one it calls `main` from.
fn start_main(frame: &str) -> bool {
    matches!(
        frame,
        "__libc_start_main" | "__libc_start_main_impl" | "__libc_start_call_main"
    )
}

/// A frame neither profiler could name, or rtrace's mark of a user stack
/// it did not get.
fn unnamed(frame: &str) -> bool {
    frame.contains("[unknown]") || frame.starts_with("[Missed")
}

/// Whether a user stack, root first, reaches its root: its outermost frame
/// is where a process or a thread begins (`_start`, `__libc_start_main`,
/// `start_thread`, glibc's `clone3` or `clone`, or the loader's
/// `_dl_start_user`, its `_start` going on to run the libraries'
/// initializers), or is nameless and calls
/// `__libc_start_main`: the `_start` of a stripped executable, which has
/// no symbol (as, ld, gcc, collect2 and dash here).
fn rooted(user: &[&str]) -> bool {
    match user {
        [root, ..]
            if *root == "_start"
                || start_main(root)
                || matches!(
                    *root,
                    "start_thread" | "clone3" | "__clone3" | "clone" | "__clone" | "_dl_start_user"
                ) =>
        {
            true
        }
        [root, next, ..] => root.contains("[unknown]") && start_main(next),
        _ => false,
    }
}

/// Counts `n` samples of `comm` with user frames `user`, root first;
/// samples without user frames (kernel threads) are not counted.
fn add(by: &mut ByComm, comm: &str, user: &[&str], n: u64) {
    if user.is_empty() {
        return;
    }
    let c = by.entry(comm.to_owned()).or_default();
    c.samples += n;
    if rooted(user) {
        c.rooted += n;
    }
    if !user.iter().any(|f| unnamed(f)) {
        c.named += n;
    }
}

/// Counts the stacks of rtrace's folded output of user stacks
/// (`comm;root;..;leaf COUNT`).
fn count_folded(folded: &str, by: &mut ByComm) {
    for line in folded.lines() {
        let Some((stack, n)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(n) = n.parse::<u64>() else { continue };
        let mut frames = stack.split(';');
        let Some(comm) = frames.next() else { continue };
        let user: Vec<&str> = frames.collect();
        add(by, comm, &user, n);
    }
}

/// Lowest address of the kernel's half of x86-64's address space: perf
/// prints kernel frames at their addresses, user frames at their offsets
/// in their files.
const KERNEL_START: u64 = 0xffff_8000_0000_0000;

/// The function of a `perf script` frame line (`\tADDR SYM+OFF (DSO)`), or
/// `None` for a kernel frame.
fn perf_user_frame(line: &str) -> Option<&str> {
    let (addr, rest) = line.trim().split_once(' ')?;
    if u64::from_str_radix(addr, 16).ok()? >= KERNEL_START {
        return None;
    }
    let sym = rest.rsplit_once(" (").map_or(rest, |(s, _)| s);
    Some(sym.rsplit_once("+0x").map_or(sym, |(s, _)| s))
}

/// The command of a `perf script` sample line (`comm pid[/tid] [cpu]
/// time: ...`): the words before the first number, joined by `_` as
/// rtrace's folded lines join them.
fn perf_comm(head: &str) -> String {
    let number = |w: &str| {
        w.split('/')
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
    };
    head.split_whitespace()
        .take_while(|w| !number(w))
        .collect::<Vec<_>>()
        .join("_")
}

/// Counts the samples of `perf script` output: a sample line, its frames
/// leaf first on lines that start with a tab, a blank line.
fn count_script(script: &str, by: &mut ByComm) {
    let mut comm: Option<String> = None;
    let mut user: Vec<&str> = Vec::new();
    let mut flush = |comm: &mut Option<String>, user: &mut Vec<&str>| {
        if let Some(c) = comm.take() {
            user.reverse();
            add(by, &c, user, 1);
        }
        user.clear();
    };
    for line in script.lines() {
        if line.trim().is_empty() {
            flush(&mut comm, &mut user);
        } else if line.starts_with('\t') {
            user.extend(perf_user_frame(line));
        } else {
            flush(&mut comm, &mut user);
            comm = Some(perf_comm(line));
        }
    }
    flush(&mut comm, &mut user);
}

/// What one profiler left over the trials.
#[derive(Default)]
struct Tool {
    by: ByComm,
    /// Ctrl-C to a finished profile, per trial, in seconds.
    post: Vec<f64>,
    /// For perf: the stop alone and `perf script` alone.
    stop: Vec<f64>,
    script: Vec<f64>,
    /// Samples it said it lost.
    lost: u64,
}

/// Median and range of `v`, formatted with `digits` decimals.
fn ranged(v: &[f64], digits: usize) -> String {
    let (lo, hi) = spread(v);
    format!(
        "{:.digits$} ({lo:.digits$}-{hi:.digits$})",
        median(v.to_vec())
    )
}

/// Runs the section; prints its per-trial lines and the setups' table as
/// it goes. Returns its summary lines (the table by command, the added
/// build time, the time to a finished profile) and its row for `bench all`.
pub(super) fn run(rtrace: &Path) -> anyhow::Result<(Vec<String>, Row)> {
    let bench = crate::root().join("target/bench");
    let dir = bench.join("cbuild");
    generate(&dir)?;
    let folded = bench.join("cbuild.folded");
    let data = bench.join("cbuild.perf.data");
    let folded_s = folded.to_str().context("non-UTF-8 path")?.to_owned();
    let data_s = data.to_str().context("non-UTF-8 path")?.to_owned();
    let setups = vec![
        Setup::bare(),
        Setup::traced(
            format!("perf record --call-graph dwarf -a -F {HZ}"),
            "perf",
            &perf_dwarf(HZ, &data_s),
            Ready::After(Duration::from_secs(1)),
            None,
        ),
        Setup::traced(
            format!("rtrace profile -F {HZ} -U -f -o FILE"),
            rtrace,
            &["profile", "-F", HZ, "-U", "-f", "-o", &folded_s],
            Ready::Stderr("Sampling"),
            None,
        ),
    ];
    let trials = super::helpers::trials_from_env(super::TRIALS);
    eprintln!(
        "bench profile: a C build ({FILES} files, make {JOBS}), sampled at {HZ} Hz on every \
         CPU, median of {trials} interleaved trials"
    );
    // The first build reads gcc, its libraries and the sources from disk:
    // a cost no trial should carry.
    make(&dir, &["clean"])?;
    build(&dir)?;

    let _stats = aya::sys::enable_stats(aya::sys::Stats::RunTime)
        .context("cannot turn on BPF run-time statistics")?;
    /// One setup's measurements, a value per trial.
    #[derive(Default)]
    struct Measured {
        ms: Vec<f64>,
        bpf: Vec<f64>,
        own: Vec<f64>,
        stops: Vec<Stopped>,
    }
    let mut measured: Vec<Measured> = setups.iter().map(|_| Measured::default()).collect();
    let (mut ours, mut theirs) = (Tool::default(), Tool::default());
    for trial in 0..trials {
        for (i, s) in setups.iter().enumerate() {
            make(&dir, &["clean"])?;
            // A profile left by an earlier trial must not pass for this
            // one's, and perf would keep the last as a `.old` copy.
            let _ = std::fs::remove_file(&folded);
            let _ = std::fs::remove_file(&data);
            let tracer = s.start.as_ref().map(|f| f()).transpose()?;
            // Let attach-time work settle before timing, as the other
            // benchmarks do.
            std::thread::sleep(Duration::from_millis(200));
            let before = bpf_run_ns();
            let cpu_before = tracer.as_ref().map_or(0, |t| cpu_ns(t.child.id()));
            let ms = build(&dir)?;
            let bpf = bpf_run_ns().saturating_sub(before) as f64;
            let mut said = String::new();
            if let Some(t) = tracer {
                let stopped = t.stop()?;
                measured[i]
                    .own
                    .push(stopped.cpu_ns.saturating_sub(cpu_before) as f64);
                let stop = stopped.report.as_secs_f64();
                let samples = |by: &ByComm| by.values().map(|c| c.samples).sum::<u64>();
                if i == RTRACE {
                    let text = std::fs::read_to_string(&folded).with_context(|| {
                        format!("rtrace wrote no {}: {}", folded.display(), stopped.stderr)
                    })?;
                    let was = samples(&ours.by);
                    count_folded(&text, &mut ours.by);
                    ours.lost += rtrace_lost(&stopped.stderr);
                    ours.post.push(stop);
                    for w in stopped.stderr.lines().filter(|l| l.contains("warning")) {
                        eprintln!("    {w}");
                    }
                    said = format!(
                        "; Ctrl-C to profile {stop:.2} s, {} user stacks",
                        samples(&ours.by) - was
                    );
                } else {
                    let mut script = String::new();
                    let took = seconds(|| {
                        let out = Command::new("perf")
                            .args(["script", "-i", &data_s])
                            .stderr(Stdio::null())
                            .output()?;
                        if !out.status.success() {
                            bail!("perf script -i {data_s} failed ({})", out.status);
                        }
                        script = String::from_utf8_lossy(&out.stdout).into_owned();
                        Ok(())
                    })?;
                    let was = samples(&theirs.by);
                    count_script(&script, &mut theirs.by);
                    theirs.lost += perf_lost(&data_s);
                    theirs.post.push(stop + took);
                    theirs.stop.push(stop);
                    theirs.script.push(took);
                    said = format!(
                        "; stop {stop:.2} s + perf script {took:.2} s, {} user stacks",
                        samples(&theirs.by) - was
                    );
                }
                measured[i].stops.push(stopped);
            }
            eprintln!(
                "  trial {}: {:<44} {ms:>8.0} {UNIT}{said}",
                trial + 1,
                s.label
            );
            measured[i].ms.push(ms);
            measured[i].bpf.push(bpf);
        }
    }
    let results: Vec<Outcome> = measured
        .into_iter()
        .map(|m| Outcome {
            cost_spread: spread(&m.ms),
            cost: median(m.ms),
            bpf_spread: spread(&m.bpf),
            bpf_ns: median(m.bpf),
            tracer_ns: if m.own.is_empty() { 0.0 } else { median(m.own) },
            stops: m.stops,
        })
        .collect();
    print_costs(&setups, &results, UNIT);

    let mut lines = vec![format!(
        "C build ({FILES} files, make {JOBS}), {HZ} Hz, user stacks by command over {trials} \
         trials; rooted: the outermost frame is _start (or a stripped executable's nameless \
         one calling __libc_start_main), __libc_start_main, start_thread or clone3; named: \
         no [unknown] frame"
    )];
    lines.extend(by_command(&ours.by, &theirs.by));
    let bare = results[0].cost;
    let added = |i: usize| {
        let r = &results[i];
        format!(
            "{:+.0} ms ({:+.0} to {:+.0}; {:+.1}%)",
            r.cost - bare,
            r.cost_spread.0 - bare,
            r.cost_spread.1 - bare,
            100.0 * (r.cost - bare) / bare
        )
    };
    lines.push(format!(
        "C build: bare {bare:.0} ms; added by rtrace {}, by perf --call-graph dwarf {} \
         (medians, ranges over the trials against the bare median); own CPU per build: \
         rtrace {:.0} ms, perf {:.0} ms",
        added(RTRACE),
        added(PERF),
        results[RTRACE].tracer_ns / 1e6,
        results[PERF].tracer_ns / 1e6,
    ));
    let (o, t) = (median(ours.post.clone()), median(theirs.post.clone()));
    lines.push(format!(
        "C build, Ctrl-C to finished profile: rtrace {} s; perf record stop + perf script {} s \
         (stop {} s, script {} s); rtrace / perf {:.2}x",
        ranged(&ours.post, 2),
        ranged(&theirs.post, 2),
        ranged(&theirs.stop, 2),
        ranged(&theirs.script, 2),
        o / t
    ));
    lines.push(format!(
        "C build, samples reported lost over the trials: rtrace {}, perf {}",
        ours.lost, theirs.lost
    ));
    let row = Row::new(
        "profile",
        format!("C build of {FILES} files, make {JOBS}, {HZ} Hz, system-wide"),
        UNIT,
        (&setups, &results),
        (RTRACE, PERF),
        None,
    );
    Ok((lines, row))
}

/// The table of [`Counts`] by command, both profilers side by side, for
/// commands with [`MIN_SAMPLES`] in either; the busiest first.
fn by_command(ours: &ByComm, theirs: &ByComm) -> Vec<String> {
    let none = Counts::default();
    let names: std::collections::BTreeSet<&String> = ours.keys().chain(theirs.keys()).collect();
    let mut comms: Vec<(&String, Counts, Counts)> = names
        .into_iter()
        .map(|c| {
            (
                c,
                ours.get(c).copied().unwrap_or(none),
                theirs.get(c).copied().unwrap_or(none),
            )
        })
        .filter(|(_, o, t)| o.samples.max(t.samples) >= MIN_SAMPLES)
        .collect();
    comms.sort_by(|a, b| {
        (b.1.samples + b.2.samples)
            .cmp(&(a.1.samples + a.2.samples))
            .then(a.0.cmp(b.0))
    });
    let pct = |n: u64, of: u64| {
        if of == 0 {
            "-".to_owned()
        } else {
            format!("{:.1}%", 100.0 * n as f64 / of as f64)
        }
    };
    let mut out = vec![format!(
        "{:<16} {:>14} {:>8} {:>8}   {:>14} {:>8} {:>8}",
        "command", "rtrace samples", "rooted", "named", "perf samples", "rooted", "named"
    )];
    for (comm, o, t) in comms {
        out.push(format!(
            "{comm:<16} {:>14} {:>8} {:>8}   {:>14} {:>8} {:>8}",
            o.samples,
            pct(o.rooted, o.samples),
            pct(o.named, o.samples),
            t.samples,
            pct(t.rooted, t.samples),
            pct(t.named, t.samples),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folded_stacks_are_counted_by_command() {
        let folded = "cc1;_start;__libc_start_main;main;toplev::main 5\n\
                      as;[unknown];__libc_start_main_impl;__libc_start_call_main;[unknown] 3\n\
                      as;[unknown];[unknown] 2\n\
                      make;[Missed User Stack] 1\n\
                      kworker/0:1 4\n";
        let mut by = ByComm::new();
        count_folded(folded, &mut by);
        let cc1 = by["cc1"];
        assert_eq!((cc1.samples, cc1.rooted, cc1.named), (5, 5, 5));
        let as_ = by["as"];
        assert_eq!((as_.samples, as_.rooted, as_.named), (5, 3, 0));
        let make = by["make"];
        assert_eq!((make.samples, make.rooted, make.named), (1, 0, 0));
        assert!(!by.contains_key("kworker/0:1"));
    }

    #[test]
    fn perf_script_samples_are_counted_by_command() {
        let script = "gcc 11559 [001] 32330.302174:    1001001 cpu-clock:ppp: \n\
                      \tffffffff822601e7 exc_page_fault+0xd7 ([kernel.kallsyms])\n\
                      \t            6cf4 [unknown] (/usr/bin/x86_64-linux-gnu-gcc-12)\n\
                      \t           27249 __libc_start_call_main+0x79 (/usr/lib/libc.so.6)\n\
                      \t           27304 __libc_start_main_impl+0x84 (inlined)\n\
                      \t            5860 [unknown] (/usr/bin/x86_64-linux-gnu-gcc-12)\n\
                      \n\
                      cc1 11561/11561 [000] 32330.303261:    1001001 cpu-clock:ppp: \n\
                      \t            72b2 c_parser_expr+0xce2 (/usr/lib/gcc/cc1)\n\
                      \t            1ab7 main+0x7 (/usr/lib/gcc/cc1)\n\
                      \n\
                      swapper     0 [001] 32330.303262:    1001001 cpu-clock:ppp: \n\
                      \tffffffff81000c82 default_idle+0x22 ([kernel.kallsyms])\n\
                      \n";
        let mut by = ByComm::new();
        count_script(script, &mut by);
        let gcc = by["gcc"];
        assert_eq!((gcc.samples, gcc.rooted, gcc.named), (1, 1, 0));
        let cc1 = by["cc1"];
        assert_eq!((cc1.samples, cc1.rooted, cc1.named), (1, 0, 1));
        assert!(!by.contains_key("swapper"));
    }

    #[test]
    fn perf_commands_may_hold_spaces() {
        assert_eq!(
            perf_comm("Web Content 12/13 [001] 1.0: 1 cpu-clock:"),
            "Web_Content"
        );
        assert_eq!(perf_comm("   cc1  42 [000] 1.0:"), "cc1");
    }
}

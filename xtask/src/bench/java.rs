//! `cargo xtask bench java`: what Java frames cost. Two busy JVMs (the
//! host's Debian OpenJDK 17, whose code has no frame pointers, each
//! running `tests/fixtures/java/Hot.java rounds`) each do a fixed amount
//! of work, bare and under each profiler sampling the whole system at 99
//! and 999 Hz: rtrace with Java frames (its default), the same with
//! `--no-java`, rtrace's frame-pointer walk (`--unwind fp`) of JVMs run
//! with `-XX:+PreserveFramePointer` (the cheapest walk that goes through
//! Java's frames), and `perf record -g -a` of such JVMs, which write the
//! perf map perf names JIT code by, and `perf record -a` without stacks
//! (what the samples alone cost). Reported: the time and the working
//! thread's CPU added to each round of the fixtures' work, the BPF time
//! per sample (the kernel's own
//! statistics) and per Java frame, the profiler's own CPU, samples lost,
//! and the share of the fixtures' samples with the whole chain; then, with
//! the fixture's `gaps` mode, what each sample takes from the thread it
//! interrupts, as the thread sees it in its reading of the clock.
//! Interleaved trials, medians and ranges.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use anyhow::{Context as _, bail};

use super::{
    Ready, Tracer, bpf_run_ns, bpf_runs_of,
    helpers::{
        CpuGroup, Fixtures, bpf_cell, paired_text, perf_lost, rtrace_lost, trials_from_env,
        unmarked, us_ranged,
    },
    measured_on, median, spread,
};

/// Rounds of the fixture's work per JVM and trial: about 3 s bare.
const ROUNDS: u64 = 5500;

/// How long after rtrace starts sampling its BPF time per sample is
/// measured again ([`Trial::bpf_settled`]): what a run does once (user
/// space reading each process, the kernel's first walk of each thread,
/// frame and method) is mostly behind it by then.
const SETTLED: Duration = Duration::from_secs(1);
/// The sampling rates measured.
const RATES: [u64; 2] = [99, 999];
/// The frame the fixtures' work runs under: the JVM launcher's thread
/// function, which calls the Java main method.
const LAUNCHER: &str = "JavaMain";
/// The JVM's way into Java code, under the first Java frame.
const CALL_HELPER: &str = "JavaCalls::call_helper";
/// The frames above [`CALL_HELPER`] of a whole chain of the fixture's
/// work, as the Java walk shows them: the call stub, `main` and `rounds`
/// interpreted, `pick` compiled with `hot` or `warm` inlined. A walk
/// without the Java walk that reaches the launcher with fewer has
/// skipped one (the CFI walk, in compiled code that keeps no frame
/// pointer, takes the interpreter's `rbp` for its own).
const PHYSICAL: usize = 4;

/// One way of running the fixtures: bare or under a profiler, and the
/// JVM flag the profiler needs.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Config {
    Bare,
    /// Bare, with `-XX:+PreserveFramePointer`: what the rows with the
    /// flag are measured against, as the flag itself costs the JIT code a
    /// register.
    BareFp,
    NoJava,
    Java,
    Fp,
    Perf,
    /// `perf record -a` without `-g`: what taking the samples costs
    /// before any walk, the floor under every sampling profiler's cost
    /// at that rate.
    PerfNoStacks,
}

impl Config {
    /// Every configuration, in the order each trial runs them; a
    /// configuration's place is its number (`as usize`).
    const ALL: [Self; 7] = [
        Self::Bare,
        Self::BareFp,
        Self::NoJava,
        Self::Java,
        Self::Fp,
        Self::Perf,
        Self::PerfNoStacks,
    ];

    fn label(self) -> &'static str {
        match self {
            Self::Bare => "bare",
            Self::BareFp => "bare, -XX:+PreserveFramePointer",
            Self::NoJava => "rtrace profile --no-java",
            Self::Java => "rtrace profile (Java frames)",
            Self::Fp => "rtrace profile --unwind fp, -XX:+PreserveFramePointer",
            Self::Perf => "perf record -g -a, -XX:+PreserveFramePointer",
            Self::PerfNoStacks => "perf record -a (no stacks), -XX:+PreserveFramePointer",
        }
    }

    /// Whether its JVMs run with `-XX:+PreserveFramePointer`.
    fn preserve_fp(self) -> bool {
        matches!(
            self,
            Self::BareFp | Self::Fp | Self::Perf | Self::PerfNoStacks
        )
    }

    /// The bare run its added time is measured from: the same JVM flags.
    fn bare(self) -> Self {
        if self.preserve_fp() {
            Self::BareFp
        } else {
            Self::Bare
        }
    }
}

/// The fixture compiled by javac into a directory of its own (which
/// also holds perf's data), removed when dropped.
struct Classes(PathBuf);

impl Classes {
    fn compile() -> anyhow::Result<Self> {
        let dir = std::env::temp_dir().join(format!("rtrace-bench-java-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let classes = Self(dir);
        let src = crate::root().join("tests/fixtures/java/Hot.java");
        let out = Command::new("javac")
            .arg("-d")
            .arg(&classes.0)
            .arg(&src)
            .output()
            .context("cannot run javac (Debian package openjdk-17-jdk-headless)")?;
        if !out.status.success() {
            bail!("javac failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(classes)
    }
}

impl Drop for Classes {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The two fixtures' JVMs.
struct Jvms(Fixtures);

impl Jvms {
    /// Starts both in the fixture's `mode` (its arguments), with
    /// `-XX:+PreserveFramePointer` if `preserve_fp`, and waits until both
    /// are warm.
    fn start(classes: &Path, preserve_fp: bool, mode: [&str; 2]) -> anyhow::Result<Self> {
        let cmds = (0..2).map(|_| {
            let mut cmd = Command::new("java");
            if preserve_fp {
                cmd.arg("-XX:+PreserveFramePointer");
            }
            cmd.arg("-cp").arg(classes).arg("Hot").args(mode);
            cmd
        });
        Ok(Self(Fixtures::start(
            cmds,
            "JVM",
            "openjdk-17-jdk-headless",
        )?))
    }

    /// Lets both work; returns their mean wall-clock and working
    /// thread's CPU nanoseconds per round.
    fn work(&mut self) -> anyhow::Result<(f64, f64)> {
        let (wall, cpu) = self.0.work_timed()?;
        Ok((wall / ROUNDS as f64, cpu / ROUNDS as f64))
    }

    /// Has each JVM write its perf map (`/tmp/perf-PID.map`), which is
    /// how perf names JIT code: `jcmd PID Compiler.perfmap` (JDK 17+),
    /// after the work and before the JVM exits.
    fn write_perf_maps(&self) -> anyhow::Result<()> {
        // Both at once: each jcmd is a JVM of its own to start.
        let jcmds = self
            .0
            .children()
            .map(|c| {
                Command::new("jcmd")
                    .args([&c.id().to_string(), "Compiler.perfmap"])
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .spawn()
                    .context("cannot run jcmd (Debian package openjdk-17-jdk-headless)")
            })
            .collect::<anyhow::Result<Vec<Child>>>()?;
        for jcmd in jcmds {
            let out = jcmd.wait_with_output()?;
            if !out.status.success() {
                bail!(
                    "jcmd Compiler.perfmap failed: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
        }
        Ok(())
    }

    /// The command name of the thread that did the first JVM's work (its
    /// busiest), which its samples carry first.
    fn worker_comm(&self) -> anyhow::Result<String> {
        let pid = self.0.pids()[0];
        let busiest = std::fs::read_dir(format!("/proc/{pid}/task"))?
            .flatten()
            .filter_map(|t| {
                let stat = std::fs::read_to_string(t.path().join("schedstat")).ok()?;
                let ns: u64 = stat.split_whitespace().next()?.parse().ok()?;
                Some((ns, t.path()))
            })
            .max_by_key(|(ns, _)| *ns)
            .context("the JVM has no threads")?;
        Ok(std::fs::read_to_string(busiest.1.join("comm"))?
            .trim()
            .to_owned())
    }

    /// Ends their input, which they wait for after the work, and waits
    /// for them to exit.
    fn finish(self) -> anyhow::Result<()> {
        self.0.finish()
    }
}

/// What a profile says of the samples: their number, those of the
/// fixtures' working threads and of them the whole chains, the Java
/// frames the kernel walked, and samples without their stack.
#[derive(Default, Debug, PartialEq)]
struct Counts {
    samples: u64,
    fixture: u64,
    whole: u64,
    java_frames: u64,
    missed: u64,
}

/// Counts rtrace's folded stacks (`comm;frames.. count`, root first, with
/// `-a`'s marks). A sample of thread `comm` is whole if `Hot.main` sits
/// above the launcher (`java`: the Java walk's rows), or else if the walk
/// reached the launcher with [`PHYSICAL`] user frames or more above
/// [`CALL_HELPER`] (the rows without it, where nothing names the
/// interpreted `Hot.main`). The Java frames the kernel walked are the
/// compiled and interpreted ones and the stubs (`_[j]`, `_[p]`): inlined
/// methods (`_[i]`) are named in user space from the compiled code's
/// debug information.
fn count_folded(folded: &str, comm: &str, java: bool) -> Counts {
    let mut c = Counts::default();
    for line in folded.lines() {
        let Some((stack, n)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(n) = n.parse::<u64>() else {
            continue;
        };
        c.samples += n;
        let frames: Vec<&str> = stack.split(';').collect();
        let walked = frames
            .iter()
            .skip(1)
            .filter(|f| f.ends_with("_[j]") || f.ends_with("_[p]"))
            .count() as u64;
        c.java_frames += walked * n;
        if frames.contains(&"[Missed User Stack]") {
            c.missed += n;
        }
        if frames.first() != Some(&comm) {
            continue;
        }
        c.fixture += n;
        let at = |name: &str| frames.iter().position(|f| unmarked(f) == name);
        let launcher = at(LAUNCHER);
        let whole = if java {
            launcher.is_some_and(|l| at("Hot.main").is_some_and(|main| main > l))
        } else {
            let helper = frames.iter().position(|f| f.starts_with(CALL_HELPER));
            match (launcher, helper) {
                (Some(l), Some(h)) if h > l => {
                    let above = frames[h + 1..].iter().filter(|f| !f.ends_with("_[k]"));
                    above.count() >= PHYSICAL
                }
                _ => false,
            }
        };
        if whole {
            c.whole += n;
        }
    }
    c
}

/// Counts `perf script`'s samples: one block each, a `comm tid ...` line
/// then a frame a line (`ADDR NAME+OFF (FILE)`), leaf first. A sample of
/// thread `comm` is whole if perf's walk reached the launcher with
/// [`PHYSICAL`] user frames or more above [`CALL_HELPER`], as
/// [`count_folded`] judges the rows without the Java walk. Returns too
/// the fixtures' samples that name one of its methods, from the perf
/// map.
fn count_perf_script(script: &str, comm: &str) -> (Counts, u64) {
    let mut c = Counts::default();
    let mut named = 0;
    for block in script.split("\n\n") {
        let mut lines = block.lines().filter(|l| !l.trim().is_empty());
        let Some(head) = lines.next() else { continue };
        c.samples += 1;
        // The command may hold spaces (`C2 CompilerThre`): what follows
        // it is the thread's id.
        let of_fixture = head
            .trim_start()
            .strip_prefix(comm)
            .is_some_and(|rest| rest.starts_with(char::is_whitespace));
        if !of_fixture {
            continue;
        }
        c.fixture += 1;
        let frames: Vec<&str> = lines.collect();
        let name = |f: &str| f.split_whitespace().nth(1).unwrap_or_default().to_owned();
        let helper = frames.iter().position(|f| name(f).starts_with(CALL_HELPER));
        let launcher = frames
            .iter()
            .position(|f| name(f).split('+').next() == Some(LAUNCHER));
        if let (Some(h), Some(l)) = (helper, launcher)
            && l > h
        {
            // Kernel frames come first, leaf first.
            let above = frames[..h]
                .iter()
                .filter(|f| !f.contains("[kernel.kallsyms]"));
            if above.count() >= PHYSICAL {
                c.whole += 1;
            }
        }
        // Perf map names carry their signatures (`int Hot.hot(int)`),
        // whose first word is the type.
        if block.contains(" Hot.") {
            named += 1;
        }
    }
    (c, named)
}

/// What one trial measured.
struct Trial {
    /// Nanoseconds a round took, the mean of both JVMs.
    round_ns: f64,
    /// The working thread's CPU nanoseconds a round, the mean of both
    /// JVMs: what the sampling interrupts took on it included.
    round_cpu_ns: f64,
    /// BPF nanoseconds per sample (rtrace only).
    bpf_per_sample: Option<f64>,
    /// BPF nanoseconds per sample from `SETTLED` after rtrace samples to
    /// its stop (rtrace only): the walk's cost a sample once what it
    /// does once a run (its first walks of each thread, frame and method,
    /// while user space still reads the processes) is done.
    bpf_settled: Option<f64>,
    /// The profiler's own CPU time over the work, in nanoseconds.
    own_ns: Option<u64>,
    /// Samples lost, or without their stack.
    lost: u64,
    counts: Counts,
}

/// Starts `config`'s profiler sampling at `hz` (none for the bare
/// runs), perf writing its data to `data`; returns once it samples.
fn start_profiler(
    config: Config,
    hz: u64,
    rtrace: &Path,
    data: &Path,
) -> anyhow::Result<Option<Tracer>> {
    let hz_s = hz.to_string();
    Ok(match config {
        Config::Bare | Config::BareFp => None,
        Config::NoJava | Config::Java | Config::Fp => {
            let mut c = Command::new(rtrace);
            // `-a` marks each frame's kind, which tells Java frames
            // apart; it changes nothing in the kernel.
            c.args(["profile", "-F", &hz_s, "-f", "-a"]);
            if config == Config::NoJava {
                c.arg("--no-java");
            }
            if config == Config::Fp {
                c.args(["--unwind", "fp"]);
            }
            Some(Tracer::start_keeping(c, Ready::Stderr("Sampling"))?)
        }
        Config::Perf | Config::PerfNoStacks => {
            let mut c = Command::new("perf");
            c.args(["record", "-q", "-a", "-F", &hz_s]);
            if config == Config::Perf {
                c.arg("-g");
            }
            c.arg("-o").arg(data);
            Some(Tracer::start(
                c,
                Ready::After(Duration::from_secs(1)),
                None,
            )?)
        }
    })
}

/// Seconds each JVM reads the clock for in a trial of the fixture's `gaps`
/// mode.
const GAP_SECONDS: u64 = 3;

/// What the fixture's `gaps` mode saw in one trial, the mean of both JVMs:
/// the time taken from its thread, as gaps between two reads of the clock.
struct Gaps {
    /// Gaps under 50 us (an interrupt, and what ran in it).
    short_n: f64,
    /// Their nanoseconds.
    short_ns: f64,
    /// Nanoseconds of the longer gaps (the thread made to wait for another
    /// task).
    long_ns: f64,
}

/// One trial of `config` at `hz` with the fixture's `gaps` mode: both
/// JVMs read the clock for [`GAP_SECONDS`], from a second after the
/// profiler samples (as perf is given, a second after its start), when
/// what it does once a run is behind it.
fn gap_trial(config: Config, hz: u64, rtrace: &Path, classes: &Classes) -> anyhow::Result<Gaps> {
    let mode = ["gaps", &GAP_SECONDS.to_string()];
    let mut jvms = Jvms::start(&classes.0, config.preserve_fp(), mode)?;
    let data = classes.0.join("perf.data");
    let profiler = start_profiler(config, hz, rtrace, &data)?;
    if matches!(config, Config::NoJava | Config::Java | Config::Fp) {
        std::thread::sleep(SETTLED);
    }
    let lines = jvms.0.work();
    // Stopped whatever became of the work.
    let stopped = profiler.map(Tracer::stop).transpose();
    let _ = std::fs::remove_file(&data);
    let lines = lines?;
    stopped?;
    jvms.finish()?;
    let mut g = Gaps {
        short_n: 0.0,
        short_ns: 0.0,
        long_ns: 0.0,
    };
    for line in &lines {
        let f: Vec<f64> = line
            .split_whitespace()
            .skip(1)
            .filter_map(|w| w.parse().ok())
            .collect();
        let [short_n, short_ns, _, long_ns] = f[..] else {
            bail!("the fixture JVM said {line:?}, not done SHORT_N SHORT_NS LONG_N LONG_NS");
        };
        g.short_n += short_n / lines.len() as f64;
        g.short_ns += short_ns / lines.len() as f64;
        g.long_ns += long_ns / lines.len() as f64;
    }
    Ok(g)
}

/// The gap trials at `hz`: their table rows, and what they say of a
/// sample's cost against perf's and the floor under both.
fn gap_rows(hz: u64, got: &[Vec<Gaps>]) -> (String, String) {
    let of = |c: Config| &got[c as usize];
    // Per trial, over the median of the bare runs with the same flags:
    // each added short gap is a sample on the thread.
    let bare = |c: Config, f: fn(&Gaps) -> f64| median(of(c.bare()).iter().map(f).collect());
    let per_sample = |c: Config| -> Vec<f64> {
        let (n0, ns0) = (bare(c, |g| g.short_n), bare(c, |g| g.short_ns));
        of(c)
            .iter()
            .filter(|g| g.short_n > n0)
            .map(|g| (g.short_ns - ns0) / (g.short_n - n0))
            .collect()
    };
    let mut rows = String::new();
    for c in Config::ALL
        .into_iter()
        .filter(|&c| !matches!(c, Config::Bare | Config::BareFp))
    {
        let n0 = bare(c, |g| g.short_n);
        let long0 = bare(c, |g| g.long_ns);
        let samples: Vec<f64> = of(c)
            .iter()
            .map(|g| (g.short_n - n0) / GAP_SECONDS as f64)
            .collect();
        let waited: Vec<f64> = of(c)
            .iter()
            .map(|g| (g.long_ns - long0) / GAP_SECONDS as f64)
            .collect();
        let (lo, hi) = spread(&waited);
        let sample = per_sample(c);
        let sample_cell = if sample.is_empty() {
            "-".to_owned()
        } else {
            us_ranged(&sample)
        };
        rows.push_str(&format!(
            "| {hz} Hz | {} | {sample_cell} | {:.0} | {:.2} ms ({:.2} to {:.2}) |\n",
            c.label(),
            median(samples),
            median(waited.clone()) / 1e6,
            lo / 1e6,
            hi / 1e6,
        ));
    }
    // None where no trial had more short gaps than the bare runs.
    let m = |c: Config| Some(per_sample(c)).filter(|v| !v.is_empty()).map(median);
    let (Some(floor), Some(perf), Some(java), Some(fp)) = (
        m(Config::PerfNoStacks),
        m(Config::Perf),
        m(Config::Java),
        m(Config::Fp),
    ) else {
        let verdict = format!(
            "{hz} Hz: some profiler's samples could not be told from the bare runs' other gaps \
             in any trial, so no sample's time is given"
        );
        return (rows, verdict);
    };
    let verdict = format!(
        "{hz} Hz, a sample's time from the thread it interrupts: rtrace's with Java frames \
         {:.1} us, {:.2}x perf's with `-g` ({:.1} us; rtrace's frame-pointer walk {:.1} us); \
         above the floor of perf's samples without their stacks ({:.1} us), {:.1} us against \
         perf's {:.1} us; a quarter of perf's, {:.1} us, is {:.2}x that floor",
        java / 1e3,
        java / perf,
        perf / 1e3,
        fp / 1e3,
        floor / 1e3,
        (java - floor) / 1e3,
        (perf - floor) / 1e3,
        perf / 4e3,
        perf / 4.0 / floor,
    );
    (rows, verdict)
}

/// One trial of `config` at `hz`.
fn trial(config: Config, hz: u64, rtrace: &Path, classes: &Classes) -> anyhow::Result<Trial> {
    let mut jvms = Jvms::start(
        &classes.0,
        config.preserve_fp(),
        ["rounds", &ROUNDS.to_string()],
    )?;
    let data = classes.0.join("perf.data");
    let profiler = start_profiler(config, hz, rtrace, &data)?;
    let pid = profiler.as_ref().map(|t| t.child.id());
    // BPF time from when rtrace samples to the signal to stop: the
    // stretch its samples come from. Its CPU time over the work alone.
    let before = bpf_run_ns();
    // Read from a thread, `SETTLED` into the work, which blocks this one.
    let settled = pid.map(|_| {
        std::thread::spawn(|| {
            std::thread::sleep(SETTLED);
            (bpf_run_ns(), bpf_runs_of("profile"))
        })
    });
    // Every thread's CPU time, those that end during the work too (rtrace's
    // copy of kallsyms, made on a thread of its own).
    let group = pid.map(CpuGroup::of_profiler).transpose()?;
    let cpu_before = group.as_ref().and_then(CpuGroup::cpu_ns);
    let measured = (|| -> anyhow::Result<_> {
        let (round_ns, round_cpu_ns) = jvms.work()?;
        let own_ns = group
            .as_ref()
            .and_then(CpuGroup::cpu_ns)
            .zip(cpu_before)
            .map(|(now, then)| (now - then).max(0.0) as u64);
        let comm = jvms.worker_comm()?;
        if config == Config::Perf {
            // Outside the timed work, while perf still records (jcmd's
            // own samples with the rest).
            jvms.write_perf_maps()?;
        }
        Ok((round_ns, round_cpu_ns, own_ns, comm))
    })();
    let end = (bpf_run_ns(), bpf_runs_of("profile"));
    let bpf = end.0.saturating_sub(before) as f64;
    let bpf_settled = settled.and_then(|h| h.join().ok()).and_then(|(ns, runs)| {
        let samples = end.1.checked_sub(runs).filter(|&n| n > 0)?;
        Some(end.0.saturating_sub(ns) as f64 / samples as f64)
    });
    let pids = jvms.0.pids();
    // Stopped whatever became of the work: a profiler left running
    // would sample every later trial.
    let stopped = profiler.map(Tracer::stop).transpose()?;
    let (round_ns, round_cpu_ns, own_ns, comm) = measured?;
    jvms.finish()?;
    let mut t = Trial {
        round_ns,
        round_cpu_ns,
        bpf_per_sample: None,
        bpf_settled,
        own_ns,
        lost: 0,
        counts: Counts::default(),
    };
    let Some(stopped) = stopped else {
        return Ok(t);
    };
    if matches!(config, Config::Perf | Config::PerfNoStacks) {
        let data_s = data.to_string_lossy();
        let out = Command::new("perf")
            .args(["script", "--no-inline", "-i", &data_s])
            .stderr(Stdio::null())
            .output()
            .context("cannot run perf script")?;
        let script = String::from_utf8_lossy(&out.stdout);
        let counts = if config == Config::Perf {
            let (counts, named) = count_perf_script(&script, &comm);
            eprintln!(
                "    perf named a fixture method from the perf map in {named} of {} samples of \
                 {comm}",
                counts.fixture
            );
            counts
        } else {
            // A line a sample, without stacks.
            Counts {
                samples: script.lines().filter(|l| !l.trim().is_empty()).count() as u64,
                ..Counts::default()
            }
        };
        t.lost = perf_lost(&data_s);
        t.counts = counts;
        let _ = std::fs::remove_file(&data);
        for p in pids {
            let _ = std::fs::remove_file(format!("/tmp/perf-{p}.map"));
        }
    } else {
        // Folded stacks spell a command's spaces `_`.
        let comm = comm.replace(' ', "_");
        t.counts = count_folded(&stopped.stdout, &comm, config == Config::Java);
        t.lost = rtrace_lost(&stopped.stderr) + t.counts.missed;
        t.bpf_per_sample = Some(bpf / t.counts.samples.max(1) as f64);
    }
    Ok(t)
}

/// `RTRACE_BENCH_JAVA=999`: one rate, for measuring a change to the
/// walk; its table is not written to the docs.
pub fn part() -> Option<u64> {
    std::env::var("RTRACE_BENCH_JAVA")
        .ok()
        .and_then(|r| r.parse().ok())
}

/// Runs the benchmark; the table for `docs/benchmarks.md`.
pub fn run() -> anyhow::Result<String> {
    let rtrace = crate::build()?;
    let classes = Classes::compile()?;
    let _stats = aya::sys::enable_stats(aya::sys::Stats::RunTime)
        .context("cannot turn on BPF run-time statistics")?;
    let trials = trials_from_env(5);
    let mut rows = String::from(
        "| rate | profiler | added per round | added CPU per round | BPF per sample | own CPU | \
         samples (lost) | Java frames a sample | whole chains |\n| --- | --- | --- | --- | --- | \
         --- | --- | --- | --- |\n",
    );
    let mut verdicts = Vec::new();
    let mut bare_s = Vec::new();
    let mut gap_table = String::from(
        "| rate | profiler | a sample's time from the thread | samples a second on it | waited \
         a second |\n| --- | --- | --- | --- | --- |\n",
    );
    let mut gap_verdicts = Vec::new();
    let rates = RATES
        .into_iter()
        .filter(|&hz| part().is_none_or(|p| p == hz));
    for hz in rates {
        eprintln!("bench java: {hz} Hz, {trials} interleaved trials");
        let mut got: Vec<Vec<Trial>> = Config::ALL.iter().map(|_| Vec::new()).collect();
        for n in 1..=trials {
            for config in Config::ALL {
                let t = trial(config, hz, &rtrace, &classes)?;
                eprintln!(
                    "  trial {n}: {:<54} {:>8.1} us/round ({:.1} CPU), {} samples, {} lost, {} \
                     of {} whole",
                    config.label(),
                    t.round_ns / 1e3,
                    t.round_cpu_ns / 1e3,
                    t.counts.samples,
                    t.lost,
                    t.counts.whole,
                    t.counts.fixture
                );
                got[config as usize].push(t);
            }
        }
        let mut gaps: Vec<Vec<Gaps>> = Config::ALL.iter().map(|_| Vec::new()).collect();
        for n in 1..=trials {
            for config in Config::ALL {
                let g = gap_trial(config, hz, &rtrace, &classes)?;
                eprintln!(
                    "  gaps {n}: {:<54} {:>6.0} short gaps, {:.1} us each, {:.2} ms waited",
                    config.label(),
                    g.short_n,
                    g.short_ns / g.short_n.max(1.0) / 1e3,
                    g.long_ns / 1e6
                );
                gaps[config as usize].push(g);
            }
        }
        let (gap_rows, verdict) = gap_rows(hz, &gaps);
        gap_table.push_str(&gap_rows);
        gap_verdicts.push(verdict);
        let of = |c: Config, f: fn(&Trial) -> f64| -> Vec<f64> {
            got[c as usize].iter().map(f).collect()
        };
        let wall = |t: &Trial| t.round_ns;
        let cpu = |t: &Trial| t.round_cpu_ns;
        bare_s.push(median(of(Config::Bare, wall)) * ROUNDS as f64 / 1e9);
        // Each trial's figure over the median of `base`'s.
        let over = |c: Config, base: Config, f: fn(&Trial) -> f64| -> Vec<f64> {
            let bare = median(of(base, f));
            of(c, f).iter().map(|r| r - bare).collect()
        };
        // A row's added time: over the bare run with the same JVM flags,
        // and the flag's own row over the plain bare run (what the flag
        // alone costs).
        let row_base = |c: Config| {
            if c == Config::BareFp {
                Config::Bare
            } else {
                c.bare()
            }
        };
        // A trial's figure (`None` where it measured none), trial by
        // trial, for the pairs; and the measured ones alone.
        let per_trial = |c: Config, f: fn(&Trial) -> Option<f64>| {
            got[c as usize].iter().map(f).collect::<Vec<_>>()
        };
        let measured = |c: Config, f: fn(&Trial) -> Option<f64>| -> Vec<f64> {
            per_trial(c, f).into_iter().flatten().collect()
        };
        // Over the whole run, and from `SETTLED` on.
        let whole = |t: &Trial| t.bpf_per_sample;
        let settled = |t: &Trial| t.bpf_settled;
        let bpf = |c: Config| measured(c, whole);
        for config in Config::ALL.into_iter().filter(|&c| c != Config::Bare) {
            let ts = &got[config as usize];
            let (added, added_cpu) = (
                us_ranged(&over(config, row_base(config), wall)),
                us_ranged(&over(config, row_base(config), cpu)),
            );
            if config == Config::BareFp {
                rows.push_str(&format!(
                    "| {hz} Hz | {} | {added} | {added_cpu} | - | - | - | - | - |\n",
                    config.label()
                ));
                continue;
            }
            let bpf_cell = bpf_cell(&bpf(config));
            let own: Vec<f64> = ts
                .iter()
                .filter_map(|t| t.own_ns)
                .map(|n| n as f64)
                .collect();
            let own_cell = if own.is_empty() {
                "-".to_owned()
            } else {
                format!("{:.1} ms", median(own) / 1e6)
            };
            let sum = |f: fn(&Trial) -> u64| ts.iter().map(f).sum::<u64>();
            let samples = sum(|t| t.counts.samples);
            let frames_cell = if config == Config::Java {
                format!(
                    "{:.2}",
                    sum(|t| t.counts.java_frames) as f64 / samples.max(1) as f64
                )
            } else {
                "-".to_owned()
            };
            let whole_cell = if config == Config::PerfNoStacks {
                "-".to_owned()
            } else {
                format!(
                    "{:.1}%",
                    sum(|t| t.counts.whole) as f64 * 100.0
                        / sum(|t| t.counts.fixture).max(1) as f64
                )
            };
            rows.push_str(&format!(
                "| {hz} Hz | {} | {added} | {added_cpu} | {bpf_cell} | {own_cell} | {} ({}) | \
                 {frames_cell} | {whole_cell} |\n",
                config.label(),
                samples / trials as u64,
                sum(|t| t.lost) / trials as u64,
            ));
        }
        let java_bpf = median(bpf(Config::Java));
        let fp_bpf = median(bpf(Config::Fp));
        let java = &got[Config::Java as usize];
        let frames = java.iter().map(|t| t.counts.java_frames).sum::<u64>() as f64
            / java.iter().map(|t| t.counts.samples).sum::<u64>().max(1) as f64;
        // What each profiler adds to the JVMs it samples, each over the
        // bare run with the same flags (the flag perf needs costs this
        // fixture nothing: the table's row of it), and what perf's
        // samples cost without their stacks: the floor under any
        // profiler sampling at this rate.
        let cost = |what: &str, f: fn(&Trial) -> f64| {
            let ours = over(Config::Java, Config::Bare, f);
            let perf = over(Config::Perf, Config::BareFp, f);
            let floor = median(over(Config::PerfNoStacks, Config::BareFp, f));
            let (lo, hi) = spread(&perf);
            // As `bench all` has it: against a peer whose added time the
            // trials cannot tell from nothing, a ratio would be noise over
            // noise.
            if lo > 0.0 {
                let perf_median = median(perf.clone());
                format!(
                    "rtrace's added {what} per round is {:.2}x perf's ({} against {}; goal: at \
                     most 0.25x); perf's samples without their stacks add {:.1} us, {:.2}x \
                     perf's with them",
                    median(ours.clone()).max(0.0) / perf_median,
                    us_ranged(&ours),
                    us_ranged(&perf),
                    floor / 1e3,
                    floor / perf_median
                )
            } else {
                format!(
                    "perf's added {what} per round ({:.1} us, {:.1} to {:.1}) is not above zero \
                     in every trial, so no ratio is given (rtrace's {}; goal: at most 0.25x)",
                    median(perf.clone()) / 1e3,
                    lo / 1e3,
                    hi / 1e3,
                    us_ranged(&ours)
                )
            }
        };
        let cost = format!("{}; {}", cost("time", wall), cost("CPU", cpu));
        let paired = paired_text(
            &per_trial(Config::Java, whole),
            &per_trial(Config::Fp, whole),
        );
        // NaN (printed so) where no trial measured it.
        let settled_median = |c: Config| {
            let v = measured(c, settled);
            if v.is_empty() { f64::NAN } else { median(v) }
        };
        let (java_settled, fp_settled) = (settled_median(Config::Java), settled_median(Config::Fp));
        let paired_settled = paired_text(
            &per_trial(Config::Java, settled),
            &per_trial(Config::Fp, settled),
        );
        verdicts.push(format!(
            "{hz} Hz: the Java walk takes {:.2}x the frame-pointer walk's BPF time per sample \
             ({:.1} us against {:.1} us{paired}; goal: at most 1.50x); from {} s after each \
             starts sampling, {:.2}x ({:.1} us against {:.1} us{paired_settled}); with \
             {frames:.2} Java frames a sample, {:.0} ns a Java frame, {:.0} ns of it above the \
             frame-pointer walk's time per sample; {cost}",
            java_bpf / fp_bpf.max(1e-9),
            java_bpf / 1e3,
            fp_bpf / 1e3,
            SETTLED.as_secs(),
            java_settled / fp_settled.max(1e-9),
            java_settled / 1e3,
            fp_settled / 1e3,
            java_bpf / frames.max(1e-9),
            (java_bpf - fp_bpf) / frames.max(1e-9),
        ));
    }
    let mut table = format!(
        "{} (two JVMs, Debian's OpenJDK 17, each doing {ROUNDS} rounds of the fixture's work \
         (`Hot rounds`: main -> rounds -> pick -> hot or warm), about {:.1} s bare; every \
         profiler samples the whole system; added time per round over bare (the rows with \
         `-XX:+PreserveFramePointer` over bare with it, and bare with it over bare), the mean of \
         both JVMs' wall-clock time; added CPU per round likewise, the working thread's CPU time \
         (which holds what the sampling interrupts, and the walks in them, took on it); \
         BPF time per sample from the kernel's statistics, from when rtrace samples to its stop; \
         the profiler's own CPU over the work; Java frames a sample: the compiled and \
         interpreted frames the kernel walked, over all samples (inlined methods are named in \
         user space); whole chains: of the samples of the fixtures' working threads, those \
         with `Hot.main` above the launcher's `{LAUNCHER}`, or for the rows without the Java \
         walk (where nothing names the interpreted `Hot.main`) those whose walk reached \
         `{LAUNCHER}` with the {PHYSICAL} frames the Java walk shows above the JVM's call \
         into Java (the call stub, `main` and `rounds` interpreted, `pick` compiled); perf's \
         JVMs write their perf maps (`jcmd PID Compiler.perfmap`) after the work, outside the \
         timed rounds; `perf record -a` without `-g` takes the same samples without their \
         stacks, the floor under any profiler's cost at that rate; medians of {trials} interleaved trials, ranges in parentheses):\n\n",
        measured_on("java"),
        median(bare_s.clone()),
    );
    table.push_str(&rows);
    table.push('\n');
    for v in &verdicts {
        table.push_str(&format!("- {v}.\n"));
    }
    table.push_str(&format!(
        "\nWhat a sample takes from the thread it interrupts, measured by the thread itself: \
         both JVMs (`Hot gaps`: main -> gapsMode -> gaps) read the clock in a loop for {GAP_SECONDS} \
         s, from a second after the profiler samples, and count every gap of 1 us or more \
         between two reads; a sample's time: the gaps under 50 us (an interrupt and what ran \
         in it) added over bare, in nanoseconds, over the gaps added (the samples on the \
         thread), the rows with `-XX:+PreserveFramePointer` over bare with it; waited: the \
         longer gaps (the thread made to wait for another task, as the profiler's own) added \
         a second; medians of {trials} interleaved trials, ranges in parentheses:\n\n{gap_table}\n"
    ));
    for v in &gap_verdicts {
        table.push_str(&format!("- {v}.\n"));
    }
    println!("\n{table}");
    Ok(table)
}

#[cfg(test)]
mod tests {
    use super::{Config, Counts, Gaps, count_folded, count_perf_script, gap_rows};

    #[test]
    fn a_samples_time_is_the_short_gaps_added_over_bare() {
        // Bare: 1000 short gaps of 10 us, and 2 ms waited. Each profiler
        // adds 900 samples; the floor's take 17 us, perf's 19, rtrace's
        // 19.5, the other rows 20.
        let us = |n: f64, each: f64| n * each * 1e3;
        let gaps = |c: Config| {
            let each = match c {
                Config::Bare | Config::BareFp => return (1000.0, us(1000.0, 10.0)),
                Config::PerfNoStacks => 17.0,
                Config::Perf => 19.0,
                Config::Java => 19.5,
                _ => 20.0,
            };
            (1900.0, us(1000.0, 10.0) + us(900.0, each))
        };
        let got: Vec<Vec<Gaps>> = Config::ALL
            .iter()
            .map(|&c| {
                (0..3)
                    .map(|_| Gaps {
                        short_n: gaps(c).0,
                        short_ns: gaps(c).1,
                        long_ns: 2e6 * super::GAP_SECONDS as f64,
                    })
                    .collect()
            })
            .collect();
        let (rows, verdict) = gap_rows(999, &got);
        assert!(
            rows.contains(
                "| 999 Hz | rtrace profile (Java frames) | 19.5 us (19.5 to 19.5) | 300 |"
            ),
            "{rows}"
        );
        assert!(
            verdict.contains("19.5 us, 1.03x perf's with `-g` (19.0 us"),
            "{verdict}"
        );
        assert!(
            verdict.contains("(17.0 us), 2.5 us against perf's 2.0 us"),
            "{verdict}"
        );
        assert!(
            verdict.contains("a quarter of perf's, 4.8 us, is 0.28x that floor"),
            "{verdict}"
        );
        // No sample told from the bare runs' gaps: no figure, no panic.
        let mut none = got;
        for g in &mut none[Config::Perf as usize] {
            g.short_n = 900.0;
        }
        let (rows, verdict) = gap_rows(99, &none);
        assert!(
            rows.contains("| 99 Hz | perf record -g -a, -XX:+PreserveFramePointer | - |"),
            "{rows}"
        );
        assert!(verdict.contains("no sample's time is given"), "{verdict}");
    }

    #[test]
    fn folded_stacks_are_counted() {
        let folded = "\
java;start_thread;ThreadJavaMain;JavaMain;jni_CallStaticVoidMethod;JavaCalls::call_helper(JavaValue*);[StubRoutines (1)]_[j];Hot.main_[p];Hot.rounds_[j];Hot.pick_[i];Hot.hot_[i] 7
java;Hot.rounds_[j];Hot.pick_[i];Hot.warm_[i] 2
java;start_thread;ThreadJavaMain;JavaMain;JavaCalls::call_helper(JavaValue*);[unknown];[unknown];[unknown];[unknown];x_[k] 3
java;start_thread;ThreadJavaMain;JavaMain;JavaCalls::call_helper(JavaValue*);[unknown];[unknown];[unknown];x_[k] 4
C2_CompilerThre;start_thread;[Missed User Stack] 1
";
        assert_eq!(
            count_folded(folded, "java", true),
            Counts {
                samples: 17,
                fixture: 16,
                whole: 7,
                java_frames: 7 * 3 + 2,
                missed: 1,
            }
        );
        // Without the Java walk: the launcher reached with every physical
        // frame above the JVM's call into Java; the last stack skipped one.
        assert_eq!(count_folded(folded, "java", false).whole, 7 + 3);
    }

    #[test]
    fn perf_script_samples_are_counted() {
        let script = "\
java  4242 [000]  1.000:  1010101 cpu-clock:ppp: 
\t    ff00 asm_sysvec_apic_timer_interrupt+0x1a ([kernel.kallsyms])
\t    7f00 int Hot.pick(int, int)+0x20 (/tmp/perf-4242.map)
\t    7f10 Interpreter+0x500 (/tmp/perf-4242.map)
\t    7f10 Interpreter+0x500 (/tmp/perf-4242.map)
\t    7f18 StubRoutines (1)+0x10 (/tmp/perf-4242.map)
\t    7f19 JavaCalls::call_helper(JavaValue*, methodHandle const&)+0x3b (/usr/lib/jvm/java-17-openjdk-amd64/lib/server/libjvm.so)
\t    7f20 JavaMain+0x5b3 (/usr/lib/jvm/java-17-openjdk-amd64/lib/libjli.so)

java  4242 [000]  1.000:  1010101 cpu-clock:ppp: 
\t    7f10 Interpreter+0x500 (/tmp/perf-4242.map)
\t    7f10 Interpreter+0x500 (/tmp/perf-4242.map)
\t    7f18 StubRoutines (1)+0x10 (/tmp/perf-4242.map)
\t    7f19 JavaCalls::call_helper(JavaValue*, methodHandle const&)+0x3b (/usr/lib/jvm/java-17-openjdk-amd64/lib/server/libjvm.so)
\t    7f20 JavaMain+0x5b3 (/usr/lib/jvm/java-17-openjdk-amd64/lib/libjli.so)

java  4242 [001]  1.001:  1010101 cpu-clock:ppp: 
\t    7f00 [unknown] ([unknown])

C2 CompilerThre  4250 [001]  1.002:  1010101 cpu-clock:ppp: 
\t    7f30 JavaMain+0x5b3 (/usr/lib/jvm/java-17-openjdk-amd64/lib/libjli.so)
";
        let (c, named) = count_perf_script(script, "java");
        assert_eq!((c.samples, c.fixture, c.whole, named), (4, 3, 1, 1));
    }
}

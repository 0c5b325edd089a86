//! What several benchmark cases share: the workloads (a ping-pong of two
//! threads, direct I/O on a loop device, any program that reports its own
//! time), and reading what perf and rtrace say they lost.

use std::{
    io::{BufRead, BufReader, Write},
    path::Path,
    process::{Child, ChildStdout, Command, Stdio},
};

use anyhow::{Context as _, bail};

/// Ping-pong round trips per trial: about a second bare.
pub(super) const ROUNDS: u64 = 200_000;

/// Plays one ping-pong game; returns nanoseconds per round trip.
pub(super) fn pingpong(workload: &Path) -> anyhow::Result<(f64, u64)> {
    let mut child = Command::new(workload)
        .args([ROUNDS.to_string(), "0".into()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("cannot start pingpong")?;
    let mut stdin = child.stdin.take().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line)?;
    writeln!(stdin, "go")?;
    line.clear();
    out.read_line(&mut line)?;
    drop(stdin);
    child.wait()?;
    let ns = done_ns(&line).with_context(|| format!("pingpong said {line:?}"))?;
    Ok((ns / ROUNDS as f64, ROUNDS))
}

/// Direct reads per trial of the block I/O cases.
pub(super) const IO_READS: u64 = 15_000;
/// Direct writes per trial of the block I/O cases.
pub(super) const IO_WRITES: u64 = 5_000;

/// One trial of the `directio` workload on `dev`: its cost per I/O, and
/// the I/Os it did.
pub(super) fn direct_io(workload: &Path, dev: &str) -> anyhow::Result<(f64, u64)> {
    let total = IO_READS + IO_WRITES;
    let ns =
        timed(Command::new(workload).args([dev, &IO_READS.to_string(), &IO_WRITES.to_string()]))?;
    Ok((ns / total as f64, total))
}

/// Runs a workload that prints `done NANOSECONDS` last; returns the
/// nanoseconds.
pub(super) fn timed(cmd: &mut Command) -> anyhow::Result<f64> {
    let out = cmd
        .output()
        .with_context(|| format!("cannot start {cmd:?}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    done_ns(&text).with_context(|| format!("{cmd:?} said {text:?}"))
}

/// The time a workload reports in its last line, `done [...] NS`.
fn done_ns(text: &str) -> Option<f64> {
    text.lines()
        .last()?
        .strip_prefix("done ")?
        .split(' ')
        .next_back()?
        .trim()
        .parse()
        .ok()
}

/// Fixture processes that speak the benches' protocol: each prints
/// `ready` once warm, works when it reads a line, prints `done ...`, and
/// exits once its input ends. Killed if dropped before they finish (a
/// trial that failed).
pub(super) struct Fixtures {
    procs: Vec<(Child, BufReader<ChildStdout>)>,
    /// What they are, for errors ("node", "JVM").
    what: &'static str,
}

impl Fixtures {
    /// Starts each of `cmds` (with their input and output piped) and
    /// waits until all are warm: all start at once, a CPU each.
    pub(super) fn start(
        cmds: impl IntoIterator<Item = Command>,
        what: &'static str,
        package: &str,
    ) -> anyhow::Result<Self> {
        let mut me = Self {
            procs: Vec::new(),
            what,
        };
        for mut cmd in cmds {
            let mut child = cmd
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .with_context(|| format!("cannot run the {what} (Debian package {package})"))?;
            let out = BufReader::new(child.stdout.take().context("stdout")?);
            me.procs.push((child, out));
        }
        for (_, out) in &mut me.procs {
            let line = next_line(out)?;
            if !line.starts_with("ready") {
                bail!("the fixture {what} said {line:?}");
            }
        }
        Ok(me)
    }

    /// Lets all work; returns each one's `done` line.
    pub(super) fn work(&mut self) -> anyhow::Result<Vec<String>> {
        for (c, _) in &mut self.procs {
            writeln!(c.stdin.as_mut().context("stdin")?, "go")?;
        }
        self.procs
            .iter_mut()
            .map(|(_, out)| next_line(out))
            .collect()
    }

    /// Lets all work, each saying `done CPU_NS WALL_NS`; returns the
    /// mean of their wall-clock and CPU nanoseconds.
    pub(super) fn work_timed(&mut self) -> anyhow::Result<(f64, f64)> {
        let (mut wall, mut cpu) = (0.0, 0.0);
        for line in self.work()? {
            let said = || format!("the fixture {} said {line:?}", self.what);
            wall += done_ns(&line).with_context(said)?;
            cpu += line
                .split_whitespace()
                .nth(1)
                .and_then(|n| n.parse::<f64>().ok())
                .with_context(said)?;
        }
        let n = self.len() as f64;
        Ok((wall / n, cpu / n))
    }

    /// Their processes.
    pub(super) fn children(&self) -> impl Iterator<Item = &Child> {
        self.procs.iter().map(|(c, _)| c)
    }

    /// Their process ids.
    pub(super) fn pids(&self) -> Vec<u32> {
        self.children().map(Child::id).collect()
    }

    /// How many there are.
    pub(super) fn len(&self) -> usize {
        self.procs.len()
    }

    /// Ends their input, which they wait for after the work, and waits
    /// for them to exit.
    pub(super) fn finish(mut self) -> anyhow::Result<()> {
        for (c, _) in &mut self.procs {
            drop(c.stdin.take());
        }
        for (mut c, _) in std::mem::take(&mut self.procs) {
            let status = c.wait()?;
            if !status.success() {
                bail!("a fixture {} exited with {status}", self.what);
            }
        }
        Ok(())
    }
}

impl Drop for Fixtures {
    fn drop(&mut self) {
        for (c, _) in &mut self.procs {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The next line of a fixture's stdout.
fn next_line(out: &mut BufReader<ChildStdout>) -> anyhow::Result<String> {
    let mut line = String::new();
    out.read_line(&mut line)?;
    Ok(line)
}

/// A frame's name without its kind's mark (`-a`: `_[j]`, `_[p]`, `_[i]`,
/// `_[k]`).
pub(super) fn unmarked(f: &str) -> &str {
    match f.rfind("_[") {
        Some(i) if f.ends_with(']') => &f[..i],
        _ => f,
    }
}

/// A loop device over a file in `target/bench`, detached on drop.
pub(super) struct Loop(pub(super) String);

impl Loop {
    pub(super) fn new() -> anyhow::Result<Self> {
        let dir = crate::root().join("target/bench");
        std::fs::create_dir_all(&dir)?;
        let file = dir.join("loop.img");
        std::fs::File::create(&file)?.set_len(64 << 20)?;
        let out = Command::new("losetup")
            .args(["--find", "--show"])
            .arg(&file)
            .output()
            .context("cannot run losetup (Debian package util-linux)")?;
        if !out.status.success() {
            bail!(
                "losetup failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(Self(String::from_utf8_lossy(&out.stdout).trim().to_owned()))
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.0]).status();
    }
}

/// Seconds `f` took.
pub(super) fn seconds(f: impl FnOnce() -> anyhow::Result<()>) -> anyhow::Result<f64> {
    let t = std::time::Instant::now();
    f()?;
    Ok(t.elapsed().as_secs_f64())
}

/// `perf record`'s arguments for DWARF call graphs of the whole machine
/// at `hz`, into `data`.
pub(super) fn perf_dwarf<'a>(hz: &'a str, data: &'a str) -> [&'a str; 9] {
    [
        "record",
        "-q",
        "--call-graph",
        "dwarf",
        "-a",
        "-F",
        hz,
        "-o",
        data,
    ]
}

/// Samples perf lost, from its own statistics of `data`.
pub(super) fn perf_lost(data: &str) -> u64 {
    let Ok(out) = Command::new("perf")
        .args(["report", "--stats", "-i", data])
        .stderr(Stdio::null())
        .output()
    else {
        return 0;
    };
    sum_after_colon(&String::from_utf8_lossy(&out.stdout), "LOST")
}

/// The sum of the numbers that follow the first `:` of each line of
/// `text` containing `marker` (perf's `LOST_SAMPLES events: 3`, a
/// histogram's `lo -> hi : count`).
pub(super) fn sum_after_colon(text: &str, marker: &str) -> u64 {
    text.lines()
        .filter(|l| l.contains(marker))
        .filter_map(|l| {
            l.split(':')
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// Samples rtrace lost or could not give a stack: its warnings' counts of
/// stacks lost or walked by frame pointer for want of tables.
pub(super) fn rtrace_lost(stderr: &str) -> u64 {
    stderr
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("rtrace: warning")?;
            // `warning[lost]: N ...` since warnings carry their kind; the
            // older `warning: N ... lost` too.
            let text = match rest.strip_prefix("[lost]:") {
                Some(t) => t,
                None => rest.strip_prefix(':').filter(|t| t.contains("lost"))?,
            };
            text.split_whitespace().next()?.parse::<u64>().ok()
        })
        .sum()
}

/// Interleaved trials per configuration of the cases that count their
/// own: `RTRACE_BENCH_TRIALS`, or `default`.
pub(super) fn trials_from_env(default: usize) -> usize {
    std::env::var("RTRACE_BENCH_TRIALS")
        .ok()
        .and_then(|n| n.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(default)
}

/// Nanoseconds `v`, as a table cell in microseconds: the median, then the
/// range (`1.2 us (0.9 to 1.5)`).
pub(super) fn us_ranged(v: &[f64]) -> String {
    let (lo, hi) = super::spread(v);
    format!(
        "{:.1} us ({:.1} to {:.1})",
        super::median(v.to_vec()) / 1e3,
        lo / 1e3,
        hi / 1e3
    )
}

/// A cgroup (v2) of its own for a profiler, whose CPU time it keeps to
/// the microsecond, every thread's, those ended too (a sum over
/// `/proc/PID/task` loses ended threads, and `/proc/PID/stat` counts in
/// ticks of 10 ms). Removed on drop.
pub(super) struct CpuGroup {
    dir: std::path::PathBuf,
}

impl CpuGroup {
    /// A group of the profiler `pid` (a process, all its threads) alone:
    /// a trial's, dropped once the profiler has exited.
    pub(super) fn of_profiler(pid: u32) -> anyhow::Result<Self> {
        let group = Self::new("rtrace-bench-profiler")?;
        group.add(pid)?;
        Ok(group)
    }

    /// A new group named `name` under the cgroup2 hierarchy's root.
    fn new(name: &str) -> anyhow::Result<Self> {
        let mounts = std::fs::read_to_string("/proc/mounts")?;
        let root = mounts
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .find(|f| f.get(2) == Some(&"cgroup2"))
            .and_then(|f| f.get(1).map(|m| std::path::PathBuf::from(*m)))
            .context("no cgroup2 hierarchy is mounted")?;
        let dir = root.join(name);
        let _ = std::fs::remove_dir(&dir);
        std::fs::create_dir(&dir).with_context(|| format!("cannot make {}", dir.display()))?;
        Ok(Self { dir })
    }

    /// Moves process `pid`, all its threads, into the group.
    fn add(&self, pid: u32) -> anyhow::Result<()> {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string())
            .with_context(|| format!("cannot move {pid} into {}", self.dir.display()))
    }

    /// The group's CPU time so far, in nanoseconds.
    pub(super) fn cpu_ns(&self) -> Option<f64> {
        let stat = std::fs::read_to_string(self.dir.join("cpu.stat")).ok()?;
        let usec: f64 = stat
            .lines()
            .find_map(|l| l.strip_prefix("usage_usec "))?
            .trim()
            .parse()
            .ok()?;
        Some(usec * 1e3)
    }
}

impl Drop for CpuGroup {
    fn drop(&mut self) {
        // Its processes have exited by now; one still there keeps the
        // group, which the next run's `new` tries to remove first.
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// `v` resampled with replacement (a bootstrap), from `state`, a
/// xorshift generator's state: a run resamples from a fixed seed, so
/// that its bounds are the same for the same trials.
pub(super) fn resample(v: &[f64], state: &mut u64) -> Vec<f64> {
    (0..v.len())
        .map(|_| {
            *state ^= *state << 13;
            *state ^= *state >> 7;
            *state ^= *state << 17;
            v[(*state % v.len() as u64) as usize]
        })
        .collect()
}

/// The value `share` of the way up `v` once sorted (nearest rank).
pub(super) fn percentile(v: &[f64], share: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let i = ((v.len() as f64 * share).ceil() as usize).clamp(1, v.len().max(1)) - 1;
    v.get(i).copied().unwrap_or(f64::NAN)
}

/// BPF nanoseconds per sample, one a trial, as a table cell: the median
/// in microseconds and the range in nanoseconds, `-` for a profiler
/// that runs no BPF.
pub(super) fn bpf_cell(v: &[f64]) -> String {
    if v.is_empty() {
        return "-".to_owned();
    }
    let (l, h) = super::spread(v);
    format!(
        "{:.1} us ({l:.0}-{h:.0} ns)",
        super::median(v.to_vec()) / 1e3
    )
}

/// `a / b` trial by trial, for two configurations run in the same
/// interleaved trials (`a[n]` and `b[n]` one after the other, so the
/// machine's drift between trials, often wider than the difference
/// judged, cancels in each pair), over the trials that measured both:
/// the median and the range, `None` where no trial measured both.
pub(super) fn paired_ratio(a: &[Option<f64>], b: &[Option<f64>]) -> Option<(f64, f64, f64)> {
    let ratios: Vec<f64> = a
        .iter()
        .zip(b)
        .filter_map(|(&a, &b)| Some(a? / b.filter(|&b| b > 0.0)?))
        .collect();
    if ratios.is_empty() {
        return None;
    }
    let (lo, hi) = super::spread(&ratios);
    Some((super::median(ratios), lo, hi))
}

/// [`paired_ratio`] as the verdicts print it after the ratio of the
/// medians: `; trial by trial 1.31x (1.12 to 1.55)`, empty where there is
/// none.
pub(super) fn paired_text(a: &[Option<f64>], b: &[Option<f64>]) -> String {
    paired_ratio(a, b)
        .map(|(m, lo, hi)| format!("; trial by trial {m:.2}x ({lo:.2} to {hi:.2})"))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resamples_draw_from_the_values_and_percentiles_take_the_nearest_rank() {
        let mut state = 0x9e37_79b9_7f4a_7c15;
        let v = [1.0, 2.0, 3.0];
        let draws: Vec<f64> = (0..100).flat_map(|_| resample(&v, &mut state)).collect();
        assert!(draws.iter().all(|d| v.contains(d)));
        assert!(v.iter().all(|x| draws.contains(x)), "every value drawn");
        assert_eq!(percentile(&[5.0, 1.0, 4.0, 2.0, 3.0], 0.9), 5.0);
        assert_eq!(percentile(&[5.0, 1.0, 4.0, 2.0, 3.0], 0.5), 3.0);
    }

    #[test]
    fn paired_ratios_are_taken_within_each_trial() {
        // The machine's pace moved twofold over the trials; each trial's
        // own ratio is 1.2x, and a trial that measured one side alone
        // is left out.
        let a = [Some(2.4), Some(3.6), Some(4.8), None];
        let b = [Some(2.0), Some(3.0), Some(4.0), Some(1.0)];
        let (m, lo, hi) = paired_ratio(&a, &b).unwrap();
        assert!((m - 1.2).abs() < 1e-9 && (lo - 1.2).abs() < 1e-9 && (hi - 1.2).abs() < 1e-9);
        assert_eq!(paired_ratio(&[None], &[Some(1.0)]), None);
        assert_eq!(paired_text(&a[..1], &[Some(0.0)]), "");
    }
}

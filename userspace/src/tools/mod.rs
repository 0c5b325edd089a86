//! The tools: one module each, and one line each in [`Command`] and [`run`].

pub mod argdist;
pub mod biolatency;
pub mod execsnoop;
pub mod ext4slower;
pub mod flamegraph;
pub mod gethostlatency;
pub mod profile;
pub mod runqlat;
pub mod tcplife;

use crate::GlobalArgs;

/// The subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Show what this kernel supports and which attach mechanisms work.
    Doctor,
    /// Summarize run queue (scheduler) latency as a histogram.
    Runqlat(runqlat::Args),
    /// Trace exec() syscalls (execve and execveat).
    Execsnoop(execsnoop::Args),
    /// Trace the lifespan of TCP sessions and summarize.
    Tcplife(tcplife::Args),
    /// Trace ext4 reads, writes, opens and syncs slower than a threshold.
    Ext4slower(ext4slower::Args),
    /// Show latency of host name lookups (getaddrinfo, gethostbyname[2]).
    Gethostlatency(gethostlatency::Args),
    /// Histograms and counts of function arguments, return values,
    /// latencies and tracepoint fields.
    Argdist(argdist::Args),
    /// Summarize block device I/O latency as a histogram.
    Biolatency(biolatency::Args),
    /// Profile CPU usage by sampling stack traces, with flame graphs.
    Profile(profile::Args),
    /// Draw flame graphs from folded stacks (differential: `diff`).
    Flamegraph(flamegraph::Args),
}

/// Runs one subcommand.
pub async fn run(command: Command, global: &GlobalArgs) -> anyhow::Result<()> {
    match command {
        Command::Doctor => crate::doctor::run(global),
        Command::Runqlat(args) => runqlat::run(args, global).await,
        Command::Execsnoop(args) => execsnoop::run(args, global).await,
        Command::Tcplife(args) => tcplife::run(args, global).await,
        Command::Ext4slower(args) => ext4slower::run(args, global).await,
        Command::Gethostlatency(args) => gethostlatency::run(args, global).await,
        Command::Argdist(args) => argdist::run(args, global).await,
        Command::Biolatency(args) => biolatency::run(args, global).await,
        Command::Profile(args) => profile::run(args, global).await,
        Command::Flamegraph(args) => flamegraph::run(args),
    }
}

/// Fails with a clear message unless `pid` names a live process.
pub fn check_pid(pid: u32) -> anyhow::Result<()> {
    check_task(pid, "process")
}

/// Fails with a clear message unless `tid` names a live thread.
pub fn check_tid(tid: u32) -> anyhow::Result<()> {
    check_task(tid, "thread")
}

/// `/proc/ID` exists for threads as well as processes, though only
/// process ids are listed.
fn check_task(id: u32, what: &str) -> anyhow::Result<()> {
    if id == 0 || !std::path::Path::new(&format!("/proc/{id}")).exists() {
        anyhow::bail!("no such {what}: {id}");
    }
    Ok(())
}

/// Entries for a preallocated table of runnable tasks.
///
/// Only runnable tasks sit in it, so it needs no more than the number of
/// threads; four times today's count (at least 65536, at most `pid_max`)
/// leaves room to grow at a few megabytes, where `pid_max` entries could
/// cost hundreds. Inserts that still fail are counted and reported.
pub fn runnable_entries() -> u32 {
    let threads: u32 = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().nth(3)?.split('/').nth(1)?.parse().ok())
        .unwrap_or(0);
    threads.saturating_mul(4).max(65_536).min(pid_max())
}

/// The kernel's `pid_max`: tables keyed by thread id sized to it can never
/// fill up, unlike libbpf-tools' fixed 10240 entries.
pub fn pid_max() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(4_194_304)
}

/// The kernfs id of a cgroup v2 directory, which is its inode number.
pub fn cgroup_id(path: &std::path::Path) -> anyhow::Result<u64> {
    use std::os::unix::fs::MetadataExt as _;
    const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
    let meta = std::fs::metadata(path)
        .map_err(|e| anyhow::anyhow!("cannot use cgroup {}: {e}", path.display()))?;
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())?;
    // SAFETY: `c` is a valid path and `st` a valid out-pointer.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 || st.f_type as i64 != CGROUP2_SUPER_MAGIC
    {
        anyhow::bail!("{} is not a cgroup v2 directory", path.display());
    }
    Ok(meta.ino())
}

/// Opens the cgroup v2 directory of a `-c` option, if there is one, for
/// [`set_cgroup`]: its checks run before any privilege check.
pub fn open_cgroup(path: Option<&std::path::Path>) -> anyhow::Result<Option<std::fs::File>> {
    use anyhow::Context as _;
    path.map(|p| {
        cgroup_id(p)?;
        std::fs::File::open(p).with_context(|| format!("cannot open cgroup {}", p.display()))
    })
    .transpose()
}

/// Points an object's `CGROUP` array, which its programs test the current
/// task against, at `cgroup`.
pub fn set_cgroup(ebpf: &mut aya::Ebpf, cgroup: &std::fs::File) -> anyhow::Result<()> {
    use anyhow::Context as _;
    use std::os::fd::AsRawFd as _;
    let mut map: aya::maps::CgroupArray<_> = ebpf
        .map_mut("CGROUP")
        .context("map CGROUP missing")?
        .try_into()?;
    map.set(0, cgroup.as_raw_fd(), 0)
        .context("cannot set the cgroup filter")
}

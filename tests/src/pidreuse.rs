//! Helpers of the pid-reuse tests (`tests/tests/pidreuse.rs`): a program
//! started on the pid another program had once that one has exited (by
//! `/proc/sys/kernel/ns_last_pid`), programs run under a command name of
//! the test's own and without address randomisation, what each cost
//! measured before it is reaped, and shares judged within standard
//! deviations.

use std::{
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::{Mutex, MutexGuard, PoisonError},
};

/// The last pid the kernel handed out in this pid namespace: the next
/// fork takes the first free pid after it.
pub const NS_LAST_PID: &str = "/proc/sys/kernel/ns_last_pid";

/// How often [`spawn_on_pid`] tries: another process of the machine that
/// forks between the write and the spawn takes the pid meant for ours.
pub const ATTEMPTS: usize = 50;

static SERIAL: Mutex<()> = Mutex::new(());

/// The test binary's lock, held for a whole test: pids are forced by
/// writing what the next fork gets, so no other test of the binary may
/// fork meanwhile, and a system-wide profile must see no other test's
/// programs, which are the same programs.
pub struct Serial {
    _guard: MutexGuard<'static, ()>,
}

/// Takes the test binary's lock; a test that failed holding it leaves it
/// usable.
pub fn serial() -> Serial {
    Serial {
        _guard: SERIAL.lock().unwrap_or_else(PoisonError::into_inner),
    }
}

/// Spawns `cmd` as process `pid`, which must be free: writes `pid - 1` to
/// [`NS_LAST_PID`] and spawns (one fork: the command must be the program
/// itself, not a shell that starts it); a child that got another pid,
/// because something else on the machine forked in between, is killed
/// and the next attempt made. The error names every pid the attempts got.
pub fn spawn_on_pid(_serial: &Serial, cmd: &mut Command, pid: u32) -> Result<Child, String> {
    if Path::new(&format!("/proc/{pid}")).exists() {
        return Err(format!(
            "pid {pid} is taken by another process: cannot start {cmd:?} on it"
        ));
    }
    let mut got = Vec::new();
    for _ in 0..ATTEMPTS {
        std::fs::write(NS_LAST_PID, (pid - 1).to_string())
            .map_err(|e| format!("cannot write {NS_LAST_PID}: {e}"))?;
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {cmd:?}: {e}"))?;
        if child.id() == pid {
            if got.len() > 2 {
                eprintln!(
                    "{cmd:?} got pid {pid} at attempt {}; before, {got:?}",
                    got.len() + 1
                );
            }
            return Ok(child);
        }
        got.push(child.id());
        let _ = child.kill();
        let _ = child.wait();
    }
    Err(format!(
        "cannot start {cmd:?} on pid {pid}: {ATTEMPTS} attempts got pids {got:?} \
         (other processes forked between writing {NS_LAST_PID} and the spawn)"
    ))
}

/// A directory of symbolic links, removed on drop, through which programs
/// run under a command name of the test's own (the kernel names a process
/// after the file its exec was given, not the link's target), so that a
/// system-wide profile tells them from other processes of the machine.
pub struct Names {
    dir: PathBuf,
}

impl Names {
    /// A fresh directory for test `tag`.
    pub fn new(tag: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("rtrace-pidreuse-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self { dir }
    }

    /// A command that runs `program` (an absolute path) as `comm` (at
    /// most 15 bytes, the kernel's limit), without address randomisation
    /// (as `setarch -R`, in the child, with no process in between): two
    /// programs of one layout then put their code, JIT-compiled code and
    /// heap at the same addresses, so that names lent from one process to
    /// the other would fit its addresses rather than be left unmatched.
    /// Its stdout and stderr are piped: the programs print a line or two.
    pub fn command(&self, program: &str, comm: &str) -> Command {
        assert!(comm.len() <= 15, "{comm} is longer than a comm");
        let link = self.dir.join(comm);
        if !link.exists() {
            std::os::unix::fs::symlink(program, &link).unwrap();
        }
        let mut cmd = Command::new(&link);
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // SAFETY: personality(2) is a system call, safe between fork and
        // exec.
        unsafe {
            cmd.pre_exec(|| {
                let current = libc::personality(0xffff_ffff);
                if current == -1
                    || libc::personality(
                        current as libc::c_ulong | libc::ADDR_NO_RANDOMIZE as libc::c_ulong,
                    ) == -1
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        cmd
    }
}

impl Drop for Names {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A program that ran to its end, with what its process cost, read from
/// /proc before it was reaped.
#[derive(Debug)]
pub struct Finished {
    /// Its process id.
    pub pid: u32,
    /// How it ended.
    pub status: ExitStatus,
    /// What it printed.
    pub stdout: String,
    /// What it printed on stderr.
    pub stderr: String,
    /// The CPU time of the whole process, all its threads, in
    /// nanoseconds (utime and stime of /proc/PID/stat, in clock ticks).
    pub cpu_ns: f64,
    /// When it started, in clock ticks after boot (/proc/PID/stat's
    /// field 22, the kernel's `start_time`).
    pub start_ticks: u64,
}

impl Finished {
    /// The `split hot=NS warm=NS` line the fixtures print: the
    /// nanoseconds they measured in their two functions.
    pub fn split(&self) -> (f64, f64) {
        let line = self
            .stdout
            .lines()
            .find_map(|l| l.strip_prefix("split "))
            .unwrap_or_else(|| {
                panic!(
                    "pid {} printed no split: {}\n{}",
                    self.pid, self.stdout, self.stderr
                )
            });
        let ns = |key: &str| -> f64 {
            line.split_whitespace()
                .find_map(|kv| kv.strip_prefix(key))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no {key} in {line:?}"))
        };
        (ns("hot="), ns("warm="))
    }

    /// The share of its first function in the split it measured.
    pub fn hot_share(&self) -> f64 {
        let (hot, warm) = self.split();
        hot / (hot + warm)
    }
}

/// Waits for `child` to exit, reads its CPU time and start time while it
/// is a zombie (waitid's `WNOWAIT` leaves it so), then reaps it; its pid
/// is free when this returns. Panics if it failed.
pub fn finish(child: Child) -> Finished {
    let pid = child.id();
    // SAFETY: an all-zero siginfo_t is valid, and waitid writes it.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: a pid of our own child and a valid out pointer.
    let rc = unsafe { libc::waitid(libc::P_PID, pid, &mut info, libc::WEXITED | libc::WNOWAIT) };
    assert_eq!(rc, 0, "waitid {pid}: {}", std::io::Error::last_os_error());
    let (cpu_ns, start_ticks) = cpu_and_start(pid);
    let out = child.wait_with_output().unwrap();
    let finished = Finished {
        pid,
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        cpu_ns,
        start_ticks,
    };
    assert!(
        finished.status.success(),
        "pid {pid} failed ({}): {}\n{}",
        finished.status,
        finished.stdout,
        finished.stderr
    );
    finished
}

/// Whether our child `pid` has exited (not yet reaped).
pub fn has_exited(pid: u32) -> bool {
    // SAFETY: as in finish; WNOHANG returns at once, with si_pid 0 while
    // the child runs.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    let rc = unsafe {
        libc::waitid(
            libc::P_PID,
            pid,
            &mut info,
            libc::WEXITED | libc::WNOWAIT | libc::WNOHANG,
        )
    };
    // SAFETY: waitid filled the union's child fields, or left them zero.
    rc == 0 && unsafe { info.si_pid() } == pid as i32
}

/// The CPU time of process `pid` in nanoseconds and its start time in
/// clock ticks after boot, from /proc/PID/stat.
pub fn cpu_and_start(pid: u32) -> (f64, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/stat: {e}"));
    // The command, in parentheses, may hold spaces: the fields after its
    // last `)` start at field 3 (state).
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    let field = |n: usize| -> u64 { f[n - 3].parse().unwrap() };
    // SAFETY: sysconf has no preconditions.
    let tick = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let cpu = (field(14) + field(15)) as f64 * 1e9 / tick;
    (cpu, field(22))
}

/// CLOCK_MONOTONIC now, in seconds: the clock `perf record -k
/// CLOCK_MONOTONIC` stamps samples with.
pub fn monotonic_secs() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// Whether `a` of `a + b` samples is share `want` within `sds` binomial
/// standard deviations of a share of that many samples; the error says
/// what was seen.
pub fn share_within(what: &str, a: u64, b: u64, want: f64, sds: f64) -> Result<(), String> {
    let n = (a + b) as f64;
    if n == 0.0 {
        return Err(format!("{what}: no samples at all"));
    }
    let got = a as f64 / n;
    let sd = (want * (1.0 - want) / n).sqrt();
    if (got - want).abs() <= sds * sd {
        return Ok(());
    }
    Err(format!(
        "{what}: {got:.3} of {n} samples ({a} and {b}), measured {want:.3}; {sds} sd is {:.3}",
        sds * sd
    ))
}

/// Asserts [`share_within`].
pub fn assert_share_within(what: &str, a: u64, b: u64, want: f64, sds: f64) {
    if let Err(e) = share_within(what, a, b, want, sds) {
        panic!("{e}");
    }
}

/// Files removed on drop, passed or failed: perf maps, profiles, pages.
#[derive(Default)]
pub struct Cleanup(pub Vec<PathBuf>);

impl Cleanup {
    /// Adds a file; returns its path.
    pub fn add(&mut self, path: impl Into<PathBuf>) -> PathBuf {
        let path = path.into();
        self.0.push(path.clone());
        path
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

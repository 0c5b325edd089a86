//! Helpers for tests that run the real `rtrace` binary, as root, against the
//! real kernel, with real workloads.

use std::{
    io::{BufRead, BufReader, Read, Write},
    path::PathBuf,
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

pub mod browser;
pub mod pidreuse;
pub mod profile;

/// The rtrace binary under test: `RTRACE_BIN`, or the workspace's release build.
pub fn rtrace_bin() -> PathBuf {
    std::env::var_os("RTRACE_BIN").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/release/rtrace"),
        PathBuf::from,
    )
}

/// A workload binary of this crate: test executables live in
/// `target/<profile>/deps`, and the crate's binaries one level up.
pub fn workload_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let path = exe.parent().and_then(|d| d.parent()).unwrap().join(name);
    assert!(
        path.exists(),
        "workload {} missing; build this crate's binaries",
        path.display()
    );
    path
}

/// Runs workload `name` with `args` to the end; returns its stdout, and
/// fails the test with its stderr if it fails.
pub fn run_workload(name: &str, args: &[String]) -> String {
    let out = Command::new(workload_bin(name))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{name} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A running rtrace whose stderr is collected line by line.
pub struct Rtrace {
    child: Child,
    stderr: mpsc::Receiver<String>,
    /// Every stderr line seen so far.
    pub stderr_lines: Vec<String>,
}

impl Rtrace {
    /// Starts `rtrace ARGS` and waits until it says it is tracing.
    pub fn start(args: &[&str]) -> Self {
        Self::start_until(args, "Tracing")
    }

    /// Starts `rtrace ARGS` and waits for a stderr line containing `ready`.
    pub fn start_until(args: &[&str], ready: &str) -> Self {
        Self::start_with_env(args, ready, &[])
    }

    /// [`Rtrace::start_until`] with environment variables `env` set.
    pub fn start_with_env(args: &[&str], ready: &str, env: &[(&str, &str)]) -> Self {
        let mut cmd = Command::new(rtrace_bin());
        cmd.args(args).envs(env.iter().copied());
        Self::start_command(cmd, ready)
    }

    /// Starts `cmd`, an rtrace command line made by the caller (run
    /// through `setpriv`, say), and waits until it prints `ready`.
    pub fn start_command(mut cmd: Command, ready: &str) -> Self {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("cannot start rtrace; build it first (cargo xtask test does)");
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut me = Self {
            child,
            stderr: rx,
            stderr_lines: Vec::new(),
        };
        me.wait_stderr(ready);
        me
    }

    /// Waits for a stderr line containing `needle`.
    pub fn wait_stderr(&mut self, needle: &str) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            match self.stderr.recv_timeout(Duration::from_millis(100)) {
                Ok(line) => {
                    let hit = line.contains(needle);
                    self.stderr_lines.push(line);
                    if hit {
                        return;
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if let Ok(Some(status)) = self.child.try_wait() {
                        panic!(
                            "rtrace exited ({status}) before printing {needle:?}: {:?}",
                            self.stderr_lines
                        );
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        panic!(
            "rtrace never printed {needle:?}; stderr: {:?}",
            self.stderr_lines
        );
    }

    /// The process id of rtrace.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal`, waits for exit, and returns (exit code, stdout, stderr).
    pub fn stop(self, signal: i32) -> (i32, String, String) {
        // SAFETY: kill with a valid pid and signal number.
        unsafe { libc::kill(self.child.id() as i32, signal) };
        self.wait()
    }

    /// Waits for rtrace to exit on its own; returns (exit code, stdout, stderr).
    pub fn wait(mut self) -> (i32, String, String) {
        let mut stdout = Vec::new();
        if let Some(mut out) = self.child.stdout.take() {
            out.read_to_end(&mut stdout).unwrap();
        }
        let status = self.child.wait().unwrap();
        self.stderr_lines.extend(self.stderr.iter());
        (
            status.code().unwrap_or(-1),
            String::from_utf8_lossy(&stdout).into_owned(),
            std::mem::take(&mut self.stderr_lines).join("\n"),
        )
    }
}

/// A test that fails while rtrace runs must not leave it running (its
/// programs attached) under the tests after it.
impl Drop for Rtrace {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Runs `rtrace ARGS` to completion: (exit code, stdout, stderr).
pub fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(rtrace_bin())
        .args(args)
        .output()
        .expect("cannot run rtrace");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A workload that prints `ready`, waits for a line on stdin, does its
/// work and prints `done ...`.
pub struct Workload {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl Workload {
    /// Starts workload `name` with `args`; returns it and the first line it
    /// printed.
    pub fn start(name: &str, args: &[String]) -> (Self, String) {
        let mut cmd = Command::new(workload_bin(name));
        cmd.args(args);
        Self::start_command(cmd)
    }

    /// Starts a workload run by `cmd` (an interpreter and its script),
    /// which speaks as the fixtures do; returns it and its first line.
    pub fn start_command(mut cmd: Command) -> (Self, String) {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let me = Self {
            child,
            stdin,
            stdout,
        };
        (me, line)
    }

    /// The workload's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Lets it work; returns what its `done` line says after `done`.
    pub fn go(&mut self) -> String {
        writeln!(self.stdin.as_mut().unwrap(), "go").unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        line.strip_prefix("done")
            .unwrap_or_else(|| panic!("no done line: {line:?}"))
            .trim()
            .to_owned()
    }

    /// Waits until it sleeps in read(2) (x86-64's syscall 0), as
    /// `/proc/PID/syscall` says: a fixture that has printed its `done`
    /// line has then blocked for its next one, so a tracer stopped after
    /// this has seen that block.
    pub fn wait_in_read(&self) {
        let path = format!("/proc/{}/syscall", self.pid());
        for _ in 0..1000 {
            let now = std::fs::read_to_string(&path).unwrap_or_default();
            if now.split_whitespace().next() == Some("0") {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        panic!("{} never waited in read(2)", self.pid());
    }

    /// Closes its stdin and waits for it to exit.
    pub fn wait(&mut self) -> std::process::ExitStatus {
        drop(self.stdin.take());
        self.child.wait().unwrap()
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        self.wait();
    }
}

/// The ping-pong workload: two threads on one CPU, `rounds` round trips.
pub struct PingPong {
    work: Workload,
}

impl PingPong {
    /// Starts the workload; it waits for [`PingPong::play`].
    pub fn start(rounds: u64) -> Self {
        let (work, line) = Workload::start("pingpong", &[rounds.to_string(), "0".to_owned()]);
        assert_eq!(line.trim(), "ready");
        Self { work }
    }

    /// The workload's process id.
    pub fn pid(&self) -> u32 {
        self.work.pid()
    }

    /// Plays all rounds and returns once every thread is asleep again.
    pub fn play(&mut self) {
        self.work.go();
        // Let the threads reach their final sleep.
        std::thread::sleep(Duration::from_millis(300));
    }

    /// Context switches of all threads so far, from `/proc/PID/task/*/status`.
    pub fn context_switches(&self) -> u64 {
        let mut total = 0;
        for task in std::fs::read_dir(format!("/proc/{}/task", self.pid())).unwrap() {
            let status = std::fs::read_to_string(task.unwrap().path().join("status")).unwrap();
            for line in status.lines() {
                if let Some(v) = line
                    .strip_prefix("voluntary_ctxt_switches:")
                    .or_else(|| line.strip_prefix("nonvoluntary_ctxt_switches:"))
                {
                    total += v.trim().parse::<u64>().unwrap();
                }
            }
        }
        total
    }
}

/// Parses every stdout line as JSON.
pub fn json_lines(stdout: &str) -> Vec<serde_json::Value> {
    stdout
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

/// A histogram report's layout, to compare with libbpf-tools': each line as what it is, with names, counts and
/// times taken out, and each table's rows as one.
pub fn text_layout(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for line in text.lines() {
        let shape = if line.is_empty() {
            "blank".to_owned()
        } else if line.len() == 8 && line.as_bytes()[2] == b':' && line.as_bytes()[5] == b':' {
            "time".to_owned()
        } else if line.contains(" -> ") && line.contains('|') {
            "rows".to_owned()
        } else if let Some(rest) = line.strip_prefix("disk = ") {
            let flags = rest.split_once('\t').map(|(_, f)| f);
            match flags {
                Some("") => "disk = D\\t".to_owned(),
                Some(f) if f.starts_with("flags = ") => "disk = D\\tflags = F".to_owned(),
                _ => format!("disk = D{}", rest.len()),
            }
        } else if line.starts_with("flags = ") {
            "flags = F".to_owned()
        } else if line.starts_with("Tracing") {
            continue;
        } else {
            line.to_owned()
        };
        if shape == "rows" && out.last().is_some_and(|l| l == "rows") {
            continue;
        }
        out.push(shape);
    }
    out
}

/// Sums the counts of a text histogram in libbpf-tools' layout.
pub fn text_hist_total(text: &str) -> u64 {
    text.lines()
        .filter(|l| l.contains(" -> ") && l.contains('|'))
        .map(|l| {
            let count = l.split(':').nth(1).unwrap().split('|').next().unwrap();
            count.trim().parse::<u64>().unwrap()
        })
        .sum()
}

/// SIGINT.
pub const SIGINT: i32 = libc::SIGINT;
/// SIGTERM.
pub const SIGTERM: i32 = libc::SIGTERM;
/// SIGHUP.
pub const SIGHUP: i32 = libc::SIGHUP;

/// A fresh cgroup v2 directory, removed on drop: under the hybrid
/// hierarchy's `unified` mount where there is one (this host), else under
/// the cgroup2 root (the VM guests).
pub struct TestCgroup {
    /// The directory.
    pub path: String,
}

impl TestCgroup {
    /// Creates `rtrace-<tag>-<pid>`.
    pub fn new(tag: &str) -> Self {
        let root = if std::path::Path::new("/sys/fs/cgroup/unified").is_dir() {
            "/sys/fs/cgroup/unified"
        } else {
            "/sys/fs/cgroup"
        };
        let path = format!("{root}/rtrace-{tag}-{}", std::process::id());
        std::fs::create_dir(&path).unwrap();
        Self { path }
    }

    /// Moves process `pid` into the cgroup.
    pub fn add(&self, pid: u32) {
        std::fs::write(format!("{}/cgroup.procs", self.path), pid.to_string()).unwrap();
    }
}

/// A shell that joins cgroup directory `dir` and then execs `program`
/// with `args`: the program's own exec is the first thing the cgroup sees.
pub fn in_cgroup(dir: &str, program: impl AsRef<std::ffi::OsStr>, args: &[&str]) -> Command {
    let mut cmd = Command::new("sh");
    cmd.args(["-c", "echo 0 > \"$0/cgroup.procs\" && exec \"$@\"", dir])
        .arg(program)
        .args(args);
    cmd
}

/// A fresh cgroup whose memory, the kernel's own for the BPF maps its
/// members create included, is held to a limit; removed on drop. Under
/// cgroup v2 where the memory controller is there, else under v1's
/// `memory` hierarchy (this host's hybrid mount); `None` where neither is.
pub struct MemoryCgroup {
    /// The directory.
    pub path: String,
}

impl MemoryCgroup {
    /// Creates `rtrace-<tag>-<pid>` with at most `bytes` of memory.
    pub fn new(tag: &str, bytes: u64) -> Option<Self> {
        let v2 = ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
            .into_iter()
            .find(|root| {
                std::fs::read_to_string(format!("{root}/cgroup.subtree_control"))
                    .is_ok_and(|c| c.split_whitespace().any(|c| c == "memory"))
            })
            .map(|root| (root, "memory.max"));
        let v1 = std::path::Path::new("/sys/fs/cgroup/memory/memory.limit_in_bytes")
            .exists()
            .then_some(("/sys/fs/cgroup/memory", "memory.limit_in_bytes"));
        let (root, limit) = v2.or(v1)?;
        let path = format!("{root}/rtrace-{tag}-{}", std::process::id());
        std::fs::create_dir(&path).unwrap();
        std::fs::write(format!("{path}/{limit}"), bytes.to_string()).unwrap();
        Some(Self { path })
    }

    /// `program` with `args`, joined to the cgroup from its first
    /// instruction ([`in_cgroup`]).
    pub fn command(&self, program: &std::path::Path, args: &[&str]) -> Command {
        in_cgroup(&self.path, program, args)
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.path);
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        // Fails while members live; they are the tests' children, gone by now.
        let _ = std::fs::remove_dir(&self.path);
    }
}

/// What [`trace_workload`] saw: rtrace's stdout and stderr, and what the
/// workload's `done` line said.
pub struct Traced {
    /// rtrace's stdout.
    pub stdout: String,
    /// rtrace's stderr.
    pub stderr: String,
    /// The workload's account of its work.
    pub done: String,
}

/// Runs workload `name ARGS` under `rtrace TOOL_ARGS -p PID`: the workload
/// starts first so that rtrace can be pointed at it, works once rtrace is
/// tracing, and rtrace is stopped with `signal` `settle` after it is done.
/// rtrace must exit 0 without reporting lost events.
pub fn trace_workload(
    name: &str,
    args: &[String],
    tool_args: &[&str],
    settle: Duration,
    signal: i32,
) -> Traced {
    let (mut work, ready) = Workload::start(name, args);
    assert_eq!(ready.trim(), "ready");
    let pid = work.pid().to_string();
    let mut full = tool_args.to_vec();
    full.extend_from_slice(&["-p", &pid]);
    let rtrace = Rtrace::start(&full);
    let done = work.go();
    work.wait();
    std::thread::sleep(settle);
    let (code, stdout, stderr) = rtrace.stop(signal);
    assert_eq!(code, 0, "stderr: {stderr}");
    assert!(!stderr.contains("lost"), "{stderr}");
    Traced {
        stdout,
        stderr,
        done,
    }
}

/// Folded stacks (`comm;frame;.. count`) as frames, root first, with counts.
/// Names may hold spaces, so the count is after the last one.
pub fn parse_folded(text: &str) -> std::collections::BTreeMap<Vec<String>, u64> {
    let mut out = std::collections::BTreeMap::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        let (stack, count) = line.rsplit_once(' ').expect("no count");
        let frames: Vec<String> = stack.split(';').map(str::to_owned).collect();
        *out.entry(frames).or_insert(0) += count.parse::<u64>().expect("bad count");
    }
    out
}

/// rtrace's warnings in `stderr`: the kind and text of each line
/// `rtrace: warning[KIND]: TEXT` (lost, unwalked, unnamed, unsupported).
pub fn warnings(stderr: &str) -> Vec<(&str, &str)> {
    stderr
        .lines()
        .filter_map(|l| l.strip_prefix("rtrace: warning["))
        .filter_map(|l| l.split_once("]: "))
        .collect()
}

/// Events rtrace said the kernel skipped (`N events not counted: program
/// P was skipped, ...`: a program was already running on their CPU), of
/// the programs `programs` chooses by name.
pub fn skipped_runs(stderr: &str, programs: impl Fn(&str) -> bool) -> u64 {
    warnings(stderr)
        .into_iter()
        .filter(|(kind, _)| *kind == "lost")
        .filter_map(|(_, text)| {
            let (n, rest) = text.split_once(" events not counted: program ")?;
            let program = rest.split_whitespace().next()?;
            programs(program).then(|| n.parse::<u64>().ok()).flatten()
        })
        .sum()
}

/// A count `-v` gave at exit (`rtrace: TOOL: N WHAT`, one of the
/// `ERRORS` slots' names), `None` where the run gave none.
pub fn verbose_count(stderr: &str, tool: &str, what: &str) -> Option<u64> {
    let prefix = format!("rtrace: {tool}: ");
    let suffix = format!(" {what}");
    stderr.lines().find_map(|l| {
        l.strip_prefix(prefix.as_str())?
            .strip_suffix(suffix.as_str())?
            .parse()
            .ok()
    })
}

/// Asserts that `rtrace ARGS` fails with one line on stderr containing
/// `want`.
pub fn assert_one_line_error(args: &[&str], want: &str) {
    let (code, _, stderr) = run(args);
    assert_ne!(code, 0, "{args:?}");
    assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
    assert!(stderr.contains(want), "{args:?}: {stderr}");
}

/// Whether this test runs in a VM guest of `cargo xtask vm-test`, which
/// lists the mechanisms its kernel must have; the guests lack the peers
/// and servers some tests compare with (libbpf-tools, perf, Prometheus).
pub fn in_guest() -> bool {
    std::env::var("RTRACE_EXPECT_MECHANISMS").is_ok_and(|v| !v.is_empty())
}

/// Whether attach mechanism `name` (as `doctor` names it) works here.
///
/// In the VM matrix, `RTRACE_EXPECT_MECHANISMS` lists what the guest
/// kernel must have, so a mechanism that broke fails its tests there
/// instead of being passed over; elsewhere `rtrace doctor` answers.
pub fn mechanism_works(name: &str) -> bool {
    if let Ok(list) = std::env::var("RTRACE_EXPECT_MECHANISMS")
        && !list.is_empty()
    {
        return list.split(',').any(|m| m == name);
    }
    // The kernel's answer does not change within a test run: ask once.
    static DOCTOR: std::sync::OnceLock<serde_json::Value> = std::sync::OnceLock::new();
    let v = DOCTOR.get_or_init(|| {
        let (code, stdout, stderr) = run(&["doctor", "--json"]);
        assert_eq!(code, 0, "{stderr}");
        serde_json::from_str(stdout.trim()).unwrap()
    });
    v["mechanisms"][name]["works"] == true
}

/// A file system mounted on a fresh directory for one test, unmounted
/// and removed on drop.
pub struct Mount {
    /// The mount point.
    pub path: String,
    _device: Option<LoopDevice>,
}

impl Mount {
    /// A fresh ext4 file system on a loop device, made with mke2fs, so the
    /// test runs the same whatever file system holds `/tmp` (the VM
    /// guests' is a ramfs).
    pub fn ext4(tag: &str) -> Self {
        let device = LoopDevice::new(tag);
        let out = Command::new("mke2fs")
            // Lazy initialization: zeroing tables asks the loop device for
            // WRITE_ZEROES, which the guests' kernels log as unsupported.
            .args([
                "-q",
                "-F",
                "-t",
                "ext4",
                "-E",
                "lazy_itable_init=1,lazy_journal_init=1,nodiscard",
            ])
            .arg(&device.path)
            // Its built-in defaults, so that the guests need no config file.
            .env("MKE2FS_CONFIG", "/nonexistent")
            .output()
            .expect("cannot run mke2fs (Debian package e2fsprogs)");
        assert!(
            out.status.success(),
            "mke2fs failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Self::attach(
            tag,
            "ext4",
            &device.path.clone(),
            "noinit_itable",
            Some(device),
        )
    }

    /// A fresh file system of type `fstype` (xfs, btrfs) on a loop device
    /// of 320 MiB (xfs's least), made with its mkfs; `None` where the
    /// kernel does not have it (the guests load no module for either).
    pub fn made(tag: &str, fstype: &str) -> Option<Self> {
        let known = std::fs::read_to_string("/proc/filesystems").unwrap_or_default();
        if !known
            .lines()
            .any(|l| l.split_whitespace().last() == Some(fstype))
        {
            return None;
        }
        let device = LoopDevice::sized(tag, 320 << 20);
        let mkfs = format!("mkfs.{fstype}");
        let out = Command::new(&mkfs)
            .args(["-q", "-f"])
            .arg(&device.path)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {mkfs} (Debian's {fstype}progs): {e}"));
        assert!(
            out.status.success(),
            "{mkfs} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Some(Self::attach(
            tag,
            fstype,
            &device.path.clone(),
            "",
            Some(device),
        ))
    }

    /// A fresh tmpfs.
    pub fn tmpfs(tag: &str) -> Self {
        Self::attach(tag, "tmpfs", "tmpfs", "", None)
    }

    fn attach(
        tag: &str,
        fstype: &str,
        source: &str,
        options: &str,
        device: Option<LoopDevice>,
    ) -> Self {
        use std::ffi::CString;
        let path = std::env::temp_dir()
            .join(format!("rtrace-{tag}-{}-mnt", std::process::id()))
            .to_string_lossy()
            .into_owned();
        std::fs::create_dir_all(&path).unwrap();
        let (src, target, ty, data) = (
            CString::new(source).unwrap(),
            CString::new(path.as_str()).unwrap(),
            CString::new(fstype).unwrap(),
            CString::new(options).unwrap(),
        );
        // SAFETY: valid C strings.
        let rc = unsafe {
            libc::mount(
                src.as_ptr(),
                target.as_ptr(),
                ty.as_ptr(),
                0,
                data.as_ptr().cast(),
            )
        };
        assert_eq!(
            rc,
            0,
            "cannot mount {fstype} on {path}: {}",
            std::io::Error::last_os_error()
        );
        Self {
            path,
            _device: device,
        }
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let target = std::ffi::CString::new(self.path.as_str()).unwrap();
        // SAFETY: a valid C string.
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
        let _ = std::fs::remove_dir(&self.path);
    }
}

/// A loop block device over a fresh 16 MiB file, detached on drop. Set up
/// with the loop ioctls directly, so that the VM guests need no losetup.
pub struct LoopDevice {
    /// The device's name in /sys/block, such as `loop3`.
    pub name: String,
    /// `/dev/<name>`.
    pub path: String,
    file: std::path::PathBuf,
    dev: std::fs::File,
}

impl LoopDevice {
    /// Attaches a new loop device.
    pub fn new(tag: &str) -> Self {
        Self::sized(tag, 16 << 20)
    }

    /// Attaches a new loop device over a sparse file of `bytes`.
    pub fn sized(tag: &str, bytes: u64) -> Self {
        use std::os::fd::AsRawFd as _;
        const LOOP_SET_FD: libc::c_ulong = 0x4C00;
        const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
        let file = std::env::temp_dir().join(format!("rtrace-{tag}-{}.img", std::process::id()));
        let backing = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&file)
            .unwrap();
        backing.set_len(bytes).unwrap();
        let control = std::fs::File::open("/dev/loop-control")
            .expect("no /dev/loop-control: the loop driver is not loaded");
        // Tests running at once may be handed the same free device; the
        // loser of the race gets EBUSY and asks again.
        let mut tries = 0;
        let (n, path, dev) = loop {
            // SAFETY: the ioctl takes no argument and returns a device number.
            let n = unsafe { libc::ioctl(control.as_raw_fd(), LOOP_CTL_GET_FREE) };
            assert!(
                n >= 0,
                "LOOP_CTL_GET_FREE: {}",
                std::io::Error::last_os_error()
            );
            let path = format!("/dev/loop{n}");
            let dev = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .unwrap();
            // SAFETY: the ioctl takes the backing file's descriptor.
            let rc = unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_SET_FD, backing.as_raw_fd()) };
            if rc == 0 {
                break (n, path, dev);
            }
            let err = std::io::Error::last_os_error();
            tries += 1;
            assert!(
                err.raw_os_error() == Some(libc::EBUSY) && tries < 50,
                "LOOP_SET_FD: {err}"
            );
        };
        let me = Self {
            name: format!("loop{n}"),
            path,
            file,
            dev,
        };
        me.settle();
        me
    }

    /// Gives the device an I/O scheduler (mq-deadline, or another the
    /// kernel offers), so that its requests are inserted and
    /// `block:block_rq_insert` fires for each: with none (a new loop
    /// device's default here), the block layer issues them directly.
    /// `None` where the kernel offers no scheduler.
    pub fn insert_requests(&self) -> Option<&'static str> {
        let path = format!("/sys/block/{}/queue/scheduler", self.name);
        let offered = std::fs::read_to_string(&path).unwrap();
        let sched = ["mq-deadline", "kyber", "bfq"].into_iter().find(|s| {
            offered
                .split_whitespace()
                .any(|o| o.trim_matches(['[', ']']) == *s)
        })?;
        std::fs::write(&path, sched).unwrap_or_else(|e| panic!("{sched} on {path}: {e}"));
        Some(sched)
    }

    /// Waits until the device has no request in flight (udev or the
    /// kernel may probe a new device's partition table).
    pub fn settle(&self) {
        let inflight = format!("/sys/block/{}/inflight", self.name);
        for _ in 0..200 {
            let busy = std::fs::read_to_string(&inflight)
                .unwrap_or_default()
                .split_whitespace()
                .any(|n| n != "0");
            if !busy {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        panic!("{} stayed busy", self.name);
    }

    /// Requests completed so far, from /sys/block/<name>/stat: reads,
    /// writes, discards and flushes.
    pub fn completed(&self) -> u64 {
        let stat = std::fs::read_to_string(format!("/sys/block/{}/stat", self.name)).unwrap();
        let f: Vec<u64> = stat
            .split_whitespace()
            .map(|n| n.parse().unwrap())
            .collect();
        [0, 4, 11, 15].iter().filter_map(|&i| f.get(i)).sum()
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        use std::os::fd::AsRawFd as _;
        const LOOP_CLR_FD: libc::c_ulong = 0x4C01;
        // SAFETY: the ioctl takes no argument.
        unsafe { libc::ioctl(self.dev.as_raw_fd(), LOOP_CLR_FD, 0) };
        let _ = std::fs::remove_file(&self.file);
    }
}

/// A bpffs of a test's own, with hash maps pinned in it as bcc's users pin
/// them for `--cgroupmap` and `--mntnsmap` (`bpftool map create PATH type
/// hash key 8 value 8 entries N name NAME`, then `bpftool map update`),
/// made with bpf(2) here since the hosts have no bpftool. Unmounted on
/// drop.
pub struct PinnedMaps {
    dir: std::path::PathBuf,
    fds: Vec<i32>,
}

/// One bpf(2) call with a zeroed attribute block holding `fields` (as
/// native-endian u32 words from its start).
fn bpf(cmd: i64, words: &[u32]) -> i64 {
    let mut attr = [0u32; 32];
    attr[..words.len()].copy_from_slice(words);
    // SAFETY: `attr` outlives the call and is as large as the kernel reads.
    unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr.as_ptr(),
            std::mem::size_of_val(&attr),
        )
    }
}

/// A pointer as the two u32 words bpf(2) attributes take it.
fn words_of<T>(p: *const T) -> [u32; 2] {
    let a = p as u64;
    [a as u32, (a >> 32) as u32]
}

impl PinnedMaps {
    /// Mounts a bpffs at a fresh directory.
    pub fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("rtrace-bpffs-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = std::ffi::CString::new(dir.to_str().unwrap()).unwrap();
        let fs = c"bpf";
        // SAFETY: valid C strings; no data.
        let rc =
            unsafe { libc::mount(fs.as_ptr(), path.as_ptr(), fs.as_ptr(), 0, std::ptr::null()) };
        assert_eq!(rc, 0, "mount bpffs: {}", std::io::Error::last_os_error());
        Self {
            dir,
            fds: Vec::new(),
        }
    }

    /// Pins a hash map with 8-byte keys and values as `name`; returns its
    /// path and its index for [`PinnedMaps::insert`].
    pub fn hash(&mut self, name: &str) -> (String, usize) {
        const MAP_CREATE: i64 = 0;
        const OBJ_PIN: i64 = 6;
        const HASH: u32 = 1;
        let fd = bpf(MAP_CREATE, &[HASH, 8, 8, 64]);
        assert!(fd >= 0, "map create: {}", std::io::Error::last_os_error());
        let path = self.dir.join(name);
        let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
        let [lo, hi] = words_of(c.as_ptr());
        let rc = bpf(OBJ_PIN, &[lo, hi, fd as u32]);
        assert_eq!(rc, 0, "pin: {}", std::io::Error::last_os_error());
        self.fds.push(fd as i32);
        (path.to_str().unwrap().to_owned(), self.fds.len() - 1)
    }

    /// Adds `key` to map `index`.
    pub fn insert(&self, index: usize, key: u64) {
        const MAP_UPDATE_ELEM: i64 = 2;
        let value = 1u64;
        let [klo, khi] = words_of(&key);
        let [vlo, vhi] = words_of(&value);
        let rc = bpf(
            MAP_UPDATE_ELEM,
            &[self.fds[index] as u32, 0, klo, khi, vlo, vhi],
        );
        assert_eq!(rc, 0, "update: {}", std::io::Error::last_os_error());
    }
}

impl Drop for PinnedMaps {
    fn drop(&mut self) {
        for &fd in &self.fds {
            // SAFETY: descriptors this value opened.
            unsafe { libc::close(fd) };
        }
        let path = std::ffi::CString::new(self.dir.to_str().unwrap()).unwrap();
        // SAFETY: a valid C string.
        unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// The id of the mount namespace of process `pid` (the inode number of
/// `/proc/PID/ns/mnt`), as `--mntnsmap` keys it.
pub fn mount_ns_id(pid: u32) -> u64 {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata(format!("/proc/{pid}/ns/mnt"))
        .unwrap()
        .ino()
}

/// The id of cgroup v2 directory `path` (its inode number), as
/// `--cgroupmap` keys it.
pub fn cgroup_id(path: &str) -> u64 {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata(path).unwrap().ino()
}

/// A private copy of `true` under a name no other process uses
/// (`PREFIX TAG PID`, short enough for a 15-byte comm), so that a test's
/// execs can be told from the rest of the machine's. Removed when
/// dropped.
pub struct UniqueProgram {
    dir: PathBuf,
    path: PathBuf,
}

impl UniqueProgram {
    /// A copy of `true` named `{prefix}{tag}{pid}` in a directory of its
    /// own.
    pub fn new(prefix: &str, tag: &str) -> Self {
        Self::copy_of("/usr/bin/true", prefix, tag)
    }

    /// A copy of the program at `from` (a file of its own: another inode)
    /// named `{prefix}{tag}{pid}` in a directory of its own.
    pub fn copy_of(from: &str, prefix: &str, tag: &str) -> Self {
        let pid = std::process::id();
        let dir = std::env::temp_dir().join(format!("rtrace-{prefix}-{pid}-{tag}"));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{prefix}{tag}{pid}"));
        std::fs::copy(from, &path).unwrap();
        Self { dir, path }
    }

    /// Its path.
    pub fn path(&self) -> &str {
        self.path.to_str().unwrap()
    }

    /// Its file name, which is its command.
    pub fn name(&self) -> String {
        self.path
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned()
    }
}

impl Drop for UniqueProgram {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Asserts that `a` of `a + b` samples is the share `want` that the
/// workload measured itself, within 5 points and three standard errors
/// of a share of that many samples.
pub fn assert_share(what: &str, a: u64, b: u64, want: f64) {
    let n = (a + b) as f64;
    let got = a as f64 / n;
    let bound = 0.05 + 3.0 * (want * (1.0 - want) / n).sqrt();
    assert!(
        (got - want).abs() <= bound,
        "{what}'s share {got:.3} of {n} samples, the workload measured {want:.3} (bound {bound:.3})"
    );
}

/// The `fileops` workload's `done` line after its `done ` word: the
/// file's name, and each operation it did as type, bytes (-1 for a whole
/// file) and offset.
pub fn fileops_done(done: &str) -> (String, Vec<(String, i64, i64)>) {
    let (name, did) = done.split_once(' ').expect("no operations");
    let ops = did
        .split(',')
        .map(|op| {
            let f: Vec<&str> = op.split(':').collect();
            (
                f[0].to_owned(),
                f[1].parse().unwrap(),
                f[2].parse().unwrap(),
            )
        })
        .collect();
    (name.to_owned(), ops)
}

/// A file-operation event of ext4slower or fsslower as the `fileops`
/// workload lists its operations: type, bytes (-1 for a whole file) and
/// offset.
pub fn file_op(e: &serde_json::Value) -> (String, i64, i64) {
    let bytes = if e["whole_file"] == true {
        -1
    } else {
        e["bytes"].as_i64().unwrap()
    };
    (
        e["type"].as_str().unwrap().to_owned(),
        bytes,
        e["offset"].as_i64().unwrap(),
    )
}

/// A copy of the rtrace binary that an unprivileged user can run.
pub fn unprivileged_copy() -> (std::path::PathBuf, std::path::PathBuf) {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = std::env::temp_dir().join(format!("rtrace-unpriv-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = dir.join("rtrace");
    std::fs::copy(rtrace_bin(), &bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    (dir, bin)
}

/// `setpriv` as user and group 65534 with only `caps` (e.g.
/// `+bpf,+perfmon`), in every set a child inherits.
pub fn as_nobody(bin: &std::path::Path, caps: &str) -> Command {
    let mut cmd = Command::new("setpriv");
    cmd.args([
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        &format!("--inh-caps=-all{caps}"),
        &format!("--ambient-caps=-all{caps}"),
        &format!("--bounding-set=-all{caps}"),
    ])
    .arg(bin);
    cmd
}

/// Starts rtrace with `args` until it prints `ready`: as root, or
/// (`nobody`) from an [`unprivileged_copy`] run [`as_nobody`] with only
/// CAP_BPF and CAP_PERFMON, as the exporter's unit runs. Returns the
/// copy's directory too, for the caller to remove once rtrace stopped.
pub fn start_as(args: &[&str], ready: &str, nobody: bool) -> (Rtrace, Option<PathBuf>) {
    if !nobody {
        return (Rtrace::start_until(args, ready), None);
    }
    let (dir, bin) = unprivileged_copy();
    let mut cmd = as_nobody(&bin, ",+bpf,+perfmon");
    cmd.args(args);
    (Rtrace::start_command(cmd, ready), Some(dir))
}

/// Sets `kernel.perf_event_paranoid` for the test's span, putting back
/// the old level on drop.
pub struct Paranoid(Option<String>);

impl Paranoid {
    /// The setting.
    pub const PATH: &str = "/proc/sys/kernel/perf_event_paranoid";

    /// Sets the level, until the value is dropped.
    pub fn set(level: &str) -> Self {
        let old = std::fs::read_to_string(Self::PATH).unwrap();
        std::fs::write(Self::PATH, level).unwrap();
        Self(Some(old))
    }
}

impl Drop for Paranoid {
    fn drop(&mut self) {
        if let Some(old) = self.0.take() {
            let _ = std::fs::write(Self::PATH, old.trim());
        }
    }
}

//! Command mode (`-- CMD`): the command is started held at a cork, as
//! `perf record CMD` does, so that tracing is attached before its first
//! instruction.
//!
//! rtrace forks; the child waits on a pipe until the tracer has attached,
//! then takes the invoking user's identity and executes the command. The
//! child is put into a cgroup of its own first, so that everything it
//! starts is traced through the one cgroup filter every tool already
//! has, with no per-tool hook on fork. It stays in rtrace's process group,
//! so it keeps the terminal and its foreground: Ctrl-C reaches it as it
//! reaches rtrace.

use std::{
    ffi::{CString, OsStr, OsString},
    fs::File,
    io::Write as _,
    os::{
        fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd},
        unix::ffi::{OsStrExt as _, OsStringExt as _},
    },
    path::{Path, PathBuf},
};

use tokio::io::unix::AsyncFd;

/// Why a command could not run, which makes rtrace exit with 127 as a
/// shell does.
#[derive(Debug, thiserror::Error)]
#[error("cannot run {program}: {why}")]
pub struct NotRun {
    program: String,
    why: String,
}

/// Errors of command mode's setup.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    /// No user of that name or id.
    #[error("-u {0}: no such user")]
    NoUser(String),
    /// cgroup v2 is not mounted.
    #[error(
        "-- CMD follows the command's children through a cgroup, and no cgroup v2 \
         hierarchy is mounted (mount one with: mount -t cgroup2 none /sys/fs/cgroup)"
    )]
    NoCgroup2,
    /// The command's cgroup could not be made or entered.
    #[error("cannot make the command's cgroup {path}: {source}")]
    Cgroup {
        /// The cgroup's directory.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// A system call failed.
    #[error("{what}: {source}")]
    Sys {
        /// What was being done.
        what: &'static str,
        /// What failed.
        source: std::io::Error,
    },
}

fn sys(what: &'static str) -> CommandError {
    CommandError::Sys {
        what,
        source: std::io::Error::last_os_error(),
    }
}

/// Who the command runs as, when not as rtrace.
#[derive(Debug, Clone)]
struct RunAs {
    uid: libc::uid_t,
    gid: libc::gid_t,
    groups: Vec<libc::gid_t>,
    name: CString,
    home: CString,
}

/// A passwd entry's fields rtrace needs.
fn passwd(by_name: Option<&CString>, uid: libc::uid_t) -> Option<RunAs> {
    let mut buf = vec![0u8; 16384];
    // SAFETY: `pw` and `buf` outlive the calls, which write only into them.
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    let rc = unsafe {
        match by_name {
            Some(n) => libc::getpwnam_r(
                n.as_ptr(),
                &mut pw,
                buf.as_mut_ptr().cast(),
                buf.len(),
                &mut found,
            ),
            None => libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr().cast(), buf.len(), &mut found),
        }
    };
    if rc != 0 || found.is_null() {
        return None;
    }
    // SAFETY: getpw*_r filled `pw` with strings in `buf`.
    let (name, home) = unsafe {
        (
            std::ffi::CStr::from_ptr(pw.pw_name).to_owned(),
            std::ffi::CStr::from_ptr(pw.pw_dir).to_owned(),
        )
    };
    let mut groups = vec![0 as libc::gid_t; 256];
    let mut n = groups.len() as libc::c_int;
    // SAFETY: `groups` holds `n` entries; the call writes at most that many.
    if unsafe { libc::getgrouplist(name.as_ptr(), pw.pw_gid, groups.as_mut_ptr(), &mut n) } < 0 {
        n = 1;
        groups[0] = pw.pw_gid;
    }
    groups.truncate(n.max(0) as usize);
    Some(RunAs {
        uid: pw.pw_uid,
        gid: pw.pw_gid,
        groups,
        name,
        home,
    })
}

/// Whom the command runs as: `-u USER`, else under sudo the user sudo
/// names, else rtrace's own user (no change).
fn run_as(user: Option<&str>) -> Result<Option<RunAs>, CommandError> {
    if let Some(user) = user {
        let found = match user.parse::<libc::uid_t>() {
            Ok(uid) => passwd(None, uid),
            Err(_) => CString::new(user).ok().and_then(|n| passwd(Some(&n), 0)),
        };
        return found
            .map(Some)
            .ok_or_else(|| CommandError::NoUser(user.to_owned()));
    }
    // SAFETY: no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(None);
    }
    let id = |var: &str| std::env::var(var).ok()?.parse::<u32>().ok();
    match (id("SUDO_UID"), id("SUDO_GID")) {
        (Some(0), _) | (None, _) => Ok(None),
        (Some(uid), gid) => {
            let mut who = passwd(None, uid).unwrap_or_else(|| RunAs {
                uid,
                gid: gid.unwrap_or(uid),
                groups: Vec::new(),
                name: CString::default(),
                home: CString::default(),
            });
            if let Some(gid) = gid {
                who.gid = gid;
            }
            if who.groups.is_empty() {
                who.groups.push(who.gid);
            }
            Ok(Some(who))
        }
    }
}

/// The program `name` names: itself if it has a slash, else the first
/// executable file of that name in `PATH`, as a shell finds it.
fn find_program(name: &OsStr) -> Result<PathBuf, NotRun> {
    use std::os::unix::fs::PermissionsExt as _;
    let not_run = |why: &str| NotRun {
        program: name.to_string_lossy().into_owned(),
        why: why.to_owned(),
    };
    let executable = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if name.as_bytes().contains(&b'/') {
        let p = PathBuf::from(name);
        return match std::fs::metadata(&p) {
            Err(e) => Err(not_run(&e.to_string())),
            Ok(_) if !executable(&p) => Err(not_run("not an executable file")),
            Ok(_) => Ok(p),
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| executable(p))
        .ok_or_else(|| not_run("command not found"))
}

/// The cgroup v2 hierarchy's mount point, from `/proc/self/mountinfo`.
fn cgroup2_root() -> Option<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        (right.split_whitespace().next()? == "cgroup2")
            .then(|| left.split_whitespace().nth(4).map(PathBuf::from))
            .flatten()
    })
}

/// What a command's cgroup is named: this and the pid of the rtrace that
/// made it.
const CGROUP_PREFIX: &str = "rtrace-cmd-";

/// A command's cgroup whose rtrace is gone (killed before it could remove
/// it).
#[derive(Debug)]
pub struct StaleCgroup {
    /// Its directory.
    pub path: PathBuf,
    /// The pid of the rtrace that made it.
    pub owner: u32,
    /// The processes still in it (the command, or what it left running).
    pub procs: Vec<u32>,
    /// Whether it was removed now: it was empty.
    pub removed: bool,
}

/// Finds the command cgroups of rtraces that are gone, anywhere in the
/// cgroup v2 hierarchy, and removes those that are empty. A cgroup's
/// owner is gone when its pid runs no process, or one that started after
/// the cgroup was made (the pid was reused). Kernel state is rtrace's to
/// clean: a `kill -9` leaves the directory behind, and nothing else ever
/// removes it.
pub fn sweep_stale_cgroups() -> Vec<StaleCgroup> {
    let Some(root) = cgroup2_root() else {
        return Vec::new();
    };
    let mut found = Vec::new();
    // Breadth-first and shallow: session cgroups are a few levels down,
    // and the hierarchy holds a few hundred directories.
    let mut level = vec![root];
    for _ in 0..8 {
        let mut next = Vec::new();
        for dir in level {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for e in entries.flatten() {
                if !e.file_type().is_ok_and(|t| t.is_dir()) {
                    continue;
                }
                let path = e.path();
                let owner = e
                    .file_name()
                    .to_str()
                    .and_then(|n| n.strip_prefix(CGROUP_PREFIX))
                    .and_then(|p| p.parse::<u32>().ok());
                match owner {
                    Some(owner) => found.extend(stale(path, owner)),
                    None => next.push(path),
                }
            }
        }
        if next.is_empty() {
            break;
        }
        level = next;
    }
    found
}

/// Cgroup `path`, made by rtrace `owner`, if its owner is gone: removed
/// if nothing is left in it.
fn stale(path: PathBuf, owner: u32) -> Option<StaleCgroup> {
    let made_ns = std::fs::metadata(&path)
        .ok()
        .and_then(|m| m.modified().ok())
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_nanos() as u64);
    if owner == std::process::id() {
        return None;
    }
    let started = crate::kernel::procmaps::Proc::now(owner).born_wall_ns();
    // Its start is read in clock ticks: a process started within a tick
    // after the directory was made is still taken as its owner; one of
    // unknown start (0: gone) is not.
    let slack = crate::kernel::procmaps::tick_ns();
    if started != 0 && made_ns.is_none_or(|made| started <= made + slack) {
        return None;
    }
    let procs: Vec<u32> = std::fs::read_to_string(path.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    let removed = procs.is_empty() && std::fs::remove_dir(&path).is_ok();
    Some(StaleCgroup {
        path,
        owner,
        procs,
        removed,
    })
}

/// The command's own cgroup, removed when dropped.
#[derive(Debug)]
pub struct CommandCgroup {
    path: PathBuf,
    parent: PathBuf,
}

impl CommandCgroup {
    /// Makes a cgroup below rtrace's own, so that the command stays under
    /// the limits and accounting of the session it was run from; below the
    /// hierarchy's root if rtrace's own does not allow it.
    fn new() -> Result<Self, CommandError> {
        let root = cgroup2_root().ok_or(CommandError::NoCgroup2)?;
        let own = std::fs::read_to_string("/proc/self/cgroup")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("0::"))
                    .map(|p| p.trim_start_matches('/').to_owned())
            })
            .unwrap_or_default();
        let name = format!("{CGROUP_PREFIX}{}", std::process::id());
        let mut last = None;
        for parent in [root.join(&own), root.clone()] {
            let path = parent.join(&name);
            match std::fs::create_dir(&path) {
                Ok(()) => return Ok(Self { path, parent }),
                Err(source) => last = Some(CommandError::Cgroup { path, source }),
            }
        }
        Err(last.unwrap_or(CommandError::NoCgroup2))
    }

    /// The cgroup's directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Moves process `pid` into the cgroup.
    fn enter(&self, pid: u32) -> Result<(), CommandError> {
        let procs = self.path.join("cgroup.procs");
        std::fs::write(&procs, pid.to_string()).map_err(|source| CommandError::Cgroup {
            path: self.path.clone(),
            source,
        })
    }
}

impl Drop for CommandCgroup {
    fn drop(&mut self) {
        // What the command left running (a daemon it started) goes back
        // to where rtrace runs, so that the cgroup can be removed.
        if let Ok(procs) = std::fs::read_to_string(self.path.join("cgroup.procs")) {
            for pid in procs.lines() {
                let _ = std::fs::write(self.parent.join("cgroup.procs"), pid);
            }
        }
        let _ = std::fs::remove_dir(&self.path);
    }
}

/// A pipe's two ends, close-on-exec.
fn pipe() -> Result<(OwnedFd, OwnedFd), CommandError> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(sys("cannot make a pipe"));
    }
    // SAFETY: pipe2 just opened both, and nothing else owns them.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// What the child reports through the error pipe before it exits: the
/// step that failed and its errno.
const STEP_EXEC: u8 = 0;
const STEP_IDS: u8 = 1;

/// A command started and held at the cork, then running.
#[derive(Debug)]
pub struct Corked {
    pid: libc::pid_t,
    program: String,
    cork: Option<OwnedFd>,
    errors: Option<OwnedFd>,
    exited: Option<AsyncFd<OwnedFd>>,
    status: Option<u8>,
    cgroup: Option<CommandCgroup>,
}

/// A command to run: its words, and whom it runs as.
#[derive(Debug, Clone, Default)]
pub struct CommandLine {
    /// The program and its arguments.
    pub argv: Vec<OsString>,
    /// `-u USER`.
    pub user: Option<String>,
    /// Whether the command runs in a cgroup of its own, which the tracer
    /// then traces (not with `-p`, `-t` or `--all-cpus`).
    pub own_cgroup: bool,
}

impl Corked {
    /// Forks the command's process, held before it executes anything.
    /// Fails with [`NotRun`] when the program cannot be found.
    pub fn start(cmd: &CommandLine) -> anyhow::Result<Self> {
        let path = find_program(&cmd.argv[0])?;
        let program = cmd.argv[0].to_string_lossy().into_owned();
        let who = run_as(cmd.user.as_deref())?;
        let cgroup = cmd.own_cgroup.then(CommandCgroup::new).transpose()?;
        let cstr = |s: &OsStr| {
            CString::new(s.as_bytes()).map_err(|_| NotRun {
                program: program.clone(),
                why: "an argument holds a NUL byte".into(),
            })
        };
        let path_c = cstr(path.as_os_str())?;
        let args: Vec<CString> = cmd.argv.iter().map(|a| cstr(a)).collect::<Result<_, _>>()?;
        let mut env: Vec<CString> = Vec::new();
        for (k, v) in std::env::vars_os() {
            let switched = who.is_some() && matches!(k.to_str(), Some("HOME" | "USER" | "LOGNAME"));
            if switched {
                continue;
            }
            let mut kv = k.into_vec();
            kv.push(b'=');
            kv.extend(v.as_bytes());
            if let Ok(c) = CString::new(kv) {
                env.push(c);
            }
        }
        if let Some(w) = who.as_ref().filter(|w| !w.name.is_empty()) {
            for (k, v) in [("HOME", &w.home), ("USER", &w.name), ("LOGNAME", &w.name)] {
                let mut kv = k.as_bytes().to_vec();
                kv.push(b'=');
                kv.extend(v.to_bytes());
                env.push(CString::new(kv).expect("no NUL in a C string's bytes"));
            }
        }
        let argv: Vec<*const libc::c_char> = args
            .iter()
            .map(|a| a.as_ptr())
            .chain(std::iter::once(std::ptr::null()))
            .collect();
        let envp: Vec<*const libc::c_char> = env
            .iter()
            .map(|a| a.as_ptr())
            .chain(std::iter::once(std::ptr::null()))
            .collect();
        let (cork_r, cork_w) = pipe()?;
        let (err_r, err_w) = pipe()?;
        let ids = who.as_ref().map(|w| (w.uid, w.gid, w.groups.as_slice()));
        // SAFETY: the child runs only async-signal-safe system calls on
        // memory prepared above, then executes or exits.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(sys("cannot fork the command").into());
        }
        if pid == 0 {
            // SAFETY: in the child; see `child`.
            unsafe {
                child(
                    [cork_r.as_raw_fd(), cork_w.as_raw_fd()],
                    err_w.as_raw_fd(),
                    path_c.as_ptr(),
                    argv.as_ptr(),
                    envp.as_ptr(),
                    ids,
                )
            }
        }
        drop(cork_r);
        drop(err_w);
        let mut corked = Self {
            pid,
            program,
            cork: Some(cork_w),
            errors: Some(err_r),
            exited: None,
            status: None,
            cgroup: None,
        };
        if let Some(cg) = cgroup {
            cg.enter(pid as u32)?;
            corked.cgroup = Some(cg);
        }
        // SAFETY: pidfd_open takes a pid and flags.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd < 0 {
            return Err(sys("cannot watch the command (pidfd_open; Linux 5.3 or later)").into());
        }
        // SAFETY: pidfd_open just returned it, and nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
        // SAFETY: `fd` is an open pidfd that the AsyncFd owns from now on.
        let watched = unsafe { AsyncFd::register(fd) };
        corked.exited = Some(watched.map_err(|e| CommandError::Sys {
            what: "cannot watch the command",
            source: e.into(),
        })?);
        Ok(corked)
    }

    /// The command's process id.
    pub fn pid(&self) -> u32 {
        self.pid as u32
    }

    /// The cgroup the command runs in, if one of its own.
    pub fn cgroup(&self) -> Option<&Path> {
        self.cgroup.as_ref().map(CommandCgroup::path)
    }

    /// Lets the command run, and waits until it has executed its program
    /// or failed to.
    pub fn release(&mut self) -> anyhow::Result<()> {
        if let Some(cork) = self.cork.take() {
            File::from(cork)
                .write_all(b"g")
                .map_err(|source| CommandError::Sys {
                    what: "cannot start the command",
                    source,
                })?;
        }
        let Some(errors) = self.errors.take() else {
            return Ok(());
        };
        let mut report = [0u8; 5];
        let mut file = File::from(errors);
        let n = std::io::Read::read(&mut file, &mut report).unwrap_or(0);
        if n < report.len() {
            // Closed by a successful exec.
            return Ok(());
        }
        let errno = i32::from_le_bytes([report[1], report[2], report[3], report[4]]);
        let why = std::io::Error::from_raw_os_error(errno).to_string();
        let why = if report[0] == STEP_IDS {
            format!("cannot take the invoking user's identity: {why}")
        } else {
            why
        };
        Err(NotRun {
            program: self.program.clone(),
            why,
        }
        .into())
    }

    /// Sends signal `sig` to the command.
    pub fn signal(&self, sig: libc::c_int) {
        if self.status.is_none() {
            // SAFETY: kill takes a pid and a signal number.
            unsafe { libc::kill(self.pid, sig) };
        }
    }

    /// Waits until the command exits, and reaps it.
    pub async fn exited(&mut self) {
        if self.status.is_some() {
            return std::future::pending().await;
        }
        let Some(fd) = &self.exited else {
            return std::future::pending().await;
        };
        if let Ok(mut guard) = fd.readable().await {
            guard.retain_ready();
        }
        self.reap();
    }

    /// Reaps the command if it has exited, keeping its status.
    fn reap(&mut self) {
        let mut status = 0;
        // SAFETY: `status` is a valid out-pointer.
        let rc = unsafe { libc::waitpid(self.pid, &mut status, libc::WNOHANG) };
        if rc == self.pid {
            self.status = Some(if libc::WIFSIGNALED(status) {
                128u8.wrapping_add(libc::WTERMSIG(status) as u8)
            } else {
                libc::WEXITSTATUS(status) as u8
            });
        }
    }

    /// The exit status rtrace takes: the command's, 128+N if signal N
    /// killed it.
    pub fn status(&self) -> Option<u8> {
        self.status
    }
}

impl Drop for Corked {
    fn drop(&mut self) {
        // Held at the cork still (the tracer failed): closing the pipe
        // makes it exit at once, and it is reaped. A command running is
        // left to run, as a shell leaves a job.
        if let Some(cork) = self.cork.take() {
            drop(cork);
            let mut status = 0;
            // SAFETY: as in `reap`.
            unsafe { libc::waitpid(self.pid, &mut status, 0) };
        }
    }
}

/// The forked child: waits for the cork, takes the user's identity,
/// executes the program, and on failure reports why and exits with 127.
///
/// # Safety
/// Runs between fork and exec in a multi-threaded process: only system
/// calls on memory prepared before the fork.
unsafe fn child(
    [cork, cork_w]: [RawFd; 2],
    errors: RawFd,
    path: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    ids: Option<(libc::uid_t, libc::gid_t, &[libc::gid_t])>,
) -> ! {
    // SAFETY: all async-signal-safe calls on valid pointers.
    unsafe {
        // The cork's other end is the tracer's: held here too, the pipe
        // would never close when the tracer fails.
        libc::close(cork_w);
        let mut go = 0u8;
        loop {
            let n = libc::read(cork, (&raw mut go).cast(), 1);
            if n == 1 {
                break;
            }
            if n < 0 && *libc::__errno_location() == libc::EINTR {
                continue;
            }
            // The tracer could not attach and closed the pipe.
            libc::_exit(127);
        }
        // rtrace's blocked signals and ignored SIGPIPE are its own.
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        // A shell starts a background job with SIGINT ignored, which the
        // command would inherit, and a SIGINT passed on to it would do
        // nothing. perf sets its handlers before it forks, so its command
        // starts with the default; so does this one. SIGHUP is left as
        // it was: under nohup the command is to outlive the terminal.
        libc::signal(libc::SIGINT, libc::SIG_DFL);
        libc::signal(libc::SIGTERM, libc::SIG_DFL);
        let fail = |step: u8| -> ! {
            let e = (*libc::__errno_location()).to_le_bytes();
            let report = [step, e[0], e[1], e[2], e[3]];
            libc::write(errors, report.as_ptr().cast(), report.len());
            libc::_exit(127);
        };
        if let Some((uid, gid, groups)) = ids
            && (libc::setgroups(groups.len(), groups.as_ptr()) != 0
                || libc::setgid(gid) != 0
                || libc::setuid(uid) != 0)
        {
            fail(STEP_IDS);
        }
        libc::execve(path, argv, envp);
        fail(STEP_EXEC)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programs_are_found_as_a_shell_finds_them() {
        assert!(find_program(OsStr::new("sh")).is_ok());
        assert!(find_program(OsStr::new("/bin/sh")).is_ok());
        let e = find_program(OsStr::new("rtrace-no-such-program")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "cannot run rtrace-no-such-program: command not found"
        );
        assert!(find_program(OsStr::new("/etc/passwd")).is_err());
    }
}

//! strace's `-y`: the path behind each descriptor a line shows. A
//! descriptor's path is learned from the call that made it, as the
//! process named it (resolved against its working directory and the
//! file system, as the kernel's own name for it would be), and copied by
//! dup and fork (told at the fork itself, as the child may run before
//! its parent's clone returns), dropped by close and by exec where
//! close-on-exec: lines
//! are printed after the calls, when the descriptor may be closed or
//! reused, so a path read from `/proc/PID/fd` then could name another
//! file. Only descriptors made before tracing began are read from there
//! (or from a live thread's `/proc/TID/fd`, where the first thread has
//! ended and taken its view of them).

use std::{
    collections::{HashMap, HashSet},
    path::PathBuf,
};

/// Argument names that hold a descriptor in the kernel's syscall formats.
const FD_ARGS: &[&str] = &[
    "fd", "fildes", "dfd", "olddfd", "newdfd", "oldfd", "newfd", "fd_in", "fd_out", "epfd",
    "out_fd", "in_fd",
];

/// Syscalls that return a new descriptor.
const MAKE_FD: &[&str] = &[
    "open",
    "openat",
    "openat2",
    "creat",
    "dup",
    "dup2",
    "dup3",
    "socket",
    "accept",
    "accept4",
    "memfd_create",
    "eventfd",
    "eventfd2",
    "epoll_create",
    "epoll_create1",
    "signalfd",
    "signalfd4",
    "timerfd_create",
    "inotify_init",
    "inotify_init1",
    "pidfd_open",
    "userfaultfd",
    "perf_event_open",
    "bpf",
];

/// Syscalls that change a process's descriptors or directory, beside
/// those that make a descriptor: `-y` must see them although `-e trace=`
/// hides them.
const CHANGE_FDS: &[&str] = &["close", "fcntl", "execve", "execveat", "chdir", "fchdir"];

/// Whether `-y` needs to see syscall `name`'s calls.
pub fn affects(name: &str) -> bool {
    makes_fd(name) || CHANGE_FDS.contains(&name)
}

/// `O_CLOEXEC`.
const O_CLOEXEC: u64 = 0o2000000;
/// `AT_FDCWD`.
const AT_FDCWD: i32 = -100;
/// fcntl's `F_DUPFD` and `F_DUPFD_CLOEXEC`.
const F_DUPFD: u64 = 0;
const F_DUPFD_CLOEXEC: u64 = 1030;

#[derive(Debug, Clone)]
struct Known {
    path: String,
    cloexec: bool,
}

/// The paths of the traced processes' descriptors, by process and
/// descriptor (threads share their process's table).
#[derive(Debug, Default)]
pub struct Fds {
    known: HashMap<(u32, i32), Known>,
    /// Working directories, by process: learned from chdir, as the
    /// process may be gone when its relative paths are resolved.
    cwd: HashMap<u32, PathBuf>,
    /// Processes whose every descriptor is known, read when tracing
    /// began or inherited from such a process: a descriptor they lack is
    /// closed, whatever `/proc` says of its number by the time the line
    /// is printed.
    whole: HashSet<u32>,
}

/// Whether argument `name` holds a descriptor.
pub fn is_fd_arg(name: &str) -> bool {
    FD_ARGS.contains(&name)
}

/// Whether syscall `name` returns a descriptor.
pub fn makes_fd(name: &str) -> bool {
    MAKE_FD.contains(&name)
}

impl Fds {
    /// The path of `pid`'s descriptor `fd`, if known or readable.
    pub fn path(&mut self, pid: u32, fd: i32) -> Option<String> {
        if fd < 0 {
            return None;
        }
        if let Some(k) = self.known.get(&(pid, fd)) {
            return Some(k.path.clone());
        }
        if self.whole.contains(&pid) {
            return None;
        }
        // Made before tracing began: what the process has there now.
        let link = link_of(pid, &format!("fd/{fd}"))?;
        Some(self.learn_link(pid, fd, &link))
    }

    /// Keeps `link`, read from `/proc`, as the path of `pid`'s descriptor
    /// `fd` unless one is known already; returns the path kept.
    fn learn_link(&mut self, pid: u32, fd: i32, link: &std::path::Path) -> String {
        self.known
            .entry((pid, fd))
            .or_insert_with(|| Known {
                path: link.to_string_lossy().into_owned(),
                cloexec: false,
            })
            .path
            .clone()
    }

    /// Learns from a finished call of `pid`: `sys` with `args`, the path
    /// it named if it took one, and its return.
    pub fn after(&mut self, pid: u32, sys: &str, args: &[u64; 6], named: Option<&str>, ret: i64) {
        if ret < 0 {
            return;
        }
        let fd = ret as i32;
        match sys {
            "open" | "creat" | "openat" | "openat2" => {
                let (dir, flags) = match sys {
                    "open" => (AT_FDCWD, args[1]),
                    "creat" => (AT_FDCWD, 0),
                    "openat" => (args[0] as i32, args[2]),
                    _ => (args[0] as i32, 0),
                };
                let Some(named) = named else { return };
                let path = self.resolve(pid, dir, named);
                self.known.insert(
                    (pid, fd),
                    Known {
                        path,
                        cloexec: flags & O_CLOEXEC != 0,
                    },
                );
            }
            "dup" | "dup2" => self.copy(pid, args[0] as i32, fd, false),
            "dup3" => self.copy(pid, args[0] as i32, fd, args[2] & O_CLOEXEC != 0),
            "fcntl" if args[1] == F_DUPFD || args[1] == F_DUPFD_CLOEXEC => {
                self.copy(pid, args[0] as i32, fd, args[1] == F_DUPFD_CLOEXEC);
            }
            "close" => {
                self.known.remove(&(pid, args[0] as i32));
            }
            "chdir" => {
                if let Some(named) = named {
                    let dir = PathBuf::from(self.resolve(pid, AT_FDCWD, named));
                    self.cwd.insert(pid, dir);
                }
            }
            "fchdir" => {
                if let Some(dir) = self.path(pid, args[0] as i32) {
                    self.cwd.insert(pid, PathBuf::from(dir));
                }
            }
            "execve" | "execveat" => self.known.retain(|&(p, _), k| p != pid || !k.cloexec),
            _ if makes_fd(sys) => {
                // Sockets, pipes and the like have no path of their own:
                // the kernel's name for them (`socket:[123]`).
                self.known.remove(&(pid, fd));
                let _ = self.path(pid, fd);
            }
            _ => {}
        }
    }

    /// The path `pid`'s descriptor argument `fd` is shown with: its
    /// file's, or for `AT_FDCWD` the working directory's, as strace -y
    /// shows them.
    pub fn shown(&mut self, pid: u32, fd: i32) -> Option<String> {
        if fd == AT_FDCWD {
            return self.cwd_of(pid).map(|d| d.to_string_lossy().into_owned());
        }
        self.path(pid, fd)
    }

    /// Whether call `sys` with `args` returned a new descriptor.
    pub fn returns_fd(sys: &str, args: &[u64; 6]) -> bool {
        makes_fd(sys) || sys == "fcntl" && matches!(args[1], F_DUPFD | F_DUPFD_CLOEXEC)
    }

    /// Reads every descriptor `pid` has now: for the processes traced
    /// from the start (the command while it waits to exec, `-p`'s), whose
    /// descriptors were made before tracing, and which may exit before
    /// their lines are printed.
    pub fn read_all(&mut self, pid: u32) {
        // Through a live thread where the first one has ended, whose
        // table the kernel shows empty.
        let dir = crate::kernel::procmaps::proc_dir(pid);
        let Ok(entries) = std::fs::read_dir(format!("{dir}/fd")) else {
            return;
        };
        self.whole.remove(&pid);
        for entry in entries.flatten() {
            let Some(fd) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
                continue;
            };
            if let Ok(link) = std::fs::read_link(format!("{dir}/fd/{fd}")) {
                self.learn_link(pid, fd, &link);
            }
            // A command waiting to exec holds rtrace's own descriptors
            // until then: close-on-exec, as the exec will show.
            let flags = std::fs::read_to_string(format!("{dir}/fdinfo/{fd}"))
                .ok()
                .and_then(|t| {
                    t.lines()
                        .find_map(|l| l.strip_prefix("flags:"))
                        .and_then(|f| u64::from_str_radix(f.trim(), 8).ok())
                })
                .unwrap_or(0);
            if let Some(k) = self.known.get_mut(&(pid, fd)) {
                k.cloexec = flags & O_CLOEXEC != 0;
            }
        }
        if !self.cwd.contains_key(&pid)
            && let Ok(d) = std::fs::read_link(format!("{dir}/cwd"))
        {
            self.cwd.insert(pid, d);
        }
        self.whole.insert(pid);
    }

    /// Process `child` was forked from `pid`: its descriptors and
    /// directory are its parent's as they are now (told at the fork,
    /// before either runs on).
    pub fn fork(&mut self, pid: u32, child: u32) {
        let inherited: Vec<(i32, Known)> = self
            .known
            .iter()
            .filter(|((p, _), _)| *p == pid)
            .map(|((_, f), k)| (*f, k.clone()))
            .collect();
        for (f, k) in inherited {
            self.known.insert((child, f), k);
        }
        if self.whole.contains(&pid) {
            self.whole.insert(child);
        }
        if let Some(dir) = self.cwd_of(pid) {
            self.cwd.insert(child, dir);
        }
    }

    /// Forgets a process that exited.
    pub fn forget(&mut self, pid: u32) {
        self.known.retain(|&(p, _), _| p != pid);
        self.cwd.remove(&pid);
        self.whole.remove(&pid);
    }

    /// `pid`'s working directory: learned, or read while it lives.
    fn cwd_of(&mut self, pid: u32) -> Option<PathBuf> {
        if let Some(d) = self.cwd.get(&pid) {
            return Some(d.clone());
        }
        let d = link_of(pid, "cwd")?;
        self.cwd.insert(pid, d.clone());
        Some(d)
    }

    fn copy(&mut self, pid: u32, from: i32, to: i32, cloexec: bool) {
        if let Some(path) = self.path(pid, from) {
            self.known.insert((pid, to), Known { path, cloexec });
        }
    }

    /// The path `named` names relative to `pid`'s directory `dir`, with
    /// symbolic links resolved where it still exists, as the kernel
    /// names an open file.
    fn resolve(&mut self, pid: u32, dir: i32, named: &str) -> String {
        let path = if named.starts_with('/') {
            PathBuf::from(named)
        } else {
            let base = if dir == AT_FDCWD {
                self.cwd_of(pid)
            } else {
                self.path(pid, dir).map(PathBuf::from)
            };
            match base {
                Some(b) => b.join(named),
                None => PathBuf::from(named),
            }
        };
        std::fs::canonicalize(&path)
            .unwrap_or(path)
            .to_string_lossy()
            .into_owned()
    }
}

/// Where link `what` of process `pid`'s `/proc` directory points: read
/// from `/proc/PID`, or, where that fails because the first thread has
/// ended (its descriptors and directory are gone with it), from a live
/// thread's ([`crate::kernel::procmaps::proc_dir`]), looked up only then.
fn link_of(pid: u32, what: &str) -> Option<PathBuf> {
    std::fs::read_link(format!("/proc/{pid}/{what}"))
        .or_else(|_| {
            std::fs::read_link(format!("{}/{what}", crate::kernel::procmaps::proc_dir(pid)))
        })
        .ok()
}

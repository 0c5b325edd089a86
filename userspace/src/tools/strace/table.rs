//! How strace shows each syscall's arguments, as tables: a row names a
//! syscall's argument and how it is shown (a flag set, an enum, a
//! number of a C type, a struct read by the kernel side), so that a
//! new call is a row, not code. The rows also say what the kernel side
//! reads of each argument ([`capture_of`]). Calls whose arguments depend
//! on one another (`fcntl`'s arity follows its command, `futex`'s its
//! operation, `clone`'s its flags) have a function of their own
//! ([`WHOLE`]); returns strace shows otherwise than as a number have
//! theirs ([`ret_text`]).

use std::fmt::Write as _;

use rtrace_common::strace::{
    BLOB, CAPTURE_DIRENTS, CAPTURE_FIXED, CAPTURE_LEN_ARG, CAPTURE_LEN_RET, CAPTURE_STR, Capture,
};

/// Names of values, in the order strace prints a set of them.
pub type Names = &'static [(u64, &'static str)];

/// How one argument is shown.
#[derive(Debug, Clone, Copy)]
pub enum Show {
    /// A C `int` (`-1`), whatever the tracepoint says of its sign.
    Int,
    /// An `unsigned int`.
    Uint,
    /// A number in hex (`0x20`), 0 as `0`.
    Hex,
    /// A pointer: `NULL` or hex.
    Ptr,
    /// A mode in octal (`0755`).
    Mode,
    /// A path: read whole, never cut by `-s`.
    Path,
    /// A set of flags; the text for none.
    Flags(Names, &'static str),
    /// One value of a list, else the number.
    Enum(Names),
    /// A value strace spells its own way.
    Custom(fn(u64) -> String),
    /// A struct (or an array) the kernel side reads.
    Struct(Struct),
}

/// A struct the kernel side reads for its line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Struct {
    /// `struct stat` (x86-64).
    Stat,
    /// `struct statx`.
    Statx,
    /// `struct statfs`.
    Statfs,
    /// `struct rlimit64`.
    Rlimit,
    /// The kernel's `struct sigaction` (x86-64).
    Sigaction,
    /// A 64-signal set.
    Sigset,
    /// An `int` the call reads (`[1]`).
    IntIn,
    /// `wait4`'s status.
    WaitStatus,
    /// `pipe`'s two descriptors.
    Fds,
    /// `struct sysinfo`.
    Sysinfo,
    /// `struct utsname`.
    Utsname,
    /// `struct __kernel_timespec`.
    Timespec,
    /// `struct itimerval`.
    Itimerval,
    /// `poll`'s array of `struct pollfd`.
    Pollfds,
    /// A CPU set, as many bytes as the call returns.
    CpuSet,
    /// `getrandom`'s bytes, all in hex.
    Random,
    /// `getdents64`'s buffer: its count of entries.
    Dirents,
    /// `rt_sigreturn`'s frame: the mask it restores.
    SigreturnMask,
    /// `ioctl`'s third argument: what its request says.
    IoctlArg,
}

impl Struct {
    /// What the kernel side reads for it, of argument `arg`.
    fn capture(self, arg: usize) -> Capture {
        let fixed = |size: u32, on_success: bool| Capture {
            how: CAPTURE_FIXED,
            arg: arg as u8,
            on_success: u8::from(on_success),
            size,
            ..Capture::default()
        };
        match self {
            Self::Stat => fixed(144, true),
            Self::Statx => fixed(256, true),
            Self::Statfs => fixed(120, true),
            Self::Rlimit => fixed(16, false),
            Self::Sigaction => fixed(32, false),
            Self::Sigset => fixed(8, false),
            Self::IntIn => fixed(4, false),
            Self::WaitStatus => fixed(4, true),
            Self::Fds => fixed(8, true),
            Self::Sysinfo => fixed(112, true),
            Self::Utsname => fixed(390, true),
            Self::Timespec => fixed(16, false),
            Self::Itimerval => fixed(32, false),
            Self::SigreturnMask => fixed(8, false),
            Self::IoctlArg => fixed(8, true),
            // nfds entries of 8 bytes, read at the exit (with revents).
            Self::Pollfds => Capture {
                how: CAPTURE_LEN_ARG,
                arg: arg as u8,
                len_arg: arg as u8 + 1,
                size: BLOB as u32,
                scale: 8,
                ..Capture::default()
            },
            Self::CpuSet => Capture {
                how: CAPTURE_LEN_RET,
                arg: arg as u8,
                size: BLOB as u32,
                ..Capture::default()
            },
            Self::Random => Capture {
                how: CAPTURE_LEN_RET,
                arg: arg as u8,
                ..Capture::default()
            },
            Self::Dirents => Capture {
                how: CAPTURE_DIRENTS,
                arg: arg as u8,
                ..Capture::default()
            },
        }
    }
}

/// A byte string as strace quotes it: printable ASCII as it is, the
/// usual escapes, other bytes in octal; `cut` adds strace's `...`.
pub fn quote(bytes: &[u8], cut: bool) -> String {
    let mut out = String::with_capacity(bytes.len() + 2);
    out.push('"');
    for (i, &b) in bytes.iter().enumerate() {
        match b {
            b'"' => out.push_str("\\\""),
            b'\\' => out.push_str("\\\\"),
            b'\t' => out.push_str("\\t"),
            b'\n' => out.push_str("\\n"),
            0x0b => out.push_str("\\v"),
            0x0c => out.push_str("\\f"),
            b'\r' => out.push_str("\\r"),
            0x20..=0x7e => out.push(b as char),
            _ => {
                // The shortest octal, unless an octal digit follows.
                let next_digit = bytes.get(i + 1).is_some_and(|c| (b'0'..=b'7').contains(c));
                if next_digit {
                    let _ = write!(out, "\\{b:03o}");
                } else {
                    let _ = write!(out, "\\{b:o}");
                }
            }
        }
    }
    out.push('"');
    if cut {
        out.push_str("...");
    }
    out
}

/// `open`'s flags: the access mode, then the others.
pub fn open_flags(value: u64) -> String {
    let mode = match value & 3 {
        0 => "O_RDONLY",
        1 => "O_WRONLY",
        2 => "O_RDWR",
        _ => "O_ACCMODE",
    };
    let rest = value & !3;
    // strace's order.
    const BITS: [(u64, &str); 17] = [
        (0o100, "O_CREAT"),
        (0o200, "O_EXCL"),
        (0o400, "O_NOCTTY"),
        (0o1000, "O_TRUNC"),
        (0o2000, "O_APPEND"),
        (0o4000, "O_NONBLOCK"),
        (0o4010000, "O_SYNC"),
        (0o10000, "O_DSYNC"),
        (0o20000, "O_ASYNC"),
        (0o40000, "O_DIRECT"),
        (0o100000, "O_LARGEFILE"),
        (0o400000, "O_NOFOLLOW"),
        (0o1000000, "O_NOATIME"),
        (0o2000000, "O_CLOEXEC"),
        (0o10000000, "O_PATH"),
        (0o20200000, "O_TMPFILE"),
        (0o200000, "O_DIRECTORY"),
    ];
    if rest == 0 {
        return mode.to_owned();
    }
    format!("{mode}|{}", flags_or(rest, &BITS, "0"))
}

const SIGNALS: [&str; 32] = [
    "0",
    "SIGHUP",
    "SIGINT",
    "SIGQUIT",
    "SIGILL",
    "SIGTRAP",
    "SIGABRT",
    "SIGBUS",
    "SIGFPE",
    "SIGKILL",
    "SIGUSR1",
    "SIGSEGV",
    "SIGUSR2",
    "SIGPIPE",
    "SIGALRM",
    "SIGTERM",
    "SIGSTKFLT",
    "SIGCHLD",
    "SIGCONT",
    "SIGSTOP",
    "SIGTSTP",
    "SIGTTIN",
    "SIGTTOU",
    "SIGURG",
    "SIGXCPU",
    "SIGXFSZ",
    "SIGVTALRM",
    "SIGPROF",
    "SIGWINCH",
    "SIGIO",
    "SIGPWR",
    "SIGSYS",
];

/// A signal's name (`SIGRT_3` for the real-time ones).
pub fn signal(sig: u64) -> String {
    match SIGNALS.get(sig as usize) {
        Some(n) => (*n).to_owned(),
        None if sig == 32 => "SIGRTMIN".to_owned(),
        None if (33..=64).contains(&sig) => format!("SIGRT_{}", sig - 32),
        None => sig.to_string(),
    }
}

/// `struct stat` (x86-64), abbreviated as strace shows it.
pub fn stat(b: &[u8]) -> String {
    if b.len() < 144 {
        return "0x?".to_owned();
    }
    let u32_at = |o: usize| u32::from_ne_bytes(b[o..o + 4].try_into().unwrap_or([0; 4]));
    let i64_at = |o: usize| i64::from_ne_bytes(b[o..o + 8].try_into().unwrap_or([0; 8]));
    let mode = u32_at(24);
    let mode_text = file_mode(mode);
    // A device shows its number, not its size.
    if matches!(mode & 0o170000, 0o020000 | 0o060000) {
        let dev = i64_at(40) as u64;
        let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
        let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
        return format!("{{st_mode={mode_text}, st_rdev=makedev({major:#x}, {minor:#x}), ...}}");
    }
    format!("{{st_mode={mode_text}, st_size={}, ...}}", i64_at(48))
}

/// `struct timespec`.
pub fn timespec(b: &[u8]) -> String {
    if b.len() < 16 {
        return "0x?".to_owned();
    }
    let sec = i64::from_ne_bytes(b[0..8].try_into().unwrap_or([0; 8]));
    let nsec = i64::from_ne_bytes(b[8..16].try_into().unwrap_or([0; 8]));
    format!("{{tv_sec={sec}, tv_nsec={nsec}}}")
}

/// A string as read with two bytes more than `limit` (its NUL, and one
/// to tell it was cut), as strace shows it.
pub fn string(b: &[u8], limit: usize) -> String {
    let body = b.strip_suffix(&[0]).unwrap_or(b);
    if body.len() > limit {
        quote(&body[..limit], true)
    } else {
        quote(body, false)
    }
}

/// Each row: a syscall, an argument's index, how it is shown.
pub const ROWS: &[(&str, usize, Show)] = &[
    ("lseek", 1, Show::Custom(long)),
    ("lseek", 2, Show::Enum(WHENCE)),
    ("fadvise64", 1, Show::Custom(long)),
    ("fadvise64", 2, Show::Custom(long)),
    ("fadvise64", 3, Show::Enum(FADVISE)),
    ("madvise", 2, Show::Enum(MADVISE)),
    ("mmap", 5, Show::Hex),
    ("rseq", 1, Show::Hex),
    ("rseq", 3, Show::Hex),
    ("arch_prctl", 0, Show::Enum(ARCH_PRCTL)),
    ("arch_prctl", 1, Show::Ptr),
    ("prlimit64", 0, Show::Int),
    ("prlimit64", 1, Show::Enum(RLIMITS)),
    ("prlimit64", 2, Show::Struct(Struct::Rlimit)),
    ("prlimit64", 3, Show::Struct(Struct::Rlimit)),
    ("getrlimit", 0, Show::Enum(RLIMITS)),
    ("setrlimit", 0, Show::Enum(RLIMITS)),
    ("wait4", 0, Show::Int),
    ("wait4", 1, Show::Struct(Struct::WaitStatus)),
    ("wait4", 2, Show::Flags(WAIT_OPTIONS, "0")),
    ("waitid", 0, Show::Enum(IDTYPES)),
    ("waitid", 3, Show::Flags(WAIT_OPTIONS, "0")),
    ("kill", 0, Show::Int),
    ("kill", 1, Show::Custom(signal)),
    ("tkill", 1, Show::Custom(signal)),
    ("tgkill", 2, Show::Custom(signal)),
    ("rt_sigaction", 0, Show::Custom(signal)),
    ("rt_sigaction", 1, Show::Struct(Struct::Sigaction)),
    ("rt_sigaction", 2, Show::Struct(Struct::Sigaction)),
    ("rt_sigprocmask", 0, Show::Enum(SIGMASK_HOW)),
    ("rt_sigprocmask", 1, Show::Struct(Struct::Sigset)),
    ("rt_sigprocmask", 2, Show::Struct(Struct::Sigset)),
    ("rt_sigreturn", 0, Show::Struct(Struct::SigreturnMask)),
    ("getdents64", 1, Show::Struct(Struct::Dirents)),
    ("getdents", 1, Show::Struct(Struct::Dirents)),
    ("newfstatat", 2, Show::Struct(Struct::Stat)),
    ("newfstatat", 3, Show::Flags(AT_FLAGS, "0")),
    ("fstat", 1, Show::Struct(Struct::Stat)),
    ("newfstat", 1, Show::Struct(Struct::Stat)),
    ("stat", 1, Show::Struct(Struct::Stat)),
    ("newstat", 1, Show::Struct(Struct::Stat)),
    ("lstat", 1, Show::Struct(Struct::Stat)),
    ("newlstat", 1, Show::Struct(Struct::Stat)),
    ("statx", 2, Show::Custom(statx_flags)),
    ("statx", 3, Show::Flags(STATX_MASK, "0")),
    ("statx", 4, Show::Struct(Struct::Statx)),
    ("statfs", 1, Show::Struct(Struct::Statfs)),
    ("fstatfs", 1, Show::Struct(Struct::Statfs)),
    ("faccessat2", 3, Show::Flags(ACCESS_AT_FLAGS, "0")),
    ("fchmodat", 2, Show::Mode),
    ("unlinkat", 2, Show::Flags(AT_FLAGS, "0")),
    ("utimensat", 3, Show::Flags(AT_FLAGS, "0")),
    ("fchownat", 4, Show::Flags(AT_FLAGS, "0")),
    ("fchownat", 2, Show::Int),
    ("fchownat", 3, Show::Int),
    ("fchown", 1, Show::Int),
    ("fchown", 2, Show::Int),
    ("chown", 1, Show::Int),
    ("chown", 2, Show::Int),
    ("lchown", 1, Show::Int),
    ("lchown", 2, Show::Int),
    ("linkat", 4, Show::Flags(AT_FLAGS, "0")),
    ("renameat2", 4, Show::Flags(RENAME_FLAGS, "0")),
    ("umask", 0, Show::Mode),
    ("dup3", 2, Show::Flags(CLOEXEC, "0")),
    ("pipe2", 0, Show::Struct(Struct::Fds)),
    ("pipe2", 1, Show::Flags(PIPE_FLAGS, "0")),
    ("pipe", 0, Show::Struct(Struct::Fds)),
    ("getrandom", 0, Show::Struct(Struct::Random)),
    ("getrandom", 2, Show::Flags(GRND, "0")),
    ("uname", 0, Show::Struct(Struct::Utsname)),
    ("newuname", 0, Show::Struct(Struct::Utsname)),
    ("sysinfo", 0, Show::Struct(Struct::Sysinfo)),
    ("sched_getaffinity", 0, Show::Int),
    ("sched_getaffinity", 2, Show::Struct(Struct::CpuSet)),
    ("poll", 0, Show::Struct(Struct::Pollfds)),
    ("poll", 2, Show::Int),
    ("nanosleep", 0, Show::Struct(Struct::Timespec)),
    ("clock_nanosleep", 1, Show::Flags(TIMER_FLAGS, "0")),
    ("clock_nanosleep", 2, Show::Struct(Struct::Timespec)),
    ("setsockopt", 1, Show::Enum(SOCK_LEVELS)),
    ("setsockopt", 3, Show::Struct(Struct::IntIn)),
    ("getsockopt", 1, Show::Enum(SOCK_LEVELS)),
    ("getsockopt", 3, Show::Ptr),
    ("getsockopt", 4, Show::Ptr),
    ("sendto", 3, Show::Flags(MSG_FLAGS, "0")),
    ("recvfrom", 3, Show::Flags(MSG_FLAGS, "0")),
    ("sendmsg", 2, Show::Flags(MSG_FLAGS, "0")),
    ("recvmsg", 2, Show::Flags(MSG_FLAGS, "0")),
    ("shutdown", 1, Show::Enum(SHUT)),
    ("ioctl", 1, Show::Custom(ioctl_request)),
    ("ioctl", 2, Show::Struct(Struct::IoctlArg)),
    ("flock", 1, Show::Flags(LOCK, "0")),
    ("set_tid_address", 0, Show::Ptr),
    ("set_robust_list", 0, Show::Ptr),
    ("mremap", 3, Show::Flags(MREMAP, "0")),
    ("msync", 2, Show::Flags(MSYNC, "0")),
    ("memfd_create", 1, Show::Flags(MFD, "0")),
    ("eventfd2", 1, Show::Flags(PIPE_FLAGS, "0")),
    ("epoll_create1", 0, Show::Flags(CLOEXEC, "0")),
    ("inotify_init1", 0, Show::Flags(PIPE_FLAGS, "0")),
    ("personality", 0, Show::Hex),
    ("prctl", 0, Show::Enum(PRCTL)),
    ("getpriority", 0, Show::Enum(PRIO)),
    ("setpriority", 0, Show::Enum(PRIO)),
    ("exit_group", 0, Show::Int),
    ("exit", 0, Show::Int),
    ("setpgid", 0, Show::Int),
    ("setpgid", 1, Show::Int),
    ("getpgid", 0, Show::Int),
    ("getsid", 0, Show::Int),
    ("sched_setaffinity", 0, Show::Int),
    ("copy_file_range", 1, Show::Ptr),
    ("copy_file_range", 3, Show::Ptr),
    ("sendfile64", 2, Show::Ptr),
    ("close_range", 1, Show::Uint),
    ("close_range", 2, Show::Flags(CLOSE_RANGE, "0")),
    ("socketpair", 3, Show::Struct(Struct::Fds)),
    ("accept4", 3, Show::Flags(SOCK_FLAGS, "0")),
    ("epoll_ctl", 1, Show::Enum(EPOLL_CTL)),
    ("clock_gettime", 1, Show::Struct(Struct::Timespec)),
    ("clock_getres", 1, Show::Struct(Struct::Timespec)),
    ("rt_sigsuspend", 0, Show::Struct(Struct::Sigset)),
    ("rt_sigpending", 0, Show::Struct(Struct::Sigset)),
    ("rt_sigtimedwait", 0, Show::Struct(Struct::Sigset)),
    ("getitimer", 0, Show::Enum(ITIMERS)),
    ("setitimer", 0, Show::Enum(ITIMERS)),
    ("setitimer", 1, Show::Struct(Struct::Itimerval)),
    ("setitimer", 2, Show::Struct(Struct::Itimerval)),
    ("getitimer", 1, Show::Struct(Struct::Itimerval)),
];

/// The row of syscall `sys`'s argument `i`.
pub fn row(sys: &str, i: usize) -> Option<Show> {
    ROWS.iter()
        .find(|&&(s, a, _)| s == sys && a == i)
        .map(|&(_, _, show)| show)
}

/// Argument names that hold a path, in the kernel's formats.
const PATH_ARGS: &[&str] = &[
    "filename",
    "pathname",
    "path",
    "oldname",
    "newname",
    "specialfile",
    "library",
    "dir_name",
    "dev_name",
];

/// Whether argument `name` of C type `c_type` is a path.
pub fn is_path(name: &str, c_type: &str) -> bool {
    c_type.contains("char *") && PATH_ARGS.contains(&name)
}

/// What the kernel side reads of argument `i`, by the rows.
pub fn capture_of(sys: &str, i: usize, name: &str, c_type: &str) -> Option<Capture> {
    match row(sys, i) {
        Some(Show::Struct(s)) => Some(s.capture(i)),
        Some(Show::Path) => Some(path_capture(i)),
        Some(_) => None,
        None if is_path(name, c_type) => Some(path_capture(i)),
        None => None,
    }
}

fn path_capture(i: usize) -> Capture {
    Capture {
        how: CAPTURE_STR,
        arg: i as u8,
        size: BLOB as u32,
        ..Capture::default()
    }
}

/// What a line's decoders know of its call.
pub struct Call<'a> {
    pub sys: &'a str,
    pub args: [u64; 6],
    pub ret: i64,
    /// `-s`.
    pub limit: usize,
    /// The bytes read of each argument, if any.
    pub blobs: [Option<&'a [u8]>; 6],
}

/// Shows argument `i` of `call` as `show` says.
pub fn render(show: Show, call: &Call, i: usize) -> String {
    let v = call.args[i];
    match show {
        Show::Int => (v as i32).to_string(),
        Show::Uint => (v as u32).to_string(),
        Show::Hex => hex(v),
        Show::Ptr => pointer(v),
        Show::Mode => format!("0{:o}", v & 0o7777),
        Show::Path => match call.blobs[i] {
            Some(b) if !b.is_empty() => string(b, usize::MAX),
            _ => pointer(v),
        },
        Show::Flags(names, none) => flags_or(v, names, none),
        Show::Enum(names) => enum_name(v, names),
        Show::Custom(f) => f(v),
        Show::Struct(s) => match call.blobs[i] {
            Some(b) if !b.is_empty() => struct_text(s, b, call, i).unwrap_or_else(|| pointer(v)),
            _ => pointer(v),
        },
    }
}

/// A struct's text, or `None` to show its address.
fn struct_text(s: Struct, b: &[u8], call: &Call, i: usize) -> Option<String> {
    let u32_at = |o: usize| Some(u32::from_ne_bytes(b.get(o..o + 4)?.try_into().ok()?));
    let u64_at = |o: usize| Some(u64::from_ne_bytes(b.get(o..o + 8)?.try_into().ok()?));
    Some(match s {
        Struct::Stat => stat(b),
        Struct::Statx => statx(b)?,
        Struct::Statfs => statfs(b)?,
        Struct::Rlimit => format!(
            "{{rlim_cur={}, rlim_max={}}}",
            rlim(u64_at(0)?),
            rlim(u64_at(8)?)
        ),
        Struct::Sigaction => {
            let handler = match u64_at(0)? {
                0 => "SIG_DFL".to_owned(),
                1 => "SIG_IGN".to_owned(),
                h => format!("{h:#x}"),
            };
            let flags = u64_at(8)?;
            let mut out = format!(
                "{{sa_handler={handler}, sa_mask={}, sa_flags={}",
                sigset(u64_at(24)?),
                flags_or(flags, SA_FLAGS, "0")
            );
            if flags & SA_RESTORER != 0 {
                let _ = write!(out, ", sa_restorer={:#x}", u64_at(16)?);
            }
            out.push('}');
            out
        }
        Struct::Sigset => sigset(u64_at(0)?),
        Struct::IntIn => format!("[{}]", u32_at(0)? as i32),
        Struct::WaitStatus if call.ret <= 0 => return None,
        Struct::WaitStatus => format!("[{}]", wait_status(u32_at(0)?)),
        Struct::Fds => format!("[{}, {}]", u32_at(0)? as i32, u32_at(4)? as i32),
        Struct::Sysinfo => {
            let l = |o| u64_at(o);
            format!(
                "{{uptime={}, loads=[{}, {}, {}], totalram={}, freeram={}, sharedram={}, \
                 bufferram={}, totalswap={}, freeswap={}, procs={}, totalhigh={}, \
                 freehigh={}, mem_unit={}}}",
                l(0)? as i64,
                l(8)?,
                l(16)?,
                l(24)?,
                l(32)?,
                l(40)?,
                l(48)?,
                l(56)?,
                l(64)?,
                l(72)?,
                u32_at(80)? & 0xffff,
                l(88)?,
                l(96)?,
                u32_at(104)?
            )
        }
        Struct::Utsname => {
            let field = |o: usize| {
                let f = b.get(o..o + 65).unwrap_or(&[]);
                let end = f.iter().position(|&c| c == 0).unwrap_or(f.len());
                quote(&f[..end], false)
            };
            format!("{{sysname={}, nodename={}, ...}}", field(0), field(65))
        }
        Struct::Timespec => timespec(b),
        Struct::Itimerval => {
            let l = |o| u64_at(o).map(|v| v as i64);
            format!(
                "{{it_interval={{tv_sec={}, tv_usec={}}}, it_value={{tv_sec={}, tv_usec={}}}}}",
                l(0)?,
                l(8)?,
                l(16)?,
                l(24)?
            )
        }
        Struct::Pollfds => pollfds(b, false)?,
        Struct::CpuSet => cpu_set(b),
        Struct::Random => {
            let shown = &b[..b.len().min(call.limit)];
            let mut out = String::from("\"");
            for c in shown {
                let _ = write!(out, "\\x{c:02x}");
            }
            out.push('"');
            if b.len() > call.limit {
                out.push_str("...");
            }
            out
        }
        Struct::Dirents => format!(
            "{:#x} /* {} entries */",
            call.args[i],
            u32_at(0).unwrap_or(0)
        ),
        Struct::SigreturnMask => format!("{{mask={}}}", sigset(u64_at(0)?)),
        Struct::IoctlArg => ioctl_arg(call.args[1] as u32, b)?,
    })
}

/// A function showing a whole call's arguments; an empty string for
/// one shown as usual.
pub type Whole = fn(&Call) -> Vec<String>;

/// Calls shown by a function of their own: which arguments they show
/// and how depend on one another.
pub const WHOLE: &[(&str, Whole)] = &[
    ("fcntl", fcntl),
    ("futex", futex),
    ("clone", clone),
    ("ioctl", ioctl),
    ("socket", socket),
    ("setsockopt", sockopt),
    ("getsockopt", sockopt),
];

/// The arguments of `call` if a function of [`WHOLE`] shows them;
/// `other` shows an argument its way.
pub fn whole(call: &Call, other: &dyn Fn(usize) -> String) -> Option<Vec<String>> {
    let (_, f) = WHOLE.iter().find(|(s, _)| *s == call.sys)?;
    let mut out = f(call);
    // An empty string stands for "as usual".
    for (i, t) in out.iter_mut().enumerate() {
        if t.is_empty() {
            *t = other(i);
        }
    }
    Some(out)
}

fn fcntl(call: &Call) -> Vec<String> {
    let cmd = call.args[1];
    let fd = (call.args[0] as i32).to_string();
    let name = enum_name(cmd, FCNTL_CMDS);
    let third = match cmd {
        // F_GETFD, F_GETFL, F_GETOWN, F_GETSIG, F_GETLEASE,
        // F_GETPIPE_SZ, F_GET_SEALS: no third argument.
        1 | 3 | 9 | 11 | 1025 | 1032 | 1034 => return vec![fd, name],
        2 => flags_or(call.args[2], FD_FLAGS, "0"),
        4 => open_flags(call.args[2]),
        0 | 1030 | 8 | 10 | 1031 => (call.args[2] as i32).to_string(),
        _ => pointer(call.args[2]),
    };
    vec![fd, name, third]
}

fn futex(call: &Call) -> Vec<String> {
    let a = call.args;
    let op = a[1];
    let mut out = vec![pointer(a[0]), futex_op(op)];
    let val = (a[2] as u32).to_string();
    let timeout = || {
        call.blobs[3]
            .filter(|b| !b.is_empty())
            .map_or_else(|| pointer(a[3]), timespec)
    };
    let bitset = |v: u64| {
        if v as u32 == u32::MAX {
            "FUTEX_BITSET_MATCH_ANY".to_owned()
        } else {
            format!("{:#x}", v as u32)
        }
    };
    match op & 127 {
        // FUTEX_WAIT, FUTEX_LOCK_PI2 and FUTEX_WAIT_REQUEUE_PI wait.
        0 => out.extend([val, timeout()]),
        1 | 7 => out.push(val),
        3 => out.extend([val, (a[3] as u32).to_string(), pointer(a[4])]),
        4 | 12 => out.extend([
            val,
            (a[3] as u32).to_string(),
            pointer(a[4]),
            (a[5] as u32).to_string(),
        ]),
        5 => out.extend([
            val,
            (a[3] as u32).to_string(),
            pointer(a[4]),
            format!("{:#x}", a[5] as u32),
        ]),
        6 | 8 => out.push(timeout()),
        9 => out.extend([val, timeout(), bitset(a[5])]),
        10 => out.extend([val, bitset(a[5])]),
        _ => out.extend([val, pointer(a[3]), pointer(a[4]), hex(a[5])]),
    }
    out
}

fn futex_op(op: u64) -> String {
    let mut s = enum_name(op & 127, FUTEX_OPS);
    if op & 128 != 0 {
        s.push_str("_PRIVATE");
    }
    if op & 256 != 0 {
        s.push_str("|FUTEX_CLOCK_REALTIME");
    }
    s
}

fn clone(call: &Call) -> Vec<String> {
    let a = call.args;
    let flags = a[0];
    let mut out = vec![
        format!("child_stack={}", pointer(a[1])),
        format!("flags={}", clone_flags(flags)),
    ];
    if flags & 0x0010_0000 != 0 {
        out.push(format!("parent_tid={}", pointer(a[2])));
    }
    if flags & 0x0120_0000 != 0 {
        out.push(format!("child_tidptr={}", pointer(a[3])));
    }
    if flags & 0x0008_0000 != 0 {
        out.push(format!("tls={}", pointer(a[4])));
    }
    out
}

fn ioctl(call: &Call) -> Vec<String> {
    let req = call.args[1] as u32;
    let fd = (call.args[0] as i32).to_string();
    // FIOCLEX and FIONCLEX take no third argument.
    if matches!(req, 0x5450 | 0x5451) {
        return vec![fd, ioctl_request(u64::from(req))];
    }
    // FICLONE's is the source's descriptor.
    if req == 0x4004_9409 {
        return vec![fd, String::new(), (call.args[2] as i32).to_string()];
    }
    vec![fd, String::new(), String::new()]
}

/// `ioctl`'s third argument as its request gives it.
fn ioctl_arg(req: u32, b: &[u8]) -> Option<String> {
    let i32_at = |o: usize| Some(i32::from_ne_bytes(b.get(o..o + 4)?.try_into().ok()?));
    let u16_at = |o: usize| Some(u16::from_ne_bytes(b.get(o..o + 2)?.try_into().ok()?));
    Some(match req {
        // FIONREAD, TIOCOUTQ, TIOCGPGRP, TIOCGSID, FIONBIO, TIOCGPTN.
        0x541b | 0x5411 | 0x540f | 0x5429 | 0x5421 | 0x8004_5430 => format!("[{}]", i32_at(0)?),
        0x5413 => format!(
            "{{ws_row={}, ws_col={}, ws_xpixel={}, ws_ypixel={}}}",
            u16_at(0)?,
            u16_at(2)?,
            u16_at(4)?,
            u16_at(6)?
        ),
        _ => return None,
    })
}

/// An `ioctl` request by name.
pub fn ioctl_request(v: u64) -> String {
    match IOCTLS.iter().find(|(n, _)| *n == v & 0xffff_ffff) {
        Some((_, name)) => (*name).to_owned(),
        None => format!("{:#x}", v as u32),
    }
}

/// The return as strace shows it beside its number, for the calls that
/// show more; `None` for the usual.
pub fn ret_text(call: &Call) -> Option<String> {
    let r = call.ret;
    match call.sys {
        "mmap" | "mremap" | "brk" | "shmat" => Some(format!("{r:#x}")),
        "fcntl" if call.args[1] == 1 && r > 0 => Some(format!(
            "{r:#x} (flags {})",
            flags_or(r as u64, FD_FLAGS, "0")
        )),
        "fcntl" if call.args[1] == 3 => Some(format!("{r:#x} (flags {})", open_flags(r as u64))),
        "poll" if r == 0 => Some("0 (Timeout)".to_owned()),
        "poll" => {
            let b = call.blobs[0].filter(|b| !b.is_empty())?;
            Some(format!("{r} ({})", pollfds(b, true)?))
        }
        _ => None,
    }
}

/// An address as strace shows it: `NULL`, else hex.
pub fn pointer(v: u64) -> String {
    if v == 0 {
        "NULL".to_owned()
    } else {
        format!("{v:#x}")
    }
}

fn hex(v: u64) -> String {
    if v == 0 {
        "0".to_owned()
    } else {
        format!("{v:#x}")
    }
}

fn long(v: u64) -> String {
    (v as i64).to_string()
}

/// A set of flags by `names`, in order; what is left in hex; `none` for
/// none.
pub fn flags_or(v: u64, names: Names, none: &str) -> String {
    if v == 0 {
        return none.to_owned();
    }
    let mut parts = Vec::new();
    let mut left = v;
    for &(bit, name) in names {
        if bit != 0 && left & bit == bit {
            parts.push(name);
            left &= !bit;
        }
    }
    let mut out = parts.join("|");
    if left != 0 {
        if !out.is_empty() {
            out.push('|');
        }
        let _ = write!(out, "{left:#x}");
    }
    out
}

/// One value by `names`, else the number.
pub fn enum_name(v: u64, names: Names) -> String {
    match names.iter().find(|(n, _)| *n == v) {
        Some((_, name)) => (*name).to_owned(),
        None => (v as i64).to_string(),
    }
}

/// A limit: `RLIM64_INFINITY`, else kibibytes as `8192*1024`.
fn rlim(v: u64) -> String {
    if v == u64::MAX {
        "RLIM64_INFINITY".to_owned()
    } else if v > 0 && v.is_multiple_of(1024) {
        format!("{}*1024", v / 1024)
    } else {
        v.to_string()
    }
}

/// A signal's short name in a set (`CHLD`, `RTMIN`, `RT_1`).
fn set_member(sig: u32) -> String {
    match sig {
        32 => "RTMIN".to_owned(),
        33..=64 => format!("RT_{}", sig - 32),
        _ => signal(u64::from(sig)).trim_start_matches("SIG").to_owned(),
    }
}

/// A signal set as strace prints it: `[CHLD]`, or `~[...]` with what is
/// not in it when more than half the signals are.
pub fn sigset(mask: u64) -> String {
    let (mask, not) = if mask.count_ones() > 32 {
        (!mask, "~")
    } else {
        (mask, "")
    };
    let names: Vec<String> = (0..64)
        .filter(|b| mask & (1 << b) != 0)
        .map(|b| set_member(b + 1))
        .collect();
    format!("{not}[{}]", names.join(" "))
}

/// `wait`'s status as strace's macros.
fn wait_status(s: u32) -> String {
    let sig = s & 0x7f;
    if sig == 0 {
        format!("{{WIFEXITED(s) && WEXITSTATUS(s) == {}}}", (s >> 8) & 0xff)
    } else if sig == 0x7f {
        format!(
            "{{WIFSTOPPED(s) && WSTOPSIG(s) == {}}}",
            signal(u64::from((s >> 8) & 0xff))
        )
    } else if s == 0xffff {
        "{WIFCONTINUED(s)}".to_owned()
    } else {
        let core = if s & 0x80 != 0 {
            " && WCOREDUMP(s)"
        } else {
            ""
        };
        format!(
            "{{WIFSIGNALED(s) && WTERMSIG(s) == {}{core}}}",
            signal(u64::from(sig))
        )
    }
}

/// `poll`'s array: its requests, or (`revents`) what came back.
fn pollfds(b: &[u8], revents: bool) -> Option<String> {
    let mut parts = Vec::new();
    for e in b.chunks_exact(8) {
        let fd = i32::from_ne_bytes(e[0..4].try_into().ok()?);
        let events = u16::from_ne_bytes(e[4..6].try_into().ok()?);
        let back = u16::from_ne_bytes(e[6..8].try_into().ok()?);
        if revents {
            if back != 0 {
                parts.push(format!(
                    "{{fd={fd}, revents={}}}",
                    flags_or(u64::from(back), POLL, "0")
                ));
            }
        } else {
            parts.push(format!(
                "{{fd={fd}, events={}}}",
                flags_or(u64::from(events), POLL, "0")
            ));
        }
    }
    Some(format!("[{}]", parts.join(", ")))
}

/// A CPU set: the CPUs in it.
fn cpu_set(b: &[u8]) -> String {
    let cpus: Vec<String> = b
        .iter()
        .enumerate()
        .flat_map(|(i, byte)| {
            (0..8)
                .filter(move |bit| byte & (1 << bit) != 0)
                .map(move |bit| (i * 8 + bit).to_string())
        })
        .collect();
    format!("[{}]", cpus.join(" "))
}

/// The file type and permissions of a mode (`S_IFDIR|0755`).
pub fn file_mode(mode: u32) -> String {
    let kind = match mode & 0o170000 {
        0o140000 => "S_IFSOCK",
        0o120000 => "S_IFLNK",
        0o100000 => "S_IFREG",
        0o060000 => "S_IFBLK",
        0o040000 => "S_IFDIR",
        0o020000 => "S_IFCHR",
        0o010000 => "S_IFIFO",
        _ => return format!("{:#o}", mode),
    };
    let mut out = kind.to_owned();
    for (bit, name) in [
        (0o4000, "S_ISUID"),
        (0o2000, "S_ISGID"),
        (0o1000, "S_ISVTX"),
    ] {
        if mode & bit != 0 {
            out.push('|');
            out.push_str(name);
        }
    }
    let _ = write!(out, "|{:04o}", mode & 0o777);
    out
}

fn statx(b: &[u8]) -> Option<String> {
    let u32_at = |o: usize| Some(u32::from_ne_bytes(b.get(o..o + 4)?.try_into().ok()?));
    let u64_at = |o: usize| Some(u64::from_ne_bytes(b.get(o..o + 8)?.try_into().ok()?));
    let mode = u32_at(28)? & 0xffff;
    Some(format!(
        "{{stx_mask={}, stx_attributes={}, stx_mode={}, stx_size={}, ...}}",
        flags_or(u64::from(u32_at(0)?), STATX_MASK, "0"),
        flags_or(u64_at(8)?, STATX_ATTRS, "0"),
        file_mode(mode),
        u64_at(40)?
    ))
}

fn statfs(b: &[u8]) -> Option<String> {
    let u64_at = |o: usize| Some(u64::from_ne_bytes(b.get(o..o + 8)?.try_into().ok()?));
    let u32_at = |o: usize| Some(u32::from_ne_bytes(b.get(o..o + 4)?.try_into().ok()?));
    Some(format!(
        "{{f_type={}, f_bsize={}, f_blocks={}, f_bfree={}, f_bavail={}, f_files={}, \
         f_ffree={}, f_fsid={{val=[{:#x}, {:#x}]}}, f_namelen={}, f_frsize={}, f_flags={}}}",
        enum_name(u64_at(0)?, FS_MAGICS),
        u64_at(8)?,
        u64_at(16)?,
        u64_at(24)?,
        u64_at(32)?,
        u64_at(40)?,
        u64_at(48)?,
        u32_at(56)?,
        u32_at(60)?,
        u64_at(64)?,
        u64_at(72)?,
        flags_or(u64_at(80)?, ST_FLAGS, "0")
    ))
}

/// `statx`'s flags: the sync mode first, then the `AT_` flags.
fn statx_flags(v: u64) -> String {
    let sync = match v & 0x6000 {
        0x2000 => "AT_STATX_FORCE_SYNC",
        0x4000 => "AT_STATX_DONT_SYNC",
        0x6000 => "AT_STATX_SYNC_TYPE",
        _ => "AT_STATX_SYNC_AS_STAT",
    };
    let rest = v & !0x6000;
    if rest == 0 {
        sync.to_owned()
    } else {
        format!("{sync}|{}", flags_or(rest, AT_FLAGS, "0"))
    }
}

/// `clone`'s flags, the exit signal last.
fn clone_flags(v: u64) -> String {
    let sig = v & 0xff;
    let rest = v & !0xff;
    let mut parts = Vec::new();
    if rest != 0 {
        parts.push(flags_or(rest, CLONE_FLAGS, "0"));
    }
    if sig != 0 || parts.is_empty() {
        parts.push(signal(sig));
    }
    parts.join("|")
}

/// `socket`: its protocol is an `IPPROTO_*` for the internet families.
fn socket(call: &Call) -> Vec<String> {
    let inet = matches!(call.args[0], 2 | 10);
    let protocol = if inet {
        enum_name(call.args[2], IPPROTOS)
    } else {
        (call.args[2] as i32).to_string()
    };
    vec![String::new(), String::new(), protocol]
}

/// `setsockopt`, `getsockopt`: the option named within its level.
fn sockopt(call: &Call) -> Vec<String> {
    let names = match call.args[1] {
        0 => IP_OPTS,
        1 => SO_OPTS,
        6 => TCP_OPTS,
        41 => IPV6_OPTS,
        _ => &[],
    };
    let mut out = vec![String::new(); 5];
    out[2] = enum_name(call.args[2], names);
    out
}

const WHENCE: Names = &[
    (0, "SEEK_SET"),
    (1, "SEEK_CUR"),
    (2, "SEEK_END"),
    (3, "SEEK_DATA"),
    (4, "SEEK_HOLE"),
];
const FADVISE: Names = &[
    (0, "POSIX_FADV_NORMAL"),
    (1, "POSIX_FADV_RANDOM"),
    (2, "POSIX_FADV_SEQUENTIAL"),
    (3, "POSIX_FADV_WILLNEED"),
    (4, "POSIX_FADV_DONTNEED"),
    (5, "POSIX_FADV_NOREUSE"),
];
const MADVISE: Names = &[
    (0, "MADV_NORMAL"),
    (1, "MADV_RANDOM"),
    (2, "MADV_SEQUENTIAL"),
    (3, "MADV_WILLNEED"),
    (4, "MADV_DONTNEED"),
    (8, "MADV_FREE"),
    (9, "MADV_REMOVE"),
    (10, "MADV_DONTFORK"),
    (11, "MADV_DOFORK"),
    (12, "MADV_MERGEABLE"),
    (13, "MADV_UNMERGEABLE"),
    (14, "MADV_HUGEPAGE"),
    (15, "MADV_NOHUGEPAGE"),
    (16, "MADV_DONTDUMP"),
    (17, "MADV_DODUMP"),
    (18, "MADV_WIPEONFORK"),
    (19, "MADV_KEEPONFORK"),
    (20, "MADV_COLD"),
    (21, "MADV_PAGEOUT"),
    (22, "MADV_POPULATE_READ"),
    (23, "MADV_POPULATE_WRITE"),
    (24, "MADV_DONTNEED_LOCKED"),
    (25, "MADV_COLLAPSE"),
    (100, "MADV_HWPOISON"),
];
const ARCH_PRCTL: Names = &[
    (0x1001, "ARCH_SET_GS"),
    (0x1002, "ARCH_SET_FS"),
    (0x1003, "ARCH_GET_FS"),
    (0x1004, "ARCH_GET_GS"),
    (0x1011, "ARCH_GET_CPUID"),
    (0x1012, "ARCH_SET_CPUID"),
    (0x1021, "ARCH_GET_XCOMP_SUPP"),
    (0x1022, "ARCH_GET_XCOMP_PERM"),
    (0x1023, "ARCH_REQ_XCOMP_PERM"),
    (0x3001, "ARCH_CET_STATUS"),
];
const RLIMITS: Names = &[
    (0, "RLIMIT_CPU"),
    (1, "RLIMIT_FSIZE"),
    (2, "RLIMIT_DATA"),
    (3, "RLIMIT_STACK"),
    (4, "RLIMIT_CORE"),
    (5, "RLIMIT_RSS"),
    (6, "RLIMIT_NPROC"),
    (7, "RLIMIT_NOFILE"),
    (8, "RLIMIT_MEMLOCK"),
    (9, "RLIMIT_AS"),
    (10, "RLIMIT_LOCKS"),
    (11, "RLIMIT_SIGPENDING"),
    (12, "RLIMIT_MSGQUEUE"),
    (13, "RLIMIT_NICE"),
    (14, "RLIMIT_RTPRIO"),
    (15, "RLIMIT_RTTIME"),
];
const WAIT_OPTIONS: Names = &[
    (1, "WNOHANG"),
    (2, "WSTOPPED"),
    (4, "WEXITED"),
    (8, "WCONTINUED"),
    (0x0100_0000, "WNOWAIT"),
    (0x2000_0000, "__WNOTHREAD"),
    (0x4000_0000, "__WALL"),
    (0x8000_0000, "__WCLONE"),
];
const IDTYPES: Names = &[(0, "P_ALL"), (1, "P_PID"), (2, "P_PGID"), (3, "P_PIDFD")];
const SIGMASK_HOW: Names = &[(0, "SIG_BLOCK"), (1, "SIG_UNBLOCK"), (2, "SIG_SETMASK")];
/// `SA_RESTORER`: `sa_restorer` is shown only with it.
const SA_RESTORER: u64 = 0x0400_0000;
const SA_FLAGS: Names = &[
    (SA_RESTORER, "SA_RESTORER"),
    (0x0800_0000, "SA_ONSTACK"),
    (0x1000_0000, "SA_RESTART"),
    (0x4000_0000, "SA_NODEFER"),
    (0x8000_0000, "SA_RESETHAND"),
    (4, "SA_SIGINFO"),
    (2, "SA_NOCLDWAIT"),
    (1, "SA_NOCLDSTOP"),
];
const AT_FLAGS: Names = &[
    (0x100, "AT_SYMLINK_NOFOLLOW"),
    (0x200, "AT_REMOVEDIR"),
    (0x400, "AT_SYMLINK_FOLLOW"),
    (0x800, "AT_NO_AUTOMOUNT"),
    (0x1000, "AT_EMPTY_PATH"),
    (0x8000, "AT_RECURSIVE"),
];
const ACCESS_AT_FLAGS: Names = &[
    (0x100, "AT_SYMLINK_NOFOLLOW"),
    (0x200, "AT_EACCESS"),
    (0x1000, "AT_EMPTY_PATH"),
];
const RENAME_FLAGS: Names = &[
    (1, "RENAME_NOREPLACE"),
    (2, "RENAME_EXCHANGE"),
    (4, "RENAME_WHITEOUT"),
];
const STATX_MASK: Names = &[
    (0xfff, "STATX_ALL"),
    (0x7ff, "STATX_BASIC_STATS"),
    (1, "STATX_TYPE"),
    (2, "STATX_MODE"),
    (4, "STATX_NLINK"),
    (8, "STATX_UID"),
    (0x10, "STATX_GID"),
    (0x20, "STATX_ATIME"),
    (0x40, "STATX_MTIME"),
    (0x80, "STATX_CTIME"),
    (0x100, "STATX_INO"),
    (0x200, "STATX_SIZE"),
    (0x400, "STATX_BLOCKS"),
    (0x800, "STATX_BTIME"),
    (0x1000, "STATX_MNT_ID"),
    (0x2000, "STATX_DIOALIGN"),
];
const STATX_ATTRS: Names = &[
    (0x4, "STATX_ATTR_COMPRESSED"),
    (0x10, "STATX_ATTR_IMMUTABLE"),
    (0x20, "STATX_ATTR_APPEND"),
    (0x40, "STATX_ATTR_NODUMP"),
    (0x800, "STATX_ATTR_ENCRYPTED"),
    (0x1000, "STATX_ATTR_AUTOMOUNT"),
    (0x2000, "STATX_ATTR_MOUNT_ROOT"),
    (0x10_0000, "STATX_ATTR_VERITY"),
    (0x20_0000, "STATX_ATTR_DAX"),
];
const FS_MAGICS: Names = &[
    (0xef53, "EXT2_SUPER_MAGIC"),
    (0x0102_1994, "TMPFS_MAGIC"),
    (0x9fa0, "PROC_SUPER_MAGIC"),
    (0x6265_6572, "SYSFS_MAGIC"),
    (0x9123_683e, "BTRFS_SUPER_MAGIC"),
    (0x5846_5342, "XFS_SUPER_MAGIC"),
    (0x794c_7630, "OVERLAYFS_SUPER_MAGIC"),
    (0x6367_7270, "CGROUP2_SUPER_MAGIC"),
    (0x1373, "DEVFS_SUPER_MAGIC"),
    (0x6969, "NFS_SUPER_MAGIC"),
    (0x0102_1997, "V9FS_MAGIC"),
];
const ST_FLAGS: Names = &[
    (1, "ST_RDONLY"),
    (2, "ST_NOSUID"),
    (4, "ST_NODEV"),
    (8, "ST_NOEXEC"),
    (16, "ST_SYNCHRONOUS"),
    (0x20, "ST_VALID"),
    (64, "ST_MANDLOCK"),
    (0x400, "ST_NOATIME"),
    (0x800, "ST_NODIRATIME"),
    (0x1000, "ST_RELATIME"),
];
const CLOEXEC: Names = &[(0o2000000, "O_CLOEXEC")];
const PIPE_FLAGS: Names = &[
    (0o2000000, "O_CLOEXEC"),
    (0o4000, "O_NONBLOCK"),
    (0o40000, "O_DIRECT"),
];
const GRND: Names = &[
    (1, "GRND_NONBLOCK"),
    (2, "GRND_RANDOM"),
    (4, "GRND_INSECURE"),
];
const TIMER_FLAGS: Names = &[(1, "TIMER_ABSTIME")];
const SOCK_LEVELS: Names = &[
    (0, "SOL_IP"),
    (1, "SOL_SOCKET"),
    (6, "SOL_TCP"),
    (17, "SOL_UDP"),
    (41, "SOL_IPV6"),
];
const MSG_FLAGS: Names = &[
    (1, "MSG_OOB"),
    (2, "MSG_PEEK"),
    (4, "MSG_DONTROUTE"),
    (8, "MSG_CTRUNC"),
    (0x20, "MSG_TRUNC"),
    (0x40, "MSG_DONTWAIT"),
    (0x80, "MSG_EOR"),
    (0x100, "MSG_WAITALL"),
    (0x2000, "MSG_ERRQUEUE"),
    (0x4000, "MSG_NOSIGNAL"),
    (0x8000, "MSG_MORE"),
    (0x1_0000, "MSG_WAITFORONE"),
    (0x4000_0000, "MSG_CMSG_CLOEXEC"),
];
const IPPROTOS: Names = &[
    (0, "IPPROTO_IP"),
    (1, "IPPROTO_ICMP"),
    (6, "IPPROTO_TCP"),
    (17, "IPPROTO_UDP"),
    (58, "IPPROTO_ICMPV6"),
    (132, "IPPROTO_SCTP"),
    (255, "IPPROTO_RAW"),
];
const SO_OPTS: Names = &[
    (1, "SO_DEBUG"),
    (2, "SO_REUSEADDR"),
    (3, "SO_TYPE"),
    (4, "SO_ERROR"),
    (5, "SO_DONTROUTE"),
    (6, "SO_BROADCAST"),
    (7, "SO_SNDBUF"),
    (8, "SO_RCVBUF"),
    (9, "SO_KEEPALIVE"),
    (10, "SO_OOBINLINE"),
    (13, "SO_LINGER"),
    (15, "SO_REUSEPORT"),
    (16, "SO_PASSCRED"),
    (17, "SO_PEERCRED"),
    (20, "SO_RCVTIMEO_OLD"),
    (21, "SO_SNDTIMEO_OLD"),
    (33, "SO_SNDBUFFORCE"),
    (32, "SO_RCVBUFFORCE"),
];
const IP_OPTS: Names = &[
    (1, "IP_TOS"),
    (2, "IP_TTL"),
    (3, "IP_HDRINCL"),
    (4, "IP_OPTIONS"),
    (8, "IP_RECVOPTS"),
    (10, "IP_MTU_DISCOVER"),
    (11, "IP_RECVERR"),
    (12, "IP_RECVTTL"),
    (14, "IP_MTU"),
    (15, "IP_FREEBIND"),
];
const IPV6_OPTS: Names = &[
    (16, "IPV6_UNICAST_HOPS"),
    (23, "IPV6_MTU_DISCOVER"),
    (25, "IPV6_RECVERR"),
    (26, "IPV6_V6ONLY"),
];
const TCP_OPTS: Names = &[
    (1, "TCP_NODELAY"),
    (2, "TCP_MAXSEG"),
    (3, "TCP_CORK"),
    (4, "TCP_KEEPIDLE"),
    (5, "TCP_KEEPINTVL"),
    (6, "TCP_KEEPCNT"),
    (9, "TCP_DEFER_ACCEPT"),
    (23, "TCP_FASTOPEN"),
];
const SOCK_FLAGS: Names = &[(0o2000000, "SOCK_CLOEXEC"), (0o4000, "SOCK_NONBLOCK")];
const EPOLL_CTL: Names = &[
    (1, "EPOLL_CTL_ADD"),
    (2, "EPOLL_CTL_DEL"),
    (3, "EPOLL_CTL_MOD"),
];
const ITIMERS: Names = &[
    (0, "ITIMER_REAL"),
    (1, "ITIMER_VIRTUAL"),
    (2, "ITIMER_PROF"),
];
const SHUT: Names = &[(0, "SHUT_RD"), (1, "SHUT_WR"), (2, "SHUT_RDWR")];
const LOCK: Names = &[
    (1, "LOCK_SH"),
    (2, "LOCK_EX"),
    (4, "LOCK_NB"),
    (8, "LOCK_UN"),
];
const MREMAP: Names = &[
    (1, "MREMAP_MAYMOVE"),
    (2, "MREMAP_FIXED"),
    (4, "MREMAP_DONTUNMAP"),
];
const MSYNC: Names = &[(1, "MS_ASYNC"), (2, "MS_INVALIDATE"), (4, "MS_SYNC")];
const MFD: Names = &[
    (1, "MFD_CLOEXEC"),
    (2, "MFD_ALLOW_SEALING"),
    (4, "MFD_HUGETLB"),
];
const CLOSE_RANGE: Names = &[(2, "CLOSE_RANGE_UNSHARE"), (4, "CLOSE_RANGE_CLOEXEC")];
const PRIO: Names = &[(0, "PRIO_PROCESS"), (1, "PRIO_PGRP"), (2, "PRIO_USER")];
const PRCTL: Names = &[
    (1, "PR_SET_PDEATHSIG"),
    (2, "PR_GET_PDEATHSIG"),
    (3, "PR_GET_DUMPABLE"),
    (4, "PR_SET_DUMPABLE"),
    (15, "PR_SET_NAME"),
    (16, "PR_GET_NAME"),
    (22, "PR_SET_SECCOMP"),
    (36, "PR_SET_CHILD_SUBREAPER"),
    (38, "PR_SET_NO_NEW_PRIVS"),
    (39, "PR_GET_NO_NEW_PRIVS"),
    (0x5961_6d61, "PR_SET_PTRACER"),
    (0x5356_4d41, "PR_SET_VMA"),
];
const FD_FLAGS: Names = &[(1, "FD_CLOEXEC")];
const FCNTL_CMDS: Names = &[
    (0, "F_DUPFD"),
    (1, "F_GETFD"),
    (2, "F_SETFD"),
    (3, "F_GETFL"),
    (4, "F_SETFL"),
    (5, "F_GETLK"),
    (6, "F_SETLK"),
    (7, "F_SETLKW"),
    (8, "F_SETOWN"),
    (9, "F_GETOWN"),
    (10, "F_SETSIG"),
    (11, "F_GETSIG"),
    (36, "F_OFD_GETLK"),
    (37, "F_OFD_SETLK"),
    (38, "F_OFD_SETLKW"),
    (1024, "F_SETLEASE"),
    (1025, "F_GETLEASE"),
    (1026, "F_NOTIFY"),
    (1030, "F_DUPFD_CLOEXEC"),
    (1031, "F_SETPIPE_SZ"),
    (1032, "F_GETPIPE_SZ"),
    (1033, "F_ADD_SEALS"),
    (1034, "F_GET_SEALS"),
];
const FUTEX_OPS: Names = &[
    (0, "FUTEX_WAIT"),
    (1, "FUTEX_WAKE"),
    (2, "FUTEX_FD"),
    (3, "FUTEX_REQUEUE"),
    (4, "FUTEX_CMP_REQUEUE"),
    (5, "FUTEX_WAKE_OP"),
    (6, "FUTEX_LOCK_PI"),
    (7, "FUTEX_UNLOCK_PI"),
    (8, "FUTEX_TRYLOCK_PI"),
    (9, "FUTEX_WAIT_BITSET"),
    (10, "FUTEX_WAKE_BITSET"),
    (11, "FUTEX_WAIT_REQUEUE_PI"),
    (12, "FUTEX_CMP_REQUEUE_PI"),
    (13, "FUTEX_LOCK_PI2"),
];
const CLONE_FLAGS: Names = &[
    (0x100, "CLONE_VM"),
    (0x200, "CLONE_FS"),
    (0x400, "CLONE_FILES"),
    (0x800, "CLONE_SIGHAND"),
    (0x1000, "CLONE_PIDFD"),
    (0x2000, "CLONE_PTRACE"),
    (0x4000, "CLONE_VFORK"),
    (0x8000, "CLONE_PARENT"),
    (0x1_0000, "CLONE_THREAD"),
    (0x2_0000, "CLONE_NEWNS"),
    (0x4_0000, "CLONE_SYSVSEM"),
    (0x8_0000, "CLONE_SETTLS"),
    (0x10_0000, "CLONE_PARENT_SETTID"),
    (0x20_0000, "CLONE_CHILD_CLEARTID"),
    (0x40_0000, "CLONE_DETACHED"),
    (0x80_0000, "CLONE_UNTRACED"),
    (0x100_0000, "CLONE_CHILD_SETTID"),
    (0x200_0000, "CLONE_NEWCGROUP"),
    (0x400_0000, "CLONE_NEWUTS"),
    (0x800_0000, "CLONE_NEWIPC"),
    (0x1000_0000, "CLONE_NEWUSER"),
    (0x2000_0000, "CLONE_NEWPID"),
    (0x4000_0000, "CLONE_NEWNET"),
    (0x8000_0000, "CLONE_IO"),
];
const POLL: Names = &[
    (1, "POLLIN"),
    (2, "POLLPRI"),
    (4, "POLLOUT"),
    (8, "POLLERR"),
    (0x10, "POLLHUP"),
    (0x20, "POLLNVAL"),
    (0x40, "POLLRDNORM"),
    (0x80, "POLLRDBAND"),
    (0x100, "POLLWRNORM"),
    (0x200, "POLLWRBAND"),
    (0x400, "POLLMSG"),
    (0x2000, "POLLRDHUP"),
];
/// `ioctl` requests by number (x86-64), as strace names them.
const IOCTLS: Names = &[
    (0x5401, "TCGETS"),
    (0x5402, "TCSETS"),
    (0x5403, "TCSETSW"),
    (0x5404, "TCSETSF"),
    (0x5405, "TCGETA"),
    (0x5406, "TCSETA"),
    (0x5407, "TCSETAW"),
    (0x5408, "TCSETAF"),
    (0x5409, "TCSBRK"),
    (0x540a, "TCXONC"),
    (0x540b, "TCFLSH"),
    (0x540c, "TIOCEXCL"),
    (0x540d, "TIOCNXCL"),
    (0x540e, "TIOCSCTTY"),
    (0x540f, "TIOCGPGRP"),
    (0x5410, "TIOCSPGRP"),
    (0x5411, "TIOCOUTQ"),
    (0x5412, "TIOCSTI"),
    (0x5413, "TIOCGWINSZ"),
    (0x5414, "TIOCSWINSZ"),
    (0x5415, "TIOCMGET"),
    (0x541b, "FIONREAD"),
    (0x541c, "TIOCLINUX"),
    (0x541d, "TIOCCONS"),
    (0x5421, "FIONBIO"),
    (0x5422, "TIOCNOTTY"),
    (0x5423, "TIOCSETD"),
    (0x5424, "TIOCGETD"),
    (0x5429, "TIOCGSID"),
    (0x802c_542a, "TCGETS2"),
    (0x402c_542b, "TCSETS2"),
    (0x8004_5430, "TIOCGPTN"),
    (0x4004_5431, "TIOCSPTLCK"),
    (0x5450, "FIONCLEX"),
    (0x5451, "FIOCLEX"),
    (0x5452, "FIOASYNC"),
    (0x4004_9409, "BTRFS_IOC_CLONE or FICLONE"),
    (0x8008_6601, "FS_IOC_GETFLAGS"),
    (0x4008_6602, "FS_IOC_SETFLAGS"),
    (0x0002, "FIGETBSZ"),
    (0x8912, "SIOCGIFCONF"),
    (0x8913, "SIOCGIFFLAGS"),
    (0x8933, "SIOCGIFINDEX"),
];

#[cfg(test)]
mod tests {
    use super::*;

    fn call<'a>(sys: &'a str, args: [u64; 6], ret: i64) -> Call<'a> {
        Call {
            sys,
            args,
            ret,
            limit: 32,
            blobs: [None; 6],
        }
    }

    #[test]
    fn rows_and_whole_calls_read_as_strace_writes_them() {
        let c = call("lseek", [6, 0, 0, 0, 0, 0], 0);
        assert_eq!(render(row("lseek", 2).unwrap(), &c, 2), "SEEK_SET");
        let c = call("fcntl", [0, 1, 0, 0, 0, 0], 0);
        assert_eq!(fcntl(&c), ["0", "F_GETFD"]);
        let c = call("fcntl", [6, 2, 1, 0, 0, 0], 0);
        assert_eq!(fcntl(&c), ["6", "F_SETFD", "FD_CLOEXEC"]);
        let c = call("fcntl", [3, 3, 0, 0, 0, 0], 0x8000);
        assert_eq!(ret_text(&c).unwrap(), "0x8000 (flags O_RDONLY|O_LARGEFILE)");
        assert_eq!(ioctl_request(0x5401), "TCGETS");
        assert_eq!(sigset(1 << 16), "[CHLD]");
        assert_eq!(sigset(!((1 << 31) | (1 << 32))), "~[RTMIN RT_1]");
        assert_eq!(wait_status(0), "{WIFEXITED(s) && WEXITSTATUS(s) == 0}");
        assert_eq!(rlim(8 << 20), "8192*1024");
        assert_eq!(
            clone_flags(0x0120_0011),
            "CLONE_CHILD_CLEARTID|CLONE_CHILD_SETTID|SIGCHLD"
        );
        assert_eq!(futex_op(129), "FUTEX_WAKE_PRIVATE");
        assert_eq!(
            statx_flags(0x900),
            "AT_STATX_SYNC_AS_STAT|AT_SYMLINK_NOFOLLOW|AT_NO_AUTOMOUNT"
        );
        assert_eq!(
            flags_or(0x1_17ff, STATX_MASK, "0"),
            "STATX_BASIC_STATS|STATX_MNT_ID|0x10000"
        );
    }
}

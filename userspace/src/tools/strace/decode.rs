//! What each syscall's arguments are and how strace shows them: the
//! names and C types from the kernel's own syscall tracepoint formats,
//! the numbers' names from the `syscalls` crate, and strace's spellings
//! of flags, structs, strings and errors.

use rtrace_common::strace::{
    BLOBS, CAPTURE_ARGV, CAPTURE_FIXED, CAPTURE_LEN_ARG, CAPTURE_LEN_RET, CAPTURE_STR, Capture,
    MAX_SYSCALLS, Syscall,
};

use crate::kernel::tracefs;

use super::table::flags_or;
/// strace's spellings of strings, signals, flags and structs live with
/// the table of decoders; these are used here and by the tool.
pub use super::table::{open_flags, quote, signal, string, timespec};

/// One argument of a syscall, as its tracepoint declares it.
#[derive(Debug, Clone)]
pub struct Arg {
    pub name: String,
    pub c_type: String,
}

/// One syscall: its name, arguments and what the programs capture.
#[derive(Debug, Clone)]
pub struct Decl {
    pub name: String,
    pub args: Vec<Arg>,
    /// What the programs capture, and of which argument.
    pub plan: Syscall,
}

impl Decl {
    /// The capture slot of argument `i`, if it is captured.
    pub fn slot_of(&self, i: usize) -> Option<usize> {
        self.plan
            .captures
            .iter()
            .position(|c| c.how != 0 && usize::from(c.arg) == i)
    }

    /// Whether argument `i` is written by the call (shown after an
    /// unfinished call resumes).
    pub fn is_output(&self, i: usize) -> bool {
        self.slot_of(i).is_some_and(|s| {
            let c = self.plan.captures[s];
            c.how == CAPTURE_LEN_RET || c.how == CAPTURE_FIXED && c.on_success != 0
        })
    }
}

/// Every syscall of this machine, by number.
#[derive(Debug, Default)]
pub struct Table {
    decls: Vec<Option<Decl>>,
}

/// Syscalls whose buffer is filled by the call, its size the return.
const READS: [&str; 7] = [
    "read",
    "pread64",
    "recvfrom",
    "readlink",
    "readlinkat",
    "getcwd",
    "getrandom",
];
/// Syscalls whose buffer is input, its size another argument.
const WRITES: [&str; 3] = ["write", "pwrite64", "sendto"];

impl Table {
    /// Reads the syscall tracepoints' formats; a syscall without one is
    /// shown with its number's name and no arguments.
    pub fn read() -> Self {
        let mut decls = Vec::with_capacity(MAX_SYSCALLS as usize);
        for nr in 0..MAX_SYSCALLS {
            let Some(sysno) = syscalls::Sysno::new(nr as usize) else {
                decls.push(None);
                continue;
            };
            let name = sysno.name().to_owned();
            // `uname`, `stat` and the like are `newuname`, `newstat` there.
            let format = tracefs::Format::read("syscalls", &format!("sys_enter_{name}"))
                .or_else(|_| tracefs::Format::read("syscalls", &format!("sys_enter_new{name}")));
            let mut args: Vec<Arg> = format
                .map(|f| {
                    f.fields_in_order()
                        .into_iter()
                        .filter(|(n, _)| *n != "__syscall_nr")
                        .map(|(n, f)| Arg {
                            name: n.to_owned(),
                            c_type: f.c_type.clone(),
                        })
                        .collect()
                })
                .unwrap_or_default();
            // strace shows the mask rt_sigreturn restores, which the
            // kernel side puts where its first argument would be.
            if name == "rt_sigreturn" {
                args = vec![Arg {
                    name: "frame".to_owned(),
                    c_type: "void *".to_owned(),
                }];
            }
            let plan = plan(&name, &args);
            decls.push(Some(Decl { name, args, plan }));
        }
        Self { decls }
    }

    /// Syscall `nr`.
    pub fn get(&self, nr: u64) -> Option<&Decl> {
        self.decls.get(nr as usize)?.as_ref()
    }

    /// Every syscall, with its number.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &Decl)> {
        self.decls
            .iter()
            .enumerate()
            .filter_map(|(nr, d)| Some((nr as u32, d.as_ref()?)))
    }

    /// The number of the syscall named `name`.
    pub fn number(&self, name: &str) -> Option<u32> {
        self.iter().find(|(_, d)| d.name == name).map(|(nr, _)| nr)
    }
}

/// What the programs capture of syscall `name`'s arguments.
fn plan(name: &str, args: &[Arg]) -> Syscall {
    let mut out = Syscall::default();
    let mut caps: Vec<Capture> = Vec::new();
    let find = |names: &[&str]| args.iter().position(|a| names.contains(&a.name.as_str()));
    if name == "execve" || name == "execveat" {
        out.at_entry = 1;
        if let Some(f) = find(&["filename"]) {
            caps.push(cap(CAPTURE_STR, f, 0, 0, false));
        }
        if let Some(a) = find(&["argv"]) {
            caps.push(cap(CAPTURE_ARGV, a, 0, 0, false));
        }
    }
    for (i, a) in args.iter().enumerate() {
        if caps.len() >= BLOBS || out.at_entry != 0 {
            break;
        }
        // The rows of strace's decoding say what to read first.
        if let Some(c) = super::table::capture_of(name, i, &a.name, &a.c_type) {
            caps.push(c);
            continue;
        }
        if super::table::row(name, i).is_some() {
            continue;
        }
        let t = a.c_type.as_str();
        let is_buf = matches!(a.name.as_str(), "buf" | "ubuf" | "buff");
        if is_buf && READS.contains(&name) {
            caps.push(cap(CAPTURE_LEN_RET, i, 0, 0, false));
        } else if is_buf && WRITES.contains(&name) {
            if let Some(len) = find(&["count", "len", "size"]) {
                caps.push(cap(CAPTURE_LEN_ARG, i, len, 0, false));
            }
        } else if t == "const char *" || t == "char *" && !is_buf {
            caps.push(cap(CAPTURE_STR, i, 0, 0, false));
        } else if t.starts_with("struct sockaddr") {
            if let Some(len) = find(&["addrlen", "len"]) {
                caps.push(cap(CAPTURE_LEN_ARG, i, len, 0, false));
            }
        } else if t.starts_with("const struct __kernel_timespec") {
            caps.push(cap(CAPTURE_FIXED, i, 0, 16, false));
        }
    }
    for (slot, c) in caps.into_iter().enumerate() {
        out.captures[slot] = c;
    }
    out.shown = 1;
    out
}

fn cap(how: u8, arg: usize, len_arg: usize, size: u32, on_success: bool) -> Capture {
    Capture {
        how,
        arg: arg as u8,
        len_arg: len_arg as u8,
        on_success: u8::from(on_success),
        size,
        scale: 0,
    }
}

/// strace's classes of syscalls (`-e trace=%CLASS`).
pub fn in_class(class: &str, decl: &Decl) -> Option<bool> {
    let name = decl.name.as_str();
    let has = |names: &[&str]| decl.args.iter().any(|a| names.contains(&a.name.as_str()));
    Some(match class {
        "file" => {
            has(&[
                "filename",
                "pathname",
                "path",
                "oldname",
                "newname",
                "specialfile",
                "library",
            ]) || name.ends_with("stat") && !name.starts_with("f")
        }
        "network" | "net" => matches!(
            name,
            "socket"
                | "socketpair"
                | "bind"
                | "listen"
                | "accept"
                | "accept4"
                | "connect"
                | "getsockname"
                | "getpeername"
                | "sendto"
                | "recvfrom"
                | "sendmsg"
                | "recvmsg"
                | "sendmmsg"
                | "recvmmsg"
                | "shutdown"
                | "setsockopt"
                | "getsockopt"
        ),
        "process" => matches!(
            name,
            "fork"
                | "vfork"
                | "clone"
                | "clone3"
                | "execve"
                | "execveat"
                | "exit"
                | "exit_group"
                | "wait4"
                | "waitid"
                | "kill"
                | "tkill"
                | "tgkill"
                | "rt_sigqueueinfo"
                | "rt_tgsigqueueinfo"
                | "pidfd_send_signal"
                | "pidfd_open"
        ),
        "memory" => matches!(
            name,
            "mmap"
                | "munmap"
                | "mprotect"
                | "mremap"
                | "brk"
                | "madvise"
                | "msync"
                | "mlock"
                | "mlock2"
                | "munlock"
                | "mlockall"
                | "munlockall"
                | "mincore"
                | "remap_file_pages"
                | "pkey_mprotect"
        ),
        "signal" => {
            name.starts_with("rt_sig")
                || matches!(
                    name,
                    "kill"
                        | "tkill"
                        | "tgkill"
                        | "sigaltstack"
                        | "signalfd"
                        | "signalfd4"
                        | "pause"
                )
        }
        "desc" => has(&["fd", "fildes", "oldfd", "newfd", "epfd"]),
        _ => return None,
    })
}

/// A signal's `si_code`, as strace names it.
pub fn si_code(sig: u64, code: i64) -> String {
    let named = match (sig, code) {
        (_, 0) => "SI_USER",
        (_, 0x80) => "SI_KERNEL",
        (_, -1) => "SI_QUEUE",
        (_, -2) => "SI_TIMER",
        (_, -3) => "SI_MESGQ",
        (_, -4) => "SI_ASYNCIO",
        (_, -6) => "SI_TKILL",
        (17, 1) => "CLD_EXITED",
        (17, 2) => "CLD_KILLED",
        (17, 3) => "CLD_DUMPED",
        (17, 4) => "CLD_TRAPPED",
        (17, 5) => "CLD_STOPPED",
        (17, 6) => "CLD_CONTINUED",
        (11, 1) => "SEGV_MAPERR",
        (11, 2) => "SEGV_ACCERR",
        _ => return code.to_string(),
    };
    named.to_owned()
}

/// An error's name and description, as strace prints them: the C
/// library's text (`strerror`), the kernel's own for the restart codes
/// no program sees.
pub fn errno(e: i64) -> (String, String) {
    let restart = match e {
        512 => Some(("ERESTARTSYS", "To be restarted if SA_RESTART is set")),
        513 => Some(("ERESTARTNOINTR", "To be restarted")),
        514 => Some(("ERESTARTNOHAND", "To be restarted if no handler")),
        515 => Some(("ENOIOCTLCMD", "No ioctl command")),
        516 => Some(("ERESTART_RESTARTBLOCK", "Interrupted by signal")),
        _ => None,
    };
    if let Some((n, d)) = restart {
        return (n.to_owned(), d.to_owned());
    }
    let err = syscalls::Errno::new(e as i32);
    let name = err
        .name_and_description()
        .map_or_else(|| format!("errno {e}"), |(n, _)| n.to_owned());
    let desc = usize::try_from(e - 1)
        .ok()
        .and_then(|i| GLIBC_ERRORS.get(i))
        .map_or_else(|| format!("Unknown error {e}"), |d| (*d).to_owned());
    (name, desc)
}

/// glibc's `strerror` texts, by error number from 1 (strace prints
/// these, whatever C library rtrace itself is linked with).
const GLIBC_ERRORS: [&str; 133] = [
    "Operation not permitted",
    "No such file or directory",
    "No such process",
    "Interrupted system call",
    "Input/output error",
    "No such device or address",
    "Argument list too long",
    "Exec format error",
    "Bad file descriptor",
    "No child processes",
    "Resource temporarily unavailable",
    "Cannot allocate memory",
    "Permission denied",
    "Bad address",
    "Block device required",
    "Device or resource busy",
    "File exists",
    "Invalid cross-device link",
    "No such device",
    "Not a directory",
    "Is a directory",
    "Invalid argument",
    "Too many open files in system",
    "Too many open files",
    "Inappropriate ioctl for device",
    "Text file busy",
    "File too large",
    "No space left on device",
    "Illegal seek",
    "Read-only file system",
    "Too many links",
    "Broken pipe",
    "Numerical argument out of domain",
    "Numerical result out of range",
    "Resource deadlock avoided",
    "File name too long",
    "No locks available",
    "Function not implemented",
    "Directory not empty",
    "Too many levels of symbolic links",
    "Unknown error 41",
    "No message of desired type",
    "Identifier removed",
    "Channel number out of range",
    "Level 2 not synchronized",
    "Level 3 halted",
    "Level 3 reset",
    "Link number out of range",
    "Protocol driver not attached",
    "No CSI structure available",
    "Level 2 halted",
    "Invalid exchange",
    "Invalid request descriptor",
    "Exchange full",
    "No anode",
    "Invalid request code",
    "Invalid slot",
    "Unknown error 58",
    "Bad font file format",
    "Device not a stream",
    "No data available",
    "Timer expired",
    "Out of streams resources",
    "Machine is not on the network",
    "Package not installed",
    "Object is remote",
    "Link has been severed",
    "Advertise error",
    "Srmount error",
    "Communication error on send",
    "Protocol error",
    "Multihop attempted",
    "RFS specific error",
    "Bad message",
    "Value too large for defined data type",
    "Name not unique on network",
    "File descriptor in bad state",
    "Remote address changed",
    "Can not access a needed shared library",
    "Accessing a corrupted shared library",
    ".lib section in a.out corrupted",
    "Attempting to link in too many shared libraries",
    "Cannot exec a shared library directly",
    "Invalid or incomplete multibyte or wide character",
    "Interrupted system call should be restarted",
    "Streams pipe error",
    "Too many users",
    "Socket operation on non-socket",
    "Destination address required",
    "Message too long",
    "Protocol wrong type for socket",
    "Protocol not available",
    "Protocol not supported",
    "Socket type not supported",
    "Operation not supported",
    "Protocol family not supported",
    "Address family not supported by protocol",
    "Address already in use",
    "Cannot assign requested address",
    "Network is down",
    "Network is unreachable",
    "Network dropped connection on reset",
    "Software caused connection abort",
    "Connection reset by peer",
    "No buffer space available",
    "Transport endpoint is already connected",
    "Transport endpoint is not connected",
    "Cannot send after transport endpoint shutdown",
    "Too many references: cannot splice",
    "Connection timed out",
    "Connection refused",
    "Host is down",
    "No route to host",
    "Operation already in progress",
    "Operation now in progress",
    "Stale file handle",
    "Structure needs cleaning",
    "Not a XENIX named type file",
    "No XENIX semaphores available",
    "Is a named type file",
    "Remote I/O error",
    "Disk quota exceeded",
    "No medium found",
    "Wrong medium type",
    "Operation canceled",
    "Required key not available",
    "Key has expired",
    "Key has been revoked",
    "Key was rejected by service",
    "Owner died",
    "State not recoverable",
    "Operation not possible due to RF-kill",
    "Memory page has hardware error",
];

/// Whether error `e` is one of the restart codes, which strace shows as
/// `= ? ERESTARTSYS (...)`, not `-1`.
pub fn is_restart(e: i64) -> bool {
    (512..=530).contains(&e)
}

/// `struct sockaddr`, as strace shows the families it knows.
pub fn sockaddr(b: &[u8]) -> String {
    let family = b.get(..2).map_or(0, |f| u16::from_ne_bytes([f[0], f[1]]));
    match family {
        2 if b.len() >= 8 => format!(
            "{{sa_family=AF_INET, sin_port=htons({}), sin_addr=inet_addr(\"{}.{}.{}.{}\")}}",
            u16::from_be_bytes([b[2], b[3]]),
            b[4],
            b[5],
            b[6],
            b[7]
        ),
        10 if b.len() >= 24 => {
            let mut addr = [0u8; 16];
            addr.copy_from_slice(&b[8..24]);
            format!(
                "{{sa_family=AF_INET6, sin6_port=htons({}), sin6_flowinfo=htonl(0), \
                 inet_pton(AF_INET6, \"{}\", &sin6_addr), sin6_scope_id=0}}",
                u16::from_be_bytes([b[2], b[3]]),
                std::net::Ipv6Addr::from(addr)
            )
        }
        1 => {
            let path = &b[2.min(b.len())..];
            let end = path.iter().position(|&c| c == 0).unwrap_or(path.len());
            format!(
                "{{sa_family=AF_UNIX, sun_path={}}}",
                quote(&path[..end], false)
            )
        }
        f => format!("{{sa_family={f}}}"),
    }
}

/// An argv, each string read as [`string`] reads one, NUL-separated, as
/// strace's list.
pub fn argv(b: &[u8], limit: usize) -> String {
    let parts: Vec<String> = b
        .split_inclusive(|&c| c == 0)
        .filter(|s| s.len() > 1)
        .map(|s| string(s, limit))
        .collect();
    format!("[{}]", parts.join(", "))
}

/// `access`'s mode.
pub fn access_mode(v: u64) -> String {
    if v == 0 {
        return "F_OK".to_owned();
    }
    flags_or(v, &[(4, "R_OK"), (2, "W_OK"), (1, "X_OK")], "0x0")
}

/// The `AT_*` flags of the `*at` syscalls.
pub fn at_flags(v: u64) -> String {
    if v == 0 {
        return "0".to_owned();
    }
    flags_or(
        v,
        &[
            (0x100, "AT_SYMLINK_NOFOLLOW"),
            (0x200, "AT_REMOVEDIR"),
            (0x400, "AT_SYMLINK_FOLLOW"),
            (0x800, "AT_NO_AUTOMOUNT"),
            (0x1000, "AT_EMPTY_PATH"),
        ],
        "0x0",
    )
}

/// `mmap`'s and `mprotect`'s protection.
pub fn prot(v: u64) -> String {
    if v == 0 {
        return "PROT_NONE".to_owned();
    }
    flags_or(
        v,
        &[(1, "PROT_READ"), (2, "PROT_WRITE"), (4, "PROT_EXEC")],
        "0x0",
    )
}

/// `mmap`'s flags.
pub fn map_flags(v: u64) -> String {
    let kind = match v & 3 {
        1 => "MAP_SHARED",
        2 => "MAP_PRIVATE",
        3 => "MAP_SHARED_VALIDATE",
        _ => "0",
    };
    let rest = v & !3;
    if rest == 0 {
        return kind.to_owned();
    }
    let others = flags_or(
        rest,
        &[
            (0x10, "MAP_FIXED"),
            (0x20, "MAP_ANONYMOUS"),
            (0x100, "MAP_GROWSDOWN"),
            (0x800, "MAP_DENYWRITE"),
            (0x1000, "MAP_EXECUTABLE"),
            (0x2000, "MAP_LOCKED"),
            (0x4000, "MAP_NORESERVE"),
            (0x8000, "MAP_POPULATE"),
            (0x10000, "MAP_NONBLOCK"),
            (0x20000, "MAP_STACK"),
            (0x40000, "MAP_HUGETLB"),
            (0x100000, "MAP_FIXED_NOREPLACE"),
        ],
        "0x0",
    );
    format!("{kind}|{others}")
}

/// A socket's family.
pub fn family(v: u64) -> String {
    match v {
        1 => "AF_UNIX".into(),
        2 => "AF_INET".into(),
        10 => "AF_INET6".into(),
        16 => "AF_NETLINK".into(),
        17 => "AF_PACKET".into(),
        v => v.to_string(),
    }
}

/// A socket's type and its flags.
pub fn sock_type(v: u64) -> String {
    let kind = match v & 0xf {
        1 => "SOCK_STREAM",
        2 => "SOCK_DGRAM",
        3 => "SOCK_RAW",
        5 => "SOCK_SEQPACKET",
        _ => "0",
    };
    let mut s = kind.to_owned();
    if v & 0o2000000 != 0 {
        s.push_str("|SOCK_CLOEXEC");
    }
    if v & 0o4000 != 0 {
        s.push_str("|SOCK_NONBLOCK");
    }
    s
}

/// A clock's name.
pub fn clock(v: u64) -> String {
    match v {
        0 => "CLOCK_REALTIME".into(),
        1 => "CLOCK_MONOTONIC".into(),
        2 => "CLOCK_PROCESS_CPUTIME_ID".into(),
        3 => "CLOCK_THREAD_CPUTIME_ID".into(),
        4 => "CLOCK_MONOTONIC_RAW".into(),
        7 => "CLOCK_BOOTTIME".into(),
        v => v.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_flags_and_structs_read_as_strace_writes_them() {
        assert_eq!(quote(b"a\"b\n\x01", false), "\"a\\\"b\\n\\1\"");
        assert_eq!(quote(b"\x001", true), "\"\\0001\"...");
        assert_eq!(quote(b"\x008", false), "\"\\08\"");
        assert_eq!(open_flags(0o2000000), "O_RDONLY|O_CLOEXEC");
        assert_eq!(open_flags(0o1101), "O_WRONLY|O_CREAT|O_TRUNC");
        assert_eq!(prot(3), "PROT_READ|PROT_WRITE");
        assert_eq!(map_flags(0x22), "MAP_PRIVATE|MAP_ANONYMOUS");
        assert_eq!(errno(2).0, "ENOENT");
        assert_eq!(errno(2).1, "No such file or directory");
        assert_eq!(errno(25).1, "Inappropriate ioctl for device");
        let mut sa = vec![2, 0, 0, 1, 127, 0, 0, 1];
        sa.extend([0; 8]);
        assert_eq!(
            sockaddr(&sa),
            "{sa_family=AF_INET, sin_port=htons(1), sin_addr=inet_addr(\"127.0.0.1\")}"
        );
        assert_eq!(argv(b"ls\0-l\0", 32), "[\"ls\", \"-l\"]");
        assert_eq!(string(b"abcd\0", 3), "\"abc\"...");
        assert_eq!(string(b"abc\0", 3), "\"abc\"");
        assert_eq!(signal(10), "SIGUSR1");
    }
}

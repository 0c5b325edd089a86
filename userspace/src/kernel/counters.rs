//! The kernel's perf counters in counting mode (`perf stat`'s): opened on
//! a CPU, a task or a cgroup, read as a running total.

use std::{
    fs::File,
    io::Read as _,
    os::fd::{AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd},
    path::Path,
};

use aya_obj::generated::perf_event_attr;

/// `PERF_FORMAT_TOTAL_TIME_ENABLED | PERF_FORMAT_TOTAL_TIME_RUNNING`: a
/// read gives the value and how long the counter was enabled and running,
/// which differ where the PMU multiplexes counters.
const READ_FORMAT: u64 = 1 | 2;
const PERF_FLAG_FD_CLOEXEC: u64 = 8;
const PERF_FLAG_PID_CGROUP: u64 = 4;

/// What a counter counts: the events of one task, of every task on one
/// CPU, or of one cgroup's tasks on one CPU.
#[derive(Debug, Clone, Copy)]
pub enum On<'a> {
    /// Thread `tid`, and the threads and processes it starts with
    /// `inherit`.
    Task {
        /// The thread.
        tid: u32,
        /// Whether its children are counted too.
        inherit: bool,
    },
    /// Every task while it runs on `cpu`.
    Cpu(u32),
    /// The tasks of the cgroup (and those below it) while they run on
    /// `cpu`.
    Cgroup(&'a File, u32),
}

impl std::fmt::Display for On<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Task { tid, .. } => write!(f, "thread {tid}"),
            Self::Cpu(cpu) => write!(f, "CPU {cpu}"),
            Self::Cgroup(_, cpu) => write!(f, "the cgroup on CPU {cpu}"),
        }
    }
}

/// What to count, and in which modes.
#[derive(Debug, Clone, Copy)]
pub struct Spec {
    /// `perf_event_attr.type`.
    pub kind: u32,
    /// `perf_event_attr.config`.
    pub config: u64,
    /// Leave out user mode.
    pub exclude_user: bool,
    /// Leave out kernel mode.
    pub exclude_kernel: bool,
}

/// One open counter.
#[derive(Debug)]
pub struct Counter {
    file: File,
}

/// A counter's running total.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reading {
    /// Events counted.
    pub value: u64,
    /// Nanoseconds the counter was enabled.
    pub enabled: u64,
    /// Nanoseconds it was counting (less where counters took turns).
    pub running: u64,
}

impl std::ops::AddAssign for Reading {
    fn add_assign(&mut self, o: Self) {
        self.value += o.value;
        self.enabled += o.enabled;
        self.running += o.running;
    }
}

impl Reading {
    /// The value scaled up for the time it was not counting, as perf
    /// does; the value itself where it always counted.
    pub fn scaled(&self) -> u64 {
        if self.running == 0 || self.running >= self.enabled {
            self.value
        } else {
            (self.value as u128 * self.enabled as u128 / self.running as u128) as u64
        }
    }
}

impl Counter {
    /// Opens a counter of `spec` on `on`, counting from now.
    pub fn open(spec: Spec, on: On<'_>) -> std::io::Result<Self> {
        // SAFETY: a plain C struct, all zeroes valid.
        let mut attr: perf_event_attr = unsafe { std::mem::zeroed() };
        attr.type_ = spec.kind;
        attr.size = std::mem::size_of::<perf_event_attr>() as u32;
        attr.config = spec.config;
        attr.read_format = READ_FORMAT;
        attr.set_exclude_user(u64::from(spec.exclude_user));
        attr.set_exclude_kernel(u64::from(spec.exclude_kernel));
        // The hypervisor's time is not the traced tasks' (perf's default
        // for an unprivileged count, and no guest here has one).
        attr.set_exclude_hv(1);
        let (pid, cpu, flags) = match on {
            On::Task { tid, inherit } => {
                attr.set_inherit(u64::from(inherit));
                (tid as i32, -1, 0)
            }
            On::Cpu(cpu) => (-1, cpu as i32, 0),
            On::Cgroup(dir, cpu) => (dir.as_raw_fd(), cpu as i32, PERF_FLAG_PID_CGROUP),
        };
        // SAFETY: `attr` outlives the call; the kernel copies it.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_perf_event_open,
                &raw const attr,
                pid,
                cpu,
                -1,
                PERF_FLAG_FD_CLOEXEC | flags,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a descriptor just opened, owned from here.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        Ok(Self {
            file: File::from(fd),
        })
    }

    /// The total so far.
    pub fn read(&mut self) -> std::io::Result<Reading> {
        let mut buf = [0u8; 24];
        self.file.read_exact(&mut buf)?;
        let word =
            |i: usize| u64::from_ne_bytes(buf[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]));
        Ok(Reading {
            value: word(0),
            enabled: word(1),
            running: word(2),
        })
    }
}

/// Opens a cgroup v2 directory for [`On::Cgroup`].
pub fn cgroup_dir(path: &Path) -> std::io::Result<File> {
    File::open(path)
}

/// `perf_event_attr.type` of a tracepoint.
const PERF_TYPE_TRACEPOINT: u32 = 2;
/// The attach type of a link from a program to a perf event, with a
/// cookie (Linux 5.15+).
const BPF_PERF_EVENT: u64 = 41;

/// Attaches loaded tracepoint program `prog` to tracepoint `id` (its
/// tracefs id) through a BPF link carrying `cookie`, which the program
/// reads with `bpf_get_attach_cookie`: one program can so tell the
/// tracepoints it serves apart, since the kernel overwrites the start of
/// each record (its `common_type`) with a pointer to the registers before
/// a program sees it. The link holds the perf event; dropping the
/// returned descriptor detaches.
pub fn tracepoint_link(prog: BorrowedFd<'_>, id: u64, cookie: u64) -> std::io::Result<OwnedFd> {
    // SAFETY: a plain C struct, all zeroes valid.
    let mut attr: perf_event_attr = unsafe { std::mem::zeroed() };
    attr.type_ = PERF_TYPE_TRACEPOINT;
    attr.size = std::mem::size_of::<perf_event_attr>() as u32;
    attr.config = id;
    attr.__bindgen_anon_2.wakeup_events = 1;
    // SAFETY: `attr` outlives the call; the kernel copies it.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &raw const attr,
            -1,
            0,
            -1,
            PERF_FLAG_FD_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor just opened, owned from here.
    let event = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    // union bpf_attr's link_create: prog_fd, target_fd, attach_type,
    // flags, then perf_event.bpf_cookie.
    let mut link = [0u64; 8];
    link[0] = prog.as_raw_fd() as u64 | (event.as_raw_fd() as u64) << 32;
    link[1] = BPF_PERF_EVENT;
    link[2] = cookie;
    use crate::kernel::batch::{BPF_LINK_CREATE, bpf_fd};
    bpf_fd(BPF_LINK_CREATE, &mut link)
}

//! Reading a process's mappings (`/proc/PID/maps`): one parser for the
//! symbolizer, the unwinder, uprobe targets and the mechanism probes.

/// One line of `/proc/PID/maps`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    /// First address.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// Whether the mapping is executable.
    pub exec: bool,
    /// Offset of `start` in the mapped file.
    pub offset: u64,
    /// The file's inode, 0 for anonymous memory.
    pub inode: u64,
    /// The file's device, as `major:minor` (`fe:01`).
    pub dev: (u32, u32),
    /// The path as the kernel shows it (`/usr/lib/x.so`, `[vdso]`, and a
    /// ` (deleted)` suffix for replaced files), or empty.
    pub name: String,
}

impl Mapping {
    /// Its file's key: the device and inode, as one file mapped in many
    /// processes (or in a container) is known by.
    pub fn file_key(&self) -> (u64, u64) {
        (
            u64::from(self.dev.0) << 32 | u64::from(self.dev.1),
            self.inode,
        )
    }

    /// Parses one line.
    pub fn parse(line: &str) -> Option<Self> {
        let mut fields = line.splitn(6, ' ');
        let (start, end) = fields.next()?.split_once('-')?;
        let perms = fields.next()?;
        let offset = u64::from_str_radix(fields.next()?, 16).ok()?;
        let (major, minor) = fields.next()?.split_once(':')?;
        let dev = (
            u32::from_str_radix(major, 16).ok()?,
            u32::from_str_radix(minor, 16).ok()?,
        );
        let inode = fields.next()?.parse().ok()?;
        Some(Self {
            start: u64::from_str_radix(start, 16).ok()?,
            end: u64::from_str_radix(end, 16).ok()?,
            exec: perms.as_bytes().get(2) == Some(&b'x'),
            offset,
            inode,
            dev,
            name: fields.next().unwrap_or("").trim_start().to_owned(),
        })
    }

    /// The range as `/proc/PID/map_files` names it.
    pub fn range(&self) -> String {
        format!("{:x}-{:x}", self.start, self.end)
    }

    /// The file's path without the kernel's ` (deleted)` mark, if it is a
    /// file.
    pub fn path(&self) -> Option<&str> {
        (self.inode != 0 && self.name.starts_with('/'))
            .then(|| self.name.strip_suffix(" (deleted)").unwrap_or(&self.name))
    }

    /// Opens the mapped file of process `proc_dir` (`/proc/PID` or
    /// `/proc/self`): through `map_files`, which crosses mount namespaces
    /// and finds deleted or replaced files but needs CAP_SYS_ADMIN, else
    /// through the process's root, which needs leave to trace it
    /// (CAP_SYS_PTRACE for another user's), else by its path here, taken
    /// only if the file there is the one mapped (the same device and
    /// inode): an unprivileged profile of root's processes still opens the
    /// libraries every user may read. The error is the first way's when
    /// no way worked.
    pub fn open(&self, proc_dir: &str) -> std::io::Result<std::fs::File> {
        use std::os::unix::fs::MetadataExt as _;
        let Some(path) = self.path() else {
            return Err(std::io::Error::from(std::io::ErrorKind::NotFound));
        };
        let first = match std::fs::File::open(format!("{proc_dir}/map_files/{}", self.range())) {
            Ok(f) => return Ok(f),
            Err(e) => e,
        };
        if let Ok(f) = std::fs::File::open(format!("{proc_dir}/root{path}")) {
            return Ok(f);
        }
        let here = std::fs::File::open(path)
            .and_then(|f| Ok((f.metadata()?, f)))
            .ok()
            .filter(|(meta, _)| {
                let dev = meta.dev();
                meta.ino() == self.inode && (libc::major(dev), libc::minor(dev)) == self.dev
            });
        match here {
            Some((_, f)) => Ok(f),
            None => Err(first),
        }
    }

    /// Whether `addr` is in the mapping.
    pub fn contains(&self, addr: u64) -> bool {
        self.start <= addr && addr < self.end
    }
}

/// A process: its id, and when it started, which tell it from a later
/// process given the same id once it has exited (a build's pids wrap;
/// `ns_last_pid` hands one out again at will).
///
/// Its start is the kernel's `task->start_boottime` of its main thread,
/// in nanoseconds since boot, where the kernel told it; a process seen
/// only through `/proc` has it from `/proc/PID/stat` (field 22, the same
/// clock in clock ticks), so two processes are one if they have the same
/// id and started in the same tick (a pid is not handed out twice within
/// 10 ms). A start of 0 is unknown (a profile from elsewhere, a record
/// without one): such a process is whoever has the id.
#[derive(Clone, Copy, Debug, Default)]
pub struct Proc {
    /// The process (thread group) id.
    pub pid: u32,
    /// When it started, in nanoseconds since boot; 0: unknown.
    pub born: u64,
}

impl Proc {
    /// Process `pid`, started `born` nanoseconds after boot (0: unknown).
    pub const fn new(pid: u32, born: u64) -> Self {
        Self { pid, born }
    }

    /// The process that has id `pid` now, by `/proc/PID/stat`; its start
    /// unknown (0) if it is gone.
    pub fn now(pid: u32) -> Self {
        Self {
            pid,
            born: start_ticks(pid).map_or(0, |t| t * tick_ns()),
        }
    }

    /// When it started, in clock ticks since boot, as `/proc/PID/stat`
    /// and `ps` give it.
    pub fn start_ticks(&self) -> u64 {
        self.born / tick_ns()
    }

    /// What the kernel's runtime walks mix into the hashes of what they
    /// told user space (`PyProc::salt`, `JavaProc::salt`, `V8Proc::salt`):
    /// its start, folded, so that a later process given its pid is told
    /// its frames anew.
    pub fn salt(&self) -> u32 {
        let t = self.start_ticks();
        (t ^ (t >> 32)) as u32
    }

    /// Whether `/proc/PID` is this process (not gone, nor another process
    /// given its id since): what is read there is its own. A process of
    /// unknown start is taken to be whoever has its id.
    pub fn alive(&self) -> bool {
        match start_ticks(self.pid) {
            Some(t) => self.born == 0 || t == self.start_ticks(),
            None => false,
        }
    }

    /// When it started, in nanoseconds since the epoch (0: unknown).
    pub fn born_wall_ns(&self) -> u64 {
        if self.born == 0 {
            return 0;
        }
        boot_wall_ns() + self.born
    }
}

/// One process whatever precision its start was learnt with.
impl PartialEq for Proc {
    fn eq(&self, other: &Self) -> bool {
        self.pid == other.pid && self.start_ticks() == other.start_ticks()
    }
}

impl Eq for Proc {}

impl std::hash::Hash for Proc {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        (self.pid, self.start_ticks()).hash(state);
    }
}

impl PartialOrd for Proc {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Proc {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.pid, self.start_ticks()).cmp(&(other.pid, other.start_ticks()))
    }
}

/// Nanoseconds a clock tick (`sysconf(_SC_CLK_TCK)`: 100 a second on
/// Linux), the unit of `/proc/PID/stat`'s times.
/// Asked once: it is used in every hash of a [`Proc`].
pub fn tick_ns() -> u64 {
    static TICK: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *TICK.get_or_init(|| {
        // SAFETY: sysconf has no preconditions.
        let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        1_000_000_000 / u64::try_from(t).ok().filter(|&t| t > 0).unwrap_or(100)
    })
}

/// When the machine booted, in nanoseconds since the epoch: the
/// realtime clock less the boot-time clock (which counts suspend, as
/// `start_boottime` does), read once, so that every start converted
/// with it stays what it was.
///
/// The realtime read is taken between two boot-time reads, and of a few
/// tries the one whose boot-time reads lie closest together is kept: a
/// thread preempted between two plain reads (up to 4 ms apart in 20
/// million tries beside two busy loops) would put every exit converted
/// with it early by as much, and a perf map written 25 us before its
/// process's exit (a file time from the fine clock, as tmpfs gives one
/// looked at since) would be taken for the pid's next process's.
pub fn boot_wall_ns() -> u64 {
    static BOOT: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *BOOT.get_or_init(|| {
        let read = |clock| {
            let mut ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: `ts` is a valid timespec to write.
            unsafe { libc::clock_gettime(clock, &mut ts) };
            ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
        };
        let mut best = (u64::MAX, 0);
        for _ in 0..16 {
            let before = read(libc::CLOCK_BOOTTIME);
            let wall = read(libc::CLOCK_REALTIME);
            let after = read(libc::CLOCK_BOOTTIME);
            let gap = after.saturating_sub(before);
            if gap < best.0 {
                best = (gap, wall.saturating_sub(before + gap / 2));
            }
        }
        best.1
    })
}

/// How far a file's modification time may fall before the moment it
/// was written: the kernel stamps files from its coarse clock, which
/// holds the time of the last tick's update (`CLOCK_REALTIME_COARSE`'s
/// resolution, 4 ms at 250 Hz) and lags further when a tick is late.
/// Measured on a 250 Hz VM, a file written at once carried a time up to
/// 5.2 ms before the write, so one tick was not enough (a JIT map written
/// in a process's first millisecond was once taken for an earlier
/// process's): two ticks are allowed. A map an earlier process of the pid
/// wrote less than two ticks before this one started cannot be told from
/// this one's own.
pub fn mtime_slack_ns() -> u64 {
    static SLACK: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *SLACK.get_or_init(|| {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid timespec to write.
        let ok = unsafe { libc::clock_getres(libc::CLOCK_REALTIME_COARSE, &mut ts) } == 0;
        let tick = if ok {
            ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
        } else {
            10_000_000
        };
        2 * tick
    })
}

/// When process `pid` started, in clock ticks since boot (field 22 of
/// `/proc/PID/stat`, after the command, which may hold spaces and
/// parentheses); `None` if it is gone.
pub fn start_ticks(pid: u32) -> Option<u64> {
    stat_fields(pid, [22]).map(|[t]| t)
}

/// Numeric fields of `/proc/PID/stat`, numbered from 1 as proc(5) numbers
/// them (22 the start, 14 and 15 the user and system time in clock
/// ticks); `None` if the process is gone or a field is not a number.
pub fn stat_fields<const N: usize>(pid: u32, fields: [usize; N]) -> Option<[u64; N]> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command, which may hold spaces and parentheses: fields
    // from the third (state) on.
    let (_, rest) = stat.rsplit_once(')')?;
    let rest: Vec<&str> = rest.split_whitespace().collect();
    let mut out = [0; N];
    for (o, f) in out.iter_mut().zip(fields) {
        *o = rest.get(f.checked_sub(3)?)?.parse().ok()?;
    }
    Some(out)
}

/// The directory of process `pid`'s memory in `/proc`: `/proc/PID`, or,
/// where its first thread has ended (`pthread_exit` in `main`) and its
/// others run on, a live one's `/proc/TID` (not listed, but there, and
/// with `map_files`, which `/proc/PID/task/TID` lacks): the kernel shows
/// the ended thread's `maps`, `map_files`, `exe`, `root` and `mem` empty
/// or closed, the process's memory through the live threads alone. (A
/// process that has ended entirely has no other thread: `/proc/PID`.)
///
/// A thread has ended once it is a zombie, or from the start of its exit
/// (`PF_EXITING`, set before its memory is let go). Each look reads one
/// thread's own `stat`, never the process's, which sums every thread's
/// times. A thread's directory is held open ([`ProcDir`]).
pub fn proc_dir(pid: u32) -> ProcDir {
    let own = || ProcDir {
        path: format!("/proc/{pid}"),
        numbered: format!("/proc/{pid}"),
        _held: None,
    };
    if !ended(&format!("/proc/{pid}/task/{pid}")) {
        return own();
    }
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|t| t.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&tid| tid != pid)
        .find_map(|tid| hold(pid, tid))
        .unwrap_or_else(own)
}

/// Whether the thread whose directory is `dir` has ended (see
/// [`proc_dir`]), or cannot be read.
fn ended(dir: &str) -> bool {
    // Fields from the third (state) on: the state, then flags is the 9th.
    const PF_EXITING: u64 = 0x4;
    let Ok(stat) = std::fs::read_to_string(format!("{dir}/stat")) else {
        return true;
    };
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return true;
    };
    let mut fields = rest.split_whitespace();
    let state = fields.next().unwrap_or("X");
    let flags: u64 = fields.nth(5).and_then(|f| f.parse().ok()).unwrap_or(0);
    state.starts_with(['Z', 'X']) || flags & PF_EXITING != 0
}

/// Thread `tid`'s directory, held open, if it is a live thread of
/// process `pid`: checked through the directory held, so that a thread id
/// given to another process's thread between the listing and the opening
/// is never taken for one of `pid`'s.
fn hold(pid: u32, tid: u32) -> Option<ProcDir> {
    let held = std::fs::File::open(format!("/proc/{tid}")).ok()?;
    let path = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&held));
    let status = std::fs::read_to_string(format!("{path}/status")).ok()?;
    let tgid = status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse::<u32>().ok())?;
    (tgid == pid && !ended(&format!("/proc/{pid}/task/{tid}"))).then_some(ProcDir {
        path,
        numbered: format!("/proc/{tid}"),
        _held: Some(held),
    })
}

/// A process's directory in `/proc`, as [`proc_dir`] chose it, used as a
/// path (`format!("{dir}/maps")`) while it lives. A thread's directory is
/// held open and named through the descriptor (`/proc/self/fd/N`): the
/// kernel ties an open `/proc` directory to its task, so that once the
/// thread has ended its files fail to read, where `/proc/TID` would then
/// be the files of whatever process is next given that id.
#[derive(Debug)]
pub struct ProcDir {
    path: String,
    /// The same directory by its id, for a path that must outlive this.
    numbered: String,
    _held: Option<std::fs::File>,
}

impl ProcDir {
    /// This process's own, `/proc/self`.
    pub fn this() -> Self {
        Self {
            path: "/proc/self".to_owned(),
            numbered: "/proc/self".to_owned(),
            _held: None,
        }
    }

    /// The directory by its id (`/proc/PID` or `/proc/TID`), for a path
    /// handed on and used after `self` is gone (a uprobe's file, which the
    /// kernel opens when it attaches): one that another process could
    /// have by then, if the thread ended.
    pub fn numbered(&self) -> &str {
        &self.numbered
    }
}

impl std::ops::Deref for ProcDir {
    type Target = str;

    fn deref(&self) -> &str {
        &self.path
    }
}

impl std::fmt::Display for ProcDir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.path)
    }
}

/// The mappings in `dir` (a [`proc_dir`]).
pub fn read_in(dir: &str) -> std::io::Result<Vec<Mapping>> {
    Ok(std::fs::read_to_string(format!("{dir}/maps"))?
        .lines()
        .filter_map(Mapping::parse)
        .collect())
}

/// Whether task `id` (a process or a thread) still exists: `/proc/ID` is
/// there for threads as well, though only processes are listed.
pub fn alive(id: u32) -> bool {
    std::path::Path::new(&format!("/proc/{id}")).exists()
}

/// A process's mappings, read once for the several readers of one event
/// (each runtime's finder), and only if one asks, with the directory
/// they were read from, so that the readers' other files come from the
/// same thread's view (one [`proc_dir`] look for the event, not one a
/// reader).
pub struct MapsOnce {
    who: Proc,
    read: std::cell::OnceCell<Option<(ProcDir, Vec<Mapping>)>>,
}

impl MapsOnce {
    /// Process `who`'s, not read yet.
    pub fn new(who: Proc) -> Self {
        Self {
            who,
            read: std::cell::OnceCell::new(),
        }
    }

    /// The process.
    pub fn who(&self) -> Proc {
        self.who
    }

    /// The mappings and their directory, read at the first call; `None`
    /// if they could not be read or the process was gone by then
    /// (checked after the read, so that the pid's next process never
    /// lends its mappings).
    fn read(&self) -> Option<&(ProcDir, Vec<Mapping>)> {
        self.read
            .get_or_init(|| {
                let dir = proc_dir(self.who.pid);
                let maps = read_in(&dir).ok()?;
                self.who.alive().then_some((dir, maps))
            })
            .as_ref()
    }

    /// The mappings (see [`MapsOnce::dir`]).
    pub fn get(&self) -> Option<&[Mapping]> {
        self.read().map(|(_, maps)| maps.as_slice())
    }

    /// The [`proc_dir`] the mappings were read from, for the process's
    /// other files (`exe`, `root`, `map_files`, `mem`); `None` as for
    /// [`MapsOnce::get`].
    pub fn dir(&self) -> Option<&ProcDir> {
        self.read().map(|(dir, _)| dir)
    }
}

/// The mappings of process `pid` (`None` for this process), through
/// [`proc_dir`].
pub fn read(pid: Option<u32>) -> std::io::Result<Vec<Mapping>> {
    match pid {
        Some(p) => read_in(&proc_dir(p)),
        None => read_in("/proc/self"),
    }
}

#[cfg(test)]
mod tests {
    use super::{Mapping, Proc};

    #[test]
    fn this_process_is_itself_and_not_one_started_later() {
        let me = Proc::now(std::process::id());
        assert!(me.born > 0);
        assert!(me.alive());
        // The kernel's nanoseconds within the same tick: the same process.
        assert_eq!(Proc::new(me.pid, me.born + 1), me);
        let later = Proc::new(me.pid, me.born + super::tick_ns());
        assert!(!later.alive());
        assert_ne!(later, me);
        assert!(Proc::new(me.pid, 0).alive());
    }

    /// A thread's directory is held: read while the thread lives, its
    /// files fail once it has ended (where `/proc/TID` would be the next
    /// holder's of the id), and a thread is never held for a process it
    /// is not part of.
    #[test]
    fn a_threads_directory_is_held_and_reads_nothing_once_it_has_ended() {
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let (end_tx, end_rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            // SAFETY: no preconditions.
            tid_tx.send(unsafe { libc::gettid() } as u32).unwrap();
            let _ = end_rx.recv();
        });
        let tid = tid_rx.recv().unwrap();
        let me = std::process::id();
        assert!(super::hold(1, tid).is_none(), "held for process 1");
        let dir = super::hold(me, tid).expect("a live thread of this process is held");
        assert!(dir.starts_with("/proc/self/fd/"), "{dir}");
        assert_eq!(dir.numbered(), format!("/proc/{tid}"));
        let status = std::fs::read_to_string(format!("{dir}/status")).unwrap();
        assert!(status.contains(&format!("\nPid:\t{tid}\n")), "{status}");
        assert!(!super::read_in(&dir).unwrap().is_empty());
        end_tx.send(()).unwrap();
        thread.join().unwrap();
        // Reaped at the join: gone from the process's threads, and its
        // directory held reads nothing.
        let gone = format!("/proc/{me}/task/{tid}");
        for _ in 0..100 {
            if !std::path::Path::new(&gone).exists() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(!std::path::Path::new(&gone).exists());
        assert!(super::read_in(&dir).is_err());
        assert!(std::fs::read_to_string(format!("{dir}/status")).is_err());
    }

    #[test]
    fn lines_parse_with_and_without_names() {
        let m = Mapping::parse(
            "7f3e2c000000-7f3e2c028000 r-xp 00028000 fe:01 1049118    /usr/lib/x86_64-linux-gnu/libc.so.6 (deleted)",
        )
        .unwrap();
        assert_eq!(
            (m.start, m.end, m.offset, m.inode, m.dev),
            (0x7f3e2c000000, 0x7f3e2c028000, 0x28000, 1049118, (0xfe, 1))
        );
        assert!(m.exec);
        assert_eq!(m.path(), Some("/usr/lib/x86_64-linux-gnu/libc.so.6"));
        assert_eq!(m.range(), "7f3e2c000000-7f3e2c028000");
        let anon = Mapping::parse("7ffd1000-7ffd2000 rw-p 00000000 00:00 0 ").unwrap();
        assert!(!anon.exec);
        assert_eq!(anon.path(), None);
        let vdso = Mapping::parse("7ffd3000-7ffd5000 r-xp 00000000 00:00 0    [vdso]").unwrap();
        assert_eq!(vdso.path(), None);
        assert!(Mapping::parse("garbage").is_none());
    }
}

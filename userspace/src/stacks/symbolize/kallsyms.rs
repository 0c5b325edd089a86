//! Names of kernel frames, from `/proc/kallsyms`: a copy of it, made
//! once (on another thread, at idle priority, when a tool asks ahead) and
//! made again when modules or BPF programs come, and the kernel's place
//! as pprof shows it.

use std::{
    fs::File,
    io::{Read as _, Write as _},
    os::fd::AsRawFd as _,
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicI32, Ordering},
    },
};

use blazesym::{
    MaybeDefault,
    symbolize::{
        Input, Symbolized, Symbolizer as Blaze,
        source::{Kernel, Source},
    },
};

use super::frame::CodeMapping;

/// The copy of `/proc/kallsyms` kernel frames are named from.
#[derive(Default)]
pub(super) struct Kallsyms {
    /// See [`Kallsyms::path`].
    file: Option<File>,
    /// What kallsyms' changes looked like when the copy began.
    state: Option<KernelState>,
    /// A copy being made on another thread (see [`Kallsyms::prefetch`]).
    prefetch: Option<Prefetch>,
}

/// The thread copying `/proc/kallsyms` ahead, at idle priority.
struct Prefetch {
    copying: std::thread::JoinHandle<std::io::Result<File>>,
    /// The thread's id, once it has one (0 before).
    tid: Arc<AtomicI32>,
    /// Set when the copy is no longer wanted: the thread stops at its next
    /// read.
    abandon: Arc<AtomicBool>,
}

impl Prefetch {
    /// `None` if no thread could be made: the copy is then made when
    /// first needed.
    fn start() -> Option<Self> {
        let tid = Arc::new(AtomicI32::new(0));
        let abandon = Arc::new(AtomicBool::new(false));
        let (t, a) = (tid.clone(), abandon.clone());
        let spawned = std::thread::Builder::new()
            .name("rtrace-kallsyms".into())
            .spawn(move || {
                // Idle priority: the kernel's 50 ms of formatting kallsyms run
                // only on a CPU nothing else wants, never in the time of the
                // work being profiled (which on a busy machine lost that much,
                // spread over the run's first seconds). If it fails, the copy
                // runs at the priority it has.
                let idle = no_priority();
                // SAFETY: this thread, a valid policy and parameter.
                unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &raw const idle) };
                // After the change: a thread with its id known is idle.
                // SAFETY: gettid has no arguments and cannot fail.
                t.store(unsafe { libc::gettid() }, Ordering::Release);
                snapshot_kallsyms(&a)
            });
        Some(Self {
            copying: spawned.ok()?,
            tid,
            abandon,
        })
    }

    /// The copy: the thread's, made at normal priority from now on if it
    /// can be (with CAP_SYS_NICE); or else `Interrupted`, the idle one told
    /// to stop, for the caller to make the copy itself at once (without
    /// CAP_SYS_NICE a thread cannot leave idle priority, where on a busy
    /// machine it would take seconds more).
    fn finish(self) -> std::io::Result<File> {
        if !self.copying.is_finished() {
            let tid = self.tid.load(Ordering::Acquire);
            let normal = no_priority();
            // SAFETY: a thread of this process, a valid policy and
            // parameter.
            let raised = tid != 0
                && unsafe { libc::sched_setscheduler(tid, libc::SCHED_OTHER, &raw const normal) }
                    == 0;
            if !raised && !self.copying.is_finished() {
                self.abandon.store(true, Ordering::Relaxed);
                return Err(std::io::ErrorKind::Interrupted.into());
            }
        }
        self.copying
            .join()
            .unwrap_or_else(|_| Err(std::io::ErrorKind::Other.into()))
    }
}

/// The parameter of the policies without a static priority (idle, normal):
/// 0. musl's `sched_param` has fields glibc's lacks, all 0 here too.
fn no_priority() -> libc::sched_param {
    // SAFETY: integers only, for which zero is a value.
    unsafe { std::mem::zeroed() }
}

impl Kallsyms {
    /// A copy of `/proc/kallsyms`, made once: blazesym keeps a parsed file
    /// until its modification time changes, which for a proc file is
    /// every time it is looked at, so symbolizing every second would parse
    /// its 2 MB every second. Made here, now, when the copy made ahead
    /// failed or could not be hurried.
    fn path(&mut self) -> MaybeDefault<PathBuf> {
        if let Some(copying) = self.prefetch.take() {
            self.file = copying.finish().ok();
        }
        if self.file.is_none() {
            self.state = Some(KernelState::now());
            self.file = snapshot_kallsyms(&AtomicBool::new(false)).ok();
        }
        match &self.file {
            Some(f) => {
                MaybeDefault::Some(PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd())))
            }
            None => MaybeDefault::Default,
        }
    }

    /// Starts copying `/proc/kallsyms` on another thread, at idle
    /// priority. Reading it takes the kernel about 50 ms, which the report
    /// would otherwise wait for; a tool calls this once its own programs
    /// are loaded, as their names are in it.
    pub(super) fn prefetch(&mut self) {
        self.state = Some(KernelState::now());
        self.prefetch = Prefetch::start();
    }

    /// Takes a new copy of `/proc/kallsyms` at the next kernel lookup if
    /// modules were loaded or unloaded, or BPF programs loaded, since the
    /// last copy began.
    pub(super) fn refresh(&mut self) {
        if let Some(then) = &self.state
            && then.covers(&KernelState::now())
        {
            return;
        }
        if let Some(copying) = self.prefetch.take() {
            copying.abandon.store(true, Ordering::Relaxed);
        }
        self.file = None;
    }

    /// Looks kernel addresses `addrs` up with `blaze`, in order.
    pub(super) fn symbolize<'b>(
        &mut self,
        blaze: &'b Blaze,
        addrs: &[u64],
    ) -> blazesym::Result<Vec<Symbolized<'b>>> {
        let src = Source::Kernel(Kernel {
            // A vmlinux image would be searched for in several places on
            // every run and is rarely installed; kallsyms has every
            // function.
            vmlinux: MaybeDefault::None,
            kallsyms: self.path(),
            debug_syms: false,
            ..Kernel::default()
        });
        blaze.symbolize(&src, Input::AbsAddr(addrs))
    }
}

/// What changes kallsyms between two looks: modules loaded or unloaded,
/// and BPF programs loaded.
struct KernelState {
    modules: String,
    programs: Vec<u32>,
}

impl KernelState {
    fn now() -> Self {
        let programs = aya::programs::loaded_programs()
            .filter_map(Result::ok)
            .map(|p| p.id())
            .collect();
        Self {
            modules: std::fs::read_to_string("/proc/modules").unwrap_or_default(),
            programs,
        }
    }

    /// Whether a copy of kallsyms begun at `self` still names everything
    /// it would at `now`. Programs unloaded since (this tool's own, once
    /// detached) are still named by the older copy, which is better.
    fn covers(&self, now: &Self) -> bool {
        self.modules == now.modules && now.programs.iter().all(|p| self.programs.contains(p))
    }
}

/// The kernel's code, as pprof describes it (perf's name for it).
pub(super) fn kernel_mapping() -> Arc<CodeMapping> {
    static KERNEL: std::sync::OnceLock<Arc<CodeMapping>> = std::sync::OnceLock::new();
    KERNEL
        .get_or_init(|| {
            Arc::new(CodeMapping {
                start: 0xffff_8000_0000_0000,
                limit: u64::MAX,
                offset: 0,
                file: "[kernel.kallsyms]".to_owned(),
                build_id: None,
            })
        })
        .clone()
}

/// `/proc/kallsyms` copied into an anonymous memory file; given up
/// (`Interrupted`) once `abandon` is set.
fn snapshot_kallsyms(abandon: &AtomicBool) -> std::io::Result<File> {
    // SAFETY: a constant C string; the flags are valid.
    let fd = unsafe { libc::memfd_create(c"rtrace-kallsyms".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor just created and owned by nothing else.
    let mut copy = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let mut kallsyms = File::open("/proc/kallsyms")?;
    // A page at a time is what the kernel formats a read anyway.
    let mut buf = vec![0u8; 64 << 10];
    loop {
        if abandon.load(Ordering::Relaxed) {
            return Err(std::io::ErrorKind::Interrupted.into());
        }
        match kallsyms.read(&mut buf) {
            Ok(0) => return Ok(copy),
            Ok(n) => copy.write_all(&buf[..n])?,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lines of a copy of kallsyms.
    fn lines(mut f: File) -> usize {
        use std::io::Seek as _;
        let mut text = String::new();
        f.seek(std::io::SeekFrom::Start(0)).unwrap();
        f.read_to_string(&mut text).unwrap();
        text.lines().count()
    }

    #[test]
    fn prefetch_copies_at_idle_priority_and_whole() {
        let whole = lines(snapshot_kallsyms(&AtomicBool::new(false)).unwrap());
        assert!(whole > 10_000, "kallsyms has {whole} lines");
        // The copy takes the kernel tens of milliseconds; the policy is
        // read as soon as the thread has its id, while it copies.
        let mut seen_idle = false;
        for _ in 0..10 {
            let p = Prefetch::start().unwrap();
            while p.tid.load(Ordering::Acquire) == 0 && !p.copying.is_finished() {
                std::thread::yield_now();
            }
            let tid = p.tid.load(Ordering::Acquire);
            // SAFETY: a query of a thread of this process, or of none.
            let policy = unsafe { libc::sched_getscheduler(tid) };
            if !p.copying.is_finished() {
                assert_eq!(policy, libc::SCHED_IDLE, "the copying thread's policy");
                seen_idle = true;
            }
            // Asked for at once: raised to normal priority, it finishes
            // the copy whole.
            let copied = lines(p.finish().unwrap());
            assert!(
                copied.abs_diff(whole) < 100,
                "{copied} lines copied ahead, {whole} read at once"
            );
            if seen_idle {
                break;
            }
        }
        assert!(seen_idle, "the copy was never seen under way");
    }

    /// Gives up CAP_SYS_NICE on the calling thread alone (capabilities
    /// are a thread's own), as a service run with CAP_BPF and
    /// CAP_PERFMON alone has it.
    fn drop_sys_nice() {
        const CAP_SYS_NICE: u32 = 23;
        #[repr(C)]
        struct Header {
            version: u32,
            pid: i32,
        }
        #[repr(C)]
        #[derive(Clone, Copy, Default)]
        struct Data {
            effective: u32,
            permitted: u32,
            inheritable: u32,
        }
        let mut header = Header {
            version: 0x2008_0522,
            pid: 0,
        };
        let mut data = [Data::default(); 2];
        // SAFETY: a version 3 header and the two words it fills.
        let got = unsafe { libc::syscall(libc::SYS_capget, &raw mut header, data.as_mut_ptr()) };
        assert_eq!(got, 0, "capget");
        data[0].effective &= !(1 << CAP_SYS_NICE);
        data[0].permitted &= !(1 << CAP_SYS_NICE);
        // SAFETY: as above; the sets only lose a capability.
        let set = unsafe { libc::syscall(libc::SYS_capset, &raw mut header, data.as_ptr()) };
        assert_eq!(set, 0, "capset");
    }

    #[test]
    fn without_cap_sys_nice_the_copy_is_made_at_once() {
        let whole = lines(snapshot_kallsyms(&AtomicBool::new(false)).unwrap());
        // On a thread of its own, which gives the capability up.
        std::thread::spawn(move || {
            drop_sys_nice();
            for _ in 0..10 {
                let p = Prefetch::start().unwrap();
                while p.tid.load(Ordering::Acquire) == 0 && !p.copying.is_finished() {
                    std::thread::yield_now();
                }
                let abandon = p.abandon.clone();
                let under_way = !p.copying.is_finished();
                let mut k = Kallsyms {
                    prefetch: Some(p),
                    ..Kallsyms::default()
                };
                let _ = k.path();
                let copied = lines(k.file.take().unwrap());
                assert!(
                    copied.abs_diff(whole) < 100,
                    "{copied} lines copied, {whole} read at once"
                );
                if under_way {
                    // The idle thread could not be raised: it was told to
                    // stop, and the copy was made at once.
                    assert!(
                        abandon.load(Ordering::Relaxed),
                        "the idle copy left running"
                    );
                    return;
                }
            }
            panic!("the copy was never seen under way");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn an_abandoned_copy_stops() {
        let err = snapshot_kallsyms(&AtomicBool::new(true)).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::Interrupted);
    }
}

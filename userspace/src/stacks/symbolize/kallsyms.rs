//! Names of kernel frames, from `/proc/kallsyms`: a copy of it, made
//! once (on another thread when a tool asks ahead) and made again when
//! modules or BPF programs come, and the kernel's place as pprof shows
//! it.

use std::{fs::File, os::fd::AsRawFd as _, path::PathBuf, sync::Arc};

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
    prefetch: Option<std::thread::JoinHandle<std::io::Result<File>>>,
}

impl Kallsyms {
    /// A copy of `/proc/kallsyms`, made once: blazesym keeps a parsed file
    /// until its modification time changes, which for a proc file is
    /// every time it is looked at, so symbolizing every second would parse
    /// its 2 MB every second.
    fn path(&mut self) -> MaybeDefault<PathBuf> {
        if let Some(copying) = self.prefetch.take() {
            self.file = copying.join().ok().and_then(Result::ok);
        }
        if self.file.is_none() {
            self.state = Some(KernelState::now());
            self.file = snapshot_kallsyms().ok();
        }
        match &self.file {
            Some(f) => {
                MaybeDefault::Some(PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd())))
            }
            None => MaybeDefault::Default,
        }
    }

    /// Starts copying `/proc/kallsyms` on another thread. Reading it takes
    /// the kernel about 50 ms, which the report would otherwise wait for;
    /// a tool calls this once its own programs are loaded, as their names
    /// are in it.
    pub(super) fn prefetch(&mut self) {
        self.state = Some(KernelState::now());
        self.prefetch = Some(std::thread::spawn(snapshot_kallsyms));
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
            let _ = copying.join();
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

/// `/proc/kallsyms` copied into an anonymous memory file.
fn snapshot_kallsyms() -> std::io::Result<File> {
    // SAFETY: a constant C string; the flags are valid.
    let fd = unsafe { libc::memfd_create(c"rtrace-kallsyms".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor just created and owned by nothing else.
    let mut copy = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    std::io::copy(&mut File::open("/proc/kallsyms")?, &mut copy)?;
    Ok(copy)
}

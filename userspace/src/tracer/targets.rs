//! A scope checked against the system and written into the object: the
//! processes alive, the cgroup a v2 directory, the CPUs online, the
//! user's pinned maps of the right type; then the shared kernel-side
//! filter's global, id hash and cgroup array filled.

use std::{fs::File, os::fd::AsRawFd as _, path::PathBuf};

use anyhow::Context as _;
use aya::{
    Ebpf,
    maps::{Array, CgroupArray, HashMap as BpfHashMap},
};
use rtrace_common::targets;

use super::Scope;
use crate::kernel::load::Kernel;

/// A [`Scope`] checked against the system: its cgroup open.
pub(super) struct Targets {
    /// The filter's global.
    pub(super) global: targets::Targets,
    /// The ids of processes or threads traced.
    pub(super) ids: Vec<u32>,
    cgroup: Option<File>,
    /// Maps the user pinned, each for the object's map it replaces.
    pub(super) pins: Vec<(&'static str, PathBuf)>,
    /// The CPUs of `-C`, and how many CPUs the machine may have.
    pub(super) cpus: (Vec<u32>, u32),
}

/// Checks that `path` is a hash map pinned in bpffs with 8-byte keys, as
/// bcc's `--cgroupmap` and `--mntnsmap` take (`flag` names which).
fn check_pinned_set(path: &std::path::Path, flag: &str) -> anyhow::Result<()> {
    let map = aya::maps::MapData::from_pin(path).map_err(|e| {
        anyhow::anyhow!(
            "{flag} {}: not a BPF map pinned in bpffs ({e}); pin one with bpftool map create PATH type hash key 8 value 8 entries N name NAME",
            path.display()
        )
    })?;
    let info = map.info().with_context(|| {
        format!(
            "{flag} {}: cannot read the map's description",
            path.display()
        )
    })?;
    let hash = matches!(
        info.map_type(),
        Ok(aya::maps::MapType::Hash | aya::maps::MapType::LruHash)
    );
    if !hash || info.key_size() != 8 {
        anyhow::bail!(
            "{flag} {}: must be a hash map with 8-byte keys (its keys are {} bytes)",
            path.display(),
            info.key_size()
        );
    }
    Ok(())
}

impl Targets {
    pub(super) fn check(scope: &Scope, kernel: &mut Kernel) -> anyhow::Result<Self> {
        for &pid in &scope.pids {
            check_task(pid, "process")?;
        }
        for &tid in &scope.tids {
            check_task(tid, "thread")?;
        }
        let (by, ids) = if !scope.pids.is_empty() {
            (targets::BY_TGID, scope.pids.clone())
        } else if !scope.tids.is_empty() {
            (targets::BY_TID, scope.tids.clone())
        } else {
            (targets::BY_NONE, Vec::new())
        };
        let (cgroup, cgroup_id) = match &scope.cgroup {
            Some(path) => {
                let id = cgroup_id(path)?;
                let file = File::open(path)
                    .with_context(|| format!("cannot open cgroup {}", path.display()))?;
                (Some(file), id)
            }
            None => (None, 0),
        };
        let mut sets = 0;
        let mut pins = Vec::new();
        let mut mntns_offsets = [0; 3];
        if let Some(path) = &scope.cgroup_map {
            check_pinned_set(path, "--cgroupmap")?;
            sets |= targets::SET_CGROUPS;
            pins.push((targets::CGROUP_SET_MAP, path.clone()));
        }
        if let Some(path) = &scope.mntns_map {
            check_pinned_set(path, "--mntnsmap")?;
            let btf = kernel
                .btf()
                .context("--mntnsmap finds a task's mount namespace through the kernel's BTF")?;
            mntns_offsets = [
                btf.offset("task_struct", "nsproxy")?,
                btf.offset("nsproxy", "mnt_ns")?,
                btf.offset("mnt_namespace", "ns.inum")?,
            ];
            sets |= targets::SET_MNTNS;
            pins.push((targets::MNTNS_SET_MAP, path.clone()));
        }
        let possible = crate::kernel::load::possible_cpus()?;
        if let Some(&cpu) = scope.cpus.iter().find(|&&c| c >= possible) {
            anyhow::bail!("no CPU {cpu}: this machine has CPUs 0 to {}", possible - 1);
        }
        Ok(Self {
            global: targets::Targets {
                by,
                cgroup: u32::from(cgroup.is_some()),
                cgroup_id,
                exclude_tgid: if scope.exclude_self {
                    std::process::id()
                } else {
                    0
                },
                sets,
                mntns_offsets,
                cpus: u32::from(!scope.cpus.is_empty()),
            },
            ids,
            cgroup,
            pins,
            cpus: (scope.cpus.clone(), possible),
        })
    }

    /// Fills the loaded object's id hash and cgroup array.
    pub(super) fn apply(&self, ebpf: &mut Ebpf) -> anyhow::Result<()> {
        if !self.ids.is_empty() {
            let mut map: BpfHashMap<_, u32, u8> = BpfHashMap::try_from(
                ebpf.map_mut(targets::IDS_MAP)
                    .with_context(|| format!("map {} missing", targets::IDS_MAP))?,
            )?;
            for id in &self.ids {
                map.insert(id, 1, 0)
                    .context("cannot fill the target filter")?;
            }
        }
        if !self.cpus.0.is_empty() {
            let mut map: Array<_, u8> = ebpf
                .map_mut(targets::CPUS_MAP)
                .with_context(|| format!("map {} missing", targets::CPUS_MAP))?
                .try_into()?;
            for &cpu in &self.cpus.0 {
                map.set(cpu, 1, 0).context("cannot set the CPU filter")?;
            }
        }
        if let Some(cg) = &self.cgroup {
            let mut map: CgroupArray<_> = ebpf
                .map_mut(targets::CGROUP_MAP)
                .with_context(|| format!("map {} missing", targets::CGROUP_MAP))?
                .try_into()?;
            map.set(0, cg.as_raw_fd(), 0)
                .context("cannot set the cgroup filter")?;
        }
        Ok(())
    }
}

/// Fails with a clear message unless `id` names a live task (`what` says
/// which kind).
pub fn check_task(id: u32, what: &str) -> anyhow::Result<()> {
    if id == 0 || !crate::kernel::procmaps::alive(id) {
        anyhow::bail!("no such {what}: {id}");
    }
    Ok(())
}

/// The kernfs id of a cgroup v2 directory, which is its inode number.
fn cgroup_id(path: &std::path::Path) -> anyhow::Result<u64> {
    use std::os::unix::fs::MetadataExt as _;
    const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
    let meta = std::fs::metadata(path)
        .map_err(|e| anyhow::anyhow!("cannot use cgroup {}: {e}", path.display()))?;
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())?;
    // SAFETY: `c` is a valid path and `st` a valid out-pointer.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 || st.f_type as i64 != CGROUP2_SUPER_MAGIC
    {
        anyhow::bail!("{} is not a cgroup v2 directory", path.display());
    }
    Ok(meta.ino())
}

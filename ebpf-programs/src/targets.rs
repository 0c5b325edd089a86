//! The target filter shared by every tool (`-p`, `-t`/`-L`, `-c`, `-C`,
//! and `-- CMD`, which is a cgroup): one global, one id hash, one cgroup
//! array and one CPU array, set by user space's `Tracer`.

use aya_ebpf::{
    Global,
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_pid_tgid, bpf_get_current_task,
        bpf_get_smp_processor_id,
    },
    macros::map,
    maps::{Array, CgroupArray, HashMap},
};
use rtrace_common::targets::{BY_NONE, BY_TGID, SET_CGROUPS, SET_MNTNS, Targets};

use crate::{global, read_kernel};

#[unsafe(no_mangle)]
static TARGETS: Global<Targets> = Global::new(Targets {
    by: BY_NONE,
    cgroup: 0,
    cgroup_id: 0,
    exclude_tgid: 0,
    sets: 0,
    mntns_offsets: [0; 3],
    cpus: 0,
});

/// The ids `-p` or `-L` lists; user space sizes it to the list.
#[map]
static TARGET_IDS: HashMap<u32, u8> = HashMap::with_max_entries(1, 0);

/// The cgroup of `-c`.
#[map]
static TARGET_CGROUP: CgroupArray = CgroupArray::with_max_entries(1, 0);

/// The CPUs `-C` lists (1 for traced); user space sizes it to the
/// machine's CPUs.
#[map]
static TARGET_CPUS: Array<u8> = Array::with_max_entries(1, 0);

/// bcc's `--cgroupmap`: cgroup ids, from a map the user pinned; user
/// space swaps that map in at load time.
#[map]
static TARGET_CGROUP_SET: HashMap<u64, u64> = HashMap::with_max_entries(1, 0);

/// bcc's `--mntnsmap`: mount namespace ids, from a map the user pinned.
#[map]
static TARGET_MNTNS_SET: HashMap<u64, u32> = HashMap::with_max_entries(1, 0);

/// The filter's settings.
#[inline(always)]
pub fn config() -> &'static Targets {
    global(&TARGETS)
}

/// Whether the task `tgid`/`tid` is traced by its ids (the cgroup is not
/// tested: see [`admits_current`]).
#[inline(always)]
pub fn admits(tgid: u32, tid: u32) -> bool {
    let t = config();
    if t.exclude_tgid != 0 && tgid == t.exclude_tgid {
        return false;
    }
    match t.by {
        BY_NONE => true,
        BY_TGID => TARGET_IDS.get_ptr(tgid).is_some(),
        _ => TARGET_IDS.get_ptr(tid).is_some(),
    }
}

/// Traces process `tgid` too, where processes are chosen by id (`-p`):
/// for a tool that follows the children of those it traces. A full table
/// leaves it untraced.
#[inline(always)]
pub fn adopt(tgid: u32) {
    if config().by == BY_TGID && TARGET_IDS.get_ptr(tgid).is_none() {
        let _ = TARGET_IDS.insert(tgid, 1, 0);
    }
}

/// Whether any id filter is set, so that a tool can skip looking up a
/// task's ids when nothing asks for them.
#[inline(always)]
pub fn by_ids() -> bool {
    let t = config();
    t.by != BY_NONE || t.exclude_tgid != 0
}

/// Whether the current task is in the `-c` cgroup (or `-- CMD`'s) and in
/// the pinned sets of `--cgroupmap` and `--mntnsmap`, and runs on a CPU
/// `-C` lists, where they are given.
#[inline(always)]
pub fn current_in_cgroup() -> bool {
    on_cpu() && current_in_groups()
}

/// Whether the current task is in the `-c` cgroup (or `-- CMD`'s) and in
/// the pinned sets, on whichever CPU: for what a task's later samples on
/// a listed CPU need, such as its exec.
#[inline(always)]
pub fn current_in_groups() -> bool {
    let t = config();
    if t.cgroup != 0 && TARGET_CGROUP.current_task_under_cgroup(0) != Ok(true) {
        return false;
    }
    if t.sets == 0 {
        return true;
    }
    in_sets(t)
}

/// Whether this CPU is traced: `-C` lists it, or there is no `-C`.
#[inline(always)]
pub fn on_cpu() -> bool {
    config().cpus == 0 || on_listed_cpu()
}

/// Whether this CPU is one `-C` lists; out of line, as few runs ask.
#[inline(never)]
fn on_listed_cpu() -> bool {
    // SAFETY: the helper has no preconditions.
    let cpu = unsafe { bpf_get_smp_processor_id() };
    TARGET_CPUS.get(cpu).is_some_and(|&on| on == 1)
}

/// The pinned sets' part of [`current_in_cgroup`], out of line: few
/// runs use them.
#[inline(never)]
fn in_sets(t: &Targets) -> bool {
    if t.sets & SET_CGROUPS != 0 {
        // SAFETY: the helper has no preconditions.
        let id = unsafe { bpf_get_current_cgroup_id() };
        // SAFETY: only tested for presence.
        if unsafe { TARGET_CGROUP_SET.get(id) }.is_none() {
            return false;
        }
    }
    if t.sets & SET_MNTNS != 0 {
        // SAFETY: the helper has no preconditions.
        let task = unsafe { bpf_get_current_task() } as *const u8;
        let [nsproxy, mnt_ns, inum] = t.mntns_offsets;
        let id = read_kernel::<*const u8>(task, nsproxy)
            .and_then(|p| read_kernel::<*const u8>(p, mnt_ns))
            .and_then(|p| read_kernel::<u32>(p, inum))
            .map_or(0, u64::from);
        // SAFETY: only tested for presence.
        if unsafe { TARGET_MNTNS_SET.get(id) }.is_none() {
            return false;
        }
    }
    true
}

/// Whether the current task's ids are traced and it is in the traced
/// groups, on whichever CPU: for what its later samples on a listed CPU
/// need, such as its exec's new mappings.
#[inline(always)]
pub fn admits_current_anywhere() -> bool {
    let id = bpf_get_current_pid_tgid();
    admits((id >> 32) as u32, id as u32) && current_in_groups()
}

/// Whether the current task is traced: its ids and its cgroup.
#[inline(always)]
pub fn admits_current() -> bool {
    let id = bpf_get_current_pid_tgid();
    admits((id >> 32) as u32, id as u32) && current_in_cgroup()
}

//! The one target filter every tool shares: `-p` (processes), `-t`/`-L`
//! (threads), `-c` (a cgroup v2 directory, also the one `-- CMD` runs in)
//! and `-C` (CPUs).
//!
//! User space sets the global `TARGETS` to a [`Targets`], fills the
//! `TARGET_IDS` hash with the ids asked for and points the `TARGET_CGROUP`
//! array at the cgroup; `rtrace_ebpf::targets` tests a task against them.

/// [`Targets::by`]: every task.
pub const BY_NONE: u32 = 0;
/// [`Targets::by`]: tasks whose process (thread group) id is in
/// `TARGET_IDS`.
pub const BY_TGID: u32 = 1;
/// [`Targets::by`]: tasks whose thread id is in `TARGET_IDS`.
pub const BY_TID: u32 = 2;

/// Name of the global holding the [`Targets`].
pub const GLOBAL: &str = "TARGETS";
/// Name of the hash of ids (`u32` to `u8`) that `-p` or `-L` lists.
pub const IDS_MAP: &str = "TARGET_IDS";
/// Name of the one-slot cgroup array that `-c` fills.
pub const CGROUP_MAP: &str = "TARGET_CGROUP";
/// Name of the array (`u8` per CPU, 1 for traced) that `-C` fills.
pub const CPUS_MAP: &str = "TARGET_CPUS";
/// Name of the hash of cgroup ids (`u64` keys) that `--cgroupmap` swaps
/// for a map the user pinned, as bcc's tools take it.
pub const CGROUP_SET_MAP: &str = "TARGET_CGROUP_SET";
/// Name of the hash of mount namespace ids (`u64` keys) that
/// `--mntnsmap` swaps for a map the user pinned.
pub const MNTNS_SET_MAP: &str = "TARGET_MNTNS_SET";

/// [`Targets::sets`]: the current task's cgroup id must be a key of
/// `TARGET_CGROUP_SET`.
pub const SET_CGROUPS: u32 = 1;
/// [`Targets::sets`]: the current task's mount namespace id must be a key
/// of `TARGET_MNTNS_SET`.
pub const SET_MNTNS: u32 = 2;

/// What a tool traces, passed as the global [`GLOBAL`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Targets {
    /// One of the `BY_*` values.
    pub by: u32,
    /// Whether `TARGET_CGROUP` holds a cgroup the current task must be in.
    pub cgroup: u32,
    /// The kernfs id of that cgroup, for tools that test tasks other than
    /// the current one by walking their cgroup's ancestors.
    pub cgroup_id: u64,
    /// A process never traced (rtrace itself, where its own output could
    /// feed back into what it traces); 0 for none.
    pub exclude_tgid: u32,
    /// `SET_*` bits: the pinned maps the current task must be in.
    pub sets: u32,
    /// Where a task's mount namespace id is, from the kernel's BTF:
    /// `task_struct.nsproxy`, `nsproxy.mnt_ns`, `mnt_namespace.ns.inum`.
    pub mntns_offsets: [u32; 3],
    /// Whether `TARGET_CPUS` says which CPUs are traced (`-C`); events on
    /// others are not.
    pub cpus: u32,
}

crate::pod!(Targets);

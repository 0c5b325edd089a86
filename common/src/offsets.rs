//! Kernel struct member offsets, resolved from BTF in user space at start-up
//! and handed to the programs as globals, since rustc emits no CO-RE
//! relocations.

/// Offsets into `task_struct` and the structs reached from it.
///
/// A value of [`MISSING`] means the running kernel has no such member; the
/// programs then skip whatever needs it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TaskOffsets {
    /// `task_struct.pid` (the thread id).
    pub pid: u32,
    /// `task_struct.tgid` (the process id).
    pub tgid: u32,
    /// `task_struct.__state`, or `state` before 5.14.
    pub state: u32,
    /// `task_struct.comm`.
    pub comm: u32,
    /// `task_struct.nsproxy`.
    pub nsproxy: u32,
    /// `nsproxy.pid_ns_for_children`.
    pub pid_ns_for_children: u32,
    /// `pid_namespace.ns.inum`.
    pub pidns_inum: u32,
    /// `task_struct.cgroups`.
    pub cgroups: u32,
    /// `css_set.dfl_cgrp`.
    pub dfl_cgrp: u32,
    /// `cgroup.kn`.
    pub cgroup_kn: u32,
    /// `kernfs_node.id`.
    pub kn_id: u32,
    /// `kernfs_node.__parent`, or `parent` before 6.15.
    pub kn_parent: u32,
    /// Keeps the struct free of trailing padding.
    pub _pad: u32,
}

/// Offset value for a member the running kernel does not have.
pub const MISSING: u32 = u32::MAX;

crate::pod!(TaskOffsets);

/// Offsets on the way from a task to the `struct file` behind one of its
/// descriptors: `task->files->fdt->fd[fd]`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FdOffsets {
    /// `task_struct.files`.
    pub task_files: u32,
    /// `files_struct.fdt`.
    pub files_fdt: u32,
    /// `fdtable.max_fds`.
    pub fdt_max_fds: u32,
    /// `fdtable.fd`.
    pub fdt_fd: u32,
}

crate::pod!(FdOffsets);

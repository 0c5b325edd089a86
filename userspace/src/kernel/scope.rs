//! What a tool traces: processes, threads, a cgroup, CPUs, or a command
//! and what it starts. The tracer settles it (starting the command) and
//! applies it through the one kernel-side filter (`rtrace_ebpf::targets`);
//! the engine and the tools read the settled scope instead of their flags.

use std::{ffi::OsString, path::PathBuf};

/// What a tool traces, checked and applied by the tracer through the one
/// kernel-side filter (`rtrace_ebpf::targets`), and the command it runs.
#[derive(Debug, Clone, Default)]
pub struct Scope {
    /// Processes (thread group ids); empty for all.
    pub pids: Vec<u32>,
    /// Threads; empty for all. Not with `pids`.
    pub tids: Vec<u32>,
    /// A cgroup v2 directory the traced tasks must be in or below.
    pub cgroup: Option<PathBuf>,
    /// CPUs whose events are traced; empty for all.
    pub cpus: Vec<u32>,
    /// `-- CMD`: the command rtrace runs and traces until it exits.
    pub command: Vec<OsString>,
    /// Whom the command runs as (`-u`).
    pub user: Option<String>,
    /// Trace the whole system while the command runs (`--all-cpus`).
    pub all_cpus: bool,
    /// Whether `cgroup` is the command's own, made for it when it started
    /// (set as the tracer settles the scope).
    pub own_cgroup: bool,
    /// The command's process id, once started (corked, before its exec).
    pub command_pid: Option<u32>,
    /// Where the output goes (`-o`).
    pub output: Option<PathBuf>,
    /// Never trace rtrace itself, whose output could feed back.
    pub exclude_self: bool,
    /// bcc's `--cgroupmap`: a hash map pinned in bpffs whose keys are the
    /// cgroup ids to trace.
    pub cgroup_map: Option<PathBuf>,
    /// bcc's `--mntnsmap`: a hash map pinned in bpffs whose keys are the
    /// mount namespace ids to trace.
    pub mntns_map: Option<PathBuf>,
}

impl Scope {
    /// Whether the command runs in a cgroup of its own, which is then
    /// what is traced: with `-- CMD` and no `-p`, `-t`, `-c` or
    /// `--all-cpus`.
    pub fn command_cgroup(&self) -> bool {
        !self.command.is_empty()
            && self.pids.is_empty()
            && self.tids.is_empty()
            && (self.cgroup.is_none() || self.own_cgroup)
            && !self.all_cpus
    }

    /// Whether the traced tasks are known before tracing starts: named
    /// processes or threads, or a command's own cgroup. Otherwise tasks
    /// already running may be traced (a system-wide run, a cgroup's).
    pub fn tasks_named(&self) -> bool {
        !self.pids.is_empty() || !self.tids.is_empty() || self.command_cgroup()
    }

    /// Whether rtrace itself is among the traced tasks: a run over the
    /// whole system (or every CPU beside a command) that does not exclude
    /// it, where its own work shows as any process's does.
    pub fn covers_self(&self) -> bool {
        !self.exclude_self && self.whole_system()
    }

    /// Whether every task of the system may be traced: none named, and no
    /// cgroup (`-c`, or the command's own) or bcc map narrowing them.
    pub fn whole_system(&self) -> bool {
        self.pids.is_empty()
            && self.tids.is_empty()
            && self.cgroup.is_none()
            && !self.command_cgroup()
            && self.cgroup_map.is_none()
            && self.mntns_map.is_none()
    }

    /// Whether tasks are chosen by cgroup: `-c`, or the command's own.
    pub fn by_cgroup(&self) -> bool {
        self.cgroup.is_some() || self.command_cgroup()
    }

    /// The one process the flags name, for probes that attach to a
    /// process (uprobes); `None` for all, and in command mode, where the
    /// command's children are traced too.
    pub fn one_pid(&self) -> Option<u32> {
        match (self.pids.as_slice(), !self.command.is_empty()) {
            ([pid], false) => Some(*pid),
            _ => None,
        }
    }

    /// What the flags choose, for a banner ("PID [185]", "`make -j2`
    /// and what it starts"); `None` for the whole system.
    pub fn whom(&self) -> Option<String> {
        let cmd = || {
            let words: Vec<String> = self
                .command
                .iter()
                .map(|w| w.to_string_lossy().into_owned())
                .collect();
            words.join(" ")
        };
        if !self.pids.is_empty() {
            Some(format!("PID {:?}", self.pids))
        } else if !self.tids.is_empty() {
            Some(format!("TID {:?}", self.tids))
        } else if let Some(cg) = self.cgroup.as_ref().filter(|_| !self.own_cgroup) {
            Some(format!("cgroup {}", cg.display()))
        } else if !self.command.is_empty() && !self.all_cpus {
            Some(format!("`{}` and what it starts", cmd()))
        } else {
            None
        }
    }
}

//! The scope flags, declared once for every tool: `-p`, `-t`/`-L`, `-c`,
//! `-C`, `-a`/`--all-cpus`, `-u`, `-o` and `-- CMD`.
//!
//! A tool flattens [`ScopeArgs`] into its arguments. Where the tool's peer
//! gives one of the letters another meaning (bcc profile's `-a`, tcplife's
//! `-t`, argdist's `-C`), the tool keeps the peer's meaning: it names the
//! letter in `OWN` ([`own`]), and the group's flag keeps only its long
//! name there, its `--help` saying why. clap's derive cannot leave out a
//! short flag per use of one struct, hence the hand-written
//! [`clap::Args`].

use std::{ffi::OsString, path::PathBuf};

use clap::{Arg, ArgAction, ArgMatches, value_parser};

use crate::kernel::scope::Scope;

/// The letters a tool keeps for its own flags, as bits of `OWN`.
pub mod own {
    /// `-p`.
    pub const P: u32 = 1;
    /// `-t`.
    pub const T: u32 = 2;
    /// `-L`.
    pub const L: u32 = 4;
    /// `-c`.
    pub const C: u32 = 8;
    /// `-C`.
    pub const UPPER_C: u32 = 16;
    /// `-a`.
    pub const A: u32 = 32;
    /// `-u`.
    pub const U: u32 = 64;
    /// `-o`.
    pub const O: u32 = 128;
}

/// What every tracing tool traces and where its output goes; `OWN` holds
/// the letters the tool keeps for itself ([`own`]).
#[derive(Debug, Clone, Default)]
pub struct ScopeArgs<const OWN: u32 = 0> {
    /// `-p`: processes.
    pub pids: Vec<u32>,
    /// `-t`/`-L`: threads.
    pub tids: Vec<u32>,
    /// `-c`/`--cgroup`: a cgroup v2 directory.
    pub cgroup: Option<PathBuf>,
    /// `-C`/`--cpu`: CPUs.
    pub cpus: Vec<u32>,
    /// `-a`/`--all-cpus`: the whole system while the command runs.
    pub all_cpus: bool,
    /// `-u`/`--user`: whom the command runs as.
    pub user: Option<String>,
    /// `-o`/`--output`: where the output goes.
    pub output: Option<PathBuf>,
    /// `-- CMD`: the command, with its arguments.
    pub command: Vec<OsString>,
}

/// Parses a CPU list as perf's `-C` takes it: `0`, `0,2`, `1-3`, `0,4-7`.
pub fn parse_cpus(text: &str) -> Result<Vec<u32>, String> {
    let mut cpus = Vec::new();
    for part in text.split(',') {
        let part = part.trim();
        let bad = || format!("{part:?} is not a CPU or a range of CPUs (such as 0,2-3)");
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (a.trim().parse::<u32>(), b.trim().parse::<u32>()),
            None => (part.parse::<u32>(), part.parse::<u32>()),
        };
        let (Ok(lo), Ok(hi)) = (lo, hi) else {
            return Err(bad());
        };
        if hi < lo || hi - lo > 4096 {
            return Err(bad());
        }
        cpus.extend(lo..=hi);
    }
    cpus.sort_unstable();
    cpus.dedup();
    Ok(cpus)
}

/// A whole number of 1 or more, for a process or thread id.
pub fn parse_id(text: &str) -> Result<u32, String> {
    match text.trim().parse::<u32>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("{text:?} is not a process or thread id")),
    }
}

/// The help of a flag whose letter the tool keeps for itself.
fn long_only(help: &str, letter: char) -> String {
    format!("{help} (long name only: -{letter} is this tool's own flag, as in its peer)")
}

impl<const OWN: u32> ScopeArgs<OWN> {
    /// A flag of the group, with its letter unless the tool keeps it.
    fn flag(id: &'static str, letter: char, bit: u32, help: &str) -> Arg {
        let arg = Arg::new(id).long(id);
        if OWN & bit == 0 {
            arg.short(letter).help(help.to_owned())
        } else {
            arg.help(long_only(help, letter))
        }
    }

    /// Whether a command was given.
    pub fn commanded(&self) -> bool {
        !self.command.is_empty()
    }

    /// The same flags for a tool that keeps other letters (`rtrace trace`
    /// with no probe runs as `rtrace strace`).
    pub fn into_letters<const OTHER: u32>(self) -> ScopeArgs<OTHER> {
        ScopeArgs {
            pids: self.pids,
            tids: self.tids,
            cgroup: self.cgroup,
            cpus: self.cpus,
            all_cpus: self.all_cpus,
            user: self.user,
            output: self.output,
            command: self.command,
        }
    }
}

impl<const OWN: u32> clap::FromArgMatches for ScopeArgs<OWN> {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        let mut s = Self::default();
        s.update_from_arg_matches(m)?;
        Ok(s)
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        let ids = |id: &str| -> Vec<u32> {
            m.get_many::<u32>(id)
                .map(|v| v.copied().collect())
                .unwrap_or_default()
        };
        self.pids = ids("pid");
        self.tids = ids("tid");
        self.cgroup = m.get_one::<PathBuf>("cgroup").cloned();
        self.cpus = m
            .get_many::<Vec<u32>>("cpu")
            .map(|v| v.flatten().copied().collect())
            .unwrap_or_default();
        self.all_cpus = m.get_flag("all-cpus");
        self.user = m.get_one::<String>("user").cloned();
        self.output = m.get_one::<PathBuf>("output").cloned();
        self.command = m
            .get_many::<OsString>("command")
            .map(|v| v.cloned().collect())
            .unwrap_or_default();
        Ok(())
    }
}

impl<const OWN: u32> clap::Args for ScopeArgs<OWN> {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        let mut tid = Self::flag(
            "tid",
            't',
            own::T,
            "Trace only these threads (comma-separated thread ids).",
        )
        .value_name("TID")
        .value_delimiter(',')
        .action(ArgAction::Append)
        .value_parser(parse_id);
        if OWN & own::L == 0 {
            tid = tid.visible_short_alias('L');
        }
        cmd.arg(
            Self::flag(
                "pid",
                'p',
                own::P,
                "Trace only these processes (comma-separated pids); with -- CMD, \
                 trace them for as long as CMD runs.",
            )
            .value_name("PID")
            .value_delimiter(',')
            .action(ArgAction::Append)
            .value_parser(parse_id)
            .conflicts_with("tid"),
        )
        .arg(tid)
        .arg(
            Self::flag(
                "cgroup",
                'c',
                own::C,
                "Trace only tasks in this cgroup v2 directory, or below it.",
            )
            .value_name("PATH")
            .value_parser(value_parser!(PathBuf)),
        )
        .arg(
            Self::flag(
                "cpu",
                'C',
                own::UPPER_C,
                "Trace only what happens on these CPUs (such as 0,2-3).",
            )
            .value_name("CPUS")
            .action(ArgAction::Append)
            .value_parser(parse_cpus),
        )
        .arg(
            Self::flag(
                "all-cpus",
                'a',
                own::A,
                "With -- CMD, trace the whole system while CMD runs, not only \
                 CMD and what it starts (without a command, the whole system \
                 is traced anyway).",
            )
            .action(ArgAction::SetTrue)
            .conflicts_with_all(["pid", "tid", "cgroup"]),
        )
        .arg(
            Self::flag(
                "user",
                'u',
                own::U,
                "Run CMD as this user (a name or a uid). Without it, CMD runs \
                 as the user who ran rtrace: under sudo, the one sudo names.",
            )
            .value_name("USER")
            .requires("command"),
        )
        .arg(
            Self::flag(
                "output",
                'o',
                own::O,
                "Write the output to FILE instead of stdout (with -- CMD, \
                 output goes to stderr without it, as perf stat's does).",
            )
            .value_name("FILE")
            .value_parser(value_parser!(PathBuf)),
        )
        .arg(
            Arg::new("command")
                .value_name("CMD")
                .num_args(1..)
                .last(true)
                .action(ArgAction::Append)
                .value_parser(value_parser!(OsString))
                .help(
                    "Run CMD (after --) and trace it and everything it starts, \
                     from its first instruction until it exits; rtrace then \
                     reports and exits with CMD's exit status.",
                ),
        )
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_parse_as_perf_writes_them() {
        assert_eq!(parse_cpus("0").unwrap(), vec![0]);
        assert_eq!(parse_cpus("0,2-3").unwrap(), vec![0, 2, 3]);
        assert_eq!(parse_cpus("3,1,1").unwrap(), vec![1, 3]);
        assert!(parse_cpus("3-1").is_err());
        assert!(parse_cpus("x").is_err());
        assert!(parse_cpus("").is_err());
    }
}

impl<const OWN: u32> ScopeArgs<OWN> {
    /// Whether tasks are chosen by cgroup ([`Scope::by_cgroup`]).
    pub fn by_cgroup(&self) -> bool {
        self.scope().by_cgroup()
    }

    /// The one process the flags name ([`Scope::one_pid`]).
    pub fn one_pid(&self) -> Option<u32> {
        self.scope().one_pid()
    }

    /// What the flags choose, for a banner ([`Scope::whom`]).
    pub fn whom(&self) -> Option<String> {
        self.scope().whom()
    }

    /// The scope these flags ask for.
    pub fn scope(&self) -> Scope {
        Scope {
            pids: self.pids.clone(),
            tids: self.tids.clone(),
            cgroup: self.cgroup.clone(),
            cpus: self.cpus.clone(),
            command: self.command.clone(),
            user: self.user.clone(),
            all_cpus: self.all_cpus,
            output: self.output.clone(),
            ..Scope::default()
        }
    }
}

/// bcc's filters by maps the user pinned in bpffs, for the tools bcc has
/// them in.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct PinnedSets {
    /// Trace only tasks whose cgroup id is a key of this hash map pinned in
    /// bpffs (bcc's --cgroupmap; keys are 8-byte cgroup ids).
    #[arg(long = "cgroupmap", value_name = "PATH")]
    pub cgroup_map: Option<PathBuf>,
    /// Trace only tasks whose mount namespace id is a key of this hash map
    /// pinned in bpffs (bcc's --mntnsmap; keys are 8-byte namespace ids).
    #[arg(long = "mntnsmap", value_name = "PATH")]
    pub mntns_map: Option<PathBuf>,
}

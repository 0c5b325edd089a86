//! Attaching an event spec's probes (`p:`, `r:`, `u:`, USDT) to a tool's
//! programs, at every site the spec names: kernel functions and a file's
//! functions by glob, each USDT site. profile, stackcount and stat count
//! at them alike; only the programs differ.

use std::os::fd::OwnedFd;

use anyhow::Context as _;
use aya::Ebpf;
use rtrace_common::argdist::{
    KPROBE_PROGRAMS, KRETPROBE_PROGRAMS, TRACEPOINT_PROGRAMS, UPROBE_PROGRAMS, URETPROBE_PROGRAMS,
};

use crate::{
    kernel::{
        features::Mechanism,
        load::{Hooks, Kernel, attach_kernel_fn},
    },
    probes::{
        event::{Event, glob},
        spec::Target,
        uprobes, usdt,
    },
};

/// The most sites one spec attaches to, as bcc's and perf's limits: a
/// glob wider than this is a mistake more often than a wish.
pub const MAX_SITES: usize = 1000;

/// A tool's programs for each kind of probe.
#[derive(Debug, Clone, Copy)]
pub struct Programs<'a> {
    pub kprobe: &'a str,
    pub kretprobe: &'a str,
    pub uprobe: &'a str,
    /// For bcc's `r:FILE:FUNCTION`.
    pub uretprobe: &'a str,
}

/// What one spec attached to.
#[derive(Debug, Default)]
pub struct Attached {
    /// The sites: functions, or USDT sites.
    pub sites: usize,
    /// How, for `-v`: the mechanism and where.
    pub how: String,
    /// USDT probes' perf events, which keep them attached.
    pub links: Vec<OwnedFd>,
}

/// How a spec's function names are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Names {
    /// One name, or a glob (`tcp_send*`).
    Glob,
    /// A regular expression, matched anywhere in a name as bcc's `-r`
    /// does (`^tcp_send.*`).
    Regex,
}

impl Names {
    /// Whether `name` stands for many functions rather than one.
    fn many(self, name: &str) -> bool {
        self == Self::Regex || name.contains(['*', '?'])
    }

    fn pattern(self, pattern: &str) -> anyhow::Result<regex::Regex> {
        match self {
            Self::Glob => glob(pattern).with_context(|| format!("bad glob {pattern:?}")),
            Self::Regex => regex::Regex::new(pattern)
                .with_context(|| format!("bad regular expression {pattern:?}")),
        }
    }
}

/// The names `pattern` matches among `names`, sorted, at most
/// [`MAX_SITES`]; an error where none or too many do.
fn expand<'a>(
    pattern: &str,
    how: Names,
    names: impl Iterator<Item = &'a str>,
    what: &str,
) -> anyhow::Result<Vec<String>> {
    let re = how.pattern(pattern)?;
    let mut found: Vec<String> = names
        .filter(|n| re.is_match(n))
        .map(str::to_owned)
        .collect();
    found.sort();
    found.dedup();
    match found.len() {
        0 => anyhow::bail!("no {what} matches {pattern:?}"),
        n if n > MAX_SITES => anyhow::bail!(
            "{pattern:?} matches {n} {what}s; at most {MAX_SITES} are probed at once: \
             narrow the glob"
        ),
        _ => Ok(found),
    }
}

/// The kernel functions `pattern` names: itself (or its `_noprof` twin),
/// or, for a glob or regular expression, the kernel's text symbols it
/// matches (tracefs' list of ftrace's functions leaves out some that
/// kprobes take, such as the syscall wrappers on some kernels).
fn kernel_functions(kernel: &mut Kernel, pattern: &str, how: Names) -> anyhow::Result<Vec<String>> {
    if !how.many(pattern) {
        return Ok(vec![kernel.function(pattern)?]);
    }
    let re = how.pattern(pattern)?;
    let names = kernel.functions_where(|n| re.is_match(n) && !n.contains('.'));
    expand(
        pattern,
        how,
        names.iter().map(String::as_str),
        "kernel function",
    )
}

/// A probe spec's sites, found and checked, not attached yet: a tool
/// can fail on a bad spec before it starts work that takes time.
#[derive(Debug)]
pub enum Resolved {
    /// Kernel functions, their calls or returns.
    Kernel { functions: Vec<String>, ret: bool },
    /// Functions of a file, their calls or returns.
    User {
        path: std::path::PathBuf,
        functions: Vec<String>,
        ret: bool,
    },
    /// A USDT probe's sites.
    Usdt(usdt::Probe, String),
}

/// Finds the sites of `event` (a probe spec: `p:`, `r:`, `u:` or USDT),
/// its function names read as `names` says, in process `pid`'s view where
/// given. Counters and tracepoints are not probes: they are refused, as
/// are kinds of probe this kernel cannot attach.
pub fn resolve(
    kernel: &mut Kernel,
    event: &Event,
    names: Names,
    pid: Option<u32>,
) -> anyhow::Result<Resolved> {
    let uprobes_work = |kernel: &mut Kernel| {
        kernel
            .check(Mechanism::Uprobe)
            .map_err(|why| anyhow::anyhow!("{event} needs uprobes, which do not work here: {why}"))
    };
    match event {
        Event::Kernel { function, ret } => {
            kernel.check(Mechanism::Kprobe).map_err(|why| {
                anyhow::anyhow!(
                    "{event} needs kprobes, which this kernel does not offer ({why}); \
                     tracepoints (t:CATEGORY:EVENT) work everywhere"
                )
            })?;
            Ok(Resolved::Kernel {
                functions: kernel_functions(kernel, function, names)?,
                ret: *ret,
            })
        }
        Event::User {
            file,
            function,
            ret,
        } => {
            uprobes_work(kernel)?;
            let path = uprobes::resolve(file, pid)?;
            let symbols = kernel.symbols(&path);
            let functions = if names.many(function) {
                let symbols = symbols
                    .with_context(|| format!("cannot read the symbols of {}", path.display()))?;
                expand(
                    function,
                    names,
                    symbols.keys().map(String::as_str),
                    "function",
                )?
            } else {
                // One missing from the symbol table may still be in a
                // separate debug file, where the attach looks.
                vec![function.clone()]
            };
            Ok(Resolved::User {
                path,
                functions,
                ret: *ret,
            })
        }
        Event::Usdt {
            file,
            provider,
            name,
        } => {
            uprobes_work(kernel)?;
            let path = uprobes::resolve(file, pid)?;
            let wanted = if provider.is_empty() {
                name.clone()
            } else {
                format!("{provider}.{name}")
            };
            let probe = usdt::find(&path, &wanted).map_err(|e| anyhow::anyhow!("{event}: {e}"))?;
            Ok(Resolved::Usdt(probe, format!("{provider}:{name}")))
        }
        Event::Counter(_) | Event::Tracepoint { .. } => {
            anyhow::bail!("{event} is not a probe")
        }
    }
}

impl Resolved {
    /// Attaches `progs` at every site, in process `pid` only where given
    /// (uprobes), else everywhere.
    pub fn attach(
        &self,
        ebpf: &mut Ebpf,
        kernel: &mut Kernel,
        progs: &Programs<'_>,
        pid: Option<u32>,
    ) -> anyhow::Result<Attached> {
        match self {
            Self::Kernel { functions, ret } => {
                let (prog, mech) = if *ret {
                    (progs.kretprobe, Mechanism::Kretprobe)
                } else {
                    (progs.kprobe, Mechanism::Kprobe)
                };
                for f in functions {
                    attach_kernel_fn(ebpf, kernel, prog, mech, f)?;
                }
                Ok(Attached {
                    sites: functions.len(),
                    how: format!("{mech} on {}", listed(functions)),
                    links: Vec::new(),
                })
            }
            Self::User {
                path,
                functions,
                ret,
            } => {
                let (prog, mech) = if *ret {
                    (progs.uretprobe, "uretprobe")
                } else {
                    (progs.uprobe, "uprobe")
                };
                for f in functions {
                    let symbols = kernel.symbols(path);
                    uprobes::attach(ebpf, prog, f, path, symbols, pid)?;
                }
                Ok(Attached {
                    sites: functions.len(),
                    how: format!("{mech} on {} in {}", listed(functions), path.display()),
                    links: Vec::new(),
                })
            }
            Self::Usdt(probe, label) => {
                let mut links = Vec::with_capacity(probe.sites.len());
                for site in &probe.sites {
                    links.push(usdt::attach(ebpf, progs.uprobe, &probe.file, site, pid)?);
                }
                Ok(Attached {
                    sites: links.len(),
                    how: format!(
                        "USDT probe {label} in {}, {} site(s)",
                        probe.file.display(),
                        links.len()
                    ),
                    links,
                })
            }
        }
    }
}

/// Finds `event`'s sites ([`resolve`]) and attaches `progs` at them
/// ([`Resolved::attach`]).
pub fn attach(
    ebpf: &mut Ebpf,
    kernel: &mut Kernel,
    progs: &Programs<'_>,
    event: &Event,
    names: Names,
    pid: Option<u32>,
) -> anyhow::Result<Attached> {
    resolve(kernel, event, names, pid)?.attach(ebpf, kernel, progs, pid)
}

/// A list of names for a message: the first few and how many more.
fn listed(names: &[String]) -> String {
    const SHOWN: usize = 3;
    let mut text = names[..names.len().min(SHOWN)].join(", ");
    if names.len() > SHOWN {
        text.push_str(&format!(" and {} more", names.len() - SHOWN));
    }
    text
}

/// Fails unless uprobes work here, which spec `raw` needs.
fn needs_uprobes(kernel: &mut Kernel, raw: &str) -> anyhow::Result<()> {
    kernel
        .check(Mechanism::Uprobe)
        .map_err(|why| anyhow::anyhow!("{raw:?} needs uprobes, which do not work here: {why}"))
}

/// One parsed spec (argdist's or trace's) in its slot of the object's
/// `spec_programs!`.
#[derive(Debug, Clone, Copy)]
pub struct Slot<'a> {
    /// The slot: its programs end in `_N`.
    pub index: usize,
    /// The spec as given, for errors.
    pub raw: &'a str,
    /// Where it goes.
    pub target: &'a Target,
    /// A return probe.
    pub ret: bool,
    /// A return probe that needs its entry's arguments or time.
    pub need_entry: bool,
}

/// Attaches a slot's programs for its spec; says how, for `-v`. USDT
/// probes' perf events go to `links`, which keeps them attached.
pub fn attach_slot(
    ebpf: &mut Ebpf,
    kernel: &mut Kernel,
    slot: &Slot<'_>,
    pid: Option<u32>,
    links: &mut Vec<OwnedFd>,
) -> anyhow::Result<String> {
    let (i, ret) = (slot.index, slot.ret);
    match slot.target {
        Target::Usdt { probe, found } => {
            needs_uprobes(kernel, slot.raw)?;
            for site in &found.sites {
                links.push(crate::probes::usdt::attach(
                    ebpf,
                    &format!("{UPROBE_PROGRAMS}_{i}"),
                    &found.file,
                    site,
                    pid,
                )?);
            }
            let semaphores = found.sites.iter().filter(|s| s.semaphore != 0).count();
            Ok(format!(
                "USDT probe {probe} in {}: {} site(s), {semaphores} semaphore(s) raised",
                found.file.display(),
                found.sites.len()
            ))
        }
        Target::Tracepoint { category, event } => {
            Hooks::new(Mechanism::Tracepoint, kernel)?.attach(
                ebpf,
                &format!("{TRACEPOINT_PROGRAMS}_{i}"),
                category,
                event,
            )?;
            Ok(format!("tracepoint {category}:{event}"))
        }
        Target::Kernel { function } => {
            kernel.check(Mechanism::Kprobe).map_err(|why| {
                anyhow::anyhow!(
                    "{:?} needs kprobes, which this kernel does not offer ({why}); \
                     tracepoints (t:) work everywhere",
                    slot.raw
                )
            })?;
            let function = &kernel.function(function)?;
            if ret {
                attach_kernel_fn(
                    ebpf,
                    kernel,
                    &format!("{KRETPROBE_PROGRAMS}_{i}"),
                    Mechanism::Kretprobe,
                    function,
                )?;
            }
            if !ret || slot.need_entry {
                attach_kernel_fn(
                    ebpf,
                    kernel,
                    &format!("{KPROBE_PROGRAMS}_{i}"),
                    Mechanism::Kprobe,
                    function,
                )?;
            }
            Ok(format!(
                "{} {function}",
                if ret { "kretprobe" } else { "kprobe" }
            ))
        }
        Target::User { library, function } => {
            needs_uprobes(kernel, slot.raw)?;
            let file = uprobes::resolve(library, pid)?;
            let symbols = kernel.symbols(&file);
            if ret {
                let prog = format!("{URETPROBE_PROGRAMS}_{i}");
                uprobes::attach(ebpf, &prog, function, &file, symbols, pid)?;
            }
            if !ret || slot.need_entry {
                let prog = format!("{UPROBE_PROGRAMS}_{i}");
                uprobes::attach(ebpf, &prog, function, &file, symbols, pid)?;
            }
            Ok(format!(
                "{} {function} in {}",
                if ret { "uretprobe" } else { "uprobe" },
                file.display()
            ))
        }
    }
}

//! `rtrace list [GLOB]`: what can be traced here, as `perf list` and bcc's
//! `tplist` show it: hardware, cache and software events, tracepoints (with
//! their fields under `-v`), kernel functions, and a binary's USDT probes
//! and functions (`-l BINARY`, `-p PID`); each kind with what it needs and
//! whether this machine has it.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use object::{Object as _, ObjectSymbol as _};

use crate::output::Sink;

/// List the events, tracepoints and probes this machine offers.
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:
  rtrace list                      # every event and tracepoint
  rtrace list 'sched:*'            # the scheduler's tracepoints
  rtrace list -v sched:sched_switch   # with their fields, as tplist -v
  rtrace list 'p:vfs_*'            # kernel functions kprobes can attach to
  rtrace list -l /usr/bin/python3  # a binary's USDT probes and functions
  rtrace list -p 185 'u:*:malloc'  # in every file a process maps")]
pub struct Args {
    /// Only what matches this glob (`*`, `?`): a name (`sched:*`,
    /// `*cache*`) or a spec with its kind (`t:sched:*` for tracepoints,
    /// `p:vfs_*` for kernel functions, `u:*:malloc` for user functions and
    /// probes with -l or -p).
    glob: Option<String>,
    /// Show each tracepoint's fields with their types, as tplist -v.
    #[arg(short, long)]
    verbose: bool,
    /// List this binary's USDT probes and functions instead.
    #[arg(
        short = 'l',
        long = "lib",
        value_name = "BINARY",
        conflicts_with = "pid"
    )]
    binary: Option<PathBuf>,
    /// List the USDT probes and functions of every file this process maps.
    #[arg(short, long)]
    pid: Option<u32>,
    /// Print one JSON object per entry.
    #[arg(long)]
    json: bool,
}

/// One thing that can be traced.
#[derive(Debug, Clone, serde::Serialize)]
struct Entry {
    /// As `-e` and the specs spell it.
    name: String,
    /// hardware, cache, software, tracepoint, kernel-function, usdt,
    /// user-function.
    kind: &'static str,
    /// perf's bracketed description.
    description: String,
    /// Whether this machine has it.
    available: bool,
    /// Why not, where it has not.
    #[serde(skip_serializing_if = "Option::is_none")]
    why: Option<String>,
    /// A tracepoint's fields (`-v`): type and name, as its format file
    /// declares them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    fields: Vec<Field>,
}

#[derive(Debug, Clone, serde::Serialize)]
struct Field {
    #[serde(rename = "type")]
    c_type: String,
    name: String,
    /// The declaration as the format file writes it (`char prev_comm[16]`).
    decl: String,
}

/// The generic hardware cache events perf lists (of all it takes).
const CACHE: [&str; 15] = [
    "L1-dcache-loads",
    "L1-dcache-load-misses",
    "L1-dcache-stores",
    "L1-icache-load-misses",
    "LLC-loads",
    "LLC-load-misses",
    "LLC-stores",
    "LLC-store-misses",
    "dTLB-loads",
    "dTLB-load-misses",
    "dTLB-stores",
    "dTLB-store-misses",
    "iTLB-load-misses",
    "branch-loads",
    "branch-load-misses",
];

/// A glob as a regex over the whole name.
fn glob(pattern: &str) -> anyhow::Result<regex::Regex> {
    crate::probes::event::glob(pattern).with_context(|| format!("bad glob {pattern:?}"))
}

/// A table of [`crate::probes::event`]'s, each event with its aliases as
/// perf list shows them.
fn names(table: &[(&[&str], u64)]) -> Vec<String> {
    table.iter().map(|(n, _)| n.join(" OR ")).collect()
}

/// Which kinds a glob's prefix keeps (bcc's `t:`, `p:`, `r:`, `u:`), and
/// the glob without it.
fn kinds_of(pattern: &str) -> (Option<&'static [&'static str]>, &str) {
    const TRACEPOINTS: &[&str] = &["tracepoint"];
    const FUNCTIONS: &[&str] = &["kernel-function"];
    const USER: &[&str] = &["usdt", "user-function"];
    for (prefix, kinds) in [
        ("t:", TRACEPOINTS),
        ("tracepoint:", TRACEPOINTS),
        ("p:", FUNCTIONS),
        ("r:", FUNCTIONS),
        ("kprobe:", FUNCTIONS),
        ("u:", USER),
    ] {
        if let Some(rest) = pattern.strip_prefix(prefix) {
            return (Some(kinds), rest);
        }
    }
    (None, pattern)
}

/// A tracepoint's own fields from its format file, in order (the
/// `common_` ones every record starts with are left out, as tplist does).
fn fields(root: &Path, tracepoint: &str) -> Vec<Field> {
    let Some((category, name)) = tracepoint.split_once(':') else {
        return Vec::new();
    };
    let path = root.join("events").join(category).join(name).join("format");
    let Ok(text) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("field:"))
        .filter_map(|l| l.split(';').next())
        .filter_map(|decl| {
            let decl = decl.trim();
            // The name is the last word, less any array bounds.
            let (c_type, last) = decl.rsplit_once(' ')?;
            let name = last.split('[').next().unwrap_or(last);
            let c_type = match last.find('[') {
                Some(i) => format!("{c_type}{}", &last[i..]),
                None => c_type.to_owned(),
            };
            (!name.starts_with("common_")).then(|| Field {
                c_type,
                name: name.to_owned(),
                decl: decl.to_owned(),
            })
        })
        .collect()
}

/// The events and tracepoints of this machine that `keep` admits, and its
/// kernel functions where `functions` (else their number, in a note:
/// there are tens of thousands).
fn kernel_entries(
    keep: &dyn Fn(&str, &str) -> bool,
    verbose: bool,
    functions: bool,
    notes: &mut Vec<String>,
) -> Vec<Entry> {
    let mut out = Vec::new();
    let pmu = crate::kernel::features::has_pmu();
    let no_pmu = "no hardware PMU on this machine (/sys/bus/event_source/devices has no cpu)";
    let add = |out: &mut Vec<Entry>, names: &[String], kind: &'static str, desc: &str, ok: bool| {
        for n in names {
            if n.split(" OR ").any(|a| keep(kind, a)) {
                out.push(Entry {
                    name: n.clone(),
                    kind,
                    description: desc.to_owned(),
                    available: ok,
                    why: (!ok).then(|| no_pmu.to_owned()),
                    fields: Vec::new(),
                });
            }
        }
    };
    use crate::probes::event::{HARDWARE, SOFTWARE};
    let cache: Vec<String> = CACHE.iter().map(|&c| c.to_owned()).collect();
    add(
        &mut out,
        &names(&HARDWARE),
        "hardware",
        "Hardware event",
        pmu,
    );
    add(&mut out, &cache, "cache", "Hardware cache event", pmu);
    add(
        &mut out,
        &names(&SOFTWARE),
        "software",
        "Software event",
        true,
    );
    let root = match crate::kernel::tracefs::root() {
        Ok(root) => root,
        Err(e) => {
            notes.push(format!(
                "tracepoints and kernel functions cannot be listed: {e}"
            ));
            return out;
        }
    };
    match std::fs::read_to_string(root.join("available_events")) {
        Ok(text) => {
            let mut names: Vec<&str> = text.lines().map(str::trim).collect();
            names.sort_unstable();
            for n in names.into_iter().filter(|n| keep("tracepoint", n)) {
                out.push(Entry {
                    name: n.to_owned(),
                    kind: "tracepoint",
                    description: "Tracepoint event".to_owned(),
                    available: true,
                    why: None,
                    fields: if verbose {
                        fields(&root, n)
                    } else {
                        Vec::new()
                    },
                });
            }
        }
        Err(e) => notes.push(format!(
            "tracepoints cannot be listed: {}: {e}",
            root.join("available_events").display()
        )),
    }
    let listed = root.join("available_filter_functions");
    match std::fs::read_to_string(&listed) {
        Ok(text) if !functions => notes.push(format!(
            "{} kernel functions can be probed (p:NAME, r:NAME); list them with \
             `rtrace list 'p:GLOB'`",
            text.lines().count()
        )),
        Ok(text) => {
            for line in text.lines() {
                let name = line.split_whitespace().next().unwrap_or("");
                if keep("kernel-function", name) {
                    out.push(Entry {
                        name: format!("p:{name}"),
                        kind: "kernel-function",
                        description: match line.split_whitespace().nth(1) {
                            Some(module) => format!("Kernel function {module}"),
                            None => "Kernel function".to_owned(),
                        },
                        available: true,
                        why: None,
                        fields: Vec::new(),
                    });
                }
            }
        }
        Err(e) => notes.push(format!(
            "kernel functions (p:NAME, r:NAME) cannot be listed: {}: {e}{}",
            listed.display(),
            match crate::kernel::features::lockdown().as_str() {
                l @ ("integrity" | "confidentiality") => format!(" (lockdown: {l})"),
                _ => String::new(),
            }
        )),
    }
    out
}

/// The USDT probes and functions of `file` that `keep` admits, spelled
/// `u:FILE:PROVIDER:NAME` and `u:FILE:FUNCTION`.
/// `file` is read, and named `shown` (the path the process maps it at,
/// read through its root).
fn user_entries(
    file: &Path,
    shown: &str,
    keep: &dyn Fn(&str, &str) -> bool,
) -> anyhow::Result<Vec<Entry>> {
    let mut out = Vec::new();
    let mut probes: Vec<(String, String, usize)> = Vec::new();
    for site in crate::probes::usdt::sites(file)? {
        match probes
            .iter_mut()
            .find(|(p, n, _)| *p == site.provider && *n == site.name)
        {
            Some(p) => p.2 += 1,
            None => probes.push((site.provider, site.name, 1)),
        }
    }
    for (provider, name, sites) in probes {
        let spec = format!("{provider}:{name}");
        if keep("usdt", &format!("{shown}:{spec}")) || keep("usdt", &spec) {
            out.push(Entry {
                name: format!("u:{shown}:{spec}"),
                kind: "usdt",
                description: format!("USDT probe, {sites} site(s)"),
                available: true,
                why: None,
                fields: Vec::new(),
            });
        }
    }
    let data = std::fs::read(file).with_context(|| format!("cannot read {shown}"))?;
    let elf = object::File::parse(&*data).with_context(|| format!("{shown} is not an ELF file"))?;
    let mut names: Vec<&str> = elf
        .symbols()
        .chain(elf.dynamic_symbols())
        .filter(|s| s.kind() == object::SymbolKind::Text && s.is_definition() && s.size() > 0)
        .filter_map(|s| s.name().ok())
        .filter(|n| !n.is_empty())
        .collect();
    names.sort_unstable();
    names.dedup();
    for n in names {
        if keep("user-function", &format!("{shown}:{n}")) || keep("user-function", n) {
            out.push(Entry {
                name: format!("u:{shown}:{n}"),
                kind: "user-function",
                description: "Function (uprobe)".to_owned(),
                available: true,
                why: None,
                fields: Vec::new(),
            });
        }
    }
    Ok(out)
}

/// The files process `pid` maps executable: where to read each (through
/// the process's root), and its path as the process sees it (read as
/// the walk reads mappings: a path may hold spaces, which splitting the
/// line at them cut short). The paths are in the directory returned,
/// which must outlive them (a thread's is held open, `ProcDir`).
fn mapped_files(
    pid: u32,
) -> anyhow::Result<(crate::kernel::procmaps::ProcDir, Vec<(PathBuf, String)>)> {
    let dir = crate::kernel::procmaps::proc_dir(pid);
    let maps = crate::kernel::procmaps::read_in(&dir)
        .with_context(|| format!("process {pid} does not exist or cannot be read"))?;
    let mut files: Vec<(PathBuf, String)> = maps
        .iter()
        .filter(|m| m.exec)
        .filter_map(|m| m.path())
        .map(|p| (PathBuf::from(format!("{dir}/root{p}")), p.to_owned()))
        .collect();
    files.sort();
    files.dedup();
    Ok((dir, files))
}

/// What was listed, with the notes on what could not be.
struct Listing {
    entries: Vec<Entry>,
    notes: Vec<String>,
    user: bool,
}

impl serde::Serialize for Listing {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        ser.collect_seq(&self.entries)
    }
}

impl crate::output::Record for Listing {
    fn text(&self, out: &mut String) {
        use std::fmt::Write as _;
        if !self.user {
            out.push_str("List of pre-defined events (to be used in -e):\n\n");
        }
        for e in &self.entries {
            let desc = match &e.why {
                Some(why) => format!("[{}; not here: {why}]", e.description),
                None => format!("[{}]", e.description),
            };
            let _ = writeln!(out, "  {:<50} {desc}", e.name);
            for f in &e.fields {
                let _ = writeln!(out, "      {};", f.decl);
            }
        }
        if !self.user {
            out.push_str(
                "\nSampling and counting need CAP_PERFMON (or kernel.perf_event_paranoid at \
                 most 1 for your own processes); tracepoints and probes need CAP_BPF and \
                 CAP_PERFMON too.\n",
            );
        }
        for n in &self.notes {
            let _ = writeln!(out, "Note: {n}");
        }
    }
}

/// Runs the command.
pub fn run(args: Args) -> anyhow::Result<()> {
    let (kinds, pattern) = match &args.glob {
        Some(g) => {
            let (k, rest) = kinds_of(g);
            (k, Some(glob(rest)?))
        }
        None => (None, None),
    };
    let keep = |kind: &str, name: &str| {
        kinds.is_none_or(|k| k.contains(&kind)) && pattern.as_ref().is_none_or(|p| p.is_match(name))
    };
    let mut notes = Vec::new();
    // Kept while the files are read: their paths are in it.
    let mut _dir = None;
    let files = match (&args.binary, args.pid) {
        (Some(b), _) => Some(vec![(b.clone(), b.display().to_string())]),
        (None, Some(pid)) => {
            let (dir, files) = mapped_files(pid)?;
            _dir = Some(dir);
            Some(files)
        }
        (None, None) => None,
    };
    let entries = match &files {
        Some(files) => {
            let mut all = Vec::new();
            for (f, shown) in files {
                match user_entries(f, shown, &keep) {
                    Ok(e) => all.extend(e),
                    // One file of a process may be gone or unreadable; the
                    // binary asked for by name may not.
                    Err(e) if args.pid.is_some() => notes.push(format!("{e:#}")),
                    Err(e) => return Err(e),
                }
            }
            all
        }
        // Without a glob, every kernel function would drown the rest:
        // they are counted, and listed with `p:GLOB`.
        None => kernel_entries(&keep, args.verbose, args.glob.is_some(), &mut notes),
    };
    let mut sink = Sink::new("list", args.json);
    if args.json {
        for n in &notes {
            eprintln!("rtrace: note: {n}");
        }
    }
    sink.emit(&Listing {
        entries,
        notes: if args.json { Vec::new() } else { notes },
        user: files.is_some(),
    })
}

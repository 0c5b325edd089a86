//! Event specs as perf and bcc spell them, for every tool that takes
//! events: perf's counters (`cycles`, `LLC-loads`, `page-faults:u`),
//! tracepoints (`sched:sched_switch`, `syscalls:sys_enter_*`, bcc's
//! `t:block:block_rq_insert`), and bcc's probes (`p:do_nanosleep`,
//! `r:vfs_read`, `u:/lib/x86_64-linux-gnu/libc.so.6:malloc`,
//! `u:BINARY:PROVIDER:NAME` for USDT). Errors point at the column.

use super::spec::SpecError;

/// `perf_event_attr.type` of perf's generic hardware events.
pub const TYPE_HARDWARE: u32 = 0;
/// `perf_event_attr.type` of the kernel's software events.
pub const TYPE_SOFTWARE: u32 = 1;
/// `perf_event_attr.type` of the generic hardware cache events.
pub const TYPE_HW_CACHE: u32 = 3;

/// perf's hardware events: names (the first perf's own, the rest its
/// aliases) and `config` (`PERF_COUNT_HW_*`).
pub const HARDWARE: [(&[&str], u64); 10] = [
    (&["cpu-cycles", "cycles"], 0),
    (&["instructions"], 1),
    (&["cache-references"], 2),
    (&["cache-misses"], 3),
    (&["branch-instructions", "branches"], 4),
    (&["branch-misses"], 5),
    (&["bus-cycles"], 6),
    (&["stalled-cycles-frontend", "idle-cycles-frontend"], 7),
    (&["stalled-cycles-backend", "idle-cycles-backend"], 8),
    (&["ref-cycles"], 9),
];

/// The kernel's software events, as perf names them
/// (`PERF_COUNT_SW_*`).
pub const SOFTWARE: [(&[&str], u64); 12] = [
    (&["cpu-clock"], 0),
    (&["task-clock"], 1),
    (&["page-faults", "faults"], 2),
    (&["context-switches", "cs"], 3),
    (&["cpu-migrations", "migrations"], 4),
    (&["minor-faults"], 5),
    (&["major-faults"], 6),
    (&["alignment-faults"], 7),
    (&["emulation-faults"], 8),
    (&["dummy"], 9),
    (&["bpf-output"], 10),
    (&["cgroup-switches"], 11),
];

/// perf's generic cache names (`PERF_COUNT_HW_CACHE_*`, by id).
const CACHES: [&str; 7] = [
    "L1-dcache",
    "L1-icache",
    "LLC",
    "dTLB",
    "iTLB",
    "branch",
    "node",
];

/// The cache operations (`PERF_COUNT_HW_CACHE_OP_*`), singular and
/// plural as perf's names use them.
const OPS: [(&str, &str); 3] = [
    ("load", "loads"),
    ("store", "stores"),
    ("prefetch", "prefetches"),
];

/// The hardware cache events perf lists, by name: `CACHE-OPs` counts the
/// accesses and `CACHE-OP-misses` the misses.
pub fn cache_events() -> impl Iterator<Item = (String, u64)> {
    CACHES.iter().enumerate().flat_map(|(c, cache)| {
        OPS.iter().enumerate().flat_map(move |(o, (op, ops))| {
            let config = c as u64 | (o as u64) << 8;
            [
                (format!("{cache}-{ops}"), config),
                (format!("{cache}-{op}-misses"), config | 1 << 16),
            ]
        })
    })
}

/// A counter of the kernel's perf events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counter {
    /// Its name as given, without its modifiers (perf prints it so).
    pub name: String,
    /// `perf_event_attr.type`: [`TYPE_HARDWARE`], [`TYPE_SOFTWARE`] or
    /// [`TYPE_HW_CACHE`].
    pub kind: u32,
    /// `perf_event_attr.config`.
    pub config: u64,
    /// `:u`: user mode only.
    pub user_only: bool,
    /// `:k`: kernel mode only.
    pub kernel_only: bool,
}

impl Counter {
    /// perf's counter by `name` (or an alias), in both modes.
    pub fn named(name: &str) -> Option<Self> {
        let (kind, config) = counter(name)?;
        Some(Self {
            name: name.to_owned(),
            kind,
            config,
            user_only: false,
            kernel_only: false,
        })
    }

    /// Whether it needs a hardware PMU.
    pub fn hardware(&self) -> bool {
        self.kind != TYPE_SOFTWARE
    }

    /// The name with its modifiers, as perf prints it (`cycles:u`).
    pub fn display(&self) -> String {
        match (self.user_only, self.kernel_only) {
            (true, false) => format!("{}:u", self.name),
            (false, true) => format!("{}:k", self.name),
            _ => self.name.clone(),
        }
    }
}

/// One event spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A perf counter: hardware, hardware cache or software.
    Counter(Counter),
    /// Tracepoints: `category:event`, either part a glob.
    Tracepoint {
        /// The category (`sched`), or a glob over categories.
        category: String,
        /// The event (`sched_switch`), or a glob.
        event: String,
    },
    /// A kernel function's entry (`p:`) or return (`r:`).
    Kernel {
        /// The function, or a glob.
        function: String,
        /// `r:`: its return.
        ret: bool,
    },
    /// A function of an executable or library (`u:FILE:FUNCTION`, or
    /// bcc's `p:FILE:FUNCTION`), or its return (bcc's `r:FILE:FUNCTION`).
    User {
        /// The file, as written (a path or a library's name).
        file: String,
        /// The function, or a glob.
        function: String,
        /// `r:`: its return.
        ret: bool,
    },
    /// A USDT probe (`u:FILE:PROVIDER:NAME`).
    Usdt {
        /// The file, as written.
        file: String,
        /// The provider.
        provider: String,
        /// The probe's name.
        name: String,
    },
}

impl std::fmt::Display for Event {
    /// The spec again, in the grammar's own spelling (bcc's letters for
    /// probes, perf's for counters and tracepoints).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Counter(c) => f.write_str(&c.display()),
            Self::Tracepoint { category, event } => write!(f, "{category}:{event}"),
            Self::Kernel { function, ret } => {
                write!(f, "{}:{function}", if *ret { "r" } else { "p" })
            }
            Self::User {
                file,
                function,
                ret: false,
            } => write!(f, "u:{file}:{function}"),
            Self::User { file, function, .. } => write!(f, "r:{file}:{function}"),
            Self::Usdt {
                file,
                provider,
                name,
            } => write!(f, "u:{file}:{provider}:{name}"),
        }
    }
}

impl Event {
    /// Whether it is a probe (`p:`, `r:`, `u:`, USDT), attached by
    /// [`crate::probes::attach`], rather than a counter or tracepoints.
    pub fn is_probe(&self) -> bool {
        matches!(
            self,
            Self::Kernel { .. } | Self::User { .. } | Self::Usdt { .. }
        )
    }
}

/// The type and config of the counter named `name`, if perf has one by
/// that name (cache events in any case, as perf takes them).
fn counter(name: &str) -> Option<(u32, u64)> {
    let fixed = |table: &[(&[&str], u64)], kind| {
        table
            .iter()
            .find(|(names, _)| names.contains(&name))
            .map(|(_, config)| (kind, *config))
    };
    fixed(&HARDWARE, TYPE_HARDWARE)
        .or_else(|| fixed(&SOFTWARE, TYPE_SOFTWARE))
        .or_else(|| {
            cache_events()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(_, config)| (TYPE_HW_CACHE, config))
        })
}

fn err<T>(column: usize, message: impl Into<String>) -> Result<T, SpecError> {
    Err(SpecError {
        column: column + 1,
        message: message.into(),
    })
}

/// Whether `s` names a probe point: letters, digits, `_`, `.`, and the
/// glob characters.
fn name_ok(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '*' | '?' | '-'))
}

/// Whether `s` can be a function name or pattern: a name, a glob, or a
/// regular expression (bcc's `-r`), so anything but separators and space.
fn function_ok(s: &str) -> bool {
    !s.is_empty() && !s.contains(|c: char| c.is_whitespace() || c == ':')
}

/// Parses one event spec.
pub fn parse(spec: &str) -> Result<Event, SpecError> {
    let spec_trim = spec.trim_end();
    if spec_trim.is_empty() {
        return err(
            0,
            "empty event: name one, as in cycles or sched:sched_switch",
        );
    }
    let parts: Vec<&str> = spec_trim.split(':').collect();
    // Columns of each part.
    let mut at = Vec::with_capacity(parts.len());
    let mut col = 0;
    for p in &parts {
        at.push(col);
        col += p.len() + 1;
    }
    // A counter, with perf's modifiers after a colon.
    if let Some(mut c) = Counter::named(parts[0]) {
        match parts.len() {
            1 => {}
            2 => {
                let (mut u, mut k) = (false, false);
                for (i, m) in parts[1].char_indices() {
                    match m {
                        'u' => u = true,
                        'k' => k = true,
                        // Guest/host, precision and the like: no meaning
                        // for the counts rtrace takes.
                        'h' | 'H' | 'G' | 'p' | 'P' | 'S' | 'D' => {}
                        _ => {
                            return err(
                                at[1] + i,
                                format!("unknown modifier {m:?}: use u (user) or k (kernel)"),
                            );
                        }
                    }
                }
                c.user_only = u && !k;
                c.kernel_only = k && !u;
            }
            _ => return err(at[2] - 1, "a counter takes one set of modifiers"),
        }
        return Ok(Event::Counter(c));
    }
    let prefix = parts[0];
    let rest = &parts[1..];
    let rest_at = &at[1..];
    match (prefix, rest.len()) {
        ("t" | "tracepoint", 2) => tracepoint(rest[0], rest[1], rest_at[0], rest_at[1]),
        ("t" | "tracepoint", _) => err(
            at[0],
            "a tracepoint is t:CATEGORY:EVENT, as in t:sched:sched_switch",
        ),
        ("p" | "r" | "kprobe" | "kretprobe", 1) => {
            if !function_ok(rest[0]) {
                return err(rest_at[0], format!("bad function name {:?}", rest[0]));
            }
            Ok(Event::Kernel {
                function: rest[0].to_owned(),
                ret: matches!(prefix, "r" | "kretprobe"),
            })
        }
        // bcc's `p::function` has an empty library for the kernel.
        ("p" | "r", 2) if rest[0].is_empty() => {
            if !function_ok(rest[1]) {
                return err(rest_at[1], format!("bad function name {:?}", rest[1]));
            }
            Ok(Event::Kernel {
                function: rest[1].to_owned(),
                ret: prefix == "r",
            })
        }
        // bcc's uprobes: `p:FILE:FUNCTION`, `r:FILE:FUNCTION`.
        ("p" | "r", 2) => {
            if !function_ok(rest[1]) {
                return err(rest_at[1], format!("bad function name {:?}", rest[1]));
            }
            Ok(Event::User {
                file: rest[0].to_owned(),
                function: rest[1].to_owned(),
                ret: prefix == "r",
            })
        }
        ("p" | "r" | "kprobe" | "kretprobe", _) => err(
            at[0],
            "a kernel function is p:FUNCTION (entry) or r:FUNCTION (return); a user one \
             p:FILE:FUNCTION or r:FILE:FUNCTION",
        ),
        ("u" | "uprobe", 2 | 3) if rest[0].is_empty() => err(
            rest_at[0],
            "name the executable or library, as in u:libc:malloc",
        ),
        ("u" | "uprobe", 2) => {
            if !function_ok(rest[1]) {
                return err(rest_at[1], format!("bad function name {:?}", rest[1]));
            }
            Ok(Event::User {
                file: rest[0].to_owned(),
                function: rest[1].to_owned(),
                ret: false,
            })
        }
        ("u" | "usdt", 3) => {
            // An empty provider is any (`u:FILE::NAME`).
            for i in [1, 2] {
                if !(name_ok(rest[i]) || i == 1 && rest[i].is_empty()) {
                    return err(rest_at[i], format!("bad probe name {:?}", rest[i]));
                }
            }
            Ok(Event::Usdt {
                file: rest[0].to_owned(),
                provider: rest[1].to_owned(),
                name: rest[2].to_owned(),
            })
        }
        ("u" | "uprobe" | "usdt", _) => err(
            at[0],
            "a user probe is u:FILE:FUNCTION, or u:FILE:PROVIDER:NAME for USDT",
        ),
        // perf's `category:event`.
        (_, 1) => tracepoint(parts[0], parts[1], at[0], at[1]),
        (_, 0) => err(
            0,
            format!(
                "unknown event {prefix:?}: not a perf counter (rtrace list shows them) \
                 nor CATEGORY:EVENT"
            ),
        ),
        _ => err(
            at[2] - 1,
            "too many ':': a tracepoint is CATEGORY:EVENT, a probe p:, r:, t: or u:",
        ),
    }
}

fn tracepoint(
    category: &str,
    event: &str,
    cat_at: usize,
    ev_at: usize,
) -> Result<Event, SpecError> {
    if !name_ok(category) {
        return err(cat_at, format!("bad tracepoint category {category:?}"));
    }
    if !name_ok(event) {
        return err(ev_at, format!("bad tracepoint name {event:?}"));
    }
    Ok(Event::Tracepoint {
        category: category.to_owned(),
        event: event.to_owned(),
    })
}

/// Parses perf's `-e` list: specs separated by commas (and `-e` given
/// again). A column in an error counts from the start of `list`.
pub fn parse_list(list: &str) -> Result<Vec<Event>, SpecError> {
    let mut out = Vec::new();
    let mut start = 0;
    for part in list.split(',') {
        let lead = part.len() - part.trim_start().len();
        out.push(parse(part.trim_start()).map_err(|mut e| {
            e.column += start + lead;
            e
        })?);
        start += part.len() + 1;
    }
    Ok(out)
}

/// Why the tracepoints of a spec could not be found.
#[derive(Debug, thiserror::Error)]
pub enum TracepointError {
    /// tracefs' list could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The list's path.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Nothing matches.
    #[error("no tracepoint matches {0} (rtrace list shows them)")]
    NoMatch(String),
    /// A glob that makes no pattern.
    #[error("bad glob: {0}")]
    Glob(#[from] regex::Error),
}

/// The tracepoints tracefs (at `root`) lists that `category:event`
/// names, either part a glob; sorted, and at least one.
pub fn tracepoints(
    root: &std::path::Path,
    category: &str,
    event: &str,
) -> Result<Vec<(String, String)>, TracepointError> {
    let path = root.join("available_events");
    let text = std::fs::read_to_string(&path).map_err(|source| TracepointError::Read {
        path: path.clone(),
        source,
    })?;
    let found = matching(&text, category, event)?;
    if found.is_empty() {
        return Err(TracepointError::NoMatch(format!("{category}:{event}")));
    }
    Ok(found)
}

/// The `category:event` lines of `available` that the globs match,
/// sorted.
fn matching(
    available: &str,
    category: &str,
    event: &str,
) -> Result<Vec<(String, String)>, regex::Error> {
    let (c, e) = (glob(category)?, glob(event)?);
    let mut found: Vec<(String, String)> = available
        .lines()
        .filter_map(|l| l.trim().split_once(':'))
        .filter(|(cat, ev)| c.is_match(cat) && e.is_match(ev))
        .map(|(cat, ev)| (cat.to_owned(), ev.to_owned()))
        .collect();
    found.sort();
    found.dedup();
    Ok(found)
}

/// A glob as a regex over the whole name.
pub fn glob(pattern: &str) -> Result<regex::Regex, regex::Error> {
    let mut re = String::from("^");
    for c in pattern.chars() {
        match c {
            '*' => re.push_str(".*"),
            '?' => re.push('.'),
            c => re.push_str(&regex::escape(&c.to_string())),
        }
    }
    re.push('$');
    regex::Regex::new(&re)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counter_of(spec: &str) -> Counter {
        match parse(spec).unwrap() {
            Event::Counter(c) => c,
            other => panic!("{spec}: {other:?}"),
        }
    }

    /// Encodings as perf's own tables give them (tools/perf/util/evsel.c,
    /// include/uapi/linux/perf_event.h).
    #[test]
    fn counters_are_encoded_as_perf_encodes_them() {
        let c = counter_of("cycles");
        assert_eq!((c.kind, c.config, c.name.as_str()), (0, 0, "cycles"));
        assert_eq!(counter_of("branches").config, 4);
        assert_eq!(counter_of("cs").config, 3);
        assert_eq!(counter_of("task-clock").kind, TYPE_SOFTWARE);
        // LLC read access: cache 2, op 0, result 0.
        let c = counter_of("LLC-loads");
        assert_eq!((c.kind, c.config), (TYPE_HW_CACHE, 2));
        // L1 dcache read miss: 0 | 0 << 8 | 1 << 16.
        assert_eq!(counter_of("L1-dcache-load-misses").config, 0x10000);
        // dTLB store miss: 3 | 1 << 8 | 1 << 16.
        assert_eq!(counter_of("dTLB-store-misses").config, 0x10103);
        let c = counter_of("cycles:u");
        assert!(c.user_only && !c.kernel_only);
        assert_eq!(c.display(), "cycles:u");
        let c = counter_of("page-faults:k");
        assert!(c.kernel_only);
        assert!(!counter_of("cycles:uk").user_only);
    }

    #[test]
    fn tracepoints_and_probes_parse_in_perfs_and_bccs_spellings() {
        let tp = |c: &str, e: &str| Event::Tracepoint {
            category: c.into(),
            event: e.into(),
        };
        assert_eq!(
            parse("sched:sched_switch").unwrap(),
            tp("sched", "sched_switch")
        );
        assert_eq!(
            parse("t:block:block_rq_insert").unwrap(),
            tp("block", "block_rq_insert")
        );
        assert_eq!(
            parse("syscalls:sys_enter_*").unwrap(),
            tp("syscalls", "sys_enter_*")
        );
        assert_eq!(parse("block:*").unwrap(), tp("block", "*"));
        assert_eq!(
            parse("r:vfs_read").unwrap(),
            Event::Kernel {
                function: "vfs_read".into(),
                ret: true
            }
        );
        assert_eq!(
            parse("u:/lib/x86_64-linux-gnu/libc.so.6:malloc").unwrap(),
            Event::User {
                file: "/lib/x86_64-linux-gnu/libc.so.6".into(),
                function: "malloc".into(),
                ret: false,
            }
        );
        assert_eq!(
            parse("r:c:malloc").unwrap(),
            Event::User {
                file: "c".into(),
                function: "malloc".into(),
                ret: true,
            }
        );
        for spec in [
            "p:tcp_send*",
            "r:vfs_read",
            "u:c:malloc",
            "r:c:free",
            "u:c:libc:setjmp",
        ] {
            assert_eq!(parse(spec).unwrap().to_string(), spec);
        }
        assert_eq!(
            parse("u:./usdtfix:rtrace:tick").unwrap(),
            Event::Usdt {
                file: "./usdtfix".into(),
                provider: "rtrace".into(),
                name: "tick".into()
            }
        );
        let list = parse_list("cycles,sched:sched_switch, cs").unwrap();
        assert_eq!(list.len(), 3);
    }

    #[test]
    fn globs_pick_tracepoints_from_the_kernels_list() {
        let list = "sched:sched_switch\nsched:sched_wakeup\nblock:block_rq_insert\n";
        assert_eq!(matching(list, "sched", "*").unwrap().len(), 2);
        assert_eq!(
            matching(list, "*", "*insert").unwrap()[0].1,
            "block_rq_insert"
        );
        assert!(matching(list, "irq", "*").unwrap().is_empty());
    }

    #[test]
    fn bad_specs_point_at_their_column() {
        let e = parse("cycles:x").unwrap_err();
        assert_eq!(e.column, 8, "{e}");
        let e = parse("bogus").unwrap_err();
        assert_eq!(e.column, 1);
        assert!(e.message.contains("unknown event"), "{e}");
        let e = parse("sched:sched switch").unwrap_err();
        assert_eq!(e.column, 7, "{e}");
        let e = parse_list("cycles,sched:a:b").unwrap_err();
        assert_eq!(e.column, 15, "{e}");
        assert!(parse("t:sched").is_err());
        assert!(parse("u::malloc").is_err());
        assert!(parse("").is_err());
    }
}

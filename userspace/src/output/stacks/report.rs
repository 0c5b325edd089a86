//! perf report's tables over counted stacks: overhead with children and
//! self by sort keys (`comm`, `pid`, `dso`, `sym`), `--hierarchy`,
//! `--percent-limit`, filters, and each row's call chains (`-g`), in
//! `perf report --stdio`'s layout or as JSON. The same tables serve a
//! live profile (`--report`) and a saved one (`rtrace report FILE`).

use std::{fmt::Write as _, sync::Arc};

use foldhash::HashMap;

use crate::stacks::{
    sample::Sample,
    symbolize::{Frame, Kind},
};

/// perf report's options, as perf spells them.
#[derive(Debug, Clone, clap::Args)]
pub struct ReportArgs {
    /// Sort (and group) rows by these keys, comma-separated: comm, pid
    /// (the process; tgid is its other name), tid (the thread: perf's
    /// pid), dso, sym (perf report's --sort).
    #[arg(long, short = 's', value_name = "KEYS", default_value = "comm,dso,sym",
          value_parser = parse_keys)]
    pub sort: Keys,
    /// Rows by self overhead only: no children column (perf's default
    /// adds each function's callees to it).
    #[arg(long)]
    pub no_children: bool,
    /// Nest the rows: each key's groups, then the next key's within them.
    #[arg(long)]
    pub hierarchy: bool,
    /// Hide rows below this share, in percent.
    #[arg(long, value_name = "PCT", default_value_t = 0.0)]
    pub percent_limit: f64,
    /// Also show each row's sample count.
    #[arg(short = 'n', long = "show-nr-samples")]
    pub show_nr_samples: bool,
    /// Call chains under each row: `-g`, or `-g=TYPE,MIN,ORDER` (each
    /// part optional; the `=` keeps a duration or file after it apart),
    /// TYPE graph
    /// (a tree, the default), folded (one line a chain) or none, MIN the
    /// smallest chain shown in percent (0.5), ORDER caller (from the root,
    /// the default) or callee.
    #[arg(short = 'g', long = "call-graph", value_name = "TYPE,MIN,ORDER",
          num_args = 0..=1, require_equals = true, default_missing_value = "graph",
          value_parser = parse_call_graph)]
    pub call_graph: Option<CallGraph>,
    /// Only these commands (comma-separated).
    #[arg(long, value_name = "COMMS", value_delimiter = ',')]
    pub comms: Vec<String>,
    /// Only these process ids (comma-separated).
    #[arg(long, value_name = "PIDS", value_delimiter = ',')]
    pub pids: Vec<u32>,
    /// Only these thread ids (comma-separated).
    #[arg(long, value_name = "TIDS", value_delimiter = ',')]
    pub tids: Vec<u32>,
    /// Only frames in these shared objects (comma-separated, as the dso
    /// column names them: `libc.so.6`, `[kernel.kallsyms]`).
    #[arg(long, value_name = "DSOS", value_delimiter = ',')]
    pub dsos: Vec<String>,
    /// Only these functions (comma-separated).
    #[arg(long, value_name = "SYMBOLS", value_delimiter = ',')]
    pub symbols: Vec<String>,
}

impl Default for ReportArgs {
    /// The flags' defaults.
    fn default() -> Self {
        Self {
            sort: Keys(vec![Key::Comm, Key::Dso, Key::Sym]),
            no_children: false,
            hierarchy: false,
            percent_limit: 0.0,
            show_nr_samples: false,
            call_graph: None,
            comms: Vec::new(),
            pids: Vec::new(),
            tids: Vec::new(),
            dsos: Vec::new(),
            symbols: Vec::new(),
        }
    }
}

impl ReportArgs {
    /// The first option set to other than its default, by its flag, if
    /// any: live tools take them only with `--report`.
    pub fn changed(&self) -> Option<&'static str> {
        [
            (self.sort.0 != [Key::Comm, Key::Dso, Key::Sym], "--sort"),
            (self.no_children, "--no-children"),
            (self.hierarchy, "--hierarchy"),
            (self.percent_limit != 0.0, "--percent-limit"),
            (self.show_nr_samples, "-n"),
            (self.call_graph.is_some(), "-g"),
            (!self.comms.is_empty(), "--comms"),
            (!self.pids.is_empty(), "--pids"),
            (!self.tids.is_empty(), "--tids"),
            (!self.dsos.is_empty(), "--dsos"),
            (!self.symbols.is_empty(), "--symbols"),
        ]
        .into_iter()
        .find_map(|(set, flag)| set.then_some(flag))
    }

    /// Whether the table needs each sample's thread: sorted or filtered
    /// by it.
    pub fn by_thread(&self) -> bool {
        self.sort.0.contains(&Key::Tid) || !self.tids.is_empty()
    }
}

/// One sort key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    /// The command.
    Comm,
    /// The process, shown `pid:comm` as perf shows it.
    Pid,
    /// The thread, shown `tid:comm` (perf's `pid` key, which is by
    /// thread).
    Tid,
    /// The file the code is in.
    Dso,
    /// The function.
    Sym,
}

impl Key {
    fn title(self) -> &'static str {
        match self {
            Self::Comm => "Command",
            Self::Pid => "Pid:Command",
            Self::Tid => "Tid:Command",
            Self::Dso => "Shared Object",
            Self::Sym => "Symbol",
        }
    }

    fn json(self) -> &'static str {
        match self {
            Self::Comm => "comm",
            Self::Pid => "pid",
            Self::Tid => "tid",
            Self::Dso => "dso",
            Self::Sym => "sym",
        }
    }
}

/// The sort keys, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys(pub Vec<Key>);

fn parse_keys(s: &str) -> Result<Keys, String> {
    let mut keys = Vec::new();
    for k in s.split(',') {
        let key = match k.trim() {
            "comm" => Key::Comm,
            "pid" | "tgid" => Key::Pid,
            "tid" => Key::Tid,
            "dso" => Key::Dso,
            "sym" | "symbol" => Key::Sym,
            other => {
                return Err(format!(
                    "unknown sort key {other:?}; known: comm, pid, tid, dso, sym"
                ));
            }
        };
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    Ok(Keys(keys))
}

/// How call chains are shown under the rows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CallGraph {
    /// graph, folded or none.
    pub style: ChainStyle,
    /// The smallest chain shown, in percent of all samples.
    pub min: f64,
    /// Root first (caller) or the row's function first (callee).
    pub callee: bool,
}

/// See [`CallGraph::style`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChainStyle {
    /// A tree, branching where chains part.
    Graph,
    /// One line a chain: `percent frame;frame;...`.
    Folded,
    /// No chains.
    None,
}

fn parse_call_graph(s: &str) -> Result<CallGraph, String> {
    let mut g = CallGraph {
        style: ChainStyle::Graph,
        min: 0.5,
        callee: false,
    };
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part {
            "graph" | "fractal" | "flat" => g.style = ChainStyle::Graph,
            "folded" => g.style = ChainStyle::Folded,
            "none" => g.style = ChainStyle::None,
            "caller" => g.callee = false,
            "callee" => g.callee = true,
            n => {
                g.min = n.parse::<f64>().ok().filter(|v| *v >= 0.0).ok_or_else(|| {
                    format!(
                        "unknown call graph option {n:?}; use TYPE (graph, folded, none), \
                         MIN (a percentage) and ORDER (caller, callee)"
                    )
                })?;
            }
        }
    }
    Ok(g)
}

/// A frame as the report sees it: its function and file, as perf names
/// them.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Site {
    sym: Arc<str>,
    dso: Arc<str>,
    kernel: bool,
}

/// The dso column's name of a frame: perf's `[kernel.kallsyms]` for the
/// kernel, `[JIT] tid N` for code a perf map names, else the file's base
/// name, `[unknown]` where none is known.
fn dso(f: &Frame, pid: u32) -> Arc<str> {
    match f.kind {
        Kind::Kernel => match f.module.as_deref() {
            Some(m) if m.starts_with('[') && m != "[kernel]" => Arc::from(m),
            _ => Arc::from("[kernel.kallsyms]"),
        },
        Kind::Jit => Arc::from(format!("[JIT] tid {pid}")),
        _ => match f.module.as_deref() {
            Some(m) => Arc::from(m.rsplit('/').next().unwrap_or(m)),
            None => Arc::from("[unknown]"),
        },
    }
}

/// The dso names of the modules seen, by the module's string: each
/// made once, not once a frame.
type DsoNames = HashMap<(Option<Arc<str>>, Kind, u32), Arc<str>>;

/// A sample's own frames, root first, as sites (a waker's are not its
/// own): inlined frames are part of the function they were inlined into
/// (its row, as perf's symbol is the symbol table's); time off the CPU
/// has its marker between the user and kernel frames.
fn sites(s: &Sample, names: &mut DsoNames) -> Vec<Site> {
    let mut out = Vec::with_capacity(s.user.len() + s.kernel.len() + 1);
    let mut push = |f: &Frame, out: &mut Vec<Site>| {
        if f.kind == Kind::Inlined {
            return;
        }
        // JIT frames' dso names the process.
        let pid = if f.kind == Kind::Jit { s.pid } else { 0 };
        let dso = names
            .entry((f.module.clone(), f.kind, pid))
            .or_insert_with(|| dso(f, s.pid))
            .clone();
        out.push(Site {
            sym: f.name.clone(),
            dso,
            kernel: f.kind == Kind::Kernel,
        });
    };
    for f in s.user.iter().rev() {
        push(f, &mut out);
    }
    if s.off_cpu {
        push(&Frame::missed(super::OFF_CPU_FRAME, Kind::Kernel), &mut out);
    }
    for f in s.kernel.iter().rev() {
        push(f, &mut out);
    }
    out
}

/// The values of a row's keys.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct RowKey(Vec<Value>);

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Value {
    Comm(Arc<str>),
    /// A process or a thread, with when its process started (a pid's
    /// later process is another row), and its command.
    Pid(u32, u64, Arc<str>),
    Dso(Arc<str>),
    /// Kernel or not (`[k]` or `[.]`), and the name.
    Sym(bool, Arc<str>),
}

impl Value {
    fn text(&self) -> String {
        match self {
            Self::Comm(c) => c.to_string(),
            Self::Pid(p, _, c) => format!("{p:>7}:{c}"),
            Self::Dso(d) => d.to_string(),
            Self::Sym(k, n) => format!("[{}] {n}", if *k { 'k' } else { '.' }),
        }
    }

    fn json(&self) -> serde_json::Value {
        match self {
            Self::Comm(c) => c.as_ref().into(),
            Self::Pid(p, _, _) => (*p).into(),
            Self::Dso(d) => d.as_ref().into(),
            Self::Sym(_, n) => n.as_ref().into(),
        }
    }
}

/// The key of `site` in sample `s`, whose command is `comm`.
fn row_key(keys: &[Key], s: &Sample, comm: &Arc<str>, site: &Site) -> RowKey {
    RowKey(
        keys.iter()
            .map(|k| match k {
                Key::Comm => Value::Comm(comm.clone()),
                Key::Pid => Value::Pid(s.pid, s.started, comm.clone()),
                // A file without threads keeps a process's samples in one
                // row, under its pid.
                Key::Tid => Value::Pid(
                    if s.tid != 0 { s.tid } else { s.pid },
                    s.started,
                    comm.clone(),
                ),
                Key::Dso => Value::Dso(site.dso.clone()),
                Key::Sym => Value::Sym(site.kernel, site.sym.clone()),
            })
            .collect(),
    )
}

/// One row's counts and the chains through it.
#[derive(Default)]
struct Tally {
    children: u64,
    self_: u64,
    /// Chains, root first, with their counts.
    chains: HashMap<Vec<Arc<str>>, u64>,
}

/// The rows of one level: all keys, or (with `--hierarchy`) their first
/// `n`.
fn tally(
    samples: &[Sample],
    keys: &[Key],
    args: &ReportArgs,
    children: bool,
    chains: bool,
) -> HashMap<RowKey, Tally> {
    let mut rows: HashMap<RowKey, Tally> = HashMap::default();
    let mut names = DsoNames::default();
    let unknown = Site {
        sym: Arc::from("[unknown]"),
        dso: Arc::from("[unknown]"),
        kernel: false,
    };
    for s in samples {
        if (!args.comms.is_empty() && !args.comms.contains(&s.comm))
            || (!args.pids.is_empty() && !args.pids.contains(&s.pid))
            || (!args.tids.is_empty() && !args.tids.contains(&s.tid))
        {
            continue;
        }
        // One string a sample, shared by its frames' keys.
        let comm: Arc<str> = Arc::from(s.comm.as_str());
        let mut stack = sites(s, &mut names);
        if stack.is_empty() {
            stack.push(unknown.clone());
        }
        let admitted = |site: &Site| {
            (args.dsos.is_empty() || args.dsos.iter().any(|d| **d == *site.dso))
                && (args.symbols.is_empty() || args.symbols.iter().any(|n| **n == *site.sym))
        };
        let chain = |upto: usize| -> Vec<Arc<str>> {
            stack[..=upto].iter().map(|x| x.sym.clone()).collect()
        };
        let leaf = stack.len() - 1;
        if admitted(&stack[leaf]) {
            let t = rows
                .entry(row_key(keys, s, &comm, &stack[leaf]))
                .or_default();
            t.self_ += s.count;
            if !children {
                t.children += s.count;
                if chains {
                    *t.chains.entry(chain(leaf)).or_default() += s.count;
                }
            }
        }
        if children {
            // Each row once a sample, at its outermost frame: recursion
            // counts once, and the chain is the shortest that reaches it.
            let mut seen: HashMap<RowKey, usize> = HashMap::default();
            for (i, site) in stack.iter().enumerate() {
                if admitted(site) {
                    seen.entry(row_key(keys, s, &comm, site)).or_insert(i);
                }
            }
            for (k, at) in seen {
                let t = rows.entry(k).or_default();
                t.children += s.count;
                if chains {
                    *t.chains.entry(chain(at)).or_default() += s.count;
                }
            }
        }
    }
    rows
}

/// The widest the last column's dots go.
const MAX_WIDTH: usize = 60;

/// perf report's table of `samples`.
pub struct Report {
    /// The header comment's lines (perf's `# Samples: ...`).
    header: Vec<String>,
    keys: Vec<Key>,
    children: bool,
    /// `--hierarchy`: rows nested by their keys.
    hierarchy: bool,
    show_count: bool,
    total: u64,
    graph: Option<CallGraph>,
    /// Rows in order, each with its depth (0 unless `--hierarchy`).
    rows: Vec<(usize, RowKey, Tally)>,
}

impl Report {
    /// The report of `samples` under `args`: of `event` (`cpu-clock`), each
    /// sample counting `unit` (`samples`, `us`), as the header says.
    pub fn new(samples: &[Sample], args: &ReportArgs, event: &str, unit: &str) -> Self {
        let total: u64 = samples.iter().map(|s| s.count).sum();
        let children = !args.no_children;
        let graph = args
            .call_graph
            .filter(|g| g.style != ChainStyle::None && !args.hierarchy);
        let keys = &args.sort.0;
        let limit = |t: &Tally| {
            let v = if children { t.children } else { t.self_ };
            total > 0 && 100.0 * v as f64 / total as f64 >= args.percent_limit && v > 0
        };
        let order = |a: &(RowKey, Tally), b: &(RowKey, Tally)| {
            let v = |t: &Tally| {
                if children {
                    (t.children, t.self_)
                } else {
                    (t.self_, 0)
                }
            };
            v(&b.1).cmp(&v(&a.1)).then_with(|| a.0.cmp(&b.0))
        };
        let mut rows = Vec::new();
        if args.hierarchy {
            let levels: Vec<HashMap<RowKey, Tally>> = (1..=keys.len())
                .map(|n| tally(samples, &keys[..n], args, children, false))
                .collect();
            let mut sorted: Vec<Vec<(RowKey, Tally)>> = levels
                .into_iter()
                .map(|l| {
                    let mut v: Vec<_> = l.into_iter().filter(|(_, t)| limit(t)).collect();
                    v.sort_by(order);
                    v
                })
                .collect();
            fn walk(
                levels: &mut [Vec<(RowKey, Tally)>],
                depth: usize,
                prefix: &[Value],
                out: &mut Vec<(usize, RowKey, Tally)>,
            ) {
                let Some(level) = levels.get_mut(depth) else {
                    return;
                };
                let mine: Vec<(RowKey, Tally)> = {
                    let (take, keep): (Vec<_>, Vec<_>) = std::mem::take(level)
                        .into_iter()
                        .partition(|(k, _)| k.0.starts_with(prefix));
                    *level = keep;
                    take
                };
                for (k, t) in mine {
                    let next = k.0.clone();
                    out.push((depth, k, t));
                    walk(levels, depth + 1, &next, out);
                }
            }
            walk(&mut sorted, 0, &[], &mut rows);
        } else {
            let mut v: Vec<_> = tally(samples, keys, args, children, graph.is_some())
                .into_iter()
                .filter(|(_, t)| limit(t))
                .collect();
            v.sort_by(order);
            rows = v.into_iter().map(|(k, t)| (0, k, t)).collect();
        }
        Self {
            header: vec![
                if unit == "samples" {
                    format!("Samples: {total} of event '{event}'")
                } else {
                    format!("Total: {total} {unit} of event '{event}'")
                },
                format!("{} stacks", samples.len()),
            ],
            keys: keys.clone(),
            children,
            hierarchy: args.hierarchy,
            show_count: args.show_nr_samples,
            total,
            graph,
            rows,
        }
    }

    /// Says, as perf's header does, how many samples the weights came
    /// from (`n`), where each weighs its period (a perf.data's events):
    /// `Samples: N of event 'E'`, then `Event count (approx.): T`.
    pub fn of_samples(mut self, n: u64, event: &str) -> Self {
        let total = self.total;
        self.header[0] = format!("Samples: {n} of event '{event}'");
        self.header
            .insert(1, format!("Event count (approx.): {total}"));
        self
    }

    fn pct(&self, v: u64) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            100.0 * v as f64 / self.total as f64
        }
    }

    /// A row's chains, hottest first, at or above the call graph's
    /// threshold, each in the order asked for.
    fn chains(&self, t: &Tally) -> Vec<(Vec<Arc<str>>, u64)> {
        let Some(g) = self.graph else {
            return Vec::new();
        };
        let mut v: Vec<(Vec<Arc<str>>, u64)> = t
            .chains
            .iter()
            .filter(|(_, n)| self.pct(**n) >= g.min)
            .map(|(c, &n)| {
                let mut c = c.clone();
                if g.callee {
                    c.reverse();
                }
                (c, n)
            })
            .collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        v
    }
}

impl serde::Serialize for Report {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        ser.collect_seq(self.rows.iter().map(|(depth, k, t)| {
            let mut m = serde_json::Map::new();
            if self.children {
                m.insert("children".into(), round(self.pct(t.children)).into());
            }
            m.insert("self".into(), round(self.pct(t.self_)).into());
            m.insert("children_samples".into(), t.children.into());
            m.insert("self_samples".into(), t.self_.into());
            for (key, v) in self.keys.iter().zip(&k.0) {
                m.insert(key.json().into(), v.json());
                if let Value::Sym(kernel, _) = v {
                    m.insert("kernel".into(), (*kernel).into());
                }
            }
            if self.hierarchy {
                m.insert("depth".into(), (*depth).into());
            }
            let chains = self.chains(t);
            if !chains.is_empty() {
                let list: Vec<serde_json::Value> = chains
                    .iter()
                    .map(|(c, n)| {
                        serde_json::json!({
                            "percent": round(self.pct(*n)),
                            "samples": n,
                            "frames": c.iter().map(|f| f.as_ref()).collect::<Vec<_>>(),
                        })
                    })
                    .collect();
                m.insert("chains".into(), list.into());
            }
            m
        }))
    }
}

fn round(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

impl crate::output::Record for Report {
    fn text(&self, out: &mut String) {
        for h in &self.header {
            let _ = writeln!(out, "# {h}");
        }
        out.push_str("#\n");
        let mut cols: Vec<String> = Vec::new();
        if self.children {
            cols.push(format!("{:>8}", "Children"));
            cols.push(format!("{:>8}", "Self"));
        } else {
            cols.push(format!("{:>8}", "Overhead"));
        }
        if self.show_count {
            cols.push(format!("{:>9}", "Samples"));
        }
        let lead = cols.join("  ");
        let texts: Vec<Vec<String>> = self
            .rows
            .iter()
            .map(|(_, k, _)| k.0.iter().map(Value::text).collect())
            .collect();
        if self.hierarchy {
            let titles: Vec<&str> = self.keys.iter().map(|k| k.title()).collect();
            let _ = writeln!(out, "# {lead}  {}", titles.join(" / "));
        } else {
            // The last column is not padded, and no column's dots run
            // past MAX_WIDTH: one long symbol (a C++ or Rust generic's)
            // would pad every row to its length.
            let last = self.keys.len().saturating_sub(1);
            let widths: Vec<usize> = (0..self.keys.len())
                .map(|i| {
                    let longest = texts
                        .iter()
                        .map(|t| t[i].chars().count())
                        .chain([self.keys[i].title().len()])
                        .max()
                        .unwrap_or(0);
                    if i == last {
                        longest.min(MAX_WIDTH)
                    } else {
                        longest
                    }
                })
                .collect();
            let mut title = format!("# {lead}");
            let dots_lead: Vec<String> = cols.iter().map(|c| ".".repeat(c.len())).collect();
            let mut dots = format!("# {}", dots_lead.join("  "));
            for (k, w) in self.keys.iter().zip(&widths) {
                let _ = write!(title, "  {:<w$}", k.title());
                let _ = write!(dots, "  {}", ".".repeat(*w));
            }
            let _ = writeln!(out, "{}", title.trim_end());
            let _ = writeln!(out, "{dots}");
            out.push_str("#\n");
            for ((_, _, t), text) in self.rows.iter().zip(&texts) {
                let mut line = self.lead(t);
                for (i, (v, w)) in text.iter().zip(&widths).enumerate() {
                    if i == last {
                        let _ = write!(line, "  {v}");
                    } else {
                        let _ = write!(line, "  {v:<w$}");
                    }
                }
                let _ = writeln!(out, "{line}");
                self.chain_text(t, out);
            }
            self.footer(out);
            return;
        }
        out.push_str("#\n");
        for ((depth, _, t), text) in self.rows.iter().zip(&texts) {
            let _ = writeln!(
                out,
                "{}  {}{}",
                self.lead(t),
                "    ".repeat(*depth),
                text[*depth]
            );
        }
        self.footer(out);
    }
}

impl Report {
    fn lead(&self, t: &Tally) -> String {
        let mut line = String::new();
        if self.children {
            let _ = write!(
                line,
                "  {:>7.2}%  {:>7.2}%",
                self.pct(t.children),
                self.pct(t.self_)
            );
        } else {
            let _ = write!(line, "  {:>7.2}%", self.pct(t.self_));
        }
        if self.show_count {
            let n = if self.children { t.children } else { t.self_ };
            let _ = write!(line, "  {n:>9}");
        }
        line
    }

    fn footer(&self, out: &mut String) {
        out.push_str("\n#\n# (Tip: rtrace report FILE reads a saved pprof or folded profile)\n#\n");
    }

    /// A row's chains under it: perf's graph (a tree, branching where the
    /// chains part) or one line a chain.
    fn chain_text(&self, t: &Tally, out: &mut String) {
        let Some(g) = self.graph else {
            return;
        };
        let chains = self.chains(t);
        if chains.is_empty() {
            return;
        }
        let pad = " ".repeat(12);
        match g.style {
            ChainStyle::Folded => {
                for (c, n) in &chains {
                    let names: Vec<&str> = c.iter().map(|f| f.as_ref()).collect();
                    let _ = writeln!(out, "{pad}{:.2}% {}", self.pct(*n), names.join(";"));
                }
            }
            ChainStyle::Graph => {
                let tree = Tree::of(&chains);
                let _ = writeln!(out, "{pad}|");
                if let [(name, _, kid)] = &tree.kids[..] {
                    // One chain start: it goes on under the row.
                    let _ = writeln!(out, "{pad}---{name}");
                    kid.print_run(out, &format!("{pad}   "), self);
                } else {
                    tree.branches(out, &pad, self);
                }
            }
            ChainStyle::None => {}
        }
        out.push('\n');
    }
}

/// Chains merged where they share their start.
#[derive(Default)]
struct Tree {
    /// Children in order of first appearance (chains come hottest first).
    kids: Vec<(Arc<str>, u64, Tree)>,
}

impl Tree {
    fn of(chains: &[(Vec<Arc<str>>, u64)]) -> Self {
        let mut root = Tree::default();
        for (c, n) in chains {
            let mut node = &mut root;
            for f in c {
                let i = match node.kids.iter().position(|k| k.0 == *f) {
                    Some(i) => i,
                    None => {
                        node.kids.push((f.clone(), 0, Tree::default()));
                        node.kids.len() - 1
                    }
                };
                node.kids[i].1 += n;
                node = &mut node.kids[i].2;
            }
        }
        root
    }

    /// Prints the children at column `col` as branches with their share
    /// (`|--12.34%--name`), each going on below its name.
    fn branches(&self, out: &mut String, col: &str, r: &Report) {
        for (i, (name, n, kid)) in self.kids.iter().enumerate() {
            let last = i + 1 == self.kids.len();
            let tag = format!("--{:.2}%--", r.pct(*n));
            let bar = if last { " " } else { "|" };
            let _ = writeln!(out, "{col}{bar}{tag}{name}");
            let next = format!("{col}{bar}{}", " ".repeat(tag.len()));
            kid.print_run(out, &next, r);
            if !last {
                let _ = writeln!(out, "{col}|");
            }
        }
    }

    /// Goes on below a printed name at column `col`: a lone child one name
    /// a line, children that part as branches.
    fn print_run(&self, out: &mut String, col: &str, r: &Report) {
        match self.kids.len() {
            0 => {}
            1 => {
                let (name, _, kid) = &self.kids[0];
                let _ = writeln!(out, "{col}{name}");
                kid.print_run(out, col, r);
            }
            _ => {
                let _ = writeln!(out, "{col}|");
                self.branches(out, col, r);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::Record as _;

    fn args(extra: &[&str]) -> ReportArgs {
        use clap::Parser as _;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            r: ReportArgs,
        }
        Cli::parse_from(std::iter::once("t").chain(extra.iter().copied())).r
    }

    /// Folded lines as samples: `comm;root;...;leaf count`.
    fn samples(text: &str) -> Vec<Sample> {
        crate::output::stacks::samples_of_folded(text).unwrap()
    }

    fn row<'a>(r: &'a Report, sym: &str) -> &'a Tally {
        &r.rows
            .iter()
            .find(|(_, k, _)| {
                k.0.iter()
                    .any(|v| matches!(v, Value::Sym(_, n) if &**n == sym))
            })
            .unwrap_or_else(|| panic!("no row {sym}"))
            .2
    }

    #[test]
    fn recursion_counts_once_in_children_and_the_leaf_is_self() {
        let s = samples("a;main;f;f;f;g 3\na;main;f 2\na;main;h 5\n");
        let r = Report::new(&s, &args(&[]), "cpu-clock", "samples");
        assert_eq!(r.total, 10);
        let f = row(&r, "f");
        assert_eq!((f.children, f.self_), (5, 2));
        let main = row(&r, "main");
        assert_eq!((main.children, main.self_), (10, 0));
        // Sorted by children, then self.
        let order: Vec<String> = r.rows.iter().map(|(_, k, _)| k.0[2].text()).collect();
        // f and h tie on children; h has more of its own.
        assert_eq!(order, ["[.] main", "[.] h", "[.] f", "[.] g"]);
        let r = Report::new(&s, &args(&["--no-children"]), "cpu-clock", "samples");
        let order: Vec<String> = r.rows.iter().map(|(_, k, _)| k.0[2].text()).collect();
        assert_eq!(order, ["[.] h", "[.] g", "[.] f"]);
    }

    #[test]
    fn chains_run_from_the_root_to_the_row_and_fold_into_a_tree() {
        let s = samples("a;main;f;x 6\na;main;g;f;y 4\n");
        let r = Report::new(&s, &args(&["-g=folded,0"]), "cpu-clock", "samples");
        let f = row(&r, "f");
        let chains = r.chains(f);
        let text: Vec<String> = chains.iter().map(|(c, _)| c.join(";")).collect();
        assert_eq!(text, ["main;f", "main;g;f"]);
        let r = Report::new(&s, &args(&["-g=graph,0,callee"]), "cpu-clock", "samples");
        let mut out = String::new();
        r.text(&mut out);
        // Callee order: the row's function first, its callers after; the
        // two chains part below it.
        let at = out.find("[.] f").unwrap();
        let graph: Vec<&str> = out[at..].lines().skip(1).take(6).collect();
        assert_eq!(
            graph,
            [
                "            |",
                "            ---f",
                "               |",
                "               |--60.00%--main",
                "               |",
                "                --40.00%--g",
            ],
            "{out}"
        );
    }

    #[test]
    fn hierarchy_nests_each_key_under_the_last() {
        let s = samples("a;main;f 6\nb;main;f 3\nb;main;g 1\n");
        let r = Report::new(
            &s,
            &args(&["--hierarchy", "--sort", "comm,sym", "--no-children"]),
            "cpu-clock",
            "samples",
        );
        let rows: Vec<(usize, String, u64)> = r
            .rows
            .iter()
            .map(|(d, k, t)| (*d, k.0[*d].text(), t.self_))
            .collect();
        assert_eq!(
            rows,
            [
                (0, "a".to_owned(), 6),
                (1, "[.] f".to_owned(), 6),
                (0, "b".to_owned(), 4),
                (1, "[.] f".to_owned(), 3),
                (1, "[.] g".to_owned(), 1),
            ]
        );
    }

    #[test]
    fn threads_have_rows_of_their_own_and_files_without_them_one_per_process() {
        let mut s = samples("a;main;f 3\na;main;f 1\n");
        s[0].pid = 10;
        s[1].pid = 10;
        s[0].tid = 11;
        s[1].tid = 12;
        let rows = |s: &[Sample]| -> Vec<String> {
            let args = args(&["--no-children", "-s", "tid"]);
            let r = Report::new(s, &args, "cpu-clock", "samples");
            r.rows.iter().map(|(_, k, _)| k.0[0].text()).collect()
        };
        assert_eq!(rows(&s), ["     11:a", "     12:a"]);
        s[0].tid = 0;
        s[1].tid = 0;
        assert_eq!(rows(&s), ["     10:a"]);
    }

    #[test]
    fn kernel_frames_are_kallsyms_and_marked_k() {
        let s = samples("a;main;read;entry_SYSCALL_64_[k];vfs_read_[k] 4\n");
        let r = Report::new(&s, &args(&["--no-children"]), "cpu-clock", "samples");
        assert_eq!(r.rows.len(), 1);
        let k = &r.rows[0].1;
        assert_eq!(
            k.0.iter().map(Value::text).collect::<Vec<_>>(),
            ["a", "[kernel.kallsyms]", "[k] vfs_read"]
        );
    }

    #[test]
    fn options_parse_as_perf_spells_them_and_refuse_others() {
        assert_eq!(args(&["--sort", "pid,sym"]).sort.0, [Key::Pid, Key::Sym]);
        assert_eq!(args(&["-s", "tgid,tid"]).sort.0, [Key::Pid, Key::Tid]);
        assert!(args(&["-s", "comm,tid"]).by_thread());
        assert!(args(&["--tids", "7"]).by_thread());
        assert!(!args(&["-s", "pid"]).by_thread());
        let g = args(&["-g=folded,2.5,callee"]).call_graph.unwrap();
        assert_eq!((g.style, g.min, g.callee), (ChainStyle::Folded, 2.5, true));
        assert!(
            parse_keys("comm,cpu")
                .unwrap_err()
                .contains("unknown sort key")
        );
        assert!(parse_call_graph("fancy").is_err());
        assert_eq!(args(&[]).changed(), None);
        assert_eq!(args(&["--hierarchy"]).changed(), Some("--hierarchy"));
    }
}

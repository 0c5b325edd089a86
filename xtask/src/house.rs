//! The shape of the code, checked: no import circles between modules of
//! user space, `common`, the kernel crate, xtask or the integration tests'
//! crates; user space's layers importing only downwards (tools, then the
//! tracer, then stacks, probes and output, then the kernel layer); and
//! xtask's benchmark cases importing the harness and what the cases share,
//! not one another.
//!
//! Imports are read as text, with comments and literals blanked: `use
//! crate::…`, `use super::…` and `use self::…` trees (braces included) and
//! `crate::` and `super::` paths written inline (`crate::kernel::btf::Btf`).
//! Test modules (`#[cfg(test)] mod … { … }`) are left out: a test may
//! reach anywhere. Not read: paths relative to a module's own children
//! written without `self::` (`use child::x`), which this code base does
//! not use for imports across modules, and a module's `mod` declarations,
//! which are no arrow. Nor are imports of the crate root's own items
//! (`crate::root()`, an arrow to the module named ""): the root declares
//! every module and reaches into them unread, so a circle through it
//! could not be seen either; it counts as above them all.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
};

/// A crate's modules and, for each, the modules it imports, with the
/// names that tie them.
pub type Graph = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

/// The import graph of the crate whose source root is `src` (`main.rs`
/// or `lib.rs` is the root module, named ""; `a/mod.rs` and `a.rs` are
/// both module `a`); `bin/` is left out, as its files are crates of their
/// own ([`crates_in`]).
pub fn graph(src: &Path) -> std::io::Result<Graph> {
    let mut files = Vec::new();
    collect(src, src, &mut files)?;
    Ok(graph_of(&files))
}

/// The crates Cargo finds in `dir` (a `src/bin/` or an integration tests'
/// `tests/`), each named by its file or folder: `NAME.rs` is a crate of
/// one file, `NAME/main.rs` the root of a crate of that folder's files.
/// A folder without `main.rs` holds modules that crates declare with
/// `#[path]` or `mod`, not a crate; it is left out.
pub fn crates_in(dir: &Path) -> std::io::Result<Vec<(String, Graph)>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path
            .file_stem()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if path.is_dir() {
            if path.join("main.rs").is_file() {
                out.push((name, graph(&path)?));
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path)?;
            out.push((name, graph_of(&[(String::new(), text)])));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// The import graph of a crate's files, each given as its module's name
/// and its text.
fn graph_of(files: &[(String, String)]) -> Graph {
    let modules: BTreeSet<String> = files.iter().map(|(m, _)| m.clone()).collect();
    let mut out = Graph::new();
    for (module, text) in files {
        let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for path in paths(&without_tests(&code_only(text))) {
            let Some(absolute) = resolve(module, &path) else {
                continue;
            };
            // The longest prefix that is a module is what is imported.
            let target = (1..=absolute.len())
                .rev()
                .map(|n| absolute[..n].join("::"))
                .find(|m| modules.contains(m));
            let Some(target) = target else { continue };
            // A module's own items are no arrow.
            if target == *module {
                continue;
            }
            let name = absolute.last().cloned().unwrap_or_default();
            edges.entry(target).or_default().insert(name);
        }
        out.insert(module.clone(), edges);
    }
    out
}

fn collect(src: &Path, dir: &Path, out: &mut Vec<(String, String)>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let rel = path.strip_prefix(src).unwrap_or(&path);
        if path.is_dir() {
            if rel != Path::new("bin") {
                collect(src, &path, out)?;
            }
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let mut parts: Vec<String> = rel
            .with_extension("")
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        // `a/mod.rs` is module `a` at any depth; `main.rs` and `lib.rs`
        // are the crate root only at the top (`a/main.rs` is module
        // `a::main`).
        let root = parts.len() == 1 && matches!(parts[0].as_str(), "lib" | "main");
        if root || parts.last().is_some_and(|p| p == "mod") {
            parts.pop();
        }
        out.push((parts.join("::"), std::fs::read_to_string(&path)?));
    }
    Ok(())
}

/// `text` with comments and the contents of string and character
/// literals blanked (newlines kept), so that neither a `use ` or `crate::`
/// in prose or a string nor a brace in a literal is read as code.
fn code_only(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let blank = |ch: char| if ch == '\n' { '\n' } else { ' ' };
    let mut i = 0;
    while i < c.len() {
        let next = c.get(i + 1).copied();
        if c[i] == '/' && next == Some('/') {
            while i < c.len() && c[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c[i] == '/' && next == Some('*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(c[i]));
                    i += 1;
                }
            }
        } else if c[i] == 'r' && matches!(next, Some('"' | '#')) && !ident_before(&c, i) {
            // A raw string: r"…", r#"…"#, and so on.
            let mut j = i + 1;
            let mut hashes = 0;
            while c.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if c.get(j) != Some(&'"') {
                out.push(c[i]);
                i += 1;
                continue;
            }
            out.push('"');
            j += 1;
            while j < c.len() {
                if c[j] == '"' && (1..=hashes).all(|k| c.get(j + k) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                out.push(blank(c[j]));
                j += 1;
            }
            out.push('"');
            i = j;
        } else if c[i] == '"' {
            out.push('"');
            i += 1;
            while i < c.len() && c[i] != '"' {
                if c[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                if i < c.len() {
                    out.push(blank(c[i]));
                    i += 1;
                }
            }
            out.push('"');
            i += 1;
        } else if c[i] == '\'' {
            // A character literal ('x', '\n', '\u{1F600}'), not a lifetime.
            let end = if next == Some('\\') {
                (i + 2..c.len()).find(|&j| c[j] == '\'')
            } else if c.get(i + 2) == Some(&'\'') {
                Some(i + 2)
            } else {
                None
            };
            match end {
                Some(e) => {
                    out.push_str(&" ".repeat(e - i + 1));
                    i = e + 1;
                }
                None => {
                    out.push(c[i]);
                    i += 1;
                }
            }
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

/// Whether an identifier character stands just before position `i`.
fn ident_before(c: &[char], i: usize) -> bool {
    i > 0 && (c[i - 1].is_alphanumeric() || c[i - 1] == '_')
}

/// `text` with every `#[cfg(test)]` module's body cut out.
fn without_tests(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("#[cfg(test)]") {
        let after = &rest[i + "#[cfg(test)]".len()..];
        let trimmed = after.trim_start();
        let is_mod = trimmed.starts_with("mod ") || trimmed.starts_with("pub mod ");
        let open = trimmed.find(['{', ';']);
        match (is_mod, open) {
            (true, Some(o)) if trimmed.as_bytes()[o] == b'{' => {
                out.push_str(&rest[..i]);
                let body = &trimmed[o..];
                let mut depth = 0usize;
                let mut end = body.len();
                for (k, c) in body.char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                end = k + 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                rest = &body[end..];
            }
            _ => {
                out.push_str(&rest[..i + "#[cfg(test)]".len()]);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// Every path a file names through `crate`, `super` or `self`, as
/// segments with that first word kept, `use` trees expanded.
fn paths(text: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    // `use` trees first, then what is left for inline paths.
    let mut rest = text;
    let mut inline = String::new();
    while let Some(i) = find_use(rest) {
        inline.push_str(&rest[..i]);
        let stmt_start = i + rest[i..].find("use ").unwrap() + 4;
        let end = rest[stmt_start..]
            .find(';')
            .map_or(rest.len(), |e| stmt_start + e);
        let tree = tidy(&rest[stmt_start..end]);
        // A `use ` in a string or prose is no statement.
        let is_tree = tree
            .chars()
            .all(|c| c.is_alphanumeric() || "_:{},* ".contains(c));
        let expanded = if is_tree { expand(&tree) } else { Vec::new() };
        for p in expanded {
            let segs: Vec<String> = p
                .split(" as ")
                .next()
                .unwrap_or_default()
                .split("::")
                .map(str::to_owned)
                .collect();
            if matches!(
                segs.first().map(String::as_str),
                Some("crate" | "super" | "self")
            ) {
                out.push(segs);
            }
        }
        rest = &rest[end.min(rest.len())..];
    }
    inline.push_str(rest);
    for start in ["crate::", "super::"] {
        let mut at = 0;
        while let Some(i) = inline[at..].find(start) {
            let begin = at + i;
            at = begin + start.len();
            let before = inline[..begin].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            let path: String = inline[begin..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            out.push(
                path.trim_end_matches(':')
                    .split("::")
                    .map(str::to_owned)
                    .collect(),
            );
        }
    }
    out
}

/// Where the next `use` statement starts (`use`, `pub use`,
/// `pub(crate) use`), at a word boundary.
fn find_use(text: &str) -> Option<usize> {
    let mut at = 0;
    while let Some(i) = text[at..].find("use ") {
        let k = at + i;
        let before = text[..k].chars().next_back();
        if before.is_none_or(|c| c.is_whitespace() || c == ';' || c == '{' || c == '}') {
            return Some(k);
        }
        at = k + 4;
    }
    None
}

/// A `use` tree with its white space folded: none around `::`, braces
/// and commas, one space around `as`.
fn tidy(tree: &str) -> String {
    let words: Vec<&str> = tree.split_whitespace().collect();
    let mut out = String::new();
    for w in words {
        let glue = out.ends_with([':', '{', ',']) || w.starts_with([':', '{', '}', ',']);
        if !out.is_empty() && !glue {
            out.push(' ');
        }
        out.push_str(w);
    }
    out
}

/// A tidied `use` tree, expanded into its paths
/// (`a::{b,c::{self,d}}` gives `a::b`, `a::c`, `a::c::d`).
fn expand(tree: &str) -> Vec<String> {
    let mut out = Vec::new();
    for part in split_top(tree) {
        match part.find('{') {
            None => out.push(part),
            Some(i) => {
                let prefix = part[..i].trim_end_matches(':');
                let inner = &part[i + 1..part.rfind('}').unwrap_or(part.len())];
                for q in expand(inner) {
                    if q == "self" || q.starts_with("self as") {
                        out.push(prefix.to_owned());
                    } else {
                        out.push(format!("{prefix}::{q}"));
                    }
                }
            }
        }
    }
    out
}

fn split_top(s: &str) -> Vec<String> {
    let (mut parts, mut cur, mut depth) = (Vec::new(), String::new(), 0i32);
    for c in s.chars() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    parts.push(cur);
    parts.into_iter().filter(|p| !p.is_empty()).collect()
}

/// `path` (starting with `crate`, `super` or `self`) from module `module`,
/// as segments from the crate root.
fn resolve(module: &str, path: &[String]) -> Option<Vec<String>> {
    let mut base: Vec<String> = if module.is_empty() {
        Vec::new()
    } else {
        module.split("::").map(str::to_owned).collect()
    };
    let mut segs = path.iter();
    match segs.next()?.as_str() {
        "crate" => base.clear(),
        "self" => {}
        "super" => {
            base.pop()?;
            while segs.clone().next().is_some_and(|s| s == "super") {
                segs.next();
                base.pop()?;
            }
        }
        _ => return None,
    }
    base.extend(segs.filter(|s| !s.is_empty()).cloned());
    Some(base)
}

/// The circles of `g`: each strongly connected set of more than one
/// module, with the arrows inside it.
pub fn circles(g: &Graph) -> Vec<Vec<String>> {
    // Tarjan's algorithm, iterative enough for a few hundred modules.
    struct State<'a> {
        g: &'a Graph,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        next: usize,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        s.index.insert(v, s.next);
        s.low.insert(v, s.next);
        s.next += 1;
        s.stack.push(v);
        s.on.insert(v);
        let g = s.g;
        for w in g.get(v).into_iter().flat_map(|e| e.keys()) {
            let w = w.as_str();
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if s.on.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut set = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on.remove(w);
                set.push(w.to_owned());
                if w == v {
                    break;
                }
            }
            if set.len() > 1 {
                set.sort();
                s.out.push(set);
            }
        }
    }
    let mut s = State {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in g.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.out
}

/// Each circle with the arrows that tie it, for a failure message.
pub fn describe(g: &Graph, sets: &[Vec<String>]) -> String {
    let mut out = String::new();
    for set in sets {
        out.push_str(&format!("circle of {}:\n", set.join(", ")));
        for from in set {
            for (to, names) in &g[from] {
                if set.contains(to) {
                    let names: Vec<&str> = names.iter().map(String::as_str).collect();
                    out.push_str(&format!(
                        "  {} -> {}: {}\n",
                        shown(from),
                        shown(to),
                        names.join(", ")
                    ));
                }
            }
        }
    }
    out
}

fn shown(module: &str) -> &str {
    if module.is_empty() { "crate" } else { module }
}

/// User space's layers, lowest first: a module may import its own layer's
/// modules (the circle check keeps those apart) and those below, never
/// those above. The crate root (`main.rs`) is above them all.
pub const LAYERS: [&[&str]; 5] = [
    &["kernel"],
    &["stacks", "probes", "output"],
    &["engine"],
    &["tracer"],
    &["tools"],
];

fn layer(module: &str) -> Option<usize> {
    let top = module.split("::").next()?;
    LAYERS.iter().position(|l| l.contains(&top))
}

/// The imports of `g` that run from a lower layer up to a higher one (or
/// to the crate root).
pub fn upward(g: &Graph) -> Vec<String> {
    let mut out = Vec::new();
    for (from, edges) in g {
        let Some(lf) = layer(from) else { continue };
        for (to, names) in edges {
            let up = match layer(to) {
                Some(lt) => lt > lf,
                None => to.is_empty(),
            };
            if up {
                let names: Vec<&str> = names.iter().map(String::as_str).collect();
                out.push(format!("{from} -> {}: {}", shown(to), names.join(", ")));
            }
        }
    }
    out
}

/// `g` with each module folded into its top-level folder or file.
pub fn folded(g: &Graph) -> Graph {
    let top = |m: &str| m.split("::").next().unwrap_or_default().to_owned();
    let mut out = Graph::new();
    for (from, edges) in g {
        let f = top(from);
        let entry = out.entry(f.clone()).or_default();
        for (to, names) in edges {
            let t = top(to);
            if t != f {
                entry.entry(t).or_default().extend(names.iter().cloned());
            }
        }
    }
    out
}

/// What xtask's benchmark cases may import besides the harness (`bench`)
/// and modules outside `bench`: the modules that hold what several cases
/// share.
pub const BENCH_SHARED: [&str; 2] = ["bench::helpers", "bench::c_project"];

/// Benchmark cases' parts that live in files of their own, as (case,
/// part): profile runs its C build from `bench/build.rs`.
pub const BENCH_PARTS: [(&str, &str); 1] = [("bench::profile", "bench::build")];

/// The imports of xtask's graph `g` that cross between benchmark cases: a
/// case importing another case that is not its part, or a shared module
/// importing a case. The harness is below them all; what two cases both
/// need belongs in it or in a shared module, where neither case owns it.
pub fn bench_crossings(g: &Graph) -> Vec<String> {
    // A case is `bench::NAME`, with whatever modules it has of its own.
    let case = |m: &str| {
        let rest = m.strip_prefix("bench::")?;
        Some(format!("bench::{}", rest.split("::").next()?))
    };
    let shared = |c: &str| BENCH_SHARED.contains(&c);
    let mut out = Vec::new();
    for (from, edges) in g {
        let Some(cf) = case(from) else { continue };
        for (to, names) in edges {
            let Some(ct) = case(to) else { continue };
            let part = !shared(&cf) && BENCH_PARTS.contains(&(cf.as_str(), ct.as_str()));
            if ct != cf && !shared(&ct) && !part {
                let names: Vec<&str> = names.iter().map(String::as_str).collect();
                out.push(format!("{from} -> {to}: {}", names.join(", ")));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn crate_graph(src: &str) -> Graph {
        graph(&crate::root().join(src)).unwrap()
    }

    /// Each crate's source root, and how many modules it has at least (a
    /// reader that reads too few would find no circle).
    const CRATES: [(&str, usize); 5] = [
        ("userspace/src", 4),
        ("common/src", 4),
        ("ebpf-programs/src", 4),
        ("xtask/src", 20),
        // The integration tests' library; each of `tests/tests/*.rs` and
        // `tests/src/bin/*.rs` is a crate of its own.
        ("tests/src", 2),
    ];

    #[test]
    fn no_import_circles_in_any_crate() {
        let root = crate::root();
        let mut crates = Vec::new();
        for (src, least) in CRATES {
            let g = crate_graph(src);
            assert!(g.len() >= least, "{src}: too few modules read: {g:?}");
            crates.push((src.to_owned(), g));
            if root.join(src).join("bin").is_dir() {
                for (name, g) in crates_in(&root.join(src).join("bin")).unwrap() {
                    crates.push((format!("{src}/bin/{name}"), g));
                }
            }
        }
        let tests = crates_in(&root.join("tests/tests")).unwrap();
        assert!(tests.len() > 10, "{} crates in tests/tests", tests.len());
        crates.extend(
            tests
                .into_iter()
                .map(|(n, g)| (format!("tests/tests/{n}"), g)),
        );
        for (name, g) in &crates {
            let sets = circles(g);
            assert!(
                sets.is_empty(),
                "{name} has import circles:\n{}",
                describe(g, &sets)
            );
        }
    }

    #[test]
    fn xtask_bench_cases_import_no_other_case() {
        let g = crate_graph("xtask/src");
        let crossings = bench_crossings(&g);
        assert!(
            crossings.is_empty(),
            "benchmark cases that import other cases (move what they share to the harness or \
             to a module of house::BENCH_SHARED):\n{}",
            crossings.join("\n")
        );
        for m in BENCH_SHARED
            .iter()
            .chain(BENCH_PARTS.iter().flat_map(|(c, p)| [c, p]))
        {
            assert!(g.contains_key(*m), "house names {m}, which xtask lacks");
        }
    }

    #[test]
    fn user_space_layers_import_downwards() {
        let g = crate_graph("userspace/src");
        let up = upward(&g);
        assert!(
            up.is_empty(),
            "imports that run upwards:\n{}",
            up.join("\n")
        );
        let folders = folded(&g);
        let sets = circles(&folders);
        assert!(
            sets.is_empty(),
            "user space's folders import each other:\n{}",
            describe(&folders, &sets)
        );
        // Every top-level module belongs to a layer.
        for m in g.keys().filter(|m| !m.is_empty() && !m.contains("::")) {
            assert!(layer(m).is_some(), "{m} is in no layer of house::LAYERS");
        }
    }

    /// The check must be able to fail: a made-up crate with a circle
    /// through a `use` tree and an inline path, and an upward import.
    #[test]
    fn circles_and_upward_imports_are_found() {
        let dir = std::env::temp_dir().join(format!("rtrace-house-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("kernel")).unwrap();
        std::fs::create_dir_all(dir.join("tools")).unwrap();
        std::fs::write(dir.join("main.rs"), "mod kernel;\nmod tools;\n").unwrap();
        std::fs::write(
            dir.join("kernel/mod.rs"),
            "pub mod btf;\nuse crate::{tools::{self, run}};\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("kernel/btf.rs"),
            "// crate::tools::run in a comment is no import\n\
             fn f() { let _ = (\"use crate::tools::run; http://x\", r#\"crate::tools\"#, '{'); }\n\
             /* crate::tools::run */\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("tools/mod.rs"),
            "pub fn run() { crate::kernel::x(); }\n\
             #[cfg(test)]\nmod tests { fn f() -> char { '}' } use crate::kernel::btf; }\n",
        )
        .unwrap();
        let g = graph(&dir).unwrap();
        let sets = circles(&g);
        assert_eq!(sets, [vec!["kernel".to_owned(), "tools".to_owned()]]);
        assert!(!g["tools"].contains_key("kernel::btf"), "{g:?}");
        assert!(g["kernel::btf"].is_empty(), "{g:?}");
        assert_eq!(upward(&g), ["kernel -> tools: run, tools"]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Module names from `mod.rs` at any depth and `main.rs` only at the
    /// top; the crates of a `bin/` folder, one a file or a folder.
    #[test]
    fn nested_modules_and_bin_crates_are_read() {
        let dir = std::env::temp_dir().join(format!("rtrace-house-bins-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for d in ["a/b", "bin/two", "bin/helpers"] {
            std::fs::create_dir_all(dir.join(d)).unwrap();
        }
        let files = [
            ("lib.rs", "pub mod a;\n"),
            ("a.rs", "mod b;\nmod main;\n"),
            ("a/b/mod.rs", "use super::main::x;\n"),
            ("a/main.rs", "pub fn x() {}\n"),
            ("bin/one.rs", "fn main() { crate::f(); }\nfn f() {}\n"),
            ("bin/two/main.rs", "mod x;\nmod y;\nfn main() {}\n"),
            ("bin/two/x.rs", "use crate::y::g;\npub fn f() {}\n"),
            ("bin/two/y.rs", "pub fn g() { crate::x::f(); }\n"),
            ("bin/helpers/z.rs", "pub fn z() {}\n"),
        ];
        for (path, text) in files {
            std::fs::write(dir.join(path), text).unwrap();
        }
        let g = graph(&dir).unwrap();
        let modules: Vec<&str> = g.keys().map(String::as_str).collect();
        assert_eq!(modules, ["", "a", "a::b", "a::main"]);
        assert!(g["a::b"].contains_key("a::main"), "{g:?}");
        let bins = crates_in(&dir.join("bin")).unwrap();
        let names: Vec<&str> = bins.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["one", "two"]);
        assert!(circles(&bins[0].1).is_empty());
        assert_eq!(circles(&bins[1].1), [vec!["x".to_owned(), "y".to_owned()]]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A case importing another case, or a shared module importing a
    /// case, crosses; a case's own part and the shared modules do not.
    #[test]
    fn crossings_between_bench_cases_are_found() {
        let mut g = Graph::new();
        let mut arrow = |from: &str, to: &str| {
            g.entry(from.to_owned())
                .or_default()
                .entry(to.to_owned())
                .or_default()
                .insert("x".to_owned());
        };
        arrow("bench::runqlat", "bench");
        arrow("bench::runqlat", "bench::helpers");
        arrow("bench::runqlat", "vm");
        arrow("bench::profile", "bench::build");
        arrow("bench::profile::inner", "bench::profile");
        arrow("bench::report", "bench::build");
        arrow("bench::helpers", "bench::runqlat");
        arrow("bench::helpers", "bench::c_project");
        assert_eq!(
            bench_crossings(&g),
            [
                "bench::helpers -> bench::runqlat: x",
                "bench::report -> bench::build: x"
            ]
        );
    }

    /// The files under `dir`, each as its path.
    fn files_under(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                files_under(&p, out);
            }
            out.push(p);
        }
    }

    /// The `backticked` words of `text` that name a file or folder: no
    /// spaces, no `::`, no placeholders, ending in `.rs`, `.md` or `/`.
    fn named_paths(text: &str) -> Vec<String> {
        text.split('`')
            .skip(1)
            .step_by(2)
            .filter(|w| !w.contains([' ', '<', '*', '{']) && !w.contains("::"))
            .filter(|w| w.ends_with(".rs") || w.ends_with(".md") || w.ends_with('/'))
            .map(|w| w.trim_end_matches('/').to_owned())
            .collect()
    }

    /// Whether `name` is a path from the root or `within`, or a path's
    /// end somewhere under `within`.
    fn found(root: &Path, within: &Path, name: &str) -> bool {
        if root.join(name).exists() || within.join(name).exists() {
            return true;
        }
        let mut all = Vec::new();
        files_under(within, &mut all);
        all.iter().any(|p| p.ends_with(name))
    }

    /// Every path the README's layout table and docs/architecture.md name
    /// exists: each row's path, each file its row names, and each path
    /// from the root the architecture page names in its text.
    #[test]
    fn paths_the_docs_name_exist() {
        let root = crate::root();
        let mut missing = Vec::new();
        let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
        let layout = readme.split("## Layout").nth(1).expect("README's Layout");
        let layout = layout.split("\n## ").next().unwrap();
        let mut rows = 0;
        for row in layout.lines().filter(|l| l.starts_with("| `")) {
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            let path = cells[1].trim_matches('`');
            rows += 1;
            if !root.join(path).exists() {
                missing.push(format!("README: {path}"));
                continue;
            }
            for name in named_paths(cells[2]) {
                if !found(&root, &root.join(path), &name) {
                    missing.push(format!("README, row {path}: {name}"));
                }
            }
        }
        assert!(rows >= 10, "{rows} rows in the README's layout table");
        let arch = std::fs::read_to_string(root.join("docs/architecture.md")).unwrap();
        let src = root.join("userspace/src");
        let mut layers = 0;
        for row in arch.lines().filter(|l| l.starts_with("| ")) {
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            if cells.len() < 4 || cells[1].parse::<u32>().is_err() {
                continue;
            }
            layers += 1;
            let folder = cells[2].split('`').nth(1).unwrap_or_default();
            let dir = if folder == "common/" {
                root.join("common")
            } else {
                src.join(folder)
            };
            if !dir.exists() {
                missing.push(format!("architecture, layer {}: {folder}", cells[1]));
                continue;
            }
            for name in named_paths(cells[3]) {
                if !found(&root, &dir, &name) {
                    missing.push(format!("architecture, layer {folder}: {name}"));
                }
            }
        }
        assert!(
            layers >= 5,
            "{layers} rows in architecture.md's layer table"
        );
        let tops = [
            "userspace/",
            "xtask/",
            "tests/",
            "common/",
            "ebpf-",
            "docs/",
        ];
        for name in named_paths(&arch) {
            if tops.iter().any(|t| name.starts_with(t)) && !root.join(&name).exists() {
                missing.push(format!("architecture: {name}"));
            }
        }
        assert!(
            missing.is_empty(),
            "named in the docs, not in the tree: {missing:#?}"
        );
    }
}

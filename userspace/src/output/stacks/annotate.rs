//! perf annotate over counted stacks: a hot function's instructions, each
//! with its share of the samples taken on it, and the source lines beside
//! them where the file's debug information has them. The samples' leaf
//! frames must carry the exact sampled addresses (the stack store keeps
//! them when asked: `StackStore::exact_leaves`; pprof locations have
//! them).

use std::{collections::HashMap, fmt::Write as _, sync::Arc};

use anyhow::Context as _;
use object::{Object as _, ObjectSegment as _, ObjectSymbol as _};

use crate::kernel::warning::Warning;
use crate::stacks::{
    sample::Sample,
    symbolize::{CodeMapping, Kind},
};

/// perf annotate's options.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct AnnotateArgs {
    /// Print the instructions of these functions (comma-separated) with
    /// each one's share of the function's samples, as perf annotate does.
    #[arg(long = "annotate", value_name = "SYM", value_delimiter = ',')]
    pub functions: Vec<String>,
    /// Annotate the N functions with the most samples of their own.
    #[arg(long, value_name = "N")]
    pub annotate_top: Option<usize>,
}

impl AnnotateArgs {
    /// Whether anything is to be annotated.
    pub fn wanted(&self) -> bool {
        !self.functions.is_empty() || self.annotate_top.is_some()
    }
}

/// One instruction of an annotated function.
#[derive(serde::Serialize)]
struct Insn {
    /// Its file virtual address.
    addr: u64,
    samples: u64,
    percent: f64,
    /// AT&T syntax, as objdump and perf annotate print it.
    asm: String,
    /// `file:line`, where the debug information has it.
    #[serde(skip_serializing_if = "Option::is_none")]
    line: Option<String>,
    /// The line's text, where the source file is here to read.
    #[serde(skip)]
    source: Option<String>,
}

/// One annotated function.
#[derive(serde::Serialize)]
struct Function {
    function: String,
    file: String,
    /// Samples whose sampled address is in the function.
    samples: u64,
    instructions: Vec<Insn>,
}

/// The functions annotated, in order.
pub struct Annotation {
    functions: Vec<Function>,
    event: String,
}

impl serde::Serialize for Annotation {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        ser.collect_seq(&self.functions)
    }
}

impl crate::output::Record for Annotation {
    fn text(&self, out: &mut String) {
        for f in &self.functions {
            let title = format!(
                " Percent |\tSource code & Disassembly of {} for {} ({} samples)",
                f.file, self.event, f.samples
            );
            let _ = writeln!(out, "{title}");
            let _ = writeln!(out, "{}", "-".repeat(title.len() + 8));
            let _ = writeln!(out, "         :\t{}():", f.function);
            let mut last_line: Option<&str> = None;
            for i in &f.instructions {
                if i.line.is_some() && i.line.as_deref() != last_line {
                    let _ = writeln!(
                        out,
                        "         :\t{}\t{}",
                        i.line.as_deref().unwrap_or(""),
                        i.source.as_deref().unwrap_or("").trim()
                    );
                    last_line = i.line.as_deref();
                }
                let pct = if i.samples > 0 {
                    format!("{:>8.2}", i.percent)
                } else {
                    " ".repeat(8)
                };
                let _ = writeln!(out, "{pct} :\t  {:x}:\t{}", i.addr, i.asm);
            }
            out.push('\n');
        }
    }
}

/// Where samples fell in one function: its leaf frames' exact addresses.
struct Hits {
    mapping: Arc<CodeMapping>,
    /// Process address, counted.
    addrs: HashMap<u64, u64>,
    total: u64,
}

/// The leaf code of each sample: the kernel's where the sample hit the
/// kernel, else the user stack's; its function is the first frame that
/// is not inlined into another.
fn leaf_function(s: &Sample) -> Option<&crate::stacks::symbolize::Frame> {
    let stack = if s.kernel.is_empty() {
        &s.user
    } else {
        &s.kernel
    };
    stack.iter().find(|f| f.kind != Kind::Inlined)
}

/// Annotates the functions `args` names (or its top N) from `samples`,
/// whose leaf frames carry exact addresses. `event` names what was
/// sampled. Functions that cannot be annotated (kernel or JIT code, a file
/// gone or without the function's bytes) are named on stderr; none at all
/// is an error.
pub fn annotate(
    samples: &[Sample],
    args: &AnnotateArgs,
    event: Option<&str>,
) -> anyhow::Result<Annotation> {
    let (out, skipped) = annotate_quietly(samples, args, event);
    for s in &skipped {
        Warning::unsupported(format!("cannot annotate {s}")).print();
    }
    if out.functions.is_empty() {
        anyhow::bail!("nothing to annotate");
    }
    Ok(out)
}

/// [`annotate`], with the functions that could not be annotated, and
/// why, returned rather than printed (for a full-screen view).
pub fn annotate_quietly(
    samples: &[Sample],
    args: &AnnotateArgs,
    event: Option<&str>,
) -> (Annotation, Vec<String>) {
    let mut by_name: HashMap<Arc<str>, u64> = HashMap::new();
    let mut hits: HashMap<(Arc<str>, String), Hits> = HashMap::new();
    for s in samples {
        let Some(f) = leaf_function(s) else { continue };
        *by_name.entry(f.name.clone()).or_default() += s.count;
        let Some(m) = &f.mapping else { continue };
        if f.kind != Kind::User || f.addr == 0 {
            continue;
        }
        let h = hits
            .entry((f.name.clone(), m.file.clone()))
            .or_insert_with(|| Hits {
                mapping: m.clone(),
                addrs: HashMap::new(),
                total: 0,
            });
        *h.addrs.entry(f.addr).or_default() += s.count;
        h.total += s.count;
    }
    let mut names: Vec<Arc<str>> = args
        .functions
        .iter()
        .map(|n| Arc::from(n.as_str()))
        .collect();
    if let Some(n) = args.annotate_top {
        let mut hot: Vec<(&Arc<str>, &u64)> =
            hits.iter().map(|((name, _), h)| (name, &h.total)).collect();
        hot.sort_by(|a, b| b.1.cmp(a.1).then_with(|| a.0.cmp(b.0)));
        hot.dedup_by(|a, b| a.0 == b.0);
        names.extend(hot.into_iter().take(n).map(|(name, _)| name.clone()));
    }
    let mut out = Annotation {
        functions: Vec::new(),
        event: event.unwrap_or("samples").to_owned(),
    };
    let mut skipped = Vec::new();
    let total: u64 = samples.iter().map(|s| s.count).sum();
    for name in names {
        let chosen = match resolve(&name, &by_name, total) {
            Ok(chosen) => chosen,
            Err(why) => {
                skipped.push(why);
                continue;
            }
        };
        let mut found: Vec<(&(Arc<str>, String), &Hits)> = hits
            .iter()
            .filter(|((n, _), _)| chosen.contains(n))
            .collect();
        found.sort_by_key(|f| std::cmp::Reverse(f.1.total));
        if found.is_empty() {
            let own: u64 = chosen.iter().filter_map(|n| by_name.get(n)).sum();
            skipped.push(format!(
                "{} ({own} samples, none at a known address in a file)",
                chosen.join(", ")
            ));
            continue;
        }
        for ((n, _), h) in found {
            match function(n, h) {
                Ok(f) => out.functions.push(f),
                Err(e) => skipped.push(format!("{n} in {}: {e:#}", h.mapping.file)),
            }
        }
    }
    (out, skipped)
}

/// The functions with samples of their own (`own`, of `total`) that the
/// name `typed` means, tried in this order: the name frames carry (a Rust
/// or C++ function by its last path segment too), the linker's name
/// (`camlHot__leaf_81`, `_ZN3foo3barE`: what `nm` and perf's
/// `--no-demangle` show), then a part of one name only. When none or
/// several match, the error names the closest functions with their
/// shares.
fn resolve(typed: &str, own: &HashMap<Arc<str>, u64>, total: u64) -> Result<Vec<Arc<str>>, String> {
    let is =
        |n: &str, want: &str| n == want || n.strip_suffix(want).is_some_and(|p| p.ends_with("::"));
    let named = |want: &str| -> Vec<Arc<str>> {
        let mut v: Vec<Arc<str>> = own.keys().filter(|n| is(n, want)).cloned().collect();
        v.sort();
        v
    };
    let exact = named(typed);
    if !exact.is_empty() {
        return Ok(exact);
    }
    if let Some(demangled) = crate::stacks::demangle::linker_name(typed) {
        let linked = named(&demangled);
        if !linked.is_empty() {
            return Ok(linked);
        }
    }
    let share = |n: &Arc<str>| {
        let c = own.get(n).copied().unwrap_or(0);
        format!("{n} ({:.1} %)", 100.0 * c as f64 / total.max(1) as f64)
    };
    let mut parts: Vec<&Arc<str>> = own.keys().filter(|n| n.contains(typed)).collect();
    match parts.len() {
        1 => return Ok(vec![parts[0].clone()]),
        0 => {}
        _ => {
            parts.sort_by_key(|n| (std::cmp::Reverse(own[*n]), n.to_string()));
            let list: Vec<String> = parts.iter().take(5).map(|n| share(n)).collect();
            return Err(format!(
                "{typed}: {} functions with samples have it in their names: {}{}",
                parts.len(),
                list.join(", "),
                if parts.len() > 5 { ", ..." } else { "" }
            ));
        }
    }
    // None: the closest names by edit similarity, the busier first among
    // equals.
    let mut near: Vec<(f64, &Arc<str>)> = own
        .keys()
        .map(|n| (strsim::normalized_levenshtein(typed, n), n))
        .collect();
    near.sort_by(|a, b| {
        b.0.total_cmp(&a.0)
            .then_with(|| own[b.1].cmp(&own[a.1]))
            .then_with(|| a.1.cmp(b.1))
    });
    let list: Vec<String> = near.iter().take(3).map(|(_, n)| share(n)).collect();
    Err(if list.is_empty() {
        format!("{typed} (no function has samples of its own)")
    } else {
        format!(
            "{typed} (no function with samples has that name; the closest: {})",
            list.join(", ")
        )
    })
}

/// Disassembles the function of `hits` from its file and lays the samples
/// on its instructions.
fn function(name: &str, hits: &Hits) -> anyhow::Result<Function> {
    let m = &hits.mapping;
    let data = std::fs::read(&m.file).with_context(|| format!("cannot read {}", m.file))?;
    let elf = object::File::parse(&*data).context("not an ELF file")?;
    if let (Some(want), Some(have)) = (&m.build_id, elf.build_id().ok().flatten()) {
        let have: String = have.iter().map(|b| format!("{b:02x}")).collect();
        if *want != have {
            anyhow::bail!("the file's build id is {have}, the profile's {want}: it was replaced");
        }
    }
    // Process address -> file offset -> the segment's virtual address.
    let to_vaddr = |addr: u64| -> Option<u64> {
        let off = addr.checked_sub(m.start)?.checked_add(m.offset)?;
        crate::kernel::elf::offset_to_vaddr(&elf, off)
    };
    let any = *hits.addrs.keys().next().context("no samples")?;
    let at = to_vaddr(any).context("the sampled address is in no segment of the file")?;
    let sym = elf
        .symbols()
        .chain(elf.dynamic_symbols())
        .filter(|s| s.kind() == object::SymbolKind::Text && s.size() > 0)
        .find(|s| s.address() <= at && at < s.address() + s.size())
        .context("no symbol covers the sampled address (a stripped file)")?;
    let (start, size) = (sym.address(), sym.size());
    let bytes = elf
        .segments()
        .find_map(|s| {
            let d = s.data_range(start, size).ok().flatten()?;
            Some(d.to_vec())
        })
        .context("the function's bytes are not in the file")?;
    let mut counts: HashMap<u64, u64> = HashMap::new();
    for (&addr, &n) in &hits.addrs {
        if let Some(v) = to_vaddr(addr) {
            *counts.entry(v).or_default() += n;
        }
    }
    let total: u64 = counts.values().sum();
    let mut decoder = iced_x86::Decoder::with_ip(64, &bytes, start, iced_x86::DecoderOptions::NONE);
    let mut fmt = iced_x86::GasFormatter::new();
    let mut insns = Vec::new();
    let mut text = String::new();
    for ins in &mut decoder {
        text.clear();
        iced_x86::Formatter::format(&mut fmt, &ins, &mut text);
        let n = counts.get(&ins.ip()).copied().unwrap_or(0);
        insns.push(Insn {
            addr: ins.ip(),
            samples: n,
            percent: if total > 0 {
                100.0 * n as f64 / total as f64
            } else {
                0.0
            },
            asm: text.clone(),
            line: None,
            source: None,
        });
    }
    source_lines(&m.file, &elf, &mut insns);
    Ok(Function {
        function: name.to_owned(),
        file: m.file.clone(),
        samples: hits.total,
        instructions: insns,
    })
}

/// Fills in each instruction's source line, and its text where the
/// source file is here, from the file's debug information.
fn source_lines(path: &str, elf: &object::File<'_>, insns: &mut [Insn]) {
    use blazesym::symbolize::{Input, Symbolizer, source::Elf, source::Source};
    // blazesym takes file offsets.
    let offsets: Vec<u64> = insns
        .iter()
        .map(|i| crate::kernel::elf::vaddr_to_offset(elf, i.addr).unwrap_or(0))
        .collect();
    let blaze = Symbolizer::builder().enable_code_info(true).build();
    let src = Source::Elf(Elf::new(path));
    let Ok(syms) = blaze.symbolize(&src, Input::FileOffset(&offsets)) else {
        return;
    };
    let mut files: HashMap<std::path::PathBuf, Option<Vec<String>>> = HashMap::new();
    for (i, s) in insns.iter_mut().zip(syms) {
        let Some(sym) = s.as_sym() else { continue };
        let Some(info) = &sym.code_info else { continue };
        let Some(line) = info.line else { continue };
        let file = info.to_path();
        let short = info.file.to_string_lossy();
        i.line = Some(format!("{short}:{line}"));
        let lines = files.entry(file.to_path_buf()).or_insert_with(|| {
            std::fs::read_to_string(&file)
                .ok()
                .map(|t| t.lines().map(str::to_owned).collect())
        });
        i.source = lines
            .as_ref()
            .and_then(|l| l.get(line as usize - 1))
            .cloned();
    }
}

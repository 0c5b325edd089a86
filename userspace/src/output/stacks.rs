//! Counted stacks and their outputs: bcc's multi-line and folded text,
//! JSON lines, flame graphs (inferno), speedscope and pprof files.

pub mod annotate;
pub mod firefox;
pub mod pprof;
pub mod report;
pub mod samplefile;
pub mod transform;

use std::{fmt::Write as _, sync::Arc};

use anyhow::Context as _;

use crate::stacks::{
    sample::Sample,
    symbolize::{Frame, Kind},
};

/// Where the waker's stack joins the woken thread's, as bcc's offwaketime
/// marks it.
pub const WAKER_DELIMITER: &str = "--";

/// The frame that marks where a thread left the CPU, between its user and
/// kernel frames, in stacks of time off the CPU among on-CPU samples.
pub const OFF_CPU_FRAME: &str = "[off-CPU]";

/// The annotation of kernel frames off the CPU, as FlameGraph and inferno
/// strip it from the names they show (its `_[w]`, first for wakers): the
/// flame graph colours them apart from on-CPU kernel frames (`_[k]`).
const OFF_CPU_ANNOTATION: &str = "_[w]";

impl Sample {
    /// The frames root first, as flame graphs stack them: user then kernel
    /// (with `-` between them for `delimiter`); then, with a waker, `--`
    /// and the waker's kernel and user frames leaf first, so that its
    /// stack stands upside down on the woken one's, leaf to leaf, as in
    /// Brendan Gregg's wakeup graphs.
    pub fn root_first(&self, delimiter: bool) -> Vec<Frame> {
        let mut out = Vec::with_capacity(self.user.len() + self.kernel.len() + 1);
        out.extend(self.user.iter().rev().cloned());
        if self.off_cpu {
            out.push(Frame::missed(OFF_CPU_FRAME, Kind::Kernel));
        } else if delimiter && !self.user.is_empty() && !self.kernel.is_empty() {
            out.push(Frame::missed("-", Kind::User));
        }
        out.extend(self.kernel.iter().rev().cloned());
        if let Some(w) = &self.waker {
            out.push(Frame::missed(WAKER_DELIMITER, Kind::User));
            out.extend(w.kernel.iter().cloned());
            out.extend(w.user.iter().cloned());
        }
        out
    }

    /// The names a folded line or a speedscope stack is made of: the
    /// command, the frames root first, and the waker's command. Annotated
    /// kernel frames off the CPU are marked `_[w]`.
    fn path(&self, opts: TextOptions) -> Vec<String> {
        let comm = |c: &str| c.replace(' ', "_");
        let mut out = vec![comm(&self.comm)];
        // The frames from the marker on, which follows the user frames.
        let off_from = if self.off_cpu {
            self.user.len()
        } else {
            usize::MAX
        };
        for (i, f) in self.root_first(opts.delimiter).iter().enumerate() {
            if i >= off_from && opts.annotate && f.kind == Kind::Kernel {
                out.push(format!("{}{OFF_CPU_ANNOTATION}", name(f, false)));
            } else {
                out.push(name(f, opts.annotate));
            }
        }
        out.extend(self.waker.as_ref().map(|w| comm(&w.comm)));
        out
    }
}

/// `samples`, counted in nanoseconds, counted in microseconds, rounded;
/// hottest first, and none that rounds to nothing.
pub fn in_micros(samples: Vec<Sample>) -> Vec<Sample> {
    let mut out: Vec<Sample> = samples
        .into_iter()
        .map(|mut s| {
            s.count = s.count.saturating_add(500) / 1000;
            s
        })
        .filter(|s| s.count > 0)
        .collect();
    out.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.pid.cmp(&b.pid)));
    out
}

/// Samples of folded lines (`comm;frame;... count`, root first), as
/// rtrace, perf's and FlameGraph's stackcollapse write them: the first
/// name is the command, each frame's kind is read from its `_[k]`,
/// `_[j]`, `_[i]` or `_[p]` suffix, and a waker's part (after `--`) is
/// dropped. Lines that do not end in a count are an error, with their
/// number.
pub fn samples_of_folded(text: &str) -> anyhow::Result<Vec<Sample>> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim_end();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (stack, count) = line
            .rsplit_once(' ')
            .and_then(|(s, c)| Some((s, c.parse::<u64>().ok()?)))
            .with_context(|| {
                format!(
                    "line {}: not a folded stack (`frame;frame;... count`)",
                    i + 1
                )
            })?;
        let mut names = stack.split(';');
        let comm = names.next().unwrap_or_default().to_owned();
        let (mut user, mut kernel) = (Vec::new(), Vec::new());
        for n in names {
            if n == WAKER_DELIMITER {
                break;
            }
            if n == "-" {
                continue;
            }
            let (name, kind) = [
                ("_[k]", Kind::Kernel),
                (OFF_CPU_ANNOTATION, Kind::Kernel),
                ("_[j]", Kind::Jit),
                ("_[i]", Kind::Inlined),
                ("_[p]", Kind::Interpreted),
            ]
            .iter()
            .find_map(|(suffix, kind)| Some((n.strip_suffix(suffix)?, *kind)))
            .unwrap_or((n, Kind::User));
            let module = (kind == Kind::Kernel).then_some("[kernel]");
            let f = Frame::new(name, kind, module);
            if kind == Kind::Kernel || (kind == Kind::Inlined && !kernel.is_empty()) {
                kernel.push(f);
            } else {
                user.push(f);
            }
        }
        user.reverse();
        kernel.reverse();
        out.push(Sample {
            comm,
            pid: 0,
            started: 0,
            tid: 0,
            user: user.into(),
            kernel: kernel.into(),
            count,
            waker: None,
            off_cpu: false,
            slot: 0,
            cut_short: false,
        });
    }
    Ok(out)
}

/// The samples with the same thread and frames as one, hottest first:
/// pprof files may hold a stack many times (Go's do), and stacks kept
/// apart by their leaves' exact addresses are one stack to every output
/// but pprof and annotate; so are a process's threads, where they were
/// counted apart (for pprof and a report by thread), and the time slots
/// they were counted in. `exact`: leaf frames at other addresses, other
/// threads and other time slots stay apart.
pub fn merge(samples: Vec<Sample>, exact: bool) -> Vec<Sample> {
    type Key = (
        String,
        (u32, u64),
        u32,
        Arc<[Frame]>,
        Arc<[Frame]>,
        bool,
        [u64; 2],
        u32,
        bool,
    );
    let leaf = |f: &[Frame]| {
        if exact {
            f.first().map_or(0, |f| f.addr)
        } else {
            0
        }
    };
    let mut index: foldhash::HashMap<Key, usize> = foldhash::HashMap::default();
    let mut out: Vec<Sample> = Vec::with_capacity(samples.len());
    for mut s in samples {
        if !exact {
            s.slot = 0;
        }
        if s.waker.is_some() {
            out.push(s);
            continue;
        }
        if !exact {
            s.tid = 0;
        }
        let key = (
            s.comm.clone(),
            // A pid's later process is another.
            (s.pid, s.started),
            s.tid,
            s.user.clone(),
            s.kernel.clone(),
            s.off_cpu,
            [leaf(&s.user), leaf(&s.kernel)],
            s.slot,
            s.cut_short,
        );
        match index.get(&key) {
            Some(&i) => out[i].count += s.count,
            None => {
                index.insert(key, out.len());
                out.push(s);
            }
        }
    }
    out.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.pid.cmp(&b.pid)));
    out
}

/// How text stacks are written.
#[derive(Clone, Copy, Debug, Default)]
pub struct TextOptions {
    /// Put a delimiter between kernel and user frames (`-d`).
    pub delimiter: bool,
    /// Suffix kernel, JIT, inlined and interpreted frames with `_[k]`,
    /// `_[j]`, `_[i]`, `_[p]`.
    pub annotate: bool,
}

/// A frame's name as text shows it: with its line where it has one
/// (`main (main.c:12)`), and the annotation last, where flame graphs look
/// for it.
pub(crate) fn name(f: &Frame, annotate: bool) -> String {
    let mut n = f.name.to_string();
    if let Some(line) = &f.line {
        let _ = write!(n, " ({line})");
    }
    if annotate {
        n.push_str(f.kind.annotation());
    }
    n
}

/// A stack as one folded line, root first: `comm;user..;kernel.. count`,
/// and the waker's frames and command after them where there is one.
/// Semicolons in names become colons, since they separate frames.
pub fn folded_line(s: &Sample, opts: TextOptions) -> String {
    let mut line = s
        .path(opts)
        .iter()
        .map(|n| n.replace(';', ":"))
        .collect::<Vec<_>>()
        .join(";");
    let _ = write!(line, " {}", s.count);
    line
}

/// How a profile's stacks are printed as text.
#[derive(Clone, Copy, Debug)]
pub enum Style {
    /// Folded lines, the hottest first.
    Folded(TextOptions),
    /// bcc's multi-line form: frames leaf first, kernel then user, then the
    /// command and count; the hottest stack last, nearest the prompt, as
    /// bcc's profile prints it.
    Multiline(TextOptions),
}

/// A profile's stacks, hottest first, as one record: text in `style`,
/// JSON one object per stack with its frames leaf first.
pub struct Stacks<'a> {
    /// The stacks, hottest first.
    pub samples: &'a [Sample],
    /// The text form.
    pub style: Style,
    /// What the counts are, as the JSON field names them: `count` for
    /// samples, `us` for microseconds.
    pub value: &'static str,
}

impl serde::Serialize for Stacks<'_> {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        let frames = |fs: &[Frame]| -> Vec<serde_json::Value> {
            fs.iter()
                .map(|f| {
                    let mut v = serde_json::json!({
                        "name": &*f.name,
                        "kind": kind_name(f.kind),
                        "module": f.module.as_deref(),
                    });
                    if let Some((file, line)) = f.file_line() {
                        v["file"] = file.into();
                        v["line"] = line.into();
                    }
                    v
                })
                .collect()
        };
        ser.collect_seq(self.samples.iter().map(|s| {
            let mut m = serde_json::Map::new();
            m.insert("comm".into(), s.comm.clone().into());
            m.insert("pid".into(), s.pid.into());
            m.insert(self.value.into(), s.count.into());
            m.insert("kernel".into(), frames(&s.kernel).into());
            m.insert("user".into(), frames(&s.user).into());
            if s.cut_short {
                m.insert("cut_short".into(), true.into());
            }
            if let Some(w) = &s.waker {
                m.insert(
                    "waker".into(),
                    serde_json::json!({
                        "comm": w.comm,
                        "pid": w.pid,
                        "kernel": frames(&w.kernel),
                        "user": frames(&w.user),
                    }),
                );
            }
            m
        }))
    }
}

impl Stacks<'_> {
    /// Prints a stack tool's report: folded lines with `folded`, else
    /// bcc's multi-line form. With output files asked for (`files`),
    /// stdout stays empty unless folded lines are (JSON is printed either
    /// way).
    pub fn print(
        sink: &mut super::Sink,
        samples: &[Sample],
        text: TextOptions,
        folded: bool,
        files: bool,
        value: &'static str,
    ) -> anyhow::Result<()> {
        if files && !folded {
            sink.quiet_text();
        }
        sink.emit(&Stacks {
            samples,
            style: if folded {
                Style::Folded(text)
            } else {
                Style::Multiline(text)
            },
            value,
        })
    }
}

impl super::Record for Stacks<'_> {
    fn text(&self, out: &mut String) {
        match self.style {
            Style::Folded(opts) => {
                for s in self.samples {
                    out.push_str(&folded_line(s, opts));
                    out.push('\n');
                }
            }
            Style::Multiline(opts) => {
                for s in self.samples.iter().rev() {
                    // bcc's offwaketime: the waker's stack root first, then
                    // the woken thread's leaf first, meeting at `--`.
                    if let Some(w) = &s.waker {
                        let _ = writeln!(out, "    {:<16} {} {}", "waker:", w.comm, w.pid);
                        for f in w.user.iter().rev().chain(w.kernel.iter().rev()) {
                            let _ = writeln!(out, "    {}", name(f, opts.annotate));
                        }
                        let _ = writeln!(out, "    {WAKER_DELIMITER:<16} {WAKER_DELIMITER}");
                    }
                    for f in s.kernel.iter() {
                        let _ = writeln!(out, "    {}", name(f, opts.annotate));
                    }
                    if opts.delimiter && !s.kernel.is_empty() && !s.user.is_empty() {
                        out.push_str("    --\n");
                    }
                    for f in s.user.iter() {
                        let _ = writeln!(out, "    {}", name(f, opts.annotate));
                    }
                    if s.waker.is_some() {
                        let _ = writeln!(out, "    {:<16} {} {}", "target:", s.comm, s.pid);
                    } else {
                        let _ = writeln!(out, "    {:<16} {} ({})", "-", s.comm, s.pid);
                    }
                    let _ = writeln!(out, "        {}\n", s.count);
                }
            }
        }
    }
}

fn kind_name(k: Kind) -> &'static str {
    match k {
        Kind::Kernel => "kernel",
        Kind::User => "user",
        Kind::Jit => "jit",
        Kind::Interpreted => "interpreted",
        Kind::Inlined => "inlined",
    }
}

/// Flame graph settings.
#[derive(Clone, Debug)]
pub struct FlameOptions {
    /// The graph's title.
    pub title: String,
    /// Draw it upside down, roots at the top.
    pub icicle: bool,
    /// What one sample stands for, as the tooltips name it.
    pub count_name: String,
    /// The colours.
    pub palette: inferno::flamegraph::color::Palette,
}

impl FlameOptions {
    /// The colours of CPU profiles: FlameGraph's `--color=java`, which
    /// colours frames by the `_[k]`, `_[j]` and `_[i]` suffixes (and C++
    /// `::` names), as perf users know it; the suffixes are not shown.
    pub fn by_kind() -> inferno::flamegraph::color::Palette {
        inferno::flamegraph::color::Palette::Multi(inferno::flamegraph::color::MultiPalette::Java)
    }
}

fn inferno_options<'a>(opts: &FlameOptions) -> inferno::flamegraph::Options<'a> {
    use inferno::flamegraph::Direction;
    let mut o = inferno::flamegraph::Options::default();
    o.title = opts.title.clone();
    o.count_name = opts.count_name.clone();
    o.colors = opts.palette;
    if opts.icicle {
        o.direction = Direction::Inverted;
    }
    o
}

/// Writes an SVG flame graph of `samples` to `out`.
pub fn write_svg(
    samples: &[Sample],
    out: &mut dyn std::io::Write,
    opts: &FlameOptions,
) -> anyhow::Result<()> {
    let annotated = TextOptions {
        delimiter: false,
        annotate: true,
    };
    let lines: Vec<String> = samples.iter().map(|s| folded_line(s, annotated)).collect();
    let mut o = inferno_options(opts);
    // Frames off the CPU in blues, whatever the palette gives the rest.
    let (lines, mut colors) = interpreted_colors(lines);
    for (s, line) in samples.iter().zip(&lines) {
        if !s.off_cpu {
            continue;
        }
        let (stack, _) = line.rsplit_once(' ').unwrap_or((line, ""));
        for n in stack.split(';') {
            if n == OFF_CPU_FRAME || n.ends_with(OFF_CPU_ANNOTATION) {
                colors.insert(n, blue(n));
            }
        }
    }
    if colors.iter().next().is_some() {
        o.palette_map = Some(&mut colors);
    }
    inferno::flamegraph::from_lines(&mut o, lines.iter().map(String::as_str), out)
        .context("cannot draw the flame graph")
}

/// Interpreted frames (`_[p]`) in purples, the hue the `java` palette
/// leaves free beside kernel (orange), JIT (green), inlined (aqua) and
/// native (red) frames: rtrace's mixed-mode palette. inferno hides only
/// the suffixes it knows, so they are drawn as `_[j]` frames with colours
/// of their own.
fn interpreted_colors(lines: Vec<String>) -> (Vec<String>, inferno::flamegraph::color::PaletteMap) {
    let mut map = inferno::flamegraph::color::PaletteMap::default();
    let lines = lines
        .into_iter()
        .map(|line| {
            if !line.contains("_[p]") {
                return line;
            }
            let (stack, count) = line.rsplit_once(' ').unwrap_or((&line, ""));
            let frames: Vec<String> = stack
                .split(';')
                .map(|n| match n.strip_suffix("_[p]") {
                    Some(name) => {
                        let shown = format!("{name}_[j]");
                        let h = hue(name);
                        map.insert(
                            &shown,
                            inferno::flamegraph::color::Color {
                                r: 150 + (60.0 * h) as u8,
                                g: 80 + (40.0 * h) as u8,
                                b: 200 + (55.0 * h) as u8,
                            },
                        );
                        shown
                    }
                    None => n.to_owned(),
                })
                .collect();
            format!("{} {count}", frames.join(";"))
        })
        .collect();
    (lines, map)
}

/// Writes a flame graph of folded `lines` (root first, count last) to
/// `out`.
pub fn write_folded_svg(
    lines: &[String],
    out: &mut dyn std::io::Write,
    opts: &FlameOptions,
) -> anyhow::Result<()> {
    let mut o = inferno_options(opts);
    let (lines, mut colors) = interpreted_colors(lines.to_vec());
    if opts.palette == FlameOptions::by_kind() && colors.iter().next().is_some() {
        o.palette_map = Some(&mut colors);
    }
    inferno::flamegraph::from_lines(&mut o, lines.iter().map(String::as_str), out)
        .context("cannot draw the flame graph")
}

/// Writes a differential flame graph of two folded profiles to `out`:
/// frames colored red where AFTER has more samples, blue where it has
/// fewer.
pub fn write_diff_svg(
    before: &[u8],
    after: &[u8],
    out: &mut dyn std::io::Write,
    normalize: bool,
    opts: &FlameOptions,
) -> anyhow::Result<()> {
    let mut folded = Vec::new();
    inferno::differential::from_readers(
        inferno::differential::Options {
            normalize,
            strip_hex: false,
        },
        before,
        after,
        &mut folded,
    )
    .context("cannot read the folded stacks")?;
    let mut o = inferno_options(opts);
    inferno::flamegraph::from_reader(&mut o, folded.as_slice(), out)
        .context("cannot draw the flame graph")
}

/// A number in [0, 1) that varies with the name, as FlameGraph varies its
/// palettes, so that neighbouring frames stay apart.
fn hue(name: &str) -> f32 {
    let h = name
        .bytes()
        .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)));
    (h % 1000) as f32 / 1000.0
}

/// A blue that varies with the name.
fn blue(name: &str) -> inferno::flamegraph::color::Color {
    let v = hue(name);
    inferno::flamegraph::color::Color {
        r: 60 + (60.0 * v) as u8,
        g: 90 + (70.0 * v) as u8,
        b: 200 + (55.0 * v) as u8,
    }
}

/// Writes a speedscope file (speedscope.app's "sampled" profile): one
/// shared frame table and each stack root first, weighted by its count in
/// `unit` (`none` for samples, or one of speedscope's time units), to
/// `out`.
pub fn write_speedscope(
    samples: &[Sample],
    out: &mut dyn std::io::Write,
    name: &str,
    unit: &str,
) -> anyhow::Result<()> {
    let mut index: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    let mut frames: Vec<serde_json::Value> = Vec::new();
    let mut stacks = Vec::with_capacity(samples.len());
    let mut weights = Vec::with_capacity(samples.len());
    let plain = TextOptions::default();
    for s in samples {
        // The names of `path`, but for lines, which speedscope shows from
        // fields of their own.
        let root_first = s.root_first(plain.delimiter);
        let stack: Vec<usize> = s
            .path(plain)
            .into_iter()
            .enumerate()
            .map(|(i, n)| {
                let source = i
                    .checked_sub(1)
                    .and_then(|j| root_first.get(j))
                    .and_then(Frame::file_line);
                let shown = match source {
                    Some(_) => root_first[i - 1].name.to_string(),
                    None => n.clone(),
                };
                *index.entry(n).or_insert_with(|| {
                    let mut frame = serde_json::json!({ "name": shown });
                    if let Some((file, line)) = source {
                        frame["file"] = file.into();
                        frame["line"] = line.into();
                    }
                    frames.push(frame);
                    frames.len() - 1
                })
            })
            .collect();
        stacks.push(stack);
        weights.push(s.count);
    }
    let total: u64 = weights.iter().sum();
    let doc = serde_json::json!({
        "$schema": "https://www.speedscope.app/file-format-schema.json",
        "exporter": concat!("rtrace ", env!("CARGO_PKG_VERSION")),
        "name": name,
        "activeProfileIndex": 0,
        "shared": { "frames": frames },
        "profiles": [{
            "type": "sampled",
            "name": name,
            "unit": unit,
            "startValue": 0,
            "endValue": total,
            "samples": stacks,
            "weights": weights,
        }],
    });
    serde_json::to_writer(out, &doc).context("cannot write the speedscope profile")
}

/// A frame as bcc prints it: `func+0x1a [module]`, after its address with
/// `-a`.
pub fn frame_text(f: &crate::stacks::symbolize::Frame, address: bool) -> String {
    let module = f
        .module
        .as_deref()
        .map(|m| m.rsplit('/').next().unwrap_or(m).trim_matches(['[', ']']))
        .unwrap_or("unknown");
    if address {
        format!("{:16x} {} [{module}]", f.addr, f.name)
    } else {
        format!("{} [{module}]", f.name)
    }
}

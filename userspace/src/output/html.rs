//! One self-contained HTML page of a profile (`--html`): FlameScope's
//! heat map, a flame graph drawn in the page from the stacks it carries
//! (zoom, search, flame or icicle), perf report's table and the run's
//! facts; or the differential view of two profiles. The page's script and
//! style are rtrace's own (`html/page.js`, `html/page.css`), built into
//! the binary: the page fetches nothing, so it opens from a file, a mail
//! or a CI artifact.
//!
//! The data is interned: each frame (name, kind, file) and each stack
//! once, and the samples as three arrays of numbers (stack, time slot,
//! count), so that a minute of a whole machine at 99 Hz is some hundreds
//! of kilobytes.

use std::{collections::HashMap, io::Write};

use serde::Serialize;

use crate::stacks::{
    sample::{MISSED_KERNEL, MISSED_USER, Sample},
    symbolize::{Frame, Kind},
};

const SHELL: &str = include_str!("html/shell.html");
const SCRIPT: &str = include_str!("html/page.js");
const STYLE: &str = include_str!("html/page.css");

/// The kinds of frames as the page colours them, by index.
const KINDS: [&str; 7] = [
    "kernel",
    "native",
    "jit",
    "interpreted",
    "inlined",
    "comm",
    "marker",
];
const COMM: u8 = 5;
const MARKER: u8 = 6;

/// What a page shows.
pub struct Page<'a> {
    /// Its heading and window title.
    pub title: String,
    /// The run's facts, in order: command line, events, rate, duration
    /// and the like ([`run_facts`] has those of every run).
    pub facts: Vec<(String, String)>,
    /// What a count is: `samples`, `us`, `ns` or `bytes`.
    pub unit: &'a str,
    /// The profile, or two (before, after) for a differential page.
    pub profiles: Vec<(String, &'a [Sample])>,
    /// Whether the samples carry their time slots ([`Sample::slot`]),
    /// and when the run began (local time), for the heat map.
    pub heat: Option<String>,
}

#[derive(Serialize)]
struct Data<'a> {
    version: u32,
    title: &'a str,
    facts: &'a [(String, String)],
    unit: &'a str,
    kinds: [&'static str; 7],
    modules: Vec<String>,
    frames: Frames,
    stacks: Vec<Vec<u32>>,
    profiles: Vec<Profile<'a>>,
    heat: Option<Heat<'a>>,
}

#[derive(Default, Serialize)]
struct Frames {
    name: Vec<String>,
    kind: Vec<u8>,
    module: Vec<i32>,
}

#[derive(Serialize)]
struct Profile<'a> {
    name: &'a str,
    total: u64,
    stack: Vec<u32>,
    slot: Vec<u32>,
    count: Vec<u64>,
}

#[derive(Serialize)]
struct Heat<'a> {
    slot_ms: u64,
    slots: u32,
    start: &'a str,
}

/// Interns frames and stacks.
#[derive(Default)]
struct Tables {
    frames: Frames,
    frame_ids: HashMap<(String, u8, i32), u32>,
    modules: Vec<String>,
    module_ids: HashMap<String, i32>,
    stacks: Vec<Vec<u32>>,
    stack_ids: HashMap<Vec<u32>, u32>,
}

impl Tables {
    fn frame(&mut self, name: String, kind: u8, module: Option<&str>) -> u32 {
        let module = match module {
            Some(m) => {
                let next = self.modules.len() as i32;
                *self.module_ids.entry(m.to_owned()).or_insert_with(|| {
                    self.modules.push(m.to_owned());
                    next
                })
            }
            None => -1,
        };
        let next = self.frames.name.len() as u32;
        let frames = &mut self.frames;
        *self
            .frame_ids
            .entry((name.clone(), kind, module))
            .or_insert_with(|| {
                frames.name.push(name);
                frames.kind.push(kind);
                frames.module.push(module);
                next
            })
    }

    fn stack(&mut self, s: &Sample) -> u32 {
        let mut ids = Vec::with_capacity(s.user.len() + s.kernel.len() + 2);
        ids.push(self.frame(s.comm.clone(), COMM, None));
        for f in s.root_first(false) {
            let kind = kind_of(&f);
            // With its source line, where there is one, as every output
            // names it.
            let name = super::stacks::name(&f, false);
            ids.push(self.frame(name, kind, f.module.as_deref()));
        }
        if let Some(w) = &s.waker {
            ids.push(self.frame(w.comm.clone(), COMM, None));
        }
        let next = self.stacks.len() as u32;
        match self.stack_ids.get(&ids) {
            Some(&id) => id,
            None => {
                self.stack_ids.insert(ids.clone(), next);
                self.stacks.push(ids);
                next
            }
        }
    }
}

/// The page's kind of a frame: the placeholders rtrace puts where a
/// stack was not walked, or where a thread left the CPU, are markers.
fn kind_of(f: &Frame) -> u8 {
    let marker = f.module.is_none()
        && (f.name.as_ref() == super::stacks::OFF_CPU_FRAME
            || f.name.as_ref() == MISSED_USER
            || f.name.as_ref() == MISSED_KERNEL
            || f.name.as_ref() == super::stacks::WAKER_DELIMITER
            || f.name.as_ref() == "-");
    if marker {
        return MARKER;
    }
    match f.kind {
        Kind::Kernel => 0,
        Kind::User => 1,
        Kind::Jit => 2,
        Kind::Interpreted => 3,
        Kind::Inlined => 4,
    }
}

/// The command line rtrace runs with, as a fact.
pub fn command_line() -> (String, String) {
    let args: Vec<String> = std::env::args().collect();
    ("Command line".to_owned(), shell_words(&args))
}

/// The facts of every run: its command line, the kernel and the host.
pub fn run_facts() -> Vec<(String, String)> {
    with_run_facts(Vec::new())
}

/// A tool's own `facts` among those of every run: after the command
/// line, before the kernel and the host.
pub fn with_run_facts(facts: Vec<(String, String)>) -> Vec<(String, String)> {
    let host = crate::kernel::host_name().unwrap_or_else(|| "unknown".to_owned());
    let mut out = vec![command_line()];
    out.extend(facts);
    out.push((
        "Kernel".to_owned(),
        crate::kernel::features::kernel_release(),
    ));
    out.push(("Host".to_owned(), host));
    out
}

/// The command line as a shell would take it back.
fn shell_words(args: &[String]) -> String {
    args.iter()
        .map(|a| {
            let plain = !a.is_empty()
                && a.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c));
            if plain {
                a.clone()
            } else {
                format!("'{}'", a.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Writes `page` to `out`.
pub fn write(page: &Page<'_>, out: &mut dyn Write) -> anyhow::Result<()> {
    let mut tables = Tables::default();
    let mut profiles = Vec::with_capacity(page.profiles.len());
    let mut slots = 0;
    for (name, samples) in &page.profiles {
        let mut p = Profile {
            name,
            total: 0,
            stack: Vec::with_capacity(samples.len()),
            slot: Vec::with_capacity(samples.len()),
            count: Vec::with_capacity(samples.len()),
        };
        // Samples kept apart by thread or by leaf address are one entry
        // here, as the page names frames alike the same.
        let mut entries: HashMap<(u32, u32), usize> = HashMap::with_capacity(samples.len());
        for s in samples.iter() {
            let stack = tables.stack(s);
            match entries.get(&(stack, s.slot)) {
                Some(&i) => p.count[i] += s.count,
                None => {
                    entries.insert((stack, s.slot), p.stack.len());
                    p.stack.push(stack);
                    p.slot.push(s.slot);
                    p.count.push(s.count);
                }
            }
            p.total += s.count;
            slots = slots.max(s.slot);
        }
        profiles.push(p);
    }
    let data = Data {
        version: 1,
        title: &page.title,
        facts: &page.facts,
        unit: page.unit,
        kinds: KINDS,
        modules: tables.modules,
        frames: tables.frames,
        stacks: tables.stacks,
        profiles,
        heat: page
            .heat
            .as_deref()
            .filter(|_| slots > 0 && page.profiles.len() == 1)
            .map(|start| Heat {
                slot_ms: rtrace_common::profile::HEAT_SLOT_NS / 1_000_000,
                slots,
                start,
            }),
    };
    // `<` only ever occurs in the JSON's strings, where `\u003c` is the
    // same character and cannot end the script element.
    let json = serde_json::to_string(&data)?.replace('<', "\\u003c");
    let html = SHELL
        .replacen("{{TITLE}}", &escape(&page.title), 1)
        .replacen("/*CSS*/", STYLE, 1)
        .replacen("/*JS*/", SCRIPT, 1);
    // The data last, so that nothing in it is taken for a placeholder.
    let (head, tail) = html
        .split_once("{{DATA}}")
        .expect("the page's shell has a data placeholder");
    out.write_all(head.as_bytes())?;
    out.write_all(json.as_bytes())?;
    out.write_all(tail.as_bytes())?;
    Ok(())
}

/// `s` as text of an HTML or SVG document, or of a quoted attribute.
pub fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn sample(comm: &str, user: &[&str], slot: u32, count: u64) -> Sample {
        Sample {
            comm: comm.to_owned(),
            pid: 1,
            started: 0,
            tid: 0,
            user: user
                .iter()
                .rev()
                .map(|n| Frame::missed(n, Kind::User))
                .collect::<Vec<_>>()
                .into(),
            kernel: Arc::from([]),
            count,
            waker: None,
            off_cpu: false,
            slot,
            cut_short: false,
        }
    }

    fn data_of(html: &str) -> serde_json::Value {
        let start = html.find(r#"id="rtrace-data""#).unwrap();
        let body = &html[start..];
        let json = &body[body.find('>').unwrap() + 1..body.find("</script>").unwrap()];
        serde_json::from_str(json).unwrap()
    }

    /// Frames and stacks are held once; each sample is its stack, slot
    /// and count; a name with `</script>` in it cannot end the data.
    #[test]
    fn the_data_is_interned_and_cannot_end_its_script() {
        let samples = [
            sample("a", &["main", "f</script>"], 3, 5),
            sample("a", &["main", "f</script>"], 4, 2),
            sample("a", &["main", "g"], 4, 1),
        ];
        let page = Page {
            title: "t <b>".to_owned(),
            facts: vec![("Host".to_owned(), "h".to_owned())],
            unit: "samples",
            profiles: vec![("p".to_owned(), &samples)],
            heat: Some("now".to_owned()),
        };
        let mut out = Vec::new();
        write(&page, &mut out).unwrap();
        let html = String::from_utf8(out).unwrap();
        assert_eq!(
            html.matches("</script>").count(),
            2,
            "the data's and the script's"
        );
        assert!(html.contains("<title>t &lt;b&gt;</title>"));
        let d = data_of(&html);
        assert_eq!(
            d["frames"]["name"],
            serde_json::json!(["a", "main", "f</script>", "g"])
        );
        assert_eq!(d["stacks"], serde_json::json!([[0, 1, 2], [0, 1, 3]]));
        assert_eq!(d["profiles"][0]["stack"], serde_json::json!([0, 0, 1]));
        assert_eq!(d["profiles"][0]["slot"], serde_json::json!([3, 4, 4]));
        assert_eq!(d["profiles"][0]["total"], 8);
        assert_eq!(d["heat"]["slots"], 4);
        for reference in ["src=", "href=\"http", "@import", "url("] {
            assert!(!html.contains(reference), "{reference}");
        }
    }

    /// Samples without times make a page without a heat map.
    #[test]
    fn untimed_samples_have_no_heat_map() {
        let samples = [sample("a", &["main"], 0, 5)];
        let page = Page {
            title: "t".to_owned(),
            facts: Vec::new(),
            unit: "samples",
            profiles: vec![("p".to_owned(), &samples)],
            heat: Some("now".to_owned()),
        };
        let mut out = Vec::new();
        write(&page, &mut out).unwrap();
        assert!(data_of(&String::from_utf8(out).unwrap())["heat"].is_null());
    }
}

//! `cargo xtask bench html`: how fast the page of a minute of a whole
//! machine opens. `rtrace profile -a -F 99 --html --svg 60` records a
//! mixed workload (a file walk with gzip, a Python loop, short-lived
//! processes); then headless Chromium opens the page and the SVG flame
//! graph of the same profile (inferno's, as flamegraph.pl draws it: what
//! people open today), interleaved, and each load is timed from the start
//! of navigation to the end of its load event (the page's, to its first
//! drawing where that comes later). Reported: both files' sizes and load
//! times, medians and ranges, and their ratio.

use std::process::Command;

use anyhow::{Context as _, bail};

use super::{measured_on, median, spread};

/// The profile's length and rate, as the issue names them.
const SECONDS: u64 = 60;
const HZ: u64 = 99;
/// Loads of each file.
const TRIALS: usize = 7;
/// The goal: the page opens in under a second.
const GOAL_MS: f64 = 1000.0;

/// What the machine does while it is profiled: work in many processes
/// and code of every kind (kernel file reads, native gzip, Python).
const WORKLOAD: &str = "end=$(($(date +%s) + 62)); while [ $(date +%s) -lt $end ]; do \
     find /usr/lib -type f -name '*.so*' 2>/dev/null | head -300 | xargs -r cat | gzip -1 >/dev/null; \
     python3 -c 'import json; [json.dumps(list(range(500))) for _ in range(2000)]'; \
     done";

pub fn run() -> anyhow::Result<String> {
    let rtrace = crate::build()?;
    let pageload = crate::root().join("target/release/pageload");
    let dir = crate::root().join("target/bench/html");
    std::fs::create_dir_all(&dir)?;
    let (page, svg) = (dir.join("system.html"), dir.join("system.svg"));
    eprintln!("bench html: profiling the whole machine for {SECONDS} s at {HZ} Hz");
    let mut work = Command::new("sh")
        .args(["-c", WORKLOAD])
        .spawn()
        .context("cannot start the workload")?;
    let recorded = Command::new(&rtrace)
        .args(["profile", "-a", "-F", &HZ.to_string(), "--html"])
        .arg(&page)
        .arg("--svg")
        .arg(&svg)
        .arg(SECONDS.to_string())
        .output()
        .context("cannot run rtrace profile")?;
    let _ = work.kill();
    let _ = work.wait();
    if !recorded.status.success() {
        bail!(
            "rtrace profile failed: {}",
            String::from_utf8_lossy(&recorded.stderr)
        );
    }
    let wrote = String::from_utf8_lossy(&recorded.stderr)
        .lines()
        .find(|l| l.contains("wrote") && l.contains(".html"))
        .map(str::to_owned)
        .unwrap_or_default();
    eprintln!("bench html: {wrote}; loading both files {TRIALS} times, interleaved");
    let out = Command::new(&pageload)
        .arg(TRIALS.to_string())
        .arg(&page)
        .arg(&svg)
        .output()
        .with_context(|| format!("cannot run {}", pageload.display()))?;
    if !out.status.success() {
        bail!("pageload failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let text = String::from_utf8(out.stdout)?;
    let mut page_ms = Vec::new();
    let mut svg_ms = Vec::new();
    for line in text.lines() {
        let (file, ms) = line.rsplit_once(' ').context("a line of pageload")?;
        let ms: f64 = ms.parse()?;
        eprintln!("  {file}: {ms:.0} ms");
        if file.ends_with(".html") {
            page_ms.push(ms);
        } else {
            svg_ms.push(ms);
        }
    }
    let size = |p: &std::path::Path| std::fs::metadata(p).map_or(0, |m| m.len());
    let (pm, sm) = (median(page_ms.clone()), median(svg_ms.clone()));
    let (pr, sr) = (spread(&page_ms), spread(&svg_ms));
    let stacks = wrote
        .split_once('(')
        .and_then(|(_, w)| w.strip_suffix(')'))
        .unwrap_or("?")
        .to_owned();
    let mut table = format!(
        "{} (`rtrace profile -a -F {HZ} --html --svg {SECONDS}` of the machine running a file \
         walk with gzip and a Python loop in a shell loop: {stacks}; each file opened {TRIALS} \
         times in headless Chromium, interleaved, timed from navigation to the end of its load \
         event, or of the page's first drawing; medians, ranges in parentheses):\n\n",
        measured_on("html")
    );
    table.push_str("| file | size | load |\n| --- | --- | --- |\n");
    table.push_str(&format!(
        "| the page (`--html`) | {} KiB | {pm:.0} ms ({:.0}–{:.0}) |\n",
        size(&page) / 1024,
        pr.0,
        pr.1
    ));
    table.push_str(&format!(
        "| the flame graph (`--svg`, inferno) | {} KiB | {sm:.0} ms ({:.0}–{:.0}) |\n",
        size(&svg) / 1024,
        sr.0,
        sr.1
    ));
    table.push_str(&format!(
        "\nThe page opens in {pm:.0} ms (goal: under {GOAL_MS:.0} ms; {}), {:.2}x the SVG's \
         time, and is {:.2}x its size.\n",
        if pm < GOAL_MS { "met" } else { "NOT met" },
        pm / sm,
        size(&page) as f64 / size(&svg).max(1) as f64
    ));
    println!("{table}");
    Ok(table)
}

//! The page `--html` writes, opened in a real headless Chromium and used
//! as a person would: the heat map of a fixture that burns the CPU in two
//! bursts in two functions (`tests/fixtures/bursts.c`), a drag over the
//! first burst's cells, search, zoom and reset, the icicle toggle, the
//! report table, and the differential page of two profiles. Counts are
//! judged against the CPU time the fixture measured of each burst.
//!
//! The VM guests have no browser: there these tests say so and return.

use std::path::{Path, PathBuf};

use rtrace_integration_tests::{
    browser::{Browser, Element, browser_available},
    run, workload_bin,
};
use serde_json::Value;

/// The sampling rate: high enough for some hundred samples a burst.
const HZ: u64 = 199;
/// A heat map slot.
const SLOT_NS: u64 = 20_000_000;

/// One burst as the fixture measured it.
#[derive(Debug)]
struct Burst {
    name: String,
    /// CLOCK_MONOTONIC span.
    start: u64,
    end: u64,
    /// The CPU time it got, which the profile samples.
    cpu_ns: u64,
}

/// A profile of the fixture, with its page and pprof file.
struct Recorded {
    page: PathBuf,
    pprof: PathBuf,
    /// Time zero of the heat map, CLOCK_MONOTONIC.
    zero: u64,
    bursts: Vec<Burst>,
}

fn dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("rtrace-html-{tag}"));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Profiles the fixture burning FIRST ms, pausing GAP ms, burning SECOND
/// ms, into a page and a pprof file in `dir`.
fn record(dir: &Path, name: &str, first: u64, gap: u64, second: u64) -> Recorded {
    let page = dir.join(format!("{name}.html"));
    let pprof = dir.join(format!("{name}.pb.gz"));
    let fixture = workload_bin("bursts_nofp");
    let hz = HZ.to_string();
    let [first, gap, second] = [first, gap, second].map(|v| v.to_string());
    let (code, stdout, stderr) = run(&[
        "profile",
        "-v",
        "-F",
        &hz,
        "--html",
        page.to_str().unwrap(),
        "--pprof",
        pprof.to_str().unwrap(),
        "--",
        fixture.to_str().unwrap(),
        &first,
        &gap,
        &second,
    ]);
    assert_eq!(code, 0, "{stderr}");
    Recorded {
        page,
        pprof,
        zero: time_zero(&stderr),
        bursts: bursts_of(&stdout),
    }
}

/// The time zero `-v` names, CLOCK_MONOTONIC.
fn time_zero(stderr: &str) -> u64 {
    stderr
        .lines()
        .find_map(|l| l.split("CLOCK_MONOTONIC ").nth(1))
        .and_then(|v| v.trim_end_matches(" ns").parse().ok())
        .unwrap_or_else(|| panic!("no time zero in {stderr}"))
}

/// The fixture's two bursts, as it printed them.
fn bursts_of(stdout: &str) -> Vec<Burst> {
    let bursts: Vec<Burst> = stdout
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 5 && f[0] == "burst").then(|| Burst {
                name: f[1].to_owned(),
                start: f[2].parse().unwrap(),
                end: f[3].parse().unwrap(),
                cpu_ns: f[4].parse().unwrap(),
            })
        })
        .collect();
    assert_eq!(bursts.len(), 2, "{stdout}");
    bursts
}

/// The heat map slot (1-based) of a CLOCK_MONOTONIC time.
fn slot_of(zero: u64, t: u64) -> u64 {
    (t - zero) / SLOT_NS + 1
}

/// Samples expected of a burst: its CPU time at the sampling rate, and
/// the bound its count may stray by (four standard deviations of a
/// Poisson count, and a sample at each edge).
fn expected(b: &Burst) -> (f64, f64) {
    let n = b.cpu_ns as f64 * HZ as f64 / 1e9;
    (n, 4.0 * n.sqrt() + 2.0)
}

/// Opens `page` and waits until it has drawn.
fn open(browser: &Browser, page: &Path) {
    browser.goto(page);
    browser.wait_for(
        "document.body && document.body.dataset.ready === '1'",
        std::time::Duration::from_secs(20),
    );
}

/// Every heat map cell with samples: (slot, second, row, count).
fn cells(browser: &Browser) -> Vec<(u64, u64, u64, u64)> {
    let v = browser.execute(
        "return Array.from(document.querySelectorAll('#heatmap rect.cell'), c =>
            [c.dataset.slot, c.dataset.second, c.dataset.row, c.dataset.count].map(Number))
            .filter(c => c[3] > 0);",
        Vec::new(),
    );
    v.as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let n = |i: usize| c[i].as_f64().unwrap() as u64;
            (n(0), n(1), n(2), n(3))
        })
        .collect()
}

/// The flame graph as drawn: the zoom root's count, the svg's width, and
/// each frame's name, count, depth, rect width and x.
struct Drawn {
    root: f64,
    width: f64,
    frames: Vec<(String, f64, u64, f64, f64)>,
}

fn drawn(browser: &Browser) -> Drawn {
    let v = browser.execute(
        "const svg = document.getElementById('flamegraph');
         const frames = Array.from(svg.querySelectorAll('g.frame'), g => {
             const r = g.querySelector('rect');
             return [g.dataset.name, Number(g.dataset.count), Number(g.dataset.depth),
                     r.width.baseVal.value, r.x.baseVal.value, g.classList.contains('ancestor'),
                     r.y.baseVal.value];
         });
         const vb = svg.viewBox.baseVal;
         const width = vb && vb.width ? vb.width : svg.width.baseVal.value;
         return { frames, width };",
        Vec::new(),
    );
    let frames: Vec<(String, f64, u64, f64, f64)> = v["frames"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f[5] != Value::Bool(true))
        .map(|f| {
            (
                f[0].as_str().unwrap().to_owned(),
                f[1].as_f64().unwrap(),
                f[2].as_f64().unwrap() as u64,
                f[3].as_f64().unwrap(),
                f[4].as_f64().unwrap(),
            )
        })
        .collect();
    // The zoom root: the shallowest frame not faded as an ancestor.
    let root = frames
        .iter()
        .min_by_key(|f| f.2)
        .map(|f| f.1)
        .expect("no frames drawn");
    Drawn {
        root,
        width: v["width"].as_f64().unwrap(),
        frames,
    }
}

impl Drawn {
    /// The samples under frames named `name` (each sample once: the
    /// fixture's functions do not recurse), as a share of the root's.
    fn share(&self, name: &str) -> f64 {
        let n: f64 = self
            .frames
            .iter()
            .filter(|f| f.0 == name)
            .map(|f| f.1)
            .sum();
        n / self.root
    }

    /// The drawn width of frames named `name`, as a share of the graph's.
    fn width_share(&self, name: &str) -> f64 {
        let w: f64 = self
            .frames
            .iter()
            .filter(|f| f.0 == name)
            .map(|f| f.3)
            .sum();
        w / self.width
    }
}

/// The cell of heat map slot `slot`.
fn cell<'a>(browser: &'a Browser, slot: u64) -> Element<'a> {
    browser.find(&format!("#heatmap rect.cell[data-slot='{slot}']"))
}

/// The page of a profile of two bursts: both at their times in the heat
/// map, in the counts their CPU time makes; a drag over the first's
/// cells draws a graph of the first function alone; search, zoom, reset,
/// the icicle toggle and the table work on what is drawn; nothing is
/// fetched; and `rtrace report --html` of the run's pprof draws the same
/// heat map.
#[test]
fn the_page_shows_the_bursts_and_a_drag_selects_one() {
    if !browser_available() {
        eprintln!("skipped: no chromium and chromedriver here (the VM guests have no browser)");
        return;
    }
    let dir = dir("bursts");
    let r = record(&dir, "bursts", 700, 500, 700);
    let browser = Browser::start();
    open(&browser, &r.page);
    browser.screenshot(&dir.join("bursts.png"));
    eprintln!("page and screenshot in {}", dir.display());

    // The heat map: each cell where its slot says, both bursts' samples
    // in their slots, and little else.
    let heat = cells(&browser);
    for &(slot, second, row, _) in &heat {
        assert_eq!((slot - 1) / 50, second, "slot {slot}'s column");
        assert_eq!((slot - 1) % 50, row, "slot {slot}'s row");
    }
    let total: u64 = heat.iter().map(|c| c.3).sum();
    let mut in_bursts = 0;
    for b in &r.bursts {
        let (first, last) = (slot_of(r.zero, b.start), slot_of(r.zero, b.end));
        let n: u64 = heat
            .iter()
            .filter(|c| (first..=last).contains(&c.0))
            .map(|c| c.3)
            .sum();
        let (want, bound) = expected(b);
        assert!(
            (n as f64 - want).abs() <= bound,
            "{}: {n} samples in slots {first}..={last}, expected {want:.0} ± {bound:.0}",
            b.name
        );
        in_bursts += n;
    }
    assert!(
        (total - in_bursts) as f64 <= 0.05 * total as f64 + 3.0,
        "{} of {total} samples outside the bursts",
        total - in_bursts
    );

    // A drag over the first burst's cells, a slot in from each end.
    let b = &r.bursts[0];
    let (first, last) = (slot_of(r.zero, b.start) + 1, slot_of(r.zero, b.end) - 1);
    browser.drag(&cell(&browser, first), &cell(&browser, last));
    let range = browser.find("#range");
    assert_eq!(range.attr("data-first-slot"), Some(first.to_string()));
    assert_eq!(range.attr("data-last-slot"), Some(last.to_string()));
    let selected = browser
        .execute(
            "return document.querySelectorAll('#heatmap rect.cell.selected').length;",
            Vec::new(),
        )
        .as_u64()
        .unwrap();
    assert_eq!(selected, last - first + 1);
    let g = drawn(&browser);
    let in_range: u64 = heat
        .iter()
        .filter(|c| (first..=last).contains(&c.0))
        .map(|c| c.3)
        .sum();
    assert_eq!(
        g.root as u64, in_range,
        "the graph counts the range's samples"
    );
    let (a, s) = (g.share("burn_first"), g.share("burn_second"));
    assert!(
        a >= 0.9 && s <= 0.1,
        "burn_first {a:.3}, burn_second {s:.3}"
    );
    assert!(
        (g.width_share("burn_first") - a).abs() < 0.01,
        "burn_first is drawn {:.3} wide for a share of {a:.3}",
        g.width_share("burn_first")
    );

    // Back to the whole run: search marks the second function's frames
    // and reports their share of the samples.
    browser.find("#clear-range").click();
    assert_eq!(browser.find("#range").attr("data-first-slot"), None);
    let whole = drawn(&browser);
    assert_eq!(whole.root as u64, total_of_page(&browser));
    browser.find("#search").send_keys("burn_second");
    let marked = browser.execute(
        "return Array.from(document.querySelectorAll('#flamegraph g.frame.match'),
                           g => g.dataset.name);",
        Vec::new(),
    );
    let marked: Vec<&str> = marked
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(
        !marked.is_empty() && marked.iter().all(|n| *n == "burn_second"),
        "{marked:?}"
    );
    let share_shown: f64 = browser
        .find("#match-share")
        .attr("data-share")
        .and_then(|v| v.parse().ok())
        .expect("the search reports its share");
    let drawn_share = whole.share("burn_second");
    assert!(
        (share_shown - drawn_share).abs() < 1e-6,
        "search reports {share_shown}, the graph has {drawn_share}"
    );
    let (want, bound) = expected(&r.bursts[1]);
    let root = whole.root;
    assert!(
        (share_shown * root - want).abs() <= bound,
        "search found {:.0} samples of burn_second, its CPU time makes {want:.0} ± {bound:.0}",
        share_shown * root
    );

    // Zoom on the first function: it spans the graph; reset undoes it.
    browser
        .find("#flamegraph g.frame[data-name='burn_first']")
        .click();
    let zoomed = drawn(&browser);
    let first_frame = zoomed
        .frames
        .iter()
        .find(|f| f.0 == "burn_first")
        .expect("burn_first drawn");
    assert!(
        (first_frame.3 - zoomed.width).abs() <= 1.0 && first_frame.4.abs() <= 1.0,
        "zoomed, burn_first is {} wide at {} of {}",
        first_frame.3,
        first_frame.4,
        zoomed.width
    );
    assert!(!zoomed.frames.iter().any(|f| f.0 == "burn_second"));
    let zoom = browser
        .find("#flamegraph")
        .attr("data-zoom")
        .unwrap_or_default();
    assert!(zoom.ends_with("burn_first"), "{zoom}");
    browser.find("#reset").click();
    let reset = drawn(&browser);
    assert_eq!(reset.root, whole.root);
    assert!(reset.frames.iter().any(|f| f.0 == "burn_second"));
    assert_eq!(browser.find("#flamegraph").attr("data-zoom"), None);

    // Flame and icicle: the root is at the bottom of one, the top of the
    // other.
    let root_y = |b: &Browser| {
        b.execute(
            "const g = document.querySelector('#flamegraph g.frame[data-depth=\"0\"] rect');
             const leaf = document.querySelector('#flamegraph g.frame[data-name=\"burn_first\"] rect');
             return [g.y.baseVal.value, leaf.y.baseVal.value];",
            Vec::new(),
        )
    };
    let before = browser.find("#flamegraph").attr("data-direction").unwrap();
    let y0 = root_y(&browser);
    browser.find("#direction").click();
    let after = browser.find("#flamegraph").attr("data-direction").unwrap();
    let y1 = root_y(&browser);
    assert_ne!(before, after);
    let root_above = |y: &Value| y[0].as_f64().unwrap() < y[1].as_f64().unwrap();
    assert_eq!(root_above(&y0), before == "icicle", "{before}: {y0}");
    assert_eq!(root_above(&y1), after == "icicle", "{after}: {y1}");

    // The table: the first function's row holds its share with children;
    // a click on it marks its frames in the graph.
    let row = browser.find("#report tr[data-name='burn_first']");
    let text = row.text();
    let children: f64 = text
        .split_whitespace()
        .find_map(|w| w.strip_suffix('%')?.parse().ok())
        .unwrap_or_else(|| panic!("no percentage in {text:?}"));
    let share_first = whole.share("burn_first") * 100.0;
    assert!(
        (children - share_first).abs() < 0.1,
        "the table says {children}%, the graph {share_first:.2}%"
    );
    row.click();
    let highlighted = browser.execute(
        "return Array.from(document.querySelectorAll('#flamegraph g.frame.highlight'),
                           g => g.dataset.name);",
        Vec::new(),
    );
    let highlighted = highlighted.as_array().unwrap();
    assert!(
        !highlighted.is_empty() && highlighted.iter().all(|n| n == "burn_first"),
        "{highlighted:?}"
    );

    // Nothing but the page itself was loaded.
    let fetched = browser.network_requests();
    assert!(
        fetched
            .iter()
            .all(|u| u.ends_with("bursts.html") || u.starts_with("data:")),
        "{fetched:?}"
    );

    // The report of the run's pprof draws the same heat map from the
    // samples' time labels.
    let again = dir.join("report.html");
    let (code, _, stderr) = run(&[
        "report",
        "--html",
        again.to_str().unwrap(),
        r.pprof.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{stderr}");
    open(&browser, &again);
    let mut from_report = cells(&browser);
    let mut from_profile = heat;
    from_report.sort_unstable();
    from_profile.sort_unstable();
    assert_eq!(from_report, from_profile);
}

/// The whole run's samples, as the page's data holds them.
fn total_of_page(browser: &Browser) -> u64 {
    browser
        .execute(
            "const d = JSON.parse(document.getElementById('rtrace-data').textContent);
             return d.profiles[0].count.reduce((a, b) => a + b, 0);",
            Vec::new(),
        )
        .as_u64()
        .unwrap()
}

/// The differential page of two runs, the first mostly in `burn_first`,
/// the second mostly in `burn_second`: the second function's frames are
/// red (grown), the first's blue (shrunk), each with both runs' counts,
/// and there is no heat map.
#[test]
fn the_differential_page_colours_what_grew_and_shrank() {
    if !browser_available() {
        eprintln!("skipped: no chromium and chromedriver here (the VM guests have no browser)");
        return;
    }
    let dir = dir("diff");
    let before = record(&dir, "before", 600, 100, 200);
    let after = record(&dir, "after", 200, 100, 600);
    let page = dir.join("diff.html");
    let (code, stdout, stderr) = run(&[
        "report",
        "--html",
        page.to_str().unwrap(),
        before.pprof.to_str().unwrap(),
        after.pprof.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.trim().is_empty(), "only the page: {stdout}");
    let browser = Browser::start();
    open(&browser, &page);
    browser.screenshot(&dir.join("diff.png"));
    browser.find("#heatmap-none");
    let frame = |name: &str| {
        browser.execute(
            "const g = document.querySelector(`#flamegraph g.frame[data-name='${arguments[0]}']`);
             const fill = getComputedStyle(g.querySelector('rect')).fill;
             return [Number(g.dataset.before), Number(g.dataset.after),
                     fill.match(/\\d+/g).map(Number)];",
            vec![Value::from(name)],
        )
    };
    let counts = |v: &Value| (v[0].as_f64().unwrap(), v[1].as_f64().unwrap());
    let rgb = |v: &Value| -> Vec<f64> {
        v[2].as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_f64().unwrap())
            .collect()
    };
    let grew = frame("burn_second");
    let shrank = frame("burn_first");
    // Each run's counts against what its bursts' CPU time makes.
    for (v, i) in [(&grew, 1), (&shrank, 0)] {
        let (b, a) = counts(v);
        for (n, run) in [(b, &before), (a, &after)] {
            let (want, bound) = expected(&run.bursts[i]);
            assert!(
                (n - want).abs() <= bound,
                "{}: {n} samples, expected {want:.0} ± {bound:.0}",
                run.bursts[i].name
            );
        }
    }
    let (g, s) = (rgb(&grew), rgb(&shrank));
    assert!(g[0] > g[2] + 30.0, "burn_second grew but is {g:?}");
    assert!(s[2] > s[0] + 30.0, "burn_first shrank but is {s:?}");
}

/// The totals the page's data holds and its heat map's cells sum to,
/// and the count drawn under frames named `name`, from the page open.
fn page_counts(browser: &Browser, name: &str) -> (u64, u64, f64) {
    let total = total_of_page(browser);
    let cells: u64 = cells(browser).iter().map(|c| c.3).sum();
    let g = drawn(browser);
    (total, cells, g.share(name) * g.root)
}

/// memleak's page: the bytes a command kept and never freed, under the
/// function that kept them, in the heat map's cells by when they were
/// allocated; the blocks it freed are nowhere.
#[test]
fn memleaks_page_holds_the_bytes_kept_by_when_and_where() {
    if !browser_available() {
        eprintln!("skipped: no chromium and chromedriver here (the VM guests have no browser)");
        return;
    }
    let dir = dir("memleak");
    let page = dir.join("memleak.html");
    let fixture = workload_bin("memfix_nofp");
    let (code, stdout, stderr) = run(&[
        "memleak",
        "--html",
        page.to_str().unwrap(),
        "--",
        fixture.to_str().unwrap(),
        "run",
        "100",
        "4096",
        "1000",
    ]);
    assert_eq!(code, 0, "{stderr}");
    let kept: u64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("done ")?.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no done line: {stdout}"));
    let browser = Browser::start();
    open(&browser, &page);
    browser.screenshot(&dir.join("memleak.png"));
    let (total, cells, keep) = page_counts(&browser, "keep_blocks");
    assert_eq!(keep as u64, kept, "keep_blocks' bytes");
    assert_eq!(cells, total, "the heat map holds every byte held");
    assert!(total >= kept, "{total} held in all, {kept} by keep_blocks");
    assert!(
        drawn(&browser).share("churn") == 0.0,
        "churn freed all it took"
    );
}

/// offcputime's page: the half second the fixture slept between its
/// bursts, in microseconds, in the slot its sleep ended in.
#[test]
fn offcputimes_page_holds_a_sleep_where_it_ended() {
    if !browser_available() {
        eprintln!("skipped: no chromium and chromedriver here (the VM guests have no browser)");
        return;
    }
    let dir = dir("offcputime");
    let page = dir.join("offcputime.html");
    let fixture = workload_bin("bursts_nofp");
    let (code, stdout, stderr) = run(&[
        "offcputime",
        "-v",
        "--html",
        page.to_str().unwrap(),
        "--",
        fixture.to_str().unwrap(),
        "100",
        "500",
        "100",
    ]);
    assert_eq!(code, 0, "{stderr}");
    let bursts = bursts_of(&stdout);
    // The sleep: from the first burst's end to the second's start.
    let slept_us = (bursts[1].start - bursts[0].end) as f64 / 1000.0;
    let browser = Browser::start();
    open(&browser, &page);
    let (total, cells, sleep) = page_counts(&browser, "usleep");
    assert_eq!(cells, total);
    // The sleep asked for, and the time it took to be woken and run.
    assert!(
        sleep >= 500_000.0 && sleep <= slept_us + 1000.0,
        "usleep: {sleep} us off the CPU, the fixture slept {slept_us} us"
    );
    let woke = slot_of(time_zero(&stderr), bursts[1].start);
    let at_wake: u64 = self::cells(&browser)
        .iter()
        .filter(|c| c.0 + 1 >= woke && c.0 <= woke)
        .map(|c| c.3)
        .sum();
    assert!(
        at_wake as f64 >= sleep,
        "{at_wake} us in slots {}..={woke}, where the {sleep} us sleep ended",
        woke - 1
    );
}

//! `rtrace profile --heatmap`: the busy cells where a bursty fixture was
//! busy, the same map again from the run's pprof, and `--range` over one
//! burst; and the SVG as a browser draws it: a real headless Chromium
//! lays out the SVG with whatever fonts the machine has, which the unit
//! tests' estimate of text widths cannot see.

use std::{
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use rtrace_integration_tests::{
    Rtrace, SIGINT,
    browser::{Browser, browser_available},
    parse_folded,
    profile::{READY, count_with, parse_svg, run_fixture, start_fixture, temp},
    run,
};
use serde_json::Value;

/// Where the heat map and its screenshot are kept after the run, for a
/// reader to look at: the same place each run, so runs do not pile up.
fn out_dir() -> PathBuf {
    let dir = std::env::temp_dir().join("rtrace-heatmap-browser");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The open SVG as Chromium laid it out: its viewBox, size, every text's
/// box (in user units, as `getBBox` gives it) and the cells' samples.
fn layout(browser: &Browser) -> Value {
    browser.execute(
        r#"
        const svg = document.documentElement;
        const vb = svg.viewBox.baseVal;
        return {
            viewBox: vb ? [vb.x, vb.y, vb.width, vb.height] : null,
            width: svg.width.baseVal.value,
            height: svg.height.baseVal.value,
            texts: Array.from(svg.querySelectorAll('text'), t => {
                const b = t.getBBox();
                return { text: t.textContent, x: b.x, y: b.y, w: b.width, h: b.height };
            }),
            samples: Array.from(svg.querySelectorAll('[data-samples]'))
                .reduce((sum, cell) => sum + Number(cell.getAttribute('data-samples')), 0),
        };
        "#,
        Vec::new(),
    )
}

fn num(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// The texts of [`layout`] whose boxes reach beyond the picture, each
/// with where it lies.
fn texts_outside(page: &Value) -> Vec<String> {
    let (width, height) = (num(&page["width"]), num(&page["height"]));
    // The boxes are in the viewBox's units, drawn at the picture's size:
    // the two must agree for a unit to be a pixel of the picture.
    let (left, top, right, bottom) = match page["viewBox"].as_array() {
        Some(vb) if num(&vb[2]) > 0.0 => {
            let (x, y, w, h) = (num(&vb[0]), num(&vb[1]), num(&vb[2]), num(&vb[3]));
            assert_eq!((w, h), (width, height), "viewBox scaled: {page}");
            (x, y, x + w, y + h)
        }
        _ => (0.0, 0.0, width, height),
    };
    page["texts"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| {
            let (x, y, w, h) = (num(&t["x"]), num(&t["y"]), num(&t["w"]), num(&t["h"]));
            (x < left || y < top || x + w > right || y + h > bottom).then(|| {
                format!(
                    "{:?} at x {x:.1}..{:.1}, y {y:.1}..{:.1} of {width}x{height}",
                    t["text"].as_str().unwrap_or_default(),
                    x + w,
                    y + h,
                )
            })
        })
        .collect()
}

/// A 2 s run's heat map is two columns wide, narrower than its title: the
/// picture must be widened to hold the title and legend, and nothing
/// drawn may fall outside it, by the boxes Chromium gives each text.
#[test]
fn a_short_runs_heat_map_holds_all_its_text() {
    if !browser_available() {
        eprintln!(
            "skipped: chromium and chromedriver are not on PATH (the VM guests carry no browser)"
        );
        return;
    }
    let svg = out_dir().join("heat.svg");
    let _ = std::fs::remove_file(&svg);

    // This process burns a CPU while rtrace samples it, so that the map
    // has samples in its cells.
    let stop = Arc::new(AtomicBool::new(false));
    let spinner = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n = std::hint::black_box(n.wrapping_add(1));
            }
        })
    };
    let pid = std::process::id().to_string();
    let rtrace = Rtrace::start_until(
        &[
            "profile",
            "--heatmap",
            svg.to_str().unwrap(),
            "-p",
            &pid,
            "2",
        ],
        READY,
    );
    let (code, _, stderr) = rtrace.wait();
    stop.store(true, Ordering::Relaxed);
    spinner.join().unwrap();
    assert_eq!(code, 0, "{stderr}");
    assert!(svg.exists(), "no heat map written: {stderr}");

    let browser = Browser::start();
    browser.goto(&svg);
    // Text is measured in the face it is drawn in, once loaded.
    browser.execute_async(
        "const done = arguments[arguments.length - 1]; document.fonts.ready.then(() => done(true));",
        Vec::new(),
    );
    let png = svg.with_extension("png");
    browser.screenshot(&png);
    eprintln!("heat map: {}; screenshot: {}", svg.display(), png.display());

    let page = layout(&browser);
    assert!(page["texts"].as_array().unwrap().len() >= 4, "{page}");
    let outside = texts_outside(&page);
    assert!(
        outside.is_empty(),
        "text beyond the picture (see {}): {}",
        png.display(),
        outside.join("; ")
    );
    // The seconds axis, as the browser shows it.
    let labels: Vec<String> = browser.find_all("text").iter().map(|t| t.text()).collect();
    for second in ["0", "1"] {
        assert!(
            labels.iter().any(|l| l == second),
            "no label for second {second}: {labels:?}"
        );
    }
    assert!(
        num(&page["samples"]) > 0.0,
        "no samples in the cells: {page}"
    );
    // The picture is self-contained: the browser fetched it and nothing else.
    let requests = browser.network_requests();
    assert!(
        !requests.is_empty() && requests.iter().all(|u| u.ends_with("/heat.svg")),
        "{requests:?}"
    );

    // The check sees a title cut off: the same picture as wide as its
    // grid alone, as short runs' maps once were, has its title and legend
    // spill over both sides.
    let width = num(&page["width"]) as u64;
    let height = num(&page["height"]) as u64;
    let narrow = std::fs::read_to_string(&svg)
        .unwrap()
        .replacen(&format!("width=\"{width}\""), "width=\"120\"", 1)
        .replacen(
            &format!("viewBox=\"0 0 {width} {height}\""),
            &format!("viewBox=\"0 0 120 {height}\""),
            1,
        );
    let narrow_svg = out_dir().join("heat-narrow.svg");
    std::fs::write(&narrow_svg, narrow).unwrap();
    browser.goto(&narrow_svg);
    let outside = texts_outside(&layout(&browser));
    assert!(
        outside.iter().any(|t| t.starts_with("\"rtrace profile: ")),
        "the narrowed map's title not seen cut off: {outside:?}"
    );
    let _ = std::fs::remove_file(&narrow_svg);
}

/// `--heatmap` and `--range` on a fixture busy for the first 300 ms of
/// each second (leaf_alpha in even seconds, leaf_beta in odd ones): the
/// heat map's busy cells are where the fixture was busy, by the clock both
/// share; a range over one burst profiles that burst alone.
#[test]
fn heat_map_shows_bursts_where_they_were_and_a_range_profiles_one() {
    let fixture = start_fixture("cfuncs_nofp", &["bursts", "4"]);
    let pid = fixture.pid().to_string();
    let svg = temp("heat.svg");
    let pprof = temp("heat.pb.gz");
    let heat = Rtrace::start_until(
        &[
            "profile",
            "-F",
            "499",
            "-p",
            &pid,
            "-U",
            "--heatmap",
            svg.to_str().unwrap(),
            "--pprof",
            pprof.to_str().unwrap(),
        ],
        READY,
    );
    let ranged = Rtrace::start_until(
        &[
            "profile", "-v", "-F", "499", "-p", &pid, "-U", "-f", "--range", "1.2-1.85",
        ],
        READY,
    );
    let done = run_fixture(fixture);
    let (t0, burst_cpu_ns) = (done[0] as u64, done[1] as f64);
    let (code, _, stderr) = heat.stop(SIGINT);
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("rtrace: wrote "), "{stderr}");
    let busy = |ns: u64, len: u64| -> (u64, u64) {
        // The overlap of [ns, ns + len) with the fixture's bursts, in ns,
        // and the burst's second if it overlaps one.
        let mut overlap = 0;
        let mut second = u64::MAX;
        for k in 0..4 {
            let (a, b) = (t0 + k * 1_000_000_000, t0 + k * 1_000_000_000 + 300_000_000);
            let o = b.min(ns + len).saturating_sub(a.max(ns));
            if o > 0 {
                overlap += o;
                second = k;
            }
        }
        (overlap, second)
    };

    let text = std::fs::read_to_string(&svg).unwrap();
    let doc = parse_svg(&text).expect("heat map SVG is not well-formed");
    let root = doc.root_element();
    let attr = |n: roxmltree::Node, a: &str| n.attribute(a).unwrap().parse::<u64>().unwrap();
    let (start, slot) = (attr(root, "data-start-ns"), attr(root, "data-slot-ns"));
    let (mut inside, mut outside, mut busy_cells, mut lit_busy_cells) = (0, 0, 0, 0);
    let mut cells = Vec::new();
    for cell in doc
        .descendants()
        .filter(|n| n.has_attribute("data-samples"))
    {
        let index = attr(cell, "data-second") * (1_000_000_000 / slot) + attr(cell, "data-row");
        let from = start + index * slot;
        let n = attr(cell, "data-samples");
        cells.push((from, n));
        let (overlap, _) = busy(from, slot);
        if overlap > 0 {
            inside += n;
        } else {
            outside += n;
        }
        if overlap == slot {
            busy_cells += 1;
            lit_busy_cells += u64::from(n > 0);
        }
    }
    // 4 bursts of 300 ms at 499 Hz: about 600 samples where the fixture
    // had its CPU (fewer on a loaded machine: as many as the CPU time it
    // measured gives, whose binomial spread is some 25), all in cells
    // the bursts overlap, and nearly every cell wholly inside a burst lit.
    let due = burst_cpu_ns * 499.0 / 1e9;
    eprintln!(
        "heat map: {inside} samples in busy cells, {outside} outside ({due:.0} due); {lit_busy_cells} of {busy_cells} busy cells lit"
    );
    assert!(
        inside as f64 > 0.8 * due && due > 100.0,
        "{inside} samples in busy cells, {due:.0} due"
    );
    assert!(
        outside * 50 < inside,
        "{outside} samples outside the bursts, {inside} in"
    );
    assert!(busy_cells >= 48, "{busy_cells}");
    assert!(
        lit_busy_cells * 10 >= busy_cells * 9,
        "{lit_busy_cells} of {busy_cells}"
    );
    // The same heat map later, from the run's pprof, which keeps the
    // samples' times.
    let later = temp("heat-later.svg");
    let (code, _, stderr) = run(&[
        "report",
        pprof.to_str().unwrap(),
        "--heatmap",
        later.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{stderr}");
    let cells_of = |text: &str| -> Vec<(String, String, String)> {
        let doc = parse_svg(text).unwrap();
        let mut v: Vec<_> = doc
            .descendants()
            .filter(|n| n.has_attribute("data-samples"))
            .map(|n| {
                let a = |k: &str| n.attribute(k).unwrap().to_owned();
                (a("data-second"), a("data-row"), a("data-samples"))
            })
            .collect();
        v.sort();
        v
    };
    let later_text = std::fs::read_to_string(&later).unwrap();
    assert_eq!(cells_of(&text), cells_of(&later_text));
    let later_doc = parse_svg(&later_text).unwrap();
    assert_eq!(
        later_doc.root_element().attribute("data-start-ns"),
        root.attribute("data-start-ns")
    );
    let _ = std::fs::remove_file(&later);
    let _ = std::fs::remove_file(&pprof);

    // The range's run: its own time zero, from -v (before the banner).
    let zero: u64 = ranged
        .stderr_lines
        .iter()
        .find_map(|l| l.split("CLOCK_MONOTONIC ").nth(1))
        .and_then(|v| v.trim_end_matches(" ns").parse().ok())
        .expect("time zero under -v");
    let (code, stdout, stderr) = ranged.stop(SIGINT);
    assert_eq!(code, 0, "{stderr}");
    let folded = parse_folded(&stdout);
    let (from, len) = (zero + 1_200_000_000, 650_000_000);
    let (overlap, second) = busy(from, len);
    let alpha = count_with(&folded, "leaf_alpha");
    let beta = count_with(&folded, "leaf_beta");
    // At most one burst falls in 650 ms; the range counts it alone. It
    // can count no more than the burst's wall time gives at 499 Hz, and
    // as many as the heat map, sampling the same process alongside, has
    // in cells over the range (pro rata at its edges): the same figure
    // even when the fixture gets less CPU than wall time, as in a loaded
    // emulated guest.
    let due = overlap as f64 * 499.0 / 1e9;
    let expected: f64 = cells
        .iter()
        .map(|&(at, n)| {
            let o = (at + slot).min(from + len).saturating_sub(at.max(from));
            n as f64 * o as f64 / slot as f64
        })
        .sum();
    let (hit, missed) = if second % 2 == 0 {
        (alpha, beta)
    } else {
        (beta, alpha)
    };
    eprintln!(
        "range: {hit} samples of the burst in second {second}, {expected:.0} in the heat map, {due:.0} due, {missed} of others"
    );
    assert_eq!(missed, 0, "the other burst's leaf in the range: {stdout}");
    assert!(
        hit as f64 <= 1.2 * due + 5.0,
        "{hit} samples in the range where {due:.0} were due: {stdout}"
    );
    let all: u64 = folded.values().sum();
    assert!(
        (all as f64 - expected).abs() <= 0.2 * expected + 5.0,
        "{all} samples in the range where the heat map has {expected:.0} ({due:.0} due): {stdout}"
    );
    assert!(
        all - hit <= all / 5 + 3,
        "{hit} of {all} in the burst's leaf: {stdout}"
    );
}

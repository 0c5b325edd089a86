//! `rtrace profile --heatmap` as a browser draws it: a real headless
//! Chromium lays out the SVG with whatever fonts the machine has, which
//! the unit tests' estimate of text widths cannot see.

use std::{
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use rtrace_integration_tests::{
    Rtrace,
    browser::{Browser, browser_available},
};
use serde_json::Value;

/// What `rtrace profile` prints to stderr once sampling has begun.
const READY: &str = "Sampling";

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

//! Sub-second heat maps, as FlameScope draws them: a column per second, a
//! row per 20 ms slot of it, each cell coloured by the samples in it. Bursts
//! that a whole-run flame graph averages away stand out; a range of cells
//! is then worth a flame graph of its own (`profile --range`).

use std::fmt::Write as _;

use super::html::escape;

/// Cell size in pixels.
const CELL_W: u64 = 14;
const CELL_H: u64 = 9;
/// Room for the axes' labels.
const LEFT: u64 = 60;
const TOP: u64 = 50;
/// Font sizes of the title and of the rest, in pixels.
const TITLE_PX: u64 = 15;
const LEGEND_PX: u64 = 11;
/// Room kept each side of the title and legend.
const MARGIN: u64 = 10;

/// The width `text` takes at `px` pixels in Verdana, the widest of the
/// usual sans-serif faces (about 0.62 of its size a character; a little
/// more is allowed), so that it fits whichever face the viewer has.
fn text_width(text: &str, px: u64) -> u64 {
    (text.chars().count() as u64 * px * 2).div_ceil(3)
}

/// Writes the heat map of `counts` (samples per slot of `slot_ns`, from
/// `start_ns` on `CLOCK_MONOTONIC`) as SVG to `out`. Each cell carries its
/// second, row and count as attributes, and a tooltip.
pub fn write_svg(
    counts: &[u64],
    slot_ns: u64,
    start_ns: u64,
    title: &str,
    out: &mut dyn std::io::Write,
) -> std::io::Result<()> {
    let rows = (1_000_000_000 / slot_ns).max(1);
    let columns = (counts.len() as u64).div_ceil(rows).max(1);
    let max = counts.iter().copied().max().unwrap_or(0).max(1);
    let legend = format!(
        "a column per second, a row per {} ms; darker is more samples (at most {max})",
        slot_ns / 1_000_000
    );
    // As wide as the grid, or as the title and legend where a short run's
    // grid is narrower than they are: centred on a narrower picture, both
    // their ends would fall outside it.
    let width = (LEFT + columns * CELL_W + 20)
        .max(text_width(title, TITLE_PX) + 2 * MARGIN)
        .max(text_width(&legend, LEGEND_PX) + 2 * MARGIN);
    let height = TOP + rows * CELL_H + 40;
    let mut svg = String::with_capacity(counts.len() * 120 + 1024);
    let _ = writeln!(
        svg,
        r##"<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" data-start-ns="{start_ns}" data-slot-ns="{slot_ns}" font-family="Verdana, sans-serif" font-size="{LEGEND_PX}">
<rect width="100%" height="100%" fill="#ffffff"/>
<text x="{}" y="20" text-anchor="middle" font-size="{TITLE_PX}">{}</text>
<text x="{}" y="38" text-anchor="middle" fill="#555555">{}</text>"##,
        width / 2,
        escape(title),
        width / 2,
        escape(&legend),
    );
    for (i, &n) in counts.iter().enumerate() {
        let i = i as u64;
        let (second, row) = (i / rows, i % rows);
        let x = LEFT + second * CELL_W;
        let y = TOP + row * CELL_H;
        let ms = row * slot_ns / 1_000_000;
        let _ = writeln!(
            svg,
            r#"<rect x="{x}" y="{y}" width="{}" height="{}" fill="{}" data-second="{second}" data-row="{row}" data-samples="{n}"><title>{second}.{ms:03} s: {n} samples</title></rect>"#,
            CELL_W - 1,
            CELL_H - 1,
            color(n, max),
        );
    }
    // Axes: seconds along the top, milliseconds down the left.
    // Every second, or every n-th on long runs: some 20 labels at most.
    for second in (0..columns).step_by(columns.div_ceil(20).max(1) as usize) {
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{}" text-anchor="middle">{second}</text>"#,
            LEFT + second * CELL_W + CELL_W / 2,
            TOP - 4
        );
    }
    for row in (0..rows).step_by(10) {
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{}" text-anchor="end">{} ms</text>"#,
            LEFT - 4,
            TOP + row * CELL_H + CELL_H,
            row * slot_ns / 1_000_000
        );
    }
    svg.push_str("</svg>\n");
    out.write_all(svg.as_bytes())
}

/// The counts of time-keyed samples by heat map slot ([`Sample::slot`],
/// 1-based), for a heat map of what a tool counted by stack: the
/// samples' own slots, not the kernel's per-slot totals of profile's.
pub fn by_slot(samples: &[crate::stacks::sample::Sample]) -> Vec<u64> {
    let mut counts = Vec::new();
    for s in samples.iter().filter(|s| s.slot > 0) {
        let i = s.slot as usize - 1;
        if counts.len() <= i {
            counts.resize(i + 1, 0);
        }
        counts[i] += s.count;
    }
    counts
}

/// White for nothing, then from pale to deep red as `n` nears `max`.
fn color(n: u64, max: u64) -> String {
    if n == 0 {
        return "#f5f5f5".to_owned();
    }
    let f = n as f64 / max as f64;
    let g = (230.0 * (1.0 - f)) as u8;
    format!("#{:02x}{:02x}{:02x}", 255 - (55.0 * f) as u8, g, g / 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_carry_their_time_and_count() {
        let mut counts = vec![0u64; 120];
        counts[3] = 7;
        counts[51] = 2;
        let mut out = Vec::new();
        write_svg(&counts, 20_000_000, 42, "t", &mut out).unwrap();
        let svg = String::from_utf8(out).unwrap();
        assert!(svg.contains(r#"data-start-ns="42""#));
        assert!(svg.contains(
            r#"data-second="0" data-row="3" data-samples="7"><title>0.060 s: 7 samples"#
        ));
        assert!(svg.contains(r#"data-second="1" data-row="1" data-samples="2""#));
        assert_eq!(svg.matches("<rect x=").count(), 120);
    }

    /// A short run's picture is as wide as its title and legend, and its
    /// seconds are all labelled.
    #[test]
    fn a_short_runs_title_and_seconds_fit() {
        let title = "rtrace profile: samples over time of a two-second run, system-wide";
        let mut out = Vec::new();
        write_svg(&vec![1u64; 200], 20_000_000, 0, title, &mut out).unwrap();
        let svg = String::from_utf8(out).unwrap();
        let width: u64 = svg
            .split("width=\"")
            .nth(1)
            .and_then(|w| w.split('"').next()?.parse().ok())
            .unwrap();
        // Each centred text's half width, at 0.62 em a character.
        for (text, px) in [
            (title, 15.0),
            (
                "a column per second, a row per 20 ms; darker is more samples (at most 1)",
                11.0,
            ),
        ] {
            let half = text.chars().count() as f64 * px * 0.62 / 2.0;
            assert!(
                width as f64 / 2.0 - half >= 0.0,
                "{text:?} is wider than {width}"
            );
        }
        for second in ["0", "1"] {
            assert!(
                svg.contains(&format!("text-anchor=\"middle\">{second}</text>")),
                "{second}"
            );
        }
    }
}

//! `pageload TRIALS FILE...`: opens each file in headless Chromium,
//! interleaved, TRIALS times, and prints one line a load: `FILE MS`, the
//! milliseconds from the start of navigation to the end of the load
//! event (for rtrace's page, to its drawing, if that came later). For
//! `cargo xtask bench html`, which compares the page with the SVG flame
//! graph of the same profile in the same browser.

use std::{path::PathBuf, time::Duration};

use rtrace_integration_tests::browser::Browser;

fn main() {
    let mut args = std::env::args().skip(1);
    let trials: usize = match args.next().and_then(|t| t.parse().ok()) {
        Some(t) => t,
        None => {
            eprintln!("usage: pageload TRIALS FILE...");
            std::process::exit(2);
        }
    };
    let files: Vec<PathBuf> = args.map(PathBuf::from).collect();
    let browser = Browser::start();
    for _ in 0..trials {
        for file in &files {
            browser.goto(file);
            // The page sets its flag when it has drawn; a plain document
            // is done at its load event.
            let ms = browser.wait_for(
                "(() => {
                 const nav = performance.getEntriesByType('navigation')[0];
                 if (!nav || nav.loadEventEnd === 0) return null;
                 if (document.body && document.body.dataset && 'ready' in document.body.dataset) {
                     if (document.body.dataset.ready !== '1') return null;
                     return Math.max(nav.loadEventEnd, window.rtraceLoadMs || 0);
                 }
                 return nav.loadEventEnd;
                 })()",
                Duration::from_secs(60),
            );
            println!("{} {}", file.display(), ms.as_f64().unwrap_or(f64::NAN));
        }
    }
}

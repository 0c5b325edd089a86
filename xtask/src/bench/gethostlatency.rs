//! gethostlatency against libbpf-tools' on a run of getaddrinfo calls.

use std::process::Command;

use super::{Ready, Row, Setup, TRIALS, helpers::timed, print_costs, report_events, trials};

/// getaddrinfo calls per trial of the gethostlatency benchmark.
const LOOKUPS: u64 = 2_000;

/// gethostlatency against libbpf-tools' on getaddrinfo of `localhost`
/// (from `/etc/hosts`): a uprobe and a uretprobe per lookup.
pub fn run() -> anyhow::Result<Row> {
    let rtrace = crate::build()?;
    let workload = crate::root().join("target/release/lookups");
    let needle = "localhost";
    let setups = vec![
        Setup::bare(),
        Setup::libbpf_tools("gethostlatency", Ready::Stdout("TIME"), Some(needle))?,
        Setup::traced(
            "rtrace gethostlatency",
            &rtrace,
            &["gethostlatency"],
            Ready::Stderr("Tracing"),
            Some(needle),
        ),
    ];
    eprintln!(
        "bench gethostlatency: {LOOKUPS} getaddrinfo calls for localhost, one after another, \
         median of {TRIALS} interleaved trials"
    );
    let results = trials(&setups, "ns/lookup", || {
        let ns = timed(Command::new(&workload).args([needle, &LOOKUPS.to_string()]))?;
        Ok((ns / LOOKUPS as f64, LOOKUPS))
    })?;
    let (ratio, bpf_ratio) = print_costs(&setups, &results, "ns/lookup");
    report_events(&setups, &results, LOOKUPS, "lookups of localhost seen");
    println!();
    println!(
        "rtrace adds {ratio:.2}x what libbpf-tools adds per lookup (BPF time {bpf_ratio:.2}x)"
    );
    Ok(Row::new(
        "gethostlatency",
        format!("{LOOKUPS} getaddrinfo calls"),
        "ns/lookup",
        (&setups, &results),
        (2, 1),
        Some(LOOKUPS),
    ))
}

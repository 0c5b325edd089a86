//! biolatency against libbpf-tools' on direct I/O to a loop device.

use super::{
    Ready, Row, Setup, TRIALS,
    helpers::{IO_READS, IO_WRITES, Loop, direct_io},
    print_costs, trials,
};

pub fn run() -> anyhow::Result<Row> {
    let rtrace = crate::build()?;
    let workload = crate::root().join("target/release/directio");
    let dev = Loop::new()?;
    let setups = vec![
        Setup::bare(),
        Setup::libbpf_tools("biolatency", Ready::Stdout("Tracing"), None)?,
        Setup::traced(
            "rtrace biolatency",
            &rtrace,
            &["biolatency"],
            Ready::Stderr("Tracing"),
            None,
        ),
        Setup::traced(
            "rtrace biolatency -Q -F -D",
            &rtrace,
            &["biolatency", "-Q", "-F", "-D"],
            Ready::Stderr("Tracing"),
            None,
        ),
    ];
    let total = IO_READS + IO_WRITES;
    eprintln!(
        "bench biolatency: {IO_READS} reads and {IO_WRITES} writes of 4 KiB with O_DIRECT on {}, \
         one at a time, median of {TRIALS} interleaved trials",
        dev.0
    );
    let results = trials(&setups, "ns/io", || direct_io(&workload, &dev.0))?;
    let (ratio, bpf_ratio) = print_costs(&setups, &results, "ns/io");
    println!();
    // A loop device's I/O crosses to its worker thread, whose wakeup
    // varies by microseconds: more than the tracers add, so the BPF time is
    // the figure to judge by here.
    println!(
        "rtrace's BPF programs run {bpf_ratio:.2}x as long per direct I/O as libbpf-tools' \
         (added wall time {ratio:.2}x, within the loop device's noise)"
    );
    Ok(Row::new(
        "biolatency",
        format!("{total} direct 4 KiB I/Os on a loop device"),
        "ns/io",
        (&setups, &results),
        (2, 1),
        None,
    ))
}

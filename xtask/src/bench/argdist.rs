//! argdist against bpftrace on writes to stdout: interpreted expressions
//! against compiled ones.

use std::process::Command;

use super::{Ready, Row, Setup, TRIALS, helpers::seconds, print_costs, trials};

/// Writes per trial of the argdist case.
const WRITES: u64 = 200_000;

/// bpftrace's form of argdist's count of write sizes to stdout.
const BPFTRACE_WRITES: &str =
    "tracepoint:syscalls:sys_enter_write /args->fd == 1/ { @[args->count] = count(); }";
/// bpftrace's form of argdist's histogram of write sizes to stdout.
const BPFTRACE_WRITE_HIST: &str =
    "tracepoint:syscalls:sys_enter_write /args->fd == 1/ { @ = hist(args->count); }";

/// argdist's interpreted expressions against bpftrace's compiled ones: a
/// count of write sizes to stdout, and a histogram of a longer expression.
pub fn run() -> anyhow::Result<Row> {
    let rtrace = crate::build()?;
    let setups = vec![
        Setup::bare(),
        Setup::traced(
            "bpftrace @[args->count] = count()",
            "bpftrace",
            &["-e", BPFTRACE_WRITES],
            Ready::Stdout("Attaching"),
            None,
        ),
        Setup::traced(
            "rtrace argdist -C args->count",
            &rtrace,
            &[
                "argdist",
                "-C",
                "t:syscalls:sys_enter_write():u64:args->count:args->fd == 1",
            ],
            Ready::Stderr("Tracing"),
            None,
        ),
        Setup::traced(
            "bpftrace @ = hist(args->count)",
            "bpftrace",
            &["-e", BPFTRACE_WRITE_HIST],
            Ready::Stdout("Attaching"),
            None,
        ),
        Setup::traced(
            "rtrace argdist -H args->count",
            &rtrace,
            &[
                "argdist",
                "-H",
                "t:syscalls:sys_enter_write():u64:args->count:args->fd == 1",
            ],
            Ready::Stderr("Tracing"),
            None,
        ),
        Setup::traced(
            "rtrace argdist -H of a 9-step expression",
            &rtrace,
            &[
                "argdist",
                "-H",
                "t:syscalls:sys_enter_write():u64:(args->count & 0xfff) * 2 + (args->fd << 1):args->fd == 1 && args->count > 0",
            ],
            Ready::Stderr("Tracing"),
            None,
        ),
    ];
    eprintln!(
        "bench argdist: {WRITES} writes of 64 bytes to stdout (/dev/null) by dd, median of \
         {TRIALS} interleaved trials"
    );
    let results = trials(&setups, "ns/write", || {
        // GNU dd writes `of=` through descriptor 1, which the filter asks for.
        let secs = seconds(|| {
            crate::run(Command::new("dd").args([
                "if=/dev/zero",
                "of=/dev/null",
                "bs=64",
                &format!("count={WRITES}"),
                "status=none",
            ]))
        })?;
        Ok((secs * 1e9 / WRITES as f64, WRITES))
    })?;
    let (ratio, bpf_ratio) = print_costs(&setups, &results, "ns/write");
    let bare = results[0].cost;
    let hist_ratio = (results[4].cost - bare) / (results[3].cost - bare);
    let hist_bpf = results[4].bpf_ns / results[3].bpf_ns;
    println!();
    println!(
        "counts: rtrace argdist -C adds {ratio:.2}x what bpftrace adds per write (BPF time \
         {bpf_ratio:.2}x); histograms: -H adds {hist_ratio:.2}x (BPF time {hist_bpf:.2}x); \
         rtrace interprets what bpftrace compiles"
    );
    Ok(Row::new(
        "argdist",
        format!("{WRITES} writes of 64 bytes"),
        "ns/write",
        (&setups, &results),
        (2, 1),
        None,
    ))
}

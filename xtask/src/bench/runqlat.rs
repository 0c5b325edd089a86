//! runqlat against libbpf-tools' on a ping-pong of two threads pinned to
//! one CPU: every round trip is two wakeups and two context switches.

use super::{
    Ready, Row, Setup, TRIALS,
    helpers::{ROUNDS, pingpong},
    print_costs, trials,
};

pub fn run() -> anyhow::Result<Row> {
    let rtrace = crate::build()?;
    let workload = crate::root().join("target/release/pingpong");
    let mut setups = vec![
        Setup::bare(),
        Setup::libbpf_tools("runqlat", Ready::Stdout("Tracing"), None)?,
    ];
    // The default comes first: the target is judged on it.
    let variants: [(&str, &[&str]); 4] = [
        ("default", &[]),
        (
            "tp_btf, hash map",
            &["--attach", "tp_btf", "--no-task-storage"],
        ),
        ("raw_tracepoint", &["--attach", "raw_tracepoint"]),
        ("tracepoint", &["--attach", "tracepoint"]),
    ];
    for (what, args) in variants {
        let mut all = vec!["runqlat"];
        all.extend_from_slice(args);
        setups.push(Setup::traced(
            format!("rtrace runqlat ({what})"),
            &rtrace,
            &all,
            Ready::Stderr("Tracing"),
            None,
        ));
    }
    eprintln!(
        "bench runqlat: ping-pong of two threads pinned to CPU 0, {ROUNDS} round trips, \
         median of {TRIALS} interleaved trials"
    );
    let results = trials(&setups, "ns/round trip", || pingpong(&workload))?;
    let (ratio, bpf_ratio) = print_costs(&setups, &results, "ns/round trip");
    println!();
    println!(
        "target: rtrace (default attach) adds at most 0.50x what libbpf-tools adds: {ratio:.2}x, {}",
        if ratio <= 0.5 { "met" } else { "NOT met" }
    );
    println!("its BPF programs run {bpf_ratio:.2}x as long per round trip as libbpf-tools'");
    Ok(Row::new(
        "runqlat",
        format!("ping-pong on one CPU, {ROUNDS} round trips"),
        "ns/round trip",
        (&setups, &results),
        (2, 1),
        None,
    ))
}

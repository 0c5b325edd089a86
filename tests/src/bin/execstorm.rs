//! Workload for execsnoop's benchmark: WORKERS threads each run PROGRAM
//! (with one argument) COUNT times, back to back, as fast as the machine
//! allows. Usage: `execstorm COUNT WORKERS PROGRAM`; prints `done
//! NANOSECONDS` for the whole storm.

use std::{process::Command, time::Instant};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, count, workers, program] = &args[..] else {
        eprintln!("usage: execstorm COUNT WORKERS PROGRAM");
        std::process::exit(2);
    };
    let count: usize = count.parse().expect("COUNT is a number");
    let workers: usize = workers.parse().expect("WORKERS is a number");
    let start = Instant::now();
    std::thread::scope(|s| {
        for w in 0..workers {
            s.spawn(move || {
                for i in 0..count {
                    let status = Command::new(program)
                        .arg(format!("storm-{w}-{i}"))
                        .status()
                        .expect("cannot run PROGRAM");
                    assert!(status.success());
                }
            });
        }
    });
    println!("done {}", start.elapsed().as_nanos());
}

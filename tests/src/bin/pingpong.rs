//! Workload for runqlat's tests: two threads pinned to one CPU hand a byte
//! back and forth over pipes, so every round is two context switches.
//!
//! Usage: `pingpong ROUNDS [CPU]`. It prints `ready`, waits for a line on
//! stdin, plays ROUNDS rounds, prints `done NANOSECONDS`, and then blocks on stdin
//! with every thread asleep, so that its context-switch counts stay still
//! until the test lets it exit by closing stdin.

use std::{
    io::{BufRead, Read, Write},
    os::fd::FromRawFd,
    sync::mpsc,
};

fn pin(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is valid, and the calls only read it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        assert_eq!(
            libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set),
            0
        );
    }
}

fn pipe() -> (std::fs::File, std::fs::File) {
    let mut fds = [0; 2];
    // SAFETY: fds has room for the two descriptors.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: both descriptors are fresh and owned here.
    unsafe {
        (
            std::fs::File::from_raw_fd(fds[0]),
            std::fs::File::from_raw_fd(fds[1]),
        )
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let rounds: u64 = args
        .next()
        .and_then(|a| a.parse().ok())
        .expect("usage: pingpong ROUNDS [CPU]");
    let cpu: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(0);
    let (mut a_read, mut a_write) = pipe();
    let (mut b_read, mut b_write) = pipe();
    let (done_tx, done_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (park_tx, park_rx) = mpsc::channel::<()>();
    let done_tx2 = done_tx.clone();

    let ponger = std::thread::spawn(move || {
        pin(cpu);
        let mut byte = [0u8];
        for _ in 0..rounds {
            a_read.read_exact(&mut byte).unwrap();
            b_write.write_all(&byte).unwrap();
        }
        done_tx2.send(()).unwrap();
        // Sleep until the process exits.
        let _ = a_read.read(&mut byte);
    });
    let pinger = std::thread::spawn(move || {
        pin(cpu);
        go_rx.recv().unwrap();
        let mut byte = [1u8];
        for _ in 0..rounds {
            a_write.write_all(&byte).unwrap();
            b_read.read_exact(&mut byte).unwrap();
        }
        done_tx.send(()).unwrap();
        let _ = park_rx.recv();
        drop(a_write);
    });

    let stdin = std::io::stdin();
    let mut line = String::new();
    println!("ready");
    stdin.lock().read_line(&mut line).unwrap();
    let start = std::time::Instant::now();
    go_tx.send(()).unwrap();
    done_rx.recv().unwrap();
    done_rx.recv().unwrap();
    // The elapsed time is what `cargo xtask bench runqlat` measures.
    println!("done {}", start.elapsed().as_nanos());
    // Wait for EOF, then let the threads finish.
    let _ = stdin.lock().read_line(&mut line);
    drop(park_tx);
    pinger.join().unwrap();
    ponger.join().unwrap();
}

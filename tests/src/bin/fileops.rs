//! Workload for ext4slower's tests and benchmark.
//!
//! Usage: `fileops DIR ops` or `fileops DIR reads N`. It prints `ready`,
//! waits for a line on stdin, then works on `DIR/e4-PID.dat`:
//! - `ops` opens, writes, syncs and reads, one syscall each, and prints
//!   `done e4-PID.dat T:BYTES:OFFSET,...` for what it did, with the bytes
//!   each call returned (-1 for a whole-file sync);
//! - `reads N` writes 64 KiB, then times N cached 4 KiB preads and prints
//!   `done NANOSECONDS`.

use std::{
    io::{BufRead as _, IoSlice, IoSliceMut, Read as _, Seek as _, SeekFrom, Write as _},
    os::unix::fs::FileExt as _,
};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(dir), Some(mode)) = (args.first(), args.get(1)) else {
        eprintln!("usage: fileops DIR ops | fileops DIR reads N");
        std::process::exit(2);
    };
    let name = format!("e4-{}.dat", std::process::id());
    let path = std::path::Path::new(dir).join(&name);
    println!("ready");
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).unwrap();
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    match mode.as_str() {
        "ops" => {
            let mut did = vec!["O:0:0".to_owned()];
            let mut log = |t: &str, n: usize, off: u64| did.push(format!("{t}:{n}:{off}"));
            let n = f.write(&[1; 4096]).unwrap();
            log("W", n, 0);
            let n = f.write(&[2; 1000]).unwrap();
            log("W", n, 4096);
            let n = f.write_at(&[3; 777], 65536).unwrap();
            log("W", n, 65536);
            let n = f
                .write_vectored(&[IoSlice::new(&[4; 100]), IoSlice::new(&[5; 200])])
                .unwrap();
            log("W", n, 5096);
            f.sync_all().unwrap();
            did.push("F:-1:0".to_owned());
            f.sync_data().unwrap();
            did.push("F:-1:0".to_owned());
            let mut buf = vec![0; 4096];
            let n = f.read_at(&mut buf[..2048], 8192).unwrap();
            did.push(format!("R:{n}:8192"));
            f.seek(SeekFrom::Start(0)).unwrap();
            let n = f.read(&mut buf[..3000]).unwrap();
            did.push(format!("R:{n}:0"));
            let (a, b) = buf.split_at_mut(10);
            let m = f
                .read_vectored(&mut [IoSliceMut::new(a), IoSliceMut::new(&mut b[..20])])
                .unwrap();
            did.push(format!("R:{m}:{n}"));
            println!("done {name} {}", did.join(","));
        }
        "reads" => {
            let n: u64 = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(100_000);
            f.write_all(&[7; 65536]).unwrap();
            let mut buf = [0; 4096];
            let start = std::time::Instant::now();
            for i in 0..n {
                f.read_exact_at(&mut buf, (i % 16) * 4096).unwrap();
            }
            println!("done {}", start.elapsed().as_nanos());
        }
        _ => {
            eprintln!("usage: fileops DIR ops | fileops DIR reads N");
            std::process::exit(2);
        }
    }
    drop(f);
    let _ = std::fs::remove_file(&path);
}

//! Workload for biolatency's tests and benchmark: a known number of direct
//! I/O requests, one at a time, so that none merge.
//!
//! Usage: `directio PATH READS WRITES [wait]`. It reads READS and then
//! writes WRITES blocks of 4 KiB with O_DIRECT at spread-out offsets of
//! PATH (a block device or a file of at least 16 MiB), one request at a
//! time, and prints `done NANOSECONDS`. With `wait`, it first opens PATH,
//! prints `ready` and waits for a line on stdin: a tracer started then
//! knows the process before its first request.

use std::{fs::OpenOptions, os::unix::fs::FileExt as _, os::unix::fs::OpenOptionsExt as _};

const BLOCK: usize = 4096;
/// Offsets cycle through this many blocks (16 MiB), 16 apart, each round
/// two blocks on from the last (up to 14): no two requests sit next to
/// each other, neither this program's nor those of two copies of it
/// running at once on one device (biolatency's test runs one beside the
/// command), so none can merge. With 8 apart and each round one block on,
/// a copy's second round sat right after the other's first, and one of
/// its reads merged into the other's request now and then.
const SPAN: u64 = 4096;

/// A block-aligned buffer, as O_DIRECT needs.
struct Aligned(*mut u8);

impl Aligned {
    fn new() -> Self {
        let layout = std::alloc::Layout::from_size_align(BLOCK, BLOCK).unwrap();
        // SAFETY: the layout has a nonzero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!p.is_null());
        Self(p)
    }

    fn slice(&mut self) -> &mut [u8] {
        // SAFETY: the allocation is BLOCK bytes, owned by `self`.
        unsafe { std::slice::from_raw_parts_mut(self.0, BLOCK) }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(path), Some(reads), Some(writes)) = (
        args.first(),
        args.get(1).and_then(|a| a.parse::<u64>().ok()),
        args.get(2).and_then(|a| a.parse::<u64>().ok()),
    ) else {
        eprintln!("usage: directio PATH READS WRITES");
        std::process::exit(2);
    };
    let file = OpenOptions::new()
        .read(true)
        .write(writes > 0)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .unwrap_or_else(|e| panic!("cannot open {path}: {e}"));
    if args.get(3).is_some_and(|a| a == "wait") {
        println!("ready");
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).unwrap();
    }
    let mut buf = Aligned::new();
    let offset = |i: u64| ((i * 16 % SPAN) + (i * 16 / SPAN % 8) * 2) * BLOCK as u64;
    let start = std::time::Instant::now();
    for i in 0..reads {
        let n = file.read_at(buf.slice(), offset(i)).unwrap();
        assert_eq!(n, BLOCK);
    }
    for i in 0..writes {
        buf.slice()[0] = i as u8;
        let n = file.write_at(buf.slice(), offset(i)).unwrap();
        assert_eq!(n, BLOCK);
    }
    println!("done {}", start.elapsed().as_nanos());
}

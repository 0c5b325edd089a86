//! Resolves a host name with getaddrinfo(3), over and over:
//! `lookups NAME COUNT`. Prints `done NS`, the time the lookups took.

use std::net::ToSocketAddrs as _;

fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(name), Some(count)) = (args.next(), args.next()) else {
        eprintln!("usage: lookups NAME COUNT");
        std::process::exit(2);
    };
    let count: u64 = count.parse().expect("COUNT is a number");
    let start = std::time::Instant::now();
    for _ in 0..count {
        // std resolves through the C library's getaddrinfo.
        let found = (name.as_str(), 80)
            .to_socket_addrs()
            .expect("the name resolves");
        assert!(found.count() > 0, "{name} has no address");
    }
    println!("done {}", start.elapsed().as_nanos());
}

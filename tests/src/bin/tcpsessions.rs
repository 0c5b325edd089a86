//! Workload for tcplife's tests and benchmark: loopback TCP sessions with
//! known byte counts between two processes.
//!
//! Usage: `tcpsessions 4|6 COUNT UP DOWN [PORT]`. It starts a server process (a
//! copy of itself), then opens COUNT sessions to it one after another; in
//! each the client sends UP bytes and the server answers with DOWN bytes.
//! The server closes first in odd sessions and the client in even ones, so
//! both ends see both kinds of close. The server calls itself `tcpserver`.
//! At the end it prints
//! `done CLIENT_PID SERVER_PID PORT NANOSECONDS`. With `wait` for PORT,
//! once the server listens (on a free port) it prints `ready` and waits
//! for a line on stdin before the first session: a tracer started then
//! knows both processes before they connect.

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::{Shutdown, TcpListener, TcpStream},
    process::{Command, Stdio},
    time::Instant,
};

fn usage() -> ! {
    eprintln!("usage: tcpsessions 4|6 COUNT UP DOWN [PORT]");
    std::process::exit(2);
}

fn arg<T: std::str::FromStr>(args: &[String], i: usize) -> T {
    args.get(i)
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| usage())
}

/// Reads until the peer closes; the session's byte counts must not grow.
fn wait_eof(s: &mut TcpStream) {
    let mut b = [0u8; 1];
    assert_eq!(s.read(&mut b).unwrap(), 0, "peer sent more than agreed");
}

fn serve(bind: &str, count: usize, up: usize, down: usize) {
    // A command name of its own, so that tracers' attributions can be told
    // apart by name as well as by pid.
    // SAFETY: PR_SET_NAME reads a NUL-terminated string.
    unsafe { libc::prctl(libc::PR_SET_NAME, c"tcpserver".as_ptr()) };
    let listener = TcpListener::bind(bind).unwrap();
    println!("port {}", listener.local_addr().unwrap().port());
    std::io::stdout().flush().unwrap();
    let reply = vec![b'd'; down];
    let mut got = vec![0u8; up];
    for i in 0..count {
        let (mut s, _) = listener.accept().unwrap();
        s.read_exact(&mut got).unwrap();
        s.write_all(&reply).unwrap();
        if i % 2 == 0 {
            wait_eof(&mut s);
        }
        drop(s);
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("serve") {
        let bind: String = arg(&args, 1);
        serve(&bind, arg(&args, 2), arg(&args, 3), arg(&args, 4));
        return;
    }
    let family: u8 = arg(&args, 0);
    let count: usize = arg(&args, 1);
    let up: usize = arg(&args, 2);
    let down: usize = arg(&args, 3);
    let wait = args.get(4).is_some_and(|a| a == "wait");
    let want: u16 = match args.get(4) {
        Some(_) if !wait => arg(&args, 4),
        _ => 0,
    };
    let host = match family {
        4 => "127.0.0.1",
        6 => "[::1]",
        _ => usage(),
    };
    let bind = format!("{host}:{want}");
    let mut server = Command::new(std::env::current_exe().unwrap())
        .args([
            "serve",
            &bind,
            &count.to_string(),
            &up.to_string(),
            &down.to_string(),
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(server.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port: u16 = line
        .trim()
        .strip_prefix("port ")
        .and_then(|p| p.parse().ok())
        .expect("server did not say its port");

    if wait {
        println!("ready");
        let mut go = String::new();
        std::io::stdin().read_line(&mut go).unwrap();
    }
    let payload = vec![b'u'; up];
    let mut got = vec![0u8; down];
    let start = Instant::now();
    for i in 0..count {
        let mut s = TcpStream::connect(format!("{host}:{port}")).unwrap();
        s.write_all(&payload).unwrap();
        s.read_exact(&mut got).unwrap();
        if i % 2 == 1 {
            wait_eof(&mut s);
        } else {
            let _ = s.shutdown(Shutdown::Both);
        }
        drop(s);
    }
    let nanos = start.elapsed().as_nanos();
    assert!(server.wait().unwrap().success());
    println!("done {} {} {port} {nanos}", std::process::id(), server.id());
}

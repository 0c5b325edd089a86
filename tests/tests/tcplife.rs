//! `rtrace tcplife` against real loopback TCP sessions between two
//! processes, with known byte counts each way.

use rtrace_integration_tests::{Rtrace, SIGINT, json_lines, run, run_workload};

/// What the workload did: who the two ends were and where the server
/// listened.
struct Sessions {
    client: u64,
    server: u64,
    port: u64,
}

fn sessions(family: u8, count: usize, up: usize, down: usize) -> Sessions {
    sessions_on(family, count, up, down, 0)
}

/// Like [`sessions`], with the server on `port` (0: any free port).
fn sessions_on(family: u8, count: usize, up: usize, down: usize, port: u16) -> Sessions {
    let text = run_workload(
        "tcpsessions",
        &[family as usize, count, up, down, port as usize].map(|n| n.to_string()),
    );
    let f: Vec<u64> = text
        .trim()
        .strip_prefix("done ")
        .unwrap()
        .split(' ')
        .map(|n| n.parse().unwrap())
        .collect();
    Sessions {
        client: f[0],
        server: f[1],
        port: f[2],
    }
}

/// Runs tcplife with `extra` around `work`; returns its stdout.
fn traced<T>(extra: &[&str], work: impl FnOnce() -> T) -> (String, T) {
    let mut args = vec!["tcplife"];
    args.extend_from_slice(extra);
    let rtrace = Rtrace::start(&args);
    let t = work();
    // Both ends are closed when the workload exits, but a socket's last
    // state change can trail its close by a moment.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let (code, stdout, stderr) = rtrace.stop(SIGINT);
    // Sessions lost to other processes' traffic are not this test's
    // business; the callers count the workload's own sessions.
    assert_eq!(code, 0, "stderr: {stderr}");
    (stdout, t)
}

/// The JSON events of the sessions to or from `port`.
fn of_port(stdout: &str, port: u64) -> Vec<serde_json::Value> {
    json_lines(stdout)
        .into_iter()
        .filter(|e| e["lport"] == port || e["rport"] == port)
        .collect()
}

fn check_both_ends(extra: &[&str], family: u8) {
    const N: usize = 6;
    const UP: u64 = 1234;
    const DOWN: u64 = 70_001;
    let mut args = vec!["--json"];
    args.extend_from_slice(extra);
    let (stdout, s) = traced(&args, || sessions(family, N, UP as usize, DOWN as usize));
    let events = of_port(&stdout, s.port);
    let loopback = if family == 4 { "127.0.0.1" } else { "::1" };
    let (clients, servers): (Vec<_>, Vec<_>) = events.iter().partition(|e| e["rport"] == s.port);
    assert_eq!(clients.len(), N, "{events:#?}");
    assert_eq!(servers.len(), N, "{events:#?}");
    for e in &clients {
        assert_eq!(e["pid"], s.client, "client end: {e}");
        assert_eq!(e["comm"], "tcpsessions", "{e}");
        assert_eq!(
            (e["tx_bytes"].as_u64(), e["rx_bytes"].as_u64()),
            (Some(UP), Some(DOWN)),
            "{e}"
        );
    }
    for e in &servers {
        // The server's sockets change state in softirq context; the owner
        // must still be the server, not whoever was interrupted.
        assert_eq!(e["pid"], s.server, "server end: {e}");
        assert_eq!(e["comm"], "tcpserver", "{e}");
        assert_eq!(
            (e["tx_bytes"].as_u64(), e["rx_bytes"].as_u64()),
            (Some(DOWN), Some(UP)),
            "{e}"
        );
    }
    for e in &events {
        assert_eq!(e["ip"], family, "{e}");
        assert_eq!(e["laddr"], loopback, "{e}");
        assert_eq!(e["raddr"], loopback, "{e}");
        let ms = e["ms"].as_f64().unwrap();
        assert!(ms > 0.0 && ms < 10_000.0, "lifetime {ms} ms: {e}");
    }
    // Every client port appears once, as the server's remote port too.
    let mut client_ports: Vec<_> = clients.iter().map(|e| e["lport"].as_u64()).collect();
    let mut server_peers: Vec<_> = servers.iter().map(|e| e["rport"].as_u64()).collect();
    client_ports.sort();
    server_peers.sort();
    client_ports.dedup();
    assert_eq!(client_ports.len(), N);
    assert_eq!(client_ports, server_peers);
}

#[test]
fn ipv4_sessions_have_exact_bytes_and_owners_on_both_ends() {
    check_both_ends(&[], 4);
}

#[test]
fn ipv6_sessions_have_exact_bytes_and_owners_on_both_ends() {
    check_both_ends(&[], 6);
}

#[test]
fn attach_raw_tracepoint_reports_both_ends() {
    check_both_ends(&["--attach", "raw_tracepoint"], 4);
}

#[test]
fn attach_tracepoint_reports_both_ends() {
    check_both_ends(&["--attach", "tracepoint"], 6);
}

#[test]
fn perf_buffer_transport_reports_both_ends() {
    check_both_ends(&["--perf-buffer"], 4);
}

#[test]
fn family_and_port_filters() {
    let (stdout, (v4, v6)) = traced(&["--json", "-6"], || {
        (sessions(4, 2, 10, 10), sessions(6, 2, 10, 10))
    });
    assert!(of_port(&stdout, v4.port).is_empty(), "{stdout}");
    assert_eq!(of_port(&stdout, v6.port).len(), 4, "{stdout}");

    // A port that was free a moment ago, for the server to listen on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (local, _) = traced(&["--json", "-L", &format!("1,{port}")], || {
        sessions_on(4, 3, 10, 10, port)
    });
    let local = of_port(&local, u64::from(port));
    assert_eq!(local.len(), 3, "{local:#?}");
    assert!(local.iter().all(|e| e["lport"] == port), "{local:#?}");
    let (remote, _) = traced(&["--json", "-D", &port.to_string()], || {
        sessions_on(4, 3, 10, 10, port)
    });
    let remote = of_port(&remote, u64::from(port));
    assert_eq!(remote.len(), 3, "{remote:#?}");
    assert!(remote.iter().all(|e| e["rport"] == port), "{remote:#?}");
}

#[test]
fn text_output_has_bcc_columns() {
    let (stdout, s) = traced(&["-w", "-T"], || sessions(6, 1, 2048, 4096));
    let mut lines = stdout.lines();
    let head: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(
        head,
        [
            "TIME", "PID", "COMM", "IP", "LADDR", "LPORT", "RADDR", "RPORT", "TX_KB", "RX_KB", "MS"
        ]
    );
    let port = s.port.to_string();
    let rows: Vec<Vec<&str>> = lines
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|f| f.len() == 11 && (f[5] == port || f[7] == port))
        .collect();
    assert_eq!(rows.len(), 2, "{stdout}");
    for f in rows {
        assert_eq!(f[0].len(), 8, "HH:MM:SS: {f:?}");
        assert_eq!(f[3], "6");
        assert_eq!((f[4], f[6]), ("::1", "::1"));
        let client = f[7] == port;
        let (tx, rx) = if client {
            ("2.00", "4.00")
        } else {
            ("4.00", "2.00")
        };
        assert_eq!((f[8], f[9]), (tx, rx), "{f:?}");
        let pid = if client { s.client } else { s.server };
        assert_eq!(f[1], pid.to_string());
    }
}

#[test]
fn bad_input_gets_one_line_and_nonzero_exit() {
    let (code, _, stderr) = run(&["tcplife", "-L", "70000"]);
    assert_eq!(code, 2, "{stderr}");
    let (code, _, stderr) = run(&["tcplife", "-4", "-6"]);
    assert_eq!(code, 2, "{stderr}");
    let many = (1..=17)
        .map(|p| p.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let (code, _, stderr) = run(&["tcplife", "-D", &many]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("at most 16"), "{stderr}");
    let (code, _, stderr) = run(&["tcplife", "-p", "999999999"]);
    assert_ne!(code, 0);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    // --attach offers only the tool's own chain.
    let (code, _, stderr) = run(&["tcplife", "--attach", "kprobe"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("possible values: tp_btf, raw_tracepoint, tracepoint"),
        "{stderr}"
    );
}

/// `-s`: bcc's comma-separated values, after the time with `-T`.
#[test]
fn csv_output_has_bccs_fields() {
    let (stdout, s) = traced(&["-s", "-T"], || sessions(6, 1, 3072, 5120));
    let mut lines = stdout.lines();
    assert_eq!(
        lines.next().unwrap(),
        "TIME,PID,COMM,IP,LADDR,LPORT,RADDR,RPORT,TX_KB,RX_KB,MS"
    );
    let port = s.port.to_string();
    let rows: Vec<Vec<&str>> = lines
        .map(|l| l.split(',').collect::<Vec<_>>())
        .filter(|f| f.len() == 11 && (f[5] == port || f[7] == port))
        .collect();
    assert_eq!(rows.len(), 2, "{stdout}");
    for f in rows {
        assert_eq!(f[0].len(), 8, "HH:MM:SS: {f:?}");
        assert_eq!((f[3], f[4], f[6]), ("6", "::1", "::1"), "{f:?}");
        let client = f[7] == port;
        let (tx, rx) = if client { ("3", "5") } else { ("5", "3") };
        assert_eq!((f[8], f[9]), (tx, rx), "{f:?}");
        let pid = if client { s.client } else { s.server };
        assert_eq!(f[1], pid.to_string());
        assert!(f[10].parse::<f64>().unwrap() >= 0.0);
    }
}

//! `rtrace tcplife`: one line per closed TCP session, with its owner,
//! addresses, bytes each way and lifetime, as bcc's tcplife prints it.

use std::{
    fmt::Write as _,
    io::Write as _,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use anyhow::Context as _;
use aya::EbpfLoader;
use rtrace_common::tcplife::{
    AF_INET, AF_INET6, Config, Event, MAX_PORTS, SockOffsets, TracepointOffsets,
};

use crate::{
    GlobalArgs,
    btf::Btf as KernelBtf,
    features::{Features, Hooks, Mechanism, TRACEPOINT_CHAIN, attach_chain, check_forced},
    objects,
    output::{
        self, Signals, TimeColumns,
        events::{self, BufferArgs, EventStream, Transport, report_lost},
    },
    privs, tracefs,
};

/// `sock:inet_sock_set_state` is there since 4.16.
const CHAIN: [Mechanism; 3] = TRACEPOINT_CHAIN;

/// Trace the lifespan of TCP sessions and summarize.
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:
  rtrace tcplife              # trace all TCP connect()s
  rtrace tcplife -T           # include time column (HH:MM:SS)
  rtrace tcplife -w           # wider columns (fit IPv6)
  rtrace tcplife -p 181       # only trace PID 181
  rtrace tcplife -L 80        # only trace local port 80
  rtrace tcplife -L 80,81     # only trace local ports 80 and 81
  rtrace tcplife -D 80        # only trace remote port 80
  rtrace tcplife -4           # only trace IPv4 family
  rtrace tcplife --json       # one JSON object per session, exact bytes")]
pub struct Args {
    /// Include a time column (HH:MM:SS).
    #[arg(short = 'T', long)]
    time: bool,
    /// Include a timestamp column: seconds since tracing started.
    #[arg(short = 't', long)]
    timestamp: bool,
    /// Wide columns, which fit IPv6 addresses, and an IP version column.
    #[arg(short = 'w', long)]
    wide: bool,
    /// Trace this process only.
    #[arg(short = 'p', long)]
    pid: Option<u32>,
    /// Comma-separated list of local ports to trace (at most 16).
    #[arg(short = 'L', long = "localport", value_name = "PORTS", value_parser = parse_ports)]
    local_ports: Option<Ports>,
    /// Comma-separated list of remote ports to trace (at most 16).
    #[arg(short = 'D', long = "remoteport", value_name = "PORTS", value_parser = parse_ports)]
    remote_ports: Option<Ports>,
    /// Trace IPv4 only.
    #[arg(short = '4', long = "ipv4", conflicts_with = "ipv6")]
    ipv4: bool,
    /// Trace IPv6 only.
    #[arg(short = '6', long = "ipv6")]
    ipv6: bool,
    /// Attach with this mechanism instead of the best one that works
    /// (tp_btf, raw_tracepoint or tracepoint).
    #[arg(long, value_enum, value_name = "MECHANISM")]
    attach: Option<Mechanism>,
    #[command(flatten)]
    buffer: BufferArgs,
}

/// A port list, as the programs take it.
#[derive(Clone, Copy, Debug)]
struct Ports {
    ports: [u16; MAX_PORTS],
    len: u16,
}

fn parse_ports(s: &str) -> Result<Ports, String> {
    let mut out = Ports {
        ports: [0; MAX_PORTS],
        len: 0,
    };
    for (i, part) in s.split(',').enumerate() {
        let port: u16 = part
            .trim()
            .parse()
            .map_err(|_| format!("bad port {part:?}: use numbers from 0 to 65535"))?;
        let slot = out
            .ports
            .get_mut(i)
            .ok_or_else(|| format!("at most {MAX_PORTS} ports may be listed"))?;
        *slot = port;
        out.len += 1;
    }
    Ok(out)
}

/// Offsets every mechanism needs, from BTF: the socket's fields and the
/// way from a task to the socket behind a descriptor.
fn sock_offsets(btf: &KernelBtf) -> anyhow::Result<SockOffsets> {
    let m = |s: &str, m: &str| btf.offset(s, m);
    let common = |f: &str| m("sock", &format!("__sk_common.{f}"));
    let protocol = btf.member_any("sock", &["sk_protocol"])?;
    Ok(SockOffsets {
        family: common("skc_family")?,
        sport: m("inet_sock", "inet_sport")?,
        dport: common("skc_dport")?,
        rcv_saddr: common("skc_rcv_saddr")?,
        daddr: common("skc_daddr")?,
        v6_rcv_saddr: common("skc_v6_rcv_saddr")?,
        v6_daddr: common("skc_v6_daddr")?,
        // Before 5.6 it is a bitfield, which the programs cannot read by
        // offset; the tracepoint's record has it instead.
        protocol: if protocol.size == 2 {
            protocol.offset
        } else {
            u32::MAX
        },
        bytes_received: m("tcp_sock", "bytes_received")?,
        bytes_acked: m("tcp_sock", "bytes_acked")?,
        sk_flags: common("skc_flags")?,
        snd_una: m("tcp_sock", "snd_una")?,
        write_seq: m("tcp_sock", "write_seq")?,
        fd: btf.fd_offsets()?,
        file_private: m("file", "private_data")?,
        socket_sk: m("socket", "sk")?,
    })
}

/// Fills in the `sock:inet_sock_set_state` record offsets, which only the
/// classic tracepoint program reads.
fn set_state_offsets(tp: &mut TracepointOffsets) -> Result<(), tracefs::TracefsError> {
    let f = tracefs::Format::read("sock", "inet_sock_set_state")?;
    tp.skaddr = f.offset("skaddr")?;
    tp.newstate = f.offset("newstate")?;
    tp.protocol = f.offset("protocol")?;
    Ok(())
}

/// `sys_exit_accept4.ret`, or 0 without syscall tracepoints, where the
/// accept hooks are skipped and it goes unused.
fn accept_ret() -> u32 {
    tracefs::Format::read("syscalls", "sys_exit_accept4")
        .and_then(|f| f.offset("ret"))
        .unwrap_or(0)
}

/// A session as user space sees it.
struct Session {
    pid: u32,
    comm: String,
    local: IpAddr,
    lport: u16,
    remote: IpAddr,
    rport: u16,
    tx: u64,
    rx: u64,
    ms: f64,
}

fn decode(record: &[u8]) -> Option<Session> {
    let e: Event = events::record(record)?;
    let addr = |a: [u8; 16]| match e.family {
        AF_INET6 => Some(IpAddr::V6(Ipv6Addr::from(a))),
        AF_INET => Some(IpAddr::V4(Ipv4Addr::new(a[0], a[1], a[2], a[3]))),
        _ => None,
    };
    Some(Session {
        pid: e.pid,
        comm: output::c_string(&e.comm),
        local: addr(e.saddr)?,
        lport: e.lport,
        remote: addr(e.daddr)?,
        rport: e.dport,
        tx: e.tx_bytes,
        rx: e.rx_bytes,
        ms: e.span_ns as f64 / 1e6,
    })
}

/// Runs the tool.
pub async fn run(args: Args, global: &GlobalArgs) -> anyhow::Result<()> {
    if let Some(pid) = args.pid {
        super::check_pid(pid)?;
    }
    check_forced("tcplife", args.attach, &CHAIN)?;
    privs::check()?;

    let btf = KernelBtf::from_kernel().context("tcplife reads sockets through kernel BTF")?;
    let no_ports = Ports {
        ports: [0; MAX_PORTS],
        len: 0,
    };
    let (lports, dports) = (
        args.local_ports.unwrap_or(no_ports),
        args.remote_ports.unwrap_or(no_ports),
    );
    let base = Config {
        pid: args.pid.unwrap_or(0),
        family: if args.ipv4 {
            AF_INET
        } else if args.ipv6 {
            AF_INET6
        } else {
            0
        },
        n_lports: lports.len,
        n_dports: dports.len,
        _pad: 0,
        lports: lports.ports,
        dports: dports.ports,
        sock: sock_offsets(&btf)?,
        tp: TracepointOffsets {
            accept_ret: accept_ret(),
            ..TracepointOffsets::default()
        },
    };

    let mut features = Features::new();
    let (transport, why) = Transport::choose(&mut features, &args.buffer);
    let mut accept_skipped = None;
    let (mech, mut ebpf, skipped) = attach_chain(&mut features, &CHAIN, args.attach, |m| {
        let mut cfg = base;
        if m == Mechanism::Tracepoint {
            set_state_offsets(&mut cfg.tp)?;
        }
        if m != Mechanism::Tracepoint && cfg.sock.protocol == u32::MAX {
            anyhow::bail!("sock.sk_protocol is a bitfield on this kernel");
        }
        let mut loader = EbpfLoader::new();
        // Entries are allocated on demand, so room for a busy server's
        // sockets costs nothing on a quiet machine.
        loader
            .override_global("CONFIG", &cfg, true)
            .map_max_entries("SOCKS", 1 << 20);
        let mut ebpf = transport
            .size(&mut loader, &args.buffer)
            .load(transport.object(objects::TCPLIFE, objects::TCPLIFE_PERF))
            .context("cannot load the tcplife programs")?;
        Hooks::new(m)?.attach_event(&mut ebpf, "sock", "inet_sock_set_state")?;
        // Owners are also taken at close, so a kernel without syscall
        // tracepoints loses only sockets that die before their owner
        // closes them.
        let syscalls = Hooks::new(Mechanism::Tracepoint)?;
        for event in ["sys_exit_accept4", "sys_exit_accept"] {
            if let Err(e) = syscalls.attach_event(&mut ebpf, "syscalls", event) {
                accept_skipped = Some(format!("{e:#}"));
            }
        }
        Ok(ebpf)
    })?;
    if global.verbose {
        for (m, why) in &skipped {
            eprintln!("rtrace: tcplife: skipped {m}: {why}");
        }
        eprintln!("rtrace: tcplife: attached with {mech} (sock:inet_sock_set_state)");
        if let Some(why) = &accept_skipped {
            eprintln!("rtrace: tcplife: owners not taken at accept: {why}");
        }
        transport.report("tcplife", why.as_deref());
    }
    let mut stream = EventStream::new(&mut ebpf, transport, &args.buffer)?;
    let mut signals = Signals::new()?;
    eprintln!("Tracing TCP sessions... Hit Ctrl-C to end.");

    let (addr_w, comm_w) = if args.wide { (39, 16) } else { (15, 16) };
    let times = TimeColumns::new(args.time, args.timestamp, 9);
    let prefix_head = times.header();
    if !global.json {
        let ip = if args.wide { "IP " } else { "" };
        writeln!(
            std::io::stdout(),
            "{prefix_head}{:<7} {:<comm_w$} {ip}{:<addr_w$} {:<5} {:<addr_w$} {:<5} {:<6} {:<6} MS",
            "PID",
            "COMM",
            "LADDR",
            "LPORT",
            "RADDR",
            "RPORT",
            "TX_KB",
            "RX_KB",
        )
        .context("cannot write to stdout")?;
    }
    stream
        .run(&mut signals, |record| {
            let Some(s) = decode(record) else {
                return Ok(true);
            };
            if global.json {
                output::json_line(&serde_json::json!({
                    "tool": "tcplife",
                    "time": output::hms(),
                    "timestamp": output::epoch_secs(),
                    "pid": s.pid,
                    "comm": s.comm,
                    "ip": if s.local.is_ipv4() { 4 } else { 6 },
                    "laddr": s.local.to_string(),
                    "lport": s.lport,
                    "raddr": s.remote.to_string(),
                    "rport": s.rport,
                    "tx_bytes": s.tx,
                    "rx_bytes": s.rx,
                    "ms": s.ms,
                }))?;
                return Ok(true);
            }
            let mut out = String::new();
            times.push(&mut out);
            let _ = write!(out, "{:<7} {:<comm_w$.comm_w$} ", s.pid, s.comm);
            if args.wide {
                let _ = write!(out, "{:<2} ", if s.local.is_ipv4() { 4 } else { 6 });
            }
            let _ = write!(
                out,
                "{:<addr_w$} {:<5} {:<addr_w$} {:<5} {:<6.2} {:<6.2} {:.2}",
                s.local.to_string(),
                s.lport,
                s.remote.to_string(),
                s.rport,
                s.tx as f64 / 1024.0,
                s.rx as f64 / 1024.0,
                s.ms,
            );
            writeln!(std::io::stdout(), "{out}").context("cannot write to stdout")?;
            Ok(true)
        })
        .await?;
    report_lost(&ebpf, &stream)
}

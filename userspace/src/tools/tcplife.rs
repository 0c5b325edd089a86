//! `rtrace tcplife`: one line per closed TCP session, with its owner,
//! addresses, bytes each way and lifetime, as bcc's tcplife prints it.

use crate::tracer::{Plan, Spec};
use crate::tracer::{ScopeArgs, own};
use std::path::Path;
use std::{fmt::Write as _, net::IpAddr};

use anyhow::Context as _;
use aya::Ebpf;
use rtrace_common::{
    events::LOST_NAMES,
    tcplife::{
        AF_INET, AF_INET6, Config, Event, MAX_PORTS, SOCKS, SockOffsets, TALLY_RX, TALLY_SESSIONS,
        TALLY_SLOTS, TALLY_TX, TracepointOffsets,
    },
};
use serde::Serialize;

use crate::{
    kernel::{
        btf::Btf,
        features::{Mechanism, TRACEPOINT_CHAIN},
        load::{Hooks, Kernel, Load, read_tallies},
        tracefs,
        transport::BufferArgs,
    },
    output::{
        self, Record, Sink, TimeColumns, events,
        metrics::{Exposition, Kind},
    },
    tracer::{self, Tool},
};

/// `sock:inet_sock_set_state` is there since 4.16.
const CHAIN: [Mechanism; 3] = TRACEPOINT_CHAIN;

/// Trace the lifespan of TCP sessions and summarize.
#[derive(Debug, clap::Args, Default)]
#[command(after_help = "Examples:
  rtrace tcplife              # trace all TCP connect()s
  rtrace tcplife -T           # include time column (HH:MM:SS)
  rtrace tcplife -w           # wider columns (fit IPv6)
  rtrace tcplife -p 181       # only trace PID 181
  rtrace tcplife -L 80        # only trace local port 80
  rtrace tcplife -L 80,81     # only trace local ports 80 and 81
  rtrace tcplife -D 80        # only trace remote port 80
  rtrace tcplife -4           # only trace IPv4 family
  rtrace tcplife --json       # one JSON object per session, exact bytes
  rtrace tcplife -- curl -s -o /dev/null http://127.0.0.1:8000/
                              # the sessions of one command, until it exits
  rtrace tcplife -a -T -- curl -s -o /dev/null http://127.0.0.1:8000/
                              # every session while it runs (the server's end too)")]
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
    /// Comma-separated values, as bcc's tcplife writes them:
    /// PID,COMM,IP,LADDR,LPORT,RADDR,RPORT,TX_KB,RX_KB,MS (after TIME and
    /// TIME(s) with -T and -t).
    #[arg(short = 's', long, conflicts_with = "wide")]
    csv: bool,
    #[command(flatten)]
    scope: ScopeArgs<{ own::T | own::L }>,
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
    /// Attach with this mechanism instead of the best one that works.
    #[arg(long, value_name = "MECHANISM", value_parser = Mechanism::parser(&CHAIN))]
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
fn sock_offsets(btf: &Btf) -> anyhow::Result<SockOffsets> {
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

/// Entries for the table of sockets being followed.
///
/// Entries are allocated on demand, but a hash's buckets are allocated
/// when it is created: a million of them cost 16 MB of kernel memory and
/// start-up the time to clear them. Four times the TCP sockets there are
/// now (at least 65536, at most 2^20) leaves a busy server room to grow;
/// a socket that still finds the table full is counted and reported.
fn socket_entries() -> u32 {
    let allocated: u32 = std::fs::read_to_string("/proc/net/sockstat")
        .ok()
        .and_then(|s| {
            let tcp = s.lines().find(|l| l.starts_with("TCP:"))?;
            let mut words = tcp.split_whitespace();
            words.find(|w| *w == "alloc")?;
            words.next()?.parse().ok()
        })
        .unwrap_or(0);
    allocated.saturating_mul(4).clamp(65_536, 1 << 20)
}

/// A session as user space sees it.
#[derive(Serialize)]
struct Session<'a> {
    pid: u32,
    comm: String,
    ip: u8,
    #[serde(rename = "laddr")]
    local: IpAddr,
    lport: u16,
    #[serde(rename = "raddr")]
    remote: IpAddr,
    rport: u16,
    #[serde(rename = "tx_bytes")]
    tx: u64,
    #[serde(rename = "rx_bytes")]
    rx: u64,
    ms: f64,
    #[serde(skip)]
    text: Option<&'a TextOptions>,
}

/// How a session's line looks.
struct TextOptions {
    times: TimeColumns,
    wide: bool,
    csv: bool,
}

impl TextOptions {
    fn widths(&self) -> (usize, usize) {
        if self.wide { (39, 16) } else { (15, 16) }
    }
}

impl Record for Session<'_> {
    fn text(&self, out: &mut String) {
        let Some(o) = self.text else { return };
        if o.csv {
            o.times.push_csv(out);
            let _ = writeln!(
                out,
                "{},{},{},{},{},{},{},{},{},{:.2}",
                self.pid,
                self.comm,
                self.ip,
                self.local,
                self.lport,
                self.remote,
                self.rport,
                self.tx / 1024,
                self.rx / 1024,
                self.ms,
            );
            return;
        }
        let (addr_w, comm_w) = o.widths();
        o.times.push(out);
        let _ = write!(out, "{:<7} {:<comm_w$.comm_w$} ", self.pid, self.comm);
        if o.wide {
            let _ = write!(out, "{:<2} ", self.ip);
        }
        let _ = writeln!(
            out,
            "{:<addr_w$} {:<5} {:<addr_w$} {:<5} {:<6.2} {:<6.2} {:.2}",
            self.local.to_string(),
            self.lport,
            self.remote.to_string(),
            self.rport,
            self.tx as f64 / 1024.0,
            self.rx as f64 / 1024.0,
            self.ms,
        );
    }
}

fn decode<'a>(record: &[u8]) -> Option<Session<'a>> {
    let e: Event = events::record(record)?;
    let addr = |a: [u8; 16]| output::ip_addr(e.family, &a);
    Some(Session {
        pid: e.pid,
        comm: crate::kernel::c_string(&e.comm),
        ip: if e.family == AF_INET6 { 6 } else { 4 },
        local: addr(e.saddr)?,
        lport: e.lport,
        remote: addr(e.daddr)?,
        rport: e.dport,
        tx: e.tx_bytes,
        rx: e.rx_bytes,
        ms: e.span_ns as f64 / 1e6,
        text: None,
    })
}

/// The tool.
pub struct Tcplife {
    args: Args,
    text: TextOptions,
    /// Why owners are not taken at accept, if they are not.
    accept_skipped: Option<String>,
    /// As a collector: sessions closed, bytes received and sent.
    tallies: Vec<u64>,
    /// Whether it runs as a collector, which needs no owners.
    collecting: bool,
}

impl Tool for Tcplife {
    type Args = Args;

    const SPEC: Spec = Spec::new("tcplife", &CHAIN, &LOST_NAMES);

    fn new(args: Args) -> anyhow::Result<Self> {
        let text = TextOptions {
            times: TimeColumns::new(args.time, args.timestamp, 9),
            wide: args.wide,
            csv: args.csv,
        };
        Ok(Self {
            args,
            text,
            accept_skipped: None,
            tallies: vec![0; TALLY_SLOTS as usize],
            collecting: false,
        })
    }

    fn configure(
        &mut self,
        m: Option<Mechanism>,
        kernel: &mut Kernel,
        load: &mut Load,
    ) -> anyhow::Result<()> {
        let m = m.context("tcplife attaches through its chain")?;
        let no_ports = Ports {
            ports: [0; MAX_PORTS],
            len: 0,
        };
        let (lports, dports) = (
            self.args.local_ports.unwrap_or(no_ports),
            self.args.remote_ports.unwrap_or(no_ports),
        );
        let btf = kernel
            .btf()
            .context("tcplife reads sockets through kernel BTF")?;
        let mut cfg = Config {
            family: if self.args.ipv4 {
                AF_INET
            } else if self.args.ipv6 {
                AF_INET6
            } else {
                0
            },
            n_lports: lports.len,
            n_dports: dports.len,
            _pad: [0; 3],
            lports: lports.ports,
            dports: dports.ports,
            sock: sock_offsets(btf)?,
            tp: TracepointOffsets {
                accept_ret: if self.collecting { 0 } else { accept_ret() },
                ..TracepointOffsets::default()
            },
        };
        if m == Mechanism::Tracepoint {
            set_state_offsets(&mut cfg.tp)?;
        }
        if m != Mechanism::Tracepoint && cfg.sock.protocol == u32::MAX {
            anyhow::bail!("sock.sk_protocol is a bitfield on this kernel");
        }
        load.config(&cfg).size(SOCKS, socket_entries());
        Ok(())
    }

    fn attach(
        &mut self,
        m: Option<Mechanism>,
        kernel: &mut Kernel,
        ebpf: &mut Ebpf,
    ) -> anyhow::Result<()> {
        let m = m.context("tcplife attaches through its chain")?;
        Hooks::new(m, kernel)?.attach_event(ebpf, "sock", "inet_sock_set_state")?;
        if self.collecting {
            // Counts need no owners, and the syscall tracepoints would
            // need tracefs, which an unprivileged exporter may not mount.
            return Ok(());
        }
        // Owners are also taken at close, so a kernel without syscall
        // tracepoints loses only sockets that die before their owner
        // closes them.
        let mut syscalls = Hooks::new(Mechanism::Tracepoint, kernel)?;
        self.accept_skipped = None;
        for event in ["sys_exit_accept4", "sys_exit_accept"] {
            if let Err(e) = syscalls.attach_event(ebpf, "syscalls", event) {
                self.accept_skipped = Some(format!("{e:#}"));
            }
        }
        Ok(())
    }

    fn describe(&self) -> Vec<String> {
        let mut lines = vec!["sock:inet_sock_set_state".to_owned()];
        lines.extend(
            self.accept_skipped
                .iter()
                .map(|why| format!("owners not taken at accept: {why}")),
        );
        lines
    }

    fn banner(&self) -> String {
        "Tracing TCP sessions... Hit Ctrl-C to end.".to_owned()
    }

    fn event(&mut self, record: &[u8], sink: &mut Sink) -> anyhow::Result<()> {
        let Some(mut s) = decode(record) else {
            return Ok(());
        };
        s.text = Some(&self.text);
        sink.emit(&s)
    }

    fn plan(&self) -> Plan {
        Plan {
            scope: self.args.scope.scope(),
            forced: self.args.attach,
            events: Some(self.args.buffer.clone()),
            header: Some(self.header()),
            ..Plan::default()
        }
    }
}

impl Tcplife {
    /// The column header, bcc's or its CSV one.
    fn header(&self) -> String {
        if self.text.csv {
            return format!(
                "{}PID,COMM,IP,LADDR,LPORT,RADDR,RPORT,TX_KB,RX_KB,MS",
                self.text.times.csv_header()
            );
        }
        let (addr_w, comm_w) = self.text.widths();
        let ip = if self.args.wide { "IP " } else { "" };
        format!(
            "{}{:<7} {:<comm_w$} {ip}{:<addr_w$} {:<5} {:<addr_w$} {:<5} {:<6} {:<6} MS",
            self.text.times.header(),
            "PID",
            "COMM",
            "LADDR",
            "LPORT",
            "RADDR",
            "RPORT",
            "TX_KB",
            "RX_KB",
        )
    }
}

impl tracer::Collect for Tcplife {
    const COLLECTOR: tracer::Collector = tracer::Collector {
        default: true,
        // Sessions close in whatever task the kernel is running then.
        scoped: false,
        tallies: TALLY_SLOTS,
    };

    fn collector(_cgroup: Option<&Path>) -> anyhow::Result<Self> {
        let mut tool = Self::new(Args::default())?;
        tool.collecting = true;
        Ok(tool)
    }

    fn refresh(&mut self, ebpf: &Ebpf) -> anyhow::Result<()> {
        self.tallies = read_tallies(ebpf, TALLY_SLOTS)?;
        Ok(())
    }

    fn metrics(&self, out: &mut Exposition) {
        let t = |i: u32| self.tallies[i as usize] as f64;
        out.family(
            "rtrace_tcp_sessions_closed_total",
            Kind::Counter,
            "TCP sessions closed (that began while the exporter ran).",
        )
        .value(&[], t(TALLY_SESSIONS));
        out.family(
            "rtrace_tcp_bytes_total",
            Kind::Counter,
            "Bytes TCP sessions moved, counted when they closed.",
        )
        .value(&[("direction", "received")], t(TALLY_RX))
        .value(&[("direction", "sent")], t(TALLY_TX));
    }
}

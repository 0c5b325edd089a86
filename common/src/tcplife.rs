//! Types of `rtrace tcplife`.

use crate::{TASK_COMM_LEN, offsets::FdOffsets};

/// Most ports `-L` or `-D` may list.
pub const MAX_PORTS: usize = 16;

/// `AF_INET`.
pub const AF_INET: u16 = 2;
/// `AF_INET6`.
pub const AF_INET6: u16 = 10;

/// Byte offsets into `struct sock`, `struct tcp_sock` and the structs on
/// the way from a task to its sockets, from BTF.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SockOffsets {
    /// `sock.__sk_common.skc_family`.
    pub family: u32,
    /// `inet_sock.inet_sport`: the local port, network order. (`skc_num`
    /// is already cleared when the socket reaches CLOSE.)
    pub sport: u32,
    /// `sock.__sk_common.skc_dport`: the remote port, network order.
    pub dport: u32,
    /// `sock.__sk_common.skc_rcv_saddr`.
    pub rcv_saddr: u32,
    /// `sock.__sk_common.skc_daddr`.
    pub daddr: u32,
    /// `sock.__sk_common.skc_v6_rcv_saddr`.
    pub v6_rcv_saddr: u32,
    /// `sock.__sk_common.skc_v6_daddr`.
    pub v6_daddr: u32,
    /// `sock.sk_protocol`, a plain `u16` since 5.6.
    pub protocol: u32,
    /// `tcp_sock.bytes_received`.
    pub bytes_received: u32,
    /// `tcp_sock.bytes_acked`.
    pub bytes_acked: u32,
    /// `sock.__sk_common.skc_flags` (`sk_flags`), whose `SOCK_DONE` bit says the peer's FIN arrived.
    pub sk_flags: u32,
    /// `tcp_sock.snd_una`.
    pub snd_una: u32,
    /// `tcp_sock.write_seq`.
    pub write_seq: u32,
    /// From a task to the file behind a descriptor.
    pub fd: FdOffsets,
    /// `file.private_data`: the `struct socket` of a socket file.
    pub file_private: u32,
    /// `socket.sk`.
    pub socket_sk: u32,
}

/// Byte offsets into the `sock:inet_sock_set_state` and `sys_exit_accept*`
/// tracepoint records, from tracefs.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TracepointOffsets {
    /// `skaddr`.
    pub skaddr: u32,
    /// `newstate`.
    pub newstate: u32,
    /// `protocol`.
    pub protocol: u32,
    /// `sys_exit_accept4.ret` (the same in `sys_exit_accept`).
    pub accept_ret: u32,
}

/// Load-time configuration, passed as the global `CONFIG`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Config {
    /// Only this address family, when nonzero (`-4`, `-6`).
    pub family: u16,
    /// Local ports in `lports` (`-L`).
    pub n_lports: u16,
    /// Remote ports in `dports` (`-D`).
    pub n_dports: u16,
    /// Keeps the struct free of padding.
    pub _pad: [u16; 3],
    /// Local ports to keep, when `n_lports` is nonzero.
    pub lports: [u16; MAX_PORTS],
    /// Remote ports to keep, when `n_dports` is nonzero.
    pub dports: [u16; MAX_PORTS],
    /// Struct offsets, from BTF.
    pub sock: SockOffsets,
    /// Record offsets for the classic tracepoint programs.
    pub tp: TracepointOffsets,
}

/// `Owner::flags`: the socket connected out, so its SYN is in `bytes_acked`.
pub const OWNER_ACTIVE: u32 = 1;
/// `Owner::flags`: the socket sent a FIN (it went through FIN_WAIT1 or
/// LAST_ACK), which `bytes_acked` includes once acknowledged.
pub const OWNER_FIN_SENT: u32 = 2;

/// `Owner::flags`: the socket reached ESTABLISHED. A passive socket that
/// never did is a loser of the kernel's race to create a connection's
/// child socket, closed at once, not a session.
pub const OWNER_ESTABLISHED: u32 = 4;

/// `Owner::flags`: the owner, when it was taken, was in the traced cgroup
/// (`-c`, `-- CMD`), on a traced CPU (`-C`), and in the pinned sets: the
/// socket closes later where the current task may be anyone.
pub const OWNER_IN_SCOPE: u32 = 8;

/// What is known of a socket while it lives: when it was born and which
/// process owns it.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Owner {
    /// `bpf_ktime_get_ns` at the first state below FIN_WAIT1.
    pub birth_ns: u64,
    /// The owning process, or 0 until one is seen.
    pub pid: u32,
    /// `OWNER_*` bits: which control segments the byte counters include.
    pub flags: u32,
    /// The owning process's command.
    pub comm: [u8; TASK_COMM_LEN],
}

/// One closed TCP session.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Event {
    /// Local address: 4 bytes for IPv4, 16 for IPv6.
    pub saddr: [u8; 16],
    /// Remote address, likewise.
    pub daddr: [u8; 16],
    /// Lifetime, in nanoseconds.
    pub span_ns: u64,
    /// Payload bytes received: `bytes_received` less the peer's FIN,
    /// which takes a sequence number too.
    pub rx_bytes: u64,
    /// Payload bytes sent and acknowledged: `bytes_acked` less the SYN and
    /// FIN that were.
    pub tx_bytes: u64,
    /// Owning process.
    pub pid: u32,
    /// Local port.
    pub lport: u16,
    /// Remote port.
    pub dport: u16,
    /// `AF_INET` or `AF_INET6`.
    pub family: u16,
    /// Keeps `comm` aligned.
    pub _pad: [u16; 3],
    /// Owning process's command.
    pub comm: [u8; TASK_COMM_LEN],
}

crate::pod!(SockOffsets, TracepointOffsets, Config, Owner, Event);

/// `TALLIES` slot of the exporter's collector: sessions closed.
pub const TALLY_SESSIONS: u32 = 0;
/// `TALLIES` slot: bytes received by closed sessions.
pub const TALLY_RX: u32 = 1;
/// `TALLIES` slot: bytes sent (and acknowledged) by closed sessions.
pub const TALLY_TX: u32 = 2;
/// Slots the collector tallies.
pub const TALLY_SLOTS: u32 = 3;

/// Live sockets' [`Owner`]s, by the socket's address; user space sizes
/// it.
pub const SOCKS: &str = "SOCKS";

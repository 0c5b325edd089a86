//! TCP session lifetimes, from `sock:inet_sock_set_state`.
//!
//! A socket's birth is its first state below FIN_WAIT1, and its event is
//! sent when it reaches CLOSE. The owner is taken only where the socket's
//! process is surely the one running: at connect (SYN_SENT), at close or
//! shutdown (FIN_WAIT1, LAST_ACK) and when accept(2) returns it. A server's
//! sockets change state in softirq context, where the running task is
//! whoever was interrupted; peers that take the task there report
//! `swapper` or a stranger as the owner.
#![no_std]
#![no_main]

use aya_ebpf::{
    EbpfContext, Global,
    bindings::BPF_NOEXIST,
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{btf_tracepoint, map, raw_tracepoint},
    maps::{HashMap, PerCpuArray},
    programs::{BtfTracePointContext, RawTracePointContext, TracePointContext},
};
use rtrace_common::{
    events::LOST_TABLE,
    tcplife::{
        AF_INET, AF_INET6, Config, Event, MAX_PORTS, OWNER_ACTIVE, OWNER_ESTABLISHED,
        OWNER_FIN_SENT, OWNER_IN_SCOPE, Owner, SockOffsets, TALLY_RX, TALLY_SESSIONS, TALLY_TX,
    },
};
use rtrace_ebpf::{
    count_error,
    events::{emit, tally, tally_only},
    file_of_fd, global, read_kernel, read_ptr, targets,
};

rtrace_ebpf::event_map!();

const TCP_ESTABLISHED: i32 = 1;
const TCP_SYN_SENT: i32 = 2;
const TCP_FIN_WAIT1: i32 = 4;
const TCP_CLOSE: i32 = 7;
const TCP_LAST_ACK: i32 = 9;
const IPPROTO_TCP: u16 = 6;
/// `SOCK_DONE` in `sk_flags`: set when the peer's FIN is processed.
const SOCK_DONE: u64 = 1 << 1;
/// `BPF_F_NO_PREALLOC`: sockets come and go, and most machines have far
/// fewer open than the table could hold.
const NO_PREALLOC: u32 = 1;

#[unsafe(no_mangle)]
static CONFIG: Global<Config> = Global::new(unsafe { core::mem::zeroed() });

/// Live sockets, by address; user space sets the size.
#[map]
static SOCKS: HashMap<u64, Owner> = HashMap::with_max_entries(65536, NO_PREALLOC);
/// Where an event is put together.
#[map]
static SCRATCH: PerCpuArray<Event> = PerCpuArray::with_max_entries(1, 0);

#[inline(always)]
fn port_listed(ports: &[u16; MAX_PORTS], n: u16, port: u16) -> bool {
    if n == 0 {
        return true;
    }
    for (i, p) in ports.iter().enumerate() {
        if i as u16 >= n {
            break;
        }
        if *p == port {
            return true;
        }
    }
    false
}

/// The current process and its command.
#[inline(always)]
fn current() -> (u32, [u8; 16]) {
    (
        (bpf_get_current_pid_tgid() >> 32) as u32,
        bpf_get_current_comm().unwrap_or([0; 16]),
    )
}

/// [`OWNER_IN_SCOPE`] if the current task is in the traced cgroup.
#[inline(always)]
fn scope_flag() -> u32 {
    if targets::current_in_cgroup() {
        OWNER_IN_SCOPE
    } else {
        0
    }
}

/// Adds `flags` to `sk`'s entry and, with `claim`, makes the current
/// process its owner unless it has one; `false` if `sk` has no entry.
#[inline(always)]
fn mark(sk: u64, flags: u32, claim: bool) -> bool {
    let Some(o) = SOCKS.get_ptr_mut(sk) else {
        return false;
    };
    // SAFETY: `o` is a SOCKS value; a racing claim can only write the same
    // kind of data.
    unsafe {
        (*o).flags |= flags;
        if claim && (*o).pid == 0 {
            ((*o).pid, (*o).comm) = current();
            (*o).flags |= scope_flag();
        }
    }
    true
}

/// Handles one state change of socket `sk`; `protocol` is the record's,
/// or `None` where it must be read from the socket.
#[inline(always)]
fn state_change<C: EbpfContext>(ctx: &C, sk: u64, newstate: i32, protocol: Option<u16>) {
    let cfg = global(&CONFIG);
    let so = &cfg.sock;
    let skp = sk as *const u8;
    let protocol = match protocol {
        Some(p) => p,
        None => read_kernel::<u16>(skp, so.protocol).unwrap_or(0),
    };
    if protocol != IPPROTO_TCP {
        return;
    }
    if newstate < TCP_FIN_WAIT1 {
        let family = read_kernel::<u16>(skp, so.family).unwrap_or(0);
        if cfg.family != 0 && family != cfg.family {
            return;
        }
        let (flags, claim) = match newstate {
            TCP_SYN_SENT => (OWNER_ACTIVE, true),
            TCP_ESTABLISHED => (OWNER_ESTABLISHED, false),
            _ => (0, false),
        };
        // Keep the first birth: ESTABLISHED follows SYN_SENT or SYN_RECV.
        if mark(sk, flags, claim) {
            return;
        }
        let (pid, comm, scope) = if claim {
            let (pid, comm) = current();
            (pid, comm, scope_flag())
        } else {
            (0, [0; 16], 0)
        };
        let owner = Owner {
            birth_ns: unsafe { bpf_ktime_get_ns() },
            pid,
            flags: flags | scope,
            comm,
        };
        // An insert that fails because another CPU's came first is no loss.
        if SOCKS.insert(sk, owner, u64::from(BPF_NOEXIST)).is_err() && !mark(sk, flags, claim) {
            count_error(LOST_TABLE);
        }
        return;
    }
    if newstate == TCP_FIN_WAIT1 || newstate == TCP_LAST_ACK {
        mark(sk, OWNER_FIN_SENT, true);
        return;
    }
    if newstate != TCP_CLOSE {
        return;
    }
    // Sockets born before tracing began have no birth: skip them, as the
    // lifetime would be wrong.
    let Some(o) = SOCKS.get_ptr(sk) else {
        return;
    };
    // SAFETY: `o` is a SOCKS value, read before it is removed below.
    let owner = unsafe { *o };
    let _ = SOCKS.remove(sk);
    if owner.flags & (OWNER_ACTIVE | OWNER_ESTABLISHED) == 0 {
        return;
    }
    let (pid, comm, scope) = if owner.pid != 0 {
        (owner.pid, owner.comm, owner.flags)
    } else {
        // Closed without a close(2) of its own, such as by a reset
        // before accept: the current task is the best left.
        let (pid, comm) = current();
        (pid, comm, scope_flag())
    };
    if !targets::admits(pid, pid) || scope & OWNER_IN_SCOPE == 0 {
        return;
    }
    let lport = u16::from_be(read_kernel::<u16>(skp, so.sport).unwrap_or(0));
    let dport = u16::from_be(read_kernel::<u16>(skp, so.dport).unwrap_or(0));
    if !port_listed(&cfg.lports, cfg.n_lports, lport)
        || !port_listed(&cfg.dports, cfg.n_dports, dport)
    {
        return;
    }
    let (rx_fin, tx_fin) = fins(skp, so, owner.flags);
    let rx = read_kernel::<u64>(skp, so.bytes_received)
        .unwrap_or(0)
        .saturating_sub(rx_fin);
    let tx = read_kernel::<u64>(skp, so.bytes_acked)
        .unwrap_or(0)
        .saturating_sub(tx_fin + u64::from(owner.flags & OWNER_ACTIVE));
    if tally_only() {
        tally(TALLY_SESSIONS, 1);
        tally(TALLY_RX, rx);
        tally(TALLY_TX, tx);
        return;
    }
    let Some(e) = SCRATCH.get_ptr_mut(0) else {
        return;
    };
    let family = read_kernel::<u16>(skp, so.family).unwrap_or(0);
    // SAFETY: `e` is this CPU's scratch event.
    unsafe {
        (*e).saddr = [0; 16];
        (*e).daddr = [0; 16];
        if family == AF_INET6 {
            (*e).saddr = read_kernel(skp, so.v6_rcv_saddr).unwrap_or([0; 16]);
            (*e).daddr = read_kernel(skp, so.v6_daddr).unwrap_or([0; 16]);
        } else if family == AF_INET {
            let s: [u8; 4] = read_kernel(skp, so.rcv_saddr).unwrap_or([0; 4]);
            let d: [u8; 4] = read_kernel(skp, so.daddr).unwrap_or([0; 4]);
            (&mut (*e).saddr)[..4].copy_from_slice(&s);
            (&mut (*e).daddr)[..4].copy_from_slice(&d);
        } else {
            return;
        }
        (*e).span_ns = bpf_ktime_get_ns().saturating_sub(owner.birth_ns);
        (*e).rx_bytes = rx;
        (*e).tx_bytes = tx;
        (*e).pid = pid;
        (*e).lport = lport;
        (*e).dport = dport;
        (*e).family = family;
        (*e)._pad = [0; 3];
        (*e).comm = comm;
        emit(&EVENTS, ctx, &*e);
    }
}

/// Whether the peer's FIN was received, and whether ours was acknowledged,
/// as 0 or 1: each took a sequence number that the byte counters include.
#[inline(always)]
fn fins(sk: *const u8, so: &SockOffsets, owner_flags: u32) -> (u64, u64) {
    let flags = read_kernel::<u64>(sk, so.sk_flags).unwrap_or(0);
    let una = read_kernel::<u32>(sk, so.snd_una).unwrap_or(0);
    let write = read_kernel::<u32>(sk, so.write_seq).unwrap_or(1);
    (
        u64::from(flags & SOCK_DONE != 0),
        u64::from(owner_flags & OWNER_FIN_SENT != 0 && una == write),
    )
}

#[btf_tracepoint(function = "inet_sock_set_state")]
pub fn btf_inet_sock_set_state(ctx: BtfTracePointContext) -> i32 {
    let sk: u64 = ctx.arg(0);
    let newstate: i32 = ctx.arg(2);
    state_change(&ctx, sk, newstate, None);
    0
}

#[raw_tracepoint(tracepoint = "inet_sock_set_state")]
pub fn raw_inet_sock_set_state(ctx: RawTracePointContext) -> i32 {
    let sk: u64 = ctx.arg(0);
    let newstate: i32 = ctx.arg(2);
    state_change(&ctx, sk, newstate, None);
    0
}

rtrace_ebpf::tracepoint! {
    fn tp_inet_sock_set_state(ctx) {
        let tp = &global(&CONFIG).tp;
        // SAFETY: the offsets come from the tracepoint's format file.
        let read = || unsafe {
            Some((
                ctx.read_at::<u64>(tp.skaddr as usize).ok()?,
                ctx.read_at::<i32>(tp.newstate as usize).ok()?,
                ctx.read_at::<u16>(tp.protocol as usize).ok()?,
            ))
        };
        if let Some((sk, newstate, protocol)) = read() {
            state_change(&ctx, sk, newstate, Some(protocol));
        }
    }
}

/// accept(2) returned descriptor `fd`: its socket belongs to the caller.
#[inline(always)]
fn accepted(ctx: &TracePointContext) {
    let cfg = global(&CONFIG);
    let so = &cfg.sock;
    let Ok(fd) = (unsafe { ctx.read_at::<i64>(cfg.tp.accept_ret as usize) }) else {
        return;
    };
    if fd < 0 {
        return;
    }
    let file = file_of_fd(&so.fd, fd);
    let sk = read_ptr(read_ptr(file, so.file_private), so.socket_sk);
    if !sk.is_null() {
        mark(sk as u64, 0, true);
    }
}

rtrace_ebpf::tracepoint! {
    fn tp_sys_exit_accept4(ctx) {
        accepted(&ctx);
    }
}

rtrace_ebpf::tracepoint! {
    fn tp_sys_exit_accept(ctx) {
        accepted(&ctx);
    }
}

//! Event streaming shared by the event tools: a BPF ring buffer, or per-CPU
//! perf buffers where the kernel has none, read with tokio; its size chosen
//! by the user, and loss counters reported at exit.

use std::{num::NonZeroU32, ops::ControlFlow, str::FromStr, task::Poll};

use anyhow::Context as _;
use aya::{
    Ebpf, EbpfLoader,
    maps::{
        MapData, PerCpuArray, PerfEventArray, RingBuf,
        perf::{PerfEvent, PerfEventArrayBuffer},
    },
    util::online_cpus,
};
use rtrace_common::events::{LOST_EVENT, LOST_SLOTS, LOST_TABLE};
use tokio::io::unix::AsyncFd;

use super::Signals;
use crate::features::{Features, Mechanism};

/// The event map's name in every event object: a ring buffer or a perf
/// event array.
pub const RING: &str = "EVENTS";
/// The loss counters' map name in every event object.
pub const LOST: &str = "LOST";

/// A ring buffer size: bytes, or with a K, M or G suffix. The kernel needs
/// a power of two of at least a page, so it is rounded up to one.
#[derive(Clone, Copy, Debug)]
pub struct BufferSize(pub NonZeroU32);

impl FromStr for BufferSize {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim();
        let (digits, unit) = match t.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
            Some((i, _)) => t.split_at(i),
            None => (t, ""),
        };
        let shift = match unit.to_ascii_uppercase().trim_end_matches(['B', 'I']) {
            "" => 0,
            "K" => 10,
            "M" => 20,
            "G" => 30,
            _ => return Err(format!("bad size {s:?}: use bytes or K, M, G")),
        };
        let n: u64 = digits
            .parse()
            .map_err(|_| format!("bad size {s:?}: use bytes or K, M, G"))?;
        let bytes = (n << shift).max(4096).next_power_of_two();
        u32::try_from(bytes)
            .ok()
            .filter(|&b| b <= 1 << 30)
            .and_then(NonZeroU32::new)
            .map(Self)
            .ok_or_else(|| format!("size {s:?} is over the 1G a ring buffer may have"))
    }
}

/// The transport flags every event tool takes.
#[derive(Debug, clap::Args)]
pub struct BufferArgs {
    /// Event buffer size (bytes, or with K/M/G; rounded up to a power of
    /// two): the ring buffer's, or shared among the CPUs' perf buffers.
    /// Raise it if events are reported lost.
    #[arg(long, value_name = "SIZE", default_value = "16M")]
    pub buffer_size: BufferSize,
    /// Send events through per-CPU perf buffers even where the kernel has a
    /// BPF ring buffer (which keeps events in order and is cheaper).
    #[arg(long)]
    pub perf_buffer: bool,
}

/// How events travel from the programs to user space.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// One BPF ring buffer shared by all CPUs (5.8+).
    Ring,
    /// A perf buffer per CPU: the fallback for older kernels.
    Perf,
}

impl Transport {
    /// The best transport this kernel offers, and why the ring buffer was
    /// passed over, if it was.
    pub fn choose(features: &mut Features, args: &BufferArgs) -> (Self, Option<String>) {
        if args.perf_buffer {
            return (Self::Perf, Some("--perf-buffer".to_owned()));
        }
        match features.check(Mechanism::RingBuffer) {
            Ok(()) => (Self::Ring, None),
            Err(why) => (Self::Perf, Some(why)),
        }
    }

    /// The name `-v` and JSON show.
    pub fn name(self) -> &'static str {
        match self {
            Self::Ring => "ring buffer",
            Self::Perf => "perf buffer",
        }
    }

    /// Picks the object built for this transport.
    pub fn object<'a>(self, ring: &'a [u8], perf: &'a [u8]) -> &'a [u8] {
        match self {
            Self::Ring => ring,
            Self::Perf => perf,
        }
    }

    /// Sizes the ring buffer; perf buffers are sized when opened.
    pub fn size<'a, 'b>(
        self,
        loader: &'b mut EbpfLoader<'a>,
        args: &BufferArgs,
    ) -> &'b mut EbpfLoader<'a> {
        match self {
            Self::Ring => loader.map_max_entries(RING, args.buffer_size.0.get()),
            Self::Perf => loader,
        }
    }

    /// Says on stderr which transport was chosen, and why, under `-v`.
    pub fn report(self, tool: &str, why: Option<&str>) {
        match why {
            Some(why) => eprintln!("rtrace: {tool}: events through {} ({why})", self.name()),
            None => eprintln!("rtrace: {tool}: events through {}", self.name()),
        }
    }
}

type PerfBuf = PerfEventArrayBuffer<MapData>;

enum Source {
    Ring(AsyncFd<RingBuf<MapData>>),
    Perf {
        cpus: Vec<AsyncFd<PerfBuf>>,
        /// Samples the kernel reported dropped (`PERF_RECORD_LOST`).
        lost: u64,
        /// Where a sample that wraps around its buffer is put together.
        joined: Vec<u8>,
    },
}

/// Events arriving from the kernel.
pub struct EventStream {
    source: Source,
}

impl EventStream {
    /// Takes the object's event map and opens it for reading.
    pub fn new(ebpf: &mut Ebpf, transport: Transport, args: &BufferArgs) -> anyhow::Result<Self> {
        let map = ebpf
            .take_map(RING)
            .with_context(|| format!("map {RING} missing"))?;
        let source = match transport {
            Transport::Ring => {
                let ring = RingBuf::try_from(map)?;
                // SAFETY: the ring buffer owns its map's file descriptor,
                // which stays open and the same for as long as the `RingBuf`
                // lives, and the `AsyncFd` owns the `RingBuf`.
                let ring = unsafe { AsyncFd::register(ring) }
                    .map_err(|e| anyhow::anyhow!("cannot poll the ring buffer: {e}"))?;
                Source::Ring(ring)
            }
            Transport::Perf => {
                let mut array = PerfEventArray::try_from(map)?;
                let online = online_cpus()
                    .map_err(|(what, e)| anyhow::anyhow!("cannot read {what}: {e}"))?;
                let pages = perf_pages(args.buffer_size.0.get(), online.len());
                let mut cpus = Vec::with_capacity(online.len());
                for cpu in online {
                    let buf = array
                        .open(cpu, Some(pages))
                        .with_context(|| format!("cannot open the perf buffer of CPU {cpu}"))?;
                    // SAFETY: as above, the buffer owns its perf event fd.
                    let buf = unsafe { AsyncFd::register(buf) }
                        .map_err(|e| anyhow::anyhow!("cannot poll the perf buffer: {e}"))?;
                    cpus.push(buf);
                }
                Source::Perf {
                    cpus,
                    lost: 0,
                    joined: Vec::new(),
                }
            }
        };
        Ok(Self { source })
    }

    /// Hands every event to `handle` until a signal arrives or `handle`
    /// returns `false`; events already in the buffers are handled first.
    pub async fn run(
        &mut self,
        signals: &mut Signals,
        mut handle: impl FnMut(&[u8]) -> anyhow::Result<bool>,
    ) -> anyhow::Result<()> {
        match &mut self.source {
            Source::Ring(ring) => loop {
                tokio::select! {
                    guard = ring.readable_mut() => {
                        let mut guard = guard.context("cannot poll the ring buffer")?;
                        if !drain_ring(guard.get_inner_mut(), &mut handle)? {
                            return Ok(());
                        }
                        guard.clear_ready();
                    }
                    () = signals.recv() => {
                        drain_ring(ring.get_mut(), &mut handle)?;
                        return Ok(());
                    }
                }
            },
            Source::Perf { cpus, lost, joined } => loop {
                tokio::select! {
                    ready = ready_cpu(cpus) => {
                        let i = ready.context("cannot poll the perf buffers")?;
                        if !drain_perf(cpus[i].get_mut(), lost, joined, &mut handle)? {
                            return Ok(());
                        }
                    }
                    () = signals.recv() => {
                        for cpu in cpus.iter_mut() {
                            if !drain_perf(cpu.get_mut(), lost, joined, &mut handle)? {
                                break;
                            }
                        }
                        return Ok(());
                    }
                }
            },
        }
    }

    /// Events the kernel dropped from full perf buffers so far.
    pub fn perf_lost(&self) -> u64 {
        match &self.source {
            Source::Ring(_) => 0,
            Source::Perf { lost, .. } => *lost,
        }
    }
}

/// Pages per CPU for perf buffers sharing `total` bytes: a power of two of
/// at least one page, as the kernel requires.
fn perf_pages(total: u32, cpus: usize) -> usize {
    // SAFETY: sysconf has no preconditions.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
    let per_cpu = total as usize / cpus.max(1) / page.max(1);
    match per_cpu {
        0 | 1 => 1,
        n if n.is_power_of_two() => n,
        n => n.next_power_of_two() / 2,
    }
}

/// The index of a perf buffer with data; its readiness is cleared, as its
/// caller reads everything in it.
async fn ready_cpu(cpus: &[AsyncFd<PerfBuf>]) -> std::io::Result<usize> {
    std::future::poll_fn(|cx| {
        for (i, cpu) in cpus.iter().enumerate() {
            if let Poll::Ready(ready) = cpu.poll_read_ready(cx) {
                ready?.clear_ready();
                return Poll::Ready(Ok(i));
            }
        }
        Poll::Pending
    })
    .await
}

/// Hands every event now in `ring` to `handle`; `false` if `handle` asked
/// to stop.
fn drain_ring(
    ring: &mut RingBuf<MapData>,
    handle: &mut impl FnMut(&[u8]) -> anyhow::Result<bool>,
) -> anyhow::Result<bool> {
    while let Some(item) = ring.next() {
        if !handle(&item)? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Hands every event now in one CPU's perf buffer to `handle`, adding up
/// the losses it reports; `false` if `handle` asked to stop.
fn drain_perf(
    buf: &mut PerfBuf,
    lost: &mut u64,
    joined: &mut Vec<u8>,
    handle: &mut impl FnMut(&[u8]) -> anyhow::Result<bool>,
) -> anyhow::Result<bool> {
    let flow = buf.try_fold((), |(), event| {
        let result = match event {
            PerfEvent::Sample { head, tail: [] } => handle(head),
            PerfEvent::Sample { head, tail } => {
                joined.clear();
                joined.extend_from_slice(head);
                joined.extend_from_slice(tail);
                handle(joined)
            }
            PerfEvent::Lost { count } => {
                *lost += count;
                Ok(true)
            }
        };
        match result {
            Ok(true) => ControlFlow::Continue(()),
            Ok(false) => ControlFlow::Break(Ok(false)),
            Err(e) => ControlFlow::Break(Err(e)),
        }
    });
    match flow {
        ControlFlow::Continue(()) => Ok(true),
        ControlFlow::Break(result) => result,
    }
}

/// The fixed-size event `T` at the start of `record`, or `None` if the
/// record is too short. Perf buffer records are padded past the event's
/// end, and neither transport promises `T`'s alignment.
pub fn record<T: aya::Pod>(record: &[u8]) -> Option<T> {
    if record.len() < size_of::<T>() {
        return None;
    }
    // SAFETY: `T` is plain old data and the record holds one.
    Some(unsafe { std::ptr::read_unaligned(record.as_ptr().cast()) })
}

/// Events lost so far, summed over CPUs: (buffer full, table full).
pub fn lost(ebpf: &Ebpf) -> anyhow::Result<(u64, u64)> {
    let map: PerCpuArray<_, u64> = PerCpuArray::try_from(
        ebpf.map(LOST)
            .with_context(|| format!("map {LOST} missing"))?,
    )?;
    let sum = |slot: u32| -> anyhow::Result<u64> { Ok(map.get(&slot, 0)?.iter().sum()) };
    debug_assert_eq!(LOST_SLOTS, 2);
    Ok((sum(LOST_EVENT)?, sum(LOST_TABLE)?))
}

/// Reports lost events on stderr, if any.
pub fn report_lost(ebpf: &Ebpf, stream: &EventStream) -> anyhow::Result<()> {
    let (full, table) = lost(ebpf)?;
    // A full perf buffer fails the helper, which the programs count, and
    // the kernel reports the same drops again as PERF_RECORD_LOST: take
    // whichever saw more rather than the sum.
    let full = full.max(stream.perf_lost());
    if full > 0 {
        eprintln!("rtrace: warning: {full} events lost (event buffer full; raise --buffer-size)");
    }
    if table > 0 {
        eprintln!("rtrace: warning: {table} events lost (in-flight table full)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::BufferSize;

    #[test]
    fn sizes_round_up_to_powers_of_two() {
        let b = |s: &str| s.parse::<BufferSize>().map(|b| b.0.get());
        assert_eq!(b("16M"), Ok(16 << 20));
        assert_eq!(b("100k"), Ok(128 << 10));
        assert_eq!(b("1"), Ok(4096));
        assert_eq!(b("1G"), Ok(1 << 30));
        assert!(b("2G").is_err());
        assert!(b("12Q").is_err());
        assert!(b("").is_err());
    }
}

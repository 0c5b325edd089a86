//! Event streaming shared by the event tools: a BPF ring buffer, or per-CPU
//! perf buffers where the kernel has none, read with tokio. Which one a
//! tool gets is decided with attaching (`crate::kernel::transport`).

use std::{ops::ControlFlow, task::Poll};

use anyhow::Context as _;
use aya::{
    Ebpf,
    maps::{
        Array, MapData, PerfEventArray, RingBuf,
        perf::{PerfEvent, PerfEventArrayBuffer},
    },
    util::online_cpus,
};
use rtrace_common::events::EVENTS_READER;
use tokio::io::unix::AsyncFd;

use crate::kernel::transport::{RING, Transport};

type PerfBuf = PerfEventArrayBuffer<MapData>;

enum Source {
    Ring(AsyncFd<RingBuf<MapData>>),
    Perf {
        cpus: Vec<AsyncFd<PerfBuf>>,
        /// Samples the kernel reported dropped (`PERF_RECORD_LOST`).
        lost: u64,
        /// Where a sample that wraps around its buffer is put together.
        joined: Vec<u8>,
        /// The buffer [`EventStream::ready`] found readable.
        ready: Option<usize>,
    },
}

/// Events arriving from the kernel.
pub struct EventStream {
    source: Source,
    /// With a ring buffer, the programs' `EVENTS_READER` flag: 1 while
    /// this side sleeps until woken, 0 while it reads on a timer.
    reader: Option<Array<MapData, u32>>,
}

impl EventStream {
    /// Takes the object's event map and opens it for reading.
    /// `bytes` is the buffer's size, shared among the CPUs' perf buffers.
    pub fn new(ebpf: &mut Ebpf, transport: Transport, bytes: u32) -> anyhow::Result<Self> {
        let map = ebpf
            .take_map(RING)
            .with_context(|| format!("map {RING} missing"))?;
        let reader = match (transport, ebpf.take_map(EVENTS_READER)) {
            (Transport::Ring, Some(m)) => Some(Array::try_from(m)?),
            _ => None,
        };
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
                let pages = perf_pages(bytes, online.len());
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
                    ready: None,
                }
            }
        };
        let mut stream = Self { source, reader };
        // Until the first records come, the programs wake this side.
        stream.sleep(true)?;
        Ok(stream)
    }

    /// Waits until events may be there to read. Readiness is cleared
    /// before [`drain`](Self::drain) reads, so an event that arrives while
    /// draining wakes the next wait instead of being missed.
    pub async fn ready(&mut self) -> anyhow::Result<()> {
        match &mut self.source {
            Source::Ring(ring) => {
                let mut guard = ring
                    .readable_mut()
                    .await
                    .context("cannot poll the ring buffer")?;
                guard.clear_ready();
                Ok(())
            }
            Source::Perf { cpus, ready, .. } => {
                *ready = Some(
                    ready_cpu(cpus)
                        .await
                        .context("cannot poll the perf buffers")?,
                );
                Ok(())
            }
        }
    }

    /// Whether the stream is read on a timer while records keep coming: a
    /// ring buffer's programs wake user space only while it says it sleeps
    /// ([`EventStream::sleep`]), or once `rtrace_common::events::WAKE_BYTES`
    /// are waiting.
    pub fn polled(&self) -> bool {
        self.reader.is_some()
    }

    /// Tells the programs whether this side sleeps until they wake it
    /// (`true`) or reads on its own timer.
    pub fn sleep(&mut self, sleeping: bool) -> anyhow::Result<()> {
        if let Some(reader) = &mut self.reader {
            reader
                .set(0, u32::from(sleeping), 0)
                .context("cannot update map EVENTS_READER")?;
            // The next look at the ring must not pass the flag's store:
            // either it finds a record committed as the flag went up, or
            // that record's program sees the flag and wakes this side.
            std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        }
        Ok(())
    }

    /// Hands every event now readable to `handle`.
    pub fn drain(&mut self, handle: impl FnMut(&[u8]) -> anyhow::Result<()>) -> anyhow::Result<()> {
        self.drain_from(false, handle)
    }

    /// Hands every event in any buffer to `handle`, as at the end of a run.
    pub fn drain_all(
        &mut self,
        handle: impl FnMut(&[u8]) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        self.drain_from(true, handle)
    }

    /// Drains the ring, or the perf buffer found ready (every perf buffer
    /// with `all`).
    fn drain_from(
        &mut self,
        all: bool,
        mut handle: impl FnMut(&[u8]) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        match &mut self.source {
            Source::Ring(ring) => drain_ring(ring.get_mut(), &mut handle),
            Source::Perf {
                cpus,
                lost,
                joined,
                ready,
            } => {
                let which: Vec<usize> = if all {
                    (0..cpus.len()).collect()
                } else {
                    ready.take().into_iter().collect()
                };
                for i in which {
                    drain_perf(cpus[i].get_mut(), lost, joined, &mut handle)?;
                }
                Ok(())
            }
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

/// Pages per CPU for perf buffers sharing `total` bytes: a power of two,
/// as the kernel requires, of at least 64 KiB, so that a machine of many
/// CPUs still holds several of the largest records (an exec's, near 8 KiB)
/// in each.
fn perf_pages(total: u32, cpus: usize) -> usize {
    // SAFETY: sysconf has no preconditions.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
    let least = (64 << 10) / page.max(1);
    let per_cpu = (total as usize / cpus.max(1) / page.max(1)).max(least);
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

/// Hands every event now in `ring` to `handle`.
fn drain_ring(
    ring: &mut RingBuf<MapData>,
    handle: &mut impl FnMut(&[u8]) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    while let Some(item) = ring.next() {
        // An empty record only wakes this side (see the programs' `Sink`).
        if !item.is_empty() {
            handle(&item)?;
        }
    }
    Ok(())
}

/// Hands every event now in one CPU's perf buffer to `handle`, adding up
/// the losses it reports.
fn drain_perf(
    buf: &mut PerfBuf,
    lost: &mut u64,
    joined: &mut Vec<u8>,
    handle: &mut impl FnMut(&[u8]) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
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
                Ok(())
            }
        };
        match result {
            Ok(()) => ControlFlow::Continue(()),
            Err(e) => ControlFlow::Break(e),
        }
    });
    match flow {
        ControlFlow::Continue(()) => Ok(()),
        ControlFlow::Break(e) => Err(e),
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

#[cfg(test)]
mod tests {
    use super::perf_pages;

    #[test]
    fn perf_buffers_share_the_size_with_a_floor() {
        // 4 KiB pages on x86-64.
        assert_eq!(perf_pages(1 << 20, 2), 128);
        assert_eq!(perf_pages(3 << 20, 2), 256);
        assert_eq!(perf_pages(1 << 20, 256), 16);
        assert_eq!(perf_pages(4096, 1), 16);
    }
}

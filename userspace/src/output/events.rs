//! Event streaming shared by the event tools: a BPF ring buffer read with
//! tokio, its size chosen by the user, and loss counters reported at exit.

use std::{num::NonZeroU32, str::FromStr};

use anyhow::Context as _;
use aya::{
    Ebpf,
    maps::{MapData, PerCpuArray, RingBuf},
};
use rtrace_common::events::{LOST_EVENT, LOST_SLOTS, LOST_TABLE};
use tokio::io::unix::AsyncFd;

use super::Signals;

/// The ring buffer's map name in every event object.
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

/// The ring buffer flag every event tool takes.
#[derive(Debug, clap::Args)]
pub struct BufferArgs {
    /// Ring buffer size (bytes, or with K/M/G; rounded up to a power of
    /// two). Raise it if events are reported lost.
    #[arg(long, value_name = "SIZE", default_value = "16M")]
    pub buffer_size: BufferSize,
}

/// Events arriving from the kernel.
pub struct EventStream {
    ring: AsyncFd<RingBuf<MapData>>,
}

impl EventStream {
    /// Takes the object's ring buffer.
    pub fn new(ebpf: &mut Ebpf) -> anyhow::Result<Self> {
        let map = ebpf
            .take_map(RING)
            .with_context(|| format!("map {RING} missing"))?;
        let ring = RingBuf::try_from(map)?;
        // SAFETY: the ring buffer owns its map's file descriptor, which
        // stays open and the same for as long as the `RingBuf` lives, and the
        // `AsyncFd` owns the `RingBuf`.
        let ring = unsafe { AsyncFd::register(ring) }
            .map_err(|e| anyhow::anyhow!("cannot poll the ring buffer: {e}"))?;
        Ok(Self { ring })
    }

    /// Hands every event to `handle` until a signal arrives or `handle`
    /// returns `false`; events already in the buffer are handled first.
    pub async fn run(
        &mut self,
        signals: &mut Signals,
        mut handle: impl FnMut(&[u8]) -> anyhow::Result<bool>,
    ) -> anyhow::Result<()> {
        loop {
            tokio::select! {
                guard = self.ring.readable_mut() => {
                    let mut guard = guard.context("cannot poll the ring buffer")?;
                    if !drain(guard.get_inner_mut(), &mut handle)? {
                        return Ok(());
                    }
                    guard.clear_ready();
                }
                () = signals.recv() => {
                    drain(self.ring.get_mut(), &mut handle)?;
                    return Ok(());
                }
            }
        }
    }
}

/// Hands every event now in `ring` to `handle`; `false` if `handle` asked
/// to stop.
fn drain(
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

/// Events lost so far, summed over CPUs: (ring buffer full, table full).
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
pub fn report_lost(ebpf: &Ebpf) -> anyhow::Result<()> {
    let (full, table) = lost(ebpf)?;
    if full > 0 {
        eprintln!("rtrace: warning: {full} events lost (ring buffer full; raise --buffer-size)");
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

//! How an event tool's records reach user space, chosen with attaching:
//! a BPF ring buffer where the kernel has one, else per-CPU perf buffers
//! (each event object is also built with the `perf` feature for that), and
//! the size the user asked for.

use std::{num::NonZeroU32, str::FromStr};

use crate::kernel::{
    features::Mechanism,
    load::{Kernel, Load},
};

/// The event map's name in every event object: a ring buffer or a perf
/// event array (`rtrace_ebpf::event_map!`).
pub const RING: &str = rtrace_common::events::EVENTS;

/// A size as flags give them, read by [`parse_size`].
#[derive(Debug, PartialEq, Eq)]
pub enum Size {
    /// This many bytes.
    Bytes(u64),
    /// Not bytes, nor a number with K, M or G (`KiB`, `MB` too).
    Bad,
    /// More bytes than 64 bits hold.
    TooBig,
}

/// A size in bytes: a number, or one with a K, M or G suffix (KiB, MiB,
/// GiB; `KB`, `KiB` and the like too), for every flag that takes one.
pub fn parse_size(text: &str) -> Size {
    let t = text.trim();
    let (digits, unit) = match t.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => t.split_at(i),
        None => (t, ""),
    };
    let shift = match unit.to_ascii_uppercase().trim_end_matches(['B', 'I']) {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        _ => return Size::Bad,
    };
    let Ok(n) = digits.parse::<u64>() else {
        return Size::Bad;
    };
    n.checked_mul(1 << shift).map_or(Size::TooBig, Size::Bytes)
}

/// A ring buffer size: bytes, or with a K, M or G suffix. The kernel needs
/// a power of two of at least a page, so it is rounded up to one.
#[derive(Clone, Copy, Debug)]
pub struct BufferSize(pub NonZeroU32);

impl FromStr for BufferSize {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let too_big = || format!("size {s:?} is over the 1G a ring buffer may have");
        let bytes = match parse_size(s) {
            Size::Bad => return Err(format!("bad size {s:?}: use bytes or K, M, G")),
            Size::TooBig => return Err(too_big()),
            Size::Bytes(0) => {
                return Err(format!("size {s:?}: a buffer of no bytes holds no event"));
            }
            Size::Bytes(n) => n,
        };
        let bytes = bytes.max(4096).next_power_of_two();
        u32::try_from(bytes)
            .ok()
            .filter(|&b| b <= 1 << 30)
            .and_then(NonZeroU32::new)
            .map(Self)
            .ok_or_else(too_big)
    }
}

/// The event buffer a tool gets without `--buffer-size`: 1 MiB holds
/// thousands of events of a few hundred bytes while the reader catches
/// up, and a ring buffer's pages count twice in the resident set (they are
/// mapped twice, so that a record may wrap).
pub const DEFAULT_BUFFER: u32 = 1 << 20;

/// The transport flags every event tool takes.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct BufferArgs {
    /// Event buffer size (bytes, or with K/M/G; rounded up to a power of
    /// two): the ring buffer's, or shared among the CPUs' perf buffers (at
    /// least 64K each) [default: 1M, or 2M for execsnoop, whose argv may
    /// be long]. Raise it if events are reported lost.
    #[arg(long, value_name = "SIZE")]
    pub buffer_size: Option<BufferSize>,
    /// Send events through per-CPU perf buffers even where the kernel has a
    /// BPF ring buffer (which keeps events in order and is cheaper).
    #[arg(long)]
    pub perf_buffer: bool,
}

impl BufferArgs {
    /// The buffer's size in bytes: `--buffer-size`, else the tool's
    /// `default`.
    pub fn bytes(&self, default: u32) -> u32 {
        self.buffer_size.map_or(default, |b| b.0.get())
    }
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
    pub fn choose(kernel: &mut Kernel, args: &BufferArgs) -> (Self, Option<String>) {
        if args.perf_buffer {
            return (Self::Perf, Some("--perf-buffer".to_owned()));
        }
        match kernel.check(Mechanism::RingBuffer) {
            Ok(()) => (Self::Ring, None),
            Err(why) => (Self::Perf, Some(why)),
        }
    }

    /// The name `-v` shows.
    pub fn name(self) -> &'static str {
        match self {
            Self::Ring => "ring buffer",
            Self::Perf => "perf buffer",
        }
    }

    /// Sizes the ring buffer to `bytes`; perf buffers are sized when
    /// opened.
    pub fn size(self, load: &mut Load, bytes: u32) {
        if self == Self::Ring {
            load.size(RING, bytes);
        }
    }

    /// Says on stderr which transport was chosen, of how many bytes, and
    /// why, under `-v`.
    pub fn report(self, tool: &str, bytes: u32, why: Option<&str>) {
        let size = format!("{} KiB", bytes / 1024);
        match why {
            Some(why) => eprintln!(
                "rtrace: {tool}: events through {} of {size} ({why})",
                self.name()
            ),
            None => eprintln!("rtrace: {tool}: events through {} of {size}", self.name()),
        }
    }
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
        assert!(b("0").unwrap_err().contains("no event"));
        assert!(b("0K").is_err());
        assert!(b("99999999999999G").unwrap_err().contains("over the 1G"));
    }
}

//! Host name lookup latency, sending events through a BPF ring buffer.
#![no_std]
#![no_main]

use aya_ebpf::{macros::map, maps::RingBuf};

/// Events to user space: a BPF ring buffer; user space sets the size.
#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(1 << 22, 0);

#[path = "../tools/gethostlatency.rs"]
mod gethostlatency;

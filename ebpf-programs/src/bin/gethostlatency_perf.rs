//! Host name lookup latency, sending events through per-CPU perf buffers, for kernels without a ring buffer.
#![no_std]
#![no_main]

use aya_ebpf::{macros::map, maps::PerfEventByteArray};

/// Events to user space: per-CPU perf buffers, for kernels without a ring buffer.
#[map]
static EVENTS: PerfEventByteArray = PerfEventByteArray::new(0);

#[path = "../tools/gethostlatency.rs"]
mod gethostlatency;

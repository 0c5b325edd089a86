//! Sending events to user space, with every event that cannot be sent
//! counted rather than silently dropped.
//!
//! An event tool declares its event map with [`event_map!`]. The build
//! makes each object twice, without and with the `perf` feature, and keeps
//! the second wherever the feature changed it: the map is a BPF ring buffer
//! (5.8 and later) in the first and per-CPU perf buffers, for older
//! kernels, in the second.

use aya_ebpf::{
    EbpfContext, Global,
    bindings::{BPF_F_CURRENT_CPU, BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    helpers::generated::bpf_perf_event_output,
    macros::map,
    maps::{Array, PerCpuArray, PerfEventByteArray, RingBuf},
};

use rtrace_common::events::{LOST_EVENT, WAKE_BYTES};

use crate::count_error;

/// Declares `EVENTS`, the map an event tool sends its records through: a
/// ring buffer, or with the `perf` feature a perf event array. User space
/// sizes it.
#[macro_export]
macro_rules! event_map {
    () => {
        #[cfg(not(feature = "perf"))]
        #[aya_ebpf::macros::map]
        static EVENTS: aya_ebpf::maps::RingBuf = aya_ebpf::maps::RingBuf::with_byte_size(4096, 0);
        #[cfg(feature = "perf")]
        #[aya_ebpf::macros::map]
        static EVENTS: aya_ebpf::maps::PerfEventByteArray =
            aya_ebpf::maps::PerfEventByteArray::new(0);
    };
}

/// Slot 0: 1 while user space waits for a wakeup, 0 while it reads the
/// ring buffer on its own timer. It lives here, so every object that
/// sends events has it.
#[map]
static EVENTS_READER: Array<u32> = Array::with_max_entries(1, 0);

/// Where a tool's events go.
pub trait Sink {
    /// Sends `bytes` as one record; `false` if there was no room.
    fn send<C: EbpfContext>(&self, ctx: &C, bytes: &[u8]) -> bool;

    /// Sends `bytes` as one record and wakes user space at once, even
    /// while it reads on its timer: for a record it must act on before
    /// the process it names is gone.
    fn send_now<C: EbpfContext>(&self, ctx: &C, bytes: &[u8]) -> bool {
        self.send(ctx, bytes)
    }
}

impl Sink for RingBuf {
    /// Wakes user space only while it sleeps ([`EVENTS_READER`]), or once
    /// `WAKE_BYTES` are waiting; while records keep coming it reads the
    /// ring on a short timer instead. A wakeup per record (the default,
    /// as soon as the reader has caught up) is an interrupt sent from
    /// inside the program: in a VM it took 15 µs of execsnoop's 16 µs a
    /// record.
    #[inline(always)]
    fn send<C: EbpfContext>(&self, _ctx: &C, bytes: &[u8]) -> bool {
        let waiting = self.query(u64::from(BPF_RB_AVAIL_DATA));
        let wake = reader_sleeps() || waiting + bytes.len() as u64 >= WAKE_BYTES;
        let flags = if wake {
            BPF_RB_FORCE_WAKEUP
        } else {
            BPF_RB_NO_WAKEUP
        };
        if self.output::<[u8]>(bytes, u64::from(flags)).is_err() {
            return false;
        }
        // The reader may have gone to sleep between the flag's read above
        // and the commit, its last look finding the ring empty or this
        // record not yet written. It raises the flag before that look and
        // the commit is a full barrier, so one of the two sees the other:
        // if the flag is up now, an empty record wakes it.
        if !wake && reader_sleeps() {
            let none = [0u8; 8];
            let _ = self.output::<[u8]>(&none[..0], u64::from(BPF_RB_FORCE_WAKEUP));
        }
        true
    }

    /// A wakeup from inside the program costs microseconds, nothing beside
    /// what the records sent this way tell of (an exec, code in no known
    /// mapping, a loader's new libraries); the reader's timer could leave
    /// a process of 10 ms gone before user space reads its mappings.
    #[inline(always)]
    fn send_now<C: EbpfContext>(&self, _ctx: &C, bytes: &[u8]) -> bool {
        self.output::<[u8]>(bytes, u64::from(BPF_RB_FORCE_WAKEUP))
            .is_ok()
    }
}

/// Whether user space sleeps until woken.
#[inline(always)]
fn reader_sleeps() -> bool {
    EVENTS_READER.get(0).is_some_and(|&s| s != 0)
}

impl Sink for PerfEventByteArray {
    #[inline(always)]
    fn send<C: EbpfContext>(&self, ctx: &C, bytes: &[u8]) -> bool {
        // aya-ebpf's `output` drops the helper's result, which is the only
        // sign of a full buffer this side sees.
        let map = (self as *const Self).cast_mut().cast();
        // SAFETY: a perf event array map definition is the map pointer the
        // helper takes, and `bytes` is readable for its length.
        let ret = unsafe {
            bpf_perf_event_output(
                ctx.as_ptr(),
                map,
                u64::from(BPF_F_CURRENT_CPU as u32),
                bytes.as_ptr().cast_mut().cast(),
                bytes.len() as u64,
            )
        };
        ret == 0
    }
}

/// Sends the `len` bytes at `data` (at most `max`) as one record.
///
/// # Safety
/// `data` must point to at least `max` readable bytes of a map value.
#[inline(always)]
pub unsafe fn emit_bytes<S: Sink, C: EbpfContext>(
    sink: &S,
    ctx: &C,
    data: *const u8,
    len: usize,
    max: usize,
) {
    // The volatile read keeps the bound check in a form the verifier sees.
    let len = unsafe { core::ptr::read_volatile(&raw const len) };
    if len == 0 || len > max {
        return;
    }
    // SAFETY: `len <= max` bytes are readable, per the contract.
    send_counted(sink, ctx, unsafe { core::slice::from_raw_parts(data, len) });
}

/// Sends a whole `T` as one record.
#[inline(always)]
pub fn emit<S: Sink, C: EbpfContext, T>(sink: &S, ctx: &C, value: &T) {
    send_counted(sink, ctx, bytes_of(value));
}

/// Sends a whole `T` as one record and wakes user space at once
/// ([`Sink::send_now`]).
#[inline(always)]
pub fn emit_now<S: Sink, C: EbpfContext, T>(sink: &S, ctx: &C, value: &T) {
    if !sink.send_now(ctx, bytes_of(value)) {
        count_error(LOST_EVENT);
    }
}

/// The bytes of a whole `T`, as a record carries them.
#[inline(always)]
fn bytes_of<T>(value: &T) -> &[u8] {
    // SAFETY: `value` is `size_of::<T>()` readable bytes.
    unsafe {
        core::slice::from_raw_parts((value as *const T).cast::<u8>(), core::mem::size_of::<T>())
    }
}

/// Sends `bytes`, counting it as lost if there is no room.
#[inline(always)]
fn send_counted<S: Sink, C: EbpfContext>(sink: &S, ctx: &C, bytes: &[u8]) {
    if !sink.send(ctx, bytes) {
        count_error(LOST_EVENT);
    }
}

/// Nonzero where an event tool runs as a collector of the exporter: it
/// adds what its events would say to [`TALLIES`] and sends none. A load
/// time constant, so the verifier drops the branch not taken.
#[unsafe(no_mangle)]
static TALLY_ONLY: Global<u32> = Global::new(0);

/// Per-CPU running totals, slots named by each tool in `common` (such as
/// execs, or bytes received); user space sizes the array and sums it at
/// every scrape.
#[map]
static TALLIES: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Whether events are tallied instead of sent ([`TALLY_ONLY`]).
#[inline(always)]
pub fn tally_only() -> bool {
    TALLY_ONLY.load() != 0
}

/// Adds `n` to slot `index` of [`TALLIES`].
#[inline(always)]
pub fn tally(index: u32, n: u64) {
    if let Some(p) = TALLIES.get_ptr_mut(index) {
        // SAFETY: per-CPU value, and programs do not nest on one CPU here.
        unsafe { *p += n };
    }
}

//! CPU profiling: a program on a sampling perf event (one per CPU) that
//! counts samples by process and stacks, in the shared stack tables
//! (`rtrace_ebpf::stacks`); with `--off-cpu`, the context-switch programs
//! of `rtrace_ebpf::offcpu` count time off the CPU beside them. With `-e`
//! on tracepoints, the same count at every event of each, from a program
//! attached to them all.
#![no_std]
#![no_main]

#[cfg(feature = "cfi")]
use aya_ebpf::maps::ProgramArray;
use aya_ebpf::{
    EbpfContext, Global,
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{kprobe, kretprobe, map, perf_event, uprobe, uretprobe},
    maps::PerCpuArray,
    programs::{PerfEventContext, ProbeContext, RetProbeContext, TracePointContext},
};
#[cfg(not(feature = "perf"))]
use aya_ebpf::{bindings::BPF_RB_NO_WAKEUP, helpers::bpf_get_smp_processor_id, maps::RingBuf};
#[cfg(not(feature = "perf"))]
use rtrace_common::profile::{ERR_SAMPLES_LOST, TimedSample};
use rtrace_common::{
    profile::{Config, HEAT_SLOT_NS, MAX_PERIODS},
    stacks::Key,
    unwind::RUNTIMES_ALL,
};
use rtrace_ebpf::{
    global,
    stacks::{self, WINDOW},
    targets,
};

rtrace_ebpf::event_map!();
rtrace_ebpf::cfi_programs!(walk_variants);
rtrace_ebpf::stack_counts!(rtrace_common::stacks::Key);
rtrace_ebpf::offcpu_programs!(
    rtrace_common::stacks::Key,
    &global(&CONFIG).off_cpu,
    rtrace_common::profile::ERR_INTERVALS_LOST
);

/// Set by user space before load.
#[unsafe(no_mangle)]
static CONFIG: Global<Config> = Global::new(unsafe { core::mem::zeroed() });

/// This CPU's busy time (`Idle::busy`) at its last sample of a thread,
/// with `Config::timed`.
#[map]
static LAST_BUSY: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Samples per `HEAT_SLOT_NS` slot since the start, per CPU
/// (`--heatmap`): counted here, so that the heat map needs no event per
/// sample. User space sizes it.
#[map]
static HEAT: PerCpuArray<u32> = PerCpuArray::with_max_entries(1, 0);

/// The sampling program with the CFI walk that user space loaded for
/// the runtimes in scope (`profile_native`, `profile_runtimes`, or one
/// runtime's: `profile_python`, `profile_java`, `profile_v8`), in slot 0.
#[cfg(feature = "cfi")]
#[map]
static WALKERS: ProgramArray = ProgramArray::with_max_entries(1, 0);

/// Every sample of a perf event. With the CFI walk, only a tail call to
/// the variant in `WALKERS`: the one that walks the runtimes' frames
/// takes the verifier twice as long to load, so it is loaded once a
/// process of a runtime is in scope, and swapped in here.
#[perf_event]
pub fn profile(ctx: PerfEventContext) -> u32 {
    #[cfg(feature = "cfi")]
    // SAFETY: the slot holds a perf event program, or nothing (the
    // call then returns, and the sample is not counted).
    unsafe {
        WALKERS.tail_call(&ctx, 0)
    };
    #[cfg(not(feature = "cfi"))]
    sample::<RUNTIMES_ALL>(&ctx);
    0
}

/// The sampling with a walk through native frames only.
#[cfg(feature = "cfi")]
#[perf_event]
pub fn profile_native(ctx: PerfEventContext) -> u32 {
    sample::<0>(&ctx);
    0
}

/// The sampling with a walk through every runtime's frames.
#[cfg(feature = "cfi")]
#[perf_event]
pub fn profile_runtimes(ctx: PerfEventContext) -> u32 {
    sample::<RUNTIMES_ALL>(&ctx);
    0
}

/// The sampling with a walk through Python's frames and native ones: of
/// every runtime's, the one whose walk the verifier goes through alone
/// when no other runtime is in scope.
#[cfg(feature = "cfi")]
#[perf_event]
pub fn profile_python(ctx: PerfEventContext) -> u32 {
    sample::<{ rtrace_common::unwind::RUNTIME_PYTHON }>(&ctx);
    0
}

/// The sampling with a walk through Java's frames and native ones.
#[cfg(feature = "cfi")]
#[perf_event]
pub fn profile_java(ctx: PerfEventContext) -> u32 {
    sample::<{ rtrace_common::unwind::RUNTIME_JAVA }>(&ctx);
    0
}

/// The sampling with a walk through V8's frames and native ones.
#[cfg(feature = "cfi")]
#[perf_event]
pub fn profile_v8(ctx: PerfEventContext) -> u32 {
    sample::<{ rtrace_common::unwind::RUNTIME_V8 }>(&ctx);
    0
}

rtrace_ebpf::tracepoint! {
    /// Every event of the tracepoints `-e` names.
    fn profile_tracepoint(ctx) {
        sample::<RUNTIMES_ALL>(&ctx);
    }
}

/// Every call of the kernel functions `-e p:` names.
#[kprobe]
pub fn profile_kprobe(ctx: ProbeContext) -> u32 {
    sample::<RUNTIMES_ALL>(&ctx);
    0
}

/// Every return of the kernel functions `-e r:` names.
#[kretprobe]
pub fn profile_kretprobe(ctx: RetProbeContext) -> u32 {
    sample::<RUNTIMES_ALL>(&ctx);
    0
}

/// Every call of the user functions or USDT probes `-e u:` names.
#[uprobe]
pub fn profile_uprobe(ctx: ProbeContext) -> u32 {
    sample::<RUNTIMES_ALL>(&ctx);
    0
}

/// Every return of the user functions `-e r:FILE:FUNCTION` names.
#[uretprobe]
pub fn profile_uretprobe(ctx: RetProbeContext) -> u32 {
    sample::<RUNTIMES_ALL>(&ctx);
    0
}

/// With `-c N` on events: this CPU's events of the scope so far.
#[map]
static EVENTS_SEEN: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Where a program's user walk starts.
trait Sampled: EbpfContext {
    /// The registers the walk starts from; null for the thread's own
    /// user registers (`bpf_task_pt_regs`).
    fn sampled(&self) -> *const u8;
}

impl Sampled for PerfEventContext {
    /// The sample's registers: the user walk starts there when it hit
    /// user mode.
    #[inline(always)]
    fn sampled(&self) -> *const u8 {
        self.as_ptr() as *const u8
    }
}

/// The thread is in the kernel (a tracepoint, a kernel function) or
/// trapped there from a uprobe: the walk starts from the registers it
/// entered with, which for a uprobe are those at the probed instruction.
macro_rules! sampled_from_entry {
    ($($ctx:ty),*) => {$(
        impl Sampled for $ctx {
            #[inline(always)]
            fn sampled(&self) -> *const u8 {
                core::ptr::null()
            }
        }
    )*};
}
sampled_from_entry!(TracePointContext, ProbeContext, RetProbeContext);

/// Counts a sample of the current thread, its user stack walked through
/// the frames of runtimes `RT` (`rtrace_common::unwind::Runtimes`).
#[inline(always)]
fn sample<const RT: u32>(ctx: &impl Sampled) {
    let cfg = global(&CONFIG);
    let id = bpf_get_current_pid_tgid();
    let (tid, tgid) = (id as u32, (id >> 32) as u32);
    if tid == 0 && cfg.include_idle == 0 {
        return;
    }
    // Before the other filters: the busy time since the last sample is
    // this one's whoever it found on the CPU.
    let value = match (cfg.timed != 0, tid) {
        (false, _) => 1,
        (true, 0) => cfg.period_ns,
        (true, _) => elapsed(cfg),
    };
    // The sampled task is the current one, so the cgroup filters apply.
    if !targets::admits(tgid, tid) || !targets::current_in_cgroup() {
        return;
    }
    if (cfg.heat_slots != 0 || cfg.range_end_ns != 0) && !in_time(cfg) {
        return;
    }
    if cfg.every > 1 && !nth(u64::from(cfg.every)) {
        return;
    }
    let mut key = Key::new(0, [0; 16]);
    // Computed here, after the filters, as the verifier has followed it
    // since before tracepoints shared this function: placed before them,
    // the 6.1 verifier no longer accepted the CFI walk.
    let sampled = ctx.sampled();
    let (kernel, user) = (cfg.kernel != 0, cfg.user != 0);
    stacks::describe_current_walking::<_, _, RT>(
        ctx, &EVENTS, tgid, kernel, user, sampled, &mut key,
    );
    if cfg.per_thread != 0 {
        // Asked again rather than kept across the walk, which would hold a
        // register or a stack slot the walk's verification has no room for.
        key.tid = bpf_get_current_pid_tgid() as u32;
    }
    if cfg.time_keys != 0 {
        // After the walk, as the thread above: the time is read again.
        // SAFETY: the helper has no preconditions.
        key.slot = stacks::time_slot(unsafe { bpf_ktime_get_ns() });
    }
    key.generation = stacks::generation() as u16;
    stacks::add(ctx, &EVENTS, &STACK_COUNTS, &key, value);
    // A load-time constant: with it 0 the verifier drops the branch, and
    // a run without the stream pays nothing for it.
    if cfg.samples != 0 {
        send_sample(&key, value);
    }
}

/// Each sample on its own (`--firefox`, `--samples`), read by user space
/// on its timer; user space sizes it. Not in the `perf` variant, whose
/// kernels have no ring buffer: user space refuses the flags there.
#[cfg(not(feature = "perf"))]
#[map]
static SAMPLES: RingBuf = RingBuf::with_byte_size(4096, 0);

/// Sends the sample just counted under `key` (adding `value`) to
/// `SAMPLES`, with its time, CPU and thread; a full buffer is counted.
#[inline(always)]
fn send_sample(key: &Key, value: u64) {
    #[cfg(not(feature = "perf"))]
    match SAMPLES.reserve::<TimedSample>(0) {
        Some(mut entry) => {
            let p = entry.as_mut_ptr();
            // SAFETY: `p` is the reserved record, written whole before it
            // is submitted; the helpers have no preconditions.
            unsafe {
                (*p).time = bpf_ktime_get_ns();
                (*p).value = value;
                (*p).cpu = bpf_get_smp_processor_id();
                (*p).tid = bpf_get_current_pid_tgid() as u32;
                (*p).key = *key;
            }
            // User space reads on its timer: no wakeup.
            entry.submit(u64::from(BPF_RB_NO_WAKEUP));
        }
        None => rtrace_ebpf::count_error(ERR_SAMPLES_LOST),
    }
    #[cfg(feature = "perf")]
    let _ = (key, value);
}

/// Counts an event of the scope on this CPU, and says whether it is an
/// `every`-th one (as a perf counter's period counts on each CPU).
#[inline(always)]
fn nth(every: u64) -> bool {
    match EVENTS_SEEN.get_ptr_mut(0) {
        Some(n) => {
            // SAFETY: this CPU's slot; a program does not nest in itself.
            let seen = unsafe {
                *n += 1;
                *n
            };
            seen % every == 0
        }
        None => true,
    }
}

/// Counts the sample in its heat map slot, and says whether it falls in
/// the `--range` (if any).
#[inline(always)]
fn in_time(cfg: &Config) -> bool {
    let Some(&start) = WINDOW.get(0) else {
        return true;
    };
    // SAFETY: the helper has no preconditions.
    let since = unsafe { bpf_ktime_get_ns() }.saturating_sub(start);
    if cfg.heat_slots != 0 {
        let slot = since / HEAT_SLOT_NS;
        if slot < u64::from(cfg.heat_slots)
            && let Some(n) = HEAT.get_ptr_mut(slot as u32)
        {
            // SAFETY: this CPU's slot; samples on one CPU do not nest.
            unsafe { *n += 1 };
        }
    }
    cfg.range_end_ns == 0 || (cfg.range_start_ns..cfg.range_end_ns).contains(&since)
}

/// Nanoseconds this sample of a thread stands for: the time its CPU was
/// busy since the last such sample. That is the period while the timer
/// keeps time; more when it fired late, as in an emulated machine, and
/// perf skipped the periods missed; and never the time the CPU idled,
/// when an idle CPU's timer may stop. Bounded by `MAX_PERIODS`; the
/// first sample counts one period.
#[inline(always)]
fn elapsed(cfg: &Config) -> u64 {
    let period = cfg.period_ns;
    // SAFETY: the helper has no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    let (Some(last), Some(idle)) = (LAST_BUSY.get_ptr_mut(0), IDLE.get(0)) else {
        return period;
    };
    let busy = idle.busy(now);
    // SAFETY: this CPU's slot; samples on one CPU do not nest.
    let before = unsafe { core::ptr::replace(last, busy) };
    if before == 0 {
        return period;
    }
    busy.saturating_sub(before)
        .min(period.saturating_mul(MAX_PERIODS))
}

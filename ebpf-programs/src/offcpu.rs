//! Off-CPU time, for offcputime and `profile --off-cpu`: at each context
//! switch, the thread leaving the CPU has its stacks taken and its time of
//! leaving kept; when it runs again, the time it was off is added to the
//! count of those stacks in the shared stack tables ([`crate::stacks`]).
//! Nothing per switch crosses to user space, unless each wait is asked
//! for on its own (`--firefox`, `--samples`: `Config::samples`), when the
//! wait counted is also sent to the `INTERVALS` ring buffer.
//!
//! One set of programs per attach mechanism: tp_btf reads the tasks
//! through BTF-typed pointers, the raw tracepoint through the helper; both
//! with offsets from BTF. The thread leaving is the current one, so its
//! stacks are walked as for a sample: the kernel's from the tracepoint,
//! the user one from the registers it entered the kernel with.
//!
//! With `--waker`, sched_waking takes the stacks of the thread waking a
//! traced one (the current thread there) into its entry, as bcc's
//! offwaketime does, and the time is counted by both.

use aya_ebpf::{
    EbpfContext,
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    maps::{HashMap, PerCpuArray},
};
#[cfg(not(feature = "perf"))]
use aya_ebpf::{bindings::BPF_RB_NO_WAKEUP, helpers::bpf_get_smp_processor_id, maps::RingBuf};
#[cfg(not(feature = "perf"))]
use rtrace_common::offcputime::Interval;
use rtrace_common::{
    offcputime::{
        Config, ERR_STARTS_FULL, PF_KTHREAD, STATE_ANY, Start, THREADS_ALL, THREADS_USER,
    },
    stacks::{Key, OFF_CPU, WakeKey},
};

use crate::{
    count_error,
    events::Sink,
    stacks::{self, Counted},
    targets, task_u32,
};

/// Defines `STARTS`, the threads off the CPU by thread id, `IDLE`, each
/// CPU's idle time, `INTERVALS`, each wait on its own (but in the `perf`
/// variant), and the
/// programs `btf_sched_switch`, `raw_sched_switch`, `btf_sched_waking` and
/// `raw_sched_waking`, in an object that counts stacks by `$key`
/// (`stack_counts!`) and has an `EVENTS` map; `$config` is the
/// [`Config`] to follow, `$lost` the `ERRORS` slot of waits whose own
/// record did not fit in `INTERVALS`.
#[macro_export]
macro_rules! offcpu_programs {
    ($key:ty, $config:expr, $lost:expr) => {
        /// Threads off the CPU, by thread id. Preallocated: a context
        /// switch must not allocate. User space sizes it.
        #[aya_ebpf::macros::map]
        static STARTS: aya_ebpf::maps::HashMap<u32, rtrace_common::offcputime::Start> =
            aya_ebpf::maps::HashMap::with_max_entries(1, 0);

        /// Each CPU's idle time, with `Config::mark_switches`.
        #[aya_ebpf::macros::map]
        static IDLE: aya_ebpf::maps::PerCpuArray<$crate::offcpu::Idle> =
            aya_ebpf::maps::PerCpuArray::with_max_entries(1, 0);

        /// Each wait counted, on its own, with `Config::samples`
        /// (`--firefox`, `--samples`); user space sizes it. Not in the
        /// `perf` variant, whose kernels have no ring buffer.
        #[cfg(not(feature = "perf"))]
        #[aya_ebpf::macros::map]
        static INTERVALS: aya_ebpf::maps::RingBuf =
            aya_ebpf::maps::RingBuf::with_byte_size(4096, 0);

        /// The maps the programs share.
        #[inline(always)]
        fn offcpu_tables() -> $crate::offcpu::Tables<'static, $key, impl $crate::events::Sink> {
            $crate::offcpu::Tables {
                starts: &STARTS,
                idle: &IDLE,
                counts: &STACK_COUNTS,
                events: &EVENTS,
                #[cfg(not(feature = "perf"))]
                intervals: &INTERVALS,
                lost: $lost,
            }
        }

        #[aya_ebpf::macros::btf_tracepoint(function = "sched_switch")]
        pub fn btf_sched_switch(ctx: aya_ebpf::programs::BtfTracePointContext) -> i32 {
            let t = offcpu_tables();
            $crate::offcpu::switch::<_, _, _, true>(&ctx, $config, &t, ctx.arg(1), ctx.arg(2));
            0
        }

        #[aya_ebpf::macros::raw_tracepoint(tracepoint = "sched_switch")]
        pub fn raw_sched_switch(ctx: aya_ebpf::programs::RawTracePointContext) -> i32 {
            let t = offcpu_tables();
            $crate::offcpu::switch::<_, _, _, false>(&ctx, $config, &t, ctx.arg(1), ctx.arg(2));
            0
        }

        #[aya_ebpf::macros::btf_tracepoint(function = "sched_waking")]
        pub fn btf_sched_waking(ctx: aya_ebpf::programs::BtfTracePointContext) -> i32 {
            $crate::offcpu::wakes::<_, _, _, true>(&ctx, $config, &offcpu_tables(), ctx.arg(0));
            0
        }

        #[aya_ebpf::macros::raw_tracepoint(tracepoint = "sched_waking")]
        pub fn raw_sched_waking(ctx: aya_ebpf::programs::RawTracePointContext) -> i32 {
            $crate::offcpu::wakes::<_, _, _, false>(&ctx, $config, &offcpu_tables(), ctx.arg(0));
            0
        }
    };
}

/// A key off-CPU time is counted by, made from what a thread left the CPU
/// with.
pub trait OffCpuKey: Counted + Sized {
    /// Adds `ns` off the CPU under `key` to `counts`; `key` (the thread's
    /// entry's, a map value) is as it was after.
    fn add<C: EbpfContext, S: Sink>(
        ctx: &C,
        events: &S,
        counts: &HashMap<Self, u64>,
        key: &mut WakeKey,
        ns: u64,
    );
}

/// offcputime's: the thread and its waker.
impl OffCpuKey for WakeKey {
    fn add<C: EbpfContext, S: Sink>(
        ctx: &C,
        events: &S,
        counts: &HashMap<Self, u64>,
        key: &mut WakeKey,
        ns: u64,
    ) {
        stacks::add(ctx, events, counts, key, ns);
    }
}

/// `profile --off-cpu`'s: the thread, marked as off the CPU among the
/// samples.
impl OffCpuKey for Key {
    fn add<C: EbpfContext, S: Sink>(
        ctx: &C,
        events: &S,
        counts: &HashMap<Self, u64>,
        key: &mut WakeKey,
        ns: u64,
    ) {
        // Marked in place, not in a copy: the copy took the switch
        // program's frame to 216 bytes, where the walk's global step
        // has no room in the chain of calls down to it (`combined stack
        // size`, `cfi::STEPS_APART`).
        let flags = key.key.flags;
        key.key.flags = flags | OFF_CPU;
        stacks::add(ctx, events, counts, &key.key, ns);
        key.key.flags = flags;
    }
}

/// A CPU's time in its idle task, kept at each switch with
/// `Config::mark_switches`: `profile --off-cpu` weighs a sample by the
/// time its CPU was busy since the one before.
#[repr(C)]
pub struct Idle {
    /// Nanoseconds idle, up to the last switch from the idle task.
    pub total: u64,
    /// When the idle task last got the CPU, 0 when it has not since the
    /// last switch from it.
    pub since: u64,
}

impl Idle {
    /// This CPU's busy time up to `now`, on a clock of its own: the
    /// time not idle since the programs started, plus a constant.
    #[inline(always)]
    pub fn busy(&self, now: u64) -> u64 {
        let idle_now = if self.since != 0 {
            now.saturating_sub(self.since)
        } else {
            0
        };
        now.saturating_sub(self.total).saturating_sub(idle_now)
    }
}

/// With the CFI walk (5.17+, so task storage is there too) and typed
/// tasks (tp_btf), each thread's time of leaving and stacks are kept in
/// the thread itself rather than in `STARTS`: no hash insert, lookup and
/// delete per switch.
#[cfg(feature = "cfi")]
#[unsafe(link_section = ".maps")]
#[unsafe(no_mangle)]
static TASK_OFF: crate::task_storage::TaskStorage<Start> = crate::task_storage::TaskStorage::new();

/// Whether the programs keep threads off the CPU in [`TASK_OFF`].
#[inline(always)]
const fn in_task<const DIRECT: bool>() -> bool {
    DIRECT && cfg!(feature = "cfi")
}

/// Thread `task` (id `tid`)'s entry, if it is off the CPU.
#[inline(always)]
fn entry_of<K, S, const DIRECT: bool>(
    t: &Tables<'_, K, S>,
    task: *const u8,
    tid: u32,
) -> Option<*mut Start> {
    #[cfg(feature = "cfi")]
    if in_task::<DIRECT>() {
        let p = TASK_OFF.get(task, false);
        // SAFETY: the task's own storage.
        return (!p.is_null() && unsafe { (*p).ns } != 0).then_some(p);
    }
    let _ = task;
    t.starts.get_ptr_mut(tid)
}

/// Marks thread `task` (id `tid`) back on the CPU.
#[inline(always)]
fn clear_entry<K, S, const DIRECT: bool>(t: &Tables<'_, K, S>, entry: *mut Start, tid: u32) {
    if in_task::<DIRECT>() {
        // SAFETY: the task's own storage.
        unsafe { (*entry).ns = 0 };
    } else {
        let _ = t.starts.remove(tid);
    }
}

/// Makes thread `task` (id `tid`)'s entry as it leaves the CPU at `now`:
/// the time and no waker yet, so that a wakeup on another CPU while its
/// stacks are walked (a walk is long next to the moment between a
/// thread's going to sleep and its switch, and an emulated guest makes it
/// longer) finds the entry and names its waker.
#[inline(always)]
fn make_entry<K, S, const DIRECT: bool>(
    t: &Tables<'_, K, S>,
    task: *const u8,
    tid: u32,
    now: u64,
) -> Option<*mut Start> {
    let zero = Key::new(0, [0; 16]);
    #[cfg(feature = "cfi")]
    if in_task::<DIRECT>() {
        let p = TASK_OFF.get(task, true);
        if p.is_null() {
            return None;
        }
        // SAFETY: the task's own storage. The waker is cleared before the
        // time is set, which tells a waker the entry is there.
        unsafe {
            (*p).key.waker = zero;
            core::ptr::write_volatile(&raw mut (*p).ns, now);
        }
        return Some(p);
    }
    let _ = task;
    let start = Start {
        ns: now,
        key: WakeKey {
            key: zero,
            waker: zero,
        },
    };
    t.starts.insert(tid, start, 0).ok()?;
    t.starts.get_ptr_mut(tid)
}

/// The maps a switch works on.
pub struct Tables<'a, K, S> {
    /// Threads off the CPU.
    pub starts: &'a HashMap<u32, Start>,
    /// `IDLE`.
    pub idle: &'a PerCpuArray<Idle>,
    /// `STACK_COUNTS`.
    pub counts: &'a HashMap<K, u64>,
    /// `EVENTS`.
    pub events: &'a S,
    /// `INTERVALS`.
    #[cfg(not(feature = "perf"))]
    pub intervals: &'a RingBuf,
    /// The `ERRORS` slot of waits whose own record did not fit in
    /// `intervals`.
    pub lost: u32,
}

/// Whether the thread leaving the CPU (the current one, `prev`) is
/// traced: its ids and cgroup, its kind (`-u`, `-k`) and its state.
#[inline(always)]
fn traced<const DIRECT: bool>(cfg: &Config, prev: *const u8, tgid: u32, tid: u32) -> bool {
    if tid == 0 || !targets::admits(tgid, tid) || !targets::current_in_cgroup() {
        return false;
    }
    if cfg.threads != THREADS_ALL {
        let kthread = task_u32::<DIRECT>(prev, cfg.task_flags).unwrap_or(0) & PF_KTHREAD != 0;
        // User threads only and a kernel thread, or the other way round.
        if (cfg.threads == THREADS_USER) == kthread {
            return false;
        }
    }
    if cfg.state != STATE_ANY {
        let Some(state) = task_u32::<DIRECT>(prev, cfg.task_state) else {
            return false;
        };
        if (cfg.state == 0 && state != 0) || (cfg.state != 0 && state & cfg.state == 0) {
            return false;
        }
    }
    true
}

/// Whether a thread's kernel stack is walked when it runs again, from
/// where it stopped (`bpf_get_task_stack`, which needs the task's BTF type: tp_btf
/// only): the same frames but the scheduler's and the lock primitives'
/// (`__sched` code), which the kernel skips there as in
/// `/proc/PID/stack`, and a third less work, as the walk does not
/// start in the tracepoint's own frames. Otherwise it is walked as the
/// thread leaves the CPU.
#[inline(always)]
fn kernel_at_switch_in<const DIRECT: bool>(cfg: &Config) -> bool {
    DIRECT && cfg.sched_frames == 0
}

/// Takes the current thread's stacks and keeps them with the time.
#[inline(always)]
fn leaves<C: EbpfContext, K, S: Sink, const DIRECT: bool>(
    ctx: &C,
    cfg: &Config,
    t: &Tables<'_, K, S>,
    prev: *const u8,
    tgid: u32,
    tid: u32,
    now: u64,
) {
    let Some(entry) = make_entry::<K, S, DIRECT>(t, prev, tid, now) else {
        count_error(ERR_STARTS_FULL);
        return;
    };
    // SAFETY: the thread's own entry; a waker writes only the waker's
    // half of it.
    let key = unsafe { &mut (*entry).key.key };
    stacks::describe_current(
        ctx,
        t.events,
        tgid,
        cfg.kernel != 0 && !kernel_at_switch_in::<DIRECT>(cfg),
        cfg.user != 0,
        core::ptr::null(),
        key,
    );
    if cfg.per_thread != 0 {
        key.tid = tid;
    }
}

/// With `--waker`: the current thread wakes `wakee`; if it is a traced
/// thread off the CPU, the current thread's stacks go into its entry.
#[inline(always)]
pub fn wakes<C: EbpfContext, K, S: Sink, const DIRECT: bool>(
    ctx: &C,
    cfg: &Config,
    t: &Tables<'_, K, S>,
    wakee: *const u8,
) {
    if cfg.waker == 0 {
        return;
    }
    let Some(tid) = task_u32::<DIRECT>(wakee, cfg.task_pid) else {
        return;
    };
    let Some(start) = entry_of::<K, S, DIRECT>(t, wakee, tid) else {
        return;
    };
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    // SAFETY: a map value; a thread is woken by one thread at a time, and
    // a lost race only names the other waker.
    let waker = unsafe { &mut (*start).key.waker };
    stacks::describe_current(
        ctx,
        t.events,
        tgid,
        cfg.kernel != 0,
        cfg.user != 0,
        core::ptr::null(),
        waker,
    );
    if cfg.per_thread != 0 {
        waker.tid = pid_tgid as u32;
    }
}

/// Adds the time thread `tid`, switched to, was off the CPU to its
/// stacks' count.
#[inline(always)]
fn returns<C: EbpfContext, K: OffCpuKey, S: Sink, const DIRECT: bool>(
    ctx: &C,
    cfg: &Config,
    t: &Tables<'_, K, S>,
    next: *const u8,
    tid: u32,
    now: u64,
) {
    if tid == 0 {
        return;
    }
    let Some(start) = entry_of::<K, S, DIRECT>(t, next, tid) else {
        return;
    };
    // SAFETY: a map value, counted from in place (the key is too large to
    // copy to the stack) before the entry is removed.
    unsafe {
        // A time from another CPU can be a hair ahead of ours.
        if let Some(off) = now.checked_sub((*start).ns)
            && off >= cfg.min_ns
            && off <= cfg.max_ns
        {
            (*start).key.key.generation = stacks::generation() as u16;
            if cfg.time_keys != 0 {
                // Time off the CPU counts in the slot its wait ended in.
                (*start).key.key.slot = stacks::time_slot(now);
            }
            if cfg.kernel != 0 && kernel_at_switch_in::<DIRECT>(cfg) {
                (*start).key.key.set_kernel(stacks::task_kernel_stack(next));
            }
            K::add(ctx, t.events, t.counts, &mut (*start).key, off);
            // A load-time constant: with it 0 the verifier drops the
            // branch, and a run without the stream pays nothing for it.
            if cfg.samples != 0 {
                send_interval(t, &*start, off, tid);
            }
        }
    }
    clear_entry::<K, S, DIRECT>(t, start, tid);
}

/// Sends the wait of thread `tid` just counted (`off` nanoseconds since
/// `start.ns`, under `start.key`) to `INTERVALS`, with the CPU it ends
/// on; a full buffer is counted.
#[inline(always)]
fn send_interval<K, S>(t: &Tables<'_, K, S>, start: &Start, off: u64, tid: u32) {
    #[cfg(not(feature = "perf"))]
    match t.intervals.reserve::<Interval>(0) {
        Some(mut entry) => {
            let p = entry.as_mut_ptr();
            // SAFETY: `p` is the reserved record, written whole before it
            // is submitted; the helper has no preconditions.
            unsafe {
                (*p).start = start.ns;
                (*p).ns = off;
                (*p).cpu = bpf_get_smp_processor_id();
                (*p).tid = tid;
                (*p).key = start.key;
            }
            // User space reads on its timer: no wakeup.
            entry.submit(u64::from(BPF_RB_NO_WAKEUP));
        }
        None => count_error(t.lost),
    }
    #[cfg(feature = "perf")]
    let _ = (t, start, off, tid);
}

/// A context switch from `prev` (the current thread) to `next`.
#[inline(always)]
pub fn switch<C: EbpfContext, K: OffCpuKey, S: Sink, const DIRECT: bool>(
    ctx: &C,
    cfg: &Config,
    t: &Tables<'_, K, S>,
    prev: *const u8,
    next: *const u8,
) {
    // SAFETY: the helper has no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    let id = bpf_get_current_pid_tgid();
    let (tgid, tid) = ((id >> 32) as u32, id as u32);
    let next_tid = task_u32::<DIRECT>(next, cfg.task_pid);
    if cfg.mark_switches != 0
        && let Some(idle) = t.idle.get_ptr_mut(0)
    {
        // SAFETY: this CPU's slot; switches on one CPU do not nest.
        let idle = unsafe { &mut *idle };
        if tid == 0 && idle.since != 0 {
            idle.total = idle.total.wrapping_add(now.saturating_sub(idle.since));
            idle.since = 0;
        }
        if next_tid == Some(0) {
            idle.since = now;
        }
    }
    if traced::<DIRECT>(cfg, prev, tgid, tid) {
        leaves::<C, K, S, DIRECT>(ctx, cfg, t, prev, tgid, tid, now);
    }
    if let Some(next_tid) = next_tid {
        returns::<C, K, S, DIRECT>(ctx, cfg, t, next, next_tid, now);
    }
}

//! CPU profiling: a program on a sampling perf event (one per CPU) that
//! counts samples by process and stacks.
//!
//! Stacks come from `bpf_get_stack` and are named by a hash computed here,
//! not by `bpf_get_stackid`, whose bucket index drops a stack whenever two
//! share a bucket (bcc #3389). Counting happens here, so only distinct
//! stacks travel to user space, and only once, at the end. The one event
//! sent while sampling is [`Seen`], so that user space can capture a new
//! process's memory map and JIT symbols while the process still lives.
#![no_std]
#![no_main]

use aya_ebpf::{
    EbpfContext, Global,
    bindings::{BPF_F_USER_STACK, BPF_NOEXIST},
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid, generated::bpf_get_stack},
    macros::{map, perf_event},
    maps::{Array, HashMap, PerCpuArray},
    programs::PerfEventContext,
};
#[cfg(feature = "cfi")]
use rtrace_common::profile::ERR_NO_TABLES;
use rtrace_common::profile::{
    Config, ERR_COUNTS_FULL, ERR_KERNEL_STACK, ERR_STACKS_FULL, ERR_USER_STACK, Key, MAX_DEPTH,
    MISSED_KERNEL, MISSED_USER, Seen, Stack,
};
use rtrace_ebpf::{EEXIST, count_error, count_key, events::emit, targets};

rtrace_ebpf::event_map!();

#[unsafe(no_mangle)]
static CONFIG: Global<Config> = Global::new(Config {
    include_idle: 0,
    user: 0,
    kernel: 0,
});

/// Samples by [`Key`]. Preallocated, since a perf event program may run in
/// NMI context, where the kernel cannot allocate.
#[map]
static COUNTS: HashMap<Key, u64> = HashMap::with_max_entries(40960, 0);
/// The generation samples are counted in, counted up by user space when it
/// moves the last one's counts out.
#[map]
static GEN: Array<u32> = Array::with_max_entries(1, 0);
/// Stacks by hash; user space sizes it (`--stack-storage-size`) and moves
/// them out as the profile runs.
#[map]
static STACKS: HashMap<u64, Stack> = HashMap::with_max_entries(16384, 0);
/// The generation each process last told user space of a new stack in.
#[cfg(feature = "cfi")]
#[map]
static SEEN: aya_ebpf::maps::LruHashMap<u32, u32> =
    aya_ebpf::maps::LruHashMap::with_max_entries(8192, 0);
/// Where a stack is walked: it is larger than the eBPF stack.
#[map]
static SCRATCH: PerCpuArray<Scratch> = PerCpuArray::with_max_entries(1, 0);

/// One CPU's room for the stack being walked, and the CFI walk's state.
#[repr(C)]
struct Scratch {
    stack: Stack,
    #[cfg(feature = "cfi")]
    walk: cfi::State,
}

#[perf_event]
pub fn profile(ctx: PerfEventContext) -> u32 {
    sample(&ctx);
    0
}

#[inline(always)]
fn sample(ctx: &PerfEventContext) {
    let cfg = CONFIG.load();
    let id = bpf_get_current_pid_tgid();
    let (tid, tgid) = (id as u32, (id >> 32) as u32);
    if tid == 0 && cfg.include_idle == 0 {
        return;
    }
    if !targets::admits(tgid, tid) {
        return;
    }
    let mut key = Key {
        tgid,
        flags: 0,
        generation: GEN.get(0).copied().unwrap_or(0),
        _pad: 0,
        user: 0,
        kernel: 0,
        comm: bpf_get_current_comm().unwrap_or([0; 16]),
    };
    if cfg.kernel != 0 {
        match stack(ctx, 0, ERR_KERNEL_STACK) {
            Some(h) => key.kernel = h,
            None => key.flags |= MISSED_KERNEL,
        }
    }
    if cfg.user != 0 {
        match user_stack(ctx, tgid, &cfg) {
            Some(h) => key.user = h,
            None => key.flags |= MISSED_USER,
        }
    }
    match count_key(&COUNTS, &key) {
        Some(true) => {
            if first_in_generation(tgid, key.generation) {
                emit(&EVENTS, ctx, &Seen::new(tgid, 0));
            }
        }
        Some(false) => {}
        None => count_error(ERR_COUNTS_FULL),
    }
}

/// Whether this is the process's first new stack in this generation: user
/// space needs to hear of a process once a generation, not of each of its
/// stacks. With the CFI walk, exec and fork are told separately and code
/// new to a process too, so this is only to capture its symbols while it
/// lives; without it, every new stack tells.
#[inline(always)]
fn first_in_generation(tgid: u32, generation: u32) -> bool {
    #[cfg(feature = "cfi")]
    {
        // SAFETY: a map value.
        if SEEN
            .get_ptr(tgid)
            .is_some_and(|g| unsafe { *g } == generation)
        {
            return false;
        }
        let _ = SEEN.insert(tgid, generation, 0);
    }
    let _ = (tgid, generation);
    true
}

/// The user stack: walked from the process's CFI tables where user space
/// has loaded them (the `cfi` object), else by the kernel's frame-pointer
/// walk.
#[inline(always)]
fn user_stack(ctx: &PerfEventContext, tgid: u32, cfg: &Config) -> Option<u64> {
    #[cfg(feature = "cfi")]
    {
        let s = SCRATCH.get_ptr_mut(0)?;
        match cfi::walk(ctx, tgid, s) {
            Some((len, new_code)) => {
                if new_code {
                    emit(
                        &EVENTS,
                        ctx,
                        &Seen::new(tgid, rtrace_common::profile::SEEN_NEW_CODE),
                    );
                }
                // SAFETY: a map value.
                return store(unsafe { &raw mut (*s).stack }, len);
            }
            None => count_error(ERR_NO_TABLES),
        }
    }
    let _ = (tgid, cfg);
    stack(ctx, u64::from(BPF_F_USER_STACK), ERR_USER_STACK)
}

/// Walks one stack with `bpf_get_stack`, stores it in `STACKS` and returns
/// its hash: 0 for an empty stack, `None` if it could not be walked or
/// stored.
#[inline(always)]
fn stack(ctx: &PerfEventContext, flags: u64, walk_error: u32) -> Option<u64> {
    let s = SCRATCH.get_ptr_mut(0)?;
    // SAFETY: a map value.
    let s = unsafe { &raw mut (*s).stack };
    // SAFETY: `s` is a map value with room for `MAX_DEPTH` frames; the
    // helper zeroes what it does not fill.
    let n = unsafe {
        bpf_get_stack(
            ctx.as_ptr(),
            (&raw mut (*s).ips).cast(),
            (MAX_DEPTH * 8) as u32,
            flags,
        )
    };
    if n < 0 {
        count_error(walk_error);
        return None;
    }
    store(s, n as u64 / 8)
}

/// Hashes the `len` frames walked into `s`, stores them in `STACKS` and
/// returns the hash: 0 for an empty stack, `None` if it could not be
/// stored.
#[inline(always)]
fn store(s: *mut Stack, len: u64) -> Option<u64> {
    if len == 0 {
        return Some(0);
    }
    // FNV-1a over whole frames, then a final mix so that stacks differing
    // only in their last frame still spread over all 64 bits.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for i in 0..MAX_DEPTH {
        if i as u64 >= len {
            break;
        }
        // SAFETY: `i < MAX_DEPTH`, inside the map value.
        let ip = unsafe { (*s).ips[i] };
        h = (h ^ ip).wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h |= 1;
    // SAFETY: `s` is a map value.
    unsafe { (*s).len = len };
    // By reference: a copy would not fit on the eBPF stack.
    let walked: &Stack = unsafe { &*s };
    match STACKS.insert(h, walked, u64::from(BPF_NOEXIST)) {
        Ok(()) => Some(h),
        Err(e) if e == EEXIST => Some(h),
        Err(_) => {
            count_error(ERR_STACKS_FULL);
            None
        }
    }
}

/// The CFI walk: user space loads each process's executable regions and
/// their files' compiled rows (`rtrace_common::unwind`); each frame is a
/// search for its region, a bounded binary search for its row, and one or
/// two reads of the user stack.
#[cfg(feature = "cfi")]
mod cfi {
    use aya_ebpf::{
        EbpfContext as _, Global,
        bindings::BPF_F_MMAPABLE,
        helpers::{
            bpf_ktime_get_ns, bpf_probe_read_user,
            generated::{bpf_get_current_task_btf, bpf_loop, bpf_task_pt_regs},
        },
        macros::map,
        maps::{Array, HashMap},
        programs::PerfEventContext,
    };
    use rtrace_common::{
        profile::{ERR_CUT_SHORT, ERR_FP_FRAMES, MAX_DEPTH},
        unwind::{
            CFA_END, CFA_PLT, CFA_RBP, CFA_RSP, CfiOffsets, CfiRow, MAX_REGIONS, NEW_CODE_EVERY_NS,
            ProcRegions, RBP_SAVED, Region, SEARCH_STEPS,
        },
    };
    use rtrace_ebpf::{count_error, global, read_kernel};

    use super::Scratch;

    /// Offsets into `struct pt_regs` and `struct task_struct`, from BTF.
    #[unsafe(no_mangle)]
    static CFI_OFFSETS: Global<CfiOffsets> = Global::new(CfiOffsets {
        ip: 0,
        sp: 0,
        bp: 0,
        cs: 0,
        task_pid: 0,
        task_tgid: 0,
    });

    /// Every loaded file's rows; user space sizes it and writes them
    /// through a shared mapping, not a syscall per row.
    #[map]
    static CFI_ROWS: Array<CfiRow> = Array::with_max_entries(1, BPF_F_MMAPABLE);
    /// Each process's regions, by process id; user space sizes it.
    #[map]
    static CFI_PROCS: HashMap<u32, ProcRegions> = HashMap::with_max_entries(1, 0);

    /// Steps of the binary search of a process's regions.
    const REGION_STEPS: usize = MAX_REGIONS.next_power_of_two().trailing_zeros() as usize + 1;

    /// A walk in progress. It lives in the per-CPU scratch value, not on
    /// the stack: kernels before 6.7 verify a `bpf_loop` callback once,
    /// with the values the caller's stack held at the call, and hard-wire
    /// the branches only later iterations take (a first frame has no
    /// caller, an empty region cache never hits). A map value's contents
    /// are unknown to the verifier.
    #[repr(C)]
    pub struct State {
        ip: u64,
        sp: u64,
        bp: u64,
        depth: u32,
        /// Set when a frame's code is in no region of the process.
        new_code: u32,
        /// The region the last frame was in: callers are mostly in the
        /// same file, so it is tried before the search.
        last: Region,
    }

    /// What every frame of one walk works on, handed to `bpf_loop`'s
    /// callback; it does not change during the walk.
    #[repr(C)]
    struct Walk {
        scratch: *mut Scratch,
        procs: *const ProcRegions,
    }

    /// The user registers at the sample: the context's, if the sample hit
    /// user mode, else those the task entered the kernel with.
    #[inline(always)]
    fn user_regs(ctx: &PerfEventContext) -> Option<(u64, u64, u64)> {
        let o = global(&CFI_OFFSETS);
        let read = |base: *const u8, off: u32| read_kernel::<u64>(base, off).ok();
        let mut regs = ctx.as_ptr() as *const u8;
        if read(regs, o.cs)? & 3 != 3 {
            // SAFETY: the helpers have no preconditions beyond a task.
            regs = unsafe { bpf_task_pt_regs(bpf_get_current_task_btf()) } as *const u8;
            if regs.is_null() {
                return None;
            }
        }
        Some((read(regs, o.ip)?, read(regs, o.sp)?, read(regs, o.bp)?))
    }

    #[inline(always)]
    fn row(index: u32) -> Option<CfiRow> {
        CFI_ROWS.get(index).copied()
    }

    #[inline(always)]
    fn read_user<T>(addr: u64) -> Option<T> {
        // SAFETY: the helper copes with any address.
        unsafe { bpf_probe_read_user(addr as *const T) }.ok()
    }

    /// The region of `procs` that holds `ip`, by halves (user space lists
    /// them in address order); the last frame's region first.
    #[inline(always)]
    fn region(procs: &ProcRegions, st: &mut State, ip: u64) -> bool {
        if st.last.start <= ip && ip < st.last.end {
            return true;
        }
        let (mut lo, mut hi) = (0u32, procs.n);
        for _ in 0..REGION_STEPS {
            if lo >= hi {
                return false;
            }
            let mid = lo + (hi - lo) / 2;
            let Some(r) = procs.regions.get(mid as usize) else {
                return false;
            };
            if ip < r.start {
                hi = mid;
            } else if ip >= r.end {
                lo = mid + 1;
            } else {
                st.last = *r;
                return true;
            }
        }
        false
    }

    /// The row of region `r`'s file for file address `pc`, if any CFI
    /// covers it: the last row at or before `pc`, found by halves.
    #[inline(always)]
    fn search_rows(r: &Region, pc: u64) -> Option<CfiRow> {
        let (start, mut lo, mut hi) = (r.row_start, 0u32, r.row_len);
        for _ in 0..SEARCH_STEPS {
            if lo >= hi {
                break;
            }
            let mid = lo + (hi - lo) / 2;
            if row(start + mid)?.pc <= pc {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        if lo == 0 {
            return None;
        }
        row(start + lo - 1)
    }

    /// One frame of the walk, run by `bpf_loop`: records the frame's pc
    /// and steps to the caller; 1 ends the walk.
    #[inline(never)]
    extern "C" fn frame(_index: u64, ctx: *mut core::ffi::c_void) -> i64 {
        // SAFETY: `ctx` is the caller's `Walk`, whose pointers are map
        // values that outlive the walk.
        let (scratch, procs) = unsafe {
            let w = &*ctx.cast::<Walk>();
            (&mut *w.scratch, &*w.procs)
        };
        let st = &mut scratch.walk;
        let depth = st.depth as usize;
        let Some(slot) = scratch.stack.ips.get_mut(depth) else {
            return 1;
        };
        *slot = st.ip;
        st.depth += 1;
        // A return address is looked up at its call, one byte back.
        let back = u64::from(depth > 0);
        let ip = st.ip;
        let found = if region(procs, st, ip) {
            let bias = st.last.bias;
            search_rows(&st.last, ip.wrapping_sub(bias).wrapping_sub(back))
                .filter(|r| r.cfa != 0)
                .map(|r| (bias, r))
        } else {
            st.new_code = 1;
            None
        };
        let Some((bias, r)) = found else {
            // No CFI here: the frame pointer, counted.
            if st.bp == 0 {
                return 1;
            }
            count_error(ERR_FP_FRAMES);
            let Some([bp, ret]) = read_user::<[u64; 2]>(st.bp) else {
                count_error(ERR_CUT_SHORT);
                return 1;
            };
            st.sp = st.bp + 16;
            st.bp = bp;
            st.ip = ret;
            return i64::from(ret == 0);
        };
        let cfa = match r.cfa {
            CFA_RSP => st.sp.wrapping_add(r.cfa_offset as i64 as u64),
            CFA_RBP => st.bp.wrapping_add(r.cfa_offset as i64 as u64),
            CFA_PLT => {
                let pc = ip.wrapping_sub(bias);
                st.sp
                    + 8
                    + if (pc & 15) >= r.cfa_offset as u64 {
                        8
                    } else {
                        0
                    }
            }
            CFA_END => return 1,
            _ => return 1,
        };
        // The return address is at CFA - 8; rbp, where saved, is nearly
        // always just below it, and then one read fetches both.
        let ret = if r.rbp == RBP_SAVED && r.rbp_offset == -16 {
            let Some([bp, ret]) = read_user::<[u64; 2]>(cfa.wrapping_sub(16)) else {
                count_error(ERR_CUT_SHORT);
                return 1;
            };
            st.bp = bp;
            ret
        } else {
            let Some(ret) = read_user::<u64>(cfa.wrapping_sub(8)) else {
                count_error(ERR_CUT_SHORT);
                return 1;
            };
            if r.rbp == RBP_SAVED {
                match read_user::<u64>(cfa.wrapping_add(r.rbp_offset as i64 as u64)) {
                    Some(v) => st.bp = v,
                    None => {
                        count_error(ERR_CUT_SHORT);
                        return 1;
                    }
                }
            }
            ret
        };
        st.sp = cfa;
        st.ip = ret;
        i64::from(ret == 0)
    }

    /// A process that runs a new program has none of the regions user
    /// space read before: they are dropped at once (its samples go by frame
    /// pointer, counted, until it has new ones). Without this, regions read
    /// between a fork and its exec would be trusted for the new program's
    /// code. User space is told to read them, for a new process too: on a
    /// host where short-lived programs come and go, waiting for a first
    /// sample would leave much of their short lives to the frame pointer.
    #[aya_ebpf::macros::tracepoint]
    pub fn profile_exec(ctx: aya_ebpf::programs::TracePointContext) -> u32 {
        let id = aya_ebpf::helpers::bpf_get_current_pid_tgid();
        let tgid = (id >> 32) as u32;
        let _ = CFI_PROCS.remove(tgid);
        // Its first stacks as the new program are told, for its symbols.
        let _ = super::SEEN.remove(tgid);
        if rtrace_ebpf::targets::admits(tgid, id as u32) {
            rtrace_ebpf::events::emit(
                &super::EVENTS,
                &ctx,
                &rtrace_common::profile::Seen::new(tgid, rtrace_common::profile::SEEN_EXEC),
            );
        }
        0
    }

    /// A new process runs its parent's code at the same addresses until it
    /// runs a program of its own, so it gets a copy of its parent's regions
    /// at once, and user space is told so that it forgets them when the
    /// child exits. A shell's children otherwise spend their lives between
    /// fork and exec without tables. New threads share their process's.
    #[aya_ebpf::macros::raw_tracepoint(tracepoint = "sched_process_fork")]
    pub fn profile_fork(ctx: aya_ebpf::programs::RawTracePointContext) -> i32 {
        let child: *const u8 = ctx.arg(1);
        let o = global(&CFI_OFFSETS);
        let (Ok(pid), Ok(tgid)) = (
            read_kernel::<u32>(child, o.task_pid),
            read_kernel::<u32>(child, o.task_tgid),
        ) else {
            return 0;
        };
        if pid != tgid {
            return 0;
        }
        let parent = (aya_ebpf::helpers::bpf_get_current_pid_tgid() >> 32) as u32;
        let Some(regions) = CFI_PROCS.get_ptr(parent) else {
            return 0;
        };
        // By reference: the helper copies the map value, which would not
        // fit on the eBPF stack.
        // SAFETY: a map value.
        #[allow(clippy::needless_borrows_for_generic_args)]
        let copied = CFI_PROCS.insert(tgid, unsafe { &*regions }, 0).is_ok();
        if copied {
            rtrace_ebpf::events::emit(
                &super::EVENTS,
                &ctx,
                &rtrace_common::profile::Seen {
                    tgid,
                    flags: rtrace_common::profile::SEEN_FORK,
                    parent,
                    _pad: 0,
                },
            );
        }
        0
    }

    /// Walks the current task's user stack into the scratch value's stack
    /// and returns its depth, and whether user space should read the
    /// process's regions again (it ran code in none of them; said at most
    /// every `NEW_CODE_EVERY_NS`); `None` if its process has no tables
    /// (the caller then walks by frame pointer).
    #[inline(always)]
    pub fn walk(ctx: &PerfEventContext, tgid: u32, scratch: *mut Scratch) -> Option<(u64, bool)> {
        let procs = CFI_PROCS.get_ptr_mut(tgid)?;
        let Some((ip, sp, bp)) = user_regs(ctx) else {
            count_error(ERR_CUT_SHORT);
            return Some((0, false));
        };
        // Kernel threads have no user registers: no user stack, and no
        // "new code" to tell user space of on every sample.
        if ip == 0 {
            return Some((0, false));
        }
        // SAFETY: a map value.
        unsafe {
            (*scratch).walk = State {
                ip,
                sp,
                bp,
                depth: 0,
                new_code: 0,
                last: Region::default(),
            }
        };
        let mut w = Walk { scratch, procs };
        // SAFETY: `frame` is a callback of bpf_loop's signature and `w`
        // lives across the call.
        unsafe {
            bpf_loop(
                MAX_DEPTH as u32,
                frame as *mut core::ffi::c_void,
                (&raw mut w).cast(),
                0,
            )
        };
        // SAFETY: a map value.
        let st = unsafe { &(*scratch).walk };
        let mut tell = false;
        if st.new_code != 0 {
            // SAFETY: the helper has no preconditions; `procs` is a map
            // value (a lost race only tells user space twice).
            unsafe {
                let now = bpf_ktime_get_ns();
                if now.wrapping_sub((*procs).new_code_ns) > NEW_CODE_EVERY_NS {
                    (*procs).new_code_ns = now;
                    tell = true;
                }
            }
        }
        Some((u64::from(st.depth), tell))
    }
}

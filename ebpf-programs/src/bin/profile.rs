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
/// The generation samples are counted in, flipped by user space when it
/// moves the other one's counts out.
#[map]
static GEN: Array<u32> = Array::with_max_entries(1, 0);
/// Stacks by hash; user space sizes it (`--stack-storage-size`) and moves
/// them out as the profile runs.
#[map]
static STACKS: HashMap<u64, Stack> = HashMap::with_max_entries(16384, 0);
/// Where a stack is walked: it is larger than the eBPF stack.
#[map]
static SCRATCH: PerCpuArray<Stack> = PerCpuArray::with_max_entries(1, 0);

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
        Some(true) => emit(&EVENTS, ctx, &Seen { tgid, flags: 0 }),
        Some(false) => {}
        None => count_error(ERR_COUNTS_FULL),
    }
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
                        &Seen {
                            tgid,
                            flags: rtrace_common::profile::SEEN_NEW_CODE,
                        },
                    );
                }
                return store(s, len);
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
/// search for its region, a bounded binary search for its row, and two
/// reads of the user stack.
#[cfg(feature = "cfi")]
mod cfi {
    use aya_ebpf::{
        EbpfContext as _, Global,
        helpers::{
            bpf_ktime_get_ns, bpf_probe_read_kernel, bpf_probe_read_user,
            generated::{bpf_get_current_task_btf, bpf_loop, bpf_task_pt_regs},
        },
        macros::map,
        maps::{Array, HashMap},
        programs::PerfEventContext,
    };
    use rtrace_common::{
        profile::{ERR_CUT_SHORT, ERR_FP_FRAMES, MAX_DEPTH, Stack},
        unwind::{
            CFA_END, CFA_PLT, CFA_RBP, CFA_RSP, CHUNK, CfiRow, MAX_REGIONS, NEW_CODE_EVERY_NS,
            ProcRegions, RBP_SAVED, RegsOffsets, RowChunk, SEARCH_STEPS,
        },
    };
    use rtrace_ebpf::{count_error, global};

    /// Offsets into `struct pt_regs`, from BTF.
    #[unsafe(no_mangle)]
    static CFI_REGS: Global<RegsOffsets> = Global::new(RegsOffsets {
        ip: 0,
        sp: 0,
        bp: 0,
        cs: 0,
    });

    /// Every loaded file's rows, in chunks; user space sizes it.
    #[map]
    static CFI_ROWS: Array<RowChunk> = Array::with_max_entries(1, 0);
    /// Each process's regions, by process id; user space sizes it.
    #[map]
    static CFI_PROCS: HashMap<u32, ProcRegions> = HashMap::with_max_entries(1, 0);

    /// The user registers at the sample: the context's, if the sample hit
    /// user mode, else those the task entered the kernel with.
    #[inline(always)]
    fn user_regs(ctx: &PerfEventContext) -> Option<(u64, u64, u64)> {
        let o = global(&CFI_REGS);
        let read = |base: *const u8, off: u32| -> Option<u64> {
            // SAFETY: the helper copes with any address.
            unsafe { bpf_probe_read_kernel(base.wrapping_add(off as usize).cast::<u64>()) }.ok()
        };
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
        let chunk = CFI_ROWS.get(index / CHUNK as u32)?;
        chunk.rows.get(index as usize % CHUNK).copied()
    }

    #[inline(always)]
    fn read_user(addr: u64) -> Option<u64> {
        // SAFETY: the helper copes with any address.
        unsafe { bpf_probe_read_user(addr as *const u64) }.ok()
    }

    /// A walk in progress, on the program's stack, handed to each frame.
    #[repr(C)]
    struct State {
        ip: u64,
        sp: u64,
        bp: u64,
        tgid: u32,
        depth: u32,
        /// Set when a frame's code is in no region of the process.
        new_code: u32,
        _pad: u32,
    }

    /// A region search in progress, for `bpf_loop`.
    #[repr(C)]
    struct RegionSearch {
        tgid: u32,
        n: u32,
        ip: u64,
        bias: u64,
        row_start: u32,
        row_len: u32,
        found: u32,
        _pad: u32,
    }

    /// Looks at region `index`; 1 stops the search.
    #[inline(never)]
    extern "C" fn region_step(index: u64, ctx: *mut core::ffi::c_void) -> i64 {
        // SAFETY: `ctx` is the search on the caller's stack.
        let q = unsafe { &mut *ctx.cast::<RegionSearch>() };
        if index >= u64::from(q.n) {
            return 1;
        }
        let Some(procs) = CFI_PROCS.get_ptr(q.tgid) else {
            return 1;
        };
        // SAFETY: a map value.
        let Some(r) = (unsafe { &*procs }).regions.get(index as usize) else {
            return 1;
        };
        if r.start <= q.ip && q.ip < r.end {
            q.bias = r.bias;
            q.row_start = r.row_start;
            q.row_len = r.row_len;
            q.found = 1;
            return 1;
        }
        0
    }

    /// A binary search of rows in progress, for `bpf_loop`.
    #[repr(C)]
    struct RowSearch {
        pc: u64,
        start: u32,
        lo: u32,
        hi: u32,
        _pad: u32,
    }

    /// One step of the search for the last row at or before `pc`; 1 stops.
    #[inline(never)]
    extern "C" fn row_step(_index: u64, ctx: *mut core::ffi::c_void) -> i64 {
        // SAFETY: `ctx` is the search on the caller's stack.
        let q = unsafe { &mut *ctx.cast::<RowSearch>() };
        if q.lo >= q.hi {
            return 1;
        }
        let mid = q.lo + (q.hi - q.lo) / 2;
        match row(q.start + mid) {
            Some(r) if r.pc <= q.pc => q.lo = mid + 1,
            Some(_) => q.hi = mid,
            None => return 1,
        }
        0
    }

    /// The rule for `ip` in process `tgid`'s regions: the region's bias and
    /// the row, if any CFI covers it. Code in no region sets `new_code`.
    #[inline(always)]
    fn rule(tgid: u32, n: u32, ip: u64, back: u64, new_code: &mut u32) -> Option<(u64, CfiRow)> {
        let mut regions = RegionSearch {
            tgid,
            n,
            ip,
            bias: 0,
            row_start: 0,
            row_len: 0,
            found: 0,
            _pad: 0,
        };
        // SAFETY: a callback of bpf_loop's signature, and its state.
        unsafe {
            bpf_loop(
                MAX_REGIONS as u32,
                region_step as *mut core::ffi::c_void,
                (&raw mut regions).cast(),
                0,
            )
        };
        if regions.found == 0 {
            *new_code = 1;
            return None;
        }
        let mut rows = RowSearch {
            pc: ip.wrapping_sub(regions.bias).wrapping_sub(back),
            start: regions.row_start,
            lo: 0,
            hi: regions.row_len,
            _pad: 0,
        };
        // SAFETY: as above.
        unsafe {
            bpf_loop(
                SEARCH_STEPS as u32,
                row_step as *mut core::ffi::c_void,
                (&raw mut rows).cast(),
                0,
            )
        };
        if rows.lo == 0 {
            return None;
        }
        Some((regions.bias, row(rows.start + rows.lo - 1)?))
    }

    /// One frame of the walk, run by `bpf_loop`: records the frame's pc
    /// and steps to the caller; 1 ends the walk.
    #[inline(never)]
    extern "C" fn frame(_index: u64, ctx: *mut core::ffi::c_void) -> i64 {
        // SAFETY: `ctx` is the walk's `State` on the caller's stack.
        let st = unsafe { &mut *ctx.cast::<State>() };
        let Some(s) = super::SCRATCH.get_ptr_mut(0) else {
            return 1;
        };
        let Some(procs) = CFI_PROCS.get_ptr(st.tgid) else {
            return 1;
        };
        // SAFETY: a map value.
        let n = unsafe { (*procs).n };
        let depth = st.depth as usize;
        if depth >= MAX_DEPTH {
            return 1;
        }
        // SAFETY: `depth < MAX_DEPTH`, inside the map value.
        unsafe { (*s).ips[depth] = st.ip };
        st.depth += 1;
        // A return address is looked up at its call, one byte back.
        let back = u64::from(depth > 0);
        let found = rule(st.tgid, n, st.ip, back, &mut st.new_code);
        let Some((bias, r)) = found.filter(|(_, r)| r.cfa != 0) else {
            // No CFI here: the frame pointer, counted.
            if st.bp == 0 {
                return 1;
            }
            count_error(ERR_FP_FRAMES);
            let (Some(ret), Some(bp)) = (read_user(st.bp + 8), read_user(st.bp)) else {
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
                let pc = st.ip.wrapping_sub(bias);
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
        let Some(ret) = read_user(cfa.wrapping_sub(8)) else {
            count_error(ERR_CUT_SHORT);
            return 1;
        };
        if r.rbp == RBP_SAVED {
            match read_user(cfa.wrapping_add(r.rbp_offset as i64 as u64)) {
                Some(v) => st.bp = v,
                None => {
                    count_error(ERR_CUT_SHORT);
                    return 1;
                }
            }
        }
        st.sp = cfa;
        st.ip = ret;
        i64::from(ret == 0)
    }

    /// Walks the current task's user stack into `s` and returns its depth,
    /// and whether user space should read the process's regions again (it
    /// ran code in none of them; said at most every `NEW_CODE_EVERY_NS`);
    /// `None` if its process has no tables (the caller then walks by frame
    /// pointer).
    #[inline(always)]
    pub fn walk(ctx: &PerfEventContext, tgid: u32, _s: *mut Stack) -> Option<(u64, bool)> {
        let procs = CFI_PROCS.get_ptr_mut(tgid)?;
        let Some((ip, sp, bp)) = user_regs(ctx) else {
            count_error(ERR_CUT_SHORT);
            return Some((0, false));
        };
        let mut st = State {
            ip,
            sp,
            bp,
            tgid,
            depth: 0,
            new_code: 0,
            _pad: 0,
        };
        // SAFETY: `frame` is a callback of bpf_loop's signature and `st`
        // lives across the call.
        unsafe {
            bpf_loop(
                MAX_DEPTH as u32,
                frame as *mut core::ffi::c_void,
                (&raw mut st).cast(),
                0,
            )
        };
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

//! trace: bcc's trace probes, run by the interpreter argdist's specs run
//! on (`rtrace_ebpf::expr`), one generic program per probe slot. A run
//! that passes its probe's filter sends one event with the values its
//! format prints, and the stacks asked for.
#![no_std]
#![no_main]

use aya_ebpf::{
    EbpfContext, Global,
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_current_uid_gid,
        bpf_get_smp_processor_id, bpf_ktime_get_ns, generated::bpf_get_stack,
    },
    macros::map,
    maps::PerCpuArray,
    programs::{ProbeContext, RetProbeContext, TracePointContext},
};
use rtrace_common::{
    argdist::{KIND_RETURN, Probe},
    trace::{Config, ERR_ENTRIES_FULL, ERR_KERNEL_STACK, Event, HEADER_SIZE, MAX_FRAMES},
};
use rtrace_ebpf::{
    count_error,
    events::emit_bytes,
    expr::{self, Sources, passes},
    global,
};

rtrace_ebpf::event_map!();
rtrace_ebpf::cfi_programs!();

#[unsafe(no_mangle)]
static CONFIG: Global<Config> = Global::new(unsafe { core::mem::zeroed() });

/// Where an event is put together: larger than the eBPF stack.
#[map]
static SCRATCH: PerCpuArray<Event> = PerCpuArray::with_max_entries(1, 0);

/// The probe of `slot`, unless the current task is filtered out.
#[inline(always)]
fn probe(slot: usize) -> Option<&'static Probe> {
    let cfg = global(&CONFIG);
    let p = expr::admitted(&cfg.probes, slot)?;
    if cfg.uid != u32::MAX && bpf_get_current_uid_gid() as u32 != cfg.uid {
        return None;
    }
    Some(p)
}

/// Walks a stack into `frames` (`MAX_FRAMES` of them); the frames walked,
/// 0 if the walk failed (counted as `error`).
#[inline(always)]
fn walk<C: EbpfContext>(ctx: &C, frames: *mut u64, flags: u64, error: u32) -> u32 {
    // SAFETY: `frames` has room for `MAX_FRAMES` addresses.
    let n = unsafe { bpf_get_stack(ctx.as_ptr(), frames.cast(), (MAX_FRAMES * 8) as u32, flags) };
    if n < 0 {
        count_error(error);
        return 0;
    }
    (n as u64 / 8).min(MAX_FRAMES as u64) as u32
}

/// Sends the run's event if the probe's filter passes.
#[inline(always)]
fn send<C: EbpfContext>(ctx: &C, p: &Probe, slot: usize, s: &Sources) {
    if !passes(p, s) {
        return;
    }
    let Some(e) = SCRATCH.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: this CPU's scratch event.
    let e = unsafe { &mut *e };
    // SAFETY: the helpers have no preconditions.
    e.ts = unsafe { bpf_ktime_get_ns() };
    e.probe = slot as u32;
    e.pid = (s.id >> 32) as u32;
    e.tid = s.id as u32;
    // SAFETY: as above.
    e.cpu = unsafe { bpf_get_smp_processor_id() };
    e.comm = bpf_get_current_comm().unwrap_or([0; 16]);
    expr::values(p, s, &mut e.values, &mut e.strings);
    let cfg = global(&CONFIG);
    e.n_kernel = 0;
    e.ustack = 0;
    if cfg.kernel_stack != 0 {
        e.n_kernel = walk(ctx, e.frames.as_mut_ptr(), 0, ERR_KERNEL_STACK);
    }
    if cfg.user_stack != 0 {
        // The shared walk: from CFI in the `cfi` variant, else frame
        // pointers; from a probe's registers where they are user mode (a
        // uprobe's), else from those the task entered the kernel with.
        e.ustack = rtrace_ebpf::stacks::user_stack(ctx, &EVENTS, e.pid, s.regs).unwrap_or(0);
        rtrace_ebpf::stacks::tell_first(ctx, &EVENTS, e.pid);
    }
    let len = HEADER_SIZE + 8 * (e.n_kernel as usize).min(MAX_FRAMES);
    // SAFETY: `e` is a whole `Event` of a map value.
    unsafe {
        emit_bytes(
            &EVENTS,
            ctx,
            (e as *const Event).cast(),
            len,
            core::mem::size_of::<Event>(),
        );
    }
}

#[inline(always)]
fn on_entry(ctx: &ProbeContext, slot: usize) {
    let Some(p) = probe(slot) else { return };
    let id = bpf_get_current_pid_tgid();
    if p.kind == KIND_RETURN {
        expr::enter(ctx, slot, id, ERR_ENTRIES_FULL);
        return;
    }
    send(ctx, p, slot, &expr::at_entry(ctx, id));
}

#[inline(always)]
fn on_return(ctx: &RetProbeContext, slot: usize) {
    let Some(p) = probe(slot) else { return };
    let id = bpf_get_current_pid_tgid();
    let Some(s) = expr::at_return(ctx, ctx.ret(), p, slot, id) else {
        return;
    };
    send(ctx, p, slot, &s);
    expr::leave(&s, slot);
}

#[inline(always)]
fn on_tracepoint(ctx: &TracePointContext, slot: usize) {
    let Some(p) = probe(slot) else { return };
    send(
        ctx,
        p,
        slot,
        &expr::at_tracepoint(ctx, bpf_get_current_pid_tgid()),
    );
}

rtrace_ebpf::spec_programs!();

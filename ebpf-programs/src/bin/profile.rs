//! CPU profiling: a program on a sampling perf event (one per CPU) that
//! counts samples by process and stacks, in the shared stack tables
//! (`rtrace_ebpf::stacks`); with `--off-cpu`, the context-switch programs
//! of `rtrace_ebpf::offcpu` count time off the CPU beside them.
#![no_std]
#![no_main]

use aya_ebpf::{
    EbpfContext, Global,
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid},
    macros::perf_event,
    programs::PerfEventContext,
};
use rtrace_common::profile::{Config, Key, MISSED_KERNEL, MISSED_USER};
use rtrace_ebpf::{global, stacks, targets};

rtrace_ebpf::event_map!();
rtrace_ebpf::cfi_programs!();
rtrace_ebpf::stack_counts!(rtrace_common::profile::Key);
rtrace_ebpf::offcpu_programs!(rtrace_common::profile::Key, &global(&CONFIG).off_cpu);

/// Set by user space before load.
#[unsafe(no_mangle)]
static CONFIG: Global<Config> = Global::new(unsafe { core::mem::zeroed() });

#[perf_event]
pub fn profile(ctx: PerfEventContext) -> u32 {
    sample(&ctx);
    0
}

#[inline(always)]
fn sample(ctx: &PerfEventContext) {
    let cfg = global(&CONFIG);
    let id = bpf_get_current_pid_tgid();
    let (tid, tgid) = (id as u32, (id >> 32) as u32);
    if tid == 0 && cfg.include_idle == 0 {
        return;
    }
    if !targets::admits(tgid, tid) {
        return;
    }
    let mut key = Key::new(tgid, bpf_get_current_comm().unwrap_or([0; 16]));
    key.generation = stacks::generation();
    if cfg.kernel != 0 {
        match stacks::kernel_stack(ctx) {
            Some(h) => key.kernel = h,
            None => key.flags |= MISSED_KERNEL,
        }
    }
    if cfg.user != 0 {
        // The sample's registers: the walk starts there when it hit user
        // mode.
        match stacks::user_stack(ctx, &EVENTS, tgid, ctx.as_ptr() as *const u8) {
            Some(h) => key.user = h,
            None => key.flags |= MISSED_USER,
        }
    }
    stacks::add(ctx, &EVENTS, &STACK_COUNTS, &key, 1);
}

//! Off-CPU time by stack: the context-switch programs of
//! [`rtrace_ebpf::offcpu`], counting by the blocked thread's stacks and,
//! with `--waker`, its waker's.
#![no_std]
#![no_main]

use aya_ebpf::Global;
use rtrace_common::offcputime::Config;
use rtrace_ebpf::global;

rtrace_ebpf::event_map!();
// Its switch program's frame leaves room for the runtimes' steps apart:
// on 6.18 the walk then takes the verifier 149k instructions, not 280k.
rtrace_ebpf::cfi_programs!(steps_apart);
rtrace_ebpf::stack_counts!(rtrace_common::stacks::WakeKey);
rtrace_ebpf::offcpu_programs!(
    rtrace_common::stacks::WakeKey,
    global(&CONFIG),
    rtrace_common::offcputime::ERR_INTERVALS_LOST
);

/// Set by user space before load.
#[unsafe(no_mangle)]
static CONFIG: Global<Config> = Global::new(unsafe { core::mem::zeroed() });

//! Who a process is: its id and when it started, the start read here
//! for the stack key and every record the stack programs send, so that
//! user space tells a pid's processes apart.

use aya_ebpf::Global;
use rtrace_common::stacks::BornOffsets;

/// Where the current process's start time is read ([`born`]); user
/// space sets it from BTF in every object that counts stacks.
#[unsafe(no_mangle)]
static BORN_OFFSETS: Global<BornOffsets> = Global::new(BornOffsets {
    group_leader: 0,
    start_boottime: 0,
});

/// When the process of `task` started (its thread group leader's
/// `start_boottime`): with its id, who it is, as its pid is reused once
/// it has exited. 0 where the offsets were not set or the read failed.
#[inline(always)]
pub fn born_of(task: *const u8) -> u64 {
    let o = crate::global(&BORN_OFFSETS);
    if o.start_boottime == 0 {
        return 0;
    }
    let leader = crate::read_ptr(task, o.group_leader);
    crate::read_kernel::<u64>(leader, o.start_boottime).unwrap_or(0)
}

/// When the current process started ([`born_of`]), read through the
/// current task's BTF-typed pointer: two plain loads the verifier checks,
/// where [`born_of`]'s two helper calls cost some hundreds of
/// nanoseconds a sample (measured with `--unwind fp`, whose walk is the
/// kernel's and cheap).
#[inline(always)]
pub fn born() -> u64 {
    let o = crate::global(&BORN_OFFSETS);
    if o.start_boottime == 0 {
        return 0;
    }
    // SAFETY: a BTF-typed pointer to the current task; its members'
    // offsets come from BTF, and the verifier checks each load (a fault
    // reads as zero).
    unsafe {
        let task = aya_ebpf::helpers::generated::bpf_get_current_task_btf() as *const u8;
        let leader = core::ptr::read_volatile(
            task.wrapping_add(o.group_leader as usize) as *const *const u8
        );
        if leader.is_null() {
            return 0;
        }
        core::ptr::read_volatile(leader.wrapping_add(o.start_boottime as usize) as *const u64)
    }
}

/// [`born`] read by the helper, for what runs seldom: a process's first
/// record, its exec, fork and exit, new code, the runtimes' new frames.
/// [`born`]'s load of the leader is a pointer member of a BTF-typed
/// task, whose trust the verifier looks up by name through every type of
/// the kernel's BTF, again at each state it reaches the load in (with the
/// mapping lookup's, 8 % of the native walk's load on 6.18). The
/// helper's two calls cost their hundreds of nanoseconds only where
/// they run. The stack key's [`born`], read every sample, keeps the
/// loads, once, before the walk.
#[inline(always)]
pub fn born_seldom() -> u64 {
    // SAFETY: the helper has no preconditions; its result is only read
    // through the probe helper.
    born_of(unsafe { aya_ebpf::helpers::generated::bpf_get_current_task() } as *const u8)
}

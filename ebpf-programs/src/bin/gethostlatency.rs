//! Host name lookups through libc's resolver, timed from the call to its
//! return with a uprobe and a uretprobe on each function.
//!
//! A lookup in flight is kept by thread: built with the `task_storage`
//! feature, in the thread's own storage (5.11+), which costs neither a
//! hash nor a bucket lock, and is cleared rather than deleted at return;
//! otherwise in a hash by thread id.
#![no_std]
#![no_main]

use aya_ebpf::{
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns,
        bpf_probe_read_user_str_bytes,
    },
    macros::{map, uprobe, uretprobe},
    maps::PerCpuArray,
    programs::{ProbeContext, RetProbeContext},
};
use rtrace_common::{
    events::LOST_TABLE,
    gethostlatency::{Event, FUNC_BY_ADDR, Start},
};
use rtrace_ebpf::{count_error, events::emit, targets};

rtrace_ebpf::event_map!();

rtrace_ebpf::in_flight!(Start, start_ns);

/// Where an event is put together.
#[map]
static EVENT: PerCpuArray<Event> = PerCpuArray::with_max_entries(1, 0);

#[inline(always)]
fn enter(ctx: &ProbeContext, func: u32) {
    if !targets::admits_current() {
        return;
    }
    // A traced function called by another one: the outer call is the
    // lookup, timed whole.
    if let Some(outer) = start_peek() {
        // SAFETY: this thread's operation in flight.
        unsafe { (*outer).depth += 1 };
        return;
    }
    let Some(start) = start_slot() else {
        // No room (or, before 6.19, task storage's per-CPU busy guard
        // refusing a nested call): counted, never silent.
        count_error(LOST_TABLE);
        return;
    };
    let host: *const u8 = ctx.arg(0).unwrap_or(core::ptr::null());
    // SAFETY: `start` is this thread's slot (or this CPU's scratch value).
    unsafe {
        (*start).func = func;
        (*start).depth = 0;
        (*start).host[0] = 0;
        if func == FUNC_BY_ADDR {
            // gethostbyaddr(addr, len, type): the address's bytes.
            let len: u32 = ctx.arg(1).unwrap_or(0);
            let family: u32 = ctx.arg(2).unwrap_or(0);
            let h = &mut (*start).host;
            h[0] = family as u8;
            h[1] = 0;
            if len == 4 || len == 16 {
                h[1] = len as u8;
                let to = &mut h[2..18];
                // SAFETY: the helper copes with any user address.
                let _ = aya_ebpf::helpers::bpf_probe_read_user_buf(host, to);
            }
        } else if !host.is_null() {
            // SAFETY: the helper copes with any user address.
            let _ = bpf_probe_read_user_str_bytes(host, &mut (*start).host);
        }
        // Last, as it marks the slot in use.
        (*start).start_ns = bpf_ktime_get_ns();
    }
    if !start_commit(start) {
        count_error(LOST_TABLE);
    }
}

#[uprobe]
pub fn enter_getaddrinfo(ctx: ProbeContext) -> u32 {
    enter(&ctx, 0);
    0
}

#[uprobe]
pub fn enter_gethostbyname(ctx: ProbeContext) -> u32 {
    enter(&ctx, 1);
    0
}

#[uprobe]
pub fn enter_gethostbyname2(ctx: ProbeContext) -> u32 {
    enter(&ctx, 2);
    0
}

#[uprobe]
pub fn enter_gethostbyname_r(ctx: ProbeContext) -> u32 {
    enter(&ctx, 3);
    0
}

#[uprobe]
pub fn enter_gethostbyaddr(ctx: ProbeContext) -> u32 {
    enter(&ctx, FUNC_BY_ADDR);
    0
}

/// Attached to the return of every function above.
#[uretprobe]
pub fn lookup_return(ctx: RetProbeContext) -> u32 {
    // The return of a call inside the lookup.
    if let Some(outer) = start_peek() {
        // SAFETY: this thread's operation in flight.
        unsafe {
            if (*outer).depth > 0 {
                (*outer).depth -= 1;
                return 0;
            }
        }
    }
    let Some(start) = start_take() else {
        return 0;
    };
    let Some(e) = EVENT.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: `e` is this CPU's scratch event.
    unsafe {
        (*e).delta_ns = bpf_ktime_get_ns().saturating_sub(start.start_ns);
        (*e).pid = (bpf_get_current_pid_tgid() >> 32) as u32;
        (*e).func = start.func;
        (*e).comm = bpf_get_current_comm().unwrap_or([0; 16]);
        (*e).host = start.host;
        emit(&EVENTS, &ctx, &*e);
    }
    0
}

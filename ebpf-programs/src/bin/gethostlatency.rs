//! Host name lookups through libc's resolver, timed from the call to its
//! return with a uprobe and a uretprobe on each function.
#![no_std]
#![no_main]

use aya_ebpf::{
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns,
        bpf_probe_read_user_str_bytes,
    },
    macros::{map, uprobe, uretprobe},
    maps::{HashMap, PerCpuArray},
    programs::{ProbeContext, RetProbeContext},
};
use rtrace_common::{
    events::LOST_TABLE,
    gethostlatency::{Event, HOST_LEN, Start},
};
use rtrace_ebpf::{count_error, events::emit, targets};

rtrace_ebpf::event_map!();

/// Lookups in flight, by thread id; user space sizes it.
#[map]
static STARTS: HashMap<u32, Start> = HashMap::with_max_entries(65536, 0);
/// Where an event is put together.
#[map]
static EVENT: PerCpuArray<Event> = PerCpuArray::with_max_entries(1, 0);

#[inline(always)]
fn enter(ctx: &ProbeContext, func: u32) {
    if !targets::admits_current() {
        return;
    }
    // 96 bytes: the stack has room, and the insert copies from there anyway.
    let mut start = Start {
        // SAFETY: the helper has no preconditions.
        start_ns: unsafe { bpf_ktime_get_ns() },
        func,
        _pad: 0,
        host: [0; HOST_LEN],
    };
    let host: *const u8 = ctx.arg(0).unwrap_or(core::ptr::null());
    if !host.is_null() {
        // SAFETY: the helper copes with any user address.
        let _ = unsafe { bpf_probe_read_user_str_bytes(host, &mut start.host) };
    }
    if STARTS
        .insert(bpf_get_current_pid_tgid() as u32, start, 0)
        .is_err()
    {
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

/// Attached to the return of every function above.
#[uretprobe]
pub fn lookup_return(ctx: RetProbeContext) -> u32 {
    let id = bpf_get_current_pid_tgid();
    let Some(s) = STARTS.get_ptr(id as u32) else {
        return 0;
    };
    let Some(e) = EVENT.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: `s` is a STARTS value, read before it is removed; `e` is this
    // CPU's scratch event.
    unsafe {
        let start = &*s;
        (*e).delta_ns = bpf_ktime_get_ns().saturating_sub(start.start_ns);
        (*e).pid = (id >> 32) as u32;
        (*e).func = start.func;
        (*e).comm = bpf_get_current_comm().unwrap_or([0; 16]);
        (*e).host = start.host;
        let _ = STARTS.remove(id as u32);
        emit(&EVENTS, &ctx, &*e);
    }
    0
}

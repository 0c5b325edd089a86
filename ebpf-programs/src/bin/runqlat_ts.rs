//! Run-queue latency on tp_btf with enqueue timestamps in task local
//! storage: no hashing, locking or allocation per context switch, which
//! makes this the cheapest way to trace the scheduler. See
//! `rtrace_ebpf::runqlat` for the logic shared with the `runqlat` object.
#![no_std]
#![no_main]

#[path = "../tools/runqlat.rs"]
mod runqlat;

use aya_ebpf::{macros::btf_tracepoint, programs::BtfTracePointContext};
use rtrace_common::runqlat::ERR_START_UPDATE;
use rtrace_ebpf::{count_error, task_storage::TaskStorage};
use runqlat::{ERRORS, Starts, switch_task, wakeup_task};

/// Enqueue time of each task, 0 while it is not waiting.
#[unsafe(link_section = ".maps")]
#[unsafe(no_mangle)]
static TASK_START: TaskStorage<u64> = TaskStorage::new();

struct InTask;

impl Starts for InTask {
    #[inline(always)]
    fn store(task: *const u8, _pid: u32, now: u64) {
        let p = TASK_START.get(task, true);
        if p.is_null() {
            // Out of memory, or (before 6.19) the storage's per-CPU busy
            // guard refusing a nested call: counted, never silent.
            count_error(&ERRORS, ERR_START_UPDATE);
            return;
        }
        // SAFETY: `p` is this task's storage.
        unsafe { *p = now };
    }

    #[inline(always)]
    fn take(task: *const u8, _pid: u32) -> Option<u64> {
        let p = TASK_START.get(task, false);
        if p.is_null() {
            return None;
        }
        // SAFETY: `p` is this task's storage; clearing it instead of deleting
        // keeps the storage for the task's next wait.
        let start = unsafe { core::mem::replace(&mut *p, 0) };
        (start != 0).then_some(start)
    }
}

#[btf_tracepoint(function = "sched_wakeup")]
pub fn ts_sched_wakeup(ctx: BtfTracePointContext) -> i32 {
    wakeup_task::<InTask, true>(ctx.arg(0));
    0
}

#[btf_tracepoint(function = "sched_wakeup_new")]
pub fn ts_sched_wakeup_new(ctx: BtfTracePointContext) -> i32 {
    wakeup_task::<InTask, true>(ctx.arg(0));
    0
}

#[btf_tracepoint(function = "sched_switch")]
pub fn ts_sched_switch(ctx: BtfTracePointContext) -> i32 {
    switch_task::<InTask, true>(ctx.arg(0), ctx.arg(1), ctx.arg(2));
    0
}

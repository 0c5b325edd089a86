//! Task local storage (`BPF_MAP_TYPE_TASK_STORAGE`), which aya-ebpf 0.2.1
//! lacks. The kernel only creates such maps from a BTF definition, so this
//! is laid out the way BTF map definitions are: pointers whose pointee types
//! carry the map's parameters, filled in by the loader and never read.
//!
//! A value lives inside the task itself: getting it is a pointer chase plus
//! a per-map cache slot, where a hash map costs hashing, a bucket lock and an
//! allocation on every update.

use aya_ebpf::{
    bindings::{BPF_F_NO_PREALLOC, BPF_LOCAL_STORAGE_GET_F_CREATE, bpf_map_type},
    helpers::generated::bpf_task_storage_get,
};

/// A task storage map with values of type `T`.
#[repr(C)]
pub struct TaskStorage<T> {
    r#type: *const [i32; bpf_map_type::BPF_MAP_TYPE_TASK_STORAGE as usize],
    key: *const i32,
    value: *const T,
    // The kernel sizes task storage by the tasks themselves.
    max_entries: *const [i32; 0],
    map_flags: *const [i32; BPF_F_NO_PREALLOC as usize],
}

// SAFETY: the fields are placeholders for the loader; nothing reads them.
unsafe impl<T> Sync for TaskStorage<T> {}

impl<T> TaskStorage<T> {
    /// An empty definition, for a `static` in the `.maps` section.
    pub const fn new() -> Self {
        Self {
            r#type: core::ptr::null(),
            key: core::ptr::null(),
            value: core::ptr::null(),
            max_entries: core::ptr::null(),
            map_flags: core::ptr::null(),
        }
    }

    /// The value stored in `task`, created zeroed if `create` is set and
    /// there is none; null if there is none or it cannot be created.
    ///
    /// `task` must be a BTF-typed `task_struct` pointer (a tp_btf argument
    /// or `bpf_get_current_task_btf`); the verifier rejects anything else.
    #[inline(always)]
    pub fn get(&self, task: *const u8, create: bool) -> *mut T {
        let flags = if create {
            u64::from(BPF_LOCAL_STORAGE_GET_F_CREATE)
        } else {
            0
        };
        // SAFETY: the helper checks the map and the task pointer itself.
        unsafe {
            bpf_task_storage_get(
                (self as *const Self).cast_mut().cast(),
                task.cast_mut().cast(),
                core::ptr::null_mut(),
                flags,
            )
        }
        .cast()
    }
}

impl<T> Default for TaskStorage<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// Declares where a tool keeps each thread's operation in flight, from its
/// entry to its return, as values of type `$v` whose `$started` field (a
/// `u64`, nonzero) marks one in flight, with three functions:
/// `start_slot()`, room for the current thread's operation starting now;
/// `start_commit(slot)`, which keeps what was written there (`false` if
/// there was no room); and `start_take()`, the current thread's operation,
/// taken out.
///
/// Built with the `task_storage` feature, or with `cfi` (whose walk needs
/// 5.15, where task storage is always there), the value lives in the thread
/// itself (5.11+), written in place and cleared rather than deleted at
/// return: no hash, no bucket lock, no allocation. Otherwise it is
/// written to a per-CPU scratch value and inserted into `STARTS`, a hash
/// by thread id that user space sizes.
#[macro_export]
macro_rules! in_flight {
    ($v:ty, $started:ident) => {
        /// Operations in flight, by thread id; user space sizes it.
        #[cfg(not(any(feature = "task_storage", feature = "cfi")))]
        #[aya_ebpf::macros::map]
        static STARTS: aya_ebpf::maps::HashMap<u32, $v> =
            aya_ebpf::maps::HashMap::with_max_entries(1, 0);

        /// Where an entry is put together before it is inserted.
        #[cfg(not(any(feature = "task_storage", feature = "cfi")))]
        #[aya_ebpf::macros::map]
        static START_SCRATCH: aya_ebpf::maps::PerCpuArray<$v> =
            aya_ebpf::maps::PerCpuArray::with_max_entries(1, 0);

        /// Each thread's operation in flight.
        #[cfg(any(feature = "task_storage", feature = "cfi"))]
        #[unsafe(link_section = ".maps")]
        #[unsafe(no_mangle)]
        static TASK_STARTS: $crate::task_storage::TaskStorage<$v> =
            $crate::task_storage::TaskStorage::new();

        /// Room for the current thread's operation starting now.
        #[inline(always)]
        fn start_slot() -> Option<*mut $v> {
            #[cfg(any(feature = "task_storage", feature = "cfi"))]
            {
                let p = TASK_STARTS.get($crate::task_storage::current_task(), true);
                (!p.is_null()).then_some(p)
            }
            #[cfg(not(any(feature = "task_storage", feature = "cfi")))]
            START_SCRATCH.get_ptr_mut(0)
        }

        /// Keeps the operation written to `slot`; `false` if there was no
        /// room.
        #[inline(always)]
        fn start_commit(slot: *mut $v) -> bool {
            #[cfg(any(feature = "task_storage", feature = "cfi"))]
            {
                let _ = slot;
                true
            }
            #[cfg(not(any(feature = "task_storage", feature = "cfi")))]
            {
                // SAFETY: `slot` is this CPU's scratch value.
                let value = unsafe { &*slot };
                let tid = aya_ebpf::helpers::bpf_get_current_pid_tgid() as u32;
                STARTS.insert(tid, value, 0).is_ok()
            }
        }

        /// The current thread's operation in flight, if any, left in
        /// place: for tools whose operations nest (a libc function that
        /// calls another one traced), which count depth in it.
        #[allow(dead_code)]
        #[inline(always)]
        fn start_peek() -> Option<*mut $v> {
            #[cfg(any(feature = "task_storage", feature = "cfi"))]
            {
                let p = TASK_STARTS.get($crate::task_storage::current_task(), false);
                // SAFETY: `p` is this thread's storage, if not null.
                (!p.is_null() && unsafe { (*p).$started } != 0).then_some(p)
            }
            #[cfg(not(any(feature = "task_storage", feature = "cfi")))]
            {
                let tid = aya_ebpf::helpers::bpf_get_current_pid_tgid() as u32;
                STARTS.get_ptr_mut(tid)
            }
        }

        /// The current thread's operation in flight, if any, taken out.
        #[inline(always)]
        fn start_take() -> Option<$v> {
            #[cfg(any(feature = "task_storage", feature = "cfi"))]
            {
                let p = TASK_STARTS.get($crate::task_storage::current_task(), false);
                if p.is_null() {
                    return None;
                }
                // SAFETY: `p` is this thread's storage.
                unsafe {
                    if (*p).$started == 0 {
                        return None;
                    }
                    let v = *p;
                    (*p).$started = 0;
                    Some(v)
                }
            }
            #[cfg(not(any(feature = "task_storage", feature = "cfi")))]
            $crate::take_current(&STARTS)
        }
    };
}

/// The current task as a BTF-typed pointer, which task storage takes.
#[inline(always)]
pub fn current_task() -> *const u8 {
    // SAFETY: the helper has no preconditions.
    unsafe { aya_ebpf::helpers::generated::bpf_get_current_task_btf() as *const u8 }
}

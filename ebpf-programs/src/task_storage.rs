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

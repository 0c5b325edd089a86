//! Reading and deleting hash map entries in batches (`BPF_MAP_LOOKUP_BATCH`,
//! `BPF_MAP_DELETE_BATCH`, Linux 5.6+): a few syscalls per table instead of
//! three per entry, which is what moving a profile's tables out every
//! second costs otherwise. aya 0.14 has no batch operations, so the
//! syscalls are made here; `None` tells the caller to go entry by entry.

use std::{
    mem::MaybeUninit,
    os::fd::{AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd},
};

const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
const BPF_MAP_DELETE_BATCH: libc::c_long = 27;
/// `bpf(2)` command: a link, with the attach type's parameters.
pub const BPF_LINK_CREATE: libc::c_long = 28;
/// `bpf(2)` command: a readable descriptor of an iterator link.
pub const BPF_ITER_CREATE: libc::c_long = 33;

/// The `batch` member of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// `bpf(cmd, attr)`, `attr` being the prefix of `union bpf_attr` that
/// `cmd` reads, passed with its own size: the commands aya 0.14 does not
/// make (batches here, links with parameters, iterators). Gives the
/// call's non-negative result.
pub fn bpf<A>(cmd: libc::c_long, attr: &mut A) -> std::io::Result<i64> {
    // SAFETY: `attr` is a valid `bpf_attr` prefix of its own size, and the
    // callers' pointers in it point at live memory of the lengths it says.
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *mut A, size_of::<A>() as u32) };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// [`bpf`] for a command that makes a descriptor, which it gives.
pub fn bpf_fd<A>(cmd: libc::c_long, attr: &mut A) -> std::io::Result<OwnedFd> {
    let fd = bpf(cmd, attr)?;
    // SAFETY: the kernel returned a new descriptor, ours alone.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Every entry of hash map `fd`, with keys of type `K` and values of type
/// `V` (plain data of the map's key and value sizes); `None` where the
/// kernel has no batch operations, or refused one (the caller then reads
/// entry by entry: nothing was changed).
pub fn lookup_all<K: Copy, V: Copy>(fd: BorrowedFd<'_>) -> Option<Vec<(K, V)>> {
    const CHUNK: usize = 256;
    let mut out = Vec::new();
    let mut keys: Vec<MaybeUninit<K>> = Vec::with_capacity(CHUNK);
    let mut values: Vec<MaybeUninit<V>> = Vec::with_capacity(CHUNK);
    // SAFETY: `MaybeUninit` needs no initialization.
    unsafe {
        keys.set_len(CHUNK);
        values.set_len(CHUNK);
    }
    // The batch token of a hash map is a bucket index.
    let (mut token, mut first) = (0u32, true);
    loop {
        let mut next = 0u32;
        let mut attr = BatchAttr {
            in_batch: if first { 0 } else { (&raw const token) as u64 },
            out_batch: (&raw mut next) as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: CHUNK as u32,
            map_fd: fd.as_raw_fd() as u32,
            ..BatchAttr::default()
        };
        let r = bpf(BPF_MAP_LOOKUP_BATCH, &mut attr);
        let ok = match &r {
            Ok(_) => true,
            // The end of the table, with its last entries.
            Err(e) => e.raw_os_error() == Some(libc::ENOENT),
        };
        if !ok {
            return None;
        }
        for i in 0..(attr.count as usize).min(CHUNK) {
            // SAFETY: the kernel wrote the first `count` keys and values.
            out.push(unsafe { (keys[i].assume_init(), values[i].assume_init()) });
        }
        if r.is_err() {
            return Some(out);
        }
        token = next;
        first = false;
    }
}

/// Deletes `keys` from hash map `fd`, in one call per chunk; keys already
/// gone are skipped. `None` where the kernel has no batch operations.
pub fn delete<K: Copy>(fd: BorrowedFd<'_>, keys: &[K]) -> Option<std::io::Result<()>> {
    for chunk in keys.chunks(4096) {
        let mut done = 0;
        while done < chunk.len() {
            let rest = &chunk[done..];
            let mut attr = BatchAttr {
                keys: rest.as_ptr() as u64,
                count: rest.len() as u32,
                map_fd: fd.as_raw_fd() as u32,
                ..BatchAttr::default()
            };
            match bpf(BPF_MAP_DELETE_BATCH, &mut attr) {
                Ok(_) => break,
                // Stops at a key that is gone: skip it and go on.
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                    done += attr.count as usize + 1;
                }
                // Batches unknown to this kernel (before 5.6).
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return None,
                Err(e) => return Some(Err(e)),
            }
        }
    }
    Some(Ok(()))
}

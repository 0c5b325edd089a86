//! What the running kernel offers, and loading into it: BTF, feature
//! probing, tracefs, privileges, the event transport, the embedded
//! objects, mapped memory, map reads and process mappings. Every layer
//! above may import it; it imports only `rtrace_common`.

pub mod batch;
pub mod btf;
pub mod counters;
pub mod elf;
pub mod features;
pub mod load;
pub mod memory;
pub mod objects;
pub mod privs;
pub mod procmaps;
pub mod scope;
pub mod tracefs;
pub mod transport;
pub mod warning;

/// A NUL-terminated kernel string (`comm`, a file name) as text.
pub fn c_string(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// Now on `CLOCK_MONOTONIC`, the clock of `bpf_ktime_get_ns` and of the
/// times JIT runtimes write in their jitdumps.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

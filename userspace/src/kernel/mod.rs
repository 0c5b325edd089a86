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
pub mod procmem;
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

/// What to add to a CLOCK_MONOTONIC instant (the kernel's event times)
/// for nanoseconds since the Unix epoch, as the two clocks stand now.
pub fn wall_minus_monotonic_ns() -> u64 {
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    wall.wrapping_sub(monotonic_ns())
}

/// The command of task `id` (`/proc/ID/comm`), `None` if it is gone.
pub fn comm_of(id: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{id}/comm"))
        .ok()
        .map(|c| c.trim_end().to_owned())
}

/// The cgroup v2 path of process `pid` (`/proc/PID/cgroup`'s `0::`
/// line), `None` if it is gone or has none.
pub fn cgroup_of(pid: u32) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(str::to_owned)
}

/// The path of process `pid`'s executable, `None` if it is gone or not
/// ours to read (other users' processes without CAP_SYS_PTRACE). One
/// whose first thread has ended shows it through another's
/// ([`procmaps::proc_dir`]), looked for only then.
pub fn exe_of(pid: u32) -> Option<std::path::PathBuf> {
    std::fs::read_link(format!("/proc/{pid}/exe"))
        .or_else(|_| std::fs::read_link(format!("{}/exe", procmaps::proc_dir(pid))))
        .ok()
}

/// This host's name (`uname -n`), `None` if it cannot be read.
pub fn host_name() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_owned())
}

/// Whether SIGINT, SIGTERM or SIGHUP has arrived since the first call:
/// for work after the run (`--wait-exit`), which a signal cuts short.
/// The first call adds an action for the three beside the tracer's own
/// handlers, which keep working.
pub fn stop_requested() -> bool {
    use std::sync::atomic::{AtomicBool, Ordering};
    static STOP: AtomicBool = AtomicBool::new(false);
    static WATCH: std::sync::Once = std::sync::Once::new();
    WATCH.call_once(|| {
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            // SAFETY: the action only stores to an atomic, which is
            // async-signal-safe.
            let _ = unsafe {
                signal_hook_registry::register(sig, || STOP.store(true, Ordering::Relaxed))
            };
        }
    });
    STOP.load(Ordering::Relaxed)
}

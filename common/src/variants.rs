//! The eBPF objects' variants, in one table that the build
//! (`ebpf-build`, which builds them) and user space's loader (which asks
//! for them) both read.
//!
//! Every file of `ebpf-programs/src/bin/` is built once with default
//! features, giving the object named after it, and once more for each
//! feature [`VARIANTS`] lists for it, giving `<bin>_<feature>`. A
//! feature's code is behind `cfg(feature = "...")` in the bin or in the
//! library's macros it calls (`event_map!` for [`PERF`], `cfi_programs!`
//! for [`CFI`], `in_flight!` for [`TASK_STORAGE`]); a bin that takes one
//! of those in needs its row here, or its variant is never built.

/// Events through per-CPU perf buffers instead of a ring buffer (kernels
/// before 5.8): every event object (`event_map!`).
pub const PERF: &str = "perf";
/// State kept in task local storage (5.11+): objects with operations in
/// flight (`in_flight!`), and runqlat's enqueue times.
pub const TASK_STORAGE: &str = "task_storage";
/// User stacks walked in the kernel from compiled call frame information
/// (5.15+), which keeps operations in flight in task storage too
/// (`cfi_programs!`).
pub const CFI: &str = "cfi";
/// The CFI walk as a function the kernel verifies once, on its own
/// (`cfi_programs!` too): far fewer instructions to verify, but a deeper
/// chain of calls, whose frames kernels before 6.13 hold to 512 bytes
/// together, where the programs that walk do not fit.
pub const CFI_GLOBAL: &str = "cfi_global";
/// Slots claimed with BPF's compare-and-exchange (5.12+).
pub const ATOMICS: &str = "atomics";

/// Each bin's variants, by bin, each a cargo feature of `ebpf-programs`
/// and the suffix of the object's name. Bins not listed have none.
pub const VARIANTS: &[(&str, &[&str])] = &[
    ("biolatency", &[ATOMICS]),
    ("execsnoop", &[PERF]),
    ("ext4slower", &[PERF, TASK_STORAGE]),
    ("gethostlatency", &[PERF, TASK_STORAGE]),
    ("memleak", &[PERF, CFI, CFI_GLOBAL, TASK_STORAGE]),
    ("offcputime", &[PERF, CFI, CFI_GLOBAL]),
    ("profile", &[PERF, CFI, CFI_GLOBAL]),
    ("runqlat", &[TASK_STORAGE]),
    ("strace", &[PERF, CFI, CFI_GLOBAL]),
    ("tcplife", &[PERF]),
    ("trace", &[PERF, CFI, CFI_GLOBAL]),
];

/// The variants of `bin` ([`VARIANTS`]), none for a bin not listed.
pub fn of(bin: &str) -> &'static [&'static str] {
    VARIANTS
        .iter()
        .find(|(b, _)| *b == bin)
        .map_or(&[], |(_, v)| v)
}

/// Whether objects of `variant` walk user stacks by CFI.
pub fn walks_cfi(variant: &str) -> bool {
    variant == CFI || variant == CFI_GLOBAL
}

/// Whether `bin` is built with `variant` (`""`, the plain object, always).
pub fn has(bin: &str, variant: &str) -> bool {
    variant.is_empty() || of(bin).contains(&variant)
}

//! The eBPF objects, built by `build.rs` and embedded in the binary so that
//! one file runs anywhere with no compiler or headers. Each file of
//! `ebpf-programs/src/bin/` is one object, plus its feature variants
//! (`<name>_perf`, `<name>_task_storage`): see the `ebpf-build` crate.

include!(concat!(env!("OUT_DIR"), "/objects.rs"));

/// The object named `name`.
pub fn get(name: &str) -> Option<&'static [u8]> {
    OBJECTS.iter().find(|(n, _)| *n == name).map(|(_, b)| *b)
}

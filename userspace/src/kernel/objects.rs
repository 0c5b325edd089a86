//! The eBPF objects, built by `build.rs` and embedded in the binary so that
//! one file runs anywhere with no compiler or headers. Each file of
//! `ebpf-programs/src/bin/` is one object, plus its feature variants
//! (`<name>_perf`, `<name>_task_storage`): see the `ebpf-build` crate.

include!(concat!(env!("OUT_DIR"), "/objects.rs"));

/// The object named `name`.
pub fn get(name: &str) -> Option<&'static [u8]> {
    OBJECTS.iter().find(|(n, _)| *n == name).map(|(_, b)| *b)
}

#[cfg(test)]
mod tests {
    use object::{Object as _, ObjectSection as _};

    /// The build strips DWARF (`ebpf_build::strip_debug`), which the kernel
    /// and aya never read and which was most of the binary; BTF stays.
    #[test]
    fn objects_carry_btf_and_no_dwarf() {
        assert!(!super::OBJECTS.is_empty());
        for (name, bytes) in super::OBJECTS {
            let file = object::File::parse(*bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
            let sections: Vec<&str> = file.sections().filter_map(|s| s.name().ok()).collect();
            let debug: Vec<&&str> = sections
                .iter()
                .filter(|n| n.starts_with(".debug") || n.starts_with(".rel.debug"))
                .collect();
            assert!(debug.is_empty(), "{name} keeps {debug:?}");
            assert!(
                sections.contains(&".BTF"),
                "{name}: no .BTF in {sections:?}"
            );
            assert!(sections.contains(&".BTF.ext"), "{name}: no .BTF.ext");
        }
    }
}

//! Builds the profile and argdist fixtures in `fixtures/` next to this
//! crate's other workload binaries (`target/<profile>/`), where the tests
//! and the VM matrix find them: each with frame pointers as `<name>`, and
//! without them as `<name>_nofp`, for the CFI unwinder. A `lib<name>.rs`
//! is a shared library (`lib<name>.so`, `lib<name>_nofp.so`). The files
//! built are listed in `fixtures.txt` there, which the VM matrix copies.
//!
//! They are built with rustc directly because a cargo profile cannot force
//! frame pointers for some binaries only.

use std::{env, path::PathBuf, process::Command};

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    // OUT_DIR is target/<profile>/build/<crate>-<hash>/out.
    let bin_dir = out.ancestors().nth(3).unwrap().to_path_buf();
    let rustc = env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    let fixtures = manifest.join("fixtures");
    println!("cargo:rerun-if-changed={}", fixtures.display());
    let mut built = Vec::new();
    for entry in std::fs::read_dir(&fixtures).unwrap() {
        let src = entry.unwrap().path();
        if src.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let name = src.file_stem().unwrap().to_string_lossy().into_owned();
        println!("cargo:rerun-if-changed={}", src.display());
        let library = name.starts_with("lib");
        for (suffix, frame_pointers) in [("", "yes"), ("_nofp", "no")] {
            let file = if library {
                format!("{name}{suffix}.so")
            } else {
                format!("{name}{suffix}")
            };
            let status = Command::new(&rustc)
                .args(["--edition", "2024", "-C", "opt-level=2", "-g", "-C"])
                .arg(format!("force-frame-pointers={frame_pointers}"))
                .arg("-o")
                .arg(bin_dir.join(&file))
                .arg(&src)
                .status()
                .unwrap_or_else(|e| panic!("cannot run {rustc}: {e}"));
            assert!(status.success(), "building fixture {file} failed");
            built.push(file);
        }
    }
    built.sort();
    std::fs::write(bin_dir.join("fixtures.txt"), built.join("\n") + "\n").unwrap();
}

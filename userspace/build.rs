//! Builds the eBPF programs and leaves one object per tool in `OUT_DIR`,
//! where `objects.rs` embeds them.
//!
//! The eBPF crate needs nightly (`-Z build-std=core` for
//! `bpfel-unknown-none`) and bpf-linker, while this crate builds on stable,
//! so this runs a separate cargo through rustup with a scrubbed environment:
//! the variables cargo sets for this build script would otherwise leak the
//! stable toolchain and host target into the nested build.
//! `cargo xtask setup` installs the toolchain pieces.

use std::{env, fs, path::PathBuf, process::Command};

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest.parent().unwrap().to_path_buf();
    let ebpf = root.join("ebpf-programs");
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    // One shared target directory keeps check, clippy and build from each
    // compiling the eBPF crate from scratch.
    let target_dir = root.join("target").join("ebpf");

    for dir in ["ebpf-programs/src", "common/src"] {
        println!("cargo:rerun-if-changed={}", root.join(dir).display());
    }
    println!(
        "cargo:rerun-if-changed={}",
        ebpf.join("Cargo.toml").display()
    );

    let mut cmd = Command::new("rustup");
    cmd.args([
        "run",
        "nightly",
        "cargo",
        "build",
        "--release",
        "--target-dir",
    ])
    .arg(&target_dir)
    .current_dir(&ebpf);
    for (key, _) in env::vars_os() {
        let k = key.to_string_lossy();
        if k.starts_with("CARGO")
            || k.starts_with("RUSTC")
            || k.starts_with("RUSTUP_TOOLCHAIN")
            || k == "RUSTFLAGS"
            || k == "RUSTDOCFLAGS"
            || k == "DEBUG"
            || k == "OPT_LEVEL"
            || k == "PROFILE"
            || k == "TARGET"
            || k == "HOST"
        {
            cmd.env_remove(&key);
        }
    }
    let status = cmd.status().unwrap_or_else(|e| {
        panic!("cannot run rustup to build the eBPF programs ({e}); run `cargo xtask setup`")
    });
    assert!(
        status.success(),
        "building the eBPF programs failed; `cargo xtask setup` installs nightly rust-src and bpf-linker"
    );

    let built = target_dir.join("bpfel-unknown-none").join("release");
    for entry in fs::read_dir(ebpf.join("src").join("bin")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        fs::copy(built.join(&name), out.join(&name))
            .unwrap_or_else(|e| panic!("eBPF object {name} missing after the build: {e}"));
    }
}

//! Builds the eBPF objects and leaves them, with a table naming them
//! (`objects.rs`), in `OUT_DIR` for `objects.rs` to embed. The how lives in
//! the `ebpf-build` crate, which xtask shares.

use std::{env, path::PathBuf};

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let root = manifest.parent().expect("userspace/ is in the workspace");
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets it"));
    for dir in [
        "ebpf-programs/src",
        "common/src",
        "ebpf-programs/Cargo.toml",
    ] {
        println!("cargo:rerun-if-changed={}", root.join(dir).display());
    }
    // One shared target directory keeps check, clippy and build from each
    // compiling the eBPF crate from scratch.
    let target = root.join("target").join("ebpf");
    if let Err(e) = ebpf_build::build(root, &target, &out) {
        panic!("{e}; `cargo xtask setup` installs the pinned nightly, rust-src and bpf-linker");
    }
}

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
    println!("cargo:rerun-if-env-changed={}", ebpf_build::KEEP_LINES);
    build_info(root);
    packed_relocations();
    proto_types(&manifest, &out);
    // One shared target directory keeps check, clippy and build from each
    // compiling the eBPF crate from scratch.
    let target = root.join("target").join("ebpf");
    if let Err(e) = ebpf_build::build(root, &target, &out) {
        panic!("{e}; `cargo xtask setup` installs the pinned nightly, rust-src and bpf-linker");
    }
}

/// Links the binary with its relative relocations packed (`DT_RELR`): a
/// position-independent binary keeps one relocation a pointer in its data,
/// 24 bytes each in `.rela.dyn` (0.7 MB of rtrace), where the packed table
/// takes a bit or so each. The loader must know the table: musl's static
/// start-up does (1.2.4+, the static `dist` build), glibc from 2.36; a binary
/// for glibc is built so only where the building machine's own glibc is
/// that new, since that is where it runs (`dist` ships the static one).
/// A linker that does not know the option warns and ignores it.
fn packed_relocations() {
    let linux = env::var("CARGO_CFG_TARGET_OS").is_ok_and(|os| os == "linux");
    let libc = env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    // Cargo leaves `crt-static` out of `CARGO_CFG_TARGET_FEATURE` (1.95
    // does; the static musl build lost its packed table so, 0.8 MB), so
    // the target's default is taken, static for musl, unless the flags
    // turn it off.
    let flags = env::var("CARGO_ENCODED_RUSTFLAGS").unwrap_or_default();
    let static_link = env::var("CARGO_CFG_TARGET_FEATURE")
        .is_ok_and(|f| f.split(',').any(|f| f == "crt-static"))
        || (libc == "musl" && !flags.contains("-crt-static"));
    // The building machine's glibc says nothing of a target built for
    // another machine.
    let built_for_here = env::var("HOST").ok() == env::var("TARGET").ok();
    let loader_knows = match libc.as_str() {
        // musl's static start-up (Rust's own musl, 1.2.5); a dynamic
        // musl's loader may be older than 1.2.4.
        "musl" => static_link,
        "gnu" => built_for_here && glibc_at_least(2, 36),
        _ => false,
    };
    if linux && loader_knows {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
}

/// Whether this machine's glibc (`getconf GNU_LIBC_VERSION`: `glibc 2.36`)
/// is at least `major.minor`.
fn glibc_at_least(major: u32, minor: u32) -> bool {
    let Ok(out) = std::process::Command::new("getconf")
        .arg("GNU_LIBC_VERSION")
        .output()
    else {
        return false;
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let mut version = text
        .trim()
        .strip_prefix("glibc ")
        .unwrap_or_default()
        .split('.')
        .map(|n| n.parse::<u32>().unwrap_or(0));
    let have = (version.next().unwrap_or(0), version.next().unwrap_or(0));
    have >= (major, minor)
}

/// The git commit and the aya version, for `--version` and the exporter's
/// `rtrace_build_info`.
fn build_info(root: &std::path::Path) {
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(root)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map_or_else(|| "unknown".to_owned(), |s| s.trim().to_owned());
    let version_of = |lock: &str, name: &str| {
        let lock = std::fs::read_to_string(root.join(lock)).unwrap_or_default();
        let head = format!("name = \"{name}\"\nversion = \"");
        lock.find(&head)
            .and_then(|i| lock[i + head.len()..].split('"').next())
            .unwrap_or("unknown")
            .to_owned()
    };
    println!("cargo:rustc-env=RTRACE_COMMIT={commit}");
    println!(
        "cargo:rustc-env=RTRACE_AYA={}",
        version_of("Cargo.lock", "aya")
    );
    println!(
        "cargo:rustc-env=RTRACE_AYA_EBPF={}",
        version_of("ebpf-programs/Cargo.lock", "aya-ebpf")
    );
    for git in [".git/HEAD", ".git/refs/heads"] {
        println!("cargo:rerun-if-changed={}", root.join(git).display());
    }
    println!(
        "cargo:rerun-if-changed={}",
        root.join("Cargo.lock").display()
    );
}

/// The protocol messages rtrace writes, generated with prost from the
/// `.proto` files in `proto/`: pprof's (`OUT_DIR/perftools.profiles.rs`)
/// and OTLP 1.10's profiles (`OUT_DIR/otlp.rs`, the packages' modules
/// nested as their names are). OTLP's files are the protocol's own, as
/// released in opentelemetry-proto 1.10.0: generated here rather than
/// taken from the OpenTelemetry crates, which bring the SDK's crates along
/// and cost the build minutes for four files' messages.
fn proto_types(manifest: &std::path::Path, out: &std::path::Path) {
    let dir = manifest.join("proto");
    generate(&dir, out, "profile.proto", None);
    generate(
        &dir,
        out,
        "opentelemetry/proto/collector/profiles/v1development/profiles_service.proto",
        Some("otlp.rs"),
    );
}

/// Generates the messages of `proto` (under `dir`) and of the files it
/// imports into `out`, with the module tree in `include` if given.
fn generate(dir: &std::path::Path, out: &std::path::Path, proto: &str, include: Option<&str>) {
    let proto = dir.join(proto);
    println!("cargo:rerun-if-changed={}", dir.display());
    let files = protox::compile([&proto], [dir]).unwrap_or_else(|e| panic!("{e}"));
    let mut config = prost_build::Config::new();
    config
        .out_dir(out)
        // OTLP's comments are the specification's prose, which rustdoc's
        // lints read as badly indented Markdown; the files say it all.
        .disable_comments([".opentelemetry"]);
    if let Some(include) = include {
        config.include_file(include);
    }
    config
        .compile_fds(files)
        .unwrap_or_else(|e| panic!("cannot generate the messages of {}: {e}", proto.display()));
}

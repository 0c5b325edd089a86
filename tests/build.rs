//! Builds the profile and argdist fixtures in `fixtures/` next to this
//! crate's other workload binaries (`target/<profile>/`), where the tests
//! and the VM matrix find them: each with frame pointers as `<name>`, and
//! without them as `<name>_nofp`, for the CFI unwinder. A `lib<name>.rs`
//! is a shared library (`lib<name>.so`, `lib<name>_nofp.so`). The files
//! built are listed in `fixtures.txt` there, which the VM matrix copies.
//!
//! They are built with rustc directly because a cargo profile cannot force
//! frame pointers for some binaries only. `hotfuncs.rs` is also built as
//! `hotfuncs_abort`, without frame pointers or debug information and with
//! `panic=abort`, whose C `main` has no CFI.
//!
//! A `<name>.ml` is built with ocamlopt as `<name>`, and a `<name>.cs`
//! with Mono's mcs as `<name>.exe`, which `mono` runs; `Hot.cs` also as
//! `Cold.exe`, its twin with other names.
//!
//! A `<name>.c` is built with the C compiler three ways: `<name>` with
//! frame pointers but frameless leaves (GCC's `-momit-leaf-frame-pointer`,
//! which walks by frame pointer get wrong), `<name>_nofp` without frame
//! pointers, and `<name>_debugframe` without them and with its own CFI only
//! in `.debug_frame` (no unwind tables; the C runtime's start code keeps
//! its `.eh_frame`). A `lib<name>.c` is a shared library, built once, as
//! `lib<name>_nofp.so`.

use std::{env, path::PathBuf, process::Command};

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    proto_types(&manifest, &out);
    // OUT_DIR is target/<profile>/build/<crate>-<hash>/out.
    let bin_dir = out.ancestors().nth(3).unwrap().to_path_buf();
    let rustc = env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    let fixtures = manifest.join("fixtures");
    println!("cargo:rerun-if-changed={}", fixtures.display());
    let mut built = Vec::new();
    for entry in std::fs::read_dir(&fixtures).unwrap() {
        let src = entry.unwrap().path();
        let name = src.file_stem().unwrap().to_string_lossy().into_owned();
        if src.extension().is_some_and(|e| e == "c") {
            println!("cargo:rerun-if-changed={}", src.display());
            if name.starts_with("lib") {
                build_c_library(&src, &name, &bin_dir, &mut built);
            } else {
                build_c(&src, &name, &bin_dir, &mut built);
            }
            continue;
        }
        if src.extension().is_some_and(|e| e == "ml") {
            println!("cargo:rerun-if-changed={}", src.display());
            build_ocaml(&src, &name, &out, &bin_dir);
            continue;
        }
        if src.extension().is_some_and(|e| e == "cs") {
            println!("cargo:rerun-if-changed={}", src.display());
            build_mono(&src, &name, &bin_dir);
            if name == "Hot" {
                build_cold_twin(&src, &out, &bin_dir);
            }
            continue;
        }
        if src.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        println!("cargo:rerun-if-changed={}", src.display());
        let library = name.starts_with("lib");
        // `hotfuncs` also as Rust programs that abort on panic ship:
        // without `-g`, rustc writes their C `main` without CFI.
        let abort = (name == "hotfuncs").then_some(("_abort", &["-C", "panic=abort"][..], "no"));
        let ways = [("", &["-g"][..], "yes"), ("_nofp", &["-g"][..], "no")];
        for (suffix, flags, frame_pointers) in ways.into_iter().chain(abort) {
            let file = if library {
                format!("{name}{suffix}.so")
            } else {
                format!("{name}{suffix}")
            };
            let status = Command::new(&rustc)
                .args(["--edition", "2024", "-C", "opt-level=2"])
                .args(flags)
                .arg("-C")
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

/// Builds a C fixture its three ways.
fn build_c(src: &std::path::Path, name: &str, bin_dir: &std::path::Path, built: &mut Vec<String>) {
    let cc = env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    for (suffix, flags) in [
        (
            "",
            &["-fno-omit-frame-pointer", "-momit-leaf-frame-pointer"][..],
        ),
        ("_nofp", &["-fomit-frame-pointer"][..]),
        (
            "_debugframe",
            &[
                "-fomit-frame-pointer",
                "-fno-asynchronous-unwind-tables",
                "-fno-unwind-tables",
            ][..],
        ),
    ] {
        let file = format!("{name}{suffix}");
        let status = Command::new(&cc)
            .args(["-O2", "-g"])
            .args(flags)
            .arg("-o")
            .arg(bin_dir.join(&file))
            .arg(src)
            .args(["-pthread", "-lm"])
            .status()
            .unwrap_or_else(|e| panic!("cannot run {cc}: {e}"));
        assert!(status.success(), "building fixture {file} failed");
        built.push(file);
    }
}

/// Builds a C library fixture (`lib<name>.c`) as `lib<name>_nofp.so`:
/// without frame pointers, and bound lazily (`-z lazy`), so that its PLT's
/// first calls go through ld.so's resolver.
fn build_c_library(
    src: &std::path::Path,
    name: &str,
    bin_dir: &std::path::Path,
    built: &mut Vec<String>,
) {
    let cc = env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    let file = format!("{name}_nofp.so");
    let status = Command::new(&cc)
        .args(["-O2", "-g", "-fomit-frame-pointer", "-fPIC", "-shared"])
        .arg("-Wl,-z,lazy")
        .arg("-o")
        .arg(bin_dir.join(&file))
        .arg(src)
        .status()
        .unwrap_or_else(|e| panic!("cannot run {cc}: {e}"));
    assert!(status.success(), "building fixture {file} failed");
    built.push(file);
}

/// Builds an OCaml fixture with ocamlopt (Debian's ocaml-nox), as it is:
/// OCaml's native code keeps no frame pointers. Not listed in
/// `fixtures.txt`: the test that uses it compares with perf, which the VM
/// guests lack.
fn build_ocaml(
    src: &std::path::Path,
    name: &str,
    out: &std::path::Path,
    bin_dir: &std::path::Path,
) {
    // ocamlopt writes its .cmx and .o beside the source it compiles.
    let work = out.join(format!("{name}.ml"));
    std::fs::copy(src, &work).unwrap();
    let status = Command::new("ocamlopt")
        .arg("-g")
        .arg("-o")
        .arg(bin_dir.join(name))
        .arg(&work)
        .current_dir(out)
        .status()
        .unwrap_or_else(|e| {
            panic!("cannot run ocamlopt (Debian package ocaml-nox; `cargo xtask setup` installs it): {e}")
        });
    assert!(status.success(), "building fixture {name} failed");
}

/// Builds a C# fixture with mcs (Debian's mono-mcs) as `<name>.exe`, a CIL
/// assembly that Mono's JIT compiles as it runs. Not listed in
/// `fixtures.txt`: the VM guests have no Mono.
fn build_mono(src: &std::path::Path, name: &str, bin_dir: &std::path::Path) {
    let file = format!("{name}.exe");
    let status = Command::new("mcs")
        .arg("-optimize+")
        .arg(format!("-out:{}", bin_dir.join(&file).display()))
        .arg(src)
        .status()
        .unwrap_or_else(|e| {
            panic!("cannot run mcs (Debian package mono-mcs; `cargo xtask setup` installs it): {e}")
        });
    assert!(status.success(), "building fixture {file} failed");
}

/// Builds `Cold.exe`, Hot.cs with other names (class `ColdProgram`,
/// methods `Fast` and `Slow` for `Hot` and `Warm`) and the same code: the
/// pid-reuse tests run it on the pid Hot.exe had, where the JIT puts the
/// same code at the same addresses, so that only each process's own map
/// names its frames right. Made here rather than kept as a second source,
/// so that the two cannot drift apart.
fn build_cold_twin(hot: &std::path::Path, out: &std::path::Path, bin_dir: &std::path::Path) {
    let source = std::fs::read_to_string(hot).unwrap();
    let cold = source
        .replace("HotProgram", "ColdProgram")
        .replace(" Hot(", " Fast(")
        .replace(" Warm(", " Slow(");
    for gone in [" Hot(", " Warm(", "HotProgram"] {
        assert!(!cold.contains(gone), "Cold.cs still has {gone:?}");
    }
    let src = out.join("Cold.cs");
    std::fs::write(&src, cold).unwrap();
    build_mono(&src, "Cold", bin_dir);
}

/// pprof's and OTLP's message types, generated from rtrace's `.proto`
/// files as rtrace's are (`userspace/build.rs`: `perftools.profiles.rs`
/// and `otlp.rs`), for the tests to decode its pprof files and what the
/// Collector writes.
fn proto_types(manifest: &std::path::Path, out: &std::path::Path) {
    let dir = manifest.join("../userspace/proto");
    println!("cargo:rerun-if-changed={}", dir.display());
    for (proto, include) in [
        ("profile.proto", None),
        (
            "opentelemetry/proto/profiles/v1development/profiles.proto",
            Some("otlp.rs"),
        ),
    ] {
        let files = protox::compile([dir.join(proto)], [&dir]).unwrap_or_else(|e| panic!("{e}"));
        let mut config = prost_build::Config::new();
        config.out_dir(out).disable_comments([".opentelemetry"]);
        if let Some(include) = include {
            config.include_file(include);
        }
        config
            .compile_fds(files)
            .unwrap_or_else(|e| panic!("cannot generate the messages of {proto}: {e}"));
    }
}

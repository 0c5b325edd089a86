//! `cargo xtask dist`: what ships. A static, stripped `rtrace` (musl), which
//! runs on hosts with no Rust and whatever libc, and a Debian package of it
//! with the exporter's systemd unit.

use std::{fs, path::PathBuf, process::Command};

use anyhow::Context as _;

use crate::{cargo, root, run, setup::STATIC_TARGET};

/// The static binary, as built by [`static_binary`].
pub fn static_path() -> PathBuf {
    root().join("target/dist/rtrace")
}

/// Builds the static, stripped binary into `target/dist/rtrace`.
pub fn static_binary() -> anyhow::Result<PathBuf> {
    // Rust's musl target links musl statically, with its own start files;
    // the one C in the tree, ring's (TLS for the exporter's OTLP), is
    // compiled against musl's headers by Debian's musl-gcc wrapper.
    //
    // Its own code carries no unwind tables: it aborts on a panic, and
    // prints one line for it, so nothing in it unwinds, and the tables
    // were 0.47 MB of it (those of the prebuilt standard library stay).
    // Only the static build: the host's builds it shares its flags with
    // include the tests' workloads, whose tables the tests walk.
    run(cargo()
        .env("CC_x86_64_unknown_linux_musl", "musl-gcc")
        .env(
            "CARGO_TARGET_X86_64_UNKNOWN_LINUX_MUSL_RUSTFLAGS",
            "-C force-unwind-tables=no",
        )
        .args([
            "build",
            "--release",
            "-p",
            "rtrace",
            "--target",
            STATIC_TARGET,
        ]))?;
    let built = root()
        .join("target")
        .join(STATIC_TARGET)
        .join("release/rtrace");
    let dest = static_path();
    fs::create_dir_all(dest.parent().unwrap())?;
    // Stripped by binutils rather than by the profile: a profile setting
    // would differ from the host build's and rebuild the shared build
    // script each time one follows the other.
    run(Command::new("strip")
        .arg("--strip-all")
        .arg("-o")
        .arg(&dest)
        .arg(&built))
    .context("cannot strip the static binary (binutils)")?;
    Ok(dest)
}

/// The version in the workspace's manifest.
fn version() -> anyhow::Result<String> {
    let manifest = fs::read_to_string(root().join("userspace/Cargo.toml"))?;
    manifest
        .lines()
        .find_map(|l| l.strip_prefix("version = \""))
        .and_then(|v| v.strip_suffix('"'))
        .map(str::to_owned)
        .context("no version in userspace/Cargo.toml")
}

/// Builds the static binary and the Debian package; prints their paths.
pub fn run_dist() -> anyhow::Result<()> {
    let bin = static_binary()?;
    let version = version()?;
    let dir = root().join("target/dist");
    let tree = dir.join("deb");
    if tree.exists() {
        fs::remove_dir_all(&tree)?;
    }
    let put = |from: &std::path::Path, to: &str, mode: &str| -> anyhow::Result<()> {
        let dest = tree.join(to);
        fs::create_dir_all(dest.parent().unwrap())?;
        fs::copy(from, &dest)
            .with_context(|| format!("cannot copy {} into the package", from.display()))?;
        run(Command::new("chmod").arg(mode).arg(&dest))
    };
    let packaging = root().join("packaging");
    put(&bin, "usr/bin/rtrace", "755")?;
    put(
        &packaging.join("rtrace-exporter.service"),
        "lib/systemd/system/rtrace-exporter.service",
        "644",
    )?;
    put(
        &packaging.join("rtrace-exporter.default"),
        "etc/default/rtrace-exporter",
        "644",
    )?;
    let size_kib = fs::metadata(&bin)?.len().div_ceil(1024);
    let control = format!(
        "Package: rtrace\n\
         Version: {version}\n\
         Architecture: amd64\n\
         Maintainer: rtrace developers <rtrace@users.noreply.github.com>\n\
         Installed-Size: {size_kib}\n\
         Section: utils\n\
         Priority: optional\n\
         Homepage: https://github.com/rtrace/rtrace\n\
         Description: eBPF tracing tools in one static binary, and a Prometheus exporter\n \
         bcc's tools (runqlat, biolatency, execsnoop, tcplife, profile, ...) with no\n \
         compiler, kernel headers or Python needed at run time, and\n \
         rtrace-exporter.service serving their metrics with CAP_BPF and CAP_PERFMON only.\n"
    );
    fs::create_dir_all(tree.join("DEBIAN"))?;
    fs::write(tree.join("DEBIAN/control"), control)?;
    fs::write(
        tree.join("DEBIAN/conffiles"),
        "/etc/default/rtrace-exporter\n",
    )?;
    let deb = dir.join(format!("rtrace_{version}_amd64.deb"));
    run(Command::new("dpkg-deb")
        .args(["--root-owner-group", "--build"])
        .arg(&tree)
        .arg(&deb))?;
    println!("{}", bin.display());
    println!("{}", deb.display());
    Ok(())
}

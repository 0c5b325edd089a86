//! Installs the toolchain pieces and packages rtrace's build and tests need,
//! skipping whatever is already there, then checks that every program in
//! [`crate::programs::PROGRAMS`] is present before any long step runs.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

use crate::{programs::Source, run};

/// bpf-linker 0.11+ needs an external LLVM 23; 0.10 uses rustc's own LLVM.
const BPF_LINKER_VERSION: &str = "0.10.4";

/// The target of the static build (`cargo xtask dist`), which the tests
/// also run in the guests.
pub const STATIC_TARGET: &str = "x86_64-unknown-linux-musl";

fn output(cmd: &mut Command) -> String {
    cmd.output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

/// Makes sure everything is installed.
pub fn ensure() -> anyhow::Result<()> {
    let channel = ebpf_build::channel(&crate::root()).map_err(anyhow::Error::msg)?;
    let toolchain = match ebpf_build::toolchain(&channel) {
        Ok(t) => t,
        Err(_) => {
            eprintln!("xtask: installing the pinned toolchain {channel}");
            run(Command::new("rustup").args([
                "toolchain",
                "install",
                &channel,
                "--profile",
                "minimal",
            ]))
            .with_context(|| {
                format!(
                    "cannot install {channel} (pinned in ebpf-programs/rust-toolchain.toml); \
                     a floating `nightly` of that date serves too"
                )
            })?;
            ebpf_build::toolchain(&channel).map_err(anyhow::Error::msg)?
        }
    };
    let installed = output(Command::new("rustup").args([
        "component",
        "list",
        "--installed",
        "--toolchain",
        &toolchain,
    ]));
    for component in ["rust-src", "rustfmt", "clippy"] {
        if !installed.lines().any(|l| l.starts_with(component)) {
            eprintln!("xtask: adding {component} to {toolchain}");
            run(Command::new("rustup").args([
                "component",
                "add",
                component,
                "--toolchain",
                &toolchain,
            ]))?;
        }
    }
    let linker = output(Command::new("bpf-linker").arg("--version"));
    if !linker.contains(BPF_LINKER_VERSION) {
        eprintln!("xtask: installing bpf-linker {BPF_LINKER_VERSION}");
        run(Command::new("cargo").args([
            "install",
            "bpf-linker",
            "--version",
            BPF_LINKER_VERSION,
            "--locked",
            "--force",
        ]))
        .context("cannot install bpf-linker")?;
    }
    let targets = output(Command::new("rustup").args(["target", "list", "--installed"]));
    if !targets.lines().any(|l| l.trim() == STATIC_TARGET) {
        eprintln!("xtask: adding the {STATIC_TARGET} target for the static build");
        run(Command::new("rustup").args(["target", "add", STATIC_TARGET]))?;
    }
    let missing: Vec<&str> = crate::programs::packages()
        .into_iter()
        .filter(|p| {
            !output(Command::new("dpkg-query").args(["-W", "-f=${Status}", p]))
                .contains("ok installed")
        })
        .collect();
    if !missing.is_empty() {
        eprintln!("xtask: installing {}", missing.join(" "));
        run(Command::new("apt-get").arg("update").arg("-qq"))?;
        run(Command::new("apt-get")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"))
        .context("cannot install Debian packages")?;
    }
    // Fail now, not after the long steps that would first run them.
    let absent: Vec<String> = crate::programs::missing()
        .into_iter()
        .map(|p| match p.source {
            Source::Debian(package) => {
                format!("{} (Debian package {package}; {})", p.name, p.why)
            }
            Source::Rust => format!("{} (the Rust toolchain; {})", p.name, p.why),
            Source::Root(release) => format!("{} (in the {release} root; {})", p.name, p.why),
        })
        .collect();
    if !absent.is_empty() {
        bail!(
            "still missing after setup: {}; xtask/src/programs.rs lists what each is for",
            absent.join(", ")
        );
    }
    Ok(())
}

/// The py-spy release the Python tests and benchmark compare with.
const PY_SPY_VERSION: &str = "0.4.3";

/// Where the Python peers and the Collector are kept between runs:
/// outside the tree, so that a clean clone on the same machine reuses them.
pub fn cache_dir() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .map(|d| PathBuf::from(d).join("rtrace"))
        .or_else(|| std::env::var_os("HOME").map(|d| PathBuf::from(d).join(".cache/rtrace")))
        .unwrap_or_else(|| PathBuf::from("/var/cache/rtrace"))
}

/// A Debian root with another runtime (CPython, OpenJDK), which the
/// tests and benchmarks run through `chroot`: another version, in another
/// mount namespace with its own libc.
pub struct DebianRoot {
    /// Its directory in the cache, with a version key: raised when what
    /// [`peers`] puts in it changes, so that a machine's cached root is
    /// made again rather than used as it was.
    dir: &'static str,
    /// The Debian release.
    release: &'static str,
    /// The packages debootstrap adds, comma-separated.
    packages: &'static str,
    /// The program the root is for, inside it: its presence says the
    /// root is whole.
    pub program: &'static str,
}

impl DebianRoot {
    /// Where it is.
    pub fn path(&self) -> PathBuf {
        cache_dir().join(self.dir)
    }
}

/// Debian trixie's root with its python3 (3.13).
pub const TRIXIE: DebianRoot = DebianRoot {
    dir: "trixie-root-1",
    release: "trixie",
    packages: "python3",
    program: "/usr/bin/python3",
};

/// Debian sid's root with python3.14.
pub const SID: DebianRoot = DebianRoot {
    dir: "sid-root-1",
    release: "sid",
    packages: "python3.14",
    program: "/usr/bin/python3.14",
};

/// Debian sid's root with OpenJDK 21 and 25 (bookworm, the host, has 17):
/// the Java tests run the three at once. JDKs, not JREs, for `jcmd`.
pub const JDKS: DebianRoot = DebianRoot {
    dir: "sid-jdk-root-2",
    release: "sid",
    packages: "openjdk-21-jdk-headless,openjdk-25-jdk-headless,libc6-dbg",
    program: "/usr/lib/jvm/java-25-openjdk-amd64/bin/java",
};

/// Debian bookworm's root with its nodejs (18): V8 10, in a stripped
/// `libnode.so.108` (the host's node is another build, of 20).
pub const NODE18: DebianRoot = DebianRoot {
    dir: "bookworm-node-root-1",
    release: "bookworm",
    packages: "nodejs",
    program: "/usr/bin/node",
};

/// Debian trixie's root with its nodejs (20): V8 in a stripped
/// `libnode.so.115`, whose builtins have no symbols.
pub const NODE20: DebianRoot = DebianRoot {
    dir: "trixie-node-root-1",
    release: "trixie",
    packages: "nodejs",
    program: "/usr/bin/node",
};

/// Debian sid's root with its nodejs (24): V8 13, which reaches code
/// through its dispatch table and hides most of its symbols.
pub const NODE24: DebianRoot = DebianRoot {
    dir: "sid-node-root-1",
    release: "sid",
    packages: "nodejs",
    program: "/usr/bin/node",
};

/// py-spy, from PyPI: the Python tests' and benchmark's peer.
pub fn py_spy() -> PathBuf {
    cache_dir().join("py-spy/bin/py-spy")
}

/// Removes, from `base`, the versions of root `dir` (`NAME-N`) before
/// its own (`NAME-1` for `NAME-2`): a root is made anew under the next
/// version when its packages change, and each takes a gigabyte or more.
/// One with anything mounted in it, as `mountinfo` (the text of
/// `/proc/self/mountinfo`) says, is kept: removing it would reach through
/// the mount. Returns those removed.
fn remove_older(base: &Path, dir: &str, mountinfo: &str) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    let Some((name, version)) = dir.rsplit_once('-') else {
        return removed;
    };
    let Ok(version) = version.parse::<u32>() else {
        return removed;
    };
    // mountinfo holds the real path, not one through a symbolic link.
    let Ok(base) = base.canonicalize() else {
        return removed;
    };
    for old in 1..version {
        let path = base.join(format!("{name}-{old}"));
        let Some(text) = path.to_str() else {
            continue;
        };
        if !path.is_dir() {
            continue;
        }
        let inside = format!("{text}/");
        // The fifth field of a mountinfo line is its mount point, with
        // spaces and the like escaped in octal (`\040`).
        let mounted = mountinfo.lines().any(|l| {
            l.split(' ')
                .nth(4)
                .map(unescape_octal)
                .is_some_and(|m| m == text || m.starts_with(&inside))
        });
        if mounted {
            eprintln!("xtask: keeping {text}, an earlier root: something is mounted in it");
            continue;
        }
        eprintln!("xtask: removing {text}, an earlier version of {dir}");
        if std::fs::remove_dir_all(&path).is_ok() {
            removed.push(path);
        }
    }
    removed
}

/// A mountinfo field with its octal escapes (`\040` for a space) undone.
fn unescape_octal(field: &str) -> String {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = |c: &u8| (b'0'..=b'7').contains(c);
        if b[i] == b'\\' && b.len() >= i + 4 && b[i + 1..i + 4].iter().all(octal) {
            out.push(((b[i + 1] - b'0') << 6) | ((b[i + 2] - b'0') << 3) | (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Makes `r` with debootstrap, unless it already has its program; first
/// removes its earlier versions ([`remove_older`]).
fn debian_root(r: &DebianRoot) -> anyhow::Result<()> {
    if let Ok(mountinfo) = std::fs::read_to_string("/proc/self/mountinfo") {
        remove_older(&cache_dir(), r.dir, &mountinfo);
    }
    let root = r.path();
    if root.join(&r.program[1..]).exists() {
        return Ok(());
    }
    let (release, packages) = (r.release, r.packages);
    eprintln!(
        "xtask: making a Debian {release} root with {packages} in {} with debootstrap; \
         a few minutes, once",
        root.display()
    );
    let partial = root.with_extension("partial");
    let _ = std::fs::remove_dir_all(&partial);
    std::fs::create_dir_all(cache_dir())?;
    run(Command::new("debootstrap").args([
        "--variant=minbase",
        &format!("--include={packages}"),
        release,
        partial.to_str().context("cache path is not UTF-8")?,
        "http://deb.debian.org/debian",
    ]))
    .with_context(|| format!("cannot make the {release} root"))?;
    std::fs::rename(&partial, root)?;
    Ok(())
}

/// Makes the Debian roots (trixie's and sid's Pythons, sid's JDKs,
/// bookworm's, trixie's and sid's nodes) and
/// installs py-spy where they are missing: for the tests and benchmarks
/// only, not for every command (each root takes a minute or more to
/// make, once).
pub fn peers() -> anyhow::Result<()> {
    debian_root(&TRIXIE)?;
    debian_root(&SID)?;
    debian_root(&JDKS)?;
    debian_root(&NODE18)?;
    debian_root(&NODE20)?;
    debian_root(&NODE24)?;
    let spy = py_spy();
    if !output(Command::new(&spy).arg("--version")).contains(PY_SPY_VERSION) {
        eprintln!("xtask: installing py-spy {PY_SPY_VERSION} from PyPI");
        let target = spy
            .parent()
            .and_then(|p| p.parent())
            .context("py-spy's path has no parent")?;
        let _ = std::fs::remove_dir_all(target);
        // Debian's interpreter, with Debian's pip: not whatever python3
        // comes first in PATH.
        run(Command::new("/usr/bin/python3")
            .args(["-m", "pip", "install", "--quiet", "--target"])
            .arg(target)
            .arg(format!("py-spy=={PY_SPY_VERSION}")))
        .context("cannot install py-spy")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn earlier_roots_are_removed_unless_something_is_mounted_in_them() {
        // Reached through a symbolic link, with a space in its real
        // path: mountinfo names the real one, escaped.
        let real = std::env::temp_dir().join(format!("xtask roots {}", std::process::id()));
        std::fs::create_dir_all(&real).unwrap();
        let real = real.canonicalize().unwrap();
        let base = std::env::temp_dir().join(format!("xtask-roots-{}", std::process::id()));
        let _ = std::fs::remove_file(&base);
        std::os::unix::fs::symlink(&real, &base).unwrap();
        for d in [
            "jdk-1/usr",
            "jdk-2/usr",
            "jdk-3/proc",
            "jdk-4/usr",
            "jdkx-1/usr",
        ] {
            std::fs::create_dir_all(base.join(d)).unwrap();
        }
        let mounted = real.join("jdk-3/proc");
        let mountinfo = format!(
            "22 1 0:21 / /proc rw,nosuid shared:5 - proc proc rw\n\
             90 22 0:21 / {} rw - proc proc rw\n",
            mounted.display().to_string().replace(' ', "\\040")
        );
        let removed = remove_older(&base, "jdk-4", &mountinfo);
        let exists = |d: &str| base.join(d).exists();
        let result = (
            removed,
            exists("jdk-1"),
            exists("jdk-2"),
            exists("jdk-3"),
            exists("jdk-4"),
            exists("jdkx-1"),
        );
        let _ = std::fs::remove_file(&base);
        let _ = std::fs::remove_dir_all(&real);
        assert_eq!(
            result,
            (
                vec![real.join("jdk-1"), real.join("jdk-2")],
                false,
                false,
                true,
                true,
                true
            )
        );
        // A name without a version removes nothing.
        assert!(remove_older(&base, "jdk", "").is_empty());
        assert_eq!(unescape_octal(r"/a\040b\134c\04"), r"/a b\c\04");
    }
}

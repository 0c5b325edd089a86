//! The one list of the external programs that xtask, the tests and the
//! benchmarks run, each with where it comes from. Setup installs the
//! Debian packages named here and then checks that every program is
//! present, before any long step; a unit test reads the sources and fails
//! when a program they run is missing from the list.

use std::path::{Path, PathBuf};

/// Where a program comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// A Debian package, installed by setup when it is missing.
    Debian(&'static str),
    /// Not a Debian package: the machine's Rust toolchain (rustup, cargo,
    /// rustc), or a crate setup installs with `cargo install`.
    Rust,
    /// A program inside a Debian root that setup makes with debootstrap
    /// (the release named), run there through `chroot`: not looked for on
    /// the host.
    Root(&'static str),
}

/// An external program and why it is needed.
#[derive(Debug)]
pub struct Program {
    /// The name it is run by (a bare name looked up in PATH and the sbin
    /// directories).
    pub name: &'static str,
    /// Where it comes from.
    pub source: Source,
    /// Who runs it, for the reader of this list.
    pub why: &'static str,
}

const fn deb(name: &'static str, package: &'static str, why: &'static str) -> Program {
    Program {
        name,
        source: Source::Debian(package),
        why,
    }
}

const fn rust(name: &'static str, why: &'static str) -> Program {
    Program {
        name,
        source: Source::Rust,
        why,
    }
}

/// Every program run by xtask, the tests (the tests crate, unit tests and
/// build scripts) and the benchmarks. Nothing here is optional: every one
/// is installed and checked before the first long step. The source scan
/// finds programs started directly; one named inside a shell line (`find`
/// in the initramfs packing) must be added here by hand.
pub const PROGRAMS: &[Program] = &[
    // Installing and packaging.
    deb(
        "apt-get",
        "apt",
        "setup installs packages; vm-test downloads kernels",
    ),
    deb(
        "apt-cache",
        "apt",
        "vm-test picks the newest kernel packages",
    ),
    deb("dpkg", "dpkg", "vm-test unpacks kernel packages"),
    deb(
        "dpkg-query",
        "dpkg",
        "setup sees which packages are installed",
    ),
    deb("dpkg-deb", "dpkg", "dist builds the Debian package"),
    rust(
        "rustup",
        "setup adds the pinned nightly, its components and the musl target",
    ),
    rust("cargo", "every build; setup installs bpf-linker with it"),
    rust(
        "rustc",
        "the tests crate's build script compiles the Rust fixtures",
    ),
    rust(
        "rustfmt",
        "checks the tools' files, which cargo fmt cannot see",
    ),
    rust(
        "bpf-linker",
        "links the eBPF objects; setup installs 0.10.4 with cargo",
    ),
    deb("git", "git", "userspace's build script names the commit"),
    deb(
        "getconf",
        "libc-bin",
        "userspace's build script packs the relocations where glibc is 2.36 or newer",
    ),
    deb(
        "cc",
        "gcc",
        "the tests crate's build script compiles the C fixtures",
    ),
    deb(
        "gcc",
        "gcc",
        "profile's CFI budget test finds cc1 with it; the C build profile's benchmark samples (run by make)",
    ),
    deb(
        "make",
        "make",
        "runs the C build profile's benchmark samples",
    ),
    deb(
        "ocamlopt",
        "ocaml-nox",
        "the tests crate's build script compiles the OCaml fixture",
    ),
    deb(
        "mcs",
        "mono-mcs",
        "the tests crate's build script compiles the C# fixture",
    ),
    deb("strip", "binutils", "dist strips the static binary"),
    // Shells and core utilities the tests and benchmarks start.
    deb(
        "sh",
        "dash",
        "workloads and the initramfs packing run shell lines",
    ),
    deb(
        "bash",
        "bash",
        "the completions test loads bash's completion script",
    ),
    deb(
        "stdbuf",
        "coreutils",
        "libbpf-tools' output is line-buffered through it",
    ),
    deb("chmod", "coreutils", "the guest's /init is made executable"),
    deb(
        "timeout",
        "coreutils",
        "command mode's test of a failure after the fork",
    ),
    deb("dd", "coreutils", "block I/O workloads"),
    deb("sleep", "coreutils", "unit tests' idle processes"),
    deb("echo", "coreutils", "the start-up benchmark's exec"),
    deb(
        "true",
        "coreutils",
        "execsnoop's tests copy it; the guests carry it",
    ),
    deb("taskset", "util-linux", "workloads pinned to a CPU"),
    deb("setpriv", "util-linux", "the capability tests drop root"),
    deb(
        "losetup",
        "mount",
        "loop devices for block and file-system tests",
    ),
    deb("mount", "mount", "file systems for ext4slower and fsslower"),
    deb(
        "umount",
        "mount",
        "file systems for ext4slower and fsslower",
    ),
    deb(
        "ldd",
        "libc-bin",
        "the initramfs carries the tests' shared libraries",
    ),
    deb("getent", "libc-bin", "gethostlatency's lookups"),
    deb(
        "python3",
        "python3",
        "Python stacks in profile's tests and benchmarks; setup installs py-spy with its pip",
    ),
    deb(
        "python3.11",
        "python3.11",
        "the Python frame tests' interpreter, bookworm's own (no frame pointers)",
    ),
    deb(
        "pip3",
        "python3-pip",
        "setup installs py-spy (from PyPI), the Python tests' peer, with Debian's pip",
    ),
    deb(
        "debootstrap",
        "debootstrap",
        "setup makes the Debian trixie and sid roots whose python3 (3.13) and python3.14 \
         the Python tests run, and `cargo xtask otelcol` the sid root it builds the \
         Collector in",
    ),
    deb(
        "unshare",
        "util-linux",
        "`cargo xtask otelcol` runs apt and Go in its sid root with a /proc of their own \
         mount namespace",
    ),
    deb(
        "curl",
        "curl",
        "`cargo xtask otelcol` posts a profile to the Collector it built, to check it",
    ),
    Program {
        name: "python3.14",
        source: Source::Root("sid"),
        why: "the Python tests' 3.14, sid's own, in the root setup makes",
    },
    deb(
        "chroot",
        "coreutils",
        "the Python tests run trixie's python3 in its root",
    ),
    deb(
        "mono",
        "mono-runtime",
        "JIT-compiled stacks (perf-PID.map) in profile's tests",
    ),
    deb(
        "node",
        "nodejs",
        "JIT-compiled stacks (perf-PID.map) in profile's tests",
    ),
    deb("man", "man-db", "the man pages are rendered in their test"),
    deb(
        "pahole",
        "dwarves",
        "the BTF reader's offsets are checked against it",
    ),
    // File systems.
    deb("mke2fs", "e2fsprogs", "ext4 for ext4slower's tests"),
    deb("mkfs.xfs", "xfsprogs", "xfs for fsslower's tests"),
    deb("mkfs.btrfs", "btrfs-progs", "btrfs for fsslower's tests"),
    // The VM matrix.
    deb(
        "qemu-system-x86_64",
        "qemu-system-x86",
        "runs the other kernels",
    ),
    deb("busybox", "busybox-static", "the guests' shell and tools"),
    deb("cpio", "cpio", "packs the initramfs"),
    deb("gzip", "gzip", "packs the initramfs"),
    deb("find", "findutils", "lists the initramfs' files for cpio"),
    deb("xz", "xz-utils", "unpacks the kernels' modules"),
    deb("modinfo", "kmod", "finds the guests' modules' dependencies"),
    // Peers the tests and benchmarks compare with.
    deb("perf", "linux-perf", "profile's peer"),
    deb(
        "musl-gcc",
        "musl-tools",
        "compiles ring's C (the exporter's TLS) for the static build",
    ),
    deb(
        "openssl",
        "openssl",
        "makes the certificates of the exporter's TLS tests",
    ),
    deb("strace", "strace", "rtrace strace's peer"),
    deb(
        "java",
        "openjdk-17-jdk-headless",
        "runs the Java fixture, whose frames the walk names",
    ),
    deb(
        "javac",
        "openjdk-17-jdk-headless",
        "compiles the Java fixture",
    ),
    deb(
        "jar",
        "openjdk-17-jdk-headless",
        "packs the Java fixture's agent jar, which lets it redefine its own class",
    ),
    deb(
        "jcmd",
        "openjdk-17-jdk-headless",
        "has the JVM write the perf map that perf, the Java tests' peer, names JIT code by",
    ),
    // The everyday commands strace's comparison runs inside one shell
    // line, which the source scan does not see into.
    deb("tar", "tar", "strace's comparison"),
    deb("ls", "coreutils", "strace's comparison"),
    deb("sort", "coreutils", "strace's comparison"),
    deb("cp", "coreutils", "strace's comparison"),
    deb("wc", "coreutils", "strace's comparison"),
    deb(
        "tmux",
        "tmux",
        "the real terminal rtrace top's view is tested in",
    ),
    deb(
        "bpftrace",
        "bpftrace",
        "argdist's, ext4slower's and memleak's peer",
    ),
    deb("heaptrack", "heaptrack", "memleak's peer"),
    deb(
        "heaptrack_print",
        "heaptrack",
        "reads heaptrack's files in memleak's tests",
    ),
    deb("runqlat", "libbpf-tools", "runqlat's peer"),
    deb("biolatency", "libbpf-tools", "biolatency's peer"),
    deb("execsnoop", "libbpf-tools", "execsnoop's peer"),
    deb("tcplife", "libbpf-tools", "tcplife's peer"),
    deb("gethostlatency", "libbpf-tools", "gethostlatency's peer"),
    deb("ext4slower", "libbpf-tools", "ext4slower's peer"),
    deb("offcputime", "libbpf-tools", "offcputime's peer"),
    deb(
        "prometheus",
        "prometheus",
        "scrapes the exporter in its tests",
    ),
    deb(
        "prometheus-node-exporter",
        "prometheus-node-exporter",
        "the exporter benchmark's peer",
    ),
    // The browser tests, on the host alone: the guests carry no browser,
    // and the tests skip there.
    deb(
        "chromium",
        "chromium",
        "opens rtrace's HTML pages in the browser tests",
    ),
    deb(
        "chromedriver",
        "chromium-driver",
        "drives Chromium in the browser tests",
    ),
];

/// Debian packages that provide no program but a file the build needs.
pub const FILES: &[(&str, &str)] = &[
    ("systemtap-sdt-dev", "sys/sdt.h, for the USDT fixture"),
    (
        "libpython3.11",
        "libpython3.11.so.1.0, the interpreter the pyembed fixture loads",
    ),
    (
        "python3-pandas",
        "pandas, which the firefox test loads profile --samples' rows with",
    ),
    (
        "libc6-dbg",
        "libc's own symbols (start_thread, clone3: not exported), where the \
         tests' whole chains begin",
    ),
];

/// Every Debian package setup makes sure of, once each, in list order.
pub fn packages() -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    let named = PROGRAMS.iter().filter_map(|p| match p.source {
        Source::Debian(package) => Some(package),
        Source::Rust | Source::Root(_) => None,
    });
    for package in named.chain(FILES.iter().map(|f| f.0)) {
        if !out.contains(&package) {
            out.push(package);
        }
    }
    out
}

/// Where `name` is found: PATH, then the sbin directories (which a
/// non-root PATH may lack).
pub fn locate(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/local/sbin", "/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|p| is_executable(p))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    path.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The listed programs that are not on this machine.
pub fn missing() -> Vec<&'static Program> {
    PROGRAMS
        .iter()
        .filter(|p| !matches!(p.source, Source::Root(_)) && locate(p.name).is_none())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The programs a source file runs, as bare names: every `Command::new`
    /// of a string literal (clap's `Command` aside) and, with `paths`, every
    /// string that is a path in a directory of programs (`"/usr/sbin/runqlat"`).
    /// Comments are left out.
    fn run_by(source: &str, paths: bool) -> Vec<String> {
        let source: String = source
            .lines()
            .map(|l| l.split_once("//").map_or(l, |(code, _)| code))
            .collect::<Vec<_>>()
            .join("\n");
        let source = source.as_str();
        let mut names = Vec::new();
        let literal = |rest: &str| {
            rest.split('"')
                .next()
                .map(|l| l.rsplit('/').next().unwrap_or(l).to_owned())
        };
        let mut at = 0;
        while let Some(i) = source[at..].find("Command::new(\"") {
            let start = at + i;
            at = start + "Command::new(\"".len();
            if source[..start].ends_with("clap::") {
                continue;
            }
            names.extend(literal(&source[at..]));
        }
        for dir in ["\"/usr/bin/", "\"/usr/sbin/", "\"/bin/", "\"/sbin/"]
            .into_iter()
            .filter(|_| paths)
        {
            let mut at = 0;
            while let Some(i) = source[at..].find(dir) {
                at += i + dir.len();
                let rest = &source[at..];
                if !rest.split('"').next().unwrap_or("/").contains('/') {
                    names.extend(literal(rest).filter(|n| !n.is_empty()));
                }
            }
        }
        names
    }

    /// Every `.rs` file of the workspace but the eBPF crate (which runs in
    /// the kernel) and build output.
    fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy();
            if path.is_dir() {
                if !matches!(&*name, "target" | "ebpf-programs" | ".git") {
                    sources(&path, out);
                }
            } else if name.ends_with(".rs") {
                out.push(path);
            }
        }
    }

    /// Each program the sources run, with the first file that runs it.
    fn programs_run() -> Vec<(String, PathBuf)> {
        let mut files = Vec::new();
        sources(&crate::root(), &mut files);
        files.sort();
        let mut found: Vec<(String, PathBuf)> = Vec::new();
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            // Paths are read where programs are run for the tests and
            // benchmarks; rtrace's own sources hold paths as data.
            let rel = file.strip_prefix(crate::root()).unwrap_or(&file);
            // This file's own test snippets are no use of a program.
            if rel == Path::new("xtask/src/programs.rs") {
                continue;
            }
            let paths = rel.starts_with("xtask") || rel.starts_with("tests");
            for name in run_by(&text, paths) {
                if !found.iter().any(|(n, _)| *n == name) {
                    found.push((name, file.clone()));
                }
            }
        }
        found
    }

    #[test]
    fn every_program_the_sources_run_is_listed() {
        let found = programs_run();
        // The scanner itself must see what is known to be run, or this
        // test would pass on an empty scan.
        for known in [
            "modinfo",
            "perf",
            "qemu-system-x86_64",
            "mkfs.btrfs",
            "python3",
        ] {
            assert!(
                found.iter().any(|(n, _)| n == known),
                "the source scan no longer finds {known}: {found:?}"
            );
        }
        let unlisted: Vec<String> = found
            .iter()
            .filter(|(name, _)| !PROGRAMS.iter().any(|p| p.name == name))
            .map(|(name, file)| {
                let file = file.strip_prefix(crate::root()).unwrap_or(file);
                format!("{name} (run by {})", file.display())
            })
            .collect();
        assert!(
            unlisted.is_empty(),
            "programs run but missing from xtask/src/programs.rs: {}",
            unlisted.join(", ")
        );
    }

    #[test]
    fn the_scan_reads_commands_and_paths() {
        let src = r#"
            Command::new("modinfo").arg(x);
            std::process::Command::new("perf");
            clap::Command::new("runqlat");
            let p = "/usr/sbin/biolatency";
            let d = "/usr/bin/";
        "#;
        assert_eq!(run_by(src, true), ["modinfo", "perf", "biolatency"]);
        assert_eq!(run_by(src, false), ["modinfo", "perf"]);
        assert_eq!(
            run_by(
                "// Command::new(\"x\")\nCommand::new(\"/usr/sbin/ext4slower\")",
                false
            ),
            ["ext4slower"]
        );
    }

    #[test]
    fn each_program_is_listed_once() {
        for (i, p) in PROGRAMS.iter().enumerate() {
            assert!(
                !PROGRAMS[..i].iter().any(|q| q.name == p.name),
                "{} listed twice",
                p.name
            );
        }
        assert!(packages().contains(&"kmod"));
    }
}

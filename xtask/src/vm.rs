//! `cargo xtask vm-test`: the integration suite on other kernels, under qemu.
//!
//! The host's kernel lacks kprobes and fentry, so the fallback chains'
//! better paths can only be tested on other kernels. This fetches Debian's
//! kernels with apt, boots each with a busybox initramfs holding `rtrace`,
//! the workloads and the integration test executables, runs the suite
//! inside, and reports per kernel and per test. Software emulation (TCG)
//! is used because KVM guests hung in their firmware on these machines.

use std::{
    collections::BTreeSet,
    fmt::Write as _,
    fs,
    io::{BufRead, BufReader, Read},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use crate::{cargo, root, run};

/// The kernels of the matrix: a name pattern for `apt-cache search` (the
/// newest match is taken) and the mechanisms its config guarantees, which
/// the guest's doctor test then insists on.
const KERNELS: [(&str, &str); 2] = [
    (
        r"^linux-image-6\.1\.0-[0-9]+-cloud-amd64$",
        "tp_btf,raw_tracepoint,tracepoint,fentry,fexit,kprobe,kretprobe,uprobe,perf_event_sw,ringbuf,task_storage",
    ),
    (
        r"^linux-image-6\.12\.[0-9]+\+deb[0-9]+-cloud-amd64$",
        "tp_btf,raw_tracepoint,tracepoint,fentry,fexit,kprobe,kretprobe,uprobe,perf_event_sw,ringbuf,task_storage",
    ),
];

/// How long one guest may run before it counts as hung: the whole suite
/// took over 15 minutes under emulation once strace's and stat's tests
/// came (it ran over the 900 s this was), more on a slower machine.
const GUEST_TIMEOUT: Duration = Duration::from_secs(2100);

/// Lines the guest's `/init` prints around each step, for the parser.
const MARK: &str = "=== rtrace-vm:";

/// Where downloaded kernel packages are kept between runs: outside the
/// tree, so that a clean clone on the same machine reuses them.
fn cache_dir() -> PathBuf {
    std::env::var_os("RTRACE_VM_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("rtrace/vm")))
        .or_else(|| std::env::var_os("HOME").map(|d| PathBuf::from(d).join(".cache/rtrace/vm")))
        .unwrap_or_else(|| PathBuf::from("/var/cache/rtrace/vm"))
}

/// The newest package whose name matches `pattern`.
fn newest_package(pattern: &str) -> anyhow::Result<String> {
    let search = || -> anyhow::Result<Vec<String>> {
        let out =
            crate::stdout_of(Command::new("apt-cache").args(["search", "--names-only", pattern]))?;
        Ok(out
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .map(str::to_owned)
            .collect())
    };
    let mut names = search()?;
    if names.is_empty() {
        run(Command::new("apt-get").args(["update", "-qq"]))?;
        names = search()?;
    }
    // Version order: compare the numeric runs, not the text.
    let key = |n: &str| -> Vec<u64> {
        n.split(|c: char| !c.is_ascii_digit())
            .filter(|s| !s.is_empty())
            .filter_map(|s| s.parse().ok())
            .collect()
    };
    names
        .into_iter()
        .max_by_key(|n| key(n))
        .with_context(|| format!("apt offers no package matching {pattern}"))
}

/// Downloads (once) and unpacks `package`; returns its `vmlinuz`.
fn kernel_image(package: &str) -> anyhow::Result<PathBuf> {
    let dir = cache_dir().join(package);
    let unpacked = dir.join("root");
    let find = || -> Option<PathBuf> {
        fs::read_dir(unpacked.join("boot"))
            .ok()?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("vmlinuz-"))
            })
    };
    if let Some(image) = find() {
        return Ok(image);
    }
    fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    eprintln!("xtask: vm-test: downloading {package}");
    run(Command::new("apt-get")
        .args(["download", "-qq", package])
        .current_dir(&dir))
    .with_context(|| format!("cannot download {package}"))?;
    let deb = fs::read_dir(&dir)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .with_context(|| format!("apt-get download left no .deb in {}", dir.display()))?;
    run(Command::new("dpkg").arg("-x").arg(&deb).arg(&unpacked))?;
    find().with_context(|| format!("{package} holds no /boot/vmlinuz-*"))
}

/// Test executables of the integration crate, built by cargo.
fn test_executables() -> anyhow::Result<Vec<PathBuf>> {
    let out = crate::stdout_of(cargo().args([
        "test",
        "--release",
        "-p",
        "rtrace-integration-tests",
        "--no-run",
        "--message-format=json",
    ]))?;
    let mut exes = Vec::new();
    for line in out.lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if msg["profile"]["test"] == true
            && let Some(exe) = msg["executable"].as_str()
        {
            exes.push(PathBuf::from(exe));
        }
    }
    if exes.is_empty() {
        bail!("cargo built no integration test executables");
    }
    Ok(exes)
}

/// The shared libraries `elf` loads, by absolute path.
fn libraries(elf: &Path, into: &mut BTreeSet<PathBuf>) -> anyhow::Result<()> {
    let out = Command::new("ldd").arg(elf).output()?;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or
        // "/lib64/ld-linux-x86-64.so.2 (0x...)"
        let path = line
            .split("=>")
            .last()
            .and_then(|s| s.split_whitespace().next())
            .filter(|p| p.starts_with('/'));
        if let Some(p) = path {
            into.insert(PathBuf::from(p));
        }
    }
    Ok(())
}

fn copy_into(tree: &Path, from: &Path, to: &str) -> anyhow::Result<()> {
    let dest = tree.join(to.trim_start_matches('/'));
    fs::create_dir_all(dest.parent().unwrap())?;
    fs::copy(from, &dest)
        .with_context(|| format!("cannot copy {} to {}", from.display(), dest.display()))?;
    Ok(())
}

/// The guest's `/init`: mounts what tracing needs, runs `body` and powers
/// off. tracefs (and debugfs, which would mount it on first look) are left
/// unmounted, as on hosts without systemd's automounts: rtrace mounts
/// tracefs itself where it needs it, and the guests check that it does.
fn init_script(body: &str) -> String {
    format!(
        r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
# Real tools copied from the host (setpriv) win over busybox's applets.
export PATH=/usr/bin:/usr/sbin:/bin:/sbin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs tmp /tmp
mount -t securityfs nodev /sys/kernel/security
mount -t bpf nodev /sys/fs/bpf
mount -t cgroup2 nodev /sys/fs/cgroup
ip link set lo up
for m in $(cat /lib/modules/$(uname -r)/order); do insmod /lib/modules/$(uname -r)/$m.ko 2>/dev/null; done
ulimit -l unlimited
echo "{MARK} kernel $(uname -r)"
{body}
echo "{MARK} done"
poweroff -f
"#
    )
}

/// The test run's part of `/init`: the doctor, then every test executable.
fn test_body(filter: &[String]) -> String {
    let filter = filter.join(" ");
    format!(
        r#"expect=$(sed -n 's/.*rtrace\.expect=\([^ ]*\).*/\1/p' /proc/cmdline)
echo "{MARK} doctor"
/t/rtrace doctor
for t in /t/deps/*; do
    name=$(basename "$t")
    echo "{MARK} run $name"
    RTRACE_BIN=/t/rtrace RTRACE_STATIC_BIN=/t/rtrace-static RTRACE_EXPECT_MECHANISMS="$expect" "$t" --test-threads=1 {filter} 2>&1
    echo "{MARK} exit $name $?"
done"#
    )
}

/// The modules the guests load, with what they depend on: loop for
/// biolatency's and ext4slower's block devices, xfs and btrfs for
/// fsslower's. Debian builds them as modules.
const MODULES: [&str; 3] = ["loop", "xfs", "btrfs"];

/// Puts [`MODULES`] of the kernel at `image` (`…/boot/vmlinuz-REL`) and
/// their dependencies (from `modinfo`) into the tree as
/// `/lib/modules/REL/NAME.ko`, uncompressed for busybox's insmod, with
/// `/lib/modules/REL/order` listing them dependencies first.
fn kernel_modules(tree: &Path, image: &Path) -> anyhow::Result<()> {
    let release = image
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("vmlinuz-"))
        .context("kernel image is not named vmlinuz-RELEASE")?;
    let root = image
        .parent()
        .and_then(Path::parent)
        .context("kernel image outside a tree")?
        .join("lib/modules")
        .join(release)
        .join("kernel");
    let mut files = Vec::new();
    find_modules(&root, &mut files)?;
    let dest = tree.join("lib/modules").join(release);
    fs::create_dir_all(&dest)?;
    let mut order: Vec<String> = Vec::new();
    fn visit(
        name: &str,
        files: &[PathBuf],
        dest: &Path,
        order: &mut Vec<String>,
    ) -> anyhow::Result<()> {
        let norm = name.replace('-', "_");
        if order.contains(&norm) {
            return Ok(());
        }
        let Some(file) = files.iter().find(|f| {
            f.file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.split(".ko").next())
                .is_some_and(|n| n.replace('-', "_") == norm)
        }) else {
            // Built into this kernel.
            return Ok(());
        };
        let deps = Command::new("modinfo")
            .args(["-F", "depends"])
            .arg(file)
            .output()
            .context("cannot run modinfo (Debian package kmod)")?;
        for dep in String::from_utf8_lossy(&deps.stdout)
            .trim()
            .split(',')
            .filter(|d| !d.is_empty())
        {
            visit(dep, files, dest, order)?;
        }
        let bytes = if file.extension().is_some_and(|e| e == "xz") {
            let out = Command::new("xz")
                .arg("-dc")
                .arg(file)
                .output()
                .context("cannot run xz (Debian package xz-utils)")?;
            if !out.status.success() {
                bail!("cannot unpack {}", file.display());
            }
            out.stdout
        } else {
            fs::read(file)?
        };
        fs::write(dest.join(format!("{norm}.ko")), bytes)?;
        order.push(norm);
        Ok(())
    }
    for m in MODULES {
        visit(m, &files, &dest, &mut order)?;
    }
    fs::write(dest.join("order"), order.join("\n") + "\n")?;
    Ok(())
}

/// Every module file below `dir`.
fn find_modules(dir: &Path, out: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            find_modules(&path, out)?;
        } else if path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.ends_with(".ko") || n.ends_with(".ko.xz"))
        {
            out.push(path);
        }
    }
    Ok(())
}

/// Builds the initramfs shared by every kernel.
fn initramfs(
    rtrace: &Path,
    init: &str,
    extra: &[&str],
    kernels: &[&Path],
    dir: &Path,
) -> anyhow::Result<PathBuf> {
    let tree = dir.join("tree");
    if tree.exists() {
        fs::remove_dir_all(&tree)?;
    }
    for d in [
        "bin", "sbin", "proc", "sys", "dev", "tmp", "t/deps", "usr/bin",
    ] {
        fs::create_dir_all(tree.join(d))?;
    }
    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .into_iter()
        .map(Path::new)
        .find(|p| p.exists())
        .context("busybox is missing (Debian package busybox-static)")?;
    copy_into(&tree, busybox, "/bin/busybox")?;

    let mut elves = vec![
        (rtrace.to_path_buf(), "/t/rtrace".to_owned()),
        (crate::dist::static_path(), "/t/rtrace-static".to_owned()),
    ];
    let release = root().join("target/release");
    // Workloads, and the fixtures the tests crate's build script puts
    // beside them (and lists).
    for entry in fs::read_dir(root().join("tests/src/bin"))? {
        let name = entry?
            .path()
            .file_stem()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        elves.push((release.join(&name), format!("/t/{name}")));
    }
    let fixtures = fs::read_to_string(release.join("fixtures.txt"))
        .context("fixtures.txt missing: build the tests crate first")?;
    for name in fixtures.lines().filter(|l| !l.is_empty()) {
        elves.push((release.join(name), format!("/t/{name}")));
    }
    // gethostlatency's tests need a resolver configuration, NSS modules
    // and Python, which the guests lack; uprobes work on the host, which
    // runs them.
    for exe in test_executables()?
        .into_iter()
        .filter(|e| !suite(&e.file_name().unwrap().to_string_lossy()).eq("gethostlatency"))
    {
        let name = exe.file_name().unwrap().to_string_lossy().into_owned();
        elves.push((exe, format!("/t/deps/{name}")));
    }
    // The capability test drops privileges with setpriv; execsnoop's tests
    // copy a real `true` (busybox's applets only answer to their names);
    // ext4slower's and fsslower's make file systems.
    for tool in [
        "/usr/bin/setpriv",
        "/usr/bin/true",
        "/usr/sbin/mke2fs",
        "/usr/sbin/mkfs.xfs",
        "/usr/sbin/mkfs.btrfs",
    ]
    .iter()
    .chain(extra)
    {
        if Path::new(tool).exists() {
            elves.push((PathBuf::from(tool), (*tool).to_owned()));
        }
    }
    for image in kernels {
        kernel_modules(&tree, image)?;
    }
    let mut libs = BTreeSet::new();
    for (from, to) in &elves {
        copy_into(&tree, from, to)?;
        libraries(from, &mut libs)?;
    }
    for lib in libs {
        copy_into(&tree, &lib, &lib.to_string_lossy())?;
    }
    let init_path = tree.join("init");
    fs::write(&init_path, init)?;
    run(Command::new("chmod").arg("755").arg(&init_path))?;

    let image = dir.join("initramfs.cpio.gz");
    run(Command::new("sh")
        .arg("-c")
        .arg(format!(
            "find . | cpio -o -H newc --quiet | gzip -1 > '{}'",
            image.display()
        ))
        .current_dir(&tree))
    .context("cannot pack the initramfs (needs cpio and gzip)")?;
    Ok(image)
}

/// Boots `kernel` with `initrd`, telling the guest which mechanisms its
/// kernel must offer; returns the console output and whether it hung.
fn boot(kernel: &Path, initrd: &Path, expect: &str, tag: &str) -> anyhow::Result<(String, bool)> {
    let mut child = Command::new("qemu-system-x86_64")
        // One host thread for both vCPUs: with multi-threaded TCG, the
        // kernel's live patching of tracepoint static keys (text_poke_bp,
        // on every attach and detach) raced across vCPUs and oopsed on a
        // stale int3 or hung in its IPI sync, a few runs in ten.
        .args([
            "-accel",
            "tcg,thread=single",
            "-cpu",
            "max",
            "-m",
            "2048",
            "-smp",
            "2",
        ])
        .arg("-kernel")
        .arg(kernel)
        .arg("-initrd")
        .arg(initrd)
        .arg("-append")
        .arg(format!(
            "console=ttyS0 quiet panic=-1 oops=panic rtrace.expect={expect}"
        ))
        .args([
            "-nographic",
            "-no-reboot",
            "-nodefaults",
            "-serial",
            "stdio",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot start qemu-system-x86_64 (Debian package qemu-system-x86)")?;
    let stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let tag = tag.to_owned();
    let reader = std::thread::spawn(move || {
        let mut log = String::new();
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let line = line.trim_end_matches('\r').to_owned();
            // Progress on the host's stderr, so a slow guest is visibly alive.
            if let Some(at) = line.find(MARK) {
                eprintln!("xtask: vm-test: {tag}: {}", line[at + MARK.len()..].trim());
            }
            log.push_str(&line);
            log.push('\n');
        }
        log
    });
    let start = Instant::now();
    let mut timed_out = false;
    loop {
        if child.try_wait()?.is_some() {
            break;
        }
        if start.elapsed() > GUEST_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            timed_out = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let mut log = reader.join().unwrap_or_default();
    let mut err = String::new();
    let _ = stderr.read_to_string(&mut err);
    if !err.trim().is_empty() {
        let _ = writeln!(log, "[qemu stderr]\n{err}");
    }
    Ok((log, timed_out))
}

/// What one guest run showed.
struct Outcome {
    kernel: String,
    /// (test executable, test name, passed)
    tests: Vec<(String, String, bool)>,
    /// Test executables that exited non-zero.
    failed_exes: Vec<String>,
    /// The doctor's table.
    doctor: String,
    /// The guest reached the end of `/init`.
    finished: bool,
}

fn parse(log: &str) -> Outcome {
    let mut out = Outcome {
        kernel: String::new(),
        tests: Vec::new(),
        failed_exes: Vec::new(),
        doctor: String::new(),
        finished: false,
    };
    let mut current = String::new();
    let mut in_doctor = false;
    let mut pending: Option<String> = None;
    for line in log.lines() {
        // The console may prefix the first line with terminal escapes.
        if let Some(at) = line.find(MARK) {
            let rest = &line[at + MARK.len()..];
            let rest = rest.trim();
            in_doctor = rest == "doctor";
            if let Some(k) = rest.strip_prefix("kernel ") {
                out.kernel = k.to_owned();
            } else if let Some(exe) = rest.strip_prefix("run ") {
                current = exe.to_owned();
            } else if let Some(exit) = rest.strip_prefix("exit ") {
                let mut it = exit.split_whitespace();
                let (exe, code) = (it.next().unwrap_or(""), it.next().unwrap_or(""));
                if code != "0" {
                    out.failed_exes.push(exe.to_owned());
                }
            } else if rest == "done" {
                out.finished = true;
            }
            continue;
        }
        if in_doctor {
            out.doctor.push_str(line);
            out.doctor.push('\n');
        }
        // libtest: "test name ... ok" / "test name ... FAILED". Kernel
        // messages on the console may split the line; the verdict then
        // stands alone on a later line.
        let verdict = |r: &str| match r.trim() {
            "ok" => Some(true),
            "FAILED" => Some(false),
            _ => None,
        };
        if let Some(t) = line.strip_prefix("test ")
            && let Some((name, result)) = t.split_once(" ... ")
        {
            let tail = result.rsplit(']').next().unwrap_or(result);
            match verdict(result).or_else(|| verdict(tail)) {
                Some(ok) => out.tests.push((current.clone(), name.to_owned(), ok)),
                None => pending = Some(name.to_owned()),
            }
        } else if let Some(ok) = verdict(line)
            && let Some(name) = pending.take()
        {
            out.tests.push((current.clone(), name, ok));
        }
    }
    out
}

/// Short name of a test executable (`runqlat-0123abcd` → `runqlat`).
fn suite(exe: &str) -> &str {
    exe.rsplit_once('-').map_or(exe, |(s, _)| s)
}

/// One guest's run: its package, its console and whether it hung.
pub struct GuestRun {
    /// The kernel package booted.
    pub package: String,
    /// The console output.
    pub log: String,
    /// Whether it ran over the time limit and was killed.
    pub timed_out: bool,
    /// How long it ran.
    pub elapsed: Duration,
}

/// Boots every kernel of the matrix with an initramfs whose `/init` runs
/// `body` (busybox sh; `{MARK}` lines go to the host's stderr as progress),
/// with the host files `extra` and their libraries copied in.
pub fn boot_all(body: &str, extra: &[&str]) -> anyhow::Result<Vec<GuestRun>> {
    let rtrace = crate::build()?;
    // The static build runs in the guests too, with none of the host's
    // libraries beside it.
    crate::dist::static_binary()?;
    let work = root().join("target/vm");
    fs::create_dir_all(&work)?;
    let mut kernels = Vec::new();
    for (pattern, expect) in KERNELS {
        let package = newest_package(pattern)?;
        let image = kernel_image(&package)?;
        kernels.push((package, image, expect));
    }
    let images: Vec<&Path> = kernels
        .iter()
        .map(|(_, image, _)| image.as_path())
        .collect();
    let initrd = initramfs(&rtrace, &init_script(body), extra, &images, &work)?;
    // The guests at once: each emulates on one host thread, so two take
    // the two CPUs of the machines here, and the matrix takes as long as
    // its slowest kernel rather than the sum.
    let runs = std::thread::scope(|s| {
        let handles: Vec<_> = kernels
            .into_iter()
            .map(|(package, image, expect)| {
                let (initrd, work) = (&initrd, &work);
                s.spawn(move || -> anyhow::Result<GuestRun> {
                    eprintln!("xtask: vm: booting {package}");
                    let start = Instant::now();
                    let tag = package
                        .strip_prefix("linux-image-")
                        .unwrap_or(&package)
                        .to_owned();
                    let (log, timed_out) = boot(&image, initrd, expect, &tag)?;
                    fs::write(work.join(format!("{package}.log")), &log)?;
                    Ok(GuestRun {
                        package,
                        log,
                        timed_out,
                        elapsed: start.elapsed(),
                    })
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a guest's thread panicked")))
            })
            .collect::<anyhow::Result<Vec<_>>>()
    })?;
    Ok(runs)
}

/// Runs the matrix; `filter` goes to every test executable.
pub fn run_matrix(filter: &[String]) -> anyhow::Result<()> {
    let work = root().join("target/vm");
    let runs = boot_all(&test_body(filter), &[])?;
    let mut outcomes = Vec::new();
    let mut failed = false;
    for GuestRun {
        package,
        log,
        timed_out,
        elapsed,
    } in runs
    {
        let outcome = parse(&log);
        let ok = !timed_out
            && outcome.finished
            && outcome.failed_exes.is_empty()
            && outcome.tests.iter().all(|t| t.2)
            && !outcome.tests.is_empty();
        eprintln!(
            "xtask: vm-test: {package}: {} in {:.0} s",
            if ok { "passed" } else { "FAILED" },
            elapsed.as_secs_f64()
        );
        if !ok {
            failed = true;
            eprintln!("---- guest console of {package} ----\n{log}---- end of guest console ----");
            if timed_out {
                eprintln!(
                    "xtask: vm-test: {package}: the guest ran over {GUEST_TIMEOUT:?} and was killed"
                );
            } else if !outcome.finished {
                eprintln!("xtask: vm-test: {package}: the guest stopped before the end of /init");
            }
        }
        outcomes.push((package, outcome));
    }

    println!();
    for (package, o) in &outcomes {
        println!("== {package} (guest kernel {})", o.kernel);
        print!("{}", o.doctor);
        for (exe, name, passed) in &o.tests {
            println!(
                "  {:<6} {}::{name}",
                if *passed { "ok" } else { "FAILED" },
                suite(exe)
            );
        }
        for exe in &o.failed_exes {
            println!("  FAILED {} (exited non-zero)", suite(exe));
        }
        println!();
    }
    if failed {
        bail!("vm-test failed; guest logs are in {}", work.display());
    }
    println!("vm-test: all tests passed on {} kernels", outcomes.len());
    Ok(())
}

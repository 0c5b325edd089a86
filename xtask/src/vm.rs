//! `cargo xtask vm-test`: the integration suite on other kernels, under qemu.
//!
//! The host's kernel lacks kprobes and fentry, so the fallback chains'
//! better paths can only be tested on other kernels. This fetches Debian's
//! kernels with apt, boots each with a busybox initramfs holding `rtrace`,
//! the workloads and the integration test executables, runs the suite
//! inside, and reports per kernel and per test. Software emulation (TCG)
//! is used because KVM guests hung in their firmware on these machines.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
    fs,
    io::{BufRead, BufReader, Read},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use crate::{
    root, run,
    suite::{Case, Record, Verdict, suite_of},
};

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

/// How long one guest may run before it counts as hung, by the number of
/// tests it runs: its 64 tests took some 400 s on 28 November 2026 (every
/// test in the guests took 1450 s), each test is killed after
/// [`TEST_TIMEOUT`], and a guest still running after this is stuck
/// outside its tests (an oops, a hung /init).
fn guest_timeout(tests: usize) -> Duration {
    Duration::from_secs(u64::from(TEST_TIMEOUT) + 20 * tests as u64)
}

/// How long one test may run in a guest before busybox's `timeout` kills
/// it, so that a hung test fails alone and the guest goes on to the next:
/// well past the 180 s at which the budget check fails it anyway.
const TEST_TIMEOUT: u32 = 300;

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

/// The test run's part of `/init`: the doctor, then every test listed in
/// `/t/tests.txt` (`EXECUTABLE NAME` a line) in a process of its own,
/// between marks that carry the guest's uptime, for its time.
fn test_body() -> String {
    format!(
        r#"expect=$(sed -n 's/.*rtrace\.expect=\([^ ]*\).*/\1/p' /proc/cmdline)
echo "{MARK} doctor"
/t/rtrace doctor
while read exe name; do
    echo "{MARK} start $exe $name $(cut -d' ' -f1 /proc/uptime)"
    RTRACE_BIN=/t/rtrace RTRACE_STATIC_BIN=/t/rtrace-static RTRACE_EXPECT_MECHANISMS="$expect" \
        timeout -s KILL {TEST_TIMEOUT} "/t/deps/$exe" --exact "$name" --test-threads=1 \
        --nocapture </dev/null 2>&1
    rc=$?
    echo "{MARK} end $exe $name $rc $(cut -d' ' -f1 /proc/uptime)"
done < /t/tests.txt"#
    )
}

/// The modules the guests load, with what they depend on: loop for
/// biolatency's and ext4slower's block devices, xfs and btrfs for
/// fsslower's, and an I/O scheduler so that requests are inserted
/// (`block_rq_insert`: profile -e's and biolatency -Q's tests), which 6.1
/// builds in and 6.12 builds as a module. Debian builds the rest as
/// modules; one built in is passed over.
const MODULES: [&str; 4] = ["loop", "xfs", "btrfs", "mq-deadline"];

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
    tests: &[Case],
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
    // The test executables of the tests the guests run (the host decides
    // which: see `crate::suite::guest_cases`).
    let mut exes: Vec<&Path> = tests.iter().map(|c| c.exe.as_path()).collect();
    exes.dedup();
    for exe in exes {
        let name = exe.file_name().unwrap().to_string_lossy().into_owned();
        elves.push((exe.to_path_buf(), format!("/t/deps/{name}")));
    }
    let list: String = tests
        .iter()
        .map(|c| {
            format!(
                "{} {}\n",
                c.exe.file_name().unwrap().to_string_lossy(),
                c.name
            )
        })
        .collect();
    fs::write(tree.join("t/tests.txt"), list)?;
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
fn boot(
    kernel: &Path,
    initrd: &Path,
    expect: &str,
    tag: &str,
    limit: Duration,
) -> anyhow::Result<(String, bool)> {
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
        if start.elapsed() > limit {
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
    /// The guest's `uname -r`.
    kernel: String,
    /// Each test's record, and its output.
    tests: Vec<(Record, String)>,
    /// The doctor's table.
    doctor: String,
    /// The guest reached the end of `/init`.
    finished: bool,
}

/// Reads a guest's console: the doctor's table, and each test between its
/// start and end marks, timed by the guest's uptime. `place` names the
/// guest in the records. A test that started and never ended (the guest
/// died or hung) failed.
fn parse(log: &str, place: &str) -> Outcome {
    let mut out = Outcome {
        kernel: String::new(),
        tests: Vec::new(),
        doctor: String::new(),
        finished: false,
    };
    let mut in_doctor = false;
    // The test running: its id, start time and output so far.
    let mut running: Option<(String, f64, String)> = None;
    let mut last_time = 0.0;
    for line in log.lines() {
        // The console may prefix a mark with terminal escapes, or kernel
        // messages may come before it on its line.
        if let Some(at) = line.find(MARK) {
            let rest = line[at + MARK.len()..].trim();
            in_doctor = rest == "doctor";
            let words: Vec<&str> = rest.split_whitespace().collect();
            match words.as_slice() {
                ["kernel", k] => out.kernel = (*k).to_owned(),
                ["start", exe, name, t] => {
                    let t = t.parse().unwrap_or(last_time);
                    last_time = t;
                    // A kernel message on the console can split a mark: a
                    // test whose end was not read is judged by libtest's
                    // own result line, rather than vanish.
                    if let Some((test, start, mut output)) = running.take() {
                        let ok = output.contains("test result: ok. 1 passed");
                        output.push_str("xtask: this test's end mark was not read\n");
                        let verdict = Verdict::of(ok, &output);
                        out.tests
                            .push((guest_record(test, place, t - start, verdict), output));
                    }
                    running = Some((
                        format!("{}::{name}", suite_of(Path::new(exe))),
                        t,
                        String::new(),
                    ));
                }
                ["end", _, _, rc, t] => {
                    let t: f64 = t.parse().unwrap_or(last_time);
                    last_time = t;
                    if let Some((test, start, output)) = running.take() {
                        let verdict = Verdict::of(*rc == "0", &output);
                        out.tests
                            .push((guest_record(test, place, t - start, verdict), output));
                    }
                }
                ["done"] => out.finished = true,
                _ => {}
            }
            continue;
        }
        if in_doctor {
            out.doctor.push_str(line);
            out.doctor.push('\n');
        }
        if let Some((_, _, output)) = &mut running {
            output.push_str(line);
            output.push('\n');
        }
    }
    if let Some((test, start, mut output)) = running {
        output.push_str("xtask: the guest stopped while this test ran\n");
        let secs = last_time.max(start) - start;
        out.tests
            .push((guest_record(test, place, secs, Verdict::Failed), output));
    }
    out
}

/// The record of `test`'s run in the guest `place`.
fn guest_record(test: String, place: &str, secs: f64, verdict: Verdict) -> Record {
    Record {
        test,
        place: place.to_owned(),
        secs,
        verdict,
    }
}

/// The short name of a guest by its kernel package, as the test records
/// name where they ran: `linux-image-6.1.0-40-cloud-amd64` → `6.1`.
pub fn place_of(package: &str) -> String {
    let version = package.strip_prefix("linux-image-").unwrap_or(package);
    version.split('.').take(2).collect::<Vec<_>>().join(".")
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
/// with the host files `extra` and their libraries copied in, and the
/// executables of `tests` listed in `/t/tests.txt`; a guest still running
/// after `limit` is killed.
pub fn boot_all(
    rtrace: &Built,
    body: &str,
    extra: &[&str],
    tests: &[Case],
    limit: Duration,
) -> anyhow::Result<Vec<GuestRun>> {
    let Built(rtrace) = rtrace;
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
    let initrd = initramfs(rtrace, &init_script(body), extra, tests, &images, &work)?;
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
                    let (log, timed_out) = boot(&image, initrd, expect, &tag, limit)?;
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

/// Builds rtrace, runs `body` in every guest of the matrix (busybox sh,
/// the binary as `/t/rtrace`, at most 10 minutes), and returns each
/// guest's package with the lines of its console that carry `mark`, as
/// they stand after it. The body marks the lines it wants seen (the
/// console also carries the kernel's messages).
pub fn marked_lines(body: &str, mark: &str) -> anyhow::Result<Vec<(String, Vec<String>)>> {
    let runs = boot_all(&Built::build()?, body, &[], &[], Duration::from_secs(600))?;
    Ok(runs
        .into_iter()
        .map(|run| {
            let lines = run
                .log
                .lines()
                .filter_map(|l| l.split_once(mark).map(|(_, r)| r.trim().to_owned()))
                .collect();
            (run.package, lines)
        })
        .collect())
}

/// The release binary, built with the static one beside it
/// ([`crate::dist::static_path`]): what the guests run.
pub struct Built(pub PathBuf);

impl Built {
    /// Builds both binaries.
    pub fn build() -> anyhow::Result<Self> {
        let rtrace = crate::build()?;
        // The static build runs in the guests too, with none of the host's
        // libraries beside it.
        crate::dist::static_binary()?;
        Ok(Self(rtrace))
    }
}

/// How long each guest ran, in seconds, by its place (`6.1`).
pub type GuestTimes = Vec<(String, f64)>;

/// Runs `tests` in every guest of the matrix; their records, and how long
/// each guest ran.
pub fn run_matrix(rtrace: &Built, tests: &[Case]) -> anyhow::Result<(Vec<Record>, GuestTimes)> {
    let work = root().join("target/vm");
    let limit = guest_timeout(tests.len());
    let runs = boot_all(rtrace, &test_body(), &[], tests, limit)?;
    let mut records = Vec::new();
    let mut times = Vec::new();
    for GuestRun {
        package,
        log,
        timed_out,
        elapsed,
    } in runs
    {
        let place = place_of(&package);
        let mut outcome = parse(&log, &place);
        times.push((place.clone(), elapsed.as_secs_f64()));
        println!("\n== {package} (guest kernel {})", outcome.kernel);
        print!("{}", outcome.doctor);
        for (record, output) in &outcome.tests {
            if record.verdict == Verdict::Failed {
                eprintln!(
                    "---- output of {} in {place} ----\n{output}---- end of {} ----",
                    record.test, record.test
                );
            }
        }
        // Runs the guest never reported count as failed, so that a guest
        // that died early, or a mark lost on the console, cannot pass: by
        // count, as `--repeat` runs a test several times.
        let mut ran: BTreeMap<String, usize> = BTreeMap::new();
        for (r, _) in &outcome.tests {
            *ran.entry(r.test.clone()).or_default() += 1;
        }
        for case in tests {
            let seen = ran.entry(case.id()).or_default();
            if *seen > 0 {
                *seen -= 1;
                continue;
            }
            let never = guest_record(case.id(), &place, 0.0, Verdict::Failed);
            outcome.tests.push((never, String::new()));
        }
        let failed = outcome
            .tests
            .iter()
            .filter(|(r, _)| r.verdict == Verdict::Failed)
            .count();
        println!(
            "{place}: {} tests run in the guest, {failed} failed, in {:.0} s",
            outcome.tests.len(),
            elapsed.as_secs_f64()
        );
        if timed_out {
            eprintln!("xtask: vm-test: {package}: the guest ran over {limit:?} and was killed");
        } else if !outcome.finished {
            eprintln!(
                "xtask: vm-test: {package}: the guest stopped before the end of /init; its \
                 console is in {}",
                work.join(format!("{package}.log")).display()
            );
        }
        if timed_out || !outcome.finished {
            // The console's tail says why (an oops, a panic).
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            eprintln!("---- the console's last lines ----");
            for line in tail.iter().rev() {
                eprintln!("{line}");
            }
            let test = format!("guest {package} reached the end of /init");
            records.push(guest_record(
                test,
                &place,
                elapsed.as_secs_f64(),
                Verdict::Failed,
            ));
        }
        records.extend(outcome.tests.into_iter().map(|(r, _)| r));
    }
    Ok((records, times))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_console_gives_each_test_its_time_and_verdict() {
        let log = format!(
            "\x1b[0m{MARK} kernel 6.1.0-40-cloud-amd64\n\
             {MARK} doctor\nmechanism  works\n\
             {MARK} start runqlat-0a1b c_one 10.50\n\
             test c_one ... ok\n\
             {MARK} end runqlat-0a1b c_one 0 12.75\n\
             {MARK} start runqlat-0a1b c_two 12.80\n\
             skipped: nothing here\n\
             {MARK} end runqlat-0a1b c_two 0 13.00\n\
             {MARK} start profile-ff c_three 13.00\n\
             [  14.1] some kernel line {MARK} end profile-ff c_three 101 20.00\n\
             {MARK} start profile-ff c_five 20.00\n\
             test result: ok. 1 passed; 0 failed\n\
             {MARK} end pro[  20.5] a kernel line\n\
             file-ff c_five 0 20.00\n\
             {MARK} start profile-ff c_four 20.00\n\
             [  21.0] Kernel panic\n"
        );
        let o = parse(&log, "6.1");
        assert_eq!(o.kernel, "6.1.0-40-cloud-amd64");
        assert_eq!(o.doctor, "mechanism  works\n");
        assert!(!o.finished);
        let got: Vec<(&str, f64, Verdict)> = o
            .tests
            .iter()
            .map(|(r, _)| (r.test.as_str(), (r.secs * 100.0).round() / 100.0, r.verdict))
            .collect();
        assert_eq!(
            got,
            [
                ("runqlat::c_one", 2.25, Verdict::Passed),
                ("runqlat::c_two", 0.2, Verdict::Skipped),
                ("profile::c_three", 7.0, Verdict::Failed),
                ("profile::c_five", 0.0, Verdict::Passed),
                ("profile::c_four", 0.0, Verdict::Failed),
            ]
        );
        assert!(o.tests[0].1.contains("test c_one ... ok"));
        assert!(o.tests.iter().all(|(r, _)| r.place == "6.1"));
    }

    #[test]
    fn guests_are_named_by_their_kernel() {
        assert_eq!(place_of("linux-image-6.1.0-40-cloud-amd64"), "6.1");
        assert_eq!(place_of("linux-image-6.12.57+deb13-cloud-amd64"), "6.12");
    }
}

//! ext4slower on cached reads of an ext4 file system, on every attach path:
//! the host's against bpftrace, the VM guests' against libbpf-tools.

use std::{path::PathBuf, process::Command};

use anyhow::Context as _;

use super::{
    Ready, Row, Setup, TRIALS,
    helpers::{Loop, timed},
    median, print_costs, trials,
};

/// Cached 4 KiB preads per trial of the ext4slower benchmark.
const E4_READS: u64 = 200_000;
/// The same in the emulated guests, which run ten to fifty times slower.
const E4_GUEST_READS: u64 = 20_000;

/// An ext4 file system on a loop device, mounted under `target/bench`.
struct Ext4 {
    dir: PathBuf,
    _dev: Loop,
}

impl Ext4 {
    fn new() -> anyhow::Result<Self> {
        let dev = Loop::new()?;
        crate::run(
            Command::new("mke2fs")
                .args(["-q", "-F", "-t", "ext4", &dev.0])
                .env("MKE2FS_CONFIG", "/nonexistent"),
        )
        .context("cannot make the file system (Debian package e2fsprogs)")?;
        let dir = crate::root().join("target/bench/e4mnt");
        std::fs::create_dir_all(&dir)?;
        crate::run(Command::new("mount").args(["-t", "ext4", &dev.0]).arg(&dir))?;
        Ok(Self { dir, _dev: dev })
    }
}

impl Drop for Ext4 {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.dir).status();
    }
}

/// bpftrace timing the workload's syscall as the tracepoint path does
/// (without the file-system check), printing only slow calls: the one peer
/// that runs on a kernel without fentry and kprobes.
const BPFTRACE_SLOWER: &str = "BEGIN { printf(\"Tracing\\n\"); } \
    tracepoint:syscalls:sys_enter_pread64 { @s[tid] = nsecs; } \
    tracepoint:syscalls:sys_exit_pread64 /@s[tid]/ { $d = nsecs - @s[tid]; \
    delete(@s[tid]); if ($d > 10000000) { printf(\"%d %s %d\\n\", pid, comm, $d); } }";

/// ext4slower's cost on cached reads, on every attach path: the host's
/// (syscall tracepoints, against bpftrace; libbpf-tools' ext4slower cannot
/// attach here), then the VM guests' (fentry, kprobe and tracepoint,
/// against libbpf-tools).
pub fn run() -> anyhow::Result<Row> {
    let rtrace = crate::build()?;
    let workload = crate::root().join("target/release/fileops");
    let fs = Ext4::new()?;
    println!();
    match Command::new("/usr/sbin/ext4slower")
        .arg("-d")
        .arg("1")
        .output()
    {
        Ok(out) if !out.status.success() => println!(
            "libbpf-tools ext4slower cannot run on this kernel: {}",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("")
                .trim()
        ),
        Ok(_) => println!("libbpf-tools ext4slower runs here, but is measured in the guests"),
        Err(e) => println!("libbpf-tools ext4slower is missing: {e}"),
    }
    let setups = vec![
        Setup::bare(),
        Setup::traced(
            "bpftrace pread64 timing",
            "bpftrace",
            &["-e", BPFTRACE_SLOWER],
            Ready::Stdout("Tracing"),
            None,
        ),
        Setup::traced(
            "rtrace ext4slower (tracepoint)",
            &rtrace,
            &["ext4slower"],
            Ready::Stderr("Tracing"),
            None,
        ),
        Setup::traced(
            "rtrace ext4slower -m 0 (every read sent)",
            &rtrace,
            &["ext4slower", "-m", "0", "--json"],
            Ready::Stderr("Tracing"),
            None,
        ),
    ];
    eprintln!(
        "bench ext4slower: {E4_READS} cached 4 KiB preads on ext4 ({}), median of {TRIALS} \
         interleaved trials",
        fs.dir.display()
    );
    let dir = fs.dir.to_string_lossy().into_owned();
    let results = trials(&setups, "ns/read", || {
        let ns =
            timed(Command::new(&workload).args([dir.as_str(), "reads", &E4_READS.to_string()]))?;
        Ok((ns / E4_READS as f64, E4_READS))
    })?;
    let (ratio, bpf_ratio) = print_costs(&setups, &results, "ns/read");
    println!();
    println!(
        "host (tracepoint path): rtrace adds {ratio:.2}x what bpftrace adds per cached read \
         (BPF time {bpf_ratio:.2}x), while also checking each file's file system"
    );
    guests()?;
    Ok(Row::new(
        "ext4slower",
        format!("{E4_READS} cached 4 KiB preads (syscall tracepoint path)"),
        "ns/read",
        (&setups, &results),
        (2, 1),
        None,
    ))
}

/// The guest part of the ext4slower benchmark: the `/init` body times the
/// workload bare and under each tracer, three rounds, and prints one
/// `{MARK} bench LABEL NS` line per run.
fn guests() -> anyhow::Result<()> {
    let mark = "=== rtrace-vm:";
    let body = format!(
        r#"N={E4_GUEST_READS}
dd if=/dev/zero of=/tmp/e4.img bs=1M count=32 2>/dev/null
dev=$(losetup -f)
losetup $dev /tmp/e4.img
# busybox sh runs its own applets before PATH: name the real mke2fs.
MKE2FS_CONFIG=/nonexistent /usr/sbin/mke2fs -q -F -t ext4 -E lazy_itable_init=1,lazy_journal_init=1,nodiscard $dev
mkdir -p /mnt/e4 && mount -t ext4 -o noinit_itable $dev /mnt/e4
# The kernel times every BPF program run; a tracer's programs show their
# totals in its descriptors' fdinfo.
echo 1 > /proc/sys/kernel/bpf_stats_enabled
bpf_ns() {{
    awk '/^run_time_ns:/ {{ s += $2 }} END {{ print s + 0 }}' /proc/$1/fdinfo/* 2>/dev/null
}}
one() {{
    label=$1; shift
    pid=
    before=0
    if [ $# -gt 0 ]; then
        "$@" >/tmp/out 2>/tmp/err & pid=$!
        # libbpf-tools buffers its header: give up waiting after 20 s.
        i=0
        while [ $i -lt 200 ] && ! grep -q Tracing /tmp/err /tmp/out 2>/dev/null; do
            sleep 0.1; i=$((i+1))
        done
        sleep 1
        before=$(bpf_ns $pid)
    fi
    ns=$(echo go | /t/fileops /mnt/e4 reads $N | sed -n 's/^done //p')
    bpf=0
    if [ -n "$pid" ]; then
        bpf=$(( $(bpf_ns $pid) - before ))
        kill -INT $pid; wait $pid
    fi
    echo "{mark} bench $label $ns $bpf"
}}
for round in 1 2 3 4 5; do
    one bare
    one libbpf-tools /usr/sbin/ext4slower
    one fentry /t/rtrace ext4slower --attach fentry
    one kprobe /t/rtrace ext4slower --attach kprobe
    one tracepoint /t/rtrace ext4slower --attach tracepoint
done"#
    );
    let runs = crate::vm::boot_all(
        &crate::vm::Built::build()?,
        &body,
        &["/usr/sbin/ext4slower"],
        &[],
        // The whole benchmark in each guest; a guest past this is hung.
        std::time::Duration::from_secs(2100),
    )?;
    const LABELS: [&str; 5] = ["bare", "libbpf-tools", "fentry", "kprobe", "tracepoint"];
    for run in runs {
        // Per label: wall ns per read, BPF ns per read.
        let mut ns: Vec<(Vec<f64>, Vec<f64>)> = vec![(Vec::new(), Vec::new()); LABELS.len()];
        for line in run.log.lines() {
            let Some(rest) = line.split_once(mark).map(|(_, r)| r.trim()) else {
                continue;
            };
            let f: Vec<&str> = rest.split_whitespace().collect();
            let [_, label, wall, bpf] = f[..] else {
                continue;
            };
            if f[0] != "bench" {
                continue;
            }
            let (Ok(wall), Ok(bpf)) = (wall.parse::<f64>(), bpf.parse::<f64>()) else {
                continue;
            };
            if let Some(i) = LABELS.iter().position(|l| *l == label) {
                ns[i].0.push(wall / E4_GUEST_READS as f64);
                ns[i].1.push(bpf / E4_GUEST_READS as f64);
            }
        }
        println!();
        println!(
            "guest {} ({E4_GUEST_READS} cached preads, median of 5 rounds):",
            run.package
        );
        if ns.iter().any(|(w, _)| w.is_empty()) {
            println!(
                "  incomplete run (timed out: {}); console in target/vm/{}.log",
                run.timed_out, run.package
            );
            continue;
        }
        let med: Vec<(f64, f64)> = ns
            .into_iter()
            .map(|(w, b)| (median(w), median(b)))
            .collect();
        println!(
            "  {:<32} {:>10} {:>10} {:>12} {:>12}",
            "configuration", "ns/read", "added", "bpf ns/read", "bpf vs peer"
        );
        for (i, label) in LABELS.iter().enumerate() {
            let name = match *label {
                "bare" => "bare".to_owned(),
                "libbpf-tools" => "libbpf-tools ext4slower".to_owned(),
                m => format!("rtrace ext4slower ({m})"),
            };
            let added = med[i].0 - med[0].0;
            let ratio = if i == 0 {
                "-".to_owned()
            } else {
                format!("{:.2}", med[i].1 / med[1].1)
            };
            println!(
                "  {name:<32} {:>10.0} {added:>10.0} {:>12.0} {ratio:>12}",
                med[i].0, med[i].1
            );
        }
        println!(
            "  (an emulated guest's wall time swings by tens of percent between runs; the \
             kernel's own BPF run time is the figure to judge by)"
        );
    }
    Ok(())
}

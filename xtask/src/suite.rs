//! The integration suite as `cargo xtask test` runs it: every test in a
//! process of its own, timed, on the host and in the VM guests; the times
//! in `target/test-times.tsv`, the slowest and the phases printed, and the
//! suite's length held to its budget.
//!
//! libtest on stable prints no test's time, and cargo stops at the first
//! test executable that fails. Running each test alone (`--exact NAME`)
//! gives both: its wall time, measured here, and a run that goes on past a
//! failure and reports every one at the end.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    fs,
    io::Read as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use std::os::unix::process::CommandExt as _;

use anyhow::{Context as _, bail};

use crate::root;

/// How a test ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// It passed.
    Passed,
    /// It failed, or its process died or hung.
    Failed,
    /// It passed over its whole check and said why (a line starting with
    /// `skipped:` on its output).
    Skipped,
}

impl Verdict {
    fn word(self) -> &'static str {
        match self {
            Verdict::Passed => "passed",
            Verdict::Failed => "failed",
            Verdict::Skipped => "skipped",
        }
    }

    /// A test's verdict from its process's exit and output: a test that
    /// passed but printed a line beginning `skipped:` checked nothing.
    pub fn of(success: bool, output: &str) -> Verdict {
        if !success {
            Verdict::Failed
        } else if output.lines().any(|l| {
            // With --nocapture the test's first line follows libtest's
            // `test NAME ... ` on its line.
            let said = l.split_once(" ... ").map_or(l, |(_, rest)| rest);
            said.trim_start().starts_with("skipped:")
        }) {
            Verdict::Skipped
        } else {
            Verdict::Passed
        }
    }
}

/// One test's run.
#[derive(Clone, Debug)]
pub struct Record {
    /// `suite::name`, the suite being the test file's name.
    pub test: String,
    /// Where it ran: `host`, or the guest's kernel (`6.1`, `6.12`).
    pub place: String,
    /// Its wall time.
    pub secs: f64,
    /// How it ended.
    pub verdict: Verdict,
}

/// A test of the integration crate: its executable and its name.
#[derive(Clone, Debug)]
pub struct Case {
    /// The test executable.
    pub exe: PathBuf,
    /// The test's name within it.
    pub name: String,
}

impl Case {
    /// `suite::name`.
    pub fn id(&self) -> String {
        format!("{}::{}", suite_of(&self.exe), self.name)
    }
}

/// Short name of a test executable (`…/runqlat-0123abcd` → `runqlat`).
pub fn suite_of(exe: &Path) -> String {
    let file = exe.file_name().unwrap_or_default().to_string_lossy();
    file.rsplit_once('-').map_or(&*file, |(s, _)| s).to_owned()
}

/// The longest a test may take before the budget check names it: a guest
/// emulates its CPUs, and runs twice as long.
pub fn limit(place: &str) -> f64 {
    if place == "host" { 60.0 } else { 120.0 }
}

/// A test over half again its [`limit`] fails the run, unless it is here:
/// at most ten, each with why and the time it was measured at. A test
/// merely over its limit is only named, since a loaded machine must not
/// fail the suite.
pub const ALLOWED: &[(&str, &str, &str)] = &[];

/// The host tests that run the static binary: `cargo xtask test` runs
/// them last, once the background has built it.
pub const OF_THE_STATIC_BINARY: &[&str] =
    &["doctor::the_static_build_runs_doctor_and_agrees_with_the_dynamic_one"];

/// The tests the VM guests run, as `suite::name`, each with the
/// kernel-facing path it is there for. The guests are there for what
/// differs between kernels: attach mechanisms and their fallback chains
/// (kprobes, fentry, tracepoints of each kind, uprobes), each variant of a
/// program the verifier sees (the CFI walk, without `bpf_find_vma`,
/// deeper stacks), offsets read from the kernel's BTF, tracefs and its
/// formats, the transports, capabilities. What is the same on every kernel
/// (user space's pace, a workload's statistics, output formats and
/// layouts, the command line, peers the guests lack) the host checks
/// alone: every other test runs on the host only. A new test of a
/// kernel-facing path belongs here.
pub const GUESTS: &[(&str, &str)] = &[
    (
        "argdist::uprobe_counts_of_two_values_are_exact",
        "argdist uprobe entry path (user string reads) loads/attaches on each kernel",
    ),
    (
        "argdist::return_values_entry_arguments_and_filters",
        "uretprobe path with $entry map (ENTRIES) on each kernel",
    ),
    (
        "argdist::struct_member_of_a_uprobe_argument",
        "struct timespec layout read from the kernel's BTF",
    ),
    (
        "argdist::usdt_probe_arguments_and_semaphore",
        "USDT uprobes with ref_ctr_offset semaphores (kernel uprobe PMU feature)",
    ),
    (
        "argdist::tracepoint_write_sizes_are_exact",
        "classic syscall tracepoint: tracefs mount and format file on each kernel",
    ),
    (
        "argdist::kprobe_and_kretprobe_on_vfs_write",
        "kprobe/kretprobe with BTF struct path (file->f_path.dentry...); mechanism_works(kprobe)",
    ),
    (
        "bcc_commands::argdist",
        "argdist is the tool whose documented lines need kprobes; the guests run those lines",
    ),
    (
        "biolatency::histogram_total_matches_diskstats",
        "default chain (raw_tracepoint + atomics variant) with BTF request offsets",
    ),
    (
        "biolatency::attach_tracepoint_total_matches_diskstats",
        "classic tracepoint fallback (tracefs, record offsets by device/sector)",
    ),
    (
        "biolatency::queued_time_counts_every_request_once",
        "-Q: block_rq_insert hook and the plain (non-atomics) variant",
    ),
    (
        "biolatency::per_flag_histograms_split_reads_from_writes",
        "forced tp_btf (only tp_btf test) with cmd_flags decoded via kernel BTF enums, plus tracepoint rwbs",
    ),
    (
        "biolatency::per_disk_histogram_is_named_after_the_disk",
        "-D reads the disk via BTF offsets (q->disk vs rq->rq_disk differ by kernel)",
    ),
    (
        "command::biolatency_counts_exactly_the_commands_requests",
        "only test of biolatency's by-submitter path: extra block_bio_queue hook, _q form chosen from kernel BTF, kernel-dependent submitter/issuer",
    ),
    (
        "doctor::doctor_reports_every_mechanism",
        "probes every attach mechanism on the running kernel",
    ),
    (
        "doctor::the_static_build_runs_doctor_and_agrees_with_the_dynamic_one",
        "static build must probe kprobe/fentry etc. like the dynamic one; only the guests have those mechanisms",
    ),
    (
        "execsnoop::every_exec_is_reported_once_with_args_pid_ppid_and_ret",
        "default tp_btf sched_process_exec path, argv via BTF offsets (mm, linux_binprm), ring buffer",
    ),
    (
        "execsnoop::perf_buffer_transport_reports_every_exec",
        "perf buffer transport (ring buffer vs perf buffer)",
    ),
    (
        "execsnoop::failed_exec_shows_only_with_x",
        "-x forces the classic tracepoint fallback (syscall tracepoints, tracefs)",
    ),
    (
        "execsnoop::execveat_through_a_descriptor_is_reported",
        "execveat detection via linux_binprm fdpath from kernel BTF",
    ),
    (
        "execsnoop::a_script_shows_as_it_was_run_not_as_its_interpreter",
        "script detection via linux_binprm interp/filename BTF offsets",
    ),
    (
        "execsnoop::pinned_cgroup_and_mount_namespace_maps_keep_only_their_members",
        "pinned bpffs maps reused and mount-ns id read via BTF offsets (nsproxy->mnt_ns->ns.inum)",
    ),
    (
        "exporter::scrapes_count_what_the_workload_did",
        "collector (tally-only) loads of execsnoop+runqlat and kernel bpf_stats run-time counters",
    ),
    (
        "exporter::runs_with_only_cap_bpf_and_cap_perfmon",
        "capabilities: CAP_BPF+CAP_PERFMON loads, Debian perf_event_paranoid=3",
    ),
    (
        "ext4slower::every_operation_is_reported_with_exact_bytes_on_every_path",
        "fentry/kprobe/tracepoint each, with task storage and hash; mechanism_works()",
    ),
    (
        "ext4slower::fsslower_on_xfs_and_btrfs_reports_every_operation",
        "module functions: fentry refused, chain falls back to kprobe; xfs/btrfs only in guests",
    ),
    (
        "filters::off_cpu_and_on_cpu_time_split_as_measured",
        "--off-cpu adds sched_switch programs beside perf_event; also statistics (kept for the path)",
    ),
    (
        "list::a_glob_lists_the_kernels_tracepoints",
        "the kernel's tracepoint set and tracefs mounting by rtrace",
    ),
    (
        "list::verbose_gives_a_tracepoints_fields_as_its_format_file",
        "tracepoint format files differ by kernel",
    ),
    (
        "list::kernel_functions_are_listed_or_the_refusal_is_named",
        "available_filter_functions exists only where kprobes/ftrace are (guests list, host refuses)",
    ),
    (
        "memleak::blocks_held_by_a_process_are_reported_by_the_stack_that_kept_them",
        "libc uprobes/uretprobes with the CFI walk variant on each verifier",
    ),
    (
        "memleak::the_kernels_pipes_are_held_by_the_stack_that_made_them",
        "kernel mode: kmem tracepoints (formats changed across 6.x) and kernel allocation stacks",
    ),
    (
        "offcputime::blocked_time_splits_as_measured_through_libc_wrappers",
        "default tp_btf sched_switch + CFI walk variant through libc; also checks statistics (kept in guests for the path)",
    ),
    (
        "offcputime::state_filter_selects_interruptible_sleeps",
        "--state reads the task state via BTF offset (task_struct.__state)",
    ),
    (
        "offcputime::thread_filters_keep_to_their_threads",
        "-k loads the plain (non-CFI) variant and PF_KTHREAD check via BTF; -t",
    ),
    (
        "offcputime::waker_names_the_waking_threads_stack",
        "--waker adds the sched_waking program; also checks statistics (kept for the path)",
    ),
    (
        "profile::the_native_walk_alone_then_every_runtimes_walk_on_demand",
        "the sampling program's walk variants: the native walk alone, and the walk through every runtime's frames under each verifier's limit",
    ),
    (
        "profile_events::block_rq_insert_stacks_count_every_request_of_the_writer",
        "profile -e classic tracepoint program (tracefs) and stat tracepoint counting; kernel block-layer frames differ by kernel",
    ),
    (
        "profile_events::uprobe_stacks_count_every_call_or_every_nth",
        "profile -e u: uprobe program, walk from uprobe registers",
    ),
    (
        "profile_events::stackcount_counts_kernel_functions_by_glob_and_regex",
        "kprobes on kernel functions; mechanism_works(kprobe)",
    ),
    (
        "runqlat::attach_raw_tracepoint_counts_every_context_switch",
        "raw_tracepoint fallback",
    ),
    (
        "runqlat::attach_tracepoint_counts_every_context_switch",
        "classic tracepoint fallback (tracefs mount, formats)",
    ),
    (
        "runqlat::tp_btf_counts_agree_with_task_storage_and_with_the_hash_map",
        "tp_btf with task storage and with the hash variant",
    ),
    (
        "runqlat::per_pidns_keys_by_namespace_inode",
        "pid namespace inode read via BTF offsets",
    ),
    (
        "stat::a_processs_counts_are_the_fixtures_and_perf_stats",
        "stat's programs: raw_syscalls counting by number, tracepoint glob from tracefs, software counters (perf compare host-only)",
    ),
    (
        "stat::threads_and_processes_are_counted_apart",
        "stat's uprobe counting path (u:) with per-thread keys",
    ),
    (
        "stat::kernel_functions_are_counted_with_kprobes",
        "kprobe/kretprobe counting; mechanism_works(kprobe)",
    ),
    (
        "strace::the_summary_counts_each_call",
        "-c summary counted in the kernel (no event transport), --summary-by-process",
    ),
    (
        "strace::descriptors_with_their_paths",
        "strace event program (raw_syscalls, in-kernel string reads) loads/attaches; guest-aware",
    ),
    (
        "strace::dash_f_follows_the_children_of_dash_p",
        "sched_process_fork raw tracepoint following children (task fields via BTF)",
    ),
    (
        "strace::stack_traces_are_straces",
        "-k loads strace's CFI walk variant on each verifier",
    ),
    (
        "symbols::kernel_frames_resolve_to_kallsyms_names",
        "-K loads the plain variant; kernel stacks named from this kernel's kallsyms (ksys_read/vfs_read)",
    ),
    (
        "tcplife::ipv4_sessions_have_exact_bytes_and_owners_on_both_ends",
        "default tp_btf inet_sock_set_state, tcp_sock byte counters via BTF offsets",
    ),
    (
        "tcplife::ipv6_sessions_have_exact_bytes_and_owners_on_both_ends",
        "tp_btf IPv6 address reads via BTF offsets",
    ),
    (
        "tcplife::attach_raw_tracepoint_reports_both_ends",
        "raw_tracepoint fallback",
    ),
    (
        "tcplife::attach_tracepoint_reports_both_ends",
        "classic tracepoint fallback (tracefs, record format)",
    ),
    (
        "tcplife::perf_buffer_transport_reports_both_ends",
        "perf buffer transport",
    ),
    (
        "top::once_prints_one_snapshot_and_exits",
        "cheap load/attach of top's profile object on each kernel",
    ),
    (
        "trace::uprobe_and_return_lines_carry_the_values",
        "trace object's uprobe/uretprobe path",
    ),
    (
        "trace::tracepoint_prints_the_files_a_command_opens",
        "classic syscall tracepoint string field (tracefs format)",
    ),
    (
        "trace::kprobe_and_kretprobe_lines",
        "kprobe/kretprobe with @user strings; mechanism_works(kprobe)",
    ),
    (
        "trace::bcc_documented_lines_are_accepted",
        "kprobes on many kernel functions with BTF struct members (inode->i_mapping, cfs_rq, sk, $task->fs) and renamed symbols",
    ),
    (
        "trace::user_stacks_by_the_cfi_walk",
        "-U loads trace's CFI walk variant on each verifier",
    ),
    (
        "unwind::c_without_frame_pointers_keeps_its_whole_chain",
        "perf_event + CFI walk (bpf_loop/find_vma, Python walk in object) on each verifier; also statistics",
    ),
    (
        "unwind::the_walk_without_the_kernels_own_lookup_still_unwinds",
        "RTRACE_NO_FIND_VMA: walk variant without bpf_find_vma, a different program for the verifier",
    ),
    (
        "unwind::stacks_deeper_than_the_walk_keep_their_leaf_and_are_counted",
        "--max-stack 300: MAX_STACK_DEPTH rodata changes the walk the verifier sees; linked stack entries",
    ),
    (
        "firefox::firefox_and_jsonl_samples_match_the_report",
        "the per-sample stream: profile's SAMPLES ring buffer, switched on by a load-time constant",
    ),
    (
        "firefox::offcputime_waits_add_up_to_its_own_totals",
        "each off-CPU wait on its own: the switch program's INTERVALS ring buffer on each verifier",
    ),
    (
        "firefox::switch_program_verifier_instructions_with_and_without_the_stream",
        "the switch program's verifier instruction count with and without the stream, on 6.1's limit",
    ),
];

/// The tests of `cases` that the guests run: those in [`GUESTS`].
pub fn guest_cases(cases: &[Case]) -> Vec<Case> {
    cases
        .iter()
        .filter(|c| {
            let id = c.id();
            GUESTS.iter().any(|(t, _)| *t == id)
        })
        .cloned()
        .collect()
}

/// Test executables of the integration crate, built by cargo as
/// [`crate::build_for_tests`] builds them (the same command, so that after
/// it this builds nothing).
pub fn executables() -> anyhow::Result<Vec<PathBuf>> {
    let out = crate::stdout_of(crate::cargo_for_tests().arg("--message-format=json"))?;
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
    exes.sort_by_key(|e| suite_of(e));
    Ok(exes)
}

/// Every test of the integration crate whose `suite::name` contains
/// `filter` (all when it is empty), in file order.
pub fn cases(filter: &str) -> anyhow::Result<Vec<Case>> {
    let mut cases = Vec::new();
    for exe in executables()? {
        let list = crate::stdout_of(Command::new(&exe).args(["--list", "--format", "terse"]))?;
        for name in list.lines().filter_map(|l| l.strip_suffix(": test")) {
            let case = Case {
                exe: exe.clone(),
                name: name.to_owned(),
            };
            if case.id().contains(filter) {
                cases.push(case);
            }
        }
    }
    Ok(cases)
}

/// How long a host test may run before it counts as hung and is killed.
const HUNG: Duration = Duration::from_secs(600);

/// Runs one test on the host in a process of its own: its record, and
/// its output (stdout and stderr interleaved as it wrote them).
pub fn run_host(case: &Case, env: &[(&str, PathBuf)]) -> anyhow::Result<(Record, String)> {
    let log = root().join("target/test-output.log");
    let file = fs::File::create(&log).with_context(|| format!("cannot write {}", log.display()))?;
    let start = Instant::now();
    let mut child = Command::new(&case.exe)
        .args(["--exact", &case.name, "--test-threads=1", "--nocapture"])
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        // A group of its own, so that a hung test is killed with what it
        // started (a tracer left running would trace the tests after it).
        .process_group(0)
        .spawn()
        .with_context(|| format!("cannot start {}", case.exe.display()))?;
    let mut hung = false;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        if start.elapsed() > HUNG {
            // SAFETY: kill(2) of the test's own process group.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let _ = child.wait();
            hung = true;
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let secs = start.elapsed().as_secs_f64();
    // A test's output need not be UTF-8 (a tracer's raw bytes).
    let mut bytes = Vec::new();
    fs::File::open(&log)?.read_to_end(&mut bytes)?;
    let mut output = String::from_utf8_lossy(&bytes).into_owned();
    if hung {
        let _ = writeln!(output, "xtask: the test ran over {HUNG:?} and was killed");
    }
    let verdict = Verdict::of(status.is_some_and(|s| s.success()), &output);
    Ok((
        Record {
            test: case.id(),
            place: "host".into(),
            secs,
            verdict,
        },
        output,
    ))
}

/// Runs `cases` on the host one after another, printing a line a test
/// (numbered after `before` of `total`) and the output of each that fails.
pub fn run_all_host(
    cases: &[Case],
    before: usize,
    total: usize,
    env: &[(&str, PathBuf)],
) -> anyhow::Result<Vec<Record>> {
    let mut records = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let (record, output) = run_host(case, env)?;
        eprintln!(
            "xtask: test [{}/{total}] host {} ... {} ({:.1} s)",
            before + i + 1,
            record.test,
            record.verdict.word(),
            record.secs
        );
        if record.verdict == Verdict::Failed {
            eprintln!(
                "---- output of {} ----\n{}---- end of {} ----",
                record.test, output, record.test
            );
        }
        records.push(record);
    }
    Ok(records)
}

/// The phases of a run and how long each took.
#[derive(Default)]
pub struct Phases(pub Vec<(String, f64)>);

impl Phases {
    /// Adds a phase's time.
    pub fn add(&mut self, name: &str, secs: f64) {
        self.0.push((name.to_owned(), secs));
    }
}

/// Writes `target/test-times.tsv`, prints the slowest tests, the phases,
/// the tests over their limits and the closing count; fails when a test
/// failed, or one took more than half again over its limit.
pub fn report(
    records: &[Record],
    phases: &Phases,
    total: f64,
    other_failures: &[String],
) -> anyhow::Result<()> {
    let over = budget(records);
    let failed = records.iter().any(|r| r.verdict == Verdict::Failed)
        || !other_failures.is_empty()
        || !over.failing.is_empty();
    let mut tsv = String::from("test\twhere\tsecs\tresult\n");
    for r in records {
        let _ = writeln!(
            tsv,
            "{}\t{}\t{:.1}\t{}",
            r.test,
            r.place,
            r.secs,
            r.verdict.word()
        );
    }
    let _ = writeln!(
        tsv,
        "TOTAL\tall\t{total:.0}\t{}",
        if failed { "failed" } else { "passed" }
    );
    let path = root().join("target/test-times.tsv");
    fs::write(&path, tsv).with_context(|| format!("cannot write {}", path.display()))?;

    let mut slowest: Vec<&Record> = records.iter().collect();
    slowest.sort_by(|a, b| b.secs.total_cmp(&a.secs));
    println!("\nThe 15 slowest tests (all in {}):", path.display());
    for r in slowest.iter().take(15) {
        println!(
            "  {:>7.1} s  {:<5} {} ({})",
            r.secs,
            r.place,
            r.test,
            r.verdict.word()
        );
    }
    let mut per_place: BTreeMap<&str, (usize, f64)> = BTreeMap::new();
    for r in records {
        let e = per_place.entry(&r.place).or_default();
        e.0 += 1;
        e.1 += r.secs;
    }
    let places: Vec<String> = per_place
        .iter()
        .map(|(p, (n, s))| format!("{p}: {n} tests, {s:.0} s"))
        .collect();
    println!("Tests run: {}", places.join("; "));
    let phase_line: Vec<String> = phases
        .0
        .iter()
        .map(|(n, s)| format!("{n} {s:.0} s"))
        .collect();
    println!(
        "Phases: {}; total {total:.0} s ({:.1} min)",
        phase_line.join(", "),
        total / 60.0
    );

    over.print();
    for f in other_failures {
        println!("FAILED: {f}");
    }
    for r in records.iter().filter(|r| r.verdict == Verdict::Failed) {
        println!("FAILED: {} ({})", r.test, r.place);
    }
    let count = |v| records.iter().filter(|r| r.verdict == v).count();
    println!(
        "{} passed, {} failed, {} skipped",
        count(Verdict::Passed),
        count(Verdict::Failed) + other_failures.len(),
        count(Verdict::Skipped)
    );
    over.check()?;
    if failed {
        bail!("the test run failed");
    }
    Ok(())
}

/// What [`budget`] found.
#[derive(Debug, Default)]
pub struct Over {
    /// Every test over its limit, with its time.
    pub named: Vec<String>,
    /// Those over half again their limit and not allowed.
    pub failing: Vec<String>,
}

impl Over {
    /// Names every test over its limit.
    fn print(&self) {
        for o in &self.named {
            println!("over its limit: {o}");
        }
    }

    /// Fails when a test took more than half again its limit.
    fn check(&self) -> anyhow::Result<()> {
        if !self.failing.is_empty() {
            bail!(
                "over half again their limits (60 s on the host, 120 s in a guest), and not \
                 in suite::ALLOWED: {}",
                self.failing.join(", ")
            );
        }
        Ok(())
    }
}

/// The tests over their limits, and those that fail the run.
pub fn budget(records: &[Record]) -> Over {
    let mut over = Over::default();
    for r in records {
        let limit = limit(&r.place);
        if r.secs <= limit {
            continue;
        }
        let line = format!(
            "{} ({}) took {:.0} s, its limit {limit:.0} s",
            r.test, r.place, r.secs
        );
        let allowed = ALLOWED.iter().any(|(t, _, _)| *t == r.test);
        if r.secs > 1.5 * limit && !allowed {
            over.failing.push(line.clone());
        }
        over.named.push(line);
    }
    over
}

/// `cargo xtask test --repeat N FILTER`: the chosen tests, N times each on
/// the host, with each run's time and the counts of passes and failures.
pub fn repeat(times: u32, filter: &str, env: &[(&str, PathBuf)]) -> anyhow::Result<()> {
    let cases = cases(filter)?;
    if cases.is_empty() {
        bail!("no test matches {filter:?}");
    }
    let mut failures = 0;
    let mut records = Vec::new();
    for case in &cases {
        let mut secs = Vec::new();
        let mut counts = BTreeMap::new();
        for i in 0..times {
            let (record, output) = run_host(case, env)?;
            eprintln!(
                "xtask: repeat {}/{times} {} ... {} ({:.1} s)",
                i + 1,
                record.test,
                record.verdict.word(),
                record.secs
            );
            if record.verdict == Verdict::Failed {
                eprintln!("---- output ----\n{output}---- end ----");
            }
            *counts.entry(record.verdict.word()).or_insert(0) += 1;
            secs.push(format!("{:.1}", record.secs));
            records.push(record);
        }
        let failed = counts.get("failed").copied().unwrap_or(0);
        failures += failed;
        println!(
            "{}: {} passed, {failed} failed, {} skipped of {times}; times (s): {}",
            case.id(),
            counts.get("passed").copied().unwrap_or(0),
            counts.get("skipped").copied().unwrap_or(0),
            secs.join(" ")
        );
    }
    let over = budget(&records);
    over.print();
    if failures > 0 {
        bail!("{failures} of the repeated runs failed");
    }
    over.check()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(test: &str, place: &str, secs: f64) -> Record {
        Record {
            test: test.into(),
            place: place.into(),
            secs,
            verdict: Verdict::Passed,
        }
    }

    #[test]
    fn budget_names_every_test_over_its_limit_and_fails_those_half_again_over() {
        let records = [
            record("a::fast", "host", 59.0),
            record("a::slow", "host", 61.0),
            record("a::hung", "host", 91.0),
            record("a::guest", "6.1", 170.0),
            record("a::guest_hung", "6.12", 181.0),
        ];
        let over = budget(&records);
        assert_eq!(over.named.len(), 4, "{over:?}");
        assert_eq!(over.failing.len(), 2, "{over:?}");
        assert!(over.failing[0].starts_with("a::hung (host)"));
        assert!(over.failing[1].starts_with("a::guest_hung (6.12)"));
    }

    #[test]
    fn the_allow_list_is_short_and_says_why() {
        assert!(ALLOWED.len() <= 10);
        for (test, why, measured) in ALLOWED {
            assert!(test.contains("::") && !why.is_empty() && measured.ends_with(" s"));
        }
    }

    #[test]
    fn a_test_that_says_it_skipped_counts_as_skipped() {
        assert_eq!(
            Verdict::of(true, "running\nskipped: no perf here\n"),
            Verdict::Skipped
        );
        assert_eq!(Verdict::of(true, "skipped loading: x\n"), Verdict::Passed);
        assert_eq!(Verdict::of(false, "skipped: x\n"), Verdict::Failed);
        assert_eq!(Verdict::of(true, "test x ... ok\n"), Verdict::Passed);
        assert_eq!(
            Verdict::of(true, "test x ... skipped: the guests have no perf\nok\n"),
            Verdict::Skipped
        );
    }

    /// The tests of the integration crate, read from its sources: a
    /// suite's file, and the files of its directory (`exporter/otlp.rs`,
    /// whose tests are `exporter::otlp::NAME`).
    fn declared_tests() -> Vec<String> {
        let dir = root().join("tests/tests");
        let mut out = Vec::new();
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let suite = path.file_stem().unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                for inner in fs::read_dir(&path).unwrap() {
                    let inner = inner.unwrap().path();
                    let module = inner.file_stem().unwrap().to_string_lossy().into_owned();
                    let text = fs::read_to_string(&inner).unwrap();
                    tests_in(&text, &format!("{suite}::{module}"), &mut out);
                }
            } else {
                tests_in(&fs::read_to_string(&path).unwrap(), &suite, &mut out);
            }
        }
        out
    }

    /// The `#[test]` functions of source `text`, as `PREFIX::NAME`.
    fn tests_in(text: &str, prefix: &str, out: &mut Vec<String>) {
        let mut lines = text.lines();
        while let Some(line) = lines.next() {
            if line.trim() != "#[test]" {
                continue;
            }
            // Past doc comments and attributes to the function.
            for next in lines.by_ref() {
                if let Some(rest) = next.trim().strip_prefix("fn ") {
                    let name = rest.split('(').next().unwrap();
                    out.push(format!("{prefix}::{name}"));
                    break;
                }
            }
        }
    }

    #[test]
    fn every_guest_test_exists_once_and_says_why() {
        let declared = declared_tests();
        assert!(declared.len() > 100, "{declared:?}");
        for (i, (test, why)) in GUESTS.iter().enumerate() {
            assert!(declared.contains(&test.to_string()), "no test {test}");
            assert!(!why.is_empty(), "{test}: why in the guests?");
            assert!(
                !GUESTS[..i].iter().any(|(t, _)| t == test),
                "{test} is listed twice"
            );
        }
    }

    #[test]
    fn suites_are_named_by_their_file() {
        assert_eq!(suite_of(Path::new("/t/deps/runqlat-0123abcd")), "runqlat");
        assert_eq!(suite_of(Path::new("profile_events-99")), "profile_events");
    }
}

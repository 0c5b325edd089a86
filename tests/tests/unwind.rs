//! How `rtrace profile` walks user stacks, against fixture programs built
//! with and without frame pointers (`tests/fixtures/`, built by this
//! crate's build script): by frame pointer and from CFI (`.eh_frame`,
//! `.debug_frame`, broken tables), through libraries loaded with `dlopen`
//! and ld.so's lazy binding, in forked children, new processes, programs
//! of a few milliseconds and process storms, with the CFI tables' cache
//! and budget, and stacks deeper than the walk.

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader},
    process::{Command, Stdio},
};

use rtrace_integration_tests::{
    MemoryCgroup, Rtrace, SIGINT, UniqueProgram, parse_folded,
    profile::{
        READY, count_under, count_with, hot_reaching_main, profile_execkids, profile_fixture,
        profile_hotfuncs, run_fixture, start_fixture, temp, too_slow_here,
    },
    rtrace_bin, run, workload_bin,
};

#[test]
fn hot_functions_in_proportion_with_their_callers() {
    let (stdout, alpha_ns, beta_ns) = profile_hotfuncs(&["-f"]);
    assert!(
        parse_folded(&stdout).keys().all(|f| f[0] == "hotfuncs"),
        "stacks of other commands:\n{stdout}"
    );
    // A sample in a function's first instructions, before it has set up its
    // frame, skips its caller in a frame-pointer walk; that is at most a
    // few percent.
    check_chain(
        &stdout,
        HOT_LEAVES,
        HOT_CALLERS,
        (alpha_ns, beta_ns),
        0.10,
        0.9,
    );
}

/// The Rust fixture's hot leaves and their callers.
const HOT_LEAVES: [&str; 2] = ["hotfuncs::hot_alpha", "hotfuncs::hot_beta"];

const HOT_CALLERS: &[&str] = &["hotfuncs::main", "hotfuncs::work_caller"];

/// Built without frame pointers, the fixture's stacks come out whole only
/// through the CFI walk: every hot sample under `work_caller` under `main`,
/// the leaves in the fixture's own split.
#[test]
fn code_without_frame_pointers_keeps_its_whole_chain() {
    let (stdout, alpha_ns, beta_ns) = profile_fixture("hotfuncs_nofp", &["-f", "-U"]);
    check_rust_chain(&stdout, alpha_ns, beta_ns);
}

/// Checks the Rust fixture's profile without frame pointers: the leaves
/// in its own split within 5 points, and 95 % of them under
/// `main;work_caller`.
fn check_rust_chain(stdout: &str, alpha_ns: i64, beta_ns: i64) {
    check_chain(
        stdout,
        HOT_LEAVES,
        HOT_CALLERS,
        (alpha_ns, beta_ns),
        0.05,
        0.95,
    );
}

/// A Rust program built as most that abort on panic ship (`panic=abort`,
/// no `-g`): rustc writes its C `main` without CFI, so every stack of its
/// main thread passes through code no FDE covers. The table covers it
/// from the code itself. Before, the walk fell back on rbp there, a
/// general register in this code: every stack was cut short at `main`
/// and the run warned of it.
#[test]
fn a_rust_program_that_aborts_on_panic_is_walked_past_its_main() {
    let (stdout, alpha_ns, beta_ns) = profile_fixture("hotfuncs_abort", &["-f", "-U"]);
    check_rust_chain(&stdout, alpha_ns, beta_ns);
    let folded = parse_folded(&stdout);
    let leaf = |f: &Vec<String>| HOT_LEAVES.iter().any(|l| f.iter().any(|n| n.ends_with(l)));
    let all: u64 = folded.iter().filter(|(f, _)| leaf(f)).map(|(_, n)| n).sum();
    let rooted: u64 = folded
        .iter()
        .filter(|(f, _)| leaf(f) && f.get(1).is_some_and(|r| r == "_start"))
        .map(|(_, n)| n)
        .sum();
    assert!(
        rooted as f64 >= 0.95 * all as f64,
        "only {rooted} of {all} leaf samples reach _start past main:\n{stdout}"
    );
}

/// Samples whose stack holds one of the two `leaves` (frames ending so),
/// each leaf's count, and those of them with exactly `callers` (outermost
/// first) right above the leaf.
fn leaf_chain(
    folded: &BTreeMap<Vec<String>, u64>,
    leaves: [&str; 2],
    callers: &[&str],
) -> (u64, u64, u64) {
    let (mut first, mut second, mut chained) = (0, 0, 0);
    for (frames, count) in folded {
        let Some(i) = frames
            .iter()
            .position(|f| leaves.iter().any(|l| f.ends_with(l)))
        else {
            continue;
        };
        if frames[i].ends_with(leaves[0]) {
            first += count;
        } else {
            second += count;
        }
        if i >= callers.len() && frames[i - callers.len()..i] == *callers {
            chained += count;
        }
    }
    (first, second, chained)
}

/// Checks a CPU fixture's profile: at least 300 samples in its two
/// leaves, their split within `tolerance` of the CPU time the fixture
/// measured in each, and at least `whole` of them under `callers`.
fn check_chain(
    stdout: &str,
    leaves: [&str; 2],
    callers: &[&str],
    measured_ns: (i64, i64),
    tolerance: f64,
    whole: f64,
) {
    let folded = parse_folded(stdout);
    let (first, second, chained) = leaf_chain(&folded, leaves, callers);
    let all = first + second;
    assert!(all >= 300, "too few samples: {first} + {second}:\n{stdout}");
    let share = first as f64 / all as f64;
    let expected = measured_ns.0 as f64 / (measured_ns.0 + measured_ns.1) as f64;
    assert!(
        (share - expected).abs() <= tolerance,
        "{} has {share:.3} of the samples; the fixture spent {expected:.3} of its CPU time there",
        leaves[0]
    );
    assert!(
        chained as f64 >= whole * all as f64,
        "only {chained} of {all} leaf samples have {callers:?} above them:\n{stdout}"
    );
}

/// The C fixture's leaves and their callers.
const C_LEAVES: [&str; 2] = ["leaf_alpha", "leaf_beta"];

const C_CALLERS: &[&str] = &["main", "mid"];

/// Checks the C fixture's profile: the leaves in its own split within 5
/// points, and 95 % of them under `main;mid`.
fn check_c_chain(stdout: &str, alpha_ns: i64, beta_ns: i64) {
    check_chain(stdout, C_LEAVES, C_CALLERS, (alpha_ns, beta_ns), 0.05, 0.95);
}

/// C built with `-fomit-frame-pointer`: whole chains from CFI.
#[test]
fn c_without_frame_pointers_keeps_its_whole_chain() {
    let (stdout, alpha_ns, beta_ns) = profile_fixture("cfuncs_nofp", &["-f", "-U"]);
    check_c_chain(&stdout, alpha_ns, beta_ns);
}

/// A CFI walk the kernel refuses leaves `--unwind auto` with frame
/// pointers, and the run says so in a warning, not only under `-v`: a
/// stack cut short for a reason nobody was told is a wrong profile. The
/// refusal is real: the walk's tables (`--cfi-budget 2048`) do not fit a
/// memory cgroup of 512 MiB, which the frame-pointer walk does. Without
/// frame pointers the fixture's leaves then lose `main;mid`, as the
/// warning says; `--unwind cfi` makes the refusal the run's error.
#[test]
fn a_cfi_walk_the_kernel_refuses_is_warned_of() {
    let Some(cgroup) = MemoryCgroup::new("refused-cfi", 512 << 20) else {
        eprintln!("skipped: no memory cgroup to hold rtrace's maps to a limit");
        return;
    };
    let out = temp("refused.folded");
    let fixture = workload_bin("cfuncs_nofp");
    let run_in = |unwind: &str| {
        let mut child = cgroup
            .command(
                &rtrace_bin(),
                &[
                    "profile",
                    "-U",
                    "-F",
                    "999",
                    "-f",
                    "--unwind",
                    unwind,
                    "--cfi-budget",
                    "2048",
                    "-o",
                    out.to_str().unwrap(),
                    "--",
                    fixture.to_str().unwrap(),
                    "cpu",
                    "1",
                ],
            )
            // The fixture works once it reads a line.
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        child.stdin.take().unwrap().write_all(b"go\n").unwrap();
        child.wait_with_output().unwrap()
    };
    let auto = run_in("auto");
    let stderr = String::from_utf8_lossy(&auto.stderr);
    assert!(auto.status.success(), "{stderr}");
    let warned: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("refused the CFI walk"))
        .collect();
    assert_eq!(warned.len(), 1, "{stderr}");
    assert!(
        warned[0].starts_with("rtrace: warning[unwalked]: "),
        "{stderr}"
    );
    let folded = parse_folded(&std::fs::read_to_string(&out).unwrap());
    let _ = std::fs::remove_file(&out);
    let (first, second, chained) = leaf_chain(&folded, C_LEAVES, C_CALLERS);
    // A second of two leaves at 999 Hz: some 1,000 samples.
    assert!(first + second >= 300, "{folded:?}");
    assert!(
        chained * 2 < first + second,
        "{chained} of {} leaf samples kept main;mid by frame pointers alone: is the \
         walk CFI's after all?\n{stderr}",
        first + second
    );

    let cfi = run_in("cfi");
    let stderr = String::from_utf8_lossy(&cfi.stderr);
    assert!(!cfi.status.success(), "{stderr}");
    assert!(stderr.contains("Cannot allocate memory"), "{stderr}");
    // Once, with the flag that sized the map the kernel refused.
    assert_eq!(
        stderr.matches("failed to create map").count(),
        1,
        "{stderr}"
    );
    assert!(stderr.contains("--cfi-budget, 2048 MiB"), "{stderr}");
    let _ = std::fs::remove_file(&out);
}

/// Children forked one after another run their parent's code without
/// exec: each is walked with a copy of its parent's tables from its first
/// sample, not by frame pointer until its own are read. Each child lives
/// 0.1 s, so a few milliseconds without tables would show.
#[test]
fn forked_children_are_unwound_with_their_parents_tables() {
    let rtrace = Rtrace::start_until(&["profile", "-F", "999", "-U", "-f"], READY);
    let fixture = start_fixture("cfuncs_nofp", &["cpu", "4", "forks", "27"]);
    let done = run_fixture(fixture);
    let (code, stdout, stderr) = rtrace.stop(SIGINT);
    assert_eq!(code, 0, "{stderr}");
    check_chain(&stdout, C_LEAVES, C_CALLERS, (done[0], done[1]), 0.05, 0.98);
}

/// A process whose first thread has ended (`pthread_exit` in `main`) and
/// whose work goes on in another: the kernel shows the ended thread's
/// mappings, files and memory, which `/proc/PID` is, empty, so they are
/// read through a live thread's (`/proc/PID/task/TID`). Before, the
/// process's samples had neither tables nor names: `cfuncs_nofp;[unknown]`.
#[test]
fn a_process_whose_first_thread_ended_keeps_its_whole_chain() {
    let rtrace = Rtrace::start_until(&["profile", "-F", "999", "-U", "-f"], READY);
    let fixture = start_fixture("cfuncs_nofp", &["orphan", "3"]);
    let done = run_fixture(fixture);
    let (code, stdout, stderr) = rtrace.stop(SIGINT);
    assert_eq!(code, 0, "{stderr}");
    check_chain(
        &stdout,
        C_LEAVES,
        &["orphan_main", "mid"],
        (done[0], done[1]),
        0.05,
        0.95,
    );
}

/// C whose own functions have their CFI only in `.debug_frame` (built
/// without unwind tables), while the C runtime's start code keeps its
/// `.eh_frame`: both sections are read.
#[test]
fn c_with_cfi_only_in_debug_frame_keeps_its_whole_chain() {
    let (stdout, alpha_ns, beta_ns) = profile_fixture("cfuncs_debugframe", &["-f", "-U"]);
    check_c_chain(&stdout, alpha_ns, beta_ns);
}

/// With frame pointers but frameless leaves, a frame-pointer walk that
/// starts in a leaf skips the leaf's caller (`main;leaf_alpha`); the CFI
/// walk keeps it. `--unwind fp` shows the defect on the same binary.
#[test]
fn frameless_leaves_keep_their_caller() {
    let (stdout, alpha_ns, beta_ns) = profile_fixture("cfuncs", &["-f", "-U"]);
    check_c_chain(&stdout, alpha_ns, beta_ns);

    let (stdout, _, _) = profile_fixture("cfuncs", &["-f", "-U", "--unwind", "fp"]);
    let (alpha, beta, chained) = leaf_chain(&parse_folded(&stdout), C_LEAVES, C_CALLERS);
    assert!(alpha + beta >= 300, "too few samples:\n{stdout}");
    assert!(
        (chained as f64) < 0.5 * (alpha + beta) as f64,
        "the frame-pointer walk kept mid above {chained} of {} leaf samples; \
         the fixture's leaves should have no frame:\n{stdout}",
        alpha + beta
    );
}

/// A binary whose `.eh_frame` is garbage: the run ends normally, says which
/// file's CFI could not be read, and its stacks are walked by frame
/// pointer and counted, never silently.
#[test]
fn a_binary_with_broken_cfi_is_walked_by_frame_pointer_and_counted() {
    let broken = temp("cfuncs_broken");
    let mut data = std::fs::read(workload_bin("cfuncs_nofp")).unwrap();
    let (offset, size) = elf_section(&data, ".eh_frame").expect("no .eh_frame");
    // CIE and FDE lengths of 0xffffffff announce 64-bit entries that run
    // past the section: the parser must fail, not guess.
    data[offset..offset + size].fill(0xff);
    std::fs::write(&broken, &data).unwrap();
    std::fs::set_permissions(&broken, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut child = Command::new(&broken)
        .args(["cpu", "2"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    let pid = child.id().to_string();
    let rtrace = Rtrace::start_until(
        &["profile", "-F", "199", "-U", "-f", "-v", "-p", &pid],
        READY,
    );
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), b"go\n").unwrap();
    assert!(child.wait().unwrap().success());
    let (code, stdout, stderr) = rtrace.stop(SIGINT);
    let _ = std::fs::remove_file(&broken);
    assert_eq!(code, 0, "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    // The broken file is a warning: its frames may be wrong.
    assert!(
        stderr.contains(
            "rtrace: warning[unwalked]: 1 file(s) with unreadable CFI were walked by frame pointer"
        ) && stderr.contains("cfuncs_broken"),
        "no word of the broken CFI:\n{stderr}"
    );
    assert!(
        stderr.contains("walked by frame pointer, where no CFI covers the code")
            || stderr.contains("cut short"),
        "the frame-pointer walk is not counted:\n{stderr}"
    );
    let total: u64 = parse_folded(&stdout).values().sum();
    assert!(total >= 100, "too few samples ({total}):\n{stdout}");
}

/// The file range of ELF section `name` (64-bit little-endian files).
fn elf_section(data: &[u8], name: &str) -> Option<(usize, usize)> {
    let u16_at = |o: usize| u16::from_le_bytes(data[o..o + 2].try_into().unwrap()) as usize;
    let u32_at = |o: usize| u32::from_le_bytes(data[o..o + 4].try_into().unwrap()) as usize;
    let u64_at = |o: usize| u64::from_le_bytes(data[o..o + 8].try_into().unwrap()) as usize;
    let (shoff, shentsize, shnum, shstrndx) =
        (u64_at(0x28), u16_at(0x3a), u16_at(0x3c), u16_at(0x3e));
    let header = |i: usize| shoff + i * shentsize;
    let strtab = u64_at(header(shstrndx) + 0x18);
    (0..shnum).find_map(|i| {
        let h = header(i);
        let at = strtab + u32_at(h);
        let end = at + data[at..].iter().position(|&b| b == 0)?;
        (&data[at..end] == name.as_bytes()).then(|| (u64_at(h + 0x18), u64_at(h + 0x20)))
    })
}

/// Profiles `dlhost_nofp` loading `lib` (a fixture library) after
/// profiling began, for 3 s with `extra` arguments, at 199 Hz, user stacks
/// folded; rtrace's stdout and stderr.
fn profile_dlhost(lib: &str, extra: &[&str]) -> (String, String) {
    let lib = workload_bin(lib);
    let mut args = vec![lib.to_str().unwrap(), "3"];
    args.extend_from_slice(extra);
    let fixture = start_fixture("dlhost_nofp", &args);
    let pid = fixture.pid().to_string();
    let rtrace = Rtrace::start_until(&["profile", "-F", "199", "-U", "-p", &pid, "-f"], READY);
    run_fixture(fixture);
    let (code, stdout, stderr) = rtrace.stop(SIGINT);
    assert_eq!(code, 0, "{stderr}");
    (stdout, stderr)
}

/// A library without frame pointers, loaded with `dlopen` after profiling
/// began, gets its table when its first stacks show up: its frames come
/// out under the caller in the executable.
#[test]
fn library_loaded_after_the_start_is_unwound() {
    let (stdout, _) = profile_dlhost("libdlspin_nofp.so", &[]);
    let folded = parse_folded(&stdout);
    let inner = count_with(&folded, "dl_inner");
    let whole = count_under(&folded, "dl_inner", "dlhost::main");
    assert!(
        inner >= 300,
        "too few samples in the library ({inner}):\n{stdout}"
    );
    // The samples before the library's table is loaded (a quarter second
    // at most after its first) go by frame pointer.
    assert!(
        whole as f64 >= 0.85 * inner as f64,
        "{whole} of {inner} library samples reach main:\n{stdout}"
    );
}

/// A library loaded lazily binds its symbols at their first calls, in
/// ld.so's `_dl_runtime_resolve_*`, which keeps its frame in rbx while it
/// aligns rsp for `xsave`; the fixture's IFUNC resolver, run from there,
/// spins. Every stack the walk brings to the resolver (`pick_target`)
/// goes on through ld.so (`_dl_fixup`, the trampoline; nameless where
/// ld.so is stripped, as in the guests) to the host's `main`.
/// Before rbx was followed, every one stopped at the trampoline: a
/// build's short-lived programs (`as`, the `gcc` driver), which spend
/// much of their lives binding symbols, lost a twentieth of their roots.
#[test]
fn a_lazily_bound_symbols_resolver_is_walked_through_ld_so() {
    let (stdout, stderr) = profile_dlhost("libifuncspin_nofp.so", &["lazy"]);
    let folded = parse_folded(&stdout);
    let through = count_under(&folded, "ifunc_burn", "pick_target");
    let whole = count_under(&folded, "ifunc_burn", "dlhost::main");
    // 3 s at 199 Hz is 597 samples; a starved guest gets fewer, and the
    // library's first ones, before its table, go by frame pointer.
    assert!(
        through >= 100,
        "too few samples under the resolver ({through}):\n{stdout}"
    );
    assert!(
        whole as f64 >= 0.95 * through as f64,
        "{whole} of {through} samples in the resolver reach main:\n{stdout}\n{stderr}"
    );
}

/// A process started after a system-wide profile began gets its tables
/// from its first stacks on.
#[test]
fn process_started_after_the_start_is_unwound() {
    check_new_process(&[]);
}

/// Profiles the whole machine with `env` while a fixture starts and
/// works; checks that its hot samples reach main.
fn check_new_process(env: &[(&str, &str)]) {
    let rtrace = Rtrace::start_with_env(&["profile", "-F", "199", "-U", "-f"], READY, env);
    let fixture = start_fixture("hotfuncs_nofp", &["cpu", "3"]);
    run_fixture(fixture);
    let (code, stdout, stderr) = rtrace.stop(SIGINT);
    assert_eq!(code, 0, "{stderr}");
    let (hot, whole) = hot_reaching_main(&stdout);
    assert!(hot >= 300, "too few hot samples ({hot}):\n{stdout}");
    // Its first stacks, before its table is built (a fraction of a second;
    // more in an emulated guest), go by frame pointer.
    assert!(
        whole as f64 >= 0.8 * hot as f64,
        "{whole} of {hot} hot samples reach main:\n{stdout}"
    );
}

/// A kernel without `bpf_find_vma` (one that carries `bpf_loop` alone):
/// the walk loads without it and unwinds from the tables user space
/// gives each process, a running fixture's and a new one's. Run
/// everywhere with the lookup turned off, as such kernels run it.
#[test]
fn the_walk_without_the_kernels_own_lookup_still_unwinds() {
    let env = [("RTRACE_NO_FIND_VMA", "1")];
    let fixture = start_fixture("cfuncs_nofp", &["cpu", "3"]);
    let pid = fixture.pid().to_string();
    let rtrace = Rtrace::start_with_env(
        &["profile", "-v", "-F", "999", "-p", &pid, "-f", "-U"],
        READY,
        &env,
    );
    let done = run_fixture(fixture);
    let (code, stdout, stderr) = rtrace.stop(SIGINT);
    assert_eq!(code, 0, "{stderr}");
    if !stderr.contains("user stacks walked in the kernel from CFI") {
        eprintln!("skipped: no CFI walk on this kernel");
        return;
    }
    assert!(
        stderr.contains("mappings are not looked up in the kernel"),
        "{stderr}"
    );
    assert!(!stderr.contains("regions the kernel found"), "{stderr}");
    check_c_chain(&stdout, done[0], done[1]);

    check_new_process(&env);
}

/// The samples of the `execkids` fixture (`comm`: parent and children)
/// that have user frames: how many, how many reach their root (`_start`,
/// the program's, or the loader's while it maps the libraries), how many
/// were taken in the children's work (under `main`, by the frames of the
/// work that any walk keeps), how many of those carry the whole chain
/// from `main` to `kid_burn`, and how many have three frames or fewer.
/// Samples in the loader, in fork or in exit are whole without the chain:
/// the 95 % named under the chain is asked of the work's.
fn kid_chains(folded: &BTreeMap<Vec<String>, u64>, comm: &str) -> [u64; 5] {
    const CHAIN: [&str; 4] = ["main", "kid_outer", "kid_inner", "kid_burn"];
    const WORK: [&str; 7] = [
        "kid_outer",
        "kid_inner",
        "kid_burn",
        "kid_sort",
        "kid_cmp",
        "msort_with_tmp",
        "__GI___qsort_r",
    ];
    let [mut all, mut rooted, mut work, mut chained, mut short] = [0; 5];
    let mut depths: BTreeMap<usize, u64> = BTreeMap::new();
    for (frames, count) in folded.iter().filter(|(f, _)| f[0] == comm && f.len() > 1) {
        all += count;
        *depths.entry(frames.len() - 1).or_default() += count;
        if frames[1] == "_start" {
            rooted += count;
        }
        if frames.len() <= 4 {
            short += count;
        }
        if frames.iter().any(|f| WORK.contains(&f.as_str())) {
            work += count;
            if frames.windows(4).any(|w| w == CHAIN) {
                chained += count;
            }
        }
    }
    eprintln!(
        "children's samples: {all}, reaching the root: {rooted}, in their work: {work}, of \
         those under the whole chain: {chained}, of three frames or fewer: {short}; by depth \
         {depths:?}"
    );
    [all, rooted, work, chained, short]
}

/// Checks that the children's samples reached their root, few have
/// three frames or fewer, and at least `named` of those in their work
/// are named under the whole chain.
fn check_kids(folded: &str, stderr: &str, named: f64) {
    let [all, rooted, work, chained, short] = kid_chains(&parse_folded(folded), "execkids_nofp");
    assert!(
        all >= 300 && work * 10 >= all * 8,
        "too few samples of the children ({all}), or in their work ({work}):\n{stderr}"
    );
    // Before the walk found mappings itself, a tenth of the samples had
    // a frame or two (by frame pointer), and fewer reached the root.
    assert!(
        rooted as f64 >= 0.95 * all as f64 && short as f64 <= 0.05 * all as f64,
        "{rooted} of {all} samples of the children reach their root, {short} have three \
         frames or fewer:\n{folded}\n{stderr}"
    );
    // Before a new program's maps were read at its first sample, however
    // recently its parent's had been: from under a tenth to a half, run
    // to run.
    assert!(
        chained as f64 >= named * work as f64,
        "only {chained} of the {work} samples in the children's work are named under their \
         chain:\n{folded}\n{stderr}"
    );
}

/// Programs that live a few tens of milliseconds, run anew two at a time
/// as a build runs its compilers, are partly gone before user space has
/// read their maps: the walk finds their mappings itself and walks them
/// from the rows of their files, which the first of them brought, instead
/// of by frame pointer (a frame or two of garbage without them), and
/// their frames are named from their maps read at their first sample.
/// The bar, 95 % named under the whole chain, holds system-wide
/// too: an exec and a walk's news of code in no mapping wake user space
/// at once (on its 10 ms timer, a child was often gone before its maps
/// were read), and samples taken in exit after the memory map is gone
/// have no user stack rather than a frame of garbage. Of the samples in
/// the children's work, 0.95 to 0.97 were under the chain on the host
/// with two CPU hogs beside it, when the loader's samples still counted
/// against it; 0.98 to 0.99 since.
#[test]
fn short_lived_programs_are_walked_to_their_root() {
    if too_slow_here("children of 20 to 50 ms") {
        return;
    }
    let (folded, stderr) = profile_execkids(&[], &["80"]);
    check_kids(&folded, &stderr, 0.95);
    let (folded, stderr) = profile_execkids(&["--all-cpus"], &["80"]);
    check_kids(&folded, &stderr, 0.95);
}

/// Short-lived programs whose stacks cross two libraries and back (libm's
/// exp under libc's qsort, under the program's own chain) need three
/// mappings from their first sample on, as a compiler's `as` does
/// (libbfd, libc), while the kernel can look up one a sample: the dynamic
/// loader's hook has user space read their regions once the libraries
/// are mapped, before main. Without it (`RTRACE_NO_LOADER_HOOK`), 10 to
/// 11 % of the samples lost the chain on the host.
#[test]
fn short_lived_programs_through_libraries_are_walked_whole() {
    if too_slow_here("children of 20 to 50 ms") {
        return;
    }
    for scope in [&[][..], &["--all-cpus"][..]] {
        let (folded, stderr) = profile_execkids(scope, &["80", "20", "50", "libs"]);
        let through: u64 = parse_folded(&folded)
            .iter()
            .filter(|(f, _)| f[0] == "execkids_nofp" && f.iter().any(|x| x == "kid_cmp"))
            .map(|(_, c)| c)
            .sum();
        assert!(
            through >= 150,
            "{scope:?}: too few samples through the comparator ({through}):\n{stderr}"
        );
        check_kids(&folded, &stderr, 0.95);
    }
}

/// On a host where short-lived processes come and go, as on a build or CI
/// host, every process brings new stacks; the tables are moved out of the
/// kernel as the profile runs, so 20 s of them at 999 Hz lose next to
/// none. It tests user space's pace (each process's maps read, the tables
/// moved out every second), which the emulated guests cannot keep: there
/// a minute of the storm ran some ten minutes and its tables filled; the
/// guests move tables out as they fill in
/// `profile::stacks_beyond_the_stack_table_are_counted_not_lost`. The tables are
/// moved out every second, so the run reaches its steady state in its
/// first seconds: 20 s are 20 such rounds and some 20,000 to 40,000
/// samples, where a 1 % loss is 200 or more, far beyond chance (it was a
/// minute, which showed nothing more).
#[test]
fn stacks_of_a_process_storm_are_not_lost() {
    if too_slow_here("20 s of a process storm at 999 Hz") {
        return;
    }
    let mut storm = Command::new("sh")
        .args(["-c", "while :; do sh -c true; done"])
        .spawn()
        .unwrap();
    let (code, stdout, stderr) = run(&["profile", "-F", "999", "-f", "20"]);
    // SAFETY: signalling our own child.
    unsafe { libc::kill(storm.id() as i32, libc::SIGKILL) };
    let _ = storm.wait();
    assert_eq!(code, 0, "{stderr}");
    let folded = parse_folded(&stdout);
    let total: u64 = folded.values().sum();
    let missed =
        count_with(&folded, "[Missed User Stack]") + count_with(&folded, "[Missed Kernel Stack]");
    let shells: u64 = folded
        .iter()
        .filter(|(f, _)| f[0] == "sh")
        .map(|(_, c)| c)
        .sum();
    assert!(shells > 0, "no samples of the storm's shells:\n{stderr}");
    assert!(total >= 10_000, "too few samples ({total}): {stderr}");
    assert!(
        (missed as f64) < 0.01 * total as f64,
        "{missed} of {total} samples lack their stack: {stderr}"
    );
    assert!(!stderr.contains("stacks lost"), "{stderr}");
}

/// Compiled CFI tables are kept between runs: a second profile of the
/// same program reads them from the cache instead of compiling them, and
/// its stacks are as whole as the first's.
#[test]
fn cfi_tables_are_compiled_once_then_read_from_the_cache() {
    let dir = std::env::temp_dir().join(format!("rtrace-test-cfi-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let dir_s = dir.to_str().unwrap();
    let mut tables = Vec::new();
    for _ in 0..2 {
        let fixture = start_fixture("hotfuncs_nofp", &["cpu", "2"]);
        let pid = fixture.pid().to_string();
        let rtrace = Rtrace::start_with_env(
            &["profile", "-v", "-U", "-F", "499", "-p", &pid, "-f"],
            READY,
            &[("RTRACE_CACHE_DIR", dir_s)],
        );
        run_fixture(fixture);
        let (code, stdout, stderr) = rtrace.stop(SIGINT);
        assert_eq!(code, 0, "{stderr}");
        if !stderr.contains("user stacks walked in the kernel from CFI") {
            // The kernels without bpf_loop walk by frame pointer: no tables.
            eprintln!("skipped: no CFI walk on this kernel");
            let _ = std::fs::remove_dir_all(&dir);
            return;
        }
        let (hot, whole) = hot_reaching_main(&stdout);
        assert!(hot >= 100, "too few hot samples ({hot}):\n{stdout}");
        assert!(
            whole as f64 >= 0.95 * hot as f64,
            "{whole} of {hot} hot samples reach main:\n{stdout}"
        );
        // "N read from the cache in DIR, M compiled and written"
        let line = stderr
            .lines()
            .find(|l| l.contains("CFI tables:"))
            .unwrap_or_else(|| panic!("no CFI tables line: {stderr}"))
            .to_owned();
        let (_, cache) = line.split_once("; ").unwrap();
        let numbers: Vec<u64> = cache
            .split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect();
        assert!(cache.contains(dir_s), "{line}");
        tables.push((numbers[0], numbers[1], line));
    }
    let _ = std::fs::remove_dir_all(&dir);
    let ((read1, written1, l1), (read2, written2, l2)) = (&tables[0], &tables[1]);
    // The fixture, libc and the loader at least; the vDSO is never cached.
    assert!(*read1 == 0 && *written1 >= 3, "{l1}");
    assert!(*read2 == *written1 && *written2 == 0, "{l1}\n{l2}");
}

/// The numbers of profile's `-v` line on its CFI tables: files, rows,
/// KiB, budget KiB, files evicted, rows evicted.
fn cfi_tables_line(stderr: &str) -> Vec<u64> {
    let line = stderr
        .lines()
        .find_map(|l| l.split_once("CFI tables: "))
        .unwrap_or_else(|| panic!("no CFI tables line:\n{stderr}"))
        .1;
    let (tables, _cache) = line.split_once("; ").unwrap();
    tables
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect()
}

/// Three copies of python3 (each a file of its own, 70,000 rows of CFI)
/// run one after the other under a budget that holds one copy and its
/// libraries but not two: each copy's tables go in by evicting the one
/// before, whose process has exited, and each copy's samples are walked
/// to `Py_BytesMain` through them.
#[test]
fn files_of_exited_processes_are_evicted_to_make_room() {
    let python = "/usr/bin/python3";
    if !std::path::Path::new(python).exists() {
        // The VM guests carry no Python; the host runs this test.
        eprintln!("skipped: no {python} here (the host runs this test)");
        return;
    }
    let copies: Vec<UniqueProgram> = ["a", "b", "c"]
        .iter()
        .map(|t| UniqueProgram::copy_of(python, "pyev", t))
        .collect();
    // Each spins 0.8 s of its own CPU time and says how much it had.
    let spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.8: pass\n\
                print(time.process_time())";
    let script: Vec<String> = copies
        .iter()
        .map(|c| format!("{} -c '{spin}'", c.path()))
        .collect();
    let out = temp("evict.folded");
    let out_s = out.to_str().unwrap();
    let (code, cpu, stderr) = run(&[
        "profile",
        "-v",
        "-U",
        "-F",
        "199",
        "-f",
        "--cfi-budget",
        "1",
        "-o",
        out_s,
        "--",
        "sh",
        "-c",
        &script.join("; "),
    ]);
    assert_eq!(code, 0, "{stderr}");
    if !stderr.contains("user stacks walked in the kernel from CFI") {
        eprintln!("skipped: no CFI walk on this kernel");
        return;
    }
    let folded = parse_folded(&std::fs::read_to_string(&out).unwrap());
    let _ = std::fs::remove_file(&out);
    assert!(
        !stderr.contains("did not fit"),
        "a file did not fit:\n{stderr}"
    );
    let n = cfi_tables_line(&stderr);
    // files, rows, KiB, budget, evicted files, evicted rows
    assert!(n[4] >= 2 && n[5] >= 2 * 50_000, "{n:?}:\n{stderr}");
    assert!(n[2] <= n[3], "{n:?}");
    let cpu: Vec<f64> = cpu.lines().filter_map(|l| l.trim().parse().ok()).collect();
    assert_eq!(cpu.len(), 3, "the copies' CPU times: {cpu:?}");
    for (copy, secs) in copies.iter().zip(cpu) {
        let name = copy.name();
        let mine = |f: &&Vec<String>| f[0] == name;
        let total: u64 = folded.iter().filter(|(f, _)| mine(f)).map(|(_, n)| n).sum();
        let whole: u64 = folded
            .iter()
            .filter(|(f, _)| mine(f) && f.iter().any(|n| n == "Py_BytesMain"))
            .map(|(_, n)| n)
            .sum();
        // Half the samples its CPU time gives at 199 Hz: a timer that
        // fired late on a busy machine still gives more.
        assert!(
            total as f64 >= 0.5 * 199.0 * secs,
            "{name}: {total} samples for {secs} s of CPU:\n{stderr}"
        );
        assert!(
            whole as f64 >= 0.9 * total as f64,
            "{name}: {whole} of {total} samples reach Py_BytesMain:\n{stderr}"
        );
    }
}

/// A file larger than the budget is walked by frame pointer and named in
/// one warning with the budget that would hold it; that budget does. The
/// stacks that walk cuts short (Debian's cc1 has no frame pointers) are
/// not warned of again as code without frame pointers: the budget is the
/// cause, and its warning the cure.
#[test]
fn a_file_larger_than_the_budget_names_the_budget_that_holds_it() {
    let cc1 = Command::new("gcc")
        .arg("-print-prog-name=cc1")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .filter(|p| p.starts_with('/'));
    let Some(cc1) = cc1 else {
        // The VM guests carry no compiler; the host runs this test.
        eprintln!("skipped: no gcc here (the host runs this test)");
        return;
    };
    // Some hundreds of milliseconds of compiling: user space reads a new
    // process's maps at its exec, which `cc1 --version` may not outlive.
    let source = temp("budget.c");
    let c: String = (0..300)
        .map(|i| {
            format!("long f{i}(long x) {{ for (int k = 0; k < {i} + 9; k++) x = x * 31 + k; return x; }}\n")
        })
        .collect();
    std::fs::write(&source, c).unwrap();
    // At 999 Hz: enough of cc1's stacks cut short to be warned of, were
    // they not left to the budget's warning.
    let profile = |budget: &str| {
        let (code, _, stderr) = run(&[
            "profile",
            "-v",
            "-U",
            "-F",
            "999",
            "--cfi-budget",
            budget,
            "-o",
            "/dev/null",
            "--",
            &cc1,
            "-quiet",
            "-O2",
            source.to_str().unwrap(),
            "-o",
            "/dev/null",
        ]);
        assert_eq!(code, 0, "{stderr}");
        stderr
    };
    let stderr = profile("1");
    if !stderr.contains("user stacks walked in the kernel from CFI") {
        eprintln!("skipped: no CFI walk on this kernel");
        return;
    }
    let warning = stderr
        .lines()
        .find(|l| l.contains("did not fit in the CFI tables' budget of 1 MiB"))
        .unwrap_or_else(|| panic!("no warning of cc1's table:\n{stderr}"));
    assert!(
        warning.starts_with("rtrace: warning[unwalked]: 1 file(s) with "),
        "{warning}"
    );
    let enough = warning
        .split_once("--cfi-budget ")
        .and_then(|(_, r)| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("no budget named: {warning}"));
    let mib: u32 = enough.parse().unwrap();
    assert!(mib > 1, "{warning}");
    let cut: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("rtrace: warning") && l.contains("cut short"))
        .collect();
    assert!(
        cut.is_empty(),
        "cc1's stacks walked by frame pointer for the budget were warned of as cut short: {cut:?}"
    );
    let stderr = profile(enough);
    let _ = std::fs::remove_file(&source);
    assert!(
        !stderr.contains("did not fit"),
        "--cfi-budget {mib}:\n{stderr}"
    );
    // cc1 alone has some 600,000 rows.
    let n = cfi_tables_line(&stderr);
    assert!(n[1] >= 300_000 && n[4] == 0, "{n:?}:\n{stderr}");
}

/// A stack deeper than the walk's 127 frames keeps its leaf-most 127, and
/// every such sample is counted in one warning; `--max-stack` keeps the
/// whole of it, stored in several linked entries and joined. The
/// fixture's tower recurses 200 deep (no frame pointers: the CFI walk),
/// profiled by both at once.
#[test]
fn stacks_deeper_than_the_walk_keep_their_leaf_and_are_counted() {
    const DEPTH: usize = 200;
    let fixture = start_fixture("cfuncs_nofp", &["tower", "2", &DEPTH.to_string()]);
    let pid = fixture.pid().to_string();
    let base = ["profile", "-F", "199", "-p", &pid, "-f", "-U"];
    let cut = Rtrace::start_until(&base, READY);
    let deep_args: Vec<&str> = base.iter().copied().chain(["--max-stack", "300"]).collect();
    let deep = Rtrace::start_until(&deep_args, READY);
    let tower_ns = run_fixture(fixture)[0];
    // Half the samples the tower's CPU time gives at 199 Hz: nearly all
    // of it is in the leaf.
    let floor = 0.5 * 199.0 * tower_ns as f64 / 1e9;
    let warned = |stderr: &str| -> u64 {
        stderr
            .lines()
            .find_map(|l| {
                l.strip_prefix("rtrace: warning[lost]: ")?
                    .strip_suffix(
                        " user stacks deeper than --max-stack frames (127 unless raised), kept \
                         to their leaf-most ones",
                    )?
                    .parse()
                    .ok()
            })
            .unwrap_or(0)
    };
    // The samples in the tower's leaf, each stack checked by `check`
    // (without the command, leaf last).
    let in_leaf = |folded: &BTreeMap<Vec<String>, u64>, check: &dyn Fn(&[String])| -> u64 {
        let mut n = 0;
        for (frames, count) in folded {
            // `step`, inlined into leaf_gamma, is a frame of the
            // symbolizer's, not of the walk.
            let frames = match frames.split_last() {
                Some((last, rest)) if last == "step" => rest,
                _ => &frames[..],
            };
            if frames.last().is_some_and(|f| f == "leaf_gamma") {
                check(&frames[1..]);
                n += count;
            }
        }
        n
    };

    let (code, stdout, stderr) = cut.stop(SIGINT);
    assert_eq!(code, 0, "{stderr}");
    let folded = parse_folded(&stdout);
    let all: u64 = folded.values().sum();
    let leaf = in_leaf(&folded, &|frames| {
        // The 127 frames nearest the leaf.
        assert_eq!(frames.len(), 127, "{frames:?}");
        assert!(
            frames[..frames.len() - 1].iter().all(|f| f == "tower"),
            "{frames:?}"
        );
    });
    let counted = warned(&stderr);
    assert!(
        leaf as f64 >= floor && leaf >= 20,
        "too few samples in the tower's leaf ({leaf}, {tower_ns} ns in the tower):\n{stdout}"
    );
    // Every sample in the leaf is 200 deep; those on the way up and down
    // may be too.
    assert!(
        leaf <= counted && counted <= all,
        "{counted} stacks counted as deeper than 127 frames; {leaf} in the leaf, {all} \
         in all:\n{stderr}"
    );

    let (code, stdout, stderr) = deep.stop(SIGINT);
    assert_eq!(code, 0, "{stderr}");
    let folded = parse_folded(&stdout);
    let leaf = in_leaf(&folded, &|frames| {
        // The whole stack: from the program's entry through main and
        // the tower's levels to the leaf.
        let towers = frames.iter().filter(|f| *f == "tower").count();
        assert_eq!(towers, DEPTH, "{frames:?}");
        assert_eq!(frames[0], "_start", "{frames:?}");
        assert!(frames.iter().any(|f| f == "main"), "{frames:?}");
    });
    assert!(
        leaf as f64 >= floor && leaf >= 20,
        "too few whole stacks in the tower's leaf ({leaf}, {tower_ns} ns in the tower):\n{stdout}"
    );
    // Nothing of the fixture is deeper than 300 frames.
    assert_eq!(warned(&stderr), 0, "{stderr}");
}

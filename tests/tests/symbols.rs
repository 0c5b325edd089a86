//! How `rtrace profile` names the frames it walked: kernel frames from
//! kallsyms, JIT code from perf maps (also once the process deleted its
//! map and exited), a root process's libc profiled by an unprivileged
//! rtrace, programs gone before their maps are read, source lines and
//! inlined functions (`--lines`), and OCaml's native code as perf names
//! it.

use std::{
    collections::{BTreeMap, HashSet},
    io::{BufRead, BufReader, Read as _},
    process::{Command, Stdio},
    time::Duration,
};

use rtrace_integration_tests::{
    Paranoid, Rtrace, SIGINT, SIGTERM, as_nobody, json_lines, parse_folded,
    profile::{
        READY, count_under, count_with, hot_reaching_main, marked_lines, perf_script_folded,
        profile_execkids, run_fixture, start_fixture, svg_frames, temp, too_slow_here,
    },
    run, unprivileged_copy, verbose_count, warnings, workload_bin,
};

/// As `nobody` with only CAP_BPF and CAP_PERFMON, rtrace can neither open
/// a root process's files through `/proc/PID/map_files` (CAP_SYS_ADMIN)
/// nor through its root (CAP_SYS_PTRACE); it opens them at their paths,
/// where the file there is the one mapped (device and inode), as libc and
/// the fixture are: a system-wide profile walks and names a root
/// process's frames in libc as root's would. Before, every such frame was
/// `[unknown]`, with a warning that libc could not be opened.
#[test]
fn an_unprivileged_profile_names_root_processes_frames_in_libc() {
    use std::os::unix::fs::PermissionsExt as _;
    if too_slow_here("a 2 s fixture registered by an rtrace without a table cache") {
        return;
    }
    let (dir, bin) = unprivileged_copy();
    // For nobody's output.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    // Debian's kernels (the guests') default to level 3, where perf
    // events are CAP_SYS_ADMIN's alone; 2 lets CAP_PERFMON sample.
    let _level = Paranoid::set("2");
    let fixture = start_fixture("hotfuncs_nofp", &["cpu", "2"]);
    let out = dir.join("nobody.folded");
    let mut rtrace = as_nobody(&bin, ",+bpf,+perfmon")
        .args(["profile", "-F", "199", "-U", "-f", "-o"])
        .arg(&out)
        .arg("5")
        .current_dir(&dir)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(rtrace.stderr.take().unwrap());
    let mut text = String::new();
    while !text.contains(READY) {
        let mut line = String::new();
        if stderr.read_line(&mut line).unwrap() == 0 {
            panic!("rtrace as nobody ended before sampling:\n{text}");
        }
        text.push_str(&line);
    }
    run_fixture(fixture);
    stderr.read_to_string(&mut text).unwrap();
    assert!(rtrace.wait().unwrap().success(), "{text}");
    let folded = std::fs::read_to_string(&out).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let (hot, whole) = hot_reaching_main(&folded);
    let in_libc = count_under(
        &parse_folded(&folded),
        "hotfuncs::main",
        "__libc_start_call_main",
    );
    assert!(hot >= 200, "too few hot samples ({hot}):\n{text}");
    // Its first stacks, before its table is built, go by frame pointer.
    assert!(
        whole as f64 >= 0.8 * hot as f64 && in_libc as f64 >= 0.8 * hot as f64,
        "of {hot} hot samples, {whole} reach main and {in_libc} libc's start:\n{folded}\n{text}"
    );
    assert!(!text.contains("libc.so.6 are [unknown]"), "{text}");
}

/// The `jit` fixture, running its JIT code with its perf map written;
/// killed, and its map removed, when dropped.
struct LiveJit(std::process::Child);

impl LiveJit {
    /// Starts it and waits for its code to run. It runs far longer than
    /// profile's start-up and 2 s of sampling can take in a loaded emulated
    /// guest: a fixture that ends while profile still starts leaves too
    /// few samples to judge.
    fn start() -> Self {
        let mut jit = Command::new(workload_bin("jit"))
            .arg("120")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(jit.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        Self(jit)
    }
}

impl Drop for LiveJit {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        let _ = std::fs::remove_file(format!("/tmp/perf-{}.map", self.0.id()));
    }
}

/// As `nobody` with only CAP_BPF and CAP_PERFMON, as the exporter's unit
/// runs, a root process's JIT frames are named from its perf map: the
/// process's root, through which a container's map is read, is
/// CAP_SYS_PTRACE's to open, and a process in rtrace's own pid namespace
/// has its map in rtrace's /tmp, where perf looks. Before, none of its JIT
/// frames was named.
#[test]
fn an_unprivileged_profile_names_root_processes_jit_frames() {
    let (dir, bin) = unprivileged_copy();
    let _level = Paranoid::set("2");
    let jit = LiveJit::start();
    let out = as_nobody(&bin, ",+bpf,+perfmon")
        .args(["profile", "-F", "199", "-f", "2"])
        .current_dir(&dir)
        .output()
        .unwrap();
    drop(jit);
    let _ = std::fs::remove_dir_all(&dir);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stderr}");
    let folded = parse_folded(&stdout);
    let (mut all, mut named) = (0, 0);
    for (frames, count) in folded.iter().filter(|(f, _)| f[0] == "jit") {
        all += count;
        if frames.iter().any(|n| n == "rtrace_jit_fixture_hot") {
            named += count;
        }
    }
    // 2 s at 199 Hz of a process that spends nearly all of it in its JIT
    // code.
    assert!(
        all >= 200,
        "too few samples of the fixture ({all}):\n{stderr}"
    );
    assert!(
        named as f64 >= 0.9 * all as f64,
        "{named} of {all} samples of the fixture name its JIT code:\n{stdout}\n{stderr}"
    );
}

/// Programs that live 2 to 5 ms are mostly gone before user space reads
/// their maps (a third of their samples had frames without a name): the
/// kernel tells user space of each mapping it finds for the walk, and
/// their frames are named from those. What a child ran between its fork
/// and its exec is named by its parent's program. A few frames in exec
/// and exit stay unnamed.
#[test]
fn programs_gone_before_their_maps_are_read_are_named() {
    if too_slow_here("children of 2 to 5 ms") {
        return;
    }
    let (folded, stderr) = profile_execkids(&[], &["300", "2", "5"]);
    let (mut all, mut unnamed) = (0, 0);
    for (frames, count) in parse_folded(&folded) {
        if frames[0] != "execkids_nofp" {
            continue;
        }
        all += count;
        // libc's static __libc_start_call_main, between __libc_start_main
        // and main, has a name only in libc's separate debug file, which
        // a machine may not have: that frame is no fault of the naming.
        let unnamed_here = frames.iter().enumerate().any(|(i, f)| {
            f == "[unknown]"
                && !(frames
                    .get(i.wrapping_sub(1))
                    .is_some_and(|p| p == "__libc_start_main")
                    && frames.get(i + 1).is_some_and(|n| n == "main"))
        });
        if unnamed_here {
            unnamed += count;
        }
    }
    assert!(
        all >= 150,
        "too few samples of the children ({all}):\n{stderr}"
    );
    assert!(
        unnamed as f64 <= 0.05 * all as f64,
        "{unnamed} of {all} samples of the children have unnamed frames:\n{folded}\n{stderr}"
    );
}

#[test]
fn jit_symbol_resolves_in_a_live_process() {
    let jit = LiveJit::start();
    let pid = jit.0.id().to_string();
    let (code, stdout, stderr) = run(&["profile", "-F", "199", "-p", &pid, "-f", "-a", "-v", "2"]);
    drop(jit);
    assert_eq!(code, 0, "{stderr}");
    let folded = parse_folded(&stdout);
    let hits = count_with(&folded, "rtrace_jit_fixture_hot_[j]");
    assert!(
        hits >= 100,
        "JIT frame missing or rare ({hits}):\n{stdout}\n{stderr}"
    );
    // The JIT code has no CFI: its frame is left by the frame pointer, and
    // the CFI walk takes over again in the Rust code above it, to `main`.
    let whole = folded
        .iter()
        .filter(|(f, _)| {
            f.last().is_some_and(|n| n == "rtrace_jit_fixture_hot_[j]")
                && f.iter().any(|n| n == "main")
        })
        .map(|(_, c)| c)
        .sum::<u64>();
    assert!(
        whole as f64 >= 0.95 * hits as f64,
        "{whole} of {hits} JIT samples reach main:\n{stdout}"
    );
    // With CFI unwinding, those frame-pointer steps are counted and told
    // under -v, as the expected fallback they are, and are no warning.
    if stderr.contains("user stacks walked in the kernel from CFI") {
        assert!(
            !warnings(&stderr)
                .iter()
                .any(|(_, w)| w.contains("frame pointer")),
            "an expected fallback warned:\n{stderr}"
        );
        let fp = verbose_count(
            &stderr,
            "profile",
            "user frames walked by frame pointer, where no CFI covers the code (JIT, assembly)",
        )
        .unwrap_or_else(|| panic!("frame-pointer fallback not reported:\n{stderr}"));
        assert!(
            fp >= hits,
            "{fp} frame-pointer frames for {hits} JIT samples:\n{stderr}"
        );
    }
}

#[test]
fn jit_symbol_resolves_after_the_process_deletes_its_map_and_exits() {
    let rtrace = Rtrace::start_until(&["profile", "-F", "199", "-f"], READY);
    let out = Command::new(workload_bin("jit"))
        .args(["1.5", "--delete"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let pid: u32 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .strip_prefix("ready ")
        .unwrap()
        .parse()
        .unwrap();
    assert!(!std::path::Path::new(&format!("/tmp/perf-{pid}.map")).exists());
    std::thread::sleep(Duration::from_millis(300));
    // SIGTERM, as `timeout` and systemd send, still gets the report.
    let (code, stdout, stderr) = rtrace.stop(SIGTERM);
    assert_eq!(code, 0, "{stderr}");
    let folded = parse_folded(&stdout);
    let hits: u64 = folded
        .iter()
        .filter(|(f, _)| f[0] == "jit" && f.iter().any(|n| n == "rtrace_jit_fixture_hot"))
        .map(|(_, c)| c)
        .sum();
    // 1.5 s at 199 Hz, nearly all of it in the JIT code.
    assert!(hits >= 150, "JIT frame missing or rare ({hits}):\n{stdout}");
}

#[test]
fn kernel_frames_resolve_to_kallsyms_names() {
    let kallsyms: HashSet<String> = std::fs::read_to_string("/proc/kallsyms")
        .unwrap()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2).map(str::to_owned))
        .collect();
    let rtrace = Rtrace::start_until(&["profile", "-F", "199", "-K", "--json"], READY);
    // Reading /dev/zero spends its time in the kernel's read path.
    let status = Command::new("dd")
        .args(["if=/dev/zero", "of=/dev/null", "bs=64k", "count=60000"])
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    let (code, stdout, stderr) = rtrace.stop(SIGINT);
    assert_eq!(code, 0, "{stderr}");
    let mut frames = 0;
    let mut read_path = 0;
    for s in json_lines(&stdout).iter().filter(|s| s["comm"] == "dd") {
        assert!(
            s["user"].as_array().unwrap().is_empty(),
            "-K kept user frames"
        );
        for f in s["kernel"].as_array().unwrap() {
            let name = f["name"].as_str().unwrap();
            assert_eq!(f["kind"], "kernel");
            assert!(kallsyms.contains(name), "{name} is not a kernel symbol");
            frames += 1;
            if name == "ksys_read" || name == "vfs_read" {
                read_path += s["count"].as_u64().unwrap();
            }
        }
    }
    assert!(frames > 0, "no kernel frames for dd:\n{stdout}");
    assert!(
        read_path > 0,
        "no sample in ksys_read or vfs_read:\n{stdout}"
    );
}

/// A frame's `NAME (FILE:LINE)` form in folded text, split.
fn frame_line(frame: &str) -> Option<(&str, &str, u32)> {
    let frame = frame.strip_suffix("_[i]").unwrap_or(frame);
    let (name, rest) = frame.split_once(" (")?;
    let (file, line) = rest.strip_suffix(')')?.rsplit_once(':')?;
    Some((name, file, line.parse().ok()?))
}

/// `--lines`: the fixture's hot loop shows its own `file:line`, in folded
/// text and in JSON, and the function inlined into it keeps a line of its
/// own, under the line of its call.
#[test]
fn lines_name_the_fixtures_own_source() {
    let step = marked_lines("/* STEP_LINE */");
    let call = marked_lines("/* GAMMA_CALL_LINE */");
    assert_eq!((step.len(), call.len()), (2, 1));
    let fixture = start_fixture("cfuncs_nofp", &["tower", "2"]);
    let pid = fixture.pid().to_string();
    let base = ["profile", "-F", "499", "-p", &pid, "-U", "--lines"];
    let svg = temp("lines.svg");
    let speedscope = temp("lines.speedscope.json");
    let files = [
        "--svg",
        svg.to_str().unwrap(),
        "--speedscope",
        speedscope.to_str().unwrap(),
    ];
    let folded = Rtrace::start_until(&[&base[..], &["-f", "-a"], &files].concat(), READY);
    let json = Rtrace::start_until(&[&base[..], &["--json"]].concat(), READY);
    run_fixture(fixture);
    let (code, stdout, stderr) = folded.stop(SIGINT);
    assert_eq!(code, 0, "{stderr}");
    let stacks = parse_folded(&stdout);
    let mut in_step = 0;
    for (stack, n) in &stacks {
        let Some(i) = stack.iter().position(|f| f.starts_with("leaf_gamma (")) else {
            continue;
        };
        let (_, file, line) = frame_line(&stack[i]).unwrap_or_else(|| panic!("{stack:?}"));
        assert!(file.ends_with("cfuncs.c"), "{stack:?}");
        if let Some(leaf) = stack.get(i + 1) {
            let (name, file, at) = frame_line(leaf).unwrap_or_else(|| panic!("{stack:?}"));
            assert_eq!(name, "step", "{stack:?}");
            assert!(leaf.ends_with("_[i]"), "inlined frames are marked: {leaf}");
            assert!(file.ends_with("cfuncs.c"));
            assert!(
                step.contains(&at),
                "step at line {at}, not {step:?}: {stack:?}"
            );
            assert_eq!(
                line, call[0],
                "leaf_gamma calls step at {call:?}: {stack:?}"
            );
            in_step += n;
        }
    }
    // Nearly all of leaf_gamma's time is in the inlined step.
    let gamma: u64 = stacks
        .iter()
        .filter(|(s, _)| s.iter().any(|f| f.starts_with("leaf_gamma (")))
        .map(|(_, n)| n)
        .sum();
    // Which of the loop's five instructions (two of them step's) a timer
    // interrupt lands on shifts with the machine and its load: a third in
    // step under a loaded guest, half on a quiet host, a tenth to a fifth
    // on this host with builds beside it. A lost inline frame gives
    // none: a twentieth is the floor, some 3.5 standard deviations below
    // a tenth of 500 samples.
    assert!(
        gamma > 100 && in_step * 20 > gamma,
        "{in_step} of {gamma}: {stdout}"
    );
    // The flame graph names the frames with their lines.
    let frames = svg_frames(&std::fs::read_to_string(&svg).unwrap());
    assert!(
        frames
            .iter()
            .filter_map(|f| frame_line(f))
            .any(|(name, _, at)| name == "step" && step.contains(&at)),
        "{frames:?}"
    );
    // speedscope keeps the name and gives the file and line fields.
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&speedscope).unwrap()).unwrap();
    let steps: Vec<&serde_json::Value> = doc["shared"]["frames"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["name"] == "step")
        .collect();
    assert!(!steps.is_empty(), "{doc}");
    for f in steps {
        assert!(f["file"].as_str().unwrap().ends_with("cfuncs.c"), "{f}");
        assert!(step.contains(&(f["line"].as_u64().unwrap() as u32)), "{f}");
    }

    let (code, stdout, stderr) = json.stop(SIGINT);
    assert_eq!(code, 0, "{stderr}");
    let lines = json_lines(&stdout);
    // One object per stack, its frames leaf first.
    let leaves: Vec<&serde_json::Value> = lines
        .iter()
        .filter_map(|s| s["user"].as_array()?.first())
        .filter(|f| f["name"] == "step")
        .collect();
    assert!(!leaves.is_empty(), "{stdout}");
    for f in leaves {
        assert_eq!(f["kind"], "inlined", "{f}");
        assert!(f["file"].as_str().unwrap().ends_with("cfuncs.c"), "{f}");
        assert!(step.contains(&(f["line"].as_u64().unwrap() as u32)), "{f}");
    }
}

/// OCaml's native code (no frame pointers) named as perf names it: the
/// OCaml fixture profiled by rtrace and by `perf record --call-graph
/// dwarf` at once shows the same demangled names (`Ocamlhot.tower_84`,
/// not `camlOcamlhot__tower_84`), and as many of its samples reach `main`
/// in one as in the other, within their sampling spread; `--no-demangle`
/// keeps the linker's names.
#[test]
fn ocaml_frames_are_named_and_walked_as_perf_does() {
    if rtrace_integration_tests::in_guest() {
        eprintln!("skipped: the guests have neither OCaml nor perf; the host runs this test");
        return;
    }
    let fixture = start_fixture("ocamlhot", &["3"]);
    let pid = fixture.pid().to_string();
    let data = temp("ocaml-perf.data");
    let mut perf = Command::new("perf")
        .args(["record", "-q", "-e", "cpu-clock", "-F", "199"])
        .args(["--call-graph", "dwarf", "-p", &pid, "-o"])
        .arg(&data)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("perf (Debian package linux-perf; cargo xtask installs it)");
    let rtrace = Rtrace::start_until(&["profile", "-F", "199", "-f", "-p", &pid], READY);
    // perf has no word for having started: give it the time rtrace took
    // and more.
    std::thread::sleep(Duration::from_millis(500));
    run_fixture(fixture);
    assert!(perf.wait().unwrap().success());
    let (code, stdout, stderr) = rtrace.stop(SIGINT);
    assert_eq!(code, 0, "{stderr}");
    let (script, perf_folded) = perf_script_folded(&data);
    let _ = std::fs::remove_file(&data);
    let perf_folded = parse_folded(&String::from_utf8(perf_folded).unwrap());
    let ours = parse_folded(&stdout);
    // The fixture's own functions, by the names each tool gives them.
    let names = |folded: &BTreeMap<Vec<String>, u64>| -> HashSet<String> {
        folded
            .keys()
            .flatten()
            .filter(|f| f.starts_with("Ocamlhot.") || f.starts_with("camlOcamlhot"))
            .filter(|f| !f.contains("entry"))
            .cloned()
            .collect()
    };
    let (perf_names, our_names) = (names(&perf_folded), names(&ours));
    assert!(
        perf_names.iter().any(|n| n.starts_with("Ocamlhot.tower_"))
            && perf_names
                .iter()
                .any(|n| n.starts_with("Ocamlhot.leaf_hot_")),
        "perf's names: {perf_names:?}"
    );
    assert_eq!(our_names, perf_names, "rtrace's names against perf's");
    // The share of the fixture's samples whose stack reaches `main`.
    let reach = |folded: &BTreeMap<Vec<String>, u64>| -> (f64, f64) {
        let of_fixture = folded
            .iter()
            .filter(|(f, _)| f.iter().any(|n| n.starts_with("Ocamlhot.")));
        let (mut all, mut whole) = (0u64, 0u64);
        for (frames, n) in of_fixture {
            all += n;
            if frames.iter().any(|f| f == "main") {
                whole += n;
            }
        }
        (whole as f64 / all.max(1) as f64, all as f64)
    };
    let ((p, _), (r, rn)) = (reach(&perf_folded), reach(&ours));
    // inferno weighs perf's samples by their period: the spread needs
    // their number.
    let pn = String::from_utf8_lossy(&script)
        .lines()
        .filter(|l| l.contains(" cpu-clock:"))
        .count() as f64;
    assert!(
        pn >= 100.0 && rn >= 100.0,
        "too few samples: perf {pn}, rtrace {rn}"
    );
    eprintln!("reaching main: rtrace {r:.3} of {rn} samples, perf dwarf {p:.3} of {pn}");
    let spread = (p * (1.0 - p) / pn + r * (1.0 - r) / rn).sqrt();
    assert!(
        (p - r).abs() <= 4.0 * spread + 0.02,
        "samples reaching main: rtrace {r:.3} of {rn}, perf --call-graph dwarf {p:.3} of {pn}"
    );

    // The linker's names, when asked for.
    let fixture = start_fixture("ocamlhot", &["1"]);
    let pid = fixture.pid().to_string();
    let rtrace = Rtrace::start_until(
        &["profile", "-F", "199", "-f", "--no-demangle", "-p", &pid],
        READY,
    );
    run_fixture(fixture);
    let (code, stdout, stderr) = rtrace.stop(SIGINT);
    assert_eq!(code, 0, "{stderr}");
    let raw = names(&parse_folded(&stdout));
    assert!(
        // OCaml 4 and 5.0 join with `__`, 5.1 and later with `.`.
        raw.iter()
            .any(|n| n.starts_with("camlOcamlhot__tower_") || n.starts_with("camlOcamlhot.tower_"))
            && !raw.iter().any(|n| n.starts_with("Ocamlhot.")),
        "{raw:?}"
    );
}

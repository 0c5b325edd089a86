//! What `rtrace profile` samples: only a cgroup's tasks (`-c PATH`,
//! `--cgroupmap`), only a thread (`-L`), the idle CPUs with `-I` alone,
//! and with `--off-cpu` the time off the CPU beside the time on it.

use std::process::{Command, Stdio};

use rtrace_integration_tests::{
    PinnedMaps, Rtrace, SIGINT, TestCgroup, cgroup_id, json_lines, parse_folded,
    profile::{READY, parse_svg, read_pprof, rgb, run_fixture, start_fixture, temp},
    run,
};

/// `-c PATH` (a cgroup, where bcc's `-c N` is a period) and bcc's
/// `--cgroupmap`: of two busy fixtures, only the one in the cgroup is
/// sampled, and about as often as it ran.
#[test]
fn cgroup_and_pinned_cgroup_map_filters() {
    let cgroup = TestCgroup::new("profile");
    let mut maps = PinnedMaps::new("profile");
    let (set, index) = maps.hash("cgroups");
    maps.insert(index, cgroup_id(&cgroup.path));
    for filter in [["-c", cgroup.path.as_str()], ["--cgroupmap", set.as_str()]] {
        let inside = start_fixture("hotfuncs", &["cpu", "1"]);
        let outside = start_fixture("hotfuncs", &["cpu", "1"]);
        cgroup.add(inside.pid());
        let (pid, other) = (inside.pid(), outside.pid());
        let mut args = vec!["profile", "-F", "199", "--json"];
        args.extend_from_slice(&filter);
        let rtrace = Rtrace::start_until(&args, READY);
        run_fixture(inside);
        run_fixture(outside);
        let (code, stdout, stderr) = rtrace.stop(SIGINT);
        assert_eq!(code, 0, "{stderr}");
        let stacks = json_lines(&stdout);
        let mut ours = 0;
        for s in &stacks {
            assert_eq!(
                s["pid"], pid,
                "{filter:?}: a stack of pid {} (the other is {other})",
                s["pid"]
            );
            ours += s["count"].as_u64().unwrap();
        }
        // A second of work at 199 Hz.
        assert!(
            ours >= 100,
            "{filter:?}: {ours} samples of the fixture in the cgroup"
        );
    }
    // bcc's -c N is still a period.
    let (code, _, stderr) = run(&["profile", "-c", "1000000", "-F", "99", "1"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("-F and -c N"), "{stderr}");
}

/// `-L` samples only the named thread; `-I` adds the idle CPUs' samples
/// (pid 0), about as many as perf's own cpu-clock takes of the idle task
/// in the same window, and none without it.
#[test]
fn thread_filter_and_idle_stacks() {
    // -L: only the named thread (the fixture's main thread) is sampled.
    let fixture = start_fixture("hotfuncs", &["cpu", "1"]);
    let tid = fixture.pid().to_string();
    let rtrace = Rtrace::start_until(&["profile", "-F", "199", "-L", &tid, "--json"], READY);
    run_fixture(fixture);
    let (code, stdout, stderr) = rtrace.stop(SIGINT);
    assert_eq!(code, 0, "{stderr}");
    let stacks = json_lines(&stdout);
    assert!(!stacks.is_empty(), "no samples of thread {tid}");
    for s in &stacks {
        assert_eq!(s["pid"].to_string(), tid, "{s}");
    }

    // Idle CPUs show up as pid 0 only with -I; with it, about as often
    // as perf's own cpu-clock samples the idle task meanwhile. Not as
    // often as the kernel counts the CPUs idle: on this VM cpu-clock does
    // not fire on an idle CPU that has given up its tick (perf's neither),
    // so beside a busy loop on the CPU that keeps it, no CPU is sampled
    // idle at all though one idles the whole second.
    let idle = |args: &[&str]| {
        let mut all = vec!["profile", "-F", "199", "-K", "--json"];
        all.extend_from_slice(args);
        let rtrace = Rtrace::start_until(&all, READY);
        let data = temp("idle-perf.data");
        let perf = Command::new("perf")
            .args(["record", "-q", "-a", "-e", "cpu-clock", "-F", "199", "-o"])
            .arg(&data)
            .args(["--", "sleep", "1"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("perf (Debian package linux-perf; cargo xtask installs it)");
        assert!(perf.success(), "perf record: {perf}");
        let (code, stdout, stderr) = rtrace.stop(SIGINT);
        assert_eq!(code, 0, "{stderr}");
        let script = Command::new("perf")
            .args(["script", "-F", "pid", "-i"])
            .arg(&data)
            .output()
            .unwrap();
        let _ = std::fs::remove_file(&data);
        let perfs = String::from_utf8_lossy(&script.stdout)
            .lines()
            .filter(|l| l.trim() == "0")
            .count() as u64;
        let samples = json_lines(&stdout)
            .iter()
            .filter(|s| s["pid"] == 0)
            .map(|s| s["count"].as_u64().unwrap())
            .sum::<u64>();
        (samples, perfs)
    };
    assert_eq!(idle(&[]).0, 0, "idle samples without -I");
    let (samples, perfs) = idle(&["-I"]);
    // rtrace samples from before perf starts to after it ends, at the
    // same rate: half perf's count is a floor with room for chance and
    // the timers' slack.
    assert!(
        samples >= perfs / 2,
        "{samples} idle samples with -I where perf sampled the idle task {perfs} times"
    );
}

/// `--off-cpu`: the fixture computes and sleeps by turns in `mid_mixed`;
/// the time-weighted profile splits that function's time on and off the
/// CPU as the fixture measured (its CPU time against its wall time),
/// within 5 points, and accounts for its wall time and its time asleep
/// within 10 %. The same
/// split is in pprof's two sample types, and the flame graph draws the
/// `[off-CPU]` frame in blue.
#[test]
fn off_cpu_and_on_cpu_time_split_as_measured() {
    let (svg, pb) = (temp("offcpu.svg"), temp("offcpu.pb.gz"));
    let fixture = start_fixture("cfuncs_nofp", &["mixed", "3"]);
    let pid = fixture.pid().to_string();
    let args = [
        "profile",
        "-F",
        "999",
        "-p",
        &pid,
        "--off-cpu",
        "-f",
        "--svg",
        svg.to_str().unwrap(),
        "--pprof",
        pb.to_str().unwrap(),
    ];
    let rtrace = Rtrace::start_until(&args, READY);
    let done = run_fixture(fixture);
    let (code, stdout, stderr) = rtrace.stop(SIGINT);
    assert_eq!(code, 0, "{stderr}");
    let (cpu_ns, wall_ns) = (done[0] as f64, done[1] as f64);
    let folded = parse_folded(&stdout);
    let off = |f: &Vec<String>| f.iter().any(|n| n == "[off-CPU]");
    let (mut on_us, mut off_us) = (0, 0);
    for (frames, us) in &folded {
        if frames.iter().any(|n| n == "mid_mixed") {
            if off(frames) {
                off_us += us;
            } else {
                on_us += us;
            }
        }
    }
    let seen = (on_us + off_us) as f64;
    assert!(
        (seen - wall_ns / 1000.0).abs() <= 0.1 * wall_ns / 1000.0,
        "{seen} us in mid_mixed; it took {} us:\n{stdout}\n{stderr}",
        wall_ns / 1000.0
    );
    let share = on_us as f64 / seen;
    let expected = cpu_ns / wall_ns;
    eprintln!(
        "mid_mixed: {seen} us seen of {} us; on-CPU share {share:.3}, measured {expected:.3}",
        wall_ns / 1000.0
    );
    assert!(
        (share - expected).abs() <= 0.05,
        "on-CPU share {share:.3} of mid_mixed; the fixture measured {expected:.3}:\n{stdout}"
    );
    // Off the CPU in its sleeps as long as it measured, whole through
    // libc's wrapper. (The rest of its time off the CPU is where it was
    // preempted, as much as the machine is busy.)
    let sleeping: u64 = folded
        .iter()
        .filter(|(f, _)| off(f) && f.iter().any(|n| n == "sleep_alpha"))
        .filter(|(f, _)| f.iter().any(|n| n.ends_with("nanosleep")))
        .map(|(_, us)| us)
        .sum();
    let slept = done[2] as f64 / 1000.0;
    assert!(
        (sleeping as f64 - slept).abs() <= 0.1 * slept,
        "{sleeping} us off the CPU in sleep_alpha's nanosleep; it measured {slept} us \
         ({off_us} us off the CPU in all):\n{stdout}"
    );

    // pprof: on_cpu and off_cpu, the same totals as the folded lines.
    let profile = read_pprof(&pb);
    let types: Vec<&str> = profile
        .sample_type
        .iter()
        .map(|t| profile.string_table[t.r#type as usize].as_str())
        .collect();
    assert_eq!(types, ["on_cpu", "off_cpu"]);
    let sum = |i: usize| -> u64 { profile.sample.iter().map(|s| s.value[i] as u64).sum() };
    let total = |want_off: bool| -> u64 {
        folded
            .iter()
            .filter(|(f, _)| off(f) == want_off)
            .map(|(_, us)| us)
            .sum()
    };
    assert_eq!((sum(0), sum(1)), (total(false), total(true)));

    // The flame graph: the [off-CPU] frame, filled blue.
    let text = std::fs::read_to_string(&svg).unwrap();
    let doc = parse_svg(&text).expect("SVG is not well-formed XML");
    let fill = doc
        .descendants()
        .filter(|n| n.has_tag_name("g"))
        .find(|g| {
            g.children().any(|c| {
                c.has_tag_name("title") && c.text().is_some_and(|t| t.starts_with("[off-CPU]"))
            })
        })
        .and_then(|g| g.children().find(|c| c.has_tag_name("rect")))
        .and_then(|r| r.attribute("fill"))
        .expect("no [off-CPU] frame in the flame graph");
    let [r, g, b] = rgb(fill);
    assert!(b > r && b > g, "[off-CPU] is not blue: {fill}");
}

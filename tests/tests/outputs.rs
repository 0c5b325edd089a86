//! What `rtrace profile` and `rtrace flamegraph` write: output files
//! created before sampling and whole at the end; folded text, pprof,
//! speedscope and SVG agreeing with each other; bcc's multi-line layout;
//! pprof's mappings, addresses and inlined lines, decoded independently;
//! `--hide`, `--collapse` and `--collapse-recursion`; flame graphs of
//! perf's stacks, differential ones, and the mixed palette.

use std::{
    collections::{BTreeMap, HashSet},
    process::Stdio,
};

use rtrace_integration_tests::{
    Rtrace, SIGINT, parse_folded,
    profile::{
        READY, count_with, marked_lines, parse_svg, perf_script_folded, pprof, profile_hotfuncs,
        read_pprof, rgb, run_fixture, start_fixture, svg_frames, temp,
    },
    run, workload_bin,
};

/// The stacks of a pprof profile in folded form: comm label, then the
/// functions' system names root first.
fn pprof_stacks(p: &pprof::Profile) -> BTreeMap<Vec<String>, u64> {
    let s = |i: i64| p.string_table[i as usize].clone();
    let names: BTreeMap<u64, String> = p
        .function
        .iter()
        .map(|f| (f.id, s(f.system_name)))
        .collect();
    // A location's lines are its inlined functions, then the function
    // they were inlined into: root first, the other way round.
    let locs: BTreeMap<u64, Vec<String>> = p
        .location
        .iter()
        .map(|l| {
            let frames = l
                .line
                .iter()
                .rev()
                .map(|line| names[&line.function_id].clone());
            (l.id, frames.collect())
        })
        .collect();
    let mut out = BTreeMap::new();
    for sample in &p.sample {
        let comm = sample
            .label
            .iter()
            .find(|l| s(l.key) == "comm")
            .map(|l| s(l.str))
            .expect("no comm label");
        let mut frames = vec![comm];
        frames.extend(
            sample
                .location_id
                .iter()
                .rev()
                .flat_map(|id| locs[id].clone()),
        );
        *out.entry(frames).or_insert(0) += sample.value[0] as u64;
    }
    out
}

/// Every output file is created before anything is attached: a path that
/// cannot be written fails with one line naming it, before sampling
/// begins, and leaves nothing behind, for profile, offcputime and
/// `flamegraph diff`; a good one appears whole, is announced with what it
/// holds, and leaves no temporary file beside it.
#[test]
fn output_files_are_created_first_and_appear_whole() {
    let dir = temp("outs");
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("no-such-folder").join("out");
    let bad = bad.to_str().unwrap();
    for (tool, flag) in [
        ("profile", "--svg"),
        ("profile", "--pprof"),
        ("profile", "--speedscope"),
        ("profile", "--heatmap"),
        ("offcputime", "--svg"),
        ("offcputime", "--pprof"),
    ] {
        let (code, stdout, stderr) = run(&[tool, "-v", flag, bad, "1"]);
        assert_eq!(code, 1, "{tool} {flag}: {stderr}");
        assert_eq!(
            stderr.trim(),
            format!("rtrace: error: cannot create {bad}: No such file or directory (os error 2)"),
            "{tool} {flag}: nothing may be attached first"
        );
        assert!(stdout.is_empty(), "{stdout}");
    }
    let diff = dir.join("diff.svg");
    let missing = dir.join("missing.folded");
    let missing = missing.to_str().unwrap();
    let (code, _, stderr) = run(&[
        "flamegraph",
        "diff",
        missing,
        missing,
        "--svg",
        diff.to_str().unwrap(),
    ]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("cannot open"), "{stderr}");
    // A plain flame graph to a path that cannot be written: one line,
    // before the input is read.
    let (code, _, stderr) = run(&["flamegraph", missing, "--svg", bad]);
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(
        stderr.trim(),
        format!("rtrace: error: cannot create {bad}: No such file or directory (os error 2)")
    );

    let svg = dir.join("ok.svg");
    let (code, _, stderr) = run(&["profile", "--svg", svg.to_str().unwrap(), "1"]);
    assert_eq!(code, 0, "{stderr}");
    let said = format!("rtrace: wrote {} (", svg.display());
    let line = stderr
        .lines()
        .find(|l| l.starts_with(&said))
        .expect(&stderr);
    assert!(
        line.ends_with(" stacks)") && line.contains(" samples, "),
        "{line}"
    );
    assert!(std::fs::read_to_string(&svg).unwrap().contains("</svg>"));
    // The SVG alone: no partial diff, no temporary file.
    let left: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, ["ok.svg"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn folded_pprof_speedscope_and_svg_agree() {
    let (svg, pb, ss) = (temp("a.svg"), temp("a.pb.gz"), temp("a.speedscope.json"));
    let (stdout, _, _) = profile_hotfuncs(&[
        "-f",
        "--svg",
        svg.to_str().unwrap(),
        "--pprof",
        pb.to_str().unwrap(),
        "--speedscope",
        ss.to_str().unwrap(),
    ]);
    let folded = parse_folded(&stdout);
    let total: u64 = folded.values().sum();
    assert!(total >= 300, "too few samples: {total}");

    // pprof: gzip, then profile.proto; the same stacks and counts as folded.
    let profile = read_pprof(&pb);
    assert_eq!(profile.string_table[0], "");
    assert_eq!(profile.sample_type.len(), 2);
    assert!(profile.period > 0);
    assert_eq!(pprof_stacks(&profile), folded, "pprof and folded differ");

    // speedscope: the same total, every frame index valid.
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&ss).unwrap()).unwrap();
    let frames = doc["shared"]["frames"].as_array().unwrap().len();
    let prof = &doc["profiles"][0];
    let weights: u64 = prof["weights"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_u64().unwrap())
        .sum();
    assert_eq!(weights, total);
    for stack in prof["samples"].as_array().unwrap() {
        for i in stack.as_array().unwrap() {
            assert!((i.as_u64().unwrap() as usize) < frames);
        }
    }

    // SVG: well-formed, with the hot functions in it.
    let text = std::fs::read_to_string(&svg).unwrap();
    let doc = parse_svg(&text).expect("SVG is not well-formed XML");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    let titles: Vec<&str> = doc
        .descendants()
        .filter(|n| n.has_tag_name("title"))
        .filter_map(|n| n.text())
        .collect();
    assert!(
        titles.iter().any(|t| t.contains("hotfuncs::hot_alpha")),
        "no hot_alpha among {} SVG titles (first: {:?}); folded:\n{stdout}",
        titles.len(),
        titles.iter().take(5).collect::<Vec<_>>()
    );

    // Folded output round-trips: written back out and read again by
    // `flamegraph diff`, which needs both files to parse.
    let before = temp("before.folded");
    let after = temp("after.folded");
    std::fs::write(&before, &stdout).unwrap();
    let doubled: String = stdout
        .lines()
        .map(|l| {
            let (stack, n) = l.rsplit_once(' ').unwrap();
            let n: u64 = n.parse().unwrap();
            let n = if stack.contains("hot_beta") { n * 2 } else { n };
            format!("{stack} {n}\n")
        })
        .collect();
    std::fs::write(&after, doubled).unwrap();
    let diff = temp("diff.svg");
    let (code, _, stderr) = run(&[
        "flamegraph",
        "diff",
        before.to_str().unwrap(),
        after.to_str().unwrap(),
        "--svg",
        diff.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{stderr}");
    let text = std::fs::read_to_string(&diff).unwrap();
    let doc = parse_svg(&text).expect("diff SVG is not well-formed");
    // Stacks through hot_beta grew. A differential graph colors a frame by
    // the change in its own (leaf) samples, so their leaf frames are red:
    // more red than green or blue.
    let grown_leaves: HashSet<String> = folded
        .keys()
        .filter(|f| f.iter().any(|n| n.ends_with("hotfuncs::hot_beta")))
        .map(|f| format!("{} (", f.last().unwrap()))
        .collect();
    let red = |fill: &str| {
        let [r, g, b] = rgb(fill);
        r > g && r > b
    };
    let mut leaves = 0;
    for g in doc.descendants().filter(|n| n.has_tag_name("g")) {
        let Some(title) = g.children().find(|t| t.has_tag_name("title")) else {
            continue;
        };
        let title = title.text().unwrap_or("");
        if !grown_leaves.iter().any(|l| title.starts_with(l.as_str())) || !title.contains("; +") {
            continue;
        }
        let fill = g.children().find_map(|n| n.attribute("fill")).unwrap();
        assert!(red(fill), "{title} grew but is {fill}, not red");
        leaves += 1;
    }
    assert!(leaves > 0, "no grown hot_beta leaf in the diff graph");
    for f in [svg, pb, ss, before, after, diff] {
        let _ = std::fs::remove_file(f);
    }
}

#[test]
fn multiline_output_has_bcc_layout() {
    let (stdout, _, _) = profile_hotfuncs(&["-d"]);
    // Blocks of frames, leaf first, then `-  comm (pid)` and the count,
    // separated by blank lines; the hottest last.
    let mut counts = Vec::new();
    for block in stdout.split("\n\n").filter(|b| !b.trim().is_empty()) {
        let lines: Vec<&str> = block.lines().collect();
        let n = lines.len();
        assert!(n >= 3, "short block: {block:?}");
        let who = lines[n - 2].trim_start();
        assert!(who.starts_with("-") && who.ends_with(')'), "{block}");
        assert!(who.contains("hotfuncs ("), "{block}");
        counts.push(lines[n - 1].trim().parse::<u64>().expect("count line"));
        for l in &lines[..n - 2] {
            assert!(l.starts_with("    ") && !l.trim().is_empty(), "{block}");
        }
        if block.contains("hotfuncs::hot_alpha") {
            let leaf = lines.iter().position(|l| l.trim() == "hotfuncs::hot_alpha");
            let caller = lines
                .iter()
                .position(|l| l.trim() == "hotfuncs::work_caller");
            assert!(leaf < caller, "frames are not leaf first: {block}");
        }
    }
    assert!(counts.len() >= 2);
    assert!(
        counts.windows(2).all(|w| w[0] <= w[1]),
        "not hottest last: {counts:?}"
    );
}

/// The pprof file, decoded with types generated from `profile.proto`:
/// sample types, period, time and duration as the run had them; the
/// fixture's mapping with its file, build id and addresses; locations at
/// addresses inside the right function; and the inlined `step` and the
/// `leaf_gamma` it is inlined into as two lines of one location, each
/// with its own line number.
#[test]
fn pprof_has_mappings_addresses_and_inlined_lines() {
    use object::{Object as _, ObjectSegment as _, ObjectSymbol as _};
    let step = marked_lines("/* STEP_LINE */");
    let call = marked_lines("/* GAMMA_CALL_LINE */");
    let pb = temp("lines.pb.gz");
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64;
    let fixture = start_fixture("cfuncs_nofp", &["tower", "2"]);
    let pid = fixture.pid().to_string();
    let rtrace = Rtrace::start_until(
        &[
            "profile",
            "-F",
            "499",
            "-p",
            &pid,
            "-U",
            "--lines",
            "--pprof",
            pb.to_str().unwrap(),
        ],
        READY,
    );
    run_fixture(fixture);
    let (code, _, stderr) = rtrace.stop(SIGINT);
    assert_eq!(code, 0, "{stderr}");
    let p = read_pprof(&pb);
    let s = |i: i64| p.string_table[i as usize].as_str();

    let types: Vec<(&str, &str)> = p
        .sample_type
        .iter()
        .map(|t| (s(t.r#type), s(t.unit)))
        .collect();
    assert_eq!(types, [("samples", "count"), ("cpu", "nanoseconds")]);
    let period = p.period_type.as_ref().unwrap();
    assert_eq!((s(period.r#type), s(period.unit)), ("cpu", "nanoseconds"));
    assert_eq!(p.period, 1_000_000_000 / 499);
    assert!(
        p.time_nanos >= before && p.time_nanos < before + 10_000_000_000,
        "{}",
        p.time_nanos
    );
    assert!(
        (1_500_000_000..30_000_000_000).contains(&p.duration_nanos),
        "{}",
        p.duration_nanos
    );
    for sample in &p.sample {
        assert_eq!(sample.value[1], sample.value[0] * p.period, "{sample:?}");
    }

    // The fixture's mapping: its file, its build id, and addresses.
    let path = workload_bin("cfuncs_nofp");
    let data = std::fs::read(&path).unwrap();
    let elf = object::File::parse(&*data).unwrap();
    let build_id: String = elf
        .build_id()
        .unwrap()
        .unwrap()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let mapping = p
        .mapping
        .iter()
        .find(|m| s(m.filename).ends_with("/cfuncs_nofp"))
        .unwrap_or_else(|| panic!("no mapping of the fixture: {:?}", p.mapping));
    assert_eq!(s(mapping.build_id), build_id);
    assert!(mapping.memory_start < mapping.memory_limit);
    assert!(mapping.has_line_numbers && mapping.has_inline_frames);

    // A file offset as the address of the symbol table.
    let file_offset = |address: u64| address - mapping.memory_start + mapping.file_offset;
    let vaddr = |offset: u64| {
        elf.segments().find_map(|seg| {
            let (start, size) = seg.file_range();
            (start..start + size)
                .contains(&offset)
                .then(|| seg.address() + (offset - start))
        })
    };
    let gamma = elf
        .symbols()
        .find(|s| s.name() == Ok("leaf_gamma"))
        .unwrap();
    let gamma = gamma.address()..gamma.address() + gamma.size();
    let name = |id: u64| s(p.function.iter().find(|f| f.id == id).unwrap().name);
    let inlined: Vec<&pprof::Location> = p
        .location
        .iter()
        .filter(|l| {
            l.line
                .first()
                .is_some_and(|line| name(line.function_id) == "step")
        })
        .collect();
    assert!(!inlined.is_empty(), "no location of step");
    for l in inlined {
        assert_eq!(l.mapping_id, mapping.id);
        assert!((mapping.memory_start..mapping.memory_limit).contains(&l.address));
        let at = vaddr(file_offset(l.address)).unwrap();
        assert!(
            gamma.contains(&at),
            "{at:#x} is not in leaf_gamma {gamma:x?}"
        );
        let lines: Vec<(&str, i64)> = l
            .line
            .iter()
            .map(|line| (name(line.function_id), line.line))
            .collect();
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert_eq!(lines[0].0, "step");
        assert!(step.contains(&(lines[0].1 as u32)), "{lines:?}");
        assert_eq!(lines[1], ("leaf_gamma", i64::from(call[0])));
        let f = p
            .function
            .iter()
            .find(|f| f.id == l.line[0].function_id)
            .unwrap();
        assert!(s(f.filename).ends_with("cfuncs.c"));
    }
}

/// `--hide`, `--collapse` and `--collapse-recursion` on a fixture with a
/// recursive tower and a "garbage collector" subtree: in profile's own
/// output, sampled beside an untransformed run of the same process, and
/// in `rtrace flamegraph` on that run's folded stacks.
#[test]
fn stack_transforms_flatten_towers_and_fold_collectors() {
    let fixture = start_fixture("cfuncs_nofp", &["tower", "3"]);
    let pid = fixture.pid().to_string();
    let base = ["profile", "-F", "499", "-p", &pid, "-f", "-U"];
    let transforms = [
        "--collapse-recursion",
        "--collapse",
        "^gc_collect$",
        "--hide",
        "^mid_tower$",
    ];
    let plain = Rtrace::start_until(&base, READY);
    let shaped_args: Vec<&str> = base.iter().chain(&transforms).copied().collect();
    let shaped = Rtrace::start_until(&shaped_args, READY);
    let done = run_fixture(fixture);
    let (code, plain_out, stderr) = plain.stop(SIGINT);
    assert_eq!(code, 0, "{stderr}");
    let (code, shaped_out, stderr) = shaped.stop(SIGINT);
    assert_eq!(code, 0, "{stderr}");
    let plain = parse_folded(&plain_out);
    let shaped = parse_folded(&shaped_out);
    let total = |f: &BTreeMap<Vec<String>, u64>| f.values().sum::<u64>();

    // Untransformed: towers of eight and more, the collector's subtree
    // and mid_tower are all there.
    let tallest = |f: &BTreeMap<Vec<String>, u64>| {
        f.keys()
            .map(|s| s.iter().filter(|n| *n == "tower").count())
            .max()
            .unwrap_or(0)
    };
    assert!(tallest(&plain) >= 8, "{plain_out}");
    assert!(count_with(&plain, "gc_mark") > 0, "{plain_out}");
    assert!(count_with(&plain, "mid_tower") > 0, "{plain_out}");

    // Transformed: no two frames alike in a row, nothing above
    // gc_collect, no mid_tower; main calls the tower and the collector
    // directly.
    assert_eq!(tallest(&shaped), 1, "{shaped_out}");
    for stack in shaped.keys() {
        assert!(stack.windows(2).all(|w| w[0] != w[1]), "{stack:?}");
        if let Some(i) = stack.iter().position(|n| n == "gc_collect") {
            assert_eq!(i, stack.len() - 1, "{stack:?}");
            assert_eq!(stack[i - 1], "main", "{stack:?}");
        }
        assert!(!stack.iter().any(|n| n == "mid_tower"), "{stack:?}");
    }
    // The collector's share is the same, now in one frame, and matches
    // the fixture's own clock within sampling noise.
    let share = |part: u64, all: u64| part as f64 / all.max(1) as f64;
    let plain_gc = share(count_with(&plain, "gc_collect"), total(&plain));
    let shaped_gc = share(
        shaped
            .iter()
            .filter(|(s, _)| s.last().is_some_and(|n| n == "gc_collect"))
            .map(|(_, c)| c)
            .sum(),
        total(&shaped),
    );
    let truth = share(done[1] as u64, (done[0] + done[1]) as u64);
    assert!(total(&shaped) > 500, "{shaped_out}");
    // Within sampling noise: four standard deviations of a share drawn
    // from n samples (the two runs sample apart, each with its own
    // noise), and 0.02 for the fixture's alternation. A starved emulated
    // guest gets fewer samples, so its bound is wider.
    let variance = |p: f64, n: u64| p * (1.0 - p) / n.max(1) as f64;
    let bound =
        0.02 + 4.0 * (variance(truth, total(&plain)) + variance(truth, total(&shaped))).sqrt();
    assert!(
        (shaped_gc - plain_gc).abs() < bound,
        "{shaped_gc} vs {plain_gc} (bound {bound:.3}; {} and {} samples)",
        total(&shaped),
        total(&plain)
    );
    let bound = 0.02 + 4.0 * variance(truth, total(&shaped)).sqrt();
    assert!(
        (shaped_gc - truth).abs() < bound,
        "{shaped_gc} vs the fixture's {truth} (bound {bound:.3}; {} samples)",
        total(&shaped)
    );

    // The same transforms in `rtrace flamegraph` on the plain run's
    // folded stacks: one tower frame where there were eight and more.
    let folded = temp("tower.folded");
    std::fs::write(&folded, &plain_out).unwrap();
    let draw = |extra: &[&str]| {
        let svg = temp("tower.svg");
        let mut args = vec![
            "flamegraph",
            folded.to_str().unwrap(),
            "--svg",
            svg.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let (code, _, stderr) = run(&args);
        assert_eq!(code, 0, "{stderr}");
        assert!(stderr.contains("rtrace: wrote "), "{stderr}");
        svg_frames(&std::fs::read_to_string(svg).unwrap())
    };
    let before = draw(&[]);
    assert!(
        before.iter().filter(|n| *n == "tower").count() >= 8,
        "{before:?}"
    );
    let after = draw(&transforms);
    assert_eq!(
        after.iter().filter(|n| *n == "tower").count(),
        1,
        "{after:?}"
    );
    for gone in ["gc_mark", "gc_sweep", "mid_tower"] {
        assert!(!after.iter().any(|n| n == gone), "{gone}: {after:?}");
    }
    assert!(after.iter().any(|n| n == "gc_collect"), "{after:?}");
}

/// `rtrace flamegraph` draws perf's stacks, folded as FlameGraph's
/// stackcollapse-perf folds them (inferno's port of it).
#[test]
fn flamegraph_draws_perfs_folded_stacks() {
    if rtrace_integration_tests::in_guest() {
        eprintln!("skipped: the guests have no perf; the host runs this test");
        return;
    }
    let data = temp("perf.data");
    let fixture = start_fixture("cfuncs", &["cpu", "2"]);
    let pid = fixture.pid().to_string();
    let perf = std::process::Command::new("perf")
        .args([
            "record",
            "-q",
            "-e",
            "cpu-clock",
            "-F",
            "499",
            "-g",
            "-p",
            &pid,
            "-o",
        ])
        .arg(&data)
        .stdout(std::process::Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("perf (Debian package linux-perf; cargo xtask installs it)");
    std::thread::sleep(std::time::Duration::from_millis(500));
    run_fixture(fixture);
    let perf = perf.wait_with_output().unwrap();
    assert!(
        perf.status.success(),
        "perf record: {}: {}",
        perf.status,
        String::from_utf8_lossy(&perf.stderr)
    );
    let (_, folded) = perf_script_folded(&data);
    let path = temp("perf.folded");
    std::fs::write(&path, &folded).unwrap();
    let svg = temp("perf.svg");
    let (code, _, stderr) = run(&[
        "flamegraph",
        path.to_str().unwrap(),
        "--svg",
        svg.to_str().unwrap(),
        "--title",
        "perf's stacks",
    ]);
    assert_eq!(code, 0, "{stderr}");
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.contains("perf&apos;s stacks") || text.contains("perf's stacks"));
    let frames = svg_frames(&text);
    // perf walks frame pointers, so the caller of a leaf without a frame
    // of its own (`mid`) is not seen: these are what it sees.
    for f in ["main", "leaf_alpha", "leaf_beta"] {
        assert!(frames.iter().any(|n| n == f), "{f}: {frames:?}");
    }
}

/// `rtrace flamegraph --colors mixed` (the default) gives kernel, user
/// native, JIT, inlined and interpreted frames hues of their own, by the
/// suffixes `profile -a` writes, and shows the names without them.
#[test]
fn mixed_palette_gives_each_kind_of_frame_its_hue() {
    let folded = temp("mixed.folded");
    std::fs::write(
        &folded,
        "app;main;vfs_read_[k] 5\napp;main;compiled_[j] 5\napp;main;script_fn_[p] 5\n\
         app;main;helper_[i] 5\napp;main;native 5\n",
    )
    .unwrap();
    let svg = temp("mixed.svg");
    let (code, _, stderr) = run(&[
        "flamegraph",
        folded.to_str().unwrap(),
        "--svg",
        svg.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{stderr}");
    let text = std::fs::read_to_string(&svg).unwrap();
    let doc = parse_svg(&text).unwrap();
    let fill = |name: &str| -> [u32; 3] {
        let g = doc
            .descendants()
            .find(|n| {
                n.has_tag_name("g")
                    && n.children().any(|c| {
                        c.has_tag_name("title")
                            && c.text()
                                .is_some_and(|t| t.starts_with(&format!("{name} (")))
                    })
            })
            .unwrap_or_else(|| panic!("no frame {name} shown without its suffix"));
        let rect = g.children().find(|c| c.has_tag_name("rect")).unwrap();
        rgb(rect.attribute("fill").unwrap())
    };
    let [kr, kg, kb] = fill("vfs_read");
    assert!(kr > kg && kg > kb, "kernel orange: {:?}", [kr, kg, kb]);
    let [jr, jg, jb] = fill("compiled");
    assert!(jg > jr && jg > jb, "JIT green: {:?}", [jr, jg, jb]);
    let [pr, pg, pb] = fill("script_fn");
    assert!(pb > pg && pr > pg, "interpreted purple: {:?}", [pr, pg, pb]);
    let [ir, ig, ib] = fill("helper");
    assert!(ig > ir && ib > ir, "inlined aqua: {:?}", [ir, ig, ib]);
    let [nr, ng, nb] = fill("native");
    assert!(nr > ng && nr > nb, "native red: {:?}", [nr, ng, nb]);
}

/// Output files given a device or a named pipe (`--svg /dev/null`, a FIFO
/// a reader drains) are written into it, not replaced: a file renamed
/// over `/dev/null` would turn it into a regular file for every program
/// on the machine (it did, once, here).
#[test]
fn outputs_into_devices_and_pipes_leave_them_in_place() {
    use std::os::unix::fs::FileTypeExt as _;
    let folded = temp("dev.folded");
    std::fs::write(&folded, "app;main;work 3\napp;main;rest 1\n").unwrap();
    let fifo = temp("dev.fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid path, and a mode.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read(&fifo).unwrap())
    };
    let (code, _, stderr) = run(&[
        "report",
        folded.to_str().unwrap(),
        "--svg",
        "/dev/null",
        "--pprof",
        "/dev/null",
        "--speedscope",
        fifo.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{stderr}");
    let got = reader.join().unwrap();
    let json: serde_json::Value = serde_json::from_slice(&got).expect("speedscope JSON");
    assert!(json["profiles"].is_array(), "{json}");
    let null = std::fs::metadata("/dev/null").unwrap();
    assert!(
        null.file_type().is_char_device(),
        "/dev/null is now {null:?}"
    );
    assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
    for f in [&folded, &fifo] {
        let _ = std::fs::remove_file(f);
    }
}

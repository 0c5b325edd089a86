//! `rtrace doctor` probes every mechanism for real.

use rtrace_integration_tests::run;

#[test]
fn doctor_reports_every_mechanism() {
    let (code, stdout, stderr) = run(&["doctor", "--json"]);
    assert_eq!(code, 0, "{stderr}");
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    assert_eq!(v["kernel"], release.trim());
    let mechs = v["mechanisms"].as_object().unwrap();
    assert_eq!(mechs.len(), 13, "{v}");
    for (name, m) in mechs {
        let works = m["works"].as_bool().unwrap();
        assert!(
            works || !m["error"].as_str().unwrap().is_empty(),
            "{name}: a failure says why"
        );
    }
    // Classic tracepoints and software perf events exist on every kernel
    // rtrace supports, and uprobes on any with perf events.
    // Reading processes' memory through the kernel (for names without
    // ptrace rights) is 6.1's, the oldest kernel tested.
    for name in ["tracepoint", "perf_event_sw", "uprobe", "task_memory"] {
        assert_eq!(mechs[name]["works"], true, "{name}: {v}");
    }
    // The kprobe answer must match what the kernel exposes.
    let kprobe_pmu = std::path::Path::new("/sys/bus/event_source/devices/kprobe").exists();
    assert_eq!(mechs["kprobe"]["works"], kprobe_pmu, "{v}");

    let (code, text, _) = run(&["doctor"]);
    assert_eq!(code, 0);
    assert!(
        text.contains("tp_btf") && text.contains("MECHANISM"),
        "{text}"
    );
}

/// Whether the ELF file at `path` asks for a dynamic loader (`PT_INTERP`).
fn has_interpreter(path: &std::path::Path) -> bool {
    let elf = std::fs::read(path).unwrap();
    assert_eq!(&elf[..4], b"\x7fELF", "{} is no ELF file", path.display());
    let u16_at = |o: usize| u16::from_le_bytes([elf[o], elf[o + 1]]) as usize;
    let u64_at = |o: usize| u64::from_le_bytes(elf[o..o + 8].try_into().unwrap()) as usize;
    let (phoff, phentsize, phnum) = (u64_at(0x20), u16_at(0x36), u16_at(0x38));
    (0..phnum).any(|i| {
        let p = phoff + i * phentsize;
        u32::from_le_bytes(elf[p..p + 4].try_into().unwrap()) == 3
    })
}

/// The bytes the ELF file at `path` gives its sections of type `sh_type`
/// (`SHT_RELA` 4, `SHT_RELR` 19), from its section headers.
fn section_bytes(path: &std::path::Path, sh_type: u32) -> u64 {
    let elf = std::fs::read(path).unwrap();
    let u16_at = |o: usize| u16::from_le_bytes([elf[o], elf[o + 1]]) as usize;
    let u64_at = |o: usize| u64::from_le_bytes(elf[o..o + 8].try_into().unwrap());
    let (shoff, shentsize, shnum) = (u64_at(0x28) as usize, u16_at(0x3a), u16_at(0x3c));
    (0..shnum)
        .map(|i| shoff + i * shentsize)
        .filter(|&h| u32::from_le_bytes(elf[h + 4..h + 8].try_into().unwrap()) == sh_type)
        .map(|h| u64_at(h + 0x20))
        .sum()
}

#[test]
fn the_static_build_runs_doctor_and_agrees_with_the_dynamic_one() {
    // Built by `cargo xtask test` (and `cargo xtask dist`), which set the
    // variable; the guests run their copy of it.
    let path = std::env::var_os("RTRACE_STATIC_BIN").map_or_else(
        || std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/dist/rtrace"),
        std::path::PathBuf::from,
    );
    assert!(
        path.exists(),
        "{} missing: cargo xtask dist builds it",
        path.display()
    );
    assert!(!has_interpreter(&path), "{} is not static", path.display());
    // The static start-up applies packed relative relocations (DT_RELR),
    // a bit or so a pointer where `.rela.dyn` takes 24 bytes: 0.8 MB of
    // the binary once a cargo no longer told the build script it was
    // static. What is left unpacked is a handful.
    let (packed, unpacked) = (section_bytes(&path, 19), section_bytes(&path, 4));
    assert!(
        packed > 0 && unpacked < 4096,
        "{}: {packed} bytes of packed relocations, {unpacked} unpacked",
        path.display()
    );
    assert!(has_interpreter(&rtrace_integration_tests::rtrace_bin()));
    let doctor = |bin: &std::path::Path| {
        let out = std::process::Command::new(bin)
            .args(["doctor", "--json"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let works: Vec<(String, bool)> = v["mechanisms"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, m)| (k.clone(), m["works"] == true))
            .collect();
        works
    };
    let static_says = doctor(&path);
    assert!(static_says.iter().any(|(_, w)| *w), "{static_says:?}");
    assert_eq!(static_says, doctor(&rtrace_integration_tests::rtrace_bin()));
}

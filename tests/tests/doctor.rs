//! `rtrace doctor` probes every mechanism for real.

use object::read::elf::{ElfFile64, ProgramHeader as _, SectionHeader as _};
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

/// Calls `f` with the 64-bit ELF file at `path`, parsed.
fn with_elf<R>(path: &std::path::Path, f: impl FnOnce(&ElfFile64) -> R) -> R {
    let data = std::fs::read(path).unwrap();
    let elf = ElfFile64::parse(&*data)
        .unwrap_or_else(|e| panic!("{} is no 64-bit ELF file: {e}", path.display()));
    f(&elf)
}

/// Whether the ELF file at `path` asks for a dynamic loader (`PT_INTERP`).
fn has_interpreter(path: &std::path::Path) -> bool {
    with_elf(path, |elf| {
        let endian = elf.endian();
        elf.elf_program_headers()
            .iter()
            .any(|p| p.p_type(endian) == object::elf::PT_INTERP)
    })
}

/// The bytes the ELF file at `path` gives its sections of type `sh_type`
/// (`SHT_RELA`, `SHT_RELR`), from its section headers.
fn section_bytes(path: &std::path::Path, sh_type: u32) -> u64 {
    with_elf(path, |elf| {
        let endian = elf.endian();
        elf.elf_section_table()
            .iter()
            .filter(|h| h.sh_type(endian) == sh_type)
            .map(|h| h.sh_size(endian))
            .sum()
    })
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
    let (packed, unpacked) = (
        section_bytes(&path, object::elf::SHT_RELR),
        section_bytes(&path, object::elf::SHT_RELA),
    );
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

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
    assert_eq!(mechs.len(), 12, "{v}");
    for (name, m) in mechs {
        let works = m["works"].as_bool().unwrap();
        assert!(
            works || !m["error"].as_str().unwrap().is_empty(),
            "{name}: a failure says why"
        );
    }
    // Classic tracepoints and software perf events exist on every kernel
    // rtrace supports, and uprobes on any with perf events.
    for name in ["tracepoint", "perf_event_sw", "uprobe"] {
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

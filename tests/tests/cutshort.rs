//! Quiet normal runs, loud bad ones: a stack cut short by a word the walk
//! could not read is a sample kept with the frames read, not a lost
//! event. It is counted (`-v`, the JSON rows' `cut_short`, the pprof
//! label), and warned of only where it is common in a process, naming it
//! with the cause and the cure.

use std::process::{Command, Stdio};

use rtrace_integration_tests::{Workload, in_guest, json_lines, run, workload_bin};

/// The warnings on `stderr`, whole lines.
fn warnings(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.starts_with("rtrace: warning"))
        .collect()
}

/// A normal system-wide second, beside a busy Python and a C program
/// whose code has CFI: profile and offcputime warn of nothing.
#[test]
fn a_normal_system_wide_run_warns_of_nothing() {
    let (mut c, line) = Workload::start("hotfuncs_nofp", &["cpu".to_owned(), "4".to_owned()]);
    assert!(line.starts_with("ready"), "{line}");
    c.go();
    // The guests carry no Python: there the C program alone.
    let mut py = (!in_guest()).then(|| {
        use std::io::{BufRead as _, BufReader, Write as _};
        let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/pyfix.py");
        let mut py = Command::new("python3")
            .arg(&fixture)
            .args(["split", "4"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 runs");
        let mut out = BufReader::new(py.stdout.take().unwrap());
        let mut ready = String::new();
        out.read_line(&mut ready).unwrap();
        assert!(ready.starts_with("ready"), "{ready}");
        writeln!(py.stdin.as_mut().unwrap()).unwrap();
        py.stdout = Some(out.into_inner());
        py
    });
    for args in [
        &["profile", "-F", "49", "-a", "1"][..],
        &["offcputime", "1"][..],
    ] {
        let (code, stdout, stderr) = run(args);
        assert_eq!(code, 0, "{args:?}: {stderr}");
        assert!(!stdout.trim().is_empty(), "{args:?} printed nothing");
        let cut: Vec<&str> = warnings(&stderr)
            .into_iter()
            .filter(|l| l.contains("cut short"))
            .collect();
        assert!(cut.is_empty(), "{args:?} warned: {cut:?}");
    }
    if let Some(py) = &mut py {
        let _ = py.kill();
        let _ = py.wait();
    }
    assert!(c.wait().success());
}

/// Mono's JIT without frame pointers (Press.exe keeps a number in rbp):
/// nearly all its stacks are cut short, and one warning names the
/// process, the cause and the cure; the rows say which samples were cut.
#[test]
fn a_jit_without_frame_pointers_is_warned_of_by_name() {
    if in_guest() {
        eprintln!("skipped: the VM guests have no Mono; the host runs it");
        return;
    }
    let exe = workload_bin("Press.exe");
    let (code, _, stderr) = run(&[
        "profile",
        "-F",
        "199",
        "-v",
        "--json",
        "--",
        "mono",
        exe.to_str().unwrap(),
        "2",
    ]);
    assert_eq!(code, 0, "{stderr}");
    // Under `-- CMD` the report shares stderr with rtrace's own lines,
    // leaving stdout to the command.
    let json: String = stderr
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| format!("{l}\n"))
        .collect();
    let rows = json_lines(&json);
    let mono: Vec<&serde_json::Value> = rows.iter().filter(|r| r["comm"] == "mono").collect();
    let count = |rs: &[&serde_json::Value]| -> u64 {
        rs.iter().map(|r| r["count"].as_u64().unwrap()).sum()
    };
    let cut: Vec<&serde_json::Value> = mono
        .iter()
        .copied()
        .filter(|r| r["cut_short"] == true)
        .collect();
    let (all, short) = (count(&mono), count(&cut));
    assert!(all >= 200, "{all} samples of mono\n{stderr}");
    assert!(
        short as f64 > 0.5 * all as f64,
        "{short} of {all} mono samples cut short\n{stderr}"
    );
    let pid = mono[0]["pid"].as_u64().unwrap();
    let w = warnings(&stderr);
    let named: Vec<&&str> = w.iter().filter(|l| l.contains("cut short")).collect();
    assert_eq!(named.len(), 1, "one warning: {w:?}");
    for want in [
        format!("PID {pid} (mono)"),
        "MONO_DEBUG=disable_omit_fp".to_owned(),
        "neither frame pointers nor CFI".to_owned(),
    ] {
        assert!(named[0].contains(&want), "no {want:?} in {}", named[0]);
    }
    // -v counts them all, at least those of mono.
    let counted: u64 = stderr
        .lines()
        .find_map(|l| l.split("user stacks cut short: ").nth(1))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count under -v: {stderr}"));
    assert!(counted >= short, "-v counted {counted}, the rows {short}");
}

//! The command line as a whole: versions, shell completions and man pages.

use rtrace_integration_tests::run;

#[test]
fn version_names_the_commit_and_the_aya_crates() {
    let (code, stdout, stderr) = run(&["--version"]);
    assert_eq!(code, 0, "{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines[0],
        concat!("rtrace ", env!("CARGO_PKG_VERSION")),
        "{stdout}"
    );
    let commit = lines[1].strip_prefix("commit ").expect(&stdout);
    assert!(
        commit.len() == 12 && commit.bytes().all(|b| b.is_ascii_hexdigit()),
        "{stdout}"
    );
    // Where the tests run beside the repository, it is a commit of its
    // history: HEAD's, or an earlier one if HEAD moved since the build.
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if git(&["rev-parse", "HEAD"]) {
        assert!(
            git(&["merge-base", "--is-ancestor", commit, "HEAD"]),
            "{commit} is not in HEAD's history"
        );
    }
    assert!(
        lines[2].starts_with("aya 0.14.0, aya-ebpf 0.2.1"),
        "{stdout}"
    );
    // -V on every command, as bcc's users type it.
    for command in ["runqlat", "profile", "exporter", "flamegraph", "doctor"] {
        let (code, stdout, stderr) = run(&[command, "-V"]);
        assert_eq!(code, 0, "{command}: {stderr}");
        assert_eq!(
            stdout.trim(),
            format!("rtrace-{command} {}", env!("CARGO_PKG_VERSION"))
        );
    }
}

#[test]
fn completions_load_in_bash_and_name_every_command() {
    let (code, script, stderr) = run(&["completions", "bash"]);
    assert_eq!(code, 0, "{stderr}");
    for command in ["runqlat", "biolatency", "profile", "exporter", "flamegraph"] {
        assert!(script.contains(command), "{command}");
    }
    for shell in ["zsh", "fish"] {
        let (code, script, _) = run(&["completions", shell]);
        assert_eq!(code, 0);
        assert!(script.contains("runqlat"), "{shell}");
    }
    let (code, _, stderr) = run(&["completions", "tcsh"]);
    assert_eq!(code, 2, "{stderr}");
    if rtrace_integration_tests::in_guest() {
        eprintln!("skipped loading: the guests have no bash; the host loads the script");
        return;
    }
    let path = std::env::temp_dir().join(format!("rtrace-{}.bash", std::process::id()));
    std::fs::write(&path, &script).unwrap();
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!("source {} && complete -p rtrace", path.display()))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("-F _rtrace rtrace"), "{said}");
    let _ = std::fs::remove_file(path);
}

#[test]
fn man_pages_render_for_every_command() {
    let dir = std::env::temp_dir().join(format!("rtrace-man-{}", std::process::id()));
    let (code, _, stderr) = run(&["man", dir.to_str().unwrap()]);
    assert_eq!(code, 0, "{stderr}");
    let mut pages: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    pages.sort();
    for want in [
        "rtrace.1",
        "rtrace-runqlat.1",
        "rtrace-flamegraph-diff.1",
        "rtrace-exporter.1",
    ] {
        assert!(pages.iter().any(|p| p == want), "{want}: {pages:?}");
    }
    assert!(
        stderr.contains(&format!("wrote {} man pages", pages.len())),
        "{stderr}"
    );
    if rtrace_integration_tests::in_guest() {
        eprintln!("skipped rendering: the guests have no man; the host renders them");
        return;
    }
    for page in &pages {
        let out = std::process::Command::new("man")
            .arg("-l")
            .arg(dir.join(page))
            .env("MANPAGER", "cat")
            .env("MANWIDTH", "100")
            .output()
            .expect("man (Debian package man-db)");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{page}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let name = page.trim_end_matches(".1");
        assert!(
            text.contains("NAME") && text.contains(name),
            "{page}:\n{text}"
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// The flags every tool takes are offered only where they do something:
/// a tool's --help lists them, flamegraph's does not, and giving them
/// there is a usage error.
#[test]
fn shared_flags_only_where_they_do_something() {
    let help = |args: &[&str]| {
        let (code, stdout, stderr) = run(args);
        assert_eq!(code, 0, "{args:?}: {stderr}");
        stdout
    };
    for tool in ["runqlat", "profile", "argdist", "gethostlatency"] {
        let h = help(&[tool, "--help"]);
        for flag in ["--verbose", "--json", "--no-task-storage"] {
            assert!(h.contains(flag), "{tool} --help lacks {flag}");
        }
    }
    for command in [
        &["flamegraph", "--help"][..],
        &["flamegraph", "diff", "--help"],
    ] {
        let h = help(command);
        for flag in ["--verbose", "--json", "--no-task-storage"] {
            assert!(!h.contains(flag), "{command:?} offers {flag}");
        }
    }
    let h = help(&["exporter", "--help"]);
    assert!(h.contains("--verbose") && !h.contains("--json"), "{h}");
    let h = help(&["doctor", "--help"]);
    assert!(h.contains("--json") && !h.contains("--verbose"), "{h}");
    for args in [
        &["flamegraph", "--json", "x.folded", "--svg", "x.svg"][..],
        &["flamegraph", "diff", "-v", "a", "b", "--svg", "d.svg"],
        &["exporter", "--json"],
    ] {
        let (code, _, stderr) = run(args);
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert!(stderr.starts_with("error: unexpected argument"), "{stderr}");
    }
}

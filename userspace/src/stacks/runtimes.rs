//! Which runtime a program is, from its file alone, before it runs: so
//! that `profile -- node app.js` (or `-- python3`, `-- java`, or a script
//! whose `#!` line names one of them) has the walk through that runtime's
//! frames loaded before the command starts, and its first samples are
//! walked whole instead of taken while the verifier works.
//!
//! The finders ([`super::python`], [`super::java`], [`super::v8`]) still
//! decide, from the running process, whether its frames are walked; this
//! only guesses early. A wrong guess costs a load at the start; a missed
//! one costs what a process found later costs: its first samples keep
//! native frames.

use std::{
    ffi::OsStr,
    io::Read as _,
    path::{Path, PathBuf},
};

use rtrace_common::unwind::{RUNTIME_JAVA, RUNTIME_PYTHON, RUNTIME_V8, Runtimes};

/// How many `#!` lines are followed (a script that runs a script).
const MAX_SHEBANGS: usize = 4;

/// The runtimes whose frames program `argv0` (a command's first word,
/// looked up on `path_var` as `execvp` does when it has no slash) will
/// run, as far as its file says: its name, the interpreter on its `#!`
/// line (`env NAME` looked up too), or the libraries it links. 0 for
/// none, or a file that cannot be read.
pub fn of_command(argv0: &OsStr, path_var: &OsStr) -> Runtimes {
    let Some(mut file) = lookup(argv0, path_var) else {
        return 0;
    };
    for _ in 0..MAX_SHEBANGS {
        let file_real = std::fs::canonicalize(&file).unwrap_or(file.clone());
        let by_name = by_name(&file_real) | by_name(&file);
        if by_name != 0 {
            return by_name;
        }
        let mut head = [0u8; 256];
        let n = std::fs::File::open(&file_real)
            .and_then(|mut f| f.read(&mut head))
            .unwrap_or(0);
        let head = &head[..n];
        if head.starts_with(b"\x7fELF") {
            return by_libraries(&file_real);
        }
        let Some(next) = interpreter(head, path_var) else {
            return 0;
        };
        file = next;
    }
    0
}

/// The runtimes of the processes running now, each known by its
/// program's name (`/proc/PID/exe`, as [`of_command`] knows a command's),
/// rtrace's own left out: for a run over the whole system, whose walk
/// through those runtimes' frames is then loaded before it samples. A
/// program that embeds a runtime under another name is found at its
/// first sample, as any process started later is.
pub fn of_running() -> Runtimes {
    let me = std::process::id();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .filter_map(crate::kernel::exe_of)
        .fold(0, |found, exe| found | by_name(&exe))
}

/// The file `argv0` names: a path if it has a slash, else the first
/// executable of that name in `path_var`'s directories.
fn lookup(argv0: &OsStr, path_var: &OsStr) -> Option<PathBuf> {
    let name = Path::new(argv0);
    if argv0.as_encoded_bytes().contains(&b'/') {
        return name.is_file().then(|| name.to_owned());
    }
    std::env::split_paths(path_var)
        .map(|dir| dir.join(name))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The program a `#!` line runs: its path, or with `/usr/bin/env` (and
/// its `-S`) the first word after it that is no option, looked up.
fn interpreter(head: &[u8], path_var: &OsStr) -> Option<PathBuf> {
    let line = head.strip_prefix(b"#!")?;
    let line = &line[..line.iter().position(|&b| b == b'\n')?];
    let line = std::str::from_utf8(line).ok()?;
    let mut words = line.split_ascii_whitespace();
    let first = words.next()?;
    if Path::new(first).file_name() != Some(OsStr::new("env")) {
        return Some(PathBuf::from(first));
    }
    let prog = words.find(|w| !w.starts_with('-') && !w.contains('='))?;
    lookup(OsStr::new(prog), path_var)
}

/// By the file's name, as the finders know their runtimes' programs.
pub(crate) fn by_name(file: &Path) -> Runtimes {
    let Some(name) = file.file_name().and_then(OsStr::to_str) else {
        return 0;
    };
    if name == "node" || name == "nodejs" {
        RUNTIME_V8
    } else if name == "java" {
        RUNTIME_JAVA
    } else if name.strip_prefix("python").is_some_and(|v| {
        v.is_empty() || v.starts_with('3') && v.bytes().all(|b| b.is_ascii_digit() || b == b'.')
    }) {
        RUNTIME_PYTHON
    } else {
        0
    }
}

/// By the libraries an ELF program links: a program that embeds
/// CPython (`libpython3.*`), V8 (`libnode.so.*`) or the JVM (the
/// launcher's `libjli.so`, or `libjvm.so`).
fn by_libraries(file: &Path) -> Runtimes {
    needed(file)
        .iter()
        .map(|lib| {
            if lib.starts_with("libpython3") {
                RUNTIME_PYTHON
            } else if lib.starts_with("libnode.so") {
                RUNTIME_V8
            } else if lib == "libjli.so" || lib == "libjvm.so" {
                RUNTIME_JAVA
            } else {
                0
            }
        })
        .fold(0, |a, b| a | b)
}

/// The `DT_NEEDED` names of an ELF file, reading only the parts asked
/// for (a node binary is 100 MB).
fn needed(file: &Path) -> Vec<String> {
    use object::read::elf::{Dyn as _, ElfFile64};
    let Ok(f) = std::fs::File::open(file) else {
        return Vec::new();
    };
    let data = object::read::ReadCache::new(f);
    let Ok(elf) = ElfFile64::<object::Endianness, _>::parse(&data) else {
        return Vec::new();
    };
    let endian = elf.endian();
    let sections = elf.elf_section_table();
    let Ok(Some((dynamic, link))) = sections.dynamic(endian, &data) else {
        return Vec::new();
    };
    let Ok(strings) = sections.strings(endian, &data, link) else {
        return Vec::new();
    };
    dynamic
        .iter()
        .filter(|d| d.tag32(endian) == Some(object::elf::DT_NEEDED as i32))
        .filter_map(|d| d.string(endian, strings).ok())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path_var() -> std::ffi::OsString {
        std::env::var_os("PATH").unwrap_or_default()
    }

    /// The runtimes on this host are told apart by what their files
    /// say, through the symbolic links Debian puts before them, and a
    /// script names its interpreter's.
    #[test]
    fn the_hosts_runtimes_and_scripts_are_told_by_their_files() {
        let p = path_var();
        let has = |name: &str| lookup(OsStr::new(name), &p).is_some();
        // `cargo xtask setup` installs all three.
        for name in ["python3", "node", "java"] {
            assert!(
                has(name),
                "no {name} on PATH (cargo xtask setup installs it)"
            );
        }
        assert_eq!(of_command(OsStr::new("python3"), &p), RUNTIME_PYTHON);
        assert_eq!(of_command(OsStr::new("node"), &p), RUNTIME_V8);
        // /usr/bin/java is a link through /etc/alternatives.
        assert_eq!(of_command(OsStr::new("java"), &p), RUNTIME_JAVA);
        assert_eq!(of_command(OsStr::new("sh"), &p), 0);
        assert_eq!(of_command(OsStr::new("no-such-program-here"), &p), 0);
        let dir = tempfile::tempdir().unwrap();
        let script = |name: &str, text: &str| {
            use std::os::unix::fs::PermissionsExt as _;
            let f = dir.path().join(name);
            std::fs::write(&f, text).unwrap();
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o755)).unwrap();
            f
        };
        let py = script("tool", "#!/usr/bin/env -S python3 -u\nprint(1)\n");
        assert_eq!(of_command(py.as_os_str(), &p), RUNTIME_PYTHON);
        let direct = script("tool2", "#!/usr/bin/python3\nprint(1)\n");
        assert_eq!(of_command(direct.as_os_str(), &p), RUNTIME_PYTHON);
        let shell = script("tool3", "#!/bin/sh\necho 1\n");
        assert_eq!(of_command(shell.as_os_str(), &p), 0);
        // Through PATH, as execvp finds it.
        let mut with_dir = dir.path().as_os_str().to_owned();
        with_dir.push(":");
        with_dir.push(&p);
        assert_eq!(of_command(OsStr::new("tool"), &with_dir), RUNTIME_PYTHON);
    }

    /// A program that embeds a runtime by linking it is known by its
    /// libraries: the JDK's launcher links `libjli.so`.
    #[test]
    fn a_program_is_known_by_the_libraries_it_links() {
        let p = path_var();
        let java = lookup(OsStr::new("java"), &p).expect("no java on PATH");
        let real = std::fs::canonicalize(java).unwrap();
        assert!(needed(&real).iter().any(|l| l == "libjli.so"), "{real:?}");
        assert_eq!(by_libraries(&real), RUNTIME_JAVA);
        let sh = lookup(OsStr::new("sh"), &p).unwrap();
        let real = std::fs::canonicalize(sh).unwrap();
        assert!(needed(&real).iter().any(|l| l.starts_with("libc.so")));
        assert_eq!(by_libraries(&real), 0);
    }

    /// A running process is known by its program: a python3 started here
    /// is among the runtimes running now.
    #[test]
    fn a_running_process_is_known_by_its_program() {
        let p = path_var();
        let python = lookup(OsStr::new("python3"), &p).expect("no python3 on PATH");
        // Waited for: `python3` may be a shim that runs the interpreter
        // only later.
        let mut child = std::process::Command::new(python)
            .args([
                "-c",
                "import time; print('ready', flush=True); time.sleep(30)",
            ])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut ready = [0u8; 5];
        child.stdout.take().unwrap().read_exact(&mut ready).unwrap();
        assert_eq!(&ready, b"ready");
        let found = of_running();
        let _ = child.kill();
        let _ = child.wait();
        assert_ne!(found & RUNTIME_PYTHON, 0, "{found:#x}");
    }
}

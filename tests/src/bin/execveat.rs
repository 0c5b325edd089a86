//! Runs a program through execveat(2) on an `O_PATH` descriptor with
//! `AT_EMPTY_PATH`, the way fexecve(3) and container runtimes do:
//! `execveat PATH ARG...` (argv[0] is PATH).

use std::ffi::CString;

fn main() {
    let args: Vec<CString> = std::env::args()
        .skip(1)
        .map(|a| CString::new(a).expect("no NUL in arguments"))
        .collect();
    assert!(!args.is_empty(), "usage: execveat PATH ARG...");
    let mut argv: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let envp: [*const libc::c_char; 1] = [std::ptr::null()];
    // SAFETY: plain syscalls on valid, NUL-terminated strings and arrays.
    unsafe {
        let fd = libc::open(args[0].as_ptr(), libc::O_PATH | libc::O_CLOEXEC);
        assert!(fd >= 0, "cannot open {:?}", args[0]);
        let empty = c"";
        libc::syscall(
            libc::SYS_execveat,
            fd,
            empty.as_ptr(),
            argv.as_ptr(),
            envp.as_ptr(),
            libc::AT_EMPTY_PATH,
        );
    }
    eprintln!("execveat failed: {}", std::io::Error::last_os_error());
    std::process::exit(1);
}

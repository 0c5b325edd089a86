//! Reading a process's memory while it lives, for the runtimes whose
//! frames the kernel walks (CPython's, the JVM's, V8's): what their
//! names need that the kernel did not copy.
//!
//! `/proc/PID/mem` is the way when rtrace may ptrace the process. Where
//! it may not (CAP_BPF and CAP_PERFMON without CAP_SYS_PTRACE, as the
//! exporter's service runs, and another user's process), the kernel
//! reads for it: a sleepable task iterator bound to the process copies
//! each range with `bpf_copy_from_user_task`, which asks for no ptrace
//! right (`rtrace_common::procmem`). That costs a few system calls a
//! read, so it is only the fallback.

use std::{
    fs::File,
    io::Read as _,
    os::{
        fd::{AsFd as _, AsRawFd as _, FromRawFd as _, OwnedFd},
        unix::fs::FileExt as _,
    },
    sync::Mutex,
};

use aya::{
    Ebpf,
    maps::{Array, MapData},
    programs::Iter,
};
use rtrace_common::procmem::{PROCMEM_MAX, PROCMEM_REQUEST, PROG_PROCMEM_READ, Request};

use crate::kernel::{
    batch::{BPF_ITER_CREATE, BPF_LINK_CREATE, bpf_fd},
    btf::{AttachTarget, Btf},
    features, objects,
    procmaps::Proc,
};

/// A process's memory, as rtrace may read it.
pub enum Mem {
    /// Open, while the process lives.
    Open(File),
    /// Read through the kernel: `/proc/PID/mem` was closed to rtrace.
    Kernel(KernelMem),
    /// Not to be opened: `/proc/PID/mem` needs ptrace rights over the
    /// process (its user, or CAP_SYS_PTRACE), which CAP_BPF and
    /// CAP_PERFMON do not give, and the kernel could not read for
    /// rtrace either; why, in words.
    Denied(String),
    /// Gone, or not opened for another reason.
    None,
}

/// Opens process `who`'s memory while it lives: through `DIR/mem`,
/// where `dir` is the [`crate::kernel::procmaps::proc_dir`] the caller
/// read the process's mappings from (`/proc/PID`, or a live thread's),
/// else through the kernel.
pub fn open_mem_in(who: Proc, dir: &crate::kernel::procmaps::ProcDir) -> Mem {
    let path = format!("{dir}/mem");
    match File::open(&path) {
        Ok(f) if who.alive() => Mem::Open(f),
        Ok(_) => Mem::None,
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => match KernelMem::open(who) {
            Ok(Some(k)) => Mem::Kernel(k),
            Ok(None) => Mem::None,
            Err(why) => Mem::Denied(format!(
                "{}/mem needs ptrace rights over the process ({e}), and the kernel \
                     cannot read it for rtrace: {why}",
                dir.numbered()
            )),
        },
        Err(_) => Mem::None,
    }
}

impl Mem {
    /// How the memory is read, for `-v`'s line of a process: `""` for
    /// `/proc/PID/mem`, else a clause that begins with `"; "`.
    pub fn how(&self) -> &'static str {
        match self {
            Mem::Kernel(_) => {
                "; its memory read through the kernel, as /proc/PID/mem needs ptrace rights over it"
            }
            _ => "",
        }
    }

    /// `len` bytes at `addr`.
    pub fn read(&self, addr: u64, len: usize) -> Option<Vec<u8>> {
        match self {
            Mem::Open(mem) => {
                let mut buf = vec![0; len];
                mem.read_exact_at(&mut buf, addr).ok()?;
                Some(buf)
            }
            Mem::Kernel(k) => k.read(addr, len),
            Mem::Denied(_) | Mem::None => None,
        }
    }

    /// The `u64` at `addr`.
    pub fn u64(&self, addr: u64) -> Option<u64> {
        Some(u64::from_le_bytes(self.read(addr, 8)?.try_into().ok()?))
    }

    /// The `i32` at `addr`.
    pub fn i32(&self, addr: u64) -> Option<i32> {
        Some(i32::from_le_bytes(self.read(addr, 4)?.try_into().ok()?))
    }

    /// The `u16` at `addr`.
    pub fn u16(&self, addr: u64) -> Option<u16> {
        Some(u16::from_le_bytes(self.read(addr, 2)?.try_into().ok()?))
    }

    /// The NUL-terminated string at `addr` (at most 1024 bytes), read a
    /// page at a time so that one near its mapping's end is read too.
    pub fn cstr(&self, addr: u64) -> Option<String> {
        if addr == 0 {
            return None;
        }
        let mut out = Vec::new();
        let mut at = addr;
        while out.len() < 1024 {
            let len = (0x1000 - (at & 0xfff)).min(256) as usize;
            let chunk = self.read(at, len)?;
            if let Some(end) = chunk.iter().position(|&b| b == 0) {
                out.extend_from_slice(&chunk[..end]);
                return Some(String::from_utf8_lossy(&out).into_owned());
            }
            out.extend_from_slice(&chunk);
            at += len as u64;
        }
        None
    }
}

/// One process's memory, read through the kernel's iterator.
pub struct KernelMem {
    /// The iterator's link, bound to the process by its pid.
    link: OwnedFd,
    /// The process, held by a pidfd: a read counts only if the process
    /// still lives after it, for the link is bound by number, and a pid
    /// reused during the read would lend another process's bytes.
    pidfd: OwnedFd,
}

/// The iterator program and its request map, loaded on the first
/// process whose `/proc/PID/mem` is closed; `Err` says why it cannot be.
/// The lock also orders the passes, which share the one request.
static READER: Mutex<Option<Result<Reader, String>>> = Mutex::new(None);

struct Reader {
    /// Holds the program loaded.
    ebpf: Ebpf,
    request: Array<MapData, Request>,
}

// `BPF_LINK_CREATE` and `BPF_ITER_CREATE` are made directly: aya 0.14
// makes them only without the task iterator's parameters, and only once
// per link.
/// `BPF_TRACE_ITER`, the attach type of iterators.
const BPF_TRACE_ITER: u32 = 28;

/// The `link_create` member of `union bpf_attr`, with an iterator's info.
#[repr(C)]
#[derive(Default)]
struct LinkCreate {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
    iter_info: u64,
    iter_info_len: u32,
    pad: u32,
}

/// `union bpf_iter_link_info`'s `task` member (Linux 6.1+).
#[repr(C)]
struct TaskIterInfo {
    tid: u32,
    pid: u32,
    pid_fd: u32,
}

impl Reader {
    fn load() -> Result<Self, String> {
        let btf = Btf::from_kernel().map_err(|e| format!("no kernel BTF: {e}"))?;
        let target = "bpf_iter_task";
        let id = btf
            .attach_id(AttachTarget::Function(target))
            .ok_or_else(|| format!("the kernel has no {target} (task iterators are 5.8+)"))?;
        let ids = btf.attach_ids(id).map_err(|e| e.to_string())?;
        // Not through `load::Load`, which sits above this module.
        let object = objects::get("procmem").ok_or("no procmem object in this build")?;
        let mut ebpf = features::loader()
            .load(object)
            .map_err(|e| format!("cannot load the procmem object: {e}"))?;
        let prog: &mut Iter = ebpf
            .program_mut(PROG_PROCMEM_READ)
            .ok_or("the procmem object has no iterator program")?
            .try_into()
            .map_err(|e| format!("{e}"))?;
        prog.load("task", &ids).map_err(|e| {
            format!("cannot load its sleepable task iterator (Linux 5.18+ copies other processes' memory): {e}")
        })?;
        let map = ebpf
            .take_map(PROCMEM_REQUEST)
            .ok_or("the procmem object has no request map")?;
        let request = Array::try_from(map).map_err(|e| e.to_string())?;
        Ok(Self { ebpf, request })
    }

    fn prog_fd(&self) -> Option<i32> {
        let prog: &Iter = self.ebpf.program(PROG_PROCMEM_READ)?.try_into().ok()?;
        Some(prog.fd().ok()?.as_fd().as_raw_fd())
    }
}

/// Runs `f` with the reader, loading it first if need be.
fn with_reader<T>(f: impl FnOnce(&mut Reader) -> Result<T, String>) -> Result<T, String> {
    let mut guard = READER.lock().unwrap_or_else(|e| e.into_inner());
    let reader = guard.get_or_insert_with(Reader::load);
    match reader {
        Ok(r) => f(r),
        Err(why) => Err(why.clone()),
    }
}

impl KernelMem {
    /// Binds the kernel's reader to `who`; `None` if it is gone.
    fn open(who: Proc) -> Result<Option<Self>, String> {
        // SAFETY: pidfd_open takes a pid and flags, and returns a new
        // descriptor or -1.
        let r = unsafe { libc::syscall(libc::SYS_pidfd_open, who.pid, 0) };
        if r < 0 {
            return Ok(None);
        }
        // SAFETY: a new descriptor, ours alone.
        let pidfd = unsafe { OwnedFd::from_raw_fd(r as i32) };
        if !who.alive() {
            return Ok(None);
        }
        let link = with_reader(|r| {
            let prog_fd = r.prog_fd().ok_or("its program has no descriptor")?;
            let mut info = TaskIterInfo {
                tid: 0,
                pid: who.pid,
                pid_fd: 0,
            };
            let mut attr = LinkCreate {
                prog_fd: prog_fd as u32,
                attach_type: BPF_TRACE_ITER,
                iter_info: (&raw mut info) as u64,
                iter_info_len: size_of::<TaskIterInfo>() as u32,
                ..LinkCreate::default()
            };
            bpf_fd(BPF_LINK_CREATE, &mut attr).map_err(|e| {
                format!("cannot bind its task iterator to one process (Linux 6.1+): {e}")
            })
        })?;
        Ok(Some(Self { link, pidfd }))
    }

    /// Whether the process has exited (its pidfd reads as ready).
    fn exited(&self) -> bool {
        let mut p = libc::pollfd {
            fd: self.pidfd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, no wait.
        let n = unsafe { libc::poll(&mut p, 1, 0) };
        n != 0
    }

    /// `len` bytes at `addr`.
    fn read(&self, addr: u64, len: usize) -> Option<Vec<u8>> {
        self.try_read(addr, len).ok()
    }

    /// `len` bytes at `addr`, a pass of the iterator per
    /// [`PROCMEM_MAX`] bytes; the error says why not.
    fn try_read(&self, addr: u64, len: usize) -> Result<Vec<u8>, String> {
        let mut out = Vec::with_capacity(len);
        while out.len() < len {
            let at = addr
                .checked_add(out.len() as u64)
                .ok_or("past the address space")?;
            let n = (len - out.len()).min(PROCMEM_MAX);
            out.extend_from_slice(&self.pass(at, n)?);
        }
        if self.exited() {
            return Err("the process exited".to_owned());
        }
        Ok(out)
    }

    /// One pass: `n` bytes (at most [`PROCMEM_MAX`]) at `at`.
    fn pass(&self, at: u64, n: usize) -> Result<Vec<u8>, String> {
        with_reader(|r| {
            let req = Request {
                addr: at,
                len: n as u32,
                done: 0,
            };
            r.request.set(0, req, 0).map_err(|e| e.to_string())?;
            #[repr(C)]
            struct IterCreate {
                link_fd: u32,
                flags: u32,
            }
            let mut attr = IterCreate {
                link_fd: self.link.as_raw_fd() as u32,
                flags: 0,
            };
            let fd = bpf_fd(BPF_ITER_CREATE, &mut attr).map_err(|e| e.to_string())?;
            let mut buf = Vec::with_capacity(n);
            File::from(fd)
                .read_to_end(&mut buf)
                .map_err(|e| e.to_string())?;
            if buf.len() == n {
                Ok(buf)
            } else {
                Err(format!("{n} bytes at {at:#x} are not mapped"))
            }
        })
    }
}

/// Whether the kernel can read a process's memory for rtrace (`doctor`'s
/// `task_memory`): it reads a value of rtrace's own, which must come back
/// as it is.
pub fn self_check() -> Result<(), String> {
    static MARK: [u8; 16] = *b"rtrace task mem\0";
    let me = Proc::now(std::process::id());
    let k = KernelMem::open(me)?.ok_or("rtrace's own process could not be held")?;
    let addr = std::hint::black_box(&MARK).as_ptr() as u64;
    let got = k.try_read(addr, MARK.len())?;
    if got == MARK {
        Ok(())
    } else {
        Err(format!("read {got:?} for {MARK:?}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel's reader gives the bytes `/proc/PID/mem` gives, across
    /// a page boundary and longer than one pass; fails on an unmapped
    /// range; and fails once its process has exited (reads a pid reused
    /// since could lend).
    #[test]
    fn the_kernel_reads_as_proc_pid_mem_does_and_not_past_the_process() {
        let data: Vec<u8> = (0..3 * PROCMEM_MAX).map(|i| (i * 7 % 251) as u8).collect();
        let me = Proc::now(std::process::id());
        let k = KernelMem::open(me).unwrap().unwrap();
        let addr = data.as_ptr() as u64 + 100;
        let len = 2 * PROCMEM_MAX + 5;
        let mem = std::fs::File::open("/proc/self/mem").unwrap();
        let mut want = vec![0; len];
        mem.read_exact_at(&mut want, addr).unwrap();
        let t = std::time::Instant::now();
        let got = k.try_read(addr, len).unwrap();
        assert_eq!(got, want);
        let rounds = 200;
        for _ in 0..rounds {
            k.try_read(addr, 64).unwrap();
        }
        let kernel = t.elapsed() / rounds;
        let t = std::time::Instant::now();
        let mut small = [0u8; 64];
        for _ in 0..rounds {
            mem.read_exact_at(&mut small, addr).unwrap();
        }
        eprintln!(
            "64 bytes: {kernel:?} through the kernel, {:?} through /proc/self/mem",
            t.elapsed() / rounds
        );
        assert!(k.try_read(8, 8).is_err(), "page 0 is never mapped");

        let mut child = std::process::Command::new("sleep")
            .arg("10")
            .spawn()
            .unwrap();
        let who = Proc::now(child.id());
        let k = KernelMem::open(who).unwrap().unwrap();
        // sleep's own text, once exec has mapped it (`spawn` may return
        // before the maps show it).
        let text = loop {
            let maps = crate::kernel::procmaps::read(Some(child.id())).unwrap();
            if let Some(m) = maps
                .into_iter()
                .find(|m| m.exec && m.name.ends_with("/sleep"))
            {
                break m;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        };
        let mut want = [0u8; 16];
        let theirs = std::fs::File::open(format!("/proc/{}/mem", child.id())).unwrap();
        theirs.read_exact_at(&mut want, text.start).unwrap();
        assert_eq!(k.try_read(text.start, 16).unwrap(), want);
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(k.try_read(text.start, 16).is_err());
    }
}

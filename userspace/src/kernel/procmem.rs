//! Reading a process's memory through `/proc/PID/mem` while it lives,
//! for the runtimes whose frames the kernel walks (CPython's, the
//! JVM's): what their names need that the kernel did not copy.

use std::{fs::File, os::unix::fs::FileExt as _};

use crate::kernel::procmaps::Proc;

/// A process's memory, as rtrace may read it.
pub enum Mem {
    /// Open, while the process lives.
    Open(File),
    /// Not to be opened: `/proc/PID/mem` needs ptrace rights over the
    /// process (its user, or CAP_SYS_PTRACE), which CAP_BPF and
    /// CAP_PERFMON do not give; why, in words.
    Denied(String),
    /// Gone, or not opened for another reason.
    None,
}

/// Opens process `who`'s memory while it lives.
pub fn open_mem(who: Proc) -> Mem {
    let path = format!("/proc/{}/mem", who.pid);
    match File::open(&path) {
        Ok(f) if who.alive() => Mem::Open(f),
        Ok(_) => Mem::None,
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            Mem::Denied(format!("{path} needs ptrace rights over the process ({e})"))
        }
        Err(_) => Mem::None,
    }
}

impl Mem {
    /// `len` bytes at `addr`.
    pub fn read(&self, addr: u64, len: usize) -> Option<Vec<u8>> {
        let Mem::Open(mem) = self else {
            return None;
        };
        let mut buf = vec![0; len];
        mem.read_exact_at(&mut buf, addr).ok()?;
        Some(buf)
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

//! USDT probes (`u:` in argdist): the probes a program declares with
//! `<sys/sdt.h>`, read from its `.note.stapsdt` notes, attached as uprobes
//! at their addresses, with their semaphores raised by the kernel
//! (`ref_ctr_offset`, 4.20+) while attached.
//!
//! A note gives the probe's address, the address of `.stapsdt.base` when
//! the note was written (a prelinked file moved since), its semaphore's
//! address, and its arguments in the assembler's syntax: `-4@%edi`,
//! `8@-16(%rbp)`, `4@$5`, with a size negative for signed values.

use std::{
    fs::File,
    os::fd::{AsFd as _, AsRawFd as _, FromRawFd as _, OwnedFd},
    path::Path,
};

use anyhow::Context as _;
use aya::Ebpf;
use object::{Object as _, ObjectSection as _};

/// Where one argument of a probe is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Location {
    /// In a register, at this offset of the saved `struct pt_regs`.
    Register(u32),
    /// In memory at a register (its `pt_regs` offset) plus a displacement.
    Memory(u32, i64),
    /// A constant.
    Constant(i64),
}

/// One argument: where it is, its size in bytes and its signedness.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arg {
    /// Where.
    pub location: Location,
    /// Bytes (1, 2, 4 or 8).
    pub size: u32,
    /// Signed.
    pub signed: bool,
}

/// One site of a probe in a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Site {
    /// The provider (`rtrace` in `rtrace:tick`).
    pub provider: String,
    /// The probe's name.
    pub name: String,
    /// File offset of the probe's instruction, for the uprobe.
    pub offset: u64,
    /// File offset of its semaphore; 0 for none.
    pub semaphore: u64,
    /// Its arguments, as written in the note.
    pub args_text: String,
}

/// `struct pt_regs` offsets of x86-64's registers, by every name the
/// assembler gives their parts.
fn register(name: &str) -> Option<u32> {
    use rtrace_common::argdist::regs;
    Some(match name {
        "rax" | "eax" | "ax" | "al" => regs::AX,
        "rbx" | "ebx" | "bx" | "bl" => regs::BX,
        "rcx" | "ecx" | "cx" | "cl" => regs::CX,
        "rdx" | "edx" | "dx" | "dl" => regs::DX,
        "rsi" | "esi" | "si" | "sil" => regs::SI,
        "rdi" | "edi" | "di" | "dil" => regs::DI,
        "rbp" | "ebp" | "bp" | "bpl" => regs::BP,
        "rsp" | "esp" | "sp" | "spl" => regs::SP,
        "rip" => regs::IP,
        other => {
            // r8..r15 and their d, w and b parts.
            let n = other
                .strip_prefix('r')?
                .trim_end_matches(['d', 'w', 'b'])
                .parse::<u32>()
                .ok()?;
            [
                regs::R8,
                regs::R9,
                regs::R10,
                regs::R11,
                regs::R12,
                regs::R13,
                regs::R14,
                regs::R15,
            ]
            .get(n.checked_sub(8)? as usize)
            .copied()?
        }
    })
}

/// Parses one argument: `[-]SIZE@OPERAND`.
pub fn parse_arg(text: &str) -> Result<Arg, String> {
    let (size, operand) = text
        .split_once('@')
        .ok_or_else(|| format!("argument {text:?} has no SIZE@"))?;
    let size: i32 = size
        .parse()
        .map_err(|_| format!("argument {text:?}: bad size"))?;
    let (signed, size) = (size < 0, size.unsigned_abs());
    if ![1, 2, 4, 8].contains(&size) {
        return Err(format!("argument {text:?}: {size} bytes"));
    }
    let unsupported = || format!("argument location {operand:?} is not supported");
    let location = if let Some(imm) = operand.strip_prefix('$') {
        Location::Constant(parse_int(imm).ok_or_else(unsupported)?)
    } else if let Some(reg) = operand.strip_prefix('%') {
        Location::Register(register(reg).ok_or_else(unsupported)?)
    } else {
        // `disp(%reg)` or `(%reg)`; no index registers, no symbols.
        let (disp, rest) = operand.split_once('(').ok_or_else(unsupported)?;
        let reg = rest
            .strip_suffix(')')
            .and_then(|r| r.strip_prefix('%'))
            .ok_or_else(unsupported)?;
        let reg = register(reg)
            .filter(|&r| r != rtrace_common::argdist::regs::IP)
            .ok_or_else(unsupported)?;
        let disp = if disp.is_empty() {
            0
        } else {
            parse_int(disp).ok_or_else(unsupported)?
        };
        Location::Memory(reg, disp)
    };
    Ok(Arg {
        location,
        size,
        signed,
    })
}

fn parse_int(text: &str) -> Option<i64> {
    let (neg, digits) = match text.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, text),
    };
    let n = match digits.strip_prefix("0x") {
        Some(h) => i64::from_str_radix(h, 16).ok()?,
        None => digits.parse().ok()?,
    };
    Some(if neg { -n } else { n })
}

/// The arguments of a site.
pub fn args(site: &Site) -> Result<Vec<Arg>, String> {
    site.args_text.split_whitespace().map(parse_arg).collect()
}

/// Every probe site in ELF file `path`.
pub fn sites(path: &Path) -> anyhow::Result<Vec<Site>> {
    let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let data = crate::kernel::memory::Mapped::of(&file)?;
    let elf = object::File::parse(&*data)
        .map_err(|e| anyhow::anyhow!("{} is not an ELF file: {e}", path.display()))?;
    let base = elf.section_by_name(".stapsdt.base").map(|s| s.address());
    let to_offset = |addr: u64| crate::kernel::elf::vaddr_to_offset(&elf, addr);
    let mut out = Vec::new();
    let Some(notes) = elf.section_by_name(".note.stapsdt") else {
        return Ok(out);
    };
    let bytes = notes.data()?;
    let mut at = 0usize;
    let word = |b: &[u8], i: usize| -> Option<u32> {
        Some(u32::from_le_bytes(b.get(i..i + 4)?.try_into().ok()?))
    };
    let quad = |b: &[u8], i: usize| -> Option<u64> {
        Some(u64::from_le_bytes(b.get(i..i + 8)?.try_into().ok()?))
    };
    let align = |n: usize| (n + 3) & !3;
    while let (Some(namesz), Some(descsz), Some(kind)) =
        (word(bytes, at), word(bytes, at + 4), word(bytes, at + 8))
    {
        let name_at = at + 12;
        let desc_at = name_at + align(namesz as usize);
        let next = desc_at + align(descsz as usize);
        let owner = bytes.get(name_at..name_at + namesz as usize);
        let desc = bytes.get(desc_at..desc_at + descsz as usize);
        at = next;
        const NT_STAPSDT: u32 = 3;
        let (Some(owner), Some(desc)) = (owner, desc) else {
            break;
        };
        if kind != NT_STAPSDT || owner != b"stapsdt\0" {
            continue;
        }
        let (Some(pc), Some(note_base), Some(sem)) = (quad(desc, 0), quad(desc, 8), quad(desc, 16))
        else {
            continue;
        };
        let mut texts = desc[24..].split(|&b| b == 0).map(String::from_utf8_lossy);
        let (Some(provider), Some(name)) = (texts.next(), texts.next()) else {
            continue;
        };
        let args_text = texts.next().unwrap_or_default().into_owned();
        // A file prelinked since the note was written moved its base.
        let pc = match base {
            Some(b) if note_base != 0 => pc.wrapping_add(b).wrapping_sub(note_base),
            _ => pc,
        };
        let Some(offset) = to_offset(pc) else {
            continue;
        };
        out.push(Site {
            provider: provider.into_owned(),
            name: name.into_owned(),
            offset,
            semaphore: if sem == 0 {
                0
            } else {
                to_offset(sem).unwrap_or(0)
            },
            args_text,
        });
    }
    Ok(out)
}

/// A probe found in a file: what the spec is compiled against, and where
/// it is attached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// The file, as the probe is attached in it.
    pub file: std::path::PathBuf,
    /// Every site.
    pub sites: Vec<Site>,
    /// Its arguments, the same at every site.
    pub args: Vec<Arg>,
}

/// The sites of probe `name` in `path` (`PROVIDER.NAME` or `NAME`), which
/// must all keep their arguments in the same places: the program reads
/// them one way.
pub fn find(path: &Path, name: &str) -> Result<Probe, String> {
    let all = sites(path).map_err(|e| format!("{e:#}"))?;
    let (provider, probe) = match name.split_once('.') {
        Some((p, n)) => (Some(p), n),
        None => (None, name),
    };
    let found: Vec<Site> = all
        .iter()
        .filter(|s| s.name == probe && provider.is_none_or(|p| p == s.provider))
        .cloned()
        .collect();
    let Some(first) = found.first() else {
        let mut known: Vec<String> = all
            .iter()
            .map(|s| format!("{}.{}", s.provider, s.name))
            .collect();
        known.sort();
        known.dedup();
        return Err(if known.is_empty() {
            format!("{} has no USDT probes", path.display())
        } else {
            format!(
                "no USDT probe {name:?} in {} (it has {})",
                path.display(),
                known.join(", ")
            )
        });
    };
    let args = args(first)?;
    for s in &found[1..] {
        if self::args(s)? != args {
            return Err(format!(
                "probe {name:?} has {} sites whose arguments are in different places \
                 ({:?} and {:?}); reading them per site is not supported yet",
                found.len(),
                first.args_text,
                s.args_text
            ));
        }
    }
    Ok(Probe {
        file: path.to_owned(),
        sites: found,
        args,
    })
}

/// Attaches uprobe program `prog` at `site` of `path` (in process `pid`
/// only, or everywhere), with the kernel raising the site's semaphore
/// while attached. The returned descriptor keeps it attached.
pub fn attach(
    ebpf: &mut Ebpf,
    prog: &str,
    path: &Path,
    site: &Site,
    pid: Option<u32>,
) -> anyhow::Result<OwnedFd> {
    let p = crate::probes::uprobes::loaded(ebpf, prog)?;
    let prog_fd = p.fd()?.as_fd().as_raw_fd();
    let pmu = "/sys/bus/event_source/devices/uprobe";
    let ty: u32 = std::fs::read_to_string(format!("{pmu}/type"))
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .with_context(|| format!("uprobes need {pmu}/type, which this kernel lacks"))?;
    if site.semaphore != 0 {
        let format =
            std::fs::read_to_string(format!("{pmu}/format/ref_ctr_offset")).unwrap_or_default();
        if format.trim() != "config:32-63" {
            anyhow::bail!(
                "USDT probe {}.{} has a semaphore, which needs uprobe reference counters \
                 (Linux 4.20+); this kernel has none",
                site.provider,
                site.name
            );
        }
    }
    let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())?;
    // struct perf_event_attr, as words: type and size, config (the
    // semaphore's offset in its top half), then config1 (the path) and
    // config2 (the offset) at bytes 56 and 64.
    const ATTR_SIZE: u64 = 112;
    let mut attr = [0u64; 16];
    attr[0] = u64::from(ty) | (ATTR_SIZE << 32);
    attr[1] = site.semaphore << 32;
    attr[7] = c_path.as_ptr() as u64;
    attr[8] = site.offset;
    let (pid, cpu) = match pid {
        Some(p) => (p as i32, -1),
        None => (-1, 0),
    };
    const PERF_FLAG_FD_CLOEXEC: u64 = 8;
    // SAFETY: `attr` and `c_path` outlive the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            attr.as_ptr(),
            pid,
            cpu,
            -1,
            PERF_FLAG_FD_CLOEXEC,
        )
    };
    if fd < 0 {
        anyhow::bail!(
            "cannot attach to USDT probe {}.{} in {}: {}",
            site.provider,
            site.name,
            path.display(),
            std::io::Error::last_os_error()
        );
    }
    // SAFETY: a descriptor just opened, owned from here.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    // `Ioctl` is c_ulong on glibc and c_int on musl.
    const PERF_EVENT_IOC_SET_BPF: libc::Ioctl = 0x4004_2408;
    const PERF_EVENT_IOC_ENABLE: libc::Ioctl = 0x2400;
    // SAFETY: ioctls on the perf event just opened.
    let ok = unsafe {
        libc::ioctl(fd.as_raw_fd(), PERF_EVENT_IOC_SET_BPF, prog_fd) == 0
            && libc::ioctl(fd.as_raw_fd(), PERF_EVENT_IOC_ENABLE, 0) == 0
    };
    if !ok {
        anyhow::bail!(
            "cannot run the program at USDT probe {}.{}: {}",
            site.provider,
            site.name,
            std::io::Error::last_os_error()
        );
    }
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_in_the_assemblers_syntax() {
        let a = |t| parse_arg(t).unwrap();
        assert_eq!(
            a("-4@%edi"),
            Arg {
                location: Location::Register(112),
                size: 4,
                signed: true
            }
        );
        assert_eq!(a("8@%r12").location, Location::Register(24));
        assert_eq!(a("8@%r9").location, Location::Register(64));
        assert_eq!(a("1@%r15b").location, Location::Register(0));
        assert_eq!(a("-4@-4(%rsp)").location, Location::Memory(152, -4));
        assert_eq!(a("8@(%rax)").location, Location::Memory(80, 0));
        assert_eq!(a("8@0x10(%rbp)").location, Location::Memory(32, 16));
        assert_eq!(a("4@$-5").location, Location::Constant(-5));
        assert!(parse_arg("8@foo(%rip)").is_err());
        assert!(parse_arg("8@8(%rax,%rbx,2)").is_err());
        assert!(parse_arg("3@%rax").is_err());
    }
}

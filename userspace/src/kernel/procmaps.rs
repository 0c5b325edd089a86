//! Reading a process's mappings (`/proc/PID/maps`): one parser for the
//! symbolizer, the unwinder, uprobe targets and the mechanism probes.

/// One line of `/proc/PID/maps`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    /// First address.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// Whether the mapping is executable.
    pub exec: bool,
    /// Offset of `start` in the mapped file.
    pub offset: u64,
    /// The file's inode, 0 for anonymous memory.
    pub inode: u64,
    /// The file's device, as `major:minor` (`fe:01`).
    pub dev: (u32, u32),
    /// The path as the kernel shows it (`/usr/lib/x.so`, `[vdso]`, and a
    /// ` (deleted)` suffix for replaced files), or empty.
    pub name: String,
}

impl Mapping {
    /// Parses one line.
    pub fn parse(line: &str) -> Option<Self> {
        let mut fields = line.splitn(6, ' ');
        let (start, end) = fields.next()?.split_once('-')?;
        let perms = fields.next()?;
        let offset = u64::from_str_radix(fields.next()?, 16).ok()?;
        let (major, minor) = fields.next()?.split_once(':')?;
        let dev = (
            u32::from_str_radix(major, 16).ok()?,
            u32::from_str_radix(minor, 16).ok()?,
        );
        let inode = fields.next()?.parse().ok()?;
        Some(Self {
            start: u64::from_str_radix(start, 16).ok()?,
            end: u64::from_str_radix(end, 16).ok()?,
            exec: perms.as_bytes().get(2) == Some(&b'x'),
            offset,
            inode,
            dev,
            name: fields.next().unwrap_or("").trim_start().to_owned(),
        })
    }

    /// The range as `/proc/PID/map_files` names it.
    pub fn range(&self) -> String {
        format!("{:x}-{:x}", self.start, self.end)
    }

    /// The file's path without the kernel's ` (deleted)` mark, if it is a
    /// file.
    pub fn path(&self) -> Option<&str> {
        (self.inode != 0 && self.name.starts_with('/'))
            .then(|| self.name.strip_suffix(" (deleted)").unwrap_or(&self.name))
    }

    /// Opens the mapped file of process `proc_dir` (`/proc/PID` or
    /// `/proc/self`): through `map_files`, which crosses mount namespaces
    /// and finds deleted or replaced files but needs CAP_SYS_ADMIN, else
    /// through the process's root, which needs leave to trace it
    /// (CAP_SYS_PTRACE for another user's), else by its path here, taken
    /// only if the file there is the one mapped (the same device and
    /// inode): an unprivileged profile of root's processes still opens the
    /// libraries every user may read. The error is the first way's when
    /// no way worked.
    pub fn open(&self, proc_dir: &str) -> std::io::Result<std::fs::File> {
        use std::os::unix::fs::MetadataExt as _;
        let Some(path) = self.path() else {
            return Err(std::io::Error::from(std::io::ErrorKind::NotFound));
        };
        let first = match std::fs::File::open(format!("{proc_dir}/map_files/{}", self.range())) {
            Ok(f) => return Ok(f),
            Err(e) => e,
        };
        if let Ok(f) = std::fs::File::open(format!("{proc_dir}/root{path}")) {
            return Ok(f);
        }
        let here = std::fs::File::open(path)
            .and_then(|f| Ok((f.metadata()?, f)))
            .ok()
            .filter(|(meta, _)| {
                let dev = meta.dev();
                meta.ino() == self.inode && (libc::major(dev), libc::minor(dev)) == self.dev
            });
        match here {
            Some((_, f)) => Ok(f),
            None => Err(first),
        }
    }

    /// Whether `addr` is in the mapping.
    pub fn contains(&self, addr: u64) -> bool {
        self.start <= addr && addr < self.end
    }
}

/// Whether task `id` (a process or a thread) still exists: `/proc/ID` is
/// there for threads as well, though only processes are listed.
pub fn alive(id: u32) -> bool {
    std::path::Path::new(&format!("/proc/{id}")).exists()
}

/// The mappings of process `pid` (`None` for this process).
pub fn read(pid: Option<u32>) -> std::io::Result<Vec<Mapping>> {
    let path = match pid {
        Some(p) => format!("/proc/{p}/maps"),
        None => "/proc/self/maps".to_owned(),
    };
    Ok(std::fs::read_to_string(path)?
        .lines()
        .filter_map(Mapping::parse)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::Mapping;

    #[test]
    fn lines_parse_with_and_without_names() {
        let m = Mapping::parse(
            "7f3e2c000000-7f3e2c028000 r-xp 00028000 fe:01 1049118    /usr/lib/x86_64-linux-gnu/libc.so.6 (deleted)",
        )
        .unwrap();
        assert_eq!(
            (m.start, m.end, m.offset, m.inode, m.dev),
            (0x7f3e2c000000, 0x7f3e2c028000, 0x28000, 1049118, (0xfe, 1))
        );
        assert!(m.exec);
        assert_eq!(m.path(), Some("/usr/lib/x86_64-linux-gnu/libc.so.6"));
        assert_eq!(m.range(), "7f3e2c000000-7f3e2c028000");
        let anon = Mapping::parse("7ffd1000-7ffd2000 rw-p 00000000 00:00 0 ").unwrap();
        assert!(!anon.exec);
        assert_eq!(anon.path(), None);
        let vdso = Mapping::parse("7ffd3000-7ffd5000 r-xp 00000000 00:00 0    [vdso]").unwrap();
        assert_eq!(vdso.path(), None);
        assert!(Mapping::parse("garbage").is_none());
    }
}

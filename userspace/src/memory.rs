//! Handing memory back to the system once set-up is over, and reading
//! large files without copying them.
//!
//! Set-up reads large things once (the kernel's BTF, tracefs formats, the
//! objects' relocations) and frees them, but glibc keeps freed heap pages
//! mapped, so a long-running tool would carry set-up's peak for its whole
//! run. On a fleet, where rtrace runs on every host, that is what counts.

/// Returns the heap's free pages to the system.
pub fn release_free() {
    // SAFETY: malloc_trim only gives free memory back; it has no
    // preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// A file's bytes, mapped where the file allows it (copying nothing, and
/// reading only the pages used), else read.
pub enum Mapped {
    /// A private read-only mapping.
    Mapped {
        /// Its first byte.
        ptr: *const u8,
        /// Its length.
        len: usize,
    },
    /// The bytes read.
    Read(Vec<u8>),
}

impl Mapped {
    /// Maps or reads the file at `path`.
    pub fn open(path: &std::path::Path) -> std::io::Result<Self> {
        Self::of(&std::fs::File::open(path)?)
    }

    /// Maps or reads `file`. The kernel's BTF can be mapped since 6.16
    /// (privately); regular files always can.
    pub fn of(file: &std::fs::File) -> std::io::Result<Self> {
        use std::os::fd::AsRawFd as _;
        let len = file.metadata()?.len() as usize;
        if len > 0 {
            // SAFETY: a private read-only mapping of an open file, unmapped
            // in `drop`. The files mapped (kernel BTF, executables and
            // libraries that processes run) are not written while mapped.
            let ptr = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ,
                    libc::MAP_PRIVATE,
                    file.as_raw_fd(),
                    0,
                )
            };
            if ptr != libc::MAP_FAILED {
                return Ok(Self::Mapped {
                    ptr: ptr.cast(),
                    len,
                });
            }
        }
        let mut data = Vec::with_capacity(len);
        std::io::Read::read_to_end(&mut &*file, &mut data)?;
        Ok(Self::Read(data))
    }
}

impl std::ops::Deref for Mapped {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            // SAFETY: the mapping is `len` readable bytes until dropped.
            Self::Mapped { ptr, len } => unsafe { std::slice::from_raw_parts(*ptr, *len) },
            Self::Read(v) => v,
        }
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        if let Self::Mapped { ptr, len } = *self {
            // SAFETY: unmaps the mapping made in `of`, once.
            unsafe { libc::munmap(ptr.cast_mut().cast(), len) };
        }
    }
}

impl std::fmt::Debug for Mapped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Mapped({} bytes)", self.len())
    }
}

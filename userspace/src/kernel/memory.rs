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
    #[cfg(target_env = "gnu")]
    unsafe {
        libc::malloc_trim(0);
    }
    // musl's allocator (the static build's) unmaps freed pages itself.
}

/// Maps `len` bytes of `fd` from byte `offset` (a multiple of the page
/// size).
fn map_fd(
    fd: std::os::fd::BorrowedFd<'_>,
    offset: usize,
    len: usize,
    prot: i32,
    flags: i32,
) -> std::io::Result<*mut libc::c_void> {
    use std::os::fd::AsRawFd as _;
    if len == 0 {
        return Err(std::io::ErrorKind::InvalidInput.into());
    }
    let offset = libc::off_t::try_from(offset).map_err(|_| std::io::ErrorKind::InvalidInput)?;
    // SAFETY: maps an open descriptor; the caller unmaps it.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            prot,
            flags,
            fd.as_raw_fd(),
            offset,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    Ok(ptr)
}

/// The size of a page.
fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(page).unwrap_or(4096)
}

/// The elements of a BPF array created with `BPF_F_MMAPABLE`, written in
/// place through a shared mapping: no syscall per element, and the
/// programs see each store at once.
///
/// A write maps only the pages it touches, and unmaps them after. The
/// kernel maps all of an array's pages the moment it is mapped, so a
/// mapping of the whole array kept for the run counted every page of it,
/// written or not, as rtrace's resident memory: the unwinder's tables, 49
/// MB of the exporter's 70 MB. That memory is the map's, in the kernel,
/// whether rtrace maps it or not (`bpftool map` shows it).
pub struct SharedArray<T> {
    fd: std::os::fd::OwnedFd,
    len: usize,
    of: std::marker::PhantomData<T>,
}

impl<T: Copy> SharedArray<T> {
    /// The `len` elements of the array map behind `fd`.
    pub fn of(fd: std::os::fd::BorrowedFd<'_>, len: usize) -> std::io::Result<Self> {
        Ok(Self {
            fd: fd.try_clone_to_owned()?,
            len,
            of: std::marker::PhantomData,
        })
    }

    /// Writes `values` from element `at` on.
    pub fn write(&mut self, at: usize, values: &[T]) -> std::io::Result<()> {
        use std::os::fd::AsFd as _;
        if values.is_empty() {
            return Ok(());
        }
        if at + values.len() > self.len {
            return Err(std::io::ErrorKind::InvalidInput.into());
        }
        let start = at * size_of::<T>();
        let bytes = size_of_val(values);
        let first = start / page_size() * page_size();
        let len = start + bytes - first;
        let ptr = map_fd(
            self.fd.as_fd(),
            first,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
        )?;
        // SAFETY: the mapping holds bytes `first..first + len` of the
        // array, of which `start..start + bytes` are `values`' place; the
        // programs only read it. It is unmapped once, here.
        unsafe {
            std::ptr::copy_nonoverlapping(
                values.as_ptr().cast::<u8>(),
                ptr.cast::<u8>().add(start - first),
                bytes,
            );
            libc::munmap(ptr, len);
        }
        Ok(())
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

// SAFETY: the mapping is read-only and owned, as a `Vec<u8>` would be.
unsafe impl Send for Mapped {}
// SAFETY: as for `Send`; nothing writes through it.
unsafe impl Sync for Mapped {}

impl Mapped {
    /// Maps or reads the file at `path`.
    pub fn open(path: &std::path::Path) -> std::io::Result<Self> {
        Self::of(&std::fs::File::open(path)?)
    }

    /// Maps or reads `file`. The kernel's BTF can be mapped since 6.16
    /// (privately); regular files always can.
    pub fn of(file: &std::fs::File) -> std::io::Result<Self> {
        use std::os::fd::AsFd as _;
        let len = file.metadata()?.len() as usize;
        // The files mapped (kernel BTF, executables and libraries that
        // processes run) are not written while mapped.
        if let Ok(ptr) = map_fd(file.as_fd(), 0, len, libc::PROT_READ, libc::MAP_PRIVATE) {
            return Ok(Self::Mapped {
                ptr: ptr.cast(),
                len,
            });
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

/// Elements made in memory, or lying in a mapped file: a table read from
/// a cache is used where it lies, which spares a copy and, on a first
/// read, a fault for every page of the copy (the file's own pages are
/// faulted in sixteen at a time).
pub enum Slab<T> {
    /// Made in memory.
    Owned(Vec<T>),
    /// `len` elements at byte `at` of `file`.
    Mapped {
        /// The file.
        file: std::sync::Arc<Mapped>,
        /// Where the elements start, aligned for `T`.
        at: usize,
        /// How many there are.
        len: usize,
    },
}

impl<T: aya::Pod> Slab<T> {
    /// The `len` elements at byte `at` of `file`, if they lie inside it,
    /// aligned for `T`.
    pub fn mapped(file: std::sync::Arc<Mapped>, at: usize, len: usize) -> Option<Self> {
        let end = at.checked_add(len.checked_mul(size_of::<T>())?)?;
        let aligned = (file.as_ptr() as usize).checked_add(at)? % align_of::<T>() == 0;
        (end <= file.len() && aligned).then_some(Self::Mapped { file, at, len })
    }
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Self::Owned(Vec::new())
    }
}

impl<T: aya::Pod> std::ops::Deref for Slab<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        match self {
            Self::Owned(v) => v,
            // SAFETY: `mapped` checked that the elements lie inside the
            // file and are aligned; `T` is plain data, valid for any bits;
            // the mapping lives as long as `file`.
            Self::Mapped { file, at, len } => unsafe {
                std::slice::from_raw_parts(file.as_ptr().add(*at).cast(), *len)
            },
        }
    }
}

impl<T: aya::Pod + std::fmt::Debug> std::fmt::Debug for Slab<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

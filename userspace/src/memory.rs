//! Handing memory back to the system once set-up is over.
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

//! Taking an embedded eBPF object out of its compressed group (user space
//! only, the `objects` feature). `ebpf_build::compress_group` makes a group:
//! one zstd frame whose content is its objects end to end, each at an
//! 8-aligned offset. rtrace takes an object out when a tool loads it, and
//! `cargo xtask bench startup` times the same function.

extern crate std;

use std::io::{self, Read as _};

/// Fills `out` with the `out.len()` bytes at `offset` of `frame`'s content.
/// The frame is decompressed only up to their end, through the decoder's
/// window, so that nothing but `out` holds the object.
pub fn take_out(frame: &[u8], offset: usize, out: &mut [u8]) -> io::Result<()> {
    let mut decoder = ruzstd::decoding::StreamingDecoder::new(frame)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    let skipped = io::copy(&mut (&mut decoder).take(offset as u64), &mut io::sink())?;
    if skipped != offset as u64 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the frame ends before the object",
        ));
    }
    decoder.read_exact(out)
}

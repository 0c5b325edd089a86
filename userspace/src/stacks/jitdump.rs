//! Jitdump files, `jit-PID.dump`: the log of generated code that JIT
//! runtimes write for perf (Node's `--perf-prof`, the JVM's perf agents,
//! and others) in the format of perf's `jitdump-specification.txt`, which
//! `perf inject --jit` turns into ELF files. Here a dump is read in place,
//! into a timeline of which function was at which address when: a JIT
//! reuses the addresses of code it throws away, and a perf map
//! (`/tmp/perf-PID.map`) has no times, so a sample in reused code gets
//! whatever name was written there last, where a dump names the code that
//! was there when the sample was taken. Its times are CLOCK_MONOTONIC, as
//! the kernel's sample times are.
//!
//! A runtime appends to its dump as it compiles, so a read stops before a
//! record that is not all written yet and [`JitDump::read_more`] goes on
//! from there.
//!
//! A runtime makes its dump findable by mapping the file's first page
//! executable: perf records executable mappings only, and `perf inject`
//! looks for one of a file named `jit-PID.dump`. The symbolizer looks
//! for the same in `/proc/PID/maps` ([`dump_pid`]).
//!
//! Source lines: a `JIT_CODE_DEBUG_INFO` record's addresses are taken as
//! the specification gives them, as addresses of the code. V8 writes them
//! 64 bytes further on (its `kElfHeaderSize`, for the ELF file `perf
//! inject` makes, where the code follows an ELF header), so its lines are
//! found for addresses 64 bytes later than they belong to.

use std::{
    collections::HashMap,
    io::{Read, Seek, SeekFrom},
    sync::Arc,
};

/// "JiTD", as the writer's `u32`; the other byte order means the file
/// was written on a machine of the other endianness.
const MAGIC: u32 = 0x4A69_5444;
/// The only version the specification has defined.
const VERSION: u32 = 1;
/// Magic, version, header size, ELF machine, padding, pid, timestamp
/// and flags.
const FILE_HEADER: usize = 4 * 6 + 8 * 2;
/// Record id, record size and timestamp.
const RECORD_HEADER: usize = 4 + 4 + 8;
/// The header flag saying that timestamps come from the CPU's own counter
/// (x86's TSC), not from CLOCK_MONOTONIC.
const FLAG_ARCH_TIMESTAMP: u64 = 1;

const CODE_LOAD: u32 = 0;
const CODE_MOVE: u32 = 1;
const CODE_DEBUG_INFO: u32 = 2;
const CODE_CLOSE: u32 = 3;
// JIT_CODE_UNWINDING_INFO (4) is skipped with the ids this reader does
// not know: the unwinder takes call frame information from ELF files only.

/// The file name in a debug entry that means "the previous entry's
/// file", a shorthand that V8's jitdump writer documents.
const SAME_FILE: &[u8] = b"\xff";

/// How much of the file one read takes at a time: a dump holds the code
/// it names and can be hundreds of megabytes.
const CHUNK: u64 = 1 << 20;

/// Errors from reading a jitdump file.
#[derive(Debug, thiserror::Error)]
pub enum JitDumpError {
    /// The file does not start with the jitdump magic in either byte order.
    #[error("not a jitdump file (magic {0:#010x})")]
    BadMagic(u32),
    /// The header's version is not one this reader knows.
    #[error("unsupported jitdump version {0}")]
    UnsupportedVersion(u32),
    /// The header says it is smaller than its own fields.
    #[error("jitdump header size {0} is smaller than the header")]
    BadHeaderSize(u32),
    /// A record says it is smaller than a record header, so the records
    /// after it cannot be found; those before it stay readable.
    #[error("jitdump record at byte {offset} has size {size}")]
    BadRecord {
        /// Where the record starts in the file.
        offset: u64,
        /// The size it gives.
        size: u32,
    },
    /// Reading the file failed.
    #[error("cannot read the jitdump file: {0}")]
    Io(#[from] std::io::Error),
}

/// A dump's file header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The format's version (1).
    pub version: u32,
    /// The ELF machine (`e_machine`) of the code, 62 for x86-64.
    pub elf_mach: u32,
    /// The writer's pid, in its own pid namespace.
    pub pid: u32,
    /// When the file was created, in whatever clock the writer chose: V8
    /// writes wall-clock microseconds here and CLOCK_MONOTONIC in its
    /// records, so this is no time to compare with the records'.
    pub timestamp: u64,
    /// The header's flags.
    pub flags: u64,
    /// Whether the file is in the other byte order than this machine's.
    pub swapped: bool,
}

impl Header {
    /// Whether the records' times are the CPU's counter (x86's TSC), which
    /// this reader cannot relate to sample times.
    pub fn arch_timestamps(&self) -> bool {
        self.flags & FLAG_ARCH_TIMESTAMP != 0
    }
}

/// The code found at an address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JitSymbol<'a> {
    /// The function's name as the runtime gave it.
    pub name: &'a str,
    /// Where the code starts.
    pub start: u64,
    /// Its size in bytes.
    pub size: u64,
    /// The runtime's id for this compilation of the function, which a
    /// move keeps.
    pub code_index: u64,
    /// When the code was loaded or moved there, in CLOCK_MONOTONIC
    /// nanoseconds; `None` in a file whose times are not.
    pub since_ns: Option<u64>,
    /// The source line of the address, when the runtime gave lines.
    pub source: Option<SourceLine<'a>>,
}

/// A source line of JIT code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceLine<'a> {
    /// The source file as the runtime named it (a path, URL or module).
    pub file: &'a str,
    /// The line, from 1.
    pub line: u32,
    /// The specification's "discriminator", which V8 fills with the
    /// column, from 1; 0 when not given.
    pub column: u32,
}

/// One placement of code: a load, or a move of earlier loaded code.
#[derive(Debug, Clone)]
struct Code {
    start: u64,
    end: u64,
    /// The record's timestamp, as written.
    time: u64,
    code_index: u64,
    /// Shared with the moves of the same code.
    name: Arc<str>,
    /// By offset from `start`; shared with the moves of the same code,
    /// which is why the offsets are relative.
    lines: Option<Arc<[Line]>>,
}

/// A line table row: code from `offset` on is `line` of `file`.
#[derive(Debug, Clone, Copy)]
struct Line {
    offset: u64,
    line: u32,
    column: u32,
    /// Into [`JitDump::files`].
    file: u32,
}

/// A jitdump file read so far, as a timeline of code placements. See the
/// module documentation.
#[derive(Debug, Default)]
pub struct JitDump {
    header: Option<Header>,
    /// Where in the file the next read starts: just past the last whole
    /// record read.
    offset: u64,
    /// In file order.
    codes: Vec<Code>,
    /// Indices into `codes` by start address, then file order.
    by_start: Vec<usize>,
    /// The greatest end of `by_start[..=i]`'s codes, which bounds how far
    /// back a lookup must look for code that covers its address.
    max_end: Vec<u64>,
    /// The latest placement of each code index, which a move refers to.
    by_index: HashMap<u64, usize>,
    /// A debug record's lines and code address, waiting for the load of
    /// that code, which the specification puts after it.
    pending_lines: Option<(u64, Arc<[Line]>)>,
    files: Vec<Box<str>>,
    file_ids: HashMap<Box<str>, u32>,
    records: usize,
    malformed: usize,
    closed: bool,
    /// A record too small to step over: reading stops there for good.
    broken: Option<(u64, u32)>,
}

impl JitDump {
    /// An empty dump, to be filled by [`read_more`](Self::read_more).
    pub fn new() -> Self {
        Self::default()
    }

    /// The dump held in `bytes`, up to its last whole record.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, JitDumpError> {
        let mut dump = Self::new();
        dump.read_more(&mut std::io::Cursor::new(bytes))?;
        Ok(dump)
    }

    /// Reads what was appended to the dump since the last read, from the
    /// end of the last whole record read; a record not all written yet is
    /// read the next time. Returns how many records were read.
    ///
    /// After an error the records read before it stay usable: a
    /// [`JitDumpError::BadRecord`] stops reading for good, an I/O error
    /// can be retried.
    pub fn read_more<R: Read + Seek>(&mut self, file: &mut R) -> Result<usize, JitDumpError> {
        self.read_in_chunks(file, CHUNK)
    }

    fn read_in_chunks<R: Read + Seek>(
        &mut self,
        file: &mut R,
        chunk: u64,
    ) -> Result<usize, JitDumpError> {
        if let Some((offset, size)) = self.broken {
            return Err(JitDumpError::BadRecord { offset, size });
        }
        let (records, codes) = (self.records, self.codes.len());
        let result = self.read_chunks(file, chunk);
        if self.codes.len() > codes {
            self.index_from(codes);
        }
        result.map(|()| self.records - records)
    }

    fn read_chunks<R: Read + Seek>(
        &mut self,
        file: &mut R,
        chunk: u64,
    ) -> Result<(), JitDumpError> {
        file.seek(SeekFrom::Start(self.offset))?;
        let mut buf = Vec::new();
        loop {
            let n = file.by_ref().take(chunk).read_to_end(&mut buf)?;
            let used = self.parse(&buf)?;
            buf.drain(..used);
            if n == 0 {
                return Ok(());
            }
        }
    }

    /// Reads the header, if not yet read, and the whole records at the
    /// start of `buf`, which starts at `self.offset`; returns how many
    /// bytes they took.
    fn parse(&mut self, buf: &[u8]) -> Result<usize, JitDumpError> {
        let mut pos = 0;
        let header = match self.header {
            Some(h) => h,
            None => match read_header(buf)? {
                Some((h, size)) => {
                    self.header = Some(h);
                    self.offset = size as u64;
                    pos = size;
                    h
                }
                None => return Ok(0),
            },
        };
        let swap = header.swapped;
        while let Some(rest) = buf.get(pos..)
            && rest.len() >= RECORD_HEADER
        {
            let mut f = Fields::new(rest, swap);
            let (Some(id), Some(size), Some(time)) = (f.u32(), f.u32(), f.u64()) else {
                break;
            };
            if (size as usize) < RECORD_HEADER {
                self.broken = Some((self.offset, size));
                return Err(JitDumpError::BadRecord {
                    offset: self.offset,
                    size,
                });
            }
            // Not all written yet: the runtime is still writing it.
            let Some(body) = rest.get(RECORD_HEADER..size as usize) else {
                break;
            };
            self.record(id, time, Fields::new(body, swap));
            self.records += 1;
            pos += size as usize;
            self.offset += u64::from(size);
        }
        Ok(pos)
    }

    fn record(&mut self, id: u32, time: u64, f: Fields<'_>) {
        let ok = match id {
            CODE_LOAD => self.load(time, f).is_some(),
            CODE_MOVE => self.move_code(time, f).is_some(),
            CODE_DEBUG_INFO => self.debug_info(f).is_some(),
            CODE_CLOSE => {
                self.closed = true;
                true
            }
            _ => true,
        };
        if !ok {
            self.malformed += 1;
        }
    }

    fn load(&mut self, time: u64, mut f: Fields<'_>) -> Option<()> {
        let (_pid, _tid, _vma) = (f.u32()?, f.u32()?, f.u64()?);
        // perf names code by `code_addr`, not `vma`; they are the same
        // unless a runtime maps its code twice.
        let (start, size, code_index) = (f.u64()?, f.u64()?, f.u64()?);
        let name: Arc<str> = String::from_utf8_lossy(f.cstr()?).into();
        // The code bytes follow; a record cut short of them still names
        // the code, which is all this reader wants of it.
        let lines = match self.pending_lines.take() {
            Some((addr, lines)) if addr == start => Some(lines),
            _ => None,
        };
        self.place(Code {
            start,
            end: start.saturating_add(size),
            time,
            code_index,
            name,
            lines,
        });
        Some(())
    }

    fn move_code(&mut self, time: u64, mut f: Fields<'_>) -> Option<()> {
        let (_pid, _tid, _vma) = (f.u32()?, f.u32()?, f.u64()?);
        let (_old, new, size, code_index) = (f.u64()?, f.u64()?, f.u64()?, f.u64()?);
        // A move of code never loaded names nothing.
        let moved = &self.codes[*self.by_index.get(&code_index)?];
        let code = Code {
            start: new,
            end: new.saturating_add(size),
            time,
            code_index,
            name: moved.name.clone(),
            lines: moved.lines.clone(),
        };
        self.place(code);
        Some(())
    }

    fn place(&mut self, code: Code) {
        self.by_index.insert(code.code_index, self.codes.len());
        self.codes.push(code);
    }

    fn debug_info(&mut self, mut f: Fields<'_>) -> Option<()> {
        let (addr, count) = (f.u64()?, f.u64()?);
        // The count is the writer's word, but the record's size bounds the
        // entries: each is at least 17 bytes.
        let mut lines = Vec::with_capacity(count.min((f.buf.len() / 17) as u64) as usize);
        let mut file = None;
        for _ in 0..count {
            let (Some(at), Some(line), Some(column), Some(name)) =
                (f.u64(), f.u32(), f.u32(), f.cstr())
            else {
                break;
            };
            if name != SAME_FILE {
                file = Some(self.file_id(name));
            }
            // An entry before the code it describes belongs to nothing.
            let (Some(file), Some(offset)) = (file, at.checked_sub(addr)) else {
                continue;
            };
            lines.push(Line {
                offset,
                line,
                column,
                file,
            });
        }
        lines.sort_by_key(|l| l.offset);
        self.pending_lines = Some((addr, lines.into()));
        Some(())
    }

    fn file_id(&mut self, name: &[u8]) -> u32 {
        let name: Box<str> = String::from_utf8_lossy(name).into();
        if let Some(&id) = self.file_ids.get(&name) {
            return id;
        }
        let id = self.files.len() as u32;
        self.files.push(name.clone());
        self.file_ids.insert(name, id);
        id
    }

    /// Adds the codes from `first` on to the address index.
    fn index_from(&mut self, first: usize) {
        let codes = &self.codes;
        self.by_start.extend(first..codes.len());
        // Sorted up to the new codes, which mostly follow in address order
        // too: a sort that finds runs takes about linear time.
        self.by_start.sort_by_key(|&i| (codes[i].start, i));
        self.max_end.clear();
        let mut max = 0;
        for &i in &self.by_start {
            max = max.max(codes[i].end);
            self.max_end.push(max);
        }
    }

    /// The placements that cover `addr`, as indices into `codes`.
    fn covering(&self, addr: u64) -> impl Iterator<Item = usize> + '_ {
        let below = self
            .by_start
            .partition_point(|&i| self.codes[i].start <= addr);
        (0..below)
            .rev()
            .take_while(move |&k| self.max_end[k] > addr)
            .map(|k| self.by_start[k])
            .filter(move |&i| addr < self.codes[i].end)
    }

    /// The code that was at `addr` at `time_ns` (CLOCK_MONOTONIC): the
    /// latest load or move there at or before `time_ns`. Before the first
    /// of them it is the first, since a sample taken while the runtime
    /// was writing the record can carry an earlier time than the record.
    /// In a file whose times are not CLOCK_MONOTONIC (see
    /// [`Header::arch_timestamps`]) it is [`lookup_latest`](Self::lookup_latest).
    ///
    /// Code stays named after it is moved away or thrown out until other
    /// code is placed over it, as perf keeps it.
    pub fn lookup(&self, addr: u64, time_ns: u64) -> Option<JitSymbol<'_>> {
        if !self.timed() {
            return self.lookup_latest(addr);
        }
        let key = |i: usize| (self.codes[i].time, i);
        let (mut before, mut first): (Option<usize>, Option<usize>) = (None, None);
        for i in self.covering(addr) {
            if self.codes[i].time <= time_ns && before.is_none_or(|b| key(i) > key(b)) {
                before = Some(i);
            }
            if first.is_none_or(|b| key(i) < key(b)) {
                first = Some(i);
            }
        }
        Some(self.symbol(before.or(first)?, addr))
    }

    /// The code at `addr` by the last record read that placed code there.
    pub fn lookup_latest(&self, addr: u64) -> Option<JitSymbol<'_>> {
        Some(self.symbol(self.covering(addr).max()?, addr))
    }

    fn symbol(&self, i: usize, addr: u64) -> JitSymbol<'_> {
        let code = &self.codes[i];
        let source = code.lines.as_deref().and_then(|lines| {
            let below = lines.partition_point(|l| l.offset <= addr - code.start);
            let l = lines.get(below.checked_sub(1)?)?;
            Some(SourceLine {
                file: self.files.get(l.file as usize)?,
                line: l.line,
                column: l.column,
            })
        });
        JitSymbol {
            name: &code.name,
            start: code.start,
            size: code.end - code.start,
            code_index: code.code_index,
            since_ns: self.timed().then_some(code.time),
            source,
        }
    }

    /// The file header, once read.
    pub fn header(&self) -> Option<&Header> {
        self.header.as_ref()
    }

    /// Whether the records' times are CLOCK_MONOTONIC, and so comparable
    /// with sample times.
    pub fn timed(&self) -> bool {
        self.header.is_some_and(|h| !h.arch_timestamps())
    }

    /// Where in the file the next [`read_more`](Self::read_more) starts.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The number of code placements (loads and moves) read.
    pub fn len(&self) -> usize {
        self.codes.len()
    }

    /// Whether no code has been read.
    pub fn is_empty(&self) -> bool {
        self.codes.is_empty()
    }

    /// The number of records too short for their own fields, or moves of
    /// code never loaded, that were skipped.
    pub fn malformed(&self) -> usize {
        self.malformed
    }

    /// Whether the runtime wrote `JIT_CODE_CLOSE`, its last record.
    pub fn closed(&self) -> bool {
        self.closed
    }
}

/// The header at the start of `buf` and its size, or `None` while it is
/// not all there. A wrong magic or version is an error as soon as it is
/// there, so that a file that is no dump is not waited on.
fn read_header(buf: &[u8]) -> Result<Option<(Header, usize)>, JitDumpError> {
    let mut f = Fields::new(buf, false);
    let Some(magic) = f.u32() else {
        return Ok(None);
    };
    let swapped = match magic {
        MAGIC => false,
        m if m.swap_bytes() == MAGIC => true,
        m => return Err(JitDumpError::BadMagic(m)),
    };
    f.swap = swapped;
    let Some(version) = f.u32() else {
        return Ok(None);
    };
    if version != VERSION {
        return Err(JitDumpError::UnsupportedVersion(version));
    }
    let (Some(size), Some(elf_mach), Some(_pad), Some(pid), Some(timestamp), Some(flags)) =
        (f.u32(), f.u32(), f.u32(), f.u32(), f.u64(), f.u64())
    else {
        return Ok(None);
    };
    if (size as usize) < FILE_HEADER {
        return Err(JitDumpError::BadHeaderSize(size));
    }
    // A larger header has fields of a later revision, skipped.
    if buf.len() < size as usize {
        return Ok(None);
    }
    let header = Header {
        version,
        elf_mach,
        pid,
        timestamp,
        flags,
        swapped,
    };
    Ok(Some((header, size as usize)))
}

/// Fields read in turn from a record, in the file's byte order.
struct Fields<'a> {
    buf: &'a [u8],
    pos: usize,
    swap: bool,
}

impl<'a> Fields<'a> {
    fn new(buf: &'a [u8], swap: bool) -> Self {
        Self { buf, pos: 0, swap }
    }

    fn bytes<const N: usize>(&mut self) -> Option<[u8; N]> {
        let b = self.buf.get(self.pos..self.pos.checked_add(N)?)?;
        self.pos += N;
        b.try_into().ok()
    }

    fn u32(&mut self) -> Option<u32> {
        let v = u32::from_ne_bytes(self.bytes()?);
        Some(if self.swap { v.swap_bytes() } else { v })
    }

    fn u64(&mut self) -> Option<u64> {
        let v = u64::from_ne_bytes(self.bytes()?);
        Some(if self.swap { v.swap_bytes() } else { v })
    }

    /// A NUL-terminated string, without its NUL.
    fn cstr(&mut self) -> Option<&'a [u8]> {
        let rest = self.buf.get(self.pos..)?;
        let len = rest.iter().position(|&b| b == 0)?;
        self.pos += len + 1;
        Some(&rest[..len])
    }
}

/// The runtime's pid (in its own pid namespace) that a mapped file's path
/// names, if the path is a jitdump's, `jit-PID.dump`, as `perf inject
/// --jit` recognises one. The caller takes executable mappings only, as
/// perf records only those; a file deleted since it was mapped is still
/// read through `/proc/PID/map_files`, where perf loses it.
pub fn dump_pid(path: &str) -> Option<u32> {
    let name = path.rsplit('/').next()?;
    let digits = name.strip_prefix("jit-")?.strip_suffix(".dump")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use super::*;

    /// Writes dumps as a runtime does, in this machine's byte order or
    /// the other.
    struct Writer {
        buf: Vec<u8>,
        swap: bool,
    }

    impl Writer {
        fn new(swap: bool, flags: u64) -> Self {
            let mut w = Self {
                buf: Vec::new(),
                swap,
            };
            for v in [MAGIC, VERSION, FILE_HEADER as u32, 62, 0, 4242] {
                w.u32(v);
            }
            w.u64(1_700_000_000_000_000);
            w.u64(flags);
            w
        }

        fn u32(&mut self, v: u32) {
            let v = if self.swap { v.swap_bytes() } else { v };
            self.buf.extend_from_slice(&v.to_ne_bytes());
        }

        fn u64(&mut self, v: u64) {
            let v = if self.swap { v.swap_bytes() } else { v };
            self.buf.extend_from_slice(&v.to_ne_bytes());
        }

        /// A record whose body `body` writes.
        fn record(&mut self, id: u32, time: u64, body: impl FnOnce(&mut Self)) -> &mut Self {
            let start = self.buf.len();
            self.u32(id);
            self.u32(0);
            self.u64(time);
            body(self);
            let size = (self.buf.len() - start) as u32;
            let size = if self.swap { size.swap_bytes() } else { size };
            self.buf[start + 4..start + 8].copy_from_slice(&size.to_ne_bytes());
            self
        }

        fn load(&mut self, time: u64, addr: u64, size: u64, index: u64, name: &str) -> &mut Self {
            self.record(CODE_LOAD, time, |w| {
                w.u32(4242);
                w.u32(4243);
                w.u64(addr);
                w.u64(addr);
                w.u64(size);
                w.u64(index);
                w.buf.extend_from_slice(name.as_bytes());
                w.buf.push(0);
                w.buf.extend(std::iter::repeat_n(0xcc, size as usize));
            })
        }

        fn move_code(&mut self, time: u64, old: u64, new: u64, size: u64, index: u64) -> &mut Self {
            self.record(CODE_MOVE, time, |w| {
                w.u32(4242);
                w.u32(4243);
                w.u64(new);
                w.u64(old);
                w.u64(new);
                w.u64(size);
                w.u64(index);
            })
        }

        fn debug(&mut self, time: u64, addr: u64, entries: &[(u64, u32, u32, &[u8])]) -> &mut Self {
            self.record(CODE_DEBUG_INFO, time, |w| {
                w.u64(addr);
                w.u64(entries.len() as u64);
                for &(at, line, column, file) in entries {
                    w.u64(at);
                    w.u32(line);
                    w.u32(column);
                    w.buf.extend_from_slice(file);
                    w.buf.push(0);
                }
                // Padding to 8 bytes, as V8 writes it.
                while w.buf.len() % 8 != 0 {
                    w.buf.push(0);
                }
            })
        }
    }

    fn name_at(dump: &JitDump, addr: u64, time: u64) -> Option<&str> {
        dump.lookup(addr, time).map(|s| s.name)
    }

    #[test]
    fn code_reused_at_one_address_is_named_by_time() {
        for swap in [false, true] {
            let mut w = Writer::new(swap, 0);
            w.load(100, 0x1000, 0x40, 1, "first")
                .load(150, 0x2000, 0x10, 2, "elsewhere")
                .load(200, 0x1000, 0x40, 3, "second")
                .record(CODE_CLOSE, 300, |_| {});
            let dump = JitDump::from_bytes(&w.buf).unwrap();
            let h = dump.header().unwrap();
            assert_eq!((h.swapped, h.pid, h.elf_mach), (swap, 4242, 62));
            assert!(dump.timed() && dump.closed());
            assert_eq!(dump.len(), 3);
            assert_eq!(dump.offset(), w.buf.len() as u64);
            assert_eq!(name_at(&dump, 0x1010, 100), Some("first"));
            assert_eq!(name_at(&dump, 0x1010, 199), Some("first"));
            assert_eq!(name_at(&dump, 0x1010, 200), Some("second"));
            assert_eq!(name_at(&dump, 0x103f, u64::MAX), Some("second"));
            // Before any load there: the first, the sample racing its record.
            assert_eq!(name_at(&dump, 0x1000, 0), Some("first"));
            assert_eq!(name_at(&dump, 0x2008, 0), Some("elsewhere"));
            assert_eq!(name_at(&dump, 0x1040, 1000), None);
            assert_eq!(name_at(&dump, 0xfff, 1000), None);
            let latest = dump.lookup_latest(0x1020).unwrap();
            assert_eq!(
                (latest.name, latest.start, latest.size, latest.code_index),
                ("second", 0x1000, 0x40, 3)
            );
            assert_eq!(latest.since_ns, Some(200));
        }
    }

    #[test]
    fn overlapping_code_covers_only_its_own_range() {
        let mut w = Writer::new(false, 0);
        w.load(10, 0x1000, 0x100, 1, "big")
            .load(20, 0x1080, 0x100, 2, "shifted")
            .load(30, 0x5000, 0x10, 3, "far");
        let dump = JitDump::from_bytes(&w.buf).unwrap();
        assert_eq!(name_at(&dump, 0x1010, 40), Some("big"));
        assert_eq!(name_at(&dump, 0x10f0, 15), Some("big"));
        assert_eq!(name_at(&dump, 0x10f0, 40), Some("shifted"));
        assert_eq!(name_at(&dump, 0x1170, 40), Some("shifted"));
        assert_eq!(name_at(&dump, 0x1180, 40), None);
        assert_eq!(name_at(&dump, 0x4fff, 40), None);
    }

    #[test]
    fn moved_code_keeps_its_name_and_lines() {
        for swap in [false, true] {
            let mut w = Writer::new(swap, 0);
            w.debug(
                5,
                0x3000,
                &[(0x3000, 10, 1, b"a.js"), (0x3010, 12, 4, b"\xff")],
            )
            .load(10, 0x3000, 0x20, 7, "f")
            .move_code(20, 0x3000, 0x5000, 0x20, 7)
            // A move of code never loaded.
            .move_code(25, 0x3000, 0x6000, 0x20, 99);
            let dump = JitDump::from_bytes(&w.buf).unwrap();
            assert_eq!(dump.len(), 2);
            assert_eq!(dump.malformed(), 1);
            let s = dump.lookup(0x5018, 30).unwrap();
            assert_eq!((s.name, s.start, s.code_index), ("f", 0x5000, 7));
            assert_eq!(
                s.source,
                Some(SourceLine {
                    file: "a.js",
                    line: 12,
                    column: 4
                })
            );
            // Only placement there, so also for a time before the move.
            assert_eq!(name_at(&dump, 0x5000, 15), Some("f"));
            assert_eq!(dump.lookup(0x5000, 15).unwrap().since_ns, Some(20));
            // The old place keeps the name until code is placed over it.
            assert_eq!(name_at(&dump, 0x3004, 30), Some("f"));
            assert_eq!(name_at(&dump, 0x6000, 30), None);
        }
    }

    #[test]
    fn lines_map_addresses_within_a_function() {
        let mut w = Writer::new(false, 0);
        w.debug(
            1,
            0x7000,
            &[
                (0x7020, 3, 0, b"b.js"),
                (0x7004, 10, 2, b"a.js"),
                (0x7010, 11, 0, b"\xff"),
                // Before the code: belongs to nothing.
                (0x6ff0, 1, 0, b"c.js"),
            ],
        )
        .load(2, 0x7000, 0x40, 1, "g")
        // Lines for other code do not stick to the next load.
        .debug(3, 0x9000, &[(0x9000, 5, 0, b"d.js")])
        .load(4, 0x8000, 0x10, 2, "h");
        let dump = JitDump::from_bytes(&w.buf).unwrap();
        let line = |addr| {
            dump.lookup_latest(addr)
                .unwrap()
                .source
                .map(|s| (s.file, s.line))
        };
        assert_eq!(line(0x7000), None);
        assert_eq!(line(0x7004), Some(("a.js", 10)));
        assert_eq!(line(0x700f), Some(("a.js", 10)));
        // The shorthand is the entry before in the file, not by address.
        assert_eq!(line(0x7010), Some(("a.js", 11)));
        assert_eq!(line(0x703f), Some(("b.js", 3)));
        assert_eq!(line(0x8000), None);
    }

    #[test]
    fn tsc_times_leave_the_dump_untimed() {
        let mut w = Writer::new(true, FLAG_ARCH_TIMESTAMP);
        w.load(900, 0x1000, 0x10, 1, "old")
            .load(100, 0x1000, 0x10, 2, "new");
        let dump = JitDump::from_bytes(&w.buf).unwrap();
        assert!(dump.header().unwrap().arch_timestamps());
        assert!(!dump.timed());
        let s = dump.lookup(0x1000, 950).unwrap();
        assert_eq!((s.name, s.since_ns), ("new", None));
    }

    #[test]
    fn unknown_and_unwinding_records_are_skipped() {
        let mut w = Writer::new(false, 0);
        w.record(4, 1, |w| w.buf.extend_from_slice(&[7; 40]))
            .record(77, 2, |w| w.buf.extend_from_slice(&[0xff; 13]))
            .load(3, 0x1000, 8, 1, "after");
        let dump = JitDump::from_bytes(&w.buf).unwrap();
        assert_eq!(name_at(&dump, 0x1000, 3), Some("after"));
        assert_eq!(dump.malformed(), 0);
    }

    #[test]
    fn a_growing_file_is_read_as_it_grows() {
        let mut w = Writer::new(false, 0);
        w.load(100, 0x1000, 0x40, 1, "first");
        let first_end = w.buf.len();
        w.load(200, 0x1000, 0x40, 2, "second");
        let all = w.buf.clone();
        let mut file = tempfile::tempfile().unwrap();
        let mut dump = JitDump::new();
        // Mid-header, mid-record, then the rest.
        let cuts = [0, 20, first_end + 30, all.len()];
        let mut read = Vec::new();
        for pair in cuts.windows(2) {
            file.write_all(&all[pair[0]..pair[1]]).unwrap();
            read.push(dump.read_more(&mut file).unwrap());
            if pair[1] == 20 {
                assert!(dump.header().is_none());
                assert_eq!(dump.offset(), 0);
            }
            if pair[1] == first_end + 30 {
                assert_eq!(dump.offset(), first_end as u64);
                assert_eq!(name_at(&dump, 0x1000, 300), Some("first"));
            }
        }
        assert_eq!(read, [0, 1, 1]);
        assert_eq!(name_at(&dump, 0x1000, 300), Some("second"));
        assert_eq!(name_at(&dump, 0x1000, 150), Some("first"));
        assert_eq!(dump.read_more(&mut file).unwrap(), 0);
    }

    #[test]
    fn records_across_small_chunks() {
        let mut w = Writer::new(true, 0);
        for i in 0..50 {
            w.load(i, 0x1000 + i * 0x100, 0x80, i, &format!("f{i}"));
        }
        let mut dump = JitDump::new();
        let n = dump
            .read_in_chunks(&mut std::io::Cursor::new(&w.buf), 7)
            .unwrap();
        assert_eq!(n, 50);
        assert_eq!(name_at(&dump, 0x1000 + 33 * 0x100 + 5, 100), Some("f33"));
    }

    #[test]
    fn bad_headers_are_errors() {
        let mut w = Writer::new(false, 0);
        w.buf[0] ^= 1;
        assert!(matches!(
            JitDump::from_bytes(&w.buf),
            Err(JitDumpError::BadMagic(_))
        ));
        let mut w = Writer::new(true, 0);
        w.buf[4..8].copy_from_slice(&2u32.swap_bytes().to_ne_bytes());
        assert!(matches!(
            JitDump::from_bytes(&w.buf),
            Err(JitDumpError::UnsupportedVersion(2))
        ));
        let mut w = Writer::new(false, 0);
        w.buf[8..12].copy_from_slice(&8u32.to_ne_bytes());
        assert!(matches!(
            JitDump::from_bytes(&w.buf),
            Err(JitDumpError::BadHeaderSize(8))
        ));
        // Garbage is refused at its first four bytes.
        assert!(matches!(
            JitDump::from_bytes(b"ELF\x7f"),
            Err(JitDumpError::BadMagic(_))
        ));
        assert!(JitDump::from_bytes(b"").unwrap().header().is_none());
    }

    #[test]
    fn a_record_too_small_to_step_over_stops_reading() {
        let mut w = Writer::new(false, 0);
        w.load(1, 0x1000, 0x10, 1, "kept");
        let bad = w.buf.len();
        w.record(0, 2, |_| {}).load(3, 0x2000, 0x10, 2, "lost");
        w.buf[bad + 4..bad + 8].copy_from_slice(&8u32.to_ne_bytes());
        let mut dump = JitDump::new();
        let mut cursor = std::io::Cursor::new(&w.buf);
        let err = dump.read_more(&mut cursor).unwrap_err();
        assert!(
            matches!(err, JitDumpError::BadRecord { offset, size: 8 } if offset == bad as u64),
            "{err}"
        );
        assert_eq!(name_at(&dump, 0x1000, 5), Some("kept"));
        assert!(dump.read_more(&mut cursor).is_err());
        assert_eq!(name_at(&dump, 0x2000, 5), None);
    }

    /// Truncated files and random changes to a valid one must not panic.
    #[test]
    fn garbage_does_not_panic() {
        let mut w = Writer::new(false, 0);
        w.debug(
            1,
            0x1000,
            &[(0x1000, 1, 1, b"x.js"), (0x1004, 2, 1, b"\xff")],
        )
        .load(2, 0x1000, 0x10, 1, "f")
        .move_code(3, 0x1000, 0x2000, 0x10, 1)
        .record(4, 4, |w| w.buf.extend_from_slice(&[1; 24]))
        .record(CODE_CLOSE, 5, |_| {});
        let valid = w.buf.clone();
        let probe = |bytes: &[u8]| {
            if let Ok(dump) = JitDump::from_bytes(bytes) {
                for addr in [0, 0xfff, 0x1000, 0x1004, 0x100f, 0x2008, u64::MAX] {
                    let _ = dump.lookup(addr, 3);
                    let _ = dump.lookup(addr, 0);
                    let _ = dump.lookup_latest(addr);
                }
            }
        };
        for len in 0..=valid.len() {
            probe(&valid[..len]);
        }
        let mut state = 0x9E37_79B9_7F4A_7C15_u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..20_000 {
            let mut bytes = valid.clone();
            for _ in 0..1 + next() % 4 {
                let at = (next() as usize) % bytes.len();
                bytes[at] = next() as u8;
            }
            let len = (next() as usize) % (bytes.len() + 1);
            probe(&bytes[..len.max(FILE_HEADER)]);
        }
        for len in [0, 3, 16, 40, 41, 100, 4096] {
            let noise: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            probe(&noise);
            let mut with_header = Writer::new(false, 0).buf;
            with_header.extend_from_slice(&noise);
            probe(&with_header);
        }
    }

    #[test]
    fn dumps_are_named_as_perf_finds_them() {
        assert_eq!(dump_pid("/tmp/jit-19834.dump"), Some(19834));
        assert_eq!(dump_pid("/work/my dir/jit-77.dump"), Some(77));
        for other in [
            "/usr/bin/node",
            "/tmp/jit-abc.dump",
            "/tmp/jit-.dump",
            "/tmp/myjit-9.dump",
            "/tmp/jit-99999999999.dump",
            "/tmp/jit-5.dump.old",
            "",
        ] {
            assert_eq!(dump_pid(other), None, "{other}");
        }
    }
}

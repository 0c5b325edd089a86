//! Compiled CFI tables kept on disk between runs, so that a binary's call
//! frame information is compiled once per machine and version, not once
//! per profile: the compile is most of what a short profile of a big
//! program costs (python3 and libc take about 4 ms), as perf's build-id
//! cache (`~/.debug`) keeps its copies of binaries.
//!
//! A table is keyed by a hash of what it is compiled from, the file's
//! CFI sections and the addresses they are relative to, which name it
//! wherever the file lives (a container's copy of the host's libc hits
//! too) and whatever else in the file changes. The directory is `$RTRACE_CACHE_DIR`, else
//! `$XDG_CACHE_HOME/rtrace/cfi`, else `~/.cache/rtrace/cfi`; an empty
//! `RTRACE_CACHE_DIR` turns the cache off. It holds at most
//! [`BUDGET`] bytes: the tables used least recently go first.
//!
//! A cached table is only ever a file this user wrote (the directory is
//! private), and the walk it drives is bounded in the kernel whatever it
//! says; still, a file whose sizes do not add up is ignored.

use std::{
    fs::{self, File},
    io::Write as _,
    os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _},
    path::{Path, PathBuf},
    sync::Arc,
};

use object::Object as _;
use rtrace_common::unwind::{Bucket, CfiRow, CfiRule, MAX_INDEX_SHIFT};

use crate::{
    kernel::memory::{Mapped, Slab},
    stacks::cfi::Table,
};

/// Bytes the cache may hold.
pub const BUDGET: u64 = 256 << 20;
/// The first bytes of a cached table; the last one is the format's
/// version, raised whenever the compiler's rules change.
const MAGIC: [u8; 8] = *b"RTCFI\0\0\x09";
/// Magic, rows, unsupported rows, index shift, buckets, the first row's
/// address, rules and four bytes of padding.
const HEADER: usize = 8 + 8 + 8 + 4 + 4 + 8 + 4 + 4;

/// See the module documentation.
#[derive(Debug)]
pub struct DiskCache {
    dir: PathBuf,
    /// Tables read from the cache.
    pub read: usize,
    /// Tables compiled and written to it.
    pub written: usize,
    /// The first write that failed, and why: the cache works read-only
    /// then, and `-v` says so.
    pub write_error: Option<String>,
}

impl DiskCache {
    /// The cache in its usual place (see the module documentation), or
    /// `None` where it is turned off or no place is known.
    pub fn from_env() -> Option<Self> {
        let dir = match std::env::var_os("RTRACE_CACHE_DIR") {
            Some(d) if d.is_empty() => return None,
            Some(d) => PathBuf::from(d),
            None => match std::env::var_os("XDG_CACHE_HOME") {
                Some(d) if !d.is_empty() => PathBuf::from(d).join("rtrace/cfi"),
                _ => PathBuf::from(std::env::var_os("HOME")?).join(".cache/rtrace/cfi"),
            },
        };
        Some(Self::at(dir))
    }

    /// The cache in `dir`.
    pub fn at(dir: PathBuf) -> Self {
        Self {
            dir,
            read: 0,
            written: 0,
            write_error: None,
        }
    }

    /// Where the tables are.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The name of the table of the ELF file `data`: a 128-bit hash of
    /// everything [`compile`](crate::stacks::cfi::compile) reads (the CFI
    /// sections' bytes and the addresses their pointers are relative to),
    /// so that a table is only ever used for the CFI it was compiled
    /// from, even where a file was patched in place and kept its build-id
    /// and size. `None` for a file with no CFI section.
    fn key(data: &[u8]) -> Option<String> {
        use object::ObjectSection as _;
        // XXH3: the CFI of a big program is megabytes, hashed on every
        // first sight of a file, and SipHash took python3's 2 ms.
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        h.update(&MAGIC);
        let file = object::File::parse(data).ok()?;
        let mut any = false;
        for name in [".eh_frame", ".debug_frame", ".text", ".got"] {
            let Some(section) = file.section_by_name(name) else {
                continue;
            };
            h.update(name.as_bytes());
            h.update(&section.address().to_le_bytes());
            if name.ends_with("frame") {
                any = true;
                let bytes = section.data().ok()?;
                h.update(&(bytes.len() as u64).to_le_bytes());
                h.update(bytes);
            }
        }
        any.then(|| format!("{:032x}", h.digest128()))
    }

    /// The table of the ELF file `data`: read from the cache, else made by
    /// `compile` and written to it. What `compile` fails with is not
    /// cached: it is said again on the next run.
    pub fn get_or_compile<E>(
        &mut self,
        data: &[u8],
        compile: impl FnOnce(&[u8]) -> Result<Table, E>,
    ) -> Result<Table, E> {
        let Some(key) = Self::key(data) else {
            return compile(data);
        };
        let path = self.dir.join(key);
        if let Some(table) = read(&path) {
            // Marks it used, for the pruning.
            if let Ok(f) = File::options().write(true).open(&path) {
                let _ = f.set_modified(std::time::SystemTime::now());
            }
            self.read += 1;
            return Ok(table);
        }
        let table = compile(data)?;
        match self.write(&path, &table) {
            Ok(()) => self.written += 1,
            Err(e) => {
                self.write_error
                    .get_or_insert_with(|| format!("{}: {e}", self.dir.display()));
            }
        }
        Ok(table)
    }

    /// Writes `table` to `path` whole or not at all (a temporary file
    /// renamed), then prunes the cache to its budget.
    fn write(&self, path: &Path, table: &Table) -> std::io::Result<()> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)?;
        let mut bytes = Vec::with_capacity(
            HEADER
                + size_of_val(&*table.rows)
                + size_of_val(&*table.rules)
                + size_of_val(&*table.index),
        );
        bytes.extend_from_slice(&MAGIC);
        bytes.extend_from_slice(&(table.rows.len() as u64).to_le_bytes());
        bytes.extend_from_slice(&(table.unsupported as u64).to_le_bytes());
        bytes.extend_from_slice(&table.index_shift.to_le_bytes());
        bytes.extend_from_slice(&(table.index.len() as u32).to_le_bytes());
        bytes.extend_from_slice(&table.base.to_le_bytes());
        bytes.extend_from_slice(&(table.rules.len() as u32).to_le_bytes());
        bytes.extend_from_slice(&[0; 4]);
        // As the kernel holds them (this machine's byte order: the cache
        // is per machine), so that a read uses them where they lie.
        bytes.extend_from_slice(as_bytes(&table.rows));
        bytes.extend_from_slice(as_bytes(&table.rules));
        bytes.extend_from_slice(as_bytes(&table.index));
        let tmp = self.dir.join(format!(".tmp-{}", std::process::id()));
        let mut f = File::options()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(&bytes)?;
        drop(f);
        fs::rename(&tmp, path)?;
        self.prune(BUDGET);
        Ok(())
    }

    /// Removes the tables used least recently until the cache holds at
    /// most `budget` bytes.
    fn prune(&self, budget: u64) {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return;
        };
        let mut files: Vec<(std::time::SystemTime, u64, PathBuf)> = entries
            .flatten()
            .filter_map(|e| {
                let meta = e.metadata().ok().filter(fs::Metadata::is_file)?;
                Some((meta.modified().ok()?, meta.len(), e.path()))
            })
            .collect();
        let mut total: u64 = files.iter().map(|f| f.1).sum();
        files.sort();
        for (_, len, path) in files {
            if total <= budget {
                break;
            }
            if fs::remove_file(&path).is_ok() {
                total -= len;
            }
        }
    }
}

/// The bytes of `items`.
fn as_bytes<T: aya::Pod>(items: &[T]) -> &[u8] {
    // SAFETY: `T` is plain data with no padding (`CfiRow`, `CfiRule`,
    // `Bucket`).
    unsafe { std::slice::from_raw_parts(items.as_ptr().cast(), size_of_val(items)) }
}

/// The table cached at `path`, if there is one and it adds up: its rows
/// and index are used where they lie in the file's mapping.
fn read(path: &Path) -> Option<Table> {
    let file = Arc::new(Mapped::open(path).ok()?);
    let head = file.get(..HEADER)?;
    if head[..8] != MAGIC {
        return None;
    }
    let u64_at = |at: usize| u64::from_le_bytes(head[at..at + 8].try_into().unwrap());
    let u32_at = |at: usize| u32::from_le_bytes(head[at..at + 4].try_into().unwrap());
    let (rows, unsupported) = (usize::try_from(u64_at(8)).ok()?, u64_at(16));
    let (index_shift, buckets) = (u32_at(24), u32_at(28) as usize);
    let (base, rules) = (u64_at(32), u32_at(40) as usize);
    let rows_len = rows.checked_mul(size_of::<CfiRow>())?;
    let rules_len = rules.checked_mul(size_of::<CfiRule>())?;
    if file.len() != HEADER + rows_len + rules_len + buckets * size_of::<Bucket>()
        || index_shift > MAX_INDEX_SHIFT
    {
        return None;
    }
    let rules: Slab<CfiRule> = Slab::mapped(file.clone(), HEADER + rows_len, rules)?;
    let index: Slab<Bucket> = Slab::mapped(file.clone(), HEADER + rows_len + rules_len, buckets)?;
    let fits = index
        .iter()
        .all(|b| b.first < b.end && b.end as usize <= rows);
    let rows: Slab<CfiRow> = Slab::mapped(file, HEADER, rows)?;
    let numbered = rows.iter().all(|r| usize::from(r.rule) < rules.len());
    (fits && numbered && index.is_empty() == rows.is_empty()).then_some(Table {
        rows,
        rules,
        base,
        unsupported: unsupported as usize,
        index,
        index_shift,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory of its own under the system's temporary directory.
    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("rtrace-cficache-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    /// A cache of its own in `scratch(name)`, the ELF file at `path`, and
    /// its table, compiled into the cache.
    fn first_compile(name: &str, path: &str) -> (PathBuf, DiskCache, Vec<u8>, Table) {
        let dir = scratch(name);
        let mut cache = DiskCache::at(dir.clone());
        let data = fs::read(path).unwrap();
        let compiled = cache
            .get_or_compile(&data, crate::stacks::cfi::compile)
            .unwrap();
        (dir, cache, data, compiled)
    }

    #[test]
    fn a_table_read_back_is_the_table_compiled() {
        let (dir, mut cache, data, compiled) =
            first_compile("roundtrip", "/lib/x86_64-linux-gnu/libc.so.6");
        assert_eq!(
            (cache.read, cache.written),
            (0, 1),
            "{:?}",
            cache.write_error
        );
        let never = |_: &[u8]| -> Result<Table, crate::stacks::cfi::CfiError> {
            panic!("compiled again although cached")
        };
        let cached = cache.get_or_compile(&data, never).unwrap();
        assert_eq!((cache.read, cache.written), (1, 1));
        assert!(matches!(cached.rows, Slab::Mapped { .. }));
        assert_eq!(*cached.rows, *compiled.rows);
        assert_eq!(*cached.rules, *compiled.rules);
        assert_eq!(*cached.index, *compiled.index);
        assert_eq!(
            (cached.base, cached.index_shift, cached.unsupported),
            (compiled.base, compiled.index_shift, compiled.unsupported)
        );
        // The same CFI at another place in another file is the same
        // table; other CFI is another.
        let mut moved = data.clone();
        moved.extend_from_slice(b"trailing bytes no section covers");
        cache.get_or_compile(&moved, never).unwrap();
        assert_eq!((cache.read, cache.written), (2, 1));
        let (offset, size) = eh_frame(&data);
        let mut patched = data.clone();
        patched[offset + size / 2] ^= 0x40;
        assert_ne!(DiskCache::key(&patched), DiskCache::key(&data));
        fs::remove_dir_all(dir).unwrap();
    }

    /// The file range of `.eh_frame` in the ELF file `data`.
    fn eh_frame(data: &[u8]) -> (usize, usize) {
        use object::ObjectSection as _;
        let file = object::File::parse(data).unwrap();
        let (offset, size) = file
            .section_by_name(".eh_frame")
            .unwrap()
            .file_range()
            .unwrap();
        (offset as usize, size as usize)
    }

    #[test]
    fn a_damaged_table_is_compiled_again() {
        let (dir, mut cache, data, compiled) =
            first_compile("damaged", "/lib64/ld-linux-x86-64.so.2");
        let file = fs::read_dir(&dir).unwrap().next().unwrap().unwrap().path();
        let bytes = fs::read(&file).unwrap();
        fs::write(&file, &bytes[..bytes.len() - 3]).unwrap();
        let again = cache
            .get_or_compile(&data, crate::stacks::cfi::compile)
            .unwrap();
        assert_eq!((cache.read, cache.written), (0, 2));
        assert_eq!(*again.rows, *compiled.rows);
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn pruning_drops_the_least_recently_used() {
        let dir = scratch("prune");
        fs::create_dir_all(&dir).unwrap();
        let cache = DiskCache::at(dir.clone());
        let now = std::time::SystemTime::now();
        for (i, name) in ["old", "middle", "new"].iter().enumerate() {
            let f = File::create(dir.join(name)).unwrap();
            f.set_len(1000).unwrap();
            f.set_modified(now - std::time::Duration::from_secs(100 * (3 - i as u64)))
                .unwrap();
        }
        cache.prune(2000);
        let mut left: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, ["middle", "new"]);
        fs::remove_dir_all(dir).unwrap();
    }
}

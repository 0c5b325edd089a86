//! The function symbols of an ELF file by file offset, which is how the
//! kernel takes a uprobe's place; and the translation between a file's
//! offsets and its virtual addresses, through its segments.

use std::{collections::HashMap, path::Path};

use anyhow::Context as _;

/// The file offsets of a file's function symbols, by name, as uprobes
/// take them: read once per file, where aya would read the file again for
/// every function attached.
pub fn symbol_offsets(file: &Path) -> anyhow::Result<HashMap<String, u64>> {
    use object::{Object as _, ObjectSection as _, ObjectSymbol as _};
    // Mapped, only the symbol tables are read of a file that may be mostly
    // debug information.
    let data = crate::kernel::memory::Mapped::open(file)
        .with_context(|| format!("cannot read {}", file.display()))?;
    let obj = object::File::parse(&*data)
        .with_context(|| format!("{} is not an ELF file", file.display()))?;
    // Executables and shared objects give virtual addresses, which are
    // moved to file offsets through their section.
    let translate = matches!(
        obj.kind(),
        object::ObjectKind::Dynamic | object::ObjectKind::Executable
    );
    let mut out = HashMap::new();
    for sym in obj.dynamic_symbols().chain(obj.symbols()) {
        if sym.is_undefined() || sym.kind() != object::SymbolKind::Text {
            continue;
        }
        let Ok(name) = sym.name() else { continue };
        let offset = if translate {
            let Some(section) = sym
                .section_index()
                .and_then(|i| obj.section_by_index(i).ok())
            else {
                continue;
            };
            let Some((file_off, _)) = section.file_range() else {
                continue;
            };
            sym.address() - section.address() + file_off
        } else {
            sym.address()
        };
        // Names may repeat (versioned symbols); the first wins, as in aya.
        out.entry(name.to_owned()).or_insert(offset);
    }
    Ok(out)
}

/// Whether the file's dynamic string table holds `name` whole, or the
/// file has no section table to tell by: a search of the table's bytes,
/// to pass over the files that cannot export `name` without a walk of
/// their symbols (node's own dynamic symbols are 75 thousand, ten
/// milliseconds to walk by name).
pub fn dynstr_holds(elf: &object::File<'_>, name: &str) -> bool {
    use object::{Object as _, ObjectSection as _};
    let Some(table) = elf.section_by_name(".dynstr").and_then(|s| s.data().ok()) else {
        return true;
    };
    // Each name ends with a NUL; a table may keep a name as the tail of
    // a longer one, so what comes before it is not looked at.
    let mut whole = Vec::with_capacity(name.len() + 1);
    whole.extend_from_slice(name.as_bytes());
    whole.push(0);
    memchr::memmem::find(table, &whole).is_some()
}

/// The defined symbols of `elf`, a 64-bit ELF file (`.dynsym`, then
/// `.symtab`), whose names start with one of `prefixes`, as (name,
/// address); `None` if it is no such file. Each string table is searched
/// for the prefixes first, and only the symbols whose names begin where
/// one was found are read: a walk of every symbol by name reads every
/// name (node's 185 thousand, about 20 ms). A prefix found in the middle
/// of a longer string (tables may share tails) is a start it is checked
/// at too.
pub fn symbols_with_prefixes<'d>(
    elf: &object::File<'d>,
    prefixes: &[&str],
) -> Option<Vec<(&'d str, u64)>> {
    use object::Object as _;
    use object::read::elf::Sym as _;
    let object::File::Elf64(elf) = elf else {
        return None;
    };
    let endian = elf.endian();
    let mut out = Vec::new();
    for table in [elf.elf_dynamic_symbol_table(), elf.elf_symbol_table()] {
        if table.is_empty() {
            continue;
        }
        let Some(strings) = elf
            .section_by_index(table.string_section())
            .ok()
            .and_then(|s| object::ObjectSection::data(&s).ok())
        else {
            continue;
        };
        let starts: std::collections::HashSet<u32> = prefixes
            .iter()
            .flat_map(|p| memchr::memmem::find_iter(strings, p.as_bytes()))
            .filter_map(|at| u32::try_from(at).ok())
            .collect();
        if starts.is_empty() {
            continue;
        }
        let names = table.strings();
        for sym in table.symbols() {
            if sym.is_undefined(endian) || !starts.contains(&sym.st_name(endian)) {
                continue;
            }
            let Some(name) = sym
                .name(endian, names)
                .ok()
                .and_then(|n| std::str::from_utf8(n).ok())
            else {
                continue;
            };
            if prefixes.iter().any(|p| name.starts_with(p)) {
                out.push((name, sym.st_value(endian)));
            }
        }
    }
    Some(out)
}

/// The file offset of virtual address `addr` in `elf`: through the
/// segment whose file-backed bytes hold it.
pub fn vaddr_to_offset(elf: &object::File<'_>, addr: u64) -> Option<u64> {
    use object::{Object as _, ObjectSegment as _};
    elf.segments().find_map(|s| {
        let (start, size) = s.file_range();
        (s.address() <= addr && addr < s.address() + size).then(|| addr - s.address() + start)
    })
}

/// The virtual address of file offset `off` in `elf`: through the segment
/// that maps it.
pub fn offset_to_vaddr(elf: &object::File<'_>, off: u64) -> Option<u64> {
    use object::{Object as _, ObjectSegment as _};
    elf.segments().find_map(|s| {
        let (start, size) = s.file_range();
        (start <= off && off < start + size).then(|| off - start + s.address())
    })
}

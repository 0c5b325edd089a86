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

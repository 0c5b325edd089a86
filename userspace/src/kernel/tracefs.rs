//! tracefs: mounting it when missing, and reading tracepoint record layouts
//! from their `format` files.

use std::{collections::HashMap, path::PathBuf};

const MOUNT_POINTS: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

/// Errors from tracefs.
#[derive(Debug, thiserror::Error)]
pub enum TracefsError {
    /// tracefs is not mounted and could not be mounted.
    #[error("tracefs is not mounted at /sys/kernel/tracing and mounting it failed: {0}")]
    Mount(std::io::Error),
    /// The tracepoint does not exist on this kernel.
    #[error("tracepoint {0} does not exist on this kernel")]
    NoTracepoint(String),
    /// A field the program needs is missing from the record.
    #[error("tracepoint {tracepoint} has no field {field}")]
    NoField {
        /// category:name.
        tracepoint: String,
        /// The missing field.
        field: String,
    },
}

/// Whether the running kernel has tracepoint `category:event`: `None`
/// where tracefs cannot be read to tell.
pub fn has_event(category: &str, event: &str) -> Option<bool> {
    let root = root().ok()?;
    Some(root.join("events").join(category).join(event).is_dir())
}

/// Returns tracefs' mount point, mounting it first if nothing is mounted.
pub fn root() -> Result<PathBuf, TracefsError> {
    for dir in MOUNT_POINTS {
        if std::path::Path::new(dir).join("events").is_dir() {
            return Ok(dir.into());
        }
    }
    let target = c"/sys/kernel/tracing";
    // SAFETY: all pointers are valid NUL-terminated strings.
    let rc = unsafe {
        libc::mount(
            c"nodev".as_ptr(),
            target.as_ptr(),
            c"tracefs".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(TracefsError::Mount(std::io::Error::last_os_error()));
    }
    Ok(MOUNT_POINTS[0].into())
}

/// One field of a tracepoint record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    /// The C declaration's type, e.g. `pid_t` or `char[16]`.
    pub c_type: String,
    /// Byte offset in the record.
    pub offset: u32,
    /// Size in bytes.
    pub size: u32,
    /// Whether the type is signed.
    pub signed: bool,
}

/// The text of `events/CATEGORY/NAME/format`.
fn format_text(category: &str, name: &str) -> Result<String, TracefsError> {
    let path = root()?
        .join("events")
        .join(category)
        .join(name)
        .join("format");
    std::fs::read_to_string(path)
        .map_err(|_| TracefsError::NoTracepoint(format!("{category}:{name}")))
}

/// The layout of one tracepoint's record.
#[derive(Debug, Clone)]
pub struct Format {
    name: String,
    fields: HashMap<String, Field>,
}

impl Format {
    /// Reads `events/CATEGORY/NAME/format`.
    pub fn read(category: &str, name: &str) -> Result<Self, TracefsError> {
        let text = format_text(category, name)?;
        Ok(Self::parse(&format!("{category}:{name}"), &text))
    }

    /// The symbols a tracepoint's `print fmt` spells out for its flags and
    /// enums (`{(unsigned long)(...), "GFP_ATOMIC"}`), as (name, C
    /// expression): the kernel's own table of macros BTF does not carry.
    pub fn print_symbols(
        category: &str,
        name: &str,
    ) -> Result<Vec<(String, String)>, TracefsError> {
        let text = format_text(category, name)?;
        let fmt = text
            .lines()
            .find(|l| l.starts_with("print fmt:"))
            .unwrap_or_default();
        Ok(fmt
            .split('{')
            .skip(1)
            .filter_map(|piece| {
                let body = &piece[..piece.find("\"}")?];
                let (expr, symbol) = body.rsplit_once(", \"")?;
                Some((symbol.to_owned(), expr.trim().to_owned()))
            })
            .collect())
    }

    /// Parses the text of a `format` file.
    pub fn parse(name: &str, text: &str) -> Self {
        let mut fields = HashMap::new();
        for line in text.lines() {
            let Some(rest) = line.trim().strip_prefix("field:") else {
                continue;
            };
            let mut decl = "";
            let (mut offset, mut size, mut signed) = (None, None, false);
            for part in rest.split(';').map(str::trim) {
                if let Some(v) = part.strip_prefix("offset:") {
                    offset = v.parse().ok();
                } else if let Some(v) = part.strip_prefix("size:") {
                    size = v.parse().ok();
                } else if let Some(v) = part.strip_prefix("signed:") {
                    signed = v == "1";
                } else if decl.is_empty() {
                    decl = part;
                }
            }
            let (Some(offset), Some(size)) = (offset, size) else {
                continue;
            };
            // "char prev_comm[16]" -> name "prev_comm", type "char[16]".
            let (head, array) = match decl.find('[') {
                Some(i) => (&decl[..i], &decl[i..]),
                None => (decl, ""),
            };
            let split = head.rfind([' ', '*']).map_or(0, |i| i + 1);
            let field_name = head[split..].to_owned();
            let c_type = format!("{}{array}", head[..split].trim());
            fields.insert(
                field_name,
                Field {
                    c_type,
                    offset,
                    size,
                    signed,
                },
            );
        }
        Self {
            name: name.to_owned(),
            fields,
        }
    }

    /// The fields' names, sorted, for error messages.
    pub fn names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self
            .fields
            .keys()
            .map(String::as_str)
            .filter(|n| !n.starts_with("common_"))
            .collect();
        names.sort_unstable();
        names
    }

    /// The fields after the common ones, in their record's order, with
    /// their names.
    pub fn fields_in_order(&self) -> Vec<(&str, &Field)> {
        let mut fields: Vec<(&str, &Field)> = self
            .fields
            .iter()
            .filter(|(n, _)| !n.starts_with("common_"))
            .map(|(n, f)| (n.as_str(), f))
            .collect();
        fields.sort_by_key(|(_, f)| f.offset);
        fields
    }

    /// Looks a field up by name.
    pub fn field(&self, name: &str) -> Result<&Field, TracefsError> {
        self.fields.get(name).ok_or_else(|| TracefsError::NoField {
            tracepoint: self.name.clone(),
            field: name.to_owned(),
        })
    }

    /// The byte offset of a field.
    pub fn offset(&self, name: &str) -> Result<u32, TracefsError> {
        self.field(name).map(|f| f.offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCHED_SWITCH: &str = "name: sched_switch
ID: 316
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:char prev_comm[16];\toffset:8;\tsize:16;\tsigned:0;
\tfield:pid_t prev_pid;\toffset:24;\tsize:4;\tsigned:1;
\tfield:long prev_state;\toffset:32;\tsize:8;\tsigned:1;
\tfield:const char * filename;\toffset:40;\tsize:8;\tsigned:0;

print fmt: \"prev_comm=%s\"";

    #[test]
    fn parses_fields() {
        let f = Format::parse("sched:sched_switch", SCHED_SWITCH);
        let comm = f.field("prev_comm").unwrap();
        assert_eq!(
            (comm.c_type.as_str(), comm.offset, comm.size),
            ("char[16]", 8, 16)
        );
        let pid = f.field("prev_pid").unwrap();
        assert_eq!(
            (pid.c_type.as_str(), pid.offset, pid.signed),
            ("pid_t", 24, true)
        );
        assert_eq!(f.offset("prev_state").unwrap(), 32);
        assert_eq!(f.field("filename").unwrap().c_type, "const char *");
        assert!(f.offset("nope").unwrap_err().to_string().contains("nope"));
    }

    #[test]
    fn reads_the_running_kernels_format() {
        let f = Format::read("sched", "sched_switch").unwrap();
        assert_eq!(f.field("next_comm").unwrap().size, 16);
        assert_eq!(f.field("next_pid").unwrap().size, 4);
    }
}

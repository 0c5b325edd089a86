//! What symbolizing gives: frames, the kind of code each is in, the
//! mapping its address is in (for pprof), and how frames name their
//! places in their code.

use std::sync::Arc;

/// What kind of code a frame is in; flame graphs color by it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// The kernel (or a kernel module, or a BPF program).
    Kernel,
    /// A user-space ELF file.
    User,
    /// JIT-compiled code named by a perf map.
    Jit,
    /// A function of an interpreted language, named by its runtime's perf
    /// map (Python's `py::` trampolines, V8's `~` functions, the JVM's
    /// `Interpreter`).
    Interpreted,
    /// A function inlined into the frame below it.
    Inlined,
}

impl Kind {
    /// The suffix flame graphs colour by: FlameGraph's and inferno's
    /// `java` palette know `_[k]`, `_[j]` and `_[i]`; rtrace's mixed
    /// palette adds `_[p]` for interpreted code.
    pub fn annotation(self) -> &'static str {
        match self {
            Self::Kernel => "_[k]",
            Self::User => "",
            Self::Jit => "_[j]",
            Self::Interpreted => "_[p]",
            Self::Inlined => "_[i]",
        }
    }
}

/// One frame of a symbolized stack. Frames are alike (`Eq`, `Hash`) by
/// what they show: name, kind, module and line, not by address, so that
/// samples of one function merge whatever instruction they hit.
#[derive(Clone, Debug)]
pub struct Frame {
    /// The function's name, demangled, or `[unknown]`; shared, as stacks
    /// repeat it.
    pub name: Arc<str>,
    /// What kind of code it is.
    pub kind: Kind,
    /// The file the code is in (`[kernel]` and `[jit]` for those), if known.
    pub module: Option<Arc<str>>,
    /// The source file and line of the frame's own code (`main.c:12`),
    /// where lines are asked for and the debug information has them.
    pub line: Option<Arc<str>>,
    /// An address in the frame's code, as the process saw it (the call
    /// itself for callers), and the mapping it is in; 0 and `None` where
    /// unknown. One of the addresses of frames that are alike.
    pub addr: u64,
    /// See [`Frame::addr`].
    pub mapping: Option<Arc<CodeMapping>>,
}

impl PartialEq for Frame {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
            && self.kind == other.kind
            && self.module == other.module
            && self.line == other.line
    }
}

impl Eq for Frame {}

impl std::hash::Hash for Frame {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.name.hash(h);
        self.kind.hash(h);
        self.module.hash(h);
        self.line.hash(h);
    }
}

/// A mapping of code, as pprof describes it.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct CodeMapping {
    /// Its first address in the process, and the one after its last.
    pub start: u64,
    /// See [`CodeMapping::start`].
    pub limit: u64,
    /// The file offset of `start`.
    pub offset: u64,
    /// The file's path (`[kernel.kallsyms]` for the kernel).
    pub file: String,
    /// The file's GNU build id, in hex, where it has one.
    pub build_id: Option<String>,
}

impl Frame {
    /// A frame of `kind` named `name`, in `module`, with no line or
    /// address.
    pub fn new(name: impl Into<Arc<str>>, kind: Kind, module: Option<&str>) -> Self {
        Self {
            name: name.into(),
            kind,
            module: module.map(Arc::from),
            line: None,
            addr: 0,
            mapping: None,
        }
    }

    /// The file name and line number of [`Frame::line`].
    pub fn file_line(&self) -> Option<(&str, u32)> {
        let (file, line) = self.line.as_deref()?.rsplit_once(':')?;
        Some((file, line.parse().ok()?))
    }

    /// A placeholder for a stack that could not be walked or stored.
    pub fn missed(name: &str, kind: Kind) -> Self {
        Self::new(name, kind, None)
    }

    pub(super) fn unknown(kind: Kind, module: Option<&str>) -> Self {
        Self::new("[unknown]", kind, module)
    }
}

/// How frames name their places in their code, beside their functions.
#[derive(Debug, Clone, Copy, Default)]
pub struct Places {
    /// `func+0x1a`.
    pub offsets: bool,
    /// `0xffffffff8110a5c1 func`.
    pub addresses: bool,
}

//! What a run could not do as asked, and of which kind. Every layer makes
//! warnings (the stack walk, the symbolizer, the tracer's loss counters),
//! so they live at the bottom; the kind is known where a warning is made,
//! and printed with it, so that a reader (a script, a test) can tell lost
//! work from unnamed frames without knowing every sentence.

use std::fmt;

/// The kinds of warning: what was harmed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Events, samples or records were lost or not counted.
    Lost,
    /// Stacks were cut short, or walked by a lesser way (frame pointers
    /// where CFI was wanted, native frames where Python's were).
    Unwalked,
    /// Frames were left unnamed, or named less well than they could be
    /// (`[unknown]`, `[python]`, JIT code).
    Unnamed,
    /// Something asked for cannot be done here, and the run does without
    /// it (an option this kernel cannot honour, a terminal view).
    Unsupported,
}

impl Kind {
    /// The kind's word, as printed between brackets.
    pub fn word(self) -> &'static str {
        match self {
            Kind::Lost => "lost",
            Kind::Unwalked => "unwalked",
            Kind::Unnamed => "unnamed",
            Kind::Unsupported => "unsupported",
        }
    }
}

/// One warning: its kind and its sentence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Warning {
    /// What was harmed.
    pub kind: Kind,
    /// What happened, for a person.
    pub text: String,
}

impl Warning {
    /// A warning of `kind` saying `text`.
    pub fn new(kind: Kind, text: impl Into<String>) -> Self {
        Warning {
            kind,
            text: text.into(),
        }
    }

    /// Events, samples or records were lost.
    pub fn lost(text: impl Into<String>) -> Self {
        Self::new(Kind::Lost, text)
    }

    /// Stacks were cut short or walked by a lesser way.
    pub fn unwalked(text: impl Into<String>) -> Self {
        Self::new(Kind::Unwalked, text)
    }

    /// Frames were left unnamed.
    pub fn unnamed(text: impl Into<String>) -> Self {
        Self::new(Kind::Unnamed, text)
    }

    /// Something asked for cannot be done here.
    pub fn unsupported(text: impl Into<String>) -> Self {
        Self::new(Kind::Unsupported, text)
    }

    /// Prints the warning on stderr as one line.
    pub fn print(&self) {
        eprintln!("{self}");
    }
}

/// `rtrace: warning[KIND]: TEXT`, the compilers' form: the kind stands at
/// a fixed place, and `grep 'rtrace: warning'` still finds every one.
impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rtrace: warning[{}]: {}", self.kind.word(), self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_warning_names_its_kind_before_its_text() {
        let w = Warning::unnamed("31 Python frames are [python]");
        assert_eq!(
            w.to_string(),
            "rtrace: warning[unnamed]: 31 Python frames are [python]"
        );
    }
}

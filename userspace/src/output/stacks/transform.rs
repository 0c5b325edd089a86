//! Stack transforms: hiding frames, collapsing what is above a frame into
//! it, and flattening recursion. The same in every output of profile and
//! offcputime and in `rtrace flamegraph` on folded stacks.

use std::{collections::HashMap, sync::Arc};

use regex::Regex;

use crate::stacks::sample::Sample;
use crate::stacks::symbolize::Frame;

/// The transforms, as every stack command takes them.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct TransformArgs {
    /// Drop frames whose name matches REGEX (repeatable), such as
    /// `^__libc_` or a logging wrapper; their callees join their caller.
    #[arg(long, value_name = "REGEX", value_parser = parse_regex)]
    pub hide: Vec<Regex>,
    /// Fold everything above a frame whose name matches REGEX into that
    /// frame (repeatable): a garbage collector or an allocator then shows
    /// as one frame with all its time.
    #[arg(long, value_name = "REGEX", value_parser = parse_regex)]
    pub collapse: Vec<Regex>,
    /// Turn runs of one frame calling itself into one frame, so that a hot
    /// recursive function shows as one frame, not a tower.
    #[arg(long)]
    pub collapse_recursion: bool,
}

fn parse_regex(s: &str) -> Result<Regex, String> {
    Regex::new(s).map_err(|e| {
        // The crate's message spans lines; the first says what is wrong.
        let why = e.to_string();
        let last = why.lines().last().unwrap_or("invalid").trim().to_owned();
        format!("not a regular expression: {last}")
    })
}

impl TransformArgs {
    /// Whether no transform was asked for.
    pub fn is_empty(&self) -> bool {
        self.hide.is_empty() && self.collapse.is_empty() && !self.collapse_recursion
    }

    /// Transforms a stack given root first, each frame named by `name`.
    pub fn apply<T>(&self, frames: Vec<T>, name: impl Fn(&T) -> &str) -> Vec<T> {
        let mut out: Vec<T> = Vec::with_capacity(frames.len());
        for f in frames {
            let n = name(&f);
            if self.hide.iter().any(|r| r.is_match(n)) {
                continue;
            }
            if self.collapse_recursion && out.last().is_some_and(|last| name(last) == n) {
                continue;
            }
            let fold = self.collapse.iter().any(|r| r.is_match(n));
            out.push(f);
            if fold {
                break;
            }
        }
        out
    }

    /// Transforms every sample's own frames (user then kernel, root
    /// first; a waker's are left as they are), then merges the samples
    /// that became alike. Hottest first.
    pub fn samples(&self, samples: Vec<Sample>) -> Vec<Sample> {
        if self.is_empty() {
            return samples;
        }
        let transformed = samples.into_iter().map(|mut s| {
            let root_first: Vec<(bool, Frame)> = s
                .user
                .iter()
                .rev()
                .map(|f| (false, f.clone()))
                .chain(s.kernel.iter().rev().map(|f| (true, f.clone())))
                .collect();
            let kept = self.apply(root_first, |(_, f)| &f.name);
            let leaf_first = |kernel: bool| -> Arc<[Frame]> {
                kept.iter()
                    .rev()
                    .filter(|(k, _)| *k == kernel)
                    .map(|(_, f)| f.clone())
                    .collect()
            };
            s.user = leaf_first(false);
            s.kernel = leaf_first(true);
            s
        });
        // Leaves kept at their exact addresses stay apart (annotate).
        super::merge(transformed.collect(), true)
    }

    /// Transforms folded lines (`frame;frame;... count`, root first, as
    /// rtrace and perf's stackcollapse write them) and merges the lines
    /// that became alike, in first-seen order.
    pub fn folded(&self, text: &str) -> Result<Vec<String>, FoldedError> {
        let mut order: Vec<String> = Vec::new();
        let mut counts: HashMap<String, u64> = HashMap::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim_end();
            if line.is_empty() {
                continue;
            }
            let (stack, count) = line
                .rsplit_once(' ')
                .and_then(|(s, c)| Some((s, c.parse::<u64>().ok()?)))
                .ok_or(FoldedError { line: i + 1 })?;
            let frames = self.apply(stack.split(';').collect(), |f| strip_annotation(f));
            let stack = frames.join(";");
            match counts.get_mut(&stack) {
                Some(c) => *c += count,
                None => {
                    order.push(stack.clone());
                    counts.insert(stack, count);
                }
            }
        }
        Ok(order
            .into_iter()
            .map(|s| {
                let c = counts[&s];
                format!("{s} {c}")
            })
            .collect())
    }
}

/// A folded line without a count.
#[derive(Debug, thiserror::Error)]
#[error("line {line} is not a folded stack (frames separated by ';', then a space and a count)")]
pub struct FoldedError {
    line: usize,
}

/// A folded frame's name without the `_[k]`-style suffix flame graphs
/// colour by, so that patterns match what is shown.
fn strip_annotation(f: &str) -> &str {
    match f.rfind("_[") {
        Some(i) if f.ends_with(']') && f.len() - i <= 5 => &f[..i],
        _ => f,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(hide: &[&str], collapse: &[&str], recursion: bool) -> TransformArgs {
        TransformArgs {
            hide: hide.iter().map(|r| Regex::new(r).unwrap()).collect(),
            collapse: collapse.iter().map(|r| Regex::new(r).unwrap()).collect(),
            collapse_recursion: recursion,
        }
    }

    #[test]
    fn each_transform_on_folded_lines() {
        let text =
            "app;main;gc;mark;scan 3\napp;main;work;work;work;leaf 5\napp;main;log;write 2\n";
        let t = args(&["^log$"], &["^gc$"], true);
        assert_eq!(
            t.folded(text).unwrap(),
            ["app;main;gc 3", "app;main;work;leaf 5", "app;main;write 2"]
        );
        // Stacks that become alike merge.
        let t = args(&[], &["^main$"], false);
        assert_eq!(t.folded(text).unwrap(), ["app;main 10"]);
        assert!(t.folded("no count here\n").is_err());
        // Annotated frames match by their shown name.
        let t = args(&["^schedule$"], &[], false);
        assert_eq!(t.folded("a;schedule_[k];b_[k] 1").unwrap(), ["a;b_[k] 1"]);
    }
}

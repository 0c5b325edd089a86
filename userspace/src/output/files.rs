//! Report files (`--svg`, `--pprof`, `--speedscope`, `--html`,
//! `--firefox`, `--samples`, `flamegraph --svg`):
//! each is created when the command starts, before anything is attached
//! or read, so that a path that cannot be written fails at once rather
//! than after the whole run; it is a temporary file in the folder it will
//! be in, renamed into place only once written whole, so that a run that
//! fails half way leaves nothing behind. A path that is already something
//! other than a file (`/dev/null`, `/dev/stdout`, a named pipe) is written
//! in place: renaming over it would replace the device or pipe with a
//! file, for every program on the machine.

use std::{
    io::{BufWriter, Write},
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
};

use anyhow::Context as _;

use crate::output::stacks::report::ReportArgs;

/// A report file, created and waiting for its contents.
#[derive(Debug)]
pub struct ReportFile {
    path: PathBuf,
    dest: Dest,
}

/// Where a report file's bytes go.
#[derive(Debug)]
enum Dest {
    /// A temporary file, renamed into place once written.
    Temp(tempfile::NamedTempFile),
    /// A device or pipe already at the path, opened for writing.
    Special(std::fs::File),
}

impl ReportFile {
    /// Creates the stand-in for `path` in its folder.
    pub fn create(path: &Path) -> anyhow::Result<Self> {
        if path.is_dir() {
            anyhow::bail!("cannot write {}: it is a directory", path.display());
        }
        if let Ok(meta) = std::fs::metadata(path)
            && !meta.is_file()
        {
            let file = std::fs::OpenOptions::new()
                .write(true)
                .open(path)
                .with_context(|| format!("cannot write {}", path.display()))?;
            return Ok(Self {
                path: path.to_owned(),
                dest: Dest::Special(file),
            });
        }
        let name = path
            .file_name()
            .with_context(|| format!("cannot write {}: no file name", path.display()))?;
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let tmp = tempfile::Builder::new()
            .prefix(&format!(".{}.", name.to_string_lossy()))
            // As `File::create` would: the umask decides.
            .permissions(std::fs::Permissions::from_mode(0o666))
            .tempfile_in(dir)
            // The error's own text ends with the temporary file's name,
            // not the one asked for.
            .map_err(|e| {
                let text = e.to_string();
                let cause = text.split(" at path ").next().unwrap_or(&text);
                anyhow::anyhow!("cannot create {}: {cause}", path.display())
            })?;
        Ok(Self {
            path: path.to_owned(),
            dest: Dest::Temp(tmp),
        })
    }

    /// Writes the file with `fill`, puts it in place and says so on
    /// stderr, with `what` it holds (e.g. `1,234 samples, 56 stacks`).
    pub fn write(
        self,
        what: &str,
        fill: impl FnOnce(&mut dyn Write) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        let path = self.write_quietly(fill)?;
        eprintln!("rtrace: wrote {} ({what})", path.display());
        Ok(())
    }

    /// Writes the file with `fill` and puts it in place, saying nothing;
    /// returns where it is.
    pub fn write_quietly(
        self,
        fill: impl FnOnce(&mut dyn Write) -> anyhow::Result<()>,
    ) -> anyhow::Result<std::path::PathBuf> {
        let path = self.path;
        let file = match &self.dest {
            Dest::Temp(tmp) => tmp.as_file(),
            Dest::Special(f) => f,
        };
        let mut out = BufWriter::new(file);
        fill(&mut out)
            .and_then(|()| out.flush().map_err(anyhow::Error::from))
            .with_context(|| format!("cannot write {}", path.display()))?;
        drop(out);
        if let Dest::Temp(tmp) = self.dest {
            tmp.persist(&path)
                .map_err(|e| anyhow::anyhow!("cannot write {}: {}", path.display(), e.error))?;
        }
        Ok(path)
    }
}

/// The per-sample files, declared once for every tool that can send
/// each sample (event, wait, allocation) on its own with its time, CPU
/// and thread: the stack tools' group flattens it, and the tools with
/// files of their own (memleak, wakeuptime, stackcount, report) take it
/// alone.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct PerSampleOutputs {
    /// Write a Firefox Profiler profile (processed JSON) to FILE; open it
    /// by dragging it into https://profiler.firefox.com. A thread per
    /// thread, its samples in time order, and a hidden thread per CPU.
    #[arg(long, value_name = "FILE")]
    pub firefox: Option<PathBuf>,
    /// Write one row per sample to FILE, for notebooks: .jsonl (JSON
    /// lines, the stack a list of frames, root first) or .csv (the stack
    /// one ;-joined column, root first). Columns: time (ns since the Unix
    /// epoch), cpu, pid, tid, process, weight, stack.
    #[arg(long, value_name = "FILE")]
    pub samples: Option<PathBuf>,
}

impl PerSampleOutputs {
    /// Whether each sample is wanted on its own, with its time, CPU and
    /// thread (`--firefox`, `--samples`), not only counted by stack.
    pub fn any(&self) -> bool {
        self.firefox.is_some() || self.samples.is_some()
    }

    /// The per-sample flag given, for a tool that cannot honour it to
    /// refuse it by name.
    pub fn flag(&self) -> Option<&'static str> {
        if self.firefox.is_some() {
            Some("--firefox")
        } else if self.samples.is_some() {
            Some("--samples")
        } else {
            None
        }
    }
}

/// The outputs of a stack tool's whole run, declared once for every
/// tool that takes them: the files, and perf report's table.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct StackOutputs {
    /// Write a flame graph (SVG) to FILE.
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
    /// Draw the flame graph upside down, as an icicle graph.
    #[arg(long, requires = "svg")]
    pub icicle: bool,
    /// Write a gzipped pprof profile (profile.proto) to FILE.
    #[arg(long, value_name = "FILE")]
    pub pprof: Option<PathBuf>,
    /// Write a speedscope profile (JSON) to FILE.
    #[arg(long, value_name = "FILE")]
    pub speedscope: Option<PathBuf>,
    /// Write a sub-second heat map (SVG) to FILE, as FlameScope draws it:
    /// a column per second, a row per 20 ms, each cell coloured by its
    /// samples. Counted in the kernel, slot by slot, with no event per
    /// sample; at most the first 10 minutes without a duration.
    #[arg(long, value_name = "FILE")]
    pub heatmap: Option<PathBuf>,
    /// Write one self-contained page (HTML) to FILE: the heat map, where
    /// dragging over cells selects a range of time; the flame graph of
    /// the run or of that range, with zoom, search and an icicle view;
    /// perf report's table; and the run's facts. It loads nothing from
    /// the network. Stacks are counted by 20 ms slot for it.
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
    #[command(flatten)]
    pub each: PerSampleOutputs,
    /// Print perf report's table instead of stacks: overhead with
    /// children and self by --sort keys (comm, dso, sym), shaped by the
    /// report options (--hierarchy, -g, --percent-limit and the rest).
    #[arg(long)]
    pub report: bool,
    #[command(flatten)]
    pub report_opts: Box<ReportArgs>,
}

impl StackOutputs {
    /// Creates each file asked for, before anything is attached; a table
    /// option without `--report` is an error.
    pub fn create(&self) -> anyhow::Result<StackReports> {
        if !self.report
            && let Some(flag) = self.report_opts.changed()
        {
            anyhow::bail!("{flag} shapes perf report's table: add --report");
        }
        StackReports::create([
            self.svg.as_deref(),
            self.pprof.as_deref(),
            self.speedscope.as_deref(),
            self.heatmap.as_deref(),
            self.html.as_deref(),
            self.each.firefox.as_deref(),
            self.each.samples.as_deref(),
        ])
    }

    /// Whether each sample is wanted on its own (see
    /// [`PerSampleOutputs::any`]).
    pub fn per_sample(&self) -> bool {
        self.each.any()
    }

    /// The per-sample flag given (see [`PerSampleOutputs::flag`]).
    pub fn per_sample_flag(&self) -> Option<&'static str> {
        self.each.flag()
    }

    /// Whether a file of stacks is asked for, which the text output then
    /// leaves the stacks to (a heat map holds none).
    pub fn files(&self) -> bool {
        self.svg.is_some()
            || self.pprof.is_some()
            || self.speedscope.is_some()
            || self.html.is_some()
            || self.per_sample()
    }
}

/// The report files a stack tool was asked for, created at its start.
#[derive(Debug, Default)]
pub struct StackReports {
    /// `--svg`.
    pub svg: Option<ReportFile>,
    /// `--pprof`.
    pub pprof: Option<ReportFile>,
    /// `--speedscope`.
    pub speedscope: Option<ReportFile>,
    /// `--heatmap`.
    pub heatmap: Option<ReportFile>,
    /// `--html`.
    pub html: Option<ReportFile>,
    /// `--firefox`.
    pub firefox: Option<ReportFile>,
    /// `--samples`, with the format its extension names.
    pub samples: Option<(ReportFile, crate::output::stacks::samplefile::Format)>,
}

impl StackReports {
    /// Writes the per-sample files asked for (`--firefox` with `meta`,
    /// `--samples`), each announced as holding `what`; the files are
    /// taken, so that a second call writes nothing.
    pub fn write_each(
        &mut self,
        timed: &[crate::stacks::sample::Timed],
        meta: &crate::output::stacks::firefox::Meta,
        what: &str,
    ) -> anyhow::Result<()> {
        if let Some(file) = self.firefox.take() {
            file.write(what, |out| {
                crate::output::stacks::firefox::write(timed, meta, out)
            })?;
        }
        if let Some((file, format)) = self.samples.take() {
            file.write(what, |out| {
                crate::output::stacks::samplefile::write(timed, format, out)
            })?;
        }
        Ok(())
    }

    /// Creates each file asked for: svg, pprof, speedscope, heat map,
    /// page, Firefox profile, samples. A samples file's extension is
    /// checked first, so that a wrong one creates nothing.
    pub fn create(paths: [Option<&Path>; 7]) -> anyhow::Result<Self> {
        let format = paths[6]
            .map(crate::output::stacks::samplefile::Format::of)
            .transpose()?;
        let [svg, pprof, speedscope, heatmap, html, firefox, samples] =
            paths.map(|p| p.map(ReportFile::create));
        Ok(Self {
            svg: svg.transpose()?,
            pprof: pprof.transpose()?,
            speedscope: speedscope.transpose()?,
            heatmap: heatmap.transpose()?,
            html: html.transpose()?,
            firefox: firefox.transpose()?,
            samples: samples.transpose()?.zip(format),
        })
    }
}

/// What a stack report holds, for the line announcing it: the total of
/// the counts, in `unit`, and the stacks.
pub fn held(samples: &[crate::stacks::sample::Sample], unit: &str) -> String {
    let total: u64 = samples.iter().map(|s| s.count).sum();
    format!(
        "{} {unit}, {} stacks",
        thousands(total),
        thousands(samples.len() as u64)
    )
}

/// `n` with a comma between each group of three digits.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{ReportFile, thousands};

    #[test]
    fn counts_are_grouped_by_thousands() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(12_345_678), "12,345,678");
    }

    #[test]
    fn a_file_appears_only_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.txt");
        let f = ReportFile::create(&path).unwrap();
        assert!(!path.exists());
        f.write("1 line", |w| Ok(w.write_all(b"hello\n")?)).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "hello\n");
        let f = ReportFile::create(&dir.path().join("failed.txt")).unwrap();
        assert!(f.write("", |_| anyhow::bail!("no")).is_err());
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(left.len(), 1, "{left:?}");
        assert!(ReportFile::create(&dir.path().join("no/such/dir.svg")).is_err());
        assert!(ReportFile::create(dir.path()).is_err());
    }
}

//! `rtrace flamegraph`: flame graphs from folded stacks made earlier, by
//! rtrace (`profile -f`) or by perf's and FlameGraph's stackcollapse.

use std::path::{Path, PathBuf};

use anyhow::Context as _;

use crate::output::stacks::{self, FlameOptions, transform::TransformArgs};

/// Draw flame graphs from folded stacks (differential: `diff`).
#[derive(Debug, clap::Args)]
#[command(
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true,
    after_help = "Examples:
  rtrace profile -f 10 > cpu.folded
  rtrace flamegraph cpu.folded --svg cpu.svg
  perf script | stackcollapse-perf.pl --all > perf.folded
  rtrace flamegraph perf.folded --svg perf.svg --colors mixed --collapse-recursion
  rtrace flamegraph diff before.folded after.folded --svg diff.svg"
)]
pub struct Args {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    draw: DrawArgs,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Draw a differential flame graph: the AFTER profile's stacks, red
    /// where they grew since BEFORE and blue where they shrank.
    #[command(after_help = "Example:
  rtrace profile -f 10 > before.folded
  rtrace profile -f 10 > after.folded
  rtrace flamegraph diff before.folded after.folded --svg diff.svg")]
    Diff(DiffArgs),
}

/// A plain flame graph of one folded file.
#[derive(Debug, clap::Args)]
struct DrawArgs {
    /// Folded stacks (`frame;frame;... count` per line), or `-` for stdin.
    #[arg(required = true)]
    input: Option<PathBuf>,
    /// Write the SVG to FILE.
    #[arg(long, value_name = "FILE", required = true)]
    svg: Option<PathBuf>,
    /// The graph's title.
    #[arg(long, default_value = "Flame Graph")]
    title: String,
    /// Draw it upside down, as an icicle graph.
    #[arg(long)]
    icicle: bool,
    /// The colours: `mixed` (kernel, user native, JIT and inlined frames
    /// apart, by their `_[k]`, `_[j]`, `_[i]` suffixes, as `profile -a`
    /// and perf's collapsed stacks mark them), or one of FlameGraph's
    /// palettes: hot, mem, io, wakeup, java, js, perl, python, rust, red,
    /// green, blue, aqua, yellow, purple, orange.
    #[arg(long, value_name = "PALETTE", default_value = "mixed", value_parser = parse_palette)]
    colors: inferno::flamegraph::color::Palette,
    /// What a count stands for, as the tooltips name it.
    #[arg(long, value_name = "NAME", default_value = "samples")]
    count_name: String,
    #[command(flatten)]
    transforms: TransformArgs,
}

#[derive(Debug, clap::Args)]
struct DiffArgs {
    /// Folded stacks of the baseline.
    before: PathBuf,
    /// Folded stacks to compare with it.
    after: PathBuf,
    /// Write the SVG to FILE.
    #[arg(long, value_name = "FILE")]
    svg: PathBuf,
    /// Scale BEFORE to AFTER's total, so that a change in load alone does
    /// not color everything.
    #[arg(short = 'n', long)]
    normalize: bool,
    /// Draw it upside down, as an icicle graph.
    #[arg(long)]
    icicle: bool,
    /// The graph's title.
    #[arg(long, default_value = "Differential flame graph")]
    title: String,
    #[command(flatten)]
    transforms: TransformArgs,
}

fn parse_palette(s: &str) -> Result<inferno::flamegraph::color::Palette, String> {
    if s == "mixed" {
        return Ok(FlameOptions::by_kind());
    }
    s.parse().map_err(|_| {
        "unknown palette; use mixed, hot, mem, io, wakeup, java, js, perl, python, rust, \
         red, green, blue, aqua, yellow, purple or orange"
            .to_owned()
    })
}

/// Reads folded stacks from `path` (`-`: stdin) and applies `transforms`.
fn read_folded(path: &Path, transforms: &TransformArgs) -> anyhow::Result<Vec<String>> {
    let text = if path == Path::new("-") {
        std::io::read_to_string(std::io::stdin()).context("cannot read stdin")?
    } else {
        std::fs::read_to_string(path).with_context(|| format!("cannot open {}", path.display()))?
    };
    transforms
        .folded(&text)
        .with_context(|| format!("{}", path.display()))
}

/// Runs the command.
pub fn run(args: Args) -> anyhow::Result<()> {
    match args.command {
        Some(Command::Diff(d)) => {
            let svg = crate::output::files::ReportFile::create(&d.svg)?;
            let before = read_folded(&d.before, &d.transforms)?.join("\n");
            let after = read_folded(&d.after, &d.transforms)?.join("\n");
            let opts = FlameOptions {
                title: d.title,
                icicle: d.icicle,
                count_name: "samples".to_owned(),
                palette: FlameOptions::by_kind(),
            };
            svg.write("differential flame graph", |out| {
                stacks::write_diff_svg(before.as_bytes(), after.as_bytes(), out, d.normalize, &opts)
            })
        }
        None => {
            let d = args.draw;
            let (Some(input), Some(path)) = (d.input, d.svg) else {
                anyhow::bail!("give folded stacks and --svg FILE, or use `flamegraph diff`");
            };
            let svg = crate::output::files::ReportFile::create(&path)?;
            let lines = read_folded(&input, &d.transforms)?;
            let total: u64 = lines
                .iter()
                .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
                .sum();
            let opts = FlameOptions {
                title: d.title,
                icicle: d.icicle,
                count_name: d.count_name.clone(),
                palette: d.colors,
            };
            let what = format!(
                "{} {}, {} stacks",
                crate::output::files::thousands(total),
                d.count_name,
                crate::output::files::thousands(lines.len() as u64)
            );
            svg.write(&what, |out| stacks::write_folded_svg(&lines, out, &opts))
        }
    }
}

//! `rtrace flamegraph`: flame graphs from folded stacks made earlier, such
//! as two runs of `rtrace profile -f`.

use std::path::PathBuf;

use crate::output::stacks::{self, FlameOptions};

/// Flame graph commands.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
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
}

/// Runs the command.
pub fn run(args: Args) -> anyhow::Result<()> {
    match args.command {
        Command::Diff(d) => {
            let svg = crate::output::files::ReportFile::create(&d.svg)?;
            let opts = FlameOptions {
                title: d.title,
                icicle: d.icicle,
                count_name: "samples".to_owned(),
                palette: FlameOptions::by_kind(),
            };
            svg.write("differential flame graph", |out| {
                stacks::write_diff_svg(&d.before, &d.after, out, d.normalize, &opts)
            })
        }
    }
}

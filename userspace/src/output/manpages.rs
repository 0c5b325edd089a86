//! `rtrace man DIR`: a man page per command, from the clap definitions
//! that make `--help`, so the two cannot drift apart.

use std::path::Path;

use anyhow::Context as _;

/// Writes `rtrace.1` and `rtrace-COMMAND.1` (and `rtrace-COMMAND-SUB.1`
/// for nested commands) of command line `cmd` into `dir`; says on stderr
/// how many.
pub fn write(dir: &Path, mut cmd: clap::Command) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    cmd.build();
    let mut written = 0;
    page(dir, &cmd, "rtrace", &mut written)?;
    eprintln!("rtrace: wrote {written} man pages into {}", dir.display());
    Ok(())
}

/// One command's page, then its subcommands'.
fn page(dir: &Path, cmd: &clap::Command, name: &str, written: &mut usize) -> anyhow::Result<()> {
    let path = dir.join(format!("{name}.1"));
    let file = crate::output::files::ReportFile::create(&path)?;
    let man = clap_mangen::Man::new(cmd.clone().name(name.to_owned()));
    file.write_quietly(|out| man.render(out).map_err(Into::into))?;
    *written += 1;
    for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
        page(dir, sub, &format!("{name}-{}", sub.get_name()), written)?;
    }
    Ok(())
}

//! `rtrace fsslower -t TYPE`: ext4slower's tool on ext4, xfs, btrfs or
//! nfs, as libbpf-tools' fsslower; the shared [`Slower`] on the file
//! system `-t` names. The programs are ext4slower's: the
//! file system's own read, write, open and sync functions for fentry and
//! kprobes, its superblock magic for the syscall tracepoint path.

use super::slower::{self, FILE_SYSTEMS, Fs, FsChoice, Slower};

/// Trace common file system operations slower than a threshold.
#[derive(Debug, clap::Args)]
// Its own group name: the flattened `slower::Args` is named `Args` too,
// and clap's debug checks refuse two groups of one name.
#[group(id = "fsslower")]
#[command(after_help = "Examples:
  rtrace fsslower -t xfs        # xfs operations slower than 10 ms (default)
  rtrace fsslower -t btrfs 1    # btrfs operations slower than 1 ms
  rtrace fsslower -t nfs -m 0   # every nfs operation
  rtrace fsslower -t ext4 -p 185   # as rtrace ext4slower -p 185
  rtrace fsslower -t xfs -m 0 -- tar xf src.tar -C /mnt/xfs   # every xfs operation of one tar
  rtrace fsslower -t xfs 1 -- dd if=/dev/zero of=/mnt/xfs/f bs=1M count=64 conv=fsync")]
pub struct Args {
    /// Which file system: ext4, xfs, btrfs or nfs.
    #[arg(short = 't', long = "type", value_name = "TYPE", value_parser = fs_type)]
    fs: &'static Fs,
    #[command(flatten)]
    slower: slower::Args,
}

fn fs_type(name: &str) -> Result<&'static Fs, String> {
    FILE_SYSTEMS.iter().find(|f| f.name == name).ok_or_else(|| {
        let known: Vec<&str> = FILE_SYSTEMS.iter().map(|f| f.name).collect();
        format!("unknown file system {name:?}: use {}", known.join(", "))
    })
}

/// fsslower's choice: `-t`.
pub struct Any;

impl FsChoice for Any {
    type Args = Args;
    const NAME: &'static str = "fsslower";
    fn split(args: Args) -> (slower::Args, &'static Fs) {
        (args.slower, args.fs)
    }
}

/// `rtrace fsslower`: ext4slower's tool on the file system `-t` names.
pub type Fsslower = Slower<Any>;

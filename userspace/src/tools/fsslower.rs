//! `rtrace fsslower -t TYPE`: ext4slower's tool on ext4, xfs, btrfs or
//! nfs, as libbpf-tools' fsslower. The programs are ext4slower's: the
//! file system's own read, write, open and sync functions for fentry and
//! kprobes, its superblock magic for the syscall tracepoint path.

use aya::Ebpf;

use super::ext4slower::{self, Ext4slower, FILE_SYSTEMS, Fs};
use crate::{
    features::Mechanism,
    output::Sink,
    tracer::{Kernel, Load, Scope, Tool},
    transport::BufferArgs,
};

/// Trace common file system operations slower than a threshold.
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:
  rtrace fsslower -t xfs        # xfs operations slower than 10 ms (default)
  rtrace fsslower -t btrfs 1    # btrfs operations slower than 1 ms
  rtrace fsslower -t nfs -m 0   # every nfs operation
  rtrace fsslower -t ext4 -p 185   # as rtrace ext4slower -p 185")]
pub struct Args {
    /// Which file system: ext4, xfs, btrfs or nfs.
    #[arg(short = 't', long = "type", value_name = "TYPE", value_parser = fs_type)]
    fs: &'static Fs,
    #[command(flatten)]
    slower: ext4slower::Args,
}

fn fs_type(name: &str) -> Result<&'static Fs, String> {
    FILE_SYSTEMS.iter().find(|f| f.name == name).ok_or_else(|| {
        let known: Vec<&str> = FILE_SYSTEMS.iter().map(|f| f.name).collect();
        format!("unknown file system {name:?}: use {}", known.join(", "))
    })
}

/// The tool: ext4slower's, on another file system.
pub struct Fsslower(Ext4slower);

impl Tool for Fsslower {
    type Args = Args;
    const NAME: &'static str = "fsslower";
    const OBJECT: &'static str = Ext4slower::NAME;
    const CHAIN: &'static [Mechanism] = Ext4slower::CHAIN;
    const ERRORS: &'static [&'static str] = Ext4slower::ERRORS;

    fn new(args: Args) -> anyhow::Result<Self> {
        Ext4slower::on(args.slower, args.fs).map(Self)
    }

    fn scope(&self) -> Scope {
        self.0.scope()
    }

    fn forced(&self) -> Option<Mechanism> {
        self.0.forced()
    }

    fn events(&self) -> Option<&BufferArgs> {
        self.0.events()
    }

    fn duration(&self) -> Option<u64> {
        self.0.duration()
    }

    fn variants(&self, m: Option<Mechanism>, kernel: &mut Kernel) -> Vec<&'static str> {
        self.0.variants(m, kernel)
    }

    fn configure(
        &mut self,
        m: Option<Mechanism>,
        kernel: &mut Kernel,
        load: &mut Load,
    ) -> anyhow::Result<()> {
        self.0.configure(m, kernel, load)
    }

    fn attach(
        &mut self,
        m: Option<Mechanism>,
        kernel: &mut Kernel,
        ebpf: &mut Ebpf,
    ) -> anyhow::Result<()> {
        self.0.attach(m, kernel, ebpf)
    }

    fn describe(&self) -> String {
        self.0.describe()
    }

    fn banner(&self) -> String {
        self.0.banner()
    }

    fn header(&self) -> Option<String> {
        self.0.header()
    }

    fn event(&mut self, record: &[u8], sink: &mut Sink) -> anyhow::Result<()> {
        self.0.event(record, sink)
    }
}

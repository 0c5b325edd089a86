//! `rtrace ext4slower`: ext4 reads, writes, opens and syncs slower than a
//! threshold, one line each, as bcc's ext4slower prints them; the shared
//! [`Slower`] on ext4.

use super::slower::{Args, FILE_SYSTEMS, Fs, FsChoice, Slower};

/// ext4slower's choice: ext4.
pub struct Ext4;

impl FsChoice for Ext4 {
    type Args = Args;
    const NAME: &'static str = "ext4slower";
    fn split(args: Args) -> (Args, &'static Fs) {
        (args, &FILE_SYSTEMS[0])
    }
}

/// `rtrace ext4slower`.
pub type Ext4slower = Slower<Ext4>;

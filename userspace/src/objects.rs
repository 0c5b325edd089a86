//! The eBPF objects, built by `build.rs` and embedded in the binary so that
//! one file runs anywhere with no compiler or headers.

macro_rules! objects {
    ($($name:ident => $file:literal),* $(,)?) => {
        $(
            #[doc = concat!("The `", $file, "` eBPF object.")]
            pub static $name: &[u8] =
                aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/", $file));
        )*
    };
}

objects! {
    ARGDIST => "argdist",
    BIOLATENCY => "biolatency",
    EXECSNOOP => "execsnoop",
    EXECSNOOP_PERF => "execsnoop_perf",
    EXT4SLOWER => "ext4slower",
    EXT4SLOWER_PERF => "ext4slower_perf",
    GETHOSTLATENCY => "gethostlatency",
    GETHOSTLATENCY_PERF => "gethostlatency_perf",
    PROBES => "probes",
    PROFILE => "profile",
    PROFILE_PERF => "profile_perf",
    RUNQLAT => "runqlat",
    RUNQLAT_TS => "runqlat_ts",
    TCPLIFE => "tcplife",
    TCPLIFE_PERF => "tcplife_perf",
}

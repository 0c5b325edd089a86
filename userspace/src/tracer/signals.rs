//! SIGINT, SIGTERM and SIGHUP, and the deadline of a duration: what ends
//! a run (and the exporter's serving) with the last report printed.

use std::time::Duration;

use anyhow::Context as _;
use tokio::signal::unix::{SignalKind, signal};

/// Waits for SIGINT, SIGTERM and SIGHUP. Create it before announcing that
/// tracing has started, so that no signal can arrive unhandled.
pub struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
    deadline: Option<tokio::time::Instant>,
}

impl Signals {
    /// Installs the handlers.
    pub fn new() -> anyhow::Result<Self> {
        let mk = |k| signal(k).context("cannot install signal handlers");
        Ok(Self {
            int: mk(SignalKind::interrupt())?,
            term: mk(SignalKind::terminate())?,
            hup: mk(SignalKind::hangup())?,
            deadline: None,
        })
    }

    /// Ends the run after `secs` seconds (`-d`), as a signal would.
    pub fn stop_after(&mut self, secs: Option<u64>) {
        self.deadline = secs.map(|s| tokio::time::Instant::now() + Duration::from_secs(s));
    }

    /// Resolves when any of the three signals arrives, with its number,
    /// or the deadline passes, with 0.
    pub async fn recv(&mut self) -> i32 {
        let until = self.deadline;
        let deadline = async {
            match until {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = self.int.recv() => libc::SIGINT,
            _ = self.term.recv() => libc::SIGTERM,
            _ = self.hup.recv() => libc::SIGHUP,
            () = deadline => 0,
        }
    }
}

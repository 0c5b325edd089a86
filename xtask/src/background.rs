//! The steps of `cargo xtask test` that no host test waits for: the static
//! build (which only the guests and one host test run) and the unit tests.
//! They run in a thread of their own beside the host's integration tests,
//! at the idle scheduling class (`SCHED_IDLE`, inherited by every compiler
//! they start), which yields the CPU to anything else that wants it: the
//! tests run as on an otherwise idle machine, and the builds take the time
//! the tests leave over, which is most of it, since a host test mostly
//! waits on its workload. This took 8 of the run's 42 minutes when it ran
//! before the tests.
//!
//! What those steps print goes to `target/test-background.log` rather than
//! between the tests' lines; a failure's tail is printed at the end.

use std::{
    cell::RefCell,
    fs::File,
    path::PathBuf,
    process::Command,
    sync::mpsc::{Receiver, channel},
    thread::JoinHandle,
};

use anyhow::Context as _;

use crate::root;

thread_local! {
    /// Where the commands [`crate::run`] starts on this thread print: the
    /// terminal (None), or the background's log.
    static SINK: RefCell<Option<File>> = const { RefCell::new(None) };
}

/// Points `cmd`'s output at this thread's sink, if it has one.
pub fn redirect(cmd: &mut Command) -> anyhow::Result<()> {
    SINK.with_borrow(|sink| {
        if let Some(file) = sink {
            cmd.stdout(file.try_clone()?).stderr(file.try_clone()?);
        }
        Ok(())
    })
}

/// The background's log.
pub fn log_path() -> PathBuf {
    root().join("target/test-background.log")
}

/// The background steps, running.
pub struct Background {
    /// What failed, and how long the steps took.
    thread: JoinHandle<(Vec<String>, f64)>,
    static_built: Receiver<anyhow::Result<PathBuf>>,
}

impl Background {
    /// Starts the static build, then `then`, on a thread at the idle
    /// class. `then` returns what failed, as [`crate::step`] records it.
    pub fn start(then: impl FnOnce() -> Vec<String> + Send + 'static) -> anyhow::Result<Self> {
        let log = log_path();
        let file = File::create(&log).with_context(|| format!("cannot write {}", log.display()))?;
        let (tx, static_built) = channel();
        let thread = std::thread::spawn(move || {
            let start = std::time::Instant::now();
            SINK.set(Some(file));
            idle_class();
            let _ = tx.send(crate::dist::static_binary());
            let failures = then();
            (failures, start.elapsed().as_secs_f64())
        });
        Ok(Self {
            thread,
            static_built,
        })
    }

    /// Waits for the static build.
    pub fn static_binary(&self) -> anyhow::Result<PathBuf> {
        self.static_built
            .recv()
            .context("the background's thread ended before the static build")?
            .with_context(|| format!("the static build failed (see {})", log_path().display()))
    }

    /// Waits for the rest; returns what failed, and how long the steps
    /// took from their start.
    pub fn finish(self) -> (Vec<String>, f64) {
        let (failures, secs) = self
            .thread
            .join()
            .unwrap_or_else(|_| (vec!["the background's steps (a panic)".to_owned()], 0.0));
        if !failures.is_empty() {
            let text = std::fs::read_to_string(log_path()).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(80)..];
            eprintln!(
                "xtask: the end of {}:\n{}",
                log_path().display(),
                tail.join("\n")
            );
        }
        (failures, secs)
    }
}

/// Puts the calling thread, and what it starts from now on, in the idle
/// scheduling class; says so and goes on at the normal class if the
/// kernel refuses.
fn idle_class() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: sched_setscheduler(2) of the calling thread (0), with a
    // valid parameter.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) } != 0 {
        eprintln!(
            "xtask: the background builds run at the normal class: {}",
            std::io::Error::last_os_error()
        );
    }
}

//! The OpenTelemetry Collector that rtrace's fleet profiles are to be
//! shipped to in the tests (issue 59): a real Collector, built on this
//! machine from Debian sid's packaged Collector sources
//! (`golang-opentelemetry-collector-dev`) with sid's Go, in GOPATH mode,
//! because the machines this project is built on reach Debian's archive
//! but not the Go module proxy that the Collector's builder fetches from.
//! Its components are in `xtask/otelcol/main.go`: the OTLP receiver, the
//! debug and otlphttp exporters, and `rtracefile`, which writes what it
//! receives to a file (contrib's file exporter is not packaged).
//!
//! Cached as `~/.cache/rtrace/otelcol/VERSION-KEY/otelcol-rtrace`, KEY
//! from the component source, beside the sid root it was built in
//! (`otelcol-root-VERSION`, about 3.6 GB, kept for rebuilds).

use std::{
    io::Read as _,
    net::{TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use crate::run;

/// The Collector release, as Debian packages it.
pub const VERSION: &str = "0.152.0";
/// Its Debian package version, pinned.
const DEBIAN_VERSION: &str = "0.152.0-1";
/// The feature gate this release needs for the profiles signal.
pub const PROFILES_GATE: &str = "service.profilesSupport";
/// The OTLP/HTTP path of profiles in this release (the signal is not
/// stable: `v1development`).
pub const PROFILES_PATH: &str = "/v1development/profiles";
/// The components' source.
const MAIN_GO: &str = include_str!("../otelcol/main.go");

/// A key of the component source, so that a changed `main.go` is built
/// again rather than its old binary used.
fn source_key() -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in MAIN_GO.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    format!("{:08x}", h as u32)
}

/// Where the built Collector is.
pub fn binary() -> PathBuf {
    crate::setup::cache_dir()
        .join("otelcol")
        .join(format!("{VERSION}-{}", source_key()))
        .join("otelcol-rtrace")
}

/// Builds the Collector unless it is built, and checks that it takes a
/// profile: its path.
pub fn install() -> anyhow::Result<PathBuf> {
    let bin = binary();
    if bin.exists() {
        return Ok(bin);
    }
    let root = crate::setup::cache_dir().join(format!("otelcol-root-{VERSION}"));
    if !root.join("usr/bin/go").exists() {
        make_root(&root)?;
    }
    eprintln!("xtask: otelcol: building the Collector {VERSION} (a minute or two, once)");
    let build = root.join("build/otelcol-rtrace");
    std::fs::create_dir_all(&build)?;
    std::fs::write(build.join("main.go"), MAIN_GO)?;
    in_root(
        &root,
        "cd /build/otelcol-rtrace && GO111MODULE=off GOPATH=/usr/share/gocode \
         GOCACHE=/build/gocache go build -o otelcol-rtrace .",
    )
    .context("cannot build the Collector")?;
    let dir = bin.parent().context("no parent")?;
    std::fs::create_dir_all(dir)?;
    let partial = bin.with_extension("partial");
    std::fs::copy(build.join("otelcol-rtrace"), &partial)?;
    check(&partial).context("the Collector just built does not take a profile")?;
    std::fs::rename(&partial, &bin)?;
    Ok(bin)
}

/// Makes the sid root with Go and the Collector's sources.
fn make_root(root: &Path) -> anyhow::Result<()> {
    eprintln!(
        "xtask: otelcol: making a Debian sid root with Go and the Collector {VERSION}'s \
         sources in {} (some minutes, once)",
        root.display()
    );
    let partial = root.with_extension("partial");
    let _ = std::fs::remove_dir_all(&partial);
    std::fs::create_dir_all(crate::setup::cache_dir())?;
    run(Command::new("debootstrap").args([
        "--variant=minbase",
        "sid",
        partial.to_str().context("cache path is not UTF-8")?,
        "http://deb.debian.org/debian",
    ]))
    .context("cannot make the sid root")?;
    std::fs::copy("/etc/resolv.conf", partial.join("etc/resolv.conf"))?;
    in_root(
        &partial,
        &format!(
            "apt-get -q -o Acquire::Check-Valid-Until=false update && \
             DEBIAN_FRONTEND=noninteractive apt-get -q -y --no-install-recommends install \
             golang-go golang-opentelemetry-collector-dev={DEBIAN_VERSION}"
        ),
    )
    .with_context(|| {
        format!(
            "cannot install golang-opentelemetry-collector-dev {DEBIAN_VERSION} in the sid \
             root (if sid has moved on, raise VERSION in xtask/src/otelcol.rs)"
        )
    })?;
    std::fs::rename(&partial, root)?;
    Ok(())
}

/// Runs shell `script` in `root`, with its own /proc in a mount namespace
/// of its own, which goes with it however it ends.
fn in_root(root: &Path, script: &str) -> anyhow::Result<()> {
    run(Command::new("unshare")
        .args(["--mount", "--propagation", "private", "--", "chroot"])
        .arg(root)
        .args(["sh", "-c", &format!("mount -t proc proc /proc && {script}")]))
}

/// A free port on the loopback.
fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A minimal profiles request, encoded by hand: one resource, scope and
/// profile with one sample of value 1 on the empty stack, and the
/// dictionary's zero entries (the empty string, the empty stack).
const ONE_SAMPLE: [u8; 17] = [
    0x0a, 0x09, 0x12, 0x07, 0x12, 0x05, 0x12, 0x03, 0x22, 0x01, 0x01, // resource_profiles
    0x12, 0x04, 0x2a, 0x00, 0x3a, 0x00, // dictionary
];

/// A Collector running with an OTLP/HTTP receiver on a free port of
/// the loopback and `rtracefile` writing to `out`; stopped and its
/// directory removed on drop.
pub struct Running {
    child: std::process::Child,
    dir: PathBuf,
    /// Its receiver's port.
    pub port: u16,
    /// The file `rtracefile` writes.
    pub out: PathBuf,
}

impl Running {
    /// Starts Collector `bin` and waits until it listens.
    pub fn start(bin: &Path, tag: &str) -> anyhow::Result<Self> {
        let dir = std::env::temp_dir().join(format!("rtrace-otelcol-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let port = free_port()?;
        let out = dir.join("profiles.bin");
        let config = dir.join("config.yaml");
        std::fs::write(
            &config,
            format!(
                "receivers:\n  otlp:\n    protocols:\n      http:\n        endpoint: 127.0.0.1:{port}\n\
                 exporters:\n  rtracefile:\n    path: {}\n\
                 service:\n  telemetry:\n    metrics:\n      level: none\n  pipelines:\n    profiles:\n      \
                 receivers: [otlp]\n      exporters: [rtracefile]\n",
                out.display()
            ),
        )?;
        let child = Command::new(bin)
            .arg("--config")
            .arg(&config)
            .arg(format!("--feature-gates={PROFILES_GATE}"))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("cannot start the Collector")?;
        let mut me = Self {
            child,
            dir,
            port,
            out,
        };
        let start = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if start.elapsed() > Duration::from_secs(30) {
                bail!("it did not listen on port {port} within 30 s{}", me.log());
            }
            if let Some(status) = me.child.try_wait()? {
                bail!("it exited ({status}){}", me.log());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(me)
    }

    /// Its stderr so far, once it has been stopped.
    fn log(&mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let mut log = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = e.read_to_string(&mut log);
        }
        format!("; its log:\n{log}")
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Starts Collector `bin`, sends it [`ONE_SAMPLE`] with curl, and waits
/// for its file to hold it.
fn check(bin: &Path) -> anyhow::Result<()> {
    let mut collector = Running::start(bin, "check")?;
    let request = collector.dir.join("request.pb");
    std::fs::write(&request, ONE_SAMPLE)?;
    let result = (|| {
        let status = crate::stdout_of(
            Command::new("curl")
                .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST"])
                .args(["-H", "Content-Type: application/x-protobuf"])
                .arg("--data-binary")
                .arg(format!("@{}", request.display()))
                .arg(format!(
                    "http://127.0.0.1:{}{PROFILES_PATH}",
                    collector.port
                )),
        )?;
        if status.trim() != "200" {
            bail!("it answered the profile with HTTP {}", status.trim());
        }
        let start = Instant::now();
        while std::fs::metadata(&collector.out).map_or(0, |m| m.len()) == 0 {
            if start.elapsed() > Duration::from_secs(10) {
                bail!("its file exporter wrote nothing within 10 s");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    })();
    match result {
        Ok(()) => Ok(()),
        Err(e) => Err(e).context(collector.log()),
    }
}

//! Checks that the process may load eBPF programs, so that a missing
//! capability gets one clear line instead of an EPERM from deep inside a load.

const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// Errors about privileges.
#[derive(Debug, thiserror::Error)]
pub enum PrivError {
    /// Capabilities needed for tracing are missing.
    #[error(
        "missing {0}: rtrace needs root, or CAP_BPF and CAP_PERFMON (CAP_SYS_ADMIN on kernels before 5.8)"
    )]
    Missing(String),
}

/// Reads the effective capability set from `/proc/self/status`.
fn effective_caps() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .unwrap_or(0)
}

/// Fails unless the process holds what tracing needs.
pub fn check() -> Result<(), PrivError> {
    let caps = effective_caps();
    let has = |c: u32| caps & (1 << c) != 0;
    if has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON)) {
        return Ok(());
    }
    let missing: Vec<&str> = [(CAP_BPF, "CAP_BPF"), (CAP_PERFMON, "CAP_PERFMON")]
        .into_iter()
        .filter(|&(c, _)| !has(c))
        .map(|(_, n)| n)
        .collect();
    Err(PrivError::Missing(missing.join(" and ")))
}

/// Why the kernel refuses perf events to this process though it holds
/// CAP_PERFMON, if that is the reason: `kernel.perf_event_paranoid` above
/// 2 (Debian's and Android's 3) lets only CAP_SYS_ADMIN open them.
pub fn perf_events_refused() -> Option<String> {
    let level: i32 = std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let caps = effective_caps();
    if level <= 2 || caps & (1 << CAP_SYS_ADMIN) != 0 {
        return None;
    }
    Some(format!(
        "perf events refused: kernel.perf_event_paranoid is {level}, which lets only \
         CAP_SYS_ADMIN open them; `sysctl kernel.perf_event_paranoid=2` lets CAP_PERFMON do"
    ))
}

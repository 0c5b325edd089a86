//! Opening a tool: the attach chain (each mechanism and object variant
//! tried until one loads and attaches) and the [`Session`] it leaves.

use aya::Ebpf;
use rtrace_common::{
    events::{TALLIES, TALLY_ONLY},
    targets,
};

use super::{GlobalArgs, Plan, Scope, Tool, targets::Targets, tool::DynTool};
use crate::kernel::{
    features::{Mechanism, trim_verifier_log},
    load::{Kernel, Load, TASK_STORAGE},
    privs,
    transport::{BufferArgs, Transport},
};

/// No mechanism of a chain worked.
#[derive(Debug, thiserror::Error)]
#[error("{tool}: no attach mechanism works on this kernel; tried {}", tried_list(.tried))]
pub struct AttachError {
    tool: &'static str,
    /// Each mechanism tried, with why it failed.
    tried: Vec<(String, String)>,
}

fn tried_list(tried: &[(String, String)]) -> String {
    tried
        .iter()
        .map(|(m, why)| format!("{m} ({why})"))
        .collect::<Vec<_>>()
        .join(", then ")
}

/// Fails unless a forced mechanism (`--attach`) is one of `chain`'s.
fn check_forced(tool: &str, forced: Option<Mechanism>, chain: &[Mechanism]) -> anyhow::Result<()> {
    if let Some(m) = forced.filter(|m| !chain.contains(m)) {
        let names: Vec<&str> = chain.iter().map(|m| m.name()).collect();
        anyhow::bail!("{tool} cannot attach with {m}; use {}", names.join(", "));
    }
    Ok(())
}

/// The object's name for a variant and transport.
fn object_name(tool: &str, variant: &str, transport: Option<Transport>) -> String {
    match (variant, transport) {
        ("", Some(Transport::Perf)) => format!("{tool}_perf"),
        ("", _) => tool.to_owned(),
        (v, _) => format!("{tool}_{v}"),
    }
}

/// The attached tool: what `-v` reports.
struct Attached {
    ebpf: Ebpf,
    mech: Option<Mechanism>,
    skipped: Vec<(String, String)>,
}

/// Walks the chain: each mechanism the kernel has, each variant the tool
/// asks for, until one loads and attaches.
fn attach_chain(
    tool: &mut dyn DynTool,
    kernel: &mut Kernel,
    targets: &Targets,
    plan: &Plan,
    transport: Option<Transport>,
    global: &GlobalArgs,
    tallies: Option<u32>,
) -> anyhow::Result<Attached> {
    let spec = tool.spec();
    let chain: Vec<Option<Mechanism>> = match plan.forced {
        Some(m) => vec![Some(m)],
        None if spec.chain.is_empty() => vec![None],
        None => spec.chain.iter().copied().map(Some).collect(),
    };
    // Probing a mechanism decides between candidates; with one candidate
    // there is nothing to decide, and the tool's own attach is the probe
    // (its error names the mechanism and why).
    let choose = chain.len() > 1;
    let mut skipped = Vec::new();
    for m in chain {
        if let Some(m) = m
            && choose
            && let Err(why) = kernel.check(m)
        {
            skipped.push((m.name().to_owned(), why));
            continue;
        }
        let mut variants = tool.variants(m, kernel);
        if global.no_task_storage {
            variants.retain(|&v| v != TASK_STORAGE);
        }
        let last = variants.len().saturating_sub(1);
        for (i, variant) in variants.into_iter().enumerate() {
            let attempt = (|| {
                let mut load = Load::new(variant);
                load.global(targets::GLOBAL, &targets.global);
                load.size(targets::IDS_MAP, targets.ids.len().max(1) as u32);
                load.size(targets::CPUS_MAP, targets.cpus.1.max(1));
                for (name, path) in &targets.pins {
                    load.pinned(name, path.clone());
                }
                load.size(
                    rtrace_common::names::ERRORS,
                    spec.errors.len().max(1) as u32,
                );
                match (tallies, transport, &plan.events) {
                    // A tallying collector sends nothing: the object's
                    // smallest buffer will do.
                    (Some(n), _, _) if n > 0 => {
                        load.global(TALLY_ONLY, &1u32);
                        load.size(TALLIES, n);
                    }
                    (_, Some(t), Some(args)) => t.size(&mut load, args.bytes(spec.event_buffer)),
                    _ => {}
                }
                let name = object_name(spec.object, variant, transport);
                crate::kernel::objects::prefetch(&name);
                tool.configure(m, kernel, &mut load)?;
                let mut ebpf = load.load(&name)?;
                targets.apply(&mut ebpf)?;
                tool.attach(m, kernel, &mut ebpf)?;
                anyhow::Ok(ebpf)
            })();
            let what = match (m, variant) {
                (Some(m), "") => m.name().to_owned(),
                (Some(m), v) => format!("{m} with {}", v.replace('_', " ")),
                (None, "") => spec.name.to_owned(),
                (None, v) => format!("{} with {}", spec.name, v.replace('_', " ")),
            };
            match attempt {
                Ok(ebpf) => {
                    return Ok(Attached {
                        ebpf,
                        mech: m,
                        skipped,
                    });
                }
                // A tool without a chain has nothing to fall back to after
                // its last variant: its error is the error.
                Err(e) if m.is_none() && i == last => return Err(e),
                Err(e) => skipped.push((what, trim_verifier_log(&format!("{e:#}")))),
            }
        }
    }
    Err(AttachError {
        tool: spec.name,
        tried: skipped,
    }
    .into())
}

/// A tool attached: its object, and what `-v` says of how.
pub struct Session<T: Tool> {
    /// The tool.
    pub tool: T,
    /// Its loaded and attached object.
    pub ebpf: Ebpf,
    mech: Option<Mechanism>,
    skipped: Vec<(String, String)>,
    pub(super) transport: Option<(Transport, Option<String>)>,
    /// The transport flags of a tool that streams events.
    pub events: Option<BufferArgs>,
}

impl<T: Tool> Session<T> {
    /// Checks the tool's targets (`scope`, as settled) and the
    /// privileges, then walks its attach chain. `tallies`: as a collector
    /// of the exporter, which reads maps and takes no events, with the
    /// `TALLIES` slots it counts into ([`Collector::tallies`]).
    pub fn open(
        mut tool: T,
        plan: Plan,
        scope: &Scope,
        global: &GlobalArgs,
        tallies: Option<u32>,
    ) -> anyhow::Result<Self> {
        let collect = tallies.is_some();
        let mut kernel = Kernel::default();
        let targets = Targets::check(scope, &mut kernel)?;
        check_forced(T::SPEC.name, plan.forced, T::SPEC.chain)?;
        privs::check()?;

        let transport = plan
            .events
            .as_ref()
            .map(|args| Transport::choose(&mut kernel, args));
        let Attached {
            ebpf,
            mech,
            skipped,
        } = attach_chain(
            &mut tool,
            &mut kernel,
            &targets,
            &plan,
            transport.as_ref().map(|t| t.0),
            global,
            tallies,
        )?;
        let transport = transport.filter(|_| !collect);
        // What setup needed of the kernel (its BTF above all) is not
        // needed while tracing.
        drop(kernel);
        crate::kernel::memory::release_free();
        Ok(Self {
            tool,
            ebpf,
            mech,
            skipped,
            transport,
            events: plan.events,
        })
    }

    /// Says on stderr what was skipped and why, and what was used (`-v`).
    pub fn report(&self) {
        let name = T::SPEC.name;
        for (what, why) in &self.skipped {
            eprintln!("rtrace: {name}: skipped {what}: {why}");
        }
        let lines = self.tool.describe();
        let (attached, notes) = lines.split_first().map_or(("", &[][..]), |(a, n)| (a, n));
        match self.mech {
            Some(m) => eprintln!("rtrace: {name}: attached with {m} ({attached})"),
            None => eprintln!("rtrace: {name}: attached {attached}"),
        }
        for note in notes {
            eprintln!("rtrace: {name}: {note}");
        }
        for (program, n) in crate::kernel::load::verified_insns(&self.ebpf) {
            eprintln!("rtrace: {name}: program {program}: {n} instructions verified");
        }
        if let (Some((t, why)), Some(args)) = (&self.transport, &self.events) {
            t.report(name, args.bytes(T::SPEC.event_buffer), why.as_deref());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_are_named_by_variant_then_transport() {
        assert_eq!(object_name("runqlat", "", None), "runqlat");
        assert_eq!(
            object_name("runqlat", "task_storage", None),
            "runqlat_task_storage"
        );
        assert_eq!(
            object_name("execsnoop", "", Some(Transport::Perf)),
            "execsnoop_perf"
        );
        assert_eq!(
            object_name("execsnoop", "", Some(Transport::Ring)),
            "execsnoop"
        );
    }

    #[test]
    fn every_object_a_tool_may_ask_for_is_built() {
        for name in [
            "runqlat",
            "runqlat_task_storage",
            "execsnoop_perf",
            "probes",
            "stat",
        ] {
            assert!(crate::kernel::objects::get(name).is_some(), "{name}");
        }
    }
}

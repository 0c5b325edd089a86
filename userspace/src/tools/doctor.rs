//! `rtrace doctor`: what this kernel offers, each mechanism found by really
//! loading and attaching a tiny program.

use crate::{
    kernel::{
        features::{self, Mechanism},
        load::Kernel,
    },
    output,
    tracer::GlobalArgs,
};

/// Prints the report.
pub fn run(global: &GlobalArgs) -> anyhow::Result<()> {
    crate::kernel::privs::check()?;
    let release = features::kernel_release();
    let btf = std::path::Path::new(crate::kernel::btf::VMLINUX).exists();
    let lockdown = features::lockdown();
    // Command cgroups left by an rtrace that died: the empty ones go now,
    // the others are listed with what still runs in them.
    let stale: Vec<crate::tracer::command::StaleCgroup> =
        crate::tracer::command::sweep_stale_cgroups()
            .into_iter()
            .filter(|c| !c.removed)
            .collect();
    let mut f = Kernel::default();
    let results: Vec<(Mechanism, Result<(), String>)> =
        Mechanism::ALL.iter().map(|&m| (m, f.check(m))).collect();
    if global.json {
        let mechanisms: serde_json::Map<String, serde_json::Value> = results
            .iter()
            .map(|(m, r)| {
                let v = match r {
                    Ok(()) => serde_json::json!({ "works": true }),
                    Err(why) => serde_json::json!({ "works": false, "error": why }),
                };
                (m.name().to_owned(), v)
            })
            .collect();
        let stale: Vec<serde_json::Value> = stale
            .iter()
            .map(|c| serde_json::json!({ "path": c.path, "owner": c.owner, "procs": c.procs }))
            .collect();
        return output::Sink::new("doctor", true).json_line(&serde_json::json!({
            "kernel": release, "btf": btf, "lockdown": lockdown, "mechanisms": mechanisms,
            "stale_cgroups": stale,
        }));
    }
    println!("kernel     {release}");
    println!(
        "BTF        {}",
        if btf {
            crate::kernel::btf::VMLINUX
        } else {
            "missing"
        }
    );
    println!("lockdown   {lockdown}");
    println!();
    println!("{:<16} WORKS", "MECHANISM");
    for (m, r) in results {
        match r {
            Ok(()) => println!("{:<16} yes", m.name()),
            Err(why) => println!("{:<16} no     {why}", m.name()),
        }
    }
    if !stale.is_empty() {
        println!();
        println!("Command cgroups of rtraces that died, not empty yet (removed once they are):");
        for c in &stale {
            let procs: Vec<String> = c.procs.iter().map(u32::to_string).collect();
            println!(
                "  {} (rtrace {}): processes {}",
                c.path.display(),
                c.owner,
                procs.join(" ")
            );
        }
    }
    Ok(())
}

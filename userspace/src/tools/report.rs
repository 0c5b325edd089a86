//! `rtrace report FILE`: perf report's tables, and rtrace's other outputs,
//! from a profile saved earlier: a pprof file (rtrace's `--pprof`, Go's
//! pprof, Pyroscope's exports), perf's own recording (`perf.data`, its
//! frames named and its DWARF-mode stacks unwound here), `perf script`
//! text, or folded stacks. perf's record-now, report-later split.

use std::path::PathBuf;

use anyhow::Context as _;

use crate::{
    output::{
        Sink,
        stacks::{self, FlameOptions, TextOptions, pprof, report},
    },
    stacks::{
        perfdata, perfscript,
        sample::{Sample, Timed},
        symbolize::later,
    },
};

/// Report on a saved profile (pprof, perf.data, perf script text or
/// folded stacks) as perf report does.
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:
  rtrace profile -F 99 --pprof cpu.pb.gz 10
  rtrace report cpu.pb.gz                          # overhead by comm, dso, sym
  rtrace report cpu.pb.gz --sort comm,dso --no-children
  rtrace report cpu.pb.gz --hierarchy --percent-limit 1
  rtrace report cpu.pb.gz -g=folded,1,caller --comms python3
  rtrace report cpu.folded --svg cpu.svg
  rtrace report cpu.pb.gz --annotate hot_loop
  rtrace report cpu.pb.gz --html cpu.html          # heat map, flame graph, table
  perf record -g -o perf.data ./app && rtrace report perf.data
  perf record --call-graph dwarf ./app && rtrace report perf.data --html app.html
  perf script > out.perf && rtrace report out.perf --svg app.svg
  rtrace report --html diff.html before.pb.gz after.pb.gz   # what changed")]
pub struct Args {
    /// The profile: a pprof file (gzipped or not), a perf.data file,
    /// `perf script` text, or folded stacks (`comm;frame;... count`); `-`
    /// reads stdin.
    input: PathBuf,
    /// A second profile, to compare with the first in the page
    /// (`--html`): the first is before, this one after.
    #[arg(value_name = "AFTER", requires = "html")]
    after: Option<PathBuf>,
    #[command(flatten)]
    report: report::ReportArgs,
    /// The pprof sample type to count, by name or number (default: the
    /// profile's default, else `samples`, else its last).
    #[arg(long, value_name = "TYPE")]
    sample_index: Option<String>,
    /// The event to report of a perf.data file or perf script text that
    /// holds several (`cycles`, `cpu-clock`; default: the first with
    /// samples; the others are listed on stderr).
    #[arg(long, value_name = "NAME")]
    event: Option<String>,
    /// Print folded stacks (`comm;frames.. count`) instead of the table.
    #[arg(short = 'f', long)]
    folded: bool,
    /// Add `_[k]` to kernel frames, `_[j]` to JIT frames and `_[i]` to
    /// inlined ones in folded output.
    #[arg(short = 'a', long = "annotations")]
    annotations: bool,
    /// Accepted for perf's sake: the table is printed as `perf report
    /// --stdio` prints it.
    #[arg(long, hide = true)]
    stdio: bool,
    /// Also write a flame graph (SVG) to FILE.
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
    /// Also write a speedscope profile (JSON) to FILE.
    #[arg(long, value_name = "FILE")]
    speedscope: Option<PathBuf>,
    /// Also write a gzipped pprof profile to FILE (folded stacks to
    /// pprof, for one).
    #[arg(long, value_name = "FILE")]
    pprof: Option<PathBuf>,
    /// Also write the sub-second heat map (SVG) to FILE, from the sample
    /// times an rtrace profile keeps in its pprof files.
    #[arg(long, value_name = "FILE")]
    heatmap: Option<PathBuf>,
    /// --firefox and --samples, for files that keep each sample's time:
    /// perf.data and perf script text.
    #[command(flatten)]
    each: crate::output::files::PerSampleOutputs,
    /// Also write one self-contained page (HTML) to FILE: the flame graph
    /// (zoom, search, icicle), the table and, where the profile keeps its
    /// samples' times (rtrace's pprof files do), the heat map to select a
    /// range of time with. Given AFTER too: the differential page, the
    /// flame graph of AFTER coloured by what grew (red) and shrank
    /// (blue).
    #[arg(long, value_name = "FILE")]
    html: Option<PathBuf>,
    #[command(flatten)]
    annotate: crate::output::stacks::annotate::AnnotateArgs,
    /// Print the table as JSON lines, one row each.
    #[arg(long)]
    json: bool,
}

/// A profile as read: its samples, what they count and the event.
struct Loaded {
    samples: Vec<Sample>,
    unit: String,
    event: String,
    heat: Option<pprof::Heat>,
    /// The facts its run kept (pprof).
    facts: Vec<(String, String)>,
    /// How long it ran, where known.
    duration_ns: u64,
    /// When it began, in nanoseconds since the epoch (0: unknown).
    time_nanos: u64,
    /// How many samples the weights came from, where each weighs its
    /// period (perf.data).
    samples_n: Option<u64>,
    /// Each sample with its own time and CPU, where the file keeps them
    /// (perf.data, perf script text), and the time between two samples
    /// of a thread.
    timed: Option<(Vec<Timed>, u64)>,
}

/// Reads `path`: pprof if it is one, else folded stacks; anything else
/// is one clear error.
fn load(path: &std::path::Path, args: &Args) -> anyhow::Result<Loaded> {
    let bytes = if path.as_os_str() == "-" {
        let mut v = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut v).context("cannot read stdin")?;
        v
    } else {
        std::fs::read(path).with_context(|| format!("cannot open {}", path.display()))?
    };
    let name = path.display();
    if let Some(profile) = pprof::decode(&bytes) {
        let mut r = profile
            .and_then(|p| pprof::read(&p, args.sample_index.as_deref()))
            .with_context(|| format!("{name}"))?;
        // JIT frames whose maps were written after the run (at their
        // process's exit), named now, as perf report names them.
        let until = r.time_nanos.saturating_add(r.duration_ns);
        for line in later::name_jit_frames(&mut r.samples, until) {
            eprintln!("rtrace: {line}");
        }
        let unit = match r.value.1.as_str() {
            "count" => "samples".to_owned(),
            u => u.to_owned(),
        };
        return Ok(Loaded {
            samples: r.samples,
            unit,
            event: r.event,
            heat: r.heat,
            facts: r.facts,
            duration_ns: r.duration_ns,
            time_nanos: r.time_nanos,
            samples_n: None,
            timed: None,
        });
    }
    if args.sample_index.is_some() {
        anyhow::bail!("{name}: --sample-index applies to pprof files");
    }
    if perfdata::is_perf_data(&bytes) {
        // Naming a large recording's frames takes a while: say so.
        if bytes.len() > 32 << 20 {
            eprintln!("rtrace: reading {name} (perf's recording) and naming its frames");
        }
        let mut symbolizer = crate::stacks::symbolize::Symbolizer::new();
        let r = perfdata::read(&bytes, args.event.as_deref(), &mut symbolizer)
            .with_context(|| format!("{name}"))?;
        for w in &r.warnings {
            eprintln!("rtrace: warning: {name}: {w}");
        }
        return Ok(timed_loaded(
            (r.samples, r.interval_ns, r.unit),
            r.event,
            &r.events,
            r.facts,
            r.start,
            r.duration_ns,
        ));
    }
    let text = std::str::from_utf8(&bytes).map_err(|_| {
        anyhow::anyhow!(
            "{name}: not a pprof profile, a perf.data file, perf script text or folded stacks"
        )
    })?;
    if perfscript::looks_like(text) {
        let s = perfscript::read(text, args.event.as_deref()).with_context(|| format!("{name}"))?;
        return Ok(timed_loaded(
            (s.samples, s.interval_ns, "samples".to_owned()),
            s.event,
            &s.events,
            Vec::new(),
            s.start,
            s.duration_ns,
        ));
    }
    if args.event.is_some() {
        anyhow::bail!("{name}: --event applies to perf.data files and perf script text");
    }
    let samples = stacks::samples_of_folded(text).with_context(|| {
        format!("{name}: not a pprof profile, a perf.data file, perf script text or folded stacks")
    })?;
    Ok(Loaded {
        samples,
        unit: "samples".to_owned(),
        event: "folded".to_owned(),
        heat: None,
        facts: Vec::new(),
        duration_ns: 0,
        time_nanos: 0,
        samples_n: None,
        timed: None,
    })
}

/// A profile of samples with their own times (perf.data, perf script):
/// each counted in its heat map slot from the first, for the page's ranges
/// and the heat map; the events left out named on stderr.
fn timed_loaded(
    (timed, interval_ns, unit): (Vec<Timed>, u64, String),
    event: String,
    events: &[(String, u64)],
    facts: Vec<(String, String)>,
    start: u64,
    duration_ns: u64,
) -> Loaded {
    let others: Vec<String> = events
        .iter()
        .filter(|(e, n)| *e != event && *n > 0)
        .map(|(e, n)| format!("{e} ({n} samples)"))
        .collect();
    if !others.is_empty() {
        eprintln!(
            "rtrace: reporting {event}; the file also holds {} (--event NAME reports another)",
            others.join(", ")
        );
    }
    let slot_ns = rtrace_common::profile::HEAT_SLOT_NS;
    let slot = |t: u64| (t.saturating_sub(start) / slot_ns) as usize;
    let mut counts = vec![0u64; timed.iter().map(|t| slot(t.time) + 1).max().unwrap_or(0)];
    let samples = timed
        .iter()
        .map(|t| {
            let mut s = t.sample.clone();
            let i = slot(t.time);
            counts[i] += s.count;
            s.slot = i as u32 + 1;
            s
        })
        .collect();
    let boot = crate::kernel::procmaps::boot_wall_ns();
    Loaded {
        samples_n: (unit != "samples").then_some(timed.len() as u64),
        samples,
        unit,
        event,
        heat: (!counts.is_empty()).then(|| pprof::Heat {
            counts,
            slot_ns,
            start_ns: start.saturating_sub(boot),
        }),
        facts,
        duration_ns,
        time_nanos: start,
        timed: Some((timed, interval_ns)),
    }
}

/// Writes the page of `loaded` (`--html`), or the differential page of
/// it and `args.after`.
fn write_page(
    file: crate::output::files::ReportFile,
    args: &Args,
    loaded: &Loaded,
) -> anyhow::Result<()> {
    let after = match &args.after {
        Some(path) => {
            let a = load(path, args)?;
            if a.unit != loaded.unit {
                anyhow::bail!(
                    "{} counts {} and {} counts {}: the page compares profiles of one unit",
                    args.input.display(),
                    loaded.unit,
                    path.display(),
                    a.unit
                );
            }
            Some((path, a))
        }
        None => None,
    };
    let shown = after.as_ref().map_or(loaded, |(_, a)| a);
    let samples = &shown.samples;
    // The command line; the kernel and host the profile was recorded on
    // come from the file, where it kept them.
    let mut facts = vec![crate::output::html::command_line()];
    let name = |p: &std::path::Path| p.display().to_string();
    facts.push(("Profile".to_owned(), name(&args.input)));
    if let Some(path) = &args.after {
        facts.push(("Compared with".to_owned(), name(path)));
    }
    facts.push(("Events".to_owned(), shown.event.clone()));
    if shown.duration_ns > 0 {
        facts.push((
            "Duration".to_owned(),
            format!("{:.1} s", shown.duration_ns as f64 / 1e9),
        ));
    }
    let total: u64 = samples.iter().map(|s| s.count).sum();
    facts.push((
        format!("Total ({})", shown.unit),
        crate::output::files::thousands(total),
    ));
    let recorded = |(k, v): &(String, String)| (format!("{k} (recorded)"), v.clone());
    facts.extend(shown.facts.iter().map(recorded));
    let (title, profiles) = match &after {
        Some((path, _)) => (
            format!(
                "rtrace report: {} against {}",
                name(path),
                name(&args.input)
            ),
            vec![
                ("before".to_owned(), &loaded.samples[..]),
                ("after".to_owned(), &samples[..]),
            ],
        ),
        None => (
            format!("rtrace report: {}", name(&args.input)),
            vec![("profile".to_owned(), &samples[..])],
        ),
    };
    let unit = match shown.unit.as_str() {
        "nanoseconds" => "ns",
        "microseconds" => "us",
        u => u,
    };
    let page = crate::output::html::Page {
        title,
        facts,
        unit,
        profiles,
        heat: (shown.time_nanos > 0)
            .then(|| crate::output::local_time_of((shown.time_nanos / 1_000_000_000) as i64)),
    };
    let what = crate::output::files::held(samples, &shown.unit);
    file.write(&what, |out| crate::output::html::write(&page, out))
}

/// Writes `--firefox` and `--samples` from the samples' own times, which
/// perf's files keep and profiles counted by stack do not.
fn write_per_sample(
    files: &mut crate::output::files::StackReports,
    args: &Args,
    loaded: &Loaded,
) -> anyhow::Result<()> {
    let flag = args.each.flag().unwrap_or("--samples");
    let Some((timed, interval_ns)) = &loaded.timed else {
        anyhow::bail!(
            "{flag} needs each sample's time, which {} does not keep (perf.data and perf \
             script text do; rtrace profile {flag} writes it live)",
            args.input.display()
        );
    };
    let what = format!(
        "{} samples",
        crate::output::files::thousands(timed.len() as u64)
    );
    let meta = stacks::firefox::Meta {
        product: format!("rtrace report: {} ({})", args.input.display(), loaded.event),
        // The Firefox Profiler counts samples; perf's periods are in
        // --samples' weight column.
        unit: stacks::firefox::Unit::Periods,
        interval_ns: *interval_ns,
        start_ns: loaded.time_nanos,
    };
    files.write_each(timed, &meta, &what)?;
    Ok(())
}

/// Runs the command.
pub fn run(args: Args) -> anyhow::Result<()> {
    // Output files first, as profile creates them: a bad path fails before
    // any work.
    let mut files = crate::output::files::StackReports::create([
        args.svg.as_deref(),
        args.pprof.as_deref(),
        args.speedscope.as_deref(),
        args.heatmap.as_deref(),
        args.html.as_deref(),
        args.each.firefox.as_deref(),
        args.each.samples.as_deref(),
    ])?;
    let loaded = load(&args.input, &args)?;
    if args.each.any() {
        write_per_sample(&mut files, &args, &loaded)?;
    }
    if let Some(file) = files.html {
        write_page(file, &args, &loaded)?;
        if args.after.is_some() {
            // Two profiles are compared in the page alone.
            return Ok(());
        }
    }
    if let Some(file) = files.heatmap {
        let heat = loaded.heat.as_ref().with_context(|| {
            format!(
                "{} keeps no sample times for a heat map (rtrace profile --pprof writes them)",
                args.input.display()
            )
        })?;
        let total: u64 = heat.counts.iter().sum();
        let slots_a_second = (1_000_000_000 / heat.slot_ns).max(1);
        let what = format!(
            "{} samples in {} s",
            crate::output::files::thousands(total),
            (heat.counts.len() as u64).div_ceil(slots_a_second)
        );
        let title = format!("rtrace report: samples over time ({})", loaded.event);
        file.write(&what, |out| {
            crate::output::heatmap::write_svg(
                &heat.counts,
                heat.slot_ns,
                heat.start_ns,
                &title,
                out,
            )
            .map_err(Into::into)
        })?;
    }
    // The table and annotate count each sample as it comes; the stacks
    // are merged only for the outputs that print each stack once (merging
    // hashes every frame of every stack: most of a report's time).
    let raw = loaded.samples;
    let samples = if files.svg.is_some() || files.speedscope.is_some() || args.folded {
        stacks::merge(raw.clone(), false)
    } else {
        Vec::new()
    };
    let what = crate::output::files::held(&samples, &loaded.unit);
    if let Some(file) = files.svg {
        let opts = FlameOptions {
            title: format!("rtrace report: {}", args.input.display()),
            icicle: false,
            count_name: loaded.unit.clone(),
            palette: FlameOptions::by_kind(),
        };
        file.write(&what, |out| stacks::write_svg(&samples, out, &opts))?;
    }
    if let Some(file) = files.speedscope {
        let unit = if loaded.unit == "samples" {
            "none"
        } else {
            "nanoseconds"
        };
        let name = args.input.display().to_string();
        file.write(&what, |out| {
            stacks::write_speedscope(&samples, out, &name, unit)
        })?;
    }
    if let Some(file) = files.pprof {
        let unit: &str = &loaded.unit;
        let meta = pprof::Meta {
            types: &[("samples", if unit == "samples" { "count" } else { unit })],
            values: &|_, s: &Sample| vec![s.count],
            period_type: (
                &loaded.event,
                if unit == "samples" { "count" } else { unit },
            ),
            period: 1,
            time_nanos: 0,
            duration_nanos: 0,
            comments: &[],
        };
        // Leaves at other addresses stay other locations.
        let exact = stacks::merge(raw.clone(), true);
        let what = crate::output::files::held(&exact, &loaded.unit);
        file.write(&what, |out| pprof::write(&exact, out, &meta, false))?;
    }
    let mut sink = Sink::new("report", args.json);
    if args.annotate.wanted() {
        let table =
            crate::output::stacks::annotate::annotate(&raw, &args.annotate, Some(&loaded.event))?;
        return sink.emit(&table);
    }
    if args.folded {
        return sink.emit(&stacks::Stacks {
            samples: &samples,
            style: stacks::Style::Folded(TextOptions {
                delimiter: false,
                annotate: args.annotations,
            }),
            value: "count",
        });
    }
    let mut table = report::Report::new(&raw, &args.report, &loaded.event, &loaded.unit);
    if let Some(n) = loaded.samples_n {
        table = table.of_samples(n, &loaded.event);
    }
    sink.emit(&table)
}

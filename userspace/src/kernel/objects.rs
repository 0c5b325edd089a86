//! The eBPF objects, built by `build.rs` and embedded in the binary so that
//! one file runs anywhere with no compiler or headers. Each file of
//! `ebpf-programs/src/bin/` is one object, plus its feature variants
//! (`<name>_perf`, `<name>_task_storage`, ...), which
//! `rtrace_common::variants::VARIANTS` lists for both the build
//! (`ebpf-build`) and the loader.
//!
//! The names of the objects' maps, programs and globals are constants of
//! `rtrace_common`; the tests here check them against the built objects.

include!(concat!(env!("OUT_DIR"), "/objects.rs"));

/// The objects taken out so far, by index in [`OBJECTS`]: each at most once
/// a run, kept for the run (a tool loads one to three).
static TAKEN: std::sync::Mutex<Vec<(usize, &'static [u8])>> = std::sync::Mutex::new(Vec::new());

/// The object named `name`, taken out of its group (the objects are
/// embedded compressed in groups, `ebpf_build::group_of`: 11.3 MB of them
/// in 1.1 MB).
/// Its bytes are 8-aligned, as the ELF parser wants them.
pub fn get(name: &str) -> Option<&'static [u8]> {
    let index = OBJECTS.iter().position(|(n, ..)| *n == name)?;
    let mut done = TAKEN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((_, bytes)) = done.iter().find(|(i, _)| *i == index) {
        return Some(bytes);
    }
    let (_, group, offset, len) = OBJECTS[index];
    let bytes = take_out(GROUPS.get(group)?.1, offset, len)?;
    done.push((index, bytes));
    Some(bytes)
}

/// Takes object `name` out of its group on a thread of its own, while the
/// caller goes on: the decoding (5 to 10 ms for the largest) runs beside
/// what a tool does before it loads the object (the kernel's BTF read and
/// indexed, the tables sized), and [`get`] then finds it done, or waits
/// for the rest.
pub fn prefetch(name: &str) {
    if !OBJECTS.iter().any(|(n, ..)| *n == name) {
        return;
    }
    let name = name.to_owned();
    let _ = std::thread::Builder::new()
        .name("rtrace-object".into())
        .spawn(move || get(&name));
}

/// The `len` bytes at `offset` of a zstd frame's content
/// ([`rtrace_common::objects::take_out`]), in an 8-aligned buffer kept for
/// the run.
fn take_out(frame: &[u8], offset: usize, len: usize) -> Option<&'static [u8]> {
    let words: &'static mut [u64] = Vec::leak(vec![0u64; len.div_ceil(8)]);
    // SAFETY: the words live for the run and hold at least `len` bytes;
    // u8 has no alignment or invalid values.
    let bytes = unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u8>(), len) };
    rtrace_common::objects::take_out(frame, offset, bytes).ok()?;
    Some(bytes)
}

#[cfg(test)]
mod tests {
    use object::{Object as _, ObjectSection as _, ObjectSymbol as _};
    use rtrace_common::{
        argdist, biolatency, events, ext4slower, gethostlatency, memleak, names, probes, profile,
        python, runqlat, stacks, stat, strace, targets, tcplife, unwind,
        variants::{self, CFI, CFI_GLOBAL, PERF, TASK_STORAGE},
    };

    /// The build strips DWARF (`ebpf_build::strip_debug`), which the kernel
    /// and aya never read and which was most of the binary, and the lines
    /// of `.BTF.ext`; BTF and the functions' records stay.
    #[test]
    fn objects_carry_btf_and_no_dwarf() {
        assert!(!super::OBJECTS.is_empty());
        for (name, ..) in super::OBJECTS {
            let bytes = super::get(name)
                .unwrap_or_else(|| panic!("{name} cannot be taken out of its group"));
            let file = object::File::parse(bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
            let sections: Vec<&str> = file.sections().filter_map(|s| s.name().ok()).collect();
            let debug: Vec<&&str> = sections
                .iter()
                .filter(|n| n.starts_with(".debug") || n.starts_with(".rel.debug"))
                .collect();
            assert!(debug.is_empty(), "{name} keeps {debug:?}");
            assert!(
                sections.contains(&".BTF"),
                "{name}: no .BTF in {sections:?}"
            );
            assert!(sections.contains(&".BTF.ext"), "{name}: no .BTF.ext");
            // Functions' records, and no lines' (`ebpf_build::drop_line_info`),
            // nor the relocations of their instruction offsets.
            let ext = file.section_by_name(".BTF.ext").unwrap().data().unwrap();
            let word = |at: usize| u32::from_le_bytes(ext[at..at + 4].try_into().unwrap());
            assert!(word(12) > 0, "{name}: no functions in .BTF.ext");
            // (A build with RTRACE_EBPF_LINES set keeps them.)
            if option_env!("RTRACE_EBPF_LINES").is_none() {
                assert_eq!(word(20), 0, "{name}: lines in .BTF.ext");
                assert!(
                    !sections.contains(&".rel.BTF.ext"),
                    "{name}: .rel.BTF.ext kept"
                );
            }
        }
    }

    /// The name of `bin`'s object built with `variant` (`""` for the
    /// plain one), or `None` where the build makes no such variant.
    fn name(bin: &str, variant: &str) -> Option<String> {
        if variant.is_empty() {
            Some(bin.to_owned())
        } else {
            variants::has(bin, variant).then(|| format!("{bin}_{variant}"))
        }
    }

    /// Every object the variants table names is built, and nothing else
    /// but the plain objects.
    #[test]
    fn the_objects_are_the_variants_table_s() {
        let built: Vec<&str> = super::OBJECTS.iter().map(|(n, ..)| *n).collect();
        let mut listed = Vec::new();
        for (bin, features) in variants::VARIANTS {
            assert!(built.contains(bin), "{bin}");
            for f in *features {
                let object = name(bin, f).unwrap();
                assert!(built.contains(&object.as_str()), "{object}");
                listed.push(object);
            }
        }
        for name in &built {
            let variant = variants::VARIANTS.iter().any(|(bin, features)| {
                features
                    .iter()
                    .any(|f| name.strip_prefix(bin) == Some(&format!("_{f}")))
            });
            assert_eq!(variant, listed.iter().any(|l| l == name), "{name}");
        }
        assert_eq!(name("runqlat", ""), Some("runqlat".into()));
        assert_eq!(name("stat", PERF), None);
    }

    /// What one built object holds, as aya's loader reads it: its maps,
    /// its programs, and its globals (symbols in its data sections).
    struct Held {
        maps: Vec<String>,
        programs: Vec<String>,
        globals: Vec<String>,
    }

    fn held(name: &str) -> Held {
        let bytes = super::get(name).unwrap_or_else(|| panic!("no object {name}"));
        let parsed = aya_obj::Object::parse(bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        let file = object::File::parse(bytes).unwrap();
        let globals = file
            .symbols()
            .filter(|s| {
                s.section_index()
                    .and_then(|i| file.section_by_index(i).ok())
                    .and_then(|sec| sec.name().ok().map(str::to_owned))
                    .is_some_and(|sec| {
                        [".rodata", ".data", ".bss"]
                            .iter()
                            .any(|d| sec.starts_with(d))
                    })
            })
            .filter_map(|s| s.name().ok().map(str::to_owned))
            .collect();
        Held {
            maps: parsed.maps.into_keys().collect(),
            programs: parsed.programs.into_keys().collect(),
            globals,
        }
    }

    /// `bin`'s objects: the plain one and every variant.
    fn all_of(bin: &str) -> Vec<String> {
        let mut out = vec![bin.to_owned()];
        out.extend(variants::of(bin).iter().map(|v| format!("{bin}_{v}")));
        out
    }

    /// `bin`'s objects built without `except`.
    fn all_but(bin: &str, except: &[&str]) -> Vec<String> {
        let mut out = vec![bin.to_owned()];
        out.extend(
            variants::of(bin)
                .iter()
                .filter(|v| !except.contains(v))
                .map(|v| format!("{bin}_{v}")),
        );
        out
    }

    /// The names of [`unwind::CPU_TABLES`].
    const CPU_TABLE_NAMES: [&str; 4] = {
        let t = unwind::CPU_TABLES;
        [t[0].0, t[1].0, t[2].0, t[3].0]
    };

    /// Names user space looks up in some objects.
    struct Uses {
        objects: Vec<String>,
        maps: &'static [&'static str],
        programs: Vec<String>,
        globals: &'static [&'static str],
    }

    /// Programs `<family>_N` for every slot N below `slots`.
    fn numbered(families: &[&str], slots: usize) -> Vec<String> {
        families
            .iter()
            .flat_map(|f| (0..slots).map(move |i| format!("{f}_{i}")))
            .collect()
    }

    fn strs(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    /// The kernel side names maps after their statics and programs after
    /// their functions, which cannot take `rtrace_common`'s constants:
    /// this is what ties each constant to the objects user space looks it
    /// up in.
    #[test]
    fn every_name_user_space_uses_is_in_its_objects() {
        // All but the memory reader, which links none of the shared
        // code, so none of its maps (`procmem.rs`).
        let every: Vec<String> = super::OBJECTS
            .iter()
            .map(|(n, ..)| (*n).to_owned())
            .filter(|n| n != "procmem")
            .collect();
        let of_bins =
            |bins: &[&str]| -> Vec<String> { bins.iter().flat_map(|b| all_of(b)).collect() };
        let with = |feature: &str| -> Vec<String> {
            variants::VARIANTS
                .iter()
                .filter(|(_, f)| f.contains(&feature))
                .map(|(b, _)| format!("{b}_{feature}"))
                .collect()
        };
        let event_bins: Vec<&str> = variants::VARIANTS
            .iter()
            .filter(|(_, f)| f.contains(&PERF))
            .map(|(b, _)| *b)
            .collect();
        let uses = [
            Uses {
                objects: every.clone(),
                maps: &[
                    names::ERRORS,
                    events::EVENTS_READER,
                    events::TALLIES,
                    targets::IDS_MAP,
                    targets::CGROUP_MAP,
                    targets::CPUS_MAP,
                    targets::CGROUP_SET_MAP,
                    targets::MNTNS_SET_MAP,
                ],
                programs: vec![],
                globals: &[targets::GLOBAL, events::TALLY_ONLY],
            },
            Uses {
                objects: every
                    .iter()
                    .filter(|o| {
                        !(o.starts_with("gethostlatency") || *o == "stat" || *o == "probes")
                    })
                    .cloned()
                    .collect(),
                maps: &[],
                programs: vec![],
                globals: &[names::CONFIG],
            },
            Uses {
                objects: of_bins(&event_bins),
                maps: &[events::EVENTS],
                programs: vec![],
                globals: &[],
            },
            Uses {
                objects: ["ext4slower", "gethostlatency", "memleak"]
                    .iter()
                    .flat_map(|b| all_but(b, &[TASK_STORAGE, CFI, CFI_GLOBAL]))
                    .chain(of_bins(&["offcputime", "profile"]))
                    .collect(),
                maps: &[names::STARTS],
                programs: vec![],
                globals: &[],
            },
            Uses {
                objects: of_bins(&["profile", "offcputime", "memleak", "trace", "strace"]),
                maps: &[
                    stacks::STACKS,
                    stacks::STACK_GEN,
                    stacks::STACK_NEW,
                    stacks::TIMED_JIT,
                    stacks::WINDOW,
                ],
                programs: vec![],
                globals: &[],
            },
            // Each off-CPU wait on its own (`--firefox`, `--samples`): a
            // ring buffer, so not in `perf`'s.
            Uses {
                objects: of_bins(&["profile", "offcputime"])
                    .into_iter()
                    .filter(|o| !o.ends_with(PERF))
                    .collect(),
                maps: &[rtrace_common::offcputime::INTERVALS],
                programs: vec![],
                globals: &[],
            },
            Uses {
                objects: of_bins(&["profile", "offcputime"]),
                maps: &[stacks::STACK_COUNTS],
                programs: vec![],
                globals: &[],
            },
            Uses {
                objects: with(CFI).into_iter().chain(with(CFI_GLOBAL)).collect(),
                maps: &[
                    unwind::CFI_ROWS,
                    unwind::CFI_RULES,
                    unwind::CFI_INDEX,
                    unwind::CFI_PROCS,
                    unwind::CFI_FILES,
                    unwind::CFI_FOUND,
                    python::PY_PROCS,
                    rtrace_common::java::JAVA_PROCS,
                    rtrace_common::v8::V8_PROCS,
                ],
                programs: strs(&[
                    unwind::PROG_EXEC,
                    unwind::PROG_EXIT,
                    unwind::PROG_FORK,
                    unwind::PROG_LOADED,
                ]),
                globals: &[unwind::CFI_OFFSETS, unwind::MAX_STACK_DEPTH],
            },
            // Sized by name for each possible CPU (`StackTool::configure`).
            Uses {
                objects: with(CFI).into_iter().chain(with(CFI_GLOBAL)).collect(),
                maps: &CPU_TABLE_NAMES,
                programs: vec![],
                globals: &[],
            },
            Uses {
                objects: all_of("procmem"),
                maps: &[rtrace_common::procmem::PROCMEM_REQUEST],
                programs: strs(&[rtrace_common::procmem::PROG_PROCMEM_READ]),
                globals: &[],
            },
            Uses {
                objects: all_of("probes"),
                maps: &[probes::HITS],
                programs: strs(&[
                    probes::PROG_TRACEPOINT,
                    probes::PROG_RAW_TRACEPOINT,
                    probes::PROG_TP_BTF,
                    probes::PROG_FENTRY,
                    probes::PROG_FEXIT,
                    probes::PROG_KPROBE,
                    probes::PROG_KRETPROBE,
                    probes::PROG_UPROBE,
                    probes::PROG_PERF_EVENT,
                ]),
                globals: &[],
            },
            Uses {
                objects: all_of("argdist"),
                maps: &[
                    argdist::COUNTS,
                    argdist::COUNTS_NUM,
                    argdist::HISTS,
                    argdist::ENTRIES,
                ],
                programs: vec![],
                globals: &[],
            },
            Uses {
                objects: of_bins(&["argdist", "trace"]),
                maps: &[argdist::ENTRIES],
                programs: numbered(
                    &[
                        argdist::KPROBE_PROGRAMS,
                        argdist::KRETPROBE_PROGRAMS,
                        argdist::UPROBE_PROGRAMS,
                        argdist::URETPROBE_PROGRAMS,
                        argdist::TRACEPOINT_PROGRAMS,
                    ],
                    argdist::MAX_PROBES,
                ),
                globals: &[],
            },
            Uses {
                objects: all_of("biolatency"),
                maps: &[biolatency::HISTS, biolatency::TOTAL],
                programs: vec![],
                globals: &[],
            },
            Uses {
                objects: all_of("ext4slower"),
                maps: &[],
                programs: strs(&[ext4slower::PROG_KRETPROBE, ext4slower::PROG_TP_SYS_EXIT]),
                globals: &[],
            },
            Uses {
                objects: all_of("gethostlatency"),
                maps: &[],
                programs: strs(&[gethostlatency::PROG_LOOKUP_RETURN]),
                globals: &[],
            },
            Uses {
                objects: all_of("memleak"),
                maps: &[
                    memleak::ALLOCS,
                    memleak::TOTALS,
                    memleak::WEIGHTS,
                    memleak::SAMPLE_GAPS,
                ],
                programs: strs(&[
                    memleak::PROG_MALLOC,
                    memleak::PROG_CALLOC,
                    memleak::PROG_REALLOC,
                    memleak::PROG_REALLOCARRAY,
                    memleak::PROG_MEMALIGN,
                    memleak::PROG_POSIX_MEMALIGN,
                    memleak::PROG_MMAP,
                    memleak::PROG_FREE,
                    memleak::PROG_MUNMAP,
                    memleak::PROG_ALLOC_RETURN,
                    memleak::PROG_KMALLOC,
                    memleak::PROG_KMALLOC_NODE,
                    memleak::PROG_KMEM_CACHE_ALLOC,
                    memleak::PROG_KMEM_CACHE_ALLOC_NODE,
                    memleak::PROG_KFREE,
                    memleak::PROG_KMEM_CACHE_FREE,
                    memleak::PROG_MM_PAGE_ALLOC,
                    memleak::PROG_MM_PAGE_FREE,
                    memleak::PROG_PERCPU_ALLOC,
                    memleak::PROG_PERCPU_FREE,
                ]),
                globals: &[],
            },
            // The per-sample stream is a ring buffer: not in `perf`'s.
            Uses {
                objects: all_of("profile")
                    .into_iter()
                    .filter(|o| !o.ends_with(PERF))
                    .collect(),
                maps: &[profile::SAMPLES],
                programs: vec![],
                globals: &[],
            },
            // The sampling program's walk variants, in the objects that
            // walk by CFI.
            Uses {
                objects: vec![format!("profile_{CFI}"), format!("profile_{CFI_GLOBAL}")],
                maps: &[profile::WALKERS],
                programs: strs(&[
                    profile::PROG_PROFILE_NATIVE,
                    profile::PROG_PROFILE_RUNTIMES,
                    profile::PROG_PROFILE_PYTHON,
                    profile::PROG_PROFILE_JAVA,
                    profile::PROG_PROFILE_V8,
                ]),
                globals: &[],
            },
            Uses {
                objects: all_of("profile"),
                maps: &[profile::HEAT],
                programs: strs(&[
                    profile::PROG_PROFILE,
                    profile::PROG_TRACEPOINT,
                    profile::PROG_KPROBE,
                    profile::PROG_KRETPROBE,
                    profile::PROG_UPROBE,
                    profile::PROG_URETPROBE,
                ]),
                globals: &[],
            },
            Uses {
                objects: all_of("runqlat"),
                maps: &[
                    runqlat::START,
                    runqlat::HISTS,
                    runqlat::TOTAL,
                    runqlat::TGIDS,
                ],
                programs: vec![],
                globals: &[],
            },
            Uses {
                objects: all_of("stat"),
                maps: &[
                    stat::TASK_COUNTS,
                    stat::PROBES,
                    stat::TRACEPOINTS,
                    stat::SYSCALLS,
                ],
                programs: strs(&[
                    stat::PROG_SYS_ENTER,
                    stat::PROG_SYS_EXIT,
                    stat::PROG_TRACEPOINT,
                ])
                .into_iter()
                .chain(numbered(
                    &[
                        stat::KPROBE_PROGRAMS,
                        stat::KRETPROBE_PROGRAMS,
                        stat::UPROBE_PROGRAMS,
                        stat::URETPROBE_PROGRAMS,
                    ],
                    stat::MAX_PROBES as usize,
                ))
                .collect(),
                globals: &[stat::BY_TASK],
            },
            Uses {
                objects: all_of("strace"),
                maps: &[strace::SYSCALLS, strace::SUMMARY, strace::SUMMARY_BY_PID],
                programs: strs(&[
                    strace::PROG_SYS_ENTER,
                    strace::PROG_SYS_EXIT,
                    strace::PROG_STACK,
                    strace::PROG_FORK,
                    strace::PROG_EXEC,
                    strace::PROG_SIGNAL,
                    strace::PROG_EXIT,
                ]),
                globals: &[],
            },
            Uses {
                objects: all_of("tcplife"),
                maps: &[tcplife::SOCKS],
                programs: vec![],
                globals: &[],
            },
        ];
        let mut missing = Vec::new();
        for u in &uses {
            assert!(!u.objects.is_empty());
            for object in &u.objects {
                let h = held(object);
                let lacks = |kind: &str, names: &[&str], have: &[String]| {
                    names
                        .iter()
                        .filter(|n| !have.iter().any(|h| h == *n))
                        .map(|n| format!("{object}: {kind} {n}"))
                        .collect::<Vec<_>>()
                };
                missing.extend(lacks("map", u.maps, &h.maps));
                let programs: Vec<&str> = u.programs.iter().map(String::as_str).collect();
                missing.extend(lacks("program", &programs, &h.programs));
                missing.extend(lacks("global", u.globals, &h.globals));
            }
        }
        assert!(missing.is_empty(), "{missing:#?}");
    }
}

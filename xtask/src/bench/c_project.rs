//! The generated C project that `cargo xtask bench profile` builds under
//! both profilers ([`super::build`]) and `cargo xtask bench report` builds
//! while it records: [`FILES`] small C files and a Makefile, the same on
//! every run, built with `make` [`JOBS`].

use std::{
    fmt::Write as _,
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

/// Source files of the generated project.
pub(super) const FILES: usize = 120;
/// Exported functions per file: with their helpers, about 50 to 100 ms of
/// `gcc -O2` per file on these machines.
const FUNCTIONS: usize = 4;
/// make's jobs: one per core of these machines.
pub(super) const JOBS: &str = "-j2";

/// A linear congruential generator (Knuth's MMIX constants): the
/// project's constants differ from file to file and are the same on every
/// run, so builds compare across runs and machines.
struct Lcg(u64);

impl Lcg {
    /// A number below `n`.
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }
}

/// Source file `file`: [`FUNCTIONS`] exported functions, each filling an
/// array of records and running a static helper over it several times.
/// The helpers' loops hold a switch and an inner loop that -O2 inlines
/// into and unrolls, which is where cc1 spends its time.
fn source(file: usize) -> String {
    let mut r = Lcg(file as u64 * 2_654_435_761 + 12_345);
    let mut c = String::from("#include <stddef.h>\n#include <string.h>\n\n");
    for j in 0..FUNCTIONS {
        let _ = writeln!(c, "long f{file:03}_{j}(long);");
    }
    let _ = write!(
        c,
        "\nstruct rec {{ long a, b; double w; unsigned char tag[16]; }};\n\n\
         static inline long mix(long x, long y)\n{{\n    x ^= y << {};\n    x *= {}L;\n    \
         return x ^ (x >> {});\n}}\n",
        1 + r.below(13),
        3 + 2 * r.below(1000),
        1 + r.below(29)
    );
    for j in 0..FUNCTIONS {
        let tail = if j + 1 < FUNCTIONS {
            format!("acc + f{file:03}_{}(acc & 255)", j + 1)
        } else {
            "acc".to_owned()
        };
        let _ = write!(
            c,
            r"
static long helper_{j}(struct rec *r, size_t n, long seed)
{{
    long acc = seed;
    for (size_t k = 0; k < n; k++) {{
        switch ((r[k].a + acc) & 7) {{
        case 0: acc += mix(r[k].a, {c0}); break;
        case 1: acc ^= r[k].b * {c1}; break;
        case 2: r[k].w = r[k].w * {c2}.5 + (double)acc; break;
        case 3: acc -= (long)r[k].tag[(acc >> 3) & 15]; break;
        case 4: memcpy(r[k].tag, &acc, sizeof acc); break;
        case 5: acc = mix(acc, r[k].b); break;
        case 6: r[k].b += acc >> {c6}; break;
        default: acc += (long)(r[k].w * {c7}.25); break;
        }}
        for (int u = 0; u < {unroll}; u++)
            acc = acc * {mul}L + u;
    }}
    return acc;
}}

long f{file:03}_{j}(long seed)
{{
    struct rec buf[{len}];
    size_t n = sizeof buf / sizeof buf[0];
    for (size_t k = 0; k < n; k++) {{
        buf[k].a = seed + (long)k * {step};
        buf[k].b = seed ^ (long)k;
        buf[k].w = (double)k / {div}.0;
        memset(buf[k].tag, (int)k, sizeof buf[k].tag);
    }}
    long acc = helper_{j}(buf, n, seed);
    for (int pass = 0; pass < {passes}; pass++)
        acc += helper_{j}(buf, n - (size_t)pass, acc);
    return {tail};
}}
",
            c0 = r.below(997),
            c1 = r.below(991) + 1,
            c2 = r.below(97) + 1,
            c6 = r.below(17) + 1,
            c7 = r.below(13) + 1,
            unroll = r.below(7) + 3,
            mul = 2 * r.below(1000) + 1,
            len = r.below(24) + 8,
            step = r.below(101) + 1,
            div = r.below(7) + 1,
            passes = r.below(4) + 2,
        );
    }
    c
}

/// Writes the project into `dir`: the sources, a `main.c` that calls each
/// file's first function, and a Makefile with a rule per object and a
/// final link.
pub(super) fn generate(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let names: Vec<String> = (0..FILES).map(|i| format!("f{i:03}")).collect();
    for (i, name) in names.iter().enumerate() {
        std::fs::write(dir.join(format!("{name}.c")), source(i))?;
    }
    let mut main = String::new();
    for name in &names {
        let _ = writeln!(main, "long {name}_0(long);");
    }
    main.push_str("\nint main(int argc, char **argv)\n{\n    long acc = argc;\n    (void)argv;\n");
    for name in &names {
        let _ = writeln!(main, "    acc += {name}_0(acc);");
    }
    main.push_str("    return (int)(acc & 1);\n}\n");
    std::fs::write(dir.join("main.c"), main)?;

    let objects: Vec<String> = names.iter().map(|n| format!("{n}.o")).collect();
    let mut make = format!(
        "# Written by `cargo xtask bench profile`, which rewrites it on every run.\n\
         CC = gcc\nCFLAGS = -O2\nOBJS = main.o {}\n\n\
         prog: $(OBJS)\n\t@printf '  LD %s\\n' $@ && $(CC) -o $@ $(OBJS)\n",
        objects.join(" ")
    );
    // Each recipe prints its step first, as kbuild's quiet mode does, so
    // every step runs under sh as in most real builds.
    for name in std::iter::once("main").chain(names.iter().map(String::as_str)) {
        let _ = write!(
            make,
            "\n{name}.o: {name}.c\n\t@printf '  CC %s\\n' $@ && $(CC) $(CFLAGS) -c -o $@ {name}.c\n"
        );
    }
    make.push_str("\n.PHONY: clean\nclean:\n\trm -f prog $(OBJS)\n");
    std::fs::write(dir.join("Makefile"), make)?;
    Ok(())
}

/// Runs `make` in `dir` with `args`, quietly; fails with its stderr.
pub(super) fn make(dir: &Path, args: &[&str]) -> anyhow::Result<()> {
    crate::stdout_of(
        Command::new("make")
            .arg("-s")
            .arg("-C")
            .arg(dir)
            .args(args)
            .stdin(Stdio::null()),
    )
    .map(drop)
}

/// Builds the generated project from clean, again and again, until
/// `secs` seconds have passed: a busy machine of short-lived processes
/// for other benchmarks to profile.
pub(super) fn builds_for(secs: u64) -> anyhow::Result<()> {
    let dir = crate::root().join("target/bench/cbuild");
    generate(&dir)?;
    let end = std::time::Instant::now() + Duration::from_secs(secs);
    while std::time::Instant::now() < end {
        make(&dir, &["clean"])?;
        make(&dir, &[JOBS])?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_project_is_the_same_every_time() {
        assert_eq!(source(7), source(7));
        assert_ne!(source(7), source(8));
    }
}

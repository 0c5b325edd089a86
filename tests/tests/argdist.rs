//! `rtrace argdist` against a fixture whose functions are called with a
//! known distribution of arguments (uprobes), against known write sizes
//! (syscall tracepoints), and against kernel functions where the kernel
//! has kprobes (the VM matrix).

use std::{collections::BTreeMap, time::Duration};

use rtrace_integration_tests::{
    Rtrace, SIGINT, Traced, Workload, json_lines, mechanism_works, run, trace_workload,
    workload_bin,
};

fn fixture() -> String {
    workload_bin("argfix").to_string_lossy().into_owned()
}

/// Runs `argfix MODE` under `rtrace argdist ARGS -p PID --json`; returns
/// the JSON outputs and the fixture's account, split at commas and colons.
fn traced(mode: &str, args: &[&str]) -> (Vec<serde_json::Value>, Vec<Vec<String>>) {
    let mut full = vec!["argdist", "--json"];
    full.extend_from_slice(args);
    // Let at least one interval end after the work, so that the
    // non-cumulative runs show their sums across intervals.
    let t = trace_workload(
        "argfix",
        &[mode.to_owned()],
        &full,
        Duration::from_millis(1200),
        SIGINT,
    );
    let did = t
        .done
        .split(',')
        .map(|t| t.split(':').map(str::to_owned).collect())
        .collect();
    (json_lines(&t.stdout), did)
}

/// Counts of probe `probe`, summed over every output, by the key's values
/// as text.
fn summed_counts(outputs: &[serde_json::Value], probe: usize) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for o in outputs {
        assert_eq!(o["tool"], "argdist");
        let p = &o["probes"][probe];
        assert_eq!(p["type"], "counts");
        for c in p["counts"].as_array().unwrap() {
            *out.entry(c["values"].to_string()).or_default() += c["count"].as_u64().unwrap();
        }
    }
    out
}

/// The last output's histogram of probe `probe`: (low, high, count) of its
/// non-empty buckets.
fn last_hist(outputs: &[serde_json::Value], probe: usize) -> Vec<(u64, u64, u64)> {
    let p = &outputs.last().expect("no output")["probes"][probe];
    assert_eq!(p["type"], "histogram");
    p["histogram"]["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["count"].as_u64().unwrap() > 0)
        .map(|b| {
            (
                b["low"].as_u64().unwrap(),
                b["high"].as_u64().unwrap(),
                b["count"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// Log2 buckets as libbpf-tools prints them: (low, high) of `v`.
fn bucket(v: u64) -> (u64, u64) {
    if v <= 1 {
        return (0, 1);
    }
    let exp = 63 - v.leading_zeros();
    (1 << exp, (1 << (exp + 1)) - 1)
}

/// Expected histogram from (value, times) pairs.
fn expected_hist(pairs: impl Iterator<Item = (u64, u64)>) -> Vec<(u64, u64, u64)> {
    let mut m: BTreeMap<(u64, u64), u64> = BTreeMap::new();
    for (v, n) in pairs {
        *m.entry(bucket(v)).or_default() += n;
    }
    m.into_iter().map(|((l, h), n)| (l, h, n)).collect()
}

#[test]
fn uprobe_counts_of_two_values_are_exact() {
    let spec = format!(
        "p:{}:argfix_target(u64 size, char *name):u64,char*:size,name",
        fixture()
    );
    let (outputs, did) = traced("calls", &["-C", &spec]);
    let want: BTreeMap<String, u64> = did
        .iter()
        .map(|d| {
            (
                serde_json::json!({"size": d[0].parse::<u64>().unwrap(), "name": d[1]}).to_string(),
                d[2].parse().unwrap(),
            )
        })
        .collect();
    assert_eq!(summed_counts(&outputs, 0), want);
}

#[test]
fn uprobe_histogram_is_exact() {
    let spec = format!("p:{}:argfix_target(u64 size):u64:size", fixture());
    let (outputs, did) = traced("calls", &["-c", "-H", &spec]);
    let want = expected_hist(
        did.iter()
            .map(|d| (d[0].parse().unwrap(), d[2].parse().unwrap())),
    );
    assert_eq!(last_hist(&outputs, 0), want);
}

/// `$retval` (signed), `$entry` and a filter with `||`.
#[test]
fn return_values_entry_arguments_and_filters() {
    let spec = format!(
        "r:{}:argfix_target(u64 size):u64,s64:$entry(size),$retval:$retval<0 || $entry(size)==2",
        fixture()
    );
    let (outputs, did) = traced("calls", &["-C", &spec]);
    let want: BTreeMap<String, u64> = did
        .iter()
        .map(|d| (d[0].parse::<u64>().unwrap(), d[2].parse::<u64>().unwrap()))
        .filter(|&(size, _)| 100 - (size as i64) < 0 || size == 2)
        .map(|(size, n)| {
            let key = serde_json::json!({"$entry(size)": size, "$retval": 100 - size as i64});
            (key.to_string(), n)
        })
        .collect();
    assert_eq!(want.len(), 2, "the filter keeps two keys");
    assert_eq!(summed_counts(&outputs, 0), want);
}

/// `$latency` of calls that sleep known times, in milliseconds, against
/// what each call took as the fixture measured it inside and around it:
/// the probes' traps add their own time, so a call may land in any bucket
/// from its inner time's to its outer time's.
#[test]
fn latency_histogram_of_sleeps() {
    let spec = format!("r:{}:argfix_sleep():u64:$latency/1000000", fixture());
    let (outputs, did) = traced("sleeps", &["-c", "-H", &spec]);
    // Each call's range of buckets: the latency in whole milliseconds lies
    // between its inner time's and its outer time's (the last rounded up).
    let took: Vec<((u64, u64), (u64, u64))> = did
        .iter()
        .flat_map(|d| {
            d[2].split('/').map(|t| {
                let (inside, outside) = t.split_once('-').unwrap();
                let us = |v: &str| v.parse::<u64>().unwrap();
                (bucket(us(inside) / 1000), bucket((us(outside) + 1) / 1000))
            })
        })
        .collect();
    assert_eq!(took.len(), 7);
    let got = last_hist(&outputs, 0);
    let total: u64 = got.iter().map(|b| b.2).sum();
    assert_eq!(total, took.len() as u64, "{got:?}");
    for (low, high, n) in &got {
        let sure = took
            .iter()
            .filter(|(from, to)| *from == (*low, *high) && *to == (*low, *high))
            .count() as u64;
        let maybe = took
            .iter()
            .filter(|(from, to)| from.0 <= *low && *low <= to.0)
            .count() as u64;
        assert!(
            (sure..=maybe).contains(n),
            "bucket {low}..{high} has {n}, calls took {took:?} us: {got:?}"
        );
    }
}

/// C expressions: casts, bitwise operators and shifts, division by an
/// entry argument, a filter of them, and two specs after one `-C` (bcc's
/// form), one labelled with `;`; `-I` is taken and ignored.
#[test]
fn expressions_casts_and_several_specs_after_one_flag() {
    let fix = fixture();
    let ratio = format!(
        "r:{fix}:argfix_target(u64 size):s64:$retval / (s64)$entry(size):($entry(size) & 1) == 0 || $entry(size) == 3"
    );
    let bits = format!(
        "p:{fix}:argfix_target(u64 size, char *name):u32,char*:(u32)(size << 1) ^ 1,(char*)name;doubled"
    );
    let (outputs, did) = traced("calls", &["-I", "linux/sched.h", "-C", &ratio, &bits]);
    let calls: Vec<(u64, String, u64)> = did
        .iter()
        .map(|d| (d[0].parse().unwrap(), d[1].clone(), d[2].parse().unwrap()))
        .collect();
    let mut want = BTreeMap::new();
    for (size, _, times) in &calls {
        if size % 2 == 0 || *size == 3 {
            let r = (100 - *size as i64) / *size as i64;
            *want
                .entry(serde_json::json!({"$retval / (s64)$entry(size)": r}).to_string())
                .or_default() += times;
        }
    }
    assert_eq!(summed_counts(&outputs, 0), want);
    let mut want = BTreeMap::new();
    for (size, name, times) in &calls {
        let key = serde_json::json!({"(u32)(size << 1) ^ 1": (size << 1) ^ 1, "(char*)name": name});
        *want.entry(key.to_string()).or_default() += times;
    }
    assert_eq!(summed_counts(&outputs, 1), want);
    assert_eq!(outputs[0]["probes"][1]["label"], "doubled");
}

/// bcc's own example of a struct member through a pointer argument:
/// the request of `clock_nanosleep` (which Rust's sleep calls), its layout
/// from the kernel's BTF, against the
/// sleeps the fixture asked for.
#[test]
fn struct_member_of_a_uprobe_argument() {
    let spec = "p:c:clock_nanosleep(int clock, int flags, struct timespec *req):long:req->tv_nsec";
    let (outputs, did) = traced("sleeps", &["-C", spec]);
    let mut want = BTreeMap::new();
    for d in &did {
        let ms: u64 = d[0].parse().unwrap();
        let times: u64 = d[1].parse().unwrap();
        *want
            .entry(serde_json::json!({"req->tv_nsec": (ms % 1000) * 1_000_000}).to_string())
            .or_default() += times;
    }
    let got = summed_counts(&outputs, 0);
    // The runtime may sleep on its own (a thread parked with a timeout);
    // the fixture's own requests must all be there, each exactly.
    for (key, n) in &want {
        assert_eq!(got.get(key), Some(n), "{key}: {got:?}");
    }
}

/// USDT probes from Debian's `<sys/sdt.h>`: arguments in registers and in
/// memory, a string, a filter on an argument, and the probe's semaphore
/// raised while attached (the fixture fires `tick` only when it is).
#[test]
fn usdt_probe_arguments_and_semaphore() {
    let fix = workload_bin("usdtfix").to_string_lossy().into_owned();
    let tick = format!("u:{fix}:tick():s64,char*,s64,s32:arg1,arg2,arg3,arg4");
    let plain = format!("u:{fix}:rtrace.plain():s64:arg1:arg1 > 1");
    let t = trace_workload(
        "usdtfix",
        &[],
        &["argdist", "--json", "-C", &tick, &plain],
        Duration::from_millis(1200),
        SIGINT,
    );
    let outputs = json_lines(&t.stdout);
    let mut ticks = BTreeMap::new();
    let mut plains = BTreeMap::new();
    for call in t.done.split(',') {
        let f: Vec<&str> = call.split(':').collect();
        let (size, name) = (f[0].parse::<i64>().unwrap(), f[1]);
        let (times, fired) = (f[2].parse::<u64>().unwrap(), f[3].parse::<u64>().unwrap());
        assert_eq!(
            fired, times,
            "the semaphore was not raised for {call}: {}",
            t.done
        );
        let key = serde_json::json!({"arg1": size, "arg2": name, "arg3": -size, "arg4": size * 2});
        *ticks.entry(key.to_string()).or_default() += times;
        if size > 1 {
            *plains
                .entry(serde_json::json!({"arg1": size}).to_string())
                .or_default() += times;
        }
    }
    assert_eq!(summed_counts(&outputs, 0), ticks);
    assert_eq!(summed_counts(&outputs, 1), plains);
    // A probe the file does not have names the ones it has.
    let (code, _, stderr) = run(&["argdist", "-C", &format!("u:{fix}:nonesuch()")]);
    assert_ne!(code, 0);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("rtrace.plain, rtrace.tick"), "{stderr}");
}

/// A string filter with bcc's STRCMP, and the text layout.
#[test]
fn string_filter_and_text_layout() {
    let spec = format!(
        "p:{}:argfix_target(u64 size, char *name):u64:size:STRCMP(\"beta\", name)#beta sizes",
        fixture()
    );
    let Traced { stdout, done, .. } = trace_workload(
        "argfix",
        &["calls".to_owned()],
        &["argdist", "-c", "-C", &spec],
        Duration::from_millis(1200),
        SIGINT,
    );
    let last = stdout.rsplit_once("beta sizes\n").unwrap().1;
    let mut lines = last.lines();
    assert_eq!(lines.next().unwrap(), "\tCOUNT      EVENT");
    let rows: Vec<&str> = lines.collect();
    let want: Vec<String> = done
        .split(',')
        .map(|d| d.split(':').collect::<Vec<_>>())
        .filter(|d| d[1] == "beta")
        .map(|d| format!("\t{:<10} size = {}", d[2], d[0]))
        .collect();
    // Rows go in ascending order of count.
    let mut want = want;
    want.sort_by_key(|r| r.split_whitespace().next().unwrap().parse::<u64>().unwrap());
    assert_eq!(rows, want, "{stdout}");
}

/// Exact counts of known write sizes from `t:syscalls:sys_enter_write`.
#[test]
fn tracepoint_write_sizes_are_exact() {
    let (outputs, did) = traced(
        "writes",
        &[
            "-C",
            "t:syscalls:sys_enter_write():u64:args->count:count>=1000",
        ],
    );
    let want: BTreeMap<String, u64> = did
        .iter()
        .map(|d| {
            (
                serde_json::json!({"args->count": d[0].parse::<u64>().unwrap()}).to_string(),
                d[1].parse().unwrap(),
            )
        })
        .collect();
    assert_eq!(summed_counts(&outputs, 0), want);
}

/// Kernel functions through kprobes and kretprobes, where the kernel has
/// them (the VM matrix); this host has none.
#[test]
fn kprobe_and_kretprobe_on_vfs_write() {
    if !mechanism_works("kprobe") {
        eprintln!("kprobes are not in this kernel: this test runs in the VM matrix");
        let (code, _, stderr) = run(&["argdist", "-C", "p::vfs_write()"]);
        assert_ne!(code, 0);
        assert!(stderr.contains("needs kprobes"), "{stderr}");
        return;
    }
    let (outputs, did) = traced(
        "writes",
        &[
            "-C",
            "p::vfs_write(void *file, char *buf, size_t count):u64:count:count>=1000",
            "-C",
            "r::vfs_write():s64:$retval:$retval>=1000",
            // A path of struct members and pointers, from the kernel's BTF.
            "-C",
            "p::vfs_write(struct file *file, char *buf, size_t count):char*,u64:file->f_path.dentry->d_name.name,count:count >= 1000",
        ],
    );
    let named: BTreeMap<String, u64> = did
        .iter()
        .map(|d| {
            let key = serde_json::json!({
                "file->f_path.dentry->d_name.name": "null",
                "count": d[0].parse::<u64>().unwrap(),
            });
            (key.to_string(), d[1].parse().unwrap())
        })
        .collect();
    assert_eq!(summed_counts(&outputs, 2), named);
    for (probe, name) in [(0, "count"), (1, "$retval")] {
        let want: BTreeMap<String, u64> = did
            .iter()
            .map(|d| {
                (
                    serde_json::json!({name: d[0].parse::<u64>().unwrap()}).to_string(),
                    d[1].parse().unwrap(),
                )
            })
            .collect();
        assert_eq!(summed_counts(&outputs, probe), want, "{name}");
    }
}

#[test]
fn bad_specs_point_at_the_column() {
    let fix = fixture();
    for (spec, col, want) in [
        ("x:c:malloc()", 1, "unknown probe type"),
        (
            "p:c:malloc(size_t size):size_t:sz",
            32,
            "unknown name \"sz\" (parameters: size)",
        ),
        (
            "t:syscalls:sys_enter_write():u64:args->cnt",
            40,
            "unknown name \"cnt\"",
        ),
        (
            "p:c:malloc(size_t size):u64:size:size ~ 3",
            39,
            "unexpected \"~ 3\"",
        ),
        ("p:c:malloc(size_t size):floaty:size", 25, "unknown type"),
        (
            "p:c:malloc(size_t size):u64:size<<70",
            33,
            "shift by 70: at most 63",
        ),
        (
            "p:c:malloc(size_t size):u64:size->next",
            33,
            "-> needs a pointer to a struct",
        ),
    ] {
        let (code, _, stderr) = run(&["argdist", "-C", spec]);
        assert_ne!(code, 0, "{spec}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.contains(&format!("at column {col}: ")),
            "{spec}: {stderr}"
        );
        assert!(stderr.contains(want), "{spec}: {stderr}");
    }
    let (code, _, stderr) = run(&["argdist", "-H", &format!("p:{fix}:argfix_target()")]);
    assert_ne!(code, 0);
    assert!(stderr.contains("needs an expression"), "{stderr}");
    let (code, _, stderr) = run(&["argdist", "-C", &format!("p:{fix}:no_such_function")]);
    assert_ne!(code, 0);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains(&format!("no function 'no_such_function' in {fix}")),
        "{stderr}"
    );
    // A path that is not there, or not a program, said in those words.
    let text = std::env::temp_dir().join(format!("rtrace-argdist-{}.txt", std::process::id()));
    std::fs::write(&text, "not a program\n").unwrap();
    let text = text.to_str().unwrap();
    for (target, want) in [
        ("/nonexistent", "no such file: /nonexistent".to_owned()),
        (text, format!("{text} is not an ELF file")),
    ] {
        let (code, _, stderr) = run(&["argdist", "-C", &format!("p:{target}:f()")]);
        assert_ne!(code, 0);
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains(&want), "{stderr}");
    }
    let _ = std::fs::remove_file(text);
    let (code, _, stderr) = run(&["argdist"]);
    assert_ne!(code, 0);
    assert!(stderr.contains("give at least one probe"), "{stderr}");
    let (code, _, stderr) = run(&[
        "argdist",
        "-C",
        "t:syscalls:sys_enter_write()",
        "-p",
        "999999999",
    ]);
    assert_ne!(code, 0);
    assert!(stderr.contains("no such process"), "{stderr}");
}

/// `-n` ends the run after that many outputs, `-T` keeps the most frequent
/// keys, `-z` cuts strings to that many bytes with their NUL, and `-t`
/// traces one thread (the fixture's main thread, whose id is its pid).
#[test]
fn output_count_top_string_size_and_thread() {
    let spec = format!(
        "p:{}:argfix_target(u64 size, char *name):char*:name",
        fixture()
    );
    let (mut work, _) = Workload::start("argfix", &["calls".to_owned()]);
    let pid = work.pid().to_string();
    let rtrace = Rtrace::start(&[
        "argdist", "--json", "-c", "-i", "1", "-n", "3", "-T", "2", "-z", "3", "-t", &pid, "-C",
        &spec,
    ]);
    let done = work.go();
    work.wait();
    let (code, stdout, stderr) = rtrace.wait();
    assert_eq!(code, 0, "{stderr}");
    let outputs = json_lines(&stdout);
    assert_eq!(outputs.len(), 3, "{stdout}");
    let mut by_prefix: BTreeMap<String, u64> = BTreeMap::new();
    for d in done.split(',') {
        let f: Vec<&str> = d.split(':').collect();
        *by_prefix.entry(f[1][..2].to_owned()).or_default() += f[2].parse::<u64>().unwrap();
    }
    let mut ranked: Vec<(String, u64)> = by_prefix.into_iter().collect();
    ranked.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
    let want: BTreeMap<String, u64> = ranked
        .into_iter()
        .take(2)
        .map(|(name, n)| (serde_json::json!({ "name": name }).to_string(), n))
        .collect();
    let last = &outputs[2..];
    assert_eq!(summed_counts(last, 0), want, "{stdout}");
}

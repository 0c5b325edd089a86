//! argdist: one generic program per probe slot, configured from parsed
//! specs at load time, that computes a key of values at a function's
//! entry or return or at a tracepoint, filters it, and counts it in a
//! histogram or a frequency table. No code is generated at run time.
#![no_std]
#![no_main]

use aya_ebpf::{
    Global,
    helpers::bpf_get_current_pid_tgid,
    macros::map,
    maps::{HashMap, PerCpuArray, PerCpuHashMap},
    programs::{ProbeContext, RetProbeContext, TracePointContext},
};
use rtrace_common::{
    argdist::{
        Config, ERR_COUNTS_FULL, ERR_ENTRIES_FULL, KIND_RETURN, Key, MAX_PROBES, MAX_VALUES,
        MODE_HIST, NumKey, Probe, STR_LEN, VAL_SIGNED,
    },
    hist::Hist,
};
use rtrace_ebpf::{
    count_error, count_key, count_key_local,
    expr::{self, Sources, number, passes},
    global, hist_record_local,
};

#[unsafe(no_mangle)]
static CONFIG: Global<Config> = Global::new(unsafe { core::mem::zeroed() });

/// Frequency counts, by key; user space sizes it.
#[map]
static COUNTS: HashMap<Key, u64> = HashMap::with_max_entries(10240, 0);
/// Frequency counts of probes with no string values, by their smaller
/// key; user space sizes it.
#[map]
static COUNTS_NUM: PerCpuHashMap<NumKey, u64> = PerCpuHashMap::with_max_entries(10240, 0);
/// Histograms, by probe slot.
#[map]
static HISTS: PerCpuArray<Hist> = PerCpuArray::with_max_entries(MAX_PROBES as u32, 0);
/// Where a key is put together.
#[map]
static KEY: PerCpuArray<Key> = PerCpuArray::with_max_entries(1, 0);

/// The probe of `slot`, unless the current task is filtered out.
#[inline(always)]
fn probe(slot: usize) -> Option<&'static Probe> {
    expr::admitted(&global(&CONFIG).probes, slot)
}

/// Computes the key of probe `slot` and counts it.
#[inline(always)]
fn record(p: &Probe, slot: usize, s: &Sources) {
    if !passes(p, s) {
        return;
    }
    if p.mode == MODE_HIST {
        let x = number(&p.values[0], s);
        // Negative values count as zero, the histogram's lowest bucket.
        let x = if p.values[0].flags & VAL_SIGNED != 0 && (x as i64) < 0 {
            0
        } else {
            x
        };
        if let Some(h) = HISTS.get_ptr_mut(slot as u32) {
            // SAFETY: a per-CPU histogram of this CPU.
            unsafe { hist_record_local(h, x) };
        }
        return;
    }
    if p.n_strings == 0 {
        let mut k = NumKey {
            probe: slot as u32,
            _pad: 0,
            values: [0; MAX_VALUES],
        };
        for (i, v) in p.values.iter().enumerate() {
            if i as u32 >= p.n_values {
                break;
            }
            k.values[i] = number(v, s);
        }
        if count_key_local(&COUNTS_NUM, &k).is_none() {
            count_error(ERR_COUNTS_FULL);
        }
        return;
    }
    let Some(k) = KEY.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: this CPU's scratch key.
    let k = unsafe { &mut *k };
    k.probe = slot as u32;
    k._pad = 0;
    k.values = [0; MAX_VALUES];
    k.strings[0] = [0; STR_LEN];
    k.strings[1] = [0; STR_LEN];
    expr::values(p, s, &mut k.values, &mut k.strings);
    if count_key(&COUNTS, k).is_none() {
        count_error(ERR_COUNTS_FULL);
    }
}

#[inline(always)]
fn on_entry(ctx: &ProbeContext, slot: usize) {
    let Some(p) = probe(slot) else { return };
    let id = bpf_get_current_pid_tgid();
    if p.kind == KIND_RETURN {
        expr::enter(ctx, slot, id, ERR_ENTRIES_FULL);
        return;
    }
    record(p, slot, &expr::at_entry(ctx, id));
}

#[inline(always)]
fn on_return(ctx: &RetProbeContext, slot: usize) {
    let Some(p) = probe(slot) else { return };
    let id = bpf_get_current_pid_tgid();
    let Some(s) = expr::at_return(ctx, ctx.ret(), p, slot, id) else {
        return;
    };
    record(p, slot, &s);
    expr::leave(&s, slot);
}

#[inline(always)]
fn on_tracepoint(ctx: &TracePointContext, slot: usize) {
    let Some(p) = probe(slot) else { return };
    record(
        p,
        slot,
        &expr::at_tracepoint(ctx, bpf_get_current_pid_tgid()),
    );
}

rtrace_ebpf::spec_programs!();

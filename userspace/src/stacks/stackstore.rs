//! Stacks counted in the kernel (`STACK_COUNTS` by [`Key`], or by
//! [`WakeKey`] where a waker's stacks are counted too; `STACKS` by hash),
//! moved to user space while a tool runs, and symbolized as their
//! processes go.
//!
//! Two things keep a long run bounded:
//! - the kernel's tables hold only what is new: once a quarter of either
//!   has been filled since it was last moved out (the kernel counts the
//!   entries it creates), or after `DRAIN_AT_LEAST`, a tick flips the
//!   generation samples are counted in and moves the older one out, with
//!   every stack stored so far, so they never fill however many processes
//!   come and go; at low rates the tables stay put, since moving them
//!   walks every bucket and the kernel then stores every stack again;
//! - a process that has exited is symbolized at the next move, and its
//!   counts kept by interned names, not addresses: what stays grows with
//!   the distinct stacks by name, which programs repeat, and not with the
//!   processes, whose addresses differ with every start (ASLR). Its
//!   captured maps are dropped then too.

use std::{
    collections::{HashMap, HashSet},
    os::fd::AsFd as _,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use aya::{
    Ebpf,
    maps::{HashMap as BpfHashMap, IterableMap as _},
};
use rtrace_common::{
    offcputime::Interval,
    profile::{
        CUT_USER, Key, MISSED_KERNEL, MISSED_USER, NEW_COUNTS, NEW_STACKS, OFF_CPU, Stack, WakeKey,
    },
    profile::{HEAT_SLOT_NS, TimedSample},
    stacks::{MAX_SEGMENTS, SLOT_SHIFT, STACK_COUNTS, STACK_GEN, STACK_NEW, STACKS},
};

use crate::kernel::load::{map_mut, per_cpu_sums};
use crate::{
    kernel::{batch, procmaps::Proc},
    stacks::{
        sample::{self, Sample, Thread, Timed},
        symbolize::{Frame, Kind, Symbolizer},
    },
};

/// A stack moved out of the kernel.
struct Held {
    ips: Box<[u64]>,
    /// The tick it was last moved out at.
    tick: u64,
}

/// Every entry of a map, in batches where the kernel has them, and whether
/// it did.
pub fn read_all<T: std::borrow::Borrow<aya::maps::MapData>, K: aya::Pod, V: aya::Pod>(
    map: &BpfHashMap<T, K, V>,
) -> (Vec<(K, V)>, bool) {
    match batch::lookup_all::<K, V>(map.map().fd().as_fd()) {
        Some(all) => (all, true),
        None => (map.iter().filter_map(Result::ok).collect(), false),
    }
}

/// Deletes `keys` from a map, in batches where the kernel has them.
fn remove<K: aya::Pod, V: aya::Pod>(
    map: &mut BpfHashMap<&mut aya::maps::MapData, K, V>,
    keys: &[K],
    batched: bool,
) -> std::io::Result<()> {
    if batched && let Some(r) = batch::delete(map.map().fd().as_fd(), keys) {
        return r;
    }
    for k in keys {
        // Gone already is fine; nothing else can fail here.
        let _ = map.remove(k);
    }
    Ok(())
}

/// Entries the kernel has created in `STACKS` and `STACK_COUNTS` so far
/// (`STACK_NEW`'s slots `NEW_STACKS` and `NEW_COUNTS`).
fn created(ebpf: &Ebpf) -> anyhow::Result<[u64; 2]> {
    const { assert!(NEW_STACKS == 0 && NEW_COUNTS == 1) };
    let sums = per_cpu_sums(ebpf, STACK_NEW, 2)?;
    Ok([sums[0], sums[1]])
}

/// One thread of a count, symbolized: command, pid, kernel and user
/// frames, and whether it was off the CPU.
/// A thread's command, process, thread (0 where not counted by thread),
/// kernel and user frames, and whether it was off the CPU.
type Symbolized = ([u8; 16], Proc, u32, Vec<Frame>, Vec<Frame>, bool, bool);

/// One thread of a settled sample: names, not addresses.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct Named {
    comm: [u8; 16],
    /// The process: a pid's later process is another.
    proc: Proc,
    /// The thread, where counted by thread; else 0.
    tid: u32,
    /// Id of the kernel stack in [`StackStore::named`].
    kernel: u32,
    /// Id of the user stack in [`StackStore::named`].
    user: u32,
    /// Counted off the CPU, in nanoseconds (`profile --off-cpu`).
    off_cpu: bool,
    /// The user stack was cut short (`CUT_USER`).
    cut: bool,
}

/// A process's samples whose user stacks were cut short, of all of them
/// (in the counts' unit: samples, or nanoseconds off the CPU).
#[derive(Clone, Debug, Default)]
pub struct CutShort {
    /// Counts of cut-short stacks.
    pub cut: u64,
    /// All its counts.
    pub all: u64,
    /// The distinct stacks (as the kernel counted them, by address) cut
    /// short: counts off the CPU are times, and a few long waits with one
    /// stack would weigh as much as a JIT's every sample.
    pub stacks: u64,
    /// Its counts by thread command, in the order the commands were met.
    comms: Vec<([u8; 16], u64)>,
    /// Its first thread's command, once a count of that thread is met.
    first: Option<[u8; 16]>,
}

impl CutShort {
    /// Counts `count` of thread `tid` (0: not counted by thread) of
    /// process `pid`, whose command is `comm`, towards the process's name.
    fn name(&mut self, comm: &[u8; 16], tid: u32, pid: u32, count: u64) {
        if self.first.is_some() {
            return;
        }
        if tid == pid {
            self.first = Some(*comm);
            return;
        }
        match self.comms.iter_mut().find(|(c, _)| c == comm) {
            Some((_, n)) => *n = n.saturating_add(count),
            None => self.comms.push((*comm, count)),
        }
    }

    /// The process's command: its first thread's where a count of that
    /// thread was met, else the one most of its counts were taken in (of
    /// equals, the first met). Not the first thread counted, which may be
    /// a helper (Mono's `Finalizer`) named nothing like the program.
    pub fn comm(&self) -> String {
        let busiest =
            self.comms
                .iter()
                .fold(None, |best: Option<&([u8; 16], u64)>, c| match best {
                    Some(b) if b.1 >= c.1 => Some(b),
                    _ => Some(c),
                });
        self.first
            .as_ref()
            .or(busiest.map(|(c, _)| c))
            .map(|c| crate::kernel::c_string(c))
            .unwrap_or_default()
    }
}

/// Moves the counts of generation `old` (all with `all`) out of `map`
/// into `into`, widened to [`WakeKey`]s with their generation zeroed.
fn move_counts<K: aya::Pod>(
    map: &mut aya::maps::Map,
    all: bool,
    old: u32,
    wide: impl Fn(K) -> WakeKey,
    into: &mut HashMap<WakeKey, u64>,
) -> anyhow::Result<()> {
    let mut counts: BpfHashMap<_, K, u64> = BpfHashMap::try_from(map)?;
    let (entries, batched) = read_all(&counts);
    let mut moved = Vec::with_capacity(entries.len());
    for (k, n) in entries {
        let mut w = wide(k);
        // Keys keep the generation's low 16 bits.
        if all || w.key.generation == old as u16 {
            moved.push(k);
            w.key.generation = 0;
            *into.entry(w).or_default() += n;
        }
    }
    remove(&mut counts, &moved, batched).with_context(|| format!("cannot clear map {STACK_COUNTS}"))
}

/// How long counts by time slot wait for a jitdump to name their JIT code
/// before they give up their slot.
const SLOT_PATIENCE: Duration = Duration::from_secs(10);

/// The longest the kernel's tables stay put, however little is new: the
/// counts of processes gone wait for a move to be symbolized and their
/// captured maps dropped.
const DRAIN_AT_LEAST: Duration = Duration::from_secs(10);

/// See the module documentation.
#[derive(Default)]
pub struct StackStore {
    /// Entries `STACKS` and `STACK_COUNTS` hold (`NEW_STACKS`,
    /// `NEW_COUNTS` order).
    capacity: [u64; 2],
    /// Entries the kernel had created in each when the tables were last
    /// moved out, and when.
    drained: ([u64; 2], Option<Instant>),
    /// Whether the kernel counts by [`WakeKey`], not [`Key`].
    wakers: bool,
    /// Samples by key (its generation zeroed) of processes not settled
    /// yet; without wakers, the waker part is zero.
    counts: HashMap<WakeKey, u64>,
    /// Frames by stack hash.
    stacks: HashMap<u64, Held>,
    /// See [`StackStore::cut`].
    cut: u64,
    /// See [`StackStore::cut_short`].
    short: HashMap<Proc, CutShort>,
    /// The generation the kernel counts in now.
    generation: u32,
    /// Ticks so far.
    tick: u64,
    /// Processes found gone at the last tick; their last samples were
    /// counted in the generation moved out at the next.
    gone: HashSet<Proc>,
    /// Settled samples by name: the thread, its waker, and the heat map
    /// slot counted in (0 without `time_zero`).
    settled: HashMap<(Named, Option<Named>, u32), u64>,
    /// Where every key carries its heat map slot ([`Key::slot`], 1-based,
    /// `HEAT_SLOT_NS` long): the slots' time zero, CLOCK_MONOTONIC.
    time_zero: Option<u64>,
    /// Distinct symbolized stacks, as frame ids, and their ids.
    named: HashMap<Box<[u32]>, u32>,
    /// Distinct frames, by id.
    frames: Vec<Frame>,
    frame_ids: HashMap<Frame, u32>,
    /// See [`StackStore::exact_leaves`].
    exact: bool,
    /// Leaf frames by name and exact address, where they are kept apart.
    exact_ids: HashMap<(Frame, u64), u32>,
    /// With the per-sample stream ([`StackStore::keep_names`]): each key
    /// named so far (its generation zeroed), by which a sample's own
    /// record finds its names, and its waker's.
    names_by_key: Option<HashMap<WakeKey, (Named, Option<Named>)>>,
}

/// A sample or a wait the kernel sent on its own (`--firefox`,
/// `--samples`), as user space reads it from either stream.
#[derive(Clone, Copy, Debug)]
pub struct Sent {
    /// When it was taken, or when the wait ended: CLOCK_MONOTONIC
    /// nanoseconds.
    pub time: u64,
    /// What it added to its key's count: 1, or nanoseconds.
    pub value: u64,
    /// The CPU it was taken on, or the wait ended on.
    pub cpu: u32,
    /// The thread's id.
    pub tid: u32,
    /// The key it was counted under, widened as the store keeps keys.
    pub key: WakeKey,
    /// Whether it is a wait off the CPU.
    pub off_cpu: bool,
}

impl Sent {
    /// A sample on the CPU ([`TimedSample`]).
    pub fn sample(r: &TimedSample) -> Self {
        Self {
            time: r.time,
            value: r.value,
            cpu: r.cpu,
            tid: r.tid,
            key: WakeKey {
                key: r.key,
                waker: Key::new(0, [0; 16]),
            },
            off_cpu: false,
        }
    }

    /// A wait off the CPU ([`Interval`]), stamped at its end; `flagged`
    /// where the object counted it with [`OFF_CPU`] added to its key
    /// (`profile --off-cpu`), as the kernel sends the key before that.
    pub fn wait(r: &Interval, flagged: bool) -> Self {
        let mut key = r.key;
        if flagged {
            key.key.flags |= OFF_CPU;
        }
        Self {
            time: r.start.wrapping_add(r.ns),
            value: r.ns,
            cpu: r.cpu,
            tid: r.tid,
            key,
            off_cpu: true,
        }
    }
}

impl StackStore {
    /// A store for counts by [`WakeKey`] (`wakers`), else by [`Key`].
    pub fn new(wakers: bool) -> Self {
        Self {
            wakers,
            ..Self::default()
        }
    }

    /// Keeps each stack's leaf frames (the sampled code, and the function
    /// it was inlined into) at their exact addresses: stacks that differ
    /// only there stay apart, for annotate and for pprof's locations.
    /// Otherwise frames alike share one of their addresses.
    pub fn exact_leaves(&mut self) {
        self.exact = true;
    }

    /// Keeps the names of every key settled, so that the per-sample
    /// stream's records (`--firefox`, `--samples`), which carry the key
    /// they were counted under, can be named ([`StackStore::timed`]).
    pub fn keep_names(&mut self) {
        self.names_by_key = Some(HashMap::new());
    }

    /// Keeps counts apart by the heat map slot the kernel counted them in
    /// (its keys' [`Key::slot`] from `zero` on): a range of time then has
    /// its own samples ([`Sample::slot`]). JIT code is named by the code
    /// at its addresses in that slot, as the jitdumps' slots would.
    pub fn count_by_time(&mut self, zero: u64) {
        self.time_zero = Some(zero);
    }

    /// The CLOCK_MONOTONIC middle of a key's time slot, taken as the
    /// latest such slot at or before `now`.
    fn slot_middle(&self, slot: u32, now: u64) -> u64 {
        match self.time_zero {
            Some(zero) => {
                zero + u64::from(slot.saturating_sub(1)) * HEAT_SLOT_NS + HEAT_SLOT_NS / 2
            }
            None => slot_middle(slot, now),
        }
    }

    /// The frames of stack `hash`, if it was moved out of the kernel.
    pub fn held(&self, hash: u64) -> Option<&[u64]> {
        self.stacks.get(&hash).map(|h| &h.ips[..])
    }

    /// Notes how many entries `STACKS` and `STACK_COUNTS` hold, as they
    /// are made empty.
    pub fn size(&mut self, stacks: u32, counts: u32) {
        self.capacity = [u64::from(stacks), u64::from(counts)];
        self.drained = ([0; 2], Some(Instant::now()));
    }

    /// Whether the tables are due to be moved out: a quarter of either
    /// filled since the last move, or `DRAIN_AT_LEAST` passed.
    pub fn due(&self, ebpf: &Ebpf) -> anyhow::Result<bool> {
        let (before, at) = self.drained;
        if at.is_none_or(|t| t.elapsed() >= DRAIN_AT_LEAST) {
            return Ok(true);
        }
        let now = created(ebpf)?;
        Ok((0..2).any(|i| now[i].saturating_sub(before[i]) >= self.capacity[i] / 4))
    }

    /// Moves counts and stacks out of the kernel: with `all`, everything
    /// (counting has stopped); otherwise the generation is flipped first
    /// and the older one's counts moved, which the kernel no longer
    /// writes. A stack is copied before it is deleted, and one the kernel
    /// meets again is simply stored again.
    pub fn drain(&mut self, ebpf: &mut Ebpf, all: bool) -> anyhow::Result<()> {
        self.tick += 1;
        self.drained = (created(ebpf)?, Some(Instant::now()));
        let old = self.generation;
        if !all {
            // Counted up, not flipped: the kernel also marks which
            // processes it told of in which generation.
            self.generation = self.generation.wrapping_add(1);
            let mut generation: aya::maps::Array<_, u32> =
                aya::maps::Array::try_from(map_mut(ebpf, STACK_GEN)?)?;
            generation.set(0, self.generation, 0)?;
            // A sample that read the old generation on another CPU is done
            // within microseconds.
            std::thread::sleep(Duration::from_millis(1));
        }
        let map = map_mut(ebpf, STACK_COUNTS)?;
        if self.wakers {
            move_counts(map, all, old, |k: WakeKey| k, &mut self.counts)?;
        } else {
            let zero = Key::new(0, [0; 16]);
            let wide = |key: Key| WakeKey { key, waker: zero };
            move_counts(map, all, old, wide, &mut self.counts)?;
        }

        let mut stacks: BpfHashMap<_, u64, Stack> = BpfHashMap::try_from(map_mut(ebpf, STACKS)?)?;
        let (entries, batched) = read_all(&stacks);
        let tick = self.tick;
        let hashes: Vec<u64> = entries.iter().map(|(h, _)| *h).collect();
        let read: HashMap<u64, Stack> = entries.into_iter().collect();
        for (&hash, s) in &read {
            if let Some(held) = self.stacks.get_mut(&hash) {
                held.tick = tick;
                continue;
            }
            let ips = self.join(s, &read);
            self.stacks.insert(hash, Held { ips, tick });
        }
        remove(&mut stacks, &hashes, batched)
            .with_context(|| format!("cannot clear map {STACKS}"))?;
        Ok(())
    }

    /// The frames of entry `s` and of the entries it goes on in (a stack
    /// deeper than one entry), found among those just `read` or those
    /// moved out before, which are whole already. A part found in neither
    /// is counted ([`StackStore::cut`]).
    fn join(&mut self, s: &Stack, read: &HashMap<u64, Stack>) -> Box<[u64]> {
        let (frames, mut next) = s.frames();
        let mut ips = frames.to_vec();
        for _ in 1..MAX_SEGMENTS {
            let Some(hash) = next else { break };
            if let Some(s) = read.get(&hash) {
                let (frames, more) = s.frames();
                ips.extend_from_slice(frames);
                next = more;
            } else if let Some(held) = self.stacks.get(&hash) {
                ips.extend_from_slice(&held.ips);
                next = None;
            } else {
                self.cut += 1;
                next = None;
            }
        }
        ips.into()
    }

    /// Deep stacks stored in several entries of which one was lost
    /// between moves, kept to the part that was found.
    pub fn cut(&self) -> u64 {
        self.cut
    }

    /// Settles what can be of the counts by time slot ([`Key::slot`]) of
    /// processes `pids`, whose jitdumps tell which code was at an address
    /// when, while they run: a stack whose JIT code the dump names
    /// already. The others wait, as runtimes buffer their records (V8
    /// writes 2 MB at a time, or at exit), for the process's exit or the
    /// end; after `SLOT_PATIENCE` their slot is dropped, so that what
    /// waits does not grow with the run, and they take the newest code
    /// at their addresses when named.
    pub fn settle_timed(&mut self, sym: &mut Symbolizer, pids: &HashSet<Proc>) {
        if pids.is_empty() {
            return;
        }
        sym.read_dumps();
        let waiting: Vec<WakeKey> = self
            .counts
            .keys()
            .filter(|k| k.key.slot != 0 && pids.contains(&proc_of(&k.key)))
            .copied()
            .collect();
        let now = crate::kernel::monotonic_ns();
        let oldest = now.saturating_sub(SLOT_PATIENCE.as_nanos() as u64);
        let mut ready: HashSet<WakeKey> = HashSet::new();
        for k in waiting {
            let ips = self.stacks.get(&k.key.user).map_or(&[][..], |h| &h.ips);
            if sym.names_all_jit(proc_of(&k.key), ips) {
                ready.insert(k);
            } else if self.time_zero.is_none()
                && slot_middle(k.key.slot, now) < oldest
                && let Some(n) = self.counts.remove(&k)
            {
                let mut untimed = k;
                untimed.key.slot = 0;
                *self.counts.entry(untimed).or_default() += n;
            }
        }
        self.settle_where(sym, |k| ready.contains(k));
    }

    /// The processes still running whose counted stacks have JIT frames
    /// that neither their perf map nor their jitdump names yet (a
    /// runtime that writes its map at exit), each once.
    pub fn unnamed_jit(&self, sym: &mut Symbolizer) -> Vec<Proc> {
        // Each process looked at once: whether it runs, and its maps.
        let live: HashSet<Proc> = self
            .pids()
            .into_iter()
            .filter(|p| p.pid != 0 && p.alive())
            .collect();
        for &p in &live {
            sym.capture(p, false);
        }
        let mut out: Vec<Proc> = self
            .counts
            .keys()
            .map(|k| (proc_of(&k.key), k.key.user))
            .filter(|(p, user)| {
                let ips = self.stacks.get(user).map_or(&[][..], |h| &h.ips);
                live.contains(p) && !sym.names_all_jit(*p, ips)
            })
            .map(|(p, _)| p)
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Captures the mappings of every process with counts that the
    /// symbolizer knows nothing of: the kernel tells of a process at its
    /// first sample, and this catches one whose news was lost.
    pub fn capture_unknown(&self, sym: &mut Symbolizer) {
        capture_unknown(&self.pids(), sym);
    }

    /// The processes named by counts not settled yet, each once.
    fn pids(&self) -> Vec<Proc> {
        let mut pids: Vec<Proc> = self.counts.keys().flat_map(tgids).collect();
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    /// Captures what the symbolizer does not know of the processes named
    /// by counts ([`StackStore::capture_unknown`]), symbolizes and settles
    /// the processes found gone at the last call, notes those gone now,
    /// and drops stacks nothing needs any more.
    pub fn settle_gone(&mut self, sym: &mut Symbolizer) {
        let live = self.pids();
        capture_unknown(&live, sym);
        let due = std::mem::take(&mut self.gone);
        // The idle tasks (pid 0) never go; kernel threads' ids are real
        // processes, in /proc while they live.
        self.gone = live
            .into_iter()
            .filter(|p| p.pid != 0 && !due.contains(p))
            .filter(|p| !p.alive())
            .collect();
        if due.is_empty() {
            return;
        }
        // A perf map written at exit (Mono's, the JVM's) is read before
        // the process's stacks are named, in case its exit was not seen.
        for &p in &due {
            sym.exited(p);
        }
        // A count naming a process gone, as the thread or its waker.
        self.settle(sym, |p| due.contains(&p));
        for p in due {
            sym.forget(p);
        }
        // A stack moved out at this tick or the last may still be named by
        // counts the kernel holds; older ones not named by any count here
        // are gone from the kernel's table and would be stored again.
        let named: HashSet<u64> = self
            .counts
            .keys()
            .flat_map(|k| [k.key.kernel, k.key.user, k.waker.kernel, k.waker.user])
            .collect();
        let tick = self.tick;
        self.stacks
            .retain(|hash, held| held.tick + 1 >= tick || named.contains(hash));
    }

    /// Symbolizes the counts naming a process `which` admits and moves
    /// them to the settled counts.
    fn settle(&mut self, sym: &mut Symbolizer, which: impl Fn(Proc) -> bool) {
        self.settle_where(sym, |k| tgids(k).any(&which));
    }

    /// Symbolizes the counts whose keys `which` admits and moves them to
    /// the settled counts.
    fn settle_where(&mut self, sym: &mut Symbolizer, which: impl Fn(&WakeKey) -> bool) {
        let mut entries: Vec<(WakeKey, u64)> = self
            .counts
            .iter()
            .filter(|(k, _)| which(k))
            .map(|(k, n)| (*k, *n))
            .collect();
        if entries.is_empty() {
            return;
        }
        for (k, _) in &entries {
            self.counts.remove(k);
        }
        entries.sort_unstable_by_key(|(k, _)| k.key.slot);
        // JIT frames are named by the code at their addresses in the slot
        // counted in, where there is one.
        let now = crate::kernel::monotonic_ns();
        for group in entries.chunk_by(|a, b| a.0.key.slot == b.0.key.slot) {
            let slot = group[0].0.key.slot;
            sym.jit_time((slot != 0).then(|| self.slot_middle(slot, now)));
            self.name(sym, group);
        }
        sym.jit_time(None);
    }

    /// Symbolizes counts and adds them to the settled counts.
    fn name(&mut self, sym: &mut Symbolizer, entries: &[(WakeKey, u64)]) {
        let threads = |k: &WakeKey| [Some(k.key), k.has_waker().then_some(k.waker)];
        let stacks = &self.stacks;
        let empty: Box<[u64]> = Box::default();
        let ips = |hash: u64| stacks.get(&hash).map_or(&empty, |h| &h.ips).as_ref();
        let mut requests: Vec<(Option<Proc>, &[u64])> = Vec::with_capacity(entries.len() * 2);
        for key in entries.iter().flat_map(|(k, _)| threads(k)).flatten() {
            requests.push((None, ips(key.kernel)));
            requests.push((Some(proc_of(&key)), ips(key.user)));
        }
        let mut frames = sym.symbolize(&requests).into_iter();
        let lost = |key: &Key, flag: u16, hash: u64| {
            key.flags & flag != 0 || (hash != 0 && !stacks.contains_key(&hash))
        };
        let mut named = Vec::with_capacity(entries.len());
        let timed = self.time_zero.is_some();
        for (k, count) in entries {
            let [thread, waker] = threads(k).map(|key| {
                let key = key?;
                let mut kernel = own_frames(frames.next().unwrap_or_default());
                let mut user = frames.next().unwrap_or_default();
                if lost(&key, MISSED_KERNEL, key.kernel) {
                    kernel = vec![Frame::missed(sample::MISSED_KERNEL, Kind::Kernel)];
                }
                if lost(&key, MISSED_USER, key.user) {
                    user = vec![Frame::missed(sample::MISSED_USER, Kind::User)];
                }
                Some((
                    key.comm,
                    proc_of(&key),
                    key.tid,
                    kernel,
                    user,
                    key.flags & OFF_CPU != 0,
                    key.flags & CUT_USER != 0,
                ))
            });
            let slot = if timed { k.key.slot } else { 0 };
            named.push((k, thread, waker, slot, *count));
        }
        for (key, thread, waker, slot, count) in named {
            let mut name = |t: Option<Symbolized>| {
                t.map(|(comm, proc, tid, kernel, user, off_cpu, cut)| Named {
                    comm,
                    proc,
                    tid,
                    kernel: self.intern(kernel),
                    user: self.intern(user),
                    off_cpu,
                    cut,
                })
            };
            let Some(thread) = name(thread) else {
                continue;
            };
            let waker = name(waker);
            if let Some(names) = &mut self.names_by_key {
                names.insert(*key, (thread, waker));
            }
            let short = self.short.entry(thread.proc).or_default();
            short.name(&thread.comm, thread.tid, thread.proc.pid, count);
            short.all += count;
            if thread.cut {
                short.cut += count;
                short.stacks += 1;
            }
            *self.settled.entry((thread, waker, slot)).or_default() += count;
        }
    }

    /// The id of a stack, each frame interned: a stack costs four bytes a
    /// frame, and each name is held once.
    fn intern(&mut self, stack: Vec<Frame>) -> u32 {
        // The leaf's location: its inlined frames and the function they
        // are in, which share its address.
        let leaf = if self.exact {
            stack
                .iter()
                .position(|f| f.kind != Kind::Inlined)
                .map_or(stack.len(), |i| i + 1)
        } else {
            0
        };
        let ids: Box<[u32]> = stack
            .into_iter()
            .enumerate()
            .map(|(i, f)| {
                let found = if i < leaf {
                    self.exact_ids.get(&(f.clone(), f.addr))
                } else {
                    self.frame_ids.get(&f)
                };
                if let Some(&id) = found {
                    return id;
                }
                let id = self.frames.len() as u32;
                self.frames.push(f.clone());
                if i < leaf {
                    let addr = f.addr;
                    self.exact_ids.insert((f, addr), id);
                } else {
                    self.frame_ids.insert(f, id);
                }
                id
            })
            .collect();
        let next = self.named.len() as u32;
        *self.named.entry(ids).or_insert(next)
    }

    /// The processes some of whose user stacks were cut short, with how
    /// many of their counts, since the start.
    pub fn cut_short(&self) -> impl Iterator<Item = (Proc, &CutShort)> {
        self.short
            .iter()
            .filter(|(_, s)| s.cut > 0)
            .map(|(p, s)| (*p, s))
    }

    /// Every sample since the last call, symbolized, hottest first, as
    /// [`samples`](Self::samples); the counts start again from zero, the
    /// names stay known.
    pub fn take_samples(&mut self, sym: &mut Symbolizer) -> Vec<Sample> {
        let out = self.samples(sym);
        self.settled.clear();
        out
    }

    /// The per-sample streams' `records`, named by the keys they were
    /// counted under (once [`StackStore::samples`] has settled every
    /// count), each with its own time (`wall`: the wall-clock time of a
    /// CLOCK_MONOTONIC instant), CPU, thread and weight; and how many
    /// could not be named, their keys not counted (the count table was
    /// full).
    pub fn timed(&self, records: &[Sent], wall: impl Fn(u64) -> u64) -> (Vec<Timed>, u64) {
        let Some(names) = &self.names_by_key else {
            return (Vec::new(), records.len() as u64);
        };
        let stacks = self.stacks_by_id();
        let timed = self.time_zero.is_some();
        let mut out = Vec::with_capacity(records.len());
        let mut unnamed = 0;
        for r in records {
            let mut key = r.key;
            key.key.generation = 0;
            let Some((n, w)) = names.get(&key) else {
                unnamed += 1;
                continue;
            };
            let waker = w.as_ref().map(|w| {
                Arc::new(Thread {
                    comm: crate::kernel::c_string(&w.comm),
                    pid: w.proc.pid,
                    kernel: Arc::clone(&stacks[w.kernel as usize]),
                    user: Arc::clone(&stacks[w.user as usize]),
                })
            });
            out.push(Timed {
                time: wall(r.time),
                cpu: r.cpu,
                sample: Sample {
                    comm: crate::kernel::c_string(&n.comm),
                    pid: n.proc.pid,
                    started: n.proc.born_wall_ns(),
                    tid: r.tid,
                    user: Arc::clone(&stacks[n.user as usize]),
                    kernel: Arc::clone(&stacks[n.kernel as usize]),
                    count: r.value,
                    waker,
                    off_cpu: n.off_cpu || r.off_cpu,
                    slot: if timed { r.key.key.slot } else { 0 },
                    cut_short: n.cut,
                },
            });
        }
        (out, unnamed)
    }

    /// Each named stack, by id, built once.
    fn stacks_by_id(&self) -> Vec<Arc<[Frame]>> {
        let mut stacks: Vec<Arc<[Frame]>> = vec![Arc::from([]); self.named.len()];
        for (ids, &id) in &self.named {
            stacks[id as usize] = ids
                .iter()
                .map(|&f| self.frames[f as usize].clone())
                .collect();
        }
        stacks
    }

    /// Every sample, symbolized, hottest first. Processes still alive get
    /// their newest mappings and perf map first; ones gone keep what was
    /// captured at their first samples.
    pub fn samples(&mut self, sym: &mut Symbolizer) -> Vec<Sample> {
        let mut live: Vec<Proc> = self.counts.keys().flat_map(tgids).collect();
        live.sort_unstable();
        live.dedup();
        for &p in &live {
            sym.capture(p, true);
        }
        sym.refresh_kernel();
        self.settle(sym, |_| true);
        // Each stack is built once, and shared by its samples.
        let stacks = self.stacks_by_id();
        let thread = |n: &Named| Thread {
            comm: crate::kernel::c_string(&n.comm),
            pid: n.proc.pid,
            kernel: stacks[n.kernel as usize].clone(),
            user: stacks[n.user as usize].clone(),
        };
        let mut out: Vec<Sample> = self
            .settled
            .iter()
            .map(|((t, w, slot), &count)| {
                let Thread {
                    comm,
                    pid,
                    kernel,
                    user,
                } = thread(t);
                Sample {
                    comm,
                    pid,
                    started: t.proc.born_wall_ns(),
                    tid: t.tid,
                    kernel,
                    user,
                    count,
                    waker: w.as_ref().map(|w| Arc::new(thread(w))),
                    off_cpu: t.off_cpu,
                    slot: *slot,
                    cut_short: t.cut,
                }
            })
            .collect();
        out.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.pid.cmp(&b.pid)));
        out
    }
}

/// The CLOCK_MONOTONIC middle of time slot `slot` ([`Key::slot`]), which
/// the kernel truncated to 32 bits, taken as the latest such slot at or
/// before `now`.
fn slot_middle(slot: u32, now: u64) -> u64 {
    let now_slot = now >> SLOT_SHIFT;
    let mut full = (now_slot & !u64::from(u32::MAX)) | u64::from(slot);
    if full > now_slot {
        full = full.wrapping_sub(1 << 32);
    }
    (full << SLOT_SHIFT) + (1 << (SLOT_SHIFT - 1))
}

/// A kernel stack without the frames of the tracing machinery at its leaf.
/// Stacks taken in a tracepoint program (offcputime's, `profile
/// --off-cpu`'s) begin with the program and the tracepoint's calls
/// (`__traceiter_sched_switch`, `bpf_trace_run4`, on some kernels not all
/// of them); the thread's own frames end at the scheduler, a waker's at
/// the wakeup. Trimmed, stacks that differ only there are counted as one.
fn own_frames(mut kernel: Vec<Frame>) -> Vec<Frame> {
    let machinery = |f: &Frame| {
        // With `--addresses` a name starts with its address.
        let name = match f.name.split_once(' ') {
            Some((addr, rest)) if addr.starts_with("0x") => rest,
            _ => &f.name,
        };
        ["bpf_trace_run", "__traceiter_", "__bpf_trace_"]
            .iter()
            .any(|p| name.starts_with(p))
    };
    if let Some(i) = kernel.iter().rposition(machinery) {
        kernel.drain(..=i);
    }
    kernel
}

/// Captures the mappings of those of `pids` the symbolizer has never
/// captured.
fn capture_unknown(pids: &[Proc], sym: &mut Symbolizer) {
    for &p in pids {
        if !sym.knows(p) {
            sym.capture(p, false);
        }
    }
}

/// The process a key names.
pub fn proc_of(k: &Key) -> Proc {
    Proc::new(k.tgid, k.born)
}

/// The processes a count names: the thread's, and its waker's.
fn tgids(k: &WakeKey) -> impl Iterator<Item = Proc> {
    std::iter::once(proc_of(&k.key)).chain(k.has_waker().then(|| proc_of(&k.waker)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A process is named by its first thread where that was counted,
    /// else by the command most of its counts were taken in, whichever
    /// thread came first.
    #[test]
    fn a_process_is_named_by_its_first_thread_or_its_busiest_command() {
        let comm = |s: &str| {
            let mut c = [0u8; 16];
            c[..s.len()].copy_from_slice(s.as_bytes());
            c
        };
        let mut by_count = CutShort::default();
        by_count.name(&comm("Finalizer"), 0, 40, 1);
        assert_eq!(by_count.comm(), "Finalizer");
        by_count.name(&comm("mono"), 0, 40, 1);
        assert_eq!(by_count.comm(), "Finalizer", "a tie keeps the first");
        by_count.name(&comm("mono"), 0, 40, 5);
        by_count.name(&comm("Finalizer"), 0, 40, 2);
        assert_eq!(by_count.comm(), "mono");
        let mut leader = CutShort::default();
        leader.name(&comm("worker"), 41, 40, 100);
        leader.name(&comm("server"), 40, 40, 1);
        leader.name(&comm("worker"), 41, 40, 100);
        assert_eq!(leader.comm(), "server");
    }

    #[test]
    fn the_tracing_machinery_is_trimmed_with_or_without_addresses() {
        for prefix in ["", "0xffffffff81234567 "] {
            let kernel = [
                "bpf_prog_6deef7357e7b4530_btf_sched_waking",
                "bpf_trace_run1",
                "__traceiter_sched_waking",
                "try_to_wake_up",
                "pipe_write",
            ]
            .map(|n| Frame::new(format!("{prefix}{n}"), Kind::Kernel, None))
            .to_vec();
            let names: Vec<String> = own_frames(kernel)
                .iter()
                .map(|f| f.name.to_string())
                .collect();
            assert_eq!(
                names,
                [
                    format!("{prefix}try_to_wake_up"),
                    format!("{prefix}pipe_write")
                ]
            );
        }
    }

    #[test]
    fn a_slot_is_placed_at_or_before_now_across_the_truncation() {
        let ns = |slot: u64| (slot << SLOT_SHIFT) + (1 << (SLOT_SHIFT - 1));
        let now = (5u64 << 32 | 7) << SLOT_SHIFT;
        assert_eq!(slot_middle(7, now), ns(5 << 32 | 7));
        assert_eq!(slot_middle(3, now), ns(5 << 32 | 3));
        // A slot above now's low bits was counted before they wrapped.
        assert_eq!(
            slot_middle(u32::MAX, now),
            ns((4 << 32) | u64::from(u32::MAX))
        );
        assert_eq!(slot_middle(9, 9 << SLOT_SHIFT), ns(9));
    }

    /// An entry as the kernel stores it: `frames`, then `link` if any.
    fn entry(frames: std::ops::Range<u64>, link: Option<u64>) -> Stack {
        use rtrace_common::stacks::{CONTINUED, MAX_DEPTH, SEGMENT_FRAMES};
        let mut s = Stack {
            ips: [0; MAX_DEPTH],
            len: frames.end - frames.start,
        };
        for (slot, ip) in s.ips.iter_mut().zip(frames) {
            *slot = ip;
        }
        if let Some(l) = link {
            assert_eq!(s.len, SEGMENT_FRAMES as u64);
            s.ips[SEGMENT_FRAMES] = l;
            s.len = MAX_DEPTH as u64 | CONTINUED;
        }
        s
    }

    #[test]
    fn a_deep_stack_is_joined_from_its_entries_read_now_or_before() {
        // 300 frames in three entries: 0..126 -> 126..252 -> 252..300.
        let read: HashMap<u64, Stack> = [
            (11, entry(0..126, Some(22))),
            (22, entry(126..252, Some(33))),
            (33, entry(252..300, None)),
        ]
        .into();
        let mut store = StackStore::default();
        let whole = store.join(&read[&11], &read);
        assert_eq!(&*whole, &(0..300).collect::<Vec<u64>>()[..]);
        assert_eq!(store.cut(), 0);

        // The root-ward entries were moved out at an earlier tick, joined.
        store.stacks.insert(
            22,
            Held {
                ips: (126..300).collect(),
                tick: 0,
            },
        );
        let only_leaf: HashMap<u64, Stack> = [(11, read[&11])].into();
        let whole = store.join(&only_leaf[&11], &only_leaf);
        assert_eq!(whole.len(), 300);
        assert_eq!(whole[299], 299);

        // Lost: the leaf-most part is kept, and counted.
        let mut store = StackStore::default();
        let cut = store.join(&only_leaf[&11], &only_leaf);
        assert_eq!(&*cut, &(0..126).collect::<Vec<u64>>()[..]);
        assert_eq!(store.cut(), 1);
    }
}

//! Stacks counted in the kernel (`STACK_COUNTS` by [`Key`], `STACKS` by hash),
//! moved to user space while a tool runs, and symbolized as their
//! processes go.
//!
//! Two things keep a long run bounded:
//! - the kernel's tables hold only what is new: every tick flips the
//!   generation samples are counted in and moves the older one out, with
//!   every stack stored so far, so they never fill however many processes
//!   come and go;
//! - a process that has exited is symbolized at the next tick, and its
//!   counts kept by interned names, not addresses: what stays grows with
//!   the distinct stacks by name, which programs repeat, and not with the
//!   processes, whose addresses differ with every start (ASLR). Its
//!   captured maps are dropped then too.

use std::{
    collections::{HashMap, HashSet},
    os::fd::AsFd as _,
    sync::Arc,
    time::Duration,
};

use anyhow::Context as _;
use aya::{
    Ebpf,
    maps::{HashMap as BpfHashMap, IterableMap as _},
};
use rtrace_common::profile::{Key, MISSED_KERNEL, MISSED_USER, Stack};

use crate::{
    batch,
    output::{
        self,
        stacks::{self, Sample},
    },
    procmaps,
    symbolize::{Frame, Kind, Symbolizer},
};

/// A stack moved out of the kernel.
struct Held {
    ips: Box<[u64]>,
    /// The tick it was last moved out at.
    tick: u64,
}

/// Every entry of a map, in batches where the kernel has them, and whether
/// it did.
fn read_all<K: aya::Pod, V: aya::Pod>(
    map: &BpfHashMap<&mut aya::maps::MapData, K, V>,
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

/// What a settled sample is counted by: names, not addresses.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct Named {
    comm: [u8; 16],
    pid: u32,
    /// Id of the kernel stack in [`StackStore::named`].
    kernel: u32,
    /// Id of the user stack in [`StackStore::named`].
    user: u32,
}

/// See the module documentation.
#[derive(Default)]
pub struct StackStore {
    /// Samples by key (its generation zeroed) of processes not settled yet.
    counts: HashMap<Key, u64>,
    /// Frames by stack hash.
    stacks: HashMap<u64, Held>,
    /// The generation the kernel counts in now.
    generation: u32,
    /// Ticks so far.
    tick: u64,
    /// Processes found gone at the last tick; their last samples were
    /// counted in the generation moved out at the next.
    gone: HashSet<u32>,
    /// Settled samples by name.
    settled: HashMap<Named, u64>,
    /// Distinct symbolized stacks, as frame ids, and their ids.
    named: HashMap<Box<[u32]>, u32>,
    /// Distinct frames, by id.
    frames: Vec<Frame>,
    frame_ids: HashMap<Frame, u32>,
}

impl StackStore {
    /// Moves counts and stacks out of the kernel: with `all`, everything
    /// (counting has stopped); otherwise the generation is flipped first
    /// and the older one's counts moved, which the kernel no longer
    /// writes. A stack is copied before it is deleted, and one the kernel
    /// meets again is simply stored again.
    pub fn drain(&mut self, ebpf: &mut Ebpf, all: bool) -> anyhow::Result<()> {
        self.tick += 1;
        let old = self.generation;
        if !all {
            // Counted up, not flipped: the kernel also marks which
            // processes it told of in which generation.
            self.generation = self.generation.wrapping_add(1);
            let mut generation: aya::maps::Array<_, u32> = aya::maps::Array::try_from(
                ebpf.map_mut("STACK_GEN").context("map STACK_GEN missing")?,
            )?;
            generation.set(0, self.generation, 0)?;
            // A sample that read the old generation on another CPU is done
            // within microseconds.
            std::thread::sleep(Duration::from_millis(1));
        }
        let mut counts: BpfHashMap<_, Key, u64> = BpfHashMap::try_from(
            ebpf.map_mut("STACK_COUNTS")
                .context("map STACK_COUNTS missing")?,
        )?;
        let (entries, batched) = read_all(&counts);
        let moved: Vec<Key> = entries
            .iter()
            .filter(|(k, _)| all || k.generation == old)
            .map(|(k, _)| *k)
            .collect();
        for (key, n) in entries {
            if all || key.generation == old {
                let mut k = key;
                k.generation = 0;
                *self.counts.entry(k).or_default() += n;
            }
        }
        remove(&mut counts, &moved, batched).context("cannot clear map STACK_COUNTS")?;

        let mut stacks: BpfHashMap<_, u64, Stack> =
            BpfHashMap::try_from(ebpf.map_mut("STACKS").context("map STACKS missing")?)?;
        let (entries, batched) = read_all(&stacks);
        let tick = self.tick;
        let hashes: Vec<u64> = entries.iter().map(|(h, _)| *h).collect();
        for (hash, s) in entries {
            let len = (s.len as usize).min(s.ips.len());
            self.stacks
                .entry(hash)
                .and_modify(|h| h.tick = tick)
                .or_insert_with(|| Held {
                    ips: s.ips[..len].into(),
                    tick,
                });
        }
        remove(&mut stacks, &hashes, batched).context("cannot clear map STACKS")?;
        Ok(())
    }

    /// Symbolizes and settles the processes found gone at the last call,
    /// notes those gone now, and drops stacks nothing needs any more.
    pub fn settle_gone(&mut self, sym: &mut Symbolizer) {
        let mut live: Vec<u32> = self.counts.keys().map(|k| k.tgid).collect();
        live.sort_unstable();
        live.dedup();
        let due = std::mem::take(&mut self.gone);
        // The idle tasks (pid 0) never go; kernel threads' ids are real
        // processes, in /proc while they live.
        self.gone = live
            .into_iter()
            .filter(|&p| p != 0 && !due.contains(&p))
            .filter(|&p| !procmaps::alive(p))
            .collect();
        if due.is_empty() {
            return;
        }
        self.settle(sym, |tgid| due.contains(&tgid));
        for pid in due {
            sym.forget(pid);
        }
        // A stack moved out at this tick or the last may still be named by
        // counts the kernel holds; older ones not named by any count here
        // are gone from the kernel's table and would be stored again.
        let named: HashSet<u64> = self
            .counts
            .keys()
            .flat_map(|k| [k.kernel, k.user])
            .collect();
        let tick = self.tick;
        self.stacks
            .retain(|hash, held| held.tick + 1 >= tick || named.contains(hash));
    }

    /// Symbolizes the counts of the processes `which` admits and moves
    /// them to the settled counts.
    fn settle(&mut self, sym: &mut Symbolizer, which: impl Fn(u32) -> bool) {
        let entries: Vec<(Key, u64)> = self
            .counts
            .iter()
            .filter(|(k, _)| which(k.tgid))
            .map(|(k, n)| (*k, *n))
            .collect();
        if entries.is_empty() {
            return;
        }
        for (k, _) in &entries {
            self.counts.remove(k);
        }
        let stacks = &self.stacks;
        let empty: Box<[u64]> = Box::default();
        let ips = |hash: u64| stacks.get(&hash).map_or(&empty, |h| &h.ips).as_ref();
        let mut requests: Vec<(Option<u32>, &[u64])> = Vec::with_capacity(entries.len() * 2);
        for (key, _) in &entries {
            requests.push((None, ips(key.kernel)));
            requests.push((Some(key.tgid), ips(key.user)));
        }
        let mut frames = sym.symbolize(&requests).into_iter();
        let lost = |key: &Key, flag: u32, hash: u64| {
            key.flags & flag != 0 || (hash != 0 && !stacks.contains_key(&hash))
        };
        let mut named = Vec::with_capacity(entries.len());
        for (key, count) in &entries {
            let mut kernel = frames.next().unwrap_or_default();
            let mut user = frames.next().unwrap_or_default();
            if lost(key, MISSED_KERNEL, key.kernel) {
                kernel = vec![Frame::missed(stacks::MISSED_KERNEL, Kind::Kernel)];
            }
            if lost(key, MISSED_USER, key.user) {
                user = vec![Frame::missed(stacks::MISSED_USER, Kind::User)];
            }
            named.push((key.comm, key.tgid, kernel, user, *count));
        }
        for (comm, pid, kernel, user, count) in named {
            let key = Named {
                comm,
                pid,
                kernel: self.intern(kernel),
                user: self.intern(user),
            };
            *self.settled.entry(key).or_default() += count;
        }
    }

    /// The id of a stack, each frame interned: a stack costs four bytes a
    /// frame, and each name is held once.
    fn intern(&mut self, stack: Vec<Frame>) -> u32 {
        let ids: Box<[u32]> = stack
            .into_iter()
            .map(|f| match self.frame_ids.get(&f) {
                Some(&id) => id,
                None => {
                    let id = self.frames.len() as u32;
                    self.frames.push(f.clone());
                    self.frame_ids.insert(f, id);
                    id
                }
            })
            .collect();
        let next = self.named.len() as u32;
        *self.named.entry(ids).or_insert(next)
    }

    /// Every sample, symbolized, hottest first. Processes still alive get
    /// their newest mappings and perf map first; ones gone keep what was
    /// captured at their first samples.
    pub fn samples(&mut self, sym: &mut Symbolizer) -> Vec<Sample> {
        let mut tgids: Vec<u32> = self.counts.keys().map(|k| k.tgid).collect();
        tgids.sort_unstable();
        tgids.dedup();
        for &t in &tgids {
            sym.capture(t, true);
        }
        sym.refresh_kernel();
        self.settle(sym, |_| true);
        // Each stack is built once, and shared by its samples.
        let mut stacks: Vec<Arc<[Frame]>> = vec![Arc::from([]); self.named.len()];
        for (ids, &id) in &self.named {
            stacks[id as usize] = ids
                .iter()
                .map(|&f| self.frames[f as usize].clone())
                .collect();
        }
        let mut out: Vec<Sample> = self
            .settled
            .iter()
            .map(|(k, &count)| Sample {
                comm: output::c_string(&k.comm),
                pid: k.pid,
                kernel: stacks[k.kernel as usize].clone(),
                user: stacks[k.user as usize].clone(),
                count,
            })
            .collect();
        out.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.pid.cmp(&b.pid)));
        out
    }
}

//! The stack tables both stack tools count in (profile by samples,
//! offcputime and `profile --off-cpu` by nanoseconds off the CPU): the
//! keys counts are kept by, the stacks, the record of a process new to the
//! tables, and the `ERRORS` slots of the store and the CFI walk. Below
//! [`crate::profile`] and [`crate::offcputime`], which both take from here
//! and re-export what was theirs under its old paths.

use crate::TASK_COMM_LEN;

/// Frames one `STACKS` entry holds, and the frames a stack keeps unless
/// `--max-stack` asks for more (the kernel's default
/// `perf_event_max_stack`).
pub const MAX_DEPTH: usize = 127;

/// Most `STACKS` entries one stack is stored in. A stack deeper than
/// [`MAX_DEPTH`] is stored root end first, in entries whose last slot
/// holds the hash of the entry with the frames further from the leaf
/// ([`CONTINUED`]): the leaf-most entry's hash names the whole stack, and
/// stacks that share their root-ward part share its entries.
pub const MAX_SEGMENTS: usize = 8;

/// Frames in an entry that goes on in another: its last slot is the link.
pub const SEGMENT_FRAMES: usize = MAX_DEPTH - 1;

/// Most frames `--max-stack` may keep of one stack.
pub const MAX_STACK: usize = 1000;
const _: () = assert!(MAX_STACK <= SEGMENT_FRAMES * (MAX_SEGMENTS - 1) + MAX_DEPTH);

/// [`Stack::len`] bit: the entry holds [`SEGMENT_FRAMES`] frames and, in
/// `ips[SEGMENT_FRAMES]`, the hash of the entry that goes on from them.
pub const CONTINUED: u64 = 1 << 63;

/// `Key::flags`: the user stack could not be read or stored.
pub const MISSED_USER: u16 = 1;
/// `Key::flags`: the kernel stack could not be read or stored.
pub const MISSED_KERNEL: u16 = 2;
/// `Key::flags`: time off the CPU, in nanoseconds (`profile --off-cpu`),
/// not samples.
pub const OFF_CPU: u16 = 4;
/// `Key::flags`: the user stack was cut short, a stack word being
/// unreadable: the sample keeps the frames walked before it.
pub const CUT_USER: u16 = 8;

/// How coarse [`Key::slot`] is: 2^26 ns, 67 ms, within which code that a
/// JIT put at one address in place of other code gets one name.
pub const SLOT_SHIFT: u32 = 26;

/// Processes `TIMED_JIT` holds: those whose stacks are counted by time
/// slot, as their jitdumps name code by time.
pub const MAX_TIMED: u32 = 1024;

/// What samples are counted by: a process, its command and its two stacks.
///
/// A stack is named by a 64-bit hash of its frames, computed in the
/// program; unlike `bpf_get_stackid`'s bucket index it cannot make two
/// stacks collide in practice, and a stack table that is full is counted
/// rather than silently merging samples.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Key {
    /// Process (thread group) id.
    pub tgid: u32,
    /// `MISSED_*` bits.
    pub flags: u16,
    /// The generation counted in (`GEN`, truncated): user space counts
    /// it up every second and moves the older generation's counts out.
    pub generation: u16,
    /// For a process in `TIMED_JIT`, when its stacks were taken:
    /// CLOCK_MONOTONIC >> [`SLOT_SHIFT`], truncated; else 0. Its JIT
    /// frames are named by the code that was at their addresses then,
    /// from its jitdump.
    pub slot: u32,
    /// The sampled thread's id where samples are counted by thread
    /// (`--sort tid`, pprof); else 0, so a process's threads share keys.
    pub tid: u32,
    /// Hash of the user stack in `STACKS`, or 0 for none.
    pub user: u64,
    /// Hash of the kernel stack in `STACKS`, or 0 for none.
    pub kernel: u64,
    /// Command of the sampled thread.
    pub comm: [u8; TASK_COMM_LEN],
    /// When the process started (`task->start_boottime`, nanoseconds
    /// since boot; 0 where unknown): with the id, who the process is, as
    /// a pid is reused once its process has exited.
    pub born: u64,
}

impl Key {
    /// The key of process `tgid` running `comm`, with no stacks yet, in
    /// generation 0.
    pub const fn new(tgid: u32, comm: [u8; TASK_COMM_LEN]) -> Self {
        Self {
            tgid,
            flags: 0,
            generation: 0,
            slot: 0,
            tid: 0,
            user: 0,
            kernel: 0,
            comm,
            born: 0,
        }
    }

    /// Names the kernel stack by the hash it was stored under, or marks
    /// it missed (`None`: it could not be walked or stored).
    pub fn set_kernel(&mut self, stored: Option<u64>) {
        match stored {
            Some(h) => self.kernel = h,
            None => self.flags |= MISSED_KERNEL,
        }
    }

    /// The same for the user stack.
    pub fn set_user(&mut self, stored: Option<u64>) {
        match stored {
            Some(h) => self.user = h,
            None => self.flags |= MISSED_USER,
        }
    }
}

/// What offcputime counts blocked time by: the blocked thread's [`Key`],
/// and with `--waker` the thread that woke it, described the same way (its
/// `generation` unused); all zeros where none was recorded.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WakeKey {
    /// The blocked thread.
    pub key: Key,
    /// The thread that woke it.
    pub waker: Key,
}

impl WakeKey {
    /// Whether a waker was recorded: every thread has a command.
    pub const fn has_waker(&self) -> bool {
        self.waker.comm[0] != 0
    }
}

/// A stack's frames, leaf first: all of them, or the leaf-most part of a
/// deeper one that goes on in another entry ([`CONTINUED`]).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Stack {
    /// Instruction pointers: the sampled one, then return addresses.
    pub ips: [u64; MAX_DEPTH],
    /// Slots used in `ips`, with [`CONTINUED`] if the last is a link.
    pub len: u64,
}

impl Stack {
    /// The frames this entry holds, and the hash of the entry that goes
    /// on from them, if any.
    pub fn frames(&self) -> (&[u64], Option<u64>) {
        let n = ((self.len & !CONTINUED) as usize).min(MAX_DEPTH);
        if self.len & CONTINUED != 0 {
            (&self.ips[..SEGMENT_FRAMES], Some(self.ips[SEGMENT_FRAMES]))
        } else {
            (&self.ips[..n], None)
        }
    }
}

/// Where a stack is walked, before it is stored in entries of
/// [`MAX_DEPTH`] frames.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Frames {
    /// Instruction pointers, leaf first.
    pub ips: [u64; MAX_STACK],
}

/// What the program tells user space as soon as a process gets its first
/// sample for a new stack, so that its memory map and JIT symbols are
/// captured while it still lives.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Seen {
    /// Process (thread group) id.
    pub tgid: u32,
    /// `SEEN_*` bits.
    pub flags: u32,
    /// With [`SEEN_FORK`], the process it was forked from.
    pub parent: u32,
    /// Keeps the struct free of padding.
    pub _pad: u32,
    /// When the process started ([`Key::born`]).
    pub born: u64,
    /// With [`SEEN_FORK`], when the parent started; with [`SEEN_EXIT`],
    /// when the process exited (the boot-time clock, nanoseconds).
    pub parent_born: u64,
}

impl Seen {
    /// A record of `tgid`, started at `born`, with `flags` and no parent.
    pub const fn new(tgid: u32, born: u64, flags: u32) -> Self {
        Self {
            tgid,
            flags,
            parent: 0,
            _pad: 0,
            born,
            parent_born: 0,
        }
    }
}

/// The first two fields of every record a stack tool's programs send
/// ([`Seen`], [`Found`], [`crate::python::PyCode`]): which record it is
/// is in its flags.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SeenHeader {
    /// Process (thread group) id.
    pub tgid: u32,
    /// `SEEN_*` bits.
    pub flags: u32,
}

/// `Seen::flags`: the CFI walk met code in no region user space gave the
/// process: it mapped something new (`dlopen`), so its regions are stale.
pub const SEEN_NEW_CODE: u32 = 1;
/// `Seen::flags`: the process has just run a new program: its CFI regions
/// are to be read, while its symbols wait for its first sample, when its
/// libraries are mapped.
pub const SEEN_EXEC: u32 = 2;
/// `Seen::flags`: the kernel gave a new process a copy of its parent's CFI
/// regions; user space only has to forget them when it exits.
pub const SEEN_FORK: u32 = 4;
/// `Seen::flags`: the process is exiting: user space reads what it wrote
/// at exit (its perf map) while its pid is still its own.
pub const SEEN_EXIT: u32 = 8;
/// `Seen::flags`, of a [`Found`] record: the kernel found a mapping of
/// the process itself (for the CFI walk); user space names the frames in
/// it from this record, as the process may be gone before its maps are
/// read.
pub const SEEN_FOUND: u32 = 16;
/// `Seen::flags`: a [`crate::python::PyCode`] record, a code object the
/// walk met, for user space to name while its process lives.
pub const SEEN_PY_CODE: u32 = 32;
/// With [`SEEN_PY_CODE`]: the record names an asyncio task (its name's
/// string object), not a code object.
pub const SEEN_PY_TASK: u32 = 64;
/// `Seen::flags`: a [`crate::java::JavaSeen`] record, a Java frame the
/// walk wrote, for user space to name while its process lives.
pub const SEEN_JAVA: u32 = 128;
/// `Seen::flags`: a [`crate::v8::V8Seen`] record, a JavaScript frame the
/// walk wrote, for user space to name while its process lives.
pub const SEEN_V8: u32 = 256;
/// `Seen::flags`: an [`UntoldStack`] record, a stack with more Python,
/// Java or JavaScript frames new to its CPU than one walk tells of.
pub const SEEN_UNTOLD: u32 = 512;

/// A stack just stored whose walk met more runtime frames new to its CPU
/// than it could tell of (`PY_NEW`, `JAVA_NEW`, `V8_NEW`): user space reads it from
/// the stack table and names all of them while the process lives and its
/// code is where the walk found it. Without it, the rest were named only
/// when a later walk met them again, or at the end: a stack seen once (a
/// program's start, a burst of new code) kept frames of code freed or of a
/// process gone by then.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct UntoldStack {
    /// Process (thread group) id.
    pub tgid: u32,
    /// Always [`SEEN_UNTOLD`].
    pub flags: u32,
    /// When the process started ([`Key::born`]).
    pub born: u64,
    /// The stack's key in the stack table.
    pub stack: u64,
}

/// A mapping of a loaded file that the kernel found for a process itself
/// (`bpf_find_vma`), told to user space once, as it is kept: the record
/// starts as a [`Seen`] does, with [`SEEN_FOUND`] in its flags.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Found {
    /// Process (thread group) id.
    pub tgid: u32,
    /// [`SEEN_FOUND`]; 0 where nothing was found.
    pub flags: u32,
    /// The file's `super_block.s_dev`, the kernel's encoding
    /// (`major << 20 | minor`).
    pub dev: u32,
    /// Keeps the struct free of padding.
    pub _pad: u32,
    /// The file's `inode.i_ino`.
    pub ino: u64,
    /// The mapping's first address.
    pub start: u64,
    /// One past its last.
    pub end: u64,
    /// The file offset of `start`, in pages.
    pub pgoff: u64,
    /// When the process started ([`Key::born`]).
    pub born: u64,
}

/// The global of the `task_struct` offsets [`Key::born`] is read
/// through ([`BornOffsets`]), from the kernel's BTF.
pub const BORN_OFFSETS: &str = "BORN_OFFSETS";

/// Where a process's start time is: `task_struct.group_leader` (a
/// thread's own start time is when the thread started) and
/// `task_struct.start_boottime` (5.5+), the clock of `/proc/PID/stat`'s
/// field 22. All zeros: not set, and every `born` is 0.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct BornOffsets {
    /// `task_struct.group_leader`.
    pub group_leader: u32,
    /// `task_struct.start_boottime`.
    pub start_boottime: u32,
}

/// `STACK_NEW` slot: entries created in `STACKS`.
pub const NEW_STACKS: u32 = 0;
/// `STACK_NEW` slot: entries created in `STACK_COUNTS`.
pub const NEW_COUNTS: u32 = 1;

/// `ERRORS` slot: samples not counted, as the count table was full. Slot
/// 0 is [`crate::events::LOST_EVENT`], new-process events not sent.
pub const ERR_COUNTS_FULL: u32 = 1;
/// `ERRORS` slot: stacks not stored, as the stack table was full.
pub const ERR_STACKS_FULL: u32 = 2;
/// `ERRORS` slot: user stacks the kernel could not walk.
pub const ERR_USER_STACK: u32 = 3;
/// `ERRORS` slot: kernel stacks the kernel could not walk.
pub const ERR_KERNEL_STACK: u32 = 4;
/// `ERRORS` slot: user stacks of processes without CFI tables from user
/// space yet, walked from the regions the kernel finds itself, else by
/// frame pointer.
pub const ERR_NO_TABLES: u32 = 5;
/// `ERRORS` slot: frames of CFI walks that took the frame pointer.
pub const ERR_FP_FRAMES: u32 = 6;
/// The `ERRORS` slots that count expected fallbacks, not missing output: a
/// new process's first stacks, walked by frame pointer before its tables
/// are loaded, and frame-pointer steps where no CFI covers the code (JIT
/// code, the vDSO, hand-written assembly). Stacks cut short are kept with
/// the frames read: the stack tools warn of them by process, where they
/// are common (`CUT_USER`), and `-v` counts them all.
pub const ERR_EXPECTED: [u32; 11] = [
    ERR_TAIL_RECALLED,
    ERR_JAVA_CHECK_KEPT,
    ERR_JAVA_BUILDING,
    ERR_CUT_SHORT,
    ERR_NO_TABLES,
    ERR_EXITING,
    ERR_EXECING,
    ERR_FP_FRAMES,
    ERR_FOUND,
    ERR_FIND_BUSY,
    ERR_FIND_NO_FILE,
];
/// `ERRORS` slot: CFI walks that ended on a failed read.
pub const ERR_CUT_SHORT: u32 = 7;
/// `ERRORS` slot: blocked threads not timed, as the table of threads off
/// the CPU was full (offcputime, and `profile --off-cpu`).
pub const ERR_STARTS_FULL: u32 = 8;

/// `ERRORS` slot: regions the CFI walk found itself (`bpf_find_vma`) for
/// code in no region user space gave it, of files whose rows it holds.
pub const ERR_FOUND: u32 = 9;
/// `ERRORS` slot: walks that could not look for a region themselves, as
/// the helper was busy (it is, on a CPU, from one sample with interrupts
/// off until its deferred unlock has run).
pub const ERR_FIND_BUSY: u32 = 10;
/// `ERRORS` slot: regions the CFI walk found itself of files whose rows it
/// does not hold (not loaded yet, or with several executable segments).
pub const ERR_FIND_NO_FILE: u32 = 11;
/// `ERRORS` slot: user stacks deeper than `--max-stack` frames, kept to
/// their leaf-most ones (the CFI walk's; a frame-pointer walk by the
/// kernel does not tell).
pub const ERR_DEEP: u32 = 12;
/// `ERRORS` slot: samples of exiting processes whose memory the kernel
/// had already taken away (`task->mm` is gone in `do_exit`): there is no
/// user stack left to walk, only the registers it stopped with, so none
/// is taken (the CFI walk's).
pub const ERR_EXITING: u32 = 13;
/// `ERRORS` slot: samples of processes in `execve` after their old memory
/// map was let go and before the new program's first registers: their
/// registers name the old program, whose stack is gone, so no user stack
/// is taken (the CFI walk's).
pub const ERR_EXECING: u32 = 14;
/// `ERRORS` slot: walks of Python threads whose thread state could not be
/// read (their stacks keep native frames only).
pub const ERR_PY_TSTATE: u32 = 15;
/// `ERRORS` slot: Python frames that failed their check (a code object
/// of the wrong type, an unreadable frame: a frame half set up, or a
/// process exiting): the walk went on with native frames.
pub const ERR_PY_BAD: u32 = 16;
/// `ERRORS` slot: Java frames the walk could not read or step past (a pc
/// in no code blob, an interpreted frame whose frame pointer is not one):
/// the stack ends there.
pub const ERR_JAVA_BAD: u32 = 17;
/// `ERRORS` slot: samples of a Python or Java process walked before the
/// walk through its runtime's frames was loaded (`profile` loads it once
/// such a process is first given to the kernel's tables): native frames
/// only.
pub const ERR_RUNTIME_UNLOADED: u32 = 18;
/// `ERRORS` slot: frames in V8's code that looked like JavaScript ones
/// (a tagged context below their frame pointer) but whose function or
/// `SharedFunctionInfo` could not be read or failed its type check (a
/// frame half set up, or moved by the collector): walked as native
/// frames, by their frame pointer.
pub const ERR_V8_BAD: u32 = 19;
/// `ERRORS` slot: no error, a count `-v` gives: walks that took the
/// native frames under their last runtime frame from what the thread
/// kept of its last walk, which read the same words there, instead of
/// walking them again (the CFI walk's).
pub const ERR_TAIL_RECALLED: u32 = 20;
/// `ERRORS` slot: no error, a count `-v` gives: interpreted Java frames
/// whose check the walk took from what its CPU kept of an earlier frame
/// of the same method, the JVM having collected nothing since, instead of
/// reading the method's class and its name again.
pub const ERR_JAVA_CHECK_KEPT: u32 = 21;
/// `ERRORS` slot: no error, a count `-v` gives: interpreted Java frames
/// sampled as the interpreter built them (`enter` run, their `Method*`
/// not yet pushed, so that its slot still held an earlier frame's): the
/// caller is the sampled frame.
pub const ERR_JAVA_BUILDING: u32 = 22;

/// What each `ERRORS` slot counts, for the report at exit.
pub const ERR_NAMES: [&str; 23] = [
    crate::events::LOST_NAMES[0],
    "samples lost (count table full; raise --hash-storage-size)",
    "stacks lost (stack table full; raise --stack-storage-size)",
    "user stacks that could not be walked",
    "kernel stacks that could not be walked",
    "user stacks of processes without CFI tables from user space yet",
    "user frames walked by frame pointer, where no CFI covers the code (JIT, assembly)",
    "user stacks cut short (a stack word could not be read)",
    "blocked threads not timed (table of threads off the CPU full)",
    "regions the kernel found itself for code user space had not listed",
    "regions not looked for, the kernel's lookup being busy",
    "regions the kernel found of files without loaded CFI",
    "user stacks deeper than --max-stack frames (127 unless raised), kept to their leaf-most ones",
    "stacks of exiting processes whose memory was already freed, without their user part",
    "stacks of processes in execve between two programs, without their user part",
    "walks of Python threads whose thread state could not be read (native frames only)",
    "Python frames that failed their check (half set up, or exiting): native frames from there",
    "Java frames that could not be read or stepped past: the stack ends there",
    "samples of Python, Java or Node processes taken while their runtime's walk was being loaded (native frames only)",
    "JavaScript frames whose function could not be read (native frames from there)",
    "walks that took the native frames under their runtime's from the thread's last walk, the stack there unchanged",
    "interpreted Java frames checked by what the CPU kept of the method, the JVM having collected nothing since",
    "interpreted Java frames sampled as the interpreter built them, their caller taken as the sampled frame",
];

/// The `ERRORS` names of an event tool that walks user stacks with the
/// shared walk (strace's `-k`, trace's `-U`): its two first slots
/// (`first`, the events lost and its own), the walk's in the slots it
/// counts into, then the tool's others (`after`).
pub const fn names_with_walk<const N: usize>(
    first: [&'static str; 2],
    after: &[&'static str],
) -> [&'static str; N] {
    let mut out = [""; N];
    out[0] = first[0];
    out[1] = first[1];
    let mut i = 2;
    while i < ERR_NAMES.len() {
        out[i] = ERR_NAMES[i];
        i += 1;
    }
    let mut j = 0;
    while j < after.len() {
        out[i + j] = after[j];
        j += 1;
    }
    out
}

crate::pod!(
    Key,
    WakeKey,
    Stack,
    Seen,
    SeenHeader,
    Found,
    BornOffsets,
    UntoldStack
);

/// The stacks by hash ([`Stack`]); user space sizes it
/// (`--stack-storage-size`) and moves them out as the tool runs.
pub const STACKS: &str = "STACKS";
/// The counts by key ([`Key`] or [`WakeKey`]: samples, or nanoseconds
/// off the CPU) of the stack tools' objects (`stack_counts!`); user space
/// sizes it (`--hash-storage-size`).
pub const STACK_COUNTS: &str = "STACK_COUNTS";
/// The one-slot array of the generation counts go to, counted up by user
/// space when it moves the last one's counts out.
pub const STACK_GEN: &str = "STACK_GEN";
/// The per-CPU counts of entries created in [`STACKS`] and
/// [`STACK_COUNTS`] (slots [`NEW_STACKS`], [`NEW_COUNTS`]).
pub const STACK_NEW: &str = "STACK_NEW";
/// The processes whose stacks are counted by time slot ([`Key::slot`]),
/// whose jitdumps name code by time; user space fills it.
pub const TIMED_JIT: &str = "TIMED_JIT";
/// The one-slot array of when counting began (`CLOCK_MONOTONIC`
/// nanoseconds), written by user space just before attaching.
pub const WINDOW: &str = "WINDOW";

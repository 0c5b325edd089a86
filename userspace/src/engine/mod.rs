//! The stack engine: what every tool that counts or reports stacks
//! shares, below the tools and above the stacks, probes and output it
//! drives. `stacktool` loads the user-stack walk with its CFI tables and
//! process events, drains the stack store and names the frames;
//! `offcpu` counts time off the CPU by stack; `sampling` takes stacks
//! at a perf event's period or at every event of tracepoints and probes
//! (profile, stackcount, top). A stack tool says what to
//! attach and how to print, and leaves the rest here.

pub mod offcpu;
pub mod sampling;
pub mod stacktool;

//! Naming the places to attach: uprobe targets, USDT notes, the event
//! specs of perf and bcc (counters, tracepoints, probes), and the one
//! probe-spec grammar (`p:`, `r:`, `t:`, `u:` with their arguments and
//! expressions) that tools share. Imported by the tracer and tools;
//! imports only the kernel layer.

pub mod attach;
pub mod event;
pub mod spec;
pub mod uprobes;
pub mod usdt;

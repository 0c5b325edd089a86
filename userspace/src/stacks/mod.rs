//! From kernel addresses to named frames: CFI tables and their disk
//! cache, the stack store that drains the kernel's stack tables, and
//! symbolization. Imported by the tracer, output and tools; imports only
//! the kernel layer.

pub mod cfi;
pub mod cficache;
pub mod demangle;
pub mod java;
pub mod jitdump;
pub mod perfdata;
pub mod perfscript;
pub mod python;
pub mod runtimes;
pub mod sample;
pub mod stackstore;
pub mod symbolize;
pub mod unwind;
pub mod v8;

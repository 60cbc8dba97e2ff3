//! A CPU emulator of the device primitives, so that the kernels' own code
//! runs on the host under `cargo test`.
//!
//! [`launch`] runs a grid as a GPU would: the threads of a block run
//! concurrently (each a coroutine, interleaved by a per-block scheduler;
//! blocks in parallel on the host's cores), with `bar.sync` as a real
//! barrier and each warp's collective instructions exchanging the lanes'
//! registers as the PTX ISA's fragment layouts define. On top of a GPU's
//! behaviour it checks what a GPU leaves undefined or silent, and returns
//! the first violation as an [`Error`] naming block, thread, instruction,
//! source location and address (see [`FaultKind`]).
//!
//! - `instructions`: the `arch` interface itself;
//! - `launch`: grids, blocks, the scheduler, and turning faults into errors;
//! - `context`: which GPU thread is running (a thread-local), its coroutine;
//! - `rendezvous`: `bar.sync`, and the warps' meeting points;
//! - `smem`: shared memory, each thread's `cp.async` groups and what is in
//!   flight, and the race checks;
//! - `global`: the allocations global accesses are checked against;
//! - `collective`: what `ldmatrix`, `mma` and `shfl` compute from a warp's registers;
//! - `float`: the scalar float instructions and `mma`'s dot product, with
//!   the bounds where the GPU's result is not defined bit for bit;
//! - `tma`: the box a TMA tensor load copies, and where it lands;
//! - `wgmma`: where wgmma's shared-memory operands lie (matrix descriptors,
//!   swizzles), and each thread's wgmma groups.

mod collective;
mod context;
mod error;
mod float;
mod global;
pub(super) mod instructions;
mod launch;
mod rendezvous;
mod smem;
mod tma;
mod wgmma;

pub use error::{Error, FaultKind};
pub use global::GlobalRegion;
pub use launch::{launch, LaunchConfig};

//! Every PTX instruction the kernels use, and nothing else.
//!
//! The kernel code calls these functions and never writes PTX itself. There
//! are two implementations of this one interface, chosen here and nowhere
//! else: inline PTX when compiling for the GPU (`ptx.rs`), and an emulation
//! of each instruction's PTX ISA semantics on the host ([`emu`]), so that the
//! same kernel source runs under `cargo test`.
//!
//! Shared-memory addresses are 32-bit offsets in the `.shared` window (what
//! `cp.async`, `ldmatrix` and `ld/st.shared` take); global addresses are
//! 64-bit generic pointers.

#[cfg(target_arch = "nvptx64")]
mod ptx;
#[cfg(target_arch = "nvptx64")]
pub use ptx::*;

#[cfg(not(target_arch = "nvptx64"))]
pub mod emu;
#[cfg(not(target_arch = "nvptx64"))]
pub use emu::instructions::*;

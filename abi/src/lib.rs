//! The contract between the GPU kernels of `flash-attn` (Rust compiled to
//! PTX by the `flash-attn-kernels` crate) and the host crate that launches
//! them: one definition, compiled into both.
//!
//! - [`params`]: the kernels' argument blocks, byte for byte (`#[repr(C)]`).
//! - [`config`]: each kernel's tile configuration: block sizes, warps,
//!   pipeline stages, and the shared memory that follows from them.
//! - [`kernels`]: the table of kernels (names, variants, configs) that the
//!   device crate exports and the host loads, and their launch geometry.
//! - [`backward`]: the backward kernels' table, tile configuration,
//!   shared-memory layout and argument block.
//! - [`hopper`]: the sm_90a forward kernels' table, tile configuration,
//!   shared-memory layout and argument block.
//! - [`hopper_backward`]: the same for the sm_90a main backward kernels.
//! - [`sm90`]: what the sm_90a primitives read from memory: the TMA tensor
//!   map (our encoding of `cuTensorMapEncodeTiled`'s parameters) and the
//!   wgmma shared-memory matrix descriptor.
//!
//! `no_std`, no dependencies: it builds for `nvptx64-nvidia-cuda` as for the host.
#![no_std]

pub mod backward;
pub mod config;
pub mod hopper;
pub mod hopper_backward;
pub mod kernels;
pub mod params;
pub mod sm90;

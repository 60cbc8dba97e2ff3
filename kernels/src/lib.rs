//! FlashAttention-2 forward kernels in Rust, compiled to PTX for
//! `nvptx64-nvidia-cuda` by `cargo xtask build-ptx`.
//!
//! Module map: [`arch`] every PTX primitive; [`layout`] shared-memory tiles
//! and their swizzle; [`tile_copy`] global <-> shared copies; [`mma`] the
//! fragment loads and the two matrix products; [`softmax`] the online softmax
//! and masking; [`warp_merge`] merging the warps of a block that split the
//! keys; [`epilogue`] normalising and storing O and the LSE; [`kernel`] a
//! kernel instance as one value ([`kernel::ForwardKernel`]); [`kv_pipeline`]
//! the K/V pipeline (copies, waits, barriers); [`mainloop`] the key loop's
//! step (Q K^T, mask, online softmax, P V); [`schedule`]
//! the block scheduler; [`forward`] the kernel body; [`hopper`] the sm_90a
//! kernels (TMA, `wgmma`, warp specialization); [`backward`] the backward
//! kernels (dQ, dK, dV); [`entry`] the exported
//! kernel instances;
//! [`probe`] one warp running each primitive, to check the emulator on a GPU;
//! [`probe_sm90`] the same for the sm_90a primitives (three warpgroups);
//! [`ceiling`] register-only MMAs, the benchmark's ceiling.
//!
//! On the host the same code compiles against an emulation of every
//! primitive ([`emu`]), which runs the kernels on the CPU: [`entry::KERNELS`]
//! lists the attention kernels as plain functions. The host crate's own
//! pipeline drives them there (validation, plan, launches, with host memory
//! for device memory): `flash_attn_tests::emulator` in `tests/`, whose
//! `tests/emulator_attention.rs` checks every kernel and feature against
//! the f64 reference (`flash_attn::reference`).
#![cfg_attr(target_arch = "nvptx64", no_std)]
#![cfg_attr(target_arch = "nvptx64", feature(abi_ptx, asm_experimental_arch, link_llvm_intrinsics))]
// The barriers are LLVM intrinsics (convergent, unlike `asm!`); see arch/ptx.rs.
#![cfg_attr(target_arch = "nvptx64", allow(internal_features))]
#![allow(clippy::missing_safety_doc)]
// The fragment loops index several arrays with one counter, as the layout
// math reads; `OnlineSoftmax::new` is deliberately its only constructor.
#![allow(clippy::needless_range_loop, clippy::new_without_default)]

pub mod append;
pub mod arch;
pub mod backward;
pub mod ceiling;
pub mod combine;
pub mod element;
pub mod entry;
pub mod epilogue;
pub mod forward;
pub mod hopper;
pub mod hopper_backward;
pub mod kernel;
pub mod kv_pipeline;
pub mod layout;
pub mod mainloop;
pub mod mma;
pub mod probe;
pub mod probe_sm90;
pub mod problem;
pub mod schedule;
pub mod softmax;
pub mod tile_copy;
pub mod warp_merge;

#[cfg(not(target_arch = "nvptx64"))]
pub use arch::emu;
/// The argument blocks and tile configurations, shared with the host.
pub use flash_attn_abi::{config, params};

#[cfg(target_arch = "nvptx64")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    arch::trap()
}

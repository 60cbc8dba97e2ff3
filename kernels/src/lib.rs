//! The FlashAttention kernels (forward, backward, split-KV merge, KV-cache
//! append) in Rust, compiled to PTX for `nvptx64-nvidia-cuda` by `cargo
//! xtask build-ptx`.
//!
//! Module map: [`arch`] every PTX primitive (and its CPU emulation);
//! [`common`] what the kernel families share (element types, tiles,
//! copies, `mma.sync` fragments, softmax and masks, each block's problem);
//! [`forward`] the forward families, [`forward::sm80`] (`mma.sync`,
//! `cp.async`) and [`forward::sm90`] (TMA, `wgmma`, warp specialization);
//! [`backward`] the backward kernels (dQ, dK, dV), [`backward::sm80`] and
//! [`backward::sm90`]; [`combine`] the split-KV merge; [`append`] the
//! KV-cache append; [`entry`] the exported kernel instances;
//! [`test_kernels`] the test-only kernels (the emulator's cross-check
//! probes, the benchmark's ceiling).
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
pub mod combine;
pub mod common;
pub mod entry;
pub mod forward;
pub mod test_kernels;

#[cfg(not(target_arch = "nvptx64"))]
pub use arch::emu;
/// The argument blocks and tile configurations, shared with the host.
pub use flash_attn_abi::{config, params};

#[cfg(target_arch = "nvptx64")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    arch::trap()
}

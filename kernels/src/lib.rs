//! FlashAttention-2 forward kernels in Rust, compiled to PTX for
//! `nvptx64-nvidia-cuda` by `cargo xtask build-ptx`.
//!
//! Module map: [`arch`] every PTX primitive; [`layout`] shared-memory tiles
//! and their swizzle; [`pipeline`] global <-> shared copies; [`mma`] the
//! fragment loads and the two matrix products; [`softmax`] the online softmax
//! and masking; [`epilogue`] normalising and storing O and the LSE;
//! [`forward`] the kernel body; [`entry`] the exported kernel instances.
#![no_std]
#![feature(abi_ptx, asm_experimental_arch)]
#![allow(clippy::missing_safety_doc)]

pub mod arch;
pub mod config;
pub mod element;
pub mod entry;
pub mod epilogue;
pub mod forward;
pub mod layout;
pub mod mma;
pub mod params;
pub mod pipeline;
pub mod softmax;

#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    arch::trap()
}

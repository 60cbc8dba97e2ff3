//! The exported kernels: one `#[no_mangle]` entry point per (head dim,
//! element type, variant), named `flash_fwd_d{head_dim}_{f16|bf16}_{variant}`.
//! Variants: `full` and `causal` (dense), `general` (every feature of
//! [`ForwardParams`] at run time) and `decode` (the same with the decode
//! tile config); besides them `flash_combine_{f16|bf16}` and
//! `kv_cache_append`. The host looks them up by these names. On the host
//! (the emulator) each attention kernel is a plain function, listed by name
//! in [`KERNELS`].

use crate::config::{
    causal_tile_config, decode_tile_config, general_tile_config, TileConfig, HEAD_DIM_128, HEAD_DIM_160, HEAD_DIM_192,
    HEAD_DIM_224, HEAD_DIM_256, HEAD_DIM_32, HEAD_DIM_64, HEAD_DIM_96,
};
use crate::element::{Bf16, F16};
use crate::forward::flash_forward;
use crate::params::{AppendParams, CombineParams, ForwardParams};

/// The element type of a kernel instance.
#[cfg(not(target_arch = "nvptx64"))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DType {
    F16,
    Bf16,
}

/// A kernel instance as the emulator runs it.
#[cfg(not(target_arch = "nvptx64"))]
#[derive(Clone, Copy, Debug)]
pub struct HostKernel {
    /// The PTX entry point's name.
    pub name: &'static str,
    pub dtype: DType,
    /// A dense causal kernel.
    pub causal: bool,
    /// A general kernel (`general` or `decode`): reads every feature of
    /// [`ForwardParams`], causal masking included (as a window).
    pub general: bool,
    pub config: TileConfig,
    /// The kernel body, for each emulated thread to call.
    pub run: unsafe fn(&ForwardParams),
}

// The per-variant tile configs of `head_dim`, at compile time.
const fn causal(head_dim: u32) -> TileConfig {
    causal_tile_config(head_dim).expect("no causal config")
}
const fn general(head_dim: u32) -> TileConfig {
    general_tile_config(head_dim).expect("no general config")
}
const fn decode(head_dim: u32) -> TileConfig {
    decode_tile_config(head_dim).expect("no decode config")
}

macro_rules! forward_kernels {
    ($(($name:ident, $element:ident, $causal:literal, $general:literal, $config:expr)),* $(,)?) => {
        $(
            #[cfg(target_arch = "nvptx64")]
            #[no_mangle]
            pub unsafe extern "ptx-kernel" fn $name(params: ForwardParams) {
                forward_kernels!(@body $element, $causal, $general, $config, &params)
            }

            #[cfg(not(target_arch = "nvptx64"))]
            pub unsafe fn $name(params: &ForwardParams) {
                forward_kernels!(@body $element, $causal, $general, $config, params)
            }
        )*

        /// Every kernel instance, as `extern "ptx-kernel"` exports them on the GPU.
        #[cfg(not(target_arch = "nvptx64"))]
        pub const KERNELS: &[HostKernel] = &[$(HostKernel {
            name: stringify!($name),
            dtype: DType::$element,
            causal: $causal,
            general: $general,
            config: $config,
            run: $name,
        }),*];
    };
    (@body $element:ident, $causal:literal, $general:literal, $config:expr, $params:expr) => {{
        const C: TileConfig = $config;
        flash_forward::<
            $element,
            $causal,
            $general,
            { C.head_dim as usize },
            { C.head_dim as usize / 16 },
            { C.head_dim as usize / 8 },
            { C.block_n as usize },
            { C.block_n as usize / 8 },
            { C.block_n as usize / 16 },
            { C.warps as usize },
            { C.warps_split_keys },
            { C.m_tiles as usize },
            { C.q_in_registers },
            { C.stages as usize },
            { C.wait_kv_at_top },
            { C.split_masked_steps },
            { C.rederive_copy_offsets },
            { C.softmax_in_halves },
            { C.block_n as usize / 16 },
            { C.block_n as usize / 32 },
        >($params)
    }};
}

forward_kernels! {
    (flash_fwd_d32_f16_full, F16, false, false, HEAD_DIM_32),
    (flash_fwd_d32_f16_causal, F16, true, false, causal(32)),
    (flash_fwd_d32_f16_general, F16, false, true, general(32)),
    (flash_fwd_d32_f16_decode, F16, false, true, decode(32)),
    (flash_fwd_d32_bf16_full, Bf16, false, false, HEAD_DIM_32),
    (flash_fwd_d32_bf16_causal, Bf16, true, false, causal(32)),
    (flash_fwd_d32_bf16_general, Bf16, false, true, general(32)),
    (flash_fwd_d32_bf16_decode, Bf16, false, true, decode(32)),
    (flash_fwd_d64_f16_full, F16, false, false, HEAD_DIM_64),
    (flash_fwd_d64_f16_causal, F16, true, false, causal(64)),
    (flash_fwd_d64_f16_general, F16, false, true, general(64)),
    (flash_fwd_d64_f16_decode, F16, false, true, decode(64)),
    (flash_fwd_d64_bf16_full, Bf16, false, false, HEAD_DIM_64),
    (flash_fwd_d64_bf16_causal, Bf16, true, false, causal(64)),
    (flash_fwd_d64_bf16_general, Bf16, false, true, general(64)),
    (flash_fwd_d64_bf16_decode, Bf16, false, true, decode(64)),
    (flash_fwd_d96_f16_full, F16, false, false, HEAD_DIM_96),
    (flash_fwd_d96_f16_causal, F16, true, false, causal(96)),
    (flash_fwd_d96_f16_general, F16, false, true, general(96)),
    (flash_fwd_d96_f16_decode, F16, false, true, decode(96)),
    (flash_fwd_d96_bf16_full, Bf16, false, false, HEAD_DIM_96),
    (flash_fwd_d96_bf16_causal, Bf16, true, false, causal(96)),
    (flash_fwd_d96_bf16_general, Bf16, false, true, general(96)),
    (flash_fwd_d96_bf16_decode, Bf16, false, true, decode(96)),
    (flash_fwd_d128_f16_full, F16, false, false, HEAD_DIM_128),
    (flash_fwd_d128_f16_causal, F16, true, false, causal(128)),
    (flash_fwd_d128_f16_general, F16, false, true, general(128)),
    (flash_fwd_d128_f16_decode, F16, false, true, decode(128)),
    (flash_fwd_d128_bf16_full, Bf16, false, false, HEAD_DIM_128),
    (flash_fwd_d128_bf16_causal, Bf16, true, false, causal(128)),
    (flash_fwd_d128_bf16_general, Bf16, false, true, general(128)),
    (flash_fwd_d128_bf16_decode, Bf16, false, true, decode(128)),
    (flash_fwd_d160_f16_full, F16, false, false, HEAD_DIM_160),
    (flash_fwd_d160_f16_causal, F16, true, false, causal(160)),
    (flash_fwd_d160_f16_general, F16, false, true, general(160)),
    (flash_fwd_d160_f16_decode, F16, false, true, decode(160)),
    (flash_fwd_d160_bf16_full, Bf16, false, false, HEAD_DIM_160),
    (flash_fwd_d160_bf16_causal, Bf16, true, false, causal(160)),
    (flash_fwd_d160_bf16_general, Bf16, false, true, general(160)),
    (flash_fwd_d160_bf16_decode, Bf16, false, true, decode(160)),
    (flash_fwd_d192_f16_full, F16, false, false, HEAD_DIM_192),
    (flash_fwd_d192_f16_causal, F16, true, false, causal(192)),
    (flash_fwd_d192_f16_general, F16, false, true, general(192)),
    (flash_fwd_d192_f16_decode, F16, false, true, decode(192)),
    (flash_fwd_d192_bf16_full, Bf16, false, false, HEAD_DIM_192),
    (flash_fwd_d192_bf16_causal, Bf16, true, false, causal(192)),
    (flash_fwd_d192_bf16_general, Bf16, false, true, general(192)),
    (flash_fwd_d192_bf16_decode, Bf16, false, true, decode(192)),
    (flash_fwd_d224_f16_full, F16, false, false, HEAD_DIM_224),
    (flash_fwd_d224_f16_causal, F16, true, false, causal(224)),
    (flash_fwd_d224_f16_general, F16, false, true, general(224)),
    (flash_fwd_d224_f16_decode, F16, false, true, decode(224)),
    (flash_fwd_d224_bf16_full, Bf16, false, false, HEAD_DIM_224),
    (flash_fwd_d224_bf16_causal, Bf16, true, false, causal(224)),
    (flash_fwd_d224_bf16_general, Bf16, false, true, general(224)),
    (flash_fwd_d224_bf16_decode, Bf16, false, true, decode(224)),
    (flash_fwd_d256_f16_full, F16, false, false, HEAD_DIM_256),
    (flash_fwd_d256_f16_causal, F16, true, false, causal(256)),
    (flash_fwd_d256_f16_general, F16, false, true, general(256)),
    (flash_fwd_d256_f16_decode, F16, false, true, decode(256)),
    (flash_fwd_d256_bf16_full, Bf16, false, false, HEAD_DIM_256),
    (flash_fwd_d256_bf16_causal, Bf16, true, false, causal(256)),
    (flash_fwd_d256_bf16_general, Bf16, false, true, general(256)),
    (flash_fwd_d256_bf16_decode, Bf16, false, true, decode(256)),
}

/// The instance called `name`.
#[cfg(not(target_arch = "nvptx64"))]
pub fn kernel(name: &str) -> Option<&'static HostKernel> {
    KERNELS.iter().find(|k| k.name == name)
}

/// A kernel of one instance, with its argument block: `extern "ptx-kernel"`
/// on the GPU, a plain function for the emulator on the host.
macro_rules! kernel {
    ($(#[$doc:meta])* $name:ident($params:ident: $ty:ty) $body:block) => {
        $(#[$doc])*
        #[cfg(target_arch = "nvptx64")]
        #[no_mangle]
        pub unsafe extern "ptx-kernel" fn $name($params: $ty) {
            let $params = &$params;
            $body
        }

        $(#[$doc])*
        #[cfg(not(target_arch = "nvptx64"))]
        pub unsafe fn $name($params: &$ty) $body
    };
}

kernel! {
    /// Merges split-KV partial outputs ([`crate::combine`]) into f16.
    flash_combine_f16(params: CombineParams) { crate::combine::combine_splits::<F16>(params) }
}

kernel! {
    /// Merges split-KV partial outputs ([`crate::combine`]) into bf16.
    flash_combine_bf16(params: CombineParams) { crate::combine::combine_splits::<Bf16>(params) }
}

kernel! {
    /// Appends new keys and values to a KV cache ([`crate::append`]).
    kv_cache_append(params: AppendParams) { crate::append::append_kv(params) }
}

/// The primitive probe ([`crate::probe`]) as a kernel: the GPU side of the
/// emulator cross-check.
#[cfg(target_arch = "nvptx64")]
#[no_mangle]
pub unsafe extern "ptx-kernel" fn probe_primitives(input: *const u32, output: *mut u32) {
    crate::probe::probe_primitives(input, output)
}

/// The mma.sync ceiling ([`crate::ceiling`]) as a kernel, for the benchmark.
#[cfg(target_arch = "nvptx64")]
#[no_mangle]
pub unsafe extern "ptx-kernel" fn mma_ceiling(iterations: u32, out: *mut f32, threads: u32) {
    crate::ceiling::mma_ceiling(iterations, out, threads)
}

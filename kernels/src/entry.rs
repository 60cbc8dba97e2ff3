//! The exported kernels: one `#[no_mangle]` entry point per (head dim,
//! element type, causal), named `flash_fwd_d{head_dim}_{f16|bf16}_{causal|full}`.
//! The host looks them up by these names. On the host (the emulator) each
//! is a plain function, listed by name in [`KERNELS`].

use crate::config::{
    TileConfig, HEAD_DIM_128, HEAD_DIM_160, HEAD_DIM_192, HEAD_DIM_224, HEAD_DIM_256, HEAD_DIM_32, HEAD_DIM_64,
    HEAD_DIM_96,
};
use crate::element::{Bf16, F16};
use crate::forward::flash_forward;
use crate::params::ForwardParams;

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
    pub causal: bool,
    pub config: TileConfig,
    /// The kernel body, for each emulated thread to call.
    pub run: unsafe fn(&ForwardParams),
}

macro_rules! forward_kernels {
    ($(($name:ident, $element:ident, $causal:literal, $config:ident)),* $(,)?) => {
        $(
            #[cfg(target_arch = "nvptx64")]
            #[no_mangle]
            pub unsafe extern "ptx-kernel" fn $name(params: ForwardParams) {
                forward_kernels!(@body $element, $causal, $config, &params)
            }

            #[cfg(not(target_arch = "nvptx64"))]
            pub unsafe fn $name(params: &ForwardParams) {
                forward_kernels!(@body $element, $causal, $config, params)
            }
        )*

        /// Every kernel instance, as `extern "ptx-kernel"` exports them on the GPU.
        #[cfg(not(target_arch = "nvptx64"))]
        pub const KERNELS: &[HostKernel] = &[$(HostKernel {
            name: stringify!($name),
            dtype: DType::$element,
            causal: $causal,
            config: $config,
            run: $name,
        }),*];
    };
    (@body $element:ident, $causal:literal, $config:ident, $params:expr) => {{
        const C: TileConfig = $config;
        flash_forward::<
            $element,
            $causal,
            { C.head_dim as usize },
            { C.head_dim as usize / 16 },
            { C.head_dim as usize / 8 },
            { C.block_n as usize },
            { C.block_n as usize / 8 },
            { C.block_n as usize / 16 },
            { C.warps as usize },
            { C.m_tiles as usize },
            { C.q_in_registers },
        >($params)
    }};
}

forward_kernels! {
    (flash_fwd_d32_f16_full, F16, false, HEAD_DIM_32),
    (flash_fwd_d32_f16_causal, F16, true, HEAD_DIM_32),
    (flash_fwd_d32_bf16_full, Bf16, false, HEAD_DIM_32),
    (flash_fwd_d32_bf16_causal, Bf16, true, HEAD_DIM_32),
    (flash_fwd_d64_f16_full, F16, false, HEAD_DIM_64),
    (flash_fwd_d64_f16_causal, F16, true, HEAD_DIM_64),
    (flash_fwd_d64_bf16_full, Bf16, false, HEAD_DIM_64),
    (flash_fwd_d64_bf16_causal, Bf16, true, HEAD_DIM_64),
    (flash_fwd_d96_f16_full, F16, false, HEAD_DIM_96),
    (flash_fwd_d96_f16_causal, F16, true, HEAD_DIM_96),
    (flash_fwd_d96_bf16_full, Bf16, false, HEAD_DIM_96),
    (flash_fwd_d96_bf16_causal, Bf16, true, HEAD_DIM_96),
    (flash_fwd_d128_f16_full, F16, false, HEAD_DIM_128),
    (flash_fwd_d128_f16_causal, F16, true, HEAD_DIM_128),
    (flash_fwd_d128_bf16_full, Bf16, false, HEAD_DIM_128),
    (flash_fwd_d128_bf16_causal, Bf16, true, HEAD_DIM_128),
    (flash_fwd_d160_f16_full, F16, false, HEAD_DIM_160),
    (flash_fwd_d160_f16_causal, F16, true, HEAD_DIM_160),
    (flash_fwd_d160_bf16_full, Bf16, false, HEAD_DIM_160),
    (flash_fwd_d160_bf16_causal, Bf16, true, HEAD_DIM_160),
    (flash_fwd_d192_f16_full, F16, false, HEAD_DIM_192),
    (flash_fwd_d192_f16_causal, F16, true, HEAD_DIM_192),
    (flash_fwd_d192_bf16_full, Bf16, false, HEAD_DIM_192),
    (flash_fwd_d192_bf16_causal, Bf16, true, HEAD_DIM_192),
    (flash_fwd_d224_f16_full, F16, false, HEAD_DIM_224),
    (flash_fwd_d224_f16_causal, F16, true, HEAD_DIM_224),
    (flash_fwd_d224_bf16_full, Bf16, false, HEAD_DIM_224),
    (flash_fwd_d224_bf16_causal, Bf16, true, HEAD_DIM_224),
    (flash_fwd_d256_f16_full, F16, false, HEAD_DIM_256),
    (flash_fwd_d256_f16_causal, F16, true, HEAD_DIM_256),
    (flash_fwd_d256_bf16_full, Bf16, false, HEAD_DIM_256),
    (flash_fwd_d256_bf16_causal, Bf16, true, HEAD_DIM_256),
}

/// The instance called `name`.
#[cfg(not(target_arch = "nvptx64"))]
pub fn kernel(name: &str) -> Option<&'static HostKernel> {
    KERNELS.iter().find(|k| k.name == name)
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

//! The exported kernels: one `#[no_mangle]` entry point per (head dim,
//! element type, causal), named `flash_fwd_d{head_dim}_{f16|bf16}_{causal|full}`.
//! The host looks them up by these names.

use crate::config::{TileConfig, HEAD_DIM_128, HEAD_DIM_64};
use crate::element::{Bf16, F16};
use crate::forward::flash_forward;
use crate::params::ForwardParams;

macro_rules! forward_kernel {
    ($name:ident, $element:ty, $causal:literal, $config:ident) => {
        #[no_mangle]
        pub unsafe extern "ptx-kernel" fn $name(params: ForwardParams) {
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
            >(&params)
        }
    };
}

forward_kernel!(flash_fwd_d64_f16_full, F16, false, HEAD_DIM_64);
forward_kernel!(flash_fwd_d64_f16_causal, F16, true, HEAD_DIM_64);
forward_kernel!(flash_fwd_d64_bf16_full, Bf16, false, HEAD_DIM_64);
forward_kernel!(flash_fwd_d64_bf16_causal, Bf16, true, HEAD_DIM_64);
forward_kernel!(flash_fwd_d128_f16_full, F16, false, HEAD_DIM_128);
forward_kernel!(flash_fwd_d128_f16_causal, F16, true, HEAD_DIM_128);
forward_kernel!(flash_fwd_d128_bf16_full, Bf16, false, HEAD_DIM_128);
forward_kernel!(flash_fwd_d128_bf16_causal, Bf16, true, HEAD_DIM_128);

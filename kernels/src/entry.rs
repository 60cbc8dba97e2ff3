//! The exported kernels: one `#[no_mangle]` entry point per row of the
//! ABI's kernel table ([`flash_attn_abi::attention_kernels!`]), named
//! `flash_fwd_d{head_dim}_{f16|bf16}_{variant}`, each the forward kernel
//! body instantiated for the row (a [`ForwardKernel`]: element type,
//! variant, tile config, scheduler); besides them
//! `flash_combine_{f16|bf16}` and `kv_cache_append` (feature `attention`,
//! the module users embed); with feature `attention-sm90a`, the sm_90a
//! kernels `flash_fwd_sm90_d{head_dim}_{f16|bf16}_{variant}` of the ABI's
//! [`flash_attn_abi::hopper_kernels!`] and the sm_90a main backward
//! kernels `flash_bwd_sm90_d{head_dim}_{f16|bf16}_{variant}` of
//! [`flash_attn_abi::hopper_backward_kernels!`] (the module users embed
//! beside it, loaded on compute capability 9.0); with feature `test-kernels` instead, the
//! test-only `probe_primitives` and `mma_ceiling`; with
//! `test-kernels-sm90a`, `probe_sm90`. On the host (the
//! emulator) each attention kernel is a plain function, listed with its
//! table row in [`KERNELS`].

// The PTX builds export one set of kernels; the other set's imports are unused there.
#![cfg_attr(target_arch = "nvptx64", allow(unused_imports))]

use flash_attn_abi::backward::{backward_config_of, BackwardConfig, BackwardKernel, BackwardParams, BACKWARD_BLOCK_N};
use flash_attn_abi::hopper::{hopper_config_of, HopperConfig, HopperKernel, HopperParams};
use flash_attn_abi::hopper_backward::{
    hopper_backward_config_of, HopperBackwardConfig, HopperBackwardKernel, HopperBackwardParams,
};
use flash_attn_abi::kernels::{config_of, AttentionKernel, Dtype, Variant};

use crate::backward::sm80::key_block::backward_key_block;
use crate::backward::sm90::hopper_backward;
use crate::common::element::{Bf16, F16};
use crate::config::TileConfig;
use crate::forward::sm80::flash_forward;
use crate::forward::sm80::kernel::ForwardKernel;
use crate::forward::sm80::schedule::OneShot;
use crate::forward::sm90::hopper_forward;
use crate::params::{AppendParams, CombineParams, ForwardParams};

/// A kernel instance as the emulator runs it.
#[cfg(not(target_arch = "nvptx64"))]
#[derive(Clone, Copy, Debug)]
pub struct HostKernel {
    /// Its row of the ABI's kernel table.
    pub kernel: AttentionKernel,
    /// The kernel body, for each emulated thread to call.
    pub run: unsafe fn(&ForwardParams),
}

macro_rules! forward_kernels {
    ($(($name:ident, $head_dim:literal, $dtype:ident, $variant:ident)),* $(,)?) => {
        $(
            #[cfg(all(target_arch = "nvptx64", feature = "attention"))]
            #[no_mangle]
            pub unsafe extern "ptx-kernel" fn $name(params: ForwardParams) {
                forward_kernels!(@body $dtype, $head_dim, $variant, &params)
            }

            #[cfg(not(target_arch = "nvptx64"))]
            pub unsafe fn $name(params: &ForwardParams) {
                forward_kernels!(@body $dtype, $head_dim, $variant, params)
            }
        )*

        /// Every kernel instance, as `extern "ptx-kernel"` exports them on the GPU.
        #[cfg(not(target_arch = "nvptx64"))]
        pub const KERNELS: &[HostKernel] = &[$(HostKernel {
            kernel: AttentionKernel {
                name: stringify!($name),
                head_dim: $head_dim,
                dtype: Dtype::$dtype,
                variant: Variant::$variant,
                config: config_of($head_dim, Variant::$variant),
            },
            run: $name,
        }),*];
    };
    (@body $dtype:ident, $head_dim:literal, $variant:ident, $params:expr) => {{
        /// The instance of this row.
        struct Kernel;
        impl ForwardKernel for Kernel {
            type Element = $dtype;
            type Scheduler = OneShot;
            const VARIANT: Variant = Variant::$variant;
            const CONFIG: TileConfig = config_of($head_dim, Variant::$variant);
        }
        const C: TileConfig = Kernel::CONFIG;
        // The array sizes of the instance (asserted against C in the body).
        flash_forward::<
            Kernel,
            { C.head_dim as usize },
            { C.head_dim as usize / 16 },
            { C.head_dim as usize / 8 },
            { C.block_n as usize / 8 },
            { C.block_n as usize / 16 },
            { C.m_tiles as usize },
            { C.q_in_registers },
            { C.block_n as usize / 16 },
            { C.block_n as usize / 32 },
        >($params)
    }};
}

flash_attn_abi::attention_kernels!(forward_kernels);

/// An sm_90a kernel instance as the emulator runs it.
#[cfg(not(target_arch = "nvptx64"))]
#[derive(Clone, Copy, Debug)]
pub struct HostHopperKernel {
    /// Its row of the ABI's table of sm_90a kernels.
    pub kernel: HopperKernel,
    /// The kernel body, for each emulated thread to call.
    pub run: unsafe fn(&HopperParams),
}

macro_rules! hopper_forward_kernels {
    ($(($name:ident, $head_dim:literal, $dtype:ident, $variant:ident, $block_m:literal)),* $(,)?) => {
        $(
            #[cfg(all(target_arch = "nvptx64", feature = "attention-sm90a"))]
            #[no_mangle]
            pub unsafe extern "ptx-kernel" fn $name(params: HopperParams) {
                hopper_forward_kernels!(@body $dtype, $head_dim, $variant, $block_m, &params)
            }

            #[cfg(not(target_arch = "nvptx64"))]
            pub unsafe fn $name(params: &HopperParams) {
                hopper_forward_kernels!(@body $dtype, $head_dim, $variant, $block_m, params)
            }
        )*

        /// Every sm_90a kernel instance, as `extern "ptx-kernel"` exports
        /// them in the sm_90a module.
        #[cfg(not(target_arch = "nvptx64"))]
        pub const HOPPER_KERNELS: &[HostHopperKernel] = &[$(HostHopperKernel {
            kernel: HopperKernel {
                name: stringify!($name),
                head_dim: $head_dim,
                dtype: Dtype::$dtype,
                variant: Variant::$variant,
                config: hopper_config_of($head_dim, Variant::$variant, $block_m),
            },
            run: $name,
        }),*];
    };
    (@body $dtype:ident, $head_dim:literal, $variant:ident, $block_m:literal, $params:expr) => {{
        const C: HopperConfig = hopper_config_of($head_dim, Variant::$variant, $block_m);
        const CAUSAL: bool = matches!(Variant::$variant, Variant::Causal);
        const GENERAL: bool = matches!(Variant::$variant, Variant::General);
        hopper_forward::<
            $dtype,
            { C.block_m() as usize },
            { C.head_dim as usize },
            { C.tile_dim as usize },
            { C.block_n as usize },
            { C.stages as usize },
            CAUSAL,
            GENERAL,
            { C.registers().0 },
            { C.registers().1 },
            { C.block_n as usize / 2 },
            { C.head_dim as usize / 2 },
            { C.block_n as usize / 8 },
            { C.head_dim as usize / 8 },
            { C.block_n as usize / 16 },
        >($params)
    }};
}

flash_attn_abi::hopper_kernels!(hopper_forward_kernels);

/// The sm_90a instance called `name`.
#[cfg(not(target_arch = "nvptx64"))]
pub fn hopper_kernel(name: &str) -> Option<&'static HostHopperKernel> {
    HOPPER_KERNELS.iter().find(|k| k.kernel.name == name)
}

/// An sm_90a main backward kernel instance as the emulator runs it.
#[cfg(not(target_arch = "nvptx64"))]
#[derive(Clone, Copy, Debug)]
pub struct HostHopperBackwardKernel {
    /// Its row of the ABI's table of sm_90a backward kernels.
    pub kernel: HopperBackwardKernel,
    /// The kernel body, for each emulated thread to call.
    pub run: unsafe fn(&HopperBackwardParams),
}

macro_rules! hopper_backward_entry_points {
    ($(($name:ident, $head_dim:literal, $dtype:ident, $variant:ident)),* $(,)?) => {
        $(
            #[cfg(all(target_arch = "nvptx64", feature = "attention-sm90a"))]
            #[no_mangle]
            pub unsafe extern "ptx-kernel" fn $name(params: HopperBackwardParams) {
                hopper_backward_entry_points!(@body $dtype, $head_dim, $variant, &params)
            }

            #[cfg(not(target_arch = "nvptx64"))]
            pub unsafe fn $name(params: &HopperBackwardParams) {
                hopper_backward_entry_points!(@body $dtype, $head_dim, $variant, params)
            }
        )*

        /// Every sm_90a main backward kernel instance, as `extern
        /// "ptx-kernel"` exports them in the sm_90a module.
        #[cfg(not(target_arch = "nvptx64"))]
        pub const HOPPER_BACKWARD_KERNELS: &[HostHopperBackwardKernel] = &[$(HostHopperBackwardKernel {
            kernel: HopperBackwardKernel {
                name: stringify!($name),
                head_dim: $head_dim,
                dtype: Dtype::$dtype,
                variant: Variant::$variant,
                config: hopper_backward_config_of($head_dim),
            },
            run: $name,
        }),*];
    };
    (@body $dtype:ident, $head_dim:literal, $variant:ident, $params:expr) => {{
        const C: HopperBackwardConfig = hopper_backward_config_of($head_dim);
        hopper_backward::<
            $dtype,
            { C.head_dim as usize },
            { matches!(Variant::$variant, Variant::Causal) },
            { C.registers().0 },
            { C.registers().1 },
            { C.score_columns() as usize / 2 },
            { C.score_columns() as usize / 8 },
            { C.score_columns() as usize / 16 },
            { C.gradient_columns() as usize / 2 },
            { C.gradient_columns() as usize / 8 },
            { C.dq_columns() as usize / 2 },
            { C.dq_columns() as usize / 8 },
        >($params)
    }};
}

flash_attn_abi::hopper_backward_kernels!(hopper_backward_entry_points);

/// The sm_90a main backward instance called `name`.
#[cfg(not(target_arch = "nvptx64"))]
pub fn hopper_backward_kernel(name: &str) -> Option<&'static HostHopperBackwardKernel> {
    HOPPER_BACKWARD_KERNELS.iter().find(|k| k.kernel.name == name)
}

/// The instance called `name`.
#[cfg(not(target_arch = "nvptx64"))]
pub fn kernel(name: &str) -> Option<&'static HostKernel> {
    KERNELS.iter().find(|k| k.kernel.name == name)
}

/// A kernel of one instance, with its argument block: `extern "ptx-kernel"`
/// on the GPU, a plain function for the emulator on the host.
macro_rules! kernel {
    ($(#[$doc:meta])* $name:ident($params:ident: $ty:ty) $body:block) => {
        kernel! { "attention", $(#[$doc])* $name($params: $ty) $body }
    };
    ($feature:literal, $(#[$doc:meta])* $name:ident($params:ident: $ty:ty) $body:block) => {
        $(#[$doc])*
        #[cfg(all(target_arch = "nvptx64", feature = $feature))]
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

/// A main backward kernel instance as the emulator runs it.
#[cfg(not(target_arch = "nvptx64"))]
#[derive(Clone, Copy, Debug)]
pub struct HostBackwardKernel {
    /// Its row of the ABI's table of backward kernels.
    pub kernel: BackwardKernel,
    /// The kernel body, for each emulated thread to call.
    pub run: unsafe fn(&BackwardParams),
}

macro_rules! backward_entry_points {
    ($(($name:ident, $head_dim:literal, $dtype:ident)),* $(,)?) => {
        $(
            #[cfg(all(target_arch = "nvptx64", feature = "attention-backward"))]
            #[no_mangle]
            pub unsafe extern "ptx-kernel" fn $name(params: BackwardParams) {
                backward_entry_points!(@body $dtype, $head_dim, &params)
            }

            #[cfg(not(target_arch = "nvptx64"))]
            pub unsafe fn $name(params: &BackwardParams) {
                backward_entry_points!(@body $dtype, $head_dim, params)
            }
        )*

        /// Every main backward kernel instance, as `extern "ptx-kernel"`
        /// exports them in the backward module.
        #[cfg(not(target_arch = "nvptx64"))]
        pub const BACKWARD_KERNELS: &[HostBackwardKernel] = &[$(HostBackwardKernel {
            kernel: BackwardKernel {
                name: stringify!($name),
                head_dim: $head_dim,
                dtype: Dtype::$dtype,
                config: backward_config_of($head_dim),
            },
            run: $name,
        }),*];
    };
    (@body $dtype:ident, $head_dim:literal, $params:expr) => {{
        const C: BackwardConfig = backward_config_of($head_dim);
        backward_key_block::<
            $dtype,
            { C.head_dim as usize },
            { C.head_dim as usize / 16 },
            { C.warps as usize },
            { (BACKWARD_BLOCK_N / C.column_groups() / 8) as usize },
            { C.grad_tiles() as usize },
            { C.dq_tiles() as usize },
        >($params)
    }};
}

flash_attn_abi::backward_kernels!(backward_entry_points);

/// The main backward instance called `name`.
#[cfg(not(target_arch = "nvptx64"))]
pub fn backward_kernel(name: &str) -> Option<&'static HostBackwardKernel> {
    BACKWARD_KERNELS.iter().find(|k| k.kernel.name == name)
}

kernel! {
    "attention-backward",
    /// The backward's first kernel ([`crate::backward::rows::prepare`]), f16.
    flash_bwd_prepare_f16(params: BackwardParams) { crate::backward::rows::prepare::<F16>(params) }
}

kernel! {
    "attention-backward",
    /// The backward's first kernel ([`crate::backward::rows::prepare`]), bf16.
    flash_bwd_prepare_bf16(params: BackwardParams) { crate::backward::rows::prepare::<Bf16>(params) }
}

kernel! {
    "attention-backward",
    /// The backward's last kernel ([`crate::backward::rows::finish_dq`]), f16.
    flash_bwd_finish_dq_f16(params: BackwardParams) { crate::backward::rows::finish_dq::<F16>(params) }
}

kernel! {
    "attention-backward",
    /// The backward's last kernel ([`crate::backward::rows::finish_dq`]), bf16.
    flash_bwd_finish_dq_bf16(params: BackwardParams) { crate::backward::rows::finish_dq::<Bf16>(params) }
}

/// The primitive probe ([`crate::test_kernels::probe`]) as a kernel: the GPU side of the
/// emulator cross-check. In the test module only (feature `test-kernels`).
#[cfg(all(target_arch = "nvptx64", feature = "test-kernels"))]
#[no_mangle]
pub unsafe extern "ptx-kernel" fn probe_primitives(input: *const u32, output: *mut u32) {
    crate::test_kernels::probe::probe_primitives(input, output)
}

/// The sm_90a primitive probe ([`crate::test_kernels::probe_sm90`]) as a kernel: the GPU
/// side of the sm_90a emulator cross-check. In the sm_90a test module only
/// (feature `test-kernels-sm90a`, built for sm_90a).
#[cfg(all(target_arch = "nvptx64", feature = "test-kernels-sm90a"))]
#[no_mangle]
pub unsafe extern "ptx-kernel" fn probe_sm90(
    maps: *const crate::arch::TensorMap,
    input: *const u32,
    output: *mut u32,
    bf16: u32,
) {
    crate::test_kernels::probe_sm90::probe_sm90(maps, input, output, bf16)
}

/// The mma.sync ceiling ([`crate::test_kernels::ceiling`]) as a kernel, for the benchmark.
/// In the test module only (feature `test-kernels`).
#[cfg(all(target_arch = "nvptx64", feature = "test-kernels"))]
#[no_mangle]
pub unsafe extern "ptx-kernel" fn mma_ceiling(iterations: u32, out: *mut f32, threads: u32) {
    crate::test_kernels::ceiling::mma_ceiling(iterations, out, threads)
}

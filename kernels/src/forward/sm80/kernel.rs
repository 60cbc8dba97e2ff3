//! One forward kernel instance as one value: its element type, variant,
//! tile configuration and block scheduler ([`ForwardKernel`]).
//!
//! The kernel's parts ([`crate::forward::sm80::schedule`], [`crate::forward::sm80`],
//! [`crate::forward::sm80::epilogue`]) read every behaviour flag (stages, waits,
//! masked-step split, softmax in halves, warps splitting the keys, ...)
//! from `K` where they use it: each is a constant of the instance, which
//! LLVM folds as it folded the const generics they replace. Only the array
//! sizes (and the Q operand's form, a type parameter of
//! [`crate::common::mma::QOperand`]) stay const generics of the kernel body: Rust
//! cannot size an array from an expression of a generic parameter without
//! the incomplete `generic_const_exprs`. [`crate::forward::sm80::flash_forward`]
//! asserts at compile time that they agree with `CONFIG`.
//!
//! `const C: TileConfig` (feature `adt_const_params`, complete on the
//! pinned nightly) would also work, but needs the feature and a
//! `ConstParamTy` derive in the ABI crate, which the host builds too; the
//! trait carries the element type, variant and scheduler beside the config.

use flash_attn_abi::kernels::Variant;

use crate::common::element::Element;
use crate::config::TileConfig;
use crate::forward::sm80::schedule::TileScheduler;

/// A forward kernel instance. Each row of the ABI's kernel table is one
/// implementation ([`crate::entry`]).
pub trait ForwardKernel {
    /// The element type of q, k, v and o.
    type Element: Element;
    /// Which CTA computes which work tile, in what order.
    type Scheduler: TileScheduler;
    /// Full, causal, general or decode.
    const VARIANT: Variant;
    /// The tile shape and pipeline flags, as the host plans with them.
    const CONFIG: TileConfig;
    /// The dense causal kernels: a window fixed at compile time to
    /// `right = 0`. Derived from `VARIANT`; implementations leave it.
    const CAUSAL: bool = matches!(Self::VARIANT, Variant::Causal);
    /// The general and decode kernels: every feature of the argument block
    /// read at run time. Derived from `VARIANT`; implementations leave it.
    const GENERAL: bool = Self::VARIANT.is_general();

    // Scalar views of `CONFIG`, derived; implementations leave them. The
    // body reads each flag through these, spelled as the const generics it
    // had before: other spellings of the same constants (a field of
    // `CONFIG`, a shorter cast) give LLVM other MIR to start from, and
    // changed the PTX (see crate::forward::sm80).
    const BLOCK_M: u32 = Self::CONFIG.block_m;
    const BLOCK_N: u32 = Self::CONFIG.block_n;
    const WARPS: u32 = Self::CONFIG.warps;
    const THREADS: u32 = Self::CONFIG.threads();
    const M_TILES: u32 = Self::CONFIG.m_tiles;
    const WARPS_SPLIT_KEYS: bool = Self::CONFIG.warps_split_keys;
    const Q_IN_REGISTERS: bool = Self::CONFIG.q_in_registers;
    const STAGES: u32 = Self::CONFIG.stages;
    const WAIT_KV_AT_TOP: bool = Self::CONFIG.wait_kv_at_top;
    const SPLIT_MASKED_STEPS: bool = Self::CONFIG.split_masked_steps;
    const REDERIVE_COPY_OFFSETS: bool = Self::CONFIG.rederive_copy_offsets;
    const SOFTMAX_IN_HALVES: bool = Self::CONFIG.softmax_in_halves;
}

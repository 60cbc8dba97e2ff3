//! The kernels of the PTX module, in one table: their exported names, what
//! each computes, its tile configuration and its launch geometry.
//!
//! [`attention_kernels!`](crate::attention_kernels) lists every attention
//! kernel once. The device crate expands it into the `#[no_mangle]` entry
//! points; this crate expands it into [`ATTENTION_KERNELS`], which the host
//! loads by name and plans with. A kernel is named, configured and launched
//! from the same row.

use crate::config::{
    causal_tile_config, decode_tile_config, general_tile_config, tile_config, TileConfig, HEAD_DIMS, MAX_TILE_ROWS,
    PAGE_MULTIPLE,
};
use crate::params::{COMBINE_COLUMNS, COMBINE_WARPS};

/// The element type of q, k, v and o.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dtype {
    F16,
    Bf16,
}

impl Dtype {
    /// The name kernel names and error messages use: `f16` or `bf16`.
    pub const fn name(self) -> &'static str {
        match self {
            Dtype::F16 => "f16",
            Dtype::Bf16 => "bf16",
        }
    }
}

/// The attention kernels of one head dim and element type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Variant {
    /// `flash_fwd_d{D}_{E}_full`: dense, no mask.
    Full,
    /// `flash_fwd_d{D}_{E}_causal`: dense, bottom-right causal mask.
    Causal,
    /// `flash_fwd_d{D}_{E}_general`: every feature of
    /// [`ForwardParams`](crate::params::ForwardParams) at run time.
    General,
    /// `flash_fwd_d{D}_{E}_decode`: the general kernel with 16 query rows
    /// per CTA, whose warps split the keys, for a few queries against many
    /// keys.
    Decode,
}

impl Variant {
    /// Every variant.
    pub const ALL: [Variant; 4] = [Variant::Full, Variant::Causal, Variant::General, Variant::Decode];

    /// The variant's part of the kernel name.
    pub const fn suffix(self) -> &'static str {
        match self {
            Variant::Full => "full",
            Variant::Causal => "causal",
            Variant::General => "general",
            Variant::Decode => "decode",
        }
    }

    /// Whether the kernel reads every feature of the argument block (the
    /// general and decode kernels); the dense ones read its first part.
    pub const fn is_general(self) -> bool {
        matches!(self, Variant::General | Variant::Decode)
    }

    /// The tile config of this variant's kernels for `head_dim`.
    pub const fn tile_config(self, head_dim: u32) -> Option<TileConfig> {
        match self {
            Variant::Full => tile_config(head_dim),
            Variant::Causal => causal_tile_config(head_dim),
            Variant::General => general_tile_config(head_dim),
            Variant::Decode => decode_tile_config(head_dim),
        }
    }
}

/// One attention kernel of the module.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionKernel {
    /// The PTX entry point.
    pub name: &'static str,
    pub head_dim: u32,
    pub dtype: Dtype,
    pub variant: Variant,
    /// The tile configuration it was compiled with.
    pub config: TileConfig,
}

/// Calls `$callback!` with every attention kernel of the module, one
/// `(entry_point, head_dim, Dtype, Variant)` row each. The one list of
/// kernels: the device crate makes the entry points from it, this crate
/// [`ATTENTION_KERNELS`].
#[macro_export]
macro_rules! attention_kernels {
    ($callback:ident) => {
        $callback! {
            (flash_fwd_d32_f16_full, 32, F16, Full),
            (flash_fwd_d32_f16_causal, 32, F16, Causal),
            (flash_fwd_d32_f16_general, 32, F16, General),
            (flash_fwd_d32_f16_decode, 32, F16, Decode),
            (flash_fwd_d32_bf16_full, 32, Bf16, Full),
            (flash_fwd_d32_bf16_causal, 32, Bf16, Causal),
            (flash_fwd_d32_bf16_general, 32, Bf16, General),
            (flash_fwd_d32_bf16_decode, 32, Bf16, Decode),
            (flash_fwd_d64_f16_full, 64, F16, Full),
            (flash_fwd_d64_f16_causal, 64, F16, Causal),
            (flash_fwd_d64_f16_general, 64, F16, General),
            (flash_fwd_d64_f16_decode, 64, F16, Decode),
            (flash_fwd_d64_bf16_full, 64, Bf16, Full),
            (flash_fwd_d64_bf16_causal, 64, Bf16, Causal),
            (flash_fwd_d64_bf16_general, 64, Bf16, General),
            (flash_fwd_d64_bf16_decode, 64, Bf16, Decode),
            (flash_fwd_d96_f16_full, 96, F16, Full),
            (flash_fwd_d96_f16_causal, 96, F16, Causal),
            (flash_fwd_d96_f16_general, 96, F16, General),
            (flash_fwd_d96_f16_decode, 96, F16, Decode),
            (flash_fwd_d96_bf16_full, 96, Bf16, Full),
            (flash_fwd_d96_bf16_causal, 96, Bf16, Causal),
            (flash_fwd_d96_bf16_general, 96, Bf16, General),
            (flash_fwd_d96_bf16_decode, 96, Bf16, Decode),
            (flash_fwd_d128_f16_full, 128, F16, Full),
            (flash_fwd_d128_f16_causal, 128, F16, Causal),
            (flash_fwd_d128_f16_general, 128, F16, General),
            (flash_fwd_d128_f16_decode, 128, F16, Decode),
            (flash_fwd_d128_bf16_full, 128, Bf16, Full),
            (flash_fwd_d128_bf16_causal, 128, Bf16, Causal),
            (flash_fwd_d128_bf16_general, 128, Bf16, General),
            (flash_fwd_d128_bf16_decode, 128, Bf16, Decode),
            (flash_fwd_d160_f16_full, 160, F16, Full),
            (flash_fwd_d160_f16_causal, 160, F16, Causal),
            (flash_fwd_d160_f16_general, 160, F16, General),
            (flash_fwd_d160_f16_decode, 160, F16, Decode),
            (flash_fwd_d160_bf16_full, 160, Bf16, Full),
            (flash_fwd_d160_bf16_causal, 160, Bf16, Causal),
            (flash_fwd_d160_bf16_general, 160, Bf16, General),
            (flash_fwd_d160_bf16_decode, 160, Bf16, Decode),
            (flash_fwd_d192_f16_full, 192, F16, Full),
            (flash_fwd_d192_f16_causal, 192, F16, Causal),
            (flash_fwd_d192_f16_general, 192, F16, General),
            (flash_fwd_d192_f16_decode, 192, F16, Decode),
            (flash_fwd_d192_bf16_full, 192, Bf16, Full),
            (flash_fwd_d192_bf16_causal, 192, Bf16, Causal),
            (flash_fwd_d192_bf16_general, 192, Bf16, General),
            (flash_fwd_d192_bf16_decode, 192, Bf16, Decode),
            (flash_fwd_d224_f16_full, 224, F16, Full),
            (flash_fwd_d224_f16_causal, 224, F16, Causal),
            (flash_fwd_d224_f16_general, 224, F16, General),
            (flash_fwd_d224_f16_decode, 224, F16, Decode),
            (flash_fwd_d224_bf16_full, 224, Bf16, Full),
            (flash_fwd_d224_bf16_causal, 224, Bf16, Causal),
            (flash_fwd_d224_bf16_general, 224, Bf16, General),
            (flash_fwd_d224_bf16_decode, 224, Bf16, Decode),
            (flash_fwd_d256_f16_full, 256, F16, Full),
            (flash_fwd_d256_f16_causal, 256, F16, Causal),
            (flash_fwd_d256_f16_general, 256, F16, General),
            (flash_fwd_d256_f16_decode, 256, F16, Decode),
            (flash_fwd_d256_bf16_full, 256, Bf16, Full),
            (flash_fwd_d256_bf16_causal, 256, Bf16, Causal),
            (flash_fwd_d256_bf16_general, 256, Bf16, General),
            (flash_fwd_d256_bf16_decode, 256, Bf16, Decode),
        }
    };
}

/// The tile config of a row of the table; a missing one stops the build.
pub const fn config_of(head_dim: u32, variant: Variant) -> TileConfig {
    match variant.tile_config(head_dim) {
        Some(config) => config,
        None => panic!("an attention kernel of the table has no tile config"),
    }
}

macro_rules! kernel_table {
    ($(($name:ident, $head_dim:literal, $dtype:ident, $variant:ident)),* $(,)?) => {
        /// Every attention kernel of the module.
        pub const ATTENTION_KERNELS: &[AttentionKernel] = &[$(AttentionKernel {
            name: stringify!($name),
            head_dim: $head_dim,
            dtype: Dtype::$dtype,
            variant: Variant::$variant,
            config: config_of($head_dim, Variant::$variant),
        }),*];
    };
}

attention_kernels!(kernel_table);

/// The attention kernel of `head_dim`, `dtype` and `variant`, if the module has one.
pub fn attention_kernel(head_dim: u32, dtype: Dtype, variant: Variant) -> Option<&'static AttentionKernel> {
    ATTENTION_KERNELS.iter().find(|k| k.head_dim == head_dim && k.dtype == dtype && k.variant == variant)
}

/// The split-KV merge kernel of `dtype` ([`CombineParams`](crate::params::CombineParams)).
pub const fn combine_kernel(dtype: Dtype) -> &'static str {
    match dtype {
        Dtype::F16 => "flash_combine_f16",
        Dtype::Bf16 => "flash_combine_bf16",
    }
}

/// The KV cache append kernel ([`AppendParams`](crate::params::AppendParams)).
pub const APPEND_KERNEL: &str = "kv_cache_append";

/// Threads per block of the merge kernel: [`COMBINE_WARPS`] warps.
pub const COMBINE_THREADS: u32 = 32 * COMBINE_WARPS;

/// Threads per block of the append kernel.
pub const APPEND_THREADS: u32 = 128;

/// Dynamic shared memory a block of sm_80 and newer may have.
pub const MAX_DYNAMIC_SMEM: u32 = 163 * 1024;

/// The grid of an attention kernel of `config` over `query_rows` rows (the
/// longest sequence), `heads_q` heads and `batch` batches, its keys split
/// `num_splits` ways: `(num_splits * query blocks, heads_q, batch)`,
/// split-major along x. In u64: the host checks each against the launch
/// limits.
pub const fn forward_grid(config: &TileConfig, query_rows: u64, heads_q: u64, batch: u64, num_splits: u64) -> [u64; 3] {
    [query_rows.div_ceil(config.block_m as u64) * num_splits, heads_q, batch]
}

/// The grid (x) of the merge kernel for `rows` merged rows of `head_dim`:
/// one warp per (row, slice of [`COMBINE_COLUMNS`] columns).
pub const fn combine_grid(rows: u64, head_dim: u32) -> u64 {
    (rows * (head_dim / COMBINE_COLUMNS) as u64).div_ceil(COMBINE_WARPS as u64)
}

/// The grid of the append kernel: `(keys appended per batch, heads_kv, batch)`.
pub const fn append_grid(seqlen_new: u64, heads_kv: u64, batch: u64) -> [u64; 3] {
    [seqlen_new, heads_kv, batch]
}

// The invariants every kernel of the table keeps, checked as the crate builds.
const _: () = {
    let mut i = 0;
    while i < ATTENTION_KERNELS.len() {
        let c = ATTENTION_KERNELS[i].config;
        // A page of a paged cache holds whole key blocks.
        assert!(PAGE_MULTIPLE.is_multiple_of(c.block_n));
        assert!(c.block_m <= MAX_TILE_ROWS && c.block_n <= MAX_TILE_ROWS);
        assert!(c.smem_bytes() <= MAX_DYNAMIC_SMEM);
        assert!(c.head_dim == ATTENTION_KERNELS[i].head_dim && c.head_dim.is_multiple_of(32));
        // Each warp holds 16-row m-tiles of its own rows, or all share them.
        let row_sets = if c.warps_split_keys { 1 } else { c.warps };
        assert!(c.block_m == row_sets * 16 * c.m_tiles);
        i += 1;
    }
    // Every head dim has all four variants in both element types.
    assert!(ATTENTION_KERNELS.len() == HEAD_DIMS.len() * 4 * 2);
    // The merge's warps each take COMBINE_COLUMNS of a row.
    let mut d = 0;
    while d < HEAD_DIMS.len() {
        assert!(HEAD_DIMS[d].is_multiple_of(COMBINE_COLUMNS));
        d += 1;
    }
};

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::format;

    #[test]
    fn names_follow_head_dim_dtype_and_variant() {
        for k in ATTENTION_KERNELS {
            assert_eq!(k.name, format!("flash_fwd_d{}_{}_{}", k.head_dim, k.dtype.name(), k.variant.suffix()));
            assert_eq!(attention_kernel(k.head_dim, k.dtype, k.variant), Some(k));
        }
        for d in HEAD_DIMS {
            for dtype in [Dtype::F16, Dtype::Bf16] {
                for variant in Variant::ALL {
                    assert!(attention_kernel(d, dtype, variant).is_some(), "d={d} {dtype:?} {variant:?}");
                }
            }
        }
    }

    #[test]
    fn grids_cover_every_row_and_column() {
        let c = config_of(128, Variant::Full);
        assert_eq!(forward_grid(&c, 1000, 16, 2, 3), [1000u64.div_ceil(c.block_m as u64) * 3, 16, 2]);
        // 10 rows of d=128: 16 slices of 8 columns each, 4 warps per block.
        assert_eq!(combine_grid(10, 128), 40);
    }
}

//! What runs for a validated call, as pure functions of its kernel
//! arguments: the kernel (dense, general or decode), the split-KV factor,
//! the GQA decode layout, the grid, and the scratch memory the call needs.

use crate::config::{self, TileConfig};
use crate::error::{Error, Result};
use crate::params::{self, ForwardParams};

/// The most CTAs the keys of one query block are split among.
pub const MAX_SPLITS: usize = params::MAX_SPLITS as usize;

/// The fewest key blocks the heuristic leaves to each split, so that the
/// merge and the per-split prologue stay small beside the work.
pub const MIN_KEY_BLOCKS_PER_SPLIT: usize = 4;

/// A grid already this fraction of a wave full is not split (in fifths).
const FULL_WAVE_FIFTHS: usize = 4;

/// Largest grid x dimension of a launch.
const MAX_GRID_X: usize = i32::MAX as usize;

/// Most blocks of the split-KV merge: it numbers its warps in u32.
const MAX_COMBINE_BLOCKS: usize = (1 << 32) / params::COMBINE_WARPS as usize;

/// Alignment of each region of the scratch memory, in bytes.
const SCRATCH_ALIGN: usize = 256;

pub use flash_attn_abi::kernels::Variant as KernelVariant;

/// The tile config of `variant`'s kernels for `head_dim`.
pub(crate) fn variant_config(variant: KernelVariant, head_dim: usize) -> Result<TileConfig> {
    u32::try_from(head_dim).ok().and_then(|d| variant.tile_config(d)).ok_or(Error::UnsupportedHeadDim(head_dim))
}

/// How many CTAs to split the keys of each query block among, for a grid
/// of `ctas` CTAs (query blocks * heads * batch) over `key_blocks` key
/// blocks, on a GPU that runs `wave` such CTAs at once (SMs * CTAs per SM).
///
/// No split when the grid already fills 80% of a wave. Otherwise the
/// number of splits that brings the grid closest to whole waves, among the
/// two around one full wave, keeping at least [`MIN_KEY_BLOCKS_PER_SPLIT`]
/// key blocks per split and at most [`MAX_SPLITS`] splits; then the fewest
/// splits with the same key blocks per split, so no split is left empty.
pub fn num_splits_heuristic(ctas: usize, key_blocks: usize, wave: usize) -> usize {
    if ctas == 0 || wave == 0 || ctas.saturating_mul(5) >= wave.saturating_mul(FULL_WAVE_FIFTHS) {
        return 1;
    }
    let max_splits = (key_blocks / MIN_KEY_BLOCKS_PER_SPLIT).clamp(1, MAX_SPLITS);
    // The fraction of the last wave's slots that hold a CTA, for `splits` splits.
    let fill = |splits: usize| {
        let total = ctas.saturating_mul(splits);
        total as f64 / total.div_ceil(wave).saturating_mul(wave) as f64
    };
    let below = (wave / ctas).clamp(1, max_splits);
    let above = (below + 1).min(max_splits);
    let splits = if fill(above) > fill(below) { above } else { below };
    let blocks_per_split = key_blocks.div_ceil(splits).max(1);
    key_blocks.div_ceil(blocks_per_split).max(1)
}

/// Whether a call needs the general kernels: any feature beyond the dense
/// kernels' full and causal masks, or a split.
pub(crate) fn needs_general(args: &ForwardParams) -> bool {
    let dense_mask = args.window_left == -1 && (args.window_right == -1 || args.window_right == 0);
    !dense_mask
        || args.softcap_scale != 0.0
        || !args.alibi_slopes.is_null()
        || !args.cu_seqlens_q.is_null()
        || !args.cu_seqlens_k.is_null()
        || !args.seqused_k.is_null()
        || !args.block_table.is_null()
        || args.num_splits > 1
}

/// The GQA decode layout (FlashAttention-2's `seqlenq_ngroups_swapped`): a
/// single query row of `g = heads_q / heads_kv` heads per key/value head is
/// viewed as `g` rows of one head, so that each key/value head is read by
/// one CTA instead of `g`. Applies, and returns true, for one query row of
/// grouped heads without window, ALiBi or variable lengths, whose head
/// strides (the new row strides) are within the kernels' row strides;
/// causal masking is then void (the row sees every key) and is dropped.
pub(crate) fn swap_gqa_decode(args: &mut ForwardParams) -> bool {
    let groups = args.heads_per_kv;
    let applies = args.seqlen_q == 1
        && groups > 1
        && args.window_left == -1
        && (args.window_right == -1 || args.window_right == 0)
        && args.alibi_slopes.is_null()
        && args.cu_seqlens_q.is_null()
        && args.lse_head_stride == 1
        && args.q_head_stride <= config::MAX_ROW_STRIDE as i64
        && args.o_head_stride <= config::MAX_ROW_STRIDE as i64;
    if !applies {
        return false;
    }
    let g = groups as i64;
    args.seqlen_q = groups;
    args.heads_q /= groups;
    args.heads_per_kv = 1;
    args.q_row_stride = args.q_head_stride;
    args.q_head_stride *= g;
    args.o_row_stride = args.o_head_stride;
    args.o_head_stride *= g;
    // Row r of new head h is query head h * g + r: LSE at b * heads_q + h * g + r.
    args.lse_head_stride = g;
    args.window_right = -1;
    true
}

/// Byte offsets of the regions of a call's scratch memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ScratchLayout {
    /// `seqused_k`, i32 per batch (KV cache appends only).
    pub seqused_k: usize,
    /// `lse_partial`, f32 `[num_splits, batch, heads_q, seqlen_q]`.
    pub lse_partial: usize,
    /// `o_partial`, f32 `[num_splits, batch, heads_q, seqlen_q, head_dim]`.
    pub o_partial: usize,
    /// The whole scratch; 0 when the call needs none.
    pub bytes: usize,
}

impl ScratchLayout {
    /// Room for `seqused_len` i32 and, with more than one split, the partials.
    fn new(args: &ForwardParams, batch: usize, head_dim: usize, seqused_len: usize) -> Result<Self> {
        let overflow =
            || Error::TooLarge { what: "split-KV scratch bytes", value: usize::MAX, max: isize::MAX as usize };
        let round = |n: usize| n.checked_next_multiple_of(SCRATCH_ALIGN).ok_or_else(overflow);
        let seqused_bytes = round(seqused_len * 4)?;
        let (mut lse_bytes, mut o_bytes) = (0, 0);
        if args.num_splits > 1 {
            let rows = [args.num_splits as usize, batch, args.heads_q as usize, args.seqlen_q as usize]
                .into_iter()
                .try_fold(1usize, |n, d| n.checked_mul(d))
                .ok_or_else(overflow)?;
            // The kernels index the partial rows with 32-bit integers.
            if rows > u32::MAX as usize {
                return Err(Error::TooLarge { what: "split-KV partial rows", value: rows, max: u32::MAX as usize });
            }
            lse_bytes = round(rows.checked_mul(4).ok_or_else(overflow)?)?;
            o_bytes = round(rows.checked_mul(head_dim * 4).ok_or_else(overflow)?)?;
        }
        let lse_partial = seqused_bytes;
        let o_partial = lse_partial + lse_bytes;
        let bytes = o_partial.checked_add(o_bytes).ok_or_else(overflow)?;
        if bytes > isize::MAX as usize {
            return Err(overflow());
        }
        Ok(ScratchLayout { seqused_k: 0, lse_partial, o_partial, bytes })
    }
}

/// A validated call, ready to launch.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Plan {
    /// The arguments, GQA decode layout and split applied; the scratch
    /// pointers are set at launch.
    pub args: ForwardParams,
    pub variant: KernelVariant,
    pub config: TileConfig,
    pub grid: (u32, u32, u32),
    pub head_dim: usize,
    pub scratch: ScratchLayout,
    /// Grid x of the split-KV merge (0: no merge).
    pub combine_blocks: u32,
}

/// Chooses the kernel, the split and the grid of a call with the validated
/// arguments `args`: applies the GQA decode layout where
/// it helps, takes `num_splits` or the heuristic (with `wave` the CTAs of a
/// variant that the GPU runs at once), and lays out the scratch for the
/// partials and `seqused_len` sequence lengths to upload as `seqused_k`.
pub(crate) fn plan(
    mut args: ForwardParams,
    head_dim: usize,
    num_splits: Option<usize>,
    seqused_len: usize,
    wave: impl Fn(KernelVariant) -> usize,
) -> Result<Plan> {
    swap_gqa_decode(&mut args);
    let batch = args.batch as usize;
    let rows = args.seqlen_q as usize;
    let decode_rows = variant_config(KernelVariant::Decode, head_dim)?.block_m as usize;
    let split_variant = if rows <= decode_rows { KernelVariant::Decode } else { KernelVariant::General };
    let split_config = variant_config(split_variant, head_dim)?;
    let heads_q = args.heads_q as usize;
    let num_splits = num_splits.unwrap_or_else(|| {
        let ctas = rows.div_ceil(split_config.block_m as usize) * heads_q * batch;
        let key_blocks = (args.seqlen_k as usize).div_ceil(split_config.block_n as usize);
        num_splits_heuristic(ctas, key_blocks, wave(split_variant))
    });
    args.num_splits = num_splits as u32;
    // Uploaded lengths become `seqused_k` at launch: a general-kernel feature.
    let (variant, config) = if needs_general(&args) || seqused_len > 0 {
        (split_variant, split_config)
    } else {
        let dense = if args.window_right == 0 { KernelVariant::Causal } else { KernelVariant::Full };
        (dense, variant_config(dense, head_dim)?)
    };
    let grid_x = rows.div_ceil(config.block_m as usize) * num_splits;
    if grid_x > MAX_GRID_X {
        return Err(Error::TooLarge { what: "query blocks * num_splits", value: grid_x, max: MAX_GRID_X });
    }
    // First: it bounds the partial rows, which the merge counts below.
    let scratch = ScratchLayout::new(&args, batch, head_dim, seqused_len)?;
    let mut combine_blocks = 0;
    if num_splits > 1 {
        let merged_rows = rows * heads_q * batch;
        combine_blocks = flash_attn_abi::kernels::combine_grid(merged_rows as u64, head_dim as u32) as usize;
        // The merge numbers its warps (block * COMBINE_WARPS + warp) in u32.
        if combine_blocks > MAX_COMBINE_BLOCKS {
            return Err(Error::TooLarge {
                what: "split-KV merge blocks",
                value: combine_blocks,
                max: MAX_COMBINE_BLOCKS,
            });
        }
    }
    Ok(Plan {
        args,
        variant,
        config,
        grid: (grid_x as u32, heads_q as u32, batch as u32),
        head_dim,
        scratch,
        combine_blocks: combine_blocks as u32,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::{ForwardSizes, TensorArg};

    /// H100: 132 SMs; say 6 decode CTAs or 2 prefill CTAs per SM.
    fn h100(variant: KernelVariant) -> usize {
        match variant {
            KernelVariant::Decode => 132 * 6,
            _ => 132 * 2,
        }
    }

    /// Contiguous q/o `[batch, seqlen_q, heads_q, d]`, k/v `[batch, seqlen_k, heads_kv, d]`.
    fn args(
        batch: usize,
        seqlen_q: usize,
        seqlen_k: usize,
        heads_q: usize,
        heads_kv: usize,
        d: usize,
    ) -> ForwardParams {
        let arg = |s: usize, h: usize| TensorArg {
            ptr: 4096 as *const u16,
            strides: [(s * h * d) as i64, (h * d) as i64, d as i64],
        };
        let o = TensorArg { ptr: 8192 as *mut u16, strides: arg(seqlen_q, heads_q).strides };
        let sizes = ForwardSizes {
            batch: batch as u32,
            seqlen_q: seqlen_q as u32,
            seqlen_k: seqlen_k as u32,
            heads_q: heads_q as u32,
            heads_per_kv: (heads_q / heads_kv) as u32,
        };
        ForwardParams::new(
            arg(seqlen_q, heads_q),
            arg(seqlen_k, heads_kv),
            arg(seqlen_k, heads_kv),
            o,
            64 as *mut f32,
            sizes,
            0.1,
        )
    }

    #[test]
    fn heuristic_does_not_split_a_grid_that_fills_most_of_a_wave() {
        assert_eq!(num_splits_heuristic(792, 4096, 792), 1);
        assert_eq!(num_splits_heuristic(634, 4096, 792), 1); // 80%
        assert_eq!(num_splits_heuristic(10_000, 4096, 792), 1);
        // Between half a wave and 80%, two splits fill no more of their
        // waves than one does.
        assert_eq!(num_splits_heuristic(600, 4096, 792), 1);
        assert_eq!(num_splits_heuristic(300, 4096, 792), 2);
    }

    #[test]
    fn heuristic_fills_about_one_wave() {
        // Decode, batch 64 of 4 KV heads (GQA layout): 256 CTAs, 792 slots.
        // 3 splits fill 97% of one wave; 4 would start a second wave at 29%.
        assert_eq!(num_splits_heuristic(256, 512, 792), 3);
        // Batch 16: 64 CTAs, 12 splits fill 97%.
        assert_eq!(num_splits_heuristic(64, 512, 792), 12);
        // Batch 1: 4 CTAs would need 198 splits; capped at 128.
        assert_eq!(num_splits_heuristic(4, 2048, 792), MAX_SPLITS);
    }

    #[test]
    fn heuristic_keeps_enough_key_blocks_per_split() {
        // 32 key blocks leave at most 8 splits of 4 blocks.
        assert_eq!(num_splits_heuristic(4, 32, 792), 8);
        // Fewer than 8 key blocks: no split.
        assert_eq!(num_splits_heuristic(4, 7, 792), 1);
        assert_eq!(num_splits_heuristic(4, 0, 792), 1);
        for key_blocks in 0..600 {
            for ctas in [1, 3, 17, 100, 400] {
                let splits = num_splits_heuristic(ctas, key_blocks, 792);
                assert!((1..=MAX_SPLITS).contains(&splits));
                assert!(splits == 1 || key_blocks / splits >= MIN_KEY_BLOCKS_PER_SPLIT, "{ctas} {key_blocks}");
                // No empty split: the last one gets at least one block.
                assert!(key_blocks.div_ceil(key_blocks.div_ceil(splits).max(1)) >= splits.min(key_blocks));
            }
        }
    }

    #[test]
    fn heuristic_leaves_no_split_empty() {
        // 9 key blocks wanted in 2 splits -> 5 + 4; 41 blocks in 10 -> 5 each
        // over 9 splits (ceil(41 / 10) = 5 blocks, 9 splits cover them).
        assert_eq!(num_splits_heuristic(100, 9, 792), 2);
        assert_eq!(num_splits_heuristic(79, 41, 792), 9);
    }

    #[test]
    fn dense_calls_without_features_run_the_dense_kernels() {
        // 4 query blocks * 8 heads * 16 batches = 512 CTAs: no split.
        let plan = plan(args(16, 1000, 1000, 8, 8, 128), 128, None, 0, h100).unwrap();
        assert_eq!(plan.variant, KernelVariant::Full);
        assert_eq!(plan.grid, (4, 8, 16)); // ceil(1000 / 256) query blocks
        assert_eq!(plan.args.num_splits, 1);
        assert_eq!(plan.scratch.bytes, 0);
        assert_eq!(plan.combine_blocks, 0);
        assert_eq!(plan.config, config::tile_config(128).unwrap());
        let mut causal = args(16, 1000, 1000, 8, 8, 128);
        causal.window_right = 0;
        let causal_plan = super::plan(causal, 128, None, 0, h100).unwrap();
        assert_eq!(causal_plan.variant, KernelVariant::Causal);
        // The causal kernels' own shape: the launch's shared memory must be
        // theirs (at d=64, one K/V stage against the dense kernels' two).
        assert_eq!(causal_plan.config, config::causal_tile_config(128).unwrap());
        assert_eq!(causal_plan.grid, (8, 8, 16)); // ceil(1000 / 128): 4 warps, not the dense 8
        let mut causal_64 = args(16, 1000, 1000, 8, 8, 64);
        causal_64.window_right = 0;
        let causal_64_plan = super::plan(causal_64, 64, None, 0, h100).unwrap();
        let dense_64_plan = super::plan(args(16, 1000, 1000, 8, 8, 64), 64, None, 0, h100).unwrap();
        assert_eq!(causal_64_plan.variant, KernelVariant::Causal);
        assert_eq!(causal_64_plan.config, config::causal_tile_config(64).unwrap());
        assert!(causal_64_plan.config.smem_bytes() < dense_64_plan.config.smem_bytes());
        // Forced not to split, a small grid stays dense too.
        assert_eq!(
            super::plan(ForwardParams { batch: 1, ..causal }, 128, Some(1), 0, h100).unwrap().variant,
            KernelVariant::Causal
        );
    }

    #[test]
    fn a_small_dense_grid_over_many_keys_is_split_on_the_general_kernel() {
        // 8 query blocks * 8 heads * 2 batches = 128 CTAs of 264 slots; 32
        // key blocks allow 8 splits; 2 fill 97% of a wave.
        let plan = plan(args(2, 1000, 1000, 8, 8, 128), 128, None, 0, h100).unwrap();
        assert_eq!(plan.variant, KernelVariant::General);
        assert_eq!(plan.args.num_splits, 2);
        assert_eq!(plan.grid, (16, 8, 2));
        assert_eq!(plan.combine_blocks as usize, (2 * 8 * 1000 * 128 / 8usize).div_ceil(4));
    }

    #[test]
    fn features_select_the_general_or_decode_kernel_by_rows() {
        let mut windowed = args(2, 1000, 1000, 8, 8, 64);
        windowed.window_left = 256;
        let general = plan(windowed, 64, Some(1), 0, h100).unwrap();
        assert_eq!(general.variant, KernelVariant::General);
        assert_eq!(general.config, config::general_tile_config(64).unwrap());
        let mut short = args(2, 16, 1000, 8, 8, 64);
        short.softcap_scale = 0.1;
        let decode = plan(short, 64, Some(1), 0, h100).unwrap();
        assert_eq!(decode.variant, KernelVariant::Decode);
        assert_eq!(decode.config, config::decode_tile_config(64).unwrap());
        assert_eq!(decode.grid, (1, 8, 2));
        let mut seventeen = short;
        seventeen.seqlen_q = 17;
        assert_eq!(super::plan(seventeen, 64, Some(1), 0, h100).unwrap().variant, KernelVariant::General);
    }

    #[test]
    fn splits_multiply_grid_x_and_lay_out_the_partials() {
        let plan = plan(args(3, 200, 5000, 4, 4, 128), 128, Some(3), 0, h100).unwrap();
        assert_eq!(plan.variant, KernelVariant::General);
        assert_eq!(plan.args.num_splits, 3);
        assert_eq!(plan.grid, (3 * 2, 4, 3));
        let rows = 3 * 3 * 4 * 200usize;
        assert_eq!(plan.scratch.lse_partial, 0);
        assert_eq!(plan.scratch.o_partial, (rows * 4).next_multiple_of(256));
        assert_eq!(plan.scratch.bytes, plan.scratch.o_partial + rows * 128 * 4);
        assert_eq!(plan.combine_blocks as usize, (3 * 4 * 200 * 128 / 8usize).div_ceil(4));
    }

    #[test]
    fn the_heuristic_splits_a_small_grid_over_many_keys() {
        // One query row, MHA (no GQA layout), 16k keys: 2 * 8 CTAs.
        let plan = plan(args(2, 1, 16384, 8, 8, 128), 128, None, 0, h100).unwrap();
        assert_eq!(plan.variant, KernelVariant::Decode);
        let key_blocks = 16384 / config::decode_tile_config(128).unwrap().block_n as usize;
        assert_eq!(plan.args.num_splits as usize, num_splits_heuristic(16, key_blocks, 132 * 6));
        assert!(plan.args.num_splits > 1);
    }

    #[test]
    fn gqa_decode_views_query_heads_as_rows_of_their_kv_head() {
        // q [4, 1, 32, 128] over 4 KV heads: g = 8.
        let mut causal = args(4, 1, 4096, 32, 4, 128);
        causal.window_right = 0;
        let plan = plan(causal, 128, Some(1), 0, h100).unwrap();
        let a = plan.args;
        assert_eq!((a.seqlen_q, a.heads_q, a.heads_per_kv), (8, 4, 1));
        assert_eq!((a.q_batch_stride, a.q_row_stride, a.q_head_stride), (32 * 128, 128, 8 * 128));
        assert_eq!((a.o_batch_stride, a.o_row_stride, a.o_head_stride), (32 * 128, 128, 8 * 128));
        // Key/value strides are untouched.
        assert_eq!((a.k_batch_stride, a.k_row_stride, a.k_head_stride), (4096 * 4 * 128, 4 * 128, 128));
        // LSE [4, 32, 1]: row r of KV head h is query head h * 8 + r.
        assert_eq!((a.lse_batch_stride, a.lse_head_stride), (32, 8));
        // The one row sees every key: the causal mask is dropped.
        assert_eq!((a.window_left, a.window_right), (-1, -1));
        // 8 rows fit the decode kernel's 16; no feature, no split: dense.
        assert_eq!(plan.variant, KernelVariant::Full);
        assert_eq!(plan.grid, (1, 4, 4));
    }

    #[test]
    fn gqa_decode_layout_maps_every_query_head_to_its_own_slot() {
        let (heads_q, heads_kv, d) = (12usize, 3usize, 64usize);
        let mut a = args(1, 1, 100, heads_q, heads_kv, d);
        assert!(swap_gqa_decode(&mut a));
        let g = heads_q / heads_kv;
        let mut q_seen = vec![false; heads_q];
        let mut lse_seen = vec![false; heads_q];
        for h in 0..a.heads_q as i64 {
            for r in 0..a.seqlen_q as i64 {
                let q = (r * a.q_row_stride + h * a.q_head_stride) as usize / d;
                let lse = (h * a.lse_head_stride + r) as usize;
                // The KV head of the new head h must be the original head's.
                assert_eq!(q / g, h as usize);
                assert_eq!(q, lse);
                q_seen[q] = true;
                lse_seen[lse] = true;
            }
        }
        assert!(q_seen.iter().all(|&s| s) && lse_seen.iter().all(|&s| s));
    }

    #[test]
    fn gqa_decode_layout_only_where_it_is_exact() {
        let swapped = |f: &dyn Fn(&mut ForwardParams)| {
            let mut a = args(1, 1, 100, 8, 2, 64);
            f(&mut a);
            swap_gqa_decode(&mut a)
        };
        assert!(swapped(&|_| {}));
        assert!(swapped(&|a| a.softcap_scale = 0.5));
        assert!(!swapped(&|a| a.window_left = 10));
        assert!(!swapped(&|a| a.window_right = 3));
        assert!(!swapped(&|a| a.alibi_slopes = 256 as *const f32));
        assert!(!swapped(&|a| a.cu_seqlens_q = 256 as *const i32));
        // Heads too far apart to be the kernels' rows.
        let past = config::MAX_ROW_STRIDE as i64 + 8;
        assert!(swapped(&|a| a.q_head_stride = past - 8));
        assert!(!swapped(&|a| a.q_head_stride = past));
        assert!(!swapped(&|a| a.o_head_stride = past));
        let mut two_rows = args(1, 2, 100, 8, 2, 64);
        assert!(!swap_gqa_decode(&mut two_rows));
        let mut mha = args(1, 1, 100, 8, 8, 64);
        assert!(!swap_gqa_decode(&mut mha));
    }

    #[test]
    fn lengths_uploaded_at_launch_need_the_general_kernels() {
        // A KV cache append with no other feature: seqused_k is still null
        // when planning, but the dense kernels would ignore it.
        let plan = plan(args(3, 1, 1000, 8, 8, 64), 64, Some(1), 3, h100).unwrap();
        assert_eq!(plan.variant, KernelVariant::Decode);
        let plan = super::plan(args(3, 40, 1000, 8, 8, 64), 64, Some(1), 3, h100).unwrap();
        assert_eq!(plan.variant, KernelVariant::General);
    }

    #[test]
    fn scratch_holds_uploaded_lengths_before_the_partials() {
        let plan = plan(args(5, 1, 3000, 8, 8, 64), 64, Some(2), 5, h100).unwrap();
        assert_eq!(plan.scratch.seqused_k, 0);
        assert_eq!(plan.scratch.lse_partial, 256);
        let rows = 2 * 5 * 8usize;
        assert_eq!(plan.scratch.o_partial, 256 + (rows * 4).next_multiple_of(256));
        assert_eq!(plan.scratch.bytes, plan.scratch.o_partial + (rows * 64 * 4).next_multiple_of(256));
        let unsplit = super::plan(args(5, 1, 3000, 8, 8, 64), 64, Some(1), 5, h100).unwrap();
        assert_eq!(unsplit.scratch.bytes, 256);
    }

    #[test]
    fn partial_rows_past_32_bit_indices_are_refused() {
        // 128 splits * 2^10 batches * 2^15 rows * 1 head = 2^32 rows.
        let long = args(1 << 10, 1 << 15, 1 << 20, 1, 1, 64);
        let err = plan(long, 64, Some(MAX_SPLITS), 0, h100).unwrap_err();
        assert!(matches!(err, Error::TooLarge { what: "split-KV partial rows", .. }), "{err}");
        assert!(plan(ForwardParams { batch: (1 << 10) - 1, ..long }, 64, Some(MAX_SPLITS), 0, h100).is_ok());
    }

    #[test]
    fn merge_warps_past_32_bit_indices_are_refused() {
        // d = 256: 32 warps per merged row. 2^27 rows are 2^32 warps, the
        // merge's u32 warp index's range; one row more is past it.
        let rows = 1 << 27;
        let plan_of = |rows| plan(args(1, rows, 64, 1, 1, 256), 256, Some(2), 0, h100);
        assert_eq!(plan_of(rows).unwrap().combine_blocks, 1 << 30);
        let err = plan_of(rows + 1).unwrap_err();
        assert_eq!(err, Error::TooLarge { what: "split-KV merge blocks", value: (1 << 30) + 8, max: 1 << 30 });
    }

    #[test]
    fn partial_rows_are_bounded_before_the_merge_counts_them() {
        // 2^63 rows of 32 merge warps each would overflow the count.
        let huge = args(65_535, crate::MAX_SEQLEN, 64, 65_535, 65_535, 256);
        let err = plan(huge, 256, Some(2), 0, h100).unwrap_err();
        assert!(matches!(err, Error::TooLarge { what: "split-KV partial rows", .. }), "{err}");
    }

    #[test]
    fn the_heuristic_takes_any_sizes() {
        for (ctas, key_blocks, wave) in
            [(1 << 61, 4096, usize::MAX), (usize::MAX, usize::MAX, usize::MAX), (1, usize::MAX, 2)]
        {
            assert!((1..=MAX_SPLITS).contains(&num_splits_heuristic(ctas, key_blocks, wave)));
        }
    }

    #[test]
    fn grids_past_the_launch_limit_are_refused() {
        let huge = args(1, i32::MAX as usize, 64, 1, 1, 64);
        let err = plan(huge, 64, Some(MAX_SPLITS), 0, h100).unwrap_err();
        assert!(matches!(err, Error::TooLarge { what: "query blocks * num_splits", .. }), "{err}");
    }
}

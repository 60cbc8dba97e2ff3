//! The sm_80 forward plan, which every GPU of compute capability 8.0 and up
//! runs: the kernel of the ABI's table (dense, general or decode), the
//! split-KV factor, the GQA decode layout, the grid, the scratch, and the
//! launches (the KV cache append, the attention, the split-KV merge).

use flash_attn_abi::config::MAX_ROW_STRIDE;
use flash_attn_abi::kernels::{
    attention_kernel, combine_grid, AttentionKernel, Variant, APPEND_THREADS, COMBINE_THREADS,
};
use flash_attn_abi::params::{CombineParams, ForwardParams, COMBINE_WARPS};

use super::kernels::{Kernel, KernelArgs, Launch, OutputAddrs, SCRATCH_ALIGN};
use super::params::{forward_params, needs_general};
use crate::call::{Append, CacheLengths, Call, Mask, Sequences};
use crate::error::{Error, Result};
use crate::limits::MAX_SPLITS;

/// The fewest key blocks the heuristic leaves to each split, so that the
/// merge and the per-split prologue stay small beside the work.
pub const MIN_KEY_BLOCKS_PER_SPLIT: usize = 4;

/// A grid already this fraction of a wave full is not split (in fifths).
const FULL_WAVE_FIFTHS: usize = 4;

/// Largest grid x dimension of a launch.
const MAX_GRID_X: usize = i32::MAX as usize;

/// Most blocks of the split-KV merge: it numbers its warps in u32.
const MAX_COMBINE_BLOCKS: usize = (1 << 32) / COMBINE_WARPS as usize;

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
        total as f64 / (total.div_ceil(wave).saturating_mul(wave)) as f64
    };
    let below = (wave / ctas).clamp(1, max_splits);
    let above = (below + 1).min(max_splits);
    let splits = if fill(above) > fill(below) { above } else { below };
    let blocks_per_split = key_blocks.div_ceil(splits).max(1);
    key_blocks.div_ceil(blocks_per_split).max(1)
}

/// Whether the GQA decode layout (FlashAttention-2's
/// `seqlenq_ngroups_swapped`) applies: a single query row of `g = heads_q /
/// heads_kv` grouped heads is viewed as `g` rows of one head, so that each
/// key/value head is read by one CTA instead of `g`. It is exact for one
/// query row without window or ALiBi, dense or over a cache, whose head
/// strides (the new row strides) are within the kernels' row strides; the
/// one row sees every key, so a causal mask is void and dropped.
fn gqa_decode_applies(call: &Call) -> bool {
    let p = &call.problem;
    p.seqlen_q == 1
        && p.heads_q > p.heads_kv
        && matches!(call.mask, Mask::None | Mask::Causal)
        && call.alibi.is_none()
        && !matches!(call.sequences, Sequences::Packed { .. })
        && call.lse.head_stride == 1
        && call.q.strides[2] <= MAX_ROW_STRIDE as i64
        && call.o_strides[2] <= MAX_ROW_STRIDE as i64
}

/// Views `args` in the GQA decode layout ([`gqa_decode_applies`]).
fn swap_gqa_decode(args: &mut ForwardParams) {
    let g = args.heads_per_kv as i64;
    args.seqlen_q = args.heads_per_kv;
    args.heads_q /= args.heads_per_kv;
    args.heads_per_kv = 1;
    args.q_row_stride = args.q_head_stride;
    args.q_head_stride *= g;
    args.o_row_stride = args.o_head_stride;
    args.o_head_stride *= g;
    // Row r of new head h is query head h * g + r: LSE at b * heads_q + h * g + r.
    args.lse_head_stride = g;
    args.window_right = -1;
}

/// Whether `call` is a decode call, which the sm_80 decode kernels take on
/// every GPU: at most one decode block (16) of query rows per head, or one
/// query row of grouped heads that the GQA decode layout turns into rows.
/// (Also where the head dim has no decode kernel: [`plan`] then refuses it.)
pub fn is_decode(call: &Call) -> bool {
    let decode =
        u32::try_from(call.problem.head_dim).ok().and_then(|d| attention_kernel(d, call.dtype, Variant::Decode));
    decode.is_none_or(|k| call.problem.seqlen_q <= k.config.block_m as usize) || gqa_decode_applies(call)
}

/// Byte offsets of the regions of a call's scratch memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScratchLayout {
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
    fn new(args: &ForwardParams, head_dim: usize, seqused_len: usize) -> Result<Self> {
        let overflow =
            || Error::TooLarge { what: "split-KV scratch bytes", value: usize::MAX, max: isize::MAX as usize };
        let round = |n: usize| n.checked_next_multiple_of(SCRATCH_ALIGN).ok_or_else(overflow);
        let seqused_bytes = round(seqused_len * 4)?;
        let (mut lse_bytes, mut o_bytes) = (0, 0);
        if args.num_splits > 1 {
            let rows = [args.num_splits as usize, args.batch as usize, args.heads_q as usize, args.seqlen_q as usize]
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
        let bytes = o_partial.checked_add(o_bytes).filter(|&n| n <= isize::MAX as usize).ok_or_else(overflow)?;
        Ok(ScratchLayout { seqused_k: 0, lse_partial, o_partial, bytes })
    }
}

/// An sm_80 forward plan: its kernels' launches with their argument
/// blocks, less the output and scratch addresses that
/// [`Sm80Plan::launches`] binds.
#[derive(Clone, Debug)]
pub struct Sm80Plan {
    /// The attention kernel.
    pub kernel: &'static AttentionKernel,
    /// Its grid: `(num_splits * query blocks, heads, batch)`.
    pub grid: [u32; 3],
    /// Its arguments, GQA decode layout and split applied.
    pub args: ForwardParams,
    /// The append that runs before it, if any.
    pub append: Option<Append>,
    /// Grid x of the split-KV merge that runs after it (0: no merge).
    pub combine_blocks: u32,
    /// The scratch memory the call needs.
    pub scratch: ScratchLayout,
    /// Lengths to upload to the scratch's `seqused_k` before the kernels.
    pub upload: Vec<i32>,
}

/// Plans `call` on the sm_80 kernels: the GQA decode layout where it
/// applies, the split (`call.num_splits` or the heuristic, with `wave` the
/// CTAs of a kernel that the GPU runs at once), the kernel, the grid and
/// the scratch.
pub fn plan(call: &Call, wave: impl Fn(&AttentionKernel) -> usize) -> Result<Sm80Plan> {
    let head_dim = call.problem.head_dim;
    let kernel_of = |variant| {
        u32::try_from(head_dim)
            .ok()
            .and_then(|d| attention_kernel(d, call.dtype, variant))
            .ok_or(Error::UnsupportedHeadDim(head_dim))
    };
    let mut args = forward_params(call);
    let swapped = gqa_decode_applies(call);
    if swapped {
        swap_gqa_decode(&mut args);
    }
    let batch = args.batch as usize;
    let rows = args.seqlen_q as usize;
    let heads_q = args.heads_q as usize;
    let decode = kernel_of(Variant::Decode)?;
    let split_kernel = if rows <= decode.config.block_m as usize { decode } else { kernel_of(Variant::General)? };
    let num_splits = match call.num_splits {
        Some(n) => n,
        None => {
            let ctas =
                rows.div_ceil(split_kernel.config.block_m as usize).saturating_mul(heads_q).saturating_mul(batch);
            let key_blocks = (args.seqlen_k as usize).div_ceil(split_kernel.config.block_n as usize);
            num_splits_heuristic(ctas, key_blocks, wave(split_kernel))
        }
    };
    args.num_splits = num_splits as u32;
    // The causal mask of a swapped call is void: the dense kernel without it.
    let kernel = if needs_general(call) || num_splits > 1 {
        split_kernel
    } else if call.mask == Mask::Causal && !swapped {
        kernel_of(Variant::Causal)?
    } else {
        kernel_of(Variant::Full)?
    };
    let grid_x = rows.div_ceil(kernel.config.block_m as usize).saturating_mul(num_splits);
    if grid_x > MAX_GRID_X {
        return Err(Error::TooLarge { what: "query blocks * num_splits", value: grid_x, max: MAX_GRID_X });
    }
    let upload = match &call.sequences {
        Sequences::Cache { lengths: CacheLengths::Upload(lengths), .. } => lengths.clone(),
        _ => Vec::new(),
    };
    // First: it bounds the partial rows, which the merge counts below.
    let scratch = ScratchLayout::new(&args, head_dim, upload.len())?;
    let mut combine_blocks = 0;
    if num_splits > 1 {
        let merged_rows = rows * heads_q * batch;
        combine_blocks = combine_grid(merged_rows as u64, head_dim as u32) as usize;
        // The merge numbers its warps (block * COMBINE_WARPS + warp) in u32.
        if combine_blocks > MAX_COMBINE_BLOCKS {
            return Err(Error::TooLarge {
                what: "split-KV merge blocks",
                value: combine_blocks,
                max: MAX_COMBINE_BLOCKS,
            });
        }
    }
    Ok(Sm80Plan {
        kernel,
        grid: [grid_x as u32, heads_q as u32, batch as u32],
        args,
        append: call.append,
        combine_blocks: combine_blocks as u32,
        scratch,
        upload,
    })
}

impl Sm80Plan {
    /// The launches of the call, in order (the append, the attention, the
    /// split-KV merge), with the outputs at `outputs` and the scratch
    /// memory at `scratch` (at least [`ScratchLayout::bytes`], 256-byte
    /// aligned, the uploaded lengths already written there).
    pub fn launches(&self, outputs: OutputAddrs, scratch: u64) -> Vec<Launch> {
        let mut args = self.args;
        args.o = outputs.o as *mut u16;
        args.lse = outputs.lse as *mut f32;
        if !self.upload.is_empty() {
            args.seqused_k = (scratch + self.scratch.seqused_k as u64) as *const i32;
        }
        if args.num_splits > 1 {
            args.lse_partial = (scratch + self.scratch.lse_partial as u64) as *mut f32;
            args.o_partial = (scratch + self.scratch.o_partial as u64) as *mut f32;
        }
        let mut launches = Vec::with_capacity(3);
        if let Some(append) = &self.append {
            launches.push(Launch {
                kernel: Kernel::Append,
                grid: append.grid,
                threads: APPEND_THREADS,
                smem_bytes: 0,
                args: KernelArgs::Append(append.params),
            });
        }
        let config = self.kernel.config;
        launches.push(Launch {
            kernel: Kernel::Attention(self.kernel),
            grid: self.grid,
            threads: config.threads(),
            smem_bytes: config.smem_bytes(),
            args: KernelArgs::Forward(args),
        });
        if args.num_splits > 1 {
            launches.push(Launch {
                kernel: Kernel::Combine(self.kernel.dtype),
                grid: [self.combine_blocks, 1, 1],
                threads: COMBINE_THREADS,
                smem_bytes: 0,
                args: KernelArgs::Combine(CombineParams::of(&args, self.kernel.head_dim)),
            });
        }
        launches
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::call::Alibi;
    use crate::plan::tests::call;

    #[test]
    fn gqa_decode_layout_maps_every_query_head_to_its_own_slot() {
        let (heads_q, heads_kv, d) = (12usize, 3usize, 64usize);
        let c = call(1, 1, 100, heads_q, heads_kv, d);
        assert!(gqa_decode_applies(&c));
        let mut a = forward_params(&c);
        swap_gqa_decode(&mut a);
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
        let applies = |f: &dyn Fn(&mut Call)| {
            let mut c = call(1, 1, 100, 8, 2, 64);
            f(&mut c);
            gqa_decode_applies(&c)
        };
        assert!(applies(&|_| {}));
        assert!(applies(&|c| c.softcap = Some(2.0)));
        assert!(applies(&|c| c.mask = Mask::Causal));
        assert!(!applies(&|c| c.mask = Mask::Window { left: Some(10), right: None }));
        assert!(!applies(&|c| c.mask = Mask::Window { left: None, right: Some(3) }));
        assert!(!applies(&|c| c.alibi = Some(Alibi { addr: 256, batch_stride: 0 })));
        assert!(!applies(&|c| {
            c.sequences = Sequences::Packed { cu_seqlens_q: 256, cu_seqlens_k: 512, total_q: 2000, total_k: 2000 }
        }));
        // Heads too far apart to be the kernels' rows.
        let past = MAX_ROW_STRIDE as i64 + 8;
        assert!(applies(&|c| c.q.strides[2] = past - 8));
        assert!(!applies(&|c| c.q.strides[2] = past));
        assert!(!applies(&|c| c.o_strides[2] = past));
        assert!(!gqa_decode_applies(&call(1, 2, 100, 8, 2, 64)));
        assert!(!gqa_decode_applies(&call(1, 1, 100, 8, 8, 64)));
    }
}

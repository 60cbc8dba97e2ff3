//! The second kernel of split-KV decoding: merges the splits' partial
//! outputs of each query row by their log-sum-exps,
//! `O = sum_s exp(lse_s - lse) O_s` with `lse = log sum_s exp(lse_s)`.
//! One warp per row; lanes stride over the splits, then over head_dim.

use crate::arch;
use crate::element::Element;
use crate::params::CombineParams;

/// Warps per block of the combine kernel (its launch: 32 times as many
/// threads, grid x = `ceil(rows / COMBINE_WARPS)`).
pub const COMBINE_WARPS: u32 = 4;

/// The combine kernel body.
///
/// # Safety
/// `params` describes the partial buffers the forward call wrote and the
/// outputs it would have written; launched as [`COMBINE_WARPS`] says.
#[inline(always)]
pub unsafe fn combine_splits<E: Element>(params: &CombineParams) {
    let tid = arch::thread_idx_x();
    let lane = tid % 32;
    let rows_per_split = params.batch * params.heads_q * params.seqlen_q;
    let row = arch::block_idx_x() * COMBINE_WARPS + tid / 32;
    if row >= rows_per_split {
        return; // the whole warp: one row per warp
    }
    core::hint::assert_unchecked(params.seqlen_q != 0 && params.heads_q != 0);
    let (batch, head, r) =
        (row / params.seqlen_q / params.heads_q, row / params.seqlen_q % params.heads_q, row % params.seqlen_q);
    // Where the batch's rows start in o: a batch stride, or (packed) a first token.
    let (mut seqlen_q, mut first_token, mut o_batch_offset) =
        (params.seqlen_q, 0i64, batch as i64 * params.o_batch_stride);
    if !params.cu_seqlens_q.is_null() {
        first_token = arch::ld_global_i32(params.cu_seqlens_q.add(batch as usize)) as i64;
        o_batch_offset = 0;
        seqlen_q = (arch::ld_global_i32(params.cu_seqlens_q.add(batch as usize + 1)) as i64 - first_token) as u32;
    }
    if r >= seqlen_q {
        return; // past this batch's queries
    }
    let partial = |split: u32| (split * rows_per_split + row) as usize;

    // The largest split LSE, then the sum of the splits' weights against it.
    let mut max = f32::NEG_INFINITY;
    let mut split = lane;
    while split < params.num_splits {
        max = max.max(arch::ld_global_f32(params.lse_partial.add(partial(split))));
        split += 32;
    }
    for mask in [16, 8, 4, 2, 1] {
        max = max.max(arch::shfl_xor_f32(max, mask));
    }
    let log2e = core::f32::consts::LOG2_E;
    // A row no split saw a key of: O = 0 and LSE = -inf.
    let shift = if max == f32::NEG_INFINITY { 0.0 } else { max * log2e };
    let mut sum = 0.0;
    let mut split = lane;
    while split < params.num_splits {
        sum += arch::exp2(arch::fma(arch::ld_global_f32(params.lse_partial.add(partial(split))), log2e, -shift));
        split += 32;
    }
    for mask in [16, 8, 4, 2, 1] {
        sum += arch::shfl_xor_f32(sum, mask);
    }
    let lse = if sum > 0.0 { max + arch::log2(sum) * core::f32::consts::LN_2 } else { f32::NEG_INFINITY };
    let lse_shift = if sum > 0.0 { lse * log2e } else { 0.0 };

    // Each lane takes pairs of columns 2 lane, 2 lane + 64, ...
    let o = params.o.offset(
        (o_batch_offset + (first_token + r as i64) * params.o_row_stride + head as i64 * params.o_head_stride) as isize,
    );
    let mut column = 2 * lane;
    while column < params.head_dim {
        let (mut lo, mut hi) = (0.0f32, 0.0f32);
        for split in 0..params.num_splits {
            let weight =
                arch::exp2(arch::fma(arch::ld_global_f32(params.lse_partial.add(partial(split))), log2e, -lse_shift));
            let from = params.o_partial.add(partial(split) * params.head_dim as usize + column as usize);
            lo = arch::fma(weight, arch::ld_global_f32(from), lo);
            hi = arch::fma(weight, arch::ld_global_f32(from.add(1)), hi);
        }
        arch::st_global_u32(o.add(column as usize) as *mut u32, E::pack(lo, hi));
        column += 64;
    }
    if lane == 0 {
        let lse_at =
            (batch as i64) * params.lse_batch_stride + head as i64 * params.lse_head_stride + first_token + r as i64;
        arch::st_global_f32(params.lse.offset(lse_at as isize), lse);
    }
}

//! The second kernel of split-KV decoding: merges the splits' partial
//! outputs of each query row by their log-sum-exps,
//! `O = sum_s exp(lse_s - lse) O_s` with `lse = log sum_s exp(lse_s)`.
//!
//! One warp per (row, 8 columns), its lanes over the splits: each lane
//! issues the loads of its splits' LSEs and 8-column slices together, and
//! butterfly sums finish the row. Many warps, each waiting for one round
//! trip to memory, keep the merge short when there are few rows and many
//! splits (decoding).

use crate::arch;
use crate::common::element::Element;
use crate::common::problem::packed_sequence;
use crate::params::CombineParams;

use crate::params::{COMBINE_COLUMNS, COMBINE_WARPS};
/// Splits of one pass per lane: a pass covers the host's largest split count.
const SPLITS_PER_LANE: usize = (crate::params::MAX_SPLITS / 32) as usize;

/// The combine kernel body.
///
/// # Safety
/// `params` describes the partial buffers the forward call wrote (16-byte
/// aligned `o_partial`) and the outputs it would have written; launched with
/// the geometry of [`flash_attn_abi::kernels::combine_grid`].
#[inline(always)]
pub unsafe fn combine_splits<E: Element>(params: &CombineParams) {
    let tid = arch::thread_idx_x();
    let lane = tid % 32;
    let slices = params.head_dim / COMBINE_COLUMNS;
    let rows_per_split = params.batch * params.heads_q * params.seqlen_q;
    // The host launches no merge of empty problems; saying so drops the
    // divide-by-zero panic paths.
    core::hint::assert_unchecked(params.seqlen_q != 0);
    core::hint::assert_unchecked(params.heads_q != 0);
    core::hint::assert_unchecked(slices != 0);
    let item = arch::block_idx_x() * COMBINE_WARPS + tid / 32;
    let (row, slice) = (item / slices, item % slices);
    if row >= rows_per_split {
        return; // the whole warp
    }
    let (batch, head, r) =
        (row / params.seqlen_q / params.heads_q, row / params.seqlen_q % params.heads_q, row % params.seqlen_q);
    // Where the batch's rows start in o: a batch stride, or (packed) a first token.
    let (mut seqlen_q, mut first_token, mut o_batch_offset) =
        (params.seqlen_q, 0i64, batch as i64 * params.o_batch_stride);
    if !params.cu_seqlens_q.is_null() {
        (first_token, seqlen_q) = packed_sequence(params.cu_seqlens_q, batch);
        o_batch_offset = 0;
    }
    if r >= seqlen_q {
        return; // past this batch's queries
    }
    let partial = |split: u32| (split * rows_per_split + row) as usize;
    let log2e = core::f32::consts::LOG2_E;

    // One pass per MAX_SPLITS splits (one pass for every split count the
    // host allows): each lane issues the loads of all its splits' LSEs and
    // slices before it uses any, so the merge waits for one round trip to
    // memory, not one per split. Passes merge online against the running max.
    let mut max = f32::NEG_INFINITY;
    let mut sum = 0.0;
    let mut acc = [0.0f32; COMBINE_COLUMNS as usize];
    let mut first_split = 0;
    while first_split < params.num_splits {
        let mut lse = [f32::NEG_INFINITY; SPLITS_PER_LANE];
        let mut slices = [[0u32; COMBINE_COLUMNS as usize]; SPLITS_PER_LANE];
        for (i, (lse, slice_bits)) in lse.iter_mut().zip(slices.iter_mut()).enumerate() {
            let split = first_split + lane + 32 * i as u32;
            if split < params.num_splits {
                *lse = arch::ld_global_f32(params.lse_partial.add(partial(split)));
                let from = params
                    .o_partial
                    .add(partial(split) * params.head_dim as usize + (slice * COMBINE_COLUMNS) as usize);
                for half in 0..2 {
                    let bits = arch::ld_global_v4(from.add(4 * half) as *const u8);
                    slice_bits[4 * half..4 * half + 4].copy_from_slice(&bits);
                }
            }
        }
        // The largest LSE so far; a row no split saw a key of keeps -inf.
        let mut pass_max = lse.iter().fold(f32::NEG_INFINITY, |m, &l| m.max(l));
        for mask in [16, 8, 4, 2, 1] {
            pass_max = pass_max.max(arch::shfl_xor_f32(pass_max, mask));
        }
        let new_max = max.max(pass_max);
        let shift = if new_max == f32::NEG_INFINITY { 0.0 } else { new_max * log2e };
        // Earlier passes were weighed against `max`: rebase them (2^-inf = 0).
        let rebase = arch::exp2(arch::fma(max, log2e, -shift));
        sum *= rebase;
        acc.iter_mut().for_each(|value| *value *= rebase);
        for (&lse, slice_bits) in lse.iter().zip(slices.iter()) {
            let weight = arch::exp2(arch::fma(lse, log2e, -shift));
            sum += weight;
            for (value, bits) in acc.iter_mut().zip(slice_bits) {
                *value = arch::fma(weight, f32::from_bits(*bits), *value);
            }
        }
        max = new_max;
        first_split += 32 * SPLITS_PER_LANE as u32;
    }
    for mask in [16, 8, 4, 2, 1] {
        sum += arch::shfl_xor_f32(sum, mask);
        for value in acc.iter_mut() {
            *value += arch::shfl_xor_f32(*value, mask);
        }
    }
    if lane != 0 {
        return;
    }
    let normalise = if sum > 0.0 { arch::recip(sum) } else { 0.0 };
    let o = params.o.offset(
        (o_batch_offset
            + (first_token + r as i64) * params.o_row_stride
            + head as i64 * params.o_head_stride
            + (slice * COMBINE_COLUMNS) as i64) as isize,
    );
    let packed: [u32; 4] = core::array::from_fn(|i| E::pack(acc[2 * i] * normalise, acc[2 * i + 1] * normalise));
    arch::st_global_v4(o as *mut u8, packed);
    if slice == 0 {
        let lse = if sum > 0.0 { max + arch::log2(sum) * core::f32::consts::LN_2 } else { f32::NEG_INFINITY };
        let lse_at =
            (batch as i64) * params.lse_batch_stride + head as i64 * params.lse_head_stride + first_token + r as i64;
        arch::st_global_f32(params.lse.offset(lse_at as isize), lse);
    }
}

//! The backward kernels (FlashAttention-2's algorithm): dQ, dK and dV of
//! the forward's attention from dO, recomputing P from Q, K and the saved
//! LSE instead of storing it. Three kernels per call on one
//! [`flash_attn_abi::backward::BackwardParams`] (their contract and
//! grids: [`flash_attn_abi::backward`]):
//!
//! - [`rows::prepare`]: `delta = rowsum(dO * O)` per query row, and the
//!   row's f32 dQ accumulator zeroed;
//! - the main kernel, one block per key block, which walks the query steps
//!   that see it and accumulates dK and dV in registers and dQ in the f32
//!   accumulator: [`sm80`] (`mma.sync`, atomics) or [`sm90`] (`wgmma`,
//!   TMA, warp specialization);
//! - [`rows::finish_dq`]: dQ from the accumulator.
//!
//! Both families share the row kernels and [`BatchRows`].

use crate::common::problem::packed_sequence;
use crate::params::ForwardParams;

pub mod rows;
pub mod sm80;
pub mod sm90;

/// One batch's sequence lengths, and where its rows start in each tensor.
#[derive(Clone, Copy)]
pub struct BatchRows {
    pub seqlen_q: u32,
    pub seqlen_k: u32,
    batch: i64,
    /// The first query and key tokens of a packed batch (`cu_seqlens_*`),
    /// or -1 where that side is not packed.
    q_start: i64,
    k_start: i64,
    /// Index of the batch's first lse (and delta) value, head 0.
    lse_offset: i64,
}

impl BatchRows {
    /// The rows of batch `batch`.
    ///
    /// # Safety
    /// The `cu_seqlens_*` arrays, where not null, hold `batch + 2` offsets.
    #[inline(always)]
    pub unsafe fn of(p: &ForwardParams, batch: u32) -> Self {
        let mut rows = BatchRows {
            seqlen_q: p.seqlen_q,
            seqlen_k: p.seqlen_k,
            batch: batch as i64,
            q_start: -1,
            k_start: -1,
            lse_offset: batch as i64 * p.lse_batch_stride,
        };
        if !p.cu_seqlens_q.is_null() {
            let (start, len) = packed_sequence(p.cu_seqlens_q, batch);
            (rows.q_start, rows.seqlen_q) = (start, len);
            rows.lse_offset += start;
        }
        if !p.cu_seqlens_k.is_null() {
            (rows.k_start, rows.seqlen_k) = packed_sequence(p.cu_seqlens_k, batch);
        }
        rows
    }

    /// Element offset of the batch's first query row in a tensor of q's
    /// shape with these strides.
    #[inline(always)]
    pub fn q_offset(&self, batch_stride: i64, row_stride: i64) -> i64 {
        if self.q_start >= 0 {
            self.q_start * row_stride
        } else {
            self.batch * batch_stride
        }
    }

    /// Element offset of the batch's first key in a tensor of k's shape.
    #[inline(always)]
    pub fn k_offset(&self, batch_stride: i64, row_stride: i64) -> i64 {
        if self.k_start >= 0 {
            self.k_start * row_stride
        } else {
            self.batch * batch_stride
        }
    }

    /// Index of query row `row` of head `head` in lse and delta (and, times
    /// the head dim, in the dQ accumulator).
    #[inline(always)]
    pub fn lse_index(&self, p: &ForwardParams, head: u32, row: u32) -> i64 {
        self.lse_offset + head as i64 * p.lse_head_stride + row as i64
    }
}

/// The element offset of query row `row` of head `head` in a tensor of q's
/// shape, from the batch's first row.
#[inline(always)]
fn row_offset(row: u32, head: u32, row_stride: i64, head_stride: i64) -> i64 {
    row as i64 * row_stride + head as i64 * head_stride
}

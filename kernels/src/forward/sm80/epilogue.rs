//! The end of a warp's work: normalise O by the softmax sum, round it, stage
//! it through shared memory for 16-byte coalesced stores, and write the
//! log-sum-exp of each row ([`write_output`]); or, for a split of
//! split-KV, write the f32 partials ([`write_partial_output`]).
//! [`write_tile`] chooses, after merging the warps that split the keys
//! ([`crate::forward::sm80::warp_merge`]).

use crate::arch;
use crate::common::element::Element;
use crate::common::layout::SmemTile;
use crate::common::mma::Accumulators;
use crate::common::problem::Sequence;
use crate::common::softmax::OnlineSoftmax;
use crate::common::tile_copy;
use crate::forward::sm80::kernel::ForwardKernel;
use crate::forward::sm80::schedule::{TileScheduler, WorkTile};
use crate::forward::sm80::warp_merge;
use crate::params::ForwardParams;

/// Where a work tile's rows lie.
#[derive(Clone, Copy)]
pub struct TileRows {
    /// The tile's first query row in its sequence.
    pub first_row: u32,
    /// The warp's first row within the tile (0 when the warps split the keys).
    pub warp_first_row: u32,
    /// Rows of the tile that exist (the rest lie past seqlen_q).
    pub rows_in_block: u32,
}

/// The epilogue of a work tile, per warp, after its key loop (`tid` the
/// thread's %tid.x): with warps that split the keys, first merges them into
/// warp 0 ([`warp_merge::merge_into_first_warp`], which waits for every
/// copy, synchronises the block and overlays the K/V stages; the other
/// warps are then done); then a split of split-KV writes its f32 partials
/// ([`write_partial_output`]), any other tile O and the LSE
/// ([`write_output`], staged through the warp's own rows of the Q tile,
/// with warp barriers only).
///
/// # Safety
/// Every warp of the block calls it; no warp reads the Q tile any more
/// (with warps that split the keys, nor its stages); the tile's output rows
/// are writable.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub unsafe fn write_tile<K: ForwardKernel, const M_TILES: usize, const DIM_TILES: usize, const HEAD_DIM: usize>(
    params: &ForwardParams,
    tile: &WorkTile,
    seq: &Sequence,
    rows: TileRows,
    softmax: &mut OnlineSoftmax<M_TILES>,
    o: &mut Accumulators<M_TILES, DIM_TILES>,
    scale_log2: f32,
    q_tile: SmemTile<HEAD_DIM>,
    tid: u32,
    lane: u32,
) {
    let WorkTile { split, head, batch, .. } = *tile;
    let TileRows { first_row, warp_first_row, rows_in_block } = rows;
    let block_m = K::BLOCK_M;
    // The warp is derived here, not passed in: passed, its value changed
    // how LLVM folds the warp's first row at d=256 (other PTX).
    if K::WARPS_SPLIT_KEYS && (K::WARPS as usize) > 1 {
        let scratch = q_tile.after_rows(block_m);
        if !warp_merge::merge_into_first_warp(
            softmax,
            o,
            scratch,
            (K::WARPS as usize) as u32,
            tid / 32,
            lane,
            scale_log2,
        ) {
            return; // warp 0 writes the block's output
        }
    }
    let valid_rows = rows_in_block.saturating_sub(warp_first_row);
    if K::GENERAL && params.num_splits > 1 {
        // [split, batch, head, row] over the longest seqlen_q.
        let row = (((split * K::Scheduler::batches(params) + batch) * params.heads_q + head) * params.seqlen_q)
            as usize
            + (first_row + warp_first_row) as usize;
        write_partial_output::<M_TILES, DIM_TILES, HEAD_DIM>(
            o,
            softmax,
            scale_log2,
            params.o_partial.wrapping_add(row * HEAD_DIM),
            params.lse_partial.wrapping_add(row),
            valid_rows,
            lane,
        );
        return;
    }
    // Each warp stages O in its own rows of the Q tile, which only it reads.
    let out = OutputRows {
        first_row: warp_first_row,
        o: params.o.wrapping_offset(
            (seq.o_offset
                + (first_row + warp_first_row) as i64 * params.o_row_stride
                + head as i64 * params.o_head_stride) as isize,
        ),
        o_row_stride: params.o_row_stride as u32,
        lse: params.lse.wrapping_offset(
            (seq.lse_offset + head as i64 * params.lse_head_stride + (first_row + warp_first_row) as i64) as isize,
        ),
        valid_rows,
    };
    write_output::<K::Element, M_TILES, DIM_TILES, HEAD_DIM>(o, softmax, scale_log2, q_tile, out, lane);
}

/// Where a warp's output rows go.
pub struct OutputRows {
    /// Row `first_row` of the staging tile is the warp's first row.
    pub first_row: u32,
    /// Global address of the warp's first output row.
    pub o: *mut u16,
    pub o_row_stride: u32,
    /// Global address of the warp's first log-sum-exp.
    pub lse: *mut f32,
    /// Rows of the warp that exist (the rest lie past seqlen_q).
    pub valid_rows: u32,
}

/// Writes the warp's `16 * M_TILES` rows of output and log-sum-exp.
///
/// # Safety
/// The staging rows belong to this warp alone; the output rows below
/// `valid_rows` are writable.
#[inline(always)]
pub unsafe fn write_output<E: Element, const M_TILES: usize, const DIM_TILES: usize, const HEAD_DIM: usize>(
    o: &Accumulators<M_TILES, DIM_TILES>,
    softmax: &OnlineSoftmax<M_TILES>,
    scale_log2: f32,
    staging: SmemTile<HEAD_DIM>,
    out: OutputRows,
    lane: u32,
) {
    let lane_row = lane / 4;
    let lane_col = 2 * (lane % 4);
    // The staging rows held the warp's Q, which its lanes read through
    // ldmatrix, each lane's row address serving the others: every lane's
    // reads are done before any lane overwrites them (compute-sanitizer's
    // racecheck reports the overlap otherwise, under independent thread
    // scheduling).
    arch::sync_warp();
    for (m, o_m) in o.iter().enumerate() {
        for half in 0..2 {
            let (normalise, lse) = softmax.finish(m, half, scale_log2);
            let row = (m as u32) * 16 + (half as u32) * 8 + lane_row;
            for (d, tile) in o_m.iter().enumerate() {
                let packed = E::pack(tile[2 * half] * normalise, tile[2 * half + 1] * normalise);
                arch::st_shared_u32(staging.pair_addr(out.first_row + row, (d as u32) * 8 + lane_col), packed);
            }
            if lane % 4 == 0 && row < out.valid_rows {
                arch::st_global_f32(out.lse.add(row as usize), lse);
            }
        }
    }
    arch::sync_warp();
    tile_copy::store_rows_from_smem::<M_TILES, HEAD_DIM>(
        staging,
        out.first_row,
        out.o,
        out.o_row_stride,
        out.valid_rows,
        lane,
    );
}

/// Writes the warp's rows of a split-KV partial result in f32, straight from
/// registers: O normalised by this split's softmax sum, `[rows, HEAD_DIM]`
/// from `o_partial`, and this split's LSE from `lse_partial` (-inf, with
/// O = 0, for a row that saw no key in the split).
///
/// # Safety
/// The `valid_rows` rows from `o_partial` and `lse_partial` are writable.
#[inline(always)]
pub unsafe fn write_partial_output<const M_TILES: usize, const DIM_TILES: usize, const HEAD_DIM: usize>(
    o: &Accumulators<M_TILES, DIM_TILES>,
    softmax: &OnlineSoftmax<M_TILES>,
    scale_log2: f32,
    o_partial: *mut f32,
    lse_partial: *mut f32,
    valid_rows: u32,
    lane: u32,
) {
    let lane_row = lane / 4;
    let lane_col = 2 * (lane % 4);
    for (m, o_m) in o.iter().enumerate() {
        for half in 0..2 {
            // Every lane takes part in the quad reduction, valid row or not.
            let (normalise, lse) = softmax.finish(m, half, scale_log2);
            let row = (m as u32) * 16 + (half as u32) * 8 + lane_row;
            if row < valid_rows {
                let out = o_partial.add(row as usize * HEAD_DIM + lane_col as usize);
                for (d, tile) in o_m.iter().enumerate() {
                    arch::st_global_f32(out.add(d * 8), tile[2 * half] * normalise);
                    arch::st_global_f32(out.add(d * 8 + 1), tile[2 * half + 1] * normalise);
                }
                if lane % 4 == 0 {
                    arch::st_global_f32(lse_partial.add(row as usize), lse);
                }
            }
        }
    }
}

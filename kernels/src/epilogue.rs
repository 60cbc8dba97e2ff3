//! The end of a warp's work: normalise O by the softmax sum, round it, stage
//! it through shared memory for 16-byte coalesced stores, and write the
//! log-sum-exp of each row.

use crate::arch;
use crate::element::Element;
use crate::layout::SmemTile;
use crate::mma::Accumulators;
use crate::softmax::OnlineSoftmax;
use crate::tile_copy;

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

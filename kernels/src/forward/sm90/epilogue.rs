//! The epilogue of a consumer's 64 rows of a tile: O normalised by the
//! softmax sum and rounded, to global memory through shared memory, and
//! the LSE of each row.
//!
//! Straight from the accumulator fragments, a lane's two columns of a row
//! are one 4-byte store, and a warp's store writes 16 bytes into each of
//! eight rows: half of eight 32-byte sectors. Here the consumer first puts
//! its rows in its own staging buffer ([`Smem::o`]), swizzled as V is (a
//! warp's 4-byte stores meet every bank once), then copies them out 16
//! bytes a lane: a warp's store is whole rows' sectors, four times the
//! bytes. Where the whole head dim does not fit beside the K/V ring, the
//! buffer holds a part of the columns at a time. Each consumer syncs
//! only its own warpgroup, on a named barrier of its own, so the others'
//! GEMMs and softmax run on meanwhile.

use flash_attn_abi::hopper::{CONSUMER_ROWS, WARPGROUP_THREADS};

use super::consumer::as_tiles;
use super::scheduler::HopperTile;
use super::smem::Smem;
use crate::arch::{self, WgmmaAccumulator};
use crate::common::element::Element;
use crate::common::softmax::OnlineSoftmax;
use crate::params::ForwardParams;

/// The first of the consumers' own named barriers, after the turns' (1 to
/// 3; 0 is the block's `bar.sync 0`).
const FIRST_EPILOGUE_BARRIER: u32 = 4;

/// Writes consumer `group`'s rows of `tile`: O normalised and rounded,
/// and the LSE (0 and -inf for a row that sees no key). Rows past the
/// sequence's are not written.
///
/// # Safety
/// Every thread of the consumer calls it, once it has waited for every
/// `wgmma` it issued; o and the LSE hold every row of the call.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn write_rows<
    E: Element,
    const BM: usize,
    const D: usize,
    const DT: usize,
    const BN: usize,
    const STAGES: usize,
    const O_REGS: usize,
    const O_TILES: usize,
>(
    p: &ForwardParams,
    smem: &Smem<BM, D, DT, BN, STAGES>,
    tile: &HopperTile,
    softmax: &OnlineSoftmax<1>,
    scale_log2: f32,
    o: &mut WgmmaAccumulator<O_REGS>,
    group: u32,
) {
    // The thread's place read here, not before the tile loop: the shared
    // and global addresses derived from it would be hoisted out of that
    // loop and held through it, a register each (spilled).
    let thread = arch::thread_idx_x_here() % WARPGROUP_THREADS;
    let (warp, lane) = (thread / 32, thread % 32);
    let group_first_row = tile.first_row + CONSUMER_ROWS * group;
    let (batch, head, first_token) = (tile.layout_batch as i64, tile.head as i64, tile.first_token_q as i64);
    let lse = p.lse.offset((batch * p.lse_batch_stride + head * p.lse_head_stride + first_token) as isize);
    let mut norms = [0.0; 2];
    for (half, norm) in norms.iter_mut().enumerate() {
        // Every lane joins the quad's shuffles.
        let (row_norm, row_lse) = softmax.finish(0, half, scale_log2);
        *norm = row_norm;
        let row = group_first_row + 16 * warp + lane / 4 + 8 * half as u32;
        if row < tile.seqlen_q && lane % 4 == 0 {
            arch::st_global_f32(lse.add(row as usize), row_lse);
        }
    }

    let o_at =
        batch * p.o_batch_stride + head * p.o_head_stride + (first_token + group_first_row as i64) * p.o_row_stride;
    let out = p.o.offset(o_at as isize);
    let rows_here = tile.seqlen_q.saturating_sub(group_first_row);
    let buffer = smem.o(group);
    let barrier = FIRST_EPILOGUE_BARRIER + group;
    let o_tiles = as_tiles::<O_REGS, O_TILES>(o);
    let staged = Smem::<BM, D, DT, BN, STAGES>::O_TILE;
    let part_tiles = staged.columns as usize / 8;
    for part in 0..O_TILES / part_tiles {
        // The copy before (of the last part, or of the consumer's last
        // tile) has read the buffer.
        arch::named_barrier_sync(barrier, WARPGROUP_THREADS);
        let fragment = &o_tiles[0][part * part_tiles..(part + 1) * part_tiles];
        staged.stage::<E>(buffer, fragment, norms, (0, 0), (warp, lane));
        arch::named_barrier_sync(barrier, WARPGROUP_THREADS);
        let part_out = out.add(8 * part * part_tiles);
        staged.copy_out::<WARPGROUP_THREADS>(buffer, part_out, p.o_row_stride, (rows_here, staged.columns), thread);
    }
}

//! The epilogue of an sm_90a backward block: its keys' dK (times the
//! softmax scale) and dV, from the consumers' accumulators to global
//! memory through shared memory.
//!
//! Straight from the accumulator fragments, a lane's two columns of a row
//! are one 4-byte store, and a warp's store writes 16 bytes into each of
//! eight rows: half of eight 32-byte sectors (the consumers queued on the
//! load/store unit there). Here each consumer first puts its part in the
//! shared memory of K and V, which no product reads any more, in the
//! layout TMA lands K and V in (its swizzle spreads a warp's 4-byte stores
//! over all 32 banks); then the 256 consumer threads copy the block's rows
//! out 16 bytes a lane: a warp's store is whole sectors of consecutive
//! rows, four times the bytes.

use flash_attn_abi::backward::BackwardParams;
use flash_attn_abi::hopper::WARPGROUP_THREADS;

use super::smem::Smem;
use super::KeyBlock;
use crate::arch::{self, WgmmaAccumulator};
use crate::backward::BatchRows;
use crate::common::element::Element;
use crate::forward::sm90::consumer::as_tiles;

/// Threads of both consumer warpgroups: they stage and copy together.
const CONSUMER_THREADS: u32 = 2 * WARPGROUP_THREADS;

/// Stores the consumer's dK and dV (keys `first_key..first_key + 64` of
/// the block at d <= 128, each consumer's own; above, the block's 64 keys
/// and the consumer's columns from `first_column` on), then, with the
/// other consumer, writes the block's dK and dV: keys past seqlen_k and
/// columns past the head dim are not written.
///
/// # Safety
/// Both consumer warpgroups call it, once each has waited for every
/// `wgmma` it issued; dK and dV hold every key of the call.
#[inline(always)]
pub(super) unsafe fn write_keys<E: Element, const D: usize, const DV_REGS: usize, const DV_TILES: usize>(
    p: &BackwardParams,
    smem: &Smem<D>,
    b: &KeyBlock,
    rows: &BatchRows,
    (d_k, d_v): (&mut WgmmaAccumulator<DV_REGS>, &mut WgmmaAccumulator<DV_REGS>),
    (first_key, first_column): (u32, u32),
) {
    // Every product of both consumers that reads K or V has completed.
    sync_consumers();
    stage::<E, D, DV_REGS, DV_TILES>(smem.k(0), d_k, p.softmax_scale, first_key, first_column);
    stage::<E, D, DV_REGS, DV_TILES>(smem.v(0), d_v, 1.0, first_key, first_column);
    sync_consumers();
    let (batch, head, key) = (b.batch as i64, b.kv_head as i64, b.first_key as i64);
    let d_k = p.d_k.offset((batch * p.d_k_batch_stride + head * p.d_k_head_stride + key * p.d_k_row_stride) as isize);
    let d_v = p.d_v.offset((batch * p.d_v_batch_stride + head * p.d_v_head_stride + key * p.d_v_row_stride) as isize);
    // Keys below seqlen_k, columns below the head dim (the tile's past it
    // are padding).
    let bounds = (rows.seqlen_k - b.first_key, D as u32);
    let thread = arch::thread_idx_x_here() - WARPGROUP_THREADS;
    const { assert!(Smem::<D>::KV_TILE.runs_per_thread(CONSUMER_THREADS) > 0) }
    let staged = Smem::<D>::KV_TILE;
    staged.copy_out::<CONSUMER_THREADS>(smem.k(0), d_k, p.d_k_row_stride, bounds, thread);
    staged.copy_out::<CONSUMER_THREADS>(smem.v(0), d_v, p.d_v_row_stride, bounds, thread);
}

/// Named barrier 5 of both consumer warpgroups (1 to 4 are the step's).
#[inline(always)]
fn sync_consumers() {
    arch::named_barrier_sync(5, CONSUMER_THREADS);
}

/// The warp's rows of `acc` (keys `first_key + 16 * warp..` of the tile),
/// times `scale` and rounded, to the tile at `tile` from column
/// `first_column` on, each lane's two columns of a row one 4-byte store.
///
/// # Safety
/// The tile is K's or V's shared memory, which nothing reads any more.
#[inline(always)]
unsafe fn stage<E: Element, const D: usize, const DV_REGS: usize, const DV_TILES: usize>(
    tile: u32,
    acc: &mut WgmmaAccumulator<DV_REGS>,
    scale: f32,
    first_key: u32,
    first_column: u32,
) {
    let thread = arch::thread_idx_x_here() % WARPGROUP_THREADS;
    let (warp, lane) = (thread / 32, thread % 32);
    let fragment = &as_tiles::<DV_REGS, DV_TILES>(acc)[0];
    Smem::<D>::KV_TILE.stage::<E>(tile, fragment, [scale; 2], (first_key, first_column), (warp, lane));
}

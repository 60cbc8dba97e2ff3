//! The producer: one thread of warpgroup 0 picks the block's tiles
//! ([`scheduler`]), hands each to the consumers and issues its TMA loads.
//!
//! Per tile, Q lands in the next of the Q buffers, on its full mbarrier,
//! once the consumers have released the buffer's previous tile (its empty
//! barrier): with two buffers, while they still work on the tile before
//! (see [`flash_attn_abi::hopper::HopperSmem::q`]). The block's key blocks, over
//! all its tiles, go round a ring of stages: the `n`-th to stage `n %
//! STAGES` in round `n / STAGES`. The producer waits until the consumers
//! have released the stage's previous round (its empty barrier; in round 0
//! the wait on the "previous" parity passes at once), raises the full
//! barrier's transaction count by the tile's bytes with its one arrival,
//! and issues one TMA load per slab. K and V have their own
//! barriers, so that `S = Q K^T` starts before V has landed, and load in
//! the order the consumers take them: block i's K, then block i - 1's V.
//! The next tile's loads start while the consumers still work on the last
//! one.

use flash_attn_abi::hopper::{HopperParams, SLAB_COLUMNS};
use flash_attn_abi::sm90::TensorMap;

use super::scheduler::{self, HopperTile, TileOrder};
use super::smem::Smem;
use super::Loads;
use crate::arch;

/// Picks each tile the block takes, hands it to the consumers with its Q
/// and loads every key block; at the end, hands over the end.
///
/// # Safety
/// One thread of the block calls it, after the barriers were initialised;
/// `p`'s tensor maps are the ABI's.
#[inline(always)]
pub unsafe fn load_tiles<
    const BM: usize,
    const D: usize,
    const DT: usize,
    const BN: usize,
    const STAGES: usize,
    const CAUSAL: bool,
    const GENERAL: bool,
>(
    p: &HopperParams,
    smem: &Smem<BM, D, DT, BN, STAGES>,
) {
    // Made here, after `setmaxnreg`: what is live across it must fit the
    // producer's registers (24, or 32 beside three consumers).
    let order = TileOrder::of(p);
    let mut loads = Loads::default();
    let mut index = order.first();
    loop {
        let (q_buffer, q_parity) = loads.q_buffer(Smem::<BM, D, DT, BN, STAGES>::Q_BUFFERS);
        scheduler::hand_over(smem, index, (q_buffer, q_parity));
        if index >= order.tiles() {
            arch::mbarrier_arrive(smem.q_full(q_buffer));
            return;
        }
        let tile = order.tile::<BM, BN, CAUSAL, GENERAL>(&p.forward, index);
        load_tile(smem, &tile, &loads, q_buffer, p.tensor_maps, p.forward.heads_per_kv);
        loads.advance(&tile);
        index = order.next(index, p.tile_counter);
    }
}

/// Loads Q into Q buffer `q_buffer` and every key block of `tile` (a tile
/// without key blocks: only the arrival on the buffer's full barrier, after
/// the tile slot was written), `loads` into the block's loads;
/// `maps` are the tensor maps of q, k and v; `heads_per_kv` query heads
/// share a key/value head.
#[inline(always)]
unsafe fn load_tile<const BM: usize, const D: usize, const DT: usize, const BN: usize, const STAGES: usize>(
    smem: &Smem<BM, D, DT, BN, STAGES>,
    tile: &HopperTile,
    loads: &Loads,
    q_buffer: u32,
    maps: *const TensorMap,
    heads_per_kv: u32,
) {
    if tile.key_blocks() == 0 {
        arch::mbarrier_arrive(smem.q_full(q_buffer));
        return;
    }
    let slabs = Smem::<BM, D, DT, BN, STAGES>::SLABS;
    let batch = tile.layout_batch as i32;
    let (q_map, k_map, v_map) = (maps, maps.add(1), maps.add(2));
    let q_head = tile.head as i32;
    // The host guarantees heads_per_kv >= 1; saying so drops the divide-by-zero panic path.
    core::hint::assert_unchecked(heads_per_kv != 0);
    let kv_head = (tile.head / heads_per_kv) as i32;

    let q_bytes = Smem::<BM, D, DT, BN, STAGES>::Q_BYTES;
    load_slabs(
        smem.q_full(q_buffer),
        q_bytes,
        (slabs, SLAB_COLUMNS),
        |slab| smem.q(q_buffer, slab),
        q_map,
        [(tile.first_token_q + tile.first_row) as i32, q_head, batch],
    );
    let (k_bytes, v_bytes) = (Smem::<BM, D, DT, BN, STAGES>::K_BYTES, Smem::<BM, D, DT, BN, STAGES>::V_BYTES);
    let v_slabs = (Smem::<BM, D, DT, BN, STAGES>::V_SLABS, Smem::<BM, D, DT, BN, STAGES>::V_SLAB_COLUMNS);
    let key_rows = |i: u32| [(tile.first_token_k + (tile.key_block_begin + i) * BN as u32) as i32, kv_head, batch];
    let load_v = |i: u32| {
        let (stage, parity) = loads.stage::<STAGES>(i);
        arch::mbarrier_wait_parity(smem.v_empty(stage), parity ^ 1);
        load_slabs(smem.v_full(stage), v_bytes, v_slabs, |slab| smem.v(stage, slab), v_map, key_rows(i));
    };
    // Block i's K (for `S = Q K^T`) before block i - 1's V (for its `O +=
    // P V`), as the consumers take them: K's stage frees a `P V` earlier
    // than V's, and so does not wait behind it.
    for i in 0..tile.key_blocks() {
        let (stage, parity) = loads.stage::<STAGES>(i);
        arch::mbarrier_wait_parity(smem.k_empty(stage), parity ^ 1);
        load_slabs(smem.k_full(stage), k_bytes, (slabs, SLAB_COLUMNS), |slab| smem.k(stage, slab), k_map, key_rows(i));
        if i > 0 {
            load_v(i - 1);
        }
    }
    load_v(tile.key_blocks() - 1);
}

/// Loads one tile onto the mbarrier at `full`: its one arrival with the
/// tile's `bytes`, then one TMA box of `map` per slab of `(slabs,
/// columns)`, into `dst(slab)`, from `[row, head, batch]` of the tensor.
///
/// # Safety
/// `full` is an initialised mbarrier whose phase expects this arrival;
/// `map` is a tensor map of the ABI's; the slabs fit at `dst`.
#[inline(always)]
unsafe fn load_slabs(
    full: u32,
    bytes: u32,
    (slabs, columns): (u32, u32),
    dst: impl Fn(u32) -> u32,
    map: *const TensorMap,
    [row, head, batch]: [i32; 3],
) {
    arch::mbarrier_arrive_expect_tx(full, bytes);
    for slab in 0..slabs {
        arch::tma_load_4d(dst(slab), map, [(slab * columns) as i32, row, head, batch], full);
    }
}

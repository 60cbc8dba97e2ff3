//! A consumer warpgroup of the sm_90a backward, through every query step of
//! every query head of the group: up to d = 128, 64 keys of the block;
//! above it (the consumers split the head dim), half the columns of the
//! block's 64 keys' gradients.
//!
//! Per step (64 query rows, Q and dO in their rings' stages):
//!
//! 1. `S = Q K^T` and `dP = dO V^T` for the consumer's score keys (64, or
//!    32 where the consumers split the head dim) (`wgmma` SS, a group
//!    each), the rows' LSE and delta read meanwhile;
//! 2. `P = exp2(S log2(e) scale - LSE log2(e))` with the causal mask
//!    while dP is computed, then `dS = P (dP - delta)`, both rounded and
//!    stored to shared memory (P, where
//!    a consumer has one buffer of it, once every warp of the consumer is
//!    past the last step's products) as 64-key rows (the accumulator fragment's own layout: a lane's two
//!    neighbouring keys are one 4-byte store);
//! 3. once every warp that reads them has stored (a named barrier: both
//!    consumers where dQ or the gradients read both consumers' stores),
//!    `dV += P^T dO` and `dK += dS^T Q` (A transposed from shared memory)
//!    and the consumer's part of `dQ = dS K`: one group, or where the
//!    consumers split the head dim, three: dQ's, dV's and dK's;
//! 4. store dQ to shared memory (once the buffer's last turn has been
//!    read; where the consumers split the head dim, while dV and dK are
//!    still being computed), where the producer warpgroup's other warps
//!    add it to the f32 accumulator; then release dO's stage (where the
//!    consumers split the head dim, once dV is computed) and Q's.
//!
//! At the end dK (times the softmax scale) and dV of the consumer's keys
//! and columns are stored. The `wgmma` accumulator fragment is the
//! `mma.sync` C fragment over n8-tiles (a warp's 16 rows, a lane's rows
//! `lane / 4` and `lane / 4 + 8`, two neighbouring columns per tile).

use flash_attn_abi::backward::BackwardParams;
use flash_attn_abi::hopper::{CONSUMER_ROWS, SLAB_ROW_BYTES, WARPGROUP_THREADS};
use flash_attn_abi::hopper_backward::{
    hopper_backward_config_of, HopperBackwardConfig, HOPPER_BACKWARD_BLOCK_M, HOPPER_BACKWARD_STAGES,
};

use super::smem::Smem;
use super::{stage_of, KeyBlock};
use crate::arch::{self, WgmmaAccumulator};
use crate::backward::BatchRows;
use crate::element::Element;
use crate::hopper::consumer::as_tiles;
use crate::softmax::ScoreMask;

/// Waits until every warp that reads consumer `consumer`'s stores of P and
/// dS has stored: a named barrier of both consumers where dQ reads both
/// halves of dS (d = 128 and where they split the head dim, whose
/// gradients read P too), else one per consumer (0 is the block's
/// `bar.sync 0`). The ids are constants: ptxas counts the barriers a
/// kernel uses from them.
#[inline(always)]
fn sync_stores<const D: usize>(consumer: u32) {
    if shared_d_s::<D>() {
        arch::named_barrier_sync(1, 2 * WARPGROUP_THREADS);
    } else if consumer == 0 {
        arch::named_barrier_sync(1, WARPGROUP_THREADS);
    } else {
        arch::named_barrier_sync(2, WARPGROUP_THREADS);
    }
}

/// Waits until every warp of consumer `consumer` is past the last step's
/// `wgmma`s, which read its P (one buffer, unlike dS): a named barrier of
/// the warpgroup (ids 3 and 4, after [`sync_stores`]'s), before it stores
/// the next step's. A warp's `wgmma.wait_group` covers its own part of a
/// product only.
#[inline(always)]
fn sync_p_readers(consumer: u32) {
    if consumer == 0 {
        arch::named_barrier_sync(3, WARPGROUP_THREADS);
    } else {
        arch::named_barrier_sync(4, WARPGROUP_THREADS);
    }
}

/// Whether each consumer's dQ reads both consumers' dS (d = 128 and above:
/// each takes half the columns over all keys) or its own (d = 32, 64 and
/// 96).
#[inline(always)]
const fn shared_d_s<const D: usize>() -> bool {
    let c = hopper_backward_config_of(D as u32);
    c.dq_columns() < c.tile_dim()
}

/// Computes consumer `consumer`'s keys' dK and dV over every step and adds
/// its part of each step's dQ.
///
/// # Safety
/// As [`super::hopper_backward`]; both consumer warpgroups call it.
#[inline(always)]
pub unsafe fn compute_keys<
    E: Element,
    const D: usize,
    const CAUSAL: bool,
    const S_REGS: usize,
    const S_TILES: usize,
    const DV_REGS: usize,
    const DV_TILES: usize,
    const DQ_REGS: usize,
    const DQ_TILES: usize,
>(
    p: &BackwardParams,
    smem: &Smem<D>,
    consumer: u32,
) {
    let config: HopperBackwardConfig = const { hopper_backward_config_of(D as u32) };
    let split = config.splits_head_dim();
    let f = &p.forward;
    let b = KeyBlock::of::<D>(p, CAUSAL);
    let rows = BatchRows::of(f, b.batch);
    // The consumer's score keys from the block's first, and the keys and
    // columns of its gradients: its 64 keys' every column, or where the
    // consumers split the head dim, the block's keys' half of the columns.
    let score_key = config.score_keys() * consumer;
    let first_key = b.first_key + score_key;
    let (gradient_key, gradient_column) =
        if split { (0, config.gradient_columns() * consumer) } else { (CONSUMER_ROWS * consumer, 0) };
    let lse_scale = core::f32::consts::LOG2_E;
    let dq_columns = config.dq_columns();
    let (dq_first_column, dq_keys) =
        if shared_d_s::<D>() { (dq_columns * consumer, 0..config.block_n()) } else { (0, 0..CONSUMER_ROWS) };
    let dq_key_offset = if shared_d_s::<D>() { 0 } else { CONSUMER_ROWS * consumer };

    let mut d_v = WgmmaAccumulator::<DV_REGS>::new([0.0; DV_REGS]);
    let mut d_k = WgmmaAccumulator::<DV_REGS>::new([0.0; DV_REGS]);
    arch::mbarrier_wait_parity(smem.kv_full(), 0);
    let heads_per_kv = f.heads_per_kv;
    let mut n = 0;
    for g in 0..heads_per_kv {
        let head = b.kv_head * heads_per_kv + g;
        for step in b.first_step..b.end_step {
            let (stage, parity) = stage_of(n, HOPPER_BACKWARD_STAGES);
            let (d_o_stage, d_o_parity) = stage_of(n, Smem::<D>::D_O_STAGES);
            let buffer = n % 2;
            // Where the consumer's P and dS go: P its own slab, or where
            // both consumers' gradients read it, the step's buffer; dS the
            // step's buffer, one slab per consumer or the block's 64 keys
            // in one, the consumer's from column `score_column` on.
            let (p_slab, d_s_slab, score_column) = if split { (buffer, 0, score_key) } else { (consumer, consumer, 0) };
            // Re-derived each step rather than held through it (registers).
            let thread = arch::thread_idx_x_here() % WARPGROUP_THREADS;
            let (warp, lane) = (thread / 32, thread % 32);
            let first_row = step * HOPPER_BACKWARD_BLOCK_M;
            let warp_row = first_row + 16 * warp + lane / 4;
            // The two rows' LSE (log2, +inf for a row past seqlen_q or one
            // that sees no key: its P is 0) and delta.
            let mut lse = [f32::INFINITY; 2];
            let mut delta = [0.0; 2];
            for half in 0..2 {
                let row = warp_row + 8 * half as u32;
                if row < rows.seqlen_q {
                    let at = rows.lse_index(f, head, row) as isize;
                    let l = arch::ld_global_f32(f.lse.offset(at));
                    lse[half] = if l == f32::NEG_INFINITY { f32::INFINITY } else { l * lse_scale };
                    delta[half] = arch::ld_global_f32(p.delta.offset(at));
                }
            }

            // Where the step's dQ goes, for the warps that add it. They
            // read it once this step's first turn is in (consumer 0 arrives
            // at it after this store); they last read the slot two steps
            // back, before freeing the buffer for the last step's first
            // turn, which consumer 0 waited for.
            if consumer == 0 && thread == 0 {
                let first = rows.lse_index(f, head, first_row) as u64;
                let at = smem.d_q_rows(n % 2);
                arch::st_shared_v2(at, [first as u32, (first >> 32) as u32]);
                // The slot's last word is padding, stored so that the
                // adders' one 16-byte load reads no unwritten memory.
                arch::st_shared_v2(at + 8, [(rows.seqlen_q - first_row).min(HOPPER_BACKWARD_BLOCK_M), 0]);
            }
            arch::mbarrier_wait_parity(smem.q_full(stage), parity);
            let mut s = WgmmaAccumulator::<S_REGS>::new([0.0; S_REGS]);
            let mut d_p = WgmmaAccumulator::<S_REGS>::new([0.0; S_REGS]);
            arch::wgmma_fence_operand(&mut s);
            arch::wgmma_fence_operand(&mut d_p);
            arch::wgmma_fence();
            // Over the head dim only: the tiles' columns past it are zeros.
            for k in 0..(D / 16) as u32 {
                let (a, b_desc) = smem.scores_operands(stage, score_key, k);
                E::wgmma_ss::<S_REGS, 0, 0>(&mut s, a, b_desc, k > 0);
            }
            if split {
                arch::wgmma_commit_group();
            }
            arch::mbarrier_wait_parity(smem.d_o_full(d_o_stage), d_o_parity);
            for k in 0..(D / 16) as u32 {
                let (a, b_desc) = smem.d_p_operands(d_o_stage, score_key, k);
                E::wgmma_ss::<S_REGS, 0, 0>(&mut d_p, a, b_desc, k > 0);
            }
            arch::wgmma_commit_group();
            // Where the consumers split the head dim, P while dP is still
            // being computed (with dQ's group below, 2-11% there; below
            // d = 128 the two were within -4..+5% and are not used).
            if split {
                arch::wgmma_wait_group::<1>();
            } else {
                arch::wgmma_wait_group::<0>();
                arch::wgmma_fence_operand(&mut d_p);
            }
            arch::wgmma_fence_operand(&mut s);

            let s_tiles = as_tiles::<S_REGS, S_TILES>(&mut s);
            if CAUSAL {
                // Some row of the step does not see the consumer's last key.
                let last_key = (first_key + config.score_keys() - 1) as i32;
                if (first_row as i32) + b.visibility.diagonal < last_key {
                    let mask =
                        ScoreMask { first_row: (first_row + 16 * warp) as i32, visibility: b.visibility, causal: true };
                    mask.apply(s_tiles, first_key as i32, lane);
                }
            }
            let scale_log2 = f.scale_log2;
            if split {
                for (t, s_t) in s_tiles[0].iter_mut().enumerate() {
                    for (i, score) in s_t.iter_mut().enumerate() {
                        *score = arch::exp2(*score * scale_log2 - lse[i / 2]);
                    }
                    store_scores::<E>(smem.p(p_slab), s_t, score_column + 8 * t as u32, warp, lane);
                }
                arch::wgmma_wait_group::<0>();
                arch::wgmma_fence_operand(&mut d_p);
            } else {
                // One P buffer per consumer. (Where the consumers split the
                // head dim, P's buffers alternate: every thread of both
                // reaches the last step's `sync_stores` past its wait for
                // the products of the step before, the last to read this
                // step's buffer.)
                sync_p_readers(consumer);
            }
            let d_p_tiles = as_tiles::<S_REGS, S_TILES>(&mut d_p);
            for (t, (s_t, dp_t)) in s_tiles[0].iter_mut().zip(d_p_tiles[0].iter_mut()).enumerate() {
                for i in 0..4 {
                    if !split {
                        s_t[i] = arch::exp2(s_t[i] * scale_log2 - lse[i / 2]);
                    }
                    dp_t[i] = s_t[i] * (dp_t[i] - delta[i / 2]);
                }
                // Row `lane / 4 + 8 half` of the warp, keys `8 t + 2 (lane %
                // 4)`: P's and dS's stores at one offset (through
                // `store_scores` twice, at d = 128 causal, it spilled).
                for half in 0..2 {
                    let row = 16 * warp + lane / 4 + 8 * half as u32;
                    let offset = swizzled(row, score_column + 8 * t as u32 + 2 * (lane % 4));
                    if !split {
                        arch::st_shared_u32(smem.p(p_slab) + offset, E::pack(s_t[2 * half], s_t[2 * half + 1]));
                    }
                    let d_s = E::pack(dp_t[2 * half], dp_t[2 * half + 1]);
                    arch::st_shared_u32(smem.d_s(buffer, d_s_slab) + offset, d_s);
                }
            }
            // The stores are the generic proxy's; `wgmma` reads through the async one.
            arch::fence_proxy_async_shared();
            sync_stores::<D>(consumer);

            // Where the consumers split the head dim, dQ first, in a group
            // of its own: it goes out while dV and dK are still being
            // computed; then dV's, which frees dO's stage ahead of dK.
            let mut d_q = WgmmaAccumulator::<DQ_REGS>::new([0.0; DQ_REGS]);
            arch::wgmma_fence_operand(&mut d_v);
            arch::wgmma_fence_operand(&mut d_k);
            arch::wgmma_fence_operand(&mut d_q);
            arch::wgmma_fence();
            let issue_d_q = |d_q: &mut WgmmaAccumulator<DQ_REGS>| {
                for key in dq_keys.clone().step_by(16) {
                    let (a, b_desc) = smem.d_q_operands(buffer, key + dq_key_offset, dq_first_column);
                    E::wgmma_ss::<DQ_REGS, 0, 1>(d_q, a, b_desc, key > dq_keys.start);
                }
            };
            if split {
                issue_d_q(&mut d_q);
                arch::wgmma_commit_group();
            }
            for k in 0..HOPPER_BACKWARD_BLOCK_M / 16 {
                let (a, b_desc) = smem.d_v_operands(d_o_stage, p_slab, gradient_column, k);
                E::wgmma_ss::<DV_REGS, 1, 1>(&mut d_v, a, b_desc, true);
            }
            if split {
                arch::wgmma_commit_group();
            }
            for k in 0..HOPPER_BACKWARD_BLOCK_M / 16 {
                let (a, b_desc) = smem.d_k_operands(buffer, stage, d_s_slab, gradient_column, k);
                E::wgmma_ss::<DV_REGS, 1, 1>(&mut d_k, a, b_desc, true);
            }
            if split {
                arch::wgmma_commit_group();
                arch::wgmma_wait_group::<2>();
            } else {
                issue_d_q(&mut d_q);
                arch::wgmma_commit_group();
                arch::wgmma_wait_group::<0>();
            }
            arch::wgmma_fence_operand(&mut d_q);

            // The step's dQ to shared memory once the buffer is free for
            // the consumer's turn: turn 0 once the last turn of the last
            // step has been read, turn 1 once this step's turn 0 has. The
            // producer warpgroup adds it to the accumulator.
            let turn = consumer % Smem::<D>::DQ_TURNS;
            let empty_parity = if turn == 0 { (n & 1) ^ 1 } else { n & 1 };
            arch::mbarrier_wait_parity(smem.d_q_empty(turn), empty_parity);
            // The lane's first element; the others are constants further.
            let buffer_column = dq_first_column % Smem::<D>::DQ_BUFFER_COLUMNS;
            let lane_at =
                smem.d_q(consumer % Smem::<D>::DQ_PARTIALS, 16 * warp + lane / 4, 4 * buffer_column) + 8 * (lane % 4);
            let d_q_tiles = as_tiles::<DQ_REGS, DQ_TILES>(&mut d_q);
            for (t, tile) in d_q_tiles[0].iter().enumerate() {
                for half in 0..2 {
                    let at = lane_at + 32 * t as u32 + 8 * half as u32 * Smem::<D>::DQ_PITCH;
                    arch::st_shared_v2(at, [tile[2 * half].to_bits(), tile[2 * half + 1].to_bits()]);
                }
            }
            arch::mbarrier_arrive(smem.d_q_full(turn));
            if split {
                arch::wgmma_wait_group::<1>();
            }
            if lane == 0 {
                arch::mbarrier_arrive(smem.d_o_empty(d_o_stage));
            }
            arch::wgmma_wait_group::<0>();
            arch::wgmma_fence_operand(&mut d_v);
            arch::wgmma_fence_operand(&mut d_k);
            if lane == 0 {
                arch::mbarrier_arrive(smem.q_empty(stage));
            }
            n += 1;
        }
    }
    write_keys::<E, D, DV_REGS, DV_TILES>(
        p,
        &b,
        &rows,
        &mut d_k,
        &mut d_v,
        b.first_key + gradient_key,
        gradient_column,
    );
}

/// Whether n8-tile `t` of a product's columns from `first_column` on holds
/// columns of the head dim `D`, not of the tile's padding past it (d =
/// 160 and 224): always where the tile dim is the head dim.
#[inline(always)]
fn in_head_dim<const D: usize>(first_column: u32, t: usize) -> bool {
    let tile_dim = const { hopper_backward_config_of(D as u32).tile_dim() };
    tile_dim == D as u32 || first_column + 8 * (t as u32) < D as u32
}

/// Stores one n8-tile of a warp's P or dS, rounded, to the slab at `slab`
/// (64-key rows): the lane's rows `lane / 4` and `lane / 4 + 8` of the
/// warp's 16, keys `column + 2 (lane % 4)` and the next, one 4-byte store
/// each.
#[inline(always)]
unsafe fn store_scores<E: Element>(slab: u32, tile: &[f32; 4], column: u32, warp: u32, lane: u32) {
    for half in 0..2 {
        let row = 16 * warp + lane / 4 + 8 * half as u32;
        let offset = swizzled(row, column + 2 * (lane % 4));
        arch::st_shared_u32(slab + offset, E::pack(tile[2 * half], tile[2 * half + 1]));
    }
}

/// The byte offset of element `column` (even) of row `row` in a slab of
/// 128-byte rows in the 128-byte swizzle (its base 1024-byte aligned): the
/// row's 16-byte chunks XORed with the row's place in its 8-row group.
/// Re-derived at each use ([`arch::xor_in_place`]): LLVM would otherwise
/// hold the 16 offsets of a lane's stores through the loop.
#[inline(always)]
fn swizzled(row: u32, column: u32) -> u32 {
    let byte = 2 * column;
    row * SLAB_ROW_BYTES + arch::xor_in_place(byte / 16, row % 8) * 16 + byte % 16
}

/// The epilogue of the consumer's 64 keys from `first_key` (a warp's 16
/// each): dK times the softmax scale and dV, rounded, of the columns from
/// `first_column` on, each lane storing its two columns of every n8-tile.
/// Keys past seqlen_k and columns past the head dim are not written.
///
/// # Safety
/// dK and dV hold every key of the call.
#[inline(always)]
unsafe fn write_keys<E: Element, const D: usize, const DV_REGS: usize, const DV_TILES: usize>(
    p: &BackwardParams,
    b: &KeyBlock,
    rows: &BatchRows,
    d_k: &mut WgmmaAccumulator<DV_REGS>,
    d_v: &mut WgmmaAccumulator<DV_REGS>,
    first_key: u32,
    first_column: u32,
) {
    let thread = arch::thread_idx_x_here() % WARPGROUP_THREADS;
    let (warp, lane) = (thread / 32, thread % 32);
    let (batch, head) = (b.batch as i64, b.kv_head as i64);
    let d_k_base = p.d_k.offset((batch * p.d_k_batch_stride + head * p.d_k_head_stride) as isize);
    let d_v_base = p.d_v.offset((batch * p.d_v_batch_stride + head * p.d_v_head_stride) as isize);
    let scale = p.softmax_scale;
    let d_k_tiles = as_tiles::<DV_REGS, DV_TILES>(d_k);
    let d_v_tiles = as_tiles::<DV_REGS, DV_TILES>(d_v);
    for half in 0..2 {
        let key = first_key + 16 * warp + lane / 4 + 8 * half as u32;
        if key >= rows.seqlen_k {
            continue;
        }
        let d_k_row = d_k_base.offset((key as i64 * p.d_k_row_stride) as isize);
        let d_v_row = d_v_base.offset((key as i64 * p.d_v_row_stride) as isize);
        for (t, (k_t, v_t)) in d_k_tiles[0].iter().zip(d_v_tiles[0].iter()).enumerate() {
            if !in_head_dim::<D>(first_column, t) {
                continue;
            }
            let column = (first_column + 8 * t as u32 + 2 * (lane % 4)) as usize;
            let dk = E::pack(k_t[2 * half] * scale, k_t[2 * half + 1] * scale);
            arch::st_global_u32(d_k_row.add(column).cast::<u32>(), dk);
            arch::st_global_u32(d_v_row.add(column).cast::<u32>(), E::pack(v_t[2 * half], v_t[2 * half + 1]));
        }
    }
}

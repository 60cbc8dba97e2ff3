//! A consumer warpgroup of the sm_90a backward: 64 keys of the block,
//! through every query step of every query head of the group.
//!
//! Per step (64 query rows, Q and dO in stage `stage`):
//!
//! 1. `S = Q K^T` and `dP = dO V^T` for the consumer's keys (`wgmma` SS,
//!    one group), the rows' LSE and delta read meanwhile;
//! 2. `P = exp2(S log2(e) scale - LSE log2(e))` with the causal mask, `dS
//!    = P (dP - delta)`, both rounded and stored to shared memory as
//!    64-key rows (the accumulator fragment's own layout: a lane's two
//!    neighbouring keys are one 4-byte store);
//! 3. once every warp that reads them has stored (a named barrier: both
//!    consumers at d = 128, whose dQ reads both halves of dS),
//!    `dV += P^T dO` and `dK += dS^T Q` (A transposed from shared memory)
//!    and the consumer's part of `dQ = dS K`, one group;
//! 4. release the stage, and store dQ to shared memory (once the last
//!    step's has been read), where the producer warpgroup's other warps
//!    add it to the f32 accumulator.
//!
//! At the end dK (times the softmax scale) and dV of the consumer's keys
//! are stored. The `wgmma` accumulator fragment is the `mma.sync` C
//! fragment over n8-tiles (a warp's 16 rows, a lane's rows `lane / 4` and
//! `lane / 4 + 8`, two neighbouring columns per tile).

use flash_attn_abi::backward::BackwardParams;
use flash_attn_abi::hopper::{CONSUMER_ROWS, SLAB_ROW_BYTES, WARPGROUP_THREADS};
use flash_attn_abi::hopper_backward::{hopper_backward_config_of, HOPPER_BACKWARD_BLOCK_M};

use super::smem::Smem;
use super::{stage_of, KeyBlock};
use crate::arch::{self, WgmmaAccumulator};
use crate::backward::BatchRows;
use crate::element::Element;
use crate::hopper::consumer::as_tiles;
use crate::softmax::ScoreMask;

/// Accumulator registers and n8-tiles of a 64 x 64 product (S, dP).
const SQUARE_REGS: usize = 32;
const SQUARE_TILES: usize = 8;

/// Waits until every warp that reads consumer `consumer`'s stores of P and
/// dS has stored: a named barrier of both consumers where dQ reads both
/// halves of dS (d = 128), else one per consumer (0 is the block's
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

/// Whether each consumer's dQ reads both consumers' dS (d = 128: each
/// takes half the columns over all keys) or its own (d = 32, 64 and 96).
#[inline(always)]
const fn shared_d_s<const D: usize>() -> bool {
    hopper_backward_config_of(D as u32).dq_columns() < D as u32
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
    const DV_REGS: usize,
    const DV_TILES: usize,
    const DQ_REGS: usize,
    const DQ_TILES: usize,
>(
    p: &BackwardParams,
    smem: &Smem<D>,
    consumer: u32,
) {
    let f = &p.forward;
    let b = KeyBlock::of(p, CAUSAL);
    let rows = BatchRows::of(f, b.batch);
    let first_key = b.first_key + CONSUMER_ROWS * consumer;
    let lse_scale = core::f32::consts::LOG2_E;
    let dq_columns = const { hopper_backward_config_of(D as u32).dq_columns() };
    let (dq_first_column, dq_keys) =
        if shared_d_s::<D>() { (dq_columns * consumer, 0..2 * CONSUMER_ROWS) } else { (0, 0..CONSUMER_ROWS) };
    let dq_key_offset = if shared_d_s::<D>() { 0 } else { CONSUMER_ROWS * consumer };

    let mut d_v = WgmmaAccumulator::<DV_REGS>::new([0.0; DV_REGS]);
    let mut d_k = WgmmaAccumulator::<DV_REGS>::new([0.0; DV_REGS]);
    arch::mbarrier_wait_parity(smem.kv_full(), 0);
    let heads_per_kv = f.heads_per_kv;
    let mut n = 0;
    for g in 0..heads_per_kv {
        let head = b.kv_head * heads_per_kv + g;
        for step in b.first_step..b.end_step {
            let (stage, parity) = stage_of(n);
            let buffer = n % 2;
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

            arch::mbarrier_wait_parity(smem.q_full(stage), parity);
            let mut s = WgmmaAccumulator::<SQUARE_REGS>::new([0.0; SQUARE_REGS]);
            let mut d_p = WgmmaAccumulator::<SQUARE_REGS>::new([0.0; SQUARE_REGS]);
            arch::wgmma_fence_operand(&mut s);
            arch::wgmma_fence_operand(&mut d_p);
            arch::wgmma_fence();
            for k in 0..(D / 16) as u32 {
                let (a, b_desc) = smem.scores_operands(stage, consumer, k);
                E::wgmma_ss::<SQUARE_REGS, 0, 0>(&mut s, a, b_desc, k > 0);
            }
            for k in 0..(D / 16) as u32 {
                let (a, b_desc) = smem.d_p_operands(stage, consumer, k);
                E::wgmma_ss::<SQUARE_REGS, 0, 0>(&mut d_p, a, b_desc, k > 0);
            }
            arch::wgmma_commit_group();
            arch::wgmma_wait_group::<0>();
            arch::wgmma_fence_operand(&mut s);
            arch::wgmma_fence_operand(&mut d_p);

            let s_tiles = as_tiles::<SQUARE_REGS, SQUARE_TILES>(&mut s);
            if CAUSAL {
                // Some row of the step does not see the consumer's last key.
                let last_key = (first_key + CONSUMER_ROWS - 1) as i32;
                if (first_row as i32) + b.visibility.diagonal < last_key {
                    let mask =
                        ScoreMask { first_row: (first_row + 16 * warp) as i32, visibility: b.visibility, causal: true };
                    mask.apply(s_tiles, first_key as i32, lane);
                }
            }
            let d_p_tiles = as_tiles::<SQUARE_REGS, SQUARE_TILES>(&mut d_p);
            let scale_log2 = f.scale_log2;
            for (t, (s_t, dp_t)) in s_tiles[0].iter_mut().zip(d_p_tiles[0].iter_mut()).enumerate() {
                for i in 0..4 {
                    let half = i / 2;
                    let prob = arch::exp2(s_t[i] * scale_log2 - lse[half]);
                    s_t[i] = prob;
                    dp_t[i] = prob * (dp_t[i] - delta[half]);
                }
                // Row `lane / 4 + 8 half` of the warp, keys `8 t + 2 (lane % 4)`.
                for half in 0..2 {
                    let row = 16 * warp + lane / 4 + 8 * half as u32;
                    let offset = swizzled(row, 8 * t as u32 + 2 * (lane % 4));
                    arch::st_shared_u32(smem.p(consumer) + offset, E::pack(s_t[2 * half], s_t[2 * half + 1]));
                    arch::st_shared_u32(
                        smem.d_s(buffer, consumer) + offset,
                        E::pack(dp_t[2 * half], dp_t[2 * half + 1]),
                    );
                }
            }
            // The stores are the generic proxy's; `wgmma` reads through the async one.
            arch::fence_proxy_async_shared();
            sync_stores::<D>(consumer);

            let mut d_q = WgmmaAccumulator::<DQ_REGS>::new([0.0; DQ_REGS]);
            arch::wgmma_fence_operand(&mut d_v);
            arch::wgmma_fence_operand(&mut d_k);
            arch::wgmma_fence_operand(&mut d_q);
            arch::wgmma_fence();
            for k in 0..HOPPER_BACKWARD_BLOCK_M / 16 {
                let (a, b_desc) = smem.d_v_operands(stage, consumer, k);
                E::wgmma_ss::<DV_REGS, 1, 1>(&mut d_v, a, b_desc, true);
            }
            for k in 0..HOPPER_BACKWARD_BLOCK_M / 16 {
                let (a, b_desc) = smem.d_k_operands(buffer, stage, consumer, k);
                E::wgmma_ss::<DV_REGS, 1, 1>(&mut d_k, a, b_desc, true);
            }
            for key in dq_keys.clone().step_by(16) {
                let (a, b_desc) = smem.d_q_operands(buffer, key + dq_key_offset, dq_first_column);
                E::wgmma_ss::<DQ_REGS, 0, 1>(&mut d_q, a, b_desc, key > dq_keys.start);
            }
            arch::wgmma_commit_group();
            arch::wgmma_wait_group::<0>();
            arch::wgmma_fence_operand(&mut d_v);
            arch::wgmma_fence_operand(&mut d_k);
            arch::wgmma_fence_operand(&mut d_q);
            if lane == 0 {
                arch::mbarrier_arrive(smem.q_empty(stage));
            }

            // The step's dQ to shared memory, once the last step's has
            // been read; the producer warpgroup adds it to the accumulator.
            arch::mbarrier_wait_parity(smem.d_q_empty(), (n & 1) ^ 1);
            // The lane's first element; the others are constants further.
            let lane_at =
                smem.d_q(consumer % Smem::<D>::DQ_PARTIALS, 16 * warp + lane / 4, 4 * dq_first_column) + 8 * (lane % 4);
            for (t, tile) in as_tiles::<DQ_REGS, DQ_TILES>(&mut d_q)[0].iter().enumerate() {
                for half in 0..2 {
                    let at = lane_at + 32 * t as u32 + 8 * half as u32 * Smem::<D>::DQ_PITCH;
                    arch::st_shared_v2(at, [tile[2 * half].to_bits(), tile[2 * half + 1].to_bits()]);
                }
            }
            arch::mbarrier_arrive(smem.d_q_full());
            n += 1;
        }
    }
    let thread = arch::thread_idx_x_here() % WARPGROUP_THREADS;
    let (warp, lane) = (thread / 32, thread % 32);
    write_keys::<E, D, DV_REGS, DV_TILES>(p, &b, &rows, &mut d_k, &mut d_v, first_key + 16 * warp, lane);
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

/// The epilogue of one warp's 16 keys from `warp_first_key`: dK times the
/// softmax scale and dV, rounded, each lane storing its two columns of
/// every n8-tile. Keys past seqlen_k are not written.
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
    warp_first_key: u32,
    lane: u32,
) {
    let (batch, head) = (b.batch as i64, b.kv_head as i64);
    let d_k_base = p.d_k.offset((batch * p.d_k_batch_stride + head * p.d_k_head_stride) as isize);
    let d_v_base = p.d_v.offset((batch * p.d_v_batch_stride + head * p.d_v_head_stride) as isize);
    let scale = p.softmax_scale;
    let d_k_tiles = as_tiles::<DV_REGS, DV_TILES>(d_k);
    let d_v_tiles = as_tiles::<DV_REGS, DV_TILES>(d_v);
    for half in 0..2 {
        let key = warp_first_key + lane / 4 + 8 * half as u32;
        if key >= rows.seqlen_k {
            continue;
        }
        let d_k_row = d_k_base.offset((key as i64 * p.d_k_row_stride) as isize);
        let d_v_row = d_v_base.offset((key as i64 * p.d_v_row_stride) as isize);
        for (t, (k_t, v_t)) in d_k_tiles[0].iter().zip(d_v_tiles[0].iter()).enumerate() {
            let column = 8 * t + 2 * (lane % 4) as usize;
            let dk = E::pack(k_t[2 * half] * scale, k_t[2 * half + 1] * scale);
            arch::st_global_u32(d_k_row.add(column).cast::<u32>(), dk);
            arch::st_global_u32(d_v_row.add(column).cast::<u32>(), E::pack(v_t[2 * half], v_t[2 * half + 1]));
        }
    }
}

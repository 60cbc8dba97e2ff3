//! A consumer warpgroup of the sm_90a backward above d = 128, where the
//! consumers split the head dim, through every query step of every query
//! head of the group: half the columns of the block's 64 keys' gradients.
//!
//! Per step (64 query rows, Q and dO in their rings' stages):
//!
//! 1. `S = Q K^T` and `dP = dO V^T` for the consumer's 32 score keys
//!    (`wgmma` SS, a group each), the rows' LSE and delta read meanwhile;
//! 2. `P = exp2(S log2(e) scale - LSE log2(e))` with the causal mask
//!    while dP is computed, then `dS = P (dP - delta)`, both rounded and
//!    stored to shared memory as 64-key rows of the step's buffers (the
//!    accumulator fragment's own layout: a lane's two neighbouring keys
//!    are one 4-byte store): both consumers' gradients read every key;
//! 3. once both consumers have stored (a named barrier), the consumer's
//!    half of the columns of `dQ = dS K`, `dV += P^T dO` and `dK += dS^T Q`
//!    (A transposed from shared memory), three groups;
//! 4. store dQ to shared memory while dV and dK are still being computed
//!    (once the buffer's last turn has been read), where the producer
//!    warpgroup's other warps add it to the f32 accumulator; then release
//!    dO's stage once dV is computed, and Q's.
//!
//! At the end dK (times the softmax scale) and dV of the consumer's columns
//! of the block's keys are written ([`super::epilogue`]).

use flash_attn_abi::backward::BackwardParams;
use flash_attn_abi::hopper_backward::hopper_backward_config_of;

use super::consumer::{announce_d_q_rows, issue_scores, store_d_q, swizzled, sync_stores};
use super::epilogue::write_keys;
use super::smem::Smem;
use super::{KeyBlock, StepPlace};
use crate::arch::{self, WgmmaAccumulator};
use crate::backward::BatchRows;
use crate::common::element::Element;
use crate::common::softmax::ScoreMask;
use crate::forward::sm90::consumer::as_tiles;

/// Computes consumer `consumer`'s columns of the block's keys' dK and dV
/// over every step (64 query rows: one `wgmma` M of S) and adds its
/// columns of each step's dQ.
///
/// # Safety
/// As [`super::hopper_backward`]; both consumer warpgroups call it, above
/// d = 128.
#[inline(always)]
pub unsafe fn compute_key_columns<
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
    let config = const { hopper_backward_config_of(D as u32) };
    let f = &p.forward;
    let b = KeyBlock::of::<D>(p, CAUSAL);
    let rows = BatchRows::of(f, b.batch);
    // The consumer's score keys from the block's first, and the columns of
    // its gradients and of its dQ: half of them.
    let score_key = config.score_keys() * consumer;
    let first_key = b.first_key + score_key;
    let gradient_column = config.gradient_columns() * consumer;
    let lse_scale = core::f32::consts::LOG2_E;
    let dq_first_column = config.dq_columns() * consumer;

    let mut d_v = WgmmaAccumulator::<DV_REGS>::new([0.0; DV_REGS]);
    let mut d_k = WgmmaAccumulator::<DV_REGS>::new([0.0; DV_REGS]);
    arch::mbarrier_wait_parity(smem.kv_full(), 0);
    let heads_per_kv = f.heads_per_kv;
    let mut n = 0;
    for g in 0..heads_per_kv {
        let head = b.kv_head * heads_per_kv + g;
        for step in b.first_step..b.end_step {
            // P's and dS's `buffer`: every thread of both consumers reaches
            // the last step's `sync_stores` past its wait for the products
            // of the step before, the last to read this step's buffer.
            let StepPlace { stage, d_o_stage, buffer, thread, warp, lane, first_row } = StepPlace::of::<D>(n, step);
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
            if consumer == 0 && thread == 0 {
                announce_d_q_rows::<D>(smem, &rows, f, head, first_row, n);
            }
            let (mut s, mut d_p) = issue_scores::<E, D, S_REGS, false>(smem, n, score_key);
            // P while dP is still being computed (with dQ's group below,
            // 2-11% here).
            arch::wgmma_wait_group::<1>();
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
            for (t, s_t) in s_tiles[0].iter_mut().enumerate() {
                for (i, score) in s_t.iter_mut().enumerate() {
                    *score = arch::exp2(*score * scale_log2 - lse[i / 2]);
                }
                store_scores::<E>(smem.p(buffer), s_t, score_key + 8 * t as u32, warp, lane);
            }
            arch::wgmma_wait_group::<0>();
            arch::wgmma_fence_operand(&mut d_p);
            let d_p_tiles = as_tiles::<S_REGS, S_TILES>(&mut d_p);
            for (t, (s_t, dp_t)) in s_tiles[0].iter_mut().zip(d_p_tiles[0].iter_mut()).enumerate() {
                for i in 0..4 {
                    dp_t[i] = s_t[i] * (dp_t[i] - delta[i / 2]);
                }
                // Written out: through `store_scores` at tile dim 256 causal
                // it spilled.
                for half in 0..2 {
                    let row = 16 * warp + lane / 4 + 8 * half as u32;
                    let offset = swizzled(row, score_key + 8 * t as u32 + 2 * (lane % 4));
                    let d_s = E::pack(dp_t[2 * half], dp_t[2 * half + 1]);
                    arch::st_shared_u32(smem.d_s(buffer, 0) + offset, d_s);
                }
            }
            // The stores are the generic proxy's; `wgmma` reads through the async one.
            arch::fence_proxy_async_shared();
            sync_stores::<D>(consumer);

            // dQ first, in a group of its own: it goes out while dV and dK
            // are still being computed; then dV's, which frees dO's stage
            // ahead of dK.
            let mut d_q = WgmmaAccumulator::<DQ_REGS>::new([0.0; DQ_REGS]);
            arch::wgmma_fence_operand(&mut d_v);
            arch::wgmma_fence_operand(&mut d_k);
            arch::wgmma_fence_operand(&mut d_q);
            arch::wgmma_fence();
            for key in (0..config.block_n()).step_by(16) {
                let (a, b_desc) = smem.d_q_operands(buffer, key, dq_first_column);
                E::wgmma_ss::<DQ_REGS, 0, 1>(&mut d_q, a, b_desc, key > 0);
            }
            arch::wgmma_commit_group();
            for k in 0..Smem::<D>::BLOCK_M / 16 {
                let (a, b_desc) = smem.d_v_operands(d_o_stage, buffer, gradient_column, k);
                E::wgmma_ss::<DV_REGS, 1, 1>(&mut d_v, a, b_desc, true);
            }
            arch::wgmma_commit_group();
            for k in 0..Smem::<D>::BLOCK_M / 16 {
                let (a, b_desc) = smem.d_k_operands(buffer, stage, 0, gradient_column, k);
                E::wgmma_ss::<DV_REGS, 1, 1>(&mut d_k, a, b_desc, true);
            }
            arch::wgmma_commit_group();
            arch::wgmma_wait_group::<2>();
            arch::wgmma_fence_operand(&mut d_q);

            store_d_q::<D, DQ_REGS, DQ_TILES>(smem, &mut d_q, consumer, n, (0, dq_first_column), warp, lane);
            arch::wgmma_wait_group::<1>();
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
    write_keys::<E, D, DV_REGS, DV_TILES>(p, smem, &b, &rows, (&mut d_k, &mut d_v), (0, gradient_column));
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

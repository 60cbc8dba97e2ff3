//! A consumer warpgroup of the sm_90a backward up to d = 128, through every
//! query step of every query head of the group: 64 keys of the block, all
//! of their columns. (Above d = 128 the consumers split the head dim:
//! [`super::split_consumer`].)
//!
//! It computes the scores transposed, its 64 keys as the `wgmma` M, as
//! FlashAttention-3's backward: the probabilities and their gradients are
//! then in registers in the layout the key gradients take as A. Per step
//! (the config's `block_m` query rows, 128 up to d = 64, else 64; Q and dO
//! in their rings' stages):
//!
//! 1. `S^T = K Q^T` and `dP^T = V dO^T` (`wgmma` SS, a group each), while
//!    the warpgroup puts the rows' LSE and delta in shared memory (each
//!    lane's fragment holds 16 query rows, which it reads from there);
//! 2. `P^T = exp2(S^T log2(e) scale - LSE log2(e))` with the causal mask,
//!    then `dS^T = P^T (dP^T - delta)`, both rounded to A fragments;
//! 3. `dV += P^T dO` and `dK += dS^T Q` (`wgmma` RS) while dS^T goes to
//!    shared memory, then, once every warp that reads it has stored (a
//!    named barrier: both consumers where each consumer's dQ reads both
//!    consumers' keys, for half the columns at d = 128 or half the rows of
//!    a step of 128), the consumer's part of `dQ = dS K` (dS^T as the
//!    transposed A), all in one group;
//! 4. store dQ to shared memory (once the buffer's last turn has been
//!    read), where the producer warpgroup's other warps add it to the f32
//!    accumulator; then release dO's stage and Q's.
//!
//! At the end dK (times the softmax scale) and dV of the consumer's keys
//! are written ([`super::epilogue`]). The `wgmma` accumulator fragment is
//! the `mma.sync` C fragment over n8-tiles (a warp's 16 rows, a lane's
//! rows `lane / 4` and `lane / 4 + 8`, two neighbouring columns per tile).

use flash_attn_abi::backward::BackwardParams;
use flash_attn_abi::hopper::{CONSUMER_ROWS, SLAB_ROW_BYTES, WARPGROUP_THREADS};
use flash_attn_abi::hopper_backward::{hopper_backward_config_of, HOPPER_BACKWARD_STAGES};

use super::epilogue::write_keys;
use super::smem::Smem;
use super::{stage_of, KeyBlock, StepPlace};
use crate::arch::{self, WgmmaAccumulator};
use crate::backward::BatchRows;
use crate::common::element::Element;
use crate::common::mma::probabilities_as_a;
use crate::common::softmax::mask_causal_transposed;
use crate::forward::sm90::consumer::as_tiles;

/// Waits until every warp that reads consumer `consumer`'s stores of dS
/// (and where the consumers split the head dim, of P) has stored: a named
/// barrier of both consumers where dQ reads both consumers' dS (d = 128
/// and above), else one per consumer (0 is the block's `bar.sync 0`). The
/// ids are constants: ptxas counts the barriers a kernel uses from them.
#[inline(always)]
pub(super) fn sync_stores<const D: usize>(consumer: u32) {
    if shared_d_s::<D>() {
        arch::named_barrier_sync(1, 2 * WARPGROUP_THREADS);
    } else if consumer == 0 {
        arch::named_barrier_sync(1, WARPGROUP_THREADS);
    } else {
        arch::named_barrier_sync(2, WARPGROUP_THREADS);
    }
}

/// Waits until every warp of consumer `consumer` has stored its part of
/// the step's LSE and delta: a named barrier of the warpgroup (ids 3 and
/// 4, after [`sync_stores`]'s), or of both consumers where they share one
/// copy (id 3). Their buffers alternate, so a warp that stores the next
/// step's has passed this step's barrier only once every warp has read
/// the last step's.
#[inline(always)]
fn sync_row_stats<const D: usize>(consumer: u32) {
    if Smem::<D>::ROW_STAT_COPIES == 1 {
        arch::named_barrier_sync(3, 2 * WARPGROUP_THREADS);
    } else if consumer == 0 {
        arch::named_barrier_sync(3, WARPGROUP_THREADS);
    } else {
        arch::named_barrier_sync(4, WARPGROUP_THREADS);
    }
}

/// Whether each consumer's dQ reads both consumers' dS (d = 128 and above:
/// each takes half the columns over all keys; d = 32 and 64: half the
/// rows) or its own (d = 96).
#[inline(always)]
pub(super) const fn shared_d_s<const D: usize>() -> bool {
    let c = hopper_backward_config_of(D as u32);
    c.dq_columns() < c.tile_dim() || c.splits_d_q_rows()
}

/// Computes consumer `consumer`'s keys' dK and dV over every step and adds
/// its part of each step's dQ. `S_STEPS` is the k16-steps of its S^T's
/// query rows (as A of the key gradients).
///
/// # Safety
/// As [`super::hopper_backward`]; both consumer warpgroups call it, up to
/// d = 128.
#[inline(always)]
pub unsafe fn compute_keys<
    E: Element,
    const D: usize,
    const CAUSAL: bool,
    const S_REGS: usize,
    const S_TILES: usize,
    const S_STEPS: usize,
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
    const { assert!(S_STEPS * 2 == S_TILES) }
    let f = &p.forward;
    let b = KeyBlock::of::<D>(p, CAUSAL);
    let rows = BatchRows::of(f, b.batch);
    let score_key = CONSUMER_ROWS * consumer;
    let first_key = b.first_key + score_key;
    // dQ: half the columns (d = 128) or half the rows (from `dq_first_row`:
    // d = 32 and 64) over the block's keys, or every column over the
    // consumer's own (keys from `dq_key_offset`; the count a constant, so
    // that the loop unrolls).
    let dq_first_column = if config.dq_columns() < config.tile_dim() { config.dq_columns() * consumer } else { 0 };
    let dq_first_row = if config.splits_d_q_rows() { CONSUMER_ROWS * consumer } else { 0 };
    let dq_key_offset = if shared_d_s::<D>() { 0 } else { score_key };
    let dq_keys = const {
        if shared_d_s::<D>() {
            hopper_backward_config_of(D as u32).block_n()
        } else {
            CONSUMER_ROWS
        }
    };

    let mut d_v = WgmmaAccumulator::<DV_REGS>::new([0.0; DV_REGS]);
    let mut d_k = WgmmaAccumulator::<DV_REGS>::new([0.0; DV_REGS]);
    let heads_per_kv = f.heads_per_kv;
    let last_head = (b.kv_head + 1) * heads_per_kv - 1;
    // The thread's one row statistic of each step, loaded a step ahead
    // (an L2 round trip would otherwise stall the step's start), the
    // first while K and V land.
    let mut stat = RowStat::load::<D>(p, &rows, b.kv_head * heads_per_kv, b.first_step, b.end_step);
    arch::mbarrier_wait_parity(smem.kv_full(), 0);
    let mut n = 0;
    for g in 0..heads_per_kv {
        let head = b.kv_head * heads_per_kv + g;
        for step in b.first_step..b.end_step {
            let StepPlace { stage, d_o_stage, buffer, thread, warp, lane, first_row } = StepPlace::of::<D>(n, step);
            if consumer == 0 && thread == 0 {
                announce_d_q_rows::<D>(smem, &rows, f, head, first_row, n);
            }

            let (mut s, mut d_p) = issue_scores::<E, D, S_REGS, true>(smem, n, score_key);
            let stats = smem.row_stats(consumer, buffer);
            arch::st_shared_u32(stats + RowStat::slot::<D>(), stat.value().to_bits());
            sync_row_stats::<D>(consumer);
            stat = if step + 1 < b.end_step {
                RowStat::load::<D>(p, &rows, head, step + 1, b.end_step)
            } else {
                RowStat::load::<D>(p, &rows, head + 1, b.first_step, if head < last_head { b.end_step } else { 0 })
            };
            // The lane's query rows of n8-tile `t`: `8 t + 2 (lane % 4)` and the next.
            let lane_stats = stats + 8 * (lane % 4);
            arch::wgmma_wait_group::<1>();
            arch::wgmma_fence_operand(&mut s);

            let s_tiles = as_tiles::<S_REGS, S_TILES>(&mut s);
            if CAUSAL {
                // Some row of the step does not see the consumer's last key.
                let last_key = (first_key + CONSUMER_ROWS - 1) as i32;
                let diagonal = b.visibility.diagonal;
                if (first_row as i32) + diagonal < last_key {
                    mask_causal_transposed(s_tiles, (first_key + 16 * warp) as i32, first_row as i32, diagonal, lane);
                }
            }
            let scale_log2 = f.scale_log2;
            for (t, s_t) in s_tiles[0].iter_mut().enumerate() {
                let lse = arch::ld_shared_v2(lane_stats + 32 * t as u32).map(f32::from_bits);
                for (i, score) in s_t.iter_mut().enumerate() {
                    *score = arch::exp2(*score * scale_log2 - lse[i % 2]);
                }
            }
            let p_t = probabilities_as_a::<E, 1, S_TILES, S_STEPS>(s_tiles);
            arch::wgmma_wait_group::<0>();
            arch::wgmma_fence_operand(&mut d_p);
            let d_p_tiles = as_tiles::<S_REGS, S_TILES>(&mut d_p);
            for (t, (s_t, dp_t)) in s_tiles[0].iter().zip(d_p_tiles[0].iter_mut()).enumerate() {
                let delta = arch::ld_shared_v2(lane_stats + Smem::<D>::DELTA_BYTES + 32 * t as u32).map(f32::from_bits);
                for i in 0..4 {
                    dp_t[i] = s_t[i] * (dp_t[i] - delta[i % 2]);
                }
            }
            let d_s_t = probabilities_as_a::<E, 1, S_TILES, S_STEPS>(d_p_tiles);

            let mut d_q = WgmmaAccumulator::<DQ_REGS>::new([0.0; DQ_REGS]);
            arch::wgmma_fence_operand(&mut d_v);
            arch::wgmma_fence_operand(&mut d_k);
            arch::wgmma_fence_operand(&mut d_q);
            arch::wgmma_fence();
            for (j, fragment) in p_t[0].iter().enumerate() {
                E::wgmma_rs::<DV_REGS, 1>(&mut d_v, fragment, smem.d_o_rows(d_o_stage, 0, j as u32), true);
            }
            for (j, fragment) in d_s_t[0].iter().enumerate() {
                E::wgmma_rs::<DV_REGS, 1>(&mut d_k, fragment, smem.q_rows(stage, 0, j as u32), true);
            }
            // dS^T to the consumer's slabs (64 query rows each): A fragment
            // register `r` of k-step `j` holds keys `lane / 4 + 8 (r % 2)` of
            // the warp's 16, query rows `16 j + 8 (r / 2) + 2 (lane % 4)` and
            // the next.
            for (j, fragment) in d_s_t[0].iter().enumerate() {
                let slab = consumer * Smem::<D>::D_S_ROW_SLABS + j as u32 / 4;
                for (r, &pair) in fragment.iter().enumerate() {
                    let key = 16 * warp + lane / 4 + 8 * (r as u32 % 2);
                    let row = 16 * (j as u32 % 4) + 8 * (r as u32 / 2) + 2 * (lane % 4);
                    arch::st_shared_u32(smem.d_s(buffer, slab) + swizzled(key, row), pair);
                }
            }
            // The stores are the generic proxy's; `wgmma` reads through the async one.
            arch::fence_proxy_async_shared();
            sync_stores::<D>(consumer);
            arch::wgmma_fence();
            for key in (0..dq_keys).step_by(16) {
                let (a, b_desc) =
                    smem.d_q_operands_transposed(buffer, dq_key_offset + key, dq_first_row, dq_first_column);
                E::wgmma_ss::<DQ_REGS, 1, 1>(&mut d_q, a, b_desc, key > 0);
            }
            arch::wgmma_commit_group();
            arch::wgmma_wait_group::<0>();
            arch::wgmma_fence_operand(&mut d_v);
            arch::wgmma_fence_operand(&mut d_k);
            arch::wgmma_fence_operand(&mut d_q);

            store_d_q::<D, DQ_REGS, DQ_TILES>(smem, &mut d_q, consumer, n, (dq_first_row, dq_first_column), warp, lane);
            if lane == 0 {
                arch::mbarrier_arrive(smem.d_o_empty(d_o_stage));
                arch::mbarrier_arrive(smem.q_empty(stage));
            }
            n += 1;
        }
    }
    write_keys::<E, D, DV_REGS, DV_TILES>(p, smem, &b, &rows, (&mut d_k, &mut d_v), (score_key, 0));
}

/// A consumer thread's one statistic of a step's rows, as loaded: of the
/// `2 * block_m` threads that store a copy (a consumer's 128, or both
/// consumers' 256), the first `block_m` the forward's LSE of each row
/// (natural log; +inf past seqlen_q), the others their delta (0 past
/// seqlen_q).
#[derive(Clone, Copy)]
struct RowStat {
    loaded: f32,
    is_lse: bool,
}

impl RowStat {
    /// The thread's statistic of step `step` of query head `head`, loaded
    /// where the step is below `end_step` and the row below seqlen_q.
    #[inline(always)]
    unsafe fn load<const D: usize>(p: &BackwardParams, rows: &BatchRows, head: u32, step: u32, end_step: u32) -> Self {
        let thread = Self::thread::<D>();
        let block_m = Smem::<D>::BLOCK_M;
        let is_lse = thread < block_m;
        let row = step * block_m + thread % block_m;
        let mut loaded = if is_lse { f32::INFINITY } else { 0.0 };
        if step < end_step && row < rows.seqlen_q {
            let at = rows.lse_index(&p.forward, head, row) as isize;
            loaded = arch::ld_global_f32(if is_lse { p.forward.lse } else { p.delta }.offset(at));
        }
        RowStat { loaded, is_lse }
    }

    /// The thread's place among those that store its copy.
    #[inline(always)]
    fn thread<const D: usize>() -> u32 {
        (arch::thread_idx_x_here() - WARPGROUP_THREADS) % (2 * Smem::<D>::BLOCK_M)
    }

    /// The byte offset of the thread's value in its copy's buffer.
    #[inline(always)]
    fn slot<const D: usize>() -> u32 {
        4 * Self::thread::<D>()
    }

    /// What the step's lanes read: the LSE in log2 units (+inf for a row
    /// that sees no key: its P is 0), or delta. Computed where it is
    /// stored, not where it is loaded, so that nothing waits on the load
    /// before then.
    #[inline(always)]
    fn value(self) -> f32 {
        if !self.is_lse {
            self.loaded
        } else if self.loaded == f32::NEG_INFINITY {
            f32::INFINITY
        } else {
            self.loaded * core::f32::consts::LOG2_E
        }
    }
}

/// Issues the block's `n`-th step's scores and their gradients for the
/// consumer's keys from `score_key`, a `wgmma` group each, each once its
/// operands have landed: `S = Q K^T` and `dP = dO V^T`, or where
/// `TRANSPOSED`, `S^T = K Q^T` and `dP^T = V dO^T` (the same descriptors
/// with A and B swapped). Over the head dim only: the tiles' columns past
/// it are zeros. Returns the accumulators in flight.
///
/// # Safety
/// The shared memory is the layout's.
#[inline(always)]
pub(super) unsafe fn issue_scores<E: Element, const D: usize, const S_REGS: usize, const TRANSPOSED: bool>(
    smem: &Smem<D>,
    n: u32,
    score_key: u32,
) -> (WgmmaAccumulator<S_REGS>, WgmmaAccumulator<S_REGS>) {
    let (stage, parity) = stage_of(n, HOPPER_BACKWARD_STAGES);
    let (d_o_stage, d_o_parity) = stage_of(n, Smem::<D>::D_O_STAGES);
    arch::mbarrier_wait_parity(smem.q_full(stage), parity);
    let mut s = WgmmaAccumulator::<S_REGS>::new([0.0; S_REGS]);
    let mut d_p = WgmmaAccumulator::<S_REGS>::new([0.0; S_REGS]);
    arch::wgmma_fence_operand(&mut s);
    arch::wgmma_fence_operand(&mut d_p);
    arch::wgmma_fence();
    for k in 0..(D / 16) as u32 {
        let (q, keys) = smem.scores_operands(stage, score_key, k);
        let (a, b) = if TRANSPOSED { (keys, q) } else { (q, keys) };
        E::wgmma_ss::<S_REGS, 0, 0>(&mut s, a, b, k > 0);
    }
    arch::wgmma_commit_group();
    arch::mbarrier_wait_parity(smem.d_o_full(d_o_stage), d_o_parity);
    for k in 0..(D / 16) as u32 {
        let (d_o, values) = smem.d_p_operands(d_o_stage, score_key, k);
        let (a, b) = if TRANSPOSED { (values, d_o) } else { (d_o, values) };
        E::wgmma_ss::<S_REGS, 0, 0>(&mut d_p, a, b, k > 0);
    }
    arch::wgmma_commit_group();
    (s, d_p)
}

/// Where the block's `n`-th step's dQ goes (its first row `first_row` of
/// query head `head`), for the warps that add it; consumer 0's first
/// thread, at the step's start. They read it once the step's first turn
/// is in (consumer 0 arrives at it after this store); they last read the
/// slot two steps back, before freeing the buffer for the last step's
/// first turn, which consumer 0 waited for.
///
/// # Safety
/// The shared memory is the layout's.
#[inline(always)]
pub(super) unsafe fn announce_d_q_rows<const D: usize>(
    smem: &Smem<D>,
    rows: &BatchRows,
    f: &flash_attn_abi::params::ForwardParams,
    head: u32,
    first_row: u32,
    n: u32,
) {
    let first = rows.lse_index(f, head, first_row) as u64;
    let at = smem.d_q_rows(n % 2);
    arch::st_shared_v2(at, [first as u32, (first >> 32) as u32]);
    // The slot's last word is padding, stored so that the adders' one
    // 16-byte load reads no unwritten memory.
    arch::st_shared_v2(at + 8, [(rows.seqlen_q - first_row).min(Smem::<D>::BLOCK_M), 0]);
}

/// The block's `n`-th step's dQ of consumer `consumer` (its 64 rows from
/// `dq_first_row` on, its columns from `dq_first_column` on) to shared
/// memory once the buffer is free for the
/// consumer's turn: turn 0 once the last turn of the last step has been
/// read, turn 1 once this step's turn 0 has; then says it is there. The
/// producer warpgroup adds it to the accumulator.
///
/// # Safety
/// The shared memory is the layout's; `d_q` is complete.
#[inline(always)]
pub(super) unsafe fn store_d_q<const D: usize, const DQ_REGS: usize, const DQ_TILES: usize>(
    smem: &Smem<D>,
    d_q: &mut WgmmaAccumulator<DQ_REGS>,
    consumer: u32,
    n: u32,
    (dq_first_row, dq_first_column): (u32, u32),
    warp: u32,
    lane: u32,
) {
    let turn = consumer % Smem::<D>::DQ_TURNS;
    let empty_parity = if turn == 0 { (n & 1) ^ 1 } else { n & 1 };
    arch::mbarrier_wait_parity(smem.d_q_empty(turn), empty_parity);
    // The lane's first element; the others are constants further.
    let buffer_column = dq_first_column % Smem::<D>::DQ_BUFFER_COLUMNS;
    let lane_row = dq_first_row + 16 * warp + lane / 4;
    let lane_at = smem.d_q(consumer % Smem::<D>::DQ_PARTIALS, lane_row, 4 * buffer_column) + 8 * (lane % 4);
    let d_q_tiles = as_tiles::<DQ_REGS, DQ_TILES>(d_q);
    for (t, tile) in d_q_tiles[0].iter().enumerate() {
        for half in 0..2 {
            let at = lane_at + 32 * t as u32 + 8 * half as u32 * Smem::<D>::DQ_PITCH;
            arch::st_shared_v2(at, [tile[2 * half].to_bits(), tile[2 * half + 1].to_bits()]);
        }
    }
    arch::mbarrier_arrive(smem.d_q_full(turn));
}

/// The byte offset of element `column` (even) of row `row` in a slab of
/// 128-byte rows in the 128-byte swizzle (its base 1024-byte aligned): the
/// row's 16-byte chunks XORed with the row's place in its 8-row group.
/// Re-derived at each use ([`arch::xor_in_place`]): LLVM would otherwise
/// hold the 16 offsets of a lane's stores through the loop.
#[inline(always)]
pub(super) fn swizzled(row: u32, column: u32) -> u32 {
    let byte = 2 * column;
    row * SLAB_ROW_BYTES + arch::xor_in_place(byte / 16, row % 8) * 16 + byte % 16
}

//! A consumer warpgroup: 64 query rows of each tile the producer hands
//! over with its Q, through every key block, then the epilogue.
//!
//! Per key block `i`: wait for K, issue `S = Q K^T` (`D / 16` `wgmma`s
//! from shared memory, or with Q from registers where
//! [`q_in_registers`]); wait for V of block `i - 1` and issue its `O += P
//! V` (`BN / 16` `wgmma`s with P from registers); wait for the scores only,
//! release K, and run the mask and the online softmax of block `i` in
//! registers while the tensor cores still work on `O += P V` (FlashAttention-3's
//! intra-warpgroup overlap); then wait for that, release V, and rescale O
//! where the row maxima moved. After the last block's scores (with Q in
//! registers, once it has loaded them) the consumer releases the tile's Q
//! buffer and its tile slot (the producer hands over the next tile that
//! takes the buffer, and loads its Q); the last block's `O += P V` ends
//! the tile.
//!
//! The consumers take turns at issuing their `wgmma`s, in a round
//! ([`GemmTurns`], FlashAttention-3's ping-pong): each turn issues one
//! block's GEMMs, so the tensor cores run one consumer's GEMMs while the
//! others run their softmax. Without the turns all issue at once and their
//! softmaxes line up, leaving the tensor cores idle during them.
//!
//! The `wgmma` accumulator fragment is the `mma.sync` C fragment repeated
//! over n8-tiles (a warp's 16 rows, a lane's two rows `lane / 4` and
//! `lane / 4 + 8`, two neighbouring columns per tile), so the portable
//! kernels' softmax and mask ([`crate::common::softmax`]) and P's conversion to A
//! fragments ([`crate::common::mma::probabilities_as_a`]) apply to it as they are.

use flash_attn_abi::hopper::{HopperParams, CONSUMER_ROWS, WARPGROUP_THREADS};

use super::epilogue;
use super::scheduler::{self, HopperTile, TileOrder};
use super::smem::Smem;
use super::Loads;
use crate::arch::{self, WgmmaAccumulator};
use crate::common::element::Element;
use crate::common::mma::{probabilities_as_a, Accumulators};
use crate::common::softmax::{OnlineSoftmax, ScoreMask, ScoreModifiers};
use crate::params::ForwardParams;

/// The registers of a `wgmma` accumulator as `TILES` n8-tiles of one
/// m-tile: the same `4 * TILES` f32 in the same order.
#[inline(always)]
pub(crate) fn as_tiles<const R: usize, const TILES: usize>(
    acc: &mut WgmmaAccumulator<R>,
) -> &mut Accumulators<1, TILES> {
    const { assert!(R == 4 * TILES) }
    let regs: &mut [f32; R] = acc.get_mut();
    // SAFETY: [f32; R] and [[[f32; 4]; TILES]; 1] have the same size and
    // alignment, and every bit pattern is valid for both.
    unsafe { &mut *(regs as *mut [f32; R]).cast::<Accumulators<1, TILES>>() }
}

/// Computes consumer `group`'s 64 rows of each tile the producer hands
/// over (`thread` is the thread's index in its warpgroup) and writes their
/// O and LSE.
///
/// # Safety
/// As [`super::hopper_forward`]; every consumer warpgroup calls it.
#[inline(always)]
pub unsafe fn compute_tiles<
    E: Element,
    const BM: usize,
    const D: usize,
    const DT: usize,
    const BN: usize,
    const STAGES: usize,
    const CAUSAL: bool,
    const GENERAL: bool,
    const S_REGS: usize,
    const O_REGS: usize,
    const S_TILES: usize,
    const O_TILES: usize,
    const P_STEPS: usize,
>(
    params: &HopperParams,
    smem: &Smem<BM, D, DT, BN, STAGES>,
    group: u32,
    thread: u32,
) {
    let (p, order) = (&params.forward, TileOrder::of(params));
    let turns = GemmTurns::<BM>::new(group);
    let mut loads = Loads::default();
    loop {
        let index = scheduler::take(smem, loads.q_buffer(Smem::<BM, D, DT, BN, STAGES>::Q_BUFFERS));
        if index >= order.tiles() {
            break;
        }
        let tile = order.tile::<BM, BN, CAUSAL, GENERAL>(p, index);
        compute_tile::<E, BM, D, DT, BN, STAGES, CAUSAL, GENERAL, S_REGS, O_REGS, S_TILES, O_TILES, P_STEPS>(
            p, smem, &tile, &turns, &loads, group, thread,
        );
        loads.advance(&tile);
    }
    turns.finish();
}

/// Computes consumer `group`'s 64 rows of `tile`, `loads` into the
/// block's loads, and writes their O and LSE; the full barrier of the
/// tile's Q buffer has completed the tile's phase.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn compute_tile<
    E: Element,
    const BM: usize,
    const D: usize,
    const DT: usize,
    const BN: usize,
    const STAGES: usize,
    const CAUSAL: bool,
    const GENERAL: bool,
    const S_REGS: usize,
    const O_REGS: usize,
    const S_TILES: usize,
    const O_TILES: usize,
    const P_STEPS: usize,
>(
    p: &ForwardParams,
    smem: &Smem<BM, D, DT, BN, STAGES>,
    tile: &HopperTile,
    turns: &GemmTurns<BM>,
    loads: &Loads,
    group: u32,
    thread: u32,
) {
    let (warp, lane) = (thread / 32, thread % 32);
    let (q_buffer, _) = loads.q_buffer(Smem::<BM, D, DT, BN, STAGES>::Q_BUFFERS);
    let group_first_row = tile.first_row + CONSUMER_ROWS * group;
    let logits = Logits::new::<GENERAL>(p, tile, group_first_row, warp, CAUSAL);
    let scale_log2 = logits.softmax_scale_log2();

    let mut o = WgmmaAccumulator::<O_REGS>::new([0.0; O_REGS]);
    let mut softmax = OnlineSoftmax::<1>::new();
    let blocks = tile.key_blocks();
    if blocks == 0 {
        // No Q to read: the tile slot only, which this thread has read.
        arch::mbarrier_arrive(smem.q_empty(q_buffer));
    } else {
        let q = QOperand::<D>::of(smem, q_buffer, group, warp, lane);
        if q_in_registers(D) {
            // Q is in registers and the tile slot read: the producer may
            // load the next Q that takes this buffer.
            arch::mbarrier_arrive(smem.q_empty(q_buffer));
        }
        // Block 0: its scores alone, then its probabilities.
        let (first, first_parity) = loads.stage::<STAGES>(0);
        arch::mbarrier_wait_parity(smem.k_full(first), first_parity);
        turns.begin();
        let mut s = issue_scores::<E, BM, D, DT, BN, STAGES, S_REGS>(smem, &q, first);
        turns.end();
        arch::wgmma_wait_group::<0>();
        arch::wgmma_fence_operand(&mut s);
        release(lane, smem.k_empty(first));
        let s_tiles = as_tiles::<S_REGS, S_TILES>(&mut s);
        logits.apply::<GENERAL, S_TILES>(s_tiles, tile.key_block_begin * BN as u32, BN as i32, lane);
        // O is zero: nothing to rescale.
        let _ = softmax.rebase_deferred(s_tiles, scale_log2);
        softmax.exponentiate(s_tiles, scale_log2);
        let mut p_frags = probabilities_as_a::<E, 1, S_TILES, P_STEPS>(s_tiles);
        // Block i's scores run beside block i - 1's `O += P V`: the
        // softmax of block i overlaps the tensor cores' work on i - 1.
        for i in 1..blocks {
            let (stage, parity) = loads.stage::<STAGES>(i);
            let (previous, previous_parity) = loads.stage::<STAGES>(i - 1);
            arch::mbarrier_wait_parity(smem.k_full(stage), parity);
            turns.begin();
            let mut s = issue_scores::<E, BM, D, DT, BN, STAGES, S_REGS>(smem, &q, stage);
            arch::mbarrier_wait_parity(smem.v_full(previous), previous_parity);
            issue_output::<E, BM, D, DT, BN, STAGES, O_REGS, P_STEPS>(smem, &mut o, &p_frags[0], previous);
            turns.end();
            // The scores' group is the older of the two in flight.
            arch::wgmma_wait_group::<1>();
            arch::wgmma_fence_operand(&mut s);
            release(lane, smem.k_empty(stage));
            let s_tiles = as_tiles::<S_REGS, S_TILES>(&mut s);
            logits.apply::<GENERAL, S_TILES>(s_tiles, (tile.key_block_begin + i) * BN as u32, BN as i32, lane);
            let rescale = softmax.rebase_deferred(s_tiles, scale_log2);
            softmax.exponentiate(s_tiles, scale_log2);
            arch::wgmma_wait_group::<0>();
            arch::wgmma_fence_operand(&mut o);
            arch::wgmma_fence_operand(&mut s);
            // P is rounded only now, once the `wgmma`s reading the last P
            // are done: a register they read redefined before their wait
            // makes ptxas serialize every `wgmma` (C7513).
            p_frags = probabilities_as_a::<E, 1, S_TILES, P_STEPS>(as_tiles::<S_REGS, S_TILES>(&mut s));
            release(lane, smem.v_empty(previous));
            if let Some(factors) = rescale {
                for t in as_tiles::<O_REGS, O_TILES>(&mut o)[0].iter_mut() {
                    t[0] *= factors[0][0];
                    t[1] *= factors[0][0];
                    t[2] *= factors[0][1];
                    t[3] *= factors[0][1];
                }
            }
        }
        if !q_in_registers(D) {
            // Every `S = Q K^T` of the consumer's rows has completed: once
            // the other consumers' have too, the producer may load the next
            // Q that takes this buffer. Each thread arrives, after its own
            // read of the tile slot.
            arch::mbarrier_arrive(smem.q_empty(q_buffer));
        }
        let (last, last_parity) = loads.stage::<STAGES>(blocks - 1);
        arch::mbarrier_wait_parity(smem.v_full(last), last_parity);
        turns.begin();
        issue_output::<E, BM, D, DT, BN, STAGES, O_REGS, P_STEPS>(smem, &mut o, &p_frags[0], last);
        turns.end();
        arch::wgmma_wait_group::<0>();
        arch::wgmma_fence_operand(&mut o);
        release(lane, smem.v_empty(last));
    }
    debug_assert!(group_first_row < tile.first_row + BM as u32);
    epilogue::write_rows::<E, BM, D, DT, BN, STAGES, O_REGS, O_TILES>(
        p, smem, tile, &softmax, scale_log2, &mut o, group,
    );
}

/// How a warp's raw scores become logits: the score modifiers (softcap,
/// ALiBi) of the general kernels, then the mask where a key block reaches
/// outside the keys that every row of the warpgroup sees.
struct Logits {
    mask: ScoreMask,
    modifiers: ScoreModifiers,
    /// Keys `[begin, end)` that every row of the warpgroup sees: the last
    /// row's first key (a left window) and the first row's end (seqlen_k,
    /// the diagonal when causal, a right window).
    unmasked: (i32, i32),
}

impl Logits {
    /// The logits of warp `warp` of the consumer whose first row is
    /// `group_first_row`.
    ///
    /// # Safety
    /// The ALiBi slopes, where not null, hold the tile's batch and head.
    #[inline(always)]
    unsafe fn new<const GENERAL: bool>(
        p: &ForwardParams,
        tile: &HopperTile,
        group_first_row: u32,
        warp: u32,
        causal: bool,
    ) -> Self {
        let visibility = tile.visibility;
        let mask = ScoreMask { first_row: (group_first_row + 16 * warp) as i32, visibility, causal };
        let alibi = GENERAL && !p.alibi_slopes.is_null();
        let modifiers = ScoreModifiers {
            scale_log2: p.scale_log2,
            softcap_scale: if GENERAL { p.softcap_scale } else { 0.0 },
            softcap_log2: p.softcap_log2,
            alibi_slope_log2: if alibi {
                let at = tile.batch as i64 * p.alibi_batch_stride + tile.head as i64;
                arch::ld_global_f32(p.alibi_slopes.offset(at as isize)) * core::f32::consts::LOG2_E
            } else {
                0.0
            },
            first_row: mask.first_row,
            diagonal: visibility.diagonal,
        };
        let begin = visibility.keys_of_row((group_first_row + CONSUMER_ROWS - 1) as i32).0;
        let end = visibility.keys_of_row(group_first_row as i32).1;
        Logits { mask, modifiers, unmasked: (begin, end) }
    }

    /// The scale the online softmax applies to the logits.
    #[inline(always)]
    fn softmax_scale_log2(&self) -> f32 {
        self.modifiers.softmax_scale_log2()
    }

    /// Turns the scores of the `block_n` keys from `first_key` into logits.
    #[inline(always)]
    fn apply<const GENERAL: bool, const S_TILES: usize>(
        &self,
        s: &mut Accumulators<1, S_TILES>,
        first_key: u32,
        block_n: i32,
        lane: u32,
    ) {
        if GENERAL && self.modifiers.active() {
            self.modifiers.apply(s, first_key as i32, lane);
        }
        let (begin, end) = self.unmasked;
        if (first_key as i32) < begin || first_key as i32 + block_n > end {
            self.mask.apply(s, first_key as i32, lane);
        }
    }
}

/// The consumers' turns at issuing `wgmma`s, a round of named barriers,
/// one per consumer, each of 256 threads (the consumer that waits on it
/// and the one before it in the round, that arrives): consumer `g` waits
/// on barrier `FIRST_TURN_BARRIER + g` before each turn and arrives on the
/// next consumer's after it. Consumer 0 goes first: the last consumer
/// arrives once on consumer 0's barrier before its own first turn, and
/// consumer 0 takes that arrival's match after its last turn
/// ([`GemmTurns::finish`]), so that no arrival is pending when the block
/// exits. Every consumer takes as many turns as the others (each one per
/// key block of the same tiles, and one more per tile).
struct GemmTurns<const BM: usize> {
    group: u32,
}

/// The first of the named barriers of [`GemmTurns`] (0 is the block's
/// `bar.sync 0`).
const FIRST_TURN_BARRIER: u32 = 1;
/// Threads of each turn barrier: two consumer warpgroups.
const TURN_THREADS: u32 = 2 * WARPGROUP_THREADS;

impl<const BM: usize> GemmTurns<BM> {
    /// The consumers of a tile of `BM` rows.
    const CONSUMERS: u32 = BM as u32 / CONSUMER_ROWS;

    /// Consumer `group`'s turns; the last consumer lets consumer 0 go first.
    #[inline(always)]
    fn new(group: u32) -> Self {
        if group == Self::CONSUMERS - 1 {
            arch::named_barrier_arrive(FIRST_TURN_BARRIER, TURN_THREADS);
        }
        GemmTurns { group }
    }

    /// Waits until the consumer before in the round has issued its turn's
    /// `wgmma`s.
    #[inline(always)]
    fn begin(&self) {
        arch::named_barrier_sync(FIRST_TURN_BARRIER + self.group, TURN_THREADS);
    }

    /// Hands the turn to the next consumer.
    #[inline(always)]
    fn end(&self) {
        let next = if self.group == Self::CONSUMERS - 1 { 0 } else { self.group + 1 };
        arch::named_barrier_arrive(FIRST_TURN_BARRIER + next, TURN_THREADS);
    }

    /// After the block's last turn: consumer 0 matches the last
    /// consumer's last arrival (the one ahead of the first turn).
    #[inline(always)]
    fn finish(&self) {
        if self.group == 0 {
            self.begin();
        }
    }
}

/// One arrival per warp on a stage's empty barrier (its count is the
/// consumer warps): the warp's `wgmma`s reading the stage are done.
///
/// # Safety
/// `barrier` is an initialised mbarrier.
#[inline(always)]
unsafe fn release(lane: u32, barrier: u32) {
    if lane == 0 {
        arch::mbarrier_arrive(barrier);
    }
}

/// Whether the consumers of head dim `d` hold their rows of Q in
/// registers for the whole tile (`S = Q K^T` by `wgmma` with A from
/// registers), releasing the Q buffer as soon as they have loaded it,
/// rather than reading Q from shared memory at every key block. Only d =
/// 96: it measured +1.8% there (causal +2..+4.6%, H200, f16) and -0.3% at
/// d = 128, and the fragments (`D / 4` registers a thread) spill at d =
/// 64 (three consumers of 160 registers) and at d >= 160
/// (docs/hopper.md, "What is left" 5).
pub const fn q_in_registers(d: usize) -> bool {
    d == 96
}

/// The A operand of a consumer's `S = Q K^T`: its warps' A fragments of
/// Q, one per k-step of 16 columns, where [`q_in_registers`], else the
/// Q buffer whose descriptors `S = Q K^T` takes.
struct QOperand<const D: usize> {
    fragments: [[u32; 4]; 16],
    buffer: u32,
    group: u32,
}

impl<const D: usize> QOperand<D> {
    /// Consumer `group`'s rows of Q buffer `q_buffer`; where
    /// [`q_in_registers`], warp `warp`'s fragments, by `ldmatrix.x4` of
    /// the swizzled slabs: matrices (rows 0-7, 8-15) x (columns 0-7,
    /// 8-15) of the warp's 16 rows, as `mma.sync`'s A.
    ///
    /// # Safety
    /// The buffer's Q has landed.
    #[inline(always)]
    unsafe fn of<const BM: usize, const DT: usize, const BN: usize, const STAGES: usize>(
        smem: &Smem<BM, D, DT, BN, STAGES>,
        q_buffer: u32,
        group: u32,
        warp: u32,
        lane: u32,
    ) -> Self {
        let mut fragments = [[0u32; 4]; 16];
        if q_in_registers(D) {
            let row = CONSUMER_ROWS * group + 16 * warp + lane % 8 + 8 * (lane / 8 % 2);
            let tile = smem.q(q_buffer, 0);
            for step in 0..(D / 16) as u32 {
                let column = 16 * step + 8 * (lane / 16);
                let tile_offset = Smem::<BM, D, DT, BN, STAGES>::Q_TILE.offset(row, column);
                fragments[step as usize] = arch::ldmatrix_x4(tile + tile_offset);
            }
        }
        QOperand { fragments, buffer: q_buffer, group }
    }
}

/// Issues `S = Q K^T` of a consumer's rows of Q (`q`) against K of
/// `stage`, as one committed `wgmma` group, over the head dim's `D / 16`
/// k-steps (the tiles' columns past it are zeros); the scores are there
/// after the wait that covers it.
#[inline(always)]
fn issue_scores<
    E: Element,
    const BM: usize,
    const D: usize,
    const DT: usize,
    const BN: usize,
    const STAGES: usize,
    const S_REGS: usize,
>(
    smem: &Smem<BM, D, DT, BN, STAGES>,
    q: &QOperand<D>,
    stage: u32,
) -> WgmmaAccumulator<S_REGS> {
    let mut s = WgmmaAccumulator::<S_REGS>::new([0.0; S_REGS]);
    arch::wgmma_fence_operand(&mut s);
    arch::wgmma_fence();
    for step in 0..(D / 16) as u32 {
        let k = smem.k_operand(stage, step);
        if q_in_registers(D) {
            E::wgmma_rs::<S_REGS, 0>(&mut s, &q.fragments[step as usize], k, step > 0);
        } else {
            E::wgmma_ss::<S_REGS, 0, 0>(&mut s, smem.q_operand(q.buffer, q.group, step), k, step > 0);
        }
    }
    arch::wgmma_commit_group();
    arch::wgmma_fence_operand(&mut s);
    s
}

/// Issues `O += P V` with V of `stage`, as one committed `wgmma` group
/// (the head dim is its N).
#[inline(always)]
fn issue_output<
    E: Element,
    const BM: usize,
    const D: usize,
    const DT: usize,
    const BN: usize,
    const STAGES: usize,
    const O_REGS: usize,
    const P_STEPS: usize,
>(
    smem: &Smem<BM, D, DT, BN, STAGES>,
    o: &mut WgmmaAccumulator<O_REGS>,
    p: &[[u32; 4]; P_STEPS],
    stage: u32,
) {
    arch::wgmma_fence_operand(o);
    arch::wgmma_fence();
    for step in 0..P_STEPS {
        E::wgmma_rs::<O_REGS, 1>(o, &p[step], smem.v_operand(stage, step as u32), true);
    }
    arch::wgmma_commit_group();
    arch::wgmma_fence_operand(o);
}

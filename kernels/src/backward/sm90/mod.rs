//! The sm_90a main backward kernels: FlashAttention-2's backward algorithm
//! on `wgmma` and TMA, warp-specialized as the forward ([`crate::forward::sm90`]).
//!
//! A block is one key block ([`HopperBackwardConfig::block_n`] keys) of one
//! key/value head and batch. It walks every query step
//! ([`HopperBackwardConfig::block_m`] rows: 128 up to d = 64, else 64) of every
//! query head of its group whose rows see its keys, and keeps dK and dV of
//! its keys in registers through all of them:
//!
//! - warpgroup 0, the producer, gives its registers to the consumers. One
//!   thread issues every TMA load ([`load_block`]): K and V once, then
//!   each step's Q and dO into rings of two stages (dO's of one at tile
//!   dim 256), each stage guarded by a full and an empty mbarrier. Its
//!   warps 1 to 3 add each step's dQ, which the consumers leave in shared
//!   memory, to the f32 accumulator in global memory ([`add_d_q`]), so
//!   that the consumers never wait on atomics;
//! - warpgroups 1 and 2, the consumers, own 64 keys each up to d = 128
//!   ([`consumer`]) or half the head dim of the block's 64 keys above
//!   ([`split_consumer`]). Per step: the scores and their gradients for
//!   their keys (transposed, `S^T = K Q^T` and `dP^T = V dO^T`, up to d =
//!   128; `S = Q K^T` and `dP = dO V^T` for half the block's keys above),
//!   P from the forward's LSE and `dS = P (dP - delta)` in registers, then
//!   `dV += P^T dO`, `dK += dS^T Q` (from registers up to d = 128, else
//!   from shared memory) and their share of `dQ = dS K` (dS from shared
//!   memory), which they store to shared memory (at tile dim 256 one
//!   consumer's half at a time: the buffer of both would not fit; in
//!   steps of 128 rows, each consumer's 64 rows). At the end they write
//!   the block's dK and dV through the shared memory of K and V
//!   ([`epilogue`]).
//!
//! The prepare and finish kernels around it are the portable ones
//! ([`crate::backward::rows`]).

pub mod consumer;
pub mod epilogue;
pub mod smem;
pub mod split_consumer;

use flash_attn_abi::backward::BackwardParams;
use flash_attn_abi::hopper::WARPGROUP_THREADS;
use flash_attn_abi::hopper_backward::{
    hopper_backward_config_of, HopperBackwardConfig, HopperBackwardParams, HOPPER_BACKWARD_STAGES,
};

use crate::arch;
use crate::common::element::Element;
use crate::common::problem::Visibility;
use smem::Smem;

/// The key block of a block, and the query steps that see it.
#[derive(Clone, Copy)]
pub struct KeyBlock {
    pub batch: u32,
    pub kv_head: u32,
    pub first_key: u32,
    pub visibility: Visibility,
    /// Query steps `[first_step, end_step)` of every query head of the
    /// group: those whose rows see some key of the block.
    pub first_step: u32,
    pub end_step: u32,
}

impl KeyBlock {
    /// The block's key block (block x of `(key blocks, key/value heads,
    /// batch)`) of head dim `D`'s kernels, causal or not.
    #[inline(always)]
    pub fn of<const D: usize>(p: &BackwardParams, causal: bool) -> Self {
        let f = &p.forward;
        let block_n = const { hopper_backward_config_of(D as u32).block_n() };
        let block_m = const { hopper_backward_config_of(D as u32).block_m() };
        let (first_key, kv_head, batch) = (arch::block_idx_x() * block_n, arch::block_idx_y(), arch::block_idx_z());
        let visibility = Visibility {
            seqlen_k: f.seqlen_k as i32,
            diagonal: f.seqlen_k as i32 - f.seqlen_q as i32,
            left: -1,
            right: if causal { 0 } else { -1 },
        };
        let last_key = (first_key + block_n).min(f.seqlen_k) - 1;
        let (row_begin, row_end) = visibility.rows_seeing_keys(first_key, last_key, f.seqlen_q);
        let (first_step, end_step) =
            if row_end > row_begin { (row_begin / block_m, row_end.div_ceil(block_m)) } else { (0, 0) };
        KeyBlock { batch, kv_head, first_key, visibility, first_step, end_step }
    }

    /// Query steps of one query head.
    #[inline(always)]
    pub fn steps(&self) -> u32 {
        self.end_step - self.first_step
    }
}

/// The stage of the block's `n`-th step in a ring of `stages`, and the
/// parity of the phase its full barrier completes for it (its empty
/// barrier's phase of the round before is the other parity).
#[inline(always)]
pub fn stage_of(n: u32, stages: u32) -> (u32, u32) {
    (n % stages, (n / stages) & 1)
}

/// Where a consumer thread's `n`-th step of the block (query step `step`)
/// lies: the stages of Q's ring and of dO's, the buffer of the consumers'
/// own stores (steps alternate), the thread's warp and lane in its
/// warpgroup, and the step's first query row. Both consumers' step loops
/// take it at the top of each step: the thread is re-derived each step
/// rather than held through it (registers).
#[derive(Clone, Copy)]
pub struct StepPlace {
    pub stage: u32,
    pub d_o_stage: u32,
    pub buffer: u32,
    pub thread: u32,
    pub warp: u32,
    pub lane: u32,
    pub first_row: u32,
}

impl StepPlace {
    #[inline(always)]
    pub fn of<const D: usize>(n: u32, step: u32) -> Self {
        let (stage, _) = stage_of(n, HOPPER_BACKWARD_STAGES);
        let (d_o_stage, _) = stage_of(n, Smem::<D>::D_O_STAGES);
        let thread = arch::thread_idx_x_here() % WARPGROUP_THREADS;
        let (warp, lane) = (thread / 32, thread % 32);
        StepPlace { stage, d_o_stage, buffer: n % 2, thread, warp, lane, first_row: step * Smem::<D>::BLOCK_M }
    }
}

/// The kernel body of one instance: element `E`, head dim `D`, causal or
/// not; `S_REGS`, `S_TILES` and `S_STEPS` the accumulator registers,
/// n8-tiles and k16-steps of a consumer's S (the config's `score_columns /
/// 2`, `/ 8` and `/ 16`), `DV_REGS` and
/// `DV_TILES` those of dK and dV (of `gradient_columns`), `DQ_REGS` and
/// `DQ_TILES` those of dQ (of `dq_columns`), which Rust cannot derive.
///
/// # Safety
/// Launched with the config's threads (`.maxntid` of them), shared memory
/// and grid, after the prepare kernel on the same `BackwardParams`, with
/// `p`'s tensor maps the ABI's.
#[inline(always)]
pub unsafe fn hopper_backward<
    E: Element,
    const D: usize,
    const CAUSAL: bool,
    const PRODUCER_REGS: u32,
    const CONSUMER_REGS: u32,
    const S_REGS: usize,
    const S_TILES: usize,
    const S_STEPS: usize,
    const DV_REGS: usize,
    const DV_TILES: usize,
    const DQ_REGS: usize,
    const DQ_TILES: usize,
>(
    p: &HopperBackwardParams,
) {
    const {
        let c: HopperBackwardConfig = hopper_backward_config_of(D as u32);
        let (s, dv, dq) = (c.score_columns() as usize, c.gradient_columns() as usize, c.dq_columns() as usize);
        assert!(S_REGS * 2 == s && S_TILES * 8 == s && S_STEPS * 16 == s);
        assert!(DV_REGS * 2 == dv && DV_TILES * 8 == dv);
        assert!(DQ_REGS * 2 == dq && DQ_TILES * 8 == dq);
    }
    let smem = Smem::<D>::at(arch::dynamic_smem_base());
    let tid = arch::thread_idx_x();
    if tid == 0 {
        smem.init_barriers();
    }
    arch::sync_threads();
    let warpgroup = tid / WARPGROUP_THREADS;
    if warpgroup == 0 {
        arch::setmaxnreg_dec::<PRODUCER_REGS>();
        if tid == 0 {
            load_block::<D>(p, &smem, CAUSAL);
        } else if tid >= 32 {
            add_d_q::<D>(&p.backward, &smem, CAUSAL, tid - 32);
        }
    } else {
        arch::setmaxnreg_inc::<CONSUMER_REGS>();
        let consumer = warpgroup - 1;
        if const { hopper_backward_config_of(D as u32).transposes_scores() } {
            consumer::compute_keys::<E, D, CAUSAL, S_REGS, S_TILES, S_STEPS, DV_REGS, DV_TILES, DQ_REGS, DQ_TILES>(
                &p.backward,
                &smem,
                consumer,
            );
        } else {
            split_consumer::compute_key_columns::<E, D, CAUSAL, S_REGS, S_TILES, DV_REGS, DV_TILES, DQ_REGS, DQ_TILES>(
                &p.backward,
                &smem,
                consumer,
            );
        }
    }
}

/// The producer's one thread: K and V of the block, then Q and dO of each
/// step of each query head of the group, in the order the consumers take
/// them.
///
/// # Safety
/// After the barriers were initialised; `p`'s tensor maps are the ABI's.
#[inline(always)]
unsafe fn load_block<const D: usize>(p: &HopperBackwardParams, smem: &Smem<D>, causal: bool) {
    let b = KeyBlock::of::<D>(&p.backward, causal);
    let maps = p.tensor_maps;
    let (q_map, k_map, v_map, d_o_map) = (maps, maps.add(1), maps.add(2), maps.add(3));
    let (batch, kv_head) = (b.batch as i32, b.kv_head as i32);
    let slabs = Smem::<D>::SLABS;
    arch::mbarrier_arrive_expect_tx(smem.kv_full(), 2 * Smem::<D>::KV_BYTES);
    for slab in 0..slabs {
        let at = [(slab * Smem::<D>::SLAB_COLUMNS) as i32, b.first_key as i32, kv_head, batch];
        arch::tma_load_4d(smem.k(slab), k_map, at, smem.kv_full());
        arch::tma_load_4d(smem.v(slab), v_map, at, smem.kv_full());
    }
    let heads_per_kv = p.backward.forward.heads_per_kv;
    let mut n = 0;
    for g in 0..heads_per_kv {
        let head = (b.kv_head * heads_per_kv + g) as i32;
        for step in b.first_step..b.end_step {
            let row = (step * Smem::<D>::BLOCK_M) as i32;
            let (stage, parity) = stage_of(n, HOPPER_BACKWARD_STAGES);
            arch::mbarrier_wait_parity(smem.q_empty(stage), parity ^ 1);
            arch::mbarrier_arrive_expect_tx(smem.q_full(stage), Smem::<D>::STAGE_BYTES);
            for slab in 0..slabs {
                let at = [(slab * Smem::<D>::SLAB_COLUMNS) as i32, row, head, batch];
                arch::tma_load_4d(smem.q(stage, slab), q_map, at, smem.q_full(stage));
            }
            let (stage, parity) = stage_of(n, Smem::<D>::D_O_STAGES);
            arch::mbarrier_wait_parity(smem.d_o_empty(stage), parity ^ 1);
            arch::mbarrier_arrive_expect_tx(smem.d_o_full(stage), Smem::<D>::STAGE_BYTES);
            for slab in 0..slabs {
                let at = [(slab * Smem::<D>::SLAB_COLUMNS) as i32, row, head, batch];
                arch::tma_load_4d(smem.d_o(stage, slab), d_o_map, at, smem.d_o_full(stage));
            }
            n += 1;
        }
    }
}

/// Thread `thread` of the producer warpgroup's warps 1 to 3: adds each
/// step's dQ, once every consumer thread of the turn has stored its part
/// (the two consumers' partial sums where each took every column; where
/// they take turns, each consumer's half of the columns in turn), to the
/// f32 accumulator where consumer 0 said the step's rows are, one 16-byte
/// run of a row at a time (`red.global.add.v4.f32`; a warp's 32 runs are
/// 512 contiguous bytes), rows below seqlen_q and columns below the head
/// dim only, then frees the buffer for the next turn.
///
/// # Safety
/// After the barriers were initialised; the accumulator holds every row of
/// the call.
#[inline(always)]
unsafe fn add_d_q<const D: usize>(p: &BackwardParams, smem: &Smem<D>, causal: bool, thread: u32) {
    let steps = p.forward.heads_per_kv * KeyBlock::of::<D>(p, causal).steps();
    for n in 0..steps {
        arch::mbarrier_wait_parity(smem.d_q_full(0), n & 1);
        let [low, high, rows_here, _] = arch::ld_shared_v4(smem.d_q_rows(n % 2));
        let first_row = ((high as u64) << 32 | low as u64) as i64;
        // The step's rows are consecutive in the accumulator.
        let accum = p.d_q_accum.offset((first_row * D as i64) as isize);
        add_d_q_turn::<D, 0>(smem, accum, rows_here, thread);
        if Smem::<D>::DQ_TURNS > 1 {
            arch::mbarrier_wait_parity(smem.d_q_full(1), n & 1);
            add_d_q_turn::<D, 1>(smem, accum, rows_here, thread);
        }
    }
}

/// [`add_d_q`]'s turn `TURN`, once its part is in the buffer: its columns
/// of the head dim (not the tile's padding) of the step's first
/// `rows_here` rows, to the accumulator `accum` of the step's rows; then
/// frees the buffer for the next turn. The turn a const so that a row's
/// runs are a constant.
///
/// # Safety
/// As [`add_d_q`]; `accum` holds the step's rows below `rows_here`.
#[inline(always)]
unsafe fn add_d_q_turn<const D: usize, const TURN: u32>(smem: &Smem<D>, accum: *mut f32, rows_here: u32, thread: u32) {
    let first_column = TURN * Smem::<D>::DQ_BUFFER_COLUMNS;
    // A turn past the last holds nothing (its instance is never called):
    // one run, not a division by zero.
    let runs_per_row = const {
        let columns = hopper_backward_config_of(D as u32).dq_turn_columns(TURN);
        if columns == 0 {
            1
        } else {
            columns / 4
        }
    };
    let mut run = thread;
    while run < rows_here * runs_per_row {
        let (row, column) = (run / runs_per_row, 4 * (run % runs_per_row));
        // Written out: a loop over the four left LLVM a local array.
        let [a, b, c, d] = arch::ld_shared_v4(smem.d_q(0, row, 4 * column)).map(f32::from_bits);
        let mut sum = [a, b, c, d];
        if Smem::<D>::DQ_PARTIALS == 2 {
            let [e, f, g, h] = arch::ld_shared_v4(smem.d_q(1, row, 4 * column)).map(f32::from_bits);
            sum = [a + e, b + f, c + g, d + h];
        }
        arch::red_global_add_v4_f32(accum.add((row * D as u32 + first_column + column) as usize), sum);
        run += Smem::<D>::DQ_THREADS;
    }
    arch::mbarrier_arrive(smem.d_q_empty((TURN + 1) % Smem::<D>::DQ_TURNS));
}

//! The shared memory of an sm_90a backward block
//! ([`flash_attn_abi::hopper_backward::HopperBackwardSmem`] gives the
//! offsets) and the `wgmma` descriptors of its tiles.
//!
//! K, V, Q and dO are slabs of 64 columns in the 128-byte swizzle (128-byte
//! rows, 8-row groups 1024 bytes apart) or, where the columns a consumer's
//! gradients take are not whole such slabs (d = 32, 96, 160 and 192), of 32
//! columns in the 64-byte swizzle (64-byte rows, 8-row groups 512 bytes
//! apart), as TMA lands them. P and dS, which the consumers store, are
//! slabs of 64 keys in the 128-byte swizzle (dS^T, 64 query rows a slab
//! row, where the consumers transpose the scores: a step of 128 rows
//! takes two slabs of a consumer's keys). One layout serves both
//! ways a product reads a tile: K-major where the tile's columns are the
//! reduction (Q, K, dO and V in the scores, dS in dQ), MN-major where its
//! rows are (P and dS transposed as A of the key gradients, dS^T as A of
//! dQ, dO and Q as the key gradients' B, K as B of dQ); an MN-major N of
//! several slabs steps from slab to slab by the leading byte offset.

use flash_attn_abi::hopper::SLAB_ROW_BYTES;
use flash_attn_abi::hopper::{CONSUMER_ROWS, SMEM_ALIGN, WARPGROUP_THREADS};
use flash_attn_abi::hopper_backward::{
    hopper_backward_config_of, HopperBackwardConfig, HopperBackwardSmem, HOPPER_BACKWARD_CONSUMERS,
    HOPPER_BACKWARD_STAGES,
};

use crate::arch;
use crate::forward::sm90::smem::{k_major, swizzled_operand, SwizzledTile};

/// Bytes of one P or dS slab (64 rows of 64 keys, or of dS^T 64 rows of 64
/// query rows), and of 16 of its rows: one `wgmma` k-step along the rows.
const P_SLAB_BYTES: u32 = CONSUMER_ROWS * SLAB_ROW_BYTES;
const P_K_STEP_BYTES: u32 = 16 * SLAB_ROW_BYTES;

/// The block's shared memory for head dim `D`, at a 1024-byte aligned base.
#[derive(Clone, Copy)]
pub struct Smem<const D: usize> {
    base: u32,
    layout: HopperBackwardSmem,
}

impl<const D: usize> Smem<D> {
    const CONFIG: HopperBackwardConfig = hopper_backward_config_of(D as u32);
    /// Query rows of a step, and slabs of them in a consumer's dS^T.
    pub const BLOCK_M: u32 = Self::CONFIG.block_m();
    pub const D_S_ROW_SLABS: u32 = Self::BLOCK_M / CONSUMER_ROWS;
    /// Copies of a step's LSE and delta: one per consumer, or one of both.
    pub const ROW_STAT_COPIES: u32 = Self::CONFIG.row_stat_copies();
    /// Columns of a slab of K, V, Q or dO, bytes of its rows, and slabs of
    /// a row (over the tile dim: those past the head dim TMA fills with zeros).
    pub const SLAB_COLUMNS: u32 = Self::CONFIG.slab_columns();
    const ROW_BYTES: u32 = Self::CONFIG.slab_row_bytes();
    pub const SLABS: u32 = Self::CONFIG.tile_dim() / Self::SLAB_COLUMNS;
    /// `wgmma` k-steps (16 columns, 32 bytes) of a slab row.
    const K_STEPS_PER_SLAB: u32 = Self::ROW_BYTES / 32;
    /// Bytes of one slab of K or V (the block's keys), and of Q or dO (a step's rows).
    pub const KV_SLAB_BYTES: u32 = Self::CONFIG.block_n() * Self::ROW_BYTES;
    /// K or V as TMA lands them (the block's keys over the tile dim); the
    /// epilogue stages dK and dV there.
    pub const KV_TILE: SwizzledTile = SwizzledTile {
        rows: Self::CONFIG.block_n(),
        columns: Self::CONFIG.tile_dim(),
        slab_columns: Self::SLAB_COLUMNS,
    };
    pub const STEP_SLAB_BYTES: u32 = Self::BLOCK_M * Self::ROW_BYTES;
    /// Bytes TMA lands for K (or V), and for a stage of Q (or of dO).
    pub const KV_BYTES: u32 = Self::SLABS * Self::KV_SLAB_BYTES;
    pub const STAGE_BYTES: u32 = Self::SLABS * Self::STEP_SLAB_BYTES;
    /// Consumer warps: the count of each Q or dO empty barrier.
    pub const CONSUMER_WARPS: u32 = 2 * WARPGROUP_THREADS / 32;
    /// Consumer threads that store a turn's dQ: the count of its full barrier.
    pub const DQ_TURN_THREADS: u32 = 2 * WARPGROUP_THREADS / Self::DQ_TURNS;
    /// The producer warpgroup's warps after its first, which add dQ to the
    /// accumulator: their threads are the count of the dQ empty barrier.
    pub const DQ_THREADS: u32 = WARPGROUP_THREADS - 32;
    /// Bytes between rows of a dQ buffer, its columns, the buffers, and
    /// the consumers' turns through them.
    pub const DQ_PITCH: u32 = Self::CONFIG.dq_pitch();
    pub const DQ_BUFFER_COLUMNS: u32 = Self::CONFIG.dq_buffer_columns();
    pub const DQ_PARTIALS: u32 = Self::CONFIG.dq_partials();
    pub const DQ_TURNS: u32 = Self::CONFIG.dq_turns();
    /// Stages of dO's ring (Q's are [`HOPPER_BACKWARD_STAGES`]).
    pub const D_O_STAGES: u32 = Self::CONFIG.d_o_stages();

    /// The layout at the dynamic shared memory `dynamic_base`, rounded up
    /// to the swizzle's repeat (the config reserves the slack).
    #[inline(always)]
    pub fn at(dynamic_base: u32) -> Self {
        let layout = const { Self::CONFIG.layout() };
        Self { base: dynamic_base.next_multiple_of(SMEM_ALIGN), layout }
    }

    /// The base, re-derived at each use (`xor.b32` with 0 that LLVM neither
    /// hoists nor merges): otherwise LLVM computes the step's 32 `wgmma`
    /// descriptors ahead of the loop and holds them in registers, which
    /// beside dK and dV spilled.
    #[inline(always)]
    fn base(&self) -> u32 {
        arch::xor_in_place(self.base, 0)
    }

    /// Slab `slab` of K, and of V.
    #[inline(always)]
    pub fn k(&self, slab: u32) -> u32 {
        self.base() + self.layout.k + slab * Self::KV_SLAB_BYTES
    }

    #[inline(always)]
    pub fn v(&self, slab: u32) -> u32 {
        self.base() + self.layout.v + slab * Self::KV_SLAB_BYTES
    }

    /// Slab `slab` of Q's stage `stage`, and of dO's.
    #[inline(always)]
    pub fn q(&self, stage: u32, slab: u32) -> u32 {
        self.base() + self.layout.q + stage * self.layout.stage_bytes + slab * Self::STEP_SLAB_BYTES
    }

    #[inline(always)]
    pub fn d_o(&self, stage: u32, slab: u32) -> u32 {
        self.base() + self.layout.d_o + stage * self.layout.stage_bytes + slab * Self::STEP_SLAB_BYTES
    }

    /// P slab `slab` of a step, 64 keys as columns: a consumer's, or
    /// where the consumers split the head dim, a buffer (steps alternate).
    #[inline(always)]
    pub fn p(&self, slab: u32) -> u32 {
        self.base() + self.layout.p + slab * P_SLAB_BYTES
    }

    /// The LSE (log2) of a step's rows, f32, in consumer `consumer`'s copy
    /// (its own, or where there is one, both consumers') of buffer
    /// `buffer` (steps alternate); their delta [`Self::DELTA_BYTES`]
    /// further.
    #[inline(always)]
    pub fn row_stats(&self, consumer: u32, buffer: u32) -> u32 {
        let copy = if Self::ROW_STAT_COPIES == 1 { 0 } else { consumer };
        self.base() + self.layout.row_stats + 2 * Self::DELTA_BYTES * (2 * copy + buffer)
    }

    /// Bytes from a step's LSE to its delta in [`Self::row_stats`].
    pub const DELTA_BYTES: u32 = 4 * Self::BLOCK_M;

    /// dS of buffer `buffer` (steps alternate), slab `slab` (8 KiB): keys
    /// `64 * slab..` of the block, or where the consumers transpose the
    /// scores, dS^T of consumer `slab / D_S_ROW_SLABS`'s keys and query
    /// rows `64 * (slab % D_S_ROW_SLABS)..` of the step.
    #[inline(always)]
    pub fn d_s(&self, buffer: u32, slab: u32) -> u32 {
        self.base() + self.layout.d_s + buffer * self.layout.d_s_bytes + slab * P_SLAB_BYTES
    }

    /// Byte `byte` of row `row` of dQ buffer `partial`, f32, rows
    /// [`Self::DQ_PITCH`] bytes apart.
    #[inline(always)]
    pub fn d_q(&self, partial: u32, row: u32, byte: u32) -> u32 {
        self.base() + self.layout.d_q + partial * self.layout.d_q_bytes + row * Self::DQ_PITCH + byte
    }

    /// Slot `slot` (of 2) of where a step's dQ goes: the index of its first
    /// row in the accumulator (i64, low word first) and its rows below
    /// seqlen_q.
    #[inline(always)]
    pub fn d_q_rows(&self, slot: u32) -> u32 {
        self.base() + self.layout.d_q_rows + 16 * slot
    }

    /// Completes when K and V have landed.
    #[inline(always)]
    pub fn kv_full(&self) -> u32 {
        self.base() + self.layout.barriers
    }

    /// Completes when Q of `stage` has landed.
    #[inline(always)]
    pub fn q_full(&self, stage: u32) -> u32 {
        self.barrier(1 + stage)
    }

    /// Completes when every consumer warp is done reading Q of `stage`.
    #[inline(always)]
    pub fn q_empty(&self, stage: u32) -> u32 {
        self.barrier(1 + HOPPER_BACKWARD_STAGES + stage)
    }

    /// Completes when dO of `stage` (of [`Self::D_O_STAGES`]) has landed.
    #[inline(always)]
    pub fn d_o_full(&self, stage: u32) -> u32 {
        self.barrier(1 + 2 * HOPPER_BACKWARD_STAGES + stage)
    }

    /// Completes when every consumer warp is done reading dO of `stage`.
    #[inline(always)]
    pub fn d_o_empty(&self, stage: u32) -> u32 {
        self.barrier(1 + 3 * HOPPER_BACKWARD_STAGES + stage)
    }

    /// Completes when every consumer thread of turn `turn` (of
    /// [`Self::DQ_TURNS`]) has stored its part of the step's dQ.
    #[inline(always)]
    pub fn d_q_full(&self, turn: u32) -> u32 {
        self.barrier(1 + 4 * HOPPER_BACKWARD_STAGES + turn)
    }

    /// Completes when every thread that adds dQ to the accumulator is done
    /// reading the buffer for turn `turn`: the step's dQ of turn `turn - 1`
    /// (turn 0: the last step's of the last turn).
    #[inline(always)]
    pub fn d_q_empty(&self, turn: u32) -> u32 {
        self.barrier(1 + 4 * HOPPER_BACKWARD_STAGES + HOPPER_BACKWARD_CONSUMERS + turn)
    }

    #[inline(always)]
    fn barrier(&self, index: u32) -> u32 {
        self.base() + self.layout.barriers + 8 * index
    }

    /// Initialises the mbarriers (one thread, before the block's barrier):
    /// the full ones of the loads complete on the producer's one arrival
    /// and the bytes of its loads, their empty ones on one arrival per
    /// consumer warp; dQ's on one arrival per thread that stores or reads it.
    ///
    /// # Safety
    /// The shared memory is the layout's.
    #[inline(always)]
    pub unsafe fn init_barriers(&self) {
        arch::mbarrier_init(self.kv_full(), 1);
        for stage in 0..HOPPER_BACKWARD_STAGES {
            arch::mbarrier_init(self.q_full(stage), 1);
            arch::mbarrier_init(self.q_empty(stage), Self::CONSUMER_WARPS);
        }
        for stage in 0..Self::D_O_STAGES {
            arch::mbarrier_init(self.d_o_full(stage), 1);
            arch::mbarrier_init(self.d_o_empty(stage), Self::CONSUMER_WARPS);
        }
        for turn in 0..Self::DQ_TURNS {
            arch::mbarrier_init(self.d_q_full(turn), Self::DQ_TURN_THREADS);
            arch::mbarrier_init(self.d_q_empty(turn), Self::DQ_THREADS);
        }
        arch::fence_mbarrier_init();
    }

    /// `S = Q K^T` at k-step `step` (head dim columns `16 * step..`): Q of
    /// `stage` as A, the keys from the block's `key` on as B, both K-major.
    #[inline(always)]
    pub fn scores_operands(&self, stage: u32, key: u32, step: u32) -> (u64, u64) {
        let (slab, column) = (step / Self::K_STEPS_PER_SLAB, 32 * (step % Self::K_STEPS_PER_SLAB));
        let keys = key * Self::ROW_BYTES;
        (Self::k_major(self.q(stage, slab) + column), Self::k_major(self.k(slab) + keys + column))
    }

    /// `dP = dO V^T` at k-step `step`: as [`Self::scores_operands`] with dO and V.
    #[inline(always)]
    pub fn d_p_operands(&self, stage: u32, key: u32, step: u32) -> (u64, u64) {
        let (slab, column) = (step / Self::K_STEPS_PER_SLAB, 32 * (step % Self::K_STEPS_PER_SLAB));
        let keys = key * Self::ROW_BYTES;
        (Self::k_major(self.d_o(stage, slab) + column), Self::k_major(self.v(slab) + keys + column))
    }

    /// dO of `stage` as the MN-major B of `dV += P^T dO` at k-step `step`
    /// (the step's rows `16 * step..`), from column `column` (a slab's
    /// first) on (the head dim the N).
    #[inline(always)]
    pub fn d_o_rows(&self, stage: u32, column: u32, step: u32) -> u64 {
        let d_o = self.d_o(stage, column / Self::SLAB_COLUMNS) + 16 * Self::ROW_BYTES * step;
        Self::mn_major(d_o, Self::STEP_SLAB_BYTES)
    }

    /// Q of `stage` as the MN-major B of `dK += dS^T Q`: as [`Self::d_o_rows`].
    #[inline(always)]
    pub fn q_rows(&self, stage: u32, column: u32, step: u32) -> u64 {
        let q = self.q(stage, column / Self::SLAB_COLUMNS) + 16 * Self::ROW_BYTES * step;
        Self::mn_major(q, Self::STEP_SLAB_BYTES)
    }

    /// `dV += P^T dO` at k-step `step` where P is in shared memory: P slab
    /// `p_slab` transposed as A (its 64 keys the M, contiguous), and
    /// [`Self::d_o_rows`].
    #[inline(always)]
    pub fn d_v_operands(&self, stage: u32, p_slab: u32, column: u32, step: u32) -> (u64, u64) {
        (p_operand(self.p(p_slab) + P_K_STEP_BYTES * step), self.d_o_rows(stage, column, step))
    }

    /// `dK += dS^T Q` at k-step `step`: as [`Self::d_v_operands`] with dS
    /// slab `d_s_slab` of `buffer` and Q.
    #[inline(always)]
    pub fn d_k_operands(&self, buffer: u32, stage: u32, d_s_slab: u32, column: u32, step: u32) -> (u64, u64) {
        (p_operand(self.d_s(buffer, d_s_slab) + P_K_STEP_BYTES * step), self.q_rows(stage, column, step))
    }

    /// `dQ = dS K` at the k-step of keys `key..key + 16` of the block,
    /// where the consumers store dS^T: its slab rows of those keys as the
    /// MN-major A (the step's 64 query rows from `first_row` (0 or 64) the
    /// M, contiguous), K's rows as the MN-major B from column `column` (a
    /// slab's first) on.
    #[inline(always)]
    pub fn d_q_operands_transposed(&self, buffer: u32, key: u32, first_row: u32, column: u32) -> (u64, u64) {
        let slab = key / CONSUMER_ROWS * Self::D_S_ROW_SLABS + first_row / CONSUMER_ROWS;
        let d_s_t = self.d_s(buffer, slab) + P_K_STEP_BYTES * (key % CONSUMER_ROWS / 16);
        let k = self.k(column / Self::SLAB_COLUMNS) + key * Self::ROW_BYTES;
        (p_operand(d_s_t), Self::mn_major(k, Self::KV_SLAB_BYTES))
    }

    /// `dQ = dS K` at the k-step of keys `key..key + 16` of the block: dS of
    /// `buffer` as the K-major A, K's rows as the MN-major B from column
    /// `column` (a slab's first) on.
    #[inline(always)]
    pub fn d_q_operands(&self, buffer: u32, key: u32, column: u32) -> (u64, u64) {
        let d_s = self.d_s(buffer, key / CONSUMER_ROWS) + 2 * (key % CONSUMER_ROWS);
        let k = self.k(column / Self::SLAB_COLUMNS) + key * Self::ROW_BYTES;
        (k_major(d_s), Self::mn_major(k, Self::KV_SLAB_BYTES))
    }

    /// A K-major operand of K, V, Q or dO at `start`.
    #[inline(always)]
    fn k_major(start: u32) -> u64 {
        swizzled_operand(start, 16, Self::ROW_BYTES)
    }

    /// An MN-major operand of K, Q or dO at `start`: the slabs of its N
    /// (the head dim) `slab_bytes` apart.
    #[inline(always)]
    fn mn_major(start: u32, slab_bytes: u32) -> u64 {
        swizzled_operand(start, slab_bytes, Self::ROW_BYTES)
    }
}

/// A slab of P or dS (64 keys) as the MN-major A of the key gradients, at
/// `start`: its keys the M, all in the slab.
#[inline(always)]
fn p_operand(start: u32) -> u64 {
    swizzled_operand(start, P_SLAB_BYTES, SLAB_ROW_BYTES)
}

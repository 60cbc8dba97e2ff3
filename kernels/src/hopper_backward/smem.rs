//! The shared memory of an sm_90a backward block
//! ([`flash_attn_abi::hopper_backward::HopperBackwardSmem`] gives the
//! offsets) and the `wgmma` descriptors of its tiles.
//!
//! Every tile is slabs of 64 columns in the 128-byte swizzle (128-byte
//! rows, 8-row groups 1024 bytes apart), as TMA lands K, V, Q and dO and as
//! the consumers store P and dS. One layout serves both ways a product
//! reads a tile: K-major where the tile's columns are the reduction (Q, K,
//! dO and V in the scores, dS in dQ), MN-major where its rows are (P and dS
//! transposed as A of the key gradients, dO and Q as their B, K as B of dQ).

use flash_attn_abi::hopper::SLAB_ROW_BYTES;
use flash_attn_abi::hopper::{CONSUMER_ROWS, SMEM_ALIGN, WARPGROUP_THREADS};
use flash_attn_abi::hopper_backward::{
    hopper_backward_config_of, HopperBackwardSmem, HOPPER_BACKWARD_BLOCK_M, HOPPER_BACKWARD_BLOCK_N,
    HOPPER_BACKWARD_STAGES,
};
use flash_attn_abi::sm90::{DescriptorSwizzle, MatrixDescriptor};

use crate::arch;
use crate::hopper::smem::k_major;

/// Bytes of one 8-row group of a slab: the swizzle's repeat.
const GROUP_BYTES: u32 = 8 * SLAB_ROW_BYTES;
/// Bytes of 16 rows of a slab: one `wgmma` k-step along the rows.
const K_STEP_ROWS_BYTES: u32 = 16 * SLAB_ROW_BYTES;

/// The block's shared memory for head dim `D`, at a 1024-byte aligned base.
#[derive(Clone, Copy)]
pub struct Smem<const D: usize> {
    base: u32,
    layout: HopperBackwardSmem,
}

impl<const D: usize> Smem<D> {
    /// Slabs of 64 columns of a row of K, V, Q or dO.
    pub const SLABS: u32 = D as u32 / 64;
    /// Bytes of one slab of K or V (the block's keys), and of Q or dO (a step's rows).
    pub const KV_SLAB_BYTES: u32 = HOPPER_BACKWARD_BLOCK_N * SLAB_ROW_BYTES;
    pub const STEP_SLAB_BYTES: u32 = HOPPER_BACKWARD_BLOCK_M * SLAB_ROW_BYTES;
    /// Bytes TMA lands for K (or V), and for a stage of Q (or of dO).
    pub const KV_BYTES: u32 = Self::SLABS * Self::KV_SLAB_BYTES;
    pub const STAGE_BYTES: u32 = Self::SLABS * Self::STEP_SLAB_BYTES;
    /// Consumer warps: the count of each Q/dO empty barrier.
    pub const CONSUMER_WARPS: u32 = 2 * WARPGROUP_THREADS / 32;
    /// Consumer threads: the count of the dQ full barrier.
    pub const CONSUMER_THREADS: u32 = 2 * WARPGROUP_THREADS;
    /// The producer warpgroup's warps after its first, which add dQ to the
    /// accumulator: their threads are the count of the dQ empty barrier.
    pub const DQ_THREADS: u32 = WARPGROUP_THREADS - 32;
    /// Bytes between rows of a dQ buffer, and the buffers.
    pub const DQ_PITCH: u32 = hopper_backward_config_of(D as u32).dq_pitch();
    pub const DQ_PARTIALS: u32 = hopper_backward_config_of(D as u32).dq_partials();

    /// The layout at the dynamic shared memory `dynamic_base`, rounded up
    /// to the swizzle's repeat (the config reserves the slack).
    #[inline(always)]
    pub fn at(dynamic_base: u32) -> Self {
        let layout = const { hopper_backward_config_of(D as u32).layout() };
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

    /// Consumer `consumer`'s P of a step: one slab, its 64 keys as columns.
    #[inline(always)]
    pub fn p(&self, consumer: u32) -> u32 {
        self.base() + self.layout.p + consumer * Self::STEP_SLAB_BYTES
    }

    /// dS of buffer `buffer` (steps alternate), the keys of consumer
    /// `consumer` (one slab).
    #[inline(always)]
    pub fn d_s(&self, buffer: u32, consumer: u32) -> u32 {
        self.base() + self.layout.d_s + buffer * self.layout.d_s_bytes + consumer * Self::STEP_SLAB_BYTES
    }

    /// Byte `byte` of row `row` of dQ buffer `partial`, f32, rows
    /// [`Self::DQ_PITCH`] bytes apart.
    #[inline(always)]
    pub fn d_q(&self, partial: u32, row: u32, byte: u32) -> u32 {
        self.base() + self.layout.d_q + partial * self.layout.d_q_bytes + row * Self::DQ_PITCH + byte
    }

    /// Completes when K and V have landed.
    #[inline(always)]
    pub fn kv_full(&self) -> u32 {
        self.base() + self.layout.barriers
    }

    /// Completes when Q and dO of `stage` have landed.
    #[inline(always)]
    pub fn q_full(&self, stage: u32) -> u32 {
        self.base() + self.layout.barriers + 8 * (1 + stage)
    }

    /// Completes when every consumer warp is done reading Q and dO of `stage`.
    #[inline(always)]
    pub fn q_empty(&self, stage: u32) -> u32 {
        self.base() + self.layout.barriers + 8 * (1 + HOPPER_BACKWARD_STAGES + stage)
    }

    /// Completes when every consumer thread has stored its part of the
    /// step's dQ.
    #[inline(always)]
    pub fn d_q_full(&self) -> u32 {
        self.base() + self.layout.barriers + 8 * (1 + 2 * HOPPER_BACKWARD_STAGES)
    }

    /// Completes when every thread that adds dQ to the accumulator is done
    /// reading the step's.
    #[inline(always)]
    pub fn d_q_empty(&self) -> u32 {
        self.base() + self.layout.barriers + 8 * (2 + 2 * HOPPER_BACKWARD_STAGES)
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
        arch::mbarrier_init(self.d_q_full(), Self::CONSUMER_THREADS);
        arch::mbarrier_init(self.d_q_empty(), Self::DQ_THREADS);
        arch::fence_mbarrier_init();
    }

    /// `S = Q K^T` at k-step `step` (head dim columns `16 * step..`): Q of
    /// `stage` as A, consumer `consumer`'s 64 keys of K as B, both K-major.
    #[inline(always)]
    pub fn scores_operands(&self, stage: u32, consumer: u32, step: u32) -> (u64, u64) {
        let column = 32 * (step % 4);
        let keys = consumer * CONSUMER_ROWS * SLAB_ROW_BYTES;
        (k_major(self.q(stage, step / 4) + column), k_major(self.k(step / 4) + keys + column))
    }

    /// `dP = dO V^T` at k-step `step`: as [`Self::scores_operands`] with dO and V.
    #[inline(always)]
    pub fn d_p_operands(&self, stage: u32, consumer: u32, step: u32) -> (u64, u64) {
        let column = 32 * (step % 4);
        let keys = consumer * CONSUMER_ROWS * SLAB_ROW_BYTES;
        (k_major(self.d_o(stage, step / 4) + column), k_major(self.v(step / 4) + keys + column))
    }

    /// `dV += P^T dO` at k-step `step` (the step's rows `16 * step..`):
    /// consumer `consumer`'s P transposed as A (its keys the M, contiguous),
    /// dO of `stage` as the MN-major B (the head dim the N).
    #[inline(always)]
    pub fn d_v_operands(&self, stage: u32, consumer: u32, step: u32) -> (u64, u64) {
        (mn_major(self.p(consumer) + K_STEP_ROWS_BYTES * step), mn_major(self.d_o(stage, 0) + K_STEP_ROWS_BYTES * step))
    }

    /// `dK += dS^T Q` at k-step `step`: as [`Self::d_v_operands`] with dS
    /// of `buffer` and Q.
    #[inline(always)]
    pub fn d_k_operands(&self, buffer: u32, stage: u32, consumer: u32, step: u32) -> (u64, u64) {
        let d_s = self.d_s(buffer, consumer) + K_STEP_ROWS_BYTES * step;
        (mn_major(d_s), mn_major(self.q(stage, 0) + K_STEP_ROWS_BYTES * step))
    }

    /// `dQ = dS K` at the k-step of keys `key..key + 16` of the block: dS of
    /// `buffer` as the K-major A, K's rows as the MN-major B from column
    /// slab `slab` (its 64 columns the N).
    #[inline(always)]
    pub fn d_q_operands(&self, buffer: u32, key: u32, slab: u32) -> (u64, u64) {
        let d_s = self.d_s(buffer, key / CONSUMER_ROWS) + 2 * (key % CONSUMER_ROWS);
        (k_major(d_s), mn_major(self.k(slab) + key * SLAB_ROW_BYTES))
    }
}

/// An MN-major operand in the 128-byte swizzle at `start`: 64-column slabs
/// (the M or N) `slab bytes` apart, 8-row groups (the K) 1024 bytes apart.
/// Every MN-major operand here is either one slab or Q/dO (a step's rows).
#[inline(always)]
fn mn_major(start: u32) -> u64 {
    MatrixDescriptor {
        start,
        leading_byte_offset: HOPPER_BACKWARD_BLOCK_M * SLAB_ROW_BYTES,
        stride_byte_offset: GROUP_BYTES,
        base_offset: 0,
        swizzle: DescriptorSwizzle::B128,
    }
    .encode()
}

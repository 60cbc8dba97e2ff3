//! The sm_90a main backward kernels (issue 31 on Hopper): their table,
//! tile configuration, shared-memory layout and argument block.
//!
//! They replace the second of the backward's three launches
//! ([`crate::backward`]) on compute capability 9.0 for the calls they take
//! (dense, non-deterministic, unmasked or causal, no softcap or ALiBi,
//! every head dim of the table: 32 to 256 in steps of 32); the prepare and
//! finish kernels are the portable ones, on the same [`BackwardParams`]. A block is one key block
//! ([`HopperBackwardConfig::block_n`] keys) of one key/value head and
//! batch: a producer warpgroup that loads K and V once and each query
//! step's Q and dO ([`HopperBackwardConfig::block_m`] rows) by TMA into rings of
//! two stages (dO's of one at tile dim 256) and adds dQ to the f32
//! accumulator, and two consumer warpgroups that compute with `wgmma`: up
//! to d = 128 each owns 64 of the block's 128 keys, above it
//! ([`HopperBackwardConfig::splits_head_dim`]) the block has 64 keys and
//! each consumer owns half the head dim of their gradients.

use crate::backward::BackwardParams;
use crate::hopper::{
    register_pool, v_slab_columns, CONSUMER_ROWS, SLAB_COLUMNS, SLAB_ROW_BYTES, SMEM_ALIGN, WARPGROUP_THREADS,
};
use crate::kernels::{Dtype, Variant};
use crate::sm90::TensorMap;

/// Consumer warpgroups of a block.
pub const HOPPER_BACKWARD_CONSUMERS: u32 = 2;
/// Stages of the Q ring, and of dO's but where
/// [`HopperBackwardConfig::d_o_stages`] says one.
pub const HOPPER_BACKWARD_STAGES: u32 = 2;

/// The mbarriers of a block: K/V full, per stage Q full, Q empty, dO full
/// and dO empty, per dQ turn full and empty.
pub const HOPPER_BACKWARD_BARRIERS: u32 = 1 + 4 * HOPPER_BACKWARD_STAGES + 2 * HOPPER_BACKWARD_CONSUMERS;

/// The tile shape of one sm_90a main backward kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HopperBackwardConfig {
    /// 32 to 256, a multiple of 32. Up to 128 whole slabs
    /// ([`HopperBackwardConfig::slab_columns`]), one TMA box each; above
    /// it, [`HopperBackwardConfig::tile_dim`] rounds it up to them.
    pub head_dim: u32,
}

/// Byte offsets of the shared-memory regions from the 1024-byte aligned
/// base. K, V, Q and dO are slabs of [`HopperBackwardConfig::slab_columns`]
/// columns, swizzled as TMA lands them; P and dS are slabs of 64 keys
/// (128-byte rows, the 128-byte swizzle).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HopperBackwardSmem {
    /// The block's K and V: [`HopperBackwardConfig::block_n`] rows each.
    pub k: u32,
    pub v: u32,
    /// Stage `s` of Q and of dO at `q + s * stage_bytes` and `d_o + s *
    /// stage_bytes`: [`HopperBackwardConfig::block_m`] rows each
    /// ([`HOPPER_BACKWARD_STAGES`] of Q, [`HopperBackwardConfig::d_o_stages`]
    /// of dO).
    pub q: u32,
    pub d_o: u32,
    pub stage_bytes: u32,
    /// Where the consumers split the head dim, P of a step, rounded, two
    /// slabs of 64 rows (queries) of 64 keys, 8192 bytes apart: the block's
    /// keys in two buffers (steps alternate: both consumers read both
    /// halves). Empty below: there the consumers hold P^T in registers.
    pub p: u32,
    /// Below the split ([`HopperBackwardConfig::transposes_scores`]), the
    /// LSE (log2) and delta of a step's rows, f32, in two buffers (steps
    /// alternate), [`HopperBackwardConfig::row_stat_copies`] of them: copy
    /// `c`'s buffer `b` at `row_stats + 16 block_m (2 c + b)`, delta `4
    /// block_m` bytes after the LSE (2 KiB in all). Empty where the
    /// consumers split the head dim.
    pub row_stats: u32,
    /// dS of a step, rounded, in two buffers (steps alternate), buffer `b`
    /// at `d_s + b * d_s_bytes`, in slabs of 64 keys (8 KiB). Where the
    /// consumers split the head dim, one slab: 64 rows (queries) of the
    /// block's keys. Below, dS^T: consumer `c`'s 64 keys as rows, of the
    /// step's query rows `64 r..` in slab `c * block_m / 64 + r`.
    pub d_s: u32,
    pub d_s_bytes: u32,
    /// A step's dQ, f32, [`HopperBackwardConfig::dq_partials`] of them
    /// `d_q_bytes` apart: [`HopperBackwardConfig::block_m`] rows of
    /// [`HopperBackwardConfig::dq_buffer_columns`] columns,
    /// [`HopperBackwardConfig::dq_pitch`] bytes apart. The consumers store
    /// their parts (in turns where [`HopperBackwardConfig::dq_turns`] is
    /// 2); the producer warpgroup's other warps add them to the
    /// accumulator in global memory.
    pub d_q: u32,
    pub d_q_bytes: u32,
    /// Where in the accumulator each step's dQ goes, two slots of 16 bytes
    /// (steps alternate): the index of the step's first row (i64) and its
    /// rows below seqlen_q (u32), which consumer 0 stores at the step's
    /// start for the warps that add dQ, so that those hold no loop state
    /// of their own (24 registers at tile dim 256).
    pub d_q_rows: u32,
    /// The mbarriers, 8 bytes each: K/V full; per stage Q full, Q empty, dO
    /// full and dO empty; per turn dQ full and dQ empty (room for every
    /// stage and turn; those a config does not use are not initialised).
    pub barriers: u32,
    pub end: u32,
}

impl HopperBackwardConfig {
    /// Threads per block: the producer warpgroup and the consumers.
    pub const fn threads(&self) -> u32 {
        WARPGROUP_THREADS * (1 + HOPPER_BACKWARD_CONSUMERS)
    }

    /// Registers per thread after `setmaxnreg`, `(producer, consumer)`:
    /// `(40 + 2 * 232) * 128` or `(24 + 2 * 240) * 128`, within the pool of
    /// 168 a thread the block launches with (64512). A consumer holds dK and
    /// dV (`gradient_columns` registers together), S and dP of a step
    /// (`score_keys / 2` each), then the step's dQ (`dq_columns / 2`); at
    /// 232 the consumers of tile dim 256 spilled (dK, dV and dQ alone are
    /// 192), so there the producer's warps add dQ with 24, one buffer of
    /// one part at a time (d = 32 to 96 sum two partials, which spilled at
    /// 24 or 32).
    pub const fn registers(&self) -> (u32, u32) {
        if self.tile_dim() > 192 {
            (24, 240)
        } else {
            (40, 232)
        }
    }

    /// Whether the consumers compute the transposed scores, `S^T = K Q^T`
    /// and `dP^T = V dO^T` with their 64 keys as the `wgmma` M (up to d =
    /// 128, as FlashAttention-3's backward): P^T and dS^T are then the A
    /// fragments of `dV += P^T dO` and `dK += dS^T Q` from registers, and
    /// only dS^T goes through shared memory (for dQ), where with the query
    /// rows as M both P and dS did and both key gradients read them back
    /// as A. Where the consumers split the head dim, each computes 32 keys'
    /// scores but every key's gradients, so the transposed fragments would
    /// be another consumer's.
    pub const fn transposes_scores(&self) -> bool {
        !self.splits_head_dim()
    }

    /// Whether the consumers split the head dim (d > 128): a consumer's dK
    /// and dV of 64 keys over all of it would not fit its registers. The
    /// block then has 64 keys; each consumer computes S and dP for 32 of
    /// them and dK, dV and dQ for half the columns ([`Self::tile_dim`]).
    pub const fn splits_head_dim(&self) -> bool {
        self.head_dim > 2 * SLAB_COLUMNS
    }

    /// Keys of a block: 64 per consumer, or 64 in all where the consumers
    /// split the head dim.
    pub const fn block_n(&self) -> u32 {
        if self.splits_head_dim() {
            CONSUMER_ROWS
        } else {
            HOPPER_BACKWARD_CONSUMERS * CONSUMER_ROWS
        }
    }

    /// Keys of a consumer's S and dP: 64, or 32 where the consumers split
    /// the head dim (each half of the block's).
    pub const fn score_keys(&self) -> u32 {
        if self.splits_head_dim() {
            self.block_n() / HOPPER_BACKWARD_CONSUMERS
        } else {
            CONSUMER_ROWS
        }
    }

    /// Query rows of one step: 128 up to d = 64 (FlashAttention-3's d = 64
    /// step), else 64 (one `wgmma` M). At 128 each consumer's S^T and dP^T
    /// span all of them (a `wgmma` N of 128, 64 accumulator registers
    /// each), so that each consumer's serial chain of waits and barriers
    /// does twice the work per step, and the consumers split dQ by rows
    /// ([`Self::splits_d_q_rows`]). Above d = 64, dK and dV (d / 2
    /// registers each) leave no room for them.
    pub const fn block_m(&self) -> u32 {
        if self.head_dim <= SLAB_COLUMNS {
            2 * CONSUMER_ROWS
        } else {
            CONSUMER_ROWS
        }
    }

    /// Columns of a consumer's S and dP accumulators, the `wgmma` N: the
    /// step's query rows where the consumers transpose the scores, else
    /// its score keys.
    pub const fn score_columns(&self) -> u32 {
        if self.transposes_scores() {
            self.block_m()
        } else {
            self.score_keys()
        }
    }

    /// Whether each consumer computes dQ of its 64 of the step's rows over
    /// all the block's keys (both consumers' dS^T): where a step has more
    /// rows than a `wgmma` M. One buffer then holds the step's dQ.
    pub const fn splits_d_q_rows(&self) -> bool {
        self.block_m() > CONSUMER_ROWS
    }

    /// Copies of a step's LSE and delta in shared memory, each stored one
    /// value a thread: one per consumer (its own warpgroup's 128 threads,
    /// a step of 64 rows), or one of both consumers (a step of 128).
    pub const fn row_stat_copies(&self) -> u32 {
        HOPPER_BACKWARD_CONSUMERS * WARPGROUP_THREADS / (2 * self.block_m())
    }

    /// Columns the tiles hold: the head dim, or where the consumers split
    /// it, the head dim rounded up to halves of whole 32-column slabs (d =
    /// 160 and 224 run as 192 and 256). TMA fills the columns past the
    /// head dim with zeros, so they add nothing to S and dP; their
    /// gradients are not stored.
    pub const fn tile_dim(&self) -> u32 {
        if self.splits_head_dim() {
            self.head_dim.next_multiple_of(HOPPER_BACKWARD_CONSUMERS * SLAB_COLUMNS / 2)
        } else {
            self.head_dim
        }
    }

    /// Columns of dK and dV each consumer holds: every one, or half of
    /// [`Self::tile_dim`] where the consumers split the head dim.
    pub const fn gradient_columns(&self) -> u32 {
        if self.splits_head_dim() {
            self.tile_dim() / HOPPER_BACKWARD_CONSUMERS
        } else {
            self.head_dim
        }
    }

    /// Columns of a K, V, Q or dO slab: 64 (128-byte rows, the 128-byte
    /// swizzle) where the columns a consumer's gradients read are whole
    /// such slabs, else 32 (64-byte rows, the 64-byte swizzle: d = 32, 96,
    /// 160 and 192). Q, K and dO are also read MN-major with those columns
    /// as the `wgmma` N, which must be whole slabs, so they cannot be
    /// padded to 64 columns as the forward's Q and K are.
    pub const fn slab_columns(&self) -> u32 {
        v_slab_columns(self.gradient_columns())
    }

    /// Bytes of one row of a K, V, Q or dO slab.
    pub const fn slab_row_bytes(&self) -> u32 {
        2 * self.slab_columns()
    }

    /// Columns of dQ each consumer computes per step, and whether it sums
    /// over only its own keys: where the consumers split the head dim, its
    /// half over the block's 64 keys; where half the head dim is whole
    /// 64-column slabs (d = 128) each takes half the columns over all 128
    /// keys (both consumers' dS); else (d = 32, 64 and 96: half the columns
    /// would be a `wgmma` N of 16 to 48, which reads a fraction of a slab
    /// row or is not among the primitives') every column, over all 128
    /// keys for half the rows where [`Self::splits_d_q_rows`] (d = 32 and
    /// 64), else over its own 64 keys, both consumers adding to the
    /// accumulator (d = 96).
    pub const fn dq_columns(&self) -> u32 {
        if self.splits_head_dim() {
            self.gradient_columns()
        } else if (self.head_dim / HOPPER_BACKWARD_CONSUMERS).is_multiple_of(SLAB_COLUMNS) {
            self.head_dim / HOPPER_BACKWARD_CONSUMERS
        } else {
            self.head_dim
        }
    }

    /// dQ buffers in shared memory: one where the consumers compute
    /// different columns (d = 128) or rows (d = 32 and 64), one per
    /// consumer where each computes every column over its own keys (d =
    /// 96), which the warps that add them to the accumulator sum.
    pub const fn dq_partials(&self) -> u32 {
        if self.dq_columns() < self.head_dim || self.splits_d_q_rows() {
            1
        } else {
            HOPPER_BACKWARD_CONSUMERS
        }
    }

    /// Consumers whose dQ parts pass through one buffer in turn: 1 (the
    /// buffer holds a step's whole dQ, or each consumer's partial), or at
    /// tile dim 256, 2: a buffer of the whole 64 x 256 f32 does not fit
    /// beside K, V and Q's two stages, so it holds one consumer's half of
    /// the columns at a time ([`Self::dq_buffer_columns`]) in place of
    /// dO's second stage ([`Self::d_o_stages`]). A step's dQ goes through
    /// shared memory at every head dim: from there the producer
    /// warpgroup's other warps add it to the accumulator 16 bytes a lane
    /// (a warp's 512 contiguous), where the consumers' own adds from
    /// registers are 8 bytes a lane (a row's four lanes 32 contiguous) and
    /// stall them; the first measured 25% faster at d = 128 and 15-20% at d
    /// = 192 (docs/tuning.md).
    pub const fn dq_turns(&self) -> u32 {
        if self.tile_dim() > 192 {
            HOPPER_BACKWARD_CONSUMERS
        } else {
            1
        }
    }

    /// Columns of a dQ buffer: the tile dim, or one consumer's half of it
    /// where they take turns.
    pub const fn dq_buffer_columns(&self) -> u32 {
        self.tile_dim() / self.dq_turns()
    }

    /// Columns of the head dim that turn `turn` holds in the dQ buffer
    /// (not the tile's padding past it), or 0 past the last turn.
    pub const fn dq_turn_columns(&self, turn: u32) -> u32 {
        let first = turn * self.dq_buffer_columns();
        if turn >= self.dq_turns() || first >= self.head_dim {
            0
        } else if self.head_dim - first < self.dq_buffer_columns() {
            self.head_dim - first
        } else {
            self.dq_buffer_columns()
        }
    }

    /// Stages of dO: Q's [`HOPPER_BACKWARD_STAGES`], or one where the
    /// consumers' dQ take turns (its second stage's room holds the dQ
    /// buffer; the consumers free dO's stage once dV is computed, ahead of
    /// dK, so that the next step's dO loads while dQ and dK are computed).
    pub const fn d_o_stages(&self) -> u32 {
        if self.dq_turns() > 1 {
            1
        } else {
            HOPPER_BACKWARD_STAGES
        }
    }

    /// Bytes from one row of a dQ buffer to the next: its columns' f32 and
    /// 32 more (16 where the consumers split the head dim, so that d =
    /// 192's fits), so that a warp's stores of its 8 rows (32 bytes each)
    /// fall in two wavefronts rather than eight.
    pub const fn dq_pitch(&self) -> u32 {
        4 * self.dq_buffer_columns() + if self.splits_head_dim() { 16 } else { 32 }
    }

    pub const fn layout(&self) -> HopperBackwardSmem {
        // Bytes of one row of K, V, Q or dO, in whole slabs.
        let row = (self.tile_dim() / self.slab_columns()) * self.slab_row_bytes();
        let block_n = self.block_n();
        let k = 0;
        let v = k + block_n * row;
        let q = v + block_n * row;
        let block_m = self.block_m();
        let stage_bytes = block_m * row;
        let d_o = q + HOPPER_BACKWARD_STAGES * stage_bytes;
        let p = d_o + self.d_o_stages() * stage_bytes;
        let (p_bytes, row_stats_bytes) = if self.transposes_scores() {
            (0, self.row_stat_copies() * 2 * 2 * block_m * 4)
        } else {
            (HOPPER_BACKWARD_CONSUMERS * block_m * SLAB_ROW_BYTES, 0)
        };
        let row_stats = p + p_bytes;
        let d_s = row_stats + row_stats_bytes;
        let d_s_bytes = block_m * block_n * 2;
        let d_q = d_s + 2 * d_s_bytes;
        let d_q_bytes = block_m * self.dq_pitch();
        let d_q_rows = d_q + self.dq_partials() * d_q_bytes;
        let barriers = d_q_rows + 2 * 16;
        let end = barriers + 8 * HOPPER_BACKWARD_BARRIERS;
        HopperBackwardSmem {
            k,
            v,
            q,
            d_o,
            stage_bytes,
            p,
            row_stats,
            d_s,
            d_s_bytes,
            d_q,
            d_q_bytes,
            d_q_rows,
            barriers,
            end,
        }
    }

    /// Dynamic shared memory: the layout plus what aligning its base may take.
    pub const fn smem_bytes(&self) -> u32 {
        self.layout().end + SMEM_ALIGN
    }

    /// `(key blocks, key/value heads, batch)`.
    pub const fn grid(&self, seqlen_k: u32, heads_kv: u32, batch: u32) -> [u32; 3] {
        [seqlen_k.div_ceil(self.block_n()), heads_kv, batch]
    }
}

/// The config of head dim `head_dim`'s sm_90a backward kernels, if it has any.
pub const fn hopper_backward_config(head_dim: u32) -> Option<HopperBackwardConfig> {
    match head_dim {
        32 | 64 | 96 | 128 | 160 | 192 | 224 | 256 => Some(HopperBackwardConfig { head_dim }),
        _ => None,
    }
}

/// The config of a row of the table; a missing one stops the build.
pub const fn hopper_backward_config_of(head_dim: u32) -> HopperBackwardConfig {
    match hopper_backward_config(head_dim) {
        Some(config) => config,
        None => panic!("an sm_90a backward kernel of the table has no config"),
    }
}

/// The argument block of the sm_90a main backward kernels: the portable
/// block (the forward's tensors and sizes, dO, the gradients, delta and
/// the dQ accumulator) and the tensor maps the producer loads through.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct HopperBackwardParams {
    pub backward: BackwardParams,
    /// Four tensor maps in global memory, 64-byte aligned: q, k, v and dO,
    /// each over `[batch, seqlen, heads, head_dim]` (dimension 0 innermost),
    /// boxes of [`HopperBackwardConfig::slab_columns`] columns (the 128- or
    /// 64-byte swizzle) and [`HopperBackwardConfig::block_m`] (q, dO) or
    /// [`HopperBackwardConfig::block_n`] (k, v) rows.
    pub tensor_maps: *const TensorMap,
}

/// What the host uploads to the call's scratch ahead of the launches: the
/// tensor maps of q, k, v and dO.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct HopperBackwardScratch {
    pub tensor_maps: [TensorMap; 4],
}

/// One sm_90a main backward kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HopperBackwardKernel {
    /// The PTX entry point.
    pub name: &'static str,
    pub head_dim: u32,
    pub dtype: Dtype,
    /// [`Variant::Full`] or [`Variant::Causal`].
    pub variant: Variant,
    pub config: HopperBackwardConfig,
}

/// Calls `$callback!` with every sm_90a main backward kernel, one
/// `(entry_point, head_dim, Dtype, Variant)` row each: the one list of them.
#[macro_export]
macro_rules! hopper_backward_kernels {
    ($callback:ident) => {
        $callback! {
            (flash_bwd_sm90_d32_f16_full, 32, F16, Full),
            (flash_bwd_sm90_d32_f16_causal, 32, F16, Causal),
            (flash_bwd_sm90_d32_bf16_full, 32, Bf16, Full),
            (flash_bwd_sm90_d32_bf16_causal, 32, Bf16, Causal),
            (flash_bwd_sm90_d64_f16_full, 64, F16, Full),
            (flash_bwd_sm90_d64_f16_causal, 64, F16, Causal),
            (flash_bwd_sm90_d64_bf16_full, 64, Bf16, Full),
            (flash_bwd_sm90_d64_bf16_causal, 64, Bf16, Causal),
            (flash_bwd_sm90_d96_f16_full, 96, F16, Full),
            (flash_bwd_sm90_d96_f16_causal, 96, F16, Causal),
            (flash_bwd_sm90_d96_bf16_full, 96, Bf16, Full),
            (flash_bwd_sm90_d96_bf16_causal, 96, Bf16, Causal),
            (flash_bwd_sm90_d128_f16_full, 128, F16, Full),
            (flash_bwd_sm90_d128_f16_causal, 128, F16, Causal),
            (flash_bwd_sm90_d128_bf16_full, 128, Bf16, Full),
            (flash_bwd_sm90_d128_bf16_causal, 128, Bf16, Causal),
            (flash_bwd_sm90_d160_f16_full, 160, F16, Full),
            (flash_bwd_sm90_d160_f16_causal, 160, F16, Causal),
            (flash_bwd_sm90_d160_bf16_full, 160, Bf16, Full),
            (flash_bwd_sm90_d160_bf16_causal, 160, Bf16, Causal),
            (flash_bwd_sm90_d192_f16_full, 192, F16, Full),
            (flash_bwd_sm90_d192_f16_causal, 192, F16, Causal),
            (flash_bwd_sm90_d192_bf16_full, 192, Bf16, Full),
            (flash_bwd_sm90_d192_bf16_causal, 192, Bf16, Causal),
            (flash_bwd_sm90_d224_f16_full, 224, F16, Full),
            (flash_bwd_sm90_d224_f16_causal, 224, F16, Causal),
            (flash_bwd_sm90_d224_bf16_full, 224, Bf16, Full),
            (flash_bwd_sm90_d224_bf16_causal, 224, Bf16, Causal),
            (flash_bwd_sm90_d256_f16_full, 256, F16, Full),
            (flash_bwd_sm90_d256_f16_causal, 256, F16, Causal),
            (flash_bwd_sm90_d256_bf16_full, 256, Bf16, Full),
            (flash_bwd_sm90_d256_bf16_causal, 256, Bf16, Causal),
        }
    };
}

macro_rules! hopper_backward_table {
    ($(($name:ident, $head_dim:literal, $dtype:ident, $variant:ident)),* $(,)?) => {
        /// Every sm_90a main backward kernel.
        pub const HOPPER_BACKWARD_KERNELS: &[HopperBackwardKernel] = &[$(HopperBackwardKernel {
            name: stringify!($name),
            head_dim: $head_dim,
            dtype: Dtype::$dtype,
            variant: Variant::$variant,
            config: hopper_backward_config_of($head_dim),
        }),*];
    };
}

hopper_backward_kernels!(hopper_backward_table);

/// The sm_90a main backward kernel of `head_dim`, `dtype` and `variant`, if
/// there is one.
pub fn hopper_backward_kernel(head_dim: u32, dtype: Dtype, variant: Variant) -> Option<&'static HopperBackwardKernel> {
    HOPPER_BACKWARD_KERNELS.iter().find(|k| k.head_dim == head_dim && k.dtype == dtype && k.variant == variant)
}

// The invariants of every row, checked as the crate builds.
const _: () = {
    let mut i = 0;
    while i < HOPPER_BACKWARD_KERNELS.len() {
        let k = &HOPPER_BACKWARD_KERNELS[i];
        let c = k.config;
        assert!(c.head_dim == k.head_dim && c.tile_dim().is_multiple_of(c.slab_columns()));
        assert!(
            c.gradient_columns().is_multiple_of(c.slab_columns()) && c.dq_columns().is_multiple_of(c.slab_columns())
        );
        assert!(matches!(k.variant, Variant::Full | Variant::Causal));
        assert!(c.smem_bytes() <= crate::hopper::MAX_HOPPER_SMEM);
        let (producer, consumer) = c.registers();
        assert!(WARPGROUP_THREADS * (producer + HOPPER_BACKWARD_CONSUMERS * consumer) <= register_pool(c.threads()));
        // Every tile slab starts on the swizzle's 1024-byte repeat.
        let l = c.layout();
        assert!(l.v.is_multiple_of(SMEM_ALIGN) && l.q.is_multiple_of(SMEM_ALIGN) && l.d_o.is_multiple_of(SMEM_ALIGN));
        assert!(l.stage_bytes.is_multiple_of(SMEM_ALIGN) && l.p.is_multiple_of(SMEM_ALIGN));
        assert!(l.d_q.is_multiple_of(16) && matches!(c.dq_pitch() % 128, 16 | 32));
        // A consumer's S and dP are `wgmma` N = 32 or 64 (within a 64-key P
        // slab), and the consumers' score keys are the block's.
        assert!(matches!(c.score_keys(), 32 | 64) && c.block_n() == c.score_keys() * HOPPER_BACKWARD_CONSUMERS);
        assert!(l.d_s.is_multiple_of(SMEM_ALIGN) && l.d_s_bytes.is_multiple_of(SMEM_ALIGN));
        i += 1;
    }
};

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::format;

    #[test]
    fn names_follow_head_dim_dtype_and_variant() {
        for k in HOPPER_BACKWARD_KERNELS {
            assert_eq!(k.name, format!("flash_bwd_sm90_d{}_{}_{}", k.head_dim, k.dtype.name(), k.variant.suffix()));
            assert_eq!(hopper_backward_kernel(k.head_dim, k.dtype, k.variant), Some(k));
        }
        assert_eq!(HOPPER_BACKWARD_KERNELS.len(), 32);
    }

    #[test]
    fn d128_layout_is_k_v_two_stages_of_q_and_do_then_row_stats_two_ds_and_dq() {
        let l = hopper_backward_config_of(128).layout();
        assert_eq!((l.k, l.v, l.q, l.d_o, l.stage_bytes), (0, 32768, 65536, 98304, 16384));
        // No P: the consumers hold P^T in registers.
        assert_eq!((l.p, l.row_stats, l.d_s, l.d_s_bytes), (131072, 131072, 133120, 16384));
        assert_eq!((l.d_q, l.d_q_bytes), (165888, 64 * 544));
        assert_eq!((l.d_q_rows, l.barriers), (165888 + 34816, 165888 + 34816 + 32));
        assert_eq!(hopper_backward_config_of(128).smem_bytes(), 200704 + 32 + 104 + 1024);
        assert_eq!(
            (hopper_backward_config_of(128).block_m(), hopper_backward_config_of(128).row_stat_copies()),
            (64, 2)
        );
        // d = 64: steps of 128 rows, one copy of their LSE and delta, one
        // dQ buffer of them (each consumer's half of the rows).
        let c = hopper_backward_config_of(64);
        assert_eq!((c.block_m(), c.score_columns(), c.row_stat_copies(), c.dq_partials()), (128, 128, 1, 1));
        let l = c.layout();
        assert_eq!((l.q, l.d_o, l.stage_bytes, l.row_stats), (32768, 65536, 16384, 98304));
        assert_eq!((l.d_s, l.d_s_bytes, l.d_q, l.d_q_bytes), (100352, 32768, 165888, 128 * 288));
        assert_eq!(c.smem_bytes(), 165888 + 128 * 288 + 32 + 104 + 1024);
        // d = 96: 32-column slabs (three of 64-byte rows), a dQ buffer per consumer.
        let c = hopper_backward_config_of(96);
        assert_eq!((c.slab_columns(), c.dq_columns(), c.dq_partials()), (32, 96, 2));
        let l = c.layout();
        assert_eq!((l.v, l.q, l.d_o, l.stage_bytes, l.p), (24576, 49152, 73728, 12288, 98304));
        assert_eq!((l.d_q, l.d_q_bytes), (98304 + 2048 + 32768, 64 * 416));
    }

    #[test]
    fn above_d128_the_consumers_split_the_head_dim_of_64_keys() {
        // (head dim, tile dim, slab columns, a consumer's gradient columns)
        for (d, tile, slab, half) in [(160, 192, 32, 96), (192, 192, 32, 96), (224, 256, 64, 128), (256, 256, 64, 128)]
        {
            let c = hopper_backward_config_of(d);
            assert!(c.splits_head_dim());
            assert_eq!(
                (c.tile_dim(), c.slab_columns(), c.gradient_columns(), c.dq_columns()),
                (tile, slab, half, half)
            );
            assert_eq!((c.block_n(), c.score_keys(), c.grid(65, 3, 2)), (64, 32, [2, 3, 2]));
        }
        assert!(!hopper_backward_config_of(128).splits_head_dim());
        assert_eq!((hopper_backward_config_of(128).block_n(), hopper_backward_config_of(128).score_keys()), (128, 64));
        // d = 192: a dQ buffer of rows 16 bytes longer than 192 f32.
        let c = hopper_backward_config_of(192);
        assert_eq!((c.dq_turns(), c.d_o_stages(), c.dq_partials(), c.dq_pitch()), (1, 2, 1, 784));
        assert_eq!((c.registers(), c.dq_turn_columns(0), c.dq_turn_columns(1)), ((40, 232), 192, 0));
        let l = c.layout();
        assert_eq!((l.p, l.d_s, l.d_q, l.d_q_bytes, l.d_q_rows), (147456, 163840, 180224, 64 * 784, 230400));
        // Tile dim 256: K, V, two stages of Q, one of dO, two P and two dS
        // buffers, one dQ buffer of 128 columns that the consumers take in turn.
        for d in [224, 256] {
            let c = hopper_backward_config_of(d);
            assert_eq!((c.dq_turns(), c.dq_buffer_columns(), c.d_o_stages(), c.dq_pitch()), (2, 128, 1, 528));
            assert_eq!(c.registers(), (24, 240));
            assert_eq!((c.dq_turn_columns(0), c.dq_turn_columns(1), c.dq_turn_columns(2)), (128, d - 128, 0));
            let l = c.layout();
            assert_eq!((l.k, l.v, l.q, l.d_o, l.stage_bytes), (0, 32768, 65536, 131072, 32768));
            assert_eq!((l.p, l.d_s, l.d_s_bytes, l.d_q, l.d_q_bytes), (163840, 180224, 8192, 196608, 64 * 528));
            assert_eq!(c.smem_bytes(), 196608 + 64 * 528 + 32 + 104 + 1024);
        }
    }
}

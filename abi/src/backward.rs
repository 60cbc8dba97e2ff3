//! The backward kernels (issue 31): their table, tile configuration,
//! shared-memory layout and argument block.
//!
//! One backward call is three kernels on one [`BackwardParams`] (the
//! deterministic mode launches the second several times, each taking the
//! next key blocks):
//!
//! 1. `flash_bwd_prepare_{f16|bf16}`: per query row, `delta = rowsum(dO * O)`
//!    into [`BackwardParams::delta`], and the row of the f32 dQ accumulator
//!    zeroed. Grid [`row_grid`], [`ROW_KERNEL_THREADS`] threads.
//! 2. `flash_bwd_d{head_dim}_{f16|bf16}`: one block per key block of one
//!    key/value head and batch (grid [`BackwardConfig::grid`]); in the
//!    deterministic mode, launches of `dq_splits` key blocks one after
//!    another. For a key block it walks the query rows of every query head of
//!    its group that see its keys, recomputes P from Q, K and the saved LSE,
//!    accumulates dK and dV in registers and adds each query block's dQ to
//!    the f32 accumulator (with atomics, or to its split's own).
//!    Writes dK (scaled) and dV.
//! 3. `flash_bwd_finish_dq_{f16|bf16}`: dQ = softmax_scale * the
//!    accumulator (the splits' summed in order), rounded. Grid [`row_grid`],
//!    [`ROW_KERNEL_THREADS`] threads.
//!
//! The table lists every main kernel once
//! ([`backward_kernels!`](crate::backward_kernels)); the device crate makes
//! the entry points of `host/kernels-backward.ptx` from it.

use crate::config::smem_row_bytes;
use crate::kernels::Dtype;
use crate::params::ForwardParams;

/// Query rows the main kernel takes per step, and keys per block.
pub const BACKWARD_BLOCK_M: u32 = 64;
pub const BACKWARD_BLOCK_N: u32 = 64;

/// Threads of the row kernels (prepare and finish), and the query rows one
/// block of them covers: one warp per row at a time, a lane per 8 columns.
pub const ROW_KERNEL_THREADS: u32 = 128;
pub const ROW_KERNEL_ROWS: u32 = 16;

/// Dynamic shared memory a block may have on sm_80 (the smallest of the
/// GPUs the PTX runs on).
pub const MAX_BACKWARD_SMEM: u32 = 163 * 1024;

/// The arguments of all three backward kernels.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BackwardParams {
    /// The forward call whose gradients these are: q, k, v, o and its lse
    /// (read only), strides, sizes, `cu_seqlens_q`/`cu_seqlens_k`, window,
    /// softcap and ALiBi. `o` is read, never written; split-KV, paged KV and
    /// `seqused_k` are not taken (`num_splits = 1`, the rest null).
    pub forward: ForwardParams,
    /// dO, as q's layout.
    pub d_o: *const u16,
    pub d_o_batch_stride: i64,
    pub d_o_row_stride: i64,
    pub d_o_head_stride: i64,
    /// dQ, as q's layout.
    pub d_q: *mut u16,
    pub d_q_batch_stride: i64,
    pub d_q_row_stride: i64,
    pub d_q_head_stride: i64,
    /// dK and dV, as k's and v's layouts.
    pub d_k: *mut u16,
    pub d_k_batch_stride: i64,
    pub d_k_row_stride: i64,
    pub d_k_head_stride: i64,
    pub d_v: *mut u16,
    pub d_v_batch_stride: i64,
    pub d_v_row_stride: i64,
    pub d_v_head_stride: i64,
    /// Scratch, f32: `rowsum(dO * O)` of each query row, indexed as the
    /// forward's lse; and the dQ accumulator, `head_dim` values per row at
    /// `head_dim` times that index.
    pub delta: *mut f32,
    pub d_q_accum: *mut f32,
    /// The deterministic mode's accumulators: 0 for one accumulator that
    /// every block adds to with atomics (one launch, grid x the key
    /// blocks); else this many, `d_q_accum_split_stride` elements apart:
    /// launches of a grid this wide, one after another, each taking the
    /// next `dq_splits` key blocks, block x adding into accumulator x. The
    /// finish kernel sums them in order.
    pub d_q_accum_split_stride: i64,
    pub dq_splits: u32,
    /// The key block of block x = 0 of this launch of the main kernel.
    pub first_key_block: u32,
    /// The softmax scale itself (the forward holds it times log2(e)).
    pub softmax_scale: f32,
    pub head_dim: u32,
}

/// The tile shape of one main backward kernel instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackwardConfig {
    pub head_dim: u32,
    /// 4 or 8. Warp `w` owns rows `16 (w % 4)` of a query step, and its
    /// part `w / 4` of the keys (scores, contiguous) or of the head dim
    /// (gradients: every `warps / 4`-th 16-column slice from slice `w / 4`).
    pub warps: u32,
    /// 2: the next query step's Q, dO, LSE and delta load while this one
    /// computes; 1 where two stages do not fit (d >= 160): each step's load
    /// waits.
    pub stages: u32,
}

/// Byte offsets of the shared-memory regions of the main kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackwardSmem {
    /// A query step's Q and dO ([`BACKWARD_BLOCK_M`] rows each), and its
    /// rows' LSE and delta (f32 each), in stage 0; stage `s` of each is
    /// `s * stage` bytes further.
    pub q: u32,
    pub d_o: u32,
    pub lse: u32,
    pub delta: u32,
    pub stage: u32,
    /// The block's K and V: [`BACKWARD_BLOCK_N`] rows each.
    pub k: u32,
    pub v: u32,
    /// The step's P and dS, rounded: `BLOCK_M x BLOCK_N` each.
    pub p: u32,
    pub d_s: u32,
    /// Each warp's dQ of a pass, f32, 16 rows of [`BackwardConfig::dq_pitch`]
    /// words: written as mma fragments, read back as whole 32-byte runs of
    /// a row, so that each atomic add to the accumulator covers whole
    /// sectors.
    pub d_q: u32,
    pub end: u32,
}

impl BackwardConfig {
    /// The config of `head_dim` with `warps`, and two stages where they fit
    /// in [`MAX_BACKWARD_SMEM`] (one above).
    const fn with_stages(head_dim: u32, warps: u32) -> BackwardConfig {
        let two = BackwardConfig { head_dim, warps, stages: 2 };
        if two.smem_bytes() <= MAX_BACKWARD_SMEM {
            two
        } else {
            BackwardConfig { head_dim, warps, stages: 1 }
        }
    }

    pub const fn threads(&self) -> u32 {
        self.warps * 32
    }

    /// Parts the keys of a score tile and the columns of a gradient tile
    /// are split in among the warps of one row group.
    pub const fn column_groups(&self) -> u32 {
        self.warps / 4
    }

    /// A warp's 8-column tiles of a gradient row (dK, dV, dQ).
    pub const fn grad_tiles(&self) -> u32 {
        self.head_dim / self.column_groups() / 8
    }

    /// The column tiles of each pass of `dQ = dS K`: all at once up to 8
    /// (d <= 128); above, passes of 4 (d = 192) or 2, each with its own
    /// accumulators, added to the f32 accumulator before the next pass. A
    /// warp's whole row of dQ (up to 64 registers at d = 256) beside dK and
    /// dV spills.
    pub const fn dq_tiles(&self) -> u32 {
        let tiles = self.grad_tiles();
        if tiles <= 8 {
            tiles
        } else if tiles.is_multiple_of(4) && tiles < 16 {
            4
        } else {
            2
        }
    }

    /// Words per row of a warp's dQ staging: the pass's columns and 8 more.
    /// With an even number of tiles that is 8 or 24 words past a multiple of
    /// 32 banks, so that the fragments' 8-byte stores (8 rows of 8 words per
    /// tile) and the 4-row reads of 8 words each are free of bank conflicts.
    pub const fn dq_pitch(&self) -> u32 {
        8 * self.dq_tiles() + 8
    }

    pub const fn layout(&self) -> BackwardSmem {
        let row = smem_row_bytes(self.head_dim);
        let q = 0;
        let d_o = q + BACKWARD_BLOCK_M * row;
        let lse = d_o + BACKWARD_BLOCK_M * row;
        let delta = lse + BACKWARD_BLOCK_M * 4;
        let stage = delta + BACKWARD_BLOCK_M * 4;
        let k = self.stages * stage;
        let v = k + BACKWARD_BLOCK_N * row;
        let p = v + BACKWARD_BLOCK_N * row;
        let d_s = p + BACKWARD_BLOCK_M * smem_row_bytes(BACKWARD_BLOCK_N);
        let d_q = d_s + BACKWARD_BLOCK_M * smem_row_bytes(BACKWARD_BLOCK_N);
        let end = d_q + self.warps * 16 * self.dq_pitch() * 4;
        BackwardSmem { q, d_o, lse, delta, stage, k, v, p, d_s, d_q, end }
    }

    pub const fn smem_bytes(&self) -> u32 {
        self.layout().end
    }

    /// `(key blocks of the longest sequence, key/value heads, batch)`, or
    /// with `dq_splits > 0` (the deterministic mode) that many blocks along
    /// x.
    pub const fn grid(&self, seqlen_k: u32, heads_kv: u32, batch: u32, dq_splits: u32) -> [u32; 3] {
        let x = if dq_splits > 0 { dq_splits } else { seqlen_k.div_ceil(BACKWARD_BLOCK_N) };
        [x, heads_kv, batch]
    }
}

/// The grid of the row kernels: `(row blocks of the longest sequence,
/// query heads, batch)`.
pub const fn row_grid(seqlen_q: u32, heads_q: u32, batch: u32) -> [u32; 3] {
    [seqlen_q.div_ceil(ROW_KERNEL_ROWS), heads_q, batch]
}

/// The tile shape of the main kernel of `head_dim`, if it has one: four
/// warps at d=32, eight above (each with half the head dim of dK and dV),
/// so that dK, dV, the scores and dQ stay in registers (at d = 160-256 dQ
/// in passes of a few column tiles; docs/backward.md).
pub const fn backward_config(head_dim: u32) -> Option<BackwardConfig> {
    match head_dim {
        32 => Some(BackwardConfig::with_stages(head_dim, 4)),
        64 | 96 | 128 | 160 | 192 | 224 | 256 => Some(BackwardConfig::with_stages(head_dim, 8)),
        _ => None,
    }
}

/// The config of a row of the table; a missing one stops the build.
pub const fn backward_config_of(head_dim: u32) -> BackwardConfig {
    match backward_config(head_dim) {
        Some(config) => config,
        None => panic!("a backward kernel of the table has no config"),
    }
}

/// One main backward kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackwardKernel {
    /// The PTX entry point.
    pub name: &'static str,
    pub head_dim: u32,
    pub dtype: Dtype,
    pub config: BackwardConfig,
}

/// Calls `$callback!` with every main backward kernel, one `(entry_point,
/// head_dim, Dtype)` row each: the one list of them.
#[macro_export]
macro_rules! backward_kernels {
    ($callback:ident) => {
        $callback! {
            (flash_bwd_d32_f16, 32, F16),
            (flash_bwd_d32_bf16, 32, Bf16),
            (flash_bwd_d64_f16, 64, F16),
            (flash_bwd_d64_bf16, 64, Bf16),
            (flash_bwd_d96_f16, 96, F16),
            (flash_bwd_d96_bf16, 96, Bf16),
            (flash_bwd_d128_f16, 128, F16),
            (flash_bwd_d128_bf16, 128, Bf16),
            (flash_bwd_d160_f16, 160, F16),
            (flash_bwd_d160_bf16, 160, Bf16),
            (flash_bwd_d192_f16, 192, F16),
            (flash_bwd_d192_bf16, 192, Bf16),
            (flash_bwd_d224_f16, 224, F16),
            (flash_bwd_d224_bf16, 224, Bf16),
            (flash_bwd_d256_f16, 256, F16),
            (flash_bwd_d256_bf16, 256, Bf16),
        }
    };
}

macro_rules! backward_table {
    ($(($name:ident, $head_dim:literal, $dtype:ident)),* $(,)?) => {
        /// Every main backward kernel.
        pub const BACKWARD_KERNELS: &[BackwardKernel] = &[$(BackwardKernel {
            name: stringify!($name),
            head_dim: $head_dim,
            dtype: Dtype::$dtype,
            config: backward_config_of($head_dim),
        }),*];
    };
}

backward_kernels!(backward_table);

/// The PTX name of the first row kernel of `dtype` (delta, the dQ
/// accumulator zeroed).
pub const fn backward_prepare_kernel(dtype: Dtype) -> &'static str {
    match dtype {
        Dtype::F16 => "flash_bwd_prepare_f16",
        Dtype::Bf16 => "flash_bwd_prepare_bf16",
    }
}

/// The PTX name of the last row kernel of `dtype` (dQ from the
/// accumulator).
pub const fn backward_finish_kernel(dtype: Dtype) -> &'static str {
    match dtype {
        Dtype::F16 => "flash_bwd_finish_dq_f16",
        Dtype::Bf16 => "flash_bwd_finish_dq_bf16",
    }
}

/// The main backward kernel of `head_dim` and `dtype`, if there is one.
pub fn backward_kernel(head_dim: u32, dtype: Dtype) -> Option<&'static BackwardKernel> {
    BACKWARD_KERNELS.iter().find(|k| k.head_dim == head_dim && k.dtype == dtype)
}

// The invariants of every row, checked as the crate builds.
const _: () = {
    let mut i = 0;
    while i < BACKWARD_KERNELS.len() {
        let c = BACKWARD_KERNELS[i].config;
        assert!(c.head_dim == BACKWARD_KERNELS[i].head_dim && c.head_dim.is_multiple_of(32));
        assert!(c.warps == 4 || c.warps == 8);
        assert!(c.stages == 1 || c.stages == 2);
        assert!(c.dq_tiles().is_multiple_of(2) && c.grad_tiles().is_multiple_of(c.dq_tiles()));
        // Each warp's part of the head dim and of a score row is whole
        // 16-column slices (pairs of 8-column tiles, one ldmatrix.x4 each).
        assert!((c.head_dim / c.column_groups()).is_multiple_of(16));
        assert!((BACKWARD_BLOCK_N / c.column_groups()).is_multiple_of(16));
        // A lane per 8 columns in the row kernels.
        assert!(c.head_dim / 8 <= 32);
        assert!(c.smem_bytes() <= MAX_BACKWARD_SMEM);
        i += 1;
    }
    // Four row groups of 16 rows cover a query step and a key block.
    assert!(BACKWARD_BLOCK_M == 64 && BACKWARD_BLOCK_N == 64);
};

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::format;

    #[test]
    fn names_follow_head_dim_and_dtype() {
        for k in BACKWARD_KERNELS {
            assert_eq!(k.name, format!("flash_bwd_d{}_{}", k.head_dim, k.dtype.name()));
            assert_eq!(backward_kernel(k.head_dim, k.dtype), Some(k));
        }
        assert_eq!(BACKWARD_KERNELS.len(), 16);
    }

    #[test]
    fn d128_layout_is_two_stages_of_q_do_lse_delta_then_k_v_p_ds() {
        let l = backward_config_of(128).layout();
        assert_eq!((l.q, l.d_o, l.lse, l.delta, l.stage), (0, 16384, 32768, 33024, 33280));
        assert_eq!((l.k, l.v, l.p, l.d_s, l.d_q), (66560, 82944, 99328, 107520, 115712));
        assert_eq!(l.end, 115712 + 8 * 16 * 72 * 4);
    }

    #[test]
    fn two_stages_wherever_they_fit_in_sm80_shared_memory() {
        for k in BACKWARD_KERNELS {
            let two = BackwardConfig { stages: 2, ..k.config };
            let expected = if two.smem_bytes() <= MAX_BACKWARD_SMEM { 2 } else { 1 };
            assert_eq!(k.config.stages, expected, "d = {}", k.head_dim);
        }
        let stages = |d| backward_config_of(d).stages;
        assert_eq!([32, 64, 96, 128, 160, 192, 224, 256].map(stages), [2, 2, 2, 2, 1, 1, 1, 1]);
        let dq_tiles = |d| backward_config_of(d).dq_tiles();
        assert_eq!([32, 64, 96, 128, 160, 192, 224, 256].map(dq_tiles), [4, 4, 6, 8, 2, 4, 2, 2]);
    }
}

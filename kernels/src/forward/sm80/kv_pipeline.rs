//! The K/V pipeline of a forward work tile ([`KvPipeline`]): the K/V
//! shared-memory stages and the `cp.async` copies of K and V into them. Its
//! prologue (Q's copy, the first blocks, the wait for Q) is spelled out in
//! `forward_tile`, and its waits and barriers in the key step
//! ([`crate::forward::sm80::mainloop`]); the contract below covers them too.
//!
//! Contract: at step `s` of the key loop (key block `n = n_end - 1 - s`),
//! after the top-of-step wait and barrier `K[n]` has landed in
//! [`KvPipeline::k_tile`]`(stage)` for every thread of the stage set (the
//! block, or the warp when the warps split the keys), and after the wait
//! before P V `V[n]` has landed in [`KvPipeline::v_tile`]`(stage)`; no copy
//! writes a stage while a thread of its set may still read it. Every group
//! committed counts in the waits: Q is group 0, each K or V block one
//! group, and deeper pipelines commit two empty groups per block past the
//! last, so that every step counts the same groups in flight. After the
//! prologue's barrier Q has landed for every warp. The waits and barriers
//! at the top of each step and before its P V are the pipeline's, spelled
//! out in the key step ([`crate::forward::sm80::mainloop`]; `forward` says why); the key
//! loop issues no other copy, wait or block barrier.
//!
//! Who loads a K/V stage and who waits for it: the warp alone when it has
//! its own stages, else the whole block.
//!
//! Why the pipeline is these types, spelled as they are: it replaced
//! closures of the kernel body, and its PTX is theirs byte for byte
//! (host/kernels.ptx unchanged) only because its types mirror what each
//! closure captured, by reference, one type per closure ([`KvThread`],
//! [`KStages`], [`VStages`], [`KeyBlockLoader`], and [`KvPipeline`] for
//! `prefetch`), and because the two functions that stay calls until LLVM
//! inlines them, [`KeyBlockLoader::load`] and [`KvPipeline::prefetch`], are
//! `#[inline]`, not `#[inline(always)]`: rustc gives closures `inlinehint`,
//! so LLVM inlined those two after simplifying them, where an
//! `alwaysinline` function is inlined before. Other spellings (one struct of all
//! the references, fields by value, `#[inline(always)]` throughout)
//! changed the PTX of many kernels and spilled at d=128 (docs/tuning.md,
//! ideas not adopted). The small accessors are
//! `#[inline(always)]` and rustc's MIR inliner inlines them, as it did the
//! closures they replace.

use core::marker::PhantomData;

use crate::arch;
use crate::common::layout::SmemTile;
use crate::common::problem::Sequence;
use crate::common::tile_copy::load_tile_async;
use crate::forward::sm80::kernel::ForwardKernel;
use crate::params::ForwardParams;

/// The thread's index among those that load a K/V stage. With
/// `rederive_copy_offsets`, %tid.x is read again at each load, so that the
/// copies' per-thread offsets are recomputed there instead of held through
/// the key loop.
pub struct KvThread<'a, K: ForwardKernel> {
    pub tid: &'a u32,
    pub kernel: PhantomData<K>,
}

impl<'a, K: ForwardKernel> KvThread<'a, K> {
    #[inline(always)]
    pub fn get(&self) -> u32 {
        let tid = if K::REDERIVE_COPY_OFFSETS { arch::thread_idx_x_here() } else { *self.tid };
        if K::WARPS_SPLIT_KEYS {
            tid % 32
        } else {
            tid
        }
    }
}

/// The K stages. Stage addresses are computed, not indexed from an array,
/// so that no array of them lands in local memory.
pub struct KStages<'a, const HEAD_DIM: usize> {
    pub q_tile: &'a SmemTile<HEAD_DIM>,
    pub first_stage_row: &'a u32,
    pub block_n: &'a u32,
}

impl<'a, const HEAD_DIM: usize> KStages<'a, HEAD_DIM> {
    #[inline(always)]
    pub fn tile(&self, stage: u32) -> SmemTile<HEAD_DIM> {
        SmemTile::<HEAD_DIM>::at(self.q_tile.after_rows(*self.first_stage_row + stage * *self.block_n))
    }
}

/// The V stages, after the K stages.
pub struct VStages<'a, const HEAD_DIM: usize> {
    pub q_tile: &'a SmemTile<HEAD_DIM>,
    pub first_stage_row: &'a u32,
    pub stages: &'a u32,
    pub block_n: &'a u32,
}

impl<'a, const HEAD_DIM: usize> VStages<'a, HEAD_DIM> {
    #[inline(always)]
    pub fn tile(&self, stage: u32) -> SmemTile<HEAD_DIM> {
        SmemTile::<HEAD_DIM>::at(self.q_tile.after_rows(*self.first_stage_row + (*self.stages + stage) * *self.block_n))
    }
}

/// Loads of one key block of k or v into a stage.
pub struct KeyBlockLoader<'a, K: ForwardKernel, const HEAD_DIM: usize> {
    pub block_n: &'a u32,
    pub seq: &'a Sequence,
    pub params: &'a ForwardParams,
    pub k: &'a *const u16,
    pub v: &'a *const u16,
    pub kv_thread: &'a KvThread<'a, K>,
    pub kv_threads: &'a u32,
}

impl<'a, K: ForwardKernel, const HEAD_DIM: usize> KeyBlockLoader<'a, K, HEAD_DIM> {
    /// Loads key block `n` of k (`keys`) or v into `tile`, one copy group.
    /// Only the last block the rows see (`n_end - 1`, loop order's first)
    /// may reach past seqlen_k; every earlier one is `whole`. The general
    /// kernels and the dense non-causal ones of two or more stages then
    /// skip the bound check: in the general ones its per-pass row compares
    /// are otherwise live through the key loop (with them, d=128 spills);
    /// the non-causal ones were measured slightly faster without at d=64-128
    /// (docs/tuning.md, the configuration table). The dense causal kernels
    /// keep it (without, d=128 spills), and so do the one-stage ones (slower
    /// without at d=160, 192 and 256: docs/tuning.md, ideas not adopted).
    ///
    /// `#[inline]`, not `#[inline(always)]`: see the module doc.
    #[inline]
    pub unsafe fn load(&self, tile: SmemTile<HEAD_DIM>, n: u32, keys: bool, whole: bool) {
        let first_key = n * *self.block_n;
        let (k_offset, v_offset) = self.seq.key_offsets::<K>(self.params, first_key);
        let (src, offset, row_stride) = if keys {
            (*self.k, k_offset, self.params.k_row_stride)
        } else {
            (*self.v, v_offset, self.params.v_row_stride)
        };
        // The host keeps row strides within MAX_ROW_STRIDE.
        let row_stride = row_stride as u32;
        load_tile_async::<HEAD_DIM>(
            tile,
            *self.block_n,
            src.offset(offset as isize),
            row_stride,
            if whole && (K::GENERAL || (!K::CAUSAL && (K::STAGES as usize) > 1)) {
                *self.block_n
            } else {
                self.seq.seqlen_k - first_key
            },
            self.kv_thread.get(),
            *self.kv_threads,
            K::CAUSAL,
        );
        arch::cp_async_commit();
    }
}

/// The K/V pipeline of one work tile: the key blocks `n_begin..n_end` it
/// streams, from the last to the first, through the stages. The contract is
/// the module's.
pub struct KvPipeline<'a, K: ForwardKernel, const HEAD_DIM: usize> {
    pub n_end: &'a u32,
    pub n_begin: &'a u32,
    pub loader: &'a KeyBlockLoader<'a, K, HEAD_DIM>,
    pub k_stages: &'a KStages<'a, HEAD_DIM>,
    pub v_stages: &'a VStages<'a, HEAD_DIM>,
}

impl<'a, K: ForwardKernel, const HEAD_DIM: usize> KvPipeline<'a, K, HEAD_DIM> {
    /// The barrier of the threads that share a stage set.
    #[inline(always)]
    pub fn kv_barrier(&self) {
        if K::WARPS_SPLIT_KEYS {
            arch::sync_warp()
        } else {
            arch::sync_threads()
        }
    }

    /// K's stage `stage`.
    #[inline(always)]
    pub fn k_tile(&self, stage: u32) -> SmemTile<HEAD_DIM> {
        self.k_stages.tile(stage)
    }

    /// V's stage `stage`.
    #[inline(always)]
    pub fn v_tile(&self, stage: u32) -> SmemTile<HEAD_DIM> {
        self.v_stages.tile(stage)
    }

    /// [`KeyBlockLoader::load`].
    #[inline(always)]
    pub unsafe fn load_key_block(&self, tile: SmemTile<HEAD_DIM>, n: u32, keys: bool, whole: bool) {
        self.loader.load(tile, n, keys, whole)
    }

    /// K and V of the block `ahead` blocks after (in loop order) the first
    /// one, into `stage`. Past the last block, deeper pipelines commit two
    /// empty groups instead, so that every step counts the same groups in
    /// flight; two stages need not (their last step waits for all). Blocks
    /// `ahead > 0` are whole, which the callers say as a constant.
    ///
    /// `#[inline]`, not `#[inline(always)]`: see the module doc.
    #[inline]
    pub unsafe fn prefetch(&self, stage: u32, ahead: u32, whole: bool) {
        if ahead < *self.n_end - *self.n_begin {
            self.loader.load(self.k_stages.tile(stage), *self.n_end - 1 - ahead, true, whole);
            self.loader.load(self.v_stages.tile(stage), *self.n_end - 1 - ahead, false, whole);
        } else if (K::STAGES as usize) > 2 {
            arch::cp_async_commit();
            arch::cp_async_commit();
        }
    }
}

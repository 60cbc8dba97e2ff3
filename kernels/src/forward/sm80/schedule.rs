//! The block scheduler: which work tiles (query block, split, head, batch)
//! a CTA computes, and in which order the grid hands them out.
//!
//! Contract of a [`TileScheduler`]: every thread of a CTA gets the same
//! sequence of tiles (its answers are uniform over the CTA, so the barriers
//! of the kernel loop stay convergent), and every CTA at least one; over
//! the whole grid, every tile of the call is handed out exactly once, for a
//! grid the host sizes for the scheduler (today
//! [`flash_attn_abi::kernels::forward_grid`], the one-shot grid). A
//! scheduler issues no barrier and touches no shared memory. The kernel
//! loop ([`crate::forward::sm80::flash_forward`]) runs the tiles one after
//! another and synchronises the CTA between two, so a persistent or
//! Stream-K schedule is a new implementation (and a row choosing it, in
//! [`crate::entry`]), not a change to the kernel body. A Stream-K
//! scheduler would add the part of the tile's key blocks to [`WorkTile`],
//! as `split` is for split-KV.

use crate::arch;
use crate::forward::sm80::kernel::ForwardKernel;
use crate::params::ForwardParams;

/// One unit of a CTA's work: `block_m` query rows of one (batch, head), and
/// which part of their key blocks (split `split` of `num_splits`).
#[derive(Clone, Copy)]
pub struct WorkTile {
    /// The query block: rows `m_block * block_m ..` of the batch's sequence.
    pub m_block: u32,
    /// The split of the key blocks (0 without split-KV).
    pub split: u32,
    /// The query head.
    pub head: u32,
    pub batch: u32,
}

/// Which work tiles a CTA computes, one after another.
pub trait TileScheduler {
    /// Whether a CTA may compute more than one tile. Without, the kernel
    /// loop stops after the first tile as it compiles (the branch on this
    /// constant is resolved when the kernel is instantiated), so the kernel
    /// is the tile's body run once, with no loop for LLVM to fold.
    const PERSISTENT: bool;

    /// The CTA's first work tile: every CTA of the grid has one.
    ///
    /// # Safety
    /// `params` is the launch's argument block.
    unsafe fn initial<K: ForwardKernel>(params: &ForwardParams) -> WorkTile;

    /// The CTA's tile after `current`, or `None` once it has none left.
    ///
    /// # Safety
    /// `params` is the launch's argument block.
    unsafe fn next<K: ForwardKernel>(params: &ForwardParams, current: &WorkTile) -> Option<WorkTile>;

    /// The batches of the call, as the split-KV partial outputs are laid
    /// out (`[split, batch, head, row]`).
    fn batches(params: &ForwardParams) -> u32;
}

/// One tile per CTA, the grid `(num_splits * query blocks, heads_q, batch)`
/// of [`flash_attn_abi::kernels::forward_grid`]: x is split-major (the
/// general kernels decode the query block and the split from it), and the
/// query blocks run from the last to the first, so that under causal
/// masking the blocks with the most keys launch first.
pub struct OneShot;

impl TileScheduler for OneShot {
    const PERSISTENT: bool = false;

    #[inline(always)]
    unsafe fn initial<K: ForwardKernel>(params: &ForwardParams) -> WorkTile {
        // Written so that the PTX is the one the kernel body compiled to
        // before it had a scheduler: the grid registers are read in the
        // order it read them, and the general kernels' head and batch go
        // into the tile before the query block is decoded (built last,
        // LLVM sinks their reads past the division, moving them in the
        // PTX).
        if K::GENERAL {
            let mut tile = WorkTile { m_block: 0, split: 0, head: arch::block_idx_y(), batch: arch::block_idx_z() };
            let m_blocks = params.seqlen_q.div_ceil(K::BLOCK_M);
            core::hint::assert_unchecked(m_blocks != 0);
            tile.m_block = m_blocks - 1 - arch::block_idx_x() % m_blocks;
            tile.split = arch::block_idx_x() / m_blocks;
            tile
        } else {
            let block = arch::block_idx_x();
            let m_block = if K::CAUSAL { arch::grid_dim_x() - 1 - block } else { block };
            let batch = arch::block_idx_z();
            WorkTile { m_block, split: 0, head: arch::block_idx_y(), batch }
        }
    }

    #[inline(always)]
    unsafe fn next<K: ForwardKernel>(_params: &ForwardParams, _current: &WorkTile) -> Option<WorkTile> {
        None
    }

    #[inline(always)]
    fn batches(_params: &ForwardParams) -> u32 {
        arch::grid_dim_z()
    }
}

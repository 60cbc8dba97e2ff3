//! The tile scheduler: which tiles (128 query rows of one head and batch)
//! each block computes, and in what order.
//!
//! The host launches one block per tile, or persistent blocks, one per SM
//! (its planner says where each is used). Block `b` of a grid of `g`
//! takes tiles `b, b + g, b + 2 g, ...` of the call's tiles, ordered query
//! block fastest, so that the blocks running at once share a head's K and
//! V in L2 (across heads, causal tiles read K and V from memory at about
//! 128 FLOP a byte, below what the tensor cores need). Causal tiles go
//! from a head's last query block (the rows that see the most keys) to its
//! first.

use flash_attn_abi::hopper::{HopperParams, HOPPER_BLOCK_M};

use crate::arch;
use crate::params::ForwardParams;
use crate::problem::Visibility;

/// What a block works on for one tile: 128 query rows of one head and
/// batch, and the key blocks its rows see.
#[derive(Clone, Copy)]
pub struct HopperTile {
    pub head: u32,
    pub batch: u32,
    /// The tile's first query row.
    pub first_row: u32,
    /// Key blocks `[key_block_begin, key_block_end)`.
    pub key_block_begin: u32,
    pub key_block_end: u32,
    pub visibility: Visibility,
}

impl HopperTile {
    pub fn key_blocks(&self) -> u32 {
        self.key_block_end - self.key_block_begin
    }
}

/// The call's tiles: `query_blocks * heads * batch` of them.
#[derive(Clone, Copy)]
pub struct TileOrder {
    query_blocks: u32,
    heads: u32,
    /// Every tile of the call: `query_blocks * heads * batch`.
    tiles: u32,
    /// The grid's blocks.
    blocks: u32,
}

impl TileOrder {
    #[inline(always)]
    pub fn of(p: &HopperParams) -> Self {
        TileOrder { query_blocks: p.query_blocks, heads: p.forward.heads_q, tiles: p.tiles, blocks: p.blocks }
    }

    /// The tiles this block takes, in order.
    #[inline(always)]
    pub fn tiles<'a, const BN: usize, const CAUSAL: bool, const GENERAL: bool>(
        &'a self,
        p: &'a ForwardParams,
    ) -> BlockTiles<'a, BN, CAUSAL, GENERAL> {
        BlockTiles { order: self, p, index: arch::block_idx_x() }
    }

    /// Tile `index` of the order. The general kernels read the window from
    /// the parameters; the others fix it.
    #[inline(always)]
    fn tile<const BN: usize, const CAUSAL: bool, const GENERAL: bool>(
        &self,
        p: &ForwardParams,
        index: u32,
    ) -> HopperTile {
        // Neither is zero for a launched grid; saying so drops the
        // divide-by-zero panic paths.
        unsafe { core::hint::assert_unchecked(self.query_blocks != 0 && self.heads != 0) };
        let (block_of_head, head_batch) = (index % self.query_blocks, index / self.query_blocks);
        let query_block = if CAUSAL { self.query_blocks - 1 - block_of_head } else { block_of_head };
        let first_row = query_block * HOPPER_BLOCK_M;
        let (left, right) = if GENERAL { (p.window_left, p.window_right) } else { (-1, if CAUSAL { 0 } else { -1 }) };
        // The diagonal derived here, for each tile (`xor_in_place` keeps
        // LLVM from hoisting it): held through the loop, it was the value
        // the causal producer spilled past its 24 registers.
        let seqlen_k = arch::xor_in_place(p.seqlen_k, 0);
        let visibility =
            Visibility { seqlen_k: seqlen_k as i32, diagonal: seqlen_k as i32 - p.seqlen_q as i32, left, right };
        let last_row = (first_row + HOPPER_BLOCK_M).min(p.seqlen_q) - 1;
        let (key_block_begin, key_block_end) = visibility.key_blocks(first_row, last_row, BN as u32);
        HopperTile {
            head: head_batch % self.heads,
            batch: head_batch / self.heads,
            first_row,
            key_block_begin,
            key_block_end,
            visibility,
        }
    }
}

/// The tiles one block takes: [`TileOrder`]'s from the block's index, a
/// grid apart.
pub struct BlockTiles<'a, const BN: usize, const CAUSAL: bool, const GENERAL: bool> {
    order: &'a TileOrder,
    p: &'a ForwardParams,
    index: u32,
}

impl<const BN: usize, const CAUSAL: bool, const GENERAL: bool> Iterator for BlockTiles<'_, BN, CAUSAL, GENERAL> {
    type Item = HopperTile;

    #[inline(always)]
    fn next(&mut self) -> Option<HopperTile> {
        if self.index >= self.order.tiles {
            return None;
        }
        let tile = self.order.tile::<BN, CAUSAL, GENERAL>(self.p, self.index);
        self.index += self.order.blocks;
        Some(tile)
    }
}

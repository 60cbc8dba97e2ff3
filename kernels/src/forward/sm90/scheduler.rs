//! The tile scheduler: which tiles (the config's `block_m` query rows of
//! one head and batch) each block computes, and in what order.
//!
//! The host launches one block per tile, or persistent blocks, one per SM
//! (its planner says where each is used). A block's first tile is its
//! index. The producer picks each next one and hands it to the consumers
//! through a slot of shared memory ([`hand_over`], [`take`]): with the
//! call's tile counter, the next tile no block has taken (an atomic add),
//! so that a block that drew light tiles takes more of them; without it,
//! the tile a grid further on. Tiles are ordered query block fastest, so
//! that the blocks running at once share a head's K and V in L2 (across
//! all heads, causal tiles read K and V from memory at about 128 FLOP a
//! byte, below what the tensor cores need). Causal tiles go from the last
//! query block (the rows that see the most keys) to the first, so that
//! the light tiles come last and fill in around the heavy ones, and each
//! block of a section of heads whose K and V fit in L2 before the next
//! ([`HopperParams::section_heads`]): head by head, the last heads' heavy
//! tiles would start when little work is left to fill in beside them.

use flash_attn_abi::hopper::HopperParams;

use super::smem::Smem;
use crate::arch;
use crate::common::problem::{packed_sequence, Visibility};
use crate::params::ForwardParams;

/// What a block works on for one tile: `block_m` query rows of one head
/// and sequence, and the key blocks its rows see.
#[derive(Clone, Copy)]
pub struct HopperTile {
    pub head: u32,
    /// The tile's sequence (its batch; ALiBi slopes are per sequence).
    pub batch: u32,
    /// Where the sequence lies in the tensors: the batch index of their
    /// layout, and its first token in q, o and the LSE, and in k and v.
    /// Dense calls: `batch`, 0 and 0. Packed sequences: 0 and the offsets
    /// of `cu_seqlens_q` and `cu_seqlens_k` (the tensors hold one batch of
    /// all the tokens).
    pub layout_batch: u32,
    pub first_token_q: u32,
    pub first_token_k: u32,
    /// The sequence's query rows, and the tile's first (from the
    /// sequence's first): a tile of a packed sequence shorter than the
    /// longest may lie past its rows, and then sees no key.
    pub seqlen_q: u32,
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
    /// The heads (of every batch) whose causal tiles interleave.
    section_heads: u32,
    /// Every tile of the call: `query_blocks * heads * batch`.
    tiles: u32,
    /// The grid's blocks.
    blocks: u32,
}

impl TileOrder {
    #[inline(always)]
    pub fn of(p: &HopperParams) -> Self {
        TileOrder {
            query_blocks: p.query_blocks,
            heads: p.forward.heads_q,
            section_heads: p.section_heads,
            tiles: p.tiles,
            blocks: p.blocks,
        }
    }

    /// The tiles of the call: the index past the last is the end.
    #[inline(always)]
    pub fn tiles(&self) -> u32 {
        self.tiles
    }

    /// The block's first tile.
    #[inline(always)]
    pub fn first(&self) -> u32 {
        arch::block_idx_x()
    }

    /// The block's tile after `index`: with a `counter`, the next of the
    /// call's tiles no block has taken (the first tiles of the grid's
    /// blocks taken without it), else the tile a grid further on.
    ///
    /// # Safety
    /// `counter` is null or the call's tile counter ([`HopperParams`]).
    #[inline(always)]
    pub unsafe fn next(&self, index: u32, counter: *mut u32) -> u32 {
        if counter.is_null() {
            index.saturating_add(self.blocks)
        } else {
            self.blocks.saturating_add(arch::atom_global_add_u32(counter, 1))
        }
    }

    /// Tile `index` of the order, of `BM` rows. The general kernels read
    /// the window and the packed sequences' offsets from the parameters;
    /// the others fix the window and take dense batches.
    ///
    /// # Safety
    /// Where `cu_seqlens_q` is not null, `cu_seqlens_k` is not either, and
    /// both hold the offsets of every batch and the end.
    #[inline(always)]
    pub unsafe fn tile<const BM: usize, const BN: usize, const CAUSAL: bool, const GENERAL: bool>(
        &self,
        p: &ForwardParams,
        index: u32,
    ) -> HopperTile {
        // Neither is zero for a launched grid; saying so drops the
        // divide-by-zero panic paths.
        unsafe { core::hint::assert_unchecked(self.query_blocks != 0 && self.heads != 0) };
        let (block_of_head, head_batch) = if CAUSAL {
            unsafe { in_sections(index, self.query_blocks, self.section_heads) }
        } else {
            (index % self.query_blocks, index / self.query_blocks)
        };
        let query_block = if CAUSAL { self.query_blocks - 1 - block_of_head } else { block_of_head };
        let first_row = query_block * BM as u32;
        let batch = head_batch / self.heads;
        let (left, right) = if GENERAL { (p.window_left, p.window_right) } else { (-1, if CAUSAL { 0 } else { -1 }) };
        // The diagonal derived here, for each tile (`xor_in_place` keeps
        // LLVM from hoisting it): held through the loop, it was the value
        // the causal producer spilled past its 24 registers.
        let (mut seqlen_q, mut seqlen_k) = (p.seqlen_q, arch::xor_in_place(p.seqlen_k, 0));
        let (mut layout_batch, mut first_token_q, mut first_token_k) = (batch, 0, 0);
        let packed = GENERAL && !p.cu_seqlens_q.is_null();
        if packed {
            let (q_start, q_len) = packed_sequence(p.cu_seqlens_q, batch);
            let (k_start, k_len) = packed_sequence(p.cu_seqlens_k, batch);
            (seqlen_q, seqlen_k) = (q_len, k_len);
            (layout_batch, first_token_q, first_token_k) = (0, q_start as u32, k_start as u32);
        }
        let visibility =
            Visibility { seqlen_k: seqlen_k as i32, diagonal: seqlen_k as i32 - seqlen_q as i32, left, right };
        let (key_block_begin, key_block_end) = if packed && first_row >= seqlen_q {
            (0, 0)
        } else {
            let last_row = (first_row + BM as u32).min(seqlen_q) - 1;
            visibility.key_blocks(first_row, last_row, BN as u32)
        };
        HopperTile {
            head: head_batch % self.heads,
            batch,
            layout_batch,
            first_token_q,
            first_token_k,
            seqlen_q,
            first_row,
            key_block_begin,
            key_block_end,
            visibility,
        }
    }
}

/// Tile `index` of a causal call as `(query block counted from the
/// heaviest, head of all batches)`: section by section of `section_heads`
/// heads, and in one, each query block of its heads in turn.
///
/// # Safety
/// `section_heads` divides the call's heads of all batches and `index` is
/// below `query_blocks` times those (the host's
/// [`HopperParams::section_heads`]), which fits in a u32: no divisor is
/// then zero, which saying so drops the panic paths of.
#[inline(always)]
unsafe fn in_sections(index: u32, query_blocks: u32, section_heads: u32) -> (u32, u32) {
    let section_tiles = section_heads * query_blocks;
    unsafe { core::hint::assert_unchecked(section_tiles != 0 && section_heads != 0) };
    let (section, within) = (index / section_tiles, index % section_tiles);
    (within / section_heads, section * section_heads + within % section_heads)
}

/// The producer hands the block's next tile `index` (past the last: the
/// end) to the consumers in Q buffer `buffer` (of its phase of `parity`,
/// [`super::Loads::q_buffer`]): once they have released the buffer's last
/// tile, which frees its tile slot too, it writes the slot. Its arrival on
/// the buffer's full barrier, with Q's load or alone (a tile without key
/// blocks, the end), releases the write to the consumers.
///
/// # Safety
/// The producer's one thread calls it, after the barriers were initialised.
#[inline(always)]
pub unsafe fn hand_over<const BM: usize, const D: usize, const DT: usize, const BN: usize, const STAGES: usize>(
    smem: &Smem<BM, D, DT, BN, STAGES>,
    index: u32,
    (buffer, parity): (u32, u32),
) {
    arch::mbarrier_wait_parity(smem.q_empty(buffer), parity ^ 1);
    arch::st_shared_u32(smem.tile_slot(buffer), index);
}

/// A consumer thread takes the tile the producer handed over in Q buffer
/// `buffer` ([`hand_over`]) once the buffer's full barrier completes its
/// phase of `parity`: the tile's index, past the last at the end.
///
/// # Safety
/// Every consumer thread calls it, after the barriers were initialised.
#[inline(always)]
pub unsafe fn take<const BM: usize, const D: usize, const DT: usize, const BN: usize, const STAGES: usize>(
    smem: &Smem<BM, D, DT, BN, STAGES>,
    (buffer, parity): (u32, u32),
) -> u32 {
    arch::mbarrier_wait_parity(smem.q_full(buffer), parity);
    arch::ld_shared_u32(smem.tile_slot(buffer))
}

#[cfg(test)]
mod tests {
    use super::in_sections;

    /// Every tile once; in a section, each query block of all its heads
    /// before the next; sections in order of their heads.
    #[test]
    fn sections_order_every_tile_once_heaviest_blocks_first() {
        for (query_blocks, heads) in [(1u32, 1u32), (32, 64), (8, 7), (5, 12), (128, 40)] {
            for section_heads in (1..=heads).filter(|s| heads.is_multiple_of(*s)) {
                let mut seen = vec![false; (query_blocks * heads) as usize];
                let mut last = (0, 0);
                for index in 0..query_blocks * heads {
                    let (block, head) = unsafe { in_sections(index, query_blocks, section_heads) };
                    assert!(block < query_blocks && head < heads);
                    let at = (head * query_blocks + block) as usize;
                    assert!(!seen[at], "tile {index} again: block {block} of head {head}");
                    seen[at] = true;
                    let key = (head / section_heads, block);
                    assert!(index == 0 || key >= last, "tile {index}: {key:?} after {last:?}");
                    last = key;
                }
            }
        }
    }
}

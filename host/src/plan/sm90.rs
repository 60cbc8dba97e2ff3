//! The sm_90a forward plan (compute capability 9.0): which calls the
//! sm_90a kernels take, their tile height, the persistent grid and the
//! order of its tiles, the tensor maps of q, k and v, and the launch.

use std::mem::offset_of;

use flash_attn_abi::hopper::{hopper_kernel, HopperKernel, HopperParams, HopperScratch, SLAB_COLUMNS};
use flash_attn_abi::kernels::Variant;
use flash_attn_abi::params::ForwardParams;
use flash_attn_abi::sm90::{TensorMap, TensorMapParams};

use super::kernels::{Kernel, KernelArgs, Launch, OutputAddrs, SCRATCH_ALIGN};
use super::params::{forward_params, needs_general};
use super::tma::tma_map;
use crate::call::{Call, Mask, Sequences};

/// The L2 that a causal call's section of heads fills with its K and V
/// ([`causal_section`]): half of an H100's or H200's 50 MB, the share one
/// of its two partitions holds near its SMs.
const CAUSAL_SECTION_L2_BYTES: usize = 25 << 20;

/// The query rows of the tiles that head dim `head_dim`'s sm_90a kernels
/// take for a call over `seqlen_k` keys (of the longest sequence, packed),
/// `causal` or not: 192 at d = 64, but 128 for causal calls over at most
/// 1024 keys, and 128 at the other head dims. The consumers of a causal
/// tile run to its last row's keys: at 1024 keys a tile of 192 rows
/// computes a third more key blocks than tiles of 128, which outweighs its
/// third consumer.
pub fn block_m(head_dim: u32, causal: bool, seqlen_k: usize) -> u32 {
    match head_dim {
        64 if causal && seqlen_k <= 1024 => 128,
        64 => 192,
        _ => 128,
    }
}

/// The tiles of a call (`block_m` query rows of one head and batch each),
/// which the persistent blocks share out: `(query blocks, tiles)`, `None`
/// past `u32`, which the kernels count in. For packed sequences `seqlen_q`
/// is the longest sequence's.
fn tiles(seqlen_q: usize, heads_q: usize, batch: usize, block_m: u32) -> Option<(u32, u32)> {
    let query_blocks = seqlen_q.div_ceil(block_m as usize);
    let tiles = u32::try_from(query_blocks.checked_mul(heads_q)?.checked_mul(batch)?).ok()?;
    Some((query_blocks as u32, tiles))
}

/// The heads (of every batch) whose tiles a causal call orders together,
/// each query block of every head of the section (heaviest first) before
/// the next block: the heavy tiles of the call's last heads then start with
/// the other blocks' heavy tiles, not after them, when little work is left
/// to fill in beside them. The most heads that put their K and V in
/// `l2_bytes`, so that the blocks running at once still find them in L2,
/// and divide `heads` (sections of one size: the kernel's order is two
/// divisions); at least 1. `kv_bytes_per_head` is a head's K and V (of one
/// batch).
fn causal_section(heads: usize, kv_bytes_per_head: usize, l2_bytes: usize) -> u32 {
    let fit = (l2_bytes / kv_bytes_per_head.max(1)).clamp(1, heads.max(1));
    let section = (1..=fit).rev().find(|s| heads.is_multiple_of(*s)).unwrap_or(1);
    section.min(u32::MAX as usize) as u32
}

/// An sm_90a forward plan: the kernel, its persistent grid and tiles, the
/// tensor maps of q, k and v (which the launch encodes into the scratch's
/// [`HopperScratch`], at its start), and the argument block, less the
/// output and scratch addresses that [`Sm90Plan::launches`] binds.
#[derive(Clone, Copy, Debug)]
pub struct Sm90Plan {
    pub kernel: &'static HopperKernel,
    pub grid: [u32; 3],
    /// The portable argument block, unsplit.
    pub args: ForwardParams,
    pub maps: [TensorMapParams; 3],
    /// The call's query blocks and tiles.
    pub query_blocks: u32,
    pub tiles: u32,
    /// The heads whose causal tiles interleave ([`causal_section`]).
    pub section_heads: u32,
    /// Whether the blocks take their tiles after the first off the call's
    /// tile counter ([`HopperParams::tile_counter`]) rather than every
    /// grid-th.
    pub tile_counter: bool,
    /// The scratch memory: the [`HopperScratch`], 256-byte rounded.
    pub scratch_bytes: usize,
}

/// Plans `call` on the sm_90a kernels of a GPU of `sm_count` SMs, if they
/// take it: dense or packed sequences (not a KV cache), no split asked for,
/// a head dim and element type of their table, and q, k and v as TMA reads
/// them (16-byte aligned, strides multiples of 16 bytes, coordinates in
/// 32 bits). Windows, softcap, ALiBi and packed sequences take the general
/// kernel. Decode calls ([`sm80::is_decode`](super::sm80::is_decode)) are
/// the caller's to leave to the sm_80 kernels.
pub fn plan(call: &Call, sm_count: usize) -> Option<Sm90Plan> {
    let p = &call.problem;
    // The tensors as TMA sees them, [batch, seqlen] of q and of k and v:
    // packed sequences are one batch of all their tokens, each tile's
    // sequence found through the offsets.
    let (q_rows, k_rows) = match call.sequences {
        Sequences::Dense => ([p.batch, p.seqlen_q], [p.batch, p.seqlen_k]),
        Sequences::Packed { total_q, total_k, .. } => ([1, total_q], [1, total_k]),
        Sequences::Cache { .. } => return None,
    };
    let variant = if needs_general(call) {
        Variant::General
    } else if call.mask == Mask::Causal {
        Variant::Causal
    } else {
        Variant::Full
    };
    if !matches!(call.num_splits, None | Some(1)) || call.append.is_some() {
        return None;
    }
    let head_dim = u32::try_from(p.head_dim).ok()?;
    let rows = block_m(head_dim, call.mask == Mask::Causal, p.seqlen_k);
    let kernel = hopper_kernel(head_dim, call.dtype, variant, rows)?;
    let (block_m, block_n) = (kernel.config.block_m(), kernel.config.block_n);
    let maps = [
        tma_map(call, &call.q, [q_rows[0], q_rows[1], p.heads_q], (SLAB_COLUMNS, block_m)),
        tma_map(call, &call.k, [k_rows[0], k_rows[1], p.heads_kv], (SLAB_COLUMNS, block_n)),
        tma_map(call, &call.v, [k_rows[0], k_rows[1], p.heads_kv], (kernel.config.v_slab_columns(), block_n)),
    ];
    // TMA takes 32-bit coordinates: the last box's first row among them.
    let coordinates = [(q_rows[1], block_m), (k_rows[1], block_n)];
    if maps.iter().any(|m| m.validate().is_err())
        || coordinates.iter().any(|&(n, rows)| n + rows as usize > i32::MAX as usize)
    {
        return None;
    }
    let (query_blocks, tiles) = tiles(p.seqlen_q, p.heads_q, p.batch, block_m)?;
    // Persistent blocks, one per SM, so that a tile's loads overlap the
    // last tile's epilogue. Unmasked tiles all cost the same: block b
    // takes every grid-th. The others differ (causal tiles, windows near
    // a sequence's start, packed sequences): a block takes the next tile
    // no block has taken (the tile counter), the causal kernel's heaviest
    // first (docs/hopper.md).
    let grid_x = tiles.min(u32::try_from(sm_count.max(1)).unwrap_or(u32::MAX));
    if grid_x > i32::MAX as u32 {
        return None;
    }
    let tile_counter = variant != Variant::Full && grid_x < tiles;
    // The causal kernel's tiles of several heads interleave (dense calls
    // only: the general kernel takes the packed ones, whose sequences
    // differ in length).
    let section_heads = if variant == Variant::Causal {
        // K and V, of 2-byte elements (f16 and bf16).
        let kv_bytes_per_head = 2 * p.seqlen_k * p.head_dim * 2;
        causal_section(p.heads_q * p.batch, kv_bytes_per_head, CAUSAL_SECTION_L2_BYTES)
    } else {
        1
    };
    Some(Sm90Plan {
        kernel,
        grid: [grid_x, 1, 1],
        args: forward_params(call),
        maps,
        query_blocks,
        tiles,
        section_heads,
        tile_counter,
        scratch_bytes: size_of::<HopperScratch>().next_multiple_of(SCRATCH_ALIGN),
    })
}

impl Sm90Plan {
    /// The one launch of the call, with the outputs at `outputs` and the
    /// scratch at `scratch` (at least [`Self::scratch_bytes`], 256-byte
    /// aligned, its [`HopperScratch`] already written there).
    pub fn launches(&self, outputs: OutputAddrs, scratch: u64) -> Vec<Launch> {
        let mut args = self.args;
        args.o = outputs.o as *mut u16;
        args.lse = outputs.lse as *mut f32;
        let config = self.kernel.config;
        let tensor_maps = (scratch + offset_of!(HopperScratch, tensor_maps) as u64) as *const TensorMap;
        let counter = scratch + offset_of!(HopperScratch, tile_counter) as u64;
        vec![Launch {
            kernel: Kernel::Hopper(self.kernel),
            grid: self.grid,
            threads: config.threads(),
            smem_bytes: config.smem_bytes(),
            args: KernelArgs::Hopper(HopperParams {
                forward: args,
                tensor_maps,
                query_blocks: self.query_blocks,
                tiles: self.tiles,
                blocks: self.grid[0],
                section_heads: self.section_heads,
                tile_counter: if self.tile_counter { counter as *mut u32 } else { std::ptr::null_mut() },
            }),
        }]
    }
}

#[cfg(test)]
mod tests {
    use flash_attn_abi::hopper::HOPPER_KERNELS;

    use super::*;

    #[test]
    fn causal_sections_fit_the_l2_and_divide_the_heads() {
        const MIB: usize = 1 << 20;
        // d = 128 s = 4096 (2 MiB of K and V a head), 64 heads: 12 fit, 8 divide.
        assert_eq!(causal_section(64, 2 * MIB, 25 * MIB), 8);
        // d = 256 s = 4096 (4 MiB), 32 heads: 6 fit, 4 divide.
        assert_eq!(causal_section(32, 4 * MIB, 25 * MIB), 4);
        // Small heads: all of them; a prime count past the fit: one.
        assert_eq!(causal_section(7, 1024, 25 * MIB), 7);
        assert_eq!(causal_section(7, 8 * MIB, 25 * MIB), 1);
        // A head over the budget, no heads, no bytes: never zero.
        assert_eq!(causal_section(16, 64 * MIB, 25 * MIB), 1);
        assert_eq!(causal_section(0, 2 * MIB, 25 * MIB), 1);
        assert_eq!(causal_section(12, 0, 25 * MIB), 12);
        for heads in 1..200 {
            let s = causal_section(heads, 3 * MIB, 25 * MIB) as usize;
            assert!(heads.is_multiple_of(s) && s <= 8, "{heads} heads: {s}");
        }
    }

    #[test]
    fn every_tile_height_the_rule_picks_has_a_kernel() {
        for k in HOPPER_KERNELS {
            for causal in [false, k.variant != Variant::Full] {
                for seqlen_k in [0, 1, 1024, 1025, usize::MAX] {
                    let rows = block_m(k.head_dim, causal, seqlen_k);
                    assert!(hopper_kernel(k.head_dim, k.dtype, k.variant, rows).is_some(), "{} {seqlen_k}", k.name);
                }
            }
        }
        // d = 64's causal calls over at most 1024 keys take 128-row tiles.
        let rows = |causal, seqlen_k| block_m(64, causal, seqlen_k);
        assert_eq!(
            [rows(true, 1024), rows(true, 1025), rows(false, 1024), block_m(128, true, 1)],
            [128, 192, 192, 128]
        );
        // Every kernel of the table is one the rule picks for some call.
        for k in HOPPER_KERNELS {
            let picked = [false, true].iter().any(|&causal| {
                [1024, 1025].iter().any(|&seqlen_k| block_m(k.head_dim, causal, seqlen_k) == k.config.block_m())
            });
            assert!(picked, "{} is never planned", k.name);
        }
    }

    #[test]
    fn tiles_are_counted_in_32_bits() {
        assert_eq!(tiles(1000, 8, 2, 128), Some((8, 128)));
        assert_eq!(tiles(0, 8, 2, 128), Some((0, 0)));
        assert_eq!(tiles(1 << 31, 1 << 16, 1, 128), None);
    }
}

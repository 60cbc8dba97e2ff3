//! The sm_90a forward kernels (issue 29): their table, their tile
//! configuration and shared-memory layout, and their argument block.
//!
//! A block is a producer warpgroup that issues TMA loads of each tile's Q
//! and of K and V into a ring of [`HopperConfig::stages`] stages, and two
//! or three consumer warpgroups ([`HopperConfig::consumers`]) that each own
//! 64 query rows of the tile and run `wgmma` on them; a block takes one
//! tile or, persistent, several. The table lists every instance once
//! ([`hopper_kernels!`](crate::hopper_kernels)); the device crate makes the
//! entry points of `host/kernels-sm90a.ptx` from it and the host loads them
//! on compute capability 9.0.

use crate::kernels::{Dtype, Variant};
use crate::params::ForwardParams;
use crate::sm90::TensorMap;

/// Query rows of one consumer warpgroup: one `wgmma` M.
pub const CONSUMER_ROWS: u32 = 64;
/// Threads of a warpgroup: the producer, and each consumer.
pub const WARPGROUP_THREADS: u32 = 128;
/// Columns of one TMA box and of one shared-memory tile slab: 64 16-bit
/// elements, the 128 bytes of the 128-byte swizzle.
pub const SLAB_COLUMNS: u32 = 64;
/// Bytes of one slab row.
pub const SLAB_ROW_BYTES: u32 = 128;
/// Dynamic shared memory a block may have on sm_90.
pub const MAX_HOPPER_SMEM: u32 = 227 * 1024;
/// Alignment of the shared-memory base the kernel rounds up to (the
/// 128-byte swizzle repeats every 8 rows of 128 bytes).
pub const SMEM_ALIGN: u32 = 1024;
/// Registers of an SM.
pub const REGISTER_FILE: u32 = 64 * 1024;

/// The registers `setmaxnreg` shares out among the warpgroups of a block of
/// `threads` threads, one block an SM: what each thread launches with (the
/// file over the threads, in whole 8s), times the threads. At 384 threads
/// that is 168 a thread, 64512, not the whole file.
pub const fn register_pool(threads: u32) -> u32 {
    REGISTER_FILE / threads / 8 * 8 * threads
}

/// The tile shape of one sm_90a kernel instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HopperConfig {
    pub head_dim: u32,
    /// Columns of the Q and K tiles in shared memory: the head dim rounded
    /// up to whole 64-column slabs. TMA fills the columns past the head dim
    /// with zeros, and `S = Q K^T` stops at the head dim's last k-step. V
    /// is the head dim's own columns ([`HopperConfig::v_slab_columns`]).
    pub tile_dim: u32,
    /// Keys per K/V stage (the `N` of `S = Q K^T`).
    pub block_n: u32,
    /// K/V stages in the ring.
    pub stages: u32,
    /// Consumer warpgroups, 64 query rows each: 2 or 3.
    pub consumers: u32,
}

/// Byte offsets of the shared-memory regions from the 1024-byte aligned
/// base. Q and K are `tile_dim / 64` slabs of 64 columns, one TMA box
/// each, a slab's rows 128 bytes apart in the 128-byte swizzle; V is
/// `head_dim / v_slab_columns` slabs, in the 128-byte swizzle (64 columns)
/// or the 64-byte one (32 columns).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HopperSmem {
    /// Q buffer `b` at `q + b * q_bytes`: a tile's rows
    /// ([`HopperConfig::block_m`]). Two where they fit beside the stages
    /// and the whole head dim's O: the producer then loads the block's next
    /// tile's Q while the consumers still read this tile's, so that it has
    /// landed when they start the next tile. With one, the next Q loads
    /// only once every consumer's last `S = Q K^T` of the tile is done, and
    /// the consumers wait for it after their epilogue.
    pub q: u32,
    pub q_bytes: u32,
    pub q_buffers: u32,
    /// K stage `s` at `k + s * k_stage_bytes`: `block_n` rows.
    pub k: u32,
    pub k_stage_bytes: u32,
    /// V stage `s` at `v + s * v_stage_bytes`.
    pub v: u32,
    pub v_stage_bytes: u32,
    /// O's staging buffer: each consumer's 64 rows of `o_columns` columns
    /// (the whole head dim where it fits, else a part of it at a time), in
    /// V's slabs, consumer `g`'s at `o + g * 64 * o_columns * 2`.
    pub o: u32,
    pub o_columns: u32,
    /// The mbarriers, 8 bytes each: per Q buffer full and empty, then per
    /// stage K full, K empty, V full, V empty.
    pub barriers: u32,
    /// Per Q buffer, 8 bytes apart, the index of the tile whose Q it holds,
    /// which the producer hands the consumers with its Q (4 bytes of 8; the
    /// buffer's barriers guard it).
    pub tile_slot: u32,
    pub end: u32,
}

impl HopperSmem {
    /// The layout of a Q tile of `block_m` rows, Q and K tiles of
    /// `tile_dim` columns, V tiles of `head_dim`, `block_n` keys per stage
    /// and `stages` stages: two Q buffers where they fit with O staged
    /// whole, else one.
    pub const fn of(block_m: u32, tile_dim: u32, head_dim: u32, block_n: u32, stages: u32) -> Self {
        // O staged whole means the layout fits: its columns are those that do.
        let two = Self::with_q_buffers(block_m, tile_dim, head_dim, block_n, stages, 2);
        if two.o_columns == head_dim {
            two
        } else {
            Self::with_q_buffers(block_m, tile_dim, head_dim, block_n, stages, 1)
        }
    }

    const fn with_q_buffers(
        block_m: u32,
        tile_dim: u32,
        head_dim: u32,
        block_n: u32,
        stages: u32,
        q_buffers: u32,
    ) -> Self {
        let q_bytes = block_m * tile_dim * 2;
        let k_stage_bytes = block_n * tile_dim * 2;
        let v_stage_bytes = block_n * head_dim * 2;
        let k = q_buffers * q_bytes;
        let v = k + stages * k_stage_bytes;
        let o = v + stages * v_stage_bytes;
        // After O: the barriers, then the tile slots' 8 bytes each.
        let barrier_bytes = 8 * (2 * q_buffers + 4 * stages);
        let slot_bytes = 8 * q_buffers;
        // No room (Q and the stages past the limit): no column of O fits.
        let room = (MAX_HOPPER_SMEM - SMEM_ALIGN).saturating_sub(o + barrier_bytes + slot_bytes);
        let o_columns = o_columns(head_dim, block_m, room);
        let barriers = o + block_m * o_columns * 2;
        let tile_slot = barriers + barrier_bytes;
        HopperSmem {
            q: 0,
            q_bytes,
            q_buffers,
            k,
            k_stage_bytes,
            v,
            v_stage_bytes,
            o,
            o_columns,
            barriers,
            tile_slot,
            end: tile_slot + slot_bytes,
        }
    }
}

/// The columns of O a consumer stages at a time in `room` bytes for `block_m`
/// rows: the most, of whole V slabs, that divide the head dim (0 if not even
/// one slab fits, which the table's check rejects).
const fn o_columns(head_dim: u32, block_m: u32, room: u32) -> u32 {
    let slab = v_slab_columns(head_dim);
    let mut columns = head_dim;
    while columns > 0 && (!head_dim.is_multiple_of(columns) || block_m * columns * 2 > room) {
        columns -= slab;
    }
    columns
}

impl HopperConfig {
    /// Query rows of a tile: 64 per consumer.
    pub const fn block_m(&self) -> u32 {
        CONSUMER_ROWS * self.consumers
    }

    /// Threads per block: the producer warpgroup and the consumers.
    pub const fn threads(&self) -> u32 {
        WARPGROUP_THREADS * (1 + self.consumers)
    }

    /// Registers per thread after `setmaxnreg`, `(producer, consumer)`:
    /// the producer gives up what the consumers take, the block's
    /// warpgroups sharing the 64K (`.maxntid` of the block's threads
    /// allocates 64K / threads each at launch). Two consumers: `(24 + 2 *
    /// 240) * 128`; three: `(32 + 3 * 160) * 128`, all 64K.
    pub const fn registers(&self) -> (u32, u32) {
        if self.consumers == 2 {
            (24, 240)
        } else {
            (32, 160)
        }
    }

    /// Columns of one V slab (one TMA box): 64 in the 128-byte swizzle
    /// where the head dim is whole 64-column slabs, else 32 in the 64-byte
    /// swizzle, so that V ends at the head dim and `O += P V` has the head
    /// dim as its `wgmma` N (a 128-byte-swizzled MN-major operand comes in
    /// whole 64-column slabs).
    pub const fn v_slab_columns(&self) -> u32 {
        v_slab_columns(self.head_dim)
    }

    pub const fn layout(&self) -> HopperSmem {
        HopperSmem::of(self.block_m(), self.tile_dim, self.head_dim, self.block_n, self.stages)
    }

    /// Dynamic shared memory: the layout plus what aligning its base may take.
    pub const fn smem_bytes(&self) -> u32 {
        self.layout().end + SMEM_ALIGN
    }
}

/// [`HopperConfig::v_slab_columns`] of head dim `head_dim`.
pub const fn v_slab_columns(head_dim: u32) -> u32 {
    if head_dim.is_multiple_of(SLAB_COLUMNS) {
        SLAB_COLUMNS
    } else {
        SLAB_COLUMNS / 2
    }
}

/// The configuration of head dim `head_dim`'s sm_90a `variant` kernel with
/// tiles of `block_m` query rows, if there is one.
///
/// - d = 64: tiles of 192 rows (three consumers, 160 registers each), 128
///   keys per stage, two stages. Its softmax costs as much as its GEMMs
///   (the exponentials alone keep the MUFU as busy as the tensor cores),
///   so its consumers' instruction stream bounds it: a third consumer
///   gives each scheduler another warp to issue from, and each K/V stage
///   serves 192 rows. S (64 registers), O (32) and P (32) fit 160. The
///   causal and general kernels also come with tiles of 128 rows, which
///   the host plans for short causal calls.
/// - d = 96 and 128 (Q and K tiles of 128 columns): 128 rows, 128 keys per
///   stage, two stages: the S accumulator (64 registers), O (`head_dim /
///   2`) and P (32) fit a consumer's 240 registers.
/// - d = 160 and 192 (tiles of 192 columns): 96 keys per stage, two
///   stages (128 keys would need 240 KiB at d = 192): Q 48 KiB, K 2 x 36
///   and V 2 x 30 or 36 KiB; O takes 80 or 96 registers, S 48. 64 keys per
///   stage, with two stages or three, measured slower.
/// - d = 224 and 256 (tiles of 256 columns): two stages of 64 keys (O alone
///   takes 112 or 128 registers): Q 64 KiB, K 2 x 32 KiB, V 2 x 28 or 32
///   KiB; but 80 keys in d = 224's full and causal kernels (K 2 x 40 KiB, V
///   2 x 35 KiB), which measured faster there and not at d = 256; the
///   general kernels spill at 80 keys at d = 256.
///
/// d = 32 keeps the sm_80 kernels: its softmax outweighs its GEMMs, and a
/// 64-column tile would double its `S = Q K^T` loads.
pub const fn hopper_config(head_dim: u32, variant: Variant, block_m: u32) -> Option<HopperConfig> {
    let (tile_dim, block_n) = match head_dim {
        64 => (64, 128),
        96 | 128 => (128, 128),
        160 | 192 => (192, 96),
        224 if !matches!(variant, Variant::General) => (256, 80),
        224 | 256 => (256, 64),
        _ => return None,
    };
    let consumers = match (head_dim, variant, block_m) {
        (64, _, 192) => 3,
        (64, Variant::Causal | Variant::General, 128) => 2,
        (64, _, _) => return None,
        (_, _, 128) => 2,
        _ => return None,
    };
    Some(HopperConfig { head_dim, tile_dim, block_n, stages: 2, consumers })
}

/// The argument block of the sm_90a kernels: the portable kernels' block
/// (outputs, strides, sizes, scale, mask) and the tensor maps of q, k and v
/// that the producer loads through. The general kernels read the window,
/// softcap and ALiBi fields and the packed sequences' offsets
/// (`cu_seqlens_q` and `cu_seqlens_k`, both or neither; the maps then over
/// one batch of all the tokens) too; none reads cache lengths, pages or
/// the split.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct HopperParams {
    pub forward: ForwardParams,
    /// Three tensor maps in global memory, 64-byte aligned: q, k, v, each
    /// over `[batch, heads, seqlen, head_dim]` (dimension 0 innermost:
    /// head_dim, seqlen, heads, batch) with boxes of 64 columns and
    /// [`HopperConfig::block_m`] (q) or `block_n` (k, v) rows.
    pub tensor_maps: *const TensorMap,
    /// Query blocks of `block_m` rows per head, tiles (`query_blocks * heads_q *
    /// batch`) and blocks (the grid's x, at most the tiles). Given rather than derived in the kernel, so that the
    /// producer reads them from the parameters instead of holding them in
    /// its few registers.
    pub query_blocks: u32,
    pub tiles: u32,
    pub blocks: u32,
    /// The heads (of every batch, `heads_q * batch` in all) whose causal
    /// tiles interleave, which the host chooses: 1 for the other calls.
    pub section_heads: u32,
    /// The call's tile counter, a zeroed u32 in global memory: a block
    /// past its first tile (its index) takes the next of the call's tiles
    /// no block has taken, `blocks + atomicAdd(counter, 1)`. Null: block
    /// `b` takes tiles `b, b + blocks, ...` instead.
    pub tile_counter: *mut u32,
}

/// What the host uploads to an sm_90a call's scratch before the launch, in
/// one copy: the tensor maps of q, k and v, and the zeroed tile counter.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct HopperScratch {
    pub tensor_maps: [TensorMap; 3],
    pub tile_counter: u32,
}

/// One sm_90a attention kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HopperKernel {
    /// The PTX entry point.
    pub name: &'static str,
    pub head_dim: u32,
    pub dtype: Dtype,
    /// [`Variant::Full`], [`Variant::Causal`] or [`Variant::General`]
    /// (windows, softcap, ALiBi at run time).
    pub variant: Variant,
    pub config: HopperConfig,
}

/// Calls `$callback!` with every sm_90a kernel, one `(entry_point,
/// head_dim, Dtype, Variant, block_m)` row each: the one list of them.
#[macro_export]
macro_rules! hopper_kernels {
    ($callback:ident) => {
        $callback! {
            (flash_fwd_sm90_d64_f16_full, 64, F16, Full, 192),
            (flash_fwd_sm90_d64_f16_causal, 64, F16, Causal, 192),
            (flash_fwd_sm90_d64_f16_causal_m128, 64, F16, Causal, 128),
            (flash_fwd_sm90_d64_f16_general, 64, F16, General, 192),
            (flash_fwd_sm90_d64_f16_general_m128, 64, F16, General, 128),
            (flash_fwd_sm90_d64_bf16_full, 64, Bf16, Full, 192),
            (flash_fwd_sm90_d64_bf16_causal, 64, Bf16, Causal, 192),
            (flash_fwd_sm90_d64_bf16_causal_m128, 64, Bf16, Causal, 128),
            (flash_fwd_sm90_d64_bf16_general, 64, Bf16, General, 192),
            (flash_fwd_sm90_d64_bf16_general_m128, 64, Bf16, General, 128),
            (flash_fwd_sm90_d96_f16_full, 96, F16, Full, 128),
            (flash_fwd_sm90_d96_f16_causal, 96, F16, Causal, 128),
            (flash_fwd_sm90_d96_f16_general, 96, F16, General, 128),
            (flash_fwd_sm90_d96_bf16_full, 96, Bf16, Full, 128),
            (flash_fwd_sm90_d96_bf16_causal, 96, Bf16, Causal, 128),
            (flash_fwd_sm90_d96_bf16_general, 96, Bf16, General, 128),
            (flash_fwd_sm90_d128_f16_full, 128, F16, Full, 128),
            (flash_fwd_sm90_d128_f16_causal, 128, F16, Causal, 128),
            (flash_fwd_sm90_d128_f16_general, 128, F16, General, 128),
            (flash_fwd_sm90_d128_bf16_full, 128, Bf16, Full, 128),
            (flash_fwd_sm90_d128_bf16_causal, 128, Bf16, Causal, 128),
            (flash_fwd_sm90_d128_bf16_general, 128, Bf16, General, 128),
            (flash_fwd_sm90_d160_f16_full, 160, F16, Full, 128),
            (flash_fwd_sm90_d160_f16_causal, 160, F16, Causal, 128),
            (flash_fwd_sm90_d160_f16_general, 160, F16, General, 128),
            (flash_fwd_sm90_d160_bf16_full, 160, Bf16, Full, 128),
            (flash_fwd_sm90_d160_bf16_causal, 160, Bf16, Causal, 128),
            (flash_fwd_sm90_d160_bf16_general, 160, Bf16, General, 128),
            (flash_fwd_sm90_d192_f16_full, 192, F16, Full, 128),
            (flash_fwd_sm90_d192_f16_causal, 192, F16, Causal, 128),
            (flash_fwd_sm90_d192_f16_general, 192, F16, General, 128),
            (flash_fwd_sm90_d192_bf16_full, 192, Bf16, Full, 128),
            (flash_fwd_sm90_d192_bf16_causal, 192, Bf16, Causal, 128),
            (flash_fwd_sm90_d192_bf16_general, 192, Bf16, General, 128),
            (flash_fwd_sm90_d224_f16_full, 224, F16, Full, 128),
            (flash_fwd_sm90_d224_f16_causal, 224, F16, Causal, 128),
            (flash_fwd_sm90_d224_f16_general, 224, F16, General, 128),
            (flash_fwd_sm90_d224_bf16_full, 224, Bf16, Full, 128),
            (flash_fwd_sm90_d224_bf16_causal, 224, Bf16, Causal, 128),
            (flash_fwd_sm90_d224_bf16_general, 224, Bf16, General, 128),
            (flash_fwd_sm90_d256_f16_full, 256, F16, Full, 128),
            (flash_fwd_sm90_d256_f16_causal, 256, F16, Causal, 128),
            (flash_fwd_sm90_d256_f16_general, 256, F16, General, 128),
            (flash_fwd_sm90_d256_bf16_full, 256, Bf16, Full, 128),
            (flash_fwd_sm90_d256_bf16_causal, 256, Bf16, Causal, 128),
            (flash_fwd_sm90_d256_bf16_general, 256, Bf16, General, 128),
        }
    };
}

/// The config of a row of the table; a missing one stops the build.
pub const fn hopper_config_of(head_dim: u32, variant: Variant, block_m: u32) -> HopperConfig {
    match hopper_config(head_dim, variant, block_m) {
        Some(config) => config,
        None => panic!("an sm_90a kernel of the table has no config"),
    }
}

macro_rules! hopper_table {
    ($(($name:ident, $head_dim:literal, $dtype:ident, $variant:ident, $block_m:literal)),* $(,)?) => {
        /// Every sm_90a attention kernel.
        pub const HOPPER_KERNELS: &[HopperKernel] = &[$(HopperKernel {
            name: stringify!($name),
            head_dim: $head_dim,
            dtype: Dtype::$dtype,
            variant: Variant::$variant,
            config: hopper_config_of($head_dim, Variant::$variant, $block_m),
        }),*];
    };
}

hopper_kernels!(hopper_table);

/// The sm_90a kernel of `head_dim`, `dtype` and `variant` with tiles of
/// `block_m` query rows, if there is one.
pub fn hopper_kernel(head_dim: u32, dtype: Dtype, variant: Variant, block_m: u32) -> Option<&'static HopperKernel> {
    HOPPER_KERNELS
        .iter()
        .find(|k| k.head_dim == head_dim && k.dtype == dtype && k.variant == variant && k.config.block_m() == block_m)
}

// The invariants of every row, checked as the crate builds.
const _: () = {
    let mut i = 0;
    while i < HOPPER_KERNELS.len() {
        let k = &HOPPER_KERNELS[i];
        let c = k.config;
        assert!(c.head_dim == k.head_dim && c.head_dim.is_multiple_of(32));
        // The tiles: the head dim in whole slabs, at most one slab more.
        assert!(c.tile_dim.is_multiple_of(SLAB_COLUMNS) && c.tile_dim >= c.head_dim);
        assert!(c.tile_dim < c.head_dim + SLAB_COLUMNS);
        assert!(matches!(k.variant, Variant::Full | Variant::Causal | Variant::General));
        // wgmma N of S (block_n) and of O (head_dim): what the primitives
        // implement; block_n is also P V's reduction, in k-steps of 16.
        assert!(matches!(c.block_n, 64 | 80 | 96 | 128));
        assert!(matches!(c.head_dim, 64 | 96 | 128 | 160 | 192 | 224 | 256));
        assert!(c.head_dim.is_multiple_of(c.v_slab_columns()));
        assert!(c.smem_bytes() <= MAX_HOPPER_SMEM);
        // The warpgroups' registers after `setmaxnreg` fit the block's pool,
        // and the consumers' turns are a round of at most three.
        assert!(matches!(c.consumers, 2 | 3));
        let (producer, consumer) = c.registers();
        assert!(WARPGROUP_THREADS * (producer + c.consumers * consumer) <= register_pool(c.threads()));
        // Every tile slab starts on the swizzle's 1024-byte repeat.
        let l = c.layout();
        assert!(l.k.is_multiple_of(SMEM_ALIGN) && l.v.is_multiple_of(SMEM_ALIGN));
        assert!(l.k_stage_bytes.is_multiple_of(SMEM_ALIGN) && l.v_stage_bytes.is_multiple_of(SMEM_ALIGN));
        // O is staged in whole V slabs, at least one.
        assert!(l.o_columns > 0 && l.o_columns.is_multiple_of(c.v_slab_columns()));
        assert!(c.head_dim.is_multiple_of(l.o_columns));
        i += 1;
    }
};

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::format;
    use std::string::String;

    #[test]
    fn names_follow_head_dim_dtype_variant_and_tile_rows() {
        for k in HOPPER_KERNELS {
            // Tiles of other rows than the full kernel's (the long calls')
            // are named by them.
            let rows = k.config.block_m();
            let full = HOPPER_KERNELS.iter().find(|f| (f.head_dim, f.variant) == (k.head_dim, Variant::Full));
            let tile = if Some(rows) == full.map(|f| f.config.block_m()) { String::new() } else { format!("_m{rows}") };
            let name = format!("flash_fwd_sm90_d{}_{}_{}{tile}", k.head_dim, k.dtype.name(), k.variant.suffix());
            assert_eq!(k.name, name);
            assert_eq!(hopper_kernel(k.head_dim, k.dtype, k.variant, rows), Some(k));
        }
    }

    #[test]
    fn d128_layout_is_q_then_two_stages_of_k_and_v() {
        let l = hopper_config_of(128, Variant::Full, 128).layout();
        // Two Q buffers of 32 KiB.
        assert_eq!((l.q, l.q_bytes, l.q_buffers), (0, 32768, 2));
        assert_eq!((l.k, l.k_stage_bytes, l.v, l.v_stage_bytes), (65536, 32768, 131072, 32768));
        // O: both consumers' 64 rows of the whole head dim, after V.
        assert_eq!((l.o, l.o_columns, l.barriers), (196608, 128, 229376));
        assert_eq!((l.tile_slot, l.end), (229376 + 8 * 12, 229376 + 8 * 12 + 16));
    }

    #[test]
    fn q_takes_two_buffers_where_they_fit_beside_the_whole_o() {
        for k in HOPPER_KERNELS {
            let (c, l) = (k.config, k.config.layout());
            assert!(c.smem_bytes() <= MAX_HOPPER_SMEM, "{}", k.name);
            if l.q_buffers == 2 {
                assert_eq!((l.k, l.o_columns), (2 * l.q_bytes, c.head_dim), "{}", k.name);
            } else {
                // With a second Q buffer O would not fit whole.
                let two = HopperSmem::with_q_buffers(c.block_m(), c.tile_dim, c.head_dim, c.block_n, c.stages, 2);
                assert!(two.o_columns < c.head_dim && l.k == l.q_bytes, "{}", k.name);
            }
        }
        let buffers = |d| hopper_config_of(d, Variant::General, 128).layout().q_buffers;
        assert_eq!([64, 96, 128, 160, 192, 224, 256].map(buffers), [2, 2, 2, 1, 1, 1, 1]);
        assert_eq!(hopper_config_of(64, Variant::Full, 192).layout().q_buffers, 2);
    }

    #[test]
    fn o_is_staged_whole_where_it_fits_else_in_parts() {
        let columns = |d, variant| hopper_config_of(d, variant, 128).layout().o_columns;
        assert_eq!(hopper_config_of(64, Variant::Full, 192).layout().o_columns, 64);
        assert_eq!([96, 128, 160].map(|d| columns(d, Variant::Full)), [96, 128, 160]);
        // d = 192: 64 of 192; d = 224: 32 (the head dim is 7 slabs); d = 256: half.
        assert_eq!([192, 224, 256].map(|d| columns(d, Variant::Full)), [64, 32, 128]);
        assert_eq!(columns(224, Variant::General), 32);
    }

    #[test]
    fn head_dims_between_slabs_take_the_next_whole_slabs_for_q_and_k_only() {
        for (head_dim, tile_dim) in [(96, 128), (160, 192), (224, 256)] {
            let (c, whole) =
                (hopper_config_of(head_dim, Variant::General, 128), hopper_config_of(tile_dim, Variant::General, 128));
            let (l, w) = (c.layout(), whole.layout());
            assert_eq!((c.tile_dim, l.k, l.k_stage_bytes, l.v), (tile_dim, w.k, w.k_stage_bytes, w.v));
            // V: the head dim's columns, in 32-column slabs.
            assert_eq!((c.v_slab_columns(), l.v_stage_bytes), (32, c.block_n * head_dim * 2));
        }
        assert_eq!(hopper_config_of(192, Variant::Full, 128).v_slab_columns(), 64);
        assert_eq!(hopper_config(32, Variant::Full, 128), None);
    }
}

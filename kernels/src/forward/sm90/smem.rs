//! The shared memory of an sm_90a block ([`flash_attn_abi::hopper::HopperSmem`]
//! gives the offsets): Q, the K and V stages and their mbarriers, and the
//! `wgmma` descriptors of the tiles.
//!
//! Every tile is stored as TMA lands it, swizzled: Q and K in slabs of 64
//! columns (128-byte rows, the 128-byte swizzle, 8-row groups 1024 bytes
//! apart), V in slabs of 64 columns likewise or, where the head dim is not
//! whole 64-column slabs, of 32 columns (64-byte rows, the 64-byte
//! swizzle, 8-row groups 512 bytes apart). That is the layout `wgmma`
//! reads through a descriptor with the same swizzle and the 8-row group as
//! its stride byte offset. Q and K are K-major operands (the head dim is
//! the reduction of `S = Q K^T`): one k-step of 16 columns is 32 bytes
//! further along the row, the next slab after 4 steps. V is the MN-major B
//! operand of `O += P V` (the keys are the reduction): one k-step is 16
//! keys, 16 rows further, and the slabs of the head dim (N) are the
//! leading byte offset apart.

use flash_attn_abi::hopper::{
    v_slab_columns, HopperSmem, CONSUMER_ROWS, SLAB_COLUMNS, SLAB_ROW_BYTES, SMEM_ALIGN, WARPGROUP_THREADS,
};
use flash_attn_abi::sm90::{DescriptorSwizzle, MatrixDescriptor};

use crate::arch;
use crate::common::element::Element;

/// The block's shared memory for tiles of `BM` query rows (the config's
/// `block_m`), head dim `D` in Q and K tiles of `DT` columns (its
/// `tile_dim`), `BN` keys per stage and `STAGES` stages, at a 1024-byte
/// aligned base.
#[derive(Clone, Copy)]
pub struct Smem<const BM: usize, const D: usize, const DT: usize, const BN: usize, const STAGES: usize> {
    base: u32,
    layout: HopperSmem,
}

impl<const BM: usize, const D: usize, const DT: usize, const BN: usize, const STAGES: usize>
    Smem<BM, D, DT, BN, STAGES>
{
    /// Consumer warpgroups, 64 rows of Q each, and their threads and warps.
    pub const CONSUMERS: u32 = BM as u32 / CONSUMER_ROWS;
    pub const CONSUMER_THREADS: u32 = Self::CONSUMERS * WARPGROUP_THREADS;
    pub const CONSUMER_WARPS: u32 = Self::CONSUMER_THREADS / 32;
    /// Bytes of one slab of Q (`BM` rows) and of K (`BN` rows).
    pub const Q_SLAB_BYTES: u32 = BM as u32 * SLAB_ROW_BYTES;
    pub const K_SLAB_BYTES: u32 = BN as u32 * SLAB_ROW_BYTES;
    pub const SLABS: u32 = DT as u32 / SLAB_COLUMNS;
    /// V's slabs: columns, bytes of a row and of a slab, and slabs.
    pub const V_SLAB_COLUMNS: u32 = v_slab_columns(D as u32);
    const V_ROW_BYTES: u32 = 2 * Self::V_SLAB_COLUMNS;
    pub const V_SLAB_BYTES: u32 = BN as u32 * Self::V_ROW_BYTES;
    pub const V_SLABS: u32 = D as u32 / Self::V_SLAB_COLUMNS;
    const LAYOUT: HopperSmem = HopperSmem::of(BM as u32, DT as u32, D as u32, BN as u32, STAGES as u32);
    /// Q buffers: the block's tiles take them in turn.
    pub const Q_BUFFERS: u32 = Self::LAYOUT.q_buffers;
    /// A Q buffer: the tile's rows in 64-column slabs, as TMA lands it
    /// (where [`super::consumer::q_in_registers`], the consumers read
    /// their fragments of it by `ldmatrix`).
    pub const Q_TILE: SwizzledTile = SwizzledTile { rows: BM as u32, columns: DT as u32, slab_columns: SLAB_COLUMNS };
    /// A consumer's staged O: its 64 rows of the layout's `o_columns`
    /// columns (the head dim's, or a part at a time), in V's slabs.
    pub const O_TILE: SwizzledTile =
        SwizzledTile { rows: CONSUMER_ROWS, columns: Self::LAYOUT.o_columns, slab_columns: Self::V_SLAB_COLUMNS };
    /// Bytes of the Q tile and of a K or V stage: what TMA lands for them,
    /// the columns of Q and K it fills with zeros past the head dim
    /// included.
    pub const Q_BYTES: u32 = Self::SLABS * Self::Q_SLAB_BYTES;
    pub const K_BYTES: u32 = Self::SLABS * Self::K_SLAB_BYTES;
    pub const V_BYTES: u32 = Self::V_SLABS * Self::V_SLAB_BYTES;

    /// The layout at the dynamic shared memory `dynamic_base`, rounded up
    /// to the swizzle's repeat (the config reserves the slack).
    #[inline(always)]
    pub fn at(dynamic_base: u32) -> Self {
        const { assert!(DT.is_multiple_of(SLAB_COLUMNS as usize) && D.is_multiple_of(Self::V_SLAB_COLUMNS as usize)) }
        const { assert!(BM.is_multiple_of(CONSUMER_ROWS as usize)) }
        // A consumer's threads copy its staged O out in whole runs.
        const { assert!(Self::O_TILE.runs_per_thread(WARPGROUP_THREADS) > 0) }
        Self { base: dynamic_base.next_multiple_of(SMEM_ALIGN), layout: Self::LAYOUT }
    }

    /// Slab `slab` of Q buffer `buffer`.
    #[inline(always)]
    pub fn q(&self, buffer: u32, slab: u32) -> u32 {
        self.base + self.layout.q + buffer * self.layout.q_bytes + slab * Self::Q_SLAB_BYTES
    }

    /// Slab `slab` of K's stage `stage`.
    #[inline(always)]
    pub fn k(&self, stage: u32, slab: u32) -> u32 {
        self.base + self.layout.k + stage * self.layout.k_stage_bytes + slab * Self::K_SLAB_BYTES
    }

    /// Slab `slab` of V's stage `stage`.
    #[inline(always)]
    pub fn v(&self, stage: u32, slab: u32) -> u32 {
        self.base + self.layout.v + stage * self.layout.v_stage_bytes + slab * Self::V_SLAB_BYTES
    }

    /// Consumer `group`'s staging buffer of O ([`Self::O_TILE`]).
    #[inline(always)]
    pub fn o(&self, group: u32) -> u32 {
        self.base + self.layout.o + group * CONSUMER_ROWS * Self::O_TILE.columns * 2
    }

    /// The mbarrier that completes when Q buffer `buffer`'s tile slot is
    /// written and its tile's Q (if it has key blocks) has landed.
    #[inline(always)]
    pub fn q_full(&self, buffer: u32) -> u32 {
        self.base + self.layout.barriers + 16 * buffer
    }

    /// Completes when every consumer thread is done reading Q buffer
    /// `buffer` (its warp's last `S = Q K^T` of the tile has completed)
    /// and its tile slot.
    #[inline(always)]
    pub fn q_empty(&self, buffer: u32) -> u32 {
        self.base + self.layout.barriers + 16 * buffer + 8
    }

    /// The index of the tile whose Q buffer `buffer` holds (u32), which the
    /// buffer's barriers guard.
    #[inline(always)]
    pub fn tile_slot(&self, buffer: u32) -> u32 {
        self.base + self.layout.tile_slot + 8 * buffer
    }

    #[inline(always)]
    fn stage_barrier(&self, stage: u32, which: u32) -> u32 {
        self.base + self.layout.barriers + 8 * (2 * Self::Q_BUFFERS + 4 * stage + which)
    }

    /// Completes when K of `stage` has landed.
    #[inline(always)]
    pub fn k_full(&self, stage: u32) -> u32 {
        self.stage_barrier(stage, 0)
    }

    /// Completes when every consumer warp is done reading K of `stage`.
    #[inline(always)]
    pub fn k_empty(&self, stage: u32) -> u32 {
        self.stage_barrier(stage, 1)
    }

    /// Completes when V of `stage` has landed.
    #[inline(always)]
    pub fn v_full(&self, stage: u32) -> u32 {
        self.stage_barrier(stage, 2)
    }

    /// Completes when every consumer warp is done reading V of `stage`.
    #[inline(always)]
    pub fn v_empty(&self, stage: u32) -> u32 {
        self.stage_barrier(stage, 3)
    }

    /// Initialises the mbarriers (one thread, before the block's barrier):
    /// the full ones complete on the producer's one arrival and the bytes
    /// of its loads, the K and V empty ones on one arrival per consumer
    /// warp, Q's on one per consumer thread (each reads the tile slot).
    ///
    /// # Safety
    /// The shared memory is the layout's.
    #[inline(always)]
    pub unsafe fn init_barriers(&self) {
        for buffer in 0..Self::Q_BUFFERS {
            arch::mbarrier_init(self.q_full(buffer), 1);
            arch::mbarrier_init(self.q_empty(buffer), Self::CONSUMER_THREADS);
        }
        for stage in 0..STAGES as u32 {
            arch::mbarrier_init(self.k_full(stage), 1);
            arch::mbarrier_init(self.k_empty(stage), Self::CONSUMER_WARPS);
            arch::mbarrier_init(self.v_full(stage), 1);
            arch::mbarrier_init(self.v_empty(stage), Self::CONSUMER_WARPS);
        }
        arch::fence_mbarrier_init();
    }

    /// The descriptor of consumer `group`'s 64 rows of Q buffer `buffer`
    /// at k-step `step` (columns `16 * step..`): the A operand of `S = Q
    /// K^T`.
    #[inline(always)]
    pub fn q_operand(&self, buffer: u32, group: u32, step: u32) -> u64 {
        k_major(self.q(buffer, step / 4) + group * CONSUMER_ROWS * SLAB_ROW_BYTES + 32 * (step % 4))
    }

    /// The descriptor of K of `stage` at k-step `step`: the B operand of
    /// `S = Q K^T`, its `BN` rows the N dimension.
    #[inline(always)]
    pub fn k_operand(&self, stage: u32, step: u32) -> u64 {
        k_major(self.k(stage, step / 4) + 32 * (step % 4))
    }

    /// The descriptor of V of `stage` at k-step `step` (keys `16 * step..`):
    /// the MN-major B operand of `O += P V`, its slabs the N dimension.
    #[inline(always)]
    pub fn v_operand(&self, stage: u32, step: u32) -> u64 {
        swizzled_operand(self.v(stage, 0) + 16 * Self::V_ROW_BYTES * step, Self::V_SLAB_BYTES, Self::V_ROW_BYTES)
    }
}

/// A K-major operand in the 128-byte swizzle at `start` (its leading byte
/// offset is unused in that mode; 16 by convention); the backward's dS
/// too ([`crate::backward::sm90::smem`]).
#[inline(always)]
pub(crate) fn k_major(start: u32) -> u64 {
    swizzled_operand(start, 16, SLAB_ROW_BYTES)
}

/// The descriptor of an operand at `start` in slabs of `row_bytes`-byte
/// rows (128 or 64) swizzled across their span, as TMA lands them: 8-row
/// groups (the swizzle's repeat) the stride byte offset apart, and
/// `leading_byte_offset` the MN-major slab-to-slab step (K-major: unused).
/// Both sm_90a families' tiles.
#[inline(always)]
pub(crate) fn swizzled_operand(start: u32, leading_byte_offset: u32, row_bytes: u32) -> u64 {
    let swizzle = if row_bytes == SLAB_ROW_BYTES { DescriptorSwizzle::B128 } else { DescriptorSwizzle::B64 };
    MatrixDescriptor { start, leading_byte_offset, stride_byte_offset: 8 * row_bytes, base_offset: 0, swizzle }.encode()
}

/// A tile of 16-bit elements in shared memory, `rows` rows of `columns`
/// columns in slabs of `slab_columns` (64: 128-byte rows in the 128-byte
/// swizzle; 32: 64-byte rows in the 64-byte swizzle), as TMA lands K and
/// V: a row's 16-byte chunks XORed with the row's place in the swizzle's
/// repeat of 1024 or 512 bytes. Both families stage their outputs in such
/// a tile (a warp's 4-byte stores of an accumulator fragment, 8 rows and 4
/// lanes a row, meet all 32 banks once) and copy it out 16 bytes a lane.
#[derive(Clone, Copy)]
pub struct SwizzledTile {
    pub rows: u32,
    pub columns: u32,
    pub slab_columns: u32,
}

impl SwizzledTile {
    /// The byte offset of `row` and `column` (even) from the tile's start.
    #[inline(always)]
    pub const fn offset(&self, row: u32, column: u32) -> u32 {
        let row_bytes = 2 * self.slab_columns;
        let (slab, byte) = (column / self.slab_columns, 2 * (column % self.slab_columns));
        let repeat = row * row_bytes / 128 % (row_bytes / 16);
        slab * self.rows * row_bytes + row * row_bytes + ((byte / 16) ^ repeat) * 16 + byte % 16
    }

    /// A warp's n8-tiles `fragment` of a `wgmma` accumulator (rows
    /// `first_row + 16 * warp..`, columns `first_column..`), each row `half`
    /// times `scales[half]` and rounded, to the tile staged at `tile`: a
    /// lane's two columns of a row are one 4-byte store.
    ///
    /// # Safety
    /// Nothing else reads or writes those bytes of the tile until the
    /// staging threads sync.
    #[inline(always)]
    pub unsafe fn stage<E: Element>(
        &self,
        tile: u32,
        fragment: &[[f32; 4]],
        scales: [f32; 2],
        (first_row, first_column): (u32, u32),
        (warp, lane): (u32, u32),
    ) {
        for (t, f) in fragment.iter().enumerate() {
            let column = first_column + 8 * t as u32 + 2 * (lane % 4);
            for (half, &scale) in scales.iter().enumerate() {
                let row = first_row + 16 * warp + lane / 4 + 8 * half as u32;
                let pair = E::pack(f[2 * half] * scale, f[2 * half + 1] * scale);
                arch::st_shared_u32(tile + self.offset(row, column), pair);
            }
        }
    }

    /// The 16-byte runs each of `threads` threads copies: the tile's runs
    /// over the threads, which must divide them (each tile's user checks
    /// it at compile time).
    pub const fn runs_per_thread(&self, threads: u32) -> u32 {
        let runs = self.rows * self.columns / 8;
        assert!(runs.is_multiple_of(threads));
        runs / threads
    }

    /// The tile staged at `tile` to global memory, row `r` at `out + r *
    /// row_stride`, rows below `rows_here` and columns below
    /// `columns_here`, 16 bytes a thread of `THREADS` (`thread` the
    /// caller's index among them). A slab's rows in order, each row's
    /// runs in order: a warp reads whole swizzled lines of one slab, and
    /// writes whole sectors.
    ///
    /// # Safety
    /// Every thread of the `THREADS` has staged its part and synced with
    /// the others; `out` holds the rows below `rows_here`, each 16-byte
    /// aligned.
    #[inline(always)]
    pub unsafe fn copy_out<const THREADS: u32>(
        &self,
        tile: u32,
        out: *mut u16,
        row_stride: i64,
        (rows_here, columns_here): (u32, u32),
        thread: u32,
    ) {
        // A run is 8 columns (16 bytes).
        let runs_per_slab_row = self.slab_columns / 8;
        for i in 0..self.runs_per_thread(THREADS) {
            let run = thread + THREADS * i;
            let slab = run / (runs_per_slab_row * self.rows);
            let row = run / runs_per_slab_row % self.rows;
            let column = slab * self.slab_columns + 8 * (run % runs_per_slab_row);
            if row < rows_here && column < columns_here {
                let value = arch::ld_shared_v4(tile + self.offset(row, column));
                let at = row as i64 * row_stride + column as i64;
                arch::st_global_v4(out.offset(at as isize).cast::<u8>(), value);
            }
        }
    }
}

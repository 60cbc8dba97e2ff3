//! The static shape of each kernel instance: tile sizes per head dim. The
//! host crate includes this file too, so launch geometry and shared-memory
//! sizes come from the one definition the kernels were compiled with.

/// Tile shape of one forward kernel instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TileConfig {
    pub head_dim: u32,
    /// Query rows per block: `warps * 16 * m_tiles`.
    pub block_m: u32,
    /// Keys per K/V tile.
    pub block_n: u32,
    pub warps: u32,
    /// 16-row m-tiles per warp.
    pub m_tiles: u32,
    /// Keep each warp's Q fragments in registers for the whole key loop
    /// (else re-read them from shared memory at every k-step).
    pub q_in_registers: bool,
}

impl TileConfig {
    pub const fn threads(&self) -> u32 {
        self.warps * 32
    }

    /// Dynamic shared memory: the Q tile (reused to stage O) and two stages
    /// each of K and V.
    pub const fn smem_bytes(&self) -> u32 {
        (self.block_m + 4 * self.block_n) * self.head_dim * 2
    }

    const fn new(head_dim: u32, warps: u32, m_tiles: u32, block_n: u32, q_in_registers: bool) -> Self {
        Self { head_dim, block_m: warps * 16 * m_tiles, block_n, warps, m_tiles, q_in_registers }
    }
}

/// Head dim 64: 128 query rows, 32 per warp, Q fragments in registers
/// (TUNING.md, step 3).
pub const HEAD_DIM_64: TileConfig = TileConfig::new(64, 4, 2, 64, true);
/// Head dim 128: 128 query rows, 32 per warp, 32-key blocks, Q re-read from
/// shared memory so the 32 rows fit in 255 registers (TUNING.md, step 2).
pub const HEAD_DIM_128: TileConfig = TileConfig::new(128, 4, 2, 32, false);

//! The static shape of each kernel instance: tile sizes per head dim, from
//! which the kernels are compiled and the host computes launch geometry and
//! shared-memory sizes.

/// Bytes of one shared-memory tile row of `head_dim` 16-bit elements: padded
/// to a multiple of 128 bytes (8 chunks of 16), so that the XOR swizzle of
/// the chunk index by `row % 8` stays inside the row.
pub const fn smem_row_bytes(head_dim: u32) -> u32 {
    head_dim.div_ceil(64) * 128
}

/// Tile shape of one forward kernel instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TileConfig {
    pub head_dim: u32,
    /// Query rows per block: `warps * 16 * m_tiles`, or `16 * m_tiles`
    /// when the warps split the keys.
    pub block_m: u32,
    /// Keys per K/V tile.
    pub block_n: u32,
    pub warps: u32,
    /// The warps share the same query rows and split the block's key
    /// blocks among themselves, each with its own K/V stages, and merge
    /// their outputs at the end (decode); else each warp has its own rows
    /// and every warp sees every key block.
    pub warps_split_keys: bool,
    /// 16-row m-tiles per warp.
    pub m_tiles: u32,
    /// Keep each warp's Q fragments in registers for the whole key loop
    /// (else re-read them from shared memory at every k-step).
    pub q_in_registers: bool,
    /// Shared-memory stages of each of K and V: the key loop keeps up to
    /// `stages - 1` key blocks in flight ahead of the one it computes.
    pub stages: u32,
    /// With two stages: wait for both K and V of a block at the top of its
    /// step, one barrier per step, instead of waiting for V only before
    /// P V, behind a second barrier (more stages always wait at the top).
    pub wait_kv_at_top: bool,
    /// Dense kernels: run the key blocks that need the mask (causal: the
    /// diagonal ones and seqlen_k's end; else seqlen_k's end only, loop
    /// order's first block) and those that need none in two copies of the
    /// key step, so that the unmasked copy carries no mask code or branch;
    /// else one loop asks per block.
    pub split_masked_steps: bool,
    /// Recompute each thread's K/V copy offsets from `%tid.x` at every load
    /// instead of holding them through the key loop: two registers fewer,
    /// which keep d=128's two-stage loop from spilling. Elsewhere ptxas
    /// schedules worse with it: measured slower at d=64-224
    /// (docs/tuning.md, ideas not adopted).
    pub rederive_copy_offsets: bool,
    /// Run each key block's softmax in two halves of keys, so that the
    /// second half's Q K^T overlaps the first half's exponentials and the
    /// first half's P V the second half's (measured faster at d=64,
    /// docs/tuning.md). Needs V landed at the top of the step
    /// (`wait_kv_at_top` or three stages).
    pub softmax_in_halves: bool,
}

impl TileConfig {
    pub const fn threads(&self) -> u32 {
        self.warps * 32
    }

    /// The sets of K/V stages: one per warp when the warps split the keys,
    /// else one shared by all.
    pub const fn stage_sets(&self) -> u32 {
        if self.warps_split_keys {
            self.warps
        } else {
            1
        }
    }

    /// Dynamic shared memory: the Q tile (reused to stage O) and, per stage
    /// set, `stages` stages each of K and V.
    pub const fn smem_bytes(&self) -> u32 {
        (self.block_m + self.stage_sets() * 2 * self.stages * self.block_n) * smem_row_bytes(self.head_dim)
    }

    /// The same shape in blocks of `warps` warps, each with its own rows:
    /// `block_m` follows.
    const fn with_warps(self, warps: u32) -> Self {
        Self { warps, block_m: warps * 16 * self.m_tiles, ..self }
    }

    /// A shape with two stages each of K and V, each warp its own rows.
    const fn new(head_dim: u32, warps: u32, m_tiles: u32, block_n: u32, q_in_registers: bool) -> Self {
        Self {
            head_dim,
            block_m: warps * 16 * m_tiles,
            block_n,
            warps,
            warps_split_keys: false,
            m_tiles,
            q_in_registers,
            stages: 2,
            wait_kv_at_top: false,
            split_masked_steps: false,
            rederive_copy_offsets: false,
            softmax_in_halves: false,
        }
    }
}

// Shapes per head dim, each the fastest measured (docs/tuning.md) that fits 255
// registers without spills and sm_80's 163 KiB of shared memory. 32 query
// rows per warp up to d=128 (d=128's dense kernel in blocks of 8 warps, one
// per SM, the others of 4, two per SM); from d=160 the O accumulators of 32
// rows no longer fit, so 16 rows per warp, in blocks of 4 warps (two blocks
// per SM) except at d=224 and in d=192's dense kernel (8 warps, one per SM).

/// Head dim 32.
pub const HEAD_DIM_32: TileConfig = TileConfig::new(32, 4, 2, 64, true);
/// Head dim 64: 128 query rows, 32 per warp, Q fragments in registers
/// (they still fit beside 32 rows), two K/V stages with one barrier per step
/// (measured faster than two barriers), the softmax in two halves of keys
/// and the masked first step in its own copy of the step (each measured
/// faster here; the peeled step was slower at d=128). docs/tuning.md, d=64.
pub const HEAD_DIM_64: TileConfig = TileConfig {
    wait_kv_at_top: true,
    softmax_in_halves: true,
    split_masked_steps: true,
    ..TileConfig::new(64, 4, 2, 64, true)
};
/// Head dim 96: FlashAttention-2's shape, 32 rows per warp, 64-key blocks,
/// Q re-read from shared memory (faster than 32-key blocks with Q in
/// registers), two K/V stages with one barrier per step (faster than one
/// stage once the ldmatrix swizzle is re-derived per k-step, which freed
/// the registers). The softmax in halves measured slower here.
/// docs/tuning.md, d=96.
pub const HEAD_DIM_96: TileConfig = TileConfig { wait_kv_at_top: true, ..TileConfig::new(96, 4, 2, 64, false) };
/// Head dim 128: 256 query rows in 8 warps of 32, one CTA per SM (slightly
/// faster than two CTAs of 4 warps at long sequences, as fast below), Q
/// re-read from shared memory so that the 32 rows fit in 255 registers,
/// 64-key blocks in two K/V stages with one barrier per step, which fit 255
/// registers since the ldmatrix swizzle is re-derived per k-step and the
/// copy offsets per load. Each K/V tile feeds twice the rows of a 4-warp
/// block, halving the copies per row. The softmax runs whole blocks: in
/// halves of keys it measured slower with 8 warps (slightly faster with 4).
/// docs/tuning.md, d=128.
pub const HEAD_DIM_128: TileConfig =
    TileConfig { wait_kv_at_top: true, rederive_copy_offsets: true, ..TileConfig::new(128, 8, 2, 64, false) };
/// Head dim 160: 4 warps of 16 rows, 64-key blocks in one K/V stage
/// (measured much faster than 8 warps; docs/tuning.md, d=160).
pub const HEAD_DIM_160: TileConfig = TileConfig { stages: 1, ..TileConfig::new(160, 4, 1, 64, false) };
/// Head dim 192: 8 warps of 16 rows (128 query rows, one CTA per SM, 144
/// KiB), 64-key blocks in two K/V stages waiting together: each K/V tile
/// feeds twice the rows of 4 warps in one stage, which had been faster than
/// 8 warps in one stage but measured slower than this. The causal kernel
/// keeps 4 warps in one stage (faster there). docs/tuning.md, d=192.
pub const HEAD_DIM_192: TileConfig = TileConfig { wait_kv_at_top: true, ..TileConfig::new(192, 8, 1, 64, false) };
/// Head dim 224: 8 warps of 16 rows, 64-key blocks in one K/V stage, which
/// fit 255 registers since the tile loads' row offsets are 32-bit (faster
/// than 32-key blocks). 4 warps spill with 64-key blocks and are slower with
/// 32-key blocks. docs/tuning.md, d=224.
pub const HEAD_DIM_224: TileConfig = TileConfig { stages: 1, ..TileConfig::new(224, 8, 1, 64, false) };
/// Head dim 256: 4 warps of 16 rows, 64-key blocks in one K/V stage
/// (faster than 8 warps, and than 4 warps with 32-key blocks in two
/// stages; docs/tuning.md, d=256).
pub const HEAD_DIM_256: TileConfig = TileConfig { stages: 1, ..TileConfig::new(256, 4, 1, 64, false) };

/// Every head dim with kernels.
pub const HEAD_DIMS: [u32; 8] = [32, 64, 96, 128, 160, 192, 224, 256];

/// The tile config of the kernels for `head_dim`, if there are any.
pub const fn tile_config(head_dim: u32) -> Option<TileConfig> {
    match head_dim {
        32 => Some(HEAD_DIM_32),
        64 => Some(HEAD_DIM_64),
        96 => Some(HEAD_DIM_96),
        128 => Some(HEAD_DIM_128),
        160 => Some(HEAD_DIM_160),
        192 => Some(HEAD_DIM_192),
        224 => Some(HEAD_DIM_224),
        256 => Some(HEAD_DIM_256),
        _ => None,
    }
}

/// The tile config of the dense causal kernels (`flash_fwd_d*_causal`) for
/// `head_dim`: the dense shape, with two K/V stages at d=96 and d=128, where
/// one stage beside the diagonal blocks' masking spills (d=96) or is no
/// faster, and one at d=64, measured faster there than the dense kernel's
/// two. Two stages wait for K and V together at d=96 (measured faster),
/// separately at d=128 (together spills). At d=128 the masked and unmasked
/// key blocks run in separate loops (measured faster; slower at d=64). The
/// softmax runs whole blocks (in halves, unmeasured: d=64's one stage and
/// d=128's separate waits do not have V at the top of the step). At d=128
/// the blocks keep 4 warps of 32 rows, not the dense kernel's 8: a causal
/// block's rows see fewer key blocks the smaller it is, and the 128-row
/// blocks were measured against everything above. At d=192 they keep 4
/// warps of 16 rows in one stage, faster than the dense kernel's 8 warps in
/// two. docs/tuning.md, per head dim.
pub const fn causal_tile_config(head_dim: u32) -> Option<TileConfig> {
    match tile_config(head_dim) {
        Some(dense) => Some(TileConfig {
            stages: match head_dim {
                64 | 192 => 1,
                96 | 128 => 2,
                _ => dense.stages,
            },
            wait_kv_at_top: head_dim == 96,
            split_masked_steps: head_dim == 128,
            rederive_copy_offsets: false,
            softmax_in_halves: false,
            ..if head_dim == 128 || head_dim == 192 { dense.with_warps(4) } else { dense }
        }),
        None => None,
    }
}

/// The tile config of the general kernels (`flash_fwd_d*_general`) for
/// `head_dim`: the causal kernels' shape in one loop, except where the
/// features' extra registers do not fit beside it without spilling: 32-key
/// blocks at d=96 (their two stages waiting apart), one K/V stage at d=128
/// (two spill), and at d=192 8 warps of 16 rows in two stages (4 warps
/// spill in one stage or two).
pub const fn general_tile_config(head_dim: u32) -> Option<TileConfig> {
    match causal_tile_config(head_dim) {
        Some(causal) => Some(match head_dim {
            96 => TileConfig { block_n: 32, wait_kv_at_top: false, split_masked_steps: false, ..causal },
            128 => TileConfig { stages: 1, split_masked_steps: false, ..causal },
            192 => TileConfig::new(192, 8, 1, 64, false),
            _ => TileConfig { split_masked_steps: false, ..causal },
        }),
        None => None,
    }
}

/// The tile config of the decode kernels (`flash_fwd_d*_decode`) for
/// `head_dim`: 16 query rows per block, for a few queries against many
/// keys, which the block's four warps split among themselves, each through
/// its own K/V stage, merging their outputs in shared memory at the end.
/// Small blocks keep the tensor-core work per key low, so that reading K
/// and V bounds the time; split-KV and the warps supply the parallelism,
/// and the warps share the Q load and one merged partial output per split.
/// 32-key blocks in one stage per warp (FlashAttention-2's pipeline: V
/// loads during Q K^T, the next K during P V): at d=128 measured as fast as
/// two stages at small batches and faster at batch 64, in 68 KiB instead of
/// 132, so three blocks fit an SM (docs/tuning.md, decode).
pub const fn decode_tile_config(head_dim: u32) -> Option<TileConfig> {
    if tile_config(head_dim).is_none() {
        return None;
    }
    Some(TileConfig {
        head_dim,
        block_m: 16,
        block_n: 32,
        warps: 4,
        warps_split_keys: true,
        m_tiles: 1,
        q_in_registers: head_dim <= 128,
        stages: 1,
        wait_kv_at_top: false,
        split_masked_steps: false,
        rederive_copy_offsets: false,
        softmax_in_halves: false,
    })
}

/// The key block every page of a paged KV cache must be a multiple of: a
/// multiple of every kernel's `block_n`.
pub const PAGE_MULTIPLE: u32 = 64;

/// The most rows of any shared-memory tile (`block_m` or `block_n`).
pub const MAX_TILE_ROWS: u32 = 256;

/// The largest row stride, in elements, of q, k, v and o (for a paged
/// cache, the stride between rows of a page). The tile copies compute each
/// row's offset `row * row_stride + column` in u32, as 64-bit offsets cost
/// two registers each: with `row < MAX_TILE_ROWS` and `column < 256`, 2^23
/// keeps them below 2^31. That allows e.g. 32768 heads of d = 256 per row.
pub const MAX_ROW_STRIDE: u32 = 1 << 23;

// Every tile fits MAX_TILE_ROWS, and its offsets u32.
const _: () = {
    assert!(MAX_TILE_ROWS as u64 * MAX_ROW_STRIDE as u64 + 256 <= u32::MAX as u64);
    let mut i = 0;
    while i < HEAD_DIMS.len() {
        let d = HEAD_DIMS[i];
        let configs = [tile_config(d), causal_tile_config(d), general_tile_config(d), decode_tile_config(d)];
        let mut j = 0;
        while j < configs.len() {
            if let Some(c) = configs[j] {
                assert!(c.block_m <= MAX_TILE_ROWS && c.block_n <= MAX_TILE_ROWS);
            }
            j += 1;
        }
        i += 1;
    }
};

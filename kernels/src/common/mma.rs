//! The two matrix products of a warp, on `mma.sync.m16n8k16` fragments.
//!
//! Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16"): with
//! `g = lane / 4` and `t = lane % 4`,
//! - A (16x16, row-major) is four registers: rows g / g+8 of columns
//!   2t..2t+1, then rows g / g+8 of columns 2t+8..2t+9;
//! - B (16x8, column-major) is two registers: rows 2t..2t+1 and 2t+8..2t+9
//!   of column g;
//! - C (16x8, f32) is four values: row g columns 2t, 2t+1, then row g+8.
//!
//! `ldmatrix.x4` hands lanes 8i..8i+7 the row addresses of 8x8 matrix i and
//! gives every lane two elements of each matrix in exactly the A/B layouts.

use crate::arch;
use crate::common::element::Element;
use crate::common::layout::SmemTile;

/// Whether the ldmatrix addresses re-derive their swizzle at each k-step
/// ([`SmemTile::chunks_across`]) rather than hold one offset per swizzle
/// through the key loop. Warps of 32 query rows (two m-tiles) keep O and S
/// in about 200 registers and are short of them: one XOR per k-step frees
/// several, which is what lets d=96 and d=128 run two K/V stages
/// (docs/tuning.md, d=96 and d=128). Warps of 16 rows have registers to
/// spare.
const fn swizzle_in_place(m_tiles: usize) -> bool {
    m_tiles > 1
}

/// A block of f32 accumulators: `[m_tile][n_tile]`, each a C fragment.
pub type Accumulators<const M_TILES: usize, const N_TILES: usize> = [[[f32; 4]; N_TILES]; M_TILES];

/// The warp's query rows as the A operand of `Q K^T`: either loaded into
/// registers once (`IN_REGISTERS`), or re-read from the Q tile at every
/// k-step, which frees `2 * M_TILES * HEAD_DIM / 8` registers per lane for
/// more rows per warp.
pub struct QOperand<const M_TILES: usize, const HEAD_DIM: usize, const HEAD_DIM_16: usize, const IN_REGISTERS: bool> {
    /// This lane's ldmatrix address in m-tile 0, k-step 0.
    lane_addr: u32,
    /// With `IN_REGISTERS`, the fragments `[m_tile][k_step]`; otherwise
    /// never written after initialisation, so the compiler drops them.
    fragments: [[[u32; 4]; HEAD_DIM_16]; M_TILES],
}

impl<const M_TILES: usize, const HEAD_DIM: usize, const HEAD_DIM_16: usize, const IN_REGISTERS: bool>
    QOperand<M_TILES, HEAD_DIM, HEAD_DIM_16, IN_REGISTERS>
{
    /// The warp's rows `first_row..first_row + 16 * M_TILES` of `tile`.
    ///
    /// # Safety
    /// With `IN_REGISTERS`, the tile's rows must have landed in shared memory.
    #[inline(always)]
    pub unsafe fn new(tile: SmemTile<HEAD_DIM>, first_row: u32, lane: u32) -> Self {
        const { assert!(HEAD_DIM_16 * 16 == HEAD_DIM) }
        // Matrices 0..3: rows 0-7 / 8-15 of columns 0-7, then of columns 8-15.
        let mut q = Self {
            lane_addr: tile.chunk_addr(first_row + (lane % 8) + 8 * ((lane / 8) % 2), lane / 16),
            fragments: [[[0u32; 4]; HEAD_DIM_16]; M_TILES],
        };
        if IN_REGISTERS {
            for k in 0..HEAD_DIM_16 {
                let a = q.load(k);
                for m in 0..M_TILES {
                    q.fragments[m][k] = a[m];
                }
            }
        }
        q
    }

    #[inline(always)]
    unsafe fn load(&self, k: usize) -> [[u32; 4]; M_TILES] {
        let addr = SmemTile::<HEAD_DIM>::chunks_across(self.lane_addr, (k as u32) * 2, swizzle_in_place(M_TILES));
        core::array::from_fn(|m| arch::ldmatrix_x4(addr + (m as u32) * 16 * SmemTile::<HEAD_DIM>::ROW_BYTES))
    }

    /// The A fragments of every m-tile at k-step `k`.
    ///
    /// # Safety
    /// Without `IN_REGISTERS`, the Q tile must still hold Q.
    #[inline(always)]
    pub unsafe fn fragments(&self, k: usize) -> [[u32; 4]; M_TILES] {
        if IN_REGISTERS {
            core::array::from_fn(|m| self.fragments[m][k])
        } else {
            self.load(k)
        }
    }
}

/// `s = q k^T` for the warp's rows against all `N_TILES * 8` keys of `k_tile`.
///
/// # Safety
/// The K tile must have landed in shared memory.
#[inline(always)]
pub unsafe fn scores<
    E: Element,
    const M_TILES: usize,
    const N_TILES: usize,
    const HEAD_DIM: usize,
    const HEAD_DIM_16: usize,
    const Q_IN_REGISTERS: bool,
>(
    q: &QOperand<M_TILES, HEAD_DIM, HEAD_DIM_16, Q_IN_REGISTERS>,
    k_tile: SmemTile<HEAD_DIM>,
    lane: u32,
) -> Accumulators<M_TILES, N_TILES> {
    const { assert!(N_TILES % 2 == 0) }
    // Matrices 0..3: keys 0-7 of dims 0-7 / 8-15, then keys 8-15 likewise:
    // the B fragments of two neighbouring n-tiles.
    let lane_addr = k_tile.chunk_addr((lane % 8) + 8 * (lane / 16), (lane / 8) % 2);
    let mut s = [[[0f32; 4]; N_TILES]; M_TILES];
    for k in 0..HEAD_DIM_16 {
        let a = q.fragments(k);
        let addr = SmemTile::<HEAD_DIM>::chunks_across(lane_addr, (k as u32) * 2, swizzle_in_place(M_TILES));
        for pair in 0..N_TILES / 2 {
            let b = arch::ldmatrix_x4(addr + (pair as u32) * 16 * SmemTile::<HEAD_DIM>::ROW_BYTES);
            for m in 0..M_TILES {
                E::mma(&mut s[m][2 * pair], &a[m], &[b[0], b[1]]);
                E::mma(&mut s[m][2 * pair + 1], &a[m], &[b[2], b[3]]);
            }
        }
    }
    s
}

/// Rounds probabilities (C fragments, f32) to A fragments of `E`: the C
/// layout of n-tiles 2j and 2j+1 is the A layout of k-step j.
#[inline(always)]
pub fn probabilities_as_a<E: Element, const M_TILES: usize, const N_TILES: usize, const N_STEPS: usize>(
    p: &Accumulators<M_TILES, N_TILES>,
) -> [[[u32; 4]; N_STEPS]; M_TILES] {
    const { assert!(N_STEPS * 2 == N_TILES) }
    let mut a = [[[0u32; 4]; N_STEPS]; M_TILES];
    for m in 0..M_TILES {
        for j in 0..N_STEPS {
            let (lo, hi) = (&p[m][2 * j], &p[m][2 * j + 1]);
            a[m][j] = [E::pack(lo[0], lo[1]), E::pack(lo[2], lo[3]), E::pack(hi[0], hi[1]), E::pack(hi[2], hi[3])];
        }
    }
    a
}

/// `o += p v` over the `N_STEPS * 16` keys of `v_tile`.
///
/// # Safety
/// The V tile must have landed in shared memory.
#[inline(always)]
pub unsafe fn accumulate_pv<
    E: Element,
    const M_TILES: usize,
    const N_STEPS: usize,
    const HEAD_DIM: usize,
    const DIM_TILES: usize,
>(
    o: &mut Accumulators<M_TILES, DIM_TILES>,
    p: &[[[u32; 4]; N_STEPS]; M_TILES],
    v_tile: SmemTile<HEAD_DIM>,
    lane: u32,
) {
    const { assert!(DIM_TILES * 8 == HEAD_DIM) }
    // Transposed matrices 0..3: keys 0-7 / 8-15 of dims 0-7, then of dims
    // 8-15: the B fragments of two neighbouring dim-tiles.
    let lane_addr = v_tile.chunk_addr((lane % 8) + 8 * ((lane / 8) % 2), lane / 16);
    for j in 0..N_STEPS {
        let key_offset = (j as u32) * 16 * SmemTile::<HEAD_DIM>::ROW_BYTES;
        for pair in 0..DIM_TILES / 2 {
            let addr = SmemTile::<HEAD_DIM>::chunks_across(lane_addr, (pair as u32) * 2, swizzle_in_place(M_TILES))
                + key_offset;
            let b = arch::ldmatrix_x4_trans(addr);
            for m in 0..M_TILES {
                E::mma(&mut o[m][2 * pair], &p[m][j], &[b[0], b[1]]);
                E::mma(&mut o[m][2 * pair + 1], &p[m][j], &[b[2], b[3]]);
            }
        }
    }
}

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
use crate::element::Element;
use crate::layout::SmemTile;

/// One warp's query rows as A fragments: `[m_tile][k_step]`.
pub type QFragments<const M_TILES: usize, const HEAD_DIM_16: usize> = [[[u32; 4]; HEAD_DIM_16]; M_TILES];
/// A block of f32 accumulators: `[m_tile][n_tile]`, each a C fragment.
pub type Accumulators<const M_TILES: usize, const N_TILES: usize> = [[[f32; 4]; N_TILES]; M_TILES];

/// Loads the warp's Q rows (`first_row..first_row + 16 * M_TILES` of `tile`)
/// into A fragments.
///
/// # Safety
/// The tile's rows must have landed in shared memory.
#[inline(always)]
pub unsafe fn load_q_fragments<const M_TILES: usize, const HEAD_DIM: usize, const HEAD_DIM_16: usize>(
    tile: SmemTile<HEAD_DIM>,
    first_row: u32,
    lane: u32,
) -> QFragments<M_TILES, HEAD_DIM_16> {
    const { assert!(HEAD_DIM_16 * 16 == HEAD_DIM) }
    // Matrices 0..3: rows 0-7 / 8-15 of columns 0-7, then of columns 8-15.
    let row_in_tile = (lane % 8) + 8 * ((lane / 8) % 2);
    let chunk_in_step = lane / 16;
    let mut q = [[[0u32; 4]; HEAD_DIM_16]; M_TILES];
    for (m, q_m) in q.iter_mut().enumerate() {
        let row = first_row + (m as u32) * 16 + row_in_tile;
        for (k, q_mk) in q_m.iter_mut().enumerate() {
            *q_mk = arch::ldmatrix_x4(tile.chunk_addr(row, (k as u32) * 2 + chunk_in_step));
        }
    }
    q
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
>(
    q: &QFragments<M_TILES, HEAD_DIM_16>,
    k_tile: SmemTile<HEAD_DIM>,
    lane: u32,
) -> Accumulators<M_TILES, N_TILES> {
    const { assert!(N_TILES % 2 == 0) }
    // Matrices 0..3: keys 0-7 of dims 0-7 / 8-15, then keys 8-15 likewise:
    // the B fragments of two neighbouring n-tiles.
    let key_in_pair = (lane % 8) + 8 * (lane / 16);
    let chunk_in_step = (lane / 8) % 2;
    let mut s = [[[0f32; 4]; N_TILES]; M_TILES];
    for k in 0..HEAD_DIM_16 {
        for pair in 0..N_TILES / 2 {
            let key = (pair as u32) * 16 + key_in_pair;
            let b = arch::ldmatrix_x4(k_tile.chunk_addr(key, (k as u32) * 2 + chunk_in_step));
            for m in 0..M_TILES {
                E::mma(&mut s[m][2 * pair], &q[m][k], &[b[0], b[1]]);
                E::mma(&mut s[m][2 * pair + 1], &q[m][k], &[b[2], b[3]]);
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
    let key_in_step = (lane % 8) + 8 * ((lane / 8) % 2);
    let chunk_in_pair = lane / 16;
    for j in 0..N_STEPS {
        let key = (j as u32) * 16 + key_in_step;
        for pair in 0..DIM_TILES / 2 {
            let b = arch::ldmatrix_x4_trans(v_tile.chunk_addr(key, (pair as u32) * 2 + chunk_in_pair));
            for m in 0..M_TILES {
                E::mma(&mut o[m][2 * pair], &p[m][j], &[b[0], b[1]]);
                E::mma(&mut o[m][2 * pair + 1], &p[m][j], &[b[2], b[3]]);
            }
        }
    }
}

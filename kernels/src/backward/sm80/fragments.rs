//! The `mma.sync.m16n8k16` operands of the backward products, read from
//! swizzled shared-memory tiles ([`SmemTile`]) with `ldmatrix`, and the two
//! product shapes built from them (fragment layouts: [`crate::common::mma`]).
//!
//! The backward multiplies each tile both ways round: P and dS are stored
//! once as `[query, key]` and read as A of `dS K` (rows) and as A of
//! `P^T dO` and `dS^T Q` (transposed); Q, dO, K and V are read as B of a
//! product with their rows (`Q K^T`, `dO V^T`: not transposed) and of a
//! product over their rows (`dS K`, `P^T dO`, `dS^T Q`: transposed).

use crate::arch;
use crate::common::element::Element;
use crate::common::layout::SmemTile;

/// Each operand is a lane's base address, computed once, and a load that
/// moves it by whole k-steps: rows by adding whole 16-row strides, columns
/// by [`SmemTile::chunks_across`] in place, so that a lane holds one
/// address per operand through the query loop instead of one per k-step
/// (the forward's reason too: [`crate::common::mma`]).
///
/// A fragments of rows `first_row..+16` of a tile, 16 columns per k-step.
#[derive(Clone, Copy)]
pub struct RowsAsA<const W: usize> {
    addr: u32,
}

impl<const W: usize> RowsAsA<W> {
    #[inline(always)]
    pub fn new(tile: SmemTile<W>, first_row: u32, lane: u32) -> Self {
        // Matrices 0..3: rows 0-7 / 8-15 of columns 0-7, then of columns 8-15.
        Self { addr: tile.chunk_addr(first_row + lane % 8 + 8 * ((lane / 8) % 2), lane / 16) }
    }

    /// Columns `16 k..+16`.
    #[inline(always)]
    pub unsafe fn load(self, k: u32) -> [u32; 4] {
        arch::ldmatrix_x4(SmemTile::<W>::chunks_across(self.addr, 2 * k, true))
    }

    /// The same operand of a tile `bytes` further on (a multiple of 128,
    /// the swizzle's period: another pipeline stage's).
    #[inline(always)]
    pub fn moved(self, bytes: u32) -> Self {
        Self { addr: self.addr + bytes }
    }
}

/// A fragments of the transpose of a tile: its columns `first_col..+16` as
/// rows, 16 of its rows per k-step as columns.
#[derive(Clone, Copy)]
pub struct ColumnsAsA<const W: usize> {
    addr: u32,
}

impl<const W: usize> ColumnsAsA<W> {
    #[inline(always)]
    pub fn new(tile: SmemTile<W>, first_col: u32, lane: u32) -> Self {
        // Matrix i (A rows 8 (i % 2).., A columns 8 (i / 2)..) is the
        // transpose of the stored 8x8 at rows 8 (i / 2).., columns 8 (i % 2)...
        let i = lane / 8;
        Self { addr: tile.chunk_addr(lane % 8 + 8 * (i / 2), first_col / 8 + i % 2) }
    }

    /// Rows `16 k..+16` of the tile.
    #[inline(always)]
    pub unsafe fn load(self, k: u32) -> [u32; 4] {
        arch::ldmatrix_x4_trans(self.addr + 16 * k * SmemTile::<W>::ROW_BYTES)
    }
}

/// B fragments for a product with the rows of a tile (`Q K^T`, `dO V^T`):
/// `B[k][n] = tile[first_row + n][k]`.
#[derive(Clone, Copy)]
pub struct RowsAsB<const W: usize> {
    addr: u32,
}

impl<const W: usize> RowsAsB<W> {
    #[inline(always)]
    pub fn new(tile: SmemTile<W>, first_row: u32, lane: u32) -> Self {
        // Matrices 0..3: rows 0-7 of columns 0-7 / 8-15, then rows 8-15 likewise.
        Self { addr: tile.chunk_addr(first_row + lane % 8 + 8 * (lane / 16), (lane / 8) % 2) }
    }

    /// The n-tiles `2 pair` and `2 pair + 1` (rows `16 pair..+16`) at
    /// columns `16 k..+16`.
    #[inline(always)]
    pub unsafe fn load(self, pair: u32, k: u32) -> [u32; 4] {
        let addr = SmemTile::<W>::chunks_across(self.addr, 2 * k, true);
        arch::ldmatrix_x4(addr + 16 * pair * SmemTile::<W>::ROW_BYTES)
    }
}

/// B fragments for a product over the rows of a tile (`dS K`, `P^T dO`,
/// `dS^T Q`): `B[k][n] = tile[k][n]`, for one of `parts` interleaved parts
/// of the tile's columns: part `part` has the 16-column slices `part`,
/// `part + parts`, ... Each slice is then a constant chunk offset from the
/// lane's address, which the XOR of [`SmemTile::chunks_across`] reaches
/// (`2 parts` a power of two): contiguous parts would start at chunk
/// `part * (W / 8 / parts)`, not a multiple of 8 at W = 160, 192 or 224,
/// and each slice's swizzled offset would be one more register.
#[derive(Clone, Copy)]
pub struct ColumnsAsB<const W: usize> {
    addr: u32,
    parts: u32,
}

impl<const W: usize> ColumnsAsB<W> {
    #[inline(always)]
    pub fn new(tile: SmemTile<W>, part: u32, parts: u32, lane: u32) -> Self {
        // Transposed matrices 0..3: rows 0-7 / 8-15 of columns 0-7, then of
        // columns 8-15.
        Self { addr: tile.chunk_addr(lane % 8 + 8 * ((lane / 8) % 2), 2 * part + lane / 16), parts }
    }

    /// The n-tiles of the part's 16-column slice `slice`, rows `16 k..+16`.
    #[inline(always)]
    pub unsafe fn load(self, k: u32, slice: u32) -> [u32; 4] {
        let addr = SmemTile::<W>::chunks_across(self.addr, 2 * self.parts * slice, true);
        arch::ldmatrix_x4_trans(addr + 16 * k * SmemTile::<W>::ROW_BYTES)
    }

    /// The same operand of a tile `bytes` further on (a multiple of 128,
    /// the swizzle's period: another pipeline stage's).
    #[inline(always)]
    pub fn moved(self, bytes: u32) -> Self {
        Self { addr: self.addr + bytes, ..self }
    }
}

/// Where a lane's values of C fragments go in a tile (P and dS): rows
/// `first_row + lane / 4` and 8 below, columns `first_col + 2 (lane % 4)`
/// and the next of each 8-column tile.
#[derive(Clone, Copy)]
pub struct FragmentsInTile<const W: usize> {
    addr: u32,
}

impl<const W: usize> FragmentsInTile<W> {
    /// `first_col` is a multiple of 8 with no bit in common with the
    /// fragments' tile numbers (it starts a power-of-two aligned part).
    #[inline(always)]
    pub fn new(tile: SmemTile<W>, first_row: u32, first_col: u32, lane: u32) -> Self {
        Self { addr: tile.pair_addr(first_row + lane / 4, first_col + 2 * (lane % 4)) }
    }

    /// The 4-byte word of the lane's pair in row half `half` (0 or 1) of
    /// 8-column tile `n`.
    #[inline(always)]
    pub fn pair_addr(self, half: u32, n: u32) -> u32 {
        SmemTile::<W>::chunks_across(self.addr, n, true) + 8 * half * SmemTile::<W>::ROW_BYTES
    }
}

/// `c = a b^T` for `a`'s 16 rows and `b`'s `8 TILES` rows over all `K16 *
/// 16` columns of both (`Q K^T`, `dO V^T`): `TILES` C fragments, in the
/// one-m-tile shape the mask and modifiers take.
#[inline(always)]
pub unsafe fn rows_times_rows<E: Element, const TILES: usize, const K16: usize, const W: usize>(
    a: RowsAsA<W>,
    b: RowsAsB<W>,
) -> [[[f32; 4]; TILES]; 1] {
    const { assert!(TILES.is_multiple_of(2) && K16 * 16 == W) }
    let mut c = [[[0f32; 4]; TILES]; 1];
    for k in 0..K16 as u32 {
        let a = a.load(k);
        for pair in 0..TILES / 2 {
            let b = b.load(pair as u32, k);
            E::mma(&mut c[0][2 * pair], &a, &[b[0], b[1]]);
            E::mma(&mut c[0][2 * pair + 1], &a, &[b[2], b[3]]);
        }
    }
    c
}

/// `c += a b` over `K16 * 16` rows of `b`, its part's 16-column slices
/// `first_slice..+TILES / 2`, with the A fragment of k-step `k` from `a(k)`.
#[inline(always)]
pub unsafe fn accumulate_over_rows<E: Element, const TILES: usize, const K16: usize, const W: usize>(
    c: &mut [[f32; 4]; TILES],
    a: impl Fn(u32) -> [u32; 4],
    b: ColumnsAsB<W>,
    first_slice: u32,
) {
    const { assert!(TILES.is_multiple_of(2)) }
    for k in 0..K16 as u32 {
        let a = a(k);
        for pair in 0..TILES / 2 {
            let b = b.load(k, first_slice + pair as u32);
            E::mma(&mut c[2 * pair], &a, &[b[0], b[1]]);
            E::mma(&mut c[2 * pair + 1], &a, &[b[2], b[3]]);
        }
    }
}

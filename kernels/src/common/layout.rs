//! Shared-memory tiles and their XOR swizzle.
//!
//! A tile holds `rows x HEAD_DIM` 16-bit elements, one row after another,
//! each row `HEAD_DIM / 8` chunks of 16 bytes, padded to a multiple of 128
//! bytes ([`smem_row_bytes`]). So the same chunk of eight consecutive rows
//! would fall in the same four banks; storing logical chunk `c` of row `r`
//! at physical chunk `c ^ (r % 8)` (which stays inside the padded row)
//! spreads those eight chunks over all 32 banks. Both the
//! `cp.async` writes (a row's chunks side by side) and the `ldmatrix` reads
//! (one chunk of eight rows) are then free of bank conflicts.

use crate::arch;
use crate::config::smem_row_bytes;

/// A swizzled `[rows, HEAD_DIM]` tile at a shared-window address.
#[derive(Clone, Copy)]
pub struct SmemTile<const HEAD_DIM: usize> {
    base: u32,
}

impl<const HEAD_DIM: usize> SmemTile<HEAD_DIM> {
    /// Bytes from one row to the next, padding included.
    pub const ROW_BYTES: u32 = smem_row_bytes(HEAD_DIM as u32);
    /// 16-byte chunks of data in one row.
    pub const CHUNKS_PER_ROW: u32 = (HEAD_DIM / 8) as u32;

    /// The tile at `base`, which must be 128-byte aligned.
    #[inline(always)]
    pub fn at(base: u32) -> Self {
        const {
            assert!(HEAD_DIM % 32 == 0, "rows are whole 16-element k-steps of whole chunk pairs");
        }
        Self { base }
    }

    /// Address of the tile `rows` rows further on.
    #[inline(always)]
    pub fn after_rows(self, rows: u32) -> u32 {
        self.base + rows * Self::ROW_BYTES
    }

    /// Address of logical 16-byte chunk `chunk` of row `row`.
    #[inline(always)]
    pub fn chunk_addr(self, row: u32, chunk: u32) -> u32 {
        // The same address as `(chunk ^ (row % 8)) << 4`, written so that
        // the chunk's high bits, a compile-time constant at every call, fold
        // into the instruction's immediate offset: each lane then keeps 4
        // swizzled offsets live per operand instead of one per chunk.
        self.base + row * Self::ROW_BYTES + ((chunk & !7) << 4) + (((chunk % 8) ^ (row % 8)) << 4)
    }

    /// `chunk_addr(row + k, chunk)` from `addr = chunk_addr(row, chunk)`, for
    /// `row & k == 0`, so that `(row + k) % 8 = row % 8 ^ k % 8`. With `k` a
    /// compile-time constant, a thread walking down a chunk column keeps one
    /// address live instead of one per row (LLVM merges each row's offset
    /// and swizzle into one constant and hoists their sums out of the key
    /// loop).
    #[inline(always)]
    pub fn rows_below(addr: u32, k: u32) -> u32 {
        (addr ^ ((k % 8) << 4)) + k * Self::ROW_BYTES
    }

    /// `chunk_addr(row, chunk + chunks)` from `addr = chunk_addr(row, chunk)`,
    /// for `chunk < 8` with no bit in common with `chunks % 8`, so that
    /// `(chunk + chunks) % 8 = chunk ^ chunks % 8`: the swizzle moves by an
    /// XOR of the address's chunk bits, which the 128-byte aligned row
    /// leaves to it, and the high chunks fold into the instruction's
    /// immediate offset.
    ///
    /// With `in_place` (a constant at every call) the XOR stays at each use
    /// ([`arch::xor_in_place`]): a lane walking the chunks of a row in a
    /// loop then keeps one address live instead of the four (one per
    /// `chunks % 8`) that LLVM would otherwise hoist, at one instruction per
    /// use.
    #[inline(always)]
    pub fn chunks_across(addr: u32, chunks: u32, in_place: bool) -> u32 {
        let swizzle = (chunks % 8) << 4;
        let swizzled = if swizzle == 0 {
            addr
        } else if in_place {
            arch::xor_in_place(addr, swizzle)
        } else {
            addr ^ swizzle
        };
        swizzled + ((chunks & !7) << 4)
    }

    /// Address of the 4-byte word holding elements `col` and `col + 1` of `row`
    /// (`col` even).
    #[inline(always)]
    pub fn pair_addr(self, row: u32, col: u32) -> u32 {
        self.chunk_addr(row, col / 8) + (col % 8) * 2
    }
}

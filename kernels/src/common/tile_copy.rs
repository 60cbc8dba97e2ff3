//! Moving tiles between global and shared memory: asynchronous 16-byte
//! `cp.async` loads into swizzled tiles, and coalesced 16-byte stores out.

use crate::arch;
use crate::common::layout::SmemTile;

/// `cp.async.wait_group pending`, for a `pending` that is a constant after
/// inlining (the instruction takes an immediate). Counts above 6 wait for
/// every group, which is slower but never early.
#[inline(always)]
pub fn cp_async_wait_pending(pending: usize) {
    match pending {
        0 => arch::cp_async_wait::<0>(),
        1 => arch::cp_async_wait::<1>(),
        2 => arch::cp_async_wait::<2>(),
        3 => arch::cp_async_wait::<3>(),
        4 => arch::cp_async_wait::<4>(),
        5 => arch::cp_async_wait::<5>(),
        6 => arch::cp_async_wait::<6>(),
        _ => arch::cp_async_wait::<0>(),
    }
}

/// Issues the copies of a `[rows, HEAD_DIM]` tile whose first row is at
/// `src` (rows `row_stride` elements apart) into `tile`. Rows at or past
/// `valid_rows` are zero-filled without reading global memory. The caller
/// commits the group.
///
/// `rows` and `threads` (the block's) are compile-time constants at every
/// call. Row offsets are computed in u32: 64-bit ones, one per pass, are
/// hoisted out of the key loop at two registers each.
///
/// `bound_by_rows_left` (a constant at every call) chooses how a thread's
/// rows are checked against `valid_rows`: by its rows left to the end,
/// compared with each pass's constant row offset (one register live through
/// the key loop), or by each pass's row (LLVM hoists one register per
/// pass). The dense causal kernels take the first, with the mask of
/// `ScoreMask::apply_causal`: together they were measured faster at
/// d=32-128 (docs/tuning.md, d=128); in the other kernels ptxas allocates
/// registers better the second way.
///
/// # Safety
/// `src` row `r` must be readable for `r < valid_rows`; `valid_rows >= 1`;
/// `row_stride <= `[`MAX_ROW_STRIDE`](crate::config::MAX_ROW_STRIDE) and
/// `rows <= `[`MAX_TILE_ROWS`](crate::config::MAX_TILE_ROWS), so that no
/// offset overflows.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn load_tile_async<const HEAD_DIM: usize>(
    tile: SmemTile<HEAD_DIM>,
    rows: u32,
    src: *const u16,
    row_stride: u32,
    valid_rows: u32,
    tid: u32,
    threads: u32,
    bound_by_rows_left: bool,
) {
    let chunks_per_row = SmemTile::<HEAD_DIM>::CHUNKS_PER_ROW;
    let copy_if = |in_bounds: bool, to: u32, from: *const u16| {
        let from = if in_bounds { from } else { src };
        arch::cp_async_16(to, from as *const u8, if in_bounds { 16 } else { 0 });
    };
    let copy = |row: u32, to: u32, from: *const u16| copy_if(row < valid_rows, to, from);
    // Each pass of the block covers `rows_per_pass` whole rows. One warp
    // does so over rows of 12, 20, 24 or 28 chunks too, its lanes past those
    // rows idle: partial passes would each hold a row offset for the whole
    // key loop, 28 of them at d = 224.
    let rows_per_pass = threads / chunks_per_row;
    let one_warp_rows = threads == 32 && !threads.is_multiple_of(chunks_per_row);
    if !(threads.is_multiple_of(chunks_per_row) || one_warp_rows) || !rows.is_multiple_of(rows_per_pass) {
        // Blocks of several warps over rows of 12, 20, 24 or 28 chunks, or
        // a tile that is not a whole number of passes: pass p copies the
        // block's chunks p * threads .. (p + 1) * threads in row-major
        // order; the last pass may be partial.
        let chunks = rows * chunks_per_row;
        for pass in 0..chunks.div_ceil(threads) {
            let i = pass * threads + tid;
            if i < chunks {
                let (row, chunk) = (i / chunks_per_row, i % chunks_per_row);
                copy(row, tile.chunk_addr(row, chunk), src.wrapping_add((row * row_stride + chunk * 8) as usize));
            }
        }
        return;
    }
    if one_warp_rows && tid >= rows_per_pass * chunks_per_row {
        return;
    }
    // A thread keeps its chunk column and walks down the rows from
    // `first_row < rows_per_pass`, a power of two (32 / 12 = 2, 32 / 20..28
    // = 1, the others divide), so that `first_row & below == 0`.
    let first_row = tid / chunks_per_row;
    let chunk = tid % chunks_per_row;
    let first_addr = tile.chunk_addr(first_row, chunk);
    let mut row_ptr = src.wrapping_add((first_row * row_stride + chunk * 8) as usize);
    let pass_stride = (rows_per_pass * row_stride) as usize;
    // Rows from this thread's first to the tile's valid end (may be <= 0).
    let rows_left = valid_rows as i32 - first_row as i32;
    for pass in 0..rows / rows_per_pass {
        let below = pass * rows_per_pass;
        // One warp walks 16-64 rows: each row's `chunk_addr` would be hoisted
        // out of the key loop, one register per row; a running address
        // takes one. Wider blocks keep `chunk_addr`, which ptxas allocates
        // better there (the running address spills d = 64's general kernel).
        let to = if one_warp_rows {
            SmemTile::<HEAD_DIM>::rows_below(first_addr, below)
        } else {
            tile.chunk_addr(first_row + below, chunk)
        };
        if bound_by_rows_left {
            copy_if((below as i32) < rows_left, to, row_ptr);
        } else {
            copy(first_row + below, to, row_ptr);
        }
        row_ptr = row_ptr.wrapping_add(pass_stride);
    }
}

/// Stores the warp's `16 * M_TILES` rows of `tile` to `dst` (rows `row_stride`
/// elements apart), skipping rows at or past `valid_rows`. Lanes take
/// consecutive chunks of a row, so each store instruction writes whole rows.
/// Row offsets are computed in u32, as in [`load_tile_async`].
///
/// # Safety
/// `dst` row `r` must be writable for `r < valid_rows`;
/// `row_stride <= `[`MAX_ROW_STRIDE`](crate::config::MAX_ROW_STRIDE).
#[inline(always)]
pub unsafe fn store_rows_from_smem<const M_TILES: usize, const HEAD_DIM: usize>(
    tile: SmemTile<HEAD_DIM>,
    first_row: u32,
    dst: *mut u16,
    row_stride: u32,
    valid_rows: u32,
    lane: u32,
) {
    let chunks_per_row = SmemTile::<HEAD_DIM>::CHUNKS_PER_ROW;
    const {
        assert!((16 * M_TILES * HEAD_DIM / 8) % 32 == 0);
    }
    let store = |row: u32, chunk: u32| {
        if row < valid_rows {
            let value = arch::ld_shared_v4(tile.chunk_addr(first_row + row, chunk));
            let to = dst.add((row * row_stride + chunk * 8) as usize);
            arch::st_global_v4(to as *mut u8, value);
        }
    };
    let passes = (16 * M_TILES * HEAD_DIM / 8) / 32;
    if !32u32.is_multiple_of(chunks_per_row) {
        // Rows of 12, 20, 24 or 28 chunks: pass p stores the warp's chunks
        // 32p .. 32p + 31 in row-major order.
        for pass in 0..passes as u32 {
            let i = pass * 32 + lane;
            store(i / chunks_per_row, i % chunks_per_row);
        }
        return;
    }
    let rows_per_pass = 32 / chunks_per_row;
    let chunk = lane % chunks_per_row;
    let mut row = lane / chunks_per_row;
    for _ in 0..passes {
        store(row, chunk);
        row += rows_per_pass;
    }
}

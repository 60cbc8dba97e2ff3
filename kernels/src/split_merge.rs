//! The end of a split-KV block (`num_splits > 1`): once its partial output
//! is written, each block counts itself in, and the last block of its
//! (batch, head, query block) to do so merges every split's partial rows
//! into o and lse, `O = sum_s exp(lse_s - lse) O_s` with
//! `lse = log sum_s exp(lse_s)`: a split call is one launch.
//!
//! Counting in: a barrier orders every thread's partial stores before
//! thread 0's `fence.acq_rel.gpu`, which releases them (the fence is
//! cumulative over what the barrier ordered); thread 0 then increments the
//! counter of the (batch, head, query block) with `atom.inc` and the limit
//! `num_splits - 1`, which wraps the last increment to 0. The block that
//! reads `num_splits - 1` is the last one, and the counter is zero again
//! for the next call on the stream, whose kernels run after this one. The
//! last block's second fence acquires the other blocks' partials, and a
//! barrier tells its threads. No block waits for another, so none needs
//! another to be resident.
//!
//! The merging block reads `num_splits * rows * head_dim` f32, from L2, on
//! one SM: it keeps many bytes in flight with every thread.
//! 1. Row totals: `threads / block_m` lanes per row load the LSEs of every
//!    such split, [`LSE_BATCH`] loads at once, and reduce their max and sum
//!    with shuffles; the row's first lane writes the row's lse, and its
//!    total `log2 sum_s 2^(lse_s log2 e)` to shared memory.
//! 2. The weighted sum: items of 8 columns of one row from one split,
//!    chunk-major within each thread, the chunks spread over the threads
//!    (a warp's lanes read 32 neighbouring chunks of one split). `cp.async`
//!    copies each item's 32 bytes of O and the 16-byte tail of its partial
//!    row (the LSE) to shared memory, [`stage_items`] items per thread into
//!    each of two stages: one stage lands while the thread adds up the
//!    other. A thread reads only what its own copies wrote, so program
//!    order, not barriers, orders the stages. After a chunk's last split
//!    the thread stores its 8 columns of O, 16 bytes.
//!
//! A row no split saw a key of (every LSE -inf) gets O = 0 and lse = -inf.
//! Splits are added in index order, so the result does not depend on which
//! block merges.

use crate::arch;
use crate::element::Element;
use crate::params::partial_row_floats;

/// Columns of O in one item: two 16-byte copies in, one 16-byte store out.
const CHUNK_COLUMNS: u32 = 8;
/// 16-byte pieces of one item in shared memory: two of O, the row's tail.
const ITEM_PIECES: u32 = 3;
/// LSEs a lane loads at once for its row's total.
const LSE_BATCH: usize = 8;
/// The most items per thread in a stage (unrolled).
const MAX_STAGE_ITEMS: u32 = 8;

/// Shared-memory bytes before the stages: each row's total (f32), then
/// the word saying the block merges, padded to 16 bytes.
const fn header_bytes(block_m: u32) -> u32 {
    4 * block_m + 16
}

/// Items per thread in each of the two stages that fit a block's
/// `smem_bytes` of shared memory. Evaluated at compile time, it fails
/// where the merge does not fit the block: no item fits, or the rows do
/// not split into groups of lanes of one warp.
pub const fn stage_items(smem_bytes: u32, block_m: u32, threads: u32) -> u32 {
    let group = threads / block_m;
    assert!(group * block_m == threads && group.is_power_of_two() && group <= 32, "rows in lane groups of one warp");
    let items = (smem_bytes - header_bytes(block_m)) / (2 * ITEM_PIECES * 16 * threads);
    assert!(items >= 1, "the split-KV merge needs shared memory for one item per thread in each of two stages");
    if items < MAX_STAGE_ITEMS {
        items
    } else {
        MAX_STAGE_ITEMS
    }
}

/// What the merge needs of a block of query rows.
pub struct SplitBlock {
    /// Split 0's partial row of the block's first row; split `s`'s row `r`
    /// lies `s * split_rows + r` partial rows after it.
    pub partials: *const f32,
    /// Partial rows per split.
    pub split_rows: u32,
    /// The counter of the block's (batch, head, query block).
    pub counter: *mut u32,
    /// The block's first row of o, and the row stride (elements).
    pub o: *mut u16,
    pub o_row_stride: u32,
    /// The block's first LSE; its rows' LSEs follow.
    pub lse: *mut f32,
    /// Rows of the block that exist.
    pub rows: u32,
}

/// Counts this block in and, if it is the last of its splits, merges them
/// (module docs). Every thread of the block calls it, after its partial
/// stores; `stage_items` is [`stage_items`] of the block's shared memory.
///
/// # Safety
/// The block's shared memory is free (every warp is past its key loop and
/// the shared-memory reads of its end); `block` describes the partial rows
/// of `num_splits > 1` splits, 16-byte aligned, and writable outputs; the
/// counter is shared only by this launch's blocks of the same rows.
#[inline(always)]
pub unsafe fn count_in_and_merge_if_last<E: Element, const HEAD_DIM: usize>(
    block: &SplitBlock,
    num_splits: u32,
    block_m: u32,
    stage_items: u32,
    tid: u32,
    threads: u32,
) {
    let smem = arch::dynamic_smem_base();
    let totals = smem;
    let merges = smem + 4 * block_m;
    let staging = smem + header_bytes(block_m);
    let row_floats = partial_row_floats(HEAD_DIM as u32) as usize;
    let partial_row = |split: u32, row: u32| block.partials.add((split * block.split_rows + row) as usize * row_floats);

    // Count in. Nothing of the key loop still lands in shared memory.
    arch::cp_async_wait::<0>();
    arch::sync_threads();
    if tid == 0 {
        arch::fence_acq_rel_gpu();
        let done_before = arch::atom_inc_relaxed_gpu(block.counter, num_splits - 1);
        let last = done_before == num_splits - 1;
        if last {
            arch::fence_acq_rel_gpu();
        }
        arch::st_shared_u32(merges, last as u32);
    }
    arch::sync_threads();
    if arch::ld_shared_u32(merges) == 0 {
        return;
    }

    // 1. Row totals, by `group` neighbouring lanes per row.
    let log2e = core::f32::consts::LOG2_E;
    let group = threads / block_m;
    let (row, member) = (tid / group, tid % group);
    let mut max = f32::NEG_INFINITY;
    let mut sum = 0.0;
    if row < block.rows {
        let mut first = member;
        while first < num_splits {
            let mut lse = [f32::NEG_INFINITY; LSE_BATCH];
            for (i, lse) in lse.iter_mut().enumerate() {
                let split = first + i as u32 * group;
                if split < num_splits {
                    *lse = arch::ld_global_f32(partial_row(split, row).add(HEAD_DIM));
                }
            }
            // Online over the batches: rebase the sum to the new max (2^-inf = 0).
            let new_max = lse.iter().fold(max, |m, &l| m.max(l));
            let shift = if new_max == f32::NEG_INFINITY { 0.0 } else { new_max * log2e };
            sum *= arch::exp2(arch::fma(max, log2e, -shift));
            for &lse in &lse {
                sum += arch::exp2(arch::fma(lse, log2e, -shift));
            }
            max = new_max;
            first += group * LSE_BATCH as u32;
        }
    }
    let mut row_max = max;
    let mut mask = 1;
    while mask < group {
        row_max = row_max.max(arch::shfl_xor_f32(row_max, mask));
        mask *= 2;
    }
    let shift = if row_max == f32::NEG_INFINITY { 0.0 } else { row_max * log2e };
    sum *= arch::exp2(arch::fma(max, log2e, -shift));
    mask = 1;
    while mask < group {
        sum += arch::shfl_xor_f32(sum, mask);
        mask *= 2;
    }
    if member == 0 && row < block.rows {
        // A total of +inf weighs every split 2^-inf = 0: O = 0.
        let (total, lse) = if sum > 0.0 {
            let log2_sum = arch::log2(sum);
            (arch::fma(row_max, log2e, log2_sum), row_max + log2_sum * core::f32::consts::LN_2)
        } else {
            (f32::INFINITY, f32::NEG_INFINITY)
        };
        arch::st_shared_u32(totals + 4 * row, total.to_bits());
        arch::st_global_f32(block.lse.add(row as usize), lse);
    }
    arch::sync_threads();

    // 2. The weighted sum. Piece `piece` of item `i` of stage `stage` is
    // 16 bytes per thread, the threads' side by side.
    let slices = HEAD_DIM as u32 / CHUNK_COLUMNS;
    let chunks = block.rows * slices;
    let piece_addr = |stage: u32, i: u32, piece: u32| {
        staging + (((stage * stage_items + i) * ITEM_PIECES + piece) * threads + tid) * 16
    };
    // A place in the thread's items: chunk `chunk` (columns `8 * (chunk %
    // slices)..` of row `chunk / slices`), split `split`.
    let next = |chunk: &mut u32, split: &mut u32| {
        *split += 1;
        if *split == num_splits {
            *split = 0;
            *chunk += threads;
        }
    };
    // Copies the next `stage_items` items into `stage`, one group.
    let issue = |stage: u32, chunk: &mut u32, split: &mut u32| {
        for i in 0..stage_items {
            if *chunk < chunks {
                let from = partial_row(*split, *chunk / slices);
                let o = from.add((*chunk % slices * CHUNK_COLUMNS) as usize);
                arch::cp_async_16(piece_addr(stage, i, 0), o as *const u8, 16);
                arch::cp_async_16(piece_addr(stage, i, 1), o.add(4) as *const u8, 16);
                arch::cp_async_16(piece_addr(stage, i, 2), from.add(HEAD_DIM) as *const u8, 16);
                next(chunk, split);
            }
        }
        arch::cp_async_commit();
    };
    let (mut issued_chunk, mut issued_split) = (tid, 0);
    let (mut chunk, mut split) = (tid, 0);
    let mut acc = [0.0f32; CHUNK_COLUMNS as usize];
    issue(0, &mut issued_chunk, &mut issued_split);
    let mut stage = 0;
    while chunk < chunks {
        issue(1 - stage, &mut issued_chunk, &mut issued_split);
        arch::cp_async_wait::<1>(); // `stage` has landed
        for i in 0..stage_items {
            if chunk < chunks {
                let row = chunk / slices;
                let lse = f32::from_bits(arch::ld_shared_u32(piece_addr(stage, i, 2)));
                let total = f32::from_bits(arch::ld_shared_u32(totals + 4 * row));
                let weight = arch::exp2(arch::fma(lse, log2e, -total));
                for half in 0..2 {
                    let bits = arch::ld_shared_v4(piece_addr(stage, i, half));
                    for (k, bits) in bits.iter().enumerate() {
                        let value = &mut acc[4 * half as usize + k];
                        *value = arch::fma(weight, f32::from_bits(*bits), *value);
                    }
                }
                if split == num_splits - 1 {
                    let packed: [u32; 4] = core::array::from_fn(|k| E::pack(acc[2 * k], acc[2 * k + 1]));
                    let to = block.o.add((row * block.o_row_stride + chunk % slices * CHUNK_COLUMNS) as usize);
                    arch::st_global_v4(to as *mut u8, packed);
                    acc = [0.0; CHUNK_COLUMNS as usize];
                }
                next(&mut chunk, &mut split);
            }
        }
        stage = 1 - stage;
    }
}

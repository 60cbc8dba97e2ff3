//! What one block of a forward kernel works on: its batch's sequences (fixed
//! length, packed by `cu_seqlens`, or a KV cache's `seqused_k`), where their
//! rows and key blocks live in memory (contiguous or paged), and which key
//! blocks its query rows see (causal or local windows, split-KV).
//!
//! The dense kernels (not [`ForwardKernel::GENERAL`]) read only the
//! fixed-length fields, so every feature branch here folds away for them.

use crate::arch;
use crate::forward::sm80::kernel::ForwardKernel;
use crate::params::ForwardParams;

/// One batch's sequences and where they start.
#[derive(Clone, Copy)]
pub struct Sequence {
    pub seqlen_q: u32,
    pub seqlen_k: u32,
    /// Element offsets of the batch's first row (head 0) in q and o, and of
    /// its first LSE (head 0).
    pub q_offset: i64,
    pub o_offset: i64,
    pub lse_offset: i64,
    /// Element offsets of the batch's first key in k and v (0 when paged).
    pub k_offset: i64,
    pub v_offset: i64,
    /// The batch's row of the block table, or null when not paged.
    pages: *const i32,
}

impl Sequence {
    /// The sequences of batch `batch`.
    ///
    /// # Safety
    /// The `cu_seqlens_*`, `seqused_k` and `block_table` arrays, where not
    /// null, hold at least `batch + 2`, `batch + 1` and `batch + 1` rows.
    #[inline(always)]
    pub unsafe fn of_batch<K: ForwardKernel>(p: &ForwardParams, batch: u32) -> Self {
        let b = batch as i64;
        let mut seq = Sequence {
            seqlen_q: p.seqlen_q,
            seqlen_k: p.seqlen_k,
            q_offset: b * p.q_batch_stride,
            o_offset: b * p.o_batch_stride,
            lse_offset: b * p.lse_batch_stride,
            k_offset: b * p.k_batch_stride,
            v_offset: b * p.v_batch_stride,
            pages: core::ptr::null(),
        };
        if K::GENERAL {
            if !p.cu_seqlens_q.is_null() {
                let (start, len) = packed_sequence(p.cu_seqlens_q, batch);
                seq.seqlen_q = len;
                seq.q_offset = start * p.q_row_stride;
                seq.o_offset = start * p.o_row_stride;
                seq.lse_offset += start;
            }
            if !p.cu_seqlens_k.is_null() {
                let (start, len) = packed_sequence(p.cu_seqlens_k, batch);
                seq.seqlen_k = len;
                seq.k_offset = start * p.k_row_stride;
                seq.v_offset = start * p.v_row_stride;
            }
            if !p.seqused_k.is_null() {
                seq.seqlen_k = arch::ld_global_i32(p.seqused_k.add(batch as usize)) as u32;
            }
            if !p.block_table.is_null() {
                seq.pages = p.block_table.offset((b * p.block_table_batch_stride) as isize);
                (seq.k_offset, seq.v_offset) = (0, 0);
            }
        }
        seq
    }

    /// Element offsets of key `first_key` in k and v from the batch's first
    /// key (`k_offset`, `v_offset`). `first_key` starts a key block, so that
    /// the whole block lies in one page.
    ///
    /// # Safety
    /// With a block table, its entry for `first_key` exists.
    #[inline(always)]
    pub unsafe fn key_offsets<K: ForwardKernel>(&self, p: &ForwardParams, first_key: u32) -> (i64, i64) {
        if K::GENERAL && !self.pages.is_null() {
            let (page, row) = page_slot(self.pages, first_key, p.page_size);
            (page * p.k_batch_stride + row * p.k_row_stride, page * p.v_batch_stride + row * p.v_row_stride)
        } else {
            (first_key as i64 * p.k_row_stride, first_key as i64 * p.v_row_stride)
        }
    }
}

/// The first token and the length of sequence `batch` of a packed tensor
/// with offsets `cu_seqlens`.
///
/// # Safety
/// `cu_seqlens` holds at least `batch + 2` offsets.
#[inline(always)]
pub unsafe fn packed_sequence(cu_seqlens: *const i32, batch: u32) -> (i64, u32) {
    let start = arch::ld_global_i32(cu_seqlens.add(batch as usize));
    let end = arch::ld_global_i32(cu_seqlens.add(batch as usize + 1));
    (start as i64, (end - start) as u32)
}

/// The page holding key `position` of a sequence whose block-table row is
/// `pages`, and the key's row in that page.
///
/// # Safety
/// The table row holds the entry of `position`; `page_size` is not 0 (the
/// host requires a multiple of [`crate::config::PAGE_MULTIPLE`]).
#[inline(always)]
pub unsafe fn page_slot(pages: *const i32, position: u32, page_size: u32) -> (i64, i64) {
    core::hint::assert_unchecked(page_size != 0);
    let page = arch::ld_global_i32(pages.add((position / page_size) as usize)) as i64;
    (page, (position % page_size) as i64)
}

/// Which keys each query row sees: key `j` from row `i` when
/// `i + diagonal - left <= j <= i + diagonal + right` and `j < seqlen_k`,
/// with `diagonal = seqlen_k - seqlen_q` (bottom-right alignment) and a
/// negative bound meaning that side is unbounded. Causal is `right = 0`.
#[derive(Clone, Copy)]
pub struct Visibility {
    pub seqlen_k: i32,
    pub diagonal: i32,
    pub left: i32,
    pub right: i32,
}

impl Visibility {
    /// The visibility of `seq` in a kernel instance: dense kernels fix the
    /// window at compile time (causal or none), general ones read it.
    #[inline(always)]
    pub fn of<K: ForwardKernel>(p: &ForwardParams, seq: &Sequence) -> Self {
        let (left, right) =
            if K::GENERAL { (p.window_left, p.window_right) } else { (-1, if K::CAUSAL { 0 } else { -1 }) };
        Visibility { seqlen_k: seq.seqlen_k as i32, diagonal: seq.seqlen_k as i32 - seq.seqlen_q as i32, left, right }
    }

    /// The keys `[begin, end)` that row `row` sees (empty when `end <= begin`).
    #[inline(always)]
    pub fn keys_of_row(&self, row: i32) -> (i32, i32) {
        let aligned = row + self.diagonal;
        let end = if self.right >= 0 {
            self.seqlen_k.min(aligned.saturating_add(self.right).saturating_add(1))
        } else {
            self.seqlen_k
        };
        let begin = if self.left >= 0 { aligned.saturating_sub(self.left).max(0) } else { 0 };
        (begin, end)
    }

    /// The key blocks `[begin, end)` that rows `first_row..=last_row` see.
    #[inline(always)]
    pub fn key_blocks(&self, first_row: u32, last_row: u32, block_n: u32) -> (u32, u32) {
        let (begin, _) = self.keys_of_row(first_row as i32);
        let (_, end) = self.keys_of_row(last_row as i32);
        if end <= begin {
            (0, 0)
        } else {
            (begin as u32 / block_n, (end as u32).div_ceil(block_n))
        }
    }

    /// The rows `[begin, end)` of `seqlen_q` that see some key of
    /// `first_key..=last_key` (the backward kernels' query steps of a key
    /// block): row `i` sees one when `i + diagonal + right >= first_key`
    /// and `i + diagonal - left <= last_key`.
    #[inline(always)]
    pub fn rows_seeing_keys(&self, first_key: u32, last_key: u32, seqlen_q: u32) -> (u32, u32) {
        let begin = if self.right >= 0 { first_key as i64 - self.diagonal as i64 - self.right as i64 } else { 0 };
        let end = if self.left >= 0 {
            last_key as i64 - self.diagonal as i64 + self.left as i64 + 1
        } else {
            seqlen_q as i64
        };
        let (begin, end) = (begin.clamp(0, seqlen_q as i64) as u32, end.clamp(0, seqlen_q as i64) as u32);
        (begin, end.max(begin))
    }

    /// The first key block whose scores `first_row` and later rows do not
    /// all see: every later block needs the mask too. Earlier blocks need
    /// none where there is no left window (the dense kernels).
    #[inline(always)]
    pub fn first_block_past_row_end(&self, first_row: u32, block_n: u32) -> u32 {
        let (_, first_end) = self.keys_of_row(first_row as i32);
        first_end.max(0) as u32 / block_n
    }

    /// Whether some score of rows `first_row..=last_row` in the key block
    /// `first_key..first_key + block_n` is masked.
    #[inline(always)]
    pub fn block_needs_mask(&self, first_row: u32, last_row: u32, first_key: u32, block_n: u32) -> bool {
        // Rows see ever later keys: the first row ends earliest (never past
        // seqlen_k), the last row begins latest.
        let (_, first_end) = self.keys_of_row(first_row as i32);
        let (last_begin, _) = self.keys_of_row(last_row as i32);
        (first_key + block_n) as i32 > first_end || (first_key as i32) < last_begin
    }
}

/// The part `split` of `num_splits` of the key blocks `[begin, end)`:
/// consecutive, equal-sized up to the last.
#[inline(always)]
pub fn split_key_blocks(begin: u32, end: u32, split: u32, num_splits: u32) -> (u32, u32) {
    let per_split = (end - begin).div_ceil(num_splits);
    let first = end.min(begin + split * per_split);
    (first, end.min(first + per_split))
}

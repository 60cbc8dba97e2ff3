//! KV cache calls: attention over each batch's cached keys and values,
//! dense or paged, optionally after appending new ones in place.

use flash_attn_abi::config::PAGE_MULTIPLE;
use flash_attn_abi::kernels::Dtype;
use flash_attn_abi::params::AppendParams;

use super::{
    bytes, call, check_aliasing, check_distinct_elements, check_outputs, check_problem, check_row_stride, check_tensor,
    tensor_at, tensor_bytes, too_large, AttentionParams, Checked, OutputBuffers, Placed,
};
use crate::call::{Append, CacheLengths, Call, LseLayout, Pages, Problem, Sequences};
use crate::error::{Error, Result};
use crate::limits::MAX_SEQLEN;

/// A block table as validation sees it.
#[derive(Clone, Copy, Debug)]
pub struct TableArg<'a> {
    pub entries: &'a [i32],
    pub pages_per_seq: usize,
    pub addr: u64,
}

/// A KV cache as validation sees it.
#[derive(Clone, Copy, Debug)]
pub struct CacheArgs<'a> {
    pub k: Placed,
    pub v: Placed,
    /// `k_new`, `v_new` to append.
    pub new: Option<(Placed, Placed)>,
    pub seqlens: &'a [i32],
    pub seqlens_addr: u64,
    pub block_table: Option<TableArg<'a>>,
}

/// Checks cached sequence lengths: at least one batch, none negative.
pub fn check_cache_seqlens(seqlens: &[i32]) -> Result<()> {
    if seqlens.is_empty() {
        return Err(Error::ShapeMismatch("cache_seqlens is empty: it needs one length per batch".into()));
    }
    match seqlens.iter().position(|&n| n < 0) {
        Some(batch) => Err(Error::NegativeCacheSeqlen { batch, seqlen: seqlens[batch] }),
        None => Ok(()),
    }
}

/// Checks the shape of a block table of `len` entries, `pages_per_seq` per
/// batch, and returns its number of batches.
pub fn check_block_table_shape(len: usize, pages_per_seq: usize) -> Result<usize> {
    if pages_per_seq == 0 || len == 0 || !len.is_multiple_of(pages_per_seq) {
        return Err(Error::InvalidBlockTable(format!(
            "{len} entries are not a whole number (at least 1) of rows of {pages_per_seq} pages"
        )));
    }
    Ok(len / pages_per_seq)
}

/// The rows of one page that one entry of a block table covers in a call:
/// rows `0..read` hold keys of its batch, of which rows `written..read` are
/// appended by the call (none when `written == read`).
#[derive(Clone, Copy, Debug)]
struct PageRows {
    page: i32,
    read: usize,
    written: usize,
    /// The entry: `block_table[batch][column]`.
    batch: usize,
    column: usize,
}

/// Fails if a row that the call appends to is also read through another
/// entry of the block table: by another batch, or by the same batch at
/// another position (a page listed twice). The append runs first, so that
/// reader would see the appended key instead of its own; two appends to
/// one row are the case where both entries write.
fn check_appended_rows_unshared(mut entries: Vec<PageRows>) -> Result<()> {
    // By page, the entries that read the most rows first: the entry that
    // reads furthest beside a writer is the first or the second of its page.
    entries.sort_unstable_by_key(|e| (e.page, std::cmp::Reverse(e.read)));
    for page in entries.chunk_by(|a, b| a.page == b.page) {
        for (i, writer) in page.iter().enumerate().filter(|(_, e)| e.written < e.read) {
            let Some(reader) = page.iter().enumerate().find(|&(j, _)| j != i).map(|(_, e)| e) else { continue };
            if reader.read > writer.written {
                return Err(Error::InvalidBlockTable(format!(
                    "batch {} appends to row {} of page {} (block_table[{}][{}]), a row that block_table[{}][{}] \
                     maps to a key batch {} reads",
                    writer.batch,
                    writer.written,
                    writer.page,
                    writer.batch,
                    writer.column,
                    reader.batch,
                    reader.column,
                    reader.batch
                )));
            }
        }
    }
    Ok(())
}

/// Checks a KV cache call: `q` `[batch, seqlen_q, heads_q, d]` of element
/// type `dtype` over the cache, into `outputs` (o with q's shape, the LSE
/// `[batch, heads_q, seqlen_q]`).
pub fn validate_kvcache(
    dtype: Dtype,
    q: &Placed,
    cache: &CacheArgs,
    outputs: OutputBuffers,
    params: &AttentionParams,
) -> Result<Call> {
    let (k, v) = (&cache.k, &cache.v);
    for t in [q, k, v].into_iter().chain(cache.new.iter().flat_map(|(k_new, v_new)| [k_new, v_new])) {
        check_tensor(t)?;
    }
    // The append kernel copies k_new and v_new row by row in 64 bits.
    for t in [q, k, v] {
        check_row_stride(t)?;
    }
    let [batch, seqlen_q, heads_q, head_dim] = q.layout.shape;
    let [slots_outer, slots_inner, heads_kv, head_dim_k] = k.layout.shape;
    if v.layout.shape != k.layout.shape {
        return Err(Error::ShapeMismatch(format!(
            "k_cache is {:?} but v_cache is {:?}",
            k.layout.shape, v.layout.shape
        )));
    }
    if head_dim_k != head_dim {
        return Err(Error::ShapeMismatch(format!("q has head_dim {head_dim} but the cache {head_dim_k}")));
    }
    if cache.new.is_some() {
        check_distinct_elements(k)?;
        check_distinct_elements(v)?;
    }
    if cache.seqlens.len() != batch {
        return Err(Error::ShapeMismatch(format!(
            "cache_seqlens holds {} lengths but q has batch {batch}",
            cache.seqlens.len()
        )));
    }
    check_cache_seqlens(cache.seqlens)?;
    let seqlen_new = match &cache.new {
        None => 0,
        Some((k_new, v_new)) => {
            let seqlen_new = k_new.layout.shape[1];
            let expected = [batch, seqlen_new, heads_kv, head_dim];
            if k_new.layout.shape != expected || v_new.layout.shape != expected {
                return Err(Error::ShapeMismatch(format!(
                    "k_new is {:?} and v_new {:?}, but the cache and q need [{batch}, seqlen_new, {heads_kv}, \
                     {head_dim}]",
                    k_new.layout.shape, v_new.layout.shape
                )));
            }
            seqlen_new
        }
    };
    let (capacity, page_size) = match &cache.block_table {
        Some(table) => {
            if !slots_inner.is_multiple_of(PAGE_MULTIPLE as usize) {
                return Err(Error::InvalidPageSize { page_size: slots_inner, multiple: PAGE_MULTIPLE as usize });
            }
            let rows = check_block_table_shape(table.entries.len(), table.pages_per_seq)?;
            if rows != batch {
                return Err(Error::InvalidBlockTable(format!("{rows} rows for batch {batch}")));
            }
            (table.pages_per_seq.saturating_mul(slots_inner), slots_inner)
        }
        None => {
            if slots_outer != batch {
                return Err(Error::ShapeMismatch(format!(
                    "the cache holds {slots_outer} batches but q has {batch} (a paged cache needs a block table)"
                )));
            }
            (slots_inner, 0)
        }
    };
    let mut seqused_k = Vec::with_capacity(batch);
    for (b, &cached) in cache.seqlens.iter().enumerate() {
        let needed = cached as usize + seqlen_new;
        if needed > capacity {
            return Err(Error::CacheOverflow { batch: b, needed, capacity });
        }
        too_large("cached plus appended keys", needed, MAX_SEQLEN)?;
        seqused_k.push(needed as i32);
    }
    if let Some(table) = &cache.block_table {
        let num_pages = slots_outer;
        let mut entries = Vec::new();
        for (b, (&cached, &used)) in cache.seqlens.iter().zip(&seqused_k).enumerate() {
            let row = &table.entries[b * table.pages_per_seq..][..table.pages_per_seq];
            for (p, &page) in row.iter().enumerate().take((used as usize).div_ceil(page_size)) {
                if !(0..num_pages as i64).contains(&(page as i64)) {
                    return Err(Error::InvalidBlockTable(format!(
                        "block_table[{b}][{p}] = {page} is not a page of the cache (0..{num_pages})"
                    )));
                }
                let first = p * page_size;
                let read = (used as usize - first).min(page_size);
                let written = if cache.new.is_some() { (cached as usize).max(first) - first } else { read };
                entries.push(PageRows { page, read, written: written.min(read), batch: b, column: p });
            }
        }
        check_appended_rows_unshared(entries)?;
    }
    let seqlen_k = seqused_k.iter().copied().max().unwrap_or(0) as usize;
    let problem = Problem { batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim };
    check_problem(&problem)?;
    let metadata = [
        bytes("cache_seqlens", cache.seqlens_addr, cache.seqlens.len(), 4),
        cache.block_table.map_or(("block_table", 0..0), |t| bytes("block_table", t.addr, t.entries.len(), 4)),
    ];
    // An appended cache is written, by the append: an output.
    let mut inputs = vec![tensor_bytes(q), metadata[0].clone(), metadata[1].clone()];
    let mut cache_written = Vec::new();
    match &cache.new {
        None => inputs.extend([tensor_bytes(k), tensor_bytes(v)]),
        Some((k_new, v_new)) => {
            cache_written.extend([tensor_bytes(k), tensor_bytes(v)]);
            inputs.extend([tensor_bytes(k_new), tensor_bytes(v_new)]);
        }
    }
    check_aliasing(&cache_written, &inputs)?;
    inputs.extend(cache_written.iter().cloned());
    let lse_rows = batch.checked_mul(heads_q).and_then(|n| n.checked_mul(seqlen_q));
    let mut outputs = check_outputs(q, outputs, lse_rows, "batch * heads_q * seqlen_q", &inputs)?;
    outputs.written.extend(cache_written);
    let pages = cache.block_table.map(|table| Pages {
        table: table.addr,
        pages_per_seq: table.pages_per_seq as u32,
        page_size: page_size as u32,
    });
    let append = cache.new.map(|(k_new, v_new)| Append {
        params: AppendParams {
            k_new: k_new.addr as *const u16,
            v_new: v_new.addr as *const u16,
            k_new_strides: tensor_at(&k_new).strides,
            v_new_strides: tensor_at(&v_new).strides,
            k_cache: k.addr as *mut u16,
            v_cache: v.addr as *mut u16,
            k_cache_strides: tensor_at(k).strides,
            v_cache_strides: tensor_at(v).strides,
            cache_seqlens: cache.seqlens_addr as *const i32,
            block_table: pages.map_or(core::ptr::null(), |p| p.table as *const i32),
            block_table_batch_stride: pages.map_or(0, |p| p.pages_per_seq as i64),
            page_size: page_size as u32,
            head_dim: head_dim as u32,
        },
        grid: [seqlen_new as u32, heads_kv as u32, batch as u32],
    });
    // The attention reads each batch's keys after the append: the cached
    // lengths, or the new ones, uploaded at launch.
    let lengths =
        if cache.new.is_some() { CacheLengths::Upload(seqused_k) } else { CacheLengths::Device(cache.seqlens_addr) };
    let checked = Checked {
        dtype,
        problem,
        qkv: [q, k, v].map(tensor_at),
        outputs,
        lse: LseLayout { batch_stride: (heads_q * seqlen_q) as i64, head_stride: seqlen_q as i64 },
        sequences: Sequences::Cache { lengths, pages },
        append,
    };
    call(checked, params)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::{MAX_DIM, MAX_ROW_STRIDE};
    use crate::validate::tests_support::{contiguous_tensor, device_slice, lowered_call, set_row_stride, Lowered};
    use crate::validate::Layout;

    const MIB: u64 = 1 << 20;

    struct Call {
        q: Placed,
        k: Placed,
        v: Placed,
        new: Option<(Placed, Placed)>,
        o: Placed,
        lse_len: usize,
        seqlens: Vec<i32>,
        table: Option<(Vec<i32>, usize)>,
        params: AttentionParams<'static>,
    }

    impl Call {
        /// Batch 3, one query of 8 heads over a dense cache of 1000 slots and 2 KV heads.
        fn dense() -> Self {
            Call {
                q: contiguous_tensor("q", [3, 1, 8, 128], 0),
                k: contiguous_tensor("k_cache", [3, 1000, 2, 128], 16 * MIB),
                v: contiguous_tensor("v_cache", [3, 1000, 2, 128], 32 * MIB),
                new: None,
                o: contiguous_tensor("o", [3, 1, 8, 128], 48 * MIB),
                lse_len: 3 * 8,
                seqlens: vec![0, 999, 500],
                table: None,
                params: AttentionParams::default(),
            }
        }

        /// The same batch over 10 pages of 128 slots, 4 pages per sequence.
        fn paged() -> Self {
            Call {
                k: contiguous_tensor("k_cache", [10, 128, 2, 128], 16 * MIB),
                v: contiguous_tensor("v_cache", [10, 128, 2, 128], 32 * MIB),
                seqlens: vec![0, 300, 500],
                table: Some((vec![6, -1, -1, -1, 9, 2, 5, -1, 0, 1, 3, 4], 4)),
                ..Call::dense()
            }
        }

        /// Appends `seqlen_new` tokens.
        fn appending(mut self, seqlen_new: usize) -> Self {
            let shape = [3, seqlen_new, 2, 128];
            self.new = Some((contiguous_tensor("k_new", shape, 80 * MIB), contiguous_tensor("v_new", shape, 96 * MIB)));
            self
        }

        fn run(&self) -> Result<Lowered> {
            let cache = CacheArgs {
                k: self.k,
                v: self.v,
                new: self.new,
                seqlens: &self.seqlens,
                seqlens_addr: 128 * MIB,
                block_table: self.table.as_ref().map(|(entries, pages_per_seq)| TableArg {
                    entries,
                    pages_per_seq: *pages_per_seq,
                    addr: 129 * MIB,
                }),
            };
            let outputs = OutputBuffers::Given { o: &self.o, lse_addr: 64 * MIB, lse_len: self.lse_len };
            lowered_call(validate_kvcache(Dtype::F16, &self.q, &cache, outputs, &self.params))
        }
    }

    #[test]
    fn a_dense_cache_attends_over_the_cached_lengths() {
        let call = Call::dense().run().expect("valid call");
        assert_eq!(
            call.problem,
            Problem { batch: 3, seqlen_q: 1, seqlen_k: 999, heads_q: 8, heads_kv: 2, head_dim: 128 }
        );
        let a = call.args;
        assert_eq!(a.seqused_k as u64, 128 * MIB);
        assert!(a.block_table.is_null() && a.cu_seqlens_k.is_null());
        assert_eq!((a.k_batch_stride, a.k_row_stride, a.k_head_stride), (1000 * 2 * 128, 2 * 128, 128));
        assert!(call.append.is_none() && call.seqused_k.is_empty());
    }

    #[test]
    fn appending_uploads_the_new_lengths_and_builds_the_append() {
        let call = Call::dense().appending(1).run().expect("valid call");
        assert_eq!(call.seqused_k, vec![1, 1000, 501]);
        assert_eq!(call.problem.seqlen_k, 1000);
        assert!(call.args.seqused_k.is_null(), "set at launch, from the uploaded lengths");
        let append = call.append.unwrap();
        assert_eq!(append.1, [1, 2, 3]);
        let a = append.0;
        assert_eq!(
            (a.k_new as u64, a.v_new as u64, a.k_cache as u64, a.v_cache as u64),
            (80 * MIB, 96 * MIB, 16 * MIB, 32 * MIB)
        );
        assert_eq!(a.k_new_strides, [2 * 128, 2 * 128, 128]);
        assert_eq!(a.k_cache_strides, [1000 * 2 * 128, 2 * 128, 128]);
        assert_eq!(a.cache_seqlens as u64, 128 * MIB);
        assert!(a.block_table.is_null());
        assert_eq!((a.page_size, a.head_dim), (0, 128));
    }

    #[test]
    fn the_cache_must_hold_the_appended_keys() {
        let err = Call::dense().appending(2).run().unwrap_err();
        assert_eq!(err, Error::CacheOverflow { batch: 1, needed: 1001, capacity: 1000 });
        let mut call = Call::dense();
        call.seqlens[2] = 1001;
        assert_eq!(call.run().unwrap_err(), Error::CacheOverflow { batch: 2, needed: 1001, capacity: 1000 });
    }

    #[test]
    fn shapes_of_cache_lengths_and_new_keys_must_fit() {
        let mut call = Call::dense();
        call.seqlens.pop();
        assert!(matches!(call.run().unwrap_err(), Error::ShapeMismatch(m) if m.contains("cache_seqlens holds 2")));
        let mut call = Call::dense();
        call.k = contiguous_tensor("k_cache", [2, 1000, 2, 128], 16 * MIB);
        call.v = contiguous_tensor("v_cache", [2, 1000, 2, 128], 32 * MIB);
        assert!(matches!(call.run().unwrap_err(), Error::ShapeMismatch(m) if m.contains("block table")));
        let mut call = Call::dense().appending(1);
        call.new.as_mut().unwrap().1 = contiguous_tensor("v_new", [3, 2, 2, 128], 96 * MIB);
        assert!(matches!(call.run().unwrap_err(), Error::ShapeMismatch(m) if m.contains("v_new")));
        let mut call = Call::dense();
        call.seqlens[0] = -4;
        assert_eq!(call.run().unwrap_err(), Error::NegativeCacheSeqlen { batch: 0, seqlen: -4 });
    }

    #[test]
    fn a_paged_cache_reads_through_its_block_table() {
        let call = Call::paged().run().expect("valid call");
        let a = call.args;
        assert_eq!((a.block_table as u64, a.block_table_batch_stride, a.page_size), (129 * MIB, 4, 128));
        // The "batch" stride steps from page to page.
        assert_eq!(a.k_batch_stride, 128 * 2 * 128);
        assert_eq!(call.problem.seqlen_k, 500);
    }

    #[test]
    fn pages_must_be_multiples_of_64_slots() {
        let mut call = Call::paged();
        call.k = contiguous_tensor("k_cache", [10, 96, 2, 128], 16 * MIB);
        call.v = contiguous_tensor("v_cache", [10, 96, 2, 128], 32 * MIB);
        assert_eq!(call.run().unwrap_err(), Error::InvalidPageSize { page_size: 96, multiple: 64 });
    }

    #[test]
    fn used_pages_must_exist_and_unused_entries_are_ignored() {
        // Batch 0 (empty) reads no page, batch 1 (300 keys) 3 of its 4:
        // their -1 entries are not read.
        assert!(Call::paged().run().is_ok());
        let mut call = Call::paged();
        call.table.as_mut().unwrap().0[6] = 10;
        let err = call.run().unwrap_err();
        assert!(matches!(&err, Error::InvalidBlockTable(m) if m.contains("block_table[1][2] = 10")), "{err}");
        // Appending 1 key to each batch takes page 0 of batch 0 (6), and
        // stays in the pages batches 1 and 2 already use.
        assert!(Call::paged().appending(1).run().is_ok());
        let mut call = Call::paged().appending(1);
        call.table.as_mut().unwrap().0[0] = -1;
        let err = call.run().unwrap_err();
        assert!(matches!(&err, Error::InvalidBlockTable(m) if m.contains("block_table[0][0] = -1")), "{err}");
        // The table needs a row for every batch.
        let mut call = Call::paged();
        call.table = Some((vec![0, 1, 2, 3], 4));
        assert!(matches!(call.run().unwrap_err(), Error::InvalidBlockTable(m) if m.contains("1 rows for batch 3")));
    }

    #[test]
    fn the_capacity_of_a_paged_sequence_is_its_row_of_pages() {
        // Batch 2 holds 500 of 4 pages * 128 = 512 slots.
        assert!(Call::paged().appending(12).run().is_ok());
        let err = Call::paged().appending(13).run().unwrap_err();
        assert_eq!(err, Error::CacheOverflow { batch: 2, needed: 513, capacity: 512 });
    }

    #[test]
    fn two_batches_may_not_append_to_the_same_page_rows() {
        // Batch 0 (42 keys) and batch 1 (300 keys, page 5 holds 256..384)
        // share page 5: both append to its rows 42..46 and 44..48.
        let mut call = Call::paged().appending(4);
        call.table.as_mut().unwrap().0[0] = 5;
        call.seqlens[0] = 42;
        let err = call.run().unwrap_err();
        assert!(matches!(&err, Error::InvalidBlockTable(m) if m.contains("page 5")), "{err}");
    }

    #[test]
    fn rows_appended_to_are_read_by_no_other_entry_of_the_table() {
        // Batch 0 (empty) would append to rows 0..4 of page 5, which batch 1
        // reads as its keys 256..260: it would see batch 0's keys instead.
        let mut call = Call::paged().appending(4);
        call.table.as_mut().unwrap().0[0] = 5;
        let err = call.run().unwrap_err();
        let expected = "batch 0 appends to row 0 of page 5 (block_table[0][0]), a row that block_table[1][2] maps to \
                        a key batch 1 reads";
        assert_eq!(err, Error::InvalidBlockTable(expected.into()));
        // Batch 2 (500 keys) lists page 0 twice: appending at 500 (page 0,
        // row 116) would overwrite its own key 116.
        let mut call = Call::paged().appending(1);
        call.table.as_mut().unwrap().0[11] = 0;
        let err = call.run().unwrap_err();
        assert!(matches!(&err, Error::InvalidBlockTable(m) if m.contains("block_table[2][3]")), "{err}");
        // Pages only read may be shared, e.g. a common prefix: batch 2's
        // first page is batch 1's, and both append elsewhere.
        let mut call = Call::paged().appending(1);
        call.table.as_mut().unwrap().0[8] = 9;
        assert!(call.run().is_ok());
        // Without appends, any sharing reads only.
        let mut call = Call::paged();
        call.table.as_mut().unwrap().0[0] = 5;
        call.table.as_mut().unwrap().0[11] = 0;
        assert!(call.run().is_ok());
    }

    #[test]
    fn appending_more_keys_than_the_kernels_index_is_refused() {
        // One new key row broadcast (seqlen stride 0) as usize::MAX of them:
        // cached + appended would overflow, the append grid be 2^32 - 1 blocks.
        let mut call = Call::dense();
        call.q = contiguous_tensor("q", [1, 1, 1, 64], 0);
        call.o = contiguous_tensor("o", [1, 1, 1, 64], 48 * MIB);
        call.k = contiguous_tensor("k_cache", [1, 1000, 1, 64], 16 * MIB);
        call.v = contiguous_tensor("v_cache", [1, 1000, 1, 64], 32 * MIB);
        call.lse_len = 1;
        call.seqlens = vec![1];
        let layout = Layout::strided([1, usize::MAX, 1, 64], [64, 0, 64, 1]);
        let k_new = Placed { name: "k_new", layout, addr: 80 * MIB, buffer_len: 64 };
        call.new = Some((k_new, Placed { name: "v_new", addr: 96 * MIB, ..k_new }));
        let err = call.run().unwrap_err();
        assert_eq!(err, Error::TensorTooLarge { tensor: "k_new", shape: layout.shape, strides: layout.strides });
        // Within the index range, the cache's capacity bounds it.
        let layout = Layout::strided([1, MAX_DIM, 1, 64], [64, 0, 64, 1]);
        call.new = Some((Placed { layout, ..k_new }, Placed { name: "v_new", addr: 96 * MIB, layout, ..k_new }));
        let needed = MAX_DIM + 1;
        assert_eq!(call.run().unwrap_err(), Error::CacheOverflow { batch: 0, needed, capacity: 1000 });
    }

    #[test]
    fn a_cache_appended_to_has_distinct_rows() {
        // Batch stride 0: the three batches would append to the same rows.
        let mut call = Call::dense().appending(1);
        call.k.layout.strides[0] = 0;
        call.k.buffer_len = call.k.layout.span().unwrap();
        let err = call.run().unwrap_err();
        assert_eq!(err, Error::OverlappingOutput { tensor: "k_cache", strides: call.k.layout.strides });
        assert!(err.to_string().starts_with("k_cache: strides"), "{err}");
        // Read only, a cache may broadcast.
        call.new = None;
        assert!(call.run().is_ok());
        // Pages 0 apart: as many appends to one page.
        let mut call = Call::paged().appending(1);
        call.v.layout.strides[0] = 0;
        call.v.buffer_len = call.v.layout.span().unwrap();
        assert!(matches!(call.run().unwrap_err(), Error::OverlappingOutput { tensor: "v_cache", .. }));
    }

    #[test]
    fn rejects_alibi_slopes_over_a_cache_appended_to() {
        let over_cache = device_slice::<f32>(16 * MIB + 4096, 8);
        let mut call = Call::dense().appending(1);
        let params = AttentionParams { alibi_slopes: Some(over_cache), ..AttentionParams::default() };
        // `Call` holds 'static params: run the same call with these.
        let cache = CacheArgs {
            k: call.k,
            v: call.v,
            new: call.new,
            seqlens: &call.seqlens,
            seqlens_addr: 128 * MIB,
            block_table: None,
        };
        let outputs = OutputBuffers::Given { o: &call.o, lse_addr: 64 * MIB, lse_len: call.lse_len };
        let err = validate_kvcache(Dtype::F16, &call.q, &cache, outputs, &params).unwrap_err();
        assert_eq!(err, Error::Aliasing { output: "k_cache", other: "alibi_slopes" });
        // Only read, the cache may hold them.
        call.new = None;
        let cache = CacheArgs { new: None, ..cache };
        assert!(validate_kvcache(Dtype::F16, &call.q, &cache, outputs, &params).is_ok());
    }

    #[test]
    fn cache_rows_must_be_within_the_kernels_row_strides() {
        let past = MAX_ROW_STRIDE + 8;
        for cache in [Call::dense as fn() -> Call, Call::paged] {
            for name in ["k_cache", "v_cache"] {
                let mut call = cache();
                set_row_stride([&mut call.k, &mut call.v], name, past);
                let err = call.run().unwrap_err();
                assert_eq!(err, Error::RowStrideTooLarge { tensor: name, stride: past, max: MAX_ROW_STRIDE });
            }
        }
        // One query row per batch: its stride never multiplies a row index.
        let mut call = Call::dense();
        call.q.layout.strides[1] = past;
        call.o.layout.strides[1] = past;
        assert!(call.run().is_ok());
        let mut call = Call::dense();
        call.q = contiguous_tensor("q", [3, 2, 8, 128], 0);
        call.o = contiguous_tensor("o", [3, 2, 8, 128], 48 * MIB);
        call.lse_len = 3 * 8 * 2;
        set_row_stride([&mut call.o], "o", past);
        let err = call.run().unwrap_err();
        assert_eq!(err, Error::RowStrideTooLarge { tensor: "o", stride: past, max: MAX_ROW_STRIDE });
    }

    #[test]
    fn appending_caches_are_outputs() {
        // The new keys inside the value cache.
        let mut call = Call::dense().appending(1);
        call.new.as_mut().unwrap().0.addr = 32 * MIB;
        assert_eq!(call.run().unwrap_err(), Error::Aliasing { output: "v_cache", other: "k_new" });
        // The output over the key cache.
        let mut call = Call::dense();
        call.o.addr = 16 * MIB;
        assert_eq!(call.run().unwrap_err(), Error::Aliasing { output: "o", other: "k_cache" });
        // One cache buffer for keys and values is fine when only read.
        let mut call = Call::dense();
        call.v.addr = call.k.addr;
        assert!(call.run().is_ok());
        let err = Call { v: call.v, ..Call::dense().appending(1) }.run().unwrap_err();
        assert_eq!(err, Error::Aliasing { output: "k_cache", other: "v_cache" });
    }

    #[test]
    fn features_apply_to_cache_calls() {
        let mut call = Call::dense();
        call.params = AttentionParams { causal: true, window: (Some(128), None), softcap: Some(30.0), ..call.params };
        let a = call.run().unwrap().args;
        assert_eq!((a.window_left, a.window_right), (128, 0));
        assert!(a.softcap_scale > 0.0);
        let mut call = Call::dense();
        call.params.num_splits = Some(0);
        assert_eq!(call.run().unwrap_err(), Error::InvalidNumSplits { num_splits: 0, max: 128 });
    }

    #[test]
    fn cache_seqlens_must_be_non_negative() {
        assert!(check_cache_seqlens(&[0, 5, 7]).is_ok());
        assert_eq!(check_cache_seqlens(&[3, -1]).unwrap_err(), Error::NegativeCacheSeqlen { batch: 1, seqlen: -1 });
        assert!(matches!(check_cache_seqlens(&[]).unwrap_err(), Error::ShapeMismatch(_)));
    }

    #[test]
    fn block_tables_are_whole_rows() {
        assert_eq!(check_block_table_shape(12, 4).unwrap(), 3);
        for (len, per_seq) in [(12, 5), (0, 4), (4, 0)] {
            assert!(matches!(check_block_table_shape(len, per_seq).unwrap_err(), Error::InvalidBlockTable(_)));
        }
    }
}

//! KV caches: attention of new queries over cached keys and values, dense
//! (`[batch, capacity, heads_kv, d]`) or paged (`[num_pages, page_size,
//! heads_kv, d]` through a block table), optionally appending new keys and
//! values in place first.

use crate::context::DeviceArray;
use crate::error::Result;
use crate::tensor::{Element, Tensor, TensorMut};
use crate::validate::{check_block_table_shape, check_cache_seqlens, CacheArgs, TableArg};

/// The number of keys already in each batch's cache, validated (each >= 0)
/// and uploaded. Keeps a host copy, from which the attention calls check
/// the cache capacity and the block table.
///
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let _context = flash_attn::cust::quick_init()?;
/// let cache_seqlens = flash_attn::CacheSeqlens::new(&[1000, 17, 0, 4096])?;
/// assert_eq!(cache_seqlens.batch(), 4);
/// # Ok(()) }
/// ```
pub struct CacheSeqlens {
    host: Vec<i32>,
    device: DeviceArray<i32>,
}

impl CacheSeqlens {
    /// Checks `seqlens` (see [`check_cache_seqlens`]) and uploads them to the
    /// current context's device.
    pub fn new(seqlens: &[i32]) -> Result<Self> {
        check_cache_seqlens(seqlens)?;
        Ok(Self { host: seqlens.to_vec(), device: DeviceArray::upload(seqlens)? })
    }

    /// Number of batches.
    pub fn batch(&self) -> usize {
        self.host.len()
    }

    /// The lengths.
    pub fn as_slice(&self) -> &[i32] {
        &self.host
    }
}

/// The pages of each batch's sequence in a paged KV cache, `[batch,
/// pages_per_seq]` i32: key `j` of batch `b` is row `j % page_size` of page
/// `table[b][j / page_size]`. Entries past a sequence's last page are not
/// read (any value, e.g. -1); the attention calls check those in use against
/// the cache. Keeps a host copy.
///
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let _context = flash_attn::cust::quick_init()?;
/// // Two sequences of up to 3 pages; the second uses 2 so far.
/// let table = flash_attn::BlockTable::new(&[4, 0, 7, 2, 5, -1], 3)?;
/// assert_eq!((table.batch(), table.pages_per_seq()), (2, 3));
/// # Ok(()) }
/// ```
pub struct BlockTable {
    host: Vec<i32>,
    device: DeviceArray<i32>,
    pages_per_seq: usize,
}

impl BlockTable {
    /// Checks the shape of `entries`, `[batch, pages_per_seq]` row-major, and
    /// uploads them to the current context's device.
    pub fn new(entries: &[i32], pages_per_seq: usize) -> Result<Self> {
        check_block_table_shape(entries.len(), pages_per_seq)?;
        Ok(Self { host: entries.to_vec(), device: DeviceArray::upload(entries)?, pages_per_seq })
    }

    /// Number of batches (rows).
    pub fn batch(&self) -> usize {
        self.host.len() / self.pages_per_seq
    }

    /// Pages per sequence (columns).
    pub fn pages_per_seq(&self) -> usize {
        self.pages_per_seq
    }

    /// The entries, row-major.
    pub fn entries(&self) -> &[i32] {
        &self.host
    }
}

enum CacheTensors<'a, T: Element> {
    Read { k: Tensor<'a, T>, v: Tensor<'a, T> },
    Append { k: TensorMut<'a, T>, v: TensorMut<'a, T>, k_new: Tensor<'a, T>, v_new: Tensor<'a, T> },
}

/// A KV cache for [`FlashAttention::forward_kvcache`](crate::FlashAttention::forward_kvcache):
/// the key and value caches, the cached lengths, optionally new keys and
/// values to append first, and, if paged, the block table.
///
/// Dense caches are `[batch, capacity, heads_kv, head_dim]`; paged ones
/// `[num_pages, page_size, heads_kv, head_dim]` with `page_size` a multiple
/// of 64. Batch `b` attends over its first `cache_seqlens[b]` keys (plus the
/// appended ones); the rest of the cache is never read.
///
/// ```no_run
/// use flash_attn::{BlockTable, CacheSeqlens, KvCache, Tensor, TensorMut};
/// use flash_attn::half1::f16;
/// use flash_attn::cust::memory::DeviceBuffer;
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let _context = flash_attn::cust::quick_init()?;
/// let (num_pages, page_size, heads_kv, d) = (64, 256, 8, 128);
/// let mut k_pages = DeviceBuffer::from_slice(&vec![f16::ZERO; num_pages * page_size * heads_kv * d])?;
/// let mut v_pages = DeviceBuffer::from_slice(&vec![f16::ZERO; num_pages * page_size * heads_kv * d])?;
/// let k_new = DeviceBuffer::from_slice(&vec![f16::ONE; 2 * heads_kv * d])?;
/// let v_new = DeviceBuffer::from_slice(&vec![f16::ONE; 2 * heads_kv * d])?;
/// let lens = CacheSeqlens::new(&[300, 511])?; // before appending
/// let table = BlockTable::new(&[3, 9, -1, 12, 4, 0], 3)?;
/// let shape = [num_pages, page_size, heads_kv, d];
/// // Appends one token per batch (at 300 and 511), then attends over 301 and 512 keys.
/// let cache = KvCache::appending(
///     TensorMut::new(&mut k_pages, shape),
///     TensorMut::new(&mut v_pages, shape),
///     Tensor::new(&k_new, [2, 1, heads_kv, d]),
///     Tensor::new(&v_new, [2, 1, heads_kv, d]),
///     &lens,
/// )
/// .paged(&table);
/// # let _ = cache;
/// # Ok(()) }
/// ```
pub struct KvCache<'a, T: Element> {
    tensors: CacheTensors<'a, T>,
    cache_seqlens: &'a CacheSeqlens,
    block_table: Option<&'a BlockTable>,
}

impl<'a, T: Element> KvCache<'a, T> {
    /// A cache to attend over, unchanged.
    pub fn new(k_cache: Tensor<'a, T>, v_cache: Tensor<'a, T>, cache_seqlens: &'a CacheSeqlens) -> Self {
        Self { tensors: CacheTensors::Read { k: k_cache, v: v_cache }, cache_seqlens, block_table: None }
    }

    /// A cache to which `k_new`, `v_new` (`[batch, seqlen_new, heads_kv,
    /// head_dim]`) are appended, after each batch's `cache_seqlens[b]` keys,
    /// before the attention over all of them.
    pub fn appending(
        k_cache: TensorMut<'a, T>,
        v_cache: TensorMut<'a, T>,
        k_new: Tensor<'a, T>,
        v_new: Tensor<'a, T>,
        cache_seqlens: &'a CacheSeqlens,
    ) -> Self {
        Self {
            tensors: CacheTensors::Append { k: k_cache, v: v_cache, k_new, v_new },
            cache_seqlens,
            block_table: None,
        }
    }

    /// The caches are paged, `[num_pages, page_size, heads_kv, head_dim]`,
    /// and `block_table` locates each batch's pages.
    pub fn paged(self, block_table: &'a BlockTable) -> Self {
        Self { block_table: Some(block_table), ..self }
    }

    /// Orders the caches' memory on the call's stream.
    pub(crate) fn order<'s>(&'s mut self, order: &mut crate::stream::StreamOrder<'s>) -> Result<()> {
        match &mut self.tensors {
            CacheTensors::Read { k, v } => {
                order.read("k_cache", &k.memory)?;
                order.read("v_cache", &v.memory)
            }
            CacheTensors::Append { k, v, k_new, v_new } => {
                order.read("k_new", &k_new.memory)?;
                order.read("v_new", &v_new.memory)?;
                order.write("k_cache", &mut k.memory)?;
                order.write("v_cache", &mut v.memory)
            }
        }
    }

    pub(crate) fn args(&self) -> CacheArgs<'_> {
        let (k, v, new) = match &self.tensors {
            CacheTensors::Read { k, v } => (k.placed("k_cache"), v.placed("v_cache"), None),
            CacheTensors::Append { k, v, k_new, v_new } => {
                (k.placed("k_cache"), v.placed("v_cache"), Some((k_new.placed("k_new"), v_new.placed("v_new"))))
            }
        };
        CacheArgs {
            k,
            v,
            new,
            seqlens: &self.cache_seqlens.host,
            seqlens_addr: self.cache_seqlens.device.addr(),
            block_table: self.block_table.map(|t| TableArg {
                entries: &t.host,
                pages_per_seq: t.pages_per_seq,
                addr: t.device.addr(),
            }),
        }
    }
}

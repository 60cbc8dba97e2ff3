//! The sizes the kernels index: the bounds validation holds every call
//! to, and the head dims that have kernels.

use flash_attn_abi::config;

/// The head dims that have kernels: every multiple of 32 from 32 to 256.
pub const SUPPORTED_HEAD_DIMS: [u32; 8] = config::HEAD_DIMS;

/// Largest sequence length: the kernels' masks compute i32 positions of
/// query rows and keys up to a tile past the end of a sequence, and their
/// differences, so the lengths stay a tile below 2^31.
pub const MAX_SEQLEN: usize = (1 << 31) - config::MAX_TILE_ROWS as usize;
/// Largest dimension of any tensor: the kernels index sequences, heads and
/// pages with 32-bit integers ([`MAX_SEQLEN`], [`MAX_GRID_YZ`] and the i32
/// block table say more for each).
pub const MAX_DIM: usize = i32::MAX as usize;
/// Largest span of a view, in elements: the kernels' 64-bit offsets in
/// bytes of 16-bit elements.
pub const MAX_SPAN: usize = isize::MAX as usize / 2;
/// Largest batch and number of query heads (grid z and y).
pub const MAX_GRID_YZ: usize = 65_535;
/// Largest seqlen (row) stride, in elements, of q, k, v and o (of a page,
/// for a paged KV cache): the kernels compute row offsets within a tile in
/// 32 bits. 2^23, e.g. 32768 heads of head_dim 256 in one row.
pub const MAX_ROW_STRIDE: usize = config::MAX_ROW_STRIDE as usize;
/// The most CTAs the keys of one query block are split among (the bound
/// of [`Call::num_splits`](crate::pipeline::Call::num_splits)).
pub const MAX_SPLITS: usize = flash_attn_abi::params::MAX_SPLITS as usize;

//! A call that passed validation, in types that say what it asks for: the
//! mask and score modifiers as enums and options, where the keys come from
//! (dense, packed sequences, a KV cache), and where its outputs go. Planning
//! ([`crate::plan`]) reads it; nothing downstream re-derives intent from
//! the kernels' sentinel values.

use flash_attn_abi::kernels::Dtype;
use flash_attn_abi::params::AppendParams;

/// The sizes of a validated problem. For variable-length batches the
/// sequence lengths are the longest ones; for a KV cache `seqlen_k` is the
/// longest cached sequence (appended keys included).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Problem {
    pub batch: usize,
    pub seqlen_q: usize,
    pub seqlen_k: usize,
    pub heads_q: usize,
    pub heads_kv: usize,
    pub head_dim: usize,
}

/// A tensor as the kernels address it: its first element and its strides
/// (elements) over batch, seqlen and heads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorAt {
    pub addr: u64,
    pub strides: [i64; 3],
}

/// Which keys each query row sees (bottom-right aligned: row `i` of a
/// sequence of `sq` queries over `sk` keys sits at key `i + sk - sq`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mask {
    /// Every key.
    None,
    /// Keys up to the row's own position.
    Causal,
    /// Keys within `left` before and `right` after the row's position; a
    /// `None` side is unbounded. Causal with a left window is
    /// `Window { left: Some(l), right: Some(0) }`.
    Window { left: Option<u32>, right: Option<u32> },
}

/// ALiBi slopes: f32 in device memory, one per query head (`batch_stride`
/// 0) or per batch and query head (`batch_stride` = heads).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Alibi {
    pub addr: u64,
    pub batch_stride: i64,
}

/// The number of keys of each batch of a KV cache call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CacheLengths {
    /// The caller's `cache_seqlens`, in device memory (no append).
    Device(u64),
    /// Each batch's cached plus appended keys, uploaded to scratch memory
    /// at launch (the append runs first).
    Upload(Vec<i32>),
}

/// A paged KV cache's block table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pages {
    /// `[batch, pages_per_seq]` i32 in device memory.
    pub table: u64,
    pub pages_per_seq: u32,
    /// Keys per page.
    pub page_size: u32,
}

/// Where a call's sequences lie.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Sequences {
    /// Every batch has the problem's `seqlen_q` queries and `seqlen_k` keys.
    Dense,
    /// Sequences packed one after another, found through `batch + 1`
    /// offsets each of queries and keys (device memory, i32), in tensors of
    /// `total_q` query and `total_k` key tokens.
    Packed { cu_seqlens_q: u64, cu_seqlens_k: u64, total_q: usize, total_k: usize },
    /// A KV cache: each batch's keys are its first `lengths` slots, dense
    /// or paged.
    Cache { lengths: CacheLengths, pages: Option<Pages> },
}

/// The log-sum-exp output's layout: row `r` of batch `b`, head `h` at
/// `b * batch_stride + h * head_stride + r` (plus the sequence's first
/// token, when packed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LseLayout {
    pub batch_stride: i64,
    pub head_stride: i64,
}

/// The KV cache append that runs before the attention.
#[derive(Clone, Copy, Debug)]
pub struct Append {
    pub params: AppendParams,
    /// `(keys appended per batch, heads_kv, batch)`.
    pub grid: [u32; 3],
}

/// Where a call's outputs are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outputs {
    /// The caller's `o` (validated against the inputs) and `lse`.
    Given { o: TensorAt, lse: u64 },
    /// Buffers the call allocates once the call is planned: `o`
    /// contiguous with q's shape, `lse` contiguous in [`LseLayout`]'s order.
    Fresh,
}

/// A validated attention call: every size, address and factor is in range
/// for the kernels that plan may choose.
#[derive(Clone, Debug)]
pub struct Call {
    pub dtype: Dtype,
    pub problem: Problem,
    pub q: TensorAt,
    pub k: TensorAt,
    pub v: TensorAt,
    /// `o`'s strides (its address is in `outputs` or comes at launch).
    pub o_strides: [i64; 3],
    pub lse: LseLayout,
    pub outputs: Outputs,
    /// The softmax scale (finite and positive; folded with log2(e) finite).
    pub scale: f32,
    pub mask: Mask,
    /// The softcap (finite and positive; its folded factors finite).
    pub softcap: Option<f32>,
    pub alibi: Option<Alibi>,
    pub sequences: Sequences,
    /// The caller's split-KV factor, if any (1..=MAX_SPLITS).
    pub num_splits: Option<usize>,
    pub append: Option<Append>,
}

/// A validated backward call: the forward call whose gradients it computes
/// (its outputs given: the forward's `o` and `lse`, which the backward
/// reads), dO, and where dQ, dK and dV go.
#[derive(Clone, Debug)]
pub struct BackwardCall {
    pub forward: Call,
    /// dO, q's shape.
    pub d_o: TensorAt,
    /// dQ (q's shape), dK and dV (k's shape).
    pub d_q: TensorAt,
    pub d_k: TensorAt,
    pub d_v: TensorAt,
    /// Values of the forward's lse the call indexes (its scratch holds one
    /// delta and `head_dim` dQ accumulators for each).
    pub lse_rows: usize,
    /// dQ summed in a fixed order (`AttentionParams::deterministic`).
    pub deterministic: bool,
}

//! [candle-flash-attn](https://crates.io/crates/candle-flash-attn)'s
//! functions on flash-attn's pure-Rust kernels: same names, arguments and
//! return types, so a candle program switches by changing one dependency
//! line:
//!
//! ```toml
//! # candle-flash-attn = "0.11"
//! candle-flash-attn = { package = "flash-attn-candle", git = "<this repository's URL>" }
//! ```
//!
//! Each function is a candle custom op (`CustomOp3` over q, k and v, as
//! candle-flash-attn; [`FlashAttn`] is its public one) that runs on the
//! tensors' own CUDA device and stream: q, k and v are read in place, and the
//! output is a fresh allocation of that device. The kernels are loaded once
//! per GPU (the first call on it), into the primary context that candle uses.
//!
//! Unlike candle-flash-attn's, the ops have a backward: when q, k or v
//! track gradients (a `Var`, or computed from one), `loss.backward()` runs
//! flash-attn's backward kernels (`backward_into`, `backward_varlen_into`)
//! for the dense and variable-length functions, from the log-sum-exp their
//! forward kept. The KV-cache functions and the log-sum-exp outputs have no
//! gradient: a loss that depends on them fails in `backward()` with an error
//! that says so, rather than leaving gradients out.
//!
//! Tensors are `[batch, seqlen, heads, head_dim]` (variable lengths:
//! `[total_tokens, heads, head_dim]`), f16 or bf16, with k and v having a
//! number of heads that divides q's (GQA, MQA). Head dims are multiples of
//! 8 up to 256: the kernels exist for multiples of 32, and other head dims
//! are padded with zeros (a copy). The last dim must be contiguous; other
//! strides and the start offset that are not multiples of 8 elements are
//! copied into a contiguous tensor first.
//!
//! Beyond candle-flash-attn: [`flash_attn_with_lse`] and
//! [`flash_attn_varlen_with_lse`] return the log-sum-exp too (for merging
//! partial attentions), [`flash_attn_kvcache`] attends over a KV cache,
//! contiguous or paged, for decoding, and [`flash_attn_kvcache_append`]
//! first writes the new keys and values into it.
//!
//! Differences from candle-flash-attn: `seqlens_q` / `seqlens_k` of the
//! variable-length functions are read back to the host (flash-attn
//! validates offsets on the host), which waits for the stream; and a
//! sequence longer than its `max_seqlen_*` is an error rather than left
//! partly uncomputed.

mod checks;
mod custom_op;
mod op;
pub mod params;

use candle_core::{bail, DType, Result, Tensor, D};

/// flash-attn itself, whose `FlashAttention` [`flash_attention`] returns.
pub use ::flash_attn as flash_attn_core;
pub use checks::{kernel_head_dim, MAX_HEAD_DIM};
pub use custom_op::FlashAttn;
pub use op::{flash_attention_for, poison_outputs};
use op::{FlashAttnOp, Kind};
use params::{causal_window, translate};

/// The kernels loaded for `device`'s GPU (once per GPU), for calling
/// flash-attn's own API on candle's buffers. Fails on a CPU device.
pub fn flash_attention(device: &candle_core::Device) -> Result<std::sync::Arc<::flash_attn::FlashAttention>> {
    flash_attention_for(device.as_cuda_device()?)
}

/// A dense call's tensors, checked and laid out for the kernels, with the
/// head dim to cut the output back to.
struct Prepared {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    head_dim: usize,
}

fn prepare(q: &Tensor, k: &Tensor, v: &Tensor, head_dim: usize, alibi_slopes: Option<&Tensor>) -> Result<Prepared> {
    let padded = kernel_head_dim(head_dim)?;
    let mut on_device = vec![("q", q), ("k", k), ("v", v)];
    if let Some(a) = alibi_slopes {
        on_device.push(("alibi_slopes", a));
    }
    checks::check_cuda(&on_device)?;
    Ok(Prepared {
        q: checks::prepare("q", q, padded)?,
        k: checks::prepare("k", k, padded)?,
        v: checks::prepare("v", v, padded)?,
        head_dim,
    })
}

/// The output back at the caller's head dim (contiguous, as
/// candle-flash-attn's).
fn unpad(o: Tensor, head_dim: usize) -> Result<Tensor> {
    if o.dim(D::Minus1)? == head_dim {
        Ok(o)
    } else {
        o.narrow(D::Minus1, 0, head_dim)?.contiguous()
    }
}

#[allow(clippy::too_many_arguments)]
fn dense(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    alibi_slopes: Option<&Tensor>,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
    softcap: Option<f32>,
    with_lse: bool,
) -> Result<(Tensor, Option<Tensor>)> {
    checks::check_dtypes(q, k, v)?;
    let dims = checks::check_dense(q, k, v)?;
    if let Some(a) = alibi_slopes {
        checks::check_alibi(a, dims.batch, dims.heads_q)?;
    }
    let p = prepare(q, k, v, dims.head_dim, alibi_slopes)?;
    let op = FlashAttnOp::new(
        translate(softmax_scale, window_size_left, window_size_right, softcap, dims.seqlen_k),
        alibi_slopes.cloned(),
        Kind::Dense,
    );
    finish(op, p, with_lse)
}

/// Runs `op` on the prepared tensors: the output back at the caller's head
/// dim, and the log-sum-exp if asked for. The output has candle's backward
/// (the op's); the log-sum-exp has none (a loss that depends on it fails in
/// the backward).
fn finish(op: FlashAttnOp, p: Prepared, with_lse: bool) -> Result<(Tensor, Option<Tensor>)> {
    let kept = op.lse.clone();
    let o = p.q.apply_op3(&p.k, &p.v, op)?;
    let lse = match with_lse {
        false => None,
        true => {
            let lse = kept.lock().unwrap_or_else(|e| e.into_inner()).clone();
            let lse =
                lse.ok_or_else(|| candle_core::Error::Msg("flash-attn-candle: the forward kept no LSE".into()))?;
            Some(op::without_gradient(lse, &[&p.q, &p.k, &p.v], "the log-sum-exp")?)
        }
    };
    Ok((unpad(o, p.head_dim)?, lse))
}

/// Reads cumulative offsets (u32 or i32, rank 1) back to the host.
fn host_offsets(name: &str, t: &Tensor) -> Result<Vec<u32>> {
    if t.rank() != 1 {
        bail!("flash-attn-candle: {name} must have rank 1 (batch + 1 offsets), got shape {:?}", t.dims())
    }
    match t.dtype() {
        DType::U32 => t.to_vec1::<u32>(),
        DType::I32 => t
            .to_vec1::<i32>()?
            .into_iter()
            .map(|o| {
                u32::try_from(o).map_err(|_| {
                    candle_core::Error::Msg(format!("flash-attn-candle: {name} has a negative offset {o}"))
                })
            })
            .collect(),
        dt => bail!("flash-attn-candle: {name} must be u32 or i32, got {dt:?}"),
    }
}

#[allow(clippy::too_many_arguments)]
fn varlen(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    alibi_slopes: Option<&Tensor>,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
    softcap: Option<f32>,
    with_lse: bool,
) -> Result<(Tensor, Option<Tensor>)> {
    checks::check_dtypes(q, k, v)?;
    let (total_q, total_k, heads_q, _, head_dim) = checks::check_varlen(q, k, v)?;
    let cu_q = host_offsets("seqlens_q", seqlens_q)?;
    let cu_k = host_offsets("seqlens_k", seqlens_k)?;
    if cu_q.len() != cu_k.len() {
        bail!(
            "flash-attn-candle: seqlens_q and seqlens_k should have the same number of elements {} <> {}",
            cu_q.len(),
            cu_k.len()
        )
    }
    let batch = cu_q.len().saturating_sub(1);
    if let Some(a) = alibi_slopes {
        checks::check_alibi(a, batch, heads_q)?;
    }
    let (cu_seqlens_q, _) = params::offsets("seqlens_q", &cu_q, max_seqlen_q).map_err(candle_core::Error::Msg)?;
    let (cu_seqlens_k, _) = params::offsets("seqlens_k", &cu_k, max_seqlen_k).map_err(candle_core::Error::Msg)?;
    if cu_q[batch] as usize != total_q || cu_k[batch] as usize != total_k {
        bail!(
            "flash-attn-candle: the offsets end at {} and {} tokens, but q has {total_q} and k {total_k}",
            cu_q[batch],
            cu_k[batch]
        )
    }
    let p = prepare(q, k, v, head_dim, alibi_slopes)?;
    let op = FlashAttnOp::new(
        translate(softmax_scale, window_size_left, window_size_right, softcap, max_seqlen_k),
        alibi_slopes.cloned(),
        Kind::Varlen { cu_seqlens_q, cu_seqlens_k },
    );
    finish(op, p, with_lse)
}

/// Flash-attention v2 layer.
///
/// This implements scaled dot-product attention, `softmax(Q @ K^T . softmax_scale) @ V`.
/// Multi-query and grouped-query attention are supported by using tensors k and v with fewer heads
/// than q, the number of heads in k and v has to be divisible by the number of heads in q.
///
/// # Arguments
///
/// * `q` - Query tensor with shape `(batch, seq_len_q, num_heads_q, head_size)`.
/// * `k` - Key tensor with shape `(batch, seq_len_kv, num_heads_kv, head_size)`.
/// * `v` - Value tensor with shape `(batch, seq_len_kv, num_heads_kv, head_size)`.
///
/// The resulting tensor has dimensions `(batch, seq_len_q, num_heads_q, head_size)`.
pub fn flash_attn(q: &Tensor, k: &Tensor, v: &Tensor, softmax_scale: f32, causal: bool) -> Result<Tensor> {
    let (left, right) = causal_window(causal);
    Ok(dense(q, k, v, None, softmax_scale, left, right, None, false)?.0)
}

/// Flash-attention v2 layer with a sliding window.
///
/// As [`flash_attn`], with query `i` seeing key `j` when
/// `i + seqlen_k - seqlen_q - window_size_left <= j <= i + seqlen_k - seqlen_q + window_size_right`,
/// `None` leaving a side unbounded.
///
/// # Causal mask
///
/// `window_size_left=None` with `window_size_right=Some(0)` applies a causal mask to the result
/// of  `Q @ K^T`
pub fn flash_attn_windowed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
) -> Result<Tensor> {
    Ok(dense(q, k, v, None, softmax_scale, window_size_left, window_size_right, None, false)?.0)
}

/// Flash-attention v2 layer with ALiBi.
///
/// As [`flash_attn`], with `alibi_slopes` an f32 tensor of shape `(num_heads_q)` (or
/// `(batch, num_heads_q)`): query `i` of head `h` adds `-slope[h] * |i + seqlen_k - seqlen_q - j|`
/// to its score for key `j`.
pub fn flash_attn_alibi(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    alibi_slopes: &Tensor,
    softmax_scale: f32,
    causal: bool,
) -> Result<Tensor> {
    let (left, right) = causal_window(causal);
    Ok(dense(q, k, v, Some(alibi_slopes), softmax_scale, left, right, None, false)?.0)
}

/// Flash-attention v2 layer with ALiBi and a sliding window: see [`flash_attn_alibi`] and
/// [`flash_attn_windowed`].
pub fn flash_attn_alibi_windowed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    alibi_slopes: &Tensor,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
) -> Result<Tensor> {
    Ok(dense(q, k, v, Some(alibi_slopes), softmax_scale, window_size_left, window_size_right, None, false)?.0)
}

/// Flash-attention v2 layer with optional ALiBi, a sliding window and a softcap: the scaled
/// scores `s` become `softcap * tanh(s / softcap)` before the softmax (Gemma 2). A softcap of
/// 0.0 (or below) is no softcap.
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_alibi_windowed_softcap(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    alibi_slopes: Option<&Tensor>,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
    softcap: f32,
) -> Result<Tensor> {
    Ok(dense(q, k, v, alibi_slopes, softmax_scale, window_size_left, window_size_right, Some(softcap), false)?.0)
}

/// Flash-attention v2 layer with variable-length batching.
///
/// # Arguments
///
/// * `q` - Query tensor with shape `(total_q, num_heads_q, head_size)`.
/// * `k` - Key tensor with shape `(total_kv, num_heads_kv, head_size)`.
/// * `v` - Value tensor with shape `(total_kv, num_heads_kv, head_size)`.
/// * `seqlens_q` - The cumulative lengths of the sequences in the batch, used to index in q.
/// * `seqlens_k` - The cumulative lengths of the sequences in the batch, used to index in k and v.
/// * `max_seqlen_q` - The maximum query sequence length for q in the batch.
/// * `max_seqlen_k` - The maximum query sequence length for k and v in the batch.
///
/// `seqlens_q` and `seqlens_k` contain `batch_size + 1` elements (u32, or i32), typically `0`,
/// `seqlen_1`, `seqlen_1 + seqlen_2`, etc. They are read back to the host, which waits for
/// the stream.
///
/// The resulting tensor has dimensions `(total_q, num_heads_q, head_size)`.
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_varlen(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: f32,
    causal: bool,
) -> Result<Tensor> {
    let (left, right) = causal_window(causal);
    let out = varlen(
        q,
        k,
        v,
        None,
        seqlens_q,
        seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        softmax_scale,
        left,
        right,
        None,
        false,
    )?;
    Ok(out.0)
}

/// [`flash_attn_varlen`] with a sliding window (see [`flash_attn_windowed`]); windows align
/// each sequence's bottom-right corner.
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_varlen_windowed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
) -> Result<Tensor> {
    let out = varlen(
        q,
        k,
        v,
        None,
        seqlens_q,
        seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        softmax_scale,
        window_size_left,
        window_size_right,
        None,
        false,
    )?;
    Ok(out.0)
}

/// [`flash_attn_varlen`] with ALiBi (see [`flash_attn_alibi`]).
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_varlen_alibi(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    alibi_slopes: &Tensor,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: f32,
    causal: bool,
) -> Result<Tensor> {
    let (left, right) = causal_window(causal);
    let out = varlen(
        q,
        k,
        v,
        Some(alibi_slopes),
        seqlens_q,
        seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        softmax_scale,
        left,
        right,
        None,
        false,
    )?;
    Ok(out.0)
}

/// [`flash_attn_varlen`] with ALiBi and a sliding window.
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_varlen_alibi_windowed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    alibi_slopes: &Tensor,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
) -> Result<Tensor> {
    let out = varlen(
        q,
        k,
        v,
        Some(alibi_slopes),
        seqlens_q,
        seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        softmax_scale,
        window_size_left,
        window_size_right,
        None,
        false,
    )?;
    Ok(out.0)
}

/// [`flash_attn_varlen`] with optional ALiBi, a sliding window and a softcap (see
/// [`flash_attn_alibi_windowed_softcap`]).
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_varlen_alibi_windowed_softcap(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    alibi_slopes: Option<&Tensor>,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
    softcap: f32,
) -> Result<Tensor> {
    let out = varlen(
        q,
        k,
        v,
        alibi_slopes,
        seqlens_q,
        seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        softmax_scale,
        window_size_left,
        window_size_right,
        Some(softcap),
        false,
    )?;
    Ok(out.0)
}

/// [`flash_attn_alibi_windowed_softcap`] that also returns the log-sum-exp: `(out, lse)`, `out`
/// `(batch, seq_len_q, num_heads_q, head_size)` and `lse` f32 `(batch, num_heads_q, seq_len_q)`,
/// the natural log of the sum of `exp` of each query row's final scores (`-inf` for a row that
/// sees no key). `softcap` `None` is no softcap.
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_with_lse(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    alibi_slopes: Option<&Tensor>,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
    softcap: Option<f32>,
) -> Result<(Tensor, Tensor)> {
    let (o, lse) = dense(q, k, v, alibi_slopes, softmax_scale, window_size_left, window_size_right, softcap, true)?;
    Ok((o, lse.expect("requested")))
}

/// [`flash_attn_varlen_alibi_windowed_softcap`] that also returns the log-sum-exp: `lse` is f32
/// `(num_heads_q, total_q)`.
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_varlen_with_lse(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    alibi_slopes: Option<&Tensor>,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
    softcap: Option<f32>,
) -> Result<(Tensor, Tensor)> {
    let (o, lse) = varlen(
        q,
        k,
        v,
        alibi_slopes,
        seqlens_q,
        seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        softmax_scale,
        window_size_left,
        window_size_right,
        softcap,
        true,
    )?;
    Ok((o, lse.expect("requested")))
}

/// A paged KV cache's block table, on the host: `table[b * pages_per_seq + i]` is the page
/// holding keys `i * page_size ..` of sequence `b`.
#[derive(Clone, Copy, Debug)]
pub struct PagedCache<'a> {
    pub block_table: &'a [u32],
    pub pages_per_seq: usize,
}

/// Attention of `q` over a KV cache, for decoding: returns `(out, lse)` as
/// [`flash_attn_with_lse`].
///
/// * `q` - `(batch, seq_len_q, num_heads_q, head_size)`: the new tokens' queries.
/// * `k_cache`, `v_cache` - `(batch, capacity, num_heads_kv, head_size)`, or with `paged`,
///   pages `(num_pages, page_size, num_heads_kv, head_size)`.
/// * `cache_seqlens` - on the host, one per sequence: how many cached keys it has (including
///   the new tokens' own keys, already written into the cache). The causal mask and windows
///   align the last query row with the last cached key.
/// * `paged` - the block table of a paged cache.
///
/// The cache is read-only here: write the new keys and values into it first (e.g.
/// `Tensor::slice_set`).
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_kvcache(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    cache_seqlens: &[u32],
    paged: Option<PagedCache<'_>>,
    alibi_slopes: Option<&Tensor>,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
    softcap: Option<f32>,
) -> Result<(Tensor, Tensor)> {
    checks::check_dtypes(q, k_cache, v_cache)?;
    let table = paged.map(|p| (p.block_table, p.pages_per_seq));
    let dims = checks::check_kvcache(q, k_cache, v_cache, cache_seqlens, table)?;
    if let Some(a) = alibi_slopes {
        checks::check_alibi(a, dims.batch, dims.heads_q)?;
    }
    let to_i32 = |v: &[u32]| -> Vec<i32> { v.iter().map(|&x| x as i32).collect() };
    let p = prepare(q, k_cache, v_cache, dims.head_dim, alibi_slopes)?;
    let kind = Kind::KvCache {
        cache_seqlens: to_i32(cache_seqlens),
        block_table: paged.map(|p| (to_i32(p.block_table), p.pages_per_seq)),
    };
    let op = FlashAttnOp::new(
        translate(softmax_scale, window_size_left, window_size_right, softcap, dims.seqlen_k),
        alibi_slopes.cloned(),
        kind,
    );
    let (o, lse) = finish(op, p, true)?;
    Ok((o, lse.expect("requested")))
}

/// [`flash_attn_kvcache`] that first writes the new tokens' keys and values into the cache, in
/// place: `k_new`, `v_new` (`(batch, seq_len_new, num_heads_kv, head_size)`) go to positions
/// `cache_seqlens[b] .. cache_seqlens[b] + seq_len_new` of sequence `b` (through the block table
/// if paged), then `q` attends over all `cache_seqlens[b] + seq_len_new` keys. Returns `(out, lse)`.
///
/// `cache_seqlens` counts the keys *before* appending. The caches are written where they lie,
/// so they must be usable in place: a head dim with a kernel (a multiple of 32), the last dim
/// contiguous, other strides and the start offset multiples of 8 elements. They are written on
/// the tensors' stream (candle's), ordered after earlier work on them; other tensors sharing
/// their storage see the new rows.
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_kvcache_append(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    k_new: &Tensor,
    v_new: &Tensor,
    cache_seqlens: &[u32],
    paged: Option<PagedCache<'_>>,
    alibi_slopes: Option<&Tensor>,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
    softcap: Option<f32>,
) -> Result<(Tensor, Tensor)> {
    checks::check_dtypes(q, k_cache, v_cache)?;
    checks::check_dtypes(q, k_new, v_new)?;
    let table = paged.map(|p| (p.block_table, p.pages_per_seq));
    let dims = checks::check_kvcache(q, k_cache, v_cache, cache_seqlens, table)?;
    let (b_new, seqlen_new, heads_new, d_new) = k_new.dims4()?;
    if (b_new, heads_new, d_new) != (dims.batch, dims.heads_kv, dims.head_dim) || v_new.dims() != k_new.dims() {
        bail!(
            "flash-attn-candle: k_new {:?} and v_new {:?} must be [{}, seqlen_new, {}, {}]",
            k_new.dims(),
            v_new.dims(),
            dims.batch,
            dims.heads_kv,
            dims.head_dim
        )
    }
    if let Some(&len) = cache_seqlens.iter().find(|&&n| n as usize + seqlen_new > dims.seqlen_k) {
        bail!(
            "flash-attn-candle: appending {seqlen_new} keys after {len} overflows the cache's {} keys per sequence",
            dims.seqlen_k
        )
    }
    if let Some(a) = alibi_slopes {
        checks::check_alibi(a, dims.batch, dims.heads_q)?;
    }
    let mut on_device = vec![("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("k_new", k_new), ("v_new", v_new)];
    if let Some(a) = alibi_slopes {
        on_device.push(("alibi_slopes", a));
    }
    checks::check_cuda(&on_device)?;
    checks::in_place("k_cache", k_cache)?;
    checks::in_place("v_cache", v_cache)?;
    let padded = kernel_head_dim(dims.head_dim)?;
    let (q, k_new, v_new) = (
        checks::prepare("q", q, padded)?,
        checks::prepare("k_new", k_new, padded)?,
        checks::prepare("v_new", v_new, padded)?,
    );
    let to_i32 = |v: &[u32]| -> Vec<i32> { v.iter().map(|&x| x as i32).collect() };
    let kind = Kind::KvCache {
        cache_seqlens: to_i32(cache_seqlens),
        block_table: paged.map(|p| (to_i32(p.block_table), p.pages_per_seq)),
    };
    let op = FlashAttnOp::new(
        translate(softmax_scale, window_size_left, window_size_right, softcap, dims.seqlen_k),
        alibi_slopes.cloned(),
        kind,
    );
    op.append_with_lse(&q, k_cache, v_cache, &k_new, &v_new)
}

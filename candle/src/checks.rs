//! Argument checks on candle tensors that need no GPU: dtypes, ranks,
//! shapes, then the device. Each error names the argument, as
//! candle-flash-attn's do.

use candle_core::{bail, DType, Layout, Result, Tensor};
use flash_attn::{Problem, SUPPORTED_HEAD_DIMS};

/// Largest head dim accepted (flash-attn's largest kernel): smaller ones
/// that have no kernel are padded with zeros up to the next one that has.
pub const MAX_HEAD_DIM: usize = SUPPORTED_HEAD_DIMS[SUPPORTED_HEAD_DIMS.len() - 1] as usize;

/// The head dim a call runs at: `head_dim` itself when it has a kernel,
/// else the next one that has (q, k and v padded with zeros, which changes
/// neither `q k^T` nor the kept columns of the output).
pub fn kernel_head_dim(head_dim: usize) -> Result<usize> {
    if head_dim == 0 || head_dim > MAX_HEAD_DIM || !head_dim.is_multiple_of(8) {
        bail!(
            "flash-attn-candle: head_dim {head_dim} is not supported: a multiple of 8 up to {MAX_HEAD_DIM} \
             (kernels for {SUPPORTED_HEAD_DIMS:?}, others padded)"
        )
    }
    let padded = SUPPORTED_HEAD_DIMS.into_iter().map(|d| d as usize).find(|&d| d >= head_dim);
    Ok(padded.expect("head_dim <= MAX_HEAD_DIM, the largest kernel's"))
}

/// q, k and v are f16 or bf16, all the same.
pub fn check_dtypes(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<DType> {
    dtypes(q.dtype(), k.dtype(), v.dtype())
}

/// [`check_dtypes`] on the dtypes alone (a custom op's storages).
pub fn dtypes(q: DType, k: DType, v: DType) -> Result<DType> {
    if !matches!(q, DType::F16 | DType::BF16) {
        bail!("flash-attn-candle: flash-attn is only supported for f16/bf16 (q is {q:?})")
    }
    for (name, dtype) in [("k", k), ("v", v)] {
        if dtype != q {
            bail!("flash-attn-candle: dtype mismatch: q is {q:?} but {name} is {dtype:?}")
        }
    }
    Ok(q)
}

fn rank(name: &str, dims: &[usize], want: usize, layout: &str) -> Result<()> {
    if dims.len() != want {
        bail!("flash-attn-candle: {name} must have rank {want} {layout}, got shape {dims:?}")
    }
    Ok(())
}

fn heads(heads_q: usize, heads_kv: usize) -> Result<()> {
    if heads_kv == 0 || !heads_q.is_multiple_of(heads_kv) {
        bail!("flash-attn-candle: number of k/v heads {heads_kv} must divide number of heads in query {heads_q}")
    }
    Ok(())
}

/// q `[batch, seqlen_q, heads_q, d]`, k and v `[batch, seqlen_k, heads_kv, d]`.
pub fn check_dense(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Problem> {
    dense_dims(q.dims(), k.dims(), v.dims())
}

/// [`check_dense`] on the shapes alone (a custom op's layouts).
pub fn dense_dims(q: &[usize], k: &[usize], v: &[usize]) -> Result<Problem> {
    const LAYOUT: &str = "[batch, seqlen, heads, head_dim]";
    for (name, dims) in [("q", q), ("k", k), ("v", v)] {
        rank(name, dims, 4, LAYOUT)?;
    }
    let &[batch, seqlen_q, heads_q, head_dim] = q else { unreachable!("rank 4") };
    let &[b_k, seqlen_k, heads_kv, d_k] = k else { unreachable!("rank 4") };
    if (b_k, d_k) != (batch, head_dim) {
        bail!("flash-attn-candle: shape mismatch q {q:?} and k {k:?}")
    }
    if v != k {
        bail!("flash-attn-candle: shape mismatch k {k:?} and v {v:?}")
    }
    heads(heads_q, heads_kv)?;
    kernel_head_dim(head_dim)?;
    Ok(Problem { batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim })
}

/// q `[total_q, heads_q, d]`, k and v `[total_k, heads_kv, d]`: returns
/// `(total_q, total_k, heads_q, heads_kv, head_dim)`.
pub fn check_varlen(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<(usize, usize, usize, usize, usize)> {
    const LAYOUT: &str = "[total_tokens, heads, head_dim]";
    for (name, t) in [("q", q), ("k", k), ("v", v)] {
        rank(name, t.dims(), 3, LAYOUT)?;
    }
    let (total_q, heads_q, head_dim) = q.dims3()?;
    let (total_k, heads_kv, d_k) = k.dims3()?;
    if d_k != head_dim {
        bail!("flash-attn-candle: shape mismatch q {:?} and k {:?}", q.dims(), k.dims())
    }
    if v.dims() != k.dims() {
        bail!("flash-attn-candle: shape mismatch k {:?} and v {:?}", k.dims(), v.dims())
    }
    heads(heads_q, heads_kv)?;
    kernel_head_dim(head_dim)?;
    Ok((total_q, total_k, heads_q, heads_kv, head_dim))
}

/// A KV cache: q `[batch, seqlen_q, heads_q, d]`, caches `[batch,
/// capacity, heads_kv, d]`, or paged `[num_pages, page_size, heads_kv, d]`.
/// Returns the dims with `seqlen_k` the capacity of one sequence's cache.
pub fn check_kvcache(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    cache_seqlens: &[u32],
    block_table: Option<(&[u32], usize)>,
) -> Result<Problem> {
    for (name, t) in [("q", q), ("k_cache", k_cache), ("v_cache", v_cache)] {
        rank(name, t.dims(), 4, "[batch, seqlen, heads, head_dim]")?;
    }
    let (batch, seqlen_q, heads_q, head_dim) = q.dims4()?;
    let (rows, row_len, heads_kv, d_k) = k_cache.dims4()?;
    if d_k != head_dim {
        bail!("flash-attn-candle: shape mismatch q {:?} and k_cache {:?}", q.dims(), k_cache.dims())
    }
    if v_cache.dims() != k_cache.dims() {
        bail!("flash-attn-candle: shape mismatch k_cache {:?} and v_cache {:?}", k_cache.dims(), v_cache.dims())
    }
    heads(heads_q, heads_kv)?;
    kernel_head_dim(head_dim)?;
    if cache_seqlens.len() != batch {
        bail!("flash-attn-candle: cache_seqlens has {} entries for a batch of {batch}", cache_seqlens.len())
    }
    let seqlen_k = match block_table {
        None => {
            if rows != batch {
                bail!("flash-attn-candle: k_cache {:?} has {rows} sequences for a batch of {batch}", k_cache.dims())
            }
            row_len
        }
        Some((table, pages_per_seq)) => {
            if table.len() != batch * pages_per_seq {
                bail!(
                    "flash-attn-candle: block_table has {} entries, not batch {batch} x pages_per_seq {pages_per_seq}",
                    table.len()
                )
            }
            pages_per_seq * row_len
        }
    };
    if let Some(&len) = cache_seqlens.iter().find(|&&n| n as usize > seqlen_k) {
        bail!("flash-attn-candle: cache_seqlens entry {len} exceeds the cache's {seqlen_k} keys per sequence")
    }
    Ok(Problem { batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim })
}

/// ALiBi slopes: f32, `[heads_q]` or `[batch, heads_q]`.
pub fn check_alibi(alibi_slopes: &Tensor, batch: usize, heads_q: usize) -> Result<()> {
    if alibi_slopes.dtype() != DType::F32 {
        bail!("flash-attn-candle: DType mismatch alibi_slopes {:?}, expected F32", alibi_slopes.dtype())
    }
    let dims = alibi_slopes.dims();
    if dims != [heads_q] && dims != [batch, heads_q] {
        bail!("flash-attn-candle: shape mismatch alibi_slopes {dims:?}, expected [{heads_q}] or [{batch}, {heads_q}]")
    }
    Ok(())
}

/// Every tensor is on the same CUDA device.
pub fn check_cuda(tensors: &[(&str, &Tensor)]) -> Result<()> {
    let first = tensors[0].1.device();
    for (name, t) in tensors {
        if !t.device().is_cuda() {
            bail!("flash-attn-candle: {name} must be a CUDA tensor (it is on {:?})", t.device().location())
        }
        if !t.device().same_device(first) {
            bail!(
                "flash-attn-candle: {name} is on {:?}, not on {}'s device {:?}",
                t.device().location(),
                tensors[0].0,
                first.location()
            )
        }
    }
    Ok(())
}

/// Whether the kernels can address `t` where it lies: see [`aligned_layout`].
fn aligned(t: &Tensor) -> bool {
    let (storage, layout) = t.storage_and_layout();
    let aligned = aligned_layout(layout);
    drop(storage);
    aligned
}

/// Whether the kernels can address a tensor of `layout` where it lies: the
/// start offset and the strides of its dims of more than one element
/// multiples of 8.
pub fn aligned_layout(layout: &Layout) -> bool {
    let rank = layout.dims().len();
    layout.start_offset().is_multiple_of(8)
        && layout.dims()[..rank - 1].iter().zip(layout.stride()).all(|(&n, &s)| n <= 1 || s.is_multiple_of(8))
}

/// The last dim of `name` (laid out as `layout`) is contiguous, as the
/// kernels (and candle-flash-attn) require.
pub fn last_dim_contiguous(name: &str, layout: &Layout) -> Result<()> {
    let (dims, stride) = (layout.dims(), layout.stride());
    let rank = dims.len();
    if dims[rank - 1] > 1 && stride[rank - 1] != 1 {
        bail!("flash-attn-candle: the last dim of {name} must be contiguous {stride:?}")
    }
    Ok(())
}

/// A tensor the kernels write in place (a KV cache appended to): its head
/// dim has a kernel, its last dim is contiguous and its layout aligned.
pub fn in_place(name: &str, t: &Tensor) -> Result<()> {
    let head_dim = t.dim(candle_core::D::Minus1)?;
    if kernel_head_dim(head_dim)? != head_dim {
        bail!("flash-attn-candle: appending to {name} needs a head_dim with a kernel ({SUPPORTED_HEAD_DIMS:?}), got {head_dim}")
    }
    let stride = t.stride();
    if stride[stride.len() - 1] != 1 || !aligned(t) {
        bail!(
            "flash-attn-candle: {name} is written in place: its last dim must be contiguous and its other strides and start \
             offset multiples of 8 elements (strides {stride:?})"
        )
    }
    Ok(())
}

/// A tensor the kernels can read in place: the last dim contiguous (an
/// error otherwise, as in candle-flash-attn), the other strides and the
/// start offset multiples of 8 elements (16 bytes; copied into a
/// contiguous tensor otherwise), the head dim padded to one with a kernel.
pub fn prepare(name: &str, t: &Tensor, padded_head_dim: usize) -> Result<Tensor> {
    last_dim_contiguous(name, t.layout())?;
    let rank = t.rank();
    let head_dim = t.dims()[rank - 1];
    let t =
        if padded_head_dim > head_dim { t.pad_with_zeros(rank - 1, 0, padded_head_dim - head_dim)? } else { t.clone() };
    if aligned(&t) {
        Ok(t)
    } else {
        t.force_contiguous()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dense_shapes_are_checked_on_layouts_alone() {
        let p = dense_dims(&[2, 5, 8, 64], &[2, 9, 2, 64], &[2, 9, 2, 64]).unwrap();
        assert_eq!((p.batch, p.seqlen_q, p.seqlen_k, p.heads_q, p.heads_kv, p.head_dim), (2, 5, 9, 8, 2, 64));
        let err = |q: &[usize], k: &[usize], v: &[usize]| dense_dims(q, k, v).unwrap_err().to_string();
        assert!(err(&[5, 8, 64], &[9, 2, 64], &[9, 2, 64]).contains("q must have rank 4"));
        assert!(err(&[2, 5, 8, 64], &[1, 9, 2, 64], &[1, 9, 2, 64]).contains("shape mismatch q"));
        assert!(err(&[2, 5, 8, 64], &[2, 9, 2, 64], &[2, 8, 2, 64]).contains("shape mismatch k"));
        assert!(err(&[2, 5, 8, 64], &[2, 9, 3, 64], &[2, 9, 3, 64]).contains("must divide"));
        assert!(err(&[2, 5, 8, 20], &[2, 9, 2, 20], &[2, 9, 2, 20]).contains("head_dim 20 is not supported"));
        assert!(dtypes(DType::F16, DType::F16, DType::BF16).unwrap_err().to_string().contains("v is BF16"));
        assert!(dtypes(DType::F32, DType::F32, DType::F32).is_err());
    }

    #[test]
    fn layouts_read_in_place_are_aligned_with_a_contiguous_last_dim() {
        let fused = Layout::contiguous((2, 5, 12, 64));
        assert!(aligned_layout(&fused.narrow(2, 4, 4).unwrap()));
        // Offsets and strides that are not multiples of 8 elements.
        assert!(!aligned_layout(&Layout::contiguous_with_offset((2, 5, 4, 64), 3)));
        assert!(!aligned_layout(&Layout::contiguous((2, 5, 12, 36)).narrow(2, 0, 4).unwrap()));
        // A dim of one element has no stride to align.
        assert!(aligned_layout(&Layout::contiguous((1, 1, 4, 64)).narrow(3, 0, 64).unwrap()));
        let transposed = Layout::contiguous((2, 5, 64, 4)).transpose(2, 3).unwrap();
        assert!(last_dim_contiguous("q", &fused).is_ok());
        let e = last_dim_contiguous("q", &transposed).unwrap_err().to_string();
        assert!(e.contains("the last dim of q must be contiguous"), "{e}");
    }
}

//! candle's own attention, for the examples to check flash-attn against:
//! matmul, a mask, softmax, matmul, in the tensors' dtype (f32 or f64), all
//! differentiable by candle.

use candle_core::{Result, Tensor, D};

/// Attention of q `[batch, seqlen_q, heads_q, d]` over k, v `[batch,
/// seqlen_k, heads_kv, d]` (heads_kv dividing heads_q: each KV head serves
/// its group of query heads), causal aligned to the bottom-right corner (query
/// `i` sees keys `j <= i + seqlen_k - seqlen_q`) or not.
pub fn candle_attention(q: &Tensor, k: &Tensor, v: &Tensor, scale: f64, causal: bool) -> Result<Tensor> {
    let (b, sq, hq, d) = q.dims4()?;
    let (_, sk, hkv, _) = k.dims4()?;
    let expand = |t: &Tensor| -> Result<Tensor> {
        t.transpose(1, 2)?.unsqueeze(2)?.expand((b, hkv, hq / hkv, sk, d))?.contiguous()?.reshape((b, hq, sk, d))
    };
    let (k, v) = (expand(k)?, expand(v)?);
    let q = q.transpose(1, 2)?.contiguous()?;
    let mut scores = (q.matmul(&k.t()?.contiguous()?)? * scale)?;
    if causal {
        let mask: Vec<f32> =
            (0..sq).flat_map(|i| (0..sk).map(move |j| if j + sq > i + sk { -1e30 } else { 0.0 })).collect();
        let mask = Tensor::from_vec(mask, (sq, sk), q.device())?.to_dtype(q.dtype())?;
        scores = scores.broadcast_add(&mask)?;
    }
    let e = scores.broadcast_sub(&scores.max_keepdim(D::Minus1)?.detach())?.exp()?;
    let p = e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?;
    p.matmul(&v)?.transpose(1, 2)
}

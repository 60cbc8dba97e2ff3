//! Input validation and kernel argument construction, as pure functions of
//! shapes, strides and addresses, so that every rule is tested without a GPU.

use crate::config::{TileConfig, HEAD_DIM_128, HEAD_DIM_64};
use crate::error::{Error, Result};
use crate::params::ForwardParams;

/// Shape and strides (in elements) of a `[batch, seqlen, heads, head_dim]` tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub shape: [usize; 4],
    pub strides: [usize; 4],
}

impl Layout {
    /// A densely packed, row-major layout of `shape`.
    pub fn contiguous(shape: [usize; 4]) -> Self {
        let [_, s, h, d] = shape;
        Layout { shape, strides: [s * h * d, h * d, d, 1] }
    }

    /// A layout with the given strides.
    pub fn strided(shape: [usize; 4], strides: [usize; 4]) -> Self {
        Layout { shape, strides }
    }

    /// Elements from the first to one past the last one addressed, or `None`
    /// if that overflows (an empty layout spans 0).
    pub fn span(&self) -> Option<usize> {
        if self.shape.contains(&0) {
            return Some(0);
        }
        let mut last = 0usize;
        for (n, s) in self.shape.iter().zip(self.strides) {
            last = last.checked_add((n - 1).checked_mul(s)?)?;
        }
        last.checked_add(1)
    }
}

/// A tensor as the validator sees it: layout, device address and the
/// number of elements of the buffer behind it.
#[derive(Clone, Copy, Debug)]
pub struct Placed {
    pub name: &'static str,
    pub layout: Layout,
    pub addr: u64,
    pub buffer_len: usize,
}

/// The options of one attention call.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AttentionParams {
    /// Causal masking, aligned to the bottom-right corner when
    /// `seqlen_q != seqlen_k` (as FlashAttention-2): query `i` sees keys
    /// `j <= i + seqlen_k - seqlen_q`.
    pub causal: bool,
    /// Multiplies `q k^T` before the softmax; `None` means `1/sqrt(head_dim)`.
    pub softmax_scale: Option<f32>,
}

/// The sizes of a validated problem.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Problem {
    pub batch: usize,
    pub seqlen_q: usize,
    pub seqlen_k: usize,
    pub heads_q: usize,
    pub heads_kv: usize,
    pub head_dim: usize,
}

/// The head dims that have kernels.
pub const SUPPORTED_HEAD_DIMS: [usize; 2] = [64, 128];

/// The tile config of the kernels for `head_dim`.
pub fn tile_config(head_dim: usize) -> Result<TileConfig> {
    match head_dim {
        64 => Ok(HEAD_DIM_64),
        128 => Ok(HEAD_DIM_128),
        d => Err(Error::UnsupportedHeadDim(d)),
    }
}

/// Largest sequence length (the kernel's masks use i32 positions).
pub const MAX_SEQLEN: usize = i32::MAX as usize;
/// Largest batch and number of query heads (grid z and y).
pub const MAX_GRID_YZ: usize = 65_535;

fn check_tensor(t: &Placed) -> Result<()> {
    if t.layout.shape.contains(&0) {
        return Err(Error::EmptyTensor { tensor: t.name });
    }
    if t.layout.strides[3] != 1 {
        return Err(Error::LastDimNotContiguous { tensor: t.name, stride: t.layout.strides[3] });
    }
    if t.addr % 16 != 0 {
        return Err(Error::Misaligned { tensor: t.name, what: "the base address" });
    }
    for (stride, what) in
        t.layout.strides[..3].iter().zip(["the batch stride", "the seqlen stride", "the heads stride"])
    {
        if stride % 8 != 0 {
            return Err(Error::Misaligned { tensor: t.name, what });
        }
    }
    let needed =
        t.layout.span().ok_or(Error::TooLarge { what: "view span", value: usize::MAX, max: isize::MAX as usize })?;
    if needed > t.buffer_len {
        return Err(Error::OutOfBounds { tensor: t.name, needed, len: t.buffer_len });
    }
    Ok(())
}

/// The bytes of a buffer of `len` elements of `elem_bytes` at `addr`.
fn bytes(addr: u64, len: usize, elem_bytes: u64) -> std::ops::Range<u64> {
    addr..addr.saturating_add(len as u64 * elem_bytes)
}

fn overlaps(a: &std::ops::Range<u64>, b: &std::ops::Range<u64>) -> bool {
    a.start < b.end && b.start < a.end
}

fn too_large(what: &'static str, value: usize, max: usize) -> Result<()> {
    if value > max {
        Err(Error::TooLarge { what, value, max })
    } else {
        Ok(())
    }
}

/// Checks q, k, v, o (16-bit elements) and the lse buffer (`lse_len` f32 at
/// `lse_addr`) and builds the kernel arguments and the problem sizes.
pub fn validate(
    q: &Placed,
    k: &Placed,
    v: &Placed,
    o: &Placed,
    lse_addr: u64,
    lse_len: usize,
    params: &AttentionParams,
) -> Result<(ForwardParams, Problem)> {
    for t in [q, k, v, o] {
        check_tensor(t)?;
    }
    let [batch, seqlen_q, heads_q, head_dim] = q.layout.shape;
    let [batch_k, seqlen_k, heads_kv, head_dim_k] = k.layout.shape;
    if v.layout.shape != k.layout.shape {
        return Err(Error::ShapeMismatch(format!("k is {:?} but v is {:?}", k.layout.shape, v.layout.shape)));
    }
    if batch_k != batch || head_dim_k != head_dim {
        return Err(Error::ShapeMismatch(format!(
            "q is {:?} and k is {:?}: batch and head_dim must match",
            q.layout.shape, k.layout.shape
        )));
    }
    if o.layout.shape != q.layout.shape {
        return Err(Error::ShapeMismatch(format!("o is {:?} but q is {:?}", o.layout.shape, q.layout.shape)));
    }
    let config = tile_config(head_dim)?;
    if heads_q % heads_kv != 0 {
        return Err(Error::HeadsNotDivisible { heads_q, heads_kv });
    }
    too_large("seqlen_q", seqlen_q, MAX_SEQLEN)?;
    too_large("seqlen_k", seqlen_k, MAX_SEQLEN)?;
    too_large("batch", batch, MAX_GRID_YZ)?;
    too_large("heads_q", heads_q, MAX_GRID_YZ)?;
    let lse_needed = batch * heads_q * seqlen_q;
    if lse_len < lse_needed {
        return Err(Error::ShapeMismatch(format!(
            "lse needs batch * heads_q * seqlen_q = {lse_needed} f32 but has {lse_len}"
        )));
    }
    if lse_addr % 4 != 0 {
        return Err(Error::Misaligned { tensor: "lse", what: "the base address" });
    }
    let outputs = [bytes(o.addr, o.buffer_len, 2), bytes(lse_addr, lse_len, 4)];
    if overlaps(&outputs[0], &outputs[1])
        || [q, k, v].iter().any(|t| outputs.iter().any(|out| overlaps(out, &bytes(t.addr, t.buffer_len, 2))))
    {
        return Err(Error::Aliasing);
    }
    let scale = params.softmax_scale.unwrap_or(1.0 / (head_dim as f32).sqrt());
    if !(scale.is_finite() && scale > 0.0) {
        return Err(Error::InvalidScale(scale));
    }
    debug_assert_eq!(config.head_dim as usize, head_dim);

    let strides = |t: &Placed| t.layout.strides.map(|s| s as i64);
    let [qb, qs, qh, _] = strides(q);
    let [kb, ks, kh, _] = strides(k);
    let [vb, vs, vh, _] = strides(v);
    let [ob, os, oh, _] = strides(o);
    let forward = ForwardParams {
        q: q.addr as *const u16,
        k: k.addr as *const u16,
        v: v.addr as *const u16,
        o: o.addr as *mut u16,
        lse: lse_addr as *mut f32,
        q_batch_stride: qb,
        q_row_stride: qs,
        q_head_stride: qh,
        k_batch_stride: kb,
        k_row_stride: ks,
        k_head_stride: kh,
        v_batch_stride: vb,
        v_row_stride: vs,
        v_head_stride: vh,
        o_batch_stride: ob,
        o_row_stride: os,
        o_head_stride: oh,
        seqlen_q: seqlen_q as u32,
        seqlen_k: seqlen_k as u32,
        heads_q: heads_q as u32,
        heads_per_kv: (heads_q / heads_kv) as u32,
        scale_log2: scale * std::f32::consts::LOG2_E,
        _pad: 0,
    };
    let problem = Problem { batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim };
    Ok((forward, problem))
}

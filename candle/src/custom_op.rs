//! [`FlashAttn`], candle-flash-attn's public custom op, for programs that
//! build it themselves (`q.apply_op3(&k, &v, FlashAttn { .. })`).

use candle_core::backend::{BackendDevice, BackendStorage};
use candle_core::{bail, CpuStorage, CudaStorage, Device, Layout, Result, Shape, Tensor};

use crate::checks;
use crate::op::{FlashAttnOp, Kind};
use crate::params::translate;

/// Flash-attention v2 as a candle `CustomOp3` over `(q, k, v)`, with
/// candle-flash-attn 0.11's public fields: apply it with
/// `q.apply_op3(&k, &v, FlashAttn { .. })`. [`crate::flash_attn`] and the
/// other dense functions are this op with their arguments.
///
/// q is `(batch, seq_len_q, num_heads_q, head_size)`, k and v `(batch,
/// seq_len_kv, num_heads_kv, head_size)`, f16 or bf16, the last dim
/// contiguous; the output has q's shape and dtype. Windows as
/// [`crate::flash_attn_windowed`] (`window_size_left: None,
/// window_size_right: Some(0)` is the causal mask); `alibi_slopes` f32
/// `(num_heads_q)` (or `(batch, num_heads_q)`); a `softcap` of `None` or
/// `Some(0.0)` is no softcap.
///
/// Unlike candle-flash-attn's, it has a backward (candle's `backward()` runs
/// flash-attn's backward kernels). Since the op keeps nothing beyond these
/// fields, its backward computes the forward's log-sum-exp again (one more
/// forward call); the crate's functions keep it from their forward instead.
pub struct FlashAttn {
    pub softmax_scale: f32,
    pub alibi_slopes: Option<Tensor>,
    pub window_size_left: Option<usize>,
    pub window_size_right: Option<usize>,
    pub softcap: Option<f32>,
}

impl FlashAttn {
    /// The crate's op for these fields over `seqlen_k` keys.
    fn op(&self, seqlen_k: usize) -> FlashAttnOp {
        let params =
            translate(self.softmax_scale, self.window_size_left, self.window_size_right, self.softcap, seqlen_k);
        FlashAttnOp::new(params, self.alibi_slopes.clone(), Kind::Dense)
    }
}

/// `storage` (laid out as `layout`) as the kernels read it: `None` when they
/// can read it in place (its head dim has a kernel, its layout is aligned),
/// otherwise a contiguous copy with the last dim padded with zeros to
/// `padded`, and the copy's layout.
fn for_kernels(storage: &CudaStorage, layout: &Layout, padded: usize) -> Result<Option<(CudaStorage, Layout)>> {
    let dims = layout.dims();
    let head_dim = dims[dims.len() - 1];
    if head_dim == padded && checks::aligned_layout(layout) {
        return Ok(None);
    }
    let (device, dtype) = (storage.device(), storage.dtype());
    let mut padded_dims = dims.to_vec();
    padded_dims[dims.len() - 1] = padded;
    let padded_shape = Shape::from(padded_dims);
    let mut out = device.zeros_impl(&padded_shape, dtype)?;
    let rows = layout.shape().elem_count() / head_dim;
    if layout.is_contiguous() {
        storage.copy2d(&mut out, rows, head_dim, head_dim, padded, layout.start_offset(), 0)?;
    } else {
        // Safety: every element is written by the copy below.
        let mut contiguous = unsafe { device.alloc_uninit(layout.shape(), dtype)? };
        storage.copy_strided_src(&mut contiguous, 0, layout)?;
        contiguous.copy2d(&mut out, rows, head_dim, head_dim, padded, 0, 0)?;
    }
    Ok(Some((out, Layout::contiguous(padded_shape))))
}

/// The copy [`for_kernels`] made, or the storage itself.
fn pick<'a>(
    copy: &'a Option<(CudaStorage, Layout)>,
    storage: &'a CudaStorage,
    layout: &'a Layout,
) -> (&'a CudaStorage, &'a Layout) {
    match copy {
        Some((s, l)) => (s, l),
        None => (storage, layout),
    }
}

impl candle_core::CustomOp3 for FlashAttn {
    fn name(&self) -> &'static str {
        "flash-attn"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        bail!("flash-attn-candle: no cpu support for flash-attn: q, k and v must be CUDA tensors")
    }

    fn cuda_fwd(
        &self,
        q: &CudaStorage,
        q_l: &Layout,
        k: &CudaStorage,
        k_l: &Layout,
        v: &CudaStorage,
        v_l: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        checks::dtypes(q.dtype(), k.dtype(), v.dtype())?;
        let dims = checks::dense_dims(q_l.dims(), k_l.dims(), v_l.dims())?;
        for (name, layout) in [("q", q_l), ("k", k_l), ("v", v_l)] {
            checks::last_dim_contiguous(name, layout)?;
        }
        if let Some(alibi) = &self.alibi_slopes {
            checks::check_alibi(alibi, dims.batch, dims.heads_q)?;
            if !alibi.device().same_device(&Device::Cuda(q.device().clone())) {
                bail!(
                    "flash-attn-candle: alibi_slopes must be a CUDA tensor on q's device (it is on {:?})",
                    alibi.device().location()
                )
            }
        }
        let padded = checks::kernel_head_dim(dims.head_dim)?;
        let (q_k, k_k, v_k) =
            (for_kernels(q, q_l, padded)?, for_kernels(k, k_l, padded)?, for_kernels(v, v_l, padded)?);
        let out = self.op(dims.seqlen_k).run(pick(&q_k, q, q_l), pick(&k_k, k, k_l), pick(&v_k, v, v_l), None)?;
        if padded == dims.head_dim {
            return Ok((out.o, out.o_shape));
        }
        // The output back at the caller's head dim.
        let shape = q_l.shape().clone();
        let rows = shape.elem_count() / dims.head_dim;
        // Safety: every element is written by the copy below.
        let mut o = unsafe { q.device().alloc_uninit(&shape, q.dtype())? };
        out.o.copy2d(&mut o, rows, dims.head_dim, padded, dims.head_dim, 0, 0)?;
        Ok((o, shape))
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        o: &Tensor,
        d_o: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (_, seqlen_k, _, _) = k.dims4()?;
        let (d_q, d_k, d_v) = self.op(seqlen_k).backward(q, k, v, o, d_o)?;
        Ok((Some(d_q), Some(d_k), Some(d_v)))
    }
}

//! The custom op: candle storages in, flash-attn's `_into` call on candle's
//! own stream, candle storages out. No copy: q, k and v are read where they
//! lie, o and the LSE are written into fresh allocations of candle's device
//! that become the returned tensors.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaView, DevicePtr, DeviceRepr};
use candle_core::cuda_backend::{CudaDType, CudaDevice};
use candle_core::op::BackpropOp;
use candle_core::{bail, CpuStorage, CudaStorage, DType, Layout, Result, Shape, Storage, Tensor};
use flash_attn::{
    AttentionParams, BlockTable, CacheSeqlens, DeviceView, DeviceViewMut, FlashAttention, KvCache, SeqOffsets,
    Workspace,
};

use crate::params::Translated;

/// A flash-attn error as a candle one.
pub(crate) fn fa(e: flash_attn::Error) -> candle_core::Error {
    candle_core::Error::Msg(format!("flash-attn: {e}")).bt()
}

fn driver(e: candle_core::cuda_backend::cudarc::driver::DriverError) -> candle_core::Error {
    candle_core::Error::Msg(format!("flash-attn-candle: CUDA driver: {e}")).bt()
}

/// The kernels loaded into the primary context of `device`'s GPU, once per
/// GPU: every candle `Device::new_cuda(ordinal)` shares that context.
pub fn flash_attention_for(device: &CudaDevice) -> Result<Arc<FlashAttention>> {
    static LOADED: OnceLock<Mutex<HashMap<usize, Arc<FlashAttention>>>> = OnceLock::new();
    let stream = device.cuda_stream();
    let context = stream.context();
    let ordinal = context.ordinal();
    let mut loaded = LOADED.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    if let Some(attention) = loaded.get(&ordinal) {
        return Ok(attention.clone());
    }
    context.bind_to_thread().map_err(driver)?;
    let attention = Arc::new(FlashAttention::new().map_err(fa)?);
    loaded.insert(ordinal, attention.clone());
    Ok(attention)
}

thread_local! {
    /// Split-KV scratch of the KV-cache calls, per GPU and per thread:
    /// candle's device stream is the per-thread default stream, so a
    /// thread's calls are ordered on one stream and may reuse one workspace.
    static WORKSPACES: RefCell<HashMap<usize, Workspace>> = RefCell::new(HashMap::new());
}

/// What the call attends over, besides q, k and v.
#[derive(Clone, Debug)]
pub(crate) enum Kind {
    /// `[batch, seqlen, heads, d]` q, k, v.
    Dense,
    /// Packed `[total, heads, d]` q, k, v with host offsets.
    Varlen { cu_seqlens_q: Vec<i32>, cu_seqlens_k: Vec<i32> },
    /// k and v are a KV cache, paged if `block_table` is given (`(table,
    /// pages_per_seq)`); read-only here, written (new keys and values
    /// appended) by [`FlashAttnOp::append_with_lse`].
    KvCache { cache_seqlens: Vec<i32>, block_table: Option<(Vec<i32>, usize)> },
}

/// One attention call, as a candle `CustomOp3` over (q, k, v).
pub(crate) struct FlashAttnOp {
    pub params: Translated,
    pub alibi_slopes: Option<Tensor>,
    pub kind: Kind,
    /// Split-KV override (`None`: flash-attn's heuristic).
    pub num_splits: Option<usize>,
}

/// The shape of a tensor as flash-attn's four dims and strides: packed
/// `[total, heads, d]` tensors are `[1, total, heads, d]`. The stride of a
/// dim of size 1 is irrelevant to addressing; it is replaced by the
/// contiguous one so that it satisfies flash-attn's multiple-of-8 rule.
fn dims_and_strides(layout: &Layout) -> ([usize; 4], [usize; 4]) {
    let (dims, strides) = (layout.dims(), layout.stride());
    let (mut d, mut s) = ([1usize; 4], [0usize; 4]);
    let off = 4 - dims.len();
    d[off..].copy_from_slice(dims);
    s[off..].copy_from_slice(strides);
    let mut contiguous = 1;
    for i in (0..4).rev() {
        if d[i] == 1 {
            s[i] = contiguous;
        }
        contiguous *= d[i];
    }
    (d, s)
}

fn view<'a, T: CudaDType>(storage: &'a CudaStorage, layout: &Layout) -> Result<CudaView<'a, T>> {
    Ok(storage.as_cuda_slice::<T>()?.slice(layout.start_offset()..))
}

/// The outputs of one call: o with q's shape, the LSE (`[batch, heads_q,
/// seqlen_q]`, or `[heads_q, total_q]` for variable lengths).
pub(crate) struct Outputs {
    pub o: CudaStorage,
    pub o_shape: Shape,
    pub lse: CudaStorage,
    pub lse_shape: Shape,
}

impl FlashAttnOp {
    pub(crate) fn run(
        &self,
        q: (&CudaStorage, &Layout),
        k: (&CudaStorage, &Layout),
        v: (&CudaStorage, &Layout),
        new_kv: Option<NewKv<'_>>,
    ) -> Result<Outputs> {
        match q.0.dtype() {
            DType::F16 => self.run_t::<half::f16>(q, k, v, new_kv),
            DType::BF16 => self.run_t::<half::bf16>(q, k, v, new_kv),
            dt => bail!("flash-attn-candle: flash-attn is only supported for f16/bf16 ({dt:?})"),
        }
    }

    fn run_t<T: flash_attn::Element + CudaDType + DeviceRepr>(
        &self,
        (q, q_l): (&CudaStorage, &Layout),
        (k, k_l): (&CudaStorage, &Layout),
        (v, v_l): (&CudaStorage, &Layout),
        new_kv: Option<NewKv<'_>>,
    ) -> Result<Outputs> {
        let device = q.device().clone();
        let stream = device.cuda_stream();
        let attention = flash_attention_for(&device)?;

        let (q_dims, q_strides) = dims_and_strides(q_l);
        let (k_dims, k_strides) = dims_and_strides(k_l);
        let (v_dims, v_strides) = dims_and_strides(v_l);
        let (q_view, k_view, v_view) = (view::<T>(q, q_l)?, view::<T>(k, k_l)?, view::<T>(v, v_l)?);
        let q_t = flash_attn::Tensor::strided(&q_view, q_dims, q_strides);
        let k_t = flash_attn::Tensor::strided(&k_view, k_dims, k_strides);
        let v_t = flash_attn::Tensor::strided(&v_view, v_dims, v_strides);

        // The outputs, in candle's allocations on candle's stream.
        let o_shape = q_l.shape().clone();
        let [batch, seqlen_q, heads_q, _] = q_dims;
        let lse_shape: Shape = match self.kind {
            Kind::Varlen { .. } => (heads_q, seqlen_q).into(),
            _ => (batch, heads_q, seqlen_q).into(),
        };
        // Safety: every element of o and the LSE is written by the kernels.
        let mut o = unsafe { device.alloc::<T>(o_shape.elem_count())? };
        let mut lse = unsafe { device.alloc::<f32>(lse_shape.elem_count())? };

        // ALiBi slopes stay where they are: a read lock on their storage
        // for the length of the call.
        let alibi_guard = self.alibi_slopes.as_ref().map(|a| a.storage_and_layout());
        let alibi_view = match &alibi_guard {
            None => None,
            Some((storage, layout)) => match &**storage {
                Storage::Cuda(s) => {
                    let Some((start, end)) = layout.contiguous_offsets() else {
                        bail!("flash-attn-candle: alibi_slopes must be contiguous")
                    };
                    Some(s.as_cuda_slice::<f32>()?.slice(start..end))
                }
                _ => bail!("flash-attn-candle: alibi_slopes must be a CUDA tensor"),
            },
        };
        let params = AttentionParams {
            causal: self.params.causal,
            softmax_scale: Some(self.params.softmax_scale),
            window: self.params.window,
            softcap: self.params.softcap,
            alibi_slopes: alibi_view.as_ref().map(DeviceView::from),
            num_splits: self.num_splits,
            deterministic: false,
        };

        {
            let o_t = flash_attn::TensorMut::new(&mut o, q_dims);
            match &self.kind {
                Kind::Dense => {
                    attention.forward_into(q_t, k_t, v_t, o_t, &mut lse, &params, &stream).map_err(fa)?;
                }
                Kind::Varlen { cu_seqlens_q, cu_seqlens_k } => {
                    stream.context().bind_to_thread().map_err(driver)?;
                    let cu_q = SeqOffsets::new(cu_seqlens_q).map_err(fa)?;
                    let cu_k = SeqOffsets::new(cu_seqlens_k).map_err(fa)?;
                    attention
                        .forward_varlen_into(q_t, k_t, v_t, o_t, &mut lse, &cu_q, &cu_k, &params, &stream)
                        .map_err(fa)?;
                }
                Kind::KvCache { cache_seqlens, block_table } => {
                    stream.context().bind_to_thread().map_err(driver)?;
                    let seqlens = CacheSeqlens::new(cache_seqlens).map_err(fa)?;
                    let table = match block_table {
                        Some((table, pages_per_seq)) => Some(BlockTable::new(table, *pages_per_seq).map_err(fa)?),
                        None => None,
                    };
                    // Appending: the caches are written through their device
                    // addresses (candle gives custom ops no `&mut` to a
                    // tensor's storage other than one in-place destination).
                    // The guards order those writes after earlier work on
                    // the caches, as cudarc does for reads.
                    let (k_cache_ptr, _k_order) = k.as_cuda_slice::<T>()?.device_ptr(&stream);
                    let (v_cache_ptr, _v_order) = v.as_cuda_slice::<T>()?.device_ptr(&stream);
                    let new_views = match &new_kv {
                        Some(NewKv { k: (k_new, k_new_l), v: (v_new, v_new_l) }) => {
                            Some(((view::<T>(k_new, k_new_l)?, *k_new_l), (view::<T>(v_new, v_new_l)?, *v_new_l)))
                        }
                        None => None,
                    };
                    let mut cache = match &new_views {
                        None => KvCache::new(k_t, v_t, &seqlens),
                        Some(((k_new, k_new_l), (v_new, v_new_l))) => {
                            let raw =
                                |ptr: u64, storage: &CudaStorage, layout: &Layout| -> Result<DeviceViewMut<'_, T>> {
                                    let len = storage.as_cuda_slice::<T>()?.len() - layout.start_offset();
                                    let addr = ptr + (layout.start_offset() * std::mem::size_of::<T>()) as u64;
                                    // Safety: the storage's memory from the layout's start on, alive
                                    // while the storage's read guard is held (for the whole call).
                                    Ok(unsafe { DeviceViewMut::from_raw(addr, len) })
                                };
                            let (kn_dims, kn_strides) = dims_and_strides(k_new_l);
                            let (vn_dims, vn_strides) = dims_and_strides(v_new_l);
                            KvCache::appending(
                                flash_attn::TensorMut::strided(raw(k_cache_ptr, k, k_l)?, k_dims, k_strides),
                                flash_attn::TensorMut::strided(raw(v_cache_ptr, v, v_l)?, v_dims, v_strides),
                                flash_attn::Tensor::strided(k_new, kn_dims, kn_strides),
                                flash_attn::Tensor::strided(v_new, vn_dims, vn_strides),
                                &seqlens,
                            )
                        }
                    };
                    if let Some(table) = &table {
                        cache = cache.paged(table);
                    }
                    let ordinal = stream.context().ordinal();
                    WORKSPACES
                        .with(|w| {
                            let mut workspaces = w.borrow_mut();
                            let workspace = workspaces.entry(ordinal).or_insert_with(Workspace::new);
                            attention.forward_kvcache_into(q_t, cache, o_t, &mut lse, &params, workspace, &stream)
                        })
                        .map_err(fa)?;
                }
            }
        }
        drop(alibi_guard);

        Ok(Outputs {
            o: CudaStorage::wrap_cuda_slice(o, device.clone()),
            o_shape,
            lse: CudaStorage::wrap_cuda_slice(lse, device),
            lse_shape,
        })
    }

    /// The call on three tensors, returning both outputs as tensors (no
    /// backward).
    pub(crate) fn forward_with_lse(&self, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        let (q_s, q_l) = q.storage_and_layout();
        let (k_s, k_l) = k.storage_and_layout();
        let (v_s, v_l) = v.storage_and_layout();
        let (Storage::Cuda(q_s), Storage::Cuda(k_s), Storage::Cuda(v_s)) = (&*q_s, &*k_s, &*v_s) else {
            bail!("flash-attn-candle: q, k and v must be CUDA tensors")
        };
        let out = self.run((q_s, q_l), (k_s, k_l), (v_s, v_l), None)?;
        let o = Tensor::from_storage(Storage::Cuda(out.o), out.o_shape, BackpropOp::none(), false);
        let lse = Tensor::from_storage(Storage::Cuda(out.lse), out.lse_shape, BackpropOp::none(), false);
        Ok((o, lse))
    }
}

impl FlashAttnOp {
    /// A KV-cache call that first appends `k_new`, `v_new` to the caches
    /// `k_cache`, `v_cache` (in place), returning `(o, lse)`.
    pub(crate) fn append_with_lse(
        &self,
        q: &Tensor,
        k_cache: &Tensor,
        v_cache: &Tensor,
        k_new: &Tensor,
        v_new: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        let guards = [q, k_cache, v_cache, k_new, v_new].map(|t| t.storage_and_layout());
        let mut cuda = Vec::with_capacity(5);
        for (storage, layout) in &guards {
            match &**storage {
                Storage::Cuda(s) => cuda.push((s, *layout)),
                _ => bail!("flash-attn-candle: q, the caches and the new keys and values must be CUDA tensors"),
            }
        }
        let new_kv = NewKv { k: cuda[3], v: cuda[4] };
        let out = self.run(cuda[0], cuda[1], cuda[2], Some(new_kv))?;
        let o = Tensor::from_storage(Storage::Cuda(out.o), out.o_shape, BackpropOp::none(), false);
        let lse = Tensor::from_storage(Storage::Cuda(out.lse), out.lse_shape, BackpropOp::none(), false);
        Ok((o, lse))
    }
}

/// The keys and values a KV-cache call appends.
pub(crate) struct NewKv<'a> {
    pub k: (&'a CudaStorage, &'a Layout),
    pub v: (&'a CudaStorage, &'a Layout),
}

impl candle_core::CustomOp3 for FlashAttnOp {
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
        let out = self.run((q, q_l), (k, k_l), (v, v_l), None)?;
        Ok((out.o, out.o_shape))
    }
}

#[cfg(test)]
mod tests {
    use super::dims_and_strides;
    use candle_core::Layout;

    #[test]
    fn packed_tensors_are_batch_one_and_size_one_dims_get_contiguous_strides() {
        // [total, heads, d] contiguous: [1, total, heads, d].
        let (d, s) = dims_and_strides(&Layout::contiguous((10, 4, 64)));
        assert_eq!((d, s), ([1, 10, 4, 64], [2560, 256, 64, 1]));
        // q of a fused qkv projection, [2, 5, 4, 64] of rows of 12 heads.
        let l = Layout::contiguous((2, 5, 12, 64)).narrow(2, 4, 4).unwrap();
        assert_eq!(dims_and_strides(&l), ([2, 5, 4, 64], [3840, 768, 64, 1]));
        assert_eq!(l.start_offset(), 256);
        // One query row of a heads-major tensor (decoding): its seqlen
        // stride (64) is irrelevant, and made the contiguous one.
        let l = Layout::contiguous((3, 4, 7, 64)).transpose(1, 2).unwrap().narrow(1, 6, 1).unwrap();
        assert_eq!(l.stride(), [1792, 64, 448, 1]);
        assert_eq!(dims_and_strides(&l), ([3, 1, 4, 64], [1792, 256, 448, 1]));
    }
}

//! The custom ops: candle storages in, flash-attn's `_into` call on candle's
//! own stream, candle storages out. No copy: q, k and v are read where they
//! lie, o and the LSE are written into fresh allocations of candle's device
//! that become the returned tensors. The backward (candle's `CustomOp3::bwd`)
//! runs flash-attn's `backward_into` / `backward_varlen_into` the same way,
//! from the LSE the forward kept.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaStream, CudaView, DevicePtr, DevicePtrMut, DeviceRepr};
use candle_core::cuda_backend::{CudaDType, CudaDevice};
use candle_core::op::BackpropOp;
use candle_core::{bail, CpuStorage, CudaStorage, DType, Layout, Result, Shape, Storage, Tensor, D};
use flash_attn::{
    AttentionParams, BlockTable, CacheSeqlens, DeviceView, DeviceViewMut, FlashAttention, Gradients, KvCache,
    SeqOffsets, Workspace,
};

use crate::checks;
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
    /// Scratch of the KV-cache calls (split-KV) and of the backward, per GPU
    /// and per thread: candle's device stream is the per-thread default
    /// stream, so a thread's calls are ordered on one stream and may reuse
    /// one workspace.
    static WORKSPACES: RefCell<HashMap<usize, Workspace>> = RefCell::new(HashMap::new());
}

fn with_workspace<R>(stream: &CudaStream, f: impl FnOnce(&mut Workspace) -> R) -> R {
    let ordinal = stream.context().ordinal();
    WORKSPACES.with(|w| f(w.borrow_mut().entry(ordinal).or_insert_with(Workspace::new)))
}

/// [`poison_outputs`]'s state: 0 not yet read from the environment, 1 off,
/// 2 on.
static POISON: AtomicU8 = AtomicU8::new(0);

/// Whether every output this crate allocates (o, the log-sum-exp, dQ, dK,
/// dV) is filled with NaN before the kernels run, so that an element they
/// leave unwritten shows as NaN rather than as whatever the memory held.
/// Off by default, or on with `FLASH_ATTN_CANDLE_POISON=1` in the
/// environment (read at the first call); this call overrides both, for every
/// thread. For tests, and for ruling this crate out when a model's outputs
/// look wrong: it costs one memset per output.
pub fn poison_outputs(on: bool) {
    POISON.store(if on { 2 } else { 1 }, Ordering::Relaxed);
}

fn poison() -> bool {
    match POISON.load(Ordering::Relaxed) {
        0 => {
            let on = std::env::var_os("FLASH_ATTN_CANDLE_POISON").is_some_and(|v| v == "1");
            // A concurrent `poison_outputs` wins.
            let _ = POISON.compare_exchange(0, if on { 2 } else { 1 }, Ordering::Relaxed, Ordering::Relaxed);
            POISON.load(Ordering::Relaxed) == 2
        }
        state => state == 2,
    }
}

/// `slice` filled with all-ones bytes (NaN in f16, bf16 and f32) on
/// `stream`, when [`poison_outputs`] is on.
fn poison_fill<T: DeviceRepr>(slice: &mut CudaSlice<T>, stream: &CudaStream) -> Result<()> {
    if !poison() {
        return Ok(());
    }
    let bytes = slice.len() * std::mem::size_of::<T>();
    let (ptr, _order) = slice.device_ptr_mut(stream);
    // Safety: `bytes` bytes from the start of the allocation, ordered on
    // `stream` by the guard.
    unsafe { candle_core::cuda_backend::cudarc::driver::result::memset_d8_async(ptr, 0xff, bytes, stream.cu_stream()) }
        .map_err(driver)
}

/// A fresh allocation of `len` elements on candle's device, every element of
/// which the kernels write (poisoned first when [`poison_outputs`] is on).
fn output<T: DeviceRepr>(device: &CudaDevice, len: usize) -> Result<CudaSlice<T>> {
    // Safety: the kernels write every element before anything reads it.
    let mut slice = unsafe { device.alloc::<T>(len)? };
    poison_fill(&mut slice, &device.cuda_stream())?;
    Ok(slice)
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
    /// appended) by [`FlashAttnOp::append_with_lse`]. No backward.
    KvCache { cache_seqlens: Vec<i32>, block_table: Option<(Vec<i32>, usize)> },
}

/// One attention call, as a candle `CustomOp3` over (q, k, v), with its
/// backward.
pub(crate) struct FlashAttnOp {
    pub params: Translated,
    pub alibi_slopes: Option<Tensor>,
    pub kind: Kind,
    /// Split-KV override (`None`: flash-attn's heuristic).
    pub num_splits: Option<usize>,
    /// The forward's log-sum-exp, which `cuda_fwd` keeps for the backward
    /// (and for the `_with_lse` functions): one op is one forward call.
    pub lse: Arc<Mutex<Option<Tensor>>>,
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

/// flash-attn's tensor over candle's storage, read in place.
fn read<'a, T: CudaDType + flash_attn::Element>(
    view: &'a CudaView<'_, T>,
    layout: &Layout,
) -> flash_attn::Tensor<'a, T> {
    let (dims, strides) = dims_and_strides(layout);
    flash_attn::Tensor::strided(view, dims, strides)
}

/// The storages of `tensors`, which must all be CUDA tensors, for `f`.
fn on_cuda<R>(tensors: &[&Tensor], f: impl FnOnce(&[(&CudaStorage, &Layout)]) -> Result<R>) -> Result<R> {
    let guards: Vec<_> = tensors.iter().map(|t| t.storage_and_layout()).collect();
    let mut cuda = Vec::with_capacity(guards.len());
    for (storage, layout) in &guards {
        match &**storage {
            Storage::Cuda(s) => cuda.push((s, *layout)),
            _ => bail!("flash-attn-candle: every tensor of the call must be a CUDA tensor"),
        }
    }
    f(&cuda)
}

/// A tensor over a fresh storage of this crate, outside candle's graph.
fn detached(storage: CudaStorage, shape: Shape) -> Tensor {
    Tensor::from_storage(Storage::Cuda(storage), shape, BackpropOp::none(), false)
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
    pub(crate) fn new(params: Translated, alibi_slopes: Option<Tensor>, kind: Kind) -> Self {
        Self { params, alibi_slopes, kind, num_splits: None, lse: Default::default() }
    }

    /// flash-attn's parameters, with the ALiBi slopes read in place.
    fn attention_params<'a>(&self, alibi: Option<&'a CudaView<'_, f32>>) -> AttentionParams<'a> {
        AttentionParams {
            causal: self.params.causal,
            softmax_scale: Some(self.params.softmax_scale),
            window: self.params.window,
            softcap: self.params.softcap,
            alibi_slopes: alibi.map(DeviceView::from),
            num_splits: self.num_splits,
            deterministic: false,
        }
    }

    /// Runs `f` with the ALiBi slopes' storage (a read lock on it for the
    /// length of the call) as a view, if the call has slopes.
    fn with_alibi<R>(&self, f: impl FnOnce(Option<&CudaView<'_, f32>>) -> Result<R>) -> Result<R> {
        let Some(alibi) = &self.alibi_slopes else { return f(None) };
        let (storage, layout) = alibi.storage_and_layout();
        let Storage::Cuda(s) = &*storage else { bail!("flash-attn-candle: alibi_slopes must be a CUDA tensor") };
        let Some((start, end)) = layout.contiguous_offsets() else {
            bail!("flash-attn-candle: alibi_slopes must be contiguous")
        };
        let view = s.as_cuda_slice::<f32>()?.slice(start..end);
        f(Some(&view))
    }

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

        let (q_dims, _) = dims_and_strides(q_l);
        let (k_dims, k_strides) = dims_and_strides(k_l);
        let (v_dims, v_strides) = dims_and_strides(v_l);
        let (q_view, k_view, v_view) = (view::<T>(q, q_l)?, view::<T>(k, k_l)?, view::<T>(v, v_l)?);
        let (q_t, k_t, v_t) = (read(&q_view, q_l), read(&k_view, k_l), read(&v_view, v_l));

        // The outputs, in candle's allocations on candle's stream.
        let o_shape = q_l.shape().clone();
        let [batch, seqlen_q, heads_q, _] = q_dims;
        let lse_shape: Shape = match self.kind {
            Kind::Varlen { .. } => (heads_q, seqlen_q).into(),
            _ => (batch, heads_q, seqlen_q).into(),
        };
        let mut o = output::<T>(&device, o_shape.elem_count())?;
        let mut lse = output::<f32>(&device, lse_shape.elem_count())?;

        // ALiBi slopes stay where they are.
        self.with_alibi(|alibi| {
            let params = self.attention_params(alibi);
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
                            KvCache::appending(
                                flash_attn::TensorMut::strided(raw(k_cache_ptr, k, k_l)?, k_dims, k_strides),
                                flash_attn::TensorMut::strided(raw(v_cache_ptr, v, v_l)?, v_dims, v_strides),
                                read(k_new, k_new_l),
                                read(v_new, v_new_l),
                                &seqlens,
                            )
                        }
                    };
                    if let Some(table) = &table {
                        cache = cache.paged(table);
                    }
                    with_workspace(&stream, |workspace| {
                        attention.forward_kvcache_into(q_t, cache, o_t, &mut lse, &params, workspace, &stream)
                    })
                    .map_err(fa)?;
                }
            }
            Ok(())
        })?;

        Ok(Outputs {
            o: CudaStorage::wrap_cuda_slice(o, device.clone()),
            o_shape,
            lse: CudaStorage::wrap_cuda_slice(lse, device),
            lse_shape,
        })
    }

    /// The forward's log-sum-exp of q, k and v, for a backward: the one
    /// `cuda_fwd` kept, or (an op that did not run the forward itself, see
    /// [`crate::FlashAttn`]) computed again.
    fn forward_lse(&self, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
        if let Some(lse) = self.lse.lock().unwrap_or_else(|e| e.into_inner()).clone() {
            return Ok(lse);
        }
        on_cuda(&[q, k, v], |s| {
            let out = self.run(s[0], s[1], s[2], None)?;
            Ok(detached(out.lse, out.lse_shape))
        })
    }

    /// dQ, dK and dV of the call on `q`, `k`, `v` that gave `o`, for the
    /// loss's gradient `d_o` with respect to `o`: flash-attn's backward on
    /// candle's stream, in q's, k's and v's shapes. The tensors need not be
    /// laid out for the kernels: head dims without a kernel are padded with
    /// zeros (which leaves every gradient of the kept columns as it is) and
    /// cut back, and layouts the kernels cannot read in place copied.
    pub(crate) fn backward(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        o: &Tensor,
        d_o: &Tensor,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        if let Kind::KvCache { .. } = self.kind {
            bail!("flash-attn-candle: no backward through a KV-cache call (its keys and values are the cache's)")
        }
        checks::dtypes(q.dtype(), k.dtype(), v.dtype())?;
        let head_dim = q.dim(D::Minus1)?;
        let padded = checks::kernel_head_dim(head_dim)?;
        let prepare = |name: &str, t: &Tensor| checks::prepare(name, &t.detach(), padded);
        let (q, k, v, o) = (prepare("q", q)?, prepare("k", k)?, prepare("v", v)?, prepare("o", o)?);
        // dO as candle's backward hands it over may have any strides
        // (broadcast, transposed): the kernels read it contiguous.
        let d_o = d_o.detach().to_dtype(q.dtype())?;
        let d_o = prepare("d_o", &if d_o.is_contiguous() { d_o } else { d_o.contiguous()? })?;
        if d_o.dims() != q.dims() || o.dims() != q.dims() {
            bail!(
                "flash-attn-candle: backward: o {:?} and its gradient {:?} must have q's shape {:?}",
                o.dims(),
                d_o.dims(),
                q.dims()
            )
        }
        let lse = self.forward_lse(&q, &k, &v)?;
        let (d_q, d_k, d_v) = on_cuda(&[&q, &k, &v, &o, &lse, &d_o], |s| match q.dtype() {
            DType::F16 => self.backward_t::<half::f16>(s),
            DType::BF16 => self.backward_t::<half::bf16>(s),
            dt => bail!("flash-attn-candle: flash-attn is only supported for f16/bf16 ({dt:?})"),
        })?;
        let (d_q, d_k, d_v) =
            (detached(d_q, q.shape().clone()), detached(d_k, k.shape().clone()), detached(d_v, v.shape().clone()));
        if padded == head_dim {
            return Ok((d_q, d_k, d_v));
        }
        let cut = |t: Tensor| t.narrow(D::Minus1, 0, head_dim)?.contiguous();
        Ok((cut(d_q)?, cut(d_k)?, cut(d_v)?))
    }

    /// [`Self::backward`] on storages laid out for the kernels: q, k, v, o,
    /// the LSE and dO, in that order. Returns dQ, dK and dV.
    fn backward_t<T: flash_attn::Element + CudaDType + DeviceRepr>(
        &self,
        s: &[(&CudaStorage, &Layout)],
    ) -> Result<(CudaStorage, CudaStorage, CudaStorage)> {
        let [(q, q_l), (k, k_l), (v, v_l), (o, o_l), (lse, lse_l), (d_o, d_o_l)] = *s else {
            bail!("flash-attn-candle: backward: six storages expected")
        };
        let device = q.device().clone();
        let stream = device.cuda_stream();
        let attention = flash_attention_for(&device)?;
        let (q_dims, k_dims) = (dims_and_strides(q_l).0, dims_and_strides(k_l).0);
        let (q_view, k_view, v_view) = (view::<T>(q, q_l)?, view::<T>(k, k_l)?, view::<T>(v, v_l)?);
        let (o_view, d_o_view) = (view::<T>(o, o_l)?, view::<T>(d_o, d_o_l)?);
        let lse_view = view::<f32>(lse, lse_l)?;
        let mut d_q = output::<T>(&device, q_l.shape().elem_count())?;
        let mut d_k = output::<T>(&device, k_l.shape().elem_count())?;
        let mut d_v = output::<T>(&device, v_l.shape().elem_count())?;
        self.with_alibi(|alibi| {
            let params = self.attention_params(alibi);
            let (q_t, k_t, v_t) = (read(&q_view, q_l), read(&k_view, k_l), read(&v_view, v_l));
            let (o_t, d_o_t) = (read(&o_view, o_l), read(&d_o_view, d_o_l));
            let gradients = Gradients {
                d_q: flash_attn::TensorMut::new(&mut d_q, q_dims),
                d_k: flash_attn::TensorMut::new(&mut d_k, k_dims),
                d_v: flash_attn::TensorMut::new(&mut d_v, k_dims),
            };
            match &self.kind {
                Kind::Dense => with_workspace(&stream, |workspace| {
                    attention
                        .backward_into(q_t, k_t, v_t, o_t, &lse_view, d_o_t, gradients, &params, workspace, &stream)
                })
                .map_err(fa)?,
                Kind::Varlen { cu_seqlens_q, cu_seqlens_k } => {
                    stream.context().bind_to_thread().map_err(driver)?;
                    let cu_q = SeqOffsets::new(cu_seqlens_q).map_err(fa)?;
                    let cu_k = SeqOffsets::new(cu_seqlens_k).map_err(fa)?;
                    with_workspace(&stream, |workspace| {
                        attention.backward_varlen_into(
                            q_t, k_t, v_t, o_t, &lse_view, d_o_t, gradients, &cu_q, &cu_k, &params, workspace, &stream,
                        )
                    })
                    .map_err(fa)?
                }
                Kind::KvCache { .. } => bail!("flash-attn-candle: no backward through a KV-cache call"),
            };
            Ok(())
        })?;
        Ok((
            CudaStorage::wrap_cuda_slice(d_q, device.clone()),
            CudaStorage::wrap_cuda_slice(d_k, device.clone()),
            CudaStorage::wrap_cuda_slice(d_v, device),
        ))
    }
}

impl FlashAttnOp {
    /// A KV-cache call that first appends `k_new`, `v_new` to the caches
    /// `k_cache`, `v_cache` (in place), returning `(o, lse)`, neither with a
    /// gradient.
    pub(crate) fn append_with_lse(
        &self,
        q: &Tensor,
        k_cache: &Tensor,
        v_cache: &Tensor,
        k_new: &Tensor,
        v_new: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        let inputs = [q, k_cache, v_cache, k_new, v_new];
        let out = on_cuda(&inputs, |s| self.run(s[0], s[1], s[2], Some(NewKv { k: s[3], v: s[4] })))?;
        let o = without_gradient(detached(out.o, out.o_shape), &inputs, "the output of a KV-cache call")?;
        let lse = without_gradient(detached(out.lse, out.lse_shape), &inputs, "the log-sum-exp of a KV-cache call")?;
        Ok((o, lse))
    }
}

/// The keys and values a KV-cache call appends.
pub(crate) struct NewKv<'a> {
    pub k: (&'a CudaStorage, &'a Layout),
    pub v: (&'a CudaStorage, &'a Layout),
}

/// `value`, an output with no gradient, in candle's graph when an input is
/// (`inputs` tracked): then a loss that depends on it fails in candle's
/// backward with an error naming it (`what`), rather than silently getting
/// no gradient through it.
pub(crate) fn without_gradient(value: Tensor, inputs: &[&Tensor], what: &'static str) -> Result<Tensor> {
    match inputs.iter().find(|t| t.track_op()) {
        None => Ok(value),
        Some(input) => input.apply_op1(NoGradient { value, what }),
    }
}

/// The custom op of [`without_gradient`]: a copy of `value` whatever its
/// argument, whose backward is an error.
struct NoGradient {
    value: Tensor,
    what: &'static str,
}

impl candle_core::CustomOp1 for NoGradient {
    fn name(&self) -> &'static str {
        "flash-attn-no-gradient"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        bail!("flash-attn-candle: no cpu support")
    }

    fn cuda_fwd(&self, _: &CudaStorage, _: &Layout) -> Result<(CudaStorage, Shape)> {
        let (storage, layout) = self.value.storage_and_layout();
        let Storage::Cuda(s) = &*storage else { bail!("flash-attn-candle: {} is not on the GPU", self.what) };
        Ok((s.try_clone(layout)?, layout.shape().clone()))
    }

    fn bwd(&self, _: &Tensor, _: &Tensor, _: &Tensor) -> Result<Option<Tensor>> {
        bail!(
            "flash-attn-candle: {} has no gradient: a loss that depends on it cannot be differentiated through it",
            self.what
        )
    }
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
        *self.lse.lock().unwrap_or_else(|e| e.into_inner()) = Some(detached(out.lse, out.lse_shape));
        Ok((out.o, out.o_shape))
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        o: &Tensor,
        d_o: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (d_q, d_k, d_v) = self.backward(q, k, v, o, d_o)?;
        Ok((Some(d_q), Some(d_k), Some(d_v)))
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

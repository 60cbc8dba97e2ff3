//! The `cust` door: `DeviceSlice`/`DeviceBuffer` as device views, `Stream`
//! as a launch stream, `cust`'s errors as ours. `cust` buffers hold
//! `half` 1.8 values, which are therefore elements too.

use cust::memory::{DeviceBuffer, DeviceCopy, DeviceSlice};
use cust::stream::Stream;

use crate::attention::FlashAttention;
use crate::call::{Call, Problem};
use crate::context::ContextRef;
use crate::error::{Error, Result};
use crate::kvcache::KvCache;
use crate::limits::MAX_SPAN;
use crate::memory::{DeviceView, DeviceViewMut};
use crate::plan::OutputAddrs;
use crate::stream::sealed::{LaunchOn, Sealed};
use crate::stream::StreamOrder;
use crate::tensor::{Element, Gradients, Tensor, TensorMut};
use crate::validate::{validate, validate_kvcache, validate_varlen, AttentionParams, Layout, OutputBuffers};
use crate::varlen::SeqOffsets;
use crate::workspace::Workspace;

impl<'a, T: DeviceCopy> From<&'a DeviceSlice<T>> for DeviceView<'a, T> {
    fn from(slice: &'a DeviceSlice<T>) -> Self {
        // SAFETY: the slice is device memory of `slice.len()` elements,
        // borrowed for the view's lifetime.
        unsafe { DeviceView::from_raw(slice.as_device_ptr().as_raw(), slice.len()) }
    }
}

impl<'a, T: DeviceCopy> From<&'a DeviceBuffer<T>> for DeviceView<'a, T> {
    fn from(buffer: &'a DeviceBuffer<T>) -> Self {
        DeviceView::from(&**buffer)
    }
}

impl<'a, T: DeviceCopy> From<&'a mut DeviceSlice<T>> for DeviceViewMut<'a, T> {
    fn from(slice: &'a mut DeviceSlice<T>) -> Self {
        // SAFETY: as for `DeviceView`, borrowed mutably.
        unsafe { DeviceViewMut::from_raw(slice.as_device_ptr().as_raw(), slice.len()) }
    }
}

impl<'a, T: DeviceCopy> From<&'a mut DeviceBuffer<T>> for DeviceViewMut<'a, T> {
    fn from(buffer: &'a mut DeviceBuffer<T>) -> Self {
        DeviceViewMut::from(&mut **buffer)
    }
}

impl Sealed for Stream {
    fn launch_on(&self) -> LaunchOn<'_> {
        LaunchOn {
            raw: self.as_inner().cast(),
            #[cfg(feature = "cudarc")]
            cudarc: None,
            _stream: std::marker::PhantomData,
        }
    }
}

impl From<cust::error::CudaError> for Error {
    fn from(e: cust::error::CudaError) -> Self {
        Error::DriverCall { call: "cust", code: e as u32, name: e.to_string() }
    }
}

/// What the allocating attention calls return.
pub struct Output<T: Element + DeviceCopy> {
    /// Contiguous, with q's shape: `[batch, seqlen_q, heads_q, head_dim]`
    /// (packed `[1, total_q, heads_q, head_dim]` for variable lengths).
    pub o: DeviceBuffer<T>,
    /// Natural log-sum-exp of each row's scaled scores, `[batch, heads_q,
    /// seqlen_q]` (`[heads_q, total_q]` for variable lengths); `-inf` for a
    /// row that sees no key.
    pub lse: DeviceBuffer<f32>,
    /// The sizes of the problem.
    pub problem: Problem,
    /// Keeps the context of `o` and `lse` alive until they are freed.
    _context: ContextRef,
}

/// What [`FlashAttention::backward`] returns.
pub struct BackwardOutput<T: Element + DeviceCopy> {
    /// Contiguous: dQ with q's shape, dK and dV with k's.
    pub d_q: DeviceBuffer<T>,
    pub d_k: DeviceBuffer<T>,
    pub d_v: DeviceBuffer<T>,
    /// The sizes of the problem.
    pub problem: Problem,
    /// Keeps the context of the gradients alive until they are freed.
    _context: ContextRef,
}

/// The calls that allocate their outputs, as `cust` buffers (in the
/// kernels' context).
impl FlashAttention {
    /// [`backward_into`](Self::backward_into) into freshly allocated
    /// gradients, contiguous: dQ with q's shape, dK and dV with k's and
    /// v's. An
    /// invalid call returns its error before any kernel runs (the
    /// gradients' buffers, allocated first, are freed).
    #[allow(clippy::too_many_arguments)]
    pub fn backward<'a, T: Element + DeviceCopy>(
        &self,
        q: Tensor<'_, T>,
        k: Tensor<'_, T>,
        v: Tensor<'_, T>,
        o: Tensor<'_, T>,
        lse: impl Into<DeviceView<'a, f32>>,
        d_o: Tensor<'_, T>,
        params: &AttentionParams,
        workspace: &mut Workspace,
        stream: &Stream,
    ) -> Result<BackwardOutput<T>> {
        let allocate = |like: &Tensor<'_, T>| {
            let layout = Layout::contiguous(like.layout.shape);
            let Some(n) = layout.elements().filter(|&n| n <= MAX_SPAN) else {
                return Err(Error::TensorTooLarge {
                    tensor: "a gradient",
                    shape: layout.shape,
                    strides: layout.strides,
                });
            };
            // SAFETY: every element is written by the backward before it is
            // read (the tests poison outputs to check it); on an error the
            // buffer is freed unread.
            self.context().with_current(|| unsafe { DeviceBuffer::<T>::uninitialized(n.max(1)) }).map_err(Error::from)
        };
        let (mut d_q, mut d_k, mut d_v) = (allocate(&q)?, allocate(&k)?, allocate(&v)?);
        let gradients = Gradients {
            d_q: TensorMut::new(&mut d_q, q.layout.shape),
            d_k: TensorMut::new(&mut d_k, k.layout.shape),
            d_v: TensorMut::new(&mut d_v, v.layout.shape),
        };
        let problem = self.backward_into(q, k, v, o, lse, d_o, gradients, params, workspace, stream)?;
        Ok(BackwardOutput { d_q, d_k, d_v, problem, _context: self.context().clone() })
    }

    /// Attention of `q` over `k`, `v`, into freshly allocated outputs,
    /// launched on `stream` (the result is ready once the stream is).
    ///
    /// Split-KV scratch, when the heuristic or `params.num_splits` splits,
    /// is allocated and freed on `stream` (stream-ordered).
    pub fn forward<T: Element + DeviceCopy>(
        &self,
        q: Tensor<'_, T>,
        k: Tensor<'_, T>,
        v: Tensor<'_, T>,
        params: &AttentionParams,
        stream: &Stream,
    ) -> Result<Output<T>> {
        let call = validate(T::DTYPE, &q.placed("q"), &k.placed("k"), &v.placed("v"), OutputBuffers::Allocate, params)?;
        let mut order = StreamOrder::new(stream.launch_on());
        order.inputs(&q.memory, &k.memory, &v.memory, params)?;
        self.allocate_and_run(&call, q.layout.shape, None, stream)
    }

    /// Attention over a variable-length batch: sequences packed one after
    /// another, q `[total_q, heads_q, d]` and k, v `[total_k, heads_kv, d]`
    /// (see [`Tensor::packed`]), sequence `b` being tokens
    /// `cu_seqlens_q[b]..cu_seqlens_q[b + 1]` of q and
    /// `cu_seqlens_k[b]..cu_seqlens_k[b + 1]` of k and v. Causal masks and
    /// windows align each sequence's bottom-right corner, as with dense
    /// batches. Returns o packed like q and the LSE as `[heads_q, total_q]`.
    /// Split-KV scratch as in [`forward`](Self::forward).
    ///
    /// ```no_run
    /// use flash_attn::{AttentionParams, FlashAttention, SeqOffsets, Tensor};
    /// use flash_attn::half1::f16;
    /// use flash_attn::cust::memory::DeviceBuffer;
    /// use flash_attn::cust::stream::{Stream, StreamFlags};
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let _context = flash_attn::cust::quick_init()?;
    /// let attention = FlashAttention::new()?;
    /// let stream = Stream::new(StreamFlags::NON_BLOCKING, None)?;
    /// // Three prompts of 100, 7 and 2000 tokens in one batch.
    /// let cu_seqlens = SeqOffsets::from_lengths(&[100, 7, 2000])?;
    /// let (heads, d) = (16, 64);
    /// let tokens = vec![f16::from_f32(0.1); cu_seqlens.total() * heads * d];
    /// let (q, k, v) = (DeviceBuffer::from_slice(&tokens)?, DeviceBuffer::from_slice(&tokens)?, DeviceBuffer::from_slice(&tokens)?);
    /// let shape = [cu_seqlens.total(), heads, d];
    /// let out = attention.forward_varlen(
    ///     Tensor::packed(&q, shape),
    ///     Tensor::packed(&k, shape),
    ///     Tensor::packed(&v, shape),
    ///     &cu_seqlens,
    ///     &cu_seqlens,
    ///     &AttentionParams { causal: true, ..Default::default() },
    ///     &stream,
    /// )?;
    /// stream.synchronize()?;
    /// assert_eq!(out.lse.len(), heads * cu_seqlens.total());
    /// # Ok(()) }
    /// ```
    #[allow(clippy::too_many_arguments)]
    pub fn forward_varlen<T: Element + DeviceCopy>(
        &self,
        q: Tensor<'_, T>,
        k: Tensor<'_, T>,
        v: Tensor<'_, T>,
        cu_seqlens_q: &SeqOffsets,
        cu_seqlens_k: &SeqOffsets,
        params: &AttentionParams,
        stream: &Stream,
    ) -> Result<Output<T>> {
        let (q_at, k_at, v_at) = (q.placed("q"), k.placed("k"), v.placed("v"));
        let (cu_q, cu_k) = (cu_seqlens_q.arg(), cu_seqlens_k.arg());
        let call = validate_varlen(T::DTYPE, &q_at, &k_at, &v_at, cu_q, cu_k, OutputBuffers::Allocate, params)?;
        let mut order = StreamOrder::new(stream.launch_on());
        order.inputs(&q.memory, &k.memory, &v.memory, params)?;
        self.allocate_and_run(&call, q.layout.shape, None, stream)
    }

    /// Attention of `q` (`[batch, seqlen_q, heads_q, d]`) over a KV cache,
    /// after appending the cache's new keys and values if it has any (see
    /// [`KvCache`]). Batch `b` sees its `cache_seqlens[b]` cached keys plus
    /// the appended ones; causal masks and windows align to that end (the
    /// last query row is the last key). Returns o with `q`'s shape and the
    /// LSE as `[batch, heads_q, seqlen_q]`.
    ///
    /// Scratch comes from `workspace`, grown on demand: in a decode loop,
    /// pass the same one every step and only the first step allocates.
    ///
    /// ```no_run
    /// use flash_attn::{AttentionParams, CacheSeqlens, FlashAttention, KvCache, Tensor, TensorMut, Workspace};
    /// use flash_attn::half1::f16;
    /// use flash_attn::cust::memory::DeviceBuffer;
    /// use flash_attn::cust::stream::{Stream, StreamFlags};
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let _context = flash_attn::cust::quick_init()?;
    /// let attention = FlashAttention::new()?;
    /// let stream = Stream::new(StreamFlags::NON_BLOCKING, None)?;
    /// let (batch, capacity, heads_q, heads_kv, d) = (4, 8192, 32, 8, 128);
    /// let cache_len = batch * capacity * heads_kv * d;
    /// let mut k_cache = DeviceBuffer::from_slice(&vec![f16::ZERO; cache_len])?;
    /// let mut v_cache = DeviceBuffer::from_slice(&vec![f16::ZERO; cache_len])?;
    /// let q = DeviceBuffer::from_slice(&vec![f16::ONE; batch * heads_q * d])?;
    /// let new_kv = vec![f16::ONE; batch * heads_kv * d];
    /// let (k_new, v_new) = (DeviceBuffer::from_slice(&new_kv)?, DeviceBuffer::from_slice(&new_kv)?);
    /// let mut workspace = Workspace::new();
    /// let mut lengths = vec![0i32; batch];
    /// for _step in 0..16 {
    ///     let cache_seqlens = CacheSeqlens::new(&lengths)?;
    ///     let cache_shape = [batch, capacity, heads_kv, d];
    ///     let cache = KvCache::appending(
    ///         TensorMut::new(&mut k_cache, cache_shape),
    ///         TensorMut::new(&mut v_cache, cache_shape),
    ///         Tensor::new(&k_new, [batch, 1, heads_kv, d]),
    ///         Tensor::new(&v_new, [batch, 1, heads_kv, d]),
    ///         &cache_seqlens,
    ///     );
    ///     let params = AttentionParams { causal: true, ..Default::default() };
    ///     let out = attention.forward_kvcache(Tensor::new(&q, [batch, 1, heads_q, d]), cache, &params, &mut workspace, &stream)?;
    ///     stream.synchronize()?;
    ///     # let _ = out;
    ///     lengths.iter_mut().for_each(|n| *n += 1);
    /// }
    /// # Ok(()) }
    /// ```
    pub fn forward_kvcache<T: Element + DeviceCopy>(
        &self,
        q: Tensor<'_, T>,
        mut cache: KvCache<'_, T>,
        params: &AttentionParams,
        workspace: &mut Workspace,
        stream: &Stream,
    ) -> Result<Output<T>> {
        let call = validate_kvcache(T::DTYPE, &q.placed("q"), &cache.args(), OutputBuffers::Allocate, params)?;
        let mut order = StreamOrder::new(stream.launch_on());
        order.read("q", &q.memory)?;
        cache.order(&mut order)?;
        order.params(params)?;
        self.allocate_and_run(&call, q.layout.shape, Some(workspace), stream)
    }

    /// Plans a call whose outputs it allocates, then allocates them (o
    /// contiguous of `shape`, the LSE rows contiguous) and launches.
    fn allocate_and_run<T: Element + DeviceCopy>(
        &self,
        call: &Call,
        shape: [usize; 4],
        workspace: Option<&mut Workspace>,
        stream: &Stream,
    ) -> Result<Output<T>> {
        self.run(call, workspace, stream.as_inner().cast(), |_| {
            let [batch, seqlen, heads, head_dim] = shape;
            // Validation checked that these sizes fit.
            let o = unsafe { DeviceBuffer::<T>::uninitialized(batch * seqlen * heads * head_dim)? };
            let lse = unsafe { DeviceBuffer::<f32>::uninitialized(batch * seqlen * heads)? };
            let addrs = OutputAddrs { o: o.as_device_ptr().as_raw(), lse: lse.as_device_ptr().as_raw() };
            Ok((addrs, Output { o, lse, problem: call.problem, _context: self.context().clone() }))
        })
    }
}

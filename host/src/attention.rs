//! The attention entry points: each validates its call once
//! ([`crate::validate`]), plans it once ([`crate::plan`]), allocates its
//! outputs if it returns them, and launches ([`crate::launch`]).

use cust::memory::{DeviceBuffer, DeviceSlice};
use cust::stream::Stream;
use flash_attn_abi::kernels::AttentionKernel;

use crate::call::Call;
use crate::call::Problem;
use crate::context::ContextRef;
use crate::error::Result;
use crate::kvcache::KvCache;
use crate::launch::launch;
use crate::module::{KernelModule, KernelResources};
use crate::plan::{plan, OutputAddrs, Plan};
use crate::tensor::{Element, Tensor, TensorMut};
use crate::validate::{validate, validate_kvcache, validate_varlen, AttentionParams, OutputBuffers};
use crate::varlen::SeqOffsets;
use crate::workspace::{Scratch, Workspace};

/// What the allocating attention calls return.
pub struct Output<T: Element> {
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

/// The kernels, loaded into the CUDA context current at [`FlashAttention::new`].
///
/// It keeps that context alive (a reference on the device's primary
/// context, which `cust::quick_init` makes) until it is dropped, so the
/// context may be dropped before it. A context made with `cuCtxCreate` has
/// no reference count: destroy such a context only after everything this
/// crate made in it.
pub struct FlashAttention {
    module: KernelModule,
}

impl FlashAttention {
    /// Loads the kernels into the current context and reads the GPU's SM
    /// count and the kernels' occupancy (for the split-KV heuristic). Fails
    /// with [`Error::UnsupportedDevice`] below compute capability 8.0 and
    /// [`Error::NoContext`] when no context is current.
    pub fn new() -> Result<Self> {
        Ok(Self { module: KernelModule::load()? })
    }

    /// The GPU's number of streaming multiprocessors.
    pub fn sm_count(&self) -> usize {
        self.module.sm_count()
    }

    /// Every attention kernel as the driver compiled the PTX for this GPU,
    /// sorted by name. The build checks the PTX with the ptxas it installs
    /// (`cargo xtask build-ptx`); the driver's own compiler, which produces
    /// the code that runs, may be another version and allocate registers
    /// otherwise.
    ///
    /// ```no_run
    /// # fn main() -> flash_attn::Result<()> {
    /// let _context = flash_attn::cust::quick_init()?;
    /// let attention = flash_attn::FlashAttention::new()?;
    /// for kernel in attention.kernel_resources()? {
    ///     println!("{}: {} registers, {} B of local memory", kernel.name, kernel.registers, kernel.local_bytes);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn kernel_resources(&self) -> Result<Vec<KernelResources>> {
        self.module.resources()
    }

    /// Attention of `q` over `k`, `v`, into freshly allocated outputs,
    /// launched on `stream` (the result is ready once the stream is).
    ///
    /// Split-KV scratch, when the heuristic or `params.num_splits` splits,
    /// is allocated and freed on `stream` (stream-ordered).
    pub fn forward<T: Element>(
        &self,
        q: Tensor<'_, T>,
        k: Tensor<'_, T>,
        v: Tensor<'_, T>,
        params: &AttentionParams,
        stream: &Stream,
    ) -> Result<Output<T>> {
        let call = validate(T::DTYPE, &q.placed("q"), &k.placed("k"), &v.placed("v"), OutputBuffers::Allocate, params)?;
        self.allocate_and_run(&call, q.layout.shape, &mut Scratch::per_call(stream), stream)
    }

    /// Attention into caller-provided outputs: `o` with `q`'s shape, and
    /// `lse` of at least `batch * heads_q * seqlen_q` f32. Split-KV scratch
    /// as in [`forward`](Self::forward).
    #[allow(clippy::too_many_arguments)]
    pub fn forward_into<T: Element>(
        &self,
        q: Tensor<'_, T>,
        k: Tensor<'_, T>,
        v: Tensor<'_, T>,
        o: TensorMut<'_, T>,
        lse: &mut DeviceSlice<f32>,
        params: &AttentionParams,
        stream: &Stream,
    ) -> Result<Problem> {
        let (o, lse_addr) = (o.placed("o"), lse.as_device_ptr().as_raw());
        let outputs = OutputBuffers::Given { o: &o, lse_addr, lse_len: lse.len() };
        let call = validate(T::DTYPE, &q.placed("q"), &k.placed("k"), &v.placed("v"), outputs, params)?;
        self.run(&call, OutputAddrs { o: o.addr, lse: lse_addr }, &mut Scratch::per_call(stream), stream)
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
    /// use flash_attn::{AttentionParams, FlashAttention, SeqOffsets, Tensor, f16};
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
    pub fn forward_varlen<T: Element>(
        &self,
        q: Tensor<'_, T>,
        k: Tensor<'_, T>,
        v: Tensor<'_, T>,
        cu_seqlens_q: &SeqOffsets,
        cu_seqlens_k: &SeqOffsets,
        params: &AttentionParams,
        stream: &Stream,
    ) -> Result<Output<T>> {
        let (q, k, v) = (q.placed("q"), k.placed("k"), v.placed("v"));
        let (cu_q, cu_k) = (cu_seqlens_q.arg(), cu_seqlens_k.arg());
        let call = validate_varlen(T::DTYPE, &q, &k, &v, cu_q, cu_k, OutputBuffers::Allocate, params)?;
        self.allocate_and_run(&call, q.layout.shape, &mut Scratch::per_call(stream), stream)
    }

    /// [`forward_varlen`](Self::forward_varlen) into caller-provided
    /// outputs: `o` with `q`'s shape and `lse` of at least `heads_q *
    /// total_q` f32.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_varlen_into<T: Element>(
        &self,
        q: Tensor<'_, T>,
        k: Tensor<'_, T>,
        v: Tensor<'_, T>,
        o: TensorMut<'_, T>,
        lse: &mut DeviceSlice<f32>,
        cu_seqlens_q: &SeqOffsets,
        cu_seqlens_k: &SeqOffsets,
        params: &AttentionParams,
        stream: &Stream,
    ) -> Result<Problem> {
        let (q, k, v) = (q.placed("q"), k.placed("k"), v.placed("v"));
        let (o, lse_addr) = (o.placed("o"), lse.as_device_ptr().as_raw());
        let outputs = OutputBuffers::Given { o: &o, lse_addr, lse_len: lse.len() };
        let call = validate_varlen(T::DTYPE, &q, &k, &v, cu_seqlens_q.arg(), cu_seqlens_k.arg(), outputs, params)?;
        self.run(&call, OutputAddrs { o: o.addr, lse: lse_addr }, &mut Scratch::per_call(stream), stream)
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
    /// use flash_attn::{AttentionParams, CacheSeqlens, FlashAttention, KvCache, Tensor, TensorMut, Workspace, f16};
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
    pub fn forward_kvcache<T: Element>(
        &self,
        q: Tensor<'_, T>,
        cache: KvCache<'_, T>,
        params: &AttentionParams,
        workspace: &mut Workspace,
        stream: &Stream,
    ) -> Result<Output<T>> {
        let call = validate_kvcache(T::DTYPE, &q.placed("q"), &cache.args(), OutputBuffers::Allocate, params)?;
        self.allocate_and_run(&call, q.layout.shape, &mut Scratch::Workspace(workspace), stream)
    }

    /// [`forward_kvcache`](Self::forward_kvcache) into caller-provided
    /// outputs: `o` with `q`'s shape and `lse` of at least `batch * heads_q *
    /// seqlen_q` f32.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_kvcache_into<T: Element>(
        &self,
        q: Tensor<'_, T>,
        cache: KvCache<'_, T>,
        o: TensorMut<'_, T>,
        lse: &mut DeviceSlice<f32>,
        params: &AttentionParams,
        workspace: &mut Workspace,
        stream: &Stream,
    ) -> Result<Problem> {
        let (o, lse_addr) = (o.placed("o"), lse.as_device_ptr().as_raw());
        let outputs = OutputBuffers::Given { o: &o, lse_addr, lse_len: lse.len() };
        let call = validate_kvcache(T::DTYPE, &q.placed("q"), &cache.args(), outputs, params)?;
        self.run(&call, OutputAddrs { o: o.addr, lse: lse_addr }, &mut Scratch::Workspace(workspace), stream)
    }

    /// Plans `call` for this GPU: the split heuristic's wave is the CTAs of
    /// a kernel that its SMs run at once.
    fn plan(&self, call: &Call) -> Result<Plan> {
        plan(call, |kernel: &AttentionKernel| self.module.wave(kernel))
    }

    /// Plans and launches a call into the outputs the caller gave, at `outputs`.
    fn run(&self, call: &Call, outputs: OutputAddrs, scratch: &mut Scratch, stream: &Stream) -> Result<Problem> {
        let plan = self.plan(call)?;
        launch(&self.module, &plan, outputs, scratch, stream)?;
        Ok(call.problem)
    }

    /// Plans a call whose outputs it allocates, then allocates them (o
    /// contiguous of `shape`, the LSE rows contiguous) and launches.
    fn allocate_and_run<T: Element>(
        &self,
        call: &Call,
        shape: [usize; 4],
        scratch: &mut Scratch,
        stream: &Stream,
    ) -> Result<Output<T>> {
        let plan = self.plan(call)?;
        let [batch, seqlen, heads, head_dim] = shape;
        // Validation checked that these sizes fit.
        let o = unsafe { DeviceBuffer::<T>::uninitialized(batch * seqlen * heads * head_dim)? };
        let lse = unsafe { DeviceBuffer::<f32>::uninitialized(batch * seqlen * heads)? };
        let outputs = OutputAddrs { o: o.as_device_ptr().as_raw(), lse: lse.as_device_ptr().as_raw() };
        launch(&self.module, &plan, outputs, scratch, stream)?;
        Ok(Output { o, lse, problem: call.problem, _context: self.module.context().clone() })
    }
}

//! The attention entry points into caller-provided outputs, whatever the
//! binding: each validates its call once ([`crate::validate`]), orders its
//! memory on the stream ([`StreamOrder`]), plans it once ([`crate::plan`])
//! and launches ([`crate::launch`]) with the kernels' context current. The
//! `cust` door adds the calls that allocate their outputs
//! (`bindings/cust.rs`).

use flash_attn_abi::kernels::AttentionKernel;

use crate::call::{BackwardCall, Call, Problem};
use crate::error::Result;
use crate::kvcache::KvCache;
use crate::launch::{launch, launch_backward};
use crate::memory::{DeviceView, DeviceViewMut};
use crate::module::{KernelModule, KernelResources};
use crate::plan::{plan_backward_for, plan_for, BackwardPlan, CallPlan, KernelFamily, OutputAddrs, Plan};
use crate::stream::{LaunchStream, StreamOrder};
use crate::tensor::{Element, Gradients, Tensor, TensorMut};
use crate::validate::{
    validate, validate_backward, validate_kvcache, validate_varlen, AttentionParams, BackwardTensors, OutputBuffers,
    Placed,
};
use crate::varlen::SeqOffsets;
use crate::workspace::{Scratch, Workspace};

/// The kernels, loaded into the CUDA context current at [`FlashAttention::new`].
///
/// It keeps that context alive (a reference on the device's primary
/// context, which `cust::quick_init` and cudarc's `CudaContext::new` use)
/// until it is dropped, so the context may be dropped before it. A context
/// made with `cuCtxCreate` has no reference count: destroy such a context
/// only after everything this crate made in it.
///
/// It is `Send` and `Sync`: one instance may serve every thread of a
/// program. Each call makes the kernels' context current for its driver
/// calls and launches on the stream it is given, which must belong to that
/// context; calls on different streams run concurrently.
pub struct FlashAttention {
    module: KernelModule,
}

/// The tensors of a backward call beside the LSE: the forward's q, k, v and
/// o, dO, and the gradients it writes.
struct BackwardArgs<'t, 'g, T: Element> {
    q: Tensor<'t, T>,
    k: Tensor<'t, T>,
    v: Tensor<'t, T>,
    o: Tensor<'t, T>,
    d_o: Tensor<'t, T>,
    gradients: Gradients<'g, T>,
}

// One instance serves every thread (above); a change that made it
// otherwise fails to build here, not in a user's program.
const _: () = {
    const fn shared_across_threads<T: Send + Sync>() {}
    shared_across_threads::<FlashAttention>();
    shared_across_threads::<Workspace>();
    shared_across_threads::<SeqOffsets>();
    shared_across_threads::<crate::kvcache::CacheSeqlens>();
    shared_across_threads::<crate::kvcache::BlockTable>();
};

impl FlashAttention {
    /// Loads the kernels into the current context and reads the GPU's SM
    /// count and the kernels' occupancy (for the split-KV heuristic). Fails
    /// with [`Error::UnsupportedDevice`] below compute capability 8.0 and
    /// [`Error::NoContext`] when no context is current.
    ///
    /// On compute capability 9.0 (H100, H200) it also loads the sm_90a
    /// kernels (TMA and `wgmma`), which then run every call they take:
    /// dense (not packed, not a KV cache), unsplit, head dim 64 to 256 in steps of 32,
    /// more than 16 query rows, q, k and v 16-byte aligned with strides of
    /// whole 16 bytes; any mask, softcap and ALiBi. The sm_80 kernels run every other call
    /// ([`Self::portable`] runs them only).
    pub fn new() -> Result<Self> {
        Ok(Self { module: KernelModule::load(true)? })
    }

    /// As [`Self::new`], without the sm_90a kernels: every call runs the
    /// sm_80 kernels, on any GPU (to compare the two, or to rule one out).
    pub fn portable() -> Result<Self> {
        Ok(Self { module: KernelModule::load(false)? })
    }

    /// Whether the sm_90a kernels are loaded ([`Self::new`] on compute
    /// capability 9.0).
    pub fn uses_sm90a(&self) -> bool {
        self.module.has_sm90a()
    }

    /// The GPU's number of streaming multiprocessors.
    pub fn sm_count(&self) -> usize {
        self.module.sm_count()
    }

    /// Every attention kernel as the driver compiled the PTX for this GPU
    /// (the sm_90a ones too, where [`Self::uses_sm90a`], and the main
    /// backward kernels once a backward call has loaded them), sorted by name. The build checks the PTX with the ptxas it installs
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

    /// What [`forward_into`](Self::forward_into) runs for these arguments
    /// on this GPU, decided as that call decides it, without launching
    /// anything or touching the memory: the kernel family, the attention
    /// kernel and its grid, and every launch in order. Arguments that call
    /// refuses return its error.
    ///
    /// ```no_run
    /// # #[cfg(feature = "cudarc")]
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use flash_attn::cudarc::driver::CudaContext;
    /// use flash_attn::{f16, AttentionParams, Family, FlashAttention, Tensor, TensorMut};
    ///
    /// let context = CudaContext::new(0)?;
    /// let stream = context.default_stream();
    /// let attention = FlashAttention::new()?;
    /// let shape = [1, 4096, 16, 128];
    /// let n = shape.iter().product::<usize>();
    /// let (q, mut o) = (stream.alloc_zeros::<f16>(n)?, stream.alloc_zeros::<f16>(n)?);
    /// let mut lse = stream.alloc_zeros::<f32>(shape[0] * shape[2] * shape[1])?;
    /// let params = AttentionParams { causal: true, ..Default::default() };
    /// let plan = attention.explain_forward(
    ///     Tensor::new(&q, shape),
    ///     Tensor::new(&q, shape),
    ///     Tensor::new(&q, shape),
    ///     TensorMut::new(&mut o, shape),
    ///     &mut lse,
    ///     &params,
    /// )?;
    /// // On an H100: "sm_90a flash_fwd_sm90_d128_f16_causal, grid [132, 1, 1]".
    /// println!("{plan}");
    /// assert_eq!(plan.family == Family::Sm90a, attention.uses_sm90a());
    /// # Ok(()) }
    /// # #[cfg(not(feature = "cudarc"))]
    /// # fn main() {}
    /// ```
    pub fn explain_forward<'a, T: Element>(
        &self,
        q: Tensor<'_, T>,
        k: Tensor<'_, T>,
        v: Tensor<'_, T>,
        o: TensorMut<'_, T>,
        lse: impl Into<DeviceViewMut<'a, f32>>,
        params: &AttentionParams,
    ) -> Result<CallPlan> {
        let lse = lse.into();
        let o_at = o.placed("o");
        let outputs = OutputBuffers::Given { o: &o_at, lse_addr: lse.addr, lse_len: lse.len };
        let call = validate(T::DTYPE, &q.placed("q"), &k.placed("k"), &v.placed("v"), outputs, params)?;
        Ok(self.plan(&call)?.describe())
    }

    /// What [`forward_varlen_into`](Self::forward_varlen_into) runs for
    /// these arguments on this GPU, without launching it ([`Self::explain_forward`]).
    #[allow(clippy::too_many_arguments)]
    pub fn explain_forward_varlen<'a, T: Element>(
        &self,
        q: Tensor<'_, T>,
        k: Tensor<'_, T>,
        v: Tensor<'_, T>,
        o: TensorMut<'_, T>,
        lse: impl Into<DeviceViewMut<'a, f32>>,
        cu_seqlens_q: &SeqOffsets,
        cu_seqlens_k: &SeqOffsets,
        params: &AttentionParams,
    ) -> Result<CallPlan> {
        let lse = lse.into();
        let (q_at, k_at, v_at, o_at) = (q.placed("q"), k.placed("k"), v.placed("v"), o.placed("o"));
        let outputs = OutputBuffers::Given { o: &o_at, lse_addr: lse.addr, lse_len: lse.len };
        let (cu_q, cu_k) = (cu_seqlens_q.arg(), cu_seqlens_k.arg());
        let call = validate_varlen(T::DTYPE, &q_at, &k_at, &v_at, cu_q, cu_k, outputs, params)?;
        Ok(self.plan(&call)?.describe())
    }

    /// What [`forward_kvcache_into`](Self::forward_kvcache_into) runs for
    /// these arguments on this GPU (the append first, if the cache has new
    /// keys), without launching it or appending ([`Self::explain_forward`]).
    pub fn explain_forward_kvcache<'a, T: Element>(
        &self,
        q: Tensor<'_, T>,
        cache: KvCache<'_, T>,
        o: TensorMut<'_, T>,
        lse: impl Into<DeviceViewMut<'a, f32>>,
        params: &AttentionParams,
    ) -> Result<CallPlan> {
        let lse = lse.into();
        let o_at = o.placed("o");
        let outputs = OutputBuffers::Given { o: &o_at, lse_addr: lse.addr, lse_len: lse.len };
        let call = validate_kvcache(T::DTYPE, &q.placed("q"), &cache.args(), outputs, params)?;
        Ok(self.plan(&call)?.describe())
    }

    /// What [`backward_into`](Self::backward_into) runs for these arguments
    /// on this GPU, without launching it: the family and grid of the main
    /// backward kernel, and every launch ([`Self::explain_forward`]).
    #[allow(clippy::too_many_arguments)]
    pub fn explain_backward<'a, T: Element>(
        &self,
        q: Tensor<'_, T>,
        k: Tensor<'_, T>,
        v: Tensor<'_, T>,
        o: Tensor<'_, T>,
        lse: impl Into<DeviceView<'a, f32>>,
        d_o: Tensor<'_, T>,
        gradients: Gradients<'_, T>,
        params: &AttentionParams,
    ) -> Result<CallPlan> {
        let args = BackwardArgs { q, k, v, o, d_o, gradients };
        let forward = |q: &_, k: &_, v: &_, outputs: OutputBuffers| validate(T::DTYPE, q, k, v, outputs, params);
        let call = backward_call(forward, &args, &lse.into(), params)?;
        Ok(self.plan_backward(&call)?.describe())
    }

    /// What [`backward_varlen_into`](Self::backward_varlen_into) runs for
    /// these arguments on this GPU, without launching it ([`Self::explain_backward`]).
    #[allow(clippy::too_many_arguments)]
    pub fn explain_backward_varlen<'a, T: Element>(
        &self,
        q: Tensor<'_, T>,
        k: Tensor<'_, T>,
        v: Tensor<'_, T>,
        o: Tensor<'_, T>,
        lse: impl Into<DeviceView<'a, f32>>,
        d_o: Tensor<'_, T>,
        gradients: Gradients<'_, T>,
        cu_seqlens_q: &SeqOffsets,
        cu_seqlens_k: &SeqOffsets,
        params: &AttentionParams,
    ) -> Result<CallPlan> {
        let (cu_q, cu_k) = (cu_seqlens_q.arg(), cu_seqlens_k.arg());
        let args = BackwardArgs { q, k, v, o, d_o, gradients };
        let forward = |q: &_, k: &_, v: &_, outputs: OutputBuffers| {
            validate_varlen(T::DTYPE, q, k, v, cu_q, cu_k, outputs, params)
        };
        let call = backward_call(forward, &args, &lse.into(), params)?;
        Ok(self.plan_backward(&call)?.describe())
    }

    /// Attention into caller-provided outputs: `o` with `q`'s shape, and
    /// `lse` of at least `batch * heads_q * seqlen_q` f32 (`[batch, heads_q,
    /// seqlen_q]`), launched on `stream` (the result is ready once the
    /// stream is).
    ///
    /// Split-KV scratch, when the heuristic or `params.num_splits` splits,
    /// is allocated and freed on `stream` (stream-ordered); pass
    /// `num_splits: Some(1)` for a call that allocates nothing.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_into<'a, T: Element, S: LaunchStream + ?Sized>(
        &self,
        q: Tensor<'_, T>,
        k: Tensor<'_, T>,
        v: Tensor<'_, T>,
        mut o: TensorMut<'_, T>,
        lse: impl Into<DeviceViewMut<'a, f32>>,
        params: &AttentionParams,
        stream: &S,
    ) -> Result<Problem> {
        let mut lse = lse.into();
        let (o_at, lse_addr) = (o.placed("o"), lse.addr);
        let outputs = OutputBuffers::Given { o: &o_at, lse_addr, lse_len: lse.len };
        let call = validate(T::DTYPE, &q.placed("q"), &k.placed("k"), &v.placed("v"), outputs, params)?;
        let mut order = StreamOrder::new(stream.launch_on());
        order.inputs(&q.memory, &k.memory, &v.memory, params)?;
        order.write("o", &mut o.memory)?;
        order.write("lse", &mut lse)?;
        self.run(&call, None, order.stream, |_| Ok((OutputAddrs { o: o_at.addr, lse: lse_addr }, call.problem)))
    }

    /// Attention over a variable-length batch into caller-provided outputs:
    /// sequences packed one after another, q `[total_q, heads_q, d]` and k,
    /// v `[total_k, heads_kv, d]` (see [`Tensor::packed`]), sequence `b`
    /// being tokens `cu_seqlens_q[b]..cu_seqlens_q[b + 1]` of q and
    /// `cu_seqlens_k[b]..cu_seqlens_k[b + 1]` of k and v. Causal masks and
    /// windows align each sequence's bottom-right corner, as with dense
    /// batches. `o` has `q`'s shape and `lse` at least `heads_q * total_q`
    /// f32 (`[heads_q, total_q]`). Split-KV scratch as in
    /// [`forward_into`](Self::forward_into).
    #[allow(clippy::too_many_arguments)]
    pub fn forward_varlen_into<'a, T: Element, S: LaunchStream + ?Sized>(
        &self,
        q: Tensor<'_, T>,
        k: Tensor<'_, T>,
        v: Tensor<'_, T>,
        mut o: TensorMut<'_, T>,
        lse: impl Into<DeviceViewMut<'a, f32>>,
        cu_seqlens_q: &SeqOffsets,
        cu_seqlens_k: &SeqOffsets,
        params: &AttentionParams,
        stream: &S,
    ) -> Result<Problem> {
        let mut lse = lse.into();
        let (q_at, k_at, v_at) = (q.placed("q"), k.placed("k"), v.placed("v"));
        let (o_at, lse_addr) = (o.placed("o"), lse.addr);
        let outputs = OutputBuffers::Given { o: &o_at, lse_addr, lse_len: lse.len };
        let call =
            validate_varlen(T::DTYPE, &q_at, &k_at, &v_at, cu_seqlens_q.arg(), cu_seqlens_k.arg(), outputs, params)?;
        let mut order = StreamOrder::new(stream.launch_on());
        order.inputs(&q.memory, &k.memory, &v.memory, params)?;
        order.write("o", &mut o.memory)?;
        order.write("lse", &mut lse)?;
        self.run(&call, None, order.stream, |_| Ok((OutputAddrs { o: o_at.addr, lse: lse_addr }, call.problem)))
    }

    /// Attention of `q` (`[batch, seqlen_q, heads_q, d]`) over a KV cache,
    /// after appending the cache's new keys and values if it has any (see
    /// [`KvCache`]), into caller-provided outputs: `o` with `q`'s shape and
    /// `lse` of at least `batch * heads_q * seqlen_q` f32. Batch `b` sees
    /// its `cache_seqlens[b]` cached keys plus the appended ones; causal
    /// masks and windows align to that end (the last query row is the last
    /// key).
    ///
    /// Scratch comes from `workspace`, grown on demand: in a decode loop,
    /// pass the same one every step and only the first step allocates.
    /// Once it has grown, a call allocates nothing and never synchronizes,
    /// so a decode step can be captured into a CUDA graph and replayed. An
    /// appending cache uploads its new lengths from host memory, which
    /// stream capture may refuse (the driver's error is returned): capture
    /// steps over a cache that does not append.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_kvcache_into<'a, T: Element, S: LaunchStream + ?Sized>(
        &self,
        q: Tensor<'_, T>,
        mut cache: KvCache<'_, T>,
        mut o: TensorMut<'_, T>,
        lse: impl Into<DeviceViewMut<'a, f32>>,
        params: &AttentionParams,
        workspace: &mut Workspace,
        stream: &S,
    ) -> Result<Problem> {
        let mut lse = lse.into();
        let (o_at, lse_addr) = (o.placed("o"), lse.addr);
        let outputs = OutputBuffers::Given { o: &o_at, lse_addr, lse_len: lse.len };
        let call = validate_kvcache(T::DTYPE, &q.placed("q"), &cache.args(), outputs, params)?;
        let mut order = StreamOrder::new(stream.launch_on());
        order.read("q", &q.memory)?;
        cache.order(&mut order)?;
        order.params(params)?;
        order.write("o", &mut o.memory)?;
        order.write("lse", &mut lse)?;
        let outputs = OutputAddrs { o: o_at.addr, lse: lse_addr };
        self.run(&call, Some(workspace), order.stream, |_| Ok((outputs, call.problem)))
    }

    /// The gradients of the attention [`forward_into`](Self::forward_into)
    /// computed: from the same `q`, `k`, `v` and `params`, its outputs `o`
    /// and `lse`, and `d_o` (the loss's gradient with respect to `o`, q's
    /// shape), writes dQ, dK and dV into `gradients` (q's, k's and v's
    /// shapes). With GQA/MQA each key/value head's gradients sum over its
    /// query heads. Every head dim of the forward.
    ///
    /// Scratch (f32, `head_dim + 1` per query row and head) comes from
    /// `workspace`, grown on demand: pass the same one every step. dQ is
    /// summed with atomics, so its last bits may differ from run to run,
    /// unless `params.deterministic` (a fixed order, more scratch).
    /// `params.num_splits` is a forward option and is not used here.
    ///
    /// ```no_run
    /// # #[cfg(feature = "cudarc")]
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use flash_attn::cudarc::driver::CudaContext;
    /// use flash_attn::{f16, AttentionParams, FlashAttention, Gradients, Tensor, TensorMut, Workspace};
    ///
    /// let context = CudaContext::new(0)?;
    /// let stream = context.default_stream();
    /// let attention = FlashAttention::new()?;
    /// let shape = [2, 1024, 8, 128];
    /// let n = shape.iter().product::<usize>();
    /// let q = stream.clone_htod(&vec![f16::from_f32(0.5); n])?;
    /// let (k, v, d_o) = (q.clone(), q.clone(), q.clone());
    /// let mut o = stream.alloc_zeros::<f16>(n)?;
    /// let mut lse = stream.alloc_zeros::<f32>(shape[0] * shape[2] * shape[1])?;
    /// let params = AttentionParams { causal: true, ..Default::default() };
    /// attention.forward_into(
    ///     Tensor::new(&q, shape),
    ///     Tensor::new(&k, shape),
    ///     Tensor::new(&v, shape),
    ///     TensorMut::new(&mut o, shape),
    ///     &mut lse,
    ///     &params,
    ///     &stream,
    /// )?;
    /// let (mut d_q, mut d_k, mut d_v) = (stream.alloc_zeros::<f16>(n)?, stream.alloc_zeros::<f16>(n)?, stream.alloc_zeros::<f16>(n)?);
    /// let mut workspace = Workspace::new();
    /// attention.backward_into(
    ///     Tensor::new(&q, shape),
    ///     Tensor::new(&k, shape),
    ///     Tensor::new(&v, shape),
    ///     Tensor::new(&o, shape),
    ///     &lse,
    ///     Tensor::new(&d_o, shape),
    ///     Gradients {
    ///         d_q: TensorMut::new(&mut d_q, shape),
    ///         d_k: TensorMut::new(&mut d_k, shape),
    ///         d_v: TensorMut::new(&mut d_v, shape),
    ///     },
    ///     &params,
    ///     &mut workspace,
    ///     &stream,
    /// )?;
    /// # Ok(()) }
    /// # #[cfg(not(feature = "cudarc"))]
    /// # fn main() {}
    /// ```
    #[allow(clippy::too_many_arguments)]
    pub fn backward_into<'a, T: Element, S: LaunchStream + ?Sized>(
        &self,
        q: Tensor<'_, T>,
        k: Tensor<'_, T>,
        v: Tensor<'_, T>,
        o: Tensor<'_, T>,
        lse: impl Into<DeviceView<'a, f32>>,
        d_o: Tensor<'_, T>,
        gradients: Gradients<'_, T>,
        params: &AttentionParams,
        workspace: &mut Workspace,
        stream: &S,
    ) -> Result<Problem> {
        let args = BackwardArgs { q, k, v, o, d_o, gradients };
        let forward = |q: &_, k: &_, v: &_, outputs: OutputBuffers| validate(T::DTYPE, q, k, v, outputs, params);
        self.backward_of(forward, args, lse.into(), params, workspace, stream.launch_on())
    }

    /// [`backward_into`](Self::backward_into) for the variable-length
    /// batch [`forward_varlen_into`](Self::forward_varlen_into) computed:
    /// packed `q`, `o`, `d_o` and `d_q` (`[total_q, heads_q, d]`), `k`,
    /// `v`, `d_k` and `d_v` (`[total_k, heads_kv, d]`), `lse`
    /// `[heads_q, total_q]`, and the same offsets.
    #[allow(clippy::too_many_arguments)]
    pub fn backward_varlen_into<'a, T: Element, S: LaunchStream + ?Sized>(
        &self,
        q: Tensor<'_, T>,
        k: Tensor<'_, T>,
        v: Tensor<'_, T>,
        o: Tensor<'_, T>,
        lse: impl Into<DeviceView<'a, f32>>,
        d_o: Tensor<'_, T>,
        gradients: Gradients<'_, T>,
        cu_seqlens_q: &SeqOffsets,
        cu_seqlens_k: &SeqOffsets,
        params: &AttentionParams,
        workspace: &mut Workspace,
        stream: &S,
    ) -> Result<Problem> {
        let (cu_q, cu_k) = (cu_seqlens_q.arg(), cu_seqlens_k.arg());
        let args = BackwardArgs { q, k, v, o, d_o, gradients };
        let forward = |q: &_, k: &_, v: &_, outputs: OutputBuffers| {
            validate_varlen(T::DTYPE, q, k, v, cu_q, cu_k, outputs, params)
        };
        self.backward_of(forward, args, lse.into(), params, workspace, stream.launch_on())
    }

    /// A backward call: the forward's checks (`forward`, with the forward's
    /// outputs), the backward's, the memory ordered on the stream, then the
    /// backward kernels (loaded by the first call), planned and launched
    /// with the kernels' context current.
    fn backward_of<'a, T: Element>(
        &self,
        forward: impl FnOnce(&Placed, &Placed, &Placed, OutputBuffers) -> Result<Call>,
        args: BackwardArgs<'_, '_, T>,
        lse: DeviceView<'a, f32>,
        params: &AttentionParams,
        workspace: &mut Workspace,
        on: crate::stream::sealed::LaunchOn<'_>,
    ) -> Result<Problem> {
        let call = backward_call(forward, &args, &lse, params)?;
        let BackwardArgs { q, k, v, o, d_o, gradients: Gradients { mut d_q, mut d_k, mut d_v } } = args;
        let mut order = StreamOrder::new(on);
        order.inputs(&q.memory, &k.memory, &v.memory, params)?;
        order.read("o", &o.memory)?;
        order.read("lse", &lse)?;
        order.read("d_o", &d_o.memory)?;
        order.write("d_q", &mut d_q.memory)?;
        order.write("d_k", &mut d_k.memory)?;
        order.write("d_v", &mut d_v.memory)?;
        let stream = order.stream;
        let context = self.module.context();
        context.with_current(|| {
            context.check_stream(stream)?;
            let plan = self.plan_backward(&call)?;
            let sm80_main = match &plan {
                BackwardPlan::Sm80(plan) => Some(plan.kernel),
                BackwardPlan::Sm90(_) => None,
            };
            self.module.load_backward(sm80_main)?;
            launch_backward(&self.module, &plan, &mut Scratch::Workspace(workspace), stream)?;
            Ok(call.forward.problem)
        })
    }

    /// The kernel families this GPU runs: the sm_90a kernels beside the
    /// sm_80 ones where they are loaded.
    fn family(&self) -> KernelFamily {
        if self.module.has_sm90a() {
            KernelFamily::Sm90a { sm_count: self.module.sm_count() }
        } else {
            KernelFamily::Sm80
        }
    }

    /// The plan of `call` on this GPU. The split heuristic's wave is the
    /// CTAs of a kernel that the GPU's SMs run at once.
    fn plan(&self, call: &Call) -> Result<Plan> {
        plan_for(call, |kernel: &AttentionKernel| self.module.wave(kernel), self.family())
    }

    /// The plan of the backward `call` on this GPU.
    fn plan_backward(&self, call: &BackwardCall) -> Result<BackwardPlan> {
        plan_backward_for(call, self.module.sm_count(), self.family())
    }

    /// Plans `call` for this GPU, binds its outputs (`outputs` may allocate
    /// them, once the plan is known) and launches it on `stream`, with the
    /// kernels' context current. Scratch comes from `workspace`, or is
    /// allocated on the stream for this call only.
    pub(crate) fn run<R>(
        &self,
        call: &Call,
        workspace: Option<&mut Workspace>,
        stream: crate::driver::CUstream,
        outputs: impl FnOnce(&Plan) -> Result<(OutputAddrs, R)>,
    ) -> Result<R> {
        let context = self.module.context();
        context.with_current(|| {
            context.check_stream(stream)?;
            let plan = self.plan(call)?;
            let (addrs, result) = outputs(&plan)?;
            let mut scratch = match workspace {
                Some(workspace) => Scratch::Workspace(workspace),
                None => Scratch::per_call(stream),
            };
            launch(&self.module, &plan, addrs, &mut scratch, stream)?;
            Ok(result)
        })
    }

    /// The context the kernels live in (for the `cust` door's outputs).
    #[cfg(feature = "cust")]
    pub(crate) fn context(&self) -> &crate::context::ContextRef {
        self.module.context()
    }
}

/// Validates a backward call: the forward's checks (`forward`, with the
/// forward's outputs), then the backward's.
fn backward_call<T: Element>(
    forward: impl FnOnce(&Placed, &Placed, &Placed, OutputBuffers) -> Result<Call>,
    args: &BackwardArgs<'_, '_, T>,
    lse: &DeviceView<'_, f32>,
    params: &AttentionParams,
) -> Result<BackwardCall> {
    let BackwardArgs { q, k, v, o, d_o, gradients: Gradients { d_q, d_k, d_v } } = args;
    let (q_at, k_at, v_at) = (q.placed("q"), k.placed("k"), v.placed("v"));
    let (o_at, d_o_at) = (o.placed("o"), d_o.placed("d_o"));
    let (d_q_at, d_k_at, d_v_at) = (d_q.placed("d_q"), d_k.placed("d_k"), d_v.placed("d_v"));
    let tensors = BackwardTensors {
        o: &o_at,
        lse_addr: lse.addr,
        lse_len: lse.len,
        d_o: &d_o_at,
        d_q: &d_q_at,
        d_k: &d_k_at,
        d_v: &d_v_at,
    };
    let forward = forward(&q_at, &k_at, &v_at, tensors.forward_outputs())?;
    validate_backward(forward, &q_at, &k_at, &v_at, &tensors, params)
}

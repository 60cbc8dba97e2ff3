//! The attention entry points into caller-provided outputs, whatever the
//! binding: each validates its call once ([`crate::validate`]), orders its
//! memory on the stream ([`StreamOrder`]), plans it once ([`crate::plan`])
//! and launches ([`crate::launch`]) with the kernels' context current. The
//! `cust` door adds the calls that allocate their outputs
//! (`bindings/cust.rs`).

use flash_attn_abi::kernels::AttentionKernel;

use crate::call::Call;
use crate::call::Problem;
use crate::error::Result;
use crate::kvcache::KvCache;
use crate::launch::launch;
use crate::memory::DeviceViewMut;
use crate::module::{KernelModule, KernelResources};
use crate::plan::{plan_for, KernelFamily, OutputAddrs, Plan};
use crate::stream::{LaunchStream, StreamOrder};
use crate::tensor::{Element, Tensor, TensorMut};
use crate::validate::{validate, validate_kvcache, validate_varlen, AttentionParams, OutputBuffers};
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

// One instance serves every thread (above); a change that made it
// otherwise fails to build here, not in a user's program.
const _: () = {
    const fn shared_across_threads<T: Send + Sync>() {}
    shared_across_threads::<FlashAttention>();
    shared_across_threads::<Workspace>();
    shared_across_threads::<SeqOffsets>();
    shared_across_threads::<crate::CacheSeqlens>();
    shared_across_threads::<crate::BlockTable>();
};

impl FlashAttention {
    /// Loads the kernels into the current context and reads the GPU's SM
    /// count and the kernels' occupancy (for the split-KV heuristic). Fails
    /// with [`Error::UnsupportedDevice`] below compute capability 8.0 and
    /// [`Error::NoContext`] when no context is current.
    ///
    /// On compute capability 9.0 (H100, H200) it also loads the sm_90a
    /// kernels (TMA and `wgmma`), which then run every call they take:
    /// dense (not packed, not a KV cache), unsplit, head dim 64, 128 or 256,
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
    /// (the sm_90a ones too, where [`Self::uses_sm90a`]), sorted by name. The build checks the PTX with the ptxas it installs
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
            // The split heuristic's wave is the CTAs of a kernel that the
            // GPU's SMs run at once.
            let family = if self.module.has_sm90a() { KernelFamily::Sm90a } else { KernelFamily::Sm80 };
            let plan = plan_for(call, |kernel: &AttentionKernel| self.module.wave(kernel), family)?;
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

//! Loading the embedded PTX and launching the kernels through `cust`.

use std::ffi::c_void;

use cust::memory::{DeviceBuffer, DeviceSlice};
use cust::stream::Stream;
use cust::sys::CUfunction;
use flash_attn_abi::kernels::{attention_kernel, APPEND_THREADS, COMBINE_THREADS};

use crate::context::ContextRef;
use crate::error::{Error, Result};
use crate::kvcache::{validate_kvcache, Append, KvCache};
use crate::launch::{plan, KernelVariant, Plan};
use crate::module::{driver_call, Kernel, KernelModule, KernelResources};
use crate::params::{CombineParams, ForwardParams};
use crate::tensor::{Element, Tensor, TensorMut};
use crate::validate::{validate, AttentionParams, Layout, Placed, Problem};
use crate::varlen::{validate_varlen, SeqOffsets};
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

/// Outputs at addresses no allocation has (2^63 and above; GPU virtual
/// addresses are 49 bits), so that a call is validated before its outputs
/// are allocated: `o` contiguous of `shape` and `lse_len` f32 after it.
fn stand_in_outputs(shape: [usize; 4], lse_len: Option<usize>) -> Result<(Placed, u64, usize)> {
    let too_large = || Error::TooLarge { what: "q elements", value: usize::MAX, max: isize::MAX as usize };
    let layout = Layout::contiguous(shape);
    let len = layout.elements().ok_or_else(too_large)?;
    let lse_len = lse_len.ok_or_else(too_large)?;
    let o_addr = 1u64 << 63;
    let lse_addr = o_addr.saturating_add((len as u64).saturating_mul(2)).saturating_add(15) & !15;
    Ok((Placed { name: "o", layout, addr: o_addr, buffer_len: len }, lse_addr, lse_len))
}

/// `[b, s, h, d]` -> `b * h * s`, the rows of a dense or KV cache call's LSE.
fn lse_rows([batch, seqlen, heads, _]: [usize; 4]) -> Option<usize> {
    batch.checked_mul(heads)?.checked_mul(seqlen)
}

/// Copies `values` to device address `addr` on `stream`. From pageable host
/// memory the driver stages the data before returning, so `values` may be
/// dropped right after.
fn upload_async(addr: u64, values: &[i32], stream: &Stream) -> Result<()> {
    let status = unsafe {
        cust::sys::cuMemcpyHtoDAsync_v2(addr, values.as_ptr().cast(), std::mem::size_of_val(values), stream.as_inner())
    };
    driver_call("cuMemcpyHtoDAsync", status)
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

/// Launches `function` with one argument block `args` on `stream`.
///
/// # Safety
/// `args` points to the argument block `function` takes, and the geometry is
/// the one its kernel was written for.
unsafe fn launch_kernel(
    function: CUfunction,
    grid: (u32, u32, u32),
    threads: u32,
    smem_bytes: u32,
    args: *mut c_void,
    stream: &Stream,
) -> Result<()> {
    let mut params = [args];
    let status = cust::sys::cuLaunchKernel(
        function,
        grid.0,
        grid.1,
        grid.2,
        threads,
        1,
        1,
        smem_bytes,
        stream.as_inner(),
        params.as_mut_ptr(),
        std::ptr::null_mut(),
    );
    driver_call("cuLaunchKernel", status)
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
        // Validate before allocating, so that bad input allocates nothing.
        let (stand_in_o, lse_addr, lse_len) = stand_in_outputs(q.layout.shape, lse_rows(q.layout.shape))?;
        let (args, problem) =
            validate(&q.placed("q"), &k.placed("k"), &v.placed("v"), &stand_in_o, lse_addr, lse_len, params)?;
        self.plan::<T>(args, &problem, params.num_splits, 0)?;
        let mut o = unsafe { DeviceBuffer::<T>::uninitialized(stand_in_o.buffer_len)? };
        let mut lse = unsafe { DeviceBuffer::<f32>::uninitialized(lse_len)? };
        let problem = self.forward_into(q, k, v, TensorMut::new(&mut o, q.layout.shape), &mut lse, params, stream)?;
        Ok(Output { o, lse, problem, _context: self.module.context().clone() })
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
        let (lse_addr, lse_len) = (lse.as_device_ptr().as_raw(), lse.len());
        let (args, problem) =
            validate(&q.placed("q"), &k.placed("k"), &v.placed("v"), &o.placed("o"), lse_addr, lse_len, params)?;
        let plan = self.plan::<T>(args, &problem, params.num_splits, 0)?;
        self.launch::<T>(&plan, None, &[], &mut Scratch::per_call(stream), stream)?;
        Ok(problem)
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
        let [_, total_q, heads_q, _] = q.layout.shape;
        let (stand_in_o, lse_addr, lse_len) = stand_in_outputs(q.layout.shape, heads_q.checked_mul(total_q))?;
        let (args, problem) = validate_varlen(
            &q.placed("q"),
            &k.placed("k"),
            &v.placed("v"),
            &stand_in_o,
            lse_addr,
            lse_len,
            cu_seqlens_q.arg(),
            cu_seqlens_k.arg(),
            params,
        )?;
        self.plan::<T>(args, &problem, params.num_splits, 0)?;
        let mut o = unsafe { DeviceBuffer::<T>::uninitialized(stand_in_o.buffer_len)? };
        let mut lse = unsafe { DeviceBuffer::<f32>::uninitialized(lse_len)? };
        let o_view = TensorMut::new(&mut o, q.layout.shape);
        let problem =
            self.forward_varlen_into(q, k, v, o_view, &mut lse, cu_seqlens_q, cu_seqlens_k, params, stream)?;
        Ok(Output { o, lse, problem, _context: self.module.context().clone() })
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
        let (args, problem) = validate_varlen(
            &q.placed("q"),
            &k.placed("k"),
            &v.placed("v"),
            &o.placed("o"),
            lse.as_device_ptr().as_raw(),
            lse.len(),
            cu_seqlens_q.arg(),
            cu_seqlens_k.arg(),
            params,
        )?;
        let plan = self.plan::<T>(args, &problem, params.num_splits, 0)?;
        self.launch::<T>(&plan, None, &[], &mut Scratch::per_call(stream), stream)?;
        Ok(problem)
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
        let (stand_in_o, lse_addr, lse_len) = stand_in_outputs(q.layout.shape, lse_rows(q.layout.shape))?;
        let call = validate_kvcache(&q.placed("q"), &cache.args(), &stand_in_o, lse_addr, lse_len, params)?;
        self.plan::<T>(call.args, &call.problem, params.num_splits, call.seqused_k.len())?;
        let mut o = unsafe { DeviceBuffer::<T>::uninitialized(stand_in_o.buffer_len)? };
        let mut lse = unsafe { DeviceBuffer::<f32>::uninitialized(lse_len)? };
        let o_view = TensorMut::new(&mut o, q.layout.shape);
        let problem = self.forward_kvcache_into(q, cache, o_view, &mut lse, params, workspace, stream)?;
        Ok(Output { o, lse, problem, _context: self.module.context().clone() })
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
        let (lse_addr, lse_len) = (lse.as_device_ptr().as_raw(), lse.len());
        let call = validate_kvcache(&q.placed("q"), &cache.args(), &o.placed("o"), lse_addr, lse_len, params)?;
        let plan = self.plan::<T>(call.args, &call.problem, params.num_splits, call.seqused_k.len())?;
        self.launch::<T>(&plan, call.append.as_ref(), &call.seqused_k, &mut Scratch::Workspace(workspace), stream)?;
        Ok(call.problem)
    }

    /// CTAs of `variant` for `head_dim` that the GPU runs at once.
    fn wave<T: Element>(&self, head_dim: usize, variant: KernelVariant) -> usize {
        attention_kernel(head_dim as u32, T::DTYPE, variant).map_or(self.module.sm_count(), |k| self.module.wave(k))
    }

    fn plan<T: Element>(
        &self,
        args: ForwardParams,
        problem: &Problem,
        num_splits: Option<usize>,
        seqused_len: usize,
    ) -> Result<Plan> {
        let wave = |variant| self.wave::<T>(problem.head_dim, variant);
        plan(args, problem.head_dim, num_splits, seqused_len, wave)
    }

    /// Launches a planned call on `stream`: the append (if any), the
    /// attention, and the split-KV merge (if split), in that order.
    fn launch<T: Element>(
        &self,
        plan: &Plan,
        append: Option<&Append>,
        seqused_k: &[i32],
        scratch: &mut Scratch,
        stream: &Stream,
    ) -> Result<()> {
        let mut args = plan.args;
        if plan.scratch.bytes > 0 {
            let base = scratch.reserve(plan.scratch.bytes)?;
            if !seqused_k.is_empty() {
                let addr = base + plan.scratch.seqused_k as u64;
                upload_async(addr, seqused_k, stream)?;
                args.seqused_k = addr as *const i32;
            }
            if args.num_splits > 1 {
                args.lse_partial = (base + plan.scratch.lse_partial as u64) as *mut f32;
                args.o_partial = (base + plan.scratch.o_partial as u64) as *mut f32;
            }
        }
        if let Some(append) = append {
            let mut append_args = append.args;
            let arg_ptr = &mut append_args as *mut _ as *mut c_void;
            let function = self.module.function(Kernel::Append);
            unsafe { launch_kernel(function, append.grid, APPEND_THREADS, 0, arg_ptr, stream)? };
        }
        // A plan names only kernels of the table.
        let kernel = attention_kernel(plan.head_dim as u32, T::DTYPE, plan.variant).expect("a kernel of the table");
        let function = self.module.function(Kernel::Attention(kernel));
        let arg_ptr = &mut args as *mut _ as *mut c_void;
        let (threads, smem_bytes) = (plan.config.threads(), plan.config.smem_bytes());
        unsafe { launch_kernel(function, plan.grid, threads, smem_bytes, arg_ptr, stream)? };
        if args.num_splits > 1 {
            let mut combine = CombineParams::of(&args, plan.head_dim as u32);
            let arg_ptr = &mut combine as *mut _ as *mut c_void;
            let grid = (plan.combine_blocks, 1, 1);
            let function = self.module.function(Kernel::Combine(T::DTYPE));
            unsafe { launch_kernel(function, grid, COMBINE_THREADS, 0, arg_ptr, stream)? };
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stand_in_outputs_lie_past_every_device_address() {
        let (o, lse_addr, lse_len) = stand_in_outputs([2, 3, 4, 8], lse_rows([2, 3, 4, 8])).unwrap();
        assert_eq!((o.addr, o.buffer_len, lse_len), (1 << 63, 2 * 3 * 4 * 8, 2 * 4 * 3));
        assert_eq!(lse_addr, (1 << 63) + 2 * 192);
        assert!(matches!(
            stand_in_outputs([usize::MAX, 2, 2, 8], None).unwrap_err(),
            Error::TooLarge { what: "q elements", .. }
        ));
    }
}

//! Loading the embedded PTX and launching the kernels through `cust`.

use std::ffi::c_void;

use cust::context::CurrentContext;
use cust::device::DeviceAttribute;
use cust::memory::{DeviceBuffer, DeviceCopy, DeviceSlice};
use cust::module::Module;
use cust::stream::Stream;

use crate::error::{Error, Result};
use crate::validate::{tile_config, validate, AttentionParams, Layout, Placed, Problem, SUPPORTED_HEAD_DIMS};

/// The kernels' PTX, built from `kernels/` by `cargo xtask build-ptx`.
pub const PTX: &str = include_str!("../kernels.ptx");

/// The name of the attention kernel for one (head dim, element type, causal).
pub fn kernel_name(head_dim: usize, element: &str, causal: bool) -> String {
    format!("flash_fwd_d{head_dim}_{element}_{}", if causal { "causal" } else { "full" })
}

/// Every attention kernel in [`PTX`], with its head dim.
pub fn kernel_names() -> Vec<(usize, String)> {
    let mut names = Vec::new();
    for head_dim in SUPPORTED_HEAD_DIMS.map(|d| d as usize) {
        for element in ["f16", "bf16"] {
            for causal in [false, true] {
                names.push((head_dim, kernel_name(head_dim, element, causal)));
            }
        }
    }
    names
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for half::f16 {}
    impl Sealed for half::bf16 {}
}

/// An element type the kernels take: [`f16`](half::f16) or [`bf16`](half::bf16).
pub trait Element: DeviceCopy + sealed::Sealed {
    /// The type's part of the kernel name.
    const NAME: &'static str;
}
impl Element for half::f16 {
    const NAME: &'static str = "f16";
}
impl Element for half::bf16 {
    const NAME: &'static str = "bf16";
}

/// A read-only `[batch, seqlen, heads, head_dim]` view of a device buffer.
#[derive(Clone, Copy)]
pub struct Tensor<'a, T: Element> {
    buffer: &'a DeviceSlice<T>,
    layout: Layout,
}

impl<'a, T: Element> Tensor<'a, T> {
    /// A densely packed tensor of `shape` at the start of `buffer`.
    pub fn new(buffer: &'a DeviceSlice<T>, shape: [usize; 4]) -> Self {
        Self { buffer, layout: Layout::contiguous(shape) }
    }

    /// A tensor with explicit strides, in elements.
    pub fn strided(buffer: &'a DeviceSlice<T>, shape: [usize; 4], strides: [usize; 4]) -> Self {
        Self { buffer, layout: Layout::strided(shape, strides) }
    }

    fn placed(&self, name: &'static str) -> Placed {
        Placed { name, layout: self.layout, addr: self.buffer.as_device_ptr().as_raw(), buffer_len: self.buffer.len() }
    }
}

/// A writable `[batch, seqlen, heads, head_dim]` view of a device buffer.
pub struct TensorMut<'a, T: Element> {
    buffer: &'a mut DeviceSlice<T>,
    layout: Layout,
}

impl<'a, T: Element> TensorMut<'a, T> {
    /// A densely packed tensor of `shape` at the start of `buffer`.
    pub fn new(buffer: &'a mut DeviceSlice<T>, shape: [usize; 4]) -> Self {
        Self { buffer, layout: Layout::contiguous(shape) }
    }

    /// A tensor with explicit strides, in elements.
    pub fn strided(buffer: &'a mut DeviceSlice<T>, shape: [usize; 4], strides: [usize; 4]) -> Self {
        Self { buffer, layout: Layout::strided(shape, strides) }
    }
}

/// What [`FlashAttention::forward`] returns.
pub struct Output<T: Element> {
    /// `[batch, seqlen_q, heads_q, head_dim]`, contiguous.
    pub o: DeviceBuffer<T>,
    /// Natural log-sum-exp of each row's scaled scores, `[batch, heads_q,
    /// seqlen_q]`; `-inf` for a row that sees no key.
    pub lse: DeviceBuffer<f32>,
    /// The sizes of the problem.
    pub problem: Problem,
}

/// The kernels, loaded into the CUDA context current at [`FlashAttention::new`].
pub struct FlashAttention {
    module: Module,
}

impl FlashAttention {
    /// Loads the kernels into the current context. Fails with
    /// [`Error::UnsupportedDevice`] below compute capability 8.0.
    pub fn new() -> Result<Self> {
        let device = CurrentContext::get_device()?;
        let major = device.get_attribute(DeviceAttribute::ComputeCapabilityMajor)?;
        let minor = device.get_attribute(DeviceAttribute::ComputeCapabilityMinor)?;
        if major < 8 {
            return Err(Error::UnsupportedDevice { major, minor });
        }
        let module = Module::from_ptx(PTX, &[])?;
        for (head_dim, name) in kernel_names() {
            let smem = tile_config(head_dim)?.smem_bytes();
            let function = module.get_function(&name)?;
            // Allow more than the default 48 KiB of dynamic shared memory.
            let status = unsafe {
                cust::sys::cuFuncSetAttribute(
                    function.to_raw(),
                    cust::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    smem as i32,
                )
            };
            if status != cust::sys::cudaError_enum::CUDA_SUCCESS {
                return Err(Error::DriverCall { call: "cuFuncSetAttribute", code: status as u32 });
            }
        }
        Ok(Self { module })
    }

    /// Attention of `q` over `k`, `v`, into freshly allocated outputs,
    /// launched on `stream` (the result is ready once the stream is).
    pub fn forward<T: Element>(
        &self,
        q: Tensor<'_, T>,
        k: Tensor<'_, T>,
        v: Tensor<'_, T>,
        params: &AttentionParams,
        stream: &Stream,
    ) -> Result<Output<T>> {
        let [batch, seqlen_q, heads_q, _] = q.layout.shape;
        let too_large = Error::TooLarge { what: "q elements", value: usize::MAX, max: isize::MAX as usize };
        let len = q.layout.elements().ok_or(too_large.clone())?;
        let lse_len = batch.checked_mul(heads_q).and_then(|n| n.checked_mul(seqlen_q)).ok_or(too_large)?;
        // Validate before allocating, so that bad input allocates nothing. The
        // stand-in outputs sit at 2^63 and above, where no device allocation
        // lives (GPU virtual addresses are 49 bits), so they overlap no input.
        let o_addr = 1u64 << 63;
        let lse_addr = o_addr.saturating_add((len as u64).saturating_mul(2)).saturating_add(15) & !15;
        let stand_in_o =
            Placed { name: "o", layout: Layout::contiguous(q.layout.shape), addr: o_addr, buffer_len: len };
        validate(&q.placed("q"), &k.placed("k"), &v.placed("v"), &stand_in_o, lse_addr, lse_len, params)?;
        let mut o = unsafe { DeviceBuffer::<T>::uninitialized(len)? };
        let mut lse = unsafe { DeviceBuffer::<f32>::uninitialized(lse_len)? };
        let problem = self.forward_into(q, k, v, TensorMut::new(&mut o, q.layout.shape), &mut lse, params, stream)?;
        Ok(Output { o, lse, problem })
    }

    /// Attention into caller-provided outputs: `o` with `q`'s shape, and
    /// `lse` of at least `batch * heads_q * seqlen_q` f32.
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
        let o_placed =
            Placed { name: "o", layout: o.layout, addr: o.buffer.as_device_ptr().as_raw(), buffer_len: o.buffer.len() };
        let (mut args, problem) = validate(
            &q.placed("q"),
            &k.placed("k"),
            &v.placed("v"),
            &o_placed,
            lse.as_device_ptr().as_raw(),
            lse.len(),
            params,
        )?;
        let config = tile_config(problem.head_dim)?;
        let name = kernel_name(problem.head_dim, T::NAME, params.causal);
        let function = self.module.get_function(&name)?;
        let grid =
            (problem.seqlen_q.div_ceil(config.block_m as usize) as u32, problem.heads_q as u32, problem.batch as u32);
        let arg_ptr = &mut args as *mut _ as *mut c_void;
        unsafe { stream.launch(&function, grid, config.threads(), config.smem_bytes(), &[arg_ptr])? };
        Ok(problem)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_ptx_exports_every_kernel_for_sm_80() {
        assert!(PTX.contains(".target sm_80"), "PTX must target sm_80");
        let names = kernel_names();
        assert_eq!(names.len(), 32);
        for (_, name) in &names {
            assert!(PTX.contains(&format!(".visible .entry {name}(")), "{name} missing from the embedded PTX");
        }
        // The attention kernels, the primitive probe of the emulator
        // cross-check, and the benchmark's mma.sync ceiling.
        assert_eq!(PTX.matches(".visible .entry flash_fwd").count(), names.len());
        assert!(PTX.contains(".visible .entry probe_primitives("));
        assert!(PTX.contains(".visible .entry mma_ceiling("));
    }

    #[test]
    fn every_kernel_has_a_tile_config_that_fits_shared_memory() {
        for (head_dim, name) in kernel_names() {
            let config = tile_config(head_dim).unwrap();
            assert_eq!(config.head_dim as usize, head_dim);
            // sm_80 allows 163 KiB of dynamic shared memory per block.
            assert!(config.smem_bytes() <= 163 * 1024, "{name}: {} bytes", config.smem_bytes());
            assert_eq!(config.block_m, config.warps * 16 * config.m_tiles);
        }
    }
}

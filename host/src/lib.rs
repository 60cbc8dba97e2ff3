//! FlashAttention-2 forward and backward on NVIDIA GPUs (sm_80 and newer), from Rust alone.
//!
//! The kernels are Rust (the `flash-attn-kernels` crate) compiled to PTX,
//! which this crate embeds; [`FlashAttention`] loads it into a CUDA context
//! once and launches it. No CUDA C++, no nvcc, and no CUDA toolkit to build:
//! the driver (`libcuda`) is opened at run time, so a program built with
//! this crate starts anywhere and reports [`Error::DriverUnavailable`]
//! where there is no NVIDIA driver.
//!
//! Tensors are `[batch, seqlen, heads, head_dim]`, f16 or bf16, in device
//! memory, with any strides on the first three dimensions (multiples of 8
//! elements, the seqlen one at most [`MAX_ROW_STRIDE`]) and a contiguous
//! last one. Supported: head dims 32 to 256 in steps of 32,
//! causal (bottom-right aligned) and not, any sequence lengths, MQA/GQA.
//! Every invalid input returns an [`Error`] and launches nothing.
//!
//! The backward pass ([`FlashAttention::backward_into`],
//! [`FlashAttention::backward_varlen_into`]) gives dQ, dK and dV at head
//! dims 32 to 256 for every mask and score modifier of the forward.
//!
//! Beyond dense batches: variable-length batches
//! ([`FlashAttention::forward_varlen_into`], [`SeqOffsets`]), KV caches, dense or
//! paged, with in-place append ([`FlashAttention::forward_kvcache_into`],
//! [`KvCache`], [`CacheSeqlens`], [`BlockTable`]), sliding windows, softcap
//! and ALiBi ([`AttentionParams`]), and split-KV for few queries over many
//! keys ([`num_splits_heuristic`], [`Workspace`]).
//!
//! Which kernels a call runs (the family, sm_80 or sm_90a, each kernel's
//! entry point and grid) is decided on the host before anything launches:
//! [`FlashAttention::explain_forward`] and its siblings
//! (`explain_forward_varlen`, `explain_forward_kvcache`, `explain_backward`,
//! `explain_backward_varlen`) return it as a [`CallPlan`] without launching.
//!
//! # Front doors
//!
//! One core (validation, planning, launch on device addresses and driver
//! handles) behind three doors, which differ only in whose buffers and
//! streams they take:
//! - `cust` (default feature): `DeviceBuffer`/`DeviceSlice` of `half` 1.8
//!   values ([`half1`]), `cust::stream::Stream`, and the calls that allocate
//!   their outputs ([`FlashAttention::forward`] and friends). `cust` itself
//!   links `libcuda` at build time.
//! - `cudarc` (feature, `default-features = false` to drop `cust`):
//!   `CudaSlice`/`CudaView`/`CudaViewMut` of `half` 2 values ([`f16`],
//!   [`bf16`]) and `CudaStream`; builds with no CUDA anywhere.
//! - raw (always): [`DeviceView::from_raw`], [`DeviceViewMut::from_raw`] and
//!   [`RawStream::from_raw`] over device pointers and a `CUstream`, for
//!   tch, burn or any other binding (`unsafe`: you vouch for the memory).
//!
//! With `cust`:
//!
//! ```no_run
//! # #[cfg(feature = "cust")]
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use flash_attn::{AttentionParams, FlashAttention, Tensor};
//! use flash_attn::cust::memory::DeviceBuffer;
//! use flash_attn::cust::stream::{Stream, StreamFlags};
//! use flash_attn::half1::f16; // cust's buffers hold half 1.8 values
//!
//! let _context = flash_attn::cust::quick_init()?;
//! let attention = FlashAttention::new()?;
//! let stream = Stream::new(StreamFlags::NON_BLOCKING, None)?;
//!
//! let (batch, seqlen, heads, head_dim) = (2, 1024, 8, 128);
//! let n = batch * seqlen * heads * head_dim;
//! let host: Vec<f16> = (0..n).map(|i| f16::from_f32(((i % 13) as f32 - 6.0) / 8.0)).collect();
//! let (q, k, v) = (DeviceBuffer::from_slice(&host)?, DeviceBuffer::from_slice(&host)?, DeviceBuffer::from_slice(&host)?);
//! let shape = [batch, seqlen, heads, head_dim];
//!
//! let out = attention.forward(
//!     Tensor::new(&q, shape),
//!     Tensor::new(&k, shape),
//!     Tensor::new(&v, shape),
//!     &AttentionParams { causal: true, ..Default::default() },
//!     &stream,
//! )?;
//! stream.synchronize()?;
//! let o: Vec<f16> = out.o.as_host_vec()?; // [batch, seqlen, heads, head_dim]
//! let lse: Vec<f32> = out.lse.as_host_vec()?; // [batch, heads, seqlen]
//! # Ok(()) }
//! # #[cfg(not(feature = "cust"))]
//! # fn main() {}
//! ```
//!
//! With cudarc (`flash-attn = { ..., default-features = false, features = ["cudarc"] }`):
//!
//! ```no_run
//! # #[cfg(feature = "cudarc")]
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use flash_attn::cudarc::driver::CudaContext;
//! use flash_attn::{f16, AttentionParams, FlashAttention, Tensor, TensorMut};
//!
//! let context = CudaContext::new(0)?; // also makes it current on this thread
//! let stream = context.default_stream();
//! let attention = FlashAttention::new()?;
//!
//! let shape = [1, 4096, 16, 128];
//! let n = shape.iter().product::<usize>();
//! let q = stream.clone_htod(&vec![f16::from_f32(0.5); n])?;
//! let (k, v) = (q.clone(), q.clone());
//! let mut o = stream.alloc_zeros::<f16>(n)?;
//! let mut lse = stream.alloc_zeros::<f32>(shape[0] * shape[2] * shape[1])?;
//! attention.forward_into(
//!     Tensor::new(&q, shape),
//!     Tensor::new(&k, shape),
//!     Tensor::new(&v, shape),
//!     TensorMut::new(&mut o, shape),
//!     &mut lse,
//!     &AttentionParams::default(),
//!     &stream,
//! )?;
//! let o: Vec<f16> = stream.clone_dtoh(&o)?;
//! # Ok(()) }
//! # #[cfg(not(feature = "cudarc"))]
//! # fn main() {}
//! ```

mod attention;
mod bindings;
#[cfg(test)]
mod bounds_tests;
mod call;
mod context;
mod driver;
mod error;
mod kvcache;
mod launch;
mod limits;
mod memory;
mod module;
mod plan;
pub mod reference;
#[cfg(test)]
mod reference_tests;
mod stream;
mod tensor;
mod validate;
mod varlen;
mod workspace;

pub use attention::FlashAttention;
#[cfg(feature = "cust")]
pub use bindings::cust::{BackwardOutput, Output};
pub use call::Problem;
#[cfg(feature = "cudarc")]
pub use cudarc;
#[cfg(feature = "cust")]
pub use cust;
pub use driver::CUstream;
pub use error::{Error, Result};
pub use flash_attn_abi::backward::{BackwardKernel, BACKWARD_KERNELS};
pub use flash_attn_abi::hopper::{HopperKernel, HOPPER_KERNELS};
pub use flash_attn_abi::hopper_backward::{HopperBackwardKernel, HOPPER_BACKWARD_KERNELS};
pub use flash_attn_abi::kernels::{AttentionKernel, Dtype, ATTENTION_KERNELS};
pub use half::{bf16, f16};
#[cfg(feature = "cust")]
pub use half1;
pub use kvcache::{BlockTable, CacheSeqlens, KvCache};
pub use limits::{MAX_DIM, MAX_GRID_YZ, MAX_ROW_STRIDE, MAX_SEQLEN, MAX_SPAN, MAX_SPLITS, SUPPORTED_HEAD_DIMS};
pub use memory::{DeviceView, DeviceViewMut};
pub use module::{KernelResources, PTX};
pub use plan::{num_splits_heuristic, CallPlan, Family, Kernel, PlannedLaunch, MIN_KEY_BLOCKS_PER_SPLIT};
pub use stream::{LaunchStream, RawStream};
pub use tensor::{Element, Gradients, Tensor, TensorMut};
pub use validate::{
    check_block_table_shape, check_cache_seqlens, check_seq_offsets, AttentionParams, Layout, OffsetsSummary, Placed,
};
pub use varlen::{offsets_from_lengths, SeqOffsets};
pub use workspace::Workspace;

/// The stages every call goes through, on host memory descriptions of its
/// tensors ([`Placed`]): validation into a typed [`Call`](pipeline::Call),
/// a pure [`plan`](pipeline::plan) of it, and the kernel launches the plan
/// binds to output and scratch addresses. [`FlashAttention`] runs them on
/// a CUDA stream; they are public for other bindings and for running the
/// kernels elsewhere (this crate's tests run them on the CPU emulator).
pub mod pipeline {
    pub use crate::call::{
        Alibi, Append, BackwardCall, CacheLengths, Call, LseLayout, Mask, Outputs, Pages, Sequences, TensorAt,
    };
    pub use crate::driver::encode_tensor_map;
    pub use crate::plan::{
        plan, plan_backward, plan_backward_for, plan_for, sm90_block_m, BackwardPlan, BackwardRows, KernelArgs,
        KernelFamily, Launch, OutputAddrs, Plan, ScratchLayout, Sm80Backward, Sm80Plan, Sm90Backward, Sm90Plan,
        MAX_DETERMINISTIC_LAUNCHES,
    };
    pub use crate::validate::{
        validate, validate_backward, validate_kvcache, validate_varlen, BackwardTensors, CacheArgs, OffsetsArg,
        OutputBuffers, TableArg,
    };
    pub use flash_attn_abi::backward::BackwardParams;
    pub use flash_attn_abi::hopper::{HopperParams, HopperScratch};
    pub use flash_attn_abi::hopper_backward::{HopperBackwardParams, HopperBackwardScratch};
    pub use flash_attn_abi::params::{AppendParams, CombineParams, ForwardParams};
}

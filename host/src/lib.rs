//! FlashAttention-2 forward on NVIDIA GPUs (sm_80 and newer), from Rust alone.
//!
//! The kernels are Rust (the `flash-attn-kernels` crate) compiled to PTX,
//! which this crate embeds; [`FlashAttention`] loads it into the current CUDA
//! context once and launches it through `cust`. No CUDA C++ and no nvcc.
//!
//! Tensors are `[batch, seqlen, heads, head_dim]`, f16 or bf16, in device
//! memory, with any strides on the first three dimensions (multiples of 8
//! elements, the seqlen one at most [`MAX_ROW_STRIDE`]) and a contiguous
//! last one. Supported: head dims 32 to 256 in steps of 32,
//! causal (bottom-right aligned) and not, any sequence lengths, MQA/GQA.
//! Every invalid input returns an [`Error`] and launches nothing.
//!
//! Beyond dense batches: variable-length batches
//! ([`FlashAttention::forward_varlen`], [`SeqOffsets`]), KV caches, dense or
//! paged, with in-place append ([`FlashAttention::forward_kvcache`],
//! [`KvCache`], [`CacheSeqlens`], [`BlockTable`]), sliding windows, softcap
//! and ALiBi ([`AttentionParams`]), and split-KV for few queries over many
//! keys ([`num_splits_heuristic`], [`Workspace`]).
//!
//! ```no_run
//! use flash_attn::{AttentionParams, FlashAttention, Tensor, f16};
//! use cust::memory::DeviceBuffer;
//! use cust::stream::{Stream, StreamFlags};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let _context = cust::quick_init()?;
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
//! ```

mod attention;
#[cfg(test)]
mod bounds_tests;
mod call;
mod context;
mod error;
mod kvcache;
mod launch;
mod module;
mod plan;
pub mod reference;
#[cfg(test)]
mod reference_tests;
mod tensor;
mod validate;
mod varlen;
mod workspace;

pub use attention::{FlashAttention, Output};
pub use call::{Problem, MAX_SPLITS};
pub use cust;
pub use error::{Error, Result};
use flash_attn_abi::config;
pub use flash_attn_abi::kernels::{AttentionKernel, Dtype, ATTENTION_KERNELS};
pub use half::{bf16, f16};
pub use kvcache::{check_block_table_shape, check_cache_seqlens, BlockTable, CacheSeqlens, KvCache};
pub use module::{Kernel, KernelResources, PTX};
pub use plan::{num_splits_heuristic, MIN_KEY_BLOCKS_PER_SPLIT};
pub use tensor::{Element, Tensor, TensorMut};
pub use validate::{
    AttentionParams, Layout, Placed, MAX_DIM, MAX_GRID_YZ, MAX_ROW_STRIDE, MAX_SEQLEN, MAX_SPAN, SUPPORTED_HEAD_DIMS,
};
pub use varlen::{check_seq_offsets, offsets_from_lengths, OffsetsSummary, SeqOffsets};
pub use workspace::Workspace;

/// The stages every call goes through, on host memory descriptions of its
/// tensors ([`Placed`]): validation into a typed [`Call`](pipeline::Call),
/// a pure [`plan`](pipeline::plan) of it, and the kernel launches the plan
/// binds to output and scratch addresses. [`FlashAttention`] runs them on
/// a CUDA stream; they are public for other bindings and for running the
/// kernels elsewhere (this crate's tests run them on the CPU emulator).
pub mod pipeline {
    pub use crate::call::{Alibi, Append, CacheLengths, Call, LseLayout, Mask, Outputs, Pages, Sequences, TensorAt};
    pub use crate::plan::{plan, KernelArgs, Launch, OutputAddrs, Plan, ScratchLayout};
    pub use crate::validate::{
        validate, validate_kvcache, validate_varlen, CacheArgs, OffsetsArg, OutputBuffers, TableArg,
    };
    pub use flash_attn_abi::params::{AppendParams, CombineParams, ForwardParams};
}

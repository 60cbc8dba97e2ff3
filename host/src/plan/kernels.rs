//! The kernels a plan names, and its launches: each kernel with its
//! geometry and argument block, in the order they run.

use flash_attn_abi::backward::{backward_finish_kernel, backward_prepare_kernel, BackwardKernel, BackwardParams};
use flash_attn_abi::hopper::{HopperKernel, HopperParams};
use flash_attn_abi::hopper_backward::{HopperBackwardKernel, HopperBackwardParams};
use flash_attn_abi::kernels::{combine_kernel, AttentionKernel, Dtype, APPEND_KERNEL};
use flash_attn_abi::params::{AppendParams, CombineParams, ForwardParams};

/// A kernel of the embedded PTX modules, as a plan names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// A row of the ABI's table of attention kernels.
    Attention(&'static AttentionKernel),
    /// A row of the ABI's table of sm_90a kernels.
    Hopper(&'static HopperKernel),
    /// A row of the ABI's table of sm_90a main backward kernels.
    HopperBackward(&'static HopperBackwardKernel),
    /// The split-KV merge of an element type.
    Combine(Dtype),
    /// The KV cache append.
    Append,
    /// A row of the ABI's table of main backward kernels.
    Backward(&'static BackwardKernel),
    /// The backward's first kernel (delta, the dQ accumulator zeroed) and
    /// its last (dQ), of an element type.
    BackwardPrepare(Dtype),
    BackwardFinish(Dtype),
}

impl Kernel {
    /// The PTX entry point.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Attention(kernel) => kernel.name,
            Kernel::Hopper(kernel) => kernel.name,
            Kernel::HopperBackward(kernel) => kernel.name,
            Kernel::Combine(dtype) => combine_kernel(dtype),
            Kernel::Append => APPEND_KERNEL,
            Kernel::Backward(kernel) => kernel.name,
            Kernel::BackwardPrepare(dtype) => backward_prepare_kernel(dtype),
            Kernel::BackwardFinish(dtype) => backward_finish_kernel(dtype),
        }
    }
}

/// The addresses of a call's outputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutputAddrs {
    pub o: u64,
    pub lse: u64,
}

/// A kernel's argument block.
#[derive(Clone, Copy, Debug)]
pub enum KernelArgs {
    Forward(ForwardParams),
    Backward(BackwardParams),
    Hopper(HopperParams),
    HopperBackward(HopperBackwardParams),
    Combine(CombineParams),
    Append(AppendParams),
}

/// One kernel launch of a bound plan.
#[derive(Clone, Copy, Debug)]
pub struct Launch {
    pub kernel: Kernel,
    pub grid: [u32; 3],
    pub threads: u32,
    pub smem_bytes: u32,
    pub args: KernelArgs,
}

/// Alignment of each region of a call's scratch memory, in bytes.
pub const SCRATCH_ALIGN: usize = 256;

//! The tensors a call takes: element types, and `[batch, seqlen, heads,
//! head_dim]` tensors over views of device memory ([`crate::memory`]).

use flash_attn_abi::kernels::Dtype;

use crate::memory::{DeviceView, DeviceViewMut};
use crate::validate::{Layout, Placed};

mod sealed {
    pub trait Sealed {}
    impl Sealed for half::f16 {}
    impl Sealed for half::bf16 {}
    #[cfg(feature = "cust")]
    impl Sealed for half1::f16 {}
    #[cfg(feature = "cust")]
    impl Sealed for half1::bf16 {}
}

/// An element type the kernels take: [`f16`](half::f16) or
/// [`bf16`](half::bf16) of `half` 2 (with the `cust` feature also those of
/// `half` 1.8, the only ones `cust`'s buffers hold).
pub trait Element: Copy + sealed::Sealed + 'static {
    /// The type's part of the kernel name.
    const NAME: &'static str;
    /// The type as the kernel table names it.
    const DTYPE: Dtype;
}
impl Element for half::f16 {
    const NAME: &'static str = "f16";
    const DTYPE: Dtype = Dtype::F16;
}
impl Element for half::bf16 {
    const NAME: &'static str = "bf16";
    const DTYPE: Dtype = Dtype::Bf16;
}
#[cfg(feature = "cust")]
impl Element for half1::f16 {
    const NAME: &'static str = "f16";
    const DTYPE: Dtype = Dtype::F16;
}
#[cfg(feature = "cust")]
impl Element for half1::bf16 {
    const NAME: &'static str = "bf16";
    const DTYPE: Dtype = Dtype::Bf16;
}

/// A read-only `[batch, seqlen, heads, head_dim]` view of device memory.
#[derive(Clone, Copy)]
pub struct Tensor<'a, T: Element> {
    pub(crate) memory: DeviceView<'a, T>,
    pub(crate) layout: Layout,
}

impl<'a, T: Element> Tensor<'a, T> {
    /// A densely packed tensor of `shape` at the start of `memory`.
    pub fn new(memory: impl Into<DeviceView<'a, T>>, shape: [usize; 4]) -> Self {
        Self { memory: memory.into(), layout: Layout::contiguous(shape) }
    }

    /// A tensor with explicit strides, in elements.
    pub fn strided(memory: impl Into<DeviceView<'a, T>>, shape: [usize; 4], strides: [usize; 4]) -> Self {
        Self { memory: memory.into(), layout: Layout::strided(shape, strides) }
    }

    /// The sequences of a variable-length batch packed one after another,
    /// `[total_tokens, heads, head_dim]` contiguous, viewed as `[1,
    /// total_tokens, heads, head_dim]` (see [`FlashAttention::forward_varlen_into`](crate::FlashAttention::forward_varlen_into)).
    pub fn packed(memory: impl Into<DeviceView<'a, T>>, [total_tokens, heads, head_dim]: [usize; 3]) -> Self {
        Self::new(memory, [1, total_tokens, heads, head_dim])
    }

    pub(crate) fn placed(&self, name: &'static str) -> Placed {
        Placed { name, layout: self.layout, addr: self.memory.addr, buffer_len: self.memory.len }
    }
}

/// A writable `[batch, seqlen, heads, head_dim]` view of device memory.
pub struct TensorMut<'a, T: Element> {
    pub(crate) memory: DeviceViewMut<'a, T>,
    pub(crate) layout: Layout,
}

impl<'a, T: Element> TensorMut<'a, T> {
    /// A densely packed tensor of `shape` at the start of `memory`.
    pub fn new(memory: impl Into<DeviceViewMut<'a, T>>, shape: [usize; 4]) -> Self {
        Self { memory: memory.into(), layout: Layout::contiguous(shape) }
    }

    /// A tensor with explicit strides, in elements.
    pub fn strided(memory: impl Into<DeviceViewMut<'a, T>>, shape: [usize; 4], strides: [usize; 4]) -> Self {
        Self { memory: memory.into(), layout: Layout::strided(shape, strides) }
    }

    /// A packed variable-length tensor, as [`Tensor::packed`].
    pub fn packed(memory: impl Into<DeviceViewMut<'a, T>>, [total_tokens, heads, head_dim]: [usize; 3]) -> Self {
        Self::new(memory, [1, total_tokens, heads, head_dim])
    }

    pub(crate) fn placed(&self, name: &'static str) -> Placed {
        Placed { name, layout: self.layout, addr: self.memory.addr, buffer_len: self.memory.len }
    }
}

/// The gradients a backward call writes: `d_q` with q's shape, `d_k` and
/// `d_v` with k's (see [`FlashAttention::backward_into`](crate::FlashAttention::backward_into)).
pub struct Gradients<'a, T: Element> {
    pub d_q: TensorMut<'a, T>,
    pub d_k: TensorMut<'a, T>,
    pub d_v: TensorMut<'a, T>,
}

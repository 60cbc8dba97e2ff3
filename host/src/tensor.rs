//! The tensors a call takes: element types, and `[batch, seqlen, heads,
//! head_dim]` views of device buffers with their layouts.

use cust::memory::{DeviceCopy, DeviceSlice};
use flash_attn_abi::kernels::Dtype;

use crate::validate::{Layout, Placed};

mod sealed {
    pub trait Sealed {}
    impl Sealed for half::f16 {}
    impl Sealed for half::bf16 {}
}

/// An element type the kernels take: [`f16`](half::f16) or [`bf16`](half::bf16).
pub trait Element: DeviceCopy + sealed::Sealed {
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

/// A read-only `[batch, seqlen, heads, head_dim]` view of a device buffer.
#[derive(Clone, Copy)]
pub struct Tensor<'a, T: Element> {
    buffer: &'a DeviceSlice<T>,
    pub(crate) layout: Layout,
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

    /// The sequences of a variable-length batch packed one after another,
    /// `[total_tokens, heads, head_dim]` contiguous, viewed as `[1,
    /// total_tokens, heads, head_dim]` (see [`FlashAttention::forward_varlen`]).
    pub fn packed(buffer: &'a DeviceSlice<T>, [total_tokens, heads, head_dim]: [usize; 3]) -> Self {
        Self::new(buffer, [1, total_tokens, heads, head_dim])
    }

    pub(crate) fn placed(&self, name: &'static str) -> Placed {
        Placed { name, layout: self.layout, addr: self.buffer.as_device_ptr().as_raw(), buffer_len: self.buffer.len() }
    }
}

/// A writable `[batch, seqlen, heads, head_dim]` view of a device buffer.
pub struct TensorMut<'a, T: Element> {
    buffer: &'a mut DeviceSlice<T>,
    pub(crate) layout: Layout,
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

    /// A packed variable-length tensor, as [`Tensor::packed`].
    pub fn packed(buffer: &'a mut DeviceSlice<T>, [total_tokens, heads, head_dim]: [usize; 3]) -> Self {
        Self::new(buffer, [1, total_tokens, heads, head_dim])
    }

    pub(crate) fn placed(&self, name: &'static str) -> Placed {
        Placed { name, layout: self.layout, addr: self.buffer.as_device_ptr().as_raw(), buffer_len: self.buffer.len() }
    }
}

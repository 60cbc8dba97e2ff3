//! The memory a call takes: element types, views of device memory whatever
//! binding allocated it, and `[batch, seqlen, heads, head_dim]` tensors
//! over those views.

use std::marker::PhantomData;

use flash_attn_abi::kernels::Dtype;

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

/// Device memory a call reads: `len` elements of `T` at a device address,
/// borrowed for `'a`. Made from a binding's buffer with `From` (`&cust`
/// `DeviceSlice`/`DeviceBuffer`, `&cudarc` `CudaSlice`/`CudaView`), or from a
/// raw pointer with [`DeviceView::from_raw`].
#[derive(Clone, Copy)]
pub struct DeviceView<'a, T> {
    pub(crate) addr: u64,
    pub(crate) len: usize,
    /// The cudarc memory behind the view, whose reads are ordered on the
    /// call's stream at launch.
    #[cfg(feature = "cudarc")]
    pub(crate) cudarc: Option<&'a dyn crate::bindings::cudarc::Read>,
    pub(crate) _memory: PhantomData<&'a [T]>,
}

impl<T> DeviceView<'_, T> {
    /// A view of `len` elements at device address `addr`.
    ///
    /// # Safety
    /// `addr..addr + len * size_of::<T>()` is device memory of the context
    /// the kernels were loaded into, readable for as long as the view lives
    /// and until the work of every call given the view has finished; work
    /// that writes it is ordered (on the call's stream, or synchronized)
    /// before the call.
    pub unsafe fn from_raw(addr: u64, len: usize) -> Self {
        Self {
            addr,
            len,
            #[cfg(feature = "cudarc")]
            cudarc: None,
            _memory: PhantomData,
        }
    }

    /// The device address of the first element.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the view holds no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl<T> std::fmt::Debug for DeviceView<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceView {{ addr: {:#x}, len: {} }}", self.addr, self.len)
    }
}

/// Device memory a call writes, borrowed mutably for `'a`: as
/// [`DeviceView`], from `&mut` buffers or [`DeviceViewMut::from_raw`].
pub struct DeviceViewMut<'a, T> {
    pub(crate) addr: u64,
    pub(crate) len: usize,
    /// The cudarc memory behind the view, whose writes are ordered on the
    /// call's stream at launch.
    #[cfg(feature = "cudarc")]
    pub(crate) cudarc: Option<&'a mut dyn crate::bindings::cudarc::Write>,
    pub(crate) _memory: PhantomData<&'a mut [T]>,
}

impl<T> DeviceViewMut<'_, T> {
    /// A writable view of `len` elements at device address `addr`.
    ///
    /// # Safety
    /// As [`DeviceView::from_raw`], and nothing else reads or writes the
    /// memory while the work of a call given the view runs.
    pub unsafe fn from_raw(addr: u64, len: usize) -> Self {
        Self {
            addr,
            len,
            #[cfg(feature = "cudarc")]
            cudarc: None,
            _memory: PhantomData,
        }
    }

    /// The device address of the first element.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the view holds no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl<T> std::fmt::Debug for DeviceViewMut<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceViewMut {{ addr: {:#x}, len: {} }}", self.addr, self.len)
    }
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

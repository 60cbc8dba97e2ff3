//! Views of device memory, whatever binding allocated it: an address, a
//! length and the borrow that keeps the memory alive; for cudarc memory
//! also the slice, whose reads and writes a call orders on its stream
//! ([`crate::stream::StreamOrder`]).

use std::marker::PhantomData;

/// cudarc memory a call reads.
#[cfg(feature = "cudarc")]
pub(crate) trait Read {
    /// The device address, with reads ordered on `stream` until the guard drops.
    fn read_on<'g>(&'g self, stream: &'g cudarc::driver::CudaStream) -> cudarc::driver::SyncOnDrop<'g>;
}

/// cudarc memory a call writes.
#[cfg(feature = "cudarc")]
pub(crate) trait Write {
    /// The device address, with writes ordered on `stream` until the guard drops.
    fn write_on<'g>(&'g mut self, stream: &'g cudarc::driver::CudaStream) -> cudarc::driver::SyncOnDrop<'g>;
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
    pub(crate) cudarc: Option<&'a dyn Read>,
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
    pub(crate) cudarc: Option<&'a mut dyn Write>,
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

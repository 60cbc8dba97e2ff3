//! The CUDA context a value's device resources live in, kept alive for as
//! long as the value.
//!
//! A user's values drop in whatever order their program declares them: a
//! struct whose context (cust's `Context`, cudarc's `Arc<CudaContext>`) comes before its `FlashAttention`
//! releases the context first. Releasing the last reference to a device's
//! primary context destroys it, and unloading a module or freeing memory of
//! a destroyed context crashes in the driver. So everything of ours that
//! owns device resources holds a [`ContextRef`]: a reference on the primary
//! context it was made in, released only after those resources.

use std::marker::PhantomData;
use std::sync::Arc;

use crate::driver::{check, driver, CUcontext, CUdevice, CUdeviceptr, CUstream};
use crate::error::{Error, Result};

/// A counted reference on a context.
#[derive(Clone)]
pub(crate) struct ContextRef(Arc<Retained>);

struct Retained {
    context: CUcontext,
    device: CUdevice,
    /// The context is the device's primary context and this holds one of
    /// its references (`cuDevicePrimaryCtxRetain`). A context made with
    /// `cuCtxCreate` has no reference count: its owner must destroy it
    /// after everything made in it.
    primary: bool,
}

impl ContextRef {
    /// The calling thread's current context, retained if it is a primary
    /// context. Fails if no context is current.
    pub(crate) fn current() -> Result<Self> {
        let d = driver()?;
        let mut context: CUcontext = std::ptr::null_mut();
        check("cuCtxGetCurrent", unsafe { (d.ctx_get_current)(&mut context) })?;
        if context.is_null() {
            return Err(Error::NoContext);
        }
        let mut device: CUdevice = 0;
        check("cuCtxGetDevice", unsafe { (d.ctx_get_device)(&mut device) })?;
        let mut primary_context: CUcontext = std::ptr::null_mut();
        check("cuDevicePrimaryCtxRetain", unsafe { (d.primary_ctx_retain)(&mut primary_context, device) })?;
        let primary = primary_context == context;
        if !primary {
            // Not ours to keep: give the reference back.
            check("cuDevicePrimaryCtxRelease", unsafe { (d.primary_ctx_release)(device) })?;
        }
        Ok(Self(Arc::new(Retained { context, device, primary })))
    }

    /// The device the context belongs to.
    pub(crate) fn device(&self) -> CUdevice {
        self.0.device
    }

    /// Runs `f` with this context current on the calling thread: every
    /// call pushes the context of the kernels it launches, so that
    /// [`FlashAttention`](crate::FlashAttention) may be used from any thread,
    /// and destructors (which may run on a thread where another context, or
    /// none, is current) free memory in its own context.
    pub(crate) fn with_current<R>(&self, f: impl FnOnce() -> R) -> R {
        // The context was retained, so the driver was loaded.
        let Ok(d) = driver() else { return f() };
        let pushed = unsafe { (d.ctx_push_current)(self.0.context) } == 0;
        let result = f();
        if pushed {
            let mut popped: CUcontext = std::ptr::null_mut();
            unsafe { (d.ctx_pop_current)(&mut popped) };
        }
        result
    }

    /// Fails with [`Error::WrongContext`] unless work on `stream` runs in
    /// this context (the legacy default stream, null, runs in the current
    /// one).
    pub(crate) fn check_stream(&self, stream: CUstream) -> Result<()> {
        let d = driver()?;
        let mut context: CUcontext = std::ptr::null_mut();
        check("cuStreamGetCtx", unsafe { (d.stream_get_ctx)(stream, &mut context) })?;
        if context != self.0.context {
            return Err(Error::WrongContext);
        }
        Ok(())
    }
}

// SAFETY: a driver-API context handle may be used from any thread (pushed,
// retained or released there); `Retained` only does that.
unsafe impl Send for Retained {}
unsafe impl Sync for Retained {}

impl Drop for Retained {
    fn drop(&mut self) {
        if self.primary {
            // Fails only for a device that is gone; a destructor cannot report it.
            if let Ok(d) = driver() {
                unsafe { (d.primary_ctx_release)(self.device) };
            }
        }
    }
}

/// Device memory allocated with `cuMemAlloc`, freed in its own context,
/// which it keeps alive.
pub(crate) struct DeviceAlloc {
    addr: CUdeviceptr,
    bytes: usize,
    context: ContextRef,
}

impl DeviceAlloc {
    /// `bytes` bytes (at least one) of uninitialized memory in the current context.
    pub(crate) fn new(bytes: usize) -> Result<Self> {
        let context = ContextRef::current()?;
        let d = driver()?;
        let mut addr: CUdeviceptr = 0;
        check("cuMemAlloc", unsafe { (d.mem_alloc)(&mut addr, bytes.max(1)) })?;
        Ok(Self { addr, bytes, context })
    }

    pub(crate) fn addr(&self) -> CUdeviceptr {
        self.addr
    }

    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for DeviceAlloc {
    fn drop(&mut self) {
        // `cuMemFree` waits for work still using the memory. It fails only
        // with a broken context, and a destructor cannot report it.
        self.context.with_current(|| {
            if let Ok(d) = driver() {
                unsafe { (d.mem_free)(self.addr) };
            }
        });
    }
}

/// Values uploaded to device memory: what the crate's small device arrays
/// (sequence offsets, cache lengths, block tables) hold.
pub(crate) struct DeviceArray<T: Copy> {
    memory: DeviceAlloc,
    _values: PhantomData<T>,
}

impl<T: Copy> DeviceArray<T> {
    /// `values`, copied to the current context's device (synchronously).
    pub(crate) fn upload(values: &[T]) -> Result<Self> {
        let bytes = std::mem::size_of_val(values);
        let memory = DeviceAlloc::new(bytes)?;
        let d = driver()?;
        check("cuMemcpyHtoD", unsafe { (d.memcpy_htod)(memory.addr(), values.as_ptr().cast(), bytes) })?;
        Ok(Self { memory, _values: PhantomData })
    }

    /// The device address of the first value.
    pub(crate) fn addr(&self) -> u64 {
        self.memory.addr()
    }
}

//! The CUDA context a value's device resources live in, kept alive for as
//! long as the value.
//!
//! A user's values drop in whatever order their program declares them: a
//! struct whose `cust::context::Context` comes before its `FlashAttention`
//! releases the context first. Releasing the last reference to a device's
//! primary context destroys it, and unloading a module or freeing memory of
//! a destroyed context crashes in the driver. So everything of ours that
//! owns device resources holds a [`ContextRef`]: a reference on the primary
//! context it was made in, released only after those resources.

use std::mem::ManuallyDrop;
use std::sync::Arc;

use cust::memory::{DeviceBuffer, DeviceCopy};

use cust::sys::{
    cuCtxGetCurrent, cuCtxGetDevice, cuCtxPopCurrent_v2, cuCtxPushCurrent_v2, cuDevicePrimaryCtxRelease_v2,
    cuDevicePrimaryCtxRetain, CUcontext, CUdevice,
};

use crate::error::driver_call;
use crate::error::{Error, Result};

/// A counted reference on the context current when it was taken.
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
        let mut context: CUcontext = std::ptr::null_mut();
        driver_call("cuCtxGetCurrent", unsafe { cuCtxGetCurrent(&mut context) })?;
        if context.is_null() {
            return Err(Error::NoContext);
        }
        let mut device: CUdevice = 0;
        driver_call("cuCtxGetDevice", unsafe { cuCtxGetDevice(&mut device) })?;
        let mut primary_context: CUcontext = std::ptr::null_mut();
        driver_call("cuDevicePrimaryCtxRetain", unsafe { cuDevicePrimaryCtxRetain(&mut primary_context, device) })?;
        let primary = primary_context == context;
        if !primary {
            // Not ours to keep: give the reference back.
            driver_call("cuDevicePrimaryCtxRelease", unsafe { cuDevicePrimaryCtxRelease_v2(device) })?;
        }
        Ok(Self(Arc::new(Retained { context, device, primary })))
    }

    /// Runs `f` with this context current on the calling thread, for the
    /// driver calls of a destructor (which the user may run on a thread
    /// where another context, or none, is current).
    pub(crate) fn with_current<R>(&self, f: impl FnOnce() -> R) -> R {
        let pushed = unsafe { cuCtxPushCurrent_v2(self.0.context) } == cust::sys::cudaError_enum::CUDA_SUCCESS;
        let result = f();
        if pushed {
            let mut popped: CUcontext = std::ptr::null_mut();
            unsafe { cuCtxPopCurrent_v2(&mut popped) };
        }
        result
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
            unsafe { cuDevicePrimaryCtxRelease_v2(self.device) };
        }
    }
}

/// Values uploaded to device memory, freed in their own context, which
/// they keep alive: what the crate's small device arrays (sequence
/// offsets, cache lengths, block tables) hold.
pub(crate) struct DeviceArray<T: DeviceCopy> {
    buffer: ManuallyDrop<DeviceBuffer<T>>,
    context: ContextRef,
}

impl<T: DeviceCopy> DeviceArray<T> {
    /// `values`, copied to the current context's device.
    pub(crate) fn upload(values: &[T]) -> Result<Self> {
        let context = ContextRef::current()?;
        Ok(Self { buffer: ManuallyDrop::new(DeviceBuffer::from_slice(values)?), context })
    }

    /// The device address of the first value.
    pub(crate) fn addr(&self) -> u64 {
        self.buffer.as_device_ptr().as_raw()
    }
}

impl<T: DeviceCopy> Drop for DeviceArray<T> {
    fn drop(&mut self) {
        // SAFETY: the buffer is not used again.
        self.context.with_current(|| unsafe { ManuallyDrop::drop(&mut self.buffer) });
    }
}

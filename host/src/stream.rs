//! The stream a call runs on, whatever binding made it, and the ordering of
//! the call's memory on it.

use crate::driver::CUstream;
use crate::error::Result;
use crate::memory::{DeviceView, DeviceViewMut};

pub(crate) mod sealed {
    /// A stream as the launch sees it.
    pub struct LaunchOn<'s> {
        pub(crate) raw: crate::driver::CUstream,
        /// The cudarc stream, which orders cudarc memory.
        #[cfg(feature = "cudarc")]
        pub(crate) cudarc: Option<&'s cudarc::driver::CudaStream>,
        pub(crate) _stream: std::marker::PhantomData<&'s ()>,
    }

    pub trait Sealed {
        fn launch_on(&self) -> LaunchOn<'_>;
    }
}

/// A stream the kernels can be launched on: `cust`'s `Stream`, cudarc's
/// `CudaStream` (or `Arc<CudaStream>`), or a driver handle wrapped in a
/// [`RawStream`]. The stream must belong to the context the kernels were
/// loaded into ([`Error::WrongContext`](crate::Error::WrongContext) otherwise).
pub trait LaunchStream: sealed::Sealed {}

impl<S: sealed::Sealed> LaunchStream for S {}

/// A driver stream handle (`CUstream`) of any binding (tch, burn, your
/// own), for the raw front door.
#[derive(Clone, Copy, Debug)]
pub struct RawStream(CUstream);

impl RawStream {
    /// Wraps `stream`.
    ///
    /// # Safety
    /// `stream` is a live stream (or null, the legacy default stream) for
    /// as long as calls are launched on it.
    pub unsafe fn from_raw(stream: CUstream) -> Self {
        Self(stream)
    }

    /// The driver handle.
    pub fn as_raw(&self) -> CUstream {
        self.0
    }
}

impl sealed::Sealed for RawStream {
    fn launch_on(&self) -> sealed::LaunchOn<'_> {
        sealed::LaunchOn {
            raw: self.0,
            #[cfg(feature = "cudarc")]
            cudarc: None,
            _stream: std::marker::PhantomData,
        }
    }
}

/// The ordering of a call's memory on its stream, held from before the
/// launches to after them. Memory of bindings that track it (cudarc's
/// events) waits for earlier work on it and records the call's work when
/// this is dropped; other memory is ordered by the caller, as its binding
/// does for its own kernels.
pub(crate) struct StreamOrder<'s> {
    pub(crate) stream: CUstream,
    #[cfg(feature = "cudarc")]
    cudarc: Option<&'s cudarc::driver::CudaStream>,
    #[cfg(feature = "cudarc")]
    guards: Vec<cudarc::driver::SyncOnDrop<'s>>,
    #[cfg(not(feature = "cudarc"))]
    _stream: std::marker::PhantomData<&'s ()>,
}

impl<'s> StreamOrder<'s> {
    pub(crate) fn new(on: sealed::LaunchOn<'s>) -> Self {
        Self {
            stream: on.raw,
            #[cfg(feature = "cudarc")]
            cudarc: on.cudarc,
            #[cfg(feature = "cudarc")]
            guards: Vec::new(),
            #[cfg(not(feature = "cudarc"))]
            _stream: std::marker::PhantomData,
        }
    }

    /// Orders the reads of `view` (named `name` in errors) on the stream.
    #[cfg_attr(not(feature = "cudarc"), allow(unused_variables))]
    pub(crate) fn read<T>(&mut self, name: &'static str, view: &DeviceView<'s, T>) -> Result<()> {
        #[cfg(feature = "cudarc")]
        if let Some(memory) = view.cudarc {
            let stream = self.cudarc.ok_or(crate::error::Error::MixedBindings { tensor: name })?;
            self.guards.push(memory.read_on(stream));
        }
        Ok(())
    }

    /// Orders the reads of a call over q, k and v (and what `params`
    /// points to).
    pub(crate) fn inputs<T>(
        &mut self,
        q: &DeviceView<'s, T>,
        k: &DeviceView<'s, T>,
        v: &DeviceView<'s, T>,
        params: &crate::validate::AttentionParams<'s>,
    ) -> Result<()> {
        self.read("q", q)?;
        self.read("k", k)?;
        self.read("v", v)?;
        self.params(params)
    }

    /// Orders the device memory `params` points to (the ALiBi slopes).
    pub(crate) fn params(&mut self, params: &crate::validate::AttentionParams<'s>) -> Result<()> {
        match &params.alibi_slopes {
            Some(slopes) => self.read("alibi_slopes", slopes),
            None => Ok(()),
        }
    }

    /// Orders the writes of `view` on the stream.
    #[cfg_attr(not(feature = "cudarc"), allow(unused_variables))]
    pub(crate) fn write<T>(&mut self, name: &'static str, view: &'s mut DeviceViewMut<'_, T>) -> Result<()> {
        #[cfg(feature = "cudarc")]
        if let Some(memory) = view.cudarc.as_deref_mut() {
            let stream = self.cudarc.ok_or(crate::error::Error::MixedBindings { tensor: name })?;
            self.guards.push(memory.write_on(stream));
        }
        Ok(())
    }
}

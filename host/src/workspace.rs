//! Device scratch memory of the calls that need it: the split-KV partial
//! outputs and the sequence lengths of a KV cache append.

use crate::context::DeviceAlloc;
use crate::driver::{check, driver, CUdeviceptr, CUstream};
use crate::error::Result;

/// Reusable device scratch for [`FlashAttention::forward_kvcache`](crate::FlashAttention::forward_kvcache):
/// the split-KV partial results (f32, `num_splits * batch * heads_q *
/// seqlen_q * (head_dim + 1)`) and, when appending, the new cache lengths.
///
/// It starts empty and grows on demand, never shrinks, so that a decode
/// loop allocates only on its first (or a larger) step. Growing frees the
/// old buffer with `cuMemFree`, which waits for work still using it.
/// Calls that share a workspace must run in order: on one stream, or on
/// streams the caller synchronizes.
///
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let _context = flash_attn::cust::quick_init()?;
/// let mut workspace = flash_attn::Workspace::new(); // allocates nothing yet
/// // ... attention.forward_kvcache(q, cache, &params, &mut workspace, &stream) at every step
/// # let _ = &mut workspace;
/// # Ok(()) }
/// ```
///
/// It keeps the context its memory lives in alive until it is dropped (see
/// [`FlashAttention`](crate::FlashAttention)).
#[derive(Default)]
pub struct Workspace {
    /// The scratch, which keeps the context it was allocated in alive.
    buffer: Option<DeviceAlloc>,
}

impl Workspace {
    /// An empty workspace; the first call that needs scratch allocates it.
    pub fn new() -> Self {
        Self::default()
    }

    /// Bytes allocated.
    pub fn capacity(&self) -> usize {
        self.buffer.as_ref().map_or(0, DeviceAlloc::bytes)
    }

    /// The device address of at least `bytes` bytes of scratch, in the
    /// current context.
    pub(crate) fn reserve(&mut self, bytes: usize) -> Result<u64> {
        if self.capacity() < bytes {
            // Free first (waiting for work that still uses it), then allocate.
            self.buffer = None;
            self.buffer = Some(DeviceAlloc::new(bytes)?);
        }
        Ok(self.buffer.as_ref().map_or(0, DeviceAlloc::addr))
    }
}

/// Where a call's scratch comes from.
pub(crate) enum Scratch<'a> {
    /// The caller's workspace.
    Workspace(&'a mut Workspace),
    /// Allocated on the call's stream and freed on it after the call's
    /// kernels (stream-ordered, `cuMemAllocAsync` / `cuMemFreeAsync`): no
    /// synchronization, and nothing kept between calls.
    PerCall { stream: CUstream, buffer: Option<(CUdeviceptr, usize)> },
}

impl Scratch<'_> {
    /// Scratch allocated for one call on `stream`.
    pub(crate) fn per_call(stream: CUstream) -> Self {
        Scratch::PerCall { stream, buffer: None }
    }

    /// The device address of `bytes` bytes of scratch.
    pub(crate) fn reserve(&mut self, bytes: usize) -> Result<u64> {
        match self {
            Scratch::Workspace(workspace) => workspace.reserve(bytes),
            Scratch::PerCall { stream, buffer } => {
                if buffer.map_or(0, |(_, len)| len) < bytes {
                    let d = driver()?;
                    if let Some((old, _)) = buffer.take() {
                        check("cuMemFreeAsync", unsafe { (d.mem_free_async)(old, *stream) })?;
                    }
                    let mut addr: CUdeviceptr = 0;
                    check("cuMemAllocAsync", unsafe { (d.mem_alloc_async)(&mut addr, bytes, *stream) })?;
                    *buffer = Some((addr, bytes));
                }
                Ok(buffer.map_or(0, |(addr, _)| addr))
            }
        }
    }
}

impl Drop for Scratch<'_> {
    fn drop(&mut self) {
        if let Scratch::PerCall { stream, buffer: Some((addr, _)) } = *self {
            // Freed once the stream has run the call's kernels. This fails
            // only with a broken context, and a destructor cannot report it.
            if let Ok(d) = driver() {
                unsafe { (d.mem_free_async)(addr, stream) };
            }
        }
    }
}

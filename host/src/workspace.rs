//! Device scratch memory of the calls that need it: the split-KV partial
//! outputs and the sequence lengths of a KV cache append.

use cust::memory::DeviceBuffer;
use cust::stream::Stream;

use crate::context::ContextRef;
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
    /// The scratch and the context it was allocated in.
    buffer: Option<(DeviceBuffer<u8>, ContextRef)>,
}

impl Workspace {
    /// An empty workspace; the first call that needs scratch allocates it.
    pub fn new() -> Self {
        Self::default()
    }

    /// Bytes allocated.
    pub fn capacity(&self) -> usize {
        self.buffer.as_ref().map_or(0, |(b, _)| b.len())
    }

    /// The device address of at least `bytes` bytes of scratch, in the
    /// current context.
    pub(crate) fn reserve(&mut self, bytes: usize) -> Result<u64> {
        if self.capacity() < bytes {
            // Free first (waiting for work that still uses it), then allocate.
            self.free();
            let context = ContextRef::current()?;
            self.buffer = Some((unsafe { DeviceBuffer::uninitialized(bytes)? }, context));
        }
        Ok(self.buffer.as_ref().map_or(0, |(b, _)| b.as_device_ptr().as_raw()))
    }

    /// Frees the scratch in its own context, then lets the context go.
    fn free(&mut self) {
        if let Some((buffer, context)) = self.buffer.take() {
            context.with_current(|| drop(buffer));
        }
    }
}

impl Drop for Workspace {
    fn drop(&mut self) {
        self.free();
    }
}

/// Where a call's scratch comes from.
pub(crate) enum Scratch<'a> {
    /// The caller's workspace.
    Workspace(&'a mut Workspace),
    /// Allocated on the call's stream and freed on it after the call's
    /// kernels (stream-ordered, `cuMemAllocAsync` / `cuMemFreeAsync`): no
    /// synchronization, and nothing kept between calls.
    PerCall { stream: &'a Stream, buffer: Option<DeviceBuffer<u8>> },
}

impl<'a> Scratch<'a> {
    /// Scratch allocated for one call on `stream`.
    pub(crate) fn per_call(stream: &'a Stream) -> Self {
        Scratch::PerCall { stream, buffer: None }
    }

    /// The device address of `bytes` bytes of scratch.
    pub(crate) fn reserve(&mut self, bytes: usize) -> Result<u64> {
        match self {
            Scratch::Workspace(workspace) => workspace.reserve(bytes),
            Scratch::PerCall { stream, buffer } => {
                if buffer.as_ref().map_or(0, |b| b.len()) < bytes {
                    if let Some(old) = buffer.take() {
                        old.drop_async(stream)?;
                    }
                    *buffer = Some(unsafe { DeviceBuffer::uninitialized_async(bytes, stream)? });
                }
                Ok(buffer.as_ref().map_or(0, |b| b.as_device_ptr().as_raw()))
            }
        }
    }
}

impl Drop for Scratch<'_> {
    fn drop(&mut self) {
        if let Scratch::PerCall { stream, buffer } = self {
            if let Some(buffer) = buffer.take() {
                // Freed once the stream has run the call's kernels. This fails
                // only with a broken context, and a destructor cannot report it.
                let _ = buffer.drop_async(stream);
            }
        }
    }
}

//! Device scratch memory of the calls that need it: the split-KV partial
//! outputs and counters, and the sequence lengths of a KV cache append.

use cust::memory::DeviceBuffer;
use cust::stream::Stream;

use crate::error::Result;

/// Reusable device scratch for [`FlashAttention::forward_kvcache`](crate::FlashAttention::forward_kvcache):
/// the split-KV partial results (f32, `num_splits * batch * heads_q *
/// seqlen_q * (head_dim + 4)`), the split-KV counters (u32, `batch *
/// heads_q * seqlen_q`) and, when appending, the new cache lengths.
///
/// It starts empty and grows on demand, never shrinks, so that a decode
/// loop allocates only on its first (or a larger) step. Growing frees the
/// old buffers with `cuMemFree`, which waits for work still using them.
/// The counters are zeroed on the call's stream when allocated, and every
/// split call leaves them zero again: the last CTA of each query block to
/// finish, which merges the splits, resets its counter. So calls that
/// share a workspace must run in order, one after the other: on one
/// stream, or on streams the caller synchronizes.
///
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let _context = flash_attn::cust::quick_init()?;
/// let mut workspace = flash_attn::Workspace::new(); // allocates nothing yet
/// // ... attention.forward_kvcache(q, cache, &params, &mut workspace, &stream) at every step
/// # let _ = &mut workspace;
/// # Ok(()) }
/// ```
#[derive(Default)]
pub struct Workspace {
    buffer: Option<DeviceBuffer<u8>>,
    counters: Option<DeviceBuffer<u32>>,
}

impl Workspace {
    /// An empty workspace; the first call that needs scratch allocates it.
    pub fn new() -> Self {
        Self::default()
    }

    /// Bytes allocated, counters included.
    pub fn capacity(&self) -> usize {
        self.buffer.as_ref().map_or(0, |b| b.len()) + 4 * self.counters.as_ref().map_or(0, |c| c.len())
    }

    /// The device address of at least `bytes` bytes of scratch.
    fn reserve(&mut self, bytes: usize) -> Result<u64> {
        if self.buffer.as_ref().map_or(0, |b| b.len()) < bytes {
            // Free first (waiting for work that still uses it), then allocate.
            self.buffer = None;
            self.buffer = Some(unsafe { DeviceBuffer::uninitialized(bytes)? });
        }
        Ok(self.buffer.as_ref().map_or(0, |b| b.as_device_ptr().as_raw()))
    }

    /// The device address of at least `count` zero u32 counters: zeroed on
    /// `stream` when allocated, left zero by the calls that use them.
    fn counters(&mut self, count: usize, stream: &Stream) -> Result<u64> {
        if self.counters.as_ref().map_or(0, |c| c.len()) < count {
            self.counters = None;
            let mut counters = unsafe { DeviceBuffer::<u32>::uninitialized(count)? };
            unsafe { counters.set_zero_async(stream)? };
            self.counters = Some(counters);
        }
        Ok(self.counters.as_ref().map_or(0, |c| c.as_device_ptr().as_raw()))
    }
}

/// Where a call's scratch comes from.
pub(crate) enum Scratch<'a> {
    /// The caller's workspace, used on `stream`.
    Workspace { workspace: &'a mut Workspace, stream: &'a Stream },
    /// Allocated on the call's stream and freed on it after the call's
    /// kernels (stream-ordered, `cuMemAllocAsync` / `cuMemFreeAsync`): no
    /// synchronization, and nothing kept between calls.
    PerCall { stream: &'a Stream, buffer: Option<DeviceBuffer<u8>>, counters: Option<DeviceBuffer<u32>> },
}

impl<'a> Scratch<'a> {
    /// Scratch allocated for one call on `stream`.
    pub(crate) fn per_call(stream: &'a Stream) -> Self {
        Scratch::PerCall { stream, buffer: None, counters: None }
    }

    /// The device address of `bytes` bytes of scratch.
    pub(crate) fn reserve(&mut self, bytes: usize) -> Result<u64> {
        match self {
            Scratch::Workspace { workspace, .. } => workspace.reserve(bytes),
            Scratch::PerCall { stream, buffer, .. } => {
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

    /// The device address of `count` u32 counters that are zero when the
    /// call's next kernel starts (zeroed on the stream, stream-ordered).
    pub(crate) fn counters(&mut self, count: usize) -> Result<u64> {
        match self {
            Scratch::Workspace { workspace, stream } => workspace.counters(count, stream),
            Scratch::PerCall { stream, counters, .. } => {
                if let Some(old) = counters.take() {
                    old.drop_async(stream)?;
                }
                let zeroed = counters.insert(unsafe { DeviceBuffer::zeroed_async(count, stream)? });
                Ok(zeroed.as_device_ptr().as_raw())
            }
        }
    }
}

impl Drop for Scratch<'_> {
    fn drop(&mut self) {
        if let Scratch::PerCall { stream, buffer, counters } = self {
            // Freed once the stream has run the call's kernels. This fails
            // only with a broken context, and a destructor cannot report it.
            if let Some(buffer) = buffer.take() {
                let _ = buffer.drop_async(stream);
            }
            if let Some(counters) = counters.take() {
                let _ = counters.drop_async(stream);
            }
        }
    }
}

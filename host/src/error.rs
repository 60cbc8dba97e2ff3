//! The errors the attention calls return. Every invalid input is caught before
//! any allocation or launch.

use std::fmt;

/// Why an attention call was refused or failed.
#[derive(Debug, Clone, PartialEq)]
pub enum Error {
    /// A tensor has a zero-sized dimension.
    EmptyTensor { tensor: &'static str },
    /// Shapes of q, k, v, o (or the lse buffer) do not fit together.
    ShapeMismatch(String),
    /// No kernel exists for this head dim.
    UnsupportedHeadDim(usize),
    /// Query heads must be a multiple of key/value heads.
    HeadsNotDivisible { heads_q: usize, heads_kv: usize },
    /// The last (head_dim) dimension must have stride 1.
    LastDimNotContiguous { tensor: &'static str, stride: usize },
    /// The base pointer or a stride is not a multiple of 16 bytes.
    Misaligned { tensor: &'static str, what: &'static str },
    /// The view reaches past the end of its buffer.
    OutOfBounds { tensor: &'static str, needed: usize, len: usize },
    /// A size past what the kernel indexes or the launch grid allows.
    TooLarge { what: &'static str, value: usize, max: usize },
    /// A tensor with a dimension past [`MAX_DIM`](crate::MAX_DIM), or whose
    /// view spans more than [`MAX_SPAN`](crate::MAX_SPAN) elements.
    TensorTooLarge { tensor: &'static str, shape: [usize; 4], strides: [usize; 4] },
    /// The seqlen (row) stride of a tensor past what the kernels' 32-bit row
    /// offsets allow ([`MAX_ROW_STRIDE`](crate::MAX_ROW_STRIDE)).
    RowStrideTooLarge { tensor: &'static str, stride: usize, max: usize },
    /// An output (`o`, `lse`, a cache being appended to) overlaps another
    /// argument of the call, input or output.
    Aliasing { output: &'static str, other: &'static str },
    /// The strides of a tensor the call writes make distinct elements share memory.
    OverlappingOutput { tensor: &'static str, strides: [usize; 4] },
    /// The softmax scale must be positive, and finite once the kernels fold
    /// it with log2(e).
    InvalidScale(f32),
    /// The softcap must be positive, and finite once the kernels fold it
    /// with log2(e) and into the softmax scale.
    InvalidSoftcap(f32),
    /// `num_splits` must be between 1 and `max`.
    InvalidNumSplits { num_splits: usize, max: usize },
    /// The ALiBi slopes must be one per query head, or one per (batch, query head).
    AlibiSlopesLength { len: usize, heads_q: usize, batch: usize },
    /// Sequence offsets (`cu_seqlens`) that do not describe packed sequences.
    InvalidSeqOffsets(String),
    /// A cached sequence length is negative.
    NegativeCacheSeqlen { batch: usize, seqlen: i32 },
    /// A batch's cached keys plus the appended ones do not fit its cache.
    CacheOverflow { batch: usize, needed: usize, capacity: usize },
    /// The page size of a paged KV cache is not a positive multiple of `multiple`.
    InvalidPageSize { page_size: usize, multiple: usize },
    /// A block table that does not fit the cache it indexes.
    InvalidBlockTable(String),
    /// The GPU's compute capability is below 8.0 (mma.sync bf16, cp.async).
    UnsupportedDevice { major: i32, minor: i32 },
    /// The kernel a call needs takes more shared memory a block (`needs`
    /// bytes) than this GPU gives one (`available`): the larger backward
    /// kernels on sm_86/89's 99 KB.
    SharedMemoryTooSmall { kernel: &'static str, needs: u32, available: u32 },
    /// No CUDA context is current on the calling thread.
    NoContext,
    /// The stream of a call belongs to another context than the one the
    /// kernels were loaded into.
    WrongContext,
    /// Device memory of one binding (cudarc) passed with a stream of
    /// another: its reads and writes could not be ordered on the call's stream.
    MixedBindings { tensor: &'static str },
    /// The NVIDIA driver library could not be loaded or initialized (no
    /// driver installed, or no usable GPU).
    DriverUnavailable(String),
    /// A CUDA driver call failed with this status.
    DriverCall { call: &'static str, code: u32, name: String },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::EmptyTensor { tensor } => write!(f, "{tensor} has a dimension of size 0"),
            Error::ShapeMismatch(msg) => write!(f, "shape mismatch: {msg}"),
            Error::UnsupportedHeadDim(d) => {
                write!(f, "head_dim {d} is not supported (supported: {:?})", crate::limits::SUPPORTED_HEAD_DIMS)
            }
            Error::HeadsNotDivisible { heads_q, heads_kv } => {
                write!(f, "query heads ({heads_q}) must be a multiple of key/value heads ({heads_kv})")
            }
            Error::LastDimNotContiguous { tensor, stride } => {
                write!(f, "{tensor}: the head_dim dimension must be contiguous (stride 1), got stride {stride}")
            }
            Error::Misaligned { tensor, what } => {
                write!(f, "{tensor}: {what} must be a multiple of 16 bytes (8 elements)")
            }
            Error::OutOfBounds { tensor, needed, len } => {
                write!(f, "{tensor}: the view needs {needed} elements but its buffer has {len}")
            }
            Error::TooLarge { what, value, max } => {
                write!(f, "{what} = {value} exceeds the supported maximum {max}")
            }
            Error::TensorTooLarge { tensor, shape, strides } => write!(
                f,
                "{tensor}: the view of shape {shape:?} and strides {strides:?} exceeds the supported sizes \
                 (dimensions of at most {} and a span of at most {} elements)",
                crate::limits::MAX_DIM,
                crate::limits::MAX_SPAN
            ),
            Error::RowStrideTooLarge { tensor, stride, max } => write!(
                f,
                "{tensor}: the seqlen stride {stride} exceeds the supported maximum {max} elements \
                 (the kernels compute row offsets in 32 bits)"
            ),
            Error::Aliasing { output, other } => {
                write!(f, "{output} overlaps {other}: an output may share memory with no other argument")
            }
            Error::OverlappingOutput { tensor, strides } => {
                write!(f, "{tensor}: strides {strides:?} make distinct elements share memory")
            }
            Error::InvalidScale(s) => {
                write!(f, "softmax_scale must be > 0 with softmax_scale * log2(e) finite, got {s}")
            }
            Error::InvalidSoftcap(c) => {
                write!(f, "softcap must be > 0 with softcap * log2(e) and softmax_scale / softcap finite, got {c}")
            }
            Error::InvalidNumSplits { num_splits, max } => {
                write!(f, "num_splits must be between 1 and {max}, got {num_splits}")
            }
            Error::AlibiSlopesLength { len, heads_q, batch } => write!(
                f,
                "alibi_slopes holds {len} f32, but must hold heads_q = {heads_q} (one per head) or \
                 batch * heads_q = {} (one per batch and head)",
                batch.saturating_mul(*heads_q)
            ),
            Error::InvalidSeqOffsets(msg) => write!(f, "invalid sequence offsets: {msg}"),
            Error::NegativeCacheSeqlen { batch, seqlen } => {
                write!(f, "cache_seqlens[{batch}] = {seqlen} is negative")
            }
            Error::CacheOverflow { batch, needed, capacity } => write!(
                f,
                "batch {batch} needs {needed} cache slots (cached plus appended keys) but its cache holds {capacity}"
            ),
            Error::InvalidPageSize { page_size, multiple } => {
                write!(f, "page_size {page_size} must be a positive multiple of {multiple}")
            }
            Error::InvalidBlockTable(msg) => write!(f, "invalid block table: {msg}"),
            Error::UnsupportedDevice { major, minor } => {
                write!(f, "compute capability {major}.{minor} is not supported; sm_80 or newer is required")
            }
            Error::SharedMemoryTooSmall { kernel, needs, available } => write!(
                f,
                "{kernel} needs {needs} bytes of shared memory a block; this GPU gives a block at most {available}"
            ),
            Error::NoContext => write!(
                f,
                "no CUDA context is current on this thread: create one first (cust::quick_init(), \
                 cudarc's CudaContext::new, or bind one to the thread)"
            ),
            Error::WrongContext => {
                write!(f, "the stream belongs to another CUDA context than the one the kernels were loaded into")
            }
            Error::MixedBindings { tensor } => write!(
                f,
                "{tensor} is cudarc memory but the stream is not a cudarc stream: pass the CudaStream of the call"
            ),
            Error::DriverUnavailable(why) => write!(f, "the CUDA driver is not available: {why}"),
            Error::DriverCall { call, code, name } => write!(f, "{call} failed: {name} ({code})"),
        }
    }
}

impl std::error::Error for Error {}

/// Result of this crate's calls.
pub type Result<T> = std::result::Result<T, Error>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_memory_too_small_names_the_kernel_and_both_sizes() {
        let e = Error::SharedMemoryTooSmall { kernel: "flash_bwd_d128_f16", needs: 152576, available: 101376 };
        let text = e.to_string();
        assert!(text.contains("flash_bwd_d128_f16") && text.contains("152576") && text.contains("101376"), "{text}");
    }
}

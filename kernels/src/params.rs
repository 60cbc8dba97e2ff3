//! The argument block of every forward kernel, shared byte for byte by the
//! device crate and the host crate (which includes this file).

/// Strides are in elements; the last dimension (head_dim) is contiguous.
/// Tensors are laid out [batch, seqlen, heads, head_dim].
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ForwardParams {
    pub q: *const u16,
    pub k: *const u16,
    pub v: *const u16,
    pub o: *mut u16,
    /// Log-sum-exp per query row, contiguous [batch, heads_q, seqlen_q], f32.
    pub lse: *mut f32,
    pub q_batch_stride: i64,
    pub q_row_stride: i64,
    pub q_head_stride: i64,
    pub k_batch_stride: i64,
    pub k_row_stride: i64,
    pub k_head_stride: i64,
    pub v_batch_stride: i64,
    pub v_row_stride: i64,
    pub v_head_stride: i64,
    pub o_batch_stride: i64,
    pub o_row_stride: i64,
    pub o_head_stride: i64,
    pub seqlen_q: u32,
    pub seqlen_k: u32,
    pub heads_q: u32,
    /// Query heads per key/value head (1 for MHA, heads_q for MQA).
    pub heads_per_kv: u32,
    /// softmax_scale * log2(e): the scale folded into the exp2 argument.
    pub scale_log2: f32,
    pub _pad: u32,
}

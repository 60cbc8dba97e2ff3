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

/// A tensor as the kernel sees it: its first element and its strides (in
/// elements) over batch, seqlen and heads.
#[derive(Clone, Copy, Debug)]
pub struct TensorArg<P> {
    pub ptr: P,
    pub strides: [i64; 3],
}

/// The sizes of one forward call.
#[derive(Clone, Copy, Debug)]
pub struct ForwardSizes {
    pub seqlen_q: u32,
    pub seqlen_k: u32,
    pub heads_q: u32,
    pub heads_per_kv: u32,
}

impl ForwardParams {
    /// The argument block of one call; `softmax_scale` is folded with
    /// log2(e) for the kernels' exp2.
    pub fn new(
        q: TensorArg<*const u16>,
        k: TensorArg<*const u16>,
        v: TensorArg<*const u16>,
        o: TensorArg<*mut u16>,
        lse: *mut f32,
        sizes: ForwardSizes,
        softmax_scale: f32,
    ) -> Self {
        let ([qb, qs, qh], [kb, ks, kh], [vb, vs, vh], [ob, os, oh]) = (q.strides, k.strides, v.strides, o.strides);
        ForwardParams {
            q: q.ptr,
            k: k.ptr,
            v: v.ptr,
            o: o.ptr,
            lse,
            q_batch_stride: qb,
            q_row_stride: qs,
            q_head_stride: qh,
            k_batch_stride: kb,
            k_row_stride: ks,
            k_head_stride: kh,
            v_batch_stride: vb,
            v_row_stride: vs,
            v_head_stride: vh,
            o_batch_stride: ob,
            o_row_stride: os,
            o_head_stride: oh,
            seqlen_q: sizes.seqlen_q,
            seqlen_k: sizes.seqlen_k,
            heads_q: sizes.heads_q,
            heads_per_kv: sizes.heads_per_kv,
            scale_log2: softmax_scale * core::f32::consts::LOG2_E,
            _pad: 0,
        }
    }
}

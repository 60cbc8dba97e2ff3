//! The argument blocks of the kernels, shared byte for byte by the device
//! crate and the host crate.
//!
//! [`ForwardParams`] drives every attention kernel. The dense kernels
//! (`flash_fwd_*_full`, `*_causal`) read only its first part; the general
//! kernels (`*_general`, `*_decode`) also read the features after it, each
//! of which is off when null, -1 or 0 ([`ForwardParams::new`] sets them so).

/// Strides are in elements; the last dimension (head_dim) is contiguous.
/// Tensors are laid out [batch, seqlen, heads, head_dim].
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ForwardParams {
    pub q: *const u16,
    pub k: *const u16,
    pub v: *const u16,
    pub o: *mut u16,
    /// Natural log-sum-exp per query row, f32: row `r` of (batch `b`, head
    /// `h`) at `b * lse_batch_stride + h * lse_head_stride + r` (plus the
    /// batch's first token, `cu_seqlens_q[b]`, for variable lengths).
    pub lse: *mut f32,
    pub lse_batch_stride: i64,
    pub lse_head_stride: i64,
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
    /// Query rows per batch (the longest, for variable lengths).
    pub seqlen_q: u32,
    /// Keys per batch (unused where `cu_seqlens_k` or `seqused_k` say).
    pub seqlen_k: u32,
    pub heads_q: u32,
    /// Query heads per key/value head (1 for MHA, heads_q for MQA).
    pub heads_per_kv: u32,
    /// softmax_scale * log2(e): the scale folded into the exp2 argument.
    pub scale_log2: f32,

    // ---- General kernels only. ----
    /// Null, or `batch + 1` offsets: the rows of batch `b` are tokens
    /// `cu_seqlens_q[b]..cu_seqlens_q[b + 1]` of q, o (and lse), addressed
    /// with the row stride; the batch strides are then unused.
    pub cu_seqlens_q: *const i32,
    /// Null, or `batch + 1` offsets of the keys of each batch in k and v.
    pub cu_seqlens_k: *const i32,
    /// Null, or the number of keys of each batch (a KV cache's lengths);
    /// overrides `seqlen_k` and the counts of `cu_seqlens_k`.
    pub seqused_k: *const i32,
    /// Null, or `[batch, block_table_batch_stride]` page indices: key `j` of
    /// batch `b` lives in page `block_table[b * stride + j / page_size]`, row
    /// `j % page_size`, and the k/v batch strides step from page to page.
    pub block_table: *const i32,
    pub block_table_batch_stride: i64,
    /// Keys per page, a multiple of every kernel's key block (64).
    pub page_size: u32,
    /// Key `j` is visible from row `i` when `i + d - window_left <= j <=
    /// i + d + window_right`, `d = seqlen_k - seqlen_q` of the batch; -1
    /// leaves that side unbounded. Causal is `window_right = 0`.
    pub window_left: i32,
    pub window_right: i32,
    /// Softcap `c` (0: none): the scores become `c * tanh(scale * s / c)`.
    /// Held as `scale / c` and `c * log2(e)`.
    pub softcap_scale: f32,
    pub softcap_log2: f32,
    /// Null, or ALiBi slopes: head `h` of batch `b` adds
    /// `-slope * |i + d - j|` to the scaled score, slope at
    /// `alibi_slopes[b * alibi_batch_stride + h]` (stride 0: one per head).
    pub alibi_slopes: *const f32,
    pub alibi_batch_stride: i64,
    /// Split-KV: the key blocks of each row block are divided among this
    /// many CTAs (grid x = `num_splits * m_blocks`, split-major). With more
    /// than one, each writes its normalised output and LSE to `o_partial`
    /// (`[num_splits, batch, heads_q, seqlen_q, head_dim]` f32) and
    /// `lse_partial` (`[num_splits, batch, heads_q, seqlen_q]`), not to o/lse,
    /// and `flash_combine_*` merges them.
    pub num_splits: u32,
    /// Batches of the call (the grid's z).
    pub batch: u32,
    pub o_partial: *mut f32,
    pub lse_partial: *mut f32,
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
    pub batch: u32,
    /// Query rows per batch (the longest, for variable lengths).
    pub seqlen_q: u32,
    /// Keys per batch (unused where `cu_seqlens_k` or `seqused_k` say).
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
            lse_batch_stride: sizes.heads_q as i64 * sizes.seqlen_q as i64,
            lse_head_stride: sizes.seqlen_q as i64,
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
            cu_seqlens_q: core::ptr::null(),
            cu_seqlens_k: core::ptr::null(),
            seqused_k: core::ptr::null(),
            block_table: core::ptr::null(),
            block_table_batch_stride: 0,
            page_size: 0,
            window_left: -1,
            window_right: -1,
            softcap_scale: 0.0,
            softcap_log2: 0.0,
            alibi_slopes: core::ptr::null(),
            alibi_batch_stride: 0,
            num_splits: 1,
            batch: sizes.batch,
            o_partial: core::ptr::null_mut(),
            lse_partial: core::ptr::null_mut(),
        }
    }

    /// Sets the softcap `softcap` (> 0) for a softmax scale `softmax_scale`.
    pub fn set_softcap(&mut self, softcap: f32, softmax_scale: f32) {
        self.softcap_scale = softmax_scale / softcap;
        self.softcap_log2 = softcap * core::f32::consts::LOG2_E;
    }
}

/// The most CTAs the keys of one query block are split among (the host
/// refuses more; the merge loads this many splits per row at once).
pub const MAX_SPLITS: u32 = 128;

/// Warps per block of the combine kernel, and columns per warp.
pub const COMBINE_WARPS: u32 = 4;
pub const COMBINE_COLUMNS: u32 = 8;

/// The arguments of `flash_combine_{f16,bf16}`, which merges the split-KV
/// partial outputs. Launch: [`COMBINE_THREADS`](crate::kernels::COMBINE_THREADS)
/// threads (each warp one row's slice of [`COMBINE_COLUMNS`] columns), grid x
/// = [`combine_grid`](crate::kernels::combine_grid), no dynamic shared memory.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CombineParams {
    /// As [`ForwardParams::o_partial`] and [`ForwardParams::lse_partial`].
    pub o_partial: *const f32,
    pub lse_partial: *const f32,
    /// As the o/lse fields of the forward call (cu_seqlens_q included).
    pub o: *mut u16,
    pub o_batch_stride: i64,
    pub o_row_stride: i64,
    pub o_head_stride: i64,
    pub lse: *mut f32,
    pub lse_batch_stride: i64,
    pub lse_head_stride: i64,
    pub cu_seqlens_q: *const i32,
    pub num_splits: u32,
    pub batch: u32,
    pub heads_q: u32,
    pub seqlen_q: u32,
    pub head_dim: u32,
    pub _pad: u32,
}

impl CombineParams {
    /// The combine of the split-KV forward call `forward` of `head_dim`.
    pub fn of(forward: &ForwardParams, head_dim: u32) -> Self {
        CombineParams {
            o_partial: forward.o_partial,
            lse_partial: forward.lse_partial,
            o: forward.o,
            o_batch_stride: forward.o_batch_stride,
            o_row_stride: forward.o_row_stride,
            o_head_stride: forward.o_head_stride,
            lse: forward.lse,
            lse_batch_stride: forward.lse_batch_stride,
            lse_head_stride: forward.lse_head_stride,
            cu_seqlens_q: forward.cu_seqlens_q,
            num_splits: forward.num_splits,
            batch: forward.batch,
            heads_q: forward.heads_q,
            seqlen_q: forward.seqlen_q,
            head_dim,
            _pad: 0,
        }
    }
}

/// The arguments of `kv_cache_append`, which copies new keys and values
/// into a KV cache after each batch's `cache_seqlens[b]` cached ones (through
/// the block table if paged). Launch: [`APPEND_THREADS`](crate::kernels::APPEND_THREADS)
/// threads, grid [`append_grid`](crate::kernels::append_grid), no dynamic
/// shared memory.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AppendParams {
    pub k_new: *const u16,
    pub v_new: *const u16,
    /// Strides over [batch, seqlen, heads] of `k_new` and `v_new`.
    pub k_new_strides: [i64; 3],
    pub v_new_strides: [i64; 3],
    pub k_cache: *mut u16,
    pub v_cache: *mut u16,
    /// Strides over [batch (or page), seqlen, heads] of the caches.
    pub k_cache_strides: [i64; 3],
    pub v_cache_strides: [i64; 3],
    /// Keys already in the cache, per batch.
    pub cache_seqlens: *const i32,
    /// As [`ForwardParams::block_table`] (null: not paged).
    pub block_table: *const i32,
    pub block_table_batch_stride: i64,
    pub page_size: u32,
    pub head_dim: u32,
}

//! A call's argument blocks, built here and nowhere else: the one
//! [`ForwardParams`] of a forward call (which the sm_80 kernels take, the
//! sm_90a ones inside their `HopperParams`, the backward inside its
//! `BackwardParams`), and which kernels the call's features need.

use flash_attn_abi::params::{ForwardParams, ForwardSizes, TensorArg};

use crate::call::{CacheLengths, Call, Mask, Sequences, TensorAt};

/// Whether `call` needs a general kernel, of either family: a window, a
/// score modifier (softcap, ALiBi), or sequences other than dense (packed,
/// a KV cache). The dense kernels (`full`, `causal`) read none of those
/// fields, so that each feature's code folds away in them.
pub fn needs_general(call: &Call) -> bool {
    matches!(call.mask, Mask::Window { .. })
        || call.softcap.is_some()
        || call.alibi.is_some()
        || call.sequences != Sequences::Dense
}

/// The forward kernels' argument block of `call`: its tensors, sizes and
/// scale ([`ForwardParams::new`]), then each of its features from the
/// call's types (the others left off: -1, 0 and null), unsplit, its outputs
/// and scratch not yet bound.
pub fn forward_params(call: &Call) -> ForwardParams {
    let p = &call.problem;
    let input = |t: &TensorAt| TensorArg { ptr: t.addr as *const u16, strides: t.strides };
    let o = TensorArg { ptr: core::ptr::null_mut(), strides: call.o_strides };
    let sizes = ForwardSizes {
        batch: p.batch as u32,
        seqlen_q: p.seqlen_q as u32,
        seqlen_k: p.seqlen_k as u32,
        heads_q: p.heads_q as u32,
        heads_per_kv: (p.heads_q / p.heads_kv) as u32,
    };
    let mut args =
        ForwardParams::new(input(&call.q), input(&call.k), input(&call.v), o, core::ptr::null_mut(), sizes, call.scale);
    args.lse_batch_stride = call.lse.batch_stride;
    args.lse_head_stride = call.lse.head_stride;
    let side = |bound: Option<u32>| bound.map_or(-1, |n| n as i32);
    (args.window_left, args.window_right) = match call.mask {
        Mask::None => (-1, -1),
        Mask::Causal => (-1, 0),
        Mask::Window { left, right } => (side(left), side(right)),
    };
    if let Some(softcap) = call.softcap {
        args.set_softcap(softcap, call.scale);
    }
    if let Some(alibi) = call.alibi {
        args.alibi_slopes = alibi.addr as *const f32;
        args.alibi_batch_stride = alibi.batch_stride;
    }
    match &call.sequences {
        Sequences::Dense => {}
        Sequences::Packed { cu_seqlens_q, cu_seqlens_k, .. } => {
            args.cu_seqlens_q = *cu_seqlens_q as *const i32;
            args.cu_seqlens_k = *cu_seqlens_k as *const i32;
        }
        Sequences::Cache { lengths, pages } => {
            if let CacheLengths::Device(addr) = lengths {
                args.seqused_k = *addr as *const i32;
            }
            if let Some(pages) = pages {
                args.block_table = pages.table as *const i32;
                args.block_table_batch_stride = pages.pages_per_seq as i64;
                args.page_size = pages.page_size;
            }
        }
    }
    args
}

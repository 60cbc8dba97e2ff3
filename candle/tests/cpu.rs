//! Argument checking on CPU tensors: each call fails with candle's error
//! naming the argument, before any GPU is touched, so these run anywhere.

use candle_core::{DType, Device, Result, Tensor};
use flash_attn_candle as fa;

fn t(shape: &[usize], dtype: DType) -> Tensor {
    Tensor::zeros(shape, dtype, &Device::Cpu).unwrap()
}

fn err(r: Result<Tensor>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

fn contains(e: &str, want: &str) {
    assert!(e.contains(want), "error {e:?} does not say {want:?}");
}

#[test]
fn dtypes_must_be_f16_or_bf16_and_equal() {
    let q = t(&[1, 8, 2, 64], DType::F32);
    contains(&err(fa::flash_attn(&q, &q, &q, 1.0, false)), "only supported for f16/bf16");
    let (q, k) = (t(&[1, 8, 2, 64], DType::F16), t(&[1, 8, 2, 64], DType::BF16));
    contains(&err(fa::flash_attn(&q, &k, &q, 1.0, false)), "q is F16 but k is BF16");
    contains(&err(fa::flash_attn(&q, &q, &k, 1.0, false)), "q is F16 but v is BF16");
}

#[test]
fn ranks_and_shapes_are_checked() {
    let q = t(&[8, 2, 64], DType::F16);
    contains(&err(fa::flash_attn(&q, &q, &q, 1.0, false)), "q must have rank 4");
    let q = t(&[1, 8, 4, 64], DType::F16);
    let k = t(&[2, 8, 4, 64], DType::F16);
    contains(&err(fa::flash_attn(&q, &k, &k, 1.0, false)), "shape mismatch q");
    let k = t(&[1, 8, 4, 64], DType::F16);
    let v = t(&[1, 9, 4, 64], DType::F16);
    contains(&err(fa::flash_attn(&q, &k, &v, 1.0, false)), "shape mismatch k");
    let k = t(&[1, 8, 3, 64], DType::F16);
    contains(
        &err(fa::flash_attn(&q, &k, &k, 1.0, false)),
        "number of k/v heads 3 must divide number of heads in query 4",
    );
}

#[test]
fn head_dims_are_checked() {
    for d in [20, 264, 512] {
        let q = t(&[1, 8, 2, d], DType::BF16);
        contains(&err(fa::flash_attn(&q, &q, &q, 1.0, false)), &format!("head_dim {d} is not supported"));
    }
    assert_eq!(fa::kernel_head_dim(64).unwrap(), 64);
    assert_eq!(fa::kernel_head_dim(8).unwrap(), 32);
    assert_eq!(fa::kernel_head_dim(80).unwrap(), 96);
    assert_eq!(fa::kernel_head_dim(256).unwrap(), 256);
    assert!(fa::kernel_head_dim(0).is_err());
}

#[test]
fn cpu_tensors_are_refused_after_the_shape_checks() {
    let q = t(&[1, 8, 2, 64], DType::F16);
    contains(&err(fa::flash_attn(&q, &q, &q, 1.0, true)), "q must be a CUDA tensor");
    contains(&err(fa::flash_attn_windowed(&q, &q, &q, 1.0, Some(4), Some(0))), "q must be a CUDA tensor");
    let alibi = t(&[2], DType::F32);
    contains(&err(fa::flash_attn_alibi(&q, &q, &q, &alibi, 1.0, false)), "q must be a CUDA tensor");
    contains(
        &err(fa::flash_attn_alibi_windowed_softcap(&q, &q, &q, None, 1.0, None, None, 30.0)),
        "q must be a CUDA tensor",
    );
    assert!(fa::flash_attention(&Device::Cpu).is_err());
}

#[test]
fn alibi_slopes_are_checked() {
    let q = t(&[2, 8, 4, 64], DType::F16);
    let alibi = t(&[4], DType::F16);
    contains(&err(fa::flash_attn_alibi(&q, &q, &q, &alibi, 1.0, false)), "DType mismatch alibi_slopes");
    let alibi = t(&[3], DType::F32);
    contains(
        &err(fa::flash_attn_alibi(&q, &q, &q, &alibi, 1.0, false)),
        "shape mismatch alibi_slopes [3], expected [4] or [2, 4]",
    );
    // One slope per batch and head is accepted (then the device check fails).
    let alibi = t(&[2, 4], DType::F32);
    contains(&err(fa::flash_attn_alibi(&q, &q, &q, &alibi, 1.0, false)), "must be a CUDA tensor");
}

fn offsets(v: &[u32]) -> Tensor {
    Tensor::new(v, &Device::Cpu).unwrap()
}

#[test]
fn varlen_arguments_are_checked() {
    let q = t(&[10, 4, 64], DType::F16);
    let k = t(&[12, 2, 64], DType::F16);
    let (cu_q, cu_k) = (offsets(&[0, 4, 10]), offsets(&[0, 5, 12]));
    let varlen = |q: &Tensor, k: &Tensor, cu_q: &Tensor, cu_k: &Tensor, max_q, max_k| {
        fa::flash_attn_varlen(q, k, k, cu_q, cu_k, max_q, max_k, 1.0, true)
    };
    contains(&err(varlen(&q, &k, &cu_q, &cu_k, 6, 7)), "q must be a CUDA tensor");
    let q4 = t(&[1, 10, 4, 64], DType::F16);
    contains(&err(varlen(&q4, &k, &cu_q, &cu_k, 6, 7)), "q must have rank 3");
    contains(&err(varlen(&q, &k, &cu_q, &cu_k, 5, 7)), "longer than its max_seqlen 5");
    contains(&err(varlen(&q, &k, &cu_q, &cu_k, 6, 6)), "seqlens_k has a sequence of 7 tokens");
    contains(&err(varlen(&q, &k, &offsets(&[0, 4, 10]), &offsets(&[0, 12]), 6, 12)), "same number of elements 3 <> 2");
    contains(
        &err(varlen(&q, &k, &offsets(&[0, 4, 9]), &cu_k, 6, 7)),
        "the offsets end at 9 and 12 tokens, but q has 10",
    );
    contains(&err(varlen(&q, &k, &offsets(&[0, 6, 4, 10]), &offsets(&[0, 5, 6, 12]), 6, 7)), "must not decrease");
    contains(&err(varlen(&q, &k, &offsets(&[0]), &offsets(&[0]), 6, 7)), "len >= 2");
    let as_f32 = cu_q.to_dtype(DType::F32).unwrap();
    contains(&err(varlen(&q, &k, &as_f32, &cu_k, 6, 7)), "seqlens_q must be u32 or i32");
    let as_i32 = Tensor::new(&[0i32, 4, 10], &Device::Cpu).unwrap();
    contains(&err(varlen(&q, &k, &as_i32, &cu_k, 6, 7)), "q must be a CUDA tensor");
    let two_d = Tensor::new(&[[0u32, 4, 10]], &Device::Cpu).unwrap();
    contains(&err(varlen(&q, &k, &two_d, &cu_k, 6, 7)), "seqlens_q must have rank 1");
    let alibi = t(&[3], DType::F32);
    let r = fa::flash_attn_varlen_alibi(&q, &k, &k, &alibi, &cu_q, &cu_k, 6, 7, 1.0, false);
    contains(&err(r), "expected [4] or [2, 4]");
}

#[test]
fn kvcache_arguments_are_checked() {
    let q = t(&[2, 1, 8, 64], DType::BF16);
    let cache = t(&[2, 128, 2, 64], DType::BF16);
    let call = |cache: &Tensor, seqlens: &[u32], paged: Option<fa::PagedCache<'_>>| {
        fa::flash_attn_kvcache(&q, cache, cache, seqlens, paged, None, 1.0, None, Some(0), None).map(|(o, _)| o)
    };
    contains(&err(call(&cache, &[5, 7], None)), "q must be a CUDA tensor");
    contains(&err(call(&cache, &[5], None)), "cache_seqlens has 1 entries for a batch of 2");
    contains(&err(call(&cache, &[5, 129], None)), "cache_seqlens entry 129 exceeds the cache's 128 keys");
    contains(&err(call(&t(&[3, 128, 2, 64], DType::BF16), &[5, 7], None)), "has 3 sequences for a batch of 2");
    let pages = t(&[6, 64, 2, 64], DType::BF16);
    let table = [0u32, 1, 2, 3, 4, 5];
    let paged = |pages_per_seq| Some(fa::PagedCache { block_table: &table, pages_per_seq });
    contains(&err(call(&pages, &[100, 192], paged(3))), "q must be a CUDA tensor");
    contains(&err(call(&pages, &[100, 193], paged(3))), "exceeds the cache's 192 keys");
    contains(&err(call(&pages, &[100, 7], paged(4))), "block_table has 6 entries, not batch 2 x pages_per_seq 4");
    let f32_cache = t(&[2, 128, 2, 64], DType::F32);
    contains(&err(call(&f32_cache, &[5, 7], None)), "q is BF16 but k is F32");
}

#[test]
fn kvcache_append_arguments_are_checked() {
    let q = t(&[2, 1, 8, 64], DType::F16);
    let cache = t(&[2, 128, 2, 64], DType::F16);
    let new = t(&[2, 1, 2, 64], DType::F16);
    let call = |cache: &Tensor, new: &Tensor, seqlens: &[u32]| {
        fa::flash_attn_kvcache_append(&q, cache, cache, new, new, seqlens, None, None, 1.0, None, Some(0), None)
            .map(|(o, _)| o)
    };
    contains(&err(call(&cache, &new, &[5, 7])), "q must be a CUDA tensor");
    contains(&err(call(&cache, &new, &[5, 128])), "appending 1 keys after 128 overflows the cache's 128 keys");
    contains(
        &err(call(&cache, &t(&[2, 1, 4, 64], DType::F16), &[5, 7])),
        "k_new [2, 1, 4, 64] and v_new [2, 1, 4, 64] must be [2, seqlen_new, 2, 64]",
    );
    contains(&err(call(&cache, &t(&[2, 1, 2, 64], DType::BF16), &[5, 7])), "q is F16 but k is BF16");
}

/// Every candle-flash-attn 0.11 function this crate replaces, with its exact
/// signature: a program that calls them compiles unchanged.
#[test]
#[allow(clippy::type_complexity)]
fn signatures_are_candle_flash_attn_s() {
    type T = Tensor;
    let _: fn(&T, &T, &T, f32, bool) -> Result<T> = fa::flash_attn;
    let _: fn(&T, &T, &T, f32, Option<usize>, Option<usize>) -> Result<T> = fa::flash_attn_windowed;
    let _: fn(&T, &T, &T, &T, f32, bool) -> Result<T> = fa::flash_attn_alibi;
    let _: fn(&T, &T, &T, &T, f32, Option<usize>, Option<usize>) -> Result<T> = fa::flash_attn_alibi_windowed;
    let _: fn(&T, &T, &T, Option<&T>, f32, Option<usize>, Option<usize>, f32) -> Result<T> =
        fa::flash_attn_alibi_windowed_softcap;
    let _: fn(&T, &T, &T, &T, &T, usize, usize, f32, bool) -> Result<T> = fa::flash_attn_varlen;
    let _: fn(&T, &T, &T, &T, &T, usize, usize, f32, Option<usize>, Option<usize>) -> Result<T> =
        fa::flash_attn_varlen_windowed;
    let _: fn(&T, &T, &T, &T, &T, &T, usize, usize, f32, bool) -> Result<T> = fa::flash_attn_varlen_alibi;
    let _: fn(&T, &T, &T, &T, &T, &T, usize, usize, f32, Option<usize>, Option<usize>) -> Result<T> =
        fa::flash_attn_varlen_alibi_windowed;
    let _: fn(&T, &T, &T, Option<&T>, &T, &T, usize, usize, f32, Option<usize>, Option<usize>, f32) -> Result<T> =
        fa::flash_attn_varlen_alibi_windowed_softcap;
}

/// candle-flash-attn 0.11's public custom op: the same fields, built by a
/// struct literal as programs do; on CPU tensors it fails as candle-flash-attn's.
#[test]
fn flash_attn_op_has_candle_flash_attn_s_fields() {
    let alibi: Option<Tensor> = None;
    let op = fa::FlashAttn {
        softmax_scale: 0.125f32,
        alibi_slopes: alibi,
        window_size_left: Some(4usize),
        window_size_right: Some(0usize),
        softcap: Some(30f32),
    };
    let q = t(&[1, 8, 2, 64], DType::F16);
    let e = q.apply_op3(&q, &q, op).unwrap_err().to_string();
    contains(&e, "no cpu support for flash-attn");
}

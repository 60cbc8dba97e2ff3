//! GPU tests: every function against candle's own attention, written as
//! matmul + softmax in f32 on the same random tensors (masks, ALiBi,
//! softcap, windows, GQA, variable lengths, KV caches, strided inputs), in
//! f16 and bf16 over several head dims, and the gradients of the backward
//! against candle's autograd through that attention. Every output the
//! crate allocates is poisoned (NaN) before the kernels run. Each test
//! prints `SKIPPED` and returns without a usable CUDA GPU.

use candle_core::{DType, Device, IndexOp, Result, Tensor, Var, D};
use flash_attn_candle as fa;
use flash_attn_candle::FlashAttn;
use rand::{Rng, SeedableRng};

fn skipped(test: &str, why: &str) {
    use std::io::Write;
    // One write, from a line of its own: the harness's "test ... " of
    // another thread may be waiting for its result on the current line, and
    // scripts/test.sh counts the lines that start with SKIPPED.
    let line = format!("\nSKIPPED {test}: {why}\n");
    let _ = std::io::stderr().write_all(line.as_bytes());
}

/// candle's CUDA device 0 with the kernels loaded, or `None` (after saying
/// why) without a usable GPU.
fn gpu(test: &str) -> Option<Device> {
    // An element the kernels leave unwritten reads NaN.
    fa::poison_outputs(true);
    let device = match Device::new_cuda(0) {
        Ok(d) => d,
        Err(e) => {
            let e = e.to_string();
            let e = e.lines().next().unwrap_or_default();
            skipped(test, &format!("no usable CUDA GPU ({e}); the GPU tests run on a GPU machine"));
            return None;
        }
    };
    match fa::flash_attention(&device) {
        Ok(_) => Some(device),
        Err(e) if e.to_string().contains("compute capability") => {
            skipped(test, &format!("no usable CUDA GPU: {e}"));
            None
        }
        Err(e) => panic!("loading the kernels failed: {e}"),
    }
}

fn randn(rng: &mut rand::rngs::StdRng, shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
    let n: usize = shape.iter().product();
    let data: Vec<f32> = (0..n)
        .map(|_| {
            let (u, v): (f32, f32) = (rng.gen_range(f32::EPSILON..1.0), rng.gen());
            (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos()
        })
        .collect();
    Tensor::from_vec(data, shape, device)?.to_dtype(dtype)
}

/// The masks and transforms of one reference call, in FlashAttention-2's
/// terms (bottom-right aligned).
#[derive(Clone, Copy, Debug, Default)]
struct Mask {
    causal: bool,
    left: Option<usize>,
    right: Option<usize>,
}

impl Mask {
    /// candle-flash-attn's window arguments, through the crate's own
    /// translation (tested on its own on the CPU).
    fn from_window(left: Option<usize>, right: Option<usize>, seqlen_k: usize) -> Self {
        let t = fa::params::translate(1.0, left, right, None, seqlen_k);
        Self { causal: t.causal, left: t.window.0, right: t.window.1 }
    }

    fn allows(&self, i: usize, j: usize, seqlen_q: usize, seqlen_k: usize) -> bool {
        let diag = i as i64 + seqlen_k as i64 - seqlen_q as i64;
        let j = j as i64;
        (!self.causal || j <= diag)
            && self.left.is_none_or(|l| j >= diag - l as i64)
            && self.right.is_none_or(|r| j <= diag + r as i64)
    }
}

/// candle's attention: q `[b, sq, hq, d]`, k, v `[b, sk, hkv, d]` in any
/// dtype, computed in f32 with matmul and softmax. Returns o `[b, sq, hq,
/// d]` f32 (zero rows where no key is seen) and the LSE `[b, hq, sq]`
/// (`-inf` there).
fn reference(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    scale: f32,
    mask: Mask,
    alibi: Option<&[f32]>,
    softcap: Option<f32>,
) -> Result<(Tensor, Tensor)> {
    let device = q.device();
    let (b, sq, hq, d) = q.dims4()?;
    let (_, sk, hkv, _) = k.dims4()?;
    let g = hq / hkv;
    let qf = q.to_dtype(DType::F32)?.transpose(1, 2)?.contiguous()?;
    let expand = |t: &Tensor| -> Result<Tensor> {
        t.to_dtype(DType::F32)?
            .transpose(1, 2)?
            .unsqueeze(2)?
            .expand((b, hkv, g, sk, d))?
            .contiguous()?
            .reshape((b, hq, sk, d))
    };
    let (kf, vf) = (expand(k)?, expand(v)?);
    let mut s = (qf.matmul(&kf.t()?.contiguous()?)? * scale as f64)?;
    if let Some(c) = softcap {
        s = ((s / c as f64)?.tanh()? * c as f64)?;
    }
    let mut bias = vec![0f32; hq * sq * sk];
    let mut row_sees = vec![0f32; sq];
    for h in 0..hq {
        for (i, sees) in row_sees.iter_mut().enumerate() {
            for j in 0..sk {
                let at = (h * sq + i) * sk + j;
                if mask.allows(i, j, sq, sk) {
                    *sees = 1.0;
                    if let Some(slopes) = alibi {
                        let dist = (i as i64 + sk as i64 - sq as i64 - j as i64).abs();
                        bias[at] = -slopes[h] * dist as f32;
                    }
                } else {
                    bias[at] = -1e30;
                }
            }
        }
    }
    let s = s.broadcast_add(&Tensor::from_vec(bias, (1, hq, sq, sk), device)?)?;
    let m = s.max_keepdim(D::Minus1)?;
    let e = s.broadcast_sub(&m)?.exp()?;
    let sum = e.sum_keepdim(D::Minus1)?;
    let p = e.broadcast_div(&sum)?;
    let sees = Tensor::from_vec(row_sees.clone(), (1, 1, sq, 1), device)?;
    let o = p.matmul(&vf)?.broadcast_mul(&sees)?.transpose(1, 2)?.contiguous()?;
    let lse = (m + sum.log()?)?.squeeze(D::Minus1)?;
    let none = Tensor::from_vec(
        row_sees.iter().map(|&r| if r > 0.0 { 0f32 } else { f32::NEG_INFINITY }).collect(),
        (1, 1, sq),
        device,
    )?;
    let lse = lse.broadcast_add(&none)?;
    Ok((o, lse))
}

fn tolerance(dtype: DType) -> f32 {
    if dtype == DType::BF16 {
        3e-2
    } else {
        5e-3
    }
}

fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.dims(), b.dims());
    let a = a.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let b = b.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
    a.iter()
        .zip(&b)
        .map(|(&x, &y)| {
            if x == y {
                0.0
            } else if x.is_finite() && y.is_finite() {
                (x - y).abs()
            } else {
                f32::INFINITY
            }
        })
        .fold(0.0, f32::max)
}

fn assert_close(what: &str, got: &Tensor, want: &Tensor, tol: f32) {
    let diff = max_diff(got, want);
    assert!(diff <= tol, "{what}: max |diff| {diff} > {tol}");
}

/// One dense case.
#[derive(Clone, Copy, Debug)]
struct Case {
    batch: usize,
    seqlen_q: usize,
    seqlen_k: usize,
    heads_q: usize,
    heads_kv: usize,
    head_dim: usize,
}

const CASES: [Case; 5] = [
    Case { batch: 2, seqlen_q: 65, seqlen_k: 65, heads_q: 4, heads_kv: 4, head_dim: 64 },
    Case { batch: 1, seqlen_q: 17, seqlen_k: 130, heads_q: 8, heads_kv: 2, head_dim: 128 },
    Case { batch: 2, seqlen_q: 130, seqlen_k: 33, heads_q: 6, heads_kv: 1, head_dim: 32 },
    Case { batch: 1, seqlen_q: 1, seqlen_k: 200, heads_q: 4, heads_kv: 2, head_dim: 256 },
    // No kernel for 80: padded to 96.
    Case { batch: 2, seqlen_q: 40, seqlen_k: 40, heads_q: 4, heads_kv: 2, head_dim: 80 },
];

const DTYPES: [DType; 2] = [DType::F16, DType::BF16];

fn qkv(rng: &mut rand::rngs::StdRng, c: Case, dtype: DType, device: &Device) -> Result<(Tensor, Tensor, Tensor)> {
    Ok((
        randn(rng, &[c.batch, c.seqlen_q, c.heads_q, c.head_dim], dtype, device)?,
        randn(rng, &[c.batch, c.seqlen_k, c.heads_kv, c.head_dim], dtype, device)?,
        randn(rng, &[c.batch, c.seqlen_k, c.heads_kv, c.head_dim], dtype, device)?,
    ))
}

fn slopes(heads: usize) -> Vec<f32> {
    (0..heads).map(|h| 0.5f32.powi(h as i32 + 1)).collect()
}

#[test]
fn flash_attn_matches_candle_attention() -> Result<()> {
    let Some(device) = gpu("flash_attn_matches_candle_attention") else { return Ok(()) };
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    for dtype in DTYPES {
        for c in CASES {
            let (q, k, v) = qkv(&mut rng, c, dtype, &device)?;
            let scale = 1.0 / (c.head_dim as f32).sqrt();
            for causal in [false, true] {
                let got = fa::flash_attn(&q, &k, &v, scale, causal)?;
                let mask = Mask::from_window(None, if causal { Some(0) } else { None }, c.seqlen_k);
                let (want, _) = reference(&q, &k, &v, scale, mask, None, None)?;
                assert_eq!(got.dtype(), dtype);
                assert_close(&format!("{dtype:?} {c:?} causal {causal}"), &got, &want, tolerance(dtype));
            }
        }
    }
    Ok(())
}

const WINDOWS: [(Option<usize>, Option<usize>); 6] = [
    (Some(16), Some(0)),
    (Some(8), Some(8)),
    (None, Some(4)),
    (Some(5), None),
    (Some(0), Some(0)),
    (Some(1000), Some(0)),
];

#[test]
fn flash_attn_windowed_matches_candle_attention() -> Result<()> {
    let Some(device) = gpu("flash_attn_windowed_matches_candle_attention") else { return Ok(()) };
    let mut rng = rand::rngs::StdRng::seed_from_u64(2);
    for dtype in DTYPES {
        for c in [CASES[0], CASES[1], CASES[4]] {
            let (q, k, v) = qkv(&mut rng, c, dtype, &device)?;
            for (left, right) in WINDOWS {
                let got = fa::flash_attn_windowed(&q, &k, &v, 0.2, left, right)?;
                let (want, _) = reference(&q, &k, &v, 0.2, Mask::from_window(left, right, c.seqlen_k), None, None)?;
                assert_close(&format!("{dtype:?} {c:?} window {left:?} {right:?}"), &got, &want, tolerance(dtype));
            }
        }
    }
    Ok(())
}

#[test]
fn flash_attn_alibi_matches_candle_attention() -> Result<()> {
    let Some(device) = gpu("flash_attn_alibi_matches_candle_attention") else { return Ok(()) };
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    for dtype in DTYPES {
        for c in [CASES[0], CASES[1], CASES[2]] {
            let (q, k, v) = qkv(&mut rng, c, dtype, &device)?;
            let s = slopes(c.heads_q);
            let alibi = Tensor::from_vec(s.clone(), c.heads_q, &device)?;
            for causal in [false, true] {
                let got = fa::flash_attn_alibi(&q, &k, &v, &alibi, 0.125, causal)?;
                let mask = Mask::from_window(None, if causal { Some(0) } else { None }, c.seqlen_k);
                let (want, _) = reference(&q, &k, &v, 0.125, mask, Some(&s), None)?;
                assert_close(&format!("{dtype:?} {c:?} alibi causal {causal}"), &got, &want, tolerance(dtype));
            }
            let got = fa::flash_attn_alibi_windowed(&q, &k, &v, &alibi, 0.125, Some(12), Some(3))?;
            let (want, _) =
                reference(&q, &k, &v, 0.125, Mask::from_window(Some(12), Some(3), c.seqlen_k), Some(&s), None)?;
            assert_close(&format!("{dtype:?} {c:?} alibi windowed"), &got, &want, tolerance(dtype));
        }
    }
    Ok(())
}

#[test]
fn flash_attn_softcap_matches_candle_attention() -> Result<()> {
    let Some(device) = gpu("flash_attn_softcap_matches_candle_attention") else { return Ok(()) };
    let mut rng = rand::rngs::StdRng::seed_from_u64(4);
    for dtype in DTYPES {
        for c in [CASES[0], CASES[1]] {
            let (q, k, v) = qkv(&mut rng, c, dtype, &device)?;
            let s = slopes(c.heads_q);
            let alibi = Tensor::from_vec(s.clone(), c.heads_q, &device)?;
            // A large scale and a small cap, so that the cap matters.
            for (alibi_on, left, right) in [(false, None, None), (false, None, Some(0)), (true, Some(20), Some(0))] {
                let a = alibi_on.then_some(&alibi);
                let got = fa::flash_attn_alibi_windowed_softcap(&q, &k, &v, a, 0.5, left, right, 2.0)?;
                let mask = Mask::from_window(left, right, c.seqlen_k);
                let (want, _) = reference(&q, &k, &v, 0.5, mask, alibi_on.then_some(&s[..]), Some(2.0))?;
                assert_close(
                    &format!("{dtype:?} {c:?} softcap alibi {alibi_on} {left:?} {right:?}"),
                    &got,
                    &want,
                    tolerance(dtype),
                );
            }
            // softcap 0.0 is none, as in candle-flash-attn.
            let got = fa::flash_attn_alibi_windowed_softcap(&q, &k, &v, None, 0.3, None, None, 0.0)?;
            let (want, _) = reference(&q, &k, &v, 0.3, Mask::default(), None, None)?;
            assert_close(&format!("{dtype:?} {c:?} softcap 0"), &got, &want, tolerance(dtype));
        }
    }
    Ok(())
}

#[test]
fn flash_attn_with_lse_matches_candle_attention() -> Result<()> {
    let Some(device) = gpu("flash_attn_with_lse_matches_candle_attention") else { return Ok(()) };
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    for dtype in DTYPES {
        for c in CASES {
            let (q, k, v) = qkv(&mut rng, c, dtype, &device)?;
            let scale = 1.0 / (c.head_dim as f32).sqrt();
            let (o, lse) = fa::flash_attn_with_lse(&q, &k, &v, None, scale, Some(7), Some(0), None)?;
            let (want_o, want_lse) =
                reference(&q, &k, &v, scale, Mask::from_window(Some(7), Some(0), c.seqlen_k), None, None)?;
            assert_eq!(lse.dims(), [c.batch, c.heads_q, c.seqlen_q]);
            assert_eq!(lse.dtype(), DType::F32);
            assert_close(&format!("{dtype:?} {c:?} o"), &o, &want_o, tolerance(dtype));
            assert_close(&format!("{dtype:?} {c:?} lse"), &lse, &want_lse, 2e-3);
        }
    }
    Ok(())
}

/// Sequence lengths of the variable-length batches: (q, k) per sequence.
const VARLEN: [(usize, usize); 4] = [(5, 5), (17, 80), (64, 64), (1, 33)];

fn cumulative(lens: impl Iterator<Item = usize>) -> Vec<u32> {
    let mut offsets = vec![0u32];
    for n in lens {
        offsets.push(offsets.last().unwrap() + n as u32);
    }
    offsets
}

#[test]
fn flash_attn_varlen_matches_candle_attention() -> Result<()> {
    let Some(device) = gpu("flash_attn_varlen_matches_candle_attention") else { return Ok(()) };
    let mut rng = rand::rngs::StdRng::seed_from_u64(6);
    let cu_q = cumulative(VARLEN.iter().map(|l| l.0));
    let cu_k = cumulative(VARLEN.iter().map(|l| l.1));
    let (total_q, total_k) = (*cu_q.last().unwrap() as usize, *cu_k.last().unwrap() as usize);
    let max_q = VARLEN.iter().map(|l| l.0).max().unwrap();
    let max_k = VARLEN.iter().map(|l| l.1).max().unwrap();
    let seqlens_q = Tensor::new(cu_q.as_slice(), &device)?;
    let seqlens_k = Tensor::new(cu_k.as_slice(), &device)?;
    for dtype in DTYPES {
        for (heads_q, heads_kv, d) in [(4, 4, 64), (8, 2, 128), (4, 1, 96)] {
            let q = randn(&mut rng, &[total_q, heads_q, d], dtype, &device)?;
            let k = randn(&mut rng, &[total_k, heads_kv, d], dtype, &device)?;
            let v = randn(&mut rng, &[total_k, heads_kv, d], dtype, &device)?;
            let s = slopes(heads_q);
            let alibi = Tensor::from_vec(s.clone(), heads_q, &device)?;
            type Variant = (&'static str, Option<usize>, Option<usize>, bool, Option<f32>);
            let variants: [Variant; 5] = [
                ("plain", None, None, false, None),
                ("causal", None, Some(0), false, None),
                ("windowed", Some(6), Some(2), false, None),
                ("alibi causal", None, Some(0), true, None),
                ("softcap", Some(10), Some(0), true, Some(2.0)),
            ];
            for (name, left, right, alibi_on, softcap) in variants {
                let scale = if softcap.is_some() { 0.5 } else { 0.125 };
                let a = alibi_on.then_some(&alibi);
                let got = match (name, softcap) {
                    ("plain", _) => {
                        fa::flash_attn_varlen(&q, &k, &v, &seqlens_q, &seqlens_k, max_q, max_k, scale, false)?
                    }
                    ("causal", _) => {
                        fa::flash_attn_varlen(&q, &k, &v, &seqlens_q, &seqlens_k, max_q, max_k, scale, true)?
                    }
                    ("windowed", _) => fa::flash_attn_varlen_windowed(
                        &q, &k, &v, &seqlens_q, &seqlens_k, max_q, max_k, scale, left, right,
                    )?,
                    ("alibi causal", _) => fa::flash_attn_varlen_alibi(
                        &q, &k, &v, &alibi, &seqlens_q, &seqlens_k, max_q, max_k, scale, true,
                    )?,
                    (_, Some(cap)) => fa::flash_attn_varlen_alibi_windowed_softcap(
                        &q, &k, &v, a, &seqlens_q, &seqlens_k, max_q, max_k, scale, left, right, cap,
                    )?,
                    _ => unreachable!(),
                };
                let (_, lse) = fa::flash_attn_varlen_with_lse(
                    &q, &k, &v, a, &seqlens_q, &seqlens_k, max_q, max_k, scale, left, right, softcap,
                )?;
                assert_eq!(got.dims(), [total_q, heads_q, d]);
                assert_eq!(lse.dims(), [heads_q, total_q]);
                // Each sequence against the dense reference on its own.
                for (b, &(len_q, len_k)) in VARLEN.iter().enumerate() {
                    let (oq, ok) = (cu_q[b] as usize, cu_k[b] as usize);
                    let one = |t: &Tensor, o: usize, n: usize| t.narrow(0, o, n).and_then(|t| t.unsqueeze(0));
                    let mask = Mask::from_window(left, right, max_k);
                    let (want, want_lse) = reference(
                        &one(&q, oq, len_q)?,
                        &one(&k, ok, len_k)?,
                        &one(&v, ok, len_k)?,
                        scale,
                        mask,
                        alibi_on.then_some(&s[..]),
                        softcap,
                    )?;
                    let what = format!("{dtype:?} heads {heads_q}/{heads_kv} d {d} {name} sequence {b}");
                    assert_close(&what, &one(&got, oq, len_q)?, &want, tolerance(dtype));
                    assert_close(&format!("{what} lse"), &lse.narrow(1, oq, len_q)?.unsqueeze(0)?, &want_lse, 2e-3);
                }
            }
        }
    }
    Ok(())
}

#[test]
fn flash_attn_kvcache_matches_candle_attention() -> Result<()> {
    let Some(device) = gpu("flash_attn_kvcache_matches_candle_attention") else { return Ok(()) };
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let (batch, capacity, heads_q, heads_kv) = (3, 256, 8, 2);
    let cache_seqlens = [1u32, 100, 256];
    for dtype in DTYPES {
        for d in [64, 128] {
            let k_cache = randn(&mut rng, &[batch, capacity, heads_kv, d], dtype, &device)?;
            let v_cache = randn(&mut rng, &[batch, capacity, heads_kv, d], dtype, &device)?;
            // The same keys paged: pages of 64 rows, shuffled.
            let page = 64;
            let pages_per_seq = capacity / page;
            let num_pages = batch * pages_per_seq;
            let mut table: Vec<u32> = (0..num_pages as u32).collect();
            table.reverse();
            let to_pages = |cache: &Tensor| -> Result<Tensor> {
                let mut pages = vec![Tensor::zeros((1, page, heads_kv, d), dtype, &device)?; num_pages];
                for b in 0..batch {
                    for p in 0..pages_per_seq {
                        pages[table[b * pages_per_seq + p] as usize] = cache.i((b..b + 1, p * page..(p + 1) * page))?;
                    }
                }
                Tensor::cat(&pages, 0)
            };
            let (k_pages, v_pages) = (to_pages(&k_cache)?, to_pages(&v_cache)?);
            for seqlen_q in [1, 4] {
                let q = randn(&mut rng, &[batch, seqlen_q, heads_q, d], dtype, &device)?;
                for (left, right) in [(None, Some(0)), (None, None), (Some(16), Some(0))] {
                    let scale = 1.0 / (d as f32).sqrt();
                    let dense = fa::flash_attn_kvcache(
                        &q,
                        &k_cache,
                        &v_cache,
                        &cache_seqlens,
                        None,
                        None,
                        scale,
                        left,
                        right,
                        None,
                    )?;
                    let paged_cache = fa::PagedCache { block_table: &table, pages_per_seq };
                    let paged = fa::flash_attn_kvcache(
                        &q,
                        &k_pages,
                        &v_pages,
                        &cache_seqlens,
                        Some(paged_cache),
                        None,
                        scale,
                        left,
                        right,
                        None,
                    )?;
                    for (b, &len) in cache_seqlens.iter().enumerate() {
                        let len = len as usize;
                        let qb = q.i(b..b + 1)?;
                        let kb = k_cache.i((b..b + 1, ..len))?;
                        let vb = v_cache.i((b..b + 1, ..len))?;
                        let mask = Mask::from_window(left, right, capacity);
                        let (want, want_lse) = reference(&qb, &kb, &vb, scale, mask, None, None)?;
                        let what = format!("{dtype:?} d {d} seqlen_q {seqlen_q} window {left:?} {right:?} batch {b}");
                        for (name, (o, lse)) in [("dense", &dense), ("paged", &paged)] {
                            assert_close(&format!("{what} {name}"), &o.i(b..b + 1)?, &want, tolerance(dtype));
                            assert_close(&format!("{what} {name} lse"), &lse.i(b..b + 1)?, &want_lse, 2e-3);
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

#[test]
fn strided_and_offset_inputs() -> Result<()> {
    let Some(device) = gpu("strided_and_offset_inputs") else { return Ok(()) };
    let mut rng = rand::rngs::StdRng::seed_from_u64(8);
    let (b, s, h, d) = (2, 50, 4, 64);
    for dtype in DTYPES {
        // q, k and v as views of one fused qkv projection: read in place.
        let qkv = randn(&mut rng, &[b, s, 3 * h, d], dtype, &device)?;
        let (q, k, v) = (qkv.narrow(2, 0, h)?, qkv.narrow(2, h, h)?, qkv.narrow(2, 2 * h, h)?);
        assert!(!q.is_contiguous());
        let got = fa::flash_attn(&q, &k, &v, 0.125, true)?;
        let (want, _) = reference(&q, &k, &v, 0.125, Mask::from_window(None, Some(0), s), None, None)?;
        assert_close(&format!("{dtype:?} qkv views"), &got, &want, tolerance(dtype));
        // Heads-major tensors transposed into place.
        let t = randn(&mut rng, &[b, h, s, d], dtype, &device)?.transpose(1, 2)?;
        let got = fa::flash_attn(&t, &t, &t, 0.125, false)?;
        let (want, _) = reference(&t, &t, &t, 0.125, Mask::default(), None, None)?;
        assert_close(&format!("{dtype:?} transposed"), &got, &want, tolerance(dtype));
        // A start offset that is not a multiple of 8 elements: copied first.
        let flat = randn(&mut rng, &[b * s * h * d + 3], dtype, &device)?;
        let t = flat.narrow(0, 3, b * s * h * d)?.reshape((b, s, h, d))?;
        let got = fa::flash_attn(&t, &t, &t, 0.125, false)?;
        let (want, _) = reference(&t, &t, &t, 0.125, Mask::default(), None, None)?;
        assert_close(&format!("{dtype:?} offset 3"), &got, &want, tolerance(dtype));
        // The last dim not contiguous: an error, as in candle-flash-attn.
        let t = randn(&mut rng, &[b, s, d, h], dtype, &device)?.transpose(2, 3)?;
        let err = fa::flash_attn(&t, &t, &t, 0.125, false).unwrap_err().to_string();
        assert!(err.contains("last dim of q must be contiguous"), "{err}");
    }
    Ok(())
}

#[test]
fn mixed_devices_are_errors() -> Result<()> {
    let Some(device) = gpu("mixed_devices_are_errors") else { return Ok(()) };
    let q = Tensor::zeros((1, 8, 2, 64), DType::F16, &device)?;
    let k_cpu = Tensor::zeros((1, 8, 2, 64), DType::F16, &Device::Cpu)?;
    let err = fa::flash_attn(&q, &k_cpu, &q, 1.0, false).unwrap_err().to_string();
    assert!(err.contains("k must be a CUDA tensor"), "{err}");
    let alibi_cpu = Tensor::zeros(2, DType::F32, &Device::Cpu)?;
    let err = fa::flash_attn_alibi(&q, &q, &q, &alibi_cpu, 1.0, false).unwrap_err().to_string();
    assert!(err.contains("alibi_slopes must be a CUDA tensor"), "{err}");
    Ok(())
}

#[test]
fn flash_attn_kvcache_append_writes_and_matches_candle_attention() -> Result<()> {
    let Some(device) = gpu("flash_attn_kvcache_append_writes_and_matches_candle_attention") else { return Ok(()) };
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    let (batch, capacity, heads_q, heads_kv, d, seqlen_new) = (2, 128, 4, 2, 64, 2);
    let cache_seqlens = [3u32, 60];
    for dtype in DTYPES {
        let k_cache = randn(&mut rng, &[batch, capacity, heads_kv, d], dtype, &device)?;
        let v_cache = randn(&mut rng, &[batch, capacity, heads_kv, d], dtype, &device)?;
        let (k_before, v_before) = (k_cache.copy()?, v_cache.copy()?);
        let k_new = randn(&mut rng, &[batch, seqlen_new, heads_kv, d], dtype, &device)?;
        let v_new = randn(&mut rng, &[batch, seqlen_new, heads_kv, d], dtype, &device)?;
        let q = randn(&mut rng, &[batch, seqlen_new, heads_q, d], dtype, &device)?;
        let (o, lse) = fa::flash_attn_kvcache_append(
            &q,
            &k_cache,
            &v_cache,
            &k_new,
            &v_new,
            &cache_seqlens,
            None,
            None,
            0.125,
            None,
            Some(0),
            None,
        )?;
        for (b, &len) in cache_seqlens.iter().enumerate() {
            let len = len as usize;
            let what = format!("{dtype:?} batch {b}");
            // The new rows landed after the cached ones; the rest is untouched.
            assert_close(&what, &k_cache.i((b, len..len + seqlen_new))?, &k_new.i(b)?, 0.0);
            assert_close(&what, &v_cache.i((b, len..len + seqlen_new))?, &v_new.i(b)?, 0.0);
            assert_close(&what, &k_cache.i((b, ..len))?, &k_before.i((b, ..len))?, 0.0);
            assert_close(&what, &v_cache.i((b, len + seqlen_new..))?, &v_before.i((b, len + seqlen_new..))?, 0.0);
            let n = len + seqlen_new;
            let (want, want_lse) = reference(
                &q.i(b..b + 1)?,
                &k_cache.i((b..b + 1, ..n))?,
                &v_cache.i((b..b + 1, ..n))?,
                0.125,
                Mask::from_window(None, Some(0), capacity),
                None,
                None,
            )?;
            assert_close(&what, &o.i(b..b + 1)?, &want, tolerance(dtype));
            assert_close(&format!("{what} lse"), &lse.i(b..b + 1)?, &want_lse, 2e-3);
        }
        // Paged: pages of 64 rows, the sequences' pages swapped.
        let (page, pages_per_seq) = (64, 2);
        let table = [2u32, 3, 0, 1];
        let k_pages = randn(&mut rng, &[4, page, heads_kv, d], dtype, &device)?;
        let v_pages = randn(&mut rng, &[4, page, heads_kv, d], dtype, &device)?;
        let paged = fa::PagedCache { block_table: &table, pages_per_seq };
        let (o, _) = fa::flash_attn_kvcache_append(
            &q,
            &k_pages,
            &v_pages,
            &k_new,
            &v_new,
            &cache_seqlens,
            Some(paged),
            None,
            0.125,
            None,
            Some(0),
            None,
        )?;
        // Sequence b's keys: its pages in table order, then its first n.
        let seq = |pages: &Tensor, b: usize| -> Result<Tensor> {
            let rows: Vec<Tensor> =
                (0..pages_per_seq).map(|p| pages.i(table[b * pages_per_seq + p] as usize)).collect::<Result<_>>()?;
            Tensor::cat(&rows, 0)?.unsqueeze(0)
        };
        for (b, &len) in cache_seqlens.iter().enumerate() {
            let n = len as usize + seqlen_new;
            let (ks, vs) = (seq(&k_pages, b)?, seq(&v_pages, b)?);
            assert_close(&format!("{dtype:?} paged batch {b} k"), &ks.i((0, len as usize..n))?, &k_new.i(b)?, 0.0);
            let (want, _) = reference(
                &q.i(b..b + 1)?,
                &ks.i((.., ..n))?,
                &vs.i((.., ..n))?,
                0.125,
                Mask::from_window(None, Some(0), 128),
                None,
                None,
            )?;
            assert_close(&format!("{dtype:?} paged batch {b}"), &o.i(b..b + 1)?, &want, tolerance(dtype));
        }
    }
    Ok(())
}

/// The seed of a gradient test: `FLASH_ATTN_TEST_SEED`, or the test's own,
/// printed.
fn seed(test: &str, default: u64) -> u64 {
    let seed = std::env::var("FLASH_ATTN_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(default);
    eprintln!("{test}: seed {seed} (FLASH_ATTN_TEST_SEED)");
    seed
}

/// The relative L2 error of `got` against `want` (infinite if `got` has a
/// value that is not finite).
fn relative_error(got: &Tensor, want: &Tensor) -> f32 {
    assert_eq!(got.dims(), want.dims());
    let g = got.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let w = want.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
    if g.iter().any(|x| !x.is_finite()) {
        return f32::INFINITY;
    }
    let diff: f64 = g.iter().zip(&w).map(|(&a, &b)| ((a - b) as f64).powi(2)).sum();
    let norm: f64 = w.iter().map(|&b| (b as f64).powi(2)).sum();
    (diff.sqrt() / norm.sqrt().max(1e-30)) as f32
}

/// The largest relative L2 error of a gradient of the f16 or bf16 backward
/// against candle's f32 autograd on the same values (flash-attn's own GPU
/// tests allow 2e-3 and 1.6e-2 against f64 gradients).
fn gradient_tolerance(dtype: DType) -> f32 {
    if dtype == DType::BF16 {
        2.5e-2
    } else {
        3e-3
    }
}

/// The output of `attend` on q, k and v as candle variables, and the
/// gradients of `sum(o * w)` with respect to q, k and v, by candle's
/// `backward()`.
fn gradients(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    w: &Tensor,
    attend: impl Fn(&Tensor, &Tensor, &Tensor) -> Result<Tensor>,
) -> Result<(Tensor, [Tensor; 3])> {
    let vars = [Var::from_tensor(q)?, Var::from_tensor(k)?, Var::from_tensor(v)?];
    let o = attend(vars[0].as_tensor(), vars[1].as_tensor(), vars[2].as_tensor())?;
    let loss = o.to_dtype(DType::F32)?.mul(w)?.sum_all()?;
    let grads = loss.backward()?;
    let get = |i: usize| {
        grads
            .get(vars[i].as_tensor())
            .cloned()
            .ok_or_else(|| candle_core::Error::Msg(format!("no gradient for input {i}")))
    };
    Ok((o, [get(0)?, get(1)?, get(2)?]))
}

fn assert_gradients(what: &str, got: &[Tensor; 3], want: &[Tensor; 3], dtype: DType) {
    for (name, g, w) in [("dQ", &got[0], &want[0]), ("dK", &got[1], &want[1]), ("dV", &got[2], &want[2])] {
        assert_eq!(g.dtype(), dtype, "{what}: {name} dtype");
        let error = relative_error(g, w);
        assert!(
            error <= gradient_tolerance(dtype),
            "{what}: {name} relative L2 error {error:.3e} against candle's autograd"
        );
    }
}

/// One masked or transformed variant of a call: (name, window left, window
/// right, softcap, ALiBi).
type Variant = (&'static str, Option<usize>, Option<usize>, Option<f32>, bool);

const GRADIENT_VARIANTS: [Variant; 4] = [
    ("plain", None, None, None, false),
    ("causal", None, Some(0), None, false),
    ("window", Some(16), Some(0), None, false),
    ("softcap alibi", None, None, Some(2.0), true),
];

#[test]
fn gradients_match_candle_autograd() -> Result<()> {
    let test = "gradients_match_candle_autograd";
    let Some(device) = gpu(test) else { return Ok(()) };
    let seed = seed(test, 10);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    for dtype in DTYPES {
        for c in CASES {
            let (q, k, v) = qkv(&mut rng, c, dtype, &device)?;
            // dO = w, with values the dtype holds.
            let w = randn(&mut rng, q.dims(), dtype, &device)?.to_dtype(DType::F32)?;
            let to_f32 = |t: &Tensor| t.to_dtype(DType::F32);
            let (qf, kf, vf) = (to_f32(&q)?, to_f32(&k)?, to_f32(&v)?);
            let s = slopes(c.heads_q);
            let alibi = Tensor::from_vec(s.clone(), c.heads_q, &device)?;
            for (name, left, right, softcap, alibi_on) in GRADIENT_VARIANTS {
                let scale = if softcap.is_some() { 0.5 } else { 1.0 / (c.head_dim as f32).sqrt() };
                let a = alibi_on.then_some(&alibi);
                let (o, got) = gradients(&q, &k, &v, &w, |q, k, v| {
                    fa::flash_attn_alibi_windowed_softcap(q, k, v, a, scale, left, right, softcap.unwrap_or(0.0))
                })?;
                let mask = Mask::from_window(left, right, c.seqlen_k);
                let (o_ref, want) = gradients(&qf, &kf, &vf, &w, |q, k, v| {
                    Ok(reference(q, k, v, scale, mask, alibi_on.then_some(&s[..]), softcap)?.0)
                })?;
                let what = format!("seed {seed} {dtype:?} {c:?} {name}");
                assert_close(&what, &o, &o_ref, tolerance(dtype));
                assert_gradients(&what, &got, &want, dtype);
            }
        }
    }
    Ok(())
}

#[test]
fn varlen_gradients_match_candle_autograd() -> Result<()> {
    let test = "varlen_gradients_match_candle_autograd";
    let Some(device) = gpu(test) else { return Ok(()) };
    let seed = seed(test, 11);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let cu_q = cumulative(VARLEN.iter().map(|l| l.0));
    let cu_k = cumulative(VARLEN.iter().map(|l| l.1));
    let (total_q, total_k) = (*cu_q.last().unwrap() as usize, *cu_k.last().unwrap() as usize);
    let max_q = VARLEN.iter().map(|l| l.0).max().unwrap();
    let max_k = VARLEN.iter().map(|l| l.1).max().unwrap();
    let seqlens_q = Tensor::new(cu_q.as_slice(), &device)?;
    let seqlens_k = Tensor::new(cu_k.as_slice(), &device)?;
    for dtype in DTYPES {
        for (heads_q, heads_kv, d) in [(4, 4, 64), (8, 2, 128), (4, 1, 96), (4, 2, 40)] {
            let q = randn(&mut rng, &[total_q, heads_q, d], dtype, &device)?;
            let k = randn(&mut rng, &[total_k, heads_kv, d], dtype, &device)?;
            let v = randn(&mut rng, &[total_k, heads_kv, d], dtype, &device)?;
            let w = randn(&mut rng, q.dims(), dtype, &device)?.to_dtype(DType::F32)?;
            let to_f32 = |t: &Tensor| t.to_dtype(DType::F32);
            let (qf, kf, vf) = (to_f32(&q)?, to_f32(&k)?, to_f32(&v)?);
            let s = slopes(heads_q);
            let alibi = Tensor::from_vec(s.clone(), heads_q, &device)?;
            for (name, left, right, softcap, alibi_on) in GRADIENT_VARIANTS {
                let scale = if softcap.is_some() { 0.5 } else { 0.125 };
                let a = alibi_on.then_some(&alibi);
                let (o, got) = gradients(&q, &k, &v, &w, |q, k, v| {
                    fa::flash_attn_varlen_alibi_windowed_softcap(
                        q,
                        k,
                        v,
                        a,
                        &seqlens_q,
                        &seqlens_k,
                        max_q,
                        max_k,
                        scale,
                        left,
                        right,
                        softcap.unwrap_or(0.0),
                    )
                })?;
                // Each sequence through the dense reference on its own, the
                // outputs packed again.
                let mask = Mask::from_window(left, right, max_k);
                let (o_ref, want) = gradients(&qf, &kf, &vf, &w, |q, k, v| {
                    let mut outputs = Vec::with_capacity(VARLEN.len());
                    for (b, &(len_q, len_k)) in VARLEN.iter().enumerate() {
                        let (oq, ok) = (cu_q[b] as usize, cu_k[b] as usize);
                        let one = |t: &Tensor, o: usize, n: usize| t.narrow(0, o, n).and_then(|t| t.unsqueeze(0));
                        let (o, _) = reference(
                            &one(q, oq, len_q)?,
                            &one(k, ok, len_k)?,
                            &one(v, ok, len_k)?,
                            scale,
                            mask,
                            alibi_on.then_some(&s[..]),
                            softcap,
                        )?;
                        outputs.push(o.squeeze(0)?);
                    }
                    Tensor::cat(&outputs, 0)
                })?;
                let what = format!("seed {seed} {dtype:?} heads {heads_q}/{heads_kv} d {d} {name}");
                assert_close(&what, &o, &o_ref, tolerance(dtype));
                assert_gradients(&what, &got, &want, dtype);
            }
        }
    }
    Ok(())
}

#[test]
fn flash_attn_op_matches_candle_attention_and_autograd() -> Result<()> {
    let test = "flash_attn_op_matches_candle_attention_and_autograd";
    let Some(device) = gpu(test) else { return Ok(()) };
    let seed = seed(test, 12);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let (b, s, h, hkv) = (2, 70, 4, 2);
    let heads = h + 2 * hkv;
    // q, k and v as views of one fused projection `[b, s, heads, d]`:
    // strided, read in place where the head dim has a kernel.
    let split = |t: &Tensor| -> Result<(Tensor, Tensor, Tensor)> {
        Ok((t.narrow(2, 0, h)?, t.narrow(2, h, hkv)?, t.narrow(2, h + hkv, hkv)?))
    };
    for dtype in DTYPES {
        // d = 40 has no kernel: padded to 64 (a copy).
        for d in [64, 40] {
            let n = b * s * heads * d;
            // The projection itself, and one 3 elements into a buffer (every
            // view's start offset then not a multiple of 8: copied first).
            let fused = randn(&mut rng, &[b, s, heads, d], dtype, &device)?;
            let offset = randn(&mut rng, &[n + 3], dtype, &device)?;
            let w = randn(&mut rng, &[b, s, h, d], dtype, &device)?.to_dtype(DType::F32)?;
            let scale = 1.0 / (d as f32).sqrt();
            type Source = fn(&Tensor, (usize, usize, usize, usize)) -> Result<Tensor>;
            let sources: [(&str, &Tensor, Source); 2] = [
                ("fused views", &fused, |t, _| Ok(t.clone())),
                ("offset 3", &offset, |t, shape| t.narrow(0, 3, shape.0 * shape.1 * shape.2 * shape.3)?.reshape(shape)),
            ];
            for (layout, source, view) in sources {
                for (left, right) in [(None, Some(0)), (Some(9), Some(3))] {
                    let op = || FlashAttn {
                        softmax_scale: scale,
                        alibi_slopes: None,
                        window_size_left: left,
                        window_size_right: right,
                        softcap: None,
                    };
                    let mask = Mask::from_window(left, right, s);
                    // sum(o * w) through the op and through candle's attention,
                    // differentiated with respect to the whole source.
                    let run = |source: &Tensor, flash: bool| -> Result<(Tensor, Tensor)> {
                        let var = Var::from_tensor(source)?;
                        let (q, k, v) = split(&view(var.as_tensor(), (b, s, heads, d))?)?;
                        let o = if flash {
                            assert!(!q.is_contiguous());
                            q.apply_op3(&k, &v, op())?
                        } else {
                            reference(&q, &k, &v, scale, mask, None, None)?.0
                        };
                        let grads = o.to_dtype(DType::F32)?.mul(&w)?.sum_all()?.backward()?;
                        let grad = grads.get(var.as_tensor()).cloned();
                        Ok((o, grad.ok_or_else(|| candle_core::Error::Msg("no gradient".into()))?))
                    };
                    let (o, got) = run(source, true)?;
                    let (o_ref, want) = run(&source.to_dtype(DType::F32)?, false)?;
                    let what = format!("seed {seed} {dtype:?} d {d} {layout} window {left:?} {right:?}");
                    assert_eq!((o.dims(), o.dtype()), (&[b, s, h, d][..], dtype), "{what}");
                    assert_close(&what, &o, &o_ref, tolerance(dtype));
                    let error = relative_error(&got, &want);
                    assert!(error <= gradient_tolerance(dtype), "{what}: gradient relative L2 error {error:.3e}");
                }
            }
        }
    }
    Ok(())
}

#[test]
fn outputs_without_a_gradient_fail_in_backward() -> Result<()> {
    let test = "outputs_without_a_gradient_fail_in_backward";
    let Some(device) = gpu(test) else { return Ok(()) };
    let mut rng = rand::rngs::StdRng::seed_from_u64(13);
    let q = Var::from_tensor(&randn(&mut rng, &[1, 16, 2, 64], DType::F16, &device)?)?;
    let kv = randn(&mut rng, &[1, 64, 2, 64], DType::F16, &device)?;
    // The output of a `_with_lse` call has its gradient; the LSE has none.
    let (o, lse) = fa::flash_attn_with_lse(q.as_tensor(), &kv, &kv, None, 0.125, None, Some(0), None)?;
    let grads = o.to_dtype(DType::F32)?.sum_all()?.backward()?;
    assert!(grads.get(q.as_tensor()).is_some(), "the output of flash_attn_with_lse carries q's gradient");
    let err = lse.sum_all()?.backward().unwrap_err().to_string();
    assert!(err.contains("the log-sum-exp has no gradient"), "{err}");
    // KV caches: no backward.
    let (o, _) = fa::flash_attn_kvcache(q.as_tensor(), &kv, &kv, &[64], None, None, 0.125, None, Some(0), None)?;
    let err = o.to_dtype(DType::F32)?.sum_all()?.backward().unwrap_err().to_string();
    assert!(err.contains("no backward through a KV-cache call"), "{err}");
    let cache = Tensor::zeros((1, 128, 2, 64), DType::F16, &device)?;
    let new = kv.narrow(1, 0, 16)?;
    let (o, _) = fa::flash_attn_kvcache_append(
        q.as_tensor(),
        &cache,
        &cache,
        &new,
        &new,
        &[0],
        None,
        None,
        0.125,
        None,
        Some(0),
        None,
    )?;
    let err = o.to_dtype(DType::F32)?.sum_all()?.backward().unwrap_err().to_string();
    assert!(err.contains("the output of a KV-cache call has no gradient"), "{err}");
    Ok(())
}

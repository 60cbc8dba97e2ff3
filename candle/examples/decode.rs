//! A complete candle program on flash-attn-candle: a small stack of
//! attention layers (random f16 weights, 8 query heads over 2 KV heads, head
//! dim 64) prefills a ragged batch of prompts packed into one tensor
//! (`flash_attn_varlen`, causal), writes each layer's keys and values into
//! a KV cache (`[batch, capacity, heads_kv, head_dim]`, `slice_set`), then
//! decodes one token per sequence per step: each layer appends the new
//! token's keys and values to its cache and attends over it in one call
//! (`flash_attn_kvcache_append`, with the cache lengths on the host), the
//! last layer's output feeding the next step.
//!
//! The first run checks every attention output, of prefill and of each
//! decode step, against candle's own attention (matmul + softmax in f32) over
//! the same queries and the same cached keys and values; a second run is
//! timed. Exits with status 1 if an output is off by more than the
//! tolerance, 2 without a usable GPU.
//!
//! `cargo run --release -p flash-attn-candle --example decode`

use std::time::Instant;

use candle_core::{DType, Device, IndexOp, Result, Tensor, D};
use flash_attn_candle as fa;

#[path = "common/attention.rs"]
mod attention;
use attention::candle_attention;

const PROMPTS: [usize; 3] = [37, 100, 64];
const STEPS: usize = 32;
const CAPACITY: usize = 256;
const LAYERS: usize = 2;
const HEADS_Q: usize = 8;
const HEADS_KV: usize = 2;
const HEAD_DIM: usize = 64;
const HIDDEN: usize = HEADS_Q * HEAD_DIM;
/// Largest |flash-attn - candle| of an attention output (f16).
const TOLERANCE: f32 = 5e-3;

struct Layer {
    /// `[HIDDEN, (HEADS_Q + 2 HEADS_KV) HEAD_DIM]`: q, k, v in one projection.
    w_qkv: Tensor,
    /// `[HIDDEN, HIDDEN]`.
    w_o: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
}

/// q, k and v of `x` (`[tokens, HIDDEN]`), `[tokens, heads, HEAD_DIM]` each:
/// views of the one projection (read in place by the kernels).
fn project(layer: &Layer, x: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
    let qkv = x.matmul(&layer.w_qkv)?.reshape(((), HEADS_Q + 2 * HEADS_KV, HEAD_DIM))?;
    Ok((qkv.narrow(1, 0, HEADS_Q)?, qkv.narrow(1, HEADS_Q, HEADS_KV)?, qkv.narrow(1, HEADS_Q + HEADS_KV, HEADS_KV)?))
}

/// The attention output projected and added to the residual stream, then
/// normalized (RMS): the next layer's input.
fn finish(layer: &Layer, x: &Tensor, attn: &Tensor) -> Result<Tensor> {
    let y = (x + attn.reshape(((), HIDDEN))?.matmul(&layer.w_o)?)?;
    let rms = y.to_dtype(DType::F32)?.sqr()?.mean_keepdim(D::Minus1)?.sqrt()?.to_dtype(y.dtype())?;
    y.broadcast_div(&(rms + 1e-5)?)
}

/// The largest |got - want| (infinite where got is not finite).
fn max_error(got: &Tensor, want: &Tensor) -> Result<f32> {
    let got = got.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
    let want = want.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
    Ok(got
        .iter()
        .zip(&want)
        .map(|(&g, &w)| if g.is_finite() { (g - w).abs() } else { f32::INFINITY })
        .fold(0.0, f32::max))
}

/// candle's attention in f32 over one sequence's q `[sq, HEADS_Q, d]` and
/// keys and values `[sk, HEADS_KV, d]`.
fn reference(q: &Tensor, k: &Tensor, v: &Tensor, scale: f64) -> Result<Tensor> {
    let f32_batch = |t: &Tensor| t.to_dtype(DType::F32)?.unsqueeze(0);
    candle_attention(&f32_batch(q)?, &f32_batch(k)?, &f32_batch(v)?, scale, true)?.squeeze(0)
}

/// Prefill and `STEPS` decode steps; with `check`, every attention output
/// against candle's attention (the largest error returned). Returns that
/// error, the prefill's seconds and the decode's.
fn generate(device: &Device, layers: &mut [Layer], prompt: &Tensor, check: bool) -> Result<(f32, f64, f64)> {
    let scale = 1.0 / (HEAD_DIM as f64).sqrt();
    let batch = PROMPTS.len();
    let mut offsets = vec![0u32];
    for len in PROMPTS {
        offsets.push(offsets.last().unwrap() + len as u32);
    }
    let cu = Tensor::new(offsets.as_slice(), device)?;
    let max_len = *PROMPTS.iter().max().unwrap();
    let mut worst = 0f32;

    device.synchronize()?;
    let start = Instant::now();
    // Prefill: the packed prompts, every layer.
    let mut x = prompt.clone();
    for layer in layers.iter_mut() {
        let (q, k, v) = project(layer, &x)?;
        let attn = fa::flash_attn_varlen(&q, &k, &v, &cu, &cu, max_len, max_len, scale as f32, true)?;
        for (b, &len) in PROMPTS.iter().enumerate() {
            let at = offsets[b] as usize;
            let seq = |t: &Tensor| t.narrow(0, at, len);
            for (cache, new) in [(&layer.k_cache, seq(&k)?), (&layer.v_cache, seq(&v)?)] {
                cache.narrow(0, b, 1)?.slice_set(&new.contiguous()?.unsqueeze(0)?, 1, 0)?;
            }
            if check {
                worst = worst.max(max_error(&seq(&attn)?, &reference(&seq(&q)?, &seq(&k)?, &seq(&v)?, scale)?)?);
            }
        }
        x = finish(layer, &x, &attn)?;
    }
    // Each sequence's last position starts the decode.
    let last: Vec<Tensor> = (0..batch).map(|b| x.i(offsets[b + 1] as usize - 1)).collect::<Result<_>>()?;
    let mut x = Tensor::stack(&last, 0)?;
    device.synchronize()?;
    let prefill_s = start.elapsed().as_secs_f64();

    let start = Instant::now();
    let mut seqlens: Vec<u32> = PROMPTS.iter().map(|&n| n as u32).collect();
    for _ in 0..STEPS {
        for layer in layers.iter_mut() {
            let (q, k, v) = project(layer, &x)?;
            let one_token = |t: &Tensor| t.unsqueeze(1);
            let (attn, _lse) = fa::flash_attn_kvcache_append(
                &one_token(&q)?,
                &layer.k_cache,
                &layer.v_cache,
                &one_token(&k)?,
                &one_token(&v)?,
                &seqlens,
                None,
                None,
                scale as f32,
                None,
                Some(0),
                None,
            )?;
            if check {
                for (b, &len) in seqlens.iter().enumerate() {
                    let cached = |cache: &Tensor| cache.i((b, ..len as usize + 1));
                    let want =
                        reference(&q.narrow(0, b, 1)?, &cached(&layer.k_cache)?, &cached(&layer.v_cache)?, scale)?;
                    worst = worst.max(max_error(&attn.i(b)?, &want)?);
                }
            }
            x = finish(layer, &x, &attn)?;
        }
        for n in seqlens.iter_mut() {
            *n += 1;
        }
    }
    device.synchronize()?;
    Ok((worst, prefill_s, start.elapsed().as_secs_f64()))
}

fn main() -> Result<()> {
    let device = match Device::new_cuda(0) {
        Ok(d) => d,
        Err(e) => {
            eprintln!(
                "decode: no usable CUDA GPU ({}): this example needs one.",
                e.to_string().lines().next().unwrap_or("")
            );
            std::process::exit(2);
        }
    };
    device.set_seed(2)?;
    let randn = |shape: (usize, usize), std: f64| Tensor::randn(0f32, std as f32, shape, &device)?.to_dtype(DType::F16);
    let qkv_width = (HEADS_Q + 2 * HEADS_KV) * HEAD_DIM;
    let mut layers: Vec<Layer> = (0..LAYERS)
        .map(|_| -> Result<Layer> {
            let cache = || Tensor::zeros((PROMPTS.len(), CAPACITY, HEADS_KV, HEAD_DIM), DType::F16, &device);
            Ok(Layer {
                w_qkv: randn((HIDDEN, qkv_width), (HIDDEN as f64).powf(-0.5))?,
                w_o: randn((HIDDEN, HIDDEN), (HIDDEN as f64).powf(-0.5))?,
                k_cache: cache()?,
                v_cache: cache()?,
            })
        })
        .collect::<Result<_>>()?;
    let prompt = randn((PROMPTS.iter().sum(), HIDDEN), 1.0)?;
    println!(
        "decode: {LAYERS} layers, {HEADS_Q} query heads over {HEADS_KV} KV heads, head dim {HEAD_DIM}, f16; prompts of \
         {PROMPTS:?} tokens, then {STEPS} steps of one token per sequence through a KV cache of {CAPACITY}"
    );
    let (worst, _, _) = generate(&device, &mut layers, &prompt, true)?;
    println!("decode: every attention output against candle's attention (f32): max |diff| {worst:.2e} (tolerance {TOLERANCE:.0e})");
    let (_, prefill_s, decode_s) = generate(&device, &mut layers, &prompt, false)?;
    let batch = PROMPTS.len();
    println!(
        "decode: prefill {} tokens in {:.2} ms; decode {:.0} tokens/s ({STEPS} steps of {batch} sequences, {:.3} ms a step)",
        PROMPTS.iter().sum::<usize>(),
        prefill_s * 1e3,
        (STEPS * batch) as f64 / decode_s,
        decode_s * 1e3 / STEPS as f64
    );
    if worst.is_nan() || worst > TOLERANCE {
        eprintln!("decode: an attention output is off candle's attention by {worst:.2e}");
        std::process::exit(1);
    }
    Ok(())
}

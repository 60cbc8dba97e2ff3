//! Forward-pass benchmark over the standard grid: batch * seqlen = 16384
//! tokens, hidden 2048 (heads = 2048 / head_dim), seqlen 512..16384, head
//! dims 64 and 128, causal and not, f16 and bf16. TFLOP/s counts
//! 4 * batch * heads * seqlen^2 * head_dim, halved for causal.
//!
//! `bench [--out FILE] [--quick]`: prints a table and writes one JSON object
//! per shape to FILE (for scripts/bench_torch.py, which adds torch's figures).

use std::io::Write;

use flash_attn::cust::event::{Event, EventFlags};
use flash_attn::cust::memory::DeviceBuffer;
use flash_attn::cust::stream::{Stream, StreamFlags};
use flash_attn::{bf16, f16, AttentionParams, FlashAttention, Tensor, TensorMut};
use flash_attn_tests::{normal, TestElement};

struct Shape {
    seqlen: usize,
    head_dim: usize,
    causal: bool,
    dtype: &'static str,
}

fn time_shape<T: TestElement>(
    attention: &FlashAttention,
    shape: &Shape,
    reps: usize,
) -> Result<f64, Box<dyn std::error::Error>> {
    let batch = 16384 / shape.seqlen;
    let heads = 2048 / shape.head_dim;
    let dims = [batch, shape.seqlen, heads, shape.head_dim];
    let n: usize = dims.iter().product();
    let mut rng = rand::thread_rng();
    let mut random = || DeviceBuffer::from_slice(&normal(&mut rng, n).into_iter().map(T::from_f32).collect::<Vec<T>>());
    let (q, k, v) = (random()?, random()?, random()?);
    let mut o = DeviceBuffer::from_slice(&vec![T::from_bits(T::POISON); n])?;
    let mut lse = DeviceBuffer::from_slice(&vec![f32::NAN; batch * heads * shape.seqlen])?;
    let stream = Stream::new(StreamFlags::NON_BLOCKING, None)?;
    let params = AttentionParams { causal: shape.causal, softmax_scale: None };
    let run = |o: &mut DeviceBuffer<T>, lse: &mut DeviceBuffer<f32>| {
        attention.forward_into(
            Tensor::new(&q, dims),
            Tensor::new(&k, dims),
            Tensor::new(&v, dims),
            TensorMut::new(o, dims),
            lse,
            &params,
            &stream,
        )
    };
    for _ in 0..3 {
        run(&mut o, &mut lse)?;
    }
    stream.synchronize()?;
    let mut times = Vec::with_capacity(reps);
    let (start, stop) = (Event::new(EventFlags::DEFAULT)?, Event::new(EventFlags::DEFAULT)?);
    for _ in 0..reps {
        start.record(&stream)?;
        run(&mut o, &mut lse)?;
        stop.record(&stream)?;
        stop.synchronize()?;
        times.push(stop.elapsed_time_f32(&start)? as f64);
    }
    times.sort_by(|a, b| a.total_cmp(b));
    let median_ms = times[reps / 2];
    let flops = 4.0 * (batch * heads) as f64 * (shape.seqlen * shape.seqlen) as f64 * shape.head_dim as f64
        / if shape.causal { 2.0 } else { 1.0 };
    Ok(flops / (median_ms * 1e-3) / 1e12)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let out_path = args.iter().position(|a| a == "--out").and_then(|i| args.get(i + 1)).cloned();
    let quick = args.iter().any(|a| a == "--quick");
    let _context =
        flash_attn::cust::quick_init().map_err(|e| format!("no usable CUDA GPU ({e}): the benchmark needs one"))?;
    let attention = FlashAttention::new()?;
    let seqlens: &[usize] = if quick { &[1024, 4096] } else { &[512, 1024, 2048, 4096, 8192, 16384] };
    let reps = if quick { 10 } else { 30 };
    let mut out = match &out_path {
        Some(p) => Some(std::fs::File::create(p)?),
        None => None,
    };
    println!("{:<6} {:>4} {:>7} {:>6} {:>10}", "dtype", "d", "causal", "seqlen", "TFLOP/s");
    for dtype in ["f16", "bf16"] {
        for head_dim in [64, 128] {
            for causal in [false, true] {
                for &seqlen in seqlens {
                    let shape = Shape { seqlen, head_dim, causal, dtype };
                    let tflops = match dtype {
                        "f16" => time_shape::<f16>(&attention, &shape, reps)?,
                        _ => time_shape::<bf16>(&attention, &shape, reps)?,
                    };
                    println!("{:<6} {:>4} {:>7} {:>6} {:>10.1}", dtype, head_dim, causal, seqlen, tflops);
                    if let Some(f) = out.as_mut() {
                        writeln!(
                            f,
                            "{{\"dtype\":\"{}\",\"head_dim\":{},\"causal\":{},\"seqlen\":{},\"batch\":{},\"heads\":{},\"tflops\":{:.3}}}",
                            shape.dtype,
                            head_dim,
                            causal,
                            seqlen,
                            16384 / seqlen,
                            2048 / head_dim,
                            tflops
                        )?;
                    }
                }
            }
        }
    }
    Ok(())
}

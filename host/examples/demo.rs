//! Runs causal attention on the GPU for one shape, checks it against the
//! f64 CPU reference, and times it. Without a usable GPU it says what is
//! missing and exits with status 2.
//!
//! `cargo run --release -p flash-attn --example demo`

use std::time::Instant;

use cust::memory::DeviceBuffer;
use cust::stream::{Stream, StreamFlags};
use flash_attn::half1::f16;
use flash_attn::reference::{self, ReferenceProblem};
use flash_attn::{AttentionParams, FlashAttention, Tensor, TensorMut};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let _context = match cust::quick_init() {
        Ok(context) => context,
        Err(e) => {
            eprintln!("demo: no usable CUDA GPU ({e}).");
            eprintln!("demo: this needs an NVIDIA GPU of compute capability 8.0+ (A100, H100, H200) and its driver.");
            std::process::exit(2);
        }
    };
    let attention = FlashAttention::new()?;
    let stream = Stream::new(StreamFlags::NON_BLOCKING, None)?;

    let (batch, seqlen, heads, head_dim) = (2, 1024, 8, 128);
    let shape = [batch, seqlen, heads, head_dim];
    let n = batch * seqlen * heads * head_dim;
    // A small deterministic generator keeps the demo free of extra crates.
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let mut random = || {
        (0..n)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                f16::from_f32((state >> 40) as f32 / (1u64 << 23) as f32 - 1.0)
            })
            .collect::<Vec<f16>>()
    };
    let (q, k, v) = (random(), random(), random());
    let (q_dev, k_dev, v_dev) =
        (DeviceBuffer::from_slice(&q)?, DeviceBuffer::from_slice(&k)?, DeviceBuffer::from_slice(&v)?);
    let params = AttentionParams { causal: true, ..Default::default() };
    let out = attention.forward(
        Tensor::new(&q_dev, shape),
        Tensor::new(&k_dev, shape),
        Tensor::new(&v_dev, shape),
        &params,
        &stream,
    )?;
    stream.synchronize()?;

    // Time calls into preallocated outputs, so no allocation is measured.
    let mut o_timed = DeviceBuffer::from_slice(&vec![f16::ZERO; n])?;
    let mut lse_timed = DeviceBuffer::from_slice(&vec![0f32; batch * heads * seqlen])?;
    let reps = 50;
    let mut started = Instant::now();
    for rep in 0..=reps {
        if rep == 1 {
            stream.synchronize()?; // the first call warms up
            started = Instant::now();
        }
        attention.forward_into(
            Tensor::new(&q_dev, shape),
            Tensor::new(&k_dev, shape),
            Tensor::new(&v_dev, shape),
            TensorMut::new(&mut o_timed, shape),
            &mut lse_timed,
            &params,
            &stream,
        )?;
    }
    stream.synchronize()?;
    let seconds = started.elapsed().as_secs_f64() / reps as f64;
    let flops = 4.0 * (batch * heads) as f64 * (seqlen * seqlen) as f64 * head_dim as f64 / 2.0;

    let o: Vec<f64> = out.o.as_host_vec()?.iter().map(|x| x.to_f64()).collect();
    let widen = |x: &[f16]| x.iter().map(|x| x.to_f64()).collect::<Vec<f64>>();
    let problem =
        ReferenceProblem::dense(batch, seqlen, seqlen, heads, heads, head_dim, true, 1.0 / (head_dim as f64).sqrt());
    let expected = reference::attention(&problem, &widen(&q), &widen(&k), &widen(&v));
    let error = reference::relative_l2_error(&o, &expected.o);
    println!("demo: causal attention, f16, batch {batch}, seqlen {seqlen}, heads {heads}, head_dim {head_dim}");
    println!("demo: relative L2 error against the f64 CPU reference: {error:.2e}");
    println!("demo: {:.3} ms per call, {:.1} TFLOP/s (timed on the host clock)", seconds * 1e3, flops / seconds / 1e12);
    if error >= 2e-3 {
        return Err(format!("error {error:.2e} is above the 2e-3 bound").into());
    }
    Ok(())
}

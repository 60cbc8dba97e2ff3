//! A few steps of training one attention layer on the GPU: forward, a loss,
//! backward, an SGD step, over and over; the loss falls. The layer's
//! parameters are q, k and v themselves (f32 master copies on the host,
//! rounded to f16 for each step), fitted to the output of a fixed random
//! "teacher" attention: loss = 0.5 * sum((O - T)^2) / rows, so dL/dO =
//! (O - T) / rows. On the first step the gradients are checked against the
//! f64 CPU reference (`flash_attn::reference::attention_backward`). Exits
//! with status 1 if they disagree or the loss does not fall, and 2 without a
//! usable GPU.
//!
//! `cargo run --release -p flash-attn --example train`

use cust::memory::DeviceBuffer;
use cust::stream::{Stream, StreamFlags};
use flash_attn::half1::f16;
use flash_attn::reference::{attention_backward, relative_l2_error, ReferenceProblem};
use flash_attn::{AttentionParams, FlashAttention, Gradients, Tensor, TensorMut, Workspace};

const SHAPE: [usize; 4] = [2, 128, 4, 64];
const STEPS: usize = 30;
const LEARNING_RATE: f32 = 100.0;
/// Largest relative L2 error of the first step's gradients (f16).
const GRADIENT_TOLERANCE: f64 = 2e-3;

/// Standard-normal-ish values from a small deterministic generator (no
/// extra crates).
fn random(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            // The sum of four uniforms, centred: close enough to a normal.
            (0..4)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5
                })
                .sum::<f32>()
                * scale
        })
        .collect()
}

fn to_f16(values: &[f32]) -> Vec<f16> {
    values.iter().map(|&x| f16::from_f32(x)).collect()
}

fn to_f64(values: &[f16]) -> Vec<f64> {
    values.iter().map(|x| x.to_f64()).collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let _context = match cust::quick_init() {
        Ok(context) => context,
        Err(e) => {
            eprintln!("train: no usable CUDA GPU ({e}): this example needs one.");
            std::process::exit(2);
        }
    };
    let attention = FlashAttention::new()?;
    let stream = Stream::new(StreamFlags::NON_BLOCKING, None)?;
    let params = AttentionParams { causal: true, ..Default::default() };
    let [batch, seqlen, heads, head_dim] = SHAPE;
    let n = SHAPE.iter().product::<usize>();
    let rows = (batch * seqlen * heads) as f32;

    // The teacher's output T, by our forward on fixed random q, k, v.
    let teacher: Vec<DeviceBuffer<f16>> =
        (0..3).map(|i| DeviceBuffer::from_slice(&to_f16(&random(n, 100 + i, 1.0)))).collect::<Result<_, _>>()?;
    let mut target = DeviceBuffer::from_slice(&vec![f16::ZERO; n])?;
    let mut lse = DeviceBuffer::from_slice(&vec![0f32; batch * heads * seqlen])?;
    attention.forward_into(
        Tensor::new(&teacher[0], SHAPE),
        Tensor::new(&teacher[1], SHAPE),
        Tensor::new(&teacher[2], SHAPE),
        TensorMut::new(&mut target, SHAPE),
        &mut lse,
        &params,
        &stream,
    )?;
    stream.synchronize()?;
    let target = target.as_host_vec()?;

    // The student's parameters, f32 on the host.
    let mut weights: Vec<Vec<f32>> = (0..3).map(|i| random(n, 200 + i, 1.0)).collect();
    let mut o = DeviceBuffer::from_slice(&vec![f16::ZERO; n])?;
    let mut gradients: Vec<DeviceBuffer<f16>> =
        (0..3).map(|_| DeviceBuffer::from_slice(&vec![f16::ZERO; n])).collect::<Result<_, _>>()?;
    let mut workspace = Workspace::new();
    let mut losses = Vec::with_capacity(STEPS);
    for step in 0..STEPS {
        let inputs: Vec<Vec<f16>> = weights.iter().map(|w| to_f16(w)).collect();
        let device: Vec<DeviceBuffer<f16>> =
            inputs.iter().map(|x| DeviceBuffer::from_slice(x)).collect::<Result<_, _>>()?;
        let (q, k, v) =
            (Tensor::new(&device[0], SHAPE), Tensor::new(&device[1], SHAPE), Tensor::new(&device[2], SHAPE));
        attention.forward_into(q, k, v, TensorMut::new(&mut o, SHAPE), &mut lse, &params, &stream)?;
        stream.synchronize()?;

        // The loss and dO (scaled, above) on the host.
        let out = o.as_host_vec()?;
        let diff: Vec<f32> = out.iter().zip(&target).map(|(o, t)| o.to_f32() - t.to_f32()).collect();
        let loss = 0.5 * diff.iter().map(|d| d * d).sum::<f32>() / rows;
        losses.push(loss);
        let d_o = to_f16(&diff);
        let d_o_device = DeviceBuffer::from_slice(&d_o)?;

        let [d_q, d_k, d_v] = &mut gradients[..] else { unreachable!("three gradients") };
        let grads = Gradients {
            d_q: TensorMut::new(d_q, SHAPE),
            d_k: TensorMut::new(d_k, SHAPE),
            d_v: TensorMut::new(d_v, SHAPE),
        };
        attention.backward_into(
            q,
            k,
            v,
            Tensor::new(&o, SHAPE),
            &lse,
            Tensor::new(&d_o_device, SHAPE),
            grads,
            &params,
            &mut workspace,
            &stream,
        )?;
        stream.synchronize()?;
        let grads: Vec<Vec<f16>> = gradients.iter().map(|g| g.as_host_vec()).collect::<Result<_, _>>()?;
        println!("step {step:>2}: loss {loss:.6}");

        if step == 0 {
            let scale = 1.0 / (head_dim as f64).sqrt();
            let problem = ReferenceProblem::dense(batch, seqlen, seqlen, heads, heads, head_dim, true, scale);
            let [q64, k64, v64] = [0, 1, 2].map(|i| to_f64(&inputs[i]));
            let expected = attention_backward(&problem, None, &q64, &k64, &v64, &to_f64(&d_o));
            for (name, got, want) in [("dQ", 0, &expected.dq), ("dK", 1, &expected.dk), ("dV", 2, &expected.dv)] {
                let error = relative_l2_error(&to_f64(&grads[got]), want);
                println!("step  0: {name} against the f64 reference: relative L2 error {error:.2e}");
                if error.is_nan() || error >= GRADIENT_TOLERANCE {
                    eprintln!("train: {name} is off the reference by {error:.2e} (tolerance {GRADIENT_TOLERANCE:.0e})");
                    std::process::exit(1);
                }
            }
        }
        for (w, g) in weights.iter_mut().zip(&grads) {
            for (w, g) in w.iter_mut().zip(g) {
                *w -= LEARNING_RATE * g.to_f32() / rows;
            }
        }
    }
    let (first, last) = (losses[0], losses[STEPS - 1]);
    println!("train: loss {first:.6} -> {last:.6} over {STEPS} steps");
    if last.is_nan() || last >= 0.5 * first {
        eprintln!("train: the loss did not fall by half");
        std::process::exit(1);
    }
    Ok(())
}

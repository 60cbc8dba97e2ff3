//! flash-attn's training example (`host/examples/train.rs`) in candle: a
//! few steps of training one attention layer, forward, a loss,
//! `loss.backward()`, an SGD step, over and over; the loss falls. The
//! layer's parameters are q, k and v themselves (candle `Var`s in f32,
//! rounded to f16 for each step's forward), fitted to the output of a fixed
//! random "teacher" attention: loss = 0.5 * sum((O - T)^2) / rows. The
//! forward is `flash_attn_candle::flash_attn`; candle's `backward()` runs
//! flash-attn's backward kernels through the op's `bwd`. On the first step
//! the gradients are checked against candle's own attention (matmul +
//! softmax) differentiated by candle in f64, on the same values and for the
//! same dL/dO. Exits with status 1 if they disagree or the loss does not
//! fall by half, and 2 without a usable GPU.
//!
//! `cargo run --release -p flash-attn-candle --example train`

use candle_core::{DType, Device, Result, Tensor, Var};
use flash_attn_candle as fa;

#[path = "common/attention.rs"]
mod attention;
use attention::candle_attention;

const SHAPE: (usize, usize, usize, usize) = (2, 128, 4, 64);
const STEPS: usize = 30;
const LEARNING_RATE: f64 = 100.0;
/// Largest relative L2 error of the first step's gradients (f16).
const GRADIENT_TOLERANCE: f64 = 2e-3;

/// The relative L2 error of `got` against `want`.
fn relative_l2_error(got: &Tensor, want: &Tensor) -> Result<f64> {
    let got = got.to_dtype(DType::F64)?;
    let want = want.to_dtype(DType::F64)?;
    let diff = (got - &want)?.sqr()?.sum_all()?.to_scalar::<f64>()?.sqrt();
    Ok(diff / want.sqr()?.sum_all()?.to_scalar::<f64>()?.sqrt())
}

fn main() -> Result<()> {
    let device = match Device::new_cuda(0) {
        Ok(d) => d,
        Err(e) => {
            eprintln!(
                "train: no usable CUDA GPU ({}): this example needs one.",
                e.to_string().lines().next().unwrap_or("")
            );
            std::process::exit(2);
        }
    };
    device.set_seed(1)?;
    let (batch, seqlen, heads, head_dim) = SHAPE;
    let rows = (batch * seqlen * heads) as f64;
    let scale = 1.0 / (head_dim as f64).sqrt();
    let attend = |q: &Tensor, k: &Tensor, v: &Tensor| fa::flash_attn(q, k, v, scale as f32, true);

    // The teacher's output T, by our forward on fixed random q, k, v.
    let teacher = |_| Tensor::randn(0f32, 1.0, SHAPE, &device)?.to_dtype(DType::F16);
    let (tq, tk, tv) = (teacher(0)?, teacher(1)?, teacher(2)?);
    let target = attend(&tq, &tk, &tv)?.to_dtype(DType::F32)?;

    // The student's parameters, f32.
    let weights = [0, 1, 2].map(|_| Tensor::randn(0f32, 1.0, SHAPE, &device).and_then(|t| Var::from_tensor(&t)));
    let [q, k, v] = weights;
    let (q, k, v) = (q?, k?, v?);
    let mut losses = Vec::with_capacity(STEPS);
    for step in 0..STEPS {
        let inputs = [&q, &k, &v].map(|w| w.as_tensor().to_dtype(DType::F16));
        let [q16, k16, v16] = inputs;
        let (q16, k16, v16) = (q16?, k16?, v16?);
        let o = attend(&q16, &k16, &v16)?.to_dtype(DType::F32)?;
        let diff = (&o - &target)?;
        let loss = (diff.sqr()?.sum_all()? * (0.5 / rows))?;
        let loss_value = loss.to_scalar::<f32>()?;
        losses.push(loss_value);
        let grads = loss.backward()?;
        let grad = |w: &Var| {
            grads
                .get(w.as_tensor())
                .cloned()
                .ok_or_else(|| candle_core::Error::Msg("a parameter got no gradient".into()))
        };
        let (d_q, d_k, d_v) = (grad(&q)?, grad(&k)?, grad(&v)?);
        println!("step {step:>2}: loss {loss_value:.6}");

        if step == 0 {
            // The same values and the same dL/dO through candle's attention
            // in f64, differentiated by candle.
            let d_o = (diff.detach().to_dtype(DType::F64)? / rows)?;
            let vars = [&q16, &k16, &v16].map(|t| t.to_dtype(DType::F64).and_then(|t| Var::from_tensor(&t)));
            let [rq, rk, rv] = vars;
            let (rq, rk, rv) = (rq?, rk?, rv?);
            let o64 = candle_attention(rq.as_tensor(), rk.as_tensor(), rv.as_tensor(), scale, true)?;
            let expected = (o64 * &d_o)?.sum_all()?.backward()?;
            for (name, got, var) in [("dQ", &d_q, &rq), ("dK", &d_k, &rk), ("dV", &d_v, &rv)] {
                let want =
                    expected.get(var.as_tensor()).ok_or_else(|| candle_core::Error::Msg("no reference".into()))?;
                let error = relative_l2_error(got, want)?;
                println!("step  0: {name} against candle's f64 attention: relative L2 error {error:.2e}");
                if error.is_nan() || error >= GRADIENT_TOLERANCE {
                    eprintln!(
                        "train: {name} is off candle's attention by {error:.2e} (tolerance {GRADIENT_TOLERANCE:.0e})"
                    );
                    std::process::exit(1);
                }
            }
        }
        for (w, g) in [(&q, &d_q), (&k, &d_k), (&v, &d_v)] {
            w.set(&(w.as_tensor() - (g * LEARNING_RATE)?)?)?;
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

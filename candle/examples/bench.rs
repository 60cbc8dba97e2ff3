//! The candle op against flash-attn's own `forward_into` on the same
//! buffers and the same stream (candle's), timed with CUDA events after at
//! least a second of the same call back to back, the two alternating over
//! three rounds (medians): the difference is what the candle layer adds
//! (checks, the output allocation, the custom-op plumbing). Both run bf16.
//! `run.sh` of the candle GPU bundle prints the SM clock and board power
//! sampled over the run.
//!
//! ```text
//! cargo run --release -p flash-attn-candle --example bench [-- ITERS]
//! ```

use candle_core::cuda_backend::cudarc::driver::sys::CUevent_flags;
use candle_core::cuda_backend::cudarc::driver::CudaSlice;
use candle_core::{DType, Device, Result, Storage, Tensor};
use flash_attn::{AttentionParams, TensorMut};
use flash_attn_candle as fa;
use half::bf16;

/// (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, causal)
const SHAPES: [(usize, usize, usize, usize, usize, usize, bool); 5] = [
    (16, 512, 512, 16, 16, 64, false),
    (4, 2048, 2048, 32, 32, 128, true),
    (1, 8192, 8192, 32, 8, 128, true),
    (2, 4096, 4096, 16, 16, 256, false),
    // Decoding: one query row over a long cache.
    (32, 1, 4096, 32, 8, 128, false),
];

/// Milliseconds per call of `f`, in the state a loop keeps the GPU in:
/// calls queued back to back for at least a second (no synchronization),
/// then `iters` more between two events queued right behind them.
fn time_ms(device: &Device, iters: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    let stream = device.as_cuda_device()?.cuda_stream();
    let w = |e| candle_core::Error::Msg(format!("{e}"));
    let warm = std::time::Instant::now();
    while warm.elapsed() < std::time::Duration::from_secs(1) {
        f()?;
    }
    let start = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(w)?;
    for _ in 0..iters {
        f()?;
    }
    let end = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(w)?;
    end.synchronize().map_err(w)?;
    Ok(start.elapsed_ms(&end).map_err(w)? as f64 / iters as f64)
}

/// The median of `values`.
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Rounds of each measurement, alternating the two, so that neither sees
/// only a cooler or a hotter GPU.
const ROUNDS: usize = 3;

fn slice(storage: &Storage) -> Result<&CudaSlice<bf16>> {
    match storage {
        Storage::Cuda(s) => s.as_cuda_slice::<bf16>(),
        _ => candle_core::bail!("not a CUDA tensor"),
    }
}

fn main() -> Result<()> {
    let iters = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(20);
    let device = match Device::new_cuda(0) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("bench: no usable CUDA GPU ({})", e.to_string().lines().next().unwrap_or_default());
            return Ok(());
        }
    };
    let attention = fa::flash_attention(&device)?;
    let stream = device.as_cuda_device()?.cuda_stream();
    println!("| batch | seqlen_q | seqlen_k | heads q/kv | head_dim | causal | candle op ms | forward_into ms | ratio | TFLOP/s (candle op) |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for (b, sq, sk, hq, hkv, d, causal) in SHAPES {
        let randn = |s: usize, h: usize| Tensor::randn(0f32, 1.0, (b, s, h, d), &device)?.to_dtype(DType::BF16);
        let (q, k, v) = (randn(sq, hq)?, randn(sk, hkv)?, randn(sk, hkv)?);
        let scale = 1.0 / (d as f32).sqrt();

        // candle's own buffers, read in place (all three are contiguous
        // from offset 0).
        let (qg, kg, vg) = (q.storage_and_layout().0, k.storage_and_layout().0, v.storage_and_layout().0);
        let (qs, ks, vs) = (slice(&qg)?, slice(&kg)?, slice(&vg)?);
        let mut o = stream.alloc_zeros::<bf16>(b * sq * hq * d).map_err(|e| candle_core::Error::Msg(format!("{e}")))?;
        let mut lse = stream.alloc_zeros::<f32>(b * hq * sq).map_err(|e| candle_core::Error::Msg(format!("{e}")))?;
        let params = AttentionParams { causal, softmax_scale: Some(scale), ..Default::default() };
        let (mut candle_rounds, mut core_rounds) = (Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            candle_rounds.push(time_ms(&device, iters, || fa::flash_attn(&q, &k, &v, scale, causal).map(drop))?);
            core_rounds.push(time_ms(&device, iters, || {
                attention
                    .forward_into(
                        flash_attn::Tensor::new(qs, [b, sq, hq, d]),
                        flash_attn::Tensor::new(ks, [b, sk, hkv, d]),
                        flash_attn::Tensor::new(vs, [b, sk, hkv, d]),
                        TensorMut::new(&mut o, [b, sq, hq, d]),
                        &mut lse,
                        &params,
                        &stream,
                    )
                    .map(drop)
                    .map_err(|e| candle_core::Error::Msg(format!("{e}")))
            })?);
        }
        let (candle_ms, core_ms) = (median(candle_rounds), median(core_rounds));

        // Matmul FLOPs of q k^T and p v over the keys each row sees.
        let pairs =
            if causal { (0..sq).map(|i| (i + sk).saturating_sub(sq).min(sk - 1) + 1).sum::<usize>() } else { sq * sk };
        let flops = 4.0 * (b * hq * d * pairs) as f64;
        println!(
            "| {b} | {sq} | {sk} | {hq}/{hkv} | {d} | {causal} | {candle_ms:.3} | {core_ms:.3} | {:.3} | {:.1} |",
            candle_ms / core_ms,
            flops / candle_ms / 1e9
        );
    }
    Ok(())
}

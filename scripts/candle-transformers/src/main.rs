//! candle-transformers' Llama, built by its own model code with random
//! weights (a small GQA config: 16 query heads over 4 KV heads, head dim 64,
//! 4 layers), run with `use_flash_attn` on (the model calls
//! `candle_flash_attn::flash_attn`, which the `[patch]` line of this
//! program's Cargo.toml makes flash-attn's kernels) and off (candle's matmul
//! + softmax attention, which the model computes in f32), in f16 and in bf16,
//! beside an f32 run of the same weights (attention off: flash-attn takes
//! f16 and bf16 only).
//!
//! Each run prefills one prompt, then decodes greedily through
//! candle-transformers' KV cache. The f32 run picks the tokens and the other
//! runs are fed the same ones, so that the logits of every step compare;
//! each run's own greedy pick is counted against the f32 run's. Prints, per
//! run, the largest logit error against the f32 run (prefill, decode), the
//! greedy agreement and tokens/s (prefill, decode; after a warm-up run).
//! Exits 1 when a logit is not finite or a flash-attn run is further from
//! the f32 run than twice the same dtype's run on candle's attention plus 1%
//! of the f32 logits' largest magnitude; 2 without a usable GPU.
//!
//! usage: candle-transformers-check [SEED]

use std::collections::HashMap;
use std::time::Instant;

use candle_core::{DType, Device, Result, Tensor};
use candle_nn::{VarBuilder, VarMap};
use candle_transformers::models::llama::{Cache, Config, Llama};

const PROMPT: usize = 256;
const STEPS: usize = 32;
const VOCAB: usize = 32000;

fn config(use_flash_attn: bool) -> Config {
    Config {
        hidden_size: 1024,
        intermediate_size: 2816,
        vocab_size: VOCAB,
        num_hidden_layers: 4,
        num_attention_heads: 16,
        num_key_value_heads: 4,
        use_flash_attn,
        rms_norm_eps: 1e-5,
        rope_theta: 10_000.0,
        bos_token_id: None,
        eos_token_id: None,
        rope_scaling: None,
        max_position_embeddings: 1024,
        tie_word_embeddings: false,
    }
}

/// One run: the logits after the prompt and after each decode step, the
/// run's own greedy pick at each, and the time of prefill and decode.
struct Run {
    logits: Vec<Vec<f32>>,
    picks: Vec<u32>,
    prefill_s: f64,
    decode_s: f64,
}

fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in logits.iter().enumerate() {
        if x > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// Prefill `prompt`, then `steps` greedy steps, fed `forced` tokens when
/// given (else the run's own picks).
fn run(
    model: &Llama,
    cfg: &Config,
    dtype: DType,
    device: &Device,
    prompt: &[u32],
    steps: usize,
    forced: Option<&[u32]>,
) -> Result<Run> {
    let mut cache = Cache::new(true, dtype, cfg, device)?;
    let input = Tensor::new(prompt, device)?.unsqueeze(0)?;
    device.synchronize()?;
    let start = Instant::now();
    let logits = model.forward(&input, 0, &mut cache)?.squeeze(0)?.to_vec1::<f32>()?;
    let prefill_s = start.elapsed().as_secs_f64();
    let mut picks = vec![argmax(&logits)];
    let mut all = vec![logits];
    let start = Instant::now();
    for step in 0..steps {
        let next = forced.map_or(picks[step], |f| f[step]);
        let input = Tensor::new(&[next], device)?.unsqueeze(0)?;
        let logits = model.forward(&input, prompt.len() + step, &mut cache)?.squeeze(0)?.to_vec1::<f32>()?;
        picks.push(argmax(&logits));
        all.push(logits);
    }
    Ok(Run { logits: all, picks, prefill_s, decode_s: start.elapsed().as_secs_f64() })
}

/// The largest |a - b| over the logits of positions `range` (infinite where
/// either is not finite).
fn max_error(a: &Run, b: &Run, range: std::ops::Range<usize>) -> f32 {
    let mut worst = 0f32;
    for i in range {
        for (&x, &y) in a.logits[i].iter().zip(&b.logits[i]) {
            let e = if x.is_finite() && y.is_finite() { (x - y).abs() } else { f32::INFINITY };
            worst = worst.max(e);
        }
    }
    worst
}

/// Tokens from a small deterministic generator.
fn tokens(n: usize, seed: u64) -> Vec<u32> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % VOCAB as u64) as u32
        })
        .collect()
}

fn main() -> Result<()> {
    let seed: u64 = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(1);
    let device = match Device::new_cuda(0) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("candle-transformers-check: no usable CUDA GPU ({})", e.to_string().lines().next().unwrap_or(""));
            std::process::exit(2);
        }
    };
    device.set_seed(seed)?;
    let reference_cfg = config(false);
    println!(
        "candle-transformers Llama, random weights (seed {seed}): hidden {}, {} layers, {} query heads over {} KV heads, \
         head dim {}, vocab {VOCAB}; prompt {PROMPT} tokens, then {STEPS} greedy steps through its KV cache",
        reference_cfg.hidden_size,
        reference_cfg.num_hidden_layers,
        reference_cfg.num_attention_heads,
        reference_cfg.num_key_value_heads,
        reference_cfg.hidden_size / reference_cfg.num_attention_heads,
    );
    let varmap = VarMap::new();
    let reference = Llama::load(VarBuilder::from_varmap(&varmap, DType::F32, &device), &reference_cfg)?;
    let weights: HashMap<String, Tensor> = varmap
        .data()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .map(|(name, var)| (name.clone(), var.as_tensor().clone()))
        .collect();
    let prompt = tokens(PROMPT, seed);
    let warm_up = &prompt[..16];

    run(&reference, &reference_cfg, DType::F32, &device, warm_up, 2, None)?;
    let f32_run = run(&reference, &reference_cfg, DType::F32, &device, &prompt, STEPS, None)?;
    let forced = &f32_run.picks[..STEPS];
    let scale = f32_run.logits.iter().flatten().fold(0f32, |m, x| m.max(x.abs()));

    println!("| dtype | attention | prefill max abs err vs f32 | decode max abs err vs f32 | greedy picks as f32 | prefill tokens/s | decode tokens/s |");
    println!("|---|---|---|---|---|---|---|");
    let rate = |tokens: usize, s: f64| tokens as f64 / s;
    println!(
        "| f32 | candle | - | - | - | {:.0} | {:.1} |",
        rate(PROMPT, f32_run.prefill_s),
        rate(STEPS, f32_run.decode_s)
    );
    let mut failed = !scale.is_finite();
    for dtype in [DType::F16, DType::BF16] {
        let mut worst = [0f32; 2];
        for (i, flash) in [false, true].into_iter().enumerate() {
            let cfg = config(flash);
            let model = Llama::load(VarBuilder::from_tensors(weights.clone(), dtype, &device), &cfg)?;
            run(&model, &cfg, dtype, &device, warm_up, 2, None)?;
            let r = run(&model, &cfg, dtype, &device, &prompt, STEPS, Some(forced))?;
            let (prefill, decode) = (max_error(&r, &f32_run, 0..1), max_error(&r, &f32_run, 1..STEPS + 1));
            worst[i] = prefill.max(decode);
            let agree = r.picks.iter().zip(&f32_run.picks).filter(|(a, b)| a == b).count();
            println!(
                "| {dtype:?} | {} | {prefill:.4} | {decode:.4} | {agree}/{} | {:.0} | {:.1} |",
                if flash { "flash-attn (candle_flash_attn, patched)" } else { "candle" },
                STEPS + 1,
                rate(PROMPT, r.prefill_s),
                rate(STEPS, r.decode_s)
            );
        }
        let bound = 2.0 * worst[0] + 0.01 * scale;
        if worst[1].is_nan() || worst[1] > bound {
            println!(
                "candle-transformers-check: {dtype:?} with flash-attn is {} off the f32 logits, beyond {bound:.4} \
                 (twice candle's attention's {} + 1% of the largest |logit| {scale:.2})",
                worst[1], worst[0]
            );
            failed = true;
        }
    }
    println!("candle-transformers check: {}", if failed { "FAILED" } else { "passed" });
    std::process::exit(if failed { 1 } else { 0 })
}

//! Runs one small attention call through the host's pipeline (validate ->
//! plan -> launches) and the real kernel code on the CPU emulator (no GPU
//! involved), and compares it with an f64 reference.
//!
//! `cargo run --release -p flash-attn-tests --example emulate [kernel]`
//!
//! The call is made for the plan to choose `kernel` (default
//! `flash_fwd_d64_f16_causal`): 100 queries over 80 keys, plain for a
//! `full` kernel, causal for a `causal` one, causal in a 48-key sliding
//! window for a `general` one, and the same window over 16 queries for a
//! `decode` one.

use std::process::ExitCode;
use std::time::Instant;

use flash_attn::{AttentionParams, ATTENTION_KERNELS};
use flash_attn_abi::kernels::Variant;
use flash_attn_tests::emulator::{forward, Reference, Tensor};

fn main() -> ExitCode {
    let name = std::env::args().nth(1).unwrap_or_else(|| "flash_fwd_d64_f16_causal".into());
    let Some(kernel) = ATTENTION_KERNELS.iter().find(|k| k.name == name) else {
        let names: Vec<_> = ATTENTION_KERNELS.iter().map(|k| k.name).collect();
        eprintln!("unknown kernel {name}; one of: {}", names.join(", "));
        return ExitCode::FAILURE;
    };
    let (d, dtype) = (kernel.head_dim as usize, kernel.dtype);
    let window = AttentionParams { causal: true, window: (Some(48), None), ..Default::default() };
    let (seqlen_q, params) = match kernel.variant {
        Variant::Full => (100, AttentionParams::default()),
        Variant::Causal => (100, AttentionParams { causal: true, ..Default::default() }),
        Variant::General => (100, window),
        Variant::Decode => (16, window),
    };
    let (batch, seqlen_k, heads_q, heads_kv) = (1, 80, 2, 1);
    let q_shape = [batch, seqlen_q, heads_q, d];
    let kv_shape = [batch, seqlen_k, heads_kv, d];
    let q = Tensor::random(q_shape, Tensor::contiguous_strides(q_shape), dtype, 1);
    let k = Tensor::random(kv_shape, Tensor::contiguous_strides(kv_shape), dtype, 2);
    let v = Tensor::random(kv_shape, Tensor::contiguous_strides(kv_shape), dtype, 3);

    println!("CPU emulator (no GPU): q {q_shape:?}, k/v {kv_shape:?}, {params:?}");
    let start = Instant::now();
    // A wave of 0 CTAs: the split heuristic never splits.
    let (out, plan) = match forward(dtype, &q, &k, &v, Tensor::contiguous_strides(q_shape), &params, 0) {
        Ok(done) => done,
        Err(e) => {
            eprintln!("FAILED: {e}");
            return ExitCode::FAILURE;
        }
    };
    let elapsed = start.elapsed();
    let planned = plan.describe();
    println!("planned: {planned}");
    if planned.kernel != name {
        eprintln!("FAILED: the plan chose {} for this call, not {name}", planned.kernel);
        return ExitCode::FAILURE;
    }
    let reference = Reference::new(&q, &k, &v, dtype, &params);
    match reference.compare(&out, dtype) {
        Ok(errors) => {
            println!("emulated in {:.2} s on the CPU", elapsed.as_secs_f64());
            println!("vs f64 reference: {}", errors.describe(dtype));
            if errors.within(dtype) {
                ExitCode::SUCCESS
            } else {
                eprintln!("FAILED: error over budget");
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

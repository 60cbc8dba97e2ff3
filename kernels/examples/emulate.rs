//! Runs one small attention problem through the real kernel code on the
//! CPU emulator (no GPU involved) and compares it with an f64 reference.
//!
//! `cargo run --release --manifest-path kernels/Cargo.toml --example emulate [kernel]`

use std::process::ExitCode;
use std::time::Instant;

use flash_attn_kernels::emulated::{forward, Reference, Tensor};
use flash_attn_kernels::entry::{kernel, KERNELS};

fn main() -> ExitCode {
    let name = std::env::args().nth(1).unwrap_or_else(|| "flash_fwd_d64_f16_causal".into());
    let Some(kernel) = kernel(&name) else {
        let names: Vec<_> = KERNELS.iter().map(|k| k.kernel.name).collect();
        eprintln!("unknown kernel {name}; one of: {}", names.join(", "));
        return ExitCode::FAILURE;
    };
    let d = kernel.kernel.config.head_dim as usize;
    let (batch, seqlen_q, seqlen_k, heads_q, heads_kv) = (1, 100, 80, 2, 1);
    let q_shape = [batch, seqlen_q, heads_q, d];
    let kv_shape = [batch, seqlen_k, heads_kv, d];
    let q = Tensor::random(q_shape, Tensor::contiguous_strides(q_shape), kernel.kernel.dtype, 1);
    let k = Tensor::random(kv_shape, Tensor::contiguous_strides(kv_shape), kernel.kernel.dtype, 2);
    let v = Tensor::random(kv_shape, Tensor::contiguous_strides(kv_shape), kernel.kernel.dtype, 3);
    let scale = 1.0 / (d as f32).sqrt();

    println!("CPU emulator (no GPU): {name}, q {q_shape:?}, k/v {kv_shape:?}");
    let start = Instant::now();
    let out = match forward(kernel, &q, &k, &v, Tensor::contiguous_strides(q_shape), scale) {
        Ok(out) => out,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let elapsed = start.elapsed();
    let reference = Reference::new(
        &q,
        &k,
        &v,
        kernel.kernel.dtype,
        kernel.kernel.variant == flash_attn_abi::kernels::Variant::Causal,
        f64::from(scale),
    );
    match reference.compare(&out, kernel.kernel.dtype) {
        Ok(errors) => {
            println!("emulated in {:.2} s on the CPU", elapsed.as_secs_f64());
            println!("vs f64 reference: {}", errors.describe(kernel.kernel.dtype));
            if errors.within(kernel.kernel.dtype) {
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

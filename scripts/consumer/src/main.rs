//! A program that uses flash-attn through the cudarc door, as a user's
//! would: built outside the workspace on stable Rust with no CUDA anywhere
//! (scripts/test-consumer.sh). It must start and say whether a driver was
//! found, never fail to load.

use std::sync::Arc;

use flash_attn::cudarc::driver::{CudaSlice, CudaStream};
use flash_attn::{f16, AttentionParams, Error, FlashAttention, Problem, Tensor, TensorMut};

/// One attention call on cudarc memory (compiled, run only with a GPU).
fn attend(
    attention: &FlashAttention,
    qkv: &CudaSlice<f16>,
    o: &mut CudaSlice<f16>,
    lse: &mut CudaSlice<f32>,
    stream: &Arc<CudaStream>,
) -> flash_attn::Result<Problem> {
    let shape = [1, 128, 2, 64];
    attention.forward_into(
        Tensor::new(qkv, shape),
        Tensor::new(qkv, shape),
        Tensor::new(qkv, shape),
        TensorMut::new(o, shape),
        lse,
        &AttentionParams { causal: true, ..Default::default() },
        stream,
    )
}

fn main() {
    match FlashAttention::new() {
        Err(Error::DriverUnavailable(why)) => println!("no driver: {why}"),
        Err(e) => println!("driver, no usable GPU: {e}"),
        Ok(attention) => {
            let context = flash_attn::cudarc::driver::CudaContext::new(0).expect("context");
            let stream = context.default_stream();
            let qkv = stream.clone_htod(&vec![f16::ONE; 128 * 2 * 64]).expect("upload");
            let mut o = stream.alloc_zeros::<f16>(128 * 2 * 64).expect("o");
            let mut lse = stream.alloc_zeros::<f32>(2 * 128).expect("lse");
            let problem = attend(&attention, &qkv, &mut o, &mut lse, &stream).expect("attention");
            println!("ran on {} SMs: {problem:?}", attention.sm_count());
        }
    }
}

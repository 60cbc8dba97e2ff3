//! Forward-pass benchmark over the standard grid: batch * seqlen = 16384
//! tokens, hidden 2048 (heads = 2048 / head_dim), seqlen 512..16384, head
//! dims 64 and 128, causal and not, f16 and bf16. TFLOP/s counts
//! 4 * batch * heads * seqlen^2 * head_dim, halved for causal.
//!
//! Before the grid it times the mma.sync ceiling (`flash_attn_kernels::ceiling`:
//! register-only m16n8k16 MMAs on every SM) and reports each shape's fraction
//! of it.
//!
//! `bench [--out FILE] [--quick] [--head-dims D,D..] [--seqlens S,S..]`: prints a
//! table and writes one JSON object per shape to FILE (for
//! scripts/bench_torch.py, which adds torch's figures). Head dims other than
//! 64 and 128 use 2048 / d heads rounded down (hidden close to 2048).

use std::io::Write;

use flash_attn::cust::context::CurrentContext;
use flash_attn::cust::device::DeviceAttribute;
use flash_attn::cust::event::{Event, EventFlags};
use flash_attn::cust::function::{BlockSize, GridSize};
use flash_attn::cust::memory::DeviceBuffer;
use flash_attn::cust::module::Module;
use flash_attn::cust::stream::{Stream, StreamFlags};
use flash_attn::{bf16, f16, AttentionParams, FlashAttention, Tensor, TensorMut, PTX};
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
    let params = AttentionParams { causal: shape.causal, ..Default::default() };
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

/// TFLOP/s of the `mma_ceiling` kernel: 8 blocks of 8 warps for each SM
/// per SM, each warp `CHAINS` independent MMA chains; median of 10 runs.
fn mma_ceiling_tflops() -> Result<f64, Box<dyn std::error::Error>> {
    let module = Module::from_ptx(PTX, &[])?;
    let function = module.get_function("mma_ceiling")?;
    let sms = CurrentContext::get_device()?.get_attribute(DeviceAttribute::MultiprocessorCount)? as u32;
    let (blocks, threads, mut iterations) = (sms * 8, 256u32, 512u32);
    let out = DeviceBuffer::from_slice(&vec![0f32; (blocks * threads) as usize])?;
    let stream = Stream::new(StreamFlags::NON_BLOCKING, None)?;
    let (start, stop) = (Event::new(EventFlags::DEFAULT)?, Event::new(EventFlags::DEFAULT)?);
    let mut out_ptr = out.as_device_ptr();
    let mut times = Vec::new();
    for run in 0..12 {
        let mut threads_arg = threads;
        let args = [
            &mut iterations as *mut u32 as *mut std::ffi::c_void,
            &mut out_ptr as *mut _ as *mut std::ffi::c_void,
            &mut threads_arg as *mut u32 as *mut std::ffi::c_void,
        ];
        start.record(&stream)?;
        unsafe { stream.launch(&function, GridSize::x(blocks), BlockSize::x(threads), 0, &args)? };
        stop.record(&stream)?;
        stop.synchronize()?;
        if run >= 2 {
            times.push(stop.elapsed_time_f32(&start)? as f64);
        }
    }
    times.sort_by(|a, b| a.total_cmp(b));
    let flops =
        (blocks * threads / 32) as f64 * iterations as f64 * flash_attn_kernels::ceiling::CHAINS as f64 * 4096.0;
    Ok(flops / (times[times.len() / 2] * 1e-3) / 1e12)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let out_path = args.iter().position(|a| a == "--out").and_then(|i| args.get(i + 1)).cloned();
    let quick = args.iter().any(|a| a == "--quick");
    let list = |flag: &str| -> Option<Vec<usize>> {
        let value = args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1))?;
        Some(value.split(',').map(|v| v.parse().unwrap_or_else(|_| panic!("{flag}: not a number: {v}"))).collect())
    };
    let head_dims = list("--head-dims").unwrap_or(vec![64, 128]);
    let seqlen_list = list("--seqlens");
    let _context =
        flash_attn::cust::quick_init().map_err(|e| format!("no usable CUDA GPU ({e}): the benchmark needs one"))?;
    let attention = FlashAttention::new()?;
    let ceiling = mma_ceiling_tflops()?;
    println!("mma.sync m16n8k16 f16 ceiling (registers only, this GPU): {ceiling:.1} TFLOP/s");
    let seqlens: Vec<usize> =
        seqlen_list.unwrap_or(if quick { vec![1024, 4096] } else { vec![512, 1024, 2048, 4096, 8192, 16384] });
    let reps = if quick { 10 } else { 30 };
    let mut out = match &out_path {
        Some(p) => Some(std::fs::File::create(p)?),
        None => None,
    };
    println!("{:<6} {:>4} {:>7} {:>6} {:>10} {:>10}", "dtype", "d", "causal", "seqlen", "TFLOP/s", "ceiling");
    for dtype in ["f16", "bf16"] {
        for &head_dim in &head_dims {
            for causal in [false, true] {
                for &seqlen in &seqlens {
                    let shape = Shape { seqlen, head_dim, causal, dtype };
                    let tflops = match dtype {
                        "f16" => time_shape::<f16>(&attention, &shape, reps)?,
                        _ => time_shape::<bf16>(&attention, &shape, reps)?,
                    };
                    println!(
                        "{:<6} {:>4} {:>7} {:>6} {:>10.1} {:>9.0}%",
                        dtype,
                        head_dim,
                        causal,
                        seqlen,
                        tflops,
                        100.0 * tflops / ceiling
                    );
                    if let Some(f) = out.as_mut() {
                        writeln!(
                            f,
                            "{{\"dtype\":\"{}\",\"head_dim\":{},\"causal\":{},\"seqlen\":{},\"batch\":{},\"heads\":{},\"tflops\":{:.3},\"ceiling_tflops\":{:.3}}}",
                            shape.dtype,
                            head_dim,
                            causal,
                            seqlen,
                            16384 / seqlen,
                            2048 / head_dim,
                            tflops,
                            ceiling
                        )?;
                    }
                }
            }
        }
    }
    Ok(())
}

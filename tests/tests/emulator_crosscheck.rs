//! The CPU emulator against the GPU: the primitive probe
//! (`flash_attn_kernels::test_kernels::probe`) on identical random inputs, compared bit for
//! bit where the PTX ISA defines the result exactly, and within stated bounds
//! where it does not (`ex2`/`lg2`/`rcp.approx`, and `mma`, whose tensor-core
//! accumulation rounds differently from the emulator's exact sum); then whole
//! attention kernels, emulated and on the GPU, on identical inputs.
//! Skipped, saying why, without a GPU.

use flash_attn::cust::function::{BlockSize, GridSize};
use flash_attn::cust::memory::{CopyDestination, DeviceBuffer};
use flash_attn::cust::module::Module;
use flash_attn::cust::stream::{Stream, StreamFlags};
use flash_attn::half1::{bf16, f16};
use flash_attn::ATTENTION_KERNELS;
use flash_attn::{AttentionParams, Element, FlashAttention, Tensor};
use flash_attn_kernels::emu::{self, GlobalRegion, LaunchConfig};
use flash_attn_kernels::test_kernels::probe::{self, input, output, LANE_INPUT_WORDS, LANE_OUTPUT_WORDS};
use flash_attn_tests::emulator::{self, Tensor as HostTensor};
use flash_attn_tests::emulator::{Dtype, DtypeValues};
use flash_attn_tests::gpu;
use flash_attn_tests::seed::{drawn_seed, test_rng};
use flash_attn_tests::TEST_PTX;
use rand::Rng;

/// 16-byte aligned words, as `cp.async` needs.
#[derive(Clone, Copy, Default)]
#[repr(C, align(16))]
struct Quad([u32; 4]);

fn words(quads: &[Quad]) -> &[u32] {
    // SAFETY: Quad is four u32 with no padding.
    unsafe { std::slice::from_raw_parts(quads.as_ptr().cast(), quads.len() * 4) }
}

fn words_mut(quads: &mut [Quad]) -> &mut [u32] {
    // SAFETY: as `words`.
    unsafe { std::slice::from_raw_parts_mut(quads.as_mut_ptr().cast(), quads.len() * 4) }
}

fn lane_input(lane: usize, i: usize) -> usize {
    probe::SMEM_BYTES as usize / 4 + lane * LANE_INPUT_WORDS + i
}

fn lane_output(lane: usize, i: usize) -> usize {
    lane * LANE_OUTPUT_WORDS + i
}

/// Random probe inputs; `bf16` chooses the type the mma operands are drawn in.
fn random_probe_input(rng: &mut impl Rng, bf16_operands: bool, specials: bool) -> Vec<Quad> {
    let mut quads = vec![Quad::default(); probe::INPUT_WORDS / 4];
    let w = words_mut(&mut quads);
    for x in &mut w[..probe::SMEM_BYTES as usize / 4] {
        *x = rng.gen();
    }
    let half = |rng: &mut dyn rand::RngCore| -> u32 {
        let x: f32 = rng.gen_range(-3.0..3.0);
        if bf16_operands {
            bf16::from_f32(x).to_bits() as u32
        } else {
            f16::from_f32(x).to_bits() as u32
        }
    };
    const SPECIAL: [f32; 8] = [0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 1e-40, -126.5, 200.0];
    for lane in 0..32 {
        for i in 0..6 {
            w[lane_input(lane, input::MMA_A + i)] = half(rng) | (half(rng) << 16);
        }
        for i in 0..4 {
            w[lane_input(lane, input::MMA_C + i)] = rng.gen_range(-4.0f32..4.0).to_bits();
        }
        w[lane_input(lane, input::SHUFFLE)] = rng.gen::<u32>();
        for i in 0..4 {
            let special = specials && rng.gen_bool(0.25);
            let e = if special { SPECIAL[rng.gen_range(0..8)] } else { rng.gen_range(-60.0f32..60.0) };
            w[lane_input(lane, input::EXP2 + i)] = e.to_bits();
            let l = if special { SPECIAL[rng.gen_range(0..8)] } else { 2f32.powf(rng.gen_range(-60.0..60.0)) };
            w[lane_input(lane, input::LOG2_RECIP + i)] = l.to_bits();
        }
        for i in 0..3 {
            w[lane_input(lane, input::FMA + i)] = rng.gen_range(-100.0f32..100.0).to_bits();
        }
        for i in 0..2 {
            // Spans f16 overflow, subnormals and bf16 ties.
            let x = rng.gen_range(-1.0f32..1.0) * 2f32.powi(rng.gen_range(-30..20));
            w[lane_input(lane, input::PACK + i)] = x.to_bits();
        }
        // Sums that wrap past u32::MAX as often as not.
        w[lane_input(lane, input::ATOM)] = rng.gen();
        w[lane_input(lane, input::ATOM + 1)] = rng.gen();
    }
    quads
}

fn run_probe_gpu(module: &Module, stream: &Stream, input: &[Quad]) -> Vec<u32> {
    let input_dev = DeviceBuffer::from_slice(words(input)).expect("upload");
    let output_dev = DeviceBuffer::from_slice(&vec![0xdead_beef_u32; probe::OUTPUT_WORDS]).expect("output");
    let function = module.get_function("probe_primitives").expect("probe kernel in the test PTX");
    let mut input_ptr = input_dev.as_device_ptr();
    let mut output_ptr = output_dev.as_device_ptr();
    let args = [&mut input_ptr as *mut _ as *mut std::ffi::c_void, &mut output_ptr as *mut _ as *mut std::ffi::c_void];
    unsafe {
        stream.launch(&function, GridSize::x(1), BlockSize::x(32), probe::SMEM_BYTES, &args).expect("probe launch");
    }
    stream.synchronize().expect("probe run");
    output_dev.as_host_vec().expect("download")
}

fn run_probe_emulated(input: &[Quad]) -> Vec<u32> {
    let mut output = vec![Quad([0xdead_beef; 4]); probe::OUTPUT_WORDS / 4];
    let input_words = words(input);
    let output_words = words_mut(&mut output);
    let (input_ptr, output_ptr) = (input_words.as_ptr(), output_words.as_mut_ptr());
    let regions = [GlobalRegion::read_only("input", input_words), GlobalRegion::writable("output", output_words)];
    let config = LaunchConfig::new([1, 1, 1], 32, probe::SMEM_BYTES);
    // SAFETY: the regions are the buffers behind the two pointers.
    unsafe { emu::launch(&config, &regions, || probe::probe_primitives(input_ptr, output_ptr)) }
        .expect("emulated probe");
    words(&output).to_vec()
}

/// Distance in units in the last place between two finite f32 of one sign.
fn ulps(a: f32, b: f32) -> u32 {
    if a == b {
        return 0;
    }
    if a.is_nan() || b.is_nan() || a.is_sign_negative() != b.is_sign_negative() {
        return u32::MAX;
    }
    a.to_bits().abs_diff(b.to_bits())
}

/// The operands of one m16n8k16: `a[16][16]`, `b[16][8]` (k x n), `c[16][8]`.
struct MmaOperands {
    a: [[f64; 16]; 16],
    b: [[f64; 8]; 16],
    c: [[f64; 8]; 16],
}

/// The mma operands reassembled from the lanes' fragments by the PTX ISA tables.
fn mma_operands(w: &[u32], to_f64: fn(u16) -> f64) -> MmaOperands {
    let (mut a, mut b, mut c) = ([[0.0; 16]; 16], [[0.0; 8]; 16], [[0.0; 8]; 16]);
    for lane in 0..32 {
        let (g, t) = (lane / 4, lane % 4);
        let word = |i: usize| w[lane_input(lane, i)];
        let pair = |x: u32| (to_f64(x as u16), to_f64((x >> 16) as u16));
        for (i, (row, col)) in [(g, 2 * t), (g + 8, 2 * t), (g, 2 * t + 8), (g + 8, 2 * t + 8)].into_iter().enumerate()
        {
            (a[row][col], a[row][col + 1]) = pair(word(input::MMA_A + i));
        }
        for (i, k) in [2 * t, 2 * t + 8].into_iter().enumerate() {
            (b[k][g], b[k + 1][g]) = pair(word(input::MMA_B + i));
        }
        for (i, (row, col)) in [(g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1)].into_iter().enumerate()
        {
            c[row][col] = f32::from_bits(word(input::MMA_C + i)) as f64;
        }
    }
    MmaOperands { a, b, c }
}

/// Largest difference of the GPU's and the emulator's mma result, relative to
/// `|c| + sum |a b|` of its element, over the whole tile; and the count of
/// bit-identical elements.
fn mma_difference(w: &[u32], gpu: &[u32], emulated: &[u32], at: usize, to_f64: fn(u16) -> f64) -> (f64, usize) {
    let MmaOperands { a, b, c } = mma_operands(w, to_f64);
    let (mut worst, mut identical) = (0f64, 0);
    for lane in 0..32 {
        let (g, t) = (lane / 4, lane % 4);
        for (i, (row, col)) in [(g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1)].into_iter().enumerate()
        {
            let (x, y) = (gpu[lane_output(lane, at + i)], emulated[lane_output(lane, at + i)]);
            if x == y {
                identical += 1;
                continue;
            }
            let scale = c[row][col].abs() + (0..16).map(|k| (a[row][k] * b[k][col]).abs()).sum::<f64>();
            let diff = (f32::from_bits(x) as f64 - f32::from_bits(y) as f64).abs();
            worst = worst.max(if scale > 0.0 { diff / scale } else { f64::INFINITY });
        }
    }
    (worst, identical)
}

/// The bound on the mma difference stated in the emulator's float.rs: the
/// tensor cores align the products to the largest and truncate.
const MMA_BOUND: f64 = 1.0 / (1u64 << 19) as f64;

#[test]
fn primitives_match_the_gpu() {
    let Some((_context, _attention)) = gpu("primitives_match_the_gpu") else { return };
    let module = Module::from_ptx(TEST_PTX, &[]).expect("module");
    let stream = Stream::new(StreamFlags::NON_BLOCKING, None).expect("stream");
    let mut rng = test_rng("primitives_match_the_gpu");
    let rounds = 200;
    let (mut exact_mismatch, mut mma_f16, mut mma_bf16) = (Vec::new(), (0f64, 0usize), (0f64, 0usize));
    let (mut ex2_ulps, mut rcp_ulps, mut lg2_err) = (0u32, 0u32, 0f64);
    let (mut ex2_exact, mut rcp_exact, mut lg2_exact, mut approx_total) = (0, 0, 0, 0);
    for round in 0..rounds {
        let bf16_operands = round % 2 == 1;
        let input = random_probe_input(&mut rng, bf16_operands, round % 4 == 3);
        let (gpu_out, emu_out) = (run_probe_gpu(&module, &stream, &input), run_probe_emulated(&input));
        let w = words(&input);
        for lane in 0..32 {
            let exact_fields = (output::LDMATRIX..output::LDMATRIX + 8)
                .chain(output::SHUFFLE..output::SHUFFLE + 5)
                .chain([output::FMA, output::PACK_F16, output::PACK_BF16, output::LD_SHARED, output::VOTE_ANY])
                .chain([output::ATOM_OLD, output::ATOM_SUM]);
            for i in exact_fields {
                let (g, e) = (gpu_out[lane_output(lane, i)], emu_out[lane_output(lane, i)]);
                let both_nan = f32::from_bits(g).is_nan() && f32::from_bits(e).is_nan() && i == output::FMA;
                if g != e && !both_nan {
                    exact_mismatch
                        .push(format!("round {round} lane {lane} output word {i}: gpu {g:#010x}, emulator {e:#010x}"));
                }
            }
            for j in 0..4 {
                approx_total += 1;
                let value = |out: &[u32], field: usize| f32::from_bits(out[lane_output(lane, field + j)]);
                let (g, e) = (value(&gpu_out, output::EXP2), value(&emu_out, output::EXP2));
                ex2_exact += (g.to_bits() == e.to_bits()) as usize;
                ex2_ulps = ex2_ulps.max(if g.is_nan() && e.is_nan() { 0 } else { ulps(g, e) });
                let (g, e) = (value(&gpu_out, output::RECIP), value(&emu_out, output::RECIP));
                rcp_exact += (g.to_bits() == e.to_bits()) as usize;
                rcp_ulps = rcp_ulps.max(if g.is_nan() && e.is_nan() { 0 } else { ulps(g, e) });
                let (g, e) = (value(&gpu_out, output::LOG2), value(&emu_out, output::LOG2));
                lg2_exact += (g.to_bits() == e.to_bits()) as usize;
                let err = if g.to_bits() == e.to_bits() || (g.is_nan() && e.is_nan()) {
                    0.0
                } else if g.is_finite() && e.is_finite() {
                    (g as f64 - e as f64).abs() / (e as f64).abs().max(1.0)
                } else {
                    f64::INFINITY
                };
                lg2_err = lg2_err.max(err);
            }
        }
        let f16_value = |x: u16| f16::from_bits(x).to_f64();
        let bf16_value = |x: u16| bf16::from_bits(x).to_f64();
        let (worst, identical) = mma_difference(w, &gpu_out, &emu_out, output::MMA_F16, f16_value);
        if !bf16_operands {
            mma_f16 = (mma_f16.0.max(worst), mma_f16.1 + identical);
        }
        let (worst, identical) = mma_difference(w, &gpu_out, &emu_out, output::MMA_BF16, bf16_value);
        if bf16_operands {
            mma_bf16 = (mma_bf16.0.max(worst), mma_bf16.1 + identical);
        }
    }
    let tile = 128 * rounds / 2;
    println!("primitives_match_the_gpu: {rounds} rounds x 32 lanes");
    println!("  ldmatrix x4 / x4.trans, shfl.bfly, fma.rn, cvt.rn f16x2 / bf16x2: {} mismatches", exact_mismatch.len());
    println!(
        "  mma f16: {}/{tile} elements bit-identical, worst difference {:.2e} of |c| + sum|ab| (bound {MMA_BOUND:.2e})",
        mma_f16.1, mma_f16.0
    );
    println!(
        "  mma bf16: {}/{tile} elements bit-identical, worst difference {:.2e} of |c| + sum|ab| (bound {MMA_BOUND:.2e})",
        mma_bf16.1, mma_bf16.0
    );
    println!("  ex2.approx: {ex2_exact}/{approx_total} bit-identical, worst {ex2_ulps} ulp (bound 2)");
    println!("  rcp.approx: {rcp_exact}/{approx_total} bit-identical, worst {rcp_ulps} ulp (bound 1)");
    println!(
        "  lg2.approx: {lg2_exact}/{approx_total} bit-identical, worst error {lg2_err:.2e} (bound 2^-22 = 2.4e-7)"
    );
    assert!(
        exact_mismatch.is_empty(),
        "exactly defined results differ:\n{}",
        exact_mismatch[..10.min(exact_mismatch.len())].join("\n")
    );
    assert!(mma_f16.0 <= MMA_BOUND && mma_bf16.0 <= MMA_BOUND, "mma differs past the stated bound");
    assert!(ex2_ulps <= 2, "ex2.approx differs by {ex2_ulps} ulp");
    assert!(rcp_ulps <= 1, "rcp.approx differs by {rcp_ulps} ulp");
    assert!(lg2_err <= 2f64.powi(-22), "lg2.approx differs by {lg2_err:.2e}");
}

fn gpu_forward<T: Element + flash_attn::cust::memory::DeviceCopy>(
    attention: &FlashAttention,
    to: fn(u16) -> T,
    from: fn(T) -> u16,
    q: &HostTensor,
    k: &HostTensor,
    v: &HostTensor,
    params: &AttentionParams,
) -> (Vec<u16>, Vec<f32>) {
    let upload =
        |t: &HostTensor| DeviceBuffer::from_slice(&t.data().iter().map(|&b| to(b)).collect::<Vec<T>>()).unwrap();
    let (qd, kd, vd) = (upload(q), upload(k), upload(v));
    let stream = Stream::new(StreamFlags::NON_BLOCKING, None).unwrap();
    let out = attention
        .forward(Tensor::new(&qd, q.shape), Tensor::new(&kd, k.shape), Tensor::new(&vd, v.shape), params, &stream)
        .expect("forward");
    stream.synchronize().unwrap();
    let mut o = vec![to(0); out.o.len()];
    out.o.copy_to(&mut o[..]).unwrap();
    (o.into_iter().map(from).collect(), out.lse.as_host_vec().unwrap())
}

#[test]
fn attention_kernels_match_the_gpu() {
    let Some((_context, attention)) = gpu("attention_kernels_match_the_gpu") else { return };
    let mut seed = drawn_seed("attention_kernels_match_the_gpu");
    for name in
        ["flash_fwd_d64_f16_causal", "flash_fwd_d64_bf16_full", "flash_fwd_d128_f16_full", "flash_fwd_d128_bf16_causal"]
    {
        for (seqlen_q, seqlen_k) in [(100, 133), (133, 65)] {
            let kernel = ATTENTION_KERNELS.iter().find(|k| k.name == name).expect("kernel");
            let (d, dtype) = (kernel.head_dim as usize, kernel.dtype);
            let causal = kernel.variant == flash_attn_abi::kernels::Variant::Causal;
            let (q_shape, kv_shape) = ([2, seqlen_q, 4, d], [2, seqlen_k, 2, d]);
            let mut tensor = |shape| {
                seed = seed.wrapping_add(1);
                HostTensor::random(shape, HostTensor::contiguous_strides(shape), dtype, seed)
            };
            let (q, k, v) = (tensor(q_shape), tensor(kv_shape), tensor(kv_shape));
            // Unsplit, as on the GPU below: both plans run the dense kernel.
            let params = AttentionParams { causal, num_splits: Some(1), ..Default::default() };
            let strides = HostTensor::contiguous_strides(q_shape);
            let (emulated, plan) = emulator::forward(dtype, &q, &k, &v, strides, &params, 0)
                .unwrap_or_else(|e| panic!("{name}: emulator: {e}"));
            assert_eq!(plan.kernel().name(), name, "the emulator's plan");
            let (gpu_o, gpu_lse) = match dtype {
                Dtype::F16 => gpu_forward(&attention, f16::from_bits, |x: f16| x.to_bits(), &q, &k, &v, &params),
                Dtype::Bf16 => gpu_forward(&attention, bf16::from_bits, |x: bf16| x.to_bits(), &q, &k, &v, &params),
            };
            let emu_o = emulated.o.data();
            let identical = gpu_o.iter().zip(emu_o).filter(|(a, b)| a == b).count();
            let (gpu_f, emu_f): (Vec<f64>, Vec<f64>) =
                gpu_o.iter().zip(emu_o).map(|(&a, &b)| (dtype.to_f64(a), dtype.to_f64(b))).unzip();
            let diff: f64 = gpu_f.iter().zip(&emu_f).map(|(a, b)| (a - b).powi(2)).sum::<f64>().sqrt();
            let norm: f64 = emu_f.iter().map(|b| b * b).sum::<f64>().sqrt();
            let lse_diff = gpu_lse
                .iter()
                .zip(&emulated.lse)
                .map(|(a, b)| if a == b { 0.0 } else { (a - b).abs() as f64 })
                .fold(0.0, f64::max);
            // Within rounding: below the unit roundoff of the output type.
            let unit_roundoff = match dtype {
                Dtype::F16 => 2f64.powi(-11),
                Dtype::Bf16 => 2f64.powi(-8),
            };
            println!(
                "attention_kernels_match_the_gpu: {name} sq={seqlen_q} sk={seqlen_k}: O {identical}/{} bit-identical, \
                 relative L2 difference {:.2e} (unit roundoff {unit_roundoff:.1e}), LSE max difference {lse_diff:.2e}",
                gpu_o.len(),
                diff / norm
            );
            assert!(diff / norm < unit_roundoff, "{name}: emulator and GPU O differ by {:.2e}", diff / norm);
            assert!(lse_diff < 1e-5, "{name}: emulator and GPU LSE differ by {lse_diff:.2e}");
        }
    }
}

//! The sm_90a primitives, emulated and on an H100 or H200: the probe
//! (`flash_attn_kernels::test_kernels::probe_sm90`: mbarrier phases, named barriers,
//! `setmaxnreg`, TMA loads with the 128-byte swizzle and zero fill,
//! `fence.proxy.async`, wgmma SS and RS, K-major and MN-major B) on
//! identical inputs. The GPU's tensor maps come from the driver's
//! `cuTensorMapEncodeTiled`, the emulator's from our encoding of the same
//! parameters. Everything but the wgmma products must be bit-identical;
//! the products too on inputs whose sums are exact, and within the
//! tensor cores' rounding bound otherwise. Skipped, saying why, without a
//! GPU of compute capability 9.0.

use flash_attn_tests::seed::test_rng;
use std::ffi::c_void;

use flash_attn::cust::context::CurrentContext;
use flash_attn::cust::device::DeviceAttribute;
use flash_attn::cust::function::{BlockSize, GridSize};
use flash_attn::cust::memory::{DeviceBuffer, DeviceCopy};
use flash_attn::cust::module::Module;
use flash_attn::cust::stream::{Stream, StreamFlags};
use flash_attn::cust::sys::{cuFuncSetAttribute, cudaError_enum, CUfunction_attribute};
use flash_attn::pipeline::encode_tensor_map;
use flash_attn::{bf16, f16};
use flash_attn_abi::sm90::{TensorMap, TensorMapParams};
use flash_attn_kernels::test_kernels::probe_sm90::{self, host::Chunk, host::Inputs, output};
use flash_attn_tests::{gpu, skipped, TEST_PTX_SM90A};
use rand::Rng;

/// The driver's tensor map of `p`: the host crate's own encoding call,
/// the one its sm_90a launches make.
fn driver_tensor_map(p: &TensorMapParams) -> TensorMap {
    encode_tensor_map(p).unwrap_or_else(|e| panic!("cuTensorMapEncodeTiled({p:?}): {e}"))
}

#[derive(Clone, Copy)]
#[repr(transparent)]
struct Bytes16(Chunk);
// SAFETY: plain data.
unsafe impl DeviceCopy for Bytes16 {}
#[derive(Clone, Copy)]
#[repr(transparent)]
struct Map(TensorMap);
// SAFETY: plain data.
unsafe impl DeviceCopy for Map {}

fn upload(chunks: &[Chunk]) -> DeviceBuffer<Bytes16> {
    let values: Vec<Bytes16> = chunks.iter().map(|&c| Bytes16(c)).collect();
    DeviceBuffer::from_slice(&values).expect("upload")
}

fn run_probe_gpu(module: &Module, stream: &Stream, inputs: &Inputs) -> Vec<u32> {
    let [a, b, v] = [&inputs.a, &inputs.b, &inputs.v].map(|m| upload(m));
    let addresses = [&a, &b, &v].map(|m| m.as_device_ptr().as_raw());
    let maps: Vec<Map> = inputs.map_params(addresses).iter().map(|p| Map(driver_tensor_map(p))).collect();
    // Device allocations are 256-byte aligned: the maps' 64 bytes hold.
    let maps_dev = DeviceBuffer::from_slice(&maps).expect("tensor maps");
    let input_dev = DeviceBuffer::from_slice(&inputs.a_words()).expect("input");
    let output_dev = DeviceBuffer::from_slice(&vec![0xdead_beef_u32; output::WORDS]).expect("output");
    let function = module.get_function("probe_sm90").expect("probe_sm90 in the sm_90a test PTX");
    let (mut maps_ptr, mut input_ptr, mut output_ptr, mut bf16) =
        (maps_dev.as_device_ptr(), input_dev.as_device_ptr(), output_dev.as_device_ptr(), inputs.bf16 as u32);
    let args = [
        &mut maps_ptr as *mut _ as *mut c_void,
        &mut input_ptr as *mut _ as *mut c_void,
        &mut output_ptr as *mut _ as *mut c_void,
        &mut bf16 as *mut _ as *mut c_void,
    ];
    // More than the default 48 KiB of dynamic shared memory.
    let status = unsafe {
        cuFuncSetAttribute(
            function.to_raw(),
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            probe_sm90::SMEM_BYTES as i32,
        )
    };
    assert_eq!(status, cudaError_enum::CUDA_SUCCESS, "cuFuncSetAttribute");
    unsafe {
        stream
            .launch(&function, GridSize::x(1), BlockSize::x(probe_sm90::THREADS), probe_sm90::SMEM_BYTES, &args)
            .expect("probe_sm90 launch");
    }
    stream.synchronize().expect("probe_sm90 run");
    output_dev.as_host_vec().expect("download")
}

/// Random 16-bit values of the type: `exact` draws multiples of 1/8 in
/// [-1, 1], whose 64-term dot products every order of summation gets
/// exactly; otherwise uniform in [-2, 2].
fn random_matrix(rng: &mut impl Rng, (rows, cols): (u32, u32), bf16_values: bool, exact: bool) -> Vec<u16> {
    (0..rows * cols)
        .map(|_| {
            let x: f32 = if exact { rng.gen_range(-8i32..=8) as f32 / 8.0 } else { rng.gen_range(-2.0..2.0) };
            if bf16_values {
                bf16::from_f32(x).to_bits()
            } else {
                f16::from_f32(x).to_bits()
            }
        })
        .collect()
}

/// Words of the output that must match bit for bit whatever the inputs.
fn exact_words() -> impl Iterator<Item = usize> {
    (output::A_TILE..output::PHASES + probe_sm90::PHASE_STEPS).chain(output::FLAG..output::WORDS)
}

#[test]
fn sm90_primitives_match_the_gpu() {
    let test = "sm90_primitives_match_the_gpu";
    let Some((_context, _attention)) = gpu(test) else { return };
    let device = CurrentContext::get_device().expect("device");
    let major = device.get_attribute(DeviceAttribute::ComputeCapabilityMajor).expect("major");
    let minor = device.get_attribute(DeviceAttribute::ComputeCapabilityMinor).expect("minor");
    if (major, minor) != (9, 0) {
        skipped(test, &format!("compute capability {major}.{minor}; the sm_90a probe runs on 9.0 (H100, H200)"));
        return;
    }
    let module = Module::from_ptx(TEST_PTX_SM90A, &[]).expect("sm_90a module");
    let stream = Stream::new(StreamFlags::NON_BLOCKING, None).expect("stream");
    let mut rng = test_rng("sm90_primitives_match_the_gpu");
    let rounds = 20;
    let (mut worst, mut identical, mut total) = (0f64, 0usize, 0usize);
    for round in 0..rounds {
        let (bf16_values, exact) = (round % 2 == 1, round < 4);
        let k = probe_sm90::K;
        let [a, b, v] = [(probe_sm90::A_ROWS, k), (probe_sm90::B_ROWS, k), (probe_sm90::V_ROWS, probe_sm90::V_COLS)]
            .map(|shape| random_matrix(&mut rng, shape, bf16_values, exact));
        let inputs = Inputs::new(&a, &b, &v, bf16_values);
        let gpu_out = run_probe_gpu(&module, &stream, &inputs);
        let emu_out = inputs.run_emulated().expect("emulated sm_90a probe");
        for w in exact_words() {
            assert_eq!(gpu_out[w], emu_out[w], "round {round}: word {w} (see probe_sm90::output)");
        }
        // The products: D1 (128 registers per thread), D2 (64), D3 (64).
        let value = |x: u16| if bf16_values { bf16::from_bits(x).to_f64() } else { f16::from_bits(x).to_f64() };
        let k = probe_sm90::K as usize;
        for (at, regs) in [(output::D1, 128), (output::D2, 64), (output::D3, 64)] {
            for t in 0..128 {
                for i in 0..regs {
                    let (g, e) = (gpu_out[at + regs * t + i], emu_out[at + regs * t + i]);
                    total += 1;
                    if g == e {
                        identical += 1;
                        continue;
                    }
                    assert!(
                        !exact,
                        "round {round}: exact inputs, D word {} differs: {g:#x} vs {e:#x}",
                        at + regs * t + i
                    );
                    let (warp, lane) = (t / 32, t % 32);
                    let (row, col) = (16 * warp + lane / 4 + 8 * (i / 2 % 2), 8 * (i / 4) + 2 * (lane % 4) + i % 2);
                    // sum |a b| over K of this element (B rows past B_ROWS, V
                    // rows before 0 are zero-filled).
                    let scale: f64 = (0..k)
                        .map(|kk| {
                            let other = match at {
                                x if x == output::D2 => {
                                    let r = kk as i64 + i64::from(probe_sm90::V_FIRST_ROW);
                                    if r < 0 {
                                        0.0
                                    } else {
                                        value(v[r as usize * probe_sm90::V_COLS as usize + col])
                                    }
                                }
                                _ if col < probe_sm90::B_ROWS as usize => value(b[col * k + kk]),
                                _ => 0.0,
                            };
                            (value(a[row * k + kk]) * other).abs()
                        })
                        .sum();
                    let diff = (f32::from_bits(g) as f64 - f32::from_bits(e) as f64).abs();
                    worst = worst.max(if scale > 0.0 { diff / scale } else { f64::INFINITY });
                }
            }
        }
    }
    println!("wgmma: {identical}/{total} accumulator words bit-identical, worst difference {worst:.3e} of sum|ab|");
    // Four chained k16 wgmmas, each within 2^-19 of its |c| + sum|ab| (the
    // bound mma.sync meets; emulator.md).
    assert!(worst <= 4.0 / (1u64 << 19) as f64, "wgmma differs from the emulator by {worst:.3e} of sum|ab|");
}

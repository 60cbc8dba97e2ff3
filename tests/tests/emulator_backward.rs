//! The backward kernels' own code on the CPU emulator, against the f64
//! reference gradients (`flash_attn::reference::attention_backward`, itself
//! checked against finite differences): the three launches of one backward
//! call (prepare, the main kernel of the head dim, finish dQ) on one
//! argument block built here, with O and the LSE from the f64 reference
//! forward, outputs poisoned (NaN) beforehand. Shapes end inside a query
//! step and a key block; GQA, causal with more keys than queries, windows,
//! softcap and ALiBi, and packed sequences.

use flash_attn::reference::{attention_backward, attention_with_alibi, relative_l2_error, ReferenceProblem};
use flash_attn_abi::backward::{
    backward_config_of, row_grid, BackwardParams, BACKWARD_KERNELS as BACKWARD_TABLE, ROW_KERNEL_THREADS,
};
use flash_attn_abi::params::{ForwardParams, ForwardSizes, TensorArg};
use flash_attn_kernels::emu::{self, GlobalRegion, LaunchConfig};
use flash_attn_kernels::entry;
use flash_attn_tests::emulator::{Dtype, DtypeValues, Tensor, POISON};

/// One backward problem: the reference's sizes and options, and ALiBi
/// slopes (`[batch, heads_q]`) if any.
struct Problem {
    reference: ReferenceProblem,
    slopes: Option<Vec<f64>>,
}

/// What the kernels wrote, as f64, densely packed like the reference's.
struct Gradients {
    d_q: Vec<f64>,
    d_k: Vec<f64>,
    d_v: Vec<f64>,
}

/// The largest relative L2 error of each gradient allowed against the f64
/// reference: P and dS are rounded to the element type before the products
/// that use them, as in every FlashAttention backward.
fn tolerance(dtype: Dtype) -> f64 {
    match dtype {
        Dtype::F16 => 2e-3,
        Dtype::Bf16 => 1.6e-2,
    }
}

/// Runs the backward of `problem` in `dtype` on the emulator from fresh
/// random q, k, v and dO (seed `seed`), and returns the gradients with the
/// reference's.
fn run(problem: &Problem, dtype: Dtype, seed: u64) -> (Gradients, Gradients) {
    let p = &problem.reference;
    let d = p.head_dim;
    let q_shape = [p.batch, p.seqlen_q, p.heads_q, d];
    let kv_shape = [p.batch, p.seqlen_k, p.heads_kv, d];
    let contiguous = Tensor::contiguous_strides;
    let q = Tensor::random(q_shape, contiguous(q_shape), dtype, seed);
    let k = Tensor::random(kv_shape, contiguous(kv_shape), dtype, seed + 1);
    let v = Tensor::random(kv_shape, contiguous(kv_shape), dtype, seed + 2);
    let d_o = Tensor::random(q_shape, contiguous(q_shape), dtype, seed + 3);
    let (q64, k64, v64, d_o64) = (q.to_f64(dtype), k.to_f64(dtype), v.to_f64(dtype), d_o.to_f64(dtype));
    let slopes = problem.slopes.as_deref();
    let forward = attention_with_alibi(p, slopes, &q64, &k64, &v64);
    let expected = attention_backward(p, slopes, &q64, &k64, &v64, &d_o64);

    // The forward's outputs as a forward call would have left them.
    let mut o = Tensor::filled(q_shape, contiguous(q_shape), 0);
    for (i, &x) in o.indices().collect::<Vec<_>>().into_iter().zip(&forward.o) {
        o.data_mut()[i] = dtype.bits_of(x);
    }
    let lse: Vec<f32> = forward.lse.iter().map(|&x| x as f32).collect();
    let slopes32: Option<Vec<f32>> = problem.slopes.as_ref().map(|s| s.iter().map(|&x| x as f32).collect());

    let mut d_q = Tensor::filled(q_shape, contiguous(q_shape), POISON);
    let mut d_k = Tensor::filled(kv_shape, contiguous(kv_shape), POISON);
    let mut d_v = Tensor::filled(kv_shape, contiguous(kv_shape), POISON);
    let mut delta = vec![f32::NAN; lse.len()];
    let mut d_q_accum = vec![f32::NAN; lse.len() * d];

    let arg = |t: &Tensor| TensorArg {
        ptr: t.data().as_ptr(),
        strides: [t.strides[0] as i64, t.strides[1] as i64, t.strides[2] as i64],
    };
    let arg_mut = |t: &mut Tensor| TensorArg {
        ptr: t.data_mut().as_mut_ptr(),
        strides: [t.strides[0] as i64, t.strides[1] as i64, t.strides[2] as i64],
    };
    let sizes = ForwardSizes {
        batch: p.batch as u32,
        seqlen_q: p.seqlen_q as u32,
        seqlen_k: p.seqlen_k as u32,
        heads_q: p.heads_q as u32,
        heads_per_kv: (p.heads_q / p.heads_kv) as u32,
    };
    let o_arg = TensorArg { ptr: o.data().as_ptr() as *mut u16, strides: arg(&o).strides };
    let mut forward_params =
        ForwardParams::new(arg(&q), arg(&k), arg(&v), o_arg, lse.as_ptr() as *mut f32, sizes, p.softmax_scale as f32);
    let (left, right) = (p.window.0.map_or(-1, |w| w as i32), p.window.1.map_or(-1, |w| w as i32));
    (forward_params.window_left, forward_params.window_right) = (left, if p.causal { 0 } else { right });
    if let Some(c) = p.softcap {
        forward_params.set_softcap(c as f32, p.softmax_scale as f32);
    }
    if let Some(s) = &slopes32 {
        forward_params.alibi_slopes = s.as_ptr();
        forward_params.alibi_batch_stride = p.heads_q as i64;
    }
    let (d_q_arg, d_k_arg, d_v_arg) = (arg_mut(&mut d_q), arg_mut(&mut d_k), arg_mut(&mut d_v));
    let params = BackwardParams {
        forward: forward_params,
        d_o: d_o.data().as_ptr(),
        d_o_batch_stride: arg(&d_o).strides[0],
        d_o_row_stride: arg(&d_o).strides[1],
        d_o_head_stride: arg(&d_o).strides[2],
        d_q: d_q_arg.ptr,
        d_q_batch_stride: d_q_arg.strides[0],
        d_q_row_stride: d_q_arg.strides[1],
        d_q_head_stride: d_q_arg.strides[2],
        d_k: d_k_arg.ptr,
        d_k_batch_stride: d_k_arg.strides[0],
        d_k_row_stride: d_k_arg.strides[1],
        d_k_head_stride: d_k_arg.strides[2],
        d_v: d_v_arg.ptr,
        d_v_batch_stride: d_v_arg.strides[0],
        d_v_row_stride: d_v_arg.strides[1],
        d_v_head_stride: d_v_arg.strides[2],
        delta: delta.as_mut_ptr(),
        d_q_accum: d_q_accum.as_mut_ptr(),
        softmax_scale: p.softmax_scale as f32,
        head_dim: d as u32,
    };

    let read = |name, t: &Tensor| GlobalRegion::read_only(name, t.data());
    let mut regions = vec![read("q", &q), read("k", &k), read("v", &v), read("o", &o), read("d_o", &d_o)];
    regions.push(GlobalRegion::read_only("lse", &lse));
    if let Some(s) = &slopes32 {
        regions.push(GlobalRegion::read_only("alibi_slopes", s));
    }
    regions.push(GlobalRegion::writable("d_q", d_q.data_mut()));
    regions.push(GlobalRegion::writable("d_k", d_k.data_mut()));
    regions.push(GlobalRegion::writable("d_v", d_v.data_mut()));
    regions.push(GlobalRegion::writable("delta", &mut delta));
    regions.push(GlobalRegion::writable("d_q_accum", &mut d_q_accum));

    let main = BACKWARD_TABLE
        .iter()
        .find(|kernel| kernel.head_dim as usize == d && kernel.dtype == dtype)
        .expect("a backward kernel of this head dim");
    let host_main = entry::backward_kernel(main.name).expect("the emulator has every table row");
    let config = backward_config_of(d as u32);
    let rows = LaunchConfig::new(row_grid(sizes.seqlen_q, sizes.heads_q, sizes.batch), ROW_KERNEL_THREADS, 0);
    let heads_kv = p.heads_kv as u32;
    let keys =
        LaunchConfig::new(config.grid(sizes.seqlen_k, heads_kv, sizes.batch), config.threads(), config.smem_bytes());
    type RowKernel = unsafe fn(&BackwardParams);
    let (prepare, finish): (RowKernel, RowKernel) = match dtype {
        Dtype::F16 => (entry::flash_bwd_prepare_f16, entry::flash_bwd_finish_dq_f16),
        Dtype::Bf16 => (entry::flash_bwd_prepare_bf16, entry::flash_bwd_finish_dq_bf16),
    };
    // SAFETY: every address in `params` lies in `regions`, which outlive the launches.
    unsafe {
        emu::launch(&rows, &regions, || prepare(&params)).unwrap_or_else(|e| panic!("prepare: {e}"));
        emu::launch(&keys, &regions, || (host_main.run)(&params)).unwrap_or_else(|e| panic!("{}: {e}", main.name));
        emu::launch(&rows, &regions, || finish(&params)).unwrap_or_else(|e| panic!("finish: {e}"));
    }
    drop(regions);
    let actual = Gradients { d_q: d_q.to_f64(dtype), d_k: d_k.to_f64(dtype), d_v: d_v.to_f64(dtype) };
    (actual, Gradients { d_q: expected.dq, d_k: expected.dk, d_v: expected.dv })
}

/// Runs `problem` in both element types and checks each gradient.
fn check(what: &str, problem: &Problem, seed: u64) {
    for dtype in [Dtype::F16, Dtype::Bf16] {
        let (actual, expected) = run(problem, dtype, seed);
        for (name, a, e) in
            [("dQ", &actual.d_q, &expected.d_q), ("dK", &actual.d_k, &expected.d_k), ("dV", &actual.d_v, &expected.d_v)]
        {
            assert!(a.iter().all(|x| x.is_finite()), "{what} {dtype:?}: {name} has NaN or inf (not written?)");
            let error = relative_l2_error(a, e);
            println!("{what} {dtype:?}: {name} relative L2 error {error:.2e}");
            assert!(error < tolerance(dtype), "{what} {dtype:?}: {name} relative L2 error {error:.3e}");
        }
    }
}

fn dense(batch: usize, seqlen_q: usize, seqlen_k: usize, heads: (usize, usize), d: usize, causal: bool) -> Problem {
    let scale = 1.0 / (d as f64).sqrt();
    Problem {
        reference: ReferenceProblem::dense(batch, seqlen_q, seqlen_k, heads.0, heads.1, d, causal, scale),
        slopes: None,
    }
}

#[test]
fn every_head_dim_matches_the_reference() {
    for (i, kernel) in BACKWARD_TABLE.iter().filter(|k| k.dtype == Dtype::F16).enumerate() {
        let d = kernel.head_dim as usize;
        check(&format!("d={d}"), &dense(1, 80, 100, (2, 1), d, false), 10 + i as u64);
    }
}

#[test]
fn causal_bottom_right_with_rows_that_see_no_key() {
    // More keys than queries (the diagonal starts 70 keys in), two query
    // steps and four key blocks; then more queries than keys, where the
    // first 50 rows see no key and every gradient they would give is 0.
    check("causal sq < sk", &dense(2, 130, 200, (2, 2), 64, true), 20);
    check("causal sq > sk", &dense(1, 150, 100, (2, 1), 128, true), 21);
}

#[test]
fn grouped_query_heads_sum_into_their_key_value_head() {
    check("GQA 4/2", &dense(1, 70, 90, (4, 2), 64, false), 30);
    check("MQA 3/1", &dense(2, 40, 130, (3, 1), 96, true), 31);
    // dQ in passes, gradient columns interleaved over a head dim of 28 chunks.
    check("GQA 2/1 d=224", &dense(1, 70, 90, (2, 1), 224, true), 32);
}

#[test]
fn windows_softcap_and_alibi() {
    let mut window = dense(1, 140, 170, (2, 1), 64, false);
    window.reference.window = (Some(40), Some(7));
    check("window (40, 7)", &window, 40);
    let mut left = dense(1, 100, 100, (2, 1), 128, true);
    left.reference.window = (Some(20), None);
    check("causal, left window 20", &left, 41);
    let mut softcap = dense(1, 90, 130, (2, 1), 64, true);
    softcap.reference.softcap = Some(5.0);
    check("softcap 5", &softcap, 42);
    let mut alibi = dense(2, 90, 110, (2, 1), 64, false);
    alibi.slopes = Some(vec![0.5, 0.125, 0.25, 0.0625]);
    alibi.reference.softcap = Some(20.0);
    check("ALiBi and softcap 20", &alibi, 43);
}

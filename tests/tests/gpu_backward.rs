//! The backward kernels on the GPU, against the f64 CPU reference
//! gradients (`flash_attn::reference::attention_backward`): every head dim
//! of the backward table, ragged query and key counts, GQA and MQA,
//! contiguous, padded and heads-major layouts, causal with more keys than
//! queries and the reverse, windows, softcap and ALiBi, the deterministic
//! mode; longer rows at d = 64 and 128, and at d = 128 one sequence of
//! 2048. O and the LSE come
//! from our forward on the same inputs, as in a training step; dQ, dK and
//! dV start as NaN. dK and dV (no atomics) must be bit-identical over two
//! runs, and dQ too in the deterministic mode; the allocating `backward`
//! gives the same dK and dV. The sm_90a main kernels run the same cases
//! (those they take) on compute capability 9.0; packed sequences
//! (`backward_varlen_into`) run at every head dim. Skipped, saying why,
//! without a GPU.

use flash_attn::cust::memory::DeviceBuffer;
use flash_attn::cust::stream::{Stream, StreamFlags};
use flash_attn::pipeline::{
    plan_backward_for, validate, validate_backward, BackwardPlan, BackwardTensors, KernelFamily,
};
use flash_attn::reference::{attention_backward, ReferenceProblem};
use flash_attn::{
    AttentionParams, Element, FlashAttention, Gradients, SeqOffsets, Tensor, TensorMut, Workspace, BACKWARD_KERNELS,
    HOPPER_BACKWARD_KERNELS,
};
use flash_attn_abi::kernels::Variant;
use flash_attn_tests::check;
use flash_attn_tests::emulator::{self, Memory};
use flash_attn_tests::seed::test_rng;
use flash_attn_tests::{
    download, f16_and_bf16_tests, gather, gpu, left_out_of_this_run, poisoned, random_tensor, random_values,
    sequence_rows, skipped, span, upload, Placement, TestElement,
};

/// One backward case: sizes, layout, mask and score modifiers.
#[derive(Clone, Debug)]
struct Case {
    batch: usize,
    seqlen_q: usize,
    seqlen_k: usize,
    heads: (usize, usize),
    head_dim: usize,
    placement: Placement,
    causal: bool,
    window: (Option<usize>, Option<usize>),
    softcap: Option<f32>,
    /// One per query head.
    alibi: Option<Vec<f32>>,
    deterministic: bool,
}

fn cases(head_dim: usize) -> Vec<Case> {
    let case = |batch, seqlen_q, seqlen_k, heads, placement, causal| Case {
        batch,
        seqlen_q,
        seqlen_k,
        heads,
        head_dim,
        placement,
        causal,
        window: (None, None),
        softcap: None,
        alibi: None,
        deterministic: false,
    };
    // Every head dim: ragged causal GQA both ways round, a window with a
    // softcap, ALiBi, the deterministic mode; small enough that the f64
    // reference (one CPU thread) and the sanitizers keep to minutes.
    let mut cases = vec![
        case(1, 130, 515, (2, 2), Placement::Padded, true),
        case(1, 515, 130, (3, 1), Placement::HeadsMajor, true),
        Case {
            window: (Some(100), Some(20)),
            softcap: Some(15.0),
            ..case(1, 400, 333, (2, 1), Placement::Padded, false)
        },
        Case { alibi: Some(vec![0.25, 0.0625]), ..case(2, 200, 260, (2, 2), Placement::Contiguous, true) },
        Case { deterministic: true, ..case(2, 150, 390, (4, 2), Placement::Padded, true) },
    ];
    // d = 64 and 128 (the targets' head dims): more and longer rows, and at
    // d = 128 one sequence of 2048.
    if head_dim == 64 || head_dim == 128 {
        cases.push(case(2, 300, 300, (4, 1), Placement::Contiguous, false));
        cases.push(case(2, 300, 300, (4, 1), Placement::Contiguous, true));
        cases.push(Case { deterministic: true, ..case(2, 300, 700, (4, 2), Placement::Padded, true) });
    }
    if head_dim == 128 {
        cases.push(case(1, 2048, 2048, (2, 1), Placement::Contiguous, true));
    }
    cases
}

fn run<T: TestElement>(test: &str) {
    let Some((_context, attention)) = gpu(test) else {
        return;
    };
    let mut rng = test_rng(test);
    let mut workspace = Workspace::new();
    let mut ran = 0;
    for kernel in BACKWARD_KERNELS.iter().filter(|k| k.dtype == <T as Element>::DTYPE) {
        for case in cases(kernel.head_dim as usize) {
            let scores = case.batch * case.heads.0 * case.seqlen_q * case.seqlen_k;
            if left_out_of_this_run(test, &case, scores) {
                continue;
            }
            check_case::<T>(&attention, &mut workspace, &case, &mut rng);
            println!("{test}: ok {} {case:?}", kernel.name);
            ran += 1;
        }
    }
    assert!(ran > 0, "every case was left out of the run");
    // The main backward kernels as the driver compiled them (loaded by the
    // calls above): no local memory, as ptxas found them at build time.
    let kernels = attention.kernel_resources().expect("kernel attributes");
    let backward: Vec<_> = kernels.iter().filter(|k| k.name.starts_with("flash_bwd_d")).collect();
    assert_eq!(backward.len(), BACKWARD_KERNELS.len(), "one entry per main backward kernel");
    for k in &backward {
        println!("{test}: {:<24} {:>4} registers {:>4} B local", k.name, k.registers, k.local_bytes);
    }
    let spilling: Vec<_> = backward.iter().filter(|k| k.local_bytes > 0).collect();
    assert!(spilling.is_empty(), "backward kernels using local memory: {spilling:?}");
}

fn check_case<T: TestElement>(
    attention: &FlashAttention,
    workspace: &mut Workspace,
    case: &Case,
    rng: &mut impl rand::Rng,
) {
    let (hq, hk) = case.heads;
    let q_shape = [case.batch, case.seqlen_q, hq, case.head_dim];
    let kv_shape = [case.batch, case.seqlen_k, hk, case.head_dim];
    let [q, k, v, d_o] = [q_shape, kv_shape, kv_shape, q_shape].map(|s| random_tensor::<T>(rng, s, case.placement));
    let stream = Stream::new(StreamFlags::NON_BLOCKING, None).expect("stream");
    let [q_dev, k_dev, v_dev, d_o_dev] = [&q, &k, &v, &d_o].map(|t| upload(&t.buffer));
    let slopes = case.alibi.as_ref().map(|s| upload(s));
    let params = AttentionParams {
        causal: case.causal,
        window: case.window,
        softcap: case.softcap,
        alibi_slopes: slopes.as_ref().map(Into::into),
        deterministic: case.deterministic,
        ..Default::default()
    };
    let tensor = |buffer, t: &flash_attn_tests::HostTensor<T>| Tensor::strided(buffer, t.shape, t.strides);
    let mut o_dev = poisoned::<T>(q.buffer.len());
    let mut lse_dev = DeviceBuffer::from_slice(&vec![f32::NAN; case.batch * hq * case.seqlen_q]).expect("lse");
    attention
        .forward_into(
            tensor(&q_dev, &q),
            tensor(&k_dev, &k),
            tensor(&v_dev, &v),
            TensorMut::strided(&mut o_dev, q.shape, q.strides),
            &mut lse_dev,
            &params,
            &stream,
        )
        .unwrap_or_else(|e| panic!("{case:?}: forward refused: {e}"));

    let mut gradients = || {
        let (mut d_q, mut d_k, mut d_v) =
            (poisoned::<T>(q.buffer.len()), poisoned::<T>(k.buffer.len()), poisoned::<T>(v.buffer.len()));
        attention
            .backward_into(
                tensor(&q_dev, &q),
                tensor(&k_dev, &k),
                tensor(&v_dev, &v),
                tensor(&o_dev, &q),
                &lse_dev,
                tensor(&d_o_dev, &d_o),
                Gradients {
                    d_q: TensorMut::strided(&mut d_q, q.shape, q.strides),
                    d_k: TensorMut::strided(&mut d_k, k.shape, k.strides),
                    d_v: TensorMut::strided(&mut d_v, v.shape, v.strides),
                },
                &params,
                workspace,
                &stream,
            )
            .unwrap_or_else(|e| panic!("{case:?}: backward refused: {e}"));
        stream.synchronize().unwrap_or_else(|e| panic!("{case:?}: kernel failed: {e}"));
        [download(&d_q), download(&d_k), download(&d_v)]
    };
    let first = gradients();
    let second = gradients();
    if case.placement == Placement::Contiguous {
        // The allocating call: the same dK and dV, bit for bit.
        let out = attention
            .backward(
                tensor(&q_dev, &q),
                tensor(&k_dev, &k),
                tensor(&v_dev, &v),
                tensor(&o_dev, &q),
                &lse_dev,
                tensor(&d_o_dev, &d_o),
                &params,
                workspace,
                &stream,
            )
            .unwrap_or_else(|e| panic!("{case:?}: backward refused: {e}"));
        stream.synchronize().unwrap_or_else(|e| panic!("{case:?}: kernel failed: {e}"));
        for (name, a, b) in [("dK", download(&out.d_k), &first[1]), ("dV", download(&out.d_v), &first[2])] {
            let same = a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same, "{case:?}: the allocating call's {name} differs");
        }
    }
    // dK and dV take no atomics; dQ is summed in a fixed order only in the
    // deterministic mode.
    let same = [("dQ", 0), ("dK", 1), ("dV", 2)].into_iter().filter(|&(_, i)| case.deterministic || i > 0);
    for (name, i) in same {
        let (a, b) = (&first[i], &second[i]);
        assert!(a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()), "{case:?}: {name} differs between two runs");
    }

    let p = ReferenceProblem {
        batch: case.batch,
        seqlen_q: case.seqlen_q,
        seqlen_k: case.seqlen_k,
        heads_q: hq,
        heads_kv: hk,
        head_dim: case.head_dim,
        causal: case.causal,
        softmax_scale: 1.0 / (case.head_dim as f64).sqrt(),
        window: case.window,
        softcap: case.softcap.map(f64::from),
    };
    let slopes64: Option<Vec<f64>> =
        case.alibi.as_ref().map(|s| (0..case.batch).flat_map(|_| s.iter().map(|&x| x as f64)).collect());
    let expected = attention_backward(&p, slopes64.as_deref(), &q.dense, &k.dense, &v.dense, &d_o.dense);
    let [d_q, d_k, d_v] = &first;
    assert_eq!(d_q.len(), span(q.shape, q.strides));
    for (name, got, shape, strides, want) in [
        ("dQ", d_q, q.shape, q.strides, &expected.dq),
        ("dK", d_k, k.shape, k.strides, &expected.dk),
        ("dV", d_v, v.shape, v.strides, &expected.dv),
    ] {
        let logical: std::collections::HashSet<usize> = (0..shape.iter().product::<usize>())
            .map(|i| {
                let [_, s, h, d] = shape;
                let at = [i / (s * h * d), i / (h * d) % s, i / d % h, i % d];
                at.iter().zip(strides).map(|(&n, stride)| n * stride).sum()
            })
            .collect();
        let padding_written = (0..got.len()).any(|i| !logical.contains(&i) && got[i].to_bits() != T::POISON);
        assert!(!padding_written, "{case:?}: {name}'s padding was written");
        let got = gather(got, shape, strides);
        check::assert_close(&format!("{case:?}: {name}"), T::DTYPE, &got, want, shape[3]);
    }
}

f16_and_bf16_tests!(backward_f16, backward_bf16: run());

/// The sm_90a main kernel the host plans for `case` on compute capability
/// 9.0, if any: the call validated at host addresses of the same alignment
/// and strides as the device buffers.
fn planned_sm90a<T: TestElement>(case: &Case) -> Option<&'static str> {
    let dtype = <T as Element>::DTYPE;
    let (hq, hk) = case.heads;
    let q_shape = [case.batch, case.seqlen_q, hq, case.head_dim];
    let kv_shape = [case.batch, case.seqlen_k, hk, case.head_dim];
    let tensor = |shape: [usize; 4]| emulator::Tensor::filled(shape, case.placement.strides(shape), 0);
    let (q, k, v, o, d_o) = (tensor(q_shape), tensor(kv_shape), tensor(kv_shape), tensor(q_shape), tensor(q_shape));
    let (mut d_q, mut d_k, mut d_v) = (tensor(q_shape), tensor(kv_shape), tensor(kv_shape));
    let lse = vec![0f32; case.batch * hq * case.seqlen_q];
    let mut memory = Memory::new();
    let (q, k, v) = (memory.tensor("q", &q), memory.tensor("k", &k), memory.tensor("v", &v));
    let (o, d_o) = (memory.tensor("o", &o), memory.tensor("d_o", &d_o));
    let lse_addr = memory.input("lse", &lse);
    let (d_q, d_k, d_v) = (
        memory.output_tensor("d_q", &mut d_q),
        memory.output_tensor("d_k", &mut d_k),
        memory.output_tensor("d_v", &mut d_v),
    );
    let params = AttentionParams { causal: case.causal, deterministic: case.deterministic, ..Default::default() };
    let tensors = BackwardTensors { o: &o, lse_addr, lse_len: lse.len(), d_o: &d_o, d_q: &d_q, d_k: &d_k, d_v: &d_v };
    let call = validate(dtype, &q, &k, &v, tensors.forward_outputs(), &params)
        .and_then(|forward| validate_backward(forward, &q, &k, &v, &tensors, &params))
        .unwrap_or_else(|e| panic!("{case:?}: {e}"));
    let plan = plan_backward_for(&call, 132, KernelFamily::Sm90a { sm_count: 132 }).expect("a plan");
    matches!(plan, BackwardPlan::Sm90(_)).then(|| plan.kernel().name())
}

/// The sm_90a main kernels (on compute capability 9.0; skipped, saying
/// why, elsewhere): every row of their table on the cases of its head dim
/// and mask that the planner gives it (asked first), against the f64
/// reference as above.
fn run_sm90a<T: TestElement>(test: &str) {
    let Some((_context, attention)) = gpu(test) else {
        return;
    };
    if !attention.uses_sm90a() {
        skipped(test, "the sm_90a kernels need compute capability 9.0");
        return;
    }
    let mut rng = test_rng(test);
    let mut workspace = Workspace::new();
    let mut ran = 0;
    for kernel in HOPPER_BACKWARD_KERNELS.iter().filter(|k| k.dtype == <T as Element>::DTYPE) {
        let causal = kernel.variant == Variant::Causal;
        let cases = cases(kernel.head_dim as usize).into_iter().map(|c| Case { causal, ..c });
        for case in cases.filter(|c| c.window == (None, None) && c.softcap.is_none() && c.alibi.is_none()) {
            let scores = case.batch * case.heads.0 * case.seqlen_q * case.seqlen_k;
            if case.deterministic || left_out_of_this_run(test, &case, scores) {
                continue;
            }
            assert_eq!(planned_sm90a::<T>(&case), Some(kernel.name), "{case:?}: planned for another kernel");
            check_case::<T>(&attention, &mut workspace, &case, &mut rng);
            println!("{test}: ok {} {case:?}", kernel.name);
            ran += 1;
        }
    }
    assert!(ran > 0, "every case was left out of the run");
    let kernels = attention.kernel_resources().expect("kernel attributes");
    let sm90a: Vec<_> = kernels.iter().filter(|k| k.name.starts_with("flash_bwd_sm90_")).collect();
    assert_eq!(sm90a.len(), HOPPER_BACKWARD_KERNELS.len(), "one entry per sm_90a main backward kernel");
    for k in &sm90a {
        println!("{test}: {:<32} {:>4} registers {:>4} B local", k.name, k.registers, k.local_bytes);
    }
    let spilling: Vec<_> = sm90a.iter().filter(|k| k.local_bytes > 0).collect();
    assert!(spilling.is_empty(), "sm_90a backward kernels using local memory: {spilling:?}");
}

f16_and_bf16_tests!(backward_sm90a_f16, backward_sm90a_bf16: run_sm90a());

/// Packed sequences, (queries, keys) each: an empty one first, one without
/// keys, more queries than keys and the reverse, a single query, key
/// blocks that run into the next sequence's keys.
const PACKED: &[(usize, usize)] = &[(0, 5), (70, 100), (130, 0), (90, 40), (1, 65), (150, 200)];

/// The backward of packed sequences (`backward_varlen_into`, after
/// `forward_varlen_into` on the same inputs) at every head dim, causal and
/// not, GQA 4/2, each sequence against a batch-1 f64 reference; dQ, dK and
/// dV start as NaN. (The sm_90a main kernels do not take packed
/// sequences: every GPU runs the sm_80 ones here.)
fn run_packed<T: TestElement>(test: &str) {
    let Some((_context, attention)) = gpu(test) else {
        return;
    };
    let mut rng = test_rng(test);
    let mut workspace = Workspace::new();
    let stream = Stream::new(StreamFlags::NON_BLOCKING, None).expect("stream");
    let lengths = |side: fn(&(usize, usize)) -> usize| PACKED.iter().map(side).collect::<Vec<_>>();
    let cu_q = SeqOffsets::from_lengths(&lengths(|l| l.0)).expect("cu_seqlens_q");
    let cu_k = SeqOffsets::from_lengths(&lengths(|l| l.1)).expect("cu_seqlens_k");
    let (hq, hk) = (4, 2);
    let mut ran = 0;
    for kernel in BACKWARD_KERNELS.iter().filter(|k| k.dtype == <T as Element>::DTYPE) {
        let d = kernel.head_dim as usize;
        for causal in [false, true] {
            let what = format!("{} d={d} causal={causal} packed {PACKED:?}", <T as Element>::NAME);
            let scores = hq * PACKED.iter().map(|(q, k)| q * k).sum::<usize>();
            if left_out_of_this_run(test, &what, scores) {
                continue;
            }
            let (q_shape, kv_shape) = ([cu_q.total(), hq, d], [cu_k.total(), hk, d]);
            let [(q, q64), (k, k64), (v, v64), (d_o, d_o64)] =
                [q_shape, kv_shape, kv_shape, q_shape].map(|s| random_values::<T>(&mut rng, s.iter().product()));
            let [q_dev, k_dev, v_dev, d_o_dev] = [&q, &k, &v, &d_o].map(|t| upload(t));
            let params = AttentionParams { causal, ..Default::default() };
            let mut o_dev = poisoned::<T>(q.len());
            let mut lse_dev = DeviceBuffer::from_slice(&vec![f32::NAN; hq * cu_q.total()]).expect("lse");
            let (qt, kt, vt) =
                (Tensor::packed(&q_dev, q_shape), Tensor::packed(&k_dev, kv_shape), Tensor::packed(&v_dev, kv_shape));
            let o = TensorMut::packed(&mut o_dev, q_shape);
            attention
                .forward_varlen_into(qt, kt, vt, o, &mut lse_dev, &cu_q, &cu_k, &params, &stream)
                .unwrap_or_else(|e| panic!("{what}: forward refused: {e}"));
            let (mut d_q, mut d_k, mut d_v) = (poisoned::<T>(q.len()), poisoned::<T>(k.len()), poisoned::<T>(v.len()));
            let gradients = Gradients {
                d_q: TensorMut::packed(&mut d_q, q_shape),
                d_k: TensorMut::packed(&mut d_k, kv_shape),
                d_v: TensorMut::packed(&mut d_v, kv_shape),
            };
            let (o, d_o_t) = (Tensor::packed(&o_dev, q_shape), Tensor::packed(&d_o_dev, q_shape));
            let problem = attention
                .backward_varlen_into(
                    qt,
                    kt,
                    vt,
                    o,
                    &lse_dev,
                    d_o_t,
                    gradients,
                    &cu_q,
                    &cu_k,
                    &params,
                    &mut workspace,
                    &stream,
                )
                .unwrap_or_else(|e| panic!("{what}: backward refused: {e}"));
            stream.synchronize().unwrap_or_else(|e| panic!("{what}: kernel failed: {e}"));
            let [d_q, d_k, d_v] =
                [&d_q, &d_k, &d_v].map(|t| download(t).iter().map(|x| x.to_f64()).collect::<Vec<_>>());
            // Every sequence's rows, then each gradient checked whole.
            let (mut got_rows, mut want_rows) = ([vec![], vec![], vec![]], [vec![], vec![], vec![]]);
            for (b, &(sq, sk)) in PACKED.iter().enumerate() {
                let q_rows = |x| sequence_rows(x, cu_q.offsets(), b, hq, d);
                let k_rows = |x| sequence_rows(x, cu_k.offsets(), b, hk, d);
                let p = ReferenceProblem::dense(1, sq, sk, hq, hk, d, causal, 1.0 / (d as f64).sqrt());
                let want = attention_backward(&p, None, q_rows(&q64), k_rows(&k64), k_rows(&v64), q_rows(&d_o64));
                for (i, (got, want)) in [(q_rows(&d_q), &want.dq), (k_rows(&d_k), &want.dk), (k_rows(&d_v), &want.dv)]
                    .into_iter()
                    .enumerate()
                {
                    got_rows[i].extend_from_slice(got);
                    want_rows[i].extend_from_slice(want);
                }
            }
            for (i, name) in ["dQ", "dK", "dV"].into_iter().enumerate() {
                check::assert_close(&format!("{what}: {name}"), T::DTYPE, &got_rows[i], &want_rows[i], d);
            }
            println!("{test}: ok {} {what} ({problem:?})", kernel.name);
            ran += 1;
        }
    }
    assert!(ran > 0, "every case was left out of the run");
}

f16_and_bf16_tests!(backward_packed_f16, backward_packed_bf16: run_packed());

//! The backward kernels' own code on the CPU emulator, against the f64
//! reference gradients (`flash_attn::reference::attention_backward`, itself
//! checked against finite differences), each call going through the host's
//! pipeline: the forward's validation, `validate_backward`, `plan_backward_for`,
//! and the plan's three launches (prepare, the main kernel of the head
//! dim, finish dQ). O and the LSE come from the f64 reference forward; the
//! gradients and the scratch start as NaN. Shapes end inside a query step
//! and a key block; GQA, causal with more keys than queries, windows,
//! softcap and ALiBi, padded strides, and packed sequences. The sm_90a main
//! kernels run planned for compute capability 9.0 (`KernelFamily::Sm90a`),
//! their TMA loads, `wgmma`s and mbarrier ring included.

use flash_attn::pipeline::{
    validate, validate_backward, validate_varlen, BackwardPlan, BackwardTensors, KernelFamily, OffsetsArg,
};
use flash_attn::reference::{attention_backward, attention_with_alibi, ReferenceProblem};
use flash_attn::{AttentionParams, BACKWARD_KERNELS, HOPPER_BACKWARD_KERNELS};
use flash_attn_abi::kernels::Variant;
use flash_attn_tests::check::assert_close;
use flash_attn_tests::emulator::{self, Dtype, DtypeValues, Memory, Tensor, POISON};

/// One backward problem: the reference's sizes and options (for packed
/// sequences: batch 1 and the longest lengths), ALiBi slopes
/// (`[batch, heads_q]`) if any, packed sequences' `(seqlen_q, seqlen_k)` if
/// the batch is packed, whether the tensors have padded strides, and
/// whether the call is planned for the sm_90a kernels (which must take it).
struct Problem {
    reference: ReferenceProblem,
    slopes: Option<Vec<f64>>,
    packed: Option<Vec<(usize, usize)>>,
    padded: bool,
    deterministic: bool,
    sm90a: bool,
}

/// The SMs of the GPU the plans are made for: few, so that a deterministic
/// split takes several key blocks.
const SM_COUNT: usize = 2;

/// What the kernels wrote, as f64, densely packed like the reference's.
struct Gradients {
    d_q: Vec<f64>,
    d_k: Vec<f64>,
    d_v: Vec<f64>,
}

/// Strides of `shape` with padding between heads, rows and batches.
fn padded_strides([_, s, h, d]: [usize; 4]) -> [usize; 4] {
    let head = d + 8;
    let row = h * head + 16;
    [s * row + 24, row, head, 1]
}

/// The f64 reference of `problem` on `q`, `k`, `v` and `d_o` (densely
/// packed values): o, the LSE as the kernels index it, and the gradients.
/// Packed sequences are each a dense problem of batch 1.
fn reference(problem: &Problem, q: &[f64], k: &[f64], v: &[f64], d_o: &[f64]) -> (Vec<f64>, Vec<f64>, Gradients) {
    let p = &problem.reference;
    let slopes = problem.slopes.as_deref();
    let Some(lengths) = &problem.packed else {
        let forward = attention_with_alibi(p, slopes, q, k, v);
        let g = attention_backward(p, slopes, q, k, v, d_o);
        return (forward.o, forward.lse, Gradients { d_q: g.dq, d_k: g.dk, d_v: g.dv });
    };
    let (d, hq, hk) = (p.head_dim, p.heads_q, p.heads_kv);
    let total_q: usize = lengths.iter().map(|l| l.0).sum();
    let (mut o, mut lse) = (vec![0.0; q.len()], vec![0.0; hq * total_q]);
    let mut g = Gradients { d_q: vec![0.0; q.len()], d_k: vec![0.0; k.len()], d_v: vec![0.0; v.len()] };
    let (mut q0, mut k0) = (0, 0);
    for (b, &(sq, sk)) in lengths.iter().enumerate() {
        let one = ReferenceProblem { batch: 1, seqlen_q: sq, seqlen_k: sk, ..*p };
        let (qs, ks) = (q0 * hq * d..(q0 + sq) * hq * d, k0 * hk * d..(k0 + sk) * hk * d);
        let slope = slopes.map(|s| s[b * hq..][..hq].to_vec());
        let forward = attention_with_alibi(&one, slope.as_deref(), &q[qs.clone()], &k[ks.clone()], &v[ks.clone()]);
        let grads = attention_backward(
            &one,
            slope.as_deref(),
            &q[qs.clone()],
            &k[ks.clone()],
            &v[ks.clone()],
            &d_o[qs.clone()],
        );
        o[qs.clone()].copy_from_slice(&forward.o);
        for h in 0..hq {
            lse[h * total_q + q0..][..sq].copy_from_slice(&forward.lse[h * sq..][..sq]);
        }
        g.d_q[qs].copy_from_slice(&grads.dq);
        g.d_k[ks.clone()].copy_from_slice(&grads.dk);
        g.d_v[ks].copy_from_slice(&grads.dv);
        (q0, k0) = (q0 + sq, k0 + sk);
    }
    (o, lse, g)
}

/// Runs the backward of `problem` in `dtype` on the emulator from fresh
/// random q, k, v and dO (seed `seed`), and returns the gradients with the
/// reference's.
fn run(problem: &Problem, dtype: Dtype, seed: u64) -> (Gradients, Gradients) {
    let p = &problem.reference;
    let d = p.head_dim;
    let (rows_q, rows_k, batch) = match &problem.packed {
        Some(lengths) => (lengths.iter().map(|l| l.0).sum(), lengths.iter().map(|l| l.1).sum(), 1),
        None => (p.seqlen_q, p.seqlen_k, p.batch),
    };
    let q_shape = [batch, rows_q, p.heads_q, d];
    let kv_shape = [batch, rows_k, p.heads_kv, d];
    let strides = |shape| if problem.padded { padded_strides(shape) } else { Tensor::contiguous_strides(shape) };
    let q = Tensor::random(q_shape, strides(q_shape), dtype, seed);
    let k = Tensor::random(kv_shape, strides(kv_shape), dtype, seed + 1);
    let v = Tensor::random(kv_shape, strides(kv_shape), dtype, seed + 2);
    let d_o = Tensor::random(q_shape, strides(q_shape), dtype, seed + 3);
    let (q64, k64, v64, d_o64) = (q.to_f64(dtype), k.to_f64(dtype), v.to_f64(dtype), d_o.to_f64(dtype));
    let (o64, lse64, expected) = reference(problem, &q64, &k64, &v64, &d_o64);

    // The forward's outputs as a forward call would have left them.
    let mut o = Tensor::filled(q_shape, strides(q_shape), 0);
    for (i, &x) in o.indices().collect::<Vec<_>>().into_iter().zip(&o64) {
        o.data_mut()[i] = dtype.bits_of(x);
    }
    let lse: Vec<f32> = lse64.iter().map(|&x| x as f32).collect();
    let slopes: Option<Vec<f32>> = problem.slopes.as_ref().map(|s| s.iter().map(|&x| x as f32).collect());
    let offsets = |side: fn(&(usize, usize)) -> usize| -> Vec<i32> {
        let lengths = problem.packed.as_deref().unwrap_or(&[]);
        std::iter::once(0)
            .chain(lengths.iter().scan(0, |end, l| Some(*end + side(l) as i32).inspect(|e| *end = *e)))
            .collect()
    };
    let (cu_q, cu_k) = (offsets(|l| l.0), offsets(|l| l.1));

    let mut d_q = Tensor::filled(q_shape, strides(q_shape), POISON);
    let mut d_k = Tensor::filled(kv_shape, strides(kv_shape), POISON);
    let mut d_v = Tensor::filled(kv_shape, strides(kv_shape), POISON);
    {
        let mut memory = Memory::new();
        let (q_at, k_at, v_at) = (memory.tensor("q", &q), memory.tensor("k", &k), memory.tensor("v", &v));
        let (o_at, d_o_at) = (memory.tensor("o", &o), memory.tensor("d_o", &d_o));
        let lse_addr = memory.input("lse", &lse);
        let (d_q_at, d_k_at, d_v_at) = (
            memory.output_tensor("d_q", &mut d_q),
            memory.output_tensor("d_k", &mut d_k),
            memory.output_tensor("d_v", &mut d_v),
        );
        let mut params = AttentionParams {
            causal: p.causal,
            softmax_scale: Some(p.softmax_scale as f32),
            window: p.window,
            softcap: p.softcap.map(|c| c as f32),
            deterministic: problem.deterministic,
            ..Default::default()
        };
        if let Some(s) = &slopes {
            params.alibi_slopes = Some(memory.slice("alibi_slopes", s));
        }
        let tensors = BackwardTensors {
            o: &o_at,
            lse_addr,
            lse_len: lse.len(),
            d_o: &d_o_at,
            d_q: &d_q_at,
            d_k: &d_k_at,
            d_v: &d_v_at,
        };
        let forward = match &problem.packed {
            None => validate(dtype, &q_at, &k_at, &v_at, tensors.forward_outputs(), &params),
            Some(_) => {
                let cu_q = OffsetsArg { host: &cu_q, addr: memory.input("cu_seqlens_q", &cu_q) };
                let cu_k = OffsetsArg { host: &cu_k, addr: memory.input("cu_seqlens_k", &cu_k) };
                validate_varlen(dtype, &q_at, &k_at, &v_at, cu_q, cu_k, tensors.forward_outputs(), &params)
            }
        };
        let call = forward
            .and_then(|forward| validate_backward(forward, &q_at, &k_at, &v_at, &tensors, &params))
            .unwrap_or_else(|e| panic!("refused: {e}"));
        let family = if problem.sm90a { KernelFamily::Sm90a { sm_count: SM_COUNT } } else { KernelFamily::Sm80 };
        let plan = emulator::run_backward_on(&call, &memory, SM_COUNT, family).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(matches!(plan, BackwardPlan::Sm90(_)), problem.sm90a, "the plan chose another main kernel");
    }
    for t in [&d_q, &d_k, &d_v] {
        let written: std::collections::HashSet<usize> = t.indices().collect();
        let padding = (0..t.data().len()).filter(|i| !written.contains(i));
        assert!(padding.into_iter().all(|i| t.data()[i] == POISON), "a gradient's padding was written");
    }
    let actual = Gradients { d_q: d_q.to_f64(dtype), d_k: d_k.to_f64(dtype), d_v: d_v.to_f64(dtype) };
    (actual, expected)
}

/// Runs `problem` in both element types and checks each gradient.
fn check(what: &str, problem: &Problem, seed: u64) {
    for dtype in [Dtype::F16, Dtype::Bf16] {
        let (actual, expected) = run(problem, dtype, seed);
        for (name, a, e) in
            [("dQ", &actual.d_q, &expected.d_q), ("dK", &actual.d_k, &expected.d_k), ("dV", &actual.d_v, &expected.d_v)]
        {
            let errors = assert_close(&format!("{what}: {name}"), dtype, a, e, problem.reference.head_dim);
            println!("{what} {dtype:?}: {name} {}", errors.describe(dtype));
        }
    }
}

fn dense(batch: usize, seqlen_q: usize, seqlen_k: usize, heads: (usize, usize), d: usize, causal: bool) -> Problem {
    let scale = 1.0 / (d as f64).sqrt();
    let reference = ReferenceProblem::dense(batch, seqlen_q, seqlen_k, heads.0, heads.1, d, causal, scale);
    Problem { reference, slopes: None, packed: None, padded: false, deterministic: false, sm90a: false }
}
#[test]
fn every_head_dim_matches_the_reference() {
    for (i, kernel) in BACKWARD_KERNELS.iter().filter(|k| k.dtype == Dtype::F16).enumerate() {
        let d = kernel.head_dim as usize;
        check(&format!("d={d}"), &dense(1, 80, 100, (2, 1), d, false), 10 + i as u64);
    }
}

#[test]
fn sm90a_kernels_match_the_reference() {
    // Every row of the table (both element types in each check): three
    // query steps (of 64 or 128 rows) and three key blocks, each ending
    // inside, query heads 2/1, padded strides (multiples of 16 bytes, as
    // TMA takes them).
    for (i, kernel) in HOPPER_BACKWARD_KERNELS.iter().filter(|k| k.dtype == Dtype::F16).enumerate() {
        let d = kernel.head_dim as usize;
        let causal = kernel.variant == Variant::Causal;
        let seqlen_q = 3 * kernel.config.block_m() as usize - 34;
        let mut problem = dense(1, seqlen_q, 300, (2, 1), d, causal);
        (problem.padded, problem.sm90a) = (true, true);
        check(&format!("sm90a d={d} causal={causal}"), &problem, 70 + i as u64);
    }
}

#[test]
fn sm90a_causal_with_rows_that_see_no_key_and_grouped_heads() {
    // More queries than keys: the first 50 rows of each batch see no key.
    let mut problem = dense(2, 150, 100, (4, 2), 64, true);
    problem.sm90a = true;
    check("sm90a causal sq > sk, GQA 4/2", &problem, 80);
    let mut problem = dense(1, 60, 300, (3, 1), 128, true);
    problem.sm90a = true;
    check("sm90a causal sq < sk, MQA 3/1", &problem, 81);
    // Consumers splitting the head dim, its tiles padded past d = 160.
    let mut problem = dense(2, 150, 100, (4, 2), 160, true);
    problem.sm90a = true;
    check("sm90a d=160 causal sq > sk, GQA 4/2", &problem, 82);
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

#[test]
fn padded_strides_and_packed_sequences() {
    let mut padded = dense(2, 70, 90, (4, 2), 128, true);
    padded.padded = true;
    check("padded strides", &padded, 50);
    // Three sequences, one with more queries than keys and one with a
    // single query; causal, bottom-right per sequence.
    let lengths = vec![(70, 100), (90, 40), (1, 65)];
    let mut packed = dense(1, 90, 100, (2, 1), 64, true);
    packed.packed = Some(lengths.clone());
    check("packed, causal", &packed, 51);
    let mut windowed = dense(1, 90, 100, (2, 2), 32, false);
    windowed.packed = Some(lengths);
    windowed.reference.window = (Some(30), Some(10));
    windowed.slopes = Some(vec![0.25, 0.5, 0.125, 1.0, 0.0625, 0.75]);
    check("packed, window and ALiBi per sequence", &windowed, 52);
}

#[test]
fn the_deterministic_mode_matches_the_reference_and_itself() {
    // Four key blocks of each of 2 key/value heads in 2 batches on a GPU of
    // two SMs: one split per block column, each taking all four blocks.
    let mut problem = dense(2, 100, 250, (4, 2), 64, true);
    problem.deterministic = true;
    check("deterministic", &problem, 60);
    let mut packed = dense(1, 90, 100, (2, 1), 128, false);
    packed.deterministic = true;
    packed.packed = Some(vec![(70, 200), (90, 40)]);
    check("deterministic, packed", &packed, 61);
    for dtype in [Dtype::F16, Dtype::Bf16] {
        let (first, _) = run(&problem, dtype, 62);
        let (second, _) = run(&problem, dtype, 62);
        for (name, a, b) in
            [("dQ", &first.d_q, &second.d_q), ("dK", &first.d_k, &second.d_k), ("dV", &first.d_v, &second.d_v)]
        {
            assert!(a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()), "{dtype:?}: {name} differs between runs");
        }
    }
}

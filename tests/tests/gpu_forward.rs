//! GPU integration tests: the kernels against the f64 CPU reference over
//! sequence lengths, ragged tails, causal masking, GQA, both element types,
//! every head dim and strided layouts. Skipped, saying why, without a GPU.

use flash_attn::half1::{bf16, f16};
use flash_attn_tests::seed::test_rng;
use flash_attn_tests::{f16_and_bf16_tests, gpu, left_out_of_this_run, run_case, Case, Placement, TestElement};

/// (seqlen_q, seqlen_k) pairs: ragged tails around the 64-row tiles, both
/// orders of unequal lengths, and long sequences.
const SEQLENS: [(usize, usize); 14] = [
    (1, 1),
    (17, 17),
    (63, 63),
    (64, 64),
    (65, 65),
    (127, 127),
    (1000, 1000),
    (17, 65),
    (65, 17),
    (1, 1000),
    (1000, 1),
    (127, 4097),
    (4097, 127),
    (4097, 4097),
];

/// (heads_q, heads_kv): MHA, GQA 4:1, MQA (all:1).
const HEADS: [(usize, usize); 3] = [(2, 2), (4, 1), (6, 1)];

fn matrix(head_dim: usize, causal: bool) -> Vec<Case> {
    SEQLENS
        .iter()
        .enumerate()
        .map(|(i, &(seqlen_q, seqlen_k))| {
            let long = seqlen_q.max(seqlen_k) > 2000;
            let (heads_q, heads_kv) = HEADS[i % HEADS.len()];
            Case {
                batch: if long { 1 } else { 2 },
                seqlen_q,
                seqlen_k,
                heads_q,
                heads_kv,
                head_dim,
                causal,
                softmax_scale: if i % 4 == 3 { Some(0.3) } else { None },
                placement: [Placement::Contiguous, Placement::HeadsMajor, Placement::Padded][i % 3],
            }
        })
        .collect()
}

/// Indices into `SEQLENS` run for the head dims other than 64 and 128: the
/// same kinds of cases, fewer of each (one, ragged, both orders of unequal
/// lengths, long keys).
const SEQLENS_OTHER_HEAD_DIMS: [usize; 6] = [0, 5, 6, 7, 8, 11];

fn run_matrix<T: TestElement>(test: &str, head_dim: usize) {
    let Some((_context, attention)) = gpu(test) else {
        return;
    };
    run_cases::<T>(test, &attention, head_dim, |_| true);
}

fn run_cases<T: TestElement>(
    test: &str,
    attention: &flash_attn::FlashAttention,
    head_dim: usize,
    keep: impl Fn(usize) -> bool,
) {
    let mut rng = test_rng(test);
    for causal in [false, true] {
        let cases = matrix(head_dim, causal).into_iter().enumerate().filter(|(i, _)| keep(*i));
        for (_, case) in cases {
            if left_out_of_this_run(test, &case, case.batch * case.heads_q * case.seqlen_q * case.seqlen_k) {
                continue;
            }
            let r = run_case::<T>(attention, &case, &mut rng);
            println!(
                "{test}: ok {} d={} causal={} sq={} sk={} heads={}:{} {:?}: O rel err {:.2e}, LSE max err {:.2e}",
                <T as flash_attn::Element>::NAME,
                head_dim,
                causal,
                case.seqlen_q,
                case.seqlen_k,
                case.heads_q,
                case.heads_kv,
                case.placement,
                r.o_error,
                r.lse_max_error
            );
        }
    }
}

f16_and_bf16_tests!(f16_head_dim_64, bf16_head_dim_64: run_matrix(64));
f16_and_bf16_tests!(f16_head_dim_128, bf16_head_dim_128: run_matrix(128));

/// Head dims 32, 96, 160, 192, 224, 256 over a subset of the matrix: one
/// and ragged lengths, both orders of unequal lengths, a long key sequence.
fn run_other_head_dims<T: TestElement>(test: &str) {
    let Some((_context, attention)) = gpu(test) else { return };
    for head_dim in [32, 96, 160, 192, 224, 256] {
        run_cases::<T>(test, &attention, head_dim, |i| SEQLENS_OTHER_HEAD_DIMS.contains(&i));
    }
}

f16_and_bf16_tests!(f16_other_head_dims, bf16_other_head_dims: run_other_head_dims());

/// Same inputs twice give bit-identical outputs: no race between warps.
#[test]
fn repeated_runs_agree() {
    let Some((_context, attention)) = gpu("repeated_runs_agree") else {
        return;
    };
    let case = Case {
        batch: 2,
        seqlen_q: 300,
        seqlen_k: 517,
        heads_q: 4,
        heads_kv: 2,
        head_dim: 128,
        causal: true,
        softmax_scale: None,
        placement: Placement::Contiguous,
    };
    flash_attn_tests::assert_deterministic::<f16>(&attention, &case, &mut test_rng("repeated_runs_agree"));
    println!("repeated_runs_agree: ok");
}

/// Every attention kernel, as the driver on this machine compiled it, keeps
/// to registers: no spills, no stack (the build checks the same with its
/// own ptxas, whose version may differ from the driver's).
#[test]
fn kernels_as_the_driver_compiled_them_use_no_local_memory() {
    let Some((_context, attention)) = gpu("kernels_as_the_driver_compiled_them_use_no_local_memory") else {
        return;
    };
    let kernels = attention.kernel_resources().expect("kernel attributes");
    // The sm_90a kernels too, where they were loaded (compute capability
    // 9.0): the forward's and the main backward kernels of the same module.
    let sm90a = flash_attn::HOPPER_KERNELS.len() + flash_attn::HOPPER_BACKWARD_KERNELS.len();
    let sm90a = if attention.uses_sm90a() { sm90a } else { 0 };
    assert_eq!(kernels.len(), flash_attn::ATTENTION_KERNELS.len() + sm90a, "one entry per attention kernel");
    for k in &kernels {
        println!("{:<32} {:>4} registers {:>4} B local", k.name, k.registers, k.local_bytes);
        assert!(k.registers > 0 && k.registers <= 255, "{}: {} registers", k.name, k.registers);
    }
    let spilling: Vec<_> = kernels.iter().filter(|k| k.local_bytes > 0).collect();
    assert!(spilling.is_empty(), "kernels using local memory: {spilling:?}");
}

/// The small ragged causal GQA case that the GPU check runs under
/// compute-sanitizer memcheck (tails in both seqlens, unequal lengths).
#[test]
fn memcheck_ragged_causal_gqa() {
    let Some((_context, attention)) = gpu("memcheck_ragged_causal_gqa") else {
        return;
    };
    let mut rng = test_rng("memcheck_ragged_causal_gqa");
    for head_dim in [64, 128] {
        for (seqlen_q, seqlen_k) in [(77, 131), (131, 77)] {
            let case = Case {
                batch: 2,
                seqlen_q,
                seqlen_k,
                heads_q: 4,
                heads_kv: 2,
                head_dim,
                causal: true,
                softmax_scale: None,
                placement: Placement::Padded,
            };
            let r = run_case::<bf16>(&attention, &case, &mut rng);
            println!("memcheck_ragged_causal_gqa: ok d={head_dim} sq={seqlen_q} sk={seqlen_k}: {r:?}");
        }
    }
}

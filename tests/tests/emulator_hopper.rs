//! The sm_90a kernels' own code on the CPU emulator, against the f64
//! reference, each call going through the host's pipeline planned for
//! compute capability 9.0 (`KernelFamily::Sm90a`): the tensor maps the
//! planner describes, TMA loads into the mbarrier ring, `wgmma` from the
//! swizzled tiles and from registers, the producer/consumer hand-off and
//! the epilogue all have to be right for these to pass. Every row of the
//! sm_90a table runs, on shapes whose query and key counts end inside a
//! block, with GQA and padded strides. The planner is told of a GPU of
//! [`SM_COUNT`] SMs, so that the persistent blocks each take several tiles
//! (the ring's stages and the Q barriers' phases carry across tiles).

use flash_attn::pipeline::{sm90_block_m, validate, KernelFamily, OutputBuffers, Plan};
use flash_attn::reference::{attention_with_alibi, ReferenceProblem};
use flash_attn::Family;
use flash_attn::{AttentionParams, HOPPER_KERNELS};
use flash_attn_abi::kernels::Variant;
use flash_attn_tests::emulator::{self, Dtype, Memory, Output, Reference, Tensor, POISON};

/// The SMs of the GPU the calls are planned for: fewer than their tiles.
const SM_COUNT: usize = 3;

/// Strides of `shape` with padding between heads, rows and batches, in
/// whole 16 bytes (what TMA takes).
fn padded_strides(shape: [usize; 4]) -> [usize; 4] {
    let [_, s, h, d] = shape;
    let head = d + 8;
    let row = h * head + 16;
    [s * row + 24, row, head, 1]
}

/// Standard normal q, k and v of `[batch, seqlen_q, seqlen_k, heads_q,
/// heads_kv, head_dim]`, with padded strides.
fn random_qkv(dtype: Dtype, [batch, seqlen_q, seqlen_k, heads_q, heads_kv, d]: [usize; 6], seed: u64) -> [Tensor; 3] {
    let q_shape = [batch, seqlen_q, heads_q, d];
    let kv_shape = [batch, seqlen_k, heads_kv, d];
    [
        Tensor::random(q_shape, padded_strides(q_shape), dtype, seed),
        Tensor::random(kv_shape, padded_strides(kv_shape), dtype, seed + 1),
        Tensor::random(kv_shape, padded_strides(kv_shape), dtype, seed + 2),
    ]
}

/// Runs `kernel_name`'s instance on `batch` sequences of `seqlen_q` queries
/// over `seqlen_k` keys, 2 query heads sharing one key/value head, and
/// checks O and the LSE against the reference. The general kernels get a
/// causal window of 90 keys and a softcap.
fn check(kernel_name: &str, batch: usize, seqlen_q: usize, seqlen_k: usize, seed: u64) {
    let kernel = HOPPER_KERNELS.iter().find(|k| k.name == kernel_name).expect("a row of the sm_90a table");
    let params = match kernel.variant {
        Variant::General => {
            AttentionParams { causal: true, window: (Some(90), None), softcap: Some(10.0), ..Default::default() }
        }
        variant => AttentionParams { causal: variant == Variant::Causal, ..Default::default() },
    };
    check_with(kernel_name, batch, seqlen_q, seqlen_k, &params, seed, SM_COUNT);
}

/// As [`check`], with `params` (no ALiBi: [`check_alibi`]), planned for a
/// GPU of `sm_count` SMs.
fn check_with(
    kernel_name: &str,
    batch: usize,
    seqlen_q: usize,
    seqlen_k: usize,
    params: &AttentionParams,
    seed: u64,
    sm_count: usize,
) {
    let kernel = HOPPER_KERNELS.iter().find(|k| k.name == kernel_name).expect("a row of the sm_90a table");
    let dtype = kernel.dtype;
    let d = kernel.head_dim as usize;
    let [q, k, v] = random_qkv(dtype, [batch, seqlen_q, seqlen_k, 2, 1, d], seed);
    let q_shape = q.shape;
    let family = KernelFamily::Sm90a { sm_count };
    let (out, plan) = emulator::forward_on(dtype, &q, &k, &v, padded_strides(q_shape), params, 0, family)
        .unwrap_or_else(|e| panic!("{kernel_name}: {e}"));
    let ran = matches!(plan, Plan::Sm90(_)).then(|| plan.kernel().name());
    assert_eq!(ran, Some(kernel_name), "the plan chose another kernel");
    let case = format!("{kernel_name} b={batch} sq={seqlen_q} sk={seqlen_k} {params:?}");
    let errors =
        Reference::new(&q, &k, &v, dtype, params).compare(&out, dtype).unwrap_or_else(|e| panic!("{case}: {e}"));
    assert!(errors.within(dtype), "{case}: {}", errors.describe(dtype));
}

#[test]
fn every_sm90a_kernel_matches_the_reference() {
    for (i, kernel) in HOPPER_KERNELS.iter().enumerate() {
        // Two query blocks of 128 or 192 rows (the second ends at row 250),
        // keys ending inside a block; causal with more keys than queries
        // (bottom-right). d = 64's causal and general kernels come with two
        // tile heights (`sm90_block_m`): the causal one of 192 rows over
        // more than 1024 keys, the general one of 128 rows with the causal
        // mask and no window.
        let (d, rows, seed) = (kernel.head_dim, kernel.config.block_m(), 100 + i as u64);
        match kernel.variant {
            Variant::Causal if rows != sm90_block_m(d, true, 300) => check(kernel.name, 1, 250, 1100, seed),
            Variant::General if rows != sm90_block_m(d, false, 300) => {
                let params = AttentionParams { causal: true, softcap: Some(10.0), ..Default::default() };
                check_with(kernel.name, 1, 250, 300, &params, seed, SM_COUNT);
            }
            _ => check(kernel.name, 1, 250, 300, seed),
        }
    }
}

#[test]
fn causal_rows_that_see_no_key_and_more_stages_than_blocks() {
    for dtype in [Dtype::F16, Dtype::Bf16] {
        let name = format!("flash_fwd_sm90_d64_{}_causal", dtype.name());
        let short = format!("{name}_m128");
        // More queries than keys: the first 100 rows see no key (O = 0,
        // LSE = -inf). Then a key loop longer than the ring (5 blocks of
        // 128 over 2 stages) across two batches.
        check(&short, 1, 140, 40, 1);
        check(&short, 2, 40, 600, 2);
        let full = name.replace("causal", "full");
        check(&full, 2, 40, 600, 3);
        // The 192-row tiles over more than 1024 keys: rows below 100 see
        // none, then 9 blocks.
        check(&name, 1, 1125, 1025, 4);
    }
}

#[test]
fn one_block_takes_every_tile() {
    // One SM: a single block takes every tile (3 query blocks of 128 rows,
    // 2 heads), causal ones from the last query block, past
    // tiles whose rows see no key (more queries than keys: rows below 260
    // see none).
    for (name, seed) in [("flash_fwd_sm90_d64_f16_causal_m128", 5), ("flash_fwd_sm90_d128_bf16_full", 6)] {
        let causal = name.contains("_causal");
        let params = AttentionParams { causal, ..Default::default() };
        check_with(name, 1, 300, 40, &params, seed, 1);
        check_with(name, 1, 300, 300, &params, seed + 1, 1);
    }
}

#[test]
fn general_kernels_take_windows_and_softcap() {
    let names =
        ["flash_fwd_sm90_d64_f16_general", "flash_fwd_sm90_d128_bf16_general", "flash_fwd_sm90_d256_f16_general"];
    for (i, name) in names.into_iter().enumerate() {
        let seed = 200 + 10 * i as u64;
        // A window narrower than a key block on both sides, a one-sided
        // window beside the causal mask, a softcap, over more keys than
        // queries.
        let windowed = AttentionParams { window: (Some(70), Some(30)), ..Default::default() };
        check_with(name, 1, 150, 300, &windowed, seed, SM_COUNT);
        let left = AttentionParams { causal: true, window: (Some(200), None), ..Default::default() };
        check_with(name, 1, 150, 400, &left, seed + 1, SM_COUNT);
        // d = 64 takes its 128-row tiles for a short causal call.
        let short_causal = if name.contains("_d64_") { format!("{name}_m128") } else { name.to_string() };
        let softcap = AttentionParams { softcap: Some(5.0), causal: true, ..Default::default() };
        check_with(&short_causal, 2, 140, 200, &softcap, seed + 2, SM_COUNT);
    }
}

/// The general kernel `name` with ALiBi slopes per batch and head, causal,
/// with a softcap, against the f64 reference.
fn check_alibi(name: &str, batch: usize, seqlen_q: usize, seqlen_k: usize, seed: u64) {
    let kernel = HOPPER_KERNELS.iter().find(|k| k.name == name).expect("a row of the sm_90a table");
    let (dtype, d) = (kernel.dtype, kernel.head_dim as usize);
    let (heads_q, heads_kv) = (4, 2);
    let [q, k, v] = random_qkv(dtype, [batch, seqlen_q, seqlen_k, heads_q, heads_kv, d], seed);
    let q_shape = q.shape;
    let slopes: Vec<f32> = (0..batch * heads_q).map(|i| 0.05 + 0.1 * (i % 5) as f32).collect();
    let mut o = Tensor::filled(q_shape, padded_strides(q_shape), POISON);
    let mut lse = vec![f32::NAN; batch * heads_q * seqlen_q];
    let plan = {
        let mut memory = Memory::new();
        let params = AttentionParams {
            causal: true,
            softcap: Some(8.0),
            alibi_slopes: Some(memory.slice("alibi_slopes", &slopes)),
            ..Default::default()
        };
        let (q, k, v) = (memory.tensor("q", &q), memory.tensor("k", &k), memory.tensor("v", &v));
        let o = memory.output_tensor("o", &mut o);
        let lse_len = lse.len();
        let lse_addr = memory.output("lse", &mut lse);
        let call = validate(dtype, &q, &k, &v, OutputBuffers::Given { o: &o, lse_addr, lse_len }, &params)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        emulator::run_on(&call, &memory, 0, KernelFamily::Sm90a { sm_count: SM_COUNT })
            .unwrap_or_else(|e| panic!("{name}: {e}"))
    };
    assert_eq!((plan.family(), plan.kernel().name()), (Family::Sm90a, name), "the plan chose another kernel");
    let scale = 1.0 / (d as f64).sqrt();
    let mut problem = ReferenceProblem::dense(batch, seqlen_q, seqlen_k, heads_q, heads_kv, d, true, scale);
    problem.softcap = Some(8.0);
    let slopes: Vec<f64> = slopes.iter().map(|&s| f64::from(s)).collect();
    let expected = attention_with_alibi(&problem, Some(&slopes), &q.to_f64(dtype), &k.to_f64(dtype), &v.to_f64(dtype));
    let reference = Reference { o: expected.o, lse: expected.lse };
    let errors = reference.compare(&Output { o, lse }, dtype).unwrap_or_else(|e| panic!("{name} with ALiBi: {e}"));
    assert!(errors.within(dtype), "{name} with ALiBi: {}", errors.describe(dtype));
}

#[test]
fn general_kernels_take_alibi() {
    check_alibi("flash_fwd_sm90_d64_bf16_general_m128", 2, 150, 260, 300);
    check_alibi("flash_fwd_sm90_d64_f16_general", 1, 150, 1100, 305);
    check_alibi("flash_fwd_sm90_d128_f16_general", 1, 200, 130, 310);
}

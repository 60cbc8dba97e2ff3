//! The sm_90a kernels' own code on the CPU emulator, against the f64
//! reference, each call going through the host's pipeline planned for
//! compute capability 9.0 (`KernelFamily::Sm90a`): the tensor maps the
//! planner describes, TMA loads into the mbarrier ring, `wgmma` from the
//! swizzled tiles and from registers, the producer/consumer hand-off and
//! the epilogue all have to be right for these to pass. Every row of the
//! sm_90a table runs, on shapes whose query and key counts end inside a
//! block, with GQA and padded strides.

use flash_attn::pipeline::KernelFamily;
use flash_attn::{AttentionParams, HOPPER_KERNELS};
use flash_attn_abi::kernels::Variant;
use flash_attn_tests::emulator::{self, Dtype, Reference, Tensor};

/// Strides of `shape` with padding between heads, rows and batches, in
/// whole 16 bytes (what TMA takes).
fn padded_strides(shape: [usize; 4]) -> [usize; 4] {
    let [_, s, h, d] = shape;
    let head = d + 8;
    let row = h * head + 16;
    [s * row + 24, row, head, 1]
}

/// Runs `kernel_name`'s instance on `batch` sequences of `seqlen_q` queries
/// over `seqlen_k` keys, 2 query heads sharing one key/value head, and
/// checks O and the LSE against the reference.
fn check(kernel_name: &str, batch: usize, seqlen_q: usize, seqlen_k: usize, seed: u64) {
    let kernel = HOPPER_KERNELS.iter().find(|k| k.name == kernel_name).expect("a row of the sm_90a table");
    let dtype = kernel.dtype;
    let d = kernel.head_dim as usize;
    let (heads_q, heads_kv) = (2, 1);
    let q_shape = [batch, seqlen_q, heads_q, d];
    let kv_shape = [batch, seqlen_k, heads_kv, d];
    let q = Tensor::random(q_shape, padded_strides(q_shape), dtype, seed);
    let k = Tensor::random(kv_shape, padded_strides(kv_shape), dtype, seed + 1);
    let v = Tensor::random(kv_shape, padded_strides(kv_shape), dtype, seed + 2);
    let params = AttentionParams { causal: kernel.variant == Variant::Causal, ..Default::default() };
    let (out, plan) = emulator::forward_on(dtype, &q, &k, &v, padded_strides(q_shape), &params, 0, KernelFamily::Sm90a)
        .unwrap_or_else(|e| panic!("{kernel_name}: {e}"));
    let ran = plan.hopper.map(|h| h.kernel.name);
    assert_eq!(ran, Some(kernel_name), "the plan chose another kernel");
    let errors = Reference::new(&q, &k, &v, dtype, &params)
        .compare(&out, dtype)
        .unwrap_or_else(|e| panic!("{kernel_name} b={batch} sq={seqlen_q} sk={seqlen_k}: {e}"));
    assert!(errors.within(dtype), "{kernel_name} b={batch} sq={seqlen_q} sk={seqlen_k}: {}", errors.describe(dtype));
}

#[test]
fn every_sm90a_kernel_matches_the_reference() {
    for (i, kernel) in HOPPER_KERNELS.iter().enumerate() {
        // Two query blocks (the second ends at row 150), keys ending inside
        // a block; causal with more keys than queries (bottom-right).
        check(kernel.name, 1, 150, 200, 100 + i as u64);
    }
}

#[test]
fn causal_rows_that_see_no_key_and_more_stages_than_blocks() {
    for dtype in [Dtype::F16, Dtype::Bf16] {
        let name = if dtype == Dtype::F16 { "flash_fwd_sm90_d64_f16_causal" } else { "flash_fwd_sm90_d64_bf16_causal" };
        // More queries than keys: the first 100 rows see no key (O = 0,
        // LSE = -inf). Then a key loop longer than the ring (5 blocks of
        // 128 over 2 stages) across two batches.
        check(name, 1, 140, 40, 1);
        check(name, 2, 40, 600, 2);
        let full = name.replace("causal", "full");
        check(&full, 2, 40, 600, 3);
    }
}

//! The attention kernels, their own code run on the emulator, against the
//! f64 reference: indexing, masking, swizzles, fragment layouts and the
//! online softmax all have to be right for these to pass.

use flash_attn_kernels::emulated::DtypeValues;
use flash_attn_kernels::emulated::{forward, Reference, Tensor};
use flash_attn_kernels::entry::{kernel, KERNELS};
use proptest::prelude::*;

/// One problem for one kernel instance.
#[derive(Clone, Copy, Debug)]
struct Case {
    kernel: &'static str,
    batch: usize,
    seqlen_q: usize,
    seqlen_k: usize,
    heads_q: usize,
    heads_kv: usize,
    /// Padding between heads, rows and batches of every tensor (O included).
    strided: bool,
    seed: u64,
}

/// Strides of `shape`, padded by multiples of 8 elements when `strided`.
fn strides(shape: [usize; 4], strided: bool) -> [usize; 4] {
    if !strided {
        return Tensor::contiguous_strides(shape);
    }
    let [_, s, h, d] = shape;
    let head = d + 8;
    let row = h * head + 16;
    [s * row + 24, row, head, 1]
}

/// Runs `case`, panicking with the case and the first thing wrong.
fn check(case: Case) {
    let kernel = kernel(case.kernel).unwrap();
    let d = kernel.kernel.config.head_dim as usize;
    let q_shape = [case.batch, case.seqlen_q, case.heads_q, d];
    let kv_shape = [case.batch, case.seqlen_k, case.heads_kv, d];
    let q = Tensor::random(q_shape, strides(q_shape, case.strided), kernel.kernel.dtype, case.seed);
    let k = Tensor::random(kv_shape, strides(kv_shape, case.strided), kernel.kernel.dtype, case.seed + 1);
    let v = Tensor::random(kv_shape, strides(kv_shape, case.strided), kernel.kernel.dtype, case.seed + 2);
    let scale = 1.0 / (d as f32).sqrt();
    let out =
        forward(kernel, &q, &k, &v, strides(q_shape, case.strided), scale).unwrap_or_else(|e| panic!("{case:?}\n{e}"));
    let reference = Reference::new(
        &q,
        &k,
        &v,
        kernel.kernel.dtype,
        kernel.kernel.variant == flash_attn_abi::kernels::Variant::Causal,
        f64::from(scale),
    );
    let errors = reference.compare(&out, kernel.kernel.dtype).unwrap_or_else(|e| panic!("{case:?}\n{e}"));
    assert!(errors.within(kernel.kernel.dtype), "{case:?}\n{}", errors.describe(kernel.kernel.dtype));
}

#[test]
fn every_kernel_on_ragged_unequal_grouped_and_strided_problems() {
    for (i, k) in KERNELS.iter().enumerate() {
        let case = |batch, seqlen_q, seqlen_k, heads_q, heads_kv, strided| Case {
            kernel: k.kernel.name,
            batch,
            seqlen_q,
            seqlen_k,
            heads_q,
            heads_kv,
            strided,
            seed: 100 * i as u64 + seqlen_q as u64,
        };
        // Ragged seqlens, within and past one tile.
        check(case(1, 65, 65, 2, 2, false));
        // seqlen_q < seqlen_k, GQA (2 query heads per KV head).
        check(case(1, 17, 100, 4, 2, false));
        // seqlen_q > seqlen_k (causal: the first rows see no key), MQA, padded strides.
        check(case(1, 100, 17, 2, 1, true));
        // Single rows and keys, two batches.
        check(case(2, 1, 65, 2, 1, false));
        check(case(1, 1, 1, 1, 1, true));
    }
}

/// Runs every f16 kernel on 300 keys scaled by `factor(key)` (scaled
/// scores spanning tens of log2 units), against the reference.
fn check_with_key_factors(factor: impl Fn(usize, usize) -> f64) {
    for k in KERNELS.iter().filter(|k| k.kernel.dtype == flash_attn_kernels::emulated::Dtype::F16) {
        let d = k.kernel.config.head_dim as usize;
        let (seqlen_q, seqlen_k) = (40, 300);
        let q_shape = [1, seqlen_q, 2, d];
        let kv_shape = [1, seqlen_k, 1, d];
        let q = Tensor::random(q_shape, Tensor::contiguous_strides(q_shape), k.kernel.dtype, 7);
        let mut keys = Tensor::random(kv_shape, Tensor::contiguous_strides(kv_shape), k.kernel.dtype, 8);
        let v = Tensor::random(kv_shape, Tensor::contiguous_strides(kv_shape), k.kernel.dtype, 9);
        for key in 0..seqlen_k {
            let factor = factor(key, seqlen_k);
            for c in 0..d {
                let at = keys.index([0, key, 0, c]);
                let x = k.kernel.dtype.to_f64(keys.data()[at]) * factor;
                keys.data_mut()[at] = k.kernel.dtype.bits_of(x);
            }
        }
        let scale = 1.0 / (d as f32).sqrt();
        let strides = Tensor::contiguous_strides(q_shape);
        let out = forward(k, &q, &keys, &v, strides, scale).unwrap_or_else(|e| panic!("{}\n{e}", k.kernel.name));
        let reference = Reference::new(
            &q,
            &keys,
            &v,
            k.kernel.dtype,
            k.kernel.variant == flash_attn_abi::kernels::Variant::Causal,
            f64::from(scale),
        );
        let errors = reference.compare(&out, k.kernel.dtype).unwrap_or_else(|e| panic!("{}\n{e}", k.kernel.name));
        assert!(errors.within(k.kernel.dtype), "{}\n{}", k.kernel.name, errors.describe(k.kernel.dtype));
    }
}

/// Keys whose scores grow toward the first key: the key loop runs from the
/// last block to the first, so every row's max rises past the online
/// softmax's rescale threshold (2^8) again and again, by different amounts
/// per row, and the references move in late blocks as well as the first.
#[test]
fn every_f16_kernel_with_row_maxes_rising_block_after_block() {
    // Up to 13x at key 0: scaled scores span ~50 in log2.
    check_with_key_factors(|key, seqlen_k| 1.0 + 12.0 * (seqlen_k - key) as f64 / seqlen_k as f64);
}

/// Keys whose scores grow along each 64-key block: a row's max rises past
/// the threshold within a block, after the first half of its keys, so the
/// kernels that take the softmax in halves of keys must rescale the first
/// half's probabilities too.
#[test]
fn every_f16_kernel_with_row_maxes_rising_within_blocks() {
    check_with_key_factors(|key, _| 1.0 + 12.0 * (key % 64) as f64 / 64.0);
}

fn cases() -> impl Strategy<Value = Case> {
    (0..KERNELS.len(), 1..=2usize, 1..=130usize, 1..=130usize, 1..=2usize, 1..=3usize, any::<bool>(), any::<u64>())
        .prop_map(|(k, batch, seqlen_q, seqlen_k, heads_kv, group, strided, seed)| Case {
            kernel: KERNELS[k].kernel.name,
            batch,
            seqlen_q,
            seqlen_k,
            heads_q: heads_kv * group,
            heads_kv,
            strided,
            seed: seed >> 2,
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn random_valid_shapes(case in cases()) {
        check(case);
    }
}

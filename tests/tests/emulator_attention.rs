//! The attention kernels' own code on the CPU emulator, against the f64
//! reference run per sequence, every call going through the host's own
//! pipeline (`flash_attn::pipeline`: validate -> plan -> launches) with
//! host memory for device memory (`flash_attn_tests::emulator`). Each case
//! names the kernel the plan must choose, so that all 64 of the kernel
//! table run, and indexing, masking, swizzles, fragment layouts, the online
//! softmax, the features, split-KV with its merge and the KV cache append
//! all have to be right, as the host drives them, for these to pass.

use flash_attn::pipeline::{
    validate, validate_kvcache, validate_varlen, CacheArgs, KernelFamily, OffsetsArg, OutputBuffers, Plan, TableArg,
};
use flash_attn::reference::{self, ReferenceProblem};
use flash_attn::{AttentionKernel, AttentionParams, ATTENTION_KERNELS, HOPPER_KERNELS};
use flash_attn_abi::kernels::Variant;
use flash_attn_kernels::entry::KERNELS;
use flash_attn_tests::check::{self, LSE_TOLERANCE};
use flash_attn_tests::emulator::{self, Dtype, DtypeValues, Memory, Tensor, POISON};
use proptest::prelude::*;

/// Where a call's sequences come from, and so which validation it takes.
#[derive(Clone, Copy, Debug)]
enum Keys {
    /// Dense batches (`validate`): q `[batch, seqlen_q, heads_q, d]`, k and
    /// v `[batch, seqlen_k, heads_kv, d]`; every sequence of one length.
    Dense,
    /// Packed sequences (`validate_varlen`): q `[1, total_q, heads_q, d]`,
    /// k and v `[1, total_k, heads_kv, d]`, located by offsets.
    Packed,
    /// A KV cache (`validate_kvcache`): q `[batch, seqlen_q, heads_q, d]`
    /// (one length), batch `b`'s keys the first `seqlens_k[b]` slots of a
    /// cache `slack` slots longer than the longest; paged when `page_size`
    /// is given (pages handed out in a shuffled order). The call appends
    /// each batch's last `append` keys itself.
    Cache { page_size: Option<usize>, slack: usize, append: usize },
}

/// ALiBi slopes: none, one per query head, or one per batch and query head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Alibi {
    None,
    PerHead,
    PerBatch,
}

#[derive(Clone, Debug)]
struct Case {
    /// The kernel the plan must choose.
    kernel: &'static str,
    seqlens_q: Vec<usize>,
    seqlens_k: Vec<usize>,
    keys: Keys,
    heads_q: usize,
    heads_kv: usize,
    /// Padding between heads, rows and batches of every tensor (O included).
    strided: bool,
    causal: bool,
    window: (Option<usize>, Option<usize>),
    softcap: Option<f32>,
    alibi: Alibi,
    num_splits: Option<usize>,
    /// CTAs per wave for the split heuristic (0: it never splits).
    wave: usize,
    /// Scales key `j` of a sequence of `n` keys by `key_scale(j, n)`.
    key_scale: Option<fn(usize, usize) -> f64>,
    seed: u64,
    /// The kernels the call is planned for (`kernel` names a row of the
    /// sm_90a table for [`KernelFamily::Sm90a`]).
    family: KernelFamily,
}

impl Case {
    fn new(kernel: &'static str, seqlens_q: &[usize], seqlens_k: &[usize], keys: Keys) -> Self {
        Case {
            kernel,
            seqlens_q: seqlens_q.to_vec(),
            seqlens_k: seqlens_k.to_vec(),
            keys,
            heads_q: 2,
            heads_kv: 1,
            strided: false,
            causal: false,
            window: (None, None),
            softcap: None,
            alibi: Alibi::None,
            num_splits: None,
            wave: 0,
            key_scale: None,
            seed: 7,
            family: KernelFamily::Sm80,
        }
    }

    /// `batch` dense sequences of `seqlen_q` queries and `seqlen_k` keys.
    fn dense(kernel: &'static str, batch: usize, seqlen_q: usize, seqlen_k: usize) -> Self {
        Case::new(kernel, &vec![seqlen_q; batch], &vec![seqlen_k; batch], Keys::Dense)
    }
}

/// The kernel table's row called `name`.
fn table_row(name: &str) -> &'static AttentionKernel {
    ATTENTION_KERNELS.iter().find(|k| k.name == name).unwrap_or_else(|| panic!("no kernel {name}"))
}

/// The kernel of `kernel`'s head dim and element type in `variant`.
fn sibling(kernel: &AttentionKernel, variant: Variant) -> &'static str {
    let row =
        ATTENTION_KERNELS.iter().find(|k| (k.head_dim, k.dtype, k.variant) == (kernel.head_dim, kernel.dtype, variant));
    row.expect("every variant of every head dim").name
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

fn offsets(lengths: &[usize]) -> Vec<i32> {
    std::iter::once(0)
        .chain(lengths.iter().scan(0, |sum, &n| {
            *sum += n;
            Some(*sum as i32)
        }))
        .collect()
}

/// Row positions (`[b', s']` of the storage) of sequences of `lengths`:
/// packed one after another, or each in its own batch slot.
fn row_positions(lengths: &[usize], packed: bool) -> Vec<Vec<[usize; 2]>> {
    let starts = offsets(lengths);
    lengths
        .iter()
        .enumerate()
        .map(|(b, &n)| (0..n).map(|i| if packed { [0, starts[b] as usize + i] } else { [b, i] }).collect())
        .collect()
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// The values of sequence `b`'s rows of `t`, `[rows, heads, d]` in f64.
fn gather(t: &Tensor, rows: &[[usize; 2]], dtype: Dtype) -> Vec<f64> {
    let [_, _, heads, d] = t.shape;
    let mut out = Vec::with_capacity(rows.len() * heads * d);
    for &[bb, s] in rows {
        for h in 0..heads {
            for e in 0..d {
                out.push(dtype.to_f64(t.data()[t.index([bb, s, h, e])]));
            }
        }
    }
    out
}

/// A paged cache's block table for `batch` sequences of `pages_per_seq`
/// pages: page `p` of sequence `b` is physical page `(s i + 3) mod pages`,
/// `i = b * pages_per_seq + p`, `s` coprime with the pages: a permutation,
/// so that neighbours in a sequence are not neighbours in memory.
fn shuffled_table(batch: usize, pages_per_seq: usize) -> Vec<i32> {
    let pages = batch * pages_per_seq;
    let stride = (1..).map(|s| 7 * s + 3).find(|s| gcd(*s, pages) == 1).unwrap();
    (0..pages).map(|i| ((stride * i + 3) % pages) as i32).collect()
}

/// Runs `case` through validation, the plan and the emulator, then checks
/// that the plan chose `case.kernel`, that an append put every new key
/// where it belongs and moved nothing else, and every sequence's O and LSE
/// against a batch-1 reference of it, with no element of O outside the
/// sequences (padding included) written. Panics with the case and the
/// first thing wrong; returns the plan.
fn check(case: &Case) -> Plan {
    let (dtype, d) = match HOPPER_KERNELS.iter().find(|k| k.name == case.kernel) {
        Some(kernel) => (kernel.dtype, kernel.head_dim as usize),
        None => {
            let kernel = table_row(case.kernel);
            (kernel.dtype, kernel.head_dim as usize)
        }
    };
    let (heads_q, heads_kv) = (case.heads_q, case.heads_kv);
    let batch = case.seqlens_q.len();
    assert_eq!(case.seqlens_k.len(), batch, "{case:?}: one key length per sequence");
    let packed = matches!(case.keys, Keys::Packed);
    let max_q = *case.seqlens_q.iter().max().unwrap();
    let total_q: usize = case.seqlens_q.iter().sum();
    assert!(packed || case.seqlens_q.iter().all(|&n| n == max_q), "{case:?}: unpacked queries have one length");
    let random = |shape: [usize; 4], seed| Tensor::random(shape, strides(shape, case.strided), dtype, seed);

    let q_shape = if packed { [1, total_q, heads_q, d] } else { [batch, max_q, heads_q, d] };
    let q = random(q_shape, case.seed);
    let q_rows = row_positions(&case.seqlens_q, packed);

    let max_k = *case.seqlens_k.iter().max().unwrap();
    let append = match case.keys {
        Keys::Cache { append, .. } => append,
        _ => 0,
    };
    let (k_shape, key_rows, table, pages_per_seq) = match case.keys {
        Keys::Dense => {
            assert!(case.seqlens_k.iter().all(|&n| n == max_k), "{case:?}: dense keys have one length");
            ([batch, max_k, heads_kv, d], row_positions(&case.seqlens_k, false), Vec::new(), 0)
        }
        Keys::Packed => {
            ([1, case.seqlens_k.iter().sum(), heads_kv, d], row_positions(&case.seqlens_k, true), Vec::new(), 0)
        }
        Keys::Cache { page_size: None, slack, .. } => {
            ([batch, max_k + slack, heads_kv, d], row_positions(&case.seqlens_k, false), Vec::new(), 0)
        }
        Keys::Cache { page_size: Some(page_size), slack, .. } => {
            let pages_per_seq = (max_k + slack).div_ceil(page_size).max(1);
            let table = shuffled_table(batch, pages_per_seq);
            let rows = (0..batch)
                .map(|b| {
                    let page = |j: usize| table[b * pages_per_seq + j / page_size] as usize;
                    (0..case.seqlens_k[b]).map(|j| [page(j), j % page_size]).collect()
                })
                .collect();
            ([batch * pages_per_seq, page_size, heads_kv, d], rows, table, pages_per_seq)
        }
    };
    let mut k = random(k_shape, case.seed + 1);
    let mut v = random(k_shape, case.seed + 2);
    if let Some(scale) = case.key_scale {
        for (rows, &n) in key_rows.iter().zip(&case.seqlens_k) {
            for (j, &[bb, s]) in rows.iter().enumerate() {
                for (h, e) in (0..heads_kv).flat_map(|h| (0..d).map(move |e| (h, e))) {
                    let at = k.index([bb, s, h, e]);
                    k.data_mut()[at] = dtype.bits_of(dtype.to_f64(k.data()[at]) * scale(j, n));
                }
            }
        }
    }
    let cached: Vec<i32> =
        case.seqlens_k.iter().map(|&n| n.checked_sub(append).expect("keys to append") as i32).collect();
    let new = (append > 0).then(|| {
        let shape = [batch, append, heads_kv, d];
        (random(shape, case.seed + 3), random(shape, case.seed + 4))
    });
    let before = (append > 0).then(|| (k.clone(), v.clone()));
    let slopes: Vec<f32> = match case.alibi {
        Alibi::None => Vec::new(),
        Alibi::PerHead => (0..heads_q).map(|i| 0.05 + 0.1 * (i % 5) as f32).collect(),
        Alibi::PerBatch => (0..batch * heads_q).map(|i| 0.05 + 0.1 * (i % 5) as f32).collect(),
    };
    let (cu_q, cu_k) = (offsets(&case.seqlens_q), offsets(&case.seqlens_k));

    let mut o = Tensor::filled(q_shape, strides(q_shape, case.strided), POISON);
    let mut lse = vec![f32::NAN; if packed { heads_q * total_q } else { batch * heads_q * max_q }];
    let plan = {
        let mut memory = Memory::new();
        let slopes = (case.alibi != Alibi::None).then(|| memory.slice("alibi_slopes", &slopes));
        let params = AttentionParams {
            causal: case.causal,
            softmax_scale: None,
            window: case.window,
            softcap: case.softcap,
            alibi_slopes: slopes,
            num_splits: case.num_splits,
            deterministic: false,
        };
        let q = memory.tensor("q", &q);
        let lse_len = lse.len();
        let o = memory.output_tensor("o", &mut o);
        let lse_addr = memory.output("lse", &mut lse);
        let outputs = OutputBuffers::Given { o: &o, lse_addr, lse_len };
        let call = match case.keys {
            Keys::Dense => validate(dtype, &q, &memory.tensor("k", &k), &memory.tensor("v", &v), outputs, &params),
            Keys::Packed => {
                let (k, v) = (memory.tensor("k", &k), memory.tensor("v", &v));
                let cu_q = OffsetsArg { host: &cu_q, addr: memory.input("cu_seqlens_q", &cu_q) };
                let cu_k = OffsetsArg { host: &cu_k, addr: memory.input("cu_seqlens_k", &cu_k) };
                validate_varlen(dtype, &q, &k, &v, cu_q, cu_k, outputs, &params)
            }
            Keys::Cache { page_size, .. } => {
                let (k, v, new) = match &new {
                    None => (memory.tensor("k_cache", &k), memory.tensor("v_cache", &v), None),
                    Some((k_new, v_new)) => (
                        memory.cache_tensor("k_cache", &mut k),
                        memory.cache_tensor("v_cache", &mut v),
                        Some((memory.tensor("k_new", k_new), memory.tensor("v_new", v_new))),
                    ),
                };
                let block_table = page_size.map(|_| TableArg {
                    entries: &table,
                    pages_per_seq,
                    addr: memory.input("block_table", &table),
                });
                let seqlens_addr = memory.input("cache_seqlens", &cached);
                let cache = CacheArgs { k, v, new, seqlens: &cached, seqlens_addr, block_table };
                validate_kvcache(dtype, &q, &cache, outputs, &params)
            }
        }
        .unwrap_or_else(|e| panic!("{case:?}: refused: {e}"));
        emulator::run_on(&call, &memory, case.wave, case.family).unwrap_or_else(|e| panic!("{case:?}\n{e}"))
    };
    let chosen = plan.kernel().name();
    assert_eq!(chosen, case.kernel, "{case:?}: the plan chose {chosen}");
    if let Some(num_splits) = case.num_splits {
        assert_eq!(plan.args().num_splits as usize, num_splits, "{case:?}: split");
    }
    if let (Some((k_new, v_new)), Some((k_before, v_before))) = (&new, &before) {
        check_append(case, &key_rows, &cached, [&k, &v], [k_new, v_new], [k_before, v_before]);
    }

    // Every sequence against its own reference.
    let scale = 1.0 / (d as f32).sqrt();
    let (mut actual_o, mut expected_o, mut lse_error) = (Vec::new(), Vec::new(), 0.0f64);
    let mut written = vec![false; o.data().len()];
    for b in 0..batch {
        let (sq, sk) = (case.seqlens_q[b], case.seqlens_k[b]);
        if sq == 0 {
            continue;
        }
        let mut problem = ReferenceProblem::dense(1, sq, sk, heads_q, heads_kv, d, case.causal, f64::from(scale));
        problem.window = case.window;
        problem.softcap = case.softcap.map(f64::from);
        let alibi: Vec<f64> = match case.alibi {
            Alibi::None => Vec::new(),
            Alibi::PerHead => slopes.iter().map(|&s| f64::from(s)).collect(),
            Alibi::PerBatch => slopes[b * heads_q..][..heads_q].iter().map(|&s| f64::from(s)).collect(),
        };
        let expected = reference::attention_with_alibi(
            &problem,
            (case.alibi != Alibi::None).then_some(&alibi[..]),
            &gather(&q, &q_rows[b], dtype),
            &gather(&k, &key_rows[b], dtype),
            &gather(&v, &key_rows[b], dtype),
        );
        for (i, &[bb, s]) in q_rows[b].iter().enumerate() {
            for h in 0..heads_q {
                let row = || format!("{case:?}: batch {b} row {i} head {h}");
                for e in 0..d {
                    let at = o.index([bb, s, h, e]);
                    written[at] = true;
                    let actual = dtype.to_f64(o.data()[at]);
                    assert!(!actual.is_nan(), "{}: O[{e}] is NaN (never written)", row());
                    actual_o.push(actual);
                    expected_o.push(expected.o[(i * heads_q + h) * d + e]);
                }
                let lse_at = if packed { h * total_q + cu_q[b] as usize + i } else { (b * heads_q + h) * max_q + i };
                let (actual, wanted) = (lse[lse_at], expected.lse[h * sq + i]);
                if wanted == f64::NEG_INFINITY {
                    assert_eq!(actual, f32::NEG_INFINITY, "{}: sees no key, LSE {actual}", row());
                    let zero = (0..d).all(|e| dtype.to_f64(o.data()[o.index([bb, s, h, e])]) == 0.0);
                    assert!(zero, "{}: sees no key, O is not 0", row());
                } else {
                    assert!(actual.is_finite(), "{}: LSE {actual}, reference {wanted}", row());
                    lse_error = lse_error.max((f64::from(actual) - wanted).abs());
                }
            }
        }
    }
    if let Some(i) = written.iter().zip(o.data()).position(|(&w, &x)| !w && x != POISON) {
        panic!("{case:?}: O element {i}, outside every sequence, was written");
    }
    check::assert_close(&format!("{case:?}: O"), dtype, &actual_o, &expected_o, d);
    assert!(lse_error <= LSE_TOLERANCE, "{case:?}: LSE error {lse_error:.2e}");
    plan
}

/// After an append: each batch's new keys and values at positions
/// `cached[b]..` of its sequence (`key_rows`), every other element of the
/// caches (padding included) as it was.
fn check_append(
    case: &Case,
    key_rows: &[Vec<[usize; 2]>],
    cached: &[i32],
    caches: [&Tensor; 2],
    new: [&Tensor; 2],
    before: [&Tensor; 2],
) {
    for ((cache, new), before) in caches.into_iter().zip(new).zip(before) {
        let [batch, appended, heads_kv, d] = new.shape;
        let mut changed = vec![false; cache.data().len()];
        for b in 0..batch {
            for t in 0..appended {
                let [slot, row] = key_rows[b][cached[b] as usize + t];
                for (h, e) in (0..heads_kv).flat_map(|h| (0..d).map(move |e| (h, e))) {
                    let at = cache.index([slot, row, h, e]);
                    let wanted = new.data()[new.index([b, t, h, e])];
                    assert_eq!(cache.data()[at], wanted, "{case:?}: new key {t} of batch {b}, head {h}, element {e}");
                    changed[at] = true;
                }
            }
        }
        let moved = (0..changed.len()).find(|&i| !changed[i] && cache.data()[i] != before.data()[i]);
        assert!(moved.is_none(), "{case:?}: cache element {moved:?}, not appended to, changed");
    }
}

/// The five problems of the dense and causal kernels: ragged sequences
/// within and past one tile; seqlen_q < seqlen_k with GQA; seqlen_q >
/// seqlen_k (causal: the first rows see no key) with MQA and padded
/// strides; single rows over two batches; a single row and key.
fn dense_problems(kernel: &'static str, causal: bool, seed: u64) -> Vec<Case> {
    let case = |batch, seqlen_q, seqlen_k, heads_q, heads_kv, strided| Case {
        heads_q,
        heads_kv,
        strided,
        causal,
        seed: seed + seqlen_q as u64,
        ..Case::dense(kernel, batch, seqlen_q, seqlen_k)
    };
    vec![
        case(1, 65, 65, 2, 2, false),
        case(1, 17, 100, 4, 2, false),
        case(1, 100, 17, 2, 1, true),
        // A single grouped row is viewed as rows of one head (the GQA decode
        // layout), where the causal mask is void: the dense kernel runs it
        // causal or not; the causal kernel gets its single rows ungrouped.
        Case { causal: true, ..case(2, 1, 65, 2, if causal { 2 } else { 1 }, false) },
        case(1, 1, 1, 1, 1, true),
    ]
}

/// The same problems for a general kernel, each with features, as the plan
/// runs it for more than the decode kernels' 16 query rows: a two-sided
/// window; causal with a softcap; causal ALiBi where the first rows see no
/// key, padded; packed sequences, one of a single row and one of a single
/// key; and a padded KV cache whose one key the call appends.
fn general_problems(kernel: &'static str, seed: u64) -> Vec<Case> {
    let dense = |seqlen_q, seqlen_k, heads_q, heads_kv| Case {
        heads_q,
        heads_kv,
        seed: seed + seqlen_q as u64,
        ..Case::dense(kernel, 1, seqlen_q, seqlen_k)
    };
    vec![
        Case { window: (Some(30), Some(5)), ..dense(65, 65, 2, 2) },
        Case { causal: true, softcap: Some(2.0), ..dense(17, 100, 4, 2) },
        Case { causal: true, alibi: Alibi::PerHead, strided: true, ..dense(100, 17, 2, 1) },
        Case { seed: seed + 1, ..Case::new(kernel, &[1, 17], &[65, 1], Keys::Packed) },
        Case {
            heads_q: 1,
            strided: true,
            causal: true,
            seed: seed + 2,
            ..Case::new(kernel, &[17], &[1], Keys::Cache { page_size: None, slack: 7, append: 1 })
        },
    ]
}

/// The same problems for a decode kernel, which the plan runs for at most
/// 16 query rows with features: a two-sided window; causal with a softcap;
/// causal ALiBi where rows see no key, padded; single grouped rows with a
/// softcap (the GQA decode layout: 2 rows of one head); a single row over a
/// padded paged cache whose one key the call appends.
fn decode_problems(kernel: &'static str, seed: u64) -> Vec<Case> {
    let dense = |batch, seqlen_q, seqlen_k, heads_q, heads_kv| Case {
        heads_q,
        heads_kv,
        seed: seed + seqlen_q as u64,
        ..Case::dense(kernel, batch, seqlen_q, seqlen_k)
    };
    vec![
        Case { window: (Some(30), Some(5)), ..dense(1, 16, 65, 2, 2) },
        Case { causal: true, softcap: Some(2.0), ..dense(1, 16, 100, 4, 2) },
        Case { causal: true, alibi: Alibi::PerBatch, strided: true, ..dense(1, 16, 17, 2, 1) },
        Case { softcap: Some(5.0), ..dense(2, 1, 65, 2, 1) },
        Case {
            heads_q: 1,
            strided: true,
            seed: seed + 3,
            ..Case::new(kernel, &[1], &[1], Keys::Cache { page_size: Some(64), slack: 0, append: 1 })
        },
    ]
}

#[test]
fn every_kernel_on_ragged_unequal_grouped_and_strided_problems() {
    // The emulator has every kernel of the table, as the table describes it.
    assert_eq!(KERNELS.len(), ATTENTION_KERNELS.len());
    for row in ATTENTION_KERNELS {
        let host = flash_attn_kernels::entry::kernel(row.name).unwrap_or_else(|| panic!("{} not emulated", row.name));
        assert_eq!(host.kernel, *row);
    }
    for (i, kernel) in ATTENTION_KERNELS.iter().enumerate() {
        let seed = 100 * i as u64;
        let cases = match kernel.variant {
            Variant::Full => dense_problems(kernel.name, false, seed),
            Variant::Causal => dense_problems(kernel.name, true, seed),
            Variant::General => general_problems(kernel.name, seed),
            Variant::Decode => decode_problems(kernel.name, seed),
        };
        for case in &cases {
            check(case);
        }
    }
}

/// Runs every f16 kernel on 300 keys scaled by `factor(key, 300)` (scaled
/// scores spanning tens of log2 units), against the reference: 40 query
/// rows over them, dense or causal for the dense kernels, packed (one
/// sequence: the same problem) for the general ones, and 16 rows over a KV
/// cache of them for the decode ones.
fn check_with_key_factors(factor: fn(usize, usize) -> f64) {
    for kernel in ATTENTION_KERNELS.iter().filter(|k| k.dtype == Dtype::F16) {
        let case = match kernel.variant {
            Variant::Full => Case::dense(kernel.name, 1, 40, 300),
            Variant::Causal => Case { causal: true, ..Case::dense(kernel.name, 1, 40, 300) },
            Variant::General => Case::new(kernel.name, &[40], &[300], Keys::Packed),
            Variant::Decode => {
                Case::new(kernel.name, &[16], &[300], Keys::Cache { page_size: None, slack: 0, append: 0 })
            }
        };
        check(&Case { key_scale: Some(factor), ..case });
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

/// A random call for kernel `KERNELS[k]`: random sizes, strides and (for
/// the general and decode kernels) one of six features, shaped so that the
/// plan must choose that kernel (features with more than 16 query rows for
/// the general ones, at most 16 for the decode ones).
#[allow(clippy::too_many_arguments)]
fn random_case(
    k: usize,
    batch: usize,
    seqlen_q: usize,
    seqlen_k: usize,
    heads_kv: usize,
    group: usize,
    strided: bool,
    feature: usize,
    seed: u64,
) -> Case {
    let kernel = &ATTENTION_KERNELS[k];
    let heads_q = heads_kv * group;
    let base =
        |seqlen_q| Case { heads_q, heads_kv, strided, seed, ..Case::dense(kernel.name, batch, seqlen_q, seqlen_k) };
    let seqlen_q = match kernel.variant {
        Variant::Full => return base(seqlen_q),
        // A single grouped row would run on the dense kernel (GQA decode layout).
        Variant::Causal => {
            return Case { causal: true, heads_q: if seqlen_q == 1 { heads_kv } else { heads_q }, ..base(seqlen_q) }
        }
        Variant::General => 17 + seqlen_q % 114,
        Variant::Decode => 1 + seqlen_q % 16,
    };
    // Ragged keys for the packed and cached sequences.
    let seqlens_k: Vec<usize> = (0..batch).map(|b| (seqlen_k >> b).max(1)).collect();
    match feature {
        0 => Case { window: (Some(seqlen_k % 50), Some(seqlen_q % 7)), ..base(seqlen_q) },
        1 => Case { softcap: Some(0.5 + (seed % 8) as f32), causal: seed % 2 == 0, ..base(seqlen_q) },
        2 => Case { alibi: Alibi::PerBatch, causal: true, ..base(seqlen_q) },
        3 => {
            // The longest sequence first: the plan counts the longest's rows.
            let seqlens_q: Vec<usize> = (0..batch).map(|b| seqlen_q >> b).collect();
            Case { seqlens_q, seqlens_k, keys: Keys::Packed, ..base(seqlen_q) }
        }
        4 => {
            let keys = Keys::Cache { page_size: None, slack: seed as usize % 9, append: 0 };
            Case { seqlens_k, keys, causal: true, ..base(seqlen_q) }
        }
        _ => {
            let keys = Keys::Cache { page_size: Some(64), slack: 0, append: 1 };
            Case { seqlens_k, keys, ..base(seqlen_q) }
        }
    }
}

fn cases() -> impl Strategy<Value = Case> {
    (
        0..ATTENTION_KERNELS.len(),
        1..=2usize,
        1..=130usize,
        1..=130usize,
        1..=2usize,
        1..=3usize,
        any::<bool>(),
        0..6usize,
        any::<u64>(),
    )
        .prop_map(|(k, batch, seqlen_q, seqlen_k, heads_kv, group, strided, feature, seed)| {
            random_case(k, batch, seqlen_q, seqlen_k, heads_kv, group, strided, feature, seed >> 2)
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn random_valid_calls(case in cases()) {
        check(&case);
    }
}

#[test]
fn packed_variable_lengths_with_empty_sequences() {
    for name in ["flash_fwd_d64_f16_general", "flash_fwd_d128_bf16_general", "flash_fwd_d96_f16_general"] {
        let mut case = Case::new(name, &[70, 0, 1, 129], &[33, 5, 0, 200], Keys::Packed);
        check(&case);
        case.causal = true;
        case.heads_q = 4;
        case.heads_kv = 2;
        check(&case);
    }
}

#[test]
fn sm90a_general_kernels_take_packed_sequences() {
    // Sequences of every kind: empty, a single row or key, more rows than
    // keys, key blocks that run into the next sequence's keys, the longest
    // (300 rows) three query blocks of 128. The sm_90a tiles of the
    // shorter sequences past their rows see no key and write nothing.
    let (seqlens_q, seqlens_k) = ([0, 70, 1, 129, 300, 40], [5, 33, 0, 200, 260, 130]);
    let family = KernelFamily::Sm90a { sm_count: 3 };
    for (i, name) in
        ["flash_fwd_sm90_d64_f16_general", "flash_fwd_sm90_d96_bf16_general", "flash_fwd_sm90_d128_f16_general"]
            .into_iter()
            .enumerate()
    {
        let seed = 40 + 10 * i as u64;
        let case = Case { family, seed, ..Case::new(name, &seqlens_q, &seqlens_k, Keys::Packed) };
        check(&case);
        // d = 64's causal calls over at most 1024 keys take 128-row tiles.
        let kernel = match name {
            "flash_fwd_sm90_d64_f16_general" => "flash_fwd_sm90_d64_f16_general_m128",
            other => other,
        };
        check(&Case { kernel, causal: true, heads_q: 4, heads_kv: 2, strided: true, seed: seed + 1, ..case.clone() });
        check(&Case {
            window: (Some(50), Some(20)),
            softcap: Some(5.0),
            alibi: Alibi::PerBatch,
            seed: seed + 2,
            ..case.clone()
        });
    }
    // Tile dim 256: four slabs of Q and K, 64 keys a stage.
    let case = Case {
        family,
        causal: true,
        ..Case::new("flash_fwd_sm90_d224_bf16_general", &[90, 150], &[200, 70], Keys::Packed)
    };
    check(&case);
}

#[test]
fn local_windows_with_and_without_causal() {
    for (name, window, causal) in [
        ("flash_fwd_d64_f16_general", (Some(20), Some(5)), false),
        ("flash_fwd_d64_bf16_general", (Some(40), None), true),
        ("flash_fwd_d128_f16_general", (None, Some(1)), false),
        // A window of nothing to the right and everything to the left is
        // the causal mask, and the plan runs it on the causal kernel.
        ("flash_fwd_d128_f16_causal", (None, Some(0)), false),
        ("flash_fwd_d32_f16_general", (Some(0), Some(0)), false),
        ("flash_fwd_d256_f16_general", (Some(70), Some(3)), false),
    ] {
        // seqlen_q < seqlen_k and > seqlen_k: the window follows the bottom-right diagonal.
        for (sq, sk) in [(150, 300), (200, 90)] {
            check(&Case { window, causal, seed: sq as u64, ..Case::dense(name, 1, sq, sk) });
        }
    }
}

#[test]
fn softcap_and_alibi_alone_and_together() {
    // Keys of unequal lengths: a KV cache's.
    let keys = Keys::Cache { page_size: None, slack: 0, append: 0 };
    for name in ["flash_fwd_d64_f16_general", "flash_fwd_d128_bf16_general", "flash_fwd_d160_f16_general"] {
        let mut case = Case::new(name, &[100, 100], &[130, 64], keys);
        case.softcap = Some(0.5);
        check(&case);
        case.softcap = None;
        case.alibi = Alibi::PerHead;
        check(&case);
        case.softcap = Some(2.0);
        case.alibi = Alibi::PerBatch;
        case.causal = true;
        check(&case);
    }
}

#[test]
fn kv_cache_lengths_paged_and_contiguous() {
    // d=224's decode kernel: each warp walking rows of 28 chunks into its own stage.
    for (name, seqlen_q) in [
        ("flash_fwd_d64_f16_general", 17),
        ("flash_fwd_d128_f16_decode", 16),
        ("flash_fwd_d192_bf16_general", 17),
        ("flash_fwd_d224_bf16_decode", 3),
    ] {
        let cache = |page_size| Keys::Cache { page_size, slack: 40, append: 0 };
        // Causal: batch 2's one key leaves all but its last row without one.
        let mut case = Case::new(name, &[seqlen_q; 3], &[150, 64, 1], cache(None));
        case.causal = true;
        check(&case);
        case.keys = cache(Some(64));
        check(&case);
        case.keys = cache(Some(128));
        case.causal = false;
        case.heads_q = 8;
        case.heads_kv = 1;
        check(&case);
        // One query row of 8 heads per KV head: the GQA decode layout, over pages.
        let decode = sibling(table_row(name), Variant::Decode);
        let plan = check(&Case { seqlens_q: vec![1; 3], kernel: decode, causal: true, ..case });
        assert_eq!((plan.args().seqlen_q, plan.args().heads_q), (8, 1), "{name}: the GQA decode layout");
    }
}

#[test]
fn split_kv_matches_one_pass_and_handles_empty_splits() {
    let cache = |page_size| Keys::Cache { page_size, slack: 0, append: 0 };
    for (name, seqlen_q) in
        [("flash_fwd_d128_f16_decode", 5), ("flash_fwd_d64_bf16_decode", 5), ("flash_fwd_d64_f16_general", 20)]
    {
        for num_splits in [2, 3, 7] {
            // 300 keys in 32- or 64-key blocks: some splits get none when there are 7.
            let mut case = Case::new(name, &[seqlen_q; 2], &[300, 40], cache(None));
            case.num_splits = Some(num_splits);
            case.heads_q = 4;
            check(&case);
            case.causal = true;
            case.keys = cache(Some(64));
            case.alibi = Alibi::PerBatch;
            check(&case);
        }
    }
    let mut case = Case::new("flash_fwd_d128_f16_general", &[40, 0, 70], &[90, 10, 200], Keys::Packed);
    (case.num_splits, case.window) = (Some(3), (Some(50), None));
    check(&case);
}

#[test]
fn split_kv_merges_more_splits_than_a_warp_has_lanes() {
    // The merge gives each lane up to MAX_SPLITS / 32 splits: 40 splits of
    // 36 key blocks (a few empty), and 128 (most empty).
    let keys = Keys::Cache { page_size: None, slack: 0, append: 0 };
    for num_splits in [40, 128] {
        let mut case = Case::new("flash_fwd_d64_f16_decode", &[3, 3], &[2300, 700], keys);
        case.num_splits = Some(num_splits);
        check(&case);
    }
}

#[test]
fn the_split_heuristic_splits_a_small_grid_over_many_keys() {
    // 2 batches * 2 heads of one 16-row block over 72 key blocks, on a GPU
    // of 8 CTA slots: the heuristic's split, and its merge, as planned.
    let keys = Keys::Cache { page_size: None, slack: 0, append: 0 };
    let case = Case { wave: 8, ..Case::new("flash_fwd_d64_f16_decode", &[3, 3], &[2300, 700], keys) };
    let plan = check(&case);
    assert!(plan.args().num_splits > 1, "the heuristic did not split: {}", plan.args().num_splits);
}

#[test]
fn append_writes_new_keys_after_the_cached_ones_then_attention_sees_them() {
    // 5 and 64 cached keys, 3 appended to each (batch 1's cross into its
    // second page), then 3 causal queries over them: the new keys are the
    // last queries' diagonal.
    for page_size in [None, Some(64)] {
        let keys = Keys::Cache { page_size, slack: 61, append: 3 };
        let mut case = Case::new("flash_fwd_d64_f16_decode", &[3, 3], &[8, 67], keys);
        (case.heads_q, case.heads_kv, case.causal, case.seed) = (4, 2, true, 11);
        check(&case);
    }
}

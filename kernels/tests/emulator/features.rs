//! The general kernels' features on the emulator, against the f64 reference
//! run per sequence: variable lengths (empty sequences included), KV caches
//! (contiguous and paged, with appends), local windows with and without
//! causal masking, softcap, ALiBi, split-KV with its combine kernel, and the
//! decode tile config.

use flash_attn_kernels::emulated::Dtype;
use flash_attn_kernels::emulated::DtypeValues;
use flash_attn_kernels::emulated::{append_kv, forward_general, Features, Output, Tensor, POISON};
use flash_attn_kernels::entry::{kernel, HostKernel};
use flash_attn_kernels::reference::{self, ReferenceProblem};

/// Where each batch's keys live.
#[derive(Clone, Debug)]
enum Keys {
    /// `[batch, max seqlen_k, heads, d]`, each batch's keys first.
    Dense,
    /// `[1, total_k, heads, d]` by `cu_seqlens_k`.
    Packed,
    /// A paged cache: pages of `page_size` keys, handed out in a shuffled
    /// order, `[pages, page_size, heads, d]`.
    Paged { page_size: usize },
}

#[derive(Clone, Debug)]
struct Case {
    kernel: &'static str,
    seqlens_q: Vec<usize>,
    seqlens_k: Vec<usize>,
    /// Queries packed by `cu_seqlens_q` (else `[batch, max, heads, d]`).
    packed_q: bool,
    keys: Keys,
    /// Keys per batch come from `seqused_k` (a cache's lengths), with the
    /// key storage holding this many more rows than used.
    cache_slack: Option<usize>,
    heads_q: usize,
    heads_kv: usize,
    causal: bool,
    window: (Option<usize>, Option<usize>),
    softcap: Option<f32>,
    alibi: bool,
    num_splits: u32,
    seed: u64,
}

impl Case {
    fn new(kernel: &'static str, seqlens_q: &[usize], seqlens_k: &[usize]) -> Self {
        Case {
            kernel,
            seqlens_q: seqlens_q.to_vec(),
            seqlens_k: seqlens_k.to_vec(),
            packed_q: false,
            keys: Keys::Dense,
            cache_slack: None,
            heads_q: 2,
            heads_kv: 1,
            causal: false,
            window: (None, None),
            softcap: None,
            alibi: false,
            num_splits: 1,
            seed: 7,
        }
    }
}

fn offsets(lengths: &[usize]) -> Vec<i32> {
    std::iter::once(0)
        .chain(lengths.iter().scan(0, |sum, &n| {
            *sum += n;
            Some(*sum as i32)
        }))
        .collect()
}

/// The storage of one sequence set: a random tensor and where row `i` of
/// batch `b` lives in it (`[b', s', _, _]`).
struct Storage {
    tensor: Tensor,
    rows: Vec<Vec<[usize; 2]>>,
}

impl Storage {
    fn gather(&self, b: usize, heads: usize, d: usize, dtype: Dtype) -> Vec<f64> {
        let mut out = Vec::new();
        for &[bb, s] in &self.rows[b] {
            for h in 0..heads {
                for e in 0..d {
                    out.push(dtype.to_f64(self.tensor.data()[self.tensor.index([bb, s, h, e])]));
                }
            }
        }
        out
    }
}

/// Row positions of sequences of `lengths`: packed one after another, or
/// each in its own batch slot.
fn row_positions(lengths: &[usize], packed: bool) -> Vec<Vec<[usize; 2]>> {
    let starts = offsets(lengths);
    lengths
        .iter()
        .enumerate()
        .map(|(b, &n)| (0..n).map(|i| if packed { [0, starts[b] as usize + i] } else { [b, i] }).collect())
        .collect()
}

fn random(shape: [usize; 4], dtype: Dtype, seed: u64) -> Tensor {
    // Never empty: a tensor of zero rows still needs an allocation.
    let shape = [shape[0].max(1), shape[1].max(1), shape[2], shape[3]];
    Tensor::random(shape, Tensor::contiguous_strides(shape), dtype, seed)
}

fn check(case: &Case) {
    let kernel: &HostKernel = kernel(case.kernel).unwrap();
    let (dtype, d) = (kernel.kernel.dtype, kernel.kernel.config.head_dim as usize);
    let batch = case.seqlens_q.len();
    let max_q = *case.seqlens_q.iter().max().unwrap();
    let (heads_q, heads_kv) = (case.heads_q, case.heads_kv);
    let total_q: usize = case.seqlens_q.iter().sum();
    assert!(case.packed_q || case.seqlens_q.iter().all(|&n| n == max_q), "unpacked queries have one length");

    let q_shape = if case.packed_q { [1, total_q, heads_q, d] } else { [batch, max_q, heads_q, d] };
    let q = Storage { tensor: random(q_shape, dtype, case.seed), rows: row_positions(&case.seqlens_q, case.packed_q) };

    let slack = case.cache_slack.unwrap_or(0);
    let stored_k: Vec<usize> = case.seqlens_k.iter().map(|n| n + slack).collect();
    let mut features = Features {
        causal: case.causal,
        window: case.window,
        softcap: case.softcap,
        num_splits: case.num_splits,
        ..Features::default()
    };
    let (k_shape, key_rows) = match &case.keys {
        Keys::Dense => ([batch, *stored_k.iter().max().unwrap(), heads_kv, d], row_positions(&case.seqlens_k, false)),
        Keys::Packed => {
            features.cu_seqlens_k = Some(offsets(&stored_k));
            let rows = row_positions(&stored_k, true);
            let used = rows.iter().zip(&case.seqlens_k).map(|(r, &n)| r[..n].to_vec()).collect();
            ([1, stored_k.iter().sum(), heads_kv, d], used)
        }
        Keys::Paged { page_size } => {
            let pages_per_sequence = stored_k.iter().max().unwrap().div_ceil(*page_size).max(1);
            let pages = batch * pages_per_sequence;
            // Page p of batch b is physical page (7 p' + 3) mod pages, p' = b * per + p:
            // a permutation, so that neighbours in a sequence are not neighbours in memory.
            let stride = (1..).map(|s| 7 * s + 3).find(|s| gcd(*s, pages) == 1).unwrap();
            let table: Vec<i32> = (0..pages).map(|i| ((stride * i + 3) % pages) as i32).collect();
            let rows = (0..batch)
                .map(|b| {
                    (0..case.seqlens_k[b])
                        .map(|j| [table[b * pages_per_sequence + j / page_size] as usize, j % page_size])
                        .collect()
                })
                .collect();
            features.pages = Some((table, pages_per_sequence, *page_size));
            ([pages, *page_size, heads_kv, d], rows)
        }
    };
    let ragged_dense = matches!(case.keys, Keys::Dense) && case.seqlens_k.iter().any(|&n| n != case.seqlens_k[0]);
    if case.cache_slack.is_some() || ragged_dense || matches!(case.keys, Keys::Paged { .. }) {
        features.seqused_k = Some(case.seqlens_k.iter().map(|&n| n as i32).collect());
    }
    let k = Storage { tensor: random(k_shape, dtype, case.seed + 1), rows: key_rows.clone() };
    let v = Storage { tensor: random(k_shape, dtype, case.seed + 2), rows: key_rows };
    if case.packed_q {
        features.cu_seqlens_q = Some(offsets(&case.seqlens_q));
    }
    let slopes: Vec<f32> = (0..batch * heads_q).map(|i| 0.05 + 0.1 * (i % 5) as f32).collect();
    if case.alibi {
        features.alibi_slopes = Some(slopes.clone());
    }

    let scale = 1.0 / (d as f32).sqrt();
    let out = forward_general(kernel, &q.tensor, &k.tensor, &v.tensor, batch, max_q, scale, &features)
        .unwrap_or_else(|e| panic!("{case:?}\n{e}"));
    compare(case, &out, &q, &k, &v, dtype, d, scale, &slopes);
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Checks every sequence's O and LSE against a batch-1 reference of it, and
/// that no element of O outside the sequences was written.
#[allow(clippy::too_many_arguments)]
fn compare(
    case: &Case,
    out: &Output,
    q: &Storage,
    k: &Storage,
    v: &Storage,
    dtype: Dtype,
    d: usize,
    scale: f32,
    slopes: &[f32],
) {
    let (heads_q, heads_kv) = (case.heads_q, case.heads_kv);
    let (mut diff, mut norm, mut lse_error) = (0.0, 0.0, 0.0f64);
    let mut written = vec![false; out.o.data().len()];
    let max_q = *case.seqlens_q.iter().max().unwrap();
    let total_q: usize = case.seqlens_q.iter().sum();
    let starts = offsets(&case.seqlens_q);
    for b in 0..case.seqlens_q.len() {
        let (sq, sk) = (case.seqlens_q[b], case.seqlens_k[b]);
        if sq == 0 {
            continue;
        }
        let mut problem = ReferenceProblem::dense(1, sq, sk, heads_q, heads_kv, d, case.causal, f64::from(scale));
        problem.window = case.window;
        problem.softcap = case.softcap.map(f64::from);
        let alibi: Vec<f64> = slopes[b * heads_q..][..heads_q].iter().map(|&s| f64::from(s)).collect();
        let expected = reference::attention_with_alibi(
            &problem,
            case.alibi.then_some(&alibi[..]),
            &q.gather(b, heads_q, d, dtype),
            &k.gather(b, heads_kv, d, dtype),
            &v.gather(b, heads_kv, d, dtype),
        );
        for (i, &[bb, s]) in q.rows[b].iter().enumerate() {
            for h in 0..heads_q {
                let row = format!("{case:?}: batch {b} row {i} head {h}");
                for e in 0..d {
                    let at = out.o.index([bb, s, h, e]);
                    written[at] = true;
                    let actual = dtype.to_f64(out.o.data()[at]);
                    assert!(!actual.is_nan(), "{row}: O[{e}] is NaN (never written)");
                    let wanted = expected.o[(i * heads_q + h) * d + e];
                    diff += (actual - wanted).powi(2);
                    norm += wanted * wanted;
                }
                let lse_at =
                    if case.packed_q { h * total_q + starts[b] as usize + i } else { (b * heads_q + h) * max_q + i };
                let (actual, wanted) = (out.lse[lse_at], expected.lse[h * sq + i]);
                if wanted == f64::NEG_INFINITY {
                    assert_eq!(actual, f32::NEG_INFINITY, "{row}: sees no key, LSE {actual}");
                    let zero = (0..d).all(|e| dtype.to_f64(out.o.data()[out.o.index([bb, s, h, e])]) == 0.0);
                    assert!(zero, "{row}: sees no key, O is not 0");
                } else {
                    assert!(actual.is_finite(), "{row}: LSE {actual}, reference {wanted}");
                    lse_error = lse_error.max((f64::from(actual) - wanted).abs());
                }
            }
        }
    }
    if let Some(i) = written.iter().zip(out.o.data()).position(|(&w, &x)| !w && x != POISON) {
        panic!("{case:?}: O element {i}, outside every sequence, was written");
    }
    let relative = (diff / norm.max(f64::MIN_POSITIVE)).sqrt();
    assert!(relative <= dtype.o_tolerance(), "{case:?}: O relative L2 error {relative:.2e}");
    assert!(lse_error <= 2e-3, "{case:?}: LSE error {lse_error:.2e}");
}

#[test]
fn packed_variable_lengths_with_empty_sequences() {
    for name in ["flash_fwd_d64_f16_general", "flash_fwd_d128_bf16_general", "flash_fwd_d96_f16_general"] {
        let mut case = Case::new(name, &[70, 0, 1, 129], &[33, 5, 0, 200]);
        case.packed_q = true;
        case.keys = Keys::Packed;
        check(&case);
        case.causal = true;
        case.heads_q = 4;
        case.heads_kv = 2;
        check(&case);
    }
}

#[test]
fn local_windows_with_and_without_causal() {
    for (name, window, causal) in [
        ("flash_fwd_d64_f16_general", (Some(20), Some(5)), false),
        ("flash_fwd_d64_bf16_general", (Some(40), None), true),
        ("flash_fwd_d128_f16_general", (None, Some(0)), false),
        ("flash_fwd_d32_f16_general", (Some(0), Some(0)), false),
        ("flash_fwd_d256_f16_general", (Some(70), Some(3)), false),
    ] {
        // seqlen_q < seqlen_k and > seqlen_k: the window follows the bottom-right diagonal.
        for (sq, sk) in [(150, 300), (200, 90)] {
            let mut case = Case::new(name, &[sq], &[sk]);
            (case.window, case.causal, case.seed) = (window, causal, sq as u64);
            check(&case);
        }
    }
}

#[test]
fn softcap_and_alibi_alone_and_together() {
    for name in ["flash_fwd_d64_f16_general", "flash_fwd_d128_bf16_general", "flash_fwd_d160_f16_general"] {
        let mut case = Case::new(name, &[100, 100], &[130, 64]);
        case.softcap = Some(0.5);
        check(&case);
        case.softcap = None;
        case.alibi = true;
        check(&case);
        case.softcap = Some(2.0);
        case.causal = true;
        check(&case);
    }
}

#[test]
fn kv_cache_lengths_paged_and_contiguous() {
    // d=224's decode kernel: each warp walking rows of 28 chunks into its own stage.
    for name in [
        "flash_fwd_d64_f16_general",
        "flash_fwd_d128_f16_decode",
        "flash_fwd_d192_bf16_general",
        "flash_fwd_d224_bf16_decode",
    ] {
        let mut case = Case::new(name, &[3, 1, 16], &[150, 64, 1]);
        case.packed_q = true;
        case.cache_slack = Some(40);
        case.causal = true;
        check(&case);
        case.keys = Keys::Paged { page_size: 64 };
        check(&case);
        case.keys = Keys::Paged { page_size: 128 };
        case.causal = false;
        case.heads_q = 8;
        case.heads_kv = 1;
        check(&case);
    }
}

#[test]
fn split_kv_matches_one_pass_and_handles_empty_splits() {
    for name in ["flash_fwd_d128_f16_decode", "flash_fwd_d64_bf16_decode", "flash_fwd_d64_f16_general"] {
        for num_splits in [2, 3, 7] {
            // 300 keys in 32- or 64-key blocks: some splits get none when there are 7.
            let mut case = Case::new(name, &[5, 5], &[300, 40]);
            case.num_splits = num_splits;
            case.heads_q = 4;
            check(&case);
            case.causal = true;
            case.keys = Keys::Paged { page_size: 64 };
            case.alibi = true;
            check(&case);
        }
    }
    let mut case = Case::new("flash_fwd_d128_f16_general", &[40, 0, 70], &[90, 10, 200]);
    (case.packed_q, case.keys, case.num_splits, case.window) = (true, Keys::Packed, 3, (Some(50), None));
    check(&case);
}

#[test]
fn split_kv_merges_more_splits_than_a_warp_has_lanes() {
    // The merge gives each lane up to MAX_SPLITS / 32 splits: 40 splits of
    // 36 key blocks (a few empty), and 128 (most empty).
    for num_splits in [40, 128] {
        let mut case = Case::new("flash_fwd_d64_f16_decode", &[3, 3], &[2300, 700]);
        case.num_splits = num_splits;
        case.heads_q = 2;
        check(&case);
    }
}

#[test]
fn append_writes_new_keys_after_the_cached_ones_then_attention_sees_them() {
    let dtype = Dtype::F16;
    let (batch, heads_kv, d, new) = (2, 2, 64, 3);
    let cache_seqlens = [5i32, 64];
    let page_size = 64;
    let pages_per_sequence = 2;
    let table = vec![3, 0, 1, 2];
    let pages = (table.clone(), pages_per_sequence, page_size);
    let k_new = random([batch, new, heads_kv, d], dtype, 11);
    let v_new = random([batch, new, heads_kv, d], dtype, 12);
    for paged in [false, true] {
        let shape = if paged { [4, page_size, heads_kv, d] } else { [batch, 128, heads_kv, d] };
        let mut k_cache = random(shape, dtype, 13);
        let mut v_cache = random(shape, dtype, 14);
        let (k_before, v_before) = (k_cache.data().to_vec(), v_cache.data().to_vec());
        append_kv(&k_new, &v_new, &mut k_cache, &mut v_cache, &cache_seqlens, paged.then_some(&pages)).unwrap();
        // Every appended element landed where it belongs; nothing else moved.
        let mut changed = vec![false; k_cache.data().len()];
        for b in 0..batch {
            for t in 0..new {
                let position = cache_seqlens[b] as usize + t;
                let (slot, row) = if paged {
                    (table[b * pages_per_sequence + position / page_size] as usize, position % page_size)
                } else {
                    (b, position)
                };
                for h in 0..heads_kv {
                    for e in 0..d {
                        let at = k_cache.index([slot, row, h, e]);
                        assert_eq!(k_cache.data()[at], k_new.data()[k_new.index([b, t, h, e])], "k paged={paged}");
                        assert_eq!(v_cache.data()[at], v_new.data()[v_new.index([b, t, h, e])], "v paged={paged}");
                        changed[at] = true;
                    }
                }
            }
        }
        for (i, &c) in changed.iter().enumerate() {
            if !c {
                assert_eq!((k_cache.data()[i], v_cache.data()[i]), (k_before[i], v_before[i]), "element {i} moved");
            }
        }
    }
}

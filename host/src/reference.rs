//! An f64 CPU reference of attention, the ground truth of the tests.
//!
//! Written for clarity, not speed: for each (batch, query head, row) it
//! forms every scaled score, masks, and takes a max-subtracted softmax.

/// Sizes and options of a reference attention computation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ReferenceProblem {
    pub batch: usize,
    pub seqlen_q: usize,
    pub seqlen_k: usize,
    pub heads_q: usize,
    pub heads_kv: usize,
    pub head_dim: usize,
    pub causal: bool,
    pub softmax_scale: f64,
}

/// Output of [`attention`].
pub struct ReferenceOutput {
    /// `[batch, seqlen_q, heads_q, head_dim]`.
    pub o: Vec<f64>,
    /// `[batch, heads_q, seqlen_q]`; `-inf` where a row sees no key.
    pub lse: Vec<f64>,
}

/// Whether query `row` sees key `key` (causal: bottom-right aligned).
pub fn visible(p: &ReferenceProblem, row: usize, key: usize) -> bool {
    !p.causal || (key as i64) <= row as i64 + p.seqlen_k as i64 - p.seqlen_q as i64
}

/// Attention of contiguous `q [b, sq, hq, d]` over `k`, `v [b, sk, hkv, d]`.
/// Query head `h` uses key/value head `h / (heads_q / heads_kv)`.
pub fn attention(p: &ReferenceProblem, q: &[f64], k: &[f64], v: &[f64]) -> ReferenceOutput {
    let d = p.head_dim;
    assert_eq!(q.len(), p.batch * p.seqlen_q * p.heads_q * d, "q length");
    assert_eq!(k.len(), p.batch * p.seqlen_k * p.heads_kv * d, "k length");
    assert_eq!(v.len(), k.len(), "v length");
    assert!(p.heads_kv > 0 && p.heads_q.is_multiple_of(p.heads_kv), "heads_q must be a multiple of heads_kv");
    let heads = p.batch * p.heads_q;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(heads);
    // Each thread takes every `threads`-th (batch, head) and returns its rows.
    let parts: Vec<Vec<HeadOutput>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                scope.spawn(move || (t..heads).step_by(threads).map(|bh| head_attention(p, q, k, v, bh)).collect())
            })
            .collect();
        workers.into_iter().map(|w| w.join().expect("reference worker panicked")).collect()
    });
    let mut o = vec![0.0; q.len()];
    let mut lse = vec![f64::NEG_INFINITY; heads * p.seqlen_q];
    for HeadOutput { bh, o: head_o, lse: head_lse } in parts.into_iter().flatten() {
        let (b, h) = (bh / p.heads_q, bh % p.heads_q);
        for i in 0..p.seqlen_q {
            o[((b * p.seqlen_q + i) * p.heads_q + h) * d..][..d].copy_from_slice(&head_o[i * d..][..d]);
        }
        lse[bh * p.seqlen_q..][..p.seqlen_q].copy_from_slice(&head_lse);
    }
    ReferenceOutput { o, lse }
}

/// The output of one (batch, query head) `bh = batch * heads_q + head`.
struct HeadOutput {
    bh: usize,
    /// `[seqlen_q, d]`.
    o: Vec<f64>,
    /// `[seqlen_q]`.
    lse: Vec<f64>,
}

fn head_attention(p: &ReferenceProblem, q: &[f64], k: &[f64], v: &[f64], bh: usize) -> HeadOutput {
    let d = p.head_dim;
    let (b, h) = (bh / p.heads_q, bh % p.heads_q);
    let hk = h / (p.heads_q / p.heads_kv);
    let mut o = vec![0.0; p.seqlen_q * d];
    let mut lse = vec![f64::NEG_INFINITY; p.seqlen_q];
    let mut scores = vec![0.0; p.seqlen_k];
    for i in 0..p.seqlen_q {
        let qi = &q[((b * p.seqlen_q + i) * p.heads_q + h) * d..][..d];
        let mut max = f64::NEG_INFINITY;
        for (j, s) in scores.iter_mut().enumerate() {
            *s = if visible(p, i, j) {
                let kj = &k[((b * p.seqlen_k + j) * p.heads_kv + hk) * d..][..d];
                p.softmax_scale * qi.iter().zip(kj).map(|(x, y)| x * y).sum::<f64>()
            } else {
                f64::NEG_INFINITY
            };
            max = max.max(*s);
        }
        if max == f64::NEG_INFINITY {
            continue; // no visible key: O = 0, LSE = -inf
        }
        let sum: f64 = scores.iter().map(|s| (s - max).exp()).sum();
        let oi = &mut o[i * d..][..d];
        for (j, s) in scores.iter().enumerate() {
            let weight = (s - max).exp() / sum;
            if weight == 0.0 {
                continue;
            }
            let vj = &v[((b * p.seqlen_k + j) * p.heads_kv + hk) * d..][..d];
            for (out, x) in oi.iter_mut().zip(vj) {
                *out += weight * x;
            }
        }
        lse[i] = max + sum.ln();
    }
    HeadOutput { bh, o, lse }
}

/// `||a - b|| / ||b||` (L2), the tests' error measure.
pub fn relative_l2_error(actual: &[f64], expected: &[f64]) -> f64 {
    assert_eq!(actual.len(), expected.len());
    let diff: f64 = actual.iter().zip(expected).map(|(a, e)| (a - e).powi(2)).sum();
    let norm: f64 = expected.iter().map(|e| e * e).sum();
    (diff / norm.max(f64::MIN_POSITIVE)).sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;
    use approx::assert_relative_eq;

    fn problem(seqlen_q: usize, seqlen_k: usize, heads_q: usize, heads_kv: usize, causal: bool) -> ReferenceProblem {
        ReferenceProblem { batch: 1, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim: 4, causal, softmax_scale: 0.5 }
    }

    /// v[j][h][c] = 100 * h + 10 * j + c: distinct per key, head and column.
    fn labelled_v(p: &ReferenceProblem) -> Vec<f64> {
        let mut v = Vec::new();
        for j in 0..p.seqlen_k {
            for h in 0..p.heads_kv {
                v.extend((0..p.head_dim).map(|c| (100 * h + 10 * j + c) as f64));
            }
        }
        v
    }

    #[test]
    fn zero_queries_average_the_visible_values() {
        // With q = 0 every visible score is 0: O is the mean of the visible
        // rows of v and LSE = ln(number visible).
        let p = problem(3, 5, 1, 1, true);
        let q = vec![0.0; 3 * 4];
        let k: Vec<f64> = (0..5 * 4).map(|i| (i as f64).sin()).collect();
        let out = attention(&p, &q, &k, &labelled_v(&p));
        for i in 0..3 {
            // Bottom-right causal: row i sees keys 0..=i + 2.
            let visible = i + 3;
            let mean_key = (visible - 1) as f64 / 2.0;
            for c in 0..4 {
                assert_relative_eq!(out.o[i * 4 + c], 10.0 * mean_key + c as f64, max_relative = 1e-12);
            }
            assert_relative_eq!(out.lse[i], (visible as f64).ln(), max_relative = 1e-12);
        }
    }

    #[test]
    fn rows_that_see_no_key_give_zero_and_minus_infinity() {
        // seqlen_q 5 > seqlen_k 2, causal bottom-right: rows 0..=2 see nothing.
        let p = problem(5, 2, 1, 1, true);
        let q: Vec<f64> = (0..5 * 4).map(|i| i as f64 * 0.1).collect();
        let k: Vec<f64> = (0..2 * 4).map(|i| i as f64 * 0.2).collect();
        let out = attention(&p, &q, &k, &labelled_v(&p));
        for i in 0..5 {
            assert!(visible(&p, i, 0) == (i >= 3));
            if i < 3 {
                assert!(out.o[i * 4..][..4].iter().all(|&x| x == 0.0));
                assert_eq!(out.lse[i], f64::NEG_INFINITY);
            } else {
                assert!(out.lse[i].is_finite());
            }
        }
    }

    #[test]
    fn matches_a_direct_softmax_of_one_row() {
        let p = ReferenceProblem { causal: false, ..problem(1, 3, 1, 1, false) };
        let q = [1.0, -2.0, 0.5, 3.0];
        let k = [0.5, 0.1, -1.0, 0.2, 1.0, 1.0, 1.0, 1.0, -0.3, 0.7, 0.0, -1.5];
        let v = labelled_v(&p);
        let s: Vec<f64> = (0..3).map(|j| 0.5 * (0..4).map(|c| q[c] * k[j * 4 + c]).sum::<f64>()).collect();
        let denominator: f64 = s.iter().map(|x| x.exp()).sum();
        let out = attention(&p, &q, &k, &v);
        for c in 0..4 {
            let expected: f64 = (0..3).map(|j| s[j].exp() / denominator * v[j * 4 + c]).sum();
            assert_relative_eq!(out.o[c], expected, max_relative = 1e-12);
        }
        assert_relative_eq!(out.lse[0], denominator.ln(), max_relative = 1e-12);
    }

    #[test]
    fn grouped_query_heads_share_their_key_value_head() {
        // 6 query heads over 2 kv heads: heads 0-2 use kv head 0, 3-5 kv head 1.
        let p = problem(2, 3, 6, 2, false);
        let q = vec![0.0; 2 * 6 * 4];
        let k = vec![0.25; 3 * 2 * 4];
        let out = attention(&p, &q, &k, &labelled_v(&p));
        for i in 0..2 {
            for h in 0..6 {
                let kv_head = h / 3;
                // Uniform over keys 0..3: mean key 1.
                assert_relative_eq!(out.o[(i * 6 + h) * 4], (100 * kv_head + 10) as f64, max_relative = 1e-12);
            }
        }
    }

    #[test]
    fn relative_error_is_zero_for_equal_and_scales_with_difference() {
        assert_eq!(relative_l2_error(&[1.0, 2.0], &[1.0, 2.0]), 0.0);
        assert_relative_eq!(relative_l2_error(&[3.0, 0.0], &[4.0, 0.0]), 0.25);
    }
}

//! Tests of the f64 reference (`reference.rs`).

use crate::reference::*;
use approx::assert_relative_eq;

fn problem(seqlen_q: usize, seqlen_k: usize, heads_q: usize, heads_kv: usize, causal: bool) -> ReferenceProblem {
    ReferenceProblem::dense(1, seqlen_q, seqlen_k, heads_q, heads_kv, 4, causal, 0.5)
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
fn a_window_limits_each_row_to_its_band() {
    // seqlen_q 4, seqlen_k 6 (diagonal offset 2), window (1, 0): row i sees
    // keys i + 1 ..= i + 2.
    let mut p = problem(4, 6, 1, 1, false);
    p.window = (Some(1), Some(0));
    for i in 0..4 {
        let seen: Vec<usize> = (0..6).filter(|&j| visible(&p, i, j)).collect();
        assert_eq!(seen, vec![i + 1, i + 2], "row {i}");
    }
    // A right bound only; causal wins over a wider right bound.
    p.window = (None, Some(1));
    assert_eq!((0..6).filter(|&j| visible(&p, 0, j)).count(), 4);
    p.causal = true;
    assert_eq!((0..6).filter(|&j| visible(&p, 0, j)).count(), 3);
    // With q = 0, O is the mean of the band's values.
    p.causal = false;
    p.window = (Some(1), Some(0));
    let out = attention(&p, &[0.0; 16], &[0.3; 24], &labelled_v(&p));
    assert_relative_eq!(out.o[0], 10.0 * 1.5, max_relative = 1e-12);
    assert_relative_eq!(out.lse[3], 2f64.ln(), max_relative = 1e-12);
}

#[test]
fn softcap_and_alibi_change_the_scores_as_defined() {
    let mut p = problem(1, 3, 2, 1, false);
    p.softcap = Some(0.7);
    let q = [1.0, -2.0, 0.5, 3.0, 0.3, 0.2, -0.1, 1.0];
    let k = [0.5, 0.1, -1.0, 0.2, 1.0, 1.0, 1.0, 1.0, -0.3, 0.7, 0.0, -1.5];
    let slopes = [0.25, 0.5];
    let out = attention_with_alibi(&p, Some(&slopes), &q, &k, &labelled_v(&p));
    for h in 0..2 {
        // Row 0 sits at key position 2 (bottom-right): distance |2 - j|.
        let s: Vec<f64> = (0..3)
            .map(|j| {
                let raw = 0.5 * (0..4).map(|c| q[h * 4 + c] * k[j * 4 + c]).sum::<f64>();
                0.7 * (raw / 0.7).tanh() - slopes[h] * (2.0 - j as f64)
            })
            .collect();
        let denominator: f64 = s.iter().map(|x| x.exp()).sum();
        let expected: f64 = (0..3).map(|j| s[j].exp() / denominator * (10 * j) as f64).sum();
        assert_relative_eq!(out.o[h * 4], expected, max_relative = 1e-12);
        assert_relative_eq!(out.lse[h], denominator.ln(), max_relative = 1e-12);
    }
}

#[test]
fn relative_error_is_zero_for_equal_and_scales_with_difference() {
    assert_eq!(relative_l2_error(&[1.0, 2.0], &[1.0, 2.0]), 0.0);
    assert_relative_eq!(relative_l2_error(&[3.0, 0.0], &[4.0, 0.0]), 0.25);
}

/// Pseudo-random values in [-1, 1) from a fixed seed (a small LCG: the
/// tests of the reference need no random crate to be repeatable).
fn values(seed: u64, n: usize) -> Vec<f64> {
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (state >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
        })
        .collect()
}

/// The analytic gradients against central differences of `L = sum(O * dO)`
/// for every element of q, k and v.
fn check_gradients(p: &ReferenceProblem, slopes: Option<&[f64]>, what: &str) {
    let (nq, nk) = (p.batch * p.seqlen_q * p.heads_q * p.head_dim, p.batch * p.seqlen_k * p.heads_kv * p.head_dim);
    let (q, k, v, d_o) = (values(1, nq), values(2, nk), values(3, nk), values(4, nq));
    let grads = attention_backward(p, slopes, &q, &k, &v, &d_o);
    let loss = |q: &[f64], k: &[f64], v: &[f64]| -> f64 {
        attention_with_alibi(p, slopes, q, k, v).o.iter().zip(&d_o).map(|(o, g)| o * g).sum()
    };
    let h = 1e-5;
    let numeric = |which: usize, len: usize| -> Vec<f64> {
        (0..len)
            .map(|e| {
                let mut inputs = [q.clone(), k.clone(), v.clone()];
                inputs[which][e] += h;
                let up = loss(&inputs[0], &inputs[1], &inputs[2]);
                inputs[which][e] -= 2.0 * h;
                let down = loss(&inputs[0], &inputs[1], &inputs[2]);
                (up - down) / (2.0 * h)
            })
            .collect()
    };
    for (name, analytic, which, len) in [("dq", &grads.dq, 0, nq), ("dk", &grads.dk, 1, nk), ("dv", &grads.dv, 2, nk)] {
        let expected = numeric(which, len);
        assert!(expected.iter().any(|g| g.abs() > 1e-3), "{what}: {name} is all but zero: the case tests nothing");
        let error = relative_l2_error(analytic, &expected);
        assert!(error < 1e-7, "{what}: {name} off from finite differences by {error:e}");
    }
}

#[test]
fn backward_matches_finite_differences_with_every_score_modifier() {
    // GQA 2:1, more keys than queries, ragged sizes.
    let base = ReferenceProblem::dense(2, 3, 5, 4, 2, 4, false, 0.7);
    check_gradients(&base, None, "full");
    check_gradients(&ReferenceProblem { causal: true, ..base }, None, "causal, bottom-right");
    let more_queries = ReferenceProblem { seqlen_q: 6, seqlen_k: 4, causal: true, ..base };
    check_gradients(&more_queries, None, "causal with rows that see no key");
    check_gradients(&ReferenceProblem { window: (Some(1), Some(1)), ..base }, None, "window");
    check_gradients(&ReferenceProblem { softcap: Some(0.8), ..base }, None, "softcap");
    let slopes = values(5, base.batch * base.heads_q);
    check_gradients(&ReferenceProblem { causal: true, softcap: Some(2.0), ..base }, Some(&slopes), "alibi and softcap");
}

#[test]
fn backward_gives_nothing_to_rows_that_see_no_key() {
    // Row 0 of 4 queries over 2 keys, causal bottom-right, sees no key.
    let p = ReferenceProblem::dense(1, 4, 2, 1, 1, 2, true, 1.0);
    let (q, k, v) = (values(6, 8), values(7, 4), values(8, 4));
    let mut d_o = vec![0.0; 8];
    d_o[..2].copy_from_slice(&[1.0, -1.0]); // only row 0's output matters
    let grads = attention_backward(&p, None, &q, &k, &v, &d_o);
    assert!(grads.dq.iter().chain(&grads.dk).chain(&grads.dv).all(|&g| g == 0.0));
}

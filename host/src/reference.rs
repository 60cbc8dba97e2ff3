//! An f64 CPU reference of attention (`flash_attn::reference`), the ground
//! truth of the tests: of the GPU tests and of the kernels run on the CPU
//! emulator (`tests/tests/emulator_attention.rs`).
//!
//! Written for clarity, not speed: for each (batch, query head, row) it
//! forms every scaled score, applies the softcap and ALiBi bias, masks, and
//! takes a max-subtracted softmax. Variable-length batches and paged caches
//! are checked by gathering each sequence into a dense problem of batch 1.
//!
//! [`attention_backward`] gives the analytic gradients of the same function
//! (the ground truth of the backward pass), itself checked against finite
//! differences of [`attention_with_alibi`].

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
    /// Local attention (FlashAttention-2's `window_size`): key `j` is visible
    /// from row `i` when `i + d - left <= j <= i + d + right` with
    /// `d = seqlen_k - seqlen_q`; `None` leaves a side unbounded. Causal
    /// masking also applies when set.
    pub window: (Option<usize>, Option<usize>),
    /// Softcap `c`: scores become `c * tanh(s / c)` (after scaling).
    pub softcap: Option<f64>,
}

impl ReferenceProblem {
    /// A dense problem without window, softcap or ALiBi.
    #[allow(clippy::too_many_arguments)]
    pub fn dense(
        batch: usize,
        seqlen_q: usize,
        seqlen_k: usize,
        heads_q: usize,
        heads_kv: usize,
        head_dim: usize,
        causal: bool,
        softmax_scale: f64,
    ) -> Self {
        Self {
            batch,
            seqlen_q,
            seqlen_k,
            heads_q,
            heads_kv,
            head_dim,
            causal,
            softmax_scale,
            window: (None, None),
            softcap: None,
        }
    }
}

/// Output of [`attention`].
pub struct ReferenceOutput {
    /// `[batch, seqlen_q, heads_q, head_dim]`.
    pub o: Vec<f64>,
    /// `[batch, heads_q, seqlen_q]`; `-inf` where a row sees no key.
    pub lse: Vec<f64>,
}

/// Whether query `row` sees key `key` (causal and window: bottom-right aligned).
pub fn visible(p: &ReferenceProblem, row: usize, key: usize) -> bool {
    let aligned = row as i64 + p.seqlen_k as i64 - p.seqlen_q as i64;
    let key = key as i64;
    let right_ok = match (p.causal, p.window.1) {
        (true, _) => key <= aligned,
        (false, Some(right)) => key <= aligned + right as i64,
        (false, None) => true,
    };
    right_ok && p.window.0.is_none_or(|left| key >= aligned - left as i64)
}

/// Attention of contiguous `q [b, sq, hq, d]` over `k`, `v [b, sk, hkv, d]`.
/// Query head `h` uses key/value head `h / (heads_q / heads_kv)`.
pub fn attention(p: &ReferenceProblem, q: &[f64], k: &[f64], v: &[f64]) -> ReferenceOutput {
    attention_with_alibi(p, None, q, k, v)
}

/// [`attention`] with ALiBi: `slopes` holds one slope per (batch, query
/// head), `[batch, heads_q]`; row `i` adds `-slope * |i + sk - sq - j|` to
/// its (scaled, softcapped) score for key `j`.
pub fn attention_with_alibi(
    p: &ReferenceProblem,
    slopes: Option<&[f64]>,
    q: &[f64],
    k: &[f64],
    v: &[f64],
) -> ReferenceOutput {
    let d = p.head_dim;
    assert_eq!(q.len(), p.batch * p.seqlen_q * p.heads_q * d, "q length");
    assert_eq!(k.len(), p.batch * p.seqlen_k * p.heads_kv * d, "k length");
    assert_eq!(v.len(), k.len(), "v length");
    assert!(p.heads_kv > 0 && p.heads_q.is_multiple_of(p.heads_kv), "heads_q must be a multiple of heads_kv");
    if let Some(slopes) = slopes {
        assert_eq!(slopes.len(), p.batch * p.heads_q, "one ALiBi slope per (batch, head)");
    }
    let heads = p.batch * p.heads_q;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(heads);
    // Each thread takes every `threads`-th (batch, head) and returns its rows.
    let parts: Vec<Vec<HeadOutput>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                scope.spawn(move || {
                    (t..heads).step_by(threads).map(|bh| head_attention(p, slopes, q, k, v, bh)).collect()
                })
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

fn head_attention(
    p: &ReferenceProblem,
    slopes: Option<&[f64]>,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    bh: usize,
) -> HeadOutput {
    let d = p.head_dim;
    let slope = slopes.map_or(0.0, |s| s[bh]);
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
                let scaled = p.softmax_scale * qi.iter().zip(kj).map(|(x, y)| x * y).sum::<f64>();
                let capped = p.softcap.map_or(scaled, |c| c * (scaled / c).tanh());
                let distance = (i as f64 + p.seqlen_k as f64 - p.seqlen_q as f64 - j as f64).abs();
                capped - slope * distance
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

/// Gradients of a loss with respect to the inputs of [`attention_with_alibi`].
pub struct ReferenceGradients {
    /// `[batch, seqlen_q, heads_q, head_dim]`.
    pub dq: Vec<f64>,
    /// `[batch, seqlen_k, heads_kv, head_dim]`: summed over the query heads
    /// of each key/value head's group.
    pub dk: Vec<f64>,
    /// As `dk`.
    pub dv: Vec<f64>,
}

/// The gradients of a loss `L` with respect to `q`, `k` and `v`, given `do_
/// = dL/dO` (`[batch, seqlen_q, heads_q, head_dim]`), for the attention
/// [`attention_with_alibi`] computes. With `P` the softmax of row `i`'s
/// scores `s` and `t = scale * q_i . k_j` the scaled product before the
/// softcap:
/// `dV_j += P_ij dO_i`, `dP_ij = dO_i . V_j`, `dS_ij = P_ij (dP_ij - D_i)`
/// with `D_i = dO_i . O_i`, through the softcap `dT_ij = dS_ij (1 -
/// tanh^2(t / c))` (the ALiBi bias is constant), and `dQ_i += scale dT_ij
/// K_j`, `dK_j += scale dT_ij Q_i`. Rows that see no key contribute nothing.
pub fn attention_backward(
    p: &ReferenceProblem,
    slopes: Option<&[f64]>,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    do_: &[f64],
) -> ReferenceGradients {
    assert_eq!(do_.len(), q.len(), "dO has q's shape");
    let forward = attention_with_alibi(p, slopes, q, k, v);
    let d = p.head_dim;
    let (mut dq, mut dk, mut dv) = (vec![0.0; q.len()], vec![0.0; k.len()], vec![0.0; v.len()]);
    let q_at = |b: usize, i: usize, h: usize| ((b * p.seqlen_q + i) * p.heads_q + h) * d;
    let k_at = |b: usize, j: usize, h: usize| ((b * p.seqlen_k + j) * p.heads_kv + h) * d;
    let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
    for b in 0..p.batch {
        for h in 0..p.heads_q {
            let hk = h / (p.heads_q / p.heads_kv);
            let slope = slopes.map_or(0.0, |s| s[b * p.heads_q + h]);
            for i in 0..p.seqlen_q {
                let lse = forward.lse[(b * p.heads_q + h) * p.seqlen_q + i];
                if lse == f64::NEG_INFINITY {
                    continue;
                }
                let (qi, doi) = (&q[q_at(b, i, h)..][..d], &do_[q_at(b, i, h)..][..d]);
                let d_i = dot(doi, &forward.o[q_at(b, i, h)..][..d]);
                for j in (0..p.seqlen_k).filter(|&j| visible(p, i, j)) {
                    let (kj, vj) = (&k[k_at(b, j, hk)..][..d], &v[k_at(b, j, hk)..][..d]);
                    let scaled = p.softmax_scale * dot(qi, kj);
                    let capped = p.softcap.map_or(scaled, |c| c * (scaled / c).tanh());
                    let distance = (i as f64 + p.seqlen_k as f64 - p.seqlen_q as f64 - j as f64).abs();
                    let prob = (capped - slope * distance - lse).exp();
                    let d_s = prob * (dot(doi, vj) - d_i);
                    let d_scaled = p.softcap.map_or(d_s, |c| d_s * (1.0 - (scaled / c).tanh().powi(2)));
                    for x in 0..d {
                        dv[k_at(b, j, hk) + x] += prob * doi[x];
                        dq[q_at(b, i, h) + x] += p.softmax_scale * d_scaled * kj[x];
                        dk[k_at(b, j, hk) + x] += p.softmax_scale * d_scaled * qi[x];
                    }
                }
            }
        }
    }
    ReferenceGradients { dq, dk, dv }
}

/// `||a - b|| / ||b||` (L2), the tests' error measure.
pub fn relative_l2_error(actual: &[f64], expected: &[f64]) -> f64 {
    assert_eq!(actual.len(), expected.len());
    let diff: f64 = actual.iter().zip(expected).map(|(a, e)| (a - e).powi(2)).sum();
    let norm: f64 = expected.iter().map(|e| e * e).sum();
    (diff / norm.max(f64::MIN_POSITIVE)).sqrt()
}

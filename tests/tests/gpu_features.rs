//! GPU integration tests of the general kernels' features against the f64
//! CPU reference: sliding windows, softcap, ALiBi, variable-length batches,
//! KV caches (dense and paged, with in-place append), split-KV (forced and
//! automatic) and the GQA decode layout, alone and combined, for both
//! element types and several head dims. Inputs are fresh random normals,
//! outputs start as NaN. Skipped, saying why, without a GPU.

use flash_attn::cust::memory::DeviceBuffer;
use flash_attn::cust::stream::{Stream, StreamFlags};
use flash_attn::half1::{bf16, f16};
use flash_attn::pipeline::{plan_for, validate_varlen, KernelFamily, OffsetsArg, OutputBuffers};
use flash_attn::reference::{attention_with_alibi, ReferenceProblem};
use flash_attn::{
    AttentionKernel, AttentionParams, BlockTable, CacheSeqlens, DeviceView, Element, FlashAttention, KvCache,
    SeqOffsets, Tensor, TensorMut, Workspace,
};
use flash_attn_tests::emulator::{self, Memory};
use flash_attn_tests::seed::test_rng;
use flash_attn_tests::{
    check_against, computed_scores, download, f16_and_bf16_tests, gather, gpu, left_out_of_this_run, poisoned,
    random_tensor, random_values, sequence_rows, upload, CaseResult, HostTensor, Placement, TestElement,
};
use rand::seq::SliceRandom;
use rand::Rng;

fn stream() -> Stream {
    Stream::new(StreamFlags::NON_BLOCKING, None).expect("stream")
}

/// ALiBi slopes of a test: none, one per query head, or one per batch and head.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
enum Alibi {
    #[default]
    Off,
    PerHead,
    PerBatchHead,
}

/// The options of one case.
#[derive(Clone, Copy, Debug, Default)]
struct Features {
    causal: bool,
    window: (Option<usize>, Option<usize>),
    softcap: Option<f32>,
    alibi: Alibi,
    num_splits: Option<usize>,
}

impl Features {
    fn params<'a>(&self, slopes: Option<&'a DeviceBuffer<f32>>) -> AttentionParams<'a> {
        AttentionParams {
            causal: self.causal,
            softmax_scale: None,
            window: self.window,
            softcap: self.softcap,
            alibi_slopes: slopes.map(DeviceView::from),
            num_splits: self.num_splits,
            deterministic: false,
        }
    }

    /// The reference problem of `batch` batches of these sizes.
    fn reference(
        &self,
        batch: usize,
        seqlen_q: usize,
        seqlen_k: usize,
        heads: (usize, usize),
        d: usize,
    ) -> ReferenceProblem {
        let dense = ReferenceProblem::dense(
            batch,
            seqlen_q,
            seqlen_k,
            heads.0,
            heads.1,
            d,
            self.causal,
            1.0 / (d as f64).sqrt(),
        );
        ReferenceProblem { window: self.window, softcap: self.softcap.map(f64::from), ..dense }
    }
}

/// Random ALiBi slopes for `batch` batches of `heads_q` heads: the host
/// values the call uploads (empty without ALiBi) and, for the reference,
/// one per (batch, head).
fn random_slopes(alibi: Alibi, rng: &mut impl Rng, batch: usize, heads_q: usize) -> (Vec<f32>, Vec<f64>) {
    let n = match alibi {
        Alibi::Off => return (Vec::new(), Vec::new()),
        Alibi::PerHead => heads_q,
        Alibi::PerBatchHead => batch * heads_q,
    };
    let host: Vec<f32> = (0..n).map(|_| rng.gen_range(0.01..0.3)).collect();
    let per_batch_head = (0..batch * heads_q).map(|i| f64::from(host[i % n])).collect();
    (host, per_batch_head)
}

/// A device copy of the slopes, if any.
fn upload_slopes(host: &[f32]) -> Option<DeviceBuffer<f32>> {
    (!host.is_empty()).then(|| upload(host))
}

/// The slopes of batch `b` for the reference, if any.
fn slopes_of(all: &[f64], b: usize, heads_q: usize) -> Option<&[f64]> {
    (!all.is_empty()).then(|| &all[b * heads_q..][..heads_q])
}

/// Panics naming the case: a valid call was refused.
fn refused<R>(case: &impl std::fmt::Debug) -> impl FnOnce(flash_attn::Error) -> R + '_ {
    move |e| panic!("{case:?}: refused: {e}")
}

fn report(test: &str, what: &str, r: &CaseResult) {
    println!("{test}: ok {what}: O rel err {:.2e}, LSE max err {:.2e}", r.o_error, r.lse_max_error);
}

// ---- Dense batches through forward / forward_into. ----

#[derive(Clone, Copy, Debug)]
struct DenseCase {
    batch: usize,
    seqlen_q: usize,
    seqlen_k: usize,
    heads: (usize, usize),
    head_dim: usize,
    placement: Placement,
    features: Features,
}

struct DenseInputs<T> {
    q: HostTensor<T>,
    k: HostTensor<T>,
    v: HostTensor<T>,
    slopes: Vec<f32>,
    reference_slopes: Vec<f64>,
}

fn dense_inputs<T: TestElement>(case: &DenseCase, rng: &mut impl Rng) -> DenseInputs<T> {
    let (hq, hkv) = case.heads;
    let kv_shape = [case.batch, case.seqlen_k, hkv, case.head_dim];
    let q = random_tensor(rng, [case.batch, case.seqlen_q, hq, case.head_dim], case.placement);
    let (k, v) = (random_tensor(rng, kv_shape, case.placement), random_tensor(rng, kv_shape, case.placement));
    let (slopes, reference_slopes) = random_slopes(case.features.alibi, rng, case.batch, hq);
    DenseInputs { q, k, v, slopes, reference_slopes }
}

/// Runs a dense case into NaN-poisoned outputs (through `forward` when
/// `allocate`, else `forward_into` with `case.placement` for o too); returns
/// O gathered densely and the LSE.
fn launch_dense<T: TestElement>(
    attention: &FlashAttention,
    case: &DenseCase,
    inputs: &DenseInputs<T>,
    allocate: bool,
) -> (Vec<f64>, Vec<f32>) {
    let DenseInputs { q, k, v, slopes, .. } = inputs;
    let stream = stream();
    let (q_dev, k_dev, v_dev) = (upload(&q.buffer), upload(&k.buffer), upload(&v.buffer));
    let slopes_dev = upload_slopes(slopes);
    let params = case.features.params(slopes_dev.as_ref());
    let (q_t, k_t, v_t) = (
        Tensor::strided(&q_dev, q.shape, q.strides),
        Tensor::strided(&k_dev, k.shape, k.strides),
        Tensor::strided(&v_dev, v.shape, v.strides),
    );
    if allocate {
        let out = attention.forward(q_t, k_t, v_t, &params, &stream).unwrap_or_else(refused(case));
        stream.synchronize().unwrap_or_else(|e| panic!("{case:?}: kernel failed: {e}"));
        let o = download(&out.o).iter().map(|x| x.to_f64()).collect();
        return (o, download(&out.lse));
    }
    let mut o = poisoned::<T>(q.buffer.len());
    let mut lse = upload(&vec![f32::NAN; case.batch * case.heads.0 * case.seqlen_q]);
    let o_t = TensorMut::strided(&mut o, q.shape, q.strides);
    attention.forward_into(q_t, k_t, v_t, o_t, &mut lse, &params, &stream).unwrap_or_else(refused(case));
    stream.synchronize().unwrap_or_else(|e| panic!("{case:?}: kernel failed: {e}"));
    (gather(&download(&o), q.shape, q.strides), download(&lse))
}

fn check_dense<T: TestElement>(case: &DenseCase, inputs: &DenseInputs<T>, o: &[f64], lse: &[f32]) -> CaseResult {
    let p = case.features.reference(case.batch, case.seqlen_q, case.seqlen_k, case.heads, case.head_dim);
    let slopes = (!inputs.reference_slopes.is_empty()).then_some(&inputs.reference_slopes[..]);
    let expected = attention_with_alibi(&p, slopes, &inputs.q.dense, &inputs.k.dense, &inputs.v.dense);
    check_against::<T>(&format!("{case:?}"), o, lse, &expected)
}

fn run_dense<T: TestElement>(test: &str, attention: &FlashAttention, case: &DenseCase, allocate: bool) {
    if left_out_of_this_run(test, case, computed_scores(case.heads, case.seqlen_q, case.batch * case.seqlen_k)) {
        return;
    }
    let inputs = dense_inputs::<T>(case, &mut test_rng(test));
    let (o, lse) = launch_dense(attention, case, &inputs, allocate);
    let r = check_dense(case, &inputs, &o, &lse);
    report(test, &format!("{} {case:?}", <T as Element>::NAME), &r);
}

fn dense(
    batch: usize,
    (seqlen_q, seqlen_k): (usize, usize),
    heads: (usize, usize),
    head_dim: usize,
    features: Features,
) -> DenseCase {
    DenseCase { batch, seqlen_q, seqlen_k, heads, head_dim, placement: Placement::Contiguous, features }
}

fn window_cases(d: usize) -> Vec<DenseCase> {
    let window = |left, right| Features { window: (left, right), ..Default::default() };
    let causal_window = |left| Features { causal: true, window: (left, None), ..Default::default() };
    vec![
        dense(2, (300, 300), (8, 2), d, window(Some(64), Some(16))),
        DenseCase { placement: Placement::Padded, ..dense(2, (200, 517), (4, 4), d, causal_window(Some(100))) },
        DenseCase { placement: Placement::HeadsMajor, ..dense(1, (517, 200), (6, 1), d, window(None, Some(7))) },
        // Rows 0..50 see no key: O = 0, LSE = -inf.
        dense(2, (100, 50), (2, 2), d, window(Some(2), Some(0))),
        // Each row sees one key.
        dense(1, (64, 2000), (4, 2), d, window(Some(0), Some(0))),
        // One query row: the decode kernel, split automatically.
        dense(2, (1, 3000), (8, 2), d, causal_window(Some(500))),
    ]
}

fn softcap_alibi_cases(d: usize) -> Vec<DenseCase> {
    let features = |causal, softcap, alibi| Features { causal, softcap, alibi, ..Default::default() };
    vec![
        dense(2, (257, 257), (8, 8), d, features(false, Some(1.0), Alibi::Off)),
        dense(2, (200, 300), (4, 2), d, features(true, None, Alibi::PerHead)),
        dense(3, (33, 700), (4, 1), d, features(false, None, Alibi::PerBatchHead)),
        DenseCase {
            placement: Placement::Padded,
            ..dense(2, (129, 129), (8, 2), d, features(true, Some(0.5), Alibi::PerHead))
        },
        // One query row with ALiBi (no GQA decode layout), split automatically.
        dense(2, (1, 2048), (8, 2), d, features(false, Some(2.0), Alibi::PerBatchHead)),
    ]
}

fn split_cases(d: usize, num_splits: Option<usize>) -> Vec<DenseCase> {
    let features = |causal| Features { causal, num_splits, ..Default::default() };
    vec![
        // Decode, GQA 8:1: the GQA decode layout (causal dropped).
        dense(1, (1, 4097), (32, 4), d, features(true)),
        DenseCase { placement: Placement::Padded, ..dense(3, (1, 1500), (16, 2), d, features(false)) },
        // 16 rows: the decode kernel, causal bottom-right.
        dense(2, (16, 1000), (4, 4), d, features(true)),
        // The general kernel.
        DenseCase { placement: Placement::HeadsMajor, ..dense(1, (200, 3000), (2, 1), d, features(true)) },
        // Fewer key blocks than splits: some splits see no key.
        dense(2, (3, 70), (4, 2), d, features(false)),
    ]
}

fn run_dense_cases<T: TestElement>(test: &str, cases: impl Fn(usize) -> Vec<DenseCase>, head_dims: &[usize]) {
    let Some((_context, attention)) = gpu(test) else { return };
    for &d in head_dims {
        for case in cases(d) {
            run_dense::<T>(test, &attention, &case, false);
        }
    }
}

f16_and_bf16_tests!(f16_windows, bf16_windows: run_dense_cases(window_cases, &[64, 128]));

f16_and_bf16_tests!(f16_softcap_and_alibi, bf16_softcap_and_alibi: run_dense_cases(softcap_alibi_cases, &[64, 128]));

fn run_splits<T: TestElement>(test: &str) {
    let Some((_context, attention)) = gpu(test) else { return };
    for d in [64, 128] {
        for num_splits in [Some(1), Some(3), None] {
            for case in split_cases(d, num_splits) {
                run_dense::<T>(test, &attention, &case, false);
            }
        }
    }
}

f16_and_bf16_tests!(f16_split_kv_forced_and_automatic, bf16_split_kv_forced_and_automatic: run_splits());

/// `forward` (allocating) on decode shapes: the automatic split and the
/// GQA decode layout behind the plain dense API.
#[test]
fn allocating_forward_splits_decode_automatically() {
    let test = "allocating_forward_splits_decode_automatically";
    let Some((_context, attention)) = gpu(test) else { return };
    for case in
        [dense(4, (1, 8192), (32, 4), 128, Features::default()), dense(1, (1, 20000), (8, 1), 64, Features::default())]
    {
        run_dense::<f16>(test, &attention, &case, true);
        run_dense::<bf16>(test, &attention, &case, true);
    }
}

/// Split-KV merges in a fixed order: the same inputs give the same bits.
#[test]
fn split_results_are_deterministic() {
    let test = "split_results_are_deterministic";
    let Some((_context, attention)) = gpu(test) else { return };
    let case = dense(2, (1, 5000), (16, 2), 128, Features { causal: true, num_splits: Some(7), ..Default::default() });
    let inputs = dense_inputs::<f16>(&case, &mut test_rng("split_results_are_deterministic"));
    let (o1, lse1) = launch_dense(&attention, &case, &inputs, false);
    let (o2, lse2) = launch_dense(&attention, &case, &inputs, false);
    check_dense(&case, &inputs, &o1, &lse1);
    assert!(o1.iter().zip(&o2).all(|(a, b)| a.to_bits() == b.to_bits()), "O differs between two runs");
    assert!(lse1.iter().zip(&lse2).all(|(a, b)| a.to_bits() == b.to_bits()), "LSE differs between two runs");
    println!("{test}: ok");
}

// ---- Variable-length batches. ----

#[derive(Clone, Copy, Debug)]
struct VarlenCase {
    /// (query tokens, key tokens) of each sequence.
    lengths: &'static [(usize, usize)],
    heads: (usize, usize),
    head_dim: usize,
    features: Features,
}

/// Ragged: an empty query sequence, an empty key sequence, more queries
/// than keys and the reverse, tails around the 64- and 128-row tiles.
const RAGGED: &[(usize, usize)] = &[(5, 5), (0, 7), (130, 130), (64, 300), (300, 64), (1, 1), (17, 0), (129, 1000)];

/// The kernel the host plans for the packed `case` (ALiBi `slopes`) on a
/// GPU of compute capability 9.0 when `sm90a`, else on the sm_80 kernels:
/// the call validated at host addresses of the device buffers' alignment
/// (16 bytes) and strides.
fn planned_varlen_kernel<T: TestElement>(
    case: &VarlenCase,
    [cu_q, cu_k]: [&SeqOffsets; 2],
    slopes: &[f32],
    sm90a: bool,
) -> &'static str {
    let (hq, hkv) = case.heads;
    let tensor = |shape: [usize; 4]| emulator::Tensor::filled(shape, emulator::Tensor::contiguous_strides(shape), 0);
    let (q_shape, k_shape) = ([1, cu_q.total(), hq, case.head_dim], [1, cu_k.total(), hkv, case.head_dim]);
    let (q, k, v, mut o) = (tensor(q_shape), tensor(k_shape), tensor(k_shape), tensor(q_shape));
    let mut lse = vec![0f32; hq * cu_q.total()];
    let mut memory = Memory::new();
    let alibi_slopes = (case.features.alibi != Alibi::Off).then(|| memory.slice("alibi_slopes", slopes));
    let (q, k, v) = (memory.tensor("q", &q), memory.tensor("k", &k), memory.tensor("v", &v));
    let cu_q = OffsetsArg { host: cu_q.offsets(), addr: memory.input("cu_seqlens_q", cu_q.offsets()) };
    let cu_k = OffsetsArg { host: cu_k.offsets(), addr: memory.input("cu_seqlens_k", cu_k.offsets()) };
    let o = memory.output_tensor("o", &mut o);
    let lse_len = lse.len();
    let lse_addr = memory.output("lse", &mut lse);
    let params = AttentionParams { alibi_slopes, ..case.features.params(None) };
    let outputs = OutputBuffers::Given { o: &o, lse_addr, lse_len };
    let call = validate_varlen(<T as Element>::DTYPE, &q, &k, &v, cu_q, cu_k, outputs, &params)
        .unwrap_or_else(|e| panic!("{case:?}: {e}"));
    let family = if sm90a { KernelFamily::Sm90a { sm_count: 132 } } else { KernelFamily::Sm80 };
    let plan = plan_for(&call, |_: &AttentionKernel| 1, family).expect("a plan");
    plan.kernel().name()
}

/// Runs a variable-length case (through `forward_varlen` when `allocate`)
/// and checks each sequence against a batch-1 reference. With the sm_90a
/// kernels loaded, an unsplit case of their head dims must plan one.
fn run_varlen<T: TestElement>(test: &str, attention: &FlashAttention, case: &VarlenCase, allocate: bool) {
    if left_out_of_this_run(test, case, case.heads.0 * case.lengths.iter().map(|(q, k)| q * k).sum::<usize>()) {
        return;
    }
    let mut rng = test_rng(test);
    let (hq, hkv) = case.heads;
    let d = case.head_dim;
    let cu_q = SeqOffsets::from_lengths(&case.lengths.iter().map(|l| l.0).collect::<Vec<_>>()).expect("cu_seqlens_q");
    let cu_k = SeqOffsets::from_lengths(&case.lengths.iter().map(|l| l.1).collect::<Vec<_>>()).expect("cu_seqlens_k");
    let (total_q, total_k, batch) = (cu_q.total(), cu_k.total(), cu_q.batch());
    let (q, q_dense) = random_values::<T>(&mut rng, total_q * hq * d);
    let (k, k_dense) = random_values::<T>(&mut rng, total_k * hkv * d);
    let (v, v_dense) = random_values::<T>(&mut rng, total_k * hkv * d);
    let (slopes, reference_slopes) = random_slopes(case.features.alibi, &mut rng, batch, hq);
    let kernel = planned_varlen_kernel::<T>(case, [&cu_q, &cu_k], &slopes, attention.uses_sm90a());
    if attention.uses_sm90a() && case.features.num_splits.is_none() && case.head_dim != 32 {
        assert!(kernel.starts_with("flash_fwd_sm90_"), "{case:?}: planned for {kernel}, not an sm_90a kernel");
    }
    let slopes_dev = upload_slopes(&slopes);
    let (q_dev, k_dev, v_dev) = (upload(&q), upload(&k), upload(&v));
    let params = case.features.params(slopes_dev.as_ref());
    let stream = stream();
    let (q_t, k_t, v_t) = (
        Tensor::packed(&q_dev, [total_q, hq, d]),
        Tensor::packed(&k_dev, [total_k, hkv, d]),
        Tensor::packed(&v_dev, [total_k, hkv, d]),
    );
    let (o, lse) = if allocate {
        let out = attention.forward_varlen(q_t, k_t, v_t, &cu_q, &cu_k, &params, &stream).unwrap_or_else(refused(case));
        stream.synchronize().unwrap_or_else(|e| panic!("{case:?}: kernel failed: {e}"));
        (download(&out.o), download(&out.lse))
    } else {
        let mut o = poisoned::<T>(total_q * hq * d);
        let mut lse = upload(&vec![f32::NAN; hq * total_q]);
        let o_t = TensorMut::packed(&mut o, [total_q, hq, d]);
        attention
            .forward_varlen_into(q_t, k_t, v_t, o_t, &mut lse, &cu_q, &cu_k, &params, &stream)
            .unwrap_or_else(refused(case));
        stream.synchronize().unwrap_or_else(|e| panic!("{case:?}: kernel failed: {e}"));
        (download(&o), download(&lse))
    };
    assert_eq!((o.len(), lse.len()), (total_q * hq * d, hq * total_q), "{case:?}: output sizes");
    let (mut worst_o, mut worst_lse) = (0f64, 0f64);
    for b in 0..batch {
        let (q0, q1) = (cu_q.offsets()[b] as usize, cu_q.offsets()[b + 1] as usize);
        let (k0, k1) = (cu_k.offsets()[b] as usize, cu_k.offsets()[b + 1] as usize);
        if q1 == q0 {
            continue;
        }
        let p = case.features.reference(1, q1 - q0, k1 - k0, case.heads, d);
        let k_rows = |x| sequence_rows(x, cu_k.offsets(), b, hkv, d);
        let expected = attention_with_alibi(
            &p,
            slopes_of(&reference_slopes, b, hq),
            sequence_rows(&q_dense, cu_q.offsets(), b, hq, d),
            k_rows(&k_dense),
            k_rows(&v_dense),
        );
        let o_b: Vec<f64> = sequence_rows(&o, cu_q.offsets(), b, hq, d).iter().map(|x| x.to_f64()).collect();
        // LSE [heads_q, total_q] -> this sequence's [1, heads_q, rows].
        let lse_b: Vec<f32> = (0..hq).flat_map(|h| lse[h * total_q + q0..h * total_q + q1].to_vec()).collect();
        let r = check_against::<T>(&format!("{case:?} sequence {b}"), &o_b, &lse_b, &expected);
        (worst_o, worst_lse) = (worst_o.max(r.o_error), worst_lse.max(r.lse_max_error));
    }
    let what = format!("{kernel} allocate={allocate} {case:?}");
    report(test, &what, &CaseResult { o_error: worst_o, lse_max_error: worst_lse });
}

/// Ragged and small enough for the sanitizers' cap on scores: an empty
/// first sequence, a tail of 40 rows, one without keys.
const SMALL_RAGGED: &[(usize, usize)] = &[(0, 5), (40, 70), (3, 3), (17, 0), (33, 129)];

fn varlen_cases(d: usize) -> Vec<VarlenCase> {
    let case = |heads, features| VarlenCase { lengths: RAGGED, heads, head_dim: d, features };
    let small = VarlenCase { lengths: SMALL_RAGGED, heads: (4, 2), head_dim: d, features: Features::default() };
    vec![
        small,
        VarlenCase { features: Features { causal: true, softcap: Some(3.0), ..Default::default() }, ..small },
        case((8, 2), Features::default()),
        case((4, 4), Features { causal: true, ..Default::default() }),
        case((6, 1), Features { causal: true, window: (Some(40), None), ..Default::default() }),
        case((8, 2), Features { softcap: Some(1.0), alibi: Alibi::PerBatchHead, ..Default::default() }),
        case((4, 2), Features { causal: true, num_splits: Some(3), ..Default::default() }),
    ]
}

fn run_varlen_cases<T: TestElement>(test: &str) {
    let Some((_context, attention)) = gpu(test) else { return };
    for d in [64, 128] {
        for case in varlen_cases(d) {
            run_varlen::<T>(test, &attention, &case, false);
        }
    }
    run_varlen::<T>(test, &attention, &varlen_cases(128)[3], true);
}

f16_and_bf16_tests!(f16_variable_length, bf16_variable_length: run_varlen_cases());

// ---- KV caches. ----

#[derive(Clone, Copy, Debug)]
enum CacheLayout {
    /// `[batch, capacity, heads_kv, d]`.
    Dense { capacity: usize },
    /// `[num_pages, page_size, heads_kv, d]`, `pages_per_seq` random pages
    /// per batch, out of `batch * pages_per_seq + 3`.
    Paged { page_size: usize, pages_per_seq: usize },
}

/// What the cache slots past each batch's keys hold.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Stale {
    /// Random values, like an overwritten cache.
    Random,
    /// NaN, which any read of them into the result would show; paged block
    /// table entries past each sequence's last page are -1.
    Nan,
}

#[derive(Clone, Copy, Debug)]
struct CacheCase {
    seqlen_q: usize,
    heads: (usize, usize),
    head_dim: usize,
    /// Cached keys per batch, before the append.
    cache_seqlens: &'static [i32],
    /// Keys appended per batch (0: none).
    seqlen_new: usize,
    layout: CacheLayout,
    stale: Stale,
    features: Features,
}

/// Runs a KV cache case (through `forward_kvcache` when `allocate`) with
/// `workspace`, checks that the caches hold exactly the appended keys and
/// values and are otherwise unchanged, and checks each batch against a
/// batch-1 reference over its cache gathered densely.
fn run_cache<T: TestElement>(
    test: &str,
    attention: &FlashAttention,
    case: &CacheCase,
    allocate: bool,
    workspace: &mut Workspace,
) {
    let keys: usize = case.cache_seqlens.iter().map(|&n| n as usize + case.seqlen_new).sum();
    if left_out_of_this_run(test, case, computed_scores(case.heads, case.seqlen_q, keys)) {
        return;
    }
    let (hq, hkv) = case.heads;
    let mut rng = test_rng(test);
    let (d, sq, new) = (case.head_dim, case.seqlen_q, case.seqlen_new);
    let lens = case.cache_seqlens;
    let batch = lens.len();
    let row = hkv * d;
    // Slots, the cache shape, and where key j of batch b lives.
    let (slots, cache_shape, table) = match case.layout {
        CacheLayout::Dense { capacity } => (batch * capacity, [batch, capacity, hkv, d], Vec::new()),
        CacheLayout::Paged { page_size, pages_per_seq } => {
            let num_pages = batch * pages_per_seq + 3;
            let mut pages: Vec<i32> = (0..num_pages as i32).collect();
            pages.shuffle(&mut rng);
            let mut table = pages[..batch * pages_per_seq].to_vec();
            if case.stale == Stale::Nan {
                for (b, &len) in lens.iter().enumerate() {
                    let used = (len as usize + new).div_ceil(page_size);
                    table[b * pages_per_seq + used..(b + 1) * pages_per_seq].fill(-1);
                }
            }
            (num_pages * page_size, [num_pages, page_size, hkv, d], table)
        }
    };
    let slot = |b: usize, j: usize| match case.layout {
        CacheLayout::Dense { capacity } => b * capacity + j,
        CacheLayout::Paged { page_size, pages_per_seq } => {
            table[b * pages_per_seq + j / page_size] as usize * page_size + j % page_size
        }
    };
    let fill = |rng: &mut rand::rngs::StdRng| {
        let mut cache: Vec<T> = match case.stale {
            Stale::Random => random_values::<T>(rng, slots * row).0,
            Stale::Nan => vec![T::from_bits(T::POISON); slots * row],
        };
        for (b, &len) in lens.iter().enumerate() {
            for j in 0..len as usize {
                cache[slot(b, j) * row..][..row].copy_from_slice(&random_values::<T>(rng, row).0);
            }
        }
        cache
    };
    let (k_cache, v_cache) = (fill(&mut rng), fill(&mut rng));
    let (k_new, _) = random_values::<T>(&mut rng, batch * new * row);
    let (v_new, _) = random_values::<T>(&mut rng, batch * new * row);
    // The caches as they must be after the append.
    let (mut k_after, mut v_after) = (k_cache.clone(), v_cache.clone());
    for (b, &len) in lens.iter().enumerate() {
        for i in 0..new {
            let (to, from) = (slot(b, len as usize + i) * row, (b * new + i) * row);
            k_after[to..to + row].copy_from_slice(&k_new[from..from + row]);
            v_after[to..to + row].copy_from_slice(&v_new[from..from + row]);
        }
    }
    let (q, q_dense) = random_values::<T>(&mut rng, batch * sq * hq * d);
    let (slopes, reference_slopes) = random_slopes(case.features.alibi, &mut rng, batch, hq);
    let slopes_dev = upload_slopes(&slopes);

    let stream = stream();
    let (mut k_dev, mut v_dev, q_dev) = (upload(&k_cache), upload(&v_cache), upload(&q));
    let (k_new_dev, v_new_dev) = (upload(&k_new), upload(&v_new));
    let cache_seqlens = CacheSeqlens::new(lens).expect("cache_seqlens");
    let block_table = (!table.is_empty()).then(|| {
        let CacheLayout::Paged { pages_per_seq, .. } = case.layout else { unreachable!() };
        BlockTable::new(&table, pages_per_seq).expect("block table")
    });
    let params = case.features.params(slopes_dev.as_ref());
    let q_shape = [batch, sq, hq, d];
    let mut cache = if new == 0 {
        KvCache::new(Tensor::new(&k_dev, cache_shape), Tensor::new(&v_dev, cache_shape), &cache_seqlens)
    } else {
        KvCache::appending(
            TensorMut::new(&mut k_dev, cache_shape),
            TensorMut::new(&mut v_dev, cache_shape),
            Tensor::new(&k_new_dev, [batch, new, hkv, d]),
            Tensor::new(&v_new_dev, [batch, new, hkv, d]),
            &cache_seqlens,
        )
    };
    if let Some(table) = &block_table {
        cache = cache.paged(table);
    }
    let (o, lse) = if allocate {
        let out = attention
            .forward_kvcache(Tensor::new(&q_dev, q_shape), cache, &params, workspace, &stream)
            .unwrap_or_else(refused(case));
        stream.synchronize().unwrap_or_else(|e| panic!("{case:?}: kernel failed: {e}"));
        (download(&out.o), download(&out.lse))
    } else {
        let mut o = poisoned::<T>(batch * sq * hq * d);
        let mut lse = upload(&vec![f32::NAN; batch * hq * sq]);
        attention
            .forward_kvcache_into(
                Tensor::new(&q_dev, q_shape),
                cache,
                TensorMut::new(&mut o, q_shape),
                &mut lse,
                &params,
                workspace,
                &stream,
            )
            .unwrap_or_else(refused(case));
        stream.synchronize().unwrap_or_else(|e| panic!("{case:?}: kernel failed: {e}"));
        (download(&o), download(&lse))
    };

    for (name, got, want) in [("k_cache", download(&k_dev), &k_after), ("v_cache", download(&v_dev), &v_after)] {
        if let Some(i) = got.iter().zip(want).position(|(a, b)| a.to_bits() != b.to_bits()) {
            panic!(
                "{case:?}: {name} element {i} (slot {}) is {:#06x}, expected {:#06x}",
                i / row,
                got[i].to_bits(),
                want[i].to_bits()
            );
        }
    }
    let (mut worst_o, mut worst_lse) = (0f64, 0f64);
    for (b, &len) in lens.iter().enumerate() {
        let keys = len as usize + new;
        let gather_cache = |cache: &[T]| -> Vec<f64> {
            (0..keys).flat_map(|j| cache[slot(b, j) * row..][..row].iter().map(|x| x.to_f64())).collect()
        };
        let p = case.features.reference(1, sq, keys, case.heads, d);
        let q_b = &q_dense[b * sq * hq * d..(b + 1) * sq * hq * d];
        let expected = attention_with_alibi(
            &p,
            slopes_of(&reference_slopes, b, hq),
            q_b,
            &gather_cache(&k_after),
            &gather_cache(&v_after),
        );
        let o_b: Vec<f64> = o[b * sq * hq * d..(b + 1) * sq * hq * d].iter().map(|x| x.to_f64()).collect();
        let lse_b = &lse[b * hq * sq..(b + 1) * hq * sq];
        let r = check_against::<T>(&format!("{case:?} batch {b}"), &o_b, lse_b, &expected);
        (worst_o, worst_lse) = (worst_o.max(r.o_error), worst_lse.max(r.lse_max_error));
    }
    let what = format!("{} allocate={allocate} {case:?}", <T as Element>::NAME);
    report(test, &what, &CaseResult { o_error: worst_o, lse_max_error: worst_lse });
}

fn cache(
    seqlen_q: usize,
    heads: (usize, usize),
    head_dim: usize,
    cache_seqlens: &'static [i32],
    seqlen_new: usize,
    layout: CacheLayout,
    features: Features,
) -> CacheCase {
    CacheCase { seqlen_q, heads, head_dim, cache_seqlens, seqlen_new, layout, stale: Stale::Random, features }
}

fn dense_cache_cases(d: usize) -> Vec<CacheCase> {
    let causal = |num_splits| Features { causal: true, num_splits, ..Default::default() };
    let decode = |num_splits| {
        cache(1, (32, 4), d, &[0, 1, 700, 4097], 0, CacheLayout::Dense { capacity: 4200 }, causal(num_splits))
    };
    vec![
        // Decode, GQA 8:1, ragged lengths (an empty cache too), forced and automatic splits.
        decode(Some(1)),
        decode(Some(3)),
        decode(None),
        // Decode with a one-token append.
        cache(1, (32, 4), d, &[5, 1000, 333], 1, CacheLayout::Dense { capacity: 1024 }, causal(None)),
        // Chunked prefill: 7 new queries, keys and values.
        cache(7, (8, 2), d, &[0, 100, 1020], 7, CacheLayout::Dense { capacity: 1100 }, causal(None)),
        // Window, softcap and ALiBi over a small cache.
        cache(
            3,
            (4, 4),
            d,
            &[64, 65, 2],
            0,
            CacheLayout::Dense { capacity: 128 },
            Features {
                causal: true,
                window: (Some(16), None),
                softcap: Some(1.0),
                alibi: Alibi::PerHead,
                ..Default::default()
            },
        ),
    ]
}

fn paged_cache_cases(d: usize) -> Vec<CacheCase> {
    vec![
        // Paged + append + split.
        cache(
            1,
            (32, 4),
            d,
            &[0, 63, 64, 1000],
            1,
            CacheLayout::Paged { page_size: 64, pages_per_seq: 17 },
            Features { causal: true, num_splits: Some(3), ..Default::default() },
        ),
        cache(
            1,
            (16, 2),
            d,
            &[700, 3000],
            0,
            CacheLayout::Paged { page_size: 256, pages_per_seq: 12 },
            Features { causal: true, ..Default::default() },
        ),
        cache(
            5,
            (8, 2),
            d,
            &[200, 0, 511],
            5,
            CacheLayout::Paged { page_size: 128, pages_per_seq: 5 },
            Features { causal: true, window: (Some(64), None), ..Default::default() },
        ),
    ]
}

fn run_cache_cases<T: TestElement>(test: &str, cases: fn(usize) -> Vec<CacheCase>) {
    let Some((_context, attention)) = gpu(test) else { return };
    // One workspace for every case: it grows as they need.
    let mut workspace = Workspace::new();
    for d in [64, 128] {
        for case in cases(d) {
            run_cache::<T>(test, &attention, &case, false, &mut workspace);
        }
    }
    run_cache::<T>(test, &attention, &cases(128)[0], true, &mut workspace);
}

f16_and_bf16_tests!(f16_dense_kv_cache, bf16_dense_kv_cache: run_cache_cases(dense_cache_cases));

f16_and_bf16_tests!(f16_paged_kv_cache, bf16_paged_kv_cache: run_cache_cases(paged_cache_cases));

/// Cache slots past each batch's keys (and, paged, the pages past its last
/// one, whose table entries are -1) hold NaN: none may reach the result.
#[test]
fn stale_cache_slots_are_never_read() {
    let test = "stale_cache_slots_are_never_read";
    let Some((_context, attention)) = gpu(test) else { return };
    let mut workspace = Workspace::new();
    let features = |num_splits| Features { causal: true, num_splits, ..Default::default() };
    for num_splits in [Some(1), Some(4), None] {
        for layout in [CacheLayout::Dense { capacity: 2100 }, CacheLayout::Paged { page_size: 64, pages_per_seq: 33 }] {
            let case = CacheCase {
                stale: Stale::Nan,
                ..cache(1, (8, 1), 128, &[1, 77, 2000], 1, layout, features(num_splits))
            };
            run_cache::<f16>(test, &attention, &case, false, &mut workspace);
            let prefill = CacheCase { seqlen_q: 40, seqlen_new: 40, cache_seqlens: &[0, 5, 1999], ..case };
            run_cache::<bf16>(test, &attention, &prefill, false, &mut workspace);
        }
    }
}

/// Head dims other than 64 and 128: a window, a split decode over a paged
/// cache, and a variable-length batch.
fn run_other_head_dims<T: TestElement>(test: &str) {
    let Some((_context, attention)) = gpu(test) else { return };
    let mut workspace = Workspace::new();
    for d in [32, 96, 160, 256] {
        let windowed = Features { causal: true, window: (Some(50), None), softcap: Some(1.0), ..Default::default() };
        run_dense::<T>(test, &attention, &dense(2, (150, 333), (4, 2), d, windowed), false);
        let split = Features { causal: true, num_splits: Some(5), ..Default::default() };
        let paged = CacheLayout::Paged { page_size: 64, pages_per_seq: 40 };
        run_cache::<T>(test, &attention, &cache(1, (16, 2), d, &[1, 2500], 1, paged, split), false, &mut workspace);
        let varlen = VarlenCase {
            lengths: RAGGED,
            heads: (4, 2),
            head_dim: d,
            features: Features { causal: true, ..Default::default() },
        };
        run_varlen::<T>(test, &attention, &varlen, false);
    }
}

f16_and_bf16_tests!(f16_other_head_dims, bf16_other_head_dims: run_other_head_dims());

/// The decode-kernel cases in which compute-sanitizer's synccheck found
/// warps meeting the merge barrier at two instructions (LLVM had duplicated
/// an `asm!` barrier into both arms of a branch): checked against the
/// reference here, and run under all four sanitizers by gpu-check.sh.
#[test]
fn decode_cases_from_the_synccheck_report() {
    let test = "decode_cases_from_the_synccheck_report";
    let Some((_context, attention)) = gpu(test) else { return };
    let mut workspace = Workspace::new();
    let causal = |num_splits| Features { causal: true, num_splits, ..Default::default() };
    // Paged, d=224: 4 keys appended to an empty cache, pages of 128, 32 splits.
    let paged = CacheLayout::Paged { page_size: 128, pages_per_seq: 1 };
    run_cache::<bf16>(
        test,
        &attention,
        &cache(1, (2, 2), 224, &[0], 4, paged, causal(Some(32))),
        false,
        &mut workspace,
    );
    // Dense, d=128, 3 query heads over 1, 5 queries over 17 keys, 2 splits.
    run_dense::<f16>(test, &attention, &dense(2, (5, 17), (3, 1), 128, causal(Some(2))), false);
    // A KV cache, d=32, one query over 127 cached keys, no split.
    let dense_cache = CacheLayout::Dense { capacity: 128 };
    run_cache::<f16>(
        test,
        &attention,
        &cache(1, (1, 1), 32, &[127], 0, dense_cache, causal(Some(1))),
        false,
        &mut workspace,
    );
}

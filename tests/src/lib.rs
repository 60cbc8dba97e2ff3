//! Shared code of the GPU integration tests and the benchmark: random
//! inputs, strided uploads, running one case against the f64 reference,
//! the test-only kernels' PTX ([`TEST_PTX`]), and the [`emulator`] driver,
//! which runs the host's pipeline on the CPU emulator for the emulator
//! tests, the cross-check and the `emulate` example.

use flash_attn::cust::context::Context;
use flash_attn::cust::memory::DeviceCopy;
use flash_attn::cust::memory::{CopyDestination, DeviceBuffer};
use flash_attn::cust::stream::{Stream, StreamFlags};
use flash_attn::half1::{bf16, f16};
use flash_attn::reference::{self, ReferenceOutput, ReferenceProblem};
use flash_attn::{AttentionParams, CallPlan, Element, FlashAttention, Tensor, TensorMut};
use rand::Rng;

pub mod check;
pub mod emulator;
pub mod seed;

pub use check::LSE_TOLERANCE;

/// The PTX of the test-only kernels, built from `kernels/` with its
/// feature `test-kernels` by `cargo xtask build-ptx`: `probe_primitives`
/// (the emulator cross-check) and `mma_ceiling` (the benchmark's ceiling).
/// Users' builds embed only the attention kernels (`flash_attn::PTX`).
pub const TEST_PTX: &str = include_str!("../test-kernels.ptx");

/// The PTX of the sm_90a primitive probe (`probe_sm90`), built for sm_90a
/// with the kernels crate's feature `test-kernels-sm90a`: it loads on
/// compute capability 9.0 only (H100, H200).
pub const TEST_PTX_SM90A: &str = include_str!("../test-kernels-sm90a.ptx");

/// An element type under test: its conversions (its error budget is
/// [`check::budget`] of its `Element::DTYPE`).
pub trait TestElement: Element + DeviceCopy + Copy + Default {
    /// A bit pattern that is NaN, to poison outputs.
    const POISON: u16;
    fn from_f32(x: f32) -> Self;
    fn to_f64(self) -> f64;
    fn from_bits(bits: u16) -> Self;
    fn to_bits(self) -> u16;
}

impl TestElement for f16 {
    const POISON: u16 = 0x7e00;
    fn from_f32(x: f32) -> Self {
        f16::from_f32(x)
    }
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
    fn from_bits(bits: u16) -> Self {
        f16::from_bits(bits)
    }
    fn to_bits(self) -> u16 {
        self.to_bits()
    }
}

impl TestElement for bf16 {
    const POISON: u16 = 0x7fc0;
    fn from_f32(x: f32) -> Self {
        bf16::from_f32(x)
    }
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
    fn from_bits(bits: u16) -> Self {
        bf16::from_bits(bits)
    }
    fn to_bits(self) -> u16 {
        self.to_bits()
    }
}

/// Says on the terminal, past the test harness's output capture, that a
/// test did not run and why.
pub fn skipped(test: &str, why: &str) {
    use std::io::Write;
    // One write, from a line of its own: the harness's "test ... " of
    // another thread may be waiting for its result on the current line, and
    // scripts/test.sh counts the lines that start with SKIPPED.
    let line = format!("\nSKIPPED {test}: {why}\n");
    let _ = std::io::stderr().write_all(line.as_bytes());
}

/// The environment variable that caps the cases of a run: gpu-check.sh
/// sets it under the sanitizers that slow kernels most (racecheck,
/// initcheck), which then check the small cases and leave the large ones to
/// the plain run and the faster tools.
pub const MAX_SCORES_VAR: &str = "FLASH_ATTN_TEST_MAX_SCORES";

/// The attention scores a call's kernels compute, as the cap of
/// [`left_out_of_this_run`] counts them: each KV head's query rows (its
/// query heads' `seqlen_q` rows together, as the GQA decode layout runs
/// them) padded to the decode kernel's 16-row blocks, times the keys
/// (summed over the batch). Counted as query rows alone, a decode step of
/// 32 query heads over 4798 keys passed the sanitizers' cap and ran for
/// minutes under racecheck.
pub fn computed_scores((heads_q, heads_kv): (usize, usize), seqlen_q: usize, keys: usize) -> usize {
    heads_kv * (heads_q / heads_kv.max(1) * seqlen_q).next_multiple_of(16) * keys
}

/// Whether a case of `scores` attention scores (batch * query heads *
/// queries * keys) is past the cap of [`MAX_SCORES_VAR`]; says so if it is.
pub fn left_out_of_this_run(test: &str, case: &dyn std::fmt::Debug, scores: usize) -> bool {
    let Some(max) = std::env::var(MAX_SCORES_VAR).ok().and_then(|v| v.parse::<usize>().ok()) else {
        return false;
    };
    if scores <= max {
        return false;
    }
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "LEFT OUT {test}: {scores} scores over {MAX_SCORES_VAR}={max}: {case:?}");
    true
}

/// A CUDA context and the loaded kernels, or `None` with the reason printed
/// when this machine has no usable GPU.
pub fn gpu(test: &str) -> Option<(Context, FlashAttention)> {
    let context = match flash_attn::cust::quick_init() {
        Ok(c) => c,
        Err(e) => {
            skipped(test, &format!("no usable CUDA GPU ({e}); the GPU tests run on a GPU machine (see README)"));
            return None;
        }
    };
    match FlashAttention::new() {
        Ok(attention) => Some((context, attention)),
        Err(flash_attn::Error::UnsupportedDevice { major, minor }) => {
            skipped(test, &format!("GPU has compute capability {major}.{minor}; the kernels need 8.0+"));
            None
        }
        Err(e) => panic!("loading the kernels failed: {e}"),
    }
}

/// Standard normal samples (Box-Muller).
pub fn normal(rng: &mut impl Rng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let (u, v): (f32, f32) = (rng.gen_range(f32::EPSILON..1.0), rng.gen());
            (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos()
        })
        .collect()
}

/// How a test tensor is laid out in its buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    Contiguous,
    /// `[batch, heads, seqlen, d]` in memory, viewed as `[batch, seqlen, heads, d]`.
    HeadsMajor,
    /// Contiguous but with 8 padding elements after every head and 16 after every row.
    Padded,
}

impl Placement {
    /// Strides (elements) of a `[b, s, h, d]` tensor placed this way.
    pub fn strides(self, [_, s, h, d]: [usize; 4]) -> [usize; 4] {
        match self {
            Placement::Contiguous => [s * h * d, h * d, d, 1],
            Placement::HeadsMajor => [h * s * d, d, s * d, 1],
            Placement::Padded => {
                let head = d + 8;
                let row = h * head + 16;
                [s * row, row, head, 1]
            }
        }
    }
}

/// A host copy of a tensor in its buffer, and its values gathered densely in f64.
pub struct HostTensor<T> {
    pub buffer: Vec<T>,
    pub shape: [usize; 4],
    pub strides: [usize; 4],
    pub dense: Vec<f64>,
}

fn offset([b, s, h, d]: [usize; 4], strides: [usize; 4]) -> usize {
    b * strides[0] + s * strides[1] + h * strides[2] + d * strides[3]
}

pub fn span(shape: [usize; 4], strides: [usize; 4]) -> usize {
    offset(shape.map(|n| n - 1), strides) + 1
}

/// Every index of a `[b, s, h, d]` shape, in row-major order.
fn indices(shape: [usize; 4]) -> impl Iterator<Item = [usize; 4]> {
    let [nb, ns, nh, nd] = shape;
    (0..nb).flat_map(move |b| (0..ns).flat_map(move |s| (0..nh).flat_map(move |h| (0..nd).map(move |d| [b, s, h, d]))))
}

/// The values of a `[b, s, h, d]` tensor in `buffer` with `strides`, densely in f64.
pub fn gather<T: TestElement>(buffer: &[T], shape: [usize; 4], strides: [usize; 4]) -> Vec<f64> {
    indices(shape).map(|i| buffer[offset(i, strides)].to_f64()).collect()
}

/// Fresh random normal values (every buffer element, padding too).
pub fn random_tensor<T: TestElement>(rng: &mut impl Rng, shape: [usize; 4], placement: Placement) -> HostTensor<T> {
    let strides = placement.strides(shape);
    let buffer: Vec<T> = normal(rng, span(shape, strides)).into_iter().map(T::from_f32).collect();
    let dense = gather(&buffer, shape, strides);
    HostTensor { buffer, shape, strides, dense }
}

/// One test case.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Case {
    pub batch: usize,
    pub seqlen_q: usize,
    pub seqlen_k: usize,
    pub heads_q: usize,
    pub heads_kv: usize,
    pub head_dim: usize,
    pub causal: bool,
    pub softmax_scale: Option<f32>,
    pub placement: Placement,
}

/// What one case measured.
#[derive(Debug)]
pub struct CaseResult {
    pub o_error: f64,
    pub lse_max_error: f64,
}

/// The random inputs of one case.
pub struct Inputs<T> {
    pub q: HostTensor<T>,
    pub k: HostTensor<T>,
    pub v: HostTensor<T>,
}

/// Fresh random inputs for `case`.
pub fn random_inputs<T: TestElement>(case: &Case, rng: &mut impl Rng) -> Inputs<T> {
    let kv_shape = [case.batch, case.seqlen_k, case.heads_kv, case.head_dim];
    Inputs {
        q: random_tensor(rng, [case.batch, case.seqlen_q, case.heads_q, case.head_dim], case.placement),
        k: random_tensor(rng, kv_shape, case.placement),
        v: random_tensor(rng, kv_shape, case.placement),
    }
}

/// A sliding window and a softcap on top of a [`Case`] (none by default).
#[derive(Clone, Copy, Debug, Default)]
pub struct Modifiers {
    pub window: (Option<usize>, Option<usize>),
    pub softcap: Option<f32>,
}

impl Case {
    /// The call's parameters: the case's mask and scale, `modifiers`, never
    /// split (these cases test the dense kernels; tests/tests/gpu_features.rs
    /// tests the general ones, split-KV included).
    pub fn params(&self, modifiers: Modifiers) -> AttentionParams<'static> {
        AttentionParams {
            causal: self.causal,
            softmax_scale: self.softmax_scale,
            window: modifiers.window,
            softcap: modifiers.softcap,
            num_splits: Some(1),
            ..Default::default()
        }
    }
}

/// Runs `case` on the GPU into NaN-poisoned outputs; returns O gathered
/// densely (`[b, sq, hq, d]`) and the LSE.
pub fn launch<T: TestElement>(attention: &FlashAttention, case: &Case, inputs: &Inputs<T>) -> (Vec<f64>, Vec<f32>) {
    launch_with(attention, case, Modifiers::default(), inputs)
}

/// As [`launch`], with a window and softcap.
pub fn launch_with<T: TestElement>(
    attention: &FlashAttention,
    case: &Case,
    modifiers: Modifiers,
    inputs: &Inputs<T>,
) -> (Vec<f64>, Vec<f32>) {
    let (_, o, lse) = launch_explained(attention, case, modifiers, inputs);
    (o, lse)
}

/// As [`launch_with`], and what [`FlashAttention::explain_forward`] said
/// the call would run, asked on the same buffers right before it.
pub fn launch_explained<T: TestElement>(
    attention: &FlashAttention,
    case: &Case,
    modifiers: Modifiers,
    inputs: &Inputs<T>,
) -> (CallPlan, Vec<f64>, Vec<f32>) {
    let Inputs { q, k, v } = inputs;
    let stream = Stream::new(StreamFlags::NON_BLOCKING, None).expect("stream");
    let upload = |t: &HostTensor<T>| DeviceBuffer::from_slice(&t.buffer).expect("upload");
    let (q_dev, k_dev, v_dev) = (upload(q), upload(k), upload(v));
    let o_strides = case.placement.strides(q.shape);
    let mut o_dev = DeviceBuffer::from_slice(&vec![T::from_bits(T::POISON); span(q.shape, o_strides)]).expect("o");
    let lse_len = case.batch * case.heads_q * case.seqlen_q;
    let mut lse_dev = DeviceBuffer::from_slice(&vec![f32::NAN; lse_len]).expect("lse");

    let params = case.params(modifiers);
    let explained = attention
        .explain_forward(
            Tensor::strided(&q_dev, q.shape, q.strides),
            Tensor::strided(&k_dev, k.shape, k.strides),
            Tensor::strided(&v_dev, v.shape, v.strides),
            TensorMut::strided(&mut o_dev, q.shape, o_strides),
            &mut lse_dev,
            &params,
        )
        .unwrap_or_else(|e| panic!("{case:?}: explain_forward refused: {e}"));
    attention
        .forward_into(
            Tensor::strided(&q_dev, q.shape, q.strides),
            Tensor::strided(&k_dev, k.shape, k.strides),
            Tensor::strided(&v_dev, v.shape, v.strides),
            TensorMut::strided(&mut o_dev, q.shape, o_strides),
            &mut lse_dev,
            &params,
            &stream,
        )
        .unwrap_or_else(|e| panic!("{case:?}: forward refused: {e}"));
    stream.synchronize().unwrap_or_else(|e| panic!("{case:?}: kernel failed: {e}"));

    let mut o_host = vec![T::default(); o_dev.len()];
    o_dev.copy_to(&mut o_host[..]).expect("download o");
    let mut lse = vec![0f32; lse_len];
    lse_dev.copy_to(&mut lse[..]).expect("download lse");
    (explained, gather(&o_host, q.shape, o_strides), lse)
}

/// Checks a GPU result against the f64 reference; panics, naming the case,
/// on any failure.
pub fn check<T: TestElement>(case: &Case, inputs: &Inputs<T>, o: &[f64], lse: &[f32]) -> CaseResult {
    check_with(case, Modifiers::default(), inputs, o, lse)
}

/// As [`check`], for a call with `modifiers`.
pub fn check_with<T: TestElement>(
    case: &Case,
    modifiers: Modifiers,
    inputs: &Inputs<T>,
    o: &[f64],
    lse: &[f32],
) -> CaseResult {
    let mut problem = ReferenceProblem::dense(
        case.batch,
        case.seqlen_q,
        case.seqlen_k,
        case.heads_q,
        case.heads_kv,
        case.head_dim,
        case.causal,
        case.softmax_scale.map_or(1.0 / (case.head_dim as f64).sqrt(), f64::from),
    );
    problem.window = modifiers.window;
    problem.softcap = modifiers.softcap.map(f64::from);
    let expected = reference::attention(&problem, &inputs.q.dense, &inputs.k.dense, &inputs.v.dense);
    check_against::<T>(&format!("{case:?} {modifiers:?}"), o, lse, &expected)
}

/// Checks O (`[batch, seqlen_q, heads_q, d]`, gathered densely) and the LSE
/// (`[batch, heads_q, seqlen_q]`) of a GPU run against `expected`: every O
/// finite, its errors (the whole tensor's and each row's,
/// [`check::compare`]) within `T`'s budget (exactly 0 where no row sees a
/// key), each finite LSE within [`LSE_TOLERANCE`] and `-inf` exactly where
/// a row sees no key. Panics naming `what` on any failure.
pub fn check_against<T: TestElement>(what: &str, o: &[f64], lse: &[f32], expected: &ReferenceOutput) -> CaseResult {
    assert_eq!(o.len(), expected.o.len(), "{what}: O length");
    assert_eq!(lse.len(), expected.lse.len(), "{what}: LSE length");
    assert!(!lse.is_empty() && o.len().is_multiple_of(lse.len()), "{what}: O is not rows of the LSE's");
    let o_error = if expected.o.iter().all(|&x| x == 0.0) {
        // Every row masked: O must be exactly zero.
        assert!(o.iter().all(|&x| x == 0.0), "{what}: rows that see no key must give O = 0");
        0.0
    } else {
        check::assert_close(&format!("{what}: O"), T::DTYPE, o, &expected.o, o.len() / lse.len()).relative_l2
    };

    let mut lse_max_error = 0f64;
    for (i, (&got, &want)) in lse.iter().zip(&expected.lse).enumerate() {
        if want == f64::NEG_INFINITY {
            assert!(got == f32::NEG_INFINITY, "{what}: LSE[{i}] = {got}, expected -inf (row sees no key)");
        } else {
            let err = (got as f64 - want).abs();
            assert!(err.is_finite() && err <= LSE_TOLERANCE, "{what}: LSE[{i}] = {got}, expected {want}");
            lse_max_error = lse_max_error.max(err);
        }
    }
    CaseResult { o_error, lse_max_error }
}

/// `n` fresh random normal values, as `T` and (exactly) as f64.
pub fn random_values<T: TestElement>(rng: &mut impl Rng, n: usize) -> (Vec<T>, Vec<f64>) {
    let values: Vec<T> = normal(rng, n).into_iter().map(T::from_f32).collect();
    let dense = values.iter().map(|x| x.to_f64()).collect();
    (values, dense)
}

/// Sequence `b`'s rows of a packed `[total, heads, d]` tensor whose
/// sequences start at `offsets` (`cu_seqlens`, one more than sequences).
pub fn sequence_rows<'a, E>(x: &'a [E], offsets: &[i32], b: usize, heads: usize, d: usize) -> &'a [E] {
    let row = heads * d;
    &x[offsets[b] as usize * row..offsets[b + 1] as usize * row]
}

/// A device copy of `values`.
pub fn upload<T: flash_attn::cust::memory::DeviceCopy>(values: &[T]) -> DeviceBuffer<T> {
    DeviceBuffer::from_slice(values).expect("upload")
}

/// `n` elements of NaN on the device, for outputs that must all be written.
pub fn poisoned<T: TestElement>(n: usize) -> DeviceBuffer<T> {
    upload(&vec![T::from_bits(T::POISON); n])
}

/// A host copy of a device buffer.
pub fn download<T: flash_attn::cust::memory::DeviceCopy + Default + Clone>(buffer: &DeviceBuffer<T>) -> Vec<T> {
    let mut host = vec![T::default(); buffer.len()];
    buffer.copy_to(&mut host[..]).expect("download");
    host
}

/// Runs `case` with fresh random inputs and checks it against the reference.
pub fn run_case<T: TestElement>(attention: &FlashAttention, case: &Case, rng: &mut impl Rng) -> CaseResult {
    let inputs = random_inputs::<T>(case, rng);
    let (o, lse) = launch(attention, case, &inputs);
    check(case, &inputs, &o, &lse)
}

/// Runs `case` twice on the same inputs and asserts bit-identical outputs,
/// which a race between warps would break.
pub fn assert_deterministic<T: TestElement>(attention: &FlashAttention, case: &Case, rng: &mut impl Rng) {
    let inputs = random_inputs::<T>(case, rng);
    let (o1, lse1) = launch(attention, case, &inputs);
    let (o2, lse2) = launch(attention, case, &inputs);
    check(case, &inputs, &o1, &lse1);
    assert!(o1.iter().zip(&o2).all(|(a, b)| a.to_bits() == b.to_bits()), "{case:?}: O differs between two runs");
    assert!(lse1.iter().zip(&lse2).all(|(a, b)| a.to_bits() == b.to_bits()), "{case:?}: LSE differs between two runs");
}

/// Declares one `#[test]` per element type, `$f16` and `$bf16`, each calling
/// `$run::<T>` with its own name (which its SKIPPED line and failures quote)
/// followed by `$arg`s.
#[macro_export]
macro_rules! f16_and_bf16_tests {
    ($f16:ident, $bf16:ident: $run:ident($($arg:expr),* $(,)?)) => {
        #[test]
        fn $f16() {
            $run::<::flash_attn::half1::f16>(stringify!($f16) $(, $arg)*);
        }

        #[test]
        fn $bf16() {
            $run::<::flash_attn::half1::bf16>(stringify!($bf16) $(, $arg)*);
        }
    };
}

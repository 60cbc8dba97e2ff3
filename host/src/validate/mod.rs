//! Input validation and kernel argument construction, as pure functions of
//! shapes, strides and addresses, so that every rule is tested without a GPU.

use std::ops::Range;

use flash_attn_abi::kernels::Dtype;

use flash_attn_abi::config::{self, TileConfig};

use crate::call::{Alibi, Append, Call, LseLayout, Mask, Outputs, Problem, Sequences, TensorAt};
use crate::error::{Error, Result};
use crate::limits::{MAX_DIM, MAX_GRID_YZ, MAX_ROW_STRIDE, MAX_SEQLEN, MAX_SPAN, MAX_SPLITS};
use crate::memory::DeviceView;

mod backward;
mod kvcache;
mod varlen;

pub use backward::{validate_backward, BackwardTensors};
pub use kvcache::{check_block_table_shape, check_cache_seqlens, validate_kvcache, CacheArgs, TableArg};
pub use varlen::{check_seq_offsets, validate_varlen, OffsetsArg, OffsetsSummary};

/// Shape and strides (in elements) of a `[batch, seqlen, heads, head_dim]` tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub shape: [usize; 4],
    pub strides: [usize; 4],
}

impl Layout {
    /// A densely packed, row-major layout of `shape` (strides saturate on
    /// overflow, which validation then reports as too large).
    pub fn contiguous(shape: [usize; 4]) -> Self {
        let [_, s, h, d] = shape;
        Layout { shape, strides: [s.saturating_mul(h).saturating_mul(d), h.saturating_mul(d), d, 1] }
    }

    /// Number of elements, or `None` on overflow.
    pub fn elements(&self) -> Option<usize> {
        self.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d))
    }

    /// Whether distinct indices address distinct elements: sorted by stride,
    /// each dimension steps past everything the smaller ones span.
    pub fn is_non_overlapping(&self) -> bool {
        let mut dims: Vec<(usize, usize)> =
            self.shape.iter().copied().zip(self.strides).filter(|&(n, _)| n > 1).collect();
        dims.sort_by_key(|&(_, stride)| stride);
        let mut spanned = 1usize;
        for (n, stride) in dims {
            if stride < spanned {
                return false;
            }
            let Some(next) = stride.checked_mul(n) else { return false };
            spanned = next;
        }
        true
    }

    /// A layout with the given strides.
    pub fn strided(shape: [usize; 4], strides: [usize; 4]) -> Self {
        Layout { shape, strides }
    }

    /// Elements from the first to one past the last one addressed, or `None`
    /// if that overflows (an empty layout spans 0).
    pub fn span(&self) -> Option<usize> {
        if self.shape.contains(&0) {
            return Some(0);
        }
        let mut last = 0usize;
        for (n, s) in self.shape.iter().zip(self.strides) {
            last = last.checked_add((n - 1).checked_mul(s)?)?;
        }
        last.checked_add(1)
    }
}

/// A tensor as the validator sees it: layout, device address and the
/// number of elements of the buffer behind it.
#[derive(Clone, Copy, Debug)]
pub struct Placed {
    pub name: &'static str,
    pub layout: Layout,
    pub addr: u64,
    pub buffer_len: usize,
}

/// The options of one attention call. Every field but `causal` and
/// `softmax_scale` is a feature of the general kernels; with all of them
/// off (and no split), a call runs the dense kernels.
///
/// ```no_run
/// use flash_attn::AttentionParams;
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let _context = flash_attn::cust::quick_init()?;
/// // Mistral-style local attention: causal, each query sees its 4096 latest keys.
/// let local = AttentionParams { causal: true, window: (Some(4096), None), ..Default::default() };
/// // Gemma-2-style logit softcapping.
/// let capped = AttentionParams { softcap: Some(50.0), ..Default::default() };
/// // ALiBi, one slope per query head (device memory, f32).
/// let slopes = flash_attn::cust::memory::DeviceBuffer::from_slice(&[0.5f32, 0.25, 0.125, 0.0625])?;
/// let alibi = AttentionParams { causal: true, alibi_slopes: Some((&slopes).into()), ..Default::default() };
/// // No split-KV, whatever the heuristic would choose.
/// let unsplit = AttentionParams { num_splits: Some(1), ..Default::default() };
/// # let _ = (local, capped, alibi, unsplit);
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct AttentionParams<'a> {
    /// Causal masking, aligned to the bottom-right corner when
    /// `seqlen_q != seqlen_k` (as FlashAttention-2): query `i` sees keys
    /// `j <= i + seqlen_k - seqlen_q`.
    pub causal: bool,
    /// Multiplies `q k^T` before the softmax; `None` means `1/sqrt(head_dim)`.
    pub softmax_scale: Option<f32>,
    /// Local (sliding window) attention, FlashAttention-2's `window_size`
    /// with `None` for its -1: query `i` sees key `j` when
    /// `i + seqlen_k - seqlen_q - left <= j <= i + seqlen_k - seqlen_q + right`;
    /// `None` leaves a side unbounded. With `causal`, the right side is 0.
    pub window: (Option<usize>, Option<usize>),
    /// Softcap `c`: the scaled scores `s` become `c * tanh(s / c)` before the
    /// softmax. Must be finite and positive.
    pub softcap: Option<f32>,
    /// ALiBi slopes, f32 in device memory: either one per query head
    /// (`[heads_q]`) or one per batch and query head (`[batch, heads_q]`).
    /// Query `i` of head `h` adds `-slope[h] * |i + seqlen_k - seqlen_q - j|`
    /// to its score for key `j`.
    pub alibi_slopes: Option<DeviceView<'a, f32>>,
    /// Split-KV: how many CTAs share the keys of each query block (their
    /// partial results are then merged by a second kernel). `None` lets
    /// [`num_splits_heuristic`](crate::num_splits_heuristic) choose;
    /// `Some(1)` never splits. At most [`MAX_SPLITS`](crate::limits::MAX_SPLITS).
    pub num_splits: Option<usize>,
    /// Backward only: dQ summed in a fixed order, so that the same inputs
    /// give bitwise the same gradients (dK and dV always are). It takes
    /// more scratch, one f32 accumulator of dQ per group of key blocks
    /// that run concurrently instead of one added to with atomics, and a
    /// launch per such group: a call that would need more than
    /// [`MAX_DETERMINISTIC_LAUNCHES`](crate::pipeline::MAX_DETERMINISTIC_LAUNCHES)
    /// is refused (`Error::TooLarge`). The forward is deterministic either
    /// way and ignores it.
    pub deterministic: bool,
}

/// The tile config of the kernels for `head_dim`.
pub fn tile_config(head_dim: usize) -> Result<TileConfig> {
    u32::try_from(head_dim).ok().and_then(config::tile_config).ok_or(Error::UnsupportedHeadDim(head_dim))
}

pub(crate) fn check_tensor(t: &Placed) -> Result<()> {
    if t.layout.shape.contains(&0) {
        return Err(Error::EmptyTensor { tensor: t.name });
    }
    // Sizes first: a contiguous layout of a shape too large has saturated strides.
    let span = t.layout.span().filter(|&span| span <= MAX_SPAN);
    let Some(needed) = span.filter(|_| t.layout.shape.iter().all(|&n| n <= MAX_DIM)) else {
        return Err(Error::TensorTooLarge { tensor: t.name, shape: t.layout.shape, strides: t.layout.strides });
    };
    if t.layout.strides[3] != 1 {
        return Err(Error::LastDimNotContiguous { tensor: t.name, stride: t.layout.strides[3] });
    }
    if t.addr % 16 != 0 {
        return Err(Error::Misaligned { tensor: t.name, what: "the base address" });
    }
    for (stride, what) in
        t.layout.strides[..3].iter().zip(["the batch stride", "the seqlen stride", "the heads stride"])
    {
        if stride % 8 != 0 {
            return Err(Error::Misaligned { tensor: t.name, what });
        }
    }
    if needed > t.buffer_len {
        return Err(Error::OutOfBounds { tensor: t.name, needed, len: t.buffer_len });
    }
    Ok(())
}

/// The row stride of a tensor the kernels tile: at most [`MAX_ROW_STRIDE`]
/// where there is more than one row (the stride of a single row is never
/// multiplied by a row index other than 0).
pub(crate) fn check_row_stride(t: &Placed) -> Result<()> {
    let stride = t.layout.strides[1];
    if t.layout.shape[1] > 1 && stride > MAX_ROW_STRIDE {
        return Err(Error::RowStrideTooLarge { tensor: t.name, stride, max: MAX_ROW_STRIDE });
    }
    Ok(())
}

/// An argument's name and the bytes of its buffer.
pub(crate) type Bytes = (&'static str, Range<u64>);

/// The bytes of a buffer `name` of `len` elements of `elem_bytes` at `addr`.
pub(crate) fn bytes(name: &'static str, addr: u64, len: usize, elem_bytes: u64) -> Bytes {
    (name, addr..addr.saturating_add((len as u64).saturating_mul(elem_bytes)))
}

/// The bytes of the buffer behind a 16-bit tensor.
pub(crate) fn tensor_bytes(t: &Placed) -> Bytes {
    bytes(t.name, t.addr, t.buffer_len, 2)
}

fn overlaps(a: &Range<u64>, b: &Range<u64>) -> bool {
    a.start < b.end && b.start < a.end
}

/// Fails with [`Error::Aliasing`] if an output overlaps another output or
/// any input.
pub(crate) fn check_aliasing(outputs: &[Bytes], inputs: &[Bytes]) -> Result<()> {
    for (i, (output, out)) in outputs.iter().enumerate() {
        if let Some((other, _)) = outputs[i + 1..].iter().chain(inputs).find(|(_, other)| overlaps(out, other)) {
            return Err(Error::Aliasing { output, other });
        }
    }
    Ok(())
}

pub(crate) fn too_large(what: &'static str, value: usize, max: usize) -> Result<()> {
    if value > max {
        Err(Error::TooLarge { what, value, max })
    } else {
        Ok(())
    }
}

/// A tensor the call writes must have distinct elements, so that no two
/// of its writes land on one element.
pub(crate) fn check_distinct_elements(t: &Placed) -> Result<()> {
    if !t.layout.is_non_overlapping() {
        return Err(Error::OverlappingOutput { tensor: t.name, strides: t.layout.strides });
    }
    Ok(())
}

/// `o` must have `q`'s shape, and distinct elements.
pub(crate) fn check_output(q: &Placed, o: &Placed) -> Result<()> {
    if o.layout.shape != q.layout.shape {
        return Err(Error::ShapeMismatch(format!("o is {:?} but q is {:?}", o.layout.shape, q.layout.shape)));
    }
    check_distinct_elements(o)
}

/// The sizes every kernel supports: a head dim with kernels, whole groups
/// of query heads per key/value head, and the index and grid ranges.
pub(crate) fn check_problem(p: &Problem) -> Result<TileConfig> {
    let config = tile_config(p.head_dim)?;
    if !p.heads_q.is_multiple_of(p.heads_kv) {
        return Err(Error::HeadsNotDivisible { heads_q: p.heads_q, heads_kv: p.heads_kv });
    }
    too_large("seqlen_q", p.seqlen_q, MAX_SEQLEN)?;
    too_large("seqlen_k", p.seqlen_k, MAX_SEQLEN)?;
    too_large("batch", p.batch, MAX_GRID_YZ)?;
    too_large("heads_q", p.heads_q, MAX_GRID_YZ)?;
    Ok(config)
}

/// The lse buffer: at least `needed` f32 (`what` says how they are counted), 4-byte aligned.
pub(crate) fn check_lse(addr: u64, len: usize, needed: usize, what: &str) -> Result<()> {
    if len < needed {
        return Err(Error::ShapeMismatch(format!("lse needs {what} = {needed} f32 but has {len}")));
    }
    if addr % 4 != 0 {
        return Err(Error::Misaligned { tensor: "lse", what: "the base address" });
    }
    Ok(())
}

/// Where a call's outputs go.
#[derive(Clone, Copy, Debug)]
pub enum OutputBuffers<'a> {
    /// The caller's `o` (q's shape) and `lse_len` f32 at `lse_addr`.
    Given { o: &'a Placed, lse_addr: u64, lse_len: usize },
    /// Buffers the call allocates after validation, `o` contiguous with
    /// q's shape: they alias nothing, so only their sizes are checked.
    Allocate,
}

/// The outputs of a call whose LSE has `lse_rows` rows (`what` says how
/// they are counted), checked against q and the call's `inputs` (bytes it
/// reads, which no output may overlap); returns `o`'s strides, the
/// outputs, and the bytes the call writes (for the checks of later inputs).
pub(crate) fn check_outputs(
    q: &Placed,
    outputs: OutputBuffers,
    lse_rows: Option<usize>,
    what: &str,
    inputs: &[Bytes],
) -> Result<CheckedOutputs> {
    let lse_rows = lse_rows.ok_or(Error::TooLarge { what: "lse rows", value: usize::MAX, max: MAX_SPAN })?;
    too_large("lse rows", lse_rows, MAX_SPAN)?;
    match outputs {
        OutputBuffers::Given { o, lse_addr, lse_len } => {
            check_tensor(o)?;
            check_row_stride(o)?;
            check_output(q, o)?;
            check_lse(lse_addr, lse_len, lse_rows, what)?;
            let written = vec![tensor_bytes(o), bytes("lse", lse_addr, lse_len, 4)];
            check_aliasing(&written, inputs)?;
            let o_at = tensor_at(o);
            Ok(CheckedOutputs { o_strides: o_at.strides, outputs: Outputs::Given { o: o_at, lse: lse_addr }, written })
        }
        OutputBuffers::Allocate => {
            let layout = Layout::contiguous(q.layout.shape);
            let fits = layout.span().is_some_and(|span| span <= MAX_SPAN);
            if !fits {
                return Err(Error::TensorTooLarge { tensor: "o", shape: layout.shape, strides: layout.strides });
            }
            let strides = [0, 1, 2].map(|i| layout.strides[i] as i64);
            Ok(CheckedOutputs { o_strides: strides, outputs: Outputs::Fresh, written: Vec::new() })
        }
    }
}

/// The softmax scale of a call: `params.softmax_scale` or `1/sqrt(head_dim)`,
/// positive with `scale * log2(e)`, the factor the kernels take, finite.
pub(crate) fn softmax_scale(params: &AttentionParams, head_dim: usize) -> Result<f32> {
    let scale = params.softmax_scale.unwrap_or(1.0 / (head_dim as f32).sqrt());
    if !(scale.is_finite() && scale > 0.0 && (scale * std::f32::consts::LOG2_E).is_finite()) {
        return Err(Error::InvalidScale(scale));
    }
    Ok(scale)
}

/// A tensor's address and strides over batch, seqlen and heads.
pub(crate) fn tensor_at(t: &Placed) -> TensorAt {
    TensorAt { addr: t.addr, strides: [0, 1, 2].map(|i| t.layout.strides[i] as i64) }
}

/// The mask of `causal` and `window`: causal bounds the right side at 0
/// whatever the window says; a window of `(None, Some(0))` is causal.
pub(crate) fn mask(params: &AttentionParams) -> Result<Mask> {
    let side = |bound: Option<usize>, what| match bound {
        None => Ok(None),
        Some(n) => i32::try_from(n).map(|n| Some(n as u32)).map_err(|_| Error::TooLarge {
            what,
            value: n,
            max: i32::MAX as usize,
        }),
    };
    let left = side(params.window.0, "window left")?;
    let right = if params.causal { Some(0) } else { side(params.window.1, "window right")? };
    Ok(match (left, right) {
        (None, None) => Mask::None,
        (None, Some(0)) => Mask::Causal,
        (left, right) => Mask::Window { left, right },
    })
}

/// The score modifiers and split of a call, typed: the softcap (its
/// factors as the kernels fold them, `scale / softcap` and `softcap *
/// log2(e)`, finite), the ALiBi slopes (one per query head or per batch
/// and head, an input that overlaps none of the call's `outputs`), and
/// `num_splits` in `1..=MAX_SPLITS`.
pub(crate) fn features(
    params: &AttentionParams,
    batch: usize,
    heads_q: usize,
    scale: f32,
    outputs: &[Bytes],
) -> Result<(Option<f32>, Option<Alibi>, Option<usize>)> {
    if let Some(softcap) = params.softcap {
        let folded = [scale / softcap, softcap * std::f32::consts::LOG2_E];
        // A `scale / softcap` that rounds to 0 turns the softcap off, which
        // is exact: `c tanh(x / c)` is `x` in f32 for every such `x / c`.
        if !(softcap.is_finite() && softcap > 0.0 && folded.iter().all(|f| f.is_finite())) {
            return Err(Error::InvalidSoftcap(softcap));
        }
    }
    let alibi = match params.alibi_slopes {
        None => None,
        Some(slopes) => {
            let len = slopes.len();
            let batch_stride = if len == heads_q {
                0
            } else if Some(len) == batch.checked_mul(heads_q) {
                heads_q as i64
            } else {
                return Err(Error::AlibiSlopesLength { len, heads_q, batch });
            };
            let addr = slopes.addr;
            check_aliasing(outputs, &[bytes("alibi_slopes", addr, len, 4)])?;
            Some(Alibi { addr, batch_stride })
        }
    };
    if let Some(num_splits) = params.num_splits {
        if !(1..=MAX_SPLITS).contains(&num_splits) {
            return Err(Error::InvalidNumSplits { num_splits, max: MAX_SPLITS });
        }
    }
    Ok((params.softcap, alibi, params.num_splits))
}

/// A call's outputs as [`check_outputs`] checked them: `o`'s strides,
/// where the outputs are, and the bytes the call writes (which no input
/// checked after them may overlap).
pub(crate) struct CheckedOutputs {
    pub o_strides: [i64; 3],
    pub outputs: Outputs,
    pub written: Vec<Bytes>,
}

/// What a validator checked of a call beside its parameters: the element
/// type, sizes, inputs, outputs, the LSE's layout, where the sequences
/// lie, and the KV cache append.
pub(crate) struct Checked {
    pub dtype: Dtype,
    pub problem: Problem,
    pub qkv: [TensorAt; 3],
    pub outputs: CheckedOutputs,
    pub lse: LseLayout,
    pub sequences: Sequences,
    pub append: Option<Append>,
}

/// The one place a [`Call`] is assembled: `checked` with `params`' scale,
/// score modifiers, split and mask, checked here (in that order) for every
/// kind of call.
pub(crate) fn call(checked: Checked, params: &AttentionParams) -> Result<Call> {
    let Checked { dtype, problem, qkv: [q, k, v], outputs, lse, sequences, append } = checked;
    let CheckedOutputs { o_strides, outputs, written } = outputs;
    let scale = softmax_scale(params, problem.head_dim)?;
    let (softcap, alibi, num_splits) = features(params, problem.batch, problem.heads_q, scale, &written)?;
    let mask = mask(params)?;
    Ok(Call {
        dtype,
        problem,
        q,
        k,
        v,
        o_strides,
        lse,
        outputs,
        scale,
        mask,
        softcap,
        alibi,
        sequences,
        num_splits,
        append,
    })
}

/// Checks a dense call, q `[batch, seqlen_q, heads_q, d]` over k, v
/// `[batch, seqlen_k, heads_kv, d]` of element type `dtype`, into
/// `outputs` (o with q's shape, the LSE `[batch, heads_q, seqlen_q]`).
pub fn validate(
    dtype: Dtype,
    q: &Placed,
    k: &Placed,
    v: &Placed,
    outputs: OutputBuffers,
    params: &AttentionParams,
) -> Result<Call> {
    for t in [q, k, v] {
        check_tensor(t)?;
        check_row_stride(t)?;
    }
    let [batch, seqlen_q, heads_q, head_dim] = q.layout.shape;
    let [batch_k, seqlen_k, heads_kv, head_dim_k] = k.layout.shape;
    if v.layout.shape != k.layout.shape {
        return Err(Error::ShapeMismatch(format!("k is {:?} but v is {:?}", k.layout.shape, v.layout.shape)));
    }
    if batch_k != batch || head_dim_k != head_dim {
        return Err(Error::ShapeMismatch(format!(
            "q is {:?} and k is {:?}: batch and head_dim must match",
            q.layout.shape, k.layout.shape
        )));
    }
    let problem = Problem { batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim };
    check_problem(&problem)?;
    let lse_rows = batch.checked_mul(heads_q).and_then(|n| n.checked_mul(seqlen_q));
    let outputs = check_outputs(q, outputs, lse_rows, "batch * heads_q * seqlen_q", &[q, k, v].map(tensor_bytes))?;
    let checked = Checked {
        dtype,
        problem,
        qkv: [q, k, v].map(tensor_at),
        outputs,
        lse: LseLayout { batch_stride: (heads_q * seqlen_q) as i64, head_stride: seqlen_q as i64 },
        sequences: Sequences::Dense,
        append: None,
    };
    call(checked, params)
}

/// What the validation tests share: made-up tensors, and a validated call
/// lowered through [`plan`](crate::plan::plan) to the kernels' arguments.
#[cfg(test)]
pub(crate) mod tests_support {
    use super::*;
    use crate::plan::{plan, KernelArgs, OutputAddrs, Plan};
    use flash_attn_abi::params::{AppendParams, ForwardParams};

    /// A valid contiguous tensor of `shape` at a made-up address, with an
    /// exact-size buffer.
    pub(crate) fn contiguous_tensor(name: &'static str, shape: [usize; 4], addr: u64) -> Placed {
        let layout = Layout::contiguous(shape);
        Placed { name, layout, addr, buffer_len: layout.span().unwrap() }
    }

    /// Gives the tensor named `name` among `tensors` the seqlen stride
    /// `stride`, its buffer grown to fit.
    pub(crate) fn set_row_stride<const N: usize>(tensors: [&mut Placed; N], name: &str, stride: usize) {
        let t = tensors.into_iter().find(|t| t.name == name).expect("a tensor of that name");
        t.layout.strides[1] = stride;
        t.buffer_len = t.layout.span().unwrap();
    }

    /// A device view at a made-up address (never dereferenced).
    pub(crate) fn device_slice<T>(addr: u64, len: usize) -> DeviceView<'static, T> {
        unsafe { DeviceView::from_raw(addr, len) }
    }

    /// A validated call as its kernels receive it: planned without a split
    /// (a GPU of one CTA slot, which any grid fills), its given outputs
    /// bound, its scratch at address 0.
    #[derive(Debug)]
    pub(crate) struct Lowered {
        pub args: ForwardParams,
        pub problem: Problem,
        pub append: Option<(AppendParams, [u32; 3])>,
        /// The lengths uploaded as `seqused_k`.
        pub seqused_k: Vec<i32>,
    }

    pub(crate) fn lowered_call(call: Result<Call>) -> Result<Lowered> {
        let call = call?;
        let plan = plan(&call, |_| 1)?;
        let outputs = match call.outputs {
            Outputs::Given { o, lse } => OutputAddrs { o: o.addr, lse },
            Outputs::Fresh => OutputAddrs { o: 0, lse: 0 },
        };
        let launches = plan.launches(outputs, 0);
        let args = launches
            .iter()
            .find_map(|l| if let KernelArgs::Forward(a) = l.args { Some(a) } else { None })
            .expect("an attention launch");
        let append = call.append.map(|a| (a.params, a.grid));
        let seqused_k = match plan {
            Plan::Sm80(plan) => plan.upload,
            Plan::Sm90(_) => Vec::new(),
        };
        Ok(Lowered { args, problem: call.problem, append, seqused_k })
    }

    /// [`lowered_call`]'s arguments and sizes.
    pub(crate) fn lowered(call: Result<Call>) -> Result<(ForwardParams, Problem)> {
        lowered_call(call).map(|l| (l.args, l.problem))
    }
}

#[cfg(test)]
mod tests {
    use super::tests_support::{contiguous_tensor, device_slice, lowered, set_row_stride};
    use super::*;
    use flash_attn_abi::params::ForwardParams;

    const MIB: u64 = 1 << 20;

    struct Call<'a> {
        q: Placed,
        k: Placed,
        v: Placed,
        o: Placed,
        lse_addr: u64,
        lse_len: usize,
        params: AttentionParams<'a>,
    }

    impl Call<'_> {
        /// q [2, 100, 8, d], k/v [2, 37, 2, d] (GQA 4:1), at disjoint addresses.
        fn new(head_dim: usize) -> Self {
            Call {
                q: contiguous_tensor("q", [2, 100, 8, head_dim], 0),
                k: contiguous_tensor("k", [2, 37, 2, head_dim], 16 * MIB),
                v: contiguous_tensor("v", [2, 37, 2, head_dim], 32 * MIB),
                o: contiguous_tensor("o", [2, 100, 8, head_dim], 48 * MIB),
                lse_addr: 64 * MIB,
                lse_len: 2 * 8 * 100,
                params: AttentionParams::default(),
            }
        }

        fn run(&self) -> Result<(ForwardParams, Problem)> {
            let outputs = OutputBuffers::Given { o: &self.o, lse_addr: self.lse_addr, lse_len: self.lse_len };
            lowered(validate(Dtype::F16, &self.q, &self.k, &self.v, outputs, &self.params))
        }
    }

    #[test]
    fn accepts_every_supported_head_dim() {
        for d in crate::limits::SUPPORTED_HEAD_DIMS {
            let (_, problem) = Call::new(d as usize).run().unwrap_or_else(|e| panic!("head_dim {d}: {e}"));
            assert_eq!(problem.head_dim, d as usize);
        }
    }

    #[test]
    fn accepts_a_valid_gqa_call_and_builds_its_arguments() {
        let call = Call::new(128);
        let (args, problem) = call.run().expect("valid call");
        assert_eq!(problem, Problem { batch: 2, seqlen_q: 100, seqlen_k: 37, heads_q: 8, heads_kv: 2, head_dim: 128 });
        assert_eq!(args.heads_per_kv, 4);
        assert_eq!((args.seqlen_q, args.seqlen_k, args.heads_q), (100, 37, 8));
        assert_eq!((args.q_batch_stride, args.q_row_stride, args.q_head_stride), (100 * 8 * 128, 8 * 128, 128));
        assert_eq!((args.k_batch_stride, args.k_row_stride, args.k_head_stride), (37 * 2 * 128, 2 * 128, 128));
        assert_eq!(args.k as u64, 16 * MIB);
        assert_eq!(args.lse as u64, 64 * MIB);
        approx::assert_relative_eq!(args.scale_log2, std::f32::consts::LOG2_E / 128f32.sqrt(), max_relative = 1e-6);
    }

    #[test]
    fn explicit_scale_is_folded_with_log2e() {
        let mut call = Call::new(64);
        call.params.softmax_scale = Some(0.5);
        let (args, _) = call.run().unwrap();
        approx::assert_relative_eq!(args.scale_log2, 0.5 * std::f32::consts::LOG2_E);
    }

    #[test]
    fn rejects_unsupported_head_dims() {
        for d in [16, 48, 80, 288, 512] {
            assert_eq!(Call::new(d).run().unwrap_err(), Error::UnsupportedHeadDim(d));
        }
    }

    #[test]
    fn rejects_empty_tensors() {
        let mut call = Call::new(64);
        call.k = contiguous_tensor("k", [2, 0, 2, 64], 16 * MIB);
        call.v = contiguous_tensor("v", [2, 0, 2, 64], 32 * MIB);
        assert_eq!(call.run().unwrap_err(), Error::EmptyTensor { tensor: "k" });
    }

    #[test]
    fn rejects_mismatched_shapes() {
        let mut call = Call::new(64);
        call.v = contiguous_tensor("v", [2, 38, 2, 64], 32 * MIB);
        assert!(matches!(call.run().unwrap_err(), Error::ShapeMismatch(m) if m.contains("v is")));
        let mut call = Call::new(64);
        call.k = contiguous_tensor("k", [3, 37, 2, 64], 16 * MIB);
        call.v = contiguous_tensor("v", [3, 37, 2, 64], 32 * MIB);
        assert!(matches!(call.run().unwrap_err(), Error::ShapeMismatch(m) if m.contains("batch and head_dim")));
        let mut call = Call::new(64);
        call.o = contiguous_tensor("o", [2, 99, 8, 64], 48 * MIB);
        assert!(matches!(call.run().unwrap_err(), Error::ShapeMismatch(m) if m.contains("o is")));
        let mut call = Call::new(64);
        call.lse_len -= 1;
        assert!(matches!(call.run().unwrap_err(), Error::ShapeMismatch(m) if m.contains("lse")));
    }

    #[test]
    fn rejects_heads_not_divisible() {
        let mut call = Call::new(64);
        call.k = contiguous_tensor("k", [2, 37, 3, 64], 16 * MIB);
        call.v = contiguous_tensor("v", [2, 37, 3, 64], 32 * MIB);
        assert_eq!(call.run().unwrap_err(), Error::HeadsNotDivisible { heads_q: 8, heads_kv: 3 });
    }

    #[test]
    fn rejects_non_contiguous_last_dim() {
        let mut call = Call::new(64);
        call.q.layout.strides[3] = 2;
        call.q.buffer_len = call.q.layout.span().unwrap();
        assert_eq!(call.run().unwrap_err(), Error::LastDimNotContiguous { tensor: "q", stride: 2 });
    }

    #[test]
    fn rejects_misaligned_pointers_and_strides() {
        let mut call = Call::new(64);
        call.v.addr += 8;
        assert_eq!(call.run().unwrap_err(), Error::Misaligned { tensor: "v", what: "the base address" });
        let mut call = Call::new(64);
        call.k.layout.strides[1] += 4;
        call.k.buffer_len = call.k.layout.span().unwrap();
        assert_eq!(call.run().unwrap_err(), Error::Misaligned { tensor: "k", what: "the seqlen stride" });
        let mut call = Call::new(64);
        call.lse_addr += 2;
        assert_eq!(call.run().unwrap_err(), Error::Misaligned { tensor: "lse", what: "the base address" });
    }

    #[test]
    fn rejects_views_past_their_buffer() {
        let mut call = Call::new(64);
        call.o.buffer_len -= 1;
        let needed = call.o.layout.span().unwrap();
        assert_eq!(call.run().unwrap_err(), Error::OutOfBounds { tensor: "o", needed, len: needed - 1 });
    }

    #[test]
    fn accepts_padded_and_permuted_strides() {
        let mut call = Call::new(128);
        // q stored [batch, heads, seqlen, d]; k rows padded by 16 elements.
        call.q.layout = Layout::strided([2, 100, 8, 128], [8 * 100 * 128, 128, 100 * 128, 1]);
        call.k.layout = Layout::strided([2, 37, 2, 128], [37 * 272, 272, 128, 1]);
        call.k.buffer_len = call.k.layout.span().unwrap();
        let (args, _) = call.run().expect("strided call");
        assert_eq!((args.q_row_stride, args.q_head_stride), (128, 100 * 128));
        assert_eq!(args.k_row_stride, 272);
    }

    #[test]
    fn rejects_sizes_past_the_kernel_index_range() {
        let mut call = Call::new(64);
        call.q.layout = Layout::strided([1, 8, 70_000, 64], [0, 70_000 * 64, 64, 1]);
        call.q.buffer_len = usize::MAX;
        call.o = call.q;
        call.o.name = "o";
        call.o.addr = 1 << 40;
        call.k.layout.shape[0] = 1;
        call.v.layout.shape[0] = 1;
        call.lse_len = usize::MAX / 8;
        call.lse_addr = 1 << 50;
        assert_eq!(call.run().unwrap_err(), Error::TooLarge { what: "heads_q", value: 70_000, max: MAX_GRID_YZ });
    }

    #[test]
    fn rejects_row_strides_past_the_kernels_32_bit_offsets() {
        let past = MAX_ROW_STRIDE + 8;
        for name in ["q", "k", "v", "o"] {
            let mut call = Call::new(64);
            set_row_stride([&mut call.q, &mut call.k, &mut call.v, &mut call.o], name, past);
            let err = call.run().unwrap_err();
            assert_eq!(err, Error::RowStrideTooLarge { tensor: name, stride: past, max: MAX_ROW_STRIDE });
            assert!(err.to_string().starts_with(&format!("{name}: the seqlen stride {past} exceeds")), "{err}");
        }
        let mut call = Call::new(64);
        set_row_stride([&mut call.k], "k", MAX_ROW_STRIDE);
        call.k.addr = 1 << 40;
        assert!(call.run().is_ok());
    }

    #[test]
    fn rejects_outputs_whose_elements_share_memory() {
        let mut call = Call::new(64);
        // Stride 0 over the batch: both batches would write the same rows.
        call.o.layout.strides[0] = 0;
        assert_eq!(call.run().unwrap_err(), Error::OverlappingOutput { tensor: "o", strides: call.o.layout.strides });
        let mut call = Call::new(64);
        // Heads 32 elements apart, but each head holds 64.
        call.o.layout.strides[2] = 32;
        assert!(matches!(call.run().unwrap_err(), Error::OverlappingOutput { tensor: "o", .. }));
        // Inputs may broadcast (stride 0): only reads.
        let mut call = Call::new(64);
        call.k.layout.strides[0] = 0;
        call.v.layout.strides[0] = 0;
        assert!(call.run().is_ok());
    }

    #[test]
    fn non_overlap_accepts_permuted_and_padded_layouts() {
        assert!(Layout::contiguous([2, 3, 4, 8]).is_non_overlapping());
        assert!(Layout::strided([2, 3, 4, 8], [96, 8, 24, 1]).is_non_overlapping());
        assert!(Layout::strided([2, 3, 4, 8], [200, 48, 10, 1]).is_non_overlapping());
        assert!(!Layout::strided([2, 3, 4, 8], [96, 8, 8, 1]).is_non_overlapping());
        // Size-1 dimensions may have any stride.
        assert!(Layout::strided([1, 3, 1, 8], [0, 8, 0, 1]).is_non_overlapping());
    }

    #[test]
    fn reports_shapes_past_the_index_range_as_too_large() {
        // Dimensions of usize::MAX: the contiguous strides saturate, and
        // the size, not their alignment, is what is wrong.
        let mut call = Call::new(64);
        call.q.layout = Layout::contiguous([usize::MAX; 4]);
        let err = call.run().unwrap_err();
        let expected = Error::TensorTooLarge {
            tensor: "q",
            shape: [usize::MAX; 4],
            strides: [usize::MAX, usize::MAX, usize::MAX, 1],
        };
        assert_eq!(err, expected);
        assert!(err.to_string().starts_with("q: the view of shape"), "{err}");
        // Dimensions in range whose span overflows.
        let mut call = Call::new(64);
        call.k.layout = Layout::contiguous([1 << 20, 1 << 20, 1 << 20, 64]);
        assert!(matches!(call.run().unwrap_err(), Error::TensorTooLarge { tensor: "k", .. }));
        // A span past MAX_SPAN, and one at it (then out of its buffer).
        let mut call = Call::new(64);
        let rest = 36 * 128 + 64 + 64; // the span of one batch
        call.v.layout = Layout::strided([2, 37, 2, 64], [(MAX_SPAN - rest + 8) & !7, 128, 64, 1]);
        assert!(matches!(call.run().unwrap_err(), Error::TensorTooLarge { tensor: "v", .. }));
        call.v.layout = Layout::strided([2, 37, 2, 64], [(MAX_SPAN - rest) & !7, 128, 64, 1]);
        assert!(matches!(call.run().unwrap_err(), Error::OutOfBounds { tensor: "v", .. }));
        // A dimension past MAX_DIM, whatever its stride; MAX_DIM itself is
        // left to the limits of what it is (here seqlen_k).
        for (seqlen_k, tensor) in [(MAX_DIM + 1, Some("k")), (MAX_DIM, None)] {
            let mut call = Call::new(64);
            call.k.layout = Layout::strided([2, seqlen_k, 2, 64], [128, 0, 64, 1]);
            call.v.layout = call.k.layout;
            let err = call.run().unwrap_err();
            match tensor {
                Some(tensor) => assert!(matches!(err, Error::TensorTooLarge { tensor: t, .. } if t == tensor), "{err}"),
                None => assert_eq!(err, Error::TooLarge { what: "seqlen_k", value: MAX_DIM, max: MAX_SEQLEN }),
            }
        }
    }

    #[test]
    fn sequence_lengths_stay_a_tile_below_2_31() {
        // Broadcast keys (row stride 0) make any length cheap to ask for.
        for (seqlen_k, ok) in [(MAX_SEQLEN, true), (MAX_SEQLEN + 1, false)] {
            let mut call = Call::new(64);
            call.k.layout = Layout::strided([2, seqlen_k, 2, 64], [128, 0, 64, 1]);
            call.v.layout = call.k.layout;
            assert_eq!(call.run().is_ok(), ok, "seqlen_k {seqlen_k}: {:?}", call.run().err());
        }
        assert_eq!(MAX_SEQLEN, (1 << 31) - 256);
    }

    #[test]
    fn shape_products_that_overflow_are_reported_not_panicked() {
        let huge = Layout::contiguous([usize::MAX / 2, 4, 4, 64]);
        assert_eq!(huge.elements(), None);
        assert_eq!(huge.span(), None);
    }

    #[test]
    fn rejects_outputs_overlapping_inputs() {
        let mut call = Call::new(64);
        call.o.addr = call.q.addr + 64;
        assert_eq!(call.run().unwrap_err(), Error::Aliasing { output: "o", other: "q" });
        let mut call = Call::new(64);
        call.lse_addr = call.o.addr;
        let err = call.run().unwrap_err();
        assert_eq!(err, Error::Aliasing { output: "o", other: "lse" });
        assert_eq!(err.to_string(), "o overlaps lse: an output may share memory with no other argument");
    }

    #[test]
    fn rejects_bad_scales() {
        for scale in [0.0, -1.0, f32::NAN, f32::INFINITY] {
            let mut call = Call::new(64);
            call.params.softmax_scale = Some(scale);
            assert!(matches!(call.run().unwrap_err(), Error::InvalidScale(_)), "scale {scale}");
        }
    }

    #[test]
    fn span_counts_the_last_element_and_overflow() {
        assert_eq!(Layout::contiguous([2, 3, 4, 8]).span(), Some(2 * 3 * 4 * 8));
        assert_eq!(Layout::strided([2, 3, 4, 8], [1000, 100, 10, 1]).span(), Some(1000 + 200 + 30 + 7 + 1));
        assert_eq!(Layout::strided([2, 2, 2, 2], [usize::MAX, 1, 1, 1]).span(), None);
    }

    #[test]
    fn causal_and_windows_become_the_kernels_bounds() {
        let bounds = |causal, window| {
            let mut call = Call::new(64);
            call.params = AttentionParams { causal, window, ..call.params };
            let (args, _) = call.run().unwrap();
            (args.window_left, args.window_right)
        };
        assert_eq!(bounds(false, (None, None)), (-1, -1));
        assert_eq!(bounds(true, (None, None)), (-1, 0));
        assert_eq!(bounds(false, (Some(3), Some(5))), (3, 5));
        assert_eq!(bounds(false, (None, Some(0))), (-1, 0));
        assert_eq!(bounds(false, (Some(0), None)), (0, -1));
        // Causal with a window keeps the left side and bounds the right at 0.
        assert_eq!(bounds(true, (Some(3), Some(5))), (3, 0));
    }

    #[test]
    fn rejects_windows_past_the_kernels_i32_positions() {
        let past = i32::MAX as usize + 1;
        let mut call = Call::new(64);
        call.params.window = (Some(past), None);
        let max = i32::MAX as usize;
        assert_eq!(call.run().unwrap_err(), Error::TooLarge { what: "window left", value: past, max });
        call.params.window = (Some(i32::MAX as usize), Some(past));
        assert_eq!(call.run().unwrap_err(), Error::TooLarge { what: "window right", value: past, max });
        // Causal replaces the right side, whatever it was.
        call.params.causal = true;
        assert!(call.run().is_ok());
    }

    #[test]
    fn softcap_is_folded_with_the_scale() {
        let mut call = Call::new(64);
        call.params.softcap = Some(30.0);
        let (args, _) = call.run().unwrap();
        approx::assert_relative_eq!(args.softcap_scale, 0.125 / 30.0, max_relative = 1e-6);
        approx::assert_relative_eq!(args.softcap_log2, 30.0 * std::f32::consts::LOG2_E, max_relative = 1e-6);
        let (plain, _) = Call::new(64).run().unwrap();
        assert_eq!((plain.softcap_scale, plain.softcap_log2), (0.0, 0.0));
    }

    #[test]
    fn rejects_bad_softcaps() {
        for softcap in [0.0, -2.0, f32::NAN, f32::INFINITY] {
            let mut call = Call::new(64);
            call.params.softcap = Some(softcap);
            assert!(matches!(call.run().unwrap_err(), Error::InvalidSoftcap(_)), "softcap {softcap}");
        }
    }

    #[test]
    fn rejects_scales_and_softcaps_whose_folded_factors_are_not_finite() {
        let scale = |s| {
            let mut call = Call::new(64);
            call.params.softmax_scale = Some(s);
            call.run()
        };
        // The kernels take softmax_scale * log2(e): finite up to f32::MAX / log2(e).
        assert_eq!(scale(f32::MAX).unwrap_err(), Error::InvalidScale(f32::MAX));
        assert_eq!(scale(2.4e38).unwrap_err(), Error::InvalidScale(2.4e38));
        assert!(scale(2.3e38).is_ok());
        let err = scale(f32::MAX).unwrap_err().to_string();
        assert!(err.starts_with("softmax_scale must be > 0 with softmax_scale * log2(e) finite"), "{err}");
        // And softcap * log2(e) and softmax_scale / softcap.
        let softcap = |c, s| {
            let mut call = Call::new(64);
            call.params.softcap = Some(c);
            call.params.softmax_scale = s;
            call.run()
        };
        for c in [1e-45, f32::MAX, 2.4e38] {
            assert_eq!(softcap(c, None).unwrap_err(), Error::InvalidSoftcap(c), "softcap {c}");
        }
        assert_eq!(softcap(1e-37, Some(100.0)).unwrap_err(), Error::InvalidSoftcap(1e-37));
        let (args, _) = softcap(2.3e38, None).unwrap();
        assert!(args.softcap_log2.is_finite() && args.softcap_scale > 0.0);
        let (args, _) = softcap(1e-37, None).unwrap();
        assert!(args.softcap_scale.is_finite());
        // A scale / softcap below f32's smallest is 0: no softcap, which
        // is exact there (c tanh(x / c) = x in f32).
        let (args, _) = softcap(1e38, Some(1e-8)).unwrap();
        assert_eq!(args.softcap_scale, 0.0);
    }

    #[test]
    fn rejects_alibi_slopes_over_an_output() {
        let mut call = Call::new(64);
        let over_lse = device_slice::<f32>(call.lse_addr, 8);
        call.params.alibi_slopes = Some(over_lse);
        let err = call.run().unwrap_err();
        assert_eq!(err, Error::Aliasing { output: "lse", other: "alibi_slopes" });
        assert_eq!(err.to_string(), "lse overlaps alibi_slopes: an output may share memory with no other argument");
        let over_o = device_slice::<f32>(call.o.addr + 1024, 2 * 8);
        call.params.alibi_slopes = Some(over_o);
        assert_eq!(call.run().unwrap_err(), Error::Aliasing { output: "o", other: "alibi_slopes" });
        // Right after the lse: fine. Over an input: fine (both are read).
        let after_lse = device_slice::<f32>(call.lse_addr + 4 * call.lse_len as u64, 8);
        call.params.alibi_slopes = Some(after_lse);
        assert!(call.run().is_ok());
        let over_q = device_slice::<f32>(call.q.addr, 8);
        call.params.alibi_slopes = Some(over_q);
        assert!(call.run().is_ok());
    }

    #[test]
    fn alibi_slopes_are_per_head_or_per_batch_and_head() {
        let per_head = device_slice::<f32>(80 * MIB, 8);
        let per_batch = device_slice::<f32>(81 * MIB, 2 * 8);
        let odd = device_slice::<f32>(82 * MIB, 9);
        let mut call = Call::new(64);
        call.params.alibi_slopes = Some(per_head);
        let (args, _) = call.run().unwrap();
        assert_eq!((args.alibi_slopes as u64, args.alibi_batch_stride), (80 * MIB, 0));
        call.params.alibi_slopes = Some(per_batch);
        let (args, _) = call.run().unwrap();
        assert_eq!((args.alibi_slopes as u64, args.alibi_batch_stride), (81 * MIB, 8));
        call.params.alibi_slopes = Some(odd);
        assert_eq!(call.run().unwrap_err(), Error::AlibiSlopesLength { len: 9, heads_q: 8, batch: 2 });
        let (plain, _) = Call::new(64).run().unwrap();
        assert!(plain.alibi_slopes.is_null());
    }

    #[test]
    fn num_splits_is_between_1_and_the_maximum() {
        for (num_splits, ok) in [(0, false), (1, true), (3, true), (128, true), (129, false)] {
            let mut call = Call::new(64);
            call.params.num_splits = Some(num_splits);
            match call.run() {
                Ok(_) => assert!(ok, "{num_splits} accepted"),
                Err(e) => {
                    assert!(!ok, "{num_splits} refused: {e}");
                    assert_eq!(e, Error::InvalidNumSplits { num_splits, max: 128 });
                }
            }
        }
    }

    #[test]
    fn a_dense_call_keeps_every_general_feature_off() {
        let (args, _) = Call::new(128).run().unwrap();
        assert!(args.cu_seqlens_q.is_null() && args.cu_seqlens_k.is_null() && args.seqused_k.is_null());
        assert!(args.block_table.is_null() && args.o_partial.is_null() && args.lse_partial.is_null());
        assert_eq!((args.num_splits, args.page_size), (1, 0));
        // LSE [2, 8, 100].
        assert_eq!((args.lse_batch_stride, args.lse_head_stride), (800, 100));
    }
}

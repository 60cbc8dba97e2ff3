//! Forward-pass benchmark over the standard grid: batch * seqlen = 16384
//! tokens, hidden 2048 (heads = 2048 / head_dim), seqlen 512..16384, head
//! dims 64 and 128, causal and not, f16 and bf16. TFLOP/s counts
//! 4 * batch * heads * seqlen^2 * head_dim, halved for causal.
//!
//! Before the grid it times the mma.sync ceiling (`flash_attn_kernels::test_kernels::ceiling`:
//! register-only m16n8k16 MMAs on every SM, also at 1 and 2 warps per
//! scheduler) and reports each shape's fraction of it. Prefill and varlen
//! calls are timed hot (`hot::hot_time`), as bench_torch.py times the
//! peers': inputs drawn first, then at least a second of the call back to
//! back with no synchronization, then the timed calls queued right behind
//! (their median): the clocks the GPU holds under that call's sustained
//! load in a real loop. Beside each figure, the mean SM clock and board
//! power over the timed calls (MHz/W), from NVML sampled by a thread
//! (`nvml::Monitor`; `n/a`, and one line saying why, without NVML).
//!
//! With the standard grid, variable-length rows: d=64 and 128, f16, s=1024
//! and 4096, every sequence packed at the same length through
//! `forward_varlen_into` (the general kernels), each beside the dense API on
//! the same work, timed in the same run.
//!
//! Then backward rows (`backward_into`, timed hot the same way after one
//! forward for its o and lse): the grid's shapes at the head dims that have
//! backward kernels, `[batch, seqlen, heads, d]`; TFLOP/s count 2.5 times
//! the forward's FLOPs. `--backward-only` runs them alone (over the shapes
//! the other options choose), `--no-backward` leaves them out.
//!
//! After the grid, decode rows: one query token per sequence (causal) over a
//! full KV cache, batch 1, 4, 16, 64 and cache 1k..64k keys (up to 8 GiB of
//! K and V), 32 query heads over 4 KV heads (GQA 8:1), head dim 128, f16,
//! through `forward_kvcache` with the automatic split-KV. Each reports its
//! time, the bandwidth of reading K and V (bytes of K and V / time), and
//! that bandwidth as a fraction of a device-to-device copy's (1 GiB
//! `cuMemcpyDtoD`, bytes read + written / time) measured in the same run.
//! Two times per row: one call alone, L2 flushed before it (what a single
//! call costs, its launch included), and back to back (the steady state of a
//! decode loop): a run of calls, each over its own region of K and V so
//! that together they read far more than L2 holds, queued while the GPU
//! is still busy with a flush, timed as a whole and divided by the calls.
//! Beside them, the same regions copied back to back (K onto V, as many
//! bytes moved as the call reads): the copy bandwidth at the row's size,
//! which small rows cannot beat however fast the kernel.
//!
//! `bench [--out FILE] [--quick] [--reps N] [--head-dims D,D..] [--seqlens S,S..] [--layout bshd|bhsd]
//! [--decode-only | --no-decode | --varlen-only | --backward-only | --no-backward] [--decode-batches B,B..]
//! [--decode-caches C,C..] [--decode-splits N] [--non-causal] [--portable] [--tokens N] [--heads H]
//! [--softcap C] [--dtypes f16,bf16]`:
//! prints tables and writes one JSON object per row to FILE, after a first
//! `"kind":"meta"` line (NVML's status, the GPU, the driver, the reps), for
//! scripts/bench_torch.py, which adds the peers' figures (FlashAttention-2,
//! cuDNN, FA4) and writes the tables as markdown. Head dims other than
//! 64 and 128 use 2048 / d heads rounded down (hidden close to 2048).
//! Choosing head dims, seqlens or dtypes selects those prefill rows only (no
//! variable-length or decode rows); `--varlen-only` runs the
//! variable-length rows alone (for tuning the general kernels).
//! `--decode-splits` overrides the split-KV heuristic (for tuning it).
//! `--reps` sets the timed calls per row (default 30, 10 with `--quick`;
//! each row's warm-up is a second whatever the reps). `--dtypes` sets the
//! prefill rows' element types (default f16,bf16). Unknown arguments are
//! warned about and ignored.
//! `--layout` sets the memory order of the prefill rows' q, k, v and o:
//! `bshd` (the default, `[batch, seqlen, heads, d]`) or `bhsd`; the row
//! says which, and bench_torch.py gives torch's kernels the same memory.
//! `--portable` times the sm_80 kernels only, also on an H100/H200 (to
//! compare them with the sm_90a ones). `--non-causal` leaves out the causal prefill rows (for comparing
//! variants of the non-causal kernels in a short run). `--tokens N` sets
//! batch * seqlen (default 16384) and `--heads H` the heads of the prefill
//! rows (for shapes off the standard grid, e.g. grids of CTAs that fill
//! whole waves of the GPU's SMs); either selects prefill rows only.
//! `--softcap C` gives every prefill row a softcap of C (the general
//! kernels, for tuning them; same FLOPs) and selects prefill rows only,
//! written as `"kind":"softcap"`, which bench_torch.py leaves alone.

use std::io::Write;

use flash_attn::cust::context::CurrentContext;
use flash_attn::cust::device::DeviceAttribute;
use flash_attn::cust::event::{Event, EventFlags};
use flash_attn::cust::function::{BlockSize, Function, GridSize};
use flash_attn::cust::memory::{DeviceBuffer, DeviceSlice};
use flash_attn::cust::module::Module;
use flash_attn::cust::stream::{Stream, StreamFlags};
use flash_attn::half1::{bf16, f16};
use flash_attn::{
    AttentionParams, CacheSeqlens, FlashAttention, Gradients, KvCache, SeqOffsets, Tensor, TensorMut, Workspace,
    BACKWARD_KERNELS,
};
use flash_attn_tests::{normal, TestElement, TEST_PTX};

mod hot;
mod nvml;
use nvml::{Monitor, Nvml, Reading};

/// batch * seqlen in the standard grid.
const STANDARD_TOKENS: usize = 16384;

struct Shape {
    seqlen: usize,
    head_dim: usize,
    causal: bool,
    dtype: &'static str,
    /// Memory order of the dense rows' q, k, v and o: `[batch, seqlen,
    /// heads, d]` (`false`, as a projection's output viewed per head
    /// lies, and FlashAttention-2's own layout) or `[batch, heads, seqlen,
    /// d]` (`true`).
    heads_major: bool,
    /// Tokens per call, batch * seqlen: 16384 in the standard grid.
    tokens: usize,
    /// Heads per call where `--heads` sets them, else hidden 2048 / d.
    heads: Option<usize>,
    /// The softcap of the forward rows where `--softcap` sets one (the
    /// general kernels; the FLOPs are the same).
    softcap: Option<f32>,
}

impl Shape {
    /// Sequences per call: tokens / seqlen (at least one).
    fn batch(&self) -> usize {
        (self.tokens / self.seqlen).max(1)
    }

    /// Heads per call: hidden 2048 (rounded down where d does not divide it)
    /// unless `--heads` said.
    /// The shape's JSON fields, for a row of `--out`: dtype, layout, head
    /// dim, causal, seqlen, batch and heads.
    fn json_fields(&self) -> String {
        format!(
            "\"dtype\":\"{}\",\"layout\":\"{}\",\"head_dim\":{},\"causal\":{},\"seqlen\":{},\"batch\":{},\"heads\":{}{}",
            self.dtype,
            if self.heads_major { "bhsd" } else { "bshd" },
            self.head_dim,
            self.causal,
            self.seqlen,
            self.batch(),
            self.heads(),
            self.softcap.map_or(String::new(), |c| format!(",\"softcap\":{c}"))
        )
    }

    fn heads(&self) -> usize {
        self.heads.unwrap_or(2048 / self.head_dim)
    }

    /// The forward's FLOPs: `4 batch heads seqlen^2 d`, halved for causal.
    fn forward_flops(&self) -> f64 {
        4.0 * (self.batch() * self.heads()) as f64 * (self.seqlen * self.seqlen) as f64 * self.head_dim as f64
            / if self.causal { 2.0 } else { 1.0 }
    }
}

/// `n` fresh standard-normal values as `T`, drawn on all CPU cores (each
/// from its own generator, seeded from the thread's): one prefill row's q,
/// k and v are 100 M values.
fn random_normal<T: TestElement + Send>(n: usize) -> Vec<T> {
    use rand::{Rng, SeedableRng};
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get());
    let mut values = vec![T::from_f32(0.0); n];
    let seeds: Vec<u64> = (0..threads).map(|_| rand::thread_rng().gen()).collect();
    std::thread::scope(|scope| {
        for (part, seed) in values.chunks_mut(n.div_ceil(threads).max(1)).zip(seeds) {
            scope.spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
                let drawn = normal(&mut rng, part.len());
                for (value, x) in part.iter_mut().zip(drawn) {
                    *value = T::from_f32(x);
                }
            });
        }
    });
    values
}

/// One row's figure: TFLOP/s, and the SM clock and power over its timed
/// calls.
struct Measured {
    /// From the median call.
    tflops: f64,
    /// From the timed calls' total time / their count.
    mean_tflops: f64,
    reading: Reading,
    /// GPU seconds of the call back to back before the timed calls, and
    /// how many calls.
    warm_up_s: f64,
    warm_up_calls: usize,
    /// Calls kept queued ahead of the GPU.
    lookahead: usize,
}

impl Measured {
    /// The figures of `timing`, calls of `flops` each, with the monitor's
    /// reading over its timed calls.
    fn of(timing: &hot::HotTiming, flops: f64, monitor: &Monitor) -> Self {
        Measured {
            tflops: flops / (timing.median_ms * 1e-3) / 1e12,
            mean_tflops: flops / (timing.mean_ms * 1e-3) / 1e12,
            reading: monitor.mean(timing.window),
            warm_up_s: timing.warm_up_ms * 1e-3,
            warm_up_calls: timing.warm_up_calls,
            lookahead: timing.lookahead,
        }
    }

    /// `,"<prefix>mhz":..,"<prefix>watts":..` and the timing's other
    /// figures for the JSON rows (null where NVML gave nothing).
    fn json_fields(&self, prefix: &str) -> String {
        let number = |value: Option<f64>| value.map_or("null".to_string(), |v| format!("{v:.1}"));
        format!(
            ",\"{prefix}mhz\":{},\"{prefix}watts\":{},\"{prefix}nvml_samples\":{},\"{prefix}mean_tflops\":{:.3},\
             \"{prefix}warm_up_s\":{:.3},\"{prefix}warm_up_calls\":{},\"{prefix}lookahead\":{}",
            number(self.reading.mhz),
            number(self.reading.watts),
            self.reading.samples,
            self.mean_tflops,
            self.warm_up_s,
            self.warm_up_calls,
            self.lookahead
        )
    }
}

/// `shape` through the dense API, or with `varlen` through
/// `forward_varlen_into` with every sequence of the batch packed at the
/// same length (the general kernels on the same work), timed hot
/// ([`hot::hot_time`]): inputs drawn first, then at least a second of the
/// call back to back, then the timed calls right behind.
fn time_shape<T: TestElement + Send>(
    attention: &FlashAttention,
    monitor: &Monitor,
    shape: &Shape,
    varlen: bool,
    reps: usize,
) -> Result<Measured, Box<dyn std::error::Error>> {
    let (batch, heads) = (shape.batch(), shape.heads());
    let dims = [batch, shape.seqlen, heads, shape.head_dim];
    let n: usize = dims.iter().product();
    let random = || DeviceBuffer::from_slice(&random_normal::<T>(n));
    let (q, k, v) = (random()?, random()?, random()?);
    let mut o = DeviceBuffer::from_slice(&vec![T::from_bits(T::POISON); n])?;
    let mut lse = DeviceBuffer::from_slice(&vec![f32::NAN; batch * heads * shape.seqlen])?;
    let stream = Stream::new(StreamFlags::NON_BLOCKING, None)?;
    let params = AttentionParams { causal: shape.causal, softcap: shape.softcap, ..Default::default() };
    // The varlen call takes the batch as one packed run of tokens,
    // `[1, tokens, heads, d]`: the same memory as `dims`.
    let layout = if varlen { [1, batch * shape.seqlen, heads, shape.head_dim] } else { dims };
    // `[batch, heads, seqlen, d]` memory viewed as `layout` (dense rows only).
    let heads_major_strides = (shape.heads_major && !varlen).then(|| {
        let d = shape.head_dim;
        [heads * shape.seqlen * d, d, shape.seqlen * d, 1]
    });
    let cu_seqlens = if varlen { Some(SeqOffsets::from_lengths(&vec![shape.seqlen; batch])?) } else { None };
    let mut run = || -> Result<(), Box<dyn std::error::Error>> {
        let view = |buffer| match heads_major_strides {
            Some(strides) => Tensor::strided(buffer, layout, strides),
            None => Tensor::new(buffer, layout),
        };
        let (q, k, v) = (view(&q), view(&k), view(&v));
        let o = match heads_major_strides {
            Some(strides) => TensorMut::strided(&mut o, layout, strides),
            None => TensorMut::new(&mut o, layout),
        };
        match &cu_seqlens {
            Some(cu_seqlens) => {
                attention.forward_varlen_into(q, k, v, o, &mut lse, cu_seqlens, cu_seqlens, &params, &stream)?
            }
            None => attention.forward_into(q, k, v, o, &mut lse, &params, &stream)?,
        };
        Ok(())
    };
    let timing = hot::hot_time(&hot::CudaTimeline(&stream), &hot::HOT, reps, &mut run, &mut || monitor.sample_now())?;
    Ok(Measured::of(&timing, shape.forward_flops(), monitor))
}

/// The backward of `shape` (dense, `[batch, seqlen, heads, d]`) timed hot
/// as [`time_shape`] times the forward: q, k, v and dO drawn and the
/// forward's o and lse computed first, then `backward_into` back to back
/// (its scratch from one workspace, grown by the first call). TFLOP/s count
/// 2.5 times the forward's FLOPs (five matrix products to its two).
fn time_backward<T: TestElement + Send>(
    attention: &FlashAttention,
    monitor: &Monitor,
    shape: &Shape,
    reps: usize,
) -> Result<Measured, Box<dyn std::error::Error>> {
    let (batch, heads) = (shape.batch(), shape.heads());
    let dims = [batch, shape.seqlen, heads, shape.head_dim];
    let n: usize = dims.iter().product();
    let random = || DeviceBuffer::from_slice(&random_normal::<T>(n));
    let (q, k, v, d_o) = (random()?, random()?, random()?, random()?);
    let poisoned = || DeviceBuffer::from_slice(&vec![T::from_bits(T::POISON); n]);
    let (mut o, mut d_q, mut d_k, mut d_v) = (poisoned()?, poisoned()?, poisoned()?, poisoned()?);
    let mut lse = DeviceBuffer::from_slice(&vec![f32::NAN; batch * heads * shape.seqlen])?;
    let stream = Stream::new(StreamFlags::NON_BLOCKING, None)?;
    let params = AttentionParams { causal: shape.causal, ..Default::default() };
    let (qt, kt, vt) = (Tensor::new(&q, dims), Tensor::new(&k, dims), Tensor::new(&v, dims));
    attention.forward_into(qt, kt, vt, TensorMut::new(&mut o, dims), &mut lse, &params, &stream)?;
    let mut workspace = Workspace::new();
    let mut run = || -> Result<(), Box<dyn std::error::Error>> {
        let gradients = Gradients {
            d_q: TensorMut::new(&mut d_q, dims),
            d_k: TensorMut::new(&mut d_k, dims),
            d_v: TensorMut::new(&mut d_v, dims),
        };
        let (o, d_o) = (Tensor::new(&o, dims), Tensor::new(&d_o, dims));
        attention.backward_into(qt, kt, vt, o, &lse, d_o, gradients, &params, &mut workspace, &stream)?;
        Ok(())
    };
    let timing = hot::hot_time(&hot::CudaTimeline(&stream), &hot::HOT, reps, &mut run, &mut || monitor.sample_now())?;
    Ok(Measured::of(&timing, 2.5 * shape.forward_flops(), monitor))
}

/// TFLOP/s of the `mma_ceiling` kernel (`ceiling`) with `blocks_per_sm`
/// blocks of `warps` warps for each of the `sms` SMs, each warp `CHAINS`
/// independent MMA chains; median of 10 runs after 2 warm-ups. The ceiling
/// proper is 8 blocks of 8 warps (16 warps per scheduler); fewer warps say
/// what the tensor pipe gives the 1-2 warps per scheduler of the attention
/// kernels.
fn mma_ceiling_tflops(
    ceiling: &Function,
    sms: u32,
    blocks_per_sm: u32,
    warps: u32,
) -> Result<f64, Box<dyn std::error::Error>> {
    let (blocks, threads, iterations) = (sms * blocks_per_sm, 32 * warps, 512u32);
    let out = DeviceBuffer::from_slice(&vec![0f32; (blocks * threads) as usize])?;
    let stream = Stream::new(StreamFlags::NON_BLOCKING, None)?;
    let out_ptr = out.as_device_ptr();
    let launch = || -> Result<(), Box<dyn std::error::Error>> {
        let (mut iterations, mut out_ptr, mut threads_arg) = (iterations, out_ptr, threads);
        let args = [
            &mut iterations as *mut u32 as *mut std::ffi::c_void,
            &mut out_ptr as *mut _ as *mut std::ffi::c_void,
            &mut threads_arg as *mut u32 as *mut std::ffi::c_void,
        ];
        unsafe { stream.launch(ceiling, GridSize::x(blocks), BlockSize::x(threads), 0, &args)? };
        Ok(())
    };
    for _ in 0..2 {
        launch()?;
    }
    let ms = median_ms(&stream, 10, || Ok(()), launch)?;
    let flops = (blocks * threads / 32) as f64
        * iterations as f64
        * flash_attn_kernels::test_kernels::ceiling::CHAINS as f64
        * 4096.0;
    Ok(flops / (ms * 1e-3) / 1e12)
}

/// A raw driver call's status as a result.
fn driver(call: &'static str, status: flash_attn::cust::sys::CUresult) -> Result<(), Box<dyn std::error::Error>> {
    if status != flash_attn::cust::sys::cudaError_enum::CUDA_SUCCESS {
        return Err(format!("{call} failed with CUDA status {}", status as u32).into());
    }
    Ok(())
}

/// Copies `bytes` bytes from device address `src` to `dst` on `stream`.
fn copy_async(dst: u64, src: u64, bytes: usize, stream: &Stream) -> Result<(), Box<dyn std::error::Error>> {
    driver("cuMemcpyDtoDAsync", unsafe {
        flash_attn::cust::sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, stream.as_inner())
    })
}

/// Median milliseconds of `reps` runs of `run` between two events on
/// `stream`, each after `before` (untimed, on the same stream).
fn median_ms(
    stream: &Stream,
    reps: usize,
    mut before: impl FnMut() -> Result<(), Box<dyn std::error::Error>>,
    mut run: impl FnMut() -> Result<(), Box<dyn std::error::Error>>,
) -> Result<f64, Box<dyn std::error::Error>> {
    let (start, stop) = (Event::new(EventFlags::DEFAULT)?, Event::new(EventFlags::DEFAULT)?);
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps {
        before()?;
        start.record(stream)?;
        run()?;
        stop.record(stream)?;
        stop.synchronize()?;
        times.push(stop.elapsed_time_f32(&start)? as f64);
    }
    Ok(median(times))
}

/// The middle of `times` once sorted (the upper one of an even count).
fn median(mut times: Vec<f64>) -> f64 {
    times.sort_by(|a, b| a.total_cmp(b));
    times[times.len() / 2]
}

/// Bytes a device-to-device copy reads and writes per second: a 1 GiB
/// `cuMemcpyDtoD`, median of 10.
fn copy_bandwidth(stream: &Stream) -> Result<f64, Box<dyn std::error::Error>> {
    const BYTES: usize = 1 << 30;
    let (src, dst) = unsafe { (DeviceBuffer::<u8>::zeroed(BYTES)?, DeviceBuffer::<u8>::uninitialized(BYTES)?) };
    let (src, dst) = (src.as_device_ptr().as_raw(), dst.as_device_ptr().as_raw());
    for _ in 0..2 {
        copy_async(dst, src, BYTES, stream)?;
    }
    let ms = median_ms(stream, 10, || Ok(()), || copy_async(dst, src, BYTES, stream))?;
    Ok(2.0 * BYTES as f64 / (ms * 1e-3))
}

/// Query heads, KV heads and head dim of the decode rows.
const DECODE_HEADS: (usize, usize) = (32, 4);
const DECODE_HEAD_DIM: usize = 128;
/// Decode rows whose K and V take more are skipped.
const DECODE_MAX_KV_BYTES: usize = 8 << 30;
/// Bytes copied before each timed decode call, to flush L2 (50 MiB on H100).
const L2_FLUSH_BYTES: usize = 256 << 20;

/// K and V bytes that the back-to-back calls of a decode row read at least,
/// over distinct regions: several times the L2 of any GPU we run on.
const BACK_TO_BACK_BYTES: usize = 512 << 20;
/// The most calls in one back-to-back run.
const BACK_TO_BACK_MAX_CALLS: usize = 64;

/// One decode row's measurements.
struct DecodeRow {
    batch: usize,
    cache: usize,
    kv_bytes: usize,
    /// One call alone, L2 flushed before it.
    time_ms: f64,
    /// Per call, back to back over distinct K and V regions.
    back_to_back_ms: f64,
    /// The host's time to queue one of the back-to-back calls.
    host_us: f64,
    /// Per copy, back to back over the same regions: device-to-device
    /// copies moving as many bytes (half of them read, half written) as the
    /// call reads, what the copy bandwidth comes to at this size.
    same_bytes_copy_ms: f64,
}

/// Fills `buffer` with random normal f16 values: a 16 MiB random block,
/// repeated by device copies.
fn fill_random(buffer: &mut DeviceBuffer<f16>, stream: &Stream) -> Result<(), Box<dyn std::error::Error>> {
    let block_len = (8usize << 20).min(buffer.len());
    let block: Vec<f16> = normal(&mut rand::thread_rng(), block_len).into_iter().map(f16::from_f32).collect();
    let block = DeviceBuffer::from_slice(&block)?;
    let base = buffer.as_device_ptr().as_raw();
    let mut done = 0;
    while done < buffer.len() {
        let n = block_len.min(buffer.len() - done);
        copy_async(base + 2 * done as u64, block.as_device_ptr().as_raw(), 2 * n, stream)?;
        done += n;
    }
    stream.synchronize()?;
    Ok(())
}

/// Times the decode rows: each (batch, cache) of full caches within
/// [`DECODE_MAX_KV_BYTES`], in one pair of K and V buffers of the largest.
fn decode_rows(
    attention: &FlashAttention,
    batches: &[usize],
    caches: &[usize],
    num_splits: Option<usize>,
    reps: usize,
    stream: &Stream,
) -> Result<Vec<DecodeRow>, Box<dyn std::error::Error>> {
    let (heads_q, heads_kv) = DECODE_HEADS;
    let d = DECODE_HEAD_DIM;
    let kv_bytes = |batch: usize, cache: usize| 2 * batch * cache * heads_kv * d * 2;
    let shapes: Vec<(usize, usize)> = batches
        .iter()
        .flat_map(|&b| caches.iter().map(move |&c| (b, c)))
        .filter(|&(b, c)| kv_bytes(b, c) <= DECODE_MAX_KV_BYTES)
        .collect();
    // Room for the back-to-back runs' distinct regions: K and V each hold
    // half of BACK_TO_BACK_BYTES, in f16 elements.
    let back_to_back_len = BACK_TO_BACK_BYTES / 2 / std::mem::size_of::<f16>();
    let cache_len = shapes.iter().map(|&(b, c)| (b * c * heads_kv * d).max(back_to_back_len)).max().unwrap_or(0);
    let max_batch = shapes.iter().map(|&(b, _)| b).max().unwrap_or(0);
    eprintln!("decode: filling 2 x {} MiB of K and V", (cache_len * 2) >> 20);
    let mut k = unsafe { DeviceBuffer::<f16>::uninitialized(cache_len)? };
    let mut v = unsafe { DeviceBuffer::<f16>::uninitialized(cache_len)? };
    fill_random(&mut k, stream)?;
    fill_random(&mut v, stream)?;
    let q_host: Vec<f16> =
        normal(&mut rand::thread_rng(), max_batch * heads_q * d).into_iter().map(f16::from_f32).collect();
    let q = DeviceBuffer::from_slice(&q_host)?;
    let mut o = DeviceBuffer::from_slice(&vec![f16::ZERO; max_batch * heads_q * d])?;
    let mut lse = DeviceBuffer::from_slice(&vec![0f32; max_batch * heads_q])?;
    let flush =
        unsafe { (DeviceBuffer::<u8>::zeroed(L2_FLUSH_BYTES)?, DeviceBuffer::<u8>::uninitialized(L2_FLUSH_BYTES)?) };
    let flush = (flush.0.as_device_ptr().as_raw(), flush.1.as_device_ptr().as_raw());
    let mut workspace = Workspace::new();
    let params = AttentionParams { causal: true, num_splits, ..Default::default() };
    let mut rows = Vec::new();
    for (i, &(batch, cache)) in shapes.iter().enumerate() {
        eprintln!("decode [{}/{}]: batch {batch}, cache {cache}", i + 1, shapes.len());
        let lens = CacheSeqlens::new(&vec![cache as i32; batch])?;
        let cache_shape = [batch, cache, heads_kv, d];
        let region_len = batch * cache * heads_kv * d;
        let regions = (cache_len / region_len).min(BACK_TO_BACK_MAX_CALLS);
        // The `region`-th K and V of this shape: disjoint parts of k and v.
        let part = |buffer: &DeviceBuffer<f16>, region: usize| unsafe {
            DeviceSlice::from_raw_parts(buffer.as_device_ptr().add(region * region_len), region_len)
        };
        let parts: Vec<_> = (0..regions).map(|region| (part(&k, region), part(&v, region))).collect();
        // One call over the `region`-th K and V.
        let mut run = |region: usize| -> Result<(), Box<dyn std::error::Error>> {
            let (k, v) = &parts[region];
            let kv = KvCache::new(Tensor::new(k, cache_shape), Tensor::new(v, cache_shape), &lens);
            attention.forward_kvcache_into(
                Tensor::new(&q, [batch, 1, heads_q, d]),
                kv,
                TensorMut::new(&mut o, [batch, 1, heads_q, d]),
                &mut lse,
                &params,
                &mut workspace,
                stream,
            )?;
            Ok(())
        };
        // Warm up (the first call sizes the workspace).
        for _ in 0..3 {
            run(0)?;
        }
        stream.synchronize()?;
        // The flush also keeps the GPU busy while the host prepares the call.
        let time_ms = median_ms(stream, reps, || copy_async(flush.1, flush.0, L2_FLUSH_BYTES, stream), || run(0))?;
        // Back to back: four flushes keep the GPU busy while the host queues
        // the calls, so that the run times the GPU, not the host.
        let flush_four = || (0..4).try_for_each(|_| copy_async(flush.1, flush.0, L2_FLUSH_BYTES, stream));
        // The host's time to queue them, to show that it kept ahead.
        let mut host_seconds = Vec::new();
        let run_ms = median_ms(stream, reps.min(5), flush_four, || {
            let queued = std::time::Instant::now();
            (0..regions).try_for_each(&mut run)?;
            host_seconds.push(queued.elapsed().as_secs_f64());
            Ok(())
        })?;
        host_seconds.sort_by(f64::total_cmp);
        let host_us = 1e6 * host_seconds[host_seconds.len() / 2] / regions as f64;
        let back_to_back_ms = run_ms / regions as f64;
        // The same regions' K copied onto their V, as many copies back to
        // back (the values stay random normals).
        let copy_ms = median_ms(stream, reps.min(5), flush_four, || {
            parts.iter().try_for_each(|(k, v)| {
                copy_async(v.as_device_ptr().as_raw(), k.as_device_ptr().as_raw(), 2 * region_len, stream)
            })
        })?;
        rows.push(DecodeRow {
            batch,
            cache,
            kv_bytes: kv_bytes(batch, cache),
            time_ms,
            back_to_back_ms,
            host_us,
            same_bytes_copy_ms: copy_ms / regions as f64,
        });
    }
    Ok(rows)
}

/// The prefill rows a run times: every dtype x head dim x mask x seqlen.
struct PrefillGrid<'a> {
    dtypes: &'a [&'static str],
    head_dims: &'a [usize],
    seqlens: &'a [usize],
    masks: &'a [bool],
    heads_major: bool,
    /// batch * seqlen of every row (`--tokens`, default 16384).
    tokens: usize,
    /// `--heads`, where given (else hidden 2048 / d).
    heads: Option<usize>,
    /// `--softcap`, where given.
    softcap: Option<f32>,
}

impl PrefillGrid<'_> {
    /// The grid's shapes in the order the tables print them: dtype, head
    /// dim, mask, seqlen, the innermost last; head dims where `keep` holds.
    fn shapes(&self, keep: impl Fn(usize) -> bool) -> Vec<Shape> {
        let PrefillGrid { dtypes, head_dims, seqlens, masks, heads_major, tokens, heads, softcap } = *self;
        let mut shapes = Vec::new();
        for &dtype in dtypes {
            for &head_dim in head_dims.iter().filter(|&&d| keep(d)) {
                for &causal in masks {
                    for &seqlen in seqlens {
                        let shape = Shape { seqlen, head_dim, causal, dtype, heads_major, tokens, heads, softcap };
                        shapes.push(shape);
                    }
                }
            }
        }
        shapes
    }
}

/// Times the prefill grid, printing a row per shape and writing its JSON.
fn prefill_rows(
    attention: &FlashAttention,
    monitor: &Monitor,
    grid: &PrefillGrid,
    reps: usize,
    out: &mut Option<std::fs::File>,
) -> Result<(), Box<dyn std::error::Error>> {
    let module = Module::from_ptx(TEST_PTX, &[])?;
    let ceiling_kernel = module.get_function("mma_ceiling")?;
    let sms = CurrentContext::get_device()?.get_attribute(DeviceAttribute::MultiprocessorCount)? as u32;
    let ceiling_at = |blocks_per_sm, warps| mma_ceiling_tflops(&ceiling_kernel, sms, blocks_per_sm, warps);
    let ceiling = ceiling_at(8, 8)?;
    println!("mma.sync m16n8k16 f16 ceiling (registers only, this GPU): {ceiling:.1} TFLOP/s");
    let (one, two) = (ceiling_at(1, 4)?, ceiling_at(2, 4)?);
    println!("  with 1 / 2 warps per scheduler (4 / 8 per SM): {one:.1} / {two:.1} TFLOP/s");
    println!(
        "{:<6} {:>4} {:>7} {:>6} {:>10} {:>9} {:>10} {:>8}",
        "dtype", "d", "causal", "seqlen", "TFLOP/s", "ceiling", "MHz/W", "warm-up"
    );
    for shape in grid.shapes(|_| true) {
        let Shape { dtype, head_dim, causal, seqlen, .. } = shape;
        let measured = match dtype {
            "f16" => time_shape::<f16>(attention, monitor, &shape, false, reps)?,
            _ => time_shape::<bf16>(attention, monitor, &shape, false, reps)?,
        };
        println!(
            "{:<6} {:>4} {:>7} {:>6} {:>10.1} {:>8.0}% {:>10} {:>7.2}s",
            dtype,
            head_dim,
            causal,
            seqlen,
            measured.tflops,
            100.0 * measured.tflops / ceiling,
            measured.reading.label(),
            measured.warm_up_s
        );
        if let Some(f) = out.as_mut() {
            // Rows with a softcap are `"kind":"softcap"`: bench_torch.py
            // times its peers on the plain prefill rows only.
            writeln!(
                f,
                "{{{}{},\"tflops\":{:.3},\"ceiling_tflops\":{:.3}{}}}",
                if shape.softcap.is_some() { "\"kind\":\"softcap\"," } else { "" },
                shape.json_fields(),
                measured.tflops,
                ceiling,
                measured.json_fields("")
            )?;
        }
    }
    Ok(())
}

/// Times the backward over `grid` (its dtypes, head dims that have
/// backward kernels, seqlens and masks; `[batch, seqlen, heads, d]`),
/// printing a row per shape and writing its JSON (`"kind":"backward"`).
fn backward_rows(
    attention: &FlashAttention,
    monitor: &Monitor,
    grid: &PrefillGrid,
    reps: usize,
    out: &mut Option<std::fs::File>,
) -> Result<(), Box<dyn std::error::Error>> {
    println!("backward (dQ, dK, dV; TFLOP/s at 2.5x the forward's FLOPs):");
    println!(
        "{:<6} {:>4} {:>7} {:>6} {:>10} {:>10} {:>8}",
        "dtype", "d", "causal", "seqlen", "TFLOP/s", "MHz/W", "warm-up"
    );
    let with_kernels = |d: usize| BACKWARD_KERNELS.iter().any(|k| k.head_dim as usize == d);
    // The backward times [batch, seqlen, heads, d] only.
    for shape in grid.shapes(with_kernels) {
        let shape = Shape { heads_major: false, ..shape };
        let Shape { dtype, head_dim, causal, seqlen, .. } = shape;
        let measured = match dtype {
            "f16" => time_backward::<f16>(attention, monitor, &shape, reps)?,
            _ => time_backward::<bf16>(attention, monitor, &shape, reps)?,
        };
        println!(
            "{:<6} {:>4} {:>7} {:>6} {:>10.1} {:>10} {:>7.2}s",
            dtype,
            head_dim,
            causal,
            seqlen,
            measured.tflops,
            measured.reading.label(),
            measured.warm_up_s
        );
        if let Some(f) = out.as_mut() {
            writeln!(
                f,
                "{{\"kind\":\"backward\",{},\"tflops\":{:.3}{}}}",
                shape.json_fields(),
                measured.tflops,
                measured.json_fields("")
            )?;
        }
    }
    Ok(())
}

/// Head dims and seqlens of the variable-length rows.
const VARLEN_HEAD_DIMS: [usize; 2] = [64, 128];
const VARLEN_SEQLENS: [usize; 2] = [1024, 4096];

/// Variable-length rows: the standard grid's shapes at d=64 and 128, f16,
/// every sequence packed at the same length through `forward_varlen_into`
/// (the general kernels), each timed beside the dense API on the same work
/// in the same run.
fn varlen_rows(
    attention: &FlashAttention,
    monitor: &Monitor,
    reps: usize,
    out: &mut Option<std::fs::File>,
) -> Result<(), Box<dyn std::error::Error>> {
    println!("variable lengths: f16, every sequence at seqlen, packed; general kernels beside the dense ones");
    println!(
        "{:>4} {:>7} {:>6} {:>14} {:>10} {:>14} {:>10} {:>8}",
        "d", "causal", "seqlen", "varlen TFLOP/s", "MHz/W", "dense TFLOP/s", "MHz/W", "ratio"
    );
    for head_dim in VARLEN_HEAD_DIMS {
        for causal in [false, true] {
            for seqlen in VARLEN_SEQLENS {
                let shape = Shape {
                    seqlen,
                    head_dim,
                    causal,
                    dtype: "f16",
                    heads_major: false,
                    tokens: STANDARD_TOKENS,
                    heads: None,
                    softcap: None,
                };
                let dense = time_shape::<f16>(attention, monitor, &shape, false, reps)?;
                let varlen = time_shape::<f16>(attention, monitor, &shape, true, reps)?;
                println!(
                    "{head_dim:>4} {causal:>7} {seqlen:>6} {:>14.1} {:>10} {:>14.1} {:>10} {:>7.2}x",
                    varlen.tflops,
                    varlen.reading.label(),
                    dense.tflops,
                    dense.reading.label(),
                    varlen.tflops / dense.tflops
                );
                if let Some(f) = out.as_mut() {
                    writeln!(
                        f,
                        "{{\"kind\":\"varlen\",\"dtype\":\"f16\",\"head_dim\":{},\"causal\":{},\"seqlen\":{},\"batch\":{},\"heads\":{},\"tflops\":{:.3},\"dense_tflops\":{:.3}{}{}}}",
                        head_dim,
                        causal,
                        seqlen,
                        shape.batch(),
                        shape.heads(),
                        varlen.tflops,
                        dense.tflops,
                        varlen.json_fields(""),
                        dense.json_fields("dense_")
                    )?;
                }
            }
        }
    }
    Ok(())
}

/// `value` as a JSON string literal.
fn json_string(value: &str) -> String {
    let mut quoted = String::from("\"");
    for c in value.chars() {
        match c {
            '"' => quoted.push_str("\\\""),
            '\\' => quoted.push_str("\\\\"),
            c if (c as u32) < 0x20 => quoted.push_str(&format!("\\u{:04x}", c as u32)),
            c => quoted.push(c),
        }
    }
    quoted.push('"');
    quoted
}

/// The CUDA device's PCI bus id as NVML spells it (`00000000:3B:00.0`).
fn pci_bus_id() -> Result<String, Box<dyn std::error::Error>> {
    let device = CurrentContext::get_device()?;
    let attribute = |a| device.get_attribute(a);
    Ok(format!(
        "{:08X}:{:02X}:{:02X}.0",
        attribute(DeviceAttribute::PciDomainId)?,
        attribute(DeviceAttribute::PciBusId)?,
        attribute(DeviceAttribute::PciDeviceId)?
    ))
}

/// What the command line asks for.
#[derive(Debug)]
struct Options {
    out_path: Option<String>,
    quick: bool,
    decode_only: bool,
    varlen_only: bool,
    /// `--backward-only`: the backward rows alone.
    backward_only: bool,
    heads_major: bool,
    dtypes: Vec<&'static str>,
    head_dims: Option<Vec<usize>>,
    seqlens: Option<Vec<usize>>,
    non_causal: bool,
    /// `--portable`: time the sm_80 kernels only (`FlashAttention::portable`).
    portable: bool,
    tokens: Option<usize>,
    heads: Option<usize>,
    /// `--softcap C`: a softcap on every prefill row.
    softcap: Option<f32>,
    reps: usize,
    decode_batches: Option<Vec<usize>>,
    decode_caches: Option<Vec<usize>>,
    decode_splits: Option<usize>,
    /// The standard grid's shapes (which bring the variable-length rows).
    standard_grid: bool,
    /// Whether the decode rows run.
    decode: bool,
    /// Whether the backward rows run (with the standard grid, or alone).
    backward: bool,
    /// Arguments no option takes (warned about, then ignored).
    unknown: Vec<String>,
}

/// Flags without a value, then flags with one.
const SWITCHES: [&str; 8] = [
    "--quick",
    "--decode-only",
    "--no-decode",
    "--varlen-only",
    "--backward-only",
    "--no-backward",
    "--non-causal",
    "--portable",
];
const VALUED: [&str; 12] = [
    "--out",
    "--reps",
    "--head-dims",
    "--seqlens",
    "--layout",
    "--dtypes",
    "--decode-batches",
    "--decode-caches",
    "--decode-splits",
    "--tokens",
    "--heads",
    "--softcap",
];

/// Reads the command line (`args` without the program's name).
fn parse_args(args: &[String]) -> Result<Options, String> {
    let mut unknown = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let arg = args[i].as_str();
        if VALUED.contains(&arg) {
            if args.get(i + 1).is_none_or(|v| v.starts_with("--")) {
                return Err(format!("{arg} needs a value"));
            }
            i += 2;
        } else {
            if !SWITCHES.contains(&arg) {
                unknown.push(arg.to_string());
            }
            i += 1;
        }
    }
    let value = |flag: &str| args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).map(String::as_str);
    let flag = |name: &str| args.iter().any(|a| a == name);
    let list = |flag: &str| -> Result<Option<Vec<usize>>, String> {
        let Some(v) = value(flag) else { return Ok(None) };
        v.split(',')
            .map(|n| n.parse().map_err(|_| format!("{flag}: not a number: {n:?}")))
            .collect::<Result<_, _>>()
            .map(Some)
    };
    // A flag that takes one number > 0, where given.
    let positive = |flag: &str| match list(flag)?.as_deref() {
        None => Ok(None),
        Some(&[n]) if n > 0 => Ok(Some(n)),
        Some(_) => Err(format!("{flag} takes one number > 0")),
    };
    let (quick, decode_only, no_decode) = (flag("--quick"), flag("--decode-only"), flag("--no-decode"));
    let varlen_only = flag("--varlen-only");
    let (backward_only, no_backward) = (flag("--backward-only"), flag("--no-backward"));
    let heads_major = match value("--layout") {
        None | Some("bshd") => false,
        Some("bhsd") => true,
        Some(other) => return Err(format!("--layout takes bshd or bhsd, not {other:?}")),
    };
    let dtypes = match value("--dtypes") {
        None => vec!["f16", "bf16"],
        Some(v) => v
            .split(',')
            .map(|d| match d {
                "f16" => Ok("f16"),
                "bf16" => Ok("bf16"),
                other => Err(format!("--dtypes takes f16 and/or bf16, not {other:?}")),
            })
            .collect::<Result<Vec<_>, _>>()?,
    };
    let head_dims = list("--head-dims")?;
    let seqlens = list("--seqlens")?;
    let tokens = positive("--tokens")?;
    let heads = positive("--heads")?;
    let softcap = match value("--softcap").map(str::parse::<f32>) {
        None => None,
        Some(Ok(c)) if c > 0.0 && c.is_finite() => Some(c),
        Some(_) => return Err("--softcap takes one number > 0".into()),
    };
    let reps = positive("--reps")?.unwrap_or(if quick { 10 } else { 30 });
    let off_grid = tokens.is_some() || heads.is_some() || softcap.is_some();
    // The variable-length rows come with the standard grid only.
    let standard_grid = head_dims.is_none() && seqlens.is_none() && !off_grid && value("--dtypes").is_none();
    if decode_only && no_decode {
        return Err("--decode-only and --no-decode exclude each other".into());
    }
    if varlen_only && (decode_only || !standard_grid) {
        return Err(
            "--varlen-only excludes --decode-only, --head-dims, --seqlens, --dtypes, --tokens and --heads".into()
        );
    }
    if backward_only && (decode_only || varlen_only || no_backward) {
        return Err("--backward-only excludes --decode-only, --varlen-only and --no-backward".into());
    }
    if decode_only && off_grid {
        return Err("--tokens, --heads and --softcap shape prefill rows; --decode-only runs none".into());
    }
    if softcap.is_some() && backward_only {
        return Err("--softcap sets the forward prefill rows' softcap; --backward-only runs none".into());
    }
    let decode_splits = match list("--decode-splits")?.as_deref() {
        None => None,
        Some(&[splits]) => Some(splits),
        Some(_) => return Err("--decode-splits takes one number".into()),
    };
    Ok(Options {
        out_path: value("--out").map(str::to_string),
        quick,
        decode_only,
        varlen_only,
        backward_only,
        heads_major,
        dtypes,
        head_dims,
        seqlens,
        non_causal: flag("--non-causal"),
        portable: flag("--portable"),
        tokens,
        heads,
        softcap,
        reps,
        decode_batches: list("--decode-batches")?,
        decode_caches: list("--decode-caches")?,
        decode_splits,
        standard_grid,
        // Choosing prefill shapes asks for prefill rows only.
        decode: decode_only || !(varlen_only || backward_only || no_decode || !standard_grid),
        backward: backward_only || (standard_grid && !(decode_only || varlen_only || no_backward)),
        unknown,
    })
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let options = parse_args(&args)?;
    for arg in &options.unknown {
        eprintln!("bench: WARNING: ignoring unknown argument {arg:?}");
    }
    let reps = options.reps;
    let _context =
        flash_attn::cust::quick_init().map_err(|e| format!("no usable CUDA GPU ({e}): the benchmark needs one"))?;
    let attention = if options.portable { FlashAttention::portable()? } else { FlashAttention::new()? };
    println!(
        "kernels: {}",
        if attention.uses_sm90a() {
            "sm_90a (TMA, wgmma) for the calls they take, sm_80 for the rest"
        } else {
            "sm_80 (mma.sync) only"
        }
    );
    // Clock and power beside every prefill and varlen row; without NVML the
    // rows say n/a and this line says why.
    let monitor = Monitor::start(match pci_bus_id() {
        Ok(id) => Nvml::open(Some(&id)),
        Err(e) => Nvml::open(None).map_err(|nvml| format!("{nvml} (and no PCI bus id from CUDA: {e})")),
    });
    println!("{}", monitor.status);
    println!(
        "timing: each row after >= {:.1} s of its call back to back, then {reps} calls queued right behind \
         (median); MHz/W: NVML SM clock and board power over the timed calls",
        hot::HOT.warm_up_ms / 1e3
    );
    let mut out = match &options.out_path {
        Some(p) => Some(std::fs::File::create(p)?),
        None => None,
    };
    if let Some(f) = out.as_mut() {
        let (gpu, driver) = monitor.device().unwrap_or(("", ""));
        writeln!(
            f,
            "{{\"kind\":\"meta\",\"nvml\":{},\"gpu\":{},\"driver\":{},\"warm_up_s\":{:.3},\"reps\":{reps}}}",
            json_string(if monitor.available() { "ok" } else { &monitor.status }),
            json_string(gpu),
            json_string(driver),
            hot::HOT.warm_up_ms / 1e3
        )?;
    }
    let head_dims = options.head_dims.clone().unwrap_or(vec![64, 128]);
    let seqlens = options.seqlens.clone().unwrap_or(if options.quick {
        vec![1024, 4096]
    } else {
        vec![512, 1024, 2048, 4096, 8192, 16384]
    });
    let masks: &[bool] = if options.non_causal { &[false] } else { &[false, true] };
    let grid = PrefillGrid {
        dtypes: &options.dtypes,
        head_dims: &head_dims,
        seqlens: &seqlens,
        masks,
        heads_major: options.heads_major,
        tokens: options.tokens.unwrap_or(STANDARD_TOKENS),
        heads: options.heads,
        softcap: options.softcap,
    };
    if options.varlen_only {
        varlen_rows(&attention, &monitor, reps, &mut out)?;
    } else if !(options.decode_only || options.backward_only) {
        prefill_rows(&attention, &monitor, &grid, reps, &mut out)?;
        if options.standard_grid {
            varlen_rows(&attention, &monitor, reps, &mut out)?;
        }
    }
    if options.backward {
        backward_rows(&attention, &monitor, &grid, reps, &mut out)?;
    }
    if options.decode {
        let stream = Stream::new(StreamFlags::NON_BLOCKING, None)?;
        let copy = copy_bandwidth(&stream)?;
        let (batches, caches) = if options.quick {
            (vec![1, 16], vec![4096, 16384])
        } else {
            (vec![1, 4, 16, 64], vec![1024, 4096, 8192, 16384, 65536])
        };
        let batches = options.decode_batches.clone().unwrap_or(batches);
        let caches = options.decode_caches.clone().unwrap_or(caches);
        let rows = decode_rows(&attention, &batches, &caches, options.decode_splits, reps, &stream)?;
        let (heads_q, heads_kv) = DECODE_HEADS;
        println!(
            "decode: f16, seqlen_q 1, heads {heads_q}:{heads_kv}, d {DECODE_HEAD_DIM}, causal; \
             device-to-device copy (read + write): {:.0} GB/s",
            copy / 1e9
        );
        println!(
            "| batch | cache | KV MiB | one call us | KV / copy | back to back us | host us | KV read GB/s | copy GB/s | KV / copy | same-bytes copy GB/s | KV / same-bytes copy |"
        );
        println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
        for row in &rows {
            let one_call_gbps = row.kv_bytes as f64 / (row.time_ms * 1e-3);
            let gbps = row.kv_bytes as f64 / (row.back_to_back_ms * 1e-3);
            let same_bytes_gbps = row.kv_bytes as f64 / (row.same_bytes_copy_ms * 1e-3);
            println!(
                "| {} | {} | {} | {:.1} | {:.0}% | {:.1} | {:.1} | {:.0} | {:.0} | {:.0}% | {:.0} | {:.0}% |",
                row.batch,
                row.cache,
                row.kv_bytes >> 20,
                row.time_ms * 1e3,
                100.0 * one_call_gbps / copy,
                row.back_to_back_ms * 1e3,
                row.host_us,
                gbps / 1e9,
                copy / 1e9,
                100.0 * gbps / copy,
                same_bytes_gbps / 1e9,
                100.0 * gbps / same_bytes_gbps
            );
            if let Some(f) = out.as_mut() {
                writeln!(
                    f,
                    "{{\"kind\":\"decode\",\"dtype\":\"f16\",\"head_dim\":{DECODE_HEAD_DIM},\"heads_q\":{heads_q},\"heads_kv\":{heads_kv},\"batch\":{},\"cache\":{},\"kv_bytes\":{},\"time_us\":{:.3},\"back_to_back_us\":{:.3},\"host_us\":{:.3},\"kv_gbps\":{:.3},\"copy_gbps\":{:.3},\"same_bytes_copy_gbps\":{:.3}}}",
                    row.batch,
                    row.cache,
                    row.kv_bytes,
                    row.time_ms * 1e3,
                    row.back_to_back_ms * 1e3,
                    row.host_us,
                    gbps / 1e9,
                    copy / 1e9,
                    same_bytes_gbps / 1e9
                )?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> Result<Options, String> {
        parse_args(&line.split_whitespace().map(String::from).collect::<Vec<_>>())
    }

    #[test]
    fn defaults_are_the_standard_grid_with_varlen_and_decode() {
        let o = parse("").unwrap();
        assert!(o.standard_grid && o.decode && !o.quick && !o.varlen_only && !o.non_causal && !o.heads_major);
        assert_eq!(o.reps, 30);
        assert_eq!(o.dtypes, ["f16", "bf16"]);
        assert!(o.unknown.is_empty() && o.out_path.is_none());
        let o = parse("--quick --out x.jsonl").unwrap();
        assert_eq!((o.reps, o.quick, o.out_path.as_deref()), (10, true, Some("x.jsonl")));
        assert!(o.standard_grid && o.decode);
    }

    #[test]
    fn choosing_prefill_shapes_selects_prefill_rows_only() {
        for line in [
            "--head-dims 32,96 --seqlens 1024,4096",
            "--dtypes f16",
            "--tokens 32768",
            "--heads 8",
            "--seqlens 512",
            "--softcap 30",
        ] {
            let o = parse(line).unwrap();
            assert!(!o.standard_grid && !o.decode, "{line}");
        }
        let o = parse("--head-dims 32,96,160 --seqlens 1024,4096 --dtypes f16 --out o.jsonl").unwrap();
        assert_eq!(o.head_dims, Some(vec![32, 96, 160]));
        assert_eq!(o.seqlens, Some(vec![1024, 4096]));
        assert_eq!(o.dtypes, ["f16"]);
        assert_eq!(parse("--dtypes bf16,f16").unwrap().dtypes, ["bf16", "f16"]);
        assert_eq!(parse("--softcap 2.5").unwrap().softcap, Some(2.5));
        assert!(parse("--no-decode").unwrap().standard_grid);
        assert!(!parse("--no-decode").unwrap().decode);
        assert!(parse("--decode-only --decode-batches 1,4 --decode-caches 4096 --decode-splits 3").unwrap().decode);
        let o = parse("--decode-only --decode-batches 1,4 --decode-caches 4096 --decode-splits 3").unwrap();
        assert_eq!((o.decode_batches, o.decode_caches, o.decode_splits), (Some(vec![1, 4]), Some(vec![4096]), Some(3)));
        let o = parse("--varlen-only --reps 5 --layout bhsd --non-causal").unwrap();
        assert!(o.varlen_only && !o.decode && !o.backward && o.heads_major && o.non_causal);
        assert_eq!(o.reps, 5);
    }

    #[test]
    fn backward_rows_come_with_the_standard_grid_or_alone() {
        assert!(parse("").unwrap().backward && parse("--quick").unwrap().backward);
        for line in ["--no-backward", "--decode-only", "--varlen-only", "--head-dims 64"] {
            assert!(!parse(line).unwrap().backward, "{line}");
        }
        let o = parse("--backward-only --head-dims 64 --seqlens 1024 --dtypes bf16").unwrap();
        assert!(o.backward && o.backward_only && !o.decode);
        let o = parse("--backward-only").unwrap();
        assert!(o.backward && !o.decode && o.standard_grid);
    }

    #[test]
    fn bad_arguments_are_errors_and_unknown_ones_are_kept_for_a_warning() {
        for (line, error) in [
            ("--reps 0", "--reps takes one number > 0"),
            ("--reps 2,3", "--reps takes one number > 0"),
            ("--reps", "--reps needs a value"),
            ("--out --quick", "--out needs a value"),
            ("--seqlens 1k", "--seqlens: not a number: \"1k\""),
            ("--layout bsdh", "--layout takes bshd or bhsd"),
            ("--dtypes f32", "--dtypes takes f16 and/or bf16"),
            ("--decode-only --no-decode", "exclude each other"),
            ("--varlen-only --head-dims 64", "--varlen-only excludes"),
            ("--decode-only --tokens 4096", "--decode-only runs none"),
            ("--softcap 0", "--softcap takes one number > 0"),
            ("--softcap inf", "--softcap takes one number > 0"),
            ("--backward-only --softcap 30", "--backward-only runs none"),
            ("--decode-splits 2,3", "--decode-splits takes one number"),
            ("--backward-only --varlen-only", "--backward-only excludes"),
            ("--backward-only --no-backward", "--backward-only excludes"),
        ] {
            let e = parse(line).unwrap_err();
            assert!(e.contains(error), "{line}: {e}");
        }
        let o = parse("--quik --persistent never").unwrap();
        assert_eq!(o.unknown, ["--quik", "--persistent", "never"]);
    }

    #[test]
    fn json_strings_are_escaped() {
        assert_eq!(json_string("NVIDIA H100 80GB HBM3"), "\"NVIDIA H100 80GB HBM3\"");
        assert_eq!(json_string("a \"b\" \\ c\nd"), "\"a \\\"b\\\" \\\\ c\\u000ad\"");
    }

    #[test]
    fn measured_json_fields() {
        let mut m = Measured {
            tflops: 300.0,
            mean_tflops: 299.5,
            reading: Reading { mhz: Some(1837.25), watts: Some(478.0), samples: 7 },
            warm_up_s: 1.0123,
            warm_up_calls: 400,
            lookahead: 9,
        };
        assert_eq!(
            m.json_fields("dense_"),
            ",\"dense_mhz\":1837.2,\"dense_watts\":478.0,\"dense_nvml_samples\":7,\"dense_mean_tflops\":299.500,\
             \"dense_warm_up_s\":1.012,\"dense_warm_up_calls\":400,\"dense_lookahead\":9"
        );
        m.reading = Reading::default();
        assert!(m.json_fields("").starts_with(",\"mhz\":null,\"watts\":null,\"nvml_samples\":0,"));
    }
}

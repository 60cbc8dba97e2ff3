//! The attention kernels on host tensors through the CPU emulator
//! ([`crate::emu`]), and an f64 reference to check them against: what the
//! tests and the `emulate` example run without a GPU.

use flash_attn_abi::kernels::{combine_grid, APPEND_THREADS, COMBINE_THREADS};

use crate::emu::{self, GlobalRegion, LaunchConfig};
use crate::entry::{self, HostKernel};
use crate::params::{AppendParams, CombineParams, ForwardParams, ForwardSizes, TensorArg};
use crate::reference::{self, ReferenceProblem};
pub use flash_attn_abi::kernels::Dtype;

/// 16 bytes, the alignment `cp.async` needs of every tensor.
#[derive(Clone, Copy, Debug)]
#[repr(C, align(16))]
struct Chunk([u16; 8]);

/// A `[batch, seqlen, heads, head_dim]` tensor of f16 or bf16 bits in host
/// memory, 16-byte aligned, with strides in elements.
#[derive(Clone, Debug)]
pub struct Tensor {
    pub shape: [usize; 4],
    pub strides: [usize; 4],
    chunks: Vec<Chunk>,
    len: usize,
}

/// An element pattern that is NaN in f16 and in bf16: output not written.
pub const POISON: u16 = 0x7fff;

impl Tensor {
    /// Densely packed strides of `shape`.
    pub fn contiguous_strides(shape: [usize; 4]) -> [usize; 4] {
        let [_, s, h, d] = shape;
        [s * h * d, h * d, d, 1]
    }

    /// A tensor of `shape` and `strides` with every element, padding
    /// included, set to `fill`.
    pub fn filled(shape: [usize; 4], strides: [usize; 4], fill: u16) -> Self {
        let len = shape.iter().zip(strides).map(|(&n, s)| (n - 1) * s).sum::<usize>() + 1;
        Self { shape, strides, chunks: vec![Chunk([fill; 8]); len.div_ceil(8)], len }
    }

    /// Standard normal values, pseudo-random in `seed`, rounded to `dtype`;
    /// padding is NaN, which the kernel must never read.
    pub fn random(shape: [usize; 4], strides: [usize; 4], dtype: Dtype, seed: u64) -> Self {
        let mut t = Self::filled(shape, strides, POISON);
        let mut rng = Normal::new(seed);
        let indices: Vec<usize> = t.indices().collect();
        for i in indices {
            t.data_mut()[i] = dtype.bits_of(rng.sample());
        }
        t
    }

    pub fn data(&self) -> &[u16] {
        // SAFETY: `chunks` holds at least `len` initialised u16.
        unsafe { std::slice::from_raw_parts(self.chunks.as_ptr().cast(), self.len) }
    }

    pub fn data_mut(&mut self) -> &mut [u16] {
        // SAFETY: as `data`.
        unsafe { std::slice::from_raw_parts_mut(self.chunks.as_mut_ptr().cast(), self.len) }
    }

    /// Index into `data` of element `[b, s, h, d]`.
    pub fn index(&self, at: [usize; 4]) -> usize {
        at.iter().zip(self.strides).map(|(&i, s)| i * s).sum()
    }

    /// The indices of every element, in `[b, s, h, d]` order.
    pub fn indices(&self) -> impl Iterator<Item = usize> + '_ {
        let [nb, ns, nh, nd] = self.shape;
        (0..nb * ns * nh * nd).map(move |i| self.index([i / (ns * nh * nd), i / (nh * nd) % ns, i / nd % nh, i % nd]))
    }

    /// The elements as f64, densely packed.
    pub fn to_f64(&self, dtype: Dtype) -> Vec<f64> {
        self.indices().map(|i| dtype.to_f64(self.data()[i])).collect()
    }
}

/// Conversions of a kernel's element type on the host.
pub trait DtypeValues {
    fn to_f64(self, bits: u16) -> f64;
    fn bits_of(self, x: f64) -> u16;
    /// Largest relative L2 error of O allowed against the f64 reference
    /// (the GPU tests' budget).
    fn o_tolerance(self) -> f64;
}

impl DtypeValues for Dtype {
    fn to_f64(self, bits: u16) -> f64 {
        match self {
            Dtype::F16 => half::f16::from_bits(bits).to_f64(),
            Dtype::Bf16 => half::bf16::from_bits(bits).to_f64(),
        }
    }

    fn bits_of(self, x: f64) -> u16 {
        match self {
            Dtype::F16 => half::f16::from_f64(x).to_bits(),
            Dtype::Bf16 => half::bf16::from_f64(x).to_bits(),
        }
    }

    fn o_tolerance(self) -> f64 {
        match self {
            Dtype::F16 => 2e-3,
            Dtype::Bf16 => 1.6e-2,
        }
    }
}

/// Largest absolute error of a finite LSE allowed against the reference.
pub const LSE_TOLERANCE: f64 = 2e-3;

/// Normal samples: xorshift64* and Box-Muller.
struct Normal(u64);

impl Normal {
    fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    fn uniform(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        ((self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    fn sample(&mut self) -> f64 {
        (-2.0 * self.uniform().ln()).sqrt() * (std::f64::consts::TAU * self.uniform()).cos()
    }
}

/// The launch of `kernel` for `batch` x `heads_q` x `seqlen_q` query rows,
/// as the host crate makes it on the GPU.
pub fn launch_config(kernel: &HostKernel, batch: usize, heads_q: usize, seqlen_q: usize) -> LaunchConfig {
    let c = kernel.kernel.config;
    let grid = [seqlen_q.div_ceil(c.block_m as usize) as u32, heads_q as u32, batch as u32];
    LaunchConfig::new(grid, c.threads(), c.smem_bytes())
}

/// The kernel arguments for `q`, `k`, `v` into `o` and `lse`
/// (`[batch, heads_q, seqlen_q]`).
///
/// # Panics
/// If the shapes do not fit together.
pub fn forward_params(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    o: &mut Tensor,
    lse: &mut [f32],
    scale: f32,
) -> ForwardParams {
    let [batch, seqlen_q, heads_q, head_dim] = q.shape;
    let [batch_k, seqlen_k, heads_kv, head_dim_k] = k.shape;
    assert_eq!((batch, head_dim), (batch_k, head_dim_k), "q and k must agree on batch and head_dim");
    assert_eq!(k.shape, v.shape, "k and v must have one shape");
    assert_eq!(o.shape, q.shape, "o must have q's shape");
    assert!(heads_q.is_multiple_of(heads_kv), "heads_q must be a multiple of heads_kv");
    assert_eq!(lse.len(), batch * heads_q * seqlen_q, "lse must hold batch * heads_q * seqlen_q values");
    let arg = |t: &Tensor| {
        assert_eq!(t.strides[3], 1, "head_dim must be contiguous");
        TensorArg { ptr: t.data().as_ptr(), strides: [0, 1, 2].map(|i| t.strides[i] as i64) }
    };
    let sizes = ForwardSizes {
        batch: batch as u32,
        seqlen_q: seqlen_q as u32,
        seqlen_k: seqlen_k as u32,
        heads_q: heads_q as u32,
        heads_per_kv: (heads_q / heads_kv) as u32,
    };
    let o_strides = arg(o).strides;
    let o_arg = TensorArg { ptr: o.data_mut().as_mut_ptr(), strides: o_strides };
    ForwardParams::new(arg(q), arg(k), arg(v), o_arg, lse.as_mut_ptr(), sizes, scale)
}

/// O (of `q`'s shape) and the LSE (`[batch, heads_q, seqlen_q]`) of one
/// emulated forward pass.
pub struct Output {
    pub o: Tensor,
    pub lse: Vec<f32>,
}

/// Runs `kernel` on the emulator, into a fresh `o` with `o_strides` whose
/// every element starts as NaN ([`POISON`]), so that an element the kernel
/// misses shows.
pub fn forward(
    kernel: &HostKernel,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    o_strides: [usize; 4],
    scale: f32,
) -> Result<Output, emu::Error> {
    assert_eq!(
        q.shape[3], kernel.kernel.config.head_dim as usize,
        "{} takes head_dim {}",
        kernel.kernel.name, kernel.kernel.config.head_dim
    );
    let [batch, seqlen_q, heads_q, _] = q.shape;
    let mut o = Tensor::filled(q.shape, o_strides, POISON);
    let mut lse = vec![f32::NAN; batch * heads_q * seqlen_q];
    let params = forward_params(q, k, v, &mut o, &mut lse, scale);
    let regions = [
        GlobalRegion::read_only("q", q.data()),
        GlobalRegion::read_only("k", k.data()),
        GlobalRegion::read_only("v", v.data()),
        GlobalRegion::writable("o", o.data_mut()),
        GlobalRegion::writable("lse", &mut lse),
    ];
    let config = launch_config(kernel, batch, heads_q, seqlen_q);
    // SAFETY: the regions are the buffers behind `params`, alive until the
    // launch returns; the kernel is written for concurrent threads.
    unsafe { emu::launch(&config, &regions, || (kernel.run)(&params)) }?;
    Ok(Output { o, lse })
}

/// Attention in f64: O as `[batch, seqlen_q, heads_q, head_dim]` and the
/// natural LSE of the scaled scores as `[batch, heads_q, seqlen_q]` (-inf,
/// with O = 0, for a row that sees no key). Causal masking is aligned to
/// the bottom right: query `i` sees key `j` when `j <= i + seqlen_k - seqlen_q`.
pub struct Reference {
    pub o: Vec<f64>,
    pub lse: Vec<f64>,
}

impl Reference {
    /// The reference ([`crate::reference::attention`]) of the inputs as the
    /// kernel sees them: `q`, `k`, `v` rounded to `dtype`.
    pub fn new(q: &Tensor, k: &Tensor, v: &Tensor, dtype: Dtype, causal: bool, scale: f64) -> Self {
        let ([batch, seqlen_q, heads_q, head_dim], [_, seqlen_k, heads_kv, _]) = (q.shape, k.shape);
        let problem = ReferenceProblem::dense(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, causal, scale);
        let out = reference::attention(&problem, &q.to_f64(dtype), &k.to_f64(dtype), &v.to_f64(dtype));
        Self { o: out.o, lse: out.lse }
    }

    /// How far `out` is from the reference: the relative L2 error of O and
    /// the largest absolute LSE error of rows that see a key. Fails if an
    /// element of O was not written (still NaN), padding of O was written,
    /// or a row that sees no key is not O = 0 and LSE = -inf.
    pub fn compare(&self, out: &Output, dtype: Dtype) -> Result<Errors, String> {
        let [_, sq, hq, d] = out.o.shape;
        let mut logical = vec![false; out.o.data().len()];
        let mut diff = 0.0;
        let mut norm = 0.0;
        let mut worst = (0.0, [0; 4]);
        for (n, i) in out.o.indices().enumerate() {
            logical[i] = true;
            let (actual, expected) = (dtype.to_f64(out.o.data()[i]), self.o[n]);
            let at = [n / (sq * hq * d), n / (hq * d) % sq, n / d % hq, n % d];
            if actual.is_nan() {
                return Err(format!("O{at:?} is NaN: never written, or computed as NaN"));
            }
            diff += (actual - expected).powi(2);
            norm += expected * expected;
            if (actual - expected).abs() > worst.0 {
                worst = ((actual - expected).abs(), at);
            }
        }
        if let Some(i) = logical.iter().enumerate().position(|(i, &l)| !l && out.o.data()[i] != POISON) {
            return Err(format!("O's padding element {i} (between rows or heads) was overwritten"));
        }
        let mut lse_max_abs: f64 = 0.0;
        for (i, (&actual, &expected)) in out.lse.iter().zip(&self.lse).enumerate() {
            let [b, h, s] = [i / (sq * hq), i / sq % hq, i % sq];
            let row = format!("query row {s} of batch {b}, head {h}");
            if expected == f64::NEG_INFINITY {
                let o_zero = (0..d).all(|e| dtype.to_f64(out.o.data()[out.o.index([b, s, h, e])]) == 0.0);
                if actual != f32::NEG_INFINITY || !o_zero {
                    return Err(format!("{row} sees no key, but its LSE is {actual} and O is not all 0"));
                }
            } else if !actual.is_finite() {
                return Err(format!("{row}: LSE is {actual}, the reference {expected}"));
            } else {
                lse_max_abs = lse_max_abs.max((f64::from(actual) - expected).abs());
            }
        }
        Ok(Errors {
            o_relative_l2: (diff / norm.max(f64::MIN_POSITIVE)).sqrt(),
            o_max_abs: worst.0,
            o_max_abs_at: worst.1,
            lse_max_abs,
        })
    }
}

/// Errors of an emulated output against the reference.
#[derive(Clone, Copy, Debug)]
pub struct Errors {
    pub o_relative_l2: f64,
    /// The largest absolute error of an element of O, and its `[b, s, h, d]`.
    pub o_max_abs: f64,
    pub o_max_abs_at: [usize; 4],
    pub lse_max_abs: f64,
}

impl Errors {
    /// Whether both errors are within the budget for `dtype`.
    pub fn within(&self, dtype: Dtype) -> bool {
        self.o_relative_l2 <= dtype.o_tolerance() && self.lse_max_abs <= LSE_TOLERANCE
    }

    /// The errors against their budgets for `dtype`, in words.
    pub fn describe(&self, dtype: Dtype) -> String {
        format!(
            "O relative L2 error {:.2e} (budget {:.1e}; largest element error {:.2e} at [b, s, h, d] = {:?}), \
             LSE max abs error {:.2e} (budget {LSE_TOLERANCE:.1e})",
            self.o_relative_l2,
            dtype.o_tolerance(),
            self.o_max_abs,
            self.o_max_abs_at,
            self.lse_max_abs
        )
    }
}

/// The features of one general-kernel call (`*_general`, `*_decode`), as
/// [`forward_general`] passes them to the kernel. `Default` is none of them.
#[derive(Clone, Debug, Default)]
pub struct Features {
    pub causal: bool,
    /// `(left, right)`; `None` is unbounded.
    pub window: (Option<usize>, Option<usize>),
    pub softcap: Option<f32>,
    /// One slope per (batch, query head), `[batch, heads_q]`.
    pub alibi_slopes: Option<Vec<f32>>,
    /// Packed sequences: `q` and `o` are `[1, total_q, heads, d]`, the LSE
    /// `[heads, total_q]`.
    pub cu_seqlens_q: Option<Vec<i32>>,
    pub cu_seqlens_k: Option<Vec<i32>>,
    /// Keys per batch (a cache's lengths).
    pub seqused_k: Option<Vec<i32>>,
    /// Paged K/V: the block table `[batch, pages_per_sequence]` and the page
    /// size; `k` and `v` are then `[pages, page_size, heads_kv, d]`.
    pub pages: Option<(Vec<i32>, usize, usize)>,
    /// Split-KV parts (0 or 1: no split); the emulator then runs the combine
    /// kernel too.
    pub num_splits: u32,
}

/// Runs the general `kernel` over `batch` batches of up to `seqlen_q`
/// queries with `features`, and, when split, the combine kernel, into a
/// fresh contiguous `o` of `q`'s shape poisoned with NaN. The LSE is
/// `[batch, heads_q, seqlen_q]`, or `[heads_q, total_q]` for packed queries.
#[allow(clippy::too_many_arguments)]
pub fn forward_general(
    kernel: &HostKernel,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    batch: usize,
    seqlen_q: usize,
    scale: f32,
    features: &Features,
) -> Result<Output, emu::Error> {
    assert!(kernel.kernel.variant.is_general(), "{} is not a general kernel", kernel.kernel.name);
    let [_, q_rows, heads_q, head_dim] = q.shape;
    let mut o = Tensor::filled(q.shape, Tensor::contiguous_strides(q.shape), POISON);
    let lse_len = if features.cu_seqlens_q.is_some() { heads_q * q_rows } else { batch * heads_q * seqlen_q };
    let mut lse = vec![f32::NAN; lse_len];
    let arg = |t: &Tensor| TensorArg { ptr: t.data().as_ptr(), strides: [0, 1, 2].map(|i| t.strides[i] as i64) };
    let sizes = ForwardSizes {
        batch: batch as u32,
        seqlen_q: seqlen_q as u32,
        seqlen_k: k.shape[1] as u32,
        heads_q: heads_q as u32,
        heads_per_kv: (heads_q / k.shape[2]) as u32,
    };
    let o_arg = TensorArg { ptr: o.data_mut().as_mut_ptr(), strides: arg(&o).strides };
    let mut params = ForwardParams::new(arg(q), arg(k), arg(v), o_arg, lse.as_mut_ptr(), sizes, scale);
    if features.cu_seqlens_q.is_some() {
        (params.lse_batch_stride, params.lse_head_stride) = (0, q_rows as i64);
    }
    let bound = |w: Option<usize>| w.map_or(-1, |w| w as i32);
    params.window_left = bound(features.window.0);
    params.window_right = if features.causal { 0 } else { bound(features.window.1) };
    if let Some(c) = features.softcap {
        params.set_softcap(c, scale);
    }
    let mut regions = vec![GlobalRegion::read_only("q", q.data()), GlobalRegion::read_only("k", k.data())];
    regions.push(GlobalRegion::read_only("v", v.data()));
    let arrays = [
        ("cu_seqlens_q", &features.cu_seqlens_q, &mut params.cu_seqlens_q),
        ("cu_seqlens_k", &features.cu_seqlens_k, &mut params.cu_seqlens_k),
        ("seqused_k", &features.seqused_k, &mut params.seqused_k),
    ];
    for (name, values, field) in arrays {
        if let Some(values) = values {
            *field = values.as_ptr();
            regions.push(GlobalRegion::read_only(name, values));
        }
    }
    if let Some((table, pages_per_sequence, page_size)) = &features.pages {
        params.block_table = table.as_ptr();
        params.block_table_batch_stride = *pages_per_sequence as i64;
        params.page_size = *page_size as u32;
        regions.push(GlobalRegion::read_only("block_table", table));
    }
    if let Some(slopes) = &features.alibi_slopes {
        params.alibi_slopes = slopes.as_ptr();
        params.alibi_batch_stride = heads_q as i64;
        regions.push(GlobalRegion::read_only("alibi_slopes", slopes));
    }
    let num_splits = features.num_splits.max(1);
    let partial_rows = num_splits as usize * batch * heads_q * seqlen_q;
    let mut o_partial = vec![f32::NAN; if num_splits > 1 { partial_rows * head_dim } else { 0 }];
    let mut lse_partial = vec![f32::NAN; if num_splits > 1 { partial_rows } else { 0 }];
    params.num_splits = num_splits;
    if num_splits > 1 {
        params.o_partial = o_partial.as_mut_ptr();
        params.lse_partial = lse_partial.as_mut_ptr();
        regions.push(GlobalRegion::writable("o_partial", &mut o_partial));
        regions.push(GlobalRegion::writable("lse_partial", &mut lse_partial));
    } else {
        regions.push(GlobalRegion::writable("o", o.data_mut()));
        regions.push(GlobalRegion::writable("lse", &mut lse));
    }
    let c = kernel.kernel.config;
    let grid = [num_splits * seqlen_q.div_ceil(c.block_m as usize) as u32, heads_q as u32, batch as u32];
    let config = LaunchConfig::new(grid, c.threads(), c.smem_bytes());
    // SAFETY: the regions are the buffers behind `params`, alive until the
    // launch returns; the kernel is written for concurrent threads.
    unsafe { emu::launch(&config, &regions, || (kernel.run)(&params)) }?;
    if num_splits > 1 {
        let combine = CombineParams::of(&params, head_dim as u32);
        let mut regions = vec![
            GlobalRegion::read_only("o_partial", &o_partial),
            GlobalRegion::read_only("lse_partial", &lse_partial),
            GlobalRegion::writable("o", o.data_mut()),
            GlobalRegion::writable("lse", &mut lse),
        ];
        if let Some(cu) = &features.cu_seqlens_q {
            regions.push(GlobalRegion::read_only("cu_seqlens_q", cu));
        }
        let blocks = combine_grid((batch * heads_q * seqlen_q) as u64, head_dim as u32) as u32;
        let config = LaunchConfig::new([blocks, 1, 1], COMBINE_THREADS, 0);
        let run = match kernel.kernel.dtype {
            Dtype::F16 => entry::flash_combine_f16,
            Dtype::Bf16 => entry::flash_combine_bf16,
        };
        // SAFETY: as above, for the combine's buffers.
        unsafe { emu::launch(&config, &regions, || run(&combine)) }?;
    }
    Ok(Output { o, lse })
}

/// Appends `k_new`, `v_new` (`[batch, seqlen_new, heads_kv, d]`) into the
/// caches `k_cache`, `v_cache` after `cache_seqlens[b]` keys, through the
/// block table when `pages` is given, with the `kv_cache_append` kernel.
pub fn append_kv(
    k_new: &Tensor,
    v_new: &Tensor,
    k_cache: &mut Tensor,
    v_cache: &mut Tensor,
    cache_seqlens: &[i32],
    pages: Option<&(Vec<i32>, usize, usize)>,
) -> Result<(), emu::Error> {
    let [batch, seqlen_new, heads_kv, head_dim] = k_new.shape;
    let strides = |t: &Tensor| [0, 1, 2].map(|i| t.strides[i] as i64);
    let mut params = AppendParams {
        k_new: k_new.data().as_ptr(),
        v_new: v_new.data().as_ptr(),
        k_new_strides: strides(k_new),
        v_new_strides: strides(v_new),
        k_cache: k_cache.data_mut().as_mut_ptr(),
        v_cache: v_cache.data_mut().as_mut_ptr(),
        k_cache_strides: strides(k_cache),
        v_cache_strides: strides(v_cache),
        cache_seqlens: cache_seqlens.as_ptr(),
        block_table: std::ptr::null(),
        block_table_batch_stride: 0,
        page_size: 0,
        head_dim: head_dim as u32,
    };
    let mut regions = vec![
        GlobalRegion::read_only("k_new", k_new.data()),
        GlobalRegion::read_only("v_new", v_new.data()),
        GlobalRegion::writable("k_cache", k_cache.data_mut()),
        GlobalRegion::writable("v_cache", v_cache.data_mut()),
        GlobalRegion::read_only("cache_seqlens", cache_seqlens),
    ];
    if let Some((table, pages_per_sequence, page_size)) = pages {
        params.block_table = table.as_ptr();
        params.block_table_batch_stride = *pages_per_sequence as i64;
        params.page_size = *page_size as u32;
        regions.push(GlobalRegion::read_only("block_table", table));
    }
    let config = LaunchConfig::new([seqlen_new as u32, heads_kv as u32, batch as u32], APPEND_THREADS, 0);
    // SAFETY: the regions are the buffers behind `params`.
    unsafe { emu::launch(&config, &regions, || entry::kv_cache_append(&params)) }
}

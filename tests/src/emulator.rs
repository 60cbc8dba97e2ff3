//! The kernels' own code on the CPU emulator ([`flash_attn_kernels::emu`]),
//! driven by the host's real pipeline ([`flash_attn::pipeline`]): a call
//! validated with the host addresses of its buffers, planned by [`plan`],
//! and each launch of the plan run on the emulator. Nothing here builds an
//! argument block, a grid or a scratch layout; it all comes from the plan.
//!
//! Also the host side of the emulator tests, the cross-check and the
//! `emulate` example: 16-byte aligned host [`Tensor`]s of f16/bf16 bits,
//! and the f64 [`Reference`] that checks what the kernels wrote.

use std::fmt;
use std::marker::PhantomData;

use flash_attn::cust::memory::DeviceCopy;
use flash_attn::pipeline::{
    plan_backward_for, plan_for, BackwardCall, BackwardPlan, Call, HopperBackwardScratch, HopperScratch, KernelArgs,
    KernelFamily, Launch, OutputAddrs, Outputs, Plan,
};
use flash_attn::reference::{self, ReferenceProblem};
use flash_attn::{AttentionKernel, AttentionParams, DeviceView, Kernel, Layout, Placed};
use flash_attn_kernels::emu::{self, GlobalRegion, LaunchConfig};
use flash_attn_kernels::entry;

pub use flash_attn::Dtype;

use crate::check::{self, Comparison, LSE_TOLERANCE};
use crate::seed;

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

    /// Standard normal values, pseudo-random in `seed` (plus
    /// [`seed::emulator_base`], which `FLASH_ATTN_TEST_SEED` sets), rounded
    /// to `dtype`; padding is NaN, which the kernels must never read.
    pub fn random(shape: [usize; 4], strides: [usize; 4], dtype: Dtype, seed: u64) -> Self {
        let mut t = Self::filled(shape, strides, POISON);
        let mut rng = Normal::new(seed.wrapping_add(seed::emulator_base()));
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

    /// The tensor as validation sees it, at its host address.
    pub fn placed(&self, name: &'static str) -> Placed {
        Placed {
            name,
            layout: Layout::strided(self.shape, self.strides),
            addr: self.data().as_ptr() as u64,
            buffer_len: self.len,
        }
    }
}

/// Conversions of a kernel's element type on the host.
pub trait DtypeValues {
    fn to_f64(self, bits: u16) -> f64;
    fn bits_of(self, x: f64) -> u16;
}

impl DtypeValues for Dtype {
    fn to_f64(self, bits: u16) -> f64 {
        match self {
            Dtype::F16 => flash_attn::f16::from_bits(bits).to_f64(),
            Dtype::Bf16 => flash_attn::bf16::from_bits(bits).to_f64(),
        }
    }

    fn bits_of(self, x: f64) -> u16 {
        match self {
            Dtype::F16 => flash_attn::f16::from_f64(x).to_bits(),
            Dtype::Bf16 => flash_attn::bf16::from_f64(x).to_bits(),
        }
    }
}

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

/// What a buffer is to a call, which decides what each launch may do to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Only ever read: q, k, v, new keys and values, sequence offsets,
    /// cache lengths, block tables, ALiBi slopes.
    Input,
    /// O and the LSE: written by the attention kernel (unsplit) or by the
    /// split-KV merge, read-only to every other launch.
    Output,
    /// A KV cache appended to: written by the append only, read by the
    /// attention.
    Cache,
}

/// The host buffers a call's addresses point to, each named and with its
/// [`Role`]: the global memory the emulator lets the call's launches touch.
/// It borrows every buffer for as long as it lives (mutably those the call
/// may write), so they stay put and untouched until the call has run.
#[derive(Default)]
pub struct Memory<'a> {
    buffers: Vec<(GlobalRegion, Role)>,
    _borrows: PhantomData<&'a mut [u8]>,
}

impl<'a> Memory<'a> {
    pub fn new() -> Self {
        Self::default()
    }

    fn add(&mut self, name: &'static str, base: usize, len: usize, role: Role) -> u64 {
        self.buffers.push((GlobalRegion { name, base, len, writable: false }, role));
        base as u64
    }

    /// An input buffer; returns its address.
    pub fn input<T>(&mut self, name: &'static str, data: &'a [T]) -> u64 {
        self.add(name, data.as_ptr() as usize, std::mem::size_of_val(data), Role::Input)
    }

    /// An output buffer (o or the LSE); returns its address.
    pub fn output<T>(&mut self, name: &'static str, data: &'a mut [T]) -> u64 {
        self.add(name, data.as_mut_ptr() as usize, std::mem::size_of_val(data), Role::Output)
    }

    /// An input tensor, as validation sees it.
    pub fn tensor(&mut self, name: &'static str, t: &'a Tensor) -> Placed {
        self.input(name, t.data());
        t.placed(name)
    }

    /// The output tensor o, as validation sees it.
    pub fn output_tensor(&mut self, name: &'static str, t: &'a mut Tensor) -> Placed {
        let placed = t.placed(name);
        self.output(name, t.data_mut());
        placed
    }

    /// A KV cache tensor that the call appends to (a cache only read is an
    /// [`input`](Self::tensor)), as validation sees it.
    pub fn cache_tensor(&mut self, name: &'static str, t: &'a mut Tensor) -> Placed {
        let placed = t.placed(name);
        let data = t.data_mut();
        self.add(name, data.as_mut_ptr() as usize, std::mem::size_of_val(data), Role::Cache);
        placed
    }

    /// An input in host memory as the device view [`AttentionParams`]
    /// takes (ALiBi slopes); validation only reads its address and length.
    pub fn slice<T: DeviceCopy>(&mut self, name: &'static str, data: &'a [T]) -> DeviceView<'a, T> {
        let addr = self.input(name, data);
        // SAFETY: a view of host memory that nothing dereferences on the
        // host; the emulated kernels read it through the region above.
        unsafe { DeviceView::from_raw(addr, data.len()) }
    }

    /// The regions of one launch: each buffer writable only where its role
    /// says this launch writes it, the scratch only where the launch's
    /// arguments put split-KV partials (the uploaded lengths and tensor
    /// maps are only read), except an sm_90a launch's tile counter.
    fn regions(&self, launch: &Launch, scratch: &Scratch) -> Vec<GlobalRegion> {
        let split_attention = matches!(launch.args, KernelArgs::Forward(a) if a.num_splits > 1);
        let backward = matches!(launch.args, KernelArgs::Backward(_) | KernelArgs::HopperBackward(_));
        let writes = |role| match (launch.kernel, role) {
            (_, Role::Input) => false,
            (Kernel::Append, role) => role == Role::Cache,
            (Kernel::Attention(_), Role::Output) => !split_attention,
            (Kernel::Hopper(_), Role::Output) => true,
            (Kernel::Combine(_), Role::Output) => true,
            (Kernel::BackwardPrepare(_), Role::Output) => false,
            (Kernel::Backward(_) | Kernel::HopperBackward(_) | Kernel::BackwardFinish(_), Role::Output) => true,
            (_, Role::Cache) => false,
        };
        let mut regions: Vec<GlobalRegion> =
            self.buffers.iter().map(|&(region, role)| GlobalRegion { writable: writes(role), ..region }).collect();
        if let KernelArgs::Hopper(h) = launch.args {
            if !h.tile_counter.is_null() {
                // Ahead of the scratch that holds it: the first region
                // holding an access decides.
                regions.push(GlobalRegion {
                    name: "tile counter",
                    base: h.tile_counter as usize,
                    len: 4,
                    writable: true,
                });
            }
        }
        if scratch.bytes > 0 {
            let (base, len) = (scratch.addr() as usize, scratch.bytes);
            regions.push(GlobalRegion { name: "scratch", base, len, writable: split_attention || backward });
        }
        regions
    }
}

/// 256 bytes, the alignment of the scratch memory's regions.
#[derive(Clone, Copy)]
#[repr(C, align(256))]
struct ScratchBlock([u8; 256]);

/// A call's scratch memory in host memory, every byte 0xff to begin with
/// (NaN as f32: a partial never written shows).
struct Scratch {
    blocks: Vec<ScratchBlock>,
    bytes: usize,
}

impl Scratch {
    fn new(bytes: usize) -> Self {
        Self { blocks: vec![ScratchBlock([0xff; 256]); bytes.div_ceil(256)], bytes }
    }

    fn addr(&self) -> u64 {
        self.blocks.as_ptr() as u64
    }

    /// Writes `values` at byte `offset`, as the GPU path uploads them.
    fn write<T: Copy>(&mut self, offset: usize, values: &[T]) {
        // SAFETY: the values' bytes, read as bytes.
        let bytes = unsafe { std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), size_of_val(values)) };
        assert!(offset + bytes.len() <= self.bytes, "upload past the scratch");
        // SAFETY: within the blocks, checked above.
        let scratch = unsafe { std::slice::from_raw_parts_mut(self.blocks.as_mut_ptr().cast::<u8>(), self.bytes) };
        scratch[offset..][..bytes.len()].copy_from_slice(bytes);
    }
}

/// Why an emulated call did not complete.
#[derive(Debug)]
pub enum Failure {
    /// Validation or planning refused the call.
    Host(flash_attn::Error),
    /// A launch faulted on the emulator.
    Emulator { kernel: &'static str, error: emu::Error },
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Host(e) => write!(f, "refused: {e}"),
            Failure::Emulator { kernel, error } => write!(f, "{kernel}: {error}"),
        }
    }
}

impl std::error::Error for Failure {}

impl From<flash_attn::Error> for Failure {
    fn from(e: flash_attn::Error) -> Self {
        Failure::Host(e)
    }
}

/// Runs a validated `call` whose buffers are `memory` on the emulator, as
/// the host runs it on a GPU: plans it (the split heuristic taking `wave`
/// CTAs per wave for every kernel; 0 never splits unless the call asks),
/// reserves the plan's scratch (256-byte aligned) and writes its uploaded
/// lengths there, then runs each launch of the plan in order. Returns the
/// plan, which says which kernel ran and how it was split.
///
/// # Panics
/// If the call's outputs were not given (validate with
/// `OutputBuffers::Given`), or the plan names a kernel the emulator lacks.
pub fn run(call: &Call, memory: &Memory, wave: usize) -> Result<Plan, Failure> {
    run_on(call, memory, wave, KernelFamily::Sm80)
}

/// As [`run`], planned for the kernel `family`: with
/// [`KernelFamily::Sm90a`] the sm_90a kernels run the calls they take, as
/// on an H100, their tensor maps in our encoding (the emulator's; a GPU
/// gets the driver's).
pub fn run_on(call: &Call, memory: &Memory, wave: usize, family: KernelFamily) -> Result<Plan, Failure> {
    let Outputs::Given { o, lse } = call.outputs else {
        panic!("the emulator runs calls into given outputs (OutputBuffers::Given)")
    };
    let plan = plan_for(call, |_: &AttentionKernel| wave, family)?;
    let mut scratch = Scratch::new(plan.scratch_bytes());
    match &plan {
        Plan::Sm80(plan) => scratch.write(plan.scratch.seqused_k, &plan.upload),
        Plan::Sm90(plan) => {
            let tensor_maps = plan.maps.map(|m| m.encode().expect("the planner chooses valid tensor maps"));
            scratch.write(0, &[HopperScratch { tensor_maps, tile_counter: 0 }]);
        }
    }
    let scratch_addr = if plan.scratch_bytes() > 0 { scratch.addr() } else { 0 };
    for launch in plan.launches(OutputAddrs { o: o.addr, lse }, scratch_addr) {
        run_launch(&launch, memory, &scratch)?;
    }
    Ok(plan)
}

/// Runs a validated backward `call` whose buffers are `memory` (the
/// forward's o and lse, and dO, as inputs; dQ, dK and dV as outputs) on the
/// emulator, as the host runs it on a GPU of `sm_count` SMs with the kernel
/// `family`: plans it, reserves its scratch (every byte 0xff, NaN as f32),
/// writes the sm_90a main kernel's tensor maps there (our encoding) where
/// the plan chose it, and runs its three launches in order.
pub fn run_backward_on(
    call: &BackwardCall,
    memory: &Memory,
    sm_count: usize,
    family: KernelFamily,
) -> Result<BackwardPlan, Failure> {
    let plan = plan_backward_for(call, sm_count, family)?;
    let mut scratch = Scratch::new(plan.scratch_bytes());
    if let BackwardPlan::Sm90(plan) = &plan {
        let tensor_maps = plan.maps.map(|m| m.encode().expect("the planner chooses valid tensor maps"));
        scratch.write(plan.tensor_maps, &[HopperBackwardScratch { tensor_maps }]);
    }
    for launch in plan.launches(scratch.addr()) {
        run_launch(&launch, memory, &scratch)?;
    }
    Ok(plan)
}

/// Runs one planned launch on the emulator: its kernel's emulated twin on
/// its argument block, over the call's buffers and `scratch`.
fn run_launch(launch: &Launch, memory: &Memory, scratch: &Scratch) -> Result<(), Failure> {
    let regions = memory.regions(launch, scratch);
    let config = LaunchConfig::new(launch.grid, launch.threads, launch.smem_bytes);
    // SAFETY: the regions are the call's buffers, borrowed by `memory`, and
    // the scratch, alive until the launch returns; the plan pairs each
    // kernel with its argument block; kernels are written for concurrent
    // threads.
    let result = unsafe {
        match (launch.kernel, launch.args) {
            (Kernel::Attention(kernel), KernelArgs::Forward(args)) => {
                let host =
                    entry::kernel(kernel.name).unwrap_or_else(|| panic!("the emulator has no kernel {}", kernel.name));
                assert_eq!(host.kernel, *kernel, "the emulated {} is not the ABI's", kernel.name);
                emu::launch(&config, &regions, || (host.run)(&args))
            }
            (Kernel::Hopper(kernel), KernelArgs::Hopper(args)) => {
                let host = entry::hopper_kernel(kernel.name)
                    .unwrap_or_else(|| panic!("the emulator has no kernel {}", kernel.name));
                assert_eq!(host.kernel, *kernel, "the emulated {} is not the ABI's", kernel.name);
                emu::launch(&config, &regions, || (host.run)(&args))
            }
            (Kernel::HopperBackward(kernel), KernelArgs::HopperBackward(args)) => {
                let host = entry::hopper_backward_kernel(kernel.name)
                    .unwrap_or_else(|| panic!("the emulator has no kernel {}", kernel.name));
                assert_eq!(host.kernel, *kernel, "the emulated {} is not the ABI's", kernel.name);
                emu::launch(&config, &regions, || (host.run)(&args))
            }
            (Kernel::Backward(kernel), KernelArgs::Backward(args)) => {
                let host = entry::backward_kernel(kernel.name)
                    .unwrap_or_else(|| panic!("the emulator has no kernel {}", kernel.name));
                assert_eq!(host.kernel, *kernel, "the emulated {} is not the ABI's", kernel.name);
                emu::launch(&config, &regions, || (host.run)(&args))
            }
            (Kernel::Combine(Dtype::F16), KernelArgs::Combine(args)) => {
                emu::launch(&config, &regions, || entry::flash_combine_f16(&args))
            }
            (Kernel::Combine(Dtype::Bf16), KernelArgs::Combine(args)) => {
                emu::launch(&config, &regions, || entry::flash_combine_bf16(&args))
            }
            (Kernel::Append, KernelArgs::Append(args)) => {
                emu::launch(&config, &regions, || entry::kv_cache_append(&args))
            }
            (Kernel::BackwardPrepare(Dtype::F16), KernelArgs::Backward(args)) => {
                emu::launch(&config, &regions, || entry::flash_bwd_prepare_f16(&args))
            }
            (Kernel::BackwardPrepare(Dtype::Bf16), KernelArgs::Backward(args)) => {
                emu::launch(&config, &regions, || entry::flash_bwd_prepare_bf16(&args))
            }
            (Kernel::BackwardFinish(Dtype::F16), KernelArgs::Backward(args)) => {
                emu::launch(&config, &regions, || entry::flash_bwd_finish_dq_f16(&args))
            }
            (Kernel::BackwardFinish(Dtype::Bf16), KernelArgs::Backward(args)) => {
                emu::launch(&config, &regions, || entry::flash_bwd_finish_dq_bf16(&args))
            }
            (kernel, args) => panic!("the plan gave {} the arguments {args:?}", kernel.name()),
        }
    };
    result.map_err(|error| Failure::Emulator { kernel: launch.kernel.name(), error })
}

/// O (of `q`'s shape) and the LSE (`[batch, heads_q, seqlen_q]`) of one
/// emulated dense call.
pub struct Output {
    pub o: Tensor,
    pub lse: Vec<f32>,
}

/// A dense call, `q` over `k`, `v` with `params` (no ALiBi: its slopes are
/// a buffer, see [`Memory::slice`] and [`run`]), through validation, the
/// plan (with `wave`) and the emulator, into a fresh `o` with `o_strides`
/// whose every element starts as NaN ([`POISON`]) and a NaN LSE, so that
/// anything the kernels miss shows. Returns them and the plan.
pub fn forward(
    dtype: Dtype,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    o_strides: [usize; 4],
    params: &AttentionParams,
    wave: usize,
) -> Result<(Output, Plan), Failure> {
    forward_on(dtype, q, k, v, o_strides, params, wave, KernelFamily::Sm80)
}

/// As [`forward`], planned for the kernel `family` ([`run_on`]).
#[allow(clippy::too_many_arguments)]
pub fn forward_on(
    dtype: Dtype,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    o_strides: [usize; 4],
    params: &AttentionParams,
    wave: usize,
    family: KernelFamily,
) -> Result<(Output, Plan), Failure> {
    assert!(params.alibi_slopes.is_none(), "ALiBi slopes need a buffer of Memory: use emulator::run");
    let [batch, seqlen_q, heads_q, _] = q.shape;
    let mut o = Tensor::filled(q.shape, o_strides, POISON);
    let mut lse = vec![f32::NAN; batch * heads_q * seqlen_q];
    let plan = {
        let mut memory = Memory::new();
        let (q, k, v) = (memory.tensor("q", q), memory.tensor("k", k), memory.tensor("v", v));
        let o = memory.output_tensor("o", &mut o);
        let lse_len = lse.len();
        let lse_addr = memory.output("lse", &mut lse);
        let outputs = flash_attn::pipeline::OutputBuffers::Given { o: &o, lse_addr, lse_len };
        let call = flash_attn::pipeline::validate(dtype, &q, &k, &v, outputs, params)?;
        run_on(&call, &memory, wave, family)?
    };
    Ok((Output { o, lse }, plan))
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
    /// The reference ([`flash_attn::reference::attention`]) of a dense
    /// call with `params` (its scale, mask and softcap; no ALiBi), on the
    /// inputs as the kernels see them: `q`, `k`, `v` rounded to `dtype`.
    pub fn new(q: &Tensor, k: &Tensor, v: &Tensor, dtype: Dtype, params: &AttentionParams) -> Self {
        assert!(params.alibi_slopes.is_none(), "the dense reference takes no ALiBi slopes");
        let ([batch, seqlen_q, heads_q, head_dim], [_, seqlen_k, heads_kv, _]) = (q.shape, k.shape);
        // The scale as the kernels take it: f32, 1/sqrt(head_dim) by default.
        let scale = params.softmax_scale.unwrap_or(1.0 / (head_dim as f32).sqrt());
        let mut problem = ReferenceProblem::dense(
            batch,
            seqlen_q,
            seqlen_k,
            heads_q,
            heads_kv,
            head_dim,
            params.causal,
            f64::from(scale),
        );
        problem.window = params.window;
        problem.softcap = params.softcap.map(f64::from);
        let out = reference::attention(&problem, &q.to_f64(dtype), &k.to_f64(dtype), &v.to_f64(dtype));
        Self { o: out.o, lse: out.lse }
    }

    /// How far `out` is from the reference: O's errors
    /// ([`check::compare`]: the whole tensor's and each row's) and the
    /// largest absolute LSE error of rows that see a key. Fails if an
    /// element of O was not written (still NaN), padding of O was written,
    /// or a row that sees no key is not O = 0 and LSE = -inf.
    pub fn compare(&self, out: &Output, dtype: Dtype) -> Result<Errors, String> {
        let [_, sq, hq, d] = out.o.shape;
        let mut logical = vec![false; out.o.data().len()];
        let mut actual = Vec::with_capacity(self.o.len());
        let mut worst = (0.0, [0; 4]);
        for (n, i) in out.o.indices().enumerate() {
            logical[i] = true;
            let (value, expected) = (dtype.to_f64(out.o.data()[i]), self.o[n]);
            let at = [n / (sq * hq * d), n / (hq * d) % sq, n / d % hq, n % d];
            if value.is_nan() {
                return Err(format!("O{at:?} is NaN: never written, or computed as NaN"));
            }
            if (value - expected).abs() > worst.0 {
                worst = ((value - expected).abs(), at);
            }
            actual.push(value);
        }
        let o = check::compare(&actual, &self.o, d)?;
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
        Ok(Errors { o, o_max_abs: worst.0, o_max_abs_at: worst.1, lse_max_abs })
    }
}

/// Errors of an emulated output against the reference.
#[derive(Clone, Copy, Debug)]
pub struct Errors {
    /// O's relative L2 error and worst row ([`check::compare`]).
    pub o: Comparison,
    /// The largest absolute error of an element of O, and its `[b, s, h, d]`.
    pub o_max_abs: f64,
    pub o_max_abs_at: [usize; 4],
    pub lse_max_abs: f64,
}

impl Errors {
    /// Whether O's and the LSE's errors are within the budget for `dtype`.
    pub fn within(&self, dtype: Dtype) -> bool {
        self.o.within(dtype) && self.lse_max_abs <= LSE_TOLERANCE
    }

    /// The errors against their budgets for `dtype`, in words.
    pub fn describe(&self, dtype: Dtype) -> String {
        format!(
            "O {} (largest element error {:.2e} at [b, s, h, d] = {:?}), LSE max abs error {:.2e} (budget \
             {LSE_TOLERANCE:.1e})",
            self.o.describe(dtype),
            self.o_max_abs,
            self.o_max_abs_at,
            self.lse_max_abs
        )
    }
}

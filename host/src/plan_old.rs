//! The plan before host/src/plan/ (one struct, the sm_90a kernel an
//! override of the sm_80 plan), kept only to compare the two over the
//! bounds test's random calls (`bounds_tests.rs`).
#![allow(dead_code)]

//! What runs for a validated [`Call`], as a pure function of it: the
//! kernel (dense, general or decode), the split-KV factor, the GQA decode
//! layout, the grid, the scratch memory, and the kernels' argument blocks.
//! The one place where a call becomes the ABI's [`ForwardParams`] (and a
//! backward call its [`BackwardParams`]); the launch binds the output and
//! scratch addresses and runs the result.

use flash_attn_abi::backward::{
    backward_kernel, row_grid as backward_row_grid, BackwardKernel, BackwardParams, BACKWARD_BLOCK_N,
    ROW_KERNEL_THREADS,
};
use flash_attn_abi::config::MAX_ROW_STRIDE;
use std::mem::offset_of;

use flash_attn_abi::hopper::{
    hopper_block_m, hopper_causal_section, hopper_kernel, hopper_tiles, HopperKernel, HopperParams, HopperScratch,
    SLAB_COLUMNS,
};
use flash_attn_abi::hopper_backward::{
    hopper_backward_kernel, HopperBackwardKernel, HopperBackwardParams, HopperBackwardScratch,
};
use flash_attn_abi::kernels::{
    attention_kernel, combine_grid, AttentionKernel, Dtype, Variant, APPEND_THREADS, COMBINE_THREADS,
};
use flash_attn_abi::params::{CombineParams, ForwardParams, COMBINE_WARPS};
use flash_attn_abi::sm90::{L2Promotion, OobFill, TensorDataType, TensorMap, TensorMapParams, TmaSwizzle};

use crate::call::{Append, BackwardCall, CacheLengths, Call, Mask, Outputs, Sequences, TensorAt};
use crate::error::{Error, Result};
use crate::limits::MAX_SPLITS;
use crate::plan::{Kernel, KernelArgs, Launch, OutputAddrs};

/// The fewest key blocks the heuristic leaves to each split, so that the
/// merge and the per-split prologue stay small beside the work.
pub const MIN_KEY_BLOCKS_PER_SPLIT: usize = 4;

/// A grid already this fraction of a wave full is not split (in fifths).
const FULL_WAVE_FIFTHS: usize = 4;

/// Largest grid x dimension of a launch.
const MAX_GRID_X: usize = i32::MAX as usize;

/// Most blocks of the split-KV merge: it numbers its warps in u32.
const MAX_COMBINE_BLOCKS: usize = (1 << 32) / COMBINE_WARPS as usize;

/// Alignment of each region of the scratch memory, in bytes.
const SCRATCH_ALIGN: usize = 256;

/// How many CTAs to split the keys of each query block among, for a grid
/// of `ctas` CTAs (query blocks * heads * batch) over `key_blocks` key
/// blocks, on a GPU that runs `wave` such CTAs at once (SMs * CTAs per SM).
///
/// No split when the grid already fills 80% of a wave. Otherwise the
/// number of splits that brings the grid closest to whole waves, among the
/// two around one full wave, keeping at least [`MIN_KEY_BLOCKS_PER_SPLIT`]
/// key blocks per split and at most [`MAX_SPLITS`] splits; then the fewest
/// splits with the same key blocks per split, so no split is left empty.
pub fn num_splits_heuristic(ctas: usize, key_blocks: usize, wave: usize) -> usize {
    if ctas == 0 || wave == 0 || ctas.saturating_mul(5) >= wave.saturating_mul(FULL_WAVE_FIFTHS) {
        return 1;
    }
    let max_splits = (key_blocks / MIN_KEY_BLOCKS_PER_SPLIT).clamp(1, MAX_SPLITS);
    // The fraction of the last wave's slots that hold a CTA, for `splits` splits.
    let fill = |splits: usize| {
        let total = ctas.saturating_mul(splits);
        total as f64 / (total.div_ceil(wave).saturating_mul(wave)) as f64
    };
    let below = (wave / ctas).clamp(1, max_splits);
    let above = (below + 1).min(max_splits);
    let splits = if fill(above) > fill(below) { above } else { below };
    let blocks_per_split = key_blocks.div_ceil(splits).max(1);
    key_blocks.div_ceil(blocks_per_split).max(1)
}

/// The kernels' argument block of `call`, its features set from the call's
/// types (-1, 0 and null for each one it does not use), its outputs and
/// scratch not yet bound.
fn forward_params(call: &Call) -> ForwardParams {
    let p = &call.problem;
    let [qb, qs, qh] = call.q.strides;
    let [kb, ks, kh] = call.k.strides;
    let [vb, vs, vh] = call.v.strides;
    let [ob, os, oh] = call.o_strides;
    let mut args = ForwardParams {
        q: call.q.addr as *const u16,
        k: call.k.addr as *const u16,
        v: call.v.addr as *const u16,
        o: core::ptr::null_mut(),
        lse: core::ptr::null_mut(),
        lse_batch_stride: call.lse.batch_stride,
        lse_head_stride: call.lse.head_stride,
        q_batch_stride: qb,
        q_row_stride: qs,
        q_head_stride: qh,
        k_batch_stride: kb,
        k_row_stride: ks,
        k_head_stride: kh,
        v_batch_stride: vb,
        v_row_stride: vs,
        v_head_stride: vh,
        o_batch_stride: ob,
        o_row_stride: os,
        o_head_stride: oh,
        seqlen_q: p.seqlen_q as u32,
        seqlen_k: p.seqlen_k as u32,
        heads_q: p.heads_q as u32,
        heads_per_kv: (p.heads_q / p.heads_kv) as u32,
        scale_log2: call.scale * core::f32::consts::LOG2_E,
        cu_seqlens_q: core::ptr::null(),
        cu_seqlens_k: core::ptr::null(),
        seqused_k: core::ptr::null(),
        block_table: core::ptr::null(),
        block_table_batch_stride: 0,
        page_size: 0,
        window_left: -1,
        window_right: -1,
        softcap_scale: 0.0,
        softcap_log2: 0.0,
        alibi_slopes: core::ptr::null(),
        alibi_batch_stride: 0,
        num_splits: 1,
        batch: p.batch as u32,
        o_partial: core::ptr::null_mut(),
        lse_partial: core::ptr::null_mut(),
    };
    let side = |bound: Option<u32>| bound.map_or(-1, |n| n as i32);
    (args.window_left, args.window_right) = match call.mask {
        Mask::None => (-1, -1),
        Mask::Causal => (-1, 0),
        Mask::Window { left, right } => (side(left), side(right)),
    };
    if let Some(softcap) = call.softcap {
        args.set_softcap(softcap, call.scale);
    }
    if let Some(alibi) = call.alibi {
        args.alibi_slopes = alibi.addr as *const f32;
        args.alibi_batch_stride = alibi.batch_stride;
    }
    match &call.sequences {
        Sequences::Dense => {}
        Sequences::Packed { cu_seqlens_q, cu_seqlens_k, .. } => {
            args.cu_seqlens_q = *cu_seqlens_q as *const i32;
            args.cu_seqlens_k = *cu_seqlens_k as *const i32;
        }
        Sequences::Cache { lengths, pages } => {
            if let CacheLengths::Device(addr) = lengths {
                args.seqused_k = *addr as *const i32;
            }
            if let Some(pages) = pages {
                args.block_table = pages.table as *const i32;
                args.block_table_batch_stride = pages.pages_per_seq as i64;
                args.page_size = pages.page_size;
            }
        }
    }
    args
}

/// Whether the GQA decode layout (FlashAttention-2's
/// `seqlenq_ngroups_swapped`) applies: a single query row of `g = heads_q /
/// heads_kv` grouped heads is viewed as `g` rows of one head, so that each
/// key/value head is read by one CTA instead of `g`. It is exact for one
/// query row without window or ALiBi, dense or over a cache, whose head
/// strides (the new row strides) are within the kernels' row strides; the
/// one row sees every key, so a causal mask is void and dropped.
fn gqa_decode_applies(call: &Call) -> bool {
    let p = &call.problem;
    p.seqlen_q == 1
        && p.heads_q > p.heads_kv
        && matches!(call.mask, Mask::None | Mask::Causal)
        && call.alibi.is_none()
        && !matches!(call.sequences, Sequences::Packed { .. })
        && call.lse.head_stride == 1
        && call.q.strides[2] <= MAX_ROW_STRIDE as i64
        && call.o_strides[2] <= MAX_ROW_STRIDE as i64
}

/// Views `args` in the GQA decode layout ([`gqa_decode_applies`]).
fn swap_gqa_decode(args: &mut ForwardParams) {
    let g = args.heads_per_kv as i64;
    args.seqlen_q = args.heads_per_kv;
    args.heads_q /= args.heads_per_kv;
    args.heads_per_kv = 1;
    args.q_row_stride = args.q_head_stride;
    args.q_head_stride *= g;
    args.o_row_stride = args.o_head_stride;
    args.o_head_stride *= g;
    // Row r of new head h is query head h * g + r: LSE at b * heads_q + h * g + r.
    args.lse_head_stride = g;
    args.window_right = -1;
}

/// Byte offsets of the regions of a call's scratch memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScratchLayout {
    /// `seqused_k`, i32 per batch (KV cache appends only).
    pub seqused_k: usize,
    /// `lse_partial`, f32 `[num_splits, batch, heads_q, seqlen_q]`.
    pub lse_partial: usize,
    /// `o_partial`, f32 `[num_splits, batch, heads_q, seqlen_q, head_dim]`.
    pub o_partial: usize,
    /// The sm_90a kernel's [`HopperScratch`]: the tensor maps of q, k and
    /// v and the tile counter (none on the portable kernels).
    pub hopper: usize,
    /// The whole scratch; 0 when the call needs none.
    pub bytes: usize,
}

impl ScratchLayout {
    /// Room for `seqused_len` i32, with more than one split the partials,
    /// and for an sm_90a kernel (`hopper`) its [`HopperScratch`].
    fn new(args: &ForwardParams, head_dim: usize, seqused_len: usize, hopper: bool) -> Result<Self> {
        let overflow =
            || Error::TooLarge { what: "split-KV scratch bytes", value: usize::MAX, max: isize::MAX as usize };
        let round = |n: usize| n.checked_next_multiple_of(SCRATCH_ALIGN).ok_or_else(overflow);
        let seqused_bytes = round(seqused_len * 4)?;
        let (mut lse_bytes, mut o_bytes) = (0, 0);
        if args.num_splits > 1 {
            let rows = [args.num_splits as usize, args.batch as usize, args.heads_q as usize, args.seqlen_q as usize]
                .into_iter()
                .try_fold(1usize, |n, d| n.checked_mul(d))
                .ok_or_else(overflow)?;
            // The kernels index the partial rows with 32-bit integers.
            if rows > u32::MAX as usize {
                return Err(Error::TooLarge { what: "split-KV partial rows", value: rows, max: u32::MAX as usize });
            }
            lse_bytes = round(rows.checked_mul(4).ok_or_else(overflow)?)?;
            o_bytes = round(rows.checked_mul(head_dim * 4).ok_or_else(overflow)?)?;
        }
        let lse_partial = seqused_bytes;
        let o_partial = lse_partial + lse_bytes;
        let hopper_at = o_partial.checked_add(o_bytes).ok_or_else(overflow)?;
        let hopper_bytes = if hopper { round(size_of::<HopperScratch>())? } else { 0 };
        let bytes = hopper_at.checked_add(hopper_bytes).ok_or_else(overflow)?;
        if bytes > isize::MAX as usize {
            return Err(overflow());
        }
        Ok(ScratchLayout { seqused_k: 0, lse_partial, o_partial, hopper: hopper_at, bytes })
    }
}

/// A planned call: the kernels to launch, in order, with their argument
/// blocks, less the output and scratch addresses that [`Plan::launches`]
/// binds.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The attention kernel.
    pub kernel: &'static AttentionKernel,
    /// Its grid: `(num_splits * query blocks, heads, batch)`.
    pub grid: [u32; 3],
    /// Its arguments, GQA decode layout and split applied.
    pub args: ForwardParams,
    /// The append that runs before it, if any.
    pub append: Option<Append>,
    /// Grid x of the split-KV merge that runs after it (0: no merge).
    pub combine_blocks: u32,
    /// The scratch memory the call needs.
    pub scratch: ScratchLayout,
    /// Lengths to upload to the scratch's `seqused_k` before the kernels.
    pub upload: Vec<i32>,
    /// The outputs the call was validated with, if the caller gave them.
    pub outputs: Outputs,
    /// The sm_90a kernel that runs instead of `kernel`, where the call is
    /// one it takes and the plan was made for [`KernelFamily::Sm90a`].
    pub hopper: Option<HopperLaunch>,
}

/// The kernel families a plan may choose from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelFamily {
    /// The sm_80 kernels only (every GPU of compute capability 8.0 and up).
    Sm80,
    /// The sm_90a kernels for the calls they take, else the sm_80 ones
    /// (compute capability 9.0), on a GPU of `sm_count` SMs: the persistent
    /// sm_90a blocks run one per SM.
    Sm90a { sm_count: usize },
}

/// An sm_90a launch: the kernel and the tensor maps of q, k and v, which
/// the launch encodes into the scratch memory.
#[derive(Clone, Copy, Debug)]
pub struct HopperLaunch {
    pub kernel: &'static HopperKernel,
    pub grid: [u32; 3],
    pub maps: [TensorMapParams; 3],
    /// The call's query blocks and tiles ([`hopper_tiles`]).
    pub query_blocks: u32,
    pub tiles: u32,
    /// The heads whose causal tiles interleave ([`hopper_causal_section`]).
    pub section_heads: u32,
    /// Whether the blocks take their tiles after the first off the call's
    /// tile counter ([`HopperParams::tile_counter`]) rather than every
    /// grid-th.
    pub tile_counter: bool,
}

impl Plan {
    /// The launches of the call, in order (the append, the attention, the
    /// split-KV merge), with the outputs at `outputs` (the validated ones
    /// when the caller gave them) and the scratch memory at `scratch` (at
    /// least [`ScratchLayout::bytes`], 256-byte aligned, the uploaded
    /// lengths already written there).
    pub fn launches(&self, outputs: OutputAddrs, scratch: u64) -> Vec<Launch> {
        let mut args = self.args;
        args.o = outputs.o as *mut u16;
        args.lse = outputs.lse as *mut f32;
        if !self.upload.is_empty() {
            args.seqused_k = (scratch + self.scratch.seqused_k as u64) as *const i32;
        }
        if args.num_splits > 1 {
            args.lse_partial = (scratch + self.scratch.lse_partial as u64) as *mut f32;
            args.o_partial = (scratch + self.scratch.o_partial as u64) as *mut f32;
        }
        let mut launches = Vec::with_capacity(3);
        if let Some(append) = &self.append {
            launches.push(Launch {
                kernel: Kernel::Append,
                grid: append.grid,
                threads: APPEND_THREADS,
                smem_bytes: 0,
                args: KernelArgs::Append(append.params),
            });
        }
        if let Some(hopper) = &self.hopper {
            let config = hopper.kernel.config;
            let at = scratch + self.scratch.hopper as u64;
            let tensor_maps = (at + offset_of!(HopperScratch, tensor_maps) as u64) as *const TensorMap;
            let counter = at + offset_of!(HopperScratch, tile_counter) as u64;
            launches.push(Launch {
                kernel: Kernel::Hopper(hopper.kernel),
                grid: hopper.grid,
                threads: config.threads(),
                smem_bytes: config.smem_bytes(),
                args: KernelArgs::Hopper(HopperParams {
                    forward: args,
                    tensor_maps,
                    query_blocks: hopper.query_blocks,
                    tiles: hopper.tiles,
                    blocks: hopper.grid[0],
                    section_heads: hopper.section_heads,
                    tile_counter: if hopper.tile_counter { counter as *mut u32 } else { std::ptr::null_mut() },
                }),
            });
            return launches;
        }
        let config = self.kernel.config;
        launches.push(Launch {
            kernel: Kernel::Attention(self.kernel),
            grid: self.grid,
            threads: config.threads(),
            smem_bytes: config.smem_bytes(),
            args: KernelArgs::Forward(args),
        });
        if args.num_splits > 1 {
            launches.push(Launch {
                kernel: Kernel::Combine(self.kernel.dtype),
                grid: [self.combine_blocks, 1, 1],
                threads: COMBINE_THREADS,
                smem_bytes: 0,
                args: KernelArgs::Combine(CombineParams::of(&args, self.kernel.head_dim)),
            });
        }
        launches
    }
}

/// The most launches of the main backward kernel in the deterministic mode
/// (one per `dq_splits` key blocks, `dq_splits` about twice the SMs over
/// the key/value heads and batch): a sequence of keys longer than that
/// many of them is refused, not launched thousands of times.
pub const MAX_DETERMINISTIC_LAUNCHES: usize = 1024;

/// A planned backward call: its launches on one argument block, less the
/// scratch address that [`BackwardPlan::launches`] binds.
#[derive(Clone, Copy, Debug)]
pub struct BackwardPlan {
    /// The main kernel.
    pub kernel: &'static BackwardKernel,
    /// The arguments, outputs bound, scratch not.
    pub args: BackwardParams,
    /// Grids of the row kernels and of each launch of the main kernel, and
    /// how many launches of it: one, or in the deterministic mode enough
    /// of `dq_splits` key blocks each to take them all.
    pub row_grid: [u32; 3],
    pub key_grid: [u32; 3],
    pub key_launches: u32,
    /// Byte offsets in the scratch of delta and the dQ accumulator, and
    /// the whole scratch.
    pub delta: usize,
    pub d_q_accum: usize,
    pub scratch_bytes: usize,
    /// The sm_90a main kernel instead of [`Self::kernel`] (prepare and
    /// finish stay the portable ones), with the tensor maps the launch
    /// encodes into the scratch at [`Self::tensor_maps`].
    pub hopper: Option<HopperBackwardLaunch>,
    pub tensor_maps: usize,
}

/// The sm_90a main backward kernel of a call, and the tensor maps of its
/// q, k, v and dO.
#[derive(Clone, Copy, Debug)]
pub struct HopperBackwardLaunch {
    pub kernel: &'static HopperBackwardKernel,
    pub grid: [u32; 3],
    pub maps: [TensorMapParams; 4],
}

impl BackwardPlan {
    /// The launches in order (prepare, the main kernel, finish dQ) with the
    /// scratch at `scratch` (at least [`Self::scratch_bytes`], 256-byte
    /// aligned).
    pub fn launches(&self, scratch: u64) -> Vec<Launch> {
        let mut args = self.args;
        args.delta = (scratch + self.delta as u64) as *mut f32;
        args.d_q_accum = (scratch + self.d_q_accum as u64) as *mut f32;
        let dtype = self.kernel.dtype;
        let config = self.kernel.config;
        let rows = |kernel| Launch {
            kernel,
            grid: self.row_grid,
            threads: ROW_KERNEL_THREADS,
            smem_bytes: 0,
            args: KernelArgs::Backward(args),
        };
        let main = (0..self.key_launches).map(|i| match &self.hopper {
            Some(hopper) => Launch {
                kernel: Kernel::HopperBackward(hopper.kernel),
                grid: hopper.grid,
                threads: hopper.kernel.config.threads(),
                smem_bytes: hopper.kernel.config.smem_bytes(),
                args: KernelArgs::HopperBackward(HopperBackwardParams {
                    backward: args,
                    tensor_maps: (scratch + self.tensor_maps as u64) as *const TensorMap,
                }),
            },
            None => Launch {
                kernel: Kernel::Backward(self.kernel),
                grid: self.key_grid,
                threads: config.threads(),
                smem_bytes: config.smem_bytes(),
                args: KernelArgs::Backward(BackwardParams { first_key_block: i * self.key_grid[0], ..args }),
            },
        });
        std::iter::once(rows(Kernel::BackwardPrepare(dtype)))
            .chain(main)
            .chain([rows(Kernel::BackwardFinish(dtype))])
            .collect()
    }
}

/// Plans the backward `call` on the sm_80 kernels of a GPU of `sm_count`
/// SMs ([`plan_backward_for`] with [`KernelFamily::Sm80`]).
pub fn plan_backward(call: &BackwardCall, sm_count: usize) -> Result<BackwardPlan> {
    plan_backward_for(call, sm_count, KernelFamily::Sm80)
}

/// Plans the backward `call` on a GPU of `sm_count` SMs: the main kernel of
/// its head dim and element type, the grids, and the scratch (delta and the
/// dQ accumulator, f32, one and `head_dim` per lse value). In the
/// deterministic mode, one accumulator per split: enough splits that a
/// launch's grid covers each SM twice, at most one per key block, and as
/// many launches of the main kernel as that takes. With
/// [`KernelFamily::Sm90a`], the sm_90a main kernel where it takes the call
/// ([`hopper_backward_launch`]).
pub fn plan_backward_for(call: &BackwardCall, sm_count: usize, family: KernelFamily) -> Result<BackwardPlan> {
    let f = &call.forward;
    let p = &f.problem;
    let kernel = u32::try_from(p.head_dim)
        .ok()
        .and_then(|d| backward_kernel(d, f.dtype))
        .ok_or(Error::UnsupportedHeadDim(p.head_dim))?;
    let Outputs::Given { o, lse } = f.outputs else {
        return Err(Error::ShapeMismatch("the backward reads the forward's o and lse: give them".into()));
    };
    let key_blocks = p.seqlen_k.div_ceil(BACKWARD_BLOCK_N as usize);
    let dq_splits = if call.deterministic {
        sm_count.saturating_mul(2).div_ceil(p.heads_kv * p.batch).clamp(1, key_blocks)
    } else {
        0
    };
    // The main kernel's launches: one, or one per `dq_splits` key blocks.
    let key_launches = if dq_splits > 0 { key_blocks.div_ceil(dq_splits) } else { 1 };
    if key_launches > MAX_DETERMINISTIC_LAUNCHES {
        let (value, max) = (key_launches, MAX_DETERMINISTIC_LAUNCHES);
        return Err(Error::TooLarge { what: "deterministic backward launches", value, max });
    }
    let mut forward = forward_params(f);
    forward.o = o.addr as *mut u16;
    forward.lse = lse as *mut f32;
    let [d_ob, d_os, d_oh] = call.d_o.strides;
    let [d_qb, d_qs, d_qh] = call.d_q.strides;
    let [d_kb, d_ks, d_kh] = call.d_k.strides;
    let [d_vb, d_vs, d_vh] = call.d_v.strides;
    let args = BackwardParams {
        forward,
        d_o: call.d_o.addr as *const u16,
        d_o_batch_stride: d_ob,
        d_o_row_stride: d_os,
        d_o_head_stride: d_oh,
        d_q: call.d_q.addr as *mut u16,
        d_q_batch_stride: d_qb,
        d_q_row_stride: d_qs,
        d_q_head_stride: d_qh,
        d_k: call.d_k.addr as *mut u16,
        d_k_batch_stride: d_kb,
        d_k_row_stride: d_ks,
        d_k_head_stride: d_kh,
        d_v: call.d_v.addr as *mut u16,
        d_v_batch_stride: d_vb,
        d_v_row_stride: d_vs,
        d_v_head_stride: d_vh,
        delta: core::ptr::null_mut(),
        d_q_accum: core::ptr::null_mut(),
        d_q_accum_split_stride: (call.lse_rows * p.head_dim) as i64,
        dq_splits: dq_splits as u32,
        first_key_block: 0,
        softmax_scale: f.scale,
        head_dim: p.head_dim as u32,
    };
    let overflow = || Error::TooLarge { what: "backward scratch bytes", value: usize::MAX, max: isize::MAX as usize };
    let round = |n: usize| n.checked_next_multiple_of(SCRATCH_ALIGN).ok_or_else(overflow);
    let delta_bytes = round(call.lse_rows.checked_mul(4).ok_or_else(overflow)?)?;
    let accum = [p.head_dim, 4, dq_splits.max(1)].into_iter().try_fold(call.lse_rows, |n, m| n.checked_mul(m));
    let accum_bytes = round(accum.ok_or_else(overflow)?)?;
    let hopper = match family {
        KernelFamily::Sm90a { .. } => hopper_backward_launch(call),
        KernelFamily::Sm80 => None,
    };
    // The tensor maps (128 bytes each, 64-byte aligned) after the accumulator.
    let maps_bytes = if hopper.is_some() { std::mem::size_of::<HopperBackwardScratch>() } else { 0 };
    let tensor_maps = delta_bytes.checked_add(accum_bytes).ok_or_else(overflow)?;
    let scratch_bytes =
        tensor_maps.checked_add(maps_bytes).filter(|&n| n <= isize::MAX as usize).ok_or_else(overflow)?;
    let (batch, heads_q, heads_kv) = (p.batch as u32, p.heads_q as u32, p.heads_kv as u32);
    Ok(BackwardPlan {
        kernel,
        args,
        row_grid: backward_row_grid(p.seqlen_q as u32, heads_q, batch),
        key_grid: kernel.config.grid(p.seqlen_k as u32, heads_kv, batch, dq_splits as u32),
        key_launches: key_launches as u32,
        delta: 0,
        d_q_accum: delta_bytes,
        scratch_bytes,
        hopper,
        tensor_maps,
    })
}

/// The sm_90a main backward kernel for `call`, with the tensor maps of its
/// q, k, v and dO, if the call is one those kernels take: dense sequences,
/// not deterministic, unmasked or causal without softcap or ALiBi, a head
/// dim and element type of the table, and the tensors as TMA reads them.
fn hopper_backward_launch(call: &BackwardCall) -> Option<HopperBackwardLaunch> {
    let f = &call.forward;
    let p = &f.problem;
    let variant = match f.mask {
        Mask::None => Variant::Full,
        Mask::Causal => Variant::Causal,
        Mask::Window { .. } => return None,
    };
    let plain = f.softcap.is_none() && f.alibi.is_none() && !call.deterministic;
    if !(plain && f.sequences == Sequences::Dense && f.append.is_none() && p.seqlen_q > 0 && p.seqlen_k > 0) {
        return None;
    }
    let kernel = hopper_backward_kernel(u32::try_from(p.head_dim).ok()?, f.dtype, variant)?;
    let columns = kernel.config.slab_columns();
    let (rows, keys) = ((columns, kernel.config.block_m()), (columns, kernel.config.block_n()));
    let maps = [
        tma_map(f, &f.q, [p.batch, p.seqlen_q, p.heads_q], rows),
        tma_map(f, &f.k, [p.batch, p.seqlen_k, p.heads_kv], keys),
        tma_map(f, &f.v, [p.batch, p.seqlen_k, p.heads_kv], keys),
        tma_map(f, &call.d_o, [p.batch, p.seqlen_q, p.heads_q], rows),
    ];
    if maps.iter().any(|m| m.validate().is_err()) {
        return None;
    }
    let grid = kernel.config.grid(u32::try_from(p.seqlen_k).ok()?, p.heads_kv as u32, p.batch as u32);
    if grid[0] > i32::MAX as u32 {
        return None;
    }
    Some(HopperBackwardLaunch { kernel, grid, maps })
}

/// The tensor map TMA reads `t` through: `[batch, seqlen, heads,
/// head_dim]` as (head_dim, seqlen, heads, batch), innermost first, in boxes
/// of `columns` (64: the 128-byte swizzle, 32: the 64-byte one) and `rows`
/// rows, zero-filled past each dimension.
fn tma_map(
    call: &Call,
    t: &TensorAt,
    [batch, seqlen, heads]: [usize; 3],
    (columns, rows): (u32, u32),
) -> TensorMapParams {
    let p = &call.problem;
    let data_type = match call.dtype {
        Dtype::F16 => TensorDataType::F16,
        Dtype::Bf16 => TensorDataType::Bf16,
    };
    let [batch_stride, row_stride, head_stride] = t.strides;
    let sizes = [seqlen, heads, batch].map(|n| n as u64);
    // A dimension of one index never steps: any stride TMA takes, not its
    // own (a packed tensor's batch stride, which validation leaves
    // unchecked, may be anything). The others' spans were checked.
    let stride = |n: u64, elements: i64| if n == 1 { 16 } else { 2 * elements as u64 };
    TensorMapParams {
        data_type,
        rank: 4,
        global_address: t.addr,
        global_dims: [p.head_dim as u64, sizes[0], sizes[1], sizes[2], 1],
        global_strides: [
            stride(sizes[0], row_stride),
            stride(sizes[1], head_stride),
            stride(sizes[2], batch_stride),
            0,
        ],
        box_dims: [columns, rows, 1, 1, 1],
        element_strides: [1; 5],
        swizzle: if columns == SLAB_COLUMNS { TmaSwizzle::B128 } else { TmaSwizzle::B64 },
        l2_promotion: L2Promotion::B256,
        oob_fill: OobFill::Zero,
    }
}

/// The L2 that a causal call's section of heads fills with its K and V
/// ([`hopper_causal_section`]): half of an H100's or H200's 50 MB, the
/// share one of its two partitions holds near its SMs.
const CAUSAL_SECTION_L2_BYTES: usize = 25 << 20;

/// The sm_90a kernel for `call`, with the tensor maps of its q, k and v,
/// if the call is one those kernels take: dense or packed sequences (not a
/// KV cache), no split asked for, a head dim and element type of the
/// table, more query rows than a decode block, and q, k and v as TMA reads
/// them (16-byte aligned, strides multiples of 16 bytes). Windows,
/// softcap, ALiBi and packed sequences take the general kernel.
fn hopper_launch(call: &Call, sm_count: usize) -> Option<HopperLaunch> {
    let p = &call.problem;
    // The tensors as TMA sees them, [batch, seqlen] of q and of k and v:
    // packed sequences are one batch of all their tokens, each tile's
    // sequence found through the offsets.
    let (q_rows, k_rows, packed) = match call.sequences {
        Sequences::Dense => ([p.batch, p.seqlen_q], [p.batch, p.seqlen_k], false),
        Sequences::Packed { total_q, total_k, .. } => ([1, total_q], [1, total_k], true),
        Sequences::Cache { .. } => return None,
    };
    let general = call.softcap.is_some() || call.alibi.is_some() || packed;
    let variant = match call.mask {
        _ if general => Variant::General,
        Mask::None => Variant::Full,
        Mask::Causal => Variant::Causal,
        Mask::Window { .. } => Variant::General,
    };
    let unsplit = matches!(call.num_splits, None | Some(1));
    let decode_rows = attention_kernel(p.head_dim as u32, call.dtype, Variant::Decode)?.config.block_m as usize;
    if !unsplit || call.append.is_some() || p.seqlen_q <= decode_rows || gqa_decode_applies(call) {
        return None;
    }
    let head_dim = u32::try_from(p.head_dim).ok()?;
    let block_m = hopper_block_m(head_dim, call.mask == Mask::Causal, p.seqlen_k);
    let kernel = hopper_kernel(head_dim, call.dtype, variant, block_m)?;
    let block_n = kernel.config.block_n;
    let maps = [
        tma_map(call, &call.q, [q_rows[0], q_rows[1], p.heads_q], (SLAB_COLUMNS, kernel.config.block_m())),
        tma_map(call, &call.k, [k_rows[0], k_rows[1], p.heads_kv], (SLAB_COLUMNS, block_n)),
        tma_map(call, &call.v, [k_rows[0], k_rows[1], p.heads_kv], (kernel.config.v_slab_columns(), block_n)),
    ];
    // TMA takes 32-bit coordinates: the last box's first row among them.
    let coordinates = [(q_rows[1], kernel.config.block_m()), (k_rows[1], block_n)];
    if maps.iter().any(|m| m.validate().is_err())
        || coordinates.iter().any(|&(n, rows)| n + rows as usize > i32::MAX as usize)
    {
        return None;
    }
    let (query_blocks, tiles) = hopper_tiles(p.seqlen_q, p.heads_q, p.batch, kernel.config.block_m())?;
    // Persistent blocks, one per SM, so that a tile's loads overlap the
    // last tile's epilogue. Unmasked tiles all cost the same: block b
    // takes every grid-th. The others differ (causal tiles, windows near
    // a sequence's start, packed sequences): a block takes the next tile
    // no block has taken (the tile counter), the causal kernel's heaviest
    // first (docs/hopper.md).
    let grid_x = tiles.min(u32::try_from(sm_count.max(1)).unwrap_or(u32::MAX));
    if grid_x > i32::MAX as u32 {
        return None;
    }
    let tile_counter = variant != Variant::Full && grid_x < tiles;
    // The causal kernel's tiles of several heads interleave (dense calls
    // only: the general kernel takes the packed ones, whose sequences
    // differ in length).
    let section_heads = if variant == Variant::Causal {
        // K and V, of 2-byte elements (f16 and bf16).
        let kv_bytes_per_head = 2 * p.seqlen_k * p.head_dim * 2;
        hopper_causal_section(p.heads_q * p.batch, kv_bytes_per_head, CAUSAL_SECTION_L2_BYTES)
    } else {
        1
    };
    Some(HopperLaunch { kernel, grid: [grid_x, 1, 1], maps, query_blocks, tiles, section_heads, tile_counter })
}

/// Plans `call` on the sm_80 kernels ([`plan_for`] with [`KernelFamily::Sm80`]).
pub fn plan(call: &Call, wave: impl Fn(&AttentionKernel) -> usize) -> Result<Plan> {
    plan_for(call, wave, KernelFamily::Sm80)
}

/// Plans `call`: the GQA decode layout where it applies, the split
/// (`call.num_splits` or the heuristic, with `wave` the CTAs of a kernel
/// that the GPU runs at once), the kernel, the grid and the scratch; with
/// [`KernelFamily::Sm90a`], the sm_90a kernel instead where it takes the
/// call.
pub fn plan_for(call: &Call, wave: impl Fn(&AttentionKernel) -> usize, family: KernelFamily) -> Result<Plan> {
    let head_dim = call.problem.head_dim;
    let kernel_of = |variant| {
        u32::try_from(head_dim)
            .ok()
            .and_then(|d| attention_kernel(d, call.dtype, variant))
            .ok_or(Error::UnsupportedHeadDim(head_dim))
    };
    let mut args = forward_params(call);
    let hopper = match family {
        KernelFamily::Sm90a { sm_count } => hopper_launch(call, sm_count),
        KernelFamily::Sm80 => None,
    };
    let swapped = gqa_decode_applies(call);
    if swapped {
        swap_gqa_decode(&mut args);
    }
    let batch = args.batch as usize;
    let rows = args.seqlen_q as usize;
    let heads_q = args.heads_q as usize;
    let decode = kernel_of(Variant::Decode)?;
    let split_kernel = if rows <= decode.config.block_m as usize { decode } else { kernel_of(Variant::General)? };
    // The sm_90a kernels run unsplit: no partials, no merge.
    let num_splits = match (&hopper, call.num_splits) {
        (Some(_), _) => 1,
        (None, Some(n)) => n,
        (None, None) => {
            let ctas =
                rows.div_ceil(split_kernel.config.block_m as usize).saturating_mul(heads_q).saturating_mul(batch);
            let key_blocks = (args.seqlen_k as usize).div_ceil(split_kernel.config.block_n as usize);
            num_splits_heuristic(ctas, key_blocks, wave(split_kernel))
        }
    };
    args.num_splits = num_splits as u32;
    // The causal mask of a swapped call is void: the dense kernel without it.
    let kernel = if crate::plan::needs_general(call) || num_splits > 1 {
        split_kernel
    } else if call.mask == Mask::Causal && !swapped {
        kernel_of(Variant::Causal)?
    } else {
        kernel_of(Variant::Full)?
    };
    let grid_x = rows.div_ceil(kernel.config.block_m as usize).saturating_mul(num_splits);
    if grid_x > MAX_GRID_X {
        return Err(Error::TooLarge { what: "query blocks * num_splits", value: grid_x, max: MAX_GRID_X });
    }
    let upload = match &call.sequences {
        Sequences::Cache { lengths: CacheLengths::Upload(lengths), .. } => lengths.clone(),
        _ => Vec::new(),
    };
    // First: it bounds the partial rows, which the merge counts below.
    let scratch = ScratchLayout::new(&args, head_dim, upload.len(), hopper.is_some())?;
    let mut combine_blocks = 0;
    if num_splits > 1 {
        let merged_rows = rows * heads_q * batch;
        combine_blocks = combine_grid(merged_rows as u64, head_dim as u32) as usize;
        // The merge numbers its warps (block * COMBINE_WARPS + warp) in u32.
        if combine_blocks > MAX_COMBINE_BLOCKS {
            return Err(Error::TooLarge {
                what: "split-KV merge blocks",
                value: combine_blocks,
                max: MAX_COMBINE_BLOCKS,
            });
        }
    }
    Ok(Plan {
        kernel,
        grid: [grid_x as u32, heads_q as u32, batch as u32],
        args,
        append: call.append,
        combine_blocks: combine_blocks as u32,
        scratch,
        upload,
        outputs: call.outputs,
        hopper,
    })
}

/// Panics unless the new planner (`crate::plan`) gives `call` what this
/// one gives it, for both families: the same error, or the same launches
/// (kernels, geometry and argument blocks, bound to the same outputs and
/// scratch), scratch bytes, uploaded lengths and tensor maps.
pub(crate) fn assert_same_plans(call: &Call, wave: usize) {
    let outputs = OutputAddrs { o: 3 << 40, lse: 5 << 40 };
    let scratch = 1 << 62;
    let shown = |launches: Vec<Launch>| launches.iter().map(|l| format!("{l:?}")).collect::<Vec<_>>();
    for family in [KernelFamily::Sm80, KernelFamily::Sm90a { sm_count: wave }] {
        let new_family = match family {
            KernelFamily::Sm80 => crate::plan::KernelFamily::Sm80,
            KernelFamily::Sm90a { sm_count } => crate::plan::KernelFamily::Sm90a { sm_count },
        };
        let old = plan_for(call, |_| wave, family);
        let new = crate::plan::plan_for(call, |_| wave, new_family);
        match (old, new) {
            (Err(old), Err(new)) => assert_eq!(old, new, "{call:?}"),
            (Ok(old), Ok(new)) => {
                assert_eq!(shown(old.launches(outputs, scratch)), shown(new.launches(outputs, scratch)), "{call:?}");
                assert_eq!(old.scratch.bytes, new.scratch_bytes(), "{call:?}");
                let (upload, maps) = match &new {
                    crate::plan::Plan::Sm80(p) => (p.upload.clone(), None),
                    crate::plan::Plan::Sm90(p) => (Vec::new(), Some(format!("{:?}", p.maps))),
                };
                assert_eq!(old.upload, upload, "{call:?}");
                assert_eq!(old.hopper.map(|h| format!("{:?}", h.maps)), maps, "{call:?}");
                if let crate::plan::Plan::Sm80(p) = &new {
                    assert_eq!(old.scratch.seqused_k, p.scratch.seqused_k, "{call:?}");
                }
            }
            (old, new) => panic!("{call:?}: the old plan {old:?}, the new {new:?}"),
        }
    }
}

/// As [`assert_same_plans`], for a backward call.
pub(crate) fn assert_same_backward_plans(call: &BackwardCall, sm_count: usize) {
    let shown = |launches: Vec<Launch>| launches.iter().map(|l| format!("{l:?}")).collect::<Vec<_>>();
    for family in [KernelFamily::Sm80, KernelFamily::Sm90a { sm_count }] {
        let new_family = match family {
            KernelFamily::Sm80 => crate::plan::KernelFamily::Sm80,
            KernelFamily::Sm90a { sm_count } => crate::plan::KernelFamily::Sm90a { sm_count },
        };
        let old = plan_backward_for(call, sm_count, family);
        let new = crate::plan::plan_backward_for(call, sm_count, new_family);
        match (old, new) {
            (Err(old), Err(new)) => assert_eq!(old, new, "{call:?}"),
            (Ok(old), Ok(new)) => {
                assert_eq!(shown(old.launches(1 << 62)), shown(new.launches(1 << 62)), "{call:?}");
                assert_eq!(old.scratch_bytes, new.scratch_bytes(), "{call:?}");
                let maps = match &new {
                    crate::plan::BackwardPlan::Sm80(_) => None,
                    crate::plan::BackwardPlan::Sm90(p) => Some((format!("{:?}", p.maps), p.tensor_maps)),
                };
                assert_eq!(old.hopper.map(|h| (format!("{:?}", h.maps), old.tensor_maps)), maps, "{call:?}");
            }
            (old, new) => panic!("{call:?}: the old plan {old:?}, the new {new:?}"),
        }
    }
}

//! The backward plans: the row kernels both families share (delta and the
//! zeroed dQ accumulator first, dQ last, the sm_80 ones), the argument
//! block and scratch, and between them the main kernel of one family: the
//! sm_80 kernel (once, or once per group of key blocks in the deterministic
//! mode), or the sm_90a kernel with the tensor maps of q, k, v and dO.

use flash_attn_abi::backward::{
    backward_kernel, row_grid, BackwardKernel, BackwardParams, BACKWARD_BLOCK_N, ROW_KERNEL_THREADS,
};
use flash_attn_abi::hopper_backward::{
    hopper_backward_kernel, HopperBackwardKernel, HopperBackwardParams, HopperBackwardScratch,
};
use flash_attn_abi::kernels::{Dtype, Variant};
use flash_attn_abi::sm90::{TensorMap, TensorMapParams};

use super::kernels::{Kernel, KernelArgs, Launch, SCRATCH_ALIGN};
use super::params::forward_params;
use super::tma::tma_map;
use crate::call::{BackwardCall, Mask, Outputs, Sequences};
use crate::error::{Error, Result};

/// The most launches of the main backward kernel in the deterministic mode
/// (one per `dq_splits` key blocks, `dq_splits` about twice the SMs over
/// the key/value heads and batch): a sequence of keys longer than that
/// many of them is refused, not launched thousands of times.
pub const MAX_DETERMINISTIC_LAUNCHES: usize = 1024;

/// What every backward plan runs around its main kernel: the row kernels
/// of the element type (`flash_bwd_prepare_*` first, `flash_bwd_finish_dq_*`
/// last) on their grid, the argument block (outputs bound, scratch not),
/// and the scratch they share: delta and the dQ accumulator, f32, one and
/// `head_dim` per lse value (per split, in the deterministic mode).
#[derive(Clone, Copy, Debug)]
pub struct BackwardRows {
    pub dtype: Dtype,
    pub args: BackwardParams,
    pub grid: [u32; 3],
    /// Byte offsets in the scratch of delta and the dQ accumulator, and
    /// the end of the accumulator.
    pub delta: usize,
    pub d_q_accum: usize,
    pub end: usize,
}

/// The sm_80 main kernel of a backward plan: `key_launches` launches of
/// `grid`, each over the next `grid[0]` key blocks.
#[derive(Clone, Copy, Debug)]
pub struct Sm80Backward {
    pub rows: BackwardRows,
    pub kernel: &'static BackwardKernel,
    pub grid: [u32; 3],
    pub key_launches: u32,
}

/// The sm_90a main kernel of a backward plan, and the tensor maps of its
/// q, k, v and dO, which the launch encodes into the scratch at
/// `tensor_maps` (a [`HopperBackwardScratch`], after the accumulator).
#[derive(Clone, Copy, Debug)]
pub struct Sm90Backward {
    pub rows: BackwardRows,
    pub kernel: &'static HopperBackwardKernel,
    pub grid: [u32; 3],
    pub maps: [TensorMapParams; 4],
    pub tensor_maps: usize,
}

fn overflow() -> Error {
    Error::TooLarge { what: "backward scratch bytes", value: usize::MAX, max: isize::MAX as usize }
}

/// The forward's `o` and `lse`, which the backward reads: `(o, lse)`.
fn forward_outputs(call: &BackwardCall) -> Result<(u64, u64)> {
    match call.forward.outputs {
        Outputs::Given { o, lse } => Ok((o.addr, lse)),
        Outputs::Fresh => Err(Error::ShapeMismatch("the backward reads the forward's o and lse: give them".into())),
    }
}

/// The row kernels, arguments and scratch of `call` with `dq_splits`
/// accumulators of dQ (0: one, added to with atomics).
fn rows(call: &BackwardCall, dq_splits: usize) -> Result<BackwardRows> {
    let f = &call.forward;
    let p = &f.problem;
    let (o, lse) = forward_outputs(call)?;
    let mut forward = forward_params(f);
    forward.o = o as *mut u16;
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
    let round = |n: usize| n.checked_next_multiple_of(SCRATCH_ALIGN).ok_or_else(overflow);
    let delta_bytes = round(call.lse_rows.checked_mul(4).ok_or_else(overflow)?)?;
    let accum = [p.head_dim, 4, dq_splits.max(1)].into_iter().try_fold(call.lse_rows, |n, m| n.checked_mul(m));
    let accum_bytes = round(accum.ok_or_else(overflow)?)?;
    let end = delta_bytes.checked_add(accum_bytes).filter(|&n| n <= isize::MAX as usize).ok_or_else(overflow)?;
    Ok(BackwardRows {
        dtype: f.dtype,
        args,
        grid: row_grid(p.seqlen_q as u32, p.heads_q as u32, p.batch as u32),
        delta: 0,
        d_q_accum: delta_bytes,
        end,
    })
}

/// Plans the backward `call` on the sm_80 kernels of a GPU of `sm_count`
/// SMs: the main kernel of its head dim and element type and its grid. In
/// the deterministic mode, one accumulator per split: enough splits that a
/// launch's grid covers each SM twice, at most one per key block, and as
/// many launches of the main kernel as that takes.
pub fn sm80(call: &BackwardCall, sm_count: usize) -> Result<Sm80Backward> {
    let f = &call.forward;
    let p = &f.problem;
    let kernel = u32::try_from(p.head_dim)
        .ok()
        .and_then(|d| backward_kernel(d, f.dtype))
        .ok_or(Error::UnsupportedHeadDim(p.head_dim))?;
    forward_outputs(call)?;
    let key_blocks = p.seqlen_k.div_ceil(BACKWARD_BLOCK_N as usize);
    let dq_splits = if call.deterministic {
        sm_count.saturating_mul(2).div_ceil(p.heads_kv * p.batch).clamp(1, key_blocks)
    } else {
        0
    };
    // The main kernel's launches: one, or one per `dq_splits` key blocks.
    let launches = if dq_splits > 0 { key_blocks.div_ceil(dq_splits) } else { 1 };
    if launches > MAX_DETERMINISTIC_LAUNCHES {
        let (value, max) = (launches, MAX_DETERMINISTIC_LAUNCHES);
        return Err(Error::TooLarge { what: "deterministic backward launches", value, max });
    }
    let rows = rows(call, dq_splits)?;
    let grid = kernel.config.grid(p.seqlen_k as u32, p.heads_kv as u32, p.batch as u32, dq_splits as u32);
    Ok(Sm80Backward { rows, kernel, grid, key_launches: launches as u32 })
}

/// Plans the backward `call` on the sm_90a main kernel, if it takes the
/// call: dense sequences, not deterministic, unmasked or causal without
/// softcap or ALiBi, a head dim and element type of its table, and the
/// tensors as TMA reads them. `Ok(None)`: the sm_80 kernels take it.
pub fn sm90(call: &BackwardCall) -> Result<Option<Sm90Backward>> {
    let Some((kernel, grid, maps)) = sm90_main(call) else { return Ok(None) };
    let rows = rows(call, 0)?;
    let tensor_maps = rows.end;
    tensor_maps
        .checked_add(size_of::<HopperBackwardScratch>())
        .filter(|&n| n <= isize::MAX as usize)
        .ok_or_else(overflow)?;
    Ok(Some(Sm90Backward { rows, kernel, grid, maps, tensor_maps }))
}

/// The sm_90a main kernel of `call`, its grid and tensor maps, if it takes
/// the call ([`sm90`]).
fn sm90_main(call: &BackwardCall) -> Option<(&'static HopperBackwardKernel, [u32; 3], [TensorMapParams; 4])> {
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
    Some((kernel, grid, maps))
}

impl BackwardRows {
    /// The arguments with the scratch at `scratch`.
    fn bound(&self, scratch: u64) -> BackwardParams {
        let mut args = self.args;
        args.delta = (scratch + self.delta as u64) as *mut f32;
        args.d_q_accum = (scratch + self.d_q_accum as u64) as *mut f32;
        args
    }

    /// The launches: prepare, `main`, finish dQ.
    fn around(&self, args: BackwardParams, main: impl Iterator<Item = Launch>) -> Vec<Launch> {
        let rows = |kernel| Launch {
            kernel,
            grid: self.grid,
            threads: ROW_KERNEL_THREADS,
            smem_bytes: 0,
            args: KernelArgs::Backward(args),
        };
        std::iter::once(rows(Kernel::BackwardPrepare(self.dtype)))
            .chain(main)
            .chain([rows(Kernel::BackwardFinish(self.dtype))])
            .collect()
    }
}

impl Sm80Backward {
    /// The launches in order (prepare, the main kernel's, finish dQ) with
    /// the scratch at `scratch` (at least [`BackwardRows::end`] bytes,
    /// 256-byte aligned).
    pub fn launches(&self, scratch: u64) -> Vec<Launch> {
        let args = self.rows.bound(scratch);
        let config = self.kernel.config;
        let main = (0..self.key_launches).map(|i| Launch {
            kernel: Kernel::Backward(self.kernel),
            grid: self.grid,
            threads: config.threads(),
            smem_bytes: config.smem_bytes(),
            args: KernelArgs::Backward(BackwardParams { first_key_block: i * self.grid[0], ..args }),
        });
        self.rows.around(args, main)
    }

    /// The scratch bytes: the row kernels'.
    pub fn scratch_bytes(&self) -> usize {
        self.rows.end
    }
}

impl Sm90Backward {
    /// The launches in order (prepare, the main kernel, finish dQ) with
    /// the scratch at `scratch` (256-byte aligned, the tensor maps already
    /// written at [`Self::tensor_maps`]).
    pub fn launches(&self, scratch: u64) -> Vec<Launch> {
        let args = self.rows.bound(scratch);
        let config = self.kernel.config;
        let main = Launch {
            kernel: Kernel::HopperBackward(self.kernel),
            grid: self.grid,
            threads: config.threads(),
            smem_bytes: config.smem_bytes(),
            args: KernelArgs::HopperBackward(HopperBackwardParams {
                backward: args,
                tensor_maps: (scratch + self.tensor_maps as u64) as *const TensorMap,
            }),
        };
        self.rows.around(args, std::iter::once(main))
    }

    /// The scratch bytes: the row kernels', then the tensor maps.
    pub fn scratch_bytes(&self) -> usize {
        self.tensor_maps + size_of::<HopperBackwardScratch>()
    }
}

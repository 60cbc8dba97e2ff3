//! The backward's row kernels, one warp per query row at a time and a lane
//! per 8 columns of it: [`prepare`] before the main kernel, [`finish_dq`]
//! after it. Grid [`flash_attn_abi::backward::row_grid`] (x: blocks of
//! [`ROW_KERNEL_ROWS`] rows, y: query head, z: batch),
//! [`ROW_KERNEL_THREADS`] threads.

use super::{row_offset, BatchRows};
use crate::arch;
use crate::common::element::Element;
use flash_attn_abi::backward::{BackwardParams, ROW_KERNEL_ROWS, ROW_KERNEL_THREADS};

/// Calls `f(rows, head, row, lane)` for each query row of this block's that
/// its batch has, warp `w` taking rows `w`, `w + warps`, ...; every lane of
/// a warp alike.
#[inline(always)]
unsafe fn for_each_row(p: &BackwardParams, mut f: impl FnMut(&BatchRows, u32, u32, u32)) {
    const WARPS: u32 = ROW_KERNEL_THREADS / 32;
    let (tid, head, batch) = (arch::thread_idx_x(), arch::block_idx_y(), arch::block_idx_z());
    let rows = BatchRows::of(&p.forward, batch);
    let first_row = arch::block_idx_x() * ROW_KERNEL_ROWS;
    let end = (first_row + ROW_KERNEL_ROWS).min(rows.seqlen_q);
    // The warp index as `%tid.x >> 5` alone (not folded into a multiple of
    // it), which the PTX divergence check knows to be warp-uniform.
    let mut row = first_row + tid / 32;
    while row < end {
        f(&rows, head, row, tid % 32);
        row += WARPS;
    }
}

/// `delta[row] = sum(dO[row] * O[row])` in f32 (what `dS = P (dP - delta)`
/// subtracts), and the row's `head_dim` accumulators of dQ (of every split)
/// set to zero.
///
/// # Safety
/// `p` describes tensors the host validated; the launch is as above.
#[inline(always)]
pub unsafe fn prepare<E: Element>(p: &BackwardParams) {
    let f = &p.forward;
    let chunks = p.head_dim / 8;
    for_each_row(p, |rows, head, row, lane| {
        let mut sum = 0.0;
        if lane < chunks {
            let d_o = p.d_o.offset(
                (rows.q_offset(p.d_o_batch_stride, p.d_o_row_stride)
                    + row_offset(row, head, p.d_o_row_stride, p.d_o_head_stride)
                    + 8 * lane as i64) as isize,
            );
            let o = f.o.offset(
                (rows.q_offset(f.o_batch_stride, f.o_row_stride)
                    + row_offset(row, head, f.o_row_stride, f.o_head_stride)
                    + 8 * lane as i64) as isize,
            );
            let (d_o, o) = (arch::ld_global_v4(d_o as *const u8), arch::ld_global_v4(o as *const u8));
            for i in 0..4 {
                let ((g0, g1), (o0, o1)) = (E::unpack(d_o[i]), E::unpack(o[i]));
                sum = arch::fma(g0, o0, arch::fma(g1, o1, sum));
            }
        }
        for mask in [16, 8, 4, 2, 1] {
            sum += arch::shfl_xor_f32(sum, mask);
        }
        let index = rows.lse_index(f, head, row);
        if lane == 0 {
            arch::st_global_f32(p.delta.offset(index as isize), sum);
        }
        for split in 0..p.dq_splits.max(1) {
            let at = split as i64 * p.d_q_accum_split_stride + index * p.head_dim as i64;
            let accum = p.d_q_accum.offset(at as isize);
            let mut chunk = lane;
            while chunk < p.head_dim / 4 {
                arch::st_global_v4(accum.add(4 * chunk as usize) as *mut u8, [0; 4]);
                chunk += 32;
            }
        }
    });
}

/// `dQ[row] = softmax_scale * accumulator[row]` (the splits' summed in
/// order), rounded to `E`.
///
/// # Safety
/// As [`prepare`], after the main kernel.
#[inline(always)]
pub unsafe fn finish_dq<E: Element>(p: &BackwardParams) {
    let f = &p.forward;
    for_each_row(p, |rows, head, row, lane| {
        if lane >= p.head_dim / 8 {
            return;
        }
        let index = rows.lse_index(f, head, row);
        // The splits' sums in split order (one accumulator without them).
        let mut sum = [0f32; 8];
        for split in 0..p.dq_splits.max(1) {
            let at = split as i64 * p.d_q_accum_split_stride + index * p.head_dim as i64 + 8 * lane as i64;
            let accum = p.d_q_accum.offset(at as isize);
            let (lo, hi) = (arch::ld_global_v4(accum as *const u8), arch::ld_global_v4(accum.add(4) as *const u8));
            for i in 0..4 {
                sum[i] += f32::from_bits(lo[i]);
                sum[i + 4] += f32::from_bits(hi[i]);
            }
        }
        let values = sum.map(|x| x * p.softmax_scale);
        let packed = core::array::from_fn(|i| E::pack(values[2 * i], values[2 * i + 1]));
        let d_q = p.d_q.offset(
            (rows.q_offset(p.d_q_batch_stride, p.d_q_row_stride)
                + row_offset(row, head, p.d_q_row_stride, p.d_q_head_stride)
                + 8 * lane as i64) as isize,
        );
        arch::st_global_v4(d_q as *mut u8, packed);
    });
}

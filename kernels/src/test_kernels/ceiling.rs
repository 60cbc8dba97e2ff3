//! The mma.sync ceiling: a kernel that does nothing but m16n8k16 f16 MMAs
//! with f32 accumulation on registers, the most a kernel built on these
//! instructions can reach. The benchmark times it beside the attention
//! kernels and reports their fraction of it.
//!
//! Each warp runs [`CHAINS`] independent accumulator chains, enough to keep
//! the tensor pipe busy, for `iterations` rounds: `4096 * CHAINS *
//! iterations` FLOPs per warp.

use crate::arch;

/// Independent accumulators per warp.
pub const CHAINS: usize = 8;

/// The ceiling kernel's body. Writes one f32 per thread to `out` (the sum of
/// its accumulators, so that nothing is optimised away).
///
/// # Safety
/// `out` holds one f32 per launched thread, indexed by
/// `block * blockDim + thread`, with `threads` the block size.
#[inline(always)]
pub unsafe fn mma_ceiling(iterations: u32, out: *mut f32, threads: u32) {
    let tid = arch::thread_idx_x();
    // Operands that depend on the thread, so the compiler cannot fold them:
    // 1.0 and a small per-thread value in f16 (0x3c00 is 1.0).
    let one_pair = 0x3c00_3c00u32;
    let small = 0x1c00_1c00u32 | (tid & 7);
    let a = [one_pair, small, small, one_pair];
    let b = [small, one_pair];
    let mut acc = [[0f32; 4]; CHAINS];
    for _ in 0..iterations {
        for chain in acc.iter_mut() {
            arch::mma_f16(chain, &a, &b);
        }
    }
    let total: f32 = acc.iter().flatten().sum();
    let index = arch::block_idx_x() * threads + tid;
    arch::st_global_f32(out.add(index as usize), total);
}

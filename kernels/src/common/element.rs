//! The 16-bit input types: which `mma.sync` and `wgmma` variants multiply
//! them and how two f32 values are rounded into one packed register of them.

use crate::arch::{self, WgmmaAccumulator};

/// A 16-bit floating-point element type the tensor cores take.
pub trait Element {
    /// `acc += a * b` on one m16n8k16 tile, f32 accumulation.
    fn mma(acc: &mut [f32; 4], a: &[u32; 4], b: &[u32; 2]);
    /// Rounds `lo` and `hi` to this type, `lo` in the low 16 bits.
    fn pack(lo: f32, hi: f32) -> u32;
    /// The two values of a packed register, low 16 bits first, exactly.
    fn unpack(x: u32) -> (f32, f32);
    /// `wgmma.mma_async` of this type with A and B in shared memory
    /// ([`arch::wgmma_ss_f16`]); sm_90a only.
    fn wgmma_ss<const R: usize, const TRANS_A: u32, const TRANS_B: u32>(
        acc: &mut WgmmaAccumulator<R>,
        a_desc: u64,
        b_desc: u64,
        scale_d: bool,
    );
    /// `wgmma.mma_async` of this type with A from registers
    /// ([`arch::wgmma_rs_f16`]); sm_90a only.
    fn wgmma_rs<const R: usize, const TRANS_B: u32>(
        acc: &mut WgmmaAccumulator<R>,
        a: &[u32; 4],
        b_desc: u64,
        scale_d: bool,
    );
}

/// IEEE binary16.
pub struct F16;
/// bfloat16.
pub struct Bf16;

impl Element for F16 {
    #[inline(always)]
    fn mma(acc: &mut [f32; 4], a: &[u32; 4], b: &[u32; 2]) {
        arch::mma_f16(acc, a, b)
    }
    #[inline(always)]
    fn pack(lo: f32, hi: f32) -> u32 {
        arch::pack_f16x2(lo, hi)
    }
    #[inline(always)]
    fn unpack(x: u32) -> (f32, f32) {
        arch::unpack_f16x2(x)
    }
    #[inline(always)]
    #[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
    fn wgmma_ss<const R: usize, const TRANS_A: u32, const TRANS_B: u32>(
        acc: &mut WgmmaAccumulator<R>,
        a_desc: u64,
        b_desc: u64,
        scale_d: bool,
    ) {
        arch::wgmma_ss_f16::<R, TRANS_A, TRANS_B>(acc, a_desc, b_desc, scale_d)
    }
    #[inline(always)]
    #[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
    fn wgmma_rs<const R: usize, const TRANS_B: u32>(
        acc: &mut WgmmaAccumulator<R>,
        a: &[u32; 4],
        b_desc: u64,
        scale_d: bool,
    ) {
        arch::wgmma_rs_f16::<R, TRANS_B>(acc, a, b_desc, scale_d)
    }
}

impl Element for Bf16 {
    #[inline(always)]
    fn mma(acc: &mut [f32; 4], a: &[u32; 4], b: &[u32; 2]) {
        arch::mma_bf16(acc, a, b)
    }
    #[inline(always)]
    fn pack(lo: f32, hi: f32) -> u32 {
        arch::pack_bf16x2(lo, hi)
    }
    #[inline(always)]
    fn unpack(x: u32) -> (f32, f32) {
        // A bf16 is the high half of the f32 it widens to.
        (f32::from_bits(x << 16), f32::from_bits(x & 0xffff_0000))
    }
    #[inline(always)]
    #[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
    fn wgmma_ss<const R: usize, const TRANS_A: u32, const TRANS_B: u32>(
        acc: &mut WgmmaAccumulator<R>,
        a_desc: u64,
        b_desc: u64,
        scale_d: bool,
    ) {
        arch::wgmma_ss_bf16::<R, TRANS_A, TRANS_B>(acc, a_desc, b_desc, scale_d)
    }
    #[inline(always)]
    #[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
    fn wgmma_rs<const R: usize, const TRANS_B: u32>(
        acc: &mut WgmmaAccumulator<R>,
        a: &[u32; 4],
        b_desc: u64,
        scale_d: bool,
    ) {
        arch::wgmma_rs_bf16::<R, TRANS_B>(acc, a, b_desc, scale_d)
    }
}

//! The 16-bit input types: which `mma.sync` variant multiplies them and how
//! two f32 values are rounded into one packed register of them.

use crate::arch;

/// A 16-bit floating-point element type the tensor cores take.
pub trait Element {
    /// `acc += a * b` on one m16n8k16 tile, f32 accumulation.
    fn mma(acc: &mut [f32; 4], a: &[u32; 4], b: &[u32; 2]);
    /// Rounds `lo` and `hi` to this type, `lo` in the low 16 bits.
    fn pack(lo: f32, hi: f32) -> u32;
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
}

//! The scalar float instructions, and the exact dot product behind `mma`.
//!
//! Bit-exact where the PTX ISA defines the result: `fma.rn.f32` (one IEEE
//! rounding), `cvt.rn.{f16,bf16}x2.f32` (round to nearest even; NaN maps to
//! a NaN, its payload is not modelled). The `.approx` instructions are
//! defined only up to an error bound; here they return the correctly
//! rounded value (computed in f64 and rounded once, so only an f64 result
//! within 2^-29 ulp of a tie can round differently), with the ISA's special
//! values and `.ftz` flushing:
//! - `ex2.approx.ftz.f32`: the GPU is within 2 ulp of the correctly rounded
//!   result (PTX ISA), so within 2 ulp of the emulator;
//! - `lg2.approx.ftz.f32`: the GPU is within 2^-22 absolute for inputs in
//!   (0.5, 2) and 2^-22 relative elsewhere;
//! - `rcp.approx.ftz.f32`: the GPU is within 1 ulp.
//!
//! `mma` ([`dot`]): the ISA says only `D = A * B + C`. The emulator returns
//! the exact value of `c + sum(a_k * b_k)` rounded once to nearest-even f32,
//! independent of summation order. Tensor cores instead align the products
//! to the largest exponent and truncate (Fasi et al. 2021 for A100, Khattak
//! and Mikaitis 2025 for H100), so a GPU's result can differ in the last
//! bits: by the published models (at least 24 bits kept per aligned term,
//! two chained k=8 steps at most) by less than about
//! `2^-19 * (|c| + sum |a_k * b_k|)` per instruction. That bound is an
//! estimate from those models, not measured here.

use half::{bf16, f16};

/// Flushes a subnormal to zero of the same sign (`.ftz`).
fn flush(x: f32) -> f32 {
    if x.is_subnormal() {
        0.0f32.copysign(x)
    } else {
        x
    }
}

/// `ex2.approx.ftz.f32`.
pub(crate) fn ex2_approx_ftz(x: f32) -> f32 {
    flush((flush(x) as f64).exp2() as f32)
}

/// `lg2.approx.ftz.f32`: -inf for zeros and subnormals, NaN below zero.
pub(crate) fn lg2_approx_ftz(x: f32) -> f32 {
    flush((flush(x) as f64).log2() as f32)
}

/// `rcp.approx.ftz.f32`.
pub(crate) fn rcp_approx_ftz(x: f32) -> f32 {
    // An f32 division is already the correctly rounded reciprocal.
    flush(1.0 / flush(x))
}

/// `fma.rn.f32`: no `.ftz`, so subnormals are kept.
pub(crate) fn fma_rn(a: f32, b: f32, c: f32) -> f32 {
    a.mul_add(b, c)
}

/// `cvt.rn.f16x2.f32 d, hi, lo`.
pub(crate) fn cvt_rn_f16x2(lo: f32, hi: f32) -> u32 {
    u32::from(f16::from_f32(lo).to_bits()) | (u32::from(f16::from_f32(hi).to_bits()) << 16)
}

/// `cvt.rn.bf16x2.f32 d, hi, lo`.
pub(crate) fn cvt_rn_bf16x2(lo: f32, hi: f32) -> u32 {
    u32::from(bf16::from_f32(lo).to_bits()) | (u32::from(bf16::from_f32(hi).to_bits()) << 16)
}

/// The 16-bit input type of an `mma`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HalfType {
    F16,
    Bf16,
}

impl HalfType {
    /// `bits` as `(negative, significand, exponent)` with value
    /// `significand * 2^exponent`; `None` for infinities and NaNs.
    fn decode(self, bits: u16) -> Option<(bool, u64, i32)> {
        let (mantissa_bits, bias) = match self {
            HalfType::F16 => (10, 15),
            HalfType::Bf16 => (7, 127),
        };
        decode(u32::from(bits), mantissa_bits, bias, 15)
    }

    fn to_f64(self, bits: u16) -> f64 {
        match self {
            HalfType::F16 => f16::from_bits(bits).to_f64(),
            HalfType::Bf16 => bf16::from_bits(bits).to_f64(),
        }
    }
}

/// Splits an IEEE binary format of `mantissa_bits` and `bias` whose sign is
/// bit `sign_bit` (see [`HalfType::decode`]).
fn decode(bits: u32, mantissa_bits: u32, bias: i32, sign_bit: u32) -> Option<(bool, u64, i32)> {
    let negative = (bits >> sign_bit) & 1 == 1;
    let exponent_mask = (1u32 << (sign_bit - mantissa_bits)) - 1;
    let exponent = ((bits >> mantissa_bits) & exponent_mask) as i32;
    let mantissa = u64::from(bits & ((1 << mantissa_bits) - 1));
    let scale = 1 - bias - mantissa_bits as i32;
    if exponent == exponent_mask as i32 {
        None
    } else if exponent == 0 {
        Some((negative, mantissa, scale))
    } else {
        Some((negative, mantissa | (1 << mantissa_bits), scale + exponent - 1))
    }
}

/// `c + sum(a[k] * b[k])`, exact, rounded once to nearest-even f32.
pub(crate) fn dot(ty: HalfType, c: f32, a: &[u16; 16], b: &[u16; 16]) -> f32 {
    let mut sum = ExactSum::default();
    let Some((negative, sig, exp)) = decode(c.to_bits(), 23, 127, 31) else {
        return naive_dot(ty, c, a, b);
    };
    sum.add(negative, sig, exp);
    for (&x, &y) in a.iter().zip(b) {
        let (Some((nx, sx, ex)), Some((ny, sy, ey))) = (ty.decode(x), ty.decode(y)) else {
            return naive_dot(ty, c, a, b);
        };
        sum.add(nx != ny, sx * sy, ex + ey);
    }
    sum.round_to_f32()
}

/// With an infinite or NaN operand the exact sum is IEEE's: inf, or NaN.
fn naive_dot(ty: HalfType, c: f32, a: &[u16; 16], b: &[u16; 16]) -> f32 {
    a.iter().zip(b).fold(c as f64, |s, (&x, &y)| s + ty.to_f64(x) * ty.to_f64(y)) as f32
}

/// Limbs of the fixed-point accumulator.
const LIMBS: usize = 9;
/// Bit `i` of the accumulator weighs `2^(i - POINT)`. The smallest nonzero
/// term is a product of two bf16 subnormals, `2^-266`; the largest sum stays
/// below `2^262`, so 576 bits hold every sum exactly.
const POINT: i32 = 288;

/// A sum of signed terms kept exactly: the positive and the negative terms
/// each add into an unsigned fixed-point number.
#[derive(Default)]
struct ExactSum {
    positive: [u64; LIMBS],
    negative: [u64; LIMBS],
}

impl ExactSum {
    /// Adds `(-1)^negative * significand * 2^exponent`, `significand < 2^48`.
    fn add(&mut self, negative: bool, significand: u64, exponent: i32) {
        if significand == 0 {
            return;
        }
        let position = (exponent + POINT) as u32;
        let limbs = if negative { &mut self.negative } else { &mut self.positive };
        let shifted = u128::from(significand) << (position % 64);
        let mut carry = 0u128;
        for (i, limb) in limbs.iter_mut().enumerate().skip((position / 64) as usize) {
            let part = match i - (position / 64) as usize {
                0 => shifted as u64,
                1 => (shifted >> 64) as u64,
                _ => 0,
            };
            let total = u128::from(*limb) + u128::from(part) + carry;
            *limb = total as u64;
            carry = total >> 64;
        }
    }

    fn round_to_f32(&self) -> f32 {
        let (magnitude, negative) = if less_than(&self.positive, &self.negative) {
            (subtract(&self.negative, &self.positive), true)
        } else {
            (subtract(&self.positive, &self.negative), false)
        };
        let Some(top) = highest_bit(&magnitude) else {
            return 0.0;
        };
        // Keep 24 significant bits, or down to 2^-149 for subnormals.
        let lsb = (top as i32 - 23).max(POINT - 149);
        let kept = if top as i32 >= lsb { bits(&magnitude, lsb as u32, top) } else { 0 };
        let round = bit(&magnitude, lsb as u32 - 1);
        let sticky = any_below(&magnitude, lsb as u32 - 1);
        let rounded = kept + u64::from(round && (sticky || kept & 1 == 1));
        // rounded < 2^25 and the scale lies in f64's range: exact, then
        // exact again in f32 or past its range (infinity, as RN requires).
        let value = (rounded as f64 * 2f64.powi(lsb - POINT)) as f32;
        if negative {
            -value
        } else {
            value
        }
    }
}

fn less_than(a: &[u64; LIMBS], b: &[u64; LIMBS]) -> bool {
    a.iter().rev().cmp(b.iter().rev()).is_lt()
}

/// `a - b` for `a >= b`.
fn subtract(a: &[u64; LIMBS], b: &[u64; LIMBS]) -> [u64; LIMBS] {
    let mut out = [0u64; LIMBS];
    let mut borrow = false;
    for i in 0..LIMBS {
        let (d1, b1) = a[i].overflowing_sub(b[i]);
        let (d2, b2) = d1.overflowing_sub(u64::from(borrow));
        out[i] = d2;
        borrow = b1 || b2;
    }
    out
}

fn highest_bit(x: &[u64; LIMBS]) -> Option<u32> {
    (0..LIMBS).rev().find(|&i| x[i] != 0).map(|i| i as u32 * 64 + 63 - x[i].leading_zeros())
}

fn bit(x: &[u64; LIMBS], i: u32) -> bool {
    (x[(i / 64) as usize] >> (i % 64)) & 1 == 1
}

/// Bits `lo..=hi` (at most 64 of them) as an integer.
fn bits(x: &[u64; LIMBS], lo: u32, hi: u32) -> u64 {
    (lo..=hi).rev().fold(0, |acc, i| (acc << 1) | u64::from(bit(x, i)))
}

/// Whether any bit below `i` is set.
fn any_below(x: &[u64; LIMBS], i: u32) -> bool {
    let limb = (i / 64) as usize;
    x[..limb].iter().any(|&l| l != 0) || x[limb] & ((1u64 << (i % 64)) - 1) != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f16s(values: &[f32]) -> [u16; 16] {
        let mut out = [0u16; 16];
        for (o, v) in out.iter_mut().zip(values) {
            *o = f16::from_f32(*v).to_bits();
        }
        out
    }

    #[test]
    fn dot_is_exact_where_f64_summation_is_not() {
        // 2^24 + 1 + 2^-30 (in f16: 2^12 * 2^12, 1 * 1, 2^-15 * 2^-15)
        // rounds up to 2^24 + 2. Summed in f64 the 2^-30 is lost (the f64
        // ulp at 2^24 is 2^-28) and the tie then rounds to even, 2^24.
        let a = f16s(&[4096.0, 1.0, 2f32.powi(-15)]);
        let b = f16s(&[4096.0, 1.0, 2f32.powi(-15)]);
        assert_eq!(dot(HalfType::F16, 0.0, &a, &b), 16_777_218.0);
        // Without the small term it is a tie, to even: 2^24.
        let a = f16s(&[4096.0, 1.0]);
        assert_eq!(dot(HalfType::F16, 0.0, &a, &a), 16_777_216.0);
    }

    #[test]
    fn dot_cancels_exactly() {
        let a = f16s(&[65504.0, 65504.0, 2f32.powi(-24)]);
        let b = f16s(&[65504.0, -65504.0, 2f32.powi(-24)]);
        assert_eq!(dot(HalfType::F16, 2f32.powi(-60), &a, &b), 2f32.powi(-48) + 2f32.powi(-60));
    }

    #[test]
    fn dot_reaches_bf16_extremes() {
        let tiny = bf16::from_bits(1).to_bits(); // 2^-133
        let huge = bf16::MAX.to_bits();
        let mut a = [0u16; 16];
        let mut b = [0u16; 16];
        (a[0], b[0]) = (tiny, tiny);
        assert_eq!(dot(HalfType::Bf16, 0.0, &a, &b), 0.0); // 2^-266 underflows
        (a[1], b[1]) = (huge, huge);
        assert_eq!(dot(HalfType::Bf16, 0.0, &a, &b), f32::INFINITY);
        (a[1], b[1]) = (bf16::from_f32(2f32.powi(-75)).to_bits(), bf16::from_f32(2f32.powi(-75)).to_bits());
        // 2^-150 + 2^-266: just above half the smallest subnormal, rounds up.
        assert_eq!(dot(HalfType::Bf16, 0.0, &a, &b), f32::from_bits(1));
    }

    #[test]
    fn dot_propagates_non_finite() {
        let inf = f16s(&[f32::INFINITY]);
        let one = f16s(&[1.0]);
        assert_eq!(dot(HalfType::F16, 0.0, &inf, &one), f32::INFINITY);
        assert!(dot(HalfType::F16, 0.0, &inf, &f16s(&[0.0])).is_nan());
        assert!(dot(HalfType::F16, f32::NEG_INFINITY, &inf, &one).is_nan());
    }
}

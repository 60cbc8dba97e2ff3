//! The online softmax of FlashAttention-2, row by row in registers, and the
//! score mask.
//!
//! A lane holds two rows of each m-tile (C-fragment rows g and g+8, "halves"
//! 0 and 1 below), each spread over the four lanes of its quad, so row
//! reductions finish with two butterfly shuffles. Scores stay unscaled; the
//! scale and the max are folded into one FMA in front of `ex2`:
//! `p = 2^(s * scale_log2 - max * scale_log2)`.

use crate::arch;
use crate::mma::Accumulators;

/// Running max and partial sum of each of the lane's rows.
pub struct OnlineSoftmax<const M_TILES: usize> {
    /// Largest unscaled score seen per row (-inf before any).
    row_max: [[f32; 2]; M_TILES],
    /// This lane's part of the sum of `p` per row, relative to `row_max`;
    /// the quad's parts are added only at the end.
    row_sum: [[f32; 2]; M_TILES],
}

impl<const M_TILES: usize> OnlineSoftmax<M_TILES> {
    #[inline(always)]
    pub fn new() -> Self {
        Self { row_max: [[f32::NEG_INFINITY; 2]; M_TILES], row_sum: [[0.0; 2]; M_TILES] }
    }

    /// Turns the scores `s` of one key block into probabilities in place,
    /// moves each row's max, and rescales the row's sum and output `o`
    /// to the new max.
    #[inline(always)]
    pub fn update<const N_TILES: usize, const DIM_TILES: usize>(
        &mut self,
        s: &mut Accumulators<M_TILES, N_TILES>,
        o: &mut Accumulators<M_TILES, DIM_TILES>,
        scale_log2: f32,
    ) {
        for m in 0..M_TILES {
            for half in 0..2 {
                let mut block_max = self.row_max[m][half];
                for tile in s[m].iter() {
                    block_max = block_max.max(tile[2 * half]).max(tile[2 * half + 1]);
                }
                block_max = block_max.max(arch::shfl_xor_f32(block_max, 1));
                block_max = block_max.max(arch::shfl_xor_f32(block_max, 2));
                // A row with every score masked so far keeps max -inf; shift
                // by 0 then so that exp2(-inf - shift) is 0, not NaN.
                let shift = if block_max == f32::NEG_INFINITY { 0.0 } else { block_max * scale_log2 };
                let rescale = arch::exp2(self.row_max[m][half] * scale_log2 - shift);
                self.row_max[m][half] = block_max;
                let mut sum = self.row_sum[m][half] * rescale;
                for tile in o[m].iter_mut() {
                    tile[2 * half] *= rescale;
                    tile[2 * half + 1] *= rescale;
                }
                for tile in s[m].iter_mut() {
                    for score in &mut tile[2 * half..2 * half + 2] {
                        let p = arch::exp2(arch::fma(*score, scale_log2, -shift));
                        *score = p;
                        sum += p;
                    }
                }
                self.row_sum[m][half] = sum;
            }
        }
    }

    /// For row `half` of m-tile `m`: the factor that normalises its output
    /// (0 for a row with no unmasked key) and its natural log-sum-exp of the
    /// scaled scores (-inf for such a row).
    #[inline(always)]
    pub fn finish(&self, m: usize, half: usize, scale_log2: f32) -> (f32, f32) {
        let mut sum = self.row_sum[m][half];
        sum += arch::shfl_xor_f32(sum, 1);
        sum += arch::shfl_xor_f32(sum, 2);
        if sum > 0.0 {
            let lse_log2 = self.row_max[m][half] * scale_log2 + arch::log2(sum);
            (arch::recip(sum), lse_log2 * core::f32::consts::LN_2)
        } else {
            (0.0, f32::NEG_INFINITY)
        }
    }
}

/// Where a warp's scores sit in the attention matrix, for masking.
#[derive(Clone, Copy)]
pub struct ScoreMask {
    /// Query row of the lane's first score (m-tile 0, half 0).
    pub first_row: i32,
    /// Number of keys; later columns are masked.
    pub seqlen_k: i32,
    /// With causal masking, key `j` is visible from row `i` when
    /// `j <= i + diagonal` (`seqlen_k - seqlen_q`: bottom-right aligned).
    pub diagonal: i32,
}

impl ScoreMask {
    /// Sets to -inf every score of the key block starting at `first_key`
    /// that lies past the keys or, when `CAUSAL`, above the diagonal.
    #[inline(always)]
    pub fn apply<const CAUSAL: bool, const M_TILES: usize, const N_TILES: usize>(
        self,
        s: &mut Accumulators<M_TILES, N_TILES>,
        first_key: i32,
        lane: u32,
    ) {
        let lane_row = (lane / 4) as i32;
        let lane_key = first_key + 2 * (lane % 4) as i32;
        for (m, s_m) in s.iter_mut().enumerate() {
            for half in 0..2 {
                let row = self.first_row + lane_row + (m as i32) * 16 + (half as i32) * 8;
                let key_end = if CAUSAL { self.seqlen_k.min(row + self.diagonal + 1) } else { self.seqlen_k };
                for (n, tile) in s_m.iter_mut().enumerate() {
                    for c in 0..2 {
                        if lane_key + (n as i32) * 8 + c as i32 >= key_end {
                            tile[2 * half + c] = f32::NEG_INFINITY;
                        }
                    }
                }
            }
        }
    }
}

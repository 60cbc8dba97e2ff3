//! The online softmax of FlashAttention-2, row by row in registers, and the
//! score mask.
//!
//! A lane holds two rows of each m-tile (C-fragment rows g and g+8, "halves"
//! 0 and 1 below), each spread over the four lanes of its quad, so row
//! reductions finish with two butterfly shuffles. Scores stay unscaled; the
//! scale and the max are folded into one FMA in front of `ex2`:
//! `p = 2^(s * scale_log2 - max * scale_log2)`.

use crate::arch;
use crate::common::mma::Accumulators;
use crate::common::problem::Visibility;

/// How far (log2, scaled) a row's scores may rise above its reference max
/// before the references move: probabilities stay below 2^8, well inside
/// f16 and bf16, and most key blocks after the first move none.
pub const RESCALE_THRESHOLD_LOG2: f32 = 8.0;

/// What a row's scaled scores are shifted by before `exp2`: its scaled max,
/// or 0 for a row with every score masked so far (max -inf), so that
/// exp2(-inf - shift) is 0, not NaN.
#[inline(always)]
fn shift(max: f32, scale_log2: f32) -> f32 {
    if max == f32::NEG_INFINITY {
        0.0
    } else {
        max * scale_log2
    }
}

/// Running max and partial sum of each of the lane's rows.
pub struct OnlineSoftmax<const M_TILES: usize> {
    /// Reference max per row, unscaled: the largest score seen, or less by
    /// at most the rescale threshold (scaled); -inf before any.
    pub(crate) row_max: [[f32; 2]; M_TILES],
    /// This lane's part of the sum of `p` per row, relative to `row_max`;
    /// the quad's parts are added only at the end.
    pub(crate) row_sum: [[f32; 2]; M_TILES],
}

impl<const M_TILES: usize> OnlineSoftmax<M_TILES> {
    #[inline(always)]
    pub fn new() -> Self {
        Self { row_max: [[f32::NEG_INFINITY; 2]; M_TILES], row_sum: [[0.0; 2]; M_TILES] }
    }

    /// Turns the scores `s` of one key block into probabilities in place,
    /// relative to each row's reference max `row_max`: [`Self::rebase`],
    /// then [`Self::exponentiate`].
    #[inline(always)]
    pub fn update<const N_TILES: usize, const DIM_TILES: usize>(
        &mut self,
        s: &mut Accumulators<M_TILES, N_TILES>,
        o: &mut Accumulators<M_TILES, DIM_TILES>,
        scale_log2: f32,
    ) {
        self.rebase(s, &mut [[[0.0; 4]; 0]; M_TILES], o, scale_log2);
        self.exponentiate(s, scale_log2);
    }

    /// Moves the references to the scores `s` where they must. The
    /// references move (rescaling the rows' sums, their outputs `o` and the
    /// probabilities `done` of the same rows, not yet in `o`) only when
    /// some row of the warp sees a score more than
    /// [`RESCALE_THRESHOLD_LOG2`] above its reference, scaled: until then
    /// each `p` is at most 2^threshold, and the block skips the rescale's
    /// multiplies and its branch is uniform. A row rises that far exactly
    /// when one of its quad's lanes does, so the warp decides from each
    /// lane's own maxima; only a block whose references move reduces them
    /// over the quad (two shuffles per row), off the common path from Q K^T
    /// to P V (measured faster at d=128 than reducing every block;
    /// docs/tuning.md, the configuration of each kernel).
    #[inline(always)]
    pub fn rebase<const N_TILES: usize, const DONE_TILES: usize, const DIM_TILES: usize>(
        &mut self,
        s: &Accumulators<M_TILES, N_TILES>,
        done: &mut Accumulators<M_TILES, DONE_TILES>,
        o: &mut Accumulators<M_TILES, DIM_TILES>,
        scale_log2: f32,
    ) {
        let mut lane_max = self.row_max;
        let mut moves = false;
        for m in 0..M_TILES {
            for half in 0..2 {
                let mut max = lane_max[m][half];
                for tile in s[m].iter() {
                    max = max.max(tile[2 * half]).max(tile[2 * half + 1]);
                }
                lane_max[m][half] = max;
                // -inf references always move to a finite max (the
                // difference is +inf); rows still all -inf give NaN, false.
                moves |= (max - self.row_max[m][half]) * scale_log2 > RESCALE_THRESHOLD_LOG2;
            }
        }
        if arch::any_sync(moves) {
            for m in 0..M_TILES {
                for half in 0..2 {
                    let mut max = lane_max[m][half];
                    max = max.max(arch::shfl_xor_f32(max, 1));
                    max = max.max(arch::shfl_xor_f32(max, 2));
                    let rescale = self.move_row_max(m, half, max, o, scale_log2);
                    for tile in done[m].iter_mut() {
                        tile[2 * half] *= rescale;
                        tile[2 * half + 1] *= rescale;
                    }
                }
            }
        }
    }

    /// [`Self::rebase`] for a caller whose outputs are still being written
    /// (an asynchronous `O += P V` in flight): moves the references the
    /// same way but leaves the outputs alone, returning each row's rescale
    /// factor (`[m][half]`) when some reference moved, for the caller to
    /// apply to its outputs once they are its own again.
    #[inline(always)]
    pub fn rebase_deferred<const N_TILES: usize>(
        &mut self,
        s: &Accumulators<M_TILES, N_TILES>,
        scale_log2: f32,
    ) -> Option<[[f32; 2]; M_TILES]> {
        let mut lane_max = self.row_max;
        let mut moves = false;
        for m in 0..M_TILES {
            for half in 0..2 {
                for tile in s[m].iter() {
                    lane_max[m][half] = lane_max[m][half].max(tile[2 * half]).max(tile[2 * half + 1]);
                }
                moves |= (lane_max[m][half] - self.row_max[m][half]) * scale_log2 > RESCALE_THRESHOLD_LOG2;
            }
        }
        if !arch::any_sync(moves) {
            return None;
        }
        let mut factors = [[1.0; 2]; M_TILES];
        for m in 0..M_TILES {
            for half in 0..2 {
                let mut max = lane_max[m][half];
                max = max.max(arch::shfl_xor_f32(max, 1));
                max = max.max(arch::shfl_xor_f32(max, 2));
                factors[m][half] = self.move_row_max(m, half, max, &mut [[[0.0; 4]; 0]; M_TILES], scale_log2);
            }
        }
        Some(factors)
    }

    /// Turns the scores `s` into probabilities in place, relative to each
    /// row's reference, adding them to the rows' sums.
    #[inline(always)]
    pub fn exponentiate<const N_TILES: usize>(&mut self, s: &mut Accumulators<M_TILES, N_TILES>, scale_log2: f32) {
        for m in 0..M_TILES {
            for half in 0..2 {
                let shift = shift(self.row_max[m][half], scale_log2);
                let mut sum = self.row_sum[m][half];
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

    /// Moves the reference max of row `half` of m-tile `m` up to `max`,
    /// rescaling the row's sum and its outputs in `o` to it; returns the
    /// factor.
    #[inline(always)]
    pub fn move_row_max<const DIM_TILES: usize>(
        &mut self,
        m: usize,
        half: usize,
        max: f32,
        o: &mut Accumulators<M_TILES, DIM_TILES>,
        scale_log2: f32,
    ) -> f32 {
        let shift = shift(max, scale_log2);
        let rescale = arch::exp2(self.row_max[m][half] * scale_log2 - shift);
        self.row_max[m][half] = max;
        self.row_sum[m][half] *= rescale;
        for tile in o[m].iter_mut() {
            tile[2 * half] *= rescale;
            tile[2 * half + 1] *= rescale;
        }
        rescale
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
    /// Query row of the lane's first score (m-tile 0, half 0), before
    /// adding the lane's row in the fragment.
    pub first_row: i32,
    pub visibility: Visibility,
    /// The dense causal kernels (a window fixed to `right = 0`), which take
    /// [`Self::apply_causal`]; a constant of the kernel instance.
    pub causal: bool,
}

impl ScoreMask {
    /// Sets to -inf every score of the key block starting at `first_key`
    /// that its row does not see.
    #[inline(always)]
    pub fn apply<const M_TILES: usize, const N_TILES: usize>(
        self,
        s: &mut Accumulators<M_TILES, N_TILES>,
        first_key: i32,
        lane: u32,
    ) {
        if self.causal {
            return self.apply_causal(s, first_key, lane);
        }
        for_each_score(s, self.first_row, first_key, lane, |score, row, key| {
            let (key_begin, key_end) = self.visibility.keys_of_row(row);
            if key >= key_end || key < key_begin {
                *score = f32::NEG_INFINITY;
            }
        });
    }

    /// [`Self::apply`] for the dense causal kernels: masked where
    /// `key - row > diagonal`. A score's key and row are the lane's first
    /// ones plus constant offsets in the fragment, so this is one value per
    /// lane and block compared with a constant per score; comparing keys
    /// with each row's end instead keeps the four ends live through the
    /// masked steps (this form measured faster in the causal kernels;
    /// docs/tuning.md, d=128). Written out rather than through
    /// `for_each_score`, whose `key - row` LLVM compiles into a longer
    /// masked loop that holds one more register. Rows below seqlen_q never see past
    /// seqlen_k by the diagonal; the rows past it (zero-filled, never
    /// written) may see zero-filled keys past seqlen_k.
    #[inline(always)]
    fn apply_causal<const M_TILES: usize, const N_TILES: usize>(
        self,
        s: &mut Accumulators<M_TILES, N_TILES>,
        first_key: i32,
        lane: u32,
    ) {
        let lane_key = first_key + 2 * (lane % 4) as i32;
        let lane_row = self.first_row + (lane / 4) as i32;
        let lane_past_diagonal = lane_key - lane_row - self.visibility.diagonal;
        for (m, s_m) in s.iter_mut().enumerate() {
            for half in 0..2 {
                let row_offset = (m * 16 + half * 8) as i32;
                for (n, tile) in s_m.iter_mut().enumerate() {
                    for c in 0..2 {
                        let key_offset = (n * 8 + c) as i32;
                        if lane_past_diagonal > row_offset - key_offset {
                            tile[2 * half + c] = f32::NEG_INFINITY;
                        }
                    }
                }
            }
        }
    }
}

/// The dense causal mask on transposed scores (`S^T`, the sm_90a
/// backward's: a warp's 16 rows are keys from `first_key`, its columns
/// query rows from `first_row`): -inf where `key - row > diagonal`, as
/// [`ScoreMask::apply_causal`] with the roles of the fragment's rows and
/// columns swapped.
#[inline(always)]
pub fn mask_causal_transposed<const N_TILES: usize>(
    s: &mut Accumulators<1, N_TILES>,
    first_key: i32,
    first_row: i32,
    diagonal: i32,
    lane: u32,
) {
    let lane_key = first_key + (lane / 4) as i32;
    let lane_row = first_row + 2 * (lane % 4) as i32;
    let lane_past_diagonal = lane_key - lane_row - diagonal;
    for half in 0..2 {
        let key_offset = (half * 8) as i32;
        for (n, tile) in s[0].iter_mut().enumerate() {
            for c in 0..2 {
                let row_offset = (n * 8 + c) as i32;
                if lane_past_diagonal > row_offset - key_offset {
                    tile[2 * half + c] = f32::NEG_INFINITY;
                }
            }
        }
    }
}

/// The score modifiers of the general kernels, softcap and ALiBi. When
/// either is on, the scores become logits in log2 units before the softmax
/// (which then takes a scale of 1): `c log2(e) tanh(scale s / c)` with
/// softcap `c`, else `scale log2(e) s`, minus `slope log2(e) |i + diagonal - j|`.
#[derive(Clone, Copy)]
pub struct ScoreModifiers {
    pub scale_log2: f32,
    /// `scale / c` and `c log2(e)` (0 and 0: no softcap).
    pub softcap_scale: f32,
    pub softcap_log2: f32,
    /// `slope log2(e)` of the block's head (0: no ALiBi).
    pub alibi_slope_log2: f32,
    /// As [`ScoreMask::first_row`].
    pub first_row: i32,
    /// `seqlen_k - seqlen_q`.
    pub diagonal: i32,
}

impl ScoreModifiers {
    pub fn active(&self) -> bool {
        self.softcap_scale != 0.0 || self.alibi_slope_log2 != 0.0
    }

    /// The scale the softmax applies to the scores after [`Self::apply`].
    pub fn softmax_scale_log2(&self) -> f32 {
        if self.active() {
            1.0
        } else {
            self.scale_log2
        }
    }

    /// Turns the raw scores of the key block at `first_key` into logits.
    #[inline(always)]
    pub fn apply<const M_TILES: usize, const N_TILES: usize>(
        self,
        s: &mut Accumulators<M_TILES, N_TILES>,
        first_key: i32,
        lane: u32,
    ) {
        for m in 0..M_TILES {
            for n in 0..N_TILES {
                for score in s[m][n].iter_mut() {
                    *score = if self.softcap_scale != 0.0 {
                        self.softcap_log2 * tanh(*score * self.softcap_scale)
                    } else {
                        *score * self.scale_log2
                    };
                }
            }
        }
        if self.alibi_slope_log2 != 0.0 {
            for_each_score(s, self.first_row, first_key, lane, |score, row, key| {
                *score -= self.alibi_slope_log2 * (row + self.diagonal - key).unsigned_abs() as f32;
            });
        }
    }
}

/// Calls `f(score, row, key)` on each of the lane's scores of the key block
/// at `first_key`, for a warp whose first row is `first_row`: in the
/// m16n8 C fragment a lane holds rows `lane / 4` and `lane / 4 + 8` of each
/// m-tile, keys `2 (lane % 4)` and `2 (lane % 4) + 1` of each n-tile.
#[inline(always)]
fn for_each_score<const M_TILES: usize, const N_TILES: usize>(
    s: &mut Accumulators<M_TILES, N_TILES>,
    first_row: i32,
    first_key: i32,
    lane: u32,
    mut f: impl FnMut(&mut f32, i32, i32),
) {
    let lane_row = first_row + (lane / 4) as i32;
    let lane_key = first_key + 2 * (lane % 4) as i32;
    for (m, s_m) in s.iter_mut().enumerate() {
        for half in 0..2 {
            let row = lane_row + (m as i32) * 16 + (half as i32) * 8;
            for (n, tile) in s_m.iter_mut().enumerate() {
                for c in 0..2 {
                    f(&mut tile[2 * half + c], row, lane_key + (n as i32) * 8 + c as i32);
                }
            }
        }
    }
}

/// `tanh(x) = 1 - 2 / (e^(2x) + 1)`, from `ex2.approx` and `rcp.approx`:
/// an absolute error near 1e-7, and exactly +-1 where `e^(2x)` overflows
/// or vanishes.
#[inline(always)]
pub(crate) fn tanh(x: f32) -> f32 {
    1.0 - 2.0 * arch::recip(arch::exp2(x * (2.0 * core::f32::consts::LOG2_E)) + 1.0)
}

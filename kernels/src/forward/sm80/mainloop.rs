//! The key loop's step (`key_step!`): Q K^T,
//! score modifiers (general kernels), the mask where the block needs one,
//! the online softmax, P V, over the stage the K/V pipeline
//! ([`crate::forward::sm80::kv_pipeline`]) hands it.
//!
//! Contract: needs Q landed (the pipeline's prologue) and, at each step, the
//! stage the pipeline hands it; reads only that stage and the Q tile; issues
//! only the softmax's warp collectives itself, and the pipeline's waits,
//! barriers and copies where the pipeline's contract places them (the top of
//! the step, before P V); leaves the warp's softmax state and unnormalised O
//! over its key blocks (max -inf, sum 0, O = 0 for a warp that saw none)
//! for the epilogue.
//!
//! Why a macro, expanded in `forward_tile`, and not a function: the key
//! step as a function (`#[inline(always)]`, its masking a `const MASKED:
//! bool`, softmax state and O by `&mut`, the pipeline and the rest by
//! reference) changed the PTX of nearly every kernel, raised ptxas's
//! registers and spilled at d=128 (docs/tuning.md, ideas not adopted;
//! [`crate::forward::sm80`]). rustc's MIR inliner does not inline a function this
//! size, so LLVM's always-inliner inlines it before it simplifies, where the
//! same code written in the kernel body is simplified with it. The macro's
//! expansion is token for token the code it replaced, and the PTX is the
//! same byte for byte.

/// One step `$step` of the key loop (key block `n = n_end - 1 - step`),
/// `$masked` (a constant) when the caller knows the block needs the mask.
/// The remaining arguments name the kernel body's locals it reads (see
/// `forward_tile`); `$softmax` and `$o` it updates. Expanded where the
/// generic parameters of `forward_tile` (`K`, `HEAD_DIM`, `M_TILES`, ...)
/// are in scope.
macro_rules! key_step {
    (
        $step:expr, $masked:expr;
        $pipeline:ident, $n_end:ident, $n_begin:ident, $stages:ident, $block_n:ident, $first_row:ident,
        $last_row:ident, $visibility:ident, $mask:ident, $modifiers:ident, $q_operand:ident, $lane:ident,
        $scale_log2:ident, $softmax:ident, $o:ident
    ) => {{
        let step: u32 = $step;
        let n = $n_end - 1 - step;
        let (stage, next_stage) = match (K::STAGES as usize) {
            1 => (0, 0),
            2 => (step % 2, 1 - step % 2),
            _ => (step % $stages, (step + $stages - 1) % $stages),
        };
        let last = n == $n_begin;
        $crate::common::tile_copy::cp_async_wait_pending(match (K::STAGES as usize) {
            1 => 0,
            2 if !K::WAIT_KV_AT_TOP => 1,
            _ => 2 * ((K::STAGES as usize) - 2),
        });
        $pipeline.kv_barrier();
        if (K::STAGES as usize) == 1 {
            $pipeline.load_key_block($pipeline.v_tile(0), n, false, false);
        } else {
            $pipeline.prefetch(next_stage, step + $stages - 1, true);
        }

        let first_key = n * $block_n;
        if K::SOFTMAX_IN_HALVES {
            // The block in two halves of keys: the second half's Q K^T
            // runs beside the first half's exponentials, the first
            // half's P V beside the second half's (measured faster at
            // d=64: docs/tuning.md, d=64).
            let half_keys = $block_n / 2;
            let needs_mask = $masked
                || (!K::SPLIT_MASKED_STEPS && $visibility.block_needs_mask($first_row, $last_row, first_key, $block_n));
            // Scores into logits: modifiers, then the mask.
            let logits = |s: &mut $crate::common::mma::Accumulators<M_TILES, HALF_TILES>, first_key: u32| {
                if K::GENERAL && $modifiers.active() {
                    $modifiers.apply::<M_TILES, HALF_TILES>(s, first_key as i32, $lane);
                }
                if needs_mask {
                    $mask.apply::<M_TILES, HALF_TILES>(s, first_key as i32, $lane);
                }
            };
            let mut s_first =
                $crate::common::mma::scores::<K::Element, M_TILES, HALF_TILES, HEAD_DIM, HEAD_DIM_16, Q_IN_REGISTERS>(
                    &$q_operand,
                    $pipeline.k_tile(stage),
                    $lane,
                );
            logits(&mut s_first, first_key);
            $softmax.rebase(&s_first, &mut [[[0.0; 4]; 0]; M_TILES], &mut $o, $scale_log2);
            let mut s_second =
                $crate::common::mma::scores::<K::Element, M_TILES, HALF_TILES, HEAD_DIM, HEAD_DIM_16, Q_IN_REGISTERS>(
                    &$q_operand,
                    $crate::common::layout::SmemTile::at($pipeline.k_tile(stage).after_rows(half_keys)),
                    $lane,
                );
            $softmax.exponentiate(&mut s_first, $scale_log2);
            logits(&mut s_second, first_key + half_keys);
            $softmax.rebase(&s_second, &mut s_first, &mut $o, $scale_log2);
            $softmax.exponentiate(&mut s_second, $scale_log2);
            let p_first =
                $crate::common::mma::probabilities_as_a::<K::Element, M_TILES, HALF_TILES, HALF_STEPS>(&s_first);
            let p_second =
                $crate::common::mma::probabilities_as_a::<K::Element, M_TILES, HALF_TILES, HALF_STEPS>(&s_second);
            $crate::common::mma::accumulate_pv::<K::Element, M_TILES, HALF_STEPS, HEAD_DIM, DIM_TILES>(
                &mut $o,
                &p_first,
                $pipeline.v_tile(stage),
                $lane,
            );
            $crate::common::mma::accumulate_pv::<K::Element, M_TILES, HALF_STEPS, HEAD_DIM, DIM_TILES>(
                &mut $o,
                &p_second,
                $crate::common::layout::SmemTile::at($pipeline.v_tile(stage).after_rows(half_keys)),
                $lane,
            );
        } else {
            let mut s =
                $crate::common::mma::scores::<K::Element, M_TILES, N_TILES, HEAD_DIM, HEAD_DIM_16, Q_IN_REGISTERS>(
                    &$q_operand,
                    $pipeline.k_tile(stage),
                    $lane,
                );
            if K::GENERAL && $modifiers.active() {
                $modifiers.apply::<M_TILES, N_TILES>(&mut s, first_key as i32, $lane);
            }
            if $masked
                || (!K::SPLIT_MASKED_STEPS && $visibility.block_needs_mask($first_row, $last_row, first_key, $block_n))
            {
                $mask.apply::<M_TILES, N_TILES>(&mut s, first_key as i32, $lane);
            }
            $softmax.update(&mut s, &mut $o, $scale_log2);
            let p = $crate::common::mma::probabilities_as_a::<K::Element, M_TILES, N_TILES, N_STEPS>(&s);

            if (K::STAGES as usize) == 1 {
                $crate::arch::cp_async_wait::<0>(); // V[n] has landed
                $pipeline.kv_barrier(); // and every warp is done with K[n].
                if !last {
                    $pipeline.load_key_block($pipeline.k_tile(0), n - 1, true, true);
                }
            } else if (K::STAGES as usize) == 2 && !K::WAIT_KV_AT_TOP {
                if !last {
                    $crate::arch::cp_async_wait::<2>(); // V[n] has landed; K[n - 1], V[n - 1] may be in flight.
                } else {
                    $crate::arch::cp_async_wait::<0>();
                }
                $pipeline.kv_barrier();
            }
            $crate::common::mma::accumulate_pv::<K::Element, M_TILES, N_STEPS, HEAD_DIM, DIM_TILES>(
                &mut $o,
                &p,
                $pipeline.v_tile(stage),
                $lane,
            );
        }
    }};
}
pub(crate) use key_step;

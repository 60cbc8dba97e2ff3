//! The main backward kernel: one block per key block of
//! [`BACKWARD_BLOCK_N`] keys of one key/value head and batch (block x takes
//! key block `first_key_block + x`: in the deterministic mode, launches of
//! `dq_splits` key blocks each take them in turn).
//!
//! It loads its K and V once, then walks every query step (a block of
//! [`BACKWARD_BLOCK_M`] rows) of every query head of its group whose rows see
//! some of its keys. Per step, with `Q`, `dO`, the rows' LSE and delta in
//! shared memory:
//!
//! 1. scores: `S = Q K^T` and `dP = dO V^T`, then `P = exp(logits - LSE)`
//!    with the forward's score modifiers and mask, and `dS = P (dP -
//!    delta)` (times `1 - tanh^2` through a softcap), by warp `w` for rows
//!    `16 (w % 4)..` and its part `w / 4` of the keys; P and dS go to shared
//!    memory, rounded to the element type as the products take them;
//! 2. gradients: `dV += P^T dO` and `dK += dS^T Q` for keys `16 (w % 4)..`
//!    and the warp's part of the head dim, kept in registers through all
//!    steps; `dQ += dS K` for rows `16 (w % 4)..` and the same part of the
//!    head dim, added to the f32 accumulator with `red.global.add` (in
//!    the deterministic mode, to the block's split's own).
//!
//! The softmax scale multiplies dK at the end and dQ in
//! [`crate::backward::rows::finish_dq`]; dS itself is the gradient of the logits
//! (after the scale).
//!
//! Keys that no row sees get zero gradients; rows past the batch's
//! `seqlen_q` are zero-filled, with an LSE of +inf so that their P is 0.

use super::fragments::{
    accumulate_over_rows, rows_times_rows, ColumnsAsA, ColumnsAsB, FragmentsInTile, RowsAsA, RowsAsB,
};
use crate::arch;
use crate::backward::{row_offset, BatchRows};
use crate::common::element::Element;
use crate::common::layout::SmemTile;
use crate::common::problem::Visibility;
use crate::common::softmax::{tanh, ScoreMask, ScoreModifiers};
use crate::common::tile_copy::load_tile_async;
use flash_attn_abi::backward::{backward_config_of, BackwardParams, BACKWARD_BLOCK_M, BACKWARD_BLOCK_N};

/// Rows of each warp in a step, and keys of each warp in the block.
const WARP_ROWS: u32 = 16;
/// Row groups of a step (and key groups of the block).
const ROW_GROUPS: u32 = BACKWARD_BLOCK_M / WARP_ROWS;

/// The kernel body of the instance of `HEAD_DIM` and `E`. The const generics
/// are the array sizes Rust cannot derive in a generic context, asserted
/// against the config: `HEAD_DIM_16 = HEAD_DIM / 16`, `WARPS` (the
/// config's), `SCORE_TILES = BLOCK_N / (WARPS / 4) / 8` (a warp's 8-key
/// tiles of a score row), `GRAD_TILES = HEAD_DIM / (WARPS / 4) / 8` (its
/// 8-column tiles of a gradient row) and `DQ_TILES` (the config's
/// `dq_tiles`).
///
/// # Safety
/// `params` must describe tensors the host validated for this instance; the
/// launch must use `WARPS * 32` threads, the config's grid and shared
/// memory, after [`crate::backward::rows::prepare`] on the same params.
#[inline(always)]
pub unsafe fn backward_key_block<
    E: Element,
    const HEAD_DIM: usize,
    const HEAD_DIM_16: usize,
    const WARPS: usize,
    const SCORE_TILES: usize,
    const GRAD_TILES: usize,
    const DQ_TILES: usize,
>(
    params: &BackwardParams,
) {
    let config = const { backward_config_of(HEAD_DIM as u32) };
    const {
        let c = backward_config_of(HEAD_DIM as u32);
        let groups = c.column_groups() as usize;
        assert!(WARPS == c.warps as usize && HEAD_DIM_16 * 16 == HEAD_DIM);
        assert!(SCORE_TILES * 8 * groups == BACKWARD_BLOCK_N as usize);
        assert!(GRAD_TILES * 8 * groups == HEAD_DIM);
        assert!(GRAD_TILES == c.grad_tiles() as usize && DQ_TILES == c.dq_tiles() as usize);
    }
    let f = &params.forward;
    let tid = arch::thread_idx_x();
    let threads = (WARPS * 32) as u32;
    let (block_x, kv_head, batch) = (arch::block_idx_x(), arch::block_idx_y(), arch::block_idx_z());
    let n_block = params.first_key_block + block_x;
    // The accumulator this block adds dQ to: the one every block adds to,
    // or in the deterministic mode its split's own (split x of each of the
    // launches that take `dq_splits` key blocks at a time). There one
    // thread of one block at a time is the only one to add to each of its
    // elements (the same warp and lane owns the same rows and columns of
    // every step), and its atomic adds to one address take effect in
    // program order, the launches in stream order: the sums do not depend
    // on timing.
    let d_q_accum = if params.dq_splits > 0 {
        params.d_q_accum.offset((block_x as i64 * params.d_q_accum_split_stride) as isize)
    } else {
        params.d_q_accum
    };

    let rows = BatchRows::of(f, batch);
    let first_key = n_block * BACKWARD_BLOCK_N;
    if first_key >= rows.seqlen_k {
        return; // past this batch's keys (variable lengths)
    }
    let keys_in_block = (rows.seqlen_k - first_key).min(BACKWARD_BLOCK_N);
    let visibility = Visibility {
        seqlen_k: rows.seqlen_k as i32,
        diagonal: rows.seqlen_k as i32 - rows.seqlen_q as i32,
        left: f.window_left,
        right: f.window_right,
    };
    let (row_begin, row_end) = visibility.rows_seeing_keys(first_key, first_key + keys_in_block - 1, rows.seqlen_q);

    // Shared memory (the config's layout): Q, dO, LSE and delta of a step
    // in each of `stages` stages, `layout.stage` bytes apart.
    let stages = const { backward_config_of(HEAD_DIM as u32).stages };
    let smem = arch::dynamic_smem_base();
    let layout = config.layout();
    let q_tile = SmemTile::<HEAD_DIM>::at(smem + layout.q);
    let d_o_tile = SmemTile::<HEAD_DIM>::at(smem + layout.d_o);
    let k_tile = SmemTile::<HEAD_DIM>::at(smem + layout.k);
    let v_tile = SmemTile::<HEAD_DIM>::at(smem + layout.v);
    let p_tile = SmemTile::<{ BACKWARD_BLOCK_N as usize }>::at(smem + layout.p);
    let d_s_tile = SmemTile::<{ BACKWARD_BLOCK_N as usize }>::at(smem + layout.d_s);
    // LSE and delta are one run of 2 BLOCK_M f32 per stage, a thread's word each.
    const {
        let c = backward_config_of(HEAD_DIM as u32);
        assert!(c.layout().delta == c.layout().lse + 4 * BACKWARD_BLOCK_M && c.threads() >= 2 * BACKWARD_BLOCK_M);
    }
    let (lse_smem, delta_smem) = (smem + layout.lse, smem + layout.delta);
    let d_q_smem = smem + layout.d_q;

    // K and V of the block, once.
    let key_offset = |batch_stride: i64, row_stride: i64, head_stride: i64| {
        (rows.k_offset(batch_stride, row_stride) + row_offset(first_key, kv_head, row_stride, head_stride)) as isize
    };
    let k = f.k.offset(key_offset(f.k_batch_stride, f.k_row_stride, f.k_head_stride));
    let v = f.v.offset(key_offset(f.v_batch_stride, f.v_row_stride, f.v_head_stride));
    let block_n = BACKWARD_BLOCK_N;
    load_tile_async::<HEAD_DIM>(k_tile, block_n, k, f.k_row_stride as u32, keys_in_block, tid, threads, false);
    load_tile_async::<HEAD_DIM>(v_tile, block_n, v, f.v_row_stride as u32, keys_in_block, tid, threads, false);

    // The query steps: rows `first_step_row..row_end` in steps of BLOCK_M,
    // for each query head of the group in turn. `load_step` issues the
    // copies of a step's Q, dO, LSE and delta into a stage (rows past the
    // sequence zero-filled); the caller commits them.
    let first_step_row = row_begin / BACKWARD_BLOCK_M * BACKWARD_BLOCK_M;
    let first_head = kv_head * f.heads_per_kv;
    let last_head = first_head + f.heads_per_kv - 1;
    let load_step = |head: u32, first_row: u32, stage: u32| {
        let rows_in_step = (rows.seqlen_q - first_row).min(BACKWARD_BLOCK_M);
        let step_rows = |batch_stride: i64, row_stride: i64, head_stride: i64| {
            (rows.q_offset(batch_stride, row_stride) + row_offset(first_row, head, row_stride, head_stride)) as isize
        };
        let q = f.q.offset(step_rows(f.q_batch_stride, f.q_row_stride, f.q_head_stride));
        let d_o = params.d_o.offset(step_rows(params.d_o_batch_stride, params.d_o_row_stride, params.d_o_head_stride));
        let (block_m, stage_bytes) = (BACKWARD_BLOCK_M, stage * layout.stage);
        // %tid.x read here again: the copies' offsets from it are then
        // recomputed each step rather than held through the loop (a
        // register each per copy pass, spilled at d = 160-224).
        let tid = arch::thread_idx_x_here();
        let q_to = SmemTile::<HEAD_DIM>::at(smem + layout.q + stage_bytes);
        let d_o_to = SmemTile::<HEAD_DIM>::at(smem + layout.d_o + stage_bytes);
        load_tile_async::<HEAD_DIM>(q_to, block_m, q, f.q_row_stride as u32, rows_in_step, tid, threads, false);
        let d_o_stride = params.d_o_row_stride as u32;
        load_tile_async::<HEAD_DIM>(d_o_to, block_m, d_o, d_o_stride, rows_in_step, tid, threads, false);
        // Threads 0..BLOCK_M copy the rows' LSE, the next BLOCK_M their delta.
        if tid < 2 * BACKWARD_BLOCK_M {
            let row = tid % BACKWARD_BLOCK_M;
            let from = if tid < BACKWARD_BLOCK_M { f.lse } else { params.delta as *const f32 };
            let (src, bytes) = if row < rows_in_step {
                (from.offset(rows.lse_index(f, head, first_row + row) as isize), 4)
            } else {
                (from, 0)
            };
            arch::cp_async_4(lse_smem + stage_bytes + 4 * tid, src as *const u8, bytes);
        }
    };
    if first_step_row < row_end {
        load_step(first_head, first_step_row, 0);
    }
    arch::cp_async_commit(); // K, V and the first step

    // The operands, each a lane address (Q's and dO's in stage 0).
    let WarpPlace { lane, row: score_row, key: score_key, column_group } = WarpPlace::of::<WARPS>(tid);
    let (grad_row, groups) = (score_row, (WARPS / 4) as u32);
    let (q_rows, d_o_rows) = (RowsAsA::new(q_tile, score_row, lane), RowsAsA::new(d_o_tile, score_row, lane));
    let (k_rows, v_rows) = (RowsAsB::new(k_tile, score_key, lane), RowsAsB::new(v_tile, score_key, lane));
    let (p_columns, d_s_columns) = (ColumnsAsA::new(p_tile, grad_row, lane), ColumnsAsA::new(d_s_tile, grad_row, lane));
    let d_s_rows = RowsAsA::new(d_s_tile, grad_row, lane);
    let columns = |tile| ColumnsAsB::new(tile, column_group, groups, lane);
    let (q_columns, d_o_columns, k_columns) = (columns(q_tile), columns(d_o_tile), columns(k_tile));
    let p_out = FragmentsInTile::new(p_tile, score_row, score_key, lane);
    let d_s_out = FragmentsInTile::new(d_s_tile, score_row, score_key, lane);
    let mut d_k = [[0f32; 4]; GRAD_TILES];
    let mut d_v = [[0f32; 4]; GRAD_TILES];

    let softcap = f.softcap_scale != 0.0;
    let mut stage = 0;
    for head in first_head..=last_head {
        let alibi_slope_log2 = if f.alibi_slopes.is_null() {
            0.0
        } else {
            let slope = f.alibi_slopes.offset((batch as i64 * f.alibi_batch_stride + head as i64) as isize);
            arch::ld_global_f32(slope) * core::f32::consts::LOG2_E
        };
        let mut first_row = first_step_row;
        while first_row < row_end {
            let rows_in_step = (rows.seqlen_q - first_row).min(BACKWARD_BLOCK_M);
            let last_row = first_row + rows_in_step - 1;
            // The next step, into the other stage while this one computes
            // (with one stage, after it; worked out there, not held through
            // the step).
            let next = || {
                if first_row + BACKWARD_BLOCK_M < row_end {
                    Some((head, first_row + BACKWARD_BLOCK_M))
                } else if head < last_head {
                    Some((head + 1, first_step_row))
                } else {
                    None
                }
            };
            if stages == 2 {
                if let Some((next_head, next_row)) = next() {
                    load_step(next_head, next_row, 1 - stage);
                }
                arch::cp_async_commit();
                arch::cp_async_wait::<1>();
            } else {
                arch::cp_async_wait::<0>();
            }
            arch::sync_threads();
            let stage_bytes = stage * layout.stage;
            // What the warp works on, from %tid.x read again in the step:
            // from the one read before the loops, LLVM holds each row and
            // column derived from it (the mask's keys, dQ's rows and
            // columns) in a register of its own through them.
            let here = WarpPlace::of::<WARPS>(arch::thread_idx_x_here());
            let (lane, score_row, grad_row) = (here.lane, here.row, here.row);
            let (q_rows, d_o_rows) = (q_rows.moved(stage_bytes), d_o_rows.moved(stage_bytes));
            let (q_columns, d_o_columns) = (q_columns.moved(stage_bytes), d_o_columns.moved(stage_bytes));
            let (lse_smem, delta_smem) = (lse_smem + stage_bytes, delta_smem + stage_bytes);

            // 1. Scores, P and dS of the warp's rows and keys.
            let mut s = rows_times_rows::<E, SCORE_TILES, HEAD_DIM_16, HEAD_DIM>(q_rows, k_rows);
            let mut d_p = rows_times_rows::<E, SCORE_TILES, HEAD_DIM_16, HEAD_DIM>(d_o_rows, v_rows);
            // dS / P: `dP - delta`, times the softcap's derivative `1 - tanh^2`
            // (from the raw scores, before the modifiers replace them).
            for half in 0..2 {
                let delta = f32::from_bits(arch::ld_shared_u32(delta_smem + 4 * (score_row + lane / 4 + 8 * half)));
                for n in 0..SCORE_TILES {
                    for i in 2 * half as usize..2 * half as usize + 2 {
                        d_p[0][n][i] -= delta;
                        if softcap {
                            let t = tanh(s[0][n][i] * f.softcap_scale);
                            d_p[0][n][i] *= 1.0 - t * t;
                        }
                    }
                }
            }
            let modifiers = ScoreModifiers {
                scale_log2: f.scale_log2,
                softcap_scale: f.softcap_scale,
                softcap_log2: f.softcap_log2,
                alibi_slope_log2,
                first_row: (first_row + score_row) as i32,
                diagonal: visibility.diagonal,
            };
            let warp_first_key = (first_key + here.key) as i32;
            if modifiers.active() {
                modifiers.apply::<1, SCORE_TILES>(&mut s, warp_first_key, lane);
            }
            if visibility.block_needs_mask(first_row, last_row, first_key, BACKWARD_BLOCK_N) {
                let mask = ScoreMask { first_row: (first_row + score_row) as i32, visibility, causal: false };
                mask.apply::<1, SCORE_TILES>(&mut s, warp_first_key, lane);
            }
            let scale_log2 = modifiers.softmax_scale_log2();
            for half in 0..2 {
                let row = score_row + lane / 4 + 8 * half;
                // The LSE in log2; +inf where the row sees no key (an LSE of
                // -inf) or does not exist (zero-filled), so that P = 0.
                let lse = f32::from_bits(arch::ld_shared_u32(lse_smem + 4 * row));
                let lse_log2 = if row < rows_in_step && lse != f32::NEG_INFINITY {
                    lse * core::f32::consts::LOG2_E
                } else {
                    f32::INFINITY
                };
                for n in 0..SCORE_TILES {
                    let mut p = [0f32; 2];
                    let mut d_s = [0f32; 2];
                    for c in 0..2 {
                        let i = 2 * half as usize + c;
                        p[c] = arch::exp2(arch::fma(s[0][n][i], scale_log2, -lse_log2));
                        d_s[c] = p[c] * d_p[0][n][i];
                    }
                    arch::st_shared_u32(p_out.pair_addr(half, n as u32), E::pack(p[0], p[1]));
                    arch::st_shared_u32(d_s_out.pair_addr(half, n as u32), E::pack(d_s[0], d_s[1]));
                }
            }
            arch::sync_threads();

            // 2. Gradients: dV and dK of the warp's keys, then dQ of its rows.
            const STEP_K16: usize = (BACKWARD_BLOCK_M / 16) as usize;
            const BLOCK_K16: usize = (BACKWARD_BLOCK_N / 16) as usize;
            let p_t = |k| p_columns.load(k);
            accumulate_over_rows::<E, GRAD_TILES, STEP_K16, HEAD_DIM>(&mut d_v, p_t, d_o_columns, 0);
            let d_s_t = |k| d_s_columns.load(k);
            accumulate_over_rows::<E, GRAD_TILES, STEP_K16, HEAD_DIM>(&mut d_k, d_s_t, q_columns, 0);
            let d_s = |k| d_s_rows.load(k);
            // dQ of the warp's rows, a pass of DQ_TILES column tiles at a
            // time: the fragments to the warp's staging, then back as rows
            // of 8 words (4 rows per read), each added to the accumulator
            // as one whole 32-byte sector.
            let pitch = config.dq_pitch();
            for pass in 0..(GRAD_TILES / DQ_TILES) as u32 {
                let mut d_q = [[0f32; 4]; DQ_TILES];
                let first_slice = pass * (DQ_TILES / 2) as u32;
                accumulate_over_rows::<E, DQ_TILES, BLOCK_K16, HEAD_DIM>(&mut d_q, d_s, k_columns, first_slice);
                // Warp w's 16 rows start at row 16 w = grad_row + 64 column_group:
                // from values the step holds anyway.
                let staging = d_q_smem + (grad_row + ROW_GROUPS * WARP_ROWS * here.column_group) * pitch * 4;
                for half in 0..2 {
                    let row = lane / 4 + 8 * half;
                    for n in 0..DQ_TILES {
                        let (i, col) = (2 * half as usize, 8 * n as u32 + 2 * (lane % 4));
                        let pair = [d_q[n][i].to_bits(), d_q[n][i + 1].to_bits()];
                        arch::st_shared_v2(staging + 4 * (row * pitch + col), pair);
                    }
                }
                arch::sync_warp();
                for n in 0..DQ_TILES {
                    let col = tile_column(pass as usize * DQ_TILES + n, here.column_group, groups) + lane % 8;
                    for quarter in 0..4 {
                        let row = 4 * quarter + lane / 8;
                        let value = arch::ld_shared_u32(staging + 4 * (row * pitch + 8 * n as u32 + lane % 8));
                        if grad_row + row < rows_in_step {
                            let index = rows.lse_index(f, head, first_row + grad_row + row);
                            let accum = d_q_accum.offset((index * HEAD_DIM as i64) as isize);
                            arch::red_global_add_f32(accum.add(col as usize), f32::from_bits(value));
                        }
                    }
                }
                // The warp has read its staging before the next pass writes it.
                arch::sync_warp();
            }
            // Every warp is done with this stage's Q, dO, LSE and delta, and
            // with P and dS, before the next step's copies or scores write
            // over them.
            arch::sync_threads();
            if stages == 1 {
                if let Some((next_head, next_row)) = next() {
                    load_step(next_head, next_row, 0);
                    arch::cp_async_commit();
                }
            }
            stage = (stage + 1) % stages;
            first_row += BACKWARD_BLOCK_M;
        }
    }

    // K and V have landed even where no row sees the block (no step).
    arch::cp_async_wait::<0>();

    // dK (scaled) and dV of the warp's keys, in one loop: a closure called
    // once per gradient is not inlined at d = 256 (a call with a stack
    // frame). The warp's place from %tid.x read again, as in the steps.
    let WarpPlace { lane, row: grad_row, column_group, .. } = WarpPlace::of::<WARPS>(arch::thread_idx_x_here());
    let d_k_out = params.d_k.offset(key_offset(params.d_k_batch_stride, params.d_k_row_stride, params.d_k_head_stride));
    let d_v_out = params.d_v.offset(key_offset(params.d_v_batch_stride, params.d_v_row_stride, params.d_v_head_stride));
    let scale = params.softmax_scale;
    for half in 0..2 {
        let key = grad_row + lane / 4 + 8 * half;
        // Against the sequence's end rather than `keys_in_block`, which
        // would be one more value held through the query loops.
        if first_key + key < rows.seqlen_k {
            for n in 0..GRAD_TILES {
                let i = 2 * half as usize;
                let at = |dst: *mut u16, row_stride: i64| {
                    let col = tile_column(n, column_group, groups) + 2 * (lane % 4);
                    dst.offset(key as isize * row_stride as isize + col as isize) as *mut u32
                };
                arch::st_global_u32(
                    at(d_k_out, params.d_k_row_stride),
                    E::pack(d_k[n][i] * scale, d_k[n][i + 1] * scale),
                );
                arch::st_global_u32(at(d_v_out, params.d_v_row_stride), E::pack(d_v[n][i], d_v[n][i + 1]));
            }
        }
    }
}

/// What a thread's warp works on.
struct WarpPlace {
    lane: u32,
    /// Its first row of a step (scores, dQ) and key of the block (dK, dV):
    /// `16 (w % 4)`.
    row: u32,
    /// Its first key of a score row: part `w / 4` of the block's keys.
    key: u32,
    /// Its part of the head dim (gradients), `w / 4`.
    column_group: u32,
}

impl WarpPlace {
    #[inline(always)]
    fn of<const WARPS: usize>(tid: u32) -> Self {
        let (warp, lane) = (tid / 32, tid % 32);
        let column_group = warp / ROW_GROUPS;
        let key = column_group * BACKWARD_BLOCK_N / (WARPS / 4) as u32;
        WarpPlace { lane, row: warp % ROW_GROUPS * WARP_ROWS, key, column_group }
    }
}

/// The first column of a warp's gradient tile `n` (dK, dV, dQ): the head
/// dim's 16-column slices go round the `groups` column groups (as
/// [`ColumnsAsB`] reads them).
#[inline(always)]
fn tile_column(n: usize, column_group: u32, groups: u32) -> u32 {
    16 * ((n / 2) as u32 * groups + column_group) + 8 * (n % 2) as u32
}

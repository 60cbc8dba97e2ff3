//! The FlashAttention-2 forward kernel body.
//!
//! One block computes `block_m` query rows of one (batch, head): it streams
//! the key/value blocks through two shared-memory stages each, from the last
//! block to the first (so the masked blocks come first), keeping O, the
//! scores and the softmax state of its rows in registers. The loads of the
//! next K tile overlap the softmax and P V; the load of the current V tile
//! overlaps Q K^T.

use crate::arch;
use crate::element::Element;
use crate::epilogue::{self, OutputRows};
use crate::layout::SmemTile;
use crate::mma;
use crate::params::ForwardParams;
use crate::pipeline::load_tile_async;
use crate::softmax::{OnlineSoftmax, ScoreMask};

/// The kernel body, instantiated per element type, masking and tile shape.
/// The derived shape parameters must agree (`HEAD_DIM_16 = HEAD_DIM / 16`,
/// `DIM_TILES = HEAD_DIM / 8`, `N_TILES = BLOCK_N / 8`,
/// `N_STEPS = BLOCK_N / 16`); they are asserted at compile time.
///
/// # Safety
/// `params` must describe tensors the host validated for this instance, and
/// the launch must use `WARPS * 32` threads, a grid of
/// `(ceil(seqlen_q / block_m), heads_q, batch)` and the shared-memory size
/// of the tile config.
#[inline(always)]
pub unsafe fn flash_forward<
    E: Element,
    const CAUSAL: bool,
    const HEAD_DIM: usize,
    const HEAD_DIM_16: usize,
    const DIM_TILES: usize,
    const BLOCK_N: usize,
    const N_TILES: usize,
    const N_STEPS: usize,
    const WARPS: usize,
    const M_TILES: usize,
>(
    params: &ForwardParams,
) {
    const {
        assert!(HEAD_DIM_16 * 16 == HEAD_DIM && DIM_TILES * 8 == HEAD_DIM);
        assert!(N_TILES * 8 == BLOCK_N && N_STEPS * 16 == BLOCK_N);
    }
    let threads = (WARPS * 32) as u32;
    let block_m = (WARPS * 16 * M_TILES) as u32;
    let block_n = BLOCK_N as u32;

    let tid = arch::thread_idx_x();
    let warp = tid / 32;
    let lane = tid % 32;
    // Causal blocks with more rows have more keys: launch those first.
    let m_block = if CAUSAL { arch::grid_dim_x() - 1 - arch::block_idx_x() } else { arch::block_idx_x() };
    let head = arch::block_idx_y();
    let batch = arch::block_idx_z();
    // The host guarantees heads_per_kv >= 1; saying so drops the divide-by-zero panic path.
    core::hint::assert_unchecked(params.heads_per_kv != 0);
    let kv_head = head / params.heads_per_kv;

    let seqlen_q = params.seqlen_q;
    let seqlen_k = params.seqlen_k;
    let first_row = m_block * block_m;
    let rows_in_block = (seqlen_q - first_row).min(block_m);

    let q = params.q.offset(
        (batch as i64 * params.q_batch_stride
            + first_row as i64 * params.q_row_stride
            + head as i64 * params.q_head_stride) as isize,
    );
    let k = params.k.offset((batch as i64 * params.k_batch_stride + kv_head as i64 * params.k_head_stride) as isize);
    let v = params.v.offset((batch as i64 * params.v_batch_stride + kv_head as i64 * params.v_head_stride) as isize);

    // Key blocks this query block sees: all of them, or with causal masking
    // those left of the diagonal through its last row (none for rows that
    // see no key at all).
    let diagonal = seqlen_k as i32 - seqlen_q as i32;
    let key_blocks = seqlen_k.div_ceil(block_n);
    let n_blocks = if CAUSAL {
        let keys_seen = (first_row + block_m) as i32 + diagonal;
        if keys_seen <= 0 {
            0
        } else {
            key_blocks.min((keys_seen as u32).div_ceil(block_n))
        }
    } else {
        key_blocks
    };

    // Shared memory: Q (later the O staging tile), K stages 0/1, V stages 0/1.
    let smem = arch::dynamic_smem_base();
    let q_tile = SmemTile::<HEAD_DIM>::at(smem);
    // Stage addresses are computed, not indexed from an array, so that no
    // array of them lands in local memory.
    let k_tile = |stage: u32| SmemTile::<HEAD_DIM>::at(q_tile.after_rows(block_m + stage * block_n));
    let v_tile = |stage: u32| SmemTile::<HEAD_DIM>::at(q_tile.after_rows(block_m + (2 + stage) * block_n));
    let load_key_block = |tile: SmemTile<HEAD_DIM>, src: *const u16, row_stride: i64, n: u32| {
        let first_key = n * block_n;
        load_tile_async::<HEAD_DIM>(
            tile,
            block_n,
            src.offset((first_key as i64 * row_stride) as isize),
            row_stride,
            seqlen_k - first_key,
            tid,
            threads,
        );
        arch::cp_async_commit();
    };

    load_tile_async::<HEAD_DIM>(q_tile, block_m, q, params.q_row_stride, rows_in_block, tid, threads);
    arch::cp_async_commit();
    if n_blocks > 0 {
        load_key_block(k_tile(0), k, params.k_row_stride, n_blocks - 1);
        arch::cp_async_wait::<1>();
    } else {
        arch::cp_async_wait::<0>();
    }
    arch::sync_threads();

    let warp_first_row = warp * 16 * M_TILES as u32;
    let q_frags = mma::load_q_fragments::<M_TILES, HEAD_DIM, HEAD_DIM_16>(q_tile, warp_first_row, lane);
    let mask = ScoreMask { first_row: (first_row + warp_first_row) as i32, seqlen_k: seqlen_k as i32, diagonal };
    let mut softmax = OnlineSoftmax::<M_TILES>::new();
    let mut o = [[[0f32; 4]; DIM_TILES]; M_TILES];

    for step in 0..n_blocks {
        let n = n_blocks - 1 - step;
        let stage = step % 2;
        load_key_block(v_tile(stage), v, params.v_row_stride, n);
        arch::cp_async_wait::<1>(); // K[n] has landed; V[n] may be in flight.
        arch::sync_threads();

        let mut s = mma::scores::<E, M_TILES, N_TILES, HEAD_DIM, HEAD_DIM_16>(&q_frags, k_tile(stage), lane);
        if n > 0 {
            // The other K stage held K[n + 1], which every warp finished
            // reading before the barrier above.
            load_key_block(k_tile(1 - stage), k, params.k_row_stride, n - 1);
        }
        let first_key = n * block_n;
        let ragged = first_key + block_n > seqlen_k;
        let crosses_diagonal = CAUSAL && (first_key + block_n) as i32 > first_row as i32 + diagonal + 1;
        if ragged || crosses_diagonal {
            mask.apply::<CAUSAL, M_TILES, N_TILES>(&mut s, first_key as i32, lane);
        }
        softmax.update(&mut s, &mut o, params.scale_log2);
        let p = mma::probabilities_as_a::<E, M_TILES, N_TILES, N_STEPS>(&s);

        if n > 0 {
            arch::cp_async_wait::<1>();
        } else {
            arch::cp_async_wait::<0>();
        }
        arch::sync_threads();
        mma::accumulate_pv::<E, M_TILES, N_STEPS, HEAD_DIM, DIM_TILES>(&mut o, &p, v_tile(stage), lane);
    }

    // Each warp stages O in its own rows of the Q tile, which only it read.
    let out = OutputRows {
        first_row: warp_first_row,
        o: params.o.wrapping_offset(
            (batch as i64 * params.o_batch_stride
                + (first_row + warp_first_row) as i64 * params.o_row_stride
                + head as i64 * params.o_head_stride) as isize,
        ),
        o_row_stride: params.o_row_stride,
        lse: params.lse.wrapping_add(
            ((batch * params.heads_q + head) as usize) * seqlen_q as usize + (first_row + warp_first_row) as usize,
        ),
        valid_rows: rows_in_block.saturating_sub(warp_first_row),
    };
    epilogue::write_output::<E, M_TILES, DIM_TILES, HEAD_DIM>(&o, &softmax, params.scale_log2, q_tile, out, lane);
}

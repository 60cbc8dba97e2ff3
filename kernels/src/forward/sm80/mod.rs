//! The FlashAttention-2 forward kernel body, in two parts:
//!
//! - [`flash_forward`], the kernel loop: it asks the kernel's block
//!   scheduler ([`crate::forward::sm80::schedule`]) for work tiles and runs each. With the
//!   one-shot scheduler of every shipped kernel this is the tile run once.
//! - `forward_tile`, one work tile: `block_m` query rows of one (batch,
//!   head) against the key blocks they see ([`crate::common::problem`]): the
//!   scheduler's tile, its sequence and visibility, then the K/V pipeline's
//!   prologue ([`crate::forward::sm80::kv_pipeline`]: Q's copy, the K/V shared-memory
//!   stages, every `cp.async` wait, barrier and prefetch), the key loop over
//!   its steps ([`crate::forward::sm80::mainloop`]: Q K^T, score modifiers, mask, online
//!   softmax, P V), then the epilogue ([`epilogue::write_tile`]:
//!   [`crate::forward::sm80::warp_merge`], then O and the LSE or a split's partials). Each
//!   of the three modules states its contract.
//!
//! The tile streams its key blocks through `stages` shared-memory stages
//! each of K and V, from the last block to the first (so the masked blocks
//! come first), keeping O, the scores and the softmax state of its rows in
//! registers. With two or more stages, the loads of K and V `stages - 1`
//! blocks ahead are issued at the top of each step and overlap at least its
//! whole Q K^T, softmax and P V; with one, each of K and V loads while the
//! other is in use.
//!
//! In the decode kernels the warps split the keys instead of the rows: all
//! share the block's 16 query rows, each runs the key loop over its own
//! part of the block's key blocks through its own stages (with warp
//! barriers only), and [`crate::forward::sm80::warp_merge`] merges them at the end.
//!
//! Why the pipeline is the types it is and the key step a macro (not a
//! function), each in its module: the PTX depends on more than what the
//! code computes. LLVM inlines every `#[inline(always)]` function of the
//! kernel that rustc's MIR inliner left in the order of their symbols,
//! before it simplifies, and inlines an `#[inline]` one (as rustc marks
//! closures) only after simplifying it; which values cross a function
//! boundary, and in what form, decides how the inlined code is folded.
//! Other forms were measured to change the PTX, some with spills at d=128
//! (docs/tuning.md, ideas not adopted), where the kernels' speed at 255
//! registers depends on it. The scheduler, the tile function and the
//! epilogue function do not change it. The pipeline's waits and barriers
//! at the top of a step and before its P V, and its prologue, stay in the
//! key step and here, spelled out: as `KvPipeline` methods they changed the
//! PTX of many kernels, and as `#[inline]` methods they spilled.

pub mod epilogue;
pub mod kernel;
pub mod kv_pipeline;
pub mod mainloop;
pub mod schedule;
pub mod warp_merge;

use crate::arch;
use crate::common::layout::SmemTile;
use crate::common::mma;
use crate::common::problem::{split_key_blocks, Sequence, Visibility};
use crate::common::softmax::{OnlineSoftmax, ScoreMask, ScoreModifiers};
use crate::common::tile_copy::{cp_async_wait_pending, load_tile_async};
use crate::params::ForwardParams;
use epilogue::TileRows;
use kernel::ForwardKernel;
use kv_pipeline::{KStages, KeyBlockLoader, KvPipeline, KvThread, VStages};
use schedule::{TileScheduler, WorkTile};

/// The kernel body of the instance `K` ([`ForwardKernel`]: element type,
/// variant, tile config and scheduler, one value). The const generics are
/// the array sizes, which Rust cannot derive from `K::CONFIG` in a generic
/// context, and the Q operand's form, a type parameter of
/// [`mma::QOperand`]; they are asserted at compile time to agree with the
/// config: `HEAD_DIM`, `HEAD_DIM_16 = HEAD_DIM / 16`,
/// `DIM_TILES = HEAD_DIM / 8`, `N_TILES = block_n / 8`,
/// `N_STEPS = block_n / 16`, `M_TILES = m_tiles`,
/// `Q_IN_REGISTERS = q_in_registers`, `HALF_TILES = N_TILES / 2` and
/// `HALF_STEPS = N_STEPS / 2`.
///
/// The loop over work tiles synchronises the block between two tiles (the
/// next tile's prologue overwrites the Q tile and the stages). With a
/// scheduler that is not [`TileScheduler::PERSISTENT`] it stops after the
/// first tile as it compiles: no loop reaches LLVM.
///
/// # Safety
/// `params` must describe tensors the host validated for this instance, and
/// the launch must use `warps * 32` threads, the scheduler's grid (for
/// [`crate::forward::sm80::schedule::OneShot`]
/// `(num_splits * ceil(seqlen_q / block_m), heads_q, batch)`) and the
/// shared-memory size of the tile config.
#[inline(always)]
pub unsafe fn flash_forward<
    K: ForwardKernel,
    const HEAD_DIM: usize,
    const HEAD_DIM_16: usize,
    const DIM_TILES: usize,
    const N_TILES: usize,
    const N_STEPS: usize,
    const M_TILES: usize,
    const Q_IN_REGISTERS: bool,
    const HALF_TILES: usize,
    const HALF_STEPS: usize,
>(
    params: &ForwardParams,
) {
    const {
        let c = K::CONFIG;
        let (head_dim, block_n, stages, warps) = (c.head_dim as usize, c.block_n as usize, c.stages, c.warps);
        // The array sizes and the Q operand's form agree with the config.
        assert!(HEAD_DIM == head_dim && M_TILES == c.m_tiles as usize && Q_IN_REGISTERS == c.q_in_registers);
        assert!(HEAD_DIM_16 * 16 == HEAD_DIM && DIM_TILES * 8 == HEAD_DIM);
        assert!(N_TILES * 8 == block_n && N_STEPS * 16 == block_n);
        assert!(HALF_TILES * 2 == N_TILES && HALF_STEPS * 2 == N_STEPS);
        assert!(c.block_m == if c.warps_split_keys { 16 } else { warps * 16 } * c.m_tiles);
        // The derived constants are the config's.
        assert!(K::CAUSAL == matches!(K::VARIANT, flash_attn_abi::kernels::Variant::Causal));
        assert!(K::GENERAL == K::VARIANT.is_general());
        assert!(K::BLOCK_M == c.block_m && K::BLOCK_N == c.block_n && K::WARPS == warps && K::THREADS == warps * 32);
        assert!(K::M_TILES == c.m_tiles && K::STAGES == stages && K::Q_IN_REGISTERS == c.q_in_registers);
        assert!(K::WARPS_SPLIT_KEYS == c.warps_split_keys && K::WAIT_KV_AT_TOP == c.wait_kv_at_top);
        assert!(K::SPLIT_MASKED_STEPS == c.split_masked_steps && K::SOFTMAX_IN_HALVES == c.softmax_in_halves);
        assert!(K::REDERIVE_COPY_OFFSETS == c.rederive_copy_offsets);
        // The flags are consistent.
        assert!(!c.softmax_in_halves || stages > 2 || c.wait_kv_at_top, "halves need V landed at the top of the step");
        assert!(!(K::CAUSAL && K::GENERAL), "general kernels take causal masking as a window");
        assert!(stages >= 1 && stages <= 4);
        assert!(!c.wait_kv_at_top || stages == 2, "only the two-stage loop has a choice of waits");
        assert!(!c.split_masked_steps || !K::GENERAL, "only the dense kernels know their masked blocks up front");
        assert!(!c.warps_split_keys || K::GENERAL, "only the general kernels split the keys among warps");
        // The merge's scratch overlays the warps' K/V stages.
        assert!(
            !c.warps_split_keys
                || warp_merge::scratch_bytes(warps, c.m_tiles, DIM_TILES as u32)
                    <= warps * 2 * stages * c.block_n * crate::config::smem_row_bytes(c.head_dim)
        );
    }
    // %tid.x is read before the scheduler runs, as the body read it before
    // it had one (the same PTX); it is the same for every tile.
    let tid = arch::thread_idx_x();
    let mut tile = K::Scheduler::initial::<K>(params);
    loop {
        forward_tile::<
            K,
            HEAD_DIM,
            HEAD_DIM_16,
            DIM_TILES,
            N_TILES,
            N_STEPS,
            M_TILES,
            Q_IN_REGISTERS,
            HALF_TILES,
            HALF_STEPS,
        >(params, tile, tid);
        if !K::Scheduler::PERSISTENT {
            break;
        }
        match K::Scheduler::next::<K>(params, &tile) {
            Some(next) => {
                // The next tile's prologue overwrites the Q tile and the
                // stages, which this tile's last steps and epilogue read.
                arch::sync_threads();
                tile = next;
            }
            None => break,
        }
    }
}

/// One work tile, by every thread of the block (`tid` its %tid.x). Returns
/// early, every thread alike, for a tile past its batch's queries (variable
/// lengths); warps 1.. of a decode block return after the merge.
#[inline(always)]
unsafe fn forward_tile<
    K: ForwardKernel,
    const HEAD_DIM: usize,
    const HEAD_DIM_16: usize,
    const DIM_TILES: usize,
    const N_TILES: usize,
    const N_STEPS: usize,
    const M_TILES: usize,
    const Q_IN_REGISTERS: bool,
    const HALF_TILES: usize,
    const HALF_STEPS: usize,
>(
    params: &ForwardParams,
    tile: WorkTile,
    tid: u32,
) {
    // The tile's parts read the config's constants through `K`, written
    // (`(K::STAGES as usize)`, casts and all) as the usize const generics
    // they replaced were: shorter forms of the same constants change the
    // MIR, and with it the PTX (above).
    let warp = tid / 32;
    let lane = tid % 32;
    let threads = ((K::WARPS as usize) * 32) as u32;
    let block_m = (if K::WARPS_SPLIT_KEYS { 16 * M_TILES } else { (K::WARPS as usize) * 16 * M_TILES }) as u32;
    let block_n = (K::BLOCK_N as usize) as u32;

    let WorkTile { m_block, split, head, batch } = tile;
    // The host guarantees heads_per_kv >= 1; saying so drops the divide-by-zero panic path.
    core::hint::assert_unchecked(params.heads_per_kv != 0);
    let kv_head = head / params.heads_per_kv;

    let seq = Sequence::of_batch::<K>(params, batch);
    let first_row = m_block * block_m;
    if K::GENERAL && first_row >= seq.seqlen_q {
        return; // past this batch's queries (variable lengths)
    }
    let rows_in_block = (seq.seqlen_q - first_row).min(block_m);
    let last_row = first_row + rows_in_block - 1;
    let visibility = Visibility::of::<K>(params, &seq);
    let (mut n_begin, mut n_end) = visibility.key_blocks(first_row, last_row, block_n);
    if K::GENERAL && params.num_splits > 1 {
        (n_begin, n_end) = split_key_blocks(n_begin, n_end, split, params.num_splits);
    }
    if K::WARPS_SPLIT_KEYS {
        (n_begin, n_end) = split_key_blocks(n_begin, n_end, warp, (K::WARPS as usize) as u32);
    }
    if !K::CAUSAL && !K::GENERAL {
        // Every row sees all of seqlen_k >= 1 keys (the host refuses empty
        // tensors). Saying so drops the key loop's zero-trip path, whose
        // live values spill one register at d=128 (sm_80).
        core::hint::assert_unchecked(n_end > n_begin);
    }
    // ---- The K/V pipeline ([`KvPipeline`], whose doc states its
    // contract): its parts hold references to these locals, as the closures
    // they replaced captured them.
    let kv_threads = if K::WARPS_SPLIT_KEYS { 32 } else { threads };
    let q = params
        .q
        .offset((seq.q_offset + first_row as i64 * params.q_row_stride + head as i64 * params.q_head_stride) as isize);
    let k = params.k.offset((seq.k_offset + kv_head as i64 * params.k_head_stride) as isize);
    let v = params.v.offset((seq.v_offset + kv_head as i64 * params.v_head_stride) as isize);

    // Shared memory: Q (later the O staging tile), then per stage set (one
    // per warp when the warps split the keys) the K stages and the V stages.
    let smem = arch::dynamic_smem_base();
    let q_tile = SmemTile::<HEAD_DIM>::at(smem);
    let stages = (K::STAGES as usize) as u32;
    let first_stage_row = block_m + if K::WARPS_SPLIT_KEYS { warp * 2 * stages * block_n } else { 0 };
    let kv_thread = KvThread::<K> { tid: &tid, kernel: core::marker::PhantomData };
    let k_stages = KStages::<HEAD_DIM> { q_tile: &q_tile, first_stage_row: &first_stage_row, block_n: &block_n };
    let v_stages =
        VStages::<HEAD_DIM> { q_tile: &q_tile, first_stage_row: &first_stage_row, stages: &stages, block_n: &block_n };
    let loader = KeyBlockLoader::<K, HEAD_DIM> {
        block_n: &block_n,
        seq: &seq,
        params,
        k: &k,
        v: &v,
        kv_thread: &kv_thread,
        kv_threads: &kv_threads,
    };
    let pipeline = KvPipeline::<K, HEAD_DIM> {
        n_end: &n_end,
        n_begin: &n_begin,
        loader: &loader,
        k_stages: &k_stages,
        v_stages: &v_stages,
    };

    // Prologue: Q, then blocks n_end - 1 .. n_end - (stages - 1) into stages
    // 0 .. stages - 2 (one stage: K of the first block); wait for Q only.
    load_tile_async::<HEAD_DIM>(q_tile, block_m, q, params.q_row_stride as u32, rows_in_block, tid, threads, K::CAUSAL);
    arch::cp_async_commit();
    if (K::STAGES as usize) == 1 {
        if n_end > n_begin {
            pipeline.load_key_block(pipeline.k_tile(0), n_end - 1, true, false);
        }
    } else {
        for stage in 0..stages - 1 {
            pipeline.prefetch(stage, stage, stage > 0);
        }
    }
    if (K::STAGES as usize) > 2 || n_end > n_begin {
        cp_async_wait_pending(if (K::STAGES as usize) == 1 { 1 } else { 2 * ((K::STAGES as usize) - 1) });
    } else {
        arch::cp_async_wait::<0>();
    }
    arch::sync_threads(); // Q has landed for every warp.

    // ---- The key loop, per warp: [`crate::forward::sm80::mainloop`]'s `key_step!` (Q K^T,
    // score modifiers, mask, online softmax, P V), whose doc states its
    // contract, over the steps below.
    let warp_first_row = if K::WARPS_SPLIT_KEYS { 0 } else { warp * 16 * M_TILES as u32 };
    let q_operand = mma::QOperand::<M_TILES, HEAD_DIM, HEAD_DIM_16, Q_IN_REGISTERS>::new(q_tile, warp_first_row, lane);
    let mask = ScoreMask { first_row: (first_row + warp_first_row) as i32, visibility, causal: K::CAUSAL };
    let modifiers = ScoreModifiers {
        scale_log2: params.scale_log2,
        softcap_scale: if K::GENERAL { params.softcap_scale } else { 0.0 },
        softcap_log2: params.softcap_log2,
        alibi_slope_log2: if K::GENERAL && !params.alibi_slopes.is_null() {
            let slope = params.alibi_slopes.offset((batch as i64 * params.alibi_batch_stride + head as i64) as isize);
            arch::ld_global_f32(slope) * core::f32::consts::LOG2_E
        } else {
            0.0
        },
        first_row: mask.first_row,
        diagonal: visibility.diagonal,
    };
    let scale_log2 = modifiers.softmax_scale_log2();
    let mut softmax = OnlineSoftmax::<M_TILES>::new();
    let mut o = [[[0f32; 4]; DIM_TILES]; M_TILES];

    // The pipeline, by stage count:
    // - one (FlashAttention-2's): V[n] loads during Q K^T and the softmax,
    //   K[n - 1] during P V; two waits and two barriers per step.
    // - two or more: the groups in flight at the top of step n are K and V
    //   of blocks n down to n - (stages - 2). The top barrier says every
    //   warp is done with the stage of block n + 1, which then takes block
    //   n - (stages - 1). Two stages wait for K[n] only at the top, then for
    //   V[n] before P V behind a second barrier, so that V's copies have the
    //   Q K^T and softmax longer to land, unless `wait_kv_at_top`; more
    //   stages, and two with `wait_kv_at_top`, wait for both at the top, one
    //   barrier per step (each block's copies still had a whole step).
    // With `split_masked_steps` the key loop runs in two copies: the first
    // steps (the last key blocks: the diagonal, seqlen_k's end) with the
    // mask, the rest without, so the unmasked steps carry no mask code or
    // branch. Else one loop decides per block.
    let masked_steps = if K::SPLIT_MASKED_STEPS {
        n_end - n_end.min(n_begin.max(visibility.first_block_past_row_end(first_row, block_n)))
    } else {
        0
    };
    macro_rules! key_step {
        ($step:expr, $masked:expr) => {
            crate::forward::sm80::mainloop::key_step!(
                $step, $masked;
                pipeline, n_end, n_begin, stages, block_n, first_row, last_row, visibility,
                mask, modifiers, q_operand, lane, scale_log2, softmax, o
            )
        };
    }
    if K::CAUSAL {
        for step in 0..masked_steps {
            key_step!(step, true);
        }
    } else if masked_steps > 0 {
        // Without causal masking only seqlen_k's end, loop order's first
        // block, may need the mask.
        key_step!(0, true);
    }
    for step in masked_steps..n_end - n_begin {
        key_step!(step, false);
    }

    let rows = TileRows { first_row, warp_first_row, rows_in_block };
    epilogue::write_tile::<K, M_TILES, DIM_TILES, HEAD_DIM>(
        params,
        &tile,
        &seq,
        rows,
        &mut softmax,
        &mut o,
        scale_log2,
        q_tile,
        tid,
        lane,
    );
}

//! The planner's tests: which kernel, grid, split and scratch each call
//! gets, through [`plan_for`] as the runtime calls it.

use flash_attn_abi::config;
use flash_attn_abi::hopper::HopperScratch;
use flash_attn_abi::kernels::{AttentionKernel, Dtype, Variant};
use flash_attn_abi::params::ForwardParams;

use super::kernels::SCRATCH_ALIGN;
use super::{num_splits_heuristic, plan_for, KernelArgs, KernelFamily, Launch, OutputAddrs, Plan, Sm80Plan, Sm90Plan};
use super::{Family, Kernel, MIN_KEY_BLOCKS_PER_SPLIT};
use crate::call::{CacheLengths, Call, LseLayout, Mask, Outputs, Problem, Sequences, TensorAt};
use crate::error::{Error, Result};
use crate::limits::MAX_SPLITS;

/// H100: 132 SMs; say 6 decode CTAs or 2 prefill CTAs per SM.
pub(super) fn h100(kernel: &AttentionKernel) -> usize {
    match kernel.variant {
        Variant::Decode => 132 * 6,
        _ => 132 * 2,
    }
}

/// Contiguous q/o `[batch, seqlen_q, heads_q, d]`, k/v `[batch, seqlen_k, heads_kv, d]`, f16.
pub(super) fn call(batch: usize, seqlen_q: usize, seqlen_k: usize, heads_q: usize, heads_kv: usize, d: usize) -> Call {
    let at = |addr: u64, s: usize, h: usize| TensorAt { addr, strides: [(s * h * d) as i64, (h * d) as i64, d as i64] };
    Call {
        dtype: Dtype::F16,
        problem: Problem { batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim: d },
        q: at(4096, seqlen_q, heads_q),
        k: at(8192, seqlen_k, heads_kv),
        v: at(8192, seqlen_k, heads_kv),
        o_strides: at(0, seqlen_q, heads_q).strides,
        lse: LseLayout { batch_stride: (heads_q * seqlen_q) as i64, head_stride: seqlen_q as i64 },
        outputs: Outputs::Fresh,
        scale: 0.1,
        mask: Mask::None,
        softcap: None,
        alibi: None,
        sequences: Sequences::Dense,
        num_splits: None,
        append: None,
    }
}

fn causal(c: Call) -> Call {
    Call { mask: Mask::Causal, ..c }
}

fn splits(c: Call, n: usize) -> Call {
    Call { num_splits: Some(n), ..c }
}

const NO_OUTPUTS: OutputAddrs = OutputAddrs { o: 0, lse: 0 };

/// The sm_80 plan of `call` (the family every GPU runs).
fn sm80(call: &Call, wave: impl Fn(&AttentionKernel) -> usize) -> Result<Sm80Plan> {
    super::sm80::plan(call, wave)
}

/// The plan of `call` on an H100.
fn sm90a(call: &Call) -> Plan {
    plan_for(call, h100, KernelFamily::Sm90a { sm_count: 132 }).unwrap()
}

/// The sm_90a plan of `call` on an H100, if it takes an sm_90a kernel.
fn hopper(call: &Call) -> Option<Sm90Plan> {
    match sm90a(call) {
        Plan::Sm90(plan) => Some(plan),
        Plan::Sm80(_) => None,
    }
}

fn forward_args(plan: &Sm80Plan) -> ForwardParams {
    match plan.launches(NO_OUTPUTS, 0).iter().find_map(|l| match l.args {
        KernelArgs::Forward(a) => Some(a),
        _ => None,
    }) {
        Some(args) => args,
        None => panic!("no attention launch"),
    }
}

#[test]
fn heuristic_does_not_split_a_grid_that_fills_most_of_a_wave() {
    assert_eq!(num_splits_heuristic(792, 4096, 792), 1);
    assert_eq!(num_splits_heuristic(634, 4096, 792), 1); // 80%
    assert_eq!(num_splits_heuristic(10_000, 4096, 792), 1);
    // Between half a wave and 80%, two splits fill no more of their
    // waves than one does.
    assert_eq!(num_splits_heuristic(600, 4096, 792), 1);
    assert_eq!(num_splits_heuristic(300, 4096, 792), 2);
}

#[test]
fn heuristic_fills_about_one_wave() {
    // Decode, batch 64 of 4 KV heads (GQA layout): 256 CTAs, 792 slots.
    // 3 splits fill 97% of one wave; 4 would start a second wave at 29%.
    assert_eq!(num_splits_heuristic(256, 512, 792), 3);
    // Batch 16: 64 CTAs, 12 splits fill 97%.
    assert_eq!(num_splits_heuristic(64, 512, 792), 12);
    // Batch 1: 4 CTAs would need 198 splits; capped at 128.
    assert_eq!(num_splits_heuristic(4, 2048, 792), MAX_SPLITS);
}

#[test]
fn heuristic_keeps_enough_key_blocks_per_split() {
    // 32 key blocks leave at most 8 splits of 4 blocks.
    assert_eq!(num_splits_heuristic(4, 32, 792), 8);
    // Fewer than 8 key blocks: no split.
    assert_eq!(num_splits_heuristic(4, 7, 792), 1);
    assert_eq!(num_splits_heuristic(4, 0, 792), 1);
    for key_blocks in 0..600 {
        for ctas in [1, 3, 17, 100, 400] {
            let splits = num_splits_heuristic(ctas, key_blocks, 792);
            assert!((1..=MAX_SPLITS).contains(&splits));
            assert!(splits == 1 || key_blocks / splits >= MIN_KEY_BLOCKS_PER_SPLIT, "{ctas} {key_blocks}");
            // No empty split: the last one gets at least one block.
            assert!(key_blocks.div_ceil(key_blocks.div_ceil(splits).max(1)) >= splits.min(key_blocks));
        }
    }
}

#[test]
fn heuristic_leaves_no_split_empty() {
    // 9 key blocks wanted in 2 splits -> 5 + 4; 41 blocks in 10 -> 5 each
    // over 9 splits (ceil(41 / 10) = 5 blocks, 9 splits cover them).
    assert_eq!(num_splits_heuristic(100, 9, 792), 2);
    assert_eq!(num_splits_heuristic(79, 41, 792), 9);
}

#[test]
fn the_heuristic_takes_any_sizes() {
    for (ctas, key_blocks, wave) in
        [(1 << 61, 4096, usize::MAX), (usize::MAX, usize::MAX, usize::MAX), (1, usize::MAX, 2)]
    {
        assert!((1..=MAX_SPLITS).contains(&num_splits_heuristic(ctas, key_blocks, wave)));
    }
}

#[test]
fn dense_calls_without_features_run_the_dense_kernels() {
    // 4 query blocks * 8 heads * 16 batches = 512 CTAs: no split.
    let plan = sm80(&call(16, 1000, 1000, 8, 8, 128), h100).unwrap();
    assert_eq!(plan.kernel.variant, Variant::Full);
    assert_eq!(plan.grid, [4, 8, 16]); // ceil(1000 / 256) query blocks
    assert_eq!(plan.args.num_splits, 1);
    assert_eq!(plan.scratch.bytes, 0);
    assert_eq!(plan.combine_blocks, 0);
    assert_eq!(plan.kernel.config, config::tile_config(128).unwrap());
    let causal_plan = sm80(&causal(call(16, 1000, 1000, 8, 8, 128)), h100).unwrap();
    assert_eq!(causal_plan.kernel.variant, Variant::Causal);
    // The causal kernels' own shape: the launch's shared memory must be
    // theirs (at d=64, one K/V stage against the dense kernels' two).
    assert_eq!(causal_plan.kernel.config, config::causal_tile_config(128).unwrap());
    assert_eq!(causal_plan.grid, [8, 8, 16]); // ceil(1000 / 128): 4 warps, not the dense 8
    assert_eq!((causal_plan.args.window_left, causal_plan.args.window_right), (-1, 0));
    let causal_64 = sm80(&causal(call(16, 1000, 1000, 8, 8, 64)), h100).unwrap();
    let dense_64 = sm80(&call(16, 1000, 1000, 8, 8, 64), h100).unwrap();
    assert_eq!(causal_64.kernel.variant, Variant::Causal);
    assert!(causal_64.kernel.config.smem_bytes() < dense_64.kernel.config.smem_bytes());
    // Forced not to split, a small grid stays dense too.
    let small = splits(causal(call(1, 1000, 1000, 8, 8, 128)), 1);
    assert_eq!(sm80(&small, h100).unwrap().kernel.variant, Variant::Causal);
}

#[test]
fn sm90a_plans_take_dense_calls_and_leave_the_rest_to_sm80() {
    let named = |c: &Call| hopper(c).map(|h| (h.kernel.name, h.grid));
    let counted = |c: &Call| hopper(c).map(|h| h.tile_counter);
    let dense = call(2, 1000, 1000, 8, 2, 128);
    // 128 tiles (8 query blocks, 8 heads, 2 batches): one persistent block each.
    assert_eq!(named(&dense), Some(("flash_fwd_sm90_d128_f16_full", [128, 1, 1])));
    assert_eq!(counted(&causal(dense.clone())), Some(false));
    // More tiles than SMs, unmasked or causal, over any keys: one block
    // per SM; causal ones count their tiles.
    for c in [call(4, 1000, 1000, 8, 2, 128), call(4, 1000, 30000, 8, 2, 128)] {
        assert_eq!((named(&c).map(|h| h.1), counted(&c)), (Some([132, 1, 1]), Some(false)));
        let c = causal(c);
        assert_eq!((named(&c).map(|h| h.1), counted(&c)), (Some([132, 1, 1]), Some(true)));
    }
    // Windowed tiles: persistent blocks on the counter too.
    let windowed_long =
        Call { mask: Mask::Window { left: Some(100), right: Some(0) }, ..call(4, 1000, 1000, 8, 2, 128) };
    assert_eq!((named(&windowed_long).map(|h| h.1), counted(&windowed_long)), (Some([132, 1, 1]), Some(true)));
    assert_eq!(named(&causal(dense.clone())).map(|h| h.0), Some("flash_fwd_sm90_d128_f16_causal"));
    let windowed = Call { mask: Mask::Window { left: Some(100), right: Some(0) }, ..dense.clone() };
    assert_eq!(named(&windowed).map(|h| h.0), Some("flash_fwd_sm90_d128_f16_general"));
    let softcap = Call { softcap: Some(30.0), ..causal(dense.clone()) };
    assert_eq!(named(&softcap).map(|h| h.0), Some("flash_fwd_sm90_d128_f16_general"));
    // d = 64: 192-row tiles, but 128 rows for causal calls over at most
    // 1024 keys, whose Q boxes follow (4 batches of 1000 rows, 8 heads).
    let d64 = call(4, 1000, 1000, 8, 2, 64);
    let planned = |c: &Call| hopper(c).map(|h| (h.kernel.name, h.query_blocks, h.maps[0].box_dims[1]));
    assert_eq!(planned(&d64), Some(("flash_fwd_sm90_d64_f16_full", 6, 192)));
    assert_eq!(planned(&causal(d64.clone())), Some(("flash_fwd_sm90_d64_f16_causal_m128", 8, 128)));
    let softcap_64 = Call { softcap: Some(30.0), ..causal(d64.clone()) };
    assert_eq!(planned(&softcap_64), Some(("flash_fwd_sm90_d64_f16_general_m128", 8, 128)));
    let long_64 = causal(call(4, 1000, 1025, 8, 2, 64));
    assert_eq!(planned(&long_64), Some(("flash_fwd_sm90_d64_f16_causal", 6, 192)));
    // The maps: (head_dim, seqlen, heads, batch), byte strides, boxes of
    // 64 columns and the kernel's rows; k and v share their head.
    let launch = hopper(&dense).unwrap();
    assert_eq!(launch.maps[0].global_dims[..4], [128, 1000, 8, 2]);
    assert_eq!(launch.maps[0].global_strides[..3], [2 * 8 * 128, 2 * 128, 2 * 1000 * 8 * 128]);
    assert_eq!((launch.maps[0].box_dims[1], launch.maps[1].box_dims[1]), (128, 128));
    assert_eq!(launch.maps[1].global_dims[..4], [128, 1000, 2, 2]);
    // Its scratch holds the three maps and nothing else: it runs unsplit.
    let plan = sm90a(&dense);
    assert_eq!(plan.scratch_bytes(), size_of::<HopperScratch>().next_multiple_of(SCRATCH_ALIGN));
    assert_eq!(plan.launches(OutputAddrs { o: 0, lse: 0 }, 0).len(), 1);
    assert_eq!(plan.args().num_splits, 1);
    // The split heuristic would split this small grid on sm_80.
    assert!(plan_for(&dense, h100, KernelFamily::Sm80).unwrap().args().num_splits > 1);
    // Not taken: the sm_80 family, other head dims, a forced split,
    // decode rows, and strides TMA cannot express.
    assert!(matches!(plan_for(&dense, h100, KernelFamily::Sm80).unwrap(), Plan::Sm80(_)));
    assert!(hopper(&call(2, 1000, 1000, 8, 2, 32)).is_none());
    // Head dims between whole slabs take the next slab's tiles.
    assert_eq!(named(&call(2, 1000, 1000, 8, 2, 96)).map(|h| h.0), Some("flash_fwd_sm90_d96_f16_full"));
    assert_eq!(named(&call(2, 1000, 1000, 8, 2, 160)).map(|h| h.0), Some("flash_fwd_sm90_d160_f16_full"));
    assert!(hopper(&splits(dense.clone(), 2)).is_none());
    assert!(hopper(&call(2, 16, 1000, 8, 2, 128)).is_none());
    assert!(hopper(&call(2, 17, 1000, 8, 2, 128)).is_some());
    let mut odd_stride = dense.clone();
    odd_stride.k.strides[1] += 4; // 8 bytes more per row: not a multiple of 16
    assert!(hopper(&odd_stride).is_none());
    let mut unaligned = dense;
    unaligned.v.addr += 8;
    assert!(hopper(&unaligned).is_none());
}

#[test]
fn sm90a_causal_plans_interleave_heads_in_sections() {
    let sections = |c: &Call| {
        let launch = hopper(c).unwrap();
        let launches = launch.launches(OutputAddrs { o: 1 << 20, lse: 2 << 20 }, 3 << 20);
        let [Launch { args: KernelArgs::Hopper(params), .. }] = launches.as_slice() else {
            panic!("one sm_90a launch")
        };
        assert_eq!(params.section_heads, launch.section_heads);
        launch.section_heads
    };
    // 64 heads of 2 MiB of K and V (d = 128, 4096 keys): 12 fit 25 MB, 8 divide 64.
    let d128 = call(4, 4096, 4096, 16, 16, 128);
    assert_eq!(sections(&causal(d128.clone())), 8);
    // Unmasked and windowed calls keep their order.
    assert_eq!(sections(&d128), 1);
    let windowed = Call { mask: Mask::Window { left: Some(100), right: Some(0) }, ..d128 };
    assert_eq!(sections(&windowed), 1);
    // 32 heads of 4 MiB (d = 256): 6 fit, 4 divide; short heads all fit.
    assert_eq!(sections(&causal(call(4, 4096, 4096, 8, 8, 256))), 4);
    assert_eq!(sections(&causal(call(2, 1000, 1000, 8, 2, 128))), 16);
    // Packed sequences take the general kernel, in their order.
    let mut packed = causal(call(3, 1000, 700, 8, 2, 128));
    packed.sequences = Sequences::Packed { cu_seqlens_q: 256, cu_seqlens_k: 512, total_q: 2500, total_k: 1800 };
    assert_eq!(sections(&packed), 1);
}

#[test]
fn sm90a_plans_take_packed_sequences_on_the_general_kernel() {
    // Three sequences of at most 1000 queries and 700 keys, 2500 and 1800 tokens in all.
    let mut packed = call(3, 1000, 700, 8, 2, 128);
    packed.sequences = Sequences::Packed { cu_seqlens_q: 256, cu_seqlens_k: 512, total_q: 2500, total_k: 1800 };
    for c in [packed.clone(), causal(packed.clone())] {
        let launch = hopper(&c).expect("an sm_90a plan");
        assert_eq!(launch.kernel.name, "flash_fwd_sm90_d128_f16_general");
        // Persistent blocks, one per SM, over 192 tiles (8 query blocks
        // of the longest sequence, 8 heads, 3 sequences), taken off the
        // tile counter: a packed sequence's tiles differ in cost.
        assert_eq!((launch.grid, launch.tiles, launch.tile_counter), ([132, 1, 1], 192, true));
        // The maps see one batch of every token.
        assert_eq!(launch.maps[0].global_dims[..4], [128, 2500, 8, 1]);
        assert_eq!(launch.maps[1].global_dims[..4], [128, 1800, 2, 1]);
        assert_eq!(launch.maps[2].global_dims[..4], [128, 1800, 2, 1]);
        let args = launch.launches(OutputAddrs { o: 1 << 20, lse: 2 << 20 }, 3 << 20);
        let [Launch { args: KernelArgs::Hopper(params), .. }] = args.as_slice() else { panic!("one sm_90a launch") };
        assert_eq!((params.forward.cu_seqlens_q as u64, params.forward.cu_seqlens_k as u64), (256, 512));
    }
    // A KV cache and a split stay on the sm_80 kernels.
    let mut cache = call(3, 1000, 700, 8, 2, 128);
    cache.sequences = Sequences::Cache { lengths: CacheLengths::Device(256), pages: None };
    assert!(hopper(&cache).is_none());
    assert!(hopper(&splits(packed, 2)).is_none());
}

#[test]
fn a_small_dense_grid_over_many_keys_is_split_on_the_general_kernel() {
    // 8 query blocks * 8 heads * 2 batches = 128 CTAs of 264 slots; 32
    // key blocks allow 8 splits; 2 fill 97% of a wave.
    let plan = sm80(&call(2, 1000, 1000, 8, 8, 128), h100).unwrap();
    assert_eq!(plan.kernel.variant, Variant::General);
    assert_eq!(plan.args.num_splits, 2);
    assert_eq!(plan.grid, [16, 8, 2]);
    assert_eq!(plan.combine_blocks as usize, (2 * 8 * 1000 * 128 / 8usize).div_ceil(4));
}

#[test]
fn features_select_the_general_or_decode_kernel_by_rows() {
    let windowed = Call { mask: Mask::Window { left: Some(256), right: None }, ..call(2, 1000, 1000, 8, 8, 64) };
    let general = sm80(&splits(windowed, 1), h100).unwrap();
    assert_eq!(general.kernel.variant, Variant::General);
    assert_eq!((general.args.window_left, general.args.window_right), (256, -1));
    assert_eq!(general.kernel.config, config::general_tile_config(64).unwrap());
    let short = Call { softcap: Some(10.0), ..call(2, 16, 1000, 8, 8, 64) };
    let decode = sm80(&splits(short.clone(), 1), h100).unwrap();
    assert_eq!(decode.kernel.variant, Variant::Decode);
    assert_eq!(decode.kernel.config, config::decode_tile_config(64).unwrap());
    assert_eq!(decode.grid, [1, 8, 2]);
    assert!(decode.args.softcap_scale > 0.0);
    let seventeen = Call { problem: Problem { seqlen_q: 17, ..short.problem }, ..short };
    assert_eq!(sm80(&splits(seventeen, 1), h100).unwrap().kernel.variant, Variant::General);
}

#[test]
fn splits_multiply_grid_x_and_lay_out_the_partials() {
    let plan = sm80(&splits(call(3, 200, 5000, 4, 4, 128), 3), h100).unwrap();
    assert_eq!(plan.kernel.variant, Variant::General);
    assert_eq!(plan.args.num_splits, 3);
    assert_eq!(plan.grid, [3 * 2, 4, 3]);
    let rows = 3 * 3 * 4 * 200usize;
    assert_eq!(plan.scratch.lse_partial, 0);
    assert_eq!(plan.scratch.o_partial, (rows * 4).next_multiple_of(256));
    assert_eq!(plan.scratch.bytes, plan.scratch.o_partial + rows * 128 * 4);
    assert_eq!(plan.combine_blocks as usize, (3 * 4 * 200 * 128 / 8usize).div_ceil(4));
    // The launches: the attention into the partials, then the merge.
    let launches = plan.launches(OutputAddrs { o: 1 << 20, lse: 1 << 21 }, 1 << 30);
    assert_eq!(launches.len(), 2);
    let KernelArgs::Forward(args) = launches[0].args else { panic!("attention first") };
    assert_eq!(args.o_partial as u64, (1 << 30) + plan.scratch.o_partial as u64);
    let KernelArgs::Combine(merge) = launches[1].args else { panic!("merge second") };
    assert_eq!((merge.o as u64, merge.lse as u64, merge.num_splits), (1 << 20, 1 << 21, 3));
    assert_eq!(launches[1].kernel, Kernel::Combine(Dtype::F16));
}

#[test]
fn the_heuristic_splits_a_small_grid_over_many_keys() {
    // One query row, MHA (no GQA layout), 16k keys: 2 * 8 CTAs.
    let plan = sm80(&call(2, 1, 16384, 8, 8, 128), h100).unwrap();
    assert_eq!(plan.kernel.variant, Variant::Decode);
    let key_blocks = 16384 / config::decode_tile_config(128).unwrap().block_n as usize;
    assert_eq!(plan.args.num_splits as usize, num_splits_heuristic(16, key_blocks, 132 * 6));
    assert!(plan.args.num_splits > 1);
}

#[test]
fn gqa_decode_views_query_heads_as_rows_of_their_kv_head() {
    // q [4, 1, 32, 128] over 4 KV heads: g = 8.
    let plan = sm80(&splits(causal(call(4, 1, 4096, 32, 4, 128)), 1), h100).unwrap();
    let a = forward_args(&plan);
    assert_eq!((a.seqlen_q, a.heads_q, a.heads_per_kv), (8, 4, 1));
    assert_eq!((a.q_batch_stride, a.q_row_stride, a.q_head_stride), (32 * 128, 128, 8 * 128));
    assert_eq!((a.o_batch_stride, a.o_row_stride, a.o_head_stride), (32 * 128, 128, 8 * 128));
    // Key/value strides are untouched.
    assert_eq!((a.k_batch_stride, a.k_row_stride, a.k_head_stride), (4096 * 4 * 128, 4 * 128, 128));
    // LSE [4, 32, 1]: row r of KV head h is query head h * 8 + r.
    assert_eq!((a.lse_batch_stride, a.lse_head_stride), (32, 8));
    // The one row sees every key: the causal mask is dropped.
    assert_eq!((a.window_left, a.window_right), (-1, -1));
    // 8 rows fit the decode kernel's 16; no feature, no split: dense.
    assert_eq!(plan.kernel.variant, Variant::Full);
    assert_eq!(plan.grid, [1, 4, 4]);
}

#[test]
fn uploaded_lengths_need_the_general_kernels_and_come_first_in_scratch() {
    let cache = |c: Call| Call {
        sequences: Sequences::Cache { lengths: CacheLengths::Upload(vec![1000; c.problem.batch]), pages: None },
        ..c
    };
    let plan = sm80(&splits(cache(call(3, 1, 1000, 8, 8, 64)), 1), h100).unwrap();
    assert_eq!(plan.kernel.variant, Variant::Decode);
    assert_eq!(sm80(&splits(cache(call(3, 40, 1000, 8, 8, 64)), 1), h100).unwrap().kernel.variant, Variant::General);
    let split = sm80(&splits(cache(call(5, 1, 3000, 8, 8, 64)), 2), h100).unwrap();
    assert_eq!(split.scratch.seqused_k, 0);
    assert_eq!(split.scratch.lse_partial, 256);
    let rows = 2 * 5 * 8usize;
    assert_eq!(split.scratch.o_partial, 256 + (rows * 4).next_multiple_of(256));
    assert_eq!(split.scratch.bytes, split.scratch.o_partial + (rows * 64 * 4).next_multiple_of(256));
    let launches = split.launches(NO_OUTPUTS, 1 << 30);
    let KernelArgs::Forward(args) = launches[0].args else { panic!("attention first") };
    assert_eq!(args.seqused_k as u64, 1 << 30);
    let unsplit = sm80(&splits(cache(call(5, 1, 3000, 8, 8, 64)), 1), h100).unwrap();
    assert_eq!(unsplit.scratch.bytes, 256);
}

#[test]
fn partial_rows_past_32_bit_indices_are_refused() {
    // 128 splits * 2^10 batches * 2^15 rows * 1 head = 2^32 rows.
    let long = splits(call(1 << 10, 1 << 15, 1 << 20, 1, 1, 64), MAX_SPLITS);
    let err = sm80(&long, h100).unwrap_err();
    assert!(matches!(err, Error::TooLarge { what: "split-KV partial rows", .. }), "{err}");
    let shorter = Call { problem: Problem { batch: (1 << 10) - 1, ..long.problem }, ..long };
    assert!(sm80(&shorter, h100).is_ok());
}

#[test]
fn merge_warps_past_32_bit_indices_are_refused() {
    // d = 256: 32 warps per merged row. 2^27 rows are 2^32 warps, the
    // merge's u32 warp index's range; one row more is past it.
    let rows = 1 << 27;
    let plan_of = |rows| sm80(&splits(call(1, rows, 64, 1, 1, 256), 2), h100);
    assert_eq!(plan_of(rows).unwrap().combine_blocks, 1 << 30);
    let err = plan_of(rows + 1).unwrap_err();
    assert_eq!(err, Error::TooLarge { what: "split-KV merge blocks", value: (1 << 30) + 8, max: 1 << 30 });
}

#[test]
fn partial_rows_are_bounded_before_the_merge_counts_them() {
    // 2^63 rows of 32 merge warps each would overflow the count.
    let huge = splits(call(65_535, crate::limits::MAX_SEQLEN, 64, 65_535, 65_535, 256), 2);
    let err = sm80(&huge, h100).unwrap_err();
    assert!(matches!(err, Error::TooLarge { what: "split-KV partial rows", .. }), "{err}");
}

#[test]
fn grids_past_the_launch_limit_are_refused() {
    let huge = splits(call(1, i32::MAX as usize, 64, 1, 1, 64), MAX_SPLITS);
    let err = sm80(&huge, h100).unwrap_err();
    assert!(matches!(err, Error::TooLarge { what: "query blocks * num_splits", .. }), "{err}");
}

#[test]
fn decode_calls_stay_on_the_sm80_decode_kernels_on_sm90a() {
    // One query row of grouped heads (the GQA decode layout), and 16 rows.
    for c in [call(4, 1, 4096, 32, 4, 128), call(4, 16, 4096, 8, 8, 128)] {
        let Plan::Sm80(plan) = sm90a(&c) else { panic!("{c:?} left the sm_80 kernels") };
        assert!(matches!(plan.kernel.variant, Variant::Decode | Variant::Full), "{}", plan.kernel.name);
    }
    // 17 rows: the sm_90a kernel.
    assert!(matches!(sm90a(&call(4, 17, 4096, 8, 8, 128)), Plan::Sm90(_)));
}

#[test]
fn a_plan_describes_its_family_main_kernel_grid_and_launches() {
    let dense = sm90a(&call(2, 1000, 1000, 8, 2, 128)).describe();
    assert_eq!((dense.family, dense.kernel, dense.grid), (Family::Sm90a, "flash_fwd_sm90_d128_f16_full", [128, 1, 1]));
    assert_eq!(dense.launches.len(), 1);
    assert_eq!((dense.launches[0].kernel, dense.launches[0].threads), ("flash_fwd_sm90_d128_f16_full", 384));
    assert_eq!(dense.to_string(), "sm_90a flash_fwd_sm90_d128_f16_full, grid [128, 1, 1]");
    // A split: the general kernel, then the merge.
    let split = plan_for(&splits(call(3, 200, 5000, 4, 4, 128), 3), h100, KernelFamily::Sm80).unwrap().describe();
    assert_eq!((split.family, split.kernel, split.grid), (Family::Sm80, "flash_fwd_d128_f16_general", [6, 4, 3]));
    let names: Vec<&str> = split.launches.iter().map(|l| l.kernel).collect();
    assert_eq!(names, ["flash_fwd_d128_f16_general", "flash_combine_f16"]);
    assert_eq!(
        split.to_string(),
        "sm_80 flash_fwd_d128_f16_general, grid [6, 4, 3] (launches: flash_fwd_d128_f16_general, flash_combine_f16)"
    );
    // Every launch as the plan binds it.
    let plan = sm80(&splits(call(3, 200, 5000, 4, 4, 128), 3), h100).unwrap();
    let launches = plan.launches(OutputAddrs { o: 0, lse: 0 }, 0);
    for (described, launch) in split.launches.iter().zip(&launches) {
        let Launch { kernel, grid, threads, smem_bytes, .. } = *launch;
        assert_eq!(
            (described.kernel, described.grid, described.threads, described.smem_bytes),
            (kernel.name(), grid, threads, smem_bytes)
        );
    }
}

/// A backward call of `forward`, its outputs and gradients contiguous at
/// made-up addresses.
fn backward_of(forward: Call, deterministic: bool) -> crate::call::BackwardCall {
    let p = forward.problem;
    let at = |addr: u64, s: usize, h: usize| TensorAt {
        addr,
        strides: [(s * h * p.head_dim) as i64, (h * p.head_dim) as i64, p.head_dim as i64],
    };
    let q_like = |addr| at(addr, p.seqlen_q, p.heads_q);
    let k_like = |addr| at(addr, p.seqlen_k, p.heads_kv);
    crate::call::BackwardCall {
        forward: Call { outputs: Outputs::Given { o: q_like(1 << 30), lse: 2 << 30 }, ..forward },
        d_o: q_like(3 << 30),
        d_q: q_like(4 << 30),
        d_k: k_like(5 << 30),
        d_v: k_like(6 << 30),
        lse_rows: p.batch * p.heads_q * p.seqlen_q,
        deterministic,
    }
}

#[test]
fn backward_plans_name_their_family_and_main_kernel() {
    use super::{plan_backward_for, BackwardPlan};
    let sm90a = KernelFamily::Sm90a { sm_count: 132 };
    let dense = backward_of(causal(call(2, 1000, 1000, 8, 2, 128)), false);
    let plan = plan_backward_for(&dense, 132, sm90a).unwrap();
    assert!(matches!(plan, BackwardPlan::Sm90(_)));
    let described = plan.describe();
    assert_eq!((described.family, described.kernel), (Family::Sm90a, "flash_bwd_sm90_d128_f16_causal"));
    let names: Vec<&str> = described.launches.iter().map(|l| l.kernel).collect();
    assert_eq!(names, ["flash_bwd_prepare_f16", "flash_bwd_sm90_d128_f16_causal", "flash_bwd_finish_dq_f16"]);
    assert_eq!(described.grid, described.launches[1].grid);
    // Its scratch: the row kernels', then the tensor maps.
    let BackwardPlan::Sm90(sm90) = plan else { unreachable!() };
    assert_eq!(sm90.tensor_maps, sm90.rows.end);
    assert_eq!(
        plan.scratch_bytes(),
        sm90.rows.end + size_of::<flash_attn_abi::hopper_backward::HopperBackwardScratch>()
    );
    // The deterministic mode, a window and the sm_80 family: the sm_80 kernel.
    let deterministic = backward_of(causal(call(2, 1000, 1000, 8, 2, 128)), true);
    let windowed = backward_of(
        Call { mask: Mask::Window { left: Some(64), right: None }, ..call(2, 1000, 1000, 8, 2, 128) },
        false,
    );
    for (c, family) in [(&deterministic, sm90a), (&windowed, sm90a), (&dense, KernelFamily::Sm80)] {
        let plan = plan_backward_for(c, 132, family).unwrap();
        let BackwardPlan::Sm80(sm80) = plan else { panic!("{c:?} left the sm_80 kernels") };
        assert_eq!(plan.describe().kernel, "flash_bwd_d128_f16");
        assert_eq!(plan.scratch_bytes(), sm80.rows.end);
    }
}

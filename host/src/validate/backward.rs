//! Backward calls: the forward call's checks on q, k, v and its outputs o
//! and lse (which the backward reads), then dO and the gradients.

use flash_attn_abi::backward::backward_config;

use super::{
    bytes, check_aliasing, check_distinct_elements, check_row_stride, check_tensor, tensor_at, tensor_bytes,
    AttentionParams, Bytes, Placed,
};
use crate::call::{BackwardCall, Call, Outputs, Sequences};
use crate::error::{Error, Result};

/// What a backward call takes beside the forward's q, k and v: the
/// forward's outputs `o` and `lse` (`lse_len` f32 at `lse_addr`), `d_o`
/// (q's shape), and the gradients it writes, `d_q` (q's shape), `d_k` and
/// `d_v` (k's shape).
#[derive(Clone, Copy, Debug)]
pub struct BackwardTensors<'a> {
    pub o: &'a Placed,
    pub lse_addr: u64,
    pub lse_len: usize,
    pub d_o: &'a Placed,
    pub d_q: &'a Placed,
    pub d_k: &'a Placed,
    pub d_v: &'a Placed,
}

impl BackwardTensors<'_> {
    /// Where the forward's outputs are, for its validation
    /// ([`validate`](super::validate) or [`validate_varlen`](super::validate_varlen)).
    pub fn forward_outputs(&self) -> super::OutputBuffers<'_> {
        super::OutputBuffers::Given { o: self.o, lse_addr: self.lse_addr, lse_len: self.lse_len }
    }
}

/// Checks the backward of `forward`, a dense or packed call validated with
/// [`BackwardTensors::forward_outputs`] from `q`, `k`, `v` and `params`
/// (whose `deterministic` the backward takes): a head dim
/// with backward kernels, dO of q's shape, dQ of q's shape and dK, dV of
/// k's shape with distinct elements, overlapping neither each other nor
/// anything the call reads (q, k, v, o, lse, dO, the ALiBi slopes, the
/// sequence offsets).
pub fn validate_backward(
    forward: Call,
    q: &Placed,
    k: &Placed,
    v: &Placed,
    tensors: &BackwardTensors,
    params: &AttentionParams,
) -> Result<BackwardCall> {
    let p = forward.problem;
    if u32::try_from(p.head_dim).ok().and_then(backward_config).is_none() {
        return Err(Error::UnsupportedHeadDim(p.head_dim));
    }
    if !matches!(forward.sequences, Sequences::Dense | Sequences::Packed { .. }) || forward.append.is_some() {
        return Err(Error::ShapeMismatch("the backward takes dense or packed sequences, not a KV cache".into()));
    }
    let Outputs::Given { .. } = forward.outputs else {
        return Err(Error::ShapeMismatch("the backward reads the forward's o and lse: give them".into()));
    };
    let BackwardTensors { o, lse_addr, lse_len, d_o, d_q, d_k, d_v } = *tensors;
    for (t, like) in [(d_o, q), (d_q, q), (d_k, k), (d_v, v)] {
        check_tensor(t)?;
        check_row_stride(t)?;
        if t.layout.shape != like.layout.shape {
            return Err(Error::ShapeMismatch(format!(
                "{} is {:?} but {} is {:?}",
                t.name, t.layout.shape, like.name, like.layout.shape
            )));
        }
    }
    for t in [d_q, d_k, d_v] {
        check_distinct_elements(t)?;
    }
    let mut read: Vec<Bytes> = [q, k, v, o, d_o].map(tensor_bytes).to_vec();
    read.push(bytes("lse", lse_addr, lse_len, 4));
    if let Some(alibi) = forward.alibi {
        let slopes = if alibi.batch_stride == 0 { p.heads_q } else { p.batch * p.heads_q };
        read.push(bytes("alibi_slopes", alibi.addr, slopes, 4));
    }
    if let Sequences::Packed { cu_seqlens_q, cu_seqlens_k, .. } = forward.sequences {
        read.push(bytes("cu_seqlens_q", cu_seqlens_q, p.batch + 1, 4));
        read.push(bytes("cu_seqlens_k", cu_seqlens_k, p.batch + 1, 4));
    }
    check_aliasing(&[d_q, d_k, d_v].map(tensor_bytes), &read)?;
    // The lse values the kernels index: dense [batch, heads_q, seqlen_q],
    // packed [heads_q, total_q] (a batch stride of 0).
    let lse = forward.lse;
    let lse_rows = (lse.batch_stride as usize * p.batch).max(lse.head_stride as usize * p.heads_q);
    Ok(BackwardCall {
        forward,
        d_o: tensor_at(d_o),
        d_q: tensor_at(d_q),
        d_k: tensor_at(d_k),
        d_v: tensor_at(d_v),
        lse_rows,
        deterministic: params.deterministic,
    })
}

#[cfg(test)]
mod tests {
    use super::super::tests_support::contiguous_tensor;
    use super::super::{validate, validate_varlen, OffsetsArg};
    use super::*;
    use crate::plan::{plan_backward, BackwardPlan, Kernel, KernelArgs, Sm80Backward};
    use flash_attn_abi::kernels::Dtype;

    const MIB: u64 = 1 << 20;

    /// q, o, dO, dQ [2, 100, 8, d]; k, v, dK, dV [2, 37, 2, d] (GQA 4:1);
    /// lse [2, 8, 100]; at disjoint addresses.
    struct Backward {
        q: Placed,
        k: Placed,
        v: Placed,
        o: Placed,
        lse_len: usize,
        d_o: Placed,
        d_q: Placed,
        d_k: Placed,
        d_v: Placed,
    }

    const LSE: u64 = 64 * MIB;

    /// The backward plan of `call` for a GPU of `sm_count` SMs of the sm_80 family.
    fn sm80(call: &BackwardCall, sm_count: usize) -> Sm80Backward {
        match plan_backward(call, sm_count).unwrap() {
            BackwardPlan::Sm80(plan) => plan,
            BackwardPlan::Sm90(plan) => panic!("the sm_80 family planned {}", plan.kernel.name),
        }
    }

    impl Backward {
        fn new(head_dim: usize) -> Self {
            let (q, kv) = ([2, 100, 8, head_dim], [2, 37, 2, head_dim]);
            Backward {
                q: contiguous_tensor("q", q, 0),
                k: contiguous_tensor("k", kv, 16 * MIB),
                v: contiguous_tensor("v", kv, 32 * MIB),
                o: contiguous_tensor("o", q, 48 * MIB),
                lse_len: 2 * 8 * 100,
                d_o: contiguous_tensor("d_o", q, 80 * MIB),
                d_q: contiguous_tensor("d_q", q, 96 * MIB),
                d_k: contiguous_tensor("d_k", kv, 112 * MIB),
                d_v: contiguous_tensor("d_v", kv, 128 * MIB),
            }
        }

        fn run(&self) -> Result<BackwardCall> {
            let tensors = BackwardTensors {
                o: &self.o,
                lse_addr: LSE,
                lse_len: self.lse_len,
                d_o: &self.d_o,
                d_q: &self.d_q,
                d_k: &self.d_k,
                d_v: &self.d_v,
            };
            let params = AttentionParams { causal: true, ..Default::default() };
            let forward = validate(Dtype::Bf16, &self.q, &self.k, &self.v, tensors.forward_outputs(), &params)?;
            validate_backward(forward, &self.q, &self.k, &self.v, &tensors, &params)
        }
    }

    #[test]
    fn a_valid_call_plans_three_launches_on_one_argument_block() {
        let call = Backward::new(128).run().expect("a valid call");
        assert_eq!(call.lse_rows, 2 * 8 * 100);
        let plan = sm80(&call, 132);
        assert_eq!(plan.kernel.name, "flash_bwd_d128_bf16");
        assert_eq!((plan.rows.grid, plan.grid), ([7, 8, 2], [1, 2, 2]));
        // delta: 1600 f32 rounded to 256 bytes, then the accumulator.
        assert_eq!((plan.rows.delta, plan.rows.d_q_accum), (0, 6400_usize.next_multiple_of(256)));
        assert_eq!(plan.scratch_bytes(), plan.rows.d_q_accum + 1600 * 128 * 4);
        let launches = plan.launches(1 << 40);
        assert_eq!(launches.len(), 3);
        let kernels: Vec<Kernel> = launches.iter().map(|l| l.kernel).collect();
        assert_eq!(kernels[1], Kernel::Backward(plan.kernel));
        assert_eq!(
            (kernels[0], kernels[2]),
            (Kernel::BackwardPrepare(Dtype::Bf16), Kernel::BackwardFinish(Dtype::Bf16))
        );
        let KernelArgs::Backward(args) = launches[1].args else { panic!("backward arguments") };
        assert_eq!((args.delta as u64, args.d_q_accum as u64), (1 << 40, (1 << 40) + plan.rows.d_q_accum as u64));
        assert_eq!((args.forward.o as u64, args.forward.lse as u64), (48 * MIB, LSE));
        assert_eq!(
            (args.d_o as u64, args.d_q as u64, args.d_k as u64, args.d_v as u64),
            (80 * MIB, 96 * MIB, 112 * MIB, 128 * MIB)
        );
        assert_eq!((args.forward.window_left, args.forward.window_right, args.head_dim), (-1, 0, 128));
        assert_eq!((args.d_k_batch_stride, args.d_k_row_stride, args.d_k_head_stride), (37 * 2 * 128, 2 * 128, 128));
    }

    #[test]
    fn the_deterministic_mode_gives_each_split_its_own_accumulator() {
        let mut call = Backward::new(64).run().expect("a valid call");
        call.deterministic = true;
        // 2 x 132 SMs over 2 heads x 2 batches: 66 splits, but only one key
        // block (37 keys): one split.
        let plan = sm80(&call, 132);
        assert_eq!((plan.rows.args.dq_splits, plan.grid), (1, [1, 2, 2]));
        // Many keys on a small GPU: 2 x 4 SMs over 4 blocks of each column.
        call.forward.problem.seqlen_k = 1000;
        let plan = sm80(&call, 4);
        assert_eq!((plan.rows.args.dq_splits, plan.grid, plan.key_launches), (2, [2, 2, 2], 8));
        assert_eq!(plan.rows.args.d_q_accum_split_stride, 1600 * 64);
        assert_eq!(plan.scratch_bytes(), plan.rows.d_q_accum + 2 * 1600 * 64 * 4);
        // Prepare, eight launches of two key blocks each, finish.
        let launches = plan.launches(0);
        assert_eq!(launches.len(), 10);
        let first_blocks: Vec<u32> = launches[1..9]
            .iter()
            .map(|l| match l.args {
                KernelArgs::Backward(a) => a.first_key_block,
                _ => panic!("backward arguments"),
            })
            .collect();
        assert_eq!(first_blocks, [0, 2, 4, 6, 8, 10, 12, 14]);
        // Past MAX_DETERMINISTIC_LAUNCHES launches: refused.
        call.forward.problem.seqlen_k = 64 * 2 * crate::plan::MAX_DETERMINISTIC_LAUNCHES + 1;
        assert!(matches!(
            plan_backward(&call, 4),
            Err(Error::TooLarge { what: "deterministic backward launches", value: 1025, max: 1024 })
        ));
        call.forward.problem.seqlen_k = 1000;
        call.deterministic = false;
        let plan = sm80(&call, 4);
        assert_eq!((plan.rows.args.dq_splits, plan.grid, plan.key_launches), (0, [16, 2, 2], 1));
        assert_eq!(plan.scratch_bytes(), plan.rows.d_q_accum + 1600 * 64 * 4);
    }

    #[test]
    fn every_head_dim_of_the_forward_has_a_backward() {
        for d in crate::limits::SUPPORTED_HEAD_DIMS {
            assert!(backward_config(d).is_some(), "d={d}");
            let result = Backward::new(d as usize).run();
            assert!(result.is_ok(), "d={d}: {result:?}");
        }
        assert_eq!(Backward::new(48).run().unwrap_err(), Error::UnsupportedHeadDim(48));
    }

    #[test]
    fn gradients_of_the_wrong_shape_are_refused() {
        let mut call = Backward::new(64);
        call.d_k = contiguous_tensor("d_k", [2, 36, 2, 64], 112 * MIB);
        assert!(matches!(call.run(), Err(Error::ShapeMismatch(m)) if m.contains("d_k")));
        let mut call = Backward::new(64);
        call.d_o = contiguous_tensor("d_o", [2, 100, 8, 32], 80 * MIB);
        assert!(matches!(call.run(), Err(Error::ShapeMismatch(m)) if m.contains("d_o")));
    }

    #[test]
    fn gradients_that_overlap_what_the_call_reads_are_refused() {
        let mut call = Backward::new(64);
        call.d_q.addr = call.d_o.addr;
        assert_eq!(call.run().unwrap_err(), Error::Aliasing { output: "d_q", other: "d_o" });
        let mut call = Backward::new(64);
        call.d_v.addr = LSE;
        assert_eq!(call.run().unwrap_err(), Error::Aliasing { output: "d_v", other: "lse" });
        let mut call = Backward::new(64);
        call.d_v.addr = call.d_k.addr;
        assert_eq!(call.run().unwrap_err(), Error::Aliasing { output: "d_k", other: "d_v" });
    }

    #[test]
    fn gradients_over_the_sequence_offsets_are_refused() {
        // Packed sequences of 60 and 40 queries over 20 and 17 keys.
        let (q, kv) = ([1, 100, 8, 64], [1, 37, 2, 64]);
        let t = |name, shape, mib| contiguous_tensor(name, shape, mib * MIB);
        let (q_t, k_t, v_t, o_t, d_o) = (t("q", q, 0), t("k", kv, 16), t("v", kv, 32), t("o", q, 48), t("d_o", q, 80));
        let (d_k, d_v) = (t("d_k", kv, 112), t("d_v", kv, 128));
        let (cu_q, cu_k) = ([0, 60, 100], [0, 20, 37]);
        let run = |d_q_addr| {
            let d_q = contiguous_tensor("d_q", q, d_q_addr);
            let tensors =
                BackwardTensors { o: &o_t, lse_addr: LSE, lse_len: 800, d_o: &d_o, d_q: &d_q, d_k: &d_k, d_v: &d_v };
            let params = AttentionParams::default();
            let (cu_q, cu_k) =
                (OffsetsArg { host: &cu_q, addr: 144 * MIB }, OffsetsArg { host: &cu_k, addr: 145 * MIB });
            let forward =
                validate_varlen(Dtype::F16, &q_t, &k_t, &v_t, cu_q, cu_k, tensors.forward_outputs(), &params)?;
            validate_backward(forward, &q_t, &k_t, &v_t, &tensors, &params)
        };
        assert!(run(96 * MIB).is_ok());
        assert_eq!(run(144 * MIB - 64).unwrap_err(), Error::Aliasing { output: "d_q", other: "cu_seqlens_q" });
        assert_eq!(run(145 * MIB - 64).unwrap_err(), Error::Aliasing { output: "d_q", other: "cu_seqlens_k" });
    }

    #[test]
    fn a_gradient_whose_elements_overlap_is_refused() {
        let mut call = Backward::new(64);
        call.d_q.layout.strides[1] = 8;
        assert!(matches!(call.run(), Err(Error::OverlappingOutput { tensor: "d_q", .. })));
    }

    #[test]
    fn a_short_lse_is_refused() {
        let mut call = Backward::new(64);
        call.lse_len -= 1;
        assert!(matches!(call.run(), Err(Error::ShapeMismatch(m)) if m.contains("lse")));
    }
}

//! Variable-length calls: sequences packed one after another, located by
//! offsets (`cu_seqlens`).

use flash_attn_abi::kernels::Dtype;

use super::{
    bytes, call, check_outputs, check_problem, check_row_stride, check_tensor, tensor_at, tensor_bytes,
    AttentionParams, Checked, OutputBuffers, Placed, Problem,
};
use crate::call::{Call, LseLayout, Sequences};
use crate::error::{Error, Result};

/// What valid offsets describe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OffsetsSummary {
    /// Number of sequences (offsets minus one).
    pub batch: usize,
    /// Tokens of all sequences (the last offset).
    pub total: usize,
    /// The longest sequence.
    pub max_len: usize,
}

/// Checks that `offsets` locate packed sequences: at least one sequence,
/// starting at 0, never decreasing (empty sequences are allowed).
pub fn check_seq_offsets(offsets: &[i32]) -> Result<OffsetsSummary> {
    if offsets.len() < 2 {
        return Err(Error::InvalidSeqOffsets(format!(
            "{} offsets given; at least 2 (one sequence) are needed",
            offsets.len()
        )));
    }
    if offsets[0] != 0 {
        return Err(Error::InvalidSeqOffsets(format!("they must start at 0, not {}", offsets[0])));
    }
    let mut max_len = 0;
    for (b, pair) in offsets.windows(2).enumerate() {
        if pair[1] < pair[0] {
            return Err(Error::InvalidSeqOffsets(format!(
                "offset {} ({}) is below offset {b} ({}): offsets must not decrease",
                b + 1,
                pair[1],
                pair[0]
            )));
        }
        max_len = max_len.max((pair[1] - pair[0]) as usize);
    }
    Ok(OffsetsSummary { batch: offsets.len() - 1, total: offsets[offsets.len() - 1] as usize, max_len })
}

/// Offsets as validation sees them: the host values and the device address
/// of their copy.
#[derive(Clone, Copy, Debug)]
pub struct OffsetsArg<'a> {
    pub host: &'a [i32],
    pub addr: u64,
}

/// Checks a variable-length call: packed `q` `[1, total_q, heads_q, d]`
/// and `k`, `v` `[1, total_k, heads_kv, d]` of element type `dtype`,
/// sequences located by `cu_q` and `cu_k`, into `outputs` (o with q's
/// shape, the LSE `[heads_q, total_q]`). The problem's batch is the number
/// of sequences and its lengths the longest ones.
#[allow(clippy::too_many_arguments)]
pub fn validate_varlen(
    dtype: Dtype,
    q: &Placed,
    k: &Placed,
    v: &Placed,
    cu_q: OffsetsArg,
    cu_k: OffsetsArg,
    outputs: OutputBuffers,
    params: &AttentionParams,
) -> Result<Call> {
    for t in [q, k, v] {
        check_tensor(t)?;
        check_row_stride(t)?;
    }
    let [packed_q, total_q, heads_q, head_dim] = q.layout.shape;
    let [packed_k, total_k, heads_kv, head_dim_k] = k.layout.shape;
    if packed_q != 1 || packed_k != 1 {
        return Err(Error::ShapeMismatch(format!(
            "q is {:?} and k is {:?}: variable-length tensors are packed, [1, total_tokens, heads, head_dim] \
             (Tensor::packed)",
            q.layout.shape, k.layout.shape
        )));
    }
    if v.layout.shape != k.layout.shape {
        return Err(Error::ShapeMismatch(format!("k is {:?} but v is {:?}", k.layout.shape, v.layout.shape)));
    }
    if head_dim_k != head_dim {
        return Err(Error::ShapeMismatch(format!("q has head_dim {head_dim} but k has {head_dim_k}")));
    }
    let (sq, sk) = (check_seq_offsets(cu_q.host)?, check_seq_offsets(cu_k.host)?);
    if sq.batch != sk.batch {
        return Err(Error::ShapeMismatch(format!(
            "cu_seqlens_q holds {} sequences but cu_seqlens_k {}",
            sq.batch, sk.batch
        )));
    }
    for (name, summary, tokens, tensor) in [("cu_seqlens_q", sq, total_q, "q"), ("cu_seqlens_k", sk, total_k, "k")] {
        if summary.total != tokens {
            return Err(Error::ShapeMismatch(format!(
                "{name} ends at {} tokens but {tensor} holds {tokens}",
                summary.total
            )));
        }
    }
    let problem = Problem { batch: sq.batch, seqlen_q: sq.max_len, seqlen_k: sk.max_len, heads_q, heads_kv, head_dim };
    let offsets =
        [bytes("cu_seqlens_q", cu_q.addr, cu_q.host.len(), 4), bytes("cu_seqlens_k", cu_k.addr, cu_k.host.len(), 4)];
    let inputs = [tensor_bytes(q), tensor_bytes(k), tensor_bytes(v), offsets[0].clone(), offsets[1].clone()];
    check_problem(&problem)?;
    let outputs = check_outputs(q, outputs, heads_q.checked_mul(total_q), "heads_q * total_q", &inputs)?;
    let checked = Checked {
        dtype,
        problem,
        qkv: [q, k, v].map(tensor_at),
        outputs,
        // LSE [heads_q, total_q]: the kernel adds the sequence's first token.
        lse: LseLayout { batch_stride: 0, head_stride: total_q as i64 },
        sequences: Sequences::Packed { cu_seqlens_q: cu_q.addr, cu_seqlens_k: cu_k.addr, total_q, total_k },
        append: None,
    };
    call(checked, params)
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::MAX_ROW_STRIDE;
    use crate::validate::tests_support::{contiguous_tensor, device_slice, lowered, set_row_stride};
    use crate::validate::Layout;
    use flash_attn_abi::params::ForwardParams;

    const MIB: u64 = 1 << 20;

    fn packed(name: &'static str, tokens: usize, heads: usize, d: usize, addr: u64) -> Placed {
        contiguous_tensor(name, [1, tokens, heads, d], addr)
    }

    struct Call<'a> {
        q: Placed,
        k: Placed,
        v: Placed,
        o: Placed,
        lse_addr: u64,
        lse_len: usize,
        cu_q: Vec<i32>,
        cu_k: Vec<i32>,
        params: AttentionParams<'a>,
    }

    impl Call<'_> {
        /// Sequences of (q, k) lengths (3, 10), (0, 4), (9, 0), (4, 4):
        /// 16 query and 18 key tokens; 8 query heads over 2 KV heads.
        fn new() -> Self {
            Call {
                q: packed("q", 16, 8, 64, 0),
                k: packed("k", 18, 2, 64, 16 * MIB),
                v: packed("v", 18, 2, 64, 32 * MIB),
                o: packed("o", 16, 8, 64, 48 * MIB),
                lse_addr: 64 * MIB,
                lse_len: 8 * 16,
                cu_q: vec![0, 3, 3, 12, 16],
                cu_k: vec![0, 10, 14, 14, 18],
                params: AttentionParams::default(),
            }
        }

        fn run(&self) -> Result<(ForwardParams, Problem)> {
            lowered(validate_varlen(
                Dtype::F16,
                &self.q,
                &self.k,
                &self.v,
                OffsetsArg { host: &self.cu_q, addr: 80 * MIB },
                OffsetsArg { host: &self.cu_k, addr: 81 * MIB },
                OutputBuffers::Given { o: &self.o, lse_addr: self.lse_addr, lse_len: self.lse_len },
                &self.params,
            ))
        }
    }

    #[test]
    fn accepts_ragged_sequences_and_builds_their_arguments() {
        let call = Call::new();
        let (args, problem) = call.run().expect("valid call");
        assert_eq!(problem, Problem { batch: 4, seqlen_q: 9, seqlen_k: 10, heads_q: 8, heads_kv: 2, head_dim: 64 });
        assert_eq!((args.seqlen_q, args.seqlen_k, args.heads_q, args.heads_per_kv), (9, 10, 8, 4));
        assert_eq!(args.cu_seqlens_q as u64, 80 * MIB);
        assert_eq!(args.cu_seqlens_k as u64, 81 * MIB);
        assert!(args.seqused_k.is_null() && args.block_table.is_null());
        assert_eq!((args.q_row_stride, args.q_head_stride), (8 * 64, 64));
        assert_eq!((args.k_row_stride, args.k_head_stride), (2 * 64, 64));
        assert_eq!((args.lse_batch_stride, args.lse_head_stride), (0, 16));
        assert_eq!((args.window_left, args.window_right), (-1, -1));
    }

    #[test]
    fn causal_varlen_is_a_right_window_of_zero() {
        let mut call = Call::new();
        call.params.causal = true;
        call.params.window = (Some(3), Some(7));
        let (args, _) = call.run().unwrap();
        assert_eq!((args.window_left, args.window_right), (3, 0));
    }

    #[test]
    fn token_counts_must_match_the_tensors() {
        let mut call = Call::new();
        call.cu_q = vec![0, 3, 3, 12, 15];
        assert!(matches!(call.run().unwrap_err(), Error::ShapeMismatch(m) if m.contains("cu_seqlens_q ends at 15")));
        let mut call = Call::new();
        call.cu_k = vec![0, 10, 14, 14, 19];
        assert!(matches!(call.run().unwrap_err(), Error::ShapeMismatch(m) if m.contains("k holds 18")));
        let mut call = Call::new();
        call.cu_k = vec![0, 10, 18];
        assert!(matches!(call.run().unwrap_err(), Error::ShapeMismatch(m) if m.contains("4 sequences but")));
    }

    #[test]
    fn rejects_unpacked_tensors_and_bad_offsets() {
        let mut call = Call::new();
        call.q.layout = Layout::contiguous([2, 8, 8, 64]);
        call.o.layout = call.q.layout;
        assert!(matches!(call.run().unwrap_err(), Error::ShapeMismatch(m) if m.contains("packed")));
        let mut call = Call::new();
        call.cu_q = vec![0, 3, 2, 12, 16];
        assert!(matches!(call.run().unwrap_err(), Error::InvalidSeqOffsets(_)));
    }

    #[test]
    fn lse_holds_every_token_of_every_head() {
        let mut call = Call::new();
        call.lse_len = 8 * 16 - 1;
        assert!(matches!(call.run().unwrap_err(), Error::ShapeMismatch(m) if m.contains("heads_q * total_q = 128")));
    }

    #[test]
    fn outputs_must_not_overlap_the_offsets() {
        let mut call = Call::new();
        call.lse_addr = 80 * MIB;
        assert_eq!(call.run().unwrap_err(), Error::Aliasing { output: "lse", other: "cu_seqlens_q" });
    }

    #[test]
    fn rejects_row_strides_past_the_kernels_32_bit_offsets() {
        let past = MAX_ROW_STRIDE + 8;
        for name in ["q", "k", "v", "o"] {
            let mut call = Call::new();
            set_row_stride([&mut call.q, &mut call.k, &mut call.v, &mut call.o], name, past);
            let err = call.run().unwrap_err();
            assert_eq!(err, Error::RowStrideTooLarge { tensor: name, stride: past, max: MAX_ROW_STRIDE });
        }
    }

    #[test]
    fn per_batch_alibi_counts_sequences() {
        // 4 sequences * 8 heads slopes.
        let slopes = device_slice::<f32>(90 * MIB, 32);
        let mut call = Call::new();
        call.params.alibi_slopes = Some(slopes);
        let (args, _) = call.run().unwrap();
        assert_eq!((args.alibi_slopes as u64, args.alibi_batch_stride), (90 * MIB, 8));
    }

    #[test]
    fn offsets_start_at_zero_and_never_decrease() {
        assert_eq!(check_seq_offsets(&[0, 3, 3, 12]).unwrap(), OffsetsSummary { batch: 3, total: 12, max_len: 9 });
        assert_eq!(check_seq_offsets(&[0, 0]).unwrap(), OffsetsSummary { batch: 1, total: 0, max_len: 0 });
        let err = |o: &[i32]| match check_seq_offsets(o).unwrap_err() {
            Error::InvalidSeqOffsets(msg) => msg,
            e => panic!("{e}"),
        };
        assert!(err(&[]).contains("at least 2"));
        assert!(err(&[0]).contains("at least 2"));
        assert!(err(&[1, 3]).contains("start at 0"));
        assert!(err(&[0, 5, 4]).contains("offset 2 (4) is below offset 1 (5)"));
        assert!(err(&[0, -1]).contains("below"));
    }
}

//! The tensor maps through which the sm_90a kernels' TMA loads read q, k,
//! v (and the backward's dO).

use flash_attn_abi::hopper::SLAB_COLUMNS;
use flash_attn_abi::kernels::Dtype;
use flash_attn_abi::sm90::{L2Promotion, OobFill, TensorDataType, TensorMapParams, TmaSwizzle};

use crate::call::{Call, TensorAt};

/// The tensor map TMA reads `t` of `call` through: `[batch, seqlen, heads,
/// head_dim]` as (head_dim, seqlen, heads, batch), innermost first, in boxes
/// of `columns` (64: the 128-byte swizzle, 32: the 64-byte one) and `rows`
/// rows, zero-filled past each dimension.
pub fn tma_map(
    call: &Call,
    t: &TensorAt,
    [batch, seqlen, heads]: [usize; 3],
    (columns, rows): (u32, u32),
) -> TensorMapParams {
    let p = &call.problem;
    let data_type = match call.dtype {
        Dtype::F16 => TensorDataType::F16,
        Dtype::Bf16 => TensorDataType::Bf16,
    };
    let [batch_stride, row_stride, head_stride] = t.strides;
    let sizes = [seqlen, heads, batch].map(|n| n as u64);
    // A dimension of one index never steps: any stride TMA takes, not its
    // own (a packed tensor's batch stride, which validation leaves
    // unchecked, may be anything). The others' spans were checked.
    let stride = |n: u64, elements: i64| if n == 1 { 16 } else { 2 * elements as u64 };
    TensorMapParams {
        data_type,
        rank: 4,
        global_address: t.addr,
        global_dims: [p.head_dim as u64, sizes[0], sizes[1], sizes[2], 1],
        global_strides: [
            stride(sizes[0], row_stride),
            stride(sizes[1], head_stride),
            stride(sizes[2], batch_stride),
            0,
        ],
        box_dims: [columns, rows, 1, 1, 1],
        element_strides: [1; 5],
        swizzle: if columns == SLAB_COLUMNS { TmaSwizzle::B128 } else { TmaSwizzle::B64 },
        l2_promotion: L2Promotion::B256,
        oob_fill: OobFill::Zero,
    }
}

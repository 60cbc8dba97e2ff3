//! The end of a block whose warps split the keys (the decode kernels): each
//! warp holds the online-softmax state and unnormalised O of the same query
//! rows, over its own key blocks. The warps meet in shared memory: each
//! rescales its state to the rows' common max, then warp 0 adds up the
//! others' sums and O and writes the block's output as a one-warp block
//! would. A warp that saw no key holds max -inf, sum 0 and O = 0, and adds
//! nothing.

use crate::arch;
use crate::common::mma::Accumulators;
use crate::common::softmax::OnlineSoftmax;

/// Bytes of shared memory the merge of `warps` warps of `m_tiles` m-tiles
/// over `dim_tiles` 8-column tiles of O uses: each warp's row maxes, then
/// the 16-byte groups (four f32 of one O tile, or two row sums and two
/// unused) that warps 1.. hand to warp 0, one per lane.
pub const fn scratch_bytes(warps: u32, m_tiles: u32, dim_tiles: u32) -> u32 {
    warps * 16 * m_tiles * 4 + (warps - 1) * groups(m_tiles, dim_tiles) * 32 * 16
}

/// 16-byte groups per lane handed over: the O tiles, and one of row sums per m-tile.
const fn groups(m_tiles: u32, dim_tiles: u32) -> u32 {
    m_tiles * dim_tiles + m_tiles
}

/// Merges the `warps` warps' `softmax` and `o` into warp 0's through
/// `scratch`, a 16-byte aligned shared region of [`scratch_bytes`] that
/// overlays the K/V stages. Every warp of the block calls it, after its key
/// loop; returns whether this warp (warp 0) holds the merged result.
///
/// # Safety
/// `scratch` is the block's shared memory, free once every warp is past its
/// key loop.
#[inline(always)]
pub unsafe fn merge_into_first_warp<const M_TILES: usize, const DIM_TILES: usize>(
    softmax: &mut OnlineSoftmax<M_TILES>,
    o: &mut Accumulators<M_TILES, DIM_TILES>,
    scratch: u32,
    warps: u32,
    warp: u32,
    lane: u32,
    scale_log2: f32,
) -> bool {
    let rows = 16 * M_TILES as u32;
    let row_of = |m: usize, half: usize| (m as u32) * 16 + (half as u32) * 8 + lane / 4;
    let max_addr = |w: u32, row: u32| scratch + 4 * (w * rows + row);
    // Every warp is done with its K/V stages (the last groups in flight
    // are empty commits).
    arch::cp_async_wait::<0>();
    arch::sync_threads();
    // The four lanes of a quad hold the same max of a row.
    for m in 0..M_TILES {
        for half in 0..2 {
            if lane % 4 == 0 {
                arch::st_shared_u32(max_addr(warp, row_of(m, half)), softmax.row_max[m][half].to_bits());
            }
        }
    }
    arch::sync_threads();
    for m in 0..M_TILES {
        for half in 0..2 {
            let row = row_of(m, half);
            let mut max = f32::NEG_INFINITY;
            for w in 0..warps {
                max = max.max(f32::from_bits(arch::ld_shared_u32(max_addr(w, row))));
            }
            // A row no warp saw a key of keeps max -inf: its factors are 0.
            softmax.move_row_max(m, half, max, o, scale_log2);
        }
    }
    // Lane-interleaved groups: a warp's lanes store and load 512 contiguous bytes.
    let groups = groups(M_TILES as u32, DIM_TILES as u32);
    let group_addr = |w: u32, group: u32| scratch + 4 * warps * rows + (((w - 1) * groups + group) * 32 + lane) * 16;
    let store = |group: u32, values: [f32; 4]| {
        for (i, value) in values.iter().enumerate() {
            arch::st_shared_u32(group_addr(warp, group) + 4 * i as u32, value.to_bits());
        }
    };
    if warp != 0 {
        for m in 0..M_TILES {
            for d in 0..DIM_TILES {
                store((m * DIM_TILES + d) as u32, o[m][d]);
            }
            let [sum0, sum1] = softmax.row_sum[m];
            store((M_TILES * DIM_TILES + m) as u32, [sum0, sum1, 0.0, 0.0]);
        }
    }
    arch::sync_threads();
    if warp != 0 {
        return false;
    }
    for w in 1..warps {
        for m in 0..M_TILES {
            for d in 0..DIM_TILES {
                let bits = arch::ld_shared_v4(group_addr(w, (m * DIM_TILES + d) as u32));
                for i in 0..4 {
                    o[m][d][i] += f32::from_bits(bits[i]);
                }
            }
            let bits = arch::ld_shared_v4(group_addr(w, (M_TILES * DIM_TILES + m) as u32));
            softmax.row_sum[m][0] += f32::from_bits(bits[0]);
            softmax.row_sum[m][1] += f32::from_bits(bits[1]);
        }
    }
    true
}

//! What the warp-collective instructions compute from the registers of all
//! 32 lanes, as the PTX ISA's fragment layouts define it. With
//! `g = lane / 4` ("groupID") and `t = lane % 4` ("threadID_in_group"):
//!
//! - `ldmatrix.m8n8.x4.b16`: lane `8i + r` gives the address of row `r` of
//!   matrix `i`; every lane receives, for each matrix `i`, one register with
//!   elements `(g, 2t)` and `(g, 2t + 1)` (low half first), or with `.trans`
//!   elements `(2t, g)` and `(2t + 1, g)`.
//! - `mma.m16n8k16` with `.f16`/`.bf16` A and B and `.f32` C and D:
//!   A element `a_i` (two per register) sits at row `g` for
//!   `i in {0, 1, 4, 5}` and `g + 8` otherwise, column `2t + (i & 1)` for
//!   `i < 4` and `2t + (i & 1) + 8` otherwise; B element `b_i` at row
//!   `2t + (i & 1)` for `i < 2` and `2t + (i & 1) + 8` otherwise, column `g`;
//!   C and D element `c_i` at row `g` for `i < 2` and `g + 8` otherwise,
//!   column `2t + (i & 1)`.
//! - `shfl.sync.bfly.b32` with `c = 0x1f`: lane `l` reads lane `l ^ b`,
//!   or keeps its own value when that lies past lane 31.

use super::float::{self, HalfType};

/// Registers of one warp, by lane.
pub(crate) type Warp<T> = [T; 32];

fn group(lane: usize) -> (usize, usize) {
    (lane / 4, lane % 4)
}

fn pack(lo: u16, hi: u16) -> u32 {
    u32::from(lo) | (u32::from(hi) << 16)
}

fn unpack(r: u32) -> [u16; 2] {
    [r as u16, (r >> 16) as u16]
}

/// `ldmatrix.sync.aligned.m8n8.x4{.trans}.shared.b16`, given the 16-byte
/// row each lane addressed.
pub(crate) fn ldmatrix_x4(rows: &Warp<[u16; 8]>, trans: bool) -> Warp<[u32; 4]> {
    std::array::from_fn(|lane| {
        let (g, t) = group(lane);
        std::array::from_fn(|i| {
            let matrix = &rows[8 * i..8 * i + 8];
            if trans {
                pack(matrix[2 * t][g], matrix[2 * t + 1][g])
            } else {
                pack(matrix[g][2 * t], matrix[g][2 * t + 1])
            }
        })
    })
}

/// `mma.sync.aligned.m16n8k16.row.col.f32.{ty}.{ty}.f32`: `d = a * b + c`.
pub(crate) fn mma_m16n8k16(ty: HalfType, a: &Warp<[u32; 4]>, b: &Warp<[u32; 2]>, c: &Warp<[f32; 4]>) -> Warp<[f32; 4]> {
    // Gather the whole matrices from the fragments.
    let mut a_rows = [[0u16; 16]; 16];
    let mut b_cols = [[0u16; 16]; 8];
    let mut c_full = [[0f32; 8]; 16];
    for lane in 0..32 {
        let (g, t) = group(lane);
        for (r, &reg) in a[lane].iter().enumerate() {
            let row = g + 8 * (r % 2);
            let col = 2 * t + 8 * (r / 2);
            [a_rows[row][col], a_rows[row][col + 1]] = unpack(reg);
        }
        for (r, &reg) in b[lane].iter().enumerate() {
            let row = 2 * t + 8 * r;
            [b_cols[g][row], b_cols[g][row + 1]] = unpack(reg);
        }
        for (i, &value) in c[lane].iter().enumerate() {
            c_full[g + 8 * (i / 2)][2 * t + i % 2] = value;
        }
    }
    std::array::from_fn(|lane| {
        let (g, t) = group(lane);
        std::array::from_fn(|i| {
            let (row, col) = (g + 8 * (i / 2), 2 * t + i % 2);
            float::dot(ty, c_full[row][col], &a_rows[row], &b_cols[col])
        })
    })
}

/// `shfl.sync.bfly.b32 d, a, b, 0x1f, 0xffffffff`.
pub(crate) fn shfl_bfly(values: &Warp<u32>, lane_masks: &Warp<u32>) -> Warp<u32> {
    std::array::from_fn(|lane| {
        let source = lane as u32 ^ lane_masks[lane];
        if source <= 31 {
            values[source as usize]
        } else {
            values[lane]
        }
    })
}

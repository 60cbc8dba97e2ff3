//! The sm_90a forward kernels (issue 29), in the design FlashAttention-3
//! published: warp specialization over TMA and `wgmma`.
//!
//! A block of three warpgroups computes 128 query rows of one head:
//!
//! - warpgroup 0, the producer ([`producer`]), gives its registers to the
//!   consumers (`setmaxnreg`) and one thread issues every TMA load: Q once,
//!   then each key block's K and V into a ring of stages, each stage
//!   guarded by a full and an empty mbarrier;
//! - warpgroups 1 and 2, the consumers ([`consumer`]), own 64 rows each:
//!   per key block `S = Q K^T` by `wgmma` from shared memory, the mask and
//!   the online softmax in registers, `O += P V` by `wgmma` with P from
//!   registers, then release the stage; at the end they normalise O and
//!   write it with the LSE.
//!
//! [`smem`] lays out the shared memory and builds the `wgmma` descriptors
//! of its tiles. The argument block and the table of instances are the
//! ABI's ([`flash_attn_abi::hopper`]).

pub mod consumer;
pub mod producer;
pub mod smem;

use flash_attn_abi::hopper::{HopperParams, CONSUMER_REGISTERS, HOPPER_BLOCK_M, PRODUCER_REGISTERS};

use crate::arch;
use crate::element::Element;
use crate::problem::Visibility;
use smem::Smem;

/// What one block works on: a 128-row query block of one head and batch,
/// and the key blocks its rows see.
#[derive(Clone, Copy)]
pub struct HopperTile {
    pub head: u32,
    pub batch: u32,
    /// The block's first query row.
    pub first_row: u32,
    /// Key blocks `[key_block_begin, key_block_end)`.
    pub key_block_begin: u32,
    pub key_block_end: u32,
    pub visibility: Visibility,
}

impl HopperTile {
    /// The tile of this block: query blocks run in reverse order when
    /// causal, so that the longest rows start first. The general kernels
    /// read the window from the parameters; the others fix it.
    #[inline(always)]
    fn of_block<const BN: usize, const CAUSAL: bool, const GENERAL: bool>(p: &HopperParams) -> Self {
        let f = &p.forward;
        let block = arch::block_idx_x();
        let m_block = if CAUSAL { arch::grid_dim_x() - 1 - block } else { block };
        let first_row = m_block * HOPPER_BLOCK_M;
        let (left, right) = if GENERAL { (f.window_left, f.window_right) } else { (-1, if CAUSAL { 0 } else { -1 }) };
        let visibility =
            Visibility { seqlen_k: f.seqlen_k as i32, diagonal: f.seqlen_k as i32 - f.seqlen_q as i32, left, right };
        let last_row = (first_row + HOPPER_BLOCK_M).min(f.seqlen_q) - 1;
        let (key_block_begin, key_block_end) = visibility.key_blocks(first_row, last_row, BN as u32);
        HopperTile {
            head: arch::block_idx_y(),
            batch: arch::block_idx_z(),
            first_row,
            key_block_begin,
            key_block_end,
            visibility,
        }
    }

    pub fn key_blocks(&self) -> u32 {
        self.key_block_end - self.key_block_begin
    }
}

/// The kernel body of one instance: element `E`, head dim `D`, `BN` keys
/// per stage, `STAGES` stages, causal, general (windows, softcap and ALiBi
/// from the parameters) or neither; the rest are the array sizes
/// that follow (Rust cannot derive them): `S_REGS = BN / 2` and `O_REGS =
/// D / 2` accumulator registers, `S_TILES = BN / 8` and `O_TILES = D / 8`
/// n8-tiles, `P_STEPS = BN / 16` k-steps of `P V`.
///
/// # Safety
/// Launched with [`flash_attn_abi::hopper::HOPPER_THREADS`] threads, the
/// config's shared memory, a grid of `(query blocks, heads_q, batch)`,
/// and `p` valid for it: tensor maps of q, k and v as the ABI describes,
/// o and the LSE large enough for every row.
#[inline(always)]
pub unsafe fn hopper_forward<
    E: Element,
    const D: usize,
    const BN: usize,
    const STAGES: usize,
    const CAUSAL: bool,
    const GENERAL: bool,
    const S_REGS: usize,
    const O_REGS: usize,
    const S_TILES: usize,
    const O_TILES: usize,
    const P_STEPS: usize,
>(
    p: &HopperParams,
) {
    const { assert!(S_REGS * 2 == BN && O_REGS * 2 == D && S_TILES * 8 == BN && O_TILES * 8 == D) }
    const { assert!(P_STEPS * 16 == BN) }
    let smem = Smem::<D, BN, STAGES>::at(arch::dynamic_smem_base());
    let tile = HopperTile::of_block::<BN, CAUSAL, GENERAL>(p);
    let tid = arch::thread_idx_x();
    if tid == 0 {
        smem.init_barriers();
    }
    arch::sync_threads();
    let warpgroup = tid / 128;
    if warpgroup == 0 {
        arch::setmaxnreg_dec::<PRODUCER_REGISTERS>();
        if tid == 0 {
            producer::load_tile(&smem, &tile, p.tensor_maps, p.forward.heads_per_kv);
        }
    } else {
        arch::setmaxnreg_inc::<CONSUMER_REGISTERS>();
        consumer::compute_tile::<E, D, BN, STAGES, CAUSAL, GENERAL, S_REGS, O_REGS, S_TILES, O_TILES, P_STEPS>(
            &p.forward,
            &smem,
            &tile,
            warpgroup - 1,
            tid % 128,
        );
    }
}

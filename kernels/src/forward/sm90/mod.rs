//! The sm_90a forward kernels (issue 29), in the design FlashAttention-3
//! published: warp specialization over TMA and `wgmma`.
//!
//! A block computes one or more tiles (`block_m` query rows of one head),
//! which [`scheduler`] picks: persistent blocks, one per SM, take several,
//! so that one tile's loads run during the previous tile's last GEMMs and
//! epilogue. A block is a producer warpgroup and two or three consumers:
//!
//! - warpgroup 0, the producer ([`producer`]), gives its registers to the
//!   consumers (`setmaxnreg`) and one thread picks the tiles and issues
//!   every TMA load: each tile's Q with the tile's index, into the Q
//!   buffer the consumers released last, then each key block's K and V into a
//!   ring of stages, each stage guarded by a full and an empty mbarrier;
//! - warpgroups 1 and up, the consumers ([`consumer`]), own 64 rows each:
//!   per key block `S = Q K^T` by `wgmma` from shared memory, the mask and
//!   the online softmax in registers, `O += P V` by `wgmma` with P from
//!   registers, then release the stage; at the end of a tile they release
//!   Q, and [`epilogue`] normalises O and writes it, through shared
//!   memory, with the LSE.
//!
//! [`smem`] lays out the shared memory and builds the `wgmma` descriptors
//! of its tiles. The argument block and the table of instances are the
//! ABI's ([`flash_attn_abi::hopper`]).

pub mod consumer;
pub mod epilogue;
pub mod producer;
pub mod scheduler;
pub mod smem;

use flash_attn_abi::hopper::{HopperParams, WARPGROUP_THREADS};

use crate::arch;
use crate::common::element::Element;
use scheduler::HopperTile;
use smem::Smem;

/// How far one side of the block (the producer, or a consumer) has come
/// through the block's tiles: the tiles handed over, each one phase of its
/// Q buffer's barriers (a tile without key blocks too, though it loads no
/// Q), and the key blocks loaded. Both sides count alike, so they agree on
/// each barrier phase and each load's stage.
#[derive(Clone, Copy, Default)]
pub struct Loads {
    pub tiles: u32,
    pub key_blocks: u32,
}

impl Loads {
    /// The ring stage of the current tile's key block `i`, and the parity
    /// of the phase its full barriers complete for it (the empty barriers'
    /// phase of the round before is the other parity).
    #[inline(always)]
    pub fn stage<const STAGES: usize>(&self, i: u32) -> (u32, u32) {
        let n = self.key_blocks + i;
        (n % STAGES as u32, (n / STAGES as u32) & 1)
    }

    /// The Q buffer of the current tile, of `buffers` that the tiles take
    /// in turn, and the parity of the phase its full barrier completes for
    /// it (its empty barrier's phase of the tile before in the buffer is
    /// the other parity).
    #[inline(always)]
    pub fn q_buffer(&self, buffers: u32) -> (u32, u32) {
        (self.tiles % buffers, (self.tiles / buffers) & 1)
    }

    /// Past `tile`, whose loads are done or issued.
    #[inline(always)]
    pub fn advance(&mut self, tile: &HopperTile) {
        self.tiles += 1;
        self.key_blocks += tile.key_blocks();
    }
}

/// The kernel body of one instance: element `E`, tiles of `BM` query
/// rows (64 per consumer), head dim `D` in Q and K tiles of `DT` columns
/// (the config's `tile_dim`), `BN` keys per stage, `STAGES` stages, causal,
/// general (windows, softcap and ALiBi from the parameters) or neither,
/// the registers per thread of the producer (`PRODUCER_REGS`) and of each
/// consumer (`CONSUMER_REGS`) after `setmaxnreg`; the rest are the array
/// sizes that follow (Rust cannot derive them): `S_REGS = BN / 2` and
/// `O_REGS = D / 2` accumulator registers, `S_TILES = BN / 8` and
/// `O_TILES = D / 8` n8-tiles, `P_STEPS = BN / 16` k-steps of `P V`.
///
/// # Safety
/// Launched with the config's threads (`.maxntid` of them), the
/// config's shared memory, a grid of `(blocks, 1, 1)` with at most
/// [`flash_attn_abi::hopper::hopper_tiles`] blocks,
/// and `p` valid for it: tensor maps of q, k and v as the ABI describes,
/// o and the LSE large enough for every row; for a general kernel,
/// `cu_seqlens_q` and `cu_seqlens_k` both null or both set (packed
/// sequences, the maps over one batch of all the tokens), `seqused_k` and
/// `block_table` null.
#[inline(always)]
pub unsafe fn hopper_forward<
    E: Element,
    const BM: usize,
    const D: usize,
    const DT: usize,
    const BN: usize,
    const STAGES: usize,
    const CAUSAL: bool,
    const GENERAL: bool,
    const PRODUCER_REGS: u32,
    const CONSUMER_REGS: u32,
    const S_REGS: usize,
    const O_REGS: usize,
    const S_TILES: usize,
    const O_TILES: usize,
    const P_STEPS: usize,
>(
    p: &HopperParams,
) {
    const { assert!(S_REGS * 2 == BN && O_REGS * 2 == D && S_TILES * 8 == BN && O_TILES * 8 == D) }
    const { assert!(P_STEPS * 16 == BN && D <= DT && D.is_multiple_of(16)) }
    let smem = Smem::<BM, D, DT, BN, STAGES>::at(arch::dynamic_smem_base());
    let tid = arch::thread_idx_x();
    if tid == 0 {
        smem.init_barriers();
    }
    arch::sync_threads();
    let warpgroup = tid / WARPGROUP_THREADS;
    if warpgroup == 0 {
        arch::setmaxnreg_dec::<PRODUCER_REGS>();
        if tid == 0 {
            producer::load_tiles::<BM, D, DT, BN, STAGES, CAUSAL, GENERAL>(p, &smem);
        }
    } else {
        arch::setmaxnreg_inc::<CONSUMER_REGS>();
        consumer::compute_tiles::<E, BM, D, DT, BN, STAGES, CAUSAL, GENERAL, S_REGS, O_REGS, S_TILES, O_TILES, P_STEPS>(
            p,
            &smem,
            warpgroup - 1,
            tid % WARPGROUP_THREADS,
        );
    }
}

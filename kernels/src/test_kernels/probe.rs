//! A probe of every arithmetic and data-movement primitive, for checking the
//! emulator against the GPU: one warp runs each instruction once per lane on
//! given inputs and writes the raw result bits. The same function runs as
//! the PTX kernel `probe_primitives` and in the emulator, and a GPU test
//! compares the two outputs.
//!
//! Launch: 1 block of 32 threads, [`SMEM_BYTES`] of dynamic shared memory.
//! `input` holds [`INPUT_WORDS`] words, `output` [`OUTPUT_WORDS`].

use crate::arch;

/// Shared memory the probe uses: the four 8x8 matrices of an ldmatrix.x4.
pub const SMEM_BYTES: u32 = 512;
/// Input words per lane after the shared-memory image.
pub const LANE_INPUT_WORDS: usize = 32;
/// Output words per lane.
pub const LANE_OUTPUT_WORDS: usize = 40;
/// Words of the input: the shared-memory image, then each lane's inputs.
pub const INPUT_WORDS: usize = SMEM_BYTES as usize / 4 + 32 * LANE_INPUT_WORDS;
/// Words of the output.
pub const OUTPUT_WORDS: usize = 32 * LANE_OUTPUT_WORDS;

/// Where each value sits among a lane's input words.
pub mod input {
    /// A fragment (4 words), B fragment (2), C accumulators (4 f32).
    pub const MMA_A: usize = 0;
    pub const MMA_B: usize = 4;
    pub const MMA_C: usize = 6;
    /// The f32 each lane offers to the shuffles.
    pub const SHUFFLE: usize = 10;
    /// Four arguments of `ex2.approx`, then four of `lg2`/`rcp`.
    pub const EXP2: usize = 11;
    pub const LOG2_RECIP: usize = 15;
    /// `a`, `b`, `c` of one `fma.rn`.
    pub const FMA: usize = 19;
    /// `lo`, `hi` f32 to pack.
    pub const PACK: usize = 22;
    /// The word `atom.global.add.u32` adds to, and what it adds.
    pub const ATOM: usize = 24;
}

/// Where each result sits among a lane's output words.
pub mod output {
    pub const LDMATRIX: usize = 0;
    pub const LDMATRIX_TRANS: usize = 4;
    pub const MMA_F16: usize = 8;
    pub const MMA_BF16: usize = 12;
    /// Shuffled values for masks 1, 2, 4, 8, 16.
    pub const SHUFFLE: usize = 16;
    pub const EXP2: usize = 21;
    pub const LOG2: usize = 25;
    pub const RECIP: usize = 29;
    pub const FMA: usize = 33;
    pub const PACK_F16: usize = 34;
    pub const PACK_BF16: usize = 35;
    /// Word [`ld_shared_word`] of the shared image, by `ld.shared.b32`.
    pub const LD_SHARED: usize = 36;
    /// `vote.sync.any` of "the low 6 bits of the lane's shuffle input are
    /// 0" (true in about 40% of random warps), as 1 or 0.
    pub const VOTE_ANY: usize = 37;
    /// What `atom.global.add.u32` returned, and the word it added to (the
    /// lane's own, so that no lanes contend).
    pub const ATOM_OLD: usize = 38;
    pub const ATOM_SUM: usize = 39;
}

/// The word of the shared-memory image that lane `lane` loads with
/// `ld.shared.b32`: a different word per lane, not the lane's own row.
pub const fn ld_shared_word(lane: u32) -> u32 {
    (lane * 5 + 3) % (SMEM_BYTES / 4)
}

/// The probe's body.
///
/// # Safety
/// `input` and `output` hold [`INPUT_WORDS`] and [`OUTPUT_WORDS`] words,
/// 16-byte aligned; launched as described in the module docs.
#[inline(always)]
pub unsafe fn probe_primitives(input: *const u32, output: *mut u32) {
    let lane = arch::thread_idx_x();
    let smem = arch::dynamic_smem_base();
    // Each lane copies 16 bytes of the shared image, then row `lane` of the
    // four matrices is at `smem + 16 * lane`.
    arch::cp_async_16(smem + 16 * lane, input.add(4 * lane as usize).cast(), 16);
    arch::cp_async_commit();
    arch::cp_async_wait::<0>();
    arch::sync_threads();

    // Plain loads and stores: this is test scaffolding, and both sides run
    // the same code; the primitives under test are the `arch` calls.
    let lane_in = input.add(SMEM_BYTES as usize / 4 + lane as usize * LANE_INPUT_WORDS);
    let word = |i: usize| *lane_in.add(i);
    let float = |i: usize| f32::from_bits(word(i));
    let out = output.add(lane as usize * LANE_OUTPUT_WORDS);
    let put = |i: usize, value: u32| out.add(i).write(value);
    let put4 = |i: usize, values: [u32; 4]| {
        for (j, v) in values.into_iter().enumerate() {
            put(i + j, v);
        }
    };

    put4(output::LDMATRIX, arch::ldmatrix_x4(smem + 16 * lane));
    put4(output::LDMATRIX_TRANS, arch::ldmatrix_x4_trans(smem + 16 * lane));

    let a = [word(input::MMA_A), word(input::MMA_A + 1), word(input::MMA_A + 2), word(input::MMA_A + 3)];
    let b = [word(input::MMA_B), word(input::MMA_B + 1)];
    let c = [float(input::MMA_C), float(input::MMA_C + 1), float(input::MMA_C + 2), float(input::MMA_C + 3)];
    let mut d = c;
    arch::mma_f16(&mut d, &a, &b);
    put4(output::MMA_F16, d.map(f32::to_bits));
    let mut d = c;
    arch::mma_bf16(&mut d, &a, &b);
    put4(output::MMA_BF16, d.map(f32::to_bits));

    for (j, mask) in [1, 2, 4, 8, 16].into_iter().enumerate() {
        put(output::SHUFFLE + j, arch::shfl_xor_f32(float(input::SHUFFLE), mask).to_bits());
    }
    for j in 0..4 {
        put(output::EXP2 + j, arch::exp2(float(input::EXP2 + j)).to_bits());
        put(output::LOG2 + j, arch::log2(float(input::LOG2_RECIP + j)).to_bits());
        put(output::RECIP + j, arch::recip(float(input::LOG2_RECIP + j)).to_bits());
    }
    put(output::FMA, arch::fma(float(input::FMA), float(input::FMA + 1), float(input::FMA + 2)).to_bits());
    put(output::PACK_F16, arch::pack_f16x2(float(input::PACK), float(input::PACK + 1)));
    put(output::PACK_BF16, arch::pack_bf16x2(float(input::PACK), float(input::PACK + 1)));
    put(output::LD_SHARED, arch::ld_shared_u32(smem + 4 * ld_shared_word(lane)));
    put(output::VOTE_ANY, arch::any_sync(float(input::SHUFFLE).to_bits() & 63 == 0) as u32);
    put(output::ATOM_SUM, word(input::ATOM));
    put(output::ATOM_OLD, arch::atom_global_add_u32(out.add(output::ATOM_SUM), word(input::ATOM + 1)));
}

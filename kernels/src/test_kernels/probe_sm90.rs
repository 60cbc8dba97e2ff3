//! A probe of the sm_90a primitives, for checking the emulator against an
//! H100/H200: one block of three warpgroups runs each on fixed inputs and
//! writes what it saw. The same function runs as the PTX kernel
//! `probe_sm90` (in `tests/test-kernels-sm90a.ptx`, built for sm_90a) and in
//! the emulator; a GPU test compares the two outputs, and the emulator
//! tests compare the emulator's with a plain model.
//!
//! - warpgroup 0, the producer: `setmaxnreg.dec` to [`PRODUCER_REGS`];
//!   thread 0 initialises the mbarriers, issues four TMA loads (A, B and the
//!   two 64-column halves of V below, 128-byte swizzle; B's box runs past
//!   the tensor's rows and V's start 8 rows before it, so both are partly
//!   zero-filled) behind one
//!   `arrive.expect_tx`, runs an mbarrier phase sequence, and arrives at
//!   named barrier 2; after the loads land the warpgroup copies the A tile
//!   and V's first half out as they lie in shared memory (the swizzle);
//! - warpgroups 1 and 2, the consumers: `setmaxnreg.inc` to
//!   [`CONSUMER_REGS`], wait for the loads, then
//!   - warpgroup 1: `D1 = A B^T` (SS, N = 256, B K-major) over K = 64;
//!   - warpgroup 2: `D2 = A2 V` (SS, N = 128, V MN-major: `imm-trans-b` 1,
//!     its halves a leading byte offset apart)
//!     with A2 a copy of A the warpgroup stores itself (`st.shared` in the
//!     128-byte swizzle, then `fence.proxy.async`), and `D3 = A B[0..128]^T`
//!     (RS: A from registers, N = 128);
//!   - both exchange a word through named barrier 1 (256 threads).
//!
//! Inputs: `maps` holds three tensor maps (A, B, V); `input` the A matrix
//! (the RS fragments and A2 are read from it); `bf16` chooses the wgmma type.
//! Launch: 1 block of [`THREADS`] threads, [`SMEM_BYTES`] of dynamic shared
//! memory, 168 registers per thread (what `.maxntid 384` gives).

use crate::arch::{self, WgmmaAccumulator};
use flash_attn_abi::sm90::{DescriptorSwizzle, MatrixDescriptor, TensorMap};

/// Threads of the block: three warpgroups.
pub const THREADS: u32 = 384;
/// The producer's and the consumers' registers per thread after
/// `setmaxnreg`: all of the 168 x 384 the launch allocates.
pub const PRODUCER_REGS: u32 = 24;
pub const CONSUMER_REGS: u32 = 240;

/// A: 64 x 64 (rows M, K contiguous); B: [`B_ROWS`] x 64 (rows N, K
/// contiguous), loaded as a 256-row box; V: 64 x [`V_COLS`] (rows K, N
/// contiguous), loaded as two 64 x 64 boxes from row [`V_FIRST_ROW`].
pub const A_ROWS: u32 = 64;
pub const B_ROWS: u32 = 200;
pub const B_BOX_ROWS: u32 = 256;
pub const V_ROWS: u32 = 64;
pub const V_COLS: u32 = 128;
pub const V_FIRST_ROW: i32 = -8;
/// K of every product, and the columns of A and B.
pub const K: u32 = 64;

/// Shared-memory offsets from the 1024-byte aligned base.
mod smem {
    pub const A: u32 = 0;
    pub const B: u32 = A + 64 * 128;
    /// V's two 64-column halves, 8 KiB apart.
    pub const V: u32 = B + 256 * 128;
    pub const A2: u32 = V + 2 * 64 * 128;
    pub const FULL: u32 = A2 + 64 * 128;
    pub const PHASES: u32 = FULL + 8;
    pub const FLAG: u32 = FULL + 16;
    pub const EXCHANGE: u32 = FULL + 128;
    pub const END: u32 = EXCHANGE + 2 * 128 * 4;
}

/// Dynamic shared memory: the layout above plus the slack that aligning
/// its base to 1024 bytes (the 128-byte swizzle's repeat) may take.
pub const SMEM_BYTES: u32 = smem::END + 1024;

/// Where each result sits in the output (words).
pub mod output {
    /// D1: 128 registers per thread of warpgroup 1.
    pub const D1: usize = 0;
    /// D2: 64 registers per thread of warpgroup 2.
    pub const D2: usize = D1 + 128 * 128;
    /// D3: 64 registers per thread of warpgroup 2.
    pub const D3: usize = D2 + 128 * 64;
    /// The A tile and V's first half as they lie in shared memory (2048
    /// words each).
    pub const A_TILE: usize = D3 + 128 * 64;
    pub const V_TILE: usize = A_TILE + 2048;
    /// The mbarrier phase sequence: [`super::PHASE_STEPS`] answers of `try_wait.parity`.
    pub const PHASES: usize = V_TILE + 2048;
    /// The flag warpgroup 1 read after named barrier 2.
    pub const FLAG: usize = PHASES + 8;
    /// The word each consumer thread read from the other warpgroup after
    /// named barrier 1 (warpgroup 1's 128, then warpgroup 2's).
    pub const EXCHANGE: usize = FLAG + 1;
    /// Words of the output.
    pub const WORDS: usize = EXCHANGE + 256;
}

/// Answers of `try_wait.parity` the phase sequence records.
pub const PHASE_STEPS: usize = 6;
/// The flag the producer stores before arriving at named barrier 2.
pub const FLAG: u32 = 0x5eed_f00d;

/// Words of `input`: the A matrix, two 16-bit elements per word.
pub const INPUT_WORDS: usize = (A_ROWS * K / 2) as usize;

/// The 128-byte swizzle of a K-major tile of 128-byte rows: logical chunk
/// `c` of row `r` at chunk `c ^ (r % 8)`.
#[inline(always)]
fn swizzled(base: u32, row: u32, chunk: u32) -> u32 {
    base + 128 * row + 16 * (chunk ^ (row % 8))
}

/// A descriptor of a 128-byte swizzled operand at `start` (8-row groups
/// 1024 bytes apart: SBO; LBO `leading` is read for MN-major operands only).
#[inline(always)]
fn descriptor(start: u32, leading: u32) -> u64 {
    MatrixDescriptor {
        start,
        leading_byte_offset: leading,
        stride_byte_offset: 1024,
        base_offset: 0,
        swizzle: DescriptorSwizzle::B128,
    }
    .encode()
}

/// The probe's body.
///
/// # Safety
/// `maps` points to three tensor maps (A, B, V) in global memory, 64-byte
/// aligned; `input` holds [`INPUT_WORDS`] words, `output`
/// [`output::WORDS`]; launched as the module docs say.
#[inline(always)]
pub unsafe fn probe_sm90(maps: *const TensorMap, input: *const u32, output: *mut u32, bf16: u32) {
    let tid = arch::thread_idx_x();
    let (group, t) = (tid / 128, tid % 128);
    let base = (arch::dynamic_smem_base() + 1023) & !1023;
    let full = base + smem::FULL;
    let phases = base + smem::PHASES;
    let put = |i: usize, value: u32| output.add(i).write(value);
    if tid == 0 {
        arch::mbarrier_init(full, 1);
        arch::mbarrier_init(phases, 1);
        arch::fence_mbarrier_init();
    }
    arch::sync_threads();

    if group == 0 {
        arch::setmaxnreg_dec::<PRODUCER_REGS>();
        if t == 0 {
            arch::mbarrier_arrive_expect_tx(full, (A_ROWS + B_BOX_ROWS + 2 * V_ROWS) * 128);
            arch::tma_load_2d(base + smem::A, maps, [0, 0], full);
            arch::tma_load_2d(base + smem::B, maps.add(1), [0, 0], full);
            arch::tma_load_2d(base + smem::V, maps.add(2), [0, V_FIRST_ROW], full);
            arch::tma_load_2d(base + smem::V + 64 * 128, maps.add(2), [64, V_FIRST_ROW], full);
            // Phase 0 in progress: parity 1 (the "previous" phase) counts as
            // completed, parity 0 not yet.
            let answers = [
                arch::mbarrier_try_wait_parity(phases, 1),
                arch::mbarrier_try_wait_parity(phases, 0),
                {
                    arch::mbarrier_arrive(phases);
                    arch::mbarrier_try_wait_parity(phases, 0)
                },
                {
                    // Phase 1: the arrival is in, 64 transaction bytes are not.
                    arch::mbarrier_arrive_expect_tx(phases, 64);
                    arch::mbarrier_try_wait_parity(phases, 1)
                },
                {
                    arch::mbarrier_complete_tx(phases, 48);
                    arch::mbarrier_try_wait_parity(phases, 1)
                },
                {
                    arch::mbarrier_complete_tx(phases, 16);
                    arch::mbarrier_try_wait_parity(phases, 1)
                },
            ];
            for (i, answer) in answers.into_iter().enumerate() {
                put(output::PHASES + i, answer as u32);
            }
            arch::st_shared_u32(base + smem::FLAG, FLAG);
        }
        arch::named_barrier_arrive(2, 256);
        arch::mbarrier_wait_parity(full, 0);
        for i in 0..16 {
            let word = 4 * (t + 128 * i);
            put(output::A_TILE + (t + 128 * i) as usize, arch::ld_shared_u32(base + smem::A + word));
            put(output::V_TILE + (t + 128 * i) as usize, arch::ld_shared_u32(base + smem::V + word));
        }
        return;
    }

    arch::setmaxnreg_inc::<CONSUMER_REGS>();
    let a_desc = |k_step: u32| descriptor(base + smem::A + 32 * k_step, 16);
    if group == 1 {
        arch::named_barrier_sync(2, 256);
        put(output::FLAG, arch::ld_shared_u32(base + smem::FLAG));
        arch::mbarrier_wait_parity(full, 0);
        let mut d1 = WgmmaAccumulator::<128>::new([0.0; 128]);
        arch::wgmma_fence();
        for k_step in 0..K / 16 {
            let b = descriptor(base + smem::B + 32 * k_step, 16);
            if bf16 != 0 {
                arch::wgmma_ss_bf16::<128, 0, 0>(&mut d1, a_desc(k_step), b, k_step > 0);
            } else {
                arch::wgmma_ss_f16::<128, 0, 0>(&mut d1, a_desc(k_step), b, k_step > 0);
            }
        }
        arch::wgmma_commit_group();
        arch::wgmma_wait_group::<0>();
        for (i, d) in d1.get().iter().enumerate() {
            put(output::D1 + 128 * t as usize + i, d.to_bits());
        }
    } else {
        // A2: A stored by the warpgroup's own threads (one 16-byte chunk per
        // thread and step) in the swizzle TMA would use; then the fence that
        // lets wgmma (the async proxy) see the stores.
        for step in 0..4 {
            let (row, chunk) = ((t + 128 * step) / 8, (t + 128 * step) % 8);
            let src = input.add((row * K / 2 + 4 * chunk) as usize);
            for w in 0..4 {
                arch::st_shared_u32(swizzled(base + smem::A2, row, chunk) + 4 * w, *src.add(w as usize));
            }
        }
        arch::fence_proxy_async_shared();
        arch::named_barrier_sync(3, 128);
        arch::mbarrier_wait_parity(full, 0);
        let mut d2 = WgmmaAccumulator::<64>::new([0.0; 64]);
        let mut d3 = WgmmaAccumulator::<64>::new([0.0; 64]);
        arch::wgmma_fence();
        for k_step in 0..K / 16 {
            let a2 = descriptor(base + smem::A2 + 32 * k_step, 16);
            // V MN-major: 16 keys per step, 8-key groups 1024 bytes apart
            // (SBO), the 64-column halves 8 KiB apart (LBO).
            let v = descriptor(base + smem::V + 2048 * k_step, 64 * 128);
            let b = descriptor(base + smem::B + 32 * k_step, 16);
            // This thread's A fragment of the step (m16n8k16 A layout over
            // rows 16 * warp up).
            let (row, col) = (16 * (t / 32) + t % 32 / 4, 16 * k_step + 2 * (t % 4));
            let at = |r: u32, c: u32| *input.add(((r * K + c) / 2) as usize);
            let a = [at(row, col), at(row + 8, col), at(row, col + 8), at(row + 8, col + 8)];
            if bf16 != 0 {
                arch::wgmma_ss_bf16::<64, 0, 1>(&mut d2, a2, v, k_step > 0);
                arch::wgmma_rs_bf16::<64, 0>(&mut d3, &a, b, k_step > 0);
            } else {
                arch::wgmma_ss_f16::<64, 0, 1>(&mut d2, a2, v, k_step > 0);
                arch::wgmma_rs_f16::<64, 0>(&mut d3, &a, b, k_step > 0);
            }
        }
        arch::wgmma_commit_group();
        arch::wgmma_wait_group::<0>();
        for (i, d) in d2.get().iter().enumerate() {
            put(output::D2 + 64 * t as usize + i, d.to_bits());
        }
        for (i, d) in d3.get().iter().enumerate() {
            put(output::D3 + 64 * t as usize + i, d.to_bits());
        }
    }
    // Each consumer thread hands the other warpgroup a word.
    let mine = base + smem::EXCHANGE + 4 * (128 * (group - 1) + t);
    let theirs = base + smem::EXCHANGE + 4 * (128 * (2 - group) + t);
    arch::st_shared_u32(mine, 1000 * group + t);
    arch::named_barrier_sync(1, 256);
    put(output::EXCHANGE + (128 * (group - 1) + t) as usize, arch::ld_shared_u32(theirs));
}

/// The host side of the probe: its inputs as the kernel takes them, the
/// parameters of its three tensor maps, and a run in the emulator. Shared
/// by the emulator tests and the GPU cross-check.
#[cfg(not(target_arch = "nvptx64"))]
pub mod host {
    use flash_attn_abi::sm90::{L2Promotion, OobFill, TensorDataType, TensorMapParams, TmaSwizzle};

    use super::{output, A_ROWS, B_BOX_ROWS, B_ROWS, K, SMEM_BYTES, THREADS, V_COLS, V_ROWS};
    use crate::emu::{launch, Error, GlobalRegion, LaunchConfig};

    /// Eight 16-bit elements, 16-byte aligned (TMA's global alignment).
    #[derive(Clone, Copy, Debug, Default, PartialEq)]
    #[repr(C, align(16))]
    pub struct Chunk(pub [u16; 8]);

    /// A (`A_ROWS` x `K`), B (`B_ROWS` x `K`) and V (`V_ROWS` x `V_COLS`),
    /// row-major 16-bit values of f16 or bf16 (`bf16`).
    pub struct Inputs {
        pub a: Vec<Chunk>,
        pub b: Vec<Chunk>,
        pub v: Vec<Chunk>,
        pub bf16: bool,
    }

    fn chunks(values: &[u16], rows: u32, cols: u32) -> Vec<Chunk> {
        assert_eq!(values.len(), (rows * cols) as usize, "a {rows} x {cols} matrix");
        values.chunks(8).map(|c| Chunk(c.try_into().expect("rows of whole chunks"))).collect()
    }

    impl Inputs {
        pub fn new(a: &[u16], b: &[u16], v: &[u16], bf16: bool) -> Self {
            Self { a: chunks(a, A_ROWS, K), b: chunks(b, B_ROWS, K), v: chunks(v, V_ROWS, V_COLS), bf16 }
        }

        /// The kernel's `input`: A, two elements per word.
        pub fn a_words(&self) -> Vec<u32> {
            self.a.iter().flat_map(|c| c.0.chunks(2).map(|p| u32::from(p[0]) | (u32::from(p[1]) << 16))).collect()
        }

        /// The tensor maps of A, B and V at `addresses` (global addresses of
        /// the three matrices): boxes of 64 columns (128 bytes: the 128B
        /// swizzle's span), zero fill; B's box runs past its rows.
        pub fn map_params(&self, addresses: [u64; 3]) -> [TensorMapParams; 3] {
            let data_type = if self.bf16 { TensorDataType::Bf16 } else { TensorDataType::F16 };
            let map = |address: u64, rows: u32, cols: u32, box_rows: u32| TensorMapParams {
                data_type,
                rank: 2,
                global_address: address,
                global_dims: [u64::from(cols), u64::from(rows), 1, 1, 1],
                global_strides: [2 * u64::from(cols), 0, 0, 0],
                box_dims: [64, box_rows, 1, 1, 1],
                element_strides: [1; 5],
                swizzle: TmaSwizzle::B128,
                l2_promotion: L2Promotion::B128,
                oob_fill: OobFill::Zero,
            };
            [
                map(addresses[0], A_ROWS, K, A_ROWS),
                map(addresses[1], B_ROWS, K, B_BOX_ROWS),
                map(addresses[2], V_ROWS, V_COLS, V_ROWS),
            ]
        }

        /// The probe in the emulator: its output words.
        pub fn run_emulated(&self) -> Result<Vec<u32>, Error> {
            let addresses = [&self.a, &self.b, &self.v].map(|m| m.as_ptr() as u64);
            let maps = self.map_params(addresses).map(|p| p.encode().expect("valid tensor map parameters"));
            let input = self.a_words();
            let mut out = vec![0xdead_beef_u32; output::WORDS];
            let regions = [
                GlobalRegion::read_only("tensor maps", &maps),
                GlobalRegion::read_only("A", &self.a),
                GlobalRegion::read_only("B", &self.b),
                GlobalRegion::read_only("V", &self.v),
                GlobalRegion::read_only("input", &input),
                GlobalRegion::writable("output", &mut out),
            ];
            let (maps_ptr, input_ptr, out_ptr) = (maps.as_ptr(), input.as_ptr(), out.as_mut_ptr());
            // 168 registers per thread: what `.maxntid 384` gives on the GPU.
            let config = LaunchConfig::new([1, 1, 1], THREADS, SMEM_BYTES);
            // SAFETY: the regions are the buffers behind the pointers.
            unsafe { launch(&config, &regions, || super::probe_sm90(maps_ptr, input_ptr, out_ptr, self.bf16 as u32)) }?;
            Ok(out)
        }
    }
}

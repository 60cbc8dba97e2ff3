//! Each device primitive, run through the emulator, against a plain model
//! of its PTX ISA definition. The models index the matrices the way the
//! ISA's fragment tables read: "row = groupID for a_i where 0 <= i < 2 ||
//! 4 <= i < 6, groupID + 8 otherwise", and so on.

use flash_attn_kernels::arch;
use flash_attn_kernels::emu::GlobalRegion;
use half::{bf16, f16};
use proptest::prelude::*;

use super::run_block;

/// `(row, col)` of A element `a_i` held by `lane` (mma.m16n8k16, .f16/.bf16).
fn a_position(lane: usize, i: usize) -> (usize, usize) {
    let (group, thread_in_group) = (lane >> 2, lane % 4);
    let row = if i < 2 || (4..6).contains(&i) { group } else { group + 8 };
    let col = if i < 4 { thread_in_group * 2 + (i & 1) } else { thread_in_group * 2 + (i & 1) + 8 };
    (row, col)
}

/// `(row, col)` of B element `b_i` held by `lane`.
fn b_position(lane: usize, i: usize) -> (usize, usize) {
    let (group, thread_in_group) = (lane >> 2, lane % 4);
    let row = if i < 2 { thread_in_group * 2 + (i & 1) } else { thread_in_group * 2 + (i & 1) + 8 };
    (row, group)
}

/// `(row, col)` of C/D element `c_i` held by `lane`.
fn c_position(lane: usize, i: usize) -> (usize, usize) {
    let (group, thread_in_group) = (lane >> 2, lane % 4);
    let row = if i < 2 { group } else { group + 8 };
    (row, thread_in_group * 2 + (i & 1))
}

/// Two 16-bit elements in one register, the first in the low half.
fn pack(lo: u16, hi: u16) -> u32 {
    u32::from(lo) | (u32::from(hi) << 16)
}

/// Where row `row` of matrix `matrix` of the `ldmatrix` test lives: a
/// permutation of 32 row slots (7 is odd, so the eight rows of a matrix
/// still fall in eight different bank groups).
fn row_addr(matrix: usize, row: usize) -> u32 {
    arch::dynamic_smem_base() + (((matrix * 8 + row) * 7 % 32) * 16) as u32
}

/// Element `(row, col)` of matrix `matrix`: all 256 distinct.
fn element(matrix: usize, row: usize, col: usize) -> u16 {
    (matrix * 64 + row * 8 + col) as u16
}

/// Each lane stores the row it will address, then the warp runs `load`.
fn run_ldmatrix(load: unsafe fn(u32) -> [u32; 4]) -> Vec<[u32; 4]> {
    run_block(32, 512, &[], |lane| {
        let (matrix, row) = (lane as usize / 8, lane as usize % 8);
        for word in 0..4 {
            let value = pack(element(matrix, row, 2 * word), element(matrix, row, 2 * word + 1));
            unsafe { arch::st_shared_u32(row_addr(matrix, row) + 4 * word as u32, value) };
        }
        arch::sync_warp();
        unsafe { load(row_addr(matrix, row)) }
    })
    .unwrap()
}

/// Every (matrix, row, 32-bit word of the row) of an `ldmatrix.x4`.
fn matrix_words() -> impl Iterator<Item = (usize, usize, usize)> {
    (0..4).flat_map(|m| (0..8).flat_map(move |r| (0..4).map(move |w| (m, r, w))))
}

#[test]
fn ldmatrix_x4_gives_each_lane_its_fragment() {
    let got = run_ldmatrix(arch::ldmatrix_x4);
    // PTX ISA: each row is four 32-bit words; word w of row r of a matrix
    // goes to lane 4r + w, in the register of that matrix.
    for (matrix, row, word) in matrix_words() {
        let lane = 4 * row + word;
        let expected = pack(element(matrix, row, 2 * word), element(matrix, row, 2 * word + 1));
        assert_eq!(got[lane][matrix], expected, "lane {lane}, matrix {matrix}");
    }
}

#[test]
fn ldmatrix_x4_trans_gives_each_lane_the_transposed_fragment() {
    let got = run_ldmatrix(arch::ldmatrix_x4_trans);
    // With .trans the lane that would hold (r, 2w), (r, 2w + 1) holds
    // (2w, r), (2w + 1, r).
    for (matrix, row, word) in matrix_words() {
        let lane = 4 * row + word;
        let expected = pack(element(matrix, 2 * word, row), element(matrix, 2 * word + 1, row));
        assert_eq!(got[lane][matrix], expected, "lane {lane}, matrix {matrix}");
    }
}

/// A 16-bit float format of the mma test.
#[derive(Clone, Copy, Debug)]
enum Format {
    F16,
    Bf16,
}

impl Format {
    fn bits(self, x: f64) -> u16 {
        match self {
            Format::F16 => f16::from_f64(x).to_bits(),
            Format::Bf16 => bf16::from_f64(x).to_bits(),
        }
    }
}

/// Runs one `mma` of `format` on A (16x16), B (16x8) and C (16x8) given as
/// matrices, with fragments assembled per the ISA tables, and returns D.
fn run_mma(format: Format, a: &[[f64; 16]; 16], b: &[[f64; 8]; 16], c: &[[f32; 8]; 16]) -> [[f32; 8]; 16] {
    let lanes = run_block(32, 0, &[], |lane| {
        let lane = lane as usize;
        let a_frag: [u32; 4] = std::array::from_fn(|r| {
            let [(r0, c0), (r1, c1)] = [a_position(lane, 2 * r), a_position(lane, 2 * r + 1)];
            pack(format.bits(a[r0][c0]), format.bits(a[r1][c1]))
        });
        let b_frag: [u32; 2] = std::array::from_fn(|r| {
            let [(r0, c0), (r1, c1)] = [b_position(lane, 2 * r), b_position(lane, 2 * r + 1)];
            pack(format.bits(b[r0][c0]), format.bits(b[r1][c1]))
        });
        let mut acc: [f32; 4] = std::array::from_fn(|i| {
            let (row, col) = c_position(lane, i);
            c[row][col]
        });
        match format {
            Format::F16 => arch::mma_f16(&mut acc, &a_frag, &b_frag),
            Format::Bf16 => arch::mma_bf16(&mut acc, &a_frag, &b_frag),
        }
        acc
    })
    .unwrap();
    let mut d = [[f32::NAN; 8]; 16];
    for (lane, acc) in lanes.iter().enumerate() {
        for (i, &value) in acc.iter().enumerate() {
            let (row, col) = c_position(lane, i);
            d[row][col] = value;
        }
    }
    d
}

/// A (16x16), B (16x8) and C (16x8).
type MmaInputs = ([[f64; 16]; 16], [[f64; 8]; 16], [[f32; 8]; 16]);

/// Inputs whose products and sums are exact in f64, so that the f64 matrix
/// product rounded once to f32 is the one right answer: A and B are
/// multiples of 2^-8 below 4 in magnitude (exact in f16, and in bf16 when
/// `bf16_exact`), C multiples of 2^-16 below 8.
fn mma_inputs(bf16_exact: bool) -> impl Strategy<Value = MmaInputs> {
    let limit = if bf16_exact { 256 } else { 1024 };
    let small = move || (-limit..limit).prop_map(|k: i32| f64::from(k) / 256.0);
    (
        proptest::array::uniform16(proptest::array::uniform16(small())),
        proptest::array::uniform16(proptest::array::uniform8(small())),
        proptest::array::uniform16(proptest::array::uniform8(
            (-(8 << 16)..8 << 16).prop_map(|k: i32| k as f32 / 65536.0),
        )),
    )
}

fn matrix_product(a: &[[f64; 16]; 16], b: &[[f64; 8]; 16], c: &[[f32; 8]; 16]) -> [[f32; 8]; 16] {
    std::array::from_fn(|i| {
        std::array::from_fn(|j| ((0..16).map(|k| a[i][k] * b[k][j]).sum::<f64>() + f64::from(c[i][j])) as f32)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn mma_f16_is_the_matrix_product((a, b, c) in mma_inputs(false)) {
        prop_assert_eq!(run_mma(Format::F16, &a, &b, &c), matrix_product(&a, &b, &c));
    }

    #[test]
    fn mma_bf16_is_the_matrix_product((a, b, c) in mma_inputs(true)) {
        prop_assert_eq!(run_mma(Format::Bf16, &a, &b, &c), matrix_product(&a, &b, &c));
    }
}

#[test]
fn mma_rounds_the_exact_sum_once() {
    // 2^24 + 1 + 2^-30: an f32 (or f64) running sum loses the 2^-30 and
    // rounds the tie 2^24 + 1 to even, 2^24; the exact sum rounds up.
    let mut a = [[0.0; 16]; 16];
    let mut b = [[0.0; 8]; 16];
    (a[0][0], b[0][0]) = (4096.0, 4096.0);
    (a[0][1], b[1][0]) = (1.0, 1.0);
    (a[0][2], b[2][0]) = (2f64.powi(-15), 2f64.powi(-15));
    let d = run_mma(Format::F16, &a, &b, &[[0.0; 8]; 16]);
    assert_eq!(d[0][0], 16_777_218.0);
}

#[test]
fn shfl_bfly_reads_lane_xor_mask() {
    for mask in [0, 1, 2, 4, 8, 16, 31] {
        let got = run_block(32, 0, &[], |lane| arch::shfl_xor_f32(lane as f32 * 3.0, mask)).unwrap();
        for (lane, value) in got.iter().enumerate() {
            assert_eq!(*value, (lane as u32 ^ mask) as f32 * 3.0, "mask {mask}, lane {lane}");
        }
    }
    // With c = 0x1f a source past lane 31 is out of range: a lane keeps its own value.
    let got = run_block(32, 0, &[], |lane| arch::shfl_xor_f32(lane as f32, 32)).unwrap();
    assert!(got.iter().enumerate().all(|(lane, &v)| v == lane as f32));
}

#[test]
fn vote_any_is_true_in_every_lane_when_some_lane_votes_true() {
    for voters in [vec![], vec![0], vec![31], vec![5, 17], (0..32).collect()] {
        let got = run_block(32, 0, &[], |lane| arch::any_sync(voters.contains(&lane)) as u32).unwrap();
        let want = !voters.is_empty() as u32;
        assert!(got.iter().all(|&v| v == want), "voters {voters:?}: {got:?}");
    }
}

#[test]
fn ex2_matches_the_isa_special_values_and_is_correctly_rounded() {
    // PTX ISA table: -Inf -> +0, -0 -> +1, +0 -> +1, +Inf -> +Inf, NaN -> NaN.
    assert_eq!(arch::exp2(f32::NEG_INFINITY).to_bits(), 0.0f32.to_bits());
    assert_eq!(arch::exp2(-0.0), 1.0);
    assert_eq!(arch::exp2(0.0), 1.0);
    assert_eq!(arch::exp2(f32::INFINITY), f32::INFINITY);
    assert!(arch::exp2(f32::NAN).is_nan());
    // .ftz: a subnormal input counts as 0; a subnormal result becomes +0.
    assert_eq!(arch::exp2(f32::from_bits(1)), 1.0);
    assert_eq!(arch::exp2(-130.0).to_bits(), 0.0f32.to_bits());
    assert_eq!(arch::exp2(-126.0), f32::MIN_POSITIVE);
    assert_eq!(arch::exp2(128.0), f32::INFINITY);
    for i in -2000..2000 {
        let x = i as f32 * 0.0625 + 0.013;
        let exact = (x as f64).exp2();
        assert!(((arch::exp2(x) as f64) - exact).abs() <= ulp(exact) / 2.0, "exp2({x})");
    }
}

#[test]
fn lg2_matches_the_isa_special_values_and_is_correctly_rounded() {
    // PTX ISA table: -Inf, -normal -> NaN; -0, +0 -> -Inf; +Inf -> +Inf.
    assert!(arch::log2(f32::NEG_INFINITY).is_nan());
    assert!(arch::log2(-1.0).is_nan());
    assert_eq!(arch::log2(-0.0), f32::NEG_INFINITY);
    assert_eq!(arch::log2(0.0), f32::NEG_INFINITY);
    assert_eq!(arch::log2(f32::INFINITY), f32::INFINITY);
    // .ftz: a subnormal input counts as 0.
    assert_eq!(arch::log2(f32::from_bits(5)), f32::NEG_INFINITY);
    for i in 1..4000 {
        let x = i as f32 * 0.37;
        let exact = (x as f64).log2();
        assert!(((arch::log2(x) as f64) - exact).abs() <= ulp(exact) / 2.0, "log2({x})");
    }
}

#[test]
fn rcp_matches_the_isa_special_values_and_is_correctly_rounded() {
    assert_eq!(arch::recip(f32::NEG_INFINITY).to_bits(), (-0.0f32).to_bits());
    assert_eq!(arch::recip(-0.0), f32::NEG_INFINITY);
    assert_eq!(arch::recip(0.0), f32::INFINITY);
    assert_eq!(arch::recip(f32::INFINITY).to_bits(), 0.0f32.to_bits());
    assert!(arch::recip(f32::NAN).is_nan());
    // .ftz both ways.
    assert_eq!(arch::recip(-f32::from_bits(3)), f32::NEG_INFINITY);
    assert_eq!(arch::recip(2f32.powi(127)).to_bits(), 0.0f32.to_bits());
    assert_eq!(arch::recip(3.0), 1.0 / 3.0);
}

/// The spacing of f32 values at `x`.
fn ulp(x: f64) -> f64 {
    let x = (x as f32).abs();
    f64::from(f32::from_bits(x.to_bits() + 1) - x)
}

#[test]
fn fma_rounds_once() {
    let a = 1.0 + 2f32.powi(-12);
    // a * a = 1 + 2^-11 + 2^-24 exactly; rounded first, the 2^-24 (a tie)
    // would go.
    assert_eq!(arch::fma(a, a, -1.0), 2f32.powi(-11) + 2f32.powi(-24));
    // No .ftz: subnormal results are kept.
    assert_eq!(arch::fma(f32::MIN_POSITIVE, 0.5, 0.0), f32::MIN_POSITIVE / 2.0);
}

#[test]
fn cvt_packs_lo_in_the_low_half_rounding_to_nearest_even() {
    let f16_bits = |x: f32| arch::pack_f16x2(x, 0.0) as u16;
    assert_eq!(arch::pack_f16x2(1.0, -2.0), pack(0x3c00, 0xc000));
    assert_eq!(f16_bits(1.0 + 2f32.powi(-11)), 0x3c00); // tie: to even, 1
    assert_eq!(f16_bits(1.0 + 3.0 * 2f32.powi(-11)), 0x3c02); // tie: to even, 1 + 2^-9
    assert_eq!(f16_bits(1.0 + 2f32.powi(-11) + 2f32.powi(-20)), 0x3c01); // above the tie
    assert_eq!(f16_bits(65519.0), 0x7bff); // below the tie: 65504
    assert_eq!(f16_bits(65520.0), 0x7c00); // the tie rounds to even: +Inf
    assert_eq!(f16_bits(2f32.powi(-25)), 0x0000); // tie with the smallest subnormal
    assert_eq!(f16_bits(3.0 * 2f32.powi(-25)), 0x0002);
    assert_eq!(f16_bits(-0.0), 0x8000);

    let bf16_bits = |x: f32| arch::pack_bf16x2(x, 0.0) as u16;
    assert_eq!(arch::pack_bf16x2(1.0, -2.0), pack(0x3f80, 0xc000));
    assert_eq!(bf16_bits(1.0 + 2f32.powi(-8)), 0x3f80);
    assert_eq!(bf16_bits(1.0 + 3.0 * 2f32.powi(-8)), 0x3f82);
    assert_eq!(bf16_bits(f32::MAX), 0x7f80); // rounds past the largest bf16
    assert_eq!(bf16_bits(f32::from_bits(0x0001_8000)), 0x0002); // subnormals kept, tie to even
    assert!(f16::from_bits(f16_bits(f32::NAN)).is_nan() && bf16::from_bits(bf16_bits(f32::NAN)).is_nan());
}

#[test]
fn cp_async_copies_or_zero_fills_and_lands_at_wait_group() {
    #[repr(C, align(16))]
    struct Source([u8; 64]);
    let source = Source(std::array::from_fn(|i| i as u8 + 1));
    let regions = [GlobalRegion::read_only("source", &source.0)];
    let got = run_block(4, 64, &regions, |tid| unsafe {
        let dst = arch::dynamic_smem_base() + 16 * tid;
        // Threads 0 and 2 copy; 1 and 3 zero-fill without reading.
        let (src, bytes) =
            if tid % 2 == 0 { (source.0.as_ptr().add(16 * tid as usize), 16) } else { (std::ptr::null(), 0) };
        arch::cp_async_16(dst, src, bytes);
        arch::cp_async_commit();
        arch::cp_async_wait::<0>();
        arch::sync_threads();
        arch::ld_shared_v4(arch::dynamic_smem_base() + 16 * ((tid + 1) % 4))
    })
    .unwrap();
    for (tid, words) in got.iter().enumerate() {
        let from = (tid + 1) % 4;
        let expected: [u32; 4] = if from % 2 == 0 {
            std::array::from_fn(|w| u32::from_le_bytes(std::array::from_fn(|b| source.0[16 * from + 4 * w + b])))
        } else {
            [0; 4]
        };
        assert_eq!(*words, expected, "thread {tid} reads chunk {from}");
    }
}

#[test]
fn cp_async_of_4_bytes_copies_or_zero_fills_one_word() {
    #[repr(C, align(16))]
    struct Source([u8; 32]);
    let source = Source(std::array::from_fn(|i| i as u8 + 1));
    let regions = [GlobalRegion::read_only("source", &source.0)];
    // Words 0..8 start as 0xffffffff; even threads copy their word, odd
    // ones zero-fill it without reading, and a second group stays pending
    // until its own wait.
    let got = run_block(8, 64, &regions, |tid| unsafe {
        let base = arch::dynamic_smem_base();
        arch::st_shared_u32(base + 4 * tid, u32::MAX);
        arch::sync_threads();
        let (src, bytes) =
            if tid % 2 == 0 { (source.0.as_ptr().add(4 * tid as usize), 4) } else { (std::ptr::null(), 0) };
        arch::cp_async_4(base + 4 * tid, src, bytes);
        arch::cp_async_commit();
        arch::cp_async_wait::<0>();
        arch::sync_threads();
        let other = arch::ld_shared_u32(base + 4 * ((tid + 1) % 8));
        arch::sync_threads();
        other
    })
    .unwrap();
    for (tid, words) in got.iter().enumerate() {
        let from = (tid + 1) % 8;
        let expected =
            if from % 2 == 0 { u32::from_le_bytes(std::array::from_fn(|b| source.0[4 * from + b])) } else { 0 };
        assert_eq!(*words, expected, "thread {tid} reads word {from}");
    }
    let misaligned = run_block(1, 64, &regions, |_| unsafe {
        arch::cp_async_4(arch::dynamic_smem_base() + 2, source.0.as_ptr(), 4);
        arch::cp_async_commit();
        arch::cp_async_wait::<0>();
        0u32
    });
    assert!(misaligned.is_err(), "a 4-byte cp.async to a 2-byte aligned address must fault");
}

#[test]
fn st_shared_v2_writes_two_words_in_order_and_needs_8_byte_alignment() {
    let got = run_block(32, 256, &[], |tid| unsafe {
        let base = arch::dynamic_smem_base();
        arch::st_shared_v2(base + 8 * tid, [2 * tid, 2 * tid + 1]);
        arch::sync_threads();
        arch::ld_shared_u32(base + 4 * ((tid * 7 + 3) % 64))
    })
    .unwrap();
    for (tid, word) in got.iter().enumerate() {
        assert_eq!(*word, ((tid * 7 + 3) % 64) as u32, "thread {tid}");
    }
    let misaligned = run_block(1, 64, &[], |_| unsafe {
        arch::st_shared_v2(arch::dynamic_smem_base() + 4, [1, 2]);
        0u32
    });
    assert!(misaligned.is_err(), "an 8-byte store to a 4-byte aligned address must fault");
}

#[test]
fn sync_threads_publishes_shared_stores_to_the_block() {
    let got = run_block(128, 512, &[], |tid| unsafe {
        arch::st_shared_u32(arch::dynamic_smem_base() + 4 * tid, tid * 10);
        arch::sync_threads();
        arch::ld_shared_v4(arch::dynamic_smem_base() + 16 * ((tid + 40) % 32))
    })
    .unwrap();
    for (tid, words) in got.iter().enumerate() {
        let first = 4 * ((tid as u32 + 40) % 32);
        assert_eq!(*words, [first * 10, (first + 1) * 10, (first + 2) * 10, (first + 3) * 10]);
    }
}

#[test]
fn special_registers_and_global_stores() {
    use flash_attn_kernels::emu::{launch, LaunchConfig};
    let (grid, threads) = ([3u32, 2, 2], 64u32);
    let mut out = vec![f32::NAN; (grid.iter().product::<u32>() * threads) as usize];
    let base = out.as_mut_ptr();
    let regions = [GlobalRegion::writable("out", &mut out)];
    let config = LaunchConfig::new(grid, threads, 0);
    unsafe {
        launch(&config, &regions, || {
            let block = (arch::block_idx_z() * 2 + arch::block_idx_y()) * arch::grid_dim_x() + arch::block_idx_x();
            let index = block * threads + arch::thread_idx_x();
            arch::st_global_f32(base.add(index as usize), index as f32);
        })
    }
    .unwrap();
    assert!(out.iter().enumerate().all(|(i, &v)| v == i as f32));
}

/// `atom.global.add.u32` from every thread of several blocks (each on an
/// OS thread of its own): each add returns a different earlier value, so
/// the values returned are every count from 0 once, and the word ends at
/// the sum; adds wrap past `u32::MAX`.
#[test]
fn atom_add_returns_each_earlier_count_once() {
    use flash_attn_kernels::emu::{launch, LaunchConfig};
    let (grid, threads) = ([4u32, 1, 1], 96u32);
    let adds = (grid[0] * threads) as usize;
    let mut counter = [0u32, u32::MAX - 1];
    let mut olds = vec![u32::MAX; adds];
    let (counter_ptr, olds_ptr) = (counter.as_mut_ptr(), olds.as_mut_ptr());
    let regions = [GlobalRegion::writable("counter", &mut counter), GlobalRegion::writable("olds", &mut olds)];
    let config = LaunchConfig::new(grid, threads, 0);
    unsafe {
        launch(&config, &regions, || {
            let index = arch::block_idx_x() * threads + arch::thread_idx_x();
            let old = arch::atom_global_add_u32(counter_ptr, 1);
            arch::st_global_u32(olds_ptr.add(index as usize), old);
            if index == 0 {
                arch::atom_global_add_u32(counter_ptr.add(1), 3);
            }
        })
    }
    .unwrap();
    olds.sort_unstable();
    assert!(olds.iter().enumerate().all(|(i, &old)| old == i as u32), "{olds:?}");
    assert_eq!(counter, [adds as u32, 1]);
}

/// The probe kernel of the GPU cross-check (tests/tests/emulator_crosscheck.rs)
/// runs in the emulator without a fault and writes every output word, with
/// the shuffles and packs giving what their plain models say.
#[test]
fn the_gpu_cross_check_probe_runs_in_the_emulator() {
    use flash_attn_kernels::emu::{launch, LaunchConfig};
    use flash_attn_kernels::test_kernels::probe::{self, input, output, LANE_INPUT_WORDS, LANE_OUTPUT_WORDS};

    #[derive(Clone, Copy)]
    #[repr(C, align(16))]
    struct Quad([u32; 4]);
    let mut input_quads = vec![Quad([0; 4]); probe::INPUT_WORDS / 4];
    // SAFETY: Quad is four u32 with no padding.
    let input_words =
        unsafe { std::slice::from_raw_parts_mut(input_quads.as_mut_ptr().cast::<u32>(), probe::INPUT_WORDS) };
    for (i, w) in input_words.iter_mut().enumerate() {
        // Small finite floats everywhere, so every instruction has a normal input.
        *w = (1.0 + (i % 97) as f32 / 64.0).to_bits();
    }
    let lane_word = |lane: usize, i: usize| probe::SMEM_BYTES as usize / 4 + lane * LANE_INPUT_WORDS + i;
    let mut output_quads = vec![Quad([0xdead_beef; 4]); probe::OUTPUT_WORDS / 4];
    // SAFETY: as above.
    let output_words =
        unsafe { std::slice::from_raw_parts_mut(output_quads.as_mut_ptr().cast::<u32>(), probe::OUTPUT_WORDS) };
    let (input_ptr, output_ptr) = (input_words.as_ptr(), output_words.as_mut_ptr());
    let regions = [GlobalRegion::read_only("input", input_words), GlobalRegion::writable("output", output_words)];
    // SAFETY: the regions are the buffers behind the pointers.
    unsafe {
        launch(&LaunchConfig::new([1, 1, 1], 32, probe::SMEM_BYTES), &regions, || {
            probe::probe_primitives(input_ptr, output_ptr)
        })
    }
    .expect("the probe runs in the emulator");
    let (input_words, output_words) = (input_words as &[u32], output_words as &[u32]);
    for lane in 0..32 {
        for i in 0..=output::ATOM_SUM {
            assert_ne!(output_words[lane * LANE_OUTPUT_WORDS + i], 0xdead_beef, "lane {lane} word {i} not written");
        }
        for (j, mask) in [1, 2, 4, 8, 16].into_iter().enumerate() {
            assert_eq!(
                output_words[lane * LANE_OUTPUT_WORDS + output::SHUFFLE + j],
                input_words[lane_word(lane ^ mask, input::SHUFFLE)]
            );
        }
        let (lo, hi) = (
            f32::from_bits(input_words[lane_word(lane, input::PACK)]),
            f32::from_bits(input_words[lane_word(lane, input::PACK + 1)]),
        );
        let packed = output_words[lane * LANE_OUTPUT_WORDS + output::PACK_F16];
        assert_eq!(packed, pack(f16::from_f32(lo).to_bits(), f16::from_f32(hi).to_bits()));
        // The shared image is the first words of the input.
        assert_eq!(
            output_words[lane * LANE_OUTPUT_WORDS + output::LD_SHARED],
            input_words[probe::ld_shared_word(lane as u32) as usize]
        );
        // The atomic returns the word it found and leaves the wrapping sum.
        let (word, add) = (input_words[lane_word(lane, input::ATOM)], input_words[lane_word(lane, input::ATOM + 1)]);
        assert_eq!(output_words[lane * LANE_OUTPUT_WORDS + output::ATOM_OLD], word);
        assert_eq!(output_words[lane * LANE_OUTPUT_WORDS + output::ATOM_SUM], word.wrapping_add(add));
    }
}

/// The benchmark's ceiling kernel accumulates one fixed product per
/// iteration into each chain: 3 iterations give 3 times what 1 gives.
#[test]
fn the_ceiling_kernel_accumulates_its_iterations() {
    use flash_attn_kernels::test_kernels::ceiling::mma_ceiling;
    let run = |iterations: u32| {
        let mut out = vec![f32::NAN; 64];
        let out_ptr = out.as_mut_ptr();
        let regions = [GlobalRegion::writable("out", &mut out)];
        // SAFETY: `out` holds one f32 per thread of the launch.
        unsafe {
            flash_attn_kernels::emu::launch(
                &flash_attn_kernels::emu::LaunchConfig::new([2, 1, 1], 32, 0),
                &regions,
                || mma_ceiling(iterations, out_ptr, 32),
            )
        }
        .expect("the ceiling kernel runs in the emulator");
        out
    };
    let (once, thrice) = (run(1), run(3));
    for (thread, (&x, &y)) in once.iter().zip(&thrice).enumerate() {
        assert!(x.is_finite() && x > 0.0, "thread {thread}: {x}");
        assert!((y - 3.0 * x).abs() <= 1e-6 * y.abs(), "thread {thread}: {y} is not 3 x {x}");
    }
}

//! The sm_90a primitives against plain models of their PTX ISA
//! definitions: mbarrier phase sequences against a four-field model of the
//! barrier object, TMA loads against a naive box copy and a separately
//! written swizzle, wgmma against a naive matrix product over matrices
//! laid out by their own simple functions, named barriers and `setmaxnreg`
//! by what they let through; the sm_90a probe kernel against all of them.
//! The faults each of them reports are in `faults_sm90.rs`.

use std::sync::Mutex;

use flash_attn_abi::sm90::{
    DescriptorSwizzle, L2Promotion, MatrixDescriptor, OobFill, TensorDataType, TensorMapParams, TmaSwizzle,
};
use flash_attn_kernels::arch::{self, WgmmaAccumulator};
use flash_attn_kernels::emu::{launch, Error, GlobalRegion, LaunchConfig};
use flash_attn_kernels::test_kernels::probe_sm90::{self, output};
use half::{bf16, f16};
use proptest::prelude::*;

/// Runs `kernel` (given `%tid.x`) on one block of `config`, and collects
/// what each thread returns.
pub(crate) fn run<T: Clone + Send>(
    config: LaunchConfig,
    regions: &[GlobalRegion],
    kernel: impl Fn(u32) -> T,
) -> Result<Vec<T>, Error> {
    let out = Mutex::new(vec![None; config.block_threads as usize]);
    // SAFETY: the regions are the callers' live buffers.
    unsafe {
        launch(&config, regions, || {
            let tid = arch::thread_idx_x();
            let value = kernel(tid);
            out.lock().unwrap()[tid as usize] = Some(value);
        })
    }?;
    Ok(out.into_inner().unwrap().into_iter().map(|v| v.expect("every thread returned")).collect())
}

pub(crate) fn block(threads: u32, smem: u32) -> LaunchConfig {
    LaunchConfig::new([1, 1, 1], threads, smem)
}

/// The 1024-byte aligned shared base the tests lay their tiles out from.
pub(crate) fn base() -> u32 {
    (arch::dynamic_smem_base() + 1023) & !1023
}

// ---------------------------------------------------------------------------
// mbarrier
// ---------------------------------------------------------------------------

/// One operation on an mbarrier.
#[derive(Clone, Copy, Debug)]
enum Op {
    Arrive,
    ArriveExpectTx(u32),
    ExpectTx(u32),
    CompleteTx(u32),
    TryWait(u32),
}

/// The barrier object as the PTX ISA describes it: the current phase, the
/// pending arrival count, the expected count it resets to, the tx-count.
/// A phase completes when the pending count and the tx-count are both
/// zero; `try_wait.parity p` is true when the current phase's parity is
/// not `p`.
struct Model {
    phase: u32,
    pending: u32,
    expected: u32,
    tx: i64,
}

impl Model {
    /// Applies `op`; `None` if the ISA leaves it undefined (an arrival
    /// beyond the expected count), which the script then leaves out.
    fn apply(&mut self, op: Op) -> Option<Option<bool>> {
        match op {
            Op::Arrive | Op::ArriveExpectTx(_) if self.pending == 0 => return None,
            Op::Arrive => self.pending -= 1,
            Op::ArriveExpectTx(n) => {
                self.tx += i64::from(n);
                self.pending -= 1;
            }
            Op::ExpectTx(n) => self.tx += i64::from(n),
            Op::CompleteTx(n) => self.tx -= i64::from(n),
            Op::TryWait(p) => return Some(Some(self.phase % 2 != p)),
        }
        if self.pending == 0 && self.tx == 0 {
            self.phase += 1;
            self.pending = self.expected;
        }
        Some(None)
    }
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        Just(Op::Arrive),
        (1u32..64).prop_map(Op::ArriveExpectTx),
        (1u32..64).prop_map(Op::ExpectTx),
        (1u32..64).prop_map(Op::CompleteTx),
        (0u32..2).prop_map(Op::TryWait),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn mbarrier_phases_follow_the_isa_model(count in 1u32..4, ops in prop::collection::vec(op(), 1..40)) {
        let mut model = Model { phase: 0, pending: count, expected: count, tx: 0 };
        let mut script = Vec::new();
        let mut expected = Vec::new();
        // The emulator takes asking again after a false answer, with no
        // arrival or transaction in between, for spinning (a wait): the
        // script asks that at most once per parity.
        let mut answered_false = [false; 2];
        for op in ops {
            if matches!(op, Op::TryWait(p) if answered_false[p as usize]) {
                continue;
            }
            if let Some(answer) = model.apply(op) {
                script.push(op);
                match (op, answer) {
                    (Op::TryWait(p), Some(false)) => answered_false[p as usize] = true,
                    (Op::TryWait(_), _) => {}
                    _ => answered_false = [false; 2],
                }
                expected.extend(answer);
            }
        }
        let got = run(block(32, 64), &[], |tid| {
            let bar = arch::dynamic_smem_base();
            let mut answers = Vec::new();
            if tid == 0 {
                unsafe {
                    arch::mbarrier_init(bar, count);
                    for &op in &script {
                        match op {
                            Op::Arrive => arch::mbarrier_arrive(bar),
                            Op::ArriveExpectTx(n) => arch::mbarrier_arrive_expect_tx(bar, n),
                            Op::ExpectTx(n) => arch::mbarrier_expect_tx(bar, n),
                            Op::CompleteTx(n) => arch::mbarrier_complete_tx(bar, n),
                            Op::TryWait(p) => answers.push(arch::mbarrier_try_wait_parity(bar, p)),
                        }
                    }
                }
            }
            answers
        })
        .unwrap();
        prop_assert_eq!(&got[0], &expected, "script {:?}", script);
    }
}

#[test]
fn mbarrier_waits_release_the_consumers_once_every_producer_arrived() {
    // Two producer warps each store their lane's word, then arrive; two
    // consumer warps wait on the phase and read every word (the race check
    // passes: the phase's completion orders the stores before the reads).
    let got = run(block(128, 2048), &[], |tid| {
        let base = arch::dynamic_smem_base();
        let bar = base + 1024;
        if tid == 0 {
            unsafe { arch::mbarrier_init(bar, 64) };
        }
        arch::sync_threads();
        unsafe {
            if tid < 64 {
                arch::st_shared_u32(base + 4 * tid, 3 * tid + 1);
                arch::mbarrier_arrive(bar);
                0
            } else {
                arch::mbarrier_wait_parity(bar, 0);
                arch::ld_shared_u32(base + 4 * (tid - 64))
            }
        }
    })
    .unwrap();
    for tid in 64..128 {
        assert_eq!(got[tid as usize], 3 * (tid - 64) + 1);
    }
}

// ---------------------------------------------------------------------------
// TMA
// ---------------------------------------------------------------------------

/// 16-byte aligned storage for a global tensor (TMA wants 16-byte aligned
/// addresses and strides).
#[derive(Clone, Copy, Default)]
#[repr(C, align(16))]
pub(crate) struct Aligned([u16; 8]);

pub(crate) fn aligned(values: &[u16]) -> Vec<Aligned> {
    let mut storage = vec![Aligned::default(); values.len().div_ceil(8)];
    for (i, &v) in values.iter().enumerate() {
        storage[i / 8].0[i % 8] = v;
    }
    storage
}

pub(crate) fn params_2d(
    address: *const Aligned,
    dims: [u64; 2],
    row_bytes: u64,
    boxd: [u32; 2],
    swizzle: TmaSwizzle,
) -> TensorMapParams {
    TensorMapParams {
        data_type: TensorDataType::F16,
        rank: 2,
        global_address: address as u64,
        global_dims: [dims[0], dims[1], 1, 1, 1],
        global_strides: [row_bytes, 0, 0, 0],
        box_dims: [boxd[0], boxd[1], 1, 1, 1],
        element_strides: [1; 5],
        swizzle,
        l2_promotion: L2Promotion::None,
        oob_fill: OobFill::Zero,
    }
}

/// The swizzle written out as the CUDA programming guide draws it for a
/// box of `span`-byte rows: in each group of eight rows (128 bytes for
/// 128B, two rows per 128 bytes for 64B, four for 32B) the 16-byte chunks
/// of row-address-bits `r` are XORed with `r`.
fn swizzled_offset(offset: usize, swizzle: TmaSwizzle) -> usize {
    let (chunk, line) = (offset / 16 % 8, offset / 128 % 8);
    let chunk_mask = match swizzle {
        TmaSwizzle::None => return offset,
        TmaSwizzle::B32 => 1,
        TmaSwizzle::B64 => 3,
        TmaSwizzle::B128 => 7,
    };
    let new_chunk = chunk ^ (line & chunk_mask);
    offset - 16 * chunk + 16 * new_chunk
}

/// The shared-memory image (16-bit words) of a box: a naive copy with
/// out-of-bounds elements zero, then the swizzle.
fn naive_box(
    tensor: &[u16],
    dims: [i64; 3],
    boxd: [usize; 3],
    strides: [usize; 3],
    coords: [i64; 3],
    swizzle: TmaSwizzle,
) -> Vec<u16> {
    let counts = [boxd[0], boxd[1].div_ceil(strides[1]), boxd[2].div_ceil(strides[2])];
    let mut image = vec![0u16; counts.iter().product()];
    for z in 0..counts[2] {
        for y in 0..counts[1] {
            for x in 0..counts[0] {
                let g =
                    [coords[0] + x as i64, coords[1] + (y * strides[1]) as i64, coords[2] + (z * strides[2]) as i64];
                let inside = (0..3).all(|i| g[i] >= 0 && g[i] < dims[i]);
                let value = if inside { tensor[((g[2] * dims[1] + g[1]) * dims[0] + g[0]) as usize] } else { 0 };
                let linear = 2 * ((z * counts[1] + y) * counts[0] + x);
                image[swizzled_offset(linear, swizzle) / 2] = value;
            }
        }
    }
    image
}

/// Loads one box of a 3-d f16 tensor of `dims` (innermost first) through
/// TMA and returns the shared-memory image, and what the naive model says.
fn tma_case(
    dims: [i64; 3],
    boxd: [usize; 3],
    strides: [usize; 3],
    coords: [i64; 3],
    swizzle: TmaSwizzle,
) -> (Vec<u16>, Vec<u16>) {
    let n: usize = dims.iter().product::<i64>() as usize;
    let tensor: Vec<u16> = (0..n).map(|i| (i as u16).wrapping_mul(7).wrapping_add(1)).collect();
    let storage = aligned(&tensor);
    let row_bytes = 2 * dims[0] as u64;
    let params = TensorMapParams {
        rank: 3,
        global_dims: [dims[0] as u64, dims[1] as u64, dims[2] as u64, 1, 1],
        global_strides: [row_bytes, row_bytes * dims[1] as u64, 0, 0],
        box_dims: [boxd[0] as u32, boxd[1] as u32, boxd[2] as u32, 1, 1],
        element_strides: [1, strides[1] as u32, strides[2] as u32, 1, 1],
        ..params_2d(storage.as_ptr(), [0, 0], 0, [0, 0], swizzle)
    };
    let map = [params.encode().expect("valid parameters")];
    let bytes = params.box_bytes();
    let words = bytes / 4;
    let regions = [GlobalRegion::read_only("tensor", &storage), GlobalRegion::read_only("map", &map)];
    let map_ptr = map.as_ptr();
    let threads = 128;
    let got = run(block(threads, bytes + 2048), &regions, |tid| {
        let (base, bar) = (base(), base() + bytes.next_multiple_of(1024));
        if tid == 0 {
            unsafe {
                arch::mbarrier_init(bar, 1);
                arch::mbarrier_arrive_expect_tx(bar, bytes);
                arch::tma_load_3d(base, map_ptr, coords.map(|c| c as i32), bar);
            }
        }
        arch::sync_threads();
        unsafe { arch::mbarrier_wait_parity(bar, 0) };
        (0..words.div_ceil(threads))
            .map(|i| tid + threads * i)
            .filter(|&w| w < words)
            .map(|w| (w, unsafe { arch::ld_shared_u32(base + 4 * w) }))
            .collect::<Vec<_>>()
    })
    .unwrap();
    let mut image = vec![0u16; bytes as usize / 2];
    for (w, value) in got.into_iter().flatten() {
        image[2 * w as usize] = value as u16;
        image[2 * w as usize + 1] = (value >> 16) as u16;
    }
    (image, naive_box(&tensor, dims, boxd, strides, coords, swizzle))
}

#[test]
fn tma_loads_the_box_a_naive_copy_gives_with_each_swizzle() {
    for (swizzle, inner) in
        [(TmaSwizzle::B128, 64), (TmaSwizzle::B64, 32), (TmaSwizzle::B32, 16), (TmaSwizzle::None, 24)]
    {
        // Inside the tensor, then past its ends, then before its starts.
        for coords in [[0, 8, 1], [inner as i64 / 2, 90, 2], [-8, -5, -1]] {
            let (got, expected) = tma_case([inner as i64 * 2, 100, 3], [inner, 16, 2], [1, 1, 1], coords, swizzle);
            assert_eq!(got, expected, "{swizzle:?} box at {coords:?}");
        }
    }
}

#[test]
fn tma_traversal_strides_take_every_nth_row() {
    let (got, expected) = tma_case([64, 40, 5], [64, 12, 4], [1, 3, 2], [0, 2, 0], TmaSwizzle::B128);
    assert_eq!(got, expected);
}

// ---------------------------------------------------------------------------
// wgmma
// ---------------------------------------------------------------------------

/// A value with few significant bits, so that every product and sum of a
/// 16-term dot product is exact in f32 (whatever the summation order).
fn small(i: usize, salt: usize) -> f64 {
    (((i * 37 + salt * 11) % 17) as f64 - 8.0) / 8.0
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Type {
    F16,
    Bf16,
}

fn bits(ty: Type, x: f64) -> u16 {
    match ty {
        Type::F16 => f16::from_f64(x).to_bits(),
        Type::Bf16 => bf16::from_f64(x).to_bits(),
    }
}

/// Where element `(mn, k)` (16-bit) of a 128B-swizzled K-major operand
/// lies, as the swizzle is usually drawn: rows of 64 elements (128 bytes)
/// one after another, 8-row groups `sbo` bytes apart, the k-step's 16
/// elements at byte `32 * k_step` of the row, and 16-byte chunk `c` of row
/// `r` stored at chunk `c ^ (r % 8)`.
fn k_major_128(mn: usize, k: usize, k_step: usize, sbo: usize) -> usize {
    let row = (mn / 8) * sbo + (mn % 8) * 128;
    let byte = 32 * k_step + 2 * k;
    row + 16 * ((byte / 16) ^ (mn % 8)) + byte % 16
}

/// The same for an MN-major operand (V: rows of K, 64 elements of N each):
/// row `k` of the k-step at `2048 * k_step + (k / 8) * 1024 + (k % 8) * 128`,
/// 64-column blocks `lbo` apart, the chunk swizzled by the row.
fn mn_major_128(mn: usize, k: usize, k_step: usize, lbo: usize) -> usize {
    let row = 16 * k_step + k;
    let start = (row / 8) * 1024 + (row % 8) * 128 + (mn / 64) * lbo;
    let byte = 2 * (mn % 64);
    start + 16 * ((byte / 16) ^ (row % 8)) + byte % 16
}

/// The same in the 64-byte swizzle: rows of 32 elements of N (64 bytes),
/// 8-row groups 512 bytes apart, 32-column blocks `lbo` apart; the four
/// chunks of a row swap by pairs of rows (the pattern repeats every 512
/// bytes: chunk `c` of row `r` lands at `c ^ (r % 8 / 2)`).
fn mn_major_64(mn: usize, k: usize, k_step: usize, lbo: usize) -> usize {
    let row = 16 * k_step + k;
    let start = (row / 8) * 512 + (row % 8) * 64 + (mn / 32) * lbo;
    let byte = 2 * (mn % 32);
    start + 16 * ((byte / 16) ^ (row % 8 / 2)) + byte % 16
}

/// Where element `(mn, k)` of k-step `k_step` of a K-major operand lies in
/// the 64-byte swizzle: slabs of 32 columns (two k-steps, 64-byte rows)
/// `slab_bytes` apart, 8-row groups 512 bytes apart, a row's four chunks
/// swapped by pairs of rows as in [`mn_major_64`].
fn k_major_64(mn: usize, k: usize, k_step: usize, slab_bytes: usize) -> usize {
    let start = (k_step / 2) * slab_bytes + (mn / 8) * 512 + (mn % 8) * 64;
    let byte = 2 * (16 * (k_step % 2) + k);
    start + 16 * ((byte / 16) ^ (mn % 8 / 2)) + byte % 16
}

/// How B lies in shared memory in [`wgmma_case`].
#[derive(Clone, Copy, PartialEq)]
enum BLayout {
    /// K-major, the 128-byte swizzle.
    K128,
    /// K-major, the 64-byte swizzle (32-column slabs), A likewise.
    K64,
    /// MN-major (`imm-trans-b` 1), the 128-byte swizzle: 64-column slabs.
    Mn128,
    /// MN-major, the 64-byte swizzle: 32-column slabs.
    Mn64,
    /// K-major without swizzle, A likewise.
    Interleaved,
}

/// Where element `(mn, k)` of a K-major operand without swizzle lies: 8x8
/// core matrices of 16-byte rows (128 contiguous bytes each), the next
/// core matrix along K `lbo` bytes on, along MN `sbo` bytes on.
fn k_major_interleaved(mn: usize, k: usize, lbo: usize, sbo: usize) -> usize {
    (mn / 8) * sbo + (k / 8) * lbo + (mn % 8) * 16 + 2 * (k % 8)
}

/// One wgmma case: the operands' shared-memory image (16-bit words at byte
/// offsets / 2) and descriptors per k-step.
struct Case {
    image: Vec<u16>,
    a_desc: Vec<u64>,
    b_desc: Vec<u64>,
}

fn desc(start: usize, lbo: usize, sbo: usize, swizzle: DescriptorSwizzle) -> u64 {
    MatrixDescriptor {
        start: start as u32,
        leading_byte_offset: lbo as u32,
        stride_byte_offset: sbo as u32,
        base_offset: 0,
        swizzle,
    }
    .encode()
}

/// `D = A B` over K = 16 * `k_steps`, A 64 x K K-major with the 128B
/// swizzle (without swizzle for [`BLayout::Interleaved`]), B K x N laid out
/// as `layout` says; or with `rs` A from registers. Returns the emulated D
/// by (row, column) and the naive product.
fn wgmma_case<const R: usize>(ty: Type, layout: BLayout, rs: bool) -> (Vec<Vec<f32>>, Vec<Vec<f64>>) {
    wgmma_case_with_a::<R>(ty, layout, rs, false)
}

/// As [`wgmma_case`], with A MN-major (`imm-trans-a` 1: its 64 rows M
/// contiguous, one 64-column slab of the 128B swizzle per 8 of K) when
/// `a_mn_major`.
fn wgmma_case_with_a<const R: usize>(
    ty: Type,
    layout: BLayout,
    rs: bool,
    a_mn_major: bool,
) -> (Vec<Vec<f32>>, Vec<Vec<f64>>) {
    let (trans_b, interleaved) = (matches!(layout, BLayout::Mn128 | BLayout::Mn64), layout == BLayout::Interleaved);
    let n = 2 * R;
    let k_steps = 4;
    let kk = 16 * k_steps;
    let a: Vec<Vec<f64>> = (0..64).map(|m| (0..kk).map(|k| small(m * kk + k, 1)).collect()).collect();
    let b: Vec<Vec<f64>> = (0..kk).map(|k| (0..n).map(|j| small(k * n + j, 2)).collect()).collect();
    let c: Vec<Vec<f64>> = (0..64).map(|m| (0..n).map(|j| small(m * n + j, 3) * 4.0).collect()).collect();
    let a_bytes = 64 * 128;
    let b_base = a_bytes;
    let mut image = vec![0u16; (a_bytes + n.max(64) * 128 + kk * 256) / 2];
    let mut case = Case { image: Vec::new(), a_desc: Vec::new(), b_desc: Vec::new() };
    for s in 0..k_steps {
        for (m, row) in a.iter().enumerate() {
            for (k, &x) in row[16 * s..16 * s + 16].iter().enumerate() {
                let at = if interleaved {
                    k_major_interleaved(m, 16 * s + k, 128, kk * 16)
                } else if layout == BLayout::K64 {
                    k_major_64(m, k, s, 64 * 64)
                } else if a_mn_major {
                    mn_major_128(m, k, s, kk * 128)
                } else {
                    k_major_128(m, k, s, 1024)
                };
                image[at / 2] = bits(ty, x);
            }
        }
        for (k, row) in b[16 * s..16 * s + 16].iter().enumerate() {
            for (j, &x) in row.iter().enumerate() {
                let at = b_base
                    + match layout {
                        BLayout::K128 => k_major_128(j, k, s, 1024),
                        BLayout::K64 => k_major_64(j, k, s, n * 64),
                        BLayout::Mn128 => mn_major_128(j, k, s, kk * 128),
                        BLayout::Mn64 => mn_major_64(j, k, s, kk * 64),
                        BLayout::Interleaved => k_major_interleaved(j, 16 * s + k, 128, kk * 16),
                    };
                image[at / 2] = bits(ty, x);
            }
        }
        let a_mn = desc(2048 * s, kk * 128, 1024, DescriptorSwizzle::B128);
        let (a_desc, b_desc) = if interleaved {
            (
                desc(256 * s, 128, kk * 16, DescriptorSwizzle::None),
                desc(b_base + 256 * s, 128, kk * 16, DescriptorSwizzle::None),
            )
        } else if layout == BLayout::Mn128 {
            (
                desc(32 * s, 16, 1024, DescriptorSwizzle::B128),
                desc(b_base + 2048 * s, kk * 128, 1024, DescriptorSwizzle::B128),
            )
        } else if layout == BLayout::K64 {
            let column = 32 * (s % 2);
            (
                desc(64 * 64 * (s / 2) + column, 16, 512, DescriptorSwizzle::B64),
                desc(b_base + n * 64 * (s / 2) + column, 16, 512, DescriptorSwizzle::B64),
            )
        } else if layout == BLayout::Mn64 {
            (
                desc(32 * s, 16, 1024, DescriptorSwizzle::B128),
                desc(b_base + 1024 * s, kk * 64, 512, DescriptorSwizzle::B64),
            )
        } else {
            (desc(32 * s, 16, 1024, DescriptorSwizzle::B128), desc(b_base + 32 * s, 16, 1024, DescriptorSwizzle::B128))
        };
        case.a_desc.push(if a_mn_major { a_mn } else { a_desc });
        case.b_desc.push(b_desc);
    }
    case.image = image;
    let words: Vec<u32> = case.image.chunks(2).map(|p| u32::from(p[0]) | (u32::from(p[1]) << 16)).collect();
    let c_bits = c.clone();
    let got = run(block(128, (words.len() * 4) as u32 + 1024), &[], |t| {
        let base = base();
        for w in (t as usize..words.len()).step_by(128) {
            unsafe { arch::st_shared_u32(base + 4 * w as u32, words[w]) };
        }
        arch::fence_proxy_async_shared();
        arch::sync_threads();
        let (warp, lane) = (t as usize / 32, t as usize % 32);
        let position = |i: usize| (16 * warp + lane / 4 + 8 * (i / 2 % 2), 8 * (i / 4) + 2 * (lane % 4) + i % 2);
        let mut acc = WgmmaAccumulator::<R>::new(std::array::from_fn(|i| {
            let (row, col) = position(i);
            c_bits[row][col] as f32
        }));
        arch::wgmma_fence();
        for s in 0..k_steps {
            let (ad, bd) = (case.a_desc[s] + u64::from(base >> 4), case.b_desc[s] + u64::from(base >> 4));
            // The thread's A fragment: the m16n8k16 A layout over rows 16 * warp up.
            let (g, q) = (lane / 4, lane % 4);
            let pair = |row: usize, col: usize| {
                u32::from(bits(ty, a[16 * warp + row][16 * s + col]))
                    | (u32::from(bits(ty, a[16 * warp + row][16 * s + col + 1])) << 16)
            };
            let frag = [pair(g, 2 * q), pair(g + 8, 2 * q), pair(g, 2 * q + 8), pair(g + 8, 2 * q + 8)];
            match (ty, rs, a_mn_major, trans_b) {
                (Type::F16, false, false, false) => arch::wgmma_ss_f16::<R, 0, 0>(&mut acc, ad, bd, true),
                (Type::F16, false, false, true) => arch::wgmma_ss_f16::<R, 0, 1>(&mut acc, ad, bd, true),
                (Type::F16, false, true, false) => arch::wgmma_ss_f16::<R, 1, 0>(&mut acc, ad, bd, true),
                (Type::F16, false, true, true) => arch::wgmma_ss_f16::<R, 1, 1>(&mut acc, ad, bd, true),
                (Type::Bf16, false, false, false) => arch::wgmma_ss_bf16::<R, 0, 0>(&mut acc, ad, bd, true),
                (Type::Bf16, false, false, true) => arch::wgmma_ss_bf16::<R, 0, 1>(&mut acc, ad, bd, true),
                (Type::Bf16, false, true, false) => arch::wgmma_ss_bf16::<R, 1, 0>(&mut acc, ad, bd, true),
                (Type::Bf16, false, true, true) => arch::wgmma_ss_bf16::<R, 1, 1>(&mut acc, ad, bd, true),
                (Type::F16, true, _, false) => arch::wgmma_rs_f16::<R, 0>(&mut acc, &frag, bd, true),
                (Type::F16, true, _, true) => arch::wgmma_rs_f16::<R, 1>(&mut acc, &frag, bd, true),
                (Type::Bf16, true, _, false) => arch::wgmma_rs_bf16::<R, 0>(&mut acc, &frag, bd, true),
                (Type::Bf16, true, _, true) => arch::wgmma_rs_bf16::<R, 1>(&mut acc, &frag, bd, true),
            }
        }
        arch::wgmma_commit_group();
        arch::wgmma_wait_group::<0>();
        acc.get().iter().enumerate().map(|(i, &v)| (position(i), v)).collect::<Vec<_>>()
    })
    .unwrap();
    let mut d = vec![vec![f32::NAN; n]; 64];
    for ((row, col), v) in got.into_iter().flatten() {
        d[row][col] = v;
    }
    let expected =
        (0..64).map(|m| (0..n).map(|j| c[m][j] + (0..kk).map(|k| a[m][k] * b[k][j]).sum::<f64>()).collect()).collect();
    (d, expected)
}

fn assert_product(what: &str, (d, expected): (Vec<Vec<f32>>, Vec<Vec<f64>>)) {
    for (m, (row, want)) in d.iter().zip(&expected).enumerate() {
        for (j, (&got, &want)) in row.iter().zip(want).enumerate() {
            assert_eq!(got as f64, want, "{what}: D[{m}][{j}]");
        }
    }
}

#[test]
fn wgmma_ss_k_major_128b_equals_the_naive_product_for_n_32_64_96_128_192_256() {
    for ty in [Type::F16, Type::Bf16] {
        assert_product(&format!("{ty:?} n32"), wgmma_case::<16>(ty, BLayout::K128, false));
        assert_product(&format!("{ty:?} n64"), wgmma_case::<32>(ty, BLayout::K128, false));
        assert_product(&format!("{ty:?} n96"), wgmma_case::<48>(ty, BLayout::K128, false));
        assert_product(&format!("{ty:?} n128"), wgmma_case::<64>(ty, BLayout::K128, false));
        assert_product(&format!("{ty:?} n192"), wgmma_case::<96>(ty, BLayout::K128, false));
        assert_product(&format!("{ty:?} n256"), wgmma_case::<128>(ty, BLayout::K128, false));
    }
}

#[test]
fn wgmma_ss_with_b_mn_major_equals_the_naive_product() {
    for ty in [Type::F16, Type::Bf16] {
        assert_product(&format!("{ty:?} n64"), wgmma_case::<32>(ty, BLayout::Mn128, false));
        assert_product(&format!("{ty:?} n128"), wgmma_case::<64>(ty, BLayout::Mn128, false));
        // Three slabs of 64 columns, a leading byte offset apart.
        assert_product(&format!("{ty:?} n192"), wgmma_case::<96>(ty, BLayout::Mn128, false));
        // The 64-byte swizzle: three and five slabs of 32 columns.
        assert_product(&format!("{ty:?} n96 64b"), wgmma_case::<48>(ty, BLayout::Mn64, false));
        assert_product(&format!("{ty:?} n160 64b"), wgmma_case::<80>(ty, BLayout::Mn64, false));
        // One slab of 32 columns (the d = 32 backward's `dQ = dS K`).
        assert_product(&format!("{ty:?} n32 64b"), wgmma_case::<16>(ty, BLayout::Mn64, false));
    }
}

#[test]
fn wgmma_ss_k_major_64b_equals_the_naive_product() {
    // The d = 32 and 96 backward's scores: A and B in 32-column slabs of
    // the 64-byte swizzle, two k-steps a slab.
    for ty in [Type::F16, Type::Bf16] {
        assert_product(&format!("{ty:?} n32"), wgmma_case::<16>(ty, BLayout::K64, false));
        assert_product(&format!("{ty:?} n64"), wgmma_case::<32>(ty, BLayout::K64, false));
        assert_product(&format!("{ty:?} n96"), wgmma_case::<48>(ty, BLayout::K64, false));
    }
}

#[test]
fn wgmma_ss_with_a_mn_major_equals_the_naive_product() {
    // The backward's `dV += P^T dO` and `dK += dS^T Q`: A transposed (M
    // contiguous), B K-major or MN-major.
    for ty in [Type::F16, Type::Bf16] {
        assert_product(&format!("{ty:?} n64"), wgmma_case_with_a::<32>(ty, BLayout::K128, false, true));
        assert_product(&format!("{ty:?} n64 b mn"), wgmma_case_with_a::<32>(ty, BLayout::Mn128, false, true));
        assert_product(&format!("{ty:?} n128 b mn"), wgmma_case_with_a::<64>(ty, BLayout::Mn128, false, true));
        // d = 32 and 96: B (dO, Q) in 32-column slabs of the 64-byte swizzle.
        assert_product(&format!("{ty:?} n32 b mn 64b"), wgmma_case_with_a::<16>(ty, BLayout::Mn64, false, true));
        assert_product(&format!("{ty:?} n96 b mn 64b"), wgmma_case_with_a::<48>(ty, BLayout::Mn64, false, true));
    }
}

#[test]
fn wgmma_ss_without_swizzle_reads_interleaved_core_matrices() {
    assert_product("f16 n64", wgmma_case::<32>(Type::F16, BLayout::Interleaved, false));
}

#[test]
fn wgmma_rs_takes_a_from_each_threads_fragment() {
    for ty in [Type::F16, Type::Bf16] {
        assert_product(&format!("{ty:?} n64"), wgmma_case::<32>(ty, BLayout::K128, true));
        assert_product(&format!("{ty:?} n96"), wgmma_case::<48>(ty, BLayout::K128, true));
        assert_product(&format!("{ty:?} n192 mn-major"), wgmma_case::<96>(ty, BLayout::Mn128, true));
        assert_product(&format!("{ty:?} n224 mn-major 64b"), wgmma_case::<112>(ty, BLayout::Mn64, true));
        assert_product(&format!("{ty:?} n256 mn-major"), wgmma_case::<128>(ty, BLayout::Mn128, true));
    }
}

#[test]
fn wgmma_without_scale_d_ignores_the_accumulator() {
    let got = run(block(128, 64 * 128 + 64 * 128 + 1024), &[], |t| {
        let base = base();
        // A and B all ones: every element of A B is 16.
        for w in (t..(2 * 64 * 128) / 4).step_by(128) {
            unsafe { arch::st_shared_u32(base + 4 * w, 0x3c00_3c00) };
        }
        arch::fence_proxy_async_shared();
        arch::sync_threads();
        let mut acc = WgmmaAccumulator::<32>::new([1000.0; 32]);
        arch::wgmma_fence();
        let a = desc(base as usize, 16, 1024, DescriptorSwizzle::B128);
        let b = desc(base as usize + 64 * 128, 16, 1024, DescriptorSwizzle::B128);
        arch::wgmma_ss_f16::<32, 0, 0>(&mut acc, a, b, false);
        arch::wgmma_commit_group();
        arch::wgmma_wait_group::<0>();
        acc.get().to_vec()
    })
    .unwrap();
    assert!(got.iter().flatten().all(|&d| d == 16.0));
}

#[test]
fn wgmma_wait_group_n_leaves_the_newest_n_groups_in_flight() {
    // Two groups; wait_group 1 completes the first, whose accumulator is
    // then readable, while the second's is not until wait_group 0.
    let got = run(block(128, 2 * 64 * 128 + 1024), &[], |t| {
        let base = base();
        for w in (t..(2 * 64 * 128) / 4).step_by(128) {
            unsafe { arch::st_shared_u32(base + 4 * w, 0x3c00_3c00) };
        }
        arch::fence_proxy_async_shared();
        arch::sync_threads();
        let a = desc(base as usize, 16, 1024, DescriptorSwizzle::B128);
        let b = desc(base as usize + 64 * 128, 16, 1024, DescriptorSwizzle::B128);
        let mut first = WgmmaAccumulator::<32>::new([1.0; 32]);
        let mut second = WgmmaAccumulator::<32>::new([2.0; 32]);
        arch::wgmma_fence();
        arch::wgmma_ss_f16::<32, 0, 0>(&mut first, a, b, true);
        arch::wgmma_commit_group();
        arch::wgmma_ss_f16::<32, 0, 0>(&mut second, a, b, true);
        arch::wgmma_commit_group();
        arch::wgmma_wait_group::<1>();
        let x = first.get()[0];
        arch::wgmma_wait_group::<0>();
        (x, second.get()[0])
    })
    .unwrap();
    assert!(got.iter().all(|&v| v == (17.0, 18.0)), "{:?}", got[0]);
}

// ---------------------------------------------------------------------------
// named barriers, setmaxnreg
// ---------------------------------------------------------------------------

#[test]
fn named_barriers_order_the_warps_that_meet_there() {
    // Warps 0-1 exchange words through barrier 1 (64 threads) while warps
    // 2-3 do through barrier 2, warp 2 only arriving (bar.arrive) and warp
    // 3 waiting (bar.sync).
    let got = run(block(128, 1024), &[], |tid| {
        let base = arch::dynamic_smem_base();
        unsafe {
            match tid / 32 {
                0 | 1 => {
                    arch::st_shared_u32(base + 4 * tid, tid + 100);
                    arch::named_barrier_sync(1, 64);
                    arch::ld_shared_u32(base + 4 * (tid ^ 32))
                }
                2 => {
                    arch::st_shared_u32(base + 4 * tid, tid + 200);
                    arch::named_barrier_arrive(2, 64);
                    0
                }
                _ => {
                    arch::named_barrier_sync(2, 64);
                    arch::ld_shared_u32(base + 4 * (tid - 32))
                }
            }
        }
    })
    .unwrap();
    for tid in 0..64u32 {
        assert_eq!(got[tid as usize], (tid ^ 32) + 100);
    }
    for tid in 96..128u32 {
        assert_eq!(got[tid as usize], tid - 32 + 200);
    }
}

#[test]
fn setmaxnreg_inc_waits_for_the_registers_a_dec_gives_back() {
    // 384 threads at 168 registers (the pool: 64512). Warpgroups 1 and 2
    // reach their .inc to 240 first (warpgroup 0 is held at a named
    // barrier), which the pool cannot grant until warpgroup 0 has given
    // all but 24 back.
    let got = run(block(384, 0), &[], |tid| {
        if tid < 128 {
            arch::named_barrier_sync(1, 128);
            arch::setmaxnreg_dec::<24>();
        } else {
            arch::setmaxnreg_inc::<240>();
        }
        true
    })
    .unwrap();
    assert!(got.iter().all(|&done| done));
}

// ---------------------------------------------------------------------------
// the sm_90a probe
// ---------------------------------------------------------------------------

/// The probe's inputs: A, B and V, as values and as the probe takes them.
struct ProbeInputs {
    a: Vec<f64>,
    b: Vec<f64>,
    v: Vec<f64>,
    host: probe_sm90::host::Inputs,
}

impl ProbeInputs {
    fn new(bf16: bool, value: impl Fn(usize, usize) -> f64) -> Self {
        let ty = if bf16 { Type::Bf16 } else { Type::F16 };
        let matrix = |rows: u32, cols: u32, salt| -> Vec<u16> {
            (0..(rows * cols) as usize).map(|i| bits(ty, value(i, salt))).collect()
        };
        let (a, b, v) = (
            matrix(probe_sm90::A_ROWS, probe_sm90::K, 1),
            matrix(probe_sm90::B_ROWS, probe_sm90::K, 2),
            matrix(probe_sm90::V_ROWS, probe_sm90::V_COLS, 3),
        );
        let values = |m: &[u16]| -> Vec<f64> {
            m.iter().map(|&x| if bf16 { bf16::from_bits(x).to_f64() } else { f16::from_bits(x).to_f64() }).collect()
        };
        Self { a: values(&a), b: values(&b), v: values(&v), host: probe_sm90::host::Inputs::new(&a, &b, &v, bf16) }
    }
}

/// D's element `i` of thread `t` of a warpgroup: (row, column).
fn d_position(t: usize, i: usize) -> (usize, usize) {
    let (warp, lane) = (t / 32, t % 32);
    (16 * warp + lane / 4 + 8 * (i / 2 % 2), 8 * (i / 4) + 2 * (lane % 4) + i % 2)
}

#[test]
fn the_sm90_probe_computes_what_the_plain_models_say() {
    for bf16 in [false, true] {
        let inputs = ProbeInputs::new(bf16, small);
        let out = inputs.host.run_emulated().expect("emulated sm_90a probe");
        let k = probe_sm90::K as usize;
        let a = |m: usize, kk: usize| inputs.a[m * k + kk];
        let b = |j: usize, kk: usize| if j < probe_sm90::B_ROWS as usize { inputs.b[j * k + kk] } else { 0.0 };
        // V's box starts at row V_FIRST_ROW: its first rows are zeros.
        let v = |kk: usize, j: usize| {
            let row = kk as i64 + i64::from(probe_sm90::V_FIRST_ROW);
            if row < 0 {
                0.0
            } else {
                inputs.v[row as usize * probe_sm90::V_COLS as usize + j]
            }
        };
        let check = |at: usize, regs: usize, what: &str, expected: &dyn Fn(usize, usize) -> f64| {
            for t in 0..128 {
                for i in 0..regs {
                    let (row, col) = d_position(t, i);
                    let got = f32::from_bits(out[at + regs * t + i]);
                    assert_eq!(got as f64, expected(row, col), "{what} (bf16 {bf16}) D[{row}][{col}]");
                }
            }
        };
        check(output::D1, 128, "D1 = A B^T", &|m, j| (0..k).map(|kk| a(m, kk) * b(j, kk)).sum());
        check(output::D2, 64, "D2 = A V", &|m, j| (0..k).map(|kk| a(m, kk) * v(kk, j)).sum());
        check(output::D3, 64, "D3 = A B[..128]^T", &|m, j| (0..k).map(|kk| a(m, kk) * b(j, kk)).sum());
        // The tiles as they lie in shared memory: the 128B swizzle of the
        // first 64 columns of rows `first_row` on.
        let word = |tile: &Vec<probe_sm90::host::Chunk>, cols: usize, first_row: i64, w: usize| {
            let image_bits = |byte: usize| {
                let (row, col) = (byte / 128, byte % 128);
                let source = row as i64 + first_row;
                if source < 0 {
                    0
                } else {
                    tile[source as usize * cols / 8 + col / 16].0[col % 16 / 2]
                }
            };
            let logical = swizzled_offset(4 * w, TmaSwizzle::B128);
            u32::from(image_bits(logical)) | (u32::from(image_bits(logical + 2)) << 16)
        };
        for w in 0..2048 {
            assert_eq!(out[output::A_TILE + w], word(&inputs.host.a, k, 0, w), "A tile word {w}");
            assert_eq!(
                out[output::V_TILE + w],
                word(&inputs.host.v, probe_sm90::V_COLS as usize, i64::from(probe_sm90::V_FIRST_ROW), w),
                "V tile word {w}"
            );
        }
        assert_eq!(&out[output::PHASES..output::PHASES + probe_sm90::PHASE_STEPS], &[1, 0, 1, 0, 0, 1]);
        assert_eq!(out[output::FLAG], probe_sm90::FLAG);
        for t in 0..128 {
            assert_eq!(out[output::EXCHANGE + t], 2000 + t as u32, "warpgroup 1 reads warpgroup 2's word");
            assert_eq!(out[output::EXCHANGE + 128 + t], 1000 + t as u32, "warpgroup 2 reads warpgroup 1's word");
        }
    }
}

//! The `arch` interface on the host: the same functions as `ptx.rs`, each
//! emulating its instruction for the GPU thread whose coroutine is running
//! (see [`super::launch`]). Instructions that touch memory or the warp note
//! their caller's source location (`#[track_caller]`) for fault messages.

use std::cell::Cell;
use std::panic::Location;
use std::sync::atomic::{AtomicU32, Ordering};

use flash_attn_abi::sm90::{MatrixDescriptor, TensorMapError, TensorMapParams};

use super::collective;
use super::context::{self, Thread};
use super::error::{Fault, FaultKind};
use super::float::{self, HalfType};
use super::global::Access;
use super::rendezvous::{Collective, LaneIn, LaneOut, MbarrierUpdate, NamedArrival};
use super::smem::{self, Accessor, PendingCopy, Request};
use super::tma;
use super::wgmma::{self, AccumulatorState};

type Site = &'static Location<'static>;

/// Shared-window address of the start of the block's dynamic shared memory.
pub fn dynamic_smem_base() -> u32 {
    smem::BASE
}

/// `%tid.x`: the thread's index in its block.
pub fn thread_idx_x() -> u32 {
    context::with(|t| t.tid)
}

/// `%tid.x` (read again in place on the GPU; see the PTX version).
pub fn thread_idx_x_here() -> u32 {
    thread_idx_x()
}

/// `%ctaid.x`: the block's index along x.
pub fn block_idx_x() -> u32 {
    context::with(|t| t.block.ctaid[0])
}

/// `%ctaid.y`: the block's index along y.
pub fn block_idx_y() -> u32 {
    context::with(|t| t.block.ctaid[1])
}

/// `%ctaid.z`: the block's index along z.
pub fn block_idx_z() -> u32 {
    context::with(|t| t.block.ctaid[2])
}

/// `%nctaid.x`: the number of blocks along x.
pub fn grid_dim_x() -> u32 {
    context::with(|t| t.block.nctaid[0])
}

/// `%nctaid.z`: the number of blocks along z.
pub fn grid_dim_z() -> u32 {
    context::with(|t| t.block.nctaid[2])
}

/// `bar.sync 0`: block-wide barrier; also orders shared-memory accesses.
#[track_caller]
pub fn sync_threads() {
    let site = Location::caller();
    context::with(|t| {
        let barrier = || {
            t.block.smem.block_barrier();
            t.block.smem.share_observations();
        };
        t.ok(t.block.sync.barrier(t.tid, site, barrier, || t.suspend()))
    })
}

/// `bar.warp.sync`: reconverges the warp and orders its shared-memory accesses.
#[track_caller]
pub fn sync_warp() {
    let site = Location::caller();
    context::with(|t| {
        warp_collective(t, Collective::WarpSync, site, [0; 10], |_| {
            t.block.smem.warp_barrier(t.tid / 32);
            Ok([[0; 4]; 32])
        });
    })
}

/// `cp.async.cg.shared.global` of 16 bytes. Copies `src_bytes` (0 or 16) bytes
/// from `src` and fills the rest of the 16 with zeros; with 0 nothing is read.
///
/// # Safety
/// `dst` must be a 16-byte aligned shared address of the block; when
/// `src_bytes` is 16, `src` must point to 16 readable, 16-byte aligned bytes.
#[track_caller]
pub unsafe fn cp_async_16(dst: u32, src: *const u8, src_bytes: u32) {
    unsafe { cp_async("cp.async.cg.shared.global", 16, dst, src, src_bytes) }
}

/// `cp.async.ca.shared.global` of 4 bytes. Copies `src_bytes` (0 or 4) bytes
/// from `src` and fills the rest of the 4 with zeros; with 0 nothing is read.
///
/// # Safety
/// `dst` must be a 4-byte aligned shared address of the block; when
/// `src_bytes` is 4, `src` must point to 4 readable, 4-byte aligned bytes.
#[track_caller]
pub unsafe fn cp_async_4(dst: u32, src: *const u8, src_bytes: u32) {
    unsafe { cp_async("cp.async.ca.shared.global", 4, dst, src, src_bytes) }
}

/// A `cp.async` of `size` bytes (`src_bytes` of them read, the rest zeros),
/// pending until a `wait_group` covers it.
#[track_caller]
unsafe fn cp_async(instruction: &'static str, size: u32, dst: u32, src: *const u8, src_bytes: u32) {
    let site = Location::caller();
    context::with(|t| {
        if src_bytes > size {
            let message = format!("{instruction} at {site}: source size {src_bytes} exceeds the copy size {size}");
            t.block.fail(Fault::new(FaultKind::InvalidOperand, Some(t.tid), message));
        }
        let mut data = [0u8; 16];
        if src_bytes > 0 {
            let access = Access {
                instruction,
                site,
                thread: t.tid,
                addr: src as usize,
                len: src_bytes as usize,
                align: size as usize,
                write: false,
            };
            t.ok(t.block.global.check(&access));
            // SAFETY: inside a registered allocation (checked above).
            unsafe { std::ptr::copy_nonoverlapping(src, data.as_mut_ptr(), src_bytes as usize) };
        }
        let req = Request { who: lane(t), instruction, site, addr: dst, len: size };
        t.ok(t.block.smem.start_copy(&req, false));
        t.copies.borrow_mut().issue(PendingCopy { dst, data, len: size, site });
    })
}

/// `cp.async.commit_group`: closes the group of copies issued since the last commit.
pub fn cp_async_commit() {
    context::with(|t| t.copies.borrow_mut().commit())
}

/// `cp.async.wait_group N`: waits until at most `N` committed groups are pending.
pub fn cp_async_wait<const N: u32>() {
    context::with(|t| t.wait(N as usize))
}

/// `ldmatrix.sync.aligned.m8n8.x4.shared.b16`: lanes 8i..8i+7 give the row
/// addresses of matrix i; each lane receives one 32-bit register per matrix.
///
/// # Safety
/// `addr` must be a 16-byte aligned shared address holding 16 readable bytes.
#[track_caller]
pub unsafe fn ldmatrix_x4(addr: u32) -> [u32; 4] {
    ldmatrix(addr, false, Location::caller())
}

/// `ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16`: as [`ldmatrix_x4`], each
/// 8x8 matrix transposed on the way.
///
/// # Safety
/// As [`ldmatrix_x4`].
#[track_caller]
pub unsafe fn ldmatrix_x4_trans(addr: u32) -> [u32; 4] {
    ldmatrix(addr, true, Location::caller())
}

fn ldmatrix(addr: u32, trans: bool, site: Site) -> [u32; 4] {
    let op = Collective::Ldmatrix { trans };
    context::with(|t| {
        let mut input = [0; 10];
        input[0] = addr;
        warp_collective(t, op, site, input, |inputs| {
            let addrs = inputs.map(|i| i[0]);
            let rows = t.block.smem.read_rows(t.tid / 32, &addrs, op.ptx(), site)?;
            let rows = rows.map(|r| std::array::from_fn(|i| u16::from_le_bytes([r[2 * i], r[2 * i + 1]])));
            Ok(collective::ldmatrix_x4(&rows, trans))
        })
    })
}

/// `mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32`: `acc += a * b`.
#[track_caller]
pub fn mma_f16(acc: &mut [f32; 4], a: &[u32; 4], b: &[u32; 2]) {
    mma(HalfType::F16, acc, a, b, Location::caller())
}

/// `mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32`: `acc += a * b`.
#[track_caller]
pub fn mma_bf16(acc: &mut [f32; 4], a: &[u32; 4], b: &[u32; 2]) {
    mma(HalfType::Bf16, acc, a, b, Location::caller())
}

fn mma(ty: HalfType, acc: &mut [f32; 4], a: &[u32; 4], b: &[u32; 2], site: Site) {
    let mut input = [0u32; 10];
    input[..4].copy_from_slice(a);
    input[4..6].copy_from_slice(b);
    for (i, c) in acc.iter().enumerate() {
        input[6 + i] = c.to_bits();
    }
    let d = context::with(|t| {
        warp_collective(t, Collective::Mma(ty), site, input, |inputs| {
            let a = inputs.map(|i| [i[0], i[1], i[2], i[3]]);
            let b = inputs.map(|i| [i[4], i[5]]);
            let c = inputs.map(|i| [i[6], i[7], i[8], i[9]].map(f32::from_bits));
            Ok(collective::mma_m16n8k16(ty, &a, &b, &c).map(|d| d.map(f32::to_bits)))
        })
    });
    *acc = d.map(f32::from_bits);
}

/// `shfl.sync.bfly.b32` over the full warp: the value of lane `lane ^ mask`.
#[track_caller]
pub fn shfl_xor_f32(value: f32, mask: u32) -> f32 {
    let site = Location::caller();
    let mut input = [0; 10];
    input[..2].copy_from_slice(&[value.to_bits(), mask]);
    let out = context::with(|t| {
        warp_collective(t, Collective::ShflBfly, site, input, |inputs| {
            let shuffled = collective::shfl_bfly(&inputs.map(|i| i[0]), &inputs.map(|i| i[1]));
            Ok(shuffled.map(|v| [v, 0, 0, 0]))
        })
    });
    f32::from_bits(out[0])
}

/// `vote.sync.any.pred` over the full warp: whether `predicate` holds in
/// any lane.
#[track_caller]
pub fn any_sync(predicate: bool) -> bool {
    let site = Location::caller();
    let mut input = [0; 10];
    input[0] = predicate as u32;
    let out = context::with(|t| {
        warp_collective(t, Collective::VoteAny, site, input, |inputs| {
            let any = inputs.iter().any(|i| i[0] != 0) as u32;
            Ok([[any, 0, 0, 0]; 32])
        })
    });
    out[0] != 0
}

/// `ex2.approx.ftz.f32`: 2^x (2^-inf = 0).
pub fn exp2(x: f32) -> f32 {
    float::ex2_approx_ftz(x)
}

/// `lg2.approx.ftz.f32`: log2(x).
pub fn log2(x: f32) -> f32 {
    float::lg2_approx_ftz(x)
}

/// `rcp.approx.ftz.f32`: 1/x.
pub fn recip(x: f32) -> f32 {
    float::rcp_approx_ftz(x)
}

/// `cvt.rn.f16x2.f32`: two f32 rounded to f16, `lo` in the low half.
pub fn pack_f16x2(lo: f32, hi: f32) -> u32 {
    float::cvt_rn_f16x2(lo, hi)
}

/// `cvt.rn.bf16x2.f32`: two f32 rounded to bf16, `lo` in the low half.
pub fn pack_bf16x2(lo: f32, hi: f32) -> u32 {
    float::cvt_rn_bf16x2(lo, hi)
}

/// `cvt.f32.f16` of both halves of `x`: `(low, high)`, exact.
pub fn unpack_f16x2(x: u32) -> (f32, f32) {
    (half::f16::from_bits(x as u16).to_f32(), half::f16::from_bits((x >> 16) as u16).to_f32())
}

/// `st.shared.b32`.
///
/// # Safety
/// `addr` must be a 4-byte aligned shared address of the block.
#[track_caller]
pub unsafe fn st_shared_u32(addr: u32, value: u32) {
    let site = Location::caller();
    context::with(|t| {
        let req = Request { who: lane(t), instruction: "st.shared.b32", site, addr, len: 4 };
        t.ok(t.block.smem.write(&req, &value.to_le_bytes()));
    })
}

/// `st.shared.v2.b32`.
///
/// # Safety
/// `addr` must be an 8-byte aligned shared address of the block.
#[track_caller]
pub unsafe fn st_shared_v2(addr: u32, value: [u32; 2]) {
    let site = Location::caller();
    context::with(|t| {
        let req = Request { who: lane(t), instruction: "st.shared.v2.b32", site, addr, len: 8 };
        let bytes: [u8; 8] = std::array::from_fn(|i| value[i / 4].to_le_bytes()[i % 4]);
        t.ok(t.block.smem.write(&req, &bytes));
    })
}

/// `ld.shared.b32`.
///
/// # Safety
/// `addr` must be a 4-byte aligned shared address of the block.
#[track_caller]
pub unsafe fn ld_shared_u32(addr: u32) -> u32 {
    let [value] = ld_shared_words(addr, "ld.shared.b32", Location::caller());
    value
}

/// `ld.shared.v2.b32`.
///
/// # Safety
/// `addr` must be an 8-byte aligned shared address of the block.
#[track_caller]
pub unsafe fn ld_shared_v2(addr: u32) -> [u32; 2] {
    ld_shared_words(addr, "ld.shared.v2.b32", Location::caller())
}

/// `ld.shared.v4.b32`.
///
/// # Safety
/// `addr` must be a 16-byte aligned shared address of the block.
#[track_caller]
pub unsafe fn ld_shared_v4(addr: u32) -> [u32; 4] {
    ld_shared_words(addr, "ld.shared.v4.b32", Location::caller())
}

/// The shared loads of `N` 32-bit words: one request of `4 N` bytes.
fn ld_shared_words<const N: usize>(addr: u32, instruction: &'static str, site: Site) -> [u32; N] {
    context::with(|t| {
        let req = Request { who: lane(t), instruction, site, addr, len: 4 * N as u32 };
        let bytes = t.ok(t.block.smem.read(&req));
        std::array::from_fn(|i| {
            u32::from_le_bytes([bytes[4 * i], bytes[4 * i + 1], bytes[4 * i + 2], bytes[4 * i + 3]])
        })
    })
}

/// `st.global.v4.b32`.
///
/// # Safety
/// `ptr` must point to 16 writable, 16-byte aligned bytes of global memory.
#[track_caller]
pub unsafe fn st_global_v4(ptr: *mut u8, value: [u32; 4]) {
    let bytes: [u8; 16] = std::array::from_fn(|i| value[i / 4].to_le_bytes()[i % 4]);
    store_global(ptr, &bytes, "st.global.v4.b32", Location::caller());
}

/// `st.global.f32`.
///
/// # Safety
/// `ptr` must point to a writable, 4-byte aligned f32 of global memory.
#[track_caller]
pub unsafe fn st_global_f32(ptr: *mut f32, value: f32) {
    store_global(ptr as *mut u8, &value.to_le_bytes(), "st.global.f32", Location::caller());
}

/// Runs `op` on the 4-byte word at `ptr` as an atomic, once `instruction`'s
/// access to it at `site` is checked: a writable registered allocation,
/// 4-byte aligned.
///
/// # Safety
/// `ptr` must point to global memory.
unsafe fn atomic_global_word<R>(
    ptr: *mut u8,
    instruction: &'static str,
    site: &'static Location<'static>,
    op: impl FnOnce(&AtomicU32) -> R,
) -> R {
    context::with(|t| {
        let access = Access { instruction, site, thread: t.tid, addr: ptr as usize, len: 4, align: 4, write: true };
        t.ok(t.block.global.check(&access));
        // SAFETY: a registered writable allocation, 4-byte aligned (checked
        // above); every emulated access to it that may race is an atomic.
        op(unsafe { &*(ptr as *const AtomicU32) })
    })
}

/// `red.global.add.f32`: adds `value` to the f32 at `ptr` atomically, as
/// blocks on other OS threads may add to the same address.
///
/// # Safety
/// `ptr` must point to a writable, 4-byte aligned f32 of global memory.
#[track_caller]
pub unsafe fn red_global_add_f32(ptr: *mut f32, value: f32) {
    atomic_global_word(ptr.cast(), "red.global.add.f32", Location::caller(), |cell| add_f32(cell, value))
}

/// Adds `value` to the f32 whose bits `cell` holds, atomically.
fn add_f32(cell: &AtomicU32, value: f32) {
    let mut old = cell.load(Ordering::Relaxed);
    loop {
        let new = (f32::from_bits(old) + value).to_bits();
        match cell.compare_exchange_weak(old, new, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => break,
            Err(current) => old = current,
        }
    }
}

/// `red.global.add.v4.f32` (sm_90): adds `values` to the four f32 at
/// `ptr`, each atomically, as blocks on other OS threads may add to the
/// same addresses. A `ptr` that is not 16-byte aligned faults, as on the GPU.
///
/// # Safety
/// `ptr` must point to four writable f32 of global memory, 16-byte aligned.
#[track_caller]
pub unsafe fn red_global_add_v4_f32(ptr: *mut f32, values: [f32; 4]) {
    let (instruction, site) = ("red.global.add.v4.f32", Location::caller());
    context::with(|t| {
        let access = Access { instruction, site, thread: t.tid, addr: ptr as usize, len: 16, align: 16, write: true };
        t.ok(t.block.global.check(&access));
    });
    for (i, value) in values.into_iter().enumerate() {
        atomic_global_word(ptr.add(i).cast(), instruction, site, |cell| add_f32(cell, value));
    }
}

/// `atom.global.add.u32`: adds `value` to the u32 at `ptr` atomically
/// (wrapping, as blocks on other OS threads may add to the same address)
/// and returns what it held before.
///
/// # Safety
/// `ptr` must point to a writable, 4-byte aligned u32 of global memory.
#[track_caller]
pub unsafe fn atom_global_add_u32(ptr: *mut u32, value: u32) -> u32 {
    atomic_global_word(ptr.cast(), "atom.global.add.u32", Location::caller(), |cell| {
        cell.fetch_add(value, Ordering::Relaxed)
    })
}

/// `st.global.b32`.
///
/// # Safety
/// `ptr` must point to 4 writable, 4-byte aligned bytes of global memory.
#[track_caller]
pub unsafe fn st_global_u32(ptr: *mut u32, value: u32) {
    store_global(ptr as *mut u8, &value.to_le_bytes(), "st.global.b32", Location::caller());
}

/// `ld.global.v4.b32`.
///
/// # Safety
/// `ptr` must point to 16 readable, 16-byte aligned bytes of global memory.
#[track_caller]
pub unsafe fn ld_global_v4(ptr: *const u8) -> [u32; 4] {
    let bytes: [u8; 16] = load_global(ptr, "ld.global.v4.b32", Location::caller());
    std::array::from_fn(|i| u32::from_le_bytes([bytes[4 * i], bytes[4 * i + 1], bytes[4 * i + 2], bytes[4 * i + 3]]))
}

/// `ld.global.s32`.
///
/// # Safety
/// `ptr` must point to a readable, 4-byte aligned i32 of global memory.
#[track_caller]
pub unsafe fn ld_global_i32(ptr: *const i32) -> i32 {
    i32::from_le_bytes(load_global(ptr as *const u8, "ld.global.s32", Location::caller()))
}

/// `ld.global.f32`.
///
/// # Safety
/// `ptr` must point to a readable, 4-byte aligned f32 of global memory.
#[track_caller]
pub unsafe fn ld_global_f32(ptr: *const f32) -> f32 {
    f32::from_le_bytes(load_global(ptr as *const u8, "ld.global.f32", Location::caller()))
}

fn load_global<const N: usize>(ptr: *const u8, instruction: &'static str, site: Site) -> [u8; N] {
    context::with(|t| {
        let access = Access { instruction, site, thread: t.tid, addr: ptr as usize, len: N, align: N, write: false };
        t.ok(t.block.global.check(&access));
        let mut bytes = [0u8; N];
        // SAFETY: inside a registered allocation (checked above).
        unsafe { std::ptr::copy_nonoverlapping(ptr, bytes.as_mut_ptr(), N) };
        bytes
    })
}

fn store_global(ptr: *mut u8, bytes: &[u8], instruction: &'static str, site: Site) {
    context::with(|t| {
        let access = Access {
            instruction,
            site,
            thread: t.tid,
            addr: ptr as usize,
            len: bytes.len(),
            align: bytes.len(),
            write: true,
        };
        t.ok(t.block.global.check(&access));
        // SAFETY: inside a registered writable allocation (checked above).
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), ptr, bytes.len()) };
    })
}

/// `trap`: aborts the kernel (the panic handler's end).
#[track_caller]
pub fn trap() -> ! {
    let site = Location::caller();
    context::with(|t| t.block.fail(Fault::new(FaultKind::Trap, Some(t.tid), format!("trap at {site}"))))
}

/// `xor.b32` (kept in place on the GPU; see the PTX version).
pub fn xor_in_place(a: u32, b: u32) -> u32 {
    a ^ b
}

/// `fma.rn.f32`: `a * b + c` with one rounding.
pub fn fma(a: f32, b: f32, c: f32) -> f32 {
    float::fma_rn(a, b, c)
}

fn lane(t: &Thread<'_>) -> Accessor {
    Accessor { thread: t.tid, collective: false }
}

/// Runs a warp-collective instruction for `t`, stopping the thread on a fault.
fn warp_collective(
    t: &Thread<'_>,
    op: Collective,
    site: Site,
    input: LaneIn,
    compute: impl FnOnce(&[LaneIn; 32]) -> Result<[LaneOut; 32], Fault>,
) -> LaneOut {
    t.ok(t.block.sync.collective(t.tid, op, site, input, compute, || t.suspend()))
}

// ---------------------------------------------------------------------------
// sm_90a: mbarriers, named barriers, the async proxy, setmaxnreg, TMA and
// wgmma (see `arch/ptx.rs` for each instruction's PTX ISA semantics).
// ---------------------------------------------------------------------------

pub use flash_attn_abi::sm90::TensorMap;

/// Checks that `addr` can hold an mbarrier (8 bytes, 8-byte aligned, in
/// the block's shared memory).
fn check_mbarrier(t: &Thread<'_>, instruction: &'static str, addr: u32, site: Site) {
    let req = Request { who: lane(t), instruction, site, addr, len: 8 };
    t.ok(t.block.smem.check_bounds(&req, 8));
}

/// Lands the TMA copies of a completed mbarrier phase, which also orders
/// (for the race check) what the arrivals did before it against what the
/// waiting threads do after.
fn land_phase<'t>(t: &'t Thread<'_>, bar: u32) -> impl FnOnce(Vec<(u32, PendingCopy)>, u64) + 't {
    move |landing, phase| {
        for (thread, copy) in landing {
            t.block.smem.land(thread, vec![copy], Some((bar, phase)));
        }
        t.block.smem.block_barrier();
    }
}

/// `mbarrier.init.shared::cta.b64 [addr], count`: a barrier object at
/// `addr` in phase 0 that completes a phase after `count` arrivals (and
/// once its transaction count is back at zero).
///
/// # Safety
/// `addr` is an 8-byte aligned shared address of the block that no thread
/// uses as anything else while the barrier lives.
#[track_caller]
pub unsafe fn mbarrier_init(addr: u32, count: u32) {
    let site = Location::caller();
    context::with(|t| {
        check_mbarrier(t, "mbarrier.init.shared::cta.b64", addr, site);
        t.ok(t.block.sync.mbarrier_init(t.tid, addr, count, site));
    })
}

/// `fence.mbarrier_init.release.cluster`. In the emulator an
/// `mbarrier.init` is visible to every thread at once, so this does nothing.
pub fn fence_mbarrier_init() {}

fn mbarrier_update(instruction: &'static str, addr: u32, update: MbarrierUpdate, site: Site) {
    context::with(|t| {
        check_mbarrier(t, instruction, addr, site);
        if update.arrive {
            // The release: what this thread has observed passes to the
            // threads that wait for this barrier.
            t.block.smem.release_observations(t.tid, addr);
        }
        t.ok(t.block.sync.mbarrier_update(t.tid, addr, (instruction, site), update, land_phase(t, addr)));
    })
}

/// `mbarrier.arrive.release.cta.shared::cta.b64`: one arrival (release) on
/// the barrier at `addr`.
///
/// # Safety
/// `addr` holds an initialised mbarrier.
#[track_caller]
pub unsafe fn mbarrier_arrive(addr: u32) {
    let update = MbarrierUpdate { arrive: true, ..Default::default() };
    mbarrier_update("mbarrier.arrive.release.cta.shared::cta.b64", addr, update, Location::caller());
}

/// `mbarrier.arrive.expect_tx.release.cta.shared::cta.b64`: raises the
/// current phase's transaction count by `bytes` (expect-tx), then arrives.
///
/// # Safety
/// `addr` holds an initialised mbarrier.
#[track_caller]
pub unsafe fn mbarrier_arrive_expect_tx(addr: u32, bytes: u32) {
    let update = MbarrierUpdate { expect_tx: bytes, arrive: true, ..Default::default() };
    mbarrier_update("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64", addr, update, Location::caller());
}

/// `mbarrier.expect_tx.relaxed.cta.shared::cta.b64`: raises the current
/// phase's transaction count by `bytes` without arriving.
///
/// # Safety
/// `addr` holds an initialised mbarrier.
#[track_caller]
pub unsafe fn mbarrier_expect_tx(addr: u32, bytes: u32) {
    let update = MbarrierUpdate { expect_tx: bytes, ..Default::default() };
    mbarrier_update("mbarrier.expect_tx.relaxed.cta.shared::cta.b64", addr, update, Location::caller());
}

/// `mbarrier.complete_tx.relaxed.cta.shared::cta.b64`: lowers the current
/// phase's transaction count by `bytes`, as a TMA copy does when its bytes
/// land.
///
/// # Safety
/// `addr` holds an initialised mbarrier.
#[track_caller]
pub unsafe fn mbarrier_complete_tx(addr: u32, bytes: u32) {
    let update = MbarrierUpdate { complete_tx: bytes, ..Default::default() };
    mbarrier_update("mbarrier.complete_tx.relaxed.cta.shared::cta.b64", addr, update, Location::caller());
}

/// `mbarrier.try_wait.parity.acquire.cta.shared::cta.b64`: whether the
/// phase of parity `parity` has completed (the current phase has the other
/// parity). Answering false, the thread first waits a round of the
/// scheduler, as the hardware waits a while.
///
/// # Safety
/// `addr` holds an initialised mbarrier.
#[track_caller]
pub unsafe fn mbarrier_try_wait_parity(addr: u32, parity: u32) -> bool {
    let site = Location::caller();
    context::with(|t| {
        check_mbarrier(t, "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64", addr, site);
        let done = t.ok(t.block.sync.mbarrier_try_wait(t.tid, addr, parity, site, || t.suspend()));
        if let (true, Some(phases)) = (done, t.block.sync.mbarrier_phases(addr)) {
            // The acquire: TMA bytes landed by these phases are this thread's to read.
            t.block.smem.observe_mbarrier(t.tid, addr, phases);
        }
        done
    })
}

/// Waits until the phase of parity `parity` of the barrier at `addr` has
/// completed: [`mbarrier_try_wait_parity`] until it answers true.
///
/// # Safety
/// `addr` holds an initialised mbarrier.
#[track_caller]
pub unsafe fn mbarrier_wait_parity(addr: u32, parity: u32) {
    while !mbarrier_try_wait_parity(addr, parity) {}
}

/// `barrier.sync.aligned id, threads`: waits on named barrier `id` (1..16)
/// until `threads` threads (whole warps) have arrived; orders shared memory.
#[track_caller]
pub fn named_barrier_sync(id: u32, threads: u32) {
    named_barrier(NamedArrival { id, threads, wait: true }, Location::caller());
}

/// `barrier.arrive.aligned id, threads`: arrives at named barrier `id` of
/// `threads` threads without waiting.
#[track_caller]
pub fn named_barrier_arrive(id: u32, threads: u32) {
    named_barrier(NamedArrival { id, threads, wait: false }, Location::caller());
}

fn named_barrier(arrival: NamedArrival, site: Site) {
    context::with(|t| {
        let barrier = || {
            t.block.smem.block_barrier();
            t.block.smem.share_observations();
        };
        t.ok(t.block.sync.named_barrier(t.tid, arrival, site, barrier, || t.suspend()))
    })
}

/// `fence.proxy.async.shared::cta`: makes this thread's earlier
/// generic-proxy shared-memory writes visible to the async proxy.
pub fn fence_proxy_async_shared() {
    context::with(|t| t.block.smem.fence_proxy_async(t.tid))
}

/// `setmaxnreg.inc.sync.aligned.u32 N`: raises the warpgroup's registers
/// per thread to `N`, waiting until the CTA's pool has them.
#[track_caller]
pub fn setmaxnreg_inc<const N: u32>() {
    setmaxnreg(N, true, Location::caller())
}

/// `setmaxnreg.dec.sync.aligned.u32 N`: lowers the warpgroup's registers
/// per thread to `N`, returning the rest to the CTA's pool.
#[track_caller]
pub fn setmaxnreg_dec<const N: u32>() {
    setmaxnreg(N, false, Location::caller())
}

fn setmaxnreg(count: u32, inc: bool, site: Site) {
    let op = if inc { "setmaxnreg.inc.sync.aligned.u32" } else { "setmaxnreg.dec.sync.aligned.u32" };
    context::with(|t| {
        let g = t.tid / 128;
        let mut input = [0; 10];
        input[0] = count;
        let check = |inputs: &[LaneIn]| {
            let fault = |message: String| {
                Err(Fault::new(FaultKind::RegisterBudget, Some(t.tid), format!("{op} {count} at {site}: {message}")))
            };
            if let Some(other) = inputs.iter().position(|i| i[0] != count) {
                return fault(format!(
                    "thread {} of the warpgroup asks for {}",
                    128 * g as usize + other,
                    inputs[other][0]
                ));
            }
            if !(24..=256).contains(&count) || !count.is_multiple_of(8) {
                return fault("the count must be a multiple of 8 in 24..=256".into());
            }
            let current = t.block.sync.registers(g);
            if (inc && count < current) || (!inc && count > current) {
                let direction = if inc { "below" } else { "above" };
                return fault(format!("{direction} the warpgroup's current {current} registers per thread"));
            }
            Ok(())
        };
        t.ok(t.block.sync.warpgroup_collective(t.tid, op, site, input, check, || t.suspend()));
        t.ok(t.block.sync.set_registers(t.tid, count, inc, site, || t.suspend()));
    })
}

macro_rules! tma_load {
    ($(#[$doc:meta])* $name:ident, $rank:literal) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// `map` points to a tensor map in global memory, 64-byte aligned; the
        /// box fits at `dst`; `bar` holds an initialised mbarrier.
        #[track_caller]
        pub unsafe fn $name(dst: u32, map: *const TensorMap, coords: [i32; $rank], bar: u32) {
            tma_load(dst, map, &coords, bar, Location::caller())
        }
    };
}

tma_load!(
    /// `cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes`:
    /// the box of the tensor map at `coords` into shared memory at `dst`,
    /// completing its bytes on the mbarrier at `bar`. The emulator reads
    /// global memory at issue and performs the complete-tx at once; the
    /// bytes land (and may be read) when the barrier's phase completes.
    tma_load_2d,
    2
);
tma_load!(
    /// As [`tma_load_2d`], for a 3-dimensional tensor map.
    tma_load_3d,
    3
);
tma_load!(
    /// As [`tma_load_2d`], for a 4-dimensional tensor map.
    tma_load_4d,
    4
);
tma_load!(
    /// As [`tma_load_2d`], for a 5-dimensional tensor map.
    tma_load_5d,
    5
);

fn tma_load(dst: u32, map: *const TensorMap, coords: &[i32], bar: u32, site: Site) {
    const INSTRUCTION: &str = "cp.async.bulk.tensor.shared::cluster.global.tile.mbarrier::complete_tx::bytes";
    context::with(|t| {
        let invalid = |message: String| -> ! {
            t.block.fail(Fault::new(
                FaultKind::InvalidOperand,
                Some(t.tid),
                format!("{INSTRUCTION} at {site}: {message}"),
            ))
        };
        let access = Access {
            instruction: INSTRUCTION,
            site,
            thread: t.tid,
            addr: map as usize,
            len: 128,
            align: 64,
            write: false,
        };
        t.ok(t.block.global.check(&access));
        // SAFETY: 128 readable bytes (checked above).
        let blob = unsafe { std::ptr::read(map) };
        let params = TensorMapParams::decode(&blob).unwrap_or_else(|e| match e {
            TensorMapError::NotOurEncoding => invalid(format!(
                "the tensor map at {map:p} is not one TensorMapParams::encode wrote (on a GPU it is the driver's \
                 cuTensorMapEncodeTiled blob; the emulator reads our encoding of the same parameters)"
            )),
            TensorMapError::Invalid(why) => invalid(format!("the tensor map at {map:p}: {why}")),
        });
        let size = params.data_type.size() as usize;
        let read = |addr: u64, len: usize| {
            let access = Access {
                instruction: INSTRUCTION,
                site,
                thread: t.tid,
                addr: addr as usize,
                len,
                align: size,
                write: false,
            };
            t.block.global.check(&access)?;
            let mut bytes = vec![0u8; len];
            // SAFETY: inside a registered allocation (checked above).
            unsafe { std::ptr::copy_nonoverlapping(addr as usize as *const u8, bytes.as_mut_ptr(), len) };
            Ok(bytes)
        };
        let chunks = match tma::load_box(&params, coords, dst, read) {
            Err(why) => invalid(why),
            Ok(chunks) => t.ok(chunks),
        };
        check_mbarrier(t, INSTRUCTION, bar, site);
        let mut copies = Vec::with_capacity(chunks.len());
        for (addr, data) in chunks {
            let req = Request { who: lane(t), instruction: INSTRUCTION, site, addr, len: 16 };
            t.ok(t.block.smem.start_copy(&req, true));
            copies.push((t.tid, PendingCopy { dst: addr, data, len: 16, site }));
        }
        let update = MbarrierUpdate { complete_tx: params.box_bytes(), copies, ..Default::default() };
        let update = t.block.sync.mbarrier_update(t.tid, bar, (INSTRUCTION, site), update, land_phase(t, bar));
        t.ok(update);
    })
}

/// Pins the registers of `acc` for the compiler (an empty `asm` on the
/// GPU, CUTLASS's `warpgroup_fence_operand`); nothing to emulate: the
/// emulator runs the program in source order.
pub fn wgmma_fence_operand<const R: usize>(_acc: &mut WgmmaAccumulator<R>) {}

/// `wgmma.fence.sync.aligned`: orders this thread's earlier register
/// accesses before the wgmmas that follow.
pub fn wgmma_fence() {
    context::with(|t| t.wgmma.borrow_mut().fences += 1)
}

/// `wgmma.commit_group.sync.aligned`: closes the group of wgmmas issued
/// since the last commit.
pub fn wgmma_commit_group() {
    context::with(|t| t.wgmma.borrow_mut().commit())
}

/// `wgmma.wait_group.sync.aligned N`: waits until at most `N` committed
/// wgmma groups are pending. The emulator computes each wgmma when it is
/// issued; the wait marks the accumulators of the covered groups readable.
pub fn wgmma_wait_group<const N: u32>() {
    context::with(|t| {
        let mut groups = t.wgmma.borrow_mut();
        groups.wait(N as usize);
        t.block.smem.wgmma_completed(t.tid, groups.completed());
    })
}

/// The f32 accumulator fragment of one thread for `wgmma.m64nNk16` with
/// `N = 2 * R` (see `arch/ptx.rs` for the layout). The emulator checks each
/// register access against the wgmmas in flight and notes it for the
/// fence check.
#[derive(Clone)]
pub struct WgmmaAccumulator<const R: usize> {
    regs: [f32; R],
    state: Cell<AccumulatorState>,
}

impl<const R: usize> WgmmaAccumulator<R> {
    #[track_caller]
    pub fn new(values: [f32; R]) -> Self {
        let acc = Self { regs: values, state: Cell::default() };
        acc.access(Location::caller());
        acc
    }

    /// The registers, once the wgmma that wrote them has been waited for.
    #[track_caller]
    pub fn get(&self) -> &[f32; R] {
        self.access(Location::caller());
        &self.regs
    }

    /// The registers, for writing (a `wgmma_fence` must follow before the
    /// next wgmma on them).
    #[track_caller]
    pub fn get_mut(&mut self) -> &mut [f32; R] {
        self.access(Location::caller());
        &mut self.regs
    }

    /// A register access at `site`: a fault while a wgmma writing the
    /// registers is in flight.
    fn access(&self, site: Site) {
        context::with(|t| {
            let mut state = self.state.get();
            let groups = t.wgmma.borrow();
            if let Some((number, written_at, instruction)) = state.written_by {
                if let Some(why) = groups.in_flight(number) {
                    let message = format!(
                        "wgmma accumulator accessed at {site} while the {instruction} at {written_at} that writes it \
                         is in flight: {why}"
                    );
                    drop(groups);
                    t.block.fail(Fault::new(FaultKind::WgmmaInFlight, Some(t.tid), message));
                }
            }
            state.accessed_at_fence = Some(groups.fences);
            state.accessed_at = Some(site);
            self.state.set(state);
        })
    }
}

/// The A operand of a wgmma.
enum OperandA {
    /// In shared memory, K-major (SS).
    Shared(u64),
    /// This thread's fragment (RS).
    Registers([u32; 4]),
}

/// The instruction of `r` accumulator registers (N = 2r) and type `ty`;
/// `None` for an N that `arch` does not implement.
fn wgmma_name(r: usize, ty: HalfType) -> Option<&'static str> {
    Some(match (r, ty) {
        (16, HalfType::F16) => "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16",
        (32, HalfType::F16) => "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16",
        (40, HalfType::F16) => "wgmma.mma_async.sync.aligned.m64n80k16.f32.f16.f16",
        (48, HalfType::F16) => "wgmma.mma_async.sync.aligned.m64n96k16.f32.f16.f16",
        (64, HalfType::F16) => "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16",
        (80, HalfType::F16) => "wgmma.mma_async.sync.aligned.m64n160k16.f32.f16.f16",
        (96, HalfType::F16) => "wgmma.mma_async.sync.aligned.m64n192k16.f32.f16.f16",
        (112, HalfType::F16) => "wgmma.mma_async.sync.aligned.m64n224k16.f32.f16.f16",
        (128, HalfType::F16) => "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16",
        (16, HalfType::Bf16) => "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16",
        (32, HalfType::Bf16) => "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16",
        (40, HalfType::Bf16) => "wgmma.mma_async.sync.aligned.m64n80k16.f32.bf16.bf16",
        (48, HalfType::Bf16) => "wgmma.mma_async.sync.aligned.m64n96k16.f32.bf16.bf16",
        (64, HalfType::Bf16) => "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16",
        (80, HalfType::Bf16) => "wgmma.mma_async.sync.aligned.m64n160k16.f32.bf16.bf16",
        (96, HalfType::Bf16) => "wgmma.mma_async.sync.aligned.m64n192k16.f32.bf16.bf16",
        (112, HalfType::Bf16) => "wgmma.mma_async.sync.aligned.m64n224k16.f32.bf16.bf16",
        (128, HalfType::Bf16) => "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16",
        _ => return None,
    })
}

/// A and B of one wgmma as matrices: A's 64 rows and B's N columns, each
/// 16 elements of K.
struct Operands {
    a: Vec<[u16; 16]>,
    b: Vec<[u16; 16]>,
}

/// Reads the `rows` x 16 operand `desc` describes (rows along M or N) for
/// wgmma `number` of the thread's warpgroup.
fn read_operand(
    t: &Thread<'_>,
    (instruction, site, number): (&'static str, Site, u64),
    desc: u64,
    major: wgmma::Major,
    rows: u32,
) -> Result<Vec<[u16; 16]>, Fault> {
    let desc = MatrixDescriptor::decode(desc);
    let who = Accessor { thread: t.tid / 128 * 128, collective: true };
    let mut matrix = vec![[0u16; 16]; rows as usize];
    // Each chunk holds 8 elements along the major dimension.
    let (outer, inner) = match major {
        wgmma::Major::K => (rows, 2),
        wgmma::Major::Mn => (16, rows / 8),
    };
    for o in 0..outer {
        for i in 0..inner {
            let (mn, k) = match major {
                wgmma::Major::K => (o, 8 * i),
                wgmma::Major::Mn => (8 * i, o),
            };
            let (addr, _) = wgmma::chunk_of(&desc, major, mn, k).map_err(|why| {
                Fault::new(
                    FaultKind::InvalidOperand,
                    Some(t.tid),
                    format!("{instruction} at {site}: descriptor {desc:?}: {why}"),
                )
            })?;
            let req = Request { who, instruction, site, addr, len: 16 };
            let bytes = t.block.smem.read_async(&req, (t.tid / 128, number))?;
            for e in 0..8u32 {
                let value = u16::from_le_bytes([bytes[2 * e as usize], bytes[2 * e as usize + 1]]);
                match major {
                    wgmma::Major::K => matrix[mn as usize][(k + e) as usize] = value,
                    wgmma::Major::Mn => matrix[(mn + e) as usize][k as usize] = value,
                }
            }
        }
    }
    Ok(matrix)
}

fn wgmma_mma<const R: usize>(
    ty: HalfType,
    acc: &mut WgmmaAccumulator<R>,
    a: OperandA,
    b_desc: u64,
    (trans_a, trans_b): (u32, u32),
    scale_d: bool,
    site: Site,
) {
    let name = wgmma_name(R, ty);
    let instruction = name.unwrap_or("wgmma.mma_async.sync.aligned");
    context::with(|t| {
        let fail = |kind, message: String| -> ! {
            t.block.fail(Fault::new(kind, Some(t.tid), format!("{instruction} at {site}: {message}")))
        };
        if name.is_none() {
            fail(FaultKind::InvalidOperand, format!("{R} accumulator registers: an N that arch does not implement"));
        }
        if trans_a > 1 || trans_b > 1 {
            fail(FaultKind::InvalidOperand, format!("imm-trans-a {trans_a}, imm-trans-b {trans_b} (0 or 1)"));
        }
        let state = acc.state.get();
        let fences = t.wgmma.borrow().fences;
        if state.accessed_at_fence.is_none_or(|f| f >= fences) {
            let at = state.accessed_at.map_or("its creation".to_string(), |s| s.to_string());
            fail(
                FaultKind::MissingWgmmaFence,
                format!("no wgmma.fence since the thread's last access of the accumulator registers, at {at}"),
            );
        }
        let number = t.wgmma.borrow_mut().issue();
        let mut input = [0u32; 10];
        let a_desc = match a {
            OperandA::Shared(desc) => {
                input[0..2].copy_from_slice(&[desc as u32, (desc >> 32) as u32]);
                Some(desc)
            }
            OperandA::Registers(regs) => {
                input[5..9].copy_from_slice(&regs);
                None
            }
        };
        input[2..4].copy_from_slice(&[b_desc as u32, (b_desc >> 32) as u32]);
        input[4] = scale_d as u32;
        let n = 2 * R as u32;
        let compute = |inputs: &[LaneIn]| -> Result<Operands, Fault> {
            let uniform = |range: std::ops::Range<usize>, what: &str| match inputs
                .iter()
                .position(|i| i[range.clone()] != inputs[0][range.clone()])
            {
                Some(other) => Err(Fault::new(
                    FaultKind::InvalidOperand,
                    Some(t.tid / 128 * 128 + other as u32),
                    format!("{instruction} at {site}: {what} differs between threads 0 and {other} of the warpgroup"),
                )),
                None => Ok(()),
            };
            uniform(0..2, "the A descriptor")?;
            uniform(2..4, "the B descriptor")?;
            uniform(4..5, "scale-d")?;
            let a = match a_desc {
                Some(desc) => {
                    let major = if trans_a == 1 { wgmma::Major::Mn } else { wgmma::Major::K };
                    read_operand(t, (instruction, site, number), desc, major, 64)?
                }
                None => {
                    // The m16n8k16 A layout per warp, rows 16 * warp up.
                    let mut a = vec![[0u16; 16]; 64];
                    for (thread, i) in inputs.iter().enumerate() {
                        let (warp, g, q) = (thread / 32, thread % 32 / 4, thread % 4);
                        for (r, &reg) in i[5..9].iter().enumerate() {
                            let (row, col) = (16 * warp + g + 8 * (r % 2), 2 * q + 8 * (r / 2));
                            a[row][col] = reg as u16;
                            a[row][col + 1] = (reg >> 16) as u16;
                        }
                    }
                    a
                }
            };
            let major = if trans_b == 1 { wgmma::Major::Mn } else { wgmma::Major::K };
            let b = read_operand(t, (instruction, site, number), b_desc, major, n)?;
            Ok(Operands { a, b })
        };
        let operands =
            t.ok(t.block.sync.warpgroup_collective(t.tid, instruction, site, input, compute, || t.suspend()));
        let (warp, lane) = ((t.tid % 128 / 32) as usize, (t.tid % 32) as usize);
        for (i, d) in acc.regs.iter_mut().enumerate() {
            let row = 16 * warp + lane / 4 + 8 * (i / 2 % 2);
            let col = 8 * (i / 4) + 2 * (lane % 4) + i % 2;
            let c = if scale_d { *d } else { 0.0 };
            *d = float::dot(ty, c, &operands.a[row], &operands.b[col]);
        }
        acc.state.set(AccumulatorState { written_by: Some((number, site, instruction)), ..state });
    })
}

macro_rules! wgmma {
    ($(#[$doc:meta])* $ss:ident, $rs:ident, $ty:expr) => {
        $(#[$doc])*
        #[track_caller]
        pub fn $ss<const R: usize, const TRANS_A: u32, const TRANS_B: u32>(
            acc: &mut WgmmaAccumulator<R>,
            a_desc: u64,
            b_desc: u64,
            scale_d: bool,
        ) {
            wgmma_mma($ty, acc, OperandA::Shared(a_desc), b_desc, (TRANS_A, TRANS_B), scale_d, Location::caller())
        }

        /// As the SS form, with A from this thread's registers (RS).
        #[track_caller]
        pub fn $rs<const R: usize, const TRANS_B: u32>(
            acc: &mut WgmmaAccumulator<R>,
            a: &[u32; 4],
            b_desc: u64,
            scale_d: bool,
        ) {
            wgmma_mma($ty, acc, OperandA::Registers(*a), b_desc, (0, TRANS_B), scale_d, Location::caller())
        }
    };
}

wgmma!(
    /// `wgmma.mma_async.sync.aligned.m64nNk16.f32.f16.f16` (SS: A and B
    /// from shared-memory matrix descriptors; A MN-major when `TRANS_A` is
    /// 1, B when `TRANS_B` is). Computed when issued; its accumulator may be read after a
    /// `wgmma_wait_group` that covers it.
    wgmma_ss_f16,
    wgmma_rs_f16,
    HalfType::F16
);
wgmma!(
    /// `wgmma.mma_async.sync.aligned.m64nNk16.f32.bf16.bf16`: as [`wgmma_ss_f16`].
    wgmma_ss_bf16,
    wgmma_rs_bf16,
    HalfType::Bf16
);

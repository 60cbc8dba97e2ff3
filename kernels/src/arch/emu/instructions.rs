//! The `arch` interface on the host: the same functions as `ptx.rs`, each
//! emulating its instruction for the GPU thread whose coroutine is running
//! (see [`super::launch`]). Instructions that touch memory or the warp note
//! their caller's source location (`#[track_caller]`) for fault messages.

use std::panic::Location;

use super::collective;
use super::context::{self, Thread};
use super::error::{Fault, FaultKind};
use super::float::{self, HalfType};
use super::global::Access;
use super::rendezvous::{Collective, LaneIn, LaneOut};
use super::smem::{self, Accessor, PendingCopy, Request};

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
    context::with(|t| t.ok(t.block.sync.barrier(t.tid, site, || t.block.smem.block_barrier(), || t.suspend())))
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
    let site = Location::caller();
    context::with(|t| {
        const INSTRUCTION: &str = "cp.async.cg.shared.global";
        if src_bytes > 16 {
            let message = format!("{INSTRUCTION} at {site}: source size {src_bytes} exceeds the copy size 16");
            t.block.fail(Fault::new(FaultKind::InvalidOperand, Some(t.tid), message));
        }
        let mut data = [0u8; 16];
        if src_bytes > 0 {
            let access = Access {
                instruction: INSTRUCTION,
                site,
                thread: t.tid,
                addr: src as usize,
                len: src_bytes as usize,
                align: 16,
                write: false,
            };
            t.ok(t.block.global.check(&access));
            // SAFETY: inside a registered allocation (checked above).
            unsafe { std::ptr::copy_nonoverlapping(src, data.as_mut_ptr(), src_bytes as usize) };
        }
        let req = Request { who: lane(t), instruction: INSTRUCTION, site, addr: dst, len: 16 };
        t.ok(t.block.smem.start_copy(&req));
        t.copies.borrow_mut().issue(PendingCopy { dst, data, site });
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

/// `ld.shared.b32`.
///
/// # Safety
/// `addr` must be a 4-byte aligned shared address of the block.
#[track_caller]
pub unsafe fn ld_shared_u32(addr: u32) -> u32 {
    let site = Location::caller();
    context::with(|t| {
        let req = Request { who: lane(t), instruction: "ld.shared.b32", site, addr, len: 4 };
        let bytes = t.ok(t.block.smem.read(&req));
        u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
    })
}

/// `ld.shared.v4.b32`.
///
/// # Safety
/// `addr` must be a 16-byte aligned shared address of the block.
#[track_caller]
pub unsafe fn ld_shared_v4(addr: u32) -> [u32; 4] {
    let site = Location::caller();
    context::with(|t| {
        let req = Request { who: lane(t), instruction: "ld.shared.v4.b32", site, addr, len: 16 };
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

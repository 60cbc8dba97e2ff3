//! The device primitives as inline PTX, for `nvptx64-nvidia-cuda`.
//!
//! This is the only file with inline assembly; [`super::emu`] implements the
//! same functions on the host.

use core::arch::asm;

core::arch::global_asm!(".extern .shared .align 128 .b8 DYNAMIC_SMEM[];");

/// Shared-window address of the start of the block's dynamic shared memory.
#[inline(always)]
pub fn dynamic_smem_base() -> u32 {
    let base: u32;
    unsafe { asm!("mov.u32 {r}, DYNAMIC_SMEM;", r = out(reg32) base, options(pure, nomem, nostack)) };
    base
}

macro_rules! special_register {
    ($(#[$doc:meta])* $name:ident, $reg:literal) => {
        $(#[$doc])*
        #[inline(always)]
        pub fn $name() -> u32 {
            let value: u32;
            unsafe {
                asm!(concat!("mov.u32 {r}, ", $reg, ";"), r = out(reg32) value,
                     options(pure, nomem, nostack))
            };
            value
        }
    };
}

special_register!(
    /// `%tid.x`: the thread's index in its block.
    thread_idx_x,
    "%tid.x"
);
special_register!(
    /// `%ctaid.x`: the block's index along x.
    block_idx_x,
    "%ctaid.x"
);
special_register!(
    /// `%ctaid.y`: the block's index along y.
    block_idx_y,
    "%ctaid.y"
);
special_register!(
    /// `%ctaid.z`: the block's index along z.
    block_idx_z,
    "%ctaid.z"
);
special_register!(
    /// `%nctaid.x`: the number of blocks along x.
    grid_dim_x,
    "%nctaid.x"
);
special_register!(
    /// `%nctaid.z`: the number of blocks along z.
    grid_dim_z,
    "%nctaid.z"
);

// The barriers are LLVM's NVVM intrinsics, not inline asm: the intrinsics
// are `convergent`, so LLVM never makes them depend on more control flow
// than the source gives them. An `asm!` barrier is ordinary code to LLVM,
// which may then duplicate it into both arms of a branch (it did, in the
// decode kernels' warp merge); warps that take different arms meet one
// source barrier at two instructions, which `bar.sync` (aligned) forbids.
// `cargo xtask build-ptx` checks the compiled PTX for that (xtask's
// divergence check).
extern "C" {
    #[link_name = "llvm.nvvm.barrier.cta.sync.aligned.all"]
    fn barrier_cta_sync_aligned_all(barrier: u32);
    #[link_name = "llvm.nvvm.bar.warp.sync"]
    fn bar_warp_sync(member_mask: u32);
}

/// `bar.sync 0`: block-wide barrier; also orders shared-memory accesses.
#[inline(always)]
pub fn sync_threads() {
    unsafe { barrier_cta_sync_aligned_all(0) };
}

/// `bar.warp.sync`: reconverges the warp and orders its shared-memory accesses.
#[inline(always)]
pub fn sync_warp() {
    unsafe { bar_warp_sync(u32::MAX) };
}

/// `cp.async.cg.shared.global` of 16 bytes. Copies `src_bytes` (0 or 16) bytes
/// from `src` and fills the rest of the 16 with zeros; with 0 nothing is read.
///
/// # Safety
/// `dst` must be a 16-byte aligned shared address of the block; when
/// `src_bytes` is 16, `src` must point to 16 readable, 16-byte aligned bytes.
#[inline(always)]
pub unsafe fn cp_async_16(dst: u32, src: *const u8, src_bytes: u32) {
    asm!(
        "cp.async.cg.shared.global [{dst}], [{src}], 16, {n};",
        dst = in(reg32) dst,
        src = in(reg64) src,
        n = in(reg32) src_bytes,
        options(nostack)
    );
}

/// `cp.async.commit_group`: closes the group of copies issued since the last commit.
#[inline(always)]
pub fn cp_async_commit() {
    unsafe { asm!("cp.async.commit_group;", options(nostack)) };
}

/// `cp.async.wait_group N`: waits until at most `N` committed groups are pending.
#[inline(always)]
pub fn cp_async_wait<const N: u32>() {
    unsafe { asm!("cp.async.wait_group {n};", n = const N, options(nostack)) };
}

/// `ldmatrix.sync.aligned.m8n8.x4.shared.b16`: lanes 8i..8i+7 give the row
/// addresses of matrix i; each lane receives one 32-bit register per matrix.
///
/// # Safety
/// `addr` must be a 16-byte aligned shared address holding 16 readable bytes.
#[inline(always)]
pub unsafe fn ldmatrix_x4(addr: u32) -> [u32; 4] {
    let (r0, r1, r2, r3): (u32, u32, u32, u32);
    asm!(
        "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {{{0}, {1}, {2}, {3}}}, [{a}];",
        out(reg32) r0, out(reg32) r1, out(reg32) r2, out(reg32) r3,
        a = in(reg32) addr,
        options(nostack, readonly)
    );
    [r0, r1, r2, r3]
}

/// `ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16`: as [`ldmatrix_x4`], each
/// 8x8 matrix transposed on the way.
///
/// # Safety
/// As [`ldmatrix_x4`].
#[inline(always)]
pub unsafe fn ldmatrix_x4_trans(addr: u32) -> [u32; 4] {
    let (r0, r1, r2, r3): (u32, u32, u32, u32);
    asm!(
        "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {{{0}, {1}, {2}, {3}}}, [{a}];",
        out(reg32) r0, out(reg32) r1, out(reg32) r2, out(reg32) r3,
        a = in(reg32) addr,
        options(nostack, readonly)
    );
    [r0, r1, r2, r3]
}

macro_rules! mma_m16n8k16 {
    ($(#[$doc:meta])* $name:ident, $ty:literal) => {
        $(#[$doc])*
        #[inline(always)]
        pub fn $name(acc: &mut [f32; 4], a: &[u32; 4], b: &[u32; 2]) {
            unsafe {
                asm!(
                    concat!("mma.sync.aligned.m16n8k16.row.col.f32.", $ty, ".", $ty, ".f32 ",
                            "{{{0}, {1}, {2}, {3}}}, {{{4}, {5}, {6}, {7}}}, {{{8}, {9}}}, ",
                            "{{{0}, {1}, {2}, {3}}};"),
                    inout(reg32) acc[0], inout(reg32) acc[1],
                    inout(reg32) acc[2], inout(reg32) acc[3],
                    in(reg32) a[0], in(reg32) a[1], in(reg32) a[2], in(reg32) a[3],
                    in(reg32) b[0], in(reg32) b[1],
                    options(pure, nomem, nostack)
                )
            };
        }
    };
}

mma_m16n8k16!(
    /// `mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32`: `acc += a * b`.
    mma_f16,
    "f16"
);
mma_m16n8k16!(
    /// `mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32`: `acc += a * b`.
    mma_bf16,
    "bf16"
);

/// `shfl.sync.bfly.b32` over the full warp: the value of lane `lane ^ mask`.
#[inline(always)]
pub fn shfl_xor_f32(value: f32, mask: u32) -> f32 {
    let r: f32;
    unsafe {
        asm!(
            "shfl.sync.bfly.b32 {r}, {v}, {m}, 0x1f, 0xffffffff;",
            r = out(reg32) r, v = in(reg32) value, m = in(reg32) mask,
            options(nostack, nomem)
        )
    };
    r
}

/// `vote.sync.any.pred` over the full warp: whether `predicate` holds in
/// any lane.
#[inline(always)]
pub fn any_sync(predicate: bool) -> bool {
    let any: u32;
    unsafe {
        asm!(
            "{{ .reg .pred p, q; setp.ne.u32 p, {v}, 0; vote.sync.any.pred q, p, 0xffffffff; selp.u32 {r}, 1, 0, q; }}",
            r = out(reg32) any, v = in(reg32) predicate as u32,
            options(nostack, nomem)
        )
    };
    any != 0
}

/// `ex2.approx.ftz.f32`: 2^x (2^-inf = 0).
#[inline(always)]
pub fn exp2(x: f32) -> f32 {
    let r: f32;
    unsafe { asm!("ex2.approx.ftz.f32 {r}, {x};", r = out(reg32) r, x = in(reg32) x, options(pure, nomem, nostack)) };
    r
}

/// `lg2.approx.ftz.f32`: log2(x).
#[inline(always)]
pub fn log2(x: f32) -> f32 {
    let r: f32;
    unsafe { asm!("lg2.approx.ftz.f32 {r}, {x};", r = out(reg32) r, x = in(reg32) x, options(pure, nomem, nostack)) };
    r
}

/// `rcp.approx.ftz.f32`: 1/x.
#[inline(always)]
pub fn recip(x: f32) -> f32 {
    let r: f32;
    unsafe { asm!("rcp.approx.ftz.f32 {r}, {x};", r = out(reg32) r, x = in(reg32) x, options(pure, nomem, nostack)) };
    r
}

/// `cvt.rn.f16x2.f32`: two f32 rounded to f16, `lo` in the low half.
#[inline(always)]
pub fn pack_f16x2(lo: f32, hi: f32) -> u32 {
    let r: u32;
    unsafe {
        asm!("cvt.rn.f16x2.f32 {r}, {hi}, {lo};", r = out(reg32) r, hi = in(reg32) hi, lo = in(reg32) lo,
             options(pure, nomem, nostack))
    };
    r
}

/// `cvt.rn.bf16x2.f32`: two f32 rounded to bf16, `lo` in the low half.
#[inline(always)]
pub fn pack_bf16x2(lo: f32, hi: f32) -> u32 {
    let r: u32;
    unsafe {
        asm!("cvt.rn.bf16x2.f32 {r}, {hi}, {lo};", r = out(reg32) r, hi = in(reg32) hi, lo = in(reg32) lo,
             options(pure, nomem, nostack))
    };
    r
}

/// `st.shared.b32`.
///
/// # Safety
/// `addr` must be a 4-byte aligned shared address of the block.
#[inline(always)]
pub unsafe fn st_shared_u32(addr: u32, value: u32) {
    asm!("st.shared.b32 [{a}], {v};", a = in(reg32) addr, v = in(reg32) value, options(nostack));
}

/// `ld.shared.b32`.
///
/// # Safety
/// `addr` must be a 4-byte aligned shared address of the block.
#[inline(always)]
pub unsafe fn ld_shared_u32(addr: u32) -> u32 {
    let value: u32;
    asm!("ld.shared.b32 {v}, [{a}];", v = out(reg32) value, a = in(reg32) addr, options(nostack, readonly));
    value
}

/// `ld.shared.v4.b32`.
///
/// # Safety
/// `addr` must be a 16-byte aligned shared address of the block.
#[inline(always)]
pub unsafe fn ld_shared_v4(addr: u32) -> [u32; 4] {
    let (r0, r1, r2, r3): (u32, u32, u32, u32);
    asm!(
        "ld.shared.v4.b32 {{{0}, {1}, {2}, {3}}}, [{a}];",
        out(reg32) r0, out(reg32) r1, out(reg32) r2, out(reg32) r3,
        a = in(reg32) addr,
        options(nostack, readonly)
    );
    [r0, r1, r2, r3]
}

/// `st.global.v4.b32`.
///
/// # Safety
/// `ptr` must point to 16 writable, 16-byte aligned bytes of global memory.
#[inline(always)]
pub unsafe fn st_global_v4(ptr: *mut u8, value: [u32; 4]) {
    asm!(
        "st.global.v4.b32 [{p}], {{{0}, {1}, {2}, {3}}};",
        in(reg32) value[0], in(reg32) value[1], in(reg32) value[2], in(reg32) value[3],
        p = in(reg64) ptr,
        options(nostack)
    );
}

/// `st.global.f32`.
///
/// # Safety
/// `ptr` must point to a writable, 4-byte aligned f32 of global memory.
#[inline(always)]
pub unsafe fn st_global_f32(ptr: *mut f32, value: f32) {
    asm!("st.global.f32 [{p}], {v};", p = in(reg64) ptr, v = in(reg32) value, options(nostack));
}

/// `st.global.b32`.
///
/// # Safety
/// `ptr` must point to 4 writable, 4-byte aligned bytes of global memory.
#[inline(always)]
pub unsafe fn st_global_u32(ptr: *mut u32, value: u32) {
    asm!("st.global.b32 [{p}], {v};", p = in(reg64) ptr, v = in(reg32) value, options(nostack));
}

/// `ld.global.v4.b32`.
///
/// # Safety
/// `ptr` must point to 16 readable, 16-byte aligned bytes of global memory.
#[inline(always)]
pub unsafe fn ld_global_v4(ptr: *const u8) -> [u32; 4] {
    let (r0, r1, r2, r3): (u32, u32, u32, u32);
    asm!(
        "ld.global.v4.b32 {{{0}, {1}, {2}, {3}}}, [{p}];",
        out(reg32) r0, out(reg32) r1, out(reg32) r2, out(reg32) r3,
        p = in(reg64) ptr,
        options(nostack, readonly)
    );
    [r0, r1, r2, r3]
}

/// `ld.global.s32`.
///
/// # Safety
/// `ptr` must point to a readable, 4-byte aligned i32 of global memory.
#[inline(always)]
pub unsafe fn ld_global_i32(ptr: *const i32) -> i32 {
    let r: i32;
    asm!("ld.global.s32 {r}, [{p}];", r = out(reg32) r, p = in(reg64) ptr, options(nostack, readonly));
    r
}

/// `ld.global.f32`.
///
/// # Safety
/// `ptr` must point to a readable, 4-byte aligned f32 of global memory.
#[inline(always)]
pub unsafe fn ld_global_f32(ptr: *const f32) -> f32 {
    let r: f32;
    asm!("ld.global.f32 {r}, [{p}];", r = out(reg32) r, p = in(reg64) ptr, options(nostack, readonly));
    r
}

/// `trap`: aborts the kernel (the panic handler's end).
#[inline(always)]
pub fn trap() -> ! {
    unsafe { asm!("trap;", options(noreturn, nostack)) }
}

/// `%tid.x`, read again where it is written: without `pure`, LLVM does not
/// hoist it, nor the offsets derived from it, out of a loop, so a loop can
/// recompute a per-thread offset from it instead of holding a register.
#[inline(always)]
pub fn thread_idx_x_here() -> u32 {
    let value: u32;
    unsafe { asm!("mov.u32 {r}, %tid.x;", r = out(reg32) value, options(nomem, nostack)) };
    value
}

/// `xor.b32`, left where it is written: without `pure`, LLVM neither
/// hoists it out of a loop nor merges it with an equal one. The ldmatrix
/// addresses use it to re-derive their swizzled offsets at each use
/// ([`crate::layout::SmemTile::chunks_across`]) instead of holding one
/// register per offset through the key loop.
#[inline(always)]
pub fn xor_in_place(a: u32, b: u32) -> u32 {
    let r: u32;
    unsafe {
        asm!("xor.b32 {r}, {a}, {b};", r = out(reg32) r, a = in(reg32) a, b = in(reg32) b, options(nomem, nostack))
    };
    r
}

/// `fma.rn.f32`: `a * b + c` with one rounding.
#[inline(always)]
pub fn fma(a: f32, b: f32, c: f32) -> f32 {
    let r: f32;
    unsafe {
        asm!("fma.rn.f32 {r}, {a}, {b}, {c};", r = out(reg32) r, a = in(reg32) a, b = in(reg32) b, c = in(reg32) c,
             options(pure, nomem, nostack))
    };
    r
}

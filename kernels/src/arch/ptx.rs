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

/// `cp.async.ca.shared.global` of 4 bytes. Copies `src_bytes` (0 or 4) bytes
/// from `src` and fills the rest of the 4 with zeros; with 0 nothing is read.
///
/// # Safety
/// `dst` must be a 4-byte aligned shared address of the block; when
/// `src_bytes` is 4, `src` must point to 4 readable, 4-byte aligned bytes.
#[inline(always)]
pub unsafe fn cp_async_4(dst: u32, src: *const u8, src_bytes: u32) {
    asm!(
        "cp.async.ca.shared.global [{dst}], [{src}], 4, {n};",
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

/// `cvt.f32.f16` of both halves of `x`: `(low, high)`, exact.
#[inline(always)]
pub fn unpack_f16x2(x: u32) -> (f32, f32) {
    let (lo, hi): (f32, f32);
    unsafe {
        asm!(
            "{{ .reg .b16 l, h; mov.b32 {{l, h}}, {x}; cvt.f32.f16 {lo}, l; cvt.f32.f16 {hi}, h; }}",
            lo = out(reg32) lo, hi = out(reg32) hi, x = in(reg32) x,
            options(pure, nomem, nostack)
        )
    };
    (lo, hi)
}

/// `st.shared.b32`.
///
/// # Safety
/// `addr` must be a 4-byte aligned shared address of the block.
#[inline(always)]
pub unsafe fn st_shared_u32(addr: u32, value: u32) {
    asm!("st.shared.b32 [{a}], {v};", a = in(reg32) addr, v = in(reg32) value, options(nostack));
}

/// `st.shared.v2.b32`.
///
/// # Safety
/// `addr` must be an 8-byte aligned shared address of the block.
#[inline(always)]
pub unsafe fn st_shared_v2(addr: u32, value: [u32; 2]) {
    asm!(
        "st.shared.v2.b32 [{a}], {{{v0}, {v1}}};",
        a = in(reg32) addr,
        v0 = in(reg32) value[0],
        v1 = in(reg32) value[1],
        options(nostack)
    );
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

/// `ld.shared.v2.b32`.
///
/// # Safety
/// `addr` must be an 8-byte aligned shared address of the block.
#[inline(always)]
pub unsafe fn ld_shared_v2(addr: u32) -> [u32; 2] {
    let (r0, r1): (u32, u32);
    asm!(
        "ld.shared.v2.b32 {{{0}, {1}}}, [{a}];",
        out(reg32) r0, out(reg32) r1,
        a = in(reg32) addr,
        options(nostack, readonly)
    );
    [r0, r1]
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

/// `red.global.add.f32`: adds `value` to the f32 at `ptr` atomically
/// (relaxed, GPU scope), returning nothing.
///
/// # Safety
/// `ptr` must point to a writable, 4-byte aligned f32 of global memory.
#[inline(always)]
pub unsafe fn red_global_add_f32(ptr: *mut f32, value: f32) {
    asm!("red.global.add.f32 [{p}], {v};", p = in(reg64) ptr, v = in(reg32) value, options(nostack));
}

/// `red.global.add.v4.f32` (sm_90): adds `values` to the four f32 at
/// `ptr` atomically (relaxed, GPU scope, each element on its own),
/// returning nothing: a warp's 32 lanes over 512 contiguous bytes are four
/// whole 128-byte lines.
///
/// # Safety
/// `ptr` must point to four writable f32 of global memory, 16-byte aligned.
#[inline(always)]
pub unsafe fn red_global_add_v4_f32(ptr: *mut f32, values: [f32; 4]) {
    asm!(
        "red.global.add.v4.f32 [{p}], {{{a}, {b}, {c}, {d}}};",
        p = in(reg64) ptr,
        a = in(reg32) values[0],
        b = in(reg32) values[1],
        c = in(reg32) values[2],
        d = in(reg32) values[3],
        options(nostack)
    );
}

/// `atom.global.add.u32`: adds `value` to the u32 at `ptr` atomically
/// (relaxed, GPU scope) and returns what it held before.
///
/// # Safety
/// `ptr` must point to a writable, 4-byte aligned u32 of global memory.
#[inline(always)]
pub unsafe fn atom_global_add_u32(ptr: *mut u32, value: u32) -> u32 {
    let old: u32;
    asm!("atom.global.add.u32 {o}, [{p}], {v};", o = out(reg32) old, p = in(reg64) ptr, v = in(reg32) value, options(nostack));
    old
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
/// ([`crate::common::layout::SmemTile::chunks_across`]) instead of holding one
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

// ---------------------------------------------------------------------------
// sm_90a: mbarriers, named barriers, the async proxy, setmaxnreg, TMA and
// wgmma, for the warp-specialized Hopper kernels (issue 29). Each is
// documented with its PTX ISA semantics; `arch::emu` models them.
// ---------------------------------------------------------------------------

pub use flash_attn_abi::sm90::TensorMap;

/// `mbarrier.init.shared::cta.b64 [addr], count`: a barrier object at
/// `addr` in phase 0 that completes a phase after `count` arrivals (and
/// once its transaction count is back at zero).
///
/// # Safety
/// `addr` is an 8-byte aligned shared address of the block that no thread
/// uses as anything else while the barrier lives.
#[inline(always)]
pub unsafe fn mbarrier_init(addr: u32, count: u32) {
    asm!("mbarrier.init.shared::cta.b64 [{a}], {c};", a = in(reg32) addr, c = in(reg32) count, options(nostack));
}

/// `fence.mbarrier_init.release.cluster`: makes this thread's
/// `mbarrier.init`s visible to the other threads and to the async proxy
/// (TMA's `complete_tx`) before they use the barriers.
#[inline(always)]
pub fn fence_mbarrier_init() {
    unsafe { asm!("fence.mbarrier_init.release.cluster;", options(nostack)) };
}

/// `mbarrier.arrive.release.cta.shared::cta.b64`: one arrival (release) on
/// the barrier at `addr`.
///
/// # Safety
/// `addr` holds an initialised mbarrier.
#[inline(always)]
pub unsafe fn mbarrier_arrive(addr: u32) {
    asm!("mbarrier.arrive.release.cta.shared::cta.b64 _, [{a}];", a = in(reg32) addr, options(nostack));
}

/// `mbarrier.arrive.expect_tx.release.cta.shared::cta.b64`: raises the
/// current phase's transaction count by `bytes` (expect-tx), then arrives:
/// the producer's announcement of the TMA bytes that will complete it.
///
/// # Safety
/// `addr` holds an initialised mbarrier.
#[inline(always)]
pub unsafe fn mbarrier_arrive_expect_tx(addr: u32, bytes: u32) {
    asm!(
        "mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [{a}], {b};",
        a = in(reg32) addr,
        b = in(reg32) bytes,
        options(nostack)
    );
}

/// `mbarrier.expect_tx.relaxed.cta.shared::cta.b64`: raises the current
/// phase's transaction count by `bytes` without arriving.
///
/// # Safety
/// `addr` holds an initialised mbarrier.
#[inline(always)]
pub unsafe fn mbarrier_expect_tx(addr: u32, bytes: u32) {
    asm!(
        "mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [{a}], {b};",
        a = in(reg32) addr,
        b = in(reg32) bytes,
        options(nostack)
    );
}

/// `mbarrier.complete_tx.relaxed.cta.shared::cta.b64`: lowers the current
/// phase's transaction count by `bytes`, as a TMA copy does when its bytes
/// land (the phase completes when arrivals and transactions are all in).
///
/// # Safety
/// `addr` holds an initialised mbarrier.
#[inline(always)]
pub unsafe fn mbarrier_complete_tx(addr: u32, bytes: u32) {
    asm!(
        "mbarrier.complete_tx.relaxed.cta.shared::cta.b64 [{a}], {b};",
        a = in(reg32) addr,
        b = in(reg32) bytes,
        options(nostack)
    );
}

/// `mbarrier.try_wait.parity.acquire.cta.shared::cta.b64`: whether the
/// phase of parity `parity` has completed, i.e. the barrier's current phase
/// has the other parity (so in phase 0, parity 1 counts as the completed
/// "previous" phase). Waits a while (a hardware time limit) before
/// answering false; on true, acquires what the arrivals released.
///
/// # Safety
/// `addr` holds an initialised mbarrier.
#[inline(always)]
pub unsafe fn mbarrier_try_wait_parity(addr: u32, parity: u32) -> bool {
    let done: u32;
    asm!(
        "{{ .reg .pred p; mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 p, [{a}], {ph}; selp.u32 {d}, 1, 0, p; }}",
        a = in(reg32) addr,
        ph = in(reg32) parity,
        d = out(reg32) done,
        options(nostack)
    );
    done != 0
}

/// Waits until the phase of parity `parity` of the barrier at `addr` has
/// completed: [`mbarrier_try_wait_parity`] until it answers true.
///
/// # Safety
/// `addr` holds an initialised mbarrier.
#[inline(always)]
pub unsafe fn mbarrier_wait_parity(addr: u32, parity: u32) {
    while !mbarrier_try_wait_parity(addr, parity) {}
}

extern "C" {
    #[link_name = "llvm.nvvm.barrier.cta.sync.aligned.count"]
    fn barrier_cta_sync_aligned_count(barrier: u32, threads: u32);
    #[link_name = "llvm.nvvm.barrier.cta.arrive.aligned.count"]
    fn barrier_cta_arrive_aligned_count(barrier: u32, threads: u32);
}

/// `barrier.sync.aligned id, threads` (`bar.sync id, threads`): waits on
/// named barrier `id` (1..16; 0 is [`sync_threads`]'s) until `threads`
/// threads (a multiple of 32, whole warps) have arrived at it; orders
/// their shared-memory accesses. The consumer warpgroups' ping-pong
/// schedule. An LLVM intrinsic, convergent, for the reason the block
/// barrier is one.
#[inline(always)]
pub fn named_barrier_sync(id: u32, threads: u32) {
    unsafe { barrier_cta_sync_aligned_count(id, threads) };
}

/// `barrier.arrive.aligned id, threads` (`bar.arrive id, threads`): arrives
/// at named barrier `id` of `threads` threads without waiting (the
/// signalling side of a producer/consumer pair on a named barrier).
#[inline(always)]
pub fn named_barrier_arrive(id: u32, threads: u32) {
    unsafe { barrier_cta_arrive_aligned_count(id, threads) };
}

/// `fence.proxy.async.shared::cta`: orders this thread's generic-proxy
/// shared-memory accesses (`st.shared`, `cp.async`) before later
/// async-proxy accesses of the same memory (wgmma's shared operands, a TMA
/// store's source). Without it the async proxy may see stale bytes.
#[inline(always)]
pub fn fence_proxy_async_shared() {
    unsafe { asm!("fence.proxy.async.shared::cta;", options(nostack)) };
}

/// `setmaxnreg.inc.sync.aligned.u32 N`: raises the registers per thread of
/// the executing warpgroup to `N` (24..=256, a multiple of 8), waiting
/// until the CTA's pool has them (the consumers take what the producer
/// gave back). All 128 threads of the warpgroup execute it.
#[inline(always)]
pub fn setmaxnreg_inc<const N: u32>() {
    unsafe { asm!("setmaxnreg.inc.sync.aligned.u32 {n};", n = const N, options(nostack)) };
}

/// `setmaxnreg.dec.sync.aligned.u32 N`: lowers the registers per thread of
/// the executing warpgroup to `N`, returning the rest to the CTA's pool.
#[inline(always)]
pub fn setmaxnreg_dec<const N: u32>() {
    unsafe { asm!("setmaxnreg.dec.sync.aligned.u32 {n};", n = const N, options(nostack)) };
}

macro_rules! tma_load {
    ($(#[$doc:meta])* $name:ident, $rank:literal, $($c:ident),*) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// `map` is the generic address of a valid tensor map in global (or
        /// constant) memory, 64-byte aligned; the box fits at `dst` (128-byte
        /// aligned; aligned to the swizzle's repeat, 1024 bytes for 128B);
        /// `bar` holds an initialised mbarrier of this block.
        #[inline(always)]
        pub unsafe fn $name(dst: u32, map: *const TensorMap, coords: [i32; $rank], bar: u32) {
            let [$($c),*] = coords;
            asm!(
                concat!(
                    "cp.async.bulk.tensor.", $rank, "d.shared::cluster.global.tile.mbarrier::complete_tx::bytes ",
                    "[{d}], [{m}, {{", tma_load!(@list $($c),*), "}}], [{b}];"
                ),
                d = in(reg32) dst,
                m = in(reg64) map,
                $($c = in(reg32) $c,)*
                b = in(reg32) bar,
                options(nostack)
            );
        }
    };
    (@list $first:ident $(, $rest:ident)*) => {
        concat!("{", stringify!($first), "}" $(, ", {", stringify!($rest), "}")*)
    };
}

tma_load!(
    /// `cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes`:
    /// copies the box of the tensor map at `map` whose first element is at
    /// `coords` (innermost first) into shared memory at `dst`, as the map's
    /// swizzle lays it out, out-of-bounds elements zero-filled; when its
    /// bytes have landed it performs complete-tx of the box's bytes on the
    /// mbarrier at `bar`. Issued by one thread.
    tma_load_2d,
    2,
    c0,
    c1
);
tma_load!(
    /// As [`tma_load_2d`], for a 3-dimensional tensor map.
    tma_load_3d,
    3,
    c0,
    c1,
    c2
);
tma_load!(
    /// As [`tma_load_2d`], for a 4-dimensional tensor map.
    tma_load_4d,
    4,
    c0,
    c1,
    c2,
    c3
);
tma_load!(
    /// As [`tma_load_2d`], for a 5-dimensional tensor map.
    tma_load_5d,
    5,
    c0,
    c1,
    c2,
    c3,
    c4
);

/// `wgmma.fence.sync.aligned`: orders this warpgroup's earlier register
/// accesses (accumulators, register A operands) before the
/// `wgmma.mma_async`s that follow. Required before the first wgmma and
/// between a register access and a wgmma that uses those registers.
#[inline(always)]
pub fn wgmma_fence() {
    unsafe { asm!("wgmma.fence.sync.aligned;", options(nostack)) };
}

/// `wgmma.commit_group.sync.aligned`: closes the group of this
/// warpgroup's `wgmma.mma_async`s issued since the last commit.
#[inline(always)]
pub fn wgmma_commit_group() {
    unsafe { asm!("wgmma.commit_group.sync.aligned;", options(nostack)) };
}

/// `wgmma.wait_group.sync.aligned N`: waits until at most `N` of this
/// warpgroup's committed wgmma groups are pending; the accumulators of
/// the others may then be read.
#[inline(always)]
pub fn wgmma_wait_group<const N: u32>() {
    unsafe { asm!("wgmma.wait_group.sync.aligned {n};", n = const N, options(nostack)) };
}

/// The f32 accumulator fragment of one thread for `wgmma.m64nNk16` with
/// `N = 2 * R`: element `i` is D's row `16 * warp + lane / 4 + 8 * (i / 2
/// % 2)`, column `8 * (i / 4) + 2 * (lane % 4) + i % 2` (the ISA's wgmma D
/// fragment figure; warp and lane within the warpgroup). Its registers are
/// reached through [`Self::get`] and [`Self::get_mut`], which the emulator
/// checks against the wgmma groups in flight; on the GPU they are plain
/// registers.
#[derive(Clone, Copy)]
#[repr(transparent)]
pub struct WgmmaAccumulator<const R: usize>([f32; R]);

impl<const R: usize> WgmmaAccumulator<R> {
    #[inline(always)]
    pub fn new(values: [f32; R]) -> Self {
        Self(values)
    }

    /// The registers, once the wgmma that wrote them has been waited for.
    #[inline(always)]
    pub fn get(&self) -> &[f32; R] {
        &self.0
    }

    /// The registers, for writing (a register access: a `wgmma_fence` must
    /// follow before the next wgmma on them).
    #[inline(always)]
    pub fn get_mut(&mut self) -> &mut [f32; R] {
        &mut self.0
    }
}

macro_rules! fence_operand_n {
    ($regs:ident, [$($i:literal)*]) => {
        asm!(
            concat!("// wgmma operand {0}", $(" {", $i, "}",)*),
            inout(reg32) $regs[0], $(inout(reg32) $regs[$i],)*
            options(nostack, nomem, preserves_flags)
        )
    };
}

/// Pins the registers of `acc` at this point of the program (an empty
/// `asm` that reads and writes each, as CUTLASS's
/// `warpgroup_fence_operand`): LLVM treats the asynchronous `wgmma` and
/// `wgmma.wait_group` as unrelated to ordinary code, so without it a
/// register copy may land between a `wgmma` and its fence (ptxas then
/// serializes the `wgmma`s, C7513) or a read of the results may move
/// above the wait that covers them. Use after writing an accumulator and
/// before issuing into it, and after the wait before reading it.
#[inline(always)]
pub fn wgmma_fence_operand<const R: usize>(acc: &mut WgmmaAccumulator<R>) {
    let regs = &mut acc.0;
    // SAFETY: an empty instruction sequence; the arm R selects indexes
    // `regs` within its length R.
    unsafe {
        match R {
            16 => fence_operand_n!(regs, [1 2 3 4 5 6 7 8 9 10 11 12 13 14 15]),
            32 => {
                fence_operand_n!(regs, [1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31])
            }
            40 => {
                fence_operand_n!(regs, [1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39])
            }
            48 => {
                fence_operand_n!(regs, [1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47])
            }
            64 => {
                fence_operand_n!(regs, [1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63])
            }
            80 => {
                fence_operand_n!(regs, [1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63 64 65 66 67 68 69 70 71 72 73 74 75 76 77 78 79])
            }
            96 => {
                fence_operand_n!(regs, [1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63 64 65 66 67 68 69 70 71 72 73 74 75 76 77 78 79 80 81 82 83 84 85 86 87 88 89 90 91 92 93 94 95])
            }
            112 => {
                fence_operand_n!(regs, [1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63 64 65 66 67 68 69 70 71 72 73 74 75 76 77 78 79 80 81 82 83 84 85 86 87 88 89 90 91 92 93 94 95 96 97 98 99 100 101 102 103 104 105 106 107 108 109 110 111])
            }
            128 => {
                fence_operand_n!(regs, [1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63 64 65 66 67 68 69 70 71 72 73 74 75 76 77 78 79 80 81 82 83 84 85 86 87 88 89 90 91 92 93 94 95 96 97 98 99 100 101 102 103 104 105 106 107 108 109 110 111 112 113 114 115 116 117 118 119 120 121 122 123 124 125 126 127])
            }
            _ => trap(),
        }
    }
}

macro_rules! wgmma_n {
    ($acc:ident, $ss:literal, $n:literal, $ty:literal, [$($i:literal)*], $($operands:tt)*) => {
        asm!(
            concat!(
                "{{ .reg .pred p; setp.ne.u32 p, {scale_d}, 0; wgmma.mma_async.sync.aligned.m64n", $n,
                "k16.f32.", $ty, ".", $ty, " {{{0}", $(", {", $i, "}",)* "}}, ", $ss, " }}"
            ),
            inout(reg32) $acc[0], $(inout(reg32) $acc[$i],)*
            $($operands)*
        )
    };
}

macro_rules! wgmma {
    ($(#[$doc:meta])* $ss:ident, $rs:ident, $ty:literal) => {
        $(#[$doc])*
        ///
        /// SS: A and B from shared memory, given by matrix descriptors
        /// (`a_desc`, `b_desc`: [`flash_attn_abi::sm90::MatrixDescriptor`]);
        /// A is K-major when `TRANS_A` is 0 and MN-major (M contiguous) when
        /// 1, B K-major when `TRANS_B` is 0 and MN-major when 1.
        /// `D = A * B + D`, or `D = A * B` when `scale_d` is false. `R` is
        /// `N / 2`: 16, 32, 40, 48, 64, 80, 96, 112 or 128 (N = 32, 64, 80,
        /// 96, 128, 160, 192, 224, 256).
        #[inline(always)]
        pub fn $ss<const R: usize, const TRANS_A: u32, const TRANS_B: u32>(
            acc: &mut WgmmaAccumulator<R>,
            a_desc: u64,
            b_desc: u64,
            scale_d: bool,
        ) {
            let (regs, scale_d) = (&mut acc.0, scale_d as u32);
            // SAFETY: the instruction only reads and writes registers. The
            // arm R selects indexes `acc` within its length R; the others
            // are never taken.
            unsafe {
                match R {
                    16 => {
                        wgmma_n!(regs, "{a}, {b}, p, 1, 1, {ta}, {tb};", "32", $ty, [1 2 3 4 5 6 7 8 9 10 11 12 13 14 15],
                            a = in(reg64) a_desc, b = in(reg64) b_desc, scale_d = in(reg32) scale_d,
                            ta = const TRANS_A, tb = const TRANS_B, options(nostack));
                    }
                    32 => {
                        wgmma_n!(regs, "{a}, {b}, p, 1, 1, {ta}, {tb};", "64", $ty, [1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31],
                            a = in(reg64) a_desc, b = in(reg64) b_desc, scale_d = in(reg32) scale_d,
                            ta = const TRANS_A, tb = const TRANS_B, options(nostack));
                    }
                    40 => {
                        wgmma_n!(regs, "{a}, {b}, p, 1, 1, {ta}, {tb};", "80", $ty, [1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39],
                            a = in(reg64) a_desc, b = in(reg64) b_desc, scale_d = in(reg32) scale_d,
                            ta = const TRANS_A, tb = const TRANS_B, options(nostack));
                    }
                    48 => {
                        wgmma_n!(regs, "{a}, {b}, p, 1, 1, {ta}, {tb};", "96", $ty, [1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47],
                            a = in(reg64) a_desc, b = in(reg64) b_desc, scale_d = in(reg32) scale_d,
                            ta = const TRANS_A, tb = const TRANS_B, options(nostack));
                    }
                    64 => {
                        wgmma_n!(regs, "{a}, {b}, p, 1, 1, {ta}, {tb};", "128", $ty, [1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63],
                            a = in(reg64) a_desc, b = in(reg64) b_desc, scale_d = in(reg32) scale_d,
                            ta = const TRANS_A, tb = const TRANS_B, options(nostack));
                    }
                    80 => {
                        wgmma_n!(regs, "{a}, {b}, p, 1, 1, {ta}, {tb};", "160", $ty, [1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63 64 65 66 67 68 69 70 71 72 73 74 75 76 77 78 79],
                            a = in(reg64) a_desc, b = in(reg64) b_desc, scale_d = in(reg32) scale_d,
                            ta = const TRANS_A, tb = const TRANS_B, options(nostack));
                    }
                    96 => {
                        wgmma_n!(regs, "{a}, {b}, p, 1, 1, {ta}, {tb};", "192", $ty, [1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63 64 65 66 67 68 69 70 71 72 73 74 75 76 77 78 79 80 81 82 83 84 85 86 87 88 89 90 91 92 93 94 95],
                            a = in(reg64) a_desc, b = in(reg64) b_desc, scale_d = in(reg32) scale_d,
                            ta = const TRANS_A, tb = const TRANS_B, options(nostack));
                    }
                    112 => {
                        wgmma_n!(regs, "{a}, {b}, p, 1, 1, {ta}, {tb};", "224", $ty, [1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63 64 65 66 67 68 69 70 71 72 73 74 75 76 77 78 79 80 81 82 83 84 85 86 87 88 89 90 91 92 93 94 95 96 97 98 99 100 101 102 103 104 105 106 107 108 109 110 111],
                            a = in(reg64) a_desc, b = in(reg64) b_desc, scale_d = in(reg32) scale_d,
                            ta = const TRANS_A, tb = const TRANS_B, options(nostack));
                    }
                    128 => {
                        wgmma_n!(regs, "{a}, {b}, p, 1, 1, {ta}, {tb};", "256", $ty, [1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63 64 65 66 67 68 69 70 71 72 73 74 75 76 77 78 79 80 81 82 83 84 85 86 87 88 89 90 91 92 93 94 95 96 97 98 99 100 101 102 103 104 105 106 107 108 109 110 111 112 113 114 115 116 117 118 119 120 121 122 123 124 125 126 127],
                            a = in(reg64) a_desc, b = in(reg64) b_desc, scale_d = in(reg32) scale_d,
                            ta = const TRANS_A, tb = const TRANS_B, options(nostack));
                    }
                    _ => trap(),
                }
            }
        }

        /// As the SS form, with A from registers (RS): `a` is this thread's
        /// A fragment, the m16n8k16 A layout over the warp's 16 rows
        /// (`16 * warp` up) of the 64.
        #[inline(always)]
        pub fn $rs<const R: usize, const TRANS_B: u32>(
            acc: &mut WgmmaAccumulator<R>,
            a: &[u32; 4],
            b_desc: u64,
            scale_d: bool,
        ) {
            let (regs, scale_d) = (&mut acc.0, scale_d as u32);
            // SAFETY: as in the SS form.
            unsafe {
                match R {
                    16 => {
                        wgmma_n!(regs, "{{{a0}, {a1}, {a2}, {a3}}}, {b}, p, 1, 1, {tb};", "32", $ty, [1 2 3 4 5 6 7 8 9 10 11 12 13 14 15],
                            a0 = in(reg32) a[0], a1 = in(reg32) a[1], a2 = in(reg32) a[2], a3 = in(reg32) a[3],
                            b = in(reg64) b_desc, scale_d = in(reg32) scale_d, tb = const TRANS_B, options(nostack));
                    }
                    32 => {
                        wgmma_n!(regs, "{{{a0}, {a1}, {a2}, {a3}}}, {b}, p, 1, 1, {tb};", "64", $ty, [1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31],
                            a0 = in(reg32) a[0], a1 = in(reg32) a[1], a2 = in(reg32) a[2], a3 = in(reg32) a[3],
                            b = in(reg64) b_desc, scale_d = in(reg32) scale_d, tb = const TRANS_B, options(nostack));
                    }
                    40 => {
                        wgmma_n!(regs, "{{{a0}, {a1}, {a2}, {a3}}}, {b}, p, 1, 1, {tb};", "80", $ty, [1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39],
                            a0 = in(reg32) a[0], a1 = in(reg32) a[1], a2 = in(reg32) a[2], a3 = in(reg32) a[3],
                            b = in(reg64) b_desc, scale_d = in(reg32) scale_d, tb = const TRANS_B, options(nostack));
                    }
                    48 => {
                        wgmma_n!(regs, "{{{a0}, {a1}, {a2}, {a3}}}, {b}, p, 1, 1, {tb};", "96", $ty, [1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47],
                            a0 = in(reg32) a[0], a1 = in(reg32) a[1], a2 = in(reg32) a[2], a3 = in(reg32) a[3],
                            b = in(reg64) b_desc, scale_d = in(reg32) scale_d, tb = const TRANS_B, options(nostack));
                    }
                    64 => {
                        wgmma_n!(regs, "{{{a0}, {a1}, {a2}, {a3}}}, {b}, p, 1, 1, {tb};", "128", $ty, [1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63],
                            a0 = in(reg32) a[0], a1 = in(reg32) a[1], a2 = in(reg32) a[2], a3 = in(reg32) a[3],
                            b = in(reg64) b_desc, scale_d = in(reg32) scale_d, tb = const TRANS_B, options(nostack));
                    }
                    80 => {
                        wgmma_n!(regs, "{{{a0}, {a1}, {a2}, {a3}}}, {b}, p, 1, 1, {tb};", "160", $ty, [1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63 64 65 66 67 68 69 70 71 72 73 74 75 76 77 78 79],
                            a0 = in(reg32) a[0], a1 = in(reg32) a[1], a2 = in(reg32) a[2], a3 = in(reg32) a[3],
                            b = in(reg64) b_desc, scale_d = in(reg32) scale_d, tb = const TRANS_B, options(nostack));
                    }
                    96 => {
                        wgmma_n!(regs, "{{{a0}, {a1}, {a2}, {a3}}}, {b}, p, 1, 1, {tb};", "192", $ty, [1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63 64 65 66 67 68 69 70 71 72 73 74 75 76 77 78 79 80 81 82 83 84 85 86 87 88 89 90 91 92 93 94 95],
                            a0 = in(reg32) a[0], a1 = in(reg32) a[1], a2 = in(reg32) a[2], a3 = in(reg32) a[3],
                            b = in(reg64) b_desc, scale_d = in(reg32) scale_d, tb = const TRANS_B, options(nostack));
                    }
                    112 => {
                        wgmma_n!(regs, "{{{a0}, {a1}, {a2}, {a3}}}, {b}, p, 1, 1, {tb};", "224", $ty, [1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63 64 65 66 67 68 69 70 71 72 73 74 75 76 77 78 79 80 81 82 83 84 85 86 87 88 89 90 91 92 93 94 95 96 97 98 99 100 101 102 103 104 105 106 107 108 109 110 111],
                            a0 = in(reg32) a[0], a1 = in(reg32) a[1], a2 = in(reg32) a[2], a3 = in(reg32) a[3],
                            b = in(reg64) b_desc, scale_d = in(reg32) scale_d, tb = const TRANS_B, options(nostack));
                    }
                    128 => {
                        wgmma_n!(regs, "{{{a0}, {a1}, {a2}, {a3}}}, {b}, p, 1, 1, {tb};", "256", $ty, [1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63 64 65 66 67 68 69 70 71 72 73 74 75 76 77 78 79 80 81 82 83 84 85 86 87 88 89 90 91 92 93 94 95 96 97 98 99 100 101 102 103 104 105 106 107 108 109 110 111 112 113 114 115 116 117 118 119 120 121 122 123 124 125 126 127],
                            a0 = in(reg32) a[0], a1 = in(reg32) a[1], a2 = in(reg32) a[2], a3 = in(reg32) a[3],
                            b = in(reg64) b_desc, scale_d = in(reg32) scale_d, tb = const TRANS_B, options(nostack));
                    }
                    _ => trap(),
                }
            }
        }
    };
}

wgmma!(
    /// `wgmma.mma_async.sync.aligned.m64nNk16.f32.f16.f16`: the warpgroup's
    /// 64xN f32 accumulator plus a 64x16 A times a 16xN B, asynchronously:
    /// issue behind a [`wgmma_fence`], close with [`wgmma_commit_group`],
    /// and read `acc` only after a [`wgmma_wait_group`] that covers it.
    wgmma_ss_f16,
    wgmma_rs_f16,
    "f16"
);
wgmma!(
    /// `wgmma.mma_async.sync.aligned.m64nNk16.f32.bf16.bf16`: as
    /// [`wgmma_ss_f16`], for bf16 operands.
    wgmma_ss_bf16,
    wgmma_rs_bf16,
    "bf16"
);

//! The emulator's reports on kernels that break the rules of the sm_90a
//! primitives: each test asserts the fault, and what the report names.

use flash_attn_abi::sm90::{DescriptorSwizzle, MatrixDescriptor, TensorMap, TmaSwizzle};
use flash_attn_kernels::arch::{self, WgmmaAccumulator};
use flash_attn_kernels::emu::{Error, FaultKind, GlobalRegion, LaunchConfig};

use super::sm90::{aligned, base, block, params_2d, run};

fn expect_fault<T>(result: Result<T, Error>, kind: FaultKind, needles: &[&str]) -> Error {
    let Err(error) = result else { panic!("expected a {kind:?} fault, the launch succeeded") };
    assert_eq!(error.kind, kind, "{error}");
    for needle in needles {
        assert!(error.to_string().contains(needle), "{needle:?} missing from: {error}");
    }
    error
}

#[test]
fn threads_waiting_on_an_mbarrier_that_never_completes_are_a_deadlock_naming_it() {
    // Count 2, one arrival: phase 0 never completes.
    let result = run(block(64, 64), &[], |tid| {
        let bar = arch::dynamic_smem_base() + 16;
        unsafe {
            if tid == 0 {
                arch::mbarrier_init(bar, 2);
            }
            arch::sync_threads();
            if tid == 5 {
                arch::mbarrier_arrive(bar);
            }
            arch::mbarrier_wait_parity(bar, 0);
        }
    });
    expect_fault(
        result,
        FaultKind::Deadlock,
        &["mbarrier.try_wait.parity", "the mbarrier at shared 0x410", "1 of 2 arrivals pending", "parity 0"],
    );
}

#[test]
fn a_phase_waiting_for_transaction_bytes_that_never_come_is_a_deadlock_naming_them() {
    let result = run(block(32, 64), &[], |_| {
        let bar = arch::dynamic_smem_base();
        unsafe {
            arch::mbarrier_init(bar, 32);
            arch::sync_threads();
            arch::mbarrier_arrive_expect_tx(bar, 256);
            arch::mbarrier_wait_parity(bar, 0);
        }
    });
    // 32 arrivals, each expecting 256 bytes: 8192 outstanding.
    expect_fault(result, FaultKind::Deadlock, &["0 of 32 arrivals pending and transaction count 8192"]);
}

#[test]
fn mbarrier_misuse_is_an_invalid_operand() {
    let uninitialised = run(block(32, 64), &[], |_| unsafe { arch::mbarrier_arrive(arch::dynamic_smem_base()) });
    expect_fault(uninitialised, FaultKind::InvalidOperand, &["holds no initialised mbarrier"]);
    let extra_arrival = run(block(32, 64), &[], |tid| unsafe {
        let bar = arch::dynamic_smem_base();
        if tid == 0 {
            arch::mbarrier_init(bar, 1);
            arch::mbarrier_expect_tx(bar, 16);
            arch::mbarrier_arrive(bar);
            arch::mbarrier_arrive(bar);
        }
    });
    expect_fault(extra_arrival, FaultKind::InvalidOperand, &["had all its 1 arrivals already"]);
    let misaligned = run(block(32, 64), &[], |_| unsafe { arch::mbarrier_init(arch::dynamic_smem_base() + 4, 1) });
    expect_fault(misaligned, FaultKind::Misaligned, &["mbarrier.init"]);
}

/// A 64 x 64 f16 tensor in global memory and its map (128B swizzle).
fn tensor_and_map() -> (Vec<super::sm90::Aligned>, Vec<TensorMap>) {
    let storage = aligned(&vec![0x3c00; 64 * 64]);
    let map = params_2d(storage.as_ptr(), [64, 64], 128, [64, 64], TmaSwizzle::B128).encode().unwrap();
    (storage, vec![map])
}

#[test]
fn reading_a_tma_destination_before_its_phase_completes_is_reported() {
    let (storage, maps) = tensor_and_map();
    let regions = [GlobalRegion::read_only("tensor", &storage), GlobalRegion::read_only("map", &maps)];
    let map = maps.as_ptr();
    let result = run(block(32, 16 * 1024), &regions, |tid| unsafe {
        let (dst, bar) = (base(), base() + 8192);
        if tid == 0 {
            // No arrive.expect_tx: the arrival the phase needs never comes.
            arch::mbarrier_init(bar, 1);
            arch::tma_load_2d(dst, map, [0, 0], bar);
            arch::ld_shared_u32(dst + 64)
        } else {
            0
        }
    });
    expect_fault(
        result,
        FaultKind::TmaInFlight,
        &["ld.shared.b32", "TMA load (cp.async.bulk.tensor) of thread 0", "mbarrier phase its bytes complete"],
    );
}

#[test]
fn reading_tma_bytes_of_a_phase_the_thread_did_not_wait_for_is_reported() {
    let (storage, maps) = tensor_and_map();
    let regions = [GlobalRegion::read_only("tensor", &storage), GlobalRegion::read_only("map", &maps)];
    let map = maps.as_ptr();
    let result = run(block(64, 32 * 1024), &regions, |tid| unsafe {
        let (first, second) = (base(), base() + 8192);
        let (first_full, second_full) = (base() + 16384, base() + 16392);
        if tid == 0 {
            arch::mbarrier_init(first_full, 1);
            arch::mbarrier_init(second_full, 1);
        }
        arch::sync_threads();
        if tid == 0 {
            arch::mbarrier_arrive_expect_tx(first_full, 8192);
            arch::tma_load_2d(first, map, [0, 0], first_full);
            arch::mbarrier_arrive_expect_tx(second_full, 8192);
            arch::tma_load_2d(second, map, [0, 0], second_full);
            0
        } else if tid == 32 {
            // Waits for the first box only, then reads the second: landed
            // in the emulator, but nothing orders it for this thread (the
            // bug of a consumer that waited for Q and not for K).
            arch::mbarrier_wait_parity(first_full, 0);
            arch::ld_shared_u32(second + 64)
        } else {
            0
        }
    });
    expect_fault(
        result,
        FaultKind::UnobservedTma,
        &["ld.shared.b32", "thread 32 has not waited for that phase", "saw no phases"],
    );
}

#[test]
fn a_tensor_map_the_emulator_did_not_encode_is_refused() {
    let (storage, mut maps) = tensor_and_map();
    maps[0].0[0] = 0x1234_5678; // as a driver blob would look to us
    let regions = [GlobalRegion::read_only("tensor", &storage), GlobalRegion::read_only("map", &maps)];
    let map = maps.as_ptr();
    let result = run(block(32, 16 * 1024), &regions, |tid| unsafe {
        if tid == 0 {
            arch::mbarrier_init(base() + 8192, 1);
            arch::tma_load_2d(base(), map, [0, 0], base() + 8192);
        }
    });
    expect_fault(result, FaultKind::InvalidOperand, &["is not one TensorMapParams::encode wrote"]);
}

#[test]
fn a_tma_box_outside_the_registered_tensor_is_a_global_fault() {
    let (storage, maps) = tensor_and_map();
    // The tensor registered one row (128 bytes) short of what the map says.
    let short = &storage[..storage.len() - 8];
    let regions = [GlobalRegion::read_only("tensor", short), GlobalRegion::read_only("map", &maps)];
    let map = maps.as_ptr();
    let result = run(block(32, 16 * 1024), &regions, |tid| unsafe {
        if tid == 0 {
            arch::mbarrier_init(base() + 8192, 1);
            arch::tma_load_2d(base(), map, [0, 0], base() + 8192);
        }
    });
    expect_fault(result, FaultKind::GlobalOutOfBounds, &["cp.async.bulk.tensor", "'tensor'"]);
}

#[test]
fn named_barrier_rules_are_checked() {
    let odd_count = run(block(64, 0), &[], |_| arch::named_barrier_sync(1, 48));
    expect_fault(odd_count, FaultKind::InvalidOperand, &["bar.sync 1, 48", "multiple of 32"]);
    let mixed = run(block(128, 0), &[], |tid| {
        let threads = if tid < 64 { 128 } else { 96 };
        arch::named_barrier_sync(3, threads)
    });
    expect_fault(mixed, FaultKind::InvalidOperand, &["bar.sync 3, 96", "began with a count of 128"]);
    let id_zero = run(block(32, 0), &[], |_| arch::named_barrier_sync(0, 32));
    expect_fault(id_zero, FaultKind::InvalidOperand, &["named barriers are 1..15"]);
    let short = run(block(128, 0), &[], |tid| {
        if tid < 64 {
            arch::named_barrier_sync(2, 128)
        }
    });
    expect_fault(short, FaultKind::Deadlock, &["bar.sync 2, 128", "(64 arrived)"]);
}

#[test]
fn setmaxnreg_outside_the_budget_is_reported() {
    // 256 threads at 248 registers: a pool of 63488, where 256 for one
    // warpgroup and 248 for the other do not fit, and nobody gives back.
    let greedy = run(block(256, 0), &[], |tid| {
        if tid < 128 {
            arch::setmaxnreg_inc::<256>();
        }
    });
    expect_fault(
        greedy,
        FaultKind::RegisterBudget,
        &["setmaxnreg.inc to 256 by warpgroup 0 can never be granted", "63488"],
    );
    let not_multiple = run(block(128, 0), &[], |_| arch::setmaxnreg_dec::<100>());
    expect_fault(not_multiple, FaultKind::RegisterBudget, &["multiple of 8 in 24..=256"]);
    let dec_up = run(block(384, 0), &[], |_| arch::setmaxnreg_dec::<200>());
    expect_fault(dec_up, FaultKind::RegisterBudget, &["above the warpgroup's current 168"]);
    let partial = run(block(96, 0), &[], |_| arch::setmaxnreg_dec::<24>());
    expect_fault(partial, FaultKind::PartialWarp, &["warpgroup 0 has only 96 threads"]);
    let too_many = LaunchConfig { registers_per_thread: 200, ..block(384, 0) };
    expect_fault(run(too_many, &[], |_| ()), FaultKind::InvalidLaunch, &["200 registers per thread for 384 threads"]);
}

/// A and B (all ones, f16) in shared memory at `base()` and `base() + 8192`,
/// written by every thread; `fence` says whether the threads then execute
/// `fence.proxy.async`.
fn ones_in_shared(tid: u32, fence: bool) -> (u64, u64) {
    for w in (tid..4096).step_by(128) {
        unsafe { arch::st_shared_u32(base() + 4 * w, 0x3c00_3c00) };
    }
    if fence {
        arch::fence_proxy_async_shared();
    }
    arch::sync_threads();
    let desc = |start: u32| {
        MatrixDescriptor {
            start,
            leading_byte_offset: 16,
            stride_byte_offset: 1024,
            base_offset: 0,
            swizzle: DescriptorSwizzle::B128,
        }
        .encode()
    };
    (desc(base()), desc(base() + 8192))
}

#[test]
fn reading_an_accumulator_before_the_wait_that_covers_it_is_reported() {
    let result = run(block(128, 17 * 1024), &[], |tid| {
        let (a, b) = ones_in_shared(tid, true);
        let mut acc = WgmmaAccumulator::<32>::new([0.0; 32]);
        arch::wgmma_fence();
        arch::wgmma_ss_f16::<32, 0, 0>(&mut acc, a, b, true);
        arch::wgmma_commit_group();
        acc.get()[0]
    });
    expect_fault(
        result,
        FaultKind::WgmmaInFlight,
        &["wgmma accumulator accessed at", "1 committed group(s) pending", "m64n64k16.f32.f16.f16"],
    );
    let uncommitted = run(block(128, 17 * 1024), &[], |tid| {
        let (a, b) = ones_in_shared(tid, true);
        let mut acc = WgmmaAccumulator::<32>::new([0.0; 32]);
        arch::wgmma_fence();
        arch::wgmma_ss_f16::<32, 0, 0>(&mut acc, a, b, true);
        arch::wgmma_wait_group::<0>();
        acc.get()[0]
    });
    expect_fault(uncommitted, FaultKind::WgmmaInFlight, &["not even committed"]);
}

#[test]
fn overwriting_a_wgmma_operand_before_the_wait_that_covers_it_is_reported() {
    let result = run(block(128, 17 * 1024), &[], |tid| {
        let (a, b) = ones_in_shared(tid, true);
        let mut acc = WgmmaAccumulator::<32>::new([0.0; 32]);
        arch::wgmma_fence();
        arch::wgmma_ss_f16::<32, 0, 0>(&mut acc, a, b, true);
        arch::wgmma_commit_group();
        if tid == 0 {
            // B's first row, which the wgmma may still be reading.
            unsafe { arch::st_shared_u32(base() + 8192, 0) };
        }
        arch::wgmma_wait_group::<0>();
    });
    expect_fault(
        result,
        FaultKind::WgmmaInFlight,
        &["st.shared.b32", "operand of the wgmma.mma_async of warpgroup 0", "no wgmma.wait_group"],
    );
    // After the wait, the same store is fine.
    let waited = run(block(128, 17 * 1024), &[], |tid| {
        let (a, b) = ones_in_shared(tid, true);
        let mut acc = WgmmaAccumulator::<32>::new([0.0; 32]);
        arch::wgmma_fence();
        arch::wgmma_ss_f16::<32, 0, 0>(&mut acc, a, b, true);
        arch::wgmma_commit_group();
        arch::wgmma_wait_group::<0>();
        if tid == 0 {
            unsafe { arch::st_shared_u32(base() + 8192, 0) };
        }
    });
    assert!(waited.is_ok(), "{:?}", waited.err());
}

#[test]
fn wgmma_without_a_fence_after_a_register_access_is_reported() {
    let no_fence = run(block(128, 17 * 1024), &[], |tid| {
        let (a, b) = ones_in_shared(tid, true);
        let mut acc = WgmmaAccumulator::<32>::new([0.0; 32]);
        arch::wgmma_ss_f16::<32, 0, 0>(&mut acc, a, b, true);
    });
    expect_fault(no_fence, FaultKind::MissingWgmmaFence, &["no wgmma.fence since"]);
    let access_after_fence = run(block(128, 17 * 1024), &[], |tid| {
        let (a, b) = ones_in_shared(tid, true);
        let mut acc = WgmmaAccumulator::<32>::new([0.0; 32]);
        arch::wgmma_fence();
        acc.get_mut()[3] = 1.0;
        arch::wgmma_ss_f16::<32, 0, 0>(&mut acc, a, b, true);
    });
    expect_fault(access_after_fence, FaultKind::MissingWgmmaFence, &["faults_sm90.rs"]);
}

#[test]
fn wgmma_reading_stores_no_proxy_fence_covered_is_reported() {
    let result = run(block(128, 17 * 1024), &[], |tid| {
        let (a, b) = ones_in_shared(tid, false);
        let mut acc = WgmmaAccumulator::<32>::new([0.0; 32]);
        arch::wgmma_fence();
        arch::wgmma_ss_f16::<32, 0, 0>(&mut acc, a, b, true);
    });
    expect_fault(result, FaultKind::MissingProxyFence, &["st.shared.b32", "no fence.proxy.async.shared::cta since"]);
}

#[test]
fn wgmma_operands_must_be_one_per_warpgroup() {
    let descriptors = run(block(128, 17 * 1024), &[], |tid| {
        let (a, b) = ones_in_shared(tid, true);
        let mut acc = WgmmaAccumulator::<32>::new([0.0; 32]);
        arch::wgmma_fence();
        // Thread 77 points its B 32 bytes on.
        let b = if tid == 77 { b + 2 } else { b };
        arch::wgmma_ss_f16::<32, 0, 0>(&mut acc, a, b, true);
    });
    expect_fault(descriptors, FaultKind::InvalidOperand, &["the B descriptor differs between threads 0 and 77"]);
    let partial = run(block(64, 17 * 1024), &[], |tid| {
        let mut acc = WgmmaAccumulator::<32>::new([0.0; 32]);
        arch::wgmma_fence();
        arch::wgmma_ss_f16::<32, 0, 0>(&mut acc, u64::from(tid), 0, true);
    });
    expect_fault(partial, FaultKind::PartialWarp, &["warpgroup 0 has only 64 threads"]);
}

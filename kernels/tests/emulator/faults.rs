//! The emulator's reports on kernels that break the rules: each names the
//! fault, the block and thread, the instruction and where it is.

use flash_attn_kernels::arch;
use flash_attn_kernels::emu::{launch, Error, FaultKind, GlobalRegion, LaunchConfig};
use flash_attn_kernels::entry::kernel;
use flash_attn_kernels::params::{ForwardParams, ForwardSizes, TensorArg};

use super::run_block;

fn expect_fault<T>(result: Result<T, Error>, kind: FaultKind, needles: &[&str]) -> Error {
    let Err(error) = result else { panic!("expected a {kind:?} fault, the launch succeeded") };
    assert_eq!(error.kind, kind, "{error}");
    for needle in needles {
        assert!(error.to_string().contains(needle), "{needle:?} missing from: {error}");
    }
    error
}

/// The number after `prefix` in `text`, in hex.
fn hex_after(text: &str, prefix: &str) -> usize {
    let rest = &text[text.find(prefix).unwrap_or_else(|| panic!("{prefix:?} missing from {text}")) + prefix.len()..];
    let digits: String = rest.chars().take_while(|c| c.is_ascii_hexdigit()).collect();
    usize::from_str_radix(&digits, 16).unwrap()
}

/// One row of a `[1, 70, 1, 64]` tensor, 16-byte aligned as `cp.async` needs.
#[derive(Clone, Copy)]
#[repr(C, align(16))]
struct Row([u16; 64]);

#[test]
fn attention_kernel_reading_past_a_short_buffer_is_reported_with_the_address() {
    // The emulator's own check, so the launch is made here by hand (the
    // host's pipeline drives the kernels in the tests crate): q, k, v and o
    // [1, 70, 1, 64], with K registered one row short.
    let kernel = kernel("flash_fwd_d64_f16_full").unwrap();
    let rows = 70;
    let [q, k, v] = [0x3800u16, 0x3400, 0xb800].map(|half| vec![Row([half; 64]); rows]);
    let mut o = vec![Row([0x7fff; 64]); rows];
    let mut lse = vec![0f32; rows];
    let strides = [(rows * 64) as i64, 64, 64];
    let arg = |t: &[Row]| TensorArg { ptr: t.as_ptr().cast::<u16>(), strides };
    let o_arg = TensorArg { ptr: o.as_mut_ptr().cast::<u16>(), strides };
    let sizes = ForwardSizes { batch: 1, seqlen_q: rows as u32, seqlen_k: rows as u32, heads_q: 1, heads_per_kv: 1 };
    let params = ForwardParams::new(arg(&q), arg(&k), arg(&v), o_arg, lse.as_mut_ptr(), sizes, 0.125);
    // Register K one row (128 bytes) short of what the kernel reads.
    let k_bytes = &k[..rows - 1];
    let regions = [
        GlobalRegion::read_only("q", &q),
        GlobalRegion::read_only("k", k_bytes),
        GlobalRegion::read_only("v", &v),
        GlobalRegion::writable("o", &mut o),
        GlobalRegion::writable("lse", &mut lse),
    ];
    let c = kernel.kernel.config;
    let config = LaunchConfig::new([(rows as u32).div_ceil(c.block_m), 1, 1], c.threads(), c.smem_bytes());
    let result = unsafe { launch(&config, &regions, || (kernel.run)(&params)) };
    let error = expect_fault(
        result,
        FaultKind::GlobalOutOfBounds,
        &["cp.async.cg.shared.global", "src/common/tile_copy.rs", "past the end of 'k'"],
    );
    let addr = hex_after(&error.message, "bytes at 0x");
    let k_end = k_bytes.as_ptr_range().end as usize;
    assert!((k_end..k_end + 128).contains(&addr), "{addr:#x} is not in the missing row after {k_end:#x}: {error}");
    assert!(error.block.is_some() && error.thread.is_some(), "{error}");
}

#[test]
fn reading_a_cp_async_destination_before_its_wait_group_is_reported() {
    #[repr(C, align(16))]
    struct Source([u8; 512]);
    let source = Source([7; 512]);
    let regions = [GlobalRegion::read_only("source", &source.0)];
    let copy_two_groups = |tid: u32| unsafe {
        let base = arch::dynamic_smem_base();
        arch::cp_async_16(base + 16 * tid, source.0.as_ptr().add(16 * tid as usize), 16);
        arch::cp_async_commit();
        arch::cp_async_16(base + 256 + 16 * tid, source.0.as_ptr().add(16 * tid as usize), 16);
        arch::cp_async_commit();
    };
    // wait_group 1 covers the first group only: reading it is fine, reading
    // the second is not.
    run_block(16, 512, &regions, |tid| unsafe {
        copy_two_groups(tid);
        arch::cp_async_wait::<1>();
        arch::ld_shared_v4(arch::dynamic_smem_base() + 16 * tid)
    })
    .unwrap();
    let result = run_block(16, 512, &regions, |tid| unsafe {
        copy_two_groups(tid);
        arch::cp_async_wait::<1>();
        arch::ld_shared_v4(arch::dynamic_smem_base() + 256 + 16 * tid)
    });
    expect_fault(
        result,
        FaultKind::CpAsyncInFlight,
        &["ld.shared.v4.b32", "faults.rs", "thread 0", "still in flight", "no cp.async.wait_group"],
    );
}

#[test]
fn reading_another_threads_cp_async_without_a_barrier_is_a_race() {
    #[repr(C, align(16))]
    struct Source([u8; 512]);
    let source = Source([7; 512]);
    let regions = [GlobalRegion::read_only("source", &source.0)];
    // Each thread waits for its own copy, but warp 1 reads warp 0's: that
    // needs a bar.sync between.
    let result = run_block(64, 1024, &regions, |tid| unsafe {
        arch::cp_async_16(arch::dynamic_smem_base() + 16 * tid, source.0.as_ptr().add(16 * (tid % 32) as usize), 16);
        arch::cp_async_commit();
        arch::cp_async_wait::<0>();
        if tid >= 32 {
            arch::ld_shared_v4(arch::dynamic_smem_base() + 16 * (tid - 32));
        }
    });
    expect_fault(result, FaultKind::SharedRace, &["ld.shared.v4.b32", "written by cp.async by thread", "no barrier"]);
}

#[test]
fn shared_store_then_load_by_another_warp_without_barrier_is_a_race() {
    // Warp 1 reads what warp 0 stored.
    let result = run_block(64, 256, &[], |tid| unsafe {
        arch::st_shared_u32(arch::dynamic_smem_base() + 4 * tid, tid);
        if tid >= 32 {
            arch::ld_shared_v4(arch::dynamic_smem_base() + 4 * (tid - 32) / 16 * 16);
        }
    });
    expect_fault(result, FaultKind::SharedRace, &["st.shared.b32 by thread"]);
}

#[test]
fn a_collective_reached_by_half_a_warp_is_reported() {
    let result = run_block(32, 0, &[], |lane| if lane < 16 { arch::shfl_xor_f32(1.0, 1) } else { 0.0 });
    expect_fault(result, FaultKind::PartialWarp, &["shfl.sync.bfly.b32", "faults.rs", "lanes 0-15 of warp 0"]);
}

#[test]
fn a_warp_split_between_a_collective_and_a_barrier_is_reported() {
    let result = run_block(64, 0, &[], |tid| {
        if tid < 16 {
            arch::shfl_xor_f32(1.0, 1);
        }
        arch::sync_threads();
    });
    expect_fault(
        result,
        FaultKind::PartialWarp,
        &["shfl.sync.bfly.b32", "reached by lanes 0-15 of warp 0 only", "threads 16-31 bar.sync"],
    );
}

#[test]
fn lanes_at_different_collectives_are_reported() {
    let result = run_block(32, 0, &[], |lane| {
        if lane < 8 {
            arch::shfl_xor_f32(1.0, 1);
        } else {
            arch::sync_warp();
        }
    });
    expect_fault(result, FaultKind::DivergentWarp, &["bar.warp.sync", "shfl.sync.bfly.b32", "lanes 0-7 of warp 0"]);
}

#[test]
fn a_barrier_that_some_threads_skip_is_reported() {
    let result = run_block(64, 0, &[], |tid| {
        if tid < 32 {
            arch::sync_threads();
        }
    });
    let error = expect_fault(result, FaultKind::Deadlock, &["exited while threads 0-31 bar.sync at", "faults.rs"]);
    assert_eq!(error.block, Some([0, 0, 0]), "{error}");
    assert!(error.thread.is_some_and(|t| t >= 32), "{error}");
}

#[test]
fn warps_meeting_at_different_barriers_are_reported() {
    // The shape of a warp merge: warps 1.. hand over their values, then
    // leave; warp 0 goes on. Written with one barrier per branch, the
    // warps meet "the" barrier at two instructions.
    let result = run_block(64, 0, &[], |tid| {
        if tid / 32 != 0 {
            arch::sync_threads();
            return;
        }
        arch::sync_threads();
    });
    let error = expect_fault(
        result,
        FaultKind::DivergentBlock,
        &["reached bar.sync at", "faults.rs", "bar.sync at", "one barrier instruction"],
    );
    assert_eq!(error.block, Some([0, 0, 0]), "{error}");
    assert!(error.thread.is_some(), "{error}");
    // Both source lines are named.
    assert_eq!(error.message.matches("faults.rs:").count(), 2, "{error}");
}

#[test]
fn shared_accesses_out_of_bounds_misaligned_or_uninitialised_are_reported() {
    let past_end =
        run_block(32, 128, &[], |tid| unsafe { arch::st_shared_u32(arch::dynamic_smem_base() + 96 + 4 * tid, 1) });
    expect_fault(past_end, FaultKind::SharedOutOfBounds, &["st.shared.b32", "thread 8", "128 bytes"]);
    let misaligned = run_block(1, 128, &[], |_| unsafe { arch::ld_shared_v4(arch::dynamic_smem_base() + 8) });
    expect_fault(misaligned, FaultKind::Misaligned, &["ld.shared.v4.b32", "16-byte aligned"]);
    let uninitialised = run_block(1, 128, &[], |_| unsafe { arch::ld_shared_v4(arch::dynamic_smem_base()) });
    expect_fault(uninitialised, FaultKind::UninitializedShared, &["has not been written"]);
}

#[test]
fn ldmatrix_rows_in_the_same_banks_are_reported() {
    // Rows 128 bytes apart all fall in banks 0-3.
    let result = run_block(32, 4096, &[], |lane| unsafe {
        let row = arch::dynamic_smem_base() + 128 * lane;
        for word in 0..4 {
            arch::st_shared_u32(row + 4 * word, 0);
        }
        arch::sync_warp();
        arch::ldmatrix_x4(row)
    });
    expect_fault(result, FaultKind::BankConflict, &["ldmatrix", "rows 0 and 1 of matrix 0", "banks 0..3"]);
}

#[test]
fn global_stores_outside_or_into_read_only_memory_are_reported() {
    let mut out = [0f32; 32];
    let input = [0f32; 32];
    let (out_ptr, input_ptr) = (out.as_mut_ptr(), input.as_ptr() as *mut f32);
    // Only the first 16 values of `out` are registered.
    let regions = [GlobalRegion::writable("out", &mut out[..16]), GlobalRegion::read_only("input", &input)];
    let past_end = run_block(17, 0, &regions, |tid| unsafe { arch::st_global_f32(out_ptr.add(tid as usize), 1.0) });
    expect_fault(past_end, FaultKind::GlobalOutOfBounds, &["st.global.f32", "thread 16", "past the end of 'out'"]);
    let read_only = run_block(1, 0, &regions, |_| unsafe { arch::st_global_f32(input_ptr, 1.0) });
    expect_fault(read_only, FaultKind::GlobalReadOnly, &["'input', which is read-only"]);
    let counter_ptr = input_ptr.cast::<u32>();
    let atomic = run_block(1, 0, &regions, |_| unsafe { arch::atom_global_add_u32(counter_ptr, 1) });
    expect_fault(atomic, FaultKind::GlobalReadOnly, &["atom.global.add.u32", "'input', which is read-only"]);
}

#[test]
fn red_global_add_v4_adds_each_element_and_needs_16_byte_alignment() {
    #[repr(C, align(16))]
    struct Aligned([f32; 8]);
    let mut out = Aligned([0.0; 8]);
    let out_ptr = out.0.as_mut_ptr();
    let regions = [GlobalRegion::writable("out", &mut out.0)];
    // 64 threads add (1, 2, 3, 4) to the first four values.
    let added = run_block(64, 0, &regions, |_| unsafe { arch::red_global_add_v4_f32(out_ptr, [1.0, 2.0, 3.0, 4.0]) });
    assert!(added.is_ok(), "{added:?}");
    let misaligned = run_block(1, 0, &regions, |_| unsafe { arch::red_global_add_v4_f32(out_ptr.add(2), [1.0; 4]) });
    expect_fault(misaligned, FaultKind::Misaligned, &["red.global.add.v4.f32", "16-byte aligned"]);
    assert_eq!(out.0, [64.0, 128.0, 192.0, 256.0, 0.0, 0.0, 0.0, 0.0]);
}

#[test]
fn panics_and_traps_in_the_kernel_are_reported() {
    let panicked = run_block(64, 0, &[], |tid| {
        if tid == 37 {
            panic!("boom");
        }
    });
    expect_fault(panicked, FaultKind::Panic, &["thread 37", "boom", "faults.rs"]);
    let trapped = run_block(64, 0, &[], |tid| {
        if tid == 5 {
            arch::trap();
        }
    });
    expect_fault(trapped, FaultKind::Trap, &["thread 5", "trap at"]);
}

#[test]
fn invalid_launches_are_refused() {
    let config = LaunchConfig::new([1, 1, 1], 2048, 0);
    expect_fault(unsafe { launch(&config, &[], || {}) }, FaultKind::InvalidLaunch, &["2048 threads"]);
    let config = LaunchConfig::new([1, 1, 1], 32, 300_000);
    expect_fault(unsafe { launch(&config, &[], || {}) }, FaultKind::InvalidLaunch, &["shared memory"]);
}

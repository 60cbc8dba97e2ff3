//! The kernels crate's host tests of the emulator itself: every device
//! primitive against a plain model of its PTX ISA definition, and the
//! emulator's fault reports. The attention kernels run on the emulator,
//! driven by the host crate's pipeline, in the tests crate
//! (`tests/tests/emulator_attention.rs`).

mod faults;
mod faults_sm90;
mod primitives;
mod sm90;

use std::sync::Mutex;

use flash_attn_kernels::arch;
use flash_attn_kernels::emu::{launch, Error, GlobalRegion, LaunchConfig};

/// Runs `kernel` (given `%tid.x`) on one block of `threads` threads with
/// `smem` bytes of dynamic shared memory, and collects what each thread
/// returns.
fn run_block<T: Copy + Default>(
    threads: u32,
    smem: u32,
    regions: &[GlobalRegion],
    kernel: impl Fn(u32) -> T,
) -> Result<Vec<T>, Error> {
    let out = Mutex::new(vec![T::default(); threads as usize]);
    let config = LaunchConfig::new([1, 1, 1], threads, smem);
    // SAFETY: the regions are the callers' live buffers.
    unsafe {
        launch(&config, regions, || {
            let tid = arch::thread_idx_x();
            let value = kernel(tid);
            out.lock().unwrap()[tid as usize] = value;
        })
    }?;
    Ok(out.into_inner().unwrap())
}

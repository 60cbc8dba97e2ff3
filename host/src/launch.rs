//! Running a plan on a CUDA stream: its scratch memory, the lengths it
//! uploads, and one `cuLaunchKernel` per launch, in order.

use std::ffi::c_void;

use flash_attn_abi::hopper::HopperScratch;
use flash_attn_abi::hopper_backward::HopperBackwardScratch;

use crate::driver::{check, driver, encode_tensor_map, CUfunction, CUstream};
use crate::error::Result;
use crate::module::KernelModule;
use crate::plan::{BackwardPlan, KernelArgs, Launch, OutputAddrs, Plan};
use crate::workspace::Scratch;

/// Launches `plan`'s kernels on `stream` with the outputs at `outputs`,
/// after reserving its scratch from `scratch` and uploading there what the
/// plan reads (the sm_80 kernels' cache lengths, the sm_90a kernel's tensor
/// maps and tile counter).
pub(crate) fn launch(
    module: &KernelModule,
    plan: &Plan,
    outputs: OutputAddrs,
    scratch: &mut Scratch,
    stream: CUstream,
) -> Result<()> {
    let bytes = plan.scratch_bytes();
    let base = if bytes > 0 { scratch.reserve(bytes)? } else { 0 };
    match plan {
        Plan::Sm80(plan) if !plan.upload.is_empty() => {
            upload_async(base + plan.scratch.seqused_k as u64, &plan.upload, stream)?
        }
        Plan::Sm80(_) => {}
        Plan::Sm90(plan) => {
            let [q, k, v] = plan.maps.each_ref().map(encode_tensor_map);
            upload_async(base, &[HopperScratch { tensor_maps: [q?, k?, v?], tile_counter: 0 }], stream)?
        }
    }
    run_launches(module, &plan.launches(outputs, base), stream)
}

/// Launches the backward `plan` on `stream`, after reserving its scratch
/// from `scratch` (and writing the sm_90a main kernel's tensor maps there).
pub(crate) fn launch_backward(
    module: &KernelModule,
    plan: &BackwardPlan,
    scratch: &mut Scratch,
    stream: CUstream,
) -> Result<()> {
    let base = scratch.reserve(plan.scratch_bytes())?;
    if let BackwardPlan::Sm90(plan) = plan {
        let [q, k, v, d_o] = plan.maps.each_ref().map(encode_tensor_map);
        let uploaded = HopperBackwardScratch { tensor_maps: [q?, k?, v?, d_o?] };
        upload_async(base + plan.tensor_maps as u64, &[uploaded], stream)?;
    }
    run_launches(module, &plan.launches(base), stream)
}

/// One `cuLaunchKernel` per launch, in order.
fn run_launches(module: &KernelModule, launches: &[Launch], stream: CUstream) -> Result<()> {
    for launch in launches {
        let mut args = launch.args;
        let args: *mut c_void = match &mut args {
            KernelArgs::Forward(a) => std::ptr::from_mut(a).cast(),
            KernelArgs::Backward(a) => std::ptr::from_mut(a).cast(),
            KernelArgs::Hopper(a) => std::ptr::from_mut(a).cast(),
            KernelArgs::HopperBackward(a) => std::ptr::from_mut(a).cast(),
            KernelArgs::Combine(a) => std::ptr::from_mut(a).cast(),
            KernelArgs::Append(a) => std::ptr::from_mut(a).cast(),
        };
        let function = module.function(launch.kernel);
        // SAFETY: the plan pairs each kernel with its argument block and
        // geometry, from the validated call.
        unsafe { launch_kernel(function, launch.grid, launch.threads, launch.smem_bytes, args, stream)? };
    }
    Ok(())
}

/// Copies `values` to device address `addr` on `stream`. From pageable host
/// memory the driver stages the data before returning, so `values` may be
/// dropped right after.
fn upload_async<T>(addr: u64, values: &[T], stream: CUstream) -> Result<()> {
    let status =
        unsafe { (driver()?.memcpy_htod_async)(addr, values.as_ptr().cast(), std::mem::size_of_val(values), stream) };
    check("cuMemcpyHtoDAsync", status)
}

/// Launches `function` with one argument block `args` on `stream`.
///
/// # Safety
/// `args` points to the argument block `function` takes, and the geometry is
/// the one its kernel was written for.
unsafe fn launch_kernel(
    function: CUfunction,
    grid: [u32; 3],
    threads: u32,
    smem_bytes: u32,
    args: *mut c_void,
    stream: CUstream,
) -> Result<()> {
    let mut params = [args];
    let status = (driver()?.launch_kernel)(
        function,
        grid[0],
        grid[1],
        grid[2],
        threads,
        1,
        1,
        smem_bytes,
        stream,
        params.as_mut_ptr(),
        std::ptr::null_mut(),
    );
    check("cuLaunchKernel", status)
}

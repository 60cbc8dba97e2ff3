//! The CUDA driver, loaded at run time.
//!
//! Every driver call of the crate goes through [`driver()`], which opens
//! `libcuda` the first time it is asked (`dlopen`), looks up the few entry
//! points the crate uses and calls `cuInit`. Nothing links against
//! `libcuda` at build time, so building needs no CUDA toolkit, and a
//! program starts on a machine without a driver: its first call returns
//! [`Error::DriverUnavailable`] instead of the loader refusing to start it.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::OnceLock;

use flash_attn_abi::sm90::{TensorMap, TensorMapParams};

use crate::error::{Error, Result};

pub(crate) type CUresult = c_uint;
pub(crate) type CUdevice = c_int;
pub(crate) type CUdeviceptr = u64;
pub(crate) type CUcontext = *mut c_void;
pub(crate) type CUmodule = *mut c_void;
pub(crate) type CUfunction = *mut c_void;
/// A driver stream handle (`CUstream`); null is the legacy default stream.
pub type CUstream = *mut c_void;

const CUDA_SUCCESS: CUresult = 0;

/// `CUdevice_attribute` values the crate reads.
pub(crate) const DEVICE_MULTIPROCESSOR_COUNT: c_int = 16;
pub(crate) const DEVICE_COMPUTE_CAPABILITY_MAJOR: c_int = 75;
pub(crate) const DEVICE_COMPUTE_CAPABILITY_MINOR: c_int = 76;
pub(crate) const DEVICE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: c_int = 97;
/// `CUfunction_attribute` values the crate reads or sets.
pub(crate) const FUNC_LOCAL_SIZE_BYTES: c_int = 3;
pub(crate) const FUNC_NUM_REGS: c_int = 4;
pub(crate) const FUNC_MAX_DYNAMIC_SHARED_SIZE_BYTES: c_int = 8;

/// Declares the table of entry points: one field per function, looked up
/// by its exported (versioned) symbol name.
/// `cuTensorMapEncodeTiled(map, dataType, rank, globalAddress, globalDim,
/// globalStrides, boxDim, elementStrides, interleave, swizzle,
/// l2Promotion, oobFill)`.
pub(crate) type TensorMapEncodeTiled = unsafe extern "C" fn(
    *mut TensorMap,
    c_uint,
    c_uint,
    *mut c_void,
    *const u64,
    *const u64,
    *const u32,
    *const u32,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
) -> CUresult;

macro_rules! driver_api {
    ($($field:ident = $symbol:literal: fn($($arg:ty),*);)*) => {
        /// The driver's entry points the crate calls.
        pub(crate) struct Driver {
            $(pub(crate) $field: unsafe extern "C" fn($($arg),*) -> CUresult,)*
            /// `cuTensorMapEncodeTiled` (drivers of CUDA 12.0 and later);
            /// without it the sm_90a kernels are not loaded.
            pub(crate) tensor_map_encode_tiled: Option<TensorMapEncodeTiled>,
            /// Keeps the library mapped for as long as the table lives (the
            /// whole process: the table is a `static`).
            _library: libloading::Library,
        }

        impl Driver {
            fn load(library: libloading::Library) -> std::result::Result<Self, String> {
                // SAFETY: each symbol is the driver API function of that
                // name, whose C signature the field's type spells.
                unsafe {
                    Ok(Self {
                        $($field: *library
                            .get::<unsafe extern "C" fn($($arg),*) -> CUresult>(concat!($symbol, "\0").as_bytes())
                            .map_err(|e| format!("{} not found: {e}", $symbol))?,)*
                        tensor_map_encode_tiled: library
                            .get::<TensorMapEncodeTiled>(b"cuTensorMapEncodeTiled\0")
                            .ok()
                            .map(|f| *f),
                        _library: library,
                    })
                }
            }
        }
    };
}

driver_api! {
    init = "cuInit": fn(c_uint);
    get_error_name = "cuGetErrorName": fn(CUresult, *mut *const c_char);
    ctx_get_current = "cuCtxGetCurrent": fn(*mut CUcontext);
    ctx_get_device = "cuCtxGetDevice": fn(*mut CUdevice);
    ctx_push_current = "cuCtxPushCurrent_v2": fn(CUcontext);
    ctx_pop_current = "cuCtxPopCurrent_v2": fn(*mut CUcontext);
    primary_ctx_retain = "cuDevicePrimaryCtxRetain": fn(*mut CUcontext, CUdevice);
    primary_ctx_release = "cuDevicePrimaryCtxRelease_v2": fn(CUdevice);
    device_get_attribute = "cuDeviceGetAttribute": fn(*mut c_int, c_int, CUdevice);
    stream_get_ctx = "cuStreamGetCtx": fn(CUstream, *mut CUcontext);
    module_load_data = "cuModuleLoadData": fn(*mut CUmodule, *const c_void);
    module_unload = "cuModuleUnload": fn(CUmodule);
    module_get_function = "cuModuleGetFunction": fn(*mut CUfunction, CUmodule, *const c_char);
    func_set_attribute = "cuFuncSetAttribute": fn(CUfunction, c_int, c_int);
    func_get_attribute = "cuFuncGetAttribute": fn(*mut c_int, c_int, CUfunction);
    occupancy_max_active_blocks = "cuOccupancyMaxActiveBlocksPerMultiprocessor": fn(*mut c_int, CUfunction, c_int, usize);
    launch_kernel = "cuLaunchKernel": fn(
        CUfunction, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CUstream, *mut *mut c_void, *mut *mut c_void
    );
    mem_alloc = "cuMemAlloc_v2": fn(*mut CUdeviceptr, usize);
    mem_free = "cuMemFree_v2": fn(CUdeviceptr);
    mem_alloc_async = "cuMemAllocAsync": fn(*mut CUdeviceptr, usize, CUstream);
    mem_free_async = "cuMemFreeAsync": fn(CUdeviceptr, CUstream);
    memcpy_htod = "cuMemcpyHtoD_v2": fn(CUdeviceptr, *const c_void, usize);
    memcpy_htod_async = "cuMemcpyHtoDAsync_v2": fn(CUdeviceptr, *const c_void, usize, CUstream);
}

/// The library names tried, in order.
#[cfg(windows)]
const LIBRARY_NAMES: &[&str] = &["nvcuda.dll"];
#[cfg(not(windows))]
const LIBRARY_NAMES: &[&str] = &["libcuda.so.1", "libcuda.so"];

/// The driver, loaded and initialized on first use; the same error on
/// every call if that failed.
pub(crate) fn driver() -> Result<&'static Driver> {
    static DRIVER: OnceLock<std::result::Result<Driver, String>> = OnceLock::new();
    DRIVER.get_or_init(open).as_ref().map_err(|why| Error::DriverUnavailable(why.clone()))
}

fn open() -> std::result::Result<Driver, String> {
    let mut tried = Vec::new();
    for name in LIBRARY_NAMES {
        // SAFETY: loading the NVIDIA driver library runs its initializers,
        // which have no preconditions.
        match unsafe { libloading::Library::new(name) } {
            Ok(library) => {
                let driver = Driver::load(library)?;
                // SAFETY: cuInit takes flags, which must be 0.
                let status = unsafe { (driver.init)(0) };
                if status != CUDA_SUCCESS {
                    return Err(format!("cuInit failed: {}", status_name(&driver, status)));
                }
                return Ok(driver);
            }
            Err(e) => tried.push(format!("{name}: {e}")),
        }
    }
    Err(format!("no NVIDIA driver library could be loaded ({})", tried.join("; ")))
}

/// The driver's name for `status` (`CUDA_ERROR_...`), or its number.
fn status_name(driver: &Driver, status: CUresult) -> String {
    let mut name: *const c_char = std::ptr::null();
    // SAFETY: cuGetErrorName writes a pointer to a static string, or fails.
    let found = unsafe { (driver.get_error_name)(status, &mut name) } == CUDA_SUCCESS && !name.is_null();
    if found {
        // SAFETY: a NUL-terminated static string of the driver's.
        unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned()
    } else {
        format!("CUDA status {status}")
    }
}

/// `Ok` if a driver call `call` returned success, else [`Error::DriverCall`]
/// with the status and its name.
pub(crate) fn check(call: &'static str, status: CUresult) -> Result<()> {
    if status == CUDA_SUCCESS {
        return Ok(());
    }
    let name = driver().map(|d| status_name(d, status)).unwrap_or_else(|_| format!("CUDA status {status}"));
    Err(Error::DriverCall { call, code: status, name })
}

/// The driver's tensor map of `params` (`cuTensorMapEncodeTiled`, no
/// interleave). The planner chooses maps that pass
/// [`TensorMapParams::validate`], the driver's rules.
pub fn encode_tensor_map(params: &TensorMapParams) -> Result<TensorMap> {
    let encode = driver()?
        .tensor_map_encode_tiled
        .ok_or_else(|| Error::DriverUnavailable("the driver has no cuTensorMapEncodeTiled".into()))?;
    let mut map = TensorMap([0; 16]);
    // SAFETY: every array holds at least `rank` values (the strides `rank -
    // 1`), the map 128 writable bytes, 64-byte aligned.
    let status = unsafe {
        encode(
            &mut map,
            params.data_type as c_uint,
            params.rank,
            params.global_address as *mut c_void,
            params.global_dims.as_ptr(),
            params.global_strides.as_ptr(),
            params.box_dims.as_ptr(),
            params.element_strides.as_ptr(),
            0,
            params.swizzle as c_uint,
            params.l2_promotion as c_uint,
            params.oob_fill as c_uint,
        )
    };
    check("cuTensorMapEncodeTiled", status)?;
    Ok(map)
}

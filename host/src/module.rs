//! The kernels' PTX module: embedded at build time, loaded into the current
//! context, and every kernel of the ABI's table looked up once, so that a
//! call neither formats names nor asks the driver for functions.

use std::ffi::{c_int, CString};
use std::sync::{Mutex, OnceLock};

use flash_attn_abi::backward::{BackwardKernel, BACKWARD_KERNELS};
use flash_attn_abi::hopper::HOPPER_KERNELS;
use flash_attn_abi::hopper_backward::HOPPER_BACKWARD_KERNELS;
use flash_attn_abi::kernels::{combine_kernel, AttentionKernel, Dtype, APPEND_KERNEL, ATTENTION_KERNELS};

use crate::context::ContextRef;
use crate::driver::{self, check, driver, CUfunction, CUmodule};
use crate::error::{Error, Result};
use crate::plan::Kernel;

/// The kernels' PTX (sm_80), built from `kernels/` by `cargo xtask build-ptx`.
pub const PTX: &str = include_str!("../kernels.ptx");

/// The sm_90a kernels' PTX ([`HOPPER_KERNELS`] and
/// [`HOPPER_BACKWARD_KERNELS`]), loaded beside [`PTX`] on
/// compute capability 9.0 only (`sm_90a` code runs on no other GPU).
pub const PTX_SM90A: &str = include_str!("../kernels-sm90a.ptx");

/// The backward kernels' PTX (sm_80, [`BACKWARD_KERNELS`]), loaded at the
/// first backward call.
pub const PTX_BACKWARD: &str = include_str!("../kernels-backward.ptx");

/// The backward module and its kernels: one per row of
/// [`BACKWARD_KERNELS`] (none where the row's shared memory is more than
/// the GPU gives a block), then the prepare and finish kernels of f16 and
/// bf16.
struct BackwardModule {
    module: CUmodule,
    main: Vec<Option<CUfunction>>,
    prepare: [CUfunction; 2],
    finish: [CUfunction; 2],
}

/// An attention kernel of the loaded module.
#[derive(Clone, Copy)]
struct LoadedKernel {
    function: CUfunction,
    /// CTAs per SM at the kernel's launch geometry.
    blocks_per_sm: usize,
}

/// One attention kernel as the driver compiled it for the current GPU
/// ([`FlashAttention::kernel_resources`](crate::FlashAttention::kernel_resources)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelResources {
    /// The PTX entry point.
    pub name: String,
    /// Registers per thread.
    pub registers: u32,
    /// Local memory per thread in bytes: spills and stack. Every attention
    /// kernel is written to need none.
    pub local_bytes: u32,
}

/// The module loaded into a context, with its kernels.
pub(crate) struct KernelModule {
    /// Owns the functions below; unloaded in `drop`, with `context` current.
    module: CUmodule,
    /// Keeps the context alive until the module is unloaded.
    context: ContextRef,
    sm_count: usize,
    /// The shared memory a block may opt in to on this GPU (bytes).
    smem_per_block: u32,
    /// One per row of [`ATTENTION_KERNELS`], in its order.
    attention: Vec<LoadedKernel>,
    /// The merge kernels of f16 and bf16.
    combine: [CUfunction; 2],
    append: CUfunction,
    /// The sm_90a module and its kernels (one per row of
    /// [`HOPPER_KERNELS`], then one per row of [`HOPPER_BACKWARD_KERNELS`]),
    /// on compute capability 9.0 unless the caller asked for the sm_80
    /// kernels only.
    hopper: Option<(CUmodule, Vec<CUfunction>)>,
    /// The backward module, loaded by the first backward call (a program
    /// that never calls it does not pay the driver's compile of its PTX);
    /// `backward_loading` makes concurrent first calls load it once.
    backward: OnceLock<BackwardModule>,
    backward_loading: Mutex<()>,
}

// SAFETY: the module and function handles are never changed after `load`,
// and the driver API may be called with them from any thread (each call
// makes the module's context current first); the module is unloaded once,
// in `drop`.
unsafe impl Send for KernelModule {}
unsafe impl Sync for KernelModule {}

impl KernelModule {
    /// Loads [`PTX`] into the current context, and [`PTX_SM90A`] on
    /// compute capability 9.0 when `sm90a` (and the driver encodes tensor
    /// maps). Fails with [`Error::UnsupportedDevice`] below compute
    /// capability 8.0.
    pub(crate) fn load(sm90a: bool) -> Result<Self> {
        let d = driver()?;
        let context = ContextRef::current()?;
        let attribute = |which| {
            let mut value: c_int = 0;
            check("cuDeviceGetAttribute", unsafe { (d.device_get_attribute)(&mut value, which, context.device()) })
                .map(|()| value)
        };
        let major = attribute(driver::DEVICE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = attribute(driver::DEVICE_COMPUTE_CAPABILITY_MINOR)?;
        if major < 8 {
            return Err(Error::UnsupportedDevice { major, minor });
        }
        let sm_count = attribute(driver::DEVICE_MULTIPROCESSOR_COUNT)?.max(1) as usize;
        let smem_per_block = attribute(driver::DEVICE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?.max(0) as u32;
        // The driver reads the PTX as a NUL-terminated string.
        let module = load_module(PTX)?;
        // From here on, `loaded` unloads the module if a lookup fails.
        let mut loaded = Self {
            module,
            context,
            sm_count,
            smem_per_block,
            attention: Vec::with_capacity(ATTENTION_KERNELS.len()),
            combine: [std::ptr::null_mut(); 2],
            append: std::ptr::null_mut(),
            hopper: None,
            backward: OnceLock::new(),
            backward_loading: Mutex::new(()),
        };
        for kernel in ATTENTION_KERNELS {
            let config = kernel.config;
            let function = loaded.get_function(kernel.name)?;
            let smem = config.smem_bytes();
            allow_dynamic_smem(function, smem)?;
            let mut blocks_per_sm: c_int = 0;
            check("cuOccupancyMaxActiveBlocksPerMultiprocessor", unsafe {
                (d.occupancy_max_active_blocks)(&mut blocks_per_sm, function, config.threads() as c_int, smem as usize)
            })?;
            loaded.attention.push(LoadedKernel { function, blocks_per_sm: blocks_per_sm.max(0) as usize });
        }
        loaded.combine =
            [loaded.get_function(combine_kernel(Dtype::F16))?, loaded.get_function(combine_kernel(Dtype::Bf16))?];
        loaded.append = loaded.get_function(APPEND_KERNEL)?;
        if sm90a && (major, minor) == (9, 0) && d.tensor_map_encode_tiled.is_some() {
            let module = load_module(PTX_SM90A)?;
            // Owned by `loaded` from here on, unloaded in its `drop`.
            loaded.hopper = Some((module, Vec::with_capacity(HOPPER_KERNELS.len() + HOPPER_BACKWARD_KERNELS.len())));
            let forward = HOPPER_KERNELS.iter().map(|k| (k.name, k.config.smem_bytes()));
            let backward = HOPPER_BACKWARD_KERNELS.iter().map(|k| (k.name, k.config.smem_bytes()));
            for (name, smem) in forward.chain(backward) {
                let function = get_function(module, name)?;
                allow_dynamic_smem(function, smem)?;
                if let Some((_, functions)) = &mut loaded.hopper {
                    functions.push(function);
                }
            }
        }
        Ok(loaded)
    }

    fn get_function(&self, name: &str) -> Result<CUfunction> {
        get_function(self.module, name)
    }

    /// Loads the backward module (its row kernels serve every backward
    /// plan) into the module's context if no call has yet, and checks that
    /// the sm_80 main kernel `main`, if the plan runs one, runs on this
    /// GPU: a main kernel whose shared memory is more than a block may have
    /// here (the 99 KB of sm_86/89 at the larger head dims) is
    /// [`Error::SharedMemoryTooSmall`], before anything is launched.
    pub(crate) fn load_backward(&self, main: Option<&BackwardKernel>) -> Result<()> {
        self.load_backward_module()?;
        match main {
            Some(kernel) if self.backward_main(kernel).is_none() => Err(Error::SharedMemoryTooSmall {
                kernel: kernel.name,
                needs: kernel.config.smem_bytes(),
                available: self.smem_per_block,
            }),
            _ => Ok(()),
        }
    }

    fn load_backward_module(&self) -> Result<()> {
        if self.backward.get().is_some() {
            return Ok(());
        }
        // A poisoned lock guards nothing broken: the module is set whole or not at all.
        let _loading = self.backward_loading.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if self.backward.get().is_some() {
            return Ok(());
        }
        let d = driver()?;
        let module = load_module(PTX_BACKWARD)?;
        let functions = || -> Result<BackwardModule> {
            let mut main = Vec::with_capacity(BACKWARD_KERNELS.len());
            for kernel in BACKWARD_KERNELS {
                let smem = kernel.config.smem_bytes();
                if smem > self.smem_per_block {
                    main.push(None);
                    continue;
                }
                let function = get_function(module, kernel.name)?;
                allow_dynamic_smem(function, smem)?;
                main.push(Some(function));
            }
            let named = |kernel: Kernel| get_function(module, kernel.name());
            let prepare = [named(Kernel::BackwardPrepare(Dtype::F16))?, named(Kernel::BackwardPrepare(Dtype::Bf16))?];
            let finish = [named(Kernel::BackwardFinish(Dtype::F16))?, named(Kernel::BackwardFinish(Dtype::Bf16))?];
            Ok(BackwardModule { module, main, prepare, finish })
        };
        match functions() {
            Ok(loaded) => {
                // Set under the lock, after the check above: nothing else set it.
                let _ = self.backward.set(loaded);
                Ok(())
            }
            Err(e) => {
                unsafe { (d.module_unload)(module) };
                Err(e)
            }
        }
    }

    /// Whether the sm_90a kernels are loaded (plans may choose them).
    pub(crate) fn has_sm90a(&self) -> bool {
        self.hopper.is_some()
    }

    /// The context the module lives in.
    pub(crate) fn context(&self) -> &ContextRef {
        &self.context
    }

    /// The GPU's number of streaming multiprocessors.
    pub(crate) fn sm_count(&self) -> usize {
        self.sm_count
    }

    fn loaded(&self, kernel: &AttentionKernel) -> LoadedKernel {
        // Every row of the table was loaded, in order.
        let index = ATTENTION_KERNELS.iter().position(|k| k == kernel).expect("a row of ATTENTION_KERNELS");
        self.attention[index]
    }

    /// How many CTAs of `kernel` the GPU runs at once.
    pub(crate) fn wave(&self, kernel: &AttentionKernel) -> usize {
        self.sm_count * self.loaded(kernel).blocks_per_sm.max(1)
    }

    /// The driver's function of `kernel`.
    pub(crate) fn function(&self, kernel: Kernel) -> CUfunction {
        match kernel {
            Kernel::Attention(kernel) => self.loaded(kernel).function,
            Kernel::Hopper(kernel) => {
                let index = HOPPER_KERNELS.iter().position(|k| k == kernel).expect("a row of HOPPER_KERNELS");
                // Plans name sm_90a kernels only when the module is loaded.
                self.hopper.as_ref().expect("the sm_90a module is loaded").1[index]
            }
            Kernel::HopperBackward(kernel) => {
                let index = HOPPER_BACKWARD_KERNELS.iter().position(|k| k == kernel).expect("a row of the table");
                // After the forward kernels; plans name them only when the module is loaded.
                self.hopper.as_ref().expect("the sm_90a module is loaded").1[HOPPER_KERNELS.len() + index]
            }
            Kernel::Combine(Dtype::F16) => self.combine[0],
            Kernel::Combine(Dtype::Bf16) => self.combine[1],
            Kernel::Append => self.append,
            // Plans reach a launch only after `load_backward` found it.
            Kernel::Backward(kernel) => self.backward_main(kernel).expect("the main backward kernel fits this GPU"),
            Kernel::BackwardPrepare(Dtype::F16) => self.backward().prepare[0],
            Kernel::BackwardPrepare(Dtype::Bf16) => self.backward().prepare[1],
            Kernel::BackwardFinish(Dtype::F16) => self.backward().finish[0],
            Kernel::BackwardFinish(Dtype::Bf16) => self.backward().finish[1],
        }
    }

    fn backward(&self) -> &BackwardModule {
        // Backward plans run after `load_backward`.
        self.backward.get().expect("the backward module is loaded")
    }

    /// The loaded main backward kernel of a row of the table, if it fits
    /// this GPU's shared memory.
    fn backward_main(&self, kernel: &BackwardKernel) -> Option<CUfunction> {
        let index = BACKWARD_KERNELS.iter().position(|k| k == kernel).expect("a row of BACKWARD_KERNELS");
        self.backward().main[index]
    }

    /// Every attention kernel as the driver compiled it (the main backward
    /// kernels too, once a backward call loaded them), sorted by name.
    pub(crate) fn resources(&self) -> Result<Vec<KernelResources>> {
        let attribute = |function: CUfunction, which| {
            let mut value: c_int = 0;
            // SAFETY: `function` belongs to the module `self` owns.
            let status = unsafe { (driver()?.func_get_attribute)(&mut value, which, function) };
            check("cuFuncGetAttribute", status).map(|()| value as u32)
        };
        let sm90a = match &self.hopper {
            Some((_, functions)) => {
                let backward = HOPPER_BACKWARD_KERNELS.iter().map(|k| k.name);
                HOPPER_KERNELS.iter().map(|k| k.name).chain(backward).zip(functions).collect()
            }
            None => Vec::new(),
        };
        let backward: Vec<(&str, &CUfunction)> = match self.backward.get() {
            Some(b) => BACKWARD_KERNELS
                .iter()
                .zip(&b.main)
                .filter_map(|(k, function)| function.as_ref().map(|f| (k.name, f)))
                .collect(),
            None => Vec::new(),
        };
        let mut kernels = ATTENTION_KERNELS
            .iter()
            .map(|k| k.name)
            .zip(self.attention.iter().map(|loaded| &loaded.function))
            .chain(sm90a)
            .chain(backward)
            .map(|(name, &function)| {
                Ok(KernelResources {
                    name: name.to_string(),
                    registers: attribute(function, driver::FUNC_NUM_REGS)?,
                    local_bytes: attribute(function, driver::FUNC_LOCAL_SIZE_BYTES)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        kernels.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(kernels)
    }
}

impl Drop for KernelModule {
    fn drop(&mut self) {
        // SAFETY: `module` is not used again; the functions looked up from
        // it are dropped with `self`. A failure (a broken context) cannot be
        // reported from a destructor.
        self.context.with_current(|| {
            if let Ok(d) = driver() {
                unsafe { (d.module_unload)(self.module) };
                if let Some((module, _)) = self.hopper {
                    unsafe { (d.module_unload)(module) };
                }
                if let Some(backward) = self.backward.get() {
                    unsafe { (d.module_unload)(backward.module) };
                }
            }
        });
    }
}

/// Lets `function` launch with `bytes` of dynamic shared memory (more than
/// the default 48 KiB).
fn allow_dynamic_smem(function: CUfunction, bytes: u32) -> Result<()> {
    let attribute = driver::FUNC_MAX_DYNAMIC_SHARED_SIZE_BYTES;
    check("cuFuncSetAttribute", unsafe { (driver()?.func_set_attribute)(function, attribute, bytes as c_int) })
}

/// Loads the PTX `ptx` into the current context.
fn load_module(ptx: &str) -> Result<CUmodule> {
    let d = driver()?;
    // The driver reads the PTX as a NUL-terminated string.
    let image = CString::new(ptx).expect("the PTX has no NUL byte");
    let mut module: CUmodule = std::ptr::null_mut();
    check("cuModuleLoadData", unsafe { (d.module_load_data)(&mut module, image.as_ptr().cast()) })?;
    Ok(module)
}

fn get_function(module: CUmodule, name: &str) -> Result<CUfunction> {
    let d = driver()?;
    let name = CString::new(name).expect("kernel names have no NUL byte");
    let mut function: CUfunction = std::ptr::null_mut();
    check("cuModuleGetFunction", unsafe { (d.module_get_function)(&mut function, module, name.as_ptr()) })?;
    Ok(function)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `host/kernels.ptx` older than the ABI's table fails this: `cargo
    /// xtask build-ptx` rebuilds it.
    #[test]
    fn embedded_ptx_exports_every_kernel_of_the_table_for_sm_80() {
        assert!(PTX.contains(".target sm_80"), "PTX must target sm_80");
        let names = ATTENTION_KERNELS
            .iter()
            .map(Kernel::Attention)
            .chain([Kernel::Combine(Dtype::F16), Kernel::Combine(Dtype::Bf16), Kernel::Append])
            .map(Kernel::name);
        let missing: Vec<&str> = names.filter(|name| !PTX.contains(&format!(".visible .entry {name}("))).collect();
        assert!(missing.is_empty(), "missing from the embedded PTX: {missing:?}");
        assert_eq!(PTX.matches(".visible .entry flash_fwd").count(), ATTENTION_KERNELS.len());
        // The attention kernels, two merges and the append: the test-only
        // kernels (probe, ceiling) live in the tests crate's own module.
        assert_eq!(PTX.matches(".visible .entry ").count(), ATTENTION_KERNELS.len() + 3);
        assert!(!PTX.contains("probe_primitives") && !PTX.contains("mma_ceiling"));
    }

    /// As above, for the backward module: every main kernel of the table
    /// and the row kernels of both element types, for sm_80.
    #[test]
    fn embedded_backward_ptx_exports_every_backward_kernel() {
        assert!(PTX_BACKWARD.contains(".target sm_80"), "PTX must target sm_80");
        let rows =
            [Dtype::F16, Dtype::Bf16].into_iter().flat_map(|d| [Kernel::BackwardPrepare(d), Kernel::BackwardFinish(d)]);
        let names: Vec<&str> = BACKWARD_KERNELS.iter().map(Kernel::Backward).chain(rows).map(Kernel::name).collect();
        for name in &names {
            assert!(PTX_BACKWARD.contains(&format!(".visible .entry {name}(")), "{name} missing");
        }
        assert_eq!(PTX_BACKWARD.matches(".visible .entry ").count(), names.len());
    }

    /// As above, for the sm_90a module: every row of its two tables (the
    /// forward and the main backward kernels), for sm_90a, with the launch
    /// bounds `setmaxnreg` needs.
    #[test]
    fn embedded_sm90a_ptx_exports_every_hopper_kernel() {
        assert!(PTX_SM90A.contains(".target sm_90a"), "PTX must target sm_90a");
        let forward = HOPPER_KERNELS.iter().map(|k| (k.name, format!(".maxntid {}, 1, 1\n{{", k.config.threads())));
        let backward = HOPPER_BACKWARD_KERNELS
            .iter()
            .map(|k| (k.name, format!(".maxntid {}, 1, 1\n.minnctapersm 1\n{{", k.config.threads())));
        for (name, bounds) in forward.chain(backward) {
            let entry = format!(".visible .entry {name}(");
            let at = PTX_SM90A.find(&entry).unwrap_or_else(|| panic!("{name} missing"));
            let body = PTX_SM90A[at..].find("\n{").expect("a kernel body") + at;
            assert!(PTX_SM90A[at..body + 2].ends_with(&bounds), "{name} has no {bounds}");
        }
        let kernels = HOPPER_KERNELS.len() + HOPPER_BACKWARD_KERNELS.len();
        assert_eq!(PTX_SM90A.matches(".visible .entry ").count(), kernels);
    }
}

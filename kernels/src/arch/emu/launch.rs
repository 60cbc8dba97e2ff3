//! Running a grid. Each GPU thread of a block is a coroutine (its own
//! stack); a scheduler on one OS thread resumes them in turn, each running
//! until it must wait for others (a barrier, a warp collective) or ends.
//! Blocks are independent, so the OS threads of the machine run different
//! blocks at once. The interleaving is deterministic, and so are the
//! results and the fault reported.

use std::any::Any;
use std::cell::RefCell;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Mutex, Once};
use std::thread;

use corosensei::stack::DefaultStack;
use corosensei::{Coroutine, CoroutineResult};

use super::context::Thread;
use super::error::{Error, Fault, FaultKind};
use super::global::{GlobalMemory, GlobalRegion};
use super::rendezvous::Rendezvous;
use super::smem::SharedMemory;

/// The launch parameters, as a GPU launch takes them (1-D blocks: the
/// kernels read only `%tid.x`).
#[derive(Clone, Copy, Debug)]
pub struct LaunchConfig {
    pub grid: [u32; 3],
    pub block_threads: u32,
    pub dynamic_smem_bytes: u32,
    /// Report `ldmatrix` shared-memory bank conflicts as faults: a
    /// performance property rather than a correctness one, which the
    /// attention kernels' swizzled tiles promise.
    pub check_bank_conflicts: bool,
    /// Registers per thread the launch allocates (what ptxas reports for
    /// the kernel, or its `maxnreg`): the CTA's register pool, which
    /// `setmaxnreg` moves between warpgroups, is this times the block's
    /// threads (whole warps), at most 64K.
    pub registers_per_thread: u32,
}

impl LaunchConfig {
    /// A launch that also checks bank conflicts, with the most registers
    /// per thread the block size allows (a multiple of 8, at most 248).
    pub fn new(grid: [u32; 3], block_threads: u32, dynamic_smem_bytes: u32) -> Self {
        let per_thread = (REGISTER_FILE / block_threads.div_ceil(32).max(1) / 32).min(255) / 8 * 8;
        Self { grid, block_threads, dynamic_smem_bytes, check_bank_conflicts: true, registers_per_thread: per_thread }
    }
}

/// Registers of an SM, the most one CTA may hold.
const REGISTER_FILE: u32 = 64 * 1024;

/// sm_90's limits, which a launch is checked against.
const MAX_BLOCK_THREADS: u32 = 1024;
const MAX_DYNAMIC_SMEM: u32 = 227 * 1024;
const MAX_GRID: [u32; 3] = [i32::MAX as u32, 65_535, 65_535];
/// Stack of each emulated thread (reserved, touched only as used).
const STACK_BYTES: usize = 1 << 20;

/// Runs `kernel` over the grid of `config`, each GPU thread calling it once
/// with its own `%tid`/`%ctaid`. The kernel may access only the global
/// memory of `regions`. The launch stops at the first fault; of the faults
/// of the blocks that ran, the one of the lowest block (x fastest) is
/// returned.
///
/// # Safety
/// `regions` must describe memory that stays valid (and, where writable,
/// unaliased) for the launch, and `kernel` must be safe to call from
/// several OS threads at once, as a GPU kernel is.
pub unsafe fn launch<F: Fn()>(config: &LaunchConfig, regions: &[GlobalRegion], kernel: F) -> Result<(), Error> {
    let invalid = |message: String| Err(Error { kind: FaultKind::InvalidLaunch, block: None, thread: None, message });
    if !(1..=MAX_BLOCK_THREADS).contains(&config.block_threads) {
        return invalid(format!("{} threads per block (1..={MAX_BLOCK_THREADS})", config.block_threads));
    }
    if config.dynamic_smem_bytes > MAX_DYNAMIC_SMEM {
        return invalid(format!(
            "{} bytes of dynamic shared memory (at most {MAX_DYNAMIC_SMEM})",
            config.dynamic_smem_bytes
        ));
    }
    let register_pool = u64::from(config.registers_per_thread) * u64::from(config.block_threads.div_ceil(32) * 32);
    if config.registers_per_thread > 255 || register_pool > u64::from(REGISTER_FILE) {
        return invalid(format!(
            "{} registers per thread for {} threads ({register_pool} registers; at most 255 per thread and \
             {REGISTER_FILE} per block)",
            config.registers_per_thread, config.block_threads
        ));
    }
    if config.grid.iter().zip(MAX_GRID).any(|(&n, max)| n == 0 || n > max) {
        return invalid(format!("grid {:?} (each dimension 1..={MAX_GRID:?})", config.grid));
    }
    record_panic_locations();
    let global = GlobalMemory::new(regions);
    let kernel = AssertSync(kernel);
    let [gx, gy, gz] = config.grid;
    let blocks = u64::from(gx) * u64::from(gy) * u64::from(gz);
    let next = AtomicU32::new(0);
    let stop = AtomicBool::new(false);
    let first_fault: Mutex<Option<(u64, Error)>> = Mutex::new(None);
    let workers = thread::available_parallelism().map_or(1, |n| n.get()).min(blocks.min(64) as usize);
    thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    let index = u64::from(next.fetch_add(1, Ordering::Relaxed));
                    if index >= blocks {
                        break;
                    }
                    let ctaid = [
                        (index % u64::from(gx)) as u32,
                        (index / u64::from(gx) % u64::from(gy)) as u32,
                        (index / (u64::from(gx) * u64::from(gy))) as u32,
                    ];
                    if let Err(error) = run_block(config, ctaid, &global, kernel.get()) {
                        stop.store(true, Ordering::Relaxed);
                        let mut first = first_fault.lock().unwrap_or_else(|e| e.into_inner());
                        if first.as_ref().is_none_or(|(i, _)| index < *i) {
                            *first = Some((index, error));
                        }
                    }
                }
            });
        }
    });
    match first_fault.into_inner().unwrap_or_else(|e| e.into_inner()) {
        Some((_, error)) => Err(error),
        None => Ok(()),
    }
}

/// The kernel closure, shared by the worker threads.
struct AssertSync<F>(F);
// SAFETY: `launch`'s contract.
unsafe impl<F> Sync for AssertSync<F> {}

impl<F> AssertSync<F> {
    fn get(&self) -> &F {
        &self.0
    }
}

/// The state of one running block, shared by its threads.
pub(crate) struct Block<'a> {
    pub ctaid: [u32; 3],
    pub nctaid: [u32; 3],
    pub global: &'a GlobalMemory,
    pub smem: SharedMemory,
    pub sync: Rendezvous,
    fault: RefCell<Option<Fault>>,
}

/// The unwinding payload of a thread stopped by a fault.
struct Unwound;

impl Block<'_> {
    /// Records `fault` and unwinds the calling thread out of the kernel; the
    /// scheduler then stops the block.
    pub fn fail(&self, fault: Fault) -> ! {
        self.fault.borrow_mut().get_or_insert(fault);
        panic::resume_unwind(Box::new(Unwound))
    }
}

fn run_block(config: &LaunchConfig, ctaid: [u32; 3], global: &GlobalMemory, kernel: &dyn Fn()) -> Result<(), Error> {
    let threads = config.block_threads;
    let block = Block {
        ctaid,
        nctaid: config.grid,
        global,
        smem: SharedMemory::new(config.dynamic_smem_bytes, threads.div_ceil(32), config.check_bank_conflicts),
        sync: Rendezvous::new(threads, config.registers_per_thread),
        fault: RefCell::new(None),
    };
    let error =
        |fault: Fault| Error { kind: fault.kind, block: Some(ctaid), thread: fault.thread, message: fault.message };
    let states: Vec<Thread<'_>> = (0..threads).map(|tid| Thread::new(tid, &block)).collect();
    let mut coroutines = Vec::with_capacity(threads as usize);
    for thread in &states {
        let stack = DefaultStack::new(STACK_BYTES).map_err(|e| {
            error(Fault::new(FaultKind::InvalidLaunch, None, format!("cannot allocate a thread stack: {e}")))
        })?;
        let body = move |yielder: &corosensei::Yielder<(), ()>, ()| {
            thread.started(yielder);
            kernel()
        };
        // SAFETY: the coroutines borrow `states`, `block` and `kernel`, and
        // are all dropped (unwound) at the end of this function, before them.
        coroutines.push(Some(unsafe { Coroutine::with_stack_unchecked(stack, body) }));
    }
    let result = schedule(&block, &states, &mut coroutines).map_err(error);
    drop(coroutines);
    result
}

/// Resumes the block's threads in turn until all have exited or one faults.
fn schedule(
    block: &Block<'_>,
    threads: &[Thread<'_>],
    coroutines: &mut [Option<Coroutine<(), (), ()>>],
) -> Result<(), Fault> {
    loop {
        let progress = block.sync.progress();
        let mut running = false;
        for (thread, slot) in threads.iter().zip(coroutines.iter_mut()) {
            let Some(coroutine) = slot else { continue };
            running = true;
            match thread.run(|| panic::catch_unwind(AssertUnwindSafe(|| coroutine.resume(())))) {
                Ok(CoroutineResult::Yield(())) => {}
                Ok(CoroutineResult::Return(())) => {
                    *slot = None;
                    // Copies still in flight land (nothing waits for them).
                    thread.copies.borrow_mut().commit();
                    thread.wait(0);
                    block.sync.exit(thread.tid)?;
                }
                Err(payload) => {
                    *slot = None;
                    return Err(match block.fault.take() {
                        Some(fault) if payload.is::<Unwound>() => fault,
                        _ => {
                            let at = PANIC_AT.take().unwrap_or_default();
                            let message = format!("the kernel panicked{at}: {}", panic_text(&*payload));
                            Fault::new(FaultKind::Panic, Some(thread.tid), message)
                        }
                    });
                }
            }
        }
        if !running {
            return Ok(());
        }
        if block.sync.progress() == progress {
            return Err(block.sync.stuck());
        }
    }
}

fn panic_text(payload: &(dyn Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}

thread_local! {
    /// Where kernel code last panicked on this OS thread: " at file:line:col".
    static PANIC_AT: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Chains a panic hook that notes where a panic happened, for the fault
/// message (the payload alone does not say).
fn record_panic_locations() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if let Some(at) = info.location() {
                PANIC_AT.set(Some(format!(" at {at}")));
            }
            previous(info)
        }));
    });
}

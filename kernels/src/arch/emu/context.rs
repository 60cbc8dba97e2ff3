//! Which GPU thread is running, and that thread's own state: how it
//! suspends (its coroutine), and its `cp.async` groups.

use std::cell::{Cell, RefCell};

use corosensei::Yielder;

use super::error::Fault;
use super::launch::Block;
use super::smem::AsyncCopies;
use super::wgmma::WgmmaGroups;

/// One emulated GPU thread, run as a coroutine by its block's scheduler.
pub(crate) struct Thread<'a> {
    pub tid: u32,
    pub block: &'a Block<'a>,
    /// The coroutine's way back to the scheduler, set when it starts.
    yielder: Cell<*const Yielder<(), ()>>,
    /// This thread's `cp.async` copies that have not landed.
    pub copies: RefCell<AsyncCopies>,
    /// This thread's view of its warpgroup's wgmma groups and fences.
    pub wgmma: RefCell<WgmmaGroups>,
}

thread_local! {
    /// The GPU thread whose coroutine the scheduler on this OS thread is running.
    static CURRENT: Cell<*const ()> = const { Cell::new(std::ptr::null()) };
}

impl<'a> Thread<'a> {
    pub fn new(tid: u32, block: &'a Block<'a>) -> Self {
        Self { tid, block, yielder: Cell::new(std::ptr::null()), copies: RefCell::default(), wgmma: RefCell::default() }
    }

    /// Runs `f` (a resumption of this thread's coroutine) as the current thread.
    pub fn run<R>(&self, f: impl FnOnce() -> R) -> R {
        struct Reset;
        impl Drop for Reset {
            fn drop(&mut self) {
                CURRENT.set(std::ptr::null());
            }
        }
        CURRENT.set(self as *const Self as *const ());
        let _reset = Reset;
        f()
    }

    /// Called first thing in the thread's coroutine.
    pub fn started(&self, yielder: &Yielder<(), ()>) {
        self.yielder.set(yielder);
    }

    /// Hands control back to the scheduler until the next round.
    pub fn suspend(&self) {
        // SAFETY: set by `started` on this coroutine's own stack, where the
        // yielder lives until the coroutine ends.
        unsafe { (*self.yielder.get()).suspend(()) }
    }

    /// Stops this thread if `result` is a fault, which the block reports.
    pub fn ok<T>(&self, result: Result<T, Fault>) -> T {
        result.unwrap_or_else(|fault| self.block.fail(fault))
    }

    /// `cp.async.wait_group pending`: lands every committed group of this
    /// thread but the newest `pending`.
    pub fn wait(&self, pending: usize) {
        let landing = self.copies.borrow_mut().take_all_but(pending);
        self.block.smem.land(self.tid, landing, None);
    }
}

/// Runs `f` with the GPU thread being emulated.
///
/// # Panics
/// Outside an emulated launch.
pub(crate) fn with<R>(f: impl FnOnce(&Thread<'_>) -> R) -> R {
    let current = CURRENT.get();
    assert!(!current.is_null(), "a device primitive was called outside an emulated launch (arch::emu::launch)");
    // SAFETY: set by `Thread::run` around the coroutine that is calling.
    f(unsafe { &*(current as *const Thread<'_>) })
}

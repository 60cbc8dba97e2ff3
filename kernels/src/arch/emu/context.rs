//! Which GPU thread is running, and that thread's own state: how it
//! suspends (its coroutine), and its `cp.async` copies not yet landed.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::panic::Location;

use corosensei::Yielder;

use super::error::Fault;
use super::launch::Block;
use super::smem::{Accessor, Request};

/// A `cp.async` of this thread whose bytes have not landed: the source was
/// read when it was issued.
pub(crate) struct PendingCopy {
    pub dst: u32,
    pub data: [u8; 16],
    pub site: &'static Location<'static>,
}

/// One emulated GPU thread, run as a coroutine by its block's scheduler.
pub(crate) struct Thread<'a> {
    pub tid: u32,
    pub block: &'a Block<'a>,
    /// The coroutine's way back to the scheduler, set when it starts.
    yielder: Cell<*const Yielder<(), ()>>,
    /// Copies since the last `cp.async.commit_group`.
    uncommitted: RefCell<Vec<PendingCopy>>,
    /// Committed groups, oldest first.
    committed: RefCell<VecDeque<Vec<PendingCopy>>>,
}

thread_local! {
    /// The GPU thread whose coroutine the scheduler on this OS thread is running.
    static CURRENT: Cell<*const ()> = const { Cell::new(std::ptr::null()) };
}

impl<'a> Thread<'a> {
    pub fn new(tid: u32, block: &'a Block<'a>) -> Self {
        Self {
            tid,
            block,
            yielder: Cell::new(std::ptr::null()),
            uncommitted: RefCell::default(),
            committed: RefCell::default(),
        }
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

    pub fn issue_copy(&self, copy: PendingCopy) {
        self.uncommitted.borrow_mut().push(copy);
    }

    /// `cp.async.commit_group`.
    pub fn commit(&self) {
        let group = std::mem::take(&mut *self.uncommitted.borrow_mut());
        self.committed.borrow_mut().push_back(group);
    }

    /// `cp.async.wait_group pending`: lands every committed group but the
    /// newest `pending`.
    pub fn wait(&self, pending: usize) {
        loop {
            let mut committed = self.committed.borrow_mut();
            if committed.len() <= pending {
                return;
            }
            let group = committed.pop_front().unwrap_or_default();
            drop(committed);
            self.land(group);
        }
    }

    /// At exit: the copies still in flight land (nothing waits for them).
    pub fn land_all(&self) {
        self.commit();
        self.wait(0);
    }

    fn land(&self, group: Vec<PendingCopy>) {
        for copy in group {
            let who = Accessor { thread: self.tid, collective: false };
            let req = Request { who, instruction: "cp.async", site: copy.site, addr: copy.dst, len: 16 };
            self.block.smem.land_copy(&req, &copy.data);
        }
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

//! What an emulated launch reports when the kernel does something a GPU
//! would not allow, or would allow silently.

use std::fmt;

/// The kind of a fault, for tests to match on; [`Error::message`] says
/// which instruction, where in the source, and which addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// The launch itself is invalid (block size, shared memory size, grid).
    InvalidLaunch,
    /// An operand the instruction does not accept (e.g. a `cp.async`
    /// source size above 16).
    InvalidOperand,
    /// A global access outside every registered allocation.
    GlobalOutOfBounds,
    /// A global store into an allocation registered read-only.
    GlobalReadOnly,
    /// An address not aligned as the instruction requires.
    Misaligned,
    /// A shared access outside the block's dynamic shared memory.
    SharedOutOfBounds,
    /// A shared read of bytes nothing has written since the launch.
    UninitializedShared,
    /// Shared memory read or overwritten while a `cp.async` into it is in
    /// flight: no `cp.async.wait_group` of the issuing thread covered it yet.
    CpAsyncInFlight,
    /// Shared memory read or overwritten while a TMA load
    /// (`cp.async.bulk.tensor`) into it is in flight: the mbarrier phase
    /// its bytes complete has not completed.
    TmaInFlight,
    /// A read of bytes a TMA load landed by a thread that has not waited
    /// on the mbarrier phase that landed them (no `try_wait.parity` of its
    /// own answered true since): on a GPU they may not have arrived yet for
    /// that thread.
    UnobservedTma,
    /// The async proxy (a wgmma shared operand) reads a word that a thread
    /// wrote through the generic proxy (`st.shared`, `cp.async`) without a
    /// `fence.proxy.async.shared::cta` after the write.
    MissingProxyFence,
    /// A wgmma accumulator read or written while a `wgmma.mma_async` that
    /// writes it is in flight: no `wgmma.wait_group` has covered its group.
    WgmmaInFlight,
    /// A `wgmma.mma_async` with no `wgmma.fence` between it and the
    /// thread's last access of its accumulator registers (or before the
    /// warpgroup's first wgmma).
    MissingWgmmaFence,
    /// `setmaxnreg` outside the PTX ISA's rules: a count not in 24..=256 or
    /// not a multiple of 8, an `.inc` below or a `.dec` above the current
    /// count, warpgroups asking for different counts, or an `.inc` that
    /// the CTA's register pool (the launch's allocation) can never grant.
    RegisterBudget,
    /// Two threads access the same shared word, at least one of them
    /// writing, with no barrier between them.
    SharedRace,
    /// An `ldmatrix` whose row addresses hit the same shared-memory banks
    /// (checked when [`LaunchConfig::check_bank_conflicts`](super::LaunchConfig) is set).
    BankConflict,
    /// A warp-collective instruction that not every lane of the warp reached.
    PartialWarp,
    /// Lanes of one warp at different warp-collective instructions.
    DivergentWarp,
    /// Threads of one block at different block barriers (`bar.sync`
    /// instructions): an aligned barrier must be one instruction for all.
    DivergentBlock,
    /// Every live thread waits and none can go on (e.g. a `bar.sync` that
    /// some threads never reach).
    Deadlock,
    /// The kernel executed `trap` (where its panic handler ends on the GPU).
    Trap,
    /// The kernel code panicked (the GPU build turns a panic into `trap`).
    Panic,
}

/// A fault of an emulated launch: the first one, with where it happened.
#[derive(Clone, Debug)]
pub struct Error {
    pub kind: FaultKind,
    /// Index (x, y, z) of the faulting block; `None` for an invalid launch.
    pub block: Option<[u32; 3]>,
    /// The faulting thread's `%tid.x`, when one thread is to blame.
    pub thread: Option<u32>,
    /// The instruction, its place in the kernel source, the addresses.
    pub message: String,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "emulated launch: {:?}", self.kind)?;
        if let Some([x, y, z]) = self.block {
            write!(f, " in block ({x}, {y}, {z})")?;
        }
        if let Some(t) = self.thread {
            write!(f, ", thread {t} (warp {}, lane {})", t / 32, t % 32)?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for Error {}

/// A fault as the part of the emulator that found it describes it; the
/// launcher adds the block.
#[derive(Debug)]
pub(crate) struct Fault {
    pub kind: FaultKind,
    pub thread: Option<u32>,
    pub message: String,
}

impl Fault {
    pub fn new(kind: FaultKind, thread: Option<u32>, message: String) -> Self {
        Self { kind, thread, message }
    }
}

//! Where the threads of a block wait for each other: `bar.sync`, and the
//! meeting point of each warp's collective instructions, where the lanes'
//! registers are exchanged. It also describes a block that cannot go on:
//! a collective that part of a warp never reaches, lanes of one warp at
//! different collectives, a barrier some threads never reach or meet at
//! different instructions.
//!
//! The sm_90a synchronisations live here too: mbarriers (phases, arrival
//! and transaction counts, the TMA copies a phase lands), named barriers
//! with thread counts, warpgroup-collective instructions (`wgmma`,
//! `setmaxnreg`) and the CTA's register pool.
//!
//! The block's threads are coroutines on one OS thread: a thread that must
//! wait suspends (the `suspend` argument) and checks again when the
//! scheduler resumes it. The scheduler declares a deadlock when a whole
//! round of resumptions made no [`Rendezvous::progress`].

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::panic::Location;
use std::rc::Rc;

use super::error::{Fault, FaultKind};
use super::float::HalfType;
use super::smem::PendingCopy;

type Site = &'static Location<'static>;

/// A warp-collective instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Collective {
    Ldmatrix { trans: bool },
    Mma(HalfType),
    ShflBfly,
    VoteAny,
    WarpSync,
}

impl Collective {
    pub fn ptx(self) -> &'static str {
        match self {
            Collective::Ldmatrix { trans: false } => "ldmatrix.sync.aligned.m8n8.x4.shared.b16",
            Collective::Ldmatrix { trans: true } => "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16",
            Collective::Mma(HalfType::F16) => "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
            Collective::Mma(HalfType::Bf16) => "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
            Collective::ShflBfly => "shfl.sync.bfly.b32",
            Collective::VoteAny => "vote.sync.any.pred",
            Collective::WarpSync => "bar.warp.sync",
        }
    }
}

/// One lane's operands of a collective: up to ten 32-bit registers.
pub(crate) type LaneIn = [u32; 10];
/// One lane's results.
pub(crate) type LaneOut = [u32; 4];

/// The collective a warp's lanes are meeting at.
struct Meeting {
    op: Collective,
    site: Site,
    /// Lanes arrived so far.
    arrived: u32,
    inputs: [LaneIn; 32],
}

struct Warp {
    meeting: Option<Meeting>,
    outputs: [LaneOut; 32],
    /// Meetings completed: a waiting lane's meeting is done when this moves.
    completed: u64,
}

/// What a waiting thread waits at, for reports.
#[derive(Clone, Copy)]
enum Wait {
    Barrier(Site),
    Collective(Collective, Site),
    /// `mbarrier.try_wait.parity` on the barrier at `addr`.
    Mbarrier {
        addr: u32,
        parity: u32,
        site: Site,
    },
    /// `bar.sync id, threads`.
    Named {
        id: u32,
        site: Site,
    },
    /// A warpgroup-collective instruction.
    Warpgroup(&'static str, Site),
    /// `setmaxnreg.inc` waiting for registers.
    Registers {
        count: u32,
        site: Site,
    },
}

/// An mbarrier object (PTX ISA, "Parallel Synchronization and
/// Communication Instructions: mbarrier"): its current phase, the arrivals
/// still expected in it, its transaction count, and the TMA copies whose
/// bytes complete it (they land when the phase completes).
struct Mbarrier {
    expected: u32,
    pending: u32,
    tx: i64,
    /// Phases completed; the current phase's parity is `phase % 2`.
    phase: u64,
    landing: Vec<(u32, PendingCopy)>,
}

/// The PTX ISA's range of an mbarrier's arrival count and of its
/// transaction count (either sign).
const MBARRIER_MAX_COUNT: i64 = (1 << 20) - 1;

/// One named barrier (`bar.sync id, threads`) in its current phase.
#[derive(Default)]
struct Named {
    /// The thread count of the phase (0: no arrival yet).
    threads: u32,
    /// Arrivals so far, per warp.
    arrived: BTreeMap<u32, u32>,
    completed: u64,
}

/// What one instruction does to an mbarrier: `expect_tx` bytes added to
/// the transaction count, `complete_tx` bytes taken off (with the TMA
/// `copies` whose bytes those are, which land with the phase), then an
/// arrival if `arrive`.
#[derive(Default)]
pub(crate) struct MbarrierUpdate {
    pub expect_tx: u32,
    pub complete_tx: u32,
    pub copies: Vec<(u32, PendingCopy)>,
    pub arrive: bool,
}

/// An arrival at a named barrier: `bar.sync id, threads` (`wait`) or
/// `bar.arrive id, threads`.
#[derive(Clone, Copy)]
pub(crate) struct NamedArrival {
    pub id: u32,
    pub threads: u32,
    pub wait: bool,
}

/// Named barriers 1..16 (0 is `bar.sync 0`, [`Rendezvous::barrier`]).
pub(crate) const NAMED_BARRIERS: u32 = 16;

/// The warpgroup-collective instruction a warpgroup's threads meet at.
struct WarpgroupMeeting {
    op: &'static str,
    site: Site,
    arrived: u32,
    inputs: Vec<LaneIn>,
}

#[derive(Default)]
struct Warpgroup {
    meeting: Option<WarpgroupMeeting>,
    output: Option<Rc<dyn Any>>,
    completed: u64,
    /// Registers per thread the warpgroup holds (`setmaxnreg`).
    registers: u32,
}

struct State {
    exited: Vec<bool>,
    waits: Vec<Option<Wait>>,
    barrier_arrived: u32,
    /// Where the threads waiting at the block barrier wait.
    barrier_site: Option<Site>,
    barriers_completed: u64,
    warps: Vec<Warp>,
    mbarriers: BTreeMap<u32, Mbarrier>,
    named: Vec<Named>,
    warpgroups: Vec<Warpgroup>,
    /// Per thread, the mbarrier waits (address, parity) that answered
    /// false since the thread last arrived anywhere: asking again is
    /// spinning, not progress.
    spins: Vec<Vec<(u32, u32)>>,
}

pub(crate) struct Rendezvous {
    threads: u32,
    /// The CTA's register pool: the launch's registers per thread times
    /// its threads (whole warps).
    register_pool: u32,
    state: RefCell<State>,
    progress: Cell<u64>,
}

const FULL_WARP: u32 = u32::MAX;

impl Rendezvous {
    pub fn new(threads: u32, registers_per_thread: u32) -> Self {
        let warps = threads.div_ceil(32);
        let mut exited = vec![false; (warps * 32) as usize];
        // Lanes past the block size never run: a collective in that warp
        // is reached by part of it only.
        exited[threads as usize..].fill(true);
        Self {
            threads,
            register_pool: registers_per_thread * warps * 32,
            state: RefCell::new(State {
                exited,
                waits: vec![None; threads as usize],
                barrier_arrived: 0,
                barrier_site: None,
                barriers_completed: 0,
                warps: (0..warps).map(|_| Warp { meeting: None, outputs: [[0; 4]; 32], completed: 0 }).collect(),
                mbarriers: BTreeMap::new(),
                spins: vec![Vec::new(); threads as usize],
                named: (0..NAMED_BARRIERS).map(|_| Named::default()).collect(),
                warpgroups: (0..warps.div_ceil(4))
                    .map(|_| Warpgroup { registers: registers_per_thread, ..Warpgroup::default() })
                    .collect(),
            }),
            progress: Cell::new(0),
        }
    }

    /// Counts arrivals, completions and exits: if a round of the scheduler
    /// leaves it unchanged, no thread can go on.
    pub fn progress(&self) -> u64 {
        self.progress.get()
    }

    /// Thread `tid` arrived somewhere or exited: progress, after which its
    /// `try_wait`s that answered false count as new again.
    fn advance(&self, tid: u32) {
        self.progress.set(self.progress.get() + 1);
        self.state.borrow_mut().spins[tid as usize].clear();
    }

    /// `bar.sync 0`: returns once every thread of the block has arrived,
    /// all at the same instruction (`site`): an aligned barrier that
    /// threads meet at two places, or that a thread exits without reaching,
    /// is a fault. The last to arrive runs `on_complete` before releasing
    /// the others.
    pub fn barrier(&self, tid: u32, site: Site, on_complete: impl FnOnce(), suspend: impl Fn()) -> Result<(), Fault> {
        self.advance(tid);
        let ticket = {
            let mut st = self.state.borrow_mut();
            if let Some(gone) = (0..self.threads).find(|&t| st.exited[t as usize]) {
                let message = format!(
                    "bar.sync at {site} reached by thread {tid} can never complete: thread {gone} exited without \
                     reaching it"
                );
                return Err(Fault::new(FaultKind::Deadlock, Some(tid), message));
            }
            if st.barrier_site.is_some_and(|s| s != site) {
                let waiting = (0..self.threads as usize).filter(|&t| st.waits[t].is_some());
                let message = format!(
                    "thread {tid} reached bar.sync at {site} while {}: every thread of the block must meet at \
                     one barrier instruction",
                    self.where_waiting(&st, waiting)
                );
                return Err(Fault::new(FaultKind::DivergentBlock, Some(tid), message));
            }
            st.barrier_arrived += 1;
            if st.barrier_arrived == self.threads {
                st.barrier_arrived = 0;
                st.barrier_site = None;
                st.barriers_completed += 1;
                st.waits.fill(None);
                on_complete();
                return Ok(());
            }
            st.barrier_site = Some(site);
            st.waits[tid as usize] = Some(Wait::Barrier(site));
            st.barriers_completed
        };
        while self.state.borrow().barriers_completed == ticket {
            suspend();
        }
        Ok(())
    }

    /// A warp-collective instruction: deposits this lane's `input`; the last
    /// lane of the warp to arrive runs `compute` on all 32 inputs, and every
    /// lane gets its output.
    pub fn collective(
        &self,
        tid: u32,
        op: Collective,
        site: Site,
        input: LaneIn,
        compute: impl FnOnce(&[LaneIn; 32]) -> Result<[LaneOut; 32], Fault>,
        suspend: impl Fn(),
    ) -> Result<LaneOut, Fault> {
        self.advance(tid);
        let (w, lane) = ((tid / 32) as usize, (tid % 32) as usize);
        let ticket = {
            let mut st = self.state.borrow_mut();
            let exited = lanes(&st.exited[w * 32..w * 32 + 32]);
            if exited != 0 {
                let message = format!(
                    "{} at {site} reached by lane {lane}, but {} of warp {w} exited before it: \
                     all 32 lanes must execute it",
                    op.ptx(),
                    describe_lanes(exited)
                );
                return Err(Fault::new(FaultKind::PartialWarp, Some(tid), message));
            }
            let meeting = st.warps[w].meeting.get_or_insert(Meeting { op, site, arrived: 0, inputs: [[0; 10]; 32] });
            if (meeting.op, meeting.site) != (op, site) {
                let message = format!(
                    "lane {lane} reached {} at {site} while {} of warp {w} wait at {} at {}",
                    op.ptx(),
                    describe_lanes(meeting.arrived),
                    meeting.op.ptx(),
                    meeting.site
                );
                return Err(Fault::new(FaultKind::DivergentWarp, Some(tid), message));
            }
            meeting.inputs[lane] = input;
            meeting.arrived |= 1 << lane;
            if meeting.arrived != FULL_WARP {
                st.waits[tid as usize] = Some(Wait::Collective(op, site));
                Some(st.warps[w].completed)
            } else {
                None
            }
        };
        let Some(ticket) = ticket else {
            // The last lane computes every lane's outputs.
            let inputs = self.state.borrow().warps[w].meeting.as_ref().map(|m| m.inputs).unwrap_or([[0; 10]; 32]);
            let outputs = compute(&inputs)?;
            let mut st = self.state.borrow_mut();
            let warp = &mut st.warps[w];
            warp.meeting = None;
            warp.outputs = outputs;
            warp.completed += 1;
            st.waits[w * 32..w * 32 + 32].fill(None);
            return Ok(outputs[lane]);
        };
        while self.state.borrow().warps[w].completed == ticket {
            suspend();
        }
        Ok(self.state.borrow().warps[w].outputs[lane])
    }

    /// `mbarrier.init`: the barrier at `addr` in phase 0, expecting `count`
    /// arrivals per phase, transaction count 0.
    pub fn mbarrier_init(&self, tid: u32, addr: u32, count: u32, site: Site) -> Result<(), Fault> {
        self.advance(tid);
        if count == 0 || i64::from(count) > MBARRIER_MAX_COUNT {
            let message = format!("mbarrier.init at {site}: count {count} outside 1..=2^20-1");
            return Err(Fault::new(FaultKind::InvalidOperand, Some(tid), message));
        }
        let mut st = self.state.borrow_mut();
        if st.mbarriers.get(&addr).is_some_and(|b| !b.landing.is_empty()) {
            let message = format!(
                "mbarrier.init at {site} re-initialises the mbarrier at shared {addr:#x} while TMA copies that \
                 complete it are in flight"
            );
            return Err(Fault::new(FaultKind::InvalidOperand, Some(tid), message));
        }
        st.mbarriers.insert(addr, Mbarrier { expected: count, pending: count, tx: 0, phase: 0, landing: Vec::new() });
        Ok(())
    }

    /// `update` of the mbarrier at `addr` by `instruction` at `site`. If it
    /// completes the phase, `land` receives the phase's copies and the
    /// barrier moves to the next phase.
    pub fn mbarrier_update(
        &self,
        tid: u32,
        addr: u32,
        (instruction, site): (&str, Site),
        update: MbarrierUpdate,
        land: impl FnOnce(Vec<(u32, PendingCopy)>, u64),
    ) -> Result<(), Fault> {
        let MbarrierUpdate { expect_tx, complete_tx, copies, arrive } = update;
        self.advance(tid);
        let landing = {
            let mut st = self.state.borrow_mut();
            let Some(b) = st.mbarriers.get_mut(&addr) else {
                let message =
                    format!("{instruction} at {site} on shared {addr:#x}, which holds no initialised mbarrier");
                return Err(Fault::new(FaultKind::InvalidOperand, Some(tid), message));
            };
            b.tx += i64::from(expect_tx) - i64::from(complete_tx);
            if b.tx.abs() > MBARRIER_MAX_COUNT {
                let message = format!(
                    "{instruction} at {site}: the transaction count of the mbarrier at shared {addr:#x} reaches {}, \
                     outside the PTX ISA's range of +-(2^20-1)",
                    b.tx
                );
                return Err(Fault::new(FaultKind::InvalidOperand, Some(tid), message));
            }
            b.landing.extend(copies);
            if arrive {
                if b.pending == 0 {
                    let message = format!(
                        "{instruction} at {site}: an arrival on the mbarrier at shared {addr:#x}, whose phase {} has \
                         had all its {} arrivals already (it waits for transaction count {})",
                        b.phase, b.expected, b.tx
                    );
                    return Err(Fault::new(FaultKind::InvalidOperand, Some(tid), message));
                }
                b.pending -= 1;
            }
            if b.pending == 0 && b.tx == 0 {
                b.phase += 1;
                b.pending = b.expected;
                (std::mem::take(&mut b.landing), b.phase)
            } else {
                return Ok(());
            }
        };
        land(landing.0, landing.1);
        Ok(())
    }

    /// The phases the mbarrier at `addr` has completed, if there is one.
    pub fn mbarrier_phases(&self, addr: u32) -> Option<u64> {
        self.state.borrow().mbarriers.get(&addr).map(|b| b.phase)
    }

    /// `mbarrier.try_wait.parity`: whether the phase of parity `parity` has
    /// completed (the current phase has the other parity). When it has
    /// not, the thread waits one round of the scheduler first, as the
    /// hardware waits a while. The first false answer counts as progress
    /// (the thread may go on to arrive somewhere); asking again without
    /// arriving anywhere in between is spinning, and a block whose threads
    /// all spin or wait is a deadlock naming the barrier.
    pub fn mbarrier_try_wait(
        &self,
        tid: u32,
        addr: u32,
        parity: u32,
        site: Site,
        suspend: impl Fn(),
    ) -> Result<bool, Fault> {
        let done = |st: &State| st.mbarriers.get(&addr).map(|b| b.phase % 2 != u64::from(parity & 1));
        let first = done(&self.state.borrow());
        match first {
            None => {
                let message = format!(
                    "mbarrier.try_wait.parity at {site} on shared {addr:#x}, which holds no initialised mbarrier"
                );
                Err(Fault::new(FaultKind::InvalidOperand, Some(tid), message))
            }
            Some(true) => Ok(true),
            Some(false) => {
                {
                    let mut st = self.state.borrow_mut();
                    st.waits[tid as usize] = Some(Wait::Mbarrier { addr, parity, site });
                    let key = (addr, parity & 1);
                    if !st.spins[tid as usize].contains(&key) {
                        st.spins[tid as usize].push(key);
                        self.progress.set(self.progress.get() + 1);
                    }
                }
                suspend();
                let mut st = self.state.borrow_mut();
                st.waits[tid as usize] = None;
                Ok(done(&st) == Some(true))
            }
        }
    }

    /// `bar.sync id, threads` (`wait`) or `bar.arrive id, threads` (the
    /// `arrival`): one arrival at named barrier `id`, whose phase completes
    /// at `threads` arrivals, all of whole warps, all giving the same count.
    /// The completion runs `on_complete` before releasing the waiting
    /// threads.
    pub fn named_barrier(
        &self,
        tid: u32,
        arrival: NamedArrival,
        site: Site,
        on_complete: impl FnOnce(),
        suspend: impl Fn(),
    ) -> Result<(), Fault> {
        let NamedArrival { id, threads, wait } = arrival;
        self.advance(tid);
        let instruction = if wait { "bar.sync" } else { "bar.arrive" };
        let fault = |kind, message: String| {
            Err(Fault::new(kind, Some(tid), format!("{instruction} {id}, {threads} at {site}: {message}")))
        };
        if !(1..NAMED_BARRIERS).contains(&id) {
            return fault(
                FaultKind::InvalidOperand,
                "named barriers are 1..15 (0 is bar.sync 0, the block barrier)".into(),
            );
        }
        let block = self.threads.div_ceil(32) * 32;
        if threads == 0 || !threads.is_multiple_of(32) || threads > block {
            return fault(
                FaultKind::InvalidOperand,
                format!("the thread count must be a non-zero multiple of 32 up to the block's {block}"),
            );
        }
        let ticket = {
            let mut st = self.state.borrow_mut();
            let named = &mut st.named[id as usize];
            if named.threads != 0 && named.threads != threads {
                return fault(
                    FaultKind::InvalidOperand,
                    format!("this phase of the barrier began with a count of {} threads", named.threads),
                );
            }
            named.threads = threads;
            *named.arrived.entry(tid / 32).or_default() += 1;
            if named.arrived.values().sum::<u32>() == threads {
                if let Some((warp, lanes)) = named.arrived.iter().find(|(_, &n)| n % 32 != 0) {
                    let message =
                        format!("the barrier completed with {lanes} lanes of warp {warp}: it counts whole warps");
                    return fault(FaultKind::PartialWarp, message);
                }
                named.threads = 0;
                named.arrived.clear();
                named.completed += 1;
                let released = (0..self.threads as usize)
                    .filter(|&t| matches!(st.waits[t], Some(Wait::Named { id: i, .. }) if i == id))
                    .collect::<Vec<_>>();
                for t in released {
                    st.waits[t] = None;
                }
                drop(st);
                on_complete();
                return Ok(());
            }
            if !wait {
                return Ok(());
            }
            st.waits[tid as usize] = Some(Wait::Named { id, site });
            st.named[id as usize].completed
        };
        while self.state.borrow().named[id as usize].completed == ticket {
            suspend();
        }
        Ok(())
    }

    /// A warpgroup-collective instruction (`op` at `site`): all 128 threads
    /// of the caller's warpgroup deposit `input`; the last to arrive runs
    /// `compute` on the 128 inputs (by thread of the warpgroup), and every
    /// thread receives its result.
    pub fn warpgroup_collective<T: 'static>(
        &self,
        tid: u32,
        op: &'static str,
        site: Site,
        input: LaneIn,
        compute: impl FnOnce(&[LaneIn]) -> Result<T, Fault>,
        suspend: impl Fn(),
    ) -> Result<Rc<T>, Fault> {
        self.advance(tid);
        let g = (tid / 128) as usize;
        let members = g as u32 * 128..(g as u32 + 1) * 128;
        let ticket = {
            let mut st = self.state.borrow_mut();
            if members.end > self.threads {
                let message = format!(
                    "{op} at {site}: warpgroup {g} has only {} threads of the block's {}; a warpgroup-collective \
                     instruction needs all 128",
                    self.threads - members.start,
                    self.threads
                );
                return Err(Fault::new(FaultKind::PartialWarp, Some(tid), message));
            }
            if let Some(gone) = members.clone().find(|&t| st.exited[t as usize]) {
                let message =
                    format!("{op} at {site} reached by thread {tid}, but thread {gone} of its warpgroup exited");
                return Err(Fault::new(FaultKind::PartialWarp, Some(tid), message));
            }
            let group = &mut st.warpgroups[g];
            let meeting = group.meeting.get_or_insert_with(|| WarpgroupMeeting {
                op,
                site,
                arrived: 0,
                inputs: vec![[0; 10]; 128],
            });
            if (meeting.op, meeting.site) != (op, site) {
                let message = format!(
                    "thread {tid} reached {op} at {site} while {} threads of warpgroup {g} wait at {} at {}",
                    meeting.arrived, meeting.op, meeting.site
                );
                return Err(Fault::new(FaultKind::DivergentWarp, Some(tid), message));
            }
            meeting.inputs[(tid % 128) as usize] = input;
            meeting.arrived += 1;
            if meeting.arrived == 128 {
                None
            } else {
                st.waits[tid as usize] = Some(Wait::Warpgroup(op, site));
                Some(group_completed(&st, g))
            }
        };
        let Some(ticket) = ticket else {
            let inputs = self.state.borrow_mut().warpgroups[g].meeting.take().map(|m| m.inputs).unwrap_or_default();
            let output: Rc<dyn Any> = Rc::new(compute(&inputs)?);
            let mut st = self.state.borrow_mut();
            st.warpgroups[g].output = Some(output.clone());
            st.warpgroups[g].completed += 1;
            st.waits[members.start as usize..members.end as usize].fill(None);
            return Ok(output.downcast().unwrap_or_else(|_| unreachable!("one type per meeting")));
        };
        while group_completed(&self.state.borrow(), g) == ticket {
            suspend();
        }
        let output = self.state.borrow().warpgroups[g].output.clone();
        Ok(output.and_then(|o| o.downcast().ok()).unwrap_or_else(|| unreachable!("one type per meeting")))
    }

    /// `setmaxnreg` of `count` registers per thread (`inc` or dec) by the
    /// caller's warpgroup, after its threads have met: a `.dec` returns
    /// registers to the pool at once; an `.inc` waits until the pool has
    /// them. Returns once the warpgroup holds `count`.
    pub fn set_registers(&self, tid: u32, count: u32, inc: bool, site: Site, suspend: impl Fn()) -> Result<(), Fault> {
        let g = (tid / 128) as usize;
        loop {
            {
                let mut st = self.state.borrow_mut();
                if st.warpgroups[g].registers == count {
                    st.waits[tid as usize] = None;
                    return Ok(());
                }
                // The last warpgroup may be partial: its whole warps hold registers.
                let threads_of = |i: usize| (self.threads.div_ceil(32) * 32 - 128 * i as u32).min(128);
                let others: u32 = st
                    .warpgroups
                    .iter()
                    .enumerate()
                    .filter(|&(i, _)| i != g)
                    .map(|(i, w)| threads_of(i) * w.registers)
                    .sum();
                if !inc || others + 128 * count <= self.register_pool {
                    st.warpgroups[g].registers = count;
                    st.waits[tid as usize] = None;
                    drop(st);
                    self.advance(tid);
                    return Ok(());
                }
                st.waits[tid as usize] = Some(Wait::Registers { count, site });
            }
            suspend();
        }
    }

    /// Registers per thread that warpgroup `g` holds.
    pub fn registers(&self, g: u32) -> u32 {
        self.state.borrow().warpgroups[g as usize].registers
    }

    /// The thread has finished the kernel.
    pub fn exit(&self, tid: u32) -> Result<(), Fault> {
        self.advance(tid);
        let mut st = self.state.borrow_mut();
        st.exited[tid as usize] = true;
        let w = (tid / 32) as usize;
        if let Some(m) = &st.warps[w].meeting {
            let message = format!(
                "thread exited while {} of warp {w} wait for it at {} at {}",
                describe_lanes(m.arrived),
                m.op.ptx(),
                m.site
            );
            return Err(Fault::new(FaultKind::PartialWarp, Some(tid), message));
        }
        if st.barrier_arrived > 0 {
            let waiting = (0..self.threads as usize).filter(|&t| st.waits[t].is_some());
            let message = format!("thread {tid} exited while {}", self.where_waiting(&st, waiting));
            return Err(Fault::new(FaultKind::Deadlock, Some(tid), message));
        }
        Ok(())
    }

    /// Describes a block whose every live thread waits.
    pub fn stuck(&self) -> Fault {
        let st = self.state.borrow();
        // A warp split between a collective and anything else is the likely cause.
        for (w, warp) in st.warps.iter().enumerate() {
            if let Some(m) = &warp.meeting {
                let others = (w * 32..w * 32 + 32).filter(|&t| m.arrived >> (t % 32) & 1 == 0);
                let message = format!(
                    "{} at {} reached by {} of warp {w} only; the others wait at: {}",
                    m.op.ptx(),
                    m.site,
                    describe_lanes(m.arrived),
                    self.where_waiting(&st, others)
                );
                return Fault::new(FaultKind::PartialWarp, None, message);
            }
        }
        let all = self.where_waiting(&st, 0..self.threads as usize);
        if let Some((t, count)) = (0..self.threads as usize).find_map(|t| match st.waits[t] {
            Some(Wait::Registers { count, .. }) => Some((t, count)),
            _ => None,
        }) {
            let held: Vec<String> = st
                .warpgroups
                .iter()
                .enumerate()
                .map(|(w, g)| format!("warpgroup {w} {} per thread", g.registers))
                .collect();
            let message = format!(
                "setmaxnreg.inc to {count} by warpgroup {} can never be granted: the CTA's pool holds {} registers \
                 and {}; every thread waits: {all}",
                t / 128,
                self.register_pool,
                held.join(", ")
            );
            return Fault::new(FaultKind::RegisterBudget, None, message);
        }
        Fault::new(FaultKind::Deadlock, None, format!("every thread waits: {all}"))
    }

    /// Groups `threads` by where they wait.
    fn where_waiting(&self, st: &State, threads: impl Iterator<Item = usize>) -> String {
        let mut groups: Vec<(String, Vec<usize>)> = Vec::new();
        for t in threads {
            let place = match st.waits.get(t).copied().flatten() {
                _ if st.exited[t] => "exited".to_string(),
                Some(Wait::Barrier(site)) => format!("bar.sync at {site}"),
                Some(Wait::Collective(op, site)) => format!("{} at {site}", op.ptx()),
                Some(Wait::Mbarrier { addr, parity, site }) => {
                    format!("mbarrier.try_wait.parity at {site} on {}", describe_mbarrier(st, addr, parity))
                }
                Some(Wait::Named { id, site }) => {
                    let named = &st.named[id as usize];
                    let arrived: u32 = named.arrived.values().sum();
                    format!("bar.sync {id}, {} at {site} ({arrived} arrived)", named.threads)
                }
                Some(Wait::Warpgroup(op, site)) => format!("{op} at {site} (warpgroup-collective)"),
                Some(Wait::Registers { count, site }) => format!("setmaxnreg.inc.sync.aligned.u32 {count} at {site}"),
                None => "running".to_string(),
            };
            match groups.iter_mut().find(|(p, _)| *p == place) {
                Some((_, ts)) => ts.push(t),
                None => groups.push((place, vec![t])),
            }
        }
        let groups: Vec<String> =
            groups.into_iter().map(|(place, ts)| format!("{} {place}", describe_ids("threads", &ts))).collect();
        groups.join("; ")
    }
}

fn group_completed(st: &State, g: usize) -> u64 {
    st.warpgroups[g].completed
}

/// The mbarrier at `addr` as a deadlock report names it.
fn describe_mbarrier(st: &State, addr: u32, parity: u32) -> String {
    match st.mbarriers.get(&addr) {
        None => format!("the mbarrier at shared {addr:#x}, not initialised"),
        Some(b) => format!(
            "the mbarrier at shared {addr:#x} (waiting for its phase of parity {parity}; it is in phase {} with {} \
             of {} arrivals pending and transaction count {})",
            b.phase, b.pending, b.expected, b.tx
        ),
    }
}

/// The set flags as a lane mask.
fn lanes(flags: &[bool]) -> u32 {
    flags.iter().enumerate().fold(0, |mask, (i, &f)| mask | (u32::from(f) << i))
}

fn describe_lanes(mask: u32) -> String {
    let ids: Vec<usize> = (0..32).filter(|&l| mask >> l & 1 == 1).collect();
    describe_ids("lanes", &ids)
}

/// `ids` (sorted) as ranges: "lanes 0-15, 17".
fn describe_ids(noun: &str, ids: &[usize]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ids.len() {
        let mut j = i;
        while j + 1 < ids.len() && ids[j + 1] == ids[j] + 1 {
            j += 1;
        }
        parts.push(if i == j { ids[i].to_string() } else { format!("{}-{}", ids[i], ids[j]) });
        i = j + 1;
    }
    format!("{noun} {}", parts.join(", "))
}

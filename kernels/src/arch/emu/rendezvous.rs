//! Where the threads of a block wait for each other: `bar.sync`, and the
//! meeting point of each warp's collective instructions, where the lanes'
//! registers are exchanged. It also describes a block that cannot go on:
//! a collective that part of a warp never reaches, lanes of one warp at
//! different collectives, a barrier some threads never reach or meet at
//! different instructions.
//!
//! The block's threads are coroutines on one OS thread: a thread that must
//! wait suspends (the `suspend` argument) and checks again when the
//! scheduler resumes it. The scheduler declares a deadlock when a whole
//! round of resumptions made no [`Rendezvous::progress`].

use std::cell::{Cell, RefCell};
use std::panic::Location;

use super::error::{Fault, FaultKind};
use super::float::HalfType;

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
}

struct State {
    exited: Vec<bool>,
    waits: Vec<Option<Wait>>,
    barrier_arrived: u32,
    /// Where the threads waiting at the block barrier wait.
    barrier_site: Option<Site>,
    barriers_completed: u64,
    warps: Vec<Warp>,
}

pub(crate) struct Rendezvous {
    threads: u32,
    state: RefCell<State>,
    progress: Cell<u64>,
}

const FULL_WARP: u32 = u32::MAX;

impl Rendezvous {
    pub fn new(threads: u32) -> Self {
        let warps = threads.div_ceil(32);
        let mut exited = vec![false; (warps * 32) as usize];
        // Lanes past the block size never run: a collective in that warp
        // is reached by part of it only.
        exited[threads as usize..].fill(true);
        Self {
            threads,
            state: RefCell::new(State {
                exited,
                waits: vec![None; threads as usize],
                barrier_arrived: 0,
                barrier_site: None,
                barriers_completed: 0,
                warps: (0..warps).map(|_| Warp { meeting: None, outputs: [[0; 4]; 32], completed: 0 }).collect(),
            }),
            progress: Cell::new(0),
        }
    }

    /// Counts arrivals, completions and exits: if a round of the scheduler
    /// leaves it unchanged, no thread can go on.
    pub fn progress(&self) -> u64 {
        self.progress.get()
    }

    fn advance(&self) {
        self.progress.set(self.progress.get() + 1);
    }

    /// `bar.sync 0`: returns once every thread of the block has arrived,
    /// all at the same instruction (`site`): an aligned barrier that
    /// threads meet at two places, or that a thread exits without reaching,
    /// is a fault. The last to arrive runs `on_complete` before releasing
    /// the others.
    pub fn barrier(&self, tid: u32, site: Site, on_complete: impl FnOnce(), suspend: impl Fn()) -> Result<(), Fault> {
        self.advance();
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
        self.advance();
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

    /// The thread has finished the kernel.
    pub fn exit(&self, tid: u32) -> Result<(), Fault> {
        self.advance();
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

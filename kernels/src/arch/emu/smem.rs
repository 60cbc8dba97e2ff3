//! A block's dynamic shared memory, with the checks a GPU does not make:
//! bounds and alignment, reads of bytes never written, `cp.async` copies
//! still in flight, races between threads that no barrier orders, and
//! (optionally) `ldmatrix` bank conflicts.
//!
//! Shadow state is kept per 4-byte word (every access is at least 4-byte
//! aligned). A `cp.async` reads global memory when issued, but its bytes
//! land only when the issuing thread's `cp.async.wait_group` covers its
//! group ([`AsyncCopies`] keeps each thread's groups); until then any
//! access to them is a fault.
//!
//! Ordering: `bar.sync` orders everything before it in the block against
//! everything after; `bar.warp.sync` does the same within a warp; a thread
//! is ordered with itself; a warp-collective read (`ldmatrix`) is ordered
//! with later accesses of every lane of its warp. Epoch counters stand for
//! the barriers: an access recorded in an older epoch is ordered. The
//! sm_90a synchronisations (a named barrier's completion, an mbarrier
//! phase's completion) advance the block epoch too: they order only the
//! threads that took part, so the race check is coarser there (it misses
//! a race between threads that neither barrier orders, and reports none
//! that is not one).
//!
//! Proxies: the async proxy (TMA, wgmma's shared operands) sees a
//! thread's generic-proxy writes (`st.shared`, `cp.async`) only after that
//! thread's `fence.proxy.async.shared::cta`; each word remembers its
//! writer's fence count at the write, and an async-proxy read of a word
//! whose writer has not fenced since is a fault. TMA loads are async-proxy
//! writes: in flight from their issue until the mbarrier phase their bytes
//! complete has completed.

use std::cell::{RefCell, RefMut};
use std::collections::VecDeque;
use std::panic::Location;

use super::error::{Fault, FaultKind};

/// Where the dynamic shared memory starts in the shared window. Not 0, so
/// that a kernel assuming it is 0 fails.
pub(crate) const BASE: u32 = 0x400;

type Site = &'static Location<'static>;

/// A `cp.async` (or 16 bytes of a TMA box) whose bytes have not landed:
/// the source was read when it was issued. `len` (4 or 16) bytes of `data`
/// land at `dst`.
pub(crate) struct PendingCopy {
    pub dst: u32,
    pub data: [u8; 16],
    pub len: u32,
    pub site: Site,
}

/// One thread's `cp.async` groups.
#[derive(Default)]
pub(crate) struct AsyncCopies {
    /// Copies since the last `cp.async.commit_group`.
    uncommitted: Vec<PendingCopy>,
    /// Committed groups, oldest first.
    committed: VecDeque<Vec<PendingCopy>>,
}

impl AsyncCopies {
    pub fn issue(&mut self, copy: PendingCopy) {
        self.uncommitted.push(copy);
    }

    /// `cp.async.commit_group`.
    pub fn commit(&mut self) {
        let group = std::mem::take(&mut self.uncommitted);
        self.committed.push_back(group);
    }

    /// The copies of every committed group but the newest `pending`, which
    /// a `cp.async.wait_group pending` lands.
    pub fn take_all_but(&mut self, pending: usize) -> Vec<PendingCopy> {
        let landing = self.committed.len().saturating_sub(pending);
        self.committed.drain(..landing).flatten().collect()
    }
}

/// Who accesses shared memory.
#[derive(Clone, Copy)]
pub(crate) struct Accessor {
    pub thread: u32,
    /// A warp-collective access (made by the warp, addressed by `thread`).
    pub collective: bool,
}

impl Accessor {
    fn warp(&self) -> u32 {
        self.thread / 32
    }
}

/// One recorded access.
#[derive(Clone, Copy)]
struct Access {
    who: Accessor,
    block_epoch: u32,
    warp_epoch: u32,
    site: Site,
    instruction: &'static str,
}

/// The reads of a word since it was last written.
#[derive(Clone, Copy)]
enum Readers {
    None,
    /// All by one thread, or all collective reads of one warp.
    One(Access),
    /// Several lanes of `last`'s warp; `plain_epoch` is the warp epoch of
    /// the latest non-collective read, if any.
    Warp {
        last: Access,
        plain_epoch: Option<u32>,
    },
    /// Threads of several warps: only a `bar.sync` orders them.
    Block {
        last: Access,
    },
}

/// An asynchronous copy that will write a word.
#[derive(Clone, Copy)]
struct InFlight {
    thread: u32,
    site: Site,
    /// A TMA load (landed by its mbarrier phase), not a `cp.async`.
    tma: bool,
}

impl InFlight {
    fn describe(&self, word: u32) -> (FaultKind, String) {
        let (thread, site) = (self.thread, self.site);
        if self.tma {
            let what = format!(
                "word {word:#x} is still in flight from the TMA load (cp.async.bulk.tensor) of thread {thread} at \
                 {site}: the mbarrier phase its bytes complete has not completed"
            );
            (FaultKind::TmaInFlight, what)
        } else {
            let what = format!("word {word:#x} is still in flight from the cp.async of thread {thread} at {site}");
            (FaultKind::CpAsyncInFlight, what)
        }
    }
}

#[derive(Clone, Copy)]
struct Word {
    write: Option<Access>,
    readers: Readers,
    in_flight: Option<InFlight>,
    /// For a generic-proxy write: the writer's count of
    /// `fence.proxy.async` at the write (the async proxy may read the word
    /// once the writer's count has moved past it). `None` for an
    /// async-proxy write (a TMA load), which the async proxy sees.
    generic_fence: Option<u32>,
    /// For bytes a TMA load landed: the mbarrier and the count of its
    /// completed phases that landed them. A thread may read them once a
    /// wait of its own on that barrier saw that many phases completed.
    tma_landed: Option<(u32, u64)>,
    /// The newest wgmma reading the word as an operand: its warpgroup,
    /// number (see `wgmma::WgmmaGroups`) and site. It reads until a
    /// `wgmma.wait_group` of the warpgroup covers it; a write before then
    /// may change what it reads.
    wgmma_reader: Option<(u32, u64, Site)>,
}

struct Inner {
    bytes: Vec<u8>,
    words: Vec<Word>,
    /// Completed `bar.sync`s.
    block_epoch: u32,
    /// Completed `bar.warp.sync`s, per warp.
    warp_epochs: Vec<u32>,
    /// `fence.proxy.async.shared::cta`s executed, per thread.
    proxy_fences: Vec<u32>,
    /// Per thread, the newest wgmma of its warpgroup its own
    /// `wgmma.wait_group`s have covered.
    wgmma_waited: Vec<u64>,
    /// Per warpgroup, the newest wgmma any of its threads has waited for.
    wgmma_done: Vec<u64>,
    /// Per thread, the mbarrier phases whose TMA bytes it may read: for
    /// each barrier, how many phases had completed when a wait of its own
    /// answered true, or when a thread that knew it released it (an arrive
    /// this thread then waited for, a block or named barrier).
    observed: Vec<Vec<(u32, u64)>>,
    /// Per mbarrier, what the threads arriving on it knew (passed to the
    /// threads that wait for it).
    released: Vec<(u32, Vec<(u32, u64)>)>,
}

/// `into` joined with `from`: per barrier, the most phases either knows.
fn join_observations(into: &mut Vec<(u32, u64)>, from: &[(u32, u64)]) {
    for &(bar, phases) in from {
        match into.iter_mut().find(|(b, _)| *b == bar) {
            Some((_, p)) => *p = (*p).max(phases),
            None => into.push((bar, phases)),
        }
    }
}

pub(crate) struct SharedMemory {
    size: u32,
    check_bank_conflicts: bool,
    inner: RefCell<Inner>,
}

/// One access as fault messages describe it.
pub(crate) struct Request {
    pub who: Accessor,
    pub instruction: &'static str,
    pub site: Site,
    pub addr: u32,
    pub len: u32,
}

impl Request {
    fn describe(&self) -> String {
        let verb = if self.who.collective { "(warp-collective) at" } else { "at" };
        format!(
            "{} {verb} {} accesses shared [{:#x}, {:#x})",
            self.instruction,
            self.site,
            self.addr,
            u64::from(self.addr) + u64::from(self.len)
        )
    }

    fn fault(&self, kind: FaultKind, message: String) -> Fault {
        Fault::new(kind, Some(self.who.thread), format!("{}: {message}", self.describe()))
    }
}

fn describe_access(a: &Access) -> String {
    let by = if a.who.collective {
        format!("warp {} (address from thread {})", a.who.warp(), a.who.thread)
    } else {
        format!("thread {}", a.who.thread)
    };
    format!("{} by {by} at {}", a.instruction, a.site)
}

impl SharedMemory {
    pub fn new(size: u32, warps: u32, check_bank_conflicts: bool) -> Self {
        let word = Word {
            write: None,
            readers: Readers::None,
            in_flight: None,
            generic_fence: None,
            tma_landed: None,
            wgmma_reader: None,
        };
        Self {
            size,
            check_bank_conflicts,
            inner: RefCell::new(Inner {
                bytes: vec![0; size as usize],
                words: vec![word; size.div_ceil(4) as usize],
                block_epoch: 0,
                warp_epochs: vec![0; warps as usize],
                proxy_fences: vec![0; 32 * warps as usize],
                wgmma_waited: vec![0; 32 * warps as usize],
                wgmma_done: vec![0; warps.div_ceil(4) as usize],
                observed: vec![Vec::new(); 32 * warps as usize],
                released: Vec::new(),
            }),
        }
    }

    fn lock(&self) -> RefMut<'_, Inner> {
        self.inner.borrow_mut()
    }

    /// The words of `req`, after checking alignment to `align` and bounds.
    fn words(&self, req: &Request, align: u32) -> Result<std::ops::Range<usize>, Fault> {
        if !req.addr.is_multiple_of(align) {
            return Err(req.fault(FaultKind::Misaligned, format!("the address is not {align}-byte aligned")));
        }
        let end = u64::from(req.addr) + u64::from(req.len);
        if req.addr < BASE || end > u64::from(BASE + self.size) {
            return Err(req.fault(
                FaultKind::SharedOutOfBounds,
                format!(
                    "outside the dynamic shared memory [{BASE:#x}, {:#x}) of {} bytes",
                    BASE + self.size,
                    self.size
                ),
            ));
        }
        let first = ((req.addr - BASE) / 4) as usize;
        Ok(first..first + (req.len / 4) as usize)
    }

    /// Checks that `req` lies in the dynamic shared memory, `align`-byte
    /// aligned, touching nothing (an mbarrier object's address).
    pub fn check_bounds(&self, req: &Request, align: u32) -> Result<(), Fault> {
        self.words(req, align).map(drop)
    }

    /// 16 bytes at `req.addr` read by the async proxy for wgmma `number`
    /// of warpgroup `group`: as [`Self::read`], and every word's
    /// generic-proxy writer must have executed `fence.proxy.async` since
    /// writing it. The words stay read until the warpgroup's
    /// `wgmma.wait_group` covers the wgmma ([`Self::wgmma_completed`]).
    pub fn read_async(&self, req: &Request, (group, number): (u32, u64)) -> Result<Vec<u8>, Fault> {
        let mut inner = self.lock();
        for w in self.words(req, 16)? {
            inner.words[w].wgmma_reader = Some((group, number, req.site));
            let word = inner.words[w];
            if let (Some(write), Some(fence)) = (word.write, word.generic_fence) {
                if inner.proxy_fences[write.who.thread as usize] == fence {
                    return Err(req.fault(
                        FaultKind::MissingProxyFence,
                        format!(
                            "word {:#x} was written through the generic proxy by {} and that thread has executed \
                             no fence.proxy.async.shared::cta since: the async proxy may not see the write",
                            word_addr(w),
                            describe_access(&write)
                        ),
                    ));
                }
            }
        }
        self.read_locked(&mut inner, req)
    }

    /// A `wgmma.wait_group` of `thread` has covered its warpgroup's
    /// wgmmas up to number `through`. A wgmma is one operation of the
    /// warpgroup: a thread of the warpgroup may overwrite its operands once
    /// its own wait covered it; a thread of another warpgroup once any
    /// thread's has (it is ordered after that wait by a barrier, which the
    /// race check sees, coarsely).
    pub fn wgmma_completed(&self, thread: u32, through: u64) {
        let mut inner = self.lock();
        inner.wgmma_waited[thread as usize] = through;
        let done = &mut inner.wgmma_done[(thread / 128) as usize];
        *done = (*done).max(through);
    }

    /// A wait of `thread` on the mbarrier at `bar` answered true when it had
    /// completed `phases` phases: the TMA bytes those phases landed are
    /// visible to the thread.
    pub fn observe_mbarrier(&self, thread: u32, bar: u32, phases: u64) {
        let mut inner = self.lock();
        let released = inner.released.iter().find(|(b, _)| *b == bar).map(|(_, known)| known.clone());
        let seen = &mut inner.observed[thread as usize];
        join_observations(seen, &released.unwrap_or_default());
        join_observations(seen, &[(bar, phases)]);
    }

    /// An arrival of `thread` on the mbarrier at `bar` (a release): the
    /// phases it knows pass to the threads that wait for the barrier.
    pub fn release_observations(&self, thread: u32, bar: u32) {
        let mut inner = self.lock();
        let known = inner.observed[thread as usize].clone();
        match inner.released.iter_mut().find(|(b, _)| *b == bar) {
            Some((_, into)) => join_observations(into, &known),
            None => inner.released.push((bar, known)),
        }
    }

    /// A block or named barrier completed: coarsely (as the race check
    /// orders accesses), every thread knows what any thread knew.
    pub fn share_observations(&self) {
        let mut inner = self.lock();
        let mut all = Vec::new();
        for seen in &inner.observed {
            join_observations(&mut all, seen);
        }
        for seen in &mut inner.observed {
            seen.clone_from(&all);
        }
    }

    /// `fence.proxy.async.shared::cta` by `thread`.
    pub fn fence_proxy_async(&self, thread: u32) {
        self.lock().proxy_fences[thread as usize] += 1;
    }

    /// `req.len` bytes at `req.addr`, aligned to their length.
    pub fn read(&self, req: &Request) -> Result<Vec<u8>, Fault> {
        let mut inner = self.lock();
        self.read_locked(&mut inner, req)
    }

    /// The 16-byte rows of an `ldmatrix`: lane `i` of `warp` addressed `addrs[i]`.
    pub fn read_rows(
        &self,
        warp: u32,
        addrs: &[u32; 32],
        instruction: &'static str,
        site: Site,
    ) -> Result<[[u8; 16]; 32], Fault> {
        let mut inner = self.lock();
        let mut rows = [[0u8; 16]; 32];
        for (lane, (row, &addr)) in rows.iter_mut().zip(addrs).enumerate() {
            let who = Accessor { thread: warp * 32 + lane as u32, collective: true };
            let req = Request { who, instruction, site, addr, len: 16 };
            row.copy_from_slice(&self.read_locked(&mut inner, &req)?);
        }
        if self.check_bank_conflicts {
            check_banks(warp, addrs, instruction, site)?;
        }
        Ok(rows)
    }

    fn read_locked(&self, inner: &mut Inner, req: &Request) -> Result<Vec<u8>, Fault> {
        let words = self.words(req, req.len)?;
        for w in words.clone() {
            let word = inner.words[w];
            if let Some(flight) = word.in_flight {
                let (kind, what) = flight.describe(word_addr(w));
                let why = if flight.tma { "" } else { ": no cp.async.wait_group of that thread has covered it" };
                return Err(req.fault(kind, format!("{what}{why}")));
            }
            if let Some((bar, phases)) = word.tma_landed {
                let seen = inner.observed[req.who.thread as usize].iter().find(|(b, _)| *b == bar).map(|&(_, p)| p);
                if seen.is_none_or(|p| p < phases) {
                    return Err(req.fault(
                        FaultKind::UnobservedTma,
                        format!(
                            "word {:#x} was landed by a TMA load when the mbarrier at shared {bar:#x} completed its \
                             phase {phases}, and thread {} has not waited for that phase (its waits on that barrier \
                             saw {} phases): the bytes may not have arrived for it",
                            word_addr(w),
                            req.who.thread,
                            seen.map_or("no".to_string(), |p| p.to_string())
                        ),
                    ));
                }
            }
            let Some(write) = word.write else {
                return Err(req.fault(
                    FaultKind::UninitializedShared,
                    format!("word {:#x} has not been written since the launch", word_addr(w)),
                ));
            };
            if !inner.ordered(&write, req.who) {
                return Err(req.fault(
                    FaultKind::SharedRace,
                    format!(
                        "word {:#x} was written by {} with no barrier in between",
                        word_addr(w),
                        describe_access(&write)
                    ),
                ));
            }
            let access = inner.access(req);
            inner.words[w].readers = inner.add_reader(word.readers, access);
        }
        let start = (req.addr - BASE) as usize;
        Ok(inner.bytes[start..start + req.len as usize].to_vec())
    }

    /// Stores `bytes` at `req.addr`, aligned to their length.
    pub fn write(&self, req: &Request, bytes: &[u8]) -> Result<(), Fault> {
        let mut inner = self.lock();
        let fence = inner.proxy_fences[req.who.thread as usize];
        for w in self.check_write(&inner, req, req.len)? {
            inner.words[w].write = Some(inner.access(req));
            inner.words[w].readers = Readers::None;
            inner.words[w].generic_fence = Some(fence);
            inner.words[w].tma_landed = None;
        }
        let start = (req.addr - BASE) as usize;
        inner.bytes[start..start + bytes.len()].copy_from_slice(bytes);
        Ok(())
    }

    /// Issues a 16-byte `cp.async` (or a 16-byte piece of a TMA box, `tma`)
    /// into `req.addr`: from now until [`Self::land`] its words are in flight.
    pub fn start_copy(&self, req: &Request, tma: bool) -> Result<(), Fault> {
        let mut inner = self.lock();
        for w in self.check_write(&inner, req, req.len)? {
            inner.words[w].in_flight = Some(InFlight { thread: req.who.thread, site: req.site, tma });
        }
        Ok(())
    }

    /// Lands `copies` of `thread` (a `wait_group` of that thread covered
    /// them, or for a TMA load `tma = Some((mbarrier, phases))` the phase
    /// that completed the barrier's `phases`): their bytes become writes by
    /// the thread, ordered as of now, through the generic proxy
    /// (`cp.async`) or the async proxy (TMA; readable by the threads that
    /// waited for that phase).
    pub fn land(&self, thread: u32, copies: Vec<PendingCopy>, tma_landed: Option<(u32, u64)>) {
        let tma = tma_landed.is_some();
        let mut inner = self.lock();
        let generic_fence = (!tma).then_some(inner.proxy_fences[thread as usize]);
        let instruction = if tma { "cp.async.bulk.tensor" } else { "cp.async" };
        for copy in copies {
            let who = Accessor { thread, collective: false };
            let req = Request { who, instruction, site: copy.site, addr: copy.dst, len: copy.len };
            let access = inner.access(&req);
            let first = ((copy.dst - BASE) / 4) as usize;
            for word in &mut inner.words[first..first + copy.len as usize / 4] {
                let wgmma_reader = word.wgmma_reader;
                *word = Word {
                    write: Some(access),
                    readers: Readers::None,
                    in_flight: None,
                    generic_fence,
                    tma_landed,
                    wgmma_reader,
                };
            }
            let (start, len) = ((copy.dst - BASE) as usize, copy.len as usize);
            inner.bytes[start..start + len].copy_from_slice(&copy.data[..len]);
        }
    }

    /// Checks that `req` may write its words now.
    fn check_write(&self, inner: &Inner, req: &Request, align: u32) -> Result<std::ops::Range<usize>, Fault> {
        let words = self.words(req, align)?;
        for w in words.clone() {
            let word = &inner.words[w];
            if let Some(flight) = word.in_flight {
                let (kind, what) = flight.describe(word_addr(w));
                return Err(req.fault(kind, format!("{what}, which would land over this write")));
            }
            if let Some((group, number, site)) = word.wgmma_reader {
                let done = if req.who.thread / 128 == group {
                    inner.wgmma_waited[req.who.thread as usize]
                } else {
                    inner.wgmma_done[group as usize]
                };
                if number > done {
                    return Err(req.fault(
                        FaultKind::WgmmaInFlight,
                        format!(
                            "word {:#x} is an operand of the wgmma.mma_async of warpgroup {group} at {site}, which \
                             may still read it: no wgmma.wait_group has covered it (of this thread, for a thread of \
                             that warpgroup; of any of its threads, for another)",
                            word_addr(w)
                        ),
                    ));
                }
            }
            let race = |other: &Access, what: &str| {
                Err(req.fault(
                    FaultKind::SharedRace,
                    format!(
                        "word {:#x} was {what} by {} with no barrier in between",
                        word_addr(w),
                        describe_access(other)
                    ),
                ))
            };
            if let Some(write) = &word.write {
                if !inner.ordered(write, req.who) {
                    return race(write, "written");
                }
            }
            match word.readers {
                Readers::None => {}
                Readers::One(read) => {
                    if !inner.ordered(&read, req.who) {
                        return race(&read, "read");
                    }
                }
                Readers::Warp { last, plain_epoch } => {
                    let same_warp = last.who.warp() == req.who.warp();
                    let synced = plain_epoch.is_none_or(|e| e != inner.warp_epochs[req.who.warp() as usize]);
                    if last.block_epoch == inner.block_epoch && !(same_warp && synced) {
                        return race(&last, "read (among other lanes of its warp)");
                    }
                }
                Readers::Block { last } => {
                    if last.block_epoch == inner.block_epoch {
                        return race(&last, "read (among other threads)");
                    }
                }
            }
        }
        Ok(words)
    }

    /// A `bar.sync` completed.
    pub fn block_barrier(&self) {
        self.lock().block_epoch += 1;
    }

    /// A `bar.warp.sync` of `warp` completed.
    pub fn warp_barrier(&self, warp: u32) {
        self.lock().warp_epochs[warp as usize] += 1;
    }
}

impl Inner {
    fn access(&self, req: &Request) -> Access {
        Access {
            who: req.who,
            block_epoch: self.block_epoch,
            warp_epoch: self.warp_epochs[req.who.warp() as usize],
            site: req.site,
            instruction: req.instruction,
        }
    }

    /// Whether `earlier` happens before an access of `who` now.
    fn ordered(&self, earlier: &Access, who: Accessor) -> bool {
        let same_warp = earlier.who.warp() == who.warp();
        earlier.block_epoch != self.block_epoch
            || (earlier.who.thread == who.thread && !earlier.who.collective)
            || (same_warp && earlier.who.collective)
            || (same_warp && earlier.warp_epoch != self.warp_epochs[who.warp() as usize])
    }

    /// The readers of a word after `read` joins `readers`.
    fn add_reader(&self, readers: Readers, read: Access) -> Readers {
        let plain = |a: &Access| (!a.who.collective).then_some(a.warp_epoch);
        match readers {
            Readers::None => Readers::One(read),
            Readers::One(a) | Readers::Warp { last: a, .. } | Readers::Block { last: a }
                if a.block_epoch != self.block_epoch =>
            {
                Readers::One(read)
            }
            Readers::One(a)
                if a.who.thread == read.who.thread && a.who.collective == read.who.collective
                    || a.who.collective && read.who.collective && a.who.warp() == read.who.warp() =>
            {
                Readers::One(read)
            }
            Readers::One(a) if a.who.warp() == read.who.warp() => {
                Readers::Warp { last: read, plain_epoch: plain(&read).or(plain(&a)) }
            }
            Readers::Warp { last, plain_epoch } if last.who.warp() == read.who.warp() => {
                Readers::Warp { last: read, plain_epoch: plain(&read).or(plain_epoch) }
            }
            _ => Readers::Block { last: read },
        }
    }
}

fn word_addr(word: usize) -> u32 {
    BASE + 4 * word as u32
}

/// Each 8x8 matrix of an `ldmatrix` is one shared-memory wavefront: its
/// eight 16-byte rows must cover eight distinct groups of four banks
/// (rows at the same address are a broadcast, not a conflict).
fn check_banks(warp: u32, addrs: &[u32; 32], instruction: &'static str, site: Site) -> Result<(), Fault> {
    for (matrix, rows) in addrs.chunks(8).enumerate() {
        for (i, &a) in rows.iter().enumerate() {
            if let Some(j) = rows[..i].iter().position(|&b| b != a && (b / 16) % 8 == (a / 16) % 8) {
                let bank = (a / 4) % 32;
                return Err(Fault::new(
                    FaultKind::BankConflict,
                    Some(warp * 32 + (matrix * 8 + i) as u32),
                    format!(
                        "{instruction} at {site}: rows {j} and {i} of matrix {matrix} ({:#x} and {a:#x}) \
                         both fall in banks {bank}..{}",
                        rows[j],
                        bank + 3
                    ),
                ));
            }
        }
    }
    Ok(())
}

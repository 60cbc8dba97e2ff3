//! Timing a call in the state a real loop runs it in: after at least a
//! second of the same call back to back, with the timed calls queued right
//! behind the warm-up's, nothing idle in between. scripts/bench_torch.py
//! times the peers' calls the same way (its `hot_ms`).
//!
//! 1. One untimed call (first-use costs: a compile, a workspace), then one
//!    call timed alone: its time sizes the look-ahead, the calls kept queued
//!    ahead of the GPU ([`HotConfig::lookahead_ms`] of work, at least
//!    [`HotConfig::min_lookahead`] and at most [`HotConfig::max_lookahead`]
//!    calls). The GPU may idle here, before the warm-up.
//! 2. Warm-up: calls back to back, an event after each. Once the look-ahead
//!    is queued, the host waits (polling the event, never synchronizing) for
//!    the call that many calls back to finish before queuing the next, and
//!    stops when the GPU has run the warm-up for [`HotConfig::warm_up_ms`]
//!    (the elapsed time between an event before the first call and that
//!    call's); the look-ahead's calls are still queued.
//! 3. The timed calls are queued right behind them, an event between each
//!    two, the same look-ahead bounding the queue, and one wait at the end.
//!    The median of the per-call times is the figure; the host notes when it
//!    sees the first timed call start and the last one end (the window whose
//!    SM clock and power the NVML samples give).

/// A stream and its events: what the timing needs of the GPU (a trait so that
/// the tests can run the timing against a simulated GPU).
pub trait Timeline {
    type Event;
    fn event(&self) -> Result<Self::Event, Box<dyn std::error::Error>>;
    /// Records `event` on the stream, behind the calls queued so far.
    fn record(&self, event: &Self::Event) -> Result<(), Box<dyn std::error::Error>>;
    /// Whether the work before `event`'s latest record has completed.
    fn done(&self, event: &Self::Event) -> Result<bool, Box<dyn std::error::Error>>;
    /// Milliseconds between two completed events.
    fn ms(&self, from: &Self::Event, to: &Self::Event) -> Result<f64, Box<dyn std::error::Error>>;
    fn synchronize(&self) -> Result<(), Box<dyn std::error::Error>>;
    /// The host's clock, seconds ([`super::nvml::now`] on the GPU).
    fn now(&self) -> f64;
    /// A short pause between two polls of an event.
    fn pause(&self);
}

/// The timing's constants.
#[derive(Clone, Copy, Debug)]
pub struct HotConfig {
    /// GPU milliseconds of the call back to back before the timed calls.
    pub warm_up_ms: f64,
    /// GPU milliseconds of calls kept queued ahead.
    pub lookahead_ms: f64,
    pub min_lookahead: usize,
    pub max_lookahead: usize,
    /// Host seconds after which a call that never finishes is an error.
    pub timeout_s: f64,
}

/// The benchmark's: a second of warm-up, 25 ms queued ahead.
pub const HOT: HotConfig =
    HotConfig { warm_up_ms: 1000.0, lookahead_ms: 25.0, min_lookahead: 3, max_lookahead: 64, timeout_s: 120.0 };

/// What [`hot_time`] measured.
#[derive(Clone, Copy, Debug)]
pub struct HotTiming {
    /// Median milliseconds of the timed calls.
    pub median_ms: f64,
    /// Their total / their count.
    pub mean_ms: f64,
    /// GPU milliseconds from the first warm-up call's start to the first
    /// timed call's.
    pub warm_up_ms: f64,
    pub warm_up_calls: usize,
    /// Calls kept queued ahead.
    pub lookahead: usize,
    /// Host seconds when the first timed call was seen started and the last
    /// one seen finished.
    pub window: (f64, f64),
}

/// Polls `event` until done, calling `poll` between polls; an error after
/// `deadline` (host seconds).
fn wait<T: Timeline>(
    timeline: &T,
    event: &T::Event,
    deadline: f64,
    poll: &mut dyn FnMut() -> Result<(), Box<dyn std::error::Error>>,
) -> Result<(), Box<dyn std::error::Error>> {
    while !timeline.done(event)? {
        poll()?;
        if timeline.now() > deadline {
            return Err("a benchmarked call did not finish within the timeout (hung kernel?)".into());
        }
        timeline.pause();
    }
    poll()
}

/// Times `run` hot (see the module's documentation) over `reps` calls;
/// `edge` is called when the first timed call is seen started and again
/// when the last is seen finished (the NVML monitor samples there).
pub fn hot_time<T: Timeline>(
    timeline: &T,
    config: &HotConfig,
    reps: usize,
    run: &mut dyn FnMut() -> Result<(), Box<dyn std::error::Error>>,
    edge: &mut dyn FnMut(),
) -> Result<HotTiming, Box<dyn std::error::Error>> {
    assert!(reps >= 1, "hot_time needs at least one timed call");
    // 1. First-use costs, then one call alone to size the look-ahead.
    run()?;
    timeline.synchronize()?;
    let (before, after) = (timeline.event()?, timeline.event()?);
    timeline.record(&before)?;
    run()?;
    timeline.record(&after)?;
    timeline.synchronize()?;
    let probe_ms = timeline.ms(&before, &after)?.max(1e-4);
    let lookahead =
        ((config.lookahead_ms / probe_ms).ceil() as usize).clamp(config.min_lookahead, config.max_lookahead);
    let deadline = timeline.now() + config.timeout_s;
    let mut nothing = || Ok(());

    // 2. The warm-up.
    let start = timeline.event()?;
    let ring = (0..lookahead).map(|_| timeline.event()).collect::<Result<Vec<_>, _>>()?;
    timeline.record(&start)?;
    let mut warm_up_calls = 0;
    loop {
        let slot = &ring[warm_up_calls % lookahead];
        if warm_up_calls >= lookahead {
            // The call `lookahead` back.
            wait(timeline, slot, deadline, &mut nothing)?;
            if timeline.ms(&start, slot)? >= config.warm_up_ms {
                break;
            }
        }
        run()?;
        timeline.record(slot)?;
        warm_up_calls += 1;
    }

    // 3. The timed calls, right behind.
    let timed = (0..=reps).map(|_| timeline.event()).collect::<Result<Vec<_>, _>>()?;
    timeline.record(&timed[0])?;
    let mut started: Option<f64> = None;
    {
        let mut see_start = || -> Result<(), Box<dyn std::error::Error>> {
            if started.is_none() && timeline.done(&timed[0])? {
                started = Some(timeline.now());
                edge();
            }
            Ok(())
        };
        for i in 0..reps {
            if i >= lookahead {
                wait(timeline, &timed[i + 1 - lookahead], deadline, &mut see_start)?;
            }
            run()?;
            timeline.record(&timed[i + 1])?;
            see_start()?;
        }
        wait(timeline, &timed[0], deadline, &mut see_start)?;
        wait(timeline, &timed[reps], deadline, &mut nothing)?;
    }
    // The sample at the end falls inside the window.
    edge();
    let finished = timeline.now();
    let mut times = timed.windows(2).map(|pair| timeline.ms(&pair[0], &pair[1])).collect::<Result<Vec<_>, _>>()?;
    times.sort_by(f64::total_cmp);
    Ok(HotTiming {
        median_ms: times[times.len() / 2],
        mean_ms: timeline.ms(&timed[0], &timed[reps])? / reps as f64,
        warm_up_ms: timeline.ms(&start, &timed[0])?,
        warm_up_calls,
        lookahead,
        window: (started.expect("set once timed[0] is done"), finished),
    })
}

/// [`Timeline`] on a CUDA stream.
pub struct CudaTimeline<'a>(pub &'a flash_attn::cust::stream::Stream);

impl Timeline for CudaTimeline<'_> {
    type Event = flash_attn::cust::event::Event;
    fn event(&self) -> Result<Self::Event, Box<dyn std::error::Error>> {
        Ok(flash_attn::cust::event::Event::new(flash_attn::cust::event::EventFlags::DEFAULT)?)
    }
    fn record(&self, event: &Self::Event) -> Result<(), Box<dyn std::error::Error>> {
        Ok(event.record(self.0)?)
    }
    fn done(&self, event: &Self::Event) -> Result<bool, Box<dyn std::error::Error>> {
        Ok(event.query()? == flash_attn::cust::event::EventStatus::Ready)
    }
    fn ms(&self, from: &Self::Event, to: &Self::Event) -> Result<f64, Box<dyn std::error::Error>> {
        Ok(to.elapsed_time_f32(from)? as f64)
    }
    fn synchronize(&self) -> Result<(), Box<dyn std::error::Error>> {
        Ok(self.0.synchronize()?)
    }
    fn now(&self) -> f64 {
        super::nvml::now()
    }
    fn pause(&self) {
        std::thread::sleep(std::time::Duration::from_micros(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::{Cell, RefCell};

    /// A GPU in virtual time: each host action advances the clock; calls run
    /// one after another for `call_ms`; the gaps in which the GPU idled are
    /// kept.
    struct SimGpu {
        now: Cell<f64>,
        busy_until: Cell<f64>,
        call_ms: f64,
        launch_s: f64,
        hang_after: Option<usize>,
        calls: Cell<usize>,
        /// (idle from, idle to, calls before).
        gaps: RefCell<Vec<(f64, f64, usize)>>,
        /// When each call started on the GPU.
        starts: RefCell<Vec<f64>>,
    }

    impl SimGpu {
        fn new(call_ms: f64, launch_us: f64) -> SimGpu {
            SimGpu {
                now: Cell::new(0.0),
                busy_until: Cell::new(0.0),
                call_ms,
                launch_s: launch_us * 1e-6,
                hang_after: None,
                calls: Cell::new(0),
                gaps: RefCell::new(Vec::new()),
                starts: RefCell::new(Vec::new()),
            }
        }
        fn advance(&self, seconds: f64) -> f64 {
            self.now.set(self.now.get() + seconds);
            self.now.get()
        }
        fn call(&self) -> Result<(), Box<dyn std::error::Error>> {
            let now = self.advance(self.launch_s);
            if self.busy_until.get() < now {
                self.gaps.borrow_mut().push((self.busy_until.get(), now, self.calls.get()));
                self.busy_until.set(now);
            }
            self.starts.borrow_mut().push(self.busy_until.get());
            let hung = self.hang_after.is_some_and(|n| self.calls.get() >= n);
            self.busy_until.set(if hung { f64::INFINITY } else { self.busy_until.get() + self.call_ms * 1e-3 });
            self.calls.set(self.calls.get() + 1);
            Ok(())
        }
    }

    impl Timeline for SimGpu {
        type Event = Cell<f64>;
        fn event(&self) -> Result<Cell<f64>, Box<dyn std::error::Error>> {
            Ok(Cell::new(f64::INFINITY))
        }
        fn record(&self, event: &Cell<f64>) -> Result<(), Box<dyn std::error::Error>> {
            let now = self.advance(1e-6);
            event.set(self.busy_until.get().max(now));
            Ok(())
        }
        fn done(&self, event: &Cell<f64>) -> Result<bool, Box<dyn std::error::Error>> {
            Ok(self.advance(0.5e-6) >= event.get())
        }
        fn ms(&self, from: &Cell<f64>, to: &Cell<f64>) -> Result<f64, Box<dyn std::error::Error>> {
            assert!(self.now.get() >= to.get() && self.now.get() >= from.get(), "elapsed time of an unfinished event");
            Ok((to.get() - from.get()) * 1e3)
        }
        fn synchronize(&self) -> Result<(), Box<dyn std::error::Error>> {
            assert!(self.busy_until.get().is_finite(), "synchronize on a hung GPU");
            self.now.set(self.now.get().max(self.busy_until.get()));
            Ok(())
        }
        fn now(&self) -> f64 {
            self.now.get()
        }
        fn pause(&self) {
            self.advance(50e-6);
        }
    }

    /// The timing and the number of edge calls, each of which (where the
    /// monitor samples) falls inside the window.
    fn time(gpu: &SimGpu, reps: usize) -> (HotTiming, usize) {
        let mut edges = Vec::new();
        let timing = hot_time(gpu, &HOT, reps, &mut || gpu.call(), &mut || edges.push(gpu.now.get())).unwrap();
        for edge in &edges {
            assert!(timing.window.0 <= *edge && *edge <= timing.window.1, "{edges:?} {timing:?}");
        }
        (timing, edges.len())
    }

    #[test]
    fn long_calls_warm_up_a_second_without_gaps() {
        for call_ms in [0.2, 1.0, 6.5, 40.0] {
            let gpu = SimGpu::new(call_ms, 5.0);
            let (timing, edges) = time(&gpu, 30);
            assert_eq!(edges, 2);
            // The GPU idled only before the untimed call, the probe and the
            // first warm-up call: never from the warm-up to the last timed call.
            let gaps = gpu.gaps.borrow();
            assert_eq!(gaps.len(), 3, "call {call_ms} ms: {gaps:?}");
            assert_eq!(gaps.iter().map(|g| g.2).collect::<Vec<_>>(), [0, 1, 2]);
            assert!((timing.median_ms - call_ms).abs() < 1e-6, "{timing:?}");
            assert!((timing.mean_ms - call_ms).abs() < 1e-6, "{timing:?}");
            // At least a second, and at most the look-ahead beyond it.
            assert!(timing.warm_up_ms >= 1000.0, "{timing:?}");
            assert!(timing.warm_up_ms <= 1000.0 + (timing.lookahead + 1) as f64 * call_ms, "{timing:?}");
            assert_eq!(gpu.calls.get(), 2 + timing.warm_up_calls + 30);
            let expected_lookahead = ((25.0 / call_ms).ceil() as usize).clamp(3, 64);
            assert_eq!(timing.lookahead, expected_lookahead);
            // The window: seen within a poll of the first timed call's start
            // and of the last one's end.
            let starts = gpu.starts.borrow();
            let first_timed = starts[2 + timing.warm_up_calls];
            let last_end = starts[starts.len() - 1] + call_ms * 1e-3;
            assert!(timing.window.0 >= first_timed && timing.window.0 <= first_timed + 100e-6, "{timing:?}");
            assert!(timing.window.1 >= last_end && timing.window.1 <= last_end + 100e-6, "{timing:?}");
        }
    }

    #[test]
    fn host_bound_calls_still_finish() {
        // Calls shorter than their launch: the GPU idles between them (as it
        // would in the loop); the warm-up still ends after a second.
        let gpu = SimGpu::new(0.002, 8.0);
        let (timing, _) = time(&gpu, 10);
        assert_eq!(timing.lookahead, 64);
        assert!(timing.warm_up_ms >= 1000.0);
        assert!(timing.median_ms > 0.002 && timing.median_ms < 0.02, "{timing:?}");
    }

    #[test]
    fn one_rep() {
        let gpu = SimGpu::new(3.0, 5.0);
        let (timing, edges) = time(&gpu, 1);
        assert_eq!(edges, 2);
        assert!((timing.median_ms - 3.0).abs() < 1e-6);
    }

    #[test]
    fn a_hung_call_is_an_error() {
        let mut gpu = SimGpu::new(1.0, 5.0);
        gpu.hang_after = Some(100);
        let error = hot_time(&gpu, &HOT, 10, &mut || gpu.call(), &mut || {}).unwrap_err();
        assert!(error.to_string().contains("did not finish"), "{error}");
    }
}
